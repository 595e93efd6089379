/* run.c — running a plan: bind inputs, launch each step's kernel on its pre-bound buffers. Steps
 * whose shapes depend on run-time values (late steps) are prepared here; a graph without them runs
 * nothing but kernel calls. Also the public tern_plan API over the executor. */
#include "exec.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#if TERN_HAVE_BLAS
#include <cblas.h>
#endif

tern_status tern_exec_prepare_step(tern_exec *e, step *st, int at_run, tern_tensor **in, bool *deferred);

#if TERN_HAVE_BLAS
#if TERN_HAVE_BLAS_THREAD_SHUTDOWN
int blas_thread_shutdown_(void); /* OpenBLAS's, not in cblas.h */
#endif
/* tern's threads are its own (the pool, or the stream workers): OpenBLAS runs on the calling thread.
 * Its threads, started when the library loaded, would otherwise spin after each call and for a while
 * after start-up, taking a core from tern's. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void)
{
	openblas_set_num_threads(1);
#if TERN_HAVE_BLAS_THREAD_SHUTDOWN
	blas_thread_shutdown_();
#endif
}
#endif

void tern_blas_own_threads(void)
{
#if TERN_HAVE_BLAS
	pthread_once(&blas_once, blas_single_threaded);
#endif
}

/* The inputs' shapes as a late step's key: per input present, dtype, rank, dims. */
static size_t late_key(const step *st, int64_t *key)
{
	size_t n = 0;
	for (int i = 0; i < st->n_in; i++) {
		const tern_tensor *t = st->in[i];
		key[n++] = t ? 1 : 0;
		if (!t)
			continue;
		key[n++] = t->dtype;
		key[n++] = t->rank;
		for (int d = 0; d < t->rank; d++)
			key[n++] = t->dims[d];
	}
	return n;
}

/* Prepares a late step for its inputs' shapes, reusing the last prepare when it needed no more than
 * those and they are unchanged: a prepare that succeeds without the inputs' bytes is kept, one that
 * needs them (a shape read from a tensor) runs on them every time. */
static tern_status prepare_late(tern_exec *e, step *st)
{
	int64_t key[64 * (3 + TERN_MAX_RANK)];
	if (st->n_in > 64)
		return tern_exec_prepare_step(e, st, 1, NULL, NULL);
	size_t n = late_key(st, key);
	if (st->late_ready && n == st->late_key_len && !memcmp(key, st->late_key, n * sizeof *key)) {
		for (int o = 0; o < st->n_out; o++)
			if (st->out[o])
				tern_set_shape(st->out[o], st->late_out[o].dtype, st->late_out[o].rank, st->late_out[o].dims);
		return TERN_OK;
	}
	st->late_ready = 0;
	tern_tensor blind[64], *bp[64] = {NULL};
	for (int i = 0; i < st->n_in; i++)
		if (st->in[i]) {
			blind[i] = *st->in[i];
			blind[i].data = NULL;
			bp[i] = &blind[i];
		}
	bool deferred = false;
	tern_status rc = tern_exec_prepare_step(e, st, 2, bp, &deferred);
	if (rc || deferred)
		return rc ? rc : tern_exec_prepare_step(e, st, 1, NULL, NULL);
	/* shapes only: keep it for these shapes */
	int64_t *k2 = realloc(st->late_key, (n ? n : 1) * sizeof *k2);
	tern_tensor *outs = st->late_out ? st->late_out : calloc((size_t)st->n_out + 1, sizeof *outs);
	if (!k2 || !outs) {
		if (k2)
			st->late_key = k2;
		st->late_out = outs;
		return TERN_OK; /* prepared all the same; only not kept */
	}
	memcpy(k2, key, n * sizeof *key);
	st->late_key = k2;
	st->late_key_len = n;
	st->late_out = outs;
	for (int o = 0; o < st->n_out; o++)
		if (st->out[o])
			tern_set_shape(&outs[o], st->out[o]->dtype, st->out[o]->rank, st->out[o]->dims);
	st->late_ready = 1;
	return TERN_OK;
}

/* A dynamic slot's bytes at the start of a run: kept as its spare when a late step with outputs of
 * fixed shape makes it (run_late takes them back for the same size), freed otherwise. */
static void release_dynamic(tern_exec *e, slot *s)
{
	const step *maker = s->first_def >= 0 ? &e->steps[s->first_def] : NULL;
	bool plain = tern_dtype_plain(s->t.dtype);
	if (maker && maker->late && !maker->dynamic_output && !maker->alias && plain && s->t.data) {
		free(s->spare);
		s->spare = s->t.data;
		s->spare_bytes = s->t.nbytes;
		s->t.data = NULL;
		s->t.nbytes = 0;
		s->t.owns_data = 0;
		return;
	}
	tern_tensor_free(&s->t);
}

