/* blocked.c — convolution on activations in blocks of 16 channels, the layout tern-optimize's
 * `blocked-conv` pass gives the tensors between convolutions.
 *
 * A blocked tensor of an N x C x H x W activation is N x ceil(C/16) x H x W x 16: the 16 channels of
 * a block lie together at each position. The lanes past C are zero where tern.ToBlocks makes the
 * tensor and hold whatever finite values later operators compute from them (a convolution's zero
 * weights and bias for them give act(0)); nothing reads them as data: a convolution's weights for
 * them are zero, tern.FromBlocks drops them. tern.ToBlocks and
 * tern.FromBlocks convert at the edges of a run of blocked operators; elementwise operators between
 * blocked tensors of one shape need nothing new. tern.BlockedConv is Conv (group 1 or depthwise, 2-D) with
 * tern.FusedConv's bias, residual and activation, reading and writing blocked tensors.
 *
 * Why: in planar layout (NCHW) a convolution's product reads every input channel's plane and writes
 * every output channel's plane, hundreds of strided streams at once, which the caches and their
 * prefetchers follow badly once the planes are large (56 x 56); blocked, a tile of output positions
 * reads its input positions' channels and its weights as a few sequential streams, and a whole
 * network keeps that layout from one convolution to the next. The kernel keeps 2 blocks of output
 * channels by 14 positions in AVX-512 registers (1 block by 6 positions with AVX2, by 3 in the
 * baseline); each step loads one weight vector per block and broadcasts one input channel per
 * position. */
#include "ops/nn.h"

#define BLK 16


/* ---------------------------------------------------------------- layout conversions */

typedef struct reorder_ctx {
	const float *x;
	float *y;
	int64_t c, cb, hw;
} reorder_ctx;

/* Blocks [begin, end) of (image, channel block): planar to blocked. */
static void to_blocks_range(void *ctx, int64_t begin, int64_t end)
{
	const reorder_ctx *r = ctx;
	for (int64_t t = begin; t < end; t++) {
		int64_t n = t / r->cb, b = t % r->cb, c0 = b * BLK;
		int64_t live = r->c - c0 < BLK ? r->c - c0 : BLK;
		const float *x = r->x + (n * r->c + c0) * r->hw;
		float *y = r->y + t * r->hw * BLK;
		for (int64_t i = 0; i < r->hw; i++) {
			float *yi = y + i * BLK;
			for (int64_t c = 0; c < live; c++)
				yi[c] = x[c * r->hw + i];
			for (int64_t c = live; c < BLK; c++)
				yi[c] = 0;
		}
	}
}

/* The reverse: blocked to planar, the padding channels dropped. */
static void from_blocks_range(void *ctx, int64_t begin, int64_t end)
{
	const reorder_ctx *r = ctx;
	for (int64_t t = begin; t < end; t++) {
		int64_t n = t / r->cb, b = t % r->cb, c0 = b * BLK;
		int64_t live = r->c - c0 < BLK ? r->c - c0 : BLK;
		const float *x = r->x + t * r->hw * BLK;
		float *y = (float *)r->y + (n * r->c + c0) * r->hw;
		for (int64_t c = 0; c < live; c++) {
			float *yc = y + c * r->hw;
			for (int64_t i = 0; i < r->hw; i++)
				yc[i] = x[i * BLK + c];
		}
	}
}

static tern_status to_blocks_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	reorder_ctx r = {x->data, a->out[0]->data, x->dims[1], a->out[0]->dims[1], x->dims[2] * x->dims[3]};
	parallel_range(a->pool, x->dims[0] * r.cb, grain_for(r.hw * BLK), to_blocks_range, &r);
	return TERN_OK;
}

static tern_status from_blocks_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	const tern_tensor *y = a->out[0];
	reorder_ctx r = {x->data, y->data, y->dims[1], x->dims[1], x->dims[2] * x->dims[3]};
	parallel_range(a->pool, x->dims[0] * r.cb, grain_for(r.hw * BLK), from_blocks_range, &r);
	return TERN_OK;
}

static tern_status check_float(const tern_node *node, const tern_tensor *t, int index)
{
	if (t->dtype == TERN_FLOAT)
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "input %d has element type %s; float expected", index,
	                        tern_dtype_name(t->dtype));
}

/* A blocked tensor: rank 5, last dimension 16. */
static tern_status check_blocked(const tern_node *node, const tern_tensor *t, int index)
{
	tern_status st = check_float(node, t, index);
	if (!st && (t->rank != 5 || t->dims[4] != BLK)) {
		char s[128];
		st = tern_node_errorf(node, TERN_EDATA, "input %d %s is not in blocks of %d channels (N x C/%d x H x W x %d)",
		                      index, tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), BLK, BLK, BLK);
	}
	return st;
}

static tern_status to_blocks_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_float(p->node, x, 0);
	if (!st)
		st = check_rank(p->node, x, 0, 4, 4);
	if (st)
		return st;
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 5;
	int64_t dims[5] = {x->dims[0], ceil_div(x->dims[1], BLK), x->dims[2], x->dims[3], BLK};
	memcpy(y->dims, dims, sizeof dims);
	p->kernel = to_blocks_kernel;
	return TERN_OK;
}

static tern_status from_blocks_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_blocked(p->node, x, 0);
	if (st)
		return st;
	int64_t c = tern_attr_int(p->node, "channels", -1);
	if (c <= (x->dims[1] - 1) * BLK || c > x->dims[1] * BLK)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'channels' = %lld does not fit %lld blocks of %d",
		                        (long long)c, (long long)x->dims[1], BLK);
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 4;
	int64_t dims[4] = {x->dims[0], c, x->dims[2], x->dims[3]};
	memcpy(y->dims, dims, sizeof dims);
	p->kernel = from_blocks_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- global average pool */

/* Blocks [begin, end) of (image, channel block): the mean over the positions, lane by lane (sixteen
 * running sums; the compiler keeps them in the machine's vectors). */
