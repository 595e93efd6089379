/* blocked_tile.h — tern.BlockedConv's kernel, once per vector width: blocked.c includes it with
 * BT_VL floats a vector (BT_V, its unaligned BT_VU and integer BT_VI), the target attribute BT_ATTR,
 * up to BT_OB blocks of output channels by BT_NB positions a tile, (and BT_MAX, the lanes' maximum of two vectors) and it defines bconv_row_<BT_VL>,
 * bconv_dw_row_<BT_VL> (depthwise) and bpool_row_<BT_VL> (max and average pools) (the parameters are undefined at the end, for the next width).
 *
 * A block of 16 channels is 16 / BT_VL vectors; each tile's sums (BT_OB blocks x BT_NB positions)
 * stay in registers over all input channels and taps: per input channel one load of each weight
 * vector, one broadcast per position, a multiply-add per sum. Written with vectors of the machine's
 * own width: a 16-wide vector type on a narrower machine would be split by the compiler into pairs
 * that it keeps in memory (the first AVX2 build of this kernel ran 10 times slower than AVX-512). */

#define BT_CAT2(a, b) a##_##b
#define BT_CAT(a, b) BT_CAT2(a, b)
#define BT_NAME(name) BT_CAT(name, BT_VL)
#define BT_NV (BLK / BT_VL)

/* One vector of results to memory: plus the residual (zo NULL: none), Relu when asked. */
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(put)(BT_V r, float *yo, const float *zo, bool relu)
{
	if (zo)
		r += *(const BT_VU *)zo;
	if (relu)
		r = (BT_V)((BT_VI)r & (r > 0));
	*(BT_VU *)yo = r;
}

/* One tile: OB blocks of output channels (from `ob`) by NB output positions from column ow0 of row oh,
 * over all taps (the input, padded where the window needs it, holds them all). S: the columns' stride
 * when known when compiling (0: read from c), so that the broadcasts use fixed offsets. FULL: the input is in
 * blocks of 16 channels; otherwise it is one block of c->lanes channels a position (a stem's few
 * channels, copied so from planar input), and only those lanes of the weights are read. */
BT_ATTR static inline __attribute__((always_inline)) void
BT_NAME(tile)(const int OB, const int NB, const int S, const int FULL, const bconv *c, const float *x, int64_t ob,
              int64_t oh, int64_t ow0, float *y, const float *z)
{
	const window *w = &c->w;
	int64_t s_h = w->s[1], s_w = S ? S : w->s[2], d_h = w->d[1], d_w = w->d[2];
	/* FULL 1: blocks of 16 channels; 0: a stem's c->lanes; 3: a stem of three (RGB), known when
	 * compiling so that the loop over them unrolls */
	const int64_t L = FULL == 1 ? BLK : FULL ? FULL : c->lanes;
	int64_t wstride = c->icb * c->kh * c->kw * BLK * BLK;
	BT_V acc[BT_OB * BT_NV][BT_NB];
	UNROLL_ALL for (int o = 0; o < OB * BT_NV; o++)
	{
		BT_V b = *(const BT_V *)(c->bias + ob * BLK + o * BT_VL);
		UNROLL_ALL for (int j = 0; j < NB; j++) acc[o][j] = b;
	}
	const float *wp = c->wt + ob * wstride;
	for (int64_t icb = 0; icb < c->icb; icb++)
		for (int64_t kh = 0; kh < c->kh; kh++) {
			const float *xr = x + ((icb * c->in_h + oh * s_h + kh * d_h) * c->in_w + ow0 * s_w) * L;
			for (int64_t kw = 0; kw < c->kw; kw++, wp += BLK * BLK) {
				const float *xp = xr + kw * d_w * L;
				_Pragma("GCC unroll 4") for (int ic = 0; ic < L; ic++)
				{
					BT_V wv[BT_OB * BT_NV];
					UNROLL_ALL for (int o = 0; o < OB; o++) UNROLL_ALL for (int v = 0; v < BT_NV; v++)
						wv[o * BT_NV + v] = *(const BT_V *)(wp + o * wstride + ic * BLK + v * BT_VL);
					if (FULL == 1) /* the next tap's weights, whose first reading in a run comes from memory */
						UNROLL_ALL for (int o = 0; o < OB; o++) __builtin_prefetch(wp + o * wstride + (BLK + ic) * BLK, 0, 3);
					UNROLL_ALL for (int j = 0; j < NB; j++)
					{
						float s = xp[j * s_w * L + ic];
						UNROLL_ALL for (int o = 0; o < OB * BT_NV; o++) acc[o][j] += wv[o] * s;
					}
				}
			}
		}
	bool relu = c->act.kind == TERN_ACT_RELU, other = !relu && c->act.kind != TERN_ACT_NONE;
	UNROLL_ALL for (int o = 0; o < OB; o++)
	{
		int64_t at = ((ob + o) * c->out_h + oh) * c->out_w + ow0;
		float *yo = y + at * BLK;
		const float *zo = z ? z + at * BLK : NULL;
		UNROLL_ALL for (int j = 0; j < NB; j++) UNROLL_ALL for (int v = 0; v < BT_NV; v++)
			BT_NAME(put)(acc[o * BT_NV + v][j], yo + j * BLK + v * BT_VL, zo ? zo + j * BLK + v * BT_VL : NULL, relu);
		if (other)
			tern_act_run(&c->act, yo, NULL, NB * BLK);
	}
}

