/* fuse_layernorm.c — the residual Add before a LayerNormalization joins it in one
 * tern.SkipLayerNormalization, which also yields the sum when something else reads it. */
#include "passes/passes.h"

static tern_status fuse(tern_pass_ctx *c, tern_node *ln)
{
	tern_value *sum = ln->inputs[0];
	tern_node *add = tern_pass_producer(sum, "Add");
	if (!add || add->n_inputs != 2 || !add->inputs[0] || !add->inputs[1] || tern_pass_has_implicit_use(sum) ||
	    ln->n_inputs < 2 || !ln->inputs[1])
		return TERN_OK;
	for (size_t o = 1; o < ln->n_outputs; o++)
		if (ln->outputs[o] && tern_pass_uses(ln->outputs[o]))
			return TERN_OK;
	for (size_t i = 1; i < ln->n_inputs; i++)
		if (ln->inputs[i] == sum)
			return TERN_OK;
	const tern_tensor *ss = tern_pass_shape(c, sum);
	if (!ss || (ss->dtype != TERN_FLOAT && ss->dtype != TERN_DOUBLE))
		return TERN_OK;
	/* Input 0 has the sum's shape; the other broadcasts into it. */
	int first = tern_pass_same_shape(ss, tern_pass_shape(c, add->inputs[0])) ? 0 : 1;
	if (!tern_pass_same_shape(ss, tern_pass_shape(c, add->inputs[first])))
		return TERN_OK;
	bool keep_sum = tern_pass_uses(sum) > 1;
	const char *inputs[4] = {add->inputs[first]->name, add->inputs[1 - first]->name, ln->inputs[1]->name,
	                         ln->n_inputs > 2 && ln->inputs[2] ? ln->inputs[2]->name : ""};
	const char *outputs[2] = {ln->outputs[0]->name, sum->name};
	tern_node *old[2] = {add, ln};
	tern_pass_node nw = {"SkipLayerNormalization", TERN_DOMAIN, ln->name, inputs, *inputs[3] ? 4 : 3, outputs,
	                     keep_sum ? 2 : 1,         ln,          NULL};
	return tern_pass_replace(c, old, 2, &nw) ? TERN_OK : TERN_EOS;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "LayerNormalization", fuse);
}

const tern_pass tern_pass_fuse_layernorm = {
        "fuse-skip-layernorm",
        "fuse a residual Add with the LayerNormalization after it into tern.SkipLayerNormalization",
        2,
        run,
};
