/* reduce.c — reductions (Reduce*, ArgMax, ArgMin), running sums (CumSum), TopK, Det and tern.Inverse.
 * Reductions fold into float, double or int64 accumulators; other element types convert at the edges. */

/* Under GCC's default -ftrapping-math a float comparison may raise an exception, which keeps the
 * max/min folds from becoming vector selects; tern never reads the floating-point exception flags.
 * Set before the includes so that inline helpers from the headers still inline here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "internal.h"
#include "autodiff/grad.h"
#include "ops_common.h"

#include <math.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- element conversion */

static bool is_int_dtype(int dt)
{
	return dt != TERN_FLOAT && dt != TERN_DOUBLE && dt != TERN_FLOAT16 && dt != TERN_BFLOAT16;
}

/* Integers wrap to the destination width as a C conversion through uint64 does. */
static void store_i64(int dt, void *d, int64_t i, int64_t v)
{
	switch (dt) {
	case TERN_BOOL: ((uint8_t *)d)[i] = v != 0; break;
	case TERN_INT8:
	case TERN_UINT8: ((uint8_t *)d)[i] = (uint8_t)v; break;
	case TERN_INT16:
	case TERN_UINT16: ((uint16_t *)d)[i] = (uint16_t)v; break;
	case TERN_INT32:
	case TERN_UINT32: ((uint32_t *)d)[i] = (uint32_t)v; break;
	case TERN_INT64:
	case TERN_UINT64: ((int64_t *)d)[i] = v; break;
	default: tern_store_f64(dt, d, i, (double)v); break;
	}
}

/* dst[i] = src[i] between numeric dtypes; integer to integer stays exact through int64. */
static void convert(int sdt, const void *src, int ddt, void *dst, int64_t n)
{
	tern_tensor s = {.dtype = sdt, .data = (void *)src};
	if (is_int_dtype(sdt) && is_int_dtype(ddt))
		for (int64_t i = 0; i < n; i++)
			store_i64(ddt, dst, i, tern_tensor_get_i64(&s, i));
	else
		for (int64_t i = 0; i < n; i++)
			tern_store_f64(ddt, dst, i, tern_tensor_get_f64(&s, i));
}

static int64_t int_dtype_min(int dt)
{
	switch (dt) {
	case TERN_INT8: return INT8_MIN;
	case TERN_INT16: return INT16_MIN;
	case TERN_INT32: return INT32_MIN;
	case TERN_INT64: return INT64_MIN;
	case TERN_UINT64: return INT64_MIN; /* uint64 is compared sign-flipped */
	default: return 0;
	}
}

static int64_t int_dtype_max(int dt)
{
	switch (dt) {
	case TERN_BOOL: return 1;
	case TERN_INT8: return INT8_MAX;
	case TERN_UINT8: return UINT8_MAX;
	case TERN_INT16: return INT16_MAX;
	case TERN_UINT16: return UINT16_MAX;
	case TERN_INT32: return INT32_MAX;
	case TERN_UINT32: return UINT32_MAX;
	default: return INT64_MAX;
	}
}

/* Reads axis values from an int tensor, normalised to [0, rank); names the input in errors. */
static tern_status read_axis(const tern_node *node, const char *what, int64_t v, int rank, int *out)
{
	if (v < -rank || v >= (rank ? rank : 1))
		return tern_node_errorf(node, TERN_EDATA, "%s %lld is out of range for input of rank %d", what,
		                        (long long)v, rank);
	*out = (int)(v < 0 ? v + rank : v);
	return TERN_OK;
}

/* The input seen as [outer, n, inner] around one axis. */
static void split_at_axis(const tern_tensor *x, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
	*outer = tern_numel(axis, x->dims);
	*n = x->rank ? x->dims[axis] : 1;
	*inner = x->rank ? tern_numel(x->rank - axis - 1, x->dims + axis + 1) : 1;
}

/* ---------------------------------------------------------------- Reduce* */

enum reduce_kind {
	R_SUM,
	R_MEAN,
	R_MAX,
	R_MIN,
	R_PROD,
	R_L1,
	R_L2,
	R_LOGSUM,
	R_LOGSUMEXP,
	R_SUMSQUARE,
};

/* What each pass folds: the map applied to each element and how mapped values combine. */
enum fold { F_SUM, F_SUMSQ, F_ABS, F_PROD, F_MAX, F_MIN, F_MAXFINITE, F_EXPSUM };

static const struct reduce_def {
	const char *op_type;
	enum reduce_kind kind;
	int axes_input_since; /* opset from which axes is an input, not an attribute */
	enum fold fold;
	bool int_in_double; /* integer inputs accumulate in double (the result is not a sum) */
} reduce_defs[] = {
        {"ReduceSum", R_SUM, 13, F_SUM, false},
        {"ReduceMean", R_MEAN, 18, F_SUM, true},
        {"ReduceMax", R_MAX, 18, F_MAX, false},
        {"ReduceMin", R_MIN, 18, F_MIN, false},
        {"ReduceProd", R_PROD, 18, F_PROD, false},
        {"ReduceL1", R_L1, 18, F_ABS, false},
        {"ReduceL2", R_L2, 18, F_SUMSQ, true},
        {"ReduceLogSum", R_LOGSUM, 18, F_SUM, true},
        {"ReduceLogSumExp", R_LOGSUMEXP, 18, F_MAXFINITE, true},
        {"ReduceSumSquare", R_SUMSQUARE, 18, F_SUMSQ, false},
};

/* The input shape with size-1 dimensions dropped and neighbours of the same kind merged. */
typedef struct reduce_params {
	const struct reduce_def *def;
	int acc_dtype; /* TERN_FLOAT, TERN_DOUBLE or TERN_INT64 */
	int rank; /* >= 1 */
	int64_t dims[TERN_MAX_RANK];
	bool reduced[TERN_MAX_RANK];
	int64_t out_strides[TERN_MAX_RANK]; /* 0 for reduced dimensions */
	int64_t numel_in, numel_out, group; /* group: input elements per output */
	bool flip_sign; /* uint64 max/min compare as sign-flipped int64 */
} reduce_params;

/* Folds `in` into `out` (already holding the identity or a partial result) for the slices
 * [d0, d0_end) of the first merged dimension (one slice when the rank is 1). Walks the input in memory
 * order: when the last merged dimension is reduced, each row folds into one output through eight
 * lanes (so the loop vectorises); when it is kept, a row folds elementwise into a row of outputs. */
