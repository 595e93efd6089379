/* dce.c — dead-code elimination: nodes whose results nobody reads, optional outputs nobody reads, and
 * initializers nothing uses. */
#include "passes/passes.h"

#include <stdlib.h>

/* tern's own operators that compute and nothing else (communication operators have effects). */
static const char *const pure_tern_ops[] = {
        "FusedConv", "FusedGemm", "FusedMatMul", "ElementwiseChain", "Gelu", "SkipLayerNormalization", "Attention",
        /* the backward kernels and updates of training steps (all pure: outputs from inputs alone) */
        "SumTo", "ReluGrad", "SigmoidGrad", "TanhGrad", "SliceGrad", "PadGrad", "GatherGrad", "GatherElementsGrad",
        "GatherNDGrad", "ConvGradInput", "ConvGradWeight", "MaxPoolGrad", "AveragePoolGrad", "LpPoolGrad",
        "BatchNormGrad", "LayerNormGrad", "GroupNormGrad", "SoftmaxGrad", "SoftmaxCrossEntropyLossGrad",
        "NegativeLogLikelihoodLossGrad", "DropoutGrad", "ResizeGrad", "LSTM", "GRU", "RNN", "LSTMGrad", "GRUGrad",
        "RNNGrad", "Inverse", "RowsSumSquare", "SGD", "Adam", "Adagrad", "SGDRows", "AdamRows", "AdagradRows"};

static bool pure(const tern_node *n)
{
	if (!*n->domain)
		return true;
	if (strcmp(n->domain, TERN_DOMAIN) != 0)
		return false;
	for (size_t i = 0; i < TERN_ARRAY_LEN(pure_tern_ops); i++)
		if (strcmp(n->op_type, pure_tern_ops[i]) == 0)
			return true;
	return false;
}

static bool dead(const tern_node *n)
{
	if (!pure(n) || !n->n_outputs)
		return false;
	for (size_t o = 0; o < n->n_outputs; o++)
		if (n->outputs[o] && n->outputs[o]->producer == n && tern_pass_uses(n->outputs[o]))
			return false;
	return true;
}

/* Operators whose outputs from this index on are optional (and whose kernels skip omitted ones). */
static const struct {
	const char *op_type;
	size_t first_optional;
} optional_outputs[] = {
        {"Dropout", 1}, {"MaxPool", 1}, {"LayerNormalization", 1}, {"LSTM", 0}, {"GRU", 0}, {"RNN", 0},
};

static void drop_unused_outputs(tern_pass_ctx *c, tern_node *n)
{
	size_t first = SIZE_MAX;
	for (size_t i = 0; i < TERN_ARRAY_LEN(optional_outputs); i++)
		if (tern_pass_is(n, optional_outputs[i].op_type))
			first = optional_outputs[i].first_optional;
	if (first == SIZE_MAX)
		return;
	bool any = false;
	for (size_t o = first; o < n->n_outputs; o++) {
		tern_value *v = n->outputs[o];
		if (!v || v->producer != n || tern_pass_uses(v))
			continue;
		v->producer = NULL;
		n->outputs[o] = NULL;
		if (n->proto->output[o] != protobuf_c_empty_string)
			free(n->proto->output[o]);
		n->proto->output[o] = tern_strdup("");
		any = true;
	}
	/* An output list needs at least one entry; trailing omitted ones go. */
	while (n->n_outputs > 1 && !n->outputs[n->n_outputs - 1]) {
		n->n_outputs--;
		if (n->proto->output[n->n_outputs] != protobuf_c_empty_string)
			free(n->proto->output[n->n_outputs]);
		n->proto->n_output = n->n_outputs;
	}
	if (any) {
		c->rewritten++;
		c->analyzed = false;
	}
}

static tern_status sweep(tern_pass_ctx *c, tern_node *n)
{
	if (dead(n))
		tern_pass_remove(c, n);
	else
		drop_unused_outputs(c, n);
	return TERN_OK;
}

static tern_status run(tern_pass_ctx *c)
{
	/* Consumers first, so a dead chain goes in one sweep. */
	tern_status st = tern_pass_each_sorted(c, true, sweep);
	tern_graph *g = c->graph;
	for (size_t i = 0; !st && i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if ((v->flags & TERN_VALUE_INITIALIZER) && !(v->flags & (TERN_VALUE_INPUT | TERN_VALUE_OUTPUT)) &&
		    !tern_pass_uses(v))
			tern_pass_drop_initializer(c, v);
	}
	return st;
}

const tern_pass tern_pass_dce = {
        "dce",
        "remove nodes, optional outputs and initializers whose values nothing reads",
        1,
        run,
};
