/* annotation.c — the tern.schedule annotation: writing it, and reading it back with every check a
 * hand-edited schedule needs (each node once, known names, waits on earlier nodes, every
 * dependency ordered by stream order and waits). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

static bool name_ok(const char *name)
{
	if (!*name || strcmp(name, "-") == 0)
		return false;
	for (const char *c = name; *c; c++)
		if (*c == '\t' || *c == '\n' || *c == ',' || *c == '\r')
			return false;
	return true;
}

tern_status tern_schedule_format(const tern_schedule *s, char **out)
{
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);
	if (!f)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < s->n_nodes; i++) {
		const tern_node *n = s->order[i];
		if (!name_ok(n->name)) {
			fclose(f);
			free(buf);
			return tern_node_errorf(n, TERN_EDATA,
			                        "a scheduled node needs a name without tabs, commas or newlines");
		}
		fprintf(f, "%s\t%d\t", n->name, s->stream[i]);
		if (!s->n_waits[i])
			fputs("-", f);
		for (int w = 0; w < s->n_waits[i]; w++)
			fprintf(f, "%s%s", w ? "," : "", s->order[s->waits[i][w]]->name);
		fputc('\n', f);
	}
	if (fclose(f) != 0) {
		free(buf);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	*out = buf;
	return TERN_OK;
}

/* Node lookup by name: the graph's nodes sorted by name. */
typedef struct by_name {
	const char *name;
	int index;
} by_name;

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const by_name *)a)->name, ((const by_name *)b)->name);
}

static int find_node(const by_name *tab, size_t n, const char *name)
{
	by_name key = {name, 0};
	const by_name *hit = bsearch(&key, tab, n, sizeof *tab, cmp_name);
	return hit ? hit->index : -1;
}

static tern_status fault(const tern_graph *g, int line, const char *fmt, const char *arg)
{
	char what[512];
	snprintf(what, sizeof what, fmt, arg);
	return tern_errorf(TERN_EDATA, "%s: %s line %d: %s", g->model->source, TERN_SCHEDULE_KEY, line, what);
}

