/* fuse_attention.c — scaled dot-product attention as exporters write multi-head attention over
 * sequence-major tensors: Transposes bring the heads forward, MatMul of the queries (perhaps scaled)
 * with the transposed keys, Softmax over the keys, MatMul with the values, a Transpose back. It
 * becomes one tern.Attention that reads the heads where they lie and writes the result in place. */
#include "passes/passes.h"

/* n is a Transpose with exactly this permutation. */
static bool transpose_of(const tern_node *n, const int64_t *perm, size_t rank)
{
	size_t np;
	const int64_t *p = tern_attr_ints(n, "perm", &np);
	return tern_pass_is(n, "Transpose") && p && np == rank && memcmp(p, perm, rank * sizeof *p) == 0;
}

/* v, perhaps through a Mul or Div by a float scalar constant: the unscaled value and the factor. */
static tern_value *unscale(tern_pass_ctx *c, tern_value *v, double *factor, tern_node **scale)
{
	*scale = NULL;
	tern_node *n = tern_pass_producer(v, NULL);
	bool mul = tern_pass_is(n, "Mul"), div = tern_pass_is(n, "Div");
	if ((!mul && !div) || n->n_inputs != 2 || !tern_pass_single_use(v))
		return v;
	for (int k = div ? 1 : 0; k < 2; k++) {
		const tern_tensor *t = tern_pass_const(c, n->inputs[k]);
		double s;
		if (!t || t->dtype != TERN_FLOAT || !tern_pass_scalar(c, n->inputs[k], &s) || s == 0 ||
		    !n->inputs[1 - k])
			continue;
		*factor *= div ? 1.0 / s : s;
		*scale = n;
		return n->inputs[1 - k];
	}
	return v;
}

/* The only reader of v, when it is of op_type and reads v as input `at`. */
static tern_node *next(const tern_value *v, const char *op_type, size_t at)
{
	tern_node *n = tern_pass_single_use(v) ? v->consumers[0] : NULL;
	return tern_pass_is(n, op_type) && n->n_inputs > at && n->inputs[at] == v && n->outputs[0] ? n : NULL;
}

/* Softmax over the last of three dimensions (before opset 13 the axis must say so). */
static bool last_axis_softmax(const tern_node *sm)
{
	int64_t axis = tern_attr_int(sm, "axis", sm->opset < 13 ? 1 : -1);
	return axis == -1 || axis == 2;
}

static tern_status fuse(tern_pass_ctx *c, tern_node *sm)
{
	static const int64_t swap01[3] = {1, 0, 2}, to_keys[3] = {1, 2, 0};
	if (!last_axis_softmax(sm))
		return TERN_OK;
	double scale = 1;
	tern_node *nodes[10];
	int n = 0;
	tern_node *post = NULL;
	tern_value *sv = unscale(c, sm->inputs[0], &scale, &post);
	tern_node *qk = tern_pass_producer(sv, "MatMul");
	tern_node *pv = next(sm->outputs[0], "MatMul", 0);
	tern_node *back = pv ? next(pv->outputs[0], "Transpose", 0) : NULL;
	if (!qk || qk->n_inputs != 2 || !tern_pass_single_use(sv) || !back || !transpose_of(back, swap01, 3))
		return TERN_OK;
	tern_node *qs, *ks;
	tern_node *qt = tern_pass_producer(unscale(c, qk->inputs[0], &scale, &qs), NULL);
	tern_node *kt = tern_pass_producer(unscale(c, qk->inputs[1], &scale, &ks), NULL);
	tern_node *vt = tern_pass_producer(pv->inputs[1], NULL);
	if (!qt || !kt || !vt || !transpose_of(qt, swap01, 3) || !transpose_of(kt, to_keys, 3) ||
	    !transpose_of(vt, swap01, 3) || !tern_pass_single_use(qt->outputs[0]) ||
	    !tern_pass_single_use(kt->outputs[0]) || !tern_pass_single_use(vt->outputs[0]))
		return TERN_OK;
	tern_value *q = qt->inputs[0], *k = kt->inputs[0], *v = vt->inputs[0];
	const tern_tensor *qs_ = tern_pass_shape(c, q), *ks_ = tern_pass_shape(c, k), *vs_ = tern_pass_shape(c, v);
	if (!qs_ || !ks_ || !vs_ || qs_->dtype != TERN_FLOAT || ks_->dtype != TERN_FLOAT || vs_->dtype != TERN_FLOAT ||
	    qs_->rank != 3 || ks_->rank != 3 || vs_->rank != 3 || ks_->dims[1] != qs_->dims[1] ||
	    vs_->dims[1] != qs_->dims[1] || ks_->dims[2] != qs_->dims[2] || vs_->dims[0] != ks_->dims[0])
		return TERN_OK;
	tern_node *all[] = {qt, qs, kt, ks, qk, post, sm, vt, pv, back};
	for (size_t i = 0; i < TERN_ARRAY_LEN(all); i++)
		if (all[i])
			nodes[n++] = all[i];
	const char *inputs[3] = {q->name, k->name, v->name};
	const char *outputs[1] = {back->outputs[0]->name};
	tern_pass_node nw = {"Attention", TERN_DOMAIN, sm->name, inputs, 3, outputs, 1};
	tern_node *f = tern_pass_replace(c, nodes, n, &nw);
	if (!f)
		return TERN_EOS;
	return scale == 1 ? TERN_OK : tern_node_add_attr_float(f, "scale", (float)scale);
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "Softmax", fuse);
}

const tern_pass tern_pass_fuse_attention = {
        "fuse-attention",
        "fuse multi-head attention (Transposes, scaled MatMul, Softmax, MatMul, Transpose) into tern.Attention",
        2,
        run,
};
