/* pool.c — pooling: MaxPool (with its indices output), AveragePool and LpPool over 1 to 3 spatial
 * dimensions, their Global forms, and MaxUnpool. A windowed pool goes plane by plane, each kernel tap
 * adding one strided input row into a whole output row; float max and average pooling of 1-D and 2-D
 * planes go by blocks of channels through the engine in nn_common.c. Kernels exist for float and
 * double, MaxPool's for int8 and uint8 too; float16 and bfloat16 are computed in float. */
#include "ops/nn.h"

/* ---------------------------------------------------------------- pooling */

typedef enum pool_kind { POOL_MAX, POOL_AVG, POOL_LP } pool_kind;

/* Per spatial slot and output position: the kernel taps [lo, hi) inside the input and, for
 * count_include_pad, [pad_lo, pad_hi) inside the padded input. Computed once when planning, so the
 * loops below do no division. */
enum { TAP_LO, TAP_HI, TAP_PAD_LO, TAP_PAD_HI, TAP_FIELDS };

typedef struct pool_params {
	window w;
	pool_kind kind;
	bool count_include_pad, column_major;
	int64_t p; /* LpPool's exponent */
	int64_t planes;
	bool global;
	int64_t *taps[SP]; /* TAP_FIELDS entries per output position, in the same allocation */
	int64_t *rows2;    /* per tap of the last slot: the outputs [lo, hi) whose tap is inside the input */
	/* float max and average pooling of 1-D and 2-D planes by blocks of channels */
	bool blocks;
	int64_t band, slot_elems, slots;
	float *recip; /* average: 1 / divisor per output position */
	/* MaxPool's gradient: windows that do not overlap (no dilation, strides at least the kernel), so
	 * each input element is in at most one window and takes its gradient by assignment */
	bool tiles;
} pool_params;

typedef struct pool_ctx {
	const pool_params *pp;
	int dtype;
	const void *x;
	void *y;
	int64_t *ind;
} pool_ctx;

/* One (n, c) plane of a windowed pool, output row by output row: each kernel tap adds one strided
 * input row into the whole output row (the outputs whose tap lies inside the input), so the inner
 * loops carry no bounds tests. Indices (MaxPool's second output) take the per-output path: flat
 * positions in the whole input, row-major or (storage_order 1) column-major over the spatial axes. */
