/* schedule.c — Nimble's stream assignment: transitive reduction of the operator DAG, a maximum
 * bipartite matching (Hopcroft–Karp) giving a minimum path cover, one chain per stream, waits on
 * exactly the cross-chain edges of the reduction; then totally ordered chains share a stream and an
 * optional cap merges streams, counting the concurrency it gives up. */
#include "internal.h"

#include <stdlib.h>

typedef struct dag {
	int n;
	tern_node **order; /* topological */
	int **succ; /* reduced successors, by position */
	int *n_succ;
	int **pred; /* reduced predecessors */
	int *n_pred;
	uint64_t *reach; /* n x words: nodes reachable from each node (excluding itself) */
	size_t words;
} dag;

static bool reaches(const dag *d, int u, int v)
{
	return (d->reach[(size_t)u * d->words + (size_t)v / 64] >> (v % 64)) & 1;
}

static void dag_free(dag *d)
{
	for (int i = 0; i < d->n; i++) {
		free(d->succ ? d->succ[i] : NULL);
		free(d->pred ? d->pred[i] : NULL);
	}
	free(d->succ);
	free(d->pred);
	free(d->n_succ);
	free(d->n_pred);
	free(d->reach);
	free(d->order);
}

/* Direct successors of position u among the graph's nodes (consumers of its outputs, implicit
 * readers included), as positions, deduplicated. */
