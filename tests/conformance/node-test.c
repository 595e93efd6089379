/* node-test.c — runs ONNX backend node tests (model.onnx + test_data_set_*) through libtern's public
 * API and compares every output with the expected one, as onnx's backend test runner does. */
#include "internal.h"
#include "tern_eager.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fnmatch.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char usage[] = "usage: node-test [--report FILE] [--rtol R] [--atol A] [--threads N] [--timeout S]\n"
                            "                 [--min-pass-rate P] [--exclude PATTERN]... [--no-fork] [--eager] DIR...\n"
                            "       node-test --list-ops\n"
                            "DIR is a node test folder (model.onnx, test_data_set_*) or a folder of them.\n"
                            "--exclude skips the tests whose folder name matches PATTERN (fnmatch).\n"
                            "--eager runs each one-node test through the eager API (tern_call) instead of a\n"
                            "plan; tests of several nodes, subgraphs, sequences or optionals are skipped.\n";

enum result { PASS, FAIL, UNSUPPORTED, SKIP };
static const char *const result_names[] = {"PASS", "FAIL", "UNSUPPORTED", "SKIP"};

struct options {
	const char *report;
	double rtol, atol;
	int threads;
	int timeout_s;
	double min_pass_rate; /* percent of the tests that are not skipped */
	int no_fork;
	const char *exclude[16]; /* folder-name patterns of tests to skip */
	int n_exclude;
	int eager; /* run the node through the eager API (tern_call) instead of a plan */
};

/* What the test is about, read from model.onnx directly so that it is known even when tern cannot
 * load the model. */
struct test_info {
	char op[160];
	int skip;
	char why[256];
	/* Graph inputs and outputs declared bfloat16: onnx stores their test data as uint16 bit
	 * patterns, because NumPy has no bfloat16. Bit i stands for input or output i. */
	uint64_t bf16_inputs, bf16_outputs;
	/* Inputs and outputs that are sequences or optionals (TERN_SEQUENCE, TERN_NONE; 0: a tensor):
	 * their .pb files are SequenceProto or OptionalProto messages. */
	int input_kind[64], output_kind[64];
};

struct outcome {
	enum result result;
	char message[1024];
};

static void die_usage(const char *msg)
{
	if (msg)
		fprintf(stderr, "node-test: %s\n", msg);
	fputs(usage, stderr);
	exit(64);
}

static bool is_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	if (!p) {
		perror("node-test");
		exit(71);
	}
	snprintf(p, n, "%s/%s", dir, name);
	return p;
}

static void *read_all(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	size_t got;
	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			char *bigger = realloc(buf, cap *= 2);
			if (!bigger)
				free(buf);
			buf = bigger;
		}
	}
	fclose(f);
	*size = n;
	return buf;
}

/* Tensors tern can compare: numeric, bool, string and float8. Sequences, optionals, maps and sparse
 * tensors are left out: their .pb files are not TensorProtos. */
static uint64_t bf16_mask(Onnx__ValueInfoProto *const *values, size_t n)
{
	uint64_t mask = 0;
	for (size_t i = 0; i < n && i < 64; i++) {
		const Onnx__TypeProto *t = values[i]->type;
		if (t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
		    t->tensor_type->elem_type == TERN_BFLOAT16)
			mask |= UINT64_C(1) << i;
	}
	return mask;
}

static int value_kind(const Onnx__ValueInfoProto *v)
{
	const Onnx__TypeProto *t = v->type;
	if (t && t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE)
		return TERN_SEQUENCE;
	if (t && t->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE)
		return TERN_NONE;
	return 0;
}

/* The element type inside sequences and optionals, down to a tensor; NULL for maps and sparse. */
static const Onnx__TypeProto *innermost(const Onnx__TypeProto *t)
{
	while (t && (t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE ||
	             t->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE))
		t = t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE ? t->sequence_type->elem_type
		                                                            : t->optional_type->elem_type;
	return t;
}

