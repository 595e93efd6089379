/* conv.c — convolutions: Conv (and tern.FusedConv's one-pass form), ConvInteger, QLinearConv, DeformConv,
 * ConvTranspose and Col2Im. Convolution multiplies weights packed when planning with its column matrix
 * read in place from stride-phase planes of the padded input (3-D: made block by block; weights not
 * known: im2col + the shared gemm); depthwise convolution of float planes goes by blocks of channels
 * (the engine in nn_common.c) or plane by plane in vectors; ConvTranspose is a product and col2im.
 * Kernels exist for float and double, the integer forms accumulate in int32; float16 and bfloat16 are
 * computed in float. */
#include "ops/nn.h"

#include <stdatomic.h>

/* padded positions of the largest depthwise plane with unit strides done by channel blocks */
#define DW_BLOCKS_MAX_PLANE (60 * 60)

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
	/* tern.ConvGradInput and tern.ConvGradWeight: slots of scratch when the images are shared among
	 * threads (products too small to split, see by_images), else 0 */
	int64_t img_slots;
	size_t img_elems; /* scratch elements per slot */
	/* Conv: float weights not known when planning, packed at each call; with img_slots, the images
	 * shared among threads, fwd_bytes of scratch per slot */
	bool pack_runtime;
	size_t fwd_bytes;
	bool unit_groups; /* Conv: img_slots share out (image, group) pairs rather than images */
	bool gw_phases; /* the gradients: the column matrix made from (im2col) or summed into (col2im) phase planes */
	/* tern.ConvGradWeight, float: images per product, their positions side by side in K (so that
	 * small images make one product with a useful depth, not many with K = out_sp), and per row of
	 * that K (image, position) where it lies in the batch's column matrices, or in X when pointwise */
	int64_t gw_batch;
	int64_t *gw_rows;
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
		free(cp->gw_rows);
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
		/* a small plane is zeroed whole, in one call, rather than by two tiny ones per row */
		bool rows = borders && cp->hq * wq > 4096;
		if (borders && !rows)
			memset(plane, 0, (size_t)(cp->hq * wq) * sizeof *plane);
		else if (borders) {
			memset(plane, 0, (size_t)(ilo * wq) * sizeof *plane);
			memset(plane + ihi * wq, 0, (size_t)((cp->hq - ihi) * wq) * sizeof *plane);
		}
		for (int64_t i = ilo; i < ihi; i++) {
			float *dst = plane + i * wq;
			const float *restrict src = xc + (r0 + i * s1) * in2 + c0;
			if (rows) {
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

/* One group of one image through the packed weights pk, its column matrix read in place; z is the
 * fused residual's group (NULL: none); scratch: the phase planes, then the grid. */
static void conv_direct(tern_threadpool *pool, const conv_params *cp, const tern_packed *pk, void *scratch,
                        const float *x, const float *bias, float *y, const float *z)
{
	const window *w = &cp->w;
	const float *planes = x;
	const tern_act *act = cp->fused ? &cp->act : NULL;
	if (cp->split) {
		phase_ctx pc = {cp, x, scratch};
		parallel_range(pool, cp->cg, grain_for(cp->n_phases * cp->hq * cp->wq), phase_planes, &pc);
		planes = scratch;
	}
	if (cp->kind == TERN_GEMM_COLS) {
		tern_gemm_b b = {planes, cp->row_off, 0, w->out[2], cp->wq, 1};
		tern_gemm_c c = {y, cp->out_sp, false, false, bias, act, z};
		tern_gemm_packed_run(pool, pk, cp->out_sp, &b, &c, TERN_GEMM_COLS);
		return;
	}
	bool gaps = cp->wq != w->out[2];
	float *grid = gaps ? (float *)((char *)scratch + cp->grid_off) : y;
	tern_gemm_b b = {planes, cp->row_off, 0, cp->grid_n, cp->grid_n, 1};
	tern_gemm_c c = {grid, gaps ? cp->grid_n : cp->out_sp, false, false, bias, gaps ? NULL : act, z};
	tern_gemm_packed_run(pool, pk, cp->grid_n, &b, &c, TERN_GEMM_ROWS);
	if (gaps) {
		grid_ctx gc = {cp, grid, y, z};
		parallel_range(pool, cp->mg, grain_for(cp->out_sp), grid_copy, &gc);
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
#define DW512 __attribute__((target("avx512f")))

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

/* One call of a convolution that is not depthwise: the weights packed per group (when planning, or
 * for this call; NULL: double, through im2col and the shared gemm), the tensors, and the scratch. */
typedef struct conv_run {
	const conv_params *cp;
	tern_packed *const *pk;
	int dtype;
	const char *x, *wt;
	const char *bias;
	char *y, *scratch;
	const float *z;
} conv_run;

/* Group g of image n, with the pool given (NULL: on this thread) and scratch for one group. */
static void conv_group(tern_threadpool *pool, const conv_run *r, char *scratch, int64_t n, int64_t g)
{
	const conv_params *cp = r->cp;
	size_t es = compute_size(r->dtype);
	int64_t ck = cp->cg * cp->kk;
	int64_t y0 = (n * cp->cout + g * cp->mg) * cp->out_sp;
	const char *xg = r->x + (size_t)((n * cp->cin + g * cp->cg) * cp->in_sp) * es;
	char *yg = r->y + (size_t)y0 * es;
	const void *bg = r->bias ? r->bias + (size_t)(g * cp->mg) * es : NULL;
	const float *zg = r->z ? r->z + y0 : NULL;
	if (r->pk && cp->direct) {
		conv_direct(pool, cp, r->pk[g], scratch, (const float *)xg, bg, (float *)yg, zg);
		return;
	}
	if (r->pk && cp->pointwise) {
		tern_gemm_b b = {(const float *)xg, NULL, cp->out_sp, cp->out_sp, cp->out_sp, 1};
		tern_gemm_c c = {(float *)yg, cp->out_sp, false, false, bg, cp->fused ? &cp->act : NULL, zg};
		tern_gemm_packed_run(pool, r->pk[g], cp->out_sp, &b, &c, TERN_GEMM_AUTO);
		return;
	}
	if (r->pk) {
		conv_fill_ctx f = {cp, (const float *)xg};
		tern_gemm_packed_fill(pool, r->pk[g], cp->out_sp, conv_fill, &f, bg, (float *)yg, cp->out_sp);
		return;
	}
	const void *col = xg;
	if (!cp->pointwise) {
		im2col(pool, &cp->w, es, cp->cg, xg, scratch);
		col = scratch;
	}
	gemm_typed(r->dtype, false, cp->mg, cp->out_sp, ck, r->wt + (size_t)(g * cp->mg * ck) * es, ck, col, cp->out_sp, yg);
	if (bg)
		add_bias_rows(r->dtype, yg, bg, cp->mg, cp->out_sp);
}

/* Images [begin, end), group by group, with the pool given (NULL: on this thread). */
static void conv_images(tern_threadpool *pool, const conv_run *r, char *scratch, int64_t begin, int64_t end)
{
	for (int64_t n = begin; n < end; n++)
		for (int64_t g = 0; g < r->cp->group; g++)
			conv_group(pool, r, scratch, n, g);
}

/* Units [begin, end) on one thread with its slot's scratch: images, or with unit_groups (image, group)
 * pairs. */
static void conv_units_slot(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	const conv_run *r = ctx;
	char *scratch = r->scratch + (size_t)slot * r->cp->fwd_bytes;
	if (!r->cp->unit_groups) {
		conv_images(NULL, r, scratch, begin, end);
		return;
	}
	for (int64_t t = begin; t < end; t++)
		conv_group(NULL, r, scratch, t / r->cp->group, t % r->cp->group);
}

/* Float weights not known when planning, packed per group for one call (NULL when out of memory). */
static tern_packed **pack_now(const conv_params *cp, const float *wt, int64_t m, int64_t k, bool trans)
{
	tern_packed **pk = calloc((size_t)cp->group, sizeof *pk);
	for (int64_t g = 0; pk && g < cp->group; g++)
		if (!(pk[g] = tern_pack_a(m, k, wt + g * m * k, trans ? m : k, trans, 1.0f))) {
			for (int64_t i = 0; i < g; i++)
				tern_packed_free(pk[i]);
			free(pk);
			return NULL;
		}
	return pk;
}

static void free_packs(const conv_params *cp, tern_packed **pk)
{
	for (int64_t g = 0; pk && g < cp->group; g++)
		tern_packed_free(pk[g]);
	free(pk);
}

static tern_status conv_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
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
			tern_nn_wb_run(a->pool, &j, cp->slots);
		} else if (cp->dw_grid)
			parallel_slots(a->pool, cp->n * cp->cin, grain_for(cp->mg * cp->out_sp * cp->kk), cp->slots,
			               depthwise_grid, &c);
		else
			parallel_range(a->pool, cp->n * cp->cout, grain, dtype == TERN_DOUBLE ? depthwise_planes_f64 : depthwise_planes_f32,
			               &c);
		return conv_act_pass(a, cp, z);
	}
	tern_packed **now = NULL;
	if (cp->pack_runtime && dtype == TERN_FLOAT &&
	    !(now = pack_now(cp, (const float *)wt, cp->mg, cp->cg * cp->kk, false)))
		return no_memory(a->node);
	conv_run r = {cp, now ? now : dtype == TERN_FLOAT ? cp->packed : NULL, dtype, x, wt, bias, y, a->scratch, z};
	if (cp->img_slots) {
		int64_t per_group = cp->mg * cp->cg * cp->kk * cp->out_sp;
		if (cp->unit_groups)
			parallel_slots(a->pool, cp->n * cp->group, grain_for(per_group), cp->img_slots, conv_units_slot, &r);
		else
			parallel_slots(a->pool, cp->n, grain_for(cp->group * per_group), cp->img_slots, conv_units_slot, &r);
	} else
		conv_images(a->pool, &r, a->scratch, 0, cp->n);
	free_packs(cp, now);
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
	if ((st = tern_nn_window_read(node, x, wt->dims + 2, &cp->w)) ||
	    (st = tern_nn_window_forward(node, &cp->w, false)))
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

/* Below this many multiply-adds per group and image, the product of one image is not shared among
 * threads (tern_gemm_packed_run's threshold) nor is its im2col or col2im, so a convolution and its
 * gradients share out the images instead: each slot has its own scratch (and, for the weight
 * gradient, its own partial sum, reduced at the end). A small CNN's 3x3 convolutions of 8 channels
 * on 8x8 images at batch 64 are some 37,000 per image. */
#define BY_IMAGES_MAX_WORK ((int64_t)1 << 16)

/* Slots of scratch for sharing out the images (0: not worth it, or one thread). On a team of guests
 * (asynchronous eager) always: its guest comes and goes, and whole images are what it can take
 * without a wait of the thread that posted them on each product's parts. */
static int64_t by_images(tern_threadpool *pool, const conv_params *cp)
{
	if (!pool || tern_threadpool_size(pool) < 2 || cp->n < 2 ||
	    (!tern_threadpool_guests(pool) && cp->mg * cp->cg * cp->kk * cp->out_sp >= BY_IMAGES_MAX_WORK))
		return 0;
	int64_t slots = slots_for(pool);
	return slots < cp->n ? slots : cp->n;
}

/* Slots of scratch for sharing out the groups of a grouped convolution (0: too few groups to keep
 * every thread busy, or one thread): a group's product is small (RegNet's have 8 channels), and
 * sharing out each in turn cost two synchronisations a group, which made regnet_y_400mf's grouped
 * convolutions slower on two threads than on one. */
static int64_t by_groups(tern_threadpool *pool, const conv_params *cp)
{
	int64_t threads = pool ? tern_threadpool_size(pool) : 1, units = cp->n * cp->group;
	if (threads < 2 || cp->group < 2 || (units < 2 * threads && units != threads))
		return 0;
	int64_t slots = slots_for(pool);
	return slots < units ? slots : units;
}

/* Conv's kernel, and its scratch for one image (p->scratch_bytes) made room for per slot when the
 * images or the groups are shared out. */
static tern_status conv_finish(tern_prepare_args *p, conv_params *cp)
{
	if (!cp->depthwise && !(cp->img_slots = by_images(p->pool, cp)) && (cp->img_slots = by_groups(p->pool, cp)))
		cp->unit_groups = true;
	if (cp->img_slots) {
		cp->fwd_bytes = round_up(p->scratch_bytes);
		p->scratch_bytes = (size_t)cp->img_slots * cp->fwd_bytes;
	}
	p->kernel = conv_kernel;
	return tern_nn_stage_halves(p);
}

/* The product's kernel and scratch for a 1-D or 2-D convolution with packed weights (packed when
 * planning, or, with pack_runtime, at each call: then a zero matrix of their shape picks the kernel). */
static tern_status conv_direct_setup(tern_prepare_args *p, conv_params *cp)
{
	tern_status st = phase_setup(p->node, cp, cp->cg, false);
	if (st)
		return st;
	const window *w = &cp->w;
	cp->direct = true;
	tern_packed *shape = NULL;
	if (!cp->packed) {
		float *zeros = calloc((size_t)(cp->mg * cp->cg * cp->kk) + 1, sizeof *zeros);
		shape = zeros ? tern_pack_a(cp->mg, cp->cg * cp->kk, zeros, cp->cg * cp->kk, false, 1.0f) : NULL;
		free(zeros);
		if (!shape)
			return no_memory(p->node);
	}
	cp->kind = tern_gemm_choose(cp->packed ? cp->packed[0] : shape, cp->grid_n, w->out[1], w->out[2], false, 0);
	tern_packed_free(shape);
	size_t planes = cp->split ? round_up((size_t)(cp->cg * cp->n_phases * cp->hq * cp->wq) * sizeof(float)) : 0;
	cp->grid_off = planes;
	bool gaps = cp->kind == TERN_GEMM_ROWS && cp->wq != w->out[2];
	p->scratch_bytes = planes + (gaps ? (size_t)(cp->mg * cp->grid_n) * sizeof(float) : 0);
	return conv_finish(p, cp);
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
	cp->dw_blocks = cp->dw_grid && cp->mg == 1 && tern_nn_wb_plan(w, &cp->band, &cp->slot_elems) &&
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
	if (cp->packed && x->dtype == TERN_FLOAT)
		p->packed_inputs |= 1u << 1; /* conv_images reads only the packed groups */
	/* weights computed in float but not known: packed at each call, for the same kernels */
	cp->pack_runtime = !cp->depthwise && !cp->packed && x->dtype != TERN_DOUBLE;
	bool packed = cp->packed || cp->pack_runtime;
	if (packed && !cp->pointwise && w->k[0] == 1 && w->in[0] == 1)
		return conv_direct_setup(p, cp);
	if (packed && !cp->pointwise) {
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
	if (!cp->pointwise && !cp->depthwise && !packed)
		p->scratch_bytes = (size_t)(cp->cg * cp->kk * cp->out_sp) * compute_size(x->dtype);
	return conv_finish(p, cp);
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
		p->packed_inputs = 0;
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
	return tern_nn_stage_halves(p);
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

/* ConvTranspose's geometry for X and kernel dimensions `kernel`: read as a convolution over X, then
 * turned around: the image (w->in) is the output, whose spatial dimensions go to ydims, and X's
 * positions are w->out. Pads come out resolved (auto_pad, output_shape). */
static tern_status conv_transpose_window(const tern_node *node, const tern_tensor *x, const int64_t *kernel, window *w,
                                         int64_t *ydims)
{
	tern_status st;
	if ((st = tern_nn_window_read(node, x, kernel, w)))
		return st;
	int nsp = w->nsp;
	int64_t opad[SP] = {0, 0, 0}, oshape[SP] = {0, 0, 0};
	if ((st = tern_nn_read_ints(node, "output_padding", nsp, 1, 0, opad, NULL)))
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
		ydims[i - (SP - nsp)] = out;
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
	window *w = &cp->w;
	int64_t dims[TERN_MAX_RANK] = {cp->n, cp->cout};
	if ((st = conv_transpose_window(node, x, wt->dims + 2, w, dims + 2)))
		return st;
	cp->kk = sp_numel(w->k);
	cp->in_sp = sp_numel(w->in);
	cp->out_sp = sp_numel(w->out);
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	p->scratch_bytes = (size_t)(cp->mg * cp->kk * cp->out_sp) * compute_size(x->dtype);
	if ((st = pack_groups(node, cp, wt, cp->mg * cp->kk, cp->cg, true)))
		return st;
	p->kernel = conv_transpose_kernel;
	return tern_nn_stage_halves(p);
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
	if ((st = tern_nn_read_ints(node, "strides", nsp, 1, 1, w->s, NULL)) ||
	    (st = tern_nn_read_ints(node, "dilations", nsp, 1, 1, w->d, NULL)) ||
	    (st = tern_nn_read_ints(node, "pads", nsp, 2, 0, w->pb, w->pe)))
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
	return tern_nn_stage_halves(p);
}

/* ---------------------------------------------------------------- gradients */

/* Per tap of the last slot, the outputs [lo, hi) it reaches inside the input (the depthwise loops'). */
static tern_status depthwise_rows(const tern_node *node, conv_params *cp)
{
	const window *w = &cp->w;
	if (!(cp->rows2 = malloc(2 * (size_t)w->k[2] * sizeof *cp->rows2)))
		return no_memory(node);
	for (int64_t k = 0; k < w->k[2]; k++)
		outputs_within(k * w->d[2] - w->pb[2], w->s[2], w->in[2], w->out[2], &cp->rows2[2 * k], &cp->rows2[2 * k + 1]);
	return TERN_OK;
}

/* Depthwise backward, the forward's loops turned around. The data gradient, plane (n, c) by plane:
 * every output row of every channel m that reads c adds weight * its dY row into the input row under
 * each tap. The weight gradient, channel m by channel: per tap, the sum over images and output rows
 * of dY row . the input row under the tap. (ctx: x = dY and y = dX, or x = X, wt = dY and y = dW.) */
#define DEF_DW_GRAD(S, T)                                                                                       \
	TERN_ISA_BODY void dw_grad_input_##S##_body(void *ctx, int64_t begin, int64_t end)                          \
	{                                                                                                           \
		const conv_ctx *c = ctx;                                                                                \
		const conv_params *cp = c->cp;                                                                          \
		const window *w = &cp->w;                                                                               \
		for (int64_t plane = begin; plane < end; plane++) {                                                     \
			int64_t n = plane / cp->cin, ch = plane % cp->cin;                                                  \
			T *dx = (T *)c->y + plane * cp->in_sp;                                                              \
			memset(dx, 0, (size_t)cp->in_sp * sizeof *dx);                                                      \
			for (int64_t m = ch * cp->mg; m < (ch + 1) * cp->mg; m++) {                                         \
				const T *dy = (const T *)c->x + (n * cp->cout + m) * cp->out_sp;                                \
				const T *wk = (const T *)c->wt + m * cp->kk;                                                    \
				for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                    \
					int64_t s0 = o0 * w->s[0] - w->pb[0], l0, h0;                                               \
					taps_within(s0, w->k[0], w->d[0], 0, w->in[0], &l0, &h0);                                   \
					for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                \
						int64_t s1 = o1 * w->s[1] - w->pb[1], l1, h1;                                           \
						taps_within(s1, w->k[1], w->d[1], 0, w->in[1], &l1, &h1);                               \
						const T *restrict dyrow = dy + (o0 * w->out[1] + o1) * w->out[2];                       \
						for (int64_t k0 = l0; k0 < h0; k0++)                                                    \
							for (int64_t k1 = l1; k1 < h1; k1++) {                                              \
								T *xrow = dx + ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * w->in[2]; \
								for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                      \
									T wv = wk[(k0 * w->k[1] + k1) * w->k[2] + k2];                              \
									int64_t lo = cp->rows2[2 * k2], hi = cp->rows2[2 * k2 + 1];                 \
									T *restrict xs = xrow + k2 * w->d[2] - w->pb[2];                            \
									if (w->s[2] == 1)                                                           \
										for (int64_t o2 = lo; o2 < hi; o2++)                                    \
											xs[o2] += wv * dyrow[o2];                                           \
									else                                                                        \
										for (int64_t o2 = lo; o2 < hi; o2++)                                    \
											xs[o2 * w->s[2]] += wv * dyrow[o2];                                 \
								}                                                                               \
							}                                                                                   \
					}                                                                                           \
				}                                                                                               \
			}                                                                                                   \
		}                                                                                                       \
	}                                                                                                           \
	TERN_ISA_VARIANTS3(void, dw_grad_input_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))     \
	TERN_ISA_BODY void dw_grad_weight_##S##_body(void *ctx, int64_t begin, int64_t end)                         \
	{                                                                                                           \
		const conv_ctx *c = ctx;                                                                                \
		const conv_params *cp = c->cp;                                                                          \
		const window *w = &cp->w;                                                                               \
		for (int64_t m = begin; m < end; m++) {                                                                 \
			int64_t ch = m / cp->mg;                                                                            \
			for (int64_t t = 0; t < cp->kk; t++) {                                                              \
				int64_t k0 = t / (w->k[1] * w->k[2]), k1 = t / w->k[2] % w->k[1], k2 = t % w->k[2];             \
				int64_t lo = cp->rows2[2 * k2], hi = cp->rows2[2 * k2 + 1];                                     \
				double acc = 0;                                                                                 \
				for (int64_t n = 0; n < cp->n; n++) {                                                           \
					const T *x = (const T *)c->x + (n * cp->cin + ch) * cp->in_sp;                              \
					const T *dy = (const T *)c->wt + (n * cp->cout + m) * cp->out_sp;                           \
					for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                \
						int64_t i0 = o0 * w->s[0] - w->pb[0] + k0 * w->d[0];                                    \
						if (i0 < 0 || i0 >= w->in[0])                                                           \
							continue;                                                                           \
						for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                            \
							int64_t i1 = o1 * w->s[1] - w->pb[1] + k1 * w->d[1];                                \
							if (i1 < 0 || i1 >= w->in[1])                                                       \
								continue;                                                                       \
							const T *restrict dyrow = dy + (o0 * w->out[1] + o1) * w->out[2];                   \
							const T *restrict xs = x + (i0 * w->in[1] + i1) * w->in[2] + k2 * w->d[2] - w->pb[2]; \
							T part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0;                                     \
							int64_t o2 = lo;                                                                    \
							if (w->s[2] == 1)                                                                   \
								for (; o2 + 8 <= hi; o2 += 8)                                                   \
									for (int l = 0; l < 8; l++)                                                 \
										part[l] += dyrow[o2 + l] * xs[o2 + l];                                  \
							for (; o2 < hi; o2++)                                                               \
								tail += dyrow[o2] * xs[o2 * w->s[2]];                                           \
							for (int l = 0; l < 4; l++)                                                         \
								part[l] += part[l + 4];                                                         \
							acc += (double)(part[0] + part[2]) + (double)(part[1] + part[3]) + tail;            \
						}                                                                                       \
					}                                                                                           \
				}                                                                                               \
				((T *)c->y)[m * cp->kk + t] = (T)acc;                                                           \
			}                                                                                                   \
		}                                                                                                       \
	}                                                                                                           \
	TERN_ISA_VARIANTS3(void, dw_grad_weight_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_DW_GRAD(f32, float)
DEF_DW_GRAD(f64, double)

/* col2im for a float 1-D or 2-D convolution through its phase planes (cp->gw_phases): each column
 * row is added onto its plane shifted by row_off, output row by output row with no bounds to test
 * (into planes, zeroed first, past the column matrix in its buffer; without padding or strides the
 * image is its own plane), then every padded position of a plane that lies inside the image is
 * copied to it. Padded positions no tap reads get nothing: dX is zero there. */
TERN_ISA_BODY void rows_to_planes_body(const conv_params *cp, const float *col, float *planes)
{
	int64_t o1n = cp->w.out[1], o2n = cp->w.out[2], wq = cp->wq;
	for (int64_t r = 0; r < cp->cg * cp->kk; r++) {
		float *restrict dst = planes + cp->row_off[r];
		const float *restrict src = col + r * cp->out_sp;
		for (int64_t o1 = 0; o1 < o1n; o1++)
			for (int64_t o2 = 0; o2 < o2n; o2++)
				dst[o1 * wq + o2] += src[o1 * o2n + o2];
	}
}
TERN_ISA_VARIANTS3(void, rows_to_planes, (const conv_params *cp, const float *col, float *planes), (cp, col, planes))

static void col2im_phases(const conv_params *cp, const float *col, float *img)
{
	const window *w = &cp->w;
	int64_t plane = cp->hq * cp->wq;
	if (!cp->split) {
		memset(img, 0, (size_t)(cp->cg * cp->in_sp) * sizeof *img);
		rows_to_planes(cp, col, img);
		return;
	}
	float *planes = (float *)col + cp->cg * cp->kk * cp->out_sp;
	memset(planes, 0, (size_t)(cp->cg * cp->n_phases * plane) * sizeof *planes);
	rows_to_planes(cp, col, planes);
	if (cp->n_phases < w->s[1] * w->s[2])
		memset(img, 0, (size_t)(cp->cg * cp->in_sp) * sizeof *img);
	int64_t s1 = w->s[1], s2 = w->s[2], in2 = w->in[2];
	for (int64_t ch = 0; ch < cp->cg; ch++)
		for (int64_t q = 0; q < cp->n_phases; q++) {
			const float *pl = planes + (ch * cp->n_phases + q) * plane;
			float *xc = img + ch * cp->in_sp;
			int64_t r0 = cp->phases[2 * q] - w->pb[1], c0 = cp->phases[2 * q + 1] - w->pb[2], lo, hi, ilo, ihi;
			outputs_within(r0, s1, w->in[1], cp->hq, &ilo, &ihi);
			outputs_within(c0, s2, in2, cp->wq, &lo, &hi);
			for (int64_t i = ilo; i < ihi; i++) {
				float *dst = xc + (r0 + i * s1) * in2 + c0;
				const float *src = pl + i * cp->wq;
				if (s2 == 1)
					memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *dst);
				else
					for (int64_t j = lo; j < hi; j++)
						dst[j * s2] = src[j];
			}
		}
}