TERN_ISA_BODY void gap_range_body(void *ctx, int64_t begin, int64_t end)
{
	const reorder_ctx *r = ctx;
	float scale = 1.0f / (float)r->hw;
	for (int64_t t = begin; t < end; t++) {
		const float *restrict x = r->x + t * r->hw * BLK;
		float acc[BLK] = {0};
		for (int64_t i = 0; i < r->hw; i++)
			for (int c = 0; c < BLK; c++)
				acc[c] += x[i * BLK + c];
		for (int c = 0; c < BLK; c++)
			r->y[t * BLK + c] = acc[c] * scale;
	}
}
TERN_ISA_VARIANTS3(void, gap_range, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

static tern_status gap_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	reorder_ctx r = {x->data, a->out[0]->data, 0, x->dims[1], x->dims[2] * x->dims[3]};
	parallel_range(a->pool, x->dims[0] * r.cb, grain_for(r.hw * BLK), gap_range, &r);
	return TERN_OK;
}

/* tern.BlockedGlobalAveragePool: GlobalAveragePool of a blocked tensor, N x C/16 x 1 x 1 x 16. */
static tern_status gap_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	tern_status st = check_blocked(p->node, x, 0);
	if (st)
		return st;
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 5;
	int64_t dims[5] = {x->dims[0], x->dims[1], 1, 1, BLK};
	memcpy(y->dims, dims, sizeof dims);
	p->kernel = gap_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- per-channel scale */

typedef struct scale_ctx {
	const float *x, *s;
	float *y;
	int64_t hw;
} scale_ctx;

/* Blocks [begin, end) of (image, channel block): y = x times the block's sixteen scales. */
TERN_ISA_BODY void scale_range_body(void *ctx, int64_t begin, int64_t end)
{
	const scale_ctx *r = ctx;
	for (int64_t t = begin; t < end; t++) {
		const float *restrict x = r->x + t * r->hw * BLK;
		float *restrict y = r->y + t * r->hw * BLK;
		float sc[BLK];
		memcpy(sc, r->s + t * BLK, sizeof sc);
		for (int64_t i = 0; i < r->hw; i++)
			for (int c = 0; c < BLK; c++)
				y[i * BLK + c] = x[i * BLK + c] * sc[c];
	}
}
TERN_ISA_VARIANTS3(void, scale_range, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

static tern_status scale_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	scale_ctx r = {x->data, a->in[1]->data, a->out[0]->data, x->dims[2] * x->dims[3]};
	parallel_range(a->pool, x->dims[0] * x->dims[1], grain_for(r.hw * BLK), scale_range, &r);
	return TERN_OK;
}

/* tern.BlockedScale: Mul of a blocked N x C/16 x H x W x 16 tensor and one value per channel, blocked
 * too (N x C/16 x 1 x 1 x 16): a squeeze-and-excitation block's scale, in one pass (numpy broadcasting
 * would walk it as rows of sixteen). */
static tern_status scale_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *sc = p->in[1];
	tern_status st = check_blocked(p->node, x, 0);
	if (!st)
		st = check_blocked(p->node, sc, 1);
	if (st)
		return st;
	if (sc->dims[0] != x->dims[0] || sc->dims[1] != x->dims[1] || sc->dims[2] != 1 || sc->dims[3] != 1) {
		char s[128];
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 %s is not one value per channel of input 0",
		                        tern_shape_str(sc->dtype, sc->rank, sc->dims, s, sizeof s));
	}
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 5;
	memcpy(y->dims, x->dims, sizeof y->dims[0] * 5);
	p->kernel = scale_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- the convolution */

typedef struct bconv bconv;
typedef void (*bconv_row_fn)(const bconv *, const float *, int64_t, int64_t, int64_t, float *, const float *);

struct bconv {
	window w;
	int64_t n, icb, ocb, kh, kw;
	int64_t x_h, x_w;     /* the input's own rows and columns */
	int64_t in_h, in_w;   /* the input as the kernel reads it: larger than x_h, x_w in the padded copy */
	int64_t pad_t, pad_l; /* zeros above and left of the input in the padded copy */
	int64_t out_h, out_w; /* with a 1 x 1 window on short rows, one row of all positions */
	int64_t groups;       /* pairs of output channel blocks; with depthwise, the blocks */
	bool depthwise;       /* group = channels: each output channel from its own input channel */
	bool pool;            /* tern.BlockedMaxPool, BlockedAveragePool: the window's maximum or mean */
	bool avg, include_pad; /* the mean; its divisor counts the padding (count_include_pad) */
	int64_t lanes;        /* floats a position of the input as the kernel reads it: 16, or with planar
	                       * input (a stem's few channels) its channels, copied so into the scratch */
	float *wt;            /* ocb x icb x kh x kw x 16 (input channel) x 16 (output channel); with
	                       * depthwise ocb x kh x kw x 16 */
	float *bias;          /* ocb x 16 */
	tern_act act;
	bool rows_outer; /* walk output rows outside the channel groups (the weights are small) */
	bconv_row_fn row; /* the instruction set's kernel, chosen when planning */
	struct wino *wino; /* 3 x 3, stride 1: Winograd's F(2 x 2, 3 x 3) (below), when it pays */
};

/* The kernel reads a padded copy of the input rather than the input in place. */
static bool padded(const bconv *c)
{
	return c->in_h != c->x_h || c->in_w != c->x_w;
}

static void wino_free(struct wino *w);

static void bconv_free(void *p)
{
	bconv *c = p;
	if (c) {
		free(c->wt);
		free(c->bias);
		wino_free(c->wino);
	}
	free(c);
}

/* For output row oh: the window rows [*kh0, *kh1) that lie inside the input, and the output columns
 * [*lo, *hi) whose window rows lie wholly inside it (the kernels that read their input in place, the
 * edges' windows cut to it). */
