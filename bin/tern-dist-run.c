/* tern-dist-run — trains a partitioned model (tern-partition) on N ranks over MPICH: it starts
 * `mpiexec -n N` on itself (or runs as one rank of a job started with a plain `mpiexec -n N
 * tern-dist-run ...`), hands libtern MPI's collectives (tern_comm_set), and runs tern-run --train's
 * loop (train.c) with each rank on its slice of every batch. */
#include "../lib/internal.h"
#include "cli.h"
#include "train.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* MPICH's transports (UCX, loaded at run time) keep allocations that LeakSanitizer reports from an
 * unknown module; what MPI allocates is not tern's to free, so leak checking is paused inside MPI's
 * calls (sanitizer builds only). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
static int mpi_call_end(int rc)
{
	__lsan_enable();
	return rc;
}
#define MPI_CALL(call) (__lsan_disable(), mpi_call_end(call))
#else
#define MPI_CALL(call) (call)
#endif

typedef struct options {
	train_options t;
	int ranks;
	const char *hosts;
	int worker;
	int threads;
	uint64_t seed;
	const char **input_args;
	int n_input_args;
} options;

enum { OPT_HOSTS = 0x100, OPT_WORKER, OPT_THREADS, OPT_SEED, OPT_REPORT };

static const struct argp_option option_table[] = {
        {NULL, 0, NULL, 0, "Ranks:", 1},
        {"ranks", 'n', "N", 0, "run N ranks (mpiexec -n N); the graph must be partitioned for N", 1},
        {"hosts", OPT_HOSTS, "FILE", 0, "MPICH's host file, passed to mpiexec -f", 1},
        {"worker", OPT_WORKER, NULL, 0, "be one rank of a job mpiexec started (set when mpiexec runs this tool)", 1},
        {"report", OPT_REPORT, NULL, 0,
         "at the end, the bytes a rank sent a step by kind beside the first-principles count, and throughput", 1},
        {NULL, 0, NULL, 0, "Data and training (as tern-run --train; -o FILE is written by rank 0):", 2},
        {"input", 'i', "[NAME=]FILE", 0, "the step's input NAME from a .npy or .pb file; every rank reads it", 2},
        {"seed", OPT_SEED, "S", 0, "seed of --shuffle (default 0)", 2},
        {"threads", OPT_THREADS, "N", 0, "threads a rank (default 1)", 2},
        TRAIN_ARGP_OPTIONS(2),
        {0},
};

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	options *o = state->input;
	switch (key) {
	case 'n': o->ranks = (int)tern_cli_count(state, "--ranks", arg, 1, 1 << 20); return 0;
	case OPT_HOSTS: o->hosts = arg; return 0;
	case OPT_WORKER: o->worker = 1; return 0;
	case OPT_REPORT: o->t.report = 1; return 0;
	case OPT_THREADS: o->threads = (int)tern_cli_count(state, "--threads", arg, 1, 4096); return 0;
	case OPT_SEED: o->seed = (uint64_t)tern_cli_count(state, "--seed", arg, 0, INT64_MAX); return 0;
	case 'i':
		o->input_args = tern_cli_grow(o->input_args, (size_t)o->n_input_args + 1, sizeof *o->input_args);
		o->input_args[o->n_input_args++] = arg;
		return 0;
	default: return train_parse_option(&o->t, key, arg, state);
	}
}

/* ---------------------------------------------------------------- MPI as libtern's communicator */

static char mpi_message[MPI_MAX_ERROR_STRING + 64];

static int mpi_failed(int rc, const char *what)
{
	int len = 0;
	char text[MPI_MAX_ERROR_STRING];
	MPI_Error_string(rc, text, &len);
	snprintf(mpi_message, sizeof mpi_message, "%s: %.*s", what, len, text);
	return 1;
}

/* More ranks on this machine than processors: a rank that spins in MPI waiting for one that is not
 * running keeps it off the processor until the scheduler's next tick (the digits CNN's steps took 8
 * or 16 ms, whole ticks, from run to run). Collectives are then started and tested, yielding the
 * processor between tests. */
static int yielding;

static int finish(MPI_Request *r)
{
	MPI_Status status;
	if (!yielding)
		return MPI_CALL(MPI_Wait(r, &status));
	for (;;) {
		int done = 0, rc = MPI_CALL(MPI_Test(r, &done, &status));
		if (rc != MPI_SUCCESS || done)
			return rc;
		sched_yield();
	}
}

