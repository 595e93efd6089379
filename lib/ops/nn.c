/* nn.c — neural-network operators: convolutions, pooling, normalisations, softmax, losses, dropout,
 * resizing. Convolution multiplies weights packed when planning with its column matrix read in place
 * from stride-phase planes of the padded input (3-D: made block by block; weights not known: im2col + the
 * shared gemm); depthwise convolution and pooling of float planes go by blocks of channels or plane by
 * plane in vectors; the rest loops over (batch, channel) planes or rows in parallel. Kernels exist for
 * float and double; float16 and bfloat16 are computed in float. */
#include "internal.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- common helpers */

/* The loops that carry the work are compiled for AVX-512, AVX2 and the baseline (TERN_ISA_VARIANTS3)
 * and run on the path tern_isa() names: the baseline x86-64 build handles 4 floats at a time. */

static size_t round_up(size_t n) { return (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN; }

static bool is_half(int dtype) { return dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16; }

/* Bytes of one element as the kernels compute it (halves are widened to float). */
static size_t compute_size(int dtype) { return dtype == TERN_DOUBLE ? 8 : 4; }

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

static bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }

static tern_status no_memory(const tern_node *node) { return tern_node_errorf(node, TERN_EOS, "out of memory"); }

static tern_status check_real(const tern_node *node, const tern_tensor *t, int index)
{
	if (t->dtype == TERN_FLOAT || t->dtype == TERN_DOUBLE || is_half(t->dtype))
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input %d has element type %s; float, double, float16 or bfloat16 expected",
	                        index, tern_dtype_name(t->dtype));
}

static tern_status check_same(const tern_node *node, const tern_tensor *x, const tern_tensor *t, int index)
{
	if (t->dtype == x->dtype)
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input %d is %s, input 0 is %s", index, tern_dtype_name(t->dtype),
	                        tern_dtype_name(x->dtype));
}

/* Input 0 of a real type and inputs 1 .. n - 1, where present, of the same type. */
static tern_status check_real_same(const tern_prepare_args *p, int n)
{
	tern_status st = check_real(p->node, p->in[0], 0);
	for (int i = 1; i < n && i < p->n_in && !st; i++)
		if (p->in[i])
			st = check_same(p->node, p->in[0], p->in[i], i);
	return st;
}

static tern_status check_rank(const tern_node *node, const tern_tensor *t, int index, int lo, int hi)
{
	if (t->rank >= lo && t->rank <= hi)
		return TERN_OK;
	char s[128];
	return tern_node_errorf(node, TERN_EDATA, "input %d %s has rank %d; %d to %d expected", index,
	                        tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), t->rank, lo, hi);
}

static tern_status check_numel(const tern_node *node, const tern_tensor *t, int index, const char *what, int64_t n)
{
	if (!t || tern_tensor_numel(t) == n)
		return TERN_OK;
	char s[128];
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' %s must have %lld elements", index, what,
	                        tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), (long long)n);
}

static tern_status bad_attr(const tern_node *node, const char *name, const char *value)
{
	return tern_node_errorf(node, TERN_EDATA, "attribute '%s' = '%s' is not supported", name, value);
}

static tern_status parse_enum(const tern_node *node, const char *attr, const char *dflt, const char *const *names,
                              int n, int *out)
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
static tern_status axis_in(const tern_node *node, int64_t axis, int rank, int *out)
{
	if (axis < -rank || axis >= (rank ? rank : 1))
		return tern_node_errorf(node, TERN_EDATA, "axis %lld is out of range for rank %d", (long long)axis, rank);
	*out = (int)(axis < 0 ? axis + rank : axis);
	return TERN_OK;
}

static int64_t prod(const int64_t *d, int from, int to)
{
	int64_t n = 1;
	for (int i = from; i < to; i++)
		n *= d[i];
	return n;
}

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

static void chunk_run(void *ctx, int64_t i)
{
	const chunked *c = ctx;
	int64_t b = i * c->per, e = b + c->per;
	if (c->slot_fn)
		c->slot_fn(c->ctx, b, e < c->n ? e : c->n, i);
	else
		c->fn(c->ctx, b, e < c->n ? e : c->n);
}

/* Chunks a few per thread, so that uneven ones even out; `slots` planned for a pool. */
static int64_t slots_for(tern_threadpool *pool) { return 4 * (int64_t)(pool ? tern_threadpool_size(pool) : 1); }

static void parallel_chunks(tern_threadpool *pool, int64_t n, int64_t grain, int64_t max_chunks, const chunked *c0)
{
	if (n <= 0)
		return;
	int64_t chunks = slots_for(pool) < max_chunks ? slots_for(pool) : max_chunks;
	int64_t per = (n + chunks - 1) / chunks;
	if (per < grain)
		per = grain;
	chunked c = *c0;
	c.n = n;
	c.per = per < n ? per : n;
	if (!pool || c.per == n)
		chunk_run(&c, 0);
	else
		tern_parallel_for(pool, (n + c.per - 1) / c.per, chunk_run, &c);
}

/* Splits [0, n) into chunks of at least `grain` items and runs fn on each. */
static void parallel_range(tern_threadpool *pool, int64_t n, int64_t grain, range_fn fn, void *ctx)
{
	chunked c = {fn, NULL, ctx, 0, 0};
	parallel_chunks(pool, n, grain, INT64_MAX, &c);
}

static void parallel_slots(tern_threadpool *pool, int64_t n, int64_t grain, int64_t slots, slot_fn fn, void *ctx)
{
	chunked c = {NULL, fn, ctx, 0, 0};
	parallel_chunks(pool, n, grain, slots, &c);
}

/* Items of `work` elements each: enough per chunk that threading pays. The team's workers spin before
 * they sleep, so a chunk of a few thousand elements is worth sharing (mobilenet_v3_small at --threads 2:
 * 0.81 -> 0.69 ms against chunks of 16384). */
#define MIN_CHUNK_WORK 4096
static int64_t grain_for(int64_t work) { return work >= MIN_CHUNK_WORK ? 1 : MIN_CHUNK_WORK / (work > 0 ? work : 1); }

/* ---------------------------------------------------------------- float16 and bfloat16 */

/* Half tensors are computed in float: prepare wraps the float kernel so that half inputs are widened
 * into scratch before it runs and half outputs narrowed after. */
#define STAGE_MAX 8

typedef struct staged {
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *);
	size_t in_off[STAGE_MAX], out_off[STAGE_MAX]; /* 0: not staged (offset 0 is the kernel's own scratch) */
} staged;

static void staged_free(void *p)
{
	staged *s = p;
	if (s && s->free_params)
		s->free_params(s->params);
	free(s);
}

static tern_status staged_kernel(const tern_kernel_args *a)
{
	const staged *s = a->params;
	tern_tensor in[STAGE_MAX], out[STAGE_MAX];
	tern_tensor *inp[STAGE_MAX], *outp[STAGE_MAX];
	char *scratch = a->scratch;
	for (int i = 0; i < a->n_in; i++) {
		inp[i] = a->in[i];
		if (!s->in_off[i] || !a->in[i])
			continue;
		in[i] = *a->in[i];
		in[i].dtype = TERN_FLOAT;
		in[i].data = scratch + s->in_off[i];
		in[i].nbytes = (size_t)tern_tensor_numel(&in[i]) * 4;
		tern_half_to_f32(a->in[i]->dtype, a->in[i]->data, in[i].data, tern_tensor_numel(&in[i]));
		inp[i] = &in[i];
	}
	for (int i = 0; i < a->n_out; i++) {
		outp[i] = a->out[i];
		if (!s->out_off[i] || !a->out[i])
			continue;
		out[i] = *a->out[i];
		out[i].dtype = TERN_FLOAT;
		out[i].data = scratch + s->out_off[i];
		out[i].nbytes = (size_t)tern_tensor_numel(&out[i]) * 4;
		outp[i] = &out[i];
	}
	tern_kernel_args inner = *a;
	inner.in = inp;
	inner.out = outp;
	inner.params = s->params;
	tern_status st = s->kernel(&inner);
	if (st)
		return st;
	for (int i = 0; i < a->n_out; i++)
		if (s->out_off[i] && a->out[i])
			tern_f32_to_half(a->out[i]->dtype, out[i].data, a->out[i]->data, tern_tensor_numel(a->out[i]));
	return TERN_OK;
}

/* Called at the end of a prepare that set a float kernel: wraps it when any tensor is half. */
static tern_status stage_halves(tern_prepare_args *p)
{
	bool any = false;
	for (int i = 0; i < p->n_in; i++)
		any |= p->in[i] && is_half(p->in[i]->dtype);
	for (int i = 0; i < p->n_out; i++)
		any |= p->out[i] && is_half(p->out[i]->dtype);
	if (!any || !p->kernel)
		return TERN_OK;
	if (p->n_in > STAGE_MAX || p->n_out > STAGE_MAX)
		return tern_node_errorf(p->node, TERN_EDATA, "too many inputs or outputs for float16 staging");
	staged *s = calloc(1, sizeof *s);
	if (!s)
		return no_memory(p->node);
	s->kernel = p->kernel;
	s->params = p->params;
	s->free_params = p->free_params;
	size_t off = round_up(p->scratch_bytes ? p->scratch_bytes : 1);
	for (int i = 0; i < p->n_in; i++)
		if (p->in[i] && is_half(p->in[i]->dtype)) {
			s->in_off[i] = off;
			off += round_up((size_t)tern_tensor_numel(p->in[i]) * 4);
		}
	for (int i = 0; i < p->n_out; i++)
		if (p->out[i] && is_half(p->out[i]->dtype)) {
			s->out_off[i] = off;
			off += round_up((size_t)tern_numel(p->out[i]->rank, p->out[i]->dims) * 4);
		}
	p->kernel = staged_kernel;
	p->params = s;
	p->free_params = staged_free;
	p->scratch_bytes = off;
	return TERN_OK;
}

/* ---------------------------------------------------------------- sliding windows */

/* Convolution and pooling geometry. Spatial dimensions (1 to 3) sit right-aligned in SP slots; unused
 * leading slots are size 1, so one 3-D loop serves 1-D, 2-D and 3-D. */
#define SP 3

typedef struct window {
	int nsp;
	int64_t in[SP], out[SP], k[SP], s[SP], d[SP], pb[SP], pe[SP];
} window;

static int64_t sp_numel(const int64_t *v) { return v[0] * v[1] * v[2]; }

static void window_init(window *w, int nsp)
{
	w->nsp = nsp;
	for (int i = 0; i < SP; i++) {
		w->in[i] = w->out[i] = w->k[i] = w->s[i] = w->d[i] = 1;
		w->pb[i] = w->pe[i] = 0;
	}
}

/* Reads an ints attribute of n (or 2n for pads) values into the right-aligned slots of dst. */
static tern_status read_ints(const tern_node *node, const char *name, int nsp, int per, int64_t min, int64_t *dst0,
                             int64_t *dst1)
{
	size_t n;
	const int64_t *v = tern_attr_ints(node, name, &n);
	if (!v)
		return TERN_OK;
	if (n != (size_t)(nsp * per))
		return tern_node_errorf(node, TERN_EDATA, "attribute '%s' has %zu values; %d expected", name, n, nsp * per);
	for (int i = 0; i < nsp * per; i++)
		if (v[i] < min)
			return tern_node_errorf(node, TERN_EDATA, "attribute '%s' value %lld is below %lld", name,
			                        (long long)v[i], (long long)min);
	for (int i = 0; i < nsp; i++) {
		dst0[SP - nsp + i] = v[i];
		if (per == 2)
			dst1[SP - nsp + i] = v[nsp + i];
	}
	return TERN_OK;
}

/* kernel_shape (or `kernel` from the weights), strides, dilations and pads of an input x whose
 * spatial dimensions follow (N, C). */
static tern_status window_read(const tern_node *node, const tern_tensor *x, const int64_t *kernel, window *w)
{
	int nsp = x->rank - 2;
	if (nsp < 1 || nsp > SP) {
		char s[128];
		return tern_node_errorf(node, TERN_EDATA, "input 0 %s: 1 to %d spatial dimensions are supported",
		                        tern_shape_str(x->dtype, x->rank, x->dims, s, sizeof s), SP);
	}
	window_init(w, nsp);
	for (int i = 0; i < nsp; i++)
		w->in[SP - nsp + i] = x->dims[2 + i];
	tern_status st = TERN_OK;
	if (kernel) {
		for (int i = 0; i < nsp; i++)
			w->k[SP - nsp + i] = kernel[i];
		size_t n;
		const int64_t *ks = tern_attr_ints(node, "kernel_shape", &n);
		for (size_t i = 0; ks && i < n; i++)
			if (n != (size_t)nsp || ks[i] != kernel[i])
				return tern_node_errorf(node, TERN_EDATA, "attribute 'kernel_shape' disagrees with the weights' shape");
	} else {
		if (!tern_attr(node, "kernel_shape"))
			return tern_node_errorf(node, TERN_EDATA, "attribute 'kernel_shape' is required");
		st = read_ints(node, "kernel_shape", nsp, 1, 1, w->k, NULL);
	}
	if (!st)
		st = read_ints(node, "strides", nsp, 1, 1, w->s, NULL);
	if (!st)
		st = read_ints(node, "dilations", nsp, 1, 1, w->d, NULL);
	if (!st)
		st = read_ints(node, "pads", nsp, 2, 0, w->pb, w->pe);
	return st;
}

/* Output size of a forward window (convolution, pooling) from auto_pad and ceil_mode. */
static tern_status window_forward(const tern_node *node, window *w, bool ceil_mode)
{
	const char *auto_pad = tern_attr_string(node, "auto_pad", "NOTSET");
	bool same_upper = streq(auto_pad, "SAME_UPPER"), same_lower = streq(auto_pad, "SAME_LOWER");
	bool valid = streq(auto_pad, "VALID");
	if (!same_upper && !same_lower && !valid && !streq(auto_pad, "NOTSET"))
		return bad_attr(node, "auto_pad", auto_pad);
	for (int i = SP - w->nsp; i < SP; i++) {
		int64_t dk = (w->k[i] - 1) * w->d[i] + 1;
		if (same_upper || same_lower) {
			w->out[i] = ceil_div(w->in[i], w->s[i]);
			int64_t total = (w->out[i] - 1) * w->s[i] + dk - w->in[i];
			if (total < 0)
				total = 0;
			w->pb[i] = same_upper ? total / 2 : total - total / 2;
			w->pe[i] = total - w->pb[i];
			continue;
		}
		if (valid)
			w->pb[i] = w->pe[i] = 0;
		int64_t span = w->in[i] + w->pb[i] + w->pe[i] - dk;
		w->out[i] = (span < 0 ? -1 : (ceil_mode ? ceil_div(span, w->s[i]) : span / w->s[i])) + 1;
		/* a window must start inside the input or its leading padding */
		if (ceil_mode && w->out[i] > 1 && (w->out[i] - 1) * w->s[i] >= w->in[i] + w->pb[i])
			w->out[i]--;
		if (w->out[i] < 1)
			return tern_node_errorf(node, TERN_EDATA,
			                        "spatial dimension %d: input %lld with kernel %lld, dilation %lld and pads %lld+%lld "
			                        "leaves no output",
			                        i - (SP - w->nsp), (long long)w->in[i], (long long)w->k[i], (long long)w->d[i],
			                        (long long)w->pb[i], (long long)w->pe[i]);
	}
	return TERN_OK;
}

/* Kernel taps j in [*lo, *hi) whose position start + j*d lies in [from, to). */
static void taps_within(int64_t start, int64_t k, int64_t d, int64_t from, int64_t to, int64_t *lo, int64_t *hi)
{
	int64_t l = start >= from ? 0 : ceil_div(from - start, d);
	int64_t h = to <= start ? 0 : ceil_div(to - start, d);
	*lo = l < k ? l : k;
	*hi = h < k ? h : k;
	if (*hi < *lo)
		*hi = *lo;
}

/* Output positions o in [*lo, *hi) whose input position o*s + off lies in [0, in). */
static void outputs_within(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
	int64_t l = off >= 0 ? 0 : ceil_div(-off, s);
	int64_t h = in - off <= 0 ? 0 : ceil_div(in - off, s);
	*lo = l < out ? l : out;
	*hi = h < out ? h : out;
	if (*hi < *lo)
		*hi = *lo;
}

/* ---------------------------------------------------------------- windows over blocks of channels */

/* padded positions of the largest depthwise plane with unit strides done by channel blocks */
#define DW_BLOCKS_MAX_PLANE (60 * 60)

/* A plane row of a few dozen positions wastes most of a vector, so with AVX-512 or AVX2 the windowed
 * operators (depthwise convolution, max and average pooling) may put channels across the vectors
 * instead: a block of 16 channels (8 with AVX2: one vector) is transposed into positions x channels
 * with its padding, each output position combines its taps as whole vectors (aligned loads whatever
 * the stride), and the result is transposed back. Planes too big for the cache go in bands of output
 * rows. */

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
static int64_t wb_extent(const window *w, int i)
{
	int64_t reach = (w->out[i] - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1, padded = w->pb[i] + w->in[i] + w->pe[i];
	return reach > padded ? reach : padded;
}

/* Channels in a block: one vector of the path. */
static int64_t wb_lanes(void) { return tern_isa() == TERN_ISA_AVX512 ? 16 : 8; }

/* Which instance of a kind suits the window: one of the fixed shapes, else the general one (4). */
static int wb_shape(const window *w)
{
	if (w->d[1] == 1 && w->d[2] == 1 && w->k[1] == w->k[2] && w->s[1] == w->s[2] && w->s[1] <= 2 &&
	    (w->k[1] == 3 || w->k[1] == 5))
		return (w->k[1] == 5) * 2 + (w->s[1] == 2);
	return 4;
}

/* Padded input rows a band of `band` output rows reads. */
static int64_t wb_rows(const window *w, int64_t band) { return (band - 1) * w->s[1] + (w->k[1] - 1) * w->d[1] + 1; }

#define WB_BAND_FLOATS (16 * 1024) /* a band's padded input, so that it stays in the first caches */

/* Whether the engine takes a window (1-D or 2-D, at most 64 taps for the convolution's weights), and
 * then the output rows per band and the scratch per slot in floats. */
static bool wb_plan(const window *w, int64_t *band, int64_t *slot_elems)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (tern_isa() < TERN_ISA_AVX2 || w->k[0] != 1 || w->in[0] != 1 || w->k[1] * w->k[2] > 64)
		return false;
	int64_t wp = wb_extent(w, 2), b = w->out[1], lanes = wb_lanes();
	while (b > 1 && wb_rows(w, b) * wp * lanes > WB_BAND_FLOATS)
		b--;
	*band = b;
	*slot_elems = (wb_rows(w, b) * wp + b * w->out[2]) * lanes;
	return true;
#else
	return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_WB 1
#define DW512 __attribute__((target("avx512f")))
#define WB_PREFETCH 64 /* floats ahead in each plane of a block */

/* AVX2 helpers of the engine's 8-channel build. */
#define WB8 TERN_TARGET_AVX2

/* Transposes 8 x 8 floats held in 8 AVX registers: r[i] lane j becomes r[j] lane i. */
WB8 static inline __attribute__((always_inline)) void tr8(__m256 r[8])
{
	__m256 t[8], u[8];
	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
	}
	for (int i = 0; i < 8; i += 4) {
		u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
		u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
		u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
		u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
	}
	for (int i = 0; i < 4; i++) {
		r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
		r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
	}
}

/* Lanes below n set: a mask for the AVX2 masked loads and stores. */
WB8 static inline __attribute__((always_inline)) __m256i lanes_below(int64_t n)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The engine, built once per vector width: window_blocks.h is written against the WB_ vocabulary. */
#define WB_LANES 16
#define WB_ATTR TERN_TARGET_AVX512
#define WB_V __m512
#define WB_MASK_T __mmask16
#define WB_MASK(n) ((__mmask16)(0xffffu >> (16 - (n))))
#define WB_LOAD _mm512_load_ps
#define WB_LOADU _mm512_loadu_ps
#define WB_STORE _mm512_store_ps
#define WB_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define WB_MSTORE(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define WB_SET1 _mm512_set1_ps
#define WB_ZERO _mm512_setzero_ps
#define WB_VFMA _mm512_fmadd_ps
#define WB_VMAX _mm512_max_ps
#define WB_VADD _mm512_add_ps
#define WB_VMUL _mm512_mul_ps
#define WB_TRANSPOSE tern_tr16
#include "ops/window_blocks.h"

#define WB_LANES 8
#define WB_ATTR TERN_TARGET_AVX2
#define WB_V __m256
#define WB_MASK_T __m256i
#define WB_MASK lanes_below
#define WB_LOAD _mm256_load_ps
#define WB_LOADU _mm256_loadu_ps
#define WB_STORE _mm256_store_ps
#define WB_MLOAD(m, p) _mm256_maskload_ps(p, m)
#define WB_MSTORE(p, m, v) _mm256_maskstore_ps(p, m, v)
#define WB_SET1 _mm256_set1_ps
#define WB_ZERO _mm256_setzero_ps
#define WB_VFMA _mm256_fmadd_ps
#define WB_VMAX _mm256_max_ps
#define WB_VADD _mm256_add_ps
#define WB_VMUL _mm256_mul_ps
#define WB_TRANSPOSE tr8
#include "ops/window_blocks.h"

static void wb_run(tern_threadpool *pool, const wb_job *j, int64_t slots)
{
	int64_t lanes = wb_lanes(), blocks = j->n * ((j->channels + lanes - 1) / lanes);
	int64_t work = lanes * j->w->out[1] * j->w->out[2] * j->w->k[1] * j->w->k[2];
	parallel_slots(pool, blocks, grain_for(work), slots, lanes == 16 ? wb_task_16 : wb_task_8, (void *)j);
}
#else
static void wb_run(tern_threadpool *pool, const wb_job *j, int64_t slots) {}
#endif

/* ---------------------------------------------------------------- pooling */

