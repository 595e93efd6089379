/* tern-run — runs a graph on inputs from tensor files or random ones: writes, prints, times and
 * profiles its outputs. Plans once, then runs the plan as often as asked. */
#include "../lib/internal.h"
#include "cli.h"
#include "train.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct run {
	const char **input_args; /* -i values as given, resolved once the graph is read */
	int n_input_args;
	const char **dim_names; /* --dim, then dimensions learnt from input files */
	int64_t *dim_values;
	int n_dims;
	int random;
	uint64_t seed;
	const char *out_dir;
	int out_pb;
	int print;
	int json;
	int iters;
	int warmup;
	int threads;
	const char *profile;
	int single_stream;
	int optimize; /* --optimize LEVEL; -1 when not given */
	int graph_from_stdin;
	int train; /* --train, with the options below */
	train_options t;
};

enum {
	OPT_RANDOM = 256,
	OPT_SEED,
	OPT_DIM,
	OPT_OUTPUT_FORMAT,
	OPT_PRINT,
	OPT_ITERS,
	OPT_WARMUP,
	OPT_JSON,
	OPT_THREADS,
	OPT_PROFILE,
	OPT_SINGLE_STREAM,
	OPT_OPTIMIZE,
	OPT_TRAIN,
};

static const struct argp_option options[] = {
        {NULL, 0, NULL, 0, "Inputs:", 1},
        {"input", 'i', "[NAME=]FILE", 0,
         "a graph input from a .npy or .pb file; without NAME, the next input in graph order", 1},
        {"random", OPT_RANDOM, NULL, 0, "fill inputs not given with -i with random values", 1},
        {"seed", OPT_SEED, "S", 0, "seed of --random (default 0)", 1},
        {"dim", OPT_DIM, "NAME=N", 0, "the value of symbolic dimension NAME", 1},
        {NULL, 0, NULL, 0, "Outputs:", 2},
        {"output-dir", 'O', "DIR", 0, "write each output to DIR/NAME.npy", 2},
        {"output-format", OPT_OUTPUT_FORMAT, "FMT", 0, "npy (the default) or pb, for -O", 2},
        {"print", OPT_PRINT, NULL, 0,
         "print each output's name, type, first values and checksums (the default without -O and --json)", 2},
        {"json", OPT_JSON, NULL, 0, "print timings, memory and output checksums as one JSON object", 2},
        {"profile", OPT_PROFILE, "FILE", 0, "write a Chrome trace of the last timed run to FILE", 2},
        {NULL, 0, NULL, 0, "Running:", 3},
        {"iters", OPT_ITERS, "N", 0, "timed runs (default 1)", 3},
        {"warmup", OPT_WARMUP, "W", 0, "untimed runs before them (default 0)", 3},
        {"threads", OPT_THREADS, "N", 0, "threads for streams and within operators (default 1; 0: one per CPU)", 3},
        {"single-stream", OPT_SINGLE_STREAM, NULL, 0, "run nodes one after another, ignoring a schedule in the graph",
         3},
        {"optimize", OPT_OPTIMIZE, "LEVEL", 0,
         "rewrite the graph in memory as tern-optimize -OLEVEL does before planning (default 2; 0: run it as "
         "given; a scheduled graph runs as given unless this is set)",
         3},
        {NULL, 0, NULL, 0, "Training (a model from tern-autodiff; -o FILE writes the trained model):", 4},
        {"train", OPT_TRAIN, NULL, 0, "run the model's training algorithm over the -i data instead of inference", 4},
        TRAIN_ARGP_OPTIONS(4),
        {0},
};



static void add_dim(struct run *run, const char *name, int64_t value)
{
	run->dim_names = tern_cli_grow(run->dim_names, (size_t)run->n_dims + 1, sizeof *run->dim_names);
	run->dim_values = tern_cli_grow(run->dim_values, (size_t)run->n_dims + 1, sizeof *run->dim_values);
	run->dim_names[run->n_dims] = name;
	run->dim_values[run->n_dims++] = value;
}

