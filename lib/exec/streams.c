/* streams.c — running a scheduled plan on several streams (Nimble on the CPU).
 *
 * The schedule fixes everything a device would be told: each stream's steps in launch order, and the
 * steps of other streams each one waits for. --threads workers then run the streams as a device runs
 * its queues: a worker takes the next step of any stream whose waits are met, runs it, and moves the
 * stream's position past it: a stream's position is the event of every step in it. It goes on with
 * the stream it ran last while that one is ready (its data is in this core's cache); else it takes,
 * of the streams ready, the one whose next step has the longest way to the end of the run (its rank,
 * from the steps' times in the first runs: set_ranks): on a DARTS cell network at two threads, 1.05
 * ms against 0.97 in the same run. A stream is held by one worker at a time, so its steps run in
 * order.
 * Launch order is topological, so some stream can always advance: no worker waits forever.
 *
 * The workers are also the kernels' thread pool (a team, lib/core/threadpool.c): a worker with no
 * stream ready runs chunks of the kernels the others are running. A phase of the graph with one
 * branch thus runs its kernel on every core, as a single-stream run would, and a phase with several
 * runs them side by side. An unscheduled graph is one stream. */
#include "exec.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct stream_worker {
	pthread_t thread;
	tern_exec *exec;
	int index;
	int started;
};

/* Per stream, on its own cache line: the position of its next step and whether a worker holds it. */
typedef struct stream_state {
	atomic_int pos;
	atomic_int held;
	char pad[56];
} stream_state;

struct stream_sync {
	pthread_mutex_t lock;
	pthread_cond_t go, finished;
	uint64_t generation;
	atomic_uint_fast64_t started; /* the generation, readable without the lock by a worker spinning for it */
	int shutdown;
	/* Workers inside this generation. The caller waits only for them: once it has seen the generation
	 * end it closes it, and a worker that wakes later skips it, so a run never waits for a sleeping
	 * worker to wake (tens of microseconds on some machines) just to find nothing left to do. */
	atomic_int active;
	uint64_t closed; /* the last generation closed */
	int *qpos; /* per step: its place in its stream's queue; it has run once the stream's pos is past it */
	stream_state *streams;
	/* Priorities (set_ranks): per step the least time it took in the first RANK_CALIBRATE runs, then
	 * its rank, the longest time from its start to the end of the run along the steps that wait for
	 * it; ranked once they are known. */
	int64_t *cost_ns;
	double *rank;
	int runs, ranked;
	atomic_int remaining; /* streams not yet finished this generation */
	int n_live; /* streams with steps */
	atomic_int failed;
	int initialised; /* lock and conditions exist */
	tern_status status;
	char message[1024];
};

static void fail(struct stream_sync *y, tern_status rc)
{
	pthread_mutex_lock(&y->lock);
	if (!y->status) {
		y->status = rc;
		snprintf(y->message, sizeof y->message, "%s", tern_error());
	}
	pthread_mutex_unlock(&y->lock);
	atomic_store(&y->failed, 1);
}

/* Whether the steps k waits for have run: each stream's pos, moved on (release) once a step's
 * outputs are written, tells for all its steps. No per-step mark: a word written at every step and
 * read by every idle worker would move between the cores at every step. */
static bool ready(const tern_exec *e, int k)
{
	const step *st = &e->steps[k];
	const struct stream_sync *y = e->sync;
	for (int w = 0; w < st->n_waits; w++) {
		int x = st->waits[w];
		if (atomic_load_explicit(&y->streams[e->steps[x].stream].pos, memory_order_acquire) <= y->qpos[x])
			return false;
	}
	return true;
}

/* Runs the next step of stream s if its waits are met and no other worker holds s; true if it ran. */
static bool advance(tern_exec *e, int s, int worker)
{
	struct stream_sync *y = e->sync;
	stream_state *ss = &y->streams[s];
	int pos = atomic_load_explicit(&ss->pos, memory_order_acquire);
	if (pos >= e->queue_len[s] || atomic_load_explicit(&ss->held, memory_order_relaxed) ||
	    !ready(e, e->queue[s][pos]))
		return false;
	int unheld = 0;
	if (!atomic_compare_exchange_strong(&ss->held, &unheld, 1))
		return false;
	/* Another worker may have run the step between the look and the claim. */
	if (atomic_load_explicit(&ss->pos, memory_order_acquire) != pos) {
		atomic_store_explicit(&ss->held, 0, memory_order_release);
		return false;
	}
	int k = e->queue[s][pos];
	double t0 = y->ranked ? 0 : tern_now_us();
	tern_status rc = tern_exec_run_step(e, k, e->worker_scratch[worker], worker);
	if (rc)
		fail(y, rc);
	if (!y->ranked) {
		int64_t ns = (int64_t)((tern_now_us() - t0) * 1000.0);
		if (y->cost_ns[k] < 0 || ns < y->cost_ns[k])
			y->cost_ns[k] = ns;
	}
	atomic_store_explicit(&ss->pos, pos + 1, memory_order_release);
	atomic_store_explicit(&ss->held, 0, memory_order_release);
	if (pos + 1 == e->queue_len[s]) /* the stream's last step: one shared write a stream, not a step */
		atomic_fetch_sub_explicit(&y->remaining, 1, memory_order_acq_rel);
	tern_team_notify(e->kernel_pool);
	return true;
}

