/* gemm.h — the dense matrix products shared by MatMul, Gemm, Einsum (matmul.c) and the convolutions
 * (nn.c): OpenBLAS when the build has it, plain C otherwise, and a product with a packed constant left
 * operand for convolution weights. */
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

/* A constant left operand (convolution weights) packed once for tern_gemm_packed, float32 only. */
typedef struct tern_packed tern_packed;
/* Packs the m x k matrix A (row i at a + i * lda), or with trans the k x m matrix whose transpose is A
 * (row p at a + p * lda). NULL when out of memory. */
tern_packed *tern_pack_a(int64_t m, int64_t k, const float *a, int64_t lda, bool trans);
void tern_packed_free(tern_packed *p);
/* C = A B (+ bias[i] on row i when bias is given) for packed A, B k x n with rows ldb apart and C m x n
 * with rows ldc apart; split over the pool. */
void tern_gemm_packed(tern_threadpool *pool, const tern_packed *a, int64_t n, const float *b, int64_t ldb,
                      const float *bias, float *c, int64_t ldc);
/* The same with B made block by block where it is needed (a convolution's columns, never stored whole):
 * fill writes rows [k0, k0 + kc) x columns [col0, col0 + cols) of B as kc rows of nr floats, zero from
 * column cols on. It runs on several threads at once. */
#define TERN_PACKED_MAX_NR 32 /* the widest block of B a fill is asked for */
typedef void (*tern_fill_b)(const void *ctx, int64_t k0, int64_t kc, int64_t col0, int64_t cols, float *block,
                            int64_t nr);
void tern_gemm_packed_fill(tern_threadpool *pool, const tern_packed *a, int64_t n, tern_fill_b fill, const void *ctx,
                           const float *bias, float *c, int64_t ldc);

/* float16 and bfloat16 storage to and from float, for kernels that compute in float. */
void tern_half_to_f32(int dtype, const uint16_t *src, float *dst, int64_t n);
void tern_f32_to_half(int dtype, const float *src, uint16_t *dst, int64_t n);

#endif
