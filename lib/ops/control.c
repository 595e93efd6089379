/* control.c — operators that run subgraphs: If, Loop, Scan. Each body is planned like any graph
 * (its own executor, re-planned only when its input shapes change) and reads enclosing values
 * through the executor's outer slots. */
#include "internal.h"
#include "passes/passes.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct body_plan {
	tern_exec *exec[2]; /* If: then, else; Loop/Scan: body */
	tern_graph *branch[2]; /* If: then_branch, else_branch */
	uint32_t fixed; /* If: the outputs of declared types (tern_prepare_args.fixed_outputs) */
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
	if (!tern_dtype_plain(src->dtype)) {
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

/* Unless x has the type and shape a plan gave it (want): one line, "WHAT is ..., where WHO ...",
 * WHAT formatted from `what` and the arguments after it only then (a call checks at every run). */
static tern_status check_planned(const tern_node *node, const tern_tensor *x, const tern_tensor *want,
                                 const char *who, const char *what, ...) __attribute__((format(printf, 5, 6)));

static tern_status check_planned(const tern_node *node, const tern_tensor *x, const tern_tensor *want,
                                 const char *who, const char *what, ...)
{
	if (tern_pass_same_shape(x, want))
		return TERN_OK;
	char name[160], got[128], planned[128];
	va_list ap;
	va_start(ap, what);
	vsnprintf(name, sizeof name, what, ap);
	va_end(ap);
	return tern_node_errorf(node, TERN_EDATA, "%s is %s, where %s %s", name,
	                        tern_shape_str(x->dtype, x->rank, x->dims, got, sizeof got), who,
	                        tern_shape_str(want->dtype, want->rank, want->dims, planned, sizeof planned));
}

/* Output o of a body's run into dst: its bytes are moved when the body may give them away
 * (tern_exec_output_movable) and no other output is the same tensor; anything else is copied. A
 * fixed output (tern_prepare_args.fixed_outputs) has its place already: the body's value is copied
 * there when it has the type and shape the graph declares. */
static tern_status take_out(const tern_node *node, tern_tensor *dst, tern_exec *body, int o, bool fixed)
{
	tern_tensor *src = tern_exec_output(body, o);
	if (fixed) {
		tern_status rc = check_planned(node, src, dst, "the graph declares", "output %d", o);
		if (rc)
			return rc;
		if (dst->nbytes)
			memcpy(dst->data, src->data, dst->nbytes);
		return TERN_OK;
	}
	bool alone = tern_exec_output_movable(body, o) && tern_dtype_plain(src->dtype);
	for (int k = 0; alone && k < tern_exec_num_outputs(body); k++)
		alone = k == o || tern_exec_output(body, k) != src;
	if (!alone)
		return copy_out(node, dst, src);
	char *name = dst->name;
	*dst = *src;
	dst->name = name;
	src->data = NULL;
	src->nbytes = 0;
	src->owns_data = 0;
	return TERN_OK;
}

/* Whether a type is one a plan can give a place to: a numeric tensor of static shape. */
static bool static_type(const tern_type *t)
{
	if (t->dtype <= 0 || !tern_dtype_plain(t->dtype) || t->rank < 0 || t->rank > TERN_MAX_RANK)
		return false;
	for (int d = 0; d < t->rank; d++)
		if (t->dims[d] < 0)
			return false;
	return true;
}

/* The type value v always has, as the graph declares it: its own declared type, else, for an If's
 * output, the type both branches declare for it, and for a call's, that of the callee's result
 * (followed `depth` calls deep). False when nothing fixes it. */
static bool declared_type(const tern_value *v, tern_type *t, int depth)
{
	if (!v)
		return false;
	if (static_type(&v->type)) {
		*t = v->type;
		return true;
	}
	const tern_node *n = v->producer;
	int k = v->producer_output;
	if (!n || n->removed || depth <= 0 || k < 0)
		return false;
	if (!*n->domain && !strcmp(n->op_type, "If")) {
		const tern_graph *a = tern_attr_graph(n, "then_branch"), *b = tern_attr_graph(n, "else_branch");
		tern_type ta, tb;
		if (!a || !b || (size_t)k >= a->n_outputs || (size_t)k >= b->n_outputs ||
		    !declared_type(a->outputs[k], &ta, depth - 1) || !declared_type(b->outputs[k], &tb, depth - 1) ||
		    !tern_type_same(&ta, &tb))
			return false;
		*t = ta;
		return true;
	}
	if (tern_node_kept_handle(n) == k) {
		*t = (tern_type){.dtype = TERN_INT64, .rank = 0};
		return true;
	}
	const char *domain, *name = tern_node_callee(n, &domain);
	const tern_graph *fn = name && n->graph ? tern_function_find(n->graph->model, domain, name) : NULL;
	if (!fn || (size_t)k >= fn->n_outputs)
		return false;
	return declared_type(fn->outputs[k], t, depth - 1);
}

/* Fixes the outputs of an If or a call whose types the graph declares (declared_type): the plan
 * gives them their places, and what reads them is planned ahead rather than when it runs. */
static void fix_declared_outputs(tern_prepare_args *p)
{
	for (int o = 0; o < p->n_out && o < 32; o++) {
		tern_type t;
		if (!p->out[o] || (size_t)o >= p->node->n_outputs || !declared_type(p->node->outputs[o], &t, 16))
			continue;
		tern_set_shape(p->out[o], t.dtype, t.rank, t.dims);
		p->fixed_outputs |= 1u << o;
	}
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
	tern_status rc =
	        b->exec[which] ? TERN_OK : tern_exec_create(a->exec, b->branch[which], NULL, 0, a->pool, &b->exec[which]);
	if (!rc)
		rc = tern_exec_run(b->exec[which], NULL, 0);
	if (rc)
		return rc;
	if (tern_exec_num_outputs(b->exec[which]) != a->n_out)
		return tern_node_errorf(a->node, TERN_EDATA, "the %s has %d outputs, the node %d",
		                        which == 0 ? "then_branch" : "else_branch",
		                        tern_exec_num_outputs(b->exec[which]), a->n_out);
	for (int o = 0; o < a->n_out; o++)
		if (a->out[o] && (rc = take_out(a->node, a->out[o], b->exec[which], o, tern_mask_has(b->fixed, o))))
			return rc;
	return TERN_OK;
}

static tern_status if_prepare(tern_prepare_args *p)
{
	if (!tern_attr_graph(p->node, "then_branch") || !tern_attr_graph(p->node, "else_branch"))
		return tern_node_errorf(p->node, TERN_EDATA, "If needs then_branch and else_branch graphs");
	p->kernel = if_run;
	tern_status rc = body_prepare(p);
	if (!rc) {
		body_plan *b = p->params;
		b->branch[0] = tern_attr_graph(p->node, "then_branch");
		b->branch[1] = tern_attr_graph(p->node, "else_branch");
		fix_declared_outputs(p);
		b->fixed = p->fixed_outputs;
	}
	return rc;
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
		for (int64_t o = 0; o < outer; o++) {
			if (first->dtype != TERN_STRING) {
				memcpy((char *)dst->data + ((o * l->n + i) * inner) * es,
				       (const char *)src->data + o * inner * es, (size_t)inner * es);
				continue;
			}
			/* strings: each element its own copy */
			char **d = (char **)dst->data + (o * l->n + i) * inner;
			char *const *s = (char *const *)src->data + o * inner;
			for (int64_t k = 0; k < inner; k++)
				if (s[k] && !(d[k] = tern_strdup(s[k])))
					return tern_errorf(TERN_EOS, "out of memory");
		}
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

/* Bytes per element as stored: a string element is a char pointer. */
static size_t elem_bytes(int dtype)
{
	return dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(dtype);
}

/* Copies n elements into storage that owns its strings: strings are duplicated (replacing any there),
 * so that every tensor owns its own. */
static tern_status copy_elems(const tern_node *node, void *dst, const void *src, int64_t n, int dtype)
{
	if (dtype != TERN_STRING) {
		if (n > 0)
			memcpy(dst, src, (size_t)n * tern_dtype_size(dtype));
		return TERN_OK;
	}
	char **d = dst;
	char *const *s = src;
	for (int64_t i = 0; i < n; i++) {
		free(d[i]);
		if (!(d[i] = tern_strdup(s[i] ? s[i] : "")))
			return tern_node_errorf(node, TERN_EOS, "out of memory");
	}
	return TERN_OK;
}

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
	size_t es = elem_bytes(src->dtype);
	int64_t outer = tern_numel(axis, src->dims);
	int64_t inner = tern_numel(src->rank - axis - 1, src->dims + axis + 1);
	int64_t len = src->dims[axis];
	for (int64_t o = 0; o < outer && !rc; o++)
		rc = copy_elems(node, (char *)dst->data + o * inner * es,
		                (const char *)src->data + ((o * len + index) * inner) * es, inner, src->dtype);
	return rc;
}

/* A scan input must be a tensor whose elements can be sliced. */
static tern_status check_scan_input(const tern_node *node, const tern_tensor *x, int i, int min_rank)
{
	if (!x)
		return tern_node_errorf(node, TERN_EDATA, "scan input %d is missing", i);
	if (x->dtype != TERN_STRING && tern_dtype_size(x->dtype) == 0)
		return tern_node_errorf(node, TERN_EDATA, "scan input %d has unsupported type %s", i,
		                        tern_dtype_name(x->dtype));
	if (x->rank < min_rank)
		return tern_node_errorf(node, TERN_EDATA, "scan input %d has rank %d, below %d", i, x->rank, min_rank);
	return TERN_OK;
}

/* One scan's layout: n_state state values, m scan inputs stepped along axes[i] (backwards where
 * reverse[i]), n_out scan outputs. */
typedef struct scan_spec {
	int n_state, m, n_out;
	int *axes, *reverse;
} scan_spec;

/* Runs the body for len steps: state[0..n_state) holds the initial values and ends holding the
 * final ones; step t reads slice t (len - 1 - t when reversed) of each scan input xs[i]; each step's
 * scan outputs are appended to outs. */
static tern_status scan_steps(const tern_kernel_args *a, tern_graph *body, const scan_spec *s, tern_tensor *state,
                              tern_tensor *const *xs, int64_t len, tensor_list *outs)
{
	body_plan *b = a->params;
	int n_in = s->n_state + s->m;
	tern_status rc = TERN_OK;
	tern_tensor *slices = calloc((size_t)s->m + 1, sizeof *slices);
	tern_tensor *next = calloc((size_t)s->n_state + 1, sizeof *next);
	tern_tensor **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
	if (!slices || !next || !inputs) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	for (int64_t t = 0; t < len; t++) {
		for (int i = 0; i < s->m; i++) {
			tern_tensor_free(&slices[i]);
			if ((rc = take_slice(a->node, &slices[i], xs[i], s->axes[i], s->reverse[i] ? len - 1 - t : t)))
				goto done;
		}
		for (int i = 0; i < s->n_state; i++)
			inputs[i] = &state[i];
		for (int i = 0; i < s->m; i++)
			inputs[s->n_state + i] = &slices[i];
		if (!b->exec[0])
			rc = tern_exec_create(a->exec, body, inputs, n_in, a->pool, &b->exec[0]);
		if (!rc)
			rc = tern_exec_run(b->exec[0], inputs, n_in);
		if (rc)
			goto done;
		/* Body outputs may alias its inputs (an Identity of a state): take them all before the
		 * state is replaced. */
		for (int k = 0; k < s->n_out; k++)
			if ((rc = list_push(a->node, &outs[k], tern_exec_output(b->exec[0], s->n_state + k))))
				goto done;
		for (int i = 0; i < s->n_state; i++)
			if ((rc = copy_out(a->node, &next[i], tern_exec_output(b->exec[0], i))))
				goto done;
		for (int i = 0; i < s->n_state; i++) {
			tern_tensor_free(&state[i]);
			state[i] = next[i];
			memset(&next[i], 0, sizeof next[i]);
		}
	}
done:
	for (int i = 0; slices && i < s->m; i++)
		tern_tensor_free(&slices[i]);
	for (int i = 0; next && i < s->n_state; i++)
		tern_tensor_free(&next[i]);
	free(slices);
	free(next);
	free(inputs);
	return rc;
}

static tern_status scan_spec_alloc(scan_spec *s)
{
	s->axes = calloc((size_t)s->m + 1, sizeof *s->axes);
	s->reverse = calloc((size_t)s->m + 1, sizeof *s->reverse);
	return s->axes && s->reverse ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
}

static void scan_spec_free(scan_spec *s)
{
	free(s->axes);
	free(s->reverse);
}

/* Scan 9 and later: no batch axis, scan axes and directions per input and output. */
static tern_status scan_run(const tern_kernel_args *a)
{
	tern_graph *body = tern_attr_graph(a->node, "body");
	int m = (int)tern_attr_int(a->node, "num_scan_inputs", 0);
	scan_spec s = {a->n_in - m, m, a->n_out - (a->n_in - m), NULL, NULL};
	if (m < 1 || s.n_state < 0 || s.n_out < 0 || (int)body->n_inputs != a->n_in || (int)body->n_outputs != a->n_out)
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "inputs, outputs and num_scan_inputs=%d do not match the body", m);
	size_t n_axes, n_dirs, n_oaxes, n_odirs;
	const int64_t *in_axes = tern_attr_ints(a->node, "scan_input_axes", &n_axes);
	const int64_t *in_dirs = tern_attr_ints(a->node, "scan_input_directions", &n_dirs);
	const int64_t *out_axes = tern_attr_ints(a->node, "scan_output_axes", &n_oaxes);
	const int64_t *out_dirs = tern_attr_ints(a->node, "scan_output_directions", &n_odirs);
	tern_status rc = scan_spec_alloc(&s);
	int64_t len = -1;
	for (int i = 0; i < m && !rc; i++) {
		const tern_tensor *x = a->in[s.n_state + i];
		if ((rc = check_scan_input(a->node, x, i, 1)))
			break;
		int axis = in_axes && (size_t)i < n_axes ? (int)in_axes[i] : 0;
		if (axis < 0)
			axis += x->rank;
		if (axis < 0 || axis >= x->rank)
			rc = tern_node_errorf(a->node, TERN_EDATA, "scan input %d: axis out of range", i);
		else if (len >= 0 && x->dims[axis] != len)
			rc = tern_node_errorf(a->node, TERN_EDATA, "scan inputs differ in sequence length");
		else
			len = x->dims[axis];
		s.axes[i] = axis;
		s.reverse[i] = in_dirs && (size_t)i < n_dirs && in_dirs[i];
	}
	tern_tensor *state = rc ? NULL : calloc((size_t)s.n_state + 1, sizeof *state);
	tensor_list *outs = rc ? NULL : calloc((size_t)s.n_out + 1, sizeof *outs);
	if (!rc && (!state || !outs))
		rc = tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < s.n_state && !rc; i++)
		rc = a->in[i] ? copy_out(a->node, &state[i], a->in[i])
		              : tern_node_errorf(a->node, TERN_EDATA, "initial state %d is missing", i);
	if (!rc)
		rc = scan_steps(a, body, &s, state, a->in + s.n_state, len, outs);
	for (int i = 0; i < s.n_state && !rc; i++)
		if (a->out[i]) {
			*a->out[i] = state[i];
			memset(&state[i], 0, sizeof state[i]);
		}
	for (int k = 0; k < s.n_out && !rc; k++) {
		if (!a->out[s.n_state + k])
			continue;
		int axis = out_axes && (size_t)k < n_oaxes ? (int)out_axes[k] : 0;
		int reverse = out_dirs && (size_t)k < n_odirs && out_dirs[k];
		rc = stack(a->node, a->out[s.n_state + k], &outs[k], axis, reverse,
		           body->outputs[s.n_state + k]->type.dtype);
	}
	for (int i = 0; state && i < s.n_state; i++)
		tern_tensor_free(&state[i]);
	for (int k = 0; outs && k < s.n_out; k++)
		list_free(&outs[k]);
	free(state);
	free(outs);
	scan_spec_free(&s);
	return rc;
}