/* A nonblocking allreduce: MPI_Iallreduce in pieces of at most INT_MAX elements. A failure is kept
 * for the wait, which frees the request. */
typedef struct mpi_request {
	int n, rc;
	const char *what;
	MPI_Request r[];
} mpi_request;

static int mpi_iallreduce(void *ctx, void *buf, int64_t count, int dtype, void **request)
{
	(void)ctx;
	MPI_Datatype t = dtype == TERN_DOUBLE ? MPI_DOUBLE : MPI_FLOAT;
	size_t es = dtype == TERN_DOUBLE ? 8 : 4;
	int pieces = (int)((count + INT_MAX - 1) / INT_MAX);
	mpi_request *q = calloc(1, sizeof *q + (size_t)pieces * sizeof *q->r);
	if (!q) {
		snprintf(mpi_message, sizeof mpi_message, "out of memory");
		return 1;
	}
	for (int64_t at = 0; at < count; at += INT_MAX) {
		int n = (int)(count - at < INT_MAX ? count - at : INT_MAX);
		int rc = MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * es, n, t, MPI_SUM, MPI_COMM_WORLD,
		                                 &q->r[q->n]));
		if (rc != MPI_SUCCESS) {
			for (int i = 0; i < q->n; i++)
				MPI_Request_free(&q->r[i]);
			free(q);
			return mpi_failed(rc, "MPI_Iallreduce");
		}
		q->n++;
	}
	*request = q;
	return 0;
}

static int mpi_test(void *ctx, void *request, int *done)
{
	(void)ctx;
	mpi_request *q = request;
	if (q->rc)
		return *done = 1;
	int rc = MPI_SUCCESS;
	*done = 1;
	for (int i = 0; i < q->n && rc == MPI_SUCCESS; i++) {
		MPI_Status status;
		int flag = 1;
		if (q->r[i] != MPI_REQUEST_NULL && (rc = MPI_CALL(MPI_Test(&q->r[i], &flag, &status))) != MPI_SUCCESS) {
			q->rc = rc;
			q->what = "MPI_Test";
		}
		*done &= flag || rc != MPI_SUCCESS;
	}
	return rc != MPI_SUCCESS;
}

static int mpi_wait(void *ctx, void *request)
{
	(void)ctx;
	mpi_request *q = request;
	int rc = q->rc;
	const char *what = q->rc ? q->what : "MPI_Wait";
	for (int i = 0; i < q->n && rc == MPI_SUCCESS; i++)
		if (q->r[i] != MPI_REQUEST_NULL)
			rc = finish(&q->r[i]);
	free(q);
	return rc != MPI_SUCCESS ? mpi_failed(rc, what) : 0;
}

static int mpi_allreduce(void *ctx, void *buf, int64_t count, int dtype)
{
	if (yielding) {
		void *request;
		return mpi_iallreduce(ctx, buf, count, dtype, &request) || mpi_wait(ctx, request);
	}
	MPI_Datatype t = dtype == TERN_DOUBLE ? MPI_DOUBLE : MPI_FLOAT;
	/* in pieces of at most INT_MAX elements (MPI counts are int) */
	size_t es = dtype == TERN_DOUBLE ? 8 : 4;
	for (int64_t at = 0; at < count; at += INT_MAX) {
		int n = (int)(count - at < INT_MAX ? count - at : INT_MAX);
		int rc = MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * es, n, t, MPI_SUM, MPI_COMM_WORLD));
		if (rc != MPI_SUCCESS)
			return mpi_failed(rc, "MPI_Allreduce");
	}
	return 0;
}

/* Byte counts and displacements as MPI's ints; a message over 2 GiB is refused. */
static int to_ints(int n, const int64_t *a, const int64_t *b, int *ia, int *ib)
{
	for (int r = 0; r < n; r++) {
		if (a[r] > INT_MAX || b[r] > INT_MAX) {
			snprintf(mpi_message, sizeof mpi_message, "a message of more than 2 GiB");
			return 1;
		}
		ia[r] = (int)a[r];
		ib[r] = (int)b[r];
	}
	return 0;
}