#define DEF_POOL_PLANE(S, T, LOWEST)                                                                            \
	static void pool_argmax_##S(const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base)          \
	{                                                                                                       \
		const window *w = &pp->w;                                                                            \
		int64_t o = 0;                                                                                       \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                         \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];                \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                     \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];             \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++, o++) {                                            \
					const int64_t *t2 = pp->taps[2] + o2 * TAP_FIELDS, s2 = o2 * w->s[2] - w->pb[2];         \
					T best = LOWEST;                                                                         \
					int64_t at = -1;                                                                         \
					for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++) {                                   \
						int64_t i0 = s0 + k0 * w->d[0];                                                      \
						for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                               \
							int64_t i1 = s1 + k1 * w->d[1];                                                  \
							for (int64_t k2 = t2[TAP_LO]; k2 < t2[TAP_HI]; k2++) {                           \
								int64_t i2 = s2 + k2 * w->d[2];                                              \
								T v = x[(i0 * w->in[1] + i1) * w->in[2] + i2];                               \
								if (v > best || at < 0) {                                                    \
									best = v;                                                                \
									at = pp->column_major ? i0 + i1 * w->in[0] + i2 * w->in[0] * w->in[1]    \
									                      : (i0 * w->in[1] + i1) * w->in[2] + i2;            \
								}                                                                            \
							}                                                                                \
						}                                                                                    \
					}                                                                                        \
					y[o] = at < 0 ? 0 : best;                                                                \
					ind[o] = base + (at < 0 ? 0 : at);                                                       \
				}                                                                                            \
			}                                                                                                \
		}                                                                                                    \
	}                                                                                                        \
	TERN_ISA_BODY void pool_plane_##S##_body(const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base)           \
	{                                                                                                       \
		if (ind) {                                                                                           \
			pool_argmax_##S(pp, x, y, ind, base);                                                            \
			return;                                                                                          \
		}                                                                                                    \
		const window *w = &pp->w;                                                                            \
		const int64_t *t2 = pp->taps[2], *rows2 = pp->rows2;                                                 \
		bool is_max = pp->kind == POOL_MAX, square = pp->kind == POOL_LP && pp->p == 2;                      \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                         \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];                \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                     \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];             \
				T *restrict yr = y + (o0 * w->out[1] + o1) * w->out[2];                                      \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++)                                                   \
					yr[o2] = is_max ? LOWEST : 0;                                                            \
				for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                                         \
					for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                                   \
						const T *row = x + ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * w->in[2];   \
						for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                           \
							const T *restrict xs = row + k2 * w->d[2] - w->pb[2];                            \
							int64_t lo = rows2[2 * k2], hi = rows2[2 * k2 + 1], st = w->s[2];                \
							if (is_max)                                                                      \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] = xs[o2 * st] > yr[o2] ? xs[o2 * st] : yr[o2];                    \
							else if (pp->kind == POOL_AVG)                                                   \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += xs[o2 * st];                                                   \
							else if (square)                                                                 \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += xs[o2 * st] * xs[o2 * st];                                     \
							else                                                                             \
								for (int64_t o2 = lo; o2 < hi; o2++)                                         \
									yr[o2] += (T)pow(fabs((double)xs[o2 * st]), (double)pp->p);              \
						}                                                                                    \
					}                                                                                        \
				int64_t n01 = (t0[TAP_HI] - t0[TAP_LO]) * (t1[TAP_HI] - t1[TAP_LO]);                         \
				int64_t p01 = (t0[TAP_PAD_HI] - t0[TAP_PAD_LO]) * (t1[TAP_PAD_HI] - t1[TAP_PAD_LO]);         \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++) {                                                 \
					const int64_t *t = t2 + o2 * TAP_FIELDS;                                                 \
					int64_t count = n01 * (t[TAP_HI] - t[TAP_LO]);                                           \
					if (is_max)                                                                              \
						yr[o2] = count ? yr[o2] : 0;                                                         \
					else if (pp->kind == POOL_LP)                                                            \
						yr[o2] = (T)(square ? sqrt((double)yr[o2]) : pow((double)yr[o2], 1.0 / (double)pp->p)); \
					else {                                                                                   \
						if (pp->count_include_pad)                                                           \
							count = p01 * (t[TAP_PAD_HI] - t[TAP_PAD_LO]);                                   \
						yr[o2] = count ? (T)((double)yr[o2] / (double)count) : 0;                            \
					}                                                                                        \
				}                                                                                            \
			}                                                                                                \
		}                                                                                                    \
	} \
	TERN_ISA_VARIANTS3(void, pool_plane_##S, (const pool_params *pp, const T *x, T *y, int64_t *ind, int64_t base), (pp, x, y, ind, base))

DEF_POOL_PLANE(f32, float, -INFINITY)
DEF_POOL_PLANE(f64, double, -INFINITY)
DEF_POOL_PLANE(i8, int8_t, INT8_MIN)
DEF_POOL_PLANE(u8, uint8_t, 0)

/* Global pools reduce a whole plane. */
#define DEF_GLOBAL_PLANE(S, T)                                                                 \
	TERN_ISA_BODY void global_plane_##S##_body(const pool_params *pp, const T *x, T *y, int64_t n)          \
	{                                                                                       \
		if (pp->kind == POOL_MAX) {                                                         \
			T best = x[0];                                                                  \
			for (int64_t i = 1; i < n; i++)                                                 \
				best = x[i] > best ? x[i] : best;                                           \
			*y = best;                                                                      \
			return;                                                                         \
		}                                                                                   \
		if (pp->kind == POOL_AVG) {                                                         \
			*y = (T)(sum_##S(x, n) / (double)n);                                            \
			return;                                                                         \
		}                                                                                   \
		double sum = 0;                                                                     \
		for (int64_t i = 0; i < n; i++)                                                     \
			sum += pp->p == 2 ? (double)x[i] * x[i] : pow(fabs((double)x[i]), (double)pp->p); \
		*y = (T)(pp->p == 2 ? sqrt(sum) : pow(sum, 1.0 / (double)pp->p));                   \
	} \
	TERN_ISA_VARIANTS3(void, global_plane_##S, (const pool_params *pp, const T *x, T *y, int64_t n), (pp, x, y, n))

DEF_GLOBAL_PLANE(f32, float)
DEF_GLOBAL_PLANE(f64, double)
DEF_GLOBAL_PLANE(i8, int8_t)
DEF_GLOBAL_PLANE(u8, uint8_t)

static void pool_planes(void *ctx, int64_t begin, int64_t end)
{
	const pool_ctx *c = ctx;
	const pool_params *pp = c->pp;
	int64_t in_n = sp_numel(pp->w.in), out_n = pp->global ? 1 : sp_numel(pp->w.out);
	for (int64_t i = begin; i < end; i++) {
		int64_t *ind = c->ind ? c->ind + i * out_n : NULL;
#define POOL_CASE(S, T)                                              \
	{                                                                \
		const T *x = (const T *)c->x + i * in_n;                     \
		T *y = (T *)c->y + i * out_n;                                \
		if (pp->global)                                              \
			global_plane_##S(pp, x, y, in_n);                        \
		else                                                         \
			pool_plane_##S(pp, x, y, ind, i * in_n);                 \
		break;                                                       \
	}
		switch (c->dtype) {
		case TERN_FLOAT: POOL_CASE(f32, float)
		case TERN_DOUBLE: POOL_CASE(f64, double)
		case TERN_INT8: POOL_CASE(i8, int8_t)
		case TERN_UINT8: POOL_CASE(u8, uint8_t)
		}
#undef POOL_CASE
	}
}

static tern_status pool_kernel(const tern_kernel_args *a)
{
	const pool_params *pp = a->params;
	pool_ctx c = {pp, a->in[0]->dtype, a->in[0]->data, a->out[0]->data,
	              a->n_out > 1 && a->out[1] ? a->out[1]->data : NULL};
	if (pp->blocks) {
		wb_job j = {&pp->w, pp->kind == POOL_MAX ? WB_MAX : WB_AVG, a->in[0]->dims[0], a->in[0]->dims[1], pp->band,
		            pp->slot_elems, a->in[0]->data, NULL, NULL, pp->recip, a->out[0]->data, a->scratch, NULL, NULL};
		tern_nn_wb_run(a->pool, &j, pp->slots);
		return TERN_OK;
	}
	int64_t work = pp->global ? sp_numel(pp->w.in) : sp_numel(pp->w.out) * sp_numel(pp->w.k);
	parallel_range(a->pool, pp->planes, grain_for(work), pool_planes, &c);
	return TERN_OK;
}

static void pool_params_free(void *p)
{
	pool_params *pp = p;
	if (pp) {
		free(pp->taps[0]);
		free(pp->recip);
	}
	free(pp);
}

/* Whether max or average pooling goes by blocks of channels (float, no indices output, every window
 * with an input element); then its plan and scratch, and for the average the divisors. */
static tern_status pool_blocks_setup(tern_prepare_args *p, pool_params *pp)
{
	const window *w = &pp->w;
	int dtype = p->in[0]->dtype;
	if (pp->global || (pp->kind != POOL_MAX && pp->kind != POOL_AVG) || dtype == TERN_DOUBLE ||
	    dtype == TERN_INT8 || dtype == TERN_UINT8 || (p->n_out > 1 && p->out[1]) ||
	    !tern_nn_wb_plan(w, &pp->band, &pp->slot_elems))
		return TERN_OK;
	for (int i = 1; i < SP; i++)
		for (int64_t o = 0; o < w->out[i]; o++)
			if (pp->taps[i][o * TAP_FIELDS + TAP_HI] <= pp->taps[i][o * TAP_FIELDS + TAP_LO])
				return TERN_OK;
	if (pp->kind == POOL_AVG) {
		if (!(pp->recip = malloc((size_t)(w->out[1] * w->out[2]) * sizeof *pp->recip)))
			return no_memory(p->node);
		int lo = pp->count_include_pad ? TAP_PAD_LO : TAP_LO, hi = pp->count_include_pad ? TAP_PAD_HI : TAP_HI;
		for (int64_t o1 = 0; o1 < w->out[1]; o1++)
			for (int64_t o2 = 0; o2 < w->out[2]; o2++) {
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, *t2 = pp->taps[2] + o2 * TAP_FIELDS;
				pp->recip[o1 * w->out[2] + o2] = (float)(1.0 / (double)((t1[hi] - t1[lo]) * (t2[hi] - t2[lo])));
			}
	}
	pp->blocks = true;
	pp->slots = slots_for(p->pool);
	p->scratch_bytes = (size_t)(pp->slots * pp->slot_elems) * sizeof(float);
	return TERN_OK;
}

static tern_status pool_taps(const tern_node *node, pool_params *pp)
{
	const window *w = &pp->w;
	int64_t *t = malloc(((size_t)(w->out[0] + w->out[1] + w->out[2]) * TAP_FIELDS + 2 * (size_t)w->k[2]) * sizeof *t);
	if (!t)
		return no_memory(node);
	for (int i = 0; i < SP; i++) {
		pp->taps[i] = t;
		for (int64_t o = 0; o < w->out[i]; o++, t += TAP_FIELDS) {
			int64_t start = o * w->s[i] - w->pb[i];
			taps_within(start, w->k[i], w->d[i], 0, w->in[i], &t[TAP_LO], &t[TAP_HI]);
			taps_within(start, w->k[i], w->d[i], -w->pb[i], w->in[i] + w->pe[i], &t[TAP_PAD_LO], &t[TAP_PAD_HI]);
		}
	}
	pp->rows2 = t;
	for (int64_t k = 0; k < w->k[2]; k++)
		outputs_within(k * w->d[2] - w->pb[2], w->s[2], w->in[2], w->out[2], &t[2 * k], &t[2 * k + 1]);
	return TERN_OK;
}

/* The parameters of a pool over input x (into p->params) and its output's shape (dims). */
static tern_status pool_plan(tern_prepare_args *p, const tern_tensor *x, pool_kind kind, bool global, int64_t *dims)
{
	const tern_node *node = p->node;
	bool int8 = x->dtype == TERN_INT8 || x->dtype == TERN_UINT8;
	tern_status st = int8 && kind == POOL_MAX && !global ? TERN_OK : check_real(node, x, 0);
	if (!st)
		st = check_rank(node, x, 0, 3, SP + 2);
	if (st)
		return st;
	pool_params *pp = calloc(1, sizeof *pp);
	if (!pp)
		return no_memory(node);
	p->params = pp;
	p->free_params = pool_params_free;
	pp->kind = kind;
	pp->global = global;
	pp->planes = x->dims[0] * x->dims[1];
	pp->p = tern_attr_int(node, "p", 2);
	if (kind == POOL_LP && pp->p < 1)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'p' = %lld must be at least 1", (long long)pp->p);
	dims[0] = x->dims[0];
	dims[1] = x->dims[1];
	if (global) {
		window_init(&pp->w, x->rank - 2);
		for (int i = 0; i < x->rank - 2; i++) {
			pp->w.in[SP - (x->rank - 2) + i] = x->dims[2 + i];
			dims[2 + i] = 1;
		}
	} else {
		if ((st = tern_nn_window_read(node, x, NULL, &pp->w)))
			return st;
		int64_t ceil_mode = tern_attr_int(node, "ceil_mode", 0);
		if ((st = tern_nn_window_forward(node, &pp->w, ceil_mode != 0)))
			return st;
		for (int i = 0; i < pp->w.nsp; i++)
			dims[2 + i] = pp->w.out[SP - pp->w.nsp + i];
		if ((st = pool_taps(node, pp)))
			return st;
		pp->count_include_pad = tern_attr_int(node, "count_include_pad", 0) != 0;
		int64_t order = tern_attr_int(node, "storage_order", 0);
		if (order != 0 && order != 1)
			return tern_node_errorf(node, TERN_EDATA, "attribute 'storage_order' = %lld must be 0 or 1", (long long)order);
		pp->column_major = order == 1;
	}
	if (tern_numel(x->rank, x->dims) == 0 && global)
		return tern_node_errorf(node, TERN_EDATA, "global pooling of an empty input");
	return TERN_OK;
}

static tern_status pool_setup(tern_prepare_args *p, pool_kind kind, bool global)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	int64_t dims[TERN_MAX_RANK];
	tern_status st = pool_plan(p, x, kind, global, dims);
	if (st)
		return st;
	pool_params *pp = p->params;
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	if (p->n_out > 1 && p->out[1]) {
		if (kind != POOL_MAX)
			return tern_node_errorf(node, TERN_EDATA, "only MaxPool has an indices output");
		tern_set_shape(p->out[1], TERN_INT64, x->rank, dims);
	}
	if ((st = pool_blocks_setup(p, pp)))
		return st;
	p->kernel = pool_kernel;
	return tern_nn_stage_halves(p);
}

static tern_status maxpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_MAX, false); }
static tern_status avgpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_AVG, false); }
static tern_status lppool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_LP, false); }
static tern_status global_maxpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_MAX, true); }
static tern_status global_avgpool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_AVG, true); }
static tern_status global_lppool_prepare(tern_prepare_args *p) { return pool_setup(p, POOL_LP, true); }

