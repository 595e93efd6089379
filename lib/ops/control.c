/* control.c — operators that run subgraphs: If, Loop, Scan. Each body is planned like any graph
 * (its own executor, re-planned only when its input shapes change) and reads enclosing values
 * through the executor's outer slots. */
#include "internal.h"

#include <stdlib.h>

typedef struct body_plan {
	tern_exec *exec[2]; /* If: then, else; Loop/Scan: body */
} body_plan;

static void free_body_plan(void *p)
{
	body_plan *b = p;
	tern_exec_free(b->exec[0]);
	tern_exec_free(b->exec[1]);
	free(b);
}

static tern_status copy_out(const tern_node *node, tern_tensor *dst, const tern_tensor *src)
{
	/* strings, sequences and empty optionals are copied deeply (a body's values are its own) */
	if (src->dtype == TERN_STRING || src->dtype == TERN_SEQUENCE || src->dtype == TERN_NONE) {
		tern_status rc = tern_tensor_copy(dst, src);
		free(dst->name);
		dst->name = NULL;
		return rc ? tern_node_errorf(node, rc, "%s", tern_error()) : TERN_OK;
	}
	tern_status rc = tern_tensor_alloc(dst, src->dtype, src->rank, src->dims);
	if (rc)
		return tern_node_errorf(node, rc, "%s", tern_error());
	if (src->nbytes)
		memcpy(dst->data, src->data, dst->nbytes);
	return TERN_OK;
}

static tern_status body_prepare(tern_prepare_args *p)
{
	body_plan *b = calloc(1, sizeof *b);
	if (!b)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = b;
	p->free_params = free_body_plan;
	p->dynamic_output = 1;
	return TERN_OK;
}

/* ---------------------------------------------------------------- If */

static tern_status if_run(const tern_kernel_args *a)
{
	body_plan *b = a->params;
	if (!a->in[0] || tern_tensor_numel(a->in[0]) < 1)
		return tern_node_errorf(a->node, TERN_EDATA, "the condition is empty");
	int which = tern_tensor_get_f64(a->in[0], 0) != 0 ? 0 : 1;
	tern_graph *g = tern_attr_graph(a->node, which == 0 ? "then_branch" : "else_branch");
	tern_status rc = b->exec[which] ? TERN_OK : tern_exec_create(a->exec, g, NULL, 0, a->pool, &b->exec[which]);
	if (!rc)
		rc = tern_exec_run(b->exec[which], NULL, 0);
	if (rc)
		return rc;
	if (tern_exec_num_outputs(b->exec[which]) != a->n_out)
		return tern_node_errorf(a->node, TERN_EDATA, "the %s has %d outputs, the node %d",
		                        which == 0 ? "then_branch" : "else_branch",
		                        tern_exec_num_outputs(b->exec[which]), a->n_out);
	for (int o = 0; o < a->n_out; o++)
		if (a->out[o] && (rc = copy_out(a->node, a->out[o], tern_exec_output(b->exec[which], o))))
			return rc;
	return TERN_OK;
}

static tern_status if_prepare(tern_prepare_args *p)
{
	if (!tern_attr_graph(p->node, "then_branch") || !tern_attr_graph(p->node, "else_branch"))
		return tern_node_errorf(p->node, TERN_EDATA, "If needs then_branch and else_branch graphs");
	p->kernel = if_run;
	return body_prepare(p);
}

/* ---------------------------------------------------------------- Loop */

typedef struct tensor_list {
	tern_tensor *items;
	int64_t n, cap;
} tensor_list;

static tern_status list_push(const tern_node *node, tensor_list *l, const tern_tensor *t)
{
	if (l->n == l->cap) {
		int64_t ncap = l->cap ? l->cap * 2 : 16;
		tern_tensor *ni = realloc(l->items, (size_t)ncap * sizeof *ni);
		if (!ni)
			return tern_errorf(TERN_EOS, "out of memory");
		l->items = ni;
		l->cap = ncap;
	}
	memset(&l->items[l->n], 0, sizeof l->items[0]);
	tern_status rc = copy_out(node, &l->items[l->n], t);
	if (!rc)
		l->n++;
	return rc;
}

static void list_free(tensor_list *l)
{
	for (int64_t i = 0; i < l->n; i++)
		tern_tensor_free(&l->items[i]);
	free(l->items);
	memset(l, 0, sizeof *l);
}