static void window_inside(const bconv *c, int64_t oh, int64_t *kh0, int64_t *kh1, int64_t *lo, int64_t *hi)
{
	const window *w = &c->w;
	int64_t s_h = w->s[1], s_w = w->s[2], d_h = w->d[1], d_w = w->d[2];
	int64_t ih0 = oh * s_h - c->pad_t, k0 = 0, k1 = c->kh;
	while (k0 < k1 && ih0 + k0 * d_h < 0)
		k0++;
	while (k1 > k0 && ih0 + (k1 - 1) * d_h >= c->x_h)
		k1--;
	int64_t first = ceil_div(c->pad_l, s_w), last = c->x_w - 1 + c->pad_l - (c->kw - 1) * d_w;
	int64_t end = last < 0 ? 0 : last / s_w + 1;
	first = first < c->out_w ? first : c->out_w;
	*kh0 = k0;
	*kh1 = k1;
	*lo = first;
	*hi = end < first ? first : end > c->out_w ? c->out_w : end;
}

/* Multiply-adds contract into FMA instructions (GCC in ISO C mode does so only when told). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
#define AI static inline __attribute__((always_inline))
#define UNROLL_ALL _Pragma("GCC unroll 16")

/* The kernel at each vector width (blocked_tile.h): 2 blocks x 14 positions in AVX-512's 32
 * registers, 1 block x 6 in AVX2's 16, 1 x 3 in the baseline's 16 of 4 floats. */
#if TERN_HAVE_ISA_TARGETS
#include <immintrin.h>
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v8i __attribute__((vector_size(32)));
#define BT_VL 16
#define BT_V v16
#define BT_VU v16u
#define BT_VI v16i
#define BT_ATTR TERN_TARGET_AVX512
#define BT_OB 2
#define BT_NB 14
#define BT_MAX(a, b) ((v16)_mm512_max_ps((__m512)(a), (__m512)(b)))
#include "ops/blocked_tile.h"
#define BT_VL 8
#define BT_V v8
#define BT_VU v8u
#define BT_VI v8i
#define BT_ATTR TERN_TARGET_AVX2
#define BT_OB 1
#define BT_NB 6
#define BT_MAX(a, b) ((v8)_mm256_max_ps((__m256)(a), (__m256)(b)))
#include "ops/blocked_tile.h"
#endif
typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4), may_alias));
typedef int32_t v4i __attribute__((vector_size(16)));
#define BT_VL 4
#define BT_V v4
#define BT_VU v4u
#define BT_VI v4i
#define BT_ATTR
#define BT_OB 1
#define BT_NB 3
#define BT_MAX(a, b) ((v4)(((v4i)(a) & ((a) > (b))) | ((v4i)(b) & ~((a) > (b)))))
#include "ops/blocked_tile.h"

