/* half.c — float16, bfloat16 and float8 conversions (round to nearest even). */
/* GCC's default -ftrapping-math keeps the float8 loops' selects from being if-converted, so that they
 * would not vectorise; tern never reads the floating-point exception flags. Before the includes, as in
 * elementwise.c. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "internal.h"

float tern_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;
	uint32_t bits;
	if (exp == 0) {
		if (mant == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			exp = 127 - 15 + 1;
			while (!(mant & 0x400)) {
				mant <<= 1;
				exp--;
			}
			mant &= 0x3ff;
			bits = sign | (exp << 23) | (mant << 13);
		}
	} else if (exp == 31) {
		bits = sign | 0x7f800000u | (mant << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t tern_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000;
	uint32_t exp = (x >> 23) & 0xff;
	uint32_t mant = x & 0x7fffff;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
	int32_t e = (int32_t)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		mant |= 0x800000;
		uint32_t shift = (uint32_t)(14 - e);
		uint32_t half = mant >> shift;
		uint32_t rem = mant & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = (uint32_t)(e << 10) | (mant >> 13);
	uint32_t rem = mant & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
		half++; /* may carry into the exponent, which is the right result */
	return (uint16_t)(sign | half);
}

float tern_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t tern_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((x >> 16) | 0x40);
	uint32_t rounding = 0x7fff + ((x >> 16) & 1);
	return (uint16_t)((x + rounding) >> 16);
}

/* ---------------------------------------------------------------- float8 */

/* ONNX's four float8 formats differ in their mantissa width, exponent bias and what their top codes
 * mean: E4M3FN has no infinities and one NaN per sign (S.1111.111); E5M2 is IEEE-like (exponent 31 is
 * infinity or NaN); the FNUZ formats have neither infinities nor -0, and 0x80 is their only NaN. */
enum { F8_FN, F8_IEEE, F8_UZ };

/* Written without branches on the element so that the block loops below vectorise. */
TERN_ISA_BODY float f8_decode(uint32_t v, const int man, const int bias, const int kind)
{
	uint32_t sign = (v & 0x80u) << 24, mag = v & 0x7fu;
	uint32_t exp = mag >> man, frac = mag & ((1u << man) - 1);
	uint32_t bits = ((exp + 127 - bias) << 23) | (frac << (23 - man));
	/* A subnormal is frac times the smallest subnormal, 2^(1 - bias - man): exact in float. */
	uint32_t unit_bits = (uint32_t)(127 + 1 - bias - man) << 23;
	float unit;
	memcpy(&unit, &unit_bits, sizeof unit);
	float sub = (float)frac * unit;
	uint32_t sub_bits;
	memcpy(&sub_bits, &sub, sizeof sub_bits);
	bits = exp == 0 ? sub_bits : bits;
	if (kind == F8_FN)
		bits = mag == 0x7f ? 0x7fc00000u : bits;
	if (kind == F8_IEEE)
		bits = exp == 31 ? (frac ? 0x7fc00000u : 0x7f800000u) : bits;
	bits |= sign;
	if (kind == F8_UZ)
		bits = v == 0x80 ? 0x7fc00000u : bits;
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

/* Rounds to nearest even. `max` is the largest finite code; a value that rounds above it (infinity
 * included) becomes `over`: max when saturating, else infinity (E5M2) or NaN. */
TERN_ISA_BODY uint8_t f8_encode(float f, const int man, const int bias, const int kind, const uint32_t max,
                                uint32_t over)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	uint32_t sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
	/* Normal range: round the float's mantissa to man bits, letting a carry into the exponent happen,
	 * then rebias the exponent. Cannot wrap: a + 2^(22 - man) < 2^32. */
	const int shift = 23 - man;
	uint32_t r = a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1);
	int32_t code = (int32_t)(r >> shift) - ((127 - bias) << man);
	/* Below the smallest normal, 2^(1 - bias), the code is |f| in units of the smallest subnormal,
	 * rounded to an integer by adding and removing 2^23 (nearest even, as the float addition rounds).
	 * The operand is zeroed above that range so that the conversion to int never sees a large value or
	 * NaN. */
	const uint32_t min_normal = (uint32_t)(127 + 1 - bias) << 23;
	uint32_t small_bits = a < min_normal ? a : 0, scale_bits = (uint32_t)(127 + bias + man - 1) << 23;
	float small, scale;
	memcpy(&small, &small_bits, sizeof small);
	memcpy(&scale, &scale_bits, sizeof scale);
	float q = (small * scale + 8388608.0f) - 8388608.0f;
	code = a < min_normal ? (int32_t)q : code;
	uint32_t out = code > (int32_t)max ? over : (uint32_t)code;
	out = a > 0x7f800000u ? (kind == F8_UZ ? 0x80u : 0x7fu) : out;
	/* FNUZ has no -0: a negative value that rounds to zero is +0. Its NaN, 0x80, has the sign bit already. */
	if (kind == F8_UZ)
		return (uint8_t)(out == 0 ? 0 : out | sign);
	return (uint8_t)(out | sign);
}