/* ---------------------------------------------------------------- MaxUnpool */

typedef struct unpool_params {
	int rank;
	int64_t full[TERN_MAX_RANK]; /* the shape the indices address: MaxPool's input */
} unpool_params;

static tern_status max_unpool_kernel(const tern_kernel_args *a)
{
	const unpool_params *up = a->params;
	const tern_tensor *x = a->in[0], *ind = a->in[1];
	tern_tensor *y = a->out[0];
	size_t es = tern_dtype_size(x->dtype);
	memset(y->data, 0, y->nbytes);
	int64_t n = tern_tensor_numel(x), total = tern_numel(up->rank, up->full);
	for (int64_t i = 0; i < n; i++) {
		int64_t at = tern_tensor_get_i64(ind, i);
		if (at < 0 || at >= total)
			return tern_node_errorf(a->node, TERN_EDATA, "index %lld at position %lld is outside [0, %lld)",
			                        (long long)at, (long long)i, (long long)total);
		/* The index addresses the unpooled shape; an explicit output shape holds it at its origin. */
		int64_t off = 0, stride = 1, rest = at;
		bool inside = true;
		for (int d = up->rank - 1; d >= 0; d--) {
			int64_t c = rest % up->full[d];
			rest /= up->full[d];
			inside &= c < y->dims[d];
			off += c * stride;
			stride *= y->dims[d];
		}
		if (inside)
			memcpy((char *)y->data + (size_t)off * es, (const char *)x->data + (size_t)i * es, es);
	}
	return TERN_OK;
}

static tern_status max_unpool_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *ind = p->in[1], *shape = p->n_in > 2 ? p->in[2] : NULL;
	tern_status st = check_rank(node, x, 0, 3, SP + 2);
	if (st)
		return st;
	if (ind->dtype != TERN_INT64 || tern_tensor_numel(ind) != tern_tensor_numel(x))
		return tern_node_errorf(node, TERN_EDATA, "input 1 'I' must be int64 with the shape of input 0");
	if (shape && !shape->data) {
		p->defer = 1;
		return TERN_OK;
	}
	window w;
	if ((st = tern_nn_window_read(node, x, NULL, &w)))
		return st;
	unpool_params *up = calloc(1, sizeof *up);
	if (!up)
		return no_memory(node);
	p->params = up;
	p->free_params = free;
	up->rank = x->rank;
	up->full[0] = x->dims[0];
	up->full[1] = x->dims[1];
	for (int i = 0; i < w.nsp; i++) {
		int j = SP - w.nsp + i;
		up->full[2 + i] = (w.in[j] - 1) * w.s[j] - w.pb[j] - w.pe[j] + w.k[j];
	}
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, up->full, sizeof dims);
	if (shape) {
		if (tern_tensor_numel(shape) != x->rank)
			return tern_node_errorf(node, TERN_EDATA, "input 2 'output_shape' has %lld values for rank %d",
			                        (long long)tern_tensor_numel(shape), x->rank);
		for (int d = 0; d < x->rank; d++)
			dims[d] = tern_tensor_get_i64(shape, d);
	}
	for (int d = 0; d < x->rank; d++)
		if (dims[d] < 0 || up->full[d] < 0)
			return tern_node_errorf(node, TERN_EDATA, "output dimension %d is negative", d);
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	p->kernel = max_unpool_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- gradients */

#define MPG_BLOCK 64 /* outputs of a row that MaxPool's gradient follows together */
#define MPG_L(T) (int)(64 / sizeof(T)) /* outputs of a row held in one vector, over at most MPG_TAPS taps along the row */
#define MPG_TAPS 16
#define MPG_CHAINS 4 /* vectors of outputs followed together */
#define MPG_ROWS 64 /* and at most this many kernel rows */

typedef struct pool_grad_ctx {
	const pool_params *pp;
	int dtype;
	const void *dy, *x;
	void *dx;
} pool_grad_ctx;

/* The argmax over rows[0 .. nr) and taps [0, nk) along the row of MPG_CHAINS vectors of outputs (64
 * bytes each) starting at outputs c0[c], from the phase-split rows xt[rows[i] * rs + phq[k2] + c0[c] +
 * j], into out[c][j]: the forward's first maximum (-1: none). The
 * target is on the function itself, so that its vectors are lowered for it. */
