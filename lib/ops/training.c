/* training.c — the training operators of ai.onnx.preview.training: the Adagrad, Adam and Momentum update
 * rules, each over any number of tensors. (The loss functions themselves live in softmax.c.) */
#include "internal.h"

#define TERN_DOMAIN_NAME "tern"

#include <math.h>
#include <stdlib.h>

#define TRAINING_DOMAIN "ai.onnx.preview.training"

enum optimizer { ADAGRAD, ADAM, MOMENTUM };

typedef struct optim_params {
	enum optimizer kind;
	int64_t groups; /* tensors updated */
	int states; /* state tensors per updated tensor: H; V and H; V */
	double alpha, beta, epsilon, norm, norm_post, decay;
	bool nesterov;
	int64_t largest; /* elements of the largest tensor, for outputs the node leaves out */
} optim_params;

/* One run's constants: what depends only on R and T, folded once. Elements are updated in double. */
typedef struct optim_step {
	const optim_params *o;
	double r; /* learning rate after Adagrad's decay or Adam's bias correction */
	double beta_t; /* Momentum's gradient factor */
	int64_t n; /* elements of the group being updated */
} optim_step;

static inline void adagrad_update(const optim_step *s, double x, double g, double h, double *xn, double *hn)
{
	double gr = s->o->norm * x + g;
	*hn = h + gr * gr;
	*xn = x - s->r * gr / (sqrt(*hn) + s->o->epsilon);
}

static inline void adam_update(const optim_step *s, double x, double g, double v, double h, double *xn, double *vn,
                               double *hn)
{
	const optim_params *o = s->o;
	double gr = o->norm * x + g;
	*vn = o->alpha * v + (1 - o->alpha) * gr;
	*hn = o->beta * h + (1 - o->beta) * gr * gr;
	*xn = (1 - o->norm_post) * (x - s->r * *vn / (sqrt(*hn) + o->epsilon));
}

static inline void momentum_update(const optim_step *s, double x, double g, double v, double *xn, double *vn)
{
	const optim_params *o = s->o;
	double gr = o->norm * x + g;
	*vn = o->alpha * v + s->beta_t * gr;
	*xn = x - s->r * (o->nesterov ? gr + o->alpha * *vn : *vn);
}

/* One group's update for element type T: in[0..2+states) are X, G and the states; out[0..1+states) the
 * new X and states. */
#define OPTIMIZER_LOOP(name, T)                                                              \
	static void name(const optim_step *s, const void *const *in, void *const *out)       \
	{                                                                                    \
		const T *restrict x = in[0], *restrict g = in[1], *restrict s1 = in[2];      \
		const T *restrict s2 = in[3];                                                \
		T *restrict xo = out[0], *restrict s1o = out[1], *restrict s2o = out[2];     \
		double a = 0, b = 0, c = 0;                                                  \
		for (int64_t i = 0; i < s->n; i++) {                                         \
			switch (s->o->kind) {                                                \
			case ADAGRAD: adagrad_update(s, x[i], g[i], s1[i], &a, &b); break;   \
			case ADAM:                                                           \
				adam_update(s, x[i], g[i], s1[i], s2[i], &a, &b, &c);        \
				s2o[i] = (T)c;                                               \
				break;                                                       \
			case MOMENTUM: momentum_update(s, x[i], g[i], s1[i], &a, &b); break; \
			}                                                                    \
			xo[i] = (T)a;                                                        \
			s1o[i] = (T)b;                                                       \
		}                                                                            \
	}
OPTIMIZER_LOOP(optimize_f32, float)
OPTIMIZER_LOOP(optimize_f64, double)
#undef OPTIMIZER_LOOP

static tern_status optimizer_kernel(const tern_kernel_args *a)
{
	const optim_params *o = a->params;
	double r = tern_tensor_get_f64(a->in[0], 0);
	int64_t t = tern_tensor_get_i64(a->in[1], 0);
	optim_step s = {.o = o, .r = r, .beta_t = 1};
	switch (o->kind) {
	case ADAGRAD: s.r = r / (1 + (double)t * o->decay); break;
	case ADAM:
		/* Bias correction of both moments from the second step on. */
		if (t > 0)
			s.r = r * sqrt(1 - pow(o->beta, (double)t)) / (1 - pow(o->alpha, (double)t));
		break;
	case MOMENTUM:
		/* The first step takes the whole gradient. */
		s.beta_t = t > 0 ? o->beta : 1;
		break;
	}
	/* Inputs: R, T, then the groups' tensors X, their gradients G and each state in turn; outputs: the new
	 * X, then each new state. Outputs the node leaves out are written to scratch, one slot each. */
	size_t slot = (size_t)o->largest * sizeof(double);
	int64_t n = o->groups;
	for (int64_t k = 0; k < n; k++) {
		const void *in[4] = {NULL};
		void *out[3] = {NULL};
		for (int i = 0; i < 2 + o->states; i++)
			in[i] = a->in[2 + i * n + k]->data;
		for (int i = 0; i < 1 + o->states; i++) {
			int64_t idx = i * n + k;
			out[i] = idx < a->n_out && a->out[idx] ? a->out[idx]->data
			                                       : (char *)a->scratch + (size_t)i * slot;
		}
		const tern_tensor *x = a->in[2 + k];
		s.n = tern_tensor_numel(x);
		if (x->dtype == TERN_FLOAT)
			optimize_f32(&s, in, out);
		else
			optimize_f64(&s, in, out);
	}
	return TERN_OK;
}

