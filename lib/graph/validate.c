/* validate.c — structural checks of a model, each fault reported with the place it is found:
 * opset imports, undefined inputs, cycles, attribute types, absurd shapes, inconsistent tensors. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

/* The newest ai.onnx opset whose operators tern knows the semantics of. */
#define TERN_MAX_ONNX_OPSET 21
/* A dimension above this is not a real tensor (2^40 elements is a terabyte of bytes). */
#define TERN_MAX_DIM ((int64_t)1 << 40)

typedef Onnx__AttributeProto__AttributeType attr_type;

/* Attribute names whose type is the same in every default-domain operator and version that has them
 * ("seed" is FLOAT in the random operators but INT in Dropout; Cast-1's "to" is a STRING). */
static const struct {
	const char *name;
	attr_type type;
} known_attrs[] = {
#define A(n, t)                                               \
	{                                                     \
		n, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##t \
	}
        A("axis", INT),
        A("axes", INTS),
        A("perm", INTS),
        A("kernel_shape", INTS),
        A("strides", INTS),
        A("pads", INTS),
        A("dilations", INTS),
        A("group", INT),
        A("alpha", FLOAT),
        A("beta", FLOAT),
        A("epsilon", FLOAT),
        A("momentum", FLOAT),
        A("transA", INT),
        A("transB", INT),
        A("keepdims", INT),
        A("auto_pad", STRING),
        A("mode", STRING),
        A("then_branch", GRAPH),
        A("else_branch", GRAPH),
        A("body", GRAPH),
        A("ceil_mode", INT),
        A("count_include_pad", INT),
        A("storage_order", INT),
        A("output_padding", INTS),
        A("output_shape", INTS),
        A("direction", STRING),
        A("hidden_size", INT),
        A("activations", STRINGS),
        A("activation_alpha", FLOATS),
        A("activation_beta", FLOATS),
        A("clip", FLOAT),
        A("linear_before_reset", INT),
        A("input_forget", INT),
        A("layout", INT),
        A("blocksize", INT),
        A("batch_dims", INT),
        A("noop_with_empty_axes", INT),
        A("select_last_index", INT),
        A("largest", INT),
        A("sorted", INT),
        A("exclusive", INT),
        A("reverse", INT),
        A("num_outputs", INT),
        A("equation", STRING),
        A("allowzero", INT),
        A("stash_type", INT),
        A("training_mode", INT),
        A("upper", INT),
        A("fmod", INT),
        A("coordinate_transformation_mode", STRING),
        A("nearest_mode", STRING),
        A("cubic_coeff_a", FLOAT),
        A("exclude_outside", INT),
        A("extrapolation_value", FLOAT),
        A("reduction", STRING),
        A("num_scan_inputs", INT),
        A("scan_input_axes", INTS),
        A("scan_output_axes", INTS),
        A("scan_input_directions", INTS),
        A("scan_output_directions", INTS),
        A("value_float", FLOAT),
        A("value_floats", FLOATS),
        A("value_int", INT),
        A("value_ints", INTS),
        A("value_string", STRING),
        A("value_strings", STRINGS),
        A("detect_negative", INT),
        A("detect_positive", INT),
        A("lambd", FLOAT),
        A("gamma", FLOAT),
        A("bias", FLOAT),
        A("size", INT),
        A("p", INT),
        A("dtype", INT),
        A("high", FLOAT),
        A("low", FLOAT),
        A("mean", FLOAT),
        A("scale", FLOAT),
#undef A
};

