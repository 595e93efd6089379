/* analyze.c — static shapes and constants for the passes: every node is prepared on shape-only tensors
 * (data only for constants) in topological order, exactly as the planner prepares it, so a pass knows
 * what tern-run will know before running anything. */
#include "passes/passes.h"

#include <stdlib.h>

bool tern_pass_is_const(const tern_value *v)
{
	/* An initializer that is also a graph input is a default the caller may replace. */
	return v && (v->flags & TERN_VALUE_INITIALIZER) && v->initializer && !(v->flags & TERN_VALUE_INPUT);
}

static bool grow_tables(tern_pass_ctx *c)
{
	size_t n = c->graph->n_values;
	if (n > c->n_info) {
		tern_value_info *info = realloc(c->info, n * sizeof *info);
		if (!info)
			return false;
		memset(info + c->n_info, 0, (n - c->n_info) * sizeof *info);
		c->info = info;
		c->n_info = n;
	}
	if (n > c->n_data) {
		tern_tensor **data = realloc(c->data, n * sizeof *data);
		if (!data)
			return false;
		memset(data + c->n_data, 0, (n - c->n_data) * sizeof *data);
		c->data = data;
		c->n_data = n;
	}
	return true;
}

const tern_tensor *tern_pass_const(tern_pass_ctx *c, const tern_value *v)
{
	if (!tern_pass_is_const(v) || !grow_tables(c))
		return NULL;
	tern_tensor **slot = &c->data[v->index];
	if (*slot)
		return *slot;
	tern_tensor *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	/* raw weights are read where they lie; other encodings are decoded once */
	if (!tern_tensor_view_proto(v->initializer, t) &&
	    tern_tensor_from_proto(v->initializer, c->model->base_dir, v->name, t) != TERN_OK) {
		tern_error_clear();
		free(t);
		return NULL;
	}
	*slot = t;
	return t;
}

bool tern_pass_scalar(tern_pass_ctx *c, const tern_value *v, double *out)
{
	const tern_tensor *t = tern_pass_const(c, v);
	if (!t || tern_tensor_numel(t) != 1 || t->dtype == TERN_STRING)
		return false;
	*out = tern_tensor_get_f64(t, 0);
	return true;
}

bool tern_pass_const_all(tern_pass_ctx *c, const tern_value *v, double x)
{
	const tern_tensor *t = tern_pass_const(c, v);
	if (!t || t->dtype == TERN_STRING)
		return false;
	for (int64_t i = 0, n = tern_tensor_numel(t); i < n; i++)
		if (tern_tensor_get_f64(t, i) != x)
			return false;
	return true;
}

const tern_tensor *tern_pass_shape(tern_pass_ctx *c, const tern_value *v)
{
	if (!v || (size_t)v->index >= c->n_info || !c->info[v->index].known)
		return NULL;
	return &c->info[v->index].shape;
}

static void set_known(tern_pass_ctx *c, const tern_value *v, int dtype, int rank, const int64_t *dims)
{
	tern_value_info *vi = &c->info[v->index];
	if (!dtype || rank < 0 || rank > TERN_MAX_RANK)
		return;
	for (int d = 0; d < rank; d++)
		if (dims[d] < 0)
			return;
	vi->known = true;
	tern_set_shape(&vi->shape, dtype, rank, dims);
	vi->shape.data = NULL;
}

bool tern_prepare_shapes(const tern_op *op, const tern_node *n, tern_tensor **in, tern_tensor *out_t, tern_tensor **out)
{
	for (size_t o = 0; o < n->n_outputs; o++) {
		memset(&out_t[o], 0, sizeof out_t[o]);
		out[o] = n->outputs[o] ? &out_t[o] : NULL;
	}
	tern_prepare_args p = {0};
	p.node = n;
	p.in = in;
	p.n_in = (int)n->n_inputs;
	p.out = out;
	p.n_out = (int)n->n_outputs;
	tern_status st = op->prepare(&p);
	if (p.free_params && p.params)
		p.free_params(p.params);
	if (st)
		tern_error_clear();
	return !st && !p.defer && !p.dynamic_output;
}

/* Prepares one node; its outputs become known when prepare decides their shapes without run-time data. */
static void infer_node(tern_pass_ctx *c, tern_node *n)
{
	if (n->n_subgraphs)
		return;
	const tern_op *op = tern_op_find(n->domain, n->op_type, n->opset);
	if (!op || !op->prepare)
		return;
	tern_tensor in_t[16], out_t[16];
	tern_tensor *in[16], *out[16];
	if (n->n_inputs > 16 || n->n_outputs > 16)
		return;
	for (size_t i = 0; i < n->n_inputs; i++) {
		tern_value *v = n->inputs[i];
		in[i] = NULL;
		if (!v)
			continue;
		const tern_tensor *s = tern_pass_shape(c, v);
		if (!s)
			return;
		in_t[i] = *s;
		const tern_tensor *data = tern_pass_const(c, v);
		/* values decide shapes only through small or integer tensors; a weight given to prepare
		 * would be packed for nothing (each analysis would copy every weight) */
		if (data && (data->dtype == TERN_FLOAT || data->dtype == TERN_FLOAT16 || data->dtype == TERN_BFLOAT16 ||
		             data->dtype == TERN_DOUBLE) &&
		    tern_tensor_numel(data) > 4096)
			data = NULL;
		in_t[i].data = data ? data->data : NULL;
		in_t[i].nbytes = data ? data->nbytes : 0;
		in[i] = &in_t[i];
	}
	if (!tern_prepare_shapes(op, n, in, out_t, out))
		return;
	for (size_t o = 0; o < n->n_outputs; o++)
		if (n->outputs[o])
			set_known(c, n->outputs[o], out_t[o].dtype, out_t[o].rank, out_t[o].dims);
}

tern_status tern_pass_analyze(tern_pass_ctx *c)
{
	if (c->analyzed)
		return TERN_OK;
	tern_graph *g = c->graph;
	if (!grow_tables(c))
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < c->n_info; i++)
		c->info[i].known = false;
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if (v->flags & TERN_VALUE_INITIALIZER) {
			const Onnx__TensorProto *tp = v->initializer;
			int64_t dims[TERN_MAX_RANK];
			if (!tp || tp->n_dims > TERN_MAX_RANK)
				continue;
			for (size_t d = 0; d < tp->n_dims; d++)
				dims[d] = tp->dims[d];
			set_known(c, v, tp->has_data_type ? tp->data_type : 0, (int)tp->n_dims, dims);
		} else if (v->flags & TERN_VALUE_INPUT) {
			set_known(c, v, v->type.dtype, v->type.rank, v->type.dims);
		}
	}
	tern_node **order;
	size_t count;
	tern_status st = tern_graph_toposort(g, &order, &count);
	if (st)
		return st;
	for (size_t i = 0; i < count; i++)
		infer_node(c, order[i]);
	free(order);
	c->analyzed = true;
	return TERN_OK;
}

void tern_pass_ctx_free(tern_pass_ctx *c)
{
	for (size_t i = 0; i < c->n_data; i++)
		if (c->data[i]) {
			tern_tensor_free(c->data[i]);
			free(c->data[i]);
		}
	free(c->data);
	free(c->info);
	c->data = NULL;
	c->info = NULL;
	c->n_data = c->n_info = 0;
	c->analyzed = false;
}
