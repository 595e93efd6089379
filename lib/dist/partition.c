/* partition.c — tern-partition: a training step rewritten into one SPMD step for N ranks.
 *
 * Every parameter is classified by its update (tern-autodiff's): tern.SGDRows, tern.AdamRows and
 * tern.AdagradRows take a sparse gradient (the rows an embedding table's Gathers read), tern.SGD,
 * tern.Adam and tern.Adagrad a dense one. Dense gradients go through tern.AllReduce (the mean), in
 * buckets of up to bucket_mb, in the order the backward pass produces them. Sparse tables, by
 * strategy:
 *   hybrid     split by rows into P partitions over the servers (greedily, to the one with the fewest
 *              bytes so far): the forward Gathers become tern.Pull from the shards, the gradient a
 *              tern.Push to their owners, and the update runs on this rank's shard only;
 *   allgather  every rank's rows gathered by every rank (Horovod), the table replicated;
 *   allreduce  the gradient made dense (tern.RowsToDense) and reduced as the dense ones are.
 * The result is annotated under TERN_PARTITION_KEY (formats/annotations.md). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct update_kind {
	const char *op, *dense_op;
	int param; /* input position of the parameter */
	bool rows;
} update_kind;

static const update_kind updates[] = {
        {"SGD", "SGD", 1, false},        {"Adam", "Adam", 2, false},        {"Adagrad", "Adagrad", 2, false},
        {"SGDRows", "SGD", 1, true},     {"AdamRows", "Adam", 2, true},     {"AdagradRows", "Adagrad", 2, true},
};

static const update_kind *update_of(const tern_node *n)
{
	if (n->removed || strcmp(n->domain, "tern") != 0)
		return NULL;
	for (size_t k = 0; k < TERN_ARRAY_LEN(updates); k++)
		if (strcmp(n->op_type, updates[k].op) == 0)
			return &updates[k];
	return NULL;
}

/* ---------------------------------------------------------------- text of the annotation */

typedef struct text {
	char *s;
	size_t n, cap;
	bool oom;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			t->oom = true;
			return;
		}
		if (t->s && t->n + (size_t)k < t->cap) {
			t->n += (size_t)k;
			return;
		}
		size_t cap = (t->cap + (size_t)k + 1) * 2;
		char *s = realloc(t->s, cap);
		if (!s) {
			t->oom = true;
			return;
		}
		t->s = s;
		t->cap = cap;
	}
}

static void put_ints(text *t, const char *key, const int64_t *v, size_t n)
{
	put(t, " %s=", key);
	for (size_t i = 0; i < n; i++)
		put(t, "%s%lld", i ? "," : "", (long long)v[i]);
}

/* ---------------------------------------------------------------- sparse tables */

typedef struct table {
	tern_node *update; /* in the step */
	const update_kind *kind;
	char *name; /* the parameter */
	tern_type type;
	int n_state;
	char *state[2], *state_shard[2];
	char *shard;
	int parts; /* row partitions */
	int map_of; /* the table whose shard map this one shares (itself: its own) */
	int64_t shard_rows; /* rows of each rank's shard (the most any rank holds) */
	int64_t *starts, *owners, *offsets; /* P + 1, P, P */
} table;

static void table_free(table *t)
{
	free(t->name);
	free(t->shard);
	for (int s = 0; s < 2; s++) {
		free(t->state[s]);
		free(t->state_shard[s]);
	}
	free(t->starts);
	free(t->owners);
	free(t->offsets);
}

static char *shard_name(const char *full)
{
	char *s = malloc(strlen(full) + 7);
	if (s)
		sprintf(s, "%s/shard", full);
	return s;
}

static tern_status set_map_attrs(tern_node *n, const table *t, int parts, int ranks)
{
	tern_status st = tern_node_add_attr_int(n, "rows", t->type.dims[0]);
	if (!st)
		st = tern_node_add_attr_ints(n, "starts", t->starts, (size_t)parts + 1);
	if (!st)
		st = tern_node_add_attr_ints(n, "owners", t->owners, (size_t)parts);
	if (!st)
		st = tern_node_add_attr_ints(n, "offsets", t->offsets, (size_t)parts);
	if (!st)
		st = tern_node_add_attr_int(n, "ranks", ranks);
	return st;
}

/* A zero tensor of a shard's shape as the main graph's initializer. */
static tern_status add_shard_initializer(tern_model *m, const char *name, const tern_type *full, int64_t rows)
{
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, full->dims, sizeof dims);
	dims[0] = rows;
	tern_tensor z = {0};
	tern_status st = tern_tensor_alloc(&z, full->dtype, full->rank, dims);
	if (st)
		return st;
	memset(z.data, 0, z.nbytes);
	if (tern_graph_find(m->graph, name))
		st = tern_errorf(TERN_EUSAGE, "%s: the graph already has a value '%s'", m->source, name);
	else if (!tern_graph_take_initializer(m->graph, name, &z))
		st = tern_errorf(TERN_EOS, "out of memory");
	tern_tensor_free(&z);
	return st;
}

static tern_status rebind(tern_model *m, const char *key, const char *new_key)
{
	Onnx__TrainingInfoProto *ti = m->proto->training_info[0];
	for (size_t b = 0; b < ti->n_update_binding; b++) {
		Onnx__StringStringEntryProto *e = ti->update_binding[b];
		if (e->key && strcmp(e->key, key) == 0) {
			char *k = tern_strdup(new_key);
			if (!k)
				return tern_errorf(TERN_EOS, "out of memory");
			free(e->key);
			e->key = k;
			return TERN_OK;
		}
	}
	return tern_errorf(TERN_EINTERNAL, "%s: '%s' is not bound by the training algorithm", m->source, key);
}

/* Partitions [0, rows) into parts contiguous ranges (the first rows % parts one longer) and gives
 * each, largest first, to the server with the fewest bytes so far. */