static tern_status require_attr(const tern_node *node, const char *name)
{
	if (tern_attr(node, name))
		return TERN_OK;
	return tern_node_errorf(node, TERN_EDATA, "attribute '%s' is required", name);
}

static tern_status scalar_input(const tern_node *node, const tern_tensor *t, int index, const char *what,
                                uint32_t dtypes)
{
	char s[128];
	if (!t)
		return tern_node_errorf(node, TERN_EDATA, "input %d '%s' is required", index, what);
	if (tern_tensor_numel(t) != 1 || !(dtypes & (1u << t->dtype)))
		return tern_node_errorf(node, TERN_EDATA, "input %d '%s' %s must be a single %s", index, what,
		                        tern_shape_str(t->dtype, t->rank, t->dims, s, sizeof s),
		                        dtypes == TERN_DT(INT64) ? "int64" : "float or double");
	return TERN_OK;
}

static bool same_shape(const tern_tensor *a, const tern_tensor *b)
{
	return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof *a->dims) == 0;
}

static tern_status optimizer_setup(tern_prepare_args *p, enum optimizer kind, int states)
{
	const tern_node *node = p->node;
	int per_group = 2 + states;
	tern_status st;
	if (p->n_in < 2 + per_group || (p->n_in - 2) % per_group != 0)
		return tern_node_errorf(node, TERN_EDATA,
		                        "%d inputs; expected R, T and then %d tensors per optimized tensor", p->n_in,
		                        per_group);
	int64_t n = (p->n_in - 2) / per_group;
	if (p->n_out > (1 + states) * n)
		return tern_node_errorf(node, TERN_EDATA,
		                        "%d outputs for %lld optimized tensors; at most %lld expected", p->n_out,
		                        (long long)n, (long long)((1 + states) * n));
	if ((st = scalar_input(node, p->in[0], 0, "R", TERN_DT(FLOAT) | TERN_DT(DOUBLE))) ||
	    (st = scalar_input(node, p->in[1], 1, "T", TERN_DT(INT64))))
		return st;
	int64_t largest = 0;
	for (int64_t k = 0; k < n; k++) {
		const tern_tensor *x = p->in[2 + k];
		char s1[128], s2[128];
		if (!x || (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE))
			return tern_node_errorf(node, TERN_EDATA, "input %lld is %s; float or double expected",
			                        (long long)(2 + k), x ? tern_dtype_name(x->dtype) : "missing");
		for (int i = 1; i < per_group; i++) {
			const tern_tensor *t = p->in[2 + i * n + k];
			if (!t || t->dtype != x->dtype || !same_shape(t, x))
				return tern_node_errorf(
				        node, TERN_EDATA, "input %lld %s must match input %lld %s",
				        (long long)(2 + i * n + k),
				        t ? tern_shape_str(t->dtype, t->rank, t->dims, s1, sizeof s1) : "(missing)",
				        (long long)(2 + k), tern_shape_str(x->dtype, x->rank, x->dims, s2, sizeof s2));
		}
		for (int i = 0; i < 1 + states; i++) {
			int64_t idx = i * n + k;
			if (idx < p->n_out && p->out[idx])
				tern_set_shape(p->out[idx], x->dtype, x->rank, x->dims);
		}
		int64_t numel = tern_tensor_numel(x);
		largest = numel > largest ? numel : largest;
	}
	optim_params *o = tern_xmalloc(sizeof *o);
	if (!o)
		return tern_errorf(TERN_EOS, "out of memory");
	/* Every attribute with the schema's default (Momentum requires its own): an operator reads only its
	 * own. */
	*o = (optim_params){
	        .kind = kind,
	        .groups = n,
	        .states = states,
	        .alpha = tern_attr_float(node, "alpha", 0.9f),
	        .beta = tern_attr_float(node, "beta", 0.999f),
	        .epsilon = tern_attr_float(node, "epsilon", 1e-6f),
	        .norm = tern_attr_float(node, "norm_coefficient", 0.0f),
	        .norm_post = tern_attr_float(node, "norm_coefficient_post", 0.0f),
	        .decay = tern_attr_float(node, "decay_factor", 0.0f),
	        .nesterov = strcmp(tern_attr_string(node, "mode", ""), "nesterov") == 0,
	        .largest = largest,
	};
	p->params = o;
	p->free_params = free;
	p->kernel = optimizer_kernel;
	p->scratch_bytes = (size_t)(1 + states) * (size_t)largest * sizeof(double);
	return TERN_OK;
}

