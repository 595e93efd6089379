/* threadpool.c — a persistent pool for intra-operator parallelism. Workers sleep on a condition
 * variable between jobs; a job hands out index ranges through an atomic counter, so the run loop
 * creates no threads and takes no locks beyond one wake-up per parallel_for.
 *
 * A team is the other kind of pool, for the stream executor: it has no threads of its own. Its
 * members are the stream workers; a kernel's parallel_for posts the job in its worker's slot and runs
 * it, and members with nothing to run (waiting on another stream, or done with their queue) help
 * with the posted jobs. So a kernel gets every core that its phase of the graph leaves idle, and no
 * core is ever asked to do two things at once.
 *
 * A team of guests has one thread of its own (eager's asynchronous kernels); the other members are
 * threads that wait for it (the program's, for a value) and run chunks of its jobs meanwhile. */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* A posted job's indices are split into one part per member, [m n / W, (m + 1) n / W): each member
 * starts with its own part and then takes what is left of the others'. Index i thus tends to run on
 * the same member from job to job and from one operator to the next over the same tensor, so data
 * stays in that core's cache: it matters where cores share no cache or move lines slowly. */
typedef struct team_part {
	atomic_int_fast64_t next;
	int64_t end;
	char pad[48];
} team_part;

/* One member's posted job. `refs` counts helpers inside it; the owner reuses the slot only after
 * closing it (active = 0) and seeing refs drop to zero, and a helper re-checks `active` after
 * joining, so it never reads fields of a job that is being replaced. */
typedef struct team_slot {
	atomic_int active;
	atomic_int refs;
	team_part *parts; /* one per member */
	void (*fn)(void *ctx, int64_t i);
	void *ctx;
	int64_t chunk;
	char pad[64];
} team_slot;

/* The team this thread belongs to, and its place in it. */
static _Thread_local const tern_threadpool *my_team;
static _Thread_local int my_index = -1;

struct tern_threadpool {
	int n_threads; /* workers + the caller */
	int guests; /* a team of guests (tern_team_create_guests): it sums as one thread */
	pthread_t *workers;
	pthread_mutex_t lock;
	pthread_cond_t wake, done;
	/* Held by the one caller whose job the pool runs; a concurrent caller runs its loop itself rather
	 * than queue behind it. */
	pthread_mutex_t busy;
	uint64_t generation; /* bumped per job */
	atomic_uint_fast64_t posted; /* the generation, for workers spinning without the lock */
	atomic_int running; /* workers still inside the job, for a caller spinning without the lock */
	int shutdown;
	/* the current job */
	void (*fn)(void *ctx, int64_t i);
	void *ctx;
	int64_t n, chunk;
	atomic_int_fast64_t next;
	int active; /* workers still inside the job */
	int started; /* workers running (they start with the first job) */
	uint64_t spawn_generation; /* the generation when they were started */
	team_slot *team; /* a team: one slot per member, no threads of its own */
	/* A team's idle members sleep on `wake` after spinning a while. */
	atomic_int sleepers;
};

/* Takes chunks of [0, n) from *next until none is left; a pool's workers and a team's members share
 * a job this way. */
static void run_range(atomic_int_fast64_t *next, int64_t n, int64_t chunk, void (*fn)(void *, int64_t), void *ctx)
{
	for (;;) {
		int64_t start = atomic_fetch_add(next, chunk);
		if (start >= n)
			return;
		int64_t end = start + chunk < n ? start + chunk : n;
		for (int64_t i = start; i < end; i++)
			fn(ctx, i);
	}
}

static void run_chunks(tern_threadpool *p)
{
	run_range(&p->next, p->n, p->chunk, p->fn, p->ctx);
}


/* How long a thread waits by spinning before it sleeps: a worker for the next job, the caller for the
 * workers to finish. Jobs that follow one another closely (the kernels of an eager program, a
 * scheduled run after run) then pass from thread to thread without the wake-up of a sleeping one,
 * which costs tens of microseconds on virtual machines. */
#define SPIN_NS 200000

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Spins until done(arg) or SPIN_NS have passed without help(help_arg) (when given) finding work;
 * true if done. */
static bool spin_helping(bool (*done)(const void *), const void *arg, int (*help)(void *), void *help_arg)
{
	int64_t t0 = 0;
	for (int round = 0;; round++) {
		if (done(arg))
			return true;
		if (help && help(help_arg)) {
			t0 = 0; /* the wait is being used: it starts again */
			round = 0;
			continue;
		}
		for (int i = 0; i < 16; i++)
			tern_cpu_relax();
		if (round % 16 == 0) {
			int64_t t = now_ns();
			if (!t0)
				t0 = t;
			else if (t - t0 > SPIN_NS)
				return done(arg);
		}
	}
}

static bool spin_until(bool (*done)(const void *), const void *arg)
{
	return spin_helping(done, arg, NULL, NULL);
}

typedef struct gen_wait {
	const atomic_uint_fast64_t *gen;
	uint64_t seen;
} gen_wait;

