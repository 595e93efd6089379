/* gemm.h — the dense matrix products shared by MatMul, Gemm, Einsum (matmul.c), the convolutions (conv.c)
 * and the recurrent layers (rnn.c): OpenBLAS when the build has it, plain C otherwise, and products with
 * a constant left operand (weights) packed once for register-blocked kernels. */
#ifndef TERN_OPS_GEMM_H
#define TERN_OPS_GEMM_H

#include "internal.h"

/* C = alpha * op(A) * op(B) + beta * C for row-major matrices: op(A) is m x k, op(B) is k x n, and
 * lda/ldb/ldc are the row lengths of A, B and C as stored. beta == 0 overwrites C without reading it. */
void tern_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void tern_gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                   int64_t lda, const double *b, int64_t ldb, double beta, double *c, int64_t ldc);
/* C = A x B for row-major int32 matrices without gaps (A is m x k, B is k x n). */
void tern_gemm_i32(int64_t m, int64_t n, int64_t k, const int32_t *a, const int32_t *b, int32_t *c);

/* A constant left operand packed once, float32 only. */
typedef struct tern_packed tern_packed;
/* Packs alpha times the m x k matrix A (row i at a + i * lda), or with trans the k x m matrix whose
 * transpose is A (row p at a + p * lda). NULL when out of memory. */
tern_packed *tern_pack_a(int64_t m, int64_t k, const float *a, int64_t lda, bool trans, float alpha);
void tern_packed_free(tern_packed *p);

/* The right operand B, k x n, read where it lies: row p starts at data + row_off[p] (row_off NULL: at
 * data + p * ldb). Its columns come in runs of `width` (0: one run of n): column j = r * width + x is at
 * r * stride + x * step from the start of a row. A convolution's taps over a padded input are rows with
 * offsets; the transpose of a row-major matrix has step = its row length. */
typedef struct tern_gemm_b {
	const float *data;
	const int64_t *row_off;
	int64_t ldb, width, stride, step;
} tern_gemm_b;

/* An activation applied where results are stored, instead of in a pass over the output after them:
 * y = act(y + add), add optional and laid out like y. tern.FusedConv's vocabulary, but for Gelu. */
typedef enum tern_act_kind {
	TERN_ACT_NONE,
	TERN_ACT_RELU,
	TERN_ACT_CLIP,
	TERN_ACT_LEAKYRELU,
	TERN_ACT_SIGMOID,
	TERN_ACT_SILU,
	TERN_ACT_TANH,
	TERN_ACT_HARDSIGMOID,
	TERN_ACT_HARDSWISH,
} tern_act_kind;
typedef struct tern_act {
	tern_act_kind kind;
	float alpha, beta; /* Clip's bounds, LeakyRelu's and HardSigmoid's parameters */
} tern_act;
/* The activation a fused node's `activation` and `activation_params` name; false for one not above. */
bool tern_act_from_node(const tern_node *node, tern_act *act);
/* y[i] = sigmoid(s) or, with times, s * sigmoid(s), where s = x[i] + add[i] (add NULL: s = x[i]), for
 * i < n; y may be x (sigmoid.c). */
void tern_sigmoid_f32(const float *x, const float *add, float *y, int64_t n, bool times);
/* y[i] = act(y[i] + add[i]) for i < n (add NULL: none). */
void tern_act_run(const tern_act *act, float *y, const float *add, int64_t n);

/* Where C = A B goes: element (i, j) at data + i * ldc + j, or with trans at data + j * ldc + i.
 * accumulate adds the product to C; otherwise C = A B + bias[i] (bias NULL: none). Then, with act,
 * each element becomes act(C + add) as it is finished, add (optional) laid out like C. */
typedef struct tern_gemm_c {
	float *data;
	int64_t ldc;
	bool trans, accumulate;
	const float *bias;
	const tern_act *act;
	const float *add;
} tern_gemm_c;

/* Two kernels multiply a packed A: "rows" (blocks of A's rows by wide runs of contiguous columns of B)
 * and "cols" (a panel of A's rows by a few columns of B, each tile inside one run of columns). */
typedef enum tern_gemm_kind { TERN_GEMM_AUTO, TERN_GEMM_ROWS, TERN_GEMM_COLS } tern_gemm_kind;

/* Which kernel is expected to be faster: the rows kernel over n_dense contiguous columns, or the cols
 * kernel over runs x width columns (stored with trans when c_trans). b_bytes: the memory B's elements
 * occupy, which the cols kernel reads once per panel (0: B's rows overlap, as a direct convolution's
 * shifted views of one image do, and are read from the caches). */
tern_gemm_kind tern_gemm_choose(const tern_packed *a, int64_t n_dense, int64_t runs, int64_t width, bool c_trans,
                                size_t b_bytes);

/* C = A B for packed A (m x k) and B k x n, split over the pool. The rows kernel needs B's columns
 * contiguous (step 1 and, with several runs, stride == width) and C untransposed. */
void tern_gemm_packed_run(tern_threadpool *pool, const tern_packed *a, int64_t n, const tern_gemm_b *b,
                          const tern_gemm_c *c, tern_gemm_kind kind);

/* The common case: B row-major with rows ldb apart, C row-major with rows ldc apart, plus bias. */
void tern_gemm_packed(tern_threadpool *pool, const tern_packed *a, int64_t n, const float *b, int64_t ldb,
                      const float *bias, float *c, int64_t ldc);

/* The rows kernel with B made block by block where it is needed (a convolution's columns, never stored
 * whole): fill writes rows [k0, k0 + kc) x columns [col0, col0 + cols) of B as kc rows of nr floats,
 * zero from column cols on. It runs on several threads at once. */
#define TERN_PACKED_MAX_NR 32 /* the widest block of B a fill is asked for */
typedef void (*tern_fill_b)(const void *ctx, int64_t k0, int64_t kc, int64_t col0, int64_t cols, float *block,
                            int64_t nr);
void tern_gemm_packed_fill(tern_threadpool *pool, const tern_packed *a, int64_t n, tern_fill_b fill, const void *ctx,
                           const float *bias, float *c, int64_t ldc);

/* tern.FusedConv in one pass when it can be (conv.c): a float convolution with weights known when planning,
 * whose residual input and activation are applied as the outputs are stored. Leaves p->kernel NULL when
 * it cannot, for the fused operators' general path. */
tern_status tern_fused_conv_prepare(tern_prepare_args *p);
/* tern.FusedMatMul likewise (matmul.c): float weights known when planning, a bias of their columns. */
tern_status tern_fused_matmul_prepare(tern_prepare_args *p);

/* Transposes 16 x 16 floats held in 16 AVX-512 registers: r[i] lane j becomes r[j] lane i. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void tern_tr16(__m512 r[16])
{
	__m512 t[16];
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
	}
	for (int i = 0; i < 16; i += 4) {
		__m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
		__m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
		r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
		r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
		r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
		r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
	}
	for (int i = 0; i < 16; i += 8)
		for (int j = 0; j < 4; j++) {
			t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
			t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
		}
	for (int j = 0; j < 8; j++) {
		r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
		r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
	}
}
#endif

/* float16 and bfloat16 storage to and from float, for kernels that compute in float. */
void tern_half_to_f32(int dtype, const uint16_t *src, float *dst, int64_t n);
void tern_f32_to_half(int dtype, const float *src, uint16_t *dst, int64_t n);

#endif
