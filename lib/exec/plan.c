/* plan.c — ahead-of-time planning: shapes, kernel choice, constant folding, and a liveness-based
 * memory plan that places every static activation in one arena. Running (run.c) then only calls
 * kernels on pre-bound buffers. */
#include "exec.h"

#include <stdlib.h>

/* Operators that read only their input's shape, which planning knows: foldable even when the input's
 * values exist only at run time. This folds the Shape → Gather → Concat → Reshape chains exporters
 * write, so the Reshape they feed is planned statically. */
static bool reads_shape_only(const tern_node *n)
{
	return !*n->domain && (strcmp(n->op_type, "Shape") == 0 || strcmp(n->op_type, "Size") == 0);
}

static bool is_random_op(const tern_node *n)
{
	return strncmp(n->op_type, "Random", 6) == 0 || strcmp(n->op_type, "Bernoulli") == 0 ||
	        strcmp(n->op_type, "Multinomial") == 0;
}

/* The slot that holds the data of slot i (following aliases). */
static int root_slot(const tern_exec *e, int i)
{
	while (e->slots[i].kind == SLOT_ALIAS)
		i = e->slots[i].alias_of;
	return i;
}

static size_t slot_bytes(const tern_tensor *t)
{
	size_t es = t->dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(t->dtype);
	return (size_t)tern_tensor_numel(t) * es;
}

static void free_step(step *s)
{
	if (s->free_params && s->params)
		s->free_params(s->params);
	free(s->in);
	free(s->out);
	free(s->in_slot);
	free(s->out_slot);
	free(s->use_slot);
	free(s->waits);
	free(s->late_key);
	free(s->late_out);
	memset(s, 0, sizeof *s);
}

static void release(tern_exec *e, bool park);

void tern_exec_release(tern_exec *e)
{
	release(e, false);
}

void tern_exec_release_for_replan(tern_exec *e)
{
	release(e, true);
}

static void release(tern_exec *e, bool park)
{
	if (park && e->workers)
		tern_exec_park_streams(e);
	else
		tern_exec_stop_streams(e);
	for (int i = 0; i < e->n_steps; i++)
		free_step(&e->steps[i]);
	free(e->steps);
	e->steps = NULL;
	e->n_steps = 0;
	for (size_t i = 0; i < e->n_slots; i++) {
		slot *s = &e->slots[i];
		if ((s->kind == SLOT_CONST && s->owns) || s->kind == SLOT_DYNAMIC)
			tern_tensor_free(&s->t);
		free(s->spare);
	}
	free(e->slots);
	e->slots = NULL;
	free(e->input_slot);
	free(e->output_slot);
	e->input_slot = e->output_slot = NULL;
	free(e->arena);
	free(e->scratch);
	e->arena = e->scratch = NULL;
	free(e->events);
	e->events = NULL;
	e->n_events = 0;
	free(e->donated);
	e->donated = NULL;
	e->n_donated = 0;
	e->arena_bytes = e->scratch_bytes = 0;
	e->has_late = 0;
}

/* Finds the parent executor's tensor for an outer value. */
static slot *outer_slot(tern_exec *e, tern_value *v, tern_exec **owner)
{
	tern_value *target = v->outer;
	for (tern_exec *p = e->parent; p; p = p->parent) {
		if (target->index < (int)p->n_slots && p->graph->values[target->index] == target) {
			*owner = p;
			return &p->slots[target->index];
		}
		if (target->flags & TERN_VALUE_OUTER)
			target = target->outer;
	}
	return NULL;
}

static tern_tensor *outer_tensor(tern_exec *e, tern_value *v)
{
	tern_exec *owner;
	slot *s = outer_slot(e, v, &owner);
	return s ? &s->t : NULL;
}

/* Whether an outer value is a constant of the plan it comes from (an initializer, a folded value),
 * through any plans between. */
static bool outer_constant(tern_exec *e, tern_value *v)
{
	tern_exec *owner;
	slot *s = outer_slot(e, v, &owner);
	if (!s)
		return false;
	if (s->kind == SLOT_OUTER)
		return outer_constant(owner, owner->graph->values[s - owner->slots]);
	return s->kind == SLOT_CONST;
}

static tern_status bind_inputs(tern_exec *e, tern_tensor *const *inputs, int n_inputs)
{
	tern_graph *g = e->graph;
	int want = 0;
	for (size_t i = 0; i < g->n_inputs; i++)
		if (!(g->inputs[i]->flags & TERN_VALUE_INITIALIZER))
			want++;
	if (n_inputs != want)
		return tern_errorf(TERN_EDATA, "%s: %d inputs given, the graph has %d", g->model->source, n_inputs,
		                   want);
	e->input_slot = calloc((size_t)want + 1, sizeof *e->input_slot);
	if (!e->input_slot)
		return tern_errorf(TERN_EOS, "out of memory");
	int k = 0;
	for (size_t i = 0; i < g->n_inputs; i++) {
		tern_value *v = g->inputs[i];
		if (v->flags & TERN_VALUE_INITIALIZER)
			continue;
		const tern_tensor *in = inputs[k];
		slot *s = &e->slots[v->index];
		if (g->kind == TERN_GRAPH_MAIN && v->type.dtype && in->dtype != v->type.dtype)
			return tern_errorf(TERN_EDATA, "%s: input '%s' is %s, the graph declares %s", g->model->source,
			                   v->name, tern_dtype_name(in->dtype), tern_dtype_name(v->type.dtype));
		if (g->kind == TERN_GRAPH_MAIN && v->type.rank >= 0) {
			bool ok = v->type.rank == in->rank;
			for (int d = 0; ok && d < in->rank; d++)
				ok = v->type.dims[d] < 0 || v->type.dims[d] == in->dims[d];
			if (!ok) {
				char got[160], decl[160];
				tern_shape_str(in->dtype, in->rank, in->dims, got, sizeof got);
				tern_shape_str(v->type.dtype, v->type.rank, v->type.dims, decl, sizeof decl);
				return tern_errorf(TERN_EDATA,
				                   "%s: input '%s' has shape %s, the graph declares %s (-1: any)",
				                   g->model->source, v->name, got, decl);
			}
		}
		tern_set_shape(&s->t, in->dtype, in->rank, in->dims);
		s->kind = SLOT_INPUT;
		s->len_free = in->rank > 0 && tern_value_len_free(g, v);
		s->known = 1;
		e->input_slot[k++] = v->index;
	}
	e->n_inputs = k;
	return TERN_OK;
}