static tern_status adagrad_prepare(tern_prepare_args *p)
{
	return optimizer_setup(p, ADAGRAD, 1);
}
static tern_status adam_prepare(tern_prepare_args *p)
{
	return optimizer_setup(p, ADAM, 2);
}

static tern_status momentum_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	static const char *const required[] = {"alpha", "beta", "mode", "norm_coefficient"};
	tern_status st;
	for (size_t i = 0; i < TERN_ARRAY_LEN(required); i++)
		if ((st = require_attr(node, required[i])))
			return st;
	const char *mode = tern_attr_string(node, "mode", "");
	if (strcmp(mode, "standard") != 0 && strcmp(mode, "nesterov") != 0)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'mode' = '%s'; 'standard' or 'nesterov' expected",
		                        mode);
	return optimizer_setup(p, MOMENTUM, 1);
}

/* ---------------------------------------------------------------- tern.SumTo */

/* tern.SumTo(X, shape) sums X down to `shape`, from which X's shape broadcasts (numpy's rules): the
 * gradient of a broadcast operand. Leading dimensions of X that shape lacks and dimensions where
 * shape has 1 are summed. */
typedef struct sum_to_params {
	int rank; /* of X */
	int64_t outer_dims[TERN_MAX_RANK]; /* X's dimensions before the inner run */
	int64_t y_stride[TERN_MAX_RANK]; /* Y's element stride for each of them (0: summed) */
	int n_outer;
	int64_t inner; /* trailing elements where X and Y agree: added as one run */
} sum_to_params;

#define SUM_TO_KERNEL(NAME, T)                                                                 \
	static void NAME(const sum_to_params *sp, const T *restrict x, T *restrict y, int64_t ny) \
	{                                                                                      \
		memset(y, 0, (size_t)ny * sizeof(T));                                          \
		int64_t idx[TERN_MAX_RANK] = {0}, off = 0;                                     \
		for (int64_t o = 0, n_outer = tern_numel(sp->n_outer, sp->outer_dims); o < n_outer; o++) { \
			T *restrict dst = y + off * sp->inner;                                 \
			const T *restrict src = x + o * sp->inner;                             \
			for (int64_t k = 0; k < sp->inner; k++)                                \
				dst[k] += src[k];                                              \
			for (int d = sp->n_outer - 1; d >= 0; d--) {                           \
				off += sp->y_stride[d];                                        \
				if (++idx[d] < sp->outer_dims[d])                              \
					break;                                                 \
				off -= sp->y_stride[d] * idx[d];                               \
				idx[d] = 0;                                                    \
			}                                                                      \
		}                                                                              \
	}
SUM_TO_KERNEL(sum_to_f32, float)
SUM_TO_KERNEL(sum_to_f64, double)

static tern_status sum_to_kernel(const tern_kernel_args *a)
{
	const sum_to_params *sp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	if (x->dtype == TERN_FLOAT)
		sum_to_f32(sp, x->data, y->data, tern_tensor_numel(y));
	else
		sum_to_f64(sp, x->data, y->data, tern_tensor_numel(y));
	return TERN_OK;
}

