/* autodiff.c — reverse-mode differentiation of a graph: the builder that gradient rules emit nodes
 * through (graph mode: each call adds a node to the graph being differentiated), and the reverse pass
 * that visits the nodes between the parameters and the loss, last first, hands each its outputs'
 * gradients and sums what flows into a value from several consumers.
 *
 * Types: the forward graph is typed first (tern_model_infer_shapes); a gradient has its value's type,
 * so a rule knows the type of every x, y and dy it is given. Values the builder makes inside a rule
 * are typed by element type only (the rule knows what it computed). */
#include "autodiff/grad.h"
#include "passes/passes.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct tern_grad_builder {
	tern_model *m;
	tern_graph *g;
	const tern_node *forward; /* the node whose rule is running, for names and messages */
	int n_made;
	tern_status status; /* the first failure */
	void *eager; /* eager mode (lib/eager's state for the rule): handles are eager tensors */
};

/* The type of a handle in eager mode: its tensor's, every dimension known. */
static void eager_type(const tern_gval *v, tern_type *t)
{
	const tern_tensor *x = tern_eager_gval_tensor(v);
	tern_type_unknown(t);
	t->dtype = x->dtype;
	t->rank = x->rank;
	for (int d = 0; d < x->rank; d++)
		t->dims[d] = x->dims[d];
}

tern_status tern_grad_run_eager(void *rule, const tern_node *forward, tern_grad_ctx *ctx)
{
	tern_grad_builder b = {.forward = forward, .eager = rule};
	ctx->b = &b;
	const tern_op *op = tern_op_find(forward->domain, forward->op_type, forward->opset);
	if (!op || !op->grad)
		return tern_node_errorf(forward, TERN_EDATA, "no gradient rule for %s", forward->op_type);
	tern_status st = op->grad(ctx);
	if (!st && b.status)
		st = b.status;
	ctx->b = NULL;
	return st;
}

tern_status tern_g_status(tern_grad_ctx *g)
{
	if (g->b->status)
		return g->b->status;
	return tern_node_errorf(g->node, TERN_EINTERNAL, "gradient: the rule produced no value");
}

/* In graph mode a handle is the IR value itself. */
static tern_value *V(const tern_gval *v)
{
	return (tern_value *)v;
}
static tern_gval *G(tern_value *v)
{
	return (tern_gval *)v;
}

tern_status tern_g_fail(tern_grad_ctx *g, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	tern_status st = tern_node_errorf(g->node, TERN_EDATA, "gradient: %s", msg);
	/* a helper that fails and returns NULL leaves the reason for tern_g_status */
	if (g->b && !g->b->status)
		g->b->status = st;
	return st;
}

/* A fresh value name from the forward node's ("conv1" -> "conv1/grad_3"). */
static char *fresh_name(tern_grad_builder *b)
{
	const char *stem = b->forward && b->forward->name && *b->forward->name ? b->forward->name
	                   : b->forward                                           ? b->forward->op_type
	                                                                          : "grad";
	char buf[256];
	snprintf(buf, sizeof buf, "%.200s/grad_%d", stem, b->n_made++);
	return tern_graph_unique_name(b->g, buf);
}

static tern_status add_attr(tern_node *n, const tern_gattr *a)
{
	switch (a->type) {
	case TERN_GA_INT: return tern_node_add_attr_int(n, a->name, a->i);
	case TERN_GA_FLOAT: return tern_node_add_attr_float(n, a->name, a->f);
	case TERN_GA_INTS: return tern_node_add_attr_ints(n, a->name, a->ints, a->n);
	case TERN_GA_FLOATS: return tern_node_add_attr_floats(n, a->name, a->floats, a->n);
	case TERN_GA_STRING: return tern_node_add_attr_string(n, a->name, a->s);
	case TERN_GA_STRINGS: return tern_node_add_attr_strings(n, a->name, a->strs, a->n);
	}
	return tern_errorf(TERN_EINTERNAL, "bad attribute kind");
}

