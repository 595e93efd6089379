/* sigmoid.c — the float logistic function over a row, for Sigmoid and the fused Sigmoid and Silu
 * activations. The arithmetic is tern_fast_sigmoidf's (ops_common.h); on AVX2 and AVX-512 its one
 * division becomes the processor's reciprocal estimate refined by a Newton step (relative error about
 * 1e-7 either way), since the division was half the time of the loop (Silu over 144 x 56 x 56 floats in
 * the first cache). */
/* GCC's default -ftrapping-math keeps the baseline loop's comparisons from vectorising (elementwise.c) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "internal.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#if TERN_HAVE_ISA_TARGETS
#include <immintrin.h>

/* The polynomial for 2^f, f in [-1/2, 1/2], highest power first (tern_fast_sigmoidf's). */
#define SIG_C6 1.535336188319500e-4f
#define SIG_C5 1.339887440266574e-3f
#define SIG_C4 9.618437357674640e-3f
#define SIG_C3 5.550332471162809e-2f
#define SIG_C2 2.402264791363012e-1f
#define SIG_C1 6.931472028550421e-1f

/* sigmoid(s), or s * sigmoid(s) with times. max(-126, t) keeps a NaN (the second operand of the
 * instruction is returned when either is NaN, so the NaN goes second). */
TERN_TARGET_AVX512 static inline __attribute__((always_inline)) __m512 sig16(__m512 s, bool times)
{
	const __m512 one = _mm512_set1_ps(1.0f);
	__m512 t = _mm512_max_ps(_mm512_set1_ps(-126.0f), _mm512_mul_ps(_mm512_abs_ps(s), _mm512_set1_ps(-1.44269504f)));
	__m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, n);
	__m512 p = _mm512_set1_ps(SIG_C6);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SIG_C5));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SIG_C4));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SIG_C3));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SIG_C2));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(SIG_C1));
	p = _mm512_fmadd_ps(p, f, one);
	__m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
	__m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits)), d = _mm512_add_ps(one, e);
	__m512 r = _mm512_rcp14_ps(d);
	r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);
	r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_LT_OQ), e, r);
	return times ? _mm512_mul_ps(r, s) : r;
}

TERN_TARGET_AVX2 static inline __attribute__((always_inline)) __m256 sig8(__m256 s, bool times)
{
	const __m256 one = _mm256_set1_ps(1.0f);
	__m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), s);
	__m256 t = _mm256_max_ps(_mm256_set1_ps(-126.0f), _mm256_mul_ps(ax, _mm256_set1_ps(-1.44269504f)));
	__m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(t, n);
	__m256 p = _mm256_set1_ps(SIG_C6);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SIG_C5));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SIG_C4));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SIG_C3));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SIG_C2));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(SIG_C1));
	p = _mm256_fmadd_ps(p, f, one);
	__m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	__m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits)), d = _mm256_add_ps(one, e);
	/* a 12-bit estimate: one Newton step brings it to about 23 bits */
	__m256 r = _mm256_rcp_ps(d);
	r = _mm256_fmadd_ps(r, _mm256_fnmadd_ps(d, r, one), r);
	r = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_LT_OQ));
	return times ? _mm256_mul_ps(r, s) : r;
}

/* One row: whole vectors through SIG, the rest through tern_fast_sigmoidf. */
#define SIG_ROW(NAME, ATTR, L, LOADU, STOREU, ADD, SIG)                                     \
	ATTR static void NAME(const float *x, const float *add, float *y, int64_t n, bool times) \
	{                                                                                         \
		int64_t i = 0;                                                                    \
		for (; i + L <= n; i += L)                                                        \
			STOREU(y + i, SIG(add ? ADD(LOADU(x + i), LOADU(add + i)) : LOADU(x + i), times)); \
		for (; i < n; i++) {                                                              \
			float s = add ? x[i] + add[i] : x[i];                                     \
			y[i] = times ? s * tern_fast_sigmoidf(s) : tern_fast_sigmoidf(s);          \
		}                                                                                 \
	}
SIG_ROW(sigmoid_avx512, TERN_TARGET_AVX512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, sig16)
SIG_ROW(sigmoid_avx2, TERN_TARGET_AVX2, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, sig8)
#endif

void tern_sigmoid_f32(const float *x, const float *add, float *y, int64_t n, bool times)
{
#if TERN_HAVE_ISA_TARGETS
	if (tern_isa() == TERN_ISA_AVX512) {
		sigmoid_avx512(x, add, y, n, times);
		return;
	}
	if (tern_isa() == TERN_ISA_AVX2) {
		sigmoid_avx2(x, add, y, n, times);
		return;
	}
#endif
	/* one condition-free loop per case, so that the baseline build vectorises it; y may be x, but
	 * every element is read before it is written at the same index (ivdep) */
	if (add) {
		_Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) y[i] = x[i] + add[i];
		x = y;
	}
	if (times) {
		_Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++)
		{
			float s = x[i];
			y[i] = s * tern_fast_sigmoidf(s);
		}
	} else {
		_Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) y[i] = tern_fast_sigmoidf(x[i]);
	}
}
