/* fuse_elementwise.c — a chain of float elementwise operators, each the only reader of the one before,
 * that keeps one shape (other operands scalars or broadcast into it) becomes one tern.ElementwiseChain,
 * which applies every step block by block in one pass over memory. */
#include "passes/passes.h"

#define MAX_STEPS 24
#define MAX_INPUTS 8
#define ARGS 3 /* references per step in the `args` attribute */

static const struct ew_def {
	const char *op_type;
	int arity; /* 3: Clip, whose bounds are optional */
	const char *attr[2];
	float dflt[2];
} defs[] = {
        {"Relu", 1},
        {"Sigmoid", 1},
        {"Tanh", 1},
        {"HardSwish", 1},
        {"Softplus", 1},
        {"Softsign", 1},
        {"Erf", 1},
        {"Exp", 1},
        {"Log", 1},
        {"Sqrt", 1},
        {"Abs", 1},
        {"Neg", 1},
        {"Reciprocal", 1},
        {"Floor", 1},
        {"Ceil", 1},
        {"LeakyRelu", 1, {"alpha"}, {0.01f}},
        {"Elu", 1, {"alpha"}, {1.0f}},
        {"Celu", 1, {"alpha"}, {1.0f}},
        {"ThresholdedRelu", 1, {"alpha"}, {1.0f}},
        {"HardSigmoid", 1, {"alpha", "beta"}, {0.2f, 0.5f}},
        {"Selu", 1, {"alpha", "gamma"}, {1.67326319217681884765625f, 1.05070102214813232421875f}},
        {"Add", 2},
        {"Sub", 2},
        {"Mul", 2},
        {"Div", 2},
        {"Pow", 2},
        {"PRelu", 2},
        {"Max", 2},
        {"Min", 2},
        {"Clip", 3},
};

/* A reference while building: input k of the chain node, or step j's result. */
typedef struct ref {
	bool step;
	int index;
} ref;

typedef struct chain {
	const tern_tensor *shape;
	tern_node *nodes[MAX_STEPS];
	const char *ops[MAX_STEPS];
	ref args[MAX_STEPS][ARGS];
	int n_args[MAX_STEPS];
	float params[MAX_STEPS * 2];
	int n;
	tern_value *inputs[MAX_INPUTS]; /* inputs[0] is x */
	int n_inputs;
} chain;

static const struct ew_def *lookup(const tern_node *n)
{
	if (n->removed || *n->domain || n->n_outputs != 1 || !n->outputs[0])
		return NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(defs); i++)
		if (strcmp(defs[i].op_type, n->op_type) == 0) {
			if (defs[i].arity == 3 && n->opset < 11)
				return NULL; /* bounds in attributes */
			if (defs[i].arity == 2 && n->n_inputs != 2)
				return NULL;
			return &defs[i];
		}
	return NULL;
}

/* The reference for v: the running value, an input already taken, or a new operand input. */
static bool ref_for(tern_pass_ctx *c, chain *ch, tern_value *v, tern_value *cur, ref *r)
{
	if (cur && v == cur) {
		*r = (ref){true, ch->n - 1};
		return true;
	}
	for (int i = 0; i < ch->n_inputs; i++)
		if (ch->inputs[i] == v) {
			*r = (ref){false, i};
			return true;
		}
	const tern_tensor *s = tern_pass_shape(c, v);
	if (!s || s->dtype != TERN_FLOAT || ch->n_inputs == MAX_INPUTS ||
	    !tern_fused_operand_ok(s->rank, s->dims, ch->shape->rank, ch->shape->dims))
		return false;
	ch->inputs[ch->n_inputs] = v;
	*r = (ref){false, ch->n_inputs++};
	return true;
}

