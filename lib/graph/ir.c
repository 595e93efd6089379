/* ir.c — the in-memory graph: values with producers and consumers built over the ONNX protos,
 * name lookup through nested scopes, topological order, and writing changes back to the protos. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void tern_model_free_ir(tern_model *m);

/* ---------------------------------------------------------------- names */

uint64_t tern_hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

uint64_t tern_hash_bytes(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, b + i, sizeof w);
		h = (h ^ w) * 0xff51afd7ed558ccdull;
		h ^= h >> 29;
	}
	uint64_t w = (uint64_t)(n - i) << 56; /* the tail's length, so "a" and "a\0" differ */
	for (size_t k = 0; i + k < n; k++)
		w |= (uint64_t)b[i + k] << (8 * k);
	h = (h ^ w) * 0x100000001b3ull;
	return h ^ (h >> 32);
}

static bool table_insert(tern_graph *g, tern_value *v)
{
	if ((g->n_values + 1) * 2 > g->table_cap) {
		size_t ncap = g->table_cap ? g->table_cap * 2 : 64;
		tern_value **nt = calloc(ncap, sizeof *nt);
		if (!nt)
			return false;
		for (size_t i = 0; i < g->table_cap; i++) {
			tern_value *x = g->table[i];
			if (!x)
				continue;
			size_t j = tern_hash_name(x->name) & (ncap - 1);
			while (nt[j])
				j = (j + 1) & (ncap - 1);
			nt[j] = x;
		}
		free(g->table);
		g->table = nt;
		g->table_cap = ncap;
	}
	size_t j = tern_hash_name(v->name) & (g->table_cap - 1);
	while (g->table[j])
		j = (j + 1) & (g->table_cap - 1);
	g->table[j] = v;
	return true;
}

tern_value *tern_graph_find(const tern_graph *g, const char *name)
{
	if (!g->table_cap)
		return NULL;
	size_t j = tern_hash_name(name) & (g->table_cap - 1);
	while (g->table[j]) {
		if (strcmp(g->table[j]->name, name) == 0)
			return g->table[j];
		j = (j + 1) & (g->table_cap - 1);
	}
	return NULL;
}

tern_value *tern_graph_lookup(const tern_graph *g, const char *name)
{
	for (; g; g = g->parent) {
		tern_value *v = tern_graph_find(g, name);
		if (v)
			return v;
	}
	return NULL;
}

tern_value *tern_graph_value(tern_graph *g, const char *name)
{
	tern_value *v = tern_graph_find(g, name);
	if (v)
		return v;
	v = calloc(1, sizeof *v);
	if (!v)
		return NULL;
	v->name = tern_strdup(name);
	if (!v->name || !tern_grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof *g->values) ||
	    !table_insert(g, v)) {
		free(v->name);
		free(v);
		return NULL;
	}
	tern_type_unknown(&v->type);
	v->index = (int)g->n_values;
	g->values[g->n_values++] = v;
	return v;
}

char *tern_graph_unique_name(tern_graph *g, const char *stem)
{
	size_t len = strlen(stem) + 24;
	char *name = malloc(len);
	if (!name)
		return NULL;
	snprintf(name, len, "%s", stem);
	for (int i = 1; tern_graph_lookup(g, name); i++)
		snprintf(name, len, "%s_%d", stem, i);
	return name;
}

/* ---------------------------------------------------------------- types */

void tern_type_unknown(tern_type *t)
{
	memset(t, 0, sizeof *t);
	t->rank = -1;
}

void tern_type_from_proto(const Onnx__TypeProto *tp, tern_type *out)
{
	tern_type_unknown(out);
	if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
		return;
	const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
	out->dtype = tt->has_elem_type ? tt->elem_type : 0;
	if (!tt->shape)
		return;
	if (tt->shape->n_dim > TERN_MAX_RANK) {
		out->rank = (int)tt->shape->n_dim; /* validation reports it */
		return;
	}
	out->rank = (int)tt->shape->n_dim;
	for (size_t i = 0; i < tt->shape->n_dim; i++) {
		const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
		out->dims[i] = -1;
		if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
			out->dims[i] = d->dim_value;
		else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
			out->dim_param[i] = d->dim_param;
	}
}

