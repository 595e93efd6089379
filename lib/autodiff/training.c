/* training.c — turns an inference model into a trainable one (tern-autodiff): the same model plus an
 * ONNX TrainingInfoProto whose algorithm graph is one training step.
 *
 * The algorithm graph holds its own copy of the forward computation (every value it computes renamed
 * "train/NAME", so that training-mode operators never disturb the inference graph), the loss, the
 * backward pass (tern_autodiff) and the parameter updates (tern.SGD, tern.Adam, tern.Adagrad).
 * Optimizer state (momentum buffers, moments, the step counter) becomes initializers of the main
 * graph, starting at zero; update_binding maps every parameter and state to its new value. As ONNX
 * defines it, a training step runs the inference graph and the algorithm graph combined: the
 * algorithm's nodes read the inference graph's inputs and initializers by name. */
#include "autodiff/grad.h"
#include "passes/passes.h"

#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>

/* Builder state for graph-mode emission outside a rule (autodiff.c). */
tern_status tern_grad_ctx_open(tern_model *m, tern_grad_ctx *ctx);
void tern_grad_ctx_close(tern_grad_ctx *ctx);

static bool matches_any(const char *name, const char *const *globs, int n)
{
	for (int i = 0; i < n; i++)
		if (fnmatch(globs[i], name, 0) == 0)
			return true;
	return false;
}

/* Initializers that only feed BatchNormalization's running statistics: updated from batch statistics
 * in training mode, never by gradients. */
static bool running_statistic(const tern_value *v)
{
	if (!v->n_consumers)
		return false;
	for (size_t c = 0; c < v->n_consumers; c++) {
		const tern_node *n = v->consumers[c];
		bool stat = tern_pass_is(n, "BatchNormalization") && n->n_inputs >= 5 &&
		            (n->inputs[3] == v || n->inputs[4] == v);
		if (!stat)
			return false;
	}
	return true;
}

/* Replaces BatchNormalization node n by one in the given mode: inference (one output) or training
 * (also the running statistics, as out_mean and out_var). */
static tern_node *rebuild_batchnorm(tern_graph *g, tern_node *n, bool training, const char *out_mean,
                                    const char *out_var)
{
	const char *ins[5];
	for (int k = 0; k < 5; k++)
		ins[k] = n->inputs[k]->name;
	char *y = tern_strdup(n->outputs[0]->name), *name = tern_strdup(n->name);
	const char *outs[3] = {y, out_mean, out_var};
	float eps = tern_attr_float(n, "epsilon", 1e-5f), mom = tern_attr_float(n, "momentum", 0.9f);
	tern_graph_remove_node(g, n);
	tern_node *bn = y && name ? tern_graph_add_node(g, "BatchNormalization", "", name, ins, 5, outs, training ? 3 : 1)
	                          : NULL;
	free(y);
	free(name);
	if (!bn || tern_node_add_attr_float(bn, "epsilon", eps) || tern_node_add_attr_float(bn, "momentum", mom) ||
	    (training && tern_node_add_attr_int(bn, "training_mode", 1)))
		return NULL;
	return bn;
}

/* A model exported in training mode (PyTorch's TrainingMode.TRAINING) has BatchNormalization in
 * training mode in its inference graph: the inference graph must infer, so it goes back to inference
 * mode there (its running-statistics outputs were never the graph's). */
static tern_status inference_mode(tern_model *m)
{
	tern_graph *g = m->graph;
	bool changed = false;
	for (size_t i = 0, n_nodes = g->n_nodes; i < n_nodes; i++) {
		tern_node *n = g->nodes[i];
		/* Dropout infers when its training_mode input is left out */
		if (!n->removed && tern_pass_is(n, "Dropout") && n->n_inputs >= 3 && n->inputs[2]) {
			tern_node_set_input(n, 2, NULL);
			continue;
		}
		if (n->removed || !tern_pass_is(n, "BatchNormalization") || n->n_inputs < 5 ||
		    !tern_attr_int(n, "training_mode", 0))
			continue;
		for (size_t o = 1; o < n->n_outputs; o++)
			if (n->outputs[o] && (n->outputs[o]->n_consumers || (n->outputs[o]->flags & TERN_VALUE_OUTPUT)))
				return tern_node_errorf(n, TERN_EDATA, "the running statistics of a training-mode "
				                        "BatchNormalization are read in the inference graph");
		if (!rebuild_batchnorm(g, n, false, NULL, NULL))
			return tern_errorf(TERN_EOS, "out of memory");
		changed = true;
	}
	return changed ? tern_graph_stable_order(g) : TERN_OK;
}

/* In the algorithm graph every Dropout (opset 12+) is active: training_mode a true constant, and a seed
 * of its own when it has none, so that a step is reproducible (the mask depends on the seed and the
 * run). */
