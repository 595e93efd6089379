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

static tern_status update_kernel(const tern_kernel_args *a)
{
	const update_params *u = a->params;
	double lr = tern_tensor_get_f64(a->in[0], 0);
	int64_t t = u->kind == UPDATE_SGD ? 1 : tern_tensor_get_i64(a->in[1], 0);
	int k = u->first_tensor;
	const tern_tensor *p = a->in[k];
	int64_t n = tern_tensor_numel(p);
	bool f64 = p->dtype == TERN_DOUBLE;
#define D(i) (a->in[k + (i)] ? a->in[k + (i)]->data : NULL)
#define O(i) (a->out[i] ? a->out[i]->data : NULL)
	switch (u->kind) {
	case UPDATE_SGD:
		if (f64)
			sgd_f64(u, lr, n, D(0), D(1), a->n_in > k + 2 ? D(2) : NULL, O(0), a->n_out > 1 ? O(1) : NULL);
		else
			sgd_f32(u, (float)lr, n, D(0), D(1), a->n_in > k + 2 ? D(2) : NULL, O(0), a->n_out > 1 ? O(1) : NULL);
		break;
	case UPDATE_ADAM:
		if (f64)
			adam_f64(u, lr, t, n, D(0), D(1), D(2), D(3), O(0), O(1), O(2));
		else
			adam_f32(u, (float)lr, t, n, D(0), D(1), D(2), D(3), O(0), O(1), O(2));
		break;
	case UPDATE_ADAGRAD:
		if (f64)
			adagrad_f64(u, lr, t, n, D(0), D(1), D(2), O(0), O(1));
		else
			adagrad_f32(u, (float)lr, t, n, D(0), D(1), D(2), O(0), O(1));
		break;
	}
#undef D
#undef O
	return TERN_OK;
}

static tern_status update_setup(tern_prepare_args *p, enum update_kind kind)
{
	const tern_node *node = p->node;
	int first = kind == UPDATE_SGD ? 1 : 2, states = kind == UPDATE_ADAM ? 2 : 1;
	bool momentum = tern_attr_float(node, "momentum", 0.0f) != 0;
	int want_in = first + 2 + (kind == UPDATE_SGD ? (momentum ? 1 : 0) : states);
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
	for (int i = first + 1; i < p->n_in; i++)
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
	p->params = u;
	p->free_params = free;
	p->kernel = update_kernel;
	return TERN_OK;
}

static tern_status sgd_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_SGD);
}
static tern_status adam_update_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAM);
}
static tern_status adagrad_update_prepare(tern_prepare_args *p)
{
	return update_setup(p, UPDATE_ADAGRAD);
}

static const tern_op ops[] = {
        {TERN_DOMAIN_NAME, "SumTo", 1, 0, sum_to_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "SGD", 1, 0, sgd_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "Adam", 1, 0, adam_update_prepare, 0, "training"},
        {TERN_DOMAIN_NAME, "Adagrad", 1, 0, adagrad_update_prepare, 0, "training"},
        {TRAINING_DOMAIN, "Adagrad", 1, 0, adagrad_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Adam", 1, 0, adam_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Momentum", 1, 0, momentum_prepare, 0, "loss"},
};

const tern_op_table tern_ops_training = {ops, TERN_ARRAY_LEN(ops)};
