/* matmul.c — matrix products: MatMul, Gemm, MatMulInteger, QLinearMatMul and Einsum. float32 weights
 * known when planning are packed for register-blocked kernels (shared with the convolutions and the
 * recurrent layers, with activations applied as results are stored); other float and double products go
 * to OpenBLAS; float16 and bfloat16 are widened to float; integers use plain C. */
/* GCC's default -ftrapping-math keeps float comparisons (the activations' clamps) from becoming vector
 * selects; tern never reads the floating-point exception flags. Before the includes, so that the inline
 * helpers of ops_common.h are compiled with it. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "internal.h"
#include "autodiff/grad.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#if TERN_HAVE_BLAS
#include <cblas.h>
#endif

/* ---------------------------------------------------------------- gemm */

/* Row-major product in plain C. Without transposed B the inner loop runs along rows of B and C, so it
 * vectorises. */
#define DEFINE_GEMM_PLAIN(NAME, T)                                                                            \
	static void NAME(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda, \
	                 const T *b, int64_t ldb, T beta, T *c, int64_t ldc)                                  \
	{                                                                                                     \
		for (int64_t i = 0; i < m; i++) {                                                             \
			T *restrict ci = c + i * ldc;                                                         \
			if (beta == 0)                                                                        \
				memset(ci, 0, (size_t)n * sizeof *ci);                                        \
			else if (beta != 1)                                                                   \
				for (int64_t j = 0; j < n; j++)                                               \
					ci[j] *= beta;                                                        \
			for (int64_t p = 0; p < k; p++) {                                                     \
				T av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);                        \
				if (tb) {                                                                     \
					for (int64_t j = 0; j < n; j++)                                       \
						ci[j] += av * b[j * ldb + p];                                 \
				} else {                                                                      \
					const T *restrict bp = b + p * ldb;                                   \
					for (int64_t j = 0; j < n; j++)                                       \
						ci[j] += av * bp[j];                                          \
				}                                                                             \
			}                                                                                     \
		}                                                                                             \
	}

#if !TERN_HAVE_BLAS
DEFINE_GEMM_PLAIN(gemm_plain_f32, float)
DEFINE_GEMM_PLAIN(gemm_plain_f64, double)
#endif
DEFINE_GEMM_PLAIN(gemm_plain_i32, int32_t)
DEFINE_GEMM_PLAIN(gemm_plain_i64, int64_t)
DEFINE_GEMM_PLAIN(gemm_plain_u32, uint32_t)
DEFINE_GEMM_PLAIN(gemm_plain_u64, uint64_t)

/* y = alpha x B + beta y for a row x (below, with the other kernels) */
static void vecmat(int64_t n, int64_t k, float alpha, const float *x, int64_t incx, const float *b, int64_t ldb,
                   float beta, float *y);

/* With k = 0 the product is beta * C, which BLAS leaves to the caller. A single row or column is a
 * matrix-vector product, which sgemm handles far more slowly than sgemv; for beta = 0, C is cleared
 * first so that whatever it held (NaN included) cannot leak through. */
#define DEFINE_GEMM_BLAS(NAME, T, GEMM, GEMV, PLAIN)                                                                  \
	void NAME(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda,      \
	          const T *b, int64_t ldb, T beta, T *c, int64_t ldc)                                                 \
	{                                                                                                             \
		if (m <= 0 || n <= 0)                                                                                 \
			return;                                                                                       \
		if (k <= 0) {                                                                                         \
			for (int64_t i = 0; i < m; i++)                                                               \
				for (int64_t j = 0; j < n; j++)                                                       \
					c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];                       \
			return;                                                                                       \
		}                                                                                                     \
		if (k == 1) {                                                                                         \
			/* an outer product (the gradient of a weight from one row): BLAS clears C and then  \
			 * adds to it, twice the writes of one pass */                                       \
			int64_t sb = trans_b ? ldb : 1;                                                       \
			for (int64_t i = 0; i < m; i++) {                                                     \
				T ai = alpha * a[trans_a ? i : i * lda], *ci = c + i * ldc;                   \
				if (beta == 0)                                                                \
					for (int64_t j = 0; j < n; j++)                                       \
						ci[j] = ai * b[j * sb];                                       \
				else                                                                          \
					for (int64_t j = 0; j < n; j++)                                       \
						ci[j] = ai * b[j * sb] + beta * ci[j];                        \
			}                                                                                     \
			return;                                                                               \
		}                                                                                                     \
		if (VECMAT(T) && m == 1 && !trans_b) {                                                                \
			vecmat(n, k, (float)alpha, (const float *)a, trans_a ? lda : 1, (const float *)b, ldb, (float)beta, \
			       (float *)c);                                                                           \
			return;                                                                                       \
		}                                                                                                     \
		if (USE_BLAS && (m == 1 || n == 1)) {                                                                 \
			for (int64_t i = 0; i < m && beta == 0; i++)                                                  \
				for (int64_t j = 0; j < n; j++)                                                       \
					c[i * ldc + j] = 0;                                                           \
			if (m == 1)                                                                                   \
				GEMV(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, (blasint)(trans_b ? n : k),  \
				     (blasint)(trans_b ? k : n), alpha, b, (blasint)at_least_1(ldb), a,               \
				     trans_a ? (blasint)lda : 1, beta, c, 1);                                         \
			else                                                                                          \
				GEMV(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, (blasint)(trans_a ? k : m),  \
				     (blasint)(trans_a ? m : k), alpha, a, (blasint)at_least_1(lda), b,               \
				     trans_b ? 1 : (blasint)ldb, beta, c, (blasint)ldc);                              \
			return;                                                                                       \
		}                                                                                                     \
		if (USE_BLAS)                                                                                         \
			GEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, \
			     (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)at_least_1(lda), b,               \
			     (blasint)at_least_1(ldb), beta, c, (blasint)at_least_1(ldc));                            \
		else                                                                                                  \
			PLAIN(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);                        \
	}

/* The row-vector product above is float's */
#define VECMAT(T) (sizeof(T) == sizeof(float))
#if TERN_HAVE_BLAS
static int64_t at_least_1(int64_t v)
{
	return v < 1 ? 1 : v;
}
#define USE_BLAS 1
#define NO_PLAIN(...) ((void)0)
DEFINE_GEMM_BLAS(tern_gemm_f32, float, cblas_sgemm, cblas_sgemv, NO_PLAIN)
DEFINE_GEMM_BLAS(tern_gemm_f64, double, cblas_dgemm, cblas_dgemv, NO_PLAIN)
#else
/* Without BLAS the calls below are never made; these stand-ins keep one definition of the wrapper. */
#define USE_BLAS 0
typedef int blasint;
enum { CblasRowMajor, CblasNoTrans, CblasTrans };
#define NO_BLAS(...) ((void)0)
DEFINE_GEMM_BLAS(tern_gemm_f32, float, NO_BLAS, NO_BLAS, gemm_plain_f32)
DEFINE_GEMM_BLAS(tern_gemm_f64, double, NO_BLAS, NO_BLAS, gemm_plain_f64)
#endif

void tern_gemm_i32(int64_t m, int64_t n, int64_t k, const int32_t *a, const int32_t *b, int32_t *c)
{
	gemm_plain_i32(false, false, m, n, k, 1, a, k, b, n, 0, c, n);
}

void tern_half_to_f32(int dtype, const uint16_t *src, float *dst, int64_t n)
{
	if (dtype == TERN_BFLOAT16)
		for (int64_t i = 0; i < n; i++)
			dst[i] = tern_bf16_to_f32(src[i]);
	else
		for (int64_t i = 0; i < n; i++)
			dst[i] = tern_f16_to_f32(src[i]);
}

void tern_f32_to_half(int dtype, const float *src, uint16_t *dst, int64_t n)
{
	if (dtype == TERN_BFLOAT16)
		for (int64_t i = 0; i < n; i++)
			dst[i] = tern_f32_to_bf16(src[i]);
	else
		for (int64_t i = 0; i < n; i++)
			dst[i] = tern_f32_to_f16(src[i]);
}

/* ---------------------------------------------------------------- activations where results are stored */

/* The loops are compiled for AVX-512, AVX2 and the baseline and run on the path tern_isa() names. */

/* min(max(x, 0), 1) with selects that vectorise, unlike fminf and fmaxf (which mind NaN). */
static inline float hard_sigmoid(float x)
{
	return x < 0 ? 0 : x > 1 ? 1 : x;
}

bool tern_act_from_node(const tern_node *node, tern_act *act)
{
	static const struct {
		const char *name;
		tern_act_kind kind;
		float alpha, beta; /* defaults */
	} names[] = {
	        {"", TERN_ACT_NONE, 0, 0},
	        {"Relu", TERN_ACT_RELU, 0, 0},
	        {"Clip", TERN_ACT_CLIP, -INFINITY, INFINITY},
	        {"LeakyRelu", TERN_ACT_LEAKYRELU, 0.01f, 0},
	        {"Sigmoid", TERN_ACT_SIGMOID, 0, 0},
	        {"Silu", TERN_ACT_SILU, 0, 0},
	        {"Tanh", TERN_ACT_TANH, 0, 0},
	        {"HardSigmoid", TERN_ACT_HARDSIGMOID, 0.2f, 0.5f},
	        {"HardSwish", TERN_ACT_HARDSWISH, 1.0f / 6, 0.5f},
	};
	const char *name = tern_attr_string(node, "activation", "");
	size_t n = 0;
	const float *params = tern_attr_floats(node, "activation_params", &n);
	for (size_t i = 0; i < TERN_ARRAY_LEN(names); i++)
		if (strcmp(name, names[i].name) == 0) {
			*act = (tern_act){names[i].kind, names[i].alpha, names[i].beta};
			if (n > 0 && names[i].kind != TERN_ACT_HARDSWISH)
				act->alpha = params[0];
			if (n > 1 && names[i].kind != TERN_ACT_HARDSWISH)
				act->beta = params[1];
			return true;
		}
	return false;
}

/* rows x n elements, rows ld apart, of y and add alike. */
#define ACT_LOOP(EXPR)                                                           \
	do {                                                                     \
		for (int64_t r = 0; r < rows; r++, y += ld, add += add ? ld : 0) \
			if (add)                                                 \
				for (int64_t i = 0; i < n; i++) {                \
					float x = y[i] + add[i];                 \
					y[i] = (EXPR);                           \
				}                                                \
			else                                                     \
				for (int64_t i = 0; i < n; i++) {                \
					float x = y[i];                          \
					y[i] = (EXPR);                           \
				}                                                \
	} while (0)

TERN_ISA_BODY void act_rows_body(const tern_act *act, float *restrict y, const float *restrict add, int64_t rows, int64_t n,
                         int64_t ld)
{
	float al = act->alpha, be = act->beta;
	switch (act->kind) {
	case TERN_ACT_NONE: ACT_LOOP(x); break;
	case TERN_ACT_RELU: ACT_LOOP(x > 0 ? x : 0); break;
	case TERN_ACT_CLIP: ACT_LOOP(x < al ? al : x > be ? be : x); break;
	case TERN_ACT_LEAKYRELU: ACT_LOOP(x >= 0 ? x : al * x); break;
	case TERN_ACT_SIGMOID:
	case TERN_ACT_SILU:
		for (int64_t r = 0; r < rows; r++)
			tern_sigmoid_f32(y + r * ld, add ? add + r * ld : NULL, y + r * ld, n, act->kind == TERN_ACT_SILU);
		break;
	case TERN_ACT_TANH: ACT_LOOP(tern_fast_tanhf(x)); break;
	case TERN_ACT_HARDSIGMOID: ACT_LOOP(hard_sigmoid(al * x + be)); break;
	case TERN_ACT_HARDSWISH: ACT_LOOP(x * hard_sigmoid(al * x + be)); break;
	}
}
TERN_ISA_VARIANTS3(void, act_rows, (const tern_act *act, float *restrict y, const float *restrict add, int64_t rows, int64_t n, int64_t ld), (act, y, add, rows, n, ld))

void tern_act_run(const tern_act *act, float *y, const float *add, int64_t n)
{
	act_rows(act, y, add, 1, n, n);
}

/* The finished elements of a block of C: act(C + add), rows of n elements. */
static void act_block(const tern_gemm_c *c, float *first, int64_t rows, int64_t n)
{
	if (c->act)
		act_rows(c->act, first, c->add ? c->add + (first - c->data) : NULL, rows, n, c->ldc);
}

/* ---------------------------------------------------------------- products with a packed left operand */

/* Weights stay the same from run to run, so they are packed once into panels of P rows (P = two
 * vectors of the machine; for each column of A, the panel's P values together) instead of being copied
 * by BLAS on every call. Two register-blocked kernels multiply a panel with B where B lies, so that
 * a convolution needs no column matrix:
 *   rows: R rows of the panel by NR contiguous columns of B; each step broadcasts R values of A and
 *         loads NR / VL vectors of a row of B. Suits many columns: C is written row by row.
 *   cols: the whole panel by up to NB columns of B, anywhere in memory; each step loads the panel's
 *         column and broadcasts NB values of a row of B, so short rows (a 7 x 7 image, a matrix-vector
 *         product) waste nothing, and C may be stored transposed (MatMul with constant B: the product
 *         is computed as (X B)^T = B^T X^T).
 * Both keep their sums in vector registers while the loop runs down the shared dimension. Kernels for
 * AVX-512, AVX2 with FMA and the baseline are compiled; packing picks the machine's best. */

#define PACK_KC 256 /* rows of B per pass of the rows kernel: a pass's block of B stays in cache */
#define COLS_MAX_NB 14 /* the widest tile of the cols kernel */
#define COLS_PREFETCH 96 /* steps ahead that the cols kernel asks for its panel's columns */
#define ROWS_PREFETCH 64 /* floats ahead in a row of B that the rows kernel asks for */

typedef void (*rows_fn)(int64_t kc, const float *a, const float *b, const int64_t *off, float *c, int64_t ldc, int rows,
                        int cols, const float *bias, bool add);
typedef void (*cols_fn)(int64_t k, const float *a, const float *b, const int64_t *off, int64_t ldb, int64_t step,
                        float *c, int64_t ldc, int rows, const float *bias, bool add, bool trans);