static bconv_row_fn row_fn(const bconv *c)
{
#if TERN_HAVE_ISA_TARGETS
	if (tern_isa() == TERN_ISA_AVX512)
		return c->pool ? bpool_row_16 : c->depthwise ? bconv_dw_row_16 : bconv_row_16;
	if (tern_isa() == TERN_ISA_AVX2)
		return c->pool ? bpool_row_8 : c->depthwise ? bconv_dw_row_8 : bconv_row_8;
#endif
	return c->pool ? bpool_row_4 : c->depthwise ? bconv_dw_row_4 : bconv_row_4;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

typedef struct bconv_run {
	const bconv *c;
	const float *x, *z; /* one image's */
	float *y;
} bconv_run;

/* Items [begin, end): (group, output row) or, with rows_outer, (output row, group). */
static void bconv_range(void *ctx, int64_t begin, int64_t end)
{
	const bconv_run *r = ctx;
	const bconv *c = r->c;
	for (int64_t t = begin; t < end; t++) {
		int64_t g = c->rows_outer ? t % c->groups : t / c->out_h, oh = c->rows_outer ? t / c->groups : t % c->out_h;
		int64_t per = c->depthwise || c->pool ? 1 : 2, ob = per * g, count = c->ocb - ob < per ? c->ocb - ob : per;
		c->row(c, r->x, ob, count, oh, r->y, r->z);
	}
}

typedef struct pad_ctx {
	const bconv *c;
	const float *x;
	float *xp;
} pad_ctx;

/* Rows [begin, end) of (channel block, padded row) of the padded copy. */
static void pad_range(void *ctx, int64_t begin, int64_t end)
{
	const pad_ctx *p = ctx;
	const bconv *c = p->c;
	for (int64_t t = begin; t < end; t++) {
		int64_t b = t / c->in_h, i = t % c->in_h - c->pad_t;
		float *dst = p->xp + t * c->in_w * BLK;
		if (i < 0 || i >= c->x_h) {
			memset(dst, 0, (size_t)(c->in_w * BLK) * sizeof *dst);
			continue;
		}
		int64_t right = c->in_w - c->pad_l - c->x_w;
		memset(dst, 0, (size_t)(c->pad_l * BLK) * sizeof *dst);
		memcpy(dst + c->pad_l * BLK, p->x + (b * c->x_h + i) * c->x_w * BLK, (size_t)(c->x_w * BLK) * sizeof *dst);
		memset(dst + (c->pad_l + c->x_w) * BLK, 0, (size_t)(right * BLK) * sizeof *dst);
	}
}

/* The same from planar input of c->lanes channels (one block): rows [begin, end) of the padded copy,
 * each position's channels together. */
static void pad_planar_range(void *ctx, int64_t begin, int64_t end)
{
	const pad_ctx *p = ctx;
	const bconv *c = p->c;
	int64_t L = c->lanes, plane = c->x_h * c->x_w;
	for (int64_t t = begin; t < end; t++) {
		int64_t i = t - c->pad_t;
		float *dst = p->xp + t * c->in_w * L;
		memset(dst, 0, (size_t)(c->in_w * L) * sizeof *dst);
		if (i < 0 || i >= c->x_h)
			continue;
		for (int64_t ch = 0; ch < L; ch++) {
			const float *src = p->x + ch * plane + i * c->x_w;
			for (int64_t j = 0; j < c->x_w; j++)
				dst[(c->pad_l + j) * L + ch] = src[j];
		}
	}
}

static tern_status bconv_kernel(const tern_kernel_args *a)
{
	const bconv *c = a->params;
	const tern_tensor *z = a->n_in > 3 ? a->in[3] : NULL;
	int64_t items = c->groups * c->out_h;
	int64_t in_img = c->icb * c->x_h * c->x_w * c->lanes, out_img = c->ocb * c->out_h * c->out_w * BLK;
	int64_t work = (c->depthwise || c->pool ? 1 : 2 * c->icb * BLK) * BLK * c->out_w * c->kh * c->kw; /* multiply-adds per item */
	for (int64_t n = 0; n < c->n; n++) {
		const float *x = (const float *)a->in[0]->data + n * in_img;
		if (c->lanes != BLK) {
			pad_ctx pc = {c, x, a->scratch};
			parallel_range(a->pool, c->in_h, grain_for(c->in_w * c->lanes), pad_planar_range, &pc);
			x = a->scratch;
		} else if (padded(c)) {
			pad_ctx pc = {c, x, a->scratch};
			parallel_range(a->pool, c->icb * c->in_h, grain_for(c->in_w * BLK), pad_range, &pc);
			x = a->scratch;
		}
		bconv_run r = {c, x, z ? (const float *)z->data + n * out_img : NULL, (float *)a->out[0]->data + n * out_img};
		parallel_range(a->pool, items, grain_for(work), bconv_range, &r);
	}
	return TERN_OK;
}

static tern_status unpacked_kernel(const tern_kernel_args *a)
{
	return tern_node_errorf(a->node, TERN_EDATA, "inputs 1 and 2 (weights, bias) must be constants");
}

/* ---------------------------------------------------------------- Winograd's F(2 x 2, 3 x 3)
 *
 * A 3 x 3 convolution of stride 1 gets each 2 x 2 tile of outputs from the 4 x 4 inputs under it with
 * 16 multiply-adds a pair of channels instead of 36 (Lavin and Gray, 2016): V = B'dB of each input
 * tile d, U = GgG' of each filter g (when planning), M = the sum over input channels of U times V,
 * position by position, and the outputs A'MA. The sums over input channels are 16 matrix products,
 * one per position xi of the 4 x 4 tile (tiles x input channels by input channels x output channels),
 * which BlockedConv's own kernel computes: they are a 1 x 1 convolution over a row of tiles, in a view
 * of the convolution whose 16 rows are the positions, with row xi's weights U[xi]. The image's tiles
 * go in chunks of whole tile rows (WINO_CHUNK). Where every thread gets a chunk and the transformed
 * filters fit half the second-level cache, a chunk is done whole by one thread (fused): its input
 * transforms, then per pair of output blocks the 16 products and the output transform. Otherwise the
 * chunks go in passes whose transformed inputs fit half that cache: first the pass's input
 * transforms, per chunk and channel block, then per pair of output blocks and chunk the products and
 * the outputs. The output transform adds the bias and the residual and applies the activation while
 * the products are still in the core's cache. The transforms only add and halve, so the results
 * differ from the direct sums by rounding alone. */

#define WT 16 /* positions of an input tile (4 x 4) */

struct wino {
	int64_t th, tw;           /* tile rows and columns: the outputs in pairs, the last cut at an odd edge */
	int64_t rows, chunks, tc; /* tile rows a chunk, chunks, tiles a chunk at most */
	int64_t pass, slots;      /* chunks a pass; slots of the products' scratch (2 x WT x tc x 16 each) */
	bool fused;               /* each chunk whole on one thread, in a slot (below) */
	float *u;                 /* WT x ocb x icb x 16 (input channel) x 16 (output channel) */
	float *zeros;             /* ocb x 16: the products' bias */
	bconv view;               /* the products: icb blocks to ocb, 1 x 1, over WT rows of a chunk's tiles */
};

static void wino_free(struct wino *w)
{
	if (w) {
		free(w->u);
		free(w->zeros);
	}
	free(w);
}

typedef struct wino_run {
	const bconv *c;
	const float *x, *z; /* one image's */
	float *y, *v, *m;   /* v: the pass's chunks x icb x WT x tc x 16; m: the slots' products */
	int64_t k0, nk; /* the pass's first chunk and its chunks */
} wino_run;

/* Chunk k's tiles: [*first, *first + *count) in row-major order. */
static void wino_chunk(const struct wino *w, int64_t k, int64_t *first, int64_t *count)
{
	int64_t r0 = k * w->rows, r1 = r0 + w->rows < w->th ? r0 + w->rows : w->th;
	*first = r0 * w->tw;
	*count = (r1 - r0) * w->tw;
}

/* A block's 16 lanes as one vector (the compiler splits it into the path's own widths: the transforms
 * keep few of them live at a time); WVU: the same at any alignment. */
typedef float wv __attribute__((vector_size(64)));
typedef float wvu __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t wvi __attribute__((vector_size(64)));

/* Chunk k's V = B'dB of input block b, into the chunk's v: row xi of the view at
 * ((b x WT + xi) x count + tile) x 16. Inputs outside the image (the padding) are zeros. */
TERN_ISA_BODY void wino_in_body(const wino_run *r, int64_t k, int64_t b, float *v)
{
	const bconv *c = r->c;
	const struct wino *w = c->wino;
	int64_t first, count;
	wino_chunk(w, k, &first, &count);
	const float *xb = r->x + b * c->x_h * c->x_w * BLK;
	float *vb = v + b * count * WT * BLK;
	int64_t row = count * BLK; /* floats between rows xi */
	for (int64_t t = 0; t < count; t++) {
		int64_t i0 = (first + t) / w->tw * 2 - c->pad_t, j0 = (first + t) % w->tw * 2 - c->pad_l;
		bool inside = i0 >= 0 && i0 + 4 <= c->x_h && j0 >= 0 && j0 + 4 <= c->x_w;
		wv d[4][4], e[4][4];
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 4; j++) {
				int64_t ih = i0 + i, iw = j0 + j;
				if (inside || (ih >= 0 && ih < c->x_h && iw >= 0 && iw < c->x_w))
					d[i][j] = *(const wvu *)(xb + (ih * c->x_w + iw) * BLK);
				else
					d[i][j] = (wv){0};
			}
		for (int j = 0; j < 4; j++) { /* B'd */
			e[0][j] = d[0][j] - d[2][j];
			e[1][j] = d[1][j] + d[2][j];
			e[2][j] = d[2][j] - d[1][j];
			e[3][j] = d[1][j] - d[3][j];
		}
		for (int i = 0; i < 4; i++) { /* (B'd)B */
			float *o = vb + 4 * i * row + t * BLK;
			*(wvu *)o = e[i][0] - e[i][2];
			*(wvu *)(o + row) = e[i][1] + e[i][2];
			*(wvu *)(o + 2 * row) = e[i][2] - e[i][1];
			*(wvu *)(o + 3 * row) = e[i][1] - e[i][3];
		}
	}
}
TERN_ISA_VARIANTS3(void, wino_in, (const wino_run *r, int64_t k, int64_t b, float *v), (r, k, b, v))

