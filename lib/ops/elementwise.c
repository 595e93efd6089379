/* elementwise.c — elementwise operators: unary math and activations, broadcasting arithmetic, comparison
 * and logic, variadic Sum/Mean/Max/Min, Where, Clip and Cast. Kernels are row functions instantiated
 * per element type by macros; one driver walks the broadcast output and splits it across threads. */
/* GCC's default -ftrapping-math keeps float comparisons from becoming vector selects; tern never reads
 * the floating-point exception flags. Before the includes, as in matmul.c. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "internal.h"
#include "autodiff/grad.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <tgmath.h>

/* Outputs may share storage with input 0 (inplace_ok), but every element is read before it is written at
 * the same index, so the loops carry no dependence and may be vectorised. */
#if defined(__clang__)
#define EW_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define EW_IVDEP _Pragma("GCC ivdep")
#else
#define EW_IVDEP
#endif

#define EW_MAX_IN 3
#define EW_SRC_OUT (-1)
/* Elements converted at a time when 16-bit floats are computed in float. */
#define EW_BLOCK 256
/* Fewest elements worth handing to another thread (the team's workers spin before they sleep). */
#define EW_MIN_CHUNK 4096

/* Values a row kernel reads besides its inputs. */
typedef struct ew_attrs {
	double alpha, beta, gamma; /* activation attributes; gamma is Mean's divisor */
	int64_t flag; /* IsInf: bit 0 detects -inf, bit 1 +inf */
	uint64_t lo, hi; /* Clip bounds: one element's bytes (a float where halves are widened) */
	int from, to; /* Cast and mixed-type Pow: element types */
	int saturate; /* Cast to float8: out-of-range values become the largest finite value */
} ew_attrs;

typedef struct ew_row ew_row;
typedef void (*ew_fn)(const ew_row *r);

/* One pass over the output: out = fn(inputs), the inputs broadcast to the output's shape. */
typedef struct ew_step {
	tern_bcast b;
	int n_in;
	int src[EW_MAX_IN]; /* kernel input index, or EW_SRC_OUT for the output itself */
	ew_fn fn;
	ew_fn inner; /* the float kernel that ew_half_row runs on widened blocks */
	int half; /* the 16-bit float type ew_half_row widens */
	int out_bool; /* ew_half_row: the output is bool and needs no narrowing */
} ew_step;

/* A run of n output elements; input k advances by st[k] (1, or 0 when broadcast along the row). */
struct ew_row {
	const void *in[EW_MAX_IN];
	int64_t st[EW_MAX_IN];
	void *out;
	int64_t n;
	const ew_step *s;
	const ew_attrs *at;
};

typedef struct ew_params {
	ew_attrs at;
	int clip_inputs; /* Clip (opset 11+) reads its bounds from inputs 1 and 2 when they are given */
	int n_steps;
	ew_step steps[];
} ew_params;

/* ---------------------------------------------------------------- row kernels */

/* Loop bodies see the element as v (unary) or x0, x1 (binary), its type as ET, a type in which
 * integer arithmetic wraps without undefined behaviour as WT, and the attributes as at. */
#define EW_TYPES(T, W)                        \
	typedef T ET __attribute__((unused)); \
	typedef W WT __attribute__((unused)); \
	const ew_attrs *at = r->at;           \
	(void)at

#define EW_UNARY_LOOP(T, W, TY, EXPR)               \
	EW_TYPES(T, W);                             \
	const T *x = r->in[0];                      \
	TY *y = r->out;                             \
	EW_IVDEP for (int64_t i = 0; i < r->n; i++) \
	{                                           \
		const T v = x[i];                   \
		y[i] = (TY)(EXPR);                  \
	}

/* One pass of a binary loop; X0 and X1 read the operands (a[i], or a value hoisted out of the loop). */
#define EW_BINARY_PASS(T, TY, EXPR, X0, X1)      \
	EW_IVDEP for (int64_t i = 0; i < n; i++) \
	{                                        \
		const T x0 = (X0), x1 = (X1);    \
		y[i] = (TY)(EXPR);               \
	}

#define EW_BINARY_LOOP(T, W, TY, EXPR)                  \
	EW_TYPES(T, W);                                 \
	const T *a = r->in[0], *b = r->in[1];           \
	TY *y = r->out;                                 \
	const int64_t n = r->n;                         \
	const T a0 = a[0], b0 = b[0];                   \
	if (r->st[0] && r->st[1])                       \
		EW_BINARY_PASS(T, TY, EXPR, a[i], b[i]) \
	else if (r->st[0])                              \
		EW_BINARY_PASS(T, TY, EXPR, a[i], b0)   \
	else if (r->st[1])                              \
		EW_BINARY_PASS(T, TY, EXPR, a0, b[i])   \
	else                                            \
		EW_BINARY_PASS(T, TY, EXPR, a0, b0)

/* X-macro type lists: X(name, expr, suffix, element type, wrapping type). */
#define EW_FLOATS(X, ...) X(__VA_ARGS__, f32, float, float) X(__VA_ARGS__, f64, double, double)
#define EW_SINTS(X, ...)                       \
	X(__VA_ARGS__, i8, int8_t, uint32_t)   \
	X(__VA_ARGS__, i16, int16_t, uint32_t) \
	X(__VA_ARGS__, i32, int32_t, uint32_t) X(__VA_ARGS__, i64, int64_t, uint64_t)
#define EW_UINTS(X, ...)                        \
	X(__VA_ARGS__, u8, uint8_t, uint32_t)   \
	X(__VA_ARGS__, u16, uint16_t, uint32_t) \
	X(__VA_ARGS__, u32, uint32_t, uint32_t) X(__VA_ARGS__, u64, uint64_t, uint64_t)
#define EW_BOOLS(X, ...) X(__VA_ARGS__, b8, uint8_t, uint32_t)
#define EW_INTS(X, ...) EW_SINTS(X, __VA_ARGS__) EW_UINTS(X, __VA_ARGS__)
#define EW_SIGNED(X, ...) EW_FLOATS(X, __VA_ARGS__) EW_SINTS(X, __VA_ARGS__)
#define EW_NUMERIC(X, ...) EW_FLOATS(X, __VA_ARGS__) EW_INTS(X, __VA_ARGS__)

#define EW_DT_f32 TERN_FLOAT
#define EW_DT_f64 TERN_DOUBLE
#define EW_DT_i8 TERN_INT8
#define EW_DT_i16 TERN_INT16
#define EW_DT_i32 TERN_INT32
#define EW_DT_i64 TERN_INT64
#define EW_DT_u8 TERN_UINT8
#define EW_DT_u16 TERN_UINT16
#define EW_DT_u32 TERN_UINT32
#define EW_DT_u64 TERN_UINT64
#define EW_DT_b8 TERN_BOOL

/* Float32 kernels are also built for AVX2 and AVX-512 and run on the path tern_isa() names: two and
 * four times the vector width for the transcendental activations. No FMA contraction happens in ISO C
 * mode, so every build gives the same results (but Sigmoid: sigmoid.c). EW_FN_sfx(F, BODY) defines the row kernel F. */
#define EW_FN_f32(F, ...)                              \
	TERN_ISA_BODY void F##_body(const ew_row *r) \
	{                                              \
		__VA_ARGS__                            \
	}                                              \
	TERN_ISA_VARIANTS3(void, F, (const ew_row *r), (r))
#define EW_FN_PLAIN(F, ...)              \
	static void F(const ew_row *r) \
	{                                \
		__VA_ARGS__              \
	}
#define EW_FN_f64 EW_FN_PLAIN
#define EW_FN_i8 EW_FN_PLAIN
#define EW_FN_i16 EW_FN_PLAIN
#define EW_FN_i32 EW_FN_PLAIN
#define EW_FN_i64 EW_FN_PLAIN
#define EW_FN_u8 EW_FN_PLAIN
#define EW_FN_u16 EW_FN_PLAIN
#define EW_FN_u32 EW_FN_PLAIN
#define EW_FN_u64 EW_FN_PLAIN
#define EW_FN_b8 EW_FN_PLAIN

/* Definers: same-type unary, unary to bool, same-type binary, binary to bool; and a table entry. */
#define EW_U(name, expr, sfx, T, W) EW_FN_##sfx(ew_##name##_##sfx, EW_UNARY_LOOP(T, W, T, expr))
#define EW_UB(name, expr, sfx, T, W) EW_FN_##sfx(ew_##name##_##sfx, EW_UNARY_LOOP(T, W, uint8_t, expr))
#define EW_B(name, expr, sfx, T, W) EW_FN_##sfx(ew_##name##_##sfx, EW_BINARY_LOOP(T, W, T, expr))
#define EW_BB(name, expr, sfx, T, W) EW_FN_##sfx(ew_##name##_##sfx, EW_BINARY_LOOP(T, W, uint8_t, expr))
#define EW_ENTRY(name, expr, sfx, T, W) [EW_DT_##sfx] = ew_##name##_##sfx,

#define EW_TABLE(name, ...) static const ew_fn name##_fns[TERN_DTYPE_COUNT] = {__VA_ARGS__}

/* numpy.clip order (max then min), and softplus without overflow for large v. */
#define EW_UNIT(t) EW_SEL((t) < 0, 0, EW_SEL((t) > 1, 1, (t)))
#define EW_SOFTPLUS(v) ((v) > 0 ? (v) + log1p(exp(-(v))) : log1p(exp(v)))

/* c ? a : b for any element type; integers need no help. */
#define EW_SEL(c, a, b)                                                    \
	_Generic((a) + (b), float                                          \
	         : tern_select_f32((c), (float)(a), (float)(b)), double    \
	         : tern_select_f64((c), (double)(a), (double)(b)), default \
	         : (c) ? (a) : (b))

/* Unary math; tgmath.h picks the float or double function. */
#define EW_MATH(f)               \
	EW_FLOATS(EW_U, f, f(v)) \
	EW_TABLE(f, EW_FLOATS(EW_ENTRY, f, ~));
EW_MATH(floor)
EW_MATH(ceil)
EW_MATH(rint)
EW_MATH(sqrt)
EW_MATH(log)
EW_MATH(sin)
EW_MATH(cos)
EW_MATH(tan)
EW_MATH(asin)
EW_MATH(acos)
EW_MATH(atan)
EW_MATH(sinh)
EW_MATH(cosh)
EW_MATH(asinh)
EW_MATH(acosh)
EW_MATH(atanh)

/* Float32 uses the vectorisable versions. */
#define EW_FAST_MATH(fn)                                  \
	EW_U(fn, tern_fast_##fn##f(v), f32, float, float) \
	EW_U(fn, fn(v), f64, double, double)              \
	EW_TABLE(fn, EW_FLOATS(EW_ENTRY, fn, ~));
EW_FAST_MATH(exp)
EW_FAST_MATH(tanh)
EW_FAST_MATH(erf)

EW_FLOATS(EW_U, abs, fabs(v))
EW_SINTS(EW_U, abs, v < 0 ? (ET)(0 - (WT)v) : v)
EW_UINTS(EW_U, abs, v)
EW_TABLE(abs, EW_NUMERIC(EW_ENTRY, abs, ~));

EW_FLOATS(EW_U, neg, -v)
EW_SINTS(EW_U, neg, (ET)(0 - (WT)v))
EW_TABLE(neg, EW_SIGNED(EW_ENTRY, neg, ~));

/* NaN keeps its sign (numpy.sign gives NaN). */
EW_FLOATS(EW_U, sign, v > 0 ? 1 : v < 0 ? -1 : v)
EW_SINTS(EW_U, sign, (v > 0) - (v < 0))
EW_UINTS(EW_U, sign, v > 0)
EW_TABLE(sign, EW_NUMERIC(EW_ENTRY, sign, ~));

EW_FLOATS(EW_U, reciprocal, 1 / v)
EW_TABLE(reciprocal, EW_FLOATS(EW_ENTRY, reciprocal, ~));

EW_BOOLS(EW_U, not, !v)
EW_TABLE(not, EW_BOOLS(EW_ENTRY, not, ~));

EW_INTS(EW_U, bitwise_not, (ET)~v)
EW_TABLE(bitwise_not, EW_INTS(EW_ENTRY, bitwise_not, ~));

EW_FLOATS(EW_UB, isnan, isnan(v))
EW_TABLE(isnan, EW_FLOATS(EW_ENTRY, isnan, ~));

EW_FLOATS(EW_UB, isinf, isinf(v) && (v > 0 ? at->flag & 2 : at->flag & 1))
EW_TABLE(isinf, EW_FLOATS(EW_ENTRY, isinf, ~));

/* Activations. NaN passes through Relu as numpy.maximum(x, 0) lets it. */
EW_SIGNED(EW_U, relu, EW_SEL(v < 0, 0, v))
EW_TABLE(relu, EW_SIGNED(EW_ENTRY, relu, ~));

EW_FLOATS(EW_U, leaky_relu, EW_SEL(v < 0, v *(ET)at->alpha, v))
EW_TABLE(leaky_relu, EW_FLOATS(EW_ENTRY, leaky_relu, ~));

EW_U(elu, tern_select_f32(v < 0, (float)at->alpha * tern_fast_expm1f(v), v), f32, float, float)
EW_U(elu, v < 0 ? (ET)at->alpha * expm1(v) : v, f64, double, double)
EW_TABLE(elu, EW_FLOATS(EW_ENTRY, elu, ~));

EW_FLOATS(EW_U, selu, v <= 0 ? (ET)at->gamma * ((ET)at->alpha * exp(v) - (ET)at->alpha) : (ET)at->gamma * v)
EW_TABLE(selu, EW_FLOATS(EW_ENTRY, selu, ~));

EW_U(celu, tern_select_f32(v > 0, v, (float)at->alpha * tern_fast_expm1f(v / (float)at->alpha)), f32, float, float)
EW_U(celu, v > 0 ? v : (ET)at->alpha * expm1(v / (ET)at->alpha), f64, double, double)
EW_TABLE(celu, EW_FLOATS(EW_ENTRY, celu, ~));

static void ew_sigmoid_f32(const ew_row *r)
{
	tern_sigmoid_f32(r->in[0], NULL, r->out, r->n, false);
}
EW_U(sigmoid, 1 / (1 + exp(-v)), f64, double, double)
EW_TABLE(sigmoid, EW_FLOATS(EW_ENTRY, sigmoid, ~));

EW_FLOATS(EW_U, hard_sigmoid, EW_UNIT((ET)at->alpha *v + (ET)at->beta))
EW_TABLE(hard_sigmoid, EW_FLOATS(EW_ENTRY, hard_sigmoid, ~));

EW_FLOATS(EW_U, hard_swish, v *EW_UNIT((ET)at->alpha *v + (ET)at->beta))
EW_TABLE(hard_swish, EW_FLOATS(EW_ENTRY, hard_swish, ~));

EW_FLOATS(EW_U, softplus, EW_SOFTPLUS(v))
EW_TABLE(softplus, EW_FLOATS(EW_ENTRY, softplus, ~));

EW_FLOATS(EW_U, softsign, v / (1 + fabs(v)))
EW_TABLE(softsign, EW_FLOATS(EW_ENTRY, softsign, ~));

EW_FLOATS(EW_U, thresholded_relu, EW_SEL(v > (ET)at->alpha, v, 0))
EW_TABLE(thresholded_relu, EW_FLOATS(EW_ENTRY, thresholded_relu, ~));

EW_FLOATS(EW_U, mish, v *tanh(EW_SOFTPLUS(v)))
EW_TABLE(mish, EW_FLOATS(EW_ENTRY, mish, ~));

/* Shrink: alpha is lambd, beta is bias; integers go through double as the float attributes do. */
EW_FLOATS(EW_U, shrink, v<-(ET)at->alpha ? v + (ET)at->beta : v>(ET) at->alpha ? v - (ET)at->beta : 0)
EW_INTS(EW_U, shrink, (double)v<-at->alpha ? (double)v + at->beta : (double)v> at->alpha ? (double)v - at->beta : 0)
EW_TABLE(shrink, EW_NUMERIC(EW_ENTRY, shrink, ~));

/* Mean's last pass. */
EW_FLOATS(EW_U, divide_by, v / (ET)at->gamma)
EW_TABLE(divide_by, EW_FLOATS(EW_ENTRY, divide_by, ~));

/* Clip: bounds in the element type, applied in numpy.clip's order. */
#define EW_CLIP(name, expr, sfx, T, W)                                     \
	EW_FN_##sfx(ew_clip_##sfx, T lo; T hi; memcpy(&lo, &r->at->lo, sizeof lo); \
	            memcpy(&hi, &r->at->hi, sizeof hi); const T *x = r->in[0];    \
	            T *y = r->out; EW_IVDEP for (int64_t i = 0; i < r->n; i++) {  \
		            const T t = EW_SEL(x[i] < lo, lo, x[i]);               \
		            y[i] = EW_SEL(t > hi, hi, t);                          \
	            })