static int mpi_alltoallv(void *ctx, const void *send, const int64_t *send_bytes, const int64_t *send_off, void *recv,
                         const int64_t *recv_bytes, const int64_t *recv_off)
{
	(void)ctx;
	int n;
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	int *v = malloc(4 * (size_t)n * sizeof *v);
	if (!v) {
		snprintf(mpi_message, sizeof mpi_message, "out of memory");
		return 1;
	}
	int rc = to_ints(n, send_bytes, send_off, v, v + n) || to_ints(n, recv_bytes, recv_off, v + 2 * n, v + 3 * n);
	if (!rc) {
		MPI_Request r;
		int e = yielding ? MPI_CALL(MPI_Ialltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n, MPI_BYTE,
		                                           MPI_COMM_WORLD, &r))
		                 : MPI_CALL(MPI_Alltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n, MPI_BYTE,
		                                          MPI_COMM_WORLD));
		if (yielding && e == MPI_SUCCESS)
			e = finish(&r);
		rc = e != MPI_SUCCESS ? mpi_failed(e, "MPI_Alltoallv") : 0;
	}
	free(v);
	return rc;
}

static int mpi_allgatherv(void *ctx, const void *send, void *recv, const int64_t *bytes, const int64_t *off)
{
	(void)ctx;
	int n, me;
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	int *v = malloc(2 * (size_t)n * sizeof *v);
	if (!v) {
		snprintf(mpi_message, sizeof mpi_message, "out of memory");
		return 1;
	}
	int rc = to_ints(n, bytes, off, v, v + n);
	if (!rc) {
		int e = MPI_CALL(MPI_Allgatherv(send, v[me], MPI_BYTE, recv, v, v + n, MPI_BYTE, MPI_COMM_WORLD));
		rc = e != MPI_SUCCESS ? mpi_failed(e, "MPI_Allgatherv") : 0;
	}
	free(v);
	return rc;
}

static const char *mpi_error(void *ctx)
{
	(void)ctx;
	return mpi_message;
}

/* ---------------------------------------------------------------- the launcher */

static volatile pid_t mpiexec_pid;
static volatile sig_atomic_t forwarded;

static void forward_signal(int sig)
{
	forwarded = sig;
	if (mpiexec_pid > 0)
		kill(mpiexec_pid, sig);
}

/* Runs mpiexec -n N [-f HOSTS] THIS-PROGRAM --worker ARGS, with a graph from standard input saved to
 * a file first (mpiexec gives standard input to rank 0 only); returns its exit status. */