/* Appends node m reading cur (NULL for the head, whose x is already inputs[0]). */
static bool append(tern_pass_ctx *c, chain *ch, tern_node *m, tern_value *cur)
{
	const struct ew_def *d = lookup(m);
	if (!d || ch->n == MAX_STEPS || !tern_pass_same_shape(ch->shape, tern_pass_shape(c, m->outputs[0])))
		return false;
	int n_args = d->arity == 3 ? (m->n_inputs > 1 && m->inputs[1] ? 3 : 1) : d->arity;
	if (d->arity == 3 &&
	    (m->n_inputs > 3 || (n_args == 3 && (m->n_inputs < 3 || !m->inputs[2])) ||
	     (n_args == 1 && m->n_inputs > 2 && m->inputs[2])))
		return false;
	if ((int)m->n_inputs < n_args)
		return false;
	for (int a = 1; d->arity == 3 && a < n_args; a++) {
		const tern_tensor *bound = tern_pass_shape(c, m->inputs[a]);
		if (!bound || tern_tensor_numel(bound) != 1)
			return false;
	}
	chain saved = *ch;
	int s = ch->n;
	for (int a = 0; a < n_args; a++) {
		tern_value *v = m->inputs[a];
		if (!v || !ref_for(c, ch, v, cur, &ch->args[s][a])) {
			*ch = saved;
			return false;
		}
	}
	ch->n_args[s] = n_args;
	ch->ops[s] = d->op_type;
	for (int k = 0; k < 2; k++)
		ch->params[2 * s + k] = d->attr[k] ? tern_attr_float(m, d->attr[k], d->dflt[k]) : 0.0f;
	ch->nodes[s] = m;
	ch->n++;
	return true;
}

static tern_status emit(tern_pass_ctx *c, chain *ch)
{
	int64_t args[MAX_STEPS * ARGS];
	for (int s = 0; s < ch->n; s++)
		for (int a = 0; a < ARGS; a++) {
			const ref *r = &ch->args[s][a];
			args[s * ARGS + a] = a >= ch->n_args[s] ? -1 : r->step ? ch->n_inputs + r->index : r->index;
		}
	const char *inputs[MAX_INPUTS];
	for (int i = 0; i < ch->n_inputs; i++)
		inputs[i] = ch->inputs[i]->name;
	tern_node *last = ch->nodes[ch->n - 1];
	const char *outputs[1] = {last->outputs[0]->name};
	tern_pass_node nw = {
	        "ElementwiseChain", TERN_DOMAIN, ch->nodes[0]->name, inputs, (size_t)ch->n_inputs, outputs, 1};
	tern_node *f = tern_pass_replace(c, ch->nodes, ch->n, &nw);
	if (!f)
		return TERN_EOS;
	tern_status st = tern_pass_add_attr_strings(f, "ops", ch->ops, (size_t)ch->n);
	if (!st)
		st = tern_node_add_attr_ints(f, "args", args, (size_t)ch->n * ARGS);
	if (!st)
		st = tern_node_add_attr_floats(f, "params", ch->params, (size_t)ch->n * 2);
	return st;
}

static tern_status grow(tern_pass_ctx *c, tern_node *head)
{
	if (!head->n_inputs || !head->inputs[0])
		return TERN_OK;
	const tern_tensor *ys = tern_pass_shape(c, head->outputs[0]);
	if (!lookup(head) || !ys || ys->dtype != TERN_FLOAT)
		return TERN_OK;
	chain ch = {.shape = ys};
	/* x is the head's input of the output's shape. */
	int xi = tern_pass_same_shape(ys, tern_pass_shape(c, head->inputs[0]))                        ? 0
	        : head->n_inputs > 1 && tern_pass_same_shape(ys, tern_pass_shape(c, head->inputs[1])) ? 1
	                                                                                              : -1;
	if (xi < 0 || tern_pass_has_implicit_use(head->inputs[xi]))
		return TERN_OK;
	ch.inputs[ch.n_inputs++] = head->inputs[xi];
	if (!append(c, &ch, head, NULL))
		return TERN_OK;
	tern_value *cur = head->outputs[0];
	while (tern_pass_single_use(cur) && append(c, &ch, cur->consumers[0], cur))
		cur = cur->consumers[0]->outputs[0];
	return ch.n >= 2 ? emit(c, &ch) : TERN_OK;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each_sorted(c, false, grow);
}

const tern_pass tern_pass_fuse_elementwise = {
        "fuse-elementwise",
        "fuse chains of float elementwise operators into tern.ElementwiseChain",
        2,
        run,
};