static const int64_t *find_dim(const struct run *run, const char *name)
{
	for (int i = 0; i < run->n_dims; i++)
		if (strcmp(run->dim_names[i], name) == 0)
			return &run->dim_values[i];
	return NULL;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* What onnxruntime does when a session loads, with tern-optimize's passes: fused convolutions and
 * products, elementwise chains, folded constants. A schedule was made for the graph as it is, so a
 * scheduled graph is rewritten (and its schedule dropped) only when --optimize asks for it. */
static void optimize_graph(const struct run *run, tern_model *model)
{
	int level = run->optimize < 0 ? 2 : run->optimize;
	if (level == 0)
		return;
	if (tern_model_meta(model, TERN_SCHEDULE_KEY)) {
		if (run->optimize < 0) {
			tern_cli_verbose(1, "the graph is scheduled: running it as given (--optimize rewrites it and drops "
			                    "the schedule)");
			return;
		}
		tern_cli_drop_annotations(model);
	}
	const tern_optimize_options o = {.level = level};
	double t0 = now_ms();
	tern_cli_check(tern_optimize(model, &o, NULL, NULL));
	tern_cli_verbose(1, "optimised at level %d in %.3f ms", level, now_ms() - t0);
}

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	struct run *run = state->input;
	switch (key) {
	case 'i':
		run->input_args = tern_cli_grow(run->input_args, (size_t)run->n_input_args + 1, sizeof *run->input_args);
		run->input_args[run->n_input_args++] = arg;
		return 0;
	case OPT_RANDOM: run->random = 1; return 0;
	case OPT_SEED: run->seed = (uint64_t)tern_cli_count(state, "--seed", arg, 0, INT64_MAX); return 0;
	case OPT_DIM: {
		char *eq = strchr(arg, '=');
		if (!eq || eq == arg)
			argp_error(state, "--dim takes NAME=N, not '%s'", arg);
		*eq = '\0';
		if (find_dim(run, arg))
			argp_error(state, "--dim %s is given twice", arg);
		add_dim(run, arg, tern_cli_count(state, "--dim value", eq + 1, 0, INT64_MAX));
		return 0;
	}
	case 'O': run->out_dir = arg; return 0;
	case OPT_OUTPUT_FORMAT:
		if (strcmp(arg, "npy") && strcmp(arg, "pb"))
			argp_error(state, "unknown output format '%s' (npy or pb)", arg);
		run->out_pb = strcmp(arg, "pb") == 0;
		return 0;
	case OPT_PRINT: run->print = 1; return 0;
	case OPT_JSON: run->json = 1; return 0;
	case OPT_PROFILE: run->profile = arg; return 0;
	case OPT_ITERS: run->iters = (int)tern_cli_count(state, "--iters", arg, 1, 1000000000); return 0;
	case OPT_WARMUP: run->warmup = (int)tern_cli_count(state, "--warmup", arg, 0, 1000000000); return 0;
	case OPT_THREADS: run->threads = (int)tern_cli_count(state, "--threads", arg, 0, 4096); return 0;
	case OPT_OPTIMIZE: run->optimize = (int)tern_cli_count(state, "--optimize", arg, 0, 3); return 0;
	case OPT_SINGLE_STREAM: run->single_stream = 1; return 0;
	case OPT_TRAIN: run->train = 1; return 0;
	default: return train_parse_option(&run->t, key, arg, state);
	}
}

/* ---------------------------------------------------------------- inputs */

/* The declared type of input i, as "float[N,3]" with symbolic names ("?" when unknown). */
struct declared {
	int dtype;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	const char *params[TERN_MAX_RANK];
	char text[160];
};

static void declared_type(tern_model *model, int i, struct declared *d)
{
	memset(d, 0, sizeof *d);
	tern_cli_check(tern_model_input_type(model, i, &d->dtype, &d->rank, d->dims, d->params));
	size_t n = (size_t)snprintf(d->text, sizeof d->text, "%s", d->dtype ? tern_dtype_name(d->dtype) : "?");
	if (d->rank < 0) {
		snprintf(d->text + n, sizeof d->text - n, "[...]");
		return;
	}
	for (int k = 0; k <= d->rank && n < sizeof d->text; k++) {
		const char *sep = k == 0 ? "[" : ",";
		if (k == d->rank)
			n += (size_t)snprintf(d->text + n, sizeof d->text - n, "%s]", d->rank ? "" : "[");
		else if (d->dims[k] >= 0)
			n += (size_t)snprintf(d->text + n, sizeof d->text - n, "%s%" PRId64, sep, d->dims[k]);
		else
			n += (size_t)snprintf(d->text + n, sizeof d->text - n, "%s%s", sep,
			                      d->params[k] && *d->params[k] ? d->params[k] : "?");
	}
}

/* Checks a tensor from a file against the declared type and learns its symbolic dimensions. */
static void check_input(struct run *run, tern_model *model, int i, const tern_tensor *t, const char *path)
{
	struct declared d;
	declared_type(model, i, &d);
	char have[160];
	tern_shape_str(t->dtype, t->rank, t->dims, have, sizeof have);
	const char *name = tern_model_input_name(model, i);
	if ((d.dtype && d.dtype != t->dtype) || (d.rank >= 0 && d.rank != t->rank))
		tern_cli_fail(TERN_EDATA, "input '%s': %s holds %s, the graph wants %s", name, path, have, d.text);
	for (int k = 0; d.rank >= 0 && k < d.rank; k++) {
		if (d.dims[k] >= 0) {
			if (d.dims[k] != t->dims[k])
				tern_cli_fail(TERN_EDATA, "input '%s': %s holds %s, the graph wants %s", name, path,
				              have, d.text);
			continue;
		}
		if (!d.params[k] || !*d.params[k])
			continue;
		const int64_t *bound = find_dim(run, d.params[k]);
		if (bound && *bound != t->dims[k])
			tern_cli_fail(TERN_EDATA,
			              "input '%s': %s holds %s, but dimension '%s' is %" PRId64
			              " (from --dim or an earlier input)",
			              name, path, have, d.params[k], *bound);
		if (!bound)
			add_dim(run, d.params[k], t->dims[k]);
	}
}

/* splitmix64: small, fast, and the same sequence on every machine. */
static uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1) on a grid of 2^-k, so that every value is exact in the narrow float types. */
static double random_unit(uint64_t *state, int bits)
{
	return (double)(next_random(state) >> (64 - bits - 1)) / (double)(1ull << bits) - 1.0;
}