/* Tiles of nb <= BT_NB positions (nb only known at run time: one case per width), stride S (1 or 2),
 * input in blocks: the hot path, for which every width is compiled. */
#define BT_TILE_CASE(K)                                                                  \
	case K:                                                                          \
		if ((K) <= BT_NB)                                                        \
			BT_NAME(tile)(OB, (K) <= BT_NB ? (K) : 1, S, 1, c, x, ob, oh, ow0, y, z); \
		break;
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(tile_n)(const int OB, const int S, int nb, const bconv *c,
                                                                         const float *x, int64_t ob, int64_t oh,
                                                                         int64_t ow0, float *y, const float *z)
{
	switch (nb) {
		BT_TILE_CASE(1)
		BT_TILE_CASE(2)
		BT_TILE_CASE(3)
		BT_TILE_CASE(4)
		BT_TILE_CASE(5)
		BT_TILE_CASE(6)
		BT_TILE_CASE(7)
		BT_TILE_CASE(8)
		BT_TILE_CASE(9)
		BT_TILE_CASE(10)
		BT_TILE_CASE(11)
		BT_TILE_CASE(12)
		BT_TILE_CASE(13)
		BT_TILE_CASE(14)
	default: break;
	}
}
#undef BT_TILE_CASE

/* The widths that the other paths compile (strided columns, a stem's planar input, depthwise): BT_NB, then 7, 4, 2, 1 below it, taken greedily: any rest below BT_NB takes each at
 * most once (7 + 4 + 2 + 1 = 14), so a row needs at most three tiles more than whole ones. Every
 * width compiled costs code and compile time (clang with the sanitizers takes minutes for each
 * dozen), which the hot path alone is worth. TILE(K, ow) runs a tile of K positions from ow. */
#ifdef TERN_FEW_KERNEL_VARIANTS
/* a build that never runs the kernels for speed (the fuzz targets, which only parse): one width */
#define BT_GREEDY_ROW(TILE, out_w)                             \
	do {                                                   \
		for (int64_t ow_ = 0; ow_ < (out_w); ow_++)    \
			TILE(1, ow_);                          \
	} while (0)
#else
#define BT_GREEDY_ROW(TILE, out_w)                                                          \
	do {                                                                                \
		int64_t ow_ = 0;                                                            \
		for (; ow_ + BT_NB <= (out_w); ow_ += BT_NB)                                \
			TILE(BT_NB, ow_);                                                   \
		if (7 < BT_NB && ow_ + 7 <= (out_w)) {                                      \
			TILE(7 < BT_NB ? 7 : 1, ow_);                                       \
			ow_ += 7;                                                           \
		}                                                                           \
		if (4 < BT_NB && ow_ + 4 <= (out_w)) {                                      \
			TILE(4 < BT_NB ? 4 : 1, ow_);                                       \
			ow_ += 4;                                                           \
		}                                                                           \
		if (2 < BT_NB && ow_ + 2 <= (out_w)) {                                      \
			TILE(2 < BT_NB ? 2 : 1, ow_);                                       \
			ow_ += 2;                                                           \
		}                                                                           \
		if (ow_ < (out_w))                                                          \
			TILE(1, ow_);                                                       \
	} while (0)