typedef enum pool_kind { POOL_MAX, POOL_AVG, POOL_LP } pool_kind;

/* Per spatial slot and output position: the kernel taps [lo, hi) inside the input and, for
 * count_include_pad, [pad_lo, pad_hi) inside the padded input. Computed once when planning, so the
 * loops below do no division. */
enum { TAP_LO, TAP_HI, TAP_PAD_LO, TAP_PAD_HI, TAP_FIELDS };

typedef struct pool_params {
	window w;
	pool_kind kind;
	bool count_include_pad, column_major;
	int64_t p; /* LpPool's exponent */
	int64_t planes;
	bool global;
	int64_t *taps[SP]; /* TAP_FIELDS entries per output position, in the same allocation */
	int64_t *rows2;    /* per tap of the last slot: the outputs [lo, hi) whose tap is inside the input */
	/* float max and average pooling of 1-D and 2-D planes by blocks of channels */
	bool blocks;
	int64_t band, slot_elems, slots;
	float *recip; /* average: 1 / divisor per output position */
} pool_params;

typedef struct pool_ctx {
	const pool_params *pp;
	int dtype;
	const void *x;
	void *y;
	int64_t *ind;
} pool_ctx;

/* One (n, c) plane of a windowed pool, output row by output row: each kernel tap adds one strided
 * input row into the whole output row (the outputs whose tap lies inside the input), so the inner
 * loops carry no bounds tests. Indices (MaxPool's second output) take the per-output path: flat
 * positions in the whole input, row-major or (storage_order 1) column-major over the spatial axes. */
#define DEF_POOL_PLANE(S, T, LOWEST)                                                                            \
	static void pool_argmax_##S(const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base)          \
	{                                                                                                       \
		const window *w = &pp->w;                                                                            \
		int64_t o = 0;                                                                                       \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                         \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];                \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                     \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];             \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++, o++) {                                            \
					const int64_t *t2 = pp->taps[2] + o2 * TAP_FIELDS, s2 = o2 * w->s[2] - w->pb[2];         \
					T best = LOWEST;                                                                         \
					int64_t at = -1;                                                                         \
					for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++) {                                   \
						int64_t i0 = s0 + k0 * w->d[0];                                                      \
						for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                               \
							int64_t i1 = s1 + k1 * w->d[1];                                                  \
							for (int64_t k2 = t2[TAP_LO]; k2 < t2[TAP_HI]; k2++) {                           \
								int64_t i2 = s2 + k2 * w->d[2];                                              \
								T v = x[(i0 * w->in[1] + i1) * w->in[2] + i2];                               \
								if (v > best || at < 0) {                                                    \
									best = v;                                                                \
									at = pp->column_major ? i0 + i1 * w->in[0] + i2 * w->in[0] * w->in[1]    \
									                      : (i0 * w->in[1] + i1) * w->in[2] + i2;            \
								}                                                                            \
							}                                                                                \
						}                                                                                    \
					}                                                                                        \
					y[o] = at < 0 ? 0 : best;                                                                \
					ind[o] = base + (at < 0 ? 0 : at);                                                       \
				}                                                                                            \
			}                                                                                                \
		}                                                                                                    \
	}                                                                                                        \
	TERN_ISA_BODY void pool_plane_##S##_body(const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base)           \
	{                                                                                                       \
		if (ind) {                                                                                           \
			pool_argmax_##S(pp, x, y, ind, base);                                                            \
			return;                                                                                          \
		}                                                                                                    \
		const window *w = &pp->w;                                                                            \
		const int64_t *t2 = pp->taps[2], *rows2 = pp->rows2;                                                 \
		bool is_max = pp->kind == POOL_MAX, square = pp->kind == POOL_LP && pp->p == 2;                      \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                         \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];                \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                     \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];             \
				T *restrict yr = y + (o0 * w->out[1] + o1) * w->out[2];                                      \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++)                                                   \
					yr[o2] = is_max ? LOWEST : 0;                                                            \
				for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                                         \
					for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                                   \
						const T *row = x + ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * w->in[2];   \
						for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                           \
							const T *restrict xs = row + k2 * w->d[2] - w->pb[2];                            \
							int64_t lo = rows2[2 * k2], hi = rows2[2 * k2 + 1], st = w->s[2];                \
							if (is_max)                                                                      \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] = xs[o2 * st] > yr[o2] ? xs[o2 * st] : yr[o2];                    \
							else if (pp->kind == POOL_AVG)                                                   \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += xs[o2 * st];                                                   \
							else if (square)                                                                 \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += xs[o2 * st] * xs[o2 * st];                                     \
							else                                                                             \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += (T)pow(fabs((double)xs[o2 * st]), (double)pp->p);              \
						}                                                                                    \
					}                                                                                        \
				int64_t n01 = (t0[TAP_HI] - t0[TAP_LO]) * (t1[TAP_HI] - t1[TAP_LO]);                         \
				int64_t p01 = (t0[TAP_PAD_HI] - t0[TAP_PAD_LO]) * (t1[TAP_PAD_HI] - t1[TAP_PAD_LO]);         \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++) {                                                 \
					const int64_t *t = t2 + o2 * TAP_FIELDS;                                                 \
					int64_t count = n01 * (t[TAP_HI] - t[TAP_LO]);                                           \
					if (is_max)                                                                              \
						yr[o2] = count ? yr[o2] : 0;                                                         \
					else if (pp->kind == POOL_LP)                                                            \
						yr[o2] = (T)(square ? sqrt((double)yr[o2]) : pow((double)yr[o2], 1.0 / (double)pp->p)); \
					else {                                                                                   \
						if (pp->count_include_pad)                                                           \
							count = p01 * (t[TAP_PAD_HI] - t[TAP_PAD_LO]);                                   \
						yr[o2] = count ? (T)((double)yr[o2] / (double)count) : 0;                            \
					}                                                                                        \
				}                                                                                            \
			}                                                                                                \
		}                                                                                                    \
	} \
	TERN_ISA_VARIANTS3(void, pool_plane_##S, (const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base), (pp, x, y, ind, base))

DEF_POOL_PLANE(f32, float, -INFINITY)
DEF_POOL_PLANE(f64, double, -INFINITY)
DEF_POOL_PLANE(i8, int8_t, INT8_MIN)
DEF_POOL_PLANE(u8, uint8_t, 0)

/* Global pools reduce a whole plane. */
/* A sum in double over eight partial sums, which vectorises where one running sum cannot. */
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

#define DEF_GLOBAL_PLANE(S, T)                                                                 \
	TERN_ISA_BODY void global_plane_##S##_body(const pool_params *pp, const T *x, T *y, int64_t n)          \
	{                                                                                       \
		if (pp->kind == POOL_MAX) {                                                         \
			T best = x[0];                                                                  \
			for (int64_t i = 1; i < n; i++)                                                 \
				best = x[i] > best ? x[i] : best;                                           \
			*y = best;                                                                      \
			return;                                                                         \
		}                                                                                   \
		if (pp->kind == POOL_AVG) {                                                         \
			*y = (T)(sum_##S(x, n) / (double)n);                                            \
			return;                                                                         \
		}                                                                                   \
		double sum = 0;                                                                     \
		for (int64_t i = 0; i < n; i++)                                                     \
			sum += pp->p == 2 ? (double)x[i] * x[i] : pow(fabs((double)x[i]), (double)pp->p); \
		*y = (T)(pp->p == 2 ? sqrt(sum) : pow(sum, 1.0 / (double)pp->p));                   \
	} \
	TERN_ISA_VARIANTS3(void, global_plane_##S, (const pool_params *pp, const T *x, T *y, int64_t n), (pp, x, y, n))

DEF_GLOBAL_PLANE(f32, float)
DEF_GLOBAL_PLANE(f64, double)
DEF_GLOBAL_PLANE(i8, int8_t)
DEF_GLOBAL_PLANE(u8, uint8_t)

static void pool_planes(void *ctx, int64_t begin, int64_t end)
{
	const pool_ctx *c = ctx;
	const pool_params *pp = c->pp;
	int64_t in_n = sp_numel(pp->w.in), out_n = pp->global ? 1 : sp_numel(pp->w.out);
	for (int64_t i = begin; i < end; i++) {
		int64_t *ind = c->ind ? c->ind + i * out_n : NULL;
#define POOL_CASE(S, T)                                              \
	{                                                                \
		const T *x = (const T *)c->x + i * in_n;                     \
		T *y = (T *)c->y + i * out_n;                                \
		if (pp->global)                                              \
			global_plane_##S(pp, x, y, in_n);                        \
		else                                                         \
			pool_plane_##S(pp, x, y, ind, i * in_n);                 \
		break;                                                       \
	}
		switch (c->dtype) {
		case TERN_FLOAT: POOL_CASE(f32, float)
		case TERN_DOUBLE: POOL_CASE(f64, double)
		case TERN_INT8: POOL_CASE(i8, int8_t)
		case TERN_UINT8: POOL_CASE(u8, uint8_t)
		}
#undef POOL_CASE
	}
}

static tern_status pool_kernel(const tern_kernel_args *a)
{
	const pool_params *pp = a->params;
	pool_ctx c = {pp, a->in[0]->dtype, a->in[0]->data, a->out[0]->data,
	              a->n_out > 1 && a->out[1] ? a->out[1]->data : NULL};
	if (pp->blocks) {
		wb_job j = {&pp->w, pp->kind == POOL_MAX ? WB_MAX : WB_AVG, a->in[0]->dims[0], a->in[0]->dims[1], pp->band,
		            pp->slot_elems, a->in[0]->data, NULL, NULL, pp->recip, a->out[0]->data, a->scratch, NULL, NULL};
		wb_run(a->pool, &j, pp->slots);
		return TERN_OK;
	}
	int64_t work = pp->global ? sp_numel(pp->w.in) : sp_numel(pp->w.out) * sp_numel(pp->w.k);
	parallel_range(a->pool, pp->planes, grain_for(work), pool_planes, &c);
	return TERN_OK;
}

static void pool_params_free(void *p)
{
	pool_params *pp = p;
	if (pp) {
		free(pp->taps[0]);
		free(pp->recip);
	}
	free(pp);
}

/* Whether max or average pooling goes by blocks of channels (float, no indices output, every window
 * with an input element); then its plan and scratch, and for the average the divisors. */
static tern_status pool_blocks_setup(tern_prepare_args *p, pool_params *pp)
{
	const window *w = &pp->w;
	int dtype = p->in[0]->dtype;
	if (pp->global || (pp->kind != POOL_MAX && pp->kind != POOL_AVG) || dtype == TERN_DOUBLE ||
	    dtype == TERN_INT8 || dtype == TERN_UINT8 || (p->n_out > 1 && p->out[1]) ||
	    !wb_plan(w, &pp->band, &pp->slot_elems))
		return TERN_OK;
	for (int i = 1; i < SP; i++)
		for (int64_t o = 0; o < w->out[i]; o++)
			if (pp->taps[i][o * TAP_FIELDS + TAP_HI] <= pp->taps[i][o * TAP_FIELDS + TAP_LO])
				return TERN_OK;
	if (pp->kind == POOL_AVG) {
		if (!(pp->recip = malloc((size_t)(w->out[1] * w->out[2]) * sizeof *pp->recip)))
			return no_memory(p->node);
		int lo = pp->count_include_pad ? TAP_PAD_LO : TAP_LO, hi = pp->count_include_pad ? TAP_PAD_HI : TAP_HI;
		for (int64_t o1 = 0; o1 < w->out[1]; o1++)
			for (int64_t o2 = 0; o2 < w->out[2]; o2++) {
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, *t2 = pp->taps[2] + o2 * TAP_FIELDS;
				pp->recip[o1 * w->out[2] + o2] = (float)(1.0 / (double)((t1[hi] - t1[lo]) * (t2[hi] - t2[lo])));
			}
	}
	pp->blocks = true;
	pp->slots = slots_for(p->pool);
	p->scratch_bytes = (size_t)(pp->slots * pp->slot_elems) * sizeof(float);
	return TERN_OK;
}

static tern_status pool_taps(const tern_node *node, pool_params *pp)
{
	const window *w = &pp->w;
	int64_t *t = malloc(((size_t)(w->out[0] + w->out[1] + w->out[2]) * TAP_FIELDS + 2 * (size_t)w->k[2]) * sizeof *t);
	if (!t)
		return no_memory(node);
	for (int i = 0; i < SP; i++) {
		pp->taps[i] = t;
		for (int64_t o = 0; o < w->out[i]; o++, t += TAP_FIELDS) {
			int64_t start = o * w->s[i] - w->pb[i];
			taps_within(start, w->k[i], w->d[i], 0, w->in[i], &t[TAP_LO], &t[TAP_HI]);
			taps_within(start, w->k[i], w->d[i], -w->pb[i], w->in[i] + w->pe[i], &t[TAP_PAD_LO], &t[TAP_PAD_HI]);
		}
	}
	pp->rows2 = t;
	for (int64_t k = 0; k < w->k[2]; k++)
		outputs_within(k * w->d[2] - w->pb[2], w->s[2], w->in[2], w->out[2], &t[2 * k], &t[2 * k + 1]);
	return TERN_OK;
}

static tern_status pool_setup(tern_prepare_args *p, pool_kind kind, bool global)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	bool int8 = x->dtype == TERN_INT8 || x->dtype == TERN_UINT8;
	tern_status st = int8 && kind == POOL_MAX && !global ? TERN_OK : check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 3, SP + 2);
	if (st)
		return st;
	pool_params *pp = calloc(1, sizeof *pp);
	if (!pp)
		return no_memory(node);
	p->params = pp;
	p->free_params = pool_params_free;
	pp->kind = kind;
	pp->global = global;
	pp->planes = x->dims[0] * x->dims[1];
	pp->p = tern_attr_int(node, "p", 2);
	if (kind == POOL_LP && pp->p < 1)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'p' = %lld must be at least 1", (long long)pp->p);
	int64_t dims[TERN_MAX_RANK];
	dims[0] = x->dims[0];
	dims[1] = x->dims[1];
	if (global) {
		window_init(&pp->w, x->rank - 2);
		for (int i = 0; i < x->rank - 2; i++) {
			pp->w.in[SP - (x->rank - 2) + i] = x->dims[2 + i];
			dims[2 + i] = 1;
		}
	} else {
		if ((st = window_read(node, x, NULL, &pp->w)))
			return st;
		int64_t ceil_mode = tern_attr_int(node, "ceil_mode", 0);
		if ((st = window_forward(node, &pp->w, ceil_mode != 0)))
			return st;
		for (int i = 0; i < pp->w.nsp; i++)
			dims[2 + i] = pp->w.out[SP - pp->w.nsp + i];
		if ((st = pool_taps(node, pp)))
			return st;
		pp->count_include_pad = tern_attr_int(node, "count_include_pad", 0) != 0;
		int64_t order = tern_attr_int(node, "storage_order", 0);
		if (order != 0 && order != 1)
			return tern_node_errorf(node, TERN_EDATA, "attribute 'storage_order' = %lld must be 0 or 1", (long long)order);
		pp->column_major = order == 1;
	}
	if (tern_numel(x->rank, x->dims) == 0 && global)
		return tern_node_errorf(node, TERN_EDATA, "global pooling of an empty input");
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	if (p->n_out > 1 && p->out[1]) {
		if (kind != POOL_MAX)
			return tern_node_errorf(node, TERN_EDATA, "only MaxPool has an indices output");
		tern_set_shape(p->out[1], TERN_INT64, x->rank, dims);
	}
	if ((st = pool_blocks_setup(p, pp)))
		return st;
	p->kernel = pool_kernel;
	return stage_halves(p);
}

static tern_status maxpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_MAX, false); }
static tern_status avgpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_AVG, false); }
static tern_status lppool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_LP, false); }
static tern_status global_maxpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_MAX, true); }
static tern_status global_avgpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_AVG, true); }
static tern_status global_lppool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_LP, true); }

/* ---------------------------------------------------------------- convolution */

typedef struct conv_params {
	window w; /* for ConvTranspose and Col2Im: in = the image written, out = the positions read */
	int64_t n, cin, cout, group, cg, mg, kk, in_sp, out_sp;
	bool pointwise; /* 1x1, stride 1, no padding: the input is its own column matrix */
	bool depthwise; /* one input channel per group: direct loops beat a product with K = kernel size */
	int64_t *rows2; /* depthwise: per tap of the last slot, the outputs [lo, hi) it reaches inside the input */
	/* Depthwise float 1-D and 2-D: input planes split by stride phase (below), in scratch per slot */
	bool dw_grid, dw_blocks;
	int64_t slots, slot_elems, band;
	struct dw_shape const *dw_kernel; /* a kernel for the machine and this shape, else NULL */
	/* tern.FusedConv: act(conv + Z) (Z, input 3, optional), applied as outputs are finished where the
	 * path allows (in_pass: after the whole output otherwise) */
	bool fused, in_pass;
	tern_act act;
	int64_t offset_group; /* DeformConv */
	tern_packed **packed; /* float32 weights known when planning, packed per group */
	struct conv_tap *taps; /* with packed weights, 3-D: per kernel tap, its offsets and reach */
	/* With packed weights, 1-D and 2-D: the product reads its column matrix in place from the input,
	 * zero-padded and split by stride phase into planes hq x wq: tap (k1, k2) of channel c at output
	 * (o1, o2) is element (o1 + (k1 d1) / s1, o2 + (k2 d2) / s2) of channel c's plane of phase
	 * ((k1 d1) % s1, (k2 d2) % s2), so that each row of the column matrix is a plane shifted by
	 * row_off. Without padding and strides the input is its own plane. The rows kernel then
	 * computes a grid of out[1] x wq positions (the columns past out[2] are dropped when copied to
	 * the output); the cols kernel computes the output rows directly. */
	bool direct, split;
	tern_gemm_kind kind;
	int64_t hq, wq, n_phases, grid_n;
	int64_t *phases;  /* per phase plane: its first row and column in the padded input */
	int64_t *row_off; /* per row (channel, tap) of the column matrix */
	size_t grid_off;  /* scratch: phase planes first, then the rows kernel's grid */
} conv_params;

/* A kernel tap's input offsets (d0, d1 in slots 0 and 1; d2, padding included, in slot 2) and the
 * output positions [lo, hi) of a row whose input under the tap is inside the input. */
typedef struct conv_tap {
	int64_t d0, d1, d2, lo, hi;
} conv_tap;

static void conv_params_free(void *p)
{
	conv_params *cp = p;
	if (cp) {
		free(cp->rows2);
		free(cp->taps);
		free(cp->phases);
		free(cp->row_off);
		for (int64_t g = 0; cp->packed && g < cp->group; g++)
			tern_packed_free(cp->packed[g]);
		free(cp->packed);
	}
	free(cp);
}

/* Packs each group's float32 weights, m x k (or, transposed, k x m), when they are known already. */
static tern_status pack_groups(const tern_node *node, conv_params *cp, const tern_tensor *wt, int64_t m, int64_t k,
                               bool trans)
{
	if (wt->dtype != TERN_FLOAT || !wt->data)
		return TERN_OK;
	if (!(cp->packed = calloc((size_t)cp->group, sizeof *cp->packed)))
		return no_memory(node);
	for (int64_t g = 0; g < cp->group; g++)
		if (!(cp->packed[g] = tern_pack_a(m, k, (const float *)wt->data + g * m * k, trans ? m : k, trans, 1.0f)))
			return no_memory(node);
	return TERN_OK;
}

typedef struct im2col_ctx {
	const window *w;
	size_t es;
	const char *x;
	char *col;
} im2col_ctx;

static void copy_strided(size_t es, char *dst, const char *src, int64_t n, int64_t stride)
{
	if (stride == 1) {
		memcpy(dst, src, (size_t)n * es);
		return;
	}
#define COPY_STRIDED(T)                                   \
	for (int64_t i = 0; i < n; i++)                       \
		((T *)dst)[i] = ((const T *)src)[i * stride];     \
	return
	switch (es) {
	case 8: COPY_STRIDED(uint64_t);
	case 4: COPY_STRIDED(uint32_t);
	case 2: COPY_STRIDED(uint16_t);
	default: COPY_STRIDED(uint8_t);
	}
#undef COPY_STRIDED
}

/* Rows of the column matrix for channels [begin, end): row (c, k0, k1, k2) holds, for every output
 * position, the input element under that kernel tap, or 0 in the padding. */
