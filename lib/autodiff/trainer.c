/* trainer.c — planned training steps: the inference graph and the algorithm graph of a model's
 * TrainingInfoProto combined into one graph (as ONNX defines a training step), planned once like any
 * graph, and run step after step. The inference graph's own nodes, which no output of the algorithm
 * needs (it computes a training-mode copy of them), are removed.
 *
 * Every tensor that update_binding names (parameters, optimizer state, the step counter) is a
 * caller-held tensor fed to the plan as an input rather than a constant, so that nothing computed
 * from it is folded while planning. Its new value is written into it in place by the step that
 * computes it (the optimizer's update, tern_plan_options.inplace_*); where the planner cannot show
 * that safe (a value some later step still reads the old one of), it is copied in after the step. The combined
 * graph's outputs are the algorithm's, so the inference graph's own outputs (and whatever only they
 * need) are not computed. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

struct tern_trainer {
	tern_model *src; /* the model being trained: its initializers are written by tern_trainer_sync */
	tern_model *step_model; /* the combined graph */
	tern_plan *plan;
	tern_plan_options opts;
	int n_data; /* caller inputs: the inference graph's and the algorithm's, in that order */
	int n_state; /* bound tensors, fed after the data */
	char **state_names;
	tern_tensor *state; /* their current values */
	int *state_out; /* the plan output holding each one's next value */
	int loss_out; /* the plan output of the loss (the algorithm's first output) */
	tern_tensor *feed; /* the step model's inputs, in its order */
	int *feed_from; /* for each: >= 0 the data input of that index, < 0 state -1 - s */
	int *data_input; /* the step model input of each data input */
	int n_feed;
	int *inplace; /* plan inputs, then the outputs written into them */
	int n_inplace;
	int64_t steps_done;
};

static tern_status adopt(tern_model *m, tern_value *v, tern_tensor *out);

static Onnx__StringStringEntryProto *const *bindings(const tern_model *m, size_t *n)
{
	const Onnx__TrainingInfoProto *ti = m->proto->n_training_info ? m->proto->training_info[0] : NULL;
	*n = ti ? ti->n_update_binding : 0;
	return ti ? ti->update_binding : NULL;
}

static const char *bound_value(const tern_model *m, const char *key)
{
	size_t n;
	Onnx__StringStringEntryProto *const *b = bindings(m, &n);
	for (size_t i = 0; i < n; i++)
		if (b[i]->key && strcmp(b[i]->key, key) == 0)
			return b[i]->value;
	return NULL;
}

/* Appends copies of src[0..n) to *dst (packing each through the wire format). */
#define APPEND_COPIES(TYPE, DST, NDST, SRC, NSRC)                                              \
	do {                                                                                           \
		TYPE **arr_ = realloc(DST, (NDST + NSRC + 1) * sizeof *arr_);                           \
		if (!arr_)                                                                             \
			return tern_errorf(TERN_EOS, "out of memory");                                 \
		DST = arr_;                                                                            \
		for (size_t i_ = 0; i_ < NSRC; i_++) {                                                 \
			TYPE *c_ = tern_pb_copy(SRC[i_]);                                              \
			if (!c_)                                                                       \
				return tern_errorf(TERN_EOS, "out of memory");                         \
			DST[NDST++] = c_;                                                              \
		}                                                                                      \
	} while (0)

/* The combined graph, in the proto of a copy of the model: the algorithm's nodes, inputs and
 * value_info appended; its outputs instead of the inference graph's; bound initializers turned into
 * inputs. */