/* Images [begin, end) of the data gradient, group by group: columns W_g^T dY_g, summed back onto the
 * image by col2im (a pointwise convolution's columns are dX itself). pk[g]: W_g^T packed (float). */
static void grad_input_images(tern_threadpool *pool, const conv_params *cp, int dtype, tern_packed *const *pk,
                              const char *dy, const char *wt, char *dx, void *col_buf, int64_t begin, int64_t end)
{
	size_t es = compute_size(dtype);
	int64_t ck = cp->cg * cp->kk;
	for (int64_t n = begin; n < end; n++)
		for (int64_t g = 0; g < cp->group; g++) {
			const char *wg = wt + (size_t)(g * cp->mg * ck) * es;
			const char *dyg = dy + (size_t)((n * cp->cout + g * cp->mg) * cp->out_sp) * es;
			char *dxg = dx + (size_t)((n * cp->cin + g * cp->cg) * cp->in_sp) * es;
			void *col = cp->pointwise ? (void *)dxg : col_buf;
			if (dtype == TERN_FLOAT)
				tern_gemm_packed(pool, pk[g], cp->out_sp, (const float *)dyg, cp->out_sp, NULL, col, cp->out_sp);
			else
				tern_gemm_f64(true, false, ck, cp->out_sp, cp->mg, 1.0, (const double *)wg, ck, (const double *)dyg,
				              cp->out_sp, 0.0, col, cp->out_sp);
			if (cp->gw_phases)
				col2im_phases(cp, col, (float *)dxg);
			else if (!cp->pointwise)
				col2im(pool, dtype, &cp->w, cp->cg, col, dxg);
		}
}