static int launch(const options *o, const tern_cli *cli, int argc, char **argv)
{
	char self[PATH_MAX];
	ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
	if (len <= 0)
		tern_cli_fail(TERN_EIO, "cannot find this program: %s", strerror(errno));
	self[len] = 0;
	char graph[] = "/tmp/tern-dist-run-XXXXXX";
	bool from_stdin = !cli->input || !strcmp(cli->input, "-");
	if (from_stdin) {
		int fd = mkstemp(graph);
		if (fd < 0)
			tern_cli_fail(TERN_EIO, "%s: %s", graph, strerror(errno));
		char buf[1 << 16];
		ssize_t k;
		while ((k = read(STDIN_FILENO, buf, sizeof buf)) > 0)
			if (write(fd, buf, (size_t)k) != k) {
				unlink(graph);
				tern_cli_fail(TERN_EIO, "%s: %s", graph, strerror(errno));
			}
		close(fd);
		if (k < 0) {
			unlink(graph);
			tern_cli_fail(TERN_EIO, "standard input: %s", strerror(errno));
		}
	}
	/* what every rank would refuse, refused once here, before any rank starts */
	tern_cli c = *cli;
	c.input = from_stdin ? graph : cli->input;
	tern_model *m = tern_cli_load(&c);
	const char *why = NULL;
	int want = tern_model_partition_ranks(m);
	if (!tern_model_has_training(m))
		why = "the model has no training algorithm; make one with tern-autodiff";
	if (why || want != o->ranks || (o->t.batch && o->t.batch % o->ranks)) {
		if (from_stdin)
			unlink(graph);
		if (why)
			tern_cli_fail(TERN_EDATA, "%s: %s", from_stdin ? "standard input" : c.input, why);
		if (want != o->ranks)
			tern_cli_fail(TERN_EUSAGE, "%s: the training step is partitioned for %d rank%s, not %d (tern-partition --ranks %d)",
			              from_stdin ? "standard input" : c.input, want, want == 1 ? "" : "s", o->ranks, o->ranks);
		tern_cli_fail(TERN_EUSAGE, "--batch %lld does not divide among %d ranks", (long long)o->t.batch, o->ranks);
	}
	tern_model_free(m);
	char n[16];
	snprintf(n, sizeof n, "%d", o->ranks);
	const char **av = calloc((size_t)argc + 10, sizeof *av);
	if (!av)
		tern_cli_fail(TERN_EOS, "out of memory");
	int k = 0;
	av[k++] = "mpiexec";
	av[k++] = "-n";
	av[k++] = n;
	if (o->hosts) {
		av[k++] = "-f";
		av[k++] = o->hosts;
	}
	av[k++] = self;
	av[k++] = "--worker";
	for (int i = 1; i < argc; i++)
		if (!from_stdin || strcmp(argv[i], "-") != 0)
			av[k++] = argv[i];
	if (from_stdin)
		av[k++] = graph;
	av[k] = NULL;
	tern_cli_verbose(1, "starting %d ranks with mpiexec", o->ranks);
	/* the launcher outlives the job: a signal goes on to mpiexec, which hands it to the ranks (they
	 * stop at the same step and write -o) */
	struct sigaction sa = {.sa_handler = forward_signal}, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	pid_t pid = fork();
	if (pid == 0) {
		/* a process group of its own: a terminal's Ctrl-C reaches the launcher alone, which hands it
		 * on once (mpiexec aborts the job on a second SIGINT) */
		setpgid(0, 0);
		sigaction(SIGINT, &old_int, NULL);
		sigaction(SIGTERM, &old_term, NULL);
		execvp("mpiexec", (char **)av);
		fprintf(stderr, "tern-dist-run: cannot run mpiexec: %s\n", strerror(errno));
		_exit(69);
	}
	mpiexec_pid = pid;
	int status = 0;
	while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	mpiexec_pid = 0;
	if (from_stdin)
		unlink(graph);
	free(av);
	if (pid < 0)
		tern_cli_fail(TERN_EOS, "cannot start mpiexec: %s", strerror(errno));
	/* stopped by a signal: its status, as tern-run --train gives (130 for SIGINT, 143 for SIGTERM) */
	if (forwarded)
		return 128 + forwarded;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* ---------------------------------------------------------------- a rank */

/* A hash of the graph file's bytes (eight at a time, multiply and rotate), to check that every rank
 * read the same graph. */
static uint64_t file_hash(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint64_t h = 1469598103934665603ull, total = 0;
	if (!f)
		return 0;
	uint64_t buf[1 << 13];
	size_t k;
	while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
		if (k % 8)
			memset((char *)buf + k, 0, 8 - k % 8);
		for (size_t i = 0; i < (k + 7) / 8; i++) {
			h = (h ^ buf[i]) * 0x9e3779b97f4a7c15ull;
			h = (h << 29) | (h >> 35);
		}
		total += k;
	}
	fclose(f);
	return h ^ total;
}

/* ---------------------------------------------------------------- --partitions auto */

/* The median step time (the ranks' mean) of a few steps of the model in cli->input partitioned into p,
 * trained on a copy from the first batches; the copy is dropped. */
static double time_partitions(const options *o, const tern_cli *cli, const tern_partition_options *ap, int p)
{
	tern_model *m = tern_cli_load(cli);
	tern_partition_options po = *ap;
	po.partitions = p;
	if (tern_model_partition(m, &po, NULL)) {
		tern_model_free(m);
		return NAN;
	}
	tern_value *sv = tern_graph_find(tern_model_graph(m), "tern.step");
	tern_tensor stored = {0};
	int64_t done = 0;
	if (sv && sv->initializer && !tern_tensor_from_proto(sv->initializer, NULL, "tern.step", &stored)) {
		done = tern_tensor_get_i64(&stored, 0);
		tern_tensor_free(&stored);
	}
	train_options t = o->t;
	t.steps = done + 12;
	t.epochs = 0;
	t.log = NULL;
	t.report = 0;
	t.checkpoint_every = 0;
	t.n_val_args = 0;
	double med = NAN;
	t.median_step_s = &med;
	tern_cli c = *cli;
	c.output = NULL;
	int was = tern_cli_set_quiet(1);
	tern_run_train(&t, &c, m);
	tern_cli_set_quiet(was);
	tern_model_free(m);
	return med;
}

/* Parallax's search: from the servers' count, doubling while the step time falls, then halving from
 * the start while it falls; with three samples or more, t(p) = b/p + a(p - 1) + c fitted by least
 * squares and its best integer p taken (the best sample when the fit has no minimum). */