/* Stacks equal-shaped tensors along a new axis at `axis`, in order or reversed. */
static tern_status stack(const tern_node *node, tern_tensor *dst, const tensor_list *l, int axis, int reverse,
                         int dtype_if_empty)
{
	if (l->n == 0) {
		int64_t zero = 0;
		tern_status rc = tern_tensor_alloc(dst, dtype_if_empty ? dtype_if_empty : TERN_FLOAT, 1, &zero);
		return rc ? tern_node_errorf(node, rc, "%s", tern_error()) : TERN_OK;
	}
	const tern_tensor *first = &l->items[0];
	for (int64_t i = 1; i < l->n; i++)
		if (l->items[i].rank != first->rank || l->items[i].dtype != first->dtype ||
		    tern_tensor_numel(&l->items[i]) != tern_tensor_numel(first))
			return tern_node_errorf(node, TERN_EDATA, "scan output changes shape between iterations");
	if (first->rank + 1 > TERN_MAX_RANK)
		return tern_node_errorf(node, TERN_EDATA, "scan output rank exceeds %d", TERN_MAX_RANK);
	if (axis < 0)
		axis += first->rank + 1;
	if (axis < 0 || axis > first->rank)
		return tern_node_errorf(node, TERN_EDATA, "scan output axis %d is out of range", axis);
	int64_t dims[TERN_MAX_RANK];
	for (int d = 0, k = 0; d <= first->rank; d++)
		dims[d] = d == axis ? l->n : first->dims[k++];
	tern_status rc = tern_tensor_alloc(dst, first->dtype, first->rank + 1, dims);
	if (rc)
		return tern_node_errorf(node, rc, "%s", tern_error());
	size_t es = tern_dtype_size(first->dtype);
	int64_t outer = tern_numel(axis, first->dims);
	int64_t inner = tern_numel(first->rank - axis, first->dims + axis);
	for (int64_t i = 0; i < l->n; i++) {
		const tern_tensor *src = &l->items[reverse ? l->n - 1 - i : i];
		for (int64_t o = 0; o < outer; o++)
			memcpy((char *)dst->data + ((o * l->n + i) * inner) * es,
			       (const char *)src->data + o * inner * es, (size_t)inner * es);
	}
	return TERN_OK;
}

static tern_status loop_run(const tern_kernel_args *a)
{
	body_plan *b = a->params;
	tern_graph *body = tern_attr_graph(a->node, "body");
	int n_carried = a->n_in - 2;
	if (n_carried < 0)
		return tern_node_errorf(a->node, TERN_EDATA, "Loop needs at least 2 inputs (M, cond)");
	if ((int)body->n_inputs != n_carried + 2 || (int)body->n_outputs < n_carried + 1)
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "the body has %zu inputs and %zu outputs for %d carried values", body->n_inputs,
		                        body->n_outputs, n_carried);
	int n_scan = (int)body->n_outputs - 1 - n_carried;
	int64_t max_trips = a->in[0] && tern_tensor_numel(a->in[0]) ? tern_tensor_get_i64(a->in[0], 0) : INT64_MAX;
	bool cond = a->in[1] && tern_tensor_numel(a->in[1]) ? tern_tensor_get_f64(a->in[1], 0) != 0 : true;

	tern_status rc = TERN_OK;
	int64_t scalar_dims[1] = {0};
	tern_tensor iter = {0}, cond_t = {0};
	tern_tensor *carried = calloc((size_t)n_carried * 2 + 1, sizeof *carried); /* current, next */
	tensor_list *scans = calloc((size_t)n_scan + 1, sizeof *scans);
	tern_tensor **inputs = calloc((size_t)n_carried + 2, sizeof *inputs);
	if (!carried || !scans || !inputs) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	if ((rc = tern_tensor_alloc(&iter, TERN_INT64, 0, scalar_dims)) ||
	    (rc = tern_tensor_alloc(&cond_t, TERN_BOOL, 0, scalar_dims)))
		goto done;
	for (int i = 0; i < n_carried; i++) {
		if (!a->in[2 + i]) {
			rc = tern_node_errorf(a->node, TERN_EDATA, "carried value %d is missing", i);
			goto done;
		}
		if ((rc = copy_out(a->node, &carried[i], a->in[2 + i])))
			goto done;
	}
	inputs[0] = &iter;
	inputs[1] = &cond_t;
	for (int64_t trip = 0; trip < max_trips && cond; trip++) {
		*(int64_t *)iter.data = trip;
		*(uint8_t *)cond_t.data = cond;
		for (int i = 0; i < n_carried; i++)
			inputs[2 + i] = &carried[i];
		if (!b->exec[0])
			rc = tern_exec_create(a->exec, body, inputs, n_carried + 2, a->pool, &b->exec[0]);
		if (!rc)
			rc = tern_exec_run(b->exec[0], inputs, n_carried + 2);
		if (rc)
			goto done;
		const tern_tensor *c = tern_exec_output(b->exec[0], 0);
		cond = tern_tensor_numel(c) ? tern_tensor_get_f64(c, 0) != 0 : false;
		/* Body outputs may alias its inputs (an Identity of a carried value): take them all before
		 * the carried values are replaced. */
		for (int s = 0; s < n_scan; s++)
			if ((rc = list_push(a->node, &scans[s], tern_exec_output(b->exec[0], 1 + n_carried + s))))
				goto done;
		for (int i = 0; i < n_carried; i++) {
			tern_tensor next = {0};
			if ((rc = copy_out(a->node, &next, tern_exec_output(b->exec[0], 1 + i))))
				goto done;
			tern_tensor_free(&carried[n_carried + i]);
			carried[n_carried + i] = next;
		}
		for (int i = 0; i < n_carried; i++) {
			tern_tensor_free(&carried[i]);
			carried[i] = carried[n_carried + i];
			memset(&carried[n_carried + i], 0, sizeof carried[0]);
		}
	}
	for (int i = 0; i < n_carried && i < a->n_out; i++)
		if (a->out[i]) {
			*a->out[i] = carried[i];
			memset(&carried[i], 0, sizeof carried[i]);
		}
	for (int s = 0; s < n_scan && n_carried + s < a->n_out; s++)
		if (a->out[n_carried + s] &&
		    (rc = stack(a->node, a->out[n_carried + s], &scans[s], 0, 0,
		                body->outputs[1 + n_carried + s]->type.dtype)))
			goto done;
