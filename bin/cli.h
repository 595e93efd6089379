/* cli.h — what every tern tool shares: option names, input and output rules, messages, exit codes.
 * A tool declares its own options as an argp child and gets -o, -v, -q, --help and --version here. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

#include "tern.h"

#include <argp.h>
#include <stdio.h>

/* The common options, as parsed. */
typedef struct tern_cli {
	const char *input; /* the GRAPH argument; NULL means standard input */
	const char *output; /* -o; NULL means standard output */
	int verbose; /* -v, once per -v */
	int quiet; /* -q */
} tern_cli;

/* What a tool tells the shared parser about itself. */
typedef struct tern_cli_tool {
	const char *name; /* "tern-show": the first word of every message */
	/* argp's doc: a one-line summary, optionally "\v" and text shown after the options. */
	const char *doc;
	const struct argp_option *options; /* the tool's own options; may be NULL */
	argp_parser_t parser; /* parses them; state->input is `input` below */
	void *input;
	/* NULL: the tool reads one optional GRAPH argument, parsed here into tern_cli.input.
	 * Otherwise the tool's parser takes the positional arguments, which this string describes. */
	const char *args_doc;
	/* The tool writes graphs: it takes --inline and --external-threshold (tern_cli_write_model). */
	int writes_model;
} tern_cli_tool;

/* Parses the command line into cli and the tool's own structure. Exits 64 on a usage error and 0
 * after --help or --version. */
void tern_cli_parse(tern_cli *cli, const tern_cli_tool *tool, int argc, char **argv);

/* "NAME: MESSAGE" on stderr, then exit with status. A partly written output is removed first. */
_Noreturn void tern_cli_fail(tern_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails with the library's message (tern_error()) unless status is TERN_OK. */
void tern_cli_check(tern_status status);
/* "NAME: warning: MESSAGE" unless -q. */
void tern_cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "NAME: MESSAGE" when -v was given at least `level` times. */
void tern_cli_verbose(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Silences tern_cli_verbose (and warnings) or not; returns what it was. */
int tern_cli_set_quiet(int quiet);

/* An integer option value in [min, max]; a usage error naming `what` otherwise. */
int64_t tern_cli_count(struct argp_state *state, const char *what, const char *arg, int64_t min, int64_t max);

/* realloc, failing with 71 when out of memory. */
void *tern_cli_grow(void *items, size_t n, size_t size);
/* --dim NAME=N, repeatable: sizes of symbolic dimensions. */
typedef struct tern_cli_dims {
	const char **names; /* point into argv */
	int64_t *values;
	int n;
} tern_cli_dims;
/* Parses one NAME=N into d (a positive size, each name once); a usage error otherwise. */
void tern_cli_parse_dim(tern_cli_dims *d, char *arg, struct argp_state *state);

/* Loads the input graph (a path, or standard input) and validates it; fails with the library's
 * status (65 bad data, 66 cannot open) otherwise. */
tern_model *tern_cli_load(const tern_cli *cli);
/* -i FILE for an input that is a tensor: a tensor file, or examples of their own sizes, one a run or
 * a step: a folder of 0.npy, 1.npy, ... or an ONNX SequenceProto file (a TERN_SEQUENCE in *t). */
tern_status tern_cli_read_samples(const char *path, tern_tensor *t);

/* Opens the output: with -o, a temporary file in the target's folder that tern_cli_close_output
 * renames into place, so a failure or a signal leaves nothing behind; else standard output.
 * Binary output bound for a terminal is refused (64). Open it before reading the input, so that a
 * refusal comes before a wait on a terminal. */
FILE *tern_cli_open_output(const tern_cli *cli, int binary);
/* Flushes and closes the output, moving the temporary file into place; fails with 74. */
void tern_cli_close_output(void);
/* Writes the model as binary ONNX to out (from tern_cli_open_output) and closes the output. With -o
 * FILE, tensors read from external data (and those over --external-threshold, and all but small ones
 * when the graph would pass protobuf's 2 GB) go to FILE.data, and the two files replace what was there
 * together or not at all; to standard output everything is inline, and a graph over 2 GB is refused
 * (64). --inline keeps every tensor in FILE. */
void tern_cli_write_model(FILE *out, tern_model *model);
/* Drops the model's annotations (metadata keys starting "tern.": schedules, partitions), which a
 * rewrite of the graph makes stale, naming each under -v. */
void tern_cli_drop_annotations(tern_model *model);

#endif