/* Output dst of a batched scan: [lead..., like's dims...] of like's type, allocated when the first
 * batch entry is placed (zeros, or empty strings, where no entry writes), and otherwise checked: every
 * entry's value must have the same shape. */
static tern_status batch_output(const tern_node *node, tern_tensor *dst, bool *placed, const tern_tensor *like,
                                int n_lead, const int64_t *lead, int which)
{
	int rank = n_lead + like->rank;
	if (rank > TERN_MAX_RANK)
		return tern_node_errorf(node, TERN_EDATA, "output %d would have rank %d, above %d", which, rank,
		                        TERN_MAX_RANK);
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, lead, (size_t)n_lead * sizeof *dims);
	memcpy(dims + n_lead, like->dims, (size_t)like->rank * sizeof *dims);
	if (*placed) {
		bool same = dst->dtype == like->dtype && dst->rank == rank;
		for (int d = 0; same && d < rank; d++)
			same = dst->dims[d] == dims[d];
		if (!same)
			return tern_node_errorf(node, TERN_EDATA,
			                        "output %d changes type or shape between batch entries", which);
		return TERN_OK;
	}
	tern_status rc = tern_tensor_alloc(dst, like->dtype, rank, dims);
	if (rc)
		return tern_node_errorf(node, rc, "%s", tern_error());
	*placed = true;
	char **s = dst->data;
	for (int64_t i = 0; like->dtype == TERN_STRING && i < tern_tensor_numel(dst); i++)
		if (!(s[i] = tern_strdup("")))
			return tern_node_errorf(node, TERN_EOS, "out of memory");
	return TERN_OK;
}