#endif

/* One output row of OB channel blocks: on the hot path (stride 1 or 2, blocked input) in tiles of
 * nearly equal widths up to BT_NB; otherwise (a stem, other strides) in the greedy widths, stride 2
 * known when compiling. */
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(row_body)(const int OB, const int FULL,
                                                                           const bconv *c,
                                                                           const float *x, int64_t ob, int64_t oh,
                                                                           float *y, const float *z)
{
#ifndef TERN_FEW_KERNEL_VARIANTS
	if (FULL == 1 && (c->w.s[2] == 1 || c->w.s[2] == 2)) {
		/* tiles of nearly equal widths: a row of 17 as 9 + 8, not 14 + 2 + 1, whose narrow tiles
		 * would wait on their few sums' multiply-adds */
		int64_t tiles = ceil_div(c->out_w, BT_NB);
		for (int64_t t = 0, ow = 0; t < tiles; t++) {
			int64_t next = (t + 1) * c->out_w / tiles;
			if (c->w.s[2] == 1)
				BT_NAME(tile_n)(OB, 1, (int)(next - ow), c, x, ob, oh, ow, y, z);
			else
				BT_NAME(tile_n)(OB, 2, (int)(next - ow), c, x, ob, oh, ow, y, z);
			ow = next;
		}
		return;
	}
#endif
#define BT_ROW_TILE(K, ow) BT_NAME(tile)(OB, K, S, FULL, c, x, ob, oh, ow, y, z)
#ifndef TERN_FEW_KERNEL_VARIANTS
	if (c->w.s[2] == 2) { /* a stem's stride 2 compiled as such */
		const int S = 2;
		BT_GREEDY_ROW(BT_ROW_TILE, c->out_w);
		return;
	}
#endif
	const int S = 0;
	BT_GREEDY_ROW(BT_ROW_TILE, c->out_w);
#undef BT_ROW_TILE
}

/* Output row oh of channel blocks [ob, ob + count) (count 1 or 2) of one image. */
BT_ATTR static void BT_NAME(bconv_row)(const bconv *c, const float *x, int64_t ob, int64_t count, int64_t oh, float *y,
                                       const float *z)
{
	if (c->lanes != BLK) { /* a stem: its tiles take the stride as it comes */
#if BT_OB == 2
		if (count == 2) {
			if (c->lanes == 3)
				BT_NAME(row_body)(2, 3, c, x, ob, oh, y, z);
			else
				BT_NAME(row_body)(2, 0, c, x, ob, oh, y, z);
			return;
		}
#endif
		for (int64_t o = 0; o < count; o++)
			if (c->lanes == 3)
				BT_NAME(row_body)(1, 3, c, x, ob + o, oh, y, z);
			else
				BT_NAME(row_body)(1, 0, c, x, ob + o, oh, y, z);
		return;
	}
#if BT_OB == 2
	if (count == 2) {
		BT_NAME(row_body)(2, 1, c, x, ob, oh, y, z);
		return;
	}
#endif
	for (int64_t o = 0; o < count; o++)
		BT_NAME(row_body)(1, 1, c, x, ob + o, oh, y, z);
}

/* The depthwise convolution and the pools read their input in place: a row's window rows outside the
 * input are left out, and so are the columns outside it of the windows over the left or right edge (in
 * win_tile for a window known when compiling; position by position in dw_edge and bpool_row_body
 * otherwise). */

