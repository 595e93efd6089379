/* test_eager.c — the C eager API: operators by name with attributes, the cache of prepared calls,
 * autograd against central finite differences in float64, the optimizers against a hand computation,
 * and one clear error for each kind of misuse. */
#include "check.h"

#include "tern_eager.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

static tern_var *vec(tern_ctx *c, int dtype, int rank, const int64_t *dims, const double *v)
{
	tern_var *t = NULL;
	CHECK_OK(tern_var_new(c, dtype, rank, dims, &t));
	if (!t)
		return NULL;
	const tern_tensor *x = tern_var_tensor(t);
	for (int64_t i = 0; i < tern_tensor_numel(x); i++) {
		if (dtype == TERN_DOUBLE)
			((double *)x->data)[i] = v[i];
		else if (dtype == TERN_FLOAT)
			((float *)x->data)[i] = (float)v[i];
		else
			((int64_t *)x->data)[i] = (int64_t)v[i];
	}
	return t;
}

static double at(const tern_var *t, int64_t i)
{
	return tern_tensor_get_f64(tern_var_tensor(t), i);
}

static tern_var *call1(tern_ctx *c, const char *op, tern_var *a, tern_var *b, const tern_attr_arg *attrs, int n_attrs)
{
	tern_var *in[2] = {a, b}, *out = NULL;
	CHECK_OK(tern_call(c, "", op, in, b ? 2 : 1, attrs, n_attrs, &out, 1));
	return out;
}

/* f(x, w, b) = ReduceSum(Tanh(Gemm(x, w, b, transB=1)) * x2): a loss through broadcasting. */
static tern_var *loss_of(tern_ctx *c, tern_var *x, tern_var *w, tern_var *b)
{
	tern_attr_arg tb = {.name = "transB", .kind = TERN_ATTR_INT, .i = 1};
	tern_var *g = call1(c, "Gemm", x, w, &tb, 1);
	tern_var *in3[3] = {x, w, b}, *g3 = NULL;
	CHECK_OK(tern_call(c, "", "Gemm", in3, 3, &tb, 1, &g3, 1));
	tern_var *t = call1(c, "Tanh", g3, NULL, NULL, 0);
	tern_var *m = call1(c, "Mul", t, g, NULL, 0);
	tern_attr_arg kd = {.name = "keepdims", .kind = TERN_ATTR_INT, .i = 0};
	tern_var *s = call1(c, "ReduceSum", m, NULL, &kd, 1);
	tern_var_unref(g);
	tern_var_unref(g3);
	tern_var_unref(t);
	tern_var_unref(m);
	return s;
}

