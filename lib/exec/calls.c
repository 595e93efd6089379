/* calls.c — model-local functions called by nodes, run without inlining (tern-graph(5)).
 *
 * A node calls a function when its domain and operator type are the function's, or through
 * tern.Invoke, whose attributes name it: a function's body may then invoke its own function under an
 * If, which ONNX's plain calls may not. Each call runs the body in a frame: a plan of the body (its
 * own executor and arena) that the call has to itself while it runs. Frames belong to the main plan
 * and outlive the calls: a call takes a free frame of its function planned for the same input shapes
 * and plans a new one when none is free or planned for them (up to TERN_CALL_FRAMES_MAX a function,
 * then a free one is planned again). A recursion therefore plans as many frames as it goes deep, once
 * for each size of its inputs (a tree's arrays); later calls of those shapes allocate nothing. */
#include "exec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>


/* Frames a function may have planned for different input shapes before calls re-plan them: kept
 * frames (calls whose values a gradient reads) count too, one a call of a step. */
#define TERN_CALL_FRAMES_MAX 16384

typedef struct call_frame {
	const tern_graph *fn;
	tern_exec *exec;
	uint64_t shapes; /* the input shapes it is planned for, hashed (shapes_of) */
	int busy; /* 0 free, 1 running, 2 kept (its values read later, until the main plan runs again) */
	int keep; /* planned to keep its values: no two share bytes (tern_exec.keep_values) */
} call_frame;

/* The pool's lock is held for a few dozen instructions per call, by calls on several threads at once
 * (a tree's subtrees): a spin lock, since a mutex that finds it held puts the thread to sleep. */
typedef struct spin_lock {
	atomic_int held;
} spin_lock;

