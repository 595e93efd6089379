/* softmax.c — Softmax, LogSoftmax and Hardmax along an axis, the losses that read log-probabilities
 * (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) and Dropout. Rows, or blocks of columns when the
 * axis is not the last, run in parallel. Kernels exist for float and double; float16 and bfloat16 are
 * computed in float. */
#include "ops/nn.h"

#include <stdatomic.h>

/* ---------------------------------------------------------------- Softmax, LogSoftmax, Hardmax */

enum { SOFTMAX, LOG_SOFTMAX, HARDMAX };

#define LANES 16 /* columns of a strided softmax handled together, so the loops run along the rows */

/* Softmax and LogSoftmax over n elements `inner` apart, for `lanes` neighbouring columns at once.
 * The exponentials go through y; sums use LANES partial sums so that they vectorise too. */
#define DEF_SOFTMAX(S, T, EXP, LOG, SELECT)                                                                   \
	TERN_ISA_BODY void softmax_block_##S##_body(int kind, const T *x, T *y, int64_t n, int64_t inner, int lanes)   \
	{                                                                                                \
		T max[LANES], sum[LANES];                                                                    \
		for (int l = 0; l < lanes; l++) {                                                            \
			max[l] = x[l];                                                                           \
			sum[l] = 0;                                                                              \
		}                                                                                            \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++)                                                          \
				max[l] = x[i * inner + l] > max[l] ? x[i * inner + l] : max[l];                      \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++) {                                                        \
				T e = EXP(x[i * inner + l] - max[l]);                                                \
				y[i * inner + l] = e;                                                                \
				sum[l] += e;                                                                         \
			}                                                                                        \
		for (int l = 0; l < lanes; l++)                                                              \
			sum[l] = kind == SOFTMAX ? 1 / sum[l] : max[l] + LOG(sum[l]);                            \
		for (int64_t i = 0; i < n; i++)                                                              \
			for (int l = 0; l < lanes; l++)                                                          \
				y[i * inner + l] = kind == SOFTMAX ? y[i * inner + l] * sum[l] : x[i * inner + l] - sum[l]; \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, softmax_block_##S, (int kind, const T *x, T *y, int64_t n, int64_t inner, int lanes), (kind, x, y, n, inner, lanes)) \
	TERN_ISA_BODY void softmax_row_##S##_body(int kind, const T *restrict x, T *restrict y, int64_t n)            \
	{                                                                                                \
		T max = x[0], part[LANES], sum = 0;                                                          \
		int64_t i = 0;                                                                               \
		for (int l = 0; l < LANES; l++)                                                              \
			part[l] = x[0];                                                                          \
		for (; i + LANES <= n; i += LANES)                                                           \
			for (int l = 0; l < LANES; l++)                                                          \
				part[l] = SELECT(x[i + l] > part[l], x[i + l], part[l]);                             \
		for (; i < n; i++)                                                                           \
			max = x[i] > max ? x[i] : max;                                                           \
		for (int l = 0; l < LANES; l++) {                                                            \
			max = part[l] > max ? part[l] : max;                                                     \
			part[l] = 0;                                                                             \
		}                                                                                            \
		for (i = 0; i < n; i++)                                                                      \
			y[i] = EXP(x[i] - max);                                                                  \
		i = 0;                                                                                       \
		for (; i + LANES <= n; i += LANES)                                                           \
			for (int l = 0; l < LANES; l++)                                                          \
				part[l] += y[i + l];                                                                 \
		for (; i < n; i++)                                                                           \
			sum += y[i];                                                                             \
		for (int l = 0; l < LANES; l++)                                                              \
			sum += part[l];                                                                          \
		if (kind == SOFTMAX) {                                                                       \
			T inv = 1 / sum;                                                                         \
			for (int64_t k = 0; k < n; k++)                                                          \
				y[k] *= inv;                                                                         \
		} else {                                                                                     \
			T shift = max + LOG(sum);                                                                \
			for (int64_t k = 0; k < n; k++)                                                          \
				y[k] = x[k] - shift;                                                                 \
		}                                                                                            \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, softmax_row_##S, (int kind, const T *restrict x, T *restrict y, int64_t n), (kind, x, y, n)) \
	static void hardmax_column_##S(const T *x, T *y, int64_t n, int64_t stride)                     \
	{                                                                                                \
		int64_t at = 0;                                                                              \
		for (int64_t i = 1; i < n; i++)                                                              \
			if (x[i * stride] > x[at * stride])                                                      \
				at = i;                                                                              \
		for (int64_t i = 0; i < n; i++)                                                              \
			y[i * stride] = i == at;                                                                 \
	}                                                                                                \
	/* Work items: rows when inner is 1; else blocks of LANES columns, or single ones for Hardmax. */ \
	static void softmax_items_##S(void *ctx, int64_t begin, int64_t end)                            \
	{                                                                                                \
		const plain_ctx *c = ctx;                                                                    \
		const axis_params *ap = c->params;                                                           \
		const T *x = c->x;                                                                           \
		T *y = c->y;                                                                                 \
		int64_t per = ap->kind == HARDMAX ? ap->inner : (ap->inner + LANES - 1) / LANES;             \
		for (int64_t it = begin; it < end; it++) {                                                   \
			int64_t col = ap->kind == HARDMAX ? it % per : it % per * LANES;                         \
			int64_t base = it / per * ap->n * ap->inner + col;                                       \
			if (ap->kind == HARDMAX)                                                                 \
				hardmax_column_##S(x + base, y + base, ap->n, ap->inner);                            \
			else if (ap->inner == 1)                                                                 \
				softmax_row_##S(ap->kind, x + base, y + base, ap->n);                                \
			else                                                                                     \
				softmax_block_##S(ap->kind, x + base, y + base, ap->n, ap->inner,                    \
				                  (int)(ap->inner - col < LANES ? ap->inner - col : LANES));         \
		}                                                                                            \
	}

