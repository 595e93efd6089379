/* eager.c — tern one operator at a time (tern_eager.h).
 *
 * A call is a node of the context's scratch graph, made once per signature (operator, attributes,
 * input dtypes and shapes, outputs wanted): its prepare runs once, on inputs whose bytes it does not
 * see (as a plan prepares an input it does not know), and later calls with that signature only
 * allocate the outputs and run the kernel. An operator whose prepare needs input values (a shape
 * tensor) prepares at every call, and its signature includes those inputs' values; a random operator
 * prepares at every call with a fresh seed from the context's stream.
 *
 * Autograd: a call on tensors that require gradients records a tape node (the cached node, for its
 * attributes; the inputs; the outputs, saved as tensors sharing their bytes but not their history, so
 * that the tape holds no cycle). tern_backward visits the tape from the loss back and hands each node
 * to its operator's gradient rule through the builder of lib/autodiff in eager mode, where each
 * emitted node runs at once (tern_eager_emit below).
 *
 * Asynchronous kernels (tern_ctx_set_async): a call still checks, prepares and allocates on the
 * caller's thread, and hands the kernel to the context's own thread, which runs them in the order
 * they came. Each storage knows the last call that writes it and the last that touches it, so that a
 * read of its bytes waits for the one and a write for the other; a call in flight holds references to
 * the storages it reads and writes, given back by the caller's thread once it has run.
 *
 * A context and its tensors are used by one thread at a time (counts are plain integers). */
#include "eager/tern_eager.h"
#include "eager/trace.h"

#include "autodiff/grad.h"
#include "internal.h"
#include "passes/passes.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_OPSET 19
/* Input elements below which a call runs on the pool of one (tern_ctx.serial_pool). */
#define EAGER_PARALLEL_ELEMS ((int64_t)1 << 18)

typedef struct storage {
	int refs;
	void *data;
	size_t pooled; /* from the context's pool: its size class (0: not) */
	/* asynchronous kernels: the last call (its number, 1-based; 0: none) that writes the bytes, and
	 * the last that reads or writes them */
	uint64_t write_seq, use_seq;
} storage;

typedef struct entry entry;

typedef struct tape_node {
	int refs;
	const entry *e;
	int n_in, n_out;
	tern_var **in; /* references; NULL for omitted inputs */
	tern_var **out; /* the outputs' bytes, without history */
	tern_var **dy; /* gradients of the outputs while backward runs */
	int released; /* backward has run through it */
	int marked; /* visited by the backward running now */
} tape_node;

struct tern_var {
	int refs;
	tern_ctx *ctx;
	tern_tensor t; /* t.data points into st */
	storage *st;
	int requires_grad;
	tern_var *grad;
	tape_node *fn; /* the recorded operation that made it (a reference), or NULL for a leaf */
	int fn_out;
	tern_trace_stamp ts;
};

struct entry {
	uint64_t hash;
	char *key;
	size_t key_len;
	tern_node *node;
	const tern_op *op;
	int n_in, n_out;
	int per_call; /* prepared at every call (needs input values, or random) */
	int random;
	/* a prepared call, reused */
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *);
	size_t scratch_bytes;
	int dynamic_output, alias;
	tern_threadpool *pool; /* the pool it was prepared for and runs on */
	tern_tensor *out_shape; /* n_out; dtype 0 where the output is left out */
	uint64_t last_seq; /* asynchronous kernels: the last call of it issued */
};

struct tern_ctx {
	int refs; /* the owner's, and one per live tensor */
	int closed;
	tern_threadpool *pool;
	/* With several threads: a pool of one, for small calls (EAGER_PARALLEL_ELEMS). Between eager calls
	 * the pool's threads sleep, and waking them costs more than a small call's whole work (a plan keeps
	 * them running instead); prepare and kernel see the same pool. */
	tern_threadpool *serial_pool;
	/* With asynchronous kernels: the team of the kernels' thread (member 0) and the caller's (member
	 * 1), which runs chunks of the kernel in flight while it waits for a call to have run, instead of
	 * spinning. Kept until the context goes (prepared calls hold it). */
	tern_threadpool *team;
	tern_model *model; /* the scratch graph that holds the cached nodes */
	int64_t opset;
	uint64_t rng;
	int grad_enabled;
	entry **table;
	size_t cap, n;
	int64_t hits, misses, made;
	void *scratch;
	size_t scratch_bytes;
	/* Freed tensor bytes kept for the next call of the same size class (a training loop makes the
	 * same tensors every step: reusing them saves the allocator's page faults on big ones). With
	 * asynchronous kernels each carries the last call that used it (after: 0 none), see pool_get. */
	struct {
		struct pooled {
			void *p;
			uint64_t after;
		} *e;
		int n, cap;
	} freed[48];
	size_t pooled_bytes;
	/* With asynchronous kernels: bytes whose last call had not run when their tensor went, freed
	 * once it has (aq_reap) */
	struct pooled *late;
	int n_late, cap_late;
	uint64_t late_min; /* the least `after` of late's entries; none below it has run while done < it */
	/* Freed tensor and storage structs, reused (a linked list through their first bytes): every call
	 * makes one of each per output. Not kept under AddressSanitizer, which is to see every free. */
	void *spare_vars, *spare_storages;
	int n_spare_vars, n_spare_storages;
	struct tern_trace *trace; /* trace.c, while tracing */
	uint64_t serial;          /* the last tensor's serial number */
	int64_t epoch;            /* 0 before the first step, 2k - 1 in step k, 2k after it */
	const void *c_site;       /* the return address of the outermost public call running */
	int site_depth;
	struct async_q *aq;       /* asynchronous kernels, when on */
};

/* In a public entry point: its caller's address is the site the tracer gives C programs. */
#define SITE_ENTER(c) (void)((c)->site_depth++ ? 0 : ((c)->c_site = __builtin_return_address(0), 0))
#define SITE_LEAVE(c) ((c)->site_depth--)

#if defined(__SANITIZE_ADDRESS__)
#define SPARE_MAX 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPARE_MAX 0
#endif
#endif
#ifndef SPARE_MAX
#define SPARE_MAX 8192
#endif

/* A cleared struct of size n from the list, else from calloc. */
static void *spare_get(void **list, int *count, size_t n)
{
	void *p = *list;
	if (!p)
		return calloc(1, n);
	memcpy(list, p, sizeof *list);
	--*count;
	memset(p, 0, n);
	return p;
}

static void spare_put(void **list, int *count, void *p)
{
	if (*count >= SPARE_MAX) {
		free(p);
		return;
	}
	memcpy(p, list, sizeof *list);
	*list = p;
	++*count;
}

static void spare_free(void *list)
{
	while (list) {
		void *next;
		memcpy(&next, list, sizeof next);
		free(list);
		list = next;
	}
}

#define POOL_MAX_BYTES ((size_t)256 << 20)
/* Buffers kept per size class: 16, or as many as fill POOL_CLASS_BYTES. A training step keeps its
 * forward values until backward and frees them together: with 16 small buffers kept a class, a step
 * of 600 small calls went back to aligned_alloc for 584 of them at every step. */
#define POOL_PER_CLASS 16
#define POOL_CLASS_BYTES ((size_t)8 << 20)
/* Buffers of a class looked at, newest first, for bytes the caller's thread writes itself */
#define POOL_HOST_LOOK 8

static int size_class(size_t n)
{
	if (n <= 64) /* 64 bytes, the alignment */
		return 6;
	int k = 64 - __builtin_clzll((unsigned long long)n - 1); /* the least k with 2^k >= n */
	return k < 47 ? k : 47;
}

static void aq_wait(struct async_q *q, uint64_t seq);
static uint64_t aq_done(struct async_q *q);

/* n bytes, 64-byte aligned, not cleared (kernels write every output element, as in a plan's arena;
 * TERN_EAGER_POISON=1 fills them with 0xff bytes, NaN in every float type, to show one that does not),
 * for a call's output.
 *
 * The thread runs calls in the order they come, so a call handed to it may take bytes whose last
 * call has not run yet: that one will have by then. So a buffer goes back to the pool when its
 * tensor goes, not when its last call has run, and the next call takes it at once, as eager
 * execution does: the thread writes bytes it has just read. Waiting for the calls to run first had
 * each call write bytes last touched a whole step earlier, out of the core's caches: the thread's
 * elementwise and normalisation kernels ran at half the speed of the same kernels inline (early_stop,
 * 4.6 against 3.8 ms of kernels a step). Bytes the caller's thread writes itself (host) are some
 * whose last call has run, or new ones: it never waits for them. */
static void *pool_get(tern_ctx *c, size_t n, size_t *cap, bool host)
{
	static int poison = -1;
	if (poison < 0) {
		const char *e = getenv("TERN_EAGER_POISON");
		poison = e && *e == '1';
	}
	int k = size_class(n ? n : 1);
	*cap = (size_t)1 << k;
	void *p = NULL;
	uint64_t after = 0;
	/* for the caller's thread, the newest of the last few whose call has run (a shape computed here
	 * while calls are in flight would otherwise wait for them), else new bytes */
	uint64_t done = host && c->aq ? aq_done(c->aq) : UINT64_MAX;
	int n_k = c->freed[k].n;
	for (int i = n_k - 1; i >= 0 && i >= n_k - POOL_HOST_LOOK; i--) {
		struct pooled *e = &c->freed[k].e[i];
		if (e->after > done)
			continue;
		p = e->p;
		after = e->after;
		*e = c->freed[k].e[--c->freed[k].n]; /* the top in its place */
		c->pooled_bytes -= *cap;
		break;
	}
	if (!p)
		p = aligned_alloc(64, *cap);
	if (p && poison) { /* written here: once the call that used them before has run */
		if (after && c->aq)
			aq_wait(c->aq, after);
		memset(p, 0xff, *cap);
	}
	return p;
}

static void free_after(tern_ctx *c, void *p, uint64_t after);

/* Keeps bytes of size class cap whose last call is `after` (0: none) for a later call. */
static void pool_put(tern_ctx *c, void *p, size_t cap, uint64_t after)
{
	int k = size_class(cap);
	if (((size_t)1 << k) != cap || c->closed || c->pooled_bytes + cap > POOL_MAX_BYTES ||
	    (c->freed[k].n >= POOL_PER_CLASS && (size_t)(c->freed[k].n + 1) * cap > POOL_CLASS_BYTES)) {
		free_after(c, p, after);
		return;
	}
	if (c->freed[k].n == c->freed[k].cap) {
		int cap2 = c->freed[k].cap ? c->freed[k].cap * 2 : 4;
		struct pooled *q = realloc(c->freed[k].e, (size_t)cap2 * sizeof *q);
		if (!q) {
			free_after(c, p, after);
			return;
		}
		c->freed[k].e = q;
		c->freed[k].cap = cap2;
	}
	c->freed[k].e[c->freed[k].n++] = (struct pooled){p, after};
	c->pooled_bytes += cap;
}

/* A kernels' scratch buffer of at least n bytes (the caller's, or the asynchronous thread's). */
static tern_status grow_scratch(void **scratch, size_t *bytes, size_t n)
{
	if (n <= *bytes)
		return TERN_OK;
	void *p = tern_aligned_alloc(n);
	if (!p)
		return tern_errorf(TERN_EOS, "out of memory for %zu bytes of scratch", n);
	free(*scratch);
	*scratch = p;
	*bytes = n;
	return TERN_OK;
}

/* ---------------------------------------------------------------- asynchronous kernels */

#define AJOB_SMALL 6 /* inputs and outputs whose views a job holds in itself */

/* A call handed to the context's thread. t holds the inputs' and outputs' views (their shapes and
 * bytes as the call saw them), pt points into it (NULL: left out). It holds no reference to their
 * storages: their bytes stay until it has run (storage_release). */
typedef struct ajob {
	tern_kernel_fn kernel; /* NULL: output 0 = a copy of input 0's bytes */
	void *params;
	void (*free_params)(void *); /* set when the job owns params (a call prepared for itself) */
	const tern_node *node;
	tern_threadpool *pool;
	size_t scratch_bytes;
	int n_in, n_out;
	tern_tensor *t;
	tern_tensor **pt;
	void *block; /* t and pt when they did not fit in small */
	struct {
		tern_tensor t[AJOB_SMALL];
		tern_tensor *pt[AJOB_SMALL];
	} small;
} ajob;

#define AQ_CAP 1024 /* calls in flight at most; the caller waits for room beyond */
#define AQ_BATCH 8 /* small calls handed over together */
#define AQ_SMALL_ELEMS 16384 /* elements read and written below which a call is small */
#define AQ_REAP 64 /* calls run before the caller gives back their references */
#define AQ_TEAM_ELEMS 8192 /* input elements from which a call runs on the team (tern_ctx.team) */
#define AQ_INLINE_ELEMS 4096 /* elements read and written up to which a call runs on the caller's thread
                              * when none is in flight */

