/* norm.c — normalisations: BatchNormalization (inference and training), InstanceNormalization,
 * GroupNormalization, LayerNormalization, LRN, LpNormalization and MeanVarianceNormalization.
 * Statistics are accumulated in double; the loops run over (batch, channel) planes, groups, rows or
 * columns in parallel. Kernels exist for float and double; float16 and bfloat16 are computed in float. */
#include "ops/nn.h"

/* ---------------------------------------------------------------- batch normalisation */

typedef struct bn_params {
	int64_t n, c, sp; /* channels are scale's elements; sp elements of one channel per sample */
	double eps, momentum;
	bool training;
} bn_params;

typedef struct bn_ctx {
	const bn_params *bp;
	const void *x;
	void *y;
	double *mean, *var, *a, *b; /* per channel, in scratch */
} bn_ctx;

#define DEF_BN(S, T)                                                                                 \
	TERN_ISA_BODY void bn_stats_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                \
		const bn_ctx *c = ctx;                                                                       \
		const bn_params *bp = c->bp;                                                                 \
		double count = (double)(bp->n * bp->sp);                                                     \
		for (int64_t ch = begin; ch < end; ch++) {                                                   \
			double sum = 0, sq = 0;                                                                  \
			for (int64_t n = 0; n < bp->n; n++) {                                                    \
				const T *x = (const T *)c->x + (n * bp->c + ch) * bp->sp;                            \
				for (int64_t i = 0; i < bp->sp; i++)                                                 \
					sum += x[i];                                                                     \
			}                                                                                        \
			double mean = sum / count;                                                               \
			for (int64_t n = 0; n < bp->n; n++) {                                                    \
				const T *x = (const T *)c->x + (n * bp->c + ch) * bp->sp;                            \
				for (int64_t i = 0; i < bp->sp; i++)                                                 \
					sq += (x[i] - mean) * (x[i] - mean);                                             \
			}                                                                                        \
			c->mean[ch] = mean;                                                                      \
			c->var[ch] = sq / count;                                                                 \
		}                                                                                            \
	}                                                                                                \
	TERN_ISA_VARIANTS3(void, bn_stats_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end)) \
	TERN_ISA_BODY void bn_apply_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                \
		const bn_ctx *c = ctx;                                                                       \
		const bn_params *bp = c->bp;                                                                 \
		for (int64_t plane = begin; plane < end; plane++) {                                          \
			int64_t ch = plane % bp->c;                                                              \
			T a = (T)c->a[ch], b = (T)c->b[ch];                                                      \
			const T *restrict x = (const T *)c->x + plane * bp->sp;                                  \
			T *restrict y = (T *)c->y + plane * bp->sp;                                             \
			for (int64_t i = 0; i < bp->sp; i++)                                                     \
				y[i] = x[i] * a + b;                                                                 \
		}                                                                                            \
	} \
	TERN_ISA_VARIANTS3(void, bn_apply_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_BN(f32, float)
DEF_BN(f64, double)

static tern_status bn_kernel(const tern_kernel_args *a)
{
	const bn_params *bp = a->params;
	const tern_tensor *scale = a->in[1], *bias = a->in[2], *mean_in = a->in[3], *var_in = a->in[4];
	bool dbl = a->in[0]->dtype == TERN_DOUBLE;
	double *s = a->scratch;
	bn_ctx c = {bp, a->in[0]->data, a->out[0]->data, s, s + bp->c, s + 2 * bp->c, s + 3 * bp->c};
	if (bp->training)
		parallel_range(a->pool, bp->c, grain_for(bp->n * bp->sp), dbl ? bn_stats_f64 : bn_stats_f32, &c);
	for (int64_t ch = 0; ch < bp->c; ch++) {
		double mean = bp->training ? c.mean[ch] : tern_tensor_get_f64(mean_in, ch);
		double var = bp->training ? c.var[ch] : tern_tensor_get_f64(var_in, ch);
		c.a[ch] = tern_tensor_get_f64(scale, ch) / sqrt(var + bp->eps);
		c.b[ch] = tern_tensor_get_f64(bias, ch) - mean * c.a[ch];
	}
	parallel_range(a->pool, bp->n * bp->c, grain_for(bp->sp), dbl ? bn_apply_f64 : bn_apply_f32, &c);
	if (!bp->training)
		return TERN_OK;
	/* running statistics, then (before opset 14) the batch's own */
	for (int64_t ch = 0; ch < bp->c; ch++) {
		double m = bp->momentum;
		if (a->n_out > 1 && a->out[1])
			tern_store_f64(a->out[1]->dtype, a->out[1]->data, ch, tern_tensor_get_f64(mean_in, ch) * m + c.mean[ch] * (1 - m));
		if (a->n_out > 2 && a->out[2])
			tern_store_f64(a->out[2]->dtype, a->out[2]->data, ch, tern_tensor_get_f64(var_in, ch) * m + c.var[ch] * (1 - m));
		if (a->n_out > 3 && a->out[3])
			tern_store_f64(a->out[3]->dtype, a->out[3]->data, ch, c.mean[ch]);
		if (a->n_out > 4 && a->out[4])
			tern_store_f64(a->out[4]->dtype, a->out[4]->data, ch, c.var[ch]);
	}
	return TERN_OK;
}

static tern_status bn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	for (int i = 1; i < 5 && !st; i++)
		if (p->n_in <= i || !p->in[i])
			st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
		else
			st = check_real(node, p->in[i], i);
	if (st)
		return st;
	bn_params *bp = calloc(1, sizeof *bp);
	if (!bp)
		return no_memory(node);
	p->params = bp;
	p->free_params = free;
	/* Before opset 9, spatial = 0 normalised every (channel, position) feature separately. */
	bool spatial = node->opset >= 9 || tern_attr_int(node, "spatial", 1) != 0;
	bp->n = x->dims[0];
	bp->c = spatial ? x->dims[1] : prod(x->dims, 1, x->rank);
	bp->sp = prod(x->dims, 1, x->rank) / (bp->c ? bp->c : 1);
	bp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	bp->momentum = tern_attr_float(node, "momentum", 0.9f);
	if (node->opset >= 14)
		bp->training = tern_attr_int(node, "training_mode", 0) != 0;
	else
		for (int i = 1; i < p->n_out; i++)
			bp->training |= p->out[i] != NULL;
	static const char *const names[] = {"", "scale", "B", "mean", "var"};
	for (int i = 1; i < 5; i++)
		if ((st = check_numel(node, p->in[i], i, names[i], bp->c)))
			return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	for (int i = 1; i < p->n_out; i++)
		if (p->out[i]) {
			if (!bp->training)
				return tern_node_errorf(node, TERN_EDATA, "output %d exists only in training mode", i);
			tern_set_shape(p->out[i], p->in[i % 2 ? 3 : 4]->dtype, 1, &bp->c);
		}
	p->scratch_bytes = (size_t)bp->c * 4 * sizeof(double);
	p->kernel = bn_kernel;
	return tern_nn_stage_halves(p);
}

/* ---------------------------------------------------------------- instance, group and layer normalisation */

typedef struct group_norm_params {
	int64_t n, c, groups, sp;
	double eps;
	bool scale_per_group; /* GroupNormalization-18: one scale and bias per group */
} group_norm_params;

typedef struct group_norm_ctx {
	const group_norm_params *gp;
	const void *x;
	void *y;
	const double *scale, *bias; /* per channel */
} group_norm_ctx;

/* Mean and 1/sqrt(variance + eps) of n elements, accumulated in double. */
#define DEF_MOMENTS(S, T)                                                                        \
	static void moments_##S(const T *x, int64_t n, double eps, double *mean, double *inv)        \
	{                                                                                            \
		double part[8] = {0}, sq = 0;                                                            \
		double m = n ? sum_##S(x, n) / (double)n : 0;                                            \
		int64_t i = 0;                                                                           \
		for (; i + 8 <= n; i += 8)                                                               \
			for (int l = 0; l < 8; l++)                                                          \
				part[l] += (x[i + l] - m) * (x[i + l] - m);                                      \
		for (; i < n; i++)                                                                       \
			sq += (x[i] - m) * (x[i] - m);                                                       \
		for (int l = 0; l < 8; l++)                                                              \
			sq += part[l];                                                                       \
		*mean = m;                                                                               \
		*inv = 1.0 / sqrt((n ? sq / (double)n : 0) + eps);                                       \
	}