static tern_status dropout_training(tern_model *a)
{
	tern_graph *g = a->graph;
	int k = 0;
	for (size_t i = 0, n_nodes = g->n_nodes; i < n_nodes; i++) {
		tern_node *n = g->nodes[i];
		if (n->removed || !tern_pass_is(n, "Dropout") || n->opset < 12 || !n->outputs[0])
			continue;
		char cname[512];
		snprintf(cname, sizeof cname, "train/%s.training_mode", n->outputs[0]->name);
		char *c = tern_graph_unique_name(g, cname);
		tern_tensor on = {0};
		const char *no_inputs[1] = {NULL};
		const char *couts[1] = {c};
		tern_node *cn = c && !tern_tensor_alloc(&on, TERN_BOOL, 0, NULL)
		                        ? tern_graph_add_node(g, "Constant", "", c, no_inputs, 0, couts, 1)
		                        : NULL;
		if (on.data)
			*(uint8_t *)on.data = 1;
		tern_status st = cn ? tern_node_add_attr_tensor(cn, "value", &on) : tern_errorf(TERN_EOS, "out of memory");
		tern_tensor_free(&on);
		if (st) {
			free(c);
			return st;
		}
		cn->outputs[0]->type.dtype = TERN_BOOL;
		cn->outputs[0]->type.rank = 0;
		/* the node gets its third input: rebuilt with the same inputs, outputs and attributes */
		const char *ins[3] = {n->inputs[0]->name, n->n_inputs > 1 && n->inputs[1] ? n->inputs[1]->name : "", c};
		const char *outs[2] = {n->outputs[0]->name, n->n_outputs > 1 && n->outputs[1] ? n->outputs[1]->name : ""};
		char *y = tern_strdup(outs[0]), *m = tern_strdup(outs[1]), *name = tern_strdup(n->name), *x = tern_strdup(ins[0]),
		     *r = tern_strdup(ins[1]);
		int64_t seed = tern_attr_int(n, "seed", 1000 + k++);
		tern_graph_remove_node(g, n);
		const char *ins2[3] = {x, r, c}, *outs2[2] = {y, m};
		tern_node *d = y && m && name && x && r
		                       ? tern_graph_add_node(g, "Dropout", "", name, ins2, 3, outs2, *m ? 2 : 1)
		                       : NULL;
		free(y), free(m), free(name), free(x), free(r), free(c);
		if (!d || tern_node_add_attr_int(d, "seed", seed))
			return tern_errorf(TERN_EOS, "out of memory");
	}
	return k ? tern_graph_stable_order(g) : TERN_OK;
}

/* ---------------------------------------------------------------- the loss */

static tern_gval *mean_all(tern_grad_ctx *g, tern_gval *x)
{
	tern_gattr k = TERN_GA_I("keepdims", 0);
	return x ? tern_g_op(g, "", "ReduceMean", &x, 1, &k, 1) : NULL;
}

static tern_status add_loss(tern_model *a, tern_grad_ctx *g, const tern_train_options *o, tern_value *out,
                            tern_value **target, tern_value **loss)
{
	const char *kind = o->loss ? o->loss : "cross-entropy";
	tern_type t = out->type;
	bool ce = strcmp(kind, "cross-entropy") == 0;
	if (ce) {
		/* integer classes: the output's shape without its class axis (1) */
		if (t.rank < 2)
			return tern_errorf(TERN_EDATA, "%s: --loss cross-entropy needs an output of rank 2 or more (N, C, ...); "
			                   "'%s' has rank %d", a->source, out->name, t.rank);
		for (int d = 1; d + 1 < t.rank; d++) {
			t.dims[d] = t.dims[d + 1];
			t.dim_param[d] = t.dim_param[d + 1];
		}
		t.rank--;
		t.dtype = TERN_INT64;
	} else if (strcmp(kind, "mse") && strcmp(kind, "l1") && strcmp(kind, "bce-with-logits")) {
		return tern_errorf(TERN_EUSAGE, "unknown loss '%s' (cross-entropy, mse, l1 or bce-with-logits)", kind);
	}
	const char *tname = o->target ? o->target : "target";
	if (tern_graph_find(a->graph, tname))
		return tern_errorf(TERN_EUSAGE, "%s: the graph already has a value named '%s'; choose --target", a->source,
		                   tname);
	*target = tern_graph_add_input(a->graph, tname, &t);
	if (!*target)
		return tern_errorf(TERN_EOS, "out of memory");
	tern_gval *y = (tern_gval *)out, *tg = (tern_gval *)*target, *l = NULL;
	if (ce) {
		if (tern_model_opset(a, "") < 12)
			return tern_errorf(TERN_EDATA, "%s: --loss cross-entropy needs opset 12 or later (the model has %lld)",
			                   a->source, (long long)tern_model_opset(a, ""));
		tern_gval *in[2] = {y, tg};
		tern_gattr r = TERN_GA_S("reduction", "mean");
		l = tern_g_op(g, "", "SoftmaxCrossEntropyLoss", in, 2, &r, 1);
	} else if (strcmp(kind, "mse") == 0) {
		tern_gval *d = tern_g_sub(g, y, tg);
		l = mean_all(g, tern_g_mul(g, d, d));
	} else if (strcmp(kind, "l1") == 0) {
		l = mean_all(g, tern_g_unary(g, "Abs", tern_g_sub(g, y, tg)));
	} else {
		/* mean(max(x, 0) - x t + log(1 + exp(-|x|))), the stable form PyTorch uses */
		tern_gval *soft = tern_g_unary(g, "Softplus", tern_g_neg(g, tern_g_unary(g, "Abs", y)));
		l = mean_all(g, tern_g_add(g, tern_g_sub(g, tern_g_unary(g, "Relu", y), tern_g_mul(g, y, tg)), soft));
	}
	if (!l)
		return tern_g_status(g);
	*loss = (tern_value *)l;
	(*loss)->type.dtype = out->type.dtype;
	(*loss)->type.rank = 0;
	return TERN_OK;
}

