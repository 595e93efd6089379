/* sequence.c — ONNX's sequence and optional operators. A sequence is a value of its own kind
 * (TERN_SEQUENCE: a tern_sequence that owns deep copies of its tensors); an empty optional is
 * TERN_NONE, a full one is the value it holds. Every kernel here allocates its outputs (their shapes
 * depend on values), so the planner treats them as dynamic and prepares their readers at run time. */
#include "ops/ops_common.h"

#include <stdlib.h>

static tern_status need_sequence(const tern_kernel_args *a, int i, tern_sequence **out)
{
	*out = i < a->n_in && a->in[i] ? tern_sequence_of(a->in[i]) : NULL;
	if (!*out)
		return tern_node_errorf(a->node, TERN_EDATA, "input %d is %s%s, not a sequence", i,
		                        !(i < a->n_in && a->in[i])         ? "missing"
		                        : a->in[i]->dtype == TERN_NONE      ? "an empty optional"
		                                                            : "a tensor of ",
		                        i < a->n_in && a->in[i] && a->in[i]->dtype != TERN_NONE
		                                ? tern_dtype_name(a->in[i]->dtype)
		                                : "");
	return TERN_OK;
}

/* A position input (a scalar of int32 or int64), -1 when absent; checked against [-n, n + extra). */
static tern_status position(const tern_kernel_args *a, int i, size_t n, int extra, int64_t dflt, int64_t *out)
{
	*out = dflt;
	if (i >= a->n_in || !a->in[i])
		return TERN_OK;
	const tern_tensor *t = a->in[i];
	if ((t->dtype != TERN_INT64 && t->dtype != TERN_INT32) || tern_tensor_numel(t) != 1)
		return tern_node_errorf(a->node, TERN_EDATA, "the position must be one int32 or int64, not %s",
		                        tern_dtype_name(t->dtype));
	int64_t p = tern_tensor_get_i64(t, 0);
	if (p < -(int64_t)n || p >= (int64_t)n + extra)
		return tern_node_errorf(a->node, TERN_EDATA, "position %lld is outside a sequence of %zu", (long long)p, n);
	*out = p < 0 ? p + (int64_t)n : p;
	return TERN_OK;
}