/* ---------------------------------------------------------------- messages */

const char *tern_node_desc(const tern_node *node, char *buf, size_t size)
{
	if (node->name && *node->name)
		snprintf(buf, size, "node '%s' (%s)", node->name, node->op_type);
	else
		snprintf(buf, size, "node #%d (%s)", node->index, node->op_type);
	return buf;
}

tern_status tern_node_errorf(const tern_node *node, tern_status status, const char *fmt, ...)
{
	char what[768], desc[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	const tern_model *m = node->graph ? node->graph->model : NULL;
	tern_node_desc(node, desc, sizeof desc);
	if (m)
		return tern_errorf(status, "%s: %s: %s", m->source, desc, what);
	return tern_errorf(status, "%s: %s", desc, what);
}

/* ---------------------------------------------------------------- building */

static tern_status oom(const tern_model *m)
{
	return tern_errorf(TERN_EOS, "%s: out of memory", m->source);
}

static bool add_consumer(tern_value *v, tern_node *n)
{
	if (!tern_grow((void **)&v->consumers, &v->cap_consumers, v->n_consumers + 1, sizeof *v->consumers))
		return false;
	v->consumers[v->n_consumers++] = n;
	return true;
}

static tern_status build_graph(tern_model *m, tern_graph *g);

static tern_graph *graph_new(tern_model *m, enum tern_graph_kind kind, tern_graph *parent, tern_node *owner)
{
	tern_graph *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->kind = kind;
	g->model = m;
	g->parent = parent;
	g->owner = owner;
	return g;
}

/* Records that a subgraph of `owner` reads value v defined outside the subgraph: the owner node (and
 * the owners further up, until the graph that defines v) depends on it. */
static bool note_outer_use(tern_graph *sub, tern_value *v)
{
	for (tern_graph *g = sub; g->parent; g = g->parent) {
		tern_node *owner = g->owner;
		bool known = false;
		for (size_t i = 0; i < owner->n_implicit && !known; i++)
			known = owner->implicit[i] == v;
		bool defined_here = tern_graph_find(g->parent, v->name) == v;
		if (!known) {
			if (!tern_grow((void **)&owner->implicit, &owner->cap_implicit, owner->n_implicit + 1,
			               sizeof *owner->implicit))
				return false;
			owner->implicit[owner->n_implicit++] = v;
			if (defined_here && !add_consumer(v, owner))
				return false;
		}
		if (defined_here)
			break;
	}
	return true;
}

static tern_status build_subgraphs(tern_model *m, tern_graph *g, tern_node *n)
{
	Onnx__NodeProto *np = n->proto;
	size_t count = 0;
	for (size_t a = 0; a < np->n_attribute; a++) {
		const Onnx__AttributeProto *at = np->attribute[a];
		count += at->g ? 1 : 0;
		count += at->n_graphs;
	}
	if (!count)
		return TERN_OK;
	n->subgraphs = calloc(count, sizeof *n->subgraphs);
	if (!n->subgraphs)
		return oom(m);
	for (size_t a = 0; a < np->n_attribute; a++) {
		Onnx__AttributeProto *at = np->attribute[a];
		for (size_t k = 0; k < (at->g ? 1 : 0) + at->n_graphs; k++) {
			Onnx__GraphProto *gp = at->g && k == 0 ? at->g : at->graphs[k - (at->g ? 1 : 0)];
			tern_graph *sub = graph_new(m, TERN_GRAPH_SUBGRAPH, g, n);
			if (!sub)
				return oom(m);
			sub->proto = gp;
			sub->name = gp->name ? gp->name : at->name;
			n->subgraphs[n->n_subgraphs++] = sub;
			tern_status st = build_graph(m, sub);
			if (st)
				return st;
		}
	}
	return TERN_OK;
}

/* Node inputs resolve in this graph, then enclosing ones; an unknown name becomes a value with no
 * producer that validation reports. */
static tern_status resolve_input(tern_model *m, tern_graph *g, const char *name, tern_value **out)
{
	tern_value *v = tern_graph_find(g, name);
	if (!v) {
		tern_value *outer = g->parent ? tern_graph_lookup(g->parent, name) : NULL;
		v = tern_graph_value(g, name);
		if (!v)
			return oom(m);
		if (outer) {
			v->flags |= TERN_VALUE_OUTER;
			v->outer = outer;
			v->type = outer->type;
			if (!note_outer_use(g, outer))
				return oom(m);
		}
	}
	*out = v;
	return TERN_OK;
}

static tern_status add_node_ir(tern_model *m, tern_graph *g, Onnx__NodeProto *np, tern_node **out)
{
	tern_node *n = calloc(1, sizeof *n);
	if (!n || !tern_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) {
		free(n);
		return oom(m);
	}
	n->proto = np;
	n->graph = g;
	n->name = np->name ? np->name : "";
	n->op_type = np->op_type ? np->op_type : "";
	n->domain = np->domain && strcmp(np->domain, "ai.onnx") != 0 ? np->domain : "";
	n->opset = tern_model_opset(m, n->domain);
	n->index = (int)g->n_nodes;
	g->nodes[g->n_nodes++] = n;
	n->inputs = calloc(np->n_input ? np->n_input : 1, sizeof *n->inputs);
	n->outputs = calloc(np->n_output ? np->n_output : 1, sizeof *n->outputs);
	if (!n->inputs || !n->outputs)
		return oom(m);
	n->n_inputs = np->n_input;
	n->n_outputs = np->n_output;
	*out = n;
	return TERN_OK;
}

static tern_status declare_outputs(tern_model *m, tern_graph *g, tern_node *n)
{
	Onnx__NodeProto *np = n->proto;
	for (size_t o = 0; o < np->n_output; o++) {
		if (!np->output[o] || !*np->output[o])
			continue;
		tern_value *v = tern_graph_value(g, np->output[o]);
		if (!v)
			return oom(m);
		if (v->producer || (v->flags & (TERN_VALUE_INPUT | TERN_VALUE_INITIALIZER))) {
			char desc[256];
			tern_node_desc(n, desc, sizeof desc);
			return tern_errorf(TERN_EDATA, "%s: %s: output '%s' is already defined %s", m->source, desc,
			                   v->name,
			                   v->producer ? "by another node" : "as a graph input or initializer");
		}
		v->producer = n;
		v->producer_output = (int)o;
		n->outputs[o] = v;
	}
	return TERN_OK;
}

static tern_status resolve_inputs(tern_model *m, tern_graph *g, tern_node *n)
{
	Onnx__NodeProto *np = n->proto;
	for (size_t i = 0; i < np->n_input; i++) {
		if (!np->input[i] || !*np->input[i])
			continue;
		tern_status st = resolve_input(m, g, np->input[i], &n->inputs[i]);
		if (st)
			return st;
		if (!add_consumer(n->inputs[i], n))
			return oom(m);
	}
	return TERN_OK;
}

static tern_status list_values(tern_model *m, tern_graph *g, Onnx__ValueInfoProto **infos, size_t n, unsigned flag,
                               tern_value ***list, size_t *count)
{
	*list = calloc(n ? n : 1, sizeof **list);
	if (!*list)
		return oom(m);
	for (size_t i = 0; i < n; i++) {
		const char *name = infos[i]->name ? infos[i]->name : "";
		tern_value *v = flag == TERN_VALUE_OUTPUT ? NULL : tern_graph_find(g, name);
		if (!v) {
			if (flag == TERN_VALUE_OUTPUT) {
				tern_status st = resolve_input(m, g, name, &v);
				if (st)
					return st;
			} else if (!(v = tern_graph_value(g, name))) {
				return oom(m);
			}
		}
		v->flags |= flag;
		if (infos[i]->type)
			tern_type_from_proto(infos[i]->type, &v->type);
		(*list)[(*count)++] = v;
	}
	return TERN_OK;
}

static void type_from_initializer(tern_value *v, const Onnx__TensorProto *t)
{
	tern_type_unknown(&v->type);
	v->type.dtype = t->has_data_type ? t->data_type : 0;
	if (t->n_dims <= TERN_MAX_RANK) {
		v->type.rank = (int)t->n_dims;
		for (size_t d = 0; d < t->n_dims; d++)
			v->type.dims[d] = t->dims[d];
	}
}

static tern_status build_graph(tern_model *m, tern_graph *g)
{
	Onnx__GraphProto *gp = g->proto;
	tern_status st;
	/* Initializers first: a graph input with the same name is an input with a default value. */
	for (size_t i = 0; i < gp->n_initializer; i++) {
		Onnx__TensorProto *t = gp->initializer[i];
		const char *name = t->name ? t->name : "";
		tern_value *v = tern_graph_find(g, name);
		if (v)
			return tern_errorf(TERN_EDATA, "%s: initializer '%s' is defined twice", m->source, name);
		if (!(v = tern_graph_value(g, name)))
			return oom(m);
		v->flags |= TERN_VALUE_INITIALIZER;
		v->initializer = t;
		type_from_initializer(v, t);
	}
	if ((st = list_values(m, g, gp->input, gp->n_input, TERN_VALUE_INPUT, &g->inputs, &g->n_inputs)))
		return st;
	for (size_t i = 0; i < g->n_inputs; i++)
		for (size_t j = 0; j < i; j++)
			if (g->inputs[i] == g->inputs[j])
				return tern_errorf(TERN_EDATA, "%s: graph input '%s' is listed twice", m->source,
				                   g->inputs[i]->name);
	/* Initializer types win over declared input types: the data is what runs. */
	for (size_t i = 0; i < g->n_inputs; i++)
		if (g->inputs[i]->initializer)
			type_from_initializer(g->inputs[i], g->inputs[i]->initializer);
	for (size_t i = 0; i < gp->n_node; i++) {
		tern_node *n;
		if ((st = add_node_ir(m, g, gp->node[i], &n)) || (st = declare_outputs(m, g, n)))
			return st;
	}
	for (size_t i = 0; i < gp->n_value_info; i++) {
		const Onnx__ValueInfoProto *vi = gp->value_info[i];
		tern_value *v = vi->name ? tern_graph_find(g, vi->name) : NULL;
		if (v && vi->type && !(v->flags & (TERN_VALUE_INPUT | TERN_VALUE_INITIALIZER)))
			tern_type_from_proto(vi->type, &v->type);
	}
	for (size_t i = 0; i < g->n_nodes; i++)
		if ((st = resolve_inputs(m, g, g->nodes[i])) || (st = build_subgraphs(m, g, g->nodes[i])))
			return st;
	if ((st = list_values(m, g, gp->output, gp->n_output, TERN_VALUE_OUTPUT, &g->outputs, &g->n_outputs)))
		return st;
	return TERN_OK;
}

static tern_status build_function(tern_model *m, tern_graph *g)
{
	Onnx__FunctionProto *fp = g->fproto;
	tern_status st;
	g->inputs = calloc(fp->n_input ? fp->n_input : 1, sizeof *g->inputs);
	g->outputs = calloc(fp->n_output ? fp->n_output : 1, sizeof *g->outputs);
	if (!g->inputs || !g->outputs)
		return oom(m);
	for (size_t i = 0; i < fp->n_input; i++) {
		tern_value *v = tern_graph_value(g, fp->input[i] ? fp->input[i] : "");
		if (!v)
			return oom(m);
		v->flags |= TERN_VALUE_INPUT;
		g->inputs[g->n_inputs++] = v;
	}
	for (size_t i = 0; i < fp->n_node; i++) {
		tern_node *n;
		if ((st = add_node_ir(m, g, fp->node[i], &n)) || (st = declare_outputs(m, g, n)))
			return st;
		/* Nodes in a function use the function's own opset imports. */
		for (size_t k = 0; k < fp->n_opset_import; k++) {
			const Onnx__OperatorSetIdProto *o = fp->opset_import[k];
			const char *d = o->domain && strcmp(o->domain, "ai.onnx") != 0 ? o->domain : "";
			if (strcmp(d, n->domain) == 0)
				n->opset = o->has_version ? o->version : 1;
		}
	}
	for (size_t i = 0; i < g->n_nodes; i++)
		if ((st = resolve_inputs(m, g, g->nodes[i])) || (st = build_subgraphs(m, g, g->nodes[i])))
			return st;
	for (size_t i = 0; i < fp->n_output; i++) {
		tern_value *v;
		if ((st = resolve_input(m, g, fp->output[i] ? fp->output[i] : "", &v)))
			return st;
		v->flags |= TERN_VALUE_OUTPUT;
		g->outputs[g->n_outputs++] = v;
	}
	return TERN_OK;
}

tern_status tern_model_build_ir(tern_model *m)
{
	tern_model_free_ir(m);
	m->ir_complete = 0;
	m->graph = graph_new(m, TERN_GRAPH_MAIN, NULL, NULL);
	if (!m->graph)
		return oom(m);
	m->graph->proto = m->proto->graph;
	m->graph->name = m->proto->graph->name ? m->proto->graph->name : "";
	tern_status st = build_graph(m, m->graph);
	if (st)
		return st;
	if (m->proto->n_functions) {
		m->functions = calloc(m->proto->n_functions, sizeof *m->functions);
		if (!m->functions)
			return oom(m);
	}
	for (size_t i = 0; i < m->proto->n_functions; i++) {
		tern_graph *f = graph_new(m, TERN_GRAPH_FUNCTION, NULL, NULL);
		if (!f)
			return oom(m);
		f->fproto = m->proto->functions[i];
		f->name = f->fproto->name ? f->fproto->name : "";
		m->functions[m->n_functions++] = f;
		if ((st = build_function(m, f)))
			return st;
	}
	m->ir_complete = 1;
	return TERN_OK;
}

tern_status tern_model_add_function(tern_model *m, Onnx__FunctionProto *fp)
{
	Onnx__FunctionProto **fps = realloc(m->proto->functions, (m->proto->n_functions + 1) * sizeof *fps);
	if (!fps)
		return oom(m);
	m->proto->functions = fps;
	fps[m->proto->n_functions++] = fp;
	tern_graph **gs = realloc(m->functions, (m->n_functions + 1) * sizeof *gs);
	if (!gs)
		return oom(m);
	m->functions = gs;
	tern_graph *f = graph_new(m, TERN_GRAPH_FUNCTION, NULL, NULL);
	if (!f)
		return oom(m);
	f->fproto = fp;
	f->name = fp->name ? fp->name : "";
	m->functions[m->n_functions++] = f;
	return build_function(m, f);
}

/* ---------------------------------------------------------------- order */

tern_status tern_graph_toposort(tern_graph *g, tern_node ***out, size_t *count)
{
	size_t n = g->n_nodes;
	tern_node **order = malloc((n ? n : 1) * sizeof *order);
	int *pending = calloc(n ? n : 1, sizeof *pending);
	if (!order || !pending) {
		free(order);
		free(pending);
		return oom(g->model);
	}
	/* pending[i] = number of inputs (explicit and implicit) produced by live nodes of this graph. */
	size_t live = 0;
	for (size_t i = 0; i < n; i++) {
		tern_node *nd = g->nodes[i];
		/* written only when it changes: plans of one function made on several threads at once (the
		 * frames of a recursion's calls) sort the same graph */
		if (nd->index != (int)i)
			nd->index = (int)i;
		if (nd->removed)
			continue;
		live++;
		for (size_t k = 0; k < nd->n_inputs + nd->n_implicit; k++) {
			tern_value *v = k < nd->n_inputs ? nd->inputs[k] : nd->implicit[k - nd->n_inputs];
			if (v && v->producer && v->producer->graph == g && !v->producer->removed)
				pending[i]++;
		}
	}
	/* Kahn's algorithm taking the earliest ready node (a min-heap of positions): where the file order
	 * already is a topological order it is kept, so ordering twice changes nothing. */
	size_t *heap = malloc((n ? n : 1) * sizeof *heap);
	if (!heap) {
		free(order);
		free(pending);
		return oom(g->model);
	}
	size_t hn = 0, tail = 0;
	for (size_t i = 0; i < n; i++)
		if (!g->nodes[i]->removed && pending[i] == 0)
			heap[hn++] = i; /* pushed in increasing order: already a heap */
	while (hn) {
		tern_node *nd = g->nodes[heap[0]];
		heap[0] = heap[--hn];
		for (size_t k = 0;;) {
			size_t l = 2 * k + 1, r = l + 1, m = k;
			if (l < hn && heap[l] < heap[m])
				m = l;
			if (r < hn && heap[r] < heap[m])
				m = r;
			if (m == k)
				break;
			size_t t = heap[k];
			heap[k] = heap[m];
			heap[m] = t;
			k = m;
		}
		order[tail++] = nd;
		for (size_t o = 0; o < nd->n_outputs; o++) {
			tern_value *v = nd->outputs[o];
			if (!v)
				continue;
			for (size_t c = 0; c < v->n_consumers; c++) {
				tern_node *cn = v->consumers[c];
				/* A node reading the same value twice was counted twice. */
				if (cn->graph != g || cn->removed || --pending[cn->index])
					continue;
				size_t k = hn++;
				heap[k] = (size_t)cn->index;
				while (k && heap[(k - 1) / 2] > heap[k]) {
					size_t t = heap[k];
					heap[k] = heap[(k - 1) / 2];
					heap[(k - 1) / 2] = t;
					k = (k - 1) / 2;
				}
			}
		}
	}
	free(heap);
	free(pending);
	if (tail != live) {
		tern_node *stuck = NULL;
		for (size_t i = 0; i < n && !stuck; i++) {
			bool placed = false;
			for (size_t k = 0; k < tail && !placed; k++)
				placed = order[k] == g->nodes[i];
			if (!placed && !g->nodes[i]->removed)
				stuck = g->nodes[i];
		}
		free(order);
		return tern_node_errorf(stuck, TERN_EDATA, "the graph has a cycle through this node");
	}
	*out = order;
	*count = tail;
	return TERN_OK;
}

/* ---------------------------------------------------------------- writing back */

static tern_status sync_graph(tern_model *m, tern_graph *g)
{
	if (g->kind == TERN_GRAPH_MAIN || g->kind == TERN_GRAPH_SUBGRAPH) {
		size_t live = 0;
		for (size_t i = 0; i < g->n_nodes; i++)
			live += !g->nodes[i]->removed;
		Onnx__NodeProto **arr = malloc((live ? live : 1) * sizeof *arr);
		if (!arr)
			return oom(m);
		size_t k = 0, kept = 0;
		for (size_t i = 0; i < g->n_nodes; i++) {
			tern_node *n = g->nodes[i];
			if (n->removed) {
				onnx__node_proto__free_unpacked(n->proto, &tern_pb_allocator);
				for (size_t s = 0; s < n->n_subgraphs; s++) {
					tern_graph_free_ir(n->subgraphs[s]); /* its proto goes with the node's */
					n->subgraphs[s] = NULL;
				}
				free(n->subgraphs);
				free(n->inputs);
				free(n->outputs);
				free(n->implicit);
				free(n);
				continue;
			}
			arr[k++] = n->proto;
			n->index = (int)kept;
			g->nodes[kept++] = n;
		}
		g->n_nodes = kept;
		free(g->proto->node);
		g->proto->node = arr;
		g->proto->n_node = k;
	}
	for (size_t i = 0; i < g->n_nodes; i++)
		for (size_t s = 0; s < g->nodes[i]->n_subgraphs; s++) {
			tern_status st = sync_graph(m, g->nodes[i]->subgraphs[s]);
			if (st)
				return st;
		}
	return TERN_OK;
}

tern_status tern_model_sync(tern_model *m)
{
	return m->graph ? sync_graph(m, m->graph) : TERN_OK;
}
