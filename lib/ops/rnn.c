/* rnn.c — recurrent layers RNN, GRU and LSTM: directions, sequence lengths, initial states, peepholes,
 * activation lists, clip and both layouts. One matrix product projects the whole input sequence; the
 * recurrence costs one product per step (two for GRU without linear_before_reset). float32 and float16
 * compute in float, float64 in double. Their gradients (tern.RNNGrad, tern.GRUGrad, tern.LSTMGrad and
 * the rule that emits them) are at the end. */

/* The gradient kernels are written once for both element types, in rnn_grad.h, which the gradient
 * section below includes twice (RNN_GRAD_T float, then double). */

/* Under GCC's default -ftrapping-math a float comparison may raise an exception, which keeps the clips
 * and rectifiers below from becoming vector selects; tern never reads the floating-point exception
 * flags. Contracting a * b + c into one FMA is allowed too. The options come before the includes so
 * that the inline helpers of ops_common.h are compiled with them and still inline. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "fp-contract=fast")
#endif
#include "autodiff/grad.h"
#include "internal.h"
#include "ops/gemm.h"
#include "ops_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#if TERN_HAVE_BLAS
#include <cblas.h>
#endif

/* The cell arithmetic is compiled twice, for AVX2 with FMA and for the baseline (TERN_ISA_VARIANTS2),
 * and runs on the path tern_isa() names. */

/* ---------------------------------------------------------------- activations */

enum act_kind {
	A_RELU,
	A_TANH,
	A_SIGMOID,
	A_AFFINE,
	A_LEAKYRELU,
	A_THRESHOLDEDRELU,
	A_SCALEDTANH,
	A_HARDSIGMOID,
	A_ELU,
	A_SOFTSIGN,
	A_SOFTPLUS,
};

static const struct act_def {
	const char *name;
	enum act_kind kind;
	int n_params; /* how many of alpha, beta it consumes from the attribute lists */
	float alpha, beta;
} act_defs[] = {
        {"Relu", A_RELU, 0, 0, 0},
        {"Tanh", A_TANH, 0, 0, 0},
        {"Sigmoid", A_SIGMOID, 0, 0, 0},
        {"Affine", A_AFFINE, 2, 1, 0},
        {"LeakyRelu", A_LEAKYRELU, 1, 0.01f, 0},
        {"ThresholdedRelu", A_THRESHOLDEDRELU, 1, 1, 0},
        {"ScaledTanh", A_SCALEDTANH, 2, 1, 1},
        {"HardSigmoid", A_HARDSIGMOID, 2, 0.2f, 0.5f},
        {"Elu", A_ELU, 1, 1, 0},
        {"Softsign", A_SOFTSIGN, 0, 0, 0},
        {"Softplus", A_SOFTPLUS, 0, 0, 0},
};

typedef struct activation {
	enum act_kind kind;
	float alpha, beta;
} activation;

/* x = act(clip(x)) over n elements; clip <= 0 means none. */
TERN_ISA_BODY void activate_body(const activation *a, float *restrict x, int64_t n, float clip)
{
	if (clip > 0)
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] > clip ? clip : x[i] < -clip ? -clip : x[i];
	float al = a->alpha, be = a->beta;
	switch (a->kind) {
	case A_RELU:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] > 0 ? x[i] : 0;
		break;
	case A_TANH:
		for (int64_t i = 0; i < n; i++)
			x[i] = tern_fast_tanhf(x[i]);
		break;
	case A_SIGMOID:
		for (int64_t i = 0; i < n; i++)
			x[i] = 1 / (1 + tern_fast_expf(-x[i]));
		break;
	case A_AFFINE:
		for (int64_t i = 0; i < n; i++)
			x[i] = al * x[i] + be;
		break;
	case A_LEAKYRELU:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] >= 0 ? x[i] : al * x[i];
		break;
	case A_THRESHOLDEDRELU:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] >= al ? x[i] : 0;
		break;
	case A_SCALEDTANH:
		for (int64_t i = 0; i < n; i++)
			x[i] = al * tern_fast_tanhf(be * x[i]);
		break;
	case A_HARDSIGMOID:
		for (int64_t i = 0; i < n; i++)
			x[i] = fminf(fmaxf(al * x[i] + be, 0), 1);
		break;
	case A_ELU:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] >= 0 ? x[i] : al * expm1f(x[i]);
		break;
	case A_SOFTSIGN:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] / (1 + fabsf(x[i]));
		break;
	case A_SOFTPLUS:
		for (int64_t i = 0; i < n; i++)
			x[i] = x[i] > 20 ? x[i] : log1pf(expf(x[i]));
		break;
	}
}
TERN_ISA_VARIANTS2(void, activate, (const activation *a, float *restrict x, int64_t n, float clip), (a, x, n, clip))

/* ---------------------------------------------------------------- matrix products */

/* Weights W [n, k] (stored [out, in]) packed in panels of 16 output columns: panel p holds, for each
 * q < k, the weights W[16p + j][q], zero past n. A product then streams one contiguous panel per 16
 * columns. BLAS packs its operands on every call, which for the few rows of a recurrence step costs as
 * much as the arithmetic; packing the recurrent weights once per sequence avoids that. */
#define PANEL 16
/* Recurrences over at most this many batch rows use the packed product. */
#define PACKED_MAX_ROWS 64

static int64_t packed_floats(int64_t n, int64_t k)
{
	return (n + PANEL - 1) / PANEL * PANEL * k;
}

static void pack_panels(const float *w, int64_t n, int64_t k, float *restrict packed)
{
	for (int64_t p = 0; p < (n + PANEL - 1) / PANEL; p++)
		for (int64_t q = 0; q < k; q++)
			for (int64_t j = 0; j < PANEL; j++)
				packed[(p * k + q) * PANEL + j] = p * PANEL + j < n ? w[(p * PANEL + j) * k + q] : 0;
}

/* Eight floats in a vector register (two SSE registers in the baseline clone); loads and stores go
 * through memcpy since rows need not be aligned. */
typedef float vf8 __attribute__((vector_size(32)));
#define LOAD8(v, src) memcpy(&(v), (src), sizeof(vf8))
#define STORE8(dst, v) memcpy((dst), &(v), sizeof(vf8))

/* `rows` (at most four) rows of C for one panel, accumulated in 2 * rows vector registers; inlined with
 * a constant row count so that the loops over rows unroll. */
static inline __attribute__((always_inline)) void panel_rows(int rows, int64_t k, const float *a, int64_t lda,
                                                             const float *w, float *c, int64_t ldc, int64_t cols)
{
	vf8 acc[4][2] = {{{0}}};
	int64_t q = 0;
	if (rows == 1) {
		/* One row alone would wait on two chains of dependent additions: spread it over four. */
		for (; q + 4 <= k; q += 4)
			for (int j = 0; j < 4; j++) {
				vf8 w0, w1;
				LOAD8(w0, w + (q + j) * PANEL);
				LOAD8(w1, w + (q + j) * PANEL + 8);
				acc[j][0] += a[q + j] * w0;
				acc[j][1] += a[q + j] * w1;
			}
		for (int j = 1; j < 4; j++) {
			acc[0][0] += acc[j][0];
			acc[0][1] += acc[j][1];
		}
	}
	for (; q < k; q++) {
		vf8 w0, w1;
		LOAD8(w0, w + q * PANEL);
		LOAD8(w1, w + q * PANEL + 8);
		for (int i = 0; i < rows; i++) {
			acc[i][0] += a[i * lda + q] * w0;
			acc[i][1] += a[i * lda + q] * w1;
		}
	}
	for (int i = 0; i < rows; i++) {
		float out[PANEL];
		STORE8(out, acc[i][0]);
		STORE8(out + 8, acc[i][1]);
		memcpy(c + i * ldc, out, (size_t)cols * sizeof(float));
	}
}

