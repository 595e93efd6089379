/* shape.c — operators that move, select and rearrange elements without arithmetic on them: reshapes,
 * transposes, slices, gathers and scatters, padding, shape queries and constants. */
#include "internal.h"
#include "autodiff/grad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Strided copies work on up to twice the tensor rank: Tile and DepthToSpace split each axis in two. */
#define MAX_LOOP (2 * TERN_MAX_RANK)
/* Copies smaller than this run on the calling thread: handing them out costs more than it saves. */
#define PARALLEL_MIN_BYTES ((int64_t)1 << 18)
#define TILE 32

/* ---------------------------------------------------------------- small helpers */

/* Bytes per element as stored: a string element is a char pointer. */
static size_t elem_size(int dtype)
{
	return dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(dtype);
}

static const tern_tensor *input(const tern_prepare_args *p, int i)
{
	return i < p->n_in ? p->in[i] : NULL;
}

static const tern_tensor *kernel_input(const tern_kernel_args *a, int i)
{
	return i < a->n_in ? a->in[i] : NULL;
}

static tern_status out_of_memory(const tern_node *node)
{
	return tern_node_errorf(node, TERN_EOS, "out of memory");
}

static tern_status missing_input(const tern_node *node, int i, const char *name)
{
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' is missing", i, name);
}

/* Element types whose values can be moved byte by byte (or, for strings, duplicated). */
static tern_status check_copyable(const tern_node *node, int dtype)
{
	if (dtype == TERN_STRING || tern_dtype_size(dtype) > 0)
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input 0 has unsupported dtype %s", tern_dtype_name(dtype));
}

static tern_status dup_string(const tern_node *node, char **dst, const char *src)
{
	*dst = tern_strdup(src ? src : "");
	return *dst ? TERN_OK : out_of_memory(node);
}

/* Copies n elements; strings are duplicated so that every tensor owns its own. */
static tern_status copy_elems(const tern_node *node, void *dst, const void *src, int64_t n, size_t es, bool string)
{
	if (!string) {
		if (n > 0)
			memcpy(dst, src, (size_t)n * es);
		return TERN_OK;
	}
	char **d = dst;
	char *const *s = src;
	for (int64_t i = 0; i < n; i++)
		if (dup_string(node, &d[i], s[i]))
			return TERN_EOS;
	return TERN_OK;
}

/* Writes n copies of one element. */
static tern_status fill_elems(const tern_node *node, void *dst, const void *value, int64_t n, size_t es, bool string)
{
	if (string) {
		char **d = dst;
		const char *v = *(char *const *)value;
		for (int64_t i = 0; i < n; i++)
			if (dup_string(node, &d[i], v))
				return TERN_EOS;
		return TERN_OK;
	}
	char *d = dst;
	bool zero = true;
	for (size_t b = 0; b < es; b++)
		zero = zero && ((const unsigned char *)value)[b] == 0;
	if (zero) {
		if (n > 0)
			memset(d, 0, (size_t)n * es);
		return TERN_OK;
	}
	for (int64_t i = 0; i < n; i++)
		memcpy(d + (size_t)i * es, value, es);
	return TERN_OK;
}

/* Frees strings a kernel wrote earlier in the same run before it overwrites them. */
static void free_strings(void *data, int64_t n)
{
	char **s = data;
	for (int64_t i = 0; i < n; i++) {
		free(s[i]);
		s[i] = NULL;
	}
}

#define STORE_AS(T, x)                             \
	{                                          \
		T value = (x);                     \
		memcpy(dst, &value, sizeof value); \
		break;                             \
	}

/* Stores v as one element of dtype (for float attributes that give a value of the tensor's type). dst
 * need not be aligned. */
static void store_f64(int dtype, void *dst, double v)
{
	switch (dtype) {
	case TERN_FLOAT: STORE_AS(float, (float)v)
	case TERN_DOUBLE: STORE_AS(double, v)
	case TERN_FLOAT16: STORE_AS(uint16_t, tern_f32_to_f16((float)v))
	case TERN_BFLOAT16: STORE_AS(uint16_t, tern_f32_to_bf16((float)v))
	case TERN_INT8: STORE_AS(int8_t, (int8_t)v)
	case TERN_INT16: STORE_AS(int16_t, (int16_t)v)
	case TERN_INT32: STORE_AS(int32_t, (int32_t)v)
	case TERN_INT64: STORE_AS(int64_t, (int64_t)v)
	case TERN_UINT8: STORE_AS(uint8_t, (uint8_t)v)
	case TERN_BOOL: STORE_AS(uint8_t, v != 0)
	case TERN_UINT16: STORE_AS(uint16_t, (uint16_t)v)
	case TERN_UINT32: STORE_AS(uint32_t, (uint32_t)v)
	case TERN_UINT64: STORE_AS(uint64_t, (uint64_t)v)
	default: break;
	}
}

static void contiguous_strides(int rank, const int64_t *dims, int64_t *strides)
{
	int64_t s = 1;
	for (int i = rank - 1; i >= 0; i--) {
		strides[i] = s;
		s *= dims[i];
	}
}

static tern_status normalize_axis(const tern_node *node, const char *what, int64_t axis, int rank, int *out)
{
	if (axis < -rank || axis >= rank)
		return tern_node_errorf(node, TERN_EDATA, "%s %lld is out of range for rank %d", what, (long long)axis,
		                        rank);
	*out = (int)(axis < 0 ? axis + rank : axis);
	return TERN_OK;
}

/* Normalises a list of axes and rejects repeats. */
static tern_status normalize_axes(const tern_node *node, const char *what, const int64_t *axes, int n, int rank,
                                  int *out)
{
	bool seen[TERN_MAX_RANK] = {0};
	for (int i = 0; i < n; i++) {
		tern_status st = normalize_axis(node, what, axes[i], rank, &out[i]);
		if (st)
			return st;
		if (seen[out[i]])
			return tern_node_errorf(node, TERN_EDATA, "%s %lld is repeated", what, (long long)axes[i]);
		seen[out[i]] = true;
	}
	return TERN_OK;
}

static const char *shape_str(const tern_tensor *t, char *buf, size_t size)
{
	return tern_shape_str(t->dtype, t->rank, t->dims, buf, size);
}

/* A string attribute as a NUL-terminated copy in buf (attribute bytes carry no terminator). */
static const char *attr_str(const tern_node *node, const char *name, const char *dflt, char *buf, size_t size)
{
	const Onnx__AttributeProto *at = tern_attr(node, name);
	if (!at || !at->has_s)
		return dflt;
	size_t n = at->s.len < size - 1 ? at->s.len : size - 1;
	memcpy(buf, at->s.data, n);
	buf[n] = '\0';
	return buf;
}

/* An ints attribute into out; *n = -1 when absent. */
static tern_status attr_int_list(const tern_node *node, const char *name, int64_t *out, int max, int *n)
{
	*n = -1;
	if (!tern_attr(node, name))
		return TERN_OK;
	size_t count = 0;
	const int64_t *v = tern_attr_ints(node, name, &count);
	if (count > (size_t)max)
		return tern_node_errorf(node, TERN_EDATA, "attribute '%s' has %zu values, at most %d are allowed", name,
		                        count, max);
	for (size_t i = 0; i < count; i++)
		out[i] = v[i];
	*n = (int)count;
	return TERN_OK;
}

static bool is_index_dtype(int dtype)
{
	return dtype == TERN_INT64 || dtype == TERN_INT32;
}

/* The values of a 1-D (or scalar) integer tensor whose data is known. */
static tern_status tensor_int_list(const tern_node *node, const tern_tensor *t, const char *what, int64_t *out, int max,
                                   int *n)
{
	if (!is_index_dtype(t->dtype))
		return tern_node_errorf(node, TERN_EDATA, "%s must be int64 or int32, not %s", what,
		                        tern_dtype_name(t->dtype));
	if (t->rank > 1)
		return tern_node_errorf(node, TERN_EDATA, "%s must be 1-D, has rank %d", what, t->rank);
	int64_t count = tern_tensor_numel(t);
	if (count > max)
		return tern_node_errorf(node, TERN_EDATA, "%s has %lld values, at most %d are allowed", what,
		                        (long long)count, max);
	for (int64_t i = 0; i < count; i++)
		out[i] = tern_tensor_get_i64(t, i);
	*n = (int)count;
	return TERN_OK;
}

/* Output shapes need input i's value: when it is only known at run time, ask to be prepared again then.
 * An empty tensor's value is its shape, known already. */
static bool defer_for(tern_prepare_args *p, int i)
{
	const tern_tensor *t = input(p, i);
	if (t && !t->data && tern_tensor_numel(t) > 0) {
		p->defer = 1;
		return true;
	}
	return false;
}

/* An int list that older opsets keep in an attribute and newer ones in an input. *n = -1 when absent;
 * p->defer is set when the input's value is not known yet. */
static tern_status int_list_arg(tern_prepare_args *p, bool from_input, const char *name, int index, int64_t *out,
                                int max, int *n)
{
	*n = -1;
	if (!from_input)
		return attr_int_list(p->node, name, out, max, n);
	const tern_tensor *t = input(p, index);
	if (!t || defer_for(p, index))
		return TERN_OK;
	char what[64];
	snprintf(what, sizeof what, "input %d '%s'", index, name);
	return tensor_int_list(p->node, t, what, out, max, n);
}

static inline int64_t index_at(const tern_tensor *t, int64_t i)
{
	return t->dtype == TERN_INT32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
}

static tern_status check_indices(const tern_node *node, const tern_tensor *t, int i)
{
	if (!t)
		return missing_input(node, i, "indices");
	if (!is_index_dtype(t->dtype))
		return tern_node_errorf(node, TERN_EDATA, "input %d 'indices' must be int64 or int32, not %s", i,
		                        tern_dtype_name(t->dtype));
	return TERN_OK;
}

/* Maps a possibly negative index into [0, n); reading out of range is never done. */
static tern_status fix_index(const tern_node *node, int64_t *k, int64_t n, int64_t position, int axis)
{
	int64_t v = *k < 0 ? *k + n : *k;
	if (v < 0 || v >= n)
		return tern_node_errorf(
		        node, TERN_EDATA,
		        "index %lld at position %lld of 'indices' is out of range for axis %d of size %lld",
		        (long long)*k, (long long)position, axis, (long long)n);
	*k = v;
	return TERN_OK;
}

/* Indices are checked first, so the copy loop can stay free of error paths. */
static tern_status check_all_indices(const tern_node *node, const tern_tensor *idx, int64_t n_axis, int axis)
{
	int64_t n = tern_tensor_numel(idx);
	for (int64_t i = 0; i < n; i++) {
		int64_t k = index_at(idx, i);
		tern_status st = fix_index(node, &k, n_axis, i, axis);
		if (st)
			return st;
	}
	return TERN_OK;
}

/* Advances a row-major multi-index and keeps an offset along given strides up to date. */
static void advance(int rank, const int64_t *dims, int64_t *idx, const int64_t *stride, int64_t *off)
{
	for (int d = rank - 1; d >= 0; d--) {
		if (++idx[d] < dims[d]) {
			*off += stride[d];
			return;
		}
		*off -= stride[d] * (dims[d] - 1);
		idx[d] = 0;
	}
}

/* Ends a prepare: on failure frees params and passes the status on, else hands params and the kernel to
 * the planner. */
static tern_status use_kernel(tern_prepare_args *p, tern_status st, void *params, tern_kernel_fn kernel)
{
	if (st) {
		free(params);
		return st;
	}
	p->params = params;
	p->free_params = free;
	p->kernel = kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- strided copies */

/* One copy from a strided view of the source into a strided view of the destination. Transpose, Slice,
 * Expand, Tile, Concat, Split, DepthToSpace, SpaceToDepth and CenterCropPad are all such copies;
 * planning coalesces dimensions so that the run is a few long memcpys or a blocked transpose. */
typedef struct copy_plan {
	int rank;
	int tile; /* a dimension with unit source stride copied in blocks against the last one, or -1 */
	bool empty, string, replace; /* replace: free strings already in the destination */
	size_t es;
	int64_t dims[MAX_LOOP], src_stride[MAX_LOOP], dst_stride[MAX_LOOP];
	int64_t src_offset, dst_offset;
} copy_plan;

/* A plan over `dims` with both sides contiguous; callers then change strides and offsets. */
static void plan_begin(copy_plan *c, int dtype, int rank, const int64_t *dims)
{
	memset(c, 0, sizeof *c);
	c->rank = rank;
	c->tile = -1;
	c->es = elem_size(dtype);
	c->string = dtype == TERN_STRING;
	for (int i = 0; i < rank; i++)
		c->dims[i] = dims[i];
	contiguous_strides(rank, dims, c->src_stride);
	contiguous_strides(rank, dims, c->dst_stride);
}

static void plan_finish(copy_plan *c)
{
	int m = 0;
	for (int i = 0; i < c->rank; i++) {
		int64_t d = c->dims[i], ss = c->src_stride[i], ds = c->dst_stride[i];
		if (d == 0)
			c->empty = true;
		if (d == 1)
			continue;
		if (m > 0 && c->src_stride[m - 1] == ss * d && c->dst_stride[m - 1] == ds * d) {
			c->dims[m - 1] *= d;
			c->src_stride[m - 1] = ss;
			c->dst_stride[m - 1] = ds;
			continue;
		}
		c->dims[m] = d;
		c->src_stride[m] = ss;
		c->dst_stride[m] = ds;
		m++;
	}
	if (m == 0) {
		c->dims[0] = 1;
		c->src_stride[0] = c->dst_stride[0] = 1;
		m = 1;
	}
	c->rank = m;
	c->tile = -1;
	int last = m - 1;
	if (!c->string && c->src_stride[last] != 1 && c->dst_stride[last] == 1 && c->dims[last] >= 8)
		for (int j = 0; j < last; j++)
			if (c->src_stride[j] == 1 && c->dims[j] >= 8) {
				c->tile = j;
				break;
			}
}

/* The plan copies the whole source, unchanged, into the whole destination: the output can alias. */
static bool plan_is_whole(const copy_plan *c, int64_t numel)
{
	return !c->empty && c->rank == 1 && c->src_stride[0] == 1 && c->dst_stride[0] == 1 && c->src_offset == 0 &&
	        c->dst_offset == 0 && c->dims[0] == numel;
}

/* Dimensions iterated outside the innermost row (or tile). */
static int plan_outer(const copy_plan *c, int *od, int64_t *n_outer)
{
	int n = 0;
	*n_outer = 1;
	for (int i = 0; i < c->rank - 1; i++)
		if (i != c->tile) {
			od[n++] = i;
			*n_outer *= c->dims[i];
		}
	return n;
}

#define COPY_STRIDED(ES)                \
	for (int64_t i = 0; i < n; i++) \
		memcpy(dst + i * ds * (ES), src + i * ss * (ES), ES);

static void copy_row(const copy_plan *c, char *dst, const char *src)
{
	int last = c->rank - 1;
	int64_t n = c->dims[last], ss = c->src_stride[last], ds = c->dst_stride[last];
	size_t es = c->es;
	if (ss == 1 && ds == 1) {
		memcpy(dst, src, (size_t)n * es);
		return;
	}
	switch (es) {
	case 1: COPY_STRIDED(1) break;
	case 2: COPY_STRIDED(2) break;
	case 4: COPY_STRIDED(4) break;
	case 8: COPY_STRIDED(8) break;
	default:
		for (int64_t i = 0; i < n; i++)
			memcpy(dst + i * ds * (int64_t)es, src + i * ss * (int64_t)es, es);
	}
}

#define COPY_TILE(ES)                                                                                       \
	for (int64_t jb = 0; jb < nj; jb += TILE)                                                           \
		for (int64_t lb = 0; lb < nl; lb += TILE) {                                                 \
			int64_t je = jb + TILE < nj ? jb + TILE : nj, le = lb + TILE < nl ? lb + TILE : nl; \
			for (int64_t j = jb; j < je; j++)                                                   \
				for (int64_t l = lb; l < le; l++)                                           \
					memcpy(dst + (j * dj + l) * (ES), src + (j + l * sl) * (ES), ES);   \
		}

/* A 2-D transpose between the tile dimension (unit source stride) and the last one (unit destination
 * stride), in blocks so that both sides stay in cache. */
static void copy_tile(const copy_plan *c, char *dst, const char *src)
{
	int last = c->rank - 1;
	int64_t nj = c->dims[c->tile], nl = c->dims[last];
	int64_t dj = c->dst_stride[c->tile], sl = c->src_stride[last];
	switch (c->es) {
	case 1: COPY_TILE(1) break;
	case 2: COPY_TILE(2) break;
	case 4: COPY_TILE(4) break;
	case 8: COPY_TILE(8) break;
	default: COPY_TILE(c->es) break;
	}
}

static tern_status copy_string_row(const tern_node *node, const copy_plan *c, char **dst, char *const *src)
{
	int last = c->rank - 1;
	for (int64_t i = 0; i < c->dims[last]; i++) {
		char **d = &dst[i * c->dst_stride[last]];
		if (c->replace)
			free(*d);
		if (dup_string(node, d, src[i * c->src_stride[last]]))
			return TERN_EOS;
	}
	return TERN_OK;
}

/* Copies outer positions [lo, hi). */
static tern_status copy_range(const tern_node *node, const copy_plan *c, char *dst, const char *src, int64_t lo,
                              int64_t hi)
{
	int od[MAX_LOOP];
	int64_t n_outer, idx[MAX_LOOP];
	int n = plan_outer(c, od, &n_outer);
	int64_t so = c->src_offset, dof = c->dst_offset, rem = lo;
	for (int k = n - 1; k >= 0; k--) {
		idx[k] = rem % c->dims[od[k]];
		rem /= c->dims[od[k]];
		so += idx[k] * c->src_stride[od[k]];
		dof += idx[k] * c->dst_stride[od[k]];
	}
	int64_t es = (int64_t)c->es;
	for (int64_t pos = lo; pos < hi; pos++) {
		if (c->string) {
			if (copy_string_row(node, c, (char **)dst + dof, (char *const *)src + so))
				return TERN_EOS;
		} else if (c->tile >= 0) {
			copy_tile(c, dst + dof * es, src + so * es);
		} else {
			copy_row(c, dst + dof * es, src + so * es);
		}
		for (int k = n - 1; k >= 0; k--) {
			int d = od[k];
			so += c->src_stride[d];
			dof += c->dst_stride[d];
			if (++idx[k] < c->dims[d])
				break;
			so -= c->src_stride[d] * c->dims[d];
			dof -= c->dst_stride[d] * c->dims[d];
			idx[k] = 0;
		}
	}
	return TERN_OK;
}

typedef struct copy_job {
	const copy_plan *c;
	char *dst;
	const char *src;
	int64_t n_outer, n_tasks;
} copy_job;

static void copy_task(void *ctx, int64_t t)
{
	const copy_job *j = ctx;
	int64_t lo = j->n_outer * t / j->n_tasks, hi = j->n_outer * (t + 1) / j->n_tasks;
	copy_range(NULL, j->c, j->dst, j->src, lo, hi);
}

static tern_status plan_run(const tern_node *node, const copy_plan *c, void *dst, const void *src,
                            tern_threadpool *pool)
{
	if (c->empty)
		return TERN_OK;
	int od[MAX_LOOP];
	int64_t n_outer;
	plan_outer(c, od, &n_outer);
	int64_t bytes = tern_numel(c->rank, c->dims) * (int64_t)c->es;
	int threads = pool ? tern_threadpool_size(pool) : 1;
	/* a team of guests (eager's asynchronous kernels and the waiting caller) hands out smaller copies:
	 * 32 KiB gained gpt_sample's co-executed step 11 % (median of 9 alternating runs) */
	int64_t least = tern_threadpool_guests(pool) ? PARALLEL_MIN_BYTES / 8 : PARALLEL_MIN_BYTES;
	if (c->string || threads <= 1 || n_outer < 2 || bytes < least)
		return copy_range(node, c, dst, src, 0, n_outer);
	copy_job job = {c, dst, src, n_outer, n_outer < 4 * threads ? n_outer : 4 * threads};
	tern_parallel_for(pool, job.n_tasks, copy_task, &job);
	return TERN_OK;
}

/* Several copies, each from one input into one output (Concat, Split, and the single-copy operators). */
typedef struct copy_item {
	int in, out;
	copy_plan plan;
} copy_item;

typedef struct copy_list {
	int n;
	copy_item item[];
} copy_list;

static copy_list *copy_list_new(int n)
{
	copy_list *l = calloc(1, sizeof *l + (size_t)n * sizeof l->item[0]);
	if (l)
		l->n = n;
	return l;
}

static tern_status copy_list_kernel(const tern_kernel_args *a)
{
	const copy_list *l = a->params;
	for (int i = 0; i < l->n; i++) {
		const copy_item *it = &l->item[i];
		if (!a->out[it->out])
			continue;
		tern_status st = plan_run(a->node, &it->plan, a->out[it->out]->data, a->in[it->in]->data, a->pool);
		if (st)
			return st;
	}
	return TERN_OK;
}

/* Finishes a single-copy operator: output 0 aliases input 0 when the copy would change nothing. */
static tern_status single_copy(tern_prepare_args *p, const copy_plan *c)
{
	copy_plan plan = *c;
	plan_finish(&plan);
	if (plan_is_whole(&plan, tern_tensor_numel(p->in[0])) && tern_tensor_numel(p->out[0]) == plan.dims[0]) {
		p->alias_input0 = 1;
		return TERN_OK;
	}
	copy_list *l = copy_list_new(1);
	if (!l)
		return out_of_memory(p->node);
	l->item[0].plan = plan;
	return use_kernel(p, TERN_OK, l, copy_list_kernel);
}

/* ---------------------------------------------------------------- Reshape, Flatten, Squeeze, Unsqueeze, Identity */

static tern_status alias_to(tern_prepare_args *p, int rank, const int64_t *dims)
{
	tern_set_shape(p->out[0], p->in[0]->dtype, rank, dims);
	p->alias_input0 = 1;
	return TERN_OK;
}

static tern_status reshape_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t shape[TERN_MAX_RANK];
	int n;
	bool from_input = p->node->opset >= 5;
	if (from_input && !input(p, 1))
		return missing_input(p->node, 1, "shape");
	tern_status st = int_list_arg(p, from_input, "shape", 1, shape, TERN_MAX_RANK, &n);
	if (st || p->defer)
		return st;
	if (n < 0)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'shape' is missing");
	bool allowzero = p->node->opset >= 14 && tern_attr_int(p->node, "allowzero", 0) != 0;
	int64_t known = 1;
	int infer = -1;
	char buf[128];
	for (int i = 0; i < n; i++) {
		if (shape[i] == 0 && !allowzero) {
			if (i >= x->rank)
				return tern_node_errorf(p->node, TERN_EDATA,
				                        "shape[%d] = 0 copies a dimension that input %s lacks", i,
				                        shape_str(x, buf, sizeof buf));
			shape[i] = x->dims[i];
		}
		if (shape[i] == -1) {
			if (infer >= 0)
				return tern_node_errorf(p->node, TERN_EDATA,
				                        "shape has more than one -1 (at %d and %d)", infer, i);
			infer = i;
		} else if (shape[i] < 0) {
			return tern_node_errorf(p->node, TERN_EDATA, "shape[%d] = %lld is negative", i,
			                        (long long)shape[i]);
		} else {
			known *= shape[i];
		}
	}
	int64_t total = tern_tensor_numel(x);
	if (infer >= 0) {
		if (known == 0 || total % known != 0)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "cannot infer shape[%d]: input %s has %lld elements", infer,
			                        shape_str(x, buf, sizeof buf), (long long)total);
		shape[infer] = total / known;
	} else if (known != total) {
		return tern_node_errorf(p->node, TERN_EDATA, "shape has %lld elements, input %s has %lld",
		                        (long long)known, shape_str(x, buf, sizeof buf), (long long)total);
	}
	return alias_to(p, n, shape);
}