DEF_SOFTMAX(f32, float, tern_fast_expf, logf, tern_select_f32)
DEF_SOFTMAX(f64, double, exp, log, tern_select_f64)

static void softmax_run(tern_threadpool *pool, const axis_params *ap, int dtype, const void *x, void *y)
{
	if (ap->n == 0)
		return;
	plain_ctx c = {ap, x, y};
	int64_t per = ap->kind == HARDMAX || ap->inner == 1 ? ap->inner : (ap->inner + LANES - 1) / LANES;
	int64_t width = ap->kind == HARDMAX || ap->inner == 1 ? 1 : LANES;
	parallel_range(pool, ap->outer * per, grain_for(ap->n * width * 4),
	               dtype == TERN_DOUBLE ? softmax_items_f64 : softmax_items_f32, &c);
}

static tern_status softmax_kernel(const tern_kernel_args *a)
{
	softmax_run(a->pool, a->params, a->in[0]->dtype, a->in[0]->data, a->out[0]->data);
	return TERN_OK;
}

static tern_status softmax_setup(tern_prepare_args *p, int kind)
{
	bool old = p->node->opset < 13;
	axis_params *ap = NULL;
	tern_status st = tern_nn_axis_setup(p, old ? 1 : -1, old, &ap);
	if (st)
		return st;
	ap->kind = kind;
	p->kernel = softmax_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status softmax_prepare(tern_prepare_args *p) { return softmax_setup(p, SOFTMAX); }
static tern_status log_softmax_prepare(tern_prepare_args *p) { return softmax_setup(p, LOG_SOFTMAX); }
static tern_status hardmax_prepare(tern_prepare_args *p) { return softmax_setup(p, HARDMAX); }

/* ---------------------------------------------------------------- NegativeLogLikelihoodLoss and
 * SoftmaxCrossEntropyLoss */

enum { REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN };

typedef struct loss_params {
	axis_params ap; /* classes on axis 1: outer = N, n = C, inner = the positions d1 x d2 ... */
	int reduction;
	bool has_ignore, softmax;
	int64_t ignore;
} loss_params;

/* loss[n, d] = -weight[t] * logp[n, t, d] for t = target[n, d], 0 where t is ignore_index; then
 * summed, or averaged over the weights of the targets counted. */
static tern_status loss_kernel(const tern_kernel_args *a)
{
	const loss_params *lp = a->params;
	const tern_tensor *x = a->in[0], *target = a->in[1], *weight = a->n_in > 2 ? a->in[2] : NULL;
	tern_tensor *y = a->out[0];
	const void *logp = x->data;
	if (lp->softmax) {
		void *dst = a->n_out > 1 && a->out[1] ? a->out[1]->data : a->scratch;
		softmax_run(a->pool, &lp->ap, x->dtype, x->data, dst);
		logp = dst;
	}
	int64_t c_n = lp->ap.n, d_n = lp->ap.inner, count = lp->ap.outer * d_n;
	double total = 0, weights = 0;
	for (int64_t i = 0; i < count; i++) {
		int64_t t = tern_tensor_get_i64(target, i), n = i / d_n, d = i % d_n;
		double l = 0, w = 0;
		if (!lp->has_ignore || t != lp->ignore) {
			if (t < 0 || t >= c_n)
				return tern_node_errorf(a->node, TERN_EDATA, "target %lld at position %lld is outside [0, %lld)",
				                        (long long)t, (long long)i, (long long)c_n);
			int64_t at = (n * c_n + t) * d_n + d;
			w = weight ? tern_tensor_get_f64(weight, t) : 1;
			l = -w * (x->dtype == TERN_DOUBLE ? ((const double *)logp)[at] : ((const float *)logp)[at]);
		}
		if (lp->reduction == REDUCE_NONE)
			tern_store_f64(y->dtype, y->data, i, l);
		total += l;
		weights += w;
	}
	if (lp->reduction != REDUCE_NONE)
		tern_store_f64(y->dtype, y->data, 0, lp->reduction == REDUCE_SUM ? total : total / weights);
	return TERN_OK;
}

/* The losses' checks, parameters (into p->params) and output 0's shape. */
static tern_status loss_plan(tern_prepare_args *p, bool softmax)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *target = p->in[1], *weight = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	if (!st && weight)
		st = check_same(node, x, weight, 2);
	if (st)
		return st;
	char sx[128], st_[128];
	bool fits = target->dtype == TERN_INT32 || target->dtype == TERN_INT64;
	fits &= target->rank == x->rank - 1 && target->dims[0] == x->dims[0];
	for (int i = 1; fits && i < target->rank; i++)
		fits = target->dims[i] == x->dims[i + 1];
	if (!fits)
		return tern_node_errorf(node, TERN_EDATA, "input 1 %s must be int32 or int64 shaped like input 0 %s without axis 1",
		                        tern_shape_str(target->dtype, target->rank, target->dims, st_, sizeof st_),
		                        tern_shape_str(x->dtype, x->rank, x->dims, sx, sizeof sx));
	loss_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	lp->softmax = softmax;
	lp->ap.kind = LOG_SOFTMAX;
	lp->ap.outer = x->dims[0];
	lp->ap.n = x->dims[1];
	lp->ap.inner = prod(x->dims, 2, x->rank);
	if ((st = check_numel(node, weight, 2, "weights", lp->ap.n)))
		return st;
	static const char *const reductions[] = {"none", "sum", "mean"};
	if ((st = parse_enum(node, "reduction", "mean", reductions, 3, &lp->reduction)))
		return st;
	lp->has_ignore = tern_attr(node, "ignore_index") != NULL;
	lp->ignore = tern_attr_int(node, "ignore_index", 0);
	tern_set_shape(p->out[0], x->dtype, lp->reduction == REDUCE_NONE ? target->rank : 0, target->dims);
	return TERN_OK;
}