TERN_ISA_BODY void im2col_channels_body(void *ctx, int64_t begin, int64_t end)
{
	const im2col_ctx *c = ctx;
	const window *w = c->w;
	size_t es = c->es;
	int64_t in_sp = sp_numel(w->in), out_sp = sp_numel(w->out);
	for (int64_t ch = begin; ch < end; ch++) {
		const char *xc = c->x + (size_t)(ch * in_sp) * es;
		for (int64_t k0 = 0; k0 < w->k[0]; k0++)
			for (int64_t k1 = 0; k1 < w->k[1]; k1++)
				for (int64_t k2 = 0; k2 < w->k[2]; k2++) {
					int64_t row = ((ch * w->k[0] + k0) * w->k[1] + k1) * w->k[2] + k2;
					char *dst = c->col + (size_t)(row * out_sp) * es;
					int64_t off2 = k2 * w->d[2] - w->pb[2], lo, hi;
					outputs_within(off2, w->s[2], w->in[2], w->out[2], &lo, &hi);
					for (int64_t o0 = 0; o0 < w->out[0]; o0++) {
						int64_t i0 = o0 * w->s[0] - w->pb[0] + k0 * w->d[0];
						for (int64_t o1 = 0; o1 < w->out[1]; o1++) {
							int64_t i1 = o1 * w->s[1] - w->pb[1] + k1 * w->d[1];
							char *drow = dst + (size_t)((o0 * w->out[1] + o1) * w->out[2]) * es;
							if (i0 < 0 || i0 >= w->in[0] || i1 < 0 || i1 >= w->in[1]) {
								memset(drow, 0, (size_t)w->out[2] * es);
								continue;
							}
							const char *xrow = xc + (size_t)((i0 * w->in[1] + i1) * w->in[2]) * es;
							memset(drow, 0, (size_t)lo * es);
							copy_strided(es, drow + (size_t)lo * es, xrow + (size_t)(lo * w->s[2] + off2) * es, hi - lo,
							             w->s[2]);
							memset(drow + (size_t)hi * es, 0, (size_t)(w->out[2] - hi) * es);
						}
					}
				}
	}
}
TERN_ISA_VARIANTS3(void, im2col_channels, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

static void im2col(tern_threadpool *pool, const window *w, size_t es, int64_t channels, const void *x, void *col)
{
	im2col_ctx c = {w, es, x, col};
	parallel_range(pool, channels, grain_for(sp_numel(w->k) * sp_numel(w->out)), im2col_channels, &c);
}

/* The adjoint of im2col: every column entry is added onto the image element under its tap. One
 * channel's rows only touch that channel's plane, so channels run in parallel. */
#define DEF_COL2IM(S, T)                                                                                  \
	TERN_ISA_BODY void col2im_channels_##S##_body(void *ctx, int64_t begin, int64_t end)                                \
	{                                                                                                     \
		const plain_ctx *c = ctx; /* params: the window, x: the columns, y: the image */                  \
		const window *w = c->params;                                                                      \
		int64_t in_sp = sp_numel(w->in), out_sp = sp_numel(w->out);                                       \
		for (int64_t ch = begin; ch < end; ch++) {                                                        \
			T *img = (T *)c->y + ch * in_sp;                                                              \
			memset(img, 0, (size_t)in_sp * sizeof(T));                                                    \
			for (int64_t k0 = 0; k0 < w->k[0]; k0++)                                                      \
				for (int64_t k1 = 0; k1 < w->k[1]; k1++)                                                  \
					for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                            \
						int64_t row = ((ch * w->k[0] + k0) * w->k[1] + k1) * w->k[2] + k2;                \
						const T *src = (const T *)c->x + row * out_sp;                                    \
						int64_t off2 = k2 * w->d[2] - w->pb[2], lo, hi;                                   \
						outputs_within(off2, w->s[2], w->in[2], w->out[2], &lo, &hi);                     \
						for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                      \
							int64_t i0 = o0 * w->s[0] - w->pb[0] + k0 * w->d[0];                          \
							if (i0 < 0 || i0 >= w->in[0])                                                 \
								continue;                                                                 \
							for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                  \
								int64_t i1 = o1 * w->s[1] - w->pb[1] + k1 * w->d[1];                      \
								if (i1 < 0 || i1 >= w->in[1])                                             \
									continue;                                                             \
								const T *srow = src + (o0 * w->out[1] + o1) * w->out[2];                  \
								T *irow = img + (i0 * w->in[1] + i1) * w->in[2] + off2;                   \
								for (int64_t o2 = lo; o2 < hi; o2++)                                      \
									irow[o2 * w->s[2]] += srow[o2];                                       \
							}                                                                             \
						}                                                                                 \
					}                                                                                     \
		}                                                                                                 \
	} \
	TERN_ISA_VARIANTS3(void, col2im_channels_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_COL2IM(f32, float)
DEF_COL2IM(f64, double)

static void col2im(tern_threadpool *pool, int dtype, const window *w, int64_t channels, const void *col, void *img)
{
	plain_ctx c = {w, col, img};
	parallel_range(pool, channels, grain_for(sp_numel(w->k) * sp_numel(w->out)),
	               dtype == TERN_DOUBLE ? col2im_channels_f64 : col2im_channels_f32, &c);
}

typedef struct conv_ctx {
	const conv_params *cp;
	const void *x, *wt, *bias;
	void *y, *scratch;
	const float *z; /* tern.FusedConv's residual input, or NULL */
} conv_ctx;

/* Depthwise convolution, one output plane per call: for each kernel tap, a whole output row gains
 * weight * a strided input row, which vectorises when the stride is 1. */
#define DEF_DEPTHWISE(S, T)                                                                                    \
	TERN_ISA_BODY void depthwise_planes_##S##_body(void *ctx, int64_t begin, int64_t end)                                    \
	{                                                                                                          \
		const conv_ctx *c = ctx;                                                                               \
		const conv_params *cp = c->cp;                                                                         \
		const window *w = &cp->w;                                                                              \
		for (int64_t plane = begin; plane < end; plane++) {                                                    \
			int64_t n = plane / cp->cout, m = plane % cp->cout;                                                \
			const T *x = (const T *)c->x + (n * cp->cin + m / cp->mg) * cp->in_sp;                             \
			const T *wk = (const T *)c->wt + m * cp->kk;                                                       \
			T *y = (T *)c->y + plane * cp->out_sp;                                                             \
			T b = c->bias ? ((const T *)c->bias)[m] : 0;                                                       \
			for (int64_t i = 0; i < cp->out_sp; i++)                                                           \
				y[i] = b;                                                                                      \
			for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                       \
				int64_t s0 = o0 * w->s[0] - w->pb[0], l0, h0;                                                  \
				taps_within(s0, w->k[0], w->d[0], 0, w->in[0], &l0, &h0);                                      \
				for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                   \
					int64_t s1 = o1 * w->s[1] - w->pb[1], l1, h1;                                              \
					taps_within(s1, w->k[1], w->d[1], 0, w->in[1], &l1, &h1);                                  \
					T *restrict yrow = y + (o0 * w->out[1] + o1) * w->out[2];                                  \
					for (int64_t k0 = l0; k0 < h0; k0++)                                                       \
						for (int64_t k1 = l1; k1 < h1; k1++) {                                                 \
							const T *xrow = x + ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * w->in[2]; \
							for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                         \
								T wv = wk[(k0 * w->k[1] + k1) * w->k[2] + k2];                                 \
								int64_t off = k2 * w->d[2] - w->pb[2], lo = cp->rows2[2 * k2], hi = cp->rows2[2 * k2 + 1]; \
								const T *restrict xs = xrow + off;                                             \
								if (w->s[2] == 1)                                                              \
									for (int64_t o2 = lo; o2 < hi; o2++)                                       \
										yrow[o2] += wv * xs[o2];                                               \
								else                                                                           \
									for (int64_t o2 = lo; o2 < hi; o2++)                                       \
										yrow[o2] += wv * xs[o2 * w->s[2]];                                     \
							}                                                                                  \
						}                                                                                      \
				}                                                                                              \
			}                                                                                                  \
		}                                                                                                      \
	} \
	TERN_ISA_VARIANTS3(void, depthwise_planes_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_DEPTHWISE(f32, float)
DEF_DEPTHWISE(f64, double)

static void add_bias_rows(int dtype, void *y, const void *bias, int64_t rows, int64_t cols)
{
	for (int64_t r = 0; r < rows; r++) {
		if (dtype == TERN_DOUBLE) {
			double *yr = (double *)y + r * cols, b = ((const double *)bias)[r];
			for (int64_t i = 0; i < cols; i++)
				yr[i] += b;
		} else {
			float *yr = (float *)y + r * cols, b = ((const float *)bias)[r];
			for (int64_t i = 0; i < cols; i++)
				yr[i] += b;
		}
	}
}

static void gemm_typed(int dtype, bool ta, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                       const void *b, int64_t ldb, void *c)
{
	if (dtype == TERN_DOUBLE)
		tern_gemm_f64(ta, false, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, n);
	else
		tern_gemm_f32(ta, false, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
}

/* One group's product Y = op(W_g) B (m x n, shared dimension k), plus bias[i] on row i when given:
 * through the weights packed when planning if there are some, else the shared gemm. */
static void group_product(const tern_kernel_args *a, const conv_params *cp, int64_t g, bool trans, int64_t m,
                          int64_t n, int64_t k, const void *w, const void *b, const void *bias, void *y)
{
	int dtype = a->in[0]->dtype;
	if (cp->packed) {
		tern_gemm_packed(a->pool, cp->packed[g], n, b, n, bias, y, n);
		return;
	}
	gemm_typed(dtype, trans, m, n, k, w, trans ? m : k, b, n, y);
	if (bias)
		add_bias_rows(dtype, y, bias, m, n);
}

/* The column matrix one block at a time, for the packed product: rows [k0, k0 + kc) (input channel,
 * kernel tap) by output positions [col0, col0 + cols). The positions are cut once into runs along
 * output rows; each row of the block then copies its input row segments and pads the rest. */
typedef struct conv_fill_ctx {
	const conv_params *cp;
	const float *x; /* the group's first input channel */
} conv_fill_ctx;

typedef struct fill_run {
	int64_t at, o2, end; /* block columns from `at`: output positions o2 .. end - 1 of one output row */
	int64_t i0, i1;      /* that row's first input position in slots 0 and 1, before the tap's offset */
} fill_run;

TERN_ISA_BODY void conv_fill_body(const void *ctx, int64_t k0, int64_t kc, int64_t col0, int64_t cols, float *block, int64_t nr)
{
	const conv_fill_ctx *f = ctx;
	const conv_params *cp = f->cp;
	const window *w = &cp->w;
	fill_run runs[TERN_PACKED_MAX_NR];
	int n_runs = 0;
	int64_t o2 = col0 % w->out[2], o1 = col0 / w->out[2] % w->out[1], o0 = col0 / w->out[2] / w->out[1];
	for (int64_t done = 0; done < cols; n_runs++) {
		int64_t len = cols - done < w->out[2] - o2 ? cols - done : w->out[2] - o2;
		runs[n_runs] = (fill_run){done, o2, o2 + len, o0 * w->s[0] - w->pb[0], o1 * w->s[1] - w->pb[1]};
		done += len;
		o2 = 0;
		if (++o1 == w->out[1]) {
			o1 = 0;
			o0++;
		}
	}
	int64_t s2 = w->s[2];
	for (int64_t r = 0; r < kc; r++) {
		int64_t ch = (k0 + r) / cp->kk;
		const conv_tap *t = &cp->taps[(k0 + r) % cp->kk];
		const float *xc = f->x + ch * cp->in_sp;
		float *dst = block + r * nr;
		for (int i = 0; i < n_runs; i++) {
			const fill_run *u = &runs[i];
			int64_t i0 = u->i0 + t->d0, i1 = u->i1 + t->d1;
			float *d = dst + u->at - u->o2;
			/* outputs [lo, hi) of the run read inside the input row; the others are padding */
			int64_t lo = t->lo < u->o2 ? u->o2 : t->lo > u->end ? u->end : t->lo;
			int64_t hi = t->hi < lo ? lo : t->hi > u->end ? u->end : t->hi;
			if (i0 < 0 || i0 >= w->in[0] || i1 < 0 || i1 >= w->in[1])
				lo = hi = u->end;
			const float *xr = xc + (i0 * w->in[1] + i1) * w->in[2] + t->d2;
			for (int64_t o = u->o2; o < lo; o++)
				d[o] = 0;
			if (s2 == 1)
				for (int64_t o = lo; o < hi; o++)
					d[o] = xr[o];
			else
				for (int64_t o = lo; o < hi; o++)
					d[o] = xr[o * s2];
			for (int64_t o = hi; o < u->end; o++)
				d[o] = 0;
		}
		for (int64_t o = cols; o < nr; o++)
			dst[o] = 0;
	}
}
TERN_ISA_VARIANTS3(void, conv_fill, (const void *ctx, int64_t k0, int64_t kc, int64_t col0, int64_t cols, float *block, int64_t nr), (ctx, k0, kc, col0, cols, block, nr))

typedef struct phase_ctx {
	const conv_params *cp;
	const float *x;
	float *planes;
} phase_ctx;

/* dst[j] = src[2 j] for j < n, sixteen at a time from two vectors. */
typedef float vec16f __attribute__((vector_size(64)));
typedef float vec16fu __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t vec16i __attribute__((vector_size(64)));
#if defined(__clang__)
#define EVEN_LANES(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#else
#define EVEN_LANES(a, b) __builtin_shuffle(a, b, (vec16i){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30})
#endif

TERN_ISA_BODY void every_other_body(const float *restrict src, float *restrict dst, int64_t n, int64_t readable)
{
	/* the vectors at j read src[2 j .. 2 j + 31]; src[0 .. readable) may be read */
	int64_t j = 0;
	for (; j + 16 <= n && 2 * j + 32 <= readable; j += 16) {
		vec16f a = *(const vec16fu *)(src + 2 * j), b = *(const vec16fu *)(src + 2 * j + 16);
		*(vec16fu *)(dst + j) = EVEN_LANES(a, b);
	}
	if (j < n && n >= 16 && 2 * n <= readable) { /* the last sixteen, overlapping the ones before */
		vec16f a = *(const vec16fu *)(src + 2 * n - 32), b = *(const vec16fu *)(src + 2 * n - 16);
		*(vec16fu *)(dst + n - 16) = EVEN_LANES(a, b);
		return;
	}
	for (; j < n; j++)
		dst[j] = src[2 * j];
}
TERN_ISA_VARIANTS3(void, every_other, (const float *restrict src, float *restrict dst, int64_t n, int64_t readable), (src, dst, n, readable))

/* One channel's phase planes from its input plane xc: the part inside the input and, with borders,
 * the zeros around it (planes that keep their zeros from one channel to the next need them once). */
TERN_ISA_BODY void phase_split_body(const conv_params *cp, const float *xc, float *planes, bool borders)
{
	const window *w = &cp->w;
	int64_t s1 = w->s[1], s2 = w->s[2], in2 = w->in[2], wq = cp->wq;
	for (int64_t q = 0; q < cp->n_phases; q++) {
		float *plane = planes + q * cp->hq * wq;
		int64_t r0 = cp->phases[2 * q] - w->pb[1], c0 = cp->phases[2 * q + 1] - w->pb[2], lo, hi, ilo, ihi;
		/* plane rows i and columns j whose input row r0 + i * s1 and column c0 + j * s2 are inside */
		outputs_within(r0, s1, w->in[1], cp->hq, &ilo, &ihi);
		outputs_within(c0, s2, in2, wq, &lo, &hi);
		if (borders) {
			memset(plane, 0, (size_t)(ilo * wq) * sizeof *plane);
			memset(plane + ihi * wq, 0, (size_t)((cp->hq - ihi) * wq) * sizeof *plane);
		}
		for (int64_t i = ilo; i < ihi; i++) {
			float *dst = plane + i * wq;
			const float *restrict src = xc + (r0 + i * s1) * in2 + c0;
			if (borders) {
				memset(dst, 0, (size_t)lo * sizeof *dst);
				memset(dst + hi, 0, (size_t)(wq - hi) * sizeof *dst);
			}
			if (s2 == 1)
				memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *dst);
			else if (s2 == 2) /* what may be read: the rest of the input plane */
				every_other(src + 2 * lo, dst + lo, hi - lo, (w->in[1] - r0 - i * s1) * in2 - c0 - 2 * lo);
			else
				for (int64_t j = lo; j < hi; j++)
					dst[j] = src[j * s2];
		}
	}
}
TERN_ISA_VARIANTS3(void, phase_split, (const conv_params *cp, const float *xc, float *planes, bool borders), (cp, xc, planes, borders))

/* The phase planes of channels [begin, end). */
static void phase_planes(void *ctx, int64_t begin, int64_t end)
{
	const phase_ctx *c = ctx;
	const conv_params *cp = c->cp;
	for (int64_t ch = begin; ch < end; ch++)
		phase_split(cp, c->x + ch * cp->in_sp, c->planes + ch * cp->n_phases * cp->hq * cp->wq, true);
}

typedef struct grid_ctx {
	const conv_params *cp;
	const float *grid;
	float *y;
	const float *z;
} grid_ctx;

/* One output plane from its grid, without the columns past out[2]; then a fused activation on it with
 * z, the residual's plane (NULL: none), while it is in cache. */
static void grid_to_plane(const conv_params *cp, const float *grid, float *y, const float *z)
{
	int64_t o1 = cp->w.out[1], o2 = cp->w.out[2];
	for (int64_t i = 0; i < o1; i++)
		memcpy(y + i * o2, grid + i * cp->wq, (size_t)o2 * sizeof *y);
	if (cp->fused)
		tern_act_run(&cp->act, y, z, cp->out_sp);
}

/* Output channels [begin, end) of the rows kernel's grid. */
static void grid_copy(void *ctx, int64_t begin, int64_t end)
{
	const grid_ctx *c = ctx;
	const conv_params *cp = c->cp;
	for (int64_t m = begin; m < end; m++)
		grid_to_plane(cp, c->grid + m * cp->grid_n, c->y + m * cp->out_sp, c->z ? c->z + m * cp->out_sp : NULL);
}

/* One group of one image through the packed weights, its column matrix read in place; z is the fused
 * residual's group (NULL: none). */
static void conv_direct(const tern_kernel_args *a, const conv_params *cp, int64_t g, const float *x, const float *bias,
                        float *y, const float *z)
{
	const window *w = &cp->w;
	const float *planes = x;
	const tern_act *act = cp->fused ? &cp->act : NULL;
	if (cp->split) {
		phase_ctx pc = {cp, x, a->scratch};
		parallel_range(a->pool, cp->cg, grain_for(cp->n_phases * cp->hq * cp->wq), phase_planes, &pc);
		planes = a->scratch;
	}
	if (cp->kind == TERN_GEMM_COLS) {
		tern_gemm_b b = {planes, cp->row_off, 0, w->out[2], cp->wq, 1};
		tern_gemm_c c = {y, cp->out_sp, false, false, bias, act, z};
		tern_gemm_packed_run(a->pool, cp->packed[g], cp->out_sp, &b, &c, TERN_GEMM_COLS);
		return;
	}
	bool gaps = cp->wq != w->out[2];
	float *grid = gaps ? (float *)((char *)a->scratch + cp->grid_off) : y;
	tern_gemm_b b = {planes, cp->row_off, 0, cp->grid_n, cp->grid_n, 1};
	tern_gemm_c c = {grid, gaps ? cp->grid_n : cp->out_sp, false, false, bias, gaps ? NULL : act, z};
	tern_gemm_packed_run(a->pool, cp->packed[g], cp->grid_n, &b, &c, TERN_GEMM_ROWS);
	if (gaps) {
		grid_ctx gc = {cp, grid, y, z};
		parallel_range(a->pool, cp->mg, grain_for(cp->out_sp), grid_copy, &gc);
	}
}

/* A depthwise output plane on the grid of out[1] x wq positions: each position sums kk taps, tap t
 * reading the phase planes at row_off[t] past it; vector by vector with all taps in registers.
 * dst[i .. i + 16) from all taps, in two partial sums so that the additions are not one long chain: */
static inline __attribute__((always_inline)) void dw_sum(int64_t kk, const float *restrict src,
                                                         const int64_t *restrict off, const float *restrict wk, float b,
                                                         float *restrict dst, int64_t i)
{
	vec16f s0 = (vec16f){0} + b, s1 = (vec16f){0};
	int64_t t = 0;
	for (; t + 2 <= kk; t += 2) {
		s0 += wk[t] * *(const vec16fu *)(src + off[t] + i);
		s1 += wk[t + 1] * *(const vec16fu *)(src + off[t + 1] + i);
	}
	if (t < kk)
		s0 += wk[t] * *(const vec16fu *)(src + off[t] + i);
	*(vec16fu *)(dst + i) = s0 + s1;
}

static inline __attribute__((always_inline)) void dw_taps(int64_t kk, const float *restrict src,
                                                          const int64_t *restrict off, const float *restrict wk,
                                                          float b, float *restrict dst, int64_t n)
{
	int64_t i = 0;
	for (; i + 32 <= n; i += 32) {
		dw_sum(kk, src, off, wk, b, dst, i);
		dw_sum(kk, src, off, wk, b, dst, i + 16);
	}
	if (i + 16 <= n) {
		dw_sum(kk, src, off, wk, b, dst, i);
		i += 16;
	}
	/* the last vector ends at n, overlapping the one before */
	if (i < n && n >= 16) {
		dw_sum(kk, src, off, wk, b, dst, n - 16);
		return;
	}
	for (; i < n; i++) {
		float acc = b;
		for (int64_t t = 0; t < kk; t++)
			acc += wk[t] * src[off[t] + i];
		dst[i] = acc;
	}
}

/* Fixed tap counts unroll fully: 3 x 3 and 5 x 5 kernels. */
TERN_ISA_BODY void dw_taps_9_body(const float *src, const int64_t *off, const float *wk, float b, float *dst, int64_t n)
{
	dw_taps(9, src, off, wk, b, dst, n);
}
TERN_ISA_VARIANTS3(void, dw_taps_9, (const float *src, const int64_t *off, const float *wk, float b, float *dst, int64_t n), (src, off, wk, b, dst, n))

TERN_ISA_BODY void dw_taps_25_body(const float *src, const int64_t *off, const float *wk, float b, float *dst, int64_t n)
{
	dw_taps(25, src, off, wk, b, dst, n);
}
TERN_ISA_VARIANTS3(void, dw_taps_25, (const float *src, const int64_t *off, const float *wk, float b, float *dst, int64_t n), (src, off, wk, b, dst, n))

TERN_ISA_BODY void dw_taps_any_body(int64_t kk, const float *src, const int64_t *off, const float *wk, float b, float *dst,
                            int64_t n)
{
	dw_taps(kk, src, off, wk, b, dst, n);
}
TERN_ISA_VARIANTS3(void, dw_taps_any, (int64_t kk, const float *src, const int64_t *off, const float *wk, float b, float *dst, int64_t n), (kk, src, off, wk, b, dst, n))

static void dw_run(const conv_params *cp, const float *src, const float *wk, float b, float *dst, int64_t n)
{
	if (cp->kk == 9)
		dw_taps_9(src, cp->row_off, wk, b, dst, n);
	else if (cp->kk == 25)
		dw_taps_25(src, cp->row_off, wk, b, dst, n);
	else
		dw_taps_any(cp->kk, src, cp->row_off, wk, b, dst, n);
}

/* Depthwise kernels for AVX-512 and common shapes (3 x 3 and 5 x 5, unit strides; strided ones go by
 * channel blocks): the phase planes' rows start on vectors, so each vector of outputs loads the aligned
 * vector under it and the next one from every row a tap reads, and shifts them into place for the taps
 * in that row (vpermt2ps) instead of loading each tap unaligned. The last vector of a row is stored
 * masked. */
#if HAVE_WB

DW512 static inline __attribute__((always_inline)) void dw512_plane(const int kh, const int kw, const int st,
                                                                      const float *planes[4], int64_t wq,
                                                                      const float *restrict wk, float b,
                                                                      float *restrict y, int64_t o1n, int64_t o2n)
{
	__m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	__mmask16 last = (__mmask16)(0xffffu >> (15 - (o2n - 1) % 16));
	for (int64_t o1 = 0; o1 < o1n; o1++) {
		float *yr = y + o1 * o2n;
		for (int64_t i = 0; i < o2n; i += 16) {
			__m512 acc0 = _mm512_set1_ps(b), acc1 = _mm512_setzero_ps();
			for (int k1 = 0; k1 < kh; k1++)
				for (int pc = 0; pc < st; pc++) {
					const float *row = planes[k1 % st * st + pc] + (o1 + k1 / st) * wq + i;
					__m512 a = _mm512_load_ps(row), next = _mm512_load_ps(row + 16);
					for (int k2 = pc; k2 < kw; k2 += st) {
						int sh = k2 / st;
						__m512 v = sh ? _mm512_permutex2var_ps(a, _mm512_add_epi32(iota, _mm512_set1_epi32(sh)), next) : a;
						__m512 wv = _mm512_set1_ps(wk[k1 * kw + k2]);
						if ((k1 * kw + k2) % 2)
							acc1 = _mm512_fmadd_ps(wv, v, acc1);
						else
							acc0 = _mm512_fmadd_ps(wv, v, acc0);
					}
				}
			__m512 sum = _mm512_add_ps(acc0, acc1);
			if (i + 16 <= o2n)
				_mm512_storeu_ps(yr + i, sum);
			else
				_mm512_mask_storeu_ps(yr + i, last, sum);
		}
	}
}

typedef void (*dw512_fn)(const float *planes[4], int64_t wq, const float *wk, float b, float *y, int64_t o1n,
                         int64_t o2n);
#define DEF_DW512(KH, KW, S)                                                                                 \
	DW512 static void dw512_##KH##x##KW##s##S(const float *planes[4], int64_t wq, const float *wk, float b, float *y, \
	                                         int64_t o1n, int64_t o2n)                                     \
	{                                                                                                    \
		dw512_plane(KH, KW, S, planes, wq, wk, b, y, o1n, o2n);                                          \
	}
