/* shards.c — a partitioned step's table shards filled from the model's tables at the start of
 * training (tern_dist_scatter) and gathered back into rank 0's tables for writing (tern_dist_gather).
 * The map is the annotation's (partition.c): table lines with shard, shard_rows, starts, owners,
 * offsets and state=FULL:SHARD pairs. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct table_map {
	char names[3][2][256]; /* [pair][full, shard]: the table and its optimizer states */
	int n_pairs;
	int64_t rows, shard_rows;
	int64_t *starts, *owners, *offsets;
	int parts;
} table_map;

static int64_t *parse_ints(const char *s, int *n)
{
	int count = 1;
	for (const char *c = s; *c && *c != ' ' && *c != '\n'; c++)
		count += *c == ',';
	int64_t *v = malloc((size_t)count * sizeof *v);
	if (!v)
		return NULL;
	char *end = (char *)s;
	for (int i = 0; i < count; i++) {
		v[i] = strtoll(end, &end, 10);
		if (*end == ',')
			end++;
	}
	*n = count;
	return v;
}

static void copy_word(char *dst, size_t cap, const char *src, char stop)
{
	size_t k = 0;
	while (src[k] && src[k] != ' ' && src[k] != '\n' && src[k] != stop && k + 1 < cap) {
		dst[k] = src[k];
		k++;
	}
	dst[k] = 0;
}

/* The next table line from *at that has a shard; false at the end. */
static bool next_table(const char **at, table_map *t, tern_status *st)
{
	*st = TERN_OK;
	for (const char *line = *at; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		*at = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL;
		if (strncmp(line, "table ", 6) != 0 || !strstr(line, " shard="))
			continue;
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char *copy = strndup(line, len);
		if (!copy) {
			*st = tern_errorf(TERN_EOS, "out of memory");
			return false;
		}
		memset(t, 0, sizeof *t);
		copy_word(t->names[0][0], sizeof t->names[0][0], copy + 6, 0);
		t->n_pairs = 1;
		int ns = 0, no = 0, nf = 0;
		for (char *w = strtok(copy, " "); w; w = strtok(NULL, " ")) {
			if (!strncmp(w, "rows=", 5))
				t->rows = strtoll(w + 5, NULL, 10);
			else if (!strncmp(w, "shard_rows=", 11))
				t->shard_rows = strtoll(w + 11, NULL, 10);
			else if (!strncmp(w, "shard=", 6))
				copy_word(t->names[0][1], sizeof t->names[0][1], w + 6, 0);
			else if (!strncmp(w, "starts=", 7))
				t->starts = parse_ints(w + 7, &ns);
			else if (!strncmp(w, "owners=", 7))
				t->owners = parse_ints(w + 7, &no);
			else if (!strncmp(w, "offsets=", 8))
				t->offsets = parse_ints(w + 8, &nf);
			else if (!strncmp(w, "state=", 6) && t->n_pairs < 3 && strchr(w, ':')) {
				copy_word(t->names[t->n_pairs][0], sizeof t->names[0][0], w + 6, ':');
				copy_word(t->names[t->n_pairs][1], sizeof t->names[0][1], strchr(w, ':') + 1, 0);
				t->n_pairs++;
			}
		}
		free(copy);
		t->parts = no;
		if (!t->starts || !t->owners || !t->offsets || ns != no + 1 || nf != no || no < 1 || t->shard_rows < 1) {
			free(t->starts);
			free(t->owners);
			free(t->offsets);
			*st = tern_errorf(TERN_EDATA, "the annotation %s: a malformed table line for '%s'", TERN_PARTITION_KEY,
			                  t->names[0][0]);
			return false;
		}
		return true;
	}
	return false;
}

static void table_map_free(table_map *t)
{
	free(t->starts);
	free(t->owners);
	free(t->offsets);
}

static tern_status full_tensor(tern_model *m, const char *name, tern_value **v, tern_tensor *out)
{
	*v = tern_graph_find(m->graph, name);
	if (!*v || !(*v)->initializer)
		return tern_errorf(TERN_EDATA, "%s: the partitioned table '%s' is not an initializer", m->source, name);
	return tern_tensor_from_proto((*v)->initializer, m->base_dir, name, out);
}

