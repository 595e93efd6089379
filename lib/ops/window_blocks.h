/* window_blocks.h — the channel-block engine of the windowed operators (depthwise convolution in
 * conv.c, max and average pooling in pool.c), once per vector width: nn_common.c includes it with
 * WB_LANES channels a vector, the target attribute WB_ATTR and the intrinsics behind the WB_ names, and
 * it defines wb_task_<WB_LANES>. Included only from nn_common.c, after wb_job, wb_kind and wb_extent
 * (nn.h), wb_rows and wb_shape. */

#define WB_CAT2(a, b) a##_##b
#define WB_CAT(a, b) WB_CAT2(a, b)
#define WB_NAME(name) WB_CAT(name, WB_LANES)

WB_ATTR static inline __attribute__((always_inline)) WB_V WB_NAME(wb_combine)(const wb_kind kind, WB_V acc, WB_V v,
                                                                              WB_V wv)
{
	return kind == WB_CONV ? WB_VFMA(wv, v, acc) : kind == WB_MAX ? WB_VMAX(acc, v) : WB_VADD(acc, v);
}

/* One output row of a band: t holds its padded input rows (wp positions of WB_LANES floats each), o
 * gets o2n positions; o1 counts rows from the band's first. Two output positions at a time, so that a
 * tap's weights are loaded once for both (the weights of a 5 x 5 window do not fit in the registers)
 * and the two sums are independent chains. kh, kw, strides and dilations are constants in the
 * instances below. */
WB_ATTR static inline __attribute__((always_inline)) void
WB_NAME(wb_row)(const wb_kind kind, const int kh, const int kw, const int64_t s1, const int64_t s2, const int64_t d1,
                const int64_t d2, const float *restrict t, int64_t wp, const WB_V *restrict wv, WB_V bias,
                float *restrict o, int64_t o1, int64_t o2n)
{
	WB_V init = kind == WB_CONV ? bias : WB_SET1(kind == WB_MAX ? -INFINITY : 0);
	int64_t o2 = 0;
	for (; o2 + 2 <= o2n; o2 += 2) {
		WB_V a0 = init, a1 = init;
		for (int k1 = 0; k1 < kh; k1++) {
			const float *row = t + ((o1 * s1 + k1 * d1) * wp + o2 * s2) * WB_LANES;
			for (int k2 = 0; k2 < kw; k2++) {
				WB_V w = kind == WB_CONV ? wv[k1 * kw + k2] : init;
				a0 = WB_NAME(wb_combine)(kind, a0, WB_LOAD(row + k2 * d2 * WB_LANES), w);
				a1 = WB_NAME(wb_combine)(kind, a1, WB_LOAD(row + (k2 * d2 + s2) * WB_LANES), w);
			}
		}
		WB_STORE(o + o2 * WB_LANES, a0);
		WB_STORE(o + (o2 + 1) * WB_LANES, a1);
	}
	for (; o2 < o2n; o2++) {
		WB_V acc0 = init, acc1 = kind == WB_CONV ? WB_ZERO() : init;
		for (int k1 = 0; k1 < kh; k1++) {
			const float *row = t + ((o1 * s1 + k1 * d1) * wp + o2 * s2) * WB_LANES;
			for (int k2 = 0; k2 < kw; k2++) {
				WB_V v = WB_LOAD(row + k2 * d2 * WB_LANES),
				     w = kind == WB_CONV ? wv[k1 * kw + k2] : init;
				if ((k1 * kw + k2) % 2)
					acc1 = WB_NAME(wb_combine)(kind, acc1, v, w);
				else
					acc0 = WB_NAME(wb_combine)(kind, acc0, v, w);
			}
		}
		WB_STORE(o + o2 * WB_LANES, kind == WB_MAX ? WB_VMAX(acc0, acc1) : WB_VADD(acc0, acc1));
	}
}

