/* matmul_gemm.c — MatMul of two matrices followed by an Add that broadcasts into the product becomes
 * one Gemm, which adds C as it writes the product. */
#include "passes/passes.h"

/* C broadcasts to [m, n] in the one direction Gemm allows. */
static bool gemm_c(const tern_tensor *cs, int64_t m, int64_t n)
{
	if (cs->rank > 2)
		return false;
	int64_t want[2] = {m, n};
	for (int d = 0; d < cs->rank; d++) {
		int64_t w = want[2 - cs->rank + d];
		if (cs->dims[d] != 1 && cs->dims[d] != w)
			return false;
	}
	return true;
}

static tern_status fuse(tern_pass_ctx *c, tern_node *mm)
{
	if (mm->n_inputs != 2 || !mm->inputs[1])
		return TERN_OK;
	tern_value *y = mm->outputs[0];
	const tern_tensor *as = tern_pass_shape(c, mm->inputs[0]), *bs = tern_pass_shape(c, mm->inputs[1]);
	const tern_tensor *ys = tern_pass_shape(c, y);
	if (!as || !bs || !ys || as->rank != 2 || bs->rank != 2 ||
	    (ys->dtype != TERN_FLOAT && ys->dtype != TERN_DOUBLE) || !tern_pass_single_use(y))
		return TERN_OK;
	tern_node *add = y->consumers[0];
	if (!tern_pass_is(add, "Add") || add->n_inputs != 2 || add->inputs[0] == add->inputs[1] || !add->outputs[0])
		return TERN_OK;
	tern_value *cv = add->inputs[0] == y ? add->inputs[1] : add->inputs[0];
	const tern_tensor *cs = tern_pass_shape(c, cv), *os = tern_pass_shape(c, add->outputs[0]);
	if (!cs || !os || cs->dtype != ys->dtype || os->rank != 2 || os->dims[0] != ys->dims[0] ||
	    os->dims[1] != ys->dims[1] || !gemm_c(cs, ys->dims[0], ys->dims[1]))
		return TERN_OK;
	const char *inputs[3] = {mm->inputs[0]->name, mm->inputs[1]->name, cv->name};
	const char *outputs[1] = {add->outputs[0]->name};
	tern_node *old[2] = {mm, add};
	tern_pass_node nw = {"Gemm", NULL, mm->name, inputs, 3, outputs, 1};
	return tern_pass_replace(c, old, 2, &nw) ? TERN_OK : TERN_EOS;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "MatMul", fuse);
}

const tern_pass tern_pass_matmul_add_gemm = {
        "matmul-add-to-gemm",
        "turn MatMul of two matrices plus a broadcast Add into Gemm",
        1,
        run,
};