DEF_MOMENTS(f32, float)
DEF_MOMENTS(f64, double)

#define DEF_GROUP_NORM(S, T)                                                                     \
	TERN_ISA_BODY void group_norm_blocks_##S##_body(void *ctx, int64_t begin, int64_t end)                     \
	{                                                                                            \
		const group_norm_ctx *c = ctx;                                                           \
		const group_norm_params *gp = c->gp;                                                     \
		int64_t per = gp->c / gp->groups;                                                        \
		for (int64_t blk = begin; blk < end; blk++) {                                            \
			const T *x = (const T *)c->x + blk * per * gp->sp;                                   \
			T *y = (T *)c->y + blk * per * gp->sp;                                               \
			double mean, inv;                                                                    \
			moments_##S(x, per * gp->sp, gp->eps, &mean, &inv);                               \
			int64_t c0 = (blk % gp->groups) * per;                                               \
			for (int64_t ch = 0; ch < per; ch++) {                                               \
				T a = (T)(c->scale[c0 + ch] * inv), b = (T)(c->bias[c0 + ch] - mean * c->scale[c0 + ch] * inv); \
				const T *restrict xc = x + ch * gp->sp;                                          \
				T *restrict yc = y + ch * gp->sp;                                                \
				for (int64_t i = 0; i < gp->sp; i++)                                             \
					yc[i] = xc[i] * a + b;                                                       \
			}                                                                                    \
		}                                                                                        \
	} \
	TERN_ISA_VARIANTS3(void, group_norm_blocks_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_GROUP_NORM(f32, float)
DEF_GROUP_NORM(f64, double)

static tern_status group_norm_kernel(const tern_kernel_args *a)
{
	const group_norm_params *gp = a->params;
	double *scale = a->scratch, *bias = scale + gp->c;
	int64_t per = gp->c / gp->groups;
	for (int64_t ch = 0; ch < gp->c; ch++) {
		int64_t i = gp->scale_per_group ? ch / per : ch;
		scale[ch] = tern_tensor_get_f64(a->in[1], i);
		bias[ch] = tern_tensor_get_f64(a->in[2], i);
	}
	group_norm_ctx c = {gp, a->in[0]->data, a->out[0]->data, scale, bias};
	parallel_range(a->pool, gp->n * gp->groups, grain_for(per * gp->sp),
	               a->in[0]->dtype == TERN_DOUBLE ? group_norm_blocks_f64 : group_norm_blocks_f32, &c);
	return TERN_OK;
}

static tern_status group_norm_setup(tern_prepare_args *p, bool instance)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	for (int i = 1; i < 3 && !st; i++)
		st = p->n_in > i && p->in[i] ? check_real(node, p->in[i], i)
		                             : tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
	if (st)
		return st;
	group_norm_params *gp = calloc(1, sizeof *gp);
	if (!gp)
		return no_memory(node);
	p->params = gp;
	p->free_params = free;
	gp->n = x->dims[0];
	gp->c = x->dims[1];
	gp->sp = prod(x->dims, 2, x->rank);
	gp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	gp->groups = instance ? gp->c : tern_attr_int(node, "num_groups", 0);
	if (gp->groups < 1 || gp->c % gp->groups)
		return tern_node_errorf(node, TERN_EDATA, "num_groups = %lld does not divide %lld channels",
		                        (long long)gp->groups, (long long)gp->c);
	int64_t ns = tern_tensor_numel(p->in[1]);
	gp->scale_per_group = !instance && ns == gp->groups && node->opset < 21;
	int64_t want = gp->scale_per_group ? gp->groups : gp->c;
	if ((st = check_numel(node, p->in[1], 1, "scale", want)) || (st = check_numel(node, p->in[2], 2, "bias", want)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->scratch_bytes = (size_t)gp->c * 2 * sizeof(double);
	p->kernel = group_norm_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status instance_norm_prepare(tern_prepare_args *p) { return group_norm_setup(p, true); }
static tern_status group_norm_prepare(tern_prepare_args *p) { return group_norm_setup(p, false); }

typedef struct layer_norm_params {
	int64_t rows, cols;
	double eps;
	bool scale_scalar, bias_scalar;
} layer_norm_params;

typedef struct layer_norm_ctx {
	const layer_norm_params *lp;
	const void *x, *scale, *bias;
	void *y, *mean, *inv;
} layer_norm_ctx;

#define DEF_LAYER_NORM(S, T)                                                                   \
	TERN_ISA_BODY void layer_norm_rows_##S##_body(void *ctx, int64_t begin, int64_t end)                     \
	{                                                                                          \
		const layer_norm_ctx *c = ctx;                                                         \
		const layer_norm_params *lp = c->lp;                                                   \
		const T *scale = c->scale, *bias = c->bias;                                            \
		for (int64_t r = begin; r < end; r++) {                                                \
			const T *restrict x = (const T *)c->x + r * lp->cols;                              \
			T *restrict y = (T *)c->y + r * lp->cols;                                          \
			double mean, inv;                                                                  \
			moments_##S(x, lp->cols, lp->eps, &mean, &inv);                                 \
			T m = (T)mean, iv = (T)inv;                                                        \
			if (!lp->scale_scalar && bias && !lp->bias_scalar)                                 \
				for (int64_t i = 0; i < lp->cols; i++)                                         \
					y[i] = (x[i] - m) * iv * scale[i] + bias[i];                               \
			else                                                                               \
				for (int64_t i = 0; i < lp->cols; i++) {                                       \
					T v = (x[i] - m) * iv * scale[lp->scale_scalar ? 0 : i];                   \
					y[i] = bias ? v + bias[lp->bias_scalar ? 0 : i] : v;                       \
				}                                                                              \
			if (c->mean)                                                                       \
				((T *)c->mean)[r] = m;                                                         \
			if (c->inv)                                                                        \
				((T *)c->inv)[r] = iv;                                                         \
		}                                                                                      \
	} \
	TERN_ISA_VARIANTS3(void, layer_norm_rows_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LAYER_NORM(f32, float)
DEF_LAYER_NORM(f64, double)

static tern_status layer_norm_kernel(const tern_kernel_args *a)
{
	const layer_norm_params *lp = a->params;
	layer_norm_ctx c = {lp,
	                    a->in[0]->data,
	                    a->in[1]->data,
	                    a->n_in > 2 && a->in[2] ? a->in[2]->data : NULL,
	                    a->out[0]->data,
	                    a->n_out > 1 && a->out[1] ? a->out[1]->data : NULL,
	                    a->n_out > 2 && a->out[2] ? a->out[2]->data : NULL};
	parallel_range(a->pool, lp->rows, grain_for(lp->cols),
	               a->in[0]->dtype == TERN_DOUBLE ? layer_norm_rows_f64 : layer_norm_rows_f32, &c);
	return TERN_OK;
}

/* Rows and columns around axis, epsilon, and Scale and B, which broadcast to the normalised shape (a
 * full copy or one value are supported): for LayerNormalization and its gradient alike. */
static tern_status layer_norm_geometry(const tern_node *node, const tern_tensor *x, const tern_tensor *scale,
                                       const tern_tensor *bias, int axis, layer_norm_params *lp)
{
	lp->rows = prod(x->dims, 0, axis);
	lp->cols = prod(x->dims, axis, x->rank);
	lp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	int64_t ns = tern_tensor_numel(scale), nb = bias ? tern_tensor_numel(bias) : 1;
	lp->scale_scalar = ns == 1;
	lp->bias_scalar = nb == 1;
	if ((ns != 1 && ns != lp->cols) || (nb != 1 && nb != lp->cols))
		return tern_node_errorf(node, TERN_EDATA,
		                        "Scale has %lld and B %lld elements; 1 or %lld (the normalised size) expected",
		                        (long long)ns, (long long)nb, (long long)lp->cols);
	return TERN_OK;
}

static tern_status layer_norm_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *scale = p->in[1], *bias = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_real_same(p, 3);
	int axis = 0;
	if (st || (st = axis_in(node, tern_attr_int(node, "axis", -1), x->rank, &axis)))
		return st;
	layer_norm_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	if ((st = layer_norm_geometry(node, x, scale, bias, axis, lp)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	int64_t dims[TERN_MAX_RANK];
	for (int i = 0; i < x->rank; i++)
		dims[i] = i < axis ? x->dims[i] : 1;
	/* Mean and InvStdDev are float for float16 and bfloat16 inputs (stash_type 1). */
	int stat_type = is_half(x->dtype) ? TERN_FLOAT : x->dtype;
	for (int i = 1; i < 3; i++)
		if (p->n_out > i && p->out[i])
			tern_set_shape(p->out[i], stat_type, x->rank, dims);
	p->kernel = layer_norm_kernel;
	return tern_nn_stage_halves(p);
}

/* ---------------------------------------------------------------- LRN, LpNormalization, MeanVarianceNormalization */

typedef struct lrn_params {
	int64_t n, c, sp, size;
	double alpha, beta, bias;
} lrn_params;

#define DEF_LRN(S, T)                                                                                  \
	TERN_ISA_BODY void lrn_planes_##S##_body(void *ctx, int64_t begin, int64_t end)                                  \
	{                                                                                                  \
		const plain_ctx *c = ctx;                                                                      \
		const lrn_params *lp = c->params;                                                              \
		int64_t before = (lp->size - 1) / 2, after = lp->size - 1 - before;                            \
		for (int64_t plane = begin; plane < end; plane++) {                                            \
			int64_t n = plane / lp->c, ch = plane % lp->c;                                             \
			int64_t lo = ch - before < 0 ? 0 : ch - before, hi = ch + after >= lp->c ? lp->c - 1 : ch + after; \
			const T *x = (const T *)c->x + plane * lp->sp;                                             \
			T *y = (T *)c->y + plane * lp->sp;                                                         \
			for (int64_t i = 0; i < lp->sp; i++) {                                                     \
				double sq = 0;                                                                         \
				for (int64_t k = lo; k <= hi; k++) {                                                   \
					double v = ((const T *)c->x)[(n * lp->c + k) * lp->sp + i];                        \
					sq += v * v;                                                                       \
				}                                                                                      \
				y[i] = (T)(x[i] / pow(lp->bias + lp->alpha / (double)lp->size * sq, lp->beta));         \
			}                                                                                          \
		}                                                                                              \
	} \
	TERN_ISA_VARIANTS3(void, lrn_planes_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LRN(f32, float)
DEF_LRN(f64, double)

static tern_status lrn_kernel(const tern_kernel_args *a)
{
	const lrn_params *lp = a->params;
	plain_ctx c = {lp, a->in[0]->data, a->out[0]->data};
	parallel_range(a->pool, lp->n * lp->c, grain_for(lp->sp * lp->size),
	               a->in[0]->dtype == TERN_DOUBLE ? lrn_planes_f64 : lrn_planes_f32, &c);
	return TERN_OK;
}

static tern_status lrn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 2, TERN_MAX_RANK);
	if (st)
		return st;
	lrn_params *lp = calloc(1, sizeof *lp);
	if (!lp)
		return no_memory(node);
	p->params = lp;
	p->free_params = free;
	lp->n = x->dims[0];
	lp->c = x->dims[1];
	lp->sp = prod(x->dims, 2, x->rank);
	lp->size = tern_attr_int(node, "size", 0);
	lp->alpha = tern_attr_float(node, "alpha", 1e-4f);
	lp->beta = tern_attr_float(node, "beta", 0.75f);
	lp->bias = tern_attr_float(node, "bias", 1.0f);
	if (lp->size < 1)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'size' = %lld must be positive", (long long)lp->size);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->kernel = lrn_kernel;
	return tern_nn_stage_halves(p);
}

/* LpNormalization: every column along the axis (axis_params, nn.h) divided by its L1 or L2 norm. */
#define DEF_LP_NORM(S, T)                                                                          \
	TERN_ISA_BODY void lp_norm_columns_##S##_body(void *ctx, int64_t begin, int64_t end)                         \
	{                                                                                              \
		const plain_ctx *c = ctx;                                                                  \
		const axis_params *ap = c->params;                                                         \
		for (int64_t col = begin; col < end; col++) {                                              \
			int64_t base = (col / ap->inner) * ap->n * ap->inner + col % ap->inner;                \
			const T *x = (const T *)c->x + base;                                                   \
			T *y = (T *)c->y + base;                                                               \
			double norm = 0;                                                                       \
			for (int64_t i = 0; i < ap->n; i++) {                                                  \
				double v = x[i * ap->inner];                                                       \
				norm += ap->p == 1 ? fabs(v) : v * v;                                              \
			}                                                                                      \
			if (ap->p == 2)                                                                        \
				norm = sqrt(norm);                                                                 \
			for (int64_t i = 0; i < ap->n; i++)                                                    \
				y[i * ap->inner] = (T)(x[i * ap->inner] / norm);                                   \
		}                                                                                          \
	} \
	TERN_ISA_VARIANTS3(void, lp_norm_columns_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_LP_NORM(f32, float)
DEF_LP_NORM(f64, double)

static tern_status lp_norm_kernel(const tern_kernel_args *a)
{
	const axis_params *ap = a->params;
	plain_ctx c = {ap, a->in[0]->data, a->out[0]->data};
	parallel_range(a->pool, ap->outer * ap->inner, grain_for(ap->n),
	               a->in[0]->dtype == TERN_DOUBLE ? lp_norm_columns_f64 : lp_norm_columns_f32, &c);
	return TERN_OK;
}

static tern_status lp_norm_prepare(tern_prepare_args *p)
{
	axis_params *ap = NULL;
	tern_status st = tern_nn_axis_setup(p, -1, false, &ap);
	if (st)
		return st;
	ap->p = tern_attr_int(p->node, "p", 2);
	if (ap->p != 1 && ap->p != 2)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'p' = %lld; 1 or 2 expected", (long long)ap->p);
	p->kernel = lp_norm_kernel;
	return tern_nn_stage_halves(p);
}

/* MeanVarianceNormalization: (x - mean) / (std + 1e-9) over the listed axes, for every index of the
 * others. Rare, so one serial pass per statistic. */
typedef struct mvn_params {
	int rank;
	int64_t dims[TERN_MAX_RANK];
	bool reduced[TERN_MAX_RANK];
	int64_t groups;
} mvn_params;

static int64_t mvn_group(const mvn_params *mp, int64_t i)
{
	int64_t g = 0, scale = 1;
	for (int d = mp->rank - 1; d >= 0; d--) {
		int64_t idx = i % mp->dims[d];
		i /= mp->dims[d];
		if (!mp->reduced[d]) {
			g += idx * scale;
			scale *= mp->dims[d];
		}
	}
	return g;
}

static tern_status mvn_kernel(const tern_kernel_args *a)
{
	const mvn_params *mp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(x), per = n / (mp->groups ? mp->groups : 1);
	double *sum = a->scratch, *sq = sum + mp->groups;
	memset(sum, 0, (size_t)mp->groups * 2 * sizeof *sum);
	for (int64_t i = 0; i < n; i++)
		sum[mvn_group(mp, i)] += tern_tensor_get_f64(x, i);
	for (int64_t i = 0; i < n; i++) {
		int64_t g = mvn_group(mp, i);
		double d = tern_tensor_get_f64(x, i) - sum[g] / (double)per;
		sq[g] += d * d;
	}
	for (int64_t i = 0; i < n; i++) {
		int64_t g = mvn_group(mp, i);
		double mean = sum[g] / (double)per, std = sqrt(sq[g] / (double)per);
		tern_store_f64(y->dtype, y->data, i, (tern_tensor_get_f64(x, i) - mean) / (std + 1e-9));
	}
	return TERN_OK;
}

static tern_status mvn_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	tern_status st = check_real(node, x, 0);
	if (st)
		return st;
	mvn_params *mp = calloc(1, sizeof *mp);
	if (!mp)
		return no_memory(node);
	p->params = mp;
	p->free_params = free;
	mp->rank = x->rank;
	memcpy(mp->dims, x->dims, sizeof mp->dims);
	size_t n;
	const int64_t *axes = tern_attr_ints(node, "axes", &n);
	static const int64_t dflt[] = {0, 2, 3};
	if (!axes) {
		axes = dflt;
		n = 3;
	}
	for (size_t i = 0; i < n; i++) {
		int ax = 0;
		if ((st = axis_in(node, axes[i], x->rank, &ax)))
			return st;
		mp->reduced[ax] = true;
	}
	mp->groups = 1;
	for (int d = 0; d < x->rank; d++)
		if (!mp->reduced[d])
			mp->groups *= x->dims[d];
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->scratch_bytes = (size_t)mp->groups * 2 * sizeof(double);
	p->kernel = mvn_kernel;
	return tern_nn_stage_halves(p);
}

/* Their gradient rules, composed of ONNX operators through the builder. */

/* a * b, a + b, a - b, a / b: NULL when either is */
#define LN_MUL(a, b) tern_g_mul(g, (a), (b))
#define LN_ADD(a, b) tern_g_add(g, (a), (b))
#define LN_SUB(a, b) tern_g_sub(g, (a), (b))
#define LN_DIV(a, b) tern_g_div(g, (a), (b))
#define LN_K(v) tern_g_scalar(g, (v), g->x[0])

/* LRN's window over the channels, summed: t [N, C, ...] seen as [N, 1, C, R] and convolved with a
 * ones kernel [1, 1, size, 1] padded with `lo` channels before and `hi` after. With lo and hi as the
 * forward's (before, after) it is the forward's sum of squares; swapped, its transpose (channel c
 * receives from the windows that hold it). */
static tern_gval *lrn_window(tern_grad_ctx *g, tern_gval *t, tern_gval *view, tern_gval *kernel, int64_t lo,
                             int64_t hi)
{
	tern_gval *in[2] = {t, view};
	tern_gval *r = t && view ? tern_g_op(g, "", "Reshape", in, 2, NULL, 0) : NULL;
	int64_t pads[4] = {lo, 0, hi, 0};
	tern_gattr at = TERN_GA_IS("pads", pads, 4);
	tern_gval *c[2] = {r, kernel};
	r = r && kernel ? tern_g_op(g, "", "Conv", c, 2, &at, 1) : NULL;
	return tern_g_reshape_like(g, r, g->x[0]);
}

/* LRN: with k = alpha / size, d = bias + k W(x^2) (W the window sum over channels) and y = x d^-beta,
 *     dX = dY d^-beta - 2 k beta x W^T(dY y / d)
 * (x d^(-beta-1) = y / d). Expand (for the kernel) arrives in opset 8. */
static tern_status lrn_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	if (g->node->opset < 8)
		return tern_g_fail(g, "the rule needs opset 8 (Expand)");
	int64_t size = tern_attr_int(g->node, "size", 0);
	double alpha = tern_attr_float(g->node, "alpha", 1e-4f), beta = tern_attr_float(g->node, "beta", 0.75f);
	double bias = tern_attr_float(g->node, "bias", 1.0f), k = alpha / (double)size;
	if (size < 1)
		return tern_g_fail(g, "attribute 'size' = %lld must be positive", (long long)size);
	int rank;
	int64_t dims[TERN_MAX_RANK];
	tern_g_type(g, g->x[0], NULL, &rank, dims);
	if (rank < 2)
		return tern_g_fail(g, "LRN needs an input of known rank, 2 or more");
	int64_t before = (size - 1) / 2, after = size - 1 - before;
	/* [N, 1, C, R]: C from the static type, else from Shape(x) */
	tern_gval *view;
	if (dims[1] >= 0) {
		int64_t v[4] = {0, 1, dims[1], -1};
		view = tern_g_ints(g, v, 4);
	} else {
		static const int64_t lead[2] = {0, 1}, rest[1] = {-1}, chan[1] = {1};
		tern_gattr axis = TERN_GA_I("axis", 0);
		tern_gval *gin[2] = {tern_g_shape(g, g->x[0]), tern_g_ints(g, chan, 1)};
		tern_gval *parts[3] = {tern_g_ints(g, lead, 2), NULL, tern_g_ints(g, rest, 1)};
		parts[1] = gin[0] && gin[1] ? tern_g_op(g, "", "Gather", gin, 2, &axis, 1) : NULL;
		view = parts[0] && parts[1] && parts[2] ? tern_g_op(g, "", "Concat", parts, 3, &axis, 1) : NULL;
	}
	int64_t kshape[4] = {1, 1, size, 1};
	tern_gval *kin[2] = {LN_K(1.0), tern_g_ints(g, kshape, 4)};
	tern_gval *kernel = kin[0] && kin[1] ? tern_g_op(g, "", "Expand", kin, 2, NULL, 0) : NULL;
	tern_gval *x = g->x[0], *y = g->y[0], *dy = g->dy[0];
	tern_gval *d = LN_ADD(LN_MUL(lrn_window(g, LN_MUL(x, x), view, kernel, before, after), LN_K(k)), LN_K(bias));
	tern_gval *pw[2] = {d, LN_K(-beta)};
	tern_gval *scale = d && pw[1] ? tern_g_op(g, "", "Pow", pw, 2, NULL, 0) : NULL;
	tern_gval *back = lrn_window(g, LN_DIV(LN_MUL(dy, y), d), view, kernel, after, before);
	g->dx[0] = LN_SUB(LN_MUL(dy, scale), LN_MUL(LN_MUL(x, back), LN_K(2.0 * k * beta)));
	return tern_nn_g_done(g, 0);
}

/* The axes attribute's values made non-negative, for rank. */
static bool ln_axes(const int64_t *axes, size_t n, int rank, int64_t *out)
{
	for (size_t i = 0; i < n; i++) {
		out[i] = axes[i] < 0 ? axes[i] + rank : axes[i];
		if (out[i] < 0 || out[i] >= rank)
			return false;
	}
	return true;
}

/* LpNormalization: y = x / n with n the L1 or L2 norm of x's column along the axis, and n' = sign(x)
 * (L1) or y (L2):
 *     dX = (dY - n' sum(dY y)) / n
 * Broadcasting the column sums needs opset 7; Sign (L1), opset 9. */
static tern_status lp_norm_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int64_t p = tern_attr_int(g->node, "p", 2), axis = tern_attr_int(g->node, "axis", -1);
	int rank = tern_g_rank(g, g->x[0]);
	if (p != 1 && p != 2)
		return tern_g_fail(g, "attribute 'p' = %lld; 1 or 2 expected", (long long)p);
	if (g->node->opset < (p == 1 ? 9 : 7))
		return tern_g_fail(g, "the rule needs opset %d (%s)", p == 1 ? 9 : 7,
		                   p == 1 ? "Sign" : "numpy broadcasting");
	if (rank < 0 || !ln_axes(&axis, 1, rank, &axis))
		return tern_g_fail(g, "LpNormalization needs an input of known rank, with 'axis' inside it");
	tern_gval *x = g->x[0], *y = g->y[0], *dy = g->dy[0];
	tern_gval *n = p == 1 ? tern_nn_g_reduce_sum(g, tern_g_unary(g, "Abs", x), &axis, 1, true)
	                      : tern_g_unary(g, "Sqrt", tern_nn_g_reduce_sum(g, LN_MUL(x, x), &axis, 1, true));
	tern_gval *dn = p == 1 ? tern_g_unary(g, "Sign", x) : y;
	tern_gval *s = tern_nn_g_reduce_sum(g, LN_MUL(dy, y), &axis, 1, true);
	g->dx[0] = LN_DIV(LN_SUB(dy, LN_MUL(dn, s)), n);
	return tern_nn_g_done(g, 0);
}

/* MeanVarianceNormalization: with u = x - mean(x), s = sqrt(mean(u^2)), d = s + 1e-9 and y = u / d
 * (means over the axes),
 *     dX = (dY - mean(dY) - (u / s) mean(dY y)) / d
 * (the mean's share of s's derivative is zero: u sums to zero). A group whose elements are all equal
 * (s = 0) has no derivative there, and gets NaN. */
static tern_status mvn_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int rank;
	int64_t dims[TERN_MAX_RANK], axes[TERN_MAX_RANK];
	tern_g_type(g, g->x[0], NULL, &rank, dims);
	size_t n = 0;
	const int64_t *given = tern_attr_ints(g->node, "axes", &n);
	static const int64_t dflt[] = {0, 2, 3};
	if (!given) {
		given = dflt;
		n = 3;
	}
	if (rank < 0 || n > TERN_MAX_RANK || !ln_axes(given, n, rank, axes))
		return tern_g_fail(g, "MeanVarianceNormalization needs an input of known rank, with 'axes' inside it");
	/* the count of each mean: static where the reduced dimensions are, else Size(x) / Size(sum) */
	tern_gval *x = g->x[0], *y = g->y[0], *dy = g->dy[0], *inv_m;
	int64_t m = 1;
	bool known = true;
	for (size_t i = 0; i < n; i++) {
		bool repeat = false;
		for (size_t j = 0; j < i; j++)
			repeat |= axes[j] == axes[i];
		if (!repeat) {
			known &= dims[axes[i]] >= 0;
			m *= dims[axes[i]];
		}
	}
	if (known) {
		inv_m = LN_K(m ? 1.0 / (double)m : 0.0);
	} else {
		tern_gattr to = TERN_GA_I("to", tern_g_dtype(g, x));
		tern_gval *sizes[2] = {tern_g_unary(g, "Size", tern_nn_g_reduce_sum(g, x, axes, (int)n, true)),
		                       tern_g_unary(g, "Size", x)};
		for (int i = 0; i < 2; i++)
			sizes[i] = sizes[i] ? tern_g_op(g, "", "Cast", &sizes[i], 1, &to, 1) : NULL;
		inv_m = LN_DIV(sizes[0], sizes[1]);
	}
#define LN_MEAN(v) LN_MUL(tern_nn_g_reduce_sum(g, (v), axes, (int)n, true), inv_m)
	tern_gval *u = LN_SUB(x, LN_MEAN(x));
	tern_gval *s = tern_g_unary(g, "Sqrt", LN_MEAN(LN_MUL(u, u)));
	tern_gval *d = LN_ADD(s, LN_K(1e-9));
	tern_gval *t = LN_SUB(LN_SUB(dy, LN_MEAN(dy)), LN_MUL(LN_DIV(u, s), LN_MEAN(LN_MUL(dy, y))));
#undef LN_MEAN
	g->dx[0] = LN_DIV(t, d);
	return tern_nn_g_done(g, 0);
}

#undef LN_MUL
#undef LN_ADD
#undef LN_SUB
#undef LN_DIV
#undef LN_K

/* ---------------------------------------------------------------- gradients */

/* tern.BatchNormGrad(dY, X, scale[, mean, var]) -> dX, dScale, dB[, dMean, dVar], attributes epsilon,
 * training_mode and spatial as BatchNormalization's: channel by channel. In training mode the batch's
 * statistics (recomputed from X) carry the gradient as in PyTorch's batch_norm_backward,
 *     dX = scale * inv * (dY - mean(dY) - xhat * mean(dY * xhat)),  xhat = (x - mean) * inv;
 * in inference mode the map is affine per channel: dX = dY * scale * inv, and the given mean and
 * variance get theirs. dScale = sum(dY * xhat), dB = sum(dY) either way. */
typedef struct bn_grad_ctx {
	const bn_params *bp;
	const void *dy, *x;
	const tern_tensor *scale, *mean, *var;
	void *dx;
	tern_tensor *const *out; /* dScale, dB, dMean, dVar (NULL where absent) */
} bn_grad_ctx;

/* Over n elements, in double and eight partial sums (vectors of eight): the sums of x - k, of its
 * square, of dy and of dy (x - k). */
typedef double v8d __attribute__((vector_size(64)));
typedef double v8du __attribute__((vector_size(64), aligned(8), may_alias));
typedef float v8fu __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD8_f32(p) __builtin_convertvector(*(const v8fu *)(p), v8d)
#define LOAD8_f64(p) (*(const v8du *)(p))

#define DEF_SUMS4(S, T)                                                                                 \
	static inline __attribute__((always_inline)) void sums4_##S(const T *restrict x, const T *restrict dy, \
	                                                            double k, int64_t n, double *out)       \
	{                                                                                                   \
		v8d p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0}, kv = (v8d){0} + k;                                  \
		int64_t i = 0;                                                                                  \
		for (; i + 8 <= n; i += 8) {                                                                    \
			v8d v = LOAD8_##S(x + i) - kv, d = LOAD8_##S(dy + i);                                       \
			p0 += v;                                                                                    \
			p1 += v * v;                                                                                \
			p2 += d;                                                                                    \
			p3 += d * v;                                                                                \
		}                                                                                               \
		for (; i < n; i++) {                                                                            \
			double v = (double)x[i] - k, d = dy[i];                                                     \
			p0[0] += v;                                                                                 \
			p1[0] += v * v;                                                                             \
			p2[0] += d;                                                                                 \
			p3[0] += d * v;                                                                             \
		}                                                                                               \
		for (int l = 0; l < 8; l++) {                                                                   \
			out[0] += p0[l];                                                                            \
			out[1] += p1[l];                                                                            \
			out[2] += p2[l];                                                                            \
			out[3] += p3[l];                                                                            \
		}                                                                                               \
	}