/* Items [begin, end) of (chunk of the pass, input block). */
static void wino_in_range(void *ctx, int64_t begin, int64_t end)
{
	const wino_run *r = ctx;
	const bconv *c = r->c;
	for (int64_t item = begin; item < end; item++) {
		int64_t k = item / c->icb;
		wino_in(r, r->k0 + k, item % c->icb, r->v + k * c->icb * c->wino->tc * WT * BLK);
	}
}

/* The outputs A'MA of output block o over a chunk's tiles (m: the block's WT rows of count tiles),
 * with the bias, the residual and the activation. */
TERN_ISA_BODY void wino_out_body(const wino_run *r, int64_t first, int64_t count, int64_t o, const float *m)
{
	const bconv *c = r->c;
	const struct wino *w = c->wino;
	bool relu = c->act.kind == TERN_ACT_RELU, other = !relu && c->act.kind != TERN_ACT_NONE;
	wv bias = *(const wvu *)(c->bias + o * BLK);
	int64_t row = count * BLK;
	for (int64_t t = 0; t < count; t++) {
		int64_t oh = (first + t) / w->tw * 2, ow = (first + t) % w->tw * 2;
		const float *q = m + t * BLK;
		wv s[2][4], out[2][2];
		for (int j = 0; j < 4; j++) { /* A'M */
			wv q0 = *(const wvu *)(q + j * row), q1 = *(const wvu *)(q + (4 + j) * row),
			   q2 = *(const wvu *)(q + (8 + j) * row), q3 = *(const wvu *)(q + (12 + j) * row);
			s[0][j] = q0 + q1 + q2;
			s[1][j] = q1 - q2 - q3;
		}
		for (int a = 0; a < 2; a++) { /* (A'M)A, the bias */
			out[a][0] = s[a][0] + s[a][1] + s[a][2] + bias;
			out[a][1] = s[a][1] - s[a][2] - s[a][3] + bias;
		}
		for (int a = 0; a < 2 && oh + a < c->out_h; a++)
			for (int b = 0; b < 2 && ow + b < c->out_w; b++) {
				int64_t at = ((o * c->out_h + oh + a) * c->out_w + ow + b) * BLK;
				wv v = out[a][b];
				if (r->z)
					v += *(const wvu *)(r->z + at);
				if (relu)
					v = (wv)((wvi)v & (v > 0));
				*(wvu *)(r->y + at) = v;
				if (other)
					tern_act_run(&c->act, r->y + at, NULL, BLK);
			}
	}
}
TERN_ISA_VARIANTS3(void, wino_out, (const wino_run *r, int64_t first, int64_t count, int64_t o, const float *m),
                   (r, first, count, o, m))

/* Chunk k's 16 products for output blocks [ob, ob + 2) (fewer at the end) from its v, into m, then
 * the outputs. */
static void wino_pair(const wino_run *r, int64_t k, int64_t ob, const float *v, float *m)
{
	const bconv *c = r->c;
	const struct wino *w = c->wino;
	int64_t n = c->ocb - ob < 2 ? c->ocb - ob : 2, first, count;
	wino_chunk(w, k, &first, &count);
	bconv view = w->view;
	view.x_w = view.in_w = view.out_w = count;
	for (int xi = 0; xi < WT; xi++) { /* the pair's weights as blocks 0 and 1 of the view's */
		view.wt = w->u + (xi * c->ocb + ob) * c->icb * BLK * BLK;
		c->row(&view, v, 0, n, xi, m, NULL);
	}
	for (int64_t o = 0; o < n; o++)
		wino_out(r, first, count, ob + o, m + o * WT * count * BLK);
}

/* Items [begin, end) of (pair of output blocks, chunk of the pass), the products into the slot's
 * scratch. Pairs outside: a pair's transformed filters stay in the cache over the pass's chunks, whose
 * transformed inputs fit there too (a thread reads the filters of its own pairs only). */
static void wino_gemm_slot(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	const wino_run *r = ctx;
	const bconv *c = r->c;
	const struct wino *w = c->wino;
	for (int64_t item = begin; item < end; item++) {
		int64_t k = item % r->nk;
		wino_pair(r, r->k0 + k, item / r->nk * 2, r->v + k * c->icb * w->tc * WT * BLK,
		          r->m + slot * 2 * WT * w->tc * BLK);
	}
}

/* Fused: items [begin, end) of chunks, each whole in one slot (its transformed inputs, then every
 * pair's products and outputs), so that no core reads what another wrote. */
static void wino_chunk_slot(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	const wino_run *r = ctx;
	const bconv *c = r->c;
	const struct wino *w = c->wino;
	float *v = r->v + slot * (c->icb + 2) * WT * w->tc * BLK, *m = v + c->icb * WT * w->tc * BLK;
	for (int64_t k = begin; k < end; k++) {
		for (int64_t b = 0; b < c->icb; b++)
			wino_in(r, k, b, v);
		for (int64_t ob = 0; ob < c->ocb; ob += 2)
			wino_pair(r, k, ob, v, m);
	}
}