EW_NUMERIC(EW_CLIP, clip, ~)
EW_TABLE(clip, EW_NUMERIC(EW_ENTRY, clip, ~));

/* Binary arithmetic. Integers wrap; integer division by zero gives 0 rather than a trap. */
EW_NUMERIC(EW_B, add, (ET)((WT)x0 + (WT)x1))
EW_TABLE(add, EW_NUMERIC(EW_ENTRY, add, ~));
EW_NUMERIC(EW_B, sub, (ET)((WT)x0 - (WT)x1))
EW_TABLE(sub, EW_NUMERIC(EW_ENTRY, sub, ~));
EW_NUMERIC(EW_B, mul, (ET)((WT)x0 *(WT)x1))
EW_TABLE(mul, EW_NUMERIC(EW_ENTRY, mul, ~));

/* Integer Div truncates, as the reference's float division cast back to the integer type does. */
EW_FLOATS(EW_B, div, x0 / x1)
EW_SINTS(EW_B, div, x1 == 0 ? 0 : x1 == -1 ? (ET)(0 - (WT)x0) : (ET)(x0 / x1))
EW_UINTS(EW_B, div, x1 == 0 ? 0 : (ET)(x0 / x1))
EW_TABLE(div, EW_NUMERIC(EW_ENTRY, div, ~));

/* Mod with fmod=0 takes the divisor's sign (numpy.mod); fmod=1 the dividend's (C fmod). Floats always use
 * fmod, as the reference does. */
EW_FLOATS(EW_B, fmod, fmod(x0, x1))
EW_SINTS(EW_B, fmod, x1 == 0 || x1 == -1 ? 0 : (ET)(x0 % x1))
EW_UINTS(EW_B, fmod, x1 == 0 ? 0 : (ET)(x0 % x1))
EW_TABLE(fmod, EW_NUMERIC(EW_ENTRY, fmod, ~));
EW_SINTS(EW_B, mod,
         x1 == 0 || x1 == -1                                 ? 0
                 : x0 % x1 != 0 && (x0 % x1 < 0) != (x1 < 0) ? (ET)(x0 % x1 + x1)
                                                             : (ET)(x0 % x1))
EW_TABLE(mod, EW_FLOATS(EW_ENTRY, fmod, ~) EW_SINTS(EW_ENTRY, mod, ~) EW_UINTS(EW_ENTRY, fmod, ~));

EW_FLOATS(EW_B, pow, pow(x0, x1))
EW_TABLE(pow, EW_FLOATS(EW_ENTRY, pow, ~));

/* Shifts by the type's width or more give 0, not undefined behaviour. */
EW_UINTS(EW_B, shift_left, x1 >= sizeof(ET) * 8 ? 0 : (ET)((WT)x0 << x1))
EW_TABLE(shift_left, EW_UINTS(EW_ENTRY, shift_left, ~));
EW_UINTS(EW_B, shift_right, x1 >= sizeof(ET) * 8 ? 0 : (ET)(x0 >> x1))
EW_TABLE(shift_right, EW_UINTS(EW_ENTRY, shift_right, ~));

EW_INTS(EW_B, bitwise_and, (ET)(x0 &x1))
EW_TABLE(bitwise_and, EW_INTS(EW_ENTRY, bitwise_and, ~));
EW_INTS(EW_B, bitwise_or, (ET)(x0 | x1))
EW_TABLE(bitwise_or, EW_INTS(EW_ENTRY, bitwise_or, ~));
EW_INTS(EW_B, bitwise_xor, (ET)(x0 ^ x1))
EW_TABLE(bitwise_xor, EW_INTS(EW_ENTRY, bitwise_xor, ~));

EW_BOOLS(EW_B, and, (x0 != 0) & (x1 != 0))
EW_TABLE(and, EW_BOOLS(EW_ENTRY, and, ~));
EW_BOOLS(EW_B, or, (x0 != 0) | (x1 != 0))
EW_TABLE(or, EW_BOOLS(EW_ENTRY, or, ~));
EW_BOOLS(EW_B, xor, (x0 != 0) ^ (x1 != 0))
EW_TABLE(xor, EW_BOOLS(EW_ENTRY, xor, ~));

EW_NUMERIC(EW_BB, equal, x0 == x1)
EW_BOOLS(EW_BB, equal, (x0 != 0) == (x1 != 0))
/* Strings compare by value; an element never written reads as "". */
static void ew_equal_str(const ew_row *r)
{
	char *const *a = r->in[0], *const *b = r->in[1];
	uint8_t *y = r->out;
	for (int64_t i = 0; i < r->n; i++) {
		const char *x0 = a[i * r->st[0]], *x1 = b[i * r->st[1]];
		y[i] = strcmp(x0 ? x0 : "", x1 ? x1 : "") == 0;
	}
}
EW_TABLE(equal, EW_NUMERIC(EW_ENTRY, equal, ~) EW_BOOLS(EW_ENTRY, equal, ~)[TERN_STRING] = ew_equal_str);
EW_NUMERIC(EW_BB, less, x0 < x1)
EW_TABLE(less, EW_NUMERIC(EW_ENTRY, less, ~));
EW_NUMERIC(EW_BB, less_equal, x0 <= x1)
EW_TABLE(less_equal, EW_NUMERIC(EW_ENTRY, less_equal, ~));
EW_NUMERIC(EW_BB, greater, x0 > x1)
EW_TABLE(greater, EW_NUMERIC(EW_ENTRY, greater, ~));
EW_NUMERIC(EW_BB, greater_equal, x0 >= x1)
EW_TABLE(greater_equal, EW_NUMERIC(EW_ENTRY, greater_equal, ~));

/* Max and Min propagate NaN from either side, as numpy.maximum does. */
EW_FLOATS(EW_B, max, EW_SEL(x0 > x1 || x0 != x0, x0, x1))
EW_INTS(EW_B, max, x0 > x1 ? x0 : x1)
EW_TABLE(max, EW_NUMERIC(EW_ENTRY, max, ~));
EW_FLOATS(EW_B, min, EW_SEL(x0 < x1 || x0 != x0, x0, x1))
EW_INTS(EW_B, min, x0 < x1 ? x0 : x1)
EW_TABLE(min, EW_NUMERIC(EW_ENTRY, min, ~));

EW_FLOATS(EW_B, prelu, EW_SEL(x0 < 0, x0 *x1, x0))
EW_SINTS(EW_B, prelu, x0 < 0 ? (ET)((WT)x0 * (WT)x1) : x0)
EW_UINTS(EW_B, prelu, ((void)x1, x0))
EW_TABLE(prelu, EW_NUMERIC(EW_ENTRY, prelu, ~));

/* tern's backward operators, for the gradients (below) of the activations that training runs most:
 * tern.ReluGrad(dY, Y) is dY where Y > 0, else 0 (Y is Relu's output; its input gives the same mask);
 * tern.SigmoidGrad(dY, Y) is dY Y (1 - Y) and tern.TanhGrad(dY, Y) dY (1 - Y^2), Y the forward
 * output. One pass each, where the compositions of ONNX operators take three with two temporaries
 * (Relu's a bool mask and a Where). */
EW_FLOATS(EW_B, relu_grad, EW_SEL(x1 > 0, x0, 0))
EW_TABLE(relu_grad, EW_FLOATS(EW_ENTRY, relu_grad, ~));
EW_FLOATS(EW_B, sigmoid_grad, x0 *(x1 *(1 - x1)))
EW_TABLE(sigmoid_grad, EW_FLOATS(EW_ENTRY, sigmoid_grad, ~));
EW_FLOATS(EW_B, tanh_grad, x0 *(1 - x1 * x1))
EW_TABLE(tanh_grad, EW_FLOATS(EW_ENTRY, tanh_grad, ~));

/* Copies, by element size: Sum/Max/Min of one input, Cast to the same type. */
EW_UINTS(EW_U, copy, v)
static ew_fn ew_copy_fn(int dtype)
{
	switch (tern_dtype_size(dtype)) {
	case 1: return ew_copy_u8;
	case 2: return ew_copy_u16;
	case 4: return ew_copy_u32;
	case 8: return ew_copy_u64;
	default: return NULL;
	}
}

/* Where selects by element size; inputs may each be broadcast. Both sides are read and the condition
 * selects their bits through a mask, so that a condition without pattern (a gradient's mask) costs no
 * branch mispredictions and the common layouts vectorise. */
#define EW_WHERE_PASS(T, X, Z)                                            \
	EW_IVDEP for (int64_t i = 0; i < n; i++)                          \
	{                                                                 \
		const T m = (T)((T)0 - (T)(c[i] != 0)), a = (X), b = (Z); \
		y[i] = (T)((a & m) | (b & (T)~m));                        \
	}
#define EW_WHERE(name, expr, sfx, T, W)                                              \
	static void ew_where_##sfx(const ew_row *r)                                  \
	{                                                                            \
		const uint8_t *c = r->in[0];                                         \
		const T *x = r->in[1], *z = r->in[2];                                \
		T *y = r->out;                                                       \
		const int64_t sc = r->st[0], sx = r->st[1], sz = r->st[2], n = r->n; \
		const T x0 = x[0], z0 = z[0];                                        \
		if (sc && sx && sz)                                                  \
			EW_WHERE_PASS(T, x[i], z[i])                                 \
		else if (sc && sx)                                                   \
			EW_WHERE_PASS(T, x[i], z0)                                   \
		else if (sc && sz)                                                   \
			EW_WHERE_PASS(T, x0, z[i])                                   \
		else                                                                 \
			for (int64_t i = 0; i < n; i++)                              \
				y[i] = c[i * sc] ? x[i * sx] : z[i * sz];            \
	}
EW_UINTS(EW_WHERE, where, ~)

/* ---------------------------------------------------------------- conversions */

/* Converting v to each destination: integers from integers wrap (numpy's astype), from floats
 * saturate (tern_sat_*); bool is v != 0. */
#define EW_TO_INT(sfx, T, v) _Generic((v), float : tern_sat_##sfx(v), double : tern_sat_##sfx(v), default : (T)(v))
#define EW_CVT_f32(v) ((float)(v))
#define EW_CVT_f64(v) ((double)(v))
#define EW_CVT_i8(v) EW_TO_INT(i8, int8_t, v)
#define EW_CVT_i16(v) EW_TO_INT(i16, int16_t, v)
#define EW_CVT_i32(v) EW_TO_INT(i32, int32_t, v)
#define EW_CVT_i64(v) EW_TO_INT(i64, int64_t, v)
#define EW_CVT_u8(v) EW_TO_INT(u8, uint8_t, v)
#define EW_CVT_u16(v) EW_TO_INT(u16, uint16_t, v)
#define EW_CVT_u32(v) EW_TO_INT(u32, uint32_t, v)
#define EW_CVT_u64(v) EW_TO_INT(u64, uint64_t, v)
#define EW_CVT_b8(v) ((uint8_t)((v) != 0))

/* Cast kernels for every pair of source (EW_NUMERIC; bool reads as uint8) and destination. The
 * destinations are a list of their own so that it can expand inside the sources' list. */