/* A value in [-1, 1) that is a multiple of 2^-10 as IEEE half: exact, so no rounding code is needed. */
static uint16_t to_half(double v)
{
	if (v == 0)
		return 0;
	int e;
	double m = frexp(fabs(v), &e); /* |v| = m * 2^e, m in [0.5, 1) */
	uint16_t sign = v < 0 ? 0x8000 : 0;
	return (uint16_t)(sign | (uint16_t)(e - 1 + 15) << 10 | (uint16_t)((m * 2 - 1) * 1024));
}

static void fill_random(tern_tensor *t, uint64_t *state, const char *name)
{
	int64_t n = tern_tensor_numel(t);
	for (int64_t j = 0; j < n; j++) {
		/* Integers stay small and non-negative, so that they work as indices and sizes. */
		uint64_t small = next_random(state) % 4;
		switch (t->dtype) {
		case TERN_FLOAT: ((float *)t->data)[j] = (float)random_unit(state, 24); break;
		case TERN_DOUBLE: ((double *)t->data)[j] = random_unit(state, 53); break;
		case TERN_COMPLEX64:
			((float *)t->data)[2 * j] = (float)random_unit(state, 24);
			((float *)t->data)[2 * j + 1] = (float)random_unit(state, 24);
			break;
		case TERN_COMPLEX128:
			((double *)t->data)[2 * j] = random_unit(state, 53);
			((double *)t->data)[2 * j + 1] = random_unit(state, 53);
			break;
		case TERN_FLOAT16: ((uint16_t *)t->data)[j] = to_half(random_unit(state, 10)); break;
		case TERN_BFLOAT16: {
			float f = (float)random_unit(state, 7);
			uint32_t bits;
			memcpy(&bits, &f, 4);
			((uint16_t *)t->data)[j] = (uint16_t)(bits >> 16);
			break;
		}
		case TERN_BOOL: ((uint8_t *)t->data)[j] = (uint8_t)(small & 1); break;
		case TERN_INT8:
		case TERN_UINT8: ((uint8_t *)t->data)[j] = (uint8_t)small; break;
		case TERN_INT16:
		case TERN_UINT16: ((uint16_t *)t->data)[j] = (uint16_t)small; break;
		case TERN_INT32:
		case TERN_UINT32: ((uint32_t *)t->data)[j] = (uint32_t)small; break;
		case TERN_INT64:
		case TERN_UINT64: ((uint64_t *)t->data)[j] = small; break;
		default:
			tern_cli_fail(TERN_EDATA, "input '%s': --random cannot make %s values; give it with -i", name,
			              tern_dtype_name(t->dtype));
		}
	}
}

static void make_random(struct run *run, tern_model *model, int i, tern_tensor *t, uint64_t *state)
{
	struct declared d;
	declared_type(model, i, &d);
	const char *name = tern_model_input_name(model, i);
	if (!d.dtype || d.rank < 0)
		tern_cli_fail(TERN_EDATA, "input '%s' has no declared type (%s); give it with -i", name, d.text);
	int64_t dims[TERN_MAX_RANK];
	for (int k = 0; k < d.rank; k++) {
		dims[k] = d.dims[k];
		if (dims[k] >= 0)
			continue;
		const int64_t *bound = d.params[k] && *d.params[k] ? find_dim(run, d.params[k]) : NULL;
		if (!bound && d.params[k] && *d.params[k])
			tern_cli_fail(TERN_EDATA, "input '%s' (%s): give the size of dimension '%s' with --dim %s=SIZE",
			              name, d.text, d.params[k], d.params[k]);
		if (!bound)
			tern_cli_fail(TERN_EDATA, "input '%s' (%s): dimension %d has no size or name; give it with -i",
			              name, d.text, k);
		dims[k] = *bound;
	}
	tern_cli_check(tern_tensor_alloc(t, d.dtype, d.rank, dims));
	fill_random(t, state, name);
}

static int input_index(tern_model *model, const char *name, size_t len)
{
	for (int i = 0; i < tern_model_num_inputs(model); i++) {
		const char *n = tern_model_input_name(model, i);
		if (strlen(n) == len && strncmp(n, name, len) == 0)
			return i;
	}
	return -1;
}