/* Scan 8: axis 0 of every state and scan input is the batch, which the body runs over one entry at a
 * time; axis 1 of the scan inputs is the sequence, of sequence_lens[b] steps for entry b (all of it
 * without that input). Scan outputs are [batch, max_sequence_length, ...], zero past an entry's
 * length as in onnxruntime (the spec leaves those values undefined). */
static tern_status scan8_run(const tern_kernel_args *a)
{
	tern_graph *body = tern_attr_graph(a->node, "body");
	int m = (int)tern_attr_int(a->node, "num_scan_inputs", 0);
	int n_state = a->n_in - 1 - m;
	scan_spec s = {n_state, m, a->n_out - n_state, NULL, NULL};
	if (m < 1 || n_state < 0 || s.n_out < 0 || (int)body->n_inputs != n_state + m ||
	    (int)body->n_outputs != a->n_out)
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "inputs, outputs and num_scan_inputs=%d do not match the body", m);
	const tern_tensor *lens = a->in[0];
	tern_tensor *const *init = a->in + 1, *const *scans = a->in + 1 + n_state;
	size_t n_dirs;
	const int64_t *dirs = tern_attr_ints(a->node, "directions", &n_dirs);
	if (tern_attr(a->node, "directions") && n_dirs != (size_t)m)
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "attribute 'directions' has %zu entries for %d scan inputs", n_dirs, m);
	tern_status rc = scan_spec_alloc(&s);
	int64_t batch = -1, max_len = -1;
	for (int i = 0; i < m && !rc; i++) {
		const tern_tensor *x = scans[i];
		if ((rc = check_scan_input(a->node, x, i, 2)))
			break;
		if ((batch >= 0 && x->dims[0] != batch) || (max_len >= 0 && x->dims[1] != max_len))
			rc = tern_node_errorf(a->node, TERN_EDATA,
			                      "scan inputs differ in batch size or sequence length");
		batch = x->dims[0];
		max_len = x->dims[1];
		s.axes[i] = 0; /* the sequence axis, once the batch entry is taken */
		s.reverse[i] = dirs && dirs[i];
		if (dirs && dirs[i] != 0 && dirs[i] != 1)
			rc = tern_node_errorf(a->node, TERN_EDATA,
			                      "attribute 'directions' entry %d is %lld, not 0 or 1", i,
			                      (long long)dirs[i]);
	}
	for (int i = 0; i < n_state && !rc; i++)
		if (!init[i] || init[i]->rank < 1 || init[i]->dims[0] != batch)
			rc = tern_node_errorf(a->node, TERN_EDATA, "initial state %d must be [%lld, ...], batch first",
			                      i, (long long)batch);
	if (!rc && lens) {
		if (lens->dtype != TERN_INT64 || lens->rank != 1 || lens->dims[0] != batch)
			rc = tern_node_errorf(a->node, TERN_EDATA, "input 0 'sequence_lens' must be int64[%lld]",
			                      (long long)batch);
		for (int64_t i = 0; !rc && i < batch; i++) {
			int64_t v = ((const int64_t *)lens->data)[i];
			if (v < 0 || v > max_len)
				rc = tern_node_errorf(a->node, TERN_EDATA,
				                      "input 0 'sequence_lens' element %lld is %lld, outside [0, %lld]",
				                      (long long)i, (long long)v, (long long)max_len);
		}
	}
	tern_tensor *state = rc ? NULL : calloc((size_t)n_state + (size_t)m + 1, sizeof *state);
	tern_tensor **xs = rc ? NULL : calloc((size_t)m + 1, sizeof *xs);
	tensor_list *outs = rc ? NULL : calloc((size_t)s.n_out + 1, sizeof *outs);
	bool *placed = rc ? NULL : calloc((size_t)a->n_out + 1, sizeof *placed);
	if (!rc && (!state || !xs || !outs || !placed))
		rc = tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < m && !rc; i++)
		xs[i] = &state[n_state + i];
	for (int64_t b = 0; b < batch && !rc; b++) {
		for (int i = 0; i < n_state + m; i++)
			tern_tensor_free(&state[i]);
		for (int i = 0; i < n_state && !rc; i++)
			rc = take_slice(a->node, &state[i], init[i], 0, b);
		for (int i = 0; i < m && !rc; i++)
			rc = take_slice(a->node, xs[i], scans[i], 0, b);
		if (!rc)
			rc = scan_steps(a, body, &s, state, xs, lens ? ((const int64_t *)lens->data)[b] : max_len,
			                outs);
		for (int i = 0; i < n_state && !rc; i++) {
			tern_tensor *y = a->out[i];
			int64_t per = tern_tensor_numel(&state[i]);
			if (y && !(rc = batch_output(a->node, y, &placed[i], &state[i], 1, &batch, i)))
				rc = copy_elems(a->node, (char *)y->data + (size_t)(b * per) * elem_bytes(y->dtype),
				                state[i].data, per, y->dtype);
		}
		for (int k = 0; k < s.n_out && !rc; k++) {
			tern_tensor *y = a->out[n_state + k];
			int64_t lead[2] = {batch, max_len};
			for (int64_t t = 0; y && t < outs[k].n && !rc; t++) {
				const tern_tensor *item = &outs[k].items[t];
				int64_t per = tern_tensor_numel(item);
				if (!(rc = batch_output(a->node, y, &placed[n_state + k], item, 2, lead, n_state + k)))
					rc = copy_elems(a->node,
					                (char *)y->data +
					                        (size_t)((b * max_len + t) * per) *
					                                elem_bytes(y->dtype),
					                item->data, per, y->dtype);
			}
			list_free(&outs[k]);
		}
	}
	/* Outputs no entry placed (no batch, or no step ran): their shape comes from what is known. */
	for (int o = 0; o < a->n_out && !rc; o++) {
		if (!a->out[o] || placed[o])
			continue;
		tern_tensor like = {0};
		int n_lead = o < n_state ? 0 : 2; /* a state's initial value has its batch axis already */
		int64_t lead[2] = {batch, max_len};
		const tern_type *ty = &body->outputs[o]->type;
		if (o < n_state) {
			like = *init[o];
		} else {
			like.dtype = ty->dtype ? ty->dtype : TERN_FLOAT;
			like.rank = ty->rank;
			for (int d = 0; d < ty->rank && d < TERN_MAX_RANK; d++)
				like.dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : batch * max_len == 0 ? 0 : -1;
			bool known = ty->rank >= 0;
			for (int d = 0; known && d < ty->rank; d++)
				known = like.dims[d] >= 0;
			if (!known)
				rc = tern_node_errorf(
				        a->node, TERN_EDATA,
				        "scan output %d: no step ran and the body does not declare its shape",
				        o - n_state);
		}
		if (!rc)
			rc = batch_output(a->node, a->out[o], &placed[o], &like, n_lead, lead, o);
	}
	for (int i = 0; state && i < n_state + m; i++)
		tern_tensor_free(&state[i]);
	for (int k = 0; outs && k < s.n_out; k++)
		list_free(&outs[k]);
	free(state);
	free(xs);
	free(outs);
	free(placed);
	scan_spec_free(&s);
	return rc;
}