static tern_status loss_setup(tern_prepare_args *p, bool softmax)
{
	tern_status st = loss_plan(p, softmax);
	if (st)
		return st;
	const tern_tensor *x = p->in[0];
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], x->dtype, x->rank, x->dims);
	else if (softmax)
		p->scratch_bytes = (size_t)tern_tensor_numel(x) * compute_size(x->dtype);
	p->kernel = loss_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status nll_loss_prepare(tern_prepare_args *p) { return loss_setup(p, false); }
static tern_status sce_loss_prepare(tern_prepare_args *p) { return loss_setup(p, true); }

/* ---------------------------------------------------------------- Dropout */

typedef struct dropout_params {
	bool mask_bool;          /* the mask is bool (opset 10 on) rather than the input's type */
	bool maybe_training;     /* a training_mode input decides at run time */
	uint64_t seed;
	_Atomic uint64_t runs;   /* each run draws a fresh mask */
} dropout_params;

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* MT19937 with numpy's legacy seeding and its doubles (numpy.random.RandomState(seed).uniform): the
 * stream ONNX's reference Dropout draws its mask from, so that a seeded Dropout's first run gives
 * the mask onnx's backend tests expect. */
typedef struct mt19937 {
	uint32_t s[624];
	int i;
} mt19937;

static void mt_seed(mt19937 *m, uint32_t seed)
{
	m->s[0] = seed;
	for (int i = 1; i < 624; i++)
		m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
	m->i = 624;
}

static uint32_t mt_next(mt19937 *m)
{
	if (m->i >= 624) {
		for (int k = 0; k < 624; k++) {
			uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
			m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
		}
		m->i = 0;
	}
	uint32_t y = m->s[m->i++];
	y ^= y >> 11;
	y ^= (y << 7) & 0x9d2c5680u;
	y ^= (y << 15) & 0xefc60000u;
	return y ^ (y >> 18);
}

/* [0, 1) with 53 bits, as numpy's random_sample */
static double mt_double(mt19937 *m)
{
	uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
	return ((double)a * 67108864.0 + (double)b) / 9007199254740992.0;
}