#define MPG_CHUNK_DEF(S, T, IT, SUF, TARGET)                                                              \
	TARGET static void mpg_chunk_##S##_##SUF(const T *xt, const int64_t *rows, int nr, const int64_t *phq,  \
	                                         int nk, int64_t rs, const int64_t *c0, IT base0, IT W, IT d, \
	                                         IT st, IT *out)                                             \
	{                                                                                                    \
		static const IT lanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};               \
		mpg_vi_##S iota, at[MPG_CHAINS], ci[MPG_CHAINS];                                                 \
		mpg_vt_##S best[MPG_CHAINS];                                                                     \
		memcpy(&iota, lanes, sizeof iota);                                                               \
		iota = iota * st;                                                                                \
		for (int c = 0; c < MPG_CHAINS; c++) {                                                           \
			best[c] = (mpg_vt_##S){0};                                                                   \
			at[c] = best[c] > best[c];                                                                   \
			at[c] = at[c] - 1;                                                                           \
			ci[c] = iota + (IT)c0[c] * st + base0;                                                       \
		}                                                                                                \
		for (int i = 0; i < nr; i++) {                                                                   \
			const T *xr = xt + rows[i] * rs;                                                             \
			IT rb = (IT)rows[i] * W;                                                                     \
			for (int k2 = 0; k2 < nk; k2++) {                                                            \
				IT b = rb + (IT)k2 * d;                                                                  \
				for (int c = 0; c < MPG_CHAINS; c++) {                                                   \
					mpg_vt_##S v;                                                                        \
					memcpy(&v, xr + phq[k2] + c0[c], sizeof v);                                          \
					mpg_vi_##S take = (v > best[c]) | (at[c] < 0);                                       \
					best[c] = (mpg_vt_##S)(((mpg_vi_##S)v & take) | ((mpg_vi_##S)best[c] & ~take));      \
					at[c] = ((ci[c] + b) & take) | (at[c] & ~take);                                      \
				}                                                                                        \
			}                                                                                            \
		}                                                                                                \
		memcpy(out, at, sizeof at);                                                                      \
	}

/* One (n, c) plane of a pool's data gradient. MaxPool's: each output's gradient goes to its window's
 * first maximum in scan order, the element the forward picked (PyTorch's rule). AveragePool's: each
 * output's gradient over the forward's divisor goes to every element of its window inside the input. */
#define DEF_POOL_GRAD(S, T, IT)                                                                          \
	typedef T mpg_vt_##S __attribute__((vector_size(64)));                                                \
	typedef IT mpg_vi_##S __attribute__((vector_size(64)));                                               \
	/* n outputs' best so far and its position against their elements xs[j * st], at base + j * st: the \
	 * forward's first maximum (strictly greater, or the first element seen) */                         \
	static inline __attribute__((always_inline)) void argmax_step_##S(const T *restrict xs, T *restrict best, \
	                                                                  int32_t *restrict at, int32_t n,   \
	                                                                  int32_t base, int32_t st)          \
	{                                                                                                    \
		if (st == 1)                                                                                     \
			for (int32_t j = 0; j < n; j++) {                                                            \
				T v = xs[j];                                                                             \
				int take = (v > best[j]) | (at[j] < 0);                                                  \
				best[j] = take ? v : best[j];                                                            \
				at[j] = take ? base + j : at[j];                                                         \
			}                                                                                            \
		else                                                                                             \
			for (int32_t j = 0; j < n; j++) {                                                            \
				T v = xs[j * st];                                                                        \
				int take = (v > best[j]) | (at[j] < 0);                                                  \
				best[j] = take ? v : best[j];                                                            \
				at[j] = take ? base + j * st : at[j];                                                    \
			}                                                                                            \
	}                                                                                                    \
	/* the same against contiguous elements xs[j], at base + j * ps */                                   \
	static inline __attribute__((always_inline)) void argmax_stepc_##S(const T *restrict xs, T *restrict best, \
	                                                                   int32_t *restrict at, int32_t n,  \
	                                                                   int32_t base, int32_t ps)         \
	{                                                                                                    \
		for (int32_t j = 0; j < n; j++) {                                                                \
			T v = xs[j];                                                                                 \
			int take = (v > best[j]) | (at[j] < 0);                                                      \
			best[j] = take ? v : best[j];                                                                \
			at[j] = take ? base + j * ps : at[j];                                                        \
		}                                                                                                \
	}                                                                                                    \
	/* MPG_CHAINS vectors of outputs of one row (see MPG_CHUNK_DEF), by the machine's vectors */        \
	MPG_CHUNK_DEF(S, T, IT, avx512, TERN_TARGET_AVX512)                                                 \
	MPG_CHUNK_DEF(S, T, IT, avx2, TERN_TARGET_AVX2)                                                     \
	MPG_CHUNK_DEF(S, T, IT, generic, )                                                                  \
	static void mpg_chunk_##S(const T *xt, const int64_t *rows, int nr, const int64_t *phq, int nk,      \
	                          int64_t rs, const int64_t *c0, IT base0, IT W, IT d, IT st, IT *out)       \
	{                                                                                                    \
		if (tern_isa() == TERN_ISA_AVX512)                                                               \
			mpg_chunk_##S##_avx512(xt, rows, nr, phq, nk, rs, c0, base0, W, d, st, out);                     \
		else if (tern_isa() == TERN_ISA_AVX2)                                                            \
			mpg_chunk_##S##_avx2(xt, rows, nr, phq, nk, rs, c0, base0, W, d, st, out);                       \
		else                                                                                             \
			mpg_chunk_##S##_generic(xt, rows, nr, phq, nk, rs, c0, base0, W, d, st, out);                    \
	}                                                                                                    \
	TERN_ISA_BODY void max_grad_plane_##S##_body(const pool_params *pp, const T *x, const T *dy, T *dx,     \
	                                             T *xt)                                                  \
	{                                                                                                    \
		const window *w = &pp->w;                                                                        \
		int64_t in_n = sp_numel(w->in), o = 0;                                                           \
		/* with a stride along the row (xt given): the plane's rows split by phase, xt[(r * st + p) * mw \
		 * + m] = x[r * W + p + st * m], so that each tap reads contiguous elements */                   \
		int64_t st2 = w->s[2], W = w->in[2], mw = (W + st2 - 1) / st2;                                   \
		if (xt && !pp->global) {                                                                         \
			int64_t rows = w->in[0] * w->in[1];                                                          \
			for (int64_t r = 0; r < rows && st2 == 2; r++) {                                             \
				const T *restrict src = x + r * W;                                                       \
				T *restrict d0 = xt + 2 * r * mw, *restrict d1 = d0 + mw;                                \
				for (int64_t m = 0; m < W / 2; m++) {                                                    \
					d0[m] = src[2 * m];                                                                  \
					d1[m] = src[2 * m + 1];                                                              \
				}                                                                                        \
				if (W & 1) {                                                                             \
					d0[mw - 1] = src[W - 1];                                                             \
					d1[mw - 1] = 0;                                                                      \
				}                                                                                        \
			}                                                                                            \
			for (int64_t r = 0; r < rows && st2 != 2; r++)                                               \
				for (int64_t ph = 0; ph < st2; ph++) {                                                   \
					const T *src = x + r * W + ph;                                                       \
					T *restrict dst = xt + (r * st2 + ph) * mw;                                          \
					int64_t m = 0, cnt = (W - ph + st2 - 1) / st2;                                       \
					for (; m < cnt; m++)                                                                 \
						dst[m] = src[m * st2];                                                           \
					for (; m < mw; m++)                                                                  \
						dst[m] = 0;                                                                      \
				}                                                                                        \
		}                                                                                                \
		memset(dx, 0, (size_t)in_n * sizeof *dx);                                                        \
		if (pp->global) {                                                                                \
			int64_t at = 0;                                                                              \
			for (int64_t i = 1; i < in_n; i++)                                                           \
				at = x[i] > x[at] ? i : at;                                                              \
			dx[at] = dy[0];                                                                              \
			return;                                                                                      \
		}                                                                                                \
		/* a block of outputs of one row at a time, tap by tap in the forward's order, each output      \
		 * keeping its best so far: vectors along the row. With xt and at most MPG_TAPS taps along the  \
		 * row, the outputs [ilo, ihi) whose every tap along the row is inside the input go by groups  \
		 * of MPG_CHAINS vectors held in registers (the last vector overlapping the one before), the    \
		 * few others one by one. */                                                                     \
		int64_t ilo = 0, ihi = w->out[2], phq[MPG_TAPS], rows[MPG_ROWS];                                 \
		for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                                       \
			ilo = pp->rows2[2 * k2] > ilo ? pp->rows2[2 * k2] : ilo;                                     \
			ihi = pp->rows2[2 * k2 + 1] < ihi ? pp->rows2[2 * k2 + 1] : ihi;                             \
		}                                                                                                \
		bool fast = xt && !pp->global && w->k[2] <= MPG_TAPS && w->k[0] * w->k[1] <= MPG_ROWS && ihi - ilo >= MPG_L(T);                     \
		if (fast)                                                                                        \
			for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                                   \
				int64_t off = k2 * w->d[2] - w->pb[2], ph = ((off % st2) + st2) % st2;                   \
				phq[k2] = ph * mw + (off - ph) / st2;                                                    \
			}                                                                                            \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                     \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];            \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++, o += w->out[2]) {                                 \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];         \
				for (int seg = 0; seg < 3; seg++) {                                                      \
					int64_t r0 = !fast ? (seg ? 0 : 0) : seg == 0 ? 0 : seg == 1 ? ilo : ihi;           \
					int64_t r1 = !fast ? (seg ? 0 : w->out[2]) : seg == 0 ? ilo : seg == 1 ? ihi : w->out[2]; \
					if (fast && seg == 1) {                                                              \
						int nr = 0;                                                                      \
						for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                             \
							for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++, nr++)                   \
								rows[nr] = (s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1];          \
						for (int64_t g0 = r0; g0 < r1; g0 += MPG_CHAINS * MPG_L(T)) {                    \
							int64_t c0[MPG_CHAINS], j0[MPG_CHAINS];                                      \
							for (int c = 0; c < MPG_CHAINS; c++) {                                       \
								int64_t j = g0 + c * MPG_L(T);                                           \
								j0[c] = j < r1 ? j : r1;                                                 \
								c0[c] = j + MPG_L(T) <= r1 ? j : r1 - MPG_L(T);                          \
							}                                                                            \
							IT ats[MPG_CHAINS][MPG_L(T)];                                                \
							mpg_chunk_##S(xt, rows, nr, phq, (int)w->k[2], st2 * mw, c0,                 \
							              (IT)(-w->pb[2]), (IT)W, (IT)w->d[2], (IT)st2, ats[0]);         \
							for (int c = 0; c < MPG_CHAINS; c++)                                         \
								for (int64_t j = j0[c] - c0[c]; j < MPG_L(T); j++)                       \
									if (ats[c][j] >= 0)                                                  \
										dx[ats[c][j]] += dy[o + c0[c] + j];                              \
						}                                                                                \
						continue;                                                                        \
					}                                                                                    \
					if (fast) { /* the few outputs near the row's ends, one by one */                    \
						for (int64_t o2 = r0; o2 < r1; o2++) {                                           \
							const int64_t *t2 = pp->taps[2] + o2 * TAP_FIELDS, s2 = o2 * st2 - w->pb[2]; \
							T bv = 0;                                                                    \
							int64_t ba = -1;                                                             \
							for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                         \
								for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                   \
									int64_t rw = ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * W + s2; \
									for (int64_t k2 = t2[TAP_LO]; k2 < t2[TAP_HI]; k2++) {               \
										T v = x[rw + k2 * w->d[2]];                                      \
										if (v > bv || ba < 0) {                                          \
											bv = v;                                                      \
											ba = rw + k2 * w->d[2];                                      \
										}                                                                \
									}                                                                    \
								}                                                                        \
							if (ba >= 0)                                                                 \
								dx[ba] += dy[o + o2];                                                    \
						}                                                                                \
						continue;                                                                        \
					}                                                                                    \
				for (int64_t b0 = r0; b0 < r1; b0 += MPG_BLOCK) {                                        \
					int64_t b1 = b0 + MPG_BLOCK < r1 ? b0 + MPG_BLOCK : r1;                              \
					T best[MPG_BLOCK];                                                                   \
					int32_t at[MPG_BLOCK];                                                               \
					for (int64_t j = 0; j < b1 - b0; j++) {                                              \
						best[j] = 0;                                                                     \
						at[j] = -1;                                                                      \
					}                                                                                    \
					for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                                 \
						for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                           \
							int64_t row = ((s0 + k0 * w->d[0]) * w->in[1] + s1 + k1 * w->d[1]) * w->in[2]; \
							for (int64_t k2 = 0; k2 < w->k[2]; k2++) {                                   \
								int64_t lo = pp->rows2[2 * k2], hi = pp->rows2[2 * k2 + 1];              \
								lo = lo > b0 ? lo : b0;                                                  \
								hi = hi < b1 ? hi : b1;                                                  \
								int32_t st = (int32_t)w->s[2], base = (int32_t)(row + k2 * w->d[2] - w->pb[2] + lo * st); \
								if (lo >= hi)                                                            \
									continue;                                                            \
								if (xt && !pp->global) {                                                 \
									int64_t off = k2 * w->d[2] - w->pb[2], ph = ((off % st2) + st2) % st2; \
									int64_t q = (off - ph) / st2, r = row / W;                           \
									argmax_stepc_##S(xt + (r * st2 + ph) * mw + lo + q, best + (lo - b0), at + (lo - b0), \
									                 (int32_t)(hi - lo), base, st);                      \
								} else                                                                   \
									argmax_step_##S(x + base, best + (lo - b0), at + (lo - b0), (int32_t)(hi - lo), base, st); \
							}                                                                            \
						}                                                                                \
					for (int64_t j = 0; j < b1 - b0; j++)                                                \
						if (at[j] >= 0)                                                                  \
							dx[at[j]] += dy[o + b0 + j];                                                 \
				}                                                                                        \
				}                                                                                        \
			}                                                                                            \
		}                                                                                                \
	}                                                                                                    \
	TERN_ISA_VARIANTS3(void, max_grad_plane_##S, (const pool_params *pp, const T *x, const T *dy, T *dx, T *xt), \
	                   (pp, x, dy, dx, xt))                                                              \
	TERN_ISA_BODY void avg_grad_plane_##S##_body(const pool_params *pp, const T *dy, T *dx)                  \
	{                                                                                                    \
		const window *w = &pp->w;                                                                        \
		int64_t in_n = sp_numel(w->in), o = 0;                                                           \
		if (pp->global) {                                                                                \
			T v = (T)((double)dy[0] / (double)in_n);                                                     \
			for (int64_t i = 0; i < in_n; i++)                                                           \
				dx[i] = v;                                                                               \
			return;                                                                                      \
		}                                                                                                \
		memset(dx, 0, (size_t)in_n * sizeof *dx);                                                        \
		for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                     \
			const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];            \
			for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                 \
				const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];         \
				int64_t n01 = (t0[TAP_HI] - t0[TAP_LO]) * (t1[TAP_HI] - t1[TAP_LO]);                     \
				int64_t p01 = (t0[TAP_PAD_HI] - t0[TAP_PAD_LO]) * (t1[TAP_PAD_HI] - t1[TAP_PAD_LO]);     \
				for (int64_t o2 = 0; o2 < w->out[2]; o2++, o++) {                                        \
					const int64_t *t2 = pp->taps[2] + o2 * TAP_FIELDS, s2 = o2 * w->s[2] - w->pb[2];     \
					int64_t count = pp->count_include_pad ? p01 * (t2[TAP_PAD_HI] - t2[TAP_PAD_LO])      \
					                                      : n01 * (t2[TAP_HI] - t2[TAP_LO]);             \
					if (!count)                                                                          \
						continue;                                                                        \
					T v = (T)((double)dy[o] / (double)count);                                            \
					for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++) {                               \
						int64_t i0 = s0 + k0 * w->d[0];                                                  \
						for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                           \
							T *row = dx + (i0 * w->in[1] + s1 + k1 * w->d[1]) * w->in[2] + s2;           \
							for (int64_t k2 = t2[TAP_LO]; k2 < t2[TAP_HI]; k2++)                         \
								row[k2 * w->d[2]] += v;                                                  \
						}                                                                                \
					}                                                                                    \
				}                                                                                        \
			}                                                                                            \
		}                                                                                                \
	}                                                                                                    \
	TERN_ISA_VARIANTS3(void, avg_grad_plane_##S, (const pool_params *pp, const T *dy, T *dx), (pp, dy, dx)) \
	/* LpPool's: y = (sum |x|^p)^(1/p) over the window, so each element of the window gets dY times    \
	 * sign(x) |x|^(p-1) / y^(p-1) (nothing where y is 0). */                                          \
	static void lp_grad_plane_##S(const pool_params *pp, const T *x, const T *dy, T *dx)                 \
	{                                                                                                    \
		const window *w = &pp->w;                                                                        \
		int64_t in_n = sp_numel(w->in), o = 0;                                                           \
		double p = (double)pp->p;                                                                        \
		memset(dx, 0, (size_t)in_n * sizeof *dx);                                                        \
		for (int64_t o0 = 0; o0 < (pp->global ? 1 : w->out[0]); o0++) {                                  \
			const int64_t *t0 = pp->global ? NULL : pp->taps[0] + o0 * TAP_FIELDS;                       \
			int64_t s0 = o0 * w->s[0] - w->pb[0];                                                        \
			for (int64_t o1 = 0; o1 < (pp->global ? 1 : w->out[1]); o1++) {                              \
				const int64_t *t1 = pp->global ? NULL : pp->taps[1] + o1 * TAP_FIELDS;                   \
				int64_t s1 = o1 * w->s[1] - w->pb[1];                                                    \
				for (int64_t o2 = 0; o2 < (pp->global ? 1 : w->out[2]); o2++, o++) {                     \
					const int64_t *t2 = pp->global ? NULL : pp->taps[2] + o2 * TAP_FIELDS;               \
					int64_t s2 = o2 * w->s[2] - w->pb[2];                                                \
					int64_t l0 = t0 ? t0[TAP_LO] : 0, h0 = t0 ? t0[TAP_HI] : w->in[0];                   \
					int64_t l1 = t1 ? t1[TAP_LO] : 0, h1 = t1 ? t1[TAP_HI] : w->in[1];                   \
					int64_t l2 = t2 ? t2[TAP_LO] : 0, h2 = t2 ? t2[TAP_HI] : w->in[2];                   \
					int64_t d0 = pp->global ? 1 : w->d[0], d1 = pp->global ? 1 : w->d[1];               \
					int64_t d2 = pp->global ? 1 : w->d[2];                                               \
					if (pp->global)                                                                      \
						s0 = s1 = s2 = 0;                                                                \
					double sum = 0;                                                                      \
					for (int64_t k0 = l0; k0 < h0; k0++)                                                 \
						for (int64_t k1 = l1; k1 < h1; k1++)                                             \
							for (int64_t k2 = l2; k2 < h2; k2++) {                                       \
								double v = fabs((double)x[((s0 + k0 * d0) * w->in[1] + s1 + k1 * d1) * w->in[2] + s2 + k2 * d2]); \
								sum += pp->p == 2 ? v * v : pow(v, p);                                   \
							}                                                                            \
					double y = pp->p == 2 ? sqrt(sum) : pow(sum, 1.0 / p);                               \
					if (y == 0)                                                                          \
						continue;                                                                        \
					double scale = (double)dy[o] / (pp->p == 1 ? 1.0 : pp->p == 2 ? y : pow(y, p - 1));  \
					for (int64_t k0 = l0; k0 < h0; k0++)                                                 \
						for (int64_t k1 = l1; k1 < h1; k1++)                                             \
							for (int64_t k2 = l2; k2 < h2; k2++) {                                       \
								int64_t i = ((s0 + k0 * d0) * w->in[1] + s1 + k1 * d1) * w->in[2] + s2 + k2 * d2; \
								double v = (double)x[i], a = fabs(v);                                    \
								double g = pp->p == 1 ? (v > 0) - (v < 0) : pp->p == 2 ? v : (v < 0 ? -1 : 1) * pow(a, p - 1); \
								dx[i] += (T)(scale * g);                                                 \
							}                                                                            \
				}                                                                                        \
			}                                                                                            \
		}                                                                                                \
	}                                                                                                    \
	static void pool_grad_planes_##S(void *ctx, int64_t begin, int64_t end)                              \
	{                                                                                                    \
		const pool_grad_ctx *c = ctx;                                                                    \
		const pool_params *pp = c->pp;                                                                   \
		int64_t in_n = sp_numel(pp->w.in), out_n = pp->global ? 1 : sp_numel(pp->w.out);                \
		T *xt = NULL;                                                                                    \
		if (pp->kind == POOL_MAX && !pp->global && pp->w.s[2] > 1)                                       \
			xt = malloc((size_t)(pp->w.in[0] * pp->w.in[1] * pp->w.s[2] *                                 \
			                     ((pp->w.in[2] + pp->w.s[2] - 1) / pp->w.s[2])) * sizeof *xt);             \
		for (int64_t i = begin; i < end; i++) {                                                          \
			const T *dy = (const T *)c->dy + i * out_n;                                                  \
			T *dx = (T *)c->dx + i * in_n;                                                               \
			if (pp->kind == POOL_MAX)                                                                    \
				max_grad_plane_##S(pp, (const T *)c->x + i * in_n, dy, dx, xt);                          \
			else if (pp->kind == POOL_LP)                                                                \
				lp_grad_plane_##S(pp, (const T *)c->x + i * in_n, dy, dx);                               \
			else                                                                                         \
				avg_grad_plane_##S(pp, dy, dx);                                                          \
		}                                                                                                \
		free(xt);                                                                                        \
	}

DEF_POOL_GRAD(f32, float, int32_t)
DEF_POOL_GRAD(f64, double, int64_t)

/* MaxPool's gradient with windows that do not overlap, planes [begin, end): dX is zero but at each
 * window's first maximum in scan order (the forward's pick), which gets its output's gradient. The
 * 2 x 2 windows of stride 2 without padding (the usual downsampling) go two input rows at a time. */
#define DEF_MAX_GRAD_TILES(S, T)                                                                             \
	TERN_ISA_BODY void max_grad_tiles_##S##_body(const pool_params *pp, const T *x, const T *dy, T *dx,         \
	                                             int64_t planes)                                            \
	{                                                                                                       \
		const window *w = &pp->w;                                                                            \
		int64_t in_n = sp_numel(w->in), out_n = sp_numel(w->out), W = w->in[2];                             \
		bool pairs = w->k[0] == 1 && w->pb[0] == 0 && w->k[1] == 2 && w->k[2] == 2 && w->s[1] == 2 && w->s[2] == 2 &&         \
		             w->pb[1] == 0 && w->pb[2] == 0 && 2 * w->out[1] <= w->in[1] && 2 * w->out[2] <= W;     \
		for (int64_t i = 0; i < planes; i++, x += in_n, dy += out_n, dx += in_n) {                          \
			if (pairs) {                                                                                     \
				int64_t O1 = w->out[1], O2 = w->out[2];                                                      \
				memset(dx, 0, (size_t)in_n * sizeof *dx);                                                    \
				for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                 \
					const T *xp = x + o0 * w->s[0] * w->in[1] * W;                                           \
					T *dp = dx + o0 * w->s[0] * w->in[1] * W;                                                \
					const T *dyp = dy + o0 * O1 * O2;                                                        \
					for (int64_t o1 = 0; o1 < O1; o1++) {                                                    \
						const T *restrict r0 = xp + 2 * o1 * W, *restrict r1 = r0 + W;                       \
						T *restrict d0 = dp + 2 * o1 * W, *restrict d1 = d0 + W;                             \
						const T *restrict g = dyp + o1 * O2;                                                 \
						for (int64_t o2 = 0; o2 < O2; o2++) {                                                \
							T a = r0[2 * o2], b = r0[2 * o2 + 1], c = r1[2 * o2], d = r1[2 * o2 + 1];        \
							/* the first maximum: a later element wins only when strictly greater */       \
							bool tb = b > a;                                                                 \
							T m0 = tb ? b : a;                                                               \
							bool td = d > c;                                                                 \
							T m1 = td ? d : c;                                                               \
							bool bottom = m1 > m0;                                                           \
							T v = g[o2];                                                                     \
							d0[2 * o2] = !bottom && !tb ? v : 0;                                             \
							d0[2 * o2 + 1] = !bottom && tb ? v : 0;                                          \
							d1[2 * o2] = bottom && !td ? v : 0;                                              \
							d1[2 * o2 + 1] = bottom && td ? v : 0;                                           \
						}                                                                                    \
					}                                                                                        \
				}                                                                                            \
				continue;                                                                                    \
			}                                                                                                \
			memset(dx, 0, (size_t)in_n * sizeof *dx);                                                        \
			int64_t o = 0;                                                                                   \
			for (int64_t o0 = 0; o0 < w->out[0]; o0++) {                                                     \
				const int64_t *t0 = pp->taps[0] + o0 * TAP_FIELDS, s0 = o0 * w->s[0] - w->pb[0];            \
				for (int64_t o1 = 0; o1 < w->out[1]; o1++) {                                                 \
					const int64_t *t1 = pp->taps[1] + o1 * TAP_FIELDS, s1 = o1 * w->s[1] - w->pb[1];         \
					for (int64_t o2 = 0; o2 < w->out[2]; o2++, o++) {                                        \
						const int64_t *t2 = pp->taps[2] + o2 * TAP_FIELDS, s2 = o2 * w->s[2] - w->pb[2];     \
						T best = 0;                                                                          \
						int64_t at = -1;                                                                     \
						for (int64_t k0 = t0[TAP_LO]; k0 < t0[TAP_HI]; k0++)                                 \
							for (int64_t k1 = t1[TAP_LO]; k1 < t1[TAP_HI]; k1++) {                           \
								int64_t row = ((s0 + k0) * w->in[1] + s1 + k1) * W + s2;                     \
								for (int64_t k2 = t2[TAP_LO]; k2 < t2[TAP_HI]; k2++) {                       \
									T v = x[row + k2];                                                       \
									if (v > best || at < 0) {                                                \
										best = v;                                                            \
										at = row + k2;                                                       \
									}                                                                        \
								}                                                                            \
							}                                                                                \
						if (at >= 0)                                                                         \
							dx[at] = dy[o];                                                                  \
					}                                                                                        \
				}                                                                                            \
			}                                                                                                \
		}                                                                                                    \
	}                                                                                                        \
	TERN_ISA_VARIANTS3(void, max_grad_tiles_##S, (const pool_params *pp, const T *x, const T *dy, T *dx, int64_t planes), \
	                   (pp, x, dy, dx, planes))                                                              \
	static void max_grad_tile_planes_##S(void *ctx, int64_t begin, int64_t end)                              \
	{                                                                                                        \
		const pool_grad_ctx *c = ctx;                                                                        \
		const pool_params *pp = c->pp;                                                                       \
		int64_t in_n = sp_numel(pp->w.in), out_n = sp_numel(pp->w.out);                                      \
		max_grad_tiles_##S(pp, (const T *)c->x + begin * in_n, (const T *)c->dy + begin * out_n,              \
		                   (T *)c->dx + begin * in_n, end - begin);                                          \
	}

