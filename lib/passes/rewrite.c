/* rewrite.c — graph edits for the passes, over lib/graph's editing API: each counts what it changes
 * and invalidates the analysis, and new nodes take the place of the ones they replace so that the
 * file keeps its order. */
#include "passes/passes.h"

#include <stdlib.h>

bool tern_pass_is(const tern_node *n, const char *op_type)
{
	return n && !n->removed && !*n->domain && strcmp(n->op_type, op_type) == 0;
}

tern_node *tern_pass_producer(const tern_value *v, const char *op_type)
{
	if (!v || !v->producer || v->producer->removed || (v->flags & TERN_VALUE_OUTER))
		return NULL;
	if (op_type && !tern_pass_is(v->producer, op_type))
		return NULL;
	return v->producer;
}

static bool reads_explicitly(const tern_node *n, const tern_value *v)
{
	for (size_t i = 0; i < n->n_inputs; i++)
		if (n->inputs[i] == v)
			return true;
	return false;
}

bool tern_pass_has_implicit_use(const tern_value *v)
{
	for (size_t i = 0; i < v->n_consumers; i++)
		if (!v->consumers[i]->removed && !reads_explicitly(v->consumers[i], v))
			return true;
	return false;
}

size_t tern_pass_uses(const tern_value *v)
{
	size_t n = (v->flags & TERN_VALUE_OUTPUT) ? 1 : 0;
	for (size_t i = 0; i < v->n_consumers; i++) {
		const tern_node *c = v->consumers[i];
		bool seen = false;
		for (size_t j = 0; j < i && !seen; j++)
			seen = v->consumers[j] == c;
		n += !c->removed && !seen;
	}
	return n;
}

bool tern_pass_single_use(const tern_value *v)
{
	return v && !(v->flags & TERN_VALUE_OUTPUT) && tern_pass_uses(v) == 1 && !tern_pass_has_implicit_use(v);
}

