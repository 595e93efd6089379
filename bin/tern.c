/* tern — runs a tern tool by its short name, as git does: `tern show ARGS` runs `tern-show ARGS`,
 * found beside this program first and then on PATH. */
#include "tern_config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
	const char *name;
	const char *summary;
} tools[] = {
        {"show", "print a graph as text, binary ONNX, Graphviz DOT, statistics or its schedule"},
        {"run", "run a graph on tensor files and write its outputs, or train it (--train)"},
        {"autodiff", "add a training step: loss, gradients and the optimizer's update"},
        {"optimize", "rewrite a graph into a faster equivalent one"},
        {"partition", "split a graph for data-parallel training on several ranks"},
        {"schedule", "assign streams and synchronisation ahead of time"},
        {"trace", "record a graph from an imperative program"},
        {"dist-run", "run a partitioned graph on several ranks"},
};

/* The folder this program was run from, where its tools are installed beside it. */
static int exec_dir(char *dir, size_t size)
{
	ssize_t n = readlink("/proc/self/exe", dir, size - 1);
	if (n <= 0)
		return 0;
	dir[n] = '\0';
	char *slash = strrchr(dir, '/');
	if (!slash)
		return 0;
	*slash = '\0';
	return 1;
}

/* Whether `tern-NAME` exists beside this program or on PATH. */
static int tool_exists(const char *name, const char *dir)
{
	char path[PATH_MAX];
	if (dir && snprintf(path, sizeof path, "%s/tern-%s", dir, name) < (int)sizeof path && !access(path, X_OK))
		return 1;
	const char *env = getenv("PATH");
	for (const char *p = env ? env : ""; *p;) {
		size_t len = strcspn(p, ":");
		if (len && snprintf(path, sizeof path, "%.*s/tern-%s", (int)len, p, name) < (int)sizeof path &&
		    !access(path, X_OK))
			return 1;
		p += len + (p[len] == ':');
	}
	return 0;
}

static void usage(FILE *f)
{
	char dir[PATH_MAX];
	int have_dir = exec_dir(dir, sizeof dir);
	fputs("usage: tern TOOL [ARGS...]\n"
	      "       tern help [TOOL]\n"
	      "       tern --version\n\n"
	      "'tern TOOL ARGS' runs 'tern-TOOL ARGS'. Installed tools:\n",
	      f);
	int found = 0;
	for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
		if (!tool_exists(tools[i].name, have_dir ? dir : NULL))
			continue;
		fprintf(f, "  %-10s %s\n", tools[i].name, tools[i].summary);
		found++;
	}
	if (!found)
		fputs("  (none found beside tern or on PATH)\n", f);
	fputs("\nEvery tool takes --help. 'tern help TOOL' opens its manual page; tern(7) describes the "
	      "toolchain.\n",
	      f);
}

/* Replaces this process with tern-NAME; returns only on failure. */
static int run_tool(const char *name, char **argv)
{
	char program[NAME_MAX + 1];
	if (strchr(name, '/') || snprintf(program, sizeof program, "tern-%s", name) >= (int)sizeof program) {
		fprintf(stderr, "tern: '%s' is not a tern tool; see 'tern --help'\n", name);
		return 64;
	}
	argv[0] = program;
	char dir[PATH_MAX], path[PATH_MAX];
	if (exec_dir(dir, sizeof dir) && snprintf(path, sizeof path, "%s/%s", dir, program) < (int)sizeof path &&
	    !access(path, X_OK))
		execv(path, argv);
	else
		execvp(program, argv);
	if (errno == ENOENT) {
		fprintf(stderr, "tern: '%s' is not a tern tool; see 'tern --help'\n", name);
		return 64;
	}
	fprintf(stderr, "tern: %s: %s\n", program, strerror(errno));
	return 71;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 64;
	}
	const char *first = argv[1];
	if (!strcmp(first, "--help") || !strcmp(first, "-h") || (!strcmp(first, "help") && argc == 2)) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(first, "--version")) {
		printf("tern (tern) %s\n", TERN_VERSION);
		return 0;
	}
	if (first[0] == '-') {
		fprintf(stderr, "tern: unknown option '%s'; see 'tern --help'\n", first);
		return 64;
	}
	if (!strcmp(first, "help")) {
		char page[NAME_MAX + 1];
		snprintf(page, sizeof page, "tern-%s", argv[2]);
		char *man[] = {"man", page, NULL};
		execvp("man", man);
		fprintf(stderr, "tern: man: %s\n", strerror(errno));
		return 71;
	}
	return run_tool(first, argv + 1);
}