static tern_status flatten_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t axis = tern_attr_int(p->node, "axis", 1);
	if (axis < -x->rank || axis > x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "axis %lld is out of range for rank %d", (long long)axis,
		                        x->rank);
	if (axis < 0)
		axis += x->rank;
	int64_t dims[2] = {tern_numel((int)axis, x->dims), tern_numel(x->rank - (int)axis, x->dims + axis)};
	return alias_to(p, 2, dims);
}

static tern_status squeeze_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t axes[TERN_MAX_RANK];
	int n, ax[TERN_MAX_RANK];
	tern_status st = int_list_arg(p, p->node->opset >= 13, "axes", 1, axes, TERN_MAX_RANK, &n);
	if (st || p->defer)
		return st;
	if ((st = normalize_axes(p->node, "axis", axes, n < 0 ? 0 : n, x->rank, ax)))
		return st;
	bool drop[TERN_MAX_RANK] = {0};
	for (int i = 0; i < x->rank; i++)
		drop[i] = n < 0 && x->dims[i] == 1;
	for (int i = 0; i < n; i++) {
		if (x->dims[ax[i]] != 1)
			return tern_node_errorf(p->node, TERN_EDATA, "cannot squeeze axis %lld of size %lld",
			                        (long long)axes[i], (long long)x->dims[ax[i]]);
		drop[ax[i]] = true;
	}
	int64_t dims[TERN_MAX_RANK];
	int rank = 0;
	for (int i = 0; i < x->rank; i++)
		if (!drop[i])
			dims[rank++] = x->dims[i];
	return alias_to(p, rank, dims);
}

static tern_status unsqueeze_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	bool from_input = p->node->opset >= 13;
	if (from_input && !input(p, 1))
		return missing_input(p->node, 1, "axes");
	int64_t axes[TERN_MAX_RANK];
	int n, ax[TERN_MAX_RANK];
	tern_status st = int_list_arg(p, from_input, "axes", 1, axes, TERN_MAX_RANK, &n);
	if (st || p->defer)
		return st;
	if (n < 0)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'axes' is missing");
	int rank = x->rank + n;
	if (rank > TERN_MAX_RANK)
		return tern_node_errorf(p->node, TERN_EDATA, "result rank %d exceeds %d", rank, TERN_MAX_RANK);
	if ((st = normalize_axes(p->node, "axis", axes, n, rank, ax)))
		return st;
	bool added[TERN_MAX_RANK] = {0};
	for (int i = 0; i < n; i++)
		added[ax[i]] = true;
	int64_t dims[TERN_MAX_RANK];
	for (int i = 0, j = 0; i < rank; i++)
		dims[i] = added[i] ? 1 : x->dims[j++];
	return alias_to(p, rank, dims);
}

static tern_status identity_prepare(tern_prepare_args *p)
{
	if (!p->in[0])
		return missing_input(p->node, 0, "input");
	return alias_to(p, p->in[0]->rank, p->in[0]->dims);
}

/* ---------------------------------------------------------------- Transpose */

static tern_status transpose_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_copyable(p->node, x->dtype);
	if (st)
		return st;
	int64_t perm[TERN_MAX_RANK];
	int n;
	if ((st = attr_int_list(p->node, "perm", perm, TERN_MAX_RANK, &n)))
		return st;
	if (n < 0) {
		n = x->rank;
		for (int i = 0; i < n; i++)
			perm[i] = n - 1 - i;
	}
	if (n != x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "perm has %d values, input has rank %d", n, x->rank);
	bool seen[TERN_MAX_RANK] = {0};
	for (int i = 0; i < n; i++) {
		if (perm[i] < 0 || perm[i] >= n || seen[perm[i]])
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "perm is not a permutation of 0..%d (perm[%d] = %lld)", n - 1, i,
			                        (long long)perm[i]);
		seen[perm[i]] = true;
	}
	int64_t stride[TERN_MAX_RANK], dims[TERN_MAX_RANK];
	contiguous_strides(x->rank, x->dims, stride);
	for (int i = 0; i < n; i++)
		dims[i] = x->dims[perm[i]];
	tern_set_shape(p->out[0], x->dtype, n, dims);
	copy_plan c;
	plan_begin(&c, x->dtype, n, dims);
	for (int i = 0; i < n; i++)
		c.src_stride[i] = stride[perm[i]];
	return single_copy(p, &c);
}

/* ---------------------------------------------------------------- Concat, Split */

static tern_status concat_prepare(tern_prepare_args *p)
{
	const tern_tensor *x0 = p->in[0];
	tern_status st = check_copyable(p->node, x0->dtype);
	if (st)
		return st;
	if (!tern_attr(p->node, "axis"))
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'axis' is missing");
	int axis = 0;
	if ((st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", 0), x0->rank, &axis)))
		return st;
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, x0->dims, sizeof dims);
	dims[axis] = 0;
	char b0[128], b1[128];
	for (int i = 0; i < p->n_in; i++) {
		const tern_tensor *x = p->in[i];
		if (!x)
			return missing_input(p->node, i, "inputs");
		bool same = x->rank == x0->rank && x->dtype == x0->dtype;
		for (int d = 0; same && d < x->rank; d++)
			same = d == axis || x->dims[d] == x0->dims[d];
		if (!same)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input %d %s does not match input 0 %s outside axis %d", i,
			                        shape_str(x, b1, sizeof b1), shape_str(x0, b0, sizeof b0), axis);
		dims[axis] += x->dims[axis];
	}
	tern_set_shape(p->out[0], x0->dtype, x0->rank, dims);
	copy_list *l = copy_list_new(p->n_in);
	if (!l)
		return out_of_memory(p->node);
	int64_t out_stride[TERN_MAX_RANK], offset = 0;
	contiguous_strides(x0->rank, dims, out_stride);
	for (int i = 0; i < p->n_in; i++) {
		copy_plan *c = &l->item[i].plan;
		plan_begin(c, x0->dtype, x0->rank, p->in[i]->dims);
		memcpy(c->dst_stride, out_stride, sizeof out_stride);
		c->dst_offset = offset * out_stride[axis];
		offset += p->in[i]->dims[axis];
		plan_finish(c);
		l->item[i].in = i;
	}
	return use_kernel(p, TERN_OK, l, copy_list_kernel);
}

static tern_status split_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	const tern_node *node = p->node;
	tern_status st = check_copyable(node, x->dtype);
	if (st)
		return st;
	int axis = 0;
	if ((st = normalize_axis(node, "axis", tern_attr_int(node, "axis", 0), x->rank, &axis)))
		return st;
	int n_out = p->n_out;
	int64_t dim = x->dims[axis];
	int64_t *sizes = calloc((size_t)n_out, sizeof *sizes);
	if (!sizes)
		return out_of_memory(node);
	/* The sizes are an input at opset 13 and later (and optionally at opset 1), an attribute between. */
	const tern_tensor *split_in = input(p, 1);
	bool have = false;
	if (split_in && (node->opset >= 13 || node->opset < 2)) {
		if (defer_for(p, 1)) {
			free(sizes);
			return TERN_OK;
		}
		int64_t n = tern_tensor_numel(split_in);
		if (!is_index_dtype(split_in->dtype) || n != n_out)
			st = tern_node_errorf(node, TERN_EDATA, "input 1 'split' has %lld %s values for %d outputs",
			                      (long long)n, tern_dtype_name(split_in->dtype), n_out);
		for (int64_t i = 0; !st && i < n; i++)
			sizes[i] = tern_tensor_get_i64(split_in, i);
		have = true;
	} else if (node->opset < 13 && tern_attr(node, "split")) {
		size_t n;
		const int64_t *v = tern_attr_ints(node, "split", &n);
		if (n != (size_t)n_out)
			st = tern_node_errorf(node, TERN_EDATA, "attribute 'split' has %zu values for %d outputs", n,
			                      n_out);
		for (size_t i = 0; !st && i < n; i++)
			sizes[i] = v[i];
		have = true;
	}
	if (!st && have) {
		int64_t sum = 0;
		for (int i = 0; i < n_out; i++) {
			if (sizes[i] < 0)
				st = tern_node_errorf(node, TERN_EDATA, "split[%d] = %lld is negative", i,
				                      (long long)sizes[i]);
			sum += sizes[i];
		}
		if (!st && sum != dim)
			st = tern_node_errorf(node, TERN_EDATA, "split sizes add up to %lld, axis %d has size %lld",
			                      (long long)sum, axis, (long long)dim);
	} else if (!st && node->opset >= 18 && tern_attr(node, "num_outputs")) {
		int64_t parts = tern_attr_int(node, "num_outputs", 0);
		if (parts != n_out || parts < 1)
			st = tern_node_errorf(node, TERN_EDATA, "num_outputs is %lld, the node has %d outputs",
			                      (long long)parts, n_out);
		int64_t chunk = parts > 0 ? (dim + parts - 1) / parts : 0;
		for (int i = 0; !st && i < n_out; i++) {
			int64_t begin = chunk * i < dim ? chunk * i : dim;
			sizes[i] = (begin + chunk < dim ? begin + chunk : dim) - begin;
		}
	} else if (!st) {
		if (n_out < 1 || dim % n_out != 0)
			st = tern_node_errorf(node, TERN_EDATA,
			                      "axis %d of size %lld does not split into %d equal parts", axis,
			                      (long long)dim, n_out);
		for (int i = 0; !st && i < n_out; i++)
			sizes[i] = dim / n_out;
	}
	copy_list *l = st ? NULL : copy_list_new(n_out);
	if (!st && !l)
		st = out_of_memory(node);
	if (st) {
		free(sizes);
		return st;
	}
	int64_t in_stride[TERN_MAX_RANK], offset = 0;
	contiguous_strides(x->rank, x->dims, in_stride);
	for (int i = 0; i < n_out; i++) {
		int64_t dims[TERN_MAX_RANK];
		memcpy(dims, x->dims, sizeof dims);
		dims[axis] = sizes[i];
		if (p->out[i])
			tern_set_shape(p->out[i], x->dtype, x->rank, dims);
		copy_plan *c = &l->item[i].plan;
		plan_begin(c, x->dtype, x->rank, dims);
		memcpy(c->src_stride, in_stride, sizeof in_stride);
		c->src_offset = offset * in_stride[axis];
		offset += sizes[i];
		plan_finish(c);
		l->item[i].out = i;
	}
	free(sizes);
	return use_kernel(p, TERN_OK, l, copy_list_kernel);
}

/* ---------------------------------------------------------------- Slice */

/* Where Slice reads in a tensor of shape (rank, xdims): for each axis the first index, the step and the
 * count, from starts, ends, axes and steps (na, nst < 0: absent). Shared with tern.SliceGrad. */
static tern_status slice_geometry(const tern_node *node, int rank, const int64_t *xdims, const int64_t *starts, int ns,
                                  const int64_t *ends, int ne, int64_t *axes, int na, int64_t *steps, int nst,
                                  int64_t *begin, int64_t *step, int64_t *dims)
{
	if (ns < 0 || ne < 0)
		return tern_node_errorf(node, TERN_EDATA, "'starts' and 'ends' are required");
	if (ns != ne || (na >= 0 && na != ns) || (nst >= 0 && nst != ns))
		return tern_node_errorf(node, TERN_EDATA, "starts, ends, axes and steps have %d, %d, %d and %d values",
		                        ns, ne, na, nst);
	if (na < 0)
		for (int i = 0; i < ns; i++)
			axes[i] = i;
	if (nst < 0)
		for (int i = 0; i < ns; i++)
			steps[i] = 1;
	int ax[TERN_MAX_RANK];
	tern_status st = normalize_axes(node, "axis", axes, ns, rank, ax);
	if (st)
		return st;
	for (int d = 0; d < rank; d++) {
		begin[d] = 0;
		step[d] = 1;
		dims[d] = xdims[d];
	}
	for (int i = 0; i < ns; i++) {
		int d = ax[i];
		int64_t n = xdims[d], s = starts[i], e = ends[i], k = steps[i];
		if (k == 0)
			return tern_node_errorf(node, TERN_EDATA, "step for axis %d is 0", d);
		/* A step longer than the axis takes at most one element; clamping it avoids overflow below. */
		if (k > n + 1)
			k = n + 1;
		if (k < -n - 1)
			k = -n - 1;
		if (s < 0)
			s += n;
		if (e < 0)
			e += n;
		int64_t len;
		if (n == 0) {
			s = 0;
			len = 0;
		} else if (k > 0) {
			s = s < 0 ? 0 : s > n ? n : s;
			e = e < 0 ? 0 : e > n ? n : e;
			len = e > s ? (e - s + k - 1) / k : 0;
		} else {
			s = s < 0 ? 0 : s > n - 1 ? n - 1 : s;
			e = e < -1 ? -1 : e > n - 1 ? n - 1 : e;
			len = s > e ? (s - e - k - 1) / -k : 0;
		}
		begin[d] = s;
		step[d] = k;
		dims[d] = len;
	}
	return TERN_OK;
}

/* A copy plan over the sliced elements of a tensor of shape (rank, xdims): the strided side reads (or,
 * for tern.SliceGrad, writes) them, the other side is contiguous. */
static void slice_plan(copy_plan *c, int dtype, int rank, const int64_t *xdims, const int64_t *begin,
                       const int64_t *step, const int64_t *dims, bool strided_dst)
{
	int64_t stride[TERN_MAX_RANK];
	contiguous_strides(rank, xdims, stride);
	plan_begin(c, dtype, rank, dims);
	int64_t *strided = strided_dst ? c->dst_stride : c->src_stride;
	int64_t *offset = strided_dst ? &c->dst_offset : &c->src_offset;
	for (int d = 0; d < rank; d++) {
		strided[d] = stride[d] * step[d];
		if (dims[d] > 0)
			*offset += begin[d] * stride[d];
	}
}

