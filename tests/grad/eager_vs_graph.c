/* eager_vs_graph.c — eager gradients against tern-autodiff's: the model's graph is run node by node
 * through the eager API (tern_call_node) with its float initializers as parameters that require
 * gradients, the cross-entropy loss is taken eagerly and tern_backward gives the gradients; the same
 * model through tern_model_add_training (plain SGD, learning rate 1024) and one planned training
 * step gives them as (old - new) / 1024. They must agree to a relative 1e-4 of each gradient's
 * scale.
 *
 *     eager_vs_graph MODEL X.npy TARGET.npy      (the loss: cross-entropy of the first output) */
#include "internal.h"
#include "tern_eager.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static void die(const char *what)
{
	fprintf(stderr, "eager_vs_graph: %s: %s\n", what, tern_error());
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: eager_vs_graph MODEL X.npy TARGET.npy\n");
		return 2;
	}
	tern_tensor x = {0}, target = {0};
	if (tern_tensor_read_file(argv[2], &x) || tern_tensor_read_file(argv[3], &target))
		die("data");
	/* the graph's way */
	tern_model *m = NULL;
	if (tern_model_load(argv[1], &m))
		die("load");
	/* a large rate, so that old - new is the gradient with little of the parameter's rounding in it */
	const double lr = 1024;
	tern_train_options o = {.loss = "cross-entropy", .optimizer = "sgd", .lr = lr, .weight_decay = -1};
	if (tern_model_add_training(m, &o, NULL))
		die("tern-autodiff");
	tern_trainer *tr = NULL;
	if (tern_trainer_create(m, NULL, &tr))
		die("trainer");
	tern_tensor data[2] = {x, target};
	int n_state = tern_trainer_num_state(tr);
	tern_tensor *before = calloc((size_t)n_state, sizeof *before);
	for (int s = 0; s < n_state; s++)
		if (tern_tensor_copy(&before[s], tern_trainer_state(tr, tern_trainer_state_name(tr, s))))
			die("copy");
	double graph_loss = 0;
	if (tern_trainer_step(tr, data, &graph_loss))
		die("step");

	/* the eager way, on a fresh load of the same file */
	tern_model *em = NULL;
	if (tern_model_load(argv[1], &em))
		die("load");
	tern_ctx *c = NULL;
	if (tern_ctx_create(1, &c))
		die("context");
	tern_graph *g = em->graph;
	tern_var **val = calloc(g->n_values + 1, sizeof *val);
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if (v->flags & TERN_VALUE_INITIALIZER) {
			tern_tensor t = {0};
			if (tern_tensor_from_proto(v->initializer, em->base_dir, v->name, &t) ||
			    tern_var_from(c, t.dtype, t.rank, t.dims, t.data, &val[i]))
				die(v->name);
			int dt = t.dtype;
			tern_tensor_free(&t);
			/* the parameters tern-autodiff trains: what the trainer holds (running statistics excluded) */
			if (tern_trainer_state(tr, v->name) && (dt == TERN_FLOAT || dt == TERN_DOUBLE) &&
			    !strstr(v->name, "running_") && tern_var_set_requires_grad(val[i], 1))
				die(v->name);
		}
	}
	int k = 0;
	for (size_t i = 0; i < g->n_inputs; i++)
		if (!(g->inputs[i]->flags & TERN_VALUE_INITIALIZER)) {
			if (k++ || tern_var_from(c, x.dtype, x.rank, x.dims, x.data, &val[g->inputs[i]->index]))
				die("one data input expected");
		}
	tern_node **order;
	size_t count;
	if (tern_graph_toposort(g, &order, &count))
		die("order");
	for (size_t n = 0; n < count; n++) {
		tern_node *node = order[n];
		tern_var *in[64] = {NULL}, *out[64] = {NULL};
		for (size_t i = 0; i < node->n_inputs; i++)
			in[i] = node->inputs[i] ? val[node->inputs[i]->index] : NULL;
		if (tern_call_node(c, node, in, out))
			die(node->op_type);
		for (size_t o = 0; o < node->n_outputs; o++) {
			if (node->outputs[o])
				val[node->outputs[o]->index] = out[o];
			else
				tern_var_unref(out[o]);
		}
	}
	free(order);
	tern_var *logits = val[g->outputs[0]->index], *tv = NULL, *loss = NULL;
	if (tern_var_from(c, target.dtype, target.rank, target.dims, target.data, &tv))
		die("target");
	tern_var *li[2] = {logits, tv};
	tern_attr_arg mean = {.name = "reduction", .kind = TERN_ATTR_STRING, .s = "mean"};
	if (tern_call(c, "", "SoftmaxCrossEntropyLoss", li, 2, &mean, 1, &loss, 1) || tern_backward(loss, NULL))
		die("loss");
	double eager_loss = tern_tensor_get_f64(tern_var_tensor(loss), 0);
	int failed = fabs(eager_loss - graph_loss) > 1e-5 * fabs(graph_loss);
	printf("%s: loss eager %.8g, graph %.8g\n", argv[1], eager_loss, graph_loss);
	int compared = 0;
	double worst = 0;
	const char *worst_name = "";
	for (int s = 0; s < n_state; s++) {
		const char *name = tern_trainer_state_name(tr, s);
		tern_value *v = tern_graph_find(g, name);
		if (!v || !val[v->index] || !tern_var_requires_grad(val[v->index]))
			continue;
		const tern_tensor *now = tern_trainer_state(tr, name);
		tern_var *eg = tern_var_grad(val[v->index]);
		int64_t n = tern_tensor_numel(now);
		double scale = 0, err = 0;
		for (int64_t i = 0; i < n; i++) {
			double gg = (tern_tensor_get_f64(&before[s], i) - tern_tensor_get_f64(now, i)) / lr;
			double ge = eg ? tern_tensor_get_f64(tern_var_tensor(eg), i) : 0;
			scale = fmax(scale, fabs(gg));
			err = fmax(err, fabs(gg - ge));
		}
		double rel = scale > 0 ? err / scale : err;
		compared++;
		if (rel > worst) {
			worst = rel;
			worst_name = name;
		}
		if (rel > 1e-4) {
			printf("FAIL %s: eager and graph gradients differ by %.3g of their scale %.3g\n", name, rel, scale);
			failed = 1;
		}
	}
	printf("%s %d parameters, worst relative difference %.3g (%s)\n", failed ? "FAIL" : "ok  ", compared, worst,
	       worst_name);
	for (size_t i = 0; i < g->n_values; i++)
		tern_var_unref(val[i]);
	free(val);
	tern_var_unref(tv);
	tern_var_unref(loss);
	tern_ctx_free(c);
	for (int s = 0; s < n_state; s++)
		tern_tensor_free(&before[s]);
	free(before);
	tern_trainer_free(tr);
	tern_model_free(m);
	tern_model_free(em);
	tern_tensor_free(&x);
	tern_tensor_free(&target);
	return failed || !compared;
}