typedef struct grad_images_ctx {
	const conv_params *cp;
	int dtype;
	tern_packed *const *pk;
	const char *a, *b; /* dY and W, or dY and X */
	char *y, *scratch;  /* dX, or the slots' partial sums of dW */
	atomic_int status;
} grad_images_ctx;

static void grad_input_slot(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	grad_images_ctx *c = ctx;
	const conv_params *cp = c->cp;
	void *col = c->scratch + (size_t)(slot * (int64_t)cp->img_elems) * compute_size(c->dtype);
	grad_input_images(NULL, cp, c->dtype, c->pk, c->a, c->b, c->y, col, begin, end);
}

/* tern.ConvGradInput(dY, W, x_shape) -> dX, with Conv's attributes: the data gradient of Conv, a
 * transposed convolution. Per image and group the columns W_g^T dY_g (W_g^T packed), summed back
 * onto the input by col2im; a pointwise convolution's columns are dX itself; depthwise directly.
 * Small products go image by image on the threads, larger ones split each product. */
static tern_status conv_grad_input_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	const char *dy = a->in[0]->data, *wt = a->in[1]->data;
	char *dx = a->out[0]->data;
	if (cp->depthwise) {
		conv_ctx c = {cp, dy, wt, NULL, dx, NULL, NULL};
		parallel_range(a->pool, cp->n * cp->cin, grain_for(cp->mg * cp->out_sp * cp->kk),
		               dtype == TERN_DOUBLE ? dw_grad_input_f64 : dw_grad_input_f32, &c);
		return TERN_OK;
	}
	int64_t ck = cp->cg * cp->kk;
	tern_packed **pk = NULL;
	tern_status st = TERN_OK;
	if (dtype == TERN_FLOAT && !(pk = cp->packed)) {
		if (!(pk = calloc((size_t)cp->group, sizeof *pk)))
			return no_memory(a->node);
		for (int64_t g = 0; g < cp->group && !st; g++)
			if (!(pk[g] = tern_pack_a(ck, cp->mg, (const float *)(wt + (size_t)(g * cp->mg * ck) * es), ck, true, 1.0f)))
				st = no_memory(a->node);
	}
	if (!st) {
		if (cp->img_slots) {
			grad_images_ctx c = {cp, dtype, pk, dy, wt, dx, a->scratch, 0};
			parallel_slots(a->pool, cp->n, grain_for(cp->group * cp->mg * ck * cp->out_sp), cp->img_slots,
			               grad_input_slot, &c);
		} else {
			grad_input_images(a->pool, cp, dtype, pk, dy, wt, dx, a->scratch, 0, cp->n);
		}
	}
	if (pk && !cp->packed) {
		for (int64_t g = 0; g < cp->group; g++)
			tern_packed_free(pk[g]);
		free(pk);
	}
	return st;
}