static tern_status init_slots(tern_exec *e)
{
	tern_graph *g = e->graph;
	e->n_slots = g->n_values;
	e->slots = calloc(g->n_values ? g->n_values : 1, sizeof *e->slots);
	if (!e->slots)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		slot *s = &e->slots[i];
		s->first_def = -1;
		if (v->flags & TERN_VALUE_INITIALIZER) {
			s->kind = SLOT_CONST;
			s->known = 1;
			if (tern_tensor_view_proto(v->initializer, &s->t))
				continue;
			tern_status st = tern_tensor_from_proto(v->initializer, g->model->base_dir, v->name, &s->t);
			if (st)
				return tern_error_prefix(st, g->model->source);
			free(s->t.name);
			s->t.name = NULL;
			s->owns = 1;
		} else if (v->flags & TERN_VALUE_OUTER) {
			s->outer = outer_tensor(e, v);
			if (!s->outer)
				return tern_errorf(TERN_EINTERNAL,
				                   "%s: outer value '%s' has no slot in the enclosing plan",
				                   g->model->source, v->name);
			s->kind = SLOT_OUTER;
			s->t = *s->outer;
			s->t.owns_data = 0;
			s->t.name = NULL;
			/* Prepare sees its bytes only when they cannot change between runs: anything else (the
			 * graph's input, a function's argument) may, without a re-plan, and a prepare that kept
			 * what it read (packed weights) would then compute with stale values. */
			if (!outer_constant(e, v))
				s->t.data = NULL;
			/* Its shape is known when the parent planned it statically. */
			s->known = s->outer->dtype != 0;
			s->len_free = s->known && s->t.rank > 0 && tern_value_len_free(g, v);
		}
	}
	return TERN_OK;
}

/* Runs a step's kernel while planning, making its outputs constants. */
static tern_status fold_step(tern_exec *e, step *st)
{
	for (int o = 0; o < st->n_out; o++) {
		if (!st->out[o])
			continue;
		slot *s = &e->slots[st->out_slot[o]];
		if (st->alias) {
			slot *src = &e->slots[st->in_slot[0]];
			s->t.data = src->t.data;
			s->t.nbytes = slot_bytes(&s->t);
			s->kind = SLOT_CONST;
			s->owns = 0;
			s->known = 1;
			continue;
		}
		if (tern_step_sized_output(st, o)) {
			tern_tensor shape = s->t;
			tern_status rc = tern_tensor_alloc(&s->t, shape.dtype, shape.rank, shape.dims);
			if (rc)
				return tern_node_errorf(st->node, rc, "%s", tern_error());
		}
		s->kind = SLOT_CONST;
		s->owns = 1;
		s->known = 1;
	}
	if (st->alias)
		return TERN_OK;
	void *scratch = st->scratch_bytes ? tern_aligned_alloc(st->scratch_bytes) : NULL;
	if (st->scratch_bytes && !scratch)
		return tern_errorf(TERN_EOS, "out of memory");
	tern_kernel_args a = {st->node, st->in, st->n_in, st->out, st->n_out, st->params, scratch, e->kernel_pool, e};
	tern_status rc = st->kernel(&a);
	free(scratch);
	return rc;
}

/* Calls the operator's prepare. Shared by planning and late (run-time) preparation. */
tern_status tern_exec_prepare_step(tern_exec *e, step *st, int at_run, tern_tensor **in, bool *deferred);
/* at_run: 0 while planning, 1 at run time (every input has its bytes), 2 at run time on `in`, the
 * inputs without their bytes, where prepare may defer: *deferred is then set, and st keeps nothing of
 * that prepare. */
tern_status tern_exec_prepare_step(tern_exec *e, step *st, int at_run, tern_tensor **in, bool *deferred)
{
	tern_prepare_args p = {0};
	p.node = st->node;
	p.in = in ? in : st->in;
	p.n_in = st->n_in;
	p.out = st->out;
	p.n_out = st->n_out;
	p.exec = e;
	p.pool = e->kernel_pool;
	if (st->free_params && st->params)
		st->free_params(st->params);
	st->params = NULL;
	st->free_params = NULL;
	tern_status rc = st->op->prepare(&p);
	if (rc) {
		/* a prepare that fails after setting its params leaves them to us */
		if (p.params && p.free_params)
			p.free_params(p.params);
		return rc;
	}
	st->params = p.params;
	st->free_params = p.free_params;
	if (p.defer) {
		if (at_run == 1)
			return tern_node_errorf(st->node, TERN_EINTERNAL,
			                        "prepare deferred although every input is known");
		if (at_run == 2) {
			if (p.params && p.free_params)
				p.free_params(p.params);
			st->params = NULL;
			st->free_params = NULL;
			*deferred = true;
			return TERN_OK;
		}
		st->late = 1;
		return TERN_OK;
	}
	st->kernel = p.kernel;
	st->scratch_bytes = p.scratch_bytes;
	st->dynamic_output = p.dynamic_output;
	st->fixed_outputs = p.dynamic_output ? p.fixed_outputs : 0;
	st->shaped_outputs = p.dynamic_output ? p.shaped_outputs & ~p.fixed_outputs : 0;
	st->alias = p.alias_input0;
	st->inplace_inputs = p.inplace_inputs | (p.inplace_ok ? 1u : 0u);
	st->packed_inputs = at_run ? 0 : p.packed_inputs;
	if (!st->kernel && !st->alias)
		return tern_node_errorf(st->node, TERN_EINTERNAL, "prepare chose no kernel");
	if (st->alias && (st->n_in < 1 || !st->in[0]))
		return tern_node_errorf(st->node, TERN_EINTERNAL, "aliases a missing input");
	for (int o = 0; o < st->n_out; o++)
		if (st->out[o] && tern_step_sized_output(st, o) && st->out[o]->dtype == 0)
			return tern_node_errorf(st->node, TERN_EINTERNAL, "prepare left output %d without a type", o);
	return TERN_OK;
}