#define DEFINE_FOLD(NAME, T, MAP, COMBINE)                                                                 \
	static void NAME(const reduce_params *p, const void *vin, void *vout, const void *vsh, int64_t d0, \
	                 int64_t d0_end)                                                                   \
	{                                                                                                  \
		const T *restrict in = vin, *restrict sh = vsh;                                            \
		T *restrict out = vout;                                                                    \
		if (p->numel_in == 0)                                                                      \
			return;                                                                            \
		int last = p->rank - 1;                                                                    \
		int64_t len = p->dims[last], rows_per = p->numel_in / len / (last ? p->dims[0] : 1);       \
		int64_t idx[TERN_MAX_RANK] = {d0}, o = last ? d0 * p->out_strides[0] : 0;                  \
		for (int64_t r = d0 * rows_per; r < d0_end * rows_per; r++) {                              \
			const T *x = in + r * len;                                                         \
			if (p->reduced[last]) {                                                            \
				T lane[8], acc = out[o], s = sh ? sh[o] : 0;                               \
				int64_t j = 0;                                                             \
				(void)s;                                                                   \
				if (len >= 16) {                                                           \
					for (int l = 0; l < 8; l++)                                        \
						lane[l] = MAP(x[l], s);                                    \
					for (j = 8; j + 8 <= len; j += 8)                                  \
						for (int l = 0; l < 8; l++)                                \
							lane[l] = COMBINE(lane[l], MAP(x[j + l], s));      \
					for (int l = 0; l < 8; l++)                                        \
						acc = COMBINE(acc, lane[l]);                               \
				}                                                                          \
				for (; j < len; j++)                                                       \
					acc = COMBINE(acc, MAP(x[j], s));                                  \
				out[o] = acc;                                                              \
			} else {                                                                           \
				T *restrict y = out + o;                                                   \
				for (int64_t j = 0; j < len; j++)                                          \
					y[j] = COMBINE(y[j], MAP(x[j], sh[o + j]));                        \
			}                                                                                  \
			for (int d = last - 1; d >= 0; d--) {                                              \
				o += p->out_strides[d];                                                    \
				if (++idx[d] < p->dims[d])                                                 \
					break;                                                             \
				o -= idx[d] * p->out_strides[d];                                           \
				idx[d] = 0;                                                                \
			}                                                                                  \
		}                                                                                          \
	}

#define MAP_ID(x, s) (x)
#define MAP_SQ(x, s) ((x) * (x))
#define ADD(a, b) ((a) + (b))
#define MUL(a, b) ((a) * (b))
#define MAXOF(a, b) ((b) > (a) ? (b) : (a))
#define MINOF(a, b) ((b) < (a) ? (b) : (a))
/* Integer sums and products wrap instead of overflowing. */
#define IADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define IMUL(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define IABS(x, s) ((x) < 0 ? (int64_t)(0 - (uint64_t)(x)) : (x))
#define ISQ(x, s) IMUL(x, x)

/* Infinities do not shift LogSumExp: the largest finite value does. */
#define MAP_FINITE(x, s) (isinf(x) ? -INFINITY : (x))