DEF_DW512(3, 3, 1)
DEF_DW512(5, 5, 1)

typedef struct dw_shape {
	int k, s;
	dw512_fn fn;
} dw_shape;

static const dw_shape dw_shapes[] = {
	{3, 1, dw512_3x3s1},
	{5, 1, dw512_5x5s1},
};

static const dw_shape *dw_vector_kernel(const window *w, int dtype)
{
	if (dtype == TERN_DOUBLE || tern_isa() < TERN_ISA_AVX512 || w->d[1] != 1 || w->d[2] != 1 ||
	    w->k[1] != w->k[2] || w->s[1] != w->s[2])
		return NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(dw_shapes); i++)
		if (dw_shapes[i].k == w->k[1] && dw_shapes[i].s == w->s[1])
			return &dw_shapes[i];
	return NULL;
}

/* One output plane through the vector kernel: the phase planes by phase (row, column). */
static void dw_vector_plane(const conv_params *cp, const float *planes, const float *wk, float b, float *y)
{
	const float *by_phase[4] = {planes, planes, planes, planes};
	for (int64_t q = 0; q < cp->n_phases; q++)
		by_phase[cp->phases[2 * q] * cp->dw_kernel->s + cp->phases[2 * q + 1]] = planes + q * cp->hq * cp->wq;
	cp->dw_kernel->fn(by_phase, cp->wq, wk, b, y, cp->w.out[1], cp->w.out[2]);
}
#else
typedef struct dw_shape {
	int unused;
} dw_shape;

static const dw_shape *dw_vector_kernel(const window *w, int dtype) { return NULL; }

static void dw_vector_plane(const conv_params *cp, const float *planes, const float *wk, float b, float *y) {}
#endif

/* Input planes [begin, end) of a float depthwise convolution: each is split into its phase planes once
 * (unless it is its own; the zero borders are written once per call), then every output channel it
 * feeds is computed on the grid: output row by output row when rows are a vector long or more, else
 * the whole grid at once and copied without the columns past out[2]. */
static void depthwise_grid(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	const conv_ctx *c = ctx;
	const conv_params *cp = c->cp;
	const window *w = &cp->w;
	float *planes = (float *)c->scratch + slot * cp->slot_elems;
	float *grid = planes + (cp->split ? cp->n_phases * cp->hq * cp->wq : 0);
	bool by_row = w->out[2] >= 16 || cp->wq == w->out[2];
	for (int64_t plane = begin; plane < end; plane++) {
		int64_t n = plane / cp->cin, ch = plane % cp->cin;
		const float *x = (const float *)c->x + plane * cp->in_sp, *src = x;
		if (cp->split) {
			if (plane == begin) /* the vector past the planes */
				memset(planes + cp->n_phases * cp->hq * cp->wq, 0, 16 * sizeof *planes);
			phase_split(cp, x, planes, plane == begin);
			src = planes;
		}
		for (int64_t m = ch * cp->mg; m < (ch + 1) * cp->mg; m++) {
			const float *wk = (const float *)c->wt + m * cp->kk;
			float b = c->bias ? ((const float *)c->bias)[m] : 0, *y = (float *)c->y + (n * cp->cout + m) * cp->out_sp;
			const float *z = c->z ? c->z + (n * cp->cout + m) * cp->out_sp : NULL;
			if (cp->dw_kernel)
				dw_vector_plane(cp, planes, wk, b, y);
			else if (cp->wq == w->out[2])
				dw_run(cp, src, wk, b, y, cp->out_sp);
			else if (by_row)
				for (int64_t o1 = 0; o1 < w->out[1]; o1++)
					dw_run(cp, src + o1 * cp->wq, wk, b, y + o1 * w->out[2], w->out[2]);
			else {
				dw_run(cp, src, wk, b, grid, cp->grid_n);
				grid_to_plane(cp, grid, y, z);
				continue;
			}
			if (cp->fused)
				tern_act_run(&cp->act, y, z, cp->out_sp);
		}
	}
}

/* A fused activation over the whole output, for the paths that do not apply it as they go. */
static tern_status conv_act_pass(const tern_kernel_args *a, const conv_params *cp, const float *z)
{
	if (cp->fused && cp->in_pass)
		tern_act_run(&cp->act, a->out[0]->data, z, tern_tensor_numel(a->out[0]));
	return TERN_OK;
}

static tern_status conv_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	const char *x = a->in[0]->data, *wt = a->in[1]->data;
	const void *bias = a->n_in > 2 && a->in[2] ? a->in[2]->data : NULL;
	char *y = a->out[0]->data;
	const float *z = cp->fused && a->n_in > 3 && a->in[3] ? a->in[3]->data : NULL;
	if (cp->depthwise) {
		conv_ctx c = {cp, x, wt, bias, y, a->scratch, z};
		int64_t grain = grain_for(cp->out_sp * cp->kk);
		if (cp->dw_blocks) {
			wb_job j = {&cp->w, WB_CONV, cp->n, cp->cin, cp->band, cp->slot_elems, (const float *)x,
			            (const float *)wt, bias, NULL, (float *)y, a->scratch, cp->fused ? &cp->act : NULL, z};
			wb_run(a->pool, &j, cp->slots);
		} else if (cp->dw_grid)
			parallel_slots(a->pool, cp->n * cp->cin, grain_for(cp->mg * cp->out_sp * cp->kk), cp->slots,
			               depthwise_grid, &c);
		else
			parallel_range(a->pool, cp->n * cp->cout, grain, dtype == TERN_DOUBLE ? depthwise_planes_f64 : depthwise_planes_f32,
			               &c);
		return conv_act_pass(a, cp, z);
	}
	int64_t ck = cp->cg * cp->kk;
	for (int64_t n = 0; n < cp->n; n++)
		for (int64_t g = 0; g < cp->group; g++) {
			int64_t y0 = (n * cp->cout + g * cp->mg) * cp->out_sp;
			const char *xg = x + (size_t)((n * cp->cin + g * cp->cg) * cp->in_sp) * es;
			char *yg = y + (size_t)y0 * es;
			const void *bg = bias ? (const char *)bias + (size_t)(g * cp->mg) * es : NULL;
			if (cp->direct) {
				conv_direct(a, cp, g, (const float *)xg, bg, (float *)yg, z ? z + y0 : NULL);
				continue;
			}
			if (cp->packed && cp->pointwise) {
				tern_gemm_b b = {(const float *)xg, NULL, cp->out_sp, cp->out_sp, cp->out_sp, 1};
				tern_gemm_c c = {(float *)yg, cp->out_sp, false, false, bg, cp->fused ? &cp->act : NULL, z ? z + y0 : NULL};
				tern_gemm_packed_run(a->pool, cp->packed[g], cp->out_sp, &b, &c, TERN_GEMM_AUTO);
				continue;
			}
			if (cp->packed && !cp->pointwise) {
				conv_fill_ctx f = {cp, (const float *)xg};
				tern_gemm_packed_fill(a->pool, cp->packed[g], cp->out_sp, conv_fill, &f, bg, (float *)yg, cp->out_sp);
				continue;
			}
			const void *col = xg;
			if (!cp->pointwise) {
				im2col(a->pool, &cp->w, es, cp->cg, xg, a->scratch);
				col = a->scratch;
			}
			group_product(a, cp, g, false, cp->mg, cp->out_sp, ck, wt + (size_t)(g * cp->mg * ck) * es, col, bg, yg);
		}
	return conv_act_pass(a, cp, z);
}

/* Shapes shared by Conv and ConvInteger: X [N, C, spatial], W [M, C/group, kernel]. */
static tern_status conv_setup(tern_prepare_args *p, const tern_tensor *x, const tern_tensor *wt, int w_index,
                              conv_params **out)
{
	const tern_node *node = p->node;
	tern_status st = check_rank(node, x, 0, 3, SP + 2);
	if (!st)
		st = check_rank(node, wt, w_index, x->rank, x->rank);
	if (st)
		return st;
	conv_params *cp = calloc(1, sizeof *cp);
	if (!cp)
		return no_memory(node);
	p->params = cp;
	p->free_params = conv_params_free;
	cp->group = tern_attr_int(node, "group", 1);
	cp->n = x->dims[0];
	cp->cin = x->dims[1];
	cp->cout = wt->dims[0];
	char sx[128], sw[128];
	if (cp->group < 1 || cp->cin % cp->group || cp->cout % cp->group || wt->dims[1] != cp->cin / cp->group)
		return tern_node_errorf(node, TERN_EDATA, "input %s and weights %s do not fit group = %lld",
		                        tern_shape_str(x->dtype, x->rank, x->dims, sx, sizeof sx),
		                        tern_shape_str(wt->dtype, wt->rank, wt->dims, sw, sizeof sw), (long long)cp->group);
	cp->cg = cp->cin / cp->group;
	cp->mg = cp->cout / cp->group;
	if ((st = window_read(node, x, wt->dims + 2, &cp->w)) || (st = window_forward(node, &cp->w, false)))
		return st;
	cp->kk = sp_numel(cp->w.k);
	cp->in_sp = sp_numel(cp->w.in);
	cp->out_sp = sp_numel(cp->w.out);
	cp->pointwise = true;
	for (int i = 0; i < SP; i++)
		cp->pointwise &= cp->w.k[i] == 1 && cp->w.s[i] == 1 && cp->w.pb[i] == 0 && cp->w.pe[i] == 0;
	int64_t dims[TERN_MAX_RANK] = {cp->n, cp->cout};
	for (int i = 0; i < cp->w.nsp; i++)
		dims[2 + i] = cp->w.out[SP - cp->w.nsp + i];
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	*out = cp;
	return TERN_OK;
}

/* The phase planes of a 1-D or 2-D convolution and the offsets of its taps in them, for `channels`
 * input channels. */
static tern_status phase_setup(const tern_node *node, conv_params *cp, int64_t channels, bool vector_rows)
{
	const window *w = &cp->w;
	int64_t s1 = w->s[1], s2 = w->s[2];
	cp->split = vector_rows || s1 > 1 || s2 > 1 || w->pb[1] || w->pb[2] || w->pe[1] || w->pe[2];
	if (cp->split) {
		/* the padded input, or as much of it as the taps reach, in whole strides */
		int64_t hp = w->pb[1] + w->in[1] + w->pe[1], need_h = (w->out[1] - 1) * s1 + (w->k[1] - 1) * w->d[1] + 1;
		int64_t wp = w->pb[2] + w->in[2] + w->pe[2], need_w = (w->out[2] - 1) * s2 + (w->k[2] - 1) * w->d[2] + 1;
		cp->hq = ceil_div(hp > need_h ? hp : need_h, s1);
		cp->wq = ceil_div(wp > need_w ? wp : need_w, s2);
		/* rows of whole vectors, with a vector to spare past the outputs' last */
		if (vector_rows) {
			int64_t need = ceil_div(w->out[2], 16) * 16 + 16;
			cp->wq = ceil_div(cp->wq > need ? cp->wq : need, 16) * 16;
		}
	} else {
		cp->hq = w->in[1];
		cp->wq = w->in[2];
	}
	/* the phases the taps use, numbered in order of first use */
	int64_t *phase_at = malloc((size_t)(s1 * s2) * sizeof *phase_at);
	cp->phases = malloc((size_t)(2 * s1 * s2) * sizeof *cp->phases);
	cp->row_off = malloc((size_t)(channels * cp->kk) * sizeof *cp->row_off);
	if (!phase_at || !cp->phases || !cp->row_off) {
		free(phase_at);
		return no_memory(node);
	}
	for (int64_t i = 0; i < s1 * s2; i++)
		phase_at[i] = -1;
	for (int64_t t = 0; t < cp->kk; t++) {
		int64_t r = t / w->k[2] * w->d[1], c = t % w->k[2] * w->d[2], ph = r % s1 * s2 + c % s2;
		if (phase_at[ph] < 0) {
			phase_at[ph] = cp->n_phases;
			cp->phases[2 * cp->n_phases] = r % s1;
			cp->phases[2 * cp->n_phases++ + 1] = c % s2;
		}
	}
	int64_t plane = cp->hq * cp->wq;
	for (int64_t t = 0; t < cp->kk; t++) {
		int64_t r = t / w->k[2] * w->d[1], c = t % w->k[2] * w->d[2], ph = r % s1 * s2 + c % s2;
		for (int64_t ch = 0; ch < channels; ch++)
			cp->row_off[ch * cp->kk + t] = (ch * cp->n_phases + phase_at[ph]) * plane + r / s1 * cp->wq + c / s2;
	}
	free(phase_at);
	cp->grid_n = (w->out[1] - 1) * cp->wq + w->out[2];
	return TERN_OK;
}

/* The product's kernel and scratch for a 1-D or 2-D convolution with packed weights. */
static tern_status conv_direct_setup(tern_prepare_args *p, conv_params *cp)
{
	tern_status st = phase_setup(p->node, cp, cp->cg, false);
	if (st)
		return st;
	const window *w = &cp->w;
	cp->direct = true;
	cp->kind = tern_gemm_choose(cp->packed[0], cp->grid_n, w->out[1], w->out[2], false);
	size_t planes = cp->split ? round_up((size_t)(cp->cg * cp->n_phases * cp->hq * cp->wq) * sizeof(float)) : 0;
	cp->grid_off = planes;
	bool gaps = cp->kind == TERN_GEMM_ROWS && cp->wq != w->out[2];
	p->scratch_bytes = planes + (gaps ? (size_t)(cp->mg * cp->grid_n) * sizeof(float) : 0);
	p->kernel = conv_kernel;
	return stage_halves(p);
}

static tern_status conv_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *b = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real_same(p, 3);
	conv_params *cp = NULL;
	if (st || (st = conv_setup(p, x, p->in[1], 1, &cp)))
		return st;
	if ((st = check_numel(node, b, 2, "B", cp->cout)))
		return st;
	cp->depthwise = cp->cg == 1 && !cp->pointwise;
	const window *w = &cp->w;
	cp->dw_grid = cp->depthwise && x->dtype != TERN_DOUBLE && w->k[0] == 1 && w->in[0] == 1;
	cp->dw_blocks = cp->dw_grid && cp->mg == 1 && wb_plan(w, &cp->band, &cp->slot_elems) &&
	                (wb_extent(w, 1) * wb_extent(w, 2) <= DW_BLOCKS_MAX_PLANE || w->s[1] > 1 || w->s[2] > 1);
	if (cp->dw_blocks) {
		cp->slots = slots_for(p->pool);
		p->scratch_bytes = (size_t)(cp->slots * cp->slot_elems) * sizeof(float);
	} else if (cp->dw_grid) {
		cp->dw_kernel = dw_vector_kernel(w, x->dtype);
		if ((st = phase_setup(node, cp, 1, cp->dw_kernel != NULL)))
			return st;
		/* the phase planes and a vector past them, then the grid when it has columns to drop */
		cp->slot_elems = (cp->split ? cp->n_phases * cp->hq * cp->wq + 16 : 0) + (w->out[2] < 16 ? cp->grid_n : 0);
		cp->slot_elems = (cp->slot_elems + 15) / 16 * 16;
		cp->slots = slots_for(p->pool);
		p->scratch_bytes = (size_t)(cp->slots * cp->slot_elems) * sizeof(float);
	} else if (cp->depthwise) {
		if (!(cp->rows2 = malloc(2 * (size_t)w->k[2] * sizeof *cp->rows2)))
			return no_memory(node);
		for (int64_t k = 0; k < w->k[2]; k++)
			outputs_within(k * w->d[2] - w->pb[2], w->s[2], w->in[2], w->out[2], &cp->rows2[2 * k], &cp->rows2[2 * k + 1]);
	}
	if (!cp->depthwise && (st = pack_groups(node, cp, p->in[1], cp->mg, cp->cg * cp->kk, false)))
		return st;
	if (cp->packed && !cp->pointwise && w->k[0] == 1 && w->in[0] == 1)
		return conv_direct_setup(p, cp);
	if (cp->packed && !cp->pointwise) {
		if (!(cp->taps = malloc((size_t)cp->kk * sizeof *cp->taps)))
			return no_memory(node);
		for (int64_t k = 0; k < cp->kk; k++) {
			conv_tap *t = &cp->taps[k];
			int64_t t2 = k % w->k[2];
			t->d0 = k / (w->k[1] * w->k[2]) * w->d[0];
			t->d1 = k / w->k[2] % w->k[1] * w->d[1];
			t->d2 = t2 * w->d[2] - w->pb[2];
			outputs_within(t->d2, w->s[2], w->in[2], w->out[2], &t->lo, &t->hi);
		}
	}
	/* the column matrix, unless the product makes it block by block or needs none */
	if (!cp->pointwise && !cp->depthwise && !cp->packed)
		p->scratch_bytes = (size_t)(cp->cg * cp->kk * cp->out_sp) * compute_size(x->dtype);
	p->kernel = conv_kernel;
	return stage_halves(p);
}

tern_status tern_fused_conv_prepare(tern_prepare_args *p)
{
	tern_act act;
	const tern_tensor *x = p->in[0], *wt = p->n_in > 1 ? p->in[1] : NULL, *z = p->n_in > 3 ? p->in[3] : NULL;
	bool one_output = p->n_out >= 1 && p->out[0];
	for (int i = 1; i < p->n_out; i++)
		one_output &= !p->out[i];
	if (!one_output || p->n_in > 4 || !x || !wt || x->dtype != TERN_FLOAT || wt->dtype != TERN_FLOAT || !wt->data ||
	    (z && z->dtype != TERN_FLOAT) || !tern_act_from_node(p->node, &act))
		return TERN_OK;
	tern_status st = conv_prepare(p);
	if (st)
		return st;
	conv_params *cp = p->params;
	const tern_tensor *y = p->out[0];
	if (z && (z->rank != y->rank || memcmp(z->dims, y->dims, (size_t)y->rank * sizeof *y->dims) != 0)) {
		/* a residual that broadcasts: the general path */
		p->free_params(p->params);
		p->params = NULL;
		p->free_params = NULL;
		p->kernel = NULL;
		p->scratch_bytes = 0;
		return TERN_OK;
	}
	cp->fused = true;
	cp->act = act;
	cp->in_pass = !cp->direct && !cp->dw_grid && !cp->dw_blocks && !(cp->packed && cp->pointwise);
	return TERN_OK;
}

/* ConvInteger and QLinearConv: acc = (x - x_zero_point) conv (w - w_zero_point) in int32, the
 * operands widened into scratch; w's zero point may be one per output channel. */
