/* dot.c — a model as Graphviz DOT, built with cgraph: operators as boxes, values as edges labelled
 * with their type, subgraphs and functions as clusters. */
#include "internal.h"

#include <graphviz/cgraph.h>
#include <math.h>
#include <stdlib.h>

/* Labels longer than this many characters are cut (the tooltip keeps the whole name). */
#define LABEL_MAX_CHARS 48

/* A growable string for labels; `failed` records an allocation failure. */
struct text {
	char *s;
	size_t len, cap;
	bool failed;
};

static void text_add(struct text *t, const char *s, size_t n)
{
	if (t->failed || !tern_grow((void **)&t->s, &t->cap, t->len + n + 1, 1)) {
		t->failed = true;
		return;
	}
	memcpy(t->s + t->len, s, n);
	t->len += n;
	t->s[t->len] = '\0';
}

static void text_str(struct text *t, const char *s)
{
	text_add(t, s, strlen(s));
}

static void text_reset(struct text *t)
{
	t->len = 0;
	text_add(t, "", 0);
}

/* Length of the valid UTF-8 sequence at s (of at most n bytes), or 0 when it is not valid. */
static size_t utf8_length(const unsigned char *s, size_t n)
{
	size_t len = s[0] < 0x80               ? 1
	        : s[0] >= 0xc2 && s[0] <= 0xdf ? 2
	        : s[0] >= 0xe0 && s[0] <= 0xef ? 3
	        : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
	                                       : 0;
	if (len == 0 || len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	/* Overlong forms, surrogates and code points past U+10FFFF. */
	if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) || (s[0] == 0xf0 && s[1] < 0x90) ||
	    (s[0] == 0xf4 && s[1] >= 0x90))
		return 0;
	return len;
}

/* Appends a name as Graphviz label text: backslashes doubled (labels give `\N`, `\n` a meaning),
 * control characters and invalid UTF-8 shown as \xNN, cut after max_chars characters when max_chars
 * is not 0. cgraph itself quotes the result and escapes double quotes. */
static void text_escaped(struct text *t, const char *name, size_t max_chars)
{
	const unsigned char *s = (const unsigned char *)name;
	size_t n = strlen(name), chars = 0;
	for (size_t i = 0; i < n; chars++) {
		if (max_chars && chars == max_chars) {
			text_str(t, "\xe2\x80\xa6"); /* an ellipsis */
			return;
		}
		size_t len = utf8_length(s + i, n - i);
		if (len == 1 && s[i] == '\\') {
			text_str(t, "\\\\");
		} else if (len == 0 || s[i] < 0x20 || s[i] == 0x7f) {
			char hex[8];
			snprintf(hex, sizeof hex, "\\\\x%02x", s[i]);
			text_str(t, hex);
			len = 1;
		} else {
			text_add(t, name + i, len);
		}
		i += len;
	}
}

/* "float[N,3,224,224]"; "" when neither dtype nor shape is known. */
static void text_type(struct text *t, const tern_type *type)
{
	if (type->dtype == TERN_UNDEFINED && type->rank < 0)
		return;
	text_str(t, type->dtype == TERN_UNDEFINED ? "?" : tern_dtype_name(type->dtype));
	if (type->rank < 0)
		return;
	text_str(t, "[");
	for (int i = 0; i < type->rank && i < TERN_MAX_RANK; i++) {
		if (i)
			text_str(t, ",");
		if (type->dims[i] >= 0) {
			char num[24];
			snprintf(num, sizeof num, "%lld", (long long)type->dims[i]);
			text_str(t, num);
		} else if (type->dim_param[i] && type->dim_param[i][0]) {
			text_escaped(t, type->dim_param[i], LABEL_MAX_CHARS);
		} else {
			text_str(t, "?");
		}
	}
	text_str(t, "]");
}

/* The Agnodes of one graph, and those of the graphs around it, for edges that cross into clusters. */
struct scope {
	const tern_graph *graph;
	Agnode_t **nodes; /* by node index */
	Agnode_t **values; /* by value index: graph inputs, and initializers when drawn */
	const struct scope *parent;
};