static bool describe_unsupported_type(const Onnx__ValueInfoProto *v, char *why, size_t size)
{
	const Onnx__TypeProto *t = innermost(v->type);
	if (!t || t->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) {
		static const char *const kinds[] = {[ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE] = "sequence",
		                                    [ONNX__TYPE_PROTO__VALUE_MAP_TYPE] = "map",
		                                    [ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE] = "sparse tensor",
		                                    [ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE] = "optional"};
		int k = t ? (int)t->value_case : 0;
		const char *kind = k > 0 && k < (int)TERN_ARRAY_LEN(kinds) && kinds[k] ? kinds[k] : "untyped";
		snprintf(why, size, "'%s' is a %s", v->name, kind);
		return true;
	}
	int dt = t->tensor_type->elem_type;
	if (dt == TERN_UNDEFINED || dt >= TERN_DTYPE_COUNT) {
		snprintf(why, size, "'%s' is a %s tensor", v->name, tern_dtype_name(dt));
		return true;
	}
	return false;
}

static Onnx__ModelProto *load_proto(const char *dir)
{
	char *path = path_join(dir, "model.onnx");
	size_t size = 0;
	void *bytes = read_all(path, &size);
	free(path);
	Onnx__ModelProto *m = bytes ? onnx__model_proto__unpack(NULL, size, bytes) : NULL;
	free(bytes);
	if (m && !m->graph) {
		onnx__model_proto__free_unpacked(m, NULL);
		m = NULL;
	}
	return m;
}

/* The operator a model tests: its first node that is not a Constant, as "Op" or "domain.Op". */
static void first_op(const Onnx__GraphProto *g, char *buf, size_t size)
{
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		if (strcmp(n->op_type, "Constant") == 0 && i + 1 < g->n_node)
			continue;
		bool plain = !n->domain || !n->domain[0] || strcmp(n->domain, "ai.onnx") == 0;
		snprintf(buf, size, "%s%s%s", plain ? "" : n->domain, plain ? "" : ".", n->op_type);
		return;
	}
}

/* An "_expanded" test runs a function operator's body, spelled out in primitive operators; it
 * belongs to the operator of its unexpanded sibling (test_x_expanded, test_x_expanded_ver18 ->
 * test_x) when that folder is there. */
static void expanded_op(const char *dir, char *buf, size_t size)
{
	const char *slash = strrchr(dir, '/');
	const char *mark = strstr(slash ? slash : dir, "_expanded");
	if (!mark)
		return;
	char *sibling = strndup(dir, (size_t)(mark - dir));
	Onnx__ModelProto *m = sibling ? load_proto(sibling) : NULL;
	free(sibling);
	if (m) {
		first_op(m->graph, buf, size);
		onnx__model_proto__free_unpacked(m, NULL);
	}
}

static void inspect_model(const char *dir, struct test_info *info)
{
	snprintf(info->op, sizeof info->op, "?");
	info->skip = 0;
	info->bf16_inputs = info->bf16_outputs = 0;
	Onnx__ModelProto *m = load_proto(dir);
	if (!m)
		return;
	const Onnx__GraphProto *g = m->graph;
	first_op(g, info->op, sizeof info->op);
	expanded_op(dir, info->op, sizeof info->op);
	info->bf16_inputs = bf16_mask(g->input, g->n_input);
	info->bf16_outputs = bf16_mask(g->output, g->n_output);
	for (size_t i = 0; i < 64; i++) {
		info->input_kind[i] = i < g->n_input ? value_kind(g->input[i]) : 0;
		info->output_kind[i] = i < g->n_output ? value_kind(g->output[i]) : 0;
	}
	for (size_t i = 0; i < g->n_input && !info->skip; i++)
		info->skip = describe_unsupported_type(g->input[i], info->why, sizeof info->why);
	for (size_t i = 0; i < g->n_output && !info->skip; i++)
		info->skip = describe_unsupported_type(g->output[i], info->why, sizeof info->why);
	onnx__model_proto__free_unpacked(m, NULL);
}

/* The error tern reported: an operator, dtype or attribute tern does not handle, or a failure. */
static enum result from_error(struct outcome *o, const char *stage)
{
	const char *msg = tern_error();
	snprintf(o->message, sizeof o->message, "%s: %s", stage, msg[0] ? msg : "(no message)");
	o->result = strcasestr(msg, "unsupported") ? UNSUPPORTED : FAIL;
	return o->result;
}