#define DEFINE_FLOAT_FOLDS(T, SFX, FABS, EXP)                   \
	DEFINE_FOLD(fold_sum_##SFX, T, MAP_ID, ADD)             \
	DEFINE_FOLD(fold_sumsq_##SFX, T, MAP_SQ, ADD)           \
	DEFINE_FOLD(fold_abs_##SFX, T, FABS, ADD)               \
	DEFINE_FOLD(fold_prod_##SFX, T, MAP_ID, MUL)            \
	DEFINE_FOLD(fold_max_##SFX, T, MAP_ID, MAXOF)           \
	DEFINE_FOLD(fold_min_##SFX, T, MAP_ID, MINOF)           \
	DEFINE_FOLD(fold_maxfinite_##SFX, T, MAP_FINITE, MAXOF) \
	DEFINE_FOLD(fold_expsum_##SFX, T, EXP, ADD)

#define MAP_FABSF(x, s) fabsf(x)
#define MAP_FABS(x, s) fabs(x)
#define MAP_EXPF(x, s) expf((x) - (s))
#define MAP_EXP(x, s) exp((x) - (s))
DEFINE_FLOAT_FOLDS(float, f32, MAP_FABSF, MAP_EXPF)
DEFINE_FLOAT_FOLDS(double, f64, MAP_FABS, MAP_EXP)
DEFINE_FOLD(fold_sum_i64, int64_t, MAP_ID, IADD)
DEFINE_FOLD(fold_sumsq_i64, int64_t, ISQ, IADD)
DEFINE_FOLD(fold_abs_i64, int64_t, IABS, IADD)
DEFINE_FOLD(fold_prod_i64, int64_t, MAP_ID, IMUL)
DEFINE_FOLD(fold_max_i64, int64_t, MAP_ID, MAXOF)
DEFINE_FOLD(fold_min_i64, int64_t, MAP_ID, MINOF)

typedef void (*fold_fn)(const reduce_params *, const void *, void *, const void *, int64_t, int64_t);

static const fold_fn folds_f32[] = {fold_sum_f32, fold_sumsq_f32, fold_abs_f32,       fold_prod_f32,
                                    fold_max_f32, fold_min_f32,   fold_maxfinite_f32, fold_expsum_f32};
static const fold_fn folds_f64[] = {fold_sum_f64, fold_sumsq_f64, fold_abs_f64,       fold_prod_f64,
                                    fold_max_f64, fold_min_f64,   fold_maxfinite_f64, fold_expsum_f64};
static const fold_fn folds_i64[] = {fold_sum_i64,  fold_sumsq_i64, fold_abs_i64,
                                    fold_prod_i64, fold_max_i64,   fold_min_i64};

static double fold_identity(enum fold f)
{
	switch (f) {
	case F_PROD: return 1;
	case F_MAX:
	case F_MAXFINITE: return -INFINITY;
	case F_MIN: return INFINITY;
	default: return 0;
	}
}

/* The result from the folded value (and the LogSumExp shift). */
static double finish(enum reduce_kind k, double v, double shift, int64_t group)
{
	switch (k) {
	case R_MEAN: return v / (double)group;
	case R_L2: return sqrt(v);
	case R_LOGSUM: return log(v);
	case R_LOGSUMEXP: return log(v) + shift;
	default: return v;
	}
}

typedef struct fold_task {
	fold_fn fn;
	const reduce_params *p;
	const void *in, *sh;
	void *out;
	int64_t chunk; /* slices of the first merged dimension per task */
} fold_task;

static void fold_slices(void *ctx, int64_t i)
{
	const fold_task *t = ctx;
	int64_t end = (i + 1) * t->chunk < t->p->dims[0] ? (i + 1) * t->chunk : t->p->dims[0];
	t->fn(t->p, t->in, t->out, t->sh, i * t->chunk, end);
}

/* Runs one fold over the whole input; spread over the pool when the first merged dimension is kept,
 * since its slices then write disjoint outputs. */
static void run_fold(tern_threadpool *pool, fold_fn fn, const reduce_params *p, const void *in, void *out,
                     const void *sh)
{
	int threads = pool ? tern_threadpool_size(pool) : 1;
	if (threads < 2 || p->rank < 2 || p->reduced[0] || p->numel_in < ((int64_t)1 << 15)) {
		fn(p, in, out, sh, 0, p->rank < 2 ? 1 : p->dims[0]);
		return;
	}
	fold_task t = {fn, p, in, sh, out, (p->dims[0] + 4 * threads - 1) / (4 * threads)};
	tern_parallel_for(pool, (p->dims[0] + t.chunk - 1) / t.chunk, fold_slices, &t);
}

static double acc_get(int dt, const void *a, int64_t i)
{
	return dt == TERN_FLOAT ? ((const float *)a)[i] : ((const double *)a)[i];
}

static void reduce_float(tern_threadpool *pool, const reduce_params *p, const void *in, void *out, void *shift)
{
	enum fold f = p->def->fold;
	enum reduce_kind k = p->def->kind;
	int dt = p->acc_dtype;
	const fold_fn *folds = dt == TERN_FLOAT ? folds_f32 : folds_f64;
	for (int64_t i = 0; i < p->numel_out; i++)
		tern_store_f64(dt, out, i, fold_identity(f));
	run_fold(pool, folds[f], p, in, out, NULL);
	if (f == F_MAXFINITE) {
		for (int64_t i = 0; i < p->numel_out; i++) {
			double m = acc_get(dt, out, i);
			tern_store_f64(dt, shift, i, isinf(m) ? 0 : m);
			tern_store_f64(dt, out, i, 0);
		}
		run_fold(pool, folds[F_EXPSUM], p, in, out, shift);
	}
	if (k == R_MEAN || k == R_L2 || k == R_LOGSUM || k == R_LOGSUMEXP)
		for (int64_t i = 0; i < p->numel_out; i++)
			tern_store_f64(dt, out, i,
			               finish(k, acc_get(dt, out, i), shift ? acc_get(dt, shift, i) : 0, p->group));
}

static tern_status reduce_kernel(const tern_kernel_args *a)
{
	const reduce_params *p = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	size_t es = tern_dtype_size(p->acc_dtype);
	char *scratch = a->scratch;
	const void *in = x->data;
	if (x->dtype != p->acc_dtype) {
		convert(x->dtype, x->data, p->acc_dtype, scratch, p->numel_in);
		in = scratch;
		scratch += (size_t)p->numel_in * es;
	}
	void *out = y->dtype == p->acc_dtype ? y->data : scratch;
	if (out == scratch)
		scratch += (size_t)p->numel_out * es;
	if (p->acc_dtype == TERN_INT64) {
		int64_t *yi = out, init;
		enum fold f = p->def->fold;
		init = f == F_PROD   ? 1
		        : f == F_MAX ? int_dtype_min(x->dtype)
		        : f == F_MIN ? int_dtype_max(x->dtype)
		                     : 0;
		for (int64_t i = 0; i < p->numel_out; i++)
			yi[i] = init;
		if (p->flip_sign)
			for (int64_t i = 0; i < p->numel_in; i++)
				((int64_t *)in)[i] ^= INT64_MIN;
		run_fold(a->pool, folds_i64[f], p, in, yi, NULL);
		if (p->flip_sign)
			for (int64_t i = 0; i < p->numel_out; i++)
				yi[i] ^= INT64_MIN;
	} else {
		reduce_float(a->pool, p, in, out, p->def->fold == F_MAXFINITE ? scratch : NULL);
	}
	if (out != y->data)
		convert(p->acc_dtype, out, y->dtype, y->data, p->numel_out);
	return TERN_OK;
}

/* Fills the merged shape of p from the input shape and the reduced-axes mask. */
static void reduce_merge_shape(reduce_params *p, const tern_tensor *x, const bool *mask)
{
	p->rank = 0;
	for (int d = 0; d < x->rank; d++) {
		if (x->dims[d] == 1)
			continue;
		if (p->rank && p->reduced[p->rank - 1] == mask[d]) {
			p->dims[p->rank - 1] *= x->dims[d];
			continue;
		}
		p->dims[p->rank] = x->dims[d];
		p->reduced[p->rank++] = mask[d];
	}
	if (!p->rank) {
		p->dims[0] = 1;
		p->reduced[0] = false;
		p->rank = 1;
	}
	int64_t stride = 1;
	for (int d = p->rank - 1; d >= 0; d--) {
		p->out_strides[d] = p->reduced[d] ? 0 : stride;
		if (!p->reduced[d])
			stride *= p->dims[d];
	}
}

/* The reduced axes from the `axes` input (newer opsets) or attribute; *n = 0 when none are given. */
static tern_status reduce_axes(tern_prepare_args *p, const struct reduce_def *def, int64_t *axes, int *n, bool *known)
{
	*n = 0;
	*known = true;
	if (p->node->opset >= def->axes_input_since) {
		const tern_tensor *t = p->n_in > 1 ? p->in[1] : NULL;
		if (!t)
			return TERN_OK;
		if (!t->data) {
			*known = false;
			return TERN_OK;
		}
		int64_t count = tern_tensor_numel(t);
		if (count > TERN_MAX_RANK)
			return tern_node_errorf(p->node, TERN_EDATA,
			                        "input 1 'axes' has %lld values, more than the rank", (long long)count);
		for (int64_t i = 0; i < count; i++)
			axes[i] = tern_tensor_get_i64(t, i);
		*n = (int)count;
		return TERN_OK;
	}
	size_t count = 0;
	const int64_t *v = tern_attr_ints(p->node, "axes", &count);
	if (count > TERN_MAX_RANK)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'axes' has %zu values, more than the rank",
		                        count);
	for (size_t i = 0; i < count; i++)
		axes[i] = v[i];
	*n = (int)count;
	return TERN_OK;
}

static tern_status reduce_prepare(tern_prepare_args *p)
{
	const struct reduce_def *def = NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(reduce_defs); i++)
		if (strcmp(reduce_defs[i].op_type, p->node->op_type) == 0)
			def = &reduce_defs[i];
	if (!def)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no reduction is registered under this name");
	const tern_tensor *x = p->in[0];
	int64_t axes[TERN_MAX_RANK];
	int n_axes;
	bool known;
	tern_status st = reduce_axes(p, def, axes, &n_axes, &known);
	if (st)
		return st;
	if (!known) {
		p->defer = 1;
		return TERN_OK;
	}
	bool keepdims = tern_attr_int(p->node, "keepdims", 1) != 0;
	if (n_axes == 0 && tern_attr_int(p->node, "noop_with_empty_axes", 0)) {
		tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
		p->alias_input0 = 1;
		return TERN_OK;
	}
	bool mask[TERN_MAX_RANK] = {false};
	for (int i = 0; i < n_axes; i++) {
		int ax = 0;
		if ((st = read_axis(p->node, "axis", axes[i], x->rank, &ax)))
			return st;
		if (x->rank)
			mask[ax] = true;
	}
	if (n_axes == 0)
		for (int d = 0; d < x->rank; d++)
			mask[d] = true;
	int64_t dims[TERN_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < x->rank; d++)
		if (!mask[d])
			dims[rank++] = x->dims[d];
		else if (keepdims)
			dims[rank++] = 1;
	tern_set_shape(p->out[0], x->dtype, rank, dims);

	reduce_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return tern_errorf(TERN_EOS, "out of memory");
	rp->def = def;
	rp->numel_in = tern_tensor_numel(x);
	rp->numel_out = tern_numel(rank, dims);
	rp->group = 1;
	for (int d = 0; d < x->rank; d++)
		if (mask[d])
			rp->group *= x->dims[d];
	reduce_merge_shape(rp, x, mask);
	if (x->dtype == TERN_DOUBLE || (is_int_dtype(x->dtype) && def->int_in_double))
		rp->acc_dtype = TERN_DOUBLE;
	else if (is_int_dtype(x->dtype))
		rp->acc_dtype = TERN_INT64;
	else
		rp->acc_dtype = TERN_FLOAT;
	rp->flip_sign = x->dtype == TERN_UINT64 && (def->fold == F_MAX || def->fold == F_MIN);
	size_t es = tern_dtype_size(rp->acc_dtype);
	/* A converted (or sign-flipped) input, a converted output and the LogSumExp shifts. */
	if (x->dtype != rp->acc_dtype || rp->flip_sign)
		p->scratch_bytes += (size_t)rp->numel_in * es;
	if (x->dtype != rp->acc_dtype)
		p->scratch_bytes += (size_t)rp->numel_out * es;
	if (def->fold == F_MAXFINITE)
		p->scratch_bytes += (size_t)rp->numel_out * es;
	p->params = rp;
	p->free_params = free;
	p->kernel = reduce_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- ArgMax, ArgMin */

typedef struct axis_params {
	int64_t outer, n, inner;
	bool is_max, last; /* ArgMax/ArgMin: which extreme, and which index among ties */
	bool exclusive, reverse; /* CumSum */
} axis_params;

#define ARG_LOOP(T, X)                                                                      \
	do {                                                                                \
		const T *x = (const T *)(X);                                                \
		for (int64_t o = 0; o < p->outer; o++)                                      \
			for (int64_t i = 0; i < p->inner; i++) {                            \
				const T *v = x + o * p->n * p->inner + i;                   \
				T best = v[0];                                              \
				int64_t at = 0;                                             \
				for (int64_t k = 1; k < p->n; k++) {                        \
					T c = v[k * p->inner];                              \
					if (p->is_max ? (p->last ? c >= best : c > best)    \
					              : (p->last ? c <= best : c < best)) { \
						best = c;                                   \
						at = k;                                     \
					}                                                   \
				}                                                           \
				y[o * p->inner + i] = at;                                   \
			}                                                                   \
	} while (0)

static tern_status arg_kernel(const tern_kernel_args *a)
{
	const axis_params *p = a->params;
	const tern_tensor *t = a->in[0];
	int64_t *y = a->out[0]->data;
	if (p->outer * p->inner == 0)
		return TERN_OK;
	switch (t->dtype) {
	case TERN_FLOAT: ARG_LOOP(float, t->data); break;
	case TERN_DOUBLE: ARG_LOOP(double, t->data); break;
	case TERN_FLOAT16:
	case TERN_BFLOAT16:
		convert(t->dtype, t->data, TERN_FLOAT, a->scratch, tern_tensor_numel(t));
		ARG_LOOP(float, a->scratch);
		break;
	case TERN_INT8: ARG_LOOP(int8_t, t->data); break;
	case TERN_INT16: ARG_LOOP(int16_t, t->data); break;
	case TERN_INT32: ARG_LOOP(int32_t, t->data); break;
	case TERN_INT64: ARG_LOOP(int64_t, t->data); break;
	case TERN_UINT8: ARG_LOOP(uint8_t, t->data); break;
	case TERN_UINT16: ARG_LOOP(uint16_t, t->data); break;
	case TERN_UINT32: ARG_LOOP(uint32_t, t->data); break;
	case TERN_UINT64: ARG_LOOP(uint64_t, t->data); break;
	default:
		return tern_node_errorf(a->node, TERN_EDATA, "input 0 has unsupported type %s",
		                        tern_dtype_name(t->dtype));
	}
	return TERN_OK;
}

/* Fills the [outer, n, inner] split of an axis parameter; "axis" is an attribute (ArgMax, TopK). */
static tern_status axis_params_new(tern_prepare_args *p, int64_t axis, axis_params **out, int *ax)
{
	const tern_tensor *x = p->in[0];
	tern_status st = read_axis(p->node, "axis", axis, x->rank, ax);
	if (st)
		return st;
	axis_params *ap = calloc(1, sizeof *ap);
	if (!ap)
		return tern_errorf(TERN_EOS, "out of memory");
	split_at_axis(x, *ax, &ap->outer, &ap->n, &ap->inner);
	p->params = ap;
	p->free_params = free;
	*out = ap;
	return TERN_OK;
}

static tern_status arg_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	axis_params *ap = NULL;
	int ax = 0;
	tern_status st = axis_params_new(p, tern_attr_int(p->node, "axis", 0), &ap, &ax);
	if (st)
		return st;
	ap->is_max = strcmp(p->node->op_type, "ArgMax") == 0;
	ap->last = tern_attr_int(p->node, "select_last_index", 0) != 0;
	if (ap->n == 0 && ap->outer * ap->inner != 0)
		return tern_node_errorf(p->node, TERN_EDATA, "axis %d of input 0 is empty: there is no extreme to find",
		                        ax);
	int64_t dims[TERN_MAX_RANK];
	int rank = 0;
	bool keepdims = tern_attr_int(p->node, "keepdims", 1) != 0;
	for (int d = 0; d < x->rank; d++)
		if (d != ax)
			dims[rank++] = x->dims[d];
		else if (keepdims)
			dims[rank++] = 1;
	tern_set_shape(p->out[0], TERN_INT64, rank, dims);
	if (x->dtype == TERN_FLOAT16 || x->dtype == TERN_BFLOAT16)
		p->scratch_bytes = (size_t)tern_tensor_numel(x) * sizeof(float);
	p->kernel = arg_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- CumSum */

/* Each step along the axis adds a row of `inner` elements to the previous row of sums. */
#define CUMSUM_LOOP(T, X, Y)                                                                                  \
	do {                                                                                                  \
		const T *x = (const T *)(X);                                                                  \
		T *y = (T *)(Y);                                                                              \
		for (int64_t o = 0; o < p->outer; o++) {                                                      \
			const T *xs = x + o * p->n * p->inner;                                                \
			T *ys = y + o * p->n * p->inner;                                                      \
			for (int64_t s = 0; s < p->n; s++) {                                                  \
				int64_t k = p->reverse ? p->n - 1 - s : s, prev = p->reverse ? k + 1 : k - 1; \
				T *restrict yk = ys + k * p->inner;                                           \
				const T *xk = xs + k * p->inner;                                              \
				if (s == 0) {                                                                 \
					for (int64_t i = 0; i < p->inner; i++)                                \
						yk[i] = p->exclusive ? 0 : xk[i];                             \
					continue;                                                             \
				}                                                                             \
				const T *restrict yp = ys + prev * p->inner;                                  \
				const T *restrict xp = p->exclusive ? xs + prev * p->inner : xk;              \
				for (int64_t i = 0; i < p->inner; i++)                                        \
					yk[i] = yp[i] + xp[i];                                                \
			}                                                                                     \
		}                                                                                             \
	} while (0)

static tern_status cumsum_kernel(const tern_kernel_args *a)
{
	const tern_tensor *t = a->in[0];
	int ax = 0;
	tern_status st = read_axis(a->node, "input 1 'axis'", tern_tensor_get_i64(a->in[1], 0), t->rank, &ax);
	if (st)
		return st;
	axis_params q = *(const axis_params *)a->params, *p = &q;
	split_at_axis(t, ax, &q.outer, &q.n, &q.inner);
	int64_t n = tern_tensor_numel(t);
	switch (t->dtype) {
	case TERN_FLOAT: CUMSUM_LOOP(float, t->data, a->out[0]->data); break;
	case TERN_DOUBLE: CUMSUM_LOOP(double, t->data, a->out[0]->data); break;
	/* Two's complement sums wrap the same signed or unsigned. */
	case TERN_INT32:
	case TERN_UINT32: CUMSUM_LOOP(uint32_t, t->data, a->out[0]->data); break;
	case TERN_INT64:
	case TERN_UINT64: CUMSUM_LOOP(uint64_t, t->data, a->out[0]->data); break;
	case TERN_FLOAT16:
	case TERN_BFLOAT16: {
		float *fx = a->scratch, *fy = fx + n;
		convert(t->dtype, t->data, TERN_FLOAT, fx, n);
		CUMSUM_LOOP(float, fx, fy);
		convert(TERN_FLOAT, fy, t->dtype, a->out[0]->data, n);
		break;
	}
	default:
		return tern_node_errorf(a->node, TERN_EDATA, "input 0 has unsupported type %s",
		                        tern_dtype_name(t->dtype));
	}
	return TERN_OK;
}

static tern_status cumsum_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *axis = p->in[1];
	if (!axis || tern_tensor_numel(axis) != 1)
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'axis' must hold one integer");
	axis_params *ap = calloc(1, sizeof *ap);
	if (!ap)
		return tern_errorf(TERN_EOS, "out of memory");
	ap->exclusive = tern_attr_int(p->node, "exclusive", 0) != 0;
	ap->reverse = tern_attr_int(p->node, "reverse", 0) != 0;
	p->params = ap;
	p->free_params = free;
	int ax = 0;
	tern_status st;
	if (axis->data && (st = read_axis(p->node, "input 1 'axis'", tern_tensor_get_i64(axis, 0), x->rank, &ax)))
		return st;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if (x->dtype == TERN_FLOAT16 || x->dtype == TERN_BFLOAT16)
		p->scratch_bytes = 2 * (size_t)tern_tensor_numel(x) * sizeof(float);
	p->kernel = cumsum_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- TopK */

/* Elements ranked by an unsigned key whose order is the wanted order (larger first), ties broken by the
 * lower index, so one comparison serves every dtype and both directions. */
typedef struct ranked {
	uint64_t key;
	int64_t idx;
} ranked;

static bool ranks_before(ranked a, ranked b)
{
	return a.key > b.key || (a.key == b.key && a.idx < b.idx);
}

static uint64_t rank_key(const tern_tensor *t, int64_t i, bool largest)
{
	uint64_t k;
	if (t->dtype == TERN_UINT64) {
		k = ((const uint64_t *)t->data)[i];
	} else if (is_int_dtype(t->dtype)) {
		k = (uint64_t)tern_tensor_get_i64(t, i) ^ ((uint64_t)1 << 63);
	} else {
		/* IEEE order as unsigned order; NaN ranks above +inf, as numpy sorts it last. */
		double d = tern_tensor_get_f64(t, i);
		if (isnan(d))
			d = NAN;
		memcpy(&k, &d, sizeof k);
		k = k >> 63 ? ~k : k | ((uint64_t)1 << 63);
	}
	return largest ? k : ~k;
}

/* A heap whose root ranks last, so it holds the best `size` seen so far. */
static void sift_down(ranked *h, int64_t size, int64_t i)
{
	for (;;) {
		int64_t c = 2 * i + 1;
		if (c >= size)
			return;
		if (c + 1 < size && ranks_before(h[c], h[c + 1]))
			c++;
		if (!ranks_before(h[i], h[c]))
			return;
		ranked tmp = h[i];
		h[i] = h[c];
		h[c] = tmp;
		i = c;
	}
}

typedef struct topk_params {
	int64_t outer, n, inner, k;
	bool largest;
} topk_params;

static tern_status topk_kernel(const tern_kernel_args *a)
{
	const topk_params *p = a->params;
	const tern_tensor *x = a->in[0];
	const char *xd = x->data;
	char *vd = a->out[0] ? a->out[0]->data : NULL;
	int64_t *id = a->out[1] ? a->out[1]->data : NULL;
	size_t es = tern_dtype_size(x->dtype);
	ranked *h = a->scratch;
	if (p->k == 0)
		return TERN_OK;
	for (int64_t o = 0; o < p->outer; o++)
		for (int64_t i = 0; i < p->inner; i++) {
			int64_t base = o * p->n * p->inner + i, size = 0;
			for (int64_t j = 0; j < p->n; j++) {
				ranked e = {rank_key(x, base + j * p->inner, p->largest), j};
				if (size < p->k) {
					/* Sift the new entry up towards the root while it ranks after its parent. */
					int64_t c = size++;
					h[c] = e;
					while (c && ranks_before(h[(c - 1) / 2], h[c])) {
						ranked tmp = h[c];
						h[c] = h[(c - 1) / 2];
						h[(c - 1) / 2] = tmp;
						c = (c - 1) / 2;
					}
				} else if (ranks_before(e, h[0])) {
					h[0] = e;
					sift_down(h, size, 0);
				}
			}
			/* Heap sort: the last-ranked goes to the end, leaving h in rank order. */
			for (int64_t end = size - 1; end > 0; end--) {
				ranked tmp = h[0];
				h[0] = h[end];
				h[end] = tmp;
				sift_down(h, end, 0);
			}
			int64_t obase = o * p->k * p->inner + i;
			for (int64_t j = 0; j < p->k; j++) {
				int64_t dst = obase + j * p->inner;
				if (vd)
					memcpy(vd + dst * es, xd + (base + h[j].idx * p->inner) * es, es);
				if (id)
					id[dst] = h[j].idx;
			}
		}
	return TERN_OK;
}

static tern_status topk_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	int64_t k;
	if (p->node->opset < 10) {
		k = tern_attr_int(p->node, "k", -1);
	} else {
		const tern_tensor *kt = p->n_in > 1 ? p->in[1] : NULL;
		if (!kt || tern_tensor_numel(kt) != 1)
			return tern_node_errorf(p->node, TERN_EDATA, "input 1 'K' must hold one integer");
		if (!kt->data) {
			p->defer = 1;
			return TERN_OK;
		}
		k = tern_tensor_get_i64(kt, 0);
	}
	if (x->rank == 0)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 is a scalar: there is no axis to select along");
	int ax = 0;
	tern_status st = read_axis(p->node, "axis", tern_attr_int(p->node, "axis", -1), x->rank, &ax);
	if (st)
		return st;
	if (k < 0 || k > x->dims[ax])
		return tern_node_errorf(p->node, TERN_EDATA, "k = %lld is outside [0, %lld], the size of axis %d",
		                        (long long)k, (long long)x->dims[ax], ax);
	if (x->dtype == TERN_STRING || x->dtype == TERN_BOOL || tern_dtype_size(x->dtype) == 0)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 has unsupported type %s",
		                        tern_dtype_name(x->dtype));
	topk_params *tp = calloc(1, sizeof *tp);
	if (!tp)
		return tern_errorf(TERN_EOS, "out of memory");
	split_at_axis(x, ax, &tp->outer, &tp->n, &tp->inner);
	tp->k = k;
	tp->largest = tern_attr_int(p->node, "largest", 1) != 0;
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	dims[ax] = k;
	if (p->out[0])
		tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], TERN_INT64, x->rank, dims);
	p->params = tp;
	p->free_params = free;
	p->scratch_bytes = (size_t)k * sizeof(ranked);
	p->kernel = topk_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- Det */

/* LU factorisation with partial pivoting, in double whatever the element type. */
static tern_status det_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	int64_t m = x->dims[x->rank - 1], mm = m * m, batch = tern_tensor_numel(a->out[0]);
	double *lu = a->scratch;
	for (int64_t b = 0; b < batch; b++) {
		for (int64_t i = 0; i < mm; i++)
			lu[i] = tern_tensor_get_f64(x, b * mm + i);
		double det = 1;
		for (int64_t c = 0; c < m && det != 0; c++) {
			int64_t piv = c;
			for (int64_t r = c + 1; r < m; r++)
				if (fabs(lu[r * m + c]) > fabs(lu[piv * m + c]))
					piv = r;
			if (lu[piv * m + c] == 0) {
				det = 0;
				break;
			}
			if (piv != c) {
				for (int64_t j = 0; j < m; j++) {
					double t = lu[c * m + j];
					lu[c * m + j] = lu[piv * m + j];
					lu[piv * m + j] = t;
				}
				det = -det;
			}
			double d = lu[c * m + c];
			det *= d;
			for (int64_t r = c + 1; r < m; r++) {
				double f = lu[r * m + c] / d;
				for (int64_t j = c + 1; j < m; j++)
					lu[r * m + j] -= f * lu[c * m + j];
			}
		}
		tern_store_f64(a->out[0]->dtype, a->out[0]->data, b, det);
	}
	return TERN_OK;
}

static tern_status det_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2])
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 must be square matrices [..., M, M], not rank %d",
		                        x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank - 2, x->dims);
	p->scratch_bytes = (size_t)(x->dims[x->rank - 1] * x->dims[x->rank - 1]) * sizeof(double);
	p->kernel = det_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- tern.Inverse */