static tern_status dynamic(tern_prepare_args *p, tern_kernel_fn kernel)
{
	p->dynamic_output = 1;
	p->kernel = kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- building and reading sequences */

static tern_status sequence_empty_kernel(const tern_kernel_args *a)
{
	return tern_sequence_new(a->out[0], (int)tern_attr_int(a->node, "dtype", TERN_FLOAT));
}

static tern_status sequence_empty_prepare(tern_prepare_args *p)
{
	int64_t dt = tern_attr_int(p->node, "dtype", TERN_FLOAT);
	if (dt <= 0 || dt >= TERN_DTYPE_COUNT)
		return tern_node_errorf(p->node, TERN_EDATA, "dtype %lld is not an element type", (long long)dt);
	return dynamic(p, sequence_empty_kernel);
}

static tern_status sequence_construct_kernel(const tern_kernel_args *a)
{
	tern_status st = tern_sequence_new(a->out[0], a->n_in && a->in[0] ? a->in[0]->dtype : TERN_UNDEFINED);
	for (int i = 0; i < a->n_in && !st; i++) {
		if (!a->in[i])
			return tern_node_errorf(a->node, TERN_EDATA, "input %d is missing", i);
		st = tern_sequence_insert(a->out[0], a->in[i], -1);
	}
	return st ? tern_node_errorf(a->node, st, "%s", tern_error()) : TERN_OK;
}

static tern_status sequence_construct_prepare(tern_prepare_args *p)
{
	if (p->n_in < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "SequenceConstruct needs at least one tensor");
	for (int i = 1; i < p->n_in; i++)
		if (p->in[i] && p->in[0] && p->in[i]->dtype != p->in[0]->dtype)
			return tern_node_errorf(p->node, TERN_EDATA, "input %d is %s, input 0 %s: a sequence has one element type",
			                        i, tern_dtype_name(p->in[i]->dtype), tern_dtype_name(p->in[0]->dtype));
	return dynamic(p, sequence_construct_kernel);
}

static tern_status sequence_at_kernel(const tern_kernel_args *a)
{
	tern_sequence *q;
	int64_t pos;
	tern_status st = need_sequence(a, 0, &q);
	if (!st)
		st = position(a, 1, q->n, 0, 0, &pos);
	if (!st && (!a->in[1] || q->n == 0))
		st = tern_node_errorf(a->node, TERN_EDATA, "SequenceAt needs a position in a non-empty sequence");
	if (!st)
		st = tern_tensor_copy(a->out[0], &q->items[pos]);
	return st;
}

static tern_status sequence_insert_kernel(const tern_kernel_args *a)
{
	tern_sequence *q;
	int64_t pos;
	tern_status st = need_sequence(a, 0, &q);
	if (!st)
		st = position(a, 2, q->n, 1, -1, &pos);
	if (!st && (a->n_in < 2 || !a->in[1]))
		st = tern_node_errorf(a->node, TERN_EDATA, "SequenceInsert needs a tensor to insert");
	if (!st)
		st = tern_tensor_copy(a->out[0], a->in[0]);
	if (!st && (st = tern_sequence_insert(a->out[0], a->in[1], pos)))
		st = tern_node_errorf(a->node, st, "%s", tern_error());
	return st;
}

static tern_status sequence_erase_kernel(const tern_kernel_args *a)
{
	tern_sequence *q;
	int64_t pos;
	tern_status st = need_sequence(a, 0, &q);
	if (!st && q->n == 0)
		st = tern_node_errorf(a->node, TERN_EDATA, "SequenceErase on an empty sequence");
	if (!st)
		st = position(a, 1, q->n, 0, (int64_t)q->n - 1, &pos);
	if (!st)
		st = tern_sequence_new(a->out[0], q->elem_dtype);
	for (size_t i = 0; !st && i < q->n; i++)
		if ((int64_t)i != pos)
			st = tern_sequence_insert(a->out[0], &q->items[i], -1);
	return st;
}

static tern_status sequence_length_kernel(const tern_kernel_args *a)
{
	tern_sequence *q;
	tern_status st = need_sequence(a, 0, &q);
	if (!st)
		st = tern_tensor_alloc(a->out[0], TERN_INT64, 0, NULL);
	if (!st)
		*(int64_t *)a->out[0]->data = (int64_t)q->n;
	return st;
}

#define SEQUENCE_PREPARE(name)                                      \
	static tern_status name##_prepare(tern_prepare_args *p)     \
	{                                                           \
		return dynamic(p, name##_kernel);                   \
	}
SEQUENCE_PREPARE(sequence_at)
SEQUENCE_PREPARE(sequence_insert)
SEQUENCE_PREPARE(sequence_erase)
SEQUENCE_PREPARE(sequence_length)

/* ---------------------------------------------------------------- splitting and concatenating */

static size_t elem_bytes(int dtype)
{
	return dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(dtype);
}

/* Copies rows [from, from + count) along axis of x into y (whose axis has count rows). */
static tern_status copy_rows(const tern_tensor *x, int axis, int64_t from, int64_t count, tern_tensor *y)
{
	int64_t outer = tern_numel(axis, x->dims), inner = tern_numel(x->rank - axis - 1, x->dims + axis + 1);
	size_t es = elem_bytes(x->dtype);
	for (int64_t o = 0; o < outer; o++) {
		const char *src = (const char *)x->data + ((size_t)(o * x->dims[axis] + from) * (size_t)inner) * es;
		char *dst = (char *)y->data + ((size_t)(o * count) * (size_t)inner) * es;
		if (x->dtype != TERN_STRING) {
			memcpy(dst, src, (size_t)(count * inner) * es);
			continue;
		}
		for (int64_t k = 0; k < count * inner; k++) {
			const char *s = ((char *const *)src)[k];
			if (s && !(((char **)dst)[k] = tern_strdup(s)))
				return tern_errorf(TERN_EOS, "out of memory");
		}
	}
	return TERN_OK;
}

static tern_status split_to_sequence_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	const tern_tensor *split = a->n_in > 1 ? a->in[1] : NULL;
	int64_t axis = tern_attr_int(a->node, "axis", 0);
	int keepdims = (int)tern_attr_int(a->node, "keepdims", 1);
	if (axis < -x->rank || axis >= x->rank)
		return tern_node_errorf(a->node, TERN_EDATA, "axis %lld is outside rank %d", (long long)axis, x->rank);
	if (axis < 0)
		axis += x->rank;
	int64_t len = x->dims[axis];
	int64_t sizes_buf[64], *sizes = sizes_buf, n = 0;
	bool drop_axis = false;
	if (!split) {
		n = len;
		drop_axis = !keepdims;
	} else if (tern_tensor_numel(split) == 1 && split->rank == 0) {
		int64_t chunk = tern_tensor_get_i64(split, 0);
		if (chunk <= 0)
			return tern_node_errorf(a->node, TERN_EDATA, "split %lld is not positive", (long long)chunk);
		n = (len + chunk - 1) / chunk;
	} else {
		n = tern_tensor_numel(split);
	}
	if (n > 64 && !(sizes = malloc((size_t)n * sizeof *sizes)))
		return tern_errorf(TERN_EOS, "out of memory");
	int64_t total = 0;
	for (int64_t i = 0; i < n; i++) {
		if (!split)
			sizes[i] = 1;
		else if (split->rank == 0)
			sizes[i] = i + 1 < n ? tern_tensor_get_i64(split, 0) : len - total;
		else
			sizes[i] = tern_tensor_get_i64(split, i);
		if (sizes[i] < 0)
			total = -1;
		if (total < 0)
			break;
		total += sizes[i];
	}
	tern_status st = TERN_OK;
	if (total != len)
		st = tern_node_errorf(a->node, TERN_EDATA, "the split sizes add up to %lld, axis %lld has %lld", (long long)total,
		                      (long long)axis, (long long)len);
	if (!st)
		st = tern_sequence_new(a->out[0], x->dtype);
	for (int64_t i = 0, at = 0; !st && i < n; at += sizes[i], i++) {
		tern_tensor piece = {0};
		int64_t dims[TERN_MAX_RANK];
		memcpy(dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
		dims[axis] = sizes[i];
		st = tern_tensor_alloc(&piece, x->dtype, x->rank, dims);
		if (!st)
			st = copy_rows(x, (int)axis, at, sizes[i], &piece);
		if (!st && drop_axis) {
			memmove(&piece.dims[axis], &piece.dims[axis + 1], sizeof(int64_t) * (size_t)(x->rank - axis - 1));
			piece.rank--;
		}
		if (!st)
			st = tern_sequence_insert(a->out[0], &piece, -1);
		tern_tensor_free(&piece);
	}
	if (sizes != sizes_buf)
		free(sizes);
	return st;
}

static tern_status split_to_sequence_prepare(tern_prepare_args *p)
{
	if (p->in[0]->dtype == TERN_SEQUENCE || p->in[0]->dtype == TERN_NONE || p->in[0]->rank < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "SplitToSequence splits a tensor of rank 1 or more");
	return dynamic(p, split_to_sequence_kernel);
}

static tern_status concat_from_sequence_kernel(const tern_kernel_args *a)
{
	tern_sequence *q;
	tern_status st = need_sequence(a, 0, &q);
	if (st)
		return st;
	if (q->n == 0)
		return tern_node_errorf(a->node, TERN_EDATA, "ConcatFromSequence of an empty sequence");
	int new_axis = (int)tern_attr_int(a->node, "new_axis", 0);
	const tern_tensor *first = &q->items[0];
	int out_rank = first->rank + (new_axis != 0);
	int64_t axis = tern_attr_int(a->node, "axis", 0);
	if (axis < -out_rank || axis >= out_rank)
		return tern_node_errorf(a->node, TERN_EDATA, "axis %lld is outside rank %d", (long long)axis, out_rank);
	if (axis < 0)
		axis += out_rank;
	/* With new_axis each tensor is one row along a new axis at `axis`. */
	int64_t dims[TERN_MAX_RANK];
	int64_t rows = 0;
	for (size_t i = 0; i < q->n; i++) {
		const tern_tensor *t = &q->items[i];
		bool same = t->rank == first->rank;
		for (int d = 0; same && d < t->rank; d++)
			same = d == (new_axis ? -1 : axis) || t->dims[d] == first->dims[d];
		if (!same)
			return tern_node_errorf(a->node, TERN_EDATA, "tensor %zu of the sequence does not match tensor 0 "
			                        "off axis %lld", i, (long long)axis);
		rows += new_axis ? 1 : t->dims[axis];
	}
	for (int d = 0; d < out_rank; d++)
		dims[d] = d == axis ? rows : first->dims[new_axis && d > axis ? d - 1 : d];
	st = tern_tensor_alloc(a->out[0], first->dtype, out_rank, dims);
	if (st)
		return st;
	int64_t outer = tern_numel((int)axis, dims), inner = tern_numel(out_rank - (int)axis - 1, dims + axis + 1);
	size_t es = elem_bytes(first->dtype);
	int64_t at = 0;
	for (size_t i = 0; i < q->n; i++) {
		const tern_tensor *t = &q->items[i];
		int64_t r = new_axis ? 1 : t->dims[axis];
		for (int64_t o = 0; o < outer; o++) {
			const char *src = (const char *)t->data + (size_t)(o * r * inner) * es;
			char *dst = (char *)a->out[0]->data + (size_t)((o * rows + at) * inner) * es;
			if (first->dtype != TERN_STRING) {
				memcpy(dst, src, (size_t)(r * inner) * es);
				continue;
			}
			for (int64_t k = 0; k < r * inner; k++) {
				const char *s = ((char *const *)src)[k];
				if (s && !(((char **)dst)[k] = tern_strdup(s)))
					return tern_errorf(TERN_EOS, "out of memory");
			}
		}
		at += r;
	}
	return TERN_OK;
}
SEQUENCE_PREPARE(concat_from_sequence)

/* ---------------------------------------------------------------- optionals */

static bool present(const tern_kernel_args *a, int i)
{
	return i < a->n_in && a->in[i] && a->in[i]->dtype != TERN_NONE;
}

static tern_status optional_kernel(const tern_kernel_args *a)
{
	if (!present(a, 0)) {
		memset(a->out[0], 0, sizeof *a->out[0]);
		a->out[0]->dtype = TERN_NONE;
		return TERN_OK;
	}
	return tern_tensor_copy(a->out[0], a->in[0]);
}

static tern_status optional_prepare(tern_prepare_args *p)
{
	if ((p->n_in < 1 || !p->in[0]) && !tern_attr(p->node, "type"))
		return tern_node_errorf(p->node, TERN_EDATA, "an Optional without an input needs its type attribute");
	return dynamic(p, optional_kernel);
}

static tern_status optional_has_element_kernel(const tern_kernel_args *a)
{
	tern_status st = tern_tensor_alloc(a->out[0], TERN_BOOL, 0, NULL);
	if (!st)
		*(uint8_t *)a->out[0]->data = present(a, 0);
	return st;
}
SEQUENCE_PREPARE(optional_has_element)

static tern_status optional_get_element_kernel(const tern_kernel_args *a)
{
	if (!present(a, 0))
		return tern_node_errorf(a->node, TERN_EDATA, "OptionalGetElement of an empty optional");
	return tern_tensor_copy(a->out[0], a->in[0]);
}
SEQUENCE_PREPARE(optional_get_element)

/* ---------------------------------------------------------------- SequenceMap */

/* The body, planned on the first element's shapes and re-planned by tern_exec_run when they change. */
typedef struct map_plan {
	tern_exec *exec;
} map_plan;

static void free_map_plan(void *p)
{
	map_plan *m = p;
	tern_exec_free(m->exec);
	free(m);
}

static tern_status sequence_map_kernel(const tern_kernel_args *a)
{
	map_plan *m = a->params;
	tern_sequence *first;
	tern_status st = need_sequence(a, 0, &first);
	if (st)
		return st;
	size_t n = first->n;
	for (int i = 1; i < a->n_in; i++) {
		const tern_sequence *q = a->in[i] ? tern_sequence_of(a->in[i]) : NULL;
		if (q && q->n != n)
			return tern_node_errorf(a->node, TERN_EDATA, "input %d is a sequence of %zu, input 0 of %zu", i, q->n, n);
	}
	for (int o = 0; o < a->n_out && !st; o++)
		if (a->out[o])
			st = tern_sequence_new(a->out[o], TERN_UNDEFINED);
	tern_tensor *in[64];
	if (a->n_in > 64)
		return tern_node_errorf(a->node, TERN_EDATA, "more than 64 inputs");
	tern_graph *body = tern_attr_graph(a->node, "body");
	/* element k of every sequence input, the tensor inputs as they are */
	for (size_t k = 0; k < n && !st; k++) {
		for (int i = 0; i < a->n_in; i++) {
			tern_sequence *q = a->in[i] ? tern_sequence_of(a->in[i]) : NULL;
			in[i] = q ? &q->items[k] : a->in[i];
		}
		if (!m->exec)
			st = tern_exec_create(a->exec, body, in, a->n_in, a->pool, &m->exec);
		if (!st)
			st = tern_exec_run(m->exec, in, a->n_in);
		if (!st && tern_exec_num_outputs(m->exec) != a->n_out)
			st = tern_node_errorf(a->node, TERN_EDATA, "the body has %d outputs, the node %d",
			                      tern_exec_num_outputs(m->exec), a->n_out);
		for (int o = 0; o < a->n_out && !st; o++)
			if (a->out[o])
				st = tern_sequence_insert(a->out[o], tern_exec_output(m->exec, o), -1);
	}
	return st;
}

static tern_status sequence_map_prepare(tern_prepare_args *p)
{
	tern_graph *body = tern_attr_graph(p->node, "body");
	if (!body)
		return tern_node_errorf(p->node, TERN_EDATA, "SequenceMap needs a body graph");
	if (p->n_in < 1 || !p->in[0] || (p->in[0]->dtype != TERN_SEQUENCE && p->in[0]->dtype != 0))
		return tern_node_errorf(p->node, TERN_EDATA, "SequenceMap's first input must be a sequence");
	map_plan *m = calloc(1, sizeof *m);
	if (!m)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = m;
	p->free_params = free_map_plan;
	return dynamic(p, sequence_map_kernel);
}

static const tern_op ops[] = {
        {"", "SequenceEmpty", 11, 0, sequence_empty_prepare, 0, "sequence"},
        {"", "SequenceConstruct", 11, 0, sequence_construct_prepare, 0, "sequence"},
        {"", "SequenceAt", 11, 0, sequence_at_prepare, 0, "sequence"},
        {"", "SequenceInsert", 11, 0, sequence_insert_prepare, 0, "sequence"},
        {"", "SequenceErase", 11, 0, sequence_erase_prepare, 0, "sequence"},
        {"", "SequenceLength", 11, 0, sequence_length_prepare, 0, "sequence"},
        {"", "SplitToSequence", 11, 0, split_to_sequence_prepare, 0, "sequence"},
        {"", "ConcatFromSequence", 11, 0, concat_from_sequence_prepare, 0, "sequence"},
        {"", "SequenceMap", 17, 0, sequence_map_prepare, 0, "sequence"},
        {"", "Optional", 15, 0, optional_prepare, 0, "sequence"},
        {"", "OptionalHasElement", 15, 0, optional_has_element_prepare, 0, "sequence"},
        {"", "OptionalGetElement", 15, 0, optional_get_element_prepare, 0, "sequence"},
};

const tern_op_table tern_ops_sequence = {ops, TERN_ARRAY_LEN(ops)};
