/* tern-autodiff — makes an inference model trainable: the same model plus an ONNX TrainingInfoProto
 * whose algorithm graph is one training step (forward, loss, backward, parameter update), which
 * tern-run --train runs. */
#include "cli.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
	tern_train_options t;
	const char **params, **freeze;
} options;

enum {
	OPT_LOSS = 256,
	OPT_OUTPUT_NAME,
	OPT_TARGET,
	OPT_LOSS_OUTPUT,
	OPT_OPTIMIZER,
	OPT_LR,
	OPT_MOMENTUM,
	OPT_NESTEROV,
	OPT_WEIGHT_DECAY,
	OPT_BETAS,
	OPT_EPS,
	OPT_CLIP,
	OPT_SCHEDULE,
	OPT_FREEZE,
	OPT_PARAMS,
	OPT_DENSE,
};

static const struct argp_option option_table[] = {
        {0, 0, 0, 0, "Loss:", 1},
        {"loss", OPT_LOSS, "KIND", 0,
         "cross-entropy (default; classes on axis 1, integer targets, mean), mse, l1 or bce-with-logits", 1},
        {"output-name", OPT_OUTPUT_NAME, "NAME", 0, "the model output the loss reads (default: the first)", 1},
        {"target", OPT_TARGET, "NAME", 0, "the name of the new target input (default: target)", 1},
        {"loss-output", OPT_LOSS_OUTPUT, "NAME", 0, "the model computes its scalar loss itself, as output NAME", 1},
        {0, 0, 0, 0, "Optimizer (torch.optim's update rules):", 2},
        {"optimizer", OPT_OPTIMIZER, "NAME", 0, "sgd (default), adam, adamw or adagrad", 2},
        {"lr", OPT_LR, "RATE", 0, "learning rate (default 0.01; 0.001 for adam and adamw)", 2},
        {"momentum", OPT_MOMENTUM, "M", 0, "sgd: momentum (default 0)", 2},
        {"nesterov", OPT_NESTEROV, NULL, 0, "sgd: Nesterov momentum", 2},
        {"weight-decay", OPT_WEIGHT_DECAY, "W", 0, "L2 penalty (adamw: decoupled; default 0, adamw 0.01)", 2},
        {"betas", OPT_BETAS, "B1,B2", 0, "adam, adamw: moment decay rates (default 0.9,0.999)", 2},
        {"eps", OPT_EPS, "E", 0, "adam, adamw: 1e-8 by default; adagrad: 1e-10", 2},
        {"clip-norm", OPT_CLIP, "N", 0, "scale the gradients so that their global norm is at most N", 2},
        {"lr-schedule", OPT_SCHEDULE, "SCHEDULE", 0,
         "constant (default), step:EVERY:GAMMA, cosine:STEPS or warmup:STEPS, counted in steps", 2},
        {0, 0, 0, 0, "Parameters:", 3},
        {"params", OPT_PARAMS, "GLOB", 0, "train only initializers whose name matches GLOB (repeatable)", 3},
        {"freeze", OPT_FREEZE, "GLOB", 0, "do not train initializers whose name matches GLOB (repeatable)", 3},
        {"dense-gradients", OPT_DENSE, NULL, 0,
         "give embedding tables a dense gradient of their size instead of the rows read (the default)", 3},
        {0},
};

static double number(struct argp_state *state, const char *opt, const char *arg, double lo)
{
	char *end;
	errno = 0;
	double v = strtod(arg, &end);
	if (errno || end == arg || *end || !(v >= lo))
		argp_error(state, "%s takes a number of at least %g, not '%s'", opt, lo, arg);
	return v;
}

