/* comm.c — the process's communicator (tern_comm_set) and the bytes it moves by kind.
 *
 * libtern does not link MPI: a launcher (tern-dist-run) hands it a table of collectives. Without one
 * a process is rank 0 of 1 and the collectives are copies. The byte counts are the payload each
 * collective must move whatever its algorithm: an allreduce a ring's 2(n-1)/n of the buffer each way
 * (what MPICH's reduce-scatter + allgather for long messages moves too), an alltoallv what goes to and
 * comes from other ranks, an allgatherv a ring's (every block but one each way).
 *
 * Nonblocking allreduces (tern.AllReduceStart) are kept by their buffer until tern.AllReduceWait;
 * the executor calls tern_comm_progress between nodes, so that they move while the backward pass
 * computes. One lock keeps the process's calls into the communicator one at a time (MPI is
 * initialised for THREAD_SERIALIZED; nodes of parallel calls may run on several threads). */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const tern_comm *current;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct pending {
	const void *buf;
	void *request;
	int done;
} pending;
static pending *pendings;
static size_t n_pending, cap_pending;
static _Atomic int any_pending;
static _Atomic int64_t sent_bytes[TERN_COMM_KINDS], received_bytes[TERN_COMM_KINDS], expected_bytes[TERN_COMM_KINDS];

void tern_comm_set(const tern_comm *comm)
{
	current = comm;
}

const tern_comm *tern_comm_get(void)
{
	return current;
}

const char *tern_comm_kind_name(int kind)
{
	static const char *const names[TERN_COMM_KINDS] = {"dense", "sparse_push", "sparse_pull", "sparse_local", "other"};
	return kind >= 0 && kind < TERN_COMM_KINDS ? names[kind] : "?";
}

void tern_comm_bytes(int64_t sent[TERN_COMM_KINDS], int64_t received[TERN_COMM_KINDS])
{
	for (int k = 0; k < TERN_COMM_KINDS; k++) {
		sent[k] = atomic_load(&sent_bytes[k]);
		received[k] = atomic_load(&received_bytes[k]);
	}
}

void tern_comm_reset_bytes(void)
{
	for (int k = 0; k < TERN_COMM_KINDS; k++) {
		atomic_store(&sent_bytes[k], 0);
		atomic_store(&received_bytes[k], 0);
		atomic_store(&expected_bytes[k], 0);
	}
}

void tern_comm_expected(int64_t expected[TERN_COMM_KINDS])
{
	for (int k = 0; k < TERN_COMM_KINDS; k++)
		expected[k] = atomic_load(&expected_bytes[k]);
}

void tern_comm_expect(int kind, double bytes)
{
	if (kind >= 0 && kind < TERN_COMM_KINDS && tern_comm_size() > 1)
		atomic_fetch_add(&expected_bytes[kind], (int64_t)(bytes + 0.5));
}

static void count(int kind, int64_t sent, int64_t received)
{
	if (kind < 0 || kind >= TERN_COMM_KINDS)
		kind = TERN_COMM_OTHER;
	atomic_fetch_add(&sent_bytes[kind], sent);
	atomic_fetch_add(&received_bytes[kind], received);
}

static tern_status failed(const char *what)
{
	const char *why = current && current->error ? current->error(current->ctx) : NULL;
	return tern_errorf(TERN_EIO, "%s across %d ranks failed%s%s", what, current ? current->size : 1, why ? ": " : "",
	                   why ? why : "");
}

int tern_comm_rank(void)
{
	return current ? current->rank : 0;
}

int tern_comm_size(void)
{
	return current ? current->size : 1;
}

tern_status tern_comm_allreduce(int kind, void *buf, int64_t count_, int dtype)
{
	int n = tern_comm_size();
	if (n == 1 || count_ == 0)
		return TERN_OK;
	pthread_mutex_lock(&lock);
	int rc = current->allreduce(current->ctx, buf, count_, dtype);
	pthread_mutex_unlock(&lock);
	if (rc)
		return failed("an allreduce");
	int64_t bytes = count_ * (int64_t)tern_dtype_size(dtype), moved = 2 * bytes * (n - 1) / n;
	count(kind, moved, moved);
	return TERN_OK;
}

