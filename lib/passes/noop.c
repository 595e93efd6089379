/* noop.c — no-op elimination: nodes whose output equals their input (Identity, Dropout in inference,
 * a Reshape, Cast, Transpose, Pad, Slice, Expand... that changes nothing, arithmetic with the neutral
 * element) are bypassed. */
#include "passes/passes.h"

static bool same_type(tern_pass_ctx *c, const tern_value *a, const tern_value *b)
{
	const tern_tensor *sa = tern_pass_shape(c, a), *sb = tern_pass_shape(c, b);
	return sa && sb && sa->dtype == sb->dtype && sa->rank == sb->rank &&
	        memcmp(sa->dims, sb->dims, (size_t)sa->rank * sizeof sa->dims[0]) == 0;
}

static bool input_const_all(tern_pass_ctx *c, const tern_node *n, size_t i, double x)
{
	return i < n->n_inputs && n->inputs[i] && tern_pass_const_all(c, n->inputs[i], x);
}

/* Dropout is the identity unless training: training_mode (opset 12+) absent or a false constant,
 * is_test set before opset 7 (from 7 on Dropout only trains through training_mode). */
static bool inference_dropout(tern_pass_ctx *c, const tern_node *n)
{
	if (n->n_outputs > 1 && n->outputs[1] && tern_pass_uses(n->outputs[1]))
		return false;
	if (n->opset < 7)
		return tern_attr_int(n, "is_test", 0) != 0;
	if (n->n_inputs > 2 && n->inputs[2])
		return input_const_all(c, n, 2, 0);
	return true;
}

static bool identity_perm(const tern_node *n, int rank)
{
	size_t np;
	const int64_t *perm = tern_attr_ints(n, "perm", &np);
	if (!perm)
		return rank <= 1;
	for (size_t i = 0; i < np; i++)
		if (perm[i] != (int64_t)i)
			return false;
	return true;
}

/* Slice's steps are all 1: then an output as big as the input is the input. */
static bool unit_steps(tern_pass_ctx *c, const tern_node *n)
{
	if (n->opset < 10 || n->n_inputs < 5 || !n->inputs[4])
		return true;
	return input_const_all(c, n, 4, 1);
}

/* Binary arithmetic with the neutral element as the second operand (or, commuting, the first). */
static int neutral_operand(tern_pass_ctx *c, const tern_node *n)
{
	static const struct {
		const char *op;
		double unit;
		bool commutes;
	} ops[] = {{"Add", 0, true}, {"Sub", 0, false}, {"Mul", 1, true}, {"Div", 1, false}, {"Pow", 1, false}};
	if (n->n_inputs != 2)
		return -1;
	for (size_t i = 0; i < TERN_ARRAY_LEN(ops); i++) {
		if (!tern_pass_is(n, ops[i].op))
			continue;
		if (input_const_all(c, n, 1, ops[i].unit))
			return 0;
		if (ops[i].commutes && input_const_all(c, n, 0, ops[i].unit))
			return 1;
	}
	return -1;
}

/* The input that a node passes through unchanged, or -1. */
static int passthrough(tern_pass_ctx *c, const tern_node *n)
{
	if (n->n_outputs < 1 || !n->outputs[0] || n->n_inputs < 1 || !n->inputs[0])
		return -1;
	for (size_t o = 1; o < n->n_outputs; o++)
		if (n->outputs[o] && tern_pass_uses(n->outputs[o]))
			return -1;
	if (tern_pass_is(n, "Identity") || (tern_pass_is(n, "Dropout") && inference_dropout(c, n)))
		return 0;
	int k = neutral_operand(c, n);
	if (k >= 0)
		return same_type(c, n->inputs[k], n->outputs[0]) ? k : -1;
	if (!same_type(c, n->inputs[0], n->outputs[0]))
		return -1;
	static const char *const same_when_shape_kept[] = {"Reshape", "Flatten", "Squeeze",  "Unsqueeze",
	                                                   "Expand",  "Cast",    "CastLike", "Tile"};
	for (size_t i = 0; i < TERN_ARRAY_LEN(same_when_shape_kept); i++)
		if (tern_pass_is(n, same_when_shape_kept[i]))
			return 0;
	if (tern_pass_is(n, "Transpose"))
		return identity_perm(n, tern_pass_shape(c, n->inputs[0])->rank) ? 0 : -1;
	if (tern_pass_is(n, "Slice"))
		return unit_steps(c, n) ? 0 : -1;
	if (tern_pass_is(n, "Pad")) {
		if (n->opset >= 11)
			return input_const_all(c, n, 1, 0) ? 0 : -1;
		size_t np;
		const int64_t *pads = tern_attr_ints(n, "pads", &np);
		for (size_t i = 0; i < np; i++)
			if (pads[i] != 0)
				return -1;
		return 0;
	}
	static const char *const variadic[] = {"Concat", "Sum", "Mean", "Max", "Min"};
	for (size_t i = 0; i < TERN_ARRAY_LEN(variadic); i++)
		if (tern_pass_is(n, variadic[i]) && n->n_inputs == 1)
			return 0;
	return tern_pass_is(n, "Split") && n->n_outputs == 1 ? 0 : -1;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	for (size_t i = 0; i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		if (n->removed || *n->domain)
			continue;
		int k = passthrough(c, n);
		if (k < 0)
			continue;
		if (tern_pass_forward(c, n->outputs[0], n->inputs[k]))
			tern_pass_remove(c, n);
	}
	return TERN_OK;
}

const tern_pass tern_pass_noop = {
        "eliminate-noops",
        "bypass nodes that change nothing: Identity, inference Dropout, Reshape/Cast/Transpose/Pad/Slice to the same",
        1,
        run,
};
