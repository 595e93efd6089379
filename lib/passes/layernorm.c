/* layernorm.c — recognises layer normalisation written out in primitives (as exporters do before
 * opset 17): ReduceMean, Sub, Pow or Mul, ReduceMean, Add epsilon, Sqrt, Div, then an optional scale
 * Mul and bias Add, and writes one LayerNormalization (standard from opset 17). */
#include "passes/passes.h"

#include <stdio.h>

/* The operand of binary node n other than `known`, or NULL when n does not read known once. */
static tern_value *other_operand(const tern_node *n, const tern_value *known)
{
	if (n->n_inputs != 2 || (n->inputs[0] == known) == (n->inputs[1] == known))
		return NULL;
	return n->inputs[0] == known ? n->inputs[1] : n->inputs[0];
}

/* ReduceMean over the trailing axes with kept dimensions; returns how many axes, 0 when not that. */
static int trailing_mean(tern_pass_ctx *c, const tern_node *n, int rank)
{
	if (tern_attr_int(n, "keepdims", 1) != 1 || rank < 1)
		return 0;
	int64_t axes[TERN_MAX_RANK];
	size_t na = 0;
	if (n->opset < 18) {
		const int64_t *a = tern_attr_ints(n, "axes", &na);
		if (!a || na > TERN_MAX_RANK)
			return 0;
		memcpy(axes, a, na * sizeof *a);
	} else {
		const tern_tensor *t = n->n_inputs > 1 && n->inputs[1] ? tern_pass_const(c, n->inputs[1]) : NULL;
		if (!t || tern_tensor_numel(t) > TERN_MAX_RANK)
			return 0;
		na = (size_t)tern_tensor_numel(t);
		for (size_t i = 0; i < na; i++)
			axes[i] = tern_tensor_get_i64(t, (int64_t)i);
	}
	bool seen[TERN_MAX_RANK] = {0};
	for (size_t i = 0; i < na; i++) {
		int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
		if (a < rank - (int64_t)na || a >= rank || seen[a])
			return 0;
		seen[a] = true;
	}
	return (int)na;
}

/* A float constant holding one value per normalised element (any leading 1s). */
static bool affine_const(tern_pass_ctx *c, const tern_value *v, const tern_tensor *xs, int k)
{
	const tern_tensor *t = tern_pass_const(c, v);
	if (!t || t->dtype != TERN_FLOAT || t->rank > xs->rank)
		return false;
	for (int d = 0; d < t->rank; d++) {
		int xd = xs->rank - t->rank + d;
		if (xd < xs->rank - k ? t->dims[d] != 1 : t->dims[d] != xs->dims[xd])
			return false;
	}
	return true;
}

/* A copy of the affine constant with the normalised shape, as LayerNormalization wants. */
static tern_value *normalised_const(tern_pass_ctx *c, const tern_value *v, const tern_tensor *xs, int k, float fill,
                                    const char *stem)
{
	tern_tensor t = {0};
	if (tern_tensor_alloc(&t, TERN_FLOAT, k, xs->dims + xs->rank - k))
		return NULL;
	const tern_tensor *src = v ? tern_pass_const(c, v) : NULL;
	for (int64_t i = 0, n = tern_tensor_numel(&t); i < n; i++)
		((float *)t.data)[i] = src ? ((const float *)src->data)[i] : fill;
	tern_value *out = tern_pass_add_const(c, stem, &t);
	tern_tensor_free(&t);
	return out;
}