/* C[m, n] = A[m, k] * W^T with W packed, four rows by one panel at a time. */
TERN_ISA_BODY void gemm_packed_body(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed,
                                      float *c, int64_t ldc)
{
	for (int64_t p = 0; p * PANEL < n; p++) {
		const float *w = packed + p * k * PANEL;
		int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL, i = 0;
		for (; i + 4 <= m; i += 4)
			panel_rows(4, k, a + i * lda, lda, w, c + i * ldc + p * PANEL, ldc, cols);
		for (; i < m; i++)
			panel_rows(1, k, a + i * lda, lda, w, c + i * ldc + p * PANEL, ldc, cols);
	}
}
TERN_ISA_VARIANTS2(void, gemm_packed, (int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed, float *c, int64_t ldc), (m, n, k, a, lda, packed, c, ldc))

/* A packed product split by panels over the thread pool. */
typedef struct packed_task {
	int64_t m, n, k, lda, ldc, panels; /* panels per task */
	const float *a, *packed;
	float *c;
} packed_task;

static void packed_slice(void *ctx, int64_t t)
{
	const packed_task *pt = ctx;
	int64_t first = t * pt->panels * PANEL,
	        cols = pt->n - first < pt->panels * PANEL ? pt->n - first : pt->panels * PANEL;
	gemm_packed(pt->m, cols, pt->k, pt->a, pt->lda, pt->packed + first * pt->k, pt->c + first, pt->ldc);
}

/* C[m, n] = A[m, k] * W^T for W [n, k]: with W packed when planning (pk) through the cols kernel, which
 * reads A's rows as columns and stores the product transposed, i.e. as C's rows; else through BLAS
 * unless panels packed per run are given (or there is no BLAS, in which case they always are). */
static void product(tern_threadpool *pool, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w,
                    const float *packed, const tern_packed *pk, float *c, int64_t ldc)
{
	if (pk) {
		tern_gemm_b b = {a, NULL, 1, m, 0, lda};
		tern_gemm_c cd = {c, ldc, true, false, NULL};
		tern_gemm_packed_run(pool, pk, m, &b, &cd, TERN_GEMM_COLS);
		return;
	}
#if TERN_HAVE_BLAS
	if (!packed) {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, w,
		            (int)k, 0.0f, c, (int)ldc);
		return;
	}
#endif
	(void)w;
	int threads = pool ? tern_threadpool_size(pool) : 1;
	int64_t panels = (n + PANEL - 1) / PANEL;
	/* Below about a quarter of a million multiply-adds, waking the pool costs more than it saves. */
	if (threads < 2 || panels < 2 || m * n * k < ((int64_t)1 << 18)) {
		gemm_packed(m, n, k, a, lda, packed, c, ldc);
		return;
	}
	packed_task pt = {m, n, k, lda, ldc, (panels + 2 * threads - 1) / (2 * threads), a, packed, c};
	tern_parallel_for(pool, (panels + pt.panels - 1) / pt.panels, packed_slice, &pt);
}

/* ---------------------------------------------------------------- parameters */

enum cell { CELL_RNN, CELL_GRU, CELL_LSTM };

/* Input and output positions; LSTM alone has initial_c, P and Y_c. */
enum { IN_X, IN_W, IN_R, IN_B, IN_SEQ_LENS, IN_H0, IN_C0, IN_P };
enum { OUT_Y, OUT_YH, OUT_YC };

typedef struct rnn_params {
	enum cell cell;
	int n_gates, n_acts; /* per direction */
	int n_dir;
	bool reverse; /* a single direction that runs backwards */
	int layout;
	int64_t seq, batch, input, hidden;
	float clip;
	bool linear_before_reset, input_forget;
	/* tern's recurrent operators with projected = 1: X holds each direction's input projection, W X +
	 * the biases folded into it (see run_direction), side by side: [.., directions * gates * hidden]. */
	bool projected;
	activation acts[2][3];
	bool packed_recurrence; /* recurrent weights packed once per direction (see PANEL) */
	int64_t first_cols; /* gate columns of the first recurrent product: GRU's candidate waits for r */
	/* float32 W and R known when planning, packed then per direction: W, R's first_cols rows, the rest */
	tern_packed *wk[2], *rk[2], *rk_h[2];
	unsigned skipped; /* gradients: the outputs (bit o) attribute grad_outputs leaves out, zeros */
} rnn_params;

static void rnn_free(void *p)
{
	rnn_params *rp = p;
	for (int d = 0; rp && d < 2; d++) {
		tern_packed_free(rp->wk[d]);
		tern_packed_free(rp->rk[d]);
		tern_packed_free(rp->rk_h[d]);
	}
	free(rp);
}

/* Float views of every operand and the work buffers, carved from scratch. Operands already float
 * point at the tensors; others are converted copies. */
typedef struct rnn_buffers {
	float *x, *w, *r, *b, *h0, *c0, *p; /* inputs (NULL when omitted) */
	float *y, *yh, *yc; /* outputs (NULL when omitted) */
	float *xproj; /* [rows of X, gates * hidden] */
	float *gates; /* [batch, gates * hidden] recurrence products */
	float *bias; /* [gates * hidden] summed biases */
	float *h, *c, *rh; /* [batch, hidden] state; GRU's r * h */
	float *wpack, *rpack, *rpack_h; /* packed W (without BLAS), R's first columns, GRU's Rh */
	int64_t *lens; /* [batch] steps of each sequence */
} rnn_buffers;

static int64_t rnn_numel(const tern_tensor *t)
{
	return t ? tern_tensor_numel(t) : 0;
}