/* One output position ow of row oh of block cb whose window crosses an edge: only the taps inside. */
BT_ATTR static void BT_NAME(dw_edge)(const bconv *c, const float *x, int64_t cb, int64_t oh, int64_t ow, float *y,
                                     const float *z)
{
	const window *w = &c->w;
	const float *xb = x + cb * c->x_h * c->x_w * BLK, *wp = c->wt + cb * c->kh * c->kw * BLK;
	int64_t ih0 = oh * w->s[1] - c->pad_t, iw0 = ow * w->s[2] - c->pad_l;
	BT_V acc[BT_NV];
	UNROLL_ALL for (int v = 0; v < BT_NV; v++) acc[v] = *(const BT_V *)(c->bias + cb * BLK + v * BT_VL);
	for (int64_t kh = 0; kh < c->kh; kh++) {
		int64_t ih = ih0 + kh * w->d[1];
		if (ih < 0 || ih >= c->x_h)
			continue;
		for (int64_t kw = 0; kw < c->kw; kw++) {
			int64_t iw = iw0 + kw * w->d[2];
			if (iw < 0 || iw >= c->x_w)
				continue;
			const float *xp = xb + (ih * c->x_w + iw) * BLK, *wk = wp + (kh * c->kw + kw) * BLK;
			UNROLL_ALL for (int v = 0; v < BT_NV; v++) acc[v] +=
			        *(const BT_V *)(wk + v * BT_VL) * *(const BT_VU *)(xp + v * BT_VL);
		}
	}
	int64_t at = (cb * c->out_h + oh) * c->out_w + ow;
	bool relu = c->act.kind == TERN_ACT_RELU;
	UNROLL_ALL for (int v = 0; v < BT_NV; v++)
		BT_NAME(put)(acc[v], y + at * BLK + v * BT_VL, z ? z + at * BLK + v * BT_VL : NULL, relu);
	if (!relu && c->act.kind != TERN_ACT_NONE)
		tern_act_run(&c->act, y + at * BLK, NULL, BLK);
}

/* A tile of a window known when compiling (KH x KW, stride S, no dilation) over blocked input read in
 * place: NB positions from column ow0 of block cb, window rows [kh0, kh1). KIND: the depthwise
 * convolution (bias, weights, residual z, activation), the maximum or the mean. A vector of a block at
 * a time; along a window row each input vector is loaded once and combined into every window that
 * reads it (with stride 1, KW of them), so that the loads stay fewer than the arithmetic. EDGE: some
 * windows cross the left or right edge, and the columns outside the input are left out (and, for the
 * mean without count_include_pad, out of its divisor). */
