/* edit.c — changing a graph: the operations passes use. Each keeps the IR (producers, consumers)
 * and the protos consistent, so that saving after any sequence of edits writes a valid model. */
#include "internal.h"

#include <stdlib.h>

static void drop_consumer(tern_value *v, tern_node *n)
{
	for (size_t i = 0; i < v->n_consumers; i++)
		if (v->consumers[i] == n) {
			memmove(&v->consumers[i], &v->consumers[i + 1],
			        (v->n_consumers - i - 1) * sizeof *v->consumers);
			v->n_consumers--;
			return;
		}
}

static bool add_consumer(tern_value *v, tern_node *n)
{
	if (!tern_grow((void **)&v->consumers, &v->cap_consumers, v->n_consumers + 1, sizeof *v->consumers))
		return false;
	v->consumers[v->n_consumers++] = n;
	return true;
}

static char **copy_names(const char *const *names, size_t n)
{
	char **out = calloc(n ? n : 1, sizeof *out);
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!(out[i] = tern_strdup(names[i] ? names[i] : ""))) {
			while (i--)
				free(out[i]);
			free(out);
			return NULL;
		}
	return out;
}

tern_node *tern_graph_add_node(tern_graph *g, const char *op_type, const char *domain, const char *name,
                               const char *const *inputs, size_t n_inputs, const char *const *outputs, size_t n_outputs)
{
	Onnx__NodeProto *np = malloc(sizeof *np);
	tern_node *n = calloc(1, sizeof *n);
	if (!np || !n || !tern_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes))
		goto fail;
	onnx__node_proto__init(np);
	np->op_type = tern_strdup(op_type);
	np->domain = tern_strdup(domain ? domain : "");
	np->name = tern_strdup(name ? name : "");
	np->input = copy_names(inputs, n_inputs);
	np->output = copy_names(outputs, n_outputs);
	n->inputs = calloc(n_inputs ? n_inputs : 1, sizeof *n->inputs);
	n->outputs = calloc(n_outputs ? n_outputs : 1, sizeof *n->outputs);
	if (!np->op_type || !np->domain || !np->name || !np->input || !np->output || !n->inputs || !n->outputs)
		goto fail;
	np->n_input = n_inputs;
	np->n_output = n_outputs;
	n->proto = np;
	n->graph = g;
	n->name = np->name;
	n->op_type = np->op_type;
	n->domain = np->domain;
	n->opset = tern_model_opset(g->model, n->domain);
	n->n_inputs = n_inputs;
	n->n_outputs = n_outputs;
	for (size_t i = 0; i < n_inputs; i++) {
		if (!inputs[i] || !*inputs[i])
			continue;
		tern_value *v = tern_graph_lookup(g, inputs[i]);
		if (!v)
			v = tern_graph_value(g, inputs[i]);
		if (!v || !add_consumer(v, n))
			goto fail_linked;
		n->inputs[i] = v;
	}
	for (size_t o = 0; o < n_outputs; o++) {
		if (!outputs[o] || !*outputs[o])
			continue;
		tern_value *v = tern_graph_value(g, outputs[o]);
		if (!v)
			goto fail_linked;
		v->producer = n;
		v->producer_output = (int)o;
		n->outputs[o] = v;
	}
	n->index = (int)g->n_nodes;
	g->nodes[g->n_nodes++] = n;
	return n;
fail_linked:
	for (size_t i = 0; i < n_inputs; i++)
		if (n->inputs[i])
			drop_consumer(n->inputs[i], n);
fail:
	if (np)
		onnx__node_proto__free_unpacked(np, &tern_pb_allocator);
	if (n) {
		free(n->inputs);
		free(n->outputs);
	}
	free(n);
	return NULL;
}

void tern_graph_move_node(tern_graph *g, tern_node *node, size_t at)
{
	size_t from = 0;
	while (from < g->n_nodes && g->nodes[from] != node)
		from++;
	if (from == g->n_nodes)
		return;
	if (at >= g->n_nodes)
		at = g->n_nodes - 1;
	if (at < from)
		memmove(&g->nodes[at + 1], &g->nodes[at], (from - at) * sizeof *g->nodes);
	else
		memmove(&g->nodes[from], &g->nodes[from + 1], (at - from) * sizeof *g->nodes);
	g->nodes[at] = node;
	for (size_t i = 0; i < g->n_nodes; i++)
		g->nodes[i]->index = (int)i;
}