static bool ranks_wanted(void)
{
	const char *v = getenv("TERN_STREAM_RANKS");
	return !v || strcmp(v, "0") != 0;
}

/* Ranks from the calibration runs' times (HEFT's upward rank): in reverse launch order, a step's rank
 * is its time plus the greatest rank of the steps that wait for it (on other streams, or next on its
 * own). */
#define RANK_CALIBRATE 3
static void set_ranks(tern_exec *e)
{
	struct stream_sync *y = e->sync;
	int n = e->n_steps;
	double *after = calloc((size_t)n + 1, sizeof *after);
	int *next_on = malloc(((size_t)e->n_streams + 1) * sizeof *next_on);
	if (!after || !next_on) {
		free(after);
		free(next_on);
		return;
	}
	for (int s = 0; s < e->n_streams; s++)
		next_on[s] = -1;
	for (int k = n; k-- > 0;) {
		const step *st = &e->steps[k];
		int nx = next_on[st->stream];
		double tail = after[k];
		if (nx >= 0 && y->rank[nx] > tail)
			tail = y->rank[nx];
		y->rank[k] = (double)(y->cost_ns[k] > 0 ? y->cost_ns[k] : 0) + tail;
		for (int w = 0; w < st->n_waits; w++)
			if (after[st->waits[w]] < y->rank[k])
				after[st->waits[w]] = y->rank[k];
		next_on[st->stream] = k;
	}
	free(after);
	free(next_on);
}

/* The stream ran last if its next step is ready (its data is in this core's cache, and a worker that
 * hopped to the other's stream at every step moved both streams' lines between the cores: two chains
 * of tiny steps took 199 ns a step against 31), else the ready stream whose next step has the
 * greatest rank; -1 if none is ready. */
static int pick_stream(const tern_exec *e, int last)
{
	const struct stream_sync *y = e->sync;
	int best = -1, S = e->n_streams;
	double best_rank = 0;
	for (int i = 0; i < S; i++) {
		int s = last + i < S ? last + i : last + i - S;
		int pos = atomic_load_explicit(&y->streams[s].pos, memory_order_acquire);
		if (pos >= e->queue_len[s] || atomic_load_explicit(&y->streams[s].held, memory_order_relaxed))
			continue;
		int k = e->queue[s][pos];
		if (!ready(e, k))
			continue;
		if (s == last)
			return s;
		if (best < 0 || y->rank[k] > best_rank) {
			best = s;
			best_rank = y->rank[k];
		}
	}
	return best;
}

static bool generation_over(const tern_exec *e)
{
	return atomic_load_explicit(&e->sync->remaining, memory_order_acquire) <= 0 || atomic_load(&e->sync->failed);
}

typedef struct idle_ctx {
	tern_exec *e;
} idle_ctx;

/* For a worker about to sleep: is there anything to do after all? */
static bool has_work(void *arg)
{
	idle_ctx *c = arg;
	tern_exec *e = c->e;
	if (generation_over(e))
		return true;
	/* One stream is worker 0's alone: the others only help. */
	for (int s = 0; e->n_streams > 1 && s < e->n_streams; s++) {
		int pos = atomic_load_explicit(&e->sync->streams[s].pos, memory_order_acquire);
		if (pos < e->queue_len[s] && !atomic_load(&e->sync->streams[s].held) && ready(e, e->queue[s][pos]))
			return true;
	}
	return false;
}

/* Runs streams' steps until every step of the generation is done (or one failed); with nothing ready,
 * helps with the kernels that others are running, else backs off, and after a while sleeps until a
 * step finishes or a kernel posts work. One stream: worker 0 runs it, in order and with no
 * bookkeeping per step, and the others only help. */