static tern_status dropout_kernel(const tern_kernel_args *a)
{
	dropout_params *dp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0], *mask = a->n_out > 1 ? a->out[1] : NULL;
	int64_t n = tern_tensor_numel(x);
	double ratio = a->n_in > 1 && a->in[1] ? tern_tensor_get_f64(a->in[1], 0) : 0.5;
	bool training = dp->maybe_training && a->n_in > 2 && a->in[2] && tern_tensor_get_i64(a->in[2], 0) != 0;
	if (training && (ratio < 0 || ratio >= 1))
		return tern_node_errorf(a->node, TERN_EDATA, "ratio %g is outside [0, 1)", ratio);
	if (!training || ratio == 0) {
		memcpy(y->data, x->data, x->nbytes);
		if (mask && dp->mask_bool)
			memset(mask->data, 1, (size_t)n);
		else if (mask)
			for (int64_t i = 0; i < n; i++)
				tern_store_f64(mask->dtype, mask->data, i, 1.0);
		return TERN_OK;
	}
	/* run 0 draws from the seed itself (numpy's stream, as ONNX's reference); later runs from seeds
	 * mixed with the run's number, so that each draws a fresh mask */
	uint64_t run = atomic_fetch_add(&dp->runs, 1), mix = dp->seed;
	uint32_t seed = run ? (uint32_t)splitmix64((mix ^= run * 0xd1b54a32d192ed03u, &mix)) : (uint32_t)dp->seed;
	mt19937 *mt = a->scratch;
	mt_seed(mt, seed);
	double scale = 1.0 / (1.0 - ratio);
	for (int64_t i = 0; i < n; i++) {
		bool kept = mt_double(mt) >= ratio;
		tern_store_f64(y->dtype, y->data, i, kept ? tern_tensor_get_f64(x, i) * scale : 0.0);
		if (mask && dp->mask_bool)
			((bool *)mask->data)[i] = kept;
		else if (mask)
			tern_store_f64(mask->dtype, mask->data, i, kept);
	}
	return TERN_OK;
}

static tern_status dropout_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (st)
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	bool has_mask = p->n_out > 1 && p->out[1];
	if (has_mask)
		tern_set_shape(p->out[1], node->opset >= 10 ? TERN_BOOL : x->dtype, x->rank, x->dims);
	/* Before opset 12 there is no training input: Dropout is the identity in inference. */
	const tern_tensor *training = node->opset >= 12 && p->n_in > 2 ? p->in[2] : NULL;
	bool maybe_training = training && (!training->data || tern_tensor_get_i64(training, 0) != 0);
	if (!maybe_training && !has_mask) {
		p->alias_input0 = 1;
		return TERN_OK;
	}
	dropout_params *dp = calloc(1, sizeof *dp);
	if (!dp)
		return no_memory(node);
	p->params = dp;
	p->free_params = free;
	dp->mask_bool = node->opset >= 10;
	dp->maybe_training = maybe_training;
	dp->seed = (uint64_t)tern_attr_int(node, "seed", 0x7465726e);
	p->kernel = dropout_kernel;
	p->scratch_bytes = sizeof(mt19937);
	return tern_nn_stage_halves(p);
}

/* ---------------------------------------------------------------- gradients */

/* tern.SoftmaxGrad(dY, Y) -> dX, attributes axis, log and coerce (Softmax before opset 13: the axis
 * and everything after it as one): along the axis, Softmax's dX = Y * (dY - sum(dY * Y)) and, with
 * log, LogSoftmax's dX = dY - exp(Y) * sum(dY). Rows, or blocks of columns, as the forward goes. */