/* A late sum (Add, Sum) whose inputs but one are float zero scalars, as gradients that went to a sink
 * (control.c, tern.Backward) are: its output is that input's bytes, when they are the plan's own
 * until its next run (a value a late step made, a constant, or one in the arena that the memory plan
 * keeps to the end because this sum gives an output) and of the output's type and shape. */
static bool sum_of_one(tern_exec *e, step *st)
{
	tern_tensor *y = st->out[0];
	int keep = -1;
	if (!y || st->n_out != 1 || y->dtype != TERN_FLOAT)
		return false;
	for (int i = 0; i < st->n_in; i++) {
		const tern_tensor *x = st->in[i];
		if (x && x->dtype == TERN_FLOAT && x->rank == 0 && x->data && *(const float *)x->data == 0)
			continue;
		if (keep >= 0 || !x)
			return false;
		keep = i;
	}
	if (keep < 0)
		return false;
	const tern_tensor *x = st->in[keep];
	enum slot_kind kind = e->slots[st->in_slot[keep]].kind;
	if ((kind != SLOT_DYNAMIC && kind != SLOT_CONST && !(kind == SLOT_ARENA && st->sums_to_output)) || !x->data ||
	    !tern_same_shape_from(x, y, 0))
		return false;
	y->data = x->data;
	y->nbytes = x->nbytes;
	y->owns_data = 0;
	return true;
}

/* Prepares a late step now that its inputs exist, and allocates its outputs. */
static tern_status run_late(tern_exec *e, step *st)
{
	tern_status rc = prepare_late(e, st);
	if (rc)
		return rc;
	if (st->sums && !st->dynamic_output && sum_of_one(e, st))
		return TERN_OK;
	for (int o = 0; o < st->n_out; o++) {
		tern_tensor *t = st->out[o];
		if (!t)
			continue;
		if (tern_step_sized_output(st, o)) {
			tern_tensor shape = *t;
			slot *sl = &e->slots[st->out_slot[o]];
			size_t need = tern_dtype_size(shape.dtype) * (size_t)tern_numel(shape.rank, shape.dims);
			if (sl->spare && sl->spare_bytes == need && !st->alias) {
				/* the last run's bytes: every element is written by the kernel */
				t->data = sl->spare;
				t->nbytes = need;
				t->owns_data = 1;
				sl->spare = NULL;
				continue;
			}
			/* the kernel writes every element, as it does in the arena */
			if ((rc = tern_tensor_alloc_uninit(t, shape.dtype, shape.rank, shape.dims)))
				return tern_node_errorf(st->node, rc, "%s", tern_error());
		}
	}
	/* A late alias gets its own copy: the memory plan could not see it alias its input's buffer. */
	if (st->alias) {
		if (st->out[0] && st->out[0]->nbytes)
			memcpy(st->out[0]->data, st->in[0]->data, st->out[0]->nbytes);
		return TERN_OK;
	}
	/* Its scratch size was unknown when the plan sized the shared buffers: it gets its own. */
	void *scratch = st->scratch_bytes ? tern_aligned_alloc(st->scratch_bytes) : NULL;
	if (st->scratch_bytes && !scratch)
		return tern_errorf(TERN_EOS, "out of memory");
	tern_kernel_args a = {st->node, st->in, st->n_in, st->out, st->n_out, st->params, scratch, e->kernel_pool, e};
	rc = st->kernel(&a);
	free(scratch);
	return rc;
}

/* Runs step k (any stream): a late step is prepared first, an alias only rebinds. */
tern_status tern_exec_run_step(tern_exec *e, int k, void *scratch, int worker)
{
	step *st = &e->steps[k];
	double t0 = e->profile ? tern_now_us() : 0;
	tern_status rc = TERN_OK;
	if (st->noop) {
		rc = TERN_OK;
	} else if (st->late) {
		rc = run_late(e, st);
	} else if (st->alias) {
		if (st->out[0])
			st->out[0]->data = st->in[0]->data;
	} else {
		tern_kernel_args a = {st->node,   st->in,  st->n_in,       st->out, st->n_out,
		                      st->params, scratch, e->kernel_pool, e};
		rc = st->kernel(&a);
	}
	tern_comm_progress(); /* dense gradients in flight move on between nodes */
	if (e->profile && e->events) {
		tern_profile_event *ev = &e->events[k];
		ev->name = st->node->name;
		ev->op_type = st->node->op_type;
		ev->stream = st->stream;
		ev->thread = worker;
		ev->start_us = t0;
		ev->dur_us = tern_now_us() - t0;
	}
	return rc;
}