/* A node that calls a model-local function: drawn as an edge into the function's cluster once every
 * function is drawn. */
struct call_edge {
	Agnode_t *from;
	const tern_graph *fn;
	bool recursive; /* the caller is in the function's own body: no clipping at the cluster */
};

struct dot {
	Agraph_t *root;
	const tern_model *model;
	const tern_dot_options *opts;
	unsigned next_id;
	struct text label, tooltip;
	struct call_edge *calls;
	size_t n_calls, cap_calls;
	Agraph_t **fn_cluster; /* by function index */
	bool failed;
};

static Agnode_t *new_node(struct dot *d, Agraph_t *g)
{
	char id[32];
	snprintf(id, sizeof id, "n%u", d->next_id++);
	return agnode(g, id, 1);
}

static Agraph_t *new_cluster(struct dot *d, Agraph_t *parent, const char *label)
{
	char id[32];
	snprintf(id, sizeof id, "cluster_%u", d->next_id++);
	Agraph_t *cluster = agsubg(parent, id, 1);
	agsafeset(cluster, "label", (char *)label, "");
	return cluster;
}

/* An input, output or initializer drawn as a node of its own: its name over its type. */
static Agnode_t *value_node(struct dot *d, Agraph_t *g, const tern_value *v, const char *shape, const char *fill)
{
	Agnode_t *n = new_node(d, g);
	text_reset(&d->label);
	text_escaped(&d->label, v->name, LABEL_MAX_CHARS);
	if (v->type.dtype != TERN_UNDEFINED || v->type.rank >= 0) {
		text_str(&d->label, "\\n");
		text_type(&d->label, &v->type);
	}
	text_reset(&d->tooltip);
	text_escaped(&d->tooltip, v->name, 0);
	if (d->label.failed || d->tooltip.failed)
		return n;
	agsafeset(n, "label", d->label.s, "");
	agsafeset(n, "tooltip", d->tooltip.s, "");
	agsafeset(n, "shape", (char *)shape, "");
	agsafeset(n, "fillcolor", (char *)fill, "");
	return n;
}

/* A colour per group number: hues a golden angle apart stay distinct however many groups there are. */
static void group_colour(int group, char *buf, size_t size)
{
	double hue = fmod(group * 0.618033988749895, 1.0);
	snprintf(buf, size, "%.3f 0.400 0.950", hue);
}

/* Roles in a partitioned training step (tern-partition): communication by kind, and the updates a
 * server applies to its shards. NULL for other nodes. */
static const char *role_colour(const tern_node *node)
{
	if (strcmp(node->domain, "tern") != 0)
		return NULL;
	if (!strncmp(node->op_type, "AllReduce", 9))
		return "#f6b26b"; /* dense: AllReduce, or its start and wait */
	if (!strcmp(node->op_type, "Pull") || !strcmp(node->op_type, "Push"))
		return "#6fa8dc"; /* sparse: to and from the servers */
	if (!strcmp(node->op_type, "AllGatherRows"))
		return "#e06666"; /* sparse: gathered by every rank */
	for (size_t i = 0; i < node->n_inputs; i++) {
		const char *name = node->inputs[i] ? node->inputs[i]->name : "";
		size_t len = strlen(name);
		if (len > 6 && !strcmp(name + len - 6, "/shard"))
			return "#93c47d"; /* a server's update of its shard */
	}
	return NULL;
}

static bool communicates(const tern_node *node)
{
	const char *c = role_colour(node);
	return c && strcmp(c, "#93c47d") != 0;
}