/* A deep copy of one attribute (through its wire form: attributes may hold tensors and graphs). */
static tern_status copy_attr(tern_node *n, const Onnx__AttributeProto *a)
{
	Onnx__AttributeProto *copy = tern_pb_copy(a);
	Onnx__NodeProto *np = n->proto;
	Onnx__AttributeProto **arr = copy ? realloc(np->attribute, (np->n_attribute + 1) * sizeof *arr) : NULL;
	if (!arr) {
		if (copy)
			onnx__attribute_proto__free_unpacked(copy, NULL);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	np->attribute = arr;
	np->attribute[np->n_attribute++] = copy;
	return TERN_OK;
}

static tern_status emit(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                        const tern_gattr *attrs, int n_attrs, bool like, tern_gval **out, int n_out)
{
	tern_grad_builder *b = g->b;
	if (b->eager) {
		tern_status st = tern_eager_emit(b->eager, g->node, domain, op_type, in, n_in, attrs, n_attrs, like, out, n_out);
		if (st && !b->status)
			b->status = st;
		return st;
	}
	if (domain && strcmp(domain, "tern") == 0) {
		tern_status st = tern_model_import_opset(b->m, TERN_DOMAIN, TERN_DOMAIN_VERSION);
		if (st)
			return st;
	}
	const char *in_names[32];
	char *out_names[8] = {NULL};
	if (n_in > 32 || n_out > 8)
		return tern_errorf(TERN_EINTERNAL, "gradient node with too many inputs or outputs");
	for (int i = 0; i < n_in; i++)
		in_names[i] = in[i] ? V(in[i])->name : "";
	tern_status st = TERN_OK;
	for (int o = 0; o < n_out && !st; o++)
		if (!(out_names[o] = fresh_name(b)))
			st = tern_errorf(TERN_EOS, "out of memory");
	/* named after its first output, a fresh value name: node names stay unique across builders too */
	char *node_name = st ? NULL : n_out && out_names[0] ? tern_strdup(out_names[0]) : fresh_name(b);
	tern_node *n = st || !node_name ? NULL
	                                : tern_graph_add_node(b->g, op_type, domain, node_name, in_names, (size_t)n_in,
	                                                      (const char *const *)out_names, (size_t)n_out);
	if (!st && !n)
		st = tern_errorf(TERN_EOS, "out of memory");
	for (int k = 0; like && !st && k < (int)g->node->proto->n_attribute; k++)
		st = copy_attr(n, g->node->proto->attribute[k]);
	for (int k = 0; !st && k < n_attrs; k++)
		st = add_attr(n, &attrs[k]);
	if (!st) {
		/* the element type follows the first input that has one (rules emit arithmetic), except for the
		 * operators whose output type is their own */
		int dtype = 0;
		for (int i = 0; i < n_in && !dtype; i++)
			dtype = in[i] ? V(in[i])->type.dtype : 0;
		static const char *const to_bool[] = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
		                                      "Not", "And", "Or", "Xor", "IsNaN", "IsInf"};
		if (!*op_type || !domain || !*domain) {
			for (size_t k = 0; k < TERN_ARRAY_LEN(to_bool); k++)
				if (strcmp(op_type, to_bool[k]) == 0)
					dtype = TERN_BOOL;
			if (!strcmp(op_type, "Shape") || !strcmp(op_type, "Size") || !strcmp(op_type, "ArgMax") ||
			    !strcmp(op_type, "ArgMin") || !strcmp(op_type, "NonZero"))
				dtype = TERN_INT64;
			if (!strcmp(op_type, "Cast"))
				dtype = (int)tern_attr_int(n, "to", dtype);
		}
		for (int o = 0; o < n_out; o++) {
			tern_value *v = n->outputs[o];
			if (v && !v->type.dtype) {
				tern_type_unknown(&v->type);
				v->type.dtype = dtype;
			}
			if (out)
				out[o] = v ? G(v) : NULL;
		}
	}
	free(node_name);
	for (int o = 0; o < n_out; o++)
		free(out_names[o]);
	if (st && !b->status)
		b->status = st;
	return st;
}

tern_status tern_g_op_n(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                        const tern_gattr *attrs, int n_attrs, tern_gval **out, int n_out)
{
	return emit(g, domain, op_type, in, n_in, attrs, n_attrs, false, out, n_out);
}

tern_gval *tern_g_op(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                     const tern_gattr *attrs, int n_attrs)
{
	tern_gval *out[1] = {NULL};
	return emit(g, domain, op_type, in, n_in, attrs, n_attrs, false, out, 1) ? NULL : out[0];
}

tern_status tern_g_op_like_n(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in,
                             int n_in, const tern_gattr *extra, int n_extra, tern_gval **out, int n_out)
{
	return emit(g, domain, op_type, in, n_in, extra, n_extra, true, out, n_out);
}

tern_gval *tern_g_op_like(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                          const tern_gattr *extra, int n_extra)
{
	tern_gval *out[1] = {NULL};
	return emit(g, domain, op_type, in, n_in, extra, n_extra, true, out, 1) ? NULL : out[0];
}

static tern_gval *binary(tern_grad_ctx *g, const char *op, tern_gval *a, tern_gval *b)
{
	if (!a || !b)
		return NULL;
	tern_gval *in[2] = {a, b};
	return tern_g_op(g, "", op, in, 2, NULL, 0);
}