void tern_graph_remove_node(tern_graph *g, tern_node *node)
{
	(void)g;
	for (size_t i = 0; i < node->n_inputs; i++)
		if (node->inputs[i])
			drop_consumer(node->inputs[i], node);
	for (size_t i = 0; i < node->n_implicit; i++)
		drop_consumer(node->implicit[i], node);
	for (size_t o = 0; o < node->n_outputs; o++)
		if (node->outputs[o] && node->outputs[o]->producer == node)
			node->outputs[o]->producer = NULL;
	node->removed = 1;
}

void tern_node_set_input(tern_node *node, size_t i, tern_value *v)
{
	if (i >= node->n_inputs)
		return;
	if (node->inputs[i])
		drop_consumer(node->inputs[i], node);
	node->inputs[i] = v;
	char *name = tern_strdup(v ? v->name : "");
	if (name) {
		if (node->proto->input[i] != protobuf_c_empty_string)
			free(node->proto->input[i]);
		node->proto->input[i] = name;
	}
	if (v)
		add_consumer(v, node);
}

void tern_value_replace_uses(tern_graph *g, tern_value *old_value, tern_value *new_value)
{
	while (old_value->n_consumers) {
		tern_node *n = old_value->consumers[0];
		bool changed = false;
		for (size_t i = 0; i < n->n_inputs; i++)
			if (n->inputs[i] == old_value) {
				tern_node_set_input(n, i, new_value);
				changed = true;
			}
		if (!changed)
			drop_consumer(old_value, n); /* an implicit (subgraph) use: not rewritten here */
	}
	for (size_t i = 0; i < g->n_outputs; i++)
		if (g->outputs[i] == old_value) {
			g->outputs[i] = new_value;
			new_value->flags |= TERN_VALUE_OUTPUT;
			Onnx__ValueInfoProto *vi = g->proto ? g->proto->output[i] : NULL;
			char *name = tern_strdup(new_value->name);
			if (vi && name) {
				if (vi->name != protobuf_c_empty_string)
					free(vi->name);
				vi->name = name;
			} else {
				free(name);
			}
		}
}

Onnx__AttributeProto *tern_proto_new_attr(Onnx__NodeProto *np, const char *name, Onnx__AttributeProto__AttributeType type)
{
	Onnx__AttributeProto *a = malloc(sizeof *a);
	Onnx__AttributeProto **arr = realloc(np->attribute, (np->n_attribute + 1) * sizeof *arr);
	if (arr)
		np->attribute = arr;
	if (!a || !arr) {
		free(a);
		return NULL;
	}
	onnx__attribute_proto__init(a);
	if (!(a->name = tern_strdup(name))) {
		free(a);
		return NULL;
	}
	a->has_type = 1;
	a->type = type;
	np->attribute[np->n_attribute++] = a;
	return a;
}

static Onnx__AttributeProto *new_attr(tern_node *node, const char *name, Onnx__AttributeProto__AttributeType type)
{
	return tern_proto_new_attr(node->proto, name, type);
}

tern_status tern_node_add_attr_int(tern_node *node, const char *name, int64_t v)
{
	return tern_proto_add_attr_int(node->proto, name, v);
}