typedef struct async_q {
	/* each counter on a cache line of its own: the caller writes posted, the thread done, and a line
	 * both write would cross between the cores at every call */
	_Alignas(64) atomic_uint_fast64_t posted; /* calls issued */
	_Alignas(64) atomic_uint_fast64_t done;   /* calls run */
	_Alignas(64) uint64_t reaped;             /* calls whose references the caller gave back */
	uint64_t issued;                          /* calls in the ring; posted lags behind by a few small ones */
	uint64_t seen;                            /* done, as the caller last read it (aq_done) */
	/* read by the thread at every call: not on the caller's line above */
	_Alignas(64) atomic_int sleeping, waiting, stop, failed;
	tern_threadpool *team; /* the context's */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake, progress;
	void *scratch;
	size_t scratch_bytes;
	tern_status err; /* the first failure since the last report, and its message (under lock) */
	char msg[1024];
	ajob ring[AQ_CAP];
} async_q;

/* Asks for the cache lines of [p, p + n): to write them (write = 1) or to read them. To write, on
 * x86-64 the instruction is PREFETCHW whatever the compiler's target: __builtin_prefetch(p, 1) gives
 * it only with -mprfchw and is otherwise a read prefetch, which leaves the line shared with the core
 * that read it last, to be taken back by the store itself. Processors without PREFETCHW run its
 * encoding as a no-op. */
static inline void prefetch_lines(const void *p, size_t n, int write)
{
	for (size_t off = 0; off < n; off += 64)
		if (write) {
#if defined(__x86_64__) && !defined(__PRFCHW__)
			__asm__ volatile("prefetchw %0" : : "m"(*((const char *)p + off)));
#else
			__builtin_prefetch((const char *)p + off, 1, 3);
#endif
		} else {
			__builtin_prefetch((const char *)p + off, 0, 3);
		}
}

static void aq_run(async_q *q, ajob *j)
{
	if (atomic_load_explicit(&q->failed, memory_order_relaxed))
		return; /* after a failure, what follows would read what it left */
	tern_status st = TERN_OK;
	if (!j->kernel) {
		tern_tensor *x = j->pt[0], *y = j->pt[j->n_in];
		if (y->nbytes)
			memcpy(y->data, x->data, y->nbytes);
		return;
	}
	st = grow_scratch(&q->scratch, &q->scratch_bytes, j->scratch_bytes);
	if (!st) {
		tern_kernel_args a = {j->node, j->pt, j->n_in, j->pt + j->n_in, j->n_out, j->params, q->scratch, j->pool, NULL};
		st = j->kernel(&a);
	}
	if (st) {
		pthread_mutex_lock(&q->lock);
		if (!q->err) {
			q->err = st;
			snprintf(q->msg, sizeof q->msg, "%s", tern_error());
		}
		pthread_mutex_unlock(&q->lock);
		atomic_store(&q->failed, 1);
	}
}

static void *aq_main(void *arg)
{
	async_q *q = arg;
	uint64_t d = 0;
	tern_team_join(q->team, 0);
	for (;;) {
		if (atomic_load(&q->posted) == d) {
			tern_spin_until_moved(&q->posted, d);
			pthread_mutex_lock(&q->lock);
			atomic_store(&q->sleeping, 1);
			while (atomic_load(&q->posted) == d && !atomic_load(&q->stop))
				pthread_cond_wait(&q->wake, &q->lock);
			atomic_store(&q->sleeping, 0);
			pthread_mutex_unlock(&q->lock);
			if (atomic_load(&q->posted) == d)
				break; /* stopped, nothing left */
		}
		/* the next job, when posted, on its way from the caller's core while this one runs */
		if (atomic_load_explicit(&q->posted, memory_order_relaxed) > d + 1)
			prefetch_lines(&q->ring[(d + 1) % AQ_CAP], sizeof(ajob), 0);
		aq_run(q, &q->ring[d % AQ_CAP]);
		atomic_store(&q->done, ++d);
		if (atomic_load(&q->waiting)) {
			pthread_mutex_lock(&q->lock);
			pthread_cond_broadcast(&q->progress);
			pthread_mutex_unlock(&q->lock);
		}
	}
	return NULL;
}

/* Makes the calls issued visible to the thread (and wakes it). */
static void aq_publish(async_q *q)
{
	if (atomic_load_explicit(&q->posted, memory_order_relaxed) == q->issued)
		return;
	atomic_store(&q->posted, q->issued);
	if (atomic_load(&q->sleeping)) {
		pthread_mutex_lock(&q->lock);
		pthread_cond_signal(&q->wake);
		pthread_mutex_unlock(&q->lock);
	}
}

/* The calls that have run. */
static uint64_t aq_done(async_q *q)
{
	return q->seen = atomic_load_explicit(&q->done, memory_order_acquire);
}

/* Until call number seq (1-based) has run. */
static void aq_wait(async_q *q, uint64_t seq)
{
	if (aq_done(q) >= seq)
		return;
	aq_publish(q);
	for (;;) {
		uint64_t d = aq_done(q);
		if (d >= seq)
			return;
		if (q->team ? tern_team_help_until_moved(q->team, 1, &q->done, d) : tern_spin_until_moved(&q->done, d))
			continue;
		pthread_mutex_lock(&q->lock);
		atomic_fetch_add(&q->waiting, 1);
		while (atomic_load(&q->done) == d)
			pthread_cond_wait(&q->progress, &q->lock);
		atomic_fetch_sub(&q->waiting, 1);
		pthread_mutex_unlock(&q->lock);
	}
}

/* Frees p once call `after` has run: at once if it has (or there is no thread), else in aq_reap. */
static void free_after(tern_ctx *c, void *p, uint64_t after)
{
	if (!p)
		return;
	if (c->aq && after > aq_done(c->aq)) {
		if (c->n_late == c->cap_late) {
			int cap2 = c->cap_late ? c->cap_late * 2 : 16;
			struct pooled *q = realloc(c->late, (size_t)cap2 * sizeof *q);
			if (!q) {
				aq_wait(c->aq, after);
				free(p);
				return;
			}
			c->late = q;
			c->cap_late = cap2;
		}
		if (!c->n_late || after < c->late_min)
			c->late_min = after;
		c->late[c->n_late++] = (struct pooled){p, after};
		return;
	}
	free(p);
}

/* The bytes of a tensor gone: to the pool (or freed), after the last call that used them. No call
 * holds a reference: it needs only the bytes, which stay until that call has run. */
static void storage_release(tern_ctx *c, storage *s)
{
	if (--s->refs > 0)
		return;
	if (s->pooled)
		pool_put(c, s->data, s->pooled, s->use_seq);
	else
		free_after(c, s->data, s->use_seq);
	spare_put(&c->spare_storages, &c->n_spare_storages, s);
}

/* Gives back what the calls that have run held (parameters, blocks), and frees the bytes that
 * waited for them. */
static void aq_reap(tern_ctx *c)
{
	async_q *q = c->aq;
	uint64_t d = aq_done(q);
	if (c->n_late && c->late_min <= d) { /* else none has run: most reaps (at every call) look no further */
		uint64_t least = UINT64_MAX;
		for (int i = 0; i < c->n_late;)
			if (c->late[i].after <= d) {
				free(c->late[i].p);
				c->late[i] = c->late[--c->n_late];
			} else {
				least = c->late[i].after < least ? c->late[i].after : least;
				i++;
			}
		c->late_min = least;
	}
	for (; q->reaped < d; q->reaped++) {
		ajob *j = &q->ring[q->reaped % AQ_CAP];
		if (j->free_params && j->params)
			j->free_params(j->params);
		free(j->block);
		j->block = NULL;
		j->free_params = NULL;
	}
}

/* The failure of a kernel run since the last report, as this thread's error; TERN_OK if none. */
static tern_status aq_report(async_q *q)
{
	if (!atomic_load(&q->failed))
		return TERN_OK;
	pthread_mutex_lock(&q->lock);
	tern_status st = tern_errorf(q->err, "%s", q->msg);
	q->err = TERN_OK;
	pthread_mutex_unlock(&q->lock);
	atomic_store(&q->failed, 0);
	return st;
}

/* Before the caller's thread reads (write = 0) or writes the bytes of s. */
static void storage_wait(tern_ctx *c, const storage *s, int write)
{
	if (c->aq && s) {
		aq_wait(c->aq, write ? s->use_seq : s->write_seq);
		aq_reap(c);
	}
}

/* A job's views, pointers and kept storages: in the job itself for a few, else one block. The job is
 * then copied into the ring, so its pointers are set again there (ajob_place). */
static tern_status ajob_alloc(ajob *j, int n_in, int n_out)
{
	size_t n = (size_t)(n_in + n_out);
	j->n_in = n_in;
	j->n_out = n_out;
	if (n <= AJOB_SMALL) { /* the views are set where there is a tensor (pt), and only those read */
		memset(j->small.pt, 0, n * sizeof *j->small.pt);
		j->block = NULL;
		j->t = j->small.t;
		j->pt = j->small.pt;
		return TERN_OK;
	}
	char *b = calloc(1, n * (sizeof(tern_tensor) + sizeof(tern_tensor *)) + 1);
	if (!b)
		return tern_errorf(TERN_EOS, "out of memory");
	j->block = b;
	j->t = (tern_tensor *)b;
	j->pt = (tern_tensor **)(b + n * sizeof(tern_tensor));
	return TERN_OK;
}

/* A job copied, its pointers into its own small arrays following it: the fields, and of the small
 * arrays the views there are (the whole job, cleared before it was filled and then copied, was about
 * 2 KiB of stores a call). */
static void ajob_place(ajob *dst, const ajob *src)
{
	memcpy(dst, src, offsetof(ajob, small));
	if (src->block)
		return;
	dst->t = dst->small.t;
	dst->pt = dst->small.pt;
	for (int k = 0; k < src->n_in + src->n_out; k++) {
		dst->pt[k] = src->pt[k] ? &dst->t[k] : NULL;
		if (src->pt[k])
			dst->t[k] = src->t[k];
	}
}

/* Hands a call to the context's thread: j's fields are set; in are the tensors it reads, out those it
 * writes, whose storages then know it as their last call. */
static void aq_post(tern_ctx *c, ajob *j, tern_var *const *in, int n_in, tern_var *const *out, int n_out)
{
	async_q *q = c->aq;
	uint64_t seq = q->issued;
	if (seq - q->reaped >= AQ_CAP) {
		aq_wait(q, seq - AQ_CAP + 1);
		aq_reap(c);
	}
	uint64_t no = seq + 1;
	int64_t elems = 0;
	for (int i = 0; i < n_in + n_out; i++) {
		tern_var *v = i < n_in ? in[i] : out[i - n_in];
		if (!v || !v->st)
			continue;
		v->st->use_seq = no;
		if (i >= n_in)
			v->st->write_seq = no;
		elems += tern_tensor_numel(&v->t);
	}
	ajob_place(&q->ring[seq % AQ_CAP], j);
	q->issued = no;
	/* The next job's slot was last read by the thread, on its core: taken back for writing now, while
	 * the program goes on, rather than line by line when the next call fills it. */
	prefetch_lines(&q->ring[no % AQ_CAP], sizeof(ajob), 1);
	/* Each hand-over moves cache lines between the cores (the counter, the job): small calls go over
	 * a few at a time, a larger one (or a wait) at once. */
	if (elems > AQ_SMALL_ELEMS || no - atomic_load_explicit(&q->posted, memory_order_relaxed) >= AQ_BATCH)
		aq_publish(q);
}

/* Until every call issued has run; its references given back. */
static tern_status aq_sync(tern_ctx *c)
{
	if (!c->aq)
		return TERN_OK;
	aq_wait(c->aq, c->aq->issued);
	aq_reap(c);
	return aq_report(c->aq);
}

static void aq_stop(tern_ctx *c)
{
	async_q *q = c->aq;
	if (!q)
		return;
	aq_sync(c);
	pthread_mutex_lock(&q->lock);
	atomic_store(&q->stop, 1);
	pthread_cond_signal(&q->wake);
	pthread_mutex_unlock(&q->lock);
	pthread_join(q->thread, NULL);
	for (int k = 0; k < 48; k++) /* every call has run: the pool's bytes wait for none (a later thread counts anew) */
		for (int i = 0; i < c->freed[k].n; i++)
			c->freed[k].e[i].after = 0;
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->wake);
	pthread_cond_destroy(&q->progress);
	free(q->scratch);
	free(q);
	c->aq = NULL;
}