tern_gval *tern_g_add(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	return binary(g, "Add", a, b);
}
tern_gval *tern_g_sub(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	return binary(g, "Sub", a, b);
}
tern_gval *tern_g_mul(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	return binary(g, "Mul", a, b);
}
tern_gval *tern_g_div(tern_grad_ctx *g, tern_gval *a, tern_gval *b)
{
	return binary(g, "Div", a, b);
}

tern_gval *tern_g_unary(tern_grad_ctx *g, const char *op_type, tern_gval *a)
{
	return a ? tern_g_op(g, "", op_type, &a, 1, NULL, 0) : NULL;
}

tern_gval *tern_g_neg(tern_grad_ctx *g, tern_gval *a)
{
	return tern_g_unary(g, "Neg", a);
}

static tern_gval *constant(tern_grad_ctx *g, const tern_tensor *t)
{
	if (g->b->eager) {
		tern_gval *c = tern_eager_constant(g->b->eager, t);
		if (!c && !g->b->status)
			g->b->status = tern_errorf(TERN_EOS, "out of memory");
		return c;
	}
	tern_gval *out[1] = {NULL};
	if (emit(g, "", "Constant", NULL, 0, NULL, 0, false, out, 1))
		return NULL;
	tern_value *v = V(out[0]);
	if (tern_node_add_attr_tensor(v->producer, "value", t))
		return NULL;
	v->type.dtype = t->dtype;
	v->type.rank = t->rank;
	for (int d = 0; d < t->rank; d++)
		v->type.dims[d] = t->dims[d];
	return out[0];
}

tern_gval *tern_g_scalar(tern_grad_ctx *g, double x, tern_gval *like)
{
	int dtype = like ? tern_g_dtype(g, like) : TERN_FLOAT;
	tern_tensor t = {0};
	if (tern_tensor_alloc(&t, dtype ? dtype : TERN_FLOAT, 0, NULL))
		return NULL;
	switch (t.dtype) {
	case TERN_DOUBLE: *(double *)t.data = x; break;
	case TERN_FLOAT16: *(uint16_t *)t.data = tern_f32_to_f16((float)x); break;
	case TERN_BFLOAT16: *(uint16_t *)t.data = tern_f32_to_bf16((float)x); break;
	case TERN_INT64: *(int64_t *)t.data = (int64_t)x; break;
	case TERN_INT32: *(int32_t *)t.data = (int32_t)x; break;
	default: *(float *)t.data = (float)x; break;
	}
	tern_gval *c = constant(g, &t);
	tern_tensor_free(&t);
	return c;
}

tern_gval *tern_g_ints(tern_grad_ctx *g, const int64_t *v, size_t n)
{
	tern_tensor t = {0};
	int64_t dim = (int64_t)n;
	if (tern_tensor_alloc(&t, TERN_INT64, 1, &dim))
		return NULL;
	if (n)
		memcpy(t.data, v, n * sizeof *v);
	tern_gval *c = constant(g, &t);
	tern_tensor_free(&t);
	return c;
}

tern_gval *tern_g_shape(tern_grad_ctx *g, tern_gval *x)
{
	tern_gval *s = tern_g_unary(g, "Shape", x);
	if (s && !g->b->eager) {
		V(s)->type.dtype = TERN_INT64;
		V(s)->type.rank = 1;
		V(s)->type.dims[0] = V(x)->type.rank;
	}
	return s;
}

static bool same_static_shape(const tern_type *a, const tern_type *b)
{
	if (a->rank < 0 || a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++) {
		if (a->dims[d] >= 0 ? a->dims[d] != b->dims[d]
		                    : !a->dim_param[d] || !b->dim_param[d] || strcmp(a->dim_param[d], b->dim_param[d]))
			return false;
	}
	return true;
}

tern_gval *tern_g_sum_to(tern_grad_ctx *g, tern_gval *grad, tern_gval *x)
{
	if (!grad || !x)
		return NULL;
	tern_type tg, tx;
	tern_g_full_type(g, grad, &tg);
	tern_g_full_type(g, x, &tx);
	if (same_static_shape(&tg, &tx))
		return grad;
	tern_gval *in[2] = {grad, tern_g_shape(g, x)};
	if (!in[1])
		return NULL;
	tern_gval *r = tern_g_op(g, TERN_DOMAIN, "SumTo", in, 2, NULL, 0);
	if (r && !g->b->eager)
		V(r)->type = V(x)->type;
	return r;
}

tern_gval *tern_g_transpose(tern_grad_ctx *g, tern_gval *a, const int64_t *perm, int rank)
{
	tern_gattr at = TERN_GA_IS("perm", perm, (size_t)rank);
	return a ? tern_g_op(g, "", "Transpose", &a, 1, &at, 1) : NULL;
}