#define EW_CAST_DESTS(X, ...)         \
	X(__VA_ARGS__, f32, float)    \
	X(__VA_ARGS__, f64, double)   \
	X(__VA_ARGS__, i8, int8_t)    \
	X(__VA_ARGS__, i16, int16_t)  \
	X(__VA_ARGS__, i32, int32_t)  \
	X(__VA_ARGS__, i64, int64_t)  \
	X(__VA_ARGS__, u8, uint8_t)   \
	X(__VA_ARGS__, u16, uint16_t) \
	X(__VA_ARGS__, u32, uint32_t) X(__VA_ARGS__, u64, uint64_t) X(__VA_ARGS__, b8, uint8_t)
#define EW_CAST_DEF(ssfx, TF, dsfx, TT)                                                 \
	static void ew_cast_##ssfx##_##dsfx(const ew_row *r)                            \
	{                                                                               \
		const TF *x = r->in[0];                                                 \
		TT *y = r->out;                                                         \
		EW_IVDEP for (int64_t i = 0; i < r->n; i++) y[i] = EW_CVT_##dsfx(x[i]); \
	}
#define EW_CAST_DEFS_FROM(unused, ssfx, TF, W) EW_CAST_DESTS(EW_CAST_DEF, ssfx, TF)
EW_NUMERIC(EW_CAST_DEFS_FROM, ~)
#define EW_CAST_ENTRY(ssfx, TF, dsfx, TT) [EW_DT_##dsfx] = ew_cast_##ssfx##_##dsfx,
#define EW_CAST_ROW(unused, ssfx, TF, W) [EW_DT_##ssfx] = {EW_CAST_DESTS(EW_CAST_ENTRY, ssfx, TF)},
static const ew_fn ew_cast_fns[TERN_DTYPE_COUNT][TERN_DTYPE_COUNT] = {EW_NUMERIC(EW_CAST_ROW, ~)};

static bool ew_is_half(int dtype)
{
	return dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16;
}

static bool ew_is_f8(int dtype)
{
	return dtype >= TERN_FLOAT8E4M3FN && dtype <= TERN_FLOAT8E5M2FNUZ;
}

static bool ew_is_int(int dtype)
{
	return dtype != TERN_BOOL && dtype < TERN_DTYPE_COUNT && (TERN_DT_INTS & (1u << dtype));
}

/* Cast to bfloat16 truncates, as the ONNX reference does; arithmetic results round to nearest even. */
static void ew_narrow(int dtype, const float *src, uint16_t *dst, int64_t n, bool truncate)
{
	if (dtype != TERN_BFLOAT16 || !truncate) {
		tern_f32_to_half(dtype, src, dst, n);
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		uint32_t bits;
		memcpy(&bits, &src[i], sizeof bits);
		dst[i] = (uint16_t)(bits >> 16);
	}
}

/* 16-bit floats: widen blocks to float, run the float kernel, narrow the result back. */
static void ew_half_row(const ew_row *r)
{
	const ew_step *s = r->s;
	float xb[EW_MAX_IN][EW_BLOCK], yb[EW_BLOCK];
	ew_row sub = *r;
	for (int k = 0; k < s->n_in; k++) {
		sub.in[k] = xb[k];
		if (!r->st[k])
			tern_half_to_f32(s->half, r->in[k], xb[k], 1);
	}
	for (int64_t o = 0; o < r->n; o += EW_BLOCK) {
		int64_t m = r->n - o < EW_BLOCK ? r->n - o : EW_BLOCK;
		for (int k = 0; k < s->n_in; k++)
			if (r->st[k])
				tern_half_to_f32(s->half, (const uint16_t *)r->in[k] + o, xb[k], m);
		sub.out = s->out_bool ? (void *)((uint8_t *)r->out + o) : (void *)yb;
		sub.n = m;
		s->inner(&sub);
		if (!s->out_bool)
			ew_narrow(s->half, yb, (uint16_t *)r->out + o, m, false);
	}
}

/* Cast where either side is a 16-bit float or a float8: through a float block, as the ONNX reference
 * converts (a double or an integer is rounded to float before it becomes a float8). */
static void ew_cast_via_float(const ew_row *r)
{
	int from = r->at->from == TERN_BOOL ? TERN_UINT8 : r->at->from, to = r->at->to;
	size_t from_size = tern_dtype_size(from), to_size = tern_dtype_size(to);
	float buf[EW_BLOCK];
	for (int64_t o = 0; o < r->n; o += EW_BLOCK) {
		int64_t m = r->n - o < EW_BLOCK ? r->n - o : EW_BLOCK;
		const char *src = (const char *)r->in[0] + (size_t)o * from_size;
		char *dst = (char *)r->out + (size_t)o * to_size;
		/* A float side is read or written in place rather than through the block. */
		float *fb = to == TERN_FLOAT ? (float *)dst : buf;
		ew_row sub = *r;
		sub.n = m;
		if (from == TERN_FLOAT) {
			fb = (float *)src; /* to is not float: that would be a copy */
		} else if (ew_is_half(from)) {
			tern_half_to_f32(from, (const uint16_t *)src, fb, m);
		} else if (ew_is_f8(from)) {
			tern_f8_to_f32_n(from, (const uint8_t *)src, fb, m);
		} else {
			sub.in[0] = src;
			sub.out = fb;
			ew_cast_fns[from][TERN_FLOAT](&sub);
		}
		if (ew_is_half(to)) {
			ew_narrow(to, fb, (uint16_t *)dst, m, true);
		} else if (ew_is_f8(to)) {
			tern_f32_to_f8_n(to, fb, (uint8_t *)dst, m, r->at->saturate);
		} else if (to != TERN_FLOAT) {
			sub.in[0] = fb;
			sub.out = dst;
			ew_cast_fns[TERN_FLOAT][to](&sub);
		}
	}
}

/* Pow with base and exponent of different types: computed in double (integers exactly when both are
 * integers and the exponent is not negative), stored as the base's type. */
static int64_t ew_ipow(int64_t b, int64_t e)
{
	uint64_t result = 1, base = (uint64_t)b;
	for (; e > 0; e >>= 1) {
		if (e & 1)
			result *= base;
		base *= base;
	}
	return (int64_t)result;
}

static void ew_store_i64(int dtype, void *p, int64_t i, int64_t v)
{
	switch (dtype) {
	case TERN_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
	case TERN_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
	case TERN_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
	case TERN_INT64: ((int64_t *)p)[i] = v; break;
	case TERN_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
	case TERN_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; break;
	case TERN_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
	case TERN_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
	default: tern_store_f64(dtype, p, i, (double)v); break;
	}
}

static void ew_pow_mixed(const ew_row *r)
{
	/* Views for tern_tensor_get_*, which read one element of a given type. */
	const tern_tensor base = {.dtype = r->at->from, .data = (void *)r->in[0]};
	const tern_tensor expo = {.dtype = r->at->to, .data = (void *)r->in[1]};
	bool ints = ew_is_int(base.dtype) && ew_is_int(expo.dtype);
	for (int64_t i = 0; i < r->n; i++) {
		int64_t ib = i * r->st[0], ie = i * r->st[1];
		if (ints && tern_tensor_get_i64(&expo, ie) >= 0)
			ew_store_i64(base.dtype, r->out, i,
			             ew_ipow(tern_tensor_get_i64(&base, ib), tern_tensor_get_i64(&expo, ie)));
		else
			tern_store_f64(base.dtype, r->out, i,
			               pow(tern_tensor_get_f64(&base, ib), tern_tensor_get_f64(&expo, ie)));
	}
}

/* ---------------------------------------------------------------- strings */

/* Cast to and from STRING follows numpy's astype, which the ONNX reference calls: numbers are written
 * as str() writes a numpy scalar of their type (the shortest digits that read back as the same value;
 * positional from 1e-4 up to 1e16, scientific with a two-digit exponent outside), and strings are read
 * as Python's float() and int() read them. */

/* Reads a decimal as the type whose shortest digits are sought (so that the round trip is checked in
 * that type). */
typedef double (*ew_read_fn)(const char *s);
static double ew_read_f64(const char *s)
{
	return strtod(s, NULL);
}
static double ew_read_f32(const char *s)
{
	return strtof(s, NULL);
}
static double ew_read_f16(const char *s)
{
	return tern_f16_to_f32(tern_f32_to_f16(strtof(s, NULL)));
}

/* The shortest digits of a > 0 (finite) that read back as a, into digits (NUL-terminated, no trailing
 * zeros); returns the decimal exponent of the first digit. printf's correctly rounded p digits are the
 * closest p-digit decimal; when they miss, a neighbour on the other side of a may still hit (the
 * rounding interval is lopsided at powers of two), so those are tried before a longer length. */
static int ew_shortest(double a, int max_digits, ew_read_fn read, char *digits)
{
	char buf[40];
	uint64_t d = 0;
	int e = 0; /* a = d * 10^e */
	for (int p = 1; p <= max_digits; p++) {
		snprintf(buf, sizeof buf, "%.*e", p - 1, a);
		const char *x = strchr(buf, 'e');
		d = 0;
		for (const char *c = buf; c < x; c++)
			if (*c != '.')
				d = d * 10 + (uint64_t)(*c - '0');
		e = atoi(x + 1) - (p - 1);
		const uint64_t tries[3] = {d, d - 1, d + 1};
		bool found = false;
		for (int t = 0; t < 3 && !found; t++) {
			if (tries[t] == 0)
				continue;
			snprintf(buf, sizeof buf, "%llue%d", (unsigned long long)tries[t], e);
			if (read(buf) == a) {
				d = tries[t];
				found = true;
			}
		}
		if (found)
			break;
	}
	/* max_digits always round-trips, so d holds the answer here. */
	for (; d % 10 == 0; d /= 10)
		e++;
	int n = snprintf(digits, 24, "%llu", (unsigned long long)d);
	return e + n - 1;
}

static void ew_format_real(double v, int max_digits, ew_read_fn read, char *out, size_t size)
{
	if (v != v) {
		snprintf(out, size, "nan");
		return;
	}
	if (isinf(v) || v == 0) {
		snprintf(out, size, "%s%s", signbit(v) ? "-" : "", v == 0 ? "0.0" : "inf");
		return;
	}
	const char *sign = v < 0 ? "-" : "";
	double a = fabs(v);
	char dg[24];
	int x = ew_shortest(a, max_digits, read, dg), n = (int)strlen(dg);
	if (a < 1e-4 || a >= 1e16) /* d.ddde+XX */
		snprintf(out, size, "%s%c%s%se%+03d", sign, dg[0], n > 1 ? "." : "", dg + 1, x);
	else if (x < 0) /* 0.000ddd */
		snprintf(out, size, "%s0.%.*s%s", sign, -x - 1, "0000", dg);
	else if (n <= x + 1) /* ddd000.0 */
		snprintf(out, size, "%s%s%.*s.0", sign, dg, x + 1 - n, "0000000000000000");
	else /* ddd.ddd */
		snprintf(out, size, "%s%.*s.%s", sign, x + 1, dg, dg + x + 1);
}

/* Element i of x (any type but STRING) as numpy's str() writes it. bfloat16 and float8 are widened to
 * float first, as the reference does. */
static void ew_format_elem(const tern_tensor *x, int64_t i, char *out, size_t size)
{
	const void *d = x->data;
	switch (x->dtype) {
	case TERN_DOUBLE: ew_format_real(((const double *)d)[i], 17, ew_read_f64, out, size); break;
	case TERN_FLOAT: ew_format_real(((const float *)d)[i], 9, ew_read_f32, out, size); break;
	case TERN_FLOAT16: ew_format_real(tern_f16_to_f32(((const uint16_t *)d)[i]), 5, ew_read_f16, out, size); break;
	case TERN_BFLOAT16:
		ew_format_real(tern_bf16_to_f32(((const uint16_t *)d)[i]), 9, ew_read_f32, out, size);
		break;
	case TERN_BOOL: snprintf(out, size, "%s", ((const uint8_t *)d)[i] ? "True" : "False"); break;
	case TERN_UINT64: snprintf(out, size, "%llu", (unsigned long long)((const uint64_t *)d)[i]); break;
	default:
		if (ew_is_f8(x->dtype))
			ew_format_real(tern_f8_to_f32(x->dtype, ((const uint8_t *)d)[i]), 9, ew_read_f32, out, size);
		else
			snprintf(out, size, "%lld", (long long)tern_tensor_get_i64(x, i));
		break;
	}
}

/* s without the white space around it, as Python's float() and int() skip it; false when empty. */
static bool ew_trim(const char *s, const char **begin, size_t *len)
{
	while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r')))
		n--;
	*begin = s;
	*len = n;
	return n > 0;
}

/* Python's float(): decimal or scientific, "nan", "inf" or "infinity" in any case, with a sign. strtod
 * reads those too, and also hexadecimal and "nan(...)", which Python does not. */