/* tern.Inverse(A) -> A^-1 for square matrices [..., M, M] (ONNX has no inverse; Det's gradient needs
 * one): Gauss-Jordan elimination with partial pivoting, in double whatever the element type. A matrix
 * with a zero pivot is singular and fails the run, as numpy's inv does, rather than giving infinities. */
static tern_status inverse_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t m = x->dims[x->rank - 1], mm = m * m, batch = mm ? tern_tensor_numel(x) / mm : 0;
	double *lu = a->scratch, *inv = lu + mm;
	for (int64_t b = 0; b < batch; b++) {
		for (int64_t i = 0; i < mm; i++) {
			lu[i] = tern_tensor_get_f64(x, b * mm + i);
			inv[i] = i / m == i % m;
		}
		for (int64_t c = 0; c < m; c++) {
			int64_t piv = c;
			for (int64_t r = c + 1; r < m; r++)
				if (fabs(lu[r * m + c]) > fabs(lu[piv * m + c]))
					piv = r;
			if (lu[piv * m + c] == 0)
				return tern_node_errorf(a->node, TERN_EDATA, "matrix %lld of the input is singular",
				                        (long long)b);
			if (piv != c)
				for (int64_t j = 0; j < m; j++) {
					double t = lu[c * m + j];
					lu[c * m + j] = lu[piv * m + j];
					lu[piv * m + j] = t;
					t = inv[c * m + j];
					inv[c * m + j] = inv[piv * m + j];
					inv[piv * m + j] = t;
				}
			/* row c scaled to a unit pivot, then eliminated from every other row */
			double d = 1.0 / lu[c * m + c];
			for (int64_t j = 0; j < m; j++) {
				lu[c * m + j] *= d;
				inv[c * m + j] *= d;
			}
			for (int64_t r = 0; r < m; r++) {
				double f = lu[r * m + c];
				if (r == c || f == 0)
					continue;
				for (int64_t j = c; j < m; j++)
					lu[r * m + j] -= f * lu[c * m + j];
				for (int64_t j = 0; j < m; j++)
					inv[r * m + j] -= f * inv[c * m + j];
			}
		}
		for (int64_t i = 0; i < mm; i++)
			tern_store_f64(y->dtype, y->data, b * mm + i, inv[i]);
	}
	return TERN_OK;
}

