/* threadpool.c — a persistent pool for intra-operator parallelism. Workers sleep on a condition
 * variable between jobs; a job hands out index ranges through an atomic counter, so the run loop
 * creates no threads and takes no locks beyond one wake-up per parallel_for. */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct tern_threadpool {
	int n_threads; /* workers + the caller */
	pthread_t *workers;
	pthread_mutex_t lock;
	pthread_cond_t wake, done;
	/* Held by the one caller whose job the pool runs; concurrent callers (kernels on other streams)
	 * run their loop themselves rather than queue behind it. */
	pthread_mutex_t busy;
	uint64_t generation; /* bumped per job */
	int shutdown;
	/* the current job */
	void (*fn)(void *ctx, int64_t i);
	void *ctx;
	int64_t n, chunk;
	atomic_int_fast64_t next;
	int active; /* workers still inside the job */
};

static void run_chunks(tern_threadpool *p)
{
	for (;;) {
		int64_t start = atomic_fetch_add(&p->next, p->chunk);
		if (start >= p->n)
			return;
		int64_t end = start + p->chunk < p->n ? start + p->chunk : p->n;
		for (int64_t i = start; i < end; i++)
			p->fn(p->ctx, i);
	}
}

static void *worker_main(void *arg)
{
	tern_threadpool *p = arg;
	uint64_t seen = 0;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->shutdown && p->generation == seen)
			pthread_cond_wait(&p->wake, &p->lock);
		if (p->shutdown)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->lock);
		run_chunks(p);
		pthread_mutex_lock(&p->lock);
		if (--p->active == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

tern_status tern_threadpool_create(int n_threads, tern_threadpool **out)
{
	*out = NULL;
	if (n_threads < 1)
		n_threads = 1;
	tern_threadpool *p = calloc(1, sizeof *p);
	if (!p)
		return tern_errorf(TERN_EOS, "out of memory");
	p->n_threads = n_threads;
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->busy, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	if (n_threads > 1) {
		p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
		if (!p->workers) {
			tern_threadpool_free(p);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		for (int i = 0; i < n_threads - 1; i++)
			if (pthread_create(&p->workers[i], NULL, worker_main, p) != 0) {
				p->n_threads = i + 1;
				tern_threadpool_free(p);
				return tern_errorf(TERN_EOS, "cannot start thread %d", i + 1);
			}
	}
	*out = p;
	return TERN_OK;
}

void tern_threadpool_free(tern_threadpool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->shutdown = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; p->workers && i < p->n_threads - 1; i++)
		pthread_join(p->workers[i], NULL);
	free(p->workers);
	pthread_mutex_destroy(&p->lock);
	pthread_mutex_destroy(&p->busy);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done);
	free(p);
}

int tern_threadpool_size(const tern_threadpool *p)
{
	return p ? p->n_threads : 1;
}

void tern_parallel_for(tern_threadpool *p, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx)
{
	if (n <= 0)
		return;
	if (!p || p->n_threads == 1 || n == 1 || pthread_mutex_trylock(&p->busy) != 0) {
		for (int64_t i = 0; i < n; i++)
			fn(ctx, i);
		return;
	}
	/* Several chunks per thread balance uneven work without much counter traffic. */
	int64_t chunk = n / (p->n_threads * 4);
	pthread_mutex_lock(&p->lock);
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->chunk = chunk < 1 ? 1 : chunk;
	atomic_store(&p->next, 0);
	p->active = p->n_threads - 1;
	p->generation++;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	run_chunks(p);
	pthread_mutex_lock(&p->lock);
	while (p->active > 0)
		pthread_cond_wait(&p->done, &p->lock);
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->busy);
}