static bool ew_parse_real(const char *s, double *v)
{
	const char *b;
	size_t n;
	char buf[128];
	if (!ew_trim(s, &b, &n) || n >= sizeof buf)
		return false;
	memcpy(buf, b, n);
	buf[n] = '\0';
	const char *digits = buf + (buf[0] == '+' || buf[0] == '-');
	if (digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X'))
		return false;
	if (strchr(buf, '('))
		return false;
	char *end;
	*v = strtod(buf, &end);
	return end != buf && *end == '\0';
}

/* Python's int(): decimal digits with a sign; false when the value does not fit 64 bits. */
static bool ew_parse_int(const char *s, bool unsigned64, int64_t *v)
{
	const char *b;
	size_t n;
	char buf[32];
	if (!ew_trim(s, &b, &n) || n >= sizeof buf)
		return false;
	memcpy(buf, b, n);
	buf[n] = '\0';
	for (size_t k = buf[0] == '+' || buf[0] == '-'; k < n; k++)
		if (buf[k] < '0' || buf[k] > '9')
			return false;
	char *end;
	errno = 0;
	if (unsigned64 && buf[0] != '-')
		*v = (int64_t)strtoull(buf, &end, 10);
	else
		*v = strtoll(buf, &end, 10);
	return errno == 0 && end != buf && *end == '\0';
}

/* Stores string s as element i of y (any type but STRING): reals through double (float8 and bfloat16
 * through float, as the reference reads them), integers wrapping as numpy's astype does, bool true
 * when the string is not empty (Python's truth value of a str). */
static bool ew_parse_elem(const char *s, tern_tensor *y, int64_t i, int saturate)
{
	int dt = y->dtype;
	if (dt == TERN_BOOL) {
		((uint8_t *)y->data)[i] = *s != '\0';
		return true;
	}
	if (ew_is_int(dt)) {
		int64_t v;
		if (!ew_parse_int(s, dt == TERN_UINT64, &v))
			return false;
		ew_store_i64(dt, y->data, i, v);
		return true;
	}
	double v;
	if (!ew_parse_real(s, &v))
		return false;
	if (ew_is_f8(dt))
		((uint8_t *)y->data)[i] = tern_f32_to_f8(dt, (float)v, saturate);
	else if (dt == TERN_BFLOAT16)
		ew_narrow(dt, &(float){(float)v}, (uint16_t *)y->data + i, 1, true);
	else
		tern_store_f64(dt, y->data, i, v);
	return true;
}

/* Cast with a STRING side. Not a row kernel: a string may fail to parse, and every output string is
 * an allocation of its own (the output tensor owns them). */
static tern_status ew_cast_string_kernel(const tern_kernel_args *a)
{
	const ew_params *e = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(x);
	char buf[64];
	for (int64_t i = 0; i < n; i++) {
		const char *s = x->dtype == TERN_STRING ? ((char *const *)x->data)[i] : NULL;
		if (x->dtype == TERN_STRING && !s)
			s = "";
		if (y->dtype != TERN_STRING) {
			if (!ew_parse_elem(s, y, i, e->at.saturate))
				return tern_node_errorf(a->node, TERN_EDATA,
				                        "element %lld of input 0, \"%.40s\", does not read as %s",
				                        (long long)i, s, tern_dtype_name(y->dtype));
			continue;
		}
		if (!s) {
			ew_format_elem(x, i, buf, sizeof buf);
			s = buf;
		}
		if (!(((char **)y->data)[i] = tern_strdup(s)))
			return tern_node_errorf(a->node, TERN_EOS, "out of memory");
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- driver */

/* Bytes per element as stored: a string element is a char pointer. */
static size_t ew_elem_size(int dtype)
{
	return dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(dtype);
}

typedef struct ew_job {
	const ew_step *s;
	const ew_attrs *at;
	const char *in[EW_MAX_IN];
	size_t in_size[EW_MAX_IN];
	char *out;
	size_t out_size;
	int64_t chunk;
} ew_job;

/* Output elements [c * chunk, (c + 1) * chunk), row piece by row piece. */
static void ew_run_chunk(void *ctx, int64_t c)
{
	const ew_job *j = ctx;
	const tern_bcast *b = &j->s->b;
	int64_t start = c * j->chunk;
	int64_t end = b->numel - start < j->chunk ? b->numel : start + j->chunk;
	int64_t idx[TERN_MAX_RANK], off[TERN_BCAST_MAX_IN];
	int64_t col = start % b->inner;
	tern_bcast_seek(b, start / b->inner, idx, off);
	ew_row r = {.s = j->s, .at = j->at};
	for (int k = 0; k < j->s->n_in; k++)
		r.st[k] = b->inner_stride[k];
	while (start < end) {
		int64_t n = b->inner - col < end - start ? b->inner - col : end - start;
		for (int k = 0; k < j->s->n_in; k++)
			r.in[k] = j->in[k] + (size_t)(off[k] + col * r.st[k]) * j->in_size[k];
		r.out = j->out + (size_t)start * j->out_size;
		r.n = n;
		j->s->fn(&r);
		start += n;
		col = 0;
		tern_bcast_next_row(b, idx, off);
	}
}

static void ew_run_step(const tern_kernel_args *a, const ew_step *s, const ew_attrs *at)
{
	const tern_tensor *out = a->out[0];
	int64_t numel = s->b.numel;
	if (numel == 0)
		return;
	ew_job j = {.s = s, .at = at, .out = out->data, .out_size = ew_elem_size(out->dtype), .chunk = numel};
	for (int k = 0; k < s->n_in; k++) {
		const tern_tensor *t = s->src[k] == EW_SRC_OUT ? out : a->in[s->src[k]];
		j.in[k] = t->data;
		j.in_size[k] = ew_elem_size(t->dtype);
	}
	int threads = a->pool ? tern_threadpool_size(a->pool) : 1;
	if (threads > 1 && numel > EW_MIN_CHUNK) {
		/* A few chunks per thread evens out uneven progress; multiples of 64 elements keep threads off
		 * each other's cache lines. */
		int64_t chunk = (numel + threads * 4 - 1) / (threads * 4);
		if (chunk < EW_MIN_CHUNK)
			chunk = EW_MIN_CHUNK;
		j.chunk = (chunk + 63) & ~(int64_t)63;
	}
	int64_t n_chunks = (numel + j.chunk - 1) / j.chunk;
	if (n_chunks == 1)
		ew_run_chunk(&j, 0);
	else
		tern_parallel_for(a->pool, n_chunks, ew_run_chunk, &j);
}

static tern_status ew_kernel(const tern_kernel_args *a)
{
	const ew_params *e = a->params;
	ew_attrs at = e->at;
	if (e->clip_inputs) {
		int dtype = a->in[0]->dtype;
		for (int k = 1; k <= 2; k++) {
			const tern_tensor *t = k < a->n_in ? a->in[k] : NULL;
			if (!t)
				continue;
			uint64_t *bound = k == 1 ? &at.lo : &at.hi;
			if (ew_is_half(dtype)) {
				float f = (float)tern_tensor_get_f64(t, 0);
				memcpy(bound, &f, sizeof f);
			} else {
				memcpy(bound, t->data, tern_dtype_size(dtype));
			}
		}
	}
	for (int s = 0; s < e->n_steps; s++)
		ew_run_step(a, &e->steps[s], &at);
	return TERN_OK;
}

/* ---------------------------------------------------------------- planning */

static const char *ew_input_name(const tern_node *node, int i)
{
	return (size_t)i < node->n_inputs && node->inputs[i] ? node->inputs[i]->name : "";
}

static ew_params *ew_params_new(tern_prepare_args *p, int n_steps)
{
	ew_params *e = calloc(1, sizeof *e + (size_t)n_steps * sizeof(ew_step));
	if (!e)
		return NULL;
	e->n_steps = n_steps;
	p->params = e;
	p->free_params = free;
	p->kernel = ew_kernel;
	return e;
}

/* The step reads the given inputs (or the output) with shapes `view` broadcast to the output. */
static void ew_step_init(ew_step *s, const tern_prepare_args *p, int n_in, const int *src,
                         const tern_tensor *const *view)
{
	s->n_in = n_in;
	for (int k = 0; k < n_in; k++)
		s->src[k] = src[k];
	tern_bcast_init(&s->b, n_in, view, p->out[0]->rank, p->out[0]->dims);
}

/* Chooses the kernel for dtype from a table; 16-bit floats run the float kernel on widened blocks. */
static tern_status ew_pick(const tern_node *node, const ew_fn *fns, int dtype, bool out_bool, ew_step *s)
{
	if (dtype > 0 && dtype < TERN_DTYPE_COUNT && fns[dtype]) {
		s->fn = fns[dtype];
		return TERN_OK;
	}
	if (ew_is_half(dtype) && fns[TERN_FLOAT]) {
		s->fn = ew_half_row;
		s->inner = fns[TERN_FLOAT];
		s->half = dtype;
		s->out_bool = out_bool;
		return TERN_OK;
	}
	return tern_node_errorf(node, TERN_EDATA, "input 0 '%s' has type %s, which %s does not support",
	                        ew_input_name(node, 0), tern_dtype_name(dtype), node->op_type);
}

static bool ew_same_shape(const tern_tensor *a, const tern_tensor *b)
{
	return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

/* Inputs 0..n-1 must be present and of one type. */
static tern_status ew_check_inputs(const tern_prepare_args *p, int first, int n)
{
	if (!p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "output 0 is missing");
	if (p->n_in < first + n)
		return tern_node_errorf(p->node, TERN_EDATA, "has %d inputs, needs %d", p->n_in, first + n);
	for (int i = first; i < first + n; i++) {
		if (!p->in[i])
			return tern_node_errorf(p->node, TERN_EDATA, "input %d is missing", i);
		if (p->in[i]->dtype != p->in[first]->dtype)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input %d '%s' has type %s, input %d '%s' has type %s", i,
			                        ew_input_name(p->node, i), tern_dtype_name(p->in[i]->dtype), first,
			                        ew_input_name(p->node, first), tern_dtype_name(p->in[first]->dtype));
	}
	return TERN_OK;
}

/* Before opset 7, B broadcast to A only with broadcast=1, its dimensions placed at `axis` (default: the
 * trailing ones). The returned view gives B the equivalent numpy shape. */
static tern_status ew_legacy_view(const tern_prepare_args *p, tern_tensor *view)
{
	const tern_tensor *a = p->in[0], *b = p->in[1];
	*view = *b;
	if (p->node->opset >= 7 || !tern_attr_int(p->node, "broadcast", 0))
		return TERN_OK;
	int64_t axis = tern_attr_int(p->node, "axis", a->rank - b->rank);
	if (axis < 0)
		axis += a->rank;
	if (axis < 0 || axis + b->rank > a->rank)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "axis %lld does not place input 1's %d dimensions within rank %d",
		                        (long long)axis, b->rank, a->rank);
	view->rank = a->rank;
	for (int i = 0; i < view->rank; i++)
		view->dims[i] = i < axis || i >= axis + b->rank ? 1 : b->dims[i - axis];
	return TERN_OK;
}

/* Unary (arity 1) or broadcasting binary (arity 2) map with one kernel table. Input 1 is read with
 * the shape b_shape when that is given (its data is the same), else as ew_legacy_view sees it. */
static tern_status ew_prepare_map_as(tern_prepare_args *p, int arity, bool out_bool, const ew_fn *fns,
                                     const tern_tensor *b_shape, ew_params **out)
{
	tern_status st = ew_check_inputs(p, 0, arity);
	if (st)
		return st;
	const tern_tensor *view[2] = {p->in[0], p->in[0]};
	tern_tensor b_view;
	int rank = p->in[0]->rank;
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, p->in[0]->dims, sizeof dims);
	if (arity == 2) {
		if (b_shape)
			b_view = *b_shape;
		else if ((st = ew_legacy_view(p, &b_view)))
			return st;
		view[1] = &b_view;
		if ((st = tern_broadcast_shape(p->node, p->in[0]->rank, p->in[0]->dims, b_view.rank, b_view.dims, &rank,
		                               dims)))
			return st;
	}
	int dtype = p->in[0]->dtype;
	tern_set_shape(p->out[0], out_bool ? TERN_BOOL : dtype, rank, dims);
	ew_params *e = ew_params_new(p, 1);
	if (!e)
		return tern_errorf(TERN_EOS, "out of memory");
	if ((st = ew_pick(p->node, fns, dtype, out_bool, &e->steps[0])))
		return st;
	static const int src[2] = {0, 1};
	ew_step_init(&e->steps[0], p, arity, src, view);
	p->inplace_ok = !out_bool && ew_same_shape(p->in[0], p->out[0]);
	*out = e;
	return TERN_OK;
}

static tern_status ew_prepare_map(tern_prepare_args *p, int arity, bool out_bool, const ew_fn *fns, ew_params **out)
{
	return ew_prepare_map_as(p, arity, out_bool, fns, NULL, out);
}

/* Operators that are one kernel table plus float attributes. */
typedef struct ew_desc {
	const char *op_type;
	int arity;
	bool out_bool;
	const ew_fn *fns;
	const char *attr[3]; /* attribute names for alpha, beta, gamma; NULL: the default is fixed */
	float dflt[3];
} ew_desc;

static const ew_desc ew_descs[] = {
        {"Abs", 1, false, abs_fns},
        {"Neg", 1, false, neg_fns},
        {"Sign", 1, false, sign_fns},
        {"Reciprocal", 1, false, reciprocal_fns},
        {"Floor", 1, false, floor_fns},
        {"Ceil", 1, false, ceil_fns},
        {"Round", 1, false, rint_fns}, /* rint rounds half to even, as numpy.round */
        {"Sqrt", 1, false, sqrt_fns},
        {"Exp", 1, false, exp_fns},
        {"Log", 1, false, log_fns},
        {"Sin", 1, false, sin_fns},
        {"Cos", 1, false, cos_fns},
        {"Tan", 1, false, tan_fns},
        {"Asin", 1, false, asin_fns},
        {"Acos", 1, false, acos_fns},
        {"Atan", 1, false, atan_fns},
        {"Sinh", 1, false, sinh_fns},
        {"Cosh", 1, false, cosh_fns},
        {"Asinh", 1, false, asinh_fns},
        {"Acosh", 1, false, acosh_fns},
        {"Atanh", 1, false, atanh_fns},
        {"Erf", 1, false, erf_fns},
        {"Tanh", 1, false, tanh_fns},
        {"Not", 1, false, not_fns},
        {"BitwiseNot", 1, false, bitwise_not_fns},
        {"IsNaN", 1, true, isnan_fns},
        {"Relu", 1, false, relu_fns},
        {"LeakyRelu", 1, false, leaky_relu_fns, {"alpha"}, {0.01f}},
        {"Elu", 1, false, elu_fns, {"alpha"}, {1.0f}},
        {"Selu",
         1,
         false,
         selu_fns,
         {"alpha", NULL, "gamma"},
         {1.67326319217681884765625f, 0, 1.05070102214813232421875f}},
        {"Celu", 1, false, celu_fns, {"alpha"}, {1.0f}},
        {"Sigmoid", 1, false, sigmoid_fns},
        {"HardSigmoid", 1, false, hard_sigmoid_fns, {"alpha", "beta"}, {0.2f, 0.5f}},
        {"HardSwish", 1, false, hard_swish_fns, {NULL, NULL}, {1.0f / 6, 0.5f}},
        {"Softplus", 1, false, softplus_fns},
        {"Softsign", 1, false, softsign_fns},
        {"ThresholdedRelu", 1, false, thresholded_relu_fns, {"alpha"}, {1.0f}},
        {"Mish", 1, false, mish_fns},
        {"Shrink", 1, false, shrink_fns, {"lambd", "bias"}, {0.5f, 0.0f}},
        {"Add", 2, false, add_fns},
        {"Sub", 2, false, sub_fns},
        {"Mul", 2, false, mul_fns},
        {"Div", 2, false, div_fns},
        {"BitwiseAnd", 2, false, bitwise_and_fns},
        {"BitwiseOr", 2, false, bitwise_or_fns},
        {"BitwiseXor", 2, false, bitwise_xor_fns},
        {"And", 2, true, and_fns},
        {"Or", 2, true, or_fns},
        {"Xor", 2, true, xor_fns},
        {"Equal", 2, true, equal_fns},
        {"Less", 2, true, less_fns},
        {"LessOrEqual", 2, true, less_equal_fns},
        {"Greater", 2, true, greater_fns},
        {"GreaterOrEqual", 2, true, greater_equal_fns},
        {"ReluGrad", 2, false, relu_grad_fns},
        {"SigmoidGrad", 2, false, sigmoid_grad_fns},
        {"TanhGrad", 2, false, tanh_grad_fns},
};

static tern_status prep_simple_body(tern_prepare_args *p)
{
	const ew_desc *d = NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(ew_descs) && !d; i++)
		if (strcmp(ew_descs[i].op_type, p->node->op_type) == 0)
			d = &ew_descs[i];
	if (!d)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no elementwise kernel table for %s",
		                        p->node->op_type);
	ew_params *e;
	tern_status st = ew_prepare_map(p, d->arity, d->out_bool, d->fns, &e);
	if (st)
		return st;
	double *attrs[3] = {&e->at.alpha, &e->at.beta, &e->at.gamma};
	for (int i = 0; i < 3; i++)
		*attrs[i] = d->attr[i] ? tern_attr_float(p->node, d->attr[i], d->dflt[i]) : d->dflt[i];
	return TERN_OK;
}

