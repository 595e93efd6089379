/* xcore — what moving data between two cores costs on this machine, against reading it from the
 * reader's own cache: the figures behind the stream executor's choices (README, multi-stream).
 *
 *   xcore [KIB] [ROUNDS]      (default 64 KiB, 2000 rounds)
 *
 * Two threads pinned to CPUs 0 and 1 take turns over one buffer. Per round, thread A writes the
 * buffer (its lines held by B too, which read them last), sums it (from its own cache), and writes it
 * again (lines only it holds); then B sums it (every line in A's cache). Prints one JSON object,
 * microseconds per pass:
 *   {"kib": K, "write_after_other_read_us": W, "own_write_us": V, "own_read_us": L, "other_read_us": X}
 * The medians over rounds. Exit 69 where the process may not run on CPUs 0 and 1. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

static float *buf;
static size_t n;
static int rounds;
static atomic_int turn; /* 0: A's, 1: B's */
static double *t_write, *t_own_write, *t_own, *t_other;
static volatile float sink;

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* Eight independent sums, so that the pass is bound by where the bytes come from, not by the
 * latency of one addition. */
static float sum(void)
{
	float s[8] = {0};
	for (size_t i = 0; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			s[k] += buf[i + (size_t)k];
	return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void *reader(void *arg)
{
	(void)arg;
	pin(1); /* main checked that it may */
	for (int r = 0; r < rounds; r++) {
		while (atomic_load_explicit(&turn, memory_order_acquire) != 1)
			;
		double t0 = now_us();
		sink = sum();
		t_other[r] = now_us() - t0;
		atomic_store_explicit(&turn, 0, memory_order_release);
	}
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v)
{
	qsort(v, (size_t)rounds, sizeof *v, cmp);
	return v[rounds / 2];
}

int main(int argc, char **argv)
{
	long kib = argc > 1 ? strtol(argv[1], NULL, 10) : 64;
	rounds = argc > 2 ? atoi(argv[2]) : 2000;
	if (kib < 1 || kib > 1 << 20 || rounds < 1) {
		fprintf(stderr, "usage: xcore [KIB] [ROUNDS]\n");
		return EX_USAGE;
	}
	n = (size_t)kib * 1024 / sizeof *buf;
	buf = aligned_alloc(64, n * sizeof *buf);
	t_write = calloc((size_t)rounds, sizeof *t_write);
	t_own = calloc((size_t)rounds, sizeof *t_own);
	t_own_write = calloc((size_t)rounds, sizeof *t_own_write);
	t_other = calloc((size_t)rounds, sizeof *t_other);
	if (!buf || !t_write || !t_own_write || !t_own || !t_other) {
		fprintf(stderr, "xcore: out of memory\n");
		return EX_OSERR;
	}
	memset(buf, 0, n * sizeof *buf);
	cpu_set_t allowed;
	pthread_t b;
	if (sched_getaffinity(0, sizeof allowed, &allowed) || !CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed) || pin(0) ||
	    pthread_create(&b, NULL, reader, NULL)) {
		fprintf(stderr, "xcore: cannot run threads on CPUs 0 and 1\n");
		return EX_UNAVAILABLE;
	}
	for (int r = 0; r < rounds; r++) {
		double t0 = now_us();
		for (size_t i = 0; i < n; i++)
			buf[i] = (float)(r + (int)(i & 1023));
		t_write[r] = now_us() - t0;
		t0 = now_us();
		sink = sum();
		t_own[r] = now_us() - t0;
		t0 = now_us();
		for (size_t i = 0; i < n; i++) /* every line modified here again, for B to fetch */
			buf[i] = (float)(r - (int)(i & 1023));
		t_own_write[r] = now_us() - t0;
		atomic_store_explicit(&turn, 1, memory_order_release);
		while (atomic_load_explicit(&turn, memory_order_acquire) != 0)
			;
	}
	pthread_join(b, NULL);
	printf("{\"kib\": %ld, \"write_after_other_read_us\": %.2f, \"own_write_us\": %.2f, \"own_read_us\": %.2f, "
	       "\"other_read_us\": %.2f}\n",
	       kib, median(t_write), median(t_own_write), median(t_own), median(t_other));
	return 0;
}