static void spin_acquire(spin_lock *l)
{
	while (atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
		while (atomic_load_explicit(&l->held, memory_order_relaxed))
			tern_cpu_relax();
}

static void spin_release(spin_lock *l)
{
	atomic_store_explicit(&l->held, 0, memory_order_release);
}

/* The free frames of one function planned for one set of input shapes (kept or not): a stack of
 * indices into the frames, found through an open-addressing table, so that taking and giving back a
 * frame costs the same however many frames a recursion has planned. */
typedef struct free_list {
	const tern_graph *fn;
	int keep;
	uint64_t shapes;
	size_t *idx;
	size_t n, cap;
} free_list;

typedef struct fn_count {
	const tern_graph *fn;
	size_t n;
} fn_count;

struct tern_calls {
	spin_lock lock;
	call_frame *frames;
	size_t n, cap;
	free_list *lists;
	size_t n_lists, cap_lists;
	size_t *table; /* list index + 1, 0 empty */
	size_t table_cap;
	fn_count *counts; /* frames planned per function */
	size_t n_counts, cap_counts;
	/* Frames kept during this run of the main plan (tern.Invoke keep=1), by handle: a handle is
	 * (run << 32 | index), so that one from an earlier run is refused. */
	size_t *kept;
	size_t n_kept, cap_kept;
	uint32_t run;
};

/* Calls running on this thread, one inside another: a call's body runs on its caller's thread. */
static _Thread_local int call_depth;

tern_graph *tern_function_find(const tern_model *m, const char *domain, const char *name)
{
	for (size_t i = 0; m && name && i < m->n_functions; i++) {
		const Onnx__FunctionProto *fp = m->functions[i]->fproto;
		if (fp && fp->name && !strcmp(fp->name, name) && tern_same_domain(fp->domain, domain))
			return m->functions[i];
	}
	return NULL;
}

/* ---------------------------------------------------------------- arrays of any length
 *
 * A recursion over a tree passes the tree's arrays (children, words) down to every call, and each call
 * reads one element of them. Frames planned for each length of those arrays would plan every function
 * again for every size of tree. A value whose every reader is indifferent to the length of its first
 * dimension lets one plan serve all lengths: the plan does not re-plan for that length (run.c), and
 * calls find their frames whatever it is. Its readers may be:
 * - Gather's data along axis 0: the result is shaped by the indices and the other dimensions, and the
 *   kernel bounds the indices by the length it is given;
 * - a call's input that the callee's body reads so in turn (a recursion assumes its own arguments do,
 *   and the rest of its body decides);
 * - a subgraph (an If's branch, a Loop's body) that reads it so.
 * Anything else (Shape, an elementwise operator, a graph's output) depends on the length. */
#define LEN_WALK_MAX 16

typedef struct len_walk {
	const tern_graph *fn[LEN_WALK_MAX];
	size_t arg[LEN_WALK_MAX];
	int n;
} len_walk;

static bool len_free_in(const tern_graph *g, const tern_value *v, len_walk *w, int depth);

static const tern_graph *called(const tern_node *n)
{
	const tern_model *m = n->graph ? n->graph->model : NULL;
	if (!m || !m->n_functions)
		return NULL;
	bool invoke = !strcmp(n->domain, "tern") && !strcmp(n->op_type, "Invoke");
	if (!invoke && tern_op_find(n->domain, n->op_type, n->opset))
		return NULL;
	const char *domain, *name = tern_node_callee(n, &domain);
	return name ? tern_function_find(m, domain, name) : NULL;
}

static bool len_free_arg(const tern_graph *fn, size_t i, len_walk *w, int depth)
{
	if (i >= fn->n_inputs)
		return false;
	for (int k = 0; k < w->n; k++)
		if (w->fn[k] == fn && w->arg[k] == i)
			return true;
	if (w->n == LEN_WALK_MAX)
		return false;
	w->fn[w->n] = fn;
	w->arg[w->n++] = i;
	bool ok = len_free_in(fn, fn->inputs[i], w, depth - 1);
	w->n--;
	return ok;
}

/* v, a value of an enclosing graph, as read inside sub: through sub's outer values that name it, and
 * through subgraphs of sub's nodes that read it past sub. */
static bool len_free_below(const tern_graph *sub, const tern_value *v, len_walk *w, int depth)
{
	if (depth <= 0)
		return false;
	for (size_t i = 0; i < sub->n_values; i++) {
		const tern_value *u = sub->values[i];
		if ((u->flags & TERN_VALUE_OUTER) && u->outer == v && !len_free_in(sub, u, w, depth - 1))
			return false;
	}
	for (size_t i = 0; i < sub->n_nodes; i++) {
		const tern_node *n = sub->nodes[i];
		for (size_t k = 0; !n->removed && k < n->n_implicit; k++)
			for (size_t s = 0; n->implicit[k] == v && s < n->n_subgraphs; s++)
				if (!len_free_below(n->subgraphs[s], v, w, depth - 1))
					return false;
	}
	return true;
}

static bool len_free_in(const tern_graph *g, const tern_value *v, len_walk *w, int depth)
{
	if (depth <= 0 || !v)
		return false;
	for (size_t i = 0; i < g->n_outputs; i++)
		if (g->outputs[i] == v)
			return false;
	for (size_t c = 0; c < v->n_consumers; c++) {
		const tern_node *n = v->consumers[c];
		if (n->removed)
			continue;
		bool read = false;
		const tern_graph *fn = NULL;
		for (size_t i = 0; i < n->n_inputs; i++) {
			if (n->inputs[i] != v)
				continue;
			read = true;
			if (i == 0 && !*n->domain && !strcmp(n->op_type, "Gather") && tern_attr_int(n, "axis", 0) == 0)
				continue;
			if (!fn && !(fn = called(n)))
				return false;
			if (!len_free_arg(fn, i, w, depth))
				return false;
		}
		for (size_t k = 0; k < n->n_implicit; k++) {
			if (n->implicit[k] != v)
				continue;
			read = true;
			for (size_t s = 0; s < n->n_subgraphs; s++)
				if (!len_free_below(n->subgraphs[s], v, w, depth))
					return false;
		}
		if (!read)
			return false;
	}
	return true;
}

bool tern_value_len_free(const tern_graph *g, const tern_value *v)
{
	if (!v || (v->type.rank == 0) || (g->kind == TERN_GRAPH_MAIN && v->type.rank > 0 && v->type.dims[0] >= 0))
		return false;
	len_walk w = {.n = 0};
	return len_free_in(g, v, &w, 64);
}

uint64_t tern_function_len_free(const tern_graph *fn)
{
	uint64_t mask = 0;
	for (size_t i = 0; i < fn->n_inputs && i < 64; i++)
		if (tern_value_len_free(fn, fn->inputs[i]))
			mask |= 1ull << i;
	return mask;
}

/* The inputs' element types and shapes, hashed (FNV-1a): frames planned for others are passed over
 * with one comparison. */
static uint64_t shapes_of(tern_tensor *const *in, int n, uint64_t free_len)
{
	uint64_t h = 1469598103934665603ULL;
	for (int i = 0; i < n; i++) {
		int64_t v[2 + TERN_MAX_RANK] = {in[i]->dtype, in[i]->rank};
		memcpy(v + 2, in[i]->dims, (size_t)in[i]->rank * sizeof *v);
		if (i < 64 && (free_len >> i & 1) && in[i]->rank > 0)
			v[2] = -1;
		for (int k = 0; k < 2 + in[i]->rank; k++)
			h = (h ^ (uint64_t)v[k]) * 1099511628211ULL;
	}
	return h;
}

static bool fits(const tern_exec *e, tern_tensor *const *in, int n)
{
	if (e->n_inputs != n)
		return false;
	for (int i = 0; i < n; i++) {
		const slot *s = &e->slots[e->input_slot[i]];
		if (!tern_same_shape_from(&s->t, in[i], s->len_free))
			return false;
	}
	return true;
}

static size_t list_hash(const tern_graph *fn, int keep, uint64_t shapes)
{
	uint64_t h = shapes ^ ((uint64_t)(uintptr_t)fn * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)keep;
	return (size_t)(h ^ (h >> 29));
}

static free_list *find_list(tern_calls *c, const tern_graph *fn, int keep, uint64_t shapes)
{
	if (!c->table_cap)
		return NULL;
	for (size_t k = list_hash(fn, keep, shapes) & (c->table_cap - 1);; k = (k + 1) & (c->table_cap - 1)) {
		size_t v = c->table[k];
		if (!v)
			return NULL;
		free_list *l = &c->lists[v - 1];
		if (l->fn == fn && l->keep == keep && l->shapes == shapes)
			return l;
	}
}

/* The list of (fn, keep, shapes), made when missing (NULL: out of memory). */
static free_list *get_list(tern_calls *c, const tern_graph *fn, int keep, uint64_t shapes)
{
	free_list *l = find_list(c, fn, keep, shapes);
	if (l)
		return l;
	if ((c->n_lists + 1) * 2 > c->table_cap) {
		size_t cap = c->table_cap ? c->table_cap * 2 : 64;
		size_t *t = calloc(cap, sizeof *t);
		if (!t)
			return NULL;
		for (size_t i = 0; i < c->n_lists; i++) {
			size_t k = list_hash(c->lists[i].fn, c->lists[i].keep, c->lists[i].shapes) & (cap - 1);
			while (t[k])
				k = (k + 1) & (cap - 1);
			t[k] = i + 1;
		}
		free(c->table);
		c->table = t;
		c->table_cap = cap;
	}
	if (!tern_grow((void **)&c->lists, &c->cap_lists, c->n_lists + 1, sizeof *c->lists))
		return NULL;
	l = &c->lists[c->n_lists++];
	*l = (free_list){fn, keep, shapes, NULL, 0, 0};
	size_t k = list_hash(fn, keep, shapes) & (c->table_cap - 1);
	while (c->table[k])
		k = (k + 1) & (c->table_cap - 1);
	c->table[k] = c->n_lists;
	return l;
}

/* Frame i is free again: on its list (a frame that cannot be listed, for want of memory, is simply
 * not found again). */
static void give_back(tern_calls *c, size_t i)
{
	call_frame *f = &c->frames[i];
	f->busy = 0;
	free_list *l = get_list(c, f->fn, f->keep, f->shapes);
	if (l && tern_grow((void **)&l->idx, &l->cap, l->n + 1, sizeof *l->idx))
		l->idx[l->n++] = i;
}

static size_t *count_of(tern_calls *c, const tern_graph *fn)
{
	for (size_t i = 0; i < c->n_counts; i++)
		if (c->counts[i].fn == fn)
			return &c->counts[i].n;
	if (!tern_grow((void **)&c->counts, &c->cap_counts, c->n_counts + 1, sizeof *c->counts))
		return NULL;
	c->counts[c->n_counts] = (fn_count){fn, 0};
	return &c->counts[c->n_counts++].n;
}

tern_calls *tern_calls_new(void)
{
	tern_calls *c = calloc(1, sizeof *c);
	if (c)
		atomic_init(&c->lock.held, 0);
	return c;
}

static tern_exec *main_plan(tern_exec *e)
{
	while (e->parent)
		e = e->parent;
	return e;
}

/* The main plan's pool (made with it, when the model has functions). */
static tern_calls *calls_of(tern_exec *caller)
{
	return main_plan(caller)->calls;
}

tern_grad_sinks *tern_exec_sinks(const tern_exec *e)
{
	/* a subgraph's plan has its frame (or the main plan) as parent; a frame's sinks are set per call */
	for (; e; e = e->parent)
		if (e->is_frame)
			return e->sinks;
	return NULL;
}

static tern_status call_begin(tern_exec *caller, const tern_node *node, const tern_graph *fn, tern_tensor *const *in,
                              int n_in, tern_threadpool *pool, int keep, uint64_t free_len, tern_grad_sinks *sinks,
                              tern_exec **frame);

tern_status tern_call_begin(tern_exec *caller, const tern_node *node, const tern_graph *fn, tern_tensor *const *in,
                            int n_in, tern_threadpool *pool, int keep, uint64_t free_len, tern_exec **frame)
{
	return call_begin(caller, node, fn, in, n_in, pool, keep, free_len, tern_exec_sinks(caller), frame);
}

tern_status tern_call_begin_sinks(tern_exec *caller, const tern_node *node, const tern_graph *fn,
                                  tern_tensor *const *in, int n_in, tern_threadpool *pool, uint64_t free_len,
                                  tern_grad_sinks *sinks, tern_exec **frame)
{
	return call_begin(caller, node, fn, in, n_in, pool, 0, free_len, sinks, frame);
}

static tern_status call_begin(tern_exec *caller, const tern_node *node, const tern_graph *fn, tern_tensor *const *in,
                              int n_in, tern_threadpool *pool, int keep, uint64_t free_len, tern_grad_sinks *sinks,
                              tern_exec **frame)
{
	*frame = NULL;
	const char *name = fn->fproto && fn->fproto->name ? fn->fproto->name : "?";
	if (call_depth >= TERN_CALL_DEPTH_MAX)
		return tern_node_errorf(node, TERN_EDATA,
		                        "calls of %s nested %d deep, the limit: a recursion whose end is never reached?",
		                        name, TERN_CALL_DEPTH_MAX);
	for (int i = 0; i < n_in; i++)
		if (!in[i])
			return tern_node_errorf(node, TERN_EDATA, "input %d of the call of %s is missing", i, name);
	tern_calls *c = calls_of(caller);
	if (!c)
		return tern_node_errorf(node, TERN_EINTERNAL, "a call in a plan without a pool of frames");
	uint64_t shapes = shapes_of(in, n_in, free_len);
	spin_acquire(&c->lock);
	call_frame *pick = NULL;
	free_list *l = find_list(c, fn, keep, shapes);
	while (l && l->n && !pick) {
		call_frame *f = &c->frames[l->idx[--l->n]];
		if (!f->busy && fits(f->exec, in, n_in))
			pick = f;
	}
	/* none planned for these shapes: a new frame, so that inputs of recurring sizes (trees of many
	 * sizes) each find theirs planned; past the cap, a free one planned again */
	size_t *of_fn = pick ? NULL : count_of(c, fn);
	for (size_t i = 0; !pick && of_fn && *of_fn >= TERN_CALL_FRAMES_MAX && i < c->n_lists; i++) {
		free_list *o = &c->lists[i];
		while (o->fn == fn && o->keep == keep && o->n && !pick) {
			call_frame *f = &c->frames[o->idx[--o->n]];
			if (!f->busy)
				pick = f;
		}
	}
	tern_exec *e = NULL;
	if (pick) {
		pick->busy = 1;
		pick->shapes = shapes; /* a frame planned for others is planned again when it runs */
		e = pick->exec;
	}
	spin_release(&c->lock);
	tern_status rc = TERN_OK;
	if (!e) {
		/* planned outside the lock: planning may call (a Constant folded by a call, say) */
		if ((rc = tern_exec_create_kept(main_plan(caller), (tern_graph *)fn, in, n_in, pool, keep, &e)))
			return rc;
		e->is_frame = 1;
		spin_acquire(&c->lock);
		if (!tern_grow((void **)&c->frames, &c->cap, c->n + 1, sizeof *c->frames)) {
			spin_release(&c->lock);
			tern_exec_free(e);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		e->call_slot = c->n;
		c->frames[c->n++] = (call_frame){fn, e, shapes, 1, keep};
		size_t *count = count_of(c, fn);
		if (count)
			(*count)++;
		spin_release(&c->lock);
	}
	call_depth++;
	e->sinks = sinks;
	/* the outputs a node takes were checked against the function when it was planned */
	rc = tern_exec_run(e, in, n_in);
	if (rc) {
		tern_call_end(caller, e);
		return rc;
	}
	*frame = e;
	return TERN_OK;
}

void tern_call_end(tern_exec *caller, tern_exec *frame)
{
	call_depth--;
	frame->sinks = NULL;
	tern_calls *c = calls_of(caller);
	spin_acquire(&c->lock);
	give_back(c, frame->call_slot);
	spin_release(&c->lock);
}

tern_status tern_call_keep(tern_exec *caller, tern_exec *frame, int64_t *handle)
{
	call_depth--;
	tern_calls *c = calls_of(caller);
	spin_acquire(&c->lock);
	if (!tern_grow((void **)&c->kept, &c->cap_kept, c->n_kept + 1, sizeof *c->kept)) {
		give_back(c, frame->call_slot);
		spin_release(&c->lock);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	frame->sinks = NULL;
	c->frames[frame->call_slot].busy = 2;
	*handle = (int64_t)((uint64_t)c->run << 32 | c->n_kept);
	c->kept[c->n_kept++] = frame->call_slot;
	spin_release(&c->lock);
	return TERN_OK;
}

tern_exec *tern_call_kept(tern_exec *caller, int64_t handle)
{
	tern_calls *c = calls_of(caller);
	if (!c)
		return NULL;
	uint64_t h = (uint64_t)handle;
	tern_exec *e = NULL;
	spin_acquire(&c->lock);
	if ((uint32_t)(h >> 32) == c->run && (h & 0xffffffffu) < c->n_kept)
		e = c->frames[c->kept[h & 0xffffffffu]].exec;
	spin_release(&c->lock);
	return e;
}

void tern_calls_release_kept(tern_calls *c)
{
	if (!c)
		return;
	spin_acquire(&c->lock);
	for (size_t i = 0; i < c->n_kept; i++)
		give_back(c, c->kept[i]);
	c->n_kept = 0;
	c->run++;
	spin_release(&c->lock);
}

void tern_calls_free(tern_calls *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n; i++)
		tern_exec_free(c->frames[i].exec);
	free(c->frames);
	free(c->kept);
	for (size_t i = 0; i < c->n_lists; i++)
		free(c->lists[i].idx);
	free(c->lists);
	free(c->table);
	free(c->counts);
	free(c);
}