static tern_status conv_grad_input_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *dy = p->in[0], *wt = p->in[1];
	int rank = 0;
	int64_t dims[TERN_MAX_RANK];
	bool ready;
	tern_status st = check_real_same(p, 2);
	if (st || (st = tern_nn_shape_input(p, 2, &rank, dims, &ready)) || !ready)
		return st;
	tern_tensor x = tern_nn_shape_only(dy->dtype, rank, dims);
	conv_params *cp = NULL;
	if ((st = conv_setup(p, &x, wt, 1, &cp)) || (st = tern_nn_check_dy(p)))
		return st;
	tern_set_shape(p->out[0], dy->dtype, rank, dims);
	cp->depthwise = cp->cg == 1 && !cp->pointwise && cp->group > 1; /* as ConvGradWeight's */
	if (cp->depthwise) {
		if ((st = depthwise_rows(node, cp)))
			return st;
	} else {
		if ((st = pack_groups(node, cp, wt, cp->cg * cp->kk, cp->mg, true)))
			return st;
		cp->img_slots = by_images(p->pool, cp);
		cp->img_elems = cp->pointwise ? 0 : (size_t)(cp->cg * cp->kk * cp->out_sp);
		/* float 1-D and 2-D: col2im through phase planes (after the column matrix in the scratch) */
		cp->gw_phases = !cp->pointwise && dy->dtype != TERN_DOUBLE && cp->w.k[0] == 1 && cp->w.in[0] == 1;
		if (cp->gw_phases) {
			if ((st = phase_setup(node, cp, cp->cg, false)))
				return st;
			if (cp->split)
				cp->img_elems += (size_t)(cp->cg * cp->n_phases * cp->hq * cp->wq);
		}
		p->scratch_bytes = (size_t)(cp->img_slots ? cp->img_slots : 1) * cp->img_elems * compute_size(dy->dtype);
	}
	p->kernel = conv_grad_input_kernel;
	return tern_nn_stage_halves(p);
}