/* ---------------------------------------------------------------- learning rate */

static tern_gval *learning_rate(tern_grad_ctx *g, const tern_train_options *o, tern_gval *t, tern_gval *like,
                                tern_status *st)
{
	const char *s = o->lr_schedule ? o->lr_schedule : "constant";
	tern_gval *lr = tern_g_scalar(g, o->lr, like);
	if (strcmp(s, "constant") == 0)
		return lr;
	tern_gattr to = TERN_GA_I("to", tern_g_dtype(g, like));
	tern_gval *tf = tern_g_op(g, "", "Cast", &t, 1, &to, 1); /* the step taken, from 1 */
	double a = 0, b = 0;
	if (sscanf(s, "step:%lf:%lf", &a, &b) == 2 && a >= 1) {
		/* lr gamma^floor((t - 1) / EVERY), StepLR counted in steps */
		tern_gval *e = tern_g_unary(g, "Floor", tern_g_div(g, tern_g_sub(g, tf, tern_g_scalar(g, 1, like)),
		                                                   tern_g_scalar(g, a, like)));
		tern_gval *in[2] = {tern_g_scalar(g, b, like), e};
		return tern_g_mul(g, lr, tern_g_op(g, "", "Pow", in, 2, NULL, 0));
	}
	if (sscanf(s, "cosine:%lf", &a) == 1 && a >= 1) {
		/* lr (1 + cos(pi min(t - 1, STEPS) / STEPS)) / 2, CosineAnnealingLR to zero */
		tern_gval *in[2] = {tern_g_sub(g, tf, tern_g_scalar(g, 1, like)), tern_g_scalar(g, a, like)};
		tern_gval *frac = tern_g_div(g, tern_g_op(g, "", "Min", in, 2, NULL, 0), tern_g_scalar(g, a, like));
		tern_gval *c = tern_g_unary(g, "Cos", tern_g_mul(g, frac, tern_g_scalar(g, M_PI, like)));
		return tern_g_mul(g, lr, tern_g_mul(g, tern_g_add(g, c, tern_g_scalar(g, 1, like)), tern_g_scalar(g, 0.5, like)));
	}
	if (sscanf(s, "warmup:%lf", &a) == 1 && a >= 1) {
		/* lr min(1, t / STEPS) */
		tern_gval *in[2] = {tern_g_div(g, tf, tern_g_scalar(g, a, like)), tern_g_scalar(g, 1, like)};
		return tern_g_mul(g, lr, tern_g_op(g, "", "Min", in, 2, NULL, 0));
	}
	*st = tern_errorf(TERN_EUSAGE, "--lr-schedule '%s': constant, step:EVERY:GAMMA, cosine:STEPS or warmup:STEPS", s);
	return NULL;
}

/* ---------------------------------------------------------------- state and bindings */

struct binding {
	char *key; /* initializer of the main graph */
	char *value; /* output of the algorithm graph */
};

struct plan {
	struct binding *b;
	size_t n, cap;
	/* state initializers to add to the main graph */
	tern_tensor *state;
	char **state_names;
	bool *state_external; /* belongs with external data: the state of a parameter that came from a data file */
	size_t n_state, cap_state, cap_names, cap_external;
};

static tern_status bind(struct plan *p, const char *key, const char *value)
{
	if (!tern_grow((void **)&p->b, &p->cap, p->n + 1, sizeof *p->b))
		return tern_errorf(TERN_EOS, "out of memory");
	p->b[p->n].key = tern_strdup(key);
	p->b[p->n].value = tern_strdup(value);
	if (!p->b[p->n].key || !p->b[p->n].value)
		return tern_errorf(TERN_EOS, "out of memory");
	p->n++;
	return TERN_OK;
}

/* A zero state like the parameter (or a scalar of dtype), an initializer of both graphs: in the
 * algorithm model now, in the main graph later. */
static tern_value *new_state(tern_model *a, struct plan *p, const char *name, int dtype, int rank, const int64_t *dims)
{
	if (tern_graph_find(a->graph, name))
		return NULL;
	if (!tern_grow((void **)&p->state, &p->cap_state, p->n_state + 1, sizeof *p->state) ||
	    !tern_grow((void **)&p->state_names, &p->cap_names, p->n_state + 1, sizeof *p->state_names) ||
	    !tern_grow((void **)&p->state_external, &p->cap_external, p->n_state + 1, sizeof *p->state_external))
		return NULL;
	p->state_external[p->n_state] = false;
	tern_tensor *t = &p->state[p->n_state];
	memset(t, 0, sizeof *t);
	if (tern_tensor_alloc(t, dtype, rank, dims))
		return NULL;
	p->state_names[p->n_state++] = tern_strdup(name);
	return tern_graph_add_initializer(a->graph, name, t);
}

static void free_plan(struct plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		free(p->b[i].key);
		free(p->b[i].value);
	}
	for (size_t i = 0; i < p->n_state; i++) {
		tern_tensor_free(&p->state[i]);
		free(p->state_names[i]);
	}
	free(p->b);
	free(p->state);
	free(p->state_names);
	free(p->state_external);
}