static tern_status combine(Onnx__ModelProto *mp)
{
	Onnx__GraphProto *g = mp->graph;
	const Onnx__TrainingInfoProto *ti = mp->training_info[0];
	const Onnx__GraphProto *alg = ti->algorithm;
	APPEND_COPIES(Onnx__NodeProto, g->node, g->n_node, alg->node, alg->n_node);
	APPEND_COPIES(Onnx__ValueInfoProto, g->input, g->n_input, alg->input, alg->n_input);
	APPEND_COPIES(Onnx__ValueInfoProto, g->value_info, g->n_value_info, alg->value_info,
	              alg->n_value_info);
	APPEND_COPIES(Onnx__TensorProto, g->initializer, g->n_initializer, alg->initializer,
	              alg->n_initializer);
	for (size_t i = 0; i < g->n_output; i++)
		onnx__value_info_proto__free_unpacked(g->output[i], NULL);
	g->n_output = 0;
	APPEND_COPIES(Onnx__ValueInfoProto, g->output, g->n_output, alg->output, alg->n_output);
	/* bound initializers become inputs of their own type */
	size_t k = 0;
	for (size_t i = 0; i < g->n_initializer; i++) {
		Onnx__TensorProto *t = g->initializer[i];
		bool bound = false;
		for (size_t b = 0; b < ti->n_update_binding && !bound; b++)
			bound = t->name && strcmp(ti->update_binding[b]->key, t->name) == 0;
		if (!bound) {
			g->initializer[k++] = t;
			continue;
		}
		/* an IR-3 file may list the initializer among the inputs already */
		bool listed = false;
		for (size_t j = 0; j < g->n_input && !listed; j++)
			listed = g->input[j]->name && strcmp(g->input[j]->name, t->name) == 0;
		if (!listed) {
			tern_type ty;
			tern_type_unknown(&ty);
			ty.dtype = t->data_type;
			ty.rank = (int)t->n_dims;
			for (size_t d = 0; d < t->n_dims; d++)
				ty.dims[d] = t->dims[d];
			Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
			Onnx__ValueInfoProto **arr = realloc(g->input, (g->n_input + 1) * sizeof *arr);
			if (arr)
				g->input = arr;
			if (!vi || !arr)
				return tern_errorf(TERN_EOS, "out of memory");
			onnx__value_info_proto__init(vi);
			vi->name = tern_strdup(t->name);
			vi->type = tern_type_to_proto(&ty);
			g->input[g->n_input++] = vi;
			if (!vi->name || !vi->type)
				return tern_errorf(TERN_EOS, "out of memory");
		}
		onnx__tensor_proto__free_unpacked(t, &tern_pb_allocator);
	}
	g->n_initializer = k;
	/* the step model has no training information of its own */
	for (size_t i = 0; i < mp->n_training_info; i++)
		onnx__training_info_proto__free_unpacked(mp->training_info[i], &tern_pb_allocator);
	mp->n_training_info = 0;
	return TERN_OK;
}

tern_status tern_model_training_step(tern_model *m, tern_model **out)
{
	*out = NULL;
	if (!m->proto->n_training_info || !m->proto->training_info[0]->algorithm)
		return tern_errorf(TERN_EDATA, "%s: the model has no training algorithm; make one with tern-autodiff",
		                   m->source);
	/* The bound initializers become inputs of the step: their bytes (a big model's most) are left out
	 * of the copy, stashed while it is packed. */
	Onnx__GraphProto *mg = m->proto->graph;
	size_t n_bind;
	bindings(m, &n_bind);
	struct stash {
		Onnx__TensorProto *tp;
		Onnx__TensorProto kept;
	} *stash = calloc(mg->n_initializer + 1, sizeof *stash);
	if (!stash)
		return tern_errorf(TERN_EOS, "out of memory");
	size_t n_stash = 0;
	for (size_t i = 0; i < mg->n_initializer; i++) {
		Onnx__TensorProto *tp = mg->initializer[i];
		if (!tp->name || !bound_value(m, tp->name))
			continue;
		stash[n_stash].tp = tp;
		stash[n_stash++].kept = *tp;
		tp->has_raw_data = 0;
		tp->raw_data.data = NULL;
		tp->raw_data.len = 0;
		tp->n_float_data = tp->n_int32_data = tp->n_int64_data = tp->n_double_data = tp->n_uint64_data = 0;
		tp->n_string_data = 0;
		tp->has_data_location = 0;
		tp->n_external_data = 0;
	}
	void *bytes = NULL;
	size_t size = 0;
	tern_status st = tern_model_save_bytes(m, &bytes, &size);
	for (size_t i = 0; i < n_stash; i++)
		*stash[i].tp = stash[i].kept;
	free(stash);
	Onnx__ModelProto *mp = st ? NULL : onnx__model_proto__unpack(NULL, size, bytes);
	free(bytes);
	bytes = NULL;
	if (!st && !mp)
		st = tern_errorf(TERN_EOS, "out of memory");
	if (!st)
		st = combine(mp);
	if (!st) {
		size = onnx__model_proto__get_packed_size(mp);
		bytes = malloc(size ? size : 1);
		if (!bytes)
			st = tern_errorf(TERN_EOS, "out of memory");
		else
			onnx__model_proto__pack(mp, bytes);
	}
	if (mp)
		onnx__model_proto__free_unpacked(mp, &tern_pb_allocator);
	if (!st)
		st = tern_model_load_bytes(bytes, size, m->source, m->base_dir, out);
	free(bytes);
	/* the step follows the training schedule (tern-schedule's, of this very graph), not the inference
	 * graph's */
	if (!st) {
		const char *train_sched = tern_model_meta(*out, TERN_TRAINING_SCHEDULE_KEY);
		char *copy = train_sched ? tern_strdup(train_sched) : NULL;
		if (train_sched && !copy)
			st = tern_errorf(TERN_EOS, "out of memory");
		if (!st)
			st = tern_model_set_meta(*out, TERN_SCHEDULE_KEY, copy);
		if (!st)
			st = tern_model_set_meta(*out, TERN_TRAINING_SCHEDULE_KEY, NULL);
		free(copy);
		if (st) {
			tern_model_free(*out);
			*out = NULL;
		}
	}
	/* the inference graph's own nodes compute nothing the algorithm's outputs need */
	if (!st) {
		static const char *const dce[] = {"dce"};
		tern_optimize_options oo = {.passes = dce, .n_passes = 1};
		st = tern_optimize(*out, &oo, NULL, NULL);
		if (st) {
			tern_model_free(*out);
			*out = NULL;
		}
	}
	if (!st && (st = tern_model_validate(*out))) {
		tern_model_free(*out);
		*out = NULL;
	}
	return st ? tern_error_prefix(st, "training step") : TERN_OK;
}