static tern_status scan_prepare(tern_prepare_args *p)
{
	if (!tern_attr_graph(p->node, "body"))
		return tern_node_errorf(p->node, TERN_EDATA, "Scan needs a body graph");
	p->kernel = p->node->opset < 9 ? scan8_run : scan_run;
	return body_prepare(p);
}

/* ---------------------------------------------------------------- calls of model-local functions */

typedef struct call_params {
	const tern_graph *fn;
	int keep; /* tern.Invoke keep=1: the frame is kept and the last output is its handle */
	uint32_t fixed; /* the outputs of declared types (tern_prepare_args.fixed_outputs) */
	uint64_t free_len; /* the callee's inputs of any length (tern_function_len_free) */
} call_params;

static tern_status call_run(const tern_kernel_args *a)
{
	const call_params *cp = a->params;
	const tern_graph *fn = cp->fn;
	tern_exec *frame = NULL;
	if (!a->exec)
		return tern_node_errorf(a->node, TERN_EUSAGE, "a call of a function runs only in a plan, not one node at a time");
	int keep = cp->keep;
	int n_out = a->n_out - keep; /* a kept call's last output is its handle */
	tern_status rc = tern_call_begin(a->exec, a->node, fn, a->in, a->n_in, a->pool, keep, cp->free_len, &frame);
	for (int o = 0; !rc && o < n_out; o++)
		if (a->out[o])
			rc = take_out(a->node, a->out[o], frame, o, tern_mask_has(cp->fixed, o));
	if (frame && keep && !rc) {
		int64_t h = 0;
		if (!(rc = tern_call_keep(a->exec, frame, &h)) && a->out[n_out]) {
			if (tern_mask_has(cp->fixed, n_out) || !(rc = tern_tensor_alloc(a->out[n_out], TERN_INT64, 0, NULL)))
				*(int64_t *)a->out[n_out]->data = h;
			else
				rc = tern_node_errorf(a->node, rc, "%s", tern_error());
		}
	} else if (frame) {
		tern_call_end(a->exec, frame);
	}
	return rc;
}