static bool gen_moved(const void *arg)
{
	const gen_wait *w = arg;
	return atomic_load_explicit(w->gen, memory_order_acquire) != w->seen;
}

bool tern_spin_until_moved(const atomic_uint_fast64_t *gen, uint64_t seen)
{
	gen_wait w = {gen, seen};
	return spin_until(gen_moved, &w);
}

static bool workers_out(const void *arg)
{
	return atomic_load_explicit((const atomic_int *)arg, memory_order_acquire) == 0;
}

bool tern_spin_until_zero(const atomic_int *n)
{
	return spin_until(workers_out, n);
}

static void *worker_main(void *arg)
{
	tern_threadpool *p = arg;
	pthread_mutex_lock(&p->lock);
	uint64_t seen = p->spawn_generation;
	for (;;) {
		if (!p->shutdown && p->generation == seen) {
			pthread_mutex_unlock(&p->lock);
			tern_spin_until_moved(&p->posted, seen);
			pthread_mutex_lock(&p->lock);
		}
		while (!p->shutdown && p->generation == seen)
			pthread_cond_wait(&p->wake, &p->lock);
		if (p->shutdown)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->lock);
		run_chunks(p);
		pthread_mutex_lock(&p->lock);
		atomic_fetch_sub_explicit(&p->running, 1, memory_order_release);
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
	if (!p || (n_threads > 1 && !(p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers)))) {
		free(p);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	p->n_threads = n_threads;
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->busy, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	*out = p;
	return TERN_OK;
}

/* Threads start with the first job, so that a pool nobody runs a job on (a plan whose kernels get
 * the stream workers instead) costs none. Called holding `busy`; false if none could start. */
static bool start_workers(tern_threadpool *p)
{
	p->spawn_generation = p->generation;
	while (p->started < p->n_threads - 1 && pthread_create(&p->workers[p->started], NULL, worker_main, p) == 0)
		p->started++;
	return p->started > 0;
}