static void shard_table(table *t, int parts, const int *server_rank, int servers, int64_t *server_bytes,
                        int64_t *rank_rows)
{
	int64_t rows = t->type.dims[0], row_bytes = (int64_t)tern_dtype_size(t->type.dtype);
	for (int d = 1; d < t->type.rank; d++)
		row_bytes *= t->type.dims[d];
	for (int k = 0; k <= parts; k++)
		t->starts[k] = k * (rows / parts) + (k < rows % parts ? k : rows % parts);
	for (int k = 0; k < parts; k++) {
		int best = 0;
		for (int s = 1; s < servers; s++)
			if (server_bytes[s] < server_bytes[best])
				best = s;
		int64_t len = t->starts[k + 1] - t->starts[k];
		server_bytes[best] += len * row_bytes;
		int r = server_rank[best];
		t->owners[k] = r;
		t->offsets[k] = rank_rows[r];
		rank_rows[r] += len;
	}
}

/* ---------------------------------------------------------------- the rewrite */

static tern_status copy_attrs(tern_node *dst, const tern_node *src)
{
	Onnx__NodeProto *d = dst->proto;
	const Onnx__NodeProto *s = src->proto;
	Onnx__AttributeProto **arr = realloc(d->attribute, (d->n_attribute + s->n_attribute + 1) * sizeof *arr);
	if (!arr)
		return tern_errorf(TERN_EOS, "out of memory");
	d->attribute = arr;
	for (size_t i = 0; i < s->n_attribute; i++) {
		Onnx__AttributeProto *a = tern_pb_copy(s->attribute[i]);
		if (!a)
			return tern_errorf(TERN_EOS, "out of memory");
		d->attribute[d->n_attribute++] = a;
	}
	return TERN_OK;
}

/* Two new values from one node: op(in) -> (out0[, out1]) named after stem. */
static tern_node *add_op(tern_graph *g, const char *op, const char *const *in, size_t n_in, const char *stem,
                         int n_out, char **out_names)
{
	char buf[300];
	for (int o = 0; o < n_out; o++) {
		snprintf(buf, sizeof buf, "%s/%s%d", stem, op, o);
		out_names[o] = tern_graph_unique_name(g, buf);
		if (!out_names[o])
			return NULL;
	}
	snprintf(buf, sizeof buf, "%s/%s", stem, op);
	char *name = tern_graph_unique_name(g, buf);
	tern_node *n = name ? tern_graph_add_node(g, op, "tern", name, in, n_in, (const char *const *)out_names,
	                                          (size_t)n_out)
	                    : NULL;
	free(name);
	return n;
}

/* The declared type of a graph output of the step, when it is one. */
static tern_status retype_output(tern_graph *g, const char *name, const tern_type *t)
{
	Onnx__GraphProto *gp = g->proto;
	for (size_t i = 0; i < gp->n_output; i++) {
		if (!gp->output[i]->name || strcmp(gp->output[i]->name, name) != 0)
			continue;
		Onnx__TypeProto *tp = tern_type_to_proto(t);
		if (!tp)
			return tern_errorf(TERN_EOS, "out of memory");
		if (gp->output[i]->type)
			onnx__type_proto__free_unpacked(gp->output[i]->type, &tern_pb_allocator);
		gp->output[i]->type = tp;
	}
	return TERN_OK;
}

/* One Pull of the rows of tables sharded alike at the same indices. */
typedef struct pull_group {
	int map; /* the tables' map (tables[map]) */
	tern_value *idx;
	int n; /* reads */
	int table[16];
	tern_node *gather[16];
	tern_node *pull;
	char *route;
} pull_group;

/* hybrid (and ps's tables): the forward reads of sharded tables become tern.Pull (tables with one map
 * read at the same indices together, with a route out), their gradients tern.Push (with the route of
 * the pull of the same indices, when a table is read once: then only rows travel), and each update
 * runs on this rank's shard. */