/* The function a node calls: tern.Invoke's attributes name it, else the node's domain and type. */
const char *tern_node_callee(const tern_node *n, const char **domain)
{
	if (!strcmp(n->domain, "tern") && !strcmp(n->op_type, "Invoke")) {
		*domain = tern_attr_string(n, "function_domain", "");
		return tern_attr_string(n, "function", NULL);
	}
	*domain = n->domain;
	return n->op_type;
}

/* Whether calling `from` calls `target` on every path: through the calls of its body's own nodes,
 * not those in an If's or a Loop's branches. seen marks the functions searched already (each once). */
static bool always_calls(const tern_model *m, const tern_graph *from, const tern_graph *target, bool *seen)
{
	for (size_t i = 0; i < from->n_nodes; i++) {
		const tern_node *c = from->nodes[i];
		const char *domain, *name = c->removed ? NULL : tern_node_callee(c, &domain);
		const tern_graph *g = name ? tern_function_find(m, domain, name) : NULL;
		if (g == target && g)
			return true;
		for (size_t k = 0; g && k < m->n_functions; k++)
			if (m->functions[k] == g && !seen[k]) {
				seen[k] = true;
				if (always_calls(m, g, target, seen))
					return true;
			}
	}
	return false;
}

/* A node whose domain and type name a function, or tern.Invoke, whose attributes `function` and
 * `function_domain` do: the function is looked up now, and planned only when it is called, so that a
 * body may invoke its own function. A function that calls itself on every path, not under an If,
 * would recurse until the depth limit: refused when planning. */
static tern_status call_prepare(tern_prepare_args *p)
{
	const tern_node *n = p->node;
	const char *domain, *name = tern_node_callee(n, &domain);
	if (!name || !*name)
		return tern_node_errorf(n, TERN_EDATA, "tern.Invoke needs the string attribute 'function'");
	const tern_graph *fn = tern_function_find(n->graph->model, domain, name);
	if (!fn)
		return tern_node_errorf(n, TERN_EDATA, "invokes %s%s%s, which the model does not define", domain,
		                        *domain ? "." : "", name);
	if (fn->fproto->n_attribute)
		return tern_node_errorf(n, TERN_EDATA, "%s has attribute parameters, which tern's calls do not pass", name);
	if ((size_t)p->n_in != fn->n_inputs)
		return tern_node_errorf(n, TERN_EDATA, "%d inputs given; %s takes %zu", p->n_in, name, fn->n_inputs);
	int keep = tern_attr_int(n, "keep", 0) != 0;
	if ((size_t)(p->n_out - keep) > fn->n_outputs || p->n_out < keep)
		return tern_node_errorf(n, TERN_EDATA, "%d outputs asked for; %s returns %zu%s", p->n_out, name,
		                        fn->n_outputs, keep ? " (and the handle of a kept call)" : "");
	const tern_model *m = n->graph->model;
	bool *seen = calloc(m->n_functions + 1, sizeof *seen);
	if (!seen)
		return tern_errorf(TERN_EOS, "out of memory");
	bool endless = always_calls(m, fn, fn, seen);
	free(seen);
	if (endless)
		return tern_node_errorf(n, TERN_EDATA, "%s calls itself on every path, so its recursion never ends (put the "
		                        "call in an If branch)", name);
	call_params *cp = malloc(sizeof *cp);
	if (!cp)
		return tern_errorf(TERN_EOS, "out of memory");
	p->kernel = call_run;
	p->params = cp;
	p->free_params = free;
	p->dynamic_output = 1;
	fix_declared_outputs(p); /* a kept call's handle too: declared_type knows it */
	*cp = (call_params){fn, keep, p->fixed_outputs, tern_function_len_free(fn)};
	return TERN_OK;
}

const tern_op tern_op_function_call = {"", "(function call)", 1, 0, call_prepare, 0, "control"};

bool tern_fwd_base(const char *name, char *base, size_t cap)
{
	size_t len = name ? strlen(name) : 0;
	if (len < 5 || len - 5 >= cap || strcmp(name + len - 5, "__fwd") != 0)
		return false;
	memcpy(base, name, len - 5);
	base[len - 5] = 0;
	return true;
}

int tern_node_kept_handle(const tern_node *n)
{
	if (!n->n_outputs)
		return -1;
	if (!strcmp(n->domain, "tern") && !strcmp(n->op_type, "Invoke"))
		return tern_attr_int(n, "keep", 0) ? (int)n->n_outputs - 1 : -1;
	if (!*n->domain && !strcmp(n->op_type, "If") && tern_node_keeps_calls(n))
		return (int)n->n_outputs - 1;
	return -1;
}