tern_status tern_team_create(int n_members, tern_threadpool **out)
{
	*out = NULL;
	if (n_members < 1)
		n_members = 1;
	tern_threadpool *p = calloc(1, sizeof *p);
	team_slot *slots = tern_aligned_alloc((size_t)n_members * sizeof *slots);
	team_part *parts = tern_aligned_alloc((size_t)n_members * (size_t)n_members * sizeof *parts);
	if (!p || !slots || !parts) {
		free(p);
		free(slots);
		free(parts);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	p->n_threads = n_members;
	p->team = slots;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	atomic_init(&p->sleepers, 0);
	for (int i = 0; i < n_members; i++) {
		atomic_init(&slots[i].active, 0);
		atomic_init(&slots[i].refs, 0);
		slots[i].parts = parts + (size_t)i * (size_t)n_members;
		for (int m = 0; m < n_members; m++)
			atomic_init(&slots[i].parts[m].next, 0);
	}
	*out = p;
	return TERN_OK;
}

void tern_team_join(const tern_threadpool *team, int index)
{
	my_team = team;
	my_index = team ? index : -1;
}

/* Member `me`'s share of a job: its own part first, then the others' remains. */
static void run_slot_chunks(const tern_threadpool *p, team_slot *t, int me)
{
	for (int k = 0; k < p->n_threads; k++) {
		team_part *part = &t->parts[(me + k) % p->n_threads];
		run_range(&part->next, part->end, t->chunk, t->fn, t->ctx);
	}
}

static bool slot_has_work(const tern_threadpool *p, team_slot *t)
{
	for (int m = 0; m < p->n_threads; m++)
		if (atomic_load_explicit(&t->parts[m].next, memory_order_relaxed) < t->parts[m].end)
			return true;
	return false;
}

void tern_team_notify(tern_threadpool *p)
{
	/* Whoever made the work visible before this fence; a sleeper counted itself before looking for
	 * work (under the lock): one of the two sees the other. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&p->sleepers, memory_order_relaxed) > 0) {
		pthread_mutex_lock(&p->lock);
		pthread_cond_broadcast(&p->wake);
		pthread_mutex_unlock(&p->lock);
	}
}

static bool team_posted(tern_threadpool *p)
{
	for (int m = 0; m < p->n_threads; m++)
		if (atomic_load_explicit(&p->team[m].active, memory_order_acquire))
			return true;
	return false;
}

/* Rounds of looking for work before an idle member sleeps: enough to cover the gaps between steps
 * on a machine whose cores are all ours, few enough that a member does not keep a core from the one
 * doing the work where the machine has fewer free cores than threads. Between rounds a member
 * backs off a little longer each time, so that its reads do not keep taking the cache lines that the
 * working members write. */
#define TEAM_SPINS 500
#define TEAM_BACKOFF 32

void tern_team_idle(tern_threadpool *p, bool (*has_work)(void *), void *ctx, int *spins)
{
	if (tern_team_help(p)) {
		*spins = 0;
		return;
	}
	if (++*spins < TEAM_SPINS) {
		int pauses = *spins < TEAM_BACKOFF ? *spins : TEAM_BACKOFF;
		for (int i = 0; i < pauses; i++)
			tern_cpu_relax();
		if (*spins % 256 == 0)
			sched_yield();
		return;
	}
	pthread_mutex_lock(&p->lock);
	atomic_fetch_add(&p->sleepers, 1);
	if (!team_posted(p) && !has_work(ctx))
		pthread_cond_wait(&p->wake, &p->lock);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->lock);
	*spins = 0;
}

/* Member me runs chunks of the jobs posted; with gen, only while *gen is still seen once it has
 * joined a job (see tern_team_help_until_moved). */
static int team_help_as(tern_threadpool *p, int me, const atomic_uint_fast64_t *gen, uint64_t seen)
{
	int helped = 0;
	for (int m = 0; m < p->n_threads; m++) {
		team_slot *t = &p->team[m];
		if (m == me || !atomic_load_explicit(&t->active, memory_order_acquire))
			continue;
		atomic_fetch_add(&t->refs, 1);
		if (atomic_load(&t->active) && slot_has_work(p, t) && (!gen || atomic_load(gen) == seen)) {
			run_slot_chunks(p, t, me);
			helped = 1;
		}
		atomic_fetch_sub_explicit(&t->refs, 1, memory_order_release);
	}
	return helped;
}

int tern_team_help(tern_threadpool *p)
{
	return team_help_as(p, my_index, NULL, 0);
}

typedef struct team_guest {
	tern_threadpool *team;
	int me;
	gen_wait w;
} team_guest;

static int guest_helps(void *arg)
{
	team_guest *g = arg;
	return team_help_as(g->team, g->me, g->w.gen, g->w.seen);
}

/* A job a guest sees posted, with *gen still at seen after joining it, was posted before gen moved
 * past seen + 1: the waiter (gen counting the jobs' owners' work done) helps with the work it waits
 * for, never with what comes after it while its own has finished. */
bool tern_team_help_until_moved(tern_threadpool *p, int me, const atomic_uint_fast64_t *gen, uint64_t seen)
{
	team_guest g = {p, me, {gen, seen}};
	return spin_helping(gen_moved, &g.w, guest_helps, &g);
}

static void team_parallel_for(tern_threadpool *p, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx)
{
	team_slot *t = &p->team[my_index];
	if (atomic_load_explicit(&t->active, memory_order_relaxed)) { /* nested: run it here */
		for (int64_t i = 0; i < n; i++)
			fn(ctx, i);
		return;
	}
	int64_t chunk = n / (p->n_threads * 4), W = p->n_threads;
	t->fn = fn;
	t->ctx = ctx;
	t->chunk = chunk < 1 ? 1 : chunk;
	for (int m = 0; m < W; m++) {
		atomic_store_explicit(&t->parts[m].next, n * m / W, memory_order_relaxed);
		t->parts[m].end = n * (m + 1) / W;
	}
	atomic_store_explicit(&t->active, 1, memory_order_release);
	tern_team_notify(p);
	run_slot_chunks(p, t, my_index);
	atomic_store(&t->active, 0);
	/* Helpers may still be inside their last chunks. */
	for (int spins = 0; atomic_load_explicit(&t->refs, memory_order_acquire) != 0;)
		if (++spins > 256)
			sched_yield();
}

void tern_threadpool_free(tern_threadpool *p)
{
	if (!p)
		return;
	if (p->team) {
		pthread_mutex_destroy(&p->lock);
		pthread_cond_destroy(&p->wake);
		free(p->team[0].parts);
		free(p->team);
		free(p);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->shutdown = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < p->started; i++)
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

int tern_threadpool_sums(const tern_threadpool *p)
{
	return p && !p->guests ? p->n_threads : 1;
}

int tern_threadpool_guests(const tern_threadpool *p)
{
	return p ? p->guests : 0;
}

tern_status tern_team_create_guests(int n_members, tern_threadpool **out)
{
	tern_status st = tern_team_create(n_members, out);
	if (!st)
		(*out)->guests = 1;
	return st;
}

void tern_parallel_for(tern_threadpool *p, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx)
{
	if (n <= 0)
		return;
	if (p && p->team) {
		if (p->n_threads > 1 && n > 1 && my_team == p && my_index >= 0)
			team_parallel_for(p, n, fn, ctx);
		else
			for (int64_t i = 0; i < n; i++)
				fn(ctx, i);
		return;
	}
	if (!p || p->n_threads == 1 || n == 1 || pthread_mutex_trylock(&p->busy) != 0) {
		for (int64_t i = 0; i < n; i++)
			fn(ctx, i);
		return;
	}
	if (p->started < p->n_threads - 1 && !start_workers(p)) {
		pthread_mutex_unlock(&p->busy);
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
	p->active = p->started;
	atomic_store_explicit(&p->running, p->started, memory_order_relaxed);
	p->generation++;
	atomic_store_explicit(&p->posted, p->generation, memory_order_release);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->lock);
	run_chunks(p);
	spin_until(workers_out, &p->running);
	pthread_mutex_lock(&p->lock);
	while (p->active > 0)
		pthread_cond_wait(&p->done, &p->lock);
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->busy);
}
