/* test_sched.c — the properties of Nimble's schedule on hundreds of seeded random DAGs, each checked
 * against an independent computation in this file: no two unordered nodes share a stream; the chain
 * count is the minimum path cover (nodes − maximum matching, found here by simple augmenting paths);
 * waits never exceed |reduced edges| − |matching|; every dependency is ordered by stream order and
 * waits; the annotation round-trips and a capped schedule stays correct. */
#include "check.h"
#include "graphs.h"

#include <stdio.h>
#include <stdlib.h>

/* adjacency by graph index: adj[u*n+v] = 1 when v reads an output of u */
static tern_model *random_dag(int n, int max_in, unsigned char *adj)
{
	tern_model *m;
	if (one_input_model("x", 4, &m) != TERN_OK)
		return NULL;
	tern_graph *g = tern_model_graph(m);
	memset(adj, 0, (size_t)n * (size_t)n);
	char names[64][16];
	for (int v = 0; v < n; v++) {
		char name[16], out[16];
		snprintf(name, sizeof name, "n%d", v);
		snprintf(out, sizeof out, "v%d", v);
		const char *ins[8];
		int k = v == 0 ? 0 : (int)(rnd() % (unsigned)(max_in + 1));
		if (k > v)
			k = v;
		int n_in = 0;
		for (int i = 0; i < k; i++) {
			int u = (int)(rnd() % (unsigned)v);
			if (adj[u * n + v])
				continue;
			adj[u * n + v] = 1;
			snprintf(names[n_in], sizeof names[0], "v%d", u);
			ins[n_in] = names[n_in];
			n_in++;
		}
		if (n_in == 0) {
			ins[0] = "x";
			n_in = 1;
		}
		const char *outs[1] = {out};
		tern_graph_add_node(g, "Relu", "", name, ins, (size_t)n_in, outs, 1);
	}
	return m;
}

/* reach[u*n+v]: a path u -> v (u != v) in the DAG whose nodes are numbered topologically. */
static void closure(int n, const unsigned char *adj, unsigned char *reach)
{
	memset(reach, 0, (size_t)n * (size_t)n);
	for (int u = n - 1; u >= 0; u--)
		for (int v = u + 1; v < n; v++)
			if (adj[u * n + v]) {
				reach[u * n + v] = 1;
				for (int w = v + 1; w < n; w++)
					reach[u * n + w] |= reach[v * n + w];
			}
}

static bool kuhn(int u, int n, const unsigned char *red, int *match_r, char *seen)
{
	for (int v = 0; v < n; v++) {
		if (!red[u * n + v] || seen[v])
			continue;
		seen[v] = 1;
		if (match_r[v] < 0 || kuhn(match_r[v], n, red, match_r, seen)) {
			match_r[v] = u;
			return true;
		}
	}
	return false;
}

static int node_id(const tern_node *n)
{
	return atoi(n->name + 1);
}

static void check_schedule(int n, const unsigned char *adj, const unsigned char *reach, const tern_schedule *s,
                           bool capped)
{
	int *stream = malloc((size_t)n * sizeof *stream), *pos = malloc((size_t)n * sizeof *pos);
	for (int p = 0; p < s->n_nodes; p++) {
		stream[node_id(s->order[p])] = s->stream[p];
		pos[node_id(s->order[p])] = p;
	}
	CHECK(s->n_nodes == n);
	/* Maximum logical concurrency: unordered nodes on different streams. */
	int shared = 0;
	for (int u = 0; u < n; u++)
		for (int v = u + 1; v < n; v++)
			if (!reach[u * n + v] && stream[u] == stream[v])
				shared++;
	if (!capped)
		CHECK(shared == 0);
	/* Happens-before through stream order and waits, by closure over launch positions. */
	unsigned char *hb = calloc((size_t)n * (size_t)n, 1);
	for (int p = 0; p < n; p++) {
		for (int q = p - 1; q >= 0; q--)
			if (s->stream[q] == s->stream[p]) {
				hb[q * n + p] = 1;
				for (int r = 0; r < q; r++)
					hb[r * n + p] |= hb[r * n + q];
				break;
			}
		for (int w = 0; w < s->n_waits[p]; w++) {
			int q = s->waits[p][w];
			CHECK(q < p && s->stream[q] != s->stream[p]);
			hb[q * n + p] = 1;
			for (int r = 0; r < q; r++)
				hb[r * n + p] |= hb[r * n + q];
		}
	}
	int unordered = 0;
	for (int u = 0; u < n; u++)
		for (int v = 0; v < n; v++)
			if (adj[u * n + v] && !hb[pos[u] * n + pos[v]])
				unordered++;
	CHECK(unordered == 0);
	free(hb);
	free(stream);
	free(pos);
}