bool tern_node_keeps_calls(const tern_node *n)
{
	if (!strcmp(n->domain, "tern") && !strcmp(n->op_type, "Invoke"))
		return tern_attr_int(n, "keep", 0) != 0;
	for (size_t k = 0; k < n->n_subgraphs; k++)
		for (size_t i = 0; i < n->subgraphs[k]->n_nodes; i++)
			if (!n->subgraphs[k]->nodes[i]->removed && tern_node_keeps_calls(n->subgraphs[k]->nodes[i]))
				return true;
	return false;
}

/* ---------------------------------------------------------------- gradients of kept calls */

/* The frame a handle names (an int64 scalar from a kept call of this run). */
static tern_status kept_frame(const tern_kernel_args *a, tern_exec **frame)
{
	*frame = NULL;
	if (!a->exec)
		return tern_node_errorf(a->node, TERN_EUSAGE, "%s runs only in a plan", a->node->op_type);
	const tern_tensor *h = a->in[0];
	if (!h || h->dtype != TERN_INT64 || tern_tensor_numel(h) != 1)
		return tern_node_errorf(a->node, TERN_EDATA, "input 0 is not the int64 handle of a kept call");
	if (!(*frame = tern_call_kept(a->exec, *(const int64_t *)h->data)))
		return tern_node_errorf(a->node, TERN_EDATA,
		                        "handle %lld names no call kept in this run (a handle from another run?)",
		                        (long long)*(const int64_t *)h->data);
	return TERN_OK;
}

/* tern.Saved <value = NAME> (handle) -> v: the value NAME of the kept call's frame, read in place. */
typedef struct saved_params {
	char *name; /* the attribute's (tern_attr_string's buffer does not last) */
	const tern_graph *graph; /* the function last looked in, and where NAME is there */
	int slot;
	bool shaped; /* the output's type was fixed when planning (tern_prepare_args.shaped_outputs) */
} saved_params;

static void free_saved(void *p)
{
	saved_params *sp = p;
	free(sp->name);
	free(sp);
}

static tern_status saved_run(const tern_kernel_args *a)
{
	saved_params *sp = a->params;
	tern_exec *frame;
	tern_status rc = kept_frame(a, &frame);
	if (rc)
		return rc;
	const char *name = sp->name;
	if (tern_exec_graph(frame) != sp->graph) {
		sp->graph = tern_exec_graph(frame);
		sp->slot = tern_exec_slot_of(frame, name);
	}
	const tern_tensor *v = tern_exec_slot_tensor(frame, sp->slot);
	if (!v || (!v->data && v->nbytes))
		return tern_node_errorf(a->node, TERN_EDATA, "the kept call has no value '%s'", name);
	tern_tensor *y = a->out[0];
	if (!y)
		return TERN_OK;
	if (sp->shaped && (rc = check_planned(a->node, v, y, "the plan expects", "the kept call's '%s'", name)))
		return rc;
	if (!tern_dtype_plain(v->dtype))
		return copy_out(a->node, y, v);
	tern_set_shape(y, v->dtype, v->rank, v->dims);
	y->data = v->data;
	y->nbytes = v->nbytes;
	y->owns_data = 0;
	return TERN_OK;
}

static tern_status saved_prepare(tern_prepare_args *p)
{
	if (p->n_in != 1 || p->n_out != 1 || !*tern_attr_string(p->node, "value", ""))
		return tern_node_errorf(p->node, TERN_EDATA, "tern.Saved takes a handle, a string attribute 'value' and "
		                        "gives one output");
	saved_params *sp = calloc(1, sizeof *sp);
	if (!sp)
		return tern_errorf(TERN_EOS, "out of memory");
	sp->slot = -1;
	if (!(sp->name = tern_strdup(tern_attr_string(p->node, "value", "")))) {
		free(sp);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	p->params = sp;
	p->free_params = free_saved;
	p->kernel = saved_run;
	p->dynamic_output = 1;
	/* Planned for the call whose handle it is given: the value's type in that call's frame, when
	 * the frame's plan fixes it, is its type in every frame of that function planned for the same
	 * inputs, which is what the gradient function's plan is for (its first inputs are the
	 * function's). The nodes that read it are then planned ahead, not when they run. */
	const tern_tensor *h = p->exec ? tern_exec_planning_input(p->exec, p->in[0]) : NULL;
	tern_exec *frame = h && h->dtype == TERN_INT64 && h->rank == 0 && h->data
	                           ? tern_call_kept(p->exec, *(const int64_t *)h->data)
	                           : NULL;
	int slot = frame ? tern_exec_slot_of(frame, sp->name) : -1;
	if (frame && p->out[0] && tern_exec_slot_static(frame, slot)) {
		const tern_tensor *v = tern_exec_slot_tensor(frame, slot);
		tern_set_shape(p->out[0], v->dtype, v->rank, v->dims);
		p->shaped_outputs = 1;
		sp->shaped = true;
		sp->graph = tern_exec_graph(frame);
		sp->slot = slot;
	}
	return TERN_OK;
}

/* tern.Backward <wrt = [NAME...]> (handle, dy1, ..., dym) -> (d1, ..., dk): runs the gradient function
 * of the kept call's function (F__fwd's is F__grad: its inputs are F__fwd's, then the handle, then
 * the gradients of its outputs; its outputs the gradients of its inputs, in order) and gives the
 * gradients of the inputs named by wrt. A name the function does not take (the other branch of an If
 * reads it) gets a zero scalar, which sums as zero with the gradients of the same value. */
#define BACKWARD_CACHE 4
typedef struct backward_params {
	struct {
		const tern_graph *fwd, *grad;
		int *pick; /* per wrt name: the gradient function's output, or -1 */
		uint64_t free_len; /* grad's inputs of any length (tern_function_len_free) */
	} cache[BACKWARD_CACHE];
	int n_cache, next;
} backward_params;

static void free_backward(void *p)
{
	backward_params *b = p;
	for (int i = 0; i < b->n_cache; i++)
		free(b->cache[i].pick);
	free(b);
}

static tern_status backward_resolve(const tern_kernel_args *a, backward_params *b, const tern_graph *fwd, int *at)
{
	for (int i = 0; i < b->n_cache; i++)
		if (b->cache[i].fwd == fwd) {
			*at = i;
			return TERN_OK;
		}
	const char *name = fwd->fproto ? fwd->fproto->name : NULL;
	char gname[512];
	if (!tern_fwd_base(name, gname, sizeof gname - 6))
		return tern_node_errorf(a->node, TERN_EDATA, "the kept call ran %s, which has no gradient function (F__fwd's "
		                        "is F__grad)", name ? name : "?");
	strcat(gname, "__grad");
	const tern_graph *grad = tern_function_find(fwd->model, fwd->fproto->domain, gname);
	if (!grad)
		return tern_node_errorf(a->node, TERN_EDATA, "the model has no function %s", gname);
	if (grad->n_inputs != fwd->n_inputs + 1 + fwd->n_outputs || grad->n_outputs != fwd->n_inputs)
		return tern_node_errorf(a->node, TERN_EDATA, "%s takes %zu inputs and returns %zu; %s's gradient takes %zu "
		                        "and returns %zu", gname, grad->n_inputs, grad->n_outputs, name,
		                        fwd->n_inputs + 1 + fwd->n_outputs, fwd->n_inputs);
	int slot = b->n_cache < BACKWARD_CACHE ? b->n_cache++ : b->next++ % BACKWARD_CACHE;
	free(b->cache[slot].pick);
	b->cache[slot].fwd = NULL;
	size_t n_wrt = 0;
	const Onnx__AttributeProto *w = tern_attr(a->node, "wrt");
	n_wrt = w ? w->n_strings : 0;
	int *pick = malloc((n_wrt + 1) * sizeof *pick);
	if (!pick)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t k = 0; k < n_wrt; k++) {
		pick[k] = -1;
		for (size_t i = 0; i < fwd->n_inputs; i++)
			if (strlen(fwd->inputs[i]->name) == w->strings[k].len &&
			    !memcmp(fwd->inputs[i]->name, w->strings[k].data, w->strings[k].len))
				pick[k] = (int)i;
	}
	b->cache[slot].fwd = fwd;
	b->cache[slot].grad = grad;
	b->cache[slot].pick = pick;
	b->cache[slot].free_len = tern_function_len_free(grad);
	*at = slot;
	return TERN_OK;
}