DEF_MAX_GRAD_TILES(f32, float)
DEF_MAX_GRAD_TILES(f64, double)

static tern_status pool_grad_kernel(const tern_kernel_args *a)
{
	const pool_params *pp = a->params;
	int dtype = a->in[0]->dtype;
	pool_grad_ctx c = {pp, dtype, a->in[0]->data, a->in[1]->data, a->out[0]->data};
	if (pp->tiles) {
		parallel_range(a->pool, pp->planes, grain_for(sp_numel(pp->w.in)),
		               dtype == TERN_DOUBLE ? max_grad_tile_planes_f64 : max_grad_tile_planes_f32, &c);
		return TERN_OK;
	}
	int64_t work = pp->global ? sp_numel(pp->w.in) : sp_numel(pp->w.out) * sp_numel(pp->w.k);
	parallel_range(a->pool, pp->planes, grain_for(work), dtype == TERN_DOUBLE ? pool_grad_planes_f64 : pool_grad_planes_f32,
	               &c);
	return TERN_OK;
}

/* The pool over x, checked against dY (input 0); dX gets x's shape. */
static tern_status pool_grad_setup(tern_prepare_args *p, const tern_tensor *x, pool_kind kind)
{
	int64_t dims[TERN_MAX_RANK];
	tern_status st = pool_plan(p, x, kind, tern_attr_int(p->node, "global", 0) != 0, dims);
	if (st)
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	if ((st = tern_nn_check_dy(p)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if (sp_numel(((pool_params *)p->params)->w.in) > INT32_MAX)
		return tern_node_errorf(p->node, TERN_EDATA, "planes of more than 2^31 elements are not supported");
	pool_params *pp = p->params;
	pp->tiles = kind == POOL_MAX && !pp->global;
	for (int i = 0; i < SP; i++)
		pp->tiles &= pp->w.d[i] == 1 && pp->w.s[i] >= pp->w.k[i];
	p->kernel = pool_grad_kernel;
	return tern_nn_stage_halves(p);
}

/* tern.MaxPoolGrad(dY, X) -> dX, with MaxPool's attributes (or global = 1: GlobalMaxPool's): dY onto
 * the argmax of each window, recomputed from X. */
static tern_status maxpool_grad_prepare(tern_prepare_args *p)
{
	tern_status st = check_real_same(p, 2);
	return st ? st : pool_grad_setup(p, p->in[1], POOL_MAX);
}

/* tern.LpPoolGrad(dY, X) -> dX, with LpPool's attributes (or global = 1: GlobalLpPool's): dY times
 * the derivative of each window's p-norm, recomputed from X. */
static tern_status lppool_grad_prepare(tern_prepare_args *p)
{
	tern_status st = check_real_same(p, 2);
	return st ? st : pool_grad_setup(p, p->in[1], POOL_LP);
}

/* tern.AveragePoolGrad(dY, x_shape) -> dX, with AveragePool's attributes (or global = 1:
 * GlobalAveragePool's): dY over each window's divisor, spread over the window. */
static tern_status avgpool_grad_prepare(tern_prepare_args *p)
{
	int rank = 0;
	int64_t dims[TERN_MAX_RANK];
	bool ready;
	tern_status st = check_real(p->node, p->in[0], 0);
	if (st || (st = tern_nn_shape_input(p, 1, &rank, dims, &ready)) || !ready)
		return st;
	tern_tensor x = tern_nn_shape_only(p->in[0]->dtype, rank, dims);
	return pool_grad_setup(p, &x, POOL_AVG);
}

static tern_status pool_grad_rule(tern_grad_ctx *g, bool max, bool global)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gattr at = TERN_GA_I("global", 1);
	tern_gval *in[2] = {g->dy[0], max ? g->x[0] : tern_nn_g_shape(g, g->x[0])};
	g->dx[0] = in[1] ? tern_g_op_like(g, "tern", max ? "MaxPoolGrad" : "AveragePoolGrad", in, 2, &at, global) : NULL;
	return tern_nn_g_done(g, 0);
}

/* LpPool and GlobalLpPool: tern.LpPoolGrad, from X. */
static tern_status lppool_grad_rule(tern_grad_ctx *g, bool global)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gattr at = TERN_GA_I("global", 1);
	tern_gval *in[2] = {g->dy[0], g->x[0]};
	g->dx[0] = tern_g_op_like(g, "tern", "LpPoolGrad", in, 2, &at, global);
	return tern_nn_g_done(g, 0);
}
static tern_status lppool_grad(tern_grad_ctx *g) { return lppool_grad_rule(g, false); }
static tern_status global_lppool_grad(tern_grad_ctx *g) { return lppool_grad_rule(g, true); }