#define DEF_SOFTMAX_GRAD(S, T, EXP)                                                                           \
	TERN_ISA_BODY void softmax_grad_block_##S##_body(int kind, const T *dy, const T *y, T *dx, int64_t n,        \
	                                               int64_t inner, int lanes)                                 \
	{                                                                                                         \
		T sum[LANES];                                                                                         \
		for (int l = 0; l < lanes; l++)                                                                       \
			sum[l] = 0;                                                                                       \
		for (int64_t i = 0; i < n; i++)                                                                       \
			for (int l = 0; l < lanes; l++)                                                                   \
				sum[l] += kind == SOFTMAX ? dy[i * inner + l] * y[i * inner + l] : dy[i * inner + l];        \
		for (int64_t i = 0; i < n; i++)                                                                       \
			for (int l = 0; l < lanes; l++) {                                                                 \
				int64_t at = i * inner + l;                                                                   \
				dx[at] = kind == SOFTMAX ? y[at] * (dy[at] - sum[l]) : dy[at] - EXP(y[at]) * sum[l];          \
			}                                                                                                 \
	}                                                                                                         \
	TERN_ISA_VARIANTS3(void, softmax_grad_block_##S,                                                          \
	                   (int kind, const T *dy, const T *y, T *dx, int64_t n, int64_t inner, int lanes),       \
	                   (kind, dy, y, dx, n, inner, lanes))                                                    \
	TERN_ISA_BODY void softmax_grad_row_##S##_body(int kind, const T *restrict dy, const T *restrict y,          \
	                                             T *restrict dx, int64_t n)                                  \
	{                                                                                                         \
		T part[LANES] = {0}, sum = 0;                                                                         \
		int64_t i = 0;                                                                                        \
		if (kind == SOFTMAX)                                                                                  \
			for (; i + LANES <= n; i += LANES)                                                                \
				for (int l = 0; l < LANES; l++)                                                               \
					part[l] += dy[i + l] * y[i + l];                                                          \
		else                                                                                                  \
			for (; i + LANES <= n; i += LANES)                                                                \
				for (int l = 0; l < LANES; l++)                                                               \
					part[l] += dy[i + l];                                                                     \
		for (; i < n; i++)                                                                                    \
			sum += kind == SOFTMAX ? dy[i] * y[i] : dy[i];                                                    \
		for (int l = 0; l < LANES; l++)                                                                       \
			sum += part[l];                                                                                   \
		if (kind == SOFTMAX)                                                                                  \
			for (int64_t k = 0; k < n; k++)                                                                   \
				dx[k] = y[k] * (dy[k] - sum);                                                                 \
		else                                                                                                  \
			for (int64_t k = 0; k < n; k++)                                                                   \
				dx[k] = dy[k] - EXP(y[k]) * sum;                                                              \
	}                                                                                                         \
	TERN_ISA_VARIANTS3(void, softmax_grad_row_##S,                                                            \
	                   (int kind, const T *restrict dy, const T *restrict y, T *restrict dx, int64_t n),      \
	                   (kind, dy, y, dx, n))                                                                  \
	static void softmax_grad_items_##S(void *ctx, int64_t begin, int64_t end)                                 \
	{                                                                                                         \
		const softmax_grad_ctx *c = ctx;                                                                      \
		const axis_params *ap = c->ap;                                                                        \
		int64_t per = (ap->inner + LANES - 1) / LANES;                                                        \
		for (int64_t it = begin; it < end; it++) {                                                            \
			if (ap->inner == 1) {                                                                             \
				int64_t base = it * ap->n;                                                                    \
				softmax_grad_row_##S(ap->kind, (const T *)c->dy + base, (const T *)c->y + base,              \
				                     (T *)c->dx + base, ap->n);                                               \
				continue;                                                                                     \
			}                                                                                                 \
			int64_t col = it % per * LANES, base = it / per * ap->n * ap->inner + col;                       \
			softmax_grad_block_##S(ap->kind, (const T *)c->dy + base, (const T *)c->y + base, (T *)c->dx + base, \
			                       ap->n, ap->inner, (int)(ap->inner - col < LANES ? ap->inner - col : LANES));   \
		}                                                                                                     \
	}

typedef struct softmax_grad_ctx {
	const axis_params *ap;
	const void *dy, *y;
	void *dx;
} softmax_grad_ctx;

DEF_SOFTMAX_GRAD(f32, float, tern_fast_expf)
DEF_SOFTMAX_GRAD(f64, double, exp)

static tern_status softmax_grad_kernel(const tern_kernel_args *a)
{
	const axis_params *ap = a->params;
	if (ap->n == 0)
		return TERN_OK;
	softmax_grad_ctx c = {ap, a->in[0]->data, a->in[1]->data, a->out[0]->data};
	int64_t per = ap->inner == 1 ? 1 : (ap->inner + LANES - 1) / LANES, width = ap->inner == 1 ? 1 : LANES;
	parallel_range(a->pool, ap->outer * per, grain_for(ap->n * width * 3),
	               a->in[0]->dtype == TERN_DOUBLE ? softmax_grad_items_f64 : softmax_grad_items_f32, &c);
	return TERN_OK;
}

static tern_status softmax_grad_prepare(tern_prepare_args *p)
{
	axis_params *ap = NULL;
	tern_status st = check_real_same(p, 2);
	if (st || (st = tern_nn_axis_setup(p, -1, tern_attr_int(p->node, "coerce", 0) != 0, &ap)))
		return st;
	const tern_tensor *dy = p->in[0], *y = p->in[1];
	bool same = dy->rank == y->rank;
	for (int d = 0; same && d < y->rank; d++)
		same = dy->dims[d] == y->dims[d];
	if (!same)
		return tern_node_errorf(p->node, TERN_EDATA, "inputs 0 (dY) and 1 (Y) differ in shape");
	ap->kind = tern_attr_int(p->node, "log", 0) ? LOG_SOFTMAX : SOFTMAX;
	p->kernel = softmax_grad_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status softmax_grad_rule(tern_grad_ctx *g, bool log)
{
	if (!g->wants[0])
		return TERN_OK;
	bool old = g->node->opset < 13;
	tern_gattr at[3] = {TERN_GA_I("axis", tern_attr_int(g->node, "axis", old ? 1 : -1)), TERN_GA_I("log", log),
	                    TERN_GA_I("coerce", old)};
	tern_gval *in[2] = {g->dy[0], g->y[0]};
	g->dx[0] = tern_g_op(g, "tern", "SoftmaxGrad", in, 2, at, 3);
	return tern_nn_g_done(g, 0);
}

/* Softmax and LogSoftmax: tern.SoftmaxGrad on the output. */
static tern_status softmax_grad(tern_grad_ctx *g) { return softmax_grad_rule(g, false); }
static tern_status log_softmax_grad(tern_grad_ctx *g) { return softmax_grad_rule(g, true); }

/* Hardmax is piecewise constant: its derivative is zero almost everywhere (and undefined where the
 * maximum changes hands), so the rule gives zeros of X's shape, as Sign and Floor do. Expand arrives in
 * opset 8; before, 0 dY (dY has X's shape), which lets a NaN or an infinity of dY through. */
static tern_status hardmax_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *zero = tern_g_scalar(g, 0.0, g->x[0]);
	if (g->node->opset < 8) {
		g->dx[0] = tern_g_mul(g, g->dy[0], zero);
	} else {
		tern_gval *in[2] = {zero, tern_g_shape(g, g->x[0])};
		g->dx[0] = in[0] && in[1] ? tern_g_op(g, "", "Expand", in, 2, NULL, 0) : NULL;
	}
	return tern_nn_g_done(g, 0);
}