static tern_status prep_isinf_body(tern_prepare_args *p)
{
	ew_params *e;
	tern_status st = ew_prepare_map(p, 1, true, isinf_fns, &e);
	if (st)
		return st;
	e->at.flag = (tern_attr_int(p->node, "detect_negative", 1) ? 1 : 0) |
	        (tern_attr_int(p->node, "detect_positive", 1) ? 2 : 0);
	return TERN_OK;
}

static tern_status prep_mod_body(tern_prepare_args *p)
{
	ew_params *e;
	return ew_prepare_map(p, 2, false, tern_attr_int(p->node, "fmod", 0) ? fmod_fns : mod_fns, &e);
}

static tern_status prep_bitshift_body(tern_prepare_args *p)
{
	const char *dir = tern_attr_string(p->node, "direction", "");
	const ew_fn *fns = strcmp(dir, "LEFT") == 0 ? shift_left_fns
	        : strcmp(dir, "RIGHT") == 0         ? shift_right_fns
	                                            : NULL;
	if (!fns)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'direction' is \"%s\", expected LEFT or RIGHT",
		                        dir);
	ew_params *e;
	return ew_prepare_map(p, 2, false, fns, &e);
}

/* Whether numpy broadcasting takes `from` to `to`'s shape without changing it. */
static bool ew_unidirectional(const tern_tensor *from, const tern_tensor *to)
{
	if (from->rank > to->rank)
		return false;
	for (int i = 1; i <= from->rank; i++) {
		int64_t d = from->dims[from->rank - i];
		if (d != 1 && d != to->dims[to->rank - i])
			return false;
	}
	return true;
}

/* PRelu broadcasts slope to X's shape only. Before opset 9 a slope that does not broadcast that way
 * may instead be per channel: its dimensions placed from axis 1 (PRelu-6 and earlier had no other
 * rule, and converters of that time wrote [C] slopes for NCHW data). */
static tern_status prep_prelu_body(tern_prepare_args *p)
{
	ew_params *e;
	const tern_tensor *x = p->n_in > 0 ? p->in[0] : NULL, *slope = p->n_in > 1 ? p->in[1] : NULL;
	tern_tensor channel_view;
	const tern_tensor *b_shape = NULL;
	if (p->node->opset < 9 && x && slope && !ew_unidirectional(slope, x) && slope->rank < x->rank) {
		bool fits = true;
		for (int i = 0; i < slope->rank; i++)
			fits &= slope->dims[i] == 1 || slope->dims[i] == x->dims[1 + i];
		if (fits) {
			channel_view = *slope;
			channel_view.rank = x->rank;
			for (int i = 0; i < x->rank; i++)
				channel_view.dims[i] = i >= 1 && i <= slope->rank ? slope->dims[i - 1] : 1;
			b_shape = &channel_view;
		}
	}
	tern_status st = ew_prepare_map_as(p, 2, false, prelu_fns, b_shape, &e);
	if (st)
		return st;
	if (!ew_same_shape(p->out[0], p->in[0])) {
		char sx[128], ss[128];
		return tern_node_errorf(p->node, TERN_EDATA, "slope %s does not broadcast to X %s",
		                        tern_shape_str(p->in[1]->dtype, p->in[1]->rank, p->in[1]->dims, ss, sizeof ss),
		                        tern_shape_str(p->in[0]->dtype, p->in[0]->rank, p->in[0]->dims, sx, sizeof sx));
	}
	return TERN_OK;
}

/* Pow: the output has the base's type; the exponent may have another numeric type. */
static tern_status prep_pow_body(tern_prepare_args *p)
{
	ew_params *e;
	if (p->n_in >= 2 && p->in[0] && p->in[1] && p->in[0]->dtype == p->in[1]->dtype &&
	    (p->in[0]->dtype == TERN_FLOAT || p->in[0]->dtype == TERN_DOUBLE || ew_is_half(p->in[0]->dtype)))
		return ew_prepare_map(p, 2, false, pow_fns, &e);
	if (!p->out[0] || p->n_in < 2 || !p->in[0] || !p->in[1])
		return tern_node_errorf(p->node, TERN_EDATA, "needs inputs X and Y and output Z");
	for (int i = 0; i < 2; i++) {
		int dt = p->in[i]->dtype;
		if (dt <= 0 || dt >= TERN_DTYPE_COUNT || !(TERN_DT_NUMERIC & (1u << dt)))
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input %d '%s' has type %s, which Pow does not support", i,
			                        ew_input_name(p->node, i), tern_dtype_name(dt));
	}
	/* Same shapes and broadcasting as the single-type case; only the kernel differs. */
	tern_tensor b_view;
	tern_status st = ew_legacy_view(p, &b_view);
	if (st)
		return st;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	if ((st = tern_broadcast_shape(p->node, p->in[0]->rank, p->in[0]->dims, b_view.rank, b_view.dims, &rank, dims)))
		return st;
	tern_set_shape(p->out[0], p->in[0]->dtype, rank, dims);
	if (!(e = ew_params_new(p, 1)))
		return tern_errorf(TERN_EOS, "out of memory");
	e->at.from = p->in[0]->dtype;
	e->at.to = p->in[1]->dtype;
	e->steps[0].fn = ew_pow_mixed;
	static const int src[2] = {0, 1};
	const tern_tensor *view[2] = {p->in[0], &b_view};
	ew_step_init(&e->steps[0], p, 2, src, view);
	p->inplace_ok = ew_same_shape(p->in[0], p->out[0]);
	return TERN_OK;
}

/* Sum, Mean, Max, Min: out = in0 op in1, then out = out op in2, ...; Mean then divides. */
static tern_status prep_variadic_body(tern_prepare_args *p)
{
	const char *op = p->node->op_type;
	bool mean = strcmp(op, "Mean") == 0;
	const ew_fn *fns = strcmp(op, "Max") == 0 ? max_fns : strcmp(op, "Min") == 0 ? min_fns : add_fns;
	int n = p->n_in;
	if (n < 1)
		return tern_node_errorf(p->node, TERN_EDATA, "needs at least one input");
	tern_status st = ew_check_inputs(p, 0, n);
	if (st)
		return st;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	if ((st = tern_broadcast_tensors(p->node, n, (const tern_tensor *const *)p->in, &rank, dims)))
		return st;
	int dtype = p->in[0]->dtype;
	tern_set_shape(p->out[0], dtype, rank, dims);
	int n_steps = (n > 1 ? n - 1 : 1) + (mean && n > 1);
	ew_params *e = ew_params_new(p, n_steps);
	if (!e)
		return tern_errorf(TERN_EOS, "out of memory");
	if (n == 1) {
		/* The type must still be one the operator accepts. */
		if ((st = ew_pick(p->node, fns, dtype, false, &e->steps[0])))
			return st;
		e->steps[0].fn = ew_copy_fn(dtype);
		static const int src0[1] = {0};
		ew_step_init(&e->steps[0], p, 1, src0, (const tern_tensor *const *)p->in);
	}
	for (int k = 1; k < n; k++) {
		ew_step *s = &e->steps[k - 1];
		if ((st = ew_pick(p->node, fns, dtype, false, s)))
			return st;
		int src[2] = {k == 1 ? 0 : EW_SRC_OUT, k};
		const tern_tensor *view[2] = {k == 1 ? p->in[0] : p->out[0], p->in[k]};
		ew_step_init(s, p, 2, src, view);
	}
	if (mean && n > 1) {
		ew_step *s = &e->steps[n_steps - 1];
		if ((st = ew_pick(p->node, divide_by_fns, dtype, false, s)))
			return st;
		static const int src_out[1] = {EW_SRC_OUT};
		const tern_tensor *view[1] = {p->out[0]};
		ew_step_init(s, p, 1, src_out, view);
		e->at.gamma = n;
	}
	p->inplace_ok = ew_same_shape(p->in[0], p->out[0]);
	return TERN_OK;
}

static tern_status prep_where_body(tern_prepare_args *p)
{
	tern_status st = ew_check_inputs(p, 1, 2);
	if (st)
		return st;
	if (!p->in[0] || p->in[0]->dtype != TERN_BOOL)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 '%s' must be a bool tensor",
		                        ew_input_name(p->node, 0));
	int dtype = p->in[1]->dtype;
	ew_fn fn = NULL;
	switch (dtype == TERN_STRING ? 0 : tern_dtype_size(dtype)) {
	case 1: fn = ew_where_u8; break;
	case 2: fn = ew_where_u16; break;
	case 4: fn = ew_where_u32; break;
	case 8: fn = ew_where_u64; break;
	default:
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 '%s' has type %s, which Where does not support",
		                        ew_input_name(p->node, 1), tern_dtype_name(dtype));
	}
	int rank;
	int64_t dims[TERN_MAX_RANK];
	if ((st = tern_broadcast_tensors(p->node, 3, (const tern_tensor *const *)p->in, &rank, dims)))
		return st;
	tern_set_shape(p->out[0], dtype, rank, dims);
	ew_params *e = ew_params_new(p, 1);
	if (!e)
		return tern_errorf(TERN_EOS, "out of memory");
	e->steps[0].fn = fn;
	static const int src[3] = {0, 1, 2};
	ew_step_init(&e->steps[0], p, 3, src, (const tern_tensor *const *)p->in);
	return TERN_OK;
}

/* The lowest or highest value of dtype, as bytes of the type Clip computes in. */
static uint64_t ew_limit(int dtype, bool upper)
{
	uint64_t bits = 0;
#define EW_LIMIT(T, LO, HI)                  \
	{                                    \
		T v = upper ? (HI) : (LO);   \
		memcpy(&bits, &v, sizeof v); \
		break;                       \
	}
	switch (dtype) {
	case TERN_FLOAT:
	case TERN_FLOAT16:
	case TERN_BFLOAT16: EW_LIMIT(float, -INFINITY, INFINITY)
	case TERN_DOUBLE: EW_LIMIT(double, -INFINITY, INFINITY)
	case TERN_INT8: EW_LIMIT(int8_t, INT8_MIN, INT8_MAX)
	case TERN_INT16: EW_LIMIT(int16_t, INT16_MIN, INT16_MAX)
	case TERN_INT32: EW_LIMIT(int32_t, INT32_MIN, INT32_MAX)
	case TERN_INT64: EW_LIMIT(int64_t, INT64_MIN, INT64_MAX)
	case TERN_UINT8: EW_LIMIT(uint8_t, 0, UINT8_MAX)
	case TERN_UINT16: EW_LIMIT(uint16_t, 0, UINT16_MAX)
	case TERN_UINT32: EW_LIMIT(uint32_t, 0, UINT32_MAX)
	case TERN_UINT64: EW_LIMIT(uint64_t, 0, UINT64_MAX)
	default: break;
	}
#undef EW_LIMIT
	return bits;
}

/* A float attribute bound stored as the float or double Clip computes in. */
static uint64_t ew_float_bound(int dtype, double v)
{
	uint64_t bits = 0;
	if (dtype == TERN_DOUBLE) {
		memcpy(&bits, &v, sizeof v);
	} else {
		float f = (float)v;
		memcpy(&bits, &f, sizeof f);
	}
	return bits;
}