static tern_status sum_to_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0], *shape = p->n_in > 1 ? p->in[1] : NULL;
	if (!x || (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE))
		return tern_node_errorf(p->node, TERN_EDATA, "SumTo sums float or double tensors");
	if (!shape || shape->dtype != TERN_INT64 || shape->rank != 1)
		return tern_node_errorf(p->node, TERN_EDATA, "SumTo needs the target shape as an int64 vector");
	if (!shape->data) {
		p->defer = 1;
		return TERN_OK;
	}
	int r = (int)shape->dims[0];
	const int64_t *s = shape->data;
	if (r > x->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "SumTo: shape of rank %d is longer than the input's %d", r,
		                        x->rank);
	sum_to_params *sp = calloc(1, sizeof *sp);
	if (!sp)
		return tern_errorf(TERN_EOS, "out of memory");
	int lead = x->rank - r;
	/* Y's strides, aligned on X's trailing dimensions */
	int64_t ystride[TERN_MAX_RANK], st = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		int64_t yd = d >= lead ? s[d - lead] : 1;
		if (d >= lead && yd != x->dims[d] && yd != 1) {
			free(sp);
			return tern_node_errorf(p->node, TERN_EDATA, "SumTo: dimension %d is %lld, the target's %lld", d,
			                        (long long)x->dims[d], (long long)yd);
		}
		ystride[d] = d >= lead && yd == x->dims[d] ? st : 0;
		st *= yd;
	}
	/* the inner run: trailing dimensions kept whole */
	int split = x->rank;
	sp->inner = 1;
	while (split > 0 && split - 1 >= lead && s[split - 1 - lead] == x->dims[split - 1]) {
		sp->inner *= x->dims[split - 1];
		split--;
	}
	sp->n_outer = split;
	for (int d = 0; d < split; d++) {
		sp->outer_dims[d] = x->dims[d];
		sp->y_stride[d] = sp->inner ? ystride[d] / (sp->inner ? sp->inner : 1) : 0;
	}
	tern_set_shape(p->out[0], x->dtype, r, s);
	p->params = sp;
	p->free_params = free;
	p->kernel = sum_to_kernel;
	/* nothing to sum (the shapes were not known when the gradient was written): the input itself */
	bool same = r == x->rank;
	for (int d = 0; same && d < r; d++)
		same = s[d] == x->dims[d];
	p->alias_input0 = same;
	return TERN_OK;
}

/* ---------------------------------------------------------------- tern.SGD, tern.Adam, tern.Adagrad */

/* The parameter updates tern-autodiff writes, with torch.optim's rules step for step (the same order
 * of operations in float32, so that a model trains the same in both):
 *   tern.SGD(lr, P, G[, B]) -> P'[, B']        momentum, nesterov, weight_decay (dampening 0; the
 *                                              buffer starts at zero, which is torch's first step)
 *   tern.Adam(lr, t, P, G, M, V) -> P', M', V' beta1, beta2, epsilon, weight_decay, decoupled (AdamW)
 *   tern.Adagrad(lr, t, P, G, S) -> P', S'     epsilon, weight_decay, lr_decay
 * t is the step being taken, counted from 1 (bias correction, decay). */
enum update_kind { UPDATE_SGD, UPDATE_ADAM, UPDATE_ADAGRAD };

typedef struct update_params {
	enum update_kind kind;
	float momentum, weight_decay, beta1, beta2, eps, lr_decay;
	int nesterov, decoupled;
	int first_tensor; /* index of P among the inputs */
} update_params;

#define UPDATE_LOOPS(SUFFIX, T, SQRT)                                                                   \
	static void sgd_##SUFFIX(const update_params *u, T lr, int64_t n, const T *p, const T *g, const T *b, \
	                         T *po, T *bo)                                                           \
	{                                                                                                \
		for (int64_t i = 0; i < n; i++) {                                                        \
			T d = g[i];                                                                      \
			if (u->weight_decay != 0)                                                        \
				d = d + (T)u->weight_decay * p[i];                                       \
			if (b) {                                                                         \
				T buf = b[i] * (T)u->momentum + d;                                       \
				bo[i] = buf;                                                             \
				d = u->nesterov ? d + (T)u->momentum * buf : buf;                         \
			}                                                                                \
			po[i] = p[i] + (-lr) * d;                                                        \
		}                                                                                        \
	}                                                                                                \
	static void adam_##SUFFIX(const update_params *u, T lr, int64_t t, int64_t n, const T *p, const T *g,  \
	                          const T *m, const T *v, T *po, T *mo, T *vo)                           \
	{                                                                                                \
		T b1 = (T)u->beta1, b2 = (T)u->beta2;                                                    \
		T bc1 = (T)(1 - pow(u->beta1, (double)t)), bc2 = (T)(1 - pow(u->beta2, (double)t));     \
		T step_size = lr / bc1, bc2_sqrt = (T)sqrt((double)bc2);                                 \
		for (int64_t i = 0; i < n; i++) {                                                        \
			T x = p[i], d = g[i];                                                            \
			if (u->decoupled)                                                                \
				x = x * (1 - lr * (T)u->weight_decay);                                   \
			else if (u->weight_decay != 0)                                                   \
				d = d + (T)u->weight_decay * x;                                          \
			T mi = m[i] + (1 - b1) * (d - m[i]);                                             \
			T vi = v[i] * b2 + (1 - b2) * d * d;                                             \
			T denom = SQRT(vi) / bc2_sqrt + (T)u->eps;                                       \
			mo[i] = mi;                                                                      \
			vo[i] = vi;                                                                      \
			po[i] = x + (-step_size) * (mi / denom);                                         \
		}                                                                                        \
	}                                                                                                \
	static void adagrad_##SUFFIX(const update_params *u, T lr, int64_t t, int64_t n, const T *p,        \
	                             const T *g, const T *s, T *po, T *so)                               \
	{                                                                                                \
		T clr = lr / (1 + (T)(t - 1) * (T)u->lr_decay);                                          \
		for (int64_t i = 0; i < n; i++) {                                                        \
			T d = g[i];                                                                      \
			if (u->weight_decay != 0)                                                        \
				d = d + (T)u->weight_decay * p[i];                                       \
			T si = s[i] + d * d;                                                             \
			so[i] = si;                                                                      \
			po[i] = p[i] + (-clr) * (d / (SQRT(si) + (T)u->eps));                            \
		}                                                                                        \
	}