tern_status tern_comm_alltoallv(int kind, const void *send, const int64_t *send_bytes, const int64_t *send_off,
                                void *recv, const int64_t *recv_bytes, const int64_t *recv_off)
{
	int n = tern_comm_size(), me = tern_comm_rank();
	if (n == 1) {
		if (send_bytes[0])
			memcpy((char *)recv + recv_off[0], (const char *)send + send_off[0], (size_t)send_bytes[0]);
		return TERN_OK;
	}
	pthread_mutex_lock(&lock);
	int rc = current->alltoallv(current->ctx, send, send_bytes, send_off, recv, recv_bytes, recv_off);
	pthread_mutex_unlock(&lock);
	if (rc)
		return failed("an alltoallv");
	int64_t s = 0, r = 0;
	for (int k = 0; k < n; k++)
		if (k != me) {
			s += send_bytes[k];
			r += recv_bytes[k];
		}
	count(kind, s, r);
	return TERN_OK;
}

tern_status tern_comm_allgatherv(int kind, const void *send, void *recv, const int64_t *bytes, const int64_t *off)
{
	int n = tern_comm_size(), me = tern_comm_rank();
	if (n == 1) {
		if (bytes[0] && (const char *)recv + off[0] != send)
			memmove((char *)recv + off[0], send, (size_t)bytes[0]);
		return TERN_OK;
	}
	pthread_mutex_lock(&lock);
	int rc = current->allgatherv(current->ctx, send, recv, bytes, off);
	pthread_mutex_unlock(&lock);
	if (rc)
		return failed("an allgather");
	int64_t total = 0;
	for (int k = 0; k < n; k++)
		total += bytes[k];
	count(kind, total - bytes[(me + 1) % n], total - bytes[me]);
	return TERN_OK;
}

tern_status tern_comm_iallreduce(int kind, void *buf, int64_t count_, int dtype)
{
	int n = tern_comm_size();
	if (n == 1 || count_ == 0)
		return TERN_OK;
	if (!current->iallreduce)
		return tern_comm_allreduce(kind, buf, count_, dtype);
	pthread_mutex_lock(&lock);
	void *request = NULL;
	int rc = tern_grow((void **)&pendings, &cap_pending, n_pending + 1, sizeof *pendings) ? 0 : -1;
	if (!rc && (rc = current->iallreduce(current->ctx, buf, count_, dtype, &request)) == 0) {
		pendings[n_pending++] = (pending){buf, request, 0};
		atomic_store(&any_pending, 1);
	}
	pthread_mutex_unlock(&lock);
	if (rc < 0)
		return tern_errorf(TERN_EOS, "out of memory");
	if (rc)
		return failed("starting an allreduce");
	int64_t bytes = count_ * (int64_t)tern_dtype_size(dtype), moved = 2 * bytes * (n - 1) / n;
	count(kind, moved, moved);
	return TERN_OK;
}

tern_status tern_comm_wait(const void *buf)
{
	if (!atomic_load(&any_pending))
		return TERN_OK;
	pthread_mutex_lock(&lock);
	int rc = 0;
	for (size_t i = 0; i < n_pending; i++)
		if (pendings[i].buf == buf) {
			rc = current->wait(current->ctx, pendings[i].request); /* frees it, done or not */
			pendings[i] = pendings[--n_pending];
			break;
		}
	atomic_store(&any_pending, n_pending > 0);
	pthread_mutex_unlock(&lock);
	return rc ? failed("an allreduce") : TERN_OK;
}

void tern_comm_progress(void)
{
	/* not if another thread is in the communicator: it moves everything on itself */
	if (!atomic_load(&any_pending) || pthread_mutex_trylock(&lock))
		return;
	for (size_t i = 0; i < n_pending; i++)
		if (!pendings[i].done)
			current->test(current->ctx, pendings[i].request, &pendings[i].done); /* a failure shows at the wait */
	pthread_mutex_unlock(&lock);
}

/* Each rank's one int64 per rank to that rank: recv[r] is what rank r sent here. */
tern_status tern_comm_alltoall_counts(int kind, const int64_t *send, int64_t *recv)
{
	int n = tern_comm_size();
	int64_t stack[2 * 64], *heap = NULL, *bytes = stack;
	if (n > 64 && !(bytes = heap = malloc(2 * (size_t)n * sizeof *bytes)))
		return tern_errorf(TERN_EOS, "out of memory");
	int64_t *off = bytes + n;
	for (int k = 0; k < n; k++) {
		bytes[k] = sizeof(int64_t);
		off[k] = k * (int64_t)sizeof(int64_t);
	}
	tern_status st = tern_comm_alltoallv(kind, send, bytes, off, recv, bytes, off);
	free(heap);
	return st;
}