static tern_status match(tern_pass_ctx *c, tern_node *div)
{
	if (div->n_inputs != 2 || !div->inputs[1])
		return TERN_OK;
	tern_value *d = div->inputs[0];
	tern_node *sqrt_n = tern_pass_producer(div->inputs[1], "Sqrt");
	tern_node *sub = tern_pass_producer(d, "Sub");
	if (!sqrt_n || !sub || !tern_pass_single_use(div->inputs[1]) || !sub->inputs[0] || !sub->inputs[1])
		return TERN_OK;
	tern_node *add_eps = tern_pass_producer(sqrt_n->inputs[0], "Add");
	if (!add_eps || !tern_pass_single_use(sqrt_n->inputs[0]))
		return TERN_OK;
	tern_node *var_mean = NULL;
	tern_value *eps_v = NULL;
	for (int k = 0; k < 2 && !var_mean; k++) {
		var_mean = tern_pass_producer(add_eps->inputs[k], "ReduceMean");
		eps_v = add_eps->inputs[1 - k];
	}
	double eps;
	if (!var_mean || !tern_pass_scalar(c, eps_v, &eps) || !tern_pass_single_use(var_mean->outputs[0]))
		return TERN_OK;
	tern_node *sq = tern_pass_producer(var_mean->inputs[0], NULL);
	if (!sq || !tern_pass_single_use(var_mean->inputs[0]))
		return TERN_OK;
	bool squares = (tern_pass_is(sq, "Mul") && sq->inputs[0] == d && sq->inputs[1] == d) ||
	        (tern_pass_is(sq, "Pow") && sq->inputs[0] == d && sq->n_inputs == 2 &&
	         tern_pass_const_all(c, sq->inputs[1], 2));
	tern_value *x = sub->inputs[0];
	tern_node *mean = tern_pass_producer(sub->inputs[1], "ReduceMean");
	if (!squares || !mean || mean->inputs[0] != x || !tern_pass_single_use(sub->inputs[1]) ||
	    tern_pass_uses(d) != 2 || (d->flags & TERN_VALUE_OUTPUT) || tern_pass_has_implicit_use(d))
		return TERN_OK;
	const tern_tensor *xs = tern_pass_shape(c, x);
	if (!xs || xs->dtype != TERN_FLOAT)
		return TERN_OK;
	int k = trailing_mean(c, mean, xs->rank);
	if (!k || trailing_mean(c, var_mean, xs->rank) != k)
		return TERN_OK;
	/* Optional scale and bias. */
	tern_node *nodes[9] = {mean, sub, sq, var_mean, add_eps, sqrt_n, div};
	int n_nodes = 7;
	tern_value *out = div->outputs[0], *scale = NULL, *bias = NULL;
	tern_node *next = tern_pass_single_use(out) ? out->consumers[0] : NULL;
	if (tern_pass_is(next, "Mul") && (scale = other_operand(next, out)) && affine_const(c, scale, xs, k)) {
		nodes[n_nodes++] = next;
		out = next->outputs[0];
		next = tern_pass_single_use(out) ? out->consumers[0] : NULL;
	} else {
		scale = NULL;
	}
	if (tern_pass_is(next, "Add") && (bias = other_operand(next, out)) && affine_const(c, bias, xs, k)) {
		nodes[n_nodes++] = next;
		out = next->outputs[0];
	} else {
		bias = NULL;
	}
	char stem[256];
	snprintf(stem, sizeof stem, "%s_scale", out->name);
	tern_value *sv = normalised_const(c, scale, xs, k, 1.0f, stem);
	snprintf(stem, sizeof stem, "%s_bias", out->name);
	tern_value *bv = bias ? normalised_const(c, bias, xs, k, 0.0f, stem) : NULL;
	if (!sv || (bias && !bv))
		return TERN_EOS;
	const char *inputs[3] = {x->name, sv->name, bv ? bv->name : NULL};
	const char *outputs[1] = {out->name};
	tern_pass_node nw = {"LayerNormalization", NULL, div->name, inputs, bv ? 3 : 2, outputs, 1};
	tern_node *ln = tern_pass_replace(c, nodes, n_nodes, &nw);
	if (!ln)
		return TERN_EOS;
	tern_status st = tern_node_add_attr_int(ln, "axis", -k);
	if (!st)
		st = tern_node_add_attr_float(ln, "epsilon", (float)eps);
	return st;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_model_opset(c->model, "") < 17 ? TERN_OK : tern_pass_each(c, NULL, "Div", match);
}

const tern_pass tern_pass_layernorm = {
        "recognize-layernorm",
        "replace layer normalisation written in primitives by LayerNormalization (opset 17 and later)",
        1,
        run,
};