/* ---------------------------------------------------------------- optimising the step */

static const Onnx__TensorProto *find_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; name && i < g->n_initializer; i++)
		if (g->initializer[i]->name && strcmp(g->initializer[i]->name, name) == 0)
			return g->initializer[i];
	return NULL;
}

static bool listed(Onnx__ValueInfoProto *const *v, size_t n, const char *name)
{
	for (size_t i = 0; name && i < n; i++)
		if (v[i]->name && strcmp(v[i]->name, name) == 0)
			return true;
	return false;
}

/* Whether two initializers hold the same tensor. */
static tern_status same_tensor(const tern_model *m, const Onnx__TensorProto *a, const Onnx__TensorProto *b, bool *same)
{
	tern_tensor x = {0}, y = {0};
	tern_status st = tern_tensor_from_proto(a, m->base_dir, a->name, &x);
	if (!st)
		st = tern_tensor_from_proto(b, m->base_dir, b->name, &y);
	*same = !st && x.dtype == y.dtype && x.rank == y.rank && x.nbytes == y.nbytes &&
	        !memcmp(x.dims, y.dims, (size_t)x.rank * sizeof *x.dims) && (!x.nbytes || !memcmp(x.data, y.data, x.nbytes));
	tern_tensor_free(&x);
	tern_tensor_free(&y);
	return st;
}