#define BT_WIN_KMAX 5 /* the widest window win_tile is compiled for (5 x 5) */
BT_ATTR static inline __attribute__((always_inline)) void
BT_NAME(win_tile)(const wb_kind KIND, const int NB, const int KH, const int KW, const int S, const int EDGE,
                  const bconv *c, const float *x, int64_t cb, int64_t oh, int64_t ow0, int64_t kh0, int64_t kh1,
                  float *y, const float *z)
{
	const float *xb = x + cb * c->x_h * c->x_w * BLK;
	const float *wp = KIND == WB_CONV ? c->wt + cb * KH * KW * BLK : NULL; /* pools have no weights */
	int64_t ih0 = oh * S - c->pad_t, iw0 = ow0 * S - c->pad_l;
	int64_t at = (cb * c->out_h + oh) * c->out_w + ow0;
	bool relu = KIND == WB_CONV && c->act.kind == TERN_ACT_RELU;
	float scale[BT_NB];
	UNROLL_ALL for (int j = 0; j < NB; j++)
	{
		int64_t iw = iw0 + j * S, cols = KW;
		if (EDGE) {
			int64_t first = iw < 0 ? -iw : 0, end = c->x_w - iw < KW ? c->x_w - iw : KW;
			cols = end > first ? end - first : 0;
		}
		scale[j] = KIND == WB_AVG ? 1.0f / (float)(c->include_pad ? KH * KW : (kh1 - kh0) * cols) : 1.0f;
	}
	UNROLL_ALL for (int v = 0; v < BT_NV; v++)
	{
		BT_V acc[BT_NB];
		BT_V init = KIND == WB_CONV ? *(const BT_V *)(c->bias + cb * BLK + v * BT_VL)
		                            : (BT_V){0} - (KIND == WB_MAX ? INFINITY : 0);
		UNROLL_ALL for (int j = 0; j < NB; j++) acc[j] = init;
		UNROLL_ALL for (int kh = 0; kh < KH; kh++)
		{
			if (kh < kh0 || kh >= kh1)
				continue;
			const float *xr = xb + ((ih0 + kh) * c->x_w + iw0) * BLK + v * BT_VL;
			BT_V wv[BT_WIN_KMAX]; /* a fixed size: KW, a parameter, would make it a variable-length array */
			UNROLL_ALL for (int kw = 0; kw < KW; kw++) wv[kw] =
			        KIND == WB_CONV ? *(const BT_V *)(wp + (kh * KW + kw) * BLK + v * BT_VL) : (BT_V){0};
			_Pragma("GCC unroll 64") for (int i = 0; i < (NB - 1) * S + KW; i++)
			{
				if (EDGE && (iw0 + i < 0 || iw0 + i >= c->x_w))
					continue;
				BT_V xv = *(const BT_VU *)(xr + i * BLK);
				UNROLL_ALL for (int kw = 0; kw < KW; kw++) if (i >= kw && (i - kw) % S == 0 && (i - kw) / S < NB)
				{
					int j = (i - kw) / S;
					acc[j] = KIND == WB_CONV ? acc[j] + wv[kw] * xv : KIND == WB_MAX ? BT_MAX(acc[j], xv) : acc[j] + xv;
				}
			}
		}
		UNROLL_ALL for (int j = 0; j < NB; j++)
		{
			float *yo = y + (at + j) * BLK + v * BT_VL;
			if (KIND == WB_CONV)
				BT_NAME(put)(acc[j], yo, z ? z + (at + j) * BLK + v * BT_VL : NULL, relu);
			else
				*(BT_VU *)yo = KIND == WB_AVG ? acc[j] * scale[j] : acc[j];
		}
	}
	if (KIND == WB_CONV && !relu && c->act.kind != TERN_ACT_NONE)
		tern_act_run(&c->act, y + at * BLK, NULL, NB * BLK);
}

/* Output row oh of block cb of a window known when compiling, in tiles, those over an edge checking
 * their columns. */
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(win_row)(const wb_kind KIND, const int KH,
                                                                          const int KW, const int S, const bconv *c,
                                                                          const float *x, int64_t cb, int64_t oh,
                                                                          float *y, const float *z)
{
	int64_t kh0, kh1, lo, hi;
	window_inside(c, oh, &kh0, &kh1, &lo, &hi);
#define BT_WIN_TILE(K, ow)                                                                                \
	do {                                                                                              \
		if ((ow) < lo || (ow) + (K) > hi)                                                         \
			BT_NAME(win_tile)(KIND, K, KH, KW, S, 1, c, x, cb, oh, ow, kh0, kh1, y, z);        \
		else                                                                                      \
			BT_NAME(win_tile)(KIND, K, KH, KW, S, 0, c, x, cb, oh, ow, kh0, kh1, y, z);        \
	} while (0)
	BT_GREEDY_ROW(BT_WIN_TILE, c->out_w);
#undef BT_WIN_TILE
}