/* Clip: bounds are attributes before opset 11, optional scalar inputs from then on. */
static tern_status prep_clip_body(tern_prepare_args *p)
{
	ew_params *e;
	tern_status st = ew_prepare_map(p, 1, false, clip_fns, &e);
	if (st)
		return st;
	int dtype = p->in[0]->dtype;
	e->at.lo = ew_limit(dtype, false);
	e->at.hi = ew_limit(dtype, true);
	if (p->node->opset < 11) {
		if (tern_attr(p->node, "min"))
			e->at.lo = ew_float_bound(dtype, tern_attr_float(p->node, "min", 0));
		if (tern_attr(p->node, "max"))
			e->at.hi = ew_float_bound(dtype, tern_attr_float(p->node, "max", 0));
		return TERN_OK;
	}
	for (int k = 1; k <= 2 && k < p->n_in; k++) {
		const tern_tensor *t = p->in[k];
		if (!t)
			continue;
		if (t->dtype != dtype)
			return tern_node_errorf(p->node, TERN_EDATA, "input %d '%s' has type %s, input 0 has type %s",
			                        k, ew_input_name(p->node, k), tern_dtype_name(t->dtype),
			                        tern_dtype_name(dtype));
		if (tern_tensor_numel(t) != 1)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input %d '%s' has %lld elements, expected a scalar", k,
			                        ew_input_name(p->node, k), (long long)tern_tensor_numel(t));
		e->clip_inputs = 1;
	}
	return TERN_OK;
}

static bool ew_castable(int dtype)
{
	return dtype > 0 && dtype < TERN_DTYPE_COUNT &&
	        ((TERN_DT_NUMERIC | TERN_DT(BOOL) | TERN_DT(STRING)) & (1u << dtype) || ew_is_f8(dtype));
}

static tern_status ew_prepare_cast(tern_prepare_args *p, int to)
{
	tern_status st = ew_check_inputs(p, 0, 1);
	if (st)
		return st;
	int from = p->in[0]->dtype;
	if (!ew_castable(from) || !ew_castable(to))
		return tern_node_errorf(p->node, TERN_EDATA, "cast from %s to %s is not supported",
		                        tern_dtype_name(from), tern_dtype_name(to));
	tern_set_shape(p->out[0], to, p->in[0]->rank, p->in[0]->dims);
	ew_params *e = ew_params_new(p, 1);
	if (!e)
		return tern_errorf(TERN_EOS, "out of memory");
	e->at.from = from;
	e->at.to = to;
	/* Cast-19's saturate only concerns float8 destinations; earlier Casts have no float8. */
	e->at.saturate = tern_attr_int(p->node, "saturate", 1) != 0;
	if (from == TERN_STRING || to == TERN_STRING) {
		p->kernel = ew_cast_string_kernel;
		return TERN_OK;
	}
	ew_step *s = &e->steps[0];
	if (from == to)
		s->fn = ew_copy_fn(from);
	else if (ew_is_half(from) || ew_is_half(to) || ew_is_f8(from) || ew_is_f8(to))
		s->fn = ew_cast_via_float;
	else
		s->fn = ew_cast_fns[from == TERN_BOOL ? TERN_UINT8 : from][to];
	static const int src[1] = {0};
	ew_step_init(s, p, 1, src, (const tern_tensor *const *)p->in);
	p->inplace_ok = tern_dtype_size(from) == tern_dtype_size(to);
	return TERN_OK;
}

static tern_status prep_cast_body(tern_prepare_args *p)
{
	const Onnx__AttributeProto *to = tern_attr(p->node, "to");
	if (!to)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'to' is missing");
	if (to->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING)
		return ew_prepare_cast(p, (int)tern_attr_int(p->node, "to", 0));
	/* Cast-1 names the type ("FLOAT"); the text syntax spells it in lower case. */
	char name[32];
	const char *s = tern_attr_string(p->node, "to", "");
	size_t n = 0;
	for (; s[n] && n < sizeof name - 1; n++)
		name[n] = (char)(s[n] >= 'A' && s[n] <= 'Z' ? s[n] - 'A' + 'a' : s[n]);
	name[n] = '\0';
	return ew_prepare_cast(p, tern_dtype_from_name(name));
}

static tern_status prep_cast_like_body(tern_prepare_args *p)
{
	if (p->n_in < 2 || !p->in[1])
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'target_type' is missing");
	return ew_prepare_cast(p, p->in[1]->dtype);
}

/* A failed prepare leaves no parameters behind. */
#define EW_PREPARE(name)                                     \
	static tern_status prep_##name(tern_prepare_args *p) \
	{                                                    \
		tern_status st = prep_##name##_body(p);      \
		if (st) {                                    \
			free(p->params);                     \
			p->params = NULL;                    \
			p->free_params = NULL;               \
		}                                            \
		return st;                                   \
	}
EW_PREPARE(simple)
EW_PREPARE(isinf)
EW_PREPARE(mod)
EW_PREPARE(bitshift)
EW_PREPARE(prelu)
EW_PREPARE(pow)
EW_PREPARE(variadic)
EW_PREPARE(where)
EW_PREPARE(clip)
EW_PREPARE(cast)
EW_PREPARE(cast_like)

/* ---------------------------------------------------------------- gradients
 *
 * Rules (lib/autodiff/grad.h) for the differentiable operators above: dX from dY, emitted through the
 * builder. Where a derivative has a kink the rule takes PyTorch's side of it (noted at each rule); the
 * derivative of Floor, Ceil, Round and Sign is zero, and they give zeros, as PyTorch does.
 *
 * Emitted nodes are valid at the forward node's opset: before opset 7 a binary node broadcasts only
 * with broadcast=1 (B onto A, placed at `axis`); Where exists from opset 9, Expand from 8, Sign from 9;
 * Equal compares floats from opset 11; Cast names its type as a string before opset 6. Older opsets get
 * equivalent compositions (a selection becomes arithmetic on a 0/1 mask, which lets a NaN or an
 * infinity of the unselected side through). */

/* How a binary node's operands broadcast before opset 7: the same shape, B a scalar constant, or B
 * the forward node's input 1 broadcast onto A as the forward node does it. */
enum ew_bc { EW_BC_SAME, EW_BC_SCALAR, EW_BC_FWD };

/* One node on in[0..n); NULL when an input is NULL (an earlier builder call failed). */
static tern_gval *ew_gop(tern_grad_ctx *g, const char *op, tern_gval *const *in, int n, const tern_gattr *at, int n_at)
{
	for (int i = 0; i < n; i++)
		if (!in[i])
			return NULL;
	return tern_g_op(g, "", op, in, n, at, n_at);
}

/* A binary node; before opset 7 with the broadcast (and axis) attributes it needs: bcast and axis
 * (-1: none) as given. */
static tern_gval *ew_g2x(tern_grad_ctx *g, const char *op, tern_gval *a, tern_gval *b, bool bcast, int64_t axis)
{
	tern_gval *in[2] = {a, b};
	tern_gattr at[2] = {{0}};
	int n = 0;
	if (g->node->opset < 7 && bcast) {
		at[n++] = TERN_GA_I("broadcast", 1);
		if (axis >= 0)
			at[n++] = TERN_GA_I("axis", axis);
	}
	return ew_gop(g, op, in, 2, at, n);
}

static tern_gval *ew_g2(tern_grad_ctx *g, const char *op, tern_gval *a, tern_gval *b, enum ew_bc bc)
{
	bool fwd = bc == EW_BC_FWD && tern_attr_int(g->node, "broadcast", 0);
	int64_t axis = fwd && tern_attr(g->node, "axis") ? tern_attr_int(g->node, "axis", 0) : -1;
	return ew_g2x(g, op, a, b, bc == EW_BC_SCALAR || fwd, axis);
}

static tern_gval *ew_g1(tern_grad_ctx *g, const char *op, tern_gval *a)
{
	return ew_gop(g, op, &a, 1, NULL, 0);
}

/* A scalar constant of the output's element type. */
static tern_gval *ew_k(tern_grad_ctx *g, double v)
{
	return tern_g_scalar(g, v, g->dy[0]);
}

#define EW_ADD(a, b) ew_g2(g, "Add", (a), (b), EW_BC_SAME)
#define EW_SUB(a, b) ew_g2(g, "Sub", (a), (b), EW_BC_SAME)
#define EW_MUL(a, b) ew_g2(g, "Mul", (a), (b), EW_BC_SAME)
#define EW_DIV(a, b) ew_g2(g, "Div", (a), (b), EW_BC_SAME)
/* a op a scalar v */
#define EW_ADDK(a, v) ew_g2(g, "Add", (a), ew_k(g, (v)), EW_BC_SCALAR)
#define EW_SUBK(a, v) ew_g2(g, "Sub", (a), ew_k(g, (v)), EW_BC_SCALAR)
#define EW_MULK(a, v) ew_g2(g, "Mul", (a), ew_k(g, (v)), EW_BC_SCALAR)
#define EW_DIVK(a, v) ew_g2(g, "Div", (a), ew_k(g, (v)), EW_BC_SCALAR)
#define EW_CMPK(op, a, v) ew_g2(g, (op), (a), ew_k(g, (v)), EW_BC_SCALAR)
#define EW_G1(op, a) ew_g1(g, (op), (a))

/* v - a for a scalar v (before opset 7 only B broadcasts: -a + v). */
static tern_gval *ew_ksub(tern_grad_ctx *g, double v, tern_gval *a)
{
	if (g->node->opset < 7)
		return EW_ADDK(EW_G1("Neg", a), v);
	return ew_g2(g, "Sub", ew_k(g, v), a, EW_BC_SAME);
}

/* Cast v to dtype ("to" is a type name before opset 6). */
static tern_gval *ew_cast(tern_grad_ctx *g, tern_gval *v, int dtype)
{
	tern_gattr at = g->node->opset >= 6 ? TERN_GA_I("to", dtype)
	        : dtype == TERN_DOUBLE      ? TERN_GA_S("to", "DOUBLE")
	        : dtype == TERN_FLOAT16     ? TERN_GA_S("to", "FLOAT16")
	                                    : TERN_GA_S("to", "FLOAT");
	return ew_gop(g, "Cast", &v, 1, &at, 1);
}

/* A bool as 0 or 1 in the output's element type. */
static tern_gval *ew_num(tern_grad_ctx *g, tern_gval *cond)
{
	return ew_cast(g, cond, tern_g_dtype(g, g->dy[0]));
}

/* cond ? a : b, for a and b of dY's shape (cond broadcasting to it). */
static tern_gval *ew_select(tern_grad_ctx *g, tern_gval *cond, tern_gval *a, tern_gval *b)
{
	if (g->node->opset >= 9) {
		tern_gval *in[3] = {cond, a, b};
		return ew_gop(g, "Where", in, 3, NULL, 0);
	}
	return EW_ADD(b, EW_MUL(EW_SUB(a, b), ew_num(g, cond))); /* b + (a - b) cond */
}

/* v where cond holds, else 0. */
static tern_gval *ew_keep(tern_grad_ctx *g, tern_gval *cond, tern_gval *v)
{
	if (g->node->opset >= 9) {
		tern_gval *in[3] = {cond, v, ew_k(g, 0)};
		return ew_gop(g, "Where", in, 3, NULL, 0);
	}
	return EW_MUL(v, ew_num(g, cond));
}

/* a != 0 and a == 0, elementwise (Equal takes floats from opset 11). */
static tern_gval *ew_nonzero(tern_grad_ctx *g, tern_gval *a)
{
	if (g->node->opset >= 11)
		return EW_G1("Not", EW_CMPK("Equal", a, 0));
	return ew_g2(g, "Or", EW_CMPK("Less", a, 0), EW_CMPK("Greater", a, 0), EW_BC_SAME);
}

static tern_gval *ew_zero(tern_grad_ctx *g, tern_gval *a)
{
	if (g->node->opset >= 11)
		return EW_CMPK("Equal", a, 0);
	return EW_G1("Not", ew_nonzero(g, a));
}

/* Whether a and b have static shapes, known and equal. */
static bool ew_g_same_shape(tern_grad_ctx *g, const tern_gval *a, const tern_gval *b)
{
	int ra, rb;
	int64_t da[TERN_MAX_RANK], db[TERN_MAX_RANK];
	tern_g_type(g, a, NULL, &ra, da);
	tern_g_type(g, b, NULL, &rb, db);
	if (ra < 0 || ra != rb)
		return false;
	for (int d = 0; d < ra; d++)
		if (da[d] < 0 || da[d] != db[d])
			return false;
	return true;
}

/* t summed to the shape `view` (of t's rank, as input i broadcast) and reshaped to input i's own
 * dimensions. Only before opset 9 (a legacy or per-channel broadcast), where no int64 Constant
 * exists: ReduceSum over the axes where view is 1, keeping them, reads its axes from an attribute;
 * the Reshape's shape is Shape(input), or an attribute before opset 5. */
static tern_gval *ew_sum_to_view(tern_grad_ctx *g, tern_gval *t, int i, const int64_t *view, int rank)
{
	int64_t axes[TERN_MAX_RANK];
	int n = 0;
	for (int d = 0; d < rank; d++)
		if (view[d] == 1)
			axes[n++] = d;
	tern_gattr at[2] = {TERN_GA_IS("axes", axes, (size_t)n), TERN_GA_I("keepdims", 1)};
	tern_gval *r = n ? ew_gop(g, "ReduceSum", &t, 1, at, 2) : t;
	if (g->node->opset >= 5)
		return r ? tern_g_reshape_like(g, r, g->x[i]) : NULL;
	int rx;
	int64_t xd[TERN_MAX_RANK];
	tern_g_type(g, g->x[i], NULL, &rx, xd);
	tern_gattr shape = TERN_GA_IS("shape", xd, (size_t)rx);
	return ew_gop(g, "Reshape", &r, 1, &shape, 1);
}

/* The legacy broadcast (before opset 7) of input 1 placed at a given axis that numpy's right
 * alignment would not give: its view (rank of the output) in view; false when numpy's reading is the
 * same. Its static shape must be known (ew_check_legacy). */
static bool ew_legacy_placed(tern_grad_ctx *g, int64_t *view, int *rank)
{
	if (g->node->opset >= 7 || g->n_in < 2 || !tern_attr_int(g->node, "broadcast", 0) ||
	    !tern_attr(g->node, "axis"))
		return false;
	int ry = tern_g_rank(g, g->y[0]), rb;
	int64_t bd[TERN_MAX_RANK];
	tern_g_type(g, g->x[1], NULL, &rb, bd);
	int64_t axis = tern_attr_int(g->node, "axis", 0);
	if (axis < 0)
		axis += ry;
	if (ry < 0 || rb < 0 || axis == ry - rb || axis < 0 || axis + rb > ry)
		return false;
	for (int d = 0; d < ry; d++)
		view[d] = d >= axis && d < axis + rb ? bd[d - axis] : 1;
	*rank = ry;
	return true;
}