tern_status tern_model_set_training_step(tern_model *m, tern_model *step)
{
	tern_status st = tern_model_sync(step);
	Onnx__GraphProto *sg = st ? NULL : step->proto->graph, *ng = NULL;
	if (sg && !(ng = tern_pb_copy(sg)))
		st = tern_errorf(TERN_EOS, "out of memory");
	Onnx__TrainingInfoProto *ti = st ? NULL : m->proto->training_info[0];
	const Onnx__GraphProto *mg = m->proto->graph;
	/* its inputs: the algorithm's own (the target), not the inference graph's nor the state */
	if (ti) {
		size_t k = 0;
		for (size_t i = 0; i < ng->n_input; i++) {
			if (listed(ti->algorithm->input, ti->algorithm->n_input, ng->input[i]->name))
				ng->input[k++] = ng->input[i];
			else
				onnx__value_info_proto__free_unpacked(ng->input[i], &tern_pb_allocator);
		}
		ng->n_input = k;
		/* its initializers: the constants the passes made; the inference graph's stay where they are */
		k = 0;
		for (size_t i = 0; i < ng->n_initializer; i++) {
			Onnx__TensorProto *t = ng->initializer[i];
			const Onnx__TensorProto *orig = find_initializer(mg, t->name);
			bool same = false;
			if (orig && !st && !(st = same_tensor(m, orig, t, &same)) && !same)
				st = tern_errorf(TERN_EINTERNAL, "%s: rewriting the training step changed initializer '%s'", m->source,
				                 t->name);
			if (!orig)
				ng->initializer[k++] = t;
			else
				onnx__tensor_proto__free_unpacked(t, &tern_pb_allocator);
		}
		ng->n_initializer = k;
		free(ng->name);
		ng->name = tern_strdup(ti->algorithm->name ? ti->algorithm->name : "training_step");
	}
	/* the operators the step uses (tern's fused ones) */
	for (size_t i = 0; !st && i < step->proto->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *op = step->proto->opset_import[i];
		st = tern_model_import_opset(m, op->domain ? op->domain : "", op->version);
	}
	if (!st) {
		onnx__graph_proto__free_unpacked(ti->algorithm, &tern_pb_allocator);
		ti->algorithm = ng;
		ng = NULL;
	}
	if (ng)
		onnx__graph_proto__free_unpacked(ng, &tern_pb_allocator);
	return st;
}

tern_status tern_model_optimize_training(tern_model *m, const tern_optimize_options *o, tern_pass_stat **stats,
                                         int *n_stats)
{
	if (stats)
		*stats = NULL;
	if (n_stats)
		*n_stats = 0;
	tern_model *step = NULL;
	tern_status st = tern_model_training_step(m, &step);
	if (!st)
		st = tern_optimize(step, o, stats, n_stats);
	if (!st)
		st = tern_model_set_training_step(m, step);
	tern_model_free(step);
	if (st && stats) {
		free(*stats);
		*stats = NULL;
		if (n_stats)
			*n_stats = 0;
	}
	return st ? tern_error_prefix(st, "optimising the training step") : TERN_OK;
}

/* ---------------------------------------------------------------- scheduling the step */

/* A schedule names nodes: the algorithm's unnamed nodes and duplicates (of each other or of the
 * inference graph's) get fresh names in the proto, so that every step built from the file has them. */
static tern_status name_algorithm_nodes(tern_model *m, int *renamed)
{
	Onnx__GraphProto *alg = m->proto->training_info[0]->algorithm, *mg = m->proto->graph;
	*renamed = 0;
	for (size_t i = 0; i < alg->n_node; i++) {
		Onnx__NodeProto *n = alg->node[i];
		const char *name = n->name ? n->name : "";
		bool clash = !*name || strcmp(name, "-") == 0 || strpbrk(name, "\t\n\r,");
		for (size_t j = 0; j < i && !clash; j++)
			clash = alg->node[j]->name && strcmp(alg->node[j]->name, name) == 0;
		for (size_t j = 0; j < mg->n_node && !clash; j++)
			clash = mg->node[j]->name && strcmp(mg->node[j]->name, name) == 0;
		if (!clash)
			continue;
		char *fresh = malloc(strlen(n->op_type ? n->op_type : "node") + 40);
		if (!fresh)
			return tern_errorf(TERN_EOS, "out of memory");
		for (size_t k = i;; k++) {
			sprintf(fresh, "train/%s_%zu", n->op_type ? n->op_type : "node", k);
			bool used = false;
			for (size_t j = 0; j < alg->n_node && !used; j++)
				used = j != i && alg->node[j]->name && strcmp(alg->node[j]->name, fresh) == 0;
			for (size_t j = 0; j < mg->n_node && !used; j++)
				used = mg->node[j]->name && strcmp(mg->node[j]->name, fresh) == 0;
			if (!used)
				break;
		}
		if (n->name && n->name != protobuf_c_empty_string)
			free(n->name);
		n->name = fresh;
		(*renamed)++;
	}
	return TERN_OK;
}