/* Rows [begin, end) of a float 1-D or 2-D column matrix (cg * kk rows of out_sp) through the phase
 * planes: each row is its plane shifted by row_off, read output row by output row with no bounds to
 * test. */
TERN_ISA_BODY void col_rows_body(const conv_params *cp, const float *planes, float *col, int64_t begin, int64_t end)
{
	int64_t o1n = cp->w.out[1], o2n = cp->w.out[2], wq = cp->wq;
	for (int64_t r = begin; r < end; r++) {
		const float *restrict src = planes + cp->row_off[r];
		float *restrict dst = col + r * cp->out_sp;
		for (int64_t o1 = 0; o1 < o1n; o1++)
			for (int64_t o2 = 0; o2 < o2n; o2++)
				dst[o1 * o2n + o2] = src[o1 * wq + o2];
	}
}
TERN_ISA_VARIANTS3(void, col_rows, (const conv_params *cp, const float *planes, float *col, int64_t begin, int64_t end),
                   (cp, planes, col, begin, end))

typedef struct col_rows_ctx {
	const conv_params *cp;
	const float *planes;
	float *col;
} col_rows_ctx;

static void col_rows_range(void *ctx, int64_t begin, int64_t end)
{
	const col_rows_ctx *c = ctx;
	col_rows(c->cp, c->planes, c->col, begin, end);
}