/* Gradient sinks. A weight reaches every call of a recursion unchanged, so each call's backward pass
 * would return a dense gradient of it, summed with its siblings' in its caller, level after level up
 * the tree. Instead, the outermost tern.Backward (one that runs in no other's backward pass) makes a
 * sink for each float input of its call that it gives a gradient of; a tern.Backward within its
 * backward pass whose call took that same value (the same bytes, type and shape: the value itself,
 * not a copy) adds the gradient of it into the sink and gives a zero scalar, which sums as zero with
 * the gradients of the same value where its caller sums them; the outermost adds the sink to what its
 * own call gave. Each call's own part is added once, in any order (float sums may differ in the last
 * bits from the sum level by level). */
struct tern_grad_sinks {
	pthread_mutex_t lock;
	int n;
	struct grad_sink {
		tern_tensor x; /* the value: its bytes, type and shape (not owned) */
		tern_tensor acc; /* the gradients added so far (no bytes until the first) */
	} *sink;
};

static struct grad_sink *sink_of(tern_grad_sinks *g, const tern_tensor *x)
{
	for (int i = 0; g && x && i < g->n; i++)
		if (g->sink[i].x.data == x->data && tern_pass_same_shape(&g->sink[i].x, x))
			return &g->sink[i];
	return NULL;
}

/* acc (n floats) += d, a tensor of n floats or a scalar. */
static void add_into(float *acc, int64_t n, const tern_tensor *d)
{
	const float *x = d->data;
	if (d->rank == 0) {
		if (x[0] != 0)
			for (int64_t i = 0; i < n; i++)
				acc[i] += x[0];
		return;
	}
	for (int64_t i = 0; i < n; i++)
		acc[i] += x[i];
}

/* Adds gradient d (of the sink's shape, or a scalar) into sink s. */
static tern_status sink_add(tern_grad_sinks *g, struct grad_sink *s, const tern_tensor *d)
{
	pthread_mutex_lock(&g->lock);
	tern_status rc = s->acc.data ? TERN_OK : tern_tensor_alloc(&s->acc, TERN_FLOAT, s->x.rank, s->x.dims); /* zeroed */
	if (!rc)
		add_into(s->acc.data, tern_tensor_numel(&s->acc), d);
	pthread_mutex_unlock(&g->lock);
	return rc ? tern_errorf(rc, "%s", tern_error()) : TERN_OK;
}

/* Whether gradient d of value x goes to a sink (then its own output is a zero scalar). */
static struct grad_sink *sink_for(tern_grad_sinks *g, const tern_tensor *x, const tern_tensor *d)
{
	struct grad_sink *s = sink_of(g, x);
	if (!s || d->dtype != TERN_FLOAT || !d->data)
		return NULL;
	return d->rank == 0 || tern_pass_same_shape(d, &s->x) ? s : NULL;
}

/* A gradient that is zero: a float scalar read from constant bytes (nothing to allocate or free). */
static void zero_scalar(tern_tensor *t)
{
	static const float zero = 0;
	char *name = t->name;
	t->name = NULL;
	tern_tensor_free(t);
	t->name = name;
	tern_set_shape(t, TERN_FLOAT, 0, NULL);
	t->data = (void *)&zero;
	t->nbytes = sizeof zero;
	t->owns_data = 0;
}

/* The outermost tern.Backward's sinks: one for each float input of the call it gives a gradient of. */
static tern_status sinks_make(tern_grad_sinks *g, const backward_params *b, int at, tern_exec *frame, int n_out)
{
	memset(g, 0, sizeof *g);
	if (!(g->sink = calloc((size_t)n_out + 1, sizeof *g->sink)))
		return tern_errorf(TERN_EOS, "out of memory");
	pthread_mutex_init(&g->lock, NULL);
	for (int k = 0; k < n_out; k++) {
		int j = b->cache[at].pick[k];
		const tern_tensor *x = j >= 0 ? tern_exec_input(frame, j) : NULL;
		if (!x || x->dtype != TERN_FLOAT || !x->data || !x->nbytes || sink_of(g, x))
			continue;
		struct grad_sink *s = &g->sink[g->n++];
		tern_set_shape(&s->x, x->dtype, x->rank, x->dims);
		s->x.data = x->data;
	}
	return TERN_OK;
}

