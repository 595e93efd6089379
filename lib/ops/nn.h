/* nn.h — what the neural-network families (pool.c, conv.c, norm.c, softmax.c, resize.c) share:
 * argument checks, parallel loops over items, float16 and bfloat16 staging, the sliding-window
 * geometry of convolution and pooling, and the channel-block engine behind depthwise convolution and
 * max and average pooling. Small helpers are static inline here, so that the kernels calling them
 * inline them as before; the larger ones are defined once in nn_common.c under tern_nn_ names.
 * Internal to lib/ops. */
#ifndef TERN_OPS_NN_H
#define TERN_OPS_NN_H

#include "autodiff/grad.h"
#include "internal.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- common helpers */

/* The loops that carry the work are compiled for AVX-512, AVX2 and the baseline (TERN_ISA_VARIANTS3)
 * and run on the path tern_isa() names: the baseline x86-64 build handles 4 floats at a time. */

static inline size_t round_up(size_t n) { return (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN; }

static inline bool is_half(int dtype) { return dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16; }

/* Bytes of one element as the kernels compute it (halves are widened to float). */
static inline size_t compute_size(int dtype) { return dtype == TERN_DOUBLE ? 8 : 4; }

static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

static inline bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }

static inline tern_status no_memory(const tern_node *node) { return tern_node_errorf(node, TERN_EOS, "out of memory"); }

static inline tern_status check_real(const tern_node *node, const tern_tensor *t, int index)
{
	if (t->dtype == TERN_FLOAT || t->dtype == TERN_DOUBLE || is_half(t->dtype))
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input %d has element type %s; float, double, float16 or bfloat16 expected",
	                        index, tern_dtype_name(t->dtype));
}

static inline tern_status check_same(const tern_node *node, const tern_tensor *x, const tern_tensor *t, int index)
{
	if (t->dtype == x->dtype)
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input %d is %s, input 0 is %s", index, tern_dtype_name(t->dtype),
	                        tern_dtype_name(x->dtype));
}

/* Input 0 of a real type and inputs 1 .. n - 1, where present, of the same type. */
static inline tern_status check_real_same(const tern_prepare_args *p, int n)
{
	tern_status st = check_real(p->node, p->in[0], 0);
	for (int i = 1; i < n && i < p->n_in && !st; i++)
		if (p->in[i])
			st = check_same(p->node, p->in[0], p->in[i], i);
	return st;
}

static inline tern_status check_rank(const tern_node *node, const tern_tensor *t, int index, int lo, int hi)
{
	if (t->rank >= lo && t->rank <= hi)
		return TERN_OK;
	char s[128];
	return tern_node_errorf(node, TERN_EDATA, "input %d %s has rank %d; %d to %d expected", index,
	                        tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), t->rank, lo, hi);
}

static inline tern_status check_numel(const tern_node *node, const tern_tensor *t, int index, const char *what,
                                      int64_t n)
{
	if (!t || tern_tensor_numel(t) == n)
		return TERN_OK;
	char s[128];
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' %s must have %lld elements", index, what,
	                        tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), (long long)n);
}

static inline tern_status bad_attr(const tern_node *node, const char *name, const char *value)
{
	return tern_node_errorf(node, TERN_EDATA, "attribute '%s' = '%s' is not supported", name, value);
}

static inline tern_status parse_enum(const tern_node *node, const char *attr, const char *dflt,
                                     const char *const *names, int n, int *out)
{
	const char *v = tern_attr_string(node, attr, dflt);
	for (int i = 0; i < n; i++)
		if (streq(v, names[i])) {
			*out = i;
			return TERN_OK;
		}
	return bad_attr(node, attr, v);
}

/* Normalises a possibly negative axis into [0, rank). */
static inline tern_status axis_in(const tern_node *node, int64_t axis, int rank, int *out)
{
	if (axis < -rank || axis >= (rank ? rank : 1))
		return tern_node_errorf(node, TERN_EDATA, "axis %lld is out of range for rank %d", (long long)axis, rank);
	*out = (int)(axis < 0 ? axis + rank : axis);
	return TERN_OK;
}

static inline int64_t prod(const int64_t *d, int from, int to)
{
	int64_t n = 1;
	for (int i = from; i < to; i++)
		n *= d[i];
	return n;
}

/* A sum in double over eight partial sums, which vectorises where one running sum cannot (the global
 * pools, the normalisations' moments). */
#define DEF_SUM(S, T)                                                                          \
	static inline double sum_##S(const T *x, int64_t n)                                    \
	{                                                                                      \
		double part[8] = {0}, sum = 0;                                                     \
		int64_t i = 0;                                                                     \
		for (; i + 8 <= n; i += 8)                                                         \
			for (int l = 0; l < 8; l++)                                                    \
				part[l] += x[i + l];                                                       \
		for (; i < n; i++)                                                                 \
			sum += x[i];                                                                   \
		for (int l = 0; l < 8; l++)                                                        \
			sum += part[l];                                                                \
		return sum;                                                                        \
	}