static enum result failf(struct outcome *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static enum result failf(struct outcome *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->message, sizeof o->message, fmt, ap);
	va_end(ap);
	return o->result = FAIL;
}

static bool is_float_dtype(int dt)
{
	return dt == TERN_FLOAT || dt == TERN_DOUBLE || dt == TERN_FLOAT16 || dt == TERN_BFLOAT16;
}

static double float_at(const tern_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case TERN_FLOAT: return ((const float *)t->data)[i];
	case TERN_DOUBLE: return ((const double *)t->data)[i];
	case TERN_FLOAT16: return tern_f16_to_f32(((const uint16_t *)t->data)[i]);
	default: return tern_bf16_to_f32(((const uint16_t *)t->data)[i]);
	}
}

/* numpy.testing.assert_allclose: |got - want| <= atol + rtol * |want|, NaN equals NaN, infinities
 * must match exactly. */
static bool close_enough(double got, double want, double rtol, double atol)
{
	if (isnan(got) || isnan(want))
		return isnan(got) && isnan(want);
	if (isinf(got) || isinf(want))
		return got == want;
	return fabs(got - want) <= atol + rtol * fabs(want);
}

static enum result compare(const tern_tensor *got, const tern_tensor *want, int index, const char *name,
                           const struct options *opt, struct outcome *o)
{
	char gs[128], ws[128];
	if (want->dtype == TERN_SEQUENCE && got->dtype == TERN_SEQUENCE) {
		const tern_sequence *g = tern_sequence_of(got), *w = tern_sequence_of(want);
		if (g->n != w->n)
			return failf(o, "output %d '%s' is a sequence of %zu, want %zu", index, name, g->n, w->n);
		for (size_t i = 0; i < w->n; i++)
			if (compare(&g->items[i], &w->items[i], index, name, opt, o) != PASS)
				return o->result;
		return o->result = PASS;
	}
	if (want->dtype == TERN_NONE || got->dtype == TERN_NONE) {
		if (want->dtype != got->dtype)
			return failf(o, "output %d '%s' is %s, want %s", index, name,
			             got->dtype == TERN_NONE ? "an empty optional" : "a value",
			             want->dtype == TERN_NONE ? "an empty optional" : "a value");
		return o->result = PASS;
	}
	if (got->dtype != want->dtype || got->rank != want->rank ||
	    memcmp(got->dims, want->dims, (size_t)want->rank * sizeof want->dims[0]) != 0)
		return failf(o, "output %d '%s' is %s, want %s", index, name,
		             tern_shape_str(got->dtype, got->rank, got->dims, gs, sizeof gs),
		             tern_shape_str(want->dtype, want->rank, want->dims, ws, sizeof ws));
	int64_t n = tern_tensor_numel(want);
	if (n == 0)
		return o->result = PASS;
	if (!got->data)
		return failf(o, "output %d '%s' has no data", index, name);
	if (is_float_dtype(want->dtype)) {
		for (int64_t i = 0; i < n; i++) {
			double g = float_at(got, i), w = float_at(want, i);
			if (!close_enough(g, w, opt->rtol, opt->atol))
				return failf(o, "output %d '%s' element %lld is %.9g, want %.9g (rtol %g, atol %g)",
				             index, name, (long long)i, g, w, opt->rtol, opt->atol);
		}
		return o->result = PASS;
	}
	if (want->dtype == TERN_STRING) {
		for (int64_t i = 0; i < n; i++) {
			const char *g = ((char *const *)got->data)[i], *w = ((char *const *)want->data)[i];
			if (strcmp(g ? g : "", w ? w : "") != 0)
				return failf(o, "output %d '%s' element %lld is \"%.40s\", want \"%.40s\"", index, name,
				             (long long)i, g ? g : "", w ? w : "");
		}
		return o->result = PASS;
	}
	/* float8 and integers: the same bits */
	size_t es = tern_dtype_size(want->dtype);
	for (int64_t i = 0; i < n; i++) {
		const unsigned char *g = (const unsigned char *)got->data + (size_t)i * es;
		const unsigned char *w = (const unsigned char *)want->data + (size_t)i * es;
		bool same = want->dtype == TERN_BOOL ? (*g != 0) == (*w != 0) : memcmp(g, w, es) == 0;
		if (!same)
			return failf(o, "output %d '%s' element %lld is %lld, want %lld", index, name, (long long)i,
			             (long long)tern_tensor_get_i64(got, i), (long long)tern_tensor_get_i64(want, i));
	}
	return o->result = PASS;
}