UPDATE_LOOPS(f32, float, sqrtf)
UPDATE_LOOPS(f64, double, sqrt)
#undef UPDATE_LOOPS

/* One update over n elements; p.. the parameter's and state's elements, g the gradient's. */
static void update_run(const update_params *u, bool f64, double lr, int64_t t, int64_t n, const void *const *d,
                       void *const *o)
{
	switch (u->kind) {
	case UPDATE_SGD:
		if (f64)
			sgd_f64(u, lr, n, d[0], d[1], d[2], o[0], o[1]);
		else
			sgd_f32(u, (float)lr, n, d[0], d[1], d[2], o[0], o[1]);
		break;
	case UPDATE_ADAM:
		if (f64)
			adam_f64(u, lr, t, n, d[0], d[1], d[2], d[3], o[0], o[1], o[2]);
		else
			adam_f32(u, (float)lr, t, n, d[0], d[1], d[2], d[3], o[0], o[1], o[2]);
		break;
	case UPDATE_ADAGRAD:
		if (f64)
			adagrad_f64(u, lr, t, n, d[0], d[1], d[2], o[0], o[1]);
		else
			adagrad_f32(u, (float)lr, t, n, d[0], d[1], d[2], o[0], o[1]);
		break;
	}
}

/* The state tensors the node has: SGD's buffer with momentum, Adam's two, Adagrad's sum. */
static int update_states(const update_params *u)
{
	return u->kind == UPDATE_ADAM ? 2 : u->kind == UPDATE_ADAGRAD ? 1 : u->momentum != 0 ? 1 : 0;
}

static tern_status update_kernel(const tern_kernel_args *a)
{
	const update_params *u = a->params;
	double lr = tern_tensor_get_f64(a->in[0], 0);
	int64_t t = u->kind == UPDATE_SGD ? 1 : tern_tensor_get_i64(a->in[1], 0);
	int k = u->first_tensor, ns = update_states(u);
	const void *d[4] = {a->in[k]->data, a->in[k + 1]->data, NULL, NULL};
	void *o[3] = {a->out[0] ? a->out[0]->data : NULL, NULL, NULL};
	for (int s = 0; s < ns; s++) {
		d[2 + s] = a->in[k + 2 + s]->data;
		o[1 + s] = a->n_out > 1 + s && a->out[1 + s] ? a->out[1 + s]->data : NULL;
	}
	update_run(u, a->in[k]->dtype == TERN_DOUBLE, lr, t, tern_tensor_numel(a->in[k]), d, o);
	return TERN_OK;
}

/* ---------------------------------------------------------------- the same with the gradient as rows */

/* tern.SGDRows(lr, P, I, R[, B]), tern.AdamRows(lr, t, P, I, R, M, V), tern.AdagradRows(lr, t, P, I, R, S):
 * tern.SGD, tern.Adam and tern.Adagrad with a sparse gradient, the rows R[k] of P's first axis at
 * indices I[k] (a Gather's indices and output gradient: any integer type and shape, negative indices
 * from the end, duplicates summed), as tern-autodiff writes them for an embedding table. The update is
 * the dense one with that gradient (duplicate rows summed in the order they come, as the dense
 * gradient sums them), so a model trains the same either way; but no tensor of the table's size is
 * made. Where the rule leaves a row with no gradient unchanged (SGD without momentum or weight decay,
 * Adagrad without weight decay), only the rows touched are visited; otherwise (momentum, Adam's
 * moments, weight decay) every row is, as in the dense update.
 *
 * tern.RowsSumSquare(I, R) with attribute rows (the table's first dimension): the squared norm of that
 * gradient, for clipping by the global norm. */

typedef struct row_ref {
	int64_t row, at;
} row_ref;

static int by_row_then_place(const void *a, const void *b)
{
	const row_ref *x = a, *y = b;
	if (x->row != y->row)
		return x->row < y->row ? -1 : 1;
	return (x->at > y->at) - (x->at < y->at);
}

#define ROWS_ZERO 64 /* rows of zeros for runs of rows with no gradient */

