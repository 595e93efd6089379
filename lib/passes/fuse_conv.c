/* fuse_conv.c — Conv with what follows it: a per-channel bias Add (folded into B), a residual Add of a
 * tensor of the output's shape, and an activation, become one tern.FusedConv. */
#include "passes/passes.h"

#include <stdio.h>

/* The single reader of v when it is an Add of v and something else; the other operand in *other. */
static tern_node *add_after(tern_value *v, tern_value **other)
{
	if (!tern_pass_single_use(v))
		return NULL;
	tern_node *a = v->consumers[0];
	if (!tern_pass_is(a, "Add") || a->n_inputs != 2 || !a->outputs[0] || a->inputs[0] == a->inputs[1])
		return NULL;
	*other = a->inputs[0] == v ? a->inputs[1] : a->inputs[0];
	return *other ? a : NULL;
}

/* A float constant with one value per output channel, shaped to broadcast along channels only. */
static const tern_tensor *channel_bias(tern_pass_ctx *c, const tern_value *v, const tern_tensor *ys)
{
	const tern_tensor *t = tern_pass_const(c, v);
	if (!t || t->dtype != TERN_FLOAT || t->rank > ys->rank || tern_tensor_numel(t) != ys->dims[1])
		return NULL;
	for (int d = 0; d < t->rank; d++) {
		int yd = ys->rank - t->rank + d;
		if (yd != 1 && t->dims[d] != 1)
			return NULL;
	}
	return t;
}

static tern_status fuse(tern_pass_ctx *c, tern_node *conv)
{
	if (conv->n_outputs != 1)
		return TERN_OK;
	tern_value *y = conv->outputs[0];
	const tern_tensor *ys = tern_pass_shape(c, y);
	if (!ys || ys->dtype != TERN_FLOAT || ys->rank < 3 || conv->n_inputs < 2 || !conv->inputs[1])
		return TERN_OK;
	tern_node *nodes[4] = {conv};
	int n = 1;
	tern_value *bias = conv->n_inputs > 2 ? conv->inputs[2] : NULL, *z = NULL, *other;
	const tern_tensor *extra = NULL;
	tern_node *a = add_after(y, &other);
	if (a && (extra = channel_bias(c, other, ys)) && tern_pass_same_shape(ys, tern_pass_shape(c, a->outputs[0]))) {
		nodes[n++] = a;
		y = a->outputs[0];
		a = add_after(y, &other);
	}
	if (a && tern_pass_same_shape(ys, tern_pass_shape(c, other)) &&
	    tern_pass_same_shape(ys, tern_pass_shape(c, a->outputs[0]))) {
		nodes[n++] = a;
		z = other;
		y = a->outputs[0];
	}
	tern_activation act;
	bool has_act = tern_pass_match_activation(c, y, &act);
	if (n == 1 && !has_act)
		return TERN_OK;
	if (extra) {
		/* B' = B + the per-channel Add. */
		const tern_tensor *b0 = bias ? tern_pass_const(c, bias) : NULL;
		if (bias && (!b0 || b0->dtype != TERN_FLOAT))
			return TERN_OK;
		tern_tensor nb = {0};
		int64_t ch = ys->dims[1];
		if (tern_tensor_alloc(&nb, TERN_FLOAT, 1, &ch))
			return TERN_EOS;
		for (int64_t k = 0; k < ch; k++)
			((float *)nb.data)[k] =
			        ((const float *)extra->data)[k] + (b0 ? ((const float *)b0->data)[k] : 0.0f);
		char stem[256];
		snprintf(stem, sizeof stem, "%s_B", conv->outputs[0]->name);
		bias = tern_pass_add_const(c, stem, &nb);
		tern_tensor_free(&nb);
		if (!bias)
			return TERN_EOS;
	}
	for (int i = 0; has_act && i < act.n_nodes; i++)
		nodes[n++] = act.nodes[i];
	tern_value *out = has_act ? act.out : y;
	const char *inputs[4] = {conv->inputs[0]->name, conv->inputs[1]->name, bias ? bias->name : "",
	                         z ? z->name : ""};
	const char *outputs[1] = {out->name};
	tern_pass_node nw = {"FusedConv", TERN_DOMAIN, conv->name, inputs, z ? 4 : bias ? 3 : 2,
	                     outputs,     1,           conv,       NULL};
	tern_node *f = tern_pass_replace(c, nodes, n, &nw);
	if (!f)
		return TERN_EOS;
	return has_act ? tern_pass_set_activation(f, &act) : TERN_OK;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "Conv", fuse);
}

const tern_pass tern_pass_fuse_conv = {
        "fuse-conv",
        "fuse Conv with a following bias Add, residual Add and activation into tern.FusedConv",
        2,
        run,
};