DEF_SUMS4(f32, float)
DEF_SUMS4(f64, double)

/* One pass over a channel gathers its sums about a shift k (its first element in training, the given
 * mean in inference), from which the batch's mean and variance follow; a second writes dX. */
#define DEF_BN_GRAD(S, T)                                                                               \
	TERN_ISA_BODY void bn_grad_channels_##S##_body(void *ctx, int64_t begin, int64_t end)                  \
	{                                                                                                   \
		const bn_grad_ctx *c = ctx;                                                                     \
		const bn_params *bp = c->bp;                                                                    \
		double count = (double)(bp->n * bp->sp);                                                        \
		for (int64_t ch = begin; ch < end; ch++) {                                                      \
			double mean, var, k;                                                                        \
			if (bp->training)                                                                           \
				k = count ? ((const T *)c->x)[ch * bp->sp] : 0;                                         \
			else                                                                                        \
				k = tern_tensor_get_f64(c->mean, ch);                                                   \
			double sums[4] = {0, 0, 0, 0};                                                              \
			for (int64_t n = 0; n < bp->n; n++)                                                         \
				sums4_##S((const T *)c->x + (n * bp->c + ch) * bp->sp,                                  \
				          (const T *)c->dy + (n * bp->c + ch) * bp->sp, k, bp->sp, sums);               \
			if (bp->training) {                                                                         \
				double m1 = count ? sums[0] / count : 0;                                                \
				mean = k + m1;                                                                          \
				var = count ? sums[1] / count - m1 * m1 : 0;                                            \
				var = var > 0 ? var : 0;                                                                \
			} else {                                                                                    \
				mean = k;                                                                               \
				var = tern_tensor_get_f64(c->var, ch);                                                  \
			}                                                                                           \
			double inv = 1.0 / sqrt(var + bp->eps), scale = tern_tensor_get_f64(c->scale, ch);          \
			/* sum(dy) and sum(dy (x - mean)) */                                                        \
			double s1 = sums[2], s2 = sums[3] - (mean - k) * sums[2];                                   \
			/* dX = a dY + b (x - mean) + e */                                                          \
			double a = scale * inv, b = 0, e = 0;                                                       \
			if (bp->training && count) {                                                                \
				b = -scale * inv * inv * inv * s2 / count;                                              \
				e = -scale * inv * s1 / count;                                                          \
			}                                                                                           \
			for (int64_t n = 0; c->dx && n < bp->n; n++) {                                              \
				const T *restrict x = (const T *)c->x + (n * bp->c + ch) * bp->sp;                      \
				const T *restrict dy = (const T *)c->dy + (n * bp->c + ch) * bp->sp;                    \
				T *restrict dx = (T *)c->dx + (n * bp->c + ch) * bp->sp;                                \
				T ta = (T)a, tb = (T)b, te = (T)e, tm = (T)mean;                                        \
				for (int64_t i = 0; i < bp->sp; i++)                                                    \
					dx[i] = ta * dy[i] + tb * (x[i] - tm) + te;                                         \
			}                                                                                           \
			double got[4] = {s2 * inv, s1, -s1 * scale * inv, -0.5 * scale * s2 * inv * inv * inv};     \
			for (int o = 0; o < 4; o++)                                                                 \
				if (c->out[o])                                                                          \
					tern_store_f64(c->out[o]->dtype, c->out[o]->data, ch, got[o]);                      \
		}                                                                                               \
	}                                                                                                   \
	TERN_ISA_VARIANTS3(void, bn_grad_channels_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_BN_GRAD(f32, float)
DEF_BN_GRAD(f64, double)

static tern_status bn_grad_kernel(const tern_kernel_args *a)
{
	const bn_params *bp = a->params;
	tern_tensor *out[4] = {NULL};
	for (int o = 1; o < a->n_out && o < 5; o++)
		out[o - 1] = a->out[o];
	bn_grad_ctx c = {bp, a->in[0]->data, a->in[1]->data, a->in[2], a->n_in > 3 ? a->in[3] : NULL,
	                 a->n_in > 4 ? a->in[4] : NULL, a->out[0] ? a->out[0]->data : NULL, out};
	parallel_range(a->pool, bp->c, grain_for(3 * bp->n * bp->sp),
	               a->in[0]->dtype == TERN_DOUBLE ? bn_grad_channels_f64 : bn_grad_channels_f32, &c);
	return TERN_OK;
}

static tern_status bn_grad_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[1];
	tern_status st = check_real_same(p, 2);
	if (!st)
		st = check_rank(node, x, 1, 2, TERN_MAX_RANK);
	if (st)
		return st;
	bn_params *bp = calloc(1, sizeof *bp);
	if (!bp)
		return no_memory(node);
	p->params = bp;
	p->free_params = free;
	bool spatial = tern_attr_int(node, "spatial", 1) != 0;
	bp->n = x->dims[0];
	bp->c = spatial ? x->dims[1] : prod(x->dims, 1, x->rank);
	bp->sp = prod(x->dims, 1, x->rank) / (bp->c ? bp->c : 1);
	bp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	bp->training = tern_attr_int(node, "training_mode", 0) != 0;
	int need = bp->training ? 3 : 5;
	static const char *const names[] = {"", "", "scale", "mean", "var"};
	for (int i = 2; i < need && !st; i++)
		if (p->n_in <= i || !p->in[i])
			st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
		else if (!(st = check_real(node, p->in[i], i)))
			st = check_numel(node, p->in[i], i, names[i], bp->c);
	if (st)
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if ((st = tern_nn_check_dy(p)))
		return st;
	for (int o = 1; o < p->n_out; o++)
		if (p->out[o]) {
			if (o >= need)
				return tern_node_errorf(node, TERN_EDATA, "output %d exists only in inference mode", o);
			tern_set_shape(p->out[o], p->in[o < 3 ? 2 : o]->dtype, 1, &bp->c);
		}
	p->kernel = bn_grad_kernel;
	return tern_nn_stage_halves(p);
}