/* Sums duplicate rows: refs (n of them) sorted, sums[u*D..] the sum of the rows at the u-th distinct
 * index, which goes to refs[u].row. Returns the distinct count, or -1 when an index is out of range. */
static int64_t coalesce_rows(const tern_tensor *idx, const tern_tensor *rows, int64_t n_rows, int64_t D,
                             row_ref *refs, void *sums, int64_t *bad)
{
	int64_t n = tern_tensor_numel(idx);
	for (int64_t k = 0; k < n; k++) {
		int64_t r = idx->dtype == TERN_INT32 ? ((const int32_t *)idx->data)[k] : ((const int64_t *)idx->data)[k];
		if (r < -n_rows || r >= n_rows) {
			*bad = r;
			return -1;
		}
		refs[k] = (row_ref){r < 0 ? r + n_rows : r, k};
	}
	qsort(refs, (size_t)n, sizeof *refs, by_row_then_place);
	bool f64 = rows->dtype == TERN_DOUBLE;
	int64_t u = -1;
	for (int64_t k = 0; k < n; k++) {
		bool fresh = u < 0 || refs[k].row != refs[u].row;
		if (fresh)
			refs[++u].row = refs[k].row;
		if (f64) {
			double *dst = (double *)sums + u * D;
			const double *src = (const double *)rows->data + refs[k].at * D;
			for (int64_t e = 0; e < D; e++)
				dst[e] = (fresh ? 0.0 : dst[e]) + src[e];
		} else {
			float *dst = (float *)sums + u * D;
			const float *src = (const float *)rows->data + refs[k].at * D;
			for (int64_t e = 0; e < D; e++)
				dst[e] = (fresh ? 0.0f : dst[e]) + src[e];
		}
	}
	return u + 1;
}