tern_gval *tern_g_reshape_like(tern_grad_ctx *g, tern_gval *a, tern_gval *like)
{
	if (!a || !like)
		return NULL;
	tern_type ta, tl;
	tern_g_full_type(g, a, &ta);
	tern_g_full_type(g, like, &tl);
	if (same_static_shape(&ta, &tl))
		return a;
	tern_gval *in[2] = {a, tern_g_shape(g, like)};
	tern_gval *r = in[1] ? tern_g_op(g, "", "Reshape", in, 2, NULL, 0) : NULL;
	if (r && !g->b->eager)
		V(r)->type = V(like)->type;
	return r;
}

void tern_g_full_type(tern_grad_ctx *g, const tern_gval *v, tern_type *out)
{
	if (g->b && g->b->eager)
		eager_type(v, out);
	else
		*out = V(v)->type;
}

void tern_g_type(tern_grad_ctx *g, const tern_gval *v, int *dtype, int *rank, int64_t *dims)
{
	tern_type et;
	if (g->b && g->b->eager)
		eager_type(v, &et);
	const tern_type *t = g->b && g->b->eager ? &et : &V(v)->type;
	if (dtype)
		*dtype = t->dtype;
	if (rank)
		*rank = t->rank;
	for (int d = 0; dims && d < t->rank && d < TERN_MAX_RANK; d++)
		dims[d] = t->dims[d];
}

int tern_g_rank(tern_grad_ctx *g, const tern_gval *v)
{
	if (g->b && g->b->eager)
		return tern_eager_gval_tensor(v)->rank;
	return V(v)->type.rank;
}

int tern_g_dtype(tern_grad_ctx *g, const tern_gval *v)
{
	if (g->b && g->b->eager)
		return tern_eager_gval_tensor(v)->dtype;
	return V(v)->type.dtype;
}

/* ---------------------------------------------------------------- the reverse pass */

/* Gradients flowing into one value from its consumers, summed when it is asked for. */
typedef struct pending {
	tern_value **parts;
	size_t n, cap;
} pending;

static tern_status add_part(pending *p, tern_value *v)
{
	if (!tern_grow((void **)&p->parts, &p->cap, p->n + 1, sizeof *p->parts))
		return tern_errorf(TERN_EOS, "out of memory");
	p->parts[p->n++] = v;
	return TERN_OK;
}

/* Whether a gradient part comes from the gradient of a kept call: a zero scalar stands there for an
 * input that the branch taken did not read (tern.Backward). */
static bool maybe_scalar(const tern_value *d)
{
	return d->producer && !strcmp(d->producer->domain, TERN_DOMAIN) && !strcmp(d->producer->op_type, "Backward");
}

/* The summed gradient of forward value v (NULL when none flows), typed as v. A sum that may be a zero
 * scalar is expanded to v's shape where v is computed (a rule reads it) or when full_shape (a
 * parameter's gradient, for its update). */
static tern_status total_of(tern_grad_ctx *g, pending *p, const tern_value *v, bool full_shape, tern_value **out)
{
	*out = NULL;
	if (p->n == 0)
		return TERN_OK;
	bool scalar = false;
	for (size_t k = 0; k < p->n; k++)
		scalar |= maybe_scalar(p->parts[k]);
	tern_value *sum = p->parts[0];
	if (p->n > 1) {
		tern_gval *in[32];
		size_t k = 0;
		/* Sum takes any number of inputs; it is split in chunks to keep nodes small */
		while (k < p->n) {
			size_t m = 0;
			if (k)
				in[m++] = G(sum);
			while (m < 32 && k < p->n)
				in[m++] = G(p->parts[k++]);
			tern_gval *s = tern_g_op(g, "", "Sum", in, (int)m, NULL, 0);
			if (!s)
				return tern_errorf(TERN_EOS, "out of memory");
			sum = V(s);
		}
	}
	if (scalar && (v->producer || full_shape)) {
		tern_gval *in[2] = {G(sum), tern_g_shape(g, G((tern_value *)v))};
		tern_gval *e = in[1] ? tern_g_op(g, "", "Expand", in, 2, NULL, 0) : NULL;
		if (!e)
			return tern_g_status(g);
		sum = V(e);
		sum->type = v->type;
	}
	if (!sum->type.dtype || sum->type.rank < 0)
		sum->type = v->type;
	p->n = 0;
	p->parts[0] = sum;
	p->n = 1;
	*out = sum;
	return TERN_OK;
}

static tern_status total(tern_grad_ctx *g, pending *p, const tern_value *v, tern_value **out)
{
	return total_of(g, p, v, false, out);
}