static void autograd(tern_ctx *c)
{
	int64_t dx[2] = {3, 4}, dw[2] = {2, 4}, db[1] = {2};
	double xv[12], wv[8], bv[2] = {0.1, -0.2};
	for (int i = 0; i < 12; i++)
		xv[i] = sin(i * 0.7) * 0.8;
	for (int i = 0; i < 8; i++)
		wv[i] = cos(i * 1.3) * 0.5;
	tern_var *x = vec(c, TERN_DOUBLE, 2, dx, xv), *w = vec(c, TERN_DOUBLE, 2, dw, wv), *b = vec(c, TERN_DOUBLE, 1, db, bv);
	CHECK_OK(tern_var_set_requires_grad(w, 1));
	CHECK_OK(tern_var_set_requires_grad(b, 1));
	tern_var *l = loss_of(c, x, w, b);
	CHECK(l && tern_var_requires_grad(l) && !tern_var_is_leaf(l));
	CHECK_OK(tern_backward(l, NULL));
	tern_var *gw = tern_var_grad(w), *gb = tern_var_grad(b);
	CHECK(gw && gb && tern_var_grad(x) == NULL);
	/* central differences */
	int no = tern_ctx_set_grad_enabled(c, 0);
	double worst = 0;
	for (int p = 0; p < 2 && gw && gb; p++) {
		tern_var *param = p ? b : w, *grad = p ? gb : gw;
		const tern_tensor *pt = tern_var_tensor(param);
		for (int64_t i = 0; i < tern_tensor_numel(pt); i++) {
			double *e = &((double *)pt->data)[i], keep = *e, h = 1e-6;
			*e = keep + h;
			tern_var *lp = loss_of(c, x, w, b);
			*e = keep - h;
			tern_var *lm = loss_of(c, x, w, b);
			*e = keep;
			double num = (at(lp, 0) - at(lm, 0)) / (2 * h), err = fabs(num - at(grad, i));
			worst = err > worst ? err : worst;
			tern_var_unref(lp);
			tern_var_unref(lm);
		}
	}
	tern_ctx_set_grad_enabled(c, no);
	CHECK(worst < 1e-7);
	/* the tape is spent */
	CHECK(tern_backward(l, NULL) == TERN_EUSAGE);
	tern_var_unref(l);
	/* an optimizer: SGD with momentum 0.5, lr 0.1 on the gradient just computed */
	double w0 = at(w, 0), g0 = at(gw, 0);
	tern_optim_options o = {.kind = "sgd", .lr = 0.1, .momentum = 0.5, .weight_decay = -1, .eps = -1};
	tern_optim *opt = NULL;
	tern_var *params[2] = {w, b};
	CHECK_OK(tern_optim_create(c, &o, params, 2, &opt));
	CHECK_OK(tern_optim_step(opt));
	CHECK(fabs(at(w, 0) - (w0 - 0.1 * g0)) < 1e-12);
	CHECK_OK(tern_optim_step(opt)); /* same gradient again: buffer 1.5 g */
	CHECK(fabs(at(w, 0) - (w0 - 0.1 * g0 - 0.1 * 1.5 * g0)) < 1e-12);
	tern_optim_zero_grad(opt);
	CHECK(tern_var_grad(w) == NULL);
	tern_optim_free(opt);
	tern_var_unref(x);
	tern_var_unref(w);
	tern_var_unref(b);
}