static tern_status slice_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	const tern_node *node = p->node;
	tern_status st = check_copyable(node, x->dtype);
	if (st)
		return st;
	bool from_input = node->opset >= 10;
	int64_t starts[TERN_MAX_RANK], ends[TERN_MAX_RANK], axes[TERN_MAX_RANK], steps[TERN_MAX_RANK];
	int ns, ne, na, nst;
	if ((st = int_list_arg(p, from_input, "starts", 1, starts, TERN_MAX_RANK, &ns)) ||
	    (st = int_list_arg(p, from_input, "ends", 2, ends, TERN_MAX_RANK, &ne)) ||
	    (st = int_list_arg(p, from_input, "axes", 3, axes, TERN_MAX_RANK, &na)))
		return st;
	nst = -1;
	if (from_input && (st = int_list_arg(p, true, "steps", 4, steps, TERN_MAX_RANK, &nst)))
		return st;
	if (p->defer)
		return TERN_OK;
	int64_t begin[TERN_MAX_RANK], step[TERN_MAX_RANK], dims[TERN_MAX_RANK];
	if ((st = slice_geometry(node, x->rank, x->dims, starts, ns, ends, ne, axes, na, steps, nst, begin, step,
	                         dims)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	copy_plan c;
	slice_plan(&c, x->dtype, x->rank, x->dims, begin, step, dims, false);
	return single_copy(p, &c);
}

/* The target shape of a backward operator, from input i (an int64 vector; p->defer while unknown). */
static tern_status shape_input(tern_prepare_args *p, int i, int64_t *shape, int *n)
{
	if (!input(p, i))
		return missing_input(p->node, i, "shape");
	tern_status st = int_list_arg(p, true, "shape", i, shape, TERN_MAX_RANK, n);
	if (st || p->defer)
		return st;
	for (int d = 0; d < *n; d++)
		if (shape[d] < 0)
			return tern_node_errorf(p->node, TERN_EDATA, "input %d 'shape'[%d] = %lld is negative", i, d,
			                        (long long)shape[d]);
	return TERN_OK;
}

/* That input 0 (a gradient) has the shape (rank, dims) the forward operator's output had. */
static tern_status check_grad_shape(const tern_node *node, const tern_tensor *dy, int rank, const int64_t *dims)
{
	bool same = dy->rank == rank;
	for (int d = 0; same && d < rank; d++)
		same = dy->dims[d] == dims[d];
	if (same)
		return TERN_OK;
	char b0[128], b1[128];
	return tern_node_errorf(node, TERN_EDATA, "input 0 %s is not the forward output's shape %s",
	                        shape_str(dy, b0, sizeof b0), tern_shape_str(dy->dtype, rank, dims, b1, sizeof b1));
}

/* tern.SliceGrad(dY, shape, starts, ends, axes, steps): zeros of `shape` with dY written where
 * Slice(X, starts, ends, axes, steps) reads X (X of that shape) — the gradient of Slice. */
static tern_status slice_grad_kernel(const tern_kernel_args *a)
{
	tern_tensor *dx = a->out[0];
	size_t bytes = (size_t)tern_tensor_numel(dx) * tern_dtype_size(dx->dtype);
	if (bytes)
		memset(dx->data, 0, bytes);
	return plan_run(a->node, a->params, dx->data, a->in[0]->data, a->pool);
}

static tern_status slice_grad_prepare(tern_prepare_args *p)
{
	const tern_tensor *dy = p->in[0];
	const tern_node *node = p->node;
	int64_t shape[TERN_MAX_RANK], starts[TERN_MAX_RANK], ends[TERN_MAX_RANK], axes[TERN_MAX_RANK];
	int64_t steps[TERN_MAX_RANK];
	int nr, ns, ne, na, nst;
	tern_status st;
	if (!input(p, 2) || !input(p, 3))
		return missing_input(node, input(p, 2) ? 3 : 2, input(p, 2) ? "ends" : "starts");
	if ((st = shape_input(p, 1, shape, &nr)) ||
	    (st = int_list_arg(p, true, "starts", 2, starts, TERN_MAX_RANK, &ns)) ||
	    (st = int_list_arg(p, true, "ends", 3, ends, TERN_MAX_RANK, &ne)) ||
	    (st = int_list_arg(p, true, "axes", 4, axes, TERN_MAX_RANK, &na)) ||
	    (st = int_list_arg(p, true, "steps", 5, steps, TERN_MAX_RANK, &nst)))
		return st;
	if (p->defer)
		return TERN_OK;
	int64_t begin[TERN_MAX_RANK], step[TERN_MAX_RANK], dims[TERN_MAX_RANK];
	if ((st = slice_geometry(node, nr, shape, starts, ns, ends, ne, axes, na, steps, nst, begin, step, dims)) ||
	    (st = check_grad_shape(node, dy, nr, dims)))
		return st;
	tern_set_shape(p->out[0], dy->dtype, nr, shape);
	copy_plan *c = malloc(sizeof *c);
	if (!c)
		return out_of_memory(node);
	slice_plan(c, dy->dtype, nr, shape, begin, step, dims, true);
	plan_finish(c);
	return use_kernel(p, TERN_OK, c, slice_grad_kernel);
}

/* ---------------------------------------------------------------- Expand, Tile */

/* The start of Expand, Tile and CenterCropPad: a copyable input 0 and the int list in input 1, whose
 * value the output shape needs (p->defer is set while it is unknown). */
static tern_status copy_with_list(tern_prepare_args *p, const char *name, int64_t *list, int *n)
{
	tern_status st = check_copyable(p->node, p->in[0]->dtype);
	if (st)
		return st;
	if (!input(p, 1))
		return missing_input(p->node, 1, name);
	return int_list_arg(p, true, name, 1, list, TERN_MAX_RANK, n);
}

static tern_status expand_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t shape[TERN_MAX_RANK], dims[TERN_MAX_RANK];
	int n, rank;
	tern_status st = copy_with_list(p, "shape", shape, &n);
	if (st || p->defer)
		return st;
	if ((st = tern_broadcast_shape(p->node, x->rank, x->dims, n, shape, &rank, dims)))
		return st;
	tern_set_shape(p->out[0], x->dtype, rank, dims);
	int64_t stride[TERN_MAX_RANK];
	contiguous_strides(x->rank, x->dims, stride);
	copy_plan c;
	plan_begin(&c, x->dtype, rank, dims);
	for (int d = 0; d < rank; d++) {
		int xd = d - (rank - x->rank);
		c.src_stride[d] = xd >= 0 && x->dims[xd] == dims[d] ? stride[xd] : 0;
	}
	return single_copy(p, &c);
}

static tern_status tile_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t reps[TERN_MAX_RANK], dims[TERN_MAX_RANK], stride[TERN_MAX_RANK];
	int n;
	tern_status st = copy_with_list(p, "repeats", reps, &n);
	if (st || p->defer)
		return st;
	if (n != x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'repeats' has %d values, input 0 has rank %d", n,
		                        x->rank);
	contiguous_strides(x->rank, x->dims, stride);
	/* The output seen as [r0, d0, r1, d1, ...]: each repeat axis reads the source with stride 0. */
	int64_t loop_dims[MAX_LOOP] = {0};
	for (int d = 0; d < n; d++) {
		if (reps[d] < 0)
			return tern_node_errorf(p->node, TERN_EDATA, "repeats[%d] = %lld is negative", d,
			                        (long long)reps[d]);
		dims[d] = x->dims[d] * reps[d];
		loop_dims[2 * d] = reps[d];
		loop_dims[2 * d + 1] = x->dims[d];
	}
	tern_set_shape(p->out[0], x->dtype, n, dims);
	copy_plan c;
	plan_begin(&c, x->dtype, 2 * n, loop_dims);
	for (int d = 0; d < n; d++) {
		c.src_stride[2 * d] = 0;
		c.src_stride[2 * d + 1] = stride[d];
	}
	return single_copy(p, &c);
}

/* ---------------------------------------------------------------- DepthToSpace, SpaceToDepth */

static tern_status blocks_check(tern_prepare_args *p, int64_t *b)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_copyable(p->node, x->dtype);
	if (st)
		return st;
	if (x->rank != 4)
		return tern_node_errorf(p->node, TERN_EDATA, "input must have rank 4, has rank %d", x->rank);
	*b = tern_attr_int(p->node, "blocksize", 0);
	if (*b < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "blocksize %lld must be positive", (long long)*b);
	return TERN_OK;
}

static tern_status depth_to_space_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t b = 1;
	tern_status st = blocks_check(p, &b);
	if (st)
		return st;
	int64_t n = x->dims[0], ch = x->dims[1], h = x->dims[2], w = x->dims[3];
	if (ch % (b * b) != 0)
		return tern_node_errorf(p->node, TERN_EDATA, "channels %lld are not a multiple of blocksize^2 = %lld",
		                        (long long)ch, (long long)(b * b));
	char mode_buf[8];
	const char *mode = attr_str(p->node, "mode", "DCR", mode_buf, sizeof mode_buf);
	bool crd = strcmp(mode, "CRD") == 0;
	if (!crd && strcmp(mode, "DCR") != 0)
		return tern_node_errorf(p->node, TERN_EDATA, "mode '%s' is not DCR or CRD", mode);
	int64_t c = ch / (b * b);
	int64_t dims[4] = {n, c, h * b, w * b};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	/* Output seen as [N, C', H, b, W, b]; DCR reads channel (b1 * b + b2) * C' + c, CRD c * b * b + b1 * b + b2. */
	int64_t loop_dims[6] = {n, c, h, b, w, b};
	copy_plan cp;
	plan_begin(&cp, x->dtype, 6, loop_dims);
	int64_t hw = h * w;
	int64_t strides_dcr[6] = {ch * hw, hw, w, b * c * hw, 1, c * hw};
	int64_t strides_crd[6] = {ch * hw, b * b * hw, w, b * hw, 1, hw};
	memcpy(cp.src_stride, crd ? strides_crd : strides_dcr, sizeof strides_dcr);
	return single_copy(p, &cp);
}

static tern_status space_to_depth_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t b = 1;
	tern_status st = blocks_check(p, &b);
	if (st)
		return st;
	int64_t n = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3];
	if (h % b != 0 || w % b != 0)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "height %lld and width %lld are not multiples of blocksize %lld", (long long)h,
		                        (long long)w, (long long)b);
	int64_t dims[4] = {n, c * b * b, h / b, w / b};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	/* Output seen as [N, b, b, C, H/b, W/b]. */
	int64_t loop_dims[6] = {n, b, b, c, h / b, w / b};
	copy_plan cp;
	plan_begin(&cp, x->dtype, 6, loop_dims);
	int64_t strides[6] = {c * h * w, w, 1, h * w, b * w, b};
	memcpy(cp.src_stride, strides, sizeof strides);
	return single_copy(p, &cp);
}

/* ---------------------------------------------------------------- CenterCropPad */

typedef struct crop_pad_params {
	copy_plan plan;
	bool pads;
} crop_pad_params;

static tern_status center_crop_pad_kernel(const tern_kernel_args *a)
{
	const crop_pad_params *cp = a->params;
	tern_tensor *y = a->out[0];
	if (cp->pads) {
		char zero[16] = {0};
		const char *empty = "";
		tern_status st = fill_elems(a->node, y->data, y->dtype == TERN_STRING ? (const void *)&empty : zero,
		                            tern_tensor_numel(y), cp->plan.es, cp->plan.string);
		if (st)
			return st;
	}
	return plan_run(a->node, &cp->plan, y->data, a->in[0]->data, a->pool);
}

static tern_status center_crop_pad_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t shape[TERN_MAX_RANK], axes[TERN_MAX_RANK];
	int n, na, ax[TERN_MAX_RANK];
	tern_status st = copy_with_list(p, "shape", shape, &n);
	if (st || p->defer)
		return st;
	if ((st = attr_int_list(p->node, "axes", axes, TERN_MAX_RANK, &na)))
		return st;
	if (na < 0) {
		na = x->rank;
		for (int i = 0; i < na; i++)
			axes[i] = i;
	}
	if (n != na)
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'shape' has %d values for %d axes", n, na);
	if ((st = normalize_axes(p->node, "axis", axes, na, x->rank, ax)))
		return st;
	int64_t dims[TERN_MAX_RANK], src_begin[TERN_MAX_RANK] = {0}, dst_begin[TERN_MAX_RANK] = {0};
	int64_t copy_dims[TERN_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	memcpy(copy_dims, x->dims, sizeof dims);
	bool pads = false;
	for (int i = 0; i < na; i++) {
		int d = ax[i];
		if (shape[i] < 0)
			return tern_node_errorf(p->node, TERN_EDATA, "shape[%d] = %lld is negative", i,
			                        (long long)shape[i]);
		if (shape[i] < x->dims[d]) {
			src_begin[d] = (x->dims[d] - shape[i]) / 2;
			copy_dims[d] = shape[i];
		} else if (shape[i] > x->dims[d]) {
			dst_begin[d] = (shape[i] - x->dims[d]) / 2;
			pads = true;
		}
		dims[d] = shape[i];
	}
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	crop_pad_params *cp = calloc(1, sizeof *cp);
	if (!cp)
		return out_of_memory(p->node);
	plan_begin(&cp->plan, x->dtype, x->rank, copy_dims);
	int64_t src_stride[TERN_MAX_RANK], dst_stride[TERN_MAX_RANK];
	contiguous_strides(x->rank, x->dims, src_stride);
	contiguous_strides(x->rank, dims, dst_stride);
	for (int d = 0; d < x->rank; d++) {
		cp->plan.src_stride[d] = src_stride[d];
		cp->plan.dst_stride[d] = dst_stride[d];
		cp->plan.src_offset += src_begin[d] * src_stride[d];
		cp->plan.dst_offset += dst_begin[d] * dst_stride[d];
	}
	cp->plan.replace = pads;
	cp->pads = pads;
	plan_finish(&cp->plan);
	return use_kernel(p, TERN_OK, cp, center_crop_pad_kernel);
}

/* ---------------------------------------------------------------- Pad */

enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

typedef struct pad_params {
	int rank, mode;
	bool value_input; /* the constant comes from input 2 at run time */
	size_t es;
	bool string;
	unsigned char value[16];
	int64_t in_dims[TERN_MAX_RANK], out_dims[TERN_MAX_RANK];
	int64_t keep_begin[TERN_MAX_RANK], keep[TERN_MAX_RANK]; /* source range left after negative pads */
	int64_t pad_begin[TERN_MAX_RANK]; /* positive padding before it */
} pad_params;

/* The source coordinate that output coordinate o of axis d reads, or -1 for the constant. */
static int64_t pad_source(const pad_params *pp, int d, int64_t o)
{
	int64_t m = pp->keep[d], j = o - pp->pad_begin[d];
	if (j < 0 || j >= m) {
		switch (pp->mode) {
		case PAD_CONSTANT: return -1;
		case PAD_EDGE: j = j < 0 ? 0 : m - 1; break;
		case PAD_WRAP:
			j %= m;
			j += j < 0 ? m : 0;
			break;
		default:
			if (m == 1) {
				j = 0;
			} else {
				int64_t period = 2 * (m - 1);
				j %= period;
				j += j < 0 ? period : 0;
				j = j >= m ? period - j : j;
			}
		}
	}
	return pp->keep_begin[d] + j;
}

/* Output elements [from, to) of a row that is not constant: read through the mode, or the constant. */
static tern_status pad_border(const tern_node *node, const pad_params *pp, char *row, const char *src_row,
                              const void *value, int64_t from, int64_t to)
{
	int last = pp->rank - 1;
	size_t es = pp->es;
	for (int64_t o = from; o < to; o++) {
		int64_t j = pad_source(pp, last, o);
		tern_status st = j < 0
		        ? fill_elems(node, row + (size_t)o * es, value, 1, es, pp->string)
		        : copy_elems(node, row + (size_t)o * es, src_row + (size_t)j * es, 1, es, pp->string);
		if (st)
			return st;
	}
	return TERN_OK;
}

static tern_status pad_kernel(const tern_kernel_args *a)
{
	const pad_params *pp = a->params;
	const tern_tensor *cv = kernel_input(a, 2);
	const char *empty = "";
	const void *value = pp->string ? (const void *)&empty : pp->value;
	if (pp->value_input && cv && tern_tensor_numel(cv) > 0)
		value = cv->data;
	int r = pp->rank, last = r - 1;
	int64_t out_n = tern_numel(r, pp->out_dims), row_len = pp->out_dims[last];
	if (out_n == 0)
		return TERN_OK;
	int64_t in_stride[TERN_MAX_RANK], idx[TERN_MAX_RANK] = {0};
	contiguous_strides(r, pp->in_dims, in_stride);
	const char *src = a->in[0]->data;
	char *dst = a->out[0]->data;
	size_t es = pp->es;
	int64_t lo = pp->pad_begin[last], mid = pp->keep[last];
	if (lo > row_len)
		lo = row_len;
	if (mid > row_len - lo)
		mid = row_len - lo;
	for (int64_t row = 0; row < out_n / row_len; row++) {
		char *d = dst + (size_t)(row * row_len) * es;
		int64_t base = 0;
		bool constant_row = false;
		for (int k = 0; k < last && !constant_row; k++) {
			int64_t s = pad_source(pp, k, idx[k]);
			constant_row = s < 0;
			base += s * in_stride[k];
		}
		tern_status st;
		if (constant_row) {
			st = fill_elems(a->node, d, value, row_len, es, pp->string);
		} else {
			const char *s = src + (size_t)base * es;
			st = copy_elems(a->node, d + (size_t)lo * es, s + (size_t)pp->keep_begin[last] * es, mid, es,
			                pp->string);
			if (!st)
				st = pad_border(a->node, pp, d, s, value, 0, lo);
			if (!st)
				st = pad_border(a->node, pp, d, s, value, lo + mid, row_len);
		}
		if (st)
			return st;
		for (int k = last - 1; k >= 0; k--) {
			if (++idx[k] < pp->out_dims[k])
				break;
			idx[k] = 0;
		}
	}
	return TERN_OK;
}

/* Fills pp (all but the constant) for padding a tensor of shape (rank, xdims) by pads (np values) on
 * axes (na < 0: all) in the named mode. Shared with tern.PadGrad. */