/* Gather(X, indices) along axis 0 that reads rows of v (and not with v as its indices). */
static bool gathers_rows(const tern_node *n, const tern_value *v)
{
	if (n->removed || *n->domain || strcmp(n->op_type, "Gather") != 0 || n->n_inputs < 2 || n->inputs[0] != v ||
	    n->inputs[1] == v || n->n_outputs != 1 || v->type.rank < 1)
		return false;
	int64_t axis = tern_attr_int(n, "axis", 0);
	return axis == 0 || axis == -(int64_t)v->type.rank;
}

/* The sparse gradient of a table from the rows its Gathers read: indices and rows as they are for
 * one Gather; for several, each flattened ([N] int64 and [N, row...]) and concatenated. */
typedef struct rows_parts {
	tern_value **idx, **rows;
	size_t n, cap_idx, cap_rows;
} rows_parts;

static tern_status rows_total(tern_grad_ctx *g, rows_parts *p, const tern_value *table, tern_value **idx,
                              tern_value **rows)
{
	*idx = *rows = NULL;
	if (!p->n)
		return TERN_OK;
	if (p->n == 1) {
		*idx = p->idx[0];
		*rows = p->rows[0];
		return TERN_OK;
	}
	tern_gval *ci[32], *cr[32], *cat_i = NULL, *cat_r = NULL;
	int64_t flat = -1, shape[TERN_MAX_RANK];
	shape[0] = -1;
	for (int d = 1; d < table->type.rank; d++)
		shape[d] = table->type.dims[d];
	tern_gattr ax = TERN_GA_I("axis", 0), to = TERN_GA_I("to", TERN_INT64);
	for (size_t k = 0; k < p->n;) {
		int m = 0;
		if (cat_i) {
			ci[m] = cat_i;
			cr[m++] = cat_r;
		}
		for (; m < 32 && k < p->n; k++, m++) {
			tern_gval *iv = G(p->idx[k]);
			if (p->idx[k]->type.dtype != TERN_INT64 && iv)
				iv = tern_g_op(g, "", "Cast", &iv, 1, &to, 1);
			tern_gval *ri[2] = {iv, tern_g_ints(g, &flat, 1)};
			ci[m] = ri[0] && ri[1] ? tern_g_op(g, "", "Reshape", ri, 2, NULL, 0) : NULL;
			tern_gval *rr[2] = {G(p->rows[k]), tern_g_ints(g, shape, (size_t)table->type.rank)};
			cr[m] = rr[1] ? tern_g_op(g, "", "Reshape", rr, 2, NULL, 0) : NULL;
			if (!ci[m] || !cr[m])
				return tern_g_status(g);
		}
		cat_i = tern_g_op(g, "", "Concat", ci, m, &ax, 1);
		cat_r = tern_g_op(g, "", "Concat", cr, m, &ax, 1);
		if (!cat_i || !cat_r)
			return tern_g_status(g);
		V(cat_i)->type.dtype = TERN_INT64;
		V(cat_i)->type.rank = 1;
		V(cat_i)->type.dims[0] = -1;
		V(cat_r)->type = table->type;
		V(cat_r)->type.dims[0] = -1;
	}
	*idx = V(cat_i);
	*rows = V(cat_r);
	return TERN_OK;
}

tern_status tern_autodiff(tern_model *m, tern_value *const *ys, tern_value *const *seeds, int n_ys, tern_value *const *wrt,
                          int n_wrt, tern_value **grads)
{
	return tern_autodiff_rows(m, ys, seeds, n_ys, wrt, n_wrt, NULL, grads, NULL);
}

tern_status tern_autodiff_rows(tern_model *m, tern_value *const *ys, tern_value *const *seeds, int n_ys,
                               tern_value *const *wrt, int n_wrt, const bool *rows_ok, tern_value **grads,
                               tern_value **grad_indices)
{
	return tern_autodiff_impl(m, ys, seeds, n_ys, wrt, n_wrt, rows_ok, grads, grad_indices, TERN_AUTODIFF_FULL_SHAPE);
}

/* The formal input names of the function a kept call runs: G__fwd's are G's, so G serves where
 * G__fwd is not written yet (a function differentiated before its callee). */
static const tern_graph *kept_callee(const tern_model *m, const tern_node *n)
{
	const char *name = tern_attr_string(n, "function", ""), *domain = tern_attr_string(n, "function_domain", "");
	const tern_graph *f = tern_function_find(m, domain, name);
	char base[512];
	if (!f && tern_fwd_base(name, base, sizeof base))
		f = tern_function_find(m, domain, base);
	return f;
}

/* The gradient of a kept call or If: tern.Backward on its handle and its outputs' gradients, for
 * the inputs (a call's) or the values its branches read (an If's) that want one. */