tern_status tern_model_schedule_training(tern_model *m, int max_streams, tern_schedule_stats *stats, int *n_nodes)
{
	if (!m->proto->n_training_info || !m->proto->training_info[0]->algorithm)
		return tern_errorf(TERN_EDATA, "%s: the model has no training algorithm", m->source);
	int renamed;
	tern_status st = name_algorithm_nodes(m, &renamed);
	tern_model *step = NULL;
	if (!st)
		st = tern_model_training_step(m, &step);
	tern_schedule *s = NULL;
	char *text = NULL;
	if (!st)
		st = tern_schedule_compute(step->graph, max_streams, &s, stats);
	if (!st)
		st = tern_schedule_format(s, &text);
	if (!st)
		st = tern_model_set_meta(m, TERN_TRAINING_SCHEDULE_KEY, text);
	if (!st && n_nodes)
		*n_nodes = s->n_nodes;
	free(text);
	tern_schedule_free(s);
	tern_model_free(step);
	return st ? tern_error_prefix(st, "scheduling the training step") : TERN_OK;
}

void tern_trainer_free(tern_trainer *t)
{
	if (!t)
		return;
	tern_plan_free(t->plan);
	tern_model_free(t->step_model);
	for (int i = 0; i < t->n_state; i++) {
		tern_tensor_free(&t->state[i]);
		free(t->state_names[i]);
	}
	free(t->state);
	free(t->state_names);
	free(t->state_out);
	free(t->feed);
	free(t->feed_from);
	free(t->data_input);
	free(t->inplace);
	free(t);
}

tern_status tern_trainer_create(tern_model *m, const tern_plan_options *opts, tern_trainer **out)
{
	*out = NULL;
	size_t n_bind;
	bindings(m, &n_bind);
	if (!m->proto->n_training_info || !m->proto->training_info[0]->algorithm || !n_bind)
		return tern_errorf(TERN_EDATA, "%s: the model has no training algorithm; make one with tern-autodiff",
		                   m->source);
	tern_trainer *t = calloc(1, sizeof *t);
	if (!t)
		return tern_errorf(TERN_EOS, "out of memory");
	t->src = m;
	t->opts = opts ? *opts : (tern_plan_options){.n_threads = 1};
	tern_status st = tern_model_training_step(m, &t->step_model);
	if (st) {
		tern_trainer_free(t);
		return st;
	}
	/* the state: every bound initializer of the model, in binding order */
	Onnx__StringStringEntryProto *const *b = bindings(m, &n_bind);
	t->state = calloc(n_bind + 1, sizeof *t->state);
	t->state_names = calloc(n_bind + 1, sizeof *t->state_names);
	t->state_out = calloc(n_bind + 1, sizeof *t->state_out);
	if (!t->state || !t->state_names || !t->state_out)
		st = tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; !st && i < n_bind; i++) {
		tern_value *v = tern_graph_find(m->graph, b[i]->key);
		if (!v || !(v->flags & TERN_VALUE_INITIALIZER)) {
			st = tern_errorf(TERN_EDATA, "%s: update_binding names '%s', which is not an initializer", m->source,
			                 b[i]->key);
			break;
		}
		st = adopt(m, v, &t->state[i]);
		if (!st && !(t->state_names[i] = tern_strdup(b[i]->key)))
			st = tern_errorf(TERN_EOS, "out of memory");
		t->n_state++;
	}
	/* the step model's inputs: data (not bound) in their order, and state, by name */
	int n_in = st ? 0 : tern_model_num_inputs(t->step_model);
	t->feed = calloc((size_t)n_in + 1, sizeof *t->feed);
	t->feed_from = calloc((size_t)n_in + 1, sizeof *t->feed_from);
	t->data_input = calloc((size_t)n_in + 1, sizeof *t->data_input);
	if (!st && (!t->feed || !t->feed_from || !t->data_input))
		st = tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; !st && i < n_in; i++) {
		const char *name = tern_model_input_name(t->step_model, i);
		int s = -1;
		for (int k = 0; k < t->n_state && s < 0; k++)
			if (strcmp(t->state_names[k], name) == 0)
				s = k;
		if (s >= 0) {
			t->feed_from[i] = -1 - s;
		} else {
			t->feed_from[i] = t->n_data;
			t->data_input[t->n_data++] = i;
		}
	}
	t->n_feed = n_in;
	/* each bound tensor's new value written into its own buffer, where the planner can */
	t->inplace = st ? NULL : calloc(2 * (size_t)t->n_state + 1, sizeof *t->inplace);
	if (!st && !t->inplace)
		st = tern_errorf(TERN_EOS, "out of memory");
	const tern_graph *sg = st ? NULL : t->step_model->graph;
	for (int i = 0; !st && i < n_in; i++) {
		if (t->feed_from[i] >= 0)
			continue;
		const char *want = bound_value(m, t->state_names[-1 - t->feed_from[i]]);
		for (size_t o = 0; want && o < sg->n_outputs; o++)
			if (strcmp(sg->outputs[o]->name, want) == 0) {
				t->inplace[t->n_inplace] = i;
				t->inplace[t->n_state + t->n_inplace] = (int)o;
				t->n_inplace++;
				break;
			}
	}
	if (!st) {
		memmove(t->inplace + t->n_inplace, t->inplace + t->n_state, (size_t)t->n_inplace * sizeof *t->inplace);
		t->opts.inplace_input = t->inplace;
		t->opts.inplace_output = t->inplace + t->n_inplace;
		t->opts.n_inplace = t->n_inplace;
	}
	if (st) {
		tern_trainer_free(t);
		return st;
	}
	*out = t;
	return TERN_OK;
}