static void load_input(struct run *run, tern_model *model, tern_tensor *inputs, int i, const char *path)
{
	if (inputs[i].dtype)
		tern_cli_fail(TERN_EUSAGE, "input '%s' is given twice", tern_model_input_name(model, i));
	if (run->graph_from_stdin && strcmp(path, "-") == 0)
		tern_cli_fail(TERN_EUSAGE,
		              "input '%s': standard input holds the graph; give GRAPH as a file to read -i -",
		              tern_model_input_name(model, i));
	int kind = tern_model_input_kind(model, i);
	tern_cli_check(kind ? tern_value_read_file(path, kind, &inputs[i]) : tern_cli_read_samples(path, &inputs[i]));
	if (!kind && inputs[i].dtype == TERN_SEQUENCE) {
		/* examples of their own sizes: each checked as the input it stands for, its sizes its own */
		const tern_sequence *q = tern_sequence_of(&inputs[i]);
		int n_dims = run->n_dims;
		for (size_t e = 0; e < q->n; e++) {
			char where[4200];
			snprintf(where, sizeof where, "%s (example %zu)", path, e);
			check_input(run, model, i, &q->items[e], where);
			run->n_dims = n_dims; /* the names of sizes bound by an example hold for it alone */
		}
	} else if (!kind) {
		check_input(run, model, i, &inputs[i], path);
	}
	else if (kind == TERN_SEQUENCE && inputs[i].dtype != TERN_SEQUENCE)
		tern_cli_fail(TERN_EDATA, "input '%s': the graph wants a sequence, %s holds a tensor",
		              tern_model_input_name(model, i), path);
	tern_cli_verbose(2, "input '%s' from %s", tern_model_input_name(model, i), path);
}

/* NAME=FILE arguments first, then bare FILEs into the inputs left, in graph order. A FILE that
 * contains '=' but whose prefix names no input is taken whole. */
static tern_tensor *read_inputs(struct run *run, tern_model *model, int n)
{
	tern_tensor *inputs = calloc((size_t)n + 1, sizeof *inputs);
	const char **bare = calloc((size_t)run->n_input_args + 1, sizeof *bare);
	if (!inputs || !bare)
		tern_cli_fail(TERN_EOS, "out of memory");
	int n_bare = 0;
	for (int a = 0; a < run->n_input_args; a++) {
		const char *arg = run->input_args[a];
		const char *eq = strchr(arg, '=');
		int i = eq ? input_index(model, arg, (size_t)(eq - arg)) : -1;
		if (i >= 0)
			load_input(run, model, inputs, i, eq + 1);
		else if (eq && access(arg, F_OK) != 0)
			tern_cli_fail(TERN_EUSAGE, "-i %s: the graph has no input '%.*s'", arg, (int)(eq - arg), arg);
		else
			bare[n_bare++] = arg;
	}
	int next = 0;
	for (int b = 0; b < n_bare; b++) {
		while (next < n && inputs[next].dtype)
			next++;
		if (next == n)
			tern_cli_fail(TERN_EUSAGE, "-i %s: the graph has only %d input%s", bare[b], n,
			              n == 1 ? "" : "s");
		load_input(run, model, inputs, next, bare[b]);
	}
	free(bare);

	uint64_t state = run->seed;
	for (int i = 0; i < n; i++) {
		if (inputs[i].dtype)
			continue;
		int kind = tern_model_input_kind(model, i);
		if (kind == TERN_NONE) {
			/* an optional input that is not given is empty */
			inputs[i].dtype = TERN_NONE;
			tern_cli_verbose(2, "input '%s' is an empty optional", tern_model_input_name(model, i));
			continue;
		}
		if (kind == TERN_SEQUENCE)
			tern_cli_fail(TERN_EDATA, "input '%s' is a sequence; give it with -i %s=FOLDER (0.npy, 1.npy, ...) "
			              "or a SequenceProto .pb file", tern_model_input_name(model, i),
			              tern_model_input_name(model, i));
		struct declared d;
		declared_type(model, i, &d);
		if (!run->random)
			tern_cli_fail(TERN_EDATA,
			              "input '%s' (%s) has no value; give it with -i %s=FILE or use --random",
			              tern_model_input_name(model, i), d.text, tern_model_input_name(model, i));
		make_random(run, model, i, &inputs[i], &state);
	}
	return inputs;
}

/* Points view[i] at example e of each input that holds examples (per_example[i]; NULL: none). */
static void set_example(tern_tensor *view, const tern_tensor *inputs, const bool *per_example, int n, int64_t e)
{
	for (int i = 0; per_example && i < n; i++)
		if (per_example[i]) {
			view[i] = tern_sequence_of(&inputs[i])->items[e];
			view[i].owns_data = 0;
			view[i].name = NULL;
		}
}

/* ---------------------------------------------------------------- outputs */

/* Output names are free text in ONNX; a file name keeps letters, digits, '-', '_' and inner dots
 * (a leading one would hide the file, "." and ".." name folders). */
static void file_name_for(const char *name, int index, char *buf, size_t size)
{
	size_t n = 0;
	for (const char *p = name; *p && n + 1 < size && n < 200; p++, n++) {
		bool inner_dot = *p == '.' && n > 0 && p[1];
		buf[n] = isalnum((unsigned char)*p) || *p == '-' || *p == '_' || inner_dot ? *p : '_';
	}
	buf[n] = '\0';
	if (n == 0)
		snprintf(buf, size, "output_%d", index);
}

static void make_dirs(const char *dir)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
		tern_cli_fail(TERN_EUSAGE, "-O %s: path too long", dir);
	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		struct stat st;
		if (mkdir(path, 0777) != 0 && (errno != EEXIST || stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
			tern_cli_fail(TERN_EIO, "-O %s: cannot create folder %s: %s", dir, path,
			              errno == EEXIST ? "a file is in the way" : strerror(errno));
		if (!(*p = c))
			break;
	}
}

/* The outputs to write and print: the plan's, or in examples mode a sequence each of every example's. */
struct outs {
	int n;
	const char **names;
	const tern_tensor **t;
};