/* buf: room for the phase planes when cp->split */
static void col_from_phases(tern_threadpool *pool, const conv_params *cp, const float *x, float *col, float *buf)
{
	const float *planes = x;
	if (cp->split) {
		phase_ctx pc = {cp, x, buf};
		parallel_range(pool, cp->cg, grain_for(cp->n_phases * cp->hq * cp->wq), phase_planes, &pc);
		planes = buf;
	}
	col_rows_ctx cc = {cp, planes, col};
	parallel_range(pool, cp->cg * cp->kk, grain_for(cp->out_sp), col_rows_range, &cc);
}

/* A float weight gradient's batch of images: image i's column matrix, and its dY_g rows put side by
 * side with the other images' (rows: NULL with one image, which is read in place). */
typedef struct gw_cols_ctx {
	const conv_params *cp;
	tern_threadpool *pool; /* for the one image's own loops; NULL when the images are shared out */
	const float *x, *dy;
	float *cols, *planes, *rows;
	int64_t nb;
} gw_cols_ctx;

static void gw_cols_image(void *ctx, int64_t i)
{
	const gw_cols_ctx *c = ctx;
	const conv_params *cp = c->cp;
	int64_t ck = cp->cg * cp->kk, osp = cp->out_sp;
	if (!cp->pointwise) {
		const float *xi = c->x + i * cp->cin * cp->in_sp;
		float *ci = c->cols + i * ck * osp;
		if (cp->gw_phases)
			col_from_phases(c->pool, cp, xi, ci, c->planes + i * cp->cg * cp->n_phases * cp->hq * cp->wq);
		else
			im2col(c->pool, &cp->w, sizeof(float), cp->cg, xi, ci);
	}
	if (c->rows)
		for (int64_t m = 0; m < cp->mg; m++)
			memcpy(c->rows + (m * c->nb + i) * osp, c->dy + (i * cp->cout + m) * osp, (size_t)osp * sizeof *c->rows);
}

/* The weight gradient of images [begin, end) into dw (cout x cg*kk), their sum: per group dY_g
 * times the transpose of X_g's column matrix. Double image by image; float gw_batch images per
 * product, their column matrices side by side (in col_buf, then each image's phase planes, then their
 * dY_g rows copied side by side) and read through gw_rows. False when out of memory. */
static bool grad_weight_images(tern_threadpool *pool, const conv_params *cp, int dtype, const char *dy,
                               const char *x, char *dw, void *col_buf, int64_t begin, int64_t end)
{
	size_t es = compute_size(dtype);
	int64_t ck = cp->cg * cp->kk, osp = cp->out_sp;
	for (int64_t g = 0; g < cp->group; g++) {
		char *dwg = dw + (size_t)(g * cp->mg * ck) * es;
		if (dtype == TERN_DOUBLE) {
			for (int64_t n = begin; n < end; n++) {
				const char *xg = x + (size_t)((n * cp->cin + g * cp->cg) * cp->in_sp) * es;
				const char *dyg = dy + (size_t)((n * cp->cout + g * cp->mg) * osp) * es;
				const void *col = xg;
				if (!cp->pointwise) {
					im2col(pool, &cp->w, es, cp->cg, xg, col_buf);
					col = col_buf;
				}
				tern_gemm_f64(false, true, cp->mg, ck, osp, 1.0, (const double *)dyg, osp, col, osp,
				              n > begin ? 1.0 : 0.0, (double *)dwg, ck);
			}
			continue;
		}
		for (int64_t n = begin; n < end; n += cp->gw_batch) {
			int64_t nb = end - n < cp->gw_batch ? end - n : cp->gw_batch;
			const float *xg = (const float *)x + (n * cp->cin + g * cp->cg) * cp->in_sp;
			/* A = dY_g of the batch's images side by side: row m is image i's channel g*mg + m at i*osp */
			const float *a = (const float *)dy + (n * cp->cout + g * cp->mg) * osp;
			float *cols = col_buf, *planes = cols + (cp->pointwise ? 0 : cp->gw_batch * ck * osp);
			float *rows = planes + (cp->gw_phases && cp->split ? cp->gw_batch * cp->cg * cp->n_phases * cp->hq * cp->wq : 0);
			/* the images' columns and rows are copies: any thread may make any of them */
			gw_cols_ctx cc = {cp, nb > 1 ? NULL : pool, xg, a, cols, planes, nb > 1 ? rows : NULL, nb};
			tern_parallel_for(nb > 1 ? pool : NULL, nb, gw_cols_image, &cc);
			const float *col = cp->pointwise ? xg : cols;
			int64_t lda = osp;
			if (nb > 1) {
				a = rows;
				lda = nb * osp;
			}
			tern_packed *pk = tern_pack_a(cp->mg, nb * osp, a, lda, false, 1.0f);
			if (!pk)
				return false;
			/* B = the columns' transpose: row (i, p) at gw_rows, column j step osp past it */
			tern_gemm_b b = {col, cp->gw_rows, 0, 0, 0, cp->pointwise ? cp->in_sp : osp};
			tern_gemm_c c = {(float *)dwg, ck, false, n > begin, NULL, NULL, NULL};
			tern_gemm_packed_run(pool, pk, ck, &b, &c, TERN_GEMM_COLS);
			tern_packed_free(pk);
		}
	}
	return true;
}