static tern_status wino_kernel(const tern_kernel_args *a)
{
	const bconv *c = a->params;
	const struct wino *w = c->wino;
	const tern_tensor *z = a->n_in > 3 ? a->in[3] : NULL;
	int64_t in_img = c->icb * c->x_h * c->x_w * BLK, out_img = c->ocb * c->out_h * c->out_w * BLK;
	if (w->fused) {
		for (int64_t n = 0; n < c->n; n++) {
			wino_run r = {c, (const float *)a->in[0]->data + n * in_img,
			              z ? (const float *)z->data + n * out_img : NULL, (float *)a->out[0]->data + n * out_img,
			              a->scratch, NULL, 0, w->chunks};
			parallel_slots(a->pool, w->chunks, 1, w->slots, wino_chunk_slot, &r);
		}
		return TERN_OK;
	}
	float *v = a->scratch, *m = v + w->pass * c->icb * w->tc * WT * BLK;
	for (int64_t n = 0; n < c->n; n++)
		for (int64_t k0 = 0; k0 < w->chunks; k0 += w->pass) {
			int64_t k1 = k0 + w->pass < w->chunks ? k0 + w->pass : w->chunks;
			wino_run r = {c, (const float *)a->in[0]->data + n * in_img,
			              z ? (const float *)z->data + n * out_img : NULL, (float *)a->out[0]->data + n * out_img,
			              v, m, k0, k1 - k0};
			parallel_range(a->pool, (k1 - k0) * c->icb, grain_for(w->tc * WT * BLK * 2), wino_in_range, &r);
			parallel_slots(a->pool, (k1 - k0) * c->groups, grain_for(2 * c->icb * BLK * BLK * WT * w->tc), w->slots,
			               wino_gemm_slot, &r);
		}
	return TERN_OK;
}

/* Whether c (a 3 x 3 convolution of blocked input) runs as F(2 x 2, 3 x 3), unless TERN_WINOGRAD=0:
 * stride and dilation 1, more than one block of input channels and outputs of at least 8 a side.
 * Eight chained convolutions with Relu (`tern-run --threads 1`, medians of alternating runs, AVX-512
 * and AVX2), direct against F(2 x 2, 3 x 3): 64 channels at 56 x 56 11.6 against 8.3 ms (AVX2 20.3,
 * 15.2), 256 at 14 x 14 12.0 against 8.4 (21.0, 14.1), 384 at 8 x 8 11.4 against 9.2, 32 at 16 x 16
 * 0.26 against 0.17. Below: 512 channels at 7 x 7 lost on AVX-512 (17.4 against 18.4: 16 products a
 * tile of 4 outputs, over an 8 x 8 grid of them, read 16/9 of the weights for 64/49 of the outputs),
 * and 16 channels (one block) lost on AVX2 (0.40 against 0.59 ms at 32 x 32: sums over 16 input
 * channels are too short for the products' kernel). */
static bool wino_wanted(const bconv *c)
{
	const char *env = getenv("TERN_WINOGRAD");
	const window *w = &c->w;
	return !(env && strcmp(env, "0") == 0) && !c->depthwise && c->lanes == BLK && c->icb > 1 && c->kh == 3 &&
	       c->kw == 3 && w->s[1] == 1 && w->s[2] == 1 && w->d[1] == 1 && w->d[2] == 1 && c->out_h >= 8 &&
	       c->out_w >= 8;
}

/* Tiles a chunk, about: 56 (4 of AVX-512's kernel tiles) ran faster than 28 and as fast as 112 on
 * both paths, at 64 channels on 56 x 56 and 256 on 14 x 14. */
#define WINO_CHUNK 56

/* The plan of c's F(2 x 2, 3 x 3): tiles, chunks, the transformed filters of src (M x ch x 3 x 3),
 * the view and the scratch. */
static tern_status wino_plan(bconv *c, tern_prepare_args *p, const float *src, int64_t m, int64_t ch)
{
	struct wino *w = calloc(1, sizeof *w);
	if (!w)
		return no_memory(p->node);
	c->wino = w;
	w->th = ceil_div(c->out_h, 2);
	w->tw = ceil_div(c->out_w, 2);
	w->rows = ceil_div(WINO_CHUNK, w->tw);
	w->rows = w->rows < w->th ? w->rows : w->th;
	w->chunks = ceil_div(w->th, w->rows);
	w->tc = w->rows * w->tw;
	size_t un = (size_t)(WT * c->ocb * c->icb * BLK * BLK);
	w->u = tern_aligned_alloc(un * sizeof *w->u);
	w->zeros = tern_aligned_alloc((size_t)(c->ocb * BLK) * sizeof *w->zeros);
	if (!w->u || !w->zeros)
		return no_memory(p->node);
	for (int64_t o = 0; o < m; o++)
		for (int64_t i = 0; i < ch; i++) {
			const float *g = src + (o * ch + i) * 9;
			float t[4][3], u[4][4];
			for (int j = 0; j < 3; j++) { /* Gg */
				t[0][j] = g[j];
				t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
				t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
				t[3][j] = g[6 + j];
			}
			for (int a = 0; a < 4; a++) { /* (Gg)G' */
				u[a][0] = t[a][0];
				u[a][1] = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
				u[a][2] = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
				u[a][3] = t[a][2];
			}
			for (int xi = 0; xi < WT; xi++)
				w->u[(((xi * c->ocb + o / BLK) * c->icb + i / BLK) * BLK + i % BLK) * BLK + o % BLK] = u[xi / 4][xi % 4];
		}
	bconv *v = &w->view;
	*v = *c;
	v->wino = NULL;
	v->wt = NULL;
	v->bias = w->zeros;
	v->act.kind = TERN_ACT_NONE;
	v->kh = v->kw = 1;
	v->w.s[1] = v->w.s[2] = v->w.d[1] = v->w.d[2] = 1;
	v->x_h = v->in_h = v->out_h = WT;
	v->pad_t = v->pad_l = 0;
	/* chunks a pass: those whose transformed inputs fit half the second-level cache, or one a thread */
	size_t chunk_bytes = (size_t)(c->icb * w->tc * WT * BLK) * sizeof(float);
	int64_t threads = p->pool ? tern_threadpool_size(p->pool) : 1;
	w->pass = (int64_t)((size_t)tern_l2_bytes() / 2 / chunk_bytes);
	w->pass = w->pass > threads ? w->pass : threads;
	w->pass = w->pass < w->chunks ? w->pass : w->chunks;
	w->slots = slots_for(p->pool);
	p->scratch_bytes = (size_t)w->pass * chunk_bytes + (size_t)(w->slots * 2 * WT * w->tc * BLK) * sizeof(float);
	/* fused, when every thread gets a chunk of its own and the transformed filters fit half the
	 * second-level cache (each core reads them all). Eight chained convolutions at two threads
	 * (medians of alternating runs), passes against fused: 64 channels at 56 x 56 5.79 against 4.28
	 * ms, 128 at 28 x 28 4.57 against 3.89, 48 at 35 x 35 1.53 against 1.15, 32 at 16 x 16 (two
	 * chunks) 0.276 against 0.174; at one thread within 3 % either way. */
	w->fused = w->chunks >= threads && un * sizeof *w->u <= (size_t)tern_l2_bytes() / 2;
	if (w->fused) {
		w->slots = w->slots < w->chunks ? w->slots : w->chunks;
		p->scratch_bytes = (size_t)(w->slots * (c->icb + 2) * WT * w->tc * BLK) * sizeof(float);
	}
	return TERN_OK;
}

