/* ops_common.h — helpers shared by the operator families: broadcasting of shapes and the stride tables
 * that walk broadcast inputs row by row, element stores, and float32 math that vectorises. */
#ifndef TERN_OPS_COMMON_H
#define TERN_OPS_COMMON_H

#include "internal.h"

#include <math.h>

/* Broadcasts the shapes of the non-NULL tensors in[0..n) together (numpy rules). */
tern_status tern_broadcast_tensors(const tern_node *node, int n, const tern_tensor *const *in, int *rank,
                                   int64_t *dims);

#define TERN_BCAST_MAX_IN 4

/* The output of a broadcast elementwise operation seen as rows of `inner` elements. Dimensions that
 * every input walks contiguously are merged, so same-shape inputs give one row of numel elements.
 * Within a row, input k advances by inner_stride[k] (1, or 0 when broadcast along the row). */
typedef struct tern_bcast {
	int n_in;
	int rank; /* merged rank, >= 1 */
	int64_t dims[TERN_MAX_RANK];
	int64_t strides[TERN_BCAST_MAX_IN][TERN_MAX_RANK]; /* in elements, 0 where broadcast */
	int64_t numel, inner, rows;
	int64_t inner_stride[TERN_BCAST_MAX_IN];
} tern_bcast;

/* n_in <= TERN_BCAST_MAX_IN inputs whose shapes broadcast to (out_rank, out_dims). */
void tern_bcast_init(tern_bcast *b, int n_in, const tern_tensor *const *in, int out_rank, const int64_t *out_dims);
/* Positions the row counter idx (rank - 1 entries) at `row`; off[k] = input k's element offset. */
void tern_bcast_seek(const tern_bcast *b, int64_t row, int64_t *idx, int64_t *off);
/* Advances idx and off to the next row. */
void tern_bcast_next_row(const tern_bcast *b, int64_t *idx, int64_t *off);

/* Stores v as element i of data of the given numeric type or bool: floats round, integers saturate
 * (NaN gives 0), bool is v != 0. */
void tern_store_f64(int dtype, void *data, int64_t i, double v);

/* Float to integer conversions that saturate and map NaN to 0, where C's conversion is undefined. */
#define TERN_SATURATE(name, T, LO, HI)                                                          \
	static inline T name(double v)                                                          \
	{                                                                                       \
		return v != v ? 0 : v <= (double)(LO) ? (LO) : v >= (double)(HI) ? (HI) : (T)v; \
	}
TERN_SATURATE(tern_sat_i8, int8_t, INT8_MIN, INT8_MAX)
TERN_SATURATE(tern_sat_i16, int16_t, INT16_MIN, INT16_MAX)
TERN_SATURATE(tern_sat_i32, int32_t, INT32_MIN, INT32_MAX)
TERN_SATURATE(tern_sat_i64, int64_t, INT64_MIN, INT64_MAX)
TERN_SATURATE(tern_sat_u8, uint8_t, 0, UINT8_MAX)
TERN_SATURATE(tern_sat_u16, uint16_t, 0, UINT16_MAX)
TERN_SATURATE(tern_sat_u32, uint32_t, 0, UINT32_MAX)
TERN_SATURATE(tern_sat_u64, uint64_t, 0, UINT64_MAX)
#undef TERN_SATURATE

/* Selects without branches. With the default -ftrapping-math GCC will not turn a float ?: into a select,
 * which keeps the loop from vectorising; a select on the bits does vectorise. */
#define TERN_SELECT(name, T, U)                 \
	static inline T name(int c, T a, T b)   \
	{                                       \
		U ua, ub, m = 0u - (U)(c != 0); \
		memcpy(&ua, &a, sizeof ua);     \
		memcpy(&ub, &b, sizeof ub);     \
		U r = (ua & m) | (ub & ~m);     \
		T f;                            \
		memcpy(&f, &r, sizeof f);       \
		return f;                       \
	}
TERN_SELECT(tern_select_f32, float, uint32_t)
TERN_SELECT(tern_select_f64, double, uint64_t)
#undef TERN_SELECT

/* Float32 exp, tanh and erf written without calls or branches so that their loops vectorise; libm's
 * versions stay scalar. Errors are within a few ulp. */
static inline float tern_scale_pow2f(float e, int32_t k)
{
	/* e * 2^k in two factors, so that k from -150 to 128 never builds an out-of-range exponent. */
	int32_t k1 = k / 2, k2 = k - k1;
	uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
	float s1, s2;
	memcpy(&s1, &b1, sizeof s1);
	memcpy(&s2, &b2, sizeof s2);
	return e * s1 * s2;
}