static tern_status pad_geometry(const tern_node *node, int dtype, int rank, const int64_t *xdims, const int64_t *pads,
                                int np, int64_t *axes, int na, const char *mode, bool allow_wrap, pad_params *pp)
{
	tern_status st = TERN_OK;
	if (strcmp(mode, "constant") == 0)
		pp->mode = PAD_CONSTANT;
	else if (strcmp(mode, "reflect") == 0)
		pp->mode = PAD_REFLECT;
	else if (strcmp(mode, "edge") == 0)
		pp->mode = PAD_EDGE;
	else if (strcmp(mode, "wrap") == 0 && allow_wrap)
		pp->mode = PAD_WRAP;
	else
		return tern_node_errorf(node, TERN_EDATA, "mode '%s' is not supported", mode);
	int ax[TERN_MAX_RANK];
	if (na < 0) {
		na = rank;
		for (int i = 0; i < na; i++)
			axes[i] = i;
	}
	if (np != 2 * na)
		return tern_node_errorf(node, TERN_EDATA, "pads has %d values, expected %d (2 per axis)", np, 2 * na);
	if ((st = normalize_axes(node, "axis", axes, na, rank, ax)))
		return st;
	/* A scalar is padded as a one-element vector with no padding. */
	pp->rank = rank ? rank : 1;
	pp->es = elem_size(dtype);
	pp->string = dtype == TERN_STRING;
	for (int d = 0; d < pp->rank; d++) {
		pp->in_dims[d] = rank ? xdims[d] : 1;
		pp->keep[d] = pp->out_dims[d] = pp->in_dims[d];
	}
	for (int i = 0; i < na; i++) {
		int d = ax[i];
		int64_t begin = pads[i], end = pads[na + i], n = xdims[d];
		int64_t cut_begin = begin < 0 ? -begin : 0, cut_end = end < 0 ? -end : 0;
		if (cut_begin + cut_end > n)
			return tern_node_errorf(node, TERN_EDATA,
			                        "pads %lld and %lld remove more than axis %d's %lld elements",
			                        (long long)begin, (long long)end, d, (long long)n);
		pp->keep_begin[d] = cut_begin;
		pp->keep[d] = n - cut_begin - cut_end;
		pp->pad_begin[d] = begin > 0 ? begin : 0;
		pp->out_dims[d] = n + begin + end;
		if (pp->keep[d] == 0 && pp->out_dims[d] > 0 && pp->mode != PAD_CONSTANT)
			return tern_node_errorf(node, TERN_EDATA,
			                        "mode '%s' cannot pad axis %d, which has no elements left", mode, d);
	}
	return TERN_OK;
}

static tern_status pad_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	const tern_node *node = p->node;
	tern_status st = check_copyable(node, x->dtype);
	if (st)
		return st;
	int64_t opset = node->opset;
	int64_t pads[2 * TERN_MAX_RANK], axes[TERN_MAX_RANK];
	int np, na = -1;
	if (opset >= 11 && !input(p, 1))
		return missing_input(node, 1, "pads");
	if ((st = int_list_arg(p, opset >= 11, opset >= 2 ? "pads" : "paddings", 1, pads, 2 * TERN_MAX_RANK, &np)))
		return st;
	if (opset >= 18 && (st = int_list_arg(p, true, "axes", 3, axes, TERN_MAX_RANK, &na)))
		return st;
	if (p->defer)
		return TERN_OK;
	if (np < 0)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'pads' is missing");
	pad_params *pp = calloc(1, sizeof *pp);
	if (!pp)
		return out_of_memory(node);
	char mode_buf[16];
	const char *mode = attr_str(node, "mode", "constant", mode_buf, sizeof mode_buf);
	if ((st = pad_geometry(node, x->dtype, x->rank, x->dims, pads, np, axes, na, mode, opset >= 19, pp))) {
		free(pp);
		return st;
	}
	const tern_tensor *cv = input(p, 2);
	if (opset >= 11) {
		if (cv && cv->dtype != x->dtype)
			st = tern_node_errorf(node, TERN_EDATA, "input 2 'constant_value' is %s, input 0 is %s",
			                      tern_dtype_name(cv->dtype), tern_dtype_name(x->dtype));
		pp->value_input = cv != NULL;
	} else {
		store_f64(x->dtype, pp->value, tern_attr_float(node, "value", 0.0f));
	}
	tern_set_shape(p->out[0], x->dtype, x->rank, pp->out_dims);
	return use_kernel(p, st, pp, pad_kernel);
}

/* ---------------------------------------------------------------- Gather, GatherElements, GatherND */

typedef struct gather_params {
	int axis;
	int64_t outer, n_axis, inner; /* inner in elements; n_axis for the gradient (Gather's kernel reads it
	                               * from its data at every run) */
	size_t es;
	bool string;
} gather_params;

typedef struct gather_job {
	const gather_params *g;
	const tern_tensor *idx;
	const char *src;
	char *dst;
	int64_t n_axis; /* the data's length along the axis in this run (the plan may serve any) */
	int64_t n_idx, rows, n_tasks;
} gather_job;

static void gather_rows(const gather_job *j, int64_t lo, int64_t hi)
{
	const gather_params *g = j->g;
	size_t block = (size_t)g->inner * g->es;
	for (int64_t r = lo; r < hi; r++) {
		int64_t o = r / j->n_idx, k = index_at(j->idx, r % j->n_idx);
		k += k < 0 ? j->n_axis : 0;
		memcpy(j->dst + (size_t)r * block, j->src + (size_t)(o * j->n_axis + k) * block, block);
	}
}

static void gather_task(void *ctx, int64_t t)
{
	const gather_job *j = ctx;
	gather_rows(j, j->rows * t / j->n_tasks, j->rows * (t + 1) / j->n_tasks);
}

static tern_status gather_kernel(const tern_kernel_args *a)
{
	const gather_params *g = a->params;
	/* the data's length along the axis as this run gives it: a plan may serve data of any length
	 * there (tern_value_len_free) */
	int64_t n_axis = a->in[0]->dims[g->axis];
	const tern_tensor *idx = a->in[1];
	int64_t n_idx = tern_tensor_numel(idx);
	tern_status st = check_all_indices(a->node, idx, n_axis, g->axis);
	if (st)
		return st;
	gather_job j = {g, idx, a->in[0]->data, a->out[0]->data, n_axis, n_idx, g->outer * n_idx, 1};
	if (g->string) {
		for (int64_t r = 0; r < j.rows; r++) {
			int64_t o = r / n_idx, k = index_at(idx, r % n_idx);
			k += k < 0 ? n_axis : 0;
			st = copy_elems(a->node, (char **)j.dst + r * g->inner,
			                (char *const *)j.src + (o * n_axis + k) * g->inner, g->inner, g->es, true);
			if (st)
				return st;
		}
		return TERN_OK;
	}
	int threads = a->pool ? tern_threadpool_size(a->pool) : 1;
	int64_t bytes = j.rows * g->inner * (int64_t)g->es;
	if (threads > 1 && j.rows > 1 && bytes >= PARALLEL_MIN_BYTES) {
		j.n_tasks = j.rows < 4 * threads ? j.rows : 4 * threads;
		tern_parallel_for(a->pool, j.n_tasks, gather_task, &j);
	} else {
		gather_rows(&j, 0, j.rows);
	}
	return TERN_OK;
}

static tern_status gather_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *idx = input(p, 1);
	tern_status st = check_copyable(p->node, x->dtype);
	if (!st)
		st = check_indices(p->node, idx, 1);
	if (st)
		return st;
	int axis = 0;
	if ((st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", 0), x->rank, &axis)))
		return st;
	int rank = x->rank - 1 + idx->rank;
	if (rank > TERN_MAX_RANK)
		return tern_node_errorf(p->node, TERN_EDATA, "result rank %d exceeds %d", rank, TERN_MAX_RANK);
	int64_t dims[TERN_MAX_RANK];
	int r = 0;
	for (int d = 0; d < axis; d++)
		dims[r++] = x->dims[d];
	for (int d = 0; d < idx->rank; d++)
		dims[r++] = idx->dims[d];
	for (int d = axis + 1; d < x->rank; d++)
		dims[r++] = x->dims[d];
	tern_set_shape(p->out[0], x->dtype, rank, dims);
	gather_params *g = calloc(1, sizeof *g);
	if (!g)
		return out_of_memory(p->node);
	g->axis = axis;
	g->outer = tern_numel(axis, x->dims);
	g->inner = tern_numel(x->rank - axis - 1, x->dims + axis + 1);
	g->es = elem_size(x->dtype);
	g->string = x->dtype == TERN_STRING;
	return use_kernel(p, TERN_OK, g, gather_kernel);
}

/* Shared by GatherElements and ScatterElements: indices and data have the same rank, and every
 * position of indices names a position of data that differs only along axis. */
typedef struct elements_params {
	int axis, rank;
	int reduction;
	size_t es;
	bool string;
	int64_t idx_dims[TERN_MAX_RANK];
	int64_t data_stride[TERN_MAX_RANK]; /* with the axis stride zeroed: the index supplies it */
	int64_t axis_stride, n_axis;
} elements_params;

static tern_status elements_params_make(tern_prepare_args *p, const tern_tensor *x, const tern_tensor *idx,
                                        elements_params **out)
{
	tern_status st = check_copyable(p->node, x->dtype);
	if (!st)
		st = check_indices(p->node, idx, 1);
	if (st)
		return st;
	char b0[128], b1[128];
	if (idx->rank != x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "indices %s and data %s differ in rank",
		                        shape_str(idx, b1, sizeof b1), shape_str(x, b0, sizeof b0));
	int axis = 0;
	if ((st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", 0), x->rank, &axis)))
		return st;
	for (int d = 0; d < x->rank; d++)
		if (d != axis && idx->dims[d] > x->dims[d])
			return tern_node_errorf(p->node, TERN_EDATA, "indices %s exceed data %s on axis %d",
			                        shape_str(idx, b1, sizeof b1), shape_str(x, b0, sizeof b0), d);
	elements_params *e = calloc(1, sizeof *e);
	if (!e)
		return out_of_memory(p->node);
	e->axis = axis;
	e->rank = x->rank;
	e->es = elem_size(x->dtype);
	e->string = x->dtype == TERN_STRING;
	memcpy(e->idx_dims, idx->dims, sizeof e->idx_dims);
	contiguous_strides(x->rank, x->dims, e->data_stride);
	e->axis_stride = e->data_stride[axis];
	e->data_stride[axis] = 0;
	e->n_axis = x->dims[axis];
	*out = e;
	return TERN_OK;
}

/* Row by row along the last axis, so the multi-index advances once per row. */
#define GATHER_ELEMENTS(ES)                                                                                   \
	for (int64_t r = 0; r < n; r += row) {                                                                \
		for (int64_t i = 0; i < row; i++) {                                                           \
			int64_t k = index_at(idx, r + i);                                                     \
			k += k < 0 ? e->n_axis : 0;                                                           \
			memcpy(dst + (r + i) * (ES), src + (off + i * step + k * e->axis_stride) * (ES), ES); \
		}                                                                                             \
		advance(e->rank - 1, e->idx_dims, pos, e->data_stride, &off);                                 \
	}

static tern_status gather_elements_kernel(const tern_kernel_args *a)
{
	const elements_params *e = a->params;
	const tern_tensor *idx = a->in[1];
	int64_t n = tern_tensor_numel(idx), pos[TERN_MAX_RANK] = {0}, off = 0;
	const char *src = a->in[0]->data;
	char *dst = a->out[0]->data;
	tern_status st = check_all_indices(a->node, idx, e->n_axis, e->axis);
	if (st)
		return st;
	if (e->string) {
		for (int64_t i = 0; i < n; i++) {
			int64_t k = index_at(idx, i);
			k += k < 0 ? e->n_axis : 0;
			if ((st = dup_string(a->node, (char **)dst + i,
			                     ((char *const *)src)[off + k * e->axis_stride])))
				return st;
			advance(e->rank, e->idx_dims, pos, e->data_stride, &off);
		}
		return TERN_OK;
	}
	int64_t row = e->idx_dims[e->rank - 1], step = e->data_stride[e->rank - 1];
	switch (e->es) {
	case 1: GATHER_ELEMENTS(1) break;
	case 2: GATHER_ELEMENTS(2) break;
	case 4: GATHER_ELEMENTS(4) break;
	case 8: GATHER_ELEMENTS(8) break;
	default: GATHER_ELEMENTS((int64_t)e->es) break;
	}
	return TERN_OK;
}

static tern_status gather_elements_prepare(tern_prepare_args *p)
{
	elements_params *e = NULL;
	tern_status st = elements_params_make(p, p->in[0], input(p, 1), &e);
	if (st)
		return st;
	tern_set_shape(p->out[0], p->in[0]->dtype, p->in[1]->rank, p->in[1]->dims);
	return use_kernel(p, TERN_OK, e, gather_elements_kernel);
}

/* Shared by GatherND and ScatterND: the last axis of indices holds tuples that address slices of data. */
typedef struct nd_params {
	int batch_dims, depth; /* depth: tuple length */
	int reduction;
	size_t es;
	bool string;
	int dtype;
	int64_t batches, tuples, slice; /* tuples per batch; elements per slice */
	int64_t batch_stride; /* elements of data per batch */
	int64_t dims[TERN_MAX_RANK], stride[TERN_MAX_RANK]; /* of the addressed data axes */
} nd_params;

static tern_status nd_params_make(tern_prepare_args *p, const tern_tensor *x, const tern_tensor *idx, int batch_dims,
                                  nd_params **out)
{
	tern_status st = check_copyable(p->node, x->dtype);
	if (!st)
		st = check_indices(p->node, idx, 1);
	if (st)
		return st;
	char b0[128], b1[128];
	if (idx->rank < 1 || batch_dims < 0 || batch_dims >= idx->rank || batch_dims >= x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "batch_dims %d does not fit indices %s and data %s",
		                        batch_dims, shape_str(idx, b1, sizeof b1), shape_str(x, b0, sizeof b0));
	int depth = (int)idx->dims[idx->rank - 1];
	if (depth < 1 || depth > x->rank - batch_dims)
		return tern_node_errorf(p->node, TERN_EDATA, "indices %s: last dimension %d must be 1..%d for data %s",
		                        shape_str(idx, b1, sizeof b1), depth, x->rank - batch_dims,
		                        shape_str(x, b0, sizeof b0));
	for (int d = 0; d < batch_dims; d++)
		if (idx->dims[d] != x->dims[d])
			return tern_node_errorf(p->node, TERN_EDATA, "indices %s and data %s differ on batch axis %d",
			                        shape_str(idx, b1, sizeof b1), shape_str(x, b0, sizeof b0), d);
	nd_params *nd = calloc(1, sizeof *nd);
	if (!nd)
		return out_of_memory(p->node);
	nd->batch_dims = batch_dims;
	nd->depth = depth;
	nd->es = elem_size(x->dtype);
	nd->string = x->dtype == TERN_STRING;
	nd->dtype = x->dtype;
	nd->batches = tern_numel(batch_dims, x->dims);
	nd->tuples = tern_numel(idx->rank - 1 - batch_dims, idx->dims + batch_dims);
	nd->slice = tern_numel(x->rank - batch_dims - depth, x->dims + batch_dims + depth);
	nd->batch_stride = tern_numel(x->rank - batch_dims, x->dims + batch_dims);
	int64_t stride[TERN_MAX_RANK];
	contiguous_strides(x->rank, x->dims, stride);
	for (int k = 0; k < depth; k++) {
		nd->dims[k] = x->dims[batch_dims + k];
		nd->stride[k] = stride[batch_dims + k];
	}
	*out = nd;
	return TERN_OK;
}

/* Element offset into data of tuple t (of all tuples, batches included). */
static tern_status nd_offset(const tern_node *node, const nd_params *nd, const tern_tensor *idx, int64_t t,
                             int64_t *off)
{
	int64_t o = (t / nd->tuples) * nd->batch_stride;
	for (int k = 0; k < nd->depth; k++) {
		int64_t v = index_at(idx, t * nd->depth + k);
		tern_status st = fix_index(node, &v, nd->dims[k], t * nd->depth + k, nd->batch_dims + k);
		if (st)
			return st;
		o += v * nd->stride[k];
	}
	*off = o;
	return TERN_OK;
}

static tern_status gather_nd_kernel(const tern_kernel_args *a)
{
	const nd_params *nd = a->params;
	const char *src = a->in[0]->data;
	char *dst = a->out[0]->data;
	for (int64_t t = 0; t < nd->batches * nd->tuples; t++) {
		int64_t off;
		tern_status st = nd_offset(a->node, nd, a->in[1], t, &off);
		if (!st)
			st = copy_elems(a->node, dst + (size_t)(t * nd->slice) * nd->es, src + (size_t)off * nd->es,
			                nd->slice, nd->es, nd->string);
		if (st)
			return st;
	}
	return TERN_OK;
}

static tern_status gather_nd_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *idx = input(p, 1);
	nd_params *nd = NULL;
	tern_status st = nd_params_make(p, x, idx, (int)tern_attr_int(p->node, "batch_dims", 0), &nd);
	if (st)
		return st;
	int64_t dims[2 * TERN_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < idx->rank - 1; d++)
		dims[rank++] = idx->dims[d];
	for (int d = nd->batch_dims + nd->depth; d < x->rank; d++)
		dims[rank++] = x->dims[d];
	if (rank > TERN_MAX_RANK) {
		free(nd);
		return tern_node_errorf(p->node, TERN_EDATA, "result rank %d exceeds %d", rank, TERN_MAX_RANK);
	}
	tern_set_shape(p->out[0], x->dtype, rank, dims);
	return use_kernel(p, TERN_OK, nd, gather_nd_kernel);
}

/* ---------------------------------------------------------------- ScatterElements, Scatter, ScatterND */

enum reduction { REDUCE_NONE, REDUCE_ADD, REDUCE_MUL, REDUCE_MAX, REDUCE_MIN };

/* max and min propagate NaN, as NumPy's maximum and minimum do. */
#define COMBINE(r, a, b)                                                      \
	((r) == REDUCE_ADD           ? (a) + (b)                              \
	         : (r) == REDUCE_MUL ? (a) * (b)                              \
	         : (r) == REDUCE_MAX ? ((a) != (a) || (a) >= (b) ? (a) : (b)) \
	                             : ((a) != (a) || (a) <= (b) ? (a) : (b)))

#define REDUCE_NATIVE(DT, T)                           \
	case DT: {                                     \
		T *d = dst;                            \
		const T *s = src;                      \
		for (int64_t i = 0; i < n; i++)        \
			d[i] = COMBINE(r, d[i], s[i]); \
		return;                                \
	}

/* Integer sums and products wrap instead of overflowing. */
#define REDUCE_INT(DT, T, U)                                                \
	case DT: {                                                          \
		T *d = dst;                                                 \
		const T *s = src;                                           \
		for (int64_t i = 0; i < n; i++)                             \
			d[i] = r == REDUCE_ADD    ? (T)((U)d[i] + (U)s[i])  \
			        : r == REDUCE_MUL ? (T)((U)d[i] * (U)s[i])  \
			                          : COMBINE(r, d[i], s[i]); \
		return;                                                     \
	}

#define REDUCE_HALF(DT, TO, FROM)                         \
	case DT: {                                        \
		uint16_t *d = dst;                        \
		const uint16_t *s = src;                  \
		for (int64_t i = 0; i < n; i++) {         \
			float x = TO(d[i]), y = TO(s[i]); \
			d[i] = FROM(COMBINE(r, x, y));    \
		}                                         \
		return;                                   \
	}

/* dst[i] = dst[i] (op) src[i] for n elements of dtype. */
static void reduce_into(int dtype, int r, void *dst, const void *src, int64_t n)
{
	switch (dtype) {
		REDUCE_NATIVE(TERN_FLOAT, float)
		REDUCE_NATIVE(TERN_DOUBLE, double)
		REDUCE_HALF(TERN_FLOAT16, tern_f16_to_f32, tern_f32_to_f16)
		REDUCE_HALF(TERN_BFLOAT16, tern_bf16_to_f32, tern_f32_to_bf16)
		REDUCE_INT(TERN_INT8, int8_t, uint32_t)
		REDUCE_INT(TERN_INT16, int16_t, uint32_t)
		REDUCE_INT(TERN_INT32, int32_t, uint32_t)
		REDUCE_INT(TERN_INT64, int64_t, uint64_t)
		REDUCE_INT(TERN_UINT8, uint8_t, uint32_t)
		REDUCE_INT(TERN_UINT16, uint16_t, uint32_t)
		REDUCE_INT(TERN_UINT32, uint32_t, uint32_t)
		REDUCE_INT(TERN_UINT64, uint64_t, uint64_t)
	default: return;
	}
}

static tern_status reduction_attr(const tern_node *node, int dtype, int *out)
{
	char buf[16];
	const char *name = attr_str(node, "reduction", "none", buf, sizeof buf);
	static const char *const names[] = {"none", "add", "mul", "max", "min"};
	for (int r = 0; r < (int)TERN_ARRAY_LEN(names); r++)
		if (strcmp(name, names[r]) == 0) {
			*out = r;
			if (r != REDUCE_NONE &&
			    (dtype == TERN_STRING || dtype == TERN_BOOL || !(TERN_DT_NUMERIC & (1u << dtype))))
				return tern_node_errorf(node, TERN_EDATA, "reduction '%s' is not supported for %s",
				                        name, tern_dtype_name(dtype));
			return TERN_OK;
		}
	return tern_node_errorf(node, TERN_EDATA, "reduction '%s' is not none, add, mul, max or min", name);
}

/* Writes n updates at dst: a plain store, or a reduction with what is there. */
static tern_status scatter_store(const tern_node *node, int dtype, int reduction, size_t es, void *dst, const void *src,
                                 int64_t n)
{
	if (reduction != REDUCE_NONE) {
		reduce_into(dtype, reduction, dst, src, n);
		return TERN_OK;
	}
	if (dtype == TERN_STRING)
		free_strings(dst, n);
	return copy_elems(node, dst, src, n, es, dtype == TERN_STRING);
}

static tern_status scatter_elements_kernel(const tern_kernel_args *a)
{
	const elements_params *e = a->params;
	const tern_tensor *x = a->in[0], *idx = a->in[1];
	char *dst = a->out[0]->data;
	const char *upd = a->in[2]->data;
	int64_t n = tern_tensor_numel(idx), pos[TERN_MAX_RANK] = {0}, off = 0;
	tern_status st = check_all_indices(a->node, idx, e->n_axis, e->axis);
	if (!st)
		st = copy_elems(a->node, dst, x->data, tern_tensor_numel(x), e->es, e->string);
	for (int64_t i = 0; !st && i < n; i++) {
		int64_t k = index_at(idx, i);
		k += k < 0 ? e->n_axis : 0;
		st = scatter_store(a->node, x->dtype, e->reduction, e->es,
		                   dst + (size_t)(off + k * e->axis_stride) * e->es, upd + (size_t)i * e->es, 1);
		advance(e->rank, e->idx_dims, pos, e->data_stride, &off);
	}
	return st;
}

static tern_status scatter_elements_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *idx = input(p, 1), *upd = input(p, 2);
	if (!upd)
		return missing_input(p->node, 2, "updates");
	elements_params *e = NULL;
	tern_status st = elements_params_make(p, x, idx, &e);
	if (st)
		return st;
	char b0[128], b1[128];
	bool same = upd->rank == idx->rank && upd->dtype == x->dtype;
	for (int d = 0; same && d < idx->rank; d++)
		same = upd->dims[d] == idx->dims[d];
	if (!same)
		st = tern_node_errorf(p->node, TERN_EDATA, "updates %s do not match indices shape and data dtype (%s)",
		                      shape_str(upd, b0, sizeof b0), shape_str(idx, b1, sizeof b1));
	if (!st && strcmp(p->node->op_type, "Scatter") != 0)
		st = reduction_attr(p->node, x->dtype, &e->reduction);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	return use_kernel(p, st, e, scatter_elements_kernel);
}

static tern_status scatter_nd_kernel(const tern_kernel_args *a)
{
	const nd_params *nd = a->params;
	const tern_tensor *x = a->in[0], *idx = a->in[1];
	char *dst = a->out[0]->data;
	const char *upd = a->in[2]->data;
	int64_t off;
	for (int64_t t = 0; t < nd->tuples; t++) {
		tern_status st = nd_offset(a->node, nd, idx, t, &off);
		if (st)
			return st;
	}
	tern_status st = copy_elems(a->node, dst, x->data, tern_tensor_numel(x), nd->es, nd->string);
	for (int64_t t = 0; !st && t < nd->tuples; t++) {
		nd_offset(a->node, nd, idx, t, &off);
		st = scatter_store(a->node, nd->dtype, nd->reduction, nd->es, dst + (size_t)off * nd->es,
		                   upd + (size_t)(t * nd->slice) * nd->es, nd->slice);
	}
	return st;
}

static tern_status scatter_nd_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *idx = input(p, 1), *upd = input(p, 2);
	if (!upd)
		return missing_input(p->node, 2, "updates");
	nd_params *nd = NULL;
	tern_status st = nd_params_make(p, x, idx, 0, &nd);
	if (st)
		return st;
	/* updates must have shape indices.shape[:-1] + data.shape[depth:]. */
	int64_t want[2 * TERN_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < idx->rank - 1; d++)
		want[rank++] = idx->dims[d];
	for (int d = nd->depth; d < x->rank; d++)
		want[rank++] = x->dims[d];
	bool same = upd->rank == rank && upd->dtype == x->dtype;
	for (int d = 0; same && d < rank; d++)
		same = upd->dims[d] == want[d];
	char b0[128], b1[128], b2[128];
	if (!same)
		st = tern_node_errorf(p->node, TERN_EDATA, "updates %s do not fit indices %s and data %s",
		                      shape_str(upd, b0, sizeof b0), shape_str(idx, b1, sizeof b1),
		                      shape_str(x, b2, sizeof b2));
	if (!st)
		st = reduction_attr(p->node, x->dtype, &nd->reduction);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	return use_kernel(p, st, nd, scatter_nd_kernel);
}