typedef struct gemm_isa {
	int p, r, nr, nb; /* panel rows, rows and columns of a rows-kernel block, widest cols tile */
	int store_cost; /* the cols kernel's untransposed store of a column, in steps of the shared dimension */
	rows_fn rows;
	cols_fn cols[COLS_MAX_NB + 1]; /* by tile width */
} gemm_isa;

struct tern_packed {
	int64_t m, k, panels;
	const gemm_isa *isa;
	float *data; /* panels x k x p, rows past m zero */
};

/* Multiply-adds may contract into FMA instructions (GCC only does so in ISO C mode when told; clang
 * does by default). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
/* The loops over a block's registers unroll fully, so that the sums stay in registers from first to last. */
#define UNROLL _Pragma("GCC unroll 16")

/* R x NV vectors of C += the product over kc rows of B (row p at b + off[p]); then C = the sums (+ bias
 * per row) when !add, else C + the sums. Only rows x cols of the block are written. */
#define DEF_ROWS(NAME, ATTR, V, VU, VL, R, NV)                                                                    \
	ATTR static void NAME(int64_t kc, const float *restrict a, const float *restrict b,                       \
	                      const int64_t *restrict off, float *restrict c, int64_t ldc, int rows, int cols,    \
	                      const float *bias, bool add)                                                        \
	{                                                                                                         \
		V acc[R][NV];                                                                                     \
		UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[r][v] = (V){0};        \
		for (int64_t p = 0; p < kc; p++) {                                                                \
			const float *bp = b + off[p];                                                             \
			/* the next column blocks' rows, whose many streams the hardware does not follow */       \
			__builtin_prefetch(bp + ROWS_PREFETCH);                                                   \
			__builtin_prefetch(bp + ROWS_PREFETCH + NV * VL - 1);                                     \
			V bv[NV];                                                                                 \
			UNROLL for (int v = 0; v < NV; v++) bv[v] = *(const VU *)(bp + v * VL);                   \
			UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[r][v] +=       \
			        a[p * 2 * VL + r] * bv[v];                                                        \
		}                                                                                                 \
		if (rows == R && cols == NV * VL) {                                                               \
			UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++)                    \
			{                                                                                         \
				VU *cv = (VU *)(c + r * ldc + v * VL);                                            \
				V s = acc[r][v];                                                                  \
				*cv = add ? s + (V)*cv : bias ? s + bias[r] : s;                                  \
			}                                                                                         \
			return;                                                                                   \
		}                                                                                                 \
		float tile[R][NV * VL];                                                                           \
		UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) * (VU *)&tile[r][v * VL] = \
		        acc[r][v];                                                                                \
		for (int r = 0; r < rows; r++) {                                                                  \
			float *cr = c + r * ldc, base = bias && !add ? bias[r] : 0;                               \
			for (int j = 0; j < cols; j++)                                                            \
				cr[j] = (add ? cr[j] : base) + tile[r][j];                                        \
		}                                                                                                 \
	}

/* A panel (two vectors of rows) by nb columns of B (column j of row p at b + off[p] + j * step, or
 * b + p * ldb + j * step without offsets) over all k rows. With few columns the sums are split over
 * several rows of B in turn, so that enough of them are in flight. C then gets the sums (+ bias, a
 * whole panel's worth) or, with add, C + the sums; with trans element (i, j) is at c + j * ldc + i. */
#define DEF_COLS(S, ATTR, V, VU, VL, STORE_T)                                                                     \
	ATTR static inline __attribute__((always_inline)) void cols_body_##S(                                     \
	        const int nb, int64_t k, const float *restrict a, const float *restrict b,                        \
	        const int64_t *restrict off, int64_t ldb, int64_t step, float *restrict c, int64_t ldc, int rows, \
	        const float *bias, bool add, bool trans)                                                          \
	{                                                                                                         \
		const int u = nb == 1 ? 4 : nb <= 3 ? 2 : 1;                                                      \
		V acc[COLS_MAX_NB][2];                                                                            \
		UNROLL for (int q = 0; q < nb * u; q++) acc[q][0] = acc[q][1] = (V){0};                           \
		int64_t p = 0;                                                                                    \
		for (; p + u <= k; p += u)                                                                        \
			UNROLL for (int i = 0; i < u; i++)                                                        \
			{                                                                                         \
				const float *bp = off ? b + off[p + i] : b + (p + i) * ldb;                       \
				/* a step's panel column: one line of 64 bytes with AVX2, two with AVX-512 */     \
				__builtin_prefetch(a + (p + i + COLS_PREFETCH) * 2 * VL);                         \
				if (2 * VL > 16)                                                                  \
					__builtin_prefetch(a + (p + i + COLS_PREFETCH) * 2 * VL + 16);            \
				V a0 = *(const V *)(a + (p + i) * 2 * VL),                                        \
				  a1 = *(const V *)(a + (p + i) * 2 * VL + VL);                                   \
				UNROLL for (int j = 0; j < nb; j++)                                               \
				{                                                                                 \
					float s = bp[j * step];                                                   \
					acc[i * nb + j][0] += s * a0;                                             \
					acc[i * nb + j][1] += s * a1;                                             \
				}                                                                                 \
			}                                                                                         \
		for (; p < k; p++) {                                                                              \
			const float *bp = off ? b + off[p] : b + p * ldb;                                         \
			V a0 = *(const V *)(a + p * 2 * VL), a1 = *(const V *)(a + p * 2 * VL + VL);              \
			UNROLL for (int j = 0; j < nb; j++)                                                       \
			{                                                                                         \
				float s = bp[j * step];                                                           \
				acc[j][0] += s * a0;                                                              \
				acc[j][1] += s * a1;                                                              \
			}                                                                                         \
		}                                                                                                 \
		UNROLL for (int i = 1; i < u; i++) UNROLL for (int j = 0; j < nb; j++)                            \
		{                                                                                                 \
			acc[j][0] += acc[i * nb + j][0];                                                          \
			acc[j][1] += acc[i * nb + j][1];                                                          \
		}                                                                                                 \
		if (trans && rows == 2 * VL) {                                                                    \
			UNROLL for (int j = 0; j < nb; j++) UNROLL for (int v = 0; v < 2; v++)                    \
			{                                                                                         \
				VU *cv = (VU *)(c + j * ldc + v * VL);                                            \
				V s = acc[j][v];                                                                  \
				*cv = add ? s + (V)*cv : bias ? s + (V) * (const VU *)(bias + v * VL) : s;        \
			}                                                                                         \
			return;                                                                                   \
		}                                                                                                 \
		if (!trans && STORE_T(acc, nb, c, ldc, rows, bias, add))                                          \
			return;                                                                                   \
		float t[COLS_MAX_NB][2 * VL];                                                                     \
		UNROLL for (int j = 0; j < nb; j++) UNROLL for (int v = 0; v < 2; v++) * (VU *)&t[j][v * VL] =    \
		        acc[j][v];                                                                                \
		int64_t si = trans ? 1 : ldc, sj = trans ? ldc : 1;                                               \
		for (int i = 0; i < rows; i++) {                                                                  \
			float *ci = c + i * si, base = bias && !add ? bias[i] : 0;                                \
			UNROLL for (int j = 0; j < nb; j++) ci[j * sj] = (add ? ci[j * sj] : base) + t[j][i];     \
		}                                                                                                 \
	}

#define COLS_ARGS                                                                                              \
	int64_t k, const float *restrict a, const float *restrict b, const int64_t *restrict off, int64_t ldb, \
	        int64_t step, float *restrict c, int64_t ldc, int rows, const float *bias, bool add, bool trans
#define DEF_COLS_NB(S, ATTR, NB)                                                            \
	ATTR static void cols_##S##_##NB(COLS_ARGS)                                         \
	{                                                                                   \
		cols_body_##S(NB, k, a, b, off, ldb, step, c, ldc, rows, bias, add, trans); \
	}
#define DEF_COLS_1_6(S, ATTR)                                                                           \
	DEF_COLS_NB(S, ATTR, 1)                                                                         \
	DEF_COLS_NB(S, ATTR, 2) DEF_COLS_NB(S, ATTR, 3) DEF_COLS_NB(S, ATTR, 4) DEF_COLS_NB(S, ATTR, 5) \
	        DEF_COLS_NB(S, ATTR, 6)
#define COLS_1_6(S) cols_##S##_1, cols_##S##_2, cols_##S##_3, cols_##S##_4, cols_##S##_5, cols_##S##_6

/* The cols kernel's untransposed store, when the machine has a faster one than element by element: none
 * in general, sixteen rows at a time through a register transpose with AVX-512. */
#define NO_STORE_T(...) false

/* Vectors of floats; the unaligned kind reads and writes B and C wherever their rows start. */
typedef float vec4f __attribute__((vector_size(16)));
typedef float vec4fu __attribute__((vector_size(16), aligned(4), may_alias));
DEF_ROWS(rows_base, , vec4f, vec4fu, 4, 4, 3)
DEF_COLS(base, , vec4f, vec4fu, 4, NO_STORE_T)
DEF_COLS_1_6(base, )
static const gemm_isa isa_base = {8, 4, 12, 6, 24, rows_base, {NULL, COLS_1_6(base)}};

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_WIDE_KERNELS 1
#define AVX2 __attribute__((target("arch=x86-64-v3")))
#define AVX512 __attribute__((target("arch=x86-64-v4")))
typedef float vec8f __attribute__((vector_size(32)));
typedef float vec8fu __attribute__((vector_size(32), aligned(4), may_alias));
typedef float vec16f __attribute__((vector_size(64)));
typedef float vec16fu __attribute__((vector_size(64), aligned(4), may_alias));
DEF_ROWS(rows_avx2, AVX2, vec8f, vec8fu, 8, 4, 3)
DEF_COLS(avx2, AVX2, vec8f, vec8fu, 8, NO_STORE_T)
DEF_COLS_1_6(avx2, AVX2)
AVX512 static inline __attribute__((always_inline)) bool store_t_avx512(vec16f acc[][2], int nb, float *c, int64_t ldc,
                                                                        int rows, const float *bias, bool add)
{
	__mmask16 cols = (__mmask16)(0xffffu >> (16 - nb));
	UNROLL for (int h = 0; h < 2; h++)
	{
		__m512 r[16];
		UNROLL for (int j = 0; j < 16; j++)
		{
			r[j] = _mm512_setzero_ps();
			if (j < nb)
				r[j] = acc[j][h];
		}
		tern_tr16(r);
		UNROLL for (int i = 0; i < 16; i++)
		{
			int row = 16 * h + i;
			if (row >= rows)
				return true;
			float *ci = c + row * ldc;
			__m512 v = r[i];
			if (add)
				v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(cols, ci));
			else if (bias)
				v = _mm512_add_ps(v, _mm512_set1_ps(bias[row]));
			_mm512_mask_storeu_ps(ci, cols, v);
		}
	}
	return true;
}
DEF_ROWS(rows_avx512, AVX512, vec16f, vec16fu, 16, 8, 2)
DEF_COLS(avx512, AVX512, vec16f, vec16fu, 16, store_t_avx512)
DEF_COLS_1_6(avx512, AVX512)
DEF_COLS_NB(avx512, AVX512, 7)
DEF_COLS_NB(avx512, AVX512, 8) DEF_COLS_NB(avx512, AVX512, 9) DEF_COLS_NB(avx512, AVX512, 10)
        DEF_COLS_NB(avx512, AVX512, 11) DEF_COLS_NB(avx512, AVX512, 12) DEF_COLS_NB(avx512, AVX512, 13)
                DEF_COLS_NB(avx512, AVX512,
                            14) static const gemm_isa isa_avx2 = {16, 4, 24, 6, 24, rows_avx2, {NULL, COLS_1_6(avx2)}};
static const gemm_isa isa_avx512 = {32,
                                    8,
                                    32,
                                    14,
                                    8,
                                    rows_avx512,
                                    {NULL, COLS_1_6(avx512), cols_avx512_7, cols_avx512_8, cols_avx512_9,
                                     cols_avx512_10, cols_avx512_11, cols_avx512_12, cols_avx512_13, cols_avx512_14}};
#endif

/* y = alpha x B + beta y for a row x of k floats (stride incx) and B of k rows of n floats: sums of
 * four vectors of columns at a time kept in registers over all of B's rows, which stream through
 * once. OpenBLAS's sgemv does the same job, but picks its kernel by the processor's model and falls
 * back to an SSE3 one on models it does not know (an Intel Xeon of family 6 model 207 with OpenBLAS
 * 0.3.21: 5 GFLOP/s). */
#define DEF_VECMAT(NAME, ATTR, V, VU, VL)                                                                          \
	ATTR static void NAME(int64_t n, int64_t k, float alpha, const float *x, int64_t incx, const float *b,     \
	                      int64_t ldb, float beta, float *y)                                                   \
	{                                                                                                          \
		int64_t j = 0;                                                                                     \
		for (; j + 4 * VL <= n; j += 4 * VL) {                                                             \
			V acc[4] = {{0}};                                                                          \
			for (int64_t p = 0; p < k; p++) {                                                          \
				const float xv = x[p * incx], *bp = b + p * ldb + j;                               \
				UNROLL for (int q = 0; q < 4; q++) acc[q] += xv * *(const VU *)(bp + VL * q);      \
			}                                                                                          \
			UNROLL for (int q = 0; q < 4; q++)                                                         \
			{                                                                                          \
				VU *yq = (VU *)(y + j + VL * q);                                                   \
				*yq = beta == 0 ? alpha * acc[q] : alpha * acc[q] + beta * *yq;                    \
			}                                                                                          \
		}                                                                                                  \
		if (j < n) {                                                                                       \
			int64_t w = n - j;                                                                         \
			float acc[4 * VL] = {0};                                                                   \
			for (int64_t p = 0; p < k; p++) {                                                          \
				const float xv = x[p * incx], *restrict bp = b + p * ldb + j;                      \
				for (int q = 0; q < w; q++)                                                        \
					acc[q] += xv * bp[q];                                                      \
			}                                                                                          \
			for (int q = 0; q < w; q++)                                                                \
				y[j + q] = beta == 0 ? alpha * acc[q] : alpha * acc[q] + beta * y[j + q];          \
		}                                                                                                  \
	}