static void write_outputs(const struct run *run, const struct outs *outs)
{
	make_dirs(run->out_dir);
	int n = outs->n;
	char(*names)[232] = calloc((size_t)n + 1, sizeof *names);
	if (!names)
		tern_cli_fail(TERN_EOS, "out of memory");
	const char *ext = run->out_pb ? ".pb" : ".npy";
	for (int i = 0; i < n; i++) {
		const char *name = outs->names[i];
		char base[220];
		file_name_for(name, i, base, sizeof base);
		snprintf(names[i], sizeof names[i], "%s", base);
		for (int j = 0; j < i; j++)
			if (strcmp(names[j], names[i]) == 0) /* two names that sanitise alike */
				snprintf(names[i], sizeof names[i], "%s_%d", base, i);
		char path[4096 + 240];
		snprintf(path, sizeof path, "%s/%s%s", run->out_dir, names[i], ext);
		tern_tensor t = *outs->t[i];
		t.name = (char *)name; /* a .pb file records the output's name */
		tern_status st;
		if (t.dtype == TERN_SEQUENCE || t.dtype == TERN_NONE) {
			/* a sequence is the folder NAME of 0.npy, 1.npy, ...; an empty optional writes nothing */
			snprintf(path, sizeof path, "%s/%s", run->out_dir, names[i]);
			st = tern_value_write(path, &t, ext + 1);
		} else {
			st = tern_tensor_write_file(path, &t);
		}
		if (st == TERN_EDATA && !run->out_pb)
			tern_cli_fail(st, "output '%s': %s (--output-format pb)", name, tern_error());
		tern_cli_check(st);
		tern_cli_verbose(1, "wrote %s", path);
	}
	free(names);
}

/* Component j of t as a double (complex numbers have two components per element). */
static double component(const tern_tensor *t, int64_t j)
{
	if (t->dtype == TERN_COMPLEX64)
		return ((const float *)t->data)[j];
	if (t->dtype == TERN_COMPLEX128)
		return ((const double *)t->data)[j];
	if (t->dtype >= TERN_FLOAT8E4M3FN)
		return ((const uint8_t *)t->data)[j]; /* float8: the stored byte */
	return tern_tensor_get_f64(t, j);
}

static int64_t n_components(const tern_tensor *t)
{
	int64_t n = tern_tensor_numel(t);
	return t->dtype == TERN_COMPLEX64 || t->dtype == TERN_COMPLEX128 ? 2 * n : n;
}

static bool is_integer(int dtype)
{
	return dtype != TERN_FLOAT && dtype != TERN_DOUBLE && dtype != TERN_FLOAT16 && dtype != TERN_BFLOAT16 &&
	        dtype != TERN_COMPLEX64 && dtype != TERN_COMPLEX128;
}

struct checksum {
	double sum;
	uint64_t hash; /* FNV-1a of the bytes (of each string and its NUL for string tensors) */
};

static void fnv1a(uint64_t *h, const void *bytes, size_t n)
{
	const uint8_t *b = bytes;
	for (size_t i = 0; i < n; i++)
		*h = (*h ^ b[i]) * 0x100000001b3ull;
}

static struct checksum checksum_of(const tern_tensor *t)
{
	struct checksum c = {0, 0xcbf29ce484222325ull};
	if (t->dtype == TERN_SEQUENCE) {
		/* over the items in order: their sums added, their hashes chained */
		const tern_sequence *q = tern_sequence_of(t);
		for (size_t i = 0; i < q->n; i++) {
			struct checksum ci = checksum_of(&q->items[i]);
			c.sum += ci.sum;
			fnv1a(&c.hash, &ci.hash, sizeof ci.hash);
		}
		return c;
	}
	if (t->dtype == TERN_NONE)
		return c;
	if (t->dtype == TERN_STRING) {
		char *const *s = t->data;
		for (int64_t j = 0; j < tern_tensor_numel(t); j++)
			fnv1a(&c.hash, s[j] ? s[j] : "", s[j] ? strlen(s[j]) + 1 : 1);
		c.sum = NAN;
		return c;
	}
	for (int64_t j = 0; j < n_components(t); j++)
		c.sum += component(t, j);
	fnv1a(&c.hash, t->data, t->nbytes);
	return c;
}

static void print_value(FILE *f, const tern_tensor *t, int64_t j)
{
	if (t->dtype == TERN_STRING) {
		const char *s = ((char *const *)t->data)[j];
		fprintf(f, "\"%.32s%s\"", s ? s : "", s && strlen(s) > 32 ? "..." : "");
	} else if (t->dtype == TERN_COMPLEX64 || t->dtype == TERN_COMPLEX128) {
		fprintf(f, "%.6g%+.6gj", component(t, 2 * j), component(t, 2 * j + 1));
	} else if (t->dtype == TERN_INT64) {
		fprintf(f, "%" PRId64, ((const int64_t *)t->data)[j]);
	} else if (t->dtype == TERN_UINT64) {
		fprintf(f, "%" PRIu64, ((const uint64_t *)t->data)[j]);
	} else {
		fprintf(f, is_integer(t->dtype) ? "%.0f" : "%.6g", component(t, j));
	}
}