static int choose_partitions(const options *o, const tern_cli *cli, const tern_partition_options *ap, int rank)
{
	int ps[32], n = 0, start = ap->servers > 0 ? ap->servers : ap->ranks;
	double ts[32];
	for (int p = start, up = 1; n < 12;) {
		double t = time_partitions(o, cli, ap, p);
		ps[n] = p;
		ts[n++] = t;
		tern_cli_verbose(0, "partitions %d: %.4g s a step", p, t);
		if (isnan(t)) {
			n--; /* more partitions than a table has rows: not a candidate */
			if (!n)
				tern_cli_fail(TERN_EUSAGE, "%s: cannot be partitioned into %d", cli->input, p);
		}
		bool better = !isnan(t) && (n == 1 || t < ts[n - 2]);
		if (up && better && p * 2 <= (1 << 20)) {
			p *= 2;
			continue;
		}
		/* turn downward from the start once the step time rose (or doubling must stop) */
		if (up) {
			up = 0;
			if (start / 2 < 1 || (n > 1 && ts[0] > ts[1]))
				break;
			p = start / 2;
			continue;
		}
		if (!better || p / 2 < 1)
			break;
		p /= 2;
	}
	int best = 0;
	for (int i = 1; i < n; i++)
		if (ts[i] < ts[best])
			best = i;
	int choice = ps[best];
	if (n >= 3) {
		/* least squares on the features (1/p, p - 1, 1) */
		double A[3][4] = {{0}};
		for (int i = 0; i < n; i++) {
			double f[3] = {1.0 / ps[i], ps[i] - 1.0, 1.0};
			for (int r = 0; r < 3; r++) {
				for (int c = 0; c < 3; c++)
					A[r][c] += f[r] * f[c];
				A[r][3] += f[r] * ts[i];
			}
		}
		for (int c = 0; c < 3; c++) {
			int piv = c;
			for (int r = c + 1; r < 3; r++)
				if (fabs(A[r][c]) > fabs(A[piv][c]))
					piv = r;
			for (int k = 0; k < 4; k++) {
				double tmp = A[c][k];
				A[c][k] = A[piv][k];
				A[piv][k] = tmp;
			}
			for (int r = 0; r < 3 && fabs(A[c][c]) > 1e-300; r++) {
				if (r == c)
					continue;
				double f = A[r][c] / A[c][c];
				for (int k = 0; k < 4; k++)
					A[r][k] -= f * A[c][k];
			}
		}
		double b = A[0][3] / A[0][0], al = A[1][3] / A[1][1], c0 = A[2][3] / A[2][2];
		tern_cli_verbose(0, "fit t(p) = %.4g/p + %.4g(p - 1) + %.4g", b, al, c0);
		if (b > 0 && al > 0 && isfinite(b) && isfinite(al)) {
			/* the fit's best among the counts that spread evenly over the servers (multiples of their
			 * number, and the counts timed): 5 partitions on 4 servers put two on one of them, whose
			 * link then carries 2/5 of the rows (measured 0.369 s a step against 0.282 for 4) */
			int hi = 1, step = start;
			for (int i = 0; i < n; i++)
				hi = ps[i] * 2 > hi ? ps[i] * 2 : hi;
			double bt = INFINITY;
			for (int p = 1; p <= hi; p++) {
				bool timed = false;
				for (int i = 0; i < n; i++)
					timed |= ps[i] == p;
				if (!timed && p % step)
					continue;
				double t = b / p + al * (p - 1) + c0;
				if (t < bt) {
					bt = t;
					choice = p;
				}
			}
		}
	}
	tern_cli_verbose(0, "%d partitions", choice);
	(void)rank;
	return choice;
}

