/* training.c — the training operators of ai.onnx.preview.training: the Adagrad, Adam and Momentum update
 * rules, each over any number of tensors. (The loss functions themselves live with the softmax, in softmax.c.) */
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

static const tern_op ops[] = {
        {TERN_DOMAIN_NAME, "SumTo", 1, 0, sum_to_prepare, 0, "training"},
        {TRAINING_DOMAIN, "Adagrad", 1, 0, adagrad_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Adam", 1, 0, adam_prepare, 0, "loss"},
        {TRAINING_DOMAIN, "Momentum", 1, 0, momentum_prepare, 0, "loss"},
};

const tern_op_table tern_ops_training = {ops, TERN_ARRAY_LEN(ops)};