enum { PRINT_VALUES = 8 };

static void print_outputs(FILE *f, const struct outs *outs)
{
	for (int i = 0; i < outs->n; i++) {
		const tern_tensor *t = outs->t[i];
		char shape[160];
		if (t->dtype == TERN_NONE) {
			fprintf(f, "%s none (an empty optional)\n", outs->names[i]);
			continue;
		}
		if (t->dtype == TERN_SEQUENCE) {
			/* the items' types, then the checksums over all of them */
			const tern_sequence *q = tern_sequence_of(t);
			fprintf(f, "%s seq(%zu) [", outs->names[i], q->n);
			for (size_t k = 0; k < q->n && k < PRINT_VALUES; k++) {
				tern_shape_str(q->items[k].dtype, q->items[k].rank, q->items[k].dims, shape, sizeof shape);
				fprintf(f, "%s%s", k ? ", " : "", shape);
			}
			struct checksum c = checksum_of(t);
			fprintf(f, "%s] sum=%.9g fnv64=%016" PRIx64 "\n", q->n > PRINT_VALUES ? ", ..." : "", c.sum, c.hash);
			continue;
		}
		tern_shape_str(t->dtype, t->rank, t->dims, shape, sizeof shape);
		fprintf(f, "%s %s [", outs->names[i], shape);
		int64_t n = tern_tensor_numel(t);
		for (int64_t j = 0; j < n && j < PRINT_VALUES; j++) {
			fputs(j ? ", " : "", f);
			print_value(f, t, j);
		}
		struct checksum c = checksum_of(t);
		fprintf(f, "%s] sum=%.9g fnv64=%016" PRIx64 "\n", n > PRINT_VALUES ? ", ..." : "", c.sum, c.hash);
	}
}

/* ---------------------------------------------------------------- JSON */

static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

/* JSON has no NaN or infinity. */
static void json_number(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.9g", v);
	else
		fputs("null", f);
}

struct timing {
	double *ms; /* one per timed run, sorted */
	int n;
	double plan_ms;
};

static double percentile(const struct timing *t, double p)
{
	int k = (int)ceil(p * t->n) - 1;
	return t->ms[k < 0 ? 0 : k];
}

static double median(const struct timing *t)
{
	return t->n % 2 ? t->ms[t->n / 2] : (t->ms[t->n / 2 - 1] + t->ms[t->n / 2]) / 2;
}

static double mean(const struct timing *t)
{
	double s = 0;
	for (int i = 0; i < t->n; i++)
		s += t->ms[i];
	return s / t->n;
}