static void test_random_dags(void)
{
	enum { N = 40 };
	unsigned char adj[N * N], reach[N * N], red[N * N];
	for (int trial = 0; trial < 300; trial++) {
		rng_state = (uint64_t)trial * 2654435761u + 1;
		int n = 2 + (int)(rnd() % (N - 1));
		tern_model *m = random_dag(n, 1 + trial % 4, adj);
		CHECK(m != NULL);
		if (!m)
			continue;
		closure(n, adj, reach);
		int e_red = 0;
		for (int u = 0; u < n; u++)
			for (int v = 0; v < n; v++) {
				red[u * n + v] = 0;
				if (!adj[u * n + v])
					continue;
				bool implied = false;
				for (int w = 0; w < n && !implied; w++)
					implied = w != v && adj[u * n + w] && reach[w * n + v];
				red[u * n + v] = !implied;
				e_red += !implied;
			}
		int match_r[N], matching = 0;
		for (int v = 0; v < n; v++)
			match_r[v] = -1;
		for (int u = 0; u < n; u++) {
			char seen[N] = {0};
			matching += kuhn(u, n, red, match_r, seen);
		}
		tern_schedule *s;
		tern_schedule_stats st;
		CHECK_OK(tern_schedule_compute(tern_model_graph(m), 0, &s, &st));
		if (s) {
			CHECK(st.reduced_edges == e_red);
			CHECK(st.matching == matching);
			CHECK(st.chains == n - matching);
			CHECK(st.waits <= e_red - matching);
			check_schedule(n, adj, reach, s, false);
			char *text;
			CHECK_OK(tern_schedule_format(s, &text));
			tern_schedule *back;
			CHECK_OK(tern_schedule_parse(tern_model_graph(m), text, &back));
			if (back) {
				CHECK(back->n_nodes == s->n_nodes && back->n_streams == s->n_streams);
				tern_schedule_free(back);
			}
			free(text);
			tern_schedule_free(s);
		}
		CHECK_OK(tern_schedule_compute(tern_model_graph(m), 2, &s, &st));
		if (s) {
			CHECK(s->n_streams <= 2);
			check_schedule(n, adj, reach, s, true);
			tern_schedule_free(s);
		}
		tern_model_free(m);
	}
}

static void test_bad_annotations(void)
{
	unsigned char adj[9];
	rng_state = 7;
	tern_model *m = random_dag(3, 1, adj);
	if (!m)
		return;
	tern_graph *g = tern_model_graph(m);
	tern_schedule *s = NULL;
	const char *bad[] = {
	        "n0\t0\t-\nn1\t0\t-\n", /* n2 missing */
	        "n0\t0\t-\nn0\t0\t-\nn1\t0\t-\nn2\t0\t-\n", /* twice */
	        "n0\tx\t-\nn1\t0\t-\nn2\t0\t-\n", /* stream not a number */
	        "n0\t0\t-\nn1\t0\tnope\nn2\t0\t-\n", /* unknown wait */
	        "zz\t0\t-\n", /* unknown node */
	        "n0 0 -\n", /* no tabs */
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(bad); i++) {
		CHECK(tern_schedule_parse(g, bad[i], &s) == TERN_EDATA && s == NULL);
		CHECK(strstr(tern_error(), "tern.schedule") != NULL);
	}
	/* A dependency across streams without a wait is refused. */
	char text[256] = "";
	for (int v = 0; v < 3; v++) {
		char line[64];
		snprintf(line, sizeof line, "n%d\t%d\t-\n", v, v);
		strcat(text, line);
	}
	bool any_edge = adj[1] || adj[2] || adj[5];
	CHECK(!any_edge || tern_schedule_parse(g, text, &s) == TERN_EDATA);
	tern_schedule_free(s);
	tern_model_free(m);
}

int main(void)
{
	test_random_dags();
	test_bad_annotations();
	return check_report("test_sched");
}