/* dst's bytes = src's (of the same size): with asynchronous kernels a call like the others, in turn. */
static void copy_bytes(tern_ctx *c, tern_var *dst, tern_var *src)
{
	ajob j = {0};
	if (!c->aq || ajob_alloc(&j, 1, 1)) {
		storage_wait(c, src->st, 0);
		storage_wait(c, dst->st, 1);
		if (src->t.nbytes)
			memcpy(dst->t.data, src->t.data, src->t.nbytes);
		return;
	}
	j.t[0] = src->t;
	j.t[1] = dst->t;
	for (int k = 0; k < 2; k++) {
		j.t[k].owns_data = 0;
		j.t[k].name = NULL;
		j.pt[k] = &j.t[k];
	}
	aq_post(c, &j, &src, 1, &dst, 1);
}

static tern_status closed_error(void);

tern_status tern_var_copy(tern_var *dst, tern_var *src)
{
	if (dst->ctx != src->ctx || dst->ctx->closed)
		return dst->ctx->closed ? closed_error() : tern_errorf(TERN_EUSAGE, "copy: the tensors belong to two contexts");
	char a[160], b[160];
	if (dst->t.dtype != src->t.dtype || dst->t.dtype == TERN_STRING || dst->t.rank != src->t.rank ||
	    memcmp(dst->t.dims, src->t.dims, (size_t)dst->t.rank * sizeof *dst->t.dims))
		return tern_errorf(TERN_EUSAGE, "copy: %s into %s", tern_shape_str(src->t.dtype, src->t.rank, src->t.dims, a, sizeof a),
		                   tern_shape_str(dst->t.dtype, dst->t.rank, dst->t.dims, b, sizeof b));
	if (dst->st != src->st || dst->t.data != src->t.data)
		copy_bytes(dst->ctx, dst, src);
	return TERN_OK;
}

int tern_ctx_set_async(tern_ctx *c, int on)
{
	int was = c->aq != NULL;
	if (!on || c->closed) {
		aq_stop(c);
		return was;
	}
	if (was)
		return was;
	if (!c->team) /* it runs calls that would run on one thread; NULL if it cannot be made: the kernels' thread alone */
		tern_team_create_guests(2, &c->team);
	async_q *q = tern_aligned_alloc(sizeof *q); /* 64-byte aligned (its counters), zeroed */
	if (!q)
		return was;
	q->team = c->team;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->wake, NULL);
	pthread_cond_init(&q->progress, NULL);
	if (pthread_create(&q->thread, NULL, aq_main, q) != 0) {
		pthread_mutex_destroy(&q->lock);
		pthread_cond_destroy(&q->wake);
		pthread_cond_destroy(&q->progress);
		free(q);
		return was;
	}
	c->aq = q;
	return was;
}

tern_status tern_ctx_sync(tern_ctx *c)
{
	return aq_sync(c);
}

/* ---------------------------------------------------------------- contexts */

static void ctx_release(tern_ctx *c)
{
	if (--c->refs > 0)
		return;
	for (size_t i = 0; i < c->cap; i++) {
		entry *e = c->table[i];
		if (!e)
			continue;
		if (e->free_params && e->params)
			e->free_params(e->params);
		free(e->out_shape);
		free(e->key);
		free(e);
	}
	tern_trace_free(c->trace);
	free(c->table);
	free(c->scratch);
	spare_free(c->spare_vars);
	spare_free(c->spare_storages);
	for (int k = 0; k < 48; k++) {
		for (int i = 0; i < c->freed[k].n; i++)
			free(c->freed[k].e[i].p);
		free(c->freed[k].e);
	}
	for (int i = 0; i < c->n_late; i++) /* the thread has stopped: every call has run */
		free(c->late[i].p);
	free(c->late);
	tern_model_free(c->model);
	tern_threadpool_free(c->pool);
	tern_threadpool_free(c->serial_pool);
	tern_threadpool_free(c->team);
	free(c);
}

tern_status tern_ctx_create(int n_threads, tern_ctx **out)
{
	*out = NULL;
	tern_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return tern_errorf(TERN_EOS, "out of memory");
	c->refs = 1;
	c->opset = DEFAULT_OPSET;
	c->rng = 0x9e3779b97f4a7c15ull;
	c->grad_enabled = 1;
	static const char text[] = "<ir_version: 8, opset_import: [\"\" : 19, \"tern\" : 1]>\n"
	                           "eager (float x) => (float y) { y = Identity (x) }\n";
	tern_blas_own_threads();
	tern_status st = tern_threadpool_create(n_threads > 0 ? n_threads : 1, &c->pool);
	if (!st && n_threads > 1)
		st = tern_threadpool_create(1, &c->serial_pool);
	if (!st)
		st = tern_model_load_bytes(text, sizeof text - 1, "eager", NULL, &c->model);
	if (!st && !(c->table = calloc(c->cap = 256, sizeof *c->table)))
		st = tern_errorf(TERN_EOS, "out of memory");
	if (st) {
		ctx_release(c);
		return st;
	}
	const char *async = getenv("TERN_EAGER_ASYNC");
	if (async && *async == '1')
		tern_ctx_set_async(c, 1);
	*out = c;
	return TERN_OK;
}

void tern_ctx_free(tern_ctx *c)
{
	if (!c || c->closed)
		return;
	aq_stop(c);
	c->closed = 1;
	ctx_release(c);
}

void tern_ctx_manual_seed(tern_ctx *c, uint64_t seed)
{
	c->rng = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
}

int tern_ctx_set_grad_enabled(tern_ctx *c, int enabled)
{
	int was = c->grad_enabled;
	c->grad_enabled = enabled != 0;
	return was;
}

int tern_ctx_grad_enabled(const tern_ctx *c)
{
	return c->grad_enabled;
}

void tern_ctx_set_opset(tern_ctx *c, int64_t opset)
{
	c->opset = opset > 0 ? opset : DEFAULT_OPSET;
}

void tern_ctx_cache_stats(const tern_ctx *c, int64_t *hits, int64_t *misses)
{
	if (hits)
		*hits = c->hits;
	if (misses)
		*misses = c->misses;
}

