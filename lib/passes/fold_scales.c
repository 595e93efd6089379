/* fold_scales.c — a scalar Mul or Div on an input of a matrix product (the 1/sqrt(d) of attention), or
 * on its output, becomes the product's alpha in tern.FusedMatMul: (a s) b = s (a b). This reassociates
 * floating-point arithmetic, hence level 3. */
#include "passes/passes.h"

/* n scales one operand by a float scalar constant; *factor is the multiplier and *operand the
 * other input. Div only by the constant. */
static bool scalar_scale(tern_pass_ctx *c, const tern_node *n, double *factor, tern_value **operand)
{
	bool mul = tern_pass_is(n, "Mul"), div = tern_pass_is(n, "Div");
	if ((!mul && !div) || n->n_inputs != 2 || !n->inputs[0] || !n->inputs[1] || !n->outputs[0])
		return false;
	for (int k = div ? 1 : 0; k < 2; k++) {
		double s;
		const tern_tensor *t = tern_pass_const(c, n->inputs[k]);
		if (!t || t->dtype != TERN_FLOAT || !tern_pass_scalar(c, n->inputs[k], &s) || (div && s == 0))
			continue;
		*operand = n->inputs[1 - k];
		if (!tern_pass_same_shape(tern_pass_shape(c, *operand), tern_pass_shape(c, n->outputs[0])))
			return false;
		*factor = div ? 1.0 / s : s;
		return true;
	}
	return false;
}

static bool is_fused_matmul(const tern_node *n)
{
	return !n->removed && strcmp(n->domain, TERN_DOMAIN) == 0 && strcmp(n->op_type, "FusedMatMul") == 0;
}

static tern_status fold(tern_pass_ctx *c, tern_node *mm)
{
	const tern_tensor *ys = tern_pass_shape(c, mm->outputs[0]);
	if (mm->n_outputs != 1 || !ys || ys->dtype != TERN_FLOAT || mm->n_inputs < 2 || !mm->inputs[0] ||
	    !mm->inputs[1])
		return TERN_OK;
	bool fused = is_fused_matmul(mm);
	double alpha = fused ? tern_attr_float(mm, "alpha", 1.0f) : 1.0, f;
	tern_value *in[3] = {mm->inputs[0], mm->inputs[1], mm->n_inputs > 2 ? mm->inputs[2] : NULL}, *operand;
	tern_node *old[4] = {mm};
	int n_old = 1;
	for (int k = 0; k < 2; k++) {
		tern_node *p = tern_pass_producer(in[k], NULL);
		if (p && tern_pass_single_use(in[k]) && in[0] != in[1] && scalar_scale(c, p, &f, &operand)) {
			alpha *= f;
			in[k] = operand;
			old[n_old++] = p;
		}
	}
	tern_value *out = mm->outputs[0];
	bool plain = !in[2] && !*tern_attr_string(mm, "activation", "");
	tern_node *after = tern_pass_single_use(out) ? out->consumers[0] : NULL;
	if (plain && after && scalar_scale(c, after, &f, &operand) && operand == out) {
		alpha *= f;
		out = after->outputs[0];
		old[n_old++] = after;
	}
	if (n_old == 1)
		return TERN_OK;
	const char *inputs[3] = {in[0]->name, in[1]->name, in[2] ? in[2]->name : ""};
	const char *outputs[1] = {out->name};
	static const char *const skip[] = {"alpha", NULL};
	tern_pass_node nw = {"FusedMatMul", TERN_DOMAIN, mm->name, inputs, in[2] ? 3 : 2, outputs, 1, mm, skip};
	tern_node *nf = tern_pass_replace(c, old, n_old, &nw);
	return nf ? tern_node_add_attr_float(nf, "alpha", (float)alpha) : TERN_EOS;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_status st = tern_pass_each(c, NULL, "MatMul", fold);
	return st ? st : tern_pass_each(c, TERN_DOMAIN, "FusedMatMul", fold);
}

const tern_pass tern_pass_fold_scales = {
        "fold-scales",
        "fold scalar Mul/Div on the inputs or output of a MatMul into tern.FusedMatMul's alpha",
        3,
        run,
};
