/* streams.c — running a scheduled plan on several streams (Nimble on the CPU). Streams are mapped
 * onto --threads persistent workers (stream s on worker s mod W); each worker runs its steps in
 * launch order, which keeps every stream's order, and a cross-worker wait is a per-step completion
 * counter set to the run's generation, so nothing is decided while running. Launch order is
 * topological, so the lowest unfinished step can always run: no worker waits forever.
 *
 * The workers are also the kernels' thread pool (a team, lib/core/threadpool.c): a worker that waits
 * for another stream, or has finished its queue, runs chunks of the kernels the others are running.
 * A phase of the graph with one branch thus runs its kernel on every core, as a single-stream run
 * would, and a phase with several runs them side by side. */
#include "exec.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#if TERN_HAVE_BLAS
#include <cblas.h>
#endif

struct stream_worker {
	pthread_t thread;
	tern_exec *exec;
	int index;
	int started;
};

struct stream_sync {
	pthread_mutex_t lock;
	pthread_cond_t go, finished;
	uint64_t generation;
	int shutdown;
	int pending; /* streams still running this generation */
	atomic_uint_fast64_t *done; /* per step: generation in which it finished */
	atomic_int failed;
	atomic_int running; /* workers still running their queue this generation */
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

/* Waiting: help with the kernels that others are running, else spin, then yield. */
static void idle(tern_exec *e, int *spins)
{
	if (tern_team_help(e->kernel_pool))
		*spins = 0;
	else if (++*spins > 64)
		sched_yield();
}

static void run_queue(tern_exec *e, int s, uint64_t gen)
{
	struct stream_sync *y = e->sync;
	for (int q = 0; q < e->queue_len[s]; q++) {
		int k = e->queue[s][q];
		const step *st = &e->steps[k];
		for (int w = 0; w < st->n_waits; w++) {
			int spins = 0;
			if (e->steps[st->waits[w]].lane == s)
				continue; /* ran earlier on this worker */
			while (atomic_load_explicit(&y->done[st->waits[w]], memory_order_acquire) != gen) {
				if (atomic_load(&y->failed))
					return;
				idle(e, &spins);
			}
		}
		if (atomic_load(&y->failed))
			return;
		tern_status rc = tern_exec_run_step(e, k, e->stream_scratch[s]);
		if (rc) {
			fail(y, rc);
			return;
		}
		atomic_store_explicit(&y->done[k], gen, memory_order_release);
	}
}

/* Runs worker s's queue, then helps the others until every queue is done. */
static void run_worker(tern_exec *e, int s, uint64_t gen)
{
	struct stream_sync *y = e->sync;
	run_queue(e, s, gen);
	atomic_fetch_sub(&y->running, 1);
	for (int spins = 0; atomic_load(&y->running) > 0;)
		idle(e, &spins);
}

static void finish_stream(struct stream_sync *y)
{
	pthread_mutex_lock(&y->lock);
	if (--y->pending == 0)
		pthread_cond_signal(&y->finished);
	pthread_mutex_unlock(&y->lock);
}

static void *worker_main(void *arg)
{
	stream_worker *w = arg;
	tern_exec *e = w->exec;
	struct stream_sync *y = e->sync;
	uint64_t seen = 0;
	tern_team_join(e->kernel_pool, w->index);
	for (;;) {
		pthread_mutex_lock(&y->lock);
		while (!y->shutdown && y->generation == seen)
			pthread_cond_wait(&y->go, &y->lock);
		if (y->shutdown) {
			pthread_mutex_unlock(&y->lock);
			return NULL;
		}
		seen = y->generation;
		pthread_mutex_unlock(&y->lock);
		run_worker(e, w->index, seen);
		finish_stream(y);
	}
}

tern_status tern_exec_setup_streams(tern_exec *e)
{
	int W = e->n_workers;
#if TERN_HAVE_BLAS
	/* OpenBLAS's threads would compete with the workers: its calls run on the calling worker. */
	openblas_set_num_threads(1);
#endif
	e->queue = calloc((size_t)W, sizeof *e->queue);
	e->queue_len = calloc((size_t)W, sizeof *e->queue_len);
	e->stream_scratch = calloc((size_t)W, sizeof *e->stream_scratch);
	e->sync = calloc(1, sizeof *e->sync);
	if (!e->queue || !e->queue_len || !e->stream_scratch || !e->sync)
		return tern_errorf(TERN_EOS, "out of memory");
	e->sync->done = calloc((size_t)e->n_steps + 1, sizeof *e->sync->done);
	if (!e->sync->done)
		return tern_errorf(TERN_EOS, "out of memory");
	pthread_mutex_init(&e->sync->lock, NULL);
	pthread_cond_init(&e->sync->go, NULL);
	pthread_cond_init(&e->sync->finished, NULL);
	e->sync->initialised = 1;
	size_t *scratch = calloc((size_t)W, sizeof *scratch);
	if (!scratch)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int k = 0; k < e->n_steps; k++) {
		int w = e->steps[k].lane;
		e->queue_len[w]++;
		if (e->steps[k].scratch_bytes > scratch[w])
			scratch[w] = e->steps[k].scratch_bytes;
	}
	tern_status rc = TERN_OK;
	for (int w = 0; w < W && !rc; w++) {
		e->queue[w] = malloc(((size_t)e->queue_len[w] + 1) * sizeof **e->queue);
		if (!e->queue[w] || (scratch[w] && !(e->stream_scratch[w] = tern_aligned_alloc(scratch[w]))))
			rc = tern_errorf(TERN_EOS, "out of memory");
		e->queue_len[w] = 0;
	}
	free(scratch);
	if (rc)
		return rc;
	for (int k = 0; k < e->n_steps; k++) {
		int w = e->steps[k].lane;
		e->queue[w][e->queue_len[w]++] = k;
	}
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
	y->pending = e->n_workers;
	y->status = TERN_OK;
	atomic_store(&y->failed, 0);
	atomic_store(&y->running, e->n_workers);
	uint64_t gen = y->generation;
	pthread_cond_broadcast(&y->go);
	pthread_mutex_unlock(&y->lock);
	tern_team_join(e->kernel_pool, 0);
	run_worker(e, 0, gen);
	tern_team_join(NULL, -1);
	pthread_mutex_lock(&y->lock);
	y->pending--;
	while (y->pending > 0)
		pthread_cond_wait(&y->finished, &y->lock);
	tern_status rc = y->status;
	pthread_mutex_unlock(&y->lock);
	if (rc)
		return tern_errorf(rc, "%s", y->message);
	return TERN_OK;
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
	if (e->sync) {
		if (e->sync->initialised) {
			pthread_mutex_destroy(&e->sync->lock);
			pthread_cond_destroy(&e->sync->go);
			pthread_cond_destroy(&e->sync->finished);
		}
		free(e->sync->done);
		free(e->sync);
	}
	for (int w = 0; w < e->n_workers; w++) {
		if (e->queue)
			free(e->queue[w]);
		if (e->stream_scratch)
			free(e->stream_scratch[w]);
	}
	free(e->queue);
	free(e->queue_len);
	free(e->stream_scratch);
	free(e->workers);
	e->queue = NULL;
	e->queue_len = NULL;
	e->stream_scratch = NULL;
	e->workers = NULL;
	e->sync = NULL;
	e->n_workers = 0;
	e->n_streams = 1;
}