/* BatchNormalization, as tern computes it: training mode (opset 14 on: training_mode; before: when
 * it has the statistics outputs) through the batch's statistics, else the affine map of the given
 * ones. The running and saved statistics carry no gradient back. */
static tern_status bn_grad(tern_grad_ctx *g)
{
	const tern_node *node = g->node;
	for (int o = 1; o < g->n_out; o++)
		if (g->dy[o])
			return tern_g_fail(g, "output %d (a running or saved statistic) carries no gradient", o);
	bool training = false;
	if (node->opset >= 14)
		training = tern_attr_int(node, "training_mode", 0) != 0;
	else
		for (int o = 1; o < g->n_out; o++)
			training |= g->y[o] != NULL;
	bool spatial = node->opset >= 9 || tern_attr_int(node, "spatial", 1) != 0;
	tern_gattr at[3] = {TERN_GA_F("epsilon", tern_attr_float(node, "epsilon", 1e-5f)),
	                    TERN_GA_I("training_mode", training), TERN_GA_I("spatial", spatial)};
	int n = training ? 3 : 5;
	tern_gval *in[5] = {g->dy[0], g->x[0], g->x[1], g->x[3], g->x[4]}, *out[5] = {NULL};
	if (tern_g_op_n(g, "tern", "BatchNormGrad", in, n, at, 3, out, n))
		return tern_g_status(g);
	for (int i = 0; i < n; i++)
		if (g->wants[i])
			g->dx[i] = out[i];
	return tern_nn_g_done(g, training ? 1u << 3 | 1u << 4 : 0);
}