static tern_status sparse_sharded(tern_graph *g, table *tables, size_t n_tables, int ranks, const int64_t *leaders)
{
	pull_group *pg = NULL;
	size_t n_pg = 0;
	int *reads = calloc(n_tables + 1, sizeof *reads);
	tern_status st = reads ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; !st && i < n_tables; i++) {
		table *t = &tables[i];
		if (!t->kind->rows)
			continue;
		tern_value *tv = tern_graph_find(g, t->name);
		if (!tv || !tern_graph_find(g, t->shard))
			return tern_errorf(TERN_EINTERNAL, "no value '%s' or '%s' in the step", t->name, t->shard);
		for (size_t c = 0; !st && c < tv->n_consumers; c++) {
			tern_node *n = tv->consumers[c];
			if (n == t->update || n->removed)
				continue;
			int64_t axis = tern_attr_int(n, "axis", 0);
			if (*n->domain || strcmp(n->op_type, "Gather") != 0 || n->inputs[0] != tv || n->inputs[1] == tv ||
			    (axis != 0 && axis != -(int64_t)t->type.rank)) {
				st = tern_node_errorf(n, TERN_EUSAGE, "reads the sparse table '%s' other than by rows (Gather along axis 0)",
				                      t->name);
				break;
			}
			reads[i]++;
			pull_group *grp = NULL;
			for (size_t k = 0; k < n_pg && !grp; k++)
				if (pg[k].map == t->map_of && pg[k].idx == n->inputs[1] && pg[k].n < 16)
					grp = &pg[k];
			if (!grp) {
				pull_group *grown = realloc(pg, (n_pg + 1) * sizeof *pg);
				if (!grown) {
					st = tern_errorf(TERN_EOS, "out of memory");
					break;
				}
				pg = grown;
				grp = &pg[n_pg++];
				memset(grp, 0, sizeof *grp);
				grp->map = t->map_of;
				grp->idx = n->inputs[1];
			}
			grp->table[grp->n] = (int)i;
			grp->gather[grp->n++] = n;
		}
	}
	/* the pulls */
	for (size_t k = 0; !st && k < n_pg; k++) {
		pull_group *grp = &pg[k];
		const char *in[17];
		char *out[17] = {NULL}, *name = NULL, *idx = tern_strdup(grp->idx->name);
		char stem[300];
		snprintf(stem, sizeof stem, "%s/route", tables[grp->table[0]].name);
		grp->route = tern_graph_unique_name(g, stem);
		snprintf(stem, sizeof stem, "%s/Pull", tables[grp->table[0]].name);
		name = tern_graph_unique_name(g, stem);
		for (int r = 0; r < grp->n; r++) {
			in[r] = tables[grp->table[r]].shard;
			out[r] = tern_strdup(grp->gather[r]->outputs[0]->name);
		}
		in[grp->n] = idx;
		out[grp->n] = grp->route;
		bool ok = idx && name && grp->route;
		for (int r = 0; r < grp->n; r++)
			ok = ok && out[r];
		for (int r = 0; ok && r < grp->n; r++)
			tern_graph_remove_node(g, grp->gather[r]);
		tern_node *p = ok ? tern_graph_add_node(g, "Pull", "tern", name, in, (size_t)grp->n + 1,
		                                        (const char *const *)out, (size_t)grp->n + 1)
		                  : NULL;
		st = p ? set_map_attrs(p, &tables[grp->map], tables[grp->map].parts, ranks)
		       : tern_errorf(TERN_EOS, "out of memory");
		grp->pull = p;
		for (int r = 0; r < grp->n; r++)
			free(out[r]);
		free(name);
		free(idx);
	}
	/* the pushes: tables read once, by a group whose indices are their gradient's, together with the
	 * group's route; the others each on their own */
	bool *done = calloc(n_tables + 1, sizeof *done);
	if (!st && !done)
		st = tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; !st && i < n_tables; i++) {
		table *t = &tables[i];
		if (!t->kind->rows || done[i])
			continue;
		int kp = t->kind->param;
		tern_value *gidx = t->update->inputs[kp + 1];
		pull_group *grp = NULL;
		/* with local aggregation a push goes through the host's first rank: no route */
		for (size_t k = 0; !leaders && reads[i] == 1 && k < n_pg && !grp; k++)
			for (int r = 0; r < pg[k].n && !grp; r++)
				if (pg[k].table[r] == (int)i && pg[k].idx == gidx)
					grp = &pg[k];
		/* the tables that go with it */
		int with[16], n_with = 0;
		with[n_with++] = (int)i;
		for (int r = 0; grp && r < grp->n && n_with < 16; r++) {
			int j = grp->table[r];
			if (j != (int)i && !done[j] && reads[j] == 1 && tables[j].update->inputs[tables[j].kind->param + 1] == gidx)
				with[n_with++] = j;
		}
		const char *in[18];
		int n_in = 0;
		if (grp)
			in[n_in++] = grp->route;
		in[n_in++] = gidx->name;
		for (int w = 0; w < n_with; w++)
			in[n_in++] = tables[with[w]].update->inputs[tables[with[w]].kind->param + 2]->name;
		char *out[17] = {NULL};
		tern_node *push = add_op(g, "Push", in, (size_t)n_in, t->name, 1 + n_with, out);
		st = push ? set_map_attrs(push, &tables[t->map_of], t->parts, ranks) : tern_errorf(TERN_EOS, "out of memory");
		if (!st && grp)
			st = tern_node_add_attr_int(push, "routed", 1);
		if (!st && leaders)
			st = tern_node_add_attr_ints(push, "leaders", leaders, (size_t)ranks);
		for (int w = 0; !st && w < n_with; w++) {
			table *tw = &tables[with[w]];
			tern_node *u = tw->update;
			int k = tw->kind->param;
			tern_value *shard_v = tern_graph_find(g, tw->shard);
			tern_node_set_input(u, (size_t)k, shard_v);
			tern_node_set_input(u, (size_t)k + 1, push->outputs[0]);
			tern_node_set_input(u, (size_t)k + 2, push->outputs[1 + w]);
			for (int sidx = 0; sidx < tw->n_state && !st; sidx++) {
				tern_value *sv = tern_graph_find(g, tw->state_shard[sidx]);
				if (!sv)
					st = tern_errorf(TERN_EINTERNAL, "no value '%s' in the step", tw->state_shard[sidx]);
				else
					tern_node_set_input(u, (size_t)k + 3 + (size_t)sidx, sv);
			}
			/* the new parameter and state are the shard's shape */
			for (size_t r = 0; r < u->n_outputs && !st; r++)
				if (u->outputs[r]) {
					u->outputs[r]->type = shard_v->type;
					st = retype_output(g, u->outputs[r]->name, &shard_v->type);
				}
			done[with[w]] = true;
		}
		for (int r = 0; r < 17; r++)
			free(out[r]);
	}
	for (size_t k = 0; k < n_pg; k++)
		free(pg[k].route);
	free(pg);
	free(reads);
	free(done);
	return st;
}

static tern_status sparse_allgather(tern_graph *g, table *t, int ranks)
{
	tern_node *u = t->update;
	int k = t->kind->param;
	const char *in[2] = {u->inputs[k + 1]->name, u->inputs[k + 2]->name};
	char *out[2] = {NULL, NULL};
	tern_node *p = add_op(g, "AllGatherRows", in, 2, t->name, 2, out);
	tern_status st = p ? tern_node_add_attr_int(p, "ranks", ranks) : tern_errorf(TERN_EOS, "out of memory");
	if (!st) {
		tern_node_set_input(u, (size_t)k + 1, p->outputs[0]);
		tern_node_set_input(u, (size_t)k + 2, p->outputs[1]);
	}
	free(out[0]);
	free(out[1]);
	return st;
}