DEF_VECMAT(vecmat_base, , vec4f, vec4fu, 4)
#ifdef HAVE_WIDE_KERNELS
DEF_VECMAT(vecmat_avx2, AVX2, vec8f, vec8fu, 8)
DEF_VECMAT(vecmat_avx512, AVX512, vec16f, vec16fu, 16)
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static void vecmat(int64_t n, int64_t k, float alpha, const float *x, int64_t incx, const float *b, int64_t ldb,
                   float beta, float *y)
{
#ifdef HAVE_WIDE_KERNELS
	if (tern_isa() == TERN_ISA_AVX512)
		return vecmat_avx512(n, k, alpha, x, incx, b, ldb, beta, y);
	if (tern_isa() == TERN_ISA_AVX2)
		return vecmat_avx2(n, k, alpha, x, incx, b, ldb, beta, y);
#endif
	vecmat_base(n, k, alpha, x, incx, b, ldb, beta, y);
}

static const gemm_isa *machine_isa(void)
{
#ifdef HAVE_WIDE_KERNELS
	if (tern_isa() == TERN_ISA_AVX512)
		return &isa_avx512;
	if (tern_isa() == TERN_ISA_AVX2)
		return &isa_avx2;
#endif
	return &isa_base;
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}
static int64_t ceil_div64(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

tern_packed *tern_pack_a(int64_t m, int64_t k, const float *a, int64_t lda, bool trans, float alpha)
{
	tern_packed *pa = calloc(1, sizeof *pa);
	if (!pa)
		return NULL;
	pa->isa = machine_isa();
	int64_t p = pa->isa->p;
	pa->m = m;
	pa->k = k;
	pa->panels = ceil_div64(m, p);
	pa->data = tern_aligned_alloc((size_t)(pa->panels * p * (k ? k : 1)) * sizeof(float));
	if (!pa->data) {
		free(pa);
		return NULL;
	}
	for (int64_t i = 0; i < m; i++)
		for (int64_t q = 0; q < k; q++)
			pa->data[((i / p) * k + q) * p + i % p] = alpha * (trans ? a[q * lda + i] : a[i * lda + q]);
	/* weights mapped from external data are now in the panels: their pages can go (read again from
	 * the file should anything else use them) */
	if (m && k)
		tern_mapped_release(a, (size_t)(trans ? (k - 1) * lda + m : (m - 1) * lda + k) * sizeof(float));
	return pa;
}

void tern_packed_free(tern_packed *p)
{
	if (p)
		free(p->data);
	free(p);
}

/* Tiles of one run of `width` columns: as few as the widest tile allows, of nearly equal widths. */
static int64_t tiles_per_run(const gemm_isa *isa, int64_t width)
{
	return ceil_div64(width, isa->nb);
}

tern_gemm_kind tern_gemm_choose(const tern_packed *a, int64_t n_dense, int64_t runs, int64_t width, bool c_trans,
                                size_t b_bytes)
{
	const gemm_isa *isa = a->isa;
	if (c_trans)
		return TERN_GEMM_COLS;
	/* Multiply-adds each kernel does, padding included, as measured: the rows kernel runs about 15%
	 * slower (its passes over blocks of B); a cols tile narrower than a few columns runs no faster than
	 * one of a few; the cols kernel's untransposed store costs about what store_cost steps of the shared
	 * dimension do (8 through AVX-512's register transpose, 24 element by element: with 64 rows of B
	 * the rows kernel is 1.2 times faster on the AVX2 path). */
	double k = (double)(a->k > 0 ? a->k : 1);
	double rows = 1.15 * (double)(ceil_div64(a->m, isa->r) * isa->r) *
	        (double)(ceil_div64(n_dense, isa->nr) * isa->nr) * k;
	int64_t tiles = tiles_per_run(isa, width), narrow = width / tiles;
	double run_cost = (double)(narrow < 3 ? 3 * tiles : width) * k + (double)isa->store_cost * (double)width;
	double cols = (double)(a->panels * isa->p) * (double)runs * run_cost;
	/* The cols kernel reads all of B once per panel; B larger than the second-level cache comes from
	 * further out every time, which costs it about a third more (1 x 1 convolutions of 256 x 56 x 56
	 * floats on an Intel Xeon, both paths), while the rows kernel keeps each block of B in the first
	 * cache for all the panels. */
	if (b_bytes > (size_t)tern_l2_bytes())
		cols *= 1.35;
	return cols < rows ? TERN_GEMM_COLS : TERN_GEMM_ROWS;
}

/* Enough tasks to spread over the pool: want per thread. */
static int64_t tasks_wanted(tern_threadpool *pool)
{
	return 4 * (int64_t)(pool ? tern_threadpool_size(pool) : 1);
}

typedef struct rows_job {
	const tern_packed *pa;
	int64_t n, groups, per_group;
	const tern_gemm_b *b;
	const tern_gemm_c *c;
	tern_fill_b fill;
	const void *fill_ctx;
} rows_job;

/* One task: NR columns of C for a group of panels, PACK_KC rows of B at a time. B is read in place, but
 * a block made by fill, or the last columns (which must not be read past), is copied to contiguous memory
 * first; either way every panel of the group uses it. */
static void rows_task(void *ctx, int64_t t)
{
	const rows_job *j = ctx;
	const tern_packed *pa = j->pa;
	const gemm_isa *isa = pa->isa;
	const tern_gemm_c *c = j->c;
	int64_t nr = isa->nr, col0 = t / j->groups * nr, cols = min64(nr, j->n - col0);
	int64_t p0 = t % j->groups * j->per_group, p1 = min64(p0 + j->per_group, pa->panels);
	float block[PACK_KC * TERN_PACKED_MAX_NR];
	int64_t off[PACK_KC];
	for (int64_t k0 = 0; k0 < pa->k || k0 == 0; k0 += PACK_KC) {
		int64_t kc = min64(PACK_KC, pa->k - k0);
		const float *bb = block;
		if (j->fill) {
			j->fill(j->fill_ctx, k0, kc, col0, cols, block, nr);
			for (int64_t p = 0; p < kc; p++)
				off[p] = p * nr;
		} else {
			const tern_gemm_b *b = j->b;
			for (int64_t p = 0; p < kc; p++)
				off[p] = b->row_off ? b->row_off[k0 + p] : (k0 + p) * b->ldb;
			bb = b->data + col0;
			if (cols < nr) {
				for (int64_t p = 0; p < kc; p++) {
					memcpy(block + p * nr, bb + off[p], (size_t)cols * sizeof *block);
					memset(block + p * nr + cols, 0, (size_t)(nr - cols) * sizeof *block);
					off[p] = p * nr;
				}
				bb = block;
			}
		}
		bool add = k0 > 0 || c->accumulate;
		for (int64_t panel = p0; panel < p1; panel++)
			for (int64_t r0 = 0; r0 < isa->p && panel * isa->p + r0 < pa->m; r0 += isa->r) {
				int64_t row0 = panel * isa->p + r0;
				isa->rows(kc, pa->data + (panel * pa->k + k0) * isa->p + r0, bb, off,
				          c->data + row0 * c->ldc + col0, c->ldc, (int)min64(isa->r, pa->m - row0),
				          (int)cols, c->bias ? c->bias + row0 : NULL, add);
			}
	}
	int64_t row0 = p0 * isa->p;
	act_block(c, c->data + row0 * c->ldc + col0, min64(p1 * isa->p, pa->m) - row0, cols);
}

static void run_rows(tern_threadpool *pool, const tern_packed *a, int64_t n, const tern_gemm_b *b, const tern_gemm_c *c,
                     tern_fill_b fill, const void *fill_ctx)
{
	int64_t blocks = ceil_div64(n, a->isa->nr), want = tasks_wanted(pool);
	int64_t groups = blocks >= want ? 1 : ceil_div64(want, blocks);
	int64_t per_group = ceil_div64(a->panels, min64(groups, a->panels));
	rows_job job = {a, n, ceil_div64(a->panels, per_group), per_group, b, c, fill, fill_ctx};
	tern_parallel_for(pool, blocks * job.groups, rows_task, &job);
}

typedef struct cols_job {
	const tern_packed *pa;
	const tern_gemm_b *b;
	const tern_gemm_c *c;
	int64_t width, per_run, tiles, tile_groups, per_tile_group;
} cols_job;

/* One task: one panel by a group of tiles, each over the whole shared dimension. */
static void cols_task(void *ctx, int64_t t)
{
	const cols_job *j = ctx;
	const tern_packed *pa = j->pa;
	const gemm_isa *isa = pa->isa;
	const tern_gemm_b *b = j->b;
	const tern_gemm_c *c = j->c;
	int64_t panel = t / j->tile_groups, q0 = t % j->tile_groups * j->per_tile_group;
	int64_t q1 = min64(q0 + j->per_tile_group, j->tiles), row0 = panel * isa->p;
	int rows = (int)min64(isa->p, pa->m - row0);
	const float *bias = c->bias && !c->accumulate ? c->bias + row0 : NULL;
	float bias_rows[2 * 16];
	if (bias && rows < isa->p) {
		memset(bias_rows, 0, sizeof bias_rows);
		memcpy(bias_rows, bias, (size_t)rows * sizeof *bias);
		bias = bias_rows;
	}
	const float *a = pa->data + panel * pa->k * isa->p;
	for (int64_t q = q0; q < q1; q++) {
		int64_t r = q / j->per_run, i = q % j->per_run;
		int64_t x0 = i * j->width / j->per_run, x1 = (i + 1) * j->width / j->per_run, col = r * j->width + x0;
		float *cp = c->trans ? c->data + col * c->ldc + row0 : c->data + row0 * c->ldc + col;
		isa->cols[x1 - x0](pa->k, a, b->data + r * b->stride + x0 * b->step, b->row_off, b->ldb, b->step, cp,
		                   c->ldc, rows, bias, c->accumulate, c->trans);
	}
	/* the task's columns of C are contiguous: from its first tile's to its last tile's end */
	int64_t first = q0 / j->per_run * j->width + q0 % j->per_run * j->width / j->per_run;
	int64_t last = (q1 - 1) / j->per_run * j->width + ((q1 - 1) % j->per_run + 1) * j->width / j->per_run;
	if (c->trans)
		act_block(c, c->data + first * c->ldc + row0, last - first, rows);
	else
		act_block(c, c->data + row0 * c->ldc + first, rows, last - first);
}

static void run_cols(tern_threadpool *pool, const tern_packed *a, int64_t n, const tern_gemm_b *b, const tern_gemm_c *c)
{
	int64_t width = b->width ? b->width : n, per_run = tiles_per_run(a->isa, width), tiles = n / width * per_run;
	int64_t groups = ceil_div64(tasks_wanted(pool), a->panels);
	int64_t per_group = ceil_div64(tiles, min64(groups, tiles));
	cols_job job = {a, b, c, width, per_run, tiles, ceil_div64(tiles, per_group), per_group};
	tern_parallel_for(pool, a->panels * job.tile_groups, cols_task, &job);
}

void tern_gemm_packed_run(tern_threadpool *pool, const tern_packed *a, int64_t n, const tern_gemm_b *b,
                          const tern_gemm_c *c, tern_gemm_kind kind)
{
	if (a->m <= 0 || n <= 0)
		return;
	/* The team's idle workers spin before they sleep, so sharing a product costs a few hundred
	 * nanoseconds: below about 65,000 multiply-adds (a few microseconds of work) it is not worth it. A
	 * recurrent step's matrix-vector product (LSTM 256 x 1024: 262,144) gains twice over: two cores and
	 * two caches holding the weights (lstm_lm at --threads 2: 0.70 -> 0.40 ms). */
	if (a->m * n * a->k < ((int64_t)1 << 16))
		pool = NULL;
	int64_t width = b->width ? b->width : n;
	bool contiguous = b->step == 1 && (width == n || b->stride == width);
	if (kind == TERN_GEMM_AUTO)
		kind = contiguous ? tern_gemm_choose(a, n, n / width, width, c->trans, (size_t)(a->k * n) * sizeof(float))
		                  : TERN_GEMM_COLS;
	if (kind == TERN_GEMM_ROWS && contiguous && !c->trans)
		run_rows(pool, a, n, b, c, NULL, NULL);
	else
		run_cols(pool, a, n, b, c);
}

void tern_gemm_packed(tern_threadpool *pool, const tern_packed *a, int64_t n, const float *b, int64_t ldb,
                      const float *bias, float *c, int64_t ldc)
{
	tern_gemm_b bd = {b, NULL, ldb, n, n, 1};
	tern_gemm_c cd = {c, ldc, false, false, bias};
	tern_gemm_packed_run(pool, a, n, &bd, &cd, TERN_GEMM_AUTO);
}

void tern_gemm_packed_fill(tern_threadpool *pool, const tern_packed *a, int64_t n, tern_fill_b fill, const void *ctx,
                           const float *bias, float *c, int64_t ldc)
{
	if (a->m <= 0 || n <= 0)
		return;
	tern_gemm_c cd = {c, ldc, false, false, bias};
	run_rows(pool, a, n, NULL, &cd, fill, ctx);
}

static bool is_half(int dtype)
{
	return dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16;
}

static size_t round_up(size_t n)
{
	return (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
}

/* ---------------------------------------------------------------- batches of products */

/* count products Y[i] (m x n, at i*m*n) = op(A at a_off[i]) x op(B at b_off[i]). */
typedef struct product_batch {
	int64_t m, n, k, count;
	bool ta, tb;
	int64_t lda, ldb;
	int64_t *a_off, *b_off; /* count entries each, in the same allocation as the struct */
	tern_packed *packed; /* MatMul: B^T packed when B is float32 known when planning, one product */
} product_batch;

static void product_batch_free(void *p)
{
	product_batch *pb = p;
	if (pb)
		tern_packed_free(pb->packed);
	free(pb);
}

/* X W for X of m rows of k floats and W packed transposed (n x k): computed as (W^T)(X^T), the cols
 * kernel reading X's rows as columns and storing the product transposed, i.e. as X W's rows. */
static void product_packed(tern_threadpool *pool, const tern_packed *wt, int64_t m, int64_t k, int64_t n,
                           const float *x, bool x_trans, float *y, const float *bias, bool accumulate)
{
	tern_gemm_b b = {x, NULL, x_trans ? m : 1, m, 0, x_trans ? 1 : k};
	tern_gemm_c c = {y, n, true, accumulate, bias};
	tern_gemm_packed_run(pool, wt, m, &b, &c, TERN_GEMM_COLS);
}

static product_batch *product_batch_new(int64_t count, size_t extra)
{
	size_t head = round_up(sizeof(product_batch) + extra);
	product_batch *pb = tern_xmalloc(head + 2 * (size_t)count * sizeof(int64_t));
	if (!pb)
		return NULL;
	memset(pb, 0, sizeof *pb);
	pb->count = count;
	pb->a_off = (int64_t *)((char *)pb + head);
	pb->b_off = pb->a_off + count;
	return pb;
}

/* Products below this many multiply-adds run one per thread; larger ones use BLAS's own threads. */
#define SMALL_PRODUCT (1 << 18)

typedef struct product_ctx {
	const product_batch *pb;
	int dtype; /* FLOAT, DOUBLE or an integer type */
	const void *a, *b;
	void *y;
} product_ctx;

#define PLAIN_PRODUCT(FN, T)                                                                \
	FN(pb->ta, pb->tb, pb->m, pb->n, pb->k, 1, (const T *)c->a + pb->a_off[i], pb->lda, \
	   (const T *)c->b + pb->b_off[i], pb->ldb, 0, (T *)c->y + i * pb->m * pb->n, pb->n)

static void product_one(void *ctx, int64_t i)
{
	const product_ctx *c = ctx;
	const product_batch *pb = c->pb;
	switch (c->dtype) {
	case TERN_FLOAT:
		tern_gemm_f32(pb->ta, pb->tb, pb->m, pb->n, pb->k, 1.0f, (const float *)c->a + pb->a_off[i], pb->lda,
		              (const float *)c->b + pb->b_off[i], pb->ldb, 0.0f, (float *)c->y + i * pb->m * pb->n,
		              pb->n);
		break;
	case TERN_DOUBLE:
		tern_gemm_f64(pb->ta, pb->tb, pb->m, pb->n, pb->k, 1.0, (const double *)c->a + pb->a_off[i], pb->lda,
		              (const double *)c->b + pb->b_off[i], pb->ldb, 0.0, (double *)c->y + i * pb->m * pb->n,
		              pb->n);
		break;
	case TERN_INT32: PLAIN_PRODUCT(gemm_plain_i32, int32_t); break;
	case TERN_INT64: PLAIN_PRODUCT(gemm_plain_i64, int64_t); break;
	case TERN_UINT32: PLAIN_PRODUCT(gemm_plain_u32, uint32_t); break;
	case TERN_UINT64: PLAIN_PRODUCT(gemm_plain_u64, uint64_t); break;
	}
}

static void run_products(const product_batch *pb, int dtype, const void *a, const void *b, void *y,
                         tern_threadpool *pool)
{
	product_ctx c = {pb, dtype, a, b, y};
	bool blas = dtype == TERN_FLOAT || dtype == TERN_DOUBLE;
	if (pb->count > 1 && (!blas || pb->m * pb->n * pb->k < SMALL_PRODUCT))
		tern_parallel_for(pool, pb->count, product_one, &c);
	else
		for (int64_t i = 0; i < pb->count; i++)
			product_one(&c, i);
}

/* Numpy matmul shapes: the last two dimensions multiply, the leading ones broadcast; a 1-D operand
 * gains a dimension of 1 that the result then drops. */
static tern_status matmul_shape(const tern_node *node, const tern_tensor *a, const tern_tensor *b, int *rank,
                                int64_t *dims, product_batch **out)
{
	char sa[96], sb[96];
	if (a->rank < 1 || b->rank < 1)
		return tern_node_errorf(node, TERN_EDATA, "operands must have rank >= 1, got %s and %s",
		                        tern_shape_str(a->dtype, a->rank, a->dims, sa, sizeof sa),
		                        tern_shape_str(b->dtype, b->rank, b->dims, sb, sizeof sb));
	int ra = a->rank, rb = b->rank;
	int64_t m = ra >= 2 ? a->dims[ra - 2] : 1, k = a->dims[ra - 1];
	int64_t kb = rb >= 2 ? b->dims[rb - 2] : b->dims[0], n = rb >= 2 ? b->dims[rb - 1] : 1;
	if (k != kb)
		return tern_node_errorf(node, TERN_EDATA, "inner dimensions differ: A is %s, B is %s (%lld vs %lld)",
		                        tern_shape_str(a->dtype, ra, a->dims, sa, sizeof sa),
		                        tern_shape_str(b->dtype, rb, b->dims, sb, sizeof sb), (long long)k,
		                        (long long)kb);
	int bra = ra > 2 ? ra - 2 : 0, brb = rb > 2 ? rb - 2 : 0, br;
	int64_t bdims[TERN_MAX_RANK];
	tern_status st = tern_broadcast_shape(node, bra, a->dims, brb, b->dims, &br, bdims);
	if (st)
		return st;
	int64_t count = tern_numel(br, bdims);
	/* Strides of A's and B's batch dimensions against the broadcast batch shape (0 where broadcast). */
	int64_t sa_[TERN_MAX_RANK], sb_[TERN_MAX_RANK];
	int64_t step_a = m * k, step_b = k * n;
	bool a_full = bra == br, b_none = true;
	for (int d = br - 1; d >= 0; d--) {
		int ia = d - (br - bra), ib = d - (br - brb);
		int64_t la = ia >= 0 ? a->dims[ia] : 1, lb = ib >= 0 ? b->dims[ib] : 1;
		sa_[d] = la == 1 && bdims[d] != 1 ? 0 : step_a;
		sb_[d] = lb == 1 && bdims[d] != 1 ? 0 : step_b;
		if (la != bdims[d])
			a_full = false;
		if (lb != 1)
			b_none = false;
		step_a *= la;
		step_b *= lb;
	}
	/* One shared B under a stacked A is a single taller product. */
	bool fold = count > 1 && a_full && b_none && ra >= 2;
	product_batch *pb = product_batch_new(fold ? 1 : count, 0);
	if (!pb)
		return tern_node_errorf(node, TERN_EOS, "out of memory");
	pb->m = fold ? m * count : m;
	pb->n = n;
	pb->k = k;
	pb->lda = k;
	pb->ldb = n;
	for (int64_t i = 0; i < pb->count; i++) {
		int64_t rest = i, oa = 0, ob = 0;
		for (int d = br - 1; d >= 0; d--) {
			int64_t idx = rest % bdims[d];
			rest /= bdims[d];
			oa += idx * sa_[d];
			ob += idx * sb_[d];
		}
		pb->a_off[i] = oa;
		pb->b_off[i] = ob;
	}
	*rank = br;
	memcpy(dims, bdims, (size_t)br * sizeof *dims);
	if (ra >= 2)
		dims[(*rank)++] = m;
	if (rb >= 2)
		dims[(*rank)++] = n;
	*out = pb;
	return TERN_OK;
}

static tern_status check_float_or_int(const tern_node *node, int dtype)
{
	switch (dtype) {
	case TERN_FLOAT:
	case TERN_DOUBLE:
	case TERN_FLOAT16:
	case TERN_BFLOAT16:
	case TERN_INT32:
	case TERN_INT64:
	case TERN_UINT32:
	case TERN_UINT64: return TERN_OK;
	}
	return tern_node_errorf(node, TERN_EDATA, "unsupported element type %s", tern_dtype_name(dtype));
}

static tern_status check_same_dtype(const tern_node *node, const tern_tensor *a, const tern_tensor *b, int index)
{
	if (a->dtype != b->dtype)
		return tern_node_errorf(node, TERN_EDATA, "input %d is %s, input 0 is %s", index,
		                        tern_dtype_name(b->dtype), tern_dtype_name(a->dtype));
	return TERN_OK;
}

/* ---------------------------------------------------------------- MatMul */

/* float16 and bfloat16 products run in float: the operands and the result are widened into scratch. */
static size_t half_scratch(const tern_tensor *a, const tern_tensor *b, int64_t y_numel)
{
	return round_up((size_t)tern_tensor_numel(a) * 4) + round_up((size_t)tern_tensor_numel(b) * 4) +
	        round_up((size_t)y_numel * 4);
}

static tern_status matmul_kernel(const tern_kernel_args *a)
{
	const product_batch *pb = a->params;
	const tern_tensor *A = a->in[0], *B = a->in[1];
	tern_tensor *Y = a->out[0];
	if (pb->packed) {
		product_packed(a->pool, pb->packed, pb->m, pb->k, pb->n, A->data, false, Y->data, NULL, false);
		return TERN_OK;
	}
	if (!is_half(A->dtype)) {
		run_products(pb, A->dtype, A->data, B->data, Y->data, a->pool);
		return TERN_OK;
	}
	int64_t na = tern_tensor_numel(A), nb = tern_tensor_numel(B), ny = tern_tensor_numel(Y);
	float *fa = a->scratch, *fb = (float *)((char *)fa + round_up((size_t)na * 4));
	float *fy = (float *)((char *)fb + round_up((size_t)nb * 4));
	tern_half_to_f32(A->dtype, A->data, fa, na);
	tern_half_to_f32(B->dtype, B->data, fb, nb);
	run_products(pb, TERN_FLOAT, fa, fb, fy, a->pool);
	tern_f32_to_half(Y->dtype, fy, Y->data, ny);
	return TERN_OK;
}

static tern_status matmul_prepare(tern_prepare_args *p)
{
	const tern_tensor *A = p->in[0], *B = p->in[1];
	tern_status st = check_float_or_int(p->node, A->dtype);
	if (!st)
		st = check_same_dtype(p->node, A, B, 1);
	if (st)
		return st;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	product_batch *pb = NULL;
	if ((st = matmul_shape(p->node, A, B, &rank, dims, &pb)))
		return st;
	tern_set_shape(p->out[0], A->dtype, rank, dims);
	p->params = pb;
	p->free_params = product_batch_free;
	p->kernel = matmul_kernel;
	if (is_half(A->dtype))
		p->scratch_bytes = half_scratch(A, B, tern_numel(rank, dims));
	/* constant float32 weights: packed once (a batch of A folds into one product with B) */
	if (A->dtype == TERN_FLOAT && B->data && B->rank == 2 && pb->count == 1 &&
	    !(pb->packed = tern_pack_a(pb->n, pb->k, B->data, pb->n, true, 1.0f)))
		return tern_node_errorf(p->node, TERN_EOS, "out of memory");
	if (pb->packed)
		p->packed_inputs |= 1u << 1;
	return TERN_OK;
}

/* tern.FusedMatMul in one pass when it can be: float A, B a 2-D float known when planning (packed
 * with alpha), the bias (if any) a constant of B's columns; the bias and the activation are applied
 * as the products are stored. */
typedef struct fused_matmul {
	tern_packed *packed;
	int64_t m, k, n;
	float *bias; /* n, or NULL */
	tern_act act;
} fused_matmul;

static void fused_matmul_free(void *p)
{
	fused_matmul *f = p;
	if (f) {
		tern_packed_free(f->packed);
		free(f->bias);
	}
	free(f);
}

static tern_status fused_matmul_kernel(const tern_kernel_args *a)
{
	const fused_matmul *f = a->params;
	tern_gemm_b b = {a->in[0]->data, NULL, 1, f->m, 0, f->k};
	tern_gemm_c c = {
	        a->out[0]->data, f->n, true, false, f->bias, f->act.kind == TERN_ACT_NONE ? NULL : &f->act, NULL};
	tern_gemm_packed_run(a->pool, f->packed, f->m, &b, &c, TERN_GEMM_COLS);
	return TERN_OK;
}

tern_status tern_fused_matmul_prepare(tern_prepare_args *p)
{
	const tern_tensor *A = p->in[0], *B = p->n_in > 1 ? p->in[1] : NULL, *bias = p->n_in > 2 ? p->in[2] : NULL;
	tern_act act;
	bool one_output = p->n_out >= 1 && p->out[0];
	for (int i = 1; i < p->n_out; i++)
		one_output &= !p->out[i];
	if (!one_output || p->n_in > 3 || !A || !B || A->dtype != TERN_FLOAT || B->dtype != TERN_FLOAT || !B->data ||
	    B->rank != 2 || B->dims[0] < 1 || B->dims[1] < 1 || A->rank < 1 || A->dims[A->rank - 1] != B->dims[0] ||
	    (bias &&
	     (bias->dtype != TERN_FLOAT || !bias->data || tern_tensor_numel(bias) != B->dims[1] ||
	      (bias->rank > 1 && bias->dims[bias->rank - 1] != B->dims[1]))) ||
	    !tern_act_from_node(p->node, &act))
		return TERN_OK;
	fused_matmul *f = calloc(1, sizeof *f);
	if (!f)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = f;
	p->free_params = fused_matmul_free;
	f->k = B->dims[0];
	f->n = B->dims[1];
	f->m = f->k ? tern_tensor_numel(A) / f->k : 0;
	f->act = act;
	float alpha = tern_attr_float(p->node, "alpha", 1.0f);
	if (!(f->packed = tern_pack_a(f->n, f->k, B->data, f->n, true, alpha)) ||
	    (bias && !(f->bias = malloc((size_t)f->n * sizeof *f->bias))))
		return tern_errorf(TERN_EOS, "out of memory");
	if (bias)
		memcpy(f->bias, bias->data, (size_t)f->n * sizeof *f->bias);
	p->packed_inputs |= 1u << 1 | (bias ? 1u << 2 : 0u);
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, A->dims, (size_t)A->rank * sizeof *dims);
	dims[A->rank - 1] = f->n;
	tern_set_shape(p->out[0], TERN_FLOAT, A->rank, dims);
	p->kernel = fused_matmul_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- Gemm */

typedef struct gemm_params {
	bool ta, tb, has_c;
	int64_t m, n, k;
	float alpha, beta;
	int64_t c_rs, c_cs; /* C's row and column strides against Y (0 where broadcast) */
	tern_packed *packed; /* alpha op(B)^T, when B is float32 known when planning */
	float *bias; /* with packed: beta C per column of Y, when C is known and the same for every row */
} gemm_params;

static void gemm_free(void *p)
{
	gemm_params *g = p;
	if (g) {
		tern_packed_free(g->packed);
		free(g->bias);
	}
	free(g);
}

/* Y = beta * C, C broadcast to Y's shape, before the product accumulates into it. */
#define FILL_FROM_C(T, y, c, g)                      \
	for (int64_t i = 0; i < (g)->m; i++)         \
		for (int64_t j = 0; j < (g)->n; j++) \
	(y)[i * (g)->n + j] = (T)(g)->beta * (c)[i * (g)->c_rs + j * (g)->c_cs]

static tern_status gemm_kernel(const tern_kernel_args *a)
{
	const gemm_params *g = a->params;
	const tern_tensor *A = a->in[0], *B = a->in[1], *C = a->n_in > 2 ? a->in[2] : NULL;
	tern_tensor *Y = a->out[0];
	bool add_c = g->has_c && g->beta != 0;
	int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
	if (g->packed) {
		if (add_c && !g->bias)
			FILL_FROM_C(float, (float *)Y->data, (const float *)C->data, g);
		product_packed(a->pool, g->packed, g->m, g->k, g->n, A->data, g->ta, Y->data, g->bias,
		               add_c && !g->bias);
		return TERN_OK;
	}
	switch (A->dtype) {
	case TERN_FLOAT:
		if (add_c)
			FILL_FROM_C(float, (float *)Y->data, (const float *)C->data, g);
		tern_gemm_f32(g->ta, g->tb, g->m, g->n, g->k, g->alpha, A->data, lda, B->data, ldb, add_c ? 1.0f : 0.0f,
		              Y->data, g->n);
		return TERN_OK;
	case TERN_DOUBLE:
		if (add_c)
			FILL_FROM_C(double, (double *)Y->data, (const double *)C->data, g);
		tern_gemm_f64(g->ta, g->tb, g->m, g->n, g->k, g->alpha, A->data, lda, B->data, ldb, add_c ? 1.0 : 0.0,
		              Y->data, g->n);
		return TERN_OK;
	}
	if (is_half(A->dtype)) {
		int64_t na = tern_tensor_numel(A), nb = tern_tensor_numel(B), ny = g->m * g->n;
		float *fa = a->scratch, *fb = (float *)((char *)fa + round_up((size_t)na * 4));
		float *fy = (float *)((char *)fb + round_up((size_t)nb * 4));
		tern_half_to_f32(A->dtype, A->data, fa, na);
		tern_half_to_f32(B->dtype, B->data, fb, nb);
		if (add_c)
			for (int64_t i = 0; i < g->m; i++)
				for (int64_t j = 0; j < g->n; j++)
					fy[i * g->n + j] =
					        g->beta * (float)tern_tensor_get_f64(C, i * g->c_rs + j * g->c_cs);
		tern_gemm_f32(g->ta, g->tb, g->m, g->n, g->k, g->alpha, fa, lda, fb, ldb, add_c ? 1.0f : 0.0f, fy,
		              g->n);
		tern_f32_to_half(Y->dtype, fy, Y->data, ny);
		return TERN_OK;
	}
	/* Integers: the exact product, then alpha and beta * C applied in double and truncated. */
	product_batch pb = {g->m, g->n, g->k, 1, g->ta, g->tb, lda, ldb, (int64_t[]){0}, (int64_t[]){0}};
	product_ctx c = {&pb, A->dtype, A->data, B->data, Y->data};
	product_one(&c, 0);
	if (g->alpha == 1 && !add_c)
		return TERN_OK;
	for (int64_t i = 0; i < g->m; i++)
		for (int64_t j = 0; j < g->n; j++) {
			int64_t o = i * g->n + j;
			double v = g->alpha * tern_tensor_get_f64(Y, o);
			if (add_c)
				v += g->beta * tern_tensor_get_f64(C, i * g->c_rs + j * g->c_cs);
			switch (Y->dtype) {
			case TERN_INT32: ((int32_t *)Y->data)[o] = (int32_t)v; break;
			case TERN_INT64: ((int64_t *)Y->data)[o] = (int64_t)v; break;
			case TERN_UINT32: ((uint32_t *)Y->data)[o] = (uint32_t)v; break;
			case TERN_UINT64: ((uint64_t *)Y->data)[o] = (uint64_t)v; break;
			}
		}
	return TERN_OK;
}

static tern_status gemm_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *A = p->in[0], *B = p->in[1], *C = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_float_or_int(node, A->dtype);
	if (!st)
		st = check_same_dtype(node, A, B, 1);
	if (!st && C)
		st = check_same_dtype(node, A, C, 2);
	if (st)
		return st;
	char sa[96], sb[96];
	if (A->rank != 2 || B->rank != 2)
		return tern_node_errorf(node, TERN_EDATA, "A and B must be matrices, got %s and %s",
		                        tern_shape_str(A->dtype, A->rank, A->dims, sa, sizeof sa),
		                        tern_shape_str(B->dtype, B->rank, B->dims, sb, sizeof sb));
	gemm_params *g = calloc(1, sizeof *g);
	if (!g)
		return tern_node_errorf(node, TERN_EOS, "out of memory");
	g->ta = tern_attr_int(node, "transA", 0) != 0;
	g->tb = tern_attr_int(node, "transB", 0) != 0;
	g->alpha = tern_attr_float(node, "alpha", 1.0f);
	g->beta = tern_attr_float(node, "beta", 1.0f);
	g->m = A->dims[g->ta ? 1 : 0];
	g->k = A->dims[g->ta ? 0 : 1];
	int64_t kb = B->dims[g->tb ? 1 : 0];
	g->n = B->dims[g->tb ? 0 : 1];
	p->params = g;
	p->free_params = gemm_free;
	if (g->k != kb)
		return tern_node_errorf(node, TERN_EDATA,
		                        "inner dimensions differ: op(A) is %lldx%lld, op(B) is %lldx%lld",
		                        (long long)g->m, (long long)g->k, (long long)kb, (long long)g->n);
	if (C) {
		/* C broadcasts one way, to [M, N]. */
		int64_t cr = C->rank == 2 ? C->dims[0] : 1, cc = C->rank >= 1 ? C->dims[C->rank - 1] : 1;
		if (C->rank > 2 || (cr != 1 && cr != g->m) || (cc != 1 && cc != g->n))
			return tern_node_errorf(node, TERN_EDATA, "input 2 'C' %s does not broadcast to [%lld,%lld]",
			                        tern_shape_str(C->dtype, C->rank, C->dims, sa, sizeof sa),
			                        (long long)g->m, (long long)g->n);
		g->has_c = true;
		g->c_rs = cr == 1 ? 0 : cc;
		g->c_cs = cc == 1 ? 0 : 1;
	}
	int64_t dims[2] = {g->m, g->n};
	tern_set_shape(p->out[0], A->dtype, 2, dims);
	p->kernel = gemm_kernel;
	if (is_half(A->dtype))
		p->scratch_bytes = half_scratch(A, B, g->m * g->n);
	if (A->dtype != TERN_FLOAT || !B->data)
		return TERN_OK;
	if (!(g->packed = tern_pack_a(g->n, g->k, B->data, g->tb ? g->k : g->n, !g->tb, g->alpha)))
		return tern_node_errorf(node, TERN_EOS, "out of memory");
	p->packed_inputs |= 1u << 1;
	/* a C known now that is the same for every row of Y: beta C becomes the product's bias */
	if (g->has_c && g->beta != 0 && g->c_rs == 0 && C->data) {
		if (!(g->bias = malloc((size_t)(g->n ? g->n : 1) * sizeof *g->bias)))
			return tern_node_errorf(node, TERN_EOS, "out of memory");
		for (int64_t j = 0; j < g->n; j++)
			g->bias[j] = g->beta * ((const float *)C->data)[j * g->c_cs];
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- MatMulInteger, QLinearMatMul */

static tern_status check_quant_param(const tern_node *node, const tern_tensor *t, int index, int64_t per,
                                     const char *what)
{
	if (!t)
		return TERN_OK;
	int64_t n = tern_tensor_numel(t);
	if (n == 1 || (t->rank == 1 && n == per))
		return TERN_OK;
	char s[96];
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' %s must be a scalar or have %lld elements", index,
	                        what, tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s), (long long)per);
}

/* Value of a per-tensor or per-row/column parameter for row or column i. */
static double quant_at(const tern_tensor *t, int64_t i)
{
	return tern_tensor_get_f64(t, tern_tensor_numel(t) == 1 ? 0 : i);
}

/* Widens an 8-bit matrix (stacked along leading dimensions) to int32 minus its zero point; rows and
 * columns index the zero point when it has one value per row (A) or per column (B). */
static void widen_minus_zero(const tern_tensor *x, const tern_tensor *zp, bool zp_per_col, int64_t rows, int64_t cols,
                             int32_t *dst)
{
	int64_t n = tern_tensor_numel(x);
	int64_t nz = zp ? tern_tensor_numel(zp) : 0;
	int32_t z0 = zp ? (int32_t)tern_tensor_get_f64(zp, 0) : 0;
	for (int64_t i = 0; i < n; i++) {
		int32_t z = z0;
		if (nz > 1)
			z = (int32_t)tern_tensor_get_f64(zp, zp_per_col ? i % cols : (i / cols) % rows);
		int32_t v = x->dtype == TERN_INT8 ? ((const int8_t *)x->data)[i] : ((const uint8_t *)x->data)[i];
		dst[i] = v - z;
	}
}

/* The matrix shape of an operand of MatMul: rows, columns (a 1-D operand is a row for A, a column
 * for B). */
static void matrix_dims(const tern_tensor *t, bool is_b, int64_t *rows, int64_t *cols)
{
	if (t->rank >= 2) {
		*rows = t->dims[t->rank - 2];
		*cols = t->dims[t->rank - 1];
	} else {
		*rows = is_b ? t->dims[0] : 1;
		*cols = is_b ? 1 : t->dims[0];
	}
}

/* acc = (A - zero point of A) x (B - zero point of B) in int32, widening the operands into scratch. */
static void integer_product(const tern_kernel_args *a, const tern_tensor *A, const tern_tensor *zpa,
                            const tern_tensor *B, const tern_tensor *zpb, int32_t *acc)
{
	int64_t ar, ac, br, bc;
	matrix_dims(A, false, &ar, &ac);
	matrix_dims(B, true, &br, &bc);
	int32_t *wa = a->scratch, *wb = (int32_t *)((char *)wa + round_up((size_t)tern_tensor_numel(A) * 4));
	widen_minus_zero(A, zpa, false, ar, ac, wa);
	widen_minus_zero(B, zpb, true, br, bc, wb);
	run_products(a->params, TERN_INT32, wa, wb, acc, a->pool);
}

static tern_status matmul_integer_kernel(const tern_kernel_args *a)
{
	integer_product(a, a->in[0], a->n_in > 2 ? a->in[2] : NULL, a->in[1], a->n_in > 3 ? a->in[3] : NULL,
	                a->out[0]->data);
	return TERN_OK;
}

static tern_status qlinear_matmul_kernel(const tern_kernel_args *a)
{
	const product_batch *pb = a->params;
	const tern_tensor *sa = a->in[1], *sb = a->in[4], *sy = a->in[6], *zy = a->in[7];
	tern_tensor *Y = a->out[0];
	int64_t na = tern_tensor_numel(a->in[0]), nb = tern_tensor_numel(a->in[3]), ny = tern_tensor_numel(Y);
	int32_t *acc = (int32_t *)((char *)a->scratch + round_up((size_t)na * 4) + round_up((size_t)nb * 4));
	integer_product(a, a->in[0], a->in[2], a->in[3], a->in[5], acc);
	int64_t m = a->in[0]->rank >= 2 ? a->in[0]->dims[a->in[0]->rank - 2] : 1, n = pb->n;
	bool is_u8 = Y->dtype == TERN_UINT8;
	for (int64_t i = 0; i < ny; i++) {
		int64_t row = (i / n) % m, col = i % n;
		double scale = quant_at(sa, row) * quant_at(sb, col) / quant_at(sy, row);
		double v = nearbyint(acc[i] * scale) + quant_at(zy, row);
		double lo = is_u8 ? 0 : -128, hi = is_u8 ? 255 : 127;
		v = v < lo ? lo : v > hi ? hi : v;
		if (is_u8)
			((uint8_t *)Y->data)[i] = (uint8_t)v;
		else
			((int8_t *)Y->data)[i] = (int8_t)v;
	}
	return TERN_OK;
}

static bool is_8bit(int dtype)
{
	return dtype == TERN_INT8 || dtype == TERN_UINT8;
}

static tern_status integer_prepare(tern_prepare_args *p, bool qlinear)
{
	const tern_node *node = p->node;
	int ia = 0, ib = qlinear ? 3 : 1;
	const tern_tensor *A = p->in[ia], *B = p->in[ib];
	if (!is_8bit(A->dtype) || !is_8bit(B->dtype))
		return tern_node_errorf(node, TERN_EDATA, "operands must be int8 or uint8, got %s and %s",
		                        tern_dtype_name(A->dtype), tern_dtype_name(B->dtype));
	int64_t ar, ac, br, bc;
	matrix_dims(A, false, &ar, &ac);
	matrix_dims(B, true, &br, &bc);
	tern_status st = TERN_OK;
	if (qlinear) {
		for (int i = 1; i < 8 && !st; i++)
			if (!p->in[i] && i != 2 && i != 5)
				st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
		if (!st)
			st = check_quant_param(node, p->in[1], 1, ar, "a_scale");
		if (!st)
			st = check_quant_param(node, p->in[2], 2, ar, "a_zero_point");
		if (!st)
			st = check_quant_param(node, p->in[4], 4, bc, "b_scale");
		if (!st)
			st = check_quant_param(node, p->in[5], 5, bc, "b_zero_point");
		if (!st)
			st = check_quant_param(node, p->in[6], 6, ar, "y_scale");
		if (!st)
			st = check_quant_param(node, p->in[7], 7, ar, "y_zero_point");
		if (!st && !is_8bit(p->in[7]->dtype))
			st = tern_node_errorf(node, TERN_EDATA, "input 7 'y_zero_point' must be int8 or uint8, got %s",
			                      tern_dtype_name(p->in[7]->dtype));
	} else {
		st = check_quant_param(node, p->n_in > 2 ? p->in[2] : NULL, 2, ar, "a_zero_point");
		if (!st)
			st = check_quant_param(node, p->n_in > 3 ? p->in[3] : NULL, 3, bc, "b_zero_point");
	}
	if (st)
		return st;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	product_batch *pb = NULL;
	if ((st = matmul_shape(node, A, B, &rank, dims, &pb)))
		return st;
	int64_t ny = tern_numel(rank, dims);
	tern_set_shape(p->out[0], qlinear ? p->in[7]->dtype : TERN_INT32, rank, dims);
	p->params = pb;
	p->free_params = free;
	p->kernel = qlinear ? qlinear_matmul_kernel : matmul_integer_kernel;
	p->scratch_bytes = round_up((size_t)tern_tensor_numel(A) * 4) + round_up((size_t)tern_tensor_numel(B) * 4) +
	        (qlinear ? round_up((size_t)ny * 4) : 0);
	return TERN_OK;
}

static tern_status matmul_integer_prepare(tern_prepare_args *p)
{
	return integer_prepare(p, false);
}
static tern_status qlinear_matmul_prepare(tern_prepare_args *p)
{
	return integer_prepare(p, true);
}

/* ---------------------------------------------------------------- Einsum */

#define EIN_MAX_IN 8
#define EIN_MAX_LABELS 64
/* Labels are letters' character codes; the dimensions an ellipsis stands for are ELLIPSIS + j. */
#define EIN_ELLIPSIS 128

typedef struct einsum_plan {
	int n_in;
	int n_labels; /* output labels first, in output order; then the summed ones */
	int n_out;
	int64_t size[EIN_MAX_LABELS];
	int64_t stride[EIN_MAX_IN][EIN_MAX_LABELS]; /* in elements; 0 where a label is absent or broadcast */
	int64_t out_numel, sum_numel;
	/* Two operands without diagonals or lone sums: a batch of products. Labels in class order:
	 * batch, M, N (each in output order) and K. */
	bool gemm;
	int cls_n[4];
	int cls[4][EIN_MAX_LABELS];
	bool copy_a, copy_b, copy_y; /* operands gathered into [batch,M,K] / [batch,K,N], result scattered */
	size_t off_a, off_b, off_y; /* scratch offsets */
	product_batch *pb;
} einsum_plan;

/* The layouts the operands are gathered into: [batch, M, K] and [batch, K, N]; the result's order. */
static const int SEQ_A[3] = {0, 1, 3}, SEQ_B[3] = {0, 3, 2}, SEQ_Y[3] = {0, 1, 2};

static void einsum_free(void *p)
{
	einsum_plan *e = p;
	if (e)
		free(e->pb);
	free(e);
}

/* Splits a term into letters and the position of its ellipsis (-1 when none). */
static bool scan_term(const char *s, size_t len, int *letters, int *n_letters, int *ellipsis_at)
{
	int n = 0;
	*ellipsis_at = -1;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
			if (n >= EIN_MAX_LABELS)
				return false;
			letters[n++] = (unsigned char)c;
		} else if (c == '.' && i + 2 < len && s[i + 1] == '.' && s[i + 2] == '.' && *ellipsis_at < 0) {
			*ellipsis_at = n;
			i += 2;
		} else {
			return false;
		}
	}
	*n_letters = n;
	return true;
}