/* Lays the buffers out from base (or only measures when base is NULL); returns the bytes used. */
static size_t rnn_carve(const rnn_params *p, tern_tensor *const *in, int n_in, tern_tensor *const *out, int n_out,
                        char *base, rnn_buffers *bf)
{
	size_t off = 0;
	int64_t gh = p->n_gates * p->hidden, bh = p->batch * p->hidden;
	struct {
		float **dst;
		const tern_tensor *t;
	} operands[] = {
	        {&bf->x, in[IN_X]},
	        {&bf->w, in[IN_W]},
	        {&bf->r, in[IN_R]},
	        {&bf->b, n_in > IN_B ? in[IN_B] : NULL},
	        {&bf->h0, n_in > IN_H0 ? in[IN_H0] : NULL},
	        {&bf->c0, p->cell == CELL_LSTM && n_in > IN_C0 ? in[IN_C0] : NULL},
	        {&bf->p, p->cell == CELL_LSTM && n_in > IN_P ? in[IN_P] : NULL},
	        {&bf->y, n_out > OUT_Y ? out[OUT_Y] : NULL},
	        {&bf->yh, n_out > OUT_YH ? out[OUT_YH] : NULL},
	        {&bf->yc, p->cell == CELL_LSTM && n_out > OUT_YC ? out[OUT_YC] : NULL},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(operands); i++) {
		const tern_tensor *t = operands[i].t;
		*operands[i].dst = NULL;
		if (!t)
			continue;
		if (t->dtype == TERN_FLOAT) {
			*operands[i].dst = t->data;
			continue;
		}
		*operands[i].dst = base ? (float *)(base + off) : NULL;
		off += ((size_t)rnn_numel(t) * sizeof(float) + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	}
	struct {
		float **dst;
		int64_t n;
	} work[] = {
	        {&bf->xproj, p->projected ? 0 : p->seq * p->batch * gh},
	        {&bf->gates, p->batch * gh},
	        {&bf->bias, gh},
	        {&bf->h, bh},
	        {&bf->c, bh},
	        {&bf->rh, bh},
	        {&bf->wpack, TERN_HAVE_BLAS || p->wk[0] || p->projected ? 0 : packed_floats(gh, p->input)},
	        {&bf->rpack, p->packed_recurrence && !p->rk[0] ? packed_floats(p->first_cols, p->hidden) : 0},
	        {&bf->rpack_h, p->packed_recurrence && !p->rk[0] ? packed_floats(gh - p->first_cols, p->hidden) : 0},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(work); i++) {
		*work[i].dst = base ? (float *)(base + off) : NULL;
		off += ((size_t)work[i].n * sizeof(float) + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	}
	bf->lens = base ? (int64_t *)(base + off) : NULL;
	return off + (size_t)p->batch * sizeof(int64_t);
}

static void to_float(const tern_tensor *t, float *dst)
{
	if (!t || t->dtype == TERN_FLOAT)
		return;
	int64_t n = tern_tensor_numel(t);
	for (int64_t i = 0; i < n; i++)
		dst[i] = (float)tern_tensor_get_f64(t, i);
}

static void from_float(const float *src, tern_tensor *t)
{
	if (!t || t->dtype == TERN_FLOAT)
		return;
	int64_t n = tern_tensor_numel(t);
	for (int64_t i = 0; i < n; i++) {
		if (t->dtype == TERN_DOUBLE)
			((double *)t->data)[i] = src[i];
		else
			((uint16_t *)t->data)[i] = tern_f32_to_f16(src[i]);
	}
}

/* ---------------------------------------------------------------- kernel */

/* Where row (t, b) of X, and state or output (d, b) and output step (t, d, b), live in each layout. */
static int64_t x_row(const rnn_params *p, int64_t t, int64_t b)
{
	return p->layout ? b * p->seq + t : t * p->batch + b;
}
static int64_t state_at(const rnn_params *p, int d, int64_t b)
{
	return (p->layout ? b * p->n_dir + d : d * p->batch + b) * p->hidden;
}
static int64_t y_at(const rnn_params *p, int64_t t, int d, int64_t b)
{
	return (p->layout ? (b * p->seq + t) * p->n_dir + d : (t * p->n_dir + d) * p->batch + b) * p->hidden;
}

/* One step of one batch row: pre-activations g (recurrence product) plus xp (input projection and
 * biases) become the new state h (and c). */
static void lstm_cell(const rnn_params *p, const activation *acts, const float *restrict xp, float *restrict g,
                      const float *restrict peep, float *restrict h, float *restrict c)
{
	int64_t n = p->hidden;
	float *gi = g, *go = g + n, *gf = g + 2 * n, *gc = g + 3 * n;
	for (int64_t j = 0; j < 4 * n; j++)
		g[j] += xp[j];
	if (peep)
		for (int64_t j = 0; j < n; j++) {
			gi[j] += peep[j] * c[j];
			gf[j] += peep[2 * n + j] * c[j];
		}
	activate(&acts[0], gi, n, p->clip);
	if (p->input_forget)
		for (int64_t j = 0; j < n; j++)
			gf[j] = 1 - gi[j];
	else
		activate(&acts[0], gf, n, p->clip);
	activate(&acts[1], gc, n, p->clip);
	for (int64_t j = 0; j < n; j++)
		c[j] = gf[j] * c[j] + gi[j] * gc[j];
	if (peep)
		for (int64_t j = 0; j < n; j++)
			go[j] += peep[n + j] * c[j];
	activate(&acts[0], go, n, p->clip);
	memcpy(gc, c, (size_t)n * sizeof(float));
	activate(&acts[2], gc, n, 0);
	for (int64_t j = 0; j < n; j++)
		h[j] = go[j] * gc[j];
}

/* GRU's update and reset gates; leaves r * h in rh for the candidate's product. */
static void gru_gates(const rnn_params *p, const activation *acts, const float *restrict xp, float *restrict g,
                      const float *restrict h, float *restrict rh)
{
	int64_t n = p->hidden;
	for (int64_t j = 0; j < 2 * n; j++)
		g[j] += xp[j];
	activate(&acts[0], g, 2 * n, p->clip);
	for (int64_t j = 0; j < n; j++)
		rh[j] = g[n + j] * h[j];
}

/* GRU's candidate and new state; g[2n..3n) holds the candidate's recurrence product (with Rbh added
 * already when linear_before_reset). */
static void gru_state(const rnn_params *p, const activation *acts, const float *restrict xp, float *restrict g,
                      float *restrict h)
{
	int64_t n = p->hidden;
	float *z = g, *r = g + n, *hh = g + 2 * n;
	if (p->linear_before_reset)
		for (int64_t j = 0; j < n; j++)
			hh[j] = xp[2 * n + j] + r[j] * hh[j];
	else
		for (int64_t j = 0; j < n; j++)
			hh[j] += xp[2 * n + j];
	activate(&acts[1], hh, n, p->clip);
	for (int64_t j = 0; j < n; j++)
		h[j] = (1 - z[j]) * hh[j] + z[j] * h[j];
}

TERN_ISA_BODY tern_status run_direction_body(const rnn_params *p, const rnn_buffers *bf, const int64_t *lens, int d,
                                               tern_threadpool *pool)
{
	int64_t n = p->hidden, gh = p->n_gates * n;
	bool reverse = p->reverse || d == 1;
	/* NULL where the plan freed weights it packed (tern_prepare_args.packed_inputs) */
	const float *w = bf->w ? bf->w + d * gh * p->input : NULL, *r = bf->r ? bf->r + d * gh * n : NULL;
	const activation *acts = p->acts[d];
	bool lbr = p->cell == CELL_GRU && p->linear_before_reset;

	/* Input biases fold into the projection; the recurrent ones too, except GRU's candidate Rbh
	 * with linear_before_reset, which the reset gate scales. */
	for (int64_t j = 0; j < gh; j++)
		bf->bias[j] = bf->b ? bf->b[d * 2 * gh + j] + (lbr && j >= 2 * n ? 0 : bf->b[d * 2 * gh + gh + j]) : 0;
	bool wpanels = !TERN_HAVE_BLAS && !p->wk[d] && !p->projected, rpanels = p->packed_recurrence && !p->rk[d];
	/* Row (t, b) of this direction's input projection is at xproj + x_row(t, b) * xstride. */
	const float *xproj = p->projected ? bf->x + d * gh : bf->xproj;
	int64_t xstride = p->projected ? p->n_dir * gh : gh;
	if (!p->projected) {
		if (wpanels)
			pack_panels(w, gh, p->input, bf->wpack);
		product(pool, p->seq * p->batch, gh, p->input, bf->x, p->input, w, wpanels ? bf->wpack : NULL, p->wk[d],
		        bf->xproj, gh);
		for (int64_t row = 0; row < p->seq * p->batch; row++) {
			float *restrict xr = bf->xproj + row * gh;
			for (int64_t j = 0; j < gh; j++)
				xr[j] += bf->bias[j];
		}
	}
	if (rpanels) {
		pack_panels(r, p->first_cols, n, bf->rpack);
		pack_panels(r + p->first_cols * n, gh - p->first_cols, n, bf->rpack_h);
	}
	for (int64_t b = 0; b < p->batch; b++) {
		for (int64_t j = 0; j < n; j++) {
			bf->h[b * n + j] = bf->h0 ? bf->h0[state_at(p, d, b) + j] : 0;
			bf->c[b * n + j] = bf->c0 ? bf->c0[state_at(p, d, b) + j] : 0;
		}
	}
	const float *peep = bf->p ? bf->p + d * 3 * n : NULL;
	const float *rbh = lbr && bf->b ? bf->b + d * 2 * gh + gh + 2 * n : NULL;
	memset(bf->rh, 0, (size_t)p->batch * (size_t)n * sizeof(float));
	for (int64_t s = 0; s < p->seq; s++) {
		product(pool, p->batch, p->first_cols, n, bf->h, n, r, rpanels ? bf->rpack : NULL, p->rk[d], bf->gates,
		        gh);
		for (int64_t b = 0; b < p->batch; b++) {
			if (s >= lens[b])
				continue;
			int64_t t = reverse ? lens[b] - 1 - s : s;
			const float *xp = xproj + x_row(p, t, b) * xstride;
			float *g = bf->gates + b * gh, *h = bf->h + b * n;
			switch (p->cell) {
			case CELL_RNN:
				for (int64_t j = 0; j < n; j++)
					h[j] = g[j] + xp[j];
				activate(&acts[0], h, n, p->clip);
				break;
			case CELL_LSTM: lstm_cell(p, acts, xp, g, peep, h, bf->c + b * n); break;
			case CELL_GRU:
				gru_gates(p, acts, xp, g, h, bf->rh + b * n);
				if (rbh)
					for (int64_t j = 0; j < n; j++)
						g[2 * n + j] += rbh[j];
				if (lbr)
					gru_state(p, acts, xp, g, h);
				break;
			}
		}
		if (p->cell == CELL_GRU && !lbr) {
			product(pool, p->batch, n, n, bf->rh, n, r ? r + 2 * n * n : NULL, rpanels ? bf->rpack_h : NULL,
			        p->rk_h[d], bf->gates + 2 * n, gh);
			for (int64_t b = 0; b < p->batch; b++)
				if (s < lens[b])
					gru_state(p, acts, xproj + x_row(p, reverse ? lens[b] - 1 - s : s, b) * xstride,
					          bf->gates + b * gh, bf->h + b * n);
		}
		if (bf->y)
			for (int64_t b = 0; b < p->batch; b++)
				if (s < lens[b])
					memcpy(bf->y + y_at(p, reverse ? lens[b] - 1 - s : s, d, b), bf->h + b * n,
					       (size_t)n * sizeof(float));
	}
	for (int64_t b = 0; b < p->batch; b++) {
		if (bf->yh)
			memcpy(bf->yh + state_at(p, d, b), bf->h + b * n, (size_t)n * sizeof(float));
		if (bf->yc)
			memcpy(bf->yc + state_at(p, d, b), bf->c + b * n, (size_t)n * sizeof(float));
	}
	return TERN_OK;
}
TERN_ISA_VARIANTS2(tern_status, run_direction, (const rnn_params *p, const rnn_buffers *bf, const int64_t *lens, int d, tern_threadpool *pool), (p, bf, lens, d, pool))

/* The steps of each sequence (sequence_lens, or all of them) into lens. */
static tern_status rnn_lens(const tern_kernel_args *a, const rnn_params *p, int64_t *lens)
{
	const tern_tensor *sl = a->n_in > IN_SEQ_LENS ? a->in[IN_SEQ_LENS] : NULL;
	for (int64_t b = 0; b < p->batch; b++) {
		lens[b] = sl ? tern_tensor_get_i64(sl, b) : p->seq;
		if (lens[b] < 0 || lens[b] > p->seq)
			return tern_node_errorf(a->node, TERN_EDATA,
			                        "input 4 'sequence_lens' element %lld is %lld, outside [0, %lld]",
			                        (long long)b, (long long)lens[b], (long long)p->seq);
	}
	return TERN_OK;
}

static tern_status rnn_kernel(const tern_kernel_args *a)
{
	const rnn_params *p = a->params;
	rnn_buffers bf;
	rnn_carve(p, a->in, a->n_in, a->out, a->n_out, a->scratch, &bf);
	const tern_tensor *in_list[] = {a->in[IN_X],
	                                a->in[IN_W],
	                                a->in[IN_R],
	                                a->n_in > IN_B ? a->in[IN_B] : NULL,
	                                a->n_in > IN_H0 ? a->in[IN_H0] : NULL,
	                                p->cell == CELL_LSTM && a->n_in > IN_C0 ? a->in[IN_C0] : NULL,
	                                p->cell == CELL_LSTM && a->n_in > IN_P ? a->in[IN_P] : NULL};
	float *in_dst[] = {bf.x, bf.w, bf.r, bf.b, bf.h0, bf.c0, bf.p};
	for (size_t i = 0; i < TERN_ARRAY_LEN(in_list); i++)
		to_float(in_list[i], in_dst[i]);

	int64_t *len = bf.lens;
	tern_status st = rnn_lens(a, p, len);
	if (st)
		return st;
	if (bf.y)
		memset(bf.y, 0, (size_t)(p->seq * p->n_dir * p->batch * p->hidden) * sizeof(float));
	for (int d = 0; d < p->n_dir; d++)
		if ((st = run_direction(p, &bf, len, d, a->pool)))
			return st;
	from_float(bf.y, a->n_out > OUT_Y ? a->out[OUT_Y] : NULL);
	from_float(bf.yh, a->n_out > OUT_YH ? a->out[OUT_YH] : NULL);
	from_float(bf.yc, p->cell == CELL_LSTM && a->n_out > OUT_YC ? a->out[OUT_YC] : NULL);
	return TERN_OK;
}

/* Y's dimensions, and Y_h's (initial_h's) in either layout. */
static void rnn_y_dims(const rnn_params *p, int64_t dims[4])
{
	int64_t nd = p->n_dir;
	int64_t d0[4] = {p->seq, nd, p->batch, p->hidden}, d1[4] = {p->batch, p->seq, nd, p->hidden};
	memcpy(dims, p->layout ? d1 : d0, sizeof d0);
}
static void rnn_state_dims(const rnn_params *p, int64_t dims[3])
{
	dims[0] = p->layout ? p->batch : p->n_dir;
	dims[1] = p->layout ? p->n_dir : p->batch;
	dims[2] = p->hidden;
}

/* ---------------------------------------------------------------- float64 */

/* float64 computes in float64 throughout, with the exact functions (the float path's fast
 * approximations would hold its results, and the finite differences gradcheck takes of them, to float
 * precision): the steps of run_direction, plainly, with BLAS products. */
#define SOFTPLUS_LINEAR_F64 36 /* log1p(exp(x)) is x to double precision from here on */

static void act_f64(const activation *a, double *x, int64_t n, double clip)
{
	double al = a->alpha, be = a->beta;
	for (int64_t i = 0; i < n; i++) {
		double v = clip > 0 ? (x[i] > clip ? clip : x[i] < -clip ? -clip : x[i]) : x[i];
		switch (a->kind) {
		case A_RELU: v = v > 0 ? v : 0; break;
		case A_TANH: v = tanh(v); break;
		case A_SIGMOID: v = 1 / (1 + exp(-v)); break;
		case A_AFFINE: v = al * v + be; break;
		case A_LEAKYRELU: v = v >= 0 ? v : al * v; break;
		case A_THRESHOLDEDRELU: v = v >= al ? v : 0; break;
		case A_SCALEDTANH: v = al * tanh(be * v); break;
		case A_HARDSIGMOID: v = fmin(fmax(al * v + be, 0), 1); break;
		case A_ELU: v = v >= 0 ? v : al * expm1(v); break;
		case A_SOFTSIGN: v = v / (1 + fabs(v)); break;
		case A_SOFTPLUS: v = v > SOFTPLUS_LINEAR_F64 ? v : log1p(exp(v)); break;
		}
		x[i] = v;
	}
}

/* Operands (NULL when omitted) and work buffers of the float64 forward. */
typedef struct rnn_io_f64 {
	const double *x, *w, *r, *b, *h0, *c0, *p;
	double *y, *yh, *yc;
	double *xproj, *gates, *bias, *h, *c, *rh; /* as in rnn_buffers */
	int64_t *lens;
} rnn_io_f64;

static size_t rnn_carve_f64(const rnn_params *p, char *base, rnn_io_f64 *io)
{
	int64_t gh = p->n_gates * p->hidden, bh = p->batch * p->hidden;
	struct {
		double **dst;
		int64_t n;
	} work[] = {
	        {io ? &io->xproj : NULL, p->projected ? 0 : p->seq * p->batch * gh},
	        {io ? &io->gates : NULL, p->batch * gh},
	        {io ? &io->bias : NULL, gh},
	        {io ? &io->h : NULL, bh},
	        {io ? &io->c : NULL, bh},
	        {io ? &io->rh : NULL, bh},
	};
	size_t off = 0;
	for (size_t i = 0; i < TERN_ARRAY_LEN(work); i++) {
		if (base)
			*work[i].dst = (double *)(base + off);
		off += ((size_t)work[i].n * sizeof(double) + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	}
	if (base)
		io->lens = (int64_t *)(base + off);
	return off + (size_t)p->batch * sizeof(int64_t);
}

static void run_direction_f64(const rnn_params *p, const rnn_io_f64 *io, int d)
{
	int64_t n = p->hidden, gh = p->n_gates * n, fc = p->first_cols;
	bool reverse = p->reverse || d == 1;
	const double *w = io->w ? io->w + d * gh * p->input : NULL, *r = io->r + d * gh * n;
	const activation *acts = p->acts[d];
	bool lbr = p->cell == CELL_GRU && p->linear_before_reset;
	double clip = p->clip;
	const double *bb = io->b ? io->b + d * 2 * gh : NULL;
	for (int64_t j = 0; j < gh; j++)
		io->bias[j] = bb ? bb[j] + (lbr && j >= 2 * n ? 0 : bb[gh + j]) : 0;
	const double *xproj = p->projected ? io->x + d * gh : io->xproj;
	int64_t xstride = p->projected ? p->n_dir * gh : gh, rows = p->seq * p->batch;
	if (!p->projected) {
		tern_gemm_f64(false, true, rows, gh, p->input, 1, io->x, p->input, w, p->input, 0, io->xproj, gh);
		for (int64_t row = 0; row < rows; row++)
			for (int64_t j = 0; j < gh; j++)
				io->xproj[row * gh + j] += io->bias[j];
	}
	for (int64_t b = 0; b < p->batch; b++)
		for (int64_t j = 0; j < n; j++) {
			io->h[b * n + j] = io->h0 ? io->h0[state_at(p, d, b) + j] : 0;
			io->c[b * n + j] = io->c0 ? io->c0[state_at(p, d, b) + j] : 0;
		}
	const double *peep = io->p ? io->p + d * 3 * n : NULL;
	const double *rbh = lbr && bb ? bb + gh + 2 * n : NULL;
	memset(io->rh, 0, (size_t)(p->batch * n) * sizeof(double));
	for (int64_t s = 0; s < p->seq; s++) {
		tern_gemm_f64(false, true, p->batch, fc, n, 1, io->h, n, r, n, 0, io->gates, gh);
		for (int64_t b = 0; b < p->batch; b++) {
			if (s >= io->lens[b])
				continue;
			int64_t t = reverse ? io->lens[b] - 1 - s : s;
			const double *xp = xproj + x_row(p, t, b) * xstride;
			double *g = io->gates + b * gh, *h = io->h + b * n, *c = io->c + b * n;
			for (int64_t j = 0; j < (p->cell == CELL_GRU ? 2 * n : gh); j++)
				g[j] += xp[j];
			switch (p->cell) {
			case CELL_RNN:
				act_f64(&acts[0], g, n, clip);
				memcpy(h, g, (size_t)n * sizeof(double));
				break;
			case CELL_LSTM: {
				double *gi = g, *go = g + n, *gf = g + 2 * n, *gc = g + 3 * n;
				for (int64_t j = 0; peep && j < n; j++) {
					gi[j] += peep[j] * c[j];
					gf[j] += peep[2 * n + j] * c[j];
				}
				act_f64(&acts[0], gi, n, clip);
				if (p->input_forget)
					for (int64_t j = 0; j < n; j++)
						gf[j] = 1 - gi[j];
				else
					act_f64(&acts[0], gf, n, clip);
				act_f64(&acts[1], gc, n, clip);
				for (int64_t j = 0; j < n; j++)
					c[j] = gf[j] * c[j] + gi[j] * gc[j];
				for (int64_t j = 0; peep && j < n; j++)
					go[j] += peep[n + j] * c[j];
				act_f64(&acts[0], go, n, clip);
				memcpy(gc, c, (size_t)n * sizeof(double));
				act_f64(&acts[2], gc, n, 0);
				for (int64_t j = 0; j < n; j++)
					h[j] = go[j] * gc[j];
				break;
			}
			case CELL_GRU:
				act_f64(&acts[0], g, 2 * n, clip);
				for (int64_t j = 0; j < n; j++)
					io->rh[b * n + j] = g[n + j] * h[j];
				break;
			}
		}
		if (p->cell == CELL_GRU) {
			if (!lbr)
				tern_gemm_f64(false, true, p->batch, n, n, 1, io->rh, n, r + 2 * n * n, n, 0,
				              io->gates + 2 * n, gh);
			for (int64_t b = 0; b < p->batch; b++) {
				if (s >= io->lens[b])
					continue;
				int64_t t = reverse ? io->lens[b] - 1 - s : s;
				const double *xp = xproj + x_row(p, t, b) * xstride;
				double *g = io->gates + b * gh, *h = io->h + b * n;
				double *z = g, *rr = g + n, *hh = g + 2 * n;
				for (int64_t j = 0; j < n; j++)
					hh[j] = lbr ? xp[2 * n + j] + rr[j] * (hh[j] + (rbh ? rbh[j] : 0))
					            : hh[j] + xp[2 * n + j];
				act_f64(&acts[1], hh, n, clip);
				for (int64_t j = 0; j < n; j++)
					h[j] = (1 - z[j]) * hh[j] + z[j] * h[j];
			}
		}
		for (int64_t b = 0; io->y && b < p->batch; b++)
			if (s < io->lens[b])
				memcpy(io->y + y_at(p, reverse ? io->lens[b] - 1 - s : s, d, b), io->h + b * n,
				       (size_t)n * sizeof(double));
	}
	for (int64_t b = 0; b < p->batch; b++) {
		if (io->yh)
			memcpy(io->yh + state_at(p, d, b), io->h + b * n, (size_t)n * sizeof(double));
		if (io->yc)
			memcpy(io->yc + state_at(p, d, b), io->c + b * n, (size_t)n * sizeof(double));
	}
}

static const double *in_f64(const tern_kernel_args *a, int i)
{
	return i < a->n_in && a->in[i] ? a->in[i]->data : NULL;
}
static double *out_f64(const tern_kernel_args *a, int o)
{
	return o < a->n_out && a->out[o] ? a->out[o]->data : NULL;
}

static tern_status rnn_kernel_f64(const tern_kernel_args *a)
{
	const rnn_params *p = a->params;
	bool lstm = p->cell == CELL_LSTM;
	rnn_io_f64 io = {in_f64(a, IN_X), in_f64(a, IN_W), in_f64(a, IN_R), in_f64(a, IN_B), in_f64(a, IN_H0),
	                 lstm ? in_f64(a, IN_C0) : NULL, lstm ? in_f64(a, IN_P) : NULL, out_f64(a, OUT_Y),
	                 out_f64(a, OUT_YH), lstm ? out_f64(a, OUT_YC) : NULL};
	rnn_carve_f64(p, a->scratch, &io);
	tern_status st = rnn_lens(a, p, io.lens);
	if (st)
		return st;
	if (io.y)
		memset(io.y, 0, (size_t)(p->seq * p->n_dir * p->batch * p->hidden) * sizeof(double));
	for (int d = 0; d < p->n_dir; d++)
		run_direction_f64(p, &io, d);
	return TERN_OK;
}

/* ---------------------------------------------------------------- prepare */

static const struct cell_def {
	const char *op_type;
	enum cell cell;
	int n_gates, n_acts;
	enum act_kind defaults[3];
} cell_defs[] = {
        {"RNN", CELL_RNN, 1, 1, {A_TANH}},
        {"GRU", CELL_GRU, 3, 2, {A_SIGMOID, A_TANH}},
        {"LSTM", CELL_LSTM, 4, 3, {A_SIGMOID, A_TANH, A_TANH}},
};

/* The operators' inputs, then those their gradients take besides (see rnn_grad). */
static const char *const input_names[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P",
                                          "Y", "dY", "dY_h", "dY_c"};

/* An optional input must have exactly the shape the others imply. */
static tern_status expect_shape(const tern_node *node, const tern_tensor *t, int index, int rank, const int64_t *dims)
{
	bool ok = t->rank == rank;
	for (int i = 0; ok && i < rank; i++)
		ok = t->dims[i] == dims[i];
	if (ok)
		return TERN_OK;
	char got[128], want[128];
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' has shape %s, expected %s", index, input_names[index],
	                        tern_shape_str(t->dtype, t->rank, t->dims, got, sizeof got),
	                        tern_shape_str(t->dtype, rank, dims, want, sizeof want));
}

/* The activations attribute (per direction, or once for both) with its alpha and beta lists. */
static tern_status parse_activations(const tern_node *node, const struct cell_def *def, rnn_params *rp)
{
	const Onnx__AttributeProto *names = tern_attr(node, "activations");
	size_t n_alpha = 0, n_beta = 0, ia = 0, ib = 0;
	const float *alphas = tern_attr_floats(node, "activation_alpha", &n_alpha);
	const float *betas = tern_attr_floats(node, "activation_beta", &n_beta);
	size_t count = names ? names->n_strings : 0;
	if (count && count != (size_t)def->n_acts && count != (size_t)(def->n_acts * rp->n_dir))
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'activations' has %zu names, expected %d per direction", count,
		                        def->n_acts);
	for (int d = 0; d < rp->n_dir; d++)
		for (int k = 0; k < def->n_acts; k++) {
			const struct act_def *ad = NULL;
			if (!count) {
				for (size_t i = 0; i < TERN_ARRAY_LEN(act_defs); i++)
					if (act_defs[i].kind == def->defaults[k])
						ad = &act_defs[i];
			} else {
				const ProtobufCBinaryData *s = &names->strings[(d * def->n_acts + k) % count];
				for (size_t i = 0; i < TERN_ARRAY_LEN(act_defs) && !ad; i++)
					if (strlen(act_defs[i].name) == s->len &&
					    strncasecmp(act_defs[i].name, (const char *)s->data, s->len) == 0)
						ad = &act_defs[i];
				if (!ad)
					return tern_node_errorf(node, TERN_EDATA, "activation '%.*s' is not supported",
					                        (int)s->len, (const char *)s->data);
			}
			activation *act = &rp->acts[d][k];
			act->kind = ad->kind;
			act->alpha = ad->n_params >= 1 && ia < n_alpha ? alphas[ia++] : ad->alpha;
			act->beta = ad->n_params >= 2 && ib < n_beta ? betas[ib++] : ad->beta;
		}
	return TERN_OK;
}

/* The cell, directions, sizes, attributes and the shapes of inputs 0 to 7 (X, W, R, B, sequence_lens,
 * initial_h, initial_c, P: in[i] NULL where omitted, n_in of them), into rp; shared by the operators and
 * their gradients. */
static tern_status rnn_setup(const tern_node *node, const struct cell_def *def, tern_tensor *const *in, int n_in,
                             bool projected, rnn_params *rp)
{
	if (n_in < 3 || (!in[IN_W] && !projected) || !in[IN_R])
		return tern_node_errorf(node, TERN_EDATA, "inputs 1 'W' and 2 'R' are required");
	const tern_tensor *x = in[IN_X], *w = in[IN_W], *r = in[IN_R];
	for (int i = 0; i < n_in && i <= IN_P; i++) {
		const tern_tensor *t = in[i];
		if (t && i != IN_SEQ_LENS && t->dtype != x->dtype)
			return tern_node_errorf(node, TERN_EDATA, "input %d '%s' is %s, input 0 'X' is %s", i,
			                        input_names[i], tern_dtype_name(t->dtype), tern_dtype_name(x->dtype));
	}
	if (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE && x->dtype != TERN_FLOAT16)
		return tern_node_errorf(node, TERN_EDATA, "input 0 'X' has unsupported type %s",
		                        tern_dtype_name(x->dtype));
	if (x->rank != 3 || (w && w->rank != 3) || r->rank != 3)
		return tern_node_errorf(node, TERN_EDATA, "inputs 'X', 'W' and 'R' must have rank 3, not %d, %d and %d",
		                        x->rank, w ? w->rank : 3, r->rank);

	rp->cell = def->cell;
	rp->projected = projected;
	rp->n_gates = def->n_gates;
	rp->n_acts = def->n_acts;
	rp->layout = (int)tern_attr_int(node, "layout", 0);
	const char *direction = tern_attr_string(node, "direction", "forward");
	if (strcmp(direction, "forward") == 0 || strcmp(direction, "reverse") == 0) {
		rp->n_dir = 1;
		rp->reverse = direction[0] == 'r';
	} else if (strcmp(direction, "bidirectional") == 0) {
		rp->n_dir = 2;
	} else {
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'direction' is '%s', not forward, reverse or bidirectional",
		                        direction);
	}
	if (rp->layout != 0 && rp->layout != 1)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'layout' is %d, not 0 or 1", rp->layout);
	rp->seq = x->dims[rp->layout ? 1 : 0];
	rp->batch = x->dims[rp->layout ? 0 : 1];
	rp->hidden = r->dims[2];
	rp->input = projected ? (w ? w->dims[2] : 0) : x->dims[2];
	int64_t hidden_attr = tern_attr_int(node, "hidden_size", rp->hidden);
	if (hidden_attr != rp->hidden)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'hidden_size' is %lld, input 2 'R' has %lld",
		                        (long long)hidden_attr, (long long)rp->hidden);
	int64_t n = rp->hidden, gh = def->n_gates * n, nd = rp->n_dir;
	if (projected && x->dims[2] != nd * gh)
		return tern_node_errorf(
		        node, TERN_EDATA,
		        "input 0 'X' holds the input projections: its last dimension must be %lld, not %lld",
		        (long long)(nd * gh), (long long)x->dims[2]);
	const Onnx__AttributeProto *clip = tern_attr(node, "clip");
	rp->clip = clip ? tern_attr_float(node, "clip", 0) : 0;
	if (clip && !(rp->clip > 0))
		return tern_node_errorf(node, TERN_EDATA, "attribute 'clip' is %g, not positive", rp->clip);
	rp->linear_before_reset = tern_attr_int(node, "linear_before_reset", 0) != 0;
	rp->input_forget = tern_attr_int(node, "input_forget", 0) != 0;
	tern_status st = parse_activations(node, def, rp);
	if (st)
		return st;

	int64_t state[3];
	rnn_state_dims(rp, state);
	const struct {
		int index, rank;
		int64_t dims[3];
	} shapes[] = {
	        {IN_W, 3, {nd, gh, rp->input}},
	        {IN_R, 3, {nd, gh, n}},
	        {IN_B, 2, {nd, 2 * gh}},
	        {IN_SEQ_LENS, 1, {rp->batch}},
	        {IN_H0, 3, {state[0], state[1], n}},
	        {IN_C0, 3, {state[0], state[1], n}},
	        {IN_P, 2, {nd, 3 * n}},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(shapes); i++) {
		int k = shapes[i].index;
		if (k < n_in && in[k] && (st = expect_shape(node, in[k], k, shapes[i].rank, shapes[i].dims)))
			return st;
	}
	return TERN_OK;
}