/* The update node u replaced by rule op on inputs in[0..n_in), with u's attributes and outputs. */
static tern_node *swap_update(tern_graph *g, tern_node *u, const char *op, const char *const *in, size_t n_in,
                              tern_status *st)
{
	char *outs[3] = {NULL, NULL, NULL}, *name = tern_strdup(u->name);
	size_t n_out = u->n_outputs < 3 ? u->n_outputs : 3;
	*st = name ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
	for (size_t o = 0; o < n_out && !*st; o++)
		if (u->outputs[o] && !(outs[o] = tern_strdup(u->outputs[o]->name)))
			*st = tern_errorf(TERN_EOS, "out of memory");
	/* the inputs by name: u may hold the only reference to a name in[] points into */
	char **names = calloc(n_in + 1, sizeof *names);
	for (size_t i = 0; names && i < n_in && !*st; i++)
		if (!(names[i] = tern_strdup(in[i] ? in[i] : "")))
			*st = tern_errorf(TERN_EOS, "out of memory");
	if (!names && !*st)
		*st = tern_errorf(TERN_EOS, "out of memory");
	Onnx__NodeProto *proto = *st ? NULL : tern_pb_copy(u->proto);
	tern_node *nu = NULL;
	if (!*st && !proto)
		*st = tern_errorf(TERN_EOS, "out of memory");
	if (!*st) {
		tern_graph_remove_node(g, u);
		nu = tern_graph_add_node(g, op, "tern", name, (const char *const *)names, n_in, (const char *const *)outs, n_out);
		if (!nu) {
			*st = tern_errorf(TERN_EOS, "out of memory");
		} else {
			tern_node src = {.proto = proto};
			*st = copy_attrs(nu, &src);
		}
	}
	if (proto)
		onnx__node_proto__free_unpacked(proto, &tern_pb_allocator);
	for (size_t i = 0; names && i < n_in; i++)
		free(names[i]);
	free(names);
	free(name);
	for (int o = 0; o < 3; o++)
		free(outs[o]);
	return *st ? NULL : nu;
}

/* The rows made dense; the update node replaced by the dense rule (*update). */
static tern_status sparse_densify(tern_graph *g, table *t, tern_node **update)
{
	tern_node *u = t->update;
	int k = t->kind->param;
	const char *in[2] = {u->inputs[k + 1]->name, u->inputs[k + 2]->name};
	char *out = NULL;
	tern_node *d = add_op(g, "RowsToDense", in, 2, t->name, 1, &out);
	tern_status st = d ? tern_node_add_attr_int(d, "rows", t->type.dims[0]) : tern_errorf(TERN_EOS, "out of memory");
	/* the dense rule: the same inputs with the gradient in place of (I, R) */
	const char *rin[8];
	size_t n_in = 0;
	for (size_t i = 0; i < u->n_inputs && n_in < 8; i++)
		if (i != (size_t)k + 2)
			rin[n_in++] = i == (size_t)k + 1 ? out : u->inputs[i] ? u->inputs[i]->name : "";
	*update = st ? NULL : swap_update(g, u, t->kind->dense_op, rin, n_in, &st);
	free(out);
	return st;
}

/* ps: a dense parameter on its server too. The forward pass reads all its rows by a tern.Pull; its
 * gradient goes to the owner as all rows by a tern.Push; the owner applies the rows form of the rule. */
static tern_status dense_ps(tern_graph *g, table *t, int parts, int ranks)
{
	tern_node *u = t->update;
	tern_value *pv = tern_graph_find(g, t->name), *shard_v = tern_graph_find(g, t->shard);
	if (!pv || !shard_v)
		return tern_errorf(TERN_EINTERNAL, "no value '%s' or '%s' in the step", t->name, t->shard);
	int64_t rows = t->type.dims[0];
	tern_tensor every = {0};
	tern_status st = tern_tensor_alloc(&every, TERN_INT64, 1, &rows);
	for (int64_t r = 0; !st && r < rows; r++)
		((int64_t *)every.data)[r] = r;
	char *all = NULL, *full = NULL, *pushed[2] = {NULL, NULL};
	tern_node *c = st ? NULL : add_op(g, "Constant", NULL, 0, t->name, 1, &all);
	if (c) {
		/* an ai.onnx Constant */
		free((char *)c->proto->domain);
		c->proto->domain = tern_strdup("");
		c->domain = c->proto->domain;
		c->opset = tern_model_opset(g->model, "");
		st = c->domain ? tern_node_add_attr_tensor(c, "value", &every) : tern_errorf(TERN_EOS, "out of memory");
		c->outputs[0]->type.dtype = TERN_INT64;
		c->outputs[0]->type.rank = 1;
		c->outputs[0]->type.dims[0] = rows;
	} else if (!st) {
		st = tern_errorf(TERN_EOS, "out of memory");
	}
	tern_tensor_free(&every);
	const char *pin[2] = {t->shard, all};
	tern_node *pull = st ? NULL : add_op(g, "Pull", pin, 2, t->name, 1, &full);
	if (!st)
		st = pull ? set_map_attrs(pull, t, parts, ranks) : tern_errorf(TERN_EOS, "out of memory");
	/* every other reader reads the pulled value */
	if (!st) {
		pull->outputs[0]->type = pv->type;
		for (size_t i = pv->n_consumers; i-- > 0;) {
			tern_node *n = pv->consumers[i];
			if (n == u || n->removed)
				continue;
			for (size_t k = 0; k < n->n_inputs; k++)
				if (n->inputs[k] == pv)
					tern_node_set_input(n, k, pull->outputs[0]);
		}
	}
	int k = t->kind->param;
	const char *gin[2] = {all, u->inputs[k + 1]->name};
	tern_node *push = st ? NULL : add_op(g, "Push", gin, 2, t->name, 2, pushed);
	if (!st)
		st = push ? set_map_attrs(push, t, parts, ranks) : tern_errorf(TERN_EOS, "out of memory");
	/* the rows rule on the shard */
	const char *rin[8];
	size_t n_in = 0;
	for (size_t i = 0; !st && i < u->n_inputs && n_in < 7; i++) {
		if (i == (size_t)k)
			rin[n_in++] = t->shard;
		else if (i == (size_t)k + 1) {
			rin[n_in++] = pushed[0];
			rin[n_in++] = pushed[1];
		} else if (i > (size_t)k + 1)
			rin[n_in++] = t->state_shard[i - (size_t)k - 2];
		else
			rin[n_in++] = u->inputs[i] ? u->inputs[i]->name : "";
	}
	char rows_op[32];
	snprintf(rows_op, sizeof rows_op, "%sRows", t->kind->dense_op);
	tern_node *nu = st ? NULL : swap_update(g, u, rows_op, rin, n_in, &st);
	for (size_t r = 0; nu && r < nu->n_outputs && !st; r++)
		if (nu->outputs[r]) {
			nu->outputs[r]->type = shard_v->type;
			st = retype_output(g, nu->outputs[r]->name, &shard_v->type);
		}
	free(all);
	free(full);
	free(pushed[0]);
	free(pushed[1]);
	return st;
}