static tern_status inverse_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2])
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 must be square matrices [..., M, M], not rank %d",
		                        x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->scratch_bytes = 2 * (size_t)(x->dims[x->rank - 1] * x->dims[x->rank - 1]) * sizeof(double);
	p->kernel = inverse_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- gradients */

/* v's static shape; false when its rank or a dimension is unknown. */
static bool static_dims(tern_grad_ctx *g, const tern_gval *v, int *rank, int64_t *dims)
{
	tern_g_type(g, v, NULL, rank, dims);
	for (int d = 0; d < *rank; d++)
		if (dims[d] < 0)
			return false;
	return *rank >= 0;
}

/* A Reduce* node's axes and flags as its rules need them: the axes as an input (from the opset the
 * operator takes them so: 13 for ReduceSum, 18 for the others) or as an attribute before. Emitted
 * reductions and Unsqueezes take them in the form of their own opsets. */
typedef struct grad_axes {
	bool from_input;
	tern_gval *input; /* the axes input; NULL when absent (all axes, or none with noop_with_empty_axes) */
	int64_t attr[TERN_MAX_RANK];
	int n_attr; /* 0: all axes */
	bool keepdims;
	int64_t noop;
} grad_axes;

static int axes_input_since(const char *op_type)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(reduce_defs); i++)
		if (strcmp(reduce_defs[i].op_type, op_type) == 0)
			return reduce_defs[i].axes_input_since;
	return 18;
}