bool tern_pass_same_shape(const tern_tensor *a, const tern_tensor *b)
{
	return a && b && a->dtype == b->dtype && a->rank == b->rank &&
	        memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

tern_status tern_pass_each(tern_pass_ctx *c, const char *domain, const char *op_type,
                           tern_status (*fn)(tern_pass_ctx *c, tern_node *n))
{
	tern_graph *g = c->graph;
	tern_status st = TERN_OK;
	/* Nodes a rewrite adds take the place of removed ones or go to the end: the bound is re-read. */
	for (size_t i = 0; !st && i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		if (!n->removed && strcmp(n->domain, domain ? domain : "") == 0 && strcmp(n->op_type, op_type) == 0 &&
		    n->n_inputs && n->inputs[0] && n->n_outputs && n->outputs[0])
			st = fn(c, n);
	}
	return st;
}

tern_status tern_pass_each_sorted(tern_pass_ctx *c, bool backwards, tern_status (*fn)(tern_pass_ctx *c, tern_node *n))
{
	tern_node **order = NULL;
	size_t count = 0;
	tern_status st = tern_graph_toposort(c->graph, &order, &count);
	for (size_t i = 0; !st && i < count; i++) {
		tern_node *n = order[backwards ? count - 1 - i : i];
		if (!n->removed)
			st = fn(c, n);
	}
	free(order);
	return st;
}

static void changed(tern_pass_ctx *c)
{
	c->analyzed = false;
}

void tern_pass_remove(tern_pass_ctx *c, tern_node *n)
{
	if (n->removed)
		return;
	tern_graph_remove_node(c->graph, n);
	c->removed++;
	changed(c);
}

/* Appends every attribute of src to dst except those named in skip. */
static tern_status copy_attrs(tern_node *dst, const tern_node *src, const char *const *skip)
{
	Onnx__NodeProto *dp = dst->proto;
	const Onnx__NodeProto *sp = src->proto;
	for (size_t i = 0; i < sp->n_attribute; i++) {
		const Onnx__AttributeProto *a = sp->attribute[i];
		bool skipped = false;
		for (size_t k = 0; skip && skip[k] && !skipped; k++)
			skipped = a->name && strcmp(a->name, skip[k]) == 0;
		if (skipped)
			continue;
		/* A deep copy through the wire format, which protobuf-c can free like any unpacked message. */
		size_t size = onnx__attribute_proto__get_packed_size(a);
		uint8_t *buf = malloc(size ? size : 1);
		Onnx__AttributeProto **arr = realloc(dp->attribute, (dp->n_attribute + 1) * sizeof *arr);
		if (arr)
			dp->attribute = arr;
		if (!buf || !arr) {
			free(buf);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		onnx__attribute_proto__pack(a, buf);
		Onnx__AttributeProto *copy = onnx__attribute_proto__unpack(NULL, size, buf);
		free(buf);
		if (!copy)
			return tern_errorf(TERN_EOS, "out of memory");
		dp->attribute[dp->n_attribute++] = copy;
	}
	return TERN_OK;
}

tern_node *tern_pass_replace(tern_pass_ctx *c, tern_node *const *old, int n_old, const tern_pass_node *nw)
{
	tern_graph *g = c->graph;
	tern_node *at = NULL;
	for (int i = 0; i < n_old; i++) {
		if (!at || old[i]->index > at->index)
			at = old[i];
		tern_pass_remove(c, old[i]);
	}
	tern_node *n = tern_graph_add_node(g, nw->op_type, nw->domain, nw->name, nw->inputs, nw->n_inputs, nw->outputs,
	                                   nw->n_outputs);
	if (!n) {
		tern_errorf(TERN_EOS, "out of memory");
		return NULL;
	}
	c->added++;
	c->fused += n_old;
	changed(c);
	if (!nw->name || !*nw->name) {
		/* Unnamed as the nodes it replaces: an absent name rather than an empty one. */
		free(n->proto->name);
		n->proto->name = NULL;
		n->name = "";
	}
	if (at && (size_t)at->index < g->n_nodes && g->nodes[at->index] == at) {
		/* Swap places: the new node goes where `at` was, `at` (removed) to the end. */
		int slot = at->index;
		g->nodes[slot] = n;
		g->nodes[n->index] = at;
		at->index = n->index;
		n->index = slot;
	}
	if (nw->attrs_from && copy_attrs(n, nw->attrs_from, nw->skip))
		return NULL;
	return n;
}

/* Makes node n write v as output o (v had no producer). */
static void set_output(tern_node *n, size_t o, tern_value *v)
{
	char *name = tern_strdup(v->name);
	if (!name)
		return;
	if (n->proto->output[o] != protobuf_c_empty_string)
		free(n->proto->output[o]);
	n->proto->output[o] = name;
	n->outputs[o] = v;
	v->producer = n;
	v->producer_output = (int)o;
}

bool tern_pass_forward(tern_pass_ctx *c, tern_value *from, tern_value *to)
{
	if (from == to || tern_pass_has_implicit_use(from))
		return false;
	if (!(from->flags & TERN_VALUE_OUTPUT)) {
		tern_value_replace_uses(c->graph, from, to);
		changed(c);
		return true;
	}
	/* `from` names a graph output: `to`'s producer writes it instead, when `to` has no other use than
	 * the node that is about to go. */
	tern_node *p = tern_pass_producer(to, NULL);
	if (!p || p->graph != c->graph || (to->flags & (TERN_VALUE_OUTPUT | TERN_VALUE_INPUT | TERN_VALUE_INITIALIZER)))
		return false;
	tern_node *only = from->producer;
	for (size_t i = 0; i < to->n_consumers; i++)
		if (!to->consumers[i]->removed && to->consumers[i] != only)
			return false;
	set_output(p, (size_t)to->producer_output, from);
	to->producer = NULL;
	changed(c);
	return true;
}

tern_value *tern_pass_add_const(tern_pass_ctx *c, const char *stem, tern_tensor *t)
{
	char *name = tern_graph_unique_name(c->graph, stem);
	if (!name) {
		tern_errorf(TERN_EOS, "out of memory");
		return NULL;
	}
	tern_value *v = tern_graph_take_initializer(c->graph, name, t);
	free(name);
	if (!v)
		tern_errorf(TERN_EOS, "out of memory");
	changed(c);
	return v;
}

tern_value *tern_pass_add_ints(tern_pass_ctx *c, const char *stem, const int64_t *v, int n)
{
	tern_tensor t = {0};
	int64_t len = n;
	if (tern_tensor_alloc(&t, TERN_INT64, 1, &len))
		return NULL;
	if (n)
		memcpy(t.data, v, (size_t)n * sizeof *v);
	tern_value *out = tern_pass_add_const(c, stem, &t);
	tern_tensor_free(&t);
	return out;
}

void tern_pass_drop_if_unused(tern_pass_ctx *c, tern_value *v)
{
	if (v && (v->flags & TERN_VALUE_INITIALIZER) && !(v->flags & (TERN_VALUE_INPUT | TERN_VALUE_OUTPUT)) &&
	    !tern_pass_uses(v) && !tern_pass_has_implicit_use(v))
		tern_pass_drop_initializer(c, v);
}

void tern_pass_drop_initializer(tern_pass_ctx *c, tern_value *v)
{
	if (!(v->flags & TERN_VALUE_INITIALIZER) || (v->flags & TERN_VALUE_INPUT))
		return;
	tern_graph_drop_initializer(c->graph, v);
	if ((size_t)v->index < c->n_data && c->data[v->index]) {
		tern_tensor_free(c->data[v->index]);
		free(c->data[v->index]);
		c->data[v->index] = NULL;
	}
	changed(c);
}

tern_status tern_pass_add_attr_strings(tern_node *n, const char *name, const char *const *v, size_t count)
{
	Onnx__NodeProto *np = n->proto;
	Onnx__AttributeProto *a = calloc(1, sizeof *a);
	Onnx__AttributeProto **arr = realloc(np->attribute, (np->n_attribute + 1) * sizeof *arr);
	if (arr)
		np->attribute = arr;
	if (!a || !arr) {
		free(a);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	onnx__attribute_proto__init(a);
	np->attribute[np->n_attribute++] = a;
	a->has_type = 1;
	a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS;
	a->name = tern_strdup(name);
	a->strings = calloc(count ? count : 1, sizeof *a->strings);
	if (!a->name || !a->strings)
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < count; i++) {
		size_t len = strlen(v[i]);
		if (!(a->strings[i].data = malloc(len ? len : 1)))
			return tern_errorf(TERN_EOS, "out of memory");
		memcpy(a->strings[i].data, v[i], len);
		a->strings[i].len = len;
		a->n_strings++;
	}
	return TERN_OK;
}

tern_status tern_pass_import_tern(tern_pass_ctx *c)
{
	return tern_model_import_opset(c->model, TERN_DOMAIN, TERN_DOMAIN_VERSION);
}