static tern_status rnn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const struct cell_def *def = NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(cell_defs); i++)
		if (strcmp(cell_defs[i].op_type, node->op_type) == 0)
			def = &cell_defs[i];
	if (!def)
		return tern_node_errorf(node, TERN_EINTERNAL, "no recurrent cell is registered under this name");
	bool projected = strcmp(node->domain, "tern") == 0 && tern_attr_int(node, "projected", 0) != 0;
	rnn_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = rp;
	p->free_params = rnn_free;
	tern_status st = rnn_setup(node, def, p->in, p->n_in, projected, rp);
	if (st)
		return st;
	const tern_tensor *x = p->in[IN_X], *w = p->in[IN_W], *r = p->in[IN_R];
	int64_t n = rp->hidden, gh = def->n_gates * n, nd = rp->n_dir, state[3], ydims[4];
	rnn_state_dims(rp, state);
	rnn_y_dims(rp, ydims);
	if (p->n_out > OUT_Y && p->out[OUT_Y])
		tern_set_shape(p->out[OUT_Y], x->dtype, 4, ydims);
	for (int o = OUT_YH; o < p->n_out && o <= (def->cell == CELL_LSTM ? OUT_YC : OUT_YH); o++)
		if (p->out[o])
			tern_set_shape(p->out[o], x->dtype, 3, state);
	rp->packed_recurrence = !TERN_HAVE_BLAS || rp->batch <= PACKED_MAX_ROWS;
	/* The candidate gate of a GRU without linear_before_reset needs r first: its product comes later. */
	rp->first_cols = def->cell == CELL_GRU && !rp->linear_before_reset ? 2 * n : gh;
	if (x->dtype == TERN_DOUBLE) {
		p->scratch_bytes = rnn_carve_f64(rp, NULL, NULL);
		p->kernel = rnn_kernel_f64;
		return TERN_OK;
	}
	/* float32 weights known now are packed now, for every run */
	for (int d = 0; x->dtype == TERN_FLOAT && (projected || w->data) && r->data && d < nd; d++) {
		const float *rd = (const float *)r->data + d * gh * n;
		if (!projected)
			rp->wk[d] = tern_pack_a(gh, rp->input, (const float *)w->data + d * gh * rp->input, rp->input,
			                        false, 1.0f);
		rp->rk[d] = tern_pack_a(rp->first_cols, n, rd, n, false, 1.0f);
		rp->rk_h[d] = rp->first_cols < gh
		        ? tern_pack_a(gh - rp->first_cols, n, rd + rp->first_cols * n, n, false, 1.0f)
		        : NULL;
		if ((!projected && !rp->wk[d]) || !rp->rk[d] || (rp->first_cols < gh && !rp->rk_h[d]))
			return tern_errorf(TERN_EOS, "out of memory");
		/* every direction packed: the kernel reads W and R only through the packed copies */
		if (d == nd - 1)
			p->packed_inputs |= (projected ? 0u : 1u << IN_W) | 1u << IN_R;
	}
	rnn_buffers bf;

	p->scratch_bytes = rnn_carve(rp, p->in, p->n_in, p->out, p->n_out, NULL, &bf);
	p->kernel = rnn_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- gradients
 *
 * tern.RNNGrad, tern.GRUGrad and tern.LSTMGrad (X, W, R, B, sequence_lens, initial_h, initial_c, P, Y, dY,
 * dY_h, dY_c) -> dX, dW, dR, dB, d initial_h, d initial_c, dP, with the forward operator's attributes:
 * backpropagation through time for inputs 0 to 7 as the forward takes them (GRU and RNN leave 6, 7 and
 * 11 out), Y the forward's output and dY, dY_h, dY_c the gradients that flow into its three outputs
 * (omitted: none). Outputs past the last wanted may be left out; attribute grad_outputs (ints), when
 * present, lists those to compute, the others being zeros (dX, an input's that nobody wants, costs as
 * much as dW).
 *
 * The forward's gates are not saved: a rule adds nodes but cannot give the forward node more outputs,
 * so a forward that saved them would be a second forward node computing everything again. Instead the
 * gradient recomputes them from Y, which holds h_{t-1} of every step: with all the previous states
 * known, every step's pre-activations come from two products over all the steps at once, X W^T and
 * H_prev R^T (large products, much faster than the forward's product per step); only the cell state's
 * recurrence, elementwise, runs step after step. Then, from the last step back, the gate gradients of
 * a step dG_t give the state's, dh_{t-1} = dG_t R (one product per step, GRU without
 * linear_before_reset two: R's candidate rows first, the reset gate's gradient needs theirs), and at
 * the end the parameters' come in large products over all the steps: dX = dG W, dW = dG^T X,
 * dR = dG^T H_prev, dB their sums. float32 runs every product through tern's packed kernels (gemm.h):
 * R^T packed once per direction for those per step, one operand packed per call for those over all the
 * steps (the word-LM LSTM, hidden 256, 35 steps, batch 20: forward and backward 35 ms with BLAS for
 * these, 21 ms so); float64 computes exactly, with BLAS. */