/* ---------------------------------------------------------------- the algorithm graph's proto */

struct renames {
	char **from;
	size_t n, cap;
};

static bool renamed(const struct renames *r, const char *name)
{
	for (size_t i = 0; i < r->n; i++)
		if (strcmp(r->from[i], name) == 0)
			return true;
	return false;
}

/* "train/NAME" for every name the forward copy computes, in the nodes and value_info of g and in the
 * nodes of its subgraphs (which may read outer values), and for the names of the nodes that compute
 * them. */
static tern_status rename_in(Onnx__GraphProto *g, const struct renames *r)
{
	for (size_t i = 0; i < g->n_node; i++) {
		Onnx__NodeProto *n = g->node[i];
		char **lists[2] = {n->input, n->output};
		size_t counts[2] = {n->n_input, n->n_output};
		bool copy = false; /* a node of the forward copy: it is renamed too (node names stay unique) */
		for (int l = 0; l < 2; l++)
			for (size_t k = 0; k < counts[l]; k++) {
				char *name = lists[l][k];
				if (!name || !*name || !renamed(r, name))
					continue;
				char *nn = malloc(strlen(name) + 7);
				if (!nn)
					return tern_errorf(TERN_EOS, "out of memory");
				sprintf(nn, "train/%s", name);
				free(name);
				lists[l][k] = nn;
				copy |= l == 1;
			}
		if (copy && n->name && *n->name) {
			char *nn = malloc(strlen(n->name) + 7);
			if (!nn)
				return tern_errorf(TERN_EOS, "out of memory");
			sprintf(nn, "train/%s", n->name);
			free(n->name);
			n->name = nn;
		}
		for (size_t k = 0; k < n->n_attribute; k++) {
			Onnx__AttributeProto *at = n->attribute[k];
			tern_status st = at->g ? rename_in(at->g, r) : TERN_OK;
			for (size_t s = 0; !st && s < at->n_graphs; s++)
				st = rename_in(at->graphs[s], r);
			if (st)
				return st;
		}
	}
	for (size_t i = 0; i < g->n_value_info; i++) {
		char *name = g->value_info[i]->name;
		if (name && renamed(r, name)) {
			char *nn = malloc(strlen(name) + 7);
			if (!nn)
				return tern_errorf(TERN_EOS, "out of memory");
			sprintf(nn, "train/%s", name);
			free(name);
			g->value_info[i]->name = nn;
		}
	}
	return TERN_OK;
}

/* Keeps the entries of list whose names pass keep(); frees the others. */
#define FILTER(LIST, N, FREE, KEEP)                       \
	do {                                              \
		size_t k_ = 0;                            \
		for (size_t i_ = 0; i_ < (N); i_++) {     \
			if (KEEP((LIST)[i_]))             \
				(LIST)[k_++] = (LIST)[i_]; \
			else                              \
				FREE((LIST)[i_], NULL);   \
		}                                         \
		(N) = k_;                                 \
	} while (0)

static const tern_graph *main_graph; /* for the filters below (one call at a time) */
static const char *const *keep_outputs;
static size_t n_keep_outputs;

static bool not_main_initializer(const Onnx__TensorProto *t)
{
	return !t->name || !tern_graph_find((tern_graph *)main_graph, t->name) ||
	       !(tern_graph_find((tern_graph *)main_graph, t->name)->flags & TERN_VALUE_INITIALIZER);
}

static bool new_input(const Onnx__ValueInfoProto *v)
{
	return v->name && !tern_graph_find((tern_graph *)main_graph, v->name);
}

static bool wanted_output(const Onnx__ValueInfoProto *v)
{
	for (size_t i = 0; i < n_keep_outputs; i++)
		if (v->name && strcmp(v->name, keep_outputs[i]) == 0)
			return true;
	return false;
}

/* ---------------------------------------------------------------- entry */