static uint64_t next_random(tern_ctx *c)
{
	/* splitmix64 */
	uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static tern_status closed_error(void)
{
	return tern_errorf(TERN_EUSAGE, "a tensor of a freed context");
}

/* ---------------------------------------------------------------- tensors */

static tern_var *var_alloc(tern_ctx *c)
{
	tern_var *v = spare_get(&c->spare_vars, &c->n_spare_vars, sizeof *v);
	if (!v)
		return NULL;
	v->refs = 1;
	v->ctx = c;
	c->refs++;
	v->ts.serial = ++c->serial;
	v->ts.born = c->epoch;
	v->ts.op = -1;
	return v;
}

/* Takes the bytes of t (owned) as a new tensor's. */
static tern_var *var_adopt(tern_ctx *c, tern_tensor *t)
{
	tern_var *v = var_alloc(c);
	storage *s = v ? spare_get(&c->spare_storages, &c->n_spare_storages, sizeof *s) : NULL;
	if (!s) {
		if (v)
			tern_var_unref(v);
		tern_tensor_free(t);
		return NULL;
	}
	s->refs = 1;
	s->data = t->data;
	v->st = s;
	v->t = *t;
	v->t.owns_data = 0;
	v->t.name = NULL;
	free(t->name);
	memset(t, 0, sizeof *t);
	return v;
}

/* A tensor sharing src's bytes (and shape unless given), without history. */
static tern_var *var_share(tern_var *src, const tern_tensor *shape)
{
	tern_var *v = var_alloc(src->ctx);
	if (!v)
		return NULL;
	v->st = src->st;
	if (v->st)
		v->st->refs++;
	v->ts = src->ts; /* the same bytes: the same value to the tracer */
	v->t = shape ? *shape : src->t;
	v->t.data = src->t.data;
	v->t.owns_data = 0;
	v->t.name = NULL;
	if (shape)
		v->t.nbytes = src->t.nbytes;
	return v;
}

/* A tensor of that type and shape holding data's bytes, or zeros. Small ones of fixed-size elements
 * take bytes from the context's pool, as calls' outputs do: a scalar the host makes at every call
 * (x * 0.5) had cost an aligned allocation and its free, about 450 instructions of the 860 of making
 * it. Large ones (a model's weights) keep their exact size, not the pool's next power of two. */
#define VAR_POOL_BYTES 65536 /* host-made tensors up to this size from the pool */

static tern_status var_make(tern_ctx *c, int dtype, int rank, const int64_t *dims, const void *data,
                            tern_var **out)
{
	*out = NULL;
	if (c->closed)
		return tern_errorf(TERN_EUSAGE, "the context is freed");
	size_t elem = tern_dtype_size(dtype), n = 1;
	bool ok = elem && rank >= 0 && rank <= TERN_MAX_RANK;
	for (int d = 0; ok && d < rank; d++)
		ok = dims[d] >= 0 && !__builtin_mul_overflow(n, (size_t)dims[d], &n);
	if (!ok || __builtin_mul_overflow(n, elem, &n) || n > VAR_POOL_BYTES) {
		/* large, strings, sequences, shapes out of range: as tensors make them (and say what is wrong) */
		tern_tensor t = {0};
		tern_status st = tern_tensor_alloc(&t, dtype, rank, dims);
		if (st)
			return st;
		if (!(*out = var_adopt(c, &t)))
			return tern_errorf(TERN_EOS, "out of memory");
		if (data && (*out)->t.nbytes)
			memcpy((*out)->t.data, data, (*out)->t.nbytes);
		return TERN_OK;
	}
	tern_tensor t = {0};
	tern_set_shape(&t, dtype, rank, dims);
	t.nbytes = n;
	size_t cap;
	if (!(t.data = pool_get(c, n, &cap, true)))
		return tern_errorf(TERN_EOS, "out of memory allocating %zu bytes", n);
	if (data && n)
		memcpy(t.data, data, n);
	else if (n)
		memset(t.data, 0, n);
	if (!(*out = var_adopt(c, &t))) {
		free(t.data);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	(*out)->st->pooled = cap;
	return TERN_OK;
}

tern_status tern_var_new(tern_ctx *c, int dtype, int rank, const int64_t *dims, tern_var **out)
{
	return var_make(c, dtype, rank, dims, NULL, out);
}

tern_status tern_var_from(tern_ctx *c, int dtype, int rank, const int64_t *dims, const void *data, tern_var **out)
{
	if (dtype == TERN_STRING)
		return tern_errorf(TERN_EUSAGE, "string tensors cannot be made from bytes");
	return var_make(c, dtype, rank, dims, data, out);
}

tern_var *tern_var_ref(tern_var *v)
{
	if (v)
		v->refs++;
	return v;
}

static void tape_unref(tape_node *n);

void tern_var_unref(tern_var *v)
{
	if (!v || --v->refs > 0)
		return;
	if (v->st && v->t.dtype == TERN_STRING && v->st->refs == 1) {
		/* string elements are heap strings the tensor owns (no asynchronous call holds them) */
		tern_tensor t = v->t;
		t.data = v->st->data;
		t.owns_data = 1;
		tern_tensor_free(&t);
		spare_put(&v->ctx->spare_storages, &v->ctx->n_spare_storages, v->st);
	} else if (v->st) {
		storage_release(v->ctx, v->st);
	}
	tern_var_unref(v->grad);
	if (v->fn)
		tape_unref(v->fn);
	tern_ctx *c = v->ctx;
	spare_put(&c->spare_vars, &c->n_spare_vars, v);
	ctx_release(c);
}

tern_ctx *tern_var_ctx(const tern_var *v)
{
	return v->ctx;
}

const tern_tensor *tern_var_tensor(const tern_var *v)
{
	storage_wait(v->ctx, v->st, 1);
	return &v->t;
}

const tern_tensor *tern_var_info(const tern_var *v)
{
	return &v->t;
}

const tern_tensor *tern_var_read(const tern_var *v)
{
	storage_wait(v->ctx, v->st, 0);
	return &v->t;
}

int tern_var_requires_grad(const tern_var *v)
{
	return v->requires_grad;
}

tern_status tern_var_set_requires_grad(tern_var *v, int on)
{
	if (v->fn)
		return tern_errorf(TERN_EUSAGE, "requires_grad can be set only on a leaf tensor (this one is the result of %s)",
		                   v->fn->e->node->op_type);
	if (on && v->t.dtype != TERN_FLOAT && v->t.dtype != TERN_DOUBLE && v->t.dtype != TERN_FLOAT16 &&
	    v->t.dtype != TERN_BFLOAT16)
		return tern_errorf(TERN_EUSAGE, "only floating-point tensors can require gradients, not %s",
		                   tern_dtype_name(v->t.dtype));
	v->requires_grad = on != 0;
	return TERN_OK;
}

int tern_var_is_leaf(const tern_var *v)
{
	return v->fn == NULL;
}

tern_var *tern_var_grad(const tern_var *v)
{
	return v->grad;
}

void tern_var_set_grad(tern_var *v, tern_var *g)
{
	tern_var_ref(g);
	tern_var_unref(v->grad);
	v->grad = g;
}

tern_var *tern_var_detach(tern_var *v)
{
	return var_share(v, NULL);
}

/* ---------------------------------------------------------------- the tape */

static void tape_release_links(tape_node *n)
{
	for (int i = 0; i < n->n_in; i++)
		tern_var_unref(n->in[i]);
	for (int o = 0; o < n->n_out; o++) {
		tern_var_unref(n->out[o]);
		tern_var_unref(n->dy[o]);
	}
	memset(n->in, 0, (size_t)n->n_in * sizeof *n->in);
	memset(n->out, 0, (size_t)n->n_out * sizeof *n->out);
	memset(n->dy, 0, (size_t)n->n_out * sizeof *n->dy);
	n->released = 1;
}

/* Nodes whose last reference went, freed by the outermost tape_unref: freeing one releases its
 * inputs, whose producers may go in turn, and a tape of a long loop is that deep (200,000 steps of an
 * unrolled recurrence would overflow the stack if freed recursively). */
static _Thread_local struct {
	tape_node **n;
	size_t len, cap;
	int draining;
} dead;

static void tape_free(tape_node *n)
{
	tape_release_links(n);
	free(n); /* its arrays with it */
}

static void tape_unref(tape_node *n)
{
	if (--n->refs > 0)
		return;
	if (!tern_grow((void **)&dead.n, &dead.cap, dead.len + 1, sizeof *dead.n)) {
		tape_free(n); /* out of memory: recursively, then */
		return;
	}
	dead.n[dead.len++] = n;
	if (dead.draining)
		return;
	dead.draining = 1;
	while (dead.len)
		tape_free(dead.n[--dead.len]);
	dead.draining = 0;
	free(dead.n);
	dead.n = NULL;
	dead.cap = 0;
}

/* ---------------------------------------------------------------- the call cache */

/* A call's signature, built on the stack unless it is long. */
typedef struct keybuf {
	char *p;
	size_t n, cap;
	int failed;
	char local[512];
} keybuf;

static void key_init(keybuf *k)
{
	k->p = k->local;
	k->n = 0;
	k->cap = sizeof k->local;
	k->failed = 0;
}

static void key_free(keybuf *k)
{
	if (k->p != k->local)
		free(k->p);
	k->p = k->local;
}

static void key_grow(keybuf *k, const void *p, size_t n);

/* Most puts are a few bytes into room there is: inlined. A call makes about sixteen, which had been
 * 8 % of the instructions of rcnn's calls with asynchronous kernels (callgrind). */
static inline __attribute__((always_inline)) void key_put(keybuf *k, const void *p, size_t n)
{
	if (k->n + n <= k->cap && !k->failed) {
		memcpy(k->p + k->n, p, n);
		k->n += n;
		return;
	}
	key_grow(k, p, n);
}

static void key_grow(keybuf *k, const void *p, size_t n)
{
	if (k->failed)
		return;
	if (k->n + n > k->cap) {
		size_t cap = (k->n + n) * 2;
		char *q = k->p == k->local ? malloc(cap) : realloc(k->p, cap);
		if (!q) {
			k->failed = 1;
			return;
		}
		if (k->p == k->local)
			memcpy(q, k->local, k->n);
		k->p = q;
		k->cap = cap;
	}
	memcpy(k->p + k->n, p, n);
	k->n += n;
}

static void key_str(keybuf *k, const char *s)
{
	key_put(k, s, strlen(s) + 1);
}

/* An attribute in the signature: its fields as they are, each list and text behind its length; one
 * holding a tensor, a graph or a type, packed. Packing every attribute (protobuf-c's reflection, sizing
 * then writing) had been 7 % of the instructions of rcnn's calls, kernels included (callgrind). The
 * doc string is left out. */
static void key_attr(keybuf *k, const Onnx__AttributeProto *a)
{
	if (tern_attr_nested(a)) {
		size_t size = onnx__attribute_proto__get_packed_size(a);
		uint8_t small[256], *buf = size <= sizeof small ? small : malloc(size);
		if (!buf) {
			k->failed = 1;
			return;
		}
		onnx__attribute_proto__pack(a, buf);
		uint64_t head[2] = {1, size};
		key_put(k, head, sizeof head);
		key_put(k, buf, size);
		if (buf != small)
			free(buf);
		return;
	}
	const char *name = a->name ? a->name : "", *ref = a->ref_attr_name ? a->ref_attr_name : "";
	uint32_t fbits;
	memcpy(&fbits, &a->f, sizeof fbits);
	uint64_t head[11] = {2,
	                     (uint64_t)a->type,
	                     (uint64_t)(a->has_type | a->has_f << 1 | a->has_i << 2 | a->has_s << 3),
	                     fbits,
	                     (uint64_t)a->i,
	                     strlen(name),
	                     strlen(ref),
	                     a->has_s ? a->s.len : 0,
	                     a->n_ints,
	                     a->n_floats,
	                     a->n_strings};
	key_put(k, head, sizeof head);
	key_put(k, name, head[5]);
	key_put(k, ref, head[6]);
	if (head[7])
		key_put(k, a->s.data, head[7]);
	if (a->n_ints)
		key_put(k, a->ints, a->n_ints * sizeof *a->ints);
	if (a->n_floats)
		key_put(k, a->floats, a->n_floats * sizeof *a->floats);
	for (size_t i = 0; i < a->n_strings; i++) {
		uint64_t len = a->strings[i].len;
		key_put(k, &len, sizeof len);
		if (len)
			key_put(k, a->strings[i].data, len);
	}
}

static uint64_t hash_bytes(const char *p, size_t n)
{
	return tern_hash_bytes(p, n, 1469598103934665603ull);
}

static bool is_random(const char *domain, const char *op)
{
	if (*domain) /* at every call: by the first letter, then one name or two */
		return false;
	switch (op[0]) {
	case 'R':
		return !strcmp(op, "RandomNormal") || !strcmp(op, "RandomUniform") || !strcmp(op, "RandomNormalLike") ||
		       !strcmp(op, "RandomUniformLike");
	case 'B':
		return !strcmp(op, "Bernoulli");
	case 'M':
		return !strcmp(op, "Multinomial");
	case 'D':
		return !strcmp(op, "Dropout");
	default:
		return false;
	}
}

static entry *cache_find(tern_ctx *c, uint64_t h, const char *key, size_t n)
{
	for (size_t i = h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
		entry *e = c->table[i];
		if (!e)
			return NULL;
		if (e->hash == h && e->key_len == n && memcmp(e->key, key, n) == 0)
			return e;
	}
}

static tern_status cache_insert(tern_ctx *c, entry *e)
{
	if ((c->n + 1) * 2 > c->cap) {
		size_t cap = c->cap * 2;
		entry **t = calloc(cap, sizeof *t);
		if (!t)
			return tern_errorf(TERN_EOS, "out of memory");
		for (size_t i = 0; i < c->cap; i++) {
			entry *x = c->table[i];
			if (!x)
				continue;
			size_t j = x->hash & (cap - 1);
			while (t[j])
				j = (j + 1) & (cap - 1);
			t[j] = x;
		}
		free(c->table);
		c->table = t;
		c->cap = cap;
	}
	size_t j = e->hash & (c->cap - 1);
	while (c->table[j])
		j = (j + 1) & (c->cap - 1);
	c->table[j] = e;
	c->n++;
	return TERN_OK;
}

/* "e<id>_<io><k>" into buf (32 bytes): a new signature's node's value names. */
static void value_name(char *buf, unsigned long long id, char io, unsigned k)
{
	buf[0] = 'e';
	char *p = tern_put_uint(buf + 1, id);
	*p++ = '_';
	*p++ = io;
	tern_put_uint(p, k);
}

/* The node of a new signature: in the scratch graph, inputs and outputs named after the entry. */
static tern_status make_node(tern_ctx *c, const char *domain, const char *op_type, int n_in, const bool *present,
                             int n_out, Onnx__AttributeProto *const *attrs, int n_attrs, tern_node **out)
{
	char names[2][64][32];
	const char *ins[64], *outs[64];
	if (n_in > 64 || n_out > 64)
		return tern_errorf(TERN_EUSAGE, "%s: more than 64 inputs or outputs", op_type);
	unsigned long long id = c->made++;
	for (int i = 0; i < n_in; i++) {
		value_name(names[0][i], id, 'i', (unsigned)i);
		ins[i] = present[i] ? names[0][i] : "";
	}
	for (int o = 0; o < n_out; o++) {
		value_name(names[1][o], id, 'o', (unsigned)o);
		outs[o] = names[1][o];
	}
	if (*domain && tern_model_opset(c->model, domain) < 0) {
		tern_status st = tern_model_import_opset(c->model, domain, 1);
		if (st)
			return st;
	}
	tern_node *n = tern_graph_add_node(c->model->graph, op_type, domain, op_type, ins, (size_t)n_in, outs, (size_t)n_out);
	if (!n)
		return tern_errorf(TERN_EOS, "out of memory");
	if (!*domain)
		n->opset = c->opset;
	Onnx__NodeProto *np = n->proto;
	if (n_attrs) {
		np->attribute = calloc((size_t)n_attrs, sizeof *np->attribute);
		if (!np->attribute)
			return tern_errorf(TERN_EOS, "out of memory");
		for (int k = 0; k < n_attrs; k++) {
			if (!(np->attribute[k] = tern_pb_copy(attrs[k])))
				return tern_errorf(TERN_EOS, "out of memory");
			np->n_attribute++;
		}
	}
	*out = n;
	return TERN_OK;
}

/* The usual number of outputs. */
static int default_outputs(const char *domain, const char *op, Onnx__AttributeProto *const *attrs, int n_attrs,
                           tern_var *const *in, int n_in)
{
	if (*domain)
		return 1;
	if (!strcmp(op, "LSTM") || !strcmp(op, "DynamicQuantizeLinear"))
		return 3;
	if (!strcmp(op, "GRU") || !strcmp(op, "RNN") || !strcmp(op, "TopK"))
		return 2;
	if (!strcmp(op, "Unique"))
		return 4;
	if (!strcmp(op, "Split")) {
		for (int k = 0; k < n_attrs; k++) {
			if (!strcmp(attrs[k]->name, "num_outputs"))
				return (int)attrs[k]->i;
			if (!strcmp(attrs[k]->name, "split"))
				return (int)attrs[k]->n_ints;
		}
		if (n_in > 1 && in[1])
			return (int)tern_tensor_numel(&in[1]->t);
		return 2;
	}
	return 1;
}

/* ---------------------------------------------------------------- running one call */

static tern_status ensure_scratch(tern_ctx *c, size_t n)
{
	return grow_scratch(&c->scratch, &c->scratch_bytes, n);
}

/* Prepares node on tensors in[] (with or without bytes); outputs' shapes into out[]. */
static tern_status prepare(tern_ctx *c, entry *e, tern_tensor **in, tern_tensor **out, tern_prepare_args *p)
{
	memset(p, 0, sizeof *p);
	p->node = e->node;
	p->in = in;
	p->n_in = e->n_in;
	p->out = out;
	p->n_out = e->n_out;
	int64_t elems = 0;
	for (int i = 0; i < e->n_in; i++)
		elems += in[i] && in[i]->dtype != TERN_SEQUENCE && in[i]->dtype != TERN_NONE ? tern_tensor_numel(in[i]) : 0;
	/* on one thread: a context of one (no serial pool), or a small call */
	bool one = !c->serial_pool || elems < EAGER_PARALLEL_ELEMS;
	if (one && c->aq && c->team && elems >= AQ_TEAM_ELEMS)
		e->pool = c->team; /* on the team that sums as one */
	else
		e->pool = one && c->serial_pool ? c->serial_pool : c->pool;
	p->pool = e->pool;
	tern_status st = e->op->prepare(p);
	if (st && p->params && p->free_params) {
		p->free_params(p->params);
		p->params = NULL;
	}
	return st;
}

/* Fresh output tensors outs[] (their shapes set by prepare) for prepared call p, written by the
 * caller's thread (host) or the kernels' (pool_get): false when the call makes none (an alias whose
 * output shares input 0's bytes). */
static tern_status alloc_outputs(tern_ctx *c, entry *e, tern_tensor **in, tern_tensor *outs, const tern_prepare_args *p,
                                 size_t *caps, bool host, bool *any)
{
	*any = false;
	/* an alias (Reshape, Squeeze, Identity, ...): its output shares input 0's bytes (call_protos) */
	if (p->alias_input0 && e->n_out == 1 && in[0] && in[0]->dtype != TERN_STRING)
		return TERN_OK;
	*any = true;
	tern_status st = TERN_OK;
	for (int o = 0; o < e->n_out && !st; o++) {
		if (!outs[o].dtype || p->dynamic_output)
			continue;
		tern_tensor shape = outs[o];
		memset(&outs[o], 0, sizeof outs[o]);
		if (shape.dtype == TERN_STRING) {
			st = tern_tensor_alloc(&outs[o], shape.dtype, shape.rank, shape.dims);
			continue;
		}
		tern_set_shape(&outs[o], shape.dtype, shape.rank, shape.dims);
		outs[o].nbytes = (size_t)tern_tensor_numel(&outs[o]) * tern_dtype_size(shape.dtype);
		if (!(outs[o].data = pool_get(c, outs[o].nbytes, &caps[o], host)))
			st = tern_errorf(TERN_EOS, "out of memory for %zu bytes", outs[o].nbytes);
		else
			outs[o].owns_data = 1;
	}
	return st;
}

/* Runs prepared call p (kernel, params) on in[] into fresh output tensors outs[]. */
static tern_status launch(tern_ctx *c, entry *e, tern_tensor **in, tern_tensor *outs, const tern_prepare_args *p,
                          size_t *caps)
{
	bool any;
	tern_status st = alloc_outputs(c, e, in, outs, p, caps, true, &any);
	if (st || !any)
		return st;
	if (p->alias_input0) {
		if (outs[0].nbytes)
			memcpy(outs[0].data, in[0]->data, outs[0].nbytes);
		return TERN_OK;
	}
	if (p->scratch_bytes)
		st = ensure_scratch(c, p->scratch_bytes);
	if (!st) {
		tern_tensor *out[64] = {NULL};
		for (int o = 0; o < e->n_out; o++)
			out[o] = outs[o].dtype || p->dynamic_output ? &outs[o] : NULL;
		tern_kernel_args a = {e->node, in, e->n_in, out, e->n_out, p->params, c->scratch, e->pool, NULL};
		st = p->kernel(&a);
	}
	return st;
}

/* With asynchronous kernels: the outputs of prepared call p allocated, its kernel left in *job for
 * call_protos to post once the outputs are tensors (job->kernel and ->node set; *deferred). Calls
 * whose outputs only their kernel can size, and string tensors (heap strings the kernel makes), run
 * here once their inputs are ready. */
static tern_status launch_or_defer(tern_ctx *c, entry *e, tern_var *const *in, tern_tensor **inp, tern_tensor *outs,
                                   const tern_prepare_args *p, size_t *caps, ajob *job, bool *deferred)
{
	*deferred = false;
	if (!c->aq)
		return launch(c, e, inp, outs, p, caps);
	bool can = !p->dynamic_output;
	for (int i = 0; i < e->n_in; i++)
		can &= !in[i] || in[i]->t.dtype != TERN_STRING;
	for (int o = 0; o < e->n_out; o++)
		can &= tern_dtype_plain(outs[o].dtype);
	/* a few integers (a shape being computed, a count) from inputs that are ready, or from only
	 * their shapes: made here, so that a call prepared on their values (Reshape, Expand, Slice) need
	 * not wait for the thread */
	const char *op = e->node->op_type; /* at every call: a letter first, two strcmp were 2 % of it */
	bool meta = op[0] == 'S' && (!strcmp(op, "Shape") || !strcmp(op, "Size"));
	/* nothing in flight and little to do: run it here (handing a small call to the thread and back
	 * moves cache lines between the cores, more than the call's own work costs). Known from the
	 * count of calls run as last read (after a wait, at a reap), not read again here: the thread
	 * writes it after every call, and reading it at every call took its line from the thread's core
	 * each time (50 to 1080 ns a round trip between the two cores of a virtual machine, as its host
	 * moves them) */
	if (can && c->aq->seen == c->aq->issued) {
		int64_t work = 0;
		for (int i = 0; i < e->n_in; i++)
			work += in[i] ? tern_tensor_numel(&in[i]->t) : 0;
		for (int o = 0; o < e->n_out; o++)
			work += outs[o].dtype ? tern_tensor_numel(&outs[o]) : 0;
		if (work <= AQ_INLINE_ELEMS)
			return launch(c, e, inp, outs, p, caps);
	}
	bool small = can && !p->alias_input0;
	int64_t elems = 0;
	for (int o = 0; o < e->n_out; o++)
		if (outs[o].dtype) {
			small &= outs[o].dtype == TERN_INT64 || outs[o].dtype == TERN_INT32 || outs[o].dtype == TERN_BOOL;
			elems += tern_tensor_numel(&outs[o]);
		}
	uint64_t done = small && !meta ? c->aq->seen : 0;
	for (int i = 0; i < e->n_in && small && !meta; i++)
		small &= !in[i] || !in[i]->st || in[i]->st->write_seq <= done;
	if (!can || (small && elems <= 64)) {
		for (int i = 0; i < e->n_in && !meta; i++)
			if (in[i])
				storage_wait(c, in[i]->st, 0);
		return launch(c, e, inp, outs, p, caps);
	}
	bool any;
	tern_status st = alloc_outputs(c, e, inp, outs, p, caps, false, &any);
	if (st || !any)
		return st;
	job->free_params = NULL;
	job->block = NULL;
	if ((st = ajob_alloc(job, e->n_in, e->n_out)))
		return st;
	job->kernel = p->alias_input0 ? NULL : p->kernel;
	job->params = p->params;
	job->node = e->node;
	job->pool = e->pool;
	job->scratch_bytes = p->scratch_bytes;
	for (int i = 0; i < e->n_in; i++)
		if (inp[i]) {
			job->t[i] = *inp[i];
			job->t[i].owns_data = 0;
			job->t[i].name = NULL;
			job->pt[i] = &job->t[i];
		}
	for (int o = 0; o < e->n_out; o++)
		if (outs[o].dtype) {
			job->t[e->n_in + o] = outs[o];
			job->t[e->n_in + o].owns_data = 0;
			job->t[e->n_in + o].name = NULL;
			job->pt[e->n_in + o] = &job->t[e->n_in + o];
		}
	*deferred = true;
	return TERN_OK;
}

static Onnx__AttributeProto *find_attr(Onnx__NodeProto *np, const char *name)
{
	for (size_t k = 0; k < np->n_attribute; k++)
		if (!strcmp(np->attribute[k]->name, name))
			return np->attribute[k];
	return NULL;
}

/* A random operator's seed for this call: the caller's, or the next of the context's stream. */
static tern_status reseed(tern_ctx *c, entry *e, bool given)
{
	if (given)
		return TERN_OK;
	Onnx__AttributeProto *a = find_attr(e->node->proto, "seed");
	bool dropout = !strcmp(e->node->op_type, "Dropout");
	if (!a) {
		tern_status st = dropout ? tern_node_add_attr_int(e->node, "seed", 0) : tern_node_add_attr_float(e->node, "seed", 0);
		if (st)
			return st;
		a = find_attr(e->node->proto, "seed");
	}
	uint64_t r = next_random(c);
	if (dropout) {
		a->i = (int64_t)(r >> 33);
	} else {
		a->f = (float)(r >> 41); /* exact in a float: 23 bits */
	}
	return TERN_OK;
}

static tern_status record(tern_ctx *c, entry *e, tern_var *const *in, tern_var **outs)
{
	/* one block: the node, then its inputs, outputs and output gradients */
	size_t slots = (size_t)e->n_in + 1 + 2 * ((size_t)e->n_out + 1);
	tape_node *n = calloc(1, sizeof *n + slots * sizeof(tern_var *));
	if (!n)
		return tern_errorf(TERN_EOS, "out of memory");
	n->refs = 0;
	n->e = e;
	n->n_in = e->n_in;
	n->n_out = e->n_out;
	n->in = (tern_var **)(n + 1);
	n->out = n->in + e->n_in + 1;
	n->dy = n->out + e->n_out + 1;
	for (int i = 0; i < e->n_in; i++)
		n->in[i] = tern_var_ref(in[i]);
	for (int o = 0; o < e->n_out; o++) {
		if (!outs[o])
			continue;
		n->out[o] = var_share(outs[o], NULL);
		int dt = outs[o]->t.dtype;
		if (dt == TERN_FLOAT || dt == TERN_DOUBLE || dt == TERN_FLOAT16 || dt == TERN_BFLOAT16) {
			outs[o]->requires_grad = 1;
			outs[o]->fn = n;
			outs[o]->fn_out = o;
			n->refs++;
		}
	}
	(void)c;
	if (!n->refs)
		tape_unref((n->refs = 1, n));
	return TERN_OK;
}

/* Required inputs present: for ONNX operators as their schema says (prepare functions take those for
 * granted), for tern's backward and fused operators their least counts. An ONNX operator's
 * attributes must be its schema's (a misspelt one would silently be its default). */
static tern_status check_inputs(tern_ctx *c, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                                Onnx__AttributeProto *const *attrs, int n_attrs)
{
	int min = 0;
	uint32_t required = 0;
	if (!*domain || !strcmp(domain, "ai.onnx.ml")) {
		const tern_arity *a = tern_arity_find(domain, op_type, *domain ? 5 : c->opset);
		if (a) {
			min = a->min_inputs;
			required = a->required;
			for (int k = 0; k < n_attrs; k++) {
				const char *name = attrs[k]->name ? attrs[k]->name : "";
				size_t len = strlen(name);
				const char *at = a->attributes;
				while ((at = strstr(at, name)) && len && !(at[-1] == ' ' && at[len] == ' '))
					at++;
				if (!len || !at)
					return tern_errorf(TERN_EUSAGE, "%s%s%s: unknown attribute '%s' (%s-%d has:%s)", domain,
					                   *domain ? "." : "", op_type, name, op_type, a->since_version,
					                   a->attributes[1] ? a->attributes : " none");
			}
		}
	} else if (!strcmp(domain, "tern")) {
		static const struct {
			const char *op;
			int min;
		} least[] = {{"ConvGradInput", 3}, {"ConvGradWeight", 3}, {"GroupNormGrad", 4}, {"LayerNormGrad", 3}, {"DropoutGrad", 4},
		             {"FusedConv", 2},     {"FusedGemm", 2},      {"FusedMatMul", 2},  {"Inverse", 1},
		             {"SGD", 3},           {"Adam", 6},           {"Adagrad", 5},      {"SGDRows", 4},
		             {"AdamRows", 7},      {"AdagradRows", 6},    {"RowsSumSquare", 2}};
		size_t len = strlen(op_type);
		min = len > 4 && !strcmp(op_type + len - 4, "Grad") ? 2 : 1;
		for (size_t k = 0; k < TERN_ARRAY_LEN(least); k++)
			if (!strcmp(least[k].op, op_type))
				min = least[k].min;
		required = min >= 32 ? ~0u : (1u << min) - 1;
	}
	if (n_in < min)
		return tern_errorf(TERN_EUSAGE, "%s%s%s: %d inputs given; it needs at least %d", domain, *domain ? "." : "",
		                   op_type, n_in, min);
	for (int i = 0; i < n_in && i < 32; i++)
		if ((required >> i & 1u) && !in[i])
			return tern_errorf(TERN_EUSAGE, "%s%s%s: input %d is required", domain, *domain ? "." : "", op_type, i);
	return TERN_OK;
}

/* The call, with attributes as protos; record: put it on the tape when an input requires a gradient. */
static tern_status call_protos(tern_ctx *c, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                               Onnx__AttributeProto *const *attrs, int n_attrs, tern_var **outv, int n_out, bool record_ok)
{
	if (c->closed)
		return closed_error();
	if (!strcmp(domain, "ai.onnx"))
		domain = "";
	for (int o = 0; o < (n_out > 0 ? n_out : 0); o++)
		outv[o] = NULL;
	if (c->aq) {
		if (c->aq->issued - c->aq->reaped >= AQ_REAP)
			aq_reap(c);
		tern_status rs = aq_report(c->aq);
		if (rs)
			return rs;
	}
	ajob job;
	bool deferred = false;
	if (c->trace) {
		bool handled;
		tern_status rs = tern_trace_replay(c, attrs, n_attrs, in, n_in, outv, n_out, &handled);
		if (rs || handled)
			return rs;
	}
	if (n_in > 64)
		return tern_errorf(TERN_EUSAGE, "%s: more than 64 inputs", op_type);
	for (int i = 0; i < n_in; i++)
		if (in[i] && (in[i]->ctx != c || in[i]->ctx->closed))
			return in[i]->ctx->closed ? closed_error()
			                          : tern_errorf(TERN_EUSAGE, "%s: input %d belongs to another context", op_type, i);
	if (n_out < 0)
		n_out = default_outputs(domain, op_type, attrs, n_attrs, in, n_in);
	if (n_out < 1 || n_out > 64)
		return tern_errorf(TERN_EUSAGE, "%s: %d outputs asked for", op_type, n_out);
	bool random = is_random(domain, op_type), seed_given = false;
	for (int k = 0; k < n_attrs; k++)
		seed_given |= !strcmp(attrs[k]->name, "seed");

	/* the signature */
	keybuf k;
	key_init(&k);
	key_str(&k, domain);
	key_str(&k, op_type);
	key_put(&k, &c->opset, sizeof c->opset);
	key_put(&k, &n_out, sizeof n_out);
	for (int a = 0; a < n_attrs; a++) {
		if (random && !strcmp(attrs[a]->name, "seed"))
			continue;
		key_attr(&k, attrs[a]);
	}
	for (int i = 0; i < n_in; i++) {
		int present = in[i] != NULL;
		key_put(&k, &present, sizeof present);
		if (!present)
			continue;
		key_put(&k, &in[i]->t.dtype, sizeof in[i]->t.dtype);
		key_put(&k, &in[i]->t.rank, sizeof in[i]->t.rank);
		key_put(&k, in[i]->t.dims, (size_t)in[i]->t.rank * sizeof *in[i]->t.dims);
	}
	if (k.failed) {
		key_free(&k);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	/* of these arrays only the first n_in (n_out) are read: clearing all 64 had been 6 % of a deferred call */
	tern_tensor views[64], *inp[64];
	for (int i = 0; i < n_in; i++) {
		inp[i] = NULL;
		if (!in[i])
			continue;
		views[i] = in[i]->t;
		inp[i] = &views[i];
	}
	tern_status st = TERN_OK;
	uint64_t h = hash_bytes(k.p, k.n);
	entry *e = cache_find(c, h, k.p, k.n);
	tern_tensor outs[64];
	size_t caps[64]; /* outputs from the pool: their size class */
	memset(caps, 0, (size_t)n_out * sizeof *caps);
	memset(outs, 0, (size_t)n_out * sizeof *outs);
	tern_prepare_args p;
	tern_tensor *outp[64];
	for (int o = 0; o < n_out; o++)
		outp[o] = &outs[o];
	if (e && !e->per_call) {
		/* the prepared call */
		c->hits++;
		key_free(&k);
		for (int o = 0; o < n_out; o++)
			outs[o] = e->out_shape[o];
		memset(&p, 0, sizeof p);
		p.kernel = e->kernel;
		p.params = e->params;
		p.scratch_bytes = e->scratch_bytes;
		p.dynamic_output = e->dynamic_output;
		p.alias_input0 = e->alias;
		st = launch_or_defer(c, e, in, inp, outs, &p, caps, &job, &deferred);
	} else {
		c->misses++;
		const tern_op *op = e ? e->op : tern_op_find(domain, op_type, *domain ? 1 : c->opset);
		if (!op) {
			key_free(&k);
			return tern_errorf(TERN_EUSAGE, "%s%s%s: %s", domain, *domain ? "." : "", op_type,
			                   tern_op_known(domain, op_type) ? "not implemented at this opset" : "unknown operator");
		}
		if (!e && (st = check_inputs(c, domain, op_type, in, n_in, attrs, n_attrs))) {
			key_free(&k);
			return st;
		}
		if (!e) {
			e = calloc(1, sizeof *e);
			bool present[64];
			for (int i = 0; i < n_in; i++)
				present[i] = in[i] != NULL;
			if (!e)
				st = tern_errorf(TERN_EOS, "out of memory");
			if (!st && !(e->key = malloc(k.n ? k.n : 1)))
				st = tern_errorf(TERN_EOS, "out of memory");
			if (!st) {
				e->hash = h;
				memcpy(e->key, k.p, k.n);
				e->key_len = k.n;
				e->op = op;
				e->n_in = n_in;
				e->n_out = n_out;
				e->random = random;
				st = make_node(c, domain, op_type, n_in, present, n_out, attrs, n_attrs, &e->node);
			}
			if (!st && e->node->n_subgraphs)
				st = tern_errorf(TERN_EUSAGE, "%s: operators with subgraphs do not run one at a time", op_type);
			if (!st && !(e->out_shape = calloc((size_t)n_out, sizeof *e->out_shape)))
				st = tern_errorf(TERN_EOS, "out of memory");
			/* a first prepare without the inputs' bytes: reusable unless it needs them */
			if (!st && !random) {
				tern_tensor blind[64], *bp[64] = {NULL};
				for (int i = 0; i < n_in; i++)
					if (inp[i]) {
						blind[i] = *inp[i];
						blind[i].data = NULL;
						bp[i] = &blind[i];
					}
				st = prepare(c, e, bp, outp, &p);
				if (!st && p.defer) {
					e->per_call = 1;
					if (p.params && p.free_params)
						p.free_params(p.params);
				} else if (!st) {
					e->kernel = p.kernel;
					e->params = p.params;
					e->free_params = p.free_params;
					e->scratch_bytes = p.scratch_bytes;
					e->dynamic_output = p.dynamic_output;
					e->alias = p.alias_input0;
					if (!e->kernel && !e->alias)
						st = tern_errorf(TERN_EINTERNAL, "%s: prepare chose no kernel", op_type);
					for (int o = 0; o < n_out; o++)
						e->out_shape[o] = outs[o];
				}
			} else if (!st) {
				e->per_call = 1;
			}
			if (!st)
				st = cache_insert(c, e);
			if (st) {
				/* the node goes: a program that retries failing calls must not grow */
				if (e && e->node) {
					tern_graph_remove_node(c->model->graph, e->node);
					tern_model_sync(c->model);
				}
				if (e && e->params && e->free_params)
					e->free_params(e->params);
				if (e) {
					free(e->out_shape);
					free(e->key);
					free(e);
				}
				key_free(&k);
				return st;
			}
		}
		key_free(&k);
		if (e->per_call) {
			/* prepared now, on the inputs' values */
			if (c->aq && e->random && e->last_seq) { /* its node's seed changes: not under a call in flight */
				aq_wait(c->aq, e->last_seq);
				aq_reap(c);
			}
			if (e->random)
				st = reseed(c, e, seed_given);
			memset(outs, 0, (size_t)n_out * sizeof *outs);
			if (!st && c->aq) {
				/* the inputs still being computed are given without their bytes, as to a plan's
				 * prepare, and waited for only if it asks (a Reshape reads its shape, not its data;
				 * a random operator seldom reads either) */
				tern_tensor blind[64], *bp[64] = {NULL};
				uint64_t done = atomic_load(&c->aq->done);
				for (int i = 0; i < n_in; i++)
					if (inp[i]) {
						blind[i] = *inp[i];
						if (in[i]->st && in[i]->st->write_seq > done)
							blind[i].data = NULL;
						bp[i] = &blind[i];
					}
				st = prepare(c, e, bp, outp, &p);
				if (!st && p.defer && p.params && p.free_params)
					p.free_params(p.params);
				if (!st && p.defer)
					memset(outs, 0, (size_t)n_out * sizeof *outs);
				else
					goto prepared;
			}
			if (!st && c->aq)
				for (int i = 0; i < n_in; i++)
					if (in[i])
						storage_wait(c, in[i]->st, 0);
			if (!st)
				st = prepare(c, e, inp, outp, &p);
		prepared:
			if (!st && p.defer)
				st = tern_errorf(TERN_EINTERNAL, "%s: prepare deferred although every input is known", op_type);
			if (!st)
				st = launch_or_defer(c, e, in, inp, outs, &p, caps, &job, &deferred);
			if (deferred)
				job.free_params = p.free_params; /* the job's now: freed once it has run */
			else if (p.params && p.free_params)
				p.free_params(p.params);
		} else if (!st) {
			for (int o = 0; o < n_out; o++)
				outs[o] = e->out_shape[o];
			st = launch_or_defer(c, e, in, inp, outs, &p, caps, &job, &deferred);
		}
	}
	for (int o = 0; !st && o < n_out; o++)
		if (outs[o].dtype == TERN_SEQUENCE || outs[o].dtype == TERN_NONE)
			st = tern_errorf(TERN_EUSAGE, "%s: output %d is a %s, which the eager API does not hold", op_type, o,
			                 outs[o].dtype == TERN_SEQUENCE ? "sequence" : "optional");
	bool shares = !st && n_out == 1 && outs[0].dtype && !outs[0].data && in[0] && in[0]->t.dtype != TERN_STRING &&
	              p.alias_input0;
	if (shares) {
		/* the alias's output: input 0's bytes in the output's shape */
		tern_tensor shape = outs[0];
		if (!(outv[0] = var_share(in[0], &shape)))
			st = tern_errorf(TERN_EOS, "out of memory");
		memset(&outs[0], 0, sizeof outs[0]);
	}
	for (int o = shares ? 1 : 0; !st && o < n_out; o++) {
		if (!outs[o].dtype)
			continue;
		if ((outv[o] = var_adopt(c, &outs[o])) && caps[o])
			outv[o]->st->pooled = caps[o];
		if (!outv[o])
			st = tern_errorf(TERN_EOS, "out of memory");
	}
	if (st) {
		if (deferred) {
			if (job.free_params && job.params)
				job.free_params(job.params);
			free(job.block);
		}
		for (int o = 0; o < n_out; o++) {
			tern_tensor_free(&outs[o]);
			tern_var_unref(outv[o]);
			outv[o] = NULL;
		}
		return st;
	}
	if (deferred) {
		aq_post(c, &job, in, n_in, outv, n_out);
		e->last_seq = c->aq->issued;
	}
	if (c->trace)
		/* a random call's key leaves out the seed the caller gave: then it is no signature */
		(void)tern_trace_op(c, domain, op_type, attrs, n_attrs, in, n_in, outv, n_out,
		                    random && seed_given ? 0 : h); /* failures stop the trace */
	bool wants = false;
	for (int i = 0; i < n_in; i++)
		wants |= in[i] && in[i]->requires_grad;
	if (record_ok && c->grad_enabled && wants)
		st = record(c, e, in, outv);
	return st;
}

/* ---------------------------------------------------------------- the public call */

static Onnx__AttributeProto *make_attr(const tern_attr_arg *a, tern_status *st)
{
	Onnx__AttributeProto *p = malloc(sizeof *p);
	if (!p) {
		*st = tern_errorf(TERN_EOS, "out of memory");
		return NULL;
	}
	onnx__attribute_proto__init(p);
	p->name = tern_strdup(a->name ? a->name : "");
	p->has_type = 1;
	*st = TERN_OK;
	switch (a->kind) {
	case TERN_ATTR_INT:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
		p->has_i = 1;
		p->i = a->i;
		break;
	case TERN_ATTR_FLOAT:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
		p->has_f = 1;
		p->f = (float)a->f;
		break;
	case TERN_ATTR_STRING:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
		p->has_s = 1;
		p->s.len = a->s ? strlen(a->s) : 0;
		p->s.data = (uint8_t *)tern_strdup(a->s ? a->s : "");
		break;
	case TERN_ATTR_INTS:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
		p->ints = malloc((a->n ? a->n : 1) * sizeof *p->ints);
		if (p->ints && a->n)
			memcpy(p->ints, a->ints, a->n * sizeof *p->ints);
		p->n_ints = a->n;
		break;
	case TERN_ATTR_FLOATS:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
		p->floats = malloc((a->n ? a->n : 1) * sizeof *p->floats);
		for (size_t i = 0; p->floats && i < a->n; i++)
			p->floats[i] = (float)a->floats[i];
		p->n_floats = a->n;
		break;
	case TERN_ATTR_STRINGS:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS;
		p->strings = calloc(a->n ? a->n : 1, sizeof *p->strings);
		for (size_t i = 0; p->strings && i < a->n; i++) {
			p->strings[i].len = strlen(a->strings[i]);
			p->strings[i].data = (uint8_t *)tern_strdup(a->strings[i]);
			p->n_strings++;
		}
		break;
	case TERN_ATTR_TENSOR:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
		p->t = malloc(sizeof *p->t);
		if (p->t) {
			onnx__tensor_proto__init(p->t);
			if (!a->t)
				*st = tern_errorf(TERN_EUSAGE, "attribute '%s': no tensor given", p->name);
			else
				*st = tern_tensor_to_proto(a->t, p->t);
		}
		break;
	default: *st = tern_errorf(TERN_EUSAGE, "attribute '%s': unknown kind %d", p->name, a->kind); break;
	}
	if (!*st && !p->name)
		*st = tern_errorf(TERN_EOS, "out of memory");
	if (*st) {
		onnx__attribute_proto__free_unpacked(p, NULL);
		return NULL;
	}
	return p;
}

tern_status tern_call(tern_ctx *c, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                      const tern_attr_arg *attrs, int n_attrs, tern_var **out, int n_out)
{
	Onnx__AttributeProto *protos[64] = {0};
	if (n_attrs > 64)
		return tern_errorf(TERN_EUSAGE, "%s: more than 64 attributes", op_type);
	tern_status st = TERN_OK;
	int made = 0;
	for (; made < n_attrs && !st; made++)
		if (!(protos[made] = make_attr(&attrs[made], &st)))
			break;
	SITE_ENTER(c);
	if (!st)
		st = call_protos(c, domain ? domain : "", op_type, in, n_in, protos, n_attrs, out, n_out, true);
	SITE_LEAVE(c);
	for (int k = 0; k < made && k < n_attrs; k++)
		if (protos[k])
			onnx__attribute_proto__free_unpacked(protos[k], NULL);
	return st;
}

tern_status tern_eager_call_protos(tern_ctx *c, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                                   Onnx__AttributeProto *const *attrs, int n_attrs, tern_var **out, int n_out)
{
	return call_protos(c, domain, op_type, in, n_in, attrs, n_attrs, out, n_out, true);
}

tern_status tern_call_node(tern_ctx *c, const tern_node *node, tern_var *const *in, tern_var **out)
{
	int64_t keep = c->opset;
	if (!*node->domain && node->opset > 0)
		c->opset = node->opset;
	tern_status st = call_protos(c, node->domain, node->op_type, in, (int)node->n_inputs, node->proto->attribute,
	                             (int)node->proto->n_attribute, out, (int)node->n_outputs, true);
	c->opset = keep;
	return st;
}

int tern_op_outputs(const char *domain, const char *op_type, const tern_attr_arg *attrs, int n_attrs, tern_var *const *in,
                    int n_in)
{
	Onnx__AttributeProto *protos[64] = {0};
	int n = 0;
	tern_status st = TERN_OK;
	for (; n < n_attrs && n < 64; n++)
		if (!(protos[n] = make_attr(&attrs[n], &st)))
			break;
	int r = default_outputs(domain && strcmp(domain, "ai.onnx") ? domain : "", op_type, protos, n, in, n_in);
	for (int k = 0; k < n; k++)
		if (protos[k])
			onnx__attribute_proto__free_unpacked(protos[k], NULL);
	return r;
}

/* ---------------------------------------------------------------- the eager builder (lib/autodiff) */

/* What the builder of a gradient rule holds in eager mode: the context, and every tensor the rule
 * made, released when it is done. */
typedef struct eager_rule {
	tern_ctx *ctx;
	tern_var **made;
	size_t n, cap;
} eager_rule;

static tern_status keep(eager_rule *r, tern_var *v)
{
	if (!tern_grow((void **)&r->made, &r->cap, r->n + 1, sizeof *r->made)) {
		tern_var_unref(v);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	r->made[r->n++] = v;
	return TERN_OK;
}

static Onnx__AttributeProto *gattr_proto(const tern_gattr *a, tern_status *st)
{
	tern_attr_arg x = {.name = a->name};
	double fl[64];
	switch (a->type) {
	case TERN_GA_INT: x.kind = TERN_ATTR_INT, x.i = a->i; break;
	case TERN_GA_FLOAT: x.kind = TERN_ATTR_FLOAT, x.f = a->f; break;
	case TERN_GA_INTS: x.kind = TERN_ATTR_INTS, x.ints = a->ints, x.n = a->n; break;
	case TERN_GA_FLOATS:
		x.kind = TERN_ATTR_FLOATS;
		x.n = a->n < 64 ? a->n : 64;
		for (size_t i = 0; i < x.n; i++)
			fl[i] = a->floats[i];
		x.floats = fl;
		break;
	case TERN_GA_STRING: x.kind = TERN_ATTR_STRING, x.s = a->s; break;
	case TERN_GA_STRINGS:
		/* only the gradients of kept calls emit lists of strings, and the eager API makes none */
		*st = tern_errorf(TERN_EINTERNAL, "attribute '%s': a list of strings in eager mode", a->name);
		return NULL;
	}
	return make_attr(&x, st);
}

tern_status tern_eager_emit(void *rule, const tern_node *forward, const char *domain, const char *op_type,
                            tern_gval *const *in, int n_in, const tern_gattr *attrs, int n_attrs, bool like,
                            tern_gval **out, int n_out)
{
	eager_rule *r = rule;
	Onnx__AttributeProto *protos[96];
	int n = 0;
	tern_status st = TERN_OK;
	if (like && forward) {
		for (size_t k = 0; k < forward->proto->n_attribute && n < 64; k++)
			protos[n++] = forward->proto->attribute[k];
	}
	int first_own = n;
	for (int k = 0; k < n_attrs && n < 96 && !st; k++)
		if ((protos[n] = gattr_proto(&attrs[k], &st)))
			n++;
	tern_var *outs[8] = {NULL};
	if (!st)
		st = call_protos(r->ctx, domain ? domain : "", op_type, (tern_var *const *)in, n_in, protos, n, outs, n_out,
		                 false);
	for (int k = first_own; k < n; k++)
		onnx__attribute_proto__free_unpacked(protos[k], NULL);
	for (int o = 0; o < n_out; o++) {
		if (out)
			out[o] = (tern_gval *)outs[o];
		if (outs[o] && !st)
			st = keep(r, outs[o]);
		else if (outs[o])
			tern_var_unref(outs[o]);
	}
	return st;
}

tern_gval *tern_eager_constant(void *rule, const tern_tensor *t)
{
	eager_rule *r = rule;
	tern_var *v = NULL;
	if (tern_var_from(r->ctx, t->dtype, t->rank, t->dims, t->data, &v) || keep(r, v))
		return NULL;
	v->ts.born = 0; /* a rule's constant: to the tracer, a constant like those made before tracing */
	return (tern_gval *)v;
}

const tern_tensor *tern_eager_gval_tensor(const tern_gval *v)
{
	return &((const tern_var *)v)->t;
}

/* ---------------------------------------------------------------- backward */

/* grad += d (both references kept by the caller; *acc replaced by a new reference) */
static tern_status accumulate(tern_ctx *c, tern_var **acc, tern_var *d)
{
	if (!*acc) {
		*acc = tern_var_ref(d);
		return TERN_OK;
	}
	tern_var *in[2] = {*acc, d}, *sum = NULL;
	tern_status st = call_protos(c, "", "Add", in, 2, NULL, 0, &sum, 1, false);
	if (st)
		return st;
	tern_var_unref(*acc);
	*acc = sum;
	return TERN_OK;
}

typedef struct order {
	tape_node **n;
	size_t len, cap;
} order;

/* Post-order of the tape below root (iterative: deep models make deep tapes); every node visited is
 * marked, held (a reference) and listed in seen. */
static tern_status topo(tape_node *root, order *ord, order *seen)
{
	typedef struct frame {
		tape_node *n;
		int next;
	} frame;
	frame *stack = NULL;
	size_t depth = 0, cap = 0;
	if (!tern_grow((void **)&stack, &cap, 1, sizeof *stack) ||
	    !tern_grow((void **)&seen->n, &seen->cap, seen->len + 1, sizeof *seen->n)) {
		free(stack);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	stack[depth++] = (frame){root, 0};
	root->refs++;
	root->marked = 1;
	seen->n[seen->len++] = root;
	tern_status st = TERN_OK;
	while (depth) {
		frame *f = &stack[depth - 1];
		if (f->next < f->n->n_in) {
			tern_var *x = f->n->in[f->next++];
			tape_node *m = x ? x->fn : NULL;
			if (!m || m->released || m->marked)
				continue;
			if (!tern_grow((void **)&stack, &cap, depth + 1, sizeof *stack) ||
			    !tern_grow((void **)&seen->n, &seen->cap, seen->len + 1, sizeof *seen->n)) {
				st = tern_errorf(TERN_EOS, "out of memory");
				break;
			}
			m->refs++;
			m->marked = 1;
			seen->n[seen->len++] = m;
			stack[depth++] = (frame){m, 0};
			continue;
		}
		if (!tern_grow((void **)&ord->n, &ord->cap, ord->len + 1, sizeof *ord->n)) {
			st = tern_errorf(TERN_EOS, "out of memory");
			break;
		}
		ord->n[ord->len++] = f->n;
		depth--;
	}
	free(stack);
	return st;
}

tern_status tern_grad_ctx_open(tern_model *m, tern_grad_ctx *ctx);
void tern_grad_ctx_close(tern_grad_ctx *ctx);
tern_status tern_grad_run_eager(void *rule, const tern_node *forward, tern_grad_ctx *ctx);

static tern_status backward_impl(tern_var *y, tern_var *seed);

tern_status tern_backward(tern_var *y, tern_var *seed)
{
	tern_ctx *c = y->ctx;
	SITE_ENTER(c);
	tern_status st = backward_impl(y, seed);
	SITE_LEAVE(c);
	return st;
}

static tern_status backward_impl(tern_var *y, tern_var *seed)
{
	tern_ctx *c = y->ctx;
	if (c->closed)
		return closed_error();
	if (!y->requires_grad)
		return tern_errorf(TERN_EUSAGE, "backward: the tensor does not require a gradient (no parameter led to it, or it "
		                                "was computed under no_grad)");
	char shape[160];
	if (!seed && tern_tensor_numel(&y->t) != 1)
		return tern_errorf(TERN_EUSAGE, "backward on a tensor of shape %s needs a gradient (only a one-element tensor "
		                                "has an implicit one)",
		                   tern_shape_str(y->t.dtype, y->t.rank, y->t.dims, shape, sizeof shape));
	if (seed && (seed->t.dtype != y->t.dtype || tern_tensor_numel(&seed->t) != tern_tensor_numel(&y->t)))
		return tern_errorf(TERN_EUSAGE, "backward: the gradient given is %s, the tensor %s",
		                   tern_shape_str(seed->t.dtype, seed->t.rank, seed->t.dims, shape, sizeof shape),
		                   tern_shape_str(y->t.dtype, y->t.rank, y->t.dims, shape + 80, 80));
	tern_var *one = NULL;
	tern_status st = TERN_OK;
	if (!seed) {
		st = tern_var_new(c, y->t.dtype, y->t.rank, y->t.dims, &one);
		if (st)
			return st;
		one->ts.born = 0; /* the seed of ones: a constant to the tracer */
		tern_tensor *t = &one->t;
		switch (t->dtype) {
		case TERN_DOUBLE: *(double *)t->data = 1; break;
		case TERN_FLOAT16: *(uint16_t *)t->data = tern_f32_to_f16(1.0f); break;
		case TERN_BFLOAT16: *(uint16_t *)t->data = tern_f32_to_bf16(1.0f); break;
		default: *(float *)t->data = 1; break;
		}
		seed = one;
	}
	int was = tern_ctx_set_grad_enabled(c, 0);
	if (!y->fn) {
		/* a leaf: its own gradient */
		st = accumulate(c, &y->grad, seed);
		tern_var_unref(one);
		tern_ctx_set_grad_enabled(c, was);
		return st;
	}
	if (y->fn->released) {
		tern_var_unref(one);
		tern_ctx_set_grad_enabled(c, was);
		return tern_errorf(TERN_EUSAGE, "backward through operations whose tape a backward has released already");
	}
	order ord = {0}, seen = {0};
	st = topo(y->fn, &ord, &seen);
	if (!st)
		st = accumulate(c, &y->fn->dy[y->fn_out], seed);
	/* reverse post-order: every consumer before its producers */
	for (size_t k = ord.len; !st && k-- > 0;) {
		tape_node *n = ord.n[k];
		bool flows = false;
		for (int o = 0; o < n->n_out; o++)
			flows |= n->dy[o] != NULL;
		bool wants[64] = {false}, wanted = false;
		for (int i = 0; i < n->n_in; i++) {
			wants[i] = n->in[i] && n->in[i]->requires_grad;
			wanted |= wants[i];
		}
		if (!flows || !wanted)
			continue;
		const tern_node *fwd = n->e->node;
		if (!n->e->op->grad) {
			st = tern_errorf(TERN_EDATA, "%s: no gradient rule", fwd->op_type);
			break;
		}
		tern_gval *x[64], *yv[64], *dy[64], *dx[64] = {NULL};
		for (int i = 0; i < n->n_in; i++)
			x[i] = (tern_gval *)n->in[i];
		for (int o = 0; o < n->n_out; o++) {
			yv[o] = (tern_gval *)n->out[o];
			dy[o] = (tern_gval *)n->dy[o];
		}
		eager_rule r = {c, NULL, 0, 0};
		tern_grad_ctx gc = {fwd, n->n_in, n->n_out, x, yv, dy, wants, dx, NULL};
		st = tern_grad_run_eager(&r, fwd, &gc);
		for (int i = 0; !st && i < n->n_in; i++) {
			if (!wants[i] || !dx[i])
				continue;
			tern_var *in = n->in[i], *d = (tern_var *)dx[i];
			if (tern_tensor_numel(&d->t) != tern_tensor_numel(&in->t) || d->t.dtype != in->t.dtype) {
				char a[160], b[160];
				st = tern_errorf(TERN_EINTERNAL, "%s: the gradient of input %d is %s, the input %s", fwd->op_type, i,
				                 tern_shape_str(d->t.dtype, d->t.rank, d->t.dims, a, sizeof a),
				                 tern_shape_str(in->t.dtype, in->t.rank, in->t.dims, b, sizeof b));
				break;
			}
			tern_var *shaped = d;
			if (d->t.rank != in->t.rank || memcmp(d->t.dims, in->t.dims, (size_t)in->t.rank * sizeof *in->t.dims)) {
				tern_tensor shape = in->t;
				shaped = var_share(d, &shape);
				if (!shaped) {
					st = tern_errorf(TERN_EOS, "out of memory");
					break;
				}
			} else {
				tern_var_ref(shaped);
			}
			if (in->fn && !in->fn->released)
				st = accumulate(c, &in->fn->dy[in->fn_out], shaped);
			else if (!in->fn)
				st = accumulate(c, &in->grad, shaped);
			tern_var_unref(shaped);
		}
		for (size_t m = 0; m < r.n; m++)
			tern_var_unref(r.made[m]);
		free(r.made);
	}
	/* the tape below y is spent */
	for (size_t k = 0; k < seen.len; k++) {
		tape_release_links(seen.n[k]);
		tape_unref(seen.n[k]);
	}
	free(seen.n);
	free(ord.n);
	tern_var_unref(one);
	tern_ctx_set_grad_enabled(c, was);
	return st;
}

/* ---------------------------------------------------------------- optimizers */

struct tern_optim {
	tern_ctx *ctx;
	tern_optim_options o;
	int kind; /* 0 sgd, 1 adam, 2 adagrad */
	int decoupled;
	int n;
	tern_var **params;
	tern_var **state[2];
	tern_var *lr, *t;
	int64_t steps;
	int64_t *param_steps; /* per parameter, as torch.optim: a step without its gradient does not count */
};

tern_status tern_optim_create(tern_ctx *c, const tern_optim_options *o, tern_var *const *params, int n,
                              tern_optim **out)
{
	*out = NULL;
	const char *kind = o->kind ? o->kind : "sgd";
	int k = !strcmp(kind, "sgd") ? 0 : !strcmp(kind, "adam") || !strcmp(kind, "adamw") ? 1 : !strcmp(kind, "adagrad") ? 2 : -1;
	if (k < 0)
		return tern_errorf(TERN_EUSAGE, "unknown optimizer '%s' (sgd, adam, adamw or adagrad)", kind);
	for (int i = 0; i < n; i++)
		if (!params[i] || params[i]->fn || params[i]->ctx != c ||
		    (params[i]->t.dtype != TERN_FLOAT && params[i]->t.dtype != TERN_DOUBLE))
			return tern_errorf(TERN_EUSAGE, "optimizer: parameter %d is not a float or double leaf tensor of this context", i);
	tern_optim *p = calloc(1, sizeof *p);
	if (!p)
		return tern_errorf(TERN_EOS, "out of memory");
	p->ctx = c;
	c->refs++;
	p->o = *o;
	p->kind = k;
	p->decoupled = !strcmp(kind, "adamw");
	if (p->o.weight_decay < 0)
		p->o.weight_decay = p->decoupled ? 0.01 : 0;
	if (p->o.lr < 0)
		p->o.lr = k == 1 ? 1e-3 : 1e-2;
	p->n = n;
	p->params = calloc((size_t)n + 1, sizeof *p->params);
	p->state[0] = calloc((size_t)n + 1, sizeof *p->state[0]);
	p->state[1] = calloc((size_t)n + 1, sizeof *p->state[1]);
	p->param_steps = calloc((size_t)n + 1, sizeof *p->param_steps);
	tern_status st = p->params && p->state[0] && p->state[1] && p->param_steps ? TERN_OK
	                                                                           : tern_errorf(TERN_EOS, "out of memory");
	int states = tern_optim_num_state(p);
	for (int i = 0; !st && i < n; i++) {
		p->params[i] = tern_var_ref(params[i]);
		for (int s = 0; s < states && !st; s++)
			st = tern_var_new(c, params[i]->t.dtype, params[i]->t.rank, params[i]->t.dims, &p->state[s][i]);
	}
	int64_t zero = 0;
	if (!st)
		st = tern_var_from(c, TERN_INT64, 0, NULL, &zero, &p->t);
	if (st) {
		tern_optim_free(p);
		return st;
	}
	*out = p;
	return TERN_OK;
}

void tern_optim_free(tern_optim *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n; i++) {
		if (p->params)
			tern_var_unref(p->params[i]);
		for (int s = 0; s < 2; s++)
			if (p->state[s])
				tern_var_unref(p->state[s][i]);
	}
	free(p->params);
	free(p->state[0]);
	free(p->state[1]);
	free(p->param_steps);
	tern_var_unref(p->lr);
	tern_var_unref(p->t);
	tern_ctx *c = p->ctx;
	free(p);
	ctx_release(c);
}

void tern_optim_set_lr(tern_optim *p, double lr)
{
	p->o.lr = lr;
}

double tern_optim_lr(const tern_optim *p)
{
	return p->o.lr;
}

tern_trace_stamp *tern_var_stamp(tern_var *v)
{
	return &v->ts;
}

struct tern_trace *tern_ctx_trace(tern_ctx *c)
{
	return c ? c->trace : NULL;
}

void tern_ctx_set_trace(tern_ctx *c, struct tern_trace *t)
{
	c->trace = t;
}

int64_t tern_ctx_epoch(tern_ctx *c)
{
	return c->epoch;
}

void tern_ctx_next_epoch(tern_ctx *c)
{
	c->epoch++;
}

const void *tern_ctx_c_site(tern_ctx *c)
{
	return c->c_site;
}

int64_t tern_ctx_opset(tern_ctx *c)
{
	return c->opset;
}

int64_t tern_optim_steps(const tern_optim *p)
{
	return p->steps;
}

int tern_optim_num_state(const tern_optim *p)
{
	return p->kind == 1 ? 2 : p->kind == 2 ? 1 : p->o.momentum != 0 ? 1 : 0;
}

tern_var *tern_optim_state(tern_optim *p, int param, int slot)
{
	if (param < 0 || param >= p->n || slot < 0 || slot >= tern_optim_num_state(p))
		return NULL;
	return p->state[slot][param];
}

int64_t tern_optim_param_steps(const tern_optim *p, int param)
{
	return param >= 0 && param < p->n ? p->param_steps[param] : -1;
}

tern_status tern_optim_set_param_steps(tern_optim *p, int param, int64_t steps)
{
	if (param < 0 || param >= p->n || steps < 0)
		return tern_errorf(TERN_EUSAGE, "optimizer: parameter %d of %d, steps %lld", param, p->n, (long long)steps);
	p->param_steps[param] = steps;
	return TERN_OK;
}

void tern_optim_zero_grad(tern_optim *p)
{
	for (int i = 0; i < p->n; i++)
		tern_var_set_grad(p->params[i], NULL);
}

/* The update of every parameter with a gradient, through the same tern.SGD/Adam/Adagrad kernels as a
 * training step; the new values are copied into the parameters' and state's own bytes. */
static tern_status optim_step_impl(tern_optim *p);

tern_status tern_optim_step(tern_optim *p)
{
	tern_ctx *c = p->ctx;
	SITE_ENTER(c);
	tern_status st = optim_step_impl(p);
	SITE_LEAVE(c);
	return st;
}

static tern_status optim_step_impl(tern_optim *p)
{
	tern_ctx *c = p->ctx;
	if (c->closed)
		return closed_error();
	p->steps++;
	tern_status st = TERN_OK;
	int was = tern_ctx_set_grad_enabled(c, 0);
	for (int i = 0; !st && i < p->n; i++) {
		tern_var *w = p->params[i], *g = w->grad;
		if (!g)
			continue;
		/* the step count a fresh tensor each time: an update still in flight may be reading the last */
		int64_t steps = ++p->param_steps[i];
		tern_var_unref(p->t);
		p->t = NULL;
		if ((st = tern_var_from(c, TERN_INT64, 0, NULL, &steps, &p->t)))
			break;
		tern_var_unref(p->lr);
		p->lr = NULL;
		if (w->t.dtype == TERN_DOUBLE) {
			double lr = p->o.lr;
			st = tern_var_from(c, TERN_DOUBLE, 0, NULL, &lr, &p->lr);
		} else {
			float lr = (float)p->o.lr;
			st = tern_var_from(c, TERN_FLOAT, 0, NULL, &lr, &p->lr);
		}
		if (st)
			break;
		/* the optimizer's own per-step values, not the program's: the trace-only baseline feeds them */
		tern_trace_input(p->t);
		tern_trace_input(p->lr);
		tern_attr_arg at[6];
		int na = 0;
		tern_var *in[6];
		int n_in = 0, n_out = 1;
		const char *op;
		at[na++] = (tern_attr_arg){.name = "weight_decay", .kind = TERN_ATTR_FLOAT, .f = p->o.weight_decay};
		in[n_in++] = p->lr;
		if (p->kind == 0) {
			op = "SGD";
			at[na++] = (tern_attr_arg){.name = "momentum", .kind = TERN_ATTR_FLOAT, .f = p->o.momentum};
			at[na++] = (tern_attr_arg){.name = "nesterov", .kind = TERN_ATTR_INT, .i = p->o.nesterov};
			in[n_in++] = w;
			in[n_in++] = g;
			if (p->o.momentum != 0)
				in[n_in++] = p->state[0][i], n_out = 2;
		} else {
			op = p->kind == 1 ? "Adam" : "Adagrad";
			in[n_in++] = p->t;
			in[n_in++] = w;
			in[n_in++] = g;
			double eps = p->o.eps > 0 ? p->o.eps : p->kind == 2 ? 1e-10 : 1e-8;
			at[na++] = (tern_attr_arg){.name = "epsilon", .kind = TERN_ATTR_FLOAT, .f = eps};
			if (p->kind == 1) {
				at[na++] = (tern_attr_arg){.name = "beta1", .kind = TERN_ATTR_FLOAT, .f = p->o.beta1 > 0 ? p->o.beta1 : 0.9};
				at[na++] = (tern_attr_arg){.name = "beta2", .kind = TERN_ATTR_FLOAT, .f = p->o.beta2 > 0 ? p->o.beta2 : 0.999};
				at[na++] = (tern_attr_arg){.name = "decoupled", .kind = TERN_ATTR_INT, .i = p->decoupled};
				in[n_in++] = p->state[0][i];
				in[n_in++] = p->state[1][i];
				n_out = 3;
			} else {
				at[na++] = (tern_attr_arg){.name = "lr_decay", .kind = TERN_ATTR_FLOAT, .f = p->o.lr_decay};
				in[n_in++] = p->state[0][i];
				n_out = 2;
			}
		}
		tern_var *outs[3] = {NULL};
		st = tern_call(c, "tern", op, in, n_in, at, na, outs, n_out);
		if (!st) {
			tern_var *dst[3] = {w, p->state[0][i], p->state[1][i]};
			for (int o = 0; o < n_out; o++)
				if (outs[o] && dst[o] && dst[o]->t.nbytes == outs[o]->t.nbytes) {
					tern_trace_assign(dst[o], outs[o]);
					copy_bytes(c, dst[o], outs[o]);
				}
		}
		for (int o = 0; o < 3; o++)
			tern_var_unref(outs[o]);
	}
	tern_ctx_set_grad_enabled(c, was);
	return st;
}