tern_status tern_proto_add_attr_int(Onnx__NodeProto *np, const char *name, int64_t v)
{
	Onnx__AttributeProto *a = tern_proto_new_attr(np, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
	if (!a)
		return tern_errorf(TERN_EOS, "out of memory");
	a->has_i = 1;
	a->i = v;
	return TERN_OK;
}

tern_status tern_node_add_attr_float(tern_node *node, const char *name, float v)
{
	Onnx__AttributeProto *a = new_attr(node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
	if (!a)
		return tern_errorf(TERN_EOS, "out of memory");
	a->has_f = 1;
	a->f = v;
	return TERN_OK;
}

tern_status tern_node_add_attr_ints(tern_node *node, const char *name, const int64_t *v, size_t n)
{
	Onnx__AttributeProto *a = new_attr(node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
	if (!a || !(a->ints = malloc((n ? n : 1) * sizeof *v)))
		return tern_errorf(TERN_EOS, "out of memory");
	if (n)
		memcpy(a->ints, v, n * sizeof *v);
	a->n_ints = n;
	return TERN_OK;
}

tern_status tern_node_add_attr_floats(tern_node *node, const char *name, const float *v, size_t n)
{
	Onnx__AttributeProto *a = new_attr(node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
	if (!a || !(a->floats = malloc((n ? n : 1) * sizeof *v)))
		return tern_errorf(TERN_EOS, "out of memory");
	if (n)
		memcpy(a->floats, v, n * sizeof *v);
	a->n_floats = n;
	return TERN_OK;
}

tern_status tern_node_add_attr_string(tern_node *node, const char *name, const char *v)
{
	return tern_proto_add_attr_string(node->proto, name, v);
}

tern_status tern_proto_add_attr_string(Onnx__NodeProto *np, const char *name, const char *v)
{
	Onnx__AttributeProto *a = tern_proto_new_attr(np, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
	size_t len = strlen(v);
	if (!a || !(a->s.data = malloc(len ? len : 1)))
		return tern_errorf(TERN_EOS, "out of memory");
	memcpy(a->s.data, v, len);
	a->s.len = len;
	a->has_s = 1;
	return TERN_OK;
}

tern_status tern_node_add_attr_strings(tern_node *node, const char *name, const char *const *v, size_t n)
{
	Onnx__AttributeProto *a = new_attr(node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS);
	if (!a || !(a->strings = calloc(n ? n : 1, sizeof *a->strings)))
		return tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(v[i]);
		if (!(a->strings[i].data = malloc(len ? len : 1)))
			return tern_errorf(TERN_EOS, "out of memory");
		memcpy(a->strings[i].data, v[i], len);
		a->strings[i].len = len;
		a->n_strings = i + 1;
	}
	return TERN_OK;
}

tern_status tern_node_add_attr_tensor(tern_node *node, const char *name, const tern_tensor *t)
{
	return tern_proto_add_attr_tensor(node->proto, name, t);
}

tern_status tern_proto_add_attr_tensor(Onnx__NodeProto *np, const char *name, const tern_tensor *t)
{
	Onnx__AttributeProto *a = tern_proto_new_attr(np, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
	if (!a || !(a->t = malloc(sizeof *a->t)))
		return tern_errorf(TERN_EOS, "out of memory");
	onnx__tensor_proto__init(a->t);
	return tern_tensor_to_proto(t, a->t);
}

static tern_value *add_initializer(tern_graph *g, const char *name, tern_tensor *t, bool take)
{
	Onnx__GraphProto *gp = g->proto;
	Onnx__TensorProto *tp = malloc(sizeof *tp);
	Onnx__TensorProto **arr = realloc(gp->initializer, (gp->n_initializer + 1) * sizeof *arr);
	if (arr)
		gp->initializer = arr;
	if (!tp || !arr) {
		free(tp);
		return NULL;
	}
	onnx__tensor_proto__init(tp);
	tern_tensor named = *t;
	named.name = (char *)name;
	/* taken: the proto gets the tensor's own bytes (both are freed with free()) instead of a copy,
	 * which for a folded weight halved the peak memory of the rewrite */
	bool move = take && t->owns_data && t->data && t->dtype != TERN_STRING && t->dtype != TERN_SEQUENCE;
	if (move) {
		named.nbytes = 0;
		named.data = NULL;
	}
	if (tern_tensor_to_proto(&named, tp) != TERN_OK) {
		onnx__tensor_proto__free_unpacked(tp, &tern_pb_allocator);
		return NULL;
	}
	tern_value *v = tern_graph_value(g, name);
	if (!v) {
		onnx__tensor_proto__free_unpacked(tp, &tern_pb_allocator);
		return NULL;
	}
	if (move) {
		free(tp->raw_data.data);
		tp->raw_data.data = t->data;
		tp->raw_data.len = t->nbytes;
		t->data = NULL;
		t->nbytes = 0;
		t->owns_data = 0;
	}
	gp->initializer[gp->n_initializer++] = tp;
	v->flags |= TERN_VALUE_INITIALIZER;
	v->initializer = tp;
	v->type.dtype = t->dtype;
	v->type.rank = t->rank;
	for (int i = 0; i < t->rank; i++)
		v->type.dims[i] = t->dims[i];
	return v;
}

tern_value *tern_graph_add_initializer(tern_graph *g, const char *name, const tern_tensor *t)
{
	tern_tensor copy = *t;
	return add_initializer(g, name, &copy, false);
}

tern_value *tern_graph_take_initializer(tern_graph *g, const char *name, tern_tensor *t)
{
	return add_initializer(g, name, t, true);
}

/* ---------------------------------------------------------------- types and graph interfaces */

Onnx__TypeProto *tern_type_to_proto(const tern_type *t)
{
	Onnx__TypeProto *tp = calloc(1, sizeof *tp);
	Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
	if (!tp || !tt) {
		free(tp);
		free(tt);
		return NULL;
	}
	onnx__type_proto__init(tp);
	onnx__type_proto__tensor__init(tt);
	tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp->tensor_type = tt;
	tt->has_elem_type = 1;
	tt->elem_type = t->dtype;
	if (t->rank < 0)
		return tp;
	Onnx__TensorShapeProto *sh = calloc(1, sizeof *sh);
	Onnx__TensorShapeProto__Dimension **dims = calloc((size_t)t->rank + 1, sizeof *dims);
	tt->shape = sh;
	if (!sh || !dims) {
		free(dims);
		onnx__type_proto__free_unpacked(tp, NULL);
		return NULL;
	}
	onnx__tensor_shape_proto__init(sh);
	sh->dim = dims;
	for (int d = 0; d < t->rank; d++) {
		Onnx__TensorShapeProto__Dimension *dm = calloc(1, sizeof *dm);
		if (!dm) {
			onnx__type_proto__free_unpacked(tp, NULL);
			return NULL;
		}
		onnx__tensor_shape_proto__dimension__init(dm);
		dims[sh->n_dim++] = dm;
		if (t->dims[d] >= 0) {
			dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
			dm->dim_value = t->dims[d];
		} else if (t->dim_param[d]) {
			dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
			if (!(dm->dim_param = tern_strdup(t->dim_param[d]))) {
				dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE__NOT_SET;
				onnx__type_proto__free_unpacked(tp, NULL);
				return NULL;
			}
		}
	}
	return tp;
}

/* A ValueInfoProto named name of type t appended to *list (n entries). */
static tern_status append_value_info(Onnx__ValueInfoProto ***list, size_t *n, const char *name, const tern_type *t)
{
	Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
	Onnx__ValueInfoProto **arr = realloc(*list, (*n + 1) * sizeof *arr);
	if (arr)
		*list = arr;
	if (!vi || !arr) {
		free(vi);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	onnx__value_info_proto__init(vi);
	vi->name = tern_strdup(name);
	vi->type = tern_type_to_proto(t);
	if (!vi->name || !vi->type) {
		onnx__value_info_proto__free_unpacked(vi, NULL);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	(*list)[(*n)++] = vi;
	return TERN_OK;
}

void tern_graph_drop_initializer(tern_graph *g, tern_value *v)
{
	Onnx__GraphProto *gp = g->proto;
	if (!(v->flags & TERN_VALUE_INITIALIZER) || (v->flags & TERN_VALUE_INPUT))
		return;
	for (size_t i = 0; i < gp->n_initializer; i++)
		if (gp->initializer[i] == v->initializer) {
			onnx__tensor_proto__free_unpacked(gp->initializer[i], &tern_pb_allocator);
			memmove(&gp->initializer[i], &gp->initializer[i + 1],
			        (gp->n_initializer - i - 1) * sizeof *gp->initializer);
			gp->n_initializer--;
			break;
		}
	v->flags &= ~(unsigned)TERN_VALUE_INITIALIZER;
	v->initializer = NULL;
}

tern_value *tern_graph_add_input(tern_graph *g, const char *name, const tern_type *t)
{
	tern_value *v = tern_graph_value(g, name);
	if (!v)
		return NULL;
	tern_value **arr = realloc(g->inputs, (g->n_inputs + 1) * sizeof *arr);
	if (!arr || append_value_info(&g->proto->input, &g->proto->n_input, name, t))
		return NULL;
	g->inputs = arr;
	g->inputs[g->n_inputs++] = v;
	v->flags |= TERN_VALUE_INPUT;
	tern_type_from_proto(g->proto->input[g->proto->n_input - 1]->type, &v->type);
	return v;
}

tern_status tern_graph_add_output(tern_graph *g, tern_value *v)
{
	if (v->flags & TERN_VALUE_OUTPUT)
		return TERN_OK; /* already one */
	tern_value **arr = realloc(g->outputs, (g->n_outputs + 1) * sizeof *arr);
	if (!arr)
		return tern_errorf(TERN_EOS, "out of memory");
	g->outputs = arr;
	tern_status st = append_value_info(&g->proto->output, &g->proto->n_output, v->name, &v->type);
	if (st)
		return st;
	g->outputs[g->n_outputs++] = v;
	v->flags |= TERN_VALUE_OUTPUT;
	return TERN_OK;
}