/* ---------------------------------------------------------------- dense gradients in buckets */

typedef struct dense_grad {
	tern_node *update;
	int at; /* the gradient's input position */
	tern_value *grad; /* what is reduced: the update's gradient, or with clipping the gradient before it */
	int order; /* its producer's place in the step's order */
	int64_t bytes;
	int dtype;
} dense_grad;

/* tern-autodiff --clip-norm gives an update Mul(G, coef), coef = Min(N / (norm + 1e-6), 1) of the
 * norm of every gradient: the gradient to reduce is G, before it, so that every rank computes the norm
 * of the means, as one process does of the batch's gradient. NULL when the update's gradient is not so
 * scaled. */
static tern_value *clipped_gradient(const tern_value *gv)
{
	const tern_node *mul = gv->producer;
	if (!mul || strcmp(mul->op_type, "Mul") || *mul->domain || mul->n_inputs != 2)
		return NULL;
	for (int k = 0; k < 2; k++) {
		const tern_value *coef = mul->inputs[k];
		if (coef && coef->producer && !strcmp(coef->producer->op_type, "Min") && !*coef->producer->domain)
			return mul->inputs[1 - k];
	}
	return NULL;
}

static int by_order(const void *a, const void *b)
{
	const dense_grad *x = a, *y = b;
	return (x->order > y->order) - (x->order < y->order);
}

/* One bucket, d[0..k): blocking, tern.AllReduce(G..) -> (G/mean..) where it lands in the order (after
 * the backward pass); overlapped, tern.AllReduceStart(G..) -> packed right after the producer of its
 * last gradient, and tern.AllReduceWait(packed, G..) -> (G/mean..) at the end of the file, which the
 * order puts after everything else that is ready: the backward pass computes while the sum travels. */
static tern_status reduce_bucket(tern_graph *g, dense_grad *d, size_t k, int ranks, int index, bool overlap)
{
	const char **in = calloc(k + 1, sizeof *in);
	char **out = calloc(k, sizeof *out), *name = NULL, *packed = NULL, *wait_name = NULL;
	char stem[64];
	snprintf(stem, sizeof stem, "tern.allreduce/bucket%d", index);
	tern_status st = in && out ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
	for (size_t b = 0; b < k && !st; b++) {
		tern_value *gv = d[b].grad, *mean = NULL;
		in[b + 1] = gv->name;
		char buf[300];
		snprintf(buf, sizeof buf, "%s/mean", gv->name);
		/* the gradient's readers (the update, or with clipping the scaling and the norm) read the mean,
		 * made before the reduction reads the gradient */
		if (!(out[b] = tern_graph_unique_name(g, buf)) || !(mean = tern_graph_value(g, out[b])))
			st = tern_errorf(TERN_EOS, "out of memory");
		else
			tern_value_replace_uses(g, gv, mean);
	}
	if (!st && !(name = tern_graph_unique_name(g, stem)))
		st = tern_errorf(TERN_EOS, "out of memory");
	tern_node *ar = NULL, *start = NULL;
	if (!st && !overlap) {
		ar = tern_graph_add_node(g, "AllReduce", "tern", name, in + 1, k, (const char *const *)out, k);
		st = ar ? tern_node_add_attr_int(ar, "ranks", ranks) : tern_errorf(TERN_EOS, "out of memory");
	} else if (!st) {
		char buf[300];
		snprintf(buf, sizeof buf, "%s/packed", stem);
		packed = tern_graph_unique_name(g, buf);
		snprintf(buf, sizeof buf, "%s/wait", stem);
		wait_name = tern_graph_unique_name(g, buf);
		const char *po[1] = {packed};
		start = packed && wait_name ? tern_graph_add_node(g, "AllReduceStart", "tern", name, in + 1, k, po, 1) : NULL;
		in[0] = packed;
		ar = start ? tern_graph_add_node(g, "AllReduceWait", "tern", wait_name, in, k + 1, (const char *const *)out, k)
		           : NULL;
		st = ar ? tern_node_add_attr_int(start, "ranks", ranks) : tern_errorf(TERN_EOS, "out of memory");
		if (!st)
			st = tern_node_add_attr_int(ar, "ranks", ranks);
	}
	if (!st && start) {
		/* d is in the order of the gradients' producers: the last one's is the bucket's */
		size_t at = 0;
		for (size_t b = 0; b < k; b++) {
			const tern_node *p = d[b].grad->producer;
			if (p && (size_t)p->index + 1 > at)
				at = (size_t)p->index + 1;
		}
		tern_graph_move_node(g, start, at);
		int64_t n = 0;
		for (size_t b = 0; b < k; b++)
			n += d[b].bytes / (int64_t)tern_dtype_size(d[0].dtype);
		start->outputs[0]->type.dtype = d[0].dtype;
		start->outputs[0]->type.rank = 1;
		start->outputs[0]->type.dims[0] = n;
	}
	for (size_t b = 0; b < k && !st; b++)
		ar->outputs[b]->type = d[b].update->inputs[d[b].at - 1]->type;
	for (size_t b = 0; out && b < k; b++)
		free(out[b]);
	free(in);
	free(out);
	free(name);
	free(packed);
	free(wait_name);
	return st;
}