static const char *attr_type_name(int t)
{
	static const char *names[] = {
	        "UNDEFINED", "FLOAT",   "INT",    "STRING",        "TENSOR",         "GRAPH",      "FLOATS",     "INTS",
	        "STRINGS",   "TENSORS", "GRAPHS", "SPARSE_TENSOR", "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
	return t >= 0 && t < (int)TERN_ARRAY_LEN(names) ? names[t] : "?";
}

/* Which type the attribute's populated fields say it has (UNDEFINED when none, -1 when several). */
static int populated_type(const Onnx__AttributeProto *a)
{
	int t = 0, count = 0;
#define F(cond, ty)                                              \
	if (cond) {                                              \
		t = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##ty; \
		count++;                                         \
	}
	F(a->has_f, FLOAT)
	F(a->has_i, INT)
	F(a->has_s, STRING)
	F(a->t, TENSOR)
	F(a->g, GRAPH)
	F(a->sparse_tensor, SPARSE_TENSOR)
	F(a->tp, TYPE_PROTO)
	F(a->n_floats, FLOATS)
	F(a->n_ints, INTS)
	F(a->n_strings, STRINGS)
	F(a->n_tensors, TENSORS)
	F(a->n_graphs, GRAPHS)
	F(a->n_sparse_tensors, SPARSE_TENSORS)
	F(a->n_type_protos, TYPE_PROTOS)
#undef F
	return count > 1 ? -1 : t;
}

static bool is_list_type(int t)
{
	return t >= ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS &&
	        t != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR &&
	        t != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO;
}

static tern_status check_attrs(const tern_node *n)
{
	const Onnx__NodeProto *np = n->proto;
	for (size_t i = 0; i < np->n_attribute; i++) {
		const Onnx__AttributeProto *a = np->attribute[i];
		if (!a->name || !*a->name)
			return tern_node_errorf(n, TERN_EDATA, "attribute %zu has no name", i);
		for (size_t j = 0; j < i; j++)
			if (np->attribute[j]->name && strcmp(np->attribute[j]->name, a->name) == 0)
				return tern_node_errorf(n, TERN_EDATA, "attribute '%s' is given twice", a->name);
		if (a->ref_attr_name && *a->ref_attr_name)
			continue; /* a reference to a function attribute: typed at the call */
		int have = populated_type(a);
		if (have < 0)
			return tern_node_errorf(n, TERN_EDATA, "attribute '%s' holds values of several types", a->name);
		int declared = a->has_type ? (int)a->type : 0;
		/* An empty list is indistinguishable from no value; accept it for a declared list type. */
		if (declared && have && declared != have)
			return tern_node_errorf(n, TERN_EDATA, "attribute '%s' is declared %s but holds %s", a->name,
			                        attr_type_name(declared), attr_type_name(have));
		if (declared && !have && !is_list_type(declared) &&
		    declared != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING)
			return tern_node_errorf(n, TERN_EDATA, "attribute '%s' is declared %s but has no value",
			                        a->name, attr_type_name(declared));
		int actual = declared ? declared : have;
		if (*n->domain)
			continue;
		for (size_t k = 0; k < TERN_ARRAY_LEN(known_attrs); k++) {
			if (strcmp(known_attrs[k].name, a->name) != 0)
				continue;
			int want = (int)known_attrs[k].type;
			/* Operators that share a name with different types: Constant's value_* are checked by
			 * the table; "size" (LRN INT) and "scale" (ImageScaler FLOAT) are unambiguous. */
			/* An integer where a float is expected ("alpha = 1", as onnx's printer writes it) still
			 * means that number; tern_attr_float reads it so. */
			if (actual == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT &&
			    want == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)
				continue;
			if (actual && actual != want)
				return tern_node_errorf(n, TERN_EDATA, "attribute '%s' must be %s, not %s", a->name,
				                        attr_type_name(want), attr_type_name(actual));
		}
	}
	return TERN_OK;
}

static tern_status check_type(const tern_model *m, const char *what, const char *name, const Onnx__TypeProto *tp)
{
	if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
		return TERN_OK;
	const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
	if (tt->has_elem_type && (tt->elem_type < 0 || tt->elem_type >= TERN_DTYPE_COUNT))
		return tern_errorf(TERN_EDATA, "%s: %s '%s': unknown element type %d", m->source, what, name,
		                   (int)tt->elem_type);
	if (!tt->shape)
		return TERN_OK;
	if (tt->shape->n_dim > TERN_MAX_RANK)
		return tern_errorf(TERN_EDATA, "%s: %s '%s': rank %zu exceeds %d", m->source, what, name,
		                   tt->shape->n_dim, TERN_MAX_RANK);
	for (size_t i = 0; i < tt->shape->n_dim; i++) {
		const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
		if (d->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
			continue;
		if (d->dim_value < 0)
			return tern_errorf(TERN_EDATA, "%s: %s '%s': dimension %zu is negative (%lld)", m->source, what,
			                   name, i, (long long)d->dim_value);
		if (d->dim_value > TERN_MAX_DIM)
			return tern_errorf(TERN_EDATA, "%s: %s '%s': dimension %zu is absurdly large (%lld)", m->source,
			                   what, name, i, (long long)d->dim_value);
	}
	return TERN_OK;
}

static tern_status check_value_infos(const tern_model *m, const char *what, Onnx__ValueInfoProto **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *name = v[i]->name ? v[i]->name : "";
		if (!*name)
			return tern_errorf(TERN_EDATA, "%s: %s %zu has no name", m->source, what, i);
		tern_status st = check_type(m, what, name, v[i]->type);
		if (st)
			return st;
	}
	return TERN_OK;
}

static tern_status check_initializer(const tern_model *m, const Onnx__TensorProto *t)
{
	const char *name = t->name ? t->name : "";
	if (!*name)
		return tern_errorf(TERN_EDATA, "%s: an initializer has no name", m->source);
	int dt = t->has_data_type ? t->data_type : 0;
	if (dt <= 0 || dt >= TERN_DTYPE_COUNT)
		return tern_errorf(TERN_EDATA, "%s: initializer '%s': unknown data type %d", m->source, name, dt);
	if (t->n_dims > TERN_MAX_RANK)
		return tern_errorf(TERN_EDATA, "%s: initializer '%s': rank %zu exceeds %d", m->source, name, t->n_dims,
		                   TERN_MAX_RANK);
	uint64_t numel = 1;
	for (size_t i = 0; i < t->n_dims; i++) {
		if (t->dims[i] < 0 || t->dims[i] > TERN_MAX_DIM)
			return tern_errorf(TERN_EDATA, "%s: initializer '%s': dimension %zu is %s (%lld)", m->source,
			                   name, i, t->dims[i] < 0 ? "negative" : "absurdly large",
			                   (long long)t->dims[i]);
		if (t->dims[i] && numel > (uint64_t)TERN_MAX_DIM / (uint64_t)t->dims[i])
			return tern_errorf(TERN_EDATA, "%s: initializer '%s': more than 2^40 elements is absurdly many",
			                   m->source, name);
		numel *= (uint64_t)t->dims[i];
		if (numel > (uint64_t)TERN_MAX_DIM)
			return tern_errorf(TERN_EDATA, "%s: initializer '%s': %llu elements is absurdly many",
			                   m->source, name, (unsigned long long)numel);
	}
	if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
		return TERN_OK;
	size_t have = 0;
	if (t->has_raw_data) {
		size_t es = tern_dtype_size(dt);
		if (dt != TERN_STRING && t->raw_data.len != numel * es)
			return tern_errorf(TERN_EDATA,
			                   "%s: initializer '%s': raw_data has %zu bytes, its shape needs %llu",
			                   m->source, name, t->raw_data.len, (unsigned long long)(numel * es));
		return TERN_OK;
	}
	switch (dt) {
	case TERN_FLOAT: have = t->n_float_data; break;
	case TERN_COMPLEX64: have = t->n_float_data / 2; break;
	case TERN_DOUBLE: have = t->n_double_data; break;
	case TERN_COMPLEX128: have = t->n_double_data / 2; break;
	case TERN_INT64: have = t->n_int64_data; break;
	case TERN_UINT32:
	case TERN_UINT64: have = t->n_uint64_data; break;
	case TERN_STRING: have = t->n_string_data; break;
	default: have = t->n_int32_data; break;
	}
	if (have != numel)
		return tern_errorf(TERN_EDATA, "%s: initializer '%s': %zu values stored, its shape needs %llu",
		                   m->source, name, have, (unsigned long long)numel);
	return TERN_OK;
}

static bool domain_imported(const tern_graph *g, const char *domain)
{
	const tern_graph *root = g;
	while (root->parent)
		root = root->parent;
	if (root->kind == TERN_GRAPH_FUNCTION) {
		const Onnx__FunctionProto *fp = root->fproto;
		for (size_t i = 0; i < fp->n_opset_import; i++) {
			const char *d = fp->opset_import[i]->domain ? fp->opset_import[i]->domain : "";
			if (strcmp(d, "ai.onnx") == 0)
				d = "";
			if (strcmp(d, domain) == 0)
				return true;
		}
	}
	return tern_model_opset(g->model, domain) >= 0;
}

static tern_status validate_graph(tern_model *m, tern_graph *g)
{
	tern_status st;
	if (g->proto) {
		Onnx__GraphProto *gp = g->proto;
		if ((st = check_value_infos(m, "graph input", gp->input, gp->n_input)) ||
		    (st = check_value_infos(m, "graph output", gp->output, gp->n_output)) ||
		    (st = check_value_infos(m, "value", gp->value_info, gp->n_value_info)))
			return st;
		for (size_t i = 0; i < gp->n_initializer; i++)
			if ((st = check_initializer(m, gp->initializer[i])))
				return st;
		if (g->kind == TERN_GRAPH_MAIN && gp->n_output == 0)
			return tern_errorf(TERN_EDATA, "%s: the graph has no outputs", m->source);
	}
	for (size_t i = 0; i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		if (n->removed)
			continue;
		if (!*n->op_type)
			return tern_node_errorf(n, TERN_EDATA, "the node has no operator type");
		if (!domain_imported(g, n->domain))
			return tern_node_errorf(n, TERN_EDATA, "domain '%s' is not imported in opset_import",
			                        *n->domain ? n->domain : "ai.onnx");
		for (size_t k = 0; k < n->n_inputs; k++) {
			const tern_value *v = n->inputs[k];
			if (v && !v->producer &&
			    !(v->flags & (TERN_VALUE_INPUT | TERN_VALUE_INITIALIZER | TERN_VALUE_OUTER)))
				return tern_node_errorf(
				        n, TERN_EDATA,
				        "input %zu '%s' is not defined by any node, input or initializer", k, v->name);
		}
		if ((st = check_attrs(n)))
			return st;
		for (size_t s = 0; s < n->n_subgraphs; s++)
			if ((st = validate_graph(m, n->subgraphs[s])))
				return st;
	}
	for (size_t i = 0; i < g->n_outputs; i++) {
		const tern_value *v = g->outputs[i];
		if (!v->producer && !(v->flags & (TERN_VALUE_INPUT | TERN_VALUE_INITIALIZER | TERN_VALUE_OUTER)))
			return tern_errorf(TERN_EDATA,
			                   "%s: graph output '%s' is not defined by any node, input or initializer",
			                   m->source, v->name);
	}
	tern_node **order;
	size_t count;
	if ((st = tern_graph_toposort(g, &order, &count)))
		return st;
	free(order);
	return TERN_OK;
}

tern_status tern_model_validate(tern_model *m)
{
	const Onnx__ModelProto *p = m->proto;
	if (!p->has_ir_version || p->ir_version < 1)
		return tern_errorf(TERN_EDATA, "%s: the model has no ir_version", m->source);
	if (p->n_opset_import == 0)
		return tern_errorf(TERN_EDATA, "%s: the model imports no opset (opset_import is empty)", m->source);
	for (size_t i = 0; i < p->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = p->opset_import[i];
		const char *d = o->domain ? o->domain : "";
		int64_t v = o->has_version ? o->version : 0;
		for (size_t j = 0; j < i; j++) {
			const char *dj = p->opset_import[j]->domain ? p->opset_import[j]->domain : "";
			if (strcmp(d, dj) == 0)
				return tern_errorf(TERN_EDATA, "%s: opset_import lists domain '%s' twice", m->source,
				                   d);
		}
		if (v < 1)
			return tern_errorf(TERN_EDATA, "%s: opset_import: domain '%s' has invalid version %lld",
			                   m->source, *d ? d : "ai.onnx", (long long)v);
		if ((!*d || strcmp(d, "ai.onnx") == 0) && v > TERN_MAX_ONNX_OPSET)
			return tern_errorf(TERN_EDATA,
			                   "%s: opset_import: ai.onnx version %lld is unknown (tern knows 1 to %d)",
			                   m->source, (long long)v, TERN_MAX_ONNX_OPSET);
	}
	tern_status st = validate_graph(m, m->graph);
	for (size_t i = 0; !st && i < m->n_functions; i++)
		st = validate_graph(m, m->functions[i]);
	return st;
}