static tern_status grad_axes_get(tern_grad_ctx *g, grad_axes *ra)
{
	memset(ra, 0, sizeof *ra);
	ra->from_input = g->node->opset >= axes_input_since(g->node->op_type);
	ra->keepdims = tern_attr_int(g->node, "keepdims", 1) != 0;
	ra->noop = tern_attr_int(g->node, "noop_with_empty_axes", 0);
	if (g->node->opset < 8)
		return tern_g_fail(g, "the rule needs opset 8 (Expand)");
	if (ra->from_input) {
		ra->input = g->n_in > 1 ? g->x[1] : NULL;
		return TERN_OK;
	}
	size_t n = 0;
	const int64_t *v = tern_attr_ints(g->node, "axes", &n);
	if (n > TERN_MAX_RANK)
		return tern_g_fail(g, "attribute 'axes' has %zu values", n);
	for (size_t i = 0; i < n; i++)
		ra->attr[i] = v[i];
	ra->n_attr = (int)n;
	return TERN_OK;
}

/* The axes as an input of an emitted node that takes them so (NULL: none given). */
static tern_gval *axes_value(tern_grad_ctx *g, const grad_axes *ra)
{
	if (ra->from_input)
		return ra->input;
	return ra->n_attr ? tern_g_ints(g, ra->attr, (size_t)ra->n_attr) : NULL;
}