static void calls(tern_ctx *c)
{
	int64_t d[1] = {4};
	double av[4] = {1, -2, 3, -4}, bv[4] = {0.5, 0.5, 0.5, 0.5};
	tern_var *a = vec(c, TERN_FLOAT, 1, d, av), *b = vec(c, TERN_FLOAT, 1, d, bv);
	int64_t h0, m0, h1, m1;
	tern_ctx_cache_stats(c, &h0, &m0);
	for (int i = 0; i < 10; i++) {
		tern_var *s = call1(c, "Add", a, b, NULL, 0);
		CHECK(s && at(s, 1) == -1.5);
		tern_var_unref(s);
	}
	tern_ctx_cache_stats(c, &h1, &m1);
	CHECK(m1 - m0 == 1 && h1 - h0 == 9);
	/* an attribute, and an operator whose prepare needs an input's values (Reshape's shape) */
	tern_attr_arg alpha = {.name = "alpha", .kind = TERN_ATTR_FLOAT, .f = 0.5};
	tern_var *lr = call1(c, "LeakyRelu", a, NULL, &alpha, 1);
	CHECK(lr && at(lr, 3) == -2);
	int64_t sd[1] = {2};
	double shape[2] = {2, 2};
	tern_var *sh = vec(c, TERN_INT64, 1, sd, shape);
	tern_var *r = call1(c, "Reshape", a, sh, NULL, 0);
	CHECK(r && tern_var_tensor(r)->rank == 2 && at(r, 2) == 3);
	/* several outputs */
	tern_attr_arg k = {.name = "axis", .kind = TERN_ATTR_INT, .i = 0};
	tern_var *outs[2] = {NULL}, *in1[1] = {a};
	CHECK(tern_op_outputs("", "Split", &k, 1, in1, 1) == 2);
	tern_attr_arg n2[2] = {k, {.name = "num_outputs", .kind = TERN_ATTR_INT, .i = 2}};
	CHECK_OK(tern_call(c, "", "Split", in1, 1, n2, 2, outs, -1));
	CHECK(outs[0] && outs[1] && at(outs[1], 0) == 3);
	tern_var_unref(outs[0]);
	tern_var_unref(outs[1]);
	/* seeded random operators: the same seed, the same numbers */
	tern_attr_arg rn[1] = {{.name = "shape", .kind = TERN_ATTR_INTS, .ints = d, .n = 1}};
	tern_var *r1 = NULL, *r2 = NULL, *r3 = NULL;
	tern_ctx_manual_seed(c, 7);
	CHECK_OK(tern_call(c, "", "RandomNormal", NULL, 0, rn, 1, &r1, 1));
	CHECK_OK(tern_call(c, "", "RandomNormal", NULL, 0, rn, 1, &r3, 1));
	tern_ctx_manual_seed(c, 7);
	CHECK_OK(tern_call(c, "", "RandomNormal", NULL, 0, rn, 1, &r2, 1));
	CHECK(r1 && r2 && r3 && memcmp(tern_var_tensor(r1)->data, tern_var_tensor(r2)->data, 16) == 0);
	CHECK(r1 && r3 && memcmp(tern_var_tensor(r1)->data, tern_var_tensor(r3)->data, 16) != 0);
	tern_var_unref(r1);
	tern_var_unref(r2);
	tern_var_unref(r3);
	/* misuse: one error each */
	int64_t d3[1] = {3};
	tern_var *three = vec(c, TERN_FLOAT, 1, d3, av), *out = NULL, *in2[2] = {a, three};
	CHECK(tern_call(c, "", "Add", in2, 2, NULL, 0, &out, 1) == TERN_EDATA && !out);
	CHECK(strstr(tern_error(), "Add") != NULL);
	CHECK(tern_call(c, "", "NoSuchOp", in2, 1, NULL, 0, &out, 1) == TERN_EUSAGE && strstr(tern_error(), "unknown"));
	/* required inputs missing: an error from the schema, not a prepare that assumes them */
	CHECK(tern_call(c, "", "Conv", NULL, 0, NULL, 0, &out, 1) == TERN_EUSAGE && strstr(tern_error(), "at least 2"));
	tern_var *none_first[2] = {NULL, a};
	CHECK(tern_call(c, "", "Gemm", none_first, 2, NULL, 0, &out, 1) == TERN_EUSAGE &&
	      strstr(tern_error(), "input 0 is required"));
	CHECK(tern_call(c, "tern", "ConvGradWeight", in2, 2, NULL, 0, &out, 1) == TERN_EUSAGE);
	/* an attribute the operator does not have: an error naming it, not its default silently */
	tern_attr_arg typo = {.name = "alpah", .kind = TERN_ATTR_FLOAT, .f = 2};
	CHECK(tern_call(c, "", "Elu", in2, 1, &typo, 1, &out, 1) == TERN_EUSAGE && !out &&
	      strstr(tern_error(), "unknown attribute 'alpah'") && strstr(tern_error(), " alpha "));
	tern_attr_arg prefix = {.name = "alph", .kind = TERN_ATTR_FLOAT, .f = 2};
	CHECK(tern_call(c, "", "Elu", in2, 1, &prefix, 1, &out, 1) == TERN_EUSAGE);
	tern_attr_arg right = {.name = "alpha", .kind = TERN_ATTR_FLOAT, .f = 2};
	CHECK_OK(tern_call(c, "", "Elu", in2, 1, &right, 1, &out, 1));
	tern_var_unref(out);
	out = NULL;
	CHECK_OK(tern_var_set_requires_grad(a, 1));
	tern_var *sq = call1(c, "Mul", a, a, NULL, 0);
	CHECK(tern_backward(sq, NULL) == TERN_EUSAGE && strstr(tern_error(), "needs a gradient"));
	CHECK(tern_var_set_requires_grad(sq, 0) == TERN_EUSAGE);
	/* no_grad: nothing recorded */
	int was = tern_ctx_set_grad_enabled(c, 0);
	tern_var *ng = call1(c, "Mul", a, a, NULL, 0);
	CHECK(ng && !tern_var_requires_grad(ng) && tern_var_is_leaf(ng));
	tern_ctx_set_grad_enabled(c, was);
	tern_var_unref(ng);
	tern_var_unref(sq);
	tern_var_unref(three);
	tern_var_unref(lr);
	tern_var_unref(sh);
	tern_var_unref(r);
	tern_var_unref(a);
	tern_var_unref(b);
}

