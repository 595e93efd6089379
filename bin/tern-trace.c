/* tern-trace — runs an imperative tern program and writes the graph of its first steps: the tracer
 * lives in the library (lib/eager/trace.c) and is switched on through the environment, so that any
 * program that imports tern or links libtern is traced as it runs. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct trace {
	int steps, trace_only, coexec;
	const char *record;
	char **program;
	int n_program;
};

enum { OPT_STEPS = 256, OPT_RECORD, OPT_TRACE_ONLY, OPT_COEXEC };

static const struct argp_option options[] = {
        {"steps", OPT_STEPS, "K", 0, "trace the first K steps (tern.step() blocks; default 3)", 0},
        {"record", OPT_RECORD, "DIR", 0,
         "also write every traced step's fed inputs, state values and fetched outputs under DIR/stepN/ (.npy), "
         "to run the graph on a step and compare",
         0},
        {"coexec", OPT_COEXEC, NULL, 0,
         "after the traced steps, check every later step against the graph as it runs: a divergence (another "
         "branch, a new shape, an operation the graph lacks) is found at the operation, the step runs as traced, "
         "joins the trace, and the graph is made again at exit (-v names each divergence); a summary at exit. "
         "The program's own operations run (on a thread beside it), not the optimised graph, in this release",
         0},
        {"trace-only", OPT_TRACE_ONLY, NULL, 0,
         "the baseline of torch.jit.trace: trace the first step, then replay its operations in every later step "
         "without checking that the program asks for them (to show what tracing alone gets wrong)",
         0},
        {0},
};

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	struct trace *t = state->input;
	switch (key) {
	case OPT_STEPS: {
		char *end;
		errno = 0;
		long v = strtol(arg, &end, 10);
		if (errno || *end || v < 1 || v > INT_MAX)
			argp_error(state, "--steps takes a positive count, not '%s'", arg);
		t->steps = (int)v;
		return 0;
	}
	case OPT_RECORD: t->record = arg; return 0;
	case OPT_TRACE_ONLY: t->trace_only = 1; return 0;
	case OPT_COEXEC: t->coexec = 1; return 0;
	case ARGP_KEY_ARGS:
		t->program = state->argv + state->next;
		t->n_program = state->argc - state->next;
		return 0;
	case ARGP_KEY_NO_ARGS: argp_error(state, "no PROGRAM to run (tern-trace -o FILE -- PROGRAM [ARGS...])"); return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

/* BUILD/python when this tool runs from a build folder (BUILD/bin/tern-trace), so that a program
 * there imports the build's tern; NULL when installed (the module is on Python's own path). */
static char *build_python(void)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return NULL;
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (!slash)
		return NULL;
	*slash = 0;
	slash = strrchr(self, '/');
	if (!slash || strcmp(slash, "/bin"))
		return NULL;
	*slash = 0;
	size_t len = strlen(self) + 32;
	char *py = malloc(len);
	if (!py)
		return NULL;
	snprintf(py, len, "%s/python/tern/__init__.py", self);
	struct stat st;
	if (stat(py, &st)) {
		free(py);
		return NULL;
	}
	snprintf(py, len, "%s/python", self);
	return py;
}