/* MaxPool and GlobalMaxPool: tern.MaxPoolGrad (the Indices output carries no gradient). */
static tern_status maxpool_grad(tern_grad_ctx *g) { return pool_grad_rule(g, true, false); }
static tern_status global_maxpool_grad(tern_grad_ctx *g) { return pool_grad_rule(g, true, true); }
/* AveragePool and GlobalAveragePool: tern.AveragePoolGrad. */
static tern_status avgpool_grad(tern_grad_ctx *g) { return pool_grad_rule(g, false, false); }
static tern_status global_avgpool_grad(tern_grad_ctx *g) { return pool_grad_rule(g, false, true); }

/* ---------------------------------------------------------------- table */

/* ---------------------------------------------------------------- MaxRoiPool */

/* MaxRoiPool(X [N, C, H, W], rois [R, 5]) -> [R, C, ph, pw]: each RoI (batch index, x1, y1, x2, y2
 * in input coordinates times spatial_scale, rounded) split into ph x pw bins, a bin's maximum, 0 for
 * an empty bin: Caffe's RoI pooling, which ONNX and torchvision.ops.roi_pool follow. */
typedef struct roipool_params {
	int64_t ph, pw;
	float scale;
} roipool_params;

static tern_status roipool_kernel(const tern_kernel_args *a)
{
	const roipool_params *rp = a->params;
	const tern_tensor *x = a->in[0], *r = a->in[1];
	tern_tensor *y = a->out[0];
	int64_t n = x->dims[0], c = x->dims[1], h = x->dims[2], w = x->dims[3], nr = r->dims[0];
	bool f64 = x->dtype == TERN_DOUBLE;
	for (int64_t k = 0; k < nr; k++) {
		double roi[5];
		for (int j = 0; j < 5; j++)
			roi[j] = tern_tensor_get_f64(r, k * 5 + j);
		int64_t b = (int64_t)roi[0];
		if (b < 0 || b >= n)
			return tern_node_errorf(a->node, TERN_EDATA, "RoI %lld names image %lld of %lld", (long long)k,
			                        (long long)b, (long long)n);
		int64_t x1 = (int64_t)round(roi[1] * rp->scale), y1 = (int64_t)round(roi[2] * rp->scale);
		int64_t x2 = (int64_t)round(roi[3] * rp->scale), y2 = (int64_t)round(roi[4] * rp->scale);
		int64_t rw = x2 - x1 + 1 > 1 ? x2 - x1 + 1 : 1, rh = y2 - y1 + 1 > 1 ? y2 - y1 + 1 : 1;
		double bw = (double)rw / (double)rp->pw, bh = (double)rh / (double)rp->ph;
		for (int64_t ch = 0; ch < c; ch++) {
			int64_t plane = (b * c + ch) * h * w;
			for (int64_t i = 0; i < rp->ph; i++) {
				int64_t hs = (int64_t)floor((double)i * bh) + y1, he = (int64_t)ceil((double)(i + 1) * bh) + y1;
				hs = hs < 0 ? 0 : hs > h ? h : hs;
				he = he < 0 ? 0 : he > h ? h : he;
				for (int64_t j = 0; j < rp->pw; j++) {
					int64_t ws = (int64_t)floor((double)j * bw) + x1, we = (int64_t)ceil((double)(j + 1) * bw) + x1;
					ws = ws < 0 ? 0 : ws > w ? w : ws;
					we = we < 0 ? 0 : we > w ? w : we;
					double best = -INFINITY;
					bool empty = he <= hs || we <= ws;
					for (int64_t yy = hs; yy < he; yy++)
						for (int64_t xx = ws; xx < we; xx++) {
							double v = f64 ? ((const double *)x->data)[plane + yy * w + xx]
							               : ((const float *)x->data)[plane + yy * w + xx];
							best = v > best ? v : best;
						}
					int64_t o = ((k * c + ch) * rp->ph + i) * rp->pw + j;
					if (f64)
						((double *)y->data)[o] = empty ? 0 : best;
					else
						((float *)y->data)[o] = empty ? 0 : (float)best;
				}
			}
		}
	}
	return TERN_OK;
}

