/* tern-schedule — Nimble's ahead-of-time multi-stream schedule, written into the graph as the
 * tern.schedule annotation that tern-run follows and tern-show -f plan prints. */
#include "../lib/internal.h"
#include "cli.h"

#include <stdlib.h>

typedef struct options {
	int max_streams; /* 0: auto (uncapped) */
} options;

static const struct argp_option option_table[] = {
        {"streams", 's', "N|auto", 0, "At most N streams (default auto: as many as the graph's concurrency needs)", 0},
        {0},
};

static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	options *o = state->input;
	if (key != 's')
		return ARGP_ERR_UNKNOWN;
	if (strcmp(arg, "auto") == 0) {
		o->max_streams = 0;
		return 0;
	}
	char *end;
	long n = strtol(arg, &end, 10);
	if (*end || n < 1 || n > 4096)
		argp_error(state, "--streams takes a number from 1 to 4096 or 'auto', not '%s'", arg);
	o->max_streams = (int)n;
	return 0;
}

/* A schedule names nodes: give unnamed nodes and later duplicates a fresh name. */
static int name_nodes(tern_graph *g)
{
	int renamed = 0;
	for (size_t i = 0; i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		bool clash = !*n->name || strcmp(n->name, "-") == 0 || strpbrk(n->name, "\t\n\r,");
		for (size_t j = 0; j < i && !clash; j++)
			clash = strcmp(g->nodes[j]->name, n->name) == 0;
		if (!clash)
			continue;
		char *name = malloc(strlen(n->op_type) + 24);
		if (!name)
			tern_cli_fail(TERN_EOS, "out of memory");
		for (int k = (int)i;; k++) {
			sprintf(name, "%s_%d", n->op_type, k);
			bool used = false;
			for (size_t j = 0; j < g->n_nodes && !used; j++)
				used = j != i && strcmp(g->nodes[j]->name, name) == 0;
			if (!used)
				break;
		}
		if (n->proto->name != protobuf_c_empty_string)
			free(n->proto->name);
		n->proto->name = name;
		n->name = name;
		renamed++;
	}
	return renamed;
}

int main(int argc, char **argv)
{
	tern_cli cli;
	options opts = {0};
	const tern_cli_tool tool = {
	        "tern-schedule",
	        "Compute an ahead-of-time multi-stream schedule (Nimble) and write it into the graph.\v"
	        "Independent operators go to different streams; a node waits only on the cross-stream edges of "
	        "the graph's transitive reduction, the fewest synchronisations possible. The schedule is stored "
	        "in metadata_props under tern.schedule; `tern-show -f plan` prints it. A model with a training "
	        "algorithm also gets its training step's schedule, tern.training_schedule, which tern-run --train "
	        "follows.",
	        option_table,
	        parse_option,
	        &opts,
	        NULL,
	        1};
	tern_cli_parse(&cli, &tool, argc, argv);
	FILE *out = tern_cli_open_output(&cli, 1);
	tern_model *m = tern_cli_load(&cli);
	tern_graph *g = tern_model_graph(m);
	int renamed = name_nodes(g);
	if (renamed)
		tern_cli_verbose(1, "named %d unnamed or duplicate-named nodes", renamed);
	tern_schedule *s;
	tern_schedule_stats st;
	tern_cli_check(tern_schedule_compute(g, opts.max_streams, &s, &st));
	char *text;
	tern_cli_check(tern_schedule_format(s, &text));
	tern_cli_check(tern_model_set_meta(m, TERN_SCHEDULE_KEY, text));
	tern_cli_verbose(1, "%d nodes, %d edges in the transitive reduction, maximum matching %d", s->n_nodes,
	                 st.reduced_edges, st.matching);
	tern_cli_verbose(1, "%d chains (minimum path cover) on %d streams, %d cross-stream waits (bound %d)", st.chains,
	                 st.streams, st.waits, st.reduced_edges - st.matching);
	if (opts.max_streams && st.lost_pairs)
		tern_cli_verbose(1, "--streams %d puts %lld pairs of independent nodes on one stream", opts.max_streams,
		                 (long long)st.lost_pairs);
	if (tern_model_has_training(m)) {
		/* the training step too: tern-run --train follows it */
		tern_schedule_stats ts;
		int n_step = 0;
		tern_cli_check(tern_model_schedule_training(m, opts.max_streams, &ts, &n_step));
		tern_cli_verbose(1, "training step: %d nodes, %d chains on %d streams, %d cross-stream waits", n_step,
		                 ts.chains, ts.streams, ts.waits);
	}
	tern_cli_write_model(out, m);
	free(text);
	tern_schedule_free(s);
	tern_model_free(m);
	return 0;
}
