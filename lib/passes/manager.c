/* manager.c — the pass manager: the pipeline of passes by level, repeated until the graph stops
 * changing, with per-pass statistics; then the graph is put back in a stable topological order and
 * stripped of what the passes left unused. */
#include "passes/passes.h"

#include <stdlib.h>

static const tern_pass *const pipeline[] = {
        &tern_pass_fold_constants,
        &tern_pass_noop,
        &tern_pass_reshapes,
        &tern_pass_fold_batchnorm,
        &tern_pass_fold_pad,
        &tern_pass_slices_split,
        &tern_pass_layernorm,
        &tern_pass_matmul_add_gemm,
        &tern_pass_cse,
        &tern_pass_dce,
        &tern_pass_gelu,
        &tern_pass_fuse_conv,
        &tern_pass_fuse_matmul,
        &tern_pass_fuse_attention,
        &tern_pass_fold_embedding,
        &tern_pass_fuse_layernorm,
        &tern_pass_fuse_elementwise,
        &tern_pass_fold_scales,
        &tern_pass_blocked_conv,
};

/* Rounds of the whole pipeline before giving up on a fixed point (each round that changes something
 * removes or fuses nodes, so this is never reached on a sane graph). */
#define MAX_ROUNDS 16

int tern_pass_count(void)
{
	return (int)TERN_ARRAY_LEN(pipeline);
}

static const tern_pass *pass_at(int i)
{
	return i >= 0 && i < tern_pass_count() ? pipeline[i] : NULL;
}

const char *tern_pass_name(int i)
{
	return pass_at(i) ? pass_at(i)->name : NULL;
}
const char *tern_pass_description(int i)
{
	return pass_at(i) ? pass_at(i)->description : NULL;
}
int tern_pass_level(int i)
{
	return pass_at(i) ? pass_at(i)->level : -1;
}

static const tern_pass *find_pass(const char *name)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(pipeline); i++)
		if (strcmp(pipeline[i]->name, name) == 0)
			return pipeline[i];
	return NULL;
}

/* ---------------------------------------------------------------- static dimensions */

static int bind_shape(Onnx__ValueInfoProto *vi, const tern_optimize_options *o, bool *used)
{
	if (!vi || !vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !vi->type->tensor_type ||
	    !vi->type->tensor_type->shape)
		return 0;
	Onnx__TensorShapeProto *sh = vi->type->tensor_type->shape;
	int bound = 0;
	for (size_t d = 0; d < sh->n_dim; d++) {
		Onnx__TensorShapeProto__Dimension *dim = sh->dim[d];
		if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM || !dim->dim_param)
			continue;
		for (int k = 0; k < o->n_dims; k++)
			if (strcmp(dim->dim_param, o->dim_names[k]) == 0) {
				if (dim->dim_param != protobuf_c_empty_string)
					free(dim->dim_param);
				dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
				dim->dim_value = o->dim_values[k];
				used[k] = true;
				bound++;
				break;
			}
	}
	return bound;
}

/* Writes the --dim values into the declared shapes of inputs, outputs and value_info, and refreshes
 * the inputs' types: the optimised graph is specialised to them. */
static tern_status bind_dims(tern_model *m, const tern_optimize_options *o)
{
	if (!o->n_dims)
		return TERN_OK;
	tern_graph *g = m->graph;
	Onnx__GraphProto *gp = g->proto;
	bool *used = calloc((size_t)o->n_dims, sizeof *used);
	if (!used)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < gp->n_input; i++) {
		if (!bind_shape(gp->input[i], o, used))
			continue;
		tern_value *v = tern_graph_find(g, gp->input[i]->name);
		if (v && !(v->flags & TERN_VALUE_INITIALIZER))
			tern_type_from_proto(gp->input[i]->type, &v->type);
	}
	for (size_t i = 0; i < gp->n_output; i++)
		bind_shape(gp->output[i], o, used);
	for (size_t i = 0; i < gp->n_value_info; i++)
		bind_shape(gp->value_info[i], o, used);
	tern_status st = TERN_OK;
	for (int k = 0; k < o->n_dims && !st; k++)
		if (!used[k])
			st = tern_errorf(TERN_EUSAGE,
			                 "%s: --dim %s: no graph input, output or value has a dimension named '%s'",
			                 m->source, o->dim_names[k], o->dim_names[k]);
	free(used);
	return st;
}

tern_status tern_model_bind_dims(tern_model *m, const char *const *names, const int64_t *values, int n)
{
	const tern_optimize_options o = {.dim_names = names, .dim_values = values, .n_dims = n};
	return bind_dims(m, &o);
}

/* ---------------------------------------------------------------- finishing */

/* Nodes in tern_graph_toposort's order, which keeps the current order wherever it already is one, so
 * a second optimisation of the result leaves the order alone. Removed nodes follow, for
 * tern_model_sync to free. */
