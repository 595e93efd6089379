/* gelu.c — recognises Gelu written out in primitives, 0.5 x (1 + erf(x / sqrt 2)) or the tanh form
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), with the products in any order, and writes one
 * tern.Gelu (the standard Gelu arrives only with opset 20). */
#include "passes/passes.h"

#include <math.h>

#define MAX_NODES 12

typedef struct match {
	tern_node *nodes[MAX_NODES];
	int n;
	tern_value *x;
} match;

static bool near(double a, double b)
{
	return fabs(a - b) <= 1e-4 * fabs(b);
}

/* n is a binary node of op_type reading v and a scalar constant close to k; returns n's output. */
static bool with_const(tern_pass_ctx *c, const tern_node *n, const char *op_type, const tern_value *v, double k,
                       bool either_side)
{
	if (!tern_pass_is(n, op_type) || n->n_inputs != 2 || !n->outputs[0])
		return false;
	double s;
	if (n->inputs[0] == v && tern_pass_scalar(c, n->inputs[1], &s) && near(s, k))
		return true;
	return either_side && n->inputs[1] == v && tern_pass_scalar(c, n->inputs[0], &s) && near(s, k);
}

/* The only node reading v (NULL when v has other readers or is a graph output). */
static tern_node *only_reader(const tern_value *v)
{
	return tern_pass_single_use(v) ? v->consumers[0] : NULL;
}

static bool add(match *m, tern_node *n)
{
	if (!n || m->n == MAX_NODES)
		return false;
	m->nodes[m->n++] = n;
	return true;
}

/* x * b: a Mul of x and b in either order. */
static bool mul_of(const tern_node *n, const tern_value *x, const tern_value *b)
{
	return tern_pass_is(n, "Mul") && n->n_inputs == 2 &&
	        ((n->inputs[0] == x && n->inputs[1] == b) || (n->inputs[0] == b && n->inputs[1] == x));
}

/* From t = Erf(..) or Tanh(..): 1 + t, times x and times 0.5 in any association. Returns y. */
static tern_value *match_outer(tern_pass_ctx *c, match *m, tern_value *t)
{
	tern_node *a = only_reader(t);
	if (!with_const(c, a, "Add", t, 1.0, true) || !add(m, a))
		return NULL;
	tern_value *av = a->outputs[0], *x = m->x;
	tern_node *m1 = only_reader(av);
	if (!tern_pass_is(m1, "Mul") || m1->n_inputs != 2 || !add(m, m1))
		return NULL;
	tern_value *other = m1->inputs[0] == av ? m1->inputs[1] : m1->inputs[0];
	tern_node *m2 = only_reader(m1->outputs[0]);
	double s;
	if (other == x) /* (x (1 + t)) 0.5 */
		return with_const(c, m2, "Mul", m1->outputs[0], 0.5, true) && add(m, m2) ? m2->outputs[0] : NULL;
	if (tern_pass_scalar(c, other, &s) && near(s, 0.5)) /* x ((1 + t) 0.5) */
		return mul_of(m2, x, m1->outputs[0]) && add(m, m2) ? m2->outputs[0] : NULL;
	tern_node *h = tern_pass_producer(other, NULL); /* (x 0.5) (1 + t) */
	if (h && with_const(c, h, "Mul", x, 0.5, true) && tern_pass_single_use(other) && add(m, h))
		return m1->outputs[0];
	return NULL;
}

/* x / sqrt 2 or x * (1 / sqrt 2) feeding Erf. */
static bool match_erf_arg(tern_pass_ctx *c, match *m, tern_node *e)
{
	tern_node *s = tern_pass_producer(e->inputs[0], NULL);
	if (!s || !tern_pass_single_use(e->inputs[0]) || s->n_inputs != 2)
		return false;
	for (int k = 0; k < 2; k++) {
		tern_value *x = s->inputs[k];
		if ((k == 0 && with_const(c, s, "Div", x, M_SQRT2, false)) ||
		    with_const(c, s, "Mul", x, M_SQRT1_2, true)) {
			m->x = x;
			return add(m, s);
		}
	}
	return false;
}