/* tern.SoftmaxCrossEntropyLossGrad(dLoss, scores, labels[, weights[, dLogProb]]) -> dScores and
 * tern.NegativeLogLikelihoodLossGrad(dLoss, input, target[, weights]) -> dInput, attributes reduction
 * and ignore_index as the losses': with g the loss gradient per position (dLoss; with sum its one
 * value; with mean that over the weights counted) and c = weight[t] * g (0 where t is ignored),
 * NLL's gradient is -c at the target's class, 0 elsewhere, and the cross entropy's
 * c * (softmax - onehot(t)), plus, from the log_prob output, dLogProb - softmax * sum(dLogProb) along
 * the classes. */
typedef struct loss_grad_ctx {
	const loss_params *lp;
	int dtype;
	const tern_tensor *dloss, *target, *weight;
	const void *dlogp;
	void *dx; /* the cross entropy's: holds the probabilities when called */
	double scale; /* sum: dLoss; mean: dLoss / the weights counted; none: 0 (per position) */
} loss_grad_ctx;

#define DEF_LOSS_GRAD(S, T)                                                                           \
	static void loss_grad_positions_##S(void *ctx, int64_t begin, int64_t end)                        \
	{                                                                                                 \
		const loss_grad_ctx *c = ctx;                                                                 \
		const loss_params *lp = c->lp;                                                                \
		int64_t c_n = lp->ap.n, d_n = lp->ap.inner;                                                   \
		const T *dlp = c->dlogp;                                                                      \
		T *dx = c->dx;                                                                                \
		for (int64_t i = begin; i < end; i++) {                                                       \
			int64_t t = tern_tensor_get_i64(c->target, i), base = i / d_n * c_n * d_n + i % d_n;      \
			bool counted = !lp->has_ignore || t != lp->ignore;                                        \
			double coef = 0;                                                                          \
			if (counted) {                                                                            \
				double w = c->weight ? tern_tensor_get_f64(c->weight, t) : 1;                         \
				coef = w * (lp->reduction == REDUCE_NONE ? tern_tensor_get_f64(c->dloss, i) : c->scale); \
			}                                                                                         \
			T tc = (T)coef;                                                                           \
			if (!lp->softmax) {                                                                       \
				for (int64_t k = 0; k < c_n; k++)                                                     \
					dx[base + k * d_n] = 0;                                                           \
			} else if (dlp) {                                                                         \
				T sum = 0;                                                                            \
				for (int64_t k = 0; k < c_n; k++)                                                     \
					sum += dlp[base + k * d_n];                                                       \
				for (int64_t k = 0; k < c_n; k++) {                                                   \
					T pk = dx[base + k * d_n];                                                        \
					dx[base + k * d_n] = tc * pk + dlp[base + k * d_n] - pk * sum;                    \
				}                                                                                     \
			} else if (d_n == 1) {                                                                    \
				T *restrict row = dx + base;                                                          \
				for (int64_t k = 0; k < c_n; k++)                                                     \
					row[k] *= tc;                                                                     \
			} else {                                                                                  \
				for (int64_t k = 0; k < c_n; k++)                                                     \
					dx[base + k * d_n] *= tc;                                                         \
			}                                                                                         \
			if (counted)                                                                              \
				dx[base + t * d_n] -= tc;                                                             \
		}                                                                                             \
	}

DEF_LOSS_GRAD(f32, float)
DEF_LOSS_GRAD(f64, double)