int tern_trainer_num_inputs(const tern_trainer *t)
{
	return t->n_data;
}

const char *tern_trainer_input_name(const tern_trainer *t, int i)
{
	return tern_model_input_name(t->step_model, t->data_input[i]);
}

tern_status tern_trainer_input_type(tern_trainer *t, int i, int *dtype, int *rank, int64_t *dims)
{
	return tern_model_input_type(t->step_model, t->data_input[i], dtype, rank, dims, NULL);
}

/* Matches plan outputs to the bound names, once the plan exists. */
static tern_status map_outputs(tern_trainer *t)
{
	int n_out = tern_plan_num_outputs(t->plan);
	t->loss_out = 0;
	for (int s = 0; s < t->n_state; s++) {
		const char *want = bound_value(t->src, t->state_names[s]);
		t->state_out[s] = -1;
		for (int o = 0; o < n_out && t->state_out[s] < 0; o++)
			if (strcmp(tern_plan_output_name(t->plan, o), want) == 0)
				t->state_out[s] = o;
		if (t->state_out[s] < 0)
			return tern_errorf(TERN_EDATA, "%s: update_binding's value '%s' is not an output of the algorithm",
			                   t->src->source, want);
	}
	return TERN_OK;
}

tern_status tern_trainer_step(tern_trainer *t, const tern_tensor *data, double *loss)
{
	for (int i = 0; i < t->n_feed; i++)
		t->feed[i] = t->feed_from[i] >= 0 ? data[t->feed_from[i]] : t->state[-1 - t->feed_from[i]];
	int n = t->n_feed;
	tern_status st;
	if (!t->plan) {
		if ((st = tern_plan_create(t->step_model, &t->opts, t->feed, n, &t->plan)) || (st = map_outputs(t)))
			return st;
	}
	if ((st = tern_plan_run(t->plan, t->feed, n)))
		return st;
	const tern_tensor *l = tern_plan_output(t->plan, t->loss_out);
	if (loss)
		*loss = l && l->data && tern_tensor_numel(l) >= 1 ? tern_tensor_get_f64(l, 0) : 0;
	for (int s = 0; s < t->n_state; s++) {
		const tern_tensor *nv = tern_plan_output(t->plan, t->state_out[s]);
		if (nv->nbytes != t->state[s].nbytes || nv->dtype != t->state[s].dtype)
			return tern_errorf(TERN_EDATA, "%s: the new value of '%s' is %zu bytes of %s, the old %zu bytes of %s",
			                   t->src->source, t->state_names[s], nv->nbytes, tern_dtype_name(nv->dtype),
			                   t->state[s].nbytes, tern_dtype_name(t->state[s].dtype));
		if (nv->data != t->state[s].data)
			memcpy(t->state[s].data, nv->data, nv->nbytes);
	}
	t->steps_done++;
	return TERN_OK;
}

