/* cli.c — the conventions every tern tool shares: common options, one-line messages and sysexits
 * codes, reading a graph from a path or standard input, and writing output that appears whole or not
 * at all. */
#include "cli.h"
#include "../lib/internal.h"

#include "tern_config.h"

#include <errno.h>
#include <fcntl.h>
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
	/* The temporary file beside the target; the signal handler reads these, so they are set
	 * with signals blocked. */
	char tmp[PATH_MAX + 32];
	volatile sig_atomic_t have_tmp;
} prog = {.name = "tern"};

static const int cleanup_signals[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM};

/* Removes a temporary output that was not moved into place. Runs at exit and on fatal signals. */
static void discard_output(void)
{
	if (prog.have_tmp) {
		unlink(prog.tmp);
		prog.have_tmp = 0;
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
	const struct argp_child children[] = {{&own, 0, NULL, 0}, {0}};
	const struct argp root = {
	        common_options,
	        parse_common,
	        tool->args_doc ? tool->args_doc : "[GRAPH]",
	        tool->doc,
	        tool->options || tool->parser ? children : NULL,
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

static FILE *open_temporary(const char *path, const struct stat *existing)
{
	const char *slash = strrchr(path, '/');
	int dir_len = slash ? (int)(slash - path + 1) : 0;
	const char *base = path + dir_len;
	if (!*base)
		tern_cli_fail(TERN_EUSAGE, "%s: not a file name", path);

	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	int n = snprintf(prog.tmp, sizeof prog.tmp, "%.*s.%s.XXXXXX", dir_len, path, base);
	int fd = n > 0 && (size_t)n < sizeof prog.tmp ? mkstemp(prog.tmp) : (errno = ENAMETOOLONG, -1);
	int err = errno;
	prog.have_tmp = fd >= 0;
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (fd < 0)
		tern_cli_fail(TERN_EIO, "%s: cannot create: %s", path, strerror(err));

	prog.target = path;
	catch_signals();
	FILE *f = fdopen(fd, "wb");
	if (!f || fchmod(fd, output_mode(existing)) != 0)
		tern_cli_fail(TERN_EIO, "%s: %s", prog.tmp, strerror(errno));
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
	prog.out = open_temporary(cli->output, exists ? &st : NULL);
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
	if (prog.have_tmp) {
		if (rename(prog.tmp, prog.target) != 0)
			tern_cli_fail(TERN_EIO, "%s: %s", prog.target, strerror(errno));
		prog.have_tmp = 0;
		tern_cli_verbose(1, "wrote %s", prog.target);
	}
}

void tern_cli_write_model(FILE *out, tern_model *model)
{
	void *bytes;
	size_t size;
	tern_cli_check(tern_model_save_bytes(model, &bytes, &size));
	if (fwrite(bytes, 1, size, out) != size)
		tern_cli_fail(TERN_EIO, "write error");
	free(bytes);
	tern_cli_close_output();
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