/* Reads prefix_0.pb, prefix_1.pb, ... until one is missing; returns the count or -1 (o set). */
static int read_tensors(const char *set_dir, const char *prefix, uint64_t bf16, const int *kinds, tern_tensor **out,
                        struct outcome *o)
{
	int n = 0, cap = 0;
	*out = NULL;
	for (;;) {
		char name[64];
		snprintf(name, sizeof name, "%s_%d.pb", prefix, n);
		char *path = path_join(set_dir, name);
		if (!is_file(path)) {
			free(path);
			return n;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 4;
			tern_tensor *bigger = realloc(*out, (size_t)cap * sizeof **out);
			if (!bigger) {
				free(path);
				failf(o, "out of memory");
				return -1;
			}
			*out = bigger;
		}
		memset(&(*out)[n], 0, sizeof **out);
		tern_status st = tern_value_read_file(path, n < 64 ? kinds[n] : 0, &(*out)[n]);
		free(path);
		if (st != TERN_OK) {
			from_error(o, "reading test data");
			return -1;
		}
		if (n < 64 && (bf16 >> n & 1) && (*out)[n].dtype == TERN_UINT16)
			(*out)[n].dtype = TERN_BFLOAT16;
		n++;
	}
}

static void free_tensors(tern_tensor *t, int n)
{
	for (int i = 0; i < n; i++)
		tern_tensor_free(&t[i]);
	free(t);
}

/* The node of a one-node graph, the eager way: inputs become eager tensors, the node runs through
 * tern_call_node, and each graph output is the node output of its name. */
static enum result run_eager(tern_model *model, tern_tensor *inputs, int n_in, tern_tensor *expected, int n_out,
                             const struct test_info *info, const struct options *opt, struct outcome *o)
{
	tern_graph *g = model->graph;
	for (int i = 0; i < n_out && i < 64; i++)
		if (info->output_kind[i]) {
			o->result = SKIP;
			snprintf(o->message, sizeof o->message, "eager: output %d is a sequence or an optional", i);
			return SKIP;
		}
	const tern_node *node = NULL;
	int live = 0;
	for (size_t i = 0; i < g->n_nodes; i++)
		if (!g->nodes[i]->removed)
			node = g->nodes[i], live++;
	if (live != 1 || node->n_subgraphs) {
		o->result = SKIP;
		snprintf(o->message, sizeof o->message, "eager: %d nodes%s", live, node && node->n_subgraphs ? ", subgraphs" : "");
		return SKIP;
	}
	tern_ctx *c = NULL;
	if (tern_ctx_create(opt->threads, &c) != TERN_OK)
		return from_error(o, "eager");
	tern_var *in[64] = {NULL}, *out[64] = {NULL};
	enum result r = PASS;
	o->result = PASS;
	/* graph inputs, in order, are the caller's (non-initializer) inputs; initializers are constants */
	for (size_t i = 0; i < node->n_inputs && r == PASS; i++) {
		tern_value *v = node->inputs[i];
		if (!v)
			continue;
		const tern_tensor *t = NULL;
		tern_tensor init = {0};
		int k = 0;
		for (size_t j = 0; j < g->n_inputs && !t; j++) {
			if (g->inputs[j]->flags & TERN_VALUE_INITIALIZER)
				continue;
			if (g->inputs[j] == v)
				t = k < n_in ? &inputs[k] : NULL;
			k++;
		}
		if (!t && (v->flags & TERN_VALUE_INITIALIZER)) {
			if (tern_tensor_from_proto(v->initializer, model->base_dir, v->name, &init) != TERN_OK) {
				r = from_error(o, "eager");
				break;
			}
			t = &init;
		}
		if (!t || t->dtype == TERN_SEQUENCE || t->dtype == TERN_NONE || t->dtype == TERN_STRING) {
			tern_tensor_free(&init);
			o->result = r = SKIP;
			snprintf(o->message, sizeof o->message, "eager: input %zu is %s", i,
			         !t ? "not a graph input" : "a sequence, an optional or strings");
			break;
		}
		if (tern_var_from(c, t->dtype, t->rank, t->dims, t->data, &in[i]) != TERN_OK)
			r = from_error(o, "eager");
		tern_tensor_free(&init);
	}
	if (r == PASS && tern_call_node(c, node, in, out) != TERN_OK)
		r = from_error(o, "eager");
	for (int i = 0; r == PASS && i < n_out; i++) {
		const tern_var *got = NULL;
		for (size_t k = 0; k < node->n_outputs && !got; k++)
			if (node->outputs[k] && node->outputs[k] == g->outputs[i])
				got = out[k];
		if (!got)
			r = failf(o, "eager: output %d is missing", i);
		else
			r = compare(tern_var_tensor(got), &expected[i], i, g->outputs[i]->name, opt, o);
	}
	for (int i = 0; i < 64; i++) {
		tern_var_unref(in[i]);
		tern_var_unref(out[i]);
	}
	tern_ctx_free(c);
	return r;
}