static tern_status ew_check_legacy(tern_grad_ctx *g)
{
	if (g->node->opset >= 7 || g->n_in < 2 || !tern_attr_int(g->node, "broadcast", 0) ||
	    !tern_attr(g->node, "axis"))
		return TERN_OK;
	int ry = tern_g_rank(g, g->y[0]), rb;
	int64_t bd[TERN_MAX_RANK];
	tern_g_type(g, g->x[1], NULL, &rb, bd);
	bool known = ry >= 0 && rb >= 0;
	for (int d = 0; known && d < rb; d++)
		known = bd[d] >= 0;
	return known ? TERN_OK : tern_g_fail(g, "broadcast with axis before opset 7 needs input 1's static shape");
}

/* t, of the output's shape, summed down to forward input i's shape (undoing its broadcast). */
static tern_gval *ew_sum_to(tern_grad_ctx *g, tern_gval *t, int i)
{
	if (!t || ew_g_same_shape(g, g->x[i], g->y[0]))
		return t;
	int64_t view[TERN_MAX_RANK];
	int rank;
	if (i == 1 && ew_legacy_placed(g, view, &rank))
		return ew_sum_to_view(g, t, i, view, rank);
	return tern_g_sum_to(g, t, g->x[i]);
}

/* Zeros of input 0's shape. */
static tern_gval *ew_zeros(tern_grad_ctx *g)
{
	if (g->node->opset < 8)
		return EW_MULK(g->dy[0], 0); /* no Expand yet: 0 dY */
	if (tern_g_rank(g, g->x[0]) == 0)
		return ew_k(g, 0);
	tern_gval *in[2] = {ew_k(g, 0), tern_g_shape(g, g->x[0])};
	return ew_gop(g, "Expand", in, 2, NULL, 0);
}

/* A node of tern's own (the backward operators above). */
static tern_gval *ew_tern2(tern_grad_ctx *g, const char *op, tern_gval *a, tern_gval *b)
{
	tern_gval *in[2] = {a, b};
	return a && b ? tern_g_op(g, "tern", op, in, 2, NULL, 0) : NULL;
}

/* The rule's answer is complete for inputs [0, n) that want one; else the builder's failure. */
static tern_status ew_done_n(tern_grad_ctx *g, int n)
{
	for (int i = 0; i < n && i < g->n_in; i++)
		if (g->wants[i] && !g->dx[i])
			return tern_g_status(g);
	return TERN_OK;
}

static tern_status ew_done(tern_grad_ctx *g)
{
	return ew_done_n(g, g->n_in);
}

/* Unary rules: dX = EXPR of x, y (the output) and dy. A unary rule runs only when its one input
 * wants a gradient. */
#define EW_GRAD1(name, EXPR)                                          \
	static tern_status grad_##name(tern_grad_ctx *g)              \
	{                                                             \
		tern_gval *x = g->x[0], *y = g->y[0], *dy = g->dy[0]; \
		(void)x;                                              \
		(void)y;                                              \
		(void)dy;                                             \
		if (g->wants[0])                                      \
			g->dx[0] = (EXPR);                            \
		return ew_done(g);                                    \
	}

static tern_gval *ew_square(tern_grad_ctx *g, tern_gval *a)
{
	return EW_MUL(a, a);
}

/* 2 / sqrt(pi) */
#define EW_TWO_OVER_SQRT_PI 1.12837916709551257390

EW_GRAD1(neg, EW_G1("Neg", dy))
/* |x|' = sign(x): 0 at x = 0, as PyTorch (sgn). Sign arrives in opset 9: before, (x > 0) - (x < 0). */
EW_GRAD1(abs,
         EW_MUL(dy,
                g->node->opset >= 9 ? EW_G1("Sign", x)
                                    : EW_SUB(ew_num(g, EW_CMPK("Greater", x, 0)), ew_num(g, EW_CMPK("Less", x, 0)))))
/* the derivative is zero almost everywhere (and undefined at the steps): zeros, as PyTorch gives */
EW_GRAD1(zero, ew_zeros(g))
EW_GRAD1(sqrt, EW_DIV(dy, EW_ADD(y, y)))
EW_GRAD1(reciprocal, EW_G1("Neg", EW_MUL(dy, EW_MUL(y, y))))
EW_GRAD1(exp, EW_MUL(dy, y))
EW_GRAD1(log, EW_DIV(dy, x))
EW_GRAD1(sin, EW_MUL(dy, EW_G1("Cos", x)))
EW_GRAD1(cos, EW_G1("Neg", EW_MUL(dy, EW_G1("Sin", x))))
EW_GRAD1(tan, EW_MUL(dy, EW_ADDK(EW_MUL(y, y), 1)))
EW_GRAD1(asin, EW_DIV(dy, EW_G1("Sqrt", ew_ksub(g, 1, EW_MUL(x, x)))))
EW_GRAD1(acos, EW_G1("Neg", EW_DIV(dy, EW_G1("Sqrt", ew_ksub(g, 1, EW_MUL(x, x))))))
EW_GRAD1(atan, EW_DIV(dy, EW_ADDK(EW_MUL(x, x), 1)))
EW_GRAD1(sinh, EW_MUL(dy, EW_G1("Cosh", x)))
EW_GRAD1(cosh, EW_MUL(dy, EW_G1("Sinh", x)))
EW_GRAD1(tanh, ew_tern2(g, "TanhGrad", dy, y))
EW_GRAD1(asinh, EW_DIV(dy, EW_G1("Sqrt", EW_ADDK(EW_MUL(x, x), 1))))
EW_GRAD1(acosh, EW_DIV(dy, EW_G1("Sqrt", EW_SUBK(EW_MUL(x, x), 1))))
EW_GRAD1(atanh, EW_DIV(dy, ew_ksub(g, 1, EW_MUL(x, x))))
EW_GRAD1(erf, EW_MUL(dy, EW_MULK(EW_G1("Exp", EW_G1("Neg", EW_MUL(x, x))), EW_TWO_OVER_SQRT_PI)))
/* dY where y > 0: 0 at x = 0, as PyTorch (threshold_backward on the result) */
EW_GRAD1(relu, ew_tern2(g, "ReluGrad", dy, y))
/* 1 for x > 0, alpha otherwise: alpha at x = 0, as PyTorch (leaky_relu_backward: x > 0) */
EW_GRAD1(leaky_relu, ew_select(g, EW_CMPK("Greater", x, 0), dy, EW_MULK(dy, tern_attr_float(g->node, "alpha", 0.01f))))
/* alpha e^x for x <= 0 (alpha at 0, as PyTorch's elu_backward), 1 above */
EW_GRAD1(elu,
         ew_select(g, EW_CMPK("Greater", x, 0), dy,
                   EW_MUL(dy, EW_MULK(EW_G1("Exp", x), tern_attr_float(g->node, "alpha", 1.0f)))))
/* gamma alpha e^x for x <= 0 (as PyTorch's elu_backward), gamma above */
EW_GRAD1(selu,
         ew_select(g, EW_CMPK("Greater", x, 0),
                   EW_MULK(dy, tern_attr_float(g->node, "gamma", 1.05070102214813232421875f)),
                   EW_MUL(dy,
                          EW_MULK(EW_G1("Exp", x),
                                  (double)tern_attr_float(g->node, "gamma", 1.05070102214813232421875f) *
                                          tern_attr_float(g->node, "alpha", 1.67326319217681884765625f)))))
/* e^(x / alpha) for x <= 0, 1 above: continuous (1 at 0) */
EW_GRAD1(celu,
         ew_select(g, EW_CMPK("Greater", x, 0), dy,
                   EW_MUL(dy, EW_G1("Exp", EW_DIVK(x, tern_attr_float(g->node, "alpha", 1.0f))))))
EW_GRAD1(sigmoid, ew_tern2(g, "SigmoidGrad", dy, y))
/* alpha where 0 < alpha x + beta < 1 (0 < y < 1), 0 outside and at both kinks, as PyTorch's
 * hardsigmoid_backward */
EW_GRAD1(hard_sigmoid,
         ew_keep(g, ew_g2(g, "And", EW_CMPK("Greater", y, 0), EW_CMPK("Less", y, 1), EW_BC_SAME),
                 EW_MULK(dy, tern_attr_float(g->node, "alpha", 0.2f))))
/* HardSwish is x hardsigmoid(x) with alpha 1/6, beta 1/2: 0 for x < -3, x/3 + 1/2 for -3 <= x <= 3, 1
 * above: PyTorch's hardswish_backward, which gives -1/2 at -3 and 3/2 at 3 */
EW_GRAD1(hard_swish,
         ew_select(g, EW_CMPK("Greater", x, 3), dy,
                   ew_select(g, EW_CMPK("Less", x, -3), ew_k(g, 0), EW_MUL(dy, EW_ADDK(EW_DIVK(x, 3), 0.5)))))
EW_GRAD1(softplus, EW_MUL(dy, EW_G1("Sigmoid", x)))
EW_GRAD1(softsign, EW_DIV(dy, ew_square(g, EW_ADDK(EW_G1("Abs", x), 1))))
/* dY where x > alpha: 0 at alpha, as PyTorch's threshold_backward */
EW_GRAD1(thresholded_relu, ew_keep(g, EW_CMPK("Greater", x, tern_attr_float(g->node, "alpha", 1.0f)), dy))
/* dY where |x| > lambd: 0 at +-lambd, as PyTorch's hardshrink_backward */
EW_GRAD1(shrink,
         ew_keep(g,
                 ew_g2(g, "Or", EW_CMPK("Less", x, -(double)tern_attr_float(g->node, "lambd", 0.5f)),
                       EW_CMPK("Greater", x, tern_attr_float(g->node, "lambd", 0.5f)), EW_BC_SAME),
                 dy))

/* Mish: tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2), sp = softplus(x) (PyTorch's mish_backward). */
static tern_status grad_mish(tern_grad_ctx *g)
{
	tern_gval *x = g->x[0], *dy = g->dy[0];
	tern_gval *th = EW_G1("Tanh", EW_G1("Softplus", x));
	tern_gval *d = EW_ADD(th, EW_MUL(EW_MUL(x, EW_G1("Sigmoid", x)), ew_ksub(g, 1, EW_MUL(th, th))));
	g->dx[0] = EW_MUL(dy, d);
	return ew_done(g);
}

/* dY summed to each operand; Sub negates B's (after the sum: fewer elements). */
static tern_status grad_add(tern_grad_ctx *g)
{
	tern_status st = ew_check_legacy(g);
	if (st)
		return st;
	bool sub = strcmp(g->node->op_type, "Sub") == 0;
	if (g->wants[0])
		g->dx[0] = ew_sum_to(g, g->dy[0], 0);
	if (g->wants[1]) {
		tern_gval *d = ew_sum_to(g, g->dy[0], 1);
		g->dx[1] = sub ? EW_G1("Neg", d) : d;
	}
	return ew_done(g);
}

static tern_status grad_mul(tern_grad_ctx *g)
{
	tern_status st = ew_check_legacy(g);
	if (st)
		return st;
	tern_gval *a = g->x[0], *b = g->x[1], *dy = g->dy[0];
	if (g->wants[0])
		g->dx[0] = ew_sum_to(g, ew_g2(g, "Mul", dy, b, EW_BC_FWD), 0);
	if (g->wants[1])
		g->dx[1] = ew_sum_to(g, EW_MUL(dy, a), 1);
	return ew_done(g);
}

/* z = a / b: dA = dY / b, dB = -dY z / b. */
static tern_status grad_div(tern_grad_ctx *g)
{
	tern_status st = ew_check_legacy(g);
	if (st)
		return st;
	tern_gval *b = g->x[1], *z = g->y[0], *dy = g->dy[0];
	if (g->wants[0])
		g->dx[0] = ew_sum_to(g, ew_g2(g, "Div", dy, b, EW_BC_FWD), 0);
	if (g->wants[1])
		g->dx[1] = EW_G1("Neg", ew_sum_to(g, ew_g2(g, "Div", EW_MUL(dy, z), b, EW_BC_FWD), 1));
	return ew_done(g);
}

/* z = a^b. dA = dY b a^(b-1); where b is 0 the exponent b - 1 is replaced by 0, so that a = 0 gives 0
 * rather than 0 * inf (PyTorch masks exponent == 0 the same way). dB = dY z log(a): the logarithm is
 * defined for a > 0 only; at a = 0 the rule gives 0 (PyTorch's convention where b >= 0: log(a) is
 * taken at 1 there), for a < 0 NaN, as PyTorch. An exponent of another type (Pow-12) is cast to the
 * base's type; an integer exponent has no gradient. */
static tern_status grad_pow(tern_grad_ctx *g)
{
	tern_status st = ew_check_legacy(g);
	if (st)
		return st;
	tern_gval *a = g->x[0], *b = g->x[1], *z = g->y[0], *dy = g->dy[0];
	int ta = tern_g_dtype(g, a), tb = tern_g_dtype(g, b);
	if (g->wants[0]) {
		tern_gval *bf = tb == ta ? b : ew_cast(g, b, ta);
		tern_gval *e = EW_SUB(bf, ew_num(g, ew_nonzero(g, bf))); /* b - 1, or 0 where b is 0 */
		tern_gval *d = ew_g2(g, "Mul", EW_MUL(dy, ew_g2(g, "Pow", a, e, EW_BC_FWD)), bf, EW_BC_FWD);
		g->dx[0] = ew_sum_to(g, d, 0);
	}
	if (g->wants[1]) {
		tern_gval *log_a = EW_G1("Log", EW_ADD(a, ew_num(g, ew_zero(g, a))));
		tern_gval *d = EW_MUL(EW_MUL(dy, z), log_a);
		if (tb != ta)
			d = ew_cast(g, d, tb);
		g->dx[1] = ew_sum_to(g, d, 1);
	}
	return ew_done(g);
}

