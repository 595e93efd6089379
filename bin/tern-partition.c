/* tern-partition — Parallax's sparsity-aware data parallelism: a training step rewritten into one
 * SPMD step for N ranks (dense gradients through AllReduce, sparse tables sharded over servers),
 * which tern-dist-run runs. */
#include "../lib/internal.h"
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
	tern_partition_options p;
	const char *hosts;
} options;

enum { OPT_STRATEGY = 0x100, OPT_LOCAL, OPT_BUCKET, OPT_HOSTS, OPT_NO_OVERLAP };

static const struct argp_option option_table[] = {
        {"ranks", 'n', "N", 0, "Partition for N processes (required)", 0},
        {"strategy", OPT_STRATEGY, "S", 0,
         "hybrid (default: dense gradients by AllReduce, sparse tables on servers), allreduce (everything dense), "
         "allgather (sparse gradients gathered by every rank, as Horovod), ps (every parameter on servers)", 0},
        {"partitions", 'P', "P|auto", 0,
         "Row partitions of each sparse table (default: one per server); auto: tern-dist-run times candidate "
         "counts on the first batches and partitions with the best (the step is left as it is until then)", 0},
        {"hosts", OPT_HOSTS, "FILE", 0,
         "MPICH's host file (HOST[:SLOTS] a line): one server per host, on its first rank (default: one per rank)", 0},
        {"local-aggregation", OPT_LOCAL, NULL, 0, "Sum sparse gradients on each host's first rank before they go to the servers (with --hosts)", 0},
        {"bucket-mb", OPT_BUCKET, "MB", 0, "Reduce dense gradients together up to MB mebibytes a call (default 4)", 0},
        {"no-overlap", OPT_NO_OVERLAP, NULL, 0,
         "Reduce dense gradients after the backward pass, not while it runs (to measure what overlap gains)", 0},
        {0},
};


static error_t parse_option(int key, char *arg, struct argp_state *state)
{
	options *o = state->input;
	switch (key) {
	case 'n': o->p.ranks = (int)tern_cli_count(state, "--ranks", arg, 1, 1 << 20); return 0;
	case 'P':
		if (!strcmp(arg, "auto")) {
			o->p.partitions = -1;
			return 0;
		}
		o->p.partitions = (int)tern_cli_count(state, "--partitions", arg, 1, 1 << 24);
		return 0;
	case OPT_STRATEGY: o->p.strategy = arg; return 0;
	case OPT_HOSTS: o->hosts = arg; return 0;
	case OPT_LOCAL: o->p.local_aggregation = 1; return 0;
	case OPT_NO_OVERLAP: o->p.no_overlap = 1; return 0;
	case OPT_BUCKET: {
		char *end;
		o->p.bucket_mb = strtod(arg, &end);
		if (*end || !(o->p.bucket_mb > 0) || o->p.bucket_mb > 1e6)
			argp_error(state, "--bucket-mb takes a positive number, not '%s'", arg);
		return 0;
	}
	default: return ARGP_ERR_UNKNOWN;
	}
}

/* The host count of an MPICH host file (HOST or HOST:SLOTS a line, # comments); the slots must add
 * up to the ranks when every host gives them. *first[h] is host h's first rank as mpiexec places ranks
 * (hosts in order, SLOTS ranks each, one for a host without). */
static int read_hosts(const char *path, int ranks, int **first)
{
	FILE *f = fopen(path, "r");
	if (!f)
		tern_cli_fail(TERN_ENOINPUT, "%s: %s", path, strerror(errno));
	char line[1024];
	int hosts = 0, lineno = 0;
	long slots = 0;
	bool all_slots = true;
	while (fgets(line, sizeof line, f)) {
		lineno++;
		char *c = line + strspn(line, " \t");
		c[strcspn(c, "#\r\n")] = 0;
		if (!*c)
			continue;
		char *colon = strchr(c, ':'), *end = NULL;
		size_t name_len = colon ? (size_t)(colon - c) : strcspn(c, " \t");
		if (!name_len || c[name_len + strspn(c + name_len, " \t")] != (colon ? ':' : 0))
			tern_cli_fail(TERN_EDATA, "%s:%d: not HOST or HOST:SLOTS", path, lineno);
		long s = 1;
		if (colon) {
			s = strtol(colon + 1, &end, 10);
			end += strspn(end, " \t");
			if (*end || s < 1)
				tern_cli_fail(TERN_EDATA, "%s:%d: the slots after ':' must be a positive number", path, lineno);
		} else {
			all_slots = false;
		}
		*first = tern_cli_grow(*first, (size_t)hosts + 1, sizeof **first);
		(*first)[hosts] = (int)(slots < ranks ? slots : ranks - 1);
		slots += s;
		hosts++;
	}
	fclose(f);
	if (!hosts)
		tern_cli_fail(TERN_EDATA, "%s: no hosts", path);
	if (hosts > ranks)
		tern_cli_fail(TERN_EUSAGE, "%s: %d hosts for %d ranks", path, hosts, ranks);
	if (all_slots && slots != ranks)
		tern_cli_fail(TERN_EUSAGE, "%s: the hosts' slots add up to %ld, not the %d ranks", path, slots, ranks);
	return hosts;
}

int main(int argc, char **argv)
{
	tern_cli cli;
	options opts = {0};
	const tern_cli_tool tool = {
	        "tern-partition",
	        "Rewrite a model's training step (from tern-autodiff) into one SPMD step for N ranks, as Parallax "
	        "does: parameters whose gradient is dense go through tern.AllReduce (the mean over the ranks, small "
	        "ones bucketed together); embedding tables, whose gradient is the rows read, are split by rows "
	        "over servers: the forward pass pulls the rows it reads from their owners, the backward pass pushes "
	        "the rows' gradients to them (duplicates summed first), and each owner updates its shard. The "
	        "result is annotated under tern.partition; tern-dist-run runs it.",
	        option_table,
	        parse_option,
	        &opts,
	        NULL,
	        1};
	tern_cli_parse(&cli, &tool, argc, argv);
	if (!opts.p.ranks)
		tern_cli_fail(TERN_EUSAGE, "--ranks N is required");
	int *first = NULL;
	if (opts.hosts) {
		opts.p.servers = read_hosts(opts.hosts, opts.p.ranks, &first);
		opts.p.server_ranks = first;
	}
	FILE *out = tern_cli_open_output(&cli, 1);
	tern_model *m = tern_cli_load(&cli);
	tern_partition_summary s;
	tern_cli_check(tern_model_partition(m, &opts.p, &s));
	if (opts.p.partitions < 0)
		tern_cli_verbose(1, "%d ranks, strategy %s: the partition count is left to tern-dist-run", opts.p.ranks,
		                 opts.p.strategy ? opts.p.strategy : "hybrid");
	else
		tern_cli_verbose(1, "%d ranks, strategy %s: %d dense parameters (%lld values) in %d AllReduce calls, %d sparse "
	                 "tables (%lld values)",
	                 opts.p.ranks, opts.p.strategy ? opts.p.strategy : "hybrid", s.n_dense, (long long)s.dense_elems,
	                 s.n_buckets, s.n_sparse, (long long)s.sparse_elems);
	tern_cli_write_model(out, m);
	tern_model_free(m);
	free(first);
	return 0;
}