enum { GIN_Y = 8, GIN_DY, GIN_DYH, GIN_DYC, GIN_COUNT };
enum { GOUT_DX, GOUT_DW, GOUT_DR, GOUT_DB, GOUT_DH0, GOUT_DC0, GOUT_DP, GOUT_COUNT };
/* The input each output is the gradient of. */
static const int grad_of[GOUT_COUNT] = {IN_X, IN_W, IN_R, IN_B, IN_H0, IN_C0, IN_P};

/* Work buffers of a gradient, per direction (reused by the next): A pre-activations [rows, gates *
 * hidden] (rows: every (step, batch) as X lays them out), G the gates, HP h_{t-1}, C LSTM's c_t, AUX
 * GRU's (h R_h^T + Rbh, or r * h), DG the gate gradients, DGH GRU's candidate gradient times r (with
 * linear_before_reset, for R), then one step's: DGS gate gradients, DH and DC the state's gradients,
 * TMP, and DP the peepholes' gradient. */
enum { GB_A, GB_G, GB_HP, GB_C, GB_AUX, GB_DG, GB_DGH, GB_DGS, GB_DH, GB_DC, GB_TMP, GB_DP, GB_COUNT };

static size_t grad_carve(const rnn_params *p, size_t elem, size_t off[GB_COUNT], size_t *lens_off)
{
	int64_t n = p->hidden, gh = p->n_gates * n, nb = p->batch, rows = p->seq * nb;
	bool lstm = p->cell == CELL_LSTM, gru = p->cell == CELL_GRU, lbr = gru && p->linear_before_reset;
	int64_t count[GB_COUNT] = {
	        [GB_A] = rows * gh,
	        [GB_G] = rows * gh,
	        [GB_HP] = rows * n,
	        [GB_C] = lstm ? rows * n : 0,
	        [GB_AUX] = gru ? rows * n : 0,
	        [GB_DG] = rows * gh,
	        [GB_DGH] = lbr ? rows * n : 0,
	        [GB_DGS] = nb * gh,
	        [GB_DH] = nb * n,
	        [GB_DC] = nb * n,
	        [GB_TMP] = nb * n,
	        [GB_DP] = 3 * n,
	};
	size_t at = 0;
	for (int i = 0; i < GB_COUNT; i++) {
		off[i] = count[i] ? at : SIZE_MAX; /* SIZE_MAX: not needed */
		at += ((size_t)count[i] * elem + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	}
	*lens_off = at;
	return at + (size_t)nb * sizeof(int64_t);
}

#define RNN_GRAD_T float
#define RNN_GRAD_F32 1
#define TS(name) name##_f32
#include "ops/rnn_grad.h"
#undef RNN_GRAD_T
#undef RNN_GRAD_F32
#undef TS
#define RNN_GRAD_T double
#define RNN_GRAD_F32 0
#define TS(name) name##_f64
#include "ops/rnn_grad.h"
#undef RNN_GRAD_T
#undef RNN_GRAD_F32
#undef TS

static tern_status rnn_grad_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const struct cell_def *def = NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(cell_defs); i++) {
		size_t len = strlen(cell_defs[i].op_type);
		if (strncmp(node->op_type, cell_defs[i].op_type, len) == 0 && strcmp(node->op_type + len, "Grad") == 0)
			def = &cell_defs[i];
	}
	if (!def)
		return tern_node_errorf(node, TERN_EINTERNAL, "no recurrent cell is registered under this name");
	if (tern_attr_int(node, "projected", 0))
		return tern_node_errorf(node, TERN_EDATA, "a recurrence over input projections has no gradient");
	rnn_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return tern_errorf(TERN_EOS, "out of memory");
	p->params = rp;
	p->free_params = rnn_free;
	tern_status st = rnn_setup(node, def, p->in, p->n_in < IN_P + 1 ? p->n_in : IN_P + 1, false, rp);
	if (st)
		return st;
	const tern_tensor *x = p->in[IN_X];
	if (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE)
		return tern_node_errorf(node, TERN_EDATA, "input 0 'X' is %s: gradients are float or double",
		                        tern_dtype_name(x->dtype));
	bool lstm = def->cell == CELL_LSTM;
	for (int i = IN_C0; !lstm && i < p->n_in && i < GIN_COUNT; i++)
		if (p->in[i] && (i == IN_C0 || i == IN_P || i == GIN_DYC))
			return tern_node_errorf(node, TERN_EDATA, "input %d '%s' belongs to LSTM alone", i,
			                        input_names[i]);
	if (p->n_in <= GIN_Y || !p->in[GIN_Y])
		return tern_node_errorf(node, TERN_EDATA, "input 8 'Y' (the forward's output) is required");
	if (p->n_in > GIN_COUNT)
		return tern_node_errorf(node, TERN_EDATA, "%d inputs, at most %d", p->n_in, GIN_COUNT);
	int64_t n = rp->hidden, gh = def->n_gates * n, nd = rp->n_dir, state[3], ydims[4];
	rnn_state_dims(rp, state);
	rnn_y_dims(rp, ydims);
	for (int i = GIN_Y; i < p->n_in; i++) {
		const tern_tensor *t = p->in[i];
		if (!t)
			continue;
		if (t->dtype != x->dtype)
			return tern_node_errorf(node, TERN_EDATA, "input %d '%s' is %s, input 0 'X' is %s", i,
			                        input_names[i], tern_dtype_name(t->dtype), tern_dtype_name(x->dtype));
		if ((st = i <= GIN_DY ? expect_shape(node, t, i, 4, ydims) : expect_shape(node, t, i, 3, state)))
			return st;
	}
	size_t n_listed = 0;
	const int64_t *listed = tern_attr_ints(node, "grad_outputs", &n_listed);
	if (listed) {
		rp->skipped = (1u << GOUT_COUNT) - 1;
		for (size_t k = 0; k < n_listed; k++)
			if (listed[k] >= 0 && listed[k] < GOUT_COUNT)
				rp->skipped &= ~(1u << listed[k]);
	}
	int max_out = lstm ? GOUT_COUNT : GOUT_DH0 + 1;
	if (p->n_out > max_out)
		return tern_node_errorf(node, TERN_EDATA, "%d outputs, at most %d", p->n_out, max_out);
	const struct {
		int rank;
		int64_t dims[3];
	} shapes[GOUT_COUNT] = {
	        [GOUT_DX] = {3, {x->dims[0], x->dims[1], x->dims[2]}},
	        [GOUT_DW] = {3, {nd, gh, rp->input}},
	        [GOUT_DR] = {3, {nd, gh, n}},
	        [GOUT_DB] = {2, {nd, 2 * gh}},
	        [GOUT_DH0] = {3, {state[0], state[1], state[2]}},
	        [GOUT_DC0] = {3, {state[0], state[1], state[2]}},
	        [GOUT_DP] = {2, {nd, 3 * n}},
	};
	for (int o = 0; o < p->n_out; o++)
		if (p->out[o])
			tern_set_shape(p->out[o], x->dtype, shapes[o].rank, shapes[o].dims);
	size_t off[GB_COUNT], lens_off;
	bool f64 = x->dtype == TERN_DOUBLE;
	p->scratch_bytes = grad_carve(rp, f64 ? sizeof(double) : sizeof(float), off, &lens_off);
	p->kernel = f64 ? grad_kernel_f64 : grad_kernel_f32;
	return TERN_OK;
}