static enum result run_data_set(tern_model *model, const char *set_dir, const struct test_info *info,
                                const struct options *opt, struct outcome *o)
{
	tern_tensor *inputs = NULL, *expected = NULL;
	tern_plan *plan = NULL;
	int n_in = read_tensors(set_dir, "input", info->bf16_inputs, info->input_kind, &inputs, o);
	int n_out = n_in < 0 ? -1 : read_tensors(set_dir, "output", info->bf16_outputs, info->output_kind, &expected, o);
	if (n_in < 0 || n_out < 0)
		goto out;
	if (n_in != tern_model_num_inputs(model)) {
		failf(o, "%d input files for %d graph inputs", n_in, tern_model_num_inputs(model));
		goto out;
	}
	if (opt->eager) {
		run_eager(model, inputs, n_in, expected, n_out, info, opt, o);
		goto out;
	}
	tern_plan_options popt = {.n_threads = opt->threads};
	if (tern_plan_create(model, &popt, inputs, n_in, &plan) != TERN_OK) {
		from_error(o, "plan");
		goto out;
	}
	if (tern_plan_run(plan, inputs, n_in) != TERN_OK) {
		from_error(o, "run");
		goto out;
	}
	if (tern_plan_num_outputs(plan) != n_out) {
		failf(o, "%d outputs, want %d", tern_plan_num_outputs(plan), n_out);
		goto out;
	}
	o->result = PASS;
	for (int i = 0; i < n_out && o->result == PASS; i++) {
		const tern_tensor *got = tern_plan_output(plan, i);
		if (!got)
			failf(o, "output %d is missing", i);
		else
			compare(got, &expected[i], i, tern_plan_output_name(plan, i), opt, o);
	}
out:
	tern_plan_free(plan);
	free_tensors(inputs, n_in);
	free_tensors(expected, n_out);
	return o->result;
}

static enum result run_test(const char *dir, const struct test_info *info, const struct options *opt, struct outcome *o)
{
	o->result = FAIL;
	o->message[0] = '\0';
	tern_error_clear();
	char *path = path_join(dir, "model.onnx");
	tern_model *model = NULL;
	tern_status st = tern_model_load(path, &model);
	free(path);
	if (st != TERN_OK)
		return from_error(o, "load");
	char *pattern = path_join(dir, "test_data_set_*");
	glob_t sets;
	int g = glob(pattern, 0, NULL, &sets);
	free(pattern);
	if (g != 0 || sets.gl_pathc == 0)
		failf(o, "no test_data_set_* folder");
	for (size_t i = 0; g == 0 && i < sets.gl_pathc; i++)
		if (run_data_set(model, sets.gl_pathv[i], info, opt, o) != PASS)
			break;
	if (g == 0)
		globfree(&sets);
	tern_model_free(model);
	return o->result;
}

/* Runs a test in a child process, so that a crash, a hang or a sanitizer report in one operator is
 * that test's failure and the rest still run. */
