/* tern-show — prints a graph file as ONNX text syntax, binary ONNX, Graphviz DOT or statistics, after
 * checking that it is a valid graph. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

struct show;

/* An output format: one entry per -f value. */
struct format {
	const char *name;
	int binary;
	tern_status (*write)(tern_model *model, const struct show *show, char **out, size_t *size);
};

struct show {
	const struct format *format;
	int weights;
	int infer; /* --infer-shapes */
	int training; /* --training */
	tern_cli_dims dims;
};

static tern_status write_text(tern_model *model, const struct show *show, char **out, size_t *size)
{
	return tern_model_save_text(model, show->weights, out, size);
}

static tern_status write_onnx(tern_model *model, const struct show *show, char **out, size_t *size)
{
	void *bytes = NULL;
	tern_status status = tern_model_save_bytes(model, &bytes, size);
	*out = bytes;
	return status;
}

static tern_status write_dot(tern_model *model, const struct show *show, char **out, size_t *size)
{
	void *streams;
	tern_status status = tern_model_stream_groups(model, &streams);
	if (status)
		return status;
	const tern_dot_options opts = {
	        .show_weights = show->weights, .node_group = streams ? tern_stream_group : NULL, .user = streams};
	status = tern_model_save_dot(model, &opts, out, size);
	free(streams);
	return status;
}

static tern_status write_plan(tern_model *model, const struct show *show, char **out, size_t *size)
{
	return tern_model_plan_text(model, out, size);
}

static tern_status write_stats(tern_model *model, const struct show *show, char **out, size_t *size)
{
	return tern_model_stats(model, out, size);
}

static const struct format formats[] = {
        {"text", 0, write_text},   {"onnx", 1, write_onnx}, {"dot", 0, write_dot},
        {"stats", 0, write_stats}, {"plan", 0, write_plan},
};

enum { OPT_TEXT = 256, OPT_ONNX, OPT_DOT, OPT_STATS, OPT_INFER, OPT_DIM, OPT_TRAINING };

static const struct argp_option options[] = {
        {"format", 'f', "FORMAT", 0, "text (the default), onnx, dot, stats or plan", 0},
        {"text", OPT_TEXT, NULL, 0, "same as -f text", 0},
        {"onnx", OPT_ONNX, NULL, 0, "same as -f onnx", 0},
        {"dot", OPT_DOT, NULL, 0, "same as -f dot", 0},
        {"stats", OPT_STATS, NULL, 0, "same as -f stats", 0},
        {"weights", 'w', NULL, 0, "text: write every initializer in full; dot: draw initializers", 0},
        {"infer-shapes", OPT_INFER, NULL, 0,
         "text, onnx: write the type and shape tern infers for every value as value_info (dot always labels "
         "edges with them)",
         0},
        {"dim", OPT_DIM, "NAME=N", 0, "make symbolic dimension NAME static, of size N, first (repeatable)", 0},
        {"training", OPT_TRAINING, NULL, 0,
         "show the training step (the inference graph and the training algorithm combined) instead", 0},
        {0},
};

static const struct format *find_format(const char *name)
{
	for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
		if (!strcmp(formats[i].name, name))
			return &formats[i];
	return NULL;
}

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	struct show *show = state->input;
	switch (key) {
	case 'f':
		if (!(show->format = find_format(arg)))
			argp_error(state, "unknown format '%s' (text, onnx, dot, stats or plan)", arg);
		return 0;
	case OPT_TEXT:
	case OPT_ONNX:
	case OPT_DOT:
	case OPT_STATS: show->format = &formats[key - OPT_TEXT]; return 0;
	case 'w': show->weights = 1; return 0;
	case OPT_INFER: show->infer = 1; return 0;
	case OPT_DIM: tern_cli_parse_dim(&show->dims, arg, state); return 0;
	case OPT_TRAINING: show->training = 1; return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

int main(int argc, char **argv)
{
	struct show show = {.format = &formats[0]};
	const tern_cli_tool tool = {
	        .name = "tern-show",
	        .doc = "Print a graph as ONNX text syntax, binary ONNX, Graphviz DOT, statistics, or its schedule.\v"
	               "plan: one line per node in launch order, NODE<TAB>STREAM<TAB>WAITS (see tern-schedule(1)). "
	               "GRAPH is binary ONNX or the text syntax, read from standard input when absent or '-'. "
	               "It must be a valid graph. Exit status: 0 success, 64 usage, 65 bad graph, "
	               "66 GRAPH cannot be opened, 74 write failed.",
	        .options = options,
	        .parser = parse_option,
	        .input = &show,
	        .writes_model = 1,
	};
	tern_cli cli;
	tern_cli_parse(&cli, &tool, argc, argv);

	FILE *out = tern_cli_open_output(&cli, show.format->binary);
	tern_model *model = tern_cli_load(&cli);
	if (show.training) {
		tern_model *step = NULL;
		tern_status st = tern_model_training_step(model, &step);
		tern_model_free(model);
		tern_cli_check(st);
		model = step;
	}
	if (show.dims.n)
		tern_cli_check(tern_model_bind_dims(model, show.dims.names, show.dims.values, show.dims.n));
	if (show.infer || show.format->write == write_dot) {
		int typed, total;
		int write = show.infer && (show.format->write == write_onnx || show.format->write == write_text);
		tern_cli_check(tern_model_infer_shapes(model, write, &typed, &total));
		tern_cli_verbose(1, "inferred the types of %d of %d node outputs", typed, total);
	}
	free(show.dims.names);
	free(show.dims.values);
	if (show.format->write == write_onnx) {
		/* the shared writer: external data beside -o FILE, everything inline on standard output */
		tern_cli_write_model(out, model);
		tern_model_free(model);
		return 0;
	}
	char *text = NULL;
	size_t size = 0;
	tern_status status = show.format->write(model, &show, &text, &size);
	tern_model_free(model);
	tern_cli_check(status);
	/* A short write leaves the stream's error flag set; closing the output reports it. */
	fwrite(text, 1, size, out);
	free(text);
	tern_cli_close_output();
	return 0;
}