static void integer_conv(const tern_kernel_args *a, const tern_tensor *x, const tern_tensor *zx, const tern_tensor *wt,
                         const tern_tensor *zw, int32_t *acc)
{
	const conv_params *cp = a->params;
	int64_t nx = tern_tensor_numel(x), nw = tern_tensor_numel(wt);
	int32_t *wx = a->scratch, *ww = (int32_t *)((char *)wx + round_up((size_t)nx * 4));
	int32_t *col = (int32_t *)((char *)ww + round_up((size_t)nw * 4));
	int32_t z = zx ? (int32_t)tern_tensor_get_i64(zx, 0) : 0;
	for (int64_t i = 0; i < nx; i++)
		wx[i] = (int32_t)tern_tensor_get_i64(x, i) - z;
	int64_t per_m = cp->cg * cp->kk;
	for (int64_t i = 0; i < nw; i++) {
		int32_t zwv = !zw ? 0 : (int32_t)tern_tensor_get_i64(zw, tern_tensor_numel(zw) == 1 ? 0 : i / per_m);
		ww[i] = (int32_t)tern_tensor_get_i64(wt, i) - zwv;
	}
	for (int64_t n = 0; n < cp->n; n++)
		for (int64_t g = 0; g < cp->group; g++) {
			const int32_t *xg = wx + (n * cp->cin + g * cp->cg) * cp->in_sp, *cm = xg;
			if (!cp->pointwise) {
				im2col(a->pool, &cp->w, 4, cp->cg, xg, col);
				cm = col;
			}
			tern_gemm_i32(cp->mg, cp->out_sp, per_m, ww + g * cp->mg * per_m, cm,
			              acc + (n * cp->cout + g * cp->mg) * cp->out_sp);
		}
}

static size_t integer_conv_scratch(const conv_params *cp, const tern_tensor *x, const tern_tensor *wt)
{
	return round_up((size_t)tern_tensor_numel(x) * 4) + round_up((size_t)tern_tensor_numel(wt) * 4) +
	       round_up((size_t)(cp->cg * cp->kk * cp->out_sp) * 4);
}

static tern_status conv_integer_kernel(const tern_kernel_args *a)
{
	integer_conv(a, a->in[0], a->n_in > 2 ? a->in[2] : NULL, a->in[1], a->n_in > 3 ? a->in[3] : NULL, a->out[0]->data);
	return TERN_OK;
}

/* y = saturate(round((acc + B) * x_scale * w_scale / y_scale) + y_zero_point), w_scale per channel or not. */
static tern_status qlinear_conv_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	const tern_tensor *x = a->in[0], *wt = a->in[3], *ws = a->in[4], *b = a->n_in > 8 ? a->in[8] : NULL;
	tern_tensor *y = a->out[0];
	int32_t *acc = (int32_t *)((char *)a->scratch + integer_conv_scratch(cp, x, wt));
	integer_conv(a, x, a->in[2], wt, a->in[5], acc);
	double xs = tern_tensor_get_f64(a->in[1], 0), ys = tern_tensor_get_f64(a->in[6], 0);
	double zy = a->in[7] ? tern_tensor_get_f64(a->in[7], 0) : 0;
	bool per_channel = tern_tensor_numel(ws) > 1;
	int64_t n = tern_tensor_numel(y);
	for (int64_t i = 0; i < n; i++) {
		int64_t m = i / cp->out_sp % cp->cout;
		double v = acc[i] + (b ? tern_tensor_get_f64(b, m) : 0);
		v = nearbyint(v * xs * tern_tensor_get_f64(ws, per_channel ? m : 0) / ys) + zy;
		tern_store_f64(y->dtype, y->data, i, v);
	}
	return TERN_OK;
}

static bool is_8bit(const tern_tensor *t) { return t->dtype == TERN_INT8 || t->dtype == TERN_UINT8; }

static tern_status integer_conv_setup(tern_prepare_args *p, bool qlinear)
{
	const tern_node *node = p->node;
	int iw = qlinear ? 3 : 1, izx = 2, izw = qlinear ? 5 : 3;
	const tern_tensor *x = p->in[0], *wt = p->n_in > iw ? p->in[iw] : NULL;
	if (!wt)
		return tern_node_errorf(node, TERN_EDATA, "input %d (the weights) is required", iw);
	const int eight_bit[] = {0, iw, izx, izw, 7};
	for (size_t i = 0; i < TERN_ARRAY_LEN(eight_bit); i++) {
		int k = eight_bit[i];
		if (k < p->n_in && p->in[k] && !is_8bit(p->in[k]) && (qlinear || k < 4))
			return tern_node_errorf(node, TERN_EDATA, "input %d is %s; int8 or uint8 expected", k,
			                        tern_dtype_name(p->in[k]->dtype));
	}
	conv_params *cp = NULL;
	tern_status st = conv_setup(p, x, wt, iw, &cp);
	if (st)
		return st;
	const tern_tensor *zx = p->n_in > izx ? p->in[izx] : NULL, *zw = p->n_in > izw ? p->in[izw] : NULL;
	if ((st = check_numel(node, zx, izx, "x_zero_point", 1)))
		return st;
	if (zw && tern_tensor_numel(zw) != 1 && (st = check_numel(node, zw, izw, "w_zero_point", cp->cout)))
		return st;
	p->scratch_bytes = integer_conv_scratch(cp, x, wt);
	if (!qlinear) {
		p->out[0]->dtype = TERN_INT32;
		p->kernel = conv_integer_kernel;
		return TERN_OK;
	}
	for (int i = 1; i < 8 && !st; i++)
		if ((i != izx && i != izw && i != 7) && (p->n_in <= i || !p->in[i]))
			st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
	if (!st)
		st = check_numel(node, p->in[1], 1, "x_scale", 1);
	if (!st && tern_tensor_numel(p->in[4]) != 1)
		st = check_numel(node, p->in[4], 4, "w_scale", cp->cout);
	if (!st)
		st = check_numel(node, p->in[6], 6, "y_scale", 1);
	if (!st)
		st = check_numel(node, p->n_in > 7 ? p->in[7] : NULL, 7, "y_zero_point", 1);
	if (!st)
		st = check_numel(node, p->n_in > 8 ? p->in[8] : NULL, 8, "B", cp->cout);
	if (st)
		return st;
	p->out[0]->dtype = p->n_in > 7 && p->in[7] ? p->in[7]->dtype : x->dtype;
	p->scratch_bytes += (size_t)tern_numel(p->out[0]->rank, p->out[0]->dims) * 4;
	p->kernel = qlinear_conv_kernel;
	return TERN_OK;
}

static tern_status conv_integer_prepare(tern_prepare_args *p) { return integer_conv_setup(p, false); }
static tern_status qlinear_conv_prepare(tern_prepare_args *p) { return integer_conv_setup(p, true); }

/* DeformConv: im2col where every tap of every output position reads the input at its own learned
 * offset (bilinear, zero outside the input), scaled by an optional mask; then the usual product. */
typedef struct deform_ctx {
	const conv_params *cp;
	int64_t offset_group, n, g;
	const void *x, *offset, *mask;
	void *col;
} deform_ctx;

#define DEF_DEFORM(S, T)                                                                                      \
	TERN_ISA_BODY void deform_cols_##S##_body(void *ctx, int64_t begin, int64_t end)                                    \
	{                                                                                                       \
		const deform_ctx *c = ctx;                                                                           \
		const conv_params *cp = c->cp;                                                                       \
		const window *w = &cp->w;                                                                            \
		int64_t ih = w->in[1], iw = w->in[2], oh = w->out[1], ow = w->out[2], kk = cp->kk;                   \
		int64_t per_og = cp->cin / c->offset_group;                                                          \
		for (int64_t ch = begin; ch < end; ch++) {                                                           \
			int64_t ic = c->g * cp->cg + ch, og = ic / per_og;                                               \
			const T *x = (const T *)c->x + (c->n * cp->cin + ic) * ih * iw;                                  \
			const T *off = (const T *)c->offset + (c->n * c->offset_group + og) * 2 * kk * oh * ow;           \
			const T *mask = c->mask ? (const T *)c->mask + (c->n * c->offset_group + og) * kk * oh * ow : NULL; \
			for (int64_t k = 0; k < kk; k++) {                                                               \
				int64_t ki = k / w->k[2], kj = k % w->k[2];                                                  \
				T *col = (T *)c->col + (ch * kk + k) * oh * ow;                                              \
				const T *dh = off + 2 * k * oh * ow, *dw = dh + oh * ow;                                     \
				for (int64_t i = 0; i < oh; i++)                                                             \
					for (int64_t j = 0; j < ow; j++) {                                                       \
						int64_t o = i * ow + j;                                                              \
						double h = (double)(i * w->s[1] - w->pb[1] + ki * w->d[1]) + dh[o];                  \
						double v = (double)(j * w->s[2] - w->pb[2] + kj * w->d[2]) + dw[o];                  \
						double h0 = floor(h), v0 = floor(v), fh = h - h0, fv = v - v0, sum = 0;              \
						for (int a = 0; a < 2; a++)                                                          \
							for (int b = 0; b < 2; b++) {                                                    \
								double y = h0 + a, xx = v0 + b;                                              \
								if (y >= 0 && y < (double)ih && xx >= 0 && xx < (double)iw)                  \
									sum += (a ? fh : 1 - fh) * (b ? fv : 1 - fv) * x[(int64_t)y * iw + (int64_t)xx]; \
							}                                                                                \
						col[o] = (T)(mask ? sum * mask[k * oh * ow + o] : sum);                              \
					}                                                                                        \
			}                                                                                                \
		}                                                                                                    \
	} \
	TERN_ISA_VARIANTS3(void, deform_cols_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_DEFORM(f32, float)
DEF_DEFORM(f64, double)

static tern_status deform_conv_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	const tern_tensor *bias = a->n_in > 3 ? a->in[3] : NULL, *mask = a->n_in > 4 ? a->in[4] : NULL;
	deform_ctx c = {cp, cp->offset_group, 0, 0, a->in[0]->data, a->in[2]->data,
	                mask ? mask->data : NULL, a->scratch};
	int64_t ck = cp->cg * cp->kk;
	for (c.n = 0; c.n < cp->n; c.n++)
		for (c.g = 0; c.g < cp->group; c.g++) {
			parallel_range(a->pool, cp->cg, grain_for(cp->kk * cp->out_sp * 8),
			               dtype == TERN_DOUBLE ? deform_cols_f64 : deform_cols_f32, &c);
			char *yg = (char *)a->out[0]->data + (size_t)((c.n * cp->cout + c.g * cp->mg) * cp->out_sp) * es;
			group_product(a, cp, c.g, false, cp->mg, cp->out_sp, ck,
			              (const char *)a->in[1]->data + (size_t)(c.g * cp->mg * ck) * es, a->scratch,
			              bias ? (const char *)bias->data + (size_t)(c.g * cp->mg) * es : NULL, yg);
		}
	return TERN_OK;
}

static tern_status deform_conv_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *offset = p->in[2];
	const tern_tensor *b = p->n_in > 3 ? p->in[3] : NULL, *mask = p->n_in > 4 ? p->in[4] : NULL;
	tern_status st = check_real_same(p, 5);
	if (!st)
		st = check_rank(node, x, 0, 4, 4);
	conv_params *cp = NULL;
	if (st || (st = conv_setup(p, x, p->in[1], 1, &cp)))
		return st;
	int64_t og = cp->offset_group = tern_attr_int(node, "offset_group", 1);
	if (og < 1 || cp->cin % og)
		return tern_node_errorf(node, TERN_EDATA, "offset_group = %lld does not divide %lld channels", (long long)og,
		                        (long long)cp->cin);
	const window *w = &cp->w;
	int64_t want_off[4] = {cp->n, og * 2 * cp->kk, w->out[1], w->out[2]};
	int64_t want_mask[4] = {cp->n, og * cp->kk, w->out[1], w->out[2]};
	for (int i = 0; i < 4; i++)
		if (offset->rank != 4 || offset->dims[i] != want_off[i] ||
		    (mask && (mask->rank != 4 || mask->dims[i] != want_mask[i]))) {
			char so[128], sm[128];
			return tern_node_errorf(node, TERN_EDATA, "offset %s or mask %s does not match [%lld,%lld,%lld,%lld]",
			                        tern_shape_str(offset->dtype, offset->rank, offset->dims, so, sizeof so),
			                        mask ? tern_shape_str(mask->dtype, mask->rank, mask->dims, sm, sizeof sm) : "(none)",
			                        (long long)cp->n, (long long)(og * 2 * cp->kk), (long long)w->out[1],
			                        (long long)w->out[2]);
		}
	if ((st = check_numel(node, b, 3, "B", cp->cout)))
		return st;
	p->scratch_bytes = (size_t)(cp->cg * cp->kk * cp->out_sp) * compute_size(x->dtype);
	if ((st = pack_groups(node, cp, p->in[1], cp->mg, cp->cg * cp->kk, false)))
		return st;
	p->kernel = deform_conv_kernel;
	return stage_halves(p);
}

/* ConvTranspose: columns = W_g^T x X_g, then col2im onto the output. */
static tern_status conv_transpose_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	const char *x = a->in[0]->data, *wt = a->in[1]->data;
	const char *bias = a->n_in > 2 && a->in[2] ? a->in[2]->data : NULL;
	char *y = a->out[0]->data;
	int64_t rows = cp->mg * cp->kk;
	for (int64_t n = 0; n < cp->n; n++)
		for (int64_t g = 0; g < cp->group; g++) {
			const char *xg = x + (size_t)((n * cp->cin + g * cp->cg) * cp->out_sp) * es;
			group_product(a, cp, g, true, rows, cp->out_sp, cp->cg, wt + (size_t)(g * cp->cg * rows) * es, xg, NULL,
			              a->scratch);
			char *yg = y + (size_t)((n * cp->cout + g * cp->mg) * cp->in_sp) * es;
			col2im(a->pool, dtype, &cp->w, cp->mg, a->scratch, yg);
			if (bias)
				add_bias_rows(dtype, yg, bias + (size_t)(g * cp->mg) * es, cp->mg, cp->in_sp);
		}
	return TERN_OK;
}

static tern_status conv_transpose_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *wt = p->in[1], *b = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real_same(p, 3);
	if (!st)
		st = check_rank(node, x, 0, 3, SP + 2);
	if (!st)
		st = check_rank(node, wt, 1, x->rank, x->rank);
	if (st)
		return st;
	conv_params *cp = calloc(1, sizeof *cp);
	if (!cp)
		return no_memory(node);
	p->params = cp;
	p->free_params = conv_params_free;
	cp->group = tern_attr_int(node, "group", 1);
	cp->n = x->dims[0];
	cp->cin = x->dims[1];
	char sx[128], sw[128];
	if (cp->group < 1 || cp->cin % cp->group || wt->dims[0] != cp->cin)
		return tern_node_errorf(node, TERN_EDATA, "input %s and weights %s do not fit group = %lld",
		                        tern_shape_str(x->dtype, x->rank, x->dims, sx, sizeof sx),
		                        tern_shape_str(wt->dtype, wt->rank, wt->dims, sw, sizeof sw), (long long)cp->group);
	cp->cg = cp->cin / cp->group;
	cp->mg = wt->dims[1];
	cp->cout = cp->mg * cp->group;
	if ((st = check_numel(node, b, 2, "B", cp->cout)))
		return st;
	/* Read the geometry as a convolution over X, then turn it around: the image is the output. */
	window *w = &cp->w;
	if ((st = window_read(node, x, wt->dims + 2, w)))
		return st;
	int nsp = w->nsp;
	int64_t opad[SP] = {0, 0, 0}, oshape[SP] = {0, 0, 0};
	if ((st = read_ints(node, "output_padding", nsp, 1, 0, opad, NULL)))
		return st;
	size_t n_os;
	const int64_t *os = tern_attr_ints(node, "output_shape", &n_os);
	if (os && n_os != (size_t)nsp && n_os != (size_t)nsp + 2)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'output_shape' has %zu values; %d expected", n_os, nsp);
	for (int i = 0; os && i < nsp; i++)
		oshape[SP - nsp + i] = os[n_os - nsp + i];
	const char *auto_pad = tern_attr_string(node, "auto_pad", "NOTSET");
	bool same_upper = streq(auto_pad, "SAME_UPPER"), same_lower = streq(auto_pad, "SAME_LOWER");
	if (!same_upper && !same_lower && !streq(auto_pad, "VALID") && !streq(auto_pad, "NOTSET"))
		return bad_attr(node, "auto_pad", auto_pad);
	bool explicit_pads = tern_attr(node, "pads") != NULL && !same_upper && !same_lower;
	int64_t dims[TERN_MAX_RANK] = {cp->n, cp->cout};
	for (int i = SP - nsp; i < SP; i++) {
		int64_t in = w->in[i];
		int64_t full = w->s[i] * (in - 1) + opad[i] + (w->k[i] - 1) * w->d[i] + 1, out;
		if (streq(auto_pad, "VALID"))
			w->pb[i] = w->pe[i] = 0;
		if (os || ((same_upper || same_lower) && !explicit_pads)) {
			out = os ? oshape[i] : in * w->s[i];
			if (!explicit_pads) {
				int64_t total = full - out;
				w->pb[i] = same_upper ? floor_div(total, 2) : total - floor_div(total, 2);
				w->pe[i] = total - w->pb[i];
			}
		} else {
			out = full - w->pb[i] - w->pe[i];
		}
		if (out < 1)
			return tern_node_errorf(node, TERN_EDATA, "spatial dimension %d: output size %lld", i - (SP - nsp),
			                        (long long)out);
		/* col2im reads X's positions (w->out) and writes the image (w->in) */
		w->out[i] = in;
		w->in[i] = out;
		dims[2 + i - (SP - nsp)] = out;
	}
	cp->kk = sp_numel(w->k);
	cp->in_sp = sp_numel(w->in);
	cp->out_sp = sp_numel(w->out);
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	p->scratch_bytes = (size_t)(cp->mg * cp->kk * cp->out_sp) * compute_size(x->dtype);
	if ((st = pack_groups(node, cp, wt, cp->mg * cp->kk, cp->cg, true)))
		return st;
	p->kernel = conv_transpose_kernel;
	return stage_halves(p);
}

/* Col2Im: input [N, C * prod(block_shape), L] of sliding blocks, summed back into [N, C, image_shape]. */
static tern_status col2im_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	for (int64_t n = 0; n < cp->n; n++)
		col2im(a->pool, dtype, &cp->w, cp->cin,
		       (const char *)a->in[0]->data + (size_t)(n * cp->cin * cp->kk * cp->out_sp) * es,
		       (char *)a->out[0]->data + (size_t)(n * cp->cin * cp->in_sp) * es);
	return TERN_OK;
}

static tern_status col2im_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *image = p->in[1], *block = p->in[2];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 3, 3);
	if (st)
		return st;
	if (!image->data || !block->data) {
		p->defer = 1;
		return TERN_OK;
	}
	int nsp = (int)tern_tensor_numel(image);
	if (nsp < 1 || nsp > SP || tern_tensor_numel(block) != nsp)
		return tern_node_errorf(node, TERN_EDATA, "image_shape has %d values and block_shape %lld; 1 to %d, equal, expected",
		                        nsp, (long long)tern_tensor_numel(block), SP);
	conv_params *cp = calloc(1, sizeof *cp);
	if (!cp)
		return no_memory(node);
	p->params = cp;
	p->free_params = conv_params_free;
	window *w = &cp->w;
	window_init(w, nsp);
	for (int i = 0; i < nsp; i++) {
		w->in[SP - nsp + i] = tern_tensor_get_i64(image, i);
		w->k[SP - nsp + i] = tern_tensor_get_i64(block, i);
		if (w->in[SP - nsp + i] < 1 || w->k[SP - nsp + i] < 1)
			return tern_node_errorf(node, TERN_EDATA, "image_shape and block_shape must be positive");
	}
	if ((st = read_ints(node, "strides", nsp, 1, 1, w->s, NULL)) ||
	    (st = read_ints(node, "dilations", nsp, 1, 1, w->d, NULL)) ||
	    (st = read_ints(node, "pads", nsp, 2, 0, w->pb, w->pe)))
		return st;
	for (int i = SP - nsp; i < SP; i++) {
		int64_t span = w->in[i] + w->pb[i] + w->pe[i] - (w->k[i] - 1) * w->d[i] - 1;
		w->out[i] = span < 0 ? 0 : span / w->s[i] + 1;
	}
	cp->n = x->dims[0];
	cp->kk = sp_numel(w->k);
	cp->in_sp = sp_numel(w->in);
	cp->out_sp = sp_numel(w->out);
	if (x->dims[1] % cp->kk || x->dims[2] != cp->out_sp || cp->out_sp == 0) {
		char s[128];
		return tern_node_errorf(node, TERN_EDATA, "input 0 %s: %lld blocks of %lld elements expected",
		                        tern_shape_str(x->dtype, x->rank, x->dims, s, sizeof s), (long long)cp->out_sp,
		                        (long long)cp->kk);
	}
	cp->cin = x->dims[1] / cp->kk;
	int64_t dims[TERN_MAX_RANK] = {cp->n, cp->cin};
	for (int i = 0; i < nsp; i++)
		dims[2 + i] = w->in[SP - nsp + i];
	tern_set_shape(p->out[0], x->dtype, 2 + nsp, dims);
	p->kernel = col2im_kernel;
	return stage_halves(p);
}

/* ---------------------------------------------------------------- batch normalisation */

typedef struct bn_params {
	int64_t n, c, sp; /* channels are scale's elements; sp elements of one channel per sample */
	double eps, momentum;
	bool training;
} bn_params;

typedef struct bn_ctx {
	const bn_params *bp;
	const void *x;
	void *y;
	double *mean, *var, *a, *b; /* per channel, in scratch */
} bn_ctx;