static tern_status unsupported(const tern_node *n)
{
	if (tern_op_known(n->domain, n->op_type))
		return tern_node_errorf(n, TERN_EDATA, "unsupported operator: %s%s%s version %lld is not implemented",
		                        *n->domain ? n->domain : "", *n->domain ? "." : "", n->op_type,
		                        (long long)n->opset);
	return tern_node_errorf(n, TERN_EDATA, "unsupported operator: %s%s%s (opset %lld) is unknown to tern",
	                        *n->domain ? n->domain : "", *n->domain ? "." : "", n->op_type, (long long)n->opset);
}

static tern_status build_step(tern_exec *e, tern_node *n, step *st)
{
	st->node = n;
	st->op = tern_op_find(n->domain, n->op_type, n->opset);
	if (!st->op && tern_function_find(n->graph->model, n->domain, n->op_type))
		st->op = &tern_op_function_call;
	if (!st->op)
		return unsupported(n);
	st->n_in = (int)n->n_inputs;
	st->n_out = (int)n->n_outputs;
	st->sums = !*n->domain && (!strcmp(n->op_type, "Sum") || !strcmp(n->op_type, "Add"));
	st->in = calloc((size_t)st->n_in + 1, sizeof *st->in);
	st->out = calloc((size_t)st->n_out + 1, sizeof *st->out);
	st->in_slot = calloc((size_t)st->n_in + 1, sizeof *st->in_slot);
	st->out_slot = calloc((size_t)st->n_out + 1, sizeof *st->out_slot);
	st->use_slot = calloc(n->n_inputs + n->n_implicit + 1, sizeof *st->use_slot);
	if (!st->in || !st->out || !st->in_slot || !st->out_slot || !st->use_slot)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < st->n_in; i++) {
		tern_value *v = n->inputs[i];
		st->in_slot[i] = v ? v->index : -1;
		st->in[i] = v ? &e->slots[v->index].t : NULL;
		if (v)
			st->use_slot[st->n_use++] = v->index;
	}
	for (size_t i = 0; i < n->n_implicit; i++) {
		/* Implicit uses resolve to this graph's slot when the value lives here; outer ones are kept
		 * alive by the enclosing plan. */
		tern_value *v = tern_graph_find(e->graph, n->implicit[i]->name);
		if (v)
			st->use_slot[st->n_use++] = v->index;
	}
	for (int o = 0; o < st->n_out; o++) {
		tern_value *v = n->outputs[o];
		st->out_slot[o] = v ? v->index : -1;
		st->out[o] = v ? &e->slots[v->index].t : NULL;
	}
	return TERN_OK;
}

/* Orders the steps as the schedule launches them and gives each its stream and waits. Folded
 * nodes have no step: waiting on a constant is waiting on nothing. */