tern_status tern_dist_scatter(tern_trainer *tr, tern_model *m)
{
	const char *a = tern_model_meta(m, TERN_PARTITION_KEY), *at = a;
	int me = tern_comm_rank();
	table_map t;
	tern_status st = TERN_OK;
	while (!st && at && next_table(&at, &t, &st)) {
		for (int p = 0; p < t.n_pairs && !st; p++) {
			tern_value *v;
			tern_tensor full = {0}, shard = {0};
			st = full_tensor(m, t.names[p][0], &v, &full);
			int64_t dims[TERN_MAX_RANK];
			memcpy(dims, full.dims, sizeof dims);
			dims[0] = t.shard_rows;
			if (!st && (full.rank < 1 || full.dims[0] != t.rows))
				st = tern_errorf(TERN_EDATA, "%s: '%s' has not the %lld rows it was partitioned with", m->source,
				                 t.names[p][0], (long long)t.rows);
			if (!st)
				st = tern_tensor_alloc(&shard, full.dtype, full.rank, dims);
			if (!st) {
				size_t rb = full.nbytes / (size_t)t.rows;
				memset(shard.data, 0, shard.nbytes);
				for (int k = 0; k < t.parts; k++)
					if (t.owners[k] == me)
						memcpy((char *)shard.data + (size_t)t.offsets[k] * rb, (char *)full.data + (size_t)t.starts[k] * rb,
						       (size_t)(t.starts[k + 1] - t.starts[k]) * rb);
				st = tern_trainer_set_state(tr, t.names[p][1], &shard);
			}
			tern_tensor_free(&full);
			tern_tensor_free(&shard);
		}
		table_map_free(&t);
	}
	return st;
}

tern_status tern_dist_gather(tern_trainer *tr, tern_model *m)
{
	const char *a = tern_model_meta(m, TERN_PARTITION_KEY), *at = a;
	int me = tern_comm_rank(), n = tern_comm_size();
	table_map t;
	tern_status st = TERN_OK;
	int64_t *cnt = calloc(4 * ((size_t)n + 1), sizeof *cnt);
	if (!cnt)
		return tern_errorf(TERN_EOS, "out of memory");
	int64_t *send_off = cnt + n + 1, *recv_bytes = send_off + n + 1, *recv_off = recv_bytes + n + 1;
	while (!st && at && next_table(&at, &t, &st)) {
		/* rows each rank holds: its partitions, packed from the shard's first row */
		int64_t *held = calloc((size_t)n + 1, sizeof *held);
		if (!held)
			st = tern_errorf(TERN_EOS, "out of memory");
		for (int k = 0; !st && k < t.parts; k++)
			held[t.owners[k]] += t.starts[k + 1] - t.starts[k];
		for (int p = 0; p < t.n_pairs && !st; p++) {
			const tern_tensor *shard = tern_trainer_state(tr, t.names[p][1]);
			if (!shard || shard->rank < 1 || shard->dims[0] != t.shard_rows) {
				st = tern_errorf(TERN_EDATA, "%s: no shard '%s' of %lld rows in the step", m->source, t.names[p][1],
				                 (long long)t.shard_rows);
				break;
			}
			size_t rb = shard->nbytes / (size_t)t.shard_rows;
			tern_tensor full = {0};
			tern_value *v = NULL;
			char *recv = NULL;
			if (me == 0)
				st = full_tensor(m, t.names[p][0], &v, &full);
			int64_t total = 0;
			for (int r = 0; r < n; r++) {
				cnt[r] = send_off[r] = 0;
				recv_bytes[r] = me == 0 ? held[r] * (int64_t)rb : 0;
				recv_off[r] = total;
				total += recv_bytes[r];
			}
			cnt[0] = held[me] * (int64_t)rb;
			if (!st && !(recv = malloc((size_t)total + 1)))
				st = tern_errorf(TERN_EOS, "out of memory");
			if (!st)
				st = tern_comm_alltoallv(TERN_COMM_OTHER, shard->data, cnt, send_off, recv, recv_bytes, recv_off);
			if (!st && me == 0) {
				for (int k = 0; k < t.parts; k++)
					memcpy((char *)full.data + (size_t)t.starts[k] * rb,
					       recv + recv_off[t.owners[k]] + (size_t)t.offsets[k] * rb,
					       (size_t)(t.starts[k + 1] - t.starts[k]) * rb);
				st = tern_initializer_replace(v, &full);
			}
			free(recv);
			tern_tensor_free(&full);
		}
		free(held);
		table_map_free(&t);
	}
	free(cnt);
	return st;
}