#define DEF_BN(S, T)                                                                                 \
	TERN_ISA_BODY void bn_stats_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                \
		const bn_ctx *c = ctx;                                                                       \
		const bn_params *bp = c->bp;                                                                 \
		double count = (double)(bp->n * bp->sp);                                                     \
		for (int64_t ch = begin; ch < end; ch++) {                                                   \
			double sum = 0, sq = 0;                                                                  \
			for (int64_t n = 0; n < bp->n; n++) {                                                    \
				const T *x = (const T *)c->x + (n * bp->c + ch) * bp->sp;                            \
				for (int64_t i = 0; i < bp->sp; i++)                                                 \
					sum += x[i];                                                                     \
			}                                                                                        \
			double mean = sum / count;                                                               \
			for (int64_t n = 0; n < bp->n; n++) {                                                    \
				const T *x = (const T *)c->x + (n * bp->c + ch) * bp->sp;                            \
				for (int64_t i = 0; i < bp->sp; i++)                                                 \
					sq += (x[i] - mean) * (x[i] - mean);                                             \
			}                                                                                        \
			c->mean[ch] = mean;                                                                      \
			c->var[ch] = sq / count;                                                                 \
		}                                                                                            \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, bn_stats_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end)) \
	TERN_ISA_BODY void bn_apply_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                \
		const bn_ctx *c = ctx;                                                                       \
		const bn_params *bp = c->bp;                                                                 \
		for (int64_t plane = begin; plane < end; plane++) {                                          \
			int64_t ch = plane % bp->c;                                                              \
			T a = (T)c->a[ch], b = (T)c->b[ch];                                                      \
			const T *restrict x = (const T *)c->x + plane * bp->sp;                                  \
			T *restrict y = (T *)c->y + plane * bp->sp;                                             \
			for (int64_t i = 0; i < bp->sp; i++)                                                     \
				y[i] = x[i] * a + b;                                                                 \
		}                                                                                            \
	} \
	TERN_ISA_VARIANTS3(void, bn_apply_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_BN(f32, float)
DEF_BN(f64, double)

static tern_status bn_kernel(const tern_kernel_args *a)
{
	const bn_params *bp = a->params;
	const tern_tensor *scale = a->in[1], *bias = a->in[2], *mean_in = a->in[3], *var_in = a->in[4];
	bool dbl = a->in[0]->dtype == TERN_DOUBLE;
	double *s = a->scratch;
	bn_ctx c = {bp, a->in[0]->data, a->out[0]->data, s, s + bp->c, s + 2 * bp->c, s + 3 * bp->c};
	if (bp->training)
		parallel_range(a->pool, bp->c, grain_for(bp->n * bp->sp), dbl ? bn_stats_f64 : bn_stats_f32, &c);
	for (int64_t ch = 0; ch < bp->c; ch++) {
		double mean = bp->training ? c.mean[ch] : tern_tensor_get_f64(mean_in, ch);
		double var = bp->training ? c.var[ch] : tern_tensor_get_f64(var_in, ch);
		c.a[ch] = tern_tensor_get_f64(scale, ch) / sqrt(var + bp->eps);
		c.b[ch] = tern_tensor_get_f64(bias, ch) - mean * c.a[ch];
	}
	parallel_range(a->pool, bp->n * bp->c, grain_for(bp->sp), dbl ? bn_apply_f64 : bn_apply_f32, &c);
	if (!bp->training)
		return TERN_OK;
	/* running statistics, then (before opset 14) the batch's own */
	for (int64_t ch = 0; ch < bp->c; ch++) {
		double m = bp->momentum;
		if (a->n_out > 1 && a->out[1])
			tern_store_f64(a->out[1]->dtype, a->out[1]->data, ch, tern_tensor_get_f64(mean_in, ch) * m + c.mean[ch] * (1 - m));
		if (a->n_out > 2 && a->out[2])
			tern_store_f64(a->out[2]->dtype, a->out[2]->data, ch, tern_tensor_get_f64(var_in, ch) * m + c.var[ch] * (1 - m));
		if (a->n_out > 3 && a->out[3])
			tern_store_f64(a->out[3]->dtype, a->out[3]->data, ch, c.mean[ch]);
		if (a->n_out > 4 && a->out[4])
			tern_store_f64(a->out[4]->dtype, a->out[4]->data, ch, c.var[ch]);
	}
	return TERN_OK;
}

static tern_status bn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	for (int i = 1; i < 5 && !st; i++)
		if (p->n_in <= i || !p->in[i])
			st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
		else
			st = check_real(node, p->in[i], i);
	if (st)
		return st;
	bn_params *bp = calloc(1, sizeof *bp);
	if (!bp)
		return no_memory(node);
	p->params = bp;
	p->free_params = free;
	/* Before opset 9, spatial = 0 normalised every (channel, position) feature separately. */
	bool spatial = node->opset >= 9 || tern_attr_int(node, "spatial", 1) != 0;
	bp->n = x->dims[0];
	bp->c = spatial ? x->dims[1] : prod(x->dims, 1, x->rank);
	bp->sp = prod(x->dims, 1, x->rank) / (bp->c ? bp->c : 1);
	bp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	bp->momentum = tern_attr_float(node, "momentum", 0.9f);
	if (node->opset >= 14)
		bp->training = tern_attr_int(node, "training_mode", 0) != 0;
	else
		for (int i = 1; i < p->n_out; i++)
			bp->training |= p->out[i] != NULL;
	static const char *const names[] = {"", "scale", "B", "mean", "var"};
	for (int i = 1; i < 5; i++)
		if ((st = check_numel(node, p->in[i], i, names[i], bp->c)))
			return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	for (int i = 1; i < p->n_out; i++)
		if (p->out[i]) {
			if (!bp->training)
				return tern_node_errorf(node, TERN_EDATA, "output %d exists only in training mode", i);
			tern_set_shape(p->out[i], p->in[i % 2 ? 3 : 4]->dtype, 1, &bp->c);
		}
	p->scratch_bytes = (size_t)bp->c * 4 * sizeof(double);
	p->kernel = bn_kernel;
	return stage_halves(p);
}

/* ---------------------------------------------------------------- instance, group and layer normalisation */

typedef struct group_norm_params {
	int64_t n, c, groups, sp;
	double eps;
	bool scale_per_group; /* GroupNormalization-18: one scale and bias per group */
} group_norm_params;

typedef struct group_norm_ctx {
	const group_norm_params *gp;
	const void *x;
	void *y;
	const double *scale, *bias; /* per channel */
} group_norm_ctx;

/* Mean and 1/sqrt(variance + eps) of n elements, accumulated in double. */
#define DEF_MOMENTS(S, T)                                                                        \
	static void moments_##S(const T *x, int64_t n, double eps, double *mean, double *inv)        \
	{                                                                                            \
		double part[8] = {0}, sq = 0;                                                            \
		double m = n ? sum_##S(x, n) / (double)n : 0;                                            \
		int64_t i = 0;                                                                           \
		for (; i + 8 <= n; i += 8)                                                               \
			for (int l = 0; l < 8; l++)                                                          \
				part[l] += (x[i + l] - m) * (x[i + l] - m);                                      \
		for (; i < n; i++)                                                                       \
			sq += (x[i] - m) * (x[i] - m);                                                       \
		for (int l = 0; l < 8; l++)                                                              \
			sq += part[l];                                                                       \
		*mean = m;                                                                               \
		*inv = 1.0 / sqrt((n ? sq / (double)n : 0) + eps);                                       \
	}

DEF_MOMENTS(f32, float)
DEF_MOMENTS(f64, double)

#define DEF_GROUP_NORM(S, T)                                                                     \
	TERN_ISA_BODY void group_norm_blocks_##S##_body(void *ctx, int64_t begin, int64_t end)                     \
	{                                                                                            \
		const group_norm_ctx *c = ctx;                                                           \
		const group_norm_params *gp = c->gp;                                                     \
		int64_t per = gp->c / gp->groups;                                                        \
		for (int64_t blk = begin; blk < end; blk++) {                                            \
			const T *x = (const T *)c->x + blk * per * gp->sp;                                   \
			T *y = (T *)c->y + blk * per * gp->sp;                                               \
			double mean, inv;                                                                    \
			moments_##S(x, per * gp->sp, gp->eps, &mean, &inv);                               \
			int64_t c0 = (blk % gp->groups) * per;                                               \
			for (int64_t ch = 0; ch < per; ch++) {                                               \
				T a = (T)(c->scale[c0 + ch] * inv), b = (T)(c->bias[c0 + ch] - mean * c->scale[c0 + ch] * inv); \
				const T *restrict xc = x + ch * gp->sp;                                          \
				T *restrict yc = y + ch * gp->sp;                                                \
				for (int64_t i = 0; i < gp->sp; i++)                                             \
					yc[i] = xc[i] * a + b;                                                       \
			}                                                                                    \
		}                                                                                        \
	} \
	TERN_ISA_VARIANTS3(void, group_norm_blocks_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_GROUP_NORM(f32, float)
DEF_GROUP_NORM(f64, double)

static tern_status group_norm_kernel(const tern_kernel_args *a)
{
	const group_norm_params *gp = a->params;
	double *scale = a->scratch, *bias = scale + gp->c;
	int64_t per = gp->c / gp->groups;
	for (int64_t ch = 0; ch < gp->c; ch++) {
		int64_t i = gp->scale_per_group ? ch / per : ch;
		scale[ch] = tern_tensor_get_f64(a->in[1], i);
		bias[ch] = tern_tensor_get_f64(a->in[2], i);
	}
	group_norm_ctx c = {gp, a->in[0]->data, a->out[0]->data, scale, bias};
	parallel_range(a->pool, gp->n * gp->groups, grain_for(per * gp->sp),
	               a->in[0]->dtype == TERN_DOUBLE ? group_norm_blocks_f64 : group_norm_blocks_f32, &c);
	return TERN_OK;
}

static tern_status group_norm_setup(tern_prepare_args *p, bool instance)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	for (int i = 1; i < 3 && !st; i++)
		st = p->n_in > i && p->in[i] ? check_real(node, p->in[i], i)
		                             : tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
	if (st)
		return st;
	group_norm_params *gp = calloc(1, sizeof *gp);
	if (!gp)
		return no_memory(node);
	p->params = gp;
	p->free_params = free;
	gp->n = x->dims[0];
	gp->c = x->dims[1];
	gp->sp = prod(x->dims, 2, x->rank);
	gp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	gp->groups = instance ? gp->c : tern_attr_int(node, "num_groups", 0);
	if (gp->groups < 1 || gp->c % gp->groups)
		return tern_node_errorf(node, TERN_EDATA, "num_groups = %lld does not divide %lld channels",
		                        (long long)gp->groups, (long long)gp->c);
	int64_t ns = tern_tensor_numel(p->in[1]);
	gp->scale_per_group = !instance && ns == gp->groups && node->opset < 21;
	int64_t want = gp->scale_per_group ? gp->groups : gp->c;
	if ((st = check_numel(node, p->in[1], 1, "scale", want)) || (st = check_numel(node, p->in[2], 2, "bias", want)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->scratch_bytes = (size_t)gp->c * 2 * sizeof(double);
	p->kernel = group_norm_kernel;
	return stage_halves(p);
}

static tern_status instance_norm_prepare(tern_prepare_args *p) { return group_norm_setup(p, true); }
static tern_status group_norm_prepare(tern_prepare_args *p) { return group_norm_setup(p, false); }

typedef struct layer_norm_params {
	int64_t rows, cols;
	double eps;
	bool scale_scalar, bias_scalar;
} layer_norm_params;

typedef struct layer_norm_ctx {
	const layer_norm_params *lp;
	const void *x, *scale, *bias;
	void *y, *mean, *inv;
} layer_norm_ctx;

#define DEF_LAYER_NORM(S, T)                                                                   \
	TERN_ISA_BODY void layer_norm_rows_##S##_body(void *ctx, int64_t begin, int64_t end)                     \
	{                                                                                          \
		const layer_norm_ctx *c = ctx;                                                         \
		const layer_norm_params *lp = c->lp;                                                   \
		const T *scale = c->scale, *bias = c->bias;                                            \
		for (int64_t r = begin; r < end; r++) {                                                \
			const T *restrict x = (const T *)c->x + r * lp->cols;                              \
			T *restrict y = (T *)c->y + r * lp->cols;                                          \
			double mean, inv;                                                                  \
			moments_##S(x, lp->cols, lp->eps, &mean, &inv);                                 \
			T m = (T)mean, iv = (T)inv;                                                        \
			if (!lp->scale_scalar && bias && !lp->bias_scalar)                                 \
				for (int64_t i = 0; i < lp->cols; i++)                                         \
					y[i] = (x[i] - m) * iv * scale[i] + bias[i];                               \
			else                                                                               \
				for (int64_t i = 0; i < lp->cols; i++) {                                       \
					T v = (x[i] - m) * iv * scale[lp->scale_scalar ? 0 : i];                   \
					y[i] = bias ? v + bias[lp->bias_scalar ? 0 : i] : v;                       \
				}                                                                              \
			if (c->mean)                                                                       \
				((T *)c->mean)[r] = m;                                                         \
			if (c->inv)                                                                        \
				((T *)c->inv)[r] = iv;                                                         \
		}                                                                                      \
	} \
	TERN_ISA_VARIANTS3(void, layer_norm_rows_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LAYER_NORM(f32, float)
DEF_LAYER_NORM(f64, double)

static tern_status layer_norm_kernel(const tern_kernel_args *a)
{
	const layer_norm_params *lp = a->params;
	layer_norm_ctx c = {lp,
	                    a->in[0]->data,
	                    a->in[1]->data,
	                    a->n_in > 2 && a->in[2] ? a->in[2]->data : NULL,
	                    a->out[0]->data,
	                    a->n_out > 1 && a->out[1] ? a->out[1]->data : NULL,
	                    a->n_out > 2 && a->out[2] ? a->out[2]->data : NULL};
	parallel_range(a->pool, lp->rows, grain_for(lp->cols),
	               a->in[0]->dtype == TERN_DOUBLE ? layer_norm_rows_f64 : layer_norm_rows_f32, &c);
	return TERN_OK;
}

static tern_status layer_norm_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *scale = p->in[1], *bias = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real_same(p, 3);
	int axis = 0;
	if (st || (st = axis_in(node, tern_attr_int(node, "axis", -1), x->rank, &axis)))
		return st;
	layer_norm_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	lp->rows = prod(x->dims, 0, axis);
	lp->cols = prod(x->dims, axis, x->rank);
	lp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	/* Scale and B broadcast to the normalised shape; a full copy or one value are supported. */
	int64_t ns = tern_tensor_numel(scale), nb = bias ? tern_tensor_numel(bias) : 1;
	lp->scale_scalar = ns == 1;
	lp->bias_scalar = nb == 1;
	if ((ns != 1 && ns != lp->cols) || (nb != 1 && nb != lp->cols))
		return tern_node_errorf(node, TERN_EDATA,
		                        "Scale has %lld and B %lld elements; 1 or %lld (the normalised size) expected",
		                        (long long)ns, (long long)nb, (long long)lp->cols);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	int64_t dims[TERN_MAX_RANK];
	for (int i = 0; i < x->rank; i++)
		dims[i] = i < axis ? x->dims[i] : 1;
	/* Mean and InvStdDev are float for float16 and bfloat16 inputs (stash_type 1). */
	int stat_type = is_half(x->dtype) ? TERN_FLOAT : x->dtype;
	for (int i = 1; i < 3; i++)
		if (p->n_out > i && p->out[i])
			tern_set_shape(p->out[i], stat_type, x->rank, dims);
	p->kernel = layer_norm_kernel;
	return stage_halves(p);
}

/* ---------------------------------------------------------------- LRN, LpNormalization, MeanVarianceNormalization */

typedef struct lrn_params {
	int64_t n, c, sp, size;
	double alpha, beta, bias;
} lrn_params;

#define DEF_LRN(S, T)                                                                                  \
	TERN_ISA_BODY void lrn_planes_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                  \
		const plain_ctx *c = ctx;                                                                      \
		const lrn_params *lp = c->params;                                                              \
		int64_t before = (lp->size - 1) / 2, after = lp->size - 1 - before;                            \
		for (int64_t plane = begin; plane < end; plane++) {                                            \
			int64_t n = plane / lp->c, ch = plane % lp->c;                                             \
			int64_t lo = ch - before < 0 ? 0 : ch - before, hi = ch + after >= lp->c ? lp->c - 1 : ch + after; \
			const T *x = (const T *)c->x + plane * lp->sp;                                             \
			T *y = (T *)c->y + plane * lp->sp;                                                         \
			for (int64_t i = 0; i < lp->sp; i++) {                                                     \
				double sq = 0;                                                                         \
				for (int64_t k = lo; k <= hi; k++) {                                                   \
					double v = ((const T *)c->x)[(n * lp->c + k) * lp->sp + i];                        \
					sq += v * v;                                                                       \
				}                                                                                      \
				y[i] = (T)(x[i] / pow(lp->bias + lp->alpha / (double)lp->size * sq, lp->beta));         \
			}                                                                                          \
		}                                                                                              \
	} \
	TERN_ISA_VARIANTS3(void, lrn_planes_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LRN(f32, float)
DEF_LRN(f64, double)

static tern_status lrn_kernel(const tern_kernel_args *a)
{
	const lrn_params *lp = a->params;
	plain_ctx c = {lp, a->in[0]->data, a->out[0]->data};
	parallel_range(a->pool, lp->n * lp->c, grain_for(lp->sp * lp->size),
	               a->in[0]->dtype == TERN_DOUBLE ? lrn_planes_f64 : lrn_planes_f32, &c);
	return TERN_OK;
}

static tern_status lrn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	if (st)
		return st;
	lrn_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	lp->n = x->dims[0];
	lp->c = x->dims[1];
	lp->sp = prod(x->dims, 2, x->rank);
	lp->size = tern_attr_int(node, "size", 0);
	lp->alpha = tern_attr_float(node, "alpha", 1e-4f);
	lp->beta = tern_attr_float(node, "beta", 0.75f);
	lp->bias = tern_attr_float(node, "bias", 1.0f);
	if (lp->size < 1)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'size' = %lld must be positive", (long long)lp->size);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->kernel = lrn_kernel;
	return stage_halves(p);
}

/* An axis seen as outer x n x inner: the layout Softmax, Hardmax and LpNormalization walk. */
typedef struct axis_params {
	int64_t outer, n, inner;
	int64_t p; /* LpNormalization */
	int kind;
} axis_params;

#define DEF_LP_NORM(S, T)                                                                          \
	TERN_ISA_BODY void lp_norm_columns_##S##_body(void *ctx, int64_t begin, int64_t end)                         \
	{                                                                                              \
		const plain_ctx *c = ctx;                                                                  \
		const axis_params *ap = c->params;                                                         \
		for (int64_t col = begin; col < end; col++) {                                              \
			int64_t base = (col / ap->inner) * ap->n * ap->inner + col % ap->inner;                \
			const T *x = (const T *)c->x + base;                                                   \
			T *y = (T *)c->y + base;                                                               \
			double norm = 0;                                                                       \
			for (int64_t i = 0; i < ap->n; i++) {                                                  \
				double v = x[i * ap->inner];                                                       \
				norm += ap->p == 1 ? fabs(v) : v * v;                                              \
			}                                                                                      \
			if (ap->p == 2)                                                                        \
				norm = sqrt(norm);                                                                 \
			for (int64_t i = 0; i < ap->n; i++)                                                    \
				y[i * ap->inner] = (T)(x[i * ap->inner] / norm);                                   \
		}                                                                                          \
	} \
	TERN_ISA_VARIANTS3(void, lp_norm_columns_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LP_NORM(f32, float)
DEF_LP_NORM(f64, double)

static tern_status lp_norm_kernel(const tern_kernel_args *a)
{
	const axis_params *ap = a->params;
	plain_ctx c = {ap, a->in[0]->data, a->out[0]->data};
	parallel_range(a->pool, ap->outer * ap->inner, grain_for(ap->n),
	               a->in[0]->dtype == TERN_DOUBLE ? lp_norm_columns_f64 : lp_norm_columns_f32, &c);
	return TERN_OK;
}

/* outer x n x inner around one axis; `coerce` (softmax before opset 13) flattens everything from the
 * axis on into n. */
static tern_status axis_setup(tern_prepare_args *p, int64_t axis_default, bool coerce, axis_params **out)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	int axis = 0;
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = axis_in(node, tern_attr_int(node, "axis", axis_default), x->rank, &axis);
	if (st)
		return st;
	axis_params *ap = calloc(1, sizeof *ap);
	if (!ap)
		return no_memory(node);
	p->params = ap;
	p->free_params = free;
	ap->outer = prod(x->dims, 0, axis);
	ap->n = coerce ? prod(x->dims, axis, x->rank) : (x->rank ? x->dims[axis] : 1);
	ap->inner = coerce ? 1 : prod(x->dims, axis + 1, x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	*out = ap;
	return TERN_OK;
}

static tern_status lp_norm_prepare(tern_prepare_args *p)
{
	axis_params *ap = NULL;
	tern_status st = axis_setup(p, -1, false, &ap);
	if (st)
		return st;
	ap->p = tern_attr_int(p->node, "p", 2);
	if (ap->p != 1 && ap->p != 2)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'p' = %lld; 1 or 2 expected", (long long)ap->p);
	p->kernel = lp_norm_kernel;
	return stage_halves(p);
}

/* MeanVarianceNormalization: (x - mean) / (std + 1e-9) over the listed axes, for every index of the
 * others. Rare, so one serial pass per statistic. */
typedef struct mvn_params {
	int rank;
	int64_t dims[TERN_MAX_RANK];
	bool reduced[TERN_MAX_RANK];
	int64_t groups;
} mvn_params;

static int64_t mvn_group(const mvn_params *mp, int64_t i)
{
	int64_t g = 0, scale = 1;
	for (int d = mp->rank - 1; d >= 0; d--) {
		int64_t idx = i % mp->dims[d];
		i /= mp->dims[d];
		if (!mp->reduced[d]) {
			g += idx * scale;
			scale *= mp->dims[d];
		}
	}
	return g;
}

static tern_status mvn_kernel(const tern_kernel_args *a)
{
	const mvn_params *mp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(x), per = n / (mp->groups ? mp->groups : 1);
	double *sum = a->scratch, *sq = sum + mp->groups;
	memset(sum, 0, (size_t)mp->groups * 2 * sizeof *sum);
	for (int64_t i = 0; i < n; i++)
		sum[mvn_group(mp, i)] += tern_tensor_get_f64(x, i);
	for (int64_t i = 0; i < n; i++) {
		int64_t g = mvn_group(mp, i);
		double d = tern_tensor_get_f64(x, i) - sum[g] / (double)per;
		sq[g] += d * d;
	}
	for (int64_t i = 0; i < n; i++) {
		int64_t g = mvn_group(mp, i);
		double mean = sum[g] / (double)per, std = sqrt(sq[g] / (double)per);
		tern_store_f64(y->dtype, y->data, i, (tern_tensor_get_f64(x, i) - mean) / (std + 1e-9));
	}
	return TERN_OK;
}

static tern_status mvn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (st)
		return st;
	mvn_params *mp = calloc(1, sizeof *mp);
	if (!mp)
		return no_memory(node);
	p->params = mp;
	p->free_params = free;
	mp->rank = x->rank;
	memcpy(mp->dims, x->dims, sizeof mp->dims);
	size_t n;
	const int64_t *axes = tern_attr_ints(node, "axes", &n);
	static const int64_t dflt[] = {0, 2, 3};
	if (!axes) {
		axes = dflt;
		n = 3;
	}
	for (size_t i = 0; i < n; i++) {
		int ax = 0;
		if ((st = axis_in(node, axes[i], x->rank, &ax)))
			return st;
		mp->reduced[ax] = true;
	}
	mp->groups = 1;
	for (int d = 0; d < x->rank; d++)
		if (!mp->reduced[d])
			mp->groups *= x->dims[d];
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->scratch_bytes = (size_t)mp->groups * 2 * sizeof(double);
	p->kernel = mvn_kernel;
	return stage_halves(p);
}

/* ---------------------------------------------------------------- Softmax, LogSoftmax, Hardmax */

enum { SOFTMAX, LOG_SOFTMAX, HARDMAX };

#define LANES 16 /* columns of a strided softmax handled together, so the loops run along the rows */

/* Softmax and LogSoftmax over n elements `inner` apart, for `lanes` neighbouring columns at once.
 * The exponentials go through y; sums use LANES partial sums so that they vectorise too. */
#define DEF_SOFTMAX(S, T, EXP, LOG, SELECT)                                                                   \
	TERN_ISA_BODY void softmax_block_##S##_body(int kind, const T *x, T *y, int64_t n, int64_t inner, int lanes)   \
	{                                                                                                \
		T max[LANES], sum[LANES];                                                                    \
		for (int l = 0; l < lanes; l++) {                                                            \
			max[l] = x[l];                                                                           \
			sum[l] = 0;                                                                              \
		}                                                                                            \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++)                                                          \
				max[l] = x[i * inner + l] > max[l] ? x[i * inner + l] : max[l];                      \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++) {                                                        \
				T e = EXP(x[i * inner + l] - max[l]);                                                \
				y[i * inner + l] = e;                                                                \
				sum[l] += e;                                                                         \
			}                                                                                        \
		for (int l = 0; l < lanes; l++)                                                              \
			sum[l] = kind == SOFTMAX ? 1 / sum[l] : max[l] + LOG(sum[l]);                            \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++)                                                          \
				y[i * inner + l] = kind == SOFTMAX ? y[i * inner + l] * sum[l] : x[i * inner + l] - sum[l]; \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, softmax_block_##S, (int kind, const T *x, T *y, int64_t n, int64_t inner, int lanes), (kind, x, y, n, inner, lanes)) \
	TERN_ISA_BODY void softmax_row_##S##_body(int kind, const T *restrict x, T *restrict y, int64_t n)            \
	{                                                                                                \
		T max = x[0], part[LANES], sum = 0;                                                          \
		int64_t i = 0;                                                                               \
		for (int l = 0; l < LANES; l++)                                                              \
			part[l] = x[0];                                                                          \
		for (; i + LANES <= n; i += LANES)                                                           \
			for (int l = 0; l < LANES; l++)                                                          \
				part[l] = SELECT(x[i + l] > part[l], x[i + l], part[l]);                             \
		for (; i < n; i++)                                                                           \
			max = x[i] > max ? x[i] : max;                                                           \
		for (int l = 0; l < LANES; l++) {                                                            \
			max = part[l] > max ? part[l] : max;                                                     \
			part[l] = 0;                                                                             \
		}                                                                                            \
		for (i = 0; i < n; i++)                                                                      \
			y[i] = EXP(x[i] - max);                                                                  \
		i = 0;                                                                                       \
		for (; i + LANES <= n; i += LANES)                                                           \
			for (int l = 0; l < LANES; l++)                                                          \
				part[l] += y[i + l];                                                                 \
		for (; i < n; i++)                                                                           \
			sum += y[i];                                                                             \
		for (int l = 0; l < LANES; l++)                                                              \
			sum += part[l];                                                                          \
		if (kind == SOFTMAX) {                                                                       \
			T inv = 1 / sum;                                                                         \
			for (int64_t k = 0; k < n; k++)                                                          \
				y[k] *= inv;                                                                         \
		} else {                                                                                     \
			T shift = max + LOG(sum);                                                                \
			for (int64_t k = 0; k < n; k++)                                                          \
				y[k] = x[k] - shift;                                                                 \
		}                                                                                            \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, softmax_row_##S, (int kind, const T *restrict x, T *restrict y, int64_t n), (kind, x, y, n)) \
	static void hardmax_column_##S(const T *x, T *y, int64_t n, int64_t stride)                     \
	{                                                                                                \
		int64_t at = 0;                                                                              \
		for (int64_t i = 1; i < n; i++)                                                              \
			if (x[i * stride] > x[at * stride])                                                      \
				at = i;                                                                              \
		for (int64_t i = 0; i < n; i++)                                                              \
			y[i * stride] = i == at;                                                                 \
	}                                                                                                \
	/* Work items: rows when inner is 1; else blocks of LANES columns, or single ones for Hardmax. */ \
	static void softmax_items_##S(void *ctx, int64_t begin, int64_t end)                            \
	{                                                                                                \
		const plain_ctx *c = ctx;                                                                    \
		const axis_params *ap = c->params;                                                           \
		const T *x = c->x;                                                                           \
		T *y = c->y;                                                                                 \
		int64_t per = ap->kind == HARDMAX ? ap->inner : (ap->inner + LANES - 1) / LANES;             \
		for (int64_t it = begin; it < end; it++) {                                                   \
			int64_t col = ap->kind == HARDMAX ? it % per : it % per * LANES;                         \
			int64_t base = it / per * ap->n * ap->inner + col;                                       \
			if (ap->kind == HARDMAX)                                                                 \
				hardmax_column_##S(x + base, y + base, ap->n, ap->inner);                            \
			else if (ap->inner == 1)                                                                 \
				softmax_row_##S(ap->kind, x + base, y + base, ap->n);                                \
			else                                                                                     \
				softmax_block_##S(ap->kind, x + base, y + base, ap->n, ap->inner,                    \
				                  (int)(ap->inner - col < LANES ? ap->inner - col : LANES));         \
		}                                                                                            \
	}