tern_status tern_schedule_parse(tern_graph *g, const char *text, tern_schedule **out)
{
	*out = NULL;
	size_t nn = 0;
	for (size_t i = 0; i < g->n_nodes; i++)
		nn += !g->nodes[i]->removed;
	tern_schedule *s = calloc(1, sizeof *s);
	by_name *tab = calloc(nn + 1, sizeof *tab);
	int *pos_of = malloc((g->n_nodes + 1) * sizeof *pos_of);
	char *copy = tern_strdup(text);
	tern_status rc = TERN_OK;
	if (!s || !tab || !pos_of || !copy) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	s->order = calloc(nn + 1, sizeof *s->order);
	s->stream = calloc(nn + 1, sizeof *s->stream);
	s->waits = calloc(nn + 1, sizeof *s->waits);
	s->n_waits = calloc(nn + 1, sizeof *s->n_waits);
	if (!s->order || !s->stream || !s->waits || !s->n_waits) {
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	size_t k = 0;
	for (size_t i = 0; i < g->n_nodes; i++) {
		pos_of[i] = -1;
		if (!g->nodes[i]->removed)
			tab[k++] = (by_name){g->nodes[i]->name, (int)i};
	}
	qsort(tab, nn, sizeof *tab, cmp_name);
	for (size_t i = 1; i < nn; i++)
		if (strcmp(tab[i].name, tab[i - 1].name) == 0) {
			rc = tern_errorf(TERN_EDATA, "%s: %s: two nodes are named '%s'; a schedule needs unique names",
			                 g->model->source, TERN_SCHEDULE_KEY, tab[i].name);
			goto done;
		}
	int line = 0;
	char *save = NULL;
	for (char *ln = strtok_r(copy, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
		line++;
		if (!*ln)
			continue;
		char *tab1 = strchr(ln, '\t');
		char *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
		if (!tab2) {
			rc = fault(g, line, "expected NODE<TAB>STREAM<TAB>WAITS, got '%s'", ln);
			goto done;
		}
		*tab1 = *tab2 = '\0';
		int idx = find_node(tab, nn, ln);
		if (idx < 0) {
			rc = fault(g, line, "no node is named '%s'", ln);
			goto done;
		}
		if (pos_of[idx] >= 0) {
			rc = fault(g, line, "node '%s' is scheduled twice", ln);
			goto done;
		}
		char *end;
		long stream = strtol(tab1 + 1, &end, 10);
		if (end == tab1 + 1 || *end || stream < 0 || stream > 4096) {
			rc = fault(g, line, "stream '%s' is not a number from 0 to 4096", tab1 + 1);
			goto done;
		}
		int p = s->n_nodes++;
		pos_of[idx] = p;
		s->order[p] = g->nodes[idx];
		s->stream[p] = (int)stream;
		if (stream + 1 > s->n_streams)
			s->n_streams = (int)stream + 1;
		char *waits = tab2 + 1;
		if (strcmp(waits, "-") == 0)
			continue;
		size_t n_commas = 1;
		for (char *c = waits; *c; c++)
			n_commas += *c == ',';
		s->waits[p] = malloc(n_commas * sizeof **s->waits);
		if (!s->waits[p]) {
			rc = tern_errorf(TERN_EOS, "out of memory");
			goto done;
		}
		char *wsave = NULL;
		for (char *w = strtok_r(waits, ",", &wsave); w; w = strtok_r(NULL, ",", &wsave)) {
			int wi = find_node(tab, nn, w);
			if (wi < 0 || pos_of[wi] < 0) {
				rc = fault(g, line,
				           wi < 0 ? "waits for '%s', which no node is named"
				                  : "waits for '%s', which is launched later",
				           w);
				goto done;
			}
			s->waits[p][s->n_waits[p]++] = pos_of[wi];
		}
	}
	if ((size_t)s->n_nodes != nn) {
		for (size_t i = 0; i < g->n_nodes; i++)
			if (!g->nodes[i]->removed && pos_of[i] < 0) {
				rc = tern_errorf(TERN_EDATA,
				                 "%s: %s: node '%s' is not scheduled (the schedule is stale: re-run "
				                 "tern-schedule)",
				                 g->model->source, TERN_SCHEDULE_KEY, g->nodes[i]->name);
				goto done;
			}
	}
	/* Every dependency must be ordered: vector clocks over the launch order give, for each node, the
	 * last position of every stream finished before it starts. */
	int S = s->n_streams ? s->n_streams : 1;
	int *clock = malloc(((size_t)s->n_nodes * (size_t)S + 1) * sizeof *clock);
	int *last_on = malloc(((size_t)S + 1) * sizeof *last_on);
	if (!clock || !last_on) {
		free(clock);
		free(last_on);
		rc = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	for (int t = 0; t < S; t++)
		last_on[t] = -1;
	for (int p = 0; p < s->n_nodes && !rc; p++) {
		int *cp = &clock[(size_t)p * (size_t)S];
		int prev = last_on[s->stream[p]];
		for (int t = 0; t < S; t++)
			cp[t] = prev >= 0 ? clock[(size_t)prev * (size_t)S + (size_t)t] : -1;
		for (int w = 0; w < s->n_waits[p]; w++)
			for (int t = 0; t < S; t++) {
				int c = clock[(size_t)s->waits[p][w] * (size_t)S + (size_t)t];
				if (c > cp[t])
					cp[t] = c;
			}
		cp[s->stream[p]] = p;
		last_on[s->stream[p]] = p;
		const tern_node *n = s->order[p];
		for (size_t i = 0; i < n->n_inputs + n->n_implicit && !rc; i++) {
			const tern_value *v = i < n->n_inputs ? n->inputs[i] : n->implicit[i - n->n_inputs];
			if (!v || !v->producer || v->producer->graph != g)
				continue;
			int q = pos_of[v->producer->index];
			if (cp[s->stream[q]] < q)
				rc = tern_node_errorf(n, TERN_EDATA,
				                      "%s does not order it after '%s', whose output it reads",
				                      TERN_SCHEDULE_KEY, v->producer->name);
		}
	}
	free(clock);
	free(last_on);
done:
	free(tab);
	free(pos_of);
	free(copy);
	if (rc) {
		tern_schedule_free(s);
		return rc;
	}
	*out = s;
	return TERN_OK;
}

tern_status tern_model_plan_text(tern_model *m, char **out, size_t *size)
{
	const char *text = tern_model_meta(m, TERN_SCHEDULE_KEY);
	if (!text)
		return tern_errorf(TERN_EDATA, "%s: the graph has no schedule (run tern-schedule first)", m->source);
	tern_schedule *s;
	tern_status rc = tern_schedule_parse(m->graph, text, &s);
	if (rc)
		return rc;
	rc = tern_schedule_format(s, out);
	tern_schedule_free(s);
	if (!rc)
		*size = strlen(*out);
	return rc;
}

tern_status tern_model_stream_groups(tern_model *m, void **groups)
{
	*groups = NULL;
	const char *text = tern_model_meta(m, TERN_SCHEDULE_KEY);
	if (!text)
		return TERN_OK;
	tern_schedule *s;
	tern_status rc = tern_schedule_parse(m->graph, text, &s);
	if (rc)
		return rc;
	int *by_node = malloc((m->graph->n_nodes + 1) * sizeof *by_node);
	if (!by_node) {
		tern_schedule_free(s);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (size_t i = 0; i < m->graph->n_nodes; i++)
		by_node[i] = -1;
	for (int p = 0; p < s->n_nodes; p++)
		by_node[s->order[p]->index] = s->stream[p];
	tern_schedule_free(s);
	*groups = by_node;
	return TERN_OK;
}

int tern_stream_group(const tern_node *node, void *groups)
{
	return groups && node->graph && node->graph->kind == TERN_GRAPH_MAIN ? ((const int *)groups)[node->index] : -1;
}