static enum result run_isolated(const char *dir, const struct test_info *info, const struct options *opt,
                                struct outcome *o)
{
	if (opt->no_fork)
		return run_test(dir, info, opt, o);
	int fds[2];
	fflush(NULL);
	if (pipe(fds) != 0)
		return failf(o, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return failf(o, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		close(fds[0]);
		alarm((unsigned)opt->timeout_s);
		run_test(dir, info, opt, o);
		ssize_t w = write(fds[1], o, sizeof *o);
		close(fds[1]);
		exit(w == (ssize_t)sizeof *o ? 0 : 70);
	}
	close(fds[1]);
	size_t got = 0;
	ssize_t r;
	while (got < sizeof *o && (r = read(fds[0], (char *)o + got, sizeof *o - got)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		got += (size_t)r;
	}
	close(fds[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(status)) {
		if (WTERMSIG(status) == SIGALRM)
			return failf(o, "timed out after %d s", opt->timeout_s);
		return failf(o, "crashed: %s", strsignal(WTERMSIG(status)));
	}
	if (got != sizeof *o)
		return failf(o, "died with exit status %d", WEXITSTATUS(status));
	if (WEXITSTATUS(status) != 0)
		return failf(o, "exit status %d after the run (sanitizer report on stderr)", WEXITSTATUS(status));
	return o->result;
}

/* A node test folder, or a folder whose sub-folders are node tests (sorted). */
static void collect(const char *dir, char ***tests, size_t *n, size_t *cap)
{
	char *model = path_join(dir, "model.onnx");
	bool single = is_file(model);
	free(model);
	if (single) {
		if (!tern_grow((void **)tests, cap, *n + 1, sizeof **tests)) {
			perror("node-test");
			exit(71);
		}
		(*tests)[(*n)++] = tern_strdup(dir);
		return;
	}
	struct dirent **entries;
	int k = scandir(dir, &entries, NULL, alphasort);
	if (k < 0) {
		fprintf(stderr, "node-test: %s: %s\n", dir, strerror(errno));
		exit(66);
	}
	size_t before = *n;
	for (int i = 0; i < k; i++) {
		char *sub = entries[i]->d_name[0] != '.' ? path_join(dir, entries[i]->d_name) : NULL;
		char *sub_model = sub ? path_join(sub, "model.onnx") : NULL;
		if (sub_model && is_file(sub_model))
			collect(sub, tests, n, cap);
		free(sub_model);
		free(sub);
		free(entries[i]);
	}
	free(entries);
	if (*n == before) {
		fprintf(stderr, "node-test: %s: no model.onnx in it or in its sub-folders\n", dir);
		exit(66);
	}
}

static void list_ops(void)
{
	for (size_t i = 0; i < tern_op_count(); i++) {
		const tern_op *op = tern_op_at(i);
		printf("%s\t%s\t%d\t%d\t", op->domain && op->domain[0] ? op->domain : "ai.onnx", op->op_type,
		       op->since_version, op->until_version);
		if (!op->dtypes)
			fputs("*", stdout);
		for (int dt = 0, first = 1; dt < 32; dt++)
			if (op->dtypes & (1u << dt)) {
				printf("%s%s", first ? "" : ",", tern_dtype_name(dt));
				first = 0;
			}
		printf("\t%s\t%s\n", op->family ? op->family : "", op->grad ? "grad" : "-");
	}
}

/* Tabs and newlines would break the report's columns. */
static void tsv_field(FILE *f, const char *s)
{
	for (; *s; s++)
		fputc(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s, f);
}

static const char *base_name(const char *path)
{
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	const char *end = path + n;
	const char *s = end;
	while (s > path && s[-1] != '/')
		s--;
	static char buf[512];
	snprintf(buf, sizeof buf, "%.*s", (int)(end - s), s);
	return buf;
}

static double number_arg(const char *opt, const char *s)
{
	char *end;
	errno = 0;
	double v = s ? strtod(s, &end) : 0;
	if (!s || errno || end == s || *end || v < 0) {
		fprintf(stderr, "node-test: %s needs a non-negative number\n", opt);
		die_usage(NULL);
	}
	return v;
}

int main(int argc, char **argv)
{
	struct options opt = {.rtol = 1e-3, .atol = 1e-7, .threads = 1, .timeout_s = 120, .min_pass_rate = 100};
	int first_dir = argc;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--list-ops") == 0) {
			list_ops();
			return 0;
		} else if (strcmp(a, "--report") == 0 && v) {
			opt.report = v;
			i++;
		} else if (strcmp(a, "--rtol") == 0) {
			opt.rtol = number_arg(a, v);
			i++;
		} else if (strcmp(a, "--atol") == 0) {
			opt.atol = number_arg(a, v);
			i++;
		} else if (strcmp(a, "--threads") == 0) {
			opt.threads = (int)number_arg(a, v);
			i++;
		} else if (strcmp(a, "--timeout") == 0) {
			opt.timeout_s = (int)number_arg(a, v);
			i++;
		} else if (strcmp(a, "--min-pass-rate") == 0) {
			opt.min_pass_rate = number_arg(a, v);
			i++;
		} else if (strcmp(a, "--eager") == 0) {
			opt.eager = 1;
		} else if (strcmp(a, "--exclude") == 0 && v && opt.n_exclude < 16) {
			opt.exclude[opt.n_exclude++] = v;
			i++;
		} else if (strcmp(a, "--no-fork") == 0) {
			opt.no_fork = 1;
		} else if (strcmp(a, "--") == 0) {
			first_dir = i + 1;
			break;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "node-test: unknown or incomplete option %s\n", a);
			die_usage(NULL);
		} else {
			first_dir = i;
			break;
		}
	}
	if (first_dir >= argc)
		die_usage("no test folder given");
	if (opt.threads < 1 || opt.timeout_s < 1)
		die_usage("--threads and --timeout must be at least 1");