/* The padded copy of the input, when the window needs one (or `always`): it reaches every tap of every
 * output, so its extent is the window's reach or the padded input, whichever is more. */
static bool plan_padded(bconv *c, tern_prepare_args *p, bool always)
{
	const window *w = &c->w;
	if (!always && !w->pb[1] && !w->pb[2] && !w->pe[1] && !w->pe[2] && wb_extent(w, 1) <= c->in_h &&
	    wb_extent(w, 2) <= c->in_w)
		return false;
	c->pad_t = w->pb[1];
	c->pad_l = w->pb[2];
	c->in_h = wb_extent(w, 1);
	c->in_w = wb_extent(w, 2);
	p->scratch_bytes = (size_t)(c->icb * c->in_h * c->in_w * c->lanes) * sizeof(float);
	return true;
}

static tern_status bconv_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *wt = p->n_in > 1 ? p->in[1] : NULL;
	const tern_tensor *b = p->n_in > 2 ? p->in[2] : NULL, *z = p->n_in > 3 ? p->in[3] : NULL;
	/* planar input of fewer than 16 channels: a stem, whose blocked input would be mostly zeros */
	bool planar_in = x->rank == 4 && x->dtype == TERN_FLOAT && x->dims[1] < BLK;
	tern_status st = planar_in ? TERN_OK : check_blocked(node, x, 0);
	if (st)
		return st;
	if (!wt || wt->rank != 4 || wt->dtype != TERN_FLOAT)
		return tern_node_errorf(node, TERN_EDATA, "input 1 (weights) must be float M x C x kH x kW");
	int64_t m = wt->dims[0], ch = wt->dims[1], group = tern_attr_int(node, "group", 1);
	bool depthwise = group != 1;
	if (depthwise && (group != m || ch != 1))
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'group' must be 1 or the channels of a depthwise convolution (%lld)",
		                        (long long)m);
	int64_t in_ch = depthwise ? m : ch;
	if (planar_in && (depthwise || ch != x->dims[1]))
		return tern_node_errorf(node, TERN_EDATA, "weights for %lld input channels, planar input has %lld",
		                        (long long)in_ch, (long long)x->dims[1]);
	if (!planar_in && ceil_div(in_ch, BLK) != x->dims[1])
		return tern_node_errorf(node, TERN_EDATA, "weights for %lld input channels, input has %lld blocks of %d",
		                        (long long)in_ch, (long long)x->dims[1], BLK);
	if (b && (b->dtype != TERN_FLOAT || tern_tensor_numel(b) != m))
		return tern_node_errorf(node, TERN_EDATA, "input 2 (bias) must be a float constant of %lld elements",
		                        (long long)m);
	/* the window, from the planar shape the blocked input stands for */
	tern_tensor planar = tern_nn_shape_only(TERN_FLOAT, 4, (int64_t[]){x->dims[0], in_ch, x->dims[2], x->dims[3]});
	bconv *c = calloc(1, sizeof *c);
	if (!c)
		return no_memory(node);
	if ((st = tern_nn_window_read(node, &planar, wt->dims + 2, &c->w)) ||
	    (st = tern_nn_window_forward(node, &c->w, false))) {
		bconv_free(c);
		return st;
	}
	if (!tern_act_from_node(node, &c->act)) {
		bconv_free(c);
		return tern_node_errorf(node, TERN_EDATA, "attribute 'activation' names no supported activation");
	}
	c->n = x->dims[0];
	c->icb = planar_in ? 1 : x->dims[1];
	c->lanes = planar_in ? ch : BLK;
	c->ocb = ceil_div(m, BLK);
	c->depthwise = depthwise;
	c->groups = depthwise ? c->ocb : ceil_div(c->ocb, 2);
	c->kh = wt->dims[2];
	c->kw = wt->dims[3];
	c->x_h = c->in_h = x->dims[2];
	c->x_w = c->in_w = x->dims[3];
	c->out_h = c->w.out[1];
	c->out_w = c->w.out[2];
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 5;
	int64_t dims[5] = {c->n, c->ocb, c->out_h, c->out_w, BLK};
	memcpy(y->dims, dims, sizeof dims);
	const window *w = &c->w;
	bool wino = wino_wanted(c);
	if (depthwise || wino) {
		/* read in place, the edges' windows cut to the input (Winograd's input transform: zeros
		 * outside it): a padded copy would cost a pass over the input and its writes, which is what
		 * the depthwise convolution itself costs */
		c->pad_t = w->pb[1];
		c->pad_l = w->pb[2];
	} else if (!plan_padded(c, p, planar_in) && c->kh == 1 && c->kw == 1 && w->s[1] == 1 && w->s[2] == 1 && c->out_w % 14 != 0 &&
	           c->out_h * c->out_w <= 1024) {
		/* rows too short for whole tiles (7 x 7): all positions in one row, tiles running across the
		 * rows (larger images keep their rows, along which the groups share the input) */
		c->out_w = c->in_w = c->x_w = c->out_h * c->out_w;
		c->out_h = c->in_h = c->x_h = 1;
	}
	if (z && (z->dtype != TERN_FLOAT || z->rank != 5 || memcmp(z->dims, dims, sizeof dims) != 0)) {
		bconv_free(c);
		char s[128];
		return tern_node_errorf(node, TERN_EDATA, "input 3 (residual) %s must have the output's blocked shape",
		                        tern_shape_str(z->dtype, z->rank, z->dims, s, sizeof s));
	}
	if (!wt->data || (b && !b->data)) {
		/* the shapes are known (type inference leaves out the values of large constants); running
		 * needs the weights when planning */
		bconv_free(c);
		p->kernel = unpacked_kernel;
		return TERN_OK;
	}
	size_t wn = wino ? 0 : (size_t)(c->ocb * (depthwise ? 1 : c->icb * BLK) * c->kh * c->kw * BLK);
	c->wt = wino ? NULL : tern_aligned_alloc(wn * sizeof *c->wt);
	c->bias = tern_aligned_alloc((size_t)(c->ocb * BLK) * sizeof *c->bias);
	if ((!wino && !c->wt) || !c->bias) {
		bconv_free(c);
		return no_memory(node);
	}
	const float *src = wt->data;
	int64_t kk = c->kh * c->kw;
	for (int64_t o = 0; b && o < m; o++)
		c->bias[o] = ((const float *)b->data)[o];
	c->row = row_fn(c);
	if (wino) {
		if ((st = wino_plan(c, p, src, m, ch))) {
			bconv_free(c);
			return st;
		}
	} else {
		for (int64_t o = 0; o < m; o++)
			for (int64_t i = 0; i < ch; i++)
				for (int64_t t = 0; t < kk; t++) {
					int64_t at = depthwise ? (o / BLK * kk + t) * BLK + o % BLK
					                       : (((o / BLK * c->icb + i / BLK) * kk + t) * BLK + i % BLK) * BLK +
					                                 o % BLK;
					c->wt[at] = src[(o * ch + i) * kk + t];
				}
		/* the weights of all channel groups fit the second-level cache: walk the rows outside, so
		 * that each input row is read from the cache for every group */
		c->rows_outer = !depthwise && wn * sizeof(float) <= (size_t)tern_l2_bytes() / 2;
	}
	/* weights mapped from external data are in the blocks now: their pages can go, as tern_pack_a's */
	tern_mapped_release(src, (size_t)(m * ch * kk) * sizeof *src);
	p->params = c;
	p->free_params = bconv_free;
	p->kernel = wino ? wino_kernel : bconv_kernel;
	p->packed_inputs = 1u << 1 | (b ? 1u << 2 : 0);
	return TERN_OK;
}

