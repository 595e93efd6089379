/* fold_pad.c — a zero-constant Pad of the spatial dimensions before a Conv, or before an AveragePool
 * that counts padding, becomes that operator's own padding. */
#include "passes/passes.h"

/* The Pad's pads when it pads with zeros (rank r: r begins then r ends); false otherwise. */
static bool zero_pads(tern_pass_ctx *c, const tern_node *pad, int rank, int64_t *pads)
{
	if (strcmp(tern_attr_string(pad, "mode", "constant"), "constant") != 0)
		return false;
	if (pad->opset < 11) {
		size_t n;
		const int64_t *p = tern_attr_ints(pad, "pads", &n);
		if (!p || n != (size_t)(2 * rank) || tern_attr_float(pad, "value", 0.0f) != 0.0f)
			return false;
		memcpy(pads, p, n * sizeof *p);
		return true;
	}
	if (pad->n_inputs < 2 || !pad->inputs[1] || (pad->n_inputs > 3 && pad->inputs[3]))
		return false;
	if (pad->n_inputs > 2 && pad->inputs[2] && !tern_pass_const_all(c, pad->inputs[2], 0))
		return false;
	const tern_tensor *p = tern_pass_const(c, pad->inputs[1]);
	if (!p || tern_tensor_numel(p) != 2 * rank)
		return false;
	for (int i = 0; i < 2 * rank; i++)
		pads[i] = tern_tensor_get_i64(p, i);
	return true;
}

static tern_status fold(tern_pass_ctx *c, tern_node *pad)
{
	if (pad->n_outputs != 1)
		return TERN_OK;
	tern_value *padded = pad->outputs[0];
	const tern_tensor *xs = tern_pass_shape(c, pad->inputs[0]);
	if (!xs || xs->rank < 3 || !tern_pass_single_use(padded) || padded->n_consumers < 1)
		return TERN_OK;
	tern_node *user = padded->consumers[0];
	bool conv = tern_pass_is(user, "Conv"), avg = tern_pass_is(user, "AveragePool");
	if ((!conv && !avg) || user->inputs[0] != padded)
		return TERN_OK;
	int rank = xs->rank, sp = rank - 2;
	int64_t pads[2 * TERN_MAX_RANK];
	if (!zero_pads(c, pad, rank, pads) || pads[0] || pads[1] || pads[rank] || pads[rank + 1])
		return TERN_OK;
	for (int i = 0; i < 2 * rank; i++)
		if (pads[i] < 0)
			return TERN_OK;
	if (strcmp(tern_attr_string(user, "auto_pad", "NOTSET"), "NOTSET") != 0)
		return TERN_OK;
	size_t n_old;
	const int64_t *old = tern_attr_ints(user, "pads", &n_old);
	if (old && n_old != (size_t)(2 * sp))
		return TERN_OK;
	bool old_zero = true;
	for (size_t i = 0; old && i < n_old; i++)
		old_zero &= old[i] == 0;
	if (avg &&
	    (tern_attr_int(user, "ceil_mode", 0) != 0 || (!old_zero && !tern_attr_int(user, "count_include_pad", 0))))
		return TERN_OK;
	int64_t merged[2 * TERN_MAX_RANK];
	for (int i = 0; i < sp; i++) {
		merged[i] = pads[2 + i] + (old ? old[i] : 0);
		merged[sp + i] = pads[rank + 2 + i] + (old ? old[sp + i] : 0);
	}
	const char *inputs[3];
	for (size_t i = 0; i < user->n_inputs && i < 3; i++)
		inputs[i] = i == 0 ? pad->inputs[0]->name : user->inputs[i] ? user->inputs[i]->name : "";
	const char *outputs[1] = {user->outputs[0]->name};
	static const char *const skip[] = {"pads", "count_include_pad", NULL};
	tern_node *pair[2] = {pad, user};
	tern_pass_node nw = {user->op_type, NULL, user->name, inputs, user->n_inputs < 3 ? user->n_inputs : 3,
	                     outputs,       1,    user,       skip};
	tern_node *n = tern_pass_replace(c, pair, 2, &nw);
	if (!n)
		return TERN_EOS;
	tern_status st = tern_node_add_attr_ints(n, "pads", merged, (size_t)(2 * sp));
	if (!st && avg)
		st = tern_node_add_attr_int(n, "count_include_pad", 1);
	return st;
}

static tern_status run(tern_pass_ctx *c)
{
	return tern_pass_each(c, NULL, "Pad", fold);
}

const tern_pass tern_pass_fold_pad = {
        "fold-pad",
        "fold a zero Pad of spatial dimensions into the Conv or count-including AveragePool after it",
        1,
        run,
};