static Agnode_t *operator_node(struct dot *d, Agraph_t *g, const tern_node *node)
{
	Agnode_t *n = new_node(d, g);
	text_reset(&d->label);
	if (node->domain[0]) {
		text_escaped(&d->label, node->domain, LABEL_MAX_CHARS);
		text_str(&d->label, ".");
	}
	text_escaped(&d->label, node->op_type, LABEL_MAX_CHARS);
	text_reset(&d->tooltip);
	if (node->name[0]) {
		text_str(&d->label, "\\n");
		text_escaped(&d->label, node->name, LABEL_MAX_CHARS);
		text_escaped(&d->tooltip, node->name, 0);
	}
	if (d->label.failed || d->tooltip.failed)
		return n;
	agsafeset(n, "label", d->label.s, "");
	if (node->name[0])
		agsafeset(n, "tooltip", d->tooltip.s, "");
	int group = d->opts && d->opts->node_group ? d->opts->node_group(node, d->opts->user) : -1;
	if (group >= 0) {
		char colour[32];
		group_colour(group, colour, sizeof colour);
		agsafeset(n, "fillcolor", colour, "");
	}
	const char *role = role_colour(node);
	if (role) {
		agsafeset(n, "fillcolor", (char *)role, "");
		if (communicates(node))
			agsafeset(n, "shape", "cds", "");
	}
	return n;
}

/* The Agnode a value comes from: its producer, its input node, or the enclosing graph's value. */
static Agnode_t *source_of(const struct scope *s, const tern_value *v)
{
	if (v->producer)
		return v->producer->removed ? NULL : s->nodes[v->producer->index];
	if ((v->flags & TERN_VALUE_OUTER) && v->outer && s->parent)
		return source_of(s->parent, v->outer);
	return s->values[v->index];
}

static void value_edge(struct dot *d, Agnode_t *from, Agnode_t *to, const tern_value *v, bool outer)
{
	/* Edges live in the root graph: their ends may sit in different clusters. */
	Agedge_t *e = agedge(d->root, from, to, NULL, 1);
	text_reset(&d->label);
	text_type(&d->label, &v->type);
	text_reset(&d->tooltip);
	text_escaped(&d->tooltip, v->name, 0);
	if (d->label.failed || d->tooltip.failed)
		return;
	if (d->label.len)
		agsafeset(e, "label", d->label.s, "");
	agsafeset(e, "tooltip", d->tooltip.s, "");
	if (outer)
		agsafeset(e, "style", "dashed", "");
}

/* The name of the attribute of owner that holds graph g ("then_branch", "body"). */
static const char *subgraph_attr_name(const tern_node *owner, const tern_graph *g)
{
	for (size_t i = 0; i < owner->proto->n_attribute; i++) {
		const Onnx__AttributeProto *a = owner->proto->attribute[i];
		if (a->g && a->g == g->proto)
			return a->name;
		for (size_t j = 0; j < a->n_graphs; j++)
			if (a->graphs[j] == g->proto)
				return a->name;
	}
	return "graph";
}

static tern_status draw_graph(struct dot *d, Agraph_t *ag, const tern_graph *g, const struct scope *parent);