int tern_trainer_num_inplace(const tern_trainer *t, int *n_state)
{
	if (n_state)
		*n_state = t->n_state;
	return t->plan ? tern_plan_num_inplace(t->plan) : 0;
}

size_t tern_trainer_arena_bytes(const tern_trainer *t)
{
	return t->plan ? tern_plan_arena_bytes(t->plan) : 0;
}

const tern_tensor *tern_trainer_state(const tern_trainer *t, const char *name)
{
	for (int s = 0; s < t->n_state; s++)
		if (strcmp(t->state_names[s], name) == 0)
			return &t->state[s];
	return NULL;
}

/* Typed fields and an external location no longer describe a tensor whose bytes are now raw_data
 * (the location stays, as a mark: the writer puts the tensor in the data file again). */
static void plain_raw(Onnx__TensorProto *tp)
{
	free(tp->float_data), tp->float_data = NULL, tp->n_float_data = 0;
	free(tp->int64_data), tp->int64_data = NULL, tp->n_int64_data = 0;
	free(tp->int32_data), tp->int32_data = NULL, tp->n_int32_data = 0;
	free(tp->double_data), tp->double_data = NULL, tp->n_double_data = 0;
	for (size_t k = 0; k < tp->n_external_data; k++)
		onnx__string_string_entry_proto__free_unpacked(tp->external_data[k], NULL);
	tp->n_external_data = 0;
}

/* A bound tensor's current value lives in its initializer's own bytes: the step updates them in
 * place, and saving the model saves the training with no copy. Bytes the model does not own (mapped
 * external data, which is read-only) or that are not raw (typed fields) are copied once into raw bytes
 * it owns; the mapping's pages are given back. */
static tern_status adopt(tern_model *m, tern_value *v, tern_tensor *out)
{
	Onnx__TensorProto *tp = v->initializer;
	bool typed = tp->n_float_data || tp->n_int64_data || tp->n_int32_data || tp->n_double_data;
	if (!typed && !tern_tensor_proto_mapped(tp) && tern_tensor_view_proto(tp, out)) {
		out->owns_data = 0;
		return TERN_OK;
	}
	tern_tensor view;
	tern_status st = TERN_OK;
	if (!typed && tern_tensor_view_proto(tp, &view)) {
		/* mapped: copied a piece at a time, each piece's pages given back, so that the copy and the
		 * mapping are never both resident */
		if ((st = tern_tensor_alloc(out, view.dtype, view.rank, view.dims)))
			return st;
		const size_t piece = (size_t)16 << 20;
		for (size_t at = 0; at < view.nbytes; at += piece) {
			size_t n = view.nbytes - at < piece ? view.nbytes - at : piece;
			memcpy((char *)out->data + at, (const char *)view.data + at, n);
			tern_mapped_release((const char *)view.data + at, n);
		}
	} else if ((st = tern_tensor_from_proto(tp, m->base_dir, v->name, out))) {
		return st;
	}
	free(out->name);
	out->name = NULL;
	if (tp->has_raw_data && tp->raw_data.data) {
		tern_mapped_release(tp->raw_data.data, tp->raw_data.len);
		tern_pb_allocator.free(NULL, tp->raw_data.data);
	}
	tp->raw_data.data = out->data;
	tp->raw_data.len = out->nbytes;
	tp->has_raw_data = 1;
	plain_raw(tp);
	out->owns_data = 0;
	return TERN_OK;
}

tern_status tern_initializer_replace(tern_value *v, const tern_tensor *value)
{
	Onnx__TensorProto *tp = v ? v->initializer : NULL;
	if (!tp)
		return tern_errorf(TERN_EINTERNAL, "'%s' is not an initializer", v ? v->name : "?");
	if (tp->has_raw_data && tp->raw_data.data == value->data)
		return TERN_OK; /* the initializer's bytes are the value */
	/* replace the stored bytes (mapped external data is read-only: it gets bytes of its own) */
	Onnx__TensorProto *fresh = malloc(sizeof *fresh);
	if (!fresh)
		return tern_errorf(TERN_EOS, "out of memory");
	onnx__tensor_proto__init(fresh);
	tern_tensor named = *value;
	named.name = NULL;
	tern_status st = tern_tensor_to_proto(&named, fresh);
	if (st) {
		onnx__tensor_proto__free_unpacked(fresh, NULL);
		return st;
	}
	if (tp->has_raw_data && tp->raw_data.data)
		tern_pb_allocator.free(NULL, tp->raw_data.data);
	tp->raw_data = fresh->raw_data;
	tp->has_raw_data = 1;
	fresh->raw_data.data = NULL;
	fresh->has_raw_data = 0;
	onnx__tensor_proto__free_unpacked(fresh, NULL);
	plain_raw(tp);
	return TERN_OK;
}