static int direct_successors(tern_graph *g, const int *pos, tern_node *u, int *out, char *seen)
{
	int k = 0;
	for (size_t o = 0; o < u->n_outputs; o++) {
		tern_value *v = u->outputs[o];
		if (!v)
			continue;
		for (size_t c = 0; c < v->n_consumers; c++) {
			tern_node *cn = v->consumers[c];
			if (cn->graph != g || cn->removed || seen[pos[cn->index]])
				continue;
			seen[pos[cn->index]] = 1;
			out[k++] = pos[cn->index];
		}
	}
	for (int i = 0; i < k; i++)
		seen[out[i]] = 0;
	return k;
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

static tern_status build_dag(tern_graph *g, dag *d, tern_schedule_stats *stats)
{
	size_t count;
	tern_status rc = tern_graph_toposort(g, &d->order, &count);
	if (rc)
		return rc;
	int n = d->n = (int)count;
	d->words = ((size_t)n + 63) / 64;
	int *pos = malloc((g->n_nodes + 1) * sizeof *pos);
	int *buf = malloc(((size_t)n + 1) * sizeof *buf);
	char *seen = calloc((size_t)n + 1, 1);
	d->succ = calloc((size_t)n + 1, sizeof *d->succ);
	d->pred = calloc((size_t)n + 1, sizeof *d->pred);
	d->n_succ = calloc((size_t)n + 1, sizeof *d->n_succ);
	d->n_pred = calloc((size_t)n + 1, sizeof *d->n_pred);
	d->reach = calloc((size_t)n * d->words + 1, sizeof *d->reach);
	if (!pos || !buf || !seen || !d->succ || !d->pred || !d->n_succ || !d->n_pred || !d->reach) {
		rc = tern_errorf(TERN_EOS, "out of memory scheduling %d nodes", n);
		goto done;
	}
	for (int i = 0; i < n; i++)
		pos[d->order[i]->index] = i;
	/* Reverse topological order: reach(u) = union of {v} ∪ reach(v) over direct successors v. An
	 * edge u→v is in the reduction iff no other direct successor w of u reaches v. Visiting the
	 * successors in increasing topological position, v is redundant iff an earlier-visited w (which
	 * precedes v topologically, as any w reaching v must) already reaches it. */
	for (int u = n - 1; u >= 0; u--) {
		int k = direct_successors(g, pos, d->order[u], buf, seen);
		qsort(buf, (size_t)k, sizeof *buf, cmp_int);
		uint64_t *ru = &d->reach[(size_t)u * d->words];
		d->succ[u] = malloc(((size_t)k + 1) * sizeof **d->succ);
		if (!d->succ[u]) {
			rc = tern_errorf(TERN_EOS, "out of memory");
			goto done;
		}
		for (int i = 0; i < k; i++) {
			int v = buf[i];
			if (!((ru[v / 64] >> (v % 64)) & 1))
				d->succ[u][d->n_succ[u]++] = v;
			ru[v / 64] |= 1ull << (v % 64);
			const uint64_t *rv = &d->reach[(size_t)v * d->words];
			for (size_t w = 0; w < d->words; w++)
				ru[w] |= rv[w];
		}
	}
	for (int u = 0; u < n; u++)
		for (int i = 0; i < d->n_succ[u]; i++)
			d->n_pred[d->succ[u][i]]++;
	for (int v = 0; v < n; v++) {
		d->pred[v] = malloc(((size_t)d->n_pred[v] + 1) * sizeof **d->pred);
		if (!d->pred[v]) {
			rc = tern_errorf(TERN_EOS, "out of memory");
			goto done;
		}
		d->n_pred[v] = 0;
	}
	for (int u = 0; u < n; u++)
		for (int i = 0; i < d->n_succ[u]; i++) {
			int v = d->succ[u][i];
			d->pred[v][d->n_pred[v]++] = u;
		}
	for (int u = 0; u < n; u++)
		stats->reduced_edges += d->n_succ[u];
done:
	free(pos);
	free(buf);
	free(seen);
	return rc;
}

/* Hopcroft–Karp on the bipartite graph (left copy u) → (right copy v) per reduced edge u→v.
 * match_l[u] = v or -1; match_r[v] = u or -1. */
static tern_status hopcroft_karp(const dag *d, int *match_l, int *match_r, int *size)
{
	int n = d->n;
	int *dist = malloc(((size_t)n + 1) * sizeof *dist);
	int *queue = malloc(((size_t)n + 1) * sizeof *queue);
	int *stack = malloc(((size_t)n + 1) * sizeof *stack);
	int *edge_i = malloc(((size_t)n + 1) * sizeof *edge_i);
	if (!dist || !queue || !stack || !edge_i) {
		free(dist);
		free(queue);
		free(stack);
		free(edge_i);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int i = 0; i < n; i++)
		match_l[i] = match_r[i] = -1;
	*size = 0;
	const int INF = n + 1;
	for (;;) {
		/* BFS from free left vertices, layering by alternating paths. */
		int head = 0, tail = 0;
		bool found = false;
		for (int u = 0; u < n; u++) {
			dist[u] = match_l[u] < 0 ? 0 : INF;
			if (match_l[u] < 0)
				queue[tail++] = u;
		}
		while (head < tail) {
			int u = queue[head++];
			for (int i = 0; i < d->n_succ[u]; i++) {
				int w = match_r[d->succ[u][i]];
				if (w < 0)
					found = true;
				else if (dist[w] == INF) {
					dist[w] = dist[u] + 1;
					queue[tail++] = w;
				}
			}
		}
		if (!found)
			break;
		/* DFS (iterative) for vertex-disjoint shortest augmenting paths. */
		for (int root = 0; root < n; root++) {
			if (match_l[root] >= 0)
				continue;
			int sp = 0;
			stack[sp++] = root;
			edge_i[root] = 0;
			bool augmented = false;
			while (sp > 0 && !augmented) {
				int u = stack[sp - 1];
				if (edge_i[u] >= d->n_succ[u]) {
					dist[u] = INF; /* dead end: never revisit this phase */
					sp--;
					continue;
				}
				int v = d->succ[u][edge_i[u]++];
				int w = match_r[v];
				if (w < 0) {
					/* Flip the path: stack[i] takes the vertex stack[i+1] was matched to. */
					for (int i = sp - 1; i >= 0; i--) {
						int x = stack[i];
						int prev_v = match_l[x];
						match_l[x] = v;
						match_r[v] = x;
						v = prev_v;
					}
					(*size)++;
					augmented = true;
				} else if (dist[w] == dist[u] + 1) {
					edge_i[w] = 0;
					stack[sp++] = w;
				}
			}
		}
	}
	free(dist);
	free(queue);
	free(stack);
	free(edge_i);
	return TERN_OK;
}

void tern_schedule_free(tern_schedule *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n_nodes; i++)
		free(s->waits ? s->waits[i] : NULL);
	free(s->waits);
	free(s->n_waits);
	free(s->stream);
	free(s->order);
	free(s);
}