/* tern.LayerNormGrad(dY, X, Scale[, B]) -> dX, dScale, dB, attributes axis and epsilon as
 * LayerNormalization's (B is read for its shape, that of dB): row by row as PyTorch's
 * layer_norm_backward, with g = dY * scale,
 *     dX = inv * (g - mean(g) - xhat * mean(g * xhat)),
 * and dScale = sum over rows of dY * xhat, dB = sum over rows of dY, in partial sums per chunk of
 * rows that are added up after. */
typedef struct layer_norm_grad_params {
	layer_norm_params lp;
	int64_t slots;
} layer_norm_grad_params;

typedef struct layer_norm_grad_ctx {
	const layer_norm_grad_params *gp;
	const void *dy, *x, *scale;
	void *dx;
	double *sums; /* per slot: cols of dScale, then cols of dB */
} layer_norm_grad_ctx;

#define DEF_LAYER_NORM_GRAD(S, T)                                                                      \
	TERN_ISA_BODY void layer_norm_grad_rows_##S##_body(void *ctx, int64_t begin, int64_t end, int64_t slot) \
	{                                                                                                  \
		const layer_norm_grad_ctx *c = ctx;                                                            \
		const layer_norm_params *lp = &c->gp->lp;                                                      \
		int64_t cols = lp->cols;                                                                       \
		const T *scale = c->scale;                                                                     \
		double *ds = c->sums + slot * 2 * cols, *db = ds + cols;                                       \
		for (int64_t r = begin; r < end; r++) {                                                        \
			const T *restrict x = (const T *)c->x + r * cols;                                          \
			const T *restrict dy = (const T *)c->dy + r * cols;                                        \
			/* the moments about the row's first element, in one pass */                               \
			double k = cols ? x[0] : 0, m1 = 0, m2 = 0;                                                \
			v8d p0 = {0}, p1 = {0}, kv = (v8d){0} + k;                                                 \
			int64_t i = 0;                                                                             \
			for (; i + 8 <= cols; i += 8) {                                                            \
				v8d v = LOAD8_##S(x + i) - kv;                                                         \
				p0 += v;                                                                               \
				p1 += v * v;                                                                           \
			}                                                                                          \
			for (; i < cols; i++) {                                                                    \
				double v = x[i] - k;                                                                   \
				m1 += v;                                                                               \
				m2 += v * v;                                                                           \
			}                                                                                          \
			for (int l = 0; l < 8; l++) {                                                              \
				m1 += p0[l];                                                                           \
				m2 += p1[l];                                                                           \
			}                                                                                          \
			m1 /= (double)(cols ? cols : 1);                                                           \
			double var = m2 / (double)(cols ? cols : 1) - m1 * m1, mean = k + m1;                      \
			double inv = 1.0 / sqrt((var > 0 ? var : 0) + lp->eps), sg = 0, sgx = 0;                  \
			/* g = dy scale: its sums with and without xhat; the columns' sums of dy xhat and dy */    \
			v8d mv = (v8d){0} + mean, iv = (v8d){0} + inv, s0 = {0}, s1 = {0};                         \
			v8d sc = (v8d){0} + (double)scale[0];                                                      \
			if (lp->scale_scalar)                                                                      \
				for (i = 0; i + 8 <= cols; i += 8) {                                                   \
					v8d xh = (LOAD8_##S(x + i) - mv) * iv, d = LOAD8_##S(dy + i), gi = d * sc;         \
					s0 += gi;                                                                          \
					s1 += gi * xh;                                                                     \
					*(v8du *)(ds + i) += d * xh;                                                       \
					*(v8du *)(db + i) += d;                                                            \
				}                                                                                      \
			else                                                                                       \
				for (i = 0; i + 8 <= cols; i += 8) {                                                   \
					v8d xh = (LOAD8_##S(x + i) - mv) * iv, d = LOAD8_##S(dy + i);                      \
					v8d gi = d * LOAD8_##S(scale + i);                                                 \
					s0 += gi;                                                                          \
					s1 += gi * xh;                                                                     \
					*(v8du *)(ds + i) += d * xh;                                                       \
					*(v8du *)(db + i) += d;                                                            \
				}                                                                                      \
			for (; i < cols; i++) {                                                                    \
				double xh = (x[i] - mean) * inv, gi = (double)dy[i] * scale[lp->scale_scalar ? 0 : i]; \
				sg += gi;                                                                              \
				sgx += gi * xh;                                                                        \
				ds[i] += dy[i] * xh;                                                                   \
				db[i] += dy[i];                                                                        \
			}                                                                                          \
			for (int l = 0; l < 8; l++) {                                                              \
				sg += s0[l];                                                                           \
				sgx += s1[l];                                                                          \
			}                                                                                          \
			if (!c->dx)                                                                                \
				continue;                                                                              \
			T *restrict dx = (T *)c->dx + r * cols;                                                    \
			T m = (T)mean, ivt = (T)inv, a = (T)(sg / (double)cols), b = (T)(sgx / (double)cols);      \
			if (lp->scale_scalar)                                                                      \
				for (i = 0; i < cols; i++)                                                             \
					dx[i] = ivt * (dy[i] * scale[0] - a - (x[i] - m) * ivt * b);                       \
			else                                                                                       \
				for (i = 0; i < cols; i++)                                                             \
					dx[i] = ivt * (dy[i] * scale[i] - a - (x[i] - m) * ivt * b);                       \
		}                                                                                              \
	}                                                                                                  \
	TERN_ISA_VARIANTS3(void, layer_norm_grad_rows_##S, (void *ctx, int64_t begin, int64_t end, int64_t slot), \
	                   (ctx, begin, end, slot))

DEF_LAYER_NORM_GRAD(f32, float)
DEF_LAYER_NORM_GRAD(f64, double)

/* Column sums of the slots into an output of n elements (1: everything summed). */
static void store_column_sums(tern_tensor *t, const double *sums, int64_t slots, int64_t cols, int64_t stride)
{
	if (!t)
		return;
	int64_t n = tern_tensor_numel(t);
	double all = 0;
	for (int64_t j = 0; j < cols; j++) {
		double v = 0;
		for (int64_t s = 0; s < slots; s++)
			v += sums[s * stride + j];
		if (n == 1)
			all += v;
		else
			tern_store_f64(t->dtype, t->data, j, v);
	}
	if (n == 1)
		tern_store_f64(t->dtype, t->data, 0, all);
}

static tern_status layer_norm_grad_kernel(const tern_kernel_args *a)
{
	const layer_norm_grad_params *gp = a->params;
	int64_t cols = gp->lp.cols;
	double *sums = a->scratch;
	memset(sums, 0, (size_t)(gp->slots * 2 * cols) * sizeof *sums);
	layer_norm_grad_ctx c = {gp, a->in[0]->data, a->in[1]->data, a->in[2]->data, a->out[0] ? a->out[0]->data : NULL, sums};
	parallel_slots(a->pool, gp->lp.rows, grain_for(3 * cols), gp->slots,
	               a->in[0]->dtype == TERN_DOUBLE ? layer_norm_grad_rows_f64 : layer_norm_grad_rows_f32, &c);
	store_column_sums(a->n_out > 1 ? a->out[1] : NULL, sums, gp->slots, cols, 2 * cols);
	store_column_sums(a->n_out > 2 ? a->out[2] : NULL, sums + cols, gp->slots, cols, 2 * cols);
	return TERN_OK;
}

static tern_status layer_norm_grad_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[1], *scale = p->in[2], *bias = p->n_in > 3 ? p->in[3] : NULL;
	tern_status st = check_real_same(p, 4);
	int axis = 0;
	if (st || (st = axis_in(node, tern_attr_int(node, "axis", -1), x->rank, &axis)))
		return st;
	layer_norm_grad_params *gp = calloc(1, sizeof *gp);
	if (!gp)
		return no_memory(node);
	p->params = gp;
	p->free_params = free;
	layer_norm_params *lp = &gp->lp;
	if ((st = layer_norm_geometry(node, x, scale, bias, axis, lp)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if ((st = tern_nn_check_dy(p)))
		return st;
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], scale->dtype, scale->rank, scale->dims);
	if (p->n_out > 2 && p->out[2]) {
		if (!bias)
			return tern_node_errorf(node, TERN_EDATA, "output 2 (dB) needs input 3 (B, for its shape)");
		tern_set_shape(p->out[2], bias->dtype, bias->rank, bias->dims);
	}
	gp->slots = tern_threadpool_sums(p->pool) > 1 ? slots_for(p->pool) : 1; /* partial sums */
	p->scratch_bytes = (size_t)(gp->slots * 2 * lp->cols) * sizeof(double);
	p->kernel = layer_norm_grad_kernel;
	return tern_nn_stage_halves(p);
}

/* LayerNormalization: tern.LayerNormGrad. The Mean and InvStdDev outputs carry no gradient back. */
static tern_status layer_norm_grad(tern_grad_ctx *g)
{
	for (int o = 1; o < g->n_out; o++)
		if (g->dy[o])
			return tern_g_fail(g, "output %d (Mean or InvStdDev) carries no gradient", o);
	tern_gattr at[2] = {TERN_GA_I("axis", tern_attr_int(g->node, "axis", -1)),
	                    TERN_GA_F("epsilon", tern_attr_float(g->node, "epsilon", 1e-5f))};
	bool bias = g->n_in > 2 && g->x[2];
	tern_gval *in[4] = {g->dy[0], g->x[0], g->x[1], bias ? g->x[2] : NULL}, *out[3] = {NULL};
	int n_out = bias ? 3 : 2;
	if (tern_g_op_n(g, "tern", "LayerNormGrad", in, bias ? 4 : 3, at, 2, out, n_out))
		return tern_g_status(g);
	for (int i = 0; i < n_out; i++)
		if (g->wants[i])
			g->dx[i] = out[i];
	return tern_nn_g_done(g, 0);
}

/* tern.GroupNormGrad(dY, X, scale, bias) -> dX, dScale, dB, attributes epsilon, num_groups (0: one
 * per channel, InstanceNormalization) and scale_per_group (1: a scale and bias of num_groups values
 * are per group, GroupNormalization before opset 21). Per (image, group) block, with g = dY * scale
 * and M the block's elements, dX = inv * (g - mean(g) - xhat * mean(g * xhat)); dScale and dB sum
 * each channel's dY * xhat and dY over the images (then over the group's channels when the scale is
 * per group). */
typedef struct group_norm_grad_ctx {
	const group_norm_params *gp;
	const void *dy, *x;
	void *dx;
	const double *scale; /* per channel */
	double *sums;        /* per (image, channel): sum of dY * xhat, then sum of dY */
} group_norm_grad_ctx;

#define DEF_GROUP_NORM_GRAD(S, T)                                                                     \
	TERN_ISA_BODY void group_norm_grad_blocks_##S##_body(void *ctx, int64_t begin, int64_t end)          \
	{                                                                                                 \
		const group_norm_grad_ctx *c = ctx;                                                           \
		const group_norm_params *gp = c->gp;                                                          \
		int64_t per = gp->c / gp->groups, m = per * gp->sp;                                           \
		for (int64_t blk = begin; blk < end; blk++) {                                                 \
			const T *x = (const T *)c->x + blk * m, *dy = (const T *)c->dy + blk * m;                 \
			int64_t n = blk / gp->groups, c0 = blk % gp->groups * per;                                \
			double mean, inv, sg = 0, sgx = 0;                                                        \
			moments_##S(x, m, gp->eps, &mean, &inv);                                                  \
			for (int64_t ch = 0; ch < per; ch++) {                                                    \
				const T *xc = x + ch * gp->sp, *dyc = dy + ch * gp->sp;                               \
				double sums[4] = {0, 0, 0, 0};                                                        \
				sums4_##S(xc, dyc, mean, gp->sp, sums);                                               \
				double s1 = sums[2], s2 = sums[3];                                                    \
				double *out = c->sums + 2 * (n * gp->c + c0 + ch);                                    \
				out[0] = s2 * inv;                                                                    \
				out[1] = s1;                                                                          \
				sg += c->scale[c0 + ch] * s1;                                                         \
				sgx += c->scale[c0 + ch] * s2 * inv;                                                  \
			}                                                                                         \
			if (!c->dx)                                                                               \
				continue;                                                                             \
			double a = sg / (double)m, b = sgx / (double)m;                                           \
			for (int64_t ch = 0; ch < per; ch++) {                                                    \
				const T *restrict xc = x + ch * gp->sp, *restrict dyc = dy + ch * gp->sp;             \
				T *restrict dxc = (T *)c->dx + blk * m + ch * gp->sp;                                 \
				/* dX = inv * (scale dY - a - (x - mean) inv b) = k1 dY + k2 x + k3 */                \
				T k1 = (T)(inv * c->scale[c0 + ch]), k2 = (T)(-inv * inv * b);                        \
				T k3 = (T)(-inv * a + inv * inv * b * mean);                                          \
				for (int64_t i = 0; i < gp->sp; i++)                                                  \
					dxc[i] = k1 * dyc[i] + k2 * xc[i] + k3;                                           \
			}                                                                                         \
		}                                                                                             \
	}                                                                                                 \
	TERN_ISA_VARIANTS3(void, group_norm_grad_blocks_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_GROUP_NORM_GRAD(f32, float)
DEF_GROUP_NORM_GRAD(f64, double)

static tern_status group_norm_grad_kernel(const tern_kernel_args *a)
{
	const group_norm_params *gp = a->params;
	double *scale = a->scratch, *sums = scale + gp->c;
	int64_t per = gp->c / gp->groups;
	for (int64_t ch = 0; ch < gp->c; ch++)
		scale[ch] = tern_tensor_get_f64(a->in[2], gp->scale_per_group ? ch / per : ch);
	group_norm_grad_ctx c = {gp, a->in[0]->data, a->in[1]->data, a->out[0] ? a->out[0]->data : NULL, scale, sums};
	parallel_range(a->pool, gp->n * gp->groups, grain_for(3 * per * gp->sp),
	               a->in[0]->dtype == TERN_DOUBLE ? group_norm_grad_blocks_f64 : group_norm_grad_blocks_f32, &c);
	for (int o = 1; o < 3 && o < a->n_out; o++) {
		tern_tensor *t = a->out[o];
		if (!t)
			continue;
		int64_t nt = tern_tensor_numel(t);
		for (int64_t i = 0; i < nt; i++) {
			double v = 0;
			int64_t c0 = gp->scale_per_group ? i * per : i, c1 = gp->scale_per_group ? c0 + per : c0 + 1;
			for (int64_t n = 0; n < gp->n; n++)
				for (int64_t ch = c0; ch < c1; ch++)
					v += sums[2 * (n * gp->c + ch) + (o - 1)];
			tern_store_f64(t->dtype, t->data, i, v);
		}
	}
	return TERN_OK;
}

static tern_status group_norm_grad_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[1];
	tern_status st = check_real_same(p, 4);
	if (!st)
		st = check_rank(node, x, 1, 2, TERN_MAX_RANK);
	for (int i = 2; i < 4 && !st; i++)
		if (p->n_in <= i || !p->in[i])
			st = tern_node_errorf(node, TERN_EDATA, "input %d is required", i);
	if (st)
		return st;
	group_norm_params *gp = calloc(1, sizeof *gp);
	if (!gp)
		return no_memory(node);
	p->params = gp;
	p->free_params = free;
	gp->n = x->dims[0];
	gp->c = x->dims[1];
	gp->sp = prod(x->dims, 2, x->rank);
	gp->eps = tern_attr_float(node, "epsilon", 1e-5f);
	gp->groups = tern_attr_int(node, "num_groups", 0);
	if (gp->groups == 0)
		gp->groups = gp->c;
	if (gp->groups < 1 || gp->c % gp->groups)
		return tern_node_errorf(node, TERN_EDATA, "num_groups = %lld does not divide %lld channels",
		                        (long long)gp->groups, (long long)gp->c);
	int64_t ns = tern_tensor_numel(p->in[2]);
	gp->scale_per_group = ns == gp->groups && tern_attr_int(node, "scale_per_group", 0) != 0;
	int64_t want = gp->scale_per_group ? gp->groups : gp->c;
	if ((st = check_numel(node, p->in[2], 2, "scale", want)) || (st = check_numel(node, p->in[3], 3, "bias", want)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if ((st = tern_nn_check_dy(p)))
		return st;
	for (int o = 1; o < 3 && o < p->n_out; o++)
		if (p->out[o])
			tern_set_shape(p->out[o], p->in[o + 1]->dtype, p->in[o + 1]->rank, p->in[o + 1]->dims);
	p->scratch_bytes = (size_t)(gp->c + 2 * gp->n * gp->c) * sizeof(double);
	p->kernel = group_norm_grad_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status group_norm_grad_rule(tern_grad_ctx *g, bool instance)
{
	tern_gattr at[3] = {TERN_GA_F("epsilon", tern_attr_float(g->node, "epsilon", 1e-5f)),
	                    TERN_GA_I("num_groups", instance ? 0 : tern_attr_int(g->node, "num_groups", 0)),
	                    TERN_GA_I("scale_per_group", !instance && g->node->opset < 21)};
	tern_gval *in[4] = {g->dy[0], g->x[0], g->x[1], g->x[2]}, *out[3] = {NULL};
	if (tern_g_op_n(g, "tern", "GroupNormGrad", in, 4, at, 3, out, 3))
		return tern_g_status(g);
	for (int i = 0; i < 3; i++)
		if (g->wants[i])
			g->dx[i] = out[i];
	return tern_nn_g_done(g, 0);
}

/* InstanceNormalization and GroupNormalization: tern.GroupNormGrad. */
static tern_status instance_norm_grad(tern_grad_ctx *g) { return group_norm_grad_rule(g, true); }
static tern_status group_norm_grad(tern_grad_ctx *g) { return group_norm_grad_rule(g, false); }

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
	{"", "BatchNormalization", 1, 0, bn_prepare, TERN_DT_FLOATS, "norm", bn_grad},
	{"", "InstanceNormalization", 1, 0, instance_norm_prepare, TERN_DT_FLOATS, "norm", instance_norm_grad},
	{"", "GroupNormalization", 18, 0, group_norm_prepare, TERN_DT_FLOATS, "norm", group_norm_grad},
	{"", "LayerNormalization", 17, 0, layer_norm_prepare, TERN_DT_FLOATS, "norm", layer_norm_grad},
	{"", "LRN", 1, 0, lrn_prepare, TERN_DT_FLOATS, "norm", lrn_grad},
	{"", "LpNormalization", 1, 0, lp_norm_prepare, TERN_DT_FLOATS, "norm", lp_norm_grad},
	{"", "MeanVarianceNormalization", 9, 0, mvn_prepare, TERN_DT_FLOATS, "norm", mvn_grad},
	{"tern", "BatchNormGrad", 1, 0, bn_grad_prepare, TERN_DT_FLOATS, "norm"},
	{"tern", "LayerNormGrad", 1, 0, layer_norm_grad_prepare, TERN_DT_FLOATS, "norm"},
	{"tern", "GroupNormGrad", 1, 0, group_norm_grad_prepare, TERN_DT_FLOATS, "norm"},
};

const tern_op_table tern_ops_norm = {ops, TERN_ARRAY_LEN(ops)};