/* ---------------------------------------------------------------- backward operators: tern.PadGrad, tern.GatherGrad,
 * tern.GatherElementsGrad, tern.GatherNDGrad */

/* *dst += *src for one element. */
static inline void add_one(int dtype, char *dst, const char *src)
{
	if (dtype == TERN_FLOAT)
		*(float *)dst += *(const float *)src;
	else if (dtype == TERN_DOUBLE)
		*(double *)dst += *(const double *)src;
	else
		reduce_into(dtype, REDUCE_ADD, dst, src, 1);
}

static void zero_output(tern_tensor *t)
{
	size_t bytes = (size_t)tern_tensor_numel(t) * tern_dtype_size(t->dtype);
	if (bytes)
		memset(t->data, 0, bytes);
}

/* tern.PadGrad(dY, shape, pads, axes) with Pad's mode: the gradient of Pad for an input of `shape`, each
 * element of dY added to the input element Pad read it from (the constant's elements add nothing). */
static tern_status pad_grad_kernel(const tern_kernel_args *a)
{
	const pad_params *pp = a->params;
	tern_tensor *dx = a->out[0];
	zero_output(dx);
	int r = pp->rank, last = r - 1, dtype = dx->dtype;
	int64_t out_n = tern_numel(r, pp->out_dims), row_len = pp->out_dims[last];
	if (out_n == 0)
		return TERN_OK;
	int64_t in_stride[TERN_MAX_RANK], idx[TERN_MAX_RANK] = {0};
	contiguous_strides(r, pp->in_dims, in_stride);
	const char *src = a->in[0]->data;
	char *dst = dx->data;
	size_t es = pp->es;
	for (int64_t row = 0; row < out_n / row_len; row++) {
		int64_t base = 0;
		bool constant_row = false;
		for (int k = 0; k < last && !constant_row; k++) {
			int64_t s = pad_source(pp, k, idx[k]);
			constant_row = s < 0;
			base += s * in_stride[k];
		}
		const char *s = src + (size_t)(row * row_len) * es;
		for (int64_t o = 0; !constant_row && o < row_len; o++) {
			int64_t j = pad_source(pp, last, o);
			if (j >= 0)
				add_one(dtype, dst + (size_t)(base + j) * es, s + (size_t)o * es);
		}
		for (int k = last - 1; k >= 0; k--) {
			if (++idx[k] < pp->out_dims[k])
				break;
			idx[k] = 0;
		}
	}
	return TERN_OK;
}

static tern_status pad_grad_prepare(tern_prepare_args *p)
{
	const tern_tensor *dy = p->in[0];
	const tern_node *node = p->node;
	int64_t shape[TERN_MAX_RANK], pads[2 * TERN_MAX_RANK], axes[TERN_MAX_RANK];
	int nr, np, na;
	tern_status st;
	if (!input(p, 2))
		return missing_input(node, 2, "pads");
	if ((st = shape_input(p, 1, shape, &nr)) ||
	    (st = int_list_arg(p, true, "pads", 2, pads, 2 * TERN_MAX_RANK, &np)) ||
	    (st = int_list_arg(p, true, "axes", 3, axes, TERN_MAX_RANK, &na)))
		return st;
	if (p->defer)
		return TERN_OK;
	pad_params *pp = calloc(1, sizeof *pp);
	if (!pp)
		return out_of_memory(node);
	char mode_buf[16];
	const char *mode = attr_str(node, "mode", "constant", mode_buf, sizeof mode_buf);
	if (!(st = pad_geometry(node, dy->dtype, nr, shape, pads, np, axes, na, mode, true, pp)))
		st = check_grad_shape(node, dy, nr, pp->out_dims);
	tern_set_shape(p->out[0], dy->dtype, nr, shape);
	return use_kernel(p, st, pp, pad_grad_kernel);
}

/* The data tensor a backward gather operator writes: dY's element type, input 1's shape. */
static tern_status grad_data_shape(tern_prepare_args *p, tern_tensor *x)
{
	int64_t shape[TERN_MAX_RANK];
	int n;
	tern_status st = shape_input(p, 1, shape, &n);
	if (st || p->defer)
		return st;
	memset(x, 0, sizeof *x);
	x->dtype = p->in[0]->dtype;
	x->rank = n;
	memcpy(x->dims, shape, (size_t)n * sizeof *shape);
	return check_indices(p->node, input(p, 2), 2);
}

/* tern.GatherGrad(dY, shape, indices) with Gather's axis: zeros of `shape` with each row of dY added
 * where Gather(X, indices) read it — the gradient of Gather's data. */
static tern_status gather_grad_kernel(const tern_kernel_args *a)
{
	const gather_params *g = a->params;
	const tern_tensor *dy = a->in[0], *idx = a->in[2];
	tern_tensor *dx = a->out[0];
	tern_status st = check_all_indices(a->node, idx, g->n_axis, g->axis);
	if (st)
		return st;
	zero_output(dx);
	int64_t n_idx = tern_tensor_numel(idx);
	const char *src = dy->data;
	char *dst = dx->data;
	for (int64_t r = 0; r < g->outer * n_idx; r++) {
		int64_t o = r / n_idx, k = index_at(idx, r % n_idx);
		k += k < 0 ? g->n_axis : 0;
		reduce_into(dx->dtype, REDUCE_ADD, dst + (size_t)((o * g->n_axis + k) * g->inner) * g->es,
		            src + (size_t)(r * g->inner) * g->es, g->inner);
	}
	return TERN_OK;
}