/* The gradient rule of RNN, GRU and LSTM: one tern.<Op>Grad node (above) on the forward's inputs, its
 * Y and the gradients that flow. When the forward node leaves Y out, a copy of it computes Y for the
 * gradient. float16 and the recurrences over input projections (tern.<Op>, after tern-optimize) have
 * none. */
static tern_status rnn_grad(tern_grad_ctx *g)
{
	const tern_node *node = g->node;
	bool lstm = strcmp(node->op_type, "LSTM") == 0;
	int dtype = tern_g_dtype(g, g->x[IN_X]);
	if (dtype != TERN_FLOAT && dtype != TERN_DOUBLE)
		return tern_g_fail(g, "%s's gradient is computed in float and double, not %s", node->op_type,
		                   tern_dtype_name(dtype));
	tern_gval *y = g->n_out > OUT_Y ? g->y[OUT_Y] : NULL;
	if (!y) {
		tern_gval *fy[1] = {NULL};
		if (tern_g_op_like_n(g, node->domain, node->op_type, g->x, g->n_in, NULL, 0, fy, 1))
			return tern_g_status(g);
		y = fy[0];
	}
	tern_gval *in[GIN_COUNT] = {NULL};
	for (int i = 0; i < g->n_in && i <= IN_P; i++)
		in[i] = lstm || i < IN_C0 ? g->x[i] : NULL;
	in[GIN_Y] = y;
	in[GIN_DY] = g->n_out > OUT_Y ? g->dy[OUT_Y] : NULL;
	in[GIN_DYH] = g->n_out > OUT_YH ? g->dy[OUT_YH] : NULL;
	in[GIN_DYC] = lstm && g->n_out > OUT_YC ? g->dy[OUT_YC] : NULL;
	int n_in = GIN_COUNT, n_out = 0;
	while (n_in > 0 && !in[n_in - 1])
		n_in--;
	for (int k = 0; k < (lstm ? GOUT_COUNT : GOUT_DH0 + 1); k++)
		if (grad_of[k] < g->n_in && g->wants[grad_of[k]])
			n_out = k + 1;
	/* the builder names every output: those before the last wanted that are not wanted are skipped */
	int64_t listed[GOUT_COUNT];
	int n_listed = 0;
	for (int k = 0; k < n_out; k++)
		if (grad_of[k] < g->n_in && g->wants[grad_of[k]])
			listed[n_listed++] = k;
	tern_gattr skip = TERN_GA_IS("grad_outputs", listed, (size_t)n_listed);
	char op[32];
	snprintf(op, sizeof op, "%sGrad", node->op_type);
	tern_gval *out[GOUT_COUNT] = {NULL};
	if (tern_g_op_like_n(g, "tern", op, in, n_in, &skip, n_listed < n_out, out, n_out))
		return tern_g_status(g);
	for (int k = 0; k < n_out; k++)
		if (grad_of[k] < g->n_in && g->wants[grad_of[k]] && !(g->dx[grad_of[k]] = out[k]))
			return tern_g_status(g);
	return TERN_OK;
}