static void freed_context(void)
{
	tern_ctx *c = NULL;
	CHECK_OK(tern_ctx_create(1, &c));
	int64_t d[1] = {2};
	double v[2] = {1, 2};
	tern_var *a = vec(c, TERN_FLOAT, 1, d, v);
	tern_ctx_free(c);
	CHECK(a && at(a, 1) == 2); /* still readable */
	tern_var *in[1] = {a}, *out = NULL;
	CHECK(tern_call(c, "", "Relu", in, 1, NULL, 0, &out, 1) == TERN_EUSAGE && strstr(tern_error(), "freed"));
	tern_var_unref(a); /* the context's memory goes with its last tensor */
}

/* A tape 100,000 calls deep: backward through it, and its release, go without recursion. */
static void deep_tape(tern_ctx *c)
{
	int64_t d[1] = {4};
	double v[4] = {1, 2, 3, 4}, h[4] = {1, 1, 1, 1};
	tern_var *x = vec(c, TERN_DOUBLE, 1, d, v), *k = vec(c, TERN_DOUBLE, 1, d, h), *y = tern_var_ref(x);
	CHECK_OK(tern_var_set_requires_grad(x, 1));
	for (int i = 0; i < 100000 && y; i++) {
		tern_var *in[2] = {y, k}, *z = NULL;
		CHECK_OK(tern_call(c, "", i % 2 ? "Add" : "Mul", in, 2, NULL, 0, &z, 1));
		tern_var_unref(y);
		y = z;
	}
	tern_attr_arg kd = {.name = "keepdims", .kind = TERN_ATTR_INT, .i = 0};
	tern_var *s = y ? call1(c, "ReduceSum", y, NULL, &kd, 1) : NULL;
	CHECK_OK(tern_backward(s, NULL));
	CHECK(tern_var_grad(x) && at(tern_var_grad(x), 0) == 1);
	tern_var_unref(s);
	tern_var_unref(y);
	tern_var_unref(k);
	tern_var_unref(x);
	/* and a tape that is only freed, never differentiated */
	x = vec(c, TERN_DOUBLE, 1, d, v);
	CHECK_OK(tern_var_set_requires_grad(x, 1));
	y = tern_var_ref(x);
	for (int i = 0; i < 100000 && y; i++) {
		tern_var *in[1] = {y}, *z = NULL;
		CHECK_OK(tern_call(c, "", "Neg", in, 1, NULL, 0, &z, 1));
		tern_var_unref(y);
		y = z;
	}
	tern_var_unref(y);
	tern_var_unref(x);
}

/* Tracing from C: two steps of one path, then a step on another (another call site), written to a
 * file and loaded back: one host tensor as an input, the tensor made before as a constant, an If
 * for the two paths, the value read as the output. */
static void traced(void)
{
	tern_ctx *c = NULL;
	CHECK_OK(tern_ctx_create(1, &c));
	if (!c)
		return;
	char path[] = "/tmp/tern-test-trace-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	tern_trace_options o = {.path = path, .steps = 3};
	CHECK_OK(tern_trace_start(c, &o));
	int64_t d[1] = {3};
	double wv[3] = {0.5, -1, 2};
	tern_var *w = vec(c, TERN_FLOAT, 1, d, wv);
	for (int step = 0; step < 3; step++) {
		CHECK_OK(tern_trace_step_begin(c));
		double xv[3] = {step, 1, -step};
		tern_var *x = vec(c, TERN_FLOAT, 1, d, xv);
		tern_var *m = call1(c, "Mul", x, w, NULL, 0);
		tern_var *y = step < 2 ? call1(c, "Relu", m, NULL, NULL, 0) : call1(c, "Tanh", m, NULL, NULL, 0);
		tern_trace_fetch(y);
		CHECK(fabs(at(y, 1) - (step < 2 ? 0 : tanh(-1))) < 1e-6);
		tern_var_unref(x);
		tern_var_unref(m);
		tern_var_unref(y);
		CHECK_OK(tern_trace_step_end(c)); /* the third writes the file */
	}
	tern_var_unref(w);
	CHECK_OK(tern_trace_finish(c));
	tern_model *model = NULL;
	CHECK_OK(tern_model_load(path, &model));
	char *text = NULL;
	size_t size = 0;
	if (model)
		CHECK_OK(tern_model_save_text(model, 1, &text, &size));
	CHECK(text && strstr(text, "int64 tern_path") && strstr(text, "float[3] feed_0") && strstr(text, "const_0") &&
	      strstr(text, "= Mul (feed_0, const_0)") && strstr(text, "If (") && strstr(text, "Relu") &&
	      strstr(text, "Tanh"));
	if (text && !strstr(text, "Relu"))
		fputs(text, stderr);
	free(text);
	tern_model_free(model);
	remove(path);
	tern_ctx_free(c);
}