static tern_status gather_grad_prepare(tern_prepare_args *p)
{
	tern_tensor x;
	tern_status st = grad_data_shape(p, &x);
	if (st || p->defer)
		return st;
	const tern_tensor *idx = p->in[2];
	int axis = 0;
	if ((st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", 0), x.rank, &axis)))
		return st;
	int64_t dims[2 * TERN_MAX_RANK];
	int r = 0;
	for (int d = 0; d < axis; d++)
		dims[r++] = x.dims[d];
	for (int d = 0; d < idx->rank; d++)
		dims[r++] = idx->dims[d];
	for (int d = axis + 1; d < x.rank; d++)
		dims[r++] = x.dims[d];
	if ((st = check_grad_shape(p->node, p->in[0], r, dims)))
		return st;
	tern_set_shape(p->out[0], x.dtype, x.rank, x.dims);
	gather_params *g = calloc(1, sizeof *g);
	if (!g)
		return out_of_memory(p->node);
	g->axis = axis;
	g->outer = tern_numel(axis, x.dims);
	g->n_axis = x.dims[axis];
	g->inner = tern_numel(x.rank - axis - 1, x.dims + axis + 1);
	g->es = elem_size(x.dtype);
	return use_kernel(p, TERN_OK, g, gather_grad_kernel);
}

/* tern.GatherElementsGrad(dY, shape, indices) with GatherElements' axis: zeros of `shape` with each
 * element of dY added where GatherElements(X, indices) read it (also the gradient of TopK's values). */
static tern_status gather_elements_grad_kernel(const tern_kernel_args *a)
{
	const elements_params *e = a->params;
	const tern_tensor *idx = a->in[2];
	tern_tensor *dx = a->out[0];
	tern_status st = check_all_indices(a->node, idx, e->n_axis, e->axis);
	if (st)
		return st;
	zero_output(dx);
	int64_t n = tern_tensor_numel(idx), pos[TERN_MAX_RANK] = {0}, off = 0;
	const char *src = a->in[0]->data;
	char *dst = dx->data;
	for (int64_t i = 0; i < n; i++) {
		int64_t k = index_at(idx, i);
		k += k < 0 ? e->n_axis : 0;
		add_one(dx->dtype, dst + (size_t)(off + k * e->axis_stride) * e->es, src + (size_t)i * e->es);
		advance(e->rank, e->idx_dims, pos, e->data_stride, &off);
	}
	return TERN_OK;
}

static tern_status gather_elements_grad_prepare(tern_prepare_args *p)
{
	tern_tensor x;
	tern_status st = grad_data_shape(p, &x);
	if (st || p->defer)
		return st;
	const tern_tensor *idx = p->in[2];
	elements_params *e = NULL;
	if ((st = check_grad_shape(p->node, p->in[0], idx->rank, idx->dims)) ||
	    (st = elements_params_make(p, &x, idx, &e)))
		return st;
	tern_set_shape(p->out[0], x.dtype, x.rank, x.dims);
	return use_kernel(p, TERN_OK, e, gather_elements_grad_kernel);
}

/* tern.GatherNDGrad(dY, shape, indices) with GatherND's batch_dims: zeros of `shape` with each slice of
 * dY added where GatherND(X, indices) read it. */
static tern_status gather_nd_grad_kernel(const tern_kernel_args *a)
{
	const nd_params *nd = a->params;
	tern_tensor *dx = a->out[0];
	int64_t n = nd->batches * nd->tuples, off;
	for (int64_t t = 0; t < n; t++) {
		tern_status st = nd_offset(a->node, nd, a->in[2], t, &off);
		if (st)
			return st;
	}
	zero_output(dx);
	const char *src = a->in[0]->data;
	char *dst = dx->data;
	for (int64_t t = 0; t < n; t++) {
		nd_offset(a->node, nd, a->in[2], t, &off);
		reduce_into(dx->dtype, REDUCE_ADD, dst + (size_t)off * nd->es, src + (size_t)(t * nd->slice) * nd->es,
		            nd->slice);
	}
	return TERN_OK;
}

static tern_status gather_nd_grad_prepare(tern_prepare_args *p)
{
	tern_tensor x;
	tern_status st = grad_data_shape(p, &x);
	if (st || p->defer)
		return st;
	const tern_tensor *idx = p->in[2];
	nd_params *nd = NULL;
	if ((st = nd_params_make(p, &x, idx, (int)tern_attr_int(p->node, "batch_dims", 0), &nd)))
		return st;
	int64_t dims[2 * TERN_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < idx->rank - 1; d++)
		dims[rank++] = idx->dims[d];
	for (int d = nd->batch_dims + nd->depth; d < x.rank; d++)
		dims[rank++] = x.dims[d];
	st = check_grad_shape(p->node, p->in[0], rank, dims);
	tern_set_shape(p->out[0], x.dtype, x.rank, x.dims);
	return use_kernel(p, st, nd, gather_nd_grad_kernel);
}

/* ---------------------------------------------------------------- Shape, Size, ConstantOfShape, Constant */

typedef struct shape_params {
	int start, end;
} shape_params;

static tern_status shape_kernel(const tern_kernel_args *a)
{
	const shape_params *sp = a->params;
	int64_t *y = a->out[0]->data;
	for (int d = sp->start; d < sp->end; d++)
		y[d - sp->start] = a->in[0]->dims[d];
	return TERN_OK;
}

static int clamp_rank_index(int64_t v, int rank)
{
	v += v < 0 ? rank : 0;
	return (int)(v < 0 ? 0 : v > rank ? rank : v);
}

static tern_status shape_prepare(tern_prepare_args *p)
{
	int rank = p->in[0]->rank;
	shape_params *sp = malloc(sizeof *sp);
	if (!sp)
		return out_of_memory(p->node);
	sp->start = clamp_rank_index(tern_attr_int(p->node, "start", 0), rank);
	sp->end = tern_attr(p->node, "end") ? clamp_rank_index(tern_attr_int(p->node, "end", rank), rank) : rank;
	if (sp->end < sp->start)
		sp->end = sp->start;
	int64_t n = sp->end - sp->start;
	tern_set_shape(p->out[0], TERN_INT64, 1, &n);
	return use_kernel(p, TERN_OK, sp, shape_kernel);
}

static tern_status size_kernel(const tern_kernel_args *a)
{
	*(int64_t *)a->out[0]->data = tern_tensor_numel(a->in[0]);
	return TERN_OK;
}

static tern_status size_prepare(tern_prepare_args *p)
{
	tern_set_shape(p->out[0], TERN_INT64, 0, NULL);
	p->kernel = size_kernel;
	return TERN_OK;
}

/* A tensor the kernel copies to output 0 (Constant's value; ConstantOfShape's one element). */
static void free_tensor_params(void *params)
{
	if (params)
		tern_tensor_free(params);
	free(params);
}

static tern_status constant_kernel(const tern_kernel_args *a)
{
	const tern_tensor *t = a->params;
	return copy_elems(a->node, a->out[0]->data, t->data, tern_tensor_numel(t), elem_size(t->dtype),
	                  t->dtype == TERN_STRING);
}

static tern_status constant_value(const tern_node *node, tern_tensor *t)
{
	const Onnx__AttributeProto *at;
	if ((at = tern_attr(node, "value")) && at->t) {
		const char *base = node->graph && node->graph->model ? node->graph->model->base_dir : NULL;
		tern_status st = tern_tensor_from_proto(at->t, base, "value", t);
		return st ? tern_node_errorf(node, st, "attribute 'value': %s", tern_error()) : TERN_OK;
	}
	if (tern_attr(node, "sparse_value"))
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'sparse_value' (a sparse constant) is not supported");
	if ((at = tern_attr(node, "value_float"))) {
		if (tern_tensor_alloc(t, TERN_FLOAT, 0, NULL))
			return out_of_memory(node);
		*(float *)t->data = at->f;
	} else if ((at = tern_attr(node, "value_int"))) {
		if (tern_tensor_alloc(t, TERN_INT64, 0, NULL))
			return out_of_memory(node);
		*(int64_t *)t->data = at->i;
	} else if ((at = tern_attr(node, "value_floats"))) {
		int64_t n = (int64_t)at->n_floats;
		if (tern_tensor_alloc(t, TERN_FLOAT, 1, &n))
			return out_of_memory(node);
		if (n)
			memcpy(t->data, at->floats, (size_t)n * sizeof(float));
	} else if ((at = tern_attr(node, "value_ints"))) {
		int64_t n = (int64_t)at->n_ints;
		if (tern_tensor_alloc(t, TERN_INT64, 1, &n))
			return out_of_memory(node);
		if (n)
			memcpy(t->data, at->ints, (size_t)n * sizeof(int64_t));
	} else if ((at = tern_attr(node, "value_string")) || (at = tern_attr(node, "value_strings"))) {
		bool many = !at->has_s;
		int64_t n = many ? (int64_t)at->n_strings : 1;
		if (tern_tensor_alloc(t, TERN_STRING, many, &n))
			return out_of_memory(node);
		char **s = t->data;
		for (int64_t i = 0; i < n; i++) {
			const ProtobufCBinaryData *b = many ? &at->strings[i] : &at->s;
			if (!(s[i] = malloc(b->len + 1)))
				return out_of_memory(node);
			memcpy(s[i], b->data, b->len);
			s[i][b->len] = '\0';
		}
	} else {
		return tern_node_errorf(node, TERN_EDATA,
		                        "no value attribute (value, value_float(s), value_int(s), "
		                        "value_string(s))");
	}
	return TERN_OK;
}

static tern_status constant_prepare(tern_prepare_args *p)
{
	tern_tensor *t = calloc(1, sizeof *t);
	if (!t)
		return out_of_memory(p->node);
	tern_status st = constant_value(p->node, t);
	if (st) {
		free_tensor_params(t);
		return st;
	}
	tern_set_shape(p->out[0], t->dtype, t->rank, t->dims);
	p->params = t;
	p->free_params = free_tensor_params;
	p->kernel = constant_kernel;
	return TERN_OK;
}

static tern_status constant_of_shape_kernel(const tern_kernel_args *a)
{
	const tern_tensor *v = a->params;
	return fill_elems(a->node, a->out[0]->data, v->data, tern_tensor_numel(a->out[0]), elem_size(v->dtype),
	                  v->dtype == TERN_STRING);
}

static tern_status constant_of_shape_prepare(tern_prepare_args *p)
{
	int64_t shape[TERN_MAX_RANK];
	int n;
	tern_status st = int_list_arg(p, true, "input", 0, shape, TERN_MAX_RANK, &n);
	if (st || p->defer)
		return st;
	for (int i = 0; i < n; i++)
		if (shape[i] < 0)
			return tern_node_errorf(p->node, TERN_EDATA, "shape[%d] = %lld is negative", i,
			                        (long long)shape[i]);
	tern_tensor *v = calloc(1, sizeof *v);
	if (!v)
		return out_of_memory(p->node);
	const Onnx__AttributeProto *at = tern_attr(p->node, "value");
	if (at && at->t) {
		const char *base = p->node->graph && p->node->graph->model ? p->node->graph->model->base_dir : NULL;
		st = tern_tensor_from_proto(at->t, base, "value", v);
		if (st)
			st = tern_node_errorf(p->node, st, "attribute 'value': %s", tern_error());
		else if (tern_tensor_numel(v) != 1)
			st = tern_node_errorf(p->node, TERN_EDATA, "attribute 'value' has %lld elements, not 1",
			                      (long long)tern_tensor_numel(v));
	} else if (tern_tensor_alloc(v, TERN_FLOAT, 0, NULL)) {
		st = out_of_memory(p->node);
	}
	if (st) {
		free_tensor_params(v);
		return st;
	}
	tern_set_shape(p->out[0], v->dtype, n, shape);
	p->params = v;
	p->free_params = free_tensor_params;
	p->kernel = constant_of_shape_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- Range */

#define RANGE_INT(T)                                                                          \
	{                                                                                     \
		int64_t s = tern_tensor_get_i64(start, 0), d = tern_tensor_get_i64(delta, 0); \
		T *o = y->data;                                                               \
		for (int64_t i = 0; i < n; i++)                                               \
			o[i] = (T)(s + i * d);                                                \
	}

static tern_status range_kernel(const tern_kernel_args *a)
{
	const tern_tensor *start = a->in[0], *delta = a->in[2];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(y);
	switch (y->dtype) {
	case TERN_FLOAT: {
		float s = *(const float *)start->data, d = *(const float *)delta->data, *o = y->data;
		for (int64_t i = 0; i < n; i++)
			o[i] = s + (float)i * d;
		break;
	}
	case TERN_DOUBLE: {
		double s = *(const double *)start->data, d = *(const double *)delta->data, *o = y->data;
		for (int64_t i = 0; i < n; i++)
			o[i] = s + (double)i * d;
		break;
	}
	case TERN_INT16: RANGE_INT(int16_t) break;
	case TERN_INT32: RANGE_INT(int32_t) break;
	default: RANGE_INT(int64_t) break;
	}
	return TERN_OK;
}

static tern_status range_prepare(tern_prepare_args *p)
{
	static const char *const names[] = {"start", "limit", "delta"};
	int dtype = p->in[0]->dtype;
	for (int i = 0; i < 3; i++) {
		const tern_tensor *t = input(p, i);
		if (!t)
			return missing_input(p->node, i, names[i]);
		if (t->dtype != dtype || tern_tensor_numel(t) != 1)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input %d '%s' must be a scalar of input 0's type %s", i, names[i],
			                        tern_dtype_name(dtype));
	}
	if (!(dtype == TERN_FLOAT || dtype == TERN_DOUBLE || dtype == TERN_INT16 || dtype == TERN_INT32 ||
	      dtype == TERN_INT64))
		return tern_node_errorf(p->node, TERN_EDATA, "dtype %s is not supported", tern_dtype_name(dtype));
	for (int i = 0; i < 3; i++)
		if (defer_for(p, i))
			return TERN_OK;
	int64_t n;
	if (dtype == TERN_FLOAT || dtype == TERN_DOUBLE) {
		double s = tern_tensor_get_f64(p->in[0], 0), l = tern_tensor_get_f64(p->in[1], 0);
		double d = tern_tensor_get_f64(p->in[2], 0);
		double count = ceil((l - s) / d);
		if (d == 0 || !(count < 1e15))
			return tern_node_errorf(p->node, TERN_EDATA, "range %g to %g by %g has no finite length", s, l,
			                        d);
		n = count > 0 ? (int64_t)count : 0;
	} else {
		int64_t s = tern_tensor_get_i64(p->in[0], 0), l = tern_tensor_get_i64(p->in[1], 0);
		int64_t d = tern_tensor_get_i64(p->in[2], 0);
		if (d == 0)
			return tern_node_errorf(p->node, TERN_EDATA, "delta is 0");
		/* Differences of int64 values can overflow; long double keeps them exact enough for a count. */
		long double span = (long double)l - (long double)s;
		long double count = ceill(span / (long double)d);
		if (count > 1e15L)
			return tern_node_errorf(p->node, TERN_EDATA, "range %lld to %lld by %lld is too long",
			                        (long long)s, (long long)l, (long long)d);
		n = count > 0 ? (int64_t)count : 0;
	}
	tern_set_shape(p->out[0], dtype, 1, &n);
	p->kernel = range_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- OneHot */

typedef struct one_hot_params {
	int64_t outer, depth, inner;
	size_t es;
	bool string;
} one_hot_params;

static tern_status one_hot_kernel(const tern_kernel_args *a)
{
	const one_hot_params *oh = a->params;
	const tern_tensor *idx = a->in[0];
	const char *values = a->in[2]->data;
	char *dst = a->out[0]->data;
	size_t es = oh->es;
	/* Indices outside [-depth, depth) select no position: the whole line stays off. */
	for (int64_t o = 0; o < oh->outer; o++)
		for (int64_t d = 0; d < oh->depth; d++)
			for (int64_t i = 0; i < oh->inner; i++) {
				int64_t k = tern_tensor_get_i64(idx, o * oh->inner + i);
				k += k < 0 ? oh->depth : 0;
				size_t at = (size_t)((o * oh->depth + d) * oh->inner + i) * es;
				tern_status st =
				        copy_elems(a->node, dst + at, values + (k == d ? es : 0), 1, es, oh->string);
				if (st)
					return st;
			}
	return TERN_OK;
}

static tern_status one_hot_prepare(tern_prepare_args *p)
{
	const tern_tensor *idx = p->in[0], *depth = input(p, 1), *values = input(p, 2);
	if (!depth || !values)
		return missing_input(p->node, depth ? 2 : 1, depth ? "values" : "depth");
	if (!(TERN_DT_NUMERIC & (1u << idx->dtype)) || !(TERN_DT_NUMERIC & (1u << depth->dtype)))
		return tern_node_errorf(p->node, TERN_EDATA, "indices (%s) and depth (%s) must be numeric",
		                        tern_dtype_name(idx->dtype), tern_dtype_name(depth->dtype));
	if (tern_tensor_numel(depth) != 1 || tern_tensor_numel(values) != 2)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "depth has %lld elements (1 expected), values %lld (2 expected)",
		                        (long long)tern_tensor_numel(depth), (long long)tern_tensor_numel(values));
	tern_status st = check_copyable(p->node, values->dtype);
	if (st || defer_for(p, 1))
		return st;
	int64_t n = (int64_t)tern_tensor_get_f64(depth, 0);
	if (n < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "depth %lld must be positive", (long long)n);
	int rank = idx->rank + 1, axis = 0;
	if (rank > TERN_MAX_RANK)
		return tern_node_errorf(p->node, TERN_EDATA, "result rank %d exceeds %d", rank, TERN_MAX_RANK);
	if ((st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", -1), rank, &axis)))
		return st;
	int64_t dims[TERN_MAX_RANK];
	for (int d = 0, j = 0; d < rank; d++)
		dims[d] = d == axis ? n : idx->dims[j++];
	tern_set_shape(p->out[0], values->dtype, rank, dims);
	one_hot_params *oh = malloc(sizeof *oh);
	if (!oh)
		return out_of_memory(p->node);
	oh->outer = tern_numel(axis, idx->dims);
	oh->depth = n;
	oh->inner = tern_numel(idx->rank - axis, idx->dims + axis);
	oh->es = elem_size(values->dtype);
	oh->string = values->dtype == TERN_STRING;
	return use_kernel(p, TERN_OK, oh, one_hot_kernel);
}

/* ---------------------------------------------------------------- Trilu, EyeLike */

static tern_status trilu_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0], *kt = kernel_input(a, 1);
	tern_tensor *y = a->out[0];
	bool upper = tern_attr_int(a->node, "upper", 1) != 0;
	int64_t k = kt && tern_tensor_numel(kt) > 0 ? tern_tensor_get_i64(kt, 0) : 0;
	int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
	int64_t mats = tern_numel(x->rank - 2, x->dims);
	bool string = x->dtype == TERN_STRING;
	size_t es = elem_size(x->dtype);
	char zero[16] = {0};
	const char *empty = "";
	const void *zv = string ? (const void *)&empty : zero;
	/* k outside [-rows, cols] only decides whether everything or nothing is kept: clamp to avoid overflow. */
	k = k < -rows ? -rows - 1 : k > cols ? cols + 1 : k;
	for (int64_t m = 0; m < mats; m++)
		for (int64_t i = 0; i < rows; i++) {
			size_t row = (size_t)((m * rows + i) * cols) * es;
			const char *s = (const char *)x->data + row;
			char *d = (char *)y->data + row;
			/* Kept columns: upper keeps j >= i + k, lower keeps j <= i + k. */
			int64_t edge = i + k + (upper ? 0 : 1);
			edge = edge < 0 ? 0 : edge > cols ? cols : edge;
			int64_t keep_lo = upper ? edge : 0, keep_hi = upper ? cols : edge;
			tern_status st = fill_elems(a->node, d, zv, keep_lo, es, string);
			if (!st)
				st = copy_elems(a->node, d + (size_t)keep_lo * es, s + (size_t)keep_lo * es,
				                keep_hi - keep_lo, es, string);
			if (!st)
				st = fill_elems(a->node, d + (size_t)keep_hi * es, zv, cols - keep_hi, es, string);
			if (st)
				return st;
		}
	return TERN_OK;
}

static tern_status trilu_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *k = input(p, 1);
	tern_status st = check_copyable(p->node, x->dtype);
	if (st)
		return st;
	if (x->rank < 2)
		return tern_node_errorf(p->node, TERN_EDATA, "input must have rank 2 or more, has rank %d", x->rank);
	if (k && (!is_index_dtype(k->dtype) || tern_tensor_numel(k) != 1))
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'k' must be an int64 scalar");
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->kernel = trilu_kernel;
	return TERN_OK;
}

typedef struct eye_params {
	int64_t k;
	unsigned char one[16];
} eye_params;

static tern_status eye_like_kernel(const tern_kernel_args *a)
{
	const eye_params *ep = a->params;
	tern_tensor *y = a->out[0];
	size_t es = tern_dtype_size(y->dtype);
	int64_t rows = y->dims[0], cols = y->dims[1];
	memset(y->data, 0, (size_t)(rows * cols) * es);
	for (int64_t i = 0; i < rows; i++) {
		int64_t j = i + ep->k;
		if (j >= 0 && j < cols)
			memcpy((char *)y->data + (size_t)(i * cols + j) * es, ep->one, es);
	}
	return TERN_OK;
}

static tern_status eye_like_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	if (x->rank != 2)
		return tern_node_errorf(p->node, TERN_EDATA, "input must have rank 2, has rank %d", x->rank);
	int dtype = (int)tern_attr_int(p->node, "dtype", x->dtype);
	if (dtype <= 0 || dtype >= TERN_DTYPE_COUNT || !((TERN_DT_NUMERIC | TERN_DT(BOOL)) & (1u << dtype)))
		return tern_node_errorf(p->node, TERN_EDATA, "dtype %d (%s) is not supported", dtype,
		                        tern_dtype_name(dtype));
	eye_params *ep = calloc(1, sizeof *ep);
	if (!ep)
		return out_of_memory(p->node);
	ep->k = tern_attr_int(p->node, "k", 0);
	store_f64(dtype, ep->one, 1.0);
	tern_set_shape(p->out[0], dtype, 2, x->dims);
	return use_kernel(p, TERN_OK, ep, eye_like_kernel);
}

/* ---------------------------------------------------------------- ReverseSequence */

static tern_status reverse_sequence_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0], *lens = a->in[1];
	int batch_axis = (int)tern_attr_int(a->node, "batch_axis", 1);
	int64_t steps = x->dims[1 - batch_axis], batches = x->dims[batch_axis];
	int64_t inner = tern_numel(x->rank - 2, x->dims + 2);
	size_t es = elem_size(x->dtype);
	bool string = x->dtype == TERN_STRING;
	for (int64_t b = 0; b < batches; b++) {
		int64_t len = tern_tensor_get_i64(lens, b);
		if (len < 0 || len > steps)
			return tern_node_errorf(a->node, TERN_EDATA, "sequence_lens[%lld] = %lld is outside 0..%lld",
			                        (long long)b, (long long)len, (long long)steps);
	}
	for (int64_t b = 0; b < batches; b++) {
		int64_t len = tern_tensor_get_i64(lens, b);
		for (int64_t t = 0; t < steps; t++) {
			int64_t from = t < len ? len - 1 - t : t;
			int64_t dst_at = batch_axis == 0 ? b * steps + t : t * batches + b;
			int64_t src_at = batch_axis == 0 ? b * steps + from : from * batches + b;
			tern_status st =
			        copy_elems(a->node, (char *)a->out[0]->data + (size_t)(dst_at * inner) * es,
			                   (const char *)x->data + (size_t)(src_at * inner) * es, inner, es, string);
			if (st)
				return st;
		}
	}
	return TERN_OK;
}

static tern_status reverse_sequence_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *lens = input(p, 1);
	tern_status st = check_copyable(p->node, x->dtype);
	if (st)
		return st;
	if (!lens)
		return missing_input(p->node, 1, "sequence_lens");
	int64_t batch_axis = tern_attr_int(p->node, "batch_axis", 1),
	        time_axis = tern_attr_int(p->node, "time_axis", 0);
	if (x->rank < 2 || !((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0)))
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "batch_axis %lld and time_axis %lld must be 0 and 1 of rank >= 2 "
		                        "input (rank %d)",
		                        (long long)batch_axis, (long long)time_axis, x->rank);
	if (!is_index_dtype(lens->dtype) || lens->rank != 1 || lens->dims[0] != x->dims[batch_axis])
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'sequence_lens' must be int64 [%lld]",
		                        (long long)x->dims[batch_axis]);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->kernel = reverse_sequence_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- NonZero, Compress */

static bool is_nonzero(int dtype, const char *data, int64_t i)
{
	switch (dtype) {
	case TERN_FLOAT: return ((const float *)data)[i] != 0;
	case TERN_DOUBLE: return ((const double *)data)[i] != 0;
	case TERN_FLOAT16:
	case TERN_BFLOAT16: return (((const uint16_t *)data)[i] & 0x7fff) != 0;
	default: {
		size_t es = tern_dtype_size(dtype);
		for (size_t b = 0; b < es; b++)
			if (data[(size_t)i * es + b])
				return true;
		return false;
	}
	}
}