/* A chunk's images into its slot's partial sum of dW. */
static void grad_weight_slot(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	grad_images_ctx *c = ctx;
	const conv_params *cp = c->cp;
	size_t es = compute_size(c->dtype), dw_elems = (size_t)(cp->cout * cp->cg * cp->kk);
	char *part = c->scratch + (size_t)slot * (dw_elems + cp->img_elems) * es;
	if (!grad_weight_images(NULL, cp, c->dtype, c->a, c->b, part, part + dw_elems * es, begin, end))
		atomic_store(&c->status, 1);
}

/* tern.ConvGradWeight(dY, X, w_shape) -> dW, with Conv's attributes: the weight gradient of Conv, X
 * correlated with dY. Per group, summed over the images: dY_g times the transpose of X_g's column
 * matrix (im2col; X_g itself when pointwise), dY_g packed and the columns read across; depthwise
 * directly. Small products go image by image on the threads, each chunk of images summed into its
 * slot's partial dW, and the partial sums added up in slot order at the end. */
static tern_status conv_grad_weight_kernel(const tern_kernel_args *a)
{
	const conv_params *cp = a->params;
	int dtype = a->in[0]->dtype;
	size_t es = compute_size(dtype);
	const char *dy = a->in[0]->data, *x = a->in[1]->data;
	char *dw = a->out[0]->data;
	if (cp->depthwise) {
		conv_ctx c = {cp, x, dy, NULL, dw, NULL, NULL};
		parallel_range(a->pool, cp->cout, grain_for(cp->n * cp->out_sp * cp->kk),
		               dtype == TERN_DOUBLE ? dw_grad_weight_f64 : dw_grad_weight_f32, &c);
		return TERN_OK;
	}
	if (cp->n == 0) {
		memset(dw, 0, (size_t)tern_tensor_numel(a->out[0]) * es);
		return TERN_OK;
	}
	if (!cp->img_slots)
		return grad_weight_images(a->pool, cp, dtype, dy, x, dw, a->scratch, 0, cp->n) ? TERN_OK : no_memory(a->node);
	/* the slots no chunk reaches stay zero */
	size_t dw_elems = (size_t)(cp->cout * cp->cg * cp->kk), stride = dw_elems + cp->img_elems;
	for (int64_t s = 0; s < cp->img_slots; s++)
		memset(a->scratch + s * stride * es, 0, dw_elems * es);
	grad_images_ctx c = {cp, dtype, NULL, dy, x, NULL, a->scratch, 0};
	parallel_slots(a->pool, cp->n, grain_for(cp->cout * cp->cg * cp->kk * cp->out_sp), cp->img_slots,
	               grad_weight_slot, &c);
	if (atomic_load(&c.status))
		return no_memory(a->node);
	if (dtype == TERN_DOUBLE) {
		double *out = (double *)dw;
		const double *part = a->scratch;
		for (size_t i = 0; i < dw_elems; i++) {
			double sum = part[i];
			for (int64_t s = 1; s < cp->img_slots; s++)
				sum += part[s * stride + i];
			out[i] = sum;
		}
	} else {
		float *out = (float *)dw;
		const float *part = a->scratch;
		for (size_t i = 0; i < dw_elems; i++) {
			float sum = part[i];
			for (int64_t s = 1; s < cp->img_slots; s++)
				sum += part[s * stride + i];
			out[i] = sum;
		}
	}
	return TERN_OK;
}

/* Float ConvGradWeight's images per product: enough for K = images x out_sp to reach GW_BATCH_K,
 * within the images and GW_BATCH_ELEMS of column matrices per slot; the row offsets of that K and
 * the scratch for the batch's column matrices and dY rows (img_elems). */
#define GW_BATCH_K 256
#define GW_BATCH_ELEMS ((int64_t)1 << 20)
static tern_status grad_weight_batch(const tern_node *node, conv_params *cp)
{
	int64_t osp = cp->out_sp, ck = cp->cg * cp->kk;
	int64_t nb = osp >= GW_BATCH_K || osp == 0 ? 1 : (GW_BATCH_K + osp - 1) / osp;
	int64_t chunk = cp->img_slots ? (cp->n + cp->img_slots - 1) / cp->img_slots : cp->n;
	if (nb > chunk)
		nb = chunk;
	while (nb > 1 && nb * ck * osp > GW_BATCH_ELEMS)
		nb--;
	if (nb < 1)
		nb = 1;
	cp->gw_batch = nb;
	if (!(cp->gw_rows = malloc((size_t)(nb * osp > 0 ? nb * osp : 1) * sizeof *cp->gw_rows)))
		return no_memory(node);
	int64_t image = cp->pointwise ? cp->cin * cp->in_sp : ck * osp;
	for (int64_t i = 0; i < nb; i++)
		for (int64_t q = 0; q < osp; q++)
			cp->gw_rows[i * osp + q] = i * image + q;
	if (!cp->pointwise)
		cp->img_elems += (size_t)((nb - 1) * ck * osp);
	if (cp->gw_phases && cp->split) /* phase planes per image, made at once */
		cp->img_elems += (size_t)((nb - 1) * cp->cg * cp->n_phases * cp->hq * cp->wq);
	if (nb > 1)
		cp->img_elems += (size_t)(nb * cp->mg * osp);
	return TERN_OK;
}