tern_status tern_graph_stable_order(tern_graph *g)
{
	tern_node **order;
	size_t live;
	tern_status st = tern_graph_toposort(g, &order, &live);
	if (st)
		return st;
	tern_node **all = realloc(order, (g->n_nodes ? g->n_nodes : 1) * sizeof *all);
	if (!all) {
		free(order);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	size_t k = live;
	for (size_t i = 0; i < g->n_nodes; i++)
		if (g->nodes[i]->removed)
			all[k++] = g->nodes[i];
	for (size_t i = 0; i < g->n_nodes; i++) {
		g->nodes[i] = all[i];
		g->nodes[i]->index = (int)i;
	}
	free(all);
	return TERN_OK;
}

static bool uses_tern_domain(const tern_graph *g)
{
	for (size_t i = 0; i < g->n_nodes; i++)
		if (!g->nodes[i]->removed && strcmp(g->nodes[i]->domain, TERN_DOMAIN) == 0)
			return true;
	return false;
}

static void drop_tern_import(tern_model *m)
{
	Onnx__ModelProto *mp = m->proto;
	for (size_t i = 0; i < mp->n_opset_import; i++)
		if (mp->opset_import[i]->domain && strcmp(mp->opset_import[i]->domain, TERN_DOMAIN) == 0) {
			onnx__operator_set_id_proto__free_unpacked(mp->opset_import[i], NULL);
			memmove(&mp->opset_import[i], &mp->opset_import[i + 1],
			        (mp->n_opset_import - i - 1) * sizeof *mp->opset_import);
			mp->n_opset_import--;
			return;
		}
}

/* value_info entries describe intermediate values: drop those of values that no node writes any more
 * (removed or turned into initializers). */
static void prune_value_info(tern_graph *g)
{
	Onnx__GraphProto *gp = g->proto;
	size_t k = 0;
	for (size_t i = 0; i < gp->n_value_info; i++) {
		Onnx__ValueInfoProto *vi = gp->value_info[i];
		tern_value *v = vi->name ? tern_graph_find(g, vi->name) : NULL;
		bool live = v && v->producer && !v->producer->removed;
		if (live)
			gp->value_info[k++] = vi;
		else
			onnx__value_info_proto__free_unpacked(vi, NULL);
	}
	gp->n_value_info = k;
}

/* ---------------------------------------------------------------- running */

static tern_status run_pass(tern_pass_ctx *c, const tern_pass *p, tern_pass_stat *stat, bool *changed)
{
	c->removed = c->added = c->fused = c->rewritten = 0;
	double t0 = tern_now_us();
	tern_status st = tern_pass_analyze(c);
	if (!st)
		st = p->run(c);
	stat->ms += (tern_now_us() - t0) / 1000.0;
	stat->runs++;
	stat->removed += c->removed;
	stat->added += c->added;
	stat->fused += c->fused;
	stat->rewritten += c->rewritten;
	*changed |= c->removed || c->added || c->fused || c->rewritten;
	return st;
}

tern_status tern_optimize(tern_model *m, const tern_optimize_options *o, tern_pass_stat **stats_out, int *n_stats)
{
	if (stats_out)
		*stats_out = NULL;
	if (n_stats)
		*n_stats = 0;
	/* A training algorithm reads the inference graph's initializers and inputs by name: rewriting the
	 * inference graph (folding weights into new initializers, dropping the old) would cut it off. */
	if (m->proto->n_training_info && (o->level > 0 || o->n_passes > 0))
		return TERN_OK;
	const tern_pass *chosen[TERN_ARRAY_LEN(pipeline) * 4];
	int n = 0;
	if (o->n_passes > 0) {
		if ((size_t)o->n_passes > TERN_ARRAY_LEN(chosen))
			return tern_errorf(TERN_EUSAGE, "at most %zu passes", TERN_ARRAY_LEN(chosen));
		for (int i = 0; i < o->n_passes; i++) {
			if (!(chosen[n++] = find_pass(o->passes[i])))
				return tern_errorf(TERN_EUSAGE,
				                   "unknown pass '%s' (tern-optimize --list-passes lists them)",
				                   o->passes[i]);
		}
	} else {
		if (o->level < 0 || o->level > 3)
			return tern_errorf(TERN_EUSAGE, "optimisation level %d is not 0 to 3", o->level);
		for (size_t i = 0; i < TERN_ARRAY_LEN(pipeline); i++)
			if (o->level >= pipeline[i]->level)
				chosen[n++] = pipeline[i];
	}
	if (!n)
		return TERN_OK;
	tern_pass_stat *stats = calloc((size_t)n, sizeof *stats);
	if (!stats)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < n; i++)
		stats[i].name = chosen[i]->name;
	bool had_tern = tern_model_opset(m, TERN_DOMAIN) >= 0;
	tern_pass_ctx c = {.model = m, .graph = m->graph};
	c.level = o->n_passes > 0 ? 3 : o->level;
	tern_status st = bind_dims(m, o);
	for (int i = 0; !st && i < n; i++)
		if (chosen[i]->level >= 2)
			st = tern_pass_import_tern(&c);
	bool changed = true;
	for (int round = 0; !st && changed && round < MAX_ROUNDS; round++) {
		changed = false;
		for (int i = 0; !st && i < n; i++)
			st = run_pass(&c, chosen[i], &stats[i], &changed);
	}
	if (!st)
		st = tern_graph_stable_order(m->graph);
	if (!st) {
		prune_value_info(m->graph);
		if (!had_tern && !uses_tern_domain(m->graph))
			drop_tern_import(m);
	}
	tern_pass_ctx_free(&c);
	if (st || !stats_out) {
		free(stats);
		return st;
	}
	*stats_out = stats;
	if (n_stats)
		*n_stats = n;
	return TERN_OK;
}