static tern_status non_zero_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	int64_t n = tern_tensor_numel(x), count = 0;
	for (int64_t i = 0; i < n; i++)
		count += is_nonzero(x->dtype, x->data, i);
	/* A scalar is treated as a one-element vector, as NumPy does. */
	int rank = x->rank ? x->rank : 1;
	int64_t dims[2] = {rank, count}, one = 1, idx[TERN_MAX_RANK] = {0}, unused = 0, zero[TERN_MAX_RANK] = {0};
	tern_status st = tern_tensor_alloc(a->out[0], TERN_INT64, 2, dims);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	int64_t *y = a->out[0]->data, k = 0;
	const int64_t *xd = x->rank ? x->dims : &one;
	for (int64_t i = 0; i < n; i++) {
		if (is_nonzero(x->dtype, x->data, i)) {
			for (int d = 0; d < rank; d++)
				y[d * count + k] = idx[d];
			k++;
		}
		advance(rank, xd, idx, zero, &unused);
	}
	return TERN_OK;
}

static tern_status non_zero_prepare(tern_prepare_args *p)
{
	int dtype = p->in[0]->dtype;
	if (!((TERN_DT_NUMERIC | TERN_DT(BOOL)) & (1u << dtype)))
		return tern_node_errorf(p->node, TERN_EDATA, "dtype %s is not supported", tern_dtype_name(dtype));
	p->dynamic_output = 1;
	p->kernel = non_zero_kernel;
	return TERN_OK;
}

typedef struct axis_params {
	int axis; /* -1: the input flattened */
} axis_params;

static tern_status compress_kernel(const tern_kernel_args *a)
{
	const axis_params *cp = a->params;
	const tern_tensor *x = a->in[0], *cond = a->in[1];
	const uint8_t *c = cond->data;
	int64_t n_cond = tern_tensor_numel(cond);
	int axis = cp->axis < 0 ? 0 : cp->axis;
	int64_t flat = tern_tensor_numel(x);
	int rank = cp->axis < 0 ? 1 : x->rank;
	const int64_t *xd = cp->axis < 0 ? &flat : x->dims;
	int64_t n_axis = xd[axis], kept = 0;
	for (int64_t i = 0; i < n_cond; i++) {
		if (!c[i])
			continue;
		if (i >= n_axis)
			return tern_node_errorf(a->node, TERN_EDATA,
			                        "condition[%lld] is true, axis %d has only %lld elements", (long long)i,
			                        axis, (long long)n_axis);
		kept++;
	}
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, xd, sizeof(int64_t) * (size_t)rank);
	dims[axis] = kept;
	tern_status st = tern_tensor_alloc(a->out[0], x->dtype, rank, dims);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	int64_t outer = tern_numel(axis, xd), inner = tern_numel(rank - axis - 1, xd + axis + 1);
	size_t es = elem_size(x->dtype), block = (size_t)inner * es;
	char *dst = a->out[0]->data;
	const char *src = x->data;
	for (int64_t o = 0; o < outer; o++)
		for (int64_t i = 0; i < n_axis && i < n_cond; i++) {
			if (!c[i])
				continue;
			st = copy_elems(a->node, dst, src + (size_t)(o * n_axis + i) * block, inner, es,
			                x->dtype == TERN_STRING);
			if (st)
				return st;
			dst += block;
		}
	return TERN_OK;
}

/* Compress and Unique work along one axis, or on the input flattened when the attribute is absent; their
 * kernels allocate their outputs. */
static tern_status axis_or_flat_prepare(tern_prepare_args *p, tern_kernel_fn kernel)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_copyable(p->node, x->dtype);
	if (st)
		return st;
	axis_params *ap = malloc(sizeof *ap);
	if (!ap)
		return out_of_memory(p->node);
	ap->axis = -1;
	if (tern_attr(p->node, "axis"))
		st = normalize_axis(p->node, "axis", tern_attr_int(p->node, "axis", 0), x->rank, &ap->axis);
	p->dynamic_output = 1;
	return use_kernel(p, st, ap, kernel);
}

static tern_status compress_prepare(tern_prepare_args *p)
{
	const tern_tensor *cond = input(p, 1);
	if (!cond || cond->dtype != TERN_BOOL || cond->rank != 1)
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'condition' must be a 1-D bool tensor");
	return axis_or_flat_prepare(p, compress_kernel);
}

/* ---------------------------------------------------------------- Unique */

/* Slices along the axis (single elements without one) compared lexicographically. */
typedef struct unique_ctx {
	const char *data;
	int dtype;
	size_t es;
	int64_t outer, n, inner;
} unique_ctx;

static int compare_f64(double a, double b)
{
	if (a < b)
		return -1;
	if (a > b)
		return 1;
	/* NaNs sort last and equal one another, as in NumPy's unique. */
	return (a != a) - (b != b);
}

#define COMPARE_AS(T) return *(const T *)a < *(const T *)b ? -1 : *(const T *)a > *(const T *)b;

static int compare_elem(int dtype, const void *a, const void *b)
{
	switch (dtype) {
	case TERN_FLOAT: return compare_f64(*(const float *)a, *(const float *)b);
	case TERN_DOUBLE: return compare_f64(*(const double *)a, *(const double *)b);
	case TERN_FLOAT16:
		return compare_f64(tern_f16_to_f32(*(const uint16_t *)a), tern_f16_to_f32(*(const uint16_t *)b));
	case TERN_BFLOAT16:
		return compare_f64(tern_bf16_to_f32(*(const uint16_t *)a), tern_bf16_to_f32(*(const uint16_t *)b));
	case TERN_STRING: return strcmp(*(char *const *)a, *(char *const *)b);
	case TERN_INT8: COMPARE_AS(int8_t)
	case TERN_INT16: COMPARE_AS(int16_t)
	case TERN_INT32: COMPARE_AS(int32_t)
	case TERN_INT64: COMPARE_AS(int64_t)
	case TERN_UINT16: COMPARE_AS(uint16_t)
	case TERN_UINT32: COMPARE_AS(uint32_t)
	case TERN_UINT64: COMPARE_AS(uint64_t)
	default: COMPARE_AS(uint8_t)
	}
}

static int compare_slices(const unique_ctx *u, int64_t a, int64_t b)
{
	for (int64_t o = 0; o < u->outer; o++)
		for (int64_t i = 0; i < u->inner; i++) {
			int c = compare_elem(u->dtype, u->data + (size_t)((o * u->n + a) * u->inner + i) * u->es,
			                     u->data + (size_t)((o * u->n + b) * u->inner + i) * u->es);
			if (c)
				return c;
		}
	return 0;
}

/* Ties go to the earlier slice, so each group starts with its first occurrence. */
static int compare_positions(const void *pa, const void *pb, void *ctx)
{
	int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
	int c = compare_slices(ctx, a, b);
	return c ? c : (a > b) - (a < b);
}

static tern_status unique_alloc(const tern_kernel_args *a, int i, int64_t n, const int64_t *values)
{
	if (i >= a->n_out || !a->out[i])
		return TERN_OK;
	tern_status st = tern_tensor_alloc(a->out[i], TERN_INT64, 1, &n);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	memcpy(a->out[i]->data, values, (size_t)n * sizeof(int64_t));
	return TERN_OK;
}

static tern_status unique_kernel(const tern_kernel_args *a)
{
	const axis_params *cp = a->params;
	const tern_tensor *x = a->in[0];
	unique_ctx u = {x->data, x->dtype, elem_size(x->dtype), 1, tern_tensor_numel(x), 1};
	if (cp->axis >= 0) {
		u.outer = tern_numel(cp->axis, x->dims);
		u.n = x->dims[cp->axis];
		u.inner = tern_numel(x->rank - cp->axis - 1, x->dims + cp->axis + 1);
	}
	bool sorted = tern_attr_int(a->node, "sorted", 1) != 0;
	int64_t n = u.n;
	/* Scratch (UNIQUE_SCRATCH arrays of n): positions in sorted order; the sorted group of each position;
	 * first position, count and output place of each group; first position and count by output place. */
	int64_t *order = a->scratch, *group = order + n, *first = group + n, *count = first + n, *place = count + n;
	int64_t *out_first = place + n, *out_count = out_first + n;
	for (int64_t i = 0; i < n; i++)
		order[i] = i;
	qsort_r(order, (size_t)n, sizeof *order, compare_positions, &u);
	int64_t groups = 0;
	for (int64_t i = 0; i < n; i++) {
		if (i == 0 || compare_slices(&u, order[i - 1], order[i]) != 0) {
			first[groups] = order[i];
			count[groups++] = 0;
		}
		group[order[i]] = groups - 1;
		count[groups - 1]++;
	}
	if (sorted) {
		for (int64_t g = 0; g < groups; g++)
			place[g] = g;
	} else {
		int64_t next = 0;
		for (int64_t i = 0; i < n; i++)
			if (first[group[i]] == i)
				place[group[i]] = next++;
	}
	for (int64_t g = 0; g < groups; g++) {
		out_first[place[g]] = first[g];
		out_count[place[g]] = count[g];
	}
	int64_t dims[TERN_MAX_RANK];
	int rank = cp->axis >= 0 ? x->rank : 1;
	if (cp->axis >= 0)
		memcpy(dims, x->dims, sizeof dims);
	dims[cp->axis >= 0 ? cp->axis : 0] = groups;
	tern_status st = tern_tensor_alloc(a->out[0], x->dtype, rank, dims);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	size_t block = (size_t)u.inner * u.es;
	for (int64_t o = 0; o < u.outer; o++)
		for (int64_t g = 0; g < groups; g++) {
			st = copy_elems(a->node, (char *)a->out[0]->data + (size_t)(o * groups + g) * block,
			                u.data + (size_t)(o * n + out_first[g]) * block, u.inner, u.es,
			                x->dtype == TERN_STRING);
			if (st)
				return st;
		}
	for (int64_t i = 0; i < n; i++)
		order[i] = place[group[i]];
	if ((st = unique_alloc(a, 1, groups, out_first)) || (st = unique_alloc(a, 2, n, order)) ||
	    (st = unique_alloc(a, 3, groups, out_count)))
		return st;
	return TERN_OK;
}

#define UNIQUE_SCRATCH 7

static tern_status unique_prepare(tern_prepare_args *p)
{
	tern_status st = axis_or_flat_prepare(p, unique_kernel);
	if (st)
		return st;
	const tern_tensor *x = p->in[0];
	const axis_params *ap = p->params;
	int64_t n = ap->axis >= 0 ? x->dims[ap->axis] : tern_tensor_numel(x);
	p->scratch_bytes = (size_t)(UNIQUE_SCRATCH * (n > 0 ? n : 1)) * sizeof(int64_t);
	return TERN_OK;
}

/* ---------------------------------------------------------------- gradients */

/* Each rule emits ONNX nodes in the form the forward node's opset takes (Reshape's shape is an input
 * from opset 5, Slice's lists from 10, Unsqueeze's and ReduceSum's axes from 13) or the tern-domain
 * backward operators above. */

static int64_t opset_of(const tern_grad_ctx *g)
{
	return g->node->opset;
}

/* Every wanted dx was made, but those in `none` (inputs that get no gradient by design); else the
 * builder's failure. */
static tern_status grad_done(tern_grad_ctx *g, uint32_t none)
{
	for (int i = 0; i < g->n_in; i++)
		if (g->wants[i] && !g->dx[i] && !tern_mask_has(none, i))
			return tern_g_status(g);
	return TERN_OK;
}

/* v's static shape; false when its rank or a dimension is unknown. */
static bool static_shape(tern_grad_ctx *g, const tern_gval *v, int *rank, int64_t *dims)
{
	tern_g_type(g, v, NULL, rank, dims);
	for (int d = 0; d < *rank; d++)
		if (dims[d] < 0)
			return false;
	return *rank >= 0;
}

/* a, of like's number of elements, in like's shape. Below opset 5 like's shape must be static. */
static tern_gval *reshape_to(tern_grad_ctx *g, tern_gval *a, tern_gval *like)
{
	if (!a || !like)
		return NULL;
	int ra, rl;
	int64_t da[TERN_MAX_RANK], dl[TERN_MAX_RANK];
	bool sa = static_shape(g, a, &ra, da), sl = static_shape(g, like, &rl, dl);
	if (sa && sl && ra == rl && (ra == 0 || memcmp(da, dl, (size_t)ra * sizeof *da) == 0))
		return a;
	if (opset_of(g) < 5) {
		tern_gattr at = TERN_GA_IS("shape", dl, (size_t)rl);
		return sl ? tern_g_op(g, "", "Reshape", &a, 1, &at, 1) : NULL;
	}
	if (opset_of(g) < 14)
		return tern_g_reshape_like(g, a, like);
	/* allowzero: a 0 in the shape is a 0, not "copy that dimension" */
	tern_gval *in[2] = {a, tern_g_shape(g, like)};
	tern_gattr at = TERN_GA_I("allowzero", 1);
	return in[1] ? tern_g_op(g, "", "Reshape", in, 2, &at, 1) : NULL;
}

/* Zeros of v's type and shape (opset 8 and later: Expand). */
static tern_gval *zeros_like(tern_grad_ctx *g, tern_gval *v)
{
	if (!v)
		return NULL;
	tern_gval *in[2] = {tern_g_scalar(g, 0.0, v), tern_g_shape(g, v)};
	return in[0] && in[1] ? tern_g_op(g, "", "Expand", in, 2, NULL, 0) : NULL;
}

/* Unsqueeze and ReduceSum in the form of this opset (axes an attribute before 13, an input from 13);
 * ReduceSum with no axes reduces all of them. */
static tern_gval *unsqueeze_axes(tern_grad_ctx *g, tern_gval *a, const int64_t *axes, int n)
{
	if (!a || n == 0)
		return a;
	if (opset_of(g) >= 13) {
		tern_gval *in[2] = {a, tern_g_ints(g, axes, (size_t)n)};
		return in[1] ? tern_g_op(g, "", "Unsqueeze", in, 2, NULL, 0) : NULL;
	}
	tern_gattr at = TERN_GA_IS("axes", axes, (size_t)n);
	return tern_g_op(g, "", "Unsqueeze", &a, 1, &at, 1);
}

static tern_gval *reduce_sum_axes(tern_grad_ctx *g, tern_gval *a, const int64_t *axes, int n, bool keepdims)
{
	if (!a)
		return NULL;
	tern_gattr at[2] = {TERN_GA_I("keepdims", keepdims), TERN_GA_IS("axes", axes, (size_t)n)};
	if (opset_of(g) >= 13) {
		tern_gval *in[2] = {a, n ? tern_g_ints(g, axes, (size_t)n) : NULL};
		return n && !in[1] ? NULL : tern_g_op(g, "", "ReduceSum", in, n ? 2 : 1, at, 1);
	}
	return tern_g_op(g, "", "ReduceSum", &a, 1, at, n ? 2 : 1);
}

/* A length along one axis, or an offset: v when static, else an int64[1] value. */
typedef struct dimx {
	bool dynamic;
	int64_t v;
	tern_gval *dyn;
} dimx;

static tern_gval *dimx_vec(tern_grad_ctx *g, dimx d)
{
	return d.dynamic ? d.dyn : tern_g_ints(g, &d.v, 1);
}

static dimx dimx_add(tern_grad_ctx *g, dimx a, dimx b)
{
	if (!a.dynamic && !b.dynamic)
		return (dimx){false, a.v + b.v, NULL};
	return (dimx){true, 0, tern_g_add(g, dimx_vec(g, a), dimx_vec(g, b))};
}

/* Dimension d of x (d < 0 counts from the back): static where the type tells it, else Gather(Shape(x)). */
static dimx x_dim(tern_grad_ctx *g, tern_gval *x, int64_t d)
{
	int rank;
	int64_t dims[TERN_MAX_RANK];
	tern_g_type(g, x, NULL, &rank, dims);
	int64_t nd = d < 0 && rank >= 0 ? d + rank : d;
	if (rank >= 0 && nd >= 0 && nd < rank && dims[nd] >= 0)
		return (dimx){false, dims[nd], NULL};
	tern_gval *in[2] = {tern_g_shape(g, x), tern_g_ints(g, &d, 1)};
	tern_gattr at = TERN_GA_I("axis", 0);
	return (dimx){true, 0, in[0] && in[1] ? tern_g_op(g, "", "Gather", in, 2, &at, 1) : NULL};
}

/* An int64[n] shape from n dimensions. */
static tern_gval *shape_vec(tern_grad_ctx *g, const dimx *d, int n)
{
	int64_t v[TERN_MAX_RANK];
	bool dynamic = false;
	for (int i = 0; i < n; i++) {
		dynamic |= d[i].dynamic;
		v[i] = d[i].v;
	}
	if (!dynamic)
		return tern_g_ints(g, v, (size_t)n);
	tern_gval *parts[TERN_MAX_RANK];
	for (int i = 0; i < n; i++)
		if (!(parts[i] = dimx_vec(g, d[i])))
			return NULL;
	tern_gattr at = TERN_GA_I("axis", 0);
	return tern_g_op(g, "", "Concat", parts, n, &at, 1);
}

/* a[start:end] along axis (Slice; below opset 10 the bounds must be static). */
static tern_gval *slice_axis(tern_grad_ctx *g, tern_gval *a, int64_t axis, dimx start, dimx end)
{
	if (opset_of(g) >= 10) {
		tern_gval *in[4] = {a, dimx_vec(g, start), dimx_vec(g, end), tern_g_ints(g, &axis, 1)};
		return in[1] && in[2] && in[3] ? tern_g_op(g, "", "Slice", in, 4, NULL, 0) : NULL;
	}
	if (start.dynamic || end.dynamic)
		return NULL;
	tern_gattr at[3] = {TERN_GA_IS("starts", &start.v, 1), TERN_GA_IS("ends", &end.v, 1),
	                    TERN_GA_IS("axes", &axis, 1)};
	return tern_g_op(g, "", "Slice", &a, 1, at, 3);
}

/* Concat of n parts along axis, in nodes of at most 32 inputs. */
static tern_gval *concat_axis(tern_grad_ctx *g, tern_gval **parts, int n, int64_t axis)
{
	tern_gattr at = TERN_GA_I("axis", axis);
	tern_gval *acc = NULL, *in[32];
	for (int k = 0; k < n;) {
		int m = 0;
		if (acc)
			in[m++] = acc;
		while (m < 32 && k < n)
			in[m++] = parts[k++];
		for (int i = 0; i < m; i++)
			if (!in[i])
				return NULL;
		acc = m == 1 ? in[0] : tern_g_op(g, "", "Concat", in, m, &at, 1);
	}
	return acc;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: the gradient in the input's shape. */
static tern_status reshape_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	if (opset_of(g) < 5 && !static_shape(g, g->x[0], &rank, dims))
		return tern_g_fail(g, "below opset 5 the input's shape must be static");
	g->dx[0] = reshape_to(g, g->dy[0], g->x[0]);
	return grad_done(g, 0);
}

static tern_status identity_grad(tern_grad_ctx *g)
{
	if (g->wants[0])
		g->dx[0] = g->dy[0];
	return TERN_OK;
}