static double peak_rss_mb(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

static void print_json(FILE *f, const struct run *run, const char *graph, const tern_plan *plan, const struct outs *outs,
                       const struct timing *t)
{
	fputs("{\"graph\": ", f);
	json_string(f, graph);
	fprintf(f, ", \"iters\": %d, \"warmup\": %d, \"threads\": %d, \"single_stream\": %s,\n", run->iters,
	        run->warmup, run->threads, run->single_stream ? "true" : "false");
	fputs(" \"latency_ms\": {\"median\": ", f);
	json_number(f, median(t));
	fputs(", \"p90\": ", f);
	json_number(f, percentile(t, 0.9));
	fputs(", \"min\": ", f);
	json_number(f, t->ms[0]);
	fputs(", \"max\": ", f);
	json_number(f, t->ms[t->n - 1]);
	fputs(", \"mean\": ", f);
	json_number(f, mean(t));
	fputs("},\n \"plan_ms\": ", f);
	json_number(f, t->plan_ms);
	fputs(", \"arena_mb\": ", f);
	json_number(f, (double)tern_plan_arena_bytes(plan) / (1 << 20));
	fputs(", \"peak_rss_mb\": ", f);
	json_number(f, peak_rss_mb());
	fputs(", \"isa\": ", f);
	json_string(f, tern_isa_name());
	fputs(",\n \"outputs\": [", f);
	for (int i = 0; i < outs->n; i++) {
		const tern_tensor *o = outs->t[i];
		struct checksum c = checksum_of(o);
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
		json_string(f, outs->names[i]);
		if (o->dtype == TERN_SEQUENCE) {
			fprintf(f, ", \"dtype\": \"sequence\", \"length\": %zu, \"sum\": ", tern_sequence_of(o)->n);
		} else {
			fprintf(f, ", \"dtype\": \"%s\", \"shape\": [", tern_dtype_name(o->dtype));
			for (int k = 0; k < o->rank; k++)
				fprintf(f, k ? ", %" PRId64 : "%" PRId64, o->dims[k]);
			fputs("], \"sum\": ", f);
		}
		json_number(f, c.sum);
		fprintf(f, ", \"fnv64\": \"%016" PRIx64 "\"}", c.hash);
	}
	fputs("]}\n", f);
}

/* Chrome's trace-event format (chrome://tracing, Perfetto): one complete event per node, a track
 * per stream. */
static void write_profile(const char *path, const tern_plan *plan)
{
	int n = 0;
	const tern_profile_event *ev = tern_plan_profile(plan, &n);
	double t0 = 0;
	for (int i = 0; i < n; i++)
		if (i == 0 || ev[i].start_us < t0)
			t0 = ev[i].start_us;
	tern_cli profile_cli = {.output = path};
	FILE *f = tern_cli_open_output(&profile_cli, 0);
	fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", f);
	int max_track = -1;
	for (int i = 0; i < n; i++) {
		int track = ev[i].stream >= 0 ? ev[i].stream : ev[i].thread;
		if (track > max_track)
			max_track = track;
		fputs(i ? ",\n {\"name\": " : "\n {\"name\": ", f);
		json_string(f, ev[i].name && *ev[i].name ? ev[i].name : ev[i].op_type ? ev[i].op_type : "?");
		fputs(", \"cat\": ", f);
		json_string(f, ev[i].op_type ? ev[i].op_type : "?");
		fprintf(f,
		        ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, \"tid\": %d, "
		        "\"args\": {\"thread\": %d}}",
		        ev[i].start_us - t0, ev[i].dur_us, track, ev[i].thread);
	}
	for (int s = 0; s <= max_track; s++)
		fprintf(f,
		        ",\n {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
		        "\"stream %d\"}}",
		        s, s);
	fputs("\n]}\n", f);
	tern_cli_close_output();
}

/* ---------------------------------------------------------------- main */


static int compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	struct run run = {.iters = 1, .threads = 1, .optimize = -1};
	const tern_cli_tool tool = {
	        .name = "tern-run",
	        .doc = "Run a graph on inputs from .npy or .pb files, or random ones; write, print and time its "
	               "outputs.\v"
	               "GRAPH is binary ONNX or the text syntax, read from standard input when absent or '-'. "
	               "-o FILE sends the printed outputs and --json to FILE. An input given as a folder of 0.npy, "
	               "1.npy, ... or an ONNX SequenceProto where the graph wants a tensor holds examples of their own "
	               "sizes: each runs once (with --train, one a step), each output a sequence. Exit status: 0 "
	               "success, 64 usage, "
	               "65 bad graph or input (wrong shape or type, missing input, unsupported operator), "
	               "66 a file cannot be opened, 74 write failed. The environment variable TERN_ISA (avx512, "
	               "avx2 or generic) caps the kernels' instruction set; -v and --json say which runs. TERN_WINOGRAD=0 runs "
	               "3x3 convolutions directly instead of as Winograd's F(2x2, 3x3). TERN_STREAM_RANKS=0 has "
	               "a worker whose last stream is not ready take the next ready one in order, not the one of "
	               "greatest rank.",
	        .options = options,
	        .parser = parse_option,
	        .input = &run,
	};
	tern_cli cli;
	tern_cli_parse(&cli, &tool, argc, argv);
	if (run.threads == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		run.threads = cpus > 0 ? (int)cpus : 1;
	}
	int print = run.print || (!run.out_dir && !run.json);
	run.graph_from_stdin = !cli.input;

	tern_model *model = tern_cli_load(&cli);
	if (run.train) {
		/* the training loop (train.c); -o is the trained model */
		run.t.seed = run.seed;
		run.t.threads = run.threads;
		run.t.input_args = run.input_args;
		run.t.n_input_args = run.n_input_args;
		int rc = tern_run_train(&run.t, &cli, model);
		tern_model_free(model);
		free(run.t.val_args);
		free(run.input_args);
		free(run.dim_names);
		free(run.dim_values);
		return rc;
	}
	optimize_graph(&run, model);
	const char *graph = tern_model_source(model);
	int n_inputs = tern_model_num_inputs(model);
	tern_tensor *inputs = read_inputs(&run, model, n_inputs);

	tern_plan_options plan_opts = {
	        .n_threads = run.threads,
	        .dim_names = run.dim_names,
	        .dim_values = run.dim_values,
	        .n_dims = run.n_dims,
	        .single_stream = run.single_stream,
	        /* the model is planned once and never written: packed weights need not be held twice */
	        .release_weights = 1,
	};
	/* examples of their own sizes: every tensor input a sequence of as many, each example run once */
	int64_t examples = -1;
	for (int i = 0; i < n_inputs; i++)
		if (!tern_model_input_kind(model, i) && inputs[i].dtype == TERN_SEQUENCE) {
			int64_t k = (int64_t)tern_sequence_of(&inputs[i])->n;
			if (examples >= 0 && k != examples)
				tern_cli_fail(TERN_EDATA, "the -i sequences disagree on the number of examples: %lld and %lld (input '%s')",
				              (long long)examples, (long long)k, tern_model_input_name(model, i));
			examples = k;
		}
	for (int i = 0; examples >= 0 && i < n_inputs; i++)
		if (!tern_model_input_kind(model, i) && inputs[i].dtype != TERN_SEQUENCE)
			tern_cli_fail(TERN_EUSAGE, "input '%s' is one tensor and others are sequences of examples: give every "
			              "input as a sequence (a folder of 0.npy, 1.npy, ...) or none", tern_model_input_name(model, i));
	if (examples == 0)
		tern_cli_fail(TERN_EDATA, "the -i sequences hold no examples");
	if (examples > 0 && (run.iters > 1 || run.warmup || run.profile))
		tern_cli_fail(TERN_EUSAGE, "--iters, --warmup and --profile time one input; examples of their own sizes run "
		              "once each");
	/* what a run reads: the inputs, or views of them, example i of each example input */
	tern_tensor *view = examples > 0 ? calloc((size_t)n_inputs + 1, sizeof *view) : inputs;
	bool *per_example = examples > 0 ? calloc((size_t)n_inputs + 1, sizeof *per_example) : NULL;
	if (!view || (examples > 0 && !per_example))
		tern_cli_fail(TERN_EOS, "out of memory");
	for (int i = 0; examples > 0 && i < n_inputs; i++) {
		per_example[i] = !tern_model_input_kind(model, i);
		view[i] = inputs[i];
		view[i].owns_data = 0; /* views: inputs owns them */
		view[i].name = NULL;
	}
	set_example(view, inputs, per_example, n_inputs, 0);
	if (examples > 0) {
		run.iters = (int)examples;
		plan_opts.release_weights = 0; /* each new size plans again, from the weights */
	}
	struct timing timing = {.ms = calloc((size_t)run.iters, sizeof(double)), .n = run.iters};
	if (!timing.ms)
		tern_cli_fail(TERN_EOS, "out of memory");
	tern_plan *plan = NULL;
	double t0 = now_ms();
	tern_cli_check(tern_plan_create(model, &plan_opts, view, n_inputs, &plan));
	timing.plan_ms = now_ms() - t0;
	if (tern_plan_num_threads(plan) < run.threads)
		tern_cli_verbose(1, "%d threads asked for, %d used: the process may run on %d CPUs", run.threads,
		                 tern_plan_num_threads(plan), tern_plan_num_threads(plan));
	run.threads = tern_plan_num_threads(plan);
	tern_cli_verbose(1, "planned in %.3f ms: arena %.3f MB, %d thread%s, %s kernels (the processor's best: %s)",
	                 timing.plan_ms, (double)tern_plan_arena_bytes(plan) / (1 << 20), run.threads,
	                 run.threads == 1 ? "" : "s", tern_isa_name(), tern_isa_machine_name());

	for (int i = 0; i < run.warmup; i++)
		tern_cli_check(tern_plan_run(plan, inputs, n_inputs));
	if (run.profile)
		tern_plan_enable_profile(plan, 1);
	/* the outputs as printed and written: the plan's, or each a sequence of every example's */
	int n_out = tern_plan_num_outputs(plan);
	struct outs outs = {n_out, calloc((size_t)n_out + 1, sizeof(char *)), calloc((size_t)n_out + 1, sizeof(tern_tensor *))};
	tern_tensor *collected = examples > 0 ? calloc((size_t)n_out + 1, sizeof *collected) : NULL;
	if (!outs.names || !outs.t || (examples > 0 && !collected))
		tern_cli_fail(TERN_EOS, "out of memory");
	for (int o = 0; o < n_out && collected; o++)
		tern_cli_check(tern_sequence_new(&collected[o], 0));
	for (int i = 0; i < run.iters; i++) {
		set_example(view, inputs, per_example, n_inputs, i);
		t0 = now_ms();
		tern_status st = tern_plan_run(plan, view, n_inputs);
		timing.ms[i] = now_ms() - t0;
		if (st && examples > 0)
			tern_cli_fail(st, "example %d: %s", i, tern_error());
		tern_cli_check(st);
		for (int o = 0; o < n_out && collected; o++)
			tern_cli_check(tern_sequence_insert(&collected[o], tern_plan_output(plan, o), -1));
	}
	for (int o = 0; o < n_out; o++) {
		outs.names[o] = tern_plan_output_name(plan, o);
		outs.t[o] = collected ? &collected[o] : tern_plan_output(plan, o);
	}
	if (examples > 0)
		tern_cli_verbose(1, "%lld examples, one run each", (long long)examples);
	qsort(timing.ms, (size_t)timing.n, sizeof *timing.ms, compare_double);
	if (run.iters > 1 && !run.json)
		tern_cli_verbose(0, "%d %s: median %.3f ms, p90 %.3f ms, min %.3f ms, mean %.3f ms", run.iters,
		                 examples > 0 ? "examples" : "runs", median(&timing), percentile(&timing, 0.9), timing.ms[0],
		                 mean(&timing));

	if (run.profile)
		write_profile(run.profile, plan);
	if (run.out_dir)
		write_outputs(&run, &outs);
	if (print || run.json) {
		FILE *out = tern_cli_open_output(&cli, 0);
		if (print)
			print_outputs(run.json ? stderr : out, &outs);
		if (run.json)
			print_json(out, &run, graph, plan, &outs, &timing);
		tern_cli_close_output();
	}

	for (int o = 0; o < n_out && collected; o++)
		tern_tensor_free(&collected[o]);
	free(collected);
	free(outs.names);
	free(outs.t);
	if (view != inputs)
		free(view);
	free(per_example);
	tern_plan_free(plan);
	for (int i = 0; i < n_inputs; i++)
		tern_tensor_free(&inputs[i]);
	free(inputs);
	free(timing.ms);
	free(run.input_args);
	free(run.dim_names);
	free(run.dim_values);
	tern_model_free(model);
	return 0;
}