tern_status tern_schedule_compute(tern_graph *g, int max_streams, tern_schedule **out, tern_schedule_stats *stats)
{
	*out = NULL;
	tern_schedule_stats local = {0};
	if (!stats)
		stats = &local;
	memset(stats, 0, sizeof *stats);
	dag d = {0};
	tern_schedule *s = calloc(1, sizeof *s);
	tern_status rc = s ? build_dag(g, &d, stats) : tern_errorf(TERN_EOS, "out of memory");
	int n = d.n;
	int *match_l = NULL, *match_r = NULL, *chain = NULL, *stream_of_chain = NULL, *tail = NULL;
	if (rc)
		goto done;
	match_l = malloc(((size_t)n + 1) * sizeof *match_l);
	match_r = malloc(((size_t)n + 1) * sizeof *match_r);
	chain = malloc(((size_t)n + 1) * sizeof *chain);
	if (!match_l || !match_r || !chain) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	if ((rc = hopcroft_karp(&d, match_l, match_r, &stats->matching)))
		goto done;
	/* Chains: start at nodes no matched edge enters, follow matched edges. Heads are visited in
	 * topological order, so chain numbers follow it too. */
	int n_chains = 0;
	for (int u = 0; u < n; u++)
		if (match_r[u] < 0) {
			for (int x = u; x >= 0; x = match_l[x])
				chain[x] = n_chains;
			n_chains++;
		}
	stats->chains = n_chains;
	/* Merge totally ordered chains: a chain joins the first stream whose last node reaches the
	 * chain's head, so the stream stays totally ordered and no concurrency is lost. */
	stream_of_chain = malloc(((size_t)n_chains + 1) * sizeof *stream_of_chain);
	tail = malloc(((size_t)n_chains + 1) * sizeof *tail); /* per stream: its last node */
	if (!stream_of_chain || !tail) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	int n_streams = 0;
	for (int u = 0; u < n; u++) {
		if (match_r[u] >= 0)
			continue;
		int c = chain[u], last = u;
		while (match_l[last] >= 0)
			last = match_l[last];
		int st = -1;
		for (int k = 0; k < n_streams && st < 0; k++)
			if (reaches(&d, tail[k], u))
				st = k;
		if (st < 0)
			st = n_streams++;
		stream_of_chain[c] = st;
		tail[st] = last;
	}
	s->n_nodes = n;
	s->order = d.order;
	d.order = NULL;
	s->stream = malloc(((size_t)n + 1) * sizeof *s->stream);
	s->waits = calloc((size_t)n + 1, sizeof *s->waits);
	s->n_waits = calloc((size_t)n + 1, sizeof *s->n_waits);
	if (!s->stream || !s->waits || !s->n_waits) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	for (int u = 0; u < n; u++)
		s->stream[u] = stream_of_chain[chain[u]];
	/* The cap: merge the two smallest streams until few enough, counting node pairs with no path
	 * between them that end up on one stream. */
	if (max_streams > 0) {
		while (n_streams > max_streams) {
			int *size_of = calloc((size_t)n_streams, sizeof *size_of);
			if (!size_of) {
				rc = tern_errorf(TERN_EOS, "out of memory");
				goto done;
			}
			for (int u = 0; u < n; u++)
				size_of[s->stream[u]]++;
			int a = 0, b = 1;
			if (size_of[b] < size_of[a]) {
				a = 1;
				b = 0;
			}
			for (int k = 2; k < n_streams; k++) {
				if (size_of[k] < size_of[a]) {
					b = a;
					a = k;
				} else if (size_of[k] < size_of[b]) {
					b = k;
				}
			}
			free(size_of);
			int keep = a < b ? a : b, gone = a < b ? b : a;
			for (int u = 0; u < n; u++)
				for (int v = u + 1; v < n; v++)
					if (((s->stream[u] == keep && s->stream[v] == gone) ||
					     (s->stream[u] == gone && s->stream[v] == keep)) &&
					    !reaches(&d, u, v))
						stats->lost_pairs++;
			for (int u = 0; u < n; u++) {
				if (s->stream[u] == gone)
					s->stream[u] = keep;
				else if (s->stream[u] == n_streams - 1 && gone != n_streams - 1)
					s->stream[u] = gone;
			}
			n_streams--;
		}
	}
	s->n_streams = n_streams ? n_streams : 1;
	stats->streams = s->n_streams;
	/* Waits: every reduced edge whose ends are on different streams. Edges within a stream are
	 * ordered by the stream, which follows the topological launch order. */
	for (int v = 0; v < n; v++) {
		s->waits[v] = malloc(((size_t)d.n_pred[v] + 1) * sizeof **s->waits);
		if (!s->waits[v]) {
			rc = tern_errorf(TERN_EOS, "out of memory");
			goto done;
		}
		for (int i = 0; i < d.n_pred[v]; i++) {
			int u = d.pred[v][i];
			if (s->stream[u] != s->stream[v])
				s->waits[v][s->n_waits[v]++] = u;
		}
		stats->waits += s->n_waits[v];
	}
done:
	free(match_l);
	free(match_r);
	free(chain);
	free(stream_of_chain);
	free(tail);
	dag_free(&d);
	if (rc) {
		tern_schedule_free(s);
		return rc;
	}
	*out = s;
	return TERN_OK;
}