/* A term's labels dimension by dimension, the ellipsis standing for its last `ell` of ell_rank broadcast
 * dimensions. */
static int expand_term(const int *letters, int n_letters, int ellipsis_at, int ell, int ell_rank, int *labels)
{
	int n = 0;
	for (int i = 0; i <= n_letters; i++) {
		if (i == ellipsis_at)
			for (int j = 0; j < ell; j++)
				labels[n++] = EIN_ELLIPSIS + ell_rank - ell + j;
		if (i < n_letters)
			labels[n++] = letters[i];
	}
	return n;
}

static bool contiguous_in(const einsum_plan *e, int input, const int *order, int n)
{
	int64_t expect = 1;
	for (int i = n - 1; i >= 0; i--) {
		int l = order[i];
		if (e->size[l] != 1 && e->stride[input][l] != expect)
			return false;
		expect *= e->size[l];
	}
	return true;
}

/* Labels of the three classes listed in seq (0 batch, 1 M, 2 N, 3 K), in turn; returns how many. */
static int class_order(const einsum_plan *e, const int *seq, int *order)
{
	int n = 0;
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < e->cls_n[seq[s]]; i++)
			order[n++] = e->cls[seq[s]][i];
	return n;
}

/* Decides whether two operands form a batch of products, and lays out the scratch for it. */
static tern_status einsum_plan_gemm(einsum_plan *e, int in_count[2][EIN_MAX_LABELS], int dtype)
{
	if (e->n_in != 2 || (dtype != TERN_FLOAT && dtype != TERN_DOUBLE))
		return TERN_OK;
	for (int l = 0; l < e->n_labels; l++) {
		bool in_a = in_count[0][l] > 0, in_b = in_count[1][l] > 0, out = l < e->n_out;
		if (in_count[0][l] > 1 || in_count[1][l] > 1)
			return TERN_OK;
		/* a broadcast (size-1 against size-n) dimension needs the general loop */
		if ((in_a && e->stride[0][l] == 0 && e->size[l] != 1) ||
		    (in_b && e->stride[1][l] == 0 && e->size[l] != 1))
			return TERN_OK;
		int c = in_a && in_b ? (out ? 0 : 3) : in_a && out ? 1 : in_b && out ? 2 : -1;
		if (c < 0)
			return TERN_OK;
		e->cls[c][e->cls_n[c]++] = l;
	}
	int64_t prod[4];
	for (int c = 0; c < 4; c++) {
		prod[c] = 1;
		for (int i = 0; i < e->cls_n[c]; i++)
			prod[c] *= e->size[e->cls[c][i]];
	}
	/* [batch, M, K] or, transposed, [batch, K, M]; [batch, K, N] or [batch, N, K]. */
	int order_a[EIN_MAX_LABELS], order_at[EIN_MAX_LABELS], order_b[EIN_MAX_LABELS], order_bt[EIN_MAX_LABELS];
	int na = class_order(e, SEQ_A, order_a), nat = class_order(e, (const int[]){0, 3, 1}, order_at);
	int nb = class_order(e, SEQ_B, order_b), nbt = class_order(e, (const int[]){0, 2, 3}, order_bt);
	int64_t batch = prod[0], m = prod[1], n = prod[2], k = prod[3];
	product_batch *pb = product_batch_new(batch, 0);
	if (!pb)
		return tern_errorf(TERN_EOS, "out of memory");
	e->pb = pb;
	pb->m = m;
	pb->n = n;
	pb->k = k;
	pb->ta = !contiguous_in(e, 0, order_a, na) && contiguous_in(e, 0, order_at, nat);
	pb->tb = !contiguous_in(e, 1, order_b, nb) && contiguous_in(e, 1, order_bt, nbt);
	e->copy_a = !pb->ta && !contiguous_in(e, 0, order_a, na);
	e->copy_b = !pb->tb && !contiguous_in(e, 1, order_b, nb);
	pb->lda = pb->ta ? m : k;
	pb->ldb = pb->tb ? k : n;
	for (int64_t i = 0; i < batch; i++) {
		pb->a_off[i] = i * m * k;
		pb->b_off[i] = i * k * n;
	}
	/* The result [batch, M, N] is the output itself when the output lists batch, M and N labels in turn. */
	int pos = 0;
	e->copy_y = false;
	for (int c = 0; c < 3; c++)
		for (int i = 0; i < e->cls_n[c]; i++)
			if (e->cls[c][i] != pos++)
				e->copy_y = true;
	size_t es = tern_dtype_size(dtype), off = 0;
	e->off_a = off;
	off += e->copy_a ? round_up((size_t)(batch * m * k) * es) : 0;
	e->off_b = off;
	off += e->copy_b ? round_up((size_t)(batch * k * n) * es) : 0;
	e->off_y = off;
	e->gemm = true;
	return TERN_OK;
}