#define WB_DEF(NAME, KIND, KH, KW, S1, S2, D1, D2)                                                                     \
	WB_ATTR static void WB_NAME(NAME)(const window *w, const float *t, int64_t wp, const WB_V *wv, WB_V bias,      \
	                                  float *o, int64_t rows)                                                      \
	{                                                                                                              \
		for (int64_t o1 = 0; o1 < rows; o1++)                                                                  \
			WB_NAME(wb_row)                                                                                \
			(KIND, KH, KW, S1, S2, D1, D2, t, wp, wv, bias, o + o1 * w->out[2] * WB_LANES, o1, w->out[2]); \
	}
#define WB_DEF_KIND(K, KIND)                           \
	WB_DEF(wb_##K##_3x3s1, KIND, 3, 3, 1, 1, 1, 1) \
	WB_DEF(wb_##K##_3x3s2, KIND, 3, 3, 2, 2, 1, 1) \
	WB_DEF(wb_##K##_5x5s1, KIND, 5, 5, 1, 1, 1, 1) \
	WB_DEF(wb_##K##_5x5s2, KIND, 5, 5, 2, 2, 1, 1) \
	WB_DEF(wb_##K##_any, KIND, (int)w->k[1], (int)w->k[2], w->s[1], w->s[2], w->d[1], w->d[2])
WB_DEF_KIND(conv, WB_CONV)
WB_DEF_KIND(max, WB_MAX)
WB_DEF_KIND(avg, WB_AVG)

typedef void (*WB_NAME(wb_fn))(const window *w, const float *t, int64_t wp, const WB_V *wv, WB_V bias, float *o,
                               int64_t rows);
/* by kind, then by wb_shape */
static const WB_NAME(wb_fn) WB_NAME(wb_fns)[3][5] = {
        {WB_NAME(wb_conv_3x3s1), WB_NAME(wb_conv_3x3s2), WB_NAME(wb_conv_5x5s1), WB_NAME(wb_conv_5x5s2),
         WB_NAME(wb_conv_any)},
        {WB_NAME(wb_max_3x3s1), WB_NAME(wb_max_3x3s2), WB_NAME(wb_max_5x5s1), WB_NAME(wb_max_5x5s2),
         WB_NAME(wb_max_any)},
        {WB_NAME(wb_avg_3x3s1), WB_NAME(wb_avg_3x3s2), WB_NAME(wb_avg_5x5s1), WB_NAME(wb_avg_5x5s2),
         WB_NAME(wb_avg_any)},
};

/* Blocks [begin, end) of WB_LANES channels (batch-major). */
WB_ATTR static void WB_NAME(wb_task)(void *ctx, int64_t begin, int64_t end, int64_t slot)
{
	const wb_job *j = ctx;
	const window *w = j->w;
	const int64_t L = WB_LANES;
	int64_t in2 = w->in[2], out2 = w->out[2], in_sp = w->in[1] * in2, out_sp = w->out[1] * out2;
	int64_t wp = wb_extent(w, 2), blocks = (j->channels + L - 1) / L, kk = w->k[1] * w->k[2];
	float *t = j->scratch + slot * j->slot_elems, *o = t + wb_rows(w, j->band) * wp * L;
	WB_V pad = WB_SET1(j->kind == WB_MAX ? -INFINITY : 0);
	WB_NAME(wb_fn) fn = WB_NAME(wb_fns)[j->kind][wb_shape(w)];
	WB_V wv[64];
	for (int64_t blk = begin; blk < end; blk++) {
		int64_t n = blk / blocks, c0 = blk % blocks * L, nc = j->channels - c0 < L ? j->channels - c0 : L;
		const float *x = j->x + (n * j->channels + c0) * in_sp;
		float *y = j->y + (n * j->channels + c0) * out_sp;
		WB_V bias = WB_ZERO();
		if (j->kind == WB_CONV) {
			for (int64_t k = 0; k < kk; k++) {
				float v[WB_LANES] = {0};
				for (int64_t ch = 0; ch < nc; ch++)
					v[ch] = j->wt[(c0 + ch) * kk + k];
				wv[k] = WB_LOADU(v);
			}
			if (j->bias)
				bias = WB_MLOAD(WB_MASK(nc), j->bias + c0);
		}
		for (int64_t o1a = 0; o1a < w->out[1]; o1a += j->band) {
			int64_t rows = w->out[1] - o1a < j->band ? w->out[1] - o1a : j->band, tr = wb_rows(w, rows);
			/* the band's padded rows: input rows r0 .. r0 + tr - 1, padding where outside */
			int64_t r0 = o1a * w->s[1] - w->pb[1], ra = r0 < 0 ? 0 : r0,
			        rb = r0 + tr < w->in[1] ? r0 + tr : w->in[1];
			/* with one band the padding stays from block to block */
			for (int64_t i = 0; i < tr && (blk == begin || j->band < w->out[1]); i++) {
				float *row = t + i * wp * L;
				bool inside = r0 + i >= 0 && r0 + i < w->in[1];
				for (int64_t c = 0; c < (inside ? w->pb[2] : wp); c++)
					WB_STORE(row + c * L, pad);
				for (int64_t c = inside ? w->pb[2] + in2 : wp; c < wp; c++)
					WB_STORE(row + c * L, pad);
			}
			for (int64_t p0 = ra * in2; p0 < rb * in2; p0 += L) {
				int64_t np = rb * in2 - p0 < L ? rb * in2 - p0 : L;
				WB_MASK_T m = WB_MASK(np);
				WB_V r[WB_LANES];
				for (int ch = 0; ch < L; ch++) {
					r[ch] = ch < nc ? WB_MLOAD(m, x + ch * in_sp + p0) : WB_ZERO();
					if (ch < nc)
						_mm_prefetch((const char *)(x + ch * in_sp + p0 + WB_PREFETCH),
						             _MM_HINT_T0);
				}
				WB_TRANSPOSE(r);
				for (int64_t l = 0, row = p0 / in2, col = p0 % in2; l < np; l++) {
					WB_STORE(t + ((row - r0) * wp + col + w->pb[2]) * L, r[l]);
					if (++col == in2) {
						col = 0;
						row++;
					}
				}
			}
			fn(w, t, wp, wv, bias, o, rows);
			int64_t q0 = o1a * out2, nq = rows * out2;
			for (int64_t p0 = 0; p0 < nq; p0 += L) {
				int64_t np = nq - p0 < L ? nq - p0 : L;
				WB_MASK_T m = WB_MASK(np);
				WB_V r[WB_LANES];
				for (int l = 0; l < L; l++) {
					r[l] = l < np ? WB_LOAD(o + (p0 + l) * L) : WB_ZERO();
					if (j->kind == WB_AVG && l < np)
						r[l] = WB_VMUL(r[l], WB_SET1(j->recip[q0 + p0 + l]));
				}
				WB_TRANSPOSE(r);
				for (int ch = 0; ch < nc; ch++)
					WB_MSTORE(y + ch * out_sp + q0 + p0, m, r[ch]);
			}
		}
		if (j->act)
			tern_act_run(j->act, y, j->z ? j->z + (n * j->channels + c0) * out_sp : NULL, nc * out_sp);
	}
}

#undef WB_DEF_KIND
#undef WB_DEF
#undef WB_NAME
#undef WB_CAT
#undef WB_CAT2
#undef WB_LANES
#undef WB_ATTR
#undef WB_V
#undef WB_MASK_T
#undef WB_MASK
#undef WB_LOAD
#undef WB_LOADU
#undef WB_STORE
#undef WB_MLOAD
#undef WB_MSTORE
#undef WB_SET1
#undef WB_ZERO
#undef WB_VFMA
#undef WB_VMAX
#undef WB_VADD
#undef WB_VMUL
#undef WB_TRANSPOSE