static inline float tern_fast_expf(float x)
{
	/* exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by Cephes' polynomial. Beyond the
	 * clamps the result has already overflowed or underflowed; NaN passes through the arithmetic. */
	float xc = tern_select_f32(x > 88.8f, 88.8f, x);
	xc = tern_select_f32(xc < -104.0f, -104.0f, xc);
	const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer held in the low bits */
	float t = xc * 1.44269504088896341f + magic;
	float n = t - magic;
	float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	int32_t ti;
	memcpy(&ti, &t, sizeof ti);
	return tern_scale_pow2f(p * r * r + r + 1.0f, ti - 0x4B400000);
}

/* exp(x) - 1 without the cancellation near 0: below |x| = 0.5 its Taylor series to x^9 (the next
 * term is under 1.4e-9 of the result), above it exp(x) - 1, whose rounding is then small against
 * the result. */
static inline float tern_fast_expm1f(float x)
{
	float p = 1.0f / 362880;
	p = p * x + 1.0f / 40320;
	p = p * x + 1.0f / 5040;
	p = p * x + 1.0f / 720;
	p = p * x + 1.0f / 120;
	p = p * x + 1.0f / 24;
	p = p * x + 1.0f / 6;
	p = p * x + 0.5f;
	float small = (p * x + 1.0f) * x;
	return tern_select_f32(fabsf(x) < 0.5f, small, tern_fast_expf(x) - 1.0f);
}

/* 1 / (1 + exp(-x)) from e = exp(-|x|) <= 1, which cannot overflow: 2^n 2^f with f in [-1/2, 1/2] by a
 * polynomial (relative error about 2e-7), n >= -126 so that 2^n is built from its exponent bits in one
 * factor. Selects, not branches, so that it vectorises whatever the floating-point flags. */
static inline float tern_fast_sigmoidf(float x)
{
	float ax = fabsf(x), t = ax * -1.44269504f;
	t = tern_select_f32(t < -126.0f, -126.0f, t);
	const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
	float n = (t + magic) - magic, f = t - n;
	float p = 1.535336188319500e-4f;
	p = p * f + 1.339887440266574e-3f;
	p = p * f + 9.618437357674640e-3f;
	p = p * f + 5.550332471162809e-2f;
	p = p * f + 2.402264791363012e-1f;
	p = p * f + 6.931472028550421e-1f;
	p = p * f + 1.0f;
	int32_t bits = ((int32_t)n + 127) << 23;
	float scale;
	memcpy(&scale, &bits, sizeof scale);
	float e = p * scale, r = 1.0f / (1.0f + e);
	return tern_select_f32(x >= 0, r, e * r);
}

static inline float tern_fast_tanhf(float x)
{
	/* Cephes: a polynomial below |x| = 0.625, else 1 - 2 / (exp(2|x|) + 1) with x's sign. */
	float z = x * x;
	float p = -5.70498872745e-3f;
	p = p * z + 2.06390887954e-2f;
	p = p * z - 5.37397155531e-2f;
	p = p * z + 1.33314422036e-1f;
	p = p * z - 3.33332819422e-1f;
	float small = p * z * x + x;
	float ax = fabsf(x);
	float big = copysignf(1.0f - 2.0f / (tern_fast_expf(ax + ax) + 1.0f), x);
	return tern_select_f32(ax < 0.625f, small, big);
}

static inline float tern_fast_erff(float x)
{
	/* Below |x| = 0.5 the Taylor series to x^13; above, erf = 1 - erfc with Numerical Recipes' erfc
	 * (relative error under 1.2e-7). */
	float z = x * x;
	float s = 1.0f / 9360;
	s = s * z - 1.0f / 1320;
	s = s * z + 1.0f / 216;
	s = s * z - 1.0f / 42;
	s = s * z + 1.0f / 10;
	s = s * z - 1.0f / 3;
	float small = x * 1.12837916709551257f * (s * z + 1.0f);
	float ax = fabsf(x);
	float t = 1.0f / (1.0f + 0.5f * ax);
	float q = -0.82215223f + t * 0.17087277f;
	q = 1.48851587f + t * q;
	q = -1.13520398f + t * q;
	q = 0.27886807f + t * q;
	q = -0.18628806f + t * q;
	q = 0.09678418f + t * q;
	q = 0.37409196f + t * q;
	q = 1.00002368f + t * q;
	q = -1.26551223f + t * q;
	float big = copysignf(1.0f - t * tern_fast_expf(q - z), x);
	return tern_select_f32(ax < 0.5f, small, big);
}

#endif