static tern_status kept_grad(tern_grad_ctx *g, tern_model *m, tern_node *n, tern_value *const *dy,
                             const bool *wants, const bool *needs, const bool *useful, pending *acc)
{
	int h = tern_node_kept_handle(n);
	const char *wrt[64];
	tern_value *to[64];
	int k = 0;
	bool is_if = !*n->domain;
	const tern_graph *fn = is_if ? NULL : kept_callee(m, n);
	if (!is_if && !fn)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the model has no function %s",
		                        tern_attr_string(n, "function", "?"));
	size_t n_from = is_if ? n->n_implicit : n->n_inputs;
	for (size_t i = 0; i < n_from; i++) {
		tern_value *x = is_if ? n->implicit[i] : n->inputs[i];
		bool want = is_if ? x && needs[x->index] && useful[x->index] && tern_g_differentiable(x->type.dtype)
		                  : wants[i];
		if (!want || !x)
			continue;
		if (k == 64 || (!is_if && i >= fn->n_inputs))
			return tern_node_errorf(n, TERN_EDATA, "gradient: more than 64 inputs of a kept call");
		wrt[k] = is_if ? x->name : fn->inputs[i]->name;
		to[k++] = x;
	}
	if (!k)
		return TERN_OK;
	tern_gval *in[33], *out[64] = {NULL};
	int n_in = 0;
	in[n_in++] = G(n->outputs[h]);
	for (int o = 0; o < h; o++) {
		if (n_in == 33)
			return tern_node_errorf(n, TERN_EDATA, "gradient: more than 32 outputs of a kept call");
		in[n_in++] = dy[o] ? G(dy[o]) : NULL;
	}
	while (n_in > 1 && !in[n_in - 1])
		n_in--;
	tern_gattr at = {.name = "wrt", .type = TERN_GA_STRINGS, .strs = wrt, .n = (size_t)k};
	tern_status st = tern_g_op_n(g, TERN_DOMAIN, "Backward", in, n_in, &at, 1, out, k);
	for (int j = 0; !st && j < k; j++) {
		V(out[j])->type = to[j]->type;
		st = add_part(&acc[to[j]->index], V(out[j]));
	}
	return st;
}