tern_status tern_trainer_sync(tern_trainer *t)
{
	for (int s = 0; s < t->n_state; s++) {
		tern_value *v = tern_graph_find(t->src->graph, t->state_names[s]);
		if (!v || !v->initializer)
			return tern_errorf(TERN_EINTERNAL, "'%s' is no longer an initializer", t->state_names[s]);
		tern_status st = tern_initializer_replace(v, &t->state[s]);
		if (st)
			return st;
	}
	return TERN_OK;
}

tern_status tern_trainer_set_state(tern_trainer *t, const char *name, const tern_tensor *value)
{
	for (int s = 0; s < t->n_state; s++) {
		tern_tensor *d = &t->state[s];
		if (strcmp(t->state_names[s], name) != 0)
			continue;
		char want[160], got[160];
		if (value->dtype != d->dtype || value->rank != d->rank ||
		    memcmp(value->dims, d->dims, (size_t)d->rank * sizeof *d->dims) != 0 || value->nbytes != d->nbytes)
			return tern_errorf(TERN_EDATA, "'%s' is %s; the value given is %s", name,
			                   tern_shape_str(d->dtype, d->rank, d->dims, want, sizeof want),
			                   tern_shape_str(value->dtype, value->rank, value->dims, got, sizeof got));
		if (d->nbytes)
			memcpy(d->data, value->data, d->nbytes);
		return TERN_OK;
	}
	return tern_errorf(TERN_EUSAGE, "%s: '%s' is not a parameter or state tensor of the training step", t->src->source,
	                   name);
}

int tern_trainer_num_state(const tern_trainer *t)
{
	return t->n_state;
}

const char *tern_trainer_state_name(const tern_trainer *t, int i)
{
	return i >= 0 && i < t->n_state ? t->state_names[i] : NULL;
}

int64_t tern_trainer_stored_step(const tern_trainer *t)
{
	const tern_tensor *s = tern_trainer_state(t, "tern.step");
	return s && s->data ? tern_tensor_get_i64(s, 0) : 0;
}

double tern_trainer_lr(const tern_trainer *t)
{
	/* tern-autodiff writes the step's learning rate as the algorithm's second output */
	if (!t->plan || tern_plan_num_outputs(t->plan) < 2)
		return NAN;
	for (int s = 0; s < t->n_state; s++)
		if (t->state_out[s] == 1)
			return NAN;
	const tern_tensor *lr = tern_plan_output(t->plan, 1);
	return lr && lr->data && tern_tensor_numel(lr) == 1 ? tern_tensor_get_f64(lr, 0) : NAN;
}

int tern_model_has_training(const tern_model *m)
{
	return m->proto->n_training_info > 0;
}

int tern_model_drop_training(tern_model *m)
{
	Onnx__ModelProto *mp = m->proto;
	if (!mp->n_training_info)
		return 0;
	/* the bound initializers that no inference node reads */
	int dropped = 0;
	for (size_t t = 0; t < mp->n_training_info; t++) {
		const Onnx__TrainingInfoProto *ti = mp->training_info[t];
		for (size_t b = 0; b < ti->n_update_binding; b++) {
			tern_value *v = tern_graph_find(m->graph, ti->update_binding[b]->key);
			if (!v || !(v->flags & TERN_VALUE_INITIALIZER) || v->n_consumers || (v->flags & TERN_VALUE_OUTPUT))
				continue;
			tern_graph_drop_initializer(m->graph, v);
			dropped++;
		}
	}
	for (size_t t = 0; t < mp->n_training_info; t++)
		onnx__training_info_proto__free_unpacked(mp->training_info[t], &tern_pb_allocator);
	mp->n_training_info = 0;
	return dropped;
}