static void run_worker(tern_exec *e, int worker)
{
	struct stream_sync *y = e->sync;
	int S = e->n_streams, last = worker % S, spins = 0;
	idle_ctx ctx = {e};
	if (S == 1 && worker == 0) {
		for (int k = 0; k < e->n_steps;) {
			tern_status rc = tern_exec_run_next(e, &k, e->worker_scratch[0], 0);
			if (rc) {
				fail(y, rc);
				break;
			}
		}
		atomic_store(&y->remaining, 0);
		tern_team_notify(e->kernel_pool);
		return;
	}
	while (!generation_over(e)) {
		bool ran = false;
		int pick = y->ranked ? pick_stream(e, last) : -1;
		if (pick >= 0 && advance(e, pick, worker)) {
			last = pick;
			ran = true;
		}
		for (int i = 0; S > 1 && i < S && !ran; i++) {
			int s = last + i < S ? last + i : last + i - S;
			if (advance(e, s, worker)) {
				last = s;
				ran = true;
			}
		}
		if (ran)
			spins = 0;
		else
			tern_team_idle(e->kernel_pool, has_work, &ctx, &spins);
	}
}

static void finish_worker(struct stream_sync *y)
{
	pthread_mutex_lock(&y->lock);
	if (atomic_fetch_sub_explicit(&y->active, 1, memory_order_acq_rel) == 1)
		pthread_cond_signal(&y->finished);
	pthread_mutex_unlock(&y->lock);
}

/* A worker that finished a run spins a while for the next before it sleeps: runs that follow one
 * another closely (a loop over batches, a decoder calling the plan per token) then start without the
 * wake-up of a sleeping thread, which costs tens of microseconds on virtual machines. */
static void *worker_main(void *arg)
{
	stream_worker *w = arg;
	tern_exec *e = w->exec;
	struct stream_sync *y = e->sync;
	uint64_t seen = 0;
	tern_team_join(e->kernel_pool, w->index);
	for (;;) {
		tern_spin_until_moved(&y->started, seen);
		pthread_mutex_lock(&y->lock);
		while (!y->shutdown && y->generation == seen)
			pthread_cond_wait(&y->go, &y->lock);
		if (y->shutdown) {
			pthread_mutex_unlock(&y->lock);
			return NULL;
		}
		seen = y->generation;
		if (y->closed == seen) { /* over before this worker woke */
			pthread_mutex_unlock(&y->lock);
			continue;
		}
		atomic_fetch_add_explicit(&y->active, 1, memory_order_relaxed);
		pthread_mutex_unlock(&y->lock);
		run_worker(e, w->index);
		finish_worker(y);
	}
}

tern_status tern_exec_setup_streams(tern_exec *e)
{
	int W = e->n_workers, S = e->n_streams;
	/* workers from an earlier plan, idle (tern_exec_park_streams): an executor's worker count is its
	 * pool's, the same for every plan */
	bool parked = e->workers && e->sync;
	e->queue = calloc((size_t)S, sizeof *e->queue);
	e->queue_len = calloc((size_t)S, sizeof *e->queue_len);
	e->worker_scratch = calloc((size_t)W, sizeof *e->worker_scratch);
	if (!parked)
		e->sync = calloc(1, sizeof *e->sync);
	if (!e->queue || !e->queue_len || !e->worker_scratch || !e->sync)
		return tern_errorf(TERN_EOS, "out of memory");
	e->sync->qpos = calloc((size_t)e->n_steps + 1, sizeof *e->sync->qpos);
	e->sync->streams = tern_aligned_alloc((size_t)S * sizeof *e->sync->streams);
	if (!e->sync->qpos || !e->sync->streams)
		return tern_errorf(TERN_EOS, "out of memory");
	if (!parked) {
		pthread_mutex_init(&e->sync->lock, NULL);
		pthread_cond_init(&e->sync->go, NULL);
		pthread_cond_init(&e->sync->finished, NULL);
		e->sync->initialised = 1;
	}
	for (int k = 0; k < e->n_steps; k++)
		e->queue_len[e->steps[k].stream]++;
	for (int s = 0; s < S; s++) {
		if (!(e->queue[s] = malloc(((size_t)e->queue_len[s] + 1) * sizeof **e->queue)))
			return tern_errorf(TERN_EOS, "out of memory");
		e->queue_len[s] = 0;
	}
	for (int k = 0; k < e->n_steps; k++) {
		int s = e->steps[k].stream;
		e->sync->qpos[k] = e->queue_len[s];
		e->queue[s][e->queue_len[s]++] = k;
	}
	e->sync->cost_ns = malloc(((size_t)e->n_steps + 1) * sizeof *e->sync->cost_ns);
	e->sync->rank = malloc(((size_t)e->n_steps + 1) * sizeof *e->sync->rank);
	if (!e->sync->cost_ns || !e->sync->rank)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int k = 0; k < e->n_steps; k++) {
		e->sync->cost_ns[k] = -1;
		e->sync->rank[k] = 0;
	}
	e->sync->runs = 0;
	e->sync->ranked = 0;
	e->sync->n_live = 0;
	for (int s = 0; s < S; s++)
		e->sync->n_live += e->queue_len[s] > 0;
	/* Any worker may run any step: each has scratch for the largest (the caller, the plan's own). */
	e->worker_scratch[0] = e->scratch;
	for (int w = 1; w < W; w++)
		if (e->scratch_bytes && !(e->worker_scratch[w] = tern_aligned_alloc(e->scratch_bytes)))
			return tern_errorf(TERN_EOS, "out of memory");
	if (parked)
		return TERN_OK;
	e->workers = calloc((size_t)W, sizeof *e->workers);
	if (!e->workers)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int w = 1; w < W; w++) {
		e->workers[w].exec = e;
		e->workers[w].index = w;
		if (pthread_create(&e->workers[w].thread, NULL, worker_main, &e->workers[w]) != 0)
			return tern_errorf(TERN_EOS, "cannot start stream worker %d", w);
		e->workers[w].started = 1;
	}
	return TERN_OK;
}