done:
	for (int i = 0; carried && i < 2 * n_carried; i++)
		tern_tensor_free(&carried[i]);
	for (int s = 0; scans && s < n_scan; s++)
		list_free(&scans[s]);
	free(carried);
	free(scans);
	free(inputs);
	tern_tensor_free(&iter);
	tern_tensor_free(&cond_t);
	return rc;
}

static tern_status loop_prepare(tern_prepare_args *p)
{
	if (!tern_attr_graph(p->node, "body"))
		return tern_node_errorf(p->node, TERN_EDATA, "Loop needs a body graph");
	p->kernel = loop_run;
	return body_prepare(p);
}

/* ---------------------------------------------------------------- Scan */

/* Copies slice `index` along `axis` of src into dst (allocated with the axis removed). */
static tern_status take_slice(const tern_node *node, tern_tensor *dst, const tern_tensor *src, int axis, int64_t index)
{
	int64_t dims[TERN_MAX_RANK];
	for (int d = 0, k = 0; d < src->rank; d++)
		if (d != axis)
			dims[k++] = src->dims[d];
	tern_status rc = tern_tensor_alloc(dst, src->dtype, src->rank - 1, dims);
	if (rc)
		return tern_node_errorf(node, rc, "%s", tern_error());
	size_t es = tern_dtype_size(src->dtype);
	int64_t outer = tern_numel(axis, src->dims);
	int64_t inner = tern_numel(src->rank - axis - 1, src->dims + axis + 1);
	int64_t len = src->dims[axis];
	for (int64_t o = 0; o < outer; o++)
		memcpy((char *)dst->data + o * inner * es, (const char *)src->data + ((o * len + index) * inner) * es,
		       (size_t)inner * es);
	return TERN_OK;
}