	char **tests = NULL;
	size_t n_tests = 0, cap = 0;
	for (int i = first_dir; i < argc; i++)
		collect(argv[i], &tests, &n_tests, &cap);

	FILE *report = NULL;
	if (opt.report) {
		report = fopen(opt.report, "w");
		if (!report) {
			fprintf(stderr, "node-test: %s: %s\n", opt.report, strerror(errno));
			return 73;
		}
		fputs("test\top\tresult\tmessage\n", report);
	}
	int counts[4] = {0};
	for (size_t i = 0; i < n_tests; i++) {
		struct test_info info;
		struct outcome o = {.result = SKIP};
		inspect_model(tests[i], &info);
		for (int k = 0; k < opt.n_exclude && !info.skip; k++)
			if (fnmatch(opt.exclude[k], base_name(tests[i]), 0) == 0) {
				info.skip = 1;
				snprintf(info.why, sizeof info.why, "excluded (--exclude %s)", opt.exclude[k]);
			}
		if (info.skip)
			snprintf(o.message, sizeof o.message, "%s", info.why);
		else
			run_isolated(tests[i], &info, &opt, &o);
		counts[o.result]++;
		const char *name = base_name(tests[i]);
		printf("%-11s %s (%s)%s%s\n", result_names[o.result], name, info.op, o.message[0] ? ": " : "",
		       o.message);
		fflush(stdout);
		if (report) {
			fprintf(report, "%s\t%s\t%s\t", name, info.op, result_names[o.result]);
			tsv_field(report, o.message);
			fputc('\n', report);
		}
		free(tests[i]);
	}
	free(tests);
	if (report && fclose(report) != 0) {
		fprintf(stderr, "node-test: %s: %s\n", opt.report, strerror(errno));
		return 74;
	}
	int counted = counts[PASS] + counts[FAIL] + counts[UNSUPPORTED];
	double rate = counted ? 100.0 * counts[PASS] / counted : 100.0;
	printf("%d passed, %d failed, %d unsupported, %d skipped; %.1f%% of %d tests pass "
	       "(required %.1f%%)\n",
	       counts[PASS], counts[FAIL], counts[UNSUPPORTED], counts[SKIP], rate, counted, opt.min_pass_rate);
	return rate + 1e-9 >= opt.min_pass_rate ? 0 : 1;
}
