/* fuse_matmul.c — Gemm with the activation after it becomes tern.FusedGemm; MatMul with a following
 * bias Add and activation becomes tern.FusedMatMul (for any rank: what MatMul + Add → Gemm cannot). */
#include "passes/passes.h"

static tern_status emit(tern_pass_ctx *c, tern_node *main, const char *op_type, const char **inputs, size_t n_inputs,
                        tern_node **nodes, int n, tern_value *out, const tern_activation *act)
{
	const char *outputs[1] = {out->name};
	tern_pass_node nw = {op_type, TERN_DOMAIN, main->name, inputs, n_inputs, outputs, 1, main, NULL};
	tern_node *f = tern_pass_replace(c, nodes, n, &nw);
	if (!f)
		return TERN_EOS;
	return act ? tern_pass_set_activation(f, act) : TERN_OK;
}

static tern_status fuse_gemm(tern_pass_ctx *c, tern_node *gemm)
{
	tern_activation act;
	if (!tern_pass_match_activation(c, gemm->outputs[0], &act))
		return TERN_OK;
	tern_node *nodes[3] = {gemm, act.nodes[0], act.nodes[1]};
	const char *inputs[3];
	for (size_t i = 0; i < gemm->n_inputs && i < 3; i++)
		inputs[i] = gemm->inputs[i] ? gemm->inputs[i]->name : "";
	return emit(c, gemm, "FusedGemm", inputs, gemm->n_inputs < 3 ? gemm->n_inputs : 3, nodes, 1 + act.n_nodes,
	            act.out, &act);
}

static tern_status fuse_matmul(tern_pass_ctx *c, tern_node *mm)
{
	tern_value *y = mm->outputs[0];
	const tern_tensor *ys = tern_pass_shape(c, y);
	if (!ys || ys->dtype != TERN_FLOAT || mm->n_inputs != 2 || !mm->inputs[0] || !mm->inputs[1])
		return TERN_OK;
	tern_node *nodes[4] = {mm};
	int n = 1;
	tern_value *bias = NULL;
	tern_node *a = tern_pass_single_use(y) ? y->consumers[0] : NULL;
	if (tern_pass_is(a, "Add") && a->n_inputs == 2 && a->inputs[0] != a->inputs[1] && a->outputs[0]) {
		tern_value *b = a->inputs[0] == y ? a->inputs[1] : a->inputs[0];
		const tern_tensor *bs = tern_pass_shape(c, b);
		if (bs && bs->dtype == TERN_FLOAT && tern_pass_same_shape(ys, tern_pass_shape(c, a->outputs[0])) &&
		    tern_fused_operand_ok(bs->rank, bs->dims, ys->rank, ys->dims)) {
			nodes[n++] = a;
			bias = b;
			y = a->outputs[0];
		}
	}
	tern_activation act;
	bool has_act = tern_pass_match_activation(c, y, &act);
	if (!bias && !has_act)
		return TERN_OK;
	for (int i = 0; has_act && i < act.n_nodes; i++)
		nodes[n++] = act.nodes[i];
	const char *inputs[3] = {mm->inputs[0]->name, mm->inputs[1]->name, bias ? bias->name : ""};
	return emit(c, mm, "FusedMatMul", inputs, bias ? 3 : 2, nodes, n, has_act ? act.out : y, has_act ? &act : NULL);
}

static tern_status run(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	tern_status st = TERN_OK;
	for (size_t i = 0; !st && i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		if (n->removed || *n->domain || n->n_outputs != 1 || !n->outputs[0])
			continue;
		if (tern_pass_is(n, "Gemm"))
			st = fuse_gemm(c, n);
		else if (tern_pass_is(n, "MatMul"))
			st = fuse_matmul(c, n);
	}
	return st;
}

const tern_pass tern_pass_fuse_matmul = {
        "fuse-matmul",
        "fuse Gemm with its activation, and MatMul with its bias Add and activation, into tern operators",
        2,
        run,
};