static tern_status scan_run(const tern_kernel_args *a)
{
	body_plan *b = a->params;
	tern_graph *body = tern_attr_graph(a->node, "body");
	int m = (int)tern_attr_int(a->node, "num_scan_inputs", 0);
	int n_state = a->n_in - m;
	int n_scan_out = a->n_out - n_state;
	if (m < 1 || n_state < 0 || n_scan_out < 0 || (int)body->n_inputs != a->n_in ||
	    (int)body->n_outputs != a->n_out)
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "inputs, outputs and num_scan_inputs=%d do not match the body", m);
	size_t n_axes, n_dirs, n_oaxes, n_odirs;
	const int64_t *in_axes = tern_attr_ints(a->node, "scan_input_axes", &n_axes);
	const int64_t *in_dirs = tern_attr_ints(a->node, "scan_input_directions", &n_dirs);
	const int64_t *out_axes = tern_attr_ints(a->node, "scan_output_axes", &n_oaxes);
	const int64_t *out_dirs = tern_attr_ints(a->node, "scan_output_directions", &n_odirs);
	int64_t len = -1;
	for (int i = 0; i < m; i++) {
		const tern_tensor *x = a->in[n_state + i];
		int axis = in_axes && (size_t)i < n_axes ? (int)in_axes[i] : 0;
		if (axis < 0)
			axis += x->rank;
		if (axis < 0 || axis >= x->rank)
			return tern_node_errorf(a->node, TERN_EDATA, "scan input %d: axis out of range", i);
		if (len >= 0 && x->dims[axis] != len)
			return tern_node_errorf(a->node, TERN_EDATA, "scan inputs differ in sequence length");
		len = x->dims[axis];
	}
	tern_status rc = TERN_OK;
	tern_tensor *state = calloc((size_t)a->n_in + 1, sizeof *state);
	tern_tensor *next_state = calloc((size_t)n_state + 1, sizeof *next_state);
	tern_tensor **inputs = calloc((size_t)a->n_in + 1, sizeof *inputs);
	tensor_list *outs = calloc((size_t)n_scan_out + 1, sizeof *outs);
	if (!state || !next_state || !inputs || !outs) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	for (int i = 0; i < n_state; i++)
		if ((rc = copy_out(a->node, &state[i], a->in[i])))
			goto done;
	for (int64_t t = 0; t < len; t++) {
		for (int i = 0; i < m; i++) {
			const tern_tensor *x = a->in[n_state + i];
			int axis = in_axes && (size_t)i < n_axes ? (int)in_axes[i] : 0;
			if (axis < 0)
				axis += x->rank;
			int reverse = in_dirs && (size_t)i < n_dirs && in_dirs[i];
			tern_tensor_free(&state[n_state + i]);
			if ((rc = take_slice(a->node, &state[n_state + i], x, axis, reverse ? len - 1 - t : t)))
				goto done;
		}
		for (int i = 0; i < a->n_in; i++)
			inputs[i] = &state[i];
		if (!b->exec[0])
			rc = tern_exec_create(a->exec, body, inputs, a->n_in, a->pool, &b->exec[0]);
		if (!rc)
			rc = tern_exec_run(b->exec[0], inputs, a->n_in);
		if (rc)
			goto done;
		for (int s = 0; s < n_scan_out; s++)
			if ((rc = list_push(a->node, &outs[s], tern_exec_output(b->exec[0], n_state + s))))
				goto done;
		for (int i = 0; i < n_state; i++) {
			tern_tensor next = {0};
			if ((rc = copy_out(a->node, &next, tern_exec_output(b->exec[0], i))))
				goto done;
			tern_tensor_free(&next_state[i]);
			next_state[i] = next;
		}
		for (int i = 0; i < n_state; i++) {
			tern_tensor_free(&state[i]);
			state[i] = next_state[i];
			memset(&next_state[i], 0, sizeof next_state[0]);
		}
	}
	for (int i = 0; i < n_state; i++)
		if (a->out[i]) {
			*a->out[i] = state[i];
			memset(&state[i], 0, sizeof state[i]);
		}
	for (int s = 0; s < n_scan_out; s++) {
		if (!a->out[n_state + s])
			continue;
		int axis = out_axes && (size_t)s < n_oaxes ? (int)out_axes[s] : 0;
		int reverse = out_dirs && (size_t)s < n_odirs && out_dirs[s];
		if ((rc = stack(a->node, a->out[n_state + s], &outs[s], axis, reverse,
		                body->outputs[n_state + s]->type.dtype)))
			goto done;
	}
done:
	for (int i = 0; state && i < a->n_in; i++)
		tern_tensor_free(&state[i]);
	for (int i = 0; next_state && i < n_state; i++)
		tern_tensor_free(&next_state[i]);
	free(next_state);
	for (int s = 0; outs && s < n_scan_out; s++)
		list_free(&outs[s]);
	free(state);
	free(inputs);
	free(outs);
	return rc;
}

static tern_status scan_prepare(tern_prepare_args *p)
{
	if (!tern_attr_graph(p->node, "body"))
		return tern_node_errorf(p->node, TERN_EDATA, "Scan needs a body graph");
	p->kernel = scan_run;
	return body_prepare(p);
}

static const tern_op ops[] = {
        {"", "If", 1, 0, if_prepare, 0, "control"},
        {"", "Loop", 1, 0, loop_prepare, 0, "control"},
        {"", "Scan", 9, 0, scan_prepare, 0, "control"},
};

const tern_op_table tern_ops_control = {ops, TERN_ARRAY_LEN(ops)};