static size_t einsum_scratch(const einsum_plan *e, int dtype)
{
	if (!e->gemm)
		return 0;
	return e->off_y +
	        (e->copy_y ? round_up((size_t)(e->pb->count * e->pb->m * e->pb->n) * tern_dtype_size(dtype)) : 0);
}

/* Copies between a strided and a contiguous layout: walks the labels `order` (last fastest), reading
 * src at src_stride and writing dst at dst_stride. */
static void permute_copy(size_t es, const einsum_plan *e, const int *order, int n, const int64_t *src_stride,
                         const int64_t *dst_stride, const void *src, void *dst)
{
	int64_t idx[EIN_MAX_LABELS] = {0}, so = 0, d = 0, total = 1;
	for (int i = 0; i < n; i++)
		total *= e->size[order[i]];
	for (int64_t t = 0; t < total; t++) {
		if (es == 8)
			((uint64_t *)dst)[d] = ((const uint64_t *)src)[so];
		else
			((uint32_t *)dst)[d] = ((const uint32_t *)src)[so];
		for (int i = n - 1; i >= 0; i--) {
			int l = order[i];
			so += src_stride[l];
			d += dst_stride[l];
			if (++idx[i] < e->size[l])
				break;
			so -= src_stride[l] * e->size[l];
			d -= dst_stride[l] * e->size[l];
			idx[i] = 0;
		}
	}
}