static tern_status conv_grad_weight_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[1];
	int rank = 0;
	int64_t dims[TERN_MAX_RANK];
	bool ready;
	tern_status st = check_real_same(p, 2);
	if (st || (st = tern_nn_shape_input(p, 2, &rank, dims, &ready)) || !ready)
		return st;
	tern_tensor wt = tern_nn_shape_only(x->dtype, rank, dims);
	conv_params *cp = NULL;
	if ((st = conv_setup(p, x, &wt, 2, &cp)) || (st = tern_nn_check_dy(p)))
		return st;
	tern_set_shape(p->out[0], x->dtype, rank, dims);
	/* one input channel per group and one group (cin 1): a product, dY times the columns' transpose,
	 * is faster than the depthwise loops, whose rows are short and, strided, scalar */
	cp->depthwise = cp->cg == 1 && !cp->pointwise && cp->group > 1;
	if (cp->depthwise) {
		if ((st = depthwise_rows(node, cp)))
			return st;
	} else {
		/* a partial dW per slot: only where the pool's threads may round in parts */
		cp->img_slots = tern_threadpool_sums(p->pool) > 1 ? by_images(p->pool, cp) : 0;
		cp->img_elems = cp->pointwise ? 0 : (size_t)(cp->cg * cp->kk * cp->out_sp);
		/* float 1-D and 2-D: the column matrix made from phase planes (after it in the scratch) */
		cp->gw_phases = !cp->pointwise && x->dtype != TERN_DOUBLE && cp->w.k[0] == 1 && cp->w.in[0] == 1;
		if (cp->gw_phases) {
			if ((st = phase_setup(node, cp, cp->cg, false)))
				return st;
			if (cp->split)
				cp->img_elems += (size_t)(cp->cg * cp->n_phases * cp->hq * cp->wq);
		}
		cp->gw_batch = 1;
		if (x->dtype != TERN_DOUBLE && (st = grad_weight_batch(node, cp)))
			return st;
		/* per slot: its partial dW, then its column matrices and the batch's dY rows */
		size_t slot = cp->img_elems + (cp->img_slots ? (size_t)(cp->cout * cp->cg * cp->kk) : 0);
		p->scratch_bytes = (size_t)(cp->img_slots ? cp->img_slots : 1) * slot * compute_size(x->dtype);
	}
	p->kernel = conv_grad_weight_kernel;
	return tern_nn_stage_halves(p);
}

/* Conv: dX = tern.ConvGradInput, dW = tern.ConvGradWeight (both with Conv's attributes), dB = dY
 * summed over all axes but the channels. */
static tern_status conv_grad(tern_grad_ctx *g)
{
	tern_gval *x = g->x[0], *w = g->x[1], *dy = g->dy[0];
	if (g->wants[0]) {
		tern_gval *in[3] = {dy, w, tern_nn_g_shape(g, x)};
		g->dx[0] = in[2] ? tern_g_op_like(g, "tern", "ConvGradInput", in, 3, NULL, 0) : NULL;
	}
	if (g->wants[1]) {
		tern_gval *in[3] = {dy, x, tern_nn_g_shape(g, w)};
		g->dx[1] = in[2] ? tern_g_op_like(g, "tern", "ConvGradWeight", in, 3, NULL, 0) : NULL;
	}
	if (g->n_in > 2 && g->wants[2])
		g->dx[2] = tern_nn_g_channel_sum(g, dy);
	return tern_nn_g_done(g, 0);
}

/* ConvTranspose is the data gradient of the convolution of its output back to its input (its
 * geometry turned around, pads resolved): dX = Conv(dY, W), dW = tern.ConvGradWeight with X in dY's
 * place and dY in X's, dB = dY summed over all axes but the channels. */
static tern_status conv_transpose_grad(tern_grad_ctx *g)
{
	tern_gval *x = g->x[0], *w = g->x[1], *dy = g->dy[0];
	int dtype, xr, wr;
	int64_t xd[TERN_MAX_RANK], wd[TERN_MAX_RANK], yd[TERN_MAX_RANK];
	tern_g_type(g, x, &dtype, &xr, xd);
	tern_g_type(g, w, NULL, &wr, wd);
	bool known = xr >= 3 && xr <= SP + 2 && wr == xr;
	for (int d = 2; known && d < xr; d++)
		known = xd[d] >= 0 && wd[d] >= 0;
	if (!known)
		return tern_g_fail(g, "ConvTranspose needs X's spatial dimensions and W's shape known");
	tern_tensor xt = tern_nn_shape_only(dtype, xr, xd);
	window win;
	tern_status st = conv_transpose_window(g->node, &xt, wd + 2, &win, yd);
	if (st)
		return st;
	int nsp = win.nsp;
	int64_t kernel[SP], strides[SP], dilations[SP], pads[2 * SP];
	for (int i = 0; i < nsp; i++) {
		int j = SP - nsp + i;
		kernel[i] = win.k[j];
		strides[i] = win.s[j];
		dilations[i] = win.d[j];
		pads[i] = win.pb[j];
		pads[nsp + i] = win.pe[j];
		int64_t span = win.in[j] + win.pb[j] + win.pe[j] - (win.k[j] - 1) * win.d[j] - 1;
		if (win.pb[j] < 0 || win.pe[j] < 0 || span < 0 || span / win.s[j] + 1 != win.out[j])
			return tern_g_fail(g, "ConvTranspose's output (pads %lld+%lld) does not convolve back to its input",
			                   (long long)win.pb[j], (long long)win.pe[j]);
	}
	tern_gattr at[5] = {TERN_GA_IS("kernel_shape", kernel, (size_t)nsp), TERN_GA_IS("strides", strides, (size_t)nsp),
	                    TERN_GA_IS("dilations", dilations, (size_t)nsp), TERN_GA_IS("pads", pads, 2 * (size_t)nsp),
	                    TERN_GA_I("group", tern_attr_int(g->node, "group", 1))};
	if (g->wants[0]) {
		tern_gval *in[2] = {dy, w};
		g->dx[0] = tern_g_op(g, "", "Conv", in, 2, at, 5);
	}
	if (g->wants[1]) {
		tern_gval *in[3] = {x, dy, tern_nn_g_shape(g, w)};
		g->dx[1] = in[2] ? tern_g_op(g, "tern", "ConvGradWeight", in, 3, at, 5) : NULL;
	}
	if (g->n_in > 2 && g->wants[2])
		g->dx[2] = tern_nn_g_channel_sum(g, dy);
	return tern_nn_g_done(g, 0);
}

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
	{"", "Conv", 1, 0, conv_prepare, TERN_DT_FLOATS, "conv", conv_grad},
	{"", "ConvInteger", 10, 0, conv_integer_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "conv"},
	{"", "QLinearConv", 10, 0, qlinear_conv_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "conv"},
	{"", "DeformConv", 19, 0, deform_conv_prepare, TERN_DT_FLOATS, "conv"},
	{"", "ConvTranspose", 1, 0, conv_transpose_prepare, TERN_DT_FLOATS, "conv", conv_transpose_grad},
	{"", "Col2Im", 18, 0, col2im_prepare, TERN_DT_FLOATS, "conv"},
	{"tern", "ConvGradInput", 1, 0, conv_grad_input_prepare, TERN_DT_FLOATS, "conv"},
	{"tern", "ConvGradWeight", 1, 0, conv_grad_weight_prepare, TERN_DT_FLOATS, "conv"},
};

const tern_op_table tern_ops_conv = {ops, TERN_ARRAY_LEN(ops)};