/* t (in the output's shape) with the reduced axes put back as 1s when keepdims dropped them. Without
 * axes the output is a scalar (or the input itself, with noop_with_empty_axes), which broadcasts as is. */
static tern_gval *keep_dims(tern_grad_ctx *g, tern_gval *t, const grad_axes *ra)
{
	if (!t || ra->keepdims || (ra->from_input ? !ra->input : ra->n_attr == 0))
		return t;
	tern_gval *axes = axes_value(g, ra);
	if (!axes)
		return NULL;
	if (g->node->opset >= 13) {
		tern_gval *in[2] = {t, axes};
		return tern_g_op(g, "", "Unsqueeze", in, 2, NULL, 0);
	}
	tern_gattr at = TERN_GA_IS("axes", ra->attr, (size_t)ra->n_attr);
	return tern_g_op(g, "", "Unsqueeze", &t, 1, &at, 1);
}

/* t (in the output's shape) broadcast to the input's shape. */
static tern_gval *expand_back(tern_grad_ctx *g, tern_gval *t, const grad_axes *ra)
{
	tern_gval *in[2] = {keep_dims(g, t, ra), tern_g_shape(g, g->x[0])};
	return in[0] && in[1] ? tern_g_op(g, "", "Expand", in, 2, NULL, 0) : NULL;
}

/* op_type (ReduceSum or ReduceProd) over the forward node's axes with keepdims. */
static tern_gval *reduce_keep(tern_grad_ctx *g, const char *op_type, tern_gval *t, const grad_axes *ra)
{
	if (!t)
		return NULL;
	bool as_input = g->node->opset >= axes_input_since(op_type);
	tern_gattr at[3] = {TERN_GA_I("keepdims", 1), TERN_GA_I("noop_with_empty_axes", ra->noop),
	                    TERN_GA_IS("axes", ra->attr, (size_t)ra->n_attr)};
	if (as_input) {
		tern_gval *in[2] = {t, axes_value(g, ra)};
		return tern_g_op(g, "", op_type, in, in[1] ? 2 : 1, at, ra->noop ? 2 : 1);
	}
	if (ra->from_input)
		return NULL; /* not reached: an operator that takes axes as an input makes no older-form node */
	return tern_g_op(g, "", op_type, &t, 1, at, ra->n_attr ? 3 : 1);
}

static tern_gval *cast_to(tern_grad_ctx *g, tern_gval *t, int dtype)
{
	tern_gattr at = TERN_GA_I("to", dtype);
	return t ? tern_g_op(g, "", "Cast", &t, 1, &at, 1) : NULL;
}

/* a == b, as bool or as 0/1 of dtype. Equal takes floating point from opset 11; before, a == b is
 * neither a < b nor a > b. */
static tern_gval *equal(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	tern_gval *in[2] = {a, b};
	if (!a || !b)
		return NULL;
	if (g->node->opset >= 11)
		return tern_g_op(g, "", "Equal", in, 2, NULL, 0);
	tern_gval *order[2] = {tern_g_op(g, "", "Less", in, 2, NULL, 0), tern_g_op(g, "", "Greater", in, 2, NULL, 0)};
	tern_gval *either = order[0] && order[1] ? tern_g_op(g, "", "Or", order, 2, NULL, 0) : NULL;
	return tern_g_unary(g, "Not", either);
}

static tern_gval *equal_mask(tern_grad_ctx *g, tern_gval *a, tern_gval *b, int dtype)
{
	return cast_to(g, equal(g, a, b), dtype);
}

static tern_gval *where(tern_grad_ctx *g, tern_gval *c, tern_gval *a, tern_gval *b)
{
	tern_gval *in[3] = {c, a, b};
	return c && a && b ? tern_g_op(g, "", "Where", in, 3, NULL, 0) : NULL;
}

/* The Reduce* rules. dy and y are brought to keepdims form (dyk, yk), which broadcasts against x:
 *   Sum: dy          Mean: dy * |y| / |x|          Max, Min: dy split equally among the ties
 *   Prod: dy * (product of the other elements)     L1: dy sign(x)       L2: dy x / y (0 where y = 0)
 *   SumSquare: 2 dy x      LogSumExp: dy exp(x - y)       LogSum: dy / exp(y)
 * Max and Min split among ties as PyTorch's amax and amin do: each tied element gets dy / count. */
static tern_status reduce_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	grad_axes ra;
	tern_status st = grad_axes_get(g, &ra);
	if (st)
		return st;
	const char *op = g->node->op_type;
	tern_gval *x = g->x[0], *y = g->y[0], *dy = g->dy[0], *dx = NULL;
	int dtype = tern_g_dtype(g, x);
	int64_t opset = g->node->opset;
	if (strcmp(op, "ReduceSum") == 0) {
		dx = expand_back(g, dy, &ra);
	} else if (strcmp(op, "ReduceMean") == 0) {
		int rx, ry;
		int64_t xd[TERN_MAX_RANK], yd[TERN_MAX_RANK];
		tern_gval *scale;
		if (static_dims(g, x, &rx, xd) && static_dims(g, y, &ry, yd)) {
			int64_t nx = tern_numel(rx, xd), ny = tern_numel(ry, yd);
			scale = tern_g_scalar(g, nx ? (double)ny / (double)nx : 0.0, dy);
		} else {
			scale = tern_g_div(g, cast_to(g, tern_g_unary(g, "Size", y), dtype),
			                   cast_to(g, tern_g_unary(g, "Size", x), dtype));
		}
		dx = expand_back(g, tern_g_mul(g, dy, scale), &ra);
	} else if (strcmp(op, "ReduceMax") == 0 || strcmp(op, "ReduceMin") == 0) {
		tern_gval *mask = equal_mask(g, x, keep_dims(g, y, &ra), dtype);
		tern_gval *count = reduce_keep(g, "ReduceSum", mask, &ra);
		dx = tern_g_mul(g, mask, tern_g_div(g, keep_dims(g, dy, &ra), count));
	} else if (strcmp(op, "ReduceProd") == 0) {
		tern_gval *dyk = keep_dims(g, dy, &ra);
		if (opset < 9) {
			/* y / x (no Where before opset 9): right where no element is zero */
			dx = tern_g_mul(g, dyk, tern_g_div(g, keep_dims(g, y, &ra), x));
		} else {
			/* The product of the others: P / x with no zero in the group; with one zero, the product
			 * of the non-zeros at that zero and 0 elsewhere; with more, 0. */
			tern_gval *zero = tern_g_scalar(g, 0.0, x), *one = tern_g_scalar(g, 1.0, x);
			tern_gval *is_zero = equal(g, x, zero);
			tern_gval *zf = cast_to(g, is_zero, dtype);
			tern_gval *x1 = where(g, is_zero, one, x);
			tern_gval *p = reduce_keep(g, "ReduceProd", x1, &ra);
			tern_gval *zeros = reduce_keep(g, "ReduceSum", zf, &ra);
			tern_gval *none = equal(g, zeros, zero);
			tern_gval *single = equal_mask(g, zeros, one, dtype);
			tern_gval *others =
			        where(g, none, tern_g_div(g, p, x1), tern_g_mul(g, zf, tern_g_mul(g, p, single)));
			dx = tern_g_mul(g, dyk, others);
		}
	} else if (strcmp(op, "ReduceL1") == 0) {
		if (opset < 9)
			return tern_g_fail(g, "the rule needs opset 9 (Sign)");
		dx = tern_g_mul(g, tern_g_unary(g, "Sign", x), keep_dims(g, dy, &ra));
	} else if (strcmp(op, "ReduceL2") == 0) {
		tern_gval *yk = keep_dims(g, y, &ra), *q = tern_g_div(g, keep_dims(g, dy, &ra), yk);
		if (opset >= 9)
			q = where(g, equal(g, yk, tern_g_scalar(g, 0.0, x)), tern_g_scalar(g, 0.0, x), q);
		dx = tern_g_mul(g, x, q);
	} else if (strcmp(op, "ReduceSumSquare") == 0) {
		dx = tern_g_mul(g, tern_g_mul(g, x, tern_g_scalar(g, 2.0, x)), keep_dims(g, dy, &ra));
	} else if (strcmp(op, "ReduceLogSumExp") == 0) {
		dx = tern_g_mul(g, tern_g_unary(g, "Exp", tern_g_sub(g, x, keep_dims(g, y, &ra))),
		                keep_dims(g, dy, &ra));
	} else if (strcmp(op, "ReduceLogSum") == 0) {
		dx = expand_back(g, tern_g_div(g, dy, tern_g_unary(g, "Exp", y)), &ra);
	} else {
		return tern_g_fail(g, "no rule for %s", op);
	}
	g->dx[0] = dx;
	return dx ? TERN_OK : tern_g_status(g);
}