/* The same for any window (read from c, with its dilations), tap by tap. */
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(dw_tile_any)(const int NB, const bconv *c,
                                                                              const float *x, int64_t cb, int64_t oh,
                                                                              int64_t ow0, int64_t kh0, int64_t kh1,
                                                                              float *y, const float *z)
{
	const window *w = &c->w;
	int64_t s_h = w->s[1], s_w = w->s[2], d_h = w->d[1], d_w = w->d[2];
	const float *xb = x + cb * c->x_h * c->x_w * BLK, *wp = c->wt + cb * c->kh * c->kw * BLK;
	int64_t ih0 = oh * s_h - c->pad_t, iw0 = ow0 * s_w - c->pad_l;
	BT_V acc[BT_NV][BT_NB];
	UNROLL_ALL for (int v = 0; v < BT_NV; v++)
	{
		BT_V b = *(const BT_V *)(c->bias + cb * BLK + v * BT_VL);
		UNROLL_ALL for (int j = 0; j < NB; j++) acc[v][j] = b;
	}
	for (int64_t kh = kh0; kh < kh1; kh++)
		for (int64_t kw = 0; kw < c->kw; kw++) {
			const float *xr = xb + ((ih0 + kh * d_h) * c->x_w + iw0 + kw * d_w) * BLK;
			UNROLL_ALL for (int v = 0; v < BT_NV; v++)
			{
				BT_V wv = *(const BT_V *)(wp + (kh * c->kw + kw) * BLK + v * BT_VL);
				UNROLL_ALL for (int j = 0; j < NB; j++) acc[v][j] +=
				        wv * *(const BT_VU *)(xr + j * s_w * BLK + v * BT_VL);
			}
		}
	bool relu = c->act.kind == TERN_ACT_RELU;
	int64_t at = (cb * c->out_h + oh) * c->out_w + ow0;
	float *yo = y + at * BLK;
	const float *zo = z ? z + at * BLK : NULL;
	UNROLL_ALL for (int j = 0; j < NB; j++) UNROLL_ALL for (int v = 0; v < BT_NV; v++)
		BT_NAME(put)(acc[v][j], yo + j * BLK + v * BT_VL, zo ? zo + j * BLK + v * BT_VL : NULL, relu);
	if (!relu && c->act.kind != TERN_ACT_NONE)
		tern_act_run(&c->act, yo, NULL, NB * BLK);
}

/* Output row oh of block cb of a depthwise window known only when planning: the window rows inside the
 * input; the columns whose windows lie inside in tiles, the others one by one. */
BT_ATTR static void BT_NAME(dw_row_any)(const bconv *c, const float *x, int64_t cb, int64_t oh, float *y,
                                        const float *z)
{
	int64_t kh0, kh1, lo, hi;
	window_inside(c, oh, &kh0, &kh1, &lo, &hi);
	for (int64_t ow = 0; ow < lo; ow++)
		BT_NAME(dw_edge)(c, x, cb, oh, ow, y, z);
#define BT_DW_TILE(K, ow) BT_NAME(dw_tile_any)(K, c, x, cb, oh, lo + (ow), kh0, kh1, y, z)
	BT_GREEDY_ROW(BT_DW_TILE, hi - lo);
#undef BT_DW_TILE
	for (int64_t ow = hi; ow < c->out_w; ow++)
		BT_NAME(dw_edge)(c, x, cb, oh, ow, y, z);
}

/* Output row oh of the depthwise convolution's channel block cb (count: 1); 3 x 3 and 5 x 5 windows
 * of stride 1 or 2 and no dilation are compiled as such. */
BT_ATTR static void BT_NAME(bconv_dw_row)(const bconv *c, const float *x, int64_t cb, int64_t count, int64_t oh,
                                          float *y, const float *z)
{
	(void)count;
	const window *w = &c->w;
	int64_t s = w->s[1] == w->s[2] && w->d[1] == 1 && w->d[2] == 1 ? w->s[1] : 0;
	if (c->kh == 3 && c->kw == 3 && s == 1)
		BT_NAME(win_row)(WB_CONV, 3, 3, 1, c, x, cb, oh, y, z);
	else if (c->kh == 3 && c->kw == 3 && s == 2)
		BT_NAME(win_row)(WB_CONV, 3, 3, 2, c, x, cb, oh, y, z);
	else if (c->kh == 5 && c->kw == 5 && s == 1)
		BT_NAME(win_row)(WB_CONV, 5, 5, 1, c, x, cb, oh, y, z);
	else if (c->kh == 5 && c->kw == 5 && s == 2)
		BT_NAME(win_row)(WB_CONV, 5, 5, 2, c, x, cb, oh, y, z);
	else
		BT_NAME(dw_row_any)(c, x, cb, oh, y, z);
}

/* Output row oh of a pool's channel block cb, read in place: per position the maximum (AVG: the sum
 * over the divisor) over the window's taps inside the input, vector by vector (memory-bound: the taps
 * are read as they come, and only the windows over an edge test their taps). */
