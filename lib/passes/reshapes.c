/* reshapes.c — simplifies data movement once shapes are static: a Transpose that only moves dimensions
 * of size 1 is a Reshape (which costs nothing: it aliases its input), consecutive reshapes become one,
 * and consecutive Transposes compose into one. */
#include "passes/passes.h"

#include <stdio.h>

static bool is_reshape(const tern_node *n)
{
	return tern_pass_is(n, "Reshape") || tern_pass_is(n, "Flatten") || tern_pass_is(n, "Squeeze") ||
	        tern_pass_is(n, "Unsqueeze");
}

static bool nonzero_dims(const tern_tensor *s)
{
	for (int d = 0; d < s->rank; d++)
		if (s->dims[d] == 0)
			return false;
	return true;
}

/* Replaces old[0..n_old) with out = Reshape(in, dims of out's static shape). */
static tern_status make_reshape(tern_pass_ctx *c, tern_node *const *old, int n_old, tern_value *in, tern_value *out,
                                const tern_tensor *shape)
{
	char stem[256];
	snprintf(stem, sizeof stem, "%s_shape", out->name);
	bool from_input = tern_model_opset(c->model, "") >= 5;
	tern_value *sv = from_input ? tern_pass_add_ints(c, stem, shape->dims, shape->rank) : NULL;
	if (from_input && !sv)
		return tern_errorf(TERN_EOS, "out of memory");
	const char *inputs[2] = {in->name, sv ? sv->name : NULL};
	const char *outputs[1] = {out->name};
	tern_pass_node nw = {"Reshape", NULL, old[n_old - 1]->name, inputs, from_input ? 2 : 1, outputs, 1};
	tern_node *r = tern_pass_replace(c, old, n_old, &nw);
	if (!r)
		return TERN_EOS;
	return from_input ? TERN_OK : tern_node_add_attr_ints(r, "shape", shape->dims, (size_t)shape->rank);
}

/* Transpose moving only dimensions of size 1: the others keep their order. */
static bool moves_only_ones(const tern_node *n, const tern_tensor *in)
{
	size_t np;
	const int64_t *perm = tern_attr_ints(n, "perm", &np);
	if (!perm || (int)np != in->rank)
		return false;
	int64_t last = -1;
	for (size_t i = 0; i < np; i++) {
		if (perm[i] < 0 || perm[i] >= in->rank)
			return false;
		if (in->dims[perm[i]] == 1)
			continue;
		if (perm[i] < last)
			return false;
		last = perm[i];
	}
	return true;
}

static tern_status transpose_as_reshape(tern_pass_ctx *c, tern_node *n, bool *done)
{
	const tern_tensor *in = tern_pass_shape(c, n->inputs[0]), *out = tern_pass_shape(c, n->outputs[0]);
	*done = false;
	if (!in || !out || !nonzero_dims(out) || !moves_only_ones(n, in))
		return TERN_OK;
	/* A permutation that changes nothing is the no-op pass's business. */
	size_t np;
	const int64_t *perm = tern_attr_ints(n, "perm", &np);
	bool identity = true;
	for (size_t i = 0; i < np; i++)
		identity &= perm[i] == (int64_t)i;
	if (identity)
		return TERN_OK;
	tern_tensor shape = *out;
	*done = true;
	return make_reshape(c, &n, 1, n->inputs[0], n->outputs[0], &shape);
}

static tern_status merge_reshapes(tern_pass_ctx *c, tern_node *n, bool *done)
{
	*done = false;
	tern_node *first = tern_pass_producer(n->inputs[0], NULL);
	if (!first || !is_reshape(first) || !first->inputs[0] || !tern_pass_single_use(n->inputs[0]))
		return TERN_OK;
	const tern_tensor *out = tern_pass_shape(c, n->outputs[0]);
	if (!out || !nonzero_dims(out))
		return TERN_OK;
	tern_tensor shape = *out;
	tern_node *old[2] = {first, n};
	*done = true;
	return make_reshape(c, old, 2, first->inputs[0], n->outputs[0], &shape);
}

static tern_status merge_transposes(tern_pass_ctx *c, tern_node *n, bool *done)
{
	*done = false;
	tern_node *first = tern_pass_producer(n->inputs[0], "Transpose");
	if (!first || !tern_pass_single_use(n->inputs[0]))
		return TERN_OK;
	size_t n1, n2;
	const int64_t *p1 = tern_attr_ints(first, "perm", &n1), *p2 = tern_attr_ints(n, "perm", &n2);
	if (!p1 || !p2 || n1 != n2 || n1 > TERN_MAX_RANK)
		return TERN_OK;
	int64_t perm[TERN_MAX_RANK];
	for (size_t i = 0; i < n1; i++) {
		if (p2[i] < 0 || (size_t)p2[i] >= n1)
			return TERN_OK;
		perm[i] = p1[p2[i]];
	}
	const char *inputs[1] = {first->inputs[0]->name};
	const char *outputs[1] = {n->outputs[0]->name};
	tern_node *old[2] = {first, n};
	tern_pass_node nw = {"Transpose", NULL, n->name, inputs, 1, outputs, 1};
	tern_node *t = tern_pass_replace(c, old, 2, &nw);
	*done = true;
	return t ? tern_node_add_attr_ints(t, "perm", perm, n1) : TERN_EOS;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	tern_status st = TERN_OK;
	for (size_t i = 0; !st && i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		bool done = false;
		if (n->removed || *n->domain || n->n_inputs < 1 || !n->inputs[0] || n->n_outputs != 1 || !n->outputs[0])
			continue;
		if (tern_pass_is(n, "Transpose")) {
			st = merge_transposes(c, n, &done);
			if (!st && !done)
				st = transpose_as_reshape(c, n, &done);
		} else if (is_reshape(n)) {
			st = merge_reshapes(c, n, &done);
		}
		if (!st && done)
			st = tern_pass_analyze(c); /* the next rewrite reads shapes of the new nodes */
	}
	return st;
}

const tern_pass tern_pass_reshapes = {
        "simplify-reshapes",
        "turn Transposes that move only size-1 dimensions into Reshapes; merge chains of reshapes and of Transposes",
        1,
        run,
};