#define RNN_DTYPES (TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(FLOAT16))

static const tern_op ops[] = {
        {"", "RNN", 1, 0, rnn_prepare, RNN_DTYPES, "rnn", rnn_grad},
        {"", "GRU", 1, 0, rnn_prepare, RNN_DTYPES, "rnn", rnn_grad},
        {"", "LSTM", 1, 0, rnn_prepare, RNN_DTYPES, "rnn", rnn_grad},
        /* The same with attribute projected = 1 (written by tern-optimize's fold-embedding): X holds the input
	 * projections, W may be omitted. */
        {"tern", "RNN", 1, 0, rnn_prepare, RNN_DTYPES, "rnn"},
        {"tern", "GRU", 1, 0, rnn_prepare, RNN_DTYPES, "rnn"},
        {"tern", "LSTM", 1, 0, rnn_prepare, RNN_DTYPES, "rnn"},
        {"tern", "RNNGrad", 1, 0, rnn_grad_prepare, TERN_DT(FLOAT) | TERN_DT(DOUBLE), "rnn"},
        {"tern", "GRUGrad", 1, 0, rnn_grad_prepare, TERN_DT(FLOAT) | TERN_DT(DOUBLE), "rnn"},
        {"tern", "LSTMGrad", 1, 0, rnn_grad_prepare, TERN_DT(FLOAT) | TERN_DT(DOUBLE), "rnn"},
};

const tern_op_table tern_ops_rnn = {ops, TERN_ARRAY_LEN(ops)};