static void sinks_free(tern_grad_sinks *g)
{
	for (int i = 0; i < g->n; i++)
		tern_tensor_free(&g->sink[i].acc);
	free(g->sink);
	pthread_mutex_destroy(&g->lock);
}

/* The outermost tern.Backward's output y (the gradient of x its call gave): plus x's sink. */
static tern_status sink_finish(const tern_node *node, tern_grad_sinks *g, const tern_tensor *x, tern_tensor *y)
{
	struct grad_sink *s = sink_of(g, x);
	if (!s || !s->acc.data)
		return TERN_OK;
	if (tern_pass_same_shape(y, &s->x)) {
		add_into(y->data, tern_tensor_numel(y), &s->acc);
		return TERN_OK;
	}
	if (y->dtype != TERN_FLOAT || y->rank != 0)
		return tern_node_errorf(node, TERN_EINTERNAL, "a gradient of neither its value's shape nor a scalar");
	/* the sink is the result, plus the scalar */
	tern_tensor v = *y;
	char *name = y->name;
	*y = s->acc;
	y->name = name;
	memset(&s->acc, 0, sizeof s->acc);
	add_into(y->data, tern_tensor_numel(y), &v);
	v.name = NULL;
	tern_tensor_free(&v);
	return TERN_OK;
}

static tern_status backward_run(const tern_kernel_args *a)
{
	backward_params *b = a->params;
	tern_exec *frame;
	tern_status rc = kept_frame(a, &frame);
	int at = 0;
	if (!rc)
		rc = backward_resolve(a, b, tern_exec_graph(frame), &at);
	if (rc)
		return rc;
	const tern_graph *fwd = b->cache[at].fwd, *grad = b->cache[at].grad;
	int nx = (int)fwd->n_inputs, ny = (int)fwd->n_outputs;
	if (a->n_in - 1 > ny)
		return tern_node_errorf(a->node, TERN_EDATA, "%d output gradients given; the call has %d outputs", a->n_in - 1,
		                        ny);
	tern_tensor *in_small[64], **in = nx + 1 + ny <= 64 ? in_small : malloc((size_t)(nx + 1 + ny) * sizeof *in);
	tern_tensor zeros_small[16], *zeros = ny <= 16 ? zeros_small : calloc((size_t)ny, sizeof *zeros);
	if (!in || !zeros) {
		if (in != in_small)
			free(in);
		if (zeros != zeros_small)
			free(zeros);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	memset(zeros, 0, (size_t)ny * sizeof *zeros);
	for (int i = 0; i < nx; i++)
		in[i] = tern_exec_input(frame, i);
	in[nx] = a->in[0];
	for (int o = 0; o < ny && !rc; o++) {
		tern_tensor *dy = o + 1 < a->n_in ? a->in[o + 1] : NULL;
		if (!dy) {
			/* no gradient flows into this output: zeros of its shape */
			const tern_tensor *y = tern_exec_output(frame, o);
			if ((rc = tern_tensor_alloc(&zeros[o], y->dtype, y->rank, y->dims)))
				rc = tern_node_errorf(a->node, rc, "%s", tern_error());
			else if (zeros[o].nbytes)
				memset(zeros[o].data, 0, zeros[o].nbytes);
			dy = &zeros[o];
		}
		in[nx + 1 + o] = dy;
	}
	tern_grad_sinks *sinks = tern_exec_sinks(a->exec), own;
	bool outermost = !sinks;
	if (!rc && outermost && !(rc = sinks_make(&own, b, at, frame, a->n_out)))
		sinks = &own;
	tern_exec *gf = NULL;
	if (!rc)
		rc = tern_call_begin_sinks(a->exec, a->node, grad, in, nx + 1 + ny, a->pool, b->cache[at].free_len, sinks,
		                           &gf);
	for (int k = 0; !rc && k < a->n_out; k++) {
		if (!a->out[k])
			continue;
		int j = b->cache[at].pick[k];
		struct grad_sink *s = j >= 0 && !outermost ? sink_for(sinks, in[j], tern_exec_output(gf, j)) : NULL;
		if (s) {
			if (!(rc = sink_add(sinks, s, tern_exec_output(gf, j))))
				zero_scalar(a->out[k]);
		} else if (j >= 0) {
			if (!(rc = take_out(a->node, a->out[k], gf, j, false)) && outermost)
				rc = sink_finish(a->node, sinks, in[j], a->out[k]);
		} else {
			zero_scalar(a->out[k]);
		}
	}
	if (gf)
		tern_call_end(a->exec, gf);
	if (outermost && sinks)
		sinks_free(sinks);
	for (int o = 0; o < ny; o++)
		tern_tensor_free(&zeros[o]);
	if (in != in_small)
		free(in);
	if (zeros != zeros_small)
		free(zeros);
	return rc;
}

static tern_status backward_prepare(tern_prepare_args *p)
{
	const Onnx__AttributeProto *w = tern_attr(p->node, "wrt");
	if (p->n_in < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "tern.Backward takes the handle of a kept call first");
	if ((size_t)p->n_out > (w ? w->n_strings : 0))
		return tern_node_errorf(p->node, TERN_EDATA, "%d outputs, %zu names in 'wrt'", p->n_out,
		                        w ? w->n_strings : 0);
	backward_params *b = calloc(1, sizeof *b);
	if (!b)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = b;
	p->free_params = free_backward;
	p->kernel = backward_run;
	p->dynamic_output = 1;
	return TERN_OK;
}

bool tern_op_calls_function(const tern_op *op)
{
	return op && (op->prepare == call_prepare || op->prepare == backward_prepare);
}

static const tern_op ops[] = {
        {"", "If", 1, 0, if_prepare, 0, "control"},
        {"tern", "Invoke", 1, 0, call_prepare, 0, "control"},
        {"tern", "Saved", 1, 0, saved_prepare, 0, "control"},
        {"tern", "Backward", 1, 0, backward_prepare, 0, "control"},
        {"", "Loop", 1, 0, loop_prepare, 0, "control"},
        {"", "Scan", 8, 0, scan_prepare, 0, "control"},
};

const tern_op_table tern_ops_control = {ops, TERN_ARRAY_LEN(ops)};