DEF_SUM(f32, float)
DEF_SUM(f64, double)
DEF_SUM(i8, int8_t)
DEF_SUM(u8, uint8_t)
#undef DEF_SUM

/* What most parallel loops need: the operator's parameters, its input and its output. */
typedef struct plain_ctx {
	const void *params;
	const void *x;
	void *y;
} plain_ctx;

/* Splits [0, n) into a few chunks per thread of at least `grain` items and runs fn on each. */
typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);
/* The same with the chunk's number, below the cap given, for kernels with per-chunk scratch. */
typedef void (*slot_fn)(void *ctx, int64_t begin, int64_t end, int64_t slot);

typedef struct chunked {
	range_fn fn;
	slot_fn slot_fn;
	void *ctx;
	int64_t n, per;
} chunked;

/* Chunks a few per thread, so that uneven ones even out; `slots` planned for a pool. */
static inline int64_t slots_for(tern_threadpool *pool)
{
	return 4 * (int64_t)(pool ? tern_threadpool_size(pool) : 1);
}

/* [0, n) in chunks of at least `grain` items, at most max_chunks of them, through c0's function. */
void tern_nn_parallel_chunks(tern_threadpool *pool, int64_t n, int64_t grain, int64_t max_chunks, const chunked *c0);

/* Splits [0, n) into chunks of at least `grain` items and runs fn on each. */
static inline void parallel_range(tern_threadpool *pool, int64_t n, int64_t grain, range_fn fn, void *ctx)
{
	chunked c = {fn, NULL, ctx, 0, 0};
	tern_nn_parallel_chunks(pool, n, grain, INT64_MAX, &c);
}

static inline void parallel_slots(tern_threadpool *pool, int64_t n, int64_t grain, int64_t slots, slot_fn fn,
                                  void *ctx)
{
	chunked c = {NULL, fn, ctx, 0, 0};
	tern_nn_parallel_chunks(pool, n, grain, slots, &c);
}

/* Items of `work` elements each: enough per chunk that threading pays. The team's workers spin before
 * they sleep, so a chunk of a few thousand elements is worth sharing (mobilenet_v3_small at --threads 2:
 * 0.81 -> 0.69 ms against chunks of 16384). */
#define MIN_CHUNK_WORK 4096
static inline int64_t grain_for(int64_t work)
{
	return work >= MIN_CHUNK_WORK ? 1 : MIN_CHUNK_WORK / (work > 0 ? work : 1);
}

/* An axis seen as outer x n x inner: the layout Softmax, Hardmax, the losses and LpNormalization walk. */
typedef struct axis_params {
	int64_t outer, n, inner;
	int64_t p; /* LpNormalization */
	int kind;
} axis_params;

/* outer x n x inner around one axis of a real input 0, whose shape output 0 gets; `coerce` (softmax
 * before opset 13) flattens everything from the axis on into n. The params are p's. */
tern_status tern_nn_axis_setup(tern_prepare_args *p, int64_t axis_default, bool coerce, axis_params **out);

/* ---------------------------------------------------------------- float16 and bfloat16 */

/* Half tensors are computed in float: called at the end of a prepare that set a float kernel, this
 * wraps the kernel when any tensor is half, so that half inputs are widened into scratch before it
 * runs and half outputs narrowed after. */
tern_status tern_nn_stage_halves(tern_prepare_args *p);

/* ---------------------------------------------------------------- sliding windows */

/* Convolution and pooling geometry. Spatial dimensions (1 to 3) sit right-aligned in SP slots; unused
 * leading slots are size 1, so one 3-D loop serves 1-D, 2-D and 3-D. */
#define SP 3

typedef struct window {
	int nsp;
	int64_t in[SP], out[SP], k[SP], s[SP], d[SP], pb[SP], pe[SP];
} window;

static inline int64_t sp_numel(const int64_t *v) { return v[0] * v[1] * v[2]; }

static inline void window_init(window *w, int nsp)
{
	w->nsp = nsp;
	for (int i = 0; i < SP; i++) {
		w->in[i] = w->out[i] = w->k[i] = w->s[i] = w->d[i] = 1;
		w->pb[i] = w->pe[i] = 0;
	}
}

/* Reads an ints attribute of n (or 2n for pads) values, each at least min, into the right-aligned
 * slots of dst0 (and, for pads, the ends into dst1). Absent: the slots stay. */
tern_status tern_nn_read_ints(const tern_node *node, const char *name, int nsp, int per, int64_t min, int64_t *dst0,
                              int64_t *dst1);

/* kernel_shape (or `kernel` from the weights), strides, dilations and pads of an input x whose
 * spatial dimensions follow (N, C). */
tern_status tern_nn_window_read(const tern_node *node, const tern_tensor *x, const int64_t *kernel, window *w);