/* Contiguous strides for labels listed in `order`, into an array indexed by label. */
static void contiguous_strides(const einsum_plan *e, const int *order, int n, int64_t *stride)
{
	int64_t s = 1;
	for (int i = n - 1; i >= 0; i--) {
		stride[order[i]] = s;
		s *= e->size[order[i]];
	}
}

static void einsum_gemm(const tern_kernel_args *a, const einsum_plan *e)
{
	int dtype = a->in[0]->dtype;
	size_t es = tern_dtype_size(dtype);
	const void *pa = a->in[0]->data, *pb_ = a->in[1]->data;
	void *y = a->out[0]->data;
	char *scratch = a->scratch;
	int order[EIN_MAX_LABELS], n;
	int64_t stride[EIN_MAX_LABELS] = {0};
	if (e->copy_a) {
		n = class_order(e, SEQ_A, order);
		contiguous_strides(e, order, n, stride);
		permute_copy(es, e, order, n, e->stride[0], stride, pa, scratch + e->off_a);
		pa = scratch + e->off_a;
	}
	if (e->copy_b) {
		n = class_order(e, SEQ_B, order);
		contiguous_strides(e, order, n, stride);
		permute_copy(es, e, order, n, e->stride[1], stride, pb_, scratch + e->off_b);
		pb_ = scratch + e->off_b;
	}
	void *py = e->copy_y ? scratch + e->off_y : y;
	run_products(e->pb, dtype, pa, pb_, py, a->pool);
	if (e->copy_y) {
		n = class_order(e, SEQ_Y, order);
		contiguous_strides(e, order, n, stride);
		int64_t out_stride[EIN_MAX_LABELS] = {0};
		int all[EIN_MAX_LABELS];
		for (int l = 0; l < e->n_out; l++)
			all[l] = l;
		contiguous_strides(e, all, e->n_out, out_stride);
		permute_copy(es, e, order, n, stride, out_stride, py, y);
	}
}

/* The general case: every output element sums the product of its operands over the summed labels. */
#define EINSUM_LOOP(T, ACC, LOAD, STORE)                                                \
	do {                                                                            \
		T *y = a->out[0]->data;                                                 \
		const T *x[EIN_MAX_IN];                                                 \
		for (int i = 0; i < e->n_in; i++)                                       \
			x[i] = a->in[i]->data;                                          \
		int64_t idx[EIN_MAX_LABELS] = {0}, off[EIN_MAX_IN] = {0};               \
		for (int64_t o = 0; o < e->out_numel; o++) {                            \
			ACC acc = 0;                                                    \
			for (int64_t s = 0; s < e->sum_numel; s++) {                    \
				ACC prod = LOAD(x[0][off[0]]);                          \
				for (int i = 1; i < e->n_in; i++)                       \
					prod *= LOAD(x[i][off[i]]);                     \
				acc += prod;                                            \
				for (int l = e->n_labels - 1; l >= 0; l--) {            \
					for (int i = 0; i < e->n_in; i++)               \
						off[i] += e->stride[i][l];              \
					if (++idx[l] < e->size[l])                      \
						break;                                  \
					for (int i = 0; i < e->n_in; i++)               \
						off[i] -= e->stride[i][l] * e->size[l]; \
					idx[l] = 0;                                     \
				}                                                       \
			}                                                               \
			y[o] = STORE(acc);                                              \
		}                                                                       \
	} while (0)

#define ID(x) (x)
#define F16_LOAD(x) tern_f16_to_f32(x)
#define BF16_LOAD(x) tern_bf16_to_f32(x)

static tern_status einsum_kernel(const tern_kernel_args *a)
{
	const einsum_plan *e = a->params;
	if (e->gemm) {
		einsum_gemm(a, e);
		return TERN_OK;
	}
	if (e->out_numel == 0)
		return TERN_OK;
	/* an empty sum leaves zeros; the loop below would read operands that have no elements */
	if (e->sum_numel == 0) {
		memset(a->out[0]->data, 0, (size_t)e->out_numel * tern_dtype_size(a->out[0]->dtype));
		return TERN_OK;
	}
	switch (a->in[0]->dtype) {
	case TERN_FLOAT: EINSUM_LOOP(float, double, ID, (float)); break;
	case TERN_DOUBLE: EINSUM_LOOP(double, double, ID, (double)); break;
	case TERN_FLOAT16: EINSUM_LOOP(uint16_t, float, F16_LOAD, tern_f32_to_f16); break;
	case TERN_BFLOAT16: EINSUM_LOOP(uint16_t, float, BF16_LOAD, tern_f32_to_bf16); break;
	case TERN_INT8: EINSUM_LOOP(int8_t, int64_t, ID, (int8_t)); break;
	case TERN_INT16: EINSUM_LOOP(int16_t, int64_t, ID, (int16_t)); break;
	case TERN_INT32: EINSUM_LOOP(int32_t, int64_t, ID, (int32_t)); break;
	case TERN_INT64: EINSUM_LOOP(int64_t, int64_t, ID, (int64_t)); break;
	case TERN_UINT8: EINSUM_LOOP(uint8_t, uint64_t, ID, (uint8_t)); break;
	case TERN_UINT16: EINSUM_LOOP(uint16_t, uint64_t, ID, (uint16_t)); break;
	case TERN_UINT32: EINSUM_LOOP(uint32_t, uint64_t, ID, (uint32_t)); break;
	case TERN_UINT64: EINSUM_LOOP(uint64_t, uint64_t, ID, (uint64_t)); break;
	}
	return TERN_OK;
}

