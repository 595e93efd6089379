/* tern-optimize — rewrites a graph to compute the same outputs with less work: constant folding, dead
 * and common code, no-ops, Conv+BatchNormalization folding, and (from -O2) tern's fused operators. */
#include "../lib/internal.h"
#include "cli.h"

#include <errno.h>
#include <stdlib.h>

enum { OPT_PASSES = 256, OPT_LIST, OPT_STATS, OPT_DIM, OPT_DROP_TRAINING };

typedef struct options {
	int level;
	const char **passes;
	int n_passes;
	char *pass_list; /* the --passes argument, split in place */
	int list;
	int stats;
	tern_cli_dims dims;
	int drop_training;
} options;

static const struct argp_option option_table[] = {
        {"level", 'O', "LEVEL", 0,
         "0 nothing; 1 rewrites that keep a standard ONNX graph; 2 (default) adds tern's fused "
         "operators; 3 adds rewrites that reassociate floating-point arithmetic",
         0},
        {"passes", OPT_PASSES, "A,B,...", 0, "run exactly these passes, in this order, instead of a level", 0},
        {"list-passes", OPT_LIST, NULL, 0, "list the passes with their level and what they do, and exit", 0},
        {"stats", OPT_STATS, NULL, 0, "print on standard error what each pass changed and how long it took", 0},
        {"dim", OPT_DIM, "NAME=N", 0, "make symbolic dimension NAME static, of size N (repeatable)", 0},
        {"drop-training", OPT_DROP_TRAINING, NULL, 0,
         "drop the training algorithm and optimizer state (tern-autodiff's), then optimise the inference graph; "
         "without it a model that carries one has its training step optimised and its inference graph kept",
         0},
        {0},
};

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	options *o = state->input;
	switch (key) {
	case 'O':
		if (strlen(arg) != 1 || arg[0] < '0' || arg[0] > '3')
			argp_error(state, "-O takes a level from 0 to 3, not '%s'", arg);
		o->level = arg[0] - '0';
		return 0;
	case OPT_PASSES:
		o->pass_list = arg;
		o->n_passes = 0;
		for (char *save = NULL, *p = strtok_r(arg, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
			o->passes = tern_cli_grow(o->passes, (size_t)o->n_passes + 1, sizeof *o->passes);
			o->passes[o->n_passes++] = p;
		}
		if (!o->n_passes)
			argp_error(state, "--passes needs at least one pass name");
		return 0;
	case OPT_LIST: o->list = 1; return 0;
	case OPT_STATS: o->stats = 1; return 0;
	case OPT_DIM: tern_cli_parse_dim(&o->dims, arg, state); return 0;
	case OPT_DROP_TRAINING: o->drop_training = 1; return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

static void list_passes(void)
{
	for (int i = 0; i < tern_pass_count(); i++)
		printf("%-22s -O%d  %s\n", tern_pass_name(i), tern_pass_level(i), tern_pass_description(i));
	if (fflush(stdout) || ferror(stdout))
		tern_cli_fail(TERN_EIO, "write error");
}

static void print_stats(const tern_pass_stat *st, int n)
{
	fprintf(stderr, "%-22s %5s %8s %6s %6s %10s %9s\n", "pass", "runs", "removed", "added", "fused", "rewritten",
	        "ms");
	tern_pass_stat total = {.name = "total"};
	for (int i = 0; i <= n; i++) {
		const tern_pass_stat *s = i < n ? &st[i] : &total;
		fprintf(stderr, "%-22s %5d %8d %6d %6d %10d %9.3f\n", s->name, s->runs, s->removed, s->added, s->fused,
		        s->rewritten, s->ms);
		if (i == n)
			break;
		total.runs += s->runs;
		total.removed += s->removed;
		total.added += s->added;
		total.fused += s->fused;
		total.rewritten += s->rewritten;
		total.ms += s->ms;
	}
}

static size_t live_nodes(tern_model *m)
{
	tern_graph *g = tern_model_graph(m);
	size_t n = 0;
	for (size_t i = 0; i < g->n_nodes; i++)
		n += !g->nodes[i]->removed;
	return n;
}

int main(int argc, char **argv)
{
	tern_cli cli;
	options opts = {.level = 2};
	const tern_cli_tool tool = {
	        "tern-optimize",
	        "Rewrite a graph so that it computes the same outputs with less work.\v"
	        "Passes repeat until the graph stops changing, so optimising an optimised graph changes nothing. "
	        "-O1 output is a standard ONNX graph; -O2 and -O3 use operators of the domain 'tern' that tern-run "
	        "executes. Annotations of the old graph (keys starting tern.) are dropped when anything changed.",
	        option_table,
	        parse_option,
	        &opts,
	        NULL,
	        1};
	tern_cli_parse(&cli, &tool, argc, argv);
	if (opts.list) {
		list_passes();
		return 0;
	}
	FILE *out = tern_cli_open_output(&cli, 1);
	tern_model *m = tern_cli_load(&cli);
	if (opts.drop_training) {
		int dropped = tern_model_drop_training(m);
		if (dropped)
			tern_cli_verbose(1, "dropped the training algorithm (%d optimizer state tensors)", dropped);
	}
	bool training = tern_model_has_training(m);
	size_t before = live_nodes(m);
	tern_optimize_options o = {opts.level,     opts.passes,     opts.n_passes,
	                           opts.dims.names, opts.dims.values, opts.dims.n};
	tern_pass_stat *stats = NULL;
	int n_stats = 0;
	if (training) {
		/* the training step is optimised; the inference graph, which it reads by name, stays */
		if (opts.dims.n)
			tern_cli_fail(TERN_EUSAGE, "--dim on a model with a training algorithm: the batch size of training is "
			                           "chosen by tern-run --batch (--drop-training first for inference)");
		tern_cli_check(tern_model_optimize_training(m, &o, &stats, &n_stats));
		tern_cli_verbose(1, "optimised the training step; the inference graph is left as it is "
		                    "(--drop-training optimises it for inference)");
	} else {
		tern_cli_check(tern_optimize(m, &o, &stats, &n_stats));
	}
	int changes = 0;
	for (int i = 0; i < n_stats; i++)
		changes += stats[i].removed + stats[i].added + stats[i].fused + stats[i].rewritten;
	if (changes)
		tern_cli_drop_annotations(m);
	if (opts.stats)
		print_stats(stats, n_stats);
	if (!training)
		tern_cli_verbose(1, "%zu nodes before, %zu after", before, live_nodes(m));
	tern_cli_write_model(out, m);
	free(stats);
	free(opts.passes);
	free(opts.dims.names);
	free(opts.dims.values);
	tern_model_free(m);
	return 0;
}
