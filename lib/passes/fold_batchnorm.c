/* fold_batchnorm.c — Conv followed by an inference BatchNormalization becomes one Conv whose weights and
 * bias absorb the normalisation: W' = W s, B' = (B - mean) s + beta with s = scale / sqrt(var + eps). */
#include "passes/passes.h"

#include <math.h>
#include <stdio.h>

static bool inference_bn(const tern_node *bn)
{
	if (bn->opset < 7 && !tern_attr_int(bn, "is_test", 0))
		return false;
	if (bn->opset < 9 && tern_attr_int(bn, "spatial", 1) != 1)
		return false;
	if (tern_attr_int(bn, "training_mode", 0) != 0)
		return false;
	for (size_t o = 1; o < bn->n_outputs; o++)
		if (bn->outputs[o] && tern_pass_uses(bn->outputs[o]))
			return false;
	return bn->n_inputs == 5 && bn->outputs[0];
}

/* Per-channel float constant of length ch. */
static const float *channel_const(tern_pass_ctx *c, const tern_value *v, int64_t ch)
{
	const tern_tensor *t = tern_pass_const(c, v);
	return t && t->dtype == TERN_FLOAT && tern_tensor_numel(t) == ch ? t->data : NULL;
}

static tern_status fold(tern_pass_ctx *c, tern_node *bn)
{
	tern_node *conv = tern_pass_producer(bn->inputs[0], "Conv");
	if (!conv || !inference_bn(bn) || !tern_pass_single_use(bn->inputs[0]) || conv->n_inputs < 2)
		return TERN_OK;
	const tern_tensor *w = tern_pass_const(c, conv->inputs[1]);
	if (!w || w->dtype != TERN_FLOAT || w->rank < 3)
		return TERN_OK;
	int64_t ch = w->dims[0], per = tern_tensor_numel(w) / (ch ? ch : 1);
	const float *bias = conv->n_inputs > 2 && conv->inputs[2] ? channel_const(c, conv->inputs[2], ch) : NULL;
	const float *scale = channel_const(c, bn->inputs[1], ch), *beta = channel_const(c, bn->inputs[2], ch);
	const float *mean = channel_const(c, bn->inputs[3], ch), *var = channel_const(c, bn->inputs[4], ch);
	if (!scale || !beta || !mean || !var || (conv->n_inputs > 2 && conv->inputs[2] && !bias))
		return TERN_OK;
	double eps = tern_attr_float(bn, "epsilon", 1e-5f);
	tern_tensor nw = {0}, nb = {0};
	tern_status st = tern_tensor_alloc(&nw, TERN_FLOAT, w->rank, w->dims);
	if (!st)
		st = tern_tensor_alloc(&nb, TERN_FLOAT, 1, &ch);
	for (int64_t k = 0; !st && k < ch; k++) {
		double s = scale[k] / sqrt((double)var[k] + eps);
		const float *src = (const float *)w->data + k * per;
		float *dst = (float *)nw.data + k * per;
		for (int64_t i = 0; i < per; i++)
			dst[i] = (float)(src[i] * s);
		((float *)nb.data)[k] = (float)(((bias ? bias[k] : 0.0) - mean[k]) * s + beta[k]);
	}
	char stem[256];
	tern_value *wv = NULL, *bv = NULL;
	if (!st) {
		snprintf(stem, sizeof stem, "%s_W", conv->outputs[0]->name);
		wv = tern_pass_add_const(c, stem, &nw);
		snprintf(stem, sizeof stem, "%s_B", conv->outputs[0]->name);
		bv = tern_pass_add_const(c, stem, &nb);
		if (!wv || !bv)
			st = TERN_EOS;
	}
	tern_tensor_free(&nw);
	tern_tensor_free(&nb);
	if (st)
		return st;
	const char *inputs[3] = {conv->inputs[0]->name, wv->name, bv->name};
	const char *outputs[1] = {bn->outputs[0]->name};
	tern_node *old[2] = {conv, bn};
	tern_value *was[6] = {conv->inputs[1], conv->n_inputs > 2 ? conv->inputs[2] : NULL};
	for (size_t i = 1; i < bn->n_inputs && i < 5; i++)
		was[1 + i] = bn->inputs[i];
	tern_pass_node conv2 = {"Conv", NULL, conv->name, inputs, 3, outputs, 1, conv, NULL};
	if (!tern_pass_replace(c, old, 2, &conv2))
		return TERN_EOS;
	for (size_t i = 0; i < 6; i++)
		tern_pass_drop_if_unused(c, was[i]);
	return TERN_OK;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "BatchNormalization", fold);
}

const tern_pass tern_pass_fold_batchnorm = {
        "fold-batchnorm",
        "fold an inference BatchNormalization into the Conv before it",
        1,
        run,
};
