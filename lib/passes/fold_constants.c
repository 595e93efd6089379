/* fold_constants.c — nodes whose inputs are all constants are computed now, with the kernels tern-run
 * would use, and replaced by initializers; Shape and Size fold as soon as their input's shape is static,
 * which collapses the Shape → Gather → Unsqueeze → Concat → Reshape arithmetic that exporters write. */
#include "passes/passes.h"

/* A folded result may be bigger than its inputs (Expand, Tile, ConstantOfShape); beyond this size and
 * that ratio it stays a computation rather than bloating the file. */
#define MAX_GROWN_BYTES (4u << 20)

static bool deterministic(const tern_node *n)
{
	return strncmp(n->op_type, "Random", 6) != 0 && strcmp(n->op_type, "Bernoulli") != 0 &&
	        strcmp(n->op_type, "Multinomial") != 0;
}

static bool reads_shape_only(const tern_node *n)
{
	return tern_pass_is(n, "Shape") || tern_pass_is(n, "Size");
}

/* The inputs as tensors to evaluate on; false when one is not a constant. */
static bool gather_inputs(tern_pass_ctx *c, tern_node *n, tern_tensor *shapes, tern_tensor **in, size_t *in_bytes)
{
	*in_bytes = 0;
	for (size_t i = 0; i < n->n_inputs; i++) {
		tern_value *v = n->inputs[i];
		in[i] = NULL;
		if (!v)
			continue;
		const tern_tensor *t = tern_pass_const(c, v);
		if (t) {
			in[i] = (tern_tensor *)t;
			*in_bytes += t->nbytes;
			continue;
		}
		const tern_tensor *s = reads_shape_only(n) && i == 0 ? tern_pass_shape(c, v) : NULL;
		if (!s)
			return false;
		shapes[i] = *s;
		shapes[i].data = NULL;
		in[i] = &shapes[i];
	}
	return true;
}

static tern_status fold(tern_pass_ctx *c, tern_node *n)
{
	if (n->n_subgraphs || !deterministic(n) || n->n_inputs > 16 || n->n_outputs > 16 || !n->n_outputs)
		return TERN_OK;
	if (*n->domain && strcmp(n->domain, TERN_DOMAIN) != 0)
		return TERN_OK;
	for (size_t o = 0; o < n->n_outputs; o++)
		if (n->outputs[o] && (n->outputs[o]->flags & TERN_VALUE_OUTPUT))
			return TERN_OK;
	tern_tensor shapes[16], *in[16], out[16];
	size_t in_bytes;
	if (!gather_inputs(c, n, shapes, in, &in_bytes) || !tern_op_find(n->domain, n->op_type, n->opset))
		return TERN_OK;
	if (tern_node_eval(n, in, (int)n->n_inputs, out, (int)n->n_outputs, NULL)) {
		tern_error_clear();
		return TERN_OK;
	}
	size_t out_bytes = 0;
	for (size_t o = 0; o < n->n_outputs; o++)
		out_bytes += out[o].nbytes;
	bool ok = out_bytes <= MAX_GROWN_BYTES || out_bytes <= in_bytes;
	for (size_t o = 0; o < n->n_outputs && ok; o++)
		ok = !n->outputs[o] || (out[o].dtype != TERN_STRING && out[o].dtype > 0 && out[o].dtype < TERN_DTYPE_COUNT);
	/* (strings, sequences and empty optionals stay computations: an initializer is a tensor) */
	tern_status st = TERN_OK;
	if (ok) {
		tern_value *outs[16], *ins[16];
		for (size_t o = 0; o < n->n_outputs; o++)
			outs[o] = n->outputs[o];
		for (size_t i = 0; i < n->n_inputs; i++)
			ins[i] = n->inputs[i];
		tern_pass_remove(c, n);
		for (size_t o = 0; o < n->n_outputs && !st; o++) {
			if (!outs[o] || !tern_pass_uses(outs[o]))
				continue;
			if (!tern_graph_take_initializer(c->graph, outs[o]->name, &out[o]))
				st = tern_errorf(TERN_EOS, "out of memory");
		}
		/* a weight folded into a new one (a Transpose, a Cast) goes now, not at the next dce */
		for (size_t i = 0; i < n->n_inputs && !st; i++)
			tern_pass_drop_if_unused(c, ins[i]);
	}
	for (size_t o = 0; o < n->n_outputs; o++)
		tern_tensor_free(&out[o]);
	return st;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each_sorted(c, false, fold);
}

const tern_pass tern_pass_fold_constants = {
        "fold-constants",
        "compute nodes whose inputs are constants (and Shape/Size of static shapes) into initializers",
        1,
        run,
};