/* A context of `threads` threads, with asynchronous kernels or not. */
static tern_ctx *async_ctx(int threads, int async)
{
	tern_ctx *c = NULL;
	CHECK_OK(tern_ctx_create(threads, &c));
	if (c)
		CHECK(tern_ctx_set_async(c, async) == 0);
	return c;
}

/* An optimizer of KIND ("sgd", "adam") with lr 0.01 and the defaults, over w. */
static tern_optim *optim_of(tern_ctx *c, const char *kind, tern_var *w)
{
	tern_optim_options o = {.kind = kind, .lr = 0.01, .momentum = -1, .weight_decay = -1, .beta1 = -1, .beta2 = -1,
	                        .eps = -1, .lr_decay = -1};
	tern_optim *opt = NULL;
	CHECK_OK(tern_optim_create(c, &o, &w, 1, &opt));
	return opt;
}

/* The first n floats of w, into out. */
static void floats_of(tern_var *w, float *out, int64_t n)
{
	const tern_tensor *t = tern_var_tensor(w);
	for (int64_t i = 0; i < n && i < tern_tensor_numel(t); i++)
		out[i] = ((const float *)t->data)[i];
}

/* A training loop of MatMul, Add, Relu, Softmax, Dropout, Reshape of a computed shape, backward and
 * Adam, run on a synchronous and on an asynchronous context: every loss, gradient and final weight
 * the same bit for bit. The asynchronous one reads its loss right after the call (the read waits), and
 * a kernel's failure (Gather out of range) comes back from the next call or tern_ctx_sync. */
static float async_loop(int async, float *w_out, int64_t n_w)
{
	tern_ctx *c = async_ctx(2, async);
	if (!c)
		return 0;
	tern_ctx_manual_seed(c, 7);
	double xs[8 * 16], ws[16 * 16];
	for (int i = 0; i < 8 * 16; i++)
		xs[i] = sin(0.37 * i);
	for (int i = 0; i < 16 * 16; i++)
		ws[i] = 0.1 * cos(0.11 * i);
	tern_var *x = vec(c, TERN_FLOAT, 2, (int64_t[]){8, 16}, xs), *w = vec(c, TERN_FLOAT, 2, (int64_t[]){16, 16}, ws);
	CHECK_OK(tern_var_set_requires_grad(w, 1));
	tern_optim *opt = optim_of(c, "adam", w);
	float sum = 0;
	for (int step = 0; step < 6 && opt; step++) {
		tern_var *h = call1(c, "MatMul", x, w, NULL, 0), *r = call1(c, "Relu", h, NULL, NULL, 0);
		tern_attr_arg ax = {.name = "axis", .kind = TERN_ATTR_INT, .i = 1};
		tern_var *sm = call1(c, "Softmax", r, NULL, &ax, 1), *d = NULL, *in1[1] = {sm};
		CHECK_OK(tern_call(c, "", "Dropout", in1, 1, NULL, 0, &d, 1)); /* ratio 0.5 only in training mode: identity */
		tern_var *shape = call1(c, "Shape", d, NULL, NULL, 0), *flat = call1(c, "ReduceProd", shape, NULL, NULL, 0);
		tern_var *one = vec(c, TERN_INT64, 1, (int64_t[]){1}, (double[]){1});
		tern_var *in2[2] = {flat, one}, *cat = NULL;
		tern_attr_arg a0 = {.name = "axis", .kind = TERN_ATTR_INT, .i = 0};
		in2[0] = call1(c, "Reshape", flat, one, NULL, 0);
		CHECK_OK(tern_call(c, "", "Concat", in2, 2, &a0, 1, &cat, 1));
		tern_var *col = call1(c, "Reshape", d, cat, NULL, 0), *sq = call1(c, "Mul", col, col, NULL, 0);
		tern_var *loss = call1(c, "ReduceSum", sq, NULL, NULL, 0);
		float l = loss ? (float)at(loss, 0) : 0; /* read at once: waits for the calls that make it */
		sum += l;
		if (loss)
			CHECK_OK(tern_backward(loss, NULL));
		CHECK_OK(tern_optim_step(opt));
		tern_optim_zero_grad(opt);
		tern_var *vs[] = {h, r, sm, d, shape, flat, one, in2[0], cat, col, sq, loss};
		for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++)
			tern_var_unref(vs[k]);
	}
	floats_of(w, w_out, n_w);
	if (async) {
		/* a failing kernel: one handed to the thread (a Gather from 16384 floats: more than a call
		 * run on the caller's thread reads) reported by the next call or by the wait for all; a
		 * small one, run by the caller when nothing is in flight, by the call itself */
		tern_var *idx = vec(c, TERN_INT64, 1, (int64_t[]){1}, (double[]){40}), *big = NULL, *g = NULL;
		CHECK_OK(tern_var_new(c, TERN_FLOAT, 2, (int64_t[]){8, 2048}, &big));
		tern_var *in_big[2] = {big, idx}, *in_small[2] = {x, idx};
		CHECK_OK(tern_call(c, "", "Gather", in_big, 2, NULL, 0, &g, 1));
		CHECK(tern_ctx_sync(c) == TERN_EDATA);
		CHECK_OK(tern_ctx_sync(c)); /* reported once */
		tern_var_unref(g);
		g = NULL;
		CHECK(tern_call(c, "", "Gather", in_small, 2, NULL, 0, &g, 1) == TERN_EDATA && g == NULL);
		CHECK_OK(tern_ctx_sync(c));
		tern_var_unref(big);
		tern_var_unref(idx);
		CHECK(tern_ctx_set_async(c, 0) == 1);
	}
	tern_optim_free(opt);
	tern_var_unref(x);
	tern_var_unref(w);
	tern_ctx_free(c);
	return sum;
}