static tern_status draw_subgraphs(struct dot *d, Agraph_t *ag, const tern_node *node, const struct scope *scope)
{
	for (size_t k = 0; k < node->n_subgraphs; k++) {
		const tern_graph *sub = node->subgraphs[k];
		struct text title = {0};
		text_escaped(&title, subgraph_attr_name(node, sub), LABEL_MAX_CHARS);
		text_str(&title, " of ");
		text_escaped(&title, node->op_type, LABEL_MAX_CHARS);
		if (node->name[0]) {
			text_str(&title, " '");
			text_escaped(&title, node->name, LABEL_MAX_CHARS);
			text_str(&title, "'");
		}
		if (title.failed) {
			free(title.s);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		Agraph_t *cluster = new_cluster(d, ag, title.s);
		free(title.s);
		tern_status status = draw_graph(d, cluster, sub, scope);
		if (status != TERN_OK)
			return status;
		/* A dotted line from the node to the cluster (clipped at its border) ties a body to its owner. */
		Agnode_t *inside = agfstnode(cluster);
		if (inside) {
			Agedge_t *e = agedge(d->root, scope->nodes[node->index], inside, NULL, 1);
			agsafeset(e, "lhead", agnameof(cluster), "");
			agsafeset(e, "style", "dotted", "");
			agsafeset(e, "arrowhead", "none", "");
		}
	}
	return TERN_OK;
}

static tern_status draw_graph(struct dot *d, Agraph_t *ag, const tern_graph *g, const struct scope *parent)
{
	struct scope scope = {
	        .graph = g,
	        .nodes = calloc(g->n_nodes + 1, sizeof(Agnode_t *)),
	        .values = calloc(g->n_values + 1, sizeof(Agnode_t *)),
	        .parent = parent,
	};
	tern_status status = TERN_OK;
	if (!scope.nodes || !scope.values) {
		status = tern_errorf(TERN_EOS, "out of memory");
		goto done;
	}
	bool weights = d->opts && d->opts->show_weights;
	for (size_t i = 0; i < g->n_inputs; i++) {
		const tern_value *v = g->inputs[i];
		if (!(v->flags & TERN_VALUE_INITIALIZER))
			scope.values[v->index] = value_node(d, ag, v, "invhouse", "#cfe2f3");
	}
	for (size_t i = 0; weights && i < g->n_values; i++) {
		const tern_value *v = g->values[i];
		if (v->flags & TERN_VALUE_INITIALIZER) {
			Agnode_t *n = value_node(d, ag, v, "note", "#eeeeee");
			agsafeset(n, "fontsize", "9", "");
			scope.values[v->index] = n;
		}
	}
	for (size_t i = 0; i < g->n_nodes; i++)
		if (!g->nodes[i]->removed) {
			const tern_node *node = g->nodes[i];
			scope.nodes[i] = operator_node(d, ag, node);
			bool invoke = !strcmp(node->domain, "tern") && !strcmp(node->op_type, "Invoke");
			const tern_graph *fn =
			        invoke ? tern_function_find(d->model, tern_attr_string(node, "function_domain", ""),
			                                    tern_attr_string(node, "function", NULL))
			               : tern_function_find(d->model, node->domain, node->op_type);
			const tern_graph *top = g;
			while (top->parent)
				top = top->parent;
			if (fn && tern_grow((void **)&d->calls, &d->cap_calls, d->n_calls + 1, sizeof *d->calls))
				d->calls[d->n_calls++] = (struct call_edge){scope.nodes[i], fn, top == fn};
			else if (fn)
				d->failed = true;
		}
	for (size_t i = 0; i < g->n_nodes; i++) {
		const tern_node *node = g->nodes[i];
		if (node->removed)
			continue;
		for (size_t j = 0; j < node->n_inputs; j++) {
			const tern_value *v = node->inputs[j];
			Agnode_t *from = v ? source_of(&scope, v) : NULL;
			if (from)
				value_edge(d, from, scope.nodes[i], v, v->flags & TERN_VALUE_OUTER);
			/* what travels between ranks: bold, in the communication's colour */
			bool sent = communicates(node) || (v && v->producer && communicates(v->producer));
			Agedge_t *e = from && sent ? agedge(d->root, from, scope.nodes[i], NULL, 0) : NULL;
			if (e) {
				agsafeset(e, "penwidth", "2.5", "");
				agsafeset(e, "color", (char *)role_colour(communicates(node) ? node : v->producer), "");
			}
		}
	}
	for (size_t i = 0; i < g->n_outputs; i++) {
		const tern_value *v = g->outputs[i];
		Agnode_t *to = value_node(d, ag, v, "house", "#d9ead3");
		Agnode_t *from = source_of(&scope, v);
		if (from)
			value_edge(d, from, to, v, false);
	}
	/* Subgraph nodes read values of this graph (and of the graphs around it) by name: those edges
	 * enter the cluster, dashed. */
	for (size_t i = 0; i < g->n_nodes && status == TERN_OK; i++)
		if (!g->nodes[i]->removed)
			status = draw_subgraphs(d, ag, g->nodes[i], &scope);
	if (status == TERN_OK && (d->label.failed || d->tooltip.failed))
		status = tern_errorf(TERN_EOS, "out of memory");
done:
	free(scope.nodes);
	free(scope.values);
	return status;
}

static tern_status draw_function(struct dot *d, const tern_graph *fn)
{
	struct text title = {0};
	text_str(&title, "function ");
	if (fn->fproto->domain && fn->fproto->domain[0]) {
		text_escaped(&title, fn->fproto->domain, LABEL_MAX_CHARS);
		text_str(&title, ".");
	}
	text_escaped(&title, fn->name ? fn->name : "", LABEL_MAX_CHARS);
	if (title.failed) {
		free(title.s);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	Agraph_t *cluster = new_cluster(d, d->root, title.s);
	free(title.s);
	for (size_t i = 0; i < d->model->n_functions; i++)
		if (d->model->functions[i] == fn)
			d->fn_cluster[i] = cluster;
	return draw_graph(d, cluster, fn, NULL);
}

/* Calls: a bold edge from the calling node into the function's cluster. */
static void draw_calls(struct dot *d)
{
	for (size_t c = 0; c < d->n_calls; c++)
		for (size_t i = 0; i < d->model->n_functions; i++) {
			Agnode_t *inside = d->fn_cluster[i] ? agfstnode(d->fn_cluster[i]) : NULL;
			if (d->model->functions[i] != d->calls[c].fn || !inside)
				continue;
			Agedge_t *e = agedge(d->root, d->calls[c].from, inside, NULL, 1);
			if (!d->calls[c].recursive)
				agsafeset(e, "lhead", agnameof(d->fn_cluster[i]), "");
			agsafeset(e, "style", "bold", "");
			agsafeset(e, "color", "#674ea7", "");
			agsafeset(e, "label", "calls", "");
		}
}

tern_status tern_model_save_dot(tern_model *model, const tern_dot_options *opts, char **out, size_t *size)
{
	*out = NULL;
	*size = 0;
	Agraph_t *root = agopen("tern", Agdirected, NULL);
	if (!root)
		return tern_errorf(TERN_EOS, "%s: cannot create a Graphviz graph", model->source);
	agattr(root, AGRAPH, "fontname", "Helvetica");
	agattr(root, AGRAPH, "compound", "true");
	agattr(root, AGNODE, "shape", "box");
	agattr(root, AGNODE, "style", "rounded,filled");
	agattr(root, AGNODE, "fillcolor", "white");
	agattr(root, AGNODE, "fontname", "Helvetica");
	agattr(root, AGEDGE, "fontname", "Helvetica");
	agattr(root, AGEDGE, "fontsize", "9");

	struct dot d = {.root = root, .model = model, .opts = opts};
	d.fn_cluster = calloc(model->n_functions + 1, sizeof *d.fn_cluster);
	tern_status status = d.fn_cluster ? draw_graph(&d, root, model->graph, NULL)
	                                  : tern_errorf(TERN_EOS, "%s: out of memory", model->source);
	for (size_t i = 0; i < model->n_functions && status == TERN_OK; i++)
		status = draw_function(&d, model->functions[i]);
	if (status == TERN_OK && d.failed)
		status = tern_errorf(TERN_EOS, "%s: out of memory", model->source);
	if (status == TERN_OK)
		draw_calls(&d);
	free(d.calls);
	free(d.fn_cluster);
	free(d.label.s);
	free(d.tooltip.s);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = status == TERN_OK ? open_memstream(&buf, &len) : NULL;
	if (status == TERN_OK && !f)
		status = tern_errorf(TERN_EOS, "%s: out of memory writing DOT", model->source);
	if (f) {
		bool failed = agwrite(root, f) != 0;
		failed |= fclose(f) != 0;
		if (failed) {
			status = tern_errorf(TERN_EOS, "%s: out of memory writing DOT", model->source);
			free(buf);
			buf = NULL;
		}
	}
	agclose(root);
	if (status != TERN_OK)
		return status;
	*out = buf;
	*size = len;
	return TERN_OK;
}