static tern_status reduce_buckets(tern_graph *g, dense_grad *d, size_t n, int64_t cap, int ranks, bool overlap,
                                  int *n_buckets)
{
	tern_node **order;
	size_t count;
	tern_status st = tern_graph_toposort(g, &order, &count);
	if (st)
		return st;
	for (size_t i = 0; i < n; i++) {
		tern_value *gv = d[i].grad;
		d[i].order = -1;
		for (size_t k = 0; k < count && gv->producer; k++)
			if (order[k] == gv->producer)
				d[i].order = (int)k;
		/* a gradient has its parameter's type, which is known (the gradient's own may not be inferred) */
		const tern_type *t = &d[i].update->inputs[d[i].at - 1]->type;
		d[i].bytes = (int64_t)tern_dtype_size(t->dtype) * tern_numel(t->rank, t->dims);
		d[i].dtype = t->dtype;
	}
	free(order);
	qsort(d, n, sizeof *d, by_order);
	*n_buckets = 0;
	for (size_t i = 0; i < n && !st;) {
		size_t j = i + 1;
		int64_t bytes = d[i].bytes;
		while (j < n && d[j].dtype == d[i].dtype && bytes + d[j].bytes <= cap)
			bytes += d[j++].bytes;
		st = reduce_bucket(g, d + i, j - i, ranks, (*n_buckets)++, overlap);
		i = j;
	}
	return st;
}

/* ---------------------------------------------------------------- the whole */

int tern_model_partition_ranks(const tern_model *m)
{
	const char *a = tern_model_meta(m, TERN_PARTITION_KEY);
	const char *r = a ? strstr(a, "ranks ") : NULL;
	return r ? atoi(r + 6) : 1;
}

int tern_model_partition_auto(const tern_model *m, tern_partition_options *o)
{
	const char *a = tern_model_meta(m, TERN_PARTITION_KEY);
	if (!a || !strstr(a, "\npartitions auto\n"))
		return 0;
	memset(o, 0, sizeof *o);
	o->ranks = tern_model_partition_ranks(m);
	o->strategy = strstr(a, "\nstrategy ps\n") ? "ps" : "hybrid";
	const char *s = strstr(a, "\nservers ");
	o->servers = s ? atoi(s + 9) : 0;
	const char *b = strstr(a, "\nbucket_mb ");
	o->bucket_mb = b ? atof(b + 11) : 0;
	o->local_aggregation = strstr(a, "\nlocal_aggregation 1\n") != NULL;
	o->no_overlap = strstr(a, "\noverlap 0\n") != NULL;
	/* the servers' ranks, when a host file placed them (valid until the next call) */
	static int placed[4096];
	const char *r = strstr(a, "\nserver_ranks ");
	if (r && o->servers > 0 && o->servers <= 4096) {
		char *end = (char *)r + 14;
		for (int s = 0; s < o->servers; s++) {
			placed[s] = (int)strtol(end, &end, 10);
			if (*end == ',')
				end++;
		}
		o->server_ranks = placed;
	}
	return 1;
}