static tern_status einsum_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const char *eq = tern_attr_string(node, "equation", NULL);
	if (!eq)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'equation' is required");
	if (p->n_in < 1 || p->n_in > EIN_MAX_IN)
		return tern_node_errorf(node, TERN_EDATA, "%d operands; 1 to %d are supported", p->n_in, EIN_MAX_IN);
	int dtype = p->in[0]->dtype;
	for (int i = 0; i < p->n_in; i++) {
		if (!p->in[i])
			return tern_node_errorf(node, TERN_EDATA, "input %d is missing", i);
		tern_status st = check_same_dtype(node, p->in[0], p->in[i], i);
		if (st)
			return st;
	}
	if (!(TERN_DT_NUMERIC & (1u << dtype)))
		return tern_node_errorf(node, TERN_EDATA, "unsupported element type %s", tern_dtype_name(dtype));
	/* Without spaces, split into the operand terms and the output term. */
	size_t len = strlen(eq);
	char *buf = malloc(len + 1);
	einsum_plan *e = calloc(1, sizeof *e);
	if (!buf || !e) {
		free(buf);
		free(e);
		return tern_node_errorf(node, TERN_EOS, "out of memory");
	}
	p->params = e;
	p->free_params = einsum_free;
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		if (eq[i] != ' ')
			buf[n++] = eq[i];
	buf[n] = '\0';
	char *arrow = strstr(buf, "->");
	size_t lhs_len = arrow ? (size_t)(arrow - buf) : n;
	const char *term[EIN_MAX_IN];
	size_t term_len[EIN_MAX_IN];
	int n_terms = 0;
	tern_status st = TERN_OK;
	for (size_t i = 0, start = 0; i <= lhs_len; i++) {
		if (i < lhs_len && buf[i] != ',')
			continue;
		if (n_terms == EIN_MAX_IN) {
			n_terms++;
			break;
		}
		term[n_terms] = buf + start;
		term_len[n_terms++] = i - start;
		start = i + 1;
	}
	if (n_terms != p->n_in) {
		st = tern_node_errorf(node, TERN_EDATA, "equation '%s' has %d operand terms for %d inputs", eq, n_terms,
		                      p->n_in);
		goto done;
	}
	int letters[EIN_MAX_IN][EIN_MAX_LABELS], n_letters[EIN_MAX_IN], ell_at[EIN_MAX_IN], ell_n[EIN_MAX_IN];
	int ell_rank = 0;
	for (int i = 0; i < n_terms; i++) {
		if (!scan_term(term[i], term_len[i], letters[i], &n_letters[i], &ell_at[i])) {
			st = tern_node_errorf(node, TERN_EDATA, "equation '%s': term %d is not letters and one '...'",
			                      eq, i);
			goto done;
		}
		int rank = p->in[i]->rank;
		ell_n[i] = rank - n_letters[i];
		if ((ell_at[i] < 0 && ell_n[i] != 0) || ell_n[i] < 0) {
			st = tern_node_errorf(node, TERN_EDATA,
			                      "equation '%s': term %d has %d letters, input %d has rank %d", eq, i,
			                      n_letters[i], i, rank);
			goto done;
		}
		if (ell_n[i] > ell_rank)
			ell_rank = ell_n[i];
	}
	/* Labels dimension by dimension; sizes must agree or be 1 (broadcast). */
	int dim_label[EIN_MAX_IN][TERN_MAX_RANK];
	int64_t size_of[256];
	int count[256] = {0};
	for (int l = 0; l < 256; l++)
		size_of[l] = -1;
	for (int i = 0; i < n_terms; i++) {
		expand_term(letters[i], n_letters[i], ell_at[i], ell_n[i], ell_rank, dim_label[i]);
		for (int d = 0; d < p->in[i]->rank; d++) {
			int l = dim_label[i][d];
			int64_t sz = p->in[i]->dims[d];
			if (size_of[l] < 0 || size_of[l] == 1)
				size_of[l] = sz;
			else if (sz != size_of[l] && sz != 1) {
				st = tern_node_errorf(node, TERN_EDATA,
				                      "equation '%s': label '%c' has sizes %lld and %lld", eq,
				                      l < EIN_ELLIPSIS ? l : '.', (long long)size_of[l], (long long)sz);
				goto done;
			}
			count[l]++;
		}
	}
	/* Output labels: as written, or (implicit form) the ellipsis and then the letters used once. */
	int out_labels[EIN_MAX_LABELS], n_out = 0;
	if (arrow) {
		int ol[EIN_MAX_LABELS], nol, oat;
		if (!scan_term(arrow + 2, strlen(arrow + 2), ol, &nol, &oat)) {
			st = tern_node_errorf(node, TERN_EDATA,
			                      "equation '%s': output term is not letters and one '...'", eq);
			goto done;
		}
		n_out = expand_term(ol, nol, oat, oat >= 0 ? ell_rank : 0, ell_rank, out_labels);
		for (int i = 0; i < n_out; i++) {
			int l = out_labels[i];
			bool dup = false;
			for (int j = 0; j < i; j++)
				dup |= out_labels[j] == l;
			if (dup || (l < EIN_ELLIPSIS && count[l] == 0)) {
				st = tern_node_errorf(node, TERN_EDATA, "equation '%s': output label '%c' is %s", eq, l,
				                      dup ? "repeated" : "not in any operand");
				goto done;
			}
		}
	} else {
		for (int j = 0; j < ell_rank; j++)
			out_labels[n_out++] = EIN_ELLIPSIS + j;
		for (int l = 0; l < EIN_ELLIPSIS; l++)
			if (count[l] == 1)
				out_labels[n_out++] = l;
	}
	/* Dense label numbers: output labels, then the summed ones. */
	int dense[256];
	for (int l = 0; l < 256; l++)
		dense[l] = -1;
	int nl = 0;
	for (int i = 0; i < n_out; i++)
		dense[out_labels[i]] = nl++;
	for (int l = 0; l < 256; l++)
		if (count[l] && dense[l] < 0) {
			if (nl == EIN_MAX_LABELS) {
				st = tern_node_errorf(node, TERN_EDATA, "equation '%s' has more than %d labels", eq,
				                      EIN_MAX_LABELS);
				goto done;
			}
			dense[l] = nl++;
		}
	e->n_in = p->n_in;
	e->n_labels = nl;
	e->n_out = n_out;
	for (int l = 0; l < 256; l++)
		if (dense[l] >= 0)
			e->size[dense[l]] = size_of[l] < 0 ? 1 : size_of[l];
	int dense_count[2][EIN_MAX_LABELS] = {{0}};
	for (int i = 0; i < n_terms; i++) {
		int64_t s = 1;
		for (int d = p->in[i]->rank - 1; d >= 0; d--) {
			int l = dense[dim_label[i][d]];
			if (!(p->in[i]->dims[d] == 1 && e->size[l] != 1))
				e->stride[i][l] += s;
			s *= p->in[i]->dims[d];
			if (i < 2)
				dense_count[i][l]++;
		}
	}
	int64_t dims[TERN_MAX_RANK];
	if (n_out > TERN_MAX_RANK) {
		st = tern_node_errorf(node, TERN_EDATA, "equation '%s' gives an output of rank %d", eq, n_out);
		goto done;
	}
	e->out_numel = 1;
	for (int i = 0; i < n_out; i++)
		e->out_numel *= dims[i] = e->size[i];
	e->sum_numel = 1;
	for (int l = n_out; l < nl; l++)
		e->sum_numel *= e->size[l];
	tern_set_shape(p->out[0], dtype, n_out, dims);
	if ((st = einsum_plan_gemm(e, dense_count, dtype)))
		st = tern_node_errorf(node, st, "%s", tern_error());
	p->scratch_bytes = einsum_scratch(e, dtype);
	p->kernel = einsum_kernel;
done:
	free(buf);
	return st;
}

/* ---------------------------------------------------------------- table */

/* ---------------------------------------------------------------- gradients */

/* a with its last two axes swapped */
static tern_gval *swap_last(tern_grad_ctx *g, tern_gval *a, int rank)
{
	int64_t perm[TERN_MAX_RANK];
	for (int d = 0; d < rank; d++)
		perm[d] = d;
	perm[rank - 1] = rank - 2;
	perm[rank - 2] = rank - 1;
	return tern_g_transpose(g, a, perm, rank);
}

static tern_gval *unsqueeze(tern_grad_ctx *g, tern_gval *a, int64_t axis)
{
	tern_gval *in[2] = {a, tern_g_ints(g, &axis, 1)};
	return in[1] ? tern_g_op(g, "", "Unsqueeze", in, 2, NULL, 0) : NULL;
}

static tern_gval *matmul2(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	tern_gval *in[2] = {a, b};
	return a && b ? tern_g_op(g, "", "MatMul", in, 2, NULL, 0) : NULL;
}

/* Y = A B (numpy's matmul): dA = dY B^T and dB = A^T dY, summed to the operands' shapes where the
 * batch dimensions broadcast; a vector operand is a row (A) or a column (B) that is then dropped. */
static tern_status matmul_grad(tern_grad_ctx *g)
{
	tern_gval *a = g->x[0], *b = g->x[1], *dy = g->dy[0];
	int ra = tern_g_rank(g, a), rb = tern_g_rank(g, b);
	if (ra < 1 || rb < 1)
		return tern_g_fail(g, "MatMul needs operands of known rank");
	if (ra == 1 && rb == 1) {
		if (g->wants[0])
			g->dx[0] = tern_g_mul(g, dy, b);
		if (g->wants[1])
			g->dx[1] = tern_g_mul(g, dy, a);
	} else if (ra == 1 && rb == 2) {
		/* [k] x [k, n] -> [n]: W dy and the outer product a dy, each in its operand's shape as it
		 * comes (no transpose of W, nothing to sum) */
		if (g->wants[0]) {
			tern_gval *in[2] = {b, dy};
			g->dx[0] = tern_g_op(g, "", "MatMul", in, 2, NULL, 0);
		}
		if (g->wants[1])
			g->dx[1] = matmul2(g, unsqueeze(g, a, 1), unsqueeze(g, dy, 0));
	} else if (rb == 1 && ra == 2) {
		/* [m, k] x [k] -> [m]: the outer product dy b, and dy A */
		if (g->wants[0])
			g->dx[0] = matmul2(g, unsqueeze(g, dy, 1), unsqueeze(g, b, 0));
		if (g->wants[1]) {
			tern_gval *in[2] = {dy, a};
			g->dx[1] = tern_g_op(g, "", "MatMul", in, 2, NULL, 0);
		}
	} else if (ra == 1) {
		/* [k] x [..., k, n] -> [..., n] */
		tern_gval *dy_row = unsqueeze(g, dy, -2); /* [..., 1, n] */
		if (g->wants[0]) /* [..., 1, k], summed to [k] */
			g->dx[0] = tern_g_sum_to(g, matmul2(g, dy_row, swap_last(g, b, rb)), a);
		if (g->wants[1])
			g->dx[1] = tern_g_sum_to(g, matmul2(g, unsqueeze(g, a, 1), dy_row), b);
	} else if (rb == 1) {
		/* [..., m, k] x [k] -> [..., m] */
		tern_gval *dy_col = unsqueeze(g, dy, -1); /* [..., m, 1] */
		if (g->wants[0])
			g->dx[0] = tern_g_sum_to(g, matmul2(g, dy_col, unsqueeze(g, b, 0)), a);
		if (g->wants[1]) /* [..., 1, m] x [..., m, k] = [..., 1, k], summed to [k] */
			g->dx[1] = tern_g_sum_to(g, matmul2(g, unsqueeze(g, dy, -2), a), b);
	} else {
		if (g->wants[0])
			g->dx[0] = tern_g_sum_to(g, matmul2(g, dy, swap_last(g, b, rb)), a);
		if (g->wants[1])
			g->dx[1] = tern_g_sum_to(g, matmul2(g, swap_last(g, a, ra), dy), b);
	}
	return (g->wants[0] && !g->dx[0]) || (g->wants[1] && !g->dx[1]) ? tern_g_status(g) : TERN_OK;
}

static tern_gval *gemm(tern_grad_ctx *g, tern_gval *a, tern_gval *b, float alpha, int64_t ta, int64_t tb)
{
	tern_gval *in[2] = {a, b};
	tern_gattr at[3] = {TERN_GA_F("alpha", alpha), TERN_GA_I("transA", ta), TERN_GA_I("transB", tb)};
	return tern_g_op(g, "", "Gemm", in, 2, at, 3);
}

/* Y = alpha op(A) op(B) + beta C: each operand's gradient is one more Gemm (the transposes chosen so
 * that it comes out in the operand's own layout), C's the output's summed to C's shape. */
static tern_status gemm_grad(tern_grad_ctx *g)
{
	float alpha = tern_attr_float(g->node, "alpha", 1.0f), beta = tern_attr_float(g->node, "beta", 1.0f);
	int64_t ta = tern_attr_int(g->node, "transA", 0), tb = tern_attr_int(g->node, "transB", 0);
	tern_gval *a = g->x[0], *b = g->x[1], *dy = g->dy[0];
	if (g->wants[0])
		g->dx[0] = ta ? gemm(g, b, dy, alpha, tb, 1) : gemm(g, dy, b, alpha, 0, !tb);
	if (g->wants[1])
		g->dx[1] = tb ? gemm(g, dy, a, alpha, 1, ta) : gemm(g, a, dy, alpha, !ta, 0);
	if (g->n_in > 2 && g->wants[2]) {
		tern_gval *d = beta == 1.0f ? dy : tern_g_mul(g, dy, tern_g_scalar(g, beta, dy));
		g->dx[2] = tern_g_sum_to(g, d, g->x[2]);
	}
	for (int i = 0; i < g->n_in; i++)
		if (g->wants[i] && !g->dx[i])
			return tern_g_status(g);
	return TERN_OK;
}