tern_status tern_model_add_training(tern_model *m, const tern_train_options *o, tern_train_summary *summary)
{
	if (m->proto->n_training_info)
		return tern_errorf(TERN_EUSAGE, "%s: the model already has a training algorithm; start from the inference model",
		                   m->source);
	tern_graph *mg = m->graph;
	/* the parameters: float initializers that are not caller-supplied defaults or running statistics */
	int n_params = 0;
	tern_value **params = calloc(mg->n_values + 1, sizeof *params);
	if (!params)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < mg->n_values; i++) {
		tern_value *v = mg->values[i];
		if (!(v->flags & TERN_VALUE_INITIALIZER) || (v->flags & TERN_VALUE_INPUT) || !tern_g_differentiable(v->type.dtype) ||
		    !v->n_consumers || running_statistic(v))
			continue;
		if (o->n_params && !matches_any(v->name, o->params, o->n_params))
			continue;
		if (matches_any(v->name, o->freeze, o->n_freeze))
			continue;
		params[n_params++] = v;
	}
	if (!n_params) {
		free(params);
		return tern_errorf(TERN_EDATA, "%s: no trainable parameter (float initializers%s)", m->source,
		                   o->n_params || o->n_freeze ? " matching --params and not --freeze" : "");
	}

	/* the algorithm model: a copy of this one (in inference mode), to which the step is added */
	void *bytes = NULL;
	size_t size = 0;
	tern_model *a = NULL;
	tern_status st = inference_mode(m);
	if (!st)
		st = tern_model_save_bytes(m, &bytes, &size);
	if (!st)
		st = tern_model_load_bytes(bytes, size, m->source, m->base_dir, &a);
	free(bytes);
	/* calls and Ifs: kept, with the functions their gradients run */
	bool calls_kept = false;
	if (!st)
		st = tern_grad_prepare_calls(&a, &calls_kept);
	if (st) {
		tern_model_free(a);
		free(params);
		return st;
	}
	tern_graph *ag = a->graph;
	tern_value **wrt = calloc((size_t)n_params, sizeof *wrt), **grads = calloc((size_t)n_params, sizeof *grads);
	tern_value **gidx = calloc((size_t)n_params, sizeof *gidx);
	bool *rows_ok = calloc((size_t)n_params, sizeof *rows_ok);
	struct renames ren = {0};
	struct plan plan = {0};
	tern_grad_ctx gc;
	bool have_ctx = false;
	if (!wrt || !grads || !gidx || !rows_ok)
		st = tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; !st && i < n_params; i++)
		rows_ok[i] = !o->dense_gradients;
	for (int i = 0; !st && i < n_params; i++)
		wrt[i] = tern_graph_find(ag, params[i]->name);
	/* the names the forward copy computes */
	for (size_t i = 0; !st && i < ag->n_values; i++) {
		tern_value *v = ag->values[i];
		if (!v->producer)
			continue;
		if (!tern_grow((void **)&ren.from, &ren.cap, ren.n + 1, sizeof *ren.from) || !(ren.from[ren.n++] = tern_strdup(v->name)))
			st = tern_errorf(TERN_EOS, "out of memory");
	}
	if (!st)
		st = tern_grad_ctx_open(a, &gc);
	have_ctx = !st;
	tern_value *out = NULL, *target = NULL, *loss = NULL;
	if (!st) {
		const char *name = o->loss_output ? o->loss_output : o->output;
		for (size_t i = 0; i < ag->n_outputs && !out; i++)
			if (!name || strcmp(ag->outputs[i]->name, name) == 0)
				out = ag->outputs[i];
		if (!out)
			st = tern_errorf(TERN_EUSAGE, "%s: the graph has no output '%s'", m->source, name ? name : "");
	}
	int bn_kept = 0, bn_trained = 0;
	/* training mode: BatchNormalization normalises with the batch's statistics and its running
	 * statistics become bound state (ONNX's momentum: new = old momentum + batch (1 - momentum)) */
	for (size_t i = 0, n_nodes = ag->n_nodes; !st && i < n_nodes; i++) {
		tern_node *n = ag->nodes[i];
		if (n->removed || !tern_pass_is(n, "BatchNormalization") || n->n_inputs < 5 || !n->outputs[0] ||
		    tern_attr_int(n, "training_mode", 0))
			continue;
		if (n->opset < 14) {
			/* before opset 14 there is no training_mode: it stays an affine map of its statistics */
			bn_kept++;
			continue;
		}
		tern_value *mean = n->inputs[3], *var = n->inputs[4];
		if (!(mean->flags & TERN_VALUE_INITIALIZER) || !(var->flags & TERN_VALUE_INITIALIZER))
			continue;
		char mean_name[512], var_name[512];
		snprintf(mean_name, sizeof mean_name, "train/%s.running", mean->name);
		snprintf(var_name, sizeof var_name, "train/%s.running", var->name);
		tern_node *bn = rebuild_batchnorm(ag, n, true, mean_name, var_name);
		if (!bn || bind(&plan, mean->name, mean_name)) {
			st = tern_errorf(TERN_EOS, "out of memory");
			break;
		}
		bn->outputs[1]->type = mean->type;
		bn->outputs[2]->type = var->type;
		/* ONNX updates the running variance with the batch's biased variance, PyTorch with the unbiased
		 * one: m rv + (1 - m) v n / (n - 1), n the values a channel has. As ONNX's output is
		 * m rv + (1 - m) v, PyTorch's is m rv + (onnx - m rv) n / (n - 1). */
		tern_gval *x0 = (tern_gval *)bn->inputs[0], *rv = (tern_gval *)var;
		int64_t one = 1;
		tern_gval *gi[2] = {tern_g_shape(&gc, x0), tern_g_ints(&gc, &one, 1)};
		tern_gattr ax = TERN_GA_I("axis", 0);
		tern_gval *ch = gi[0] && gi[1] ? tern_g_op(&gc, "", "Gather", gi, 2, &ax, 1) : NULL;
		tern_gval *cnt = tern_g_div(&gc, tern_g_unary(&gc, "Size", x0), ch);
		tern_gattr to = TERN_GA_I("to", var->type.dtype);
		cnt = cnt ? tern_g_op(&gc, "", "Cast", &cnt, 1, &to, 1) : NULL;
		if (cnt)
			((tern_value *)cnt)->type.dtype = var->type.dtype;
		tern_gval *ratio = tern_g_div(&gc, cnt, tern_g_sub(&gc, cnt, tern_g_scalar(&gc, 1, rv)));
		tern_gval *mrv = tern_g_mul(&gc, rv, tern_g_scalar(&gc, tern_attr_float(bn, "momentum", 0.9f), rv));
		tern_gval *torch_rv =
		        tern_g_add(&gc, mrv, tern_g_mul(&gc, tern_g_sub(&gc, (tern_gval *)bn->outputs[2], mrv), ratio));
		if (!torch_rv || bind(&plan, var->name, ((tern_value *)torch_rv)->name)) {
			st = tern_g_status(&gc);
			break;
		}
		((tern_value *)torch_rv)->type = var->type;
		bn_trained++;
	}
	if (!st && bn_trained)
		st = tern_graph_stable_order(ag);
	if (!st)
		st = dropout_training(a);
	if (!st) {
		st = tern_model_infer_shapes(a, 0, NULL, NULL);
	}
	if (!st && o->loss_output) {
		loss = out;
		if (loss->type.rank != 0 && !(loss->type.rank == 1 && loss->type.dims[0] == 1))
			st = tern_errorf(TERN_EDATA, "%s: --loss-output '%s' is not a scalar (rank %d)", m->source, loss->name,
			                 loss->type.rank);
	} else if (!st) {
		st = add_loss(a, &gc, o, out, &target, &loss);
	}
	if (!st)
		st = tern_autodiff_rows(a, &loss, NULL, 1, wrt, n_params, rows_ok, grads, gidx);
	for (int i = 0; !st && i < n_params; i++)
		if (!grads[i])
			st = tern_errorf(TERN_EDATA, "%s: the loss does not depend on parameter '%s'; --freeze it", m->source,
			                 params[i]->name);
	/* gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_ */
	if (!st && o->clip_norm > 0) {
		tern_gval *sq[64], *total = NULL;
		for (int i = 0; i < n_params; i++) {
			tern_gattr k = TERN_GA_I("keepdims", 0);
			tern_gval *gi = (tern_gval *)grads[i];
			if (gidx[i]) {
				/* duplicate rows are summed first: the norm is the dense gradient's */
				tern_gval *ir[2] = {(tern_gval *)gidx[i], gi};
				tern_gattr rows = TERN_GA_I("rows", wrt[i]->type.dims[0]);
				sq[i % 64] = tern_g_op(&gc, TERN_DOMAIN, "RowsSumSquare", ir, 2, &rows, 1);
				if (sq[i % 64]) {
					((tern_value *)sq[i % 64])->type.dtype = wrt[i]->type.dtype;
					((tern_value *)sq[i % 64])->type.rank = 0;
				}
			} else {
				sq[i % 64] = tern_g_op(&gc, "", "ReduceSumSquare", &gi, 1, &k, 1);
			}
			total = total ? tern_g_add(&gc, total, sq[i % 64]) : sq[i % 64];
		}
		tern_gval *norm = tern_g_unary(&gc, "Sqrt", total);
		tern_gval *like = (tern_gval *)grads[0];
		tern_gval *coef = tern_g_div(&gc, tern_g_scalar(&gc, o->clip_norm, like),
		                             tern_g_add(&gc, norm, tern_g_scalar(&gc, 1e-6, like)));
		tern_gval *in[2] = {coef, tern_g_scalar(&gc, 1.0, like)};
		coef = tern_g_op(&gc, "", "Min", in, 2, NULL, 0);
		for (int i = 0; i < n_params && coef; i++)
			grads[i] = (tern_value *)tern_g_mul(&gc, (tern_gval *)grads[i], coef);
		if (!coef || !grads[n_params - 1])
			st = tern_g_status(&gc);
	}
	/* the step counter: t = step + 1 is the step being taken */
	const char **outs = calloc((size_t)(4 * n_params + 8) + 2 * plan.n, sizeof *outs);
	size_t n_outs = 0;
	tern_gval *t = NULL;
	if (!outs && !st)
		st = tern_errorf(TERN_EOS, "out of memory");
	if (!st) {
		outs[n_outs++] = loss->name;
		tern_value *step = new_state(a, &plan, "tern.step", TERN_INT64, 0, NULL);
		tern_gval *one = step ? tern_g_op(&gc, "", "Constant", NULL, 0, NULL, 0) : NULL;
		if (one) {
			tern_tensor c = {0};
			if (!tern_tensor_alloc(&c, TERN_INT64, 0, NULL)) {
				*(int64_t *)c.data = 1;
				st = tern_node_add_attr_tensor(((tern_value *)one)->producer, "value", &c);
				tern_tensor_free(&c);
			}
			((tern_value *)one)->type.dtype = TERN_INT64;
			((tern_value *)one)->type.rank = 0;
		}
		t = one && !st ? tern_g_add(&gc, (tern_gval *)step, one) : NULL;
		if (!t && !st)
			st = step ? tern_g_status(&gc) : tern_errorf(TERN_EUSAGE, "%s: the graph already has a value 'tern.step'",
			                                           m->source);
		if (!st) {
			((tern_value *)t)->type = step->type;
			outs[n_outs++] = ((tern_value *)t)->name;
			st = bind(&plan, "tern.step", ((tern_value *)t)->name);
		}
	}
	int n_sparse = 0;
	const char *opt = o->optimizer ? o->optimizer : "sgd";
	bool sgd = !strcmp(opt, "sgd"), adam = !strcmp(opt, "adam"), adamw = !strcmp(opt, "adamw"),
	     adagrad = !strcmp(opt, "adagrad");
	if (!st && !sgd && !adam && !adamw && !adagrad)
		st = tern_errorf(TERN_EUSAGE, "unknown optimizer '%s' (sgd, adam, adamw or adagrad)", opt);
	tern_gval *lr = NULL;
	if (!st)
		lr = learning_rate(&gc, o, t, (tern_gval *)grads[0], &st);
	if (!st && !lr)
		st = tern_g_status(&gc);
	/* the algorithm's second output: the learning rate of the step (for logs) */
	if (!st && (lr = tern_g_op(&gc, "", "Identity", &lr, 1, NULL, 0))) {
		outs[n_outs] = outs[1]; /* after the loss, before the step counter */
		outs[1] = ((tern_value *)lr)->name;
		n_outs++;
	}
	else if (!st)
		st = tern_g_status(&gc);
	for (int i = 0; !st && i < n_params; i++) {
		tern_value *p = wrt[i];
		char name[512];
		tern_gval *in[8], *res[3] = {NULL};
		int n_in = 0, n_res = 1;
		const char *state_names[2] = {NULL, NULL};
		const char *op;
		tern_gattr at[6];
		int n_at = 0;
		double wd = o->weight_decay >= 0 ? o->weight_decay : adamw ? 0.01 : 0.0;
		n_sparse += gidx[i] != NULL;
		if (sgd) {
			op = gidx[i] ? "SGDRows" : "SGD";
			in[n_in++] = lr;
			in[n_in++] = (tern_gval *)p;
			if (gidx[i])
				in[n_in++] = (tern_gval *)gidx[i];
			in[n_in++] = (tern_gval *)grads[i];
			at[n_at++] = TERN_GA_F("momentum", (float)o->momentum);
			at[n_at++] = TERN_GA_I("nesterov", o->nesterov);
			at[n_at++] = TERN_GA_F("weight_decay", (float)wd);
			if (o->momentum != 0)
				state_names[0] = "momentum_buffer";
		} else {
			op = adagrad ? (gidx[i] ? "AdagradRows" : "Adagrad") : gidx[i] ? "AdamRows" : "Adam";
			in[n_in++] = lr;
			in[n_in++] = t;
			in[n_in++] = (tern_gval *)p;
			if (gidx[i])
				in[n_in++] = (tern_gval *)gidx[i];
			in[n_in++] = (tern_gval *)grads[i];
			at[n_at++] = TERN_GA_F("weight_decay", (float)wd);
			at[n_at++] = TERN_GA_F("epsilon", (float)(o->eps > 0 ? o->eps : adagrad ? 1e-10 : 1e-8));
			if (!adagrad) {
				at[n_at++] = TERN_GA_F("beta1", (float)(o->beta1 > 0 ? o->beta1 : 0.9));
				at[n_at++] = TERN_GA_F("beta2", (float)(o->beta2 > 0 ? o->beta2 : 0.999));
				at[n_at++] = TERN_GA_I("decoupled", adamw);
				state_names[0] = "exp_avg";
				state_names[1] = "exp_avg_sq";
			} else {
				state_names[0] = "sum";
			}
		}
		for (int s = 0; s < 2 && state_names[s] && !st; s++) {
			snprintf(name, sizeof name, "%s.%s", p->name, state_names[s]);
			tern_value *sv = new_state(a, &plan, name, p->type.dtype, p->type.rank, p->type.dims);
			const Onnx__TensorProto *ptp = params[i]->initializer;
			if (sv)
				plan.state_external[plan.n_state - 1] =
				        ptp && ptp->has_data_location && ptp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
			if (!sv)
				st = tern_errorf(TERN_EUSAGE, "%s: cannot add the state '%s' (the name is taken?)", m->source, name);
			else
				in[n_in++] = (tern_gval *)sv, n_res++;
		}
		if (!st)
			st = tern_g_op_n(&gc, TERN_DOMAIN, op, in, n_in, at, n_at, res, n_res);
		for (int r = 0; !st && r < n_res; r++) {
			tern_value *rv = (tern_value *)res[r];
			rv->type = p->type;
			outs[n_outs++] = rv->name;
			if (r == 0) {
				st = bind(&plan, p->name, rv->name);
			} else {
				snprintf(name, sizeof name, "%s.%s", p->name, state_names[r - 1]);
				st = bind(&plan, name, rv->name);
			}
		}
	}
	/* every bound value is an output (the running statistics were bound before the loss existed) */
	for (size_t b = 0; !st && b < plan.n; b++) {
		bool listed = false;
		for (size_t i = 0; i < n_outs && !listed; i++)
			listed = strcmp(outs[i], plan.b[b].value) == 0;
		if (!listed)
			outs[n_outs++] = plan.b[b].value;
	}
	for (size_t i = 0; !st && i < n_outs; i++) {
		tern_value *v = tern_graph_find(ag, outs[i]);
		st = v ? tern_graph_add_output(ag, v) : tern_errorf(TERN_EINTERNAL, "no value '%s'", outs[i]);
	}

	/* the algorithm graph: the copy's graph less what the main graph holds, forward values renamed */
	Onnx__GraphProto *alg = NULL;
	if (!st && !(st = tern_model_sync(a)) && !(alg = tern_pb_copy(a->proto->graph)))
		st = tern_errorf(TERN_EOS, "out of memory");
	if (!st) {
		main_graph = mg;
		keep_outputs = outs;
		n_keep_outputs = n_outs;
		FILTER(alg->initializer, alg->n_initializer, onnx__tensor_proto__free_unpacked, not_main_initializer);
		FILTER(alg->input, alg->n_input, onnx__value_info_proto__free_unpacked, new_input);
		FILTER(alg->output, alg->n_output, onnx__value_info_proto__free_unpacked, wanted_output);
		st = rename_in(alg, &ren);
		for (size_t i = 0; !st && i < alg->n_output; i++)
			if (renamed(&ren, alg->output[i]->name)) {
				char *nn = malloc(strlen(alg->output[i]->name) + 7);
				if (!nn) {
					st = tern_errorf(TERN_EOS, "out of memory");
					break;
				}
				sprintf(nn, "train/%s", alg->output[i]->name);
				free(alg->output[i]->name);
				alg->output[i]->name = nn;
			}
		/* algorithm initializers left: the state, which belongs to the main graph */
		for (size_t i = 0; i < alg->n_initializer; i++)
			onnx__tensor_proto__free_unpacked(alg->initializer[i], NULL);
		alg->n_initializer = 0;
		free(alg->name);
		alg->name = tern_strdup("training_step");
	}
	/* into this model: state initializers, opset, the TrainingInfoProto */
	for (size_t i = 0; !st && i < plan.n_state; i++) {
		tern_value *sv = tern_graph_add_initializer(mg, plan.state_names[i], &plan.state[i]);
		if (!sv)
			st = tern_errorf(TERN_EOS, "out of memory");
		else if (plan.state_external[i] && sv->initializer) {
			/* raw bytes in memory, marked for the data file: the writer puts it beside its parameter */
			sv->initializer->has_data_location = 1;
			sv->initializer->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
		}
	}
	if (!st)
		st = tern_model_import_opset(m, TERN_DOMAIN, TERN_DOMAIN_VERSION);
	/* the functions the step's kept calls run (F__fwd, F__grad, the lifted branches) */
	for (size_t i = m->proto->n_functions; !st && calls_kept && i < a->proto->n_functions; i++) {
		Onnx__FunctionProto *fp = tern_pb_copy(a->proto->functions[i]);
		st = fp ? tern_model_add_function(m, fp) : tern_errorf(TERN_EOS, "out of memory");
	}
	if (!st && calls_kept)
		st = tern_model_import_opset(m, TERN_GRAD_DOMAIN, 1);
	Onnx__TrainingInfoProto *ti = NULL;
	Onnx__TrainingInfoProto **tis = NULL;
	if (!st) {
		ti = calloc(1, sizeof *ti);
		tis = realloc(m->proto->training_info, sizeof *tis);
		if (tis)
			m->proto->training_info = tis;
		Onnx__StringStringEntryProto **ub = calloc(plan.n + 1, sizeof *ub);
		if (!ti || !tis || !ub) {
			free(ti);
			free(ub);
			st = tern_errorf(TERN_EOS, "out of memory");
		} else {
			onnx__training_info_proto__init(ti);
			ti->algorithm = alg;
			alg = NULL;
			ti->update_binding = ub;
			for (size_t i = 0; i < plan.n && !st; i++) {
				ub[i] = calloc(1, sizeof *ub[i]);
				if (!ub[i]) {
					st = tern_errorf(TERN_EOS, "out of memory");
					break;
				}
				onnx__string_string_entry_proto__init(ub[i]);
				ub[i]->key = plan.b[i].key;
				/* a value the forward copy computes was renamed (BatchNormalization's statistics) */
				if (renamed(&ren, plan.b[i].value)) {
					ub[i]->value = malloc(strlen(plan.b[i].value) + 7);
					if (ub[i]->value)
						sprintf(ub[i]->value, "train/%s", plan.b[i].value);
					free(plan.b[i].value);
				} else {
					ub[i]->value = plan.b[i].value;
				}
				plan.b[i].key = plan.b[i].value = NULL;
				ti->n_update_binding++;
			}
			m->proto->training_info[m->proto->n_training_info++] = ti;
		}
	}
	if (!st && summary) {
		memset(summary, 0, sizeof *summary);
		summary->n_sparse = n_sparse;
		summary->n_params = n_params;
		summary->n_state = (int)plan.n_state;
		summary->param_elems = 0;
		summary->batchnorm_training = bn_trained;
		summary->batchnorm_inference = bn_kept;
		for (int i = 0; i < n_params; i++)
			summary->param_elems += tern_numel(params[i]->type.rank, params[i]->type.dims);
	}
	if (alg)
		onnx__graph_proto__free_unpacked(alg, NULL);
	if (have_ctx)
		tern_grad_ctx_close(&gc);
	for (size_t i = 0; i < ren.n; i++)
		free(ren.from[i]);
	free(ren.from);
	free(outs);
	free_plan(&plan);
	free(wrt);
	free(grads);
	free(gidx);
	free(rows_ok);
	free(params);
	tern_model_free(a);
	return st;
}