static const char **push(const char **list, int *n, const char *s)
{
	list = tern_cli_grow(list, (size_t)*n + 1, sizeof *list);
	list[(*n)++] = s;
	return list;
}

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	options *o = state->input;
	tern_train_options *t = &o->t;
	switch (key) {
	case OPT_LOSS: t->loss = arg; return 0;
	case OPT_OUTPUT_NAME: t->output = arg; return 0;
	case OPT_TARGET: t->target = arg; return 0;
	case OPT_LOSS_OUTPUT: t->loss_output = arg; return 0;
	case OPT_OPTIMIZER:
		if (strcmp(arg, "sgd") && strcmp(arg, "adam") && strcmp(arg, "adamw") && strcmp(arg, "adagrad"))
			argp_error(state, "unknown optimizer '%s' (sgd, adam, adamw or adagrad)", arg);
		t->optimizer = arg;
		return 0;
	case OPT_LR: t->lr = number(state, "--lr", arg, 0); return 0;
	case OPT_MOMENTUM: t->momentum = number(state, "--momentum", arg, 0); return 0;
	case OPT_NESTEROV: t->nesterov = 1; return 0;
	case OPT_WEIGHT_DECAY: t->weight_decay = number(state, "--weight-decay", arg, 0); return 0;
	case OPT_BETAS:
		if (sscanf(arg, "%lf,%lf", &t->beta1, &t->beta2) != 2 || !(t->beta1 > 0 && t->beta1 < 1) ||
		    !(t->beta2 > 0 && t->beta2 < 1))
			argp_error(state, "--betas takes B1,B2 between 0 and 1, not '%s'", arg);
		return 0;
	case OPT_EPS: t->eps = number(state, "--eps", arg, 0); return 0;
	case OPT_DENSE: t->dense_gradients = 1; return 0;
	case OPT_CLIP: t->clip_norm = number(state, "--clip-norm", arg, 0); return 0;
	case OPT_SCHEDULE: t->lr_schedule = arg; return 0;
	case OPT_PARAMS: o->params = push(o->params, &t->n_params, arg); return 0;
	case OPT_FREEZE: o->freeze = push(o->freeze, &t->n_freeze, arg); return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

int main(int argc, char **argv)
{
	options opts = {.t = {.lr = -1, .weight_decay = -1}};
	const tern_cli_tool tool = {
	        "tern-autodiff",
	        "Add a training step to an inference model: the loss, its gradients and the optimizer's update, as "
	        "an ONNX TrainingInfoProto that tern-run --train runs.\v"
	        "The inference graph is unchanged (it still runs in onnxruntime); optimizer state starts as zero "
	        "initializers, and update_binding maps every parameter and state to its new value. Run it before "
	        "tern-optimize -O2 (fused operators have no gradient rules). Exit status: 0 success, 64 usage, "
	        "65 a model that cannot be trained (no parameter, no rule for an operator, a loss that is not a "
	        "scalar), 66 GRAPH cannot be opened, 74 write failed.",
	        option_table,
	        parse_option,
	        &opts,
	        NULL,
	        1};
	tern_cli cli;
	tern_cli_parse(&cli, &tool, argc, argv);
	tern_train_options *t = &opts.t;
	bool adam = t->optimizer && (!strcmp(t->optimizer, "adam") || !strcmp(t->optimizer, "adamw"));
	if (t->lr < 0)
		t->lr = adam ? 1e-3 : 1e-2;
	t->params = opts.params;
	t->freeze = opts.freeze;
	if (t->loss_output && t->loss)
		tern_cli_fail(TERN_EUSAGE, "--loss-output and --loss exclude each other");
	FILE *out = tern_cli_open_output(&cli, 1);
	tern_model *m = tern_cli_load(&cli);
	tern_train_summary s;
	tern_cli_check(tern_model_add_training(m, t, &s));
	tern_cli_verbose(1, "%d parameters (%lld values), %d optimizer state tensors", s.n_params,
	                 (long long)s.param_elems, s.n_state);
	if (s.n_sparse)
		tern_cli_verbose(1, "%d embedding tables get their gradient as the rows read", s.n_sparse);
	if (s.batchnorm_training)
		tern_cli_verbose(1, "%d BatchNormalization nodes train on batch statistics", s.batchnorm_training);
	if (s.batchnorm_inference)
		tern_cli_warn("%d BatchNormalization nodes stay in inference mode: the model's opset is below 14, which "
		              "has no training_mode",
		              s.batchnorm_inference);
	tern_cli_write_model(out, m);
	tern_model_free(m);
	free(opts.params);
	free(opts.freeze);
	return 0;
}