/* Each format's parameters, for the decoder and the encoder. */
#define F8_E4M3FN 3, 7, F8_FN
#define F8_E4M3FNUZ 3, 8, F8_UZ
#define F8_E5M2 2, 15, F8_IEEE
#define F8_E5M2FNUZ 2, 16, F8_UZ

static uint32_t f8_max(int dtype)
{
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: return 0x7e; /* 448 */
	case TERN_FLOAT8E5M2: return 0x7b; /* 57344 */
	default: return 0x7f; /* 240 (E4M3FNUZ), 57344 (E5M2FNUZ) */
	}
}

static uint32_t f8_over(int dtype, int saturate)
{
	if (saturate)
		return f8_max(dtype);
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: return 0x7f; /* NaN, the sign kept */
	case TERN_FLOAT8E5M2: return 0x7c; /* infinity */
	default: return 0x80; /* the FNUZ NaN */
	}
}

float tern_f8_to_f32(int dtype, uint8_t v)
{
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: return f8_decode(v, F8_E4M3FN);
	case TERN_FLOAT8E4M3FNUZ: return f8_decode(v, F8_E4M3FNUZ);
	case TERN_FLOAT8E5M2: return f8_decode(v, F8_E5M2);
	default: return f8_decode(v, F8_E5M2FNUZ);
	}
}

uint8_t tern_f32_to_f8(int dtype, float f, int saturate)
{
	uint32_t max = f8_max(dtype), over = f8_over(dtype, saturate);
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: return f8_encode(f, F8_E4M3FN, max, over);
	case TERN_FLOAT8E4M3FNUZ: return f8_encode(f, F8_E4M3FNUZ, max, over);
	case TERN_FLOAT8E5M2: return f8_encode(f, F8_E5M2, max, over);
	default: return f8_encode(f, F8_E5M2FNUZ, max, over);
	}
}

/* The block conversions: one loop per format, so that each is specialised to its constants. */
#define F8_DECODE_LOOP(FMT)                      \
	for (int64_t i = 0; i < n; i++)          \
		dst[i] = f8_decode(src[i], FMT); \
	break
TERN_ISA_BODY void f8_to_f32_body(int dtype, const uint8_t *restrict src, float *restrict dst, int64_t n)
{
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: F8_DECODE_LOOP(F8_E4M3FN);
	case TERN_FLOAT8E4M3FNUZ: F8_DECODE_LOOP(F8_E4M3FNUZ);
	case TERN_FLOAT8E5M2: F8_DECODE_LOOP(F8_E5M2);
	default: F8_DECODE_LOOP(F8_E5M2FNUZ);
	}
}
TERN_ISA_VARIANTS2(void, f8_to_f32, (int dtype, const uint8_t *restrict src, float *restrict dst, int64_t n),
                   (dtype, src, dst, n))

#define F8_ENCODE_LOOP(FMT)                                 \
	for (int64_t i = 0; i < n; i++)                     \
		dst[i] = f8_encode(src[i], FMT, max, over); \
	break
TERN_ISA_BODY void f32_to_f8_body(int dtype, const float *restrict src, uint8_t *restrict dst, int64_t n, uint32_t max,
                                  uint32_t over)
{
	switch (dtype) {
	case TERN_FLOAT8E4M3FN: F8_ENCODE_LOOP(F8_E4M3FN);
	case TERN_FLOAT8E4M3FNUZ: F8_ENCODE_LOOP(F8_E4M3FNUZ);
	case TERN_FLOAT8E5M2: F8_ENCODE_LOOP(F8_E5M2);
	default: F8_ENCODE_LOOP(F8_E5M2FNUZ);
	}
}
TERN_ISA_VARIANTS2(void, f32_to_f8,
                   (int dtype, const float *restrict src, uint8_t *restrict dst, int64_t n, uint32_t max,
                    uint32_t over),
                   (dtype, src, dst, n, max, over))

void tern_f8_to_f32_n(int dtype, const uint8_t *src, float *dst, int64_t n)
{
	f8_to_f32(dtype, src, dst, n);
}

void tern_f32_to_f8_n(int dtype, const float *src, uint8_t *dst, int64_t n, int saturate)
{
	f32_to_f8(dtype, src, dst, n, f8_max(dtype), f8_over(dtype, saturate));
}