DEF_SOFTMAX(f32, float, tern_fast_expf, logf, tern_select_f32)
DEF_SOFTMAX(f64, double, exp, log, tern_select_f64)

static void softmax_run(tern_threadpool *pool, const axis_params *ap, int dtype, const void *x, void *y)
{
	if (ap->n == 0)
		return;
	plain_ctx c = {ap, x, y};
	int64_t per = ap->kind == HARDMAX || ap->inner == 1 ? ap->inner : (ap->inner + LANES - 1) / LANES;
	int64_t width = ap->kind == HARDMAX || ap->inner == 1 ? 1 : LANES;
	parallel_range(pool, ap->outer * per, grain_for(ap->n * width * 4),
	               dtype == TERN_DOUBLE ? softmax_items_f64 : softmax_items_f32, &c);
}

static tern_status softmax_kernel(const tern_kernel_args *a)
{
	softmax_run(a->pool, a->params, a->in[0]->dtype, a->in[0]->data, a->out[0]->data);
	return TERN_OK;
}

static tern_status softmax_setup(tern_prepare_args *p, int kind)
{
	bool old = p->node->opset < 13;
	axis_params *ap = NULL;
	tern_status st = axis_setup(p, old ? 1 : -1, old, &ap);
	if (st)
		return st;
	ap->kind = kind;
	p->kernel = softmax_kernel;
	return stage_halves(p);
}

static tern_status softmax_prepare(tern_prepare_args *p) { return softmax_setup(p, SOFTMAX); }
static tern_status log_softmax_prepare(tern_prepare_args *p) { return softmax_setup(p, LOG_SOFTMAX); }
static tern_status hardmax_prepare(tern_prepare_args *p) { return softmax_setup(p, HARDMAX); }

/* ---------------------------------------------------------------- NegativeLogLikelihoodLoss and
 * SoftmaxCrossEntropyLoss */

enum { REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN };

typedef struct loss_params {
	axis_params ap; /* classes on axis 1: outer = N, n = C, inner = the positions d1 x d2 ... */
	int reduction;
	bool has_ignore, softmax;
	int64_t ignore;
} loss_params;

/* loss[n, d] = -weight[t] * logp[n, t, d] for t = target[n, d], 0 where t is ignore_index; then
 * summed, or averaged over the weights of the targets counted. */
static tern_status loss_kernel(const tern_kernel_args *a)
{
	const loss_params *lp = a->params;
	const tern_tensor *x = a->in[0], *target = a->in[1], *weight = a->n_in > 2 ? a->in[2] : NULL;
	tern_tensor *y = a->out[0];
	const void *logp = x->data;
	if (lp->softmax) {
		void *dst = a->n_out > 1 && a->out[1] ? a->out[1]->data : a->scratch;
		softmax_run(a->pool, &lp->ap, x->dtype, x->data, dst);
		logp = dst;
	}
	int64_t c_n = lp->ap.n, d_n = lp->ap.inner, count = lp->ap.outer * d_n;
	double total = 0, weights = 0;
	for (int64_t i = 0; i < count; i++) {
		int64_t t = tern_tensor_get_i64(target, i), n = i / d_n, d = i % d_n;
		double l = 0, w = 0;
		if (!lp->has_ignore || t != lp->ignore) {
			if (t < 0 || t >= c_n)
				return tern_node_errorf(a->node, TERN_EDATA, "target %lld at position %lld is outside [0, %lld)",
				                        (long long)t, (long long)i, (long long)c_n);
			int64_t at = (n * c_n + t) * d_n + d;
			w = weight ? tern_tensor_get_f64(weight, t) : 1;
			l = -w * (x->dtype == TERN_DOUBLE ? ((const double *)logp)[at] : ((const float *)logp)[at]);
		}
		if (lp->reduction == REDUCE_NONE)
			tern_store_f64(y->dtype, y->data, i, l);
		total += l;
		weights += w;
	}
	if (lp->reduction != REDUCE_NONE)
		tern_store_f64(y->dtype, y->data, 0, lp->reduction == REDUCE_SUM ? total : total / weights);
	return TERN_OK;
}

static tern_status loss_setup(tern_prepare_args *p, bool softmax)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *target = p->in[1], *weight = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	if (!st && weight)
		st = check_same(node, x, weight, 2);
	if (st)
		return st;
	char sx[128], st_[128];
	bool fits = target->dtype == TERN_INT32 || target->dtype == TERN_INT64;
	fits &= target->rank == x->rank - 1 && target->dims[0] == x->dims[0];
	for (int i = 1; fits && i < target->rank; i++)
		fits = target->dims[i] == x->dims[i + 1];
	if (!fits)
		return tern_node_errorf(node, TERN_EDATA, "input 1 %s must be int32 or int64 shaped like input 0 %s without axis 1",
		                        tern_shape_str(target->dtype, target->rank, target->dims, st_, sizeof st_),
		                        tern_shape_str(x->dtype, x->rank, x->dims, sx, sizeof sx));
	loss_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	lp->softmax = softmax;
	lp->ap.kind = LOG_SOFTMAX;
	lp->ap.outer = x->dims[0];
	lp->ap.n = x->dims[1];
	lp->ap.inner = prod(x->dims, 2, x->rank);
	if ((st = check_numel(node, weight, 2, "weights", lp->ap.n)))
		return st;
	static const char *const reductions[] = {"none", "sum", "mean"};
	if ((st = parse_enum(node, "reduction", "mean", reductions, 3, &lp->reduction)))
		return st;
	lp->has_ignore = tern_attr(node, "ignore_index") != NULL;
	lp->ignore = tern_attr_int(node, "ignore_index", 0);
	tern_set_shape(p->out[0], x->dtype, lp->reduction == REDUCE_NONE ? target->rank : 0, target->dims);
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], x->dtype, x->rank, x->dims);
	else if (softmax)
		p->scratch_bytes = (size_t)tern_tensor_numel(x) * compute_size(x->dtype);
	p->kernel = loss_kernel;
	return stage_halves(p);
}

static tern_status nll_loss_prepare(tern_prepare_args *p) { return loss_setup(p, false); }
static tern_status sce_loss_prepare(tern_prepare_args *p) { return loss_setup(p, true); }

/* ---------------------------------------------------------------- Dropout */

typedef struct dropout_params {
	bool mask_bool;          /* the mask is bool (opset 10 on) rather than the input's type */
	bool maybe_training;     /* a training_mode input decides at run time */
	uint64_t seed;
	_Atomic uint64_t runs;   /* each run draws a fresh mask */
} dropout_params;

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static tern_status dropout_kernel(const tern_kernel_args *a)
{
	dropout_params *dp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0], *mask = a->n_out > 1 ? a->out[1] : NULL;
	int64_t n = tern_tensor_numel(x);
	double ratio = a->n_in > 1 && a->in[1] ? tern_tensor_get_f64(a->in[1], 0) : 0.5;
	bool training = dp->maybe_training && a->n_in > 2 && a->in[2] && tern_tensor_get_i64(a->in[2], 0) != 0;
	if (training && (ratio < 0 || ratio >= 1))
		return tern_node_errorf(a->node, TERN_EDATA, "ratio %g is outside [0, 1)", ratio);
	if (!training || ratio == 0) {
		memcpy(y->data, x->data, x->nbytes);
		if (mask && dp->mask_bool)
			memset(mask->data, 1, (size_t)n);
		else if (mask)
			for (int64_t i = 0; i < n; i++)
				tern_store_f64(mask->dtype, mask->data, i, 1.0);
		return TERN_OK;
	}
	uint64_t state = dp->seed ^ (atomic_fetch_add(&dp->runs, 1) * 0xd1b54a32d192ed03u);
	double keep = 1.0 - ratio, scale = 1.0 / keep;
	for (int64_t i = 0; i < n; i++) {
		bool kept = (double)(splitmix64(&state) >> 11) * 0x1p-53 < keep;
		tern_store_f64(y->dtype, y->data, i, kept ? tern_tensor_get_f64(x, i) * scale : 0.0);
		if (mask && dp->mask_bool)
			((bool *)mask->data)[i] = kept;
		else if (mask)
			tern_store_f64(mask->dtype, mask->data, i, kept);
	}
	return TERN_OK;
}

static tern_status dropout_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (st)
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	bool has_mask = p->n_out > 1 && p->out[1];
	if (has_mask)
		tern_set_shape(p->out[1], node->opset >= 10 ? TERN_BOOL : x->dtype, x->rank, x->dims);
	/* Before opset 12 there is no training input: Dropout is the identity in inference. */
	const tern_tensor *training = node->opset >= 12 && p->n_in > 2 ? p->in[2] : NULL;
	bool maybe_training = training && (!training->data || tern_tensor_get_i64(training, 0) != 0);
	if (!maybe_training && !has_mask) {
		p->alias_input0 = 1;
		return TERN_OK;
	}
	dropout_params *dp = calloc(1, sizeof *dp);
	if (!dp)
		return no_memory(node);
	p->params = dp;
	p->free_params = free;
	dp->mask_bool = node->opset >= 10;
	dp->maybe_training = maybe_training;
	dp->seed = (uint64_t)tern_attr_int(node, "seed", 0x7465726e);
	p->kernel = dropout_kernel;
	return stage_halves(p);
}

/* ---------------------------------------------------------------- Resize, Upsample */

enum resize_mode { RESIZE_NEAREST, RESIZE_LINEAR, RESIZE_CUBIC };
enum coord_mode { HALF_PIXEL, HALF_PIXEL_SYMMETRIC, PYTORCH_HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, TF_CROP_AND_RESIZE };
enum nearest_mode { ROUND_PREFER_FLOOR, ROUND_PREFER_CEIL, NEAREST_FLOOR, NEAREST_CEIL };

typedef struct resize_options {
	enum resize_mode mode;
	enum coord_mode coord;
	enum nearest_mode nearest;
	double cubic_a, extrapolation;
	bool exclude_outside, antialias;
} resize_options;

/* Per axis, each output coordinate reads `count` input elements at element offsets off[] with
 * weights w[] (taps slots reserved per coordinate), or is outside the input (tf_crop_and_resize). */
typedef struct resize_axis {
	int64_t in, out, taps, stride;
	int64_t *off;
	double *w;
	int *count;
	bool *outside;
} resize_axis;

typedef struct resize_params {
	int rank, first; /* axes before `first` are unchanged: whole planes */
	int64_t planes, in_plane, out_plane;
	bool nearest;
	double extrapolation;
	resize_axis ax[TERN_MAX_RANK];
} resize_params;

static void resize_free(void *p)
{
	resize_params *rp = p;
	for (int i = 0; rp && i < rp->rank; i++)
		free(rp->ax[i].off);
	free(rp);
}

static double cubic_weight(double x, double a)
{
	x = fabs(x);
	if (x <= 1)
		return ((a + 2) * x - (a + 3)) * x * x + 1;
	if (x < 2)
		return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
	return 0;
}

/* The input coordinate that output coordinate x maps to. */
static double source_coord(const resize_options *o, double x, double scale, int64_t in, int64_t out,
                           double roi_start, double roi_end)
{
	/* The length the scale implies, which may be fractional; the reference uses it as such. */
	double scaled = scale * (double)in;
	switch (o->coord) {
	case HALF_PIXEL:
		return (x + 0.5) / scale - 0.5;
	case HALF_PIXEL_SYMMETRIC: {
		double adjust = (double)out / scaled, offset = (double)in / 2 * (1 - adjust);
		return offset + (x + 0.5) / scale - 0.5;
	}
	case PYTORCH_HALF_PIXEL:
		return out > 1 ? (x + 0.5) / scale - 0.5 : 0;
	case ALIGN_CORNERS:
		return scaled == 1 ? 0 : x * (double)(in - 1) / (scaled - 1);
	case ASYMMETRIC:
		return x / scale;
	case TF_CROP_AND_RESIZE:
		if (scaled == 1)
			return (roi_end - roi_start) * (double)(in - 1) / 2 + roi_start * (double)(in - 1);
		return x * (roi_end - roi_start) * (double)(in - 1) / (scaled - 1) + roi_start * (double)(in - 1);
	}
	return 0;
}

/* Fills one axis's taps. Neighbours follow the reference: for a fractional coordinate the base is its
 * floor, for a whole one the element before (with ratio 1), so the tap of weight 1 is the element
 * itself; indices outside the input clamp to its edge. */
static tern_status resize_axis_build(const resize_options *o, resize_axis *ax, double scale, double roi_start,
                                     double roi_end)
{
	double s = o->antialias && scale < 1 ? scale : 1; /* antialias widens the filter when shrinking */
	int64_t start = 0, taps = 1;
	if (o->mode == RESIZE_LINEAR) {
		start = (int64_t)floor(-1 / s) + 1;
		taps = 2 - 2 * start;
	} else if (o->mode == RESIZE_CUBIC) {
		start = (int64_t)floor(-2 / s) + 1;
		taps = 2 - 2 * start;
	}
	int64_t n = ax->out;
	size_t bytes = (size_t)(n * taps) * (sizeof(int64_t) + sizeof(double)) + (size_t)n * (sizeof(int) + sizeof(bool));
	char *mem = malloc(bytes ? bytes : 1);
	if (!mem)
		return TERN_EOS;
	ax->taps = taps;
	ax->off = (int64_t *)mem;
	ax->w = (double *)(ax->off + n * taps);
	ax->count = (int *)(ax->w + n * taps);
	ax->outside = (bool *)(ax->count + n);
	for (int64_t x = 0; x < n; x++) {
		int64_t *off = ax->off + x * taps;
		double *w = ax->w + x * taps;
		double xo = source_coord(o, (double)x, scale, ax->in, ax->out, roi_start, roi_end);
		ax->outside[x] = o->coord == TF_CROP_AND_RESIZE && (xo < 0 || xo > (double)(ax->in - 1));
		ax->count[x] = 0;
		if (ax->outside[x])
			continue;
		double fl = floor(xo);
		int64_t base = xo == fl ? (int64_t)fl - 1 : (int64_t)fl;
		double ratio = xo - (double)base;
		/* tap i reads element first + i; the weights go straight into w[], zero ones squeezed out after */
		int64_t first = base + start, m = taps;
		if (o->mode == RESIZE_NEAREST) {
			bool up = ratio == 1 || (o->nearest == ROUND_PREFER_FLOOR && ratio > 0.5) ||
			          (o->nearest == ROUND_PREFER_CEIL && ratio >= 0.5) || o->nearest == NEAREST_CEIL;
			first = base + (up ? 1 : 0);
			w[0] = 1;
		} else {
			double sum = 0;
			for (int64_t i = 0; i < m; i++) {
				double arg = ((double)(start + i) - ratio) * s;
				w[i] = o->mode == RESIZE_LINEAR ? fmax(0, 1 - fabs(arg)) : cubic_weight(arg, o->cubic_a);
				if (o->exclude_outside && (first + i < 0 || first + i >= ax->in))
					w[i] = 0;
				sum += w[i];
			}
			for (int64_t i = 0; i < m && sum != 0; i++)
				w[i] /= sum;
		}
		for (int64_t i = 0; i < m; i++) {
			if (w[i] == 0)
				continue;
			int64_t k = first + i < 0 ? 0 : first + i >= ax->in ? ax->in - 1 : first + i;
			off[ax->count[x]] = k * ax->stride;
			w[ax->count[x]++] = w[i];
		}
	}
	return TERN_OK;
}