/* tern.BlockedMaxPool: MaxPool (2-D, one output) of a blocked tensor, with MaxPool's attributes;
 * tern.BlockedAveragePool: AveragePool's (ceil_mode 0). */
static tern_status bpool_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	bool avg = strcmp(node->op_type, "BlockedAveragePool") == 0;
	tern_status st = check_blocked(node, x, 0);
	if (st)
		return st;
	if (p->n_out > 1)
		return tern_node_errorf(node, TERN_EDATA, "the indices output is not computed on blocked tensors");
	if (avg && tern_attr_int(node, "ceil_mode", 0))
		return tern_node_errorf(node, TERN_EDATA, "attribute 'ceil_mode' must be 0 on blocked tensors");
	tern_tensor planar =
	        tern_nn_shape_only(TERN_FLOAT, 4, (int64_t[]){x->dims[0], x->dims[1] * BLK, x->dims[2], x->dims[3]});
	bconv *c = calloc(1, sizeof *c);
	if (!c)
		return no_memory(node);
	if ((st = tern_nn_window_read(node, &planar, NULL, &c->w)) ||
	    (st = tern_nn_window_forward(node, &c->w, tern_attr_int(node, "ceil_mode", 0) != 0))) {
		bconv_free(c);
		return st;
	}
	const window *w = &c->w;
	c->pool = true;
	c->avg = avg;
	c->include_pad = tern_attr_int(node, "count_include_pad", 0) != 0;
	c->n = x->dims[0];
	c->icb = c->ocb = c->groups = x->dims[1];
	c->lanes = BLK;
	c->kh = w->k[1];
	c->kw = w->k[2];
	c->x_h = c->in_h = x->dims[2];
	c->x_w = c->in_w = x->dims[3];
	c->out_h = w->out[1];
	c->out_w = w->out[2];
	c->pad_t = w->pb[1]; /* read in place, the edges' windows cut to the input */
	c->pad_l = w->pb[2];
	tern_tensor *y = p->out[0];
	y->dtype = TERN_FLOAT;
	y->rank = 5;
	int64_t dims[5] = {c->n, c->ocb, c->out_h, c->out_w, BLK};
	memcpy(y->dims, dims, sizeof dims);
	c->row = row_fn(c);
	p->params = c;
	p->free_params = bconv_free;
	p->kernel = bconv_kernel;
	return TERN_OK;
}

static const tern_op ops[] = {
	{"tern", "ToBlocks", 1, 0, to_blocks_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "FromBlocks", 1, 0, from_blocks_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "BlockedConv", 1, 0, bconv_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "BlockedGlobalAveragePool", 1, 0, gap_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "BlockedScale", 1, 0, scale_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "BlockedMaxPool", 1, 0, bpool_prepare, TERN_DT(FLOAT), "blocked"},
	{"tern", "BlockedAveragePool", 1, 0, bpool_prepare, TERN_DT(FLOAT), "blocked"},
};

const tern_op_table tern_ops_blocked = {ops, TERN_ARRAY_LEN(ops)};