/* Float Mod is C's fmod: z = a - b trunc(a / b), so dA = dY, dB = -dY trunc(a / b), with trunc(a / b)
 * as (a - z) / b (PyTorch's fmod backward). */
static tern_status grad_mod(tern_grad_ctx *g)
{
	tern_gval *a = g->x[0], *b = g->x[1], *z = g->y[0], *dy = g->dy[0];
	if (g->wants[0])
		g->dx[0] = ew_sum_to(g, dy, 0);
	if (g->wants[1])
		g->dx[1] = EW_G1("Neg", ew_sum_to(g, EW_MUL(dy, EW_DIV(EW_SUB(a, z), b)), 1));
	return ew_done(g);
}

/* PRelu: dX = dY where x > 0, slope dY otherwise; dSlope = x dY where x <= 0, summed to the slope's
 * shape. At x = 0 the slope's side, as PyTorch's prelu backward. Before opset 9 the slope may be
 * per channel (prep_prelu), which needs static shapes here. */
static tern_status grad_prelu(tern_grad_ctx *g)
{
	tern_gval *x = g->x[0], *s = g->x[1], *dy = g->dy[0];
	int rx, rs;
	int64_t xd[TERN_MAX_RANK], sd[TERN_MAX_RANK];
	tern_g_type(g, x, NULL, &rx, xd);
	tern_g_type(g, s, NULL, &rs, sd);
	bool channel = false;
	if (g->node->opset < 9 && rs >= 1 && rx > rs) {
		bool known = true, unidirectional = true, fits = true;
		for (int i = 0; i < rs; i++) {
			known &= sd[i] >= 0 && xd[rx - rs + i] >= 0 && xd[1 + i] >= 0;
			unidirectional &= sd[i] == 1 || sd[i] == xd[rx - rs + i];
			fits &= sd[i] == 1 || sd[i] == xd[1 + i];
		}
		if (!known)
			return tern_g_fail(g, "PRelu before opset 9 needs static shapes for its gradient");
		channel = !unidirectional && fits;
	}
	/* the slope as it broadcasts against dY: per channel, its dimensions from axis 1 */
	int64_t view[TERN_MAX_RANK];
	for (int d = 0; d < rx; d++)
		view[d] = channel && d >= 1 && d <= rs ? sd[d - 1] : 1;
	tern_gval *slope = s, *sdy;
	bool same = ew_g_same_shape(g, s, x);
	if (channel && g->node->opset >= 7) {
		/* numpy reads the slope from the right: trailing 1s put it at axis 1 (Unsqueeze's axes are an
		 * attribute before opset 13) */
		int64_t axes[TERN_MAX_RANK];
		for (int d = 0; d < rx - 1 - rs; d++)
			axes[d] = rs + d;
		tern_gattr at = TERN_GA_IS("axes", axes, (size_t)(rx - 1 - rs));
		slope = rx - 1 > rs ? ew_gop(g, "Unsqueeze", &s, 1, &at, 1) : s;
	}
	if (channel)
		sdy = ew_g2x(g, "Mul", dy, slope, true, 1);
	else
		sdy = ew_g2x(g, "Mul", dy, slope, !same, -1);
	tern_gval *pos = EW_CMPK("Greater", x, 0);
	if (g->wants[0])
		g->dx[0] = ew_select(g, pos, dy, sdy);
	if (g->wants[1]) {
		tern_gval *t = ew_keep(g, EW_G1("Not", pos), EW_MUL(dy, x));
		g->dx[1] = channel ? ew_sum_to_view(g, t, 1, view, rx) : ew_sum_to(g, t, 1);
	}
	return ew_done(g);
}

/* Sum: dY to every input; Mean: dY / n. */
static tern_status grad_sum(tern_grad_ctx *g)
{
	tern_gval *d = g->dy[0];
	if (strcmp(g->node->op_type, "Mean") == 0 && g->n_in > 1)
		d = EW_MULK(d, 1.0 / g->n_in);
	for (int i = 0; i < g->n_in; i++)
		if (g->wants[i])
			g->dx[i] = ew_sum_to(g, d, i);
	return ew_done(g);
}

/* Max, Min: dY to the inputs that attain the result, split evenly among them where several do
 * (torch.maximum gives each of two tied operands half; this is the same for n operands, as amax
 * spreads over ties). x_i attains the maximum where it is not below it. */
static tern_status grad_extreme(tern_grad_ctx *g)
{
	int n = g->n_in;
	tern_gval *y = g->y[0], *dy = g->dy[0];
	if (n == 1) {
		g->dx[0] = dy;
		return ew_done(g);
	}
	const char *beaten = strcmp(g->node->op_type, "Max") == 0 ? "Less" : "Greater";
	tern_gval *attains[32];
	if (n > 32)
		return tern_node_errorf(g->node, TERN_EDATA, "gradient: %s of more than 32 inputs", g->node->op_type);
	for (int i = 0; i < n; i++)
		attains[i] = ew_num(g, EW_G1("Not", ew_g2(g, beaten, g->x[i], y, EW_BC_SAME)));
	tern_gval *count = ew_gop(g, "Sum", attains, n, NULL, 0);
	tern_gval *share = EW_DIV(dy, count);
	for (int i = 0; i < n; i++)
		if (g->wants[i])
			g->dx[i] = ew_sum_to(g, EW_MUL(share, attains[i]), i);
	return ew_done(g);
}

/* Where: dY to the side each element came from; the condition has none. */
static tern_status grad_where(tern_grad_ctx *g)
{
	tern_gval *cond = g->x[0], *dy = g->dy[0];
	for (int i = 1; i <= 2; i++) {
		if (!g->wants[i])
			continue;
		tern_gval *in[3] = {cond, i == 1 ? dy : ew_k(g, 0), i == 1 ? ew_k(g, 0) : dy};
		g->dx[i] = ew_sum_to(g, ew_gop(g, "Where", in, 3, NULL, 0), i);
	}
	return ew_done(g);
}

/* Clip: y = min(max(x, lo), hi). dX = dY where lo <= x <= hi: at the bounds x keeps its gradient, as
 * PyTorch's clamp_backward. A bound gets dY where it is the output: lo where x < lo, hi where x > hi
 * (as PyTorch), and where lo > hi, which makes every output hi (numpy.clip's order), all of it goes to
 * hi. Bounds are attributes before opset 11, optional scalar inputs from then on. */
static tern_status grad_clip(tern_grad_ctx *g)
{
	tern_gval *x = g->x[0], *dy = g->dy[0], *lo = NULL, *hi = NULL;
	if (g->node->opset < 11) {
		if (tern_attr(g->node, "min"))
			lo = ew_k(g, tern_attr_float(g->node, "min", 0));
		if (tern_attr(g->node, "max"))
			hi = ew_k(g, tern_attr_float(g->node, "max", 0));
	} else {
		lo = g->n_in > 1 ? g->x[1] : NULL;
		hi = g->n_in > 2 ? g->x[2] : NULL;
	}
	tern_gval *below = lo ? ew_g2(g, "Less", x, lo, EW_BC_SCALAR) : NULL;
	tern_gval *above = hi ? ew_g2(g, "Greater", x, hi, EW_BC_SCALAR) : NULL;
	if (g->wants[0]) {
		tern_gval *out = below && above ? ew_g2(g, "Or", below, above, EW_BC_SAME) : below ? below : above;
		g->dx[0] = out ? ew_keep(g, EW_G1("Not", out), dy) : dy;
	}
	/* only inputs (opset 11 on) want gradients */
	tern_gval *crossed = (g->n_in > 1 && g->wants[1]) || (g->n_in > 2 && g->wants[2])
	        ? lo && hi ? ew_g2(g, "Greater", lo, hi, EW_BC_SAME) : NULL
	        : NULL;
	if (g->n_in > 1 && g->wants[1]) {
		tern_gval *c = crossed ? ew_g2(g, "And", below, EW_G1("Not", crossed), EW_BC_SAME) : below;
		g->dx[1] = ew_sum_to(g, ew_keep(g, c, dy), 1);
	}
	if (g->n_in > 2 && g->wants[2]) {
		tern_gval *c = crossed ? ew_g2(g, "Or", above, crossed, EW_BC_SAME) : above;
		g->dx[2] = ew_sum_to(g, ew_keep(g, c, dy), 2);
	}
	return ew_done(g);
}

/* Cast, CastLike: dY cast back to the input's type (CastLike's target_type has no gradient). */
static tern_status grad_cast(tern_grad_ctx *g)
{
	int from = tern_g_dtype(g, g->x[0]), to = tern_g_dtype(g, g->y[0]);
	if (g->wants[0])
		g->dx[0] = from == to ? g->dy[0] : ew_cast(g, g->dy[0], from);
	return ew_done_n(g, 1);
}

#define EW_FAMILY "elementwise"
#define EW_OP(name, since, prep)                       \
	{                                              \
		"", name, since, 0, prep, 0, EW_FAMILY \
	}
/* The same with a gradient rule. */
#define EW_OPG(name, since, prep, grad)                      \
	{                                                    \
		"", name, since, 0, prep, 0, EW_FAMILY, grad \
	}

static const tern_op ops[] = {
        EW_OPG("Abs", 1, prep_simple, grad_abs),
        EW_OPG("Neg", 1, prep_simple, grad_neg),
        EW_OPG("Sign", 9, prep_simple, grad_zero),
        EW_OPG("Reciprocal", 1, prep_simple, grad_reciprocal),
        EW_OPG("Floor", 1, prep_simple, grad_zero),
        EW_OPG("Ceil", 1, prep_simple, grad_zero),
        EW_OPG("Round", 11, prep_simple, grad_zero),
        EW_OPG("Sqrt", 1, prep_simple, grad_sqrt),
        EW_OPG("Exp", 1, prep_simple, grad_exp),
        EW_OPG("Log", 1, prep_simple, grad_log),
        EW_OPG("Sin", 7, prep_simple, grad_sin),
        EW_OPG("Cos", 7, prep_simple, grad_cos),
        EW_OPG("Tan", 7, prep_simple, grad_tan),
        EW_OPG("Asin", 7, prep_simple, grad_asin),
        EW_OPG("Acos", 7, prep_simple, grad_acos),
        EW_OPG("Atan", 7, prep_simple, grad_atan),
        EW_OPG("Sinh", 9, prep_simple, grad_sinh),
        EW_OPG("Cosh", 9, prep_simple, grad_cosh),
        EW_OPG("Asinh", 9, prep_simple, grad_asinh),
        EW_OPG("Acosh", 9, prep_simple, grad_acosh),
        EW_OPG("Atanh", 9, prep_simple, grad_atanh),
        EW_OPG("Erf", 9, prep_simple, grad_erf),
        EW_OPG("Tanh", 1, prep_simple, grad_tanh),
        EW_OP("Not", 1, prep_simple),
        EW_OP("BitwiseNot", 18, prep_simple),
        EW_OP("IsNaN", 9, prep_simple),
        EW_OP("IsInf", 10, prep_isinf),
        EW_OPG("Relu", 1, prep_simple, grad_relu),
        EW_OPG("LeakyRelu", 1, prep_simple, grad_leaky_relu),
        EW_OPG("Elu", 1, prep_simple, grad_elu),
        EW_OPG("Selu", 1, prep_simple, grad_selu),
        EW_OPG("Celu", 12, prep_simple, grad_celu),
        EW_OPG("Sigmoid", 1, prep_simple, grad_sigmoid),
        EW_OPG("HardSigmoid", 1, prep_simple, grad_hard_sigmoid),
        EW_OPG("HardSwish", 14, prep_simple, grad_hard_swish),
        EW_OPG("Softplus", 1, prep_simple, grad_softplus),
        EW_OPG("Softsign", 1, prep_simple, grad_softsign),
        EW_OPG("ThresholdedRelu", 10, prep_simple, grad_thresholded_relu),
        EW_OPG("Mish", 18, prep_simple, grad_mish),
        EW_OPG("Shrink", 9, prep_simple, grad_shrink),
        EW_OPG("PRelu", 1, prep_prelu, grad_prelu),
        EW_OPG("Add", 1, prep_simple, grad_add),
        EW_OPG("Sub", 1, prep_simple, grad_add),
        EW_OPG("Mul", 1, prep_simple, grad_mul),
        EW_OPG("Div", 1, prep_simple, grad_div),
        EW_OPG("Pow", 1, prep_pow, grad_pow),
        EW_OPG("Mod", 10, prep_mod, grad_mod),
        EW_OP("BitShift", 11, prep_bitshift),
        EW_OP("BitwiseAnd", 18, prep_simple),
        EW_OP("BitwiseOr", 18, prep_simple),
        EW_OP("BitwiseXor", 18, prep_simple),
        EW_OP("And", 1, prep_simple),
        EW_OP("Or", 1, prep_simple),
        EW_OP("Xor", 1, prep_simple),
        EW_OP("Equal", 1, prep_simple),
        EW_OP("Less", 1, prep_simple),
        EW_OP("LessOrEqual", 12, prep_simple),
        EW_OP("Greater", 1, prep_simple),
        EW_OP("GreaterOrEqual", 12, prep_simple),
        EW_OPG("Sum", 1, prep_variadic, grad_sum),
        EW_OPG("Mean", 1, prep_variadic, grad_sum),
        EW_OPG("Max", 1, prep_variadic, grad_extreme),
        EW_OPG("Min", 1, prep_variadic, grad_extreme),
        EW_OPG("Where", 9, prep_where, grad_where),
        EW_OPG("Clip", 1, prep_clip, grad_clip),
        EW_OPG("Cast", 1, prep_cast, grad_cast),
        EW_OPG("CastLike", 15, prep_cast_like, grad_cast),
        {"tern", "ReluGrad", 1, 0, prep_simple, 0, EW_FAMILY},
        {"tern", "SigmoidGrad", 1, 0, prep_simple, 0, EW_FAMILY},
        {"tern", "TanhGrad", 1, 0, prep_simple, 0, EW_FAMILY},
};

const tern_op_table tern_ops_elementwise = {ops, TERN_ARRAY_LEN(ops)};