/* Output size of a forward window (convolution, pooling) from auto_pad and ceil_mode. */
tern_status tern_nn_window_forward(const tern_node *node, window *w, bool ceil_mode);

/* Kernel taps j in [*lo, *hi) whose position start + j*d lies in [from, to). */
static inline void taps_within(int64_t start, int64_t k, int64_t d, int64_t from, int64_t to, int64_t *lo,
                               int64_t *hi)
{
	int64_t l = start >= from ? 0 : ceil_div(from - start, d);
	int64_t h = to <= start ? 0 : ceil_div(to - start, d);
	*lo = l < k ? l : k;
	*hi = h < k ? h : k;
	if (*hi < *lo)
		*hi = *lo;
}

/* Output positions o in [*lo, *hi) whose input position o*s + off lies in [0, in). */
static inline void outputs_within(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
	int64_t l = off >= 0 ? 0 : ceil_div(-off, s);
	int64_t h = in - off <= 0 ? 0 : ceil_div(in - off, s);
	*lo = l < out ? l : out;
	*hi = h < out ? h : out;
	if (*hi < *lo)
		*hi = *lo;
}

/* ---------------------------------------------------------------- windows over blocks of channels */

/* A plane row of a few dozen positions wastes most of a vector, so with AVX-512 or AVX2 the windowed
 * operators (depthwise convolution, max and average pooling) may put channels across the vectors
 * instead: a block of 16 channels (8 with AVX2: one vector) is transposed into positions x channels
 * with its padding, each output position combines its taps as whole vectors (aligned loads whatever
 * the stride), and the result is transposed back. Planes too big for the cache go in bands of output
 * rows. The engine is nn_common.c's (with window_blocks.h). */

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_WB 1 /* the engine, and conv.c's AVX-512 depthwise kernels */
#endif

typedef enum wb_kind { WB_CONV, WB_MAX, WB_AVG } wb_kind;

typedef struct wb_job {
	const window *w;
	wb_kind kind;
	int64_t n, channels; /* one input channel per output channel */
	int64_t band;        /* output rows per band */
	int64_t slot_elems;
	const float *x, *wt, *bias; /* WB_CONV: kk weights per channel, bias per channel (optional) */
	const float *recip;         /* WB_AVG: 1 / divisor per output position */
	float *y, *scratch;
	const tern_act *act; /* WB_CONV: tern.FusedConv's activation with residual z, or NULL */
	const float *z;
} wb_job;

/* Padded extent of slot i: as far as the taps reach or the padding goes, whichever is more. */
static inline int64_t wb_extent(const window *w, int i)
{
	int64_t reach = (w->out[i] - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1, padded = w->pb[i] + w->in[i] + w->pe[i];
	return reach > padded ? reach : padded;
}

/* Whether the engine takes a window (1-D or 2-D, at most 64 taps for the convolution's weights), and
 * then the output rows per band and the scratch per slot in floats. */
bool tern_nn_wb_plan(const window *w, int64_t *band, int64_t *slot_elems);

/* Runs a job planned by tern_nn_wb_plan, `slots` slots of scratch of j->slot_elems floats each. */
void tern_nn_wb_run(tern_threadpool *pool, const wb_job *j, int64_t slots);

/* ---------------------------------------------------------------- gradients */

/* What the families' gradient rules and backward operators share (nn_common.c). */

/* Whether every wanted input has its gradient, but for those in the mask `none` (bit i: input i has
 * none), for a rule to return. */
tern_status tern_nn_g_done(tern_grad_ctx *g, uint32_t none);

/* ReduceSum of v over the axes (keepdims as given), in the form the forward node's opset has: axes
 * as an input from opset 13, as an attribute before. */
tern_gval *tern_nn_g_reduce_sum(tern_grad_ctx *g, tern_gval *v, const int64_t *axes, int n_axes, bool keepdims);

/* A bias gradient: v (of known rank) summed over every axis but 1, to [C]. */
tern_gval *tern_nn_g_channel_sum(tern_grad_ctx *g, tern_gval *v);

/* Shape(v), or a constant when v's shape is static. */
tern_gval *tern_nn_g_shape(tern_grad_ctx *g, tern_gval *v);

/* Input `index` of a backward operator that gives a shape (int64, rank 1) as rank and dims. While its
 * values are not known, *ready is false and p->defer is set. */
tern_status tern_nn_shape_input(tern_prepare_args *p, int index, int *rank, int64_t *dims, bool *ready);

/* A tensor that stands for a shape, for the geometry code (which reads only dtype and dims). */
static inline tern_tensor tern_nn_shape_only(int dtype, int rank, const int64_t *dims)
{
	tern_tensor t;
	memset(&t, 0, sizeof t);
	t.dtype = dtype;
	t.rank = rank;
	memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
	return t;
}

/* Input 0 of a backward operator, the forward output's gradient, against the forward output's shape
 * that the operator's setup put in p->out[0]. */
tern_status tern_nn_check_dy(const tern_prepare_args *p);

#endif