static tern_status loss_grad_kernel(const tern_kernel_args *a)
{
	const loss_params *lp = a->params;
	const tern_tensor *dloss = a->in[0], *x = a->in[1], *target = a->in[2];
	const tern_tensor *weight = a->n_in > 3 ? a->in[3] : NULL, *dlogp = a->n_in > 4 ? a->in[4] : NULL;
	int64_t c_n = lp->ap.n, count = lp->ap.outer * lp->ap.inner;
	double weights = 0;
	for (int64_t i = 0; i < count; i++) {
		int64_t t = tern_tensor_get_i64(target, i);
		if (lp->has_ignore && t == lp->ignore)
			continue;
		if (t < 0 || t >= c_n)
			return tern_node_errorf(a->node, TERN_EDATA, "target %lld at position %lld is outside [0, %lld)",
			                        (long long)t, (long long)i, (long long)c_n);
		weights += weight ? tern_tensor_get_f64(weight, t) : 1;
	}
	double scale = 0;
	if (lp->reduction == REDUCE_SUM)
		scale = tern_tensor_get_f64(dloss, 0);
	else if (lp->reduction == REDUCE_MEAN)
		scale = weights != 0 ? tern_tensor_get_f64(dloss, 0) / weights : 0;
	if (lp->softmax) { /* dX holds the probabilities first */
		axis_params ap = lp->ap;
		ap.kind = SOFTMAX;
		softmax_run(a->pool, &ap, x->dtype, x->data, a->out[0]->data);
	}
	loss_grad_ctx c = {lp, x->dtype, dloss, target, weight, dlogp ? dlogp->data : NULL, a->out[0]->data, scale};
	parallel_range(a->pool, count, grain_for(c_n * 2), x->dtype == TERN_DOUBLE ? loss_grad_positions_f64 : loss_grad_positions_f32,
	               &c);
	return TERN_OK;
}