typedef struct call_group {
	tern_exec *e;
	int first;
	void *scratch;
	int worker;
	pthread_mutex_t lock;
	tern_status rc;
	char message[1024];
} call_group;

static void call_group_task(void *ctx, int64_t i)
{
	call_group *g = ctx;
	tern_status rc = tern_exec_run_step(g->e, g->first + (int)i, g->scratch, g->worker);
	if (rc) {
		/* the message is the failing thread's: keep the first for the caller */
		pthread_mutex_lock(&g->lock);
		if (!g->rc) {
			g->rc = rc;
			snprintf(g->message, sizeof g->message, "%s", tern_error());
		}
		pthread_mutex_unlock(&g->lock);
	}
}

tern_status tern_exec_run_next(tern_exec *e, int *k, void *scratch, int worker)
{
	int n = e->steps[*k].group;
	if (n < 2 || tern_threadpool_size(e->kernel_pool) < 2)
		return tern_exec_run_step(e, (*k)++, scratch, worker);
	call_group g = {e, *k, scratch, worker, PTHREAD_MUTEX_INITIALIZER, TERN_OK, ""};
	tern_parallel_for(e->kernel_pool, n, call_group_task, &g);
	pthread_mutex_destroy(&g.lock);
	*k += n;
	return g.rc ? tern_errorf(g.rc, "%s", g.message) : TERN_OK;
}