/* CumSum: the gradient summed the other way, exclusive as the forward one was. */
static tern_status cumsum_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gattr at[2] = {TERN_GA_I("exclusive", tern_attr_int(g->node, "exclusive", 0) != 0),
	                    TERN_GA_I("reverse", tern_attr_int(g->node, "reverse", 0) == 0)};
	tern_gval *in[2] = {g->dy[0], g->x[1]};
	g->dx[0] = tern_g_op(g, "", "CumSum", in, 2, at, 2);
	return g->dx[0] ? TERN_OK : tern_g_status(g);
}

/* TopK: the values' gradient added back where they were taken from (tern.GatherElementsGrad with the
 * indices output). */
static tern_status topk_grad(tern_grad_ctx *g)
{
	if (!g->wants[0] || !g->dy[0])
		return TERN_OK;
	if (g->n_out < 2 || !g->y[1])
		return tern_g_fail(g, "the rule needs the indices output");
	tern_gattr at = TERN_GA_I("axis", tern_attr_int(g->node, "axis", -1));
	tern_gval *in[3] = {g->dy[0], tern_g_shape(g, g->x[0]), g->y[1]};
	g->dx[0] = in[1] ? tern_g_op(g, "tern", "GatherElementsGrad", in, 3, &at, 1) : NULL;
	return g->dx[0] ? TERN_OK : tern_g_status(g);
}

/* a (of known rank) with its last two axes swapped */
static tern_gval *transpose_last(tern_grad_ctx *g, tern_gval *a, int rank)
{
	int64_t perm[TERN_MAX_RANK];
	for (int d = 0; d < rank; d++)
		perm[d] = d;
	perm[rank - 2] = rank - 1;
	perm[rank - 1] = rank - 2;
	return tern_g_transpose(g, a, perm, rank);
}

static tern_gval *matmul(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	tern_gval *in[2] = {a, b};
	return a && b ? tern_g_op(g, "", "MatMul", in, 2, NULL, 0) : NULL;
}

/* Det: d det(A) = det(A) A^-T, for each matrix of the batch: dA = (dY Y)[..., 1, 1] tern.Inverse(A)^T.
 * A singular matrix (where the gradient is the adjugate, which this form cannot give) fails the run in
 * tern.Inverse. */
static tern_status det_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *a = g->x[0];
	int rank = tern_g_rank(g, a);
	if (rank < 2)
		return tern_g_fail(g, "Det needs an input of known rank");
	tern_gval *s = tern_g_mul(g, g->dy[0], g->y[0]);
	/* [...] to [..., 1, 1]: Unsqueeze takes its axes as an input from opset 13 */
	static const int64_t last2[2] = {-2, -1};
	if (g->node->opset >= 13) {
		tern_gval *in[2] = {s, tern_g_ints(g, last2, 2)};
		s = in[0] && in[1] ? tern_g_op(g, "", "Unsqueeze", in, 2, NULL, 0) : NULL;
	} else {
		tern_gattr at = TERN_GA_IS("axes", last2, 2);
		s = s ? tern_g_op(g, "", "Unsqueeze", &s, 1, &at, 1) : NULL;
	}
	tern_gval *inv = a ? tern_g_op(g, "tern", "Inverse", &a, 1, NULL, 0) : NULL;
	g->dx[0] = tern_g_mul(g, s, transpose_last(g, inv, rank));
	return g->dx[0] ? TERN_OK : tern_g_status(g);
}

/* tern.Inverse: Y = A^-1 gives dA = -Y^T dY Y^T. */
static tern_status inverse_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	int rank = tern_g_rank(g, g->x[0]);
	if (rank < 2)
		return tern_g_fail(g, "Inverse needs an input of known rank");
	tern_gval *yt = transpose_last(g, g->y[0], rank);
	g->dx[0] = tern_g_neg(g, matmul(g, matmul(g, yt, g->dy[0]), yt));
	return g->dx[0] ? TERN_OK : tern_g_status(g);
}
/* ---------------------------------------------------------------- table */

#define REDUCE_DTYPES (TERN_DT_NUMERIC | TERN_DT(BOOL))

static const tern_op ops[] = {
        {"", "ReduceSum", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceMean", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceMax", 1, 0, reduce_prepare, REDUCE_DTYPES, "reduce", reduce_grad},
        {"", "ReduceMin", 1, 0, reduce_prepare, REDUCE_DTYPES, "reduce", reduce_grad},
        {"", "ReduceProd", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceL1", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceL2", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceLogSum", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceLogSumExp", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ReduceSumSquare", 1, 0, reduce_prepare, TERN_DT_NUMERIC, "reduce", reduce_grad},
        {"", "ArgMax", 1, 0, arg_prepare, TERN_DT_NUMERIC, "reduce"},
        {"", "ArgMin", 1, 0, arg_prepare, TERN_DT_NUMERIC, "reduce"},
        {"", "CumSum", 11, 0, cumsum_prepare,
         TERN_DT_FLOATS | TERN_DT(INT32) | TERN_DT(INT64) | TERN_DT(UINT32) | TERN_DT(UINT64), "reduce", cumsum_grad},
        {"", "TopK", 1, 0, topk_prepare, TERN_DT_NUMERIC, "reduce", topk_grad},
        {"", "Det", 11, 0, det_prepare, TERN_DT_FLOATS, "reduce", det_grad},
        {"tern", "Inverse", 1, 0, inverse_prepare, TERN_DT_FLOATS, "reduce", inverse_grad},
};

const tern_op_table tern_ops_reduce = {ops, TERN_ARRAY_LEN(ops)};