static void asynchronous(void)
{
	float w0[256], w1[256];
	float l0 = async_loop(0, w0, 256), l1 = async_loop(1, w1, 256);
	CHECK(l0 == l1 && l0 != 0);
	CHECK(memcmp(w0, w1, sizeof w0) == 0);
}

/* A convolution trained on a context of one thread, synchronous and asynchronous. With asynchronous
 * kernels the caller, waiting for each step's loss, runs parts of the kernels in flight (the team of
 * the kernels' thread and the caller's); a kernel that would keep a partial sum per thread (the
 * weight gradient, by images) keeps one as on one thread: every loss and weight the same bit for bit. */
static float team_loop(int async, float *w_out, int64_t n_w)
{
	tern_ctx *c = async_ctx(1, async);
	if (!c)
		return 0;
	enum { N = 16, C = 8, S = 8 }; /* 8192 input elements: the team's size of call */
	double *xs = malloc(N * C * S * S * sizeof *xs), ws[C * C * 9];
	for (int i = 0; i < N * C * S * S && xs; i++)
		xs[i] = sin(0.013 * i);
	for (int i = 0; i < C * C * 9; i++)
		ws[i] = 0.05 * cos(0.7 * i);
	tern_var *x = xs ? vec(c, TERN_FLOAT, 4, (int64_t[]){N, C, S, S}, xs) : NULL;
	tern_var *w = vec(c, TERN_FLOAT, 4, (int64_t[]){C, C, 3, 3}, ws);
	CHECK_OK(tern_var_set_requires_grad(w, 1));
	tern_optim *opt = optim_of(c, "sgd", w);
	float sum = 0;
	int64_t pads[4] = {1, 1, 1, 1};
	tern_attr_arg pad = {.name = "pads", .kind = TERN_ATTR_INTS, .ints = pads, .n = 4};
	for (int step = 0; step < 5 && opt && x; step++) {
		tern_var *y = call1(c, "Conv", x, w, &pad, 1), *r = call1(c, "Tanh", y, NULL, NULL, 0);
		tern_var *sq = call1(c, "Mul", r, r, NULL, 0), *loss = call1(c, "ReduceSum", sq, NULL, NULL, 0);
		float l = loss ? (float)at(loss, 0) : 0;
		sum += l;
		if (loss)
			CHECK_OK(tern_backward(loss, NULL));
		CHECK_OK(tern_optim_step(opt));
		tern_optim_zero_grad(opt);
		tern_var *vs[] = {y, r, sq, loss};
		for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++)
			tern_var_unref(vs[k]);
	}
	floats_of(w, w_out, n_w);
	tern_optim_free(opt);
	tern_var_unref(x);
	tern_var_unref(w);
	free(xs);
	tern_ctx_free(c);
	return sum;
}