BT_ATTR static inline __attribute__((always_inline)) void BT_NAME(bpool_row_body)(const int AVG, const bconv *c,
                                                                                 const float *x, int64_t cb,
                                                                                 int64_t oh, float *y)
{
	const window *w = &c->w;
	int64_t s_h = w->s[1], s_w = w->s[2], d_h = w->d[1], d_w = w->d[2];
	int64_t ih0 = oh * s_h - c->pad_t;
	bool rows_in = ih0 >= 0 && ih0 + (c->kh - 1) * d_h < c->x_h;
	const float *xb = x + cb * c->x_h * c->x_w * BLK;
	float *yo = y + (cb * c->out_h + oh) * c->out_w * BLK;
	for (int64_t ow = 0; ow < c->out_w; ow++) {
		int64_t iw0 = ow * s_w - c->pad_l;
		bool inside = rows_in && iw0 >= 0 && iw0 + (c->kw - 1) * d_w < c->x_w;
		BT_V m[BT_NV];
		UNROLL_ALL for (int v = 0; v < BT_NV; v++) m[v] = (BT_V){0} - (AVG ? 0 : INFINITY);
		int64_t taps = 0;
		for (int64_t kh = 0; kh < c->kh; kh++) {
			int64_t ih = ih0 + kh * d_h;
			if (!inside && (ih < 0 || ih >= c->x_h))
				continue;
			for (int64_t kw = 0; kw < c->kw; kw++) {
				int64_t iw = iw0 + kw * d_w;
				if (!inside && (iw < 0 || iw >= c->x_w))
					continue;
				const float *xp = xb + (ih * c->x_w + iw) * BLK;
				taps++;
				UNROLL_ALL for (int v = 0; v < BT_NV; v++)
				{
					BT_V t = *(const BT_VU *)(xp + v * BT_VL);
					m[v] = AVG ? m[v] + t : BT_MAX(m[v], t);
				}
			}
		}
		/* the divisor: all the window's taps with count_include_pad, else those inside */
		float scale = AVG ? 1.0f / (float)(c->include_pad ? c->kh * c->kw : taps) : 1.0f;
		UNROLL_ALL for (int v = 0; v < BT_NV; v++) * (BT_VU *)(yo + ow * BLK + v * BT_VL) = AVG ? m[v] * scale : m[v];
	}
}

/* Output row oh of a pool's block cb: 3 x 3 windows of stride 1 or 2 without dilation compiled as
 * such (the pools of the common networks), others tap by tap. */
BT_ATTR static void BT_NAME(bpool_row)(const bconv *c, const float *x, int64_t cb, int64_t count, int64_t oh, float *y,
                                       const float *z)
{
	(void)count;
	(void)z;
	const window *w = &c->w;
	int64_t s = w->s[1] == w->s[2] && w->d[1] == 1 && w->d[2] == 1 && c->kh == 3 && c->kw == 3 ? w->s[1] : 0;
	if (s == 1)
		c->avg ? BT_NAME(win_row)(WB_AVG, 3, 3, 1, c, x, cb, oh, y, NULL)
		       : BT_NAME(win_row)(WB_MAX, 3, 3, 1, c, x, cb, oh, y, NULL);
	else if (s == 2)
		c->avg ? BT_NAME(win_row)(WB_AVG, 3, 3, 2, c, x, cb, oh, y, NULL)
		       : BT_NAME(win_row)(WB_MAX, 3, 3, 2, c, x, cb, oh, y, NULL);
	else if (c->avg)
		BT_NAME(bpool_row_body)(1, c, x, cb, oh, y);
	else
		BT_NAME(bpool_row_body)(0, c, x, cb, oh, y);
}

#undef BT_VL
#undef BT_V
#undef BT_MAX
#undef BT_GREEDY_ROW
#undef BT_VU
#undef BT_VI
#undef BT_ATTR
#undef BT_OB
#undef BT_NB
#undef BT_WIN_KMAX
#undef BT_NV
#undef BT_NAME
#undef BT_CAT
#undef BT_CAT2