/* Einsum: the gradient of operand i is itself an Einsum, of dY (on the output's subscripts) and the
 * other operands, that comes out on operand i's subscripts. Two kinds of subscript need one more
 * operand there, since an Einsum's output takes only subscripts that some input has:
 *   - one that only operand i has, once (summed away by the forward): a ones tensor on those
 *     subscripts broadcasts the gradient back along them;
 *   - one repeated within operand i (a diagonal): each repeat gets a fresh letter, tied to the first by
 *     an identity matrix (EyeLike), so that the gradient lands on the diagonal and is zero elsewhere.
 * The ellipsis is written out as fresh letters (ranks must be known). Where operand i has 1 for a
 * subscript another operand has larger (the forward broadcast it), the result is summed down to
 * operand i's shape (tern.SumTo); where it is the only one larger, the result is broadcast up (Expand)
 * first. Static dimensions spare those nodes where they are not needed. */
#define EIN_G_EQ 512

/* The next letter no term uses (0 when all 52 are taken). */
static int ein_fresh(bool *used)
{
	for (int k = 0; k < 52; k++) {
		int c = k < 26 ? 'a' + k : 'A' + k - 26;
		if (!used[c]) {
			used[c] = true;
			return c;
		}
	}
	return 0;
}

static void ein_put(char *eq, size_t *n, const int *letters, int count, char sep)
{
	for (int k = 0; k < count && *n + 2 < EIN_G_EQ; k++)
		eq[(*n)++] = (char)letters[k];
	if (sep && *n + 3 < EIN_G_EQ) {
		eq[(*n)++] = sep;
		if (sep == '-')
			eq[(*n)++] = '>';
	}
	eq[*n] = '\0';
}

/* The dimensions dims[0..n) of x as an int64 vector: a constant when known, else gathered from
 * Shape(x). */
static tern_gval *ein_dims(tern_grad_ctx *g, tern_gval *x, const int64_t *xd, const int64_t *axes, int n)
{
	int64_t v[TERN_MAX_RANK];
	bool known = true;
	for (int k = 0; k < n; k++)
		known &= (v[k] = xd[axes[k]]) >= 0;
	if (known)
		return tern_g_ints(g, v, (size_t)n);
	tern_gval *in[2] = {tern_g_shape(g, x), tern_g_ints(g, axes, (size_t)n)};
	tern_gattr at = TERN_GA_I("axis", 0);
	return in[0] && in[1] ? tern_g_op(g, "", "Gather", in, 2, &at, 1) : NULL;
}

static tern_status einsum_grad(tern_grad_ctx *g)
{
	const char *eq = tern_attr_string(g->node, "equation", NULL);
	if (!eq)
		return tern_g_fail(g, "attribute 'equation' is required");
	char buf[EIN_G_EQ];
	size_t n = 0;
	if (strlen(eq) >= sizeof buf)
		return tern_g_fail(g, "equation '%s' is too long", eq);
	for (const char *c = eq; *c; c++)
		if (*c != ' ')
			buf[n++] = *c;
	buf[n] = '\0';
	char *arrow = strstr(buf, "->");
	size_t lhs_len = arrow ? (size_t)(arrow - buf) : n;
	int n_in = g->n_in;
	int letters[EIN_MAX_IN][EIN_MAX_LABELS], n_letters[EIN_MAX_IN], ell_at[EIN_MAX_IN];
	int rank[EIN_MAX_IN], label[EIN_MAX_IN][TERN_MAX_RANK];
	int64_t dims[EIN_MAX_IN][TERN_MAX_RANK];
	int n_terms = 0, ell_rank = 0;
	if (n_in < 1 || n_in > EIN_MAX_IN)
		return tern_g_fail(g, "%d operands; 1 to %d are supported", n_in, EIN_MAX_IN);
	for (size_t i = 0, start = 0; i <= lhs_len; i++) {
		if (i < lhs_len && buf[i] != ',')
			continue;
		if (n_terms == n_in ||
		    !scan_term(buf + start, i - start, letters[n_terms], &n_letters[n_terms], &ell_at[n_terms]))
			return tern_g_fail(g, "equation '%s' does not match the %d operands", eq, n_in);
		n_terms++;
		start = i + 1;
	}
	if (n_terms != n_in)
		return tern_g_fail(g, "equation '%s' does not match the %d operands", eq, n_in);
	for (int i = 0; i < n_in; i++) {
		if (!g->x[i])
			return tern_g_fail(g, "input %d is missing", i);
		tern_g_type(g, g->x[i], NULL, &rank[i], dims[i]);
		int ell = rank[i] - n_letters[i];
		if (rank[i] < 0 || rank[i] > TERN_MAX_RANK || ell < 0 || (ell_at[i] < 0 && ell))
			return tern_g_fail(g, "operand %d needs a known rank that matches term %d of '%s'", i, i, eq);
		if (ell > ell_rank)
			ell_rank = ell;
	}
	/* labels dimension by dimension, as the forward reads them; then the output's */
	int count[256] = {0};
	bool used[256] = {false};
	for (int i = 0; i < n_in; i++) {
		expand_term(letters[i], n_letters[i], ell_at[i], rank[i] - n_letters[i], ell_rank, label[i]);
		for (int d = 0; d < rank[i]; d++)
			count[label[i][d]]++;
		for (int k = 0; k < n_letters[i]; k++)
			used[letters[i][k]] = true;
	}
	int out[EIN_MAX_LABELS], n_out = 0;
	if (arrow) {
		int ol[EIN_MAX_LABELS], nol, oat;
		if (!scan_term(arrow + 2, strlen(arrow + 2), ol, &nol, &oat))
			return tern_g_fail(g, "equation '%s': output term is not letters and one '...'", eq);
		n_out = expand_term(ol, nol, oat, oat >= 0 ? ell_rank : 0, ell_rank, out);
	} else {
		for (int j = 0; j < ell_rank; j++)
			out[n_out++] = EIN_ELLIPSIS + j;
		for (int l = 0; l < EIN_ELLIPSIS; l++)
			if (count[l] == 1)
				out[n_out++] = l;
	}
	int64_t ydims[TERN_MAX_RANK];
	int yrank;
	tern_g_type(g, g->y[0], NULL, &yrank, ydims);
	if (yrank != n_out)
		for (int d = 0; d < n_out && d < TERN_MAX_RANK; d++)
			ydims[d] = -1;
	/* letters for the ellipsis' dimensions */
	int code[256];
	for (int l = 0; l < 256; l++)
		code[l] = l;
	for (int j = 0; j < ell_rank; j++)
		if (!(code[EIN_ELLIPSIS + j] = ein_fresh(used)))
			return tern_g_fail(g, "equation '%s' leaves no letters for its ellipsis", eq);
	for (int i = 0; i < n_in; i++)
		for (int d = 0; d < rank[i]; d++)
			label[i][d] = code[label[i][d]];
	for (int d = 0; d < n_out; d++)
		out[d] = code[out[d]];

	for (int i = 0; i < n_in; i++) {
		if (!g->wants[i])
			continue;
		bool fresh[256];
		memcpy(fresh, used, sizeof fresh);
		char geq[EIN_G_EQ];
		size_t len = 0;
		tern_gval *in[EIN_MAX_IN];
		int n_ops = 0;
		/* dY and the other operands, as they are */
		in[n_ops++] = g->dy[0];
		ein_put(geq, &len, out, n_out, ',');
		for (int j = 0; j < n_in; j++)
			if (j != i) {
				in[n_ops++] = g->x[j];
				ein_put(geq, &len, label[j], rank[j], ',');
			}
		/* operand i's subscripts, a repeat taking a fresh letter; the lone ones */
		int res[TERN_MAX_RANK], first[TERN_MAX_RANK];
		int64_t lone[TERN_MAX_RANK];
		int n_lone = 0;
		int extra = 0; /* operands to add: the identities, then the ones */
		for (int d = 0; d < rank[i]; d++) {
			int l = label[i][d];
			res[d] = l;
			first[d] = d;
			for (int e = 0; e < d; e++)
				if (label[i][e] == l) {
					first[d] = e;
					break;
				}
			if (first[d] != d) {
				if (!(res[d] = ein_fresh(fresh)))
					return tern_g_fail(g, "equation '%s' leaves no letters for its diagonals", eq);
				extra++;
				continue;
			}
			bool elsewhere = false, repeated = false;
			for (int k = 0; k < n_out; k++)
				elsewhere |= out[k] == l;
			for (int j = 0; j < n_in; j++)
				for (int e = 0; j != i && e < rank[j]; e++)
					elsewhere |= label[j][e] == l;
			for (int e = d + 1; e < rank[i]; e++)
				repeated |= label[i][e] == l;
			if (!elsewhere && !repeated)
				lone[n_lone++] = d;
		}
		if (n_ops + extra + (n_lone > 0) > EIN_MAX_IN)
			return tern_g_fail(g, "equation '%s': the gradient of operand %d needs more than %d operands", eq, i,
			                   EIN_MAX_IN);
		for (int d = 0; d < rank[i]; d++) {
			if (first[d] == d)
				continue;
			/* the identity is as large as the subscript: the largest of its dimensions in operand i (a
			 * dimension of 1 broadcasts) */
			int64_t size = -1;
			tern_gval *dyn = NULL;
			bool known = true;
			for (int e = 0; e < rank[i]; e++)
				if (label[i][e] == label[i][d]) {
					known &= dims[i][e] >= 0;
					size = dims[i][e] > size ? dims[i][e] : size;
				}
			if (known) {
				int64_t sq[2] = {size, size};
				dyn = tern_g_ints(g, sq, 2);
			} else {
				for (int e = 0, seen = 0; e < rank[i]; e++) {
					if (label[i][e] != label[i][d])
						continue;
					int64_t ax[2] = {e, e};
					tern_gval *s = ein_dims(g, g->x[i], dims[i], ax, 2);
					tern_gval *mx[2] = {dyn, s};
					dyn = !seen++ ? s : dyn && s ? tern_g_op(g, "", "Max", mx, 2, NULL, 0) : NULL;
				}
			}
			tern_gval *zero[2] = {tern_g_scalar(g, 0.0, g->x[i]), dyn};
			tern_gval *z = zero[0] && zero[1] ? tern_g_op(g, "", "Expand", zero, 2, NULL, 0) : NULL;
			in[n_ops++] = tern_g_unary(g, "EyeLike", z);
			int pair[2] = {res[first[d]], res[d]};
			ein_put(geq, &len, pair, 2, ',');
		}
		if (n_lone) {
			tern_gval *ones[2] = {tern_g_scalar(g, 1.0, g->x[i]), ein_dims(g, g->x[i], dims[i], lone, n_lone)};
			in[n_ops++] = ones[0] && ones[1] ? tern_g_op(g, "", "Expand", ones, 2, NULL, 0) : NULL;
			int ll[TERN_MAX_RANK];
			for (int k = 0; k < n_lone; k++)
				ll[k] = label[i][lone[k]];
			ein_put(geq, &len, ll, n_lone, ',');
		}
		len--; /* the last separator becomes the arrow */
		ein_put(geq, &len, res, 0, '-');
		ein_put(geq, &len, res, rank[i], 0);
		if (len + 2 >= EIN_G_EQ)
			return tern_g_fail(g, "equation '%s': the gradient's equation is too long", eq);
		for (int k = 0; k < n_ops; k++)
			if (!in[k])
				return tern_g_status(g);
		tern_gattr at = TERN_GA_S("equation", geq);
		tern_gval *r = tern_g_op(g, "", "Einsum", in, n_ops, &at, 1);
		/* The result's size for each of operand i's dimensions: the largest any of the gradient's
		 * operands has for that subscript (operand i's own where an identity or the ones give it). */
		bool expand = false, sum = false;
		for (int d = 0; d < rank[i]; d++) {
			int l = label[i][d];
			bool own = first[d] != d;
			int64_t size = 1;
			bool known = true;
			for (int k = 0; k < n_lone; k++)
				own |= lone[k] == d;
			for (int e = 0; e < rank[i]; e++)
				own |= e != d && label[i][e] == l; /* a diagonal: the identity's size */
			if (own) {
				for (int e = 0; e < rank[i]; e++)
					if (label[i][e] == l) {
						known &= dims[i][e] >= 0;
						size = dims[i][e] > size ? dims[i][e] : size;
					}
			}
			for (int k = 0; k < n_out; k++)
				if (out[k] == l) {
					known &= ydims[k] >= 0;
					size = ydims[k] > size ? ydims[k] : size;
				}
			for (int j = 0; j < n_in; j++)
				for (int e = 0; j != i && e < rank[j]; e++)
					if (label[j][e] == l) {
						known &= dims[j][e] >= 0;
						size = dims[j][e] > size ? dims[j][e] : size;
					}
			int64_t xd = dims[i][d];
			expand |= !known || xd < 0 || size < xd;
			sum |= !known || xd < 0 || size > xd;
		}
		if (expand) {
			tern_gval *e[2] = {r, tern_g_shape(g, g->x[i])};
			r = e[0] && e[1] ? tern_g_op(g, "", "Expand", e, 2, NULL, 0) : NULL;
		}
		g->dx[i] = sum ? tern_g_sum_to(g, r, g->x[i]) : r;
		if (!g->dx[i])
			return tern_g_status(g);
	}
	return TERN_OK;
}

static const tern_op ops[] = {
        {"", "MatMul", 1, 0, matmul_prepare, 0, "matmul", matmul_grad},
        {"", "Gemm", 1, 0, gemm_prepare, 0, "matmul", gemm_grad},
        {"", "MatMulInteger", 10, 0, matmul_integer_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "matmul"},
        {"", "QLinearMatMul", 10, 0, qlinear_matmul_prepare, TERN_DT(INT8) | TERN_DT(UINT8), "matmul"},
        {"", "Einsum", 12, 0, einsum_prepare, TERN_DT_NUMERIC, "matmul", einsum_grad},
};

const tern_op_table tern_ops_matmul = {ops, TERN_ARRAY_LEN(ops)};