static tern_status rows_kernel(const tern_kernel_args *a)
{
	const update_params *u = a->params;
	double lr = tern_tensor_get_f64(a->in[0], 0);
	int64_t t = u->kind == UPDATE_SGD ? 1 : tern_tensor_get_i64(a->in[1], 0);
	int k = u->first_tensor, ns = update_states(u);
	const tern_tensor *P = a->in[k], *I = a->in[k + 1], *R = a->in[k + 2];
	int64_t n_rows = P->rank ? P->dims[0] : 1, D = n_rows ? tern_tensor_numel(P) / n_rows : 0;
	size_t es = tern_dtype_size(P->dtype);
	bool f64 = P->dtype == TERN_DOUBLE;
	int64_t n = tern_tensor_numel(I);
	row_ref *refs = a->scratch;
	char *zero = (char *)a->scratch + ((size_t)n * sizeof *refs + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	char *sums = zero + (size_t)(ROWS_ZERO * D) * es;
	memset(zero, 0, (size_t)(ROWS_ZERO * D) * es);
	int64_t bad = 0, U = coalesce_rows(I, R, n_rows, D, refs, sums, &bad);
	if (U < 0)
		return tern_node_errorf(a->node, TERN_EDATA, "row index %lld is out of range for %lld rows", (long long)bad,
		                        (long long)n_rows);
	/* the tensors: P, the gradient's place (set per run of rows), the state */
	const char *in[4] = {P->data, NULL, NULL, NULL};
	char *out[3] = {a->out[0] ? a->out[0]->data : NULL, NULL, NULL};
	for (int s = 0; s < ns; s++) {
		in[2 + s] = a->in[k + 3 + s]->data;
		out[1 + s] = a->n_out > 1 + s && a->out[1 + s] ? a->out[1 + s]->data : NULL;
	}
	size_t row_bytes = (size_t)D * es;
	bool touched_only = u->weight_decay == 0 && (u->kind == UPDATE_ADAGRAD || (u->kind == UPDATE_SGD && u->momentum == 0));
	if (touched_only) {
		/* rows without gradient keep their values: copied unless written in place */
		if (out[0] && out[0] != in[0])
			memcpy(out[0], in[0], (size_t)n_rows * row_bytes);
		for (int s = 0; s < ns; s++)
			if (out[1 + s] && out[1 + s] != in[2 + s])
				memcpy(out[1 + s], in[2 + s], (size_t)n_rows * row_bytes);
	}
	int64_t next = 0; /* the next distinct row with a gradient */
	for (int64_t r = 0; r < n_rows;) {
		int64_t len = 1;
		const void *g;
		if (next < U && refs[next].row == r) {
			g = sums + (size_t)next * row_bytes;
			next++;
		} else if (touched_only) {
			r = next < U ? refs[next].row : n_rows;
			continue;
		} else {
			int64_t stop = next < U ? refs[next].row : n_rows;
			len = stop - r < ROWS_ZERO ? stop - r : ROWS_ZERO;
			g = zero;
		}
		size_t at = (size_t)r * row_bytes;
		const void *d[4] = {in[0] + at, g, NULL, NULL};
		void *o[3] = {out[0] ? out[0] + at : NULL, NULL, NULL};
		for (int s = 0; s < ns; s++) {
			d[2 + s] = in[2 + s] + at;
			o[1 + s] = out[1 + s] ? out[1 + s] + at : NULL;
		}
		/* an output left out still needs somewhere to go: the state loops write every one given */
		update_run(u, f64, lr, t, len * D, d, o);
		r += len;
	}
	return TERN_OK;
}

typedef struct sumsq_params {
	int64_t rows, D;
} sumsq_params;

static tern_status rows_sumsq_kernel(const tern_kernel_args *a)
{
	const sumsq_params *sp = a->params;
	const tern_tensor *I = a->in[0], *R = a->in[1];
	int64_t n = tern_tensor_numel(I);
	row_ref *refs = a->scratch;
	char *sums = (char *)a->scratch + ((size_t)n * sizeof *refs + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	int64_t bad = 0, U = coalesce_rows(I, R, sp->rows, sp->D, refs, sums, &bad);
	if (U < 0)
		return tern_node_errorf(a->node, TERN_EDATA, "row index %lld is out of range for %lld rows", (long long)bad,
		                        (long long)sp->rows);
	double acc = 0;
	for (int64_t e = 0; e < U * sp->D; e++) {
		double v = R->dtype == TERN_DOUBLE ? ((const double *)sums)[e] : ((const float *)sums)[e];
		acc += v * v;
	}
	if (a->out[0]->dtype == TERN_DOUBLE)
		*(double *)a->out[0]->data = acc;
	else
		*(float *)a->out[0]->data = (float)acc;
	return TERN_OK;
}

/* I and R of a gradient as rows against a table of n_rows rows of `row` elements: I integer, R of
 * I's shape followed by the row's. */
static tern_status check_rows(const tern_node *node, const tern_tensor *I, const tern_tensor *R, int dtype,
                              const int64_t *row_dims, int row_rank)
{
	char a[128], b[128];
	if (!I || (I->dtype != TERN_INT32 && I->dtype != TERN_INT64))
		return tern_node_errorf(node, TERN_EDATA, "the row indices must be int32 or int64");
	bool ok = R && R->dtype == dtype && R->rank == I->rank + row_rank;
	for (int d = 0; ok && d < I->rank; d++)
		ok = R->dims[d] == I->dims[d];
	for (int d = 0; ok && d < row_rank; d++)
		ok = R->dims[I->rank + d] == row_dims[d];
	if (!ok)
		return tern_node_errorf(node, TERN_EDATA, "rows %s do not fit indices %s and rows of the table's shape",
		                        R ? tern_shape_str(R->dtype, R->rank, R->dims, a, sizeof a) : "(none)",
		                        tern_shape_str(I->dtype, I->rank, I->dims, b, sizeof b));
	return TERN_OK;
}

static size_t rows_scratch(int64_t n, int64_t D, size_t es, bool zero)
{
	size_t refs = ((size_t)n * sizeof(row_ref) + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	return refs + (size_t)((zero ? ROWS_ZERO : 0) + n) * (size_t)D * es + 1;
}

static tern_status rows_sumsq_prepare(tern_prepare_args *p)
{
	const tern_tensor *I = p->in[0], *R = p->n_in > 1 ? p->in[1] : NULL;
	int64_t rows = tern_attr_int(p->node, "rows", -1);
	if (p->n_in != 2 || rows < 0)
		return tern_node_errorf(p->node, TERN_EDATA, "RowsSumSquare takes indices and rows and a 'rows' attribute");
	if (!R || (R->dtype != TERN_FLOAT && R->dtype != TERN_DOUBLE) || R->rank < I->rank)
		return tern_node_errorf(p->node, TERN_EDATA, "the rows must be float or double, of the indices' shape and more");
	tern_status st = check_rows(p->node, I, R, R->dtype, R->dims + I->rank, R->rank - I->rank);
	if (st)
		return st;
	sumsq_params *sp = calloc(1, sizeof *sp);
	if (!sp)
		return tern_errorf(TERN_EOS, "out of memory");
	sp->rows = rows;
	sp->D = tern_numel(R->rank - I->rank, R->dims + I->rank);
	tern_set_shape(p->out[0], R->dtype, 0, NULL);
	p->params = sp;
	p->free_params = free;
	p->kernel = rows_sumsq_kernel;
	p->scratch_bytes = rows_scratch(tern_tensor_numel(I), sp->D, tern_dtype_size(R->dtype), false);
	return TERN_OK;
}

static tern_status update_setup(tern_prepare_args *p, enum update_kind kind, bool rows)
{
	const tern_node *node = p->node;
	int first = kind == UPDATE_SGD ? 1 : 2, states = kind == UPDATE_ADAM ? 2 : 1, grads = rows ? 2 : 1;
	bool momentum = tern_attr_float(node, "momentum", 0.0f) != 0;
	int want_in = first + 1 + grads + (kind == UPDATE_SGD ? (momentum ? 1 : 0) : states);
	tern_status st;
	if (p->n_in != want_in)
		return tern_node_errorf(node, TERN_EDATA, "%d inputs; %d expected", p->n_in, want_in);
	if ((st = scalar_input(node, p->in[0], 0, "lr", TERN_DT(FLOAT) | TERN_DT(DOUBLE))))
		return st;
	if (first == 2 && (st = scalar_input(node, p->in[1], 1, "t", TERN_DT(INT64))))
		return st;
	const tern_tensor *x = p->in[first];
	if (!x || (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE))
		return tern_node_errorf(node, TERN_EDATA, "the parameter must be float or double");
	if (rows && x->rank < 1)
		return tern_node_errorf(node, TERN_EDATA, "a gradient as rows needs a parameter of rank 1 or more");
	if (rows && (st = check_rows(node, p->in[first + 1], p->in[first + 2], x->dtype, x->dims + 1, x->rank - 1)))
		return st;
	for (int i = first + (rows ? 3 : 1); i < p->n_in; i++)
		if (!p->in[i] || p->in[i]->dtype != x->dtype || !same_shape(p->in[i], x))
			return tern_node_errorf(node, TERN_EDATA, "input %d must have the parameter's type and shape", i);
	for (int o = 0; o < p->n_out; o++)
		if (p->out[o])
			tern_set_shape(p->out[o], x->dtype, x->rank, x->dims);
	update_params *u = calloc(1, sizeof *u);
	if (!u)
		return tern_errorf(TERN_EOS, "out of memory");
	*u = (update_params){
	        .kind = kind,
	        .momentum = tern_attr_float(node, "momentum", 0.0f),
	        .weight_decay = tern_attr_float(node, "weight_decay", 0.0f),
	        .beta1 = tern_attr_float(node, "beta1", 0.9f),
	        .beta2 = tern_attr_float(node, "beta2", 0.999f),
	        .eps = tern_attr_float(node, "epsilon", kind == UPDATE_ADAGRAD ? 1e-10f : 1e-8f),
	        .lr_decay = tern_attr_float(node, "lr_decay", 0.0f),
	        .nesterov = (int)tern_attr_int(node, "nesterov", 0),
	        .decoupled = (int)tern_attr_int(node, "decoupled", 0),
	        .first_tensor = first,
	};
	/* every state output the loops write needs a place: an omitted one is a design error of the caller */
	for (int s = 0; s < update_states(u); s++)
		if (p->n_out < 2 + s || !p->out[1 + s]) {
			free(u);
			return tern_node_errorf(node, TERN_EDATA, "output %d (the new state) is required", 1 + s);
		}
	p->params = u;
	p->free_params = free;
	p->kernel = rows ? rows_kernel : update_kernel;
	if (rows) {
		int64_t D = x->dims[0] ? tern_tensor_numel(x) / x->dims[0] : 0;
		p->scratch_bytes = rows_scratch(tern_tensor_numel(p->in[first + 1]), D, tern_dtype_size(x->dtype), true);
	}
	/* element by element: P and the state may be updated in place */
	for (int i = first; i < p->n_in; i++)
		if (i > first + grads)
			p->inplace_inputs |= 1u << i;
	p->inplace_inputs |= 1u << first;
	return TERN_OK;
}

static tern_status sgd_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_SGD, false);
}
static tern_status adam_update_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAM, false);
}
static tern_status adagrad_update_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAGRAD, false);
}
static tern_status sgd_rows_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_SGD, true);
}
static tern_status adam_rows_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAM, true);
}
static tern_status adagrad_rows_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAGRAD, true);
}

static const tern_op ops[] = {
        {TERN_DOMAIN_NAME, "SumTo", 1, 0, sum_to_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "SGD", 1, 0, sgd_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "Adam", 1, 0, adam_update_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "Adagrad", 1, 0, adagrad_update_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "SGDRows", 1, 0, sgd_rows_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "AdamRows", 1, 0, adam_rows_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "AdagradRows", 1, 0, adagrad_rows_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "RowsSumSquare", 1, 0, rows_sumsq_prepare, 0, "training"},
        {TRAINING_DOMAIN, "Adagrad", 1, 0, adagrad_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Adam", 1, 0, adam_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Momentum", 1, 0, momentum_prepare, 0, "loss"},
};

const tern_op_table tern_ops_training = {ops, TERN_ARRAY_LEN(ops)};