static tern_status apply_schedule(tern_exec *e)
{
	const tern_schedule *sc = e->schedule;
	tern_graph *g = e->graph;
	int *node_step = malloc((g->n_nodes + 1) * sizeof *node_step);
	step *ordered = calloc((size_t)sc->n_nodes + 1, sizeof *ordered);
	if (!node_step || !ordered) {
		free(node_step);
		free(ordered);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (size_t i = 0; i < g->n_nodes; i++)
		node_step[i] = -1;
	for (int k = 0; k < e->n_steps; k++)
		node_step[e->steps[k].node->index] = k;
	int mapped = 0;
	tern_status rc = TERN_OK;
	for (int i = 0; i < sc->n_nodes && !rc; i++) {
		int k = node_step[sc->order[i]->index];
		if (k >= 0) {
			ordered[i] = e->steps[k];
			mapped++;
		} else {
			/* Folded while planning: it still holds its place, so that the orderings the schedule
			 * routes through it (a Shape between two kernels) still hold. */
			ordered[i].node = sc->order[i];
			ordered[i].noop = 1;
		}
		ordered[i].stream = sc->stream[i];
		ordered[i].waits = malloc(((size_t)sc->n_waits[i] + 1) * sizeof *ordered[i].waits);
		if (!ordered[i].waits) {
			rc = tern_errorf(TERN_EOS, "out of memory");
			break;
		}
		for (int w = 0; w < sc->n_waits[i]; w++)
			ordered[i].waits[ordered[i].n_waits++] = sc->waits[i][w];
	}
	free(node_step);
	if (!rc && mapped != e->n_steps)
		rc = tern_errorf(TERN_EINTERNAL, "%s: the schedule does not cover every node", g->model->source);
	if (rc) {
		for (int i = 0; i < sc->n_nodes; i++)
			free(ordered[i].waits);
		free(ordered);
		return rc;
	}
	free(e->steps);
	e->steps = ordered;
	e->n_steps = sc->n_nodes;
	e->n_streams = sc->n_streams;
	return TERN_OK;
}

/* Memory sharing rule. One stream: two buffers may share bytes when their lifetimes (step intervals)
 * do not overlap. Several streams: when every use of one happens before the other is defined, in the
 * order that each stream's launch order and the waits impose (any worker may run any stream, so
 * nothing else orders two steps); vector clocks answer that in O(streams). */
typedef struct lifetime {
	size_t slot, size, offset;
	int *def;  /* per stream: first step writing it (-1 none); several with the pieces of a Concat
	            * (concat_in_place) made on several streams */
	int *last; /* per stream: last step using it (-1 none); INT32_MAX for graph outputs */
} lifetime;

typedef struct mem_ctx {
	int n_lanes; /* streams */
	int *clock; /* n_steps x streams: latest step of each stream finished before a step starts */
	const step *steps;
} mem_ctx;

static bool happens_before(const mem_ctx *c, int x, int y)
{
	if (x < 0)
		return true;
	if (y < 0)
		return false;
	return c->clock[(size_t)y * (size_t)c->n_lanes + (size_t)c->steps[x].stream] >= x;
}

/* Every step of xs (per stream, -1 none) happens before every step of ys, none the same step. */
static bool all_before(const mem_ctx *c, const int *xs, const int *ys)
{
	for (int s = 0; s < c->n_lanes; s++)
		for (int t = 0; xs[s] != -1 && t < c->n_lanes; t++)
			if (ys[t] != -1 && (xs[s] == ys[t] || !happens_before(c, xs[s], ys[t])))
				return false;
	return true;
}

/* a's bytes are dead before b's are first written: every use and every write of a happens before
 * each stream's first write of b. */
static bool ends_before(const mem_ctx *c, const lifetime *a, const lifetime *b)
{
	bool b_written = false;
	for (int s = 0; s < c->n_lanes; s++) {
		if (a->last[s] == INT32_MAX)
			return false;
		b_written |= b->def[s] != -1;
	}
	/* a value no step writes is there from the start */
	return b_written && all_before(c, a->last, b->def) && all_before(c, a->def, b->def);
}

static int by_size_desc(const void *a, const void *b)
{
	const lifetime *x = a, *y = b;
	return x->size < y->size ? 1 : x->size > y->size ? -1 : (x->slot > y->slot) - (x->slot < y->slot);
}

static tern_status vector_clocks(tern_exec *e, mem_ctx *c)
{
	int S = c->n_lanes;
	c->clock = malloc(((size_t)e->n_steps * (size_t)S + 1) * sizeof *c->clock);
	int *last_on = malloc(((size_t)S + 1) * sizeof *last_on);
	if (!c->clock || !last_on) {
		free(last_on);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int s = 0; s < S; s++)
		last_on[s] = -1;
	for (int k = 0; k < e->n_steps; k++) {
		int *ck = &c->clock[(size_t)k * (size_t)S];
		int prev = last_on[e->steps[k].stream];
		for (int s = 0; s < S; s++)
			ck[s] = prev >= 0 ? c->clock[(size_t)prev * (size_t)S + (size_t)s] : -1;
		for (int w = 0; w < e->steps[k].n_waits; w++) {
			const int *cw = &c->clock[(size_t)e->steps[k].waits[w] * (size_t)S];
			for (int s = 0; s < S; s++)
				if (cw[s] > ck[s])
					ck[s] = cw[s];
		}
		ck[e->steps[k].stream] = k;
		last_on[e->steps[k].stream] = k;
	}
	free(last_on);
	return TERN_OK;
}

/* Concat without copies: when the inputs are contiguous pieces of the output (everything before the
 * axis has one element, as at batch 1 along channels), each input becomes an alias of its piece, so
 * its producer writes straight into the output and the Concat step does nothing. Not in a subgraph. The
 * memory plan sees the output live from the first write of any piece on each stream (plan_memory's
 * per-stream first writes), so pieces made on several streams of a schedule share it too. An input
 * qualifies when it is an ordinary arena value of the output's type, appears once in this Concat, is
 * not already a piece of another, and starts 64-byte aligned as arena buffers do. Pieces of a Concat that is itself a piece chain to the outer one. */
static void concat_in_place(tern_exec *e)
{
	for (int k = 0; k < e->n_steps; k++) {
		step *st = &e->steps[k];
		if (st->late || st->noop || st->alias || !st->kernel || *st->node->domain ||
		    strcmp(st->node->op_type, "Concat") != 0 || st->n_out != 1 || st->out_slot[0] < 0)
			continue;
		slot *out = &e->slots[st->out_slot[0]];
		const tern_tensor *y = &out->t;
		if (out->kind != SLOT_ARENA || y->dtype == TERN_STRING || y->rank < 1)
			continue;
		int64_t axis = tern_attr_int(st->node, "axis", 0);
		axis = axis < 0 ? axis + y->rank : axis;
		int64_t outer = 1;
		for (int64_t d = 0; d < axis; d++)
			outer *= y->dims[d];
		bool ok = outer == 1 && st->n_in > 0;
		size_t at = 0;
		for (int i = 0; ok && i < st->n_in; i++) {
			int s = st->in_slot[i];
			/* every piece starts aligned as the arena's buffers do, which kernels may count on */
			ok = s >= 0 && s != st->out_slot[0] && e->slots[s].kind == SLOT_ARENA &&
			     e->slots[s].t.dtype == y->dtype && at % TERN_ALIGN == 0;
			for (int j = 0; ok && j < i; j++)
				ok = st->in_slot[j] != s;
			if (ok)
				at += slot_bytes(&e->slots[s].t);
		}
		if (!ok)
			continue;
		size_t offset = 0;
		for (int i = 0; i < st->n_in; i++) {
			slot *piece = &e->slots[st->in_slot[i]];
			piece->kind = SLOT_ALIAS;
			piece->alias_of = st->out_slot[0];
			piece->alias_offset = offset;
			offset += slot_bytes(&piece->t);
		}
		st->noop = 1;
	}
}

/* In-place outputs: output slot O written into the caller's input slot I, when
 *   - O is an ordinary arena value of I's dtype and shape, produced by step P;
 *   - P reads I only as inputs it declares it may overwrite (tern_prepare_args.inplace_inputs),
 *     directly and not through a view of another shape;
 *   - every other step that reads I (directly or through views) finishes before P starts, in the
 *     order that streams and waits impose (vector clocks, as the memory plan);
 *   - I is no output of the plan and gets only one such output.
 * O becomes an alias of I; run binds it to the caller's buffer. */
static tern_status donate_inputs(tern_exec *e)
{
	int S = e->n_streams > 0 ? e->n_streams : 1;
	mem_ctx c = {S, NULL, e->steps};
	tern_status rc = vector_clocks(e, &c);
	if (rc)
		return rc;
	e->donated = calloc((size_t)e->n_inplace + 1, sizeof *e->donated);
	if (!e->donated) {
		free(c.clock);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int q = 0; q < e->n_inplace; q++) {
		int ii = e->inplace_in[q], oo = e->inplace_out[q];
		if (ii < 0 || ii >= e->n_inputs || oo < 0 || oo >= e->n_outputs)
			continue;
		int I = e->input_slot[ii], O = e->output_slot[oo];
		slot *so = &e->slots[O], *si = &e->slots[I];
		int P = so->first_def;
		bool ok = O != I && so->kind == SLOT_ARENA && P >= 0 && P < e->n_steps && so->t.dtype == si->t.dtype &&
		          so->t.dtype != TERN_STRING && slot_bytes(&so->t) == slot_bytes(&si->t);
		for (int r = 0; ok && r < so->t.rank; r++)
			ok = so->t.rank == si->t.rank && so->t.dims[r] == si->t.dims[r];
		for (int d = 0; ok && d < e->n_donated; d++)
			ok = e->slots[e->donated[d]].alias_of != I;
		for (int k = 0; ok && k < e->n_outputs; k++)
			ok = root_slot(e, e->output_slot[k]) != I;
		const step *ps = ok ? &e->steps[P] : NULL;
		ok = ok && !ps->late && !ps->alias && !ps->noop && !ps->dynamic_output && ps->kernel;
		for (int j = 0; ok && j < ps->n_in; j++) {
			int s = ps->in_slot[j];
			if (s < 0 || root_slot(e, s) != I)
				continue;
			ok = j < 32 && (ps->inplace_inputs >> j & 1u) && s == I;
		}
		for (int u = 0; ok && u < ps->n_use; u++)
			if (root_slot(e, ps->use_slot[u]) == I) {
				bool as_input = false;
				for (int j = 0; j < ps->n_in && !as_input; j++)
					as_input = ps->in_slot[j] == ps->use_slot[u];
				ok = as_input;
			}
		for (int k = 0; ok && k < e->n_steps; k++) {
			if (k == P)
				continue;
			for (int u = 0; ok && u < e->steps[k].n_use; u++)
				if (root_slot(e, e->steps[k].use_slot[u]) == I)
					ok = happens_before(&c, k, P) && k != P;
		}
		if (!ok)
			continue;
		so->kind = SLOT_ALIAS;
		so->alias_of = I;
		so->alias_offset = 0;
		e->donated[e->n_donated++] = O;
	}
	free(c.clock);
	return TERN_OK;
}

/* Where slot i's bytes are: its root's, plus the offsets of the pieces on the way. */
static void *slot_data(const tern_exec *e, int i)
{
	size_t offset = 0;
	while (e->slots[i].kind == SLOT_ALIAS) {
		offset += e->slots[i].alias_offset;
		i = e->slots[i].alias_of;
	}
	return e->slots[i].t.data ? (char *)e->slots[i].t.data + offset : NULL;
}

static tern_status plan_memory(tern_exec *e)
{
	int S = e->n_streams > 0 ? e->n_streams : 1;
	mem_ctx c = {S, NULL, e->steps};
	int n = 0;
	for (size_t i = 0; i < e->n_slots; i++)
		n += e->slots[i].kind == SLOT_ARENA;
	lifetime *items = calloc((size_t)n + 1, sizeof *items);
	int *per_stream = malloc(((size_t)n * (size_t)S * 2 + 1) * sizeof *per_stream); /* items' last and def */
	tern_status rc = items && per_stream ? vector_clocks(e, &c) : tern_errorf(TERN_EOS, "out of memory");
	if (rc)
		goto done;
	int k = 0;
	for (size_t i = 0; i < e->n_slots; i++) {
		if (e->slots[i].kind != SLOT_ARENA)
			continue;
		items[k].slot = i;
		items[k].size = (slot_bytes(&e->slots[i].t) + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
		items[k].last = &per_stream[(size_t)k * (size_t)S * 2];
		items[k].def = items[k].last + S;
		for (int s = 0; s < S; s++)
			items[k].last[s] = items[k].def[s] = -1;
		k++;
	}
	/* Per-stream last uses, from every step's reads (aliases count for their root). */
	int *slot_item = malloc((e->n_slots + 1) * sizeof *slot_item);
	if (!slot_item) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	for (size_t i = 0; i < e->n_slots; i++)
		slot_item[i] = -1;
	for (int i = 0; i < n; i++)
		slot_item[items[i].slot] = i;
	for (int st = 0; st < e->n_steps; st++) {
		int on = e->steps[st].stream;
		for (int u = 0; u < e->steps[st].n_use; u++) {
			int it = slot_item[root_slot(e, e->steps[st].use_slot[u])];
			if (it >= 0 && items[it].last[on] < st)
				items[it].last[on] = st;
		}
		/* per stream the first step that writes it: its own producer, and the producers of the
		 * values that alias it (pieces of a Concat; in-place outputs, which read it first anyway) */
		for (int o = 0; o < e->steps[st].n_out; o++) {
			int it = e->steps[st].out_slot[o] >= 0 ? slot_item[root_slot(e, e->steps[st].out_slot[o])] : -1;
			if (it >= 0 && items[it].def[on] == -1)
				items[it].def[on] = st;
		}
	}
	for (int i = 0; i < e->n_outputs; i++) {
		int it = slot_item[root_slot(e, e->output_slot[i])];
		if (it >= 0)
			items[it].last[0] = INT32_MAX;
	}
	/* A late sum that gives an output may give one input's bytes as they are (run.c, sum_of_one):
	 * such an input then lives to the end too. */
	for (int st = 0; st < e->n_steps; st++) {
		step *p = &e->steps[st];
		p->sums_to_output = 0;
		for (int i = 0; p->late && p->sums && p->n_out == 1 && i < e->n_outputs; i++)
			p->sums_to_output |= p->out_slot[0] >= 0 && e->output_slot[i] == p->out_slot[0];
		for (int j = 0; p->sums_to_output && j < p->n_in; j++) {
			int it = p->in_slot[j] >= 0 ? slot_item[p->in_slot[j]] : -1;
			if (it >= 0)
				items[it].last[0] = INT32_MAX;
		}
	}
	/* A kept frame keeps every value; elsewhere, what a kept call reads lives to the end (its frame
	 * reads it again when the gradient runs). */
	for (int i = 0; e->keep_values && i < n; i++)
		items[i].last[0] = INT32_MAX;
	for (int st = 0; !e->keep_values && st < e->n_steps; st++)
		if (tern_node_keeps_calls(e->steps[st].node))
			for (int u = 0; u < e->steps[st].n_use; u++) {
				int it = slot_item[root_slot(e, e->steps[st].use_slot[u])];
				if (it >= 0)
					items[it].last[0] = INT32_MAX;
			}
	free(slot_item);
	/* greedy by size: biggest buffers first, each at the lowest offset that no buffer it may not share
	 * with occupies */
	qsort(items, (size_t)n, sizeof *items, by_size_desc);
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		size_t off = 0;
		bool moved = true;
		while (moved) {
			moved = false;
			for (int j = 0; j < i; j++) {
				if (ends_before(&c, &items[j], &items[i]) || ends_before(&c, &items[i], &items[j]))
					continue;
				if (off < items[j].offset + items[j].size && items[j].offset < off + items[i].size) {
					off = items[j].offset + items[j].size;
					moved = true;
				}
			}
		}
		items[i].offset = off;
		if (off + items[i].size > total)
			total = off + items[i].size;
	}
	e->arena_bytes = total;
	e->arena = total ? tern_aligned_alloc(total) : NULL;
	if (total && !e->arena) {
		rc = tern_errorf(TERN_EOS, "out of memory for a %zu-byte arena", total);
		goto done;
	}
	for (int i = 0; i < n; i++) {
		slot *s = &e->slots[items[i].slot];
		s->offset = items[i].offset;
		s->t.data = (char *)e->arena + s->offset;
		s->t.nbytes = slot_bytes(&s->t);
	}
done:
	free(items);
	free(per_stream);
	free(c.clock);
	return rc;
}

/* tern_plan_options.release_weights: per initializer slot, the reads not yet known to be packed, or -1
 * when some reader reads its bytes (a late or unpacking kernel, a subgraph, the caller). */
static int *release_counts(const tern_exec *e, tern_node *const *order, size_t count)
{
	if (!e->release_weights)
		return NULL;
	int *left = calloc(e->n_slots + 1, sizeof *left);
	if (!left)
		return NULL; /* nothing is released */
	for (size_t i = 0; i < count; i++) {
		const tern_node *n = order[i];
		for (size_t k = 0; k < n->n_inputs; k++)
			if (n->inputs[k] && left[n->inputs[k]->index] >= 0)
				left[n->inputs[k]->index]++;
		for (size_t k = 0; k < n->n_implicit; k++) { /* a subgraph reads it */
			tern_value *v = tern_graph_find(e->graph, n->implicit[k]->name);
			if (v)
				left[v->index] = -1;
		}
	}
	for (size_t v = 0; v < e->n_slots; v++) {
		const tern_value *val = e->graph->values[v];
		const slot *s = &e->slots[v];
		if (!(val->flags & TERN_VALUE_INITIALIZER) || (val->flags & (TERN_VALUE_INPUT | TERN_VALUE_OUTPUT)) ||
		    s->owns || !val->initializer || !val->initializer->has_raw_data ||
		    (void *)val->initializer->raw_data.data != s->t.data)
			left[v] = -1;
	}
	return left;
}

/* Counts step st's reads against `left` (all of them finished when `done`: a step folded while
 * planning); an initializer whose every read was packed or finished has its bytes freed (the
 * allocator leaves mapped external data alone, whose pages the packing has given back). */
static void release_packed(tern_exec *e, const step *st, int *left, bool done)
{
	if (!left)
		return;
	for (int i = 0; i < st->n_in; i++) {
		int v = st->in_slot[i];
		if (v < 0 || left[v] < 0)
			continue;
		bool packed = done ? !st->alias : !st->late && i < 32 && (st->packed_inputs >> i & 1);
		if (!packed) {
			left[v] = -1;
			continue;
		}
		if (--left[v] > 0)
			continue;
		left[v] = -1;
		Onnx__TensorProto *tp = e->graph->values[v]->initializer;
		tern_pb_allocator.free(tern_pb_allocator.allocator_data, tp->raw_data.data);
		tp->raw_data.data = NULL;
		tp->raw_data.len = 0;
		tp->has_raw_data = 0;
		e->slots[v].t.data = NULL;
	}
}

static bool reads_output_of(const step *reader, const step *writer)
{
	for (int u = 0; u < reader->n_use; u++)
		for (int o = 0; o < writer->n_out; o++)
			if (writer->out_slot[o] >= 0 && reader->use_slot[u] == writer->out_slot[o])
				return true;
	return false;
}

/* Groups of calls that may run at once (step.group): function calls in a row, none reading what
 * another of the group makes. Their outputs are the kernels' own (dynamic) and they use no scratch,
 * so running them together cannot disturb the memory plan, which assumes one after another. */
static void group_calls(tern_exec *e)
{
	for (int k = 0; k < e->n_steps;) {
		int j = k;
		while (j < e->n_steps && tern_op_calls_function(e->steps[j].op) && !e->steps[j].noop) {
			bool free_of = true;
			for (int i = k; i < j && free_of; i++)
				free_of = !reads_output_of(&e->steps[j], &e->steps[i]);
			if (!free_of)
				break;
			j++;
		}
		if (j - k >= 2)
			e->steps[k].group = j - k;
		k = j > k ? j : k + 1;
	}
}

static tern_status plan_graph(tern_exec *e, tern_tensor *const *inputs, int n_inputs);

tern_status tern_exec_plan(tern_exec *e, tern_tensor *const *inputs, int n_inputs)
{
	/* the first run's inputs, values and all, for prepares that look at them (tern.Saved) */
	e->planning_inputs = inputs;
	tern_status rc = plan_graph(e, inputs, n_inputs);
	e->planning_inputs = NULL;
	return rc;
}

static tern_status plan_graph(tern_exec *e, tern_tensor *const *inputs, int n_inputs)
{
	tern_graph *g = e->graph;
	tern_status rc;
	if ((rc = init_slots(e)) || (rc = bind_inputs(e, inputs, n_inputs)))
		return rc;
	/* Kernels get the pool prepare saw. With several threads that is a team of as many members as
	 * --threads, the plan's workers themselves: a worker with nothing of its own to run (another
	 * stream's turn, or a graph on one stream) helps with the kernels of the others. A subgraph's plan
	 * runs inside its parent's worker and uses the parent's team. */
	e->kernel_pool = e->pool;
	/* frames for the calls of model-local functions, shared by every plan under this one */
	if (!e->parent && !e->calls && g->model->n_functions && !(e->calls = tern_calls_new()))
		return tern_errorf(TERN_EOS, "out of memory");
	if (!e->parent && tern_threadpool_size(e->pool) > 1) {
		if (!e->team && (rc = tern_team_create(tern_threadpool_size(e->pool), &e->team)))
			return rc;
		e->kernel_pool = e->team;
	}
	tern_node **order;
	size_t count;
	if ((rc = tern_graph_toposort(g, &order, &count)))
		return rc;
	e->steps = calloc(count + 1, sizeof *e->steps);
	if (!e->steps) {
		free(order);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	int *left = release_counts(e, order, count);
	/* Pass 1: prepare every node in order; fold those whose inputs are all constants. */
	int n_steps = 0;
	for (size_t i = 0; i < count; i++) {
		step *st = &e->steps[n_steps];
		if ((rc = build_step(e, order[i], st)))
			break;
		e->n_steps = n_steps + 1; /* so that release frees it on failure */
		bool inputs_known = true, inputs_const = true;
		for (int u = 0; u < st->n_use; u++) {
			slot *s = &e->slots[st->use_slot[u]];
			inputs_known &= s->known != 0;
			inputs_const &= s->kind == SLOT_CONST;
		}
		if (inputs_known && reads_shape_only(st->node))
			inputs_const = true;
		if (inputs_known) {
			if ((rc = tern_exec_prepare_step(e, st, 0, NULL, NULL)))
				break;
		} else {
			st->late = 1;
		}
		/* String elements are heap strings: such outputs live as run-time allocations, which are
		 * freed with their strings, rather than in the arena. */
		for (int o = 0; o < st->n_out && !st->late; o++)
			if (st->out[o] && st->out[o]->dtype == TERN_STRING && !inputs_const)
				st->late = 1;
		if (!st->late && inputs_const && !is_random_op(st->node) && st->op->prepare) {
			if ((rc = fold_step(e, st)))
				break;
			release_packed(e, st, left, true);
			free_step(st);
			e->n_steps = n_steps;
			continue;
		}
		for (int o = 0; o < st->n_out; o++) {
			if (st->out_slot[o] < 0)
				continue;
			slot *s = &e->slots[st->out_slot[o]];
			s->first_def = n_steps;
			if (st->late || !tern_step_sized_output(st, o)) {
				s->kind = SLOT_DYNAMIC;
				s->known = !st->late && tern_mask_has(st->shaped_outputs, o);
			} else if (st->alias && o == 0) {
				s->kind = SLOT_ALIAS;
				s->alias_of = st->in_slot[0];
				s->known = 1;
			} else {
				s->kind = SLOT_ARENA;
				s->known = 1;
			}
		}
		if (st->late || st->dynamic_output)
			e->has_late = 1;
		release_packed(e, st, left, false);
		n_steps++;
	}
	free(order);
	free(left);
	if (rc)
		return rc; /* e->n_steps still counts the failed step, so release frees it */
	e->n_steps = n_steps;
	e->n_streams = 1;
	/* Every thread is a worker, however many streams there are; with one stream the others only help. */
	e->n_workers = e->team ? tern_threadpool_size(e->team) : 1;
	if (e->schedule && (rc = apply_schedule(e)))
		return rc;
	for (int i = 0; i < e->n_steps; i++)
		for (int o = 0; o < e->steps[i].n_out; o++)
			if (e->steps[i].out_slot[o] >= 0)
				e->slots[e->steps[i].out_slot[o]].first_def = i;
	if (e->n_streams == 1)
		group_calls(e);
	e->n_outputs = (int)g->n_outputs;
	e->output_slot = calloc(g->n_outputs + 1, sizeof *e->output_slot);
	if (!e->output_slot)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < g->n_outputs; i++)
		e->output_slot[i] = g->outputs[i]->index;
	for (int i = 0; i < e->n_steps; i++)
		if (e->steps[i].scratch_bytes > e->scratch_bytes)
			e->scratch_bytes = e->steps[i].scratch_bytes;
	if (e->scratch_bytes && !(e->scratch = tern_aligned_alloc(e->scratch_bytes)))
		return tern_errorf(TERN_EOS, "out of memory for %zu bytes of scratch", e->scratch_bytes);
	if (e->n_inplace && (rc = donate_inputs(e)))
		return rc;
	if (!e->parent)
		concat_in_place(e);
	if ((rc = plan_memory(e)))
		return rc;
	if (e->n_workers > 1 && (rc = tern_exec_setup_streams(e)))
		return rc;
	/* Aliases see their root's bytes. */
	for (size_t i = 0; i < e->n_slots; i++)
		if (e->slots[i].kind == SLOT_ALIAS) {
			e->slots[i].t.data = slot_data(e, (int)i);
			e->slots[i].t.nbytes = slot_bytes(&e->slots[i].t);
		}
	return TERN_OK;
}

tern_status tern_exec_create(tern_exec *parent, tern_graph *g, tern_tensor *const *inputs, int n_inputs,
                             tern_threadpool *pool, tern_exec **out)
{
	return tern_exec_create_kept(parent, g, inputs, n_inputs, pool, 0, out);
}

tern_status tern_exec_create_kept(tern_exec *parent, tern_graph *g, tern_tensor *const *inputs, int n_inputs,
                                  tern_threadpool *pool, int keep, tern_exec **out)
{
	*out = NULL;
	tern_exec *e = calloc(1, sizeof *e);
	if (!e)
		return tern_errorf(TERN_EOS, "out of memory");
	e->graph = g;
	e->parent = parent;
	e->pool = pool;
	e->keep_values = keep;
	tern_status rc = tern_exec_plan(e, inputs, n_inputs);
	if (rc) {
		tern_exec_free(e);
		return rc;
	}
	*out = e;
	return TERN_OK;
}

void tern_exec_free(tern_exec *e)
{
	if (!e)
		return;
	tern_exec_release(e);
	tern_calls_free(e->calls);
	tern_threadpool_free(e->team);
	free(e->events);
	free(e);
}

int tern_exec_num_outputs(const tern_exec *e)
{
	return e->n_outputs;
}

bool tern_exec_output_movable(const tern_exec *e, int i)
{
	if (i < 0 || i >= e->n_outputs || e->keep_values)
		return false;
	const slot *s = &e->slots[e->output_slot[i]];
	return s->kind == SLOT_DYNAMIC && s->t.owns_data && s->t.data;
}

tern_tensor *tern_exec_output(tern_exec *e, int i)
{
	return i >= 0 && i < e->n_outputs ? &e->slots[e->output_slot[i]].t : NULL;
}

int tern_exec_slot_of(const tern_exec *e, const char *name)
{
	const tern_value *v = tern_graph_find(e->graph, name);
	return v && (size_t)v->index < e->n_slots ? v->index : -1;
}

tern_tensor *tern_exec_slot_tensor(tern_exec *e, int slot)
{
	return slot >= 0 && (size_t)slot < e->n_slots ? &e->slots[slot].t : NULL;
}

tern_tensor *tern_exec_input(tern_exec *e, int i)
{
	return i >= 0 && i < e->n_inputs ? &e->slots[e->input_slot[i]].t : NULL;
}

const tern_tensor *tern_exec_planning_input(const tern_exec *e, const tern_tensor *t)
{
	for (int i = 0; e->planning_inputs && i < e->n_inputs; i++)
		if (&e->slots[e->input_slot[i]].t == t)
			return e->planning_inputs[i];
	return NULL;
}

bool tern_exec_slot_static(const tern_exec *e, int slot)
{
	if (slot < 0 || (size_t)slot >= e->n_slots)
		return false;
	const struct slot *s = &e->slots[slot];
	int dt = s->t.dtype;
	if (!s->known || dt <= 0 || !tern_dtype_plain(dt))
		return false;
	/* a dynamic slot is known only when its maker fixed its shape (shaped_outputs); an outer one, and
	 * an input whose length may change without a re-plan (len_free), may change between runs */
	return s->kind != SLOT_OUTER && s->kind != SLOT_UNSET && !s->len_free;
}

const tern_graph *tern_exec_graph(const tern_exec *e)
{
	return e->graph;
}