tern_status tern_exec_run_streams(tern_exec *e)
{
	struct stream_sync *y = e->sync;
	pthread_mutex_lock(&y->lock);
	y->generation++;
	atomic_store_explicit(&y->started, y->generation, memory_order_release);
	atomic_store_explicit(&y->active, 0, memory_order_relaxed);
	y->status = TERN_OK;
	atomic_store(&y->failed, 0);
	atomic_store(&y->remaining, e->n_streams > 1 ? y->n_live : 1);
	for (int s = 0; s < e->n_streams; s++) {
		atomic_store(&y->streams[s].pos, 0);
		atomic_store(&y->streams[s].held, 0);
	}
	/* the workers see the ranks after the lock */
	if (e->n_streams > 1 && !y->ranked && ++y->runs > RANK_CALIBRATE && ranks_wanted()) {
		set_ranks(e);
		y->ranked = 1;
	}
	uint64_t gen = y->generation;
	pthread_cond_broadcast(&y->go);
	pthread_mutex_unlock(&y->lock);
	tern_team_join(e->kernel_pool, 0);
	run_worker(e, 0);
	tern_team_join(NULL, -1);
	pthread_mutex_lock(&y->lock);
	y->closed = gen;
	pthread_mutex_unlock(&y->lock);
	/* The workers inside the generation see its end within a few of their idle rounds: sleeping
	 * until the last one signals would add two wake-ups to every run. */
	tern_spin_until_zero(&y->active);
	pthread_mutex_lock(&y->lock);
	while (atomic_load_explicit(&y->active, memory_order_acquire) > 0)
		pthread_cond_wait(&y->finished, &y->lock);
	tern_status rc = y->status;
	pthread_mutex_unlock(&y->lock);
	if (rc)
		return tern_errorf(rc, "%s", y->message);
	return TERN_OK;
}

void tern_exec_park_streams(tern_exec *e)
{
	/* the workers wait for the next generation and touch nothing of the plan until then */
	if (e->sync) {
		free(e->sync->qpos);
		free(e->sync->streams);
		free(e->sync->cost_ns);
		free(e->sync->rank);
		e->sync->qpos = NULL;
		e->sync->streams = NULL;
		e->sync->cost_ns = NULL;
		e->sync->rank = NULL;
	}
	for (int s = 0; e->queue && s < e->n_streams; s++)
		free(e->queue[s]);
	for (int w = 1; e->worker_scratch && w < e->n_workers; w++)
		free(e->worker_scratch[w]);
	free(e->queue);
	free(e->queue_len);
	free(e->worker_scratch);
	e->queue = NULL;
	e->queue_len = NULL;
	e->worker_scratch = NULL;
	e->n_streams = 1;
}

void tern_exec_stop_streams(tern_exec *e)
{
	if (e->sync && e->sync->initialised) {
		pthread_mutex_lock(&e->sync->lock);
		e->sync->shutdown = 1;
		pthread_cond_broadcast(&e->sync->go);
		pthread_mutex_unlock(&e->sync->lock);
	}
	for (int w = 1; e->workers && w < e->n_workers; w++)
		if (e->workers[w].started)
			pthread_join(e->workers[w].thread, NULL);
	tern_exec_park_streams(e); /* what the plan sized */
	if (e->sync && e->sync->initialised) {
		pthread_mutex_destroy(&e->sync->lock);
		pthread_cond_destroy(&e->sync->go);
		pthread_cond_destroy(&e->sync->finished);
	}
	free(e->sync);
	free(e->workers);
	e->workers = NULL;
	e->sync = NULL;
	e->n_workers = 0;
}