static tern_status loss_grad_setup(tern_prepare_args *p, bool softmax)
{
	const tern_node *node = p->node;
	if (p->n_in < 3 || !p->in[1] || !p->in[2])
		return tern_node_errorf(node, TERN_EDATA, "inputs 1 and 2 are required");
	/* the forward's checks and shapes, with its inputs (1, 2, 3) in places 0, 1, 2 */
	tern_tensor *fin[3] = {p->in[1], p->in[2], p->n_in > 3 ? p->in[3] : NULL};
	tern_tensor loss;
	memset(&loss, 0, sizeof loss);
	tern_tensor *fout[1] = {&loss};
	tern_prepare_args f = *p;
	f.in = fin;
	f.n_in = p->n_in > 3 ? 3 : 2;
	f.out = fout;
	f.n_out = 1;
	tern_status st = loss_plan(&f, softmax);
	p->params = f.params;
	p->free_params = f.free_params;
	if (st)
		return st;
	const tern_tensor *x = p->in[1], *dloss = p->in[0], *dlogp = p->n_in > 4 ? p->in[4] : NULL;
	if ((st = check_same(node, x, dloss, 0)) || (dlogp && (st = check_same(node, x, dlogp, 4))))
		return st;
	bool fits = dloss->rank == loss.rank;
	for (int d = 0; fits && d < loss.rank; d++)
		fits = dloss->dims[d] == loss.dims[d];
	for (int d = 0; dlogp && d < x->rank; d++)
		fits &= dlogp->rank == x->rank && dlogp->dims[d] == x->dims[d];
	if (!fits || (dlogp && !softmax))
		return tern_node_errorf(node, TERN_EDATA, "the gradients' shapes do not match the loss and its input");
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->kernel = loss_grad_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status nll_loss_grad_prepare(tern_prepare_args *p) { return loss_grad_setup(p, false); }
static tern_status sce_loss_grad_prepare(tern_prepare_args *p) { return loss_grad_setup(p, true); }

/* The losses: the gradient of their input (the weights and the targets carry none). */
static tern_status loss_grad_rule(tern_grad_ctx *g, bool softmax)
{
	tern_gval *dlogp = softmax && g->n_out > 1 ? g->dy[1] : NULL;
	if (!g->wants[0])
		return tern_nn_g_done(g, ~0u);
	tern_gval *dloss = g->dy[0];
	if (!dloss) /* only log_prob's gradient flows: a zero loss gradient */
		dloss = tern_g_mul(g, tern_g_scalar(g, 0.0, g->y[0]), g->y[0]);
	tern_gattr at[2] = {TERN_GA_S("reduction", tern_attr_string(g->node, "reduction", "mean")),
	                    TERN_GA_I("ignore_index", tern_attr_int(g->node, "ignore_index", 0))};
	bool weights = g->n_in > 2 && g->x[2];
	tern_gval *in[5] = {dloss, g->x[0], g->x[1], weights ? g->x[2] : NULL, dlogp};
	int n = dlogp ? 5 : weights ? 4 : 3;
	g->dx[0] = dloss ? tern_g_op(g, "tern", softmax ? "SoftmaxCrossEntropyLossGrad" : "NegativeLogLikelihoodLossGrad",
	                             in, n, at, tern_attr(g->node, "ignore_index") ? 2 : 1)
	                 : NULL;
	return tern_nn_g_done(g, ~1u);
}

static tern_status nll_loss_grad(tern_grad_ctx *g) { return loss_grad_rule(g, false); }
static tern_status sce_loss_grad(tern_grad_ctx *g) { return loss_grad_rule(g, true); }

/* tern.DropoutGrad(dY, mask[, ratio[, training_mode]]) -> dX: in training, dY * mask / (1 - ratio)
 * (ratio 0.5 when omitted), else dY, as the forward did. */
static tern_status dropout_grad_kernel(const tern_kernel_args *a)
{
	const tern_tensor *dy = a->in[0], *mask = a->in[1];
	tern_tensor *dx = a->out[0];
	int64_t n = tern_tensor_numel(dy);
	double ratio = a->n_in > 2 && a->in[2] ? tern_tensor_get_f64(a->in[2], 0) : 0.5;
	bool training = a->n_in > 3 && a->in[3] && tern_tensor_get_i64(a->in[3], 0) != 0;
	if (!training || ratio == 0) {
		memcpy(dx->data, dy->data, dy->nbytes);
		return TERN_OK;
	}
	double scale = 1.0 / (1.0 - ratio);
	for (int64_t i = 0; i < n; i++) {
		bool kept = mask->dtype == TERN_BOOL ? ((const bool *)mask->data)[i] : tern_tensor_get_f64(mask, i) != 0;
		tern_store_f64(dx->dtype, dx->data, i, kept ? tern_tensor_get_f64(dy, i) * scale : 0.0);
	}
	return TERN_OK;
}

static tern_status dropout_grad_prepare(tern_prepare_args *p)
{
	const tern_tensor *dy = p->in[0], *mask = p->n_in > 1 ? p->in[1] : NULL;
	tern_status st = check_real(p->node, dy, 0);
	if (st)
		return st;
	if (!mask || tern_tensor_numel(mask) != tern_tensor_numel(dy))
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 (the mask) must have dY's shape");
	tern_set_shape(p->out[0], dy->dtype, dy->rank, dy->dims);
	p->kernel = dropout_grad_kernel;
	return TERN_OK;
}

/* Dropout: the identity where it cannot be training (before opset 12, or without training_mode);
 * else tern.DropoutGrad with its mask output, or, without one, a Dropout of dY with the forward's
 * attributes: it draws the same mask, each run, as the forward node (the same seed and run count). */
static tern_status dropout_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return tern_nn_g_done(g, ~0u);
	bool maybe_training = g->node->opset >= 12 && g->n_in > 2 && g->x[2];
	tern_gval *ratio = g->n_in > 1 ? g->x[1] : NULL;
	if (!maybe_training) {
		g->dx[0] = g->dy[0];
	} else if (g->n_out > 1 && g->y[1]) {
		tern_gval *in[4] = {g->dy[0], g->y[1], ratio, g->x[2]};
		g->dx[0] = tern_g_op(g, "tern", "DropoutGrad", in, 4, NULL, 0);
	} else {
		tern_gval *in[3] = {g->dy[0], ratio, g->x[2]};
		g->dx[0] = tern_g_op_like(g, "", "Dropout", in, 3, NULL, 0);
	}
	return tern_nn_g_done(g, ~1u);
}

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
	{"", "Softmax", 1, 0, softmax_prepare, TERN_DT_FLOATS, "softmax", softmax_grad},
	{"", "LogSoftmax", 1, 0, log_softmax_prepare, TERN_DT_FLOATS, "softmax", log_softmax_grad},
	{"", "Hardmax", 1, 0, hardmax_prepare, TERN_DT_FLOATS, "softmax", hardmax_grad},
	{"", "Dropout", 1, 0, dropout_prepare, TERN_DT_FLOATS, "softmax", dropout_grad},
	{"", "NegativeLogLikelihoodLoss", 12, 0, nll_loss_prepare, TERN_DT_FLOATS, "softmax", nll_loss_grad},
	{"", "SoftmaxCrossEntropyLoss", 12, 0, sce_loss_prepare, TERN_DT_FLOATS, "softmax", sce_loss_grad},
	{"tern", "SoftmaxGrad", 1, 0, softmax_grad_prepare, TERN_DT_FLOATS, "softmax"},
	{"tern", "SoftmaxCrossEntropyLossGrad", 1, 0, sce_loss_grad_prepare, TERN_DT_FLOATS, "softmax"},
	{"tern", "NegativeLogLikelihoodLossGrad", 1, 0, nll_loss_grad_prepare, TERN_DT_FLOATS, "softmax"},
	{"tern", "DropoutGrad", 1, 0, dropout_grad_prepare, TERN_DT_FLOATS, "softmax"},
};

const tern_op_table tern_ops_softmax = {ops, TERN_ARRAY_LEN(ops)};