static bool resize_axis_identity(const resize_axis *ax)
{
	if (ax->in != ax->out)
		return false;
	for (int64_t x = 0; x < ax->out; x++)
		if (ax->outside[x] || ax->count[x] != 1 || ax->off[x * ax->taps] != x * ax->stride || ax->w[x * ax->taps] != 1)
			return false;
	return true;
}

typedef struct resize_ctx {
	const resize_params *rp;
	size_t es;
	const void *x;
	void *y;
	const void *extra; /* the extrapolation value in the element type */
} resize_ctx;

/* Nearest: a gather, the same for every element type. */
static void resize_gather(const resize_ctx *c, int axis, const char *x, char *y)
{
	const resize_axis *ax = &c->rp->ax[axis];
	int64_t out_stride = 1;
	for (int d = axis + 1; d < c->rp->rank; d++)
		out_stride *= c->rp->ax[d].out;
	for (int64_t o = 0; o < ax->out; o++) {
		char *yo = y + (size_t)(o * out_stride) * c->es;
		if (ax->outside[o]) {
			for (int64_t i = 0; i < out_stride; i++)
				memcpy(yo + (size_t)i * c->es, c->extra, c->es);
		} else if (axis == c->rp->rank - 1) {
			memcpy(yo, x + (size_t)ax->off[o * ax->taps] * c->es, c->es);
		} else {
			resize_gather(c, axis + 1, x + (size_t)ax->off[o * ax->taps] * c->es, yo);
		}
	}
}

static void resize_gather_planes(void *ctx, int64_t begin, int64_t end)
{
	const resize_ctx *c = ctx;
	for (int64_t i = begin; i < end; i++)
		resize_gather(c, c->rp->first, (const char *)c->x + (size_t)(i * c->rp->in_plane) * c->es,
		              (char *)c->y + (size_t)(i * c->rp->out_plane) * c->es);
}

/* Linear and cubic: each output element is the weighted sum over the product of its axes' taps. */
#define DEF_RESIZE(S, T)                                                                                  \
	static double resize_value_##S(const resize_params *rp, int axis, const T *x, const int64_t *o)       \
	{                                                                                                     \
		const resize_axis *ax = &rp->ax[axis];                                                            \
		const int64_t *off = ax->off + o[axis] * ax->taps;                                                \
		const double *w = ax->w + o[axis] * ax->taps;                                                     \
		double sum = 0;                                                                                   \
		if (axis == rp->rank - 1)                                                                         \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				sum += w[i] * x[off[i]];                                                                  \
		else                                                                                              \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				sum += w[i] * resize_value_##S(rp, axis + 1, x + off[i], o);                              \
		return sum;                                                                                       \
	}                                                                                                     \
	/* The common case, the last two axes resized: loops without recursion. */                          \
	static void resize_2d_##S(const resize_params *rp, const T *x, T *y)                                  \
	{                                                                                                     \
		const resize_axis *ah = &rp->ax[rp->rank - 2], *aw = &rp->ax[rp->rank - 1];                       \
		for (int64_t oh = 0; oh < ah->out; oh++) {                                                        \
			const int64_t *offh = ah->off + oh * ah->taps;                                                \
			const double *wh = ah->w + oh * ah->taps;                                                     \
			T *yr = y + oh * aw->out;                                                                     \
			for (int64_t ow = 0; ow < aw->out; ow++) {                                                    \
				if (ah->outside[oh] || aw->outside[ow]) {                                                 \
					yr[ow] = (T)rp->extrapolation;                                                        \
					continue;                                                                             \
				}                                                                                         \
				const int64_t *offw = aw->off + ow * aw->taps;                                            \
				const double *ww = aw->w + ow * aw->taps;                                                 \
				double sum = 0;                                                                           \
				for (int th = 0; th < ah->count[oh]; th++) {                                              \
					const T *row = x + offh[th];                                                          \
					double part = 0;                                                                      \
					for (int tw = 0; tw < aw->count[ow]; tw++)                                            \
						part += ww[tw] * row[offw[tw]];                                                   \
					sum += wh[th] * part;                                                                 \
				}                                                                                         \
				yr[ow] = (T)sum;                                                                          \
			}                                                                                             \
		}                                                                                                 \
	}                                                                                                     \
	TERN_ISA_BODY void resize_planes_##S##_body(void *ctx, int64_t begin, int64_t end)                              \
	{                                                                                                     \
		const resize_ctx *c = ctx;                                                                        \
		const resize_params *rp = c->rp;                                                                  \
		for (int64_t plane = begin; plane < end; plane++) {                                               \
			const T *x = (const T *)c->x + plane * rp->in_plane;                                          \
			T *y = (T *)c->y + plane * rp->out_plane;                                                     \
			if (rp->first == rp->rank - 2) {                                                              \
				resize_2d_##S(rp, x, y);                                                                  \
				continue;                                                                                 \
			}                                                                                             \
			int64_t o[TERN_MAX_RANK] = {0};                                                               \
			for (int64_t i = 0; i < rp->out_plane; i++) {                                                 \
				bool outside = false;                                                                     \
				for (int d = rp->first; d < rp->rank; d++)                                                \
					outside |= rp->ax[d].outside[o[d]];                                                   \
				y[i] = outside ? (T)rp->extrapolation : (T)resize_value_##S(rp, rp->first, x, o);         \
				for (int d = rp->rank - 1; d >= rp->first; d--) {                                         \
					if (++o[d] < rp->ax[d].out)                                                           \
						break;                                                                            \
					o[d] = 0;                                                                             \
				}                                                                                         \
			}                                                                                             \
		}                                                                                                 \
	} \
	TERN_ISA_VARIANTS3(void, resize_planes_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_RESIZE(f32, float)
DEF_RESIZE(f64, double)

static tern_status resize_kernel(const tern_kernel_args *a)
{
	const resize_params *rp = a->params;
	int dtype = a->in[0]->dtype;
	union {
		double d;
		float f;
		int64_t i64;
		int32_t i32;
		int16_t i16;
		int8_t i8;
	} extra;
	memset(&extra, 0, sizeof extra);
	switch (dtype) {
	case TERN_DOUBLE: extra.d = rp->extrapolation; break;
	case TERN_FLOAT: extra.f = (float)rp->extrapolation; break;
	case TERN_INT64: case TERN_UINT64: extra.i64 = (int64_t)rp->extrapolation; break;
	case TERN_INT32: case TERN_UINT32: extra.i32 = (int32_t)rp->extrapolation; break;
	case TERN_INT16: case TERN_UINT16: extra.i16 = (int16_t)rp->extrapolation; break;
	default: extra.i8 = (int8_t)rp->extrapolation; break;
	}
	resize_ctx c = {rp, tern_dtype_size(dtype), a->in[0]->data, a->out[0]->data, &extra};
	range_fn fn = rp->nearest ? resize_gather_planes : dtype == TERN_DOUBLE ? resize_planes_f64 : resize_planes_f32;
	parallel_range(a->pool, rp->planes, grain_for(rp->out_plane), fn, &c);
	return TERN_OK;
}

/* Builds the taps of every axis from per-axis scales and output sizes. */
static tern_status resize_finish(tern_prepare_args *p, const resize_options *o, const double *scale,
                                 const int64_t *out, const double *roi)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	if (o->mode != RESIZE_NEAREST && !(x->dtype == TERN_FLOAT || x->dtype == TERN_DOUBLE || is_half(x->dtype)))
		return tern_node_errorf(node, TERN_EDATA, "linear and cubic modes need a floating-point input, got %s",
		                        tern_dtype_name(x->dtype));
	resize_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return no_memory(node);
	p->params = rp;
	p->free_params = resize_free;
	rp->rank = x->rank;
	rp->nearest = o->mode == RESIZE_NEAREST;
	rp->extrapolation = o->extrapolation;
	int64_t stride = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		resize_axis *ax = &rp->ax[d];
		ax->in = x->dims[d];
		ax->out = out[d];
		ax->stride = stride;
		stride *= ax->in;
		if (out[d] < 0 || (out[d] > 0 && ax->in == 0))
			return tern_node_errorf(node, TERN_EDATA, "axis %d: cannot resize %lld elements to %lld", d,
			                        (long long)ax->in, (long long)out[d]);
		if (resize_axis_build(o, ax, scale[d], roi ? roi[d] : 0, roi ? roi[x->rank + d] : 1))
			return no_memory(node);
	}
	rp->first = 0;
	while (rp->first < rp->rank && resize_axis_identity(&rp->ax[rp->first]))
		rp->first++;
	rp->planes = prod(x->dims, 0, rp->first);
	rp->in_plane = prod(x->dims, rp->first, x->rank);
	rp->out_plane = prod(out, rp->first, x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank, out);
	p->kernel = resize_kernel;
	return rp->nearest ? TERN_OK : stage_halves(p);
}

static tern_status resize_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	int r = x->rank;
	bool v10 = node->opset < 11;
	const tern_tensor *roi = v10 || p->n_in < 2 ? NULL : p->in[1];
	const tern_tensor *scales = p->n_in > (v10 ? 1 : 2) ? p->in[v10 ? 1 : 2] : NULL;
	const tern_tensor *sizes = !v10 && p->n_in > 3 ? p->in[3] : NULL;
	if (roi && tern_tensor_numel(roi) == 0)
		roi = NULL;
	if (scales && tern_tensor_numel(scales) == 0)
		scales = NULL;
	if (sizes && tern_tensor_numel(sizes) == 0)
		sizes = NULL;
	if ((scales && !scales->data) || (sizes && !sizes->data) || (roi && !roi->data)) {
		p->defer = 1;
		return TERN_OK;
	}
	if (!scales == !sizes)
		return tern_node_errorf(node, TERN_EDATA, "exactly one of 'scales' and 'sizes' must be given");
	resize_options o = {0};
	static const char *const modes[] = {"nearest", "linear", "cubic"};
	static const char *const coords[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
	                                     "align_corners", "asymmetric", "tf_crop_and_resize"};
	static const char *const nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
	int mode = 0, coord = 0, nm = 0;
	tern_status st = parse_enum(node, "mode", "nearest", modes, 3, &mode);
	if (!st)
		st = parse_enum(node, "coordinate_transformation_mode", v10 ? "asymmetric" : "half_pixel", coords, 6, &coord);
	if (!st)
		st = parse_enum(node, "nearest_mode", v10 ? "floor" : "round_prefer_floor", nearest, 4, &nm);
	if (st)
		return st;
	o.mode = mode;
	o.coord = coord;
	o.nearest = nm;
	o.cubic_a = tern_attr_float(node, "cubic_coeff_a", -0.75f);
	o.exclude_outside = tern_attr_int(node, "exclude_outside", 0) != 0;
	o.extrapolation = tern_attr_float(node, "extrapolation_value", 0.0f);
	o.antialias = tern_attr_int(node, "antialias", 0) != 0 && mode != RESIZE_NEAREST;
	/* The listed axes (all by default) get the given scales, sizes and roi; the rest stay. */
	size_t n_axes;
	const int64_t *axes_attr = tern_attr_ints(node, "axes", &n_axes);
	int axes[TERN_MAX_RANK];
	if (!axes_attr)
		n_axes = (size_t)r;
	bool seen[TERN_MAX_RANK] = {false};
	for (size_t i = 0; i < n_axes; i++) {
		if (axes_attr && (st = axis_in(node, axes_attr[i], r, &axes[i])))
			return st;
		if (!axes_attr)
			axes[i] = (int)i;
		if (seen[axes[i]])
			return tern_node_errorf(node, TERN_EDATA, "attribute 'axes' repeats axis %d", axes[i]);
		seen[axes[i]] = true;
	}
	const tern_tensor *given = scales ? scales : sizes;
	if (tern_tensor_numel(given) != (int64_t)n_axes)
		return tern_node_errorf(node, TERN_EDATA, "'%s' has %lld values for %zu axes", scales ? "scales" : "sizes",
		                        (long long)tern_tensor_numel(given), n_axes);
	if (roi && tern_tensor_numel(roi) != 2 * (int64_t)n_axes)
		return tern_node_errorf(node, TERN_EDATA, "'roi' has %lld values for %zu axes", (long long)tern_tensor_numel(roi),
		                        n_axes);
	double scale[TERN_MAX_RANK], roi_full[2 * TERN_MAX_RANK];
	int64_t out[TERN_MAX_RANK];
	for (int d = 0; d < r; d++) {
		scale[d] = 1;
		out[d] = x->dims[d];
		roi_full[d] = 0;
		roi_full[r + d] = 1;
	}
	for (size_t i = 0; i < n_axes; i++) {
		int d = axes[i];
		if (roi) {
			roi_full[d] = tern_tensor_get_f64(roi, (int64_t)i);
			roi_full[r + d] = tern_tensor_get_f64(roi, (int64_t)(n_axes + i));
		}
		if (scales) {
			scale[d] = tern_tensor_get_f64(scales, (int64_t)i);
			if (!(scale[d] > 0))
				return tern_node_errorf(node, TERN_EDATA, "scale %g for axis %d is not positive", scale[d], d);
			out[d] = (int64_t)floor(scale[d] * (double)x->dims[d]);
		} else {
			out[d] = tern_tensor_get_i64(sizes, (int64_t)i);
			scale[d] = x->dims[d] ? (double)out[d] / (double)x->dims[d] : 1;
		}
	}
	const char *policy = tern_attr_string(node, "keep_aspect_ratio_policy", "stretch");
	if (sizes && !streq(policy, "stretch")) {
		if (!streq(policy, "not_larger") && !streq(policy, "not_smaller"))
			return bad_attr(node, "keep_aspect_ratio_policy", policy);
		double s = scale[axes[0]];
		for (size_t i = 1; i < n_axes; i++)
			s = streq(policy, "not_larger") ? fmin(s, scale[axes[i]]) : fmax(s, scale[axes[i]]);
		for (size_t i = 0; i < n_axes; i++) {
			scale[axes[i]] = s;
			out[axes[i]] = (int64_t)(s * (double)x->dims[axes[i]] + 0.5);
		}
	}
	return resize_finish(p, &o, scale, out, roi ? roi_full : NULL);
}

static tern_status upsample_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	double scale[TERN_MAX_RANK];
	int64_t out[TERN_MAX_RANK];
	if (node->opset >= 9) {
		const tern_tensor *s = p->n_in > 1 ? p->in[1] : NULL;
		if (!s)
			return tern_node_errorf(node, TERN_EDATA, "input 1 'scales' is required");
		if (!s->data) {
			p->defer = 1;
			return TERN_OK;
		}
		if (tern_tensor_numel(s) != x->rank)
			return tern_node_errorf(node, TERN_EDATA, "'scales' has %lld values for rank %d",
			                        (long long)tern_tensor_numel(s), x->rank);
		for (int d = 0; d < x->rank; d++)
			scale[d] = tern_tensor_get_f64(s, d);
	} else {
		size_t n;
		const float *s = tern_attr_floats(node, "scales", &n);
		if (!s || n != (size_t)x->rank)
			return tern_node_errorf(node, TERN_EDATA, "attribute 'scales' needs %d values", x->rank);
		for (int d = 0; d < x->rank; d++)
			scale[d] = s[d];
	}
	for (int d = 0; d < x->rank; d++) {
		if (!(scale[d] >= 1))
			return tern_node_errorf(node, TERN_EDATA, "scale %g for axis %d is below 1", scale[d], d);
		out[d] = (int64_t)floor(scale[d] * (double)x->dims[d]);
	}
	resize_options o = {0};
	const char *mode = tern_attr_string(node, "mode", "nearest");
	if (streq(mode, "nearest"))
		o.mode = RESIZE_NEAREST;
	else if (streq(mode, "linear") || streq(mode, "bilinear"))
		o.mode = RESIZE_LINEAR;
	else
		return bad_attr(node, "mode", mode);
	o.coord = ASYMMETRIC;
	o.nearest = NEAREST_FLOOR;
	return resize_finish(p, &o, scale, out, NULL);
}

/* ---------------------------------------------------------------- MaxUnpool */

typedef struct unpool_params {
	int rank;
	int64_t full[TERN_MAX_RANK]; /* the shape the indices address: MaxPool's input */
} unpool_params;

static tern_status max_unpool_kernel(const tern_kernel_args *a)
{
	const unpool_params *up = a->params;
	const tern_tensor *x = a->in[0], *ind = a->in[1];
	tern_tensor *y = a->out[0];
	size_t es = tern_dtype_size(x->dtype);
	memset(y->data, 0, y->nbytes);
	int64_t n = tern_tensor_numel(x), total = tern_numel(up->rank, up->full);
	for (int64_t i = 0; i < n; i++) {
		int64_t at = tern_tensor_get_i64(ind, i);
		if (at < 0 || at >= total)
			return tern_node_errorf(a->node, TERN_EDATA, "index %lld at position %lld is outside [0, %lld)",
			                        (long long)at, (long long)i, (long long)total);
		/* The index addresses the unpooled shape; an explicit output shape holds it at its origin. */
		int64_t off = 0, stride = 1, rest = at;
		bool inside = true;
		for (int d = up->rank - 1; d >= 0; d--) {
			int64_t c = rest % up->full[d];
			rest /= up->full[d];
			inside &= c < y->dims[d];
			off += c * stride;
			stride *= y->dims[d];
		}
		if (inside)
			memcpy((char *)y->data + (size_t)off * es, (const char *)x->data + (size_t)i * es, es);
	}
	return TERN_OK;
}

static tern_status max_unpool_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *ind = p->in[1], *shape = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_rank(node, x, 0, 3, SP + 2);
	if (st)
		return st;
	if (ind->dtype != TERN_INT64 || tern_tensor_numel(ind) != tern_tensor_numel(x))
		return tern_node_errorf(node, TERN_EDATA, "input 1 'I' must be int64 with the shape of input 0");
	if (shape && !shape->data) {
		p->defer = 1;
		return TERN_OK;
	}
	window w;
	if ((st = window_read(node, x, NULL, &w)))
		return st;
	unpool_params *up = calloc(1, sizeof *up);
	if (!up)
		return no_memory(node);
	p->params = up;
	p->free_params = free;
	up->rank = x->rank;
	up->full[0] = x->dims[0];
	up->full[1] = x->dims[1];
	for (int i = 0; i < w.nsp; i++) {
		int j = SP - w.nsp + i;
		up->full[2 + i] = (w.in[j] - 1) * w.s[j] - w.pb[j] - w.pe[j] + w.k[j];
	}
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, up->full, sizeof dims);
	if (shape) {
		if (tern_tensor_numel(shape) != x->rank)
			return tern_node_errorf(node, TERN_EDATA, "input 2 'output_shape' has %lld values for rank %d",
			                        (long long)tern_tensor_numel(shape), x->rank);
		for (int d = 0; d < x->rank; d++)
			dims[d] = tern_tensor_get_i64(shape, d);
	}
	for (int d = 0; d < x->rank; d++)
		if (dims[d] < 0 || up->full[d] < 0)
			return tern_node_errorf(node, TERN_EDATA, "output dimension %d is negative", d);
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	p->kernel = max_unpool_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- table */

#define FLOATS TERN_DT_FLOATS
static const tern_op ops[] = {
	{"", "Conv", 1, 0, conv_prepare, FLOATS, "nn"},
	{"", "ConvInteger", 10, 0, conv_integer_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "nn"},
	{"", "QLinearConv", 10, 0, qlinear_conv_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "nn"},
	{"", "DeformConv", 19, 0, deform_conv_prepare, FLOATS, "nn"},
	{"", "ConvTranspose", 1, 0, conv_transpose_prepare, FLOATS, "nn"},
	{"", "Col2Im", 18, 0, col2im_prepare, FLOATS, "nn"},
	{"", "MaxPool", 1, 0, maxpool_prepare, FLOATS | TERN_DT(INT8) | TERN_DT(UINT8), "nn"},
	{"", "AveragePool", 1, 0, avgpool_prepare, FLOATS, "nn"},
	{"", "LpPool", 1, 0, lppool_prepare, FLOATS, "nn"},
	{"", "GlobalMaxPool", 1, 0, global_maxpool_prepare, FLOATS, "nn"},
	{"", "GlobalAveragePool", 1, 0, global_avgpool_prepare, FLOATS, "nn"},
	{"", "GlobalLpPool", 1, 0, global_lppool_prepare, FLOATS, "nn"},
	{"", "MaxUnpool", 9, 0, max_unpool_prepare, FLOATS, "nn"},
	{"", "BatchNormalization", 1, 0, bn_prepare, FLOATS, "nn"},
	{"", "InstanceNormalization", 1, 0, instance_norm_prepare, FLOATS, "nn"},
	{"", "GroupNormalization", 18, 0, group_norm_prepare, FLOATS, "nn"},
	{"", "LayerNormalization", 17, 0, layer_norm_prepare, FLOATS, "nn"},
	{"", "LRN", 1, 0, lrn_prepare, FLOATS, "nn"},
	{"", "LpNormalization", 1, 0, lp_norm_prepare, FLOATS, "nn"},
	{"", "MeanVarianceNormalization", 9, 0, mvn_prepare, FLOATS, "nn"},
	{"", "Softmax", 1, 0, softmax_prepare, FLOATS, "nn"},
	{"", "LogSoftmax", 1, 0, log_softmax_prepare, FLOATS, "nn"},
	{"", "Hardmax", 1, 0, hardmax_prepare, FLOATS, "nn"},
	{"", "Dropout", 1, 0, dropout_prepare, FLOATS, "nn"},
	{"", "NegativeLogLikelihoodLoss", 12, 0, nll_loss_prepare, FLOATS, "nn"},
	{"", "SoftmaxCrossEntropyLoss", 12, 0, sce_loss_prepare, FLOATS, "nn"},
	{"", "Resize", 10, 0, resize_prepare, 0, "nn"},
	{"", "Upsample", 7, 9, upsample_prepare, 0, "nn"},
};

const tern_op_table tern_ops_nn = {ops, TERN_ARRAY_LEN(ops)};