static tern_status roipool_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *r = p->n_in > 1 ? p->in[1] : NULL;
	tern_status st = check_real(node, x, 0);
	if (st)
		return st;
	if (x->rank != 4)
		return tern_node_errorf(node, TERN_EDATA, "X must be [N, C, H, W], not of rank %d", x->rank);
	if (!r || r->dtype != x->dtype || r->rank != 2 || r->dims[1] != 5)
		return tern_node_errorf(node, TERN_EDATA, "rois must be [num_rois, 5] of X's type");
	size_t n = 0;
	const int64_t *shape = tern_attr_ints(node, "pooled_shape", &n);
	if (!shape || n != 2 || shape[0] < 1 || shape[1] < 1)
		return tern_node_errorf(node, TERN_EDATA, "pooled_shape must be two positive ints");
	roipool_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return no_memory(node);
	rp->ph = shape[0];
	rp->pw = shape[1];
	rp->scale = tern_attr_float(node, "spatial_scale", 1.0f);
	int64_t dims[4] = {r->dims[0], x->dims[1], rp->ph, rp->pw};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	p->params = rp;
	p->free_params = free;
	p->kernel = roipool_kernel;
	return TERN_OK;
}

static const tern_op ops[] = {
	{"", "MaxPool", 1, 0, maxpool_prepare, TERN_DT_FLOATS | TERN_DT(INT8) | TERN_DT(UINT8), "pool", maxpool_grad},
	{"", "AveragePool", 1, 0, avgpool_prepare, TERN_DT_FLOATS, "pool", avgpool_grad},
	{"", "LpPool", 1, 0, lppool_prepare, TERN_DT_FLOATS, "pool", lppool_grad},
	{"", "GlobalMaxPool", 1, 0, global_maxpool_prepare, TERN_DT_FLOATS, "pool", global_maxpool_grad},
	{"", "GlobalAveragePool", 1, 0, global_avgpool_prepare, TERN_DT_FLOATS, "pool", global_avgpool_grad},
	{"", "GlobalLpPool", 1, 0, global_lppool_prepare, TERN_DT_FLOATS, "pool", global_lppool_grad},
	{"", "MaxUnpool", 9, 0, max_unpool_prepare, TERN_DT_FLOATS, "pool"},
	{"", "MaxRoiPool", 1, 0, roipool_prepare, TERN_DT(FLOAT) | TERN_DT(DOUBLE), "pool"},
	{"tern", "MaxPoolGrad", 1, 0, maxpool_grad_prepare, TERN_DT_FLOATS, "pool"},
	{"tern", "AveragePoolGrad", 1, 0, avgpool_grad_prepare, TERN_DT_FLOATS, "pool"},
	{"tern", "LpPoolGrad", 1, 0, lppool_grad_prepare, TERN_DT_FLOATS, "pool"},
};

const tern_op_table tern_ops_pool = {ops, TERN_ARRAY_LEN(ops)};
