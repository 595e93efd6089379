/* cli.c — the conventions every tern tool shares: common options, one-line messages and sysexits
 * codes, reading a graph from a path or standard input, and writing output that appears whole or not
 * at all. */
#include "cli.h"
#include "../lib/internal.h"

#include "tern_config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct {
	const char *name;
	int verbose;
	int quiet;
	FILE *out;
	const char *target; /* the -o path being replaced */
	/* Temporary files beside the target (the model, its data file); the signal handler reads these,
	 * so they are set with signals blocked. */
	char tmp[2][PATH_MAX + 32];
	volatile sig_atomic_t have_tmp[2];
	tern_save_options save; /* --inline, --external-threshold */
} prog = {.name = "tern", .save = {.external_threshold = -1}};

enum { TMP_MODEL, TMP_DATA };

static const int cleanup_signals[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM};

/* Removes temporary outputs that were not moved into place. Runs at exit and on fatal signals. */
static void discard_output(void)
{
	for (int i = 0; i < 2; i++)
		if (prog.have_tmp[i]) {
			unlink(prog.tmp[i]);
			prog.have_tmp[i] = 0;
		}
}

static void on_signal(int sig)
{
	discard_output();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void catch_signals(void)
{
	/* Over the file-size limit (ulimit -f) a write then fails with EFBIG, which is reported and
	 * cleaned up like any failed write, instead of the signal killing the tool mid-file. */
	signal(SIGXFSZ, SIG_IGN);
	for (size_t i = 0; i < sizeof cleanup_signals / sizeof cleanup_signals[0]; i++) {
		struct sigaction old, sa = {.sa_handler = on_signal};
		sigemptyset(&sa.sa_mask);
		/* A signal the caller ignores (nohup) stays ignored. */
		if (sigaction(cleanup_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			sigaction(cleanup_signals[i], &sa, NULL);
	}
}

static void vmessage(const char *prefix, const char *fmt, va_list ap)
{
	char line[2048];
	vsnprintf(line, sizeof line, fmt, ap);
	/* One line per message, whatever the library put in it, so that stderr stays greppable. */
	for (char *p = line; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	fprintf(stderr, "%s: %s%s\n", prog.name, prefix, line);
}

_Noreturn void tern_cli_fail(tern_status status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage("", fmt, ap);
	va_end(ap);
	discard_output();
	exit(status == TERN_OK ? TERN_EINTERNAL : (int)status);
}

void tern_cli_check(tern_status status)
{
	if (status == TERN_OK)
		return;
	if (tern_error()[0])
		tern_cli_fail(status, "%s", tern_error());
	tern_cli_fail(status, "failed (status %d) without a message", (int)status);
}

void tern_cli_warn(const char *fmt, ...)
{
	if (prog.quiet)
		return;
	va_list ap;
	va_start(ap, fmt);
	vmessage("warning: ", fmt, ap);
	va_end(ap);
}

int64_t tern_cli_count(struct argp_state *state, const char *what, const char *arg, int64_t min, int64_t max)
{
	char *end;
	errno = 0;
	long long v = strtoll(arg, &end, 10);
	if (errno || end == arg || *end || v < min || v > max)
		argp_error(state, "%s must be an integer from %" PRId64 " to %" PRId64 ", not '%s'", what, min, max,
		           arg);
	return v;
}

int tern_cli_set_quiet(int quiet)
{
	int was = prog.quiet;
	prog.quiet = quiet;
	return was;
}

void tern_cli_verbose(int level, const char *fmt, ...)
{
	if (prog.quiet || prog.verbose < level)
		return;
	va_list ap;
	va_start(ap, fmt);
	vmessage("", fmt, ap);
	va_end(ap);
}

/* ---------------------------------------------------------------- command line */

struct parse_ctx {
	tern_cli *cli;
	const tern_cli_tool *tool;
};

static const struct argp_option common_options[] = {
        {"output", 'o', "FILE", 0, "write to FILE instead of standard output; FILE is replaced only on success", -2},
        {"verbose", 'v', NULL, 0, "say what is done on standard error (repeat for more)", -2},
        {"quiet", 'q', NULL, 0, "print only errors", -2},
        {0},
};

enum { OPT_INLINE = 0x1000, OPT_EXTERNAL_THRESHOLD };

static const struct argp_option model_output_options[] = {
        {0, 0, 0, 0, "Writing the graph (tensors read from external data go to FILE.data with -o):", -3},
        {"inline", OPT_INLINE, NULL, 0, "keep every tensor inside the graph file (at most 2 GB in all)", -3},
        {"external-threshold", OPT_EXTERNAL_THRESHOLD, "BYTES", 0,
         "with -o, also move tensors of at least BYTES (suffix k, M or G: powers of 1024) to FILE.data", -3},
        {0},
};

static error_t parse_model_output(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case OPT_INLINE: prog.save.inline_all = 1; return 0;
	case OPT_EXTERNAL_THRESHOLD: {
		char *end;
		errno = 0;
		long long v = strtoll(arg, &end, 10);
		long long scale = 1;
		if (*end == 'k' || *end == 'K')
			scale = 1LL << 10, end++;
		else if (*end == 'M')
			scale = 1LL << 20, end++;
		else if (*end == 'G')
			scale = 1LL << 30, end++;
		if (errno || end == arg || *end || v < 0 || v > LLONG_MAX / scale)
			argp_error(state, "--external-threshold takes a byte count (like 1024 or 4M), not '%s'", arg);
		prog.save.external_threshold = v * scale;
		return 0;
	}
	default: return ARGP_ERR_UNKNOWN;
	}
}

static error_t parse_common(int key, char *arg, struct argp_state *state)
{
	struct parse_ctx *ctx = state->input;
	switch (key) {
	case ARGP_KEY_INIT:
		if (state->root_argp->children)
			state->child_inputs[0] = ctx->tool->input;
		return 0;
	case 'o': ctx->cli->output = strcmp(arg, "-") ? arg : NULL; return 0;
	case 'v': ctx->cli->verbose++; return 0;
	case 'q': ctx->cli->quiet = 1; return 0;
	case ARGP_KEY_ARG:
		if (ctx->tool->args_doc)
			return ARGP_ERR_UNKNOWN;
		if (state->arg_num > 0)
			argp_error(state, "one graph at most (got '%s' after '%s')", arg,
			           ctx->cli->input ? ctx->cli->input : "-");
		ctx->cli->input = strcmp(arg, "-") ? arg : NULL;
		return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

static void print_version(FILE *stream, struct argp_state *state)
{
	fprintf(stream, "%s (tern) %s\n", prog.name, TERN_VERSION);
}

void tern_cli_parse(tern_cli *cli, const tern_cli_tool *tool, int argc, char **argv)
{
	*cli = (tern_cli){0};
	prog.name = tool->name;
	argp_program_version_hook = print_version;
	argp_err_exit_status = TERN_EUSAGE;
	atexit(discard_output);

	const struct argp own = {tool->options, tool->parser, NULL, NULL, NULL, NULL, NULL};
	const struct argp model_output = {model_output_options, parse_model_output, NULL, NULL, NULL, NULL, NULL};
	const struct argp_child children[] = {{&own, 0, NULL, 0}, {tool->writes_model ? &model_output : NULL, 0, NULL, 0},
	                                      {0}};
	const struct argp root = {
	        common_options,
	        parse_common,
	        tool->args_doc ? tool->args_doc : "[GRAPH]",
	        tool->doc,
	        tool->options || tool->parser || tool->writes_model ? children : NULL,
	        NULL,
	        NULL,
	};
	struct parse_ctx ctx = {cli, tool};
	argp_parse(&root, argc, argv, 0, NULL, &ctx);
	prog.verbose = cli->verbose;
	prog.quiet = cli->quiet;
	/* a misspelt cap would otherwise measure the machine's best path under another name */
	tern_cli_check(tern_isa_check());
}

void *tern_cli_grow(void *items, size_t n, size_t size)
{
	void *p = realloc(items, n * size);
	if (!p)
		tern_cli_fail(TERN_EOS, "out of memory");
	return p;
}

void tern_cli_parse_dim(tern_cli_dims *d, char *arg, struct argp_state *state)
{
	char *eq = strchr(arg, '='), *end;
	if (!eq || eq == arg)
		argp_error(state, "--dim takes NAME=N, not '%s'", arg);
	*eq = '\0';
	errno = 0;
	long long v = strtoll(eq + 1, &end, 10);
	if (errno || end == eq + 1 || *end || v < 1)
		argp_error(state, "--dim %s: the size must be a positive integer, not '%s'", arg, eq + 1);
	for (int i = 0; i < d->n; i++)
		if (strcmp(d->names[i], arg) == 0)
			argp_error(state, "--dim %s is given twice", arg);
	d->names = tern_cli_grow(d->names, (size_t)d->n + 1, sizeof *d->names);
	d->values = tern_cli_grow(d->values, (size_t)d->n + 1, sizeof *d->values);
	d->names[d->n] = arg;
	d->values[d->n++] = v;
}

/* ---------------------------------------------------------------- input */

tern_model *tern_cli_load(const tern_cli *cli)
{
	tern_model *model = NULL;
	tern_cli_check(tern_model_load(cli->input, &model));
	tern_status status = tern_model_validate(model);
	if (status != TERN_OK) {
		tern_model_free(model);
		tern_cli_check(status);
	}
	tern_cli_verbose(1, "read %s", tern_model_source(model));
	return model;
}

/* ---------------------------------------------------------------- output */

static void refuse_terminal(int fd, int binary, const char *where)
{
	if (binary && isatty(fd))
		tern_cli_fail(TERN_EUSAGE, "refusing to write binary output to a terminal (%s); use -o FILE or a pipe",
		              where);
}

/* The mode a new file gets, or the mode of the file being replaced. */
static mode_t output_mode(const struct stat *existing)
{
	if (existing)
		return existing->st_mode & 07777;
	mode_t mask = umask(0);
	umask(mask);
	return 0666 & ~mask;
}

/* Creates the temporary file `which` beside path (".NAME.XXXXXX" in its folder), so that a rename
 * puts it in place atomically; fails with 74. */
static FILE *open_temporary(int which, const char *path, const struct stat *existing)
{
	const char *slash = strrchr(path, '/');
	int dir_len = slash ? (int)(slash - path + 1) : 0;
	const char *base = path + dir_len;
	if (!*base)
		tern_cli_fail(TERN_EUSAGE, "%s: not a file name", path);

	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	char *tmp = prog.tmp[which];
	int n = snprintf(tmp, sizeof prog.tmp[which], "%.*s.%s.XXXXXX", dir_len, path, base);
	int fd = n > 0 && (size_t)n < sizeof prog.tmp[which] ? mkstemp(tmp) : (errno = ENAMETOOLONG, -1);
	int err = errno;
	prog.have_tmp[which] = fd >= 0;
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (fd < 0)
		tern_cli_fail(TERN_EIO, "%s: cannot create: %s", path, strerror(err));

	catch_signals();
	FILE *f = fdopen(fd, "wb");
	if (!f || fchmod(fd, output_mode(existing)) != 0)
		tern_cli_fail(TERN_EIO, "%s: %s", tmp, strerror(errno));
	return f;
}

FILE *tern_cli_open_output(const tern_cli *cli, int binary)
{
	if (!cli->output) {
		refuse_terminal(STDOUT_FILENO, binary, "standard output");
		prog.out = stdout;
		return stdout;
	}
	struct stat st;
	int exists = stat(cli->output, &st) == 0;
	if (exists && !S_ISREG(st.st_mode)) {
		/* A device or a pipe (-o /dev/stdout) cannot be replaced by renaming: write to it. */
		FILE *f = fopen(cli->output, "wb");
		if (!f)
			tern_cli_fail(TERN_EIO, "%s: %s", cli->output, strerror(errno));
		prog.out = f;
		prog.target = cli->output;
		refuse_terminal(fileno(f), binary, cli->output);
		return f;
	}
	prog.target = cli->output;
	prog.out = open_temporary(TMP_MODEL, cli->output, exists ? &st : NULL);
	return prog.out;
}

void tern_cli_close_output(void)
{
	FILE *f = prog.out;
	if (!f)
		return;
	prog.out = NULL;
	const char *what = prog.target ? prog.target : "standard output";
	int failed = fflush(f) != 0 || ferror(f);
	int err = errno;
	if (f != stdout && fclose(f) != 0 && !failed) {
		failed = 1;
		err = errno;
	}
	if (failed)
		tern_cli_fail(TERN_EIO, "%s: write failed: %s", what, strerror(err));
	if (prog.have_tmp[TMP_MODEL]) {
		if (rename(prog.tmp[TMP_MODEL], prog.target) != 0)
			tern_cli_fail(TERN_EIO, "%s: %s", prog.target, strerror(errno));
		prog.have_tmp[TMP_MODEL] = 0;
		tern_cli_verbose(1, "wrote %s", prog.target);
	}
}

/* Moves the data file's temporary into place at data_path and then the model's; should the second
 * rename fail, the data file that was there before is put back, so that the two are replaced together
 * or not at all. */
static void commit_pair(const char *data_path)
{
	char backup[PATH_MAX + 48];
	int have_backup = 0;
	struct stat sb;
	if (lstat(data_path, &sb) == 0 && S_ISREG(sb.st_mode)) {
		snprintf(backup, sizeof backup, "%s.%ld.old", data_path, (long)getpid());
		unlink(backup);
		have_backup = link(data_path, backup) == 0;
	}
	/* a signal between the two renames would leave one file new and the other old */
	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	if (rename(prog.tmp[TMP_DATA], data_path) != 0)
		tern_cli_fail(TERN_EIO, "%s: %s", data_path, strerror(errno));
	prog.have_tmp[TMP_DATA] = 0;
	if (rename(prog.tmp[TMP_MODEL], prog.target) != 0) {
		int err = errno;
		if (have_backup)
			rename(backup, data_path);
		else
			unlink(data_path);
		tern_cli_fail(TERN_EIO, "%s: %s", prog.target, strerror(err));
	}
	prog.have_tmp[TMP_MODEL] = 0;
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (have_backup)
		unlink(backup);
	tern_cli_verbose(1, "wrote %s and %s", prog.target, data_path);
}

void tern_cli_write_model(FILE *out, tern_model *model)
{
	if (!prog.have_tmp[TMP_MODEL]) {
		/* standard output or a device: one stream, so everything inline */
		tern_cli_check(tern_model_write(model, out, NULL, NULL, NULL, &prog.save, NULL));
		tern_cli_close_output();
		return;
	}
	const char *slash = strrchr(prog.target, '/');
	const char *base = slash ? slash + 1 : prog.target;
	char data_path[PATH_MAX], location[PATH_MAX];
	if ((size_t)snprintf(data_path, sizeof data_path, "%s.data", prog.target) >= sizeof data_path ||
	    (size_t)snprintf(location, sizeof location, "%s.data", base) >= sizeof location)
		tern_cli_fail(TERN_EUSAGE, "%s: name too long", prog.target);
	struct stat sb;
	FILE *data = open_temporary(TMP_DATA, data_path, stat(data_path, &sb) == 0 ? &sb : NULL);
	int wrote = 0;
	tern_status st = tern_model_write(model, out, data, data_path, location, &prog.save, &wrote);
	int failed = fflush(data) != 0 || ferror(data);
	int err = errno;
	if (fclose(data) != 0 && !failed) {
		failed = 1;
		err = errno;
	}
	tern_cli_check(st);
	if (failed)
		tern_cli_fail(TERN_EIO, "%s: write failed: %s", data_path, strerror(err));
	if (!wrote) {
		unlink(prog.tmp[TMP_DATA]);
		prog.have_tmp[TMP_DATA] = 0;
		tern_cli_close_output();
		return;
	}
	/* the model's temporary is complete before either file is replaced */
	FILE *f = prog.out;
	prog.out = NULL;
	if (fflush(f) != 0 || ferror(f) || fclose(f) != 0)
		tern_cli_fail(TERN_EIO, "%s: write failed: %s", prog.target, strerror(errno));
	commit_pair(data_path);
}

void tern_cli_drop_annotations(tern_model *model)
{
	const Onnx__ModelProto *mp = model->proto;
	for (size_t i = 0; i < mp->n_metadata_props; i++) {
		const char *k = mp->metadata_props[i]->key;
		if (k && strncmp(k, "tern.", 5) == 0)
			tern_cli_verbose(1, "dropped the annotation %s: the rewritten graph makes it stale", k);
	}
	tern_model_drop_meta_prefix(model, "tern.");
}

tern_status tern_cli_read_samples(const char *path, tern_tensor *t)
{
	struct stat sb;
	if (strcmp(path, "-") != 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
		return tern_value_read_file(path, TERN_SEQUENCE, t);
	tern_status st = tern_tensor_read_file(path, t);
	if (st && strcmp(path, "-") != 0 && tern_value_read_file(path, TERN_SEQUENCE, t) == TERN_OK)
		return TERN_OK;
	return st ? tern_tensor_read_file(path, t) : TERN_OK; /* the tensor reader's message */
}