tern_status tern_exec_run(tern_exec *e, tern_tensor *const *inputs, int n_inputs)
{
	if (n_inputs != e->n_inputs)
		return tern_errorf(TERN_EDATA, "%s: %d inputs given, the plan has %d", e->graph->model->source,
		                   n_inputs, e->n_inputs);
	/* the frames the last run kept for its gradients are free again */
	if (!e->parent)
		tern_calls_release_kept(e->calls);
	bool replan = false;
	for (int i = 0; i < n_inputs && !replan; i++) {
		const slot *s = &e->slots[e->input_slot[i]];
		replan = !tern_same_shape_from(inputs[i], &s->t, s->len_free);
	}
	/* Outer values may change shape between runs of a subgraph (a Loop's carried state). */
	for (size_t i = 0; i < e->n_slots && !replan; i++)
		if (e->slots[i].kind == SLOT_OUTER)
			replan = !tern_same_shape_from(e->slots[i].outer, &e->slots[i].t, e->slots[i].len_free);
	if (replan) {
		tern_exec_release_for_replan(e);
		tern_status rc = tern_exec_plan(e, inputs, n_inputs);
		if (rc)
			return rc;
	}
	for (int i = 0; i < n_inputs; i++) {
		tern_tensor *t = &e->slots[e->input_slot[i]].t;
		t->data = inputs[i]->data;
		t->nbytes = inputs[i]->nbytes;
		if (t->rank > 0)
			t->dims[0] = inputs[i]->dims[0]; /* the one dimension that may differ (len_free) */
	}
	for (int i = 0; i < e->n_donated; i++) {
		slot *s = &e->slots[e->donated[i]];
		s->t.data = e->slots[s->alias_of].t.data;
	}
	if (e->has_late || e->parent) {
		for (size_t i = 0; i < e->n_slots; i++) {
			slot *s = &e->slots[i];
			if (s->kind == SLOT_DYNAMIC && s->t.owns_data)
				release_dynamic(e, s);
			else if (s->kind == SLOT_OUTER) {
				s->t = *s->outer;
				s->t.owns_data = 0;
				s->t.name = NULL;
			}
		}
	}
	if (e->profile && !e->events && e->n_steps) {
		e->events = calloc((size_t)e->n_steps, sizeof *e->events);
		if (!e->events)
			return tern_errorf(TERN_EOS, "out of memory");
	}
	e->n_events = e->profile ? e->n_steps : 0;
	if (e->n_workers > 1)
		return tern_exec_run_streams(e);
	for (int i = 0; i < e->n_steps;) {
		tern_status rc = tern_exec_run_next(e, &i, e->scratch, 0);
		if (rc)
			return rc;
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- the public plan */

struct tern_plan {
	tern_model *model;
	tern_threadpool *pool;
	tern_exec *exec;
	tern_schedule *schedule;
	int *inplace; /* the in-place pairs: inputs, then outputs */
};

tern_status tern_plan_create(tern_model *model, const tern_plan_options *opts, const tern_tensor *inputs, int n_inputs,
                             tern_plan **out)
{
	*out = NULL;
	tern_plan *p = calloc(1, sizeof *p);
	tern_tensor **ptrs = calloc((size_t)n_inputs + 1, sizeof *ptrs);
	if (!p || !ptrs) {
		free(p);
		free(ptrs);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int i = 0; i < n_inputs; i++)
		ptrs[i] = (tern_tensor *)&inputs[i];
	p->model = model;
	int n_threads = opts && opts->n_threads > 0 ? opts->n_threads : 1;
	/* Workers wait for each other by spinning: more of them than the CPUs this process may use only
	 * take turns on the same cores (mobilenet_v2 on 2 CPUs: 2.4 ms with 2 threads, 13.5 with 4). */
	cpu_set_t allowed;
	if (n_threads > 1 && sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0 &&
	    n_threads > CPU_COUNT(&allowed))
		n_threads = CPU_COUNT(&allowed);
	tern_blas_own_threads();
	tern_status rc = tern_threadpool_create(n_threads, &p->pool);
	if (!rc && opts && opts->n_inplace > 0) {
		p->inplace = malloc(2 * (size_t)opts->n_inplace * sizeof *p->inplace);
		if (!p->inplace)
			rc = tern_errorf(TERN_EOS, "out of memory");
		else {
			memcpy(p->inplace, opts->inplace_input, (size_t)opts->n_inplace * sizeof *p->inplace);
			memcpy(p->inplace + opts->n_inplace, opts->inplace_output, (size_t)opts->n_inplace * sizeof *p->inplace);
		}
	}
	const char *sched_text = tern_model_meta(model, TERN_SCHEDULE_KEY);
	if (!rc && sched_text && !(opts && opts->single_stream))
		rc = tern_schedule_parse(model->graph, sched_text, &p->schedule);
	if (!rc && !(p->exec = calloc(1, sizeof *p->exec)))
		rc = tern_errorf(TERN_EOS, "out of memory");
	if (!rc) {
		p->exec->graph = model->graph;
		p->exec->pool = p->pool;
		p->exec->schedule = p->schedule;
		p->exec->release_weights = opts && opts->release_weights;
		if (p->inplace) {
			p->exec->inplace_in = p->inplace;
			p->exec->inplace_out = p->inplace + opts->n_inplace;
			p->exec->n_inplace = opts->n_inplace;
		}
		rc = tern_exec_plan(p->exec, ptrs, n_inputs);
	}
	free(ptrs);
	if (rc) {
		tern_plan_free(p);
		return rc;
	}
	*out = p;
	return TERN_OK;
}

void tern_plan_free(tern_plan *p)
{
	if (!p)
		return;
	tern_exec_free(p->exec);
	tern_schedule_free(p->schedule);
	tern_threadpool_free(p->pool);
	free(p->inplace);
	free(p);
}

tern_status tern_plan_run(tern_plan *p, const tern_tensor *inputs, int n_inputs)
{
	tern_tensor *ptrs[64] = {0};
	tern_tensor **arr = n_inputs <= 64 ? ptrs : calloc((size_t)n_inputs, sizeof *arr);
	if (!arr)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < n_inputs; i++)
		arr[i] = (tern_tensor *)&inputs[i];
	tern_status rc = tern_exec_run(p->exec, arr, n_inputs);
	if (arr != ptrs)
		free(arr);
	return rc;
}

int tern_plan_num_outputs(const tern_plan *p)
{
	return tern_exec_num_outputs(p->exec);
}
const tern_tensor *tern_plan_output(const tern_plan *p, int i)
{
	return tern_exec_output(p->exec, i);
}
const char *tern_plan_output_name(const tern_plan *p, int i)
{
	return i >= 0 && i < p->exec->n_outputs ? p->model->graph->outputs[i]->name : NULL;
}
int tern_plan_num_threads(const tern_plan *p)
{
	return tern_threadpool_size(p->pool);
}

int tern_plan_num_inplace(const tern_plan *p)
{
	return p->exec->n_donated;
}

size_t tern_plan_arena_bytes(const tern_plan *p)
{
	return p->exec->arena_bytes;
}

void tern_plan_enable_profile(tern_plan *p, int enable)
{
	p->exec->profile = enable;
}

const tern_profile_event *tern_plan_profile(const tern_plan *p, int *count)
{
	*count = p->exec->n_events;
	return p->exec->events;
}