static int worker(options *o, tern_cli *cli)
{
	int provided = 0, rank = 0, size = 1;
	/* more ranks on this machine than processors: every step of MPICH's ring allgather waits for a
	 * process to be scheduled (a 1 MiB allgatherv on 4 ranks and 2 processors took 1.6 s, Bruck's
	 * 0.025 s); a choice made in the environment stands */
	const char *local = getenv("MPI_LOCALNRANKS");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (local && cpus > 0 && atol(local) > cpus) {
		setenv("MPIR_CVAR_ALLGATHERV_INTRA_ALGORITHM", "brucks", 0);
		yielding = !getenv("TERN_DIST_SPIN");
	}
	if (MPI_CALL(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided)) != MPI_SUCCESS)
		tern_cli_fail(TERN_EUNAVAILABLE, "MPI_Init failed");
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	static tern_comm comm;
	comm = (tern_comm){rank,           size,     NULL,    mpi_allreduce, mpi_alltoallv, mpi_allgatherv,
	                   mpi_error,      mpi_iallreduce, mpi_test, mpi_wait};
	tern_comm_set(&comm);
	if (rank)
		tern_cli_set_quiet(1); /* rank 0 speaks for the job; errors still come from any rank */
	if (o->ranks && o->ranks != size)
		tern_cli_fail(TERN_EUSAGE, "-n %d, but mpiexec started %d ranks", o->ranks, size);
	if (!cli->input || !strcmp(cli->input, "-"))
		tern_cli_fail(TERN_EUSAGE, "a rank reads the graph from a file (mpiexec gives standard input to rank 0 only)");
	/* the same graph everywhere */
	uint64_t mine = file_hash(cli->input), *all = malloc((size_t)size * sizeof *all);
	if (!all)
		tern_cli_fail(TERN_EOS, "out of memory");
	if (MPI_CALL(MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD)) != MPI_SUCCESS)
		tern_cli_fail(TERN_EIO, "rank %d: MPI_Allgather failed", rank);
	for (int r = 0; r < size; r++)
		if (all[r] != all[0])
			tern_cli_fail(TERN_EUSAGE, "%s: ranks 0 and %d read different graphs", cli->input, r);
	free(all);
	tern_model *model = tern_cli_load(cli);
	if (!tern_model_has_training(model))
		tern_cli_fail(TERN_EDATA, "%s: the model has no training algorithm; make one with tern-autodiff", cli->input);
	int want = tern_model_partition_ranks(model);
	if (want != size)
		tern_cli_fail(TERN_EUSAGE, "%s: the training step is partitioned for %d rank%s, not %d (tern-partition --ranks %d)",
		              cli->input, want, want == 1 ? "" : "s", size, size);
	o->t.dist = 1;
	o->t.threads = o->threads ? o->threads : 1;
	o->t.seed = o->seed;
	o->t.input_args = o->input_args;
	o->t.n_input_args = o->n_input_args;
	tern_partition_options ap;
	if (tern_model_partition_auto(model, &ap)) {
		/* --partitions auto: the count chosen by timing copies, then this model partitioned */
		ap.partitions = choose_partitions(o, cli, &ap, rank);
		tern_cli_check(tern_model_partition(model, &ap, NULL));
	}
	int rc = tern_run_train(&o->t, cli, model);
	tern_model_free(model);
	free(o->input_args);
	free(o->t.val_args);
	(void)MPI_CALL(MPI_Finalize());
	return rc;
}

int main(int argc, char **argv)
{
	tern_cli cli;
	options opts = {0};
	const tern_cli_tool tool = {
	        "tern-dist-run",
	        "Train a partitioned model (tern-partition) on N ranks over MPICH.\v"
	        "Without --worker it runs `mpiexec -n N` on itself; a plain `mpiexec -n N tern-dist-run ...` works "
	        "as well. Every rank reads the graph and the -i files; each trains on its slice of every batch "
	        "(--batch is the global batch), dense gradients are averaged by MPI_Iallreduce while the backward pass "
	        "runs (MPI_Allreduce after it with tern-partition --no-overlap), sparse rows go to "
	        "and come from their shards' owners by MPI_Alltoallv. --log FILE gets one JSON object per step and "
	        "rank: step, rank, epoch, loss (the rank's), mean_loss, samples_per_s, step_s, lr, and the bytes it "
	        "sent and received by kind (bytes_sent and bytes_received: dense, sparse_push, sparse_pull, sparse_local, "
	        "other). "
	        "Rank 0 gathers the shards and writes -o, atomically. With more ranks on a machine than processors, "
	        "ranks yield the processor while they wait for a collective (TERN_DIST_SPIN=1: spin, as MPICH does).",
	        option_table,
	        parse_option,
	        &opts,
	        NULL,
	        1};
	tern_cli_parse(&cli, &tool, argc, argv);
	/* a rank when mpiexec started this process, else the launcher */
	if (opts.worker || getenv("PMI_RANK") || getenv("PMI_FD"))
		return worker(&opts, &cli);
	if (!opts.ranks)
		tern_cli_fail(TERN_EUSAGE, "-n N is required (or start it with mpiexec -n N)");
	int rc = launch(&opts, &cli, argc, argv);
	free(opts.input_args);
	free(opts.t.val_args);
	return rc;
}