tern_status tern_model_partition(tern_model *m, const tern_partition_options *o, tern_partition_summary *summary)
{
	const char *strategy = o->strategy ? o->strategy : "hybrid";
	bool hybrid = !strcmp(strategy, "hybrid"), allgather = !strcmp(strategy, "allgather"),
	     allreduce = !strcmp(strategy, "allreduce"), ps = !strcmp(strategy, "ps");
	if (!hybrid && !allgather && !allreduce && !ps)
		return tern_errorf(TERN_EUSAGE, "unknown strategy '%s' (hybrid, allreduce, allgather or ps)", strategy);
	if (o->ranks < 1)
		return tern_errorf(TERN_EUSAGE, "--ranks must be at least 1");
	if (o->local_aggregation && !hybrid && !ps)
		return tern_errorf(TERN_EUSAGE, "--local-aggregation is for the strategies that push to servers (hybrid, ps)");
	int servers = o->servers > 0 ? o->servers : o->ranks;
	if (servers > o->ranks)
		return tern_errorf(TERN_EUSAGE, "%d servers for %d ranks: a server is a rank", servers, o->ranks);
	int parts = o->partitions > 0 ? o->partitions : servers;
	if (!m->proto->n_training_info || !m->proto->training_info[0]->algorithm)
		return tern_errorf(TERN_EDATA, "%s: the model has no training algorithm; make one with tern-autodiff", m->source);
	tern_partition_options pending;
	if (tern_model_meta(m, TERN_PARTITION_KEY) && !tern_model_partition_auto(m, &pending))
		return tern_errorf(TERN_EUSAGE, "%s: the training step is partitioned already (for %d ranks)", m->source,
		                   tern_model_partition_ranks(m));
	if (o->partitions < 0) {
		/* auto: what to do, for tern-dist-run, which times candidate counts and partitions */
		if (!hybrid && !ps)
			return tern_errorf(TERN_EUSAGE, "--partitions auto is for the strategies that shard (hybrid, ps)");
		text t = {0};
		if (o->local_aggregation && servers >= o->ranks)
			return tern_errorf(TERN_EUSAGE, "--local-aggregation needs hosts of several ranks (--hosts): with one rank "
			                                "a host there is nothing to sum");
		put(&t, "ranks %d\nstrategy %s\npartitions auto\nservers %d\nbucket_mb %g\n", o->ranks, strategy, servers,
		    o->bucket_mb > 0 ? o->bucket_mb : 4.0);
		if (o->local_aggregation)
			put(&t, "local_aggregation 1\n");
		if (o->no_overlap)
			put(&t, "overlap 0\n");
		for (int s = 0; o->server_ranks && s < servers; s++)
			put(&t, "%s%d", s ? "," : "server_ranks ", o->server_ranks[s]);
		if (o->server_ranks)
			put(&t, "\n");
		tern_status st = t.oom ? tern_errorf(TERN_EOS, "out of memory") : tern_model_set_meta(m, TERN_PARTITION_KEY, t.s);
		free(t.s);
		if (!st && summary)
			memset(summary, 0, sizeof *summary);
		return st;
	}
	int64_t cap = (int64_t)((o->bucket_mb > 0 ? o->bucket_mb : 4.0) * 1048576.0);

	/* the tables, found in the step as it is */
	tern_model *step = NULL;
	tern_status st = tern_model_training_step(m, &step);
	table *tables = NULL;
	size_t n_tables = 0;
	int n_dense = 0;
	int64_t dense_elems = 0, sparse_elems = 0;
	for (size_t i = 0; !st && i < step->graph->n_nodes; i++) {
		tern_node *n = step->graph->nodes[i];
		if (n->removed)
			continue;
		if (!strcmp(n->domain, "tern") && !strcmp(n->op_type, "RowsSumSquare"))
			st = tern_node_errorf(n, TERN_EUSAGE, "clipping by the global norm of sparse gradients across ranks is not "
			                                      "supported yet (train without --clip-norm)");
		if (!strcmp(n->domain, "ai.onnx.preview.training"))
			st = tern_node_errorf(n, TERN_EUSAGE, "tern-partition reads tern-autodiff's updates (tern.SGD, tern.Adam, ...)");
		const update_kind *k = update_of(n);
		if (st || !k)
			continue;
		tern_value *p = n->inputs[k->param];
		int64_t elems = tern_numel(p->type.rank, p->type.dims);
		if (!k->rows) {
			n_dense++;
			dense_elems += elems;
			/* ps: a dense parameter (of rank >= 1: rows to shard) on a server too */
			if (!ps || p->type.rank < 1)
				continue;
		}
		table *grown = realloc(tables, (n_tables + 1) * sizeof *tables);
		if (!grown) {
			st = tern_errorf(TERN_EOS, "out of memory");
			break;
		}
		tables = grown;
		table *t = &tables[n_tables++];
		memset(t, 0, sizeof *t);
		t->kind = k;
		t->name = tern_strdup(p->name);
		t->type = p->type;
		if (k->rows)
			sparse_elems += elems;
		/* the state after the gradient: (I, R) for rows rules, G for dense ones */
		int first_state = k->param + (k->rows ? 3 : 2);
		t->n_state = (int)n->n_inputs - first_state;
		if (t->n_state > 2)
			t->n_state = 2;
		for (int s = 0; s < t->n_state; s++)
			t->state[s] = n->inputs[first_state + s] ? tern_strdup(n->inputs[first_state + s]->name) : NULL;
		if (!t->name)
			st = tern_errorf(TERN_EOS, "out of memory");
	}
	tern_model_free(step);
	step = NULL;
	if (!st && !n_dense && !n_tables)
		st = tern_errorf(TERN_EDATA, "%s: the training algorithm updates no parameter", m->source);

	/* hybrid and ps: shards in the main graph, bound in place of the tables */
	bool sharded = hybrid || ps;
	int *server_rank = calloc((size_t)servers + 1, sizeof *server_rank);
	int64_t *server_bytes = calloc((size_t)servers + 1, sizeof *server_bytes);
	int64_t *rank_rows = calloc((size_t)o->ranks + 1, sizeof *rank_rows);
	if (!st && (!server_rank || !server_bytes || !rank_rows))
		st = tern_errorf(TERN_EOS, "out of memory");
	for (int s = 0; !st && s < servers; s++) {
		server_rank[s] = o->server_ranks ? o->server_ranks[s] : (int)((int64_t)s * o->ranks / servers);
		if (server_rank[s] < 0 || server_rank[s] >= o->ranks)
			st = tern_errorf(TERN_EUSAGE, "server %d on rank %d, of %d ranks", s, server_rank[s], o->ranks);
	}
	for (size_t i = 0; !st && sharded && i < n_tables; i++) {
		table *t = &tables[i];
		/* a table in P partitions, a dense parameter (ps) whole on one server */
		t->parts = t->kind->rows ? parts : 1;
		if (t->type.rank < 1 || t->type.dims[0] < t->parts)
			st = tern_errorf(TERN_EUSAGE, "%s: the table '%s' has fewer rows than %d partitions", m->source, t->name,
			                 t->parts);
		t->starts = calloc((size_t)t->parts + 1, sizeof *t->starts);
		t->owners = calloc((size_t)t->parts, sizeof *t->owners);
		t->offsets = calloc((size_t)t->parts, sizeof *t->offsets);
		t->shard = shard_name(t->name);
		if (!st && (!t->starts || !t->owners || !t->offsets || !t->shard))
			st = tern_errorf(TERN_EOS, "out of memory");
		memset(rank_rows, 0, (size_t)o->ranks * sizeof *rank_rows);
		/* tables of as many rows share one map (a softmax's weight and bias): read together, they are
		 * pulled and pushed together */
		t->map_of = (int)i;
		for (size_t j = 0; !st && t->kind->rows && j < i; j++) {
			const table *e = &tables[j];
			if (!e->kind->rows || e->map_of != (int)j || e->type.dims[0] != t->type.dims[0] || e->parts != t->parts)
				continue;
			t->map_of = (int)j;
			memcpy(t->starts, e->starts, ((size_t)t->parts + 1) * sizeof *t->starts);
			memcpy(t->owners, e->owners, (size_t)t->parts * sizeof *t->owners);
			memcpy(t->offsets, e->offsets, (size_t)t->parts * sizeof *t->offsets);
			t->shard_rows = e->shard_rows;
			break;
		}
		if (!st && t->map_of == (int)i) {
			shard_table(t, t->parts, server_rank, servers, server_bytes, rank_rows);
			t->shard_rows = 1;
			for (int r = 0; r < o->ranks; r++)
				t->shard_rows = rank_rows[r] > t->shard_rows ? rank_rows[r] : t->shard_rows;
		}
	}
	for (size_t i = 0; !st && sharded && i < n_tables; i++) {
		table *t = &tables[i];
		int64_t shard_rows = t->shard_rows;
		st = add_shard_initializer(m, t->shard, &t->type, shard_rows);
		if (!st)
			st = rebind(m, t->name, t->shard);
		for (int s = 0; s < t->n_state && !st; s++) {
			if (!t->state[s] || !(t->state_shard[s] = shard_name(t->state[s])))
				st = tern_errorf(TERN_EOS, "out of memory");
			if (!st)
				st = add_shard_initializer(m, t->state_shard[s], &t->type, shard_rows);
			if (!st)
				st = rebind(m, t->state[s], t->state_shard[s]);
		}
	}

	/* the rewrite, on the step with the new bindings */
	if (!st)
		st = tern_model_training_step(m, &step);
	dense_grad *dg = NULL;
	size_t n_dg = 0;
	if (!st && !(dg = calloc((size_t)n_dense + n_tables + 1, sizeof *dg)))
		st = tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; !st && i < step->graph->n_nodes; i++) {
		tern_node *n = step->graph->nodes[i];
		const update_kind *k = update_of(n);
		if (!k)
			continue;
		table *t = NULL;
		const char *pname = n->inputs[k->param]->name;
		for (size_t j = 0; j < n_tables && !t; j++)
			if (!strcmp(tables[j].name, pname) || (tables[j].shard && !strcmp(tables[j].shard, pname)))
				t = &tables[j];
		tern_value *gv = n->inputs[k->param + 1], *raw = k->rows ? NULL : clipped_gradient(gv);
		if (raw && ps) {
			/* the servers would update from each rank's own clipped gradient */
			st = tern_node_errorf(n, TERN_EUSAGE, "clipping by the global norm is not supported with --strategy ps "
			                                      "(train without --clip-norm)");
			break;
		}
		if (!t && !k->rows) {
			dg[n_dg++] = (dense_grad){n, k->param + 1, raw ? raw : gv, 0, 0, 0};
			continue;
		}
		if (!t) {
			st = tern_node_errorf(n, TERN_EINTERNAL, "updates a table that was not found before");
			break;
		}
		t->update = n;
	}
	int n_buckets = 0;
	for (size_t i = 0; !st && i < n_tables; i++)
		if (!tables[i].update)
			st = tern_errorf(TERN_EINTERNAL, "%s: no update of '%s' in the step", m->source, tables[i].name);
	/* --local-aggregation: each rank's host's first rank (hosts are blocks of ranks from their first) */
	int64_t *leaders = NULL;
	if (!st && sharded && o->local_aggregation) {
		if (servers >= o->ranks)
			st = tern_errorf(TERN_EUSAGE, "--local-aggregation needs hosts of several ranks (--hosts): with one rank a "
			                              "host there is nothing to sum");
		else if (!(leaders = malloc((size_t)o->ranks * sizeof *leaders)))
			st = tern_errorf(TERN_EOS, "out of memory");
		for (int r = 0; !st && r < o->ranks; r++) {
			leaders[r] = server_rank[0];
			for (int h = 0; h < servers; h++)
				if (server_rank[h] <= r)
					leaders[r] = server_rank[h];
		}
	}
	if (!st && sharded)
		st = sparse_sharded(step->graph, tables, n_tables, o->ranks, leaders);
	free(leaders);
	for (size_t i = 0; !st && i < n_tables; i++) {
		table *t = &tables[i];
		if (sharded && t->kind->rows) {
			continue; /* done above */
		} else if (allgather) {
			st = sparse_allgather(step->graph, t, o->ranks);
		} else if (ps) {
			st = dense_ps(step->graph, t, t->parts, o->ranks);
		} else {
			tern_node *nu = NULL;
			st = sparse_densify(step->graph, t, &nu);
			if (!st)
				dg[n_dg++] = (dense_grad){nu, t->kind->param + 1, nu->inputs[t->kind->param + 1], 0, 0, 0};
		}
	}
	if (!st && n_dg)
		st = reduce_buckets(step->graph, dg, n_dg, cap, o->ranks, !o->no_overlap, &n_buckets);
	if (!st)
		st = tern_model_import_opset(step, "tern", 1);
	if (!st)
		st = tern_graph_stable_order(step->graph);
	if (!st)
		st = tern_model_set_training_step(m, step);

	/* the annotation */
	text a = {0};
	put(&a, "ranks %d\nstrategy %s\npartitions %d\nservers %d\nlocal_aggregation %d\nbuckets %d\noverlap %d\n", o->ranks,
	    strategy, sharded ? parts : 0, sharded ? servers : 0, o->local_aggregation, n_buckets, n_buckets && !o->no_overlap);
	for (int s = 0; sharded && server_rank && s < servers; s++)
		put(&a, "%s%d", s ? "," : "server_ranks ", server_rank[s]);
	if (sharded && server_rank)
		put(&a, "\n");
	for (size_t i = 0; i < n_tables; i++) {
		table *t = &tables[i];
		put(&a, "table %s kind=%s rows=%lld", t->name, t->kind->rows ? "sparse" : "dense", (long long)t->type.dims[0]);
		if (sharded) {
			put(&a, " shard=%s shard_rows=%lld", t->shard, (long long)t->shard_rows);
			put_ints(&a, "starts", t->starts, (size_t)t->parts + 1);
			put_ints(&a, "owners", t->owners, (size_t)t->parts);
			put_ints(&a, "offsets", t->offsets, (size_t)t->parts);
			for (int s = 0; s < t->n_state; s++)
				put(&a, " state=%s:%s", t->state[s], t->state_shard[s]);
		}
		put(&a, "\n");
	}
	if (!st && a.oom)
		st = tern_errorf(TERN_EOS, "out of memory");
	if (!st)
		st = tern_model_set_meta(m, TERN_PARTITION_KEY, a.s);
	/* a schedule of the step as it was names nodes it no longer has */
	if (!st)
		st = tern_model_set_meta(m, TERN_TRAINING_SCHEDULE_KEY, NULL);
	free(a.s);
	if (!st && summary) {
		summary->n_dense = n_dense;
		summary->n_sparse = 0;
		for (size_t i = 0; i < n_tables; i++)
			summary->n_sparse += tables[i].kind->rows;
		summary->n_buckets = n_buckets;
		summary->dense_elems = dense_elems;
		summary->sparse_elems = sparse_elems;
	}
	for (size_t i = 0; i < n_tables; i++)
		table_free(&tables[i]);
	free(tables);
	free(dg);
	free(server_rank);
	free(server_bytes);
	free(rank_rows);
	tern_model_free(step);
	return st ? tern_error_prefix(st, "partitioning") : TERN_OK;
}
