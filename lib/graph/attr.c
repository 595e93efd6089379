/* attr.c — reading node attributes with defaults. */
#include "internal.h"

const Onnx__AttributeProto *tern_attr(const tern_node *node, const char *name)
{
	const Onnx__NodeProto *np = node->proto;
	for (size_t i = 0; i < np->n_attribute; i++)
		if (np->attribute[i]->name && strcmp(np->attribute[i]->name, name) == 0)
			return np->attribute[i];
	return NULL;
}

int64_t tern_attr_int(const tern_node *node, const char *name, int64_t dflt)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	return a && a->has_i ? a->i : dflt;
}

float tern_attr_float(const tern_node *node, const char *name, float dflt)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	if (!a)
		return dflt;
	if (a->has_f)
		return a->f;
	/* An integer written where a float is expected ("alpha = 1") still means that number. */
	return a->has_i ? (float)a->i : dflt;
}

const char *tern_attr_string(const tern_node *node, const char *name, const char *dflt)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	if (!a || !a->has_s)
		return dflt;
	/* Attribute strings are bytes; the proto keeps them without a terminator. A node's strings are
	 * short identifiers ("NOTSET", "constant"); copy into a per-thread ring so callers get a C string. */
	static _Thread_local char ring[8][256];
	static _Thread_local int next;
	char *buf = ring[next++ & 7];
	size_t n = a->s.len < sizeof ring[0] - 1 ? a->s.len : sizeof ring[0] - 1;
	if (n)
		memcpy(buf, a->s.data, n);
	buf[n] = '\0';
	return buf;
}

const int64_t *tern_attr_ints(const tern_node *node, const char *name, size_t *n)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	*n = a ? a->n_ints : 0;
	return a && a->n_ints ? a->ints : NULL;
}

const float *tern_attr_floats(const tern_node *node, const char *name, size_t *n)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	*n = a ? a->n_floats : 0;
	return a && a->n_floats ? a->floats : NULL;
}

const Onnx__TensorProto *tern_attr_tensor(const tern_node *node, const char *name)
{
	const Onnx__AttributeProto *a = tern_attr(node, name);
	return a ? a->t : NULL;
}

tern_graph *tern_attr_graph(const tern_node *node, const char *name)
{
	/* Subgraphs were built in attribute order; find the one built from this attribute. */
	size_t k = 0;
	const Onnx__NodeProto *np = node->proto;
	for (size_t i = 0; i < np->n_attribute; i++) {
		const Onnx__AttributeProto *a = np->attribute[i];
		if (a->g) {
			if (a->name && strcmp(a->name, name) == 0)
				return k < node->n_subgraphs ? node->subgraphs[k] : NULL;
			k++;
		}
		k += a->n_graphs;
	}
	return NULL;
}
