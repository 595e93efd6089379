/* activation.c — recognising the activation that follows a value, for the fusions that fold it into
 * tern.FusedConv, FusedGemm and FusedMatMul (whose `activation` attribute names it). */
#include "passes/passes.h"

#include <float.h>
#include <math.h>

/* Activations without parameters, and those whose attributes become activation_params. */
static const struct {
	const char *op_type;
	const char *attr[2];
	float dflt[2];
	int n_params;
} plain[] = {
        {"Relu", {0}, {0}, 0},         {"Sigmoid", {0}, {0}, 0},
        {"Tanh", {0}, {0}, 0},         {"HardSwish", {0}, {0}, 0},
        {"Softplus", {0}, {0}, 0},     {"LeakyRelu", {"alpha"}, {0.01f}, 1},
        {"Elu", {"alpha"}, {1.0f}, 1}, {"HardSigmoid", {"alpha", "beta"}, {0.2f, 0.5f}, 2},
};

/* Clip's bounds: attributes before opset 11, optional constant inputs since. */
static bool clip_bounds(tern_pass_ctx *c, const tern_node *n, float *lo, float *hi)
{
	*lo = -INFINITY;
	*hi = INFINITY;
	if (n->opset < 11) {
		*lo = tern_attr_float(n, "min", -FLT_MAX);
		*hi = tern_attr_float(n, "max", FLT_MAX);
		return true;
	}
	double v;
	if (n->n_inputs > 1 && n->inputs[1]) {
		if (!tern_pass_scalar(c, n->inputs[1], &v))
			return false;
		*lo = (float)v;
	}
	if (n->n_inputs > 2 && n->inputs[2]) {
		if (!tern_pass_scalar(c, n->inputs[2], &v))
			return false;
		*hi = (float)v;
	}
	return true;
}

/* The live consumers of v, each once; false when there are more than max or an implicit one. */
static bool consumers(const tern_value *v, tern_node **out, size_t max, size_t *n)
{
	*n = 0;
	if (tern_pass_has_implicit_use(v))
		return false;
	for (size_t i = 0; i < v->n_consumers; i++) {
		tern_node *c = v->consumers[i];
		bool seen = false;
		for (size_t j = 0; j < *n && !seen; j++)
			seen = out[j] == c;
		if (c->removed || seen)
			continue;
		if (*n == max)
			return false;
		out[(*n)++] = c;
	}
	return true;
}

static bool match_single(tern_pass_ctx *c, tern_node *n, tern_value *x, tern_activation *act)
{
	if (n->n_inputs < 1 || n->inputs[0] != x || n->n_outputs < 1 || !n->outputs[0])
		return false;
	if (!*n->domain) {
		for (size_t i = 0; i < TERN_ARRAY_LEN(plain); i++)
			if (strcmp(n->op_type, plain[i].op_type) == 0 && n->n_inputs == 1) {
				act->name = plain[i].op_type;
				act->n_params = plain[i].n_params;
				for (int k = 0; k < plain[i].n_params; k++)
					act->params[k] = tern_attr_float(n, plain[i].attr[k], plain[i].dflt[k]);
				return true;
			}
		if (strcmp(n->op_type, "Clip") == 0) {
			for (size_t i = 1; i < n->n_inputs; i++)
				if (n->inputs[i] == x)
					return false;
			act->name = "Clip";
			act->n_params = 2;
			return clip_bounds(c, n, &act->params[0], &act->params[1]);
		}
		return false;
	}
	if (strcmp(n->domain, TERN_DOMAIN) == 0 && strcmp(n->op_type, "Gelu") == 0) {
		act->name = strcmp(tern_attr_string(n, "approximate", "none"), "tanh") == 0 ? "GeluTanh" : "Gelu";
		act->n_params = 0;
		return true;
	}
	return false;
}

bool tern_pass_match_activation(tern_pass_ctx *c, tern_value *x, tern_activation *act)
{
	memset(act, 0, sizeof *act);
	const tern_tensor *xs = tern_pass_shape(c, x);
	if (!xs || xs->dtype != TERN_FLOAT || (x->flags & TERN_VALUE_OUTPUT))
		return false;
	tern_node *cons[2];
	size_t n;
	if (!consumers(x, cons, 2, &n) || n == 0)
		return false;
	if (n == 1) {
		if (!match_single(c, cons[0], x, act))
			return false;
		act->nodes[0] = cons[0];
		act->n_nodes = 1;
		act->out = cons[0]->outputs[0];
		return true;
	}
	/* Silu: Mul(x, Sigmoid(x)), the Sigmoid read by the Mul alone. */
	tern_node *sig = tern_pass_is(cons[0], "Sigmoid") ? cons[0] : cons[1];
	tern_node *mul = sig == cons[0] ? cons[1] : cons[0];
	if (!tern_pass_is(sig, "Sigmoid") || !tern_pass_is(mul, "Mul") || sig->n_inputs != 1 || !sig->outputs[0] ||
	    mul->n_inputs != 2 || !mul->outputs[0] || !tern_pass_single_use(sig->outputs[0]))
		return false;
	bool pair = (mul->inputs[0] == x && mul->inputs[1] == sig->outputs[0]) ||
	        (mul->inputs[1] == x && mul->inputs[0] == sig->outputs[0]);
	if (!pair)
		return false;
	act->name = "Silu";
	act->nodes[0] = sig;
	act->nodes[1] = mul;
	act->n_nodes = 2;
	act->out = mul->outputs[0];
	return true;
}

tern_status tern_pass_set_activation(tern_node *n, const tern_activation *act)
{
	tern_status st = tern_node_add_attr_string(n, "activation", act->name);
	if (!st && act->n_params)
		st = tern_node_add_attr_floats(n, "activation_params", act->params, (size_t)act->n_params);
	return st;
}