/* Transpose by the inverse permutation; without perm (the axes reversed) it is its own inverse. */
static tern_status transpose_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	size_t n = 0;
	const int64_t *perm = tern_attr_ints(g->node, "perm", &n);
	if (!tern_attr(g->node, "perm")) {
		g->dx[0] = tern_g_op(g, "", "Transpose", &g->dy[0], 1, NULL, 0);
		return grad_done(g, 0);
	}
	int64_t inv[TERN_MAX_RANK];
	if (n > TERN_MAX_RANK)
		return tern_g_fail(g, "perm has %zu values", n);
	for (size_t i = 0; i < n; i++) {
		if (perm[i] < 0 || perm[i] >= (int64_t)n)
			return tern_g_fail(g, "perm is not a permutation");
		inv[perm[i]] = (int64_t)i;
	}
	g->dx[0] = tern_g_transpose(g, g->dy[0], inv, (int)n);
	return grad_done(g, 0);
}

/* Concat: each input's part of the gradient sliced back out along the axis. */
static tern_status concat_grad(tern_grad_ctx *g)
{
	int64_t axis = tern_attr_int(g->node, "axis", opset_of(g) < 4 ? 1 : 0);
	dimx off = {false, 0, NULL};
	for (int i = 0; i < g->n_in; i++) {
		dimx size = x_dim(g, g->x[i], axis), end = dimx_add(g, off, size);
		if (size.dynamic && opset_of(g) < 10)
			return tern_g_fail(g, "below opset 10 the inputs' sizes along the axis must be static");
		if (g->wants[i])
			g->dx[i] = slice_axis(g, g->dy[0], axis, off, end);
		off = end;
	}
	return grad_done(g, 0);
}

/* Split: the outputs' gradients concatenated, zeros for an output that gets none. */
static tern_status split_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *parts[TERN_MAX_RANK * 8];
	if (g->n_out > (int)TERN_ARRAY_LEN(parts))
		return tern_g_fail(g, "more than %d outputs", (int)TERN_ARRAY_LEN(parts));
	for (int o = 0; o < g->n_out; o++) {
		if (g->dy[o]) {
			parts[o] = g->dy[o];
			continue;
		}
		if (!g->y[o] || opset_of(g) < 8)
			return tern_g_fail(g, "output %d has no gradient and %s", o,
			                   g->y[o] ? "zeros need opset 8 (Expand)" : "is omitted");
		parts[o] = zeros_like(g, g->y[o]);
	}
	g->dx[0] = concat_axis(g, parts, g->n_out, tern_attr_int(g->node, "axis", 0));
	return grad_done(g, 0);
}

/* Slice: the gradient written into zeros where the slice read (tern.SliceGrad). */
static tern_status slice_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *in[6] = {g->dy[0], tern_g_shape(g, g->x[0])};
	int n = 2;
	if (opset_of(g) >= 10) {
		for (int i = 1; i < g->n_in && i < 5; i++)
			in[n++] = g->x[i];
	} else {
		static const char *const names[] = {"starts", "ends", "axes"};
		for (int k = 0; k < 3; k++) {
			size_t count = 0;
			const int64_t *v = tern_attr_ints(g->node, names[k], &count);
			if (!tern_attr(g->node, names[k]))
				break;
			if (!(in[n++] = tern_g_ints(g, v, count)))
				return tern_g_status(g);
		}
	}
	g->dx[0] = in[1] ? tern_g_op(g, "tern", "SliceGrad", in, n, NULL, 0) : NULL;
	return grad_done(g, 0);
}

/* Pad. Constant mode: Pad with the pads negated (what was added is cut, what was cut comes back as
 * zeros); constant_value gets what the padding received, the sum of the gradient less the input's
 * part. Reflect, edge and wrap: tern.PadGrad adds each element back onto the one it copies. */
static tern_status pad_grad(tern_grad_ctx *g)
{
	int64_t opset = opset_of(g);
	char mode[16];
	snprintf(mode, sizeof mode, "%s", tern_attr_string(g->node, "mode", "constant"));
	bool constant = strcmp(mode, "constant") == 0;
	bool want_value = constant && g->n_in > 2 && g->x[2] && g->wants[2];
	tern_gval *axes = opset >= 18 && g->n_in > 3 ? g->x[3] : NULL, *dx = NULL, *dy = g->dy[0];
	if (!g->wants[0] && !want_value)
		return TERN_OK;
	if (constant && opset >= 11) {
		tern_gval *in[4] = {dy, tern_g_neg(g, g->x[1]), NULL, axes};
		dx = in[1] ? tern_g_op(g, "", "Pad", in, axes ? 4 : 2, NULL, 0) : NULL;
	} else if (constant) {
		const char *name = opset >= 2 ? "pads" : "paddings";
		size_t n = 0;
		const int64_t *pads = tern_attr_ints(g->node, name, &n);
		int64_t neg[2 * TERN_MAX_RANK];
		if (n > TERN_ARRAY_LEN(neg))
			return tern_g_fail(g, "'%s' has %zu values", name, n);
		for (size_t i = 0; i < n; i++)
			neg[i] = -pads[i];
		tern_gattr at[2] = {TERN_GA_IS(name, neg, n), TERN_GA_S("mode", "constant")};
		dx = tern_g_op(g, "", "Pad", &dy, 1, at, 2);
	} else {
		tern_gval *pads = g->x[1];
		if (opset < 11) {
			const char *name = opset >= 2 ? "pads" : "paddings";
			size_t n = 0;
			const int64_t *v = tern_attr_ints(g->node, name, &n);
			pads = tern_g_ints(g, v, n);
		}
		tern_gval *in[4] = {dy, tern_g_shape(g, g->x[0]), pads, axes};
		tern_gattr at = TERN_GA_S("mode", mode);
		dx = in[1] && in[2] ? tern_g_op(g, "tern", "PadGrad", in, axes ? 4 : 3, &at, 1) : NULL;
	}
	if (g->wants[0])
		g->dx[0] = dx;
	if (want_value) {
		tern_gval *d =
		        tern_g_sub(g, reduce_sum_axes(g, dy, NULL, 0, false), reduce_sum_axes(g, dx, NULL, 0, false));
		g->dx[2] = reshape_to(g, d, g->x[2]);
	}
	return grad_done(g, constant ? 0 : 1u << 2);
}

/* Expand: the gradient summed back to the input's shape. */
static tern_status expand_grad(tern_grad_ctx *g)
{
	if (g->wants[0])
		g->dx[0] = tern_g_sum_to(g, g->dy[0], g->x[0]);
	return grad_done(g, 0);
}

/* Tile: the gradient seen as [r0, d0, r1, d1, ...] and summed over the repeat axes. */
static tern_status tile_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int rank, ry;
	int64_t xd[TERN_MAX_RANK], yd[TERN_MAX_RANK];
	tern_g_type(g, g->x[0], NULL, &rank, xd);
	if (rank < 0)
		return tern_g_fail(g, "Tile needs an input of known rank");
	if (rank == 0) {
		g->dx[0] = g->dy[0];
		return TERN_OK;
	}
	bool known = static_shape(g, g->x[0], &rank, xd) && static_shape(g, g->y[0], &ry, yd) && ry == rank;
	int64_t split[2 * TERN_MAX_RANK], axes[TERN_MAX_RANK];
	for (int d = 0; d < rank; d++) {
		known = known && xd[d] > 0;
		split[2 * d] = known ? yd[d] / xd[d] : 0;
		split[2 * d + 1] = xd[d];
		axes[d] = 2 * d;
	}
	tern_gval *target;
	if (known) {
		target = tern_g_ints(g, split, 2 * (size_t)rank);
	} else {
		/* [rank, 2] from repeats and Shape(x) side by side, flattened */
		int64_t one = 1, flat = -1;
		tern_gval *cols[2] = {unsqueeze_axes(g, g->x[1], &one, 1),
		                      unsqueeze_axes(g, tern_g_shape(g, g->x[0]), &one, 1)};
		tern_gval *in[2] = {concat_axis(g, cols, 2, 1), tern_g_ints(g, &flat, 1)};
		target = in[0] && in[1] ? tern_g_op(g, "", "Reshape", in, 2, NULL, 0) : NULL;
	}
	tern_gval *in[2] = {g->dy[0], target};
	tern_gattr at = TERN_GA_I("allowzero", 1);
	tern_gval *r = target ? tern_g_op(g, "", "Reshape", in, 2, &at, opset_of(g) >= 14) : NULL;
	g->dx[0] = reduce_sum_axes(g, r, axes, rank, false);
	return grad_done(g, 0);
}

/* Gather, GatherElements, GatherND: the gradient added into zeros of the data's shape where the
 * gather read (tern.GatherGrad, tern.GatherElementsGrad, tern.GatherNDGrad, with the forward node's
 * axis or batch_dims). */
static tern_status gather_family_grad(tern_grad_ctx *g, const char *backward)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *in[3] = {g->dy[0], tern_g_shape(g, g->x[0]), g->x[1]};
	g->dx[0] = in[1] ? tern_g_op_like(g, "tern", backward, in, 3, NULL, 0) : NULL;
	return grad_done(g, 0);
}

static tern_status gather_grad(tern_grad_ctx *g)
{
	return gather_family_grad(g, "GatherGrad");
}

static tern_status gather_elements_grad(tern_grad_ctx *g)
{
	return gather_family_grad(g, "GatherElementsGrad");
}

static tern_status gather_nd_grad(tern_grad_ctx *g)
{
	return gather_family_grad(g, "GatherNDGrad");
}

/* ScatterElements, Scatter, ScatterND. Without a reduction the data's gradient is the output's with the
 * written positions zeroed (the same scatter, of zeros); with reduction "add" it is the output's. The
 * updates' gradient is the output's gathered at the indices. Other reductions have no rule. */
static tern_status scatter_grad(tern_grad_ctx *g, const char *gather)
{
	char reduction[16];
	snprintf(reduction, sizeof reduction, "%s", tern_attr_string(g->node, "reduction", "none"));
	bool add = strcmp(reduction, "add") == 0;
	if (!add && strcmp(reduction, "none") != 0)
		return tern_g_fail(g, "no gradient for reduction '%s'", reduction);
	tern_gval *dy = g->dy[0], *idx = g->x[1];
	if (g->wants[0] && add) {
		g->dx[0] = dy;
	} else if (g->wants[0]) {
		tern_gval *in[3] = {dy, idx, zeros_like(g, g->x[2])};
		g->dx[0] = in[2] ? tern_g_op_like(g, "", g->node->op_type, in, 3, NULL, 0) : NULL;
	}
	if (g->wants[2]) {
		if (opset_of(g) < 11)
			return tern_g_fail(g, "the gradient of the updates needs %s (opset 11)", gather);
		tern_gattr at = strcmp(gather, "GatherND") == 0 ? TERN_GA_I("batch_dims", 0)
		                                                : TERN_GA_I("axis", tern_attr_int(g->node, "axis", 0));
		tern_gval *in[2] = {dy, idx};
		g->dx[2] = tern_g_op(g, "", gather, in, 2, &at, 1);
	}
	return grad_done(g, 0);
}

static tern_status scatter_elements_grad(tern_grad_ctx *g)
{
	return scatter_grad(g, "GatherElements");
}

static tern_status scatter_nd_grad(tern_grad_ctx *g)
{
	return scatter_grad(g, "GatherND");
}

/* DepthToSpace (DCR) and SpaceToDepth undo each other; DepthToSpace in CRD mode is undone by its
 * reshapes and transpose run backwards. */
static tern_status space_to_depth_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gattr at = TERN_GA_I("blocksize", tern_attr_int(g->node, "blocksize", 0));
	g->dx[0] = tern_g_op(g, "", "DepthToSpace", &g->dy[0], 1, &at, 1);
	return grad_done(g, 0);
}

static tern_status depth_to_space_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int64_t b = tern_attr_int(g->node, "blocksize", 0);
	tern_gattr at = TERN_GA_I("blocksize", b);
	if (strcmp(tern_attr_string(g->node, "mode", "DCR"), "CRD") != 0) {
		g->dx[0] = tern_g_op(g, "", "SpaceToDepth", &g->dy[0], 1, &at, 1);
		return grad_done(g, 0);
	}
	/* y = reshape(transpose(reshape(x, [N, C, b, b, H, W]), [0, 1, 4, 2, 5, 3]), [N, C, H b, W b]) */
	tern_gval *x = g->x[0];
	dimx c = x_dim(g, x, 1);
	if (c.dynamic) {
		int64_t bb = b * b;
		c.dyn = tern_g_div(g, c.dyn, tern_g_ints(g, &bb, 1));
	} else {
		c.v /= b * b;
	}
	dimx block = {false, b, NULL};
	dimx d6[6] = {x_dim(g, x, 0), c, x_dim(g, x, 2), block, x_dim(g, x, 3), block};
	tern_gval *in[2] = {g->dy[0], shape_vec(g, d6, 6)};
	static const int64_t inv[6] = {0, 1, 3, 5, 2, 4};
	tern_gval *t = in[1] ? tern_g_transpose(g, tern_g_op(g, "", "Reshape", in, 2, NULL, 0), inv, 6) : NULL;
	g->dx[0] = reshape_to(g, t, x);
	return grad_done(g, 0);
}

/* Trilu keeps a fixed set of elements and ReverseSequence is its own inverse: the same node on the
 * gradient. */
static tern_status same_op_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *in[2] = {g->dy[0], g->n_in > 1 ? g->x[1] : NULL};
	g->dx[0] = tern_g_op_like(g, "", g->node->op_type, in, g->n_in > 1 ? 2 : 1, NULL, 0);
	return grad_done(g, 0);
}

/* CenterCropPad back to the input's sizes: a centred crop undoes a centred pad and the other way round. */
static tern_status center_crop_pad_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	size_t n = 0;
	const int64_t *axes = tern_attr_ints(g->node, "axes", &n);
	int rank = tern_g_rank(g, g->x[0]);
	bool all = !tern_attr(g->node, "axes");
	if (all && rank < 0)
		return tern_g_fail(g, "CenterCropPad needs an input of known rank");
	int count = all ? rank : (int)n;
	if (count > TERN_MAX_RANK)
		return tern_g_fail(g, "%d axes", count);
	dimx d[TERN_MAX_RANK];
	for (int i = 0; i < count; i++)
		d[i] = x_dim(g, g->x[0], all ? i : axes[i]);
	tern_gval *in[2] = {g->dy[0], shape_vec(g, d, count)};
	g->dx[0] = in[1] ? tern_g_op_like(g, "", "CenterCropPad", in, 2, NULL, 0) : NULL;
	return grad_done(g, 0);
}

/* ---------------------------------------------------------------- the table */

#define COPYABLE (TERN_DT_ALL)

static const tern_op ops[] = {
        {"", "Reshape", 1, 0, reshape_prepare, COPYABLE, "shape", reshape_grad},
        {"", "Flatten", 1, 0, flatten_prepare, COPYABLE, "shape", reshape_grad},
        {"", "Squeeze", 1, 0, squeeze_prepare, COPYABLE, "shape", reshape_grad},
        {"", "Unsqueeze", 1, 0, unsqueeze_prepare, COPYABLE, "shape", reshape_grad},
        {"", "Identity", 1, 0, identity_prepare, COPYABLE, "shape", identity_grad},
        {"", "Transpose", 1, 0, transpose_prepare, COPYABLE, "shape", transpose_grad},
        {"", "Concat", 1, 0, concat_prepare, COPYABLE, "shape", concat_grad},
        {"", "Split", 1, 0, split_prepare, COPYABLE, "shape", split_grad},
        {"", "Slice", 1, 0, slice_prepare, COPYABLE, "shape", slice_grad},
        {"", "Gather", 1, 0, gather_prepare, COPYABLE, "shape", gather_grad},
        {"", "GatherElements", 11, 0, gather_elements_prepare, COPYABLE, "shape", gather_elements_grad},
        {"", "GatherND", 11, 0, gather_nd_prepare, COPYABLE, "shape", gather_nd_grad},
        {"", "ScatterElements", 11, 0, scatter_elements_prepare, COPYABLE, "shape", scatter_elements_grad},
        {"", "ScatterND", 11, 0, scatter_nd_prepare, COPYABLE, "shape", scatter_nd_grad},
        {"", "Scatter", 9, 10, scatter_elements_prepare, COPYABLE, "shape", scatter_elements_grad},
        {"", "Expand", 8, 0, expand_prepare, COPYABLE, "shape", expand_grad},
        {"", "Tile", 6, 0, tile_prepare, COPYABLE, "shape", tile_grad},
        {"", "Pad", 1, 0, pad_prepare, COPYABLE, "shape", pad_grad},
        {"", "Shape", 1, 0, shape_prepare, 0, "shape"},
        {"", "Size", 1, 0, size_prepare, 0, "shape"},
        {"", "ConstantOfShape", 9, 0, constant_of_shape_prepare, TERN_DT(INT64), "shape"},
        {"", "Constant", 1, 0, constant_prepare, 0, "shape"},
        {"", "Range", 11, 0, range_prepare,
         TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(INT16) | TERN_DT(INT32) | TERN_DT(INT64), "shape"},
        {"", "OneHot", 9, 0, one_hot_prepare, TERN_DT_NUMERIC, "shape"},
        {"", "DepthToSpace", 1, 0, depth_to_space_prepare, COPYABLE, "shape", depth_to_space_grad},
        {"", "SpaceToDepth", 1, 0, space_to_depth_prepare, COPYABLE, "shape", space_to_depth_grad},
        {"", "Trilu", 14, 0, trilu_prepare, COPYABLE, "shape", same_op_grad},
        {"", "NonZero", 9, 0, non_zero_prepare, TERN_DT_NUMERIC | TERN_DT(BOOL), "shape"},
        {"", "Compress", 9, 0, compress_prepare, COPYABLE, "shape"},
        {"", "EyeLike", 9, 0, eye_like_prepare, TERN_DT_NUMERIC | TERN_DT(BOOL), "shape"},
        {"", "ReverseSequence", 10, 0, reverse_sequence_prepare, COPYABLE, "shape", same_op_grad},
        {"", "CenterCropPad", 18, 0, center_crop_pad_prepare, COPYABLE, "shape", center_crop_pad_grad},
        {"", "Unique", 11, 0, unique_prepare, COPYABLE, "shape"},
        /* backward operators that gradient rules emit */
        {"tern", "SliceGrad", 1, 0, slice_grad_prepare, TERN_DT_NUMERIC, "shape"},
        {"tern", "PadGrad", 1, 0, pad_grad_prepare, TERN_DT_NUMERIC, "shape"},
        {"tern", "GatherGrad", 1, 0, gather_grad_prepare, TERN_DT_NUMERIC, "shape"},
        {"tern", "GatherElementsGrad", 1, 0, gather_elements_grad_prepare, TERN_DT_NUMERIC, "shape"},
        {"tern", "GatherNDGrad", 1, 0, gather_nd_grad_prepare, TERN_DT_NUMERIC, "shape"},
};

const tern_op_table tern_ops_shape = {ops, TERN_ARRAY_LEN(ops)};