tern_status tern_autodiff_impl(tern_model *m, tern_value *const *ys, tern_value *const *seeds, int n_ys,
                               tern_value *const *wrt, int n_wrt, const bool *rows_ok, tern_value **grads,
                               tern_value **grad_indices, int flags)
{
	tern_graph *g = m->graph;
	for (int i = 0; i < n_wrt; i++) {
		grads[i] = NULL;
		if (grad_indices)
			grad_indices[i] = NULL;
	}
	tern_status st = tern_model_infer_types_through_calls(m);
	if (st)
		return st;
	tern_node **order;
	size_t count;
	if ((st = tern_graph_toposort(g, &order, &count)))
		return st;
	size_t nv = g->n_values;
	bool *needs = calloc(nv ? nv : 1, sizeof *needs); /* depends on a parameter */
	bool *useful = calloc(nv ? nv : 1, sizeof *useful); /* the loss depends on it */
	pending *acc = calloc(nv ? nv : 1, sizeof *acc);
	if (!needs || !useful || !acc) {
		free(order);
		free(needs);
		free(useful);
		free(acc);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int i = 0; i < n_wrt; i++)
		needs[wrt[i]->index] = true;
	for (size_t k = 0; k < count; k++) {
		tern_node *n = order[k];
		bool any = false;
		for (size_t i = 0; i < n->n_inputs; i++)
			any |= n->inputs[i] && needs[n->inputs[i]->index];
		for (size_t i = 0; i < n->n_implicit; i++)
			any |= (size_t)n->implicit[i]->index < nv && g->values[n->implicit[i]->index] == n->implicit[i] &&
			       needs[n->implicit[i]->index];
		for (size_t o = 0; any && o < n->n_outputs; o++)
			if (n->outputs[o] && tern_g_differentiable(n->outputs[o]->type.dtype))
				needs[n->outputs[o]->index] = true;
	}
	for (int j = 0; j < n_ys; j++)
		useful[ys[j]->index] = true;
	for (size_t k = count; k-- > 0;) {
		tern_node *n = order[k];
		bool any = false;
		for (size_t o = 0; o < n->n_outputs; o++)
			any |= n->outputs[o] && useful[n->outputs[o]->index];
		for (size_t i = 0; any && i < n->n_inputs; i++)
			if (n->inputs[i])
				useful[n->inputs[i]->index] = true;
		for (size_t i = 0; any && i < n->n_implicit; i++)
			if ((size_t)n->implicit[i]->index < nv && g->values[n->implicit[i]->index] == n->implicit[i])
				useful[n->implicit[i]->index] = true;
	}
	bool depends = false;
	for (int j = 0; j < n_ys; j++)
		depends |= needs[ys[j]->index];
	/* tables whose gradient flows only through Gathers of their rows: gradient as (indices, rows) */
	int *rows_of = malloc((nv ? nv : 1) * sizeof *rows_of);
	rows_parts *rp = calloc((size_t)n_wrt + 1, sizeof *rp);
	if (!rows_of || !rp)
		st = tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; rows_of && i < nv; i++)
		rows_of[i] = -1;
	for (int i = 0; !st && rows_ok && grad_indices && i < n_wrt; i++) {
		const tern_value *v = wrt[i];
		bool ok = rows_ok[i] && !(v->flags & TERN_VALUE_OUTPUT) && v->n_consumers > 0 && rows_of[v->index] < 0;
		for (size_t c = 0; ok && c < v->n_consumers; c++) {
			const tern_node *n = v->consumers[c];
			bool used = false;
			for (size_t o = 0; o < n->n_outputs; o++)
				used |= n->outputs[o] && useful[n->outputs[o]->index];
			ok = n->removed || !used || gathers_rows(n, v);
		}
		if (ok)
			rows_of[v->index] = i;
	}
	if (!depends && !(flags & TERN_AUTODIFF_ANY))
		st = tern_errorf(TERN_EDATA, "%s: '%s' does not depend on any parameter", m->source, n_ys ? ys[0]->name : "?");
	if (!depends && (flags & TERN_AUTODIFF_ANY))
		n_ys = 0; /* no gradient flows: every one is NULL */

	tern_grad_builder b = {m, g, NULL, 0, TERN_OK};
	tern_grad_ctx seed_ctx = {.b = &b};
	for (int j = 0; j < n_ys && !st; j++) {
		tern_value *y = ys[j];
		if (seeds && seeds[j]) {
			st = add_part(&acc[y->index], seeds[j]);
			continue;
		}
		/* d y / d y = 1, in y's shape */
		tern_gval *one = tern_g_scalar(&seed_ctx, 1.0, G(y));
		if (one && y->type.rank != 0) {
			tern_gval *in[2] = {one, tern_g_shape(&seed_ctx, G(y))};
			one = in[1] ? tern_g_op(&seed_ctx, "", "Expand", in, 2, NULL, 0) : NULL;
		}
		if (!one)
			st = tern_errorf(TERN_EOS, "out of memory");
		else
			st = add_part(&acc[y->index], V(one));
	}
	/* Room for the widest node's inputs and outputs (a Sum or a Concat of many). */
	size_t io = 1;
	for (size_t k = 0; k < count; k++) {
		io = order[k]->n_inputs > io ? order[k]->n_inputs : io;
		io = order[k]->n_outputs > io ? order[k]->n_outputs : io;
	}
	bool *wants = calloc(io + 1, sizeof *wants);
	tern_gval **room = calloc(4 * io, sizeof *room);
	tern_value **dys = calloc(io + 1, sizeof *dys);
	if (!st && (!wants || !room || !dys))
		st = tern_errorf(TERN_EOS, "out of memory");
	/* The graph grows while rules run; only the forward nodes (the order above) are visited. */
	for (size_t k = count; !st && k-- > 0;) {
		tern_node *n = order[k];
		bool flows = false, wanted = false;
		for (size_t o = 0; o < n->n_outputs; o++)
			flows |= n->outputs[o] && acc[n->outputs[o]->index].n > 0;
		memset(wants, 0, (n->n_inputs + 1) * sizeof *wants);
		for (size_t i = 0; i < n->n_inputs; i++) {
			tern_value *x = n->inputs[i];
			wants[i] = x && needs[x->index] && useful[x->index] && tern_g_differentiable(x->type.dtype);
			wanted |= wants[i];
		}
		int h = tern_node_kept_handle(n);
		for (size_t i = 0; h >= 0 && i < n->n_implicit; i++) {
			tern_value *x = n->implicit[i];
			wanted |= (size_t)x->index < nv && g->values[x->index] == x && needs[x->index] && useful[x->index] &&
			          tern_g_differentiable(x->type.dtype);
		}
		if (!flows || !wanted)
			continue;
		if (h >= 0) {
			memset(dys, 0, (n->n_outputs + 1) * sizeof *dys);
			for (int o = 0; o < h && !st; o++)
				if (n->outputs[o])
					st = total(&seed_ctx, &acc[n->outputs[o]->index], n->outputs[o], &dys[o]);
			b.forward = n;
			b.status = TERN_OK;
			seed_ctx.node = n;
			if (!st)
				st = kept_grad(&seed_ctx, m, n, dys, wants, needs, useful, acc);
			continue;
		}
		if (n->n_inputs >= 2 && n->inputs[0] && rows_of[n->inputs[0]->index] >= 0 && gathers_rows(n, n->inputs[0])) {
			rows_parts *p = &rp[rows_of[n->inputs[0]->index]];
			tern_value *d = NULL;
			if ((st = total(&seed_ctx, &acc[n->outputs[0]->index], n->outputs[0], &d)))
				break;
			if (!d)
				continue;
			if (!tern_grow((void **)&p->idx, &p->cap_idx, p->n + 1, sizeof *p->idx) ||
			    !tern_grow((void **)&p->rows, &p->cap_rows, p->n + 1, sizeof *p->rows)) {
				st = tern_errorf(TERN_EOS, "out of memory");
				break;
			}
			p->idx[p->n] = n->inputs[1];
			p->rows[p->n++] = d;
			continue;
		}
		const tern_op *op = tern_op_find(n->domain, n->op_type, n->opset);
		if (!op || !op->grad) {
			/* tern's own operators without a rule are the fused ones tern-optimize -O2 makes */
			bool fused = strcmp(n->domain, TERN_DOMAIN) == 0 && (strncmp(n->op_type, "Fused", 5) == 0 ||
			                                                     !strcmp(n->op_type, "ElementwiseChain") ||
			                                                     !strcmp(n->op_type, "Gelu") ||
			                                                     !strcmp(n->op_type, "SkipLayerNormalization") ||
			                                                     !strcmp(n->op_type, "Attention"));
			st = tern_node_errorf(n, TERN_EDATA, "no gradient rule for %s%s%s", n->op_type,
			                      fused ? " (a fused operator: run tern-autodiff before tern-optimize -O2)" : "",
			                      op ? "" : " (not a known operator)");
			break;
		}
		/* only the node's own inputs and outputs are read: clearing the rest would make a graph of
		 * many nodes and one wide one quadratic */
		tern_gval **x = room, **y = room + io, **dy = room + 2 * io, **dx = room + 3 * io;
		memset(dx, 0, n->n_inputs * sizeof *dx);
		for (size_t i = 0; i < n->n_inputs; i++)
			x[i] = n->inputs[i] ? G(n->inputs[i]) : NULL;
		for (size_t o = 0; o < n->n_outputs && !st; o++) {
			tern_value *yo = n->outputs[o], *d = NULL;
			y[o] = yo ? G(yo) : NULL;
			if (yo)
				st = total(&seed_ctx, &acc[yo->index], yo, &d);
			dy[o] = d ? G(d) : NULL;
		}
		if (st)
			break;
		b.forward = n;
		b.status = TERN_OK; /* a rule's failures are its own */
		tern_grad_ctx ctx = {n, (int)n->n_inputs, (int)n->n_outputs, x, y, dy, wants, dx, &b};
		seed_ctx.node = n;
		if ((st = op->grad(&ctx)))
			break;
		for (size_t i = 0; i < n->n_inputs && !st; i++) {
			if (!wants[i] || !dx[i])
				continue;
			tern_value *d = V(dx[i]);
			if (!d->type.dtype || d->type.rank < 0)
				d->type = n->inputs[i]->type;
			st = add_part(&acc[n->inputs[i]->index], d);
		}
	}
	for (int i = 0; i < n_wrt && !st; i++) {
		if (rows_of[wrt[i]->index] == i) {
			seed_ctx.node = NULL;
			b.forward = NULL;
			st = rows_total(&seed_ctx, &rp[i], wrt[i], &grad_indices[i], &grads[i]);
		} else {
			st = total_of(&seed_ctx, &acc[wrt[i]->index], wrt[i], (flags & TERN_AUTODIFF_FULL_SHAPE) != 0,
			              &grads[i]);
		}
	}
	free(wants);
	free(room);
	free(dys);
	for (int i = 0; rp && i < n_wrt; i++) {
		free(rp[i].idx);
		free(rp[i].rows);
	}
	free(rp);
	free(rows_of);
	for (size_t i = 0; i < nv; i++)
		free(acc[i].parts);
	free(acc);
	free(needs);
	free(useful);
	free(order);
	return st;
}

/* ---------------------------------------------------------------- emitting outside a rule */

tern_status tern_grad_ctx_open(tern_model *m, tern_grad_ctx *ctx);
void tern_grad_ctx_close(tern_grad_ctx *ctx);

tern_status tern_grad_ctx_open(tern_model *m, tern_grad_ctx *ctx)
{
	memset(ctx, 0, sizeof *ctx);
	tern_grad_builder *b = calloc(1, sizeof *b);
	if (!b)
		return tern_errorf(TERN_EOS, "out of memory");
	b->m = m;
	b->g = m->graph;
	ctx->b = b;
	return TERN_OK;
}

void tern_grad_ctx_close(tern_grad_ctx *ctx)
{
	free(ctx->b);
	ctx->b = NULL;
}