/* x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x); sets m->x. */
static bool match_cube(tern_pass_ctx *c, match *m, tern_value *cube)
{
	tern_node *n = tern_pass_producer(cube, NULL);
	if (!n || !tern_pass_single_use(cube) || n->n_inputs != 2)
		return false;
	if (tern_pass_is(n, "Pow") && tern_pass_const_all(c, n->inputs[1], 3)) {
		m->x = n->inputs[0];
		return add(m, n);
	}
	if (!tern_pass_is(n, "Mul"))
		return false;
	for (int k = 0; k < 2; k++) {
		tern_node *sq = tern_pass_producer(n->inputs[k], "Mul");
		tern_value *x = n->inputs[1 - k];
		if (sq && sq->inputs[0] == x && sq->inputs[1] == x && tern_pass_single_use(n->inputs[k])) {
			m->x = x;
			return add(m, n) && add(m, sq);
		}
	}
	return false;
}

/* sqrt(2 / pi) (x + 0.044715 x^3) feeding Tanh. */
static bool match_tanh_arg(tern_pass_ctx *c, match *m, tern_node *th)
{
	tern_node *scaled = tern_pass_producer(th->inputs[0], "Mul");
	if (!scaled || !tern_pass_single_use(th->inputs[0]) || scaled->n_inputs != 2 || !add(m, scaled))
		return false;
	double s;
	int k = tern_pass_scalar(c, scaled->inputs[0], &s) ? 0 : 1;
	if (!tern_pass_scalar(c, scaled->inputs[k], &s) || !near(s, sqrt(2 / M_PI)))
		return false;
	tern_node *sum = tern_pass_producer(scaled->inputs[1 - k], "Add");
	if (!sum || !tern_pass_single_use(scaled->inputs[1 - k]) || sum->n_inputs != 2 || !add(m, sum))
		return false;
	for (int j = 0; j < 2; j++) {
		tern_node *kc = tern_pass_producer(sum->inputs[j], "Mul");
		if (!kc || !tern_pass_single_use(sum->inputs[j]) || kc->n_inputs != 2)
			continue;
		int q = tern_pass_scalar(c, kc->inputs[0], &s) ? 0 : 1;
		match saved = *m;
		if (tern_pass_scalar(c, kc->inputs[q], &s) && near(s, 0.044715) && add(m, kc) &&
		    match_cube(c, m, kc->inputs[1 - q]) && sum->inputs[1 - j] == m->x)
			return true;
		*m = saved;
	}
	return false;
}

static tern_status rewrite(tern_pass_ctx *c, match *m, tern_value *y, bool tanh_form)
{
	const tern_tensor *xs = tern_pass_shape(c, m->x);
	if (!y || !xs || xs->dtype != TERN_FLOAT)
		return TERN_OK;
	tern_node *last = m->nodes[0];
	for (int i = 0; i < m->n; i++)
		if (m->nodes[i]->index > last->index)
			last = m->nodes[i];
	const char *inputs[1] = {m->x->name};
	const char *outputs[1] = {y->name};
	tern_pass_node nw = {"Gelu", TERN_DOMAIN, last->name, inputs, 1, outputs, 1};
	tern_node *g = tern_pass_replace(c, m->nodes, m->n, &nw);
	if (!g)
		return TERN_EOS;
	return tanh_form ? tern_node_add_attr_string(g, "approximate", "tanh") : TERN_OK;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	tern_status st = TERN_OK;
	for (size_t i = 0; !st && i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		bool erf = tern_pass_is(n, "Erf"), th = tern_pass_is(n, "Tanh");
		if ((!erf && !th) || !n->inputs[0] || !n->outputs[0])
			continue;
		match m = {.n = 0};
		add(&m, n);
		if (erf ? !match_erf_arg(c, &m, n) : !match_tanh_arg(c, &m, n))
			continue;
		st = rewrite(c, &m, match_outer(c, &m, n->outputs[0]), th);
	}
	return st;
}

const tern_pass tern_pass_gelu = {
        "recognize-gelu",
        "replace Gelu written in primitives (erf or tanh form) by tern.Gelu",
        2,
        run,
};