static void team(void)
{
	float w0[8 * 8 * 9], w1[8 * 8 * 9];
	float l0 = team_loop(0, w0, 8 * 8 * 9), l1 = team_loop(1, w1, 8 * 8 * 9);
	CHECK(l0 == l1 && l0 != 0);
	CHECK(memcmp(w0, w1, sizeof w0) == 0);
}

/* Asynchronous kernels reuse bytes in the thread's order: a tensor dropped while a call that reads it
 * is still in flight gives its bytes back at once, and the next call's output takes them (the call
 * runs after the reader has). A tensor the host made is freed only once its reader has run, and bytes
 * the caller's thread writes itself (a small call run inline) wait for their last call. Every result
 * as computed synchronously; AddressSanitizer sees any byte freed or written too early. */
static void stream_order(void)
{
	tern_ctx *c = NULL;
	CHECK_OK(tern_ctx_create(1, &c));
	if (!c)
		return;
	CHECK(tern_ctx_set_async(c, 1) == 0);
	enum { N = 1 << 15 }; /* past what a call run on the caller's thread may read */
	double *xs = malloc(N * sizeof *xs);
	for (int i = 0; i < N && xs; i++)
		xs[i] = i % 97;
	tern_var *x = vec(c, TERN_FLOAT, 1, (int64_t[]){N}, xs), *one = vec(c, TERN_FLOAT, 1, (int64_t[]){1}, (double[]){1});
	tern_var *prods[8] = {NULL};
	for (int r = 0; r < 8; r++) {
		tern_var *a = call1(c, "Add", x, one, NULL, 0); /* x + 1 */
		prods[r] = call1(c, "Mul", a, a, NULL, 0);      /* reads a, in flight */
		tern_var_unref(a);                              /* a's bytes: free for the next call */
		tern_var *h = vec(c, TERN_FLOAT, 1, (int64_t[]){N}, xs), *b = call1(c, "Neg", h, NULL, NULL, 0);
		tern_var_unref(h); /* host-made bytes, read by the Neg in flight */
		tern_var *s = call1(c, "Sub", b, one, NULL, 0); /* may take a's bytes: -x - 1 */
		tern_var_unref(b);
		for (int64_t i = 0; i < N; i += 4099)
			CHECK(at(s, i) == -xs[i] - 1);
		tern_var_unref(s);
	}
	for (int r = 0; r < 8; r++) {
		for (int64_t i = 0; i < N; i += 4099)
			CHECK(at(prods[r], i) == (xs[i] + 1) * (xs[i] + 1));
		tern_var_unref(prods[r]);
	}
	/* a small call on the caller's thread, its output in bytes a call in flight still reads */
	tern_var *big = call1(c, "Add", x, one, NULL, 0), *sq = call1(c, "Mul", big, big, NULL, 0);
	tern_var_unref(big);
	tern_var *small = vec(c, TERN_FLOAT, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4}), *t = call1(c, "Neg", small, NULL, NULL, 0);
	CHECK(at(t, 3) == -4);
	CHECK(at(sq, N - 1) == (xs[N - 1] + 1) * (xs[N - 1] + 1));
	CHECK_OK(tern_ctx_sync(c));
	tern_var *vs[] = {sq, small, t, x, one};
	for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++)
		tern_var_unref(vs[k]);
	free(xs);
	tern_ctx_free(c);
}

int main(void)
{
	tern_ctx *c = NULL;
	CHECK_OK(tern_ctx_create(1, &c));
	if (c) {
		calls(c);
		autograd(c);
		deep_tape(c);
		tern_ctx_free(c);
	}
	freed_context();
	traced();
	asynchronous();
	team();
	stream_order();
	return check_report("test_eager");
}