int main(int argc, char **argv)
{
	struct trace t = {.steps = 3};
	const tern_cli_tool tool = {
	        .name = "tern-trace",
	        .doc = "Run an imperative tern program and write the graph of its first steps.\v"
	               "PROGRAM runs as written (python3 train.py, or a C program linked with libtern). Every tensor "
	               "operation of its first K steps is recorded with its call site and the steps are merged into one "
	               "graph: the same operation at the same site is one node, different paths become If cases chosen "
	               "by the input tern_path, tensors the program makes are inputs, values it reads are outputs, and "
	               "parameter updates are the graph's training_info. Without -o the graph goes to standard output and "
	               "PROGRAM's own output to standard error. Exit status: PROGRAM's "
	               "own when it fails; 0 success, 64 usage, 65 nothing to trace, 69 PROGRAM cannot be run, "
	               "74 the graph cannot be written. See tern-trace(1).",
	        .options = options,
	        .parser = parse_option,
	        .input = &t,
	        .args_doc = "-- PROGRAM [ARGS...]",
	};
	tern_cli cli;
	tern_cli_parse(&cli, &tool, argc, argv);
	/* Without -o the graph goes to standard output (binary ONNX, for a pipeline): it is written to a
	 * temporary file first, and the program's own standard output goes to standard error. */
	char tmp_graph[] = "/tmp/tern-trace-XXXXXX.onnx";
	const char *graph = cli.output;
	if (!graph) {
		if (isatty(STDOUT_FILENO))
			tern_cli_fail(TERN_EUSAGE, "standard output is a terminal: give -o FILE, or pipe the graph on");
		int fd = mkstemps(tmp_graph, 5);
		if (fd < 0)
			tern_cli_fail(TERN_EOS, "%s: %s", tmp_graph, strerror(errno));
		close(fd);
		graph = tmp_graph;
	}
	char steps[32];
	snprintf(steps, sizeof steps, "%d", t.trace_only ? 1 : t.steps);
	if (t.trace_only && t.coexec)
		tern_cli_fail(TERN_EUSAGE, "--coexec and --trace-only exclude each other");
	if (t.coexec && setenv("TERN_TRACE_COEXEC", "1", 1))
		tern_cli_fail(TERN_EOS, "setenv: %s", strerror(errno));
	if (t.trace_only && setenv("TERN_TRACE_REPLAY", "1", 1))
		tern_cli_fail(TERN_EOS, "setenv: %s", strerror(errno));
	/* a file left from before is not this run's graph */
	if (remove(graph) && errno != ENOENT)
		tern_cli_fail(TERN_EIO, "%s: %s", graph, strerror(errno));
	if (setenv("TERN_TRACE", graph, 1) || setenv("TERN_TRACE_STEPS", steps, 1) ||
	    (t.record && setenv("TERN_TRACE_RECORD", t.record, 1)) ||
	    (cli.verbose && setenv("TERN_TRACE_VERBOSE", "1", 1)))
		tern_cli_fail(TERN_EOS, "setenv: %s", strerror(errno));
	char *py = build_python();
	if (py) {
		const char *old = getenv("PYTHONPATH");
		size_t len = strlen(py) + (old ? strlen(old) : 0) + 2;
		char *path = malloc(len);
		if (!path)
			tern_cli_fail(TERN_EOS, "out of memory");
		snprintf(path, len, "%s%s%s", py, old && *old ? ":" : "", old && *old ? old : "");
		setenv("PYTHONPATH", path, 1);
		free(path);
		free(py);
	}
	char **args = calloc((size_t)t.n_program + 1, sizeof *args);
	if (!args)
		tern_cli_fail(TERN_EOS, "out of memory");
	memcpy(args, t.program, (size_t)t.n_program * sizeof *args);
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		tern_cli_fail(TERN_EOS, "fork: %s", strerror(errno));
	if (pid == 0) {
		if (!cli.output)
			dup2(STDERR_FILENO, STDOUT_FILENO); /* standard output carries the graph */
		execvp(args[0], args);
		fprintf(stderr, "tern-trace: %s: %s\n", args[0], strerror(errno));
		_exit(TERN_EUNAVAILABLE);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			tern_cli_fail(TERN_EOS, "waitpid: %s", strerror(errno));
	free(args);
	if (WIFSIGNALED(status))
		remove(graph); /* a graph written before the signal is not this run's whole result */
	if (WIFSIGNALED(status))
		tern_cli_fail(128 + WTERMSIG(status), "%s was killed by signal %d (%s); no graph written", t.program[0],
		              WTERMSIG(status), strsignal(WTERMSIG(status)));
	if (WEXITSTATUS(status)) {
		remove(graph);
		fprintf(stderr, "tern-trace: %s exited with status %d; no graph written\n", t.program[0], WEXITSTATUS(status));
		return WEXITSTATUS(status);
	}
	struct stat st;
	if (stat(graph, &st))
		tern_cli_fail(TERN_EDATA, "%s ran no tern operation that could be traced (no %s written)", t.program[0],
		              cli.output ? cli.output : "graph");
	if (!cli.output) {
		FILE *f = fopen(graph, "rb");
		char buf[1 << 16];
		size_t n;
		int bad = !f;
		while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
			bad |= fwrite(buf, 1, n, stdout) != n;
		if (f)
			fclose(f);
		remove(graph);
		if (bad || fflush(stdout))
			tern_cli_fail(TERN_EIO, "writing the graph to standard output: %s", strerror(errno));
		return 0;
	}
	tern_cli_verbose(1, "wrote %s (%lld bytes)", cli.output, (long long)st.st_size);
	return 0;
}
