/* text_print.c — writes a ModelProto in the ONNX text syntax, laid out the way onnx.printer lays it out,
 * plus what that printer leaves out (node names, initializers, value_info) in the syntax onnx parses. */
#include "text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Without weights, tensors with more elements than this are written as "..." (shape only). */
#define ELIDE_ABOVE 16

struct printer {
	char *buf;
	size_t len, cap;
	bool oom;
	int indent; /* spaces before a node line: onnx's printer starts at 3 and adds 3 per subgraph */
	bool ext; /* inside the extension block: every line starts with TEXT_EXT_MARKER */
	int depth; /* graphs and types being written, counted as the reader counts them */
	int with_weights;
	tern_status status; /* the first error that is not out of memory */
};

static void put_mem(struct printer *P, const char *s, size_t n)
{
	if (P->oom || n == 0)
		return;
	if (P->cap - P->len <= n) {
		size_t cap = P->cap ? P->cap : 4096;
		while (cap - P->len <= n) {
			if (cap > SIZE_MAX / 2) {
				P->oom = true;
				return;
			}
			cap *= 2;
		}
		char *b = realloc(P->buf, cap);
		if (!b) {
			P->oom = true;
			return;
		}
		P->buf = b;
		P->cap = cap;
	}
	memcpy(P->buf + P->len, s, n);
	P->len += n;
}

static void put(struct printer *P, const char *s)
{
	put_mem(P, s, strlen(s));
}

static void put_char(struct printer *P, char c)
{
	put_mem(P, &c, 1);
}

static void put_spaces(struct printer *P, int n)
{
	static const char spaces[] = "                                ";
	for (; n > 0; n -= (int)sizeof spaces - 1)
		put_mem(P, spaces, n < (int)sizeof spaces - 1 ? (size_t)n : sizeof spaces - 1);
}

static void newline(struct printer *P)
{
	put_char(P, '\n');
	if (P->ext)
		put(P, TEXT_EXT_MARKER " ");
}

static void put_int(struct printer *P, long long v)
{
	char b[32];
	put_mem(P, b, (size_t)snprintf(b, sizeof b, "%lld", v));
}

static void put_uint(struct printer *P, unsigned long long v)
{
	char b[32];
	put_mem(P, b, (size_t)snprintf(b, sizeof b, "%llu", v));
}

static void fail(struct printer *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct printer *P, const char *fmt, ...)
{
	if (P->status)
		return;
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	P->status = tern_errorf(TERN_EDATA, "%s", msg);
}

/* onnx's escapes: a backslash before '"' and '\'. Inside the extension block a line break must not
 * end the comment line, so it is written as \n there. */
static void put_quoted(struct printer *P, const char *s, size_t n)
{
	put_char(P, '"');
	size_t run = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (c == '"' || c == '\\' || (P->ext && c == '\n')) {
			put_mem(P, s + run, i - run);
			put_char(P, '\\');
			put_char(P, c == '\n' ? 'n' : c);
			run = i + 1;
		}
	}
	if (run < n)
		put_mem(P, s + run, n - run);
	put_char(P, '"');
}

static void put_string(struct printer *P, const char *s)
{
	put_quoted(P, s ? s : "", s ? strlen(s) : 0);
}

static bool is_identifier(const char *s)
{
	if (!s || !text_is_ident_start((unsigned char)*s))
		return false;
	for (s++; *s; s++)
		if (!text_is_ident_char((unsigned char)*s))
			return false;
	return true;
}

static bool equals_nocase(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if ((*a | 0x20) != *b)
			return false;
	return *a == *b;
}

/* Words that would be read as a type or a number where a bare name may also stand: an untyped
 * value-info name, a graph name in an attribute. */
static bool is_reserved_word(const char *s)
{
	if (!strcmp(s, "undefined") || tern_dtype_from_name(s) != TERN_UNDEFINED)
		return true;
	for (size_t i = 0; i < TERN_ARRAY_LEN(text_type_keywords); i++)
		if (!strcmp(s, text_type_keywords[i]))
			return true;
	return equals_nocase(s, "inf") || equals_nocase(s, "infinity") || equals_nocase(s, "nan");
}

/* A name: bare when it is an identifier, quoted otherwise (onnx's newer syntax). */
static void put_id(struct printer *P, const char *s)
{
	if (is_identifier(s))
		put(P, s);
	else
		put_string(P, s);
}

static void put_unambiguous_id(struct printer *P, const char *s)
{
	if (is_identifier(s) && !is_reserved_word(s))
		put(P, s);
	else
		put_string(P, s);
}

/* A list of value names. An empty name (an omitted optional input or output) is written as nothing,
 * as onnx does ("x, , z"); only a list of one empty name needs it quoted, since "()" is no name. */
static void put_id_list(struct printer *P, char *const *names, size_t n, bool may_be_typed)
{
	for (size_t i = 0; i < n; i++) {
		if (i)
			put(P, ", ");
		const char *s = names[i] ? names[i] : "";
		if (!*s && n > 1)
			continue;
		/* Function inputs and outputs may carry types, so a type word there is quoted. */
		if (may_be_typed)
			put_unambiguous_id(P, s);
		else
			put_id(P, s);
	}
}

/* The shortest of %.6g (what onnx's printer writes) to %.9g that reads back as the same float, so
 * that values are exact and match onnx's text wherever onnx's text is exact. A float attribute keeps
 * a decimal point: "1" would read back as an int. */
static void put_float(struct printer *P, float v, bool mark_float)
{
	char b[48];
	if (isnan(v))
		snprintf(b, sizeof b, "%s", signbit(v) ? "-nan" : "nan");
	else if (isinf(v))
		snprintf(b, sizeof b, "%s", v < 0 ? "-inf" : "inf");
	else {
		for (int prec = 6; prec <= 9; prec++) {
			snprintf(b, sizeof b, "%.*g", prec, (double)v);
			if (strtof(b, NULL) == v)
				break;
		}
		if (mark_float && !strpbrk(b, ".e"))
			strcat(b, ".0");
	}
	put(P, b);
}

static void put_double(struct printer *P, double v)
{
	char b[48];
	if (isnan(v))
		snprintf(b, sizeof b, "%s", signbit(v) ? "-nan" : "nan");
	else if (isinf(v))
		snprintf(b, sizeof b, "%s", v < 0 ? "-inf" : "inf");
	else {
		for (int prec = 6; prec <= 17; prec++) {
			snprintf(b, sizeof b, "%.*g", prec, v);
			if (strtod(b, NULL) == v)
				break;
		}
	}
	put(P, b);
}

static void put_elem_type(struct printer *P, bool has, int32_t t)
{
	const char *name = has ? tern_dtype_name(t) : "undefined";
	if (!strcmp(name, "?")) {
		fail(P, "element type %d has no name in the text syntax", (int)t);
		name = "undefined";
	}
	put(P, name);
}

static void put_shape(struct printer *P, const Onnx__TensorShapeProto *shape)
{
	/* onnx: a missing shape is an unknown rank "[]", an empty one is a scalar (nothing). */
	if (!shape) {
		put(P, "[]");
		return;
	}
	if (shape->n_dim == 0)
		return;
	put_char(P, '[');
	for (size_t i = 0; i < shape->n_dim; i++) {
		const Onnx__TensorShapeProto__Dimension *d = shape->dim[i];
		if (i)
			put_char(P, ',');
		if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
			put_int(P, d->dim_value);
		else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
			put_id(P, d->dim_param);
		else
			put_char(P, '?');
	}
	put_char(P, ']');
}

static bool enter(struct printer *P)
{
	if (P->depth >= TEXT_MAX_DEPTH) {
		fail(P, "graphs and types nested more than %d deep have no text form", TEXT_MAX_DEPTH);
		return false;
	}
	P->depth++;
	return true;
}

static void put_type_body(struct printer *P, const Onnx__TypeProto *t);

static void put_type(struct printer *P, const Onnx__TypeProto *t)
{
	if (!t || !enter(P))
		return;
	put_type_body(P, t);
	P->depth--;
}

/* "seq(T)", "optional(T)", "map(K, T)": prefix, the inner type, ")". */
static void put_inner_type(struct printer *P, const char *prefix, const Onnx__TypeProto *inner)
{
	put(P, prefix);
	put_type(P, inner);
	put_char(P, ')');
}

static void put_type_body(struct printer *P, const Onnx__TypeProto *t)
{
	switch (t->value_case) {
	case ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE:
		put_elem_type(P, t->tensor_type->has_elem_type, t->tensor_type->elem_type);
		put_shape(P, t->tensor_type->shape);
		break;
	case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE: put_inner_type(P, "seq(", t->sequence_type->elem_type); break;
	case ONNX__TYPE_PROTO__VALUE_MAP_TYPE:
		put(P, "map(");
		put_elem_type(P, t->map_type->has_key_type, t->map_type->key_type);
		put_inner_type(P, ", ", t->map_type->value_type);
		break;
	case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE: put_inner_type(P, "optional(", t->optional_type->elem_type); break;
	case ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE:
		put(P, "sparse_tensor(");
		put_elem_type(P, t->sparse_tensor_type->has_elem_type, t->sparse_tensor_type->elem_type);
		put_shape(P, t->sparse_tensor_type->shape);
		put_char(P, ')');
		break;
	default: break;
	}
}

static bool has_type(const Onnx__TypeProto *t)
{
	return t && t->value_case != ONNX__TYPE_PROTO__VALUE__NOT_SET;
}

static void put_value_info(struct printer *P, const Onnx__ValueInfoProto *vi)
{
	put_type(P, vi->type);
	put_char(P, ' ');
	if (has_type(vi->type))
		put_id(P, vi->name);
	else
		put_unambiguous_id(P, vi->name);
}

static void put_value_infos(struct printer *P, Onnx__ValueInfoProto *const *vis, size_t n)
{
	put_char(P, '(');
	for (size_t i = 0; i < n; i++) {
		if (i)
			put(P, ", ");
		put_value_info(P, vis[i]);
	}
	put_char(P, ')');
}

/* ---------------------------------------------------------------- tensors */

/* The element layout of raw_data per data type. */
enum raw { R_NONE, R_I8, R_U8, R_I16, R_U16, R_I32, R_I64, R_U32, R_U64, R_F32, R_F64 };

static enum raw raw_of(int dtype)
{
	switch (dtype) {
	case TERN_INT8: return R_I8;
	case TERN_UINT8:
	case TERN_BOOL:
	case TERN_FLOAT8E4M3FN:
	case TERN_FLOAT8E4M3FNUZ:
	case TERN_FLOAT8E5M2:
	case TERN_FLOAT8E5M2FNUZ: return R_U8;
	case TERN_INT16: return R_I16;
	case TERN_UINT16:
	case TERN_FLOAT16:
	case TERN_BFLOAT16: return R_U16;
	case TERN_INT32: return R_I32;
	case TERN_INT64: return R_I64;
	case TERN_UINT32: return R_U32;
	case TERN_UINT64: return R_U64;
	case TERN_FLOAT:
	case TERN_COMPLEX64: return R_F32;
	case TERN_DOUBLE:
	case TERN_COMPLEX128: return R_F64;
	default: return R_NONE;
	}
}

static const size_t raw_size[] = {[R_I8] = 1,  [R_U8] = 1,  [R_I16] = 2, [R_U16] = 2, [R_I32] = 4,
                                  [R_I64] = 8, [R_U32] = 4, [R_U64] = 8, [R_F32] = 4, [R_F64] = 8};

static void put_raw_element(struct printer *P, enum raw kind, const uint8_t *p)
{
	union {
		int8_t i8;
		uint8_t u8;
		int16_t i16;
		uint16_t u16;
		int32_t i32;
		int64_t i64;
		uint32_t u32;
		uint64_t u64;
		float f32;
		double f64;
	} v;
	/* raw_data is little-endian, as is every machine tern builds on. */
	memcpy(&v, p, raw_size[kind]);
	switch (kind) {
	case R_I8: put_int(P, v.i8); break;
	case R_U8: put_int(P, v.u8); break;
	case R_I16: put_int(P, v.i16); break;
	case R_U16: put_int(P, v.u16); break;
	case R_I32: put_int(P, v.i32); break;
	case R_I64: put_int(P, v.i64); break;
	case R_U32: put_uint(P, v.u32); break;
	case R_U64: put_uint(P, v.u64); break;
	case R_F32: put_float(P, v.f32, false); break;
	case R_F64: put_double(P, v.f64); break;
	default: break;
	}
}

static size_t field_count(const Onnx__TensorProto *t, enum text_field f)
{
	switch (f) {
	case F_INT32: return t->n_int32_data;
	case F_INT64: return t->n_int64_data;
	case F_UINT64: return t->n_uint64_data;
	case F_FLOAT: return t->n_float_data;
	case F_DOUBLE: return t->n_double_data;
	case F_STRING: return t->n_string_data;
	default: return 0;
	}
}

static void put_field_element(struct printer *P, const Onnx__TensorProto *t, enum text_field f, size_t i)
{
	switch (f) {
	case F_INT32: put_int(P, t->int32_data[i]); break;
	case F_INT64: put_int(P, t->int64_data[i]); break;
	case F_UINT64: put_uint(P, t->uint64_data[i]); break;
	case F_FLOAT: put_float(P, t->float_data[i], false); break;
	case F_DOUBLE: put_double(P, t->double_data[i]); break;
	case F_STRING: put_quoted(P, (const char *)t->string_data[i].data, t->string_data[i].len); break;
	default: break;
	}
}

static void put_tensor_values(struct printer *P, const Onnx__TensorProto *t)
{
	const char *name = t->name && *t->name ? t->name : "(unnamed)";
	int dtype = t->has_data_type ? t->data_type : TERN_UNDEFINED;
	enum text_field f = text_field_of(dtype);
	enum raw r = raw_of(dtype);
	size_t n;
	if (t->has_raw_data) {
		if (r == R_NONE) {
			fail(P, "tensor '%s': raw_data of type %s has no text form", name, tern_dtype_name(dtype));
			return;
		}
		if (t->raw_data.len % raw_size[r]) {
			fail(P, "tensor '%s': raw_data of %zu bytes does not hold whole %s elements", name,
			     t->raw_data.len, tern_dtype_name(dtype));
			return;
		}
		n = t->raw_data.len / raw_size[r];
	} else {
		n = field_count(t, f);
		if (f == F_NONE && !P->status && dtype != TERN_UNDEFINED) {
			fail(P, "tensor '%s': values of type %s have no text form", name, tern_dtype_name(dtype));
			return;
		}
	}
	if (!P->with_weights && n > ELIDE_ABOVE) {
		put(P, " ...");
		return;
	}
	put(P, " {");
	const char *sep = f == F_STRING ? ", " : ",";
	for (size_t i = 0; i < n && !P->oom; i++) {
		if (i)
			put(P, sep);
		if (t->has_raw_data)
			put_raw_element(P, r, t->raw_data.data + i * raw_size[r]);
		else
			put_field_element(P, t, f, i);
	}
	put_char(P, '}');
}

static void put_string_pairs(struct printer *P, Onnx__StringStringEntryProto *const *e, size_t n)
{
	put_char(P, '[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			put(P, ", ");
		put_string(P, e[i]->key);
		put(P, ": ");
		put_string(P, e[i]->value);
	}
	put_char(P, ']');
}

/* "float[2,3] name {1,2,3,4,5,6}"; as an initializer "float[2,3] name = {...}" as onnx parses it in a
 * graph's value-info list. */
static void put_tensor(struct printer *P, const Onnx__TensorProto *t, bool initializer)
{
	/* The reader takes the tensor's type as one more level. */
	if (!enter(P))
		return;
	P->depth--;
	put_elem_type(P, t->has_data_type, t->data_type);
	if (t->n_dims) {
		put_char(P, '[');
		for (size_t i = 0; i < t->n_dims; i++) {
			if (i)
				put_char(P, ',');
			put_int(P, t->dims[i]);
		}
		put_char(P, ']');
	}
	if (initializer || (t->name && *t->name)) {
		put_char(P, ' ');
		put_id(P, t->name);
	}
	if (initializer)
		put(P, " =");
	/* external data stays a reference unless its values are wanted and were mapped at load */
	if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL &&
	    !(P->with_weights && t->has_raw_data)) {
		put_char(P, ' ');
		put_string_pairs(P, t->external_data, t->n_external_data);
	} else
		put_tensor_values(P, t);
}

/* ---------------------------------------------------------------- attributes, nodes, graphs */

static void put_graph(struct printer *P, const Onnx__GraphProto *g, bool in_attribute);

static const char *attr_type_name(int type)
{
	return type > 0 && (size_t)type < TERN_ARRAY_LEN(text_attr_type_names) ? text_attr_type_names[type] : NULL;
}

static void put_attr_list_open(struct printer *P, const Onnx__AttributeProto *a, size_t n)
{
	/* An empty list says nothing of its type, so it carries the annotation (onnx's newer syntax). */
	if (n == 0) {
		put(P, ": ");
		put(P, attr_type_name(a->type));
		put(P, " = []");
	} else
		put(P, " = [");
}

static void put_attr(struct printer *P, const Onnx__NodeProto *node, const Onnx__AttributeProto *a)
{
	put_id(P, a->name);
	const char *tname = a->has_type ? attr_type_name(a->type) : NULL;
	if (a->ref_attr_name) {
		if (tname) {
			put(P, ": ");
			put(P, tname);
		}
		put(P, " = @");
		put_id(P, a->ref_attr_name);
		return;
	}
	if (!tname) {
		fail(P, "node '%s' (%s): attribute '%s' has no valid type", node->name ? node->name : "",
		     node->op_type ? node->op_type : "", a->name ? a->name : "");
		return;
	}
	size_t n = 0;
	switch (a->type) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
		put(P, " = ");
		put_int(P, a->i);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
		put(P, " = ");
		put_float(P, a->f, true);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
		put(P, " = ");
		put_quoted(P, (const char *)a->s.data, a->s.len);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
		put(P, " = ");
		if (a->t)
			put_tensor(P, a->t, false);
		else
			fail(P, "node '%s': attribute '%s' has no tensor", node->name ? node->name : "", a->name);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
		put(P, " = ");
		P->indent += 3;
		if (a->g)
			put_graph(P, a->g, true);
		else
			fail(P, "node '%s': attribute '%s' has no graph", node->name ? node->name : "", a->name);
		P->indent -= 3;
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO:
		put(P, " = ");
		if (has_type(a->tp))
			put_type(P, a->tp);
		else
			fail(P, "node '%s': attribute '%s' has no type", node->name ? node->name : "", a->name);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR:
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS:
		/* The text syntax has no sparse tensors: shown elided, refused where the text must be whole. */
		put(P, " = ...");
		if (P->with_weights)
			fail(P, "node '%s': attribute '%s': sparse tensors have no text form",
			     node->name ? node->name : "", a->name);
		return;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: n = a->n_ints; break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: n = a->n_floats; break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS: n = a->n_strings; break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS: n = a->n_tensors; break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS: n = a->n_graphs; break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS: n = a->n_type_protos; break;
	default: return;
	}
	put_attr_list_open(P, a, n);
	if (n == 0)
		return;
	if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS)
		P->indent += 3;
	for (size_t i = 0; i < n; i++) {
		if (i)
			put(P, ", ");
		switch (a->type) {
		case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: put_int(P, a->ints[i]); break;
		case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: put_float(P, a->floats[i], true); break;
		case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS:
			put_quoted(P, (const char *)a->strings[i].data, a->strings[i].len);
			break;
		case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS: put_tensor(P, a->tensors[i], false); break;
		case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS: put_graph(P, a->graphs[i], true); break;
		default:
			if (has_type(a->type_protos[i]))
				put_type(P, a->type_protos[i]);
			else
				fail(P, "node '%s': attribute '%s' has an empty type", node->name ? node->name : "",
				     a->name);
			break;
		}
	}
	if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS)
		P->indent -= 3;
	put_char(P, ']');
}

static bool is_dotted_identifier(const char *s)
{
	for (;;) {
		if (!text_is_ident_start((unsigned char)*s))
			return false;
		while (text_is_ident_char((unsigned char)*s))
			s++;
		if (*s == '\0')
			return true;
		if (*s++ != '.')
			return false;
	}
}

/* "domain.Op": a domain of dotted identifiers is written bare, as onnx does; any other is quoted. */
static void put_op(struct printer *P, const char *domain, const char *op_type)
{
	if (domain && *domain) {
		if (is_dotted_identifier(domain))
			put(P, domain);
		else
			put_string(P, domain);
		put_char(P, '.');
	}
	put_id(P, op_type);
}

static void put_node(struct printer *P, const Onnx__NodeProto *n)
{
	put_spaces(P, P->indent);
	if (n->name) {
		put_char(P, '[');
		put_id(P, n->name);
		put(P, "] ");
	}
	put_id_list(P, n->output, n->n_output, false);
	put(P, " = ");
	put_op(P, n->domain, n->op_type);
	/* onnx writes the attributes after the inputs when one of them is a graph (going by the graphs
	 * written, not by fields of other types' attributes, so the text reads back the same). */
	bool has_subgraph = false;
	for (size_t i = 0; i < n->n_attribute; i++) {
		const Onnx__AttributeProto *a = n->attribute[i];
		if (!a->ref_attr_name && a->has_type &&
		    ((a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH && a->g) ||
		     (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS && a->n_graphs)))
			has_subgraph = true;
	}
	for (int pass = 0; pass < 2; pass++) {
		if (n->n_attribute && has_subgraph == (pass == 1)) {
			put(P, " <");
			for (size_t i = 0; i < n->n_attribute; i++) {
				if (i)
					put(P, ", ");
				put_attr(P, n, n->attribute[i]);
			}
			put_char(P, '>');
		}
		if (pass == 0) {
			put(P, " (");
			put_id_list(P, n->input, n->n_input, false);
			put_char(P, ')');
		}
	}
	newline(P);
}

static void put_nodes(struct printer *P, Onnx__NodeProto *const *nodes, size_t n)
{
	put_char(P, '{');
	newline(P);
	for (size_t i = 0; i < n && !P->oom; i++)
		put_node(P, nodes[i]);
	if (P->indent > 3)
		put_spaces(P, P->indent - 3);
	put_char(P, '}');
}

static void put_graph_body(struct printer *P, const Onnx__GraphProto *g);

static void put_graph(struct printer *P, const Onnx__GraphProto *g, bool in_attribute)
{
	if (in_attribute)
		put_unambiguous_id(P, g->name);
	else
		put_id(P, g->name);
	if (!enter(P))
		return;
	put_graph_body(P, g);
	P->depth--;
}

static void put_graph_body(struct printer *P, const Onnx__GraphProto *g)
{
	put_char(P, ' ');
	put_value_infos(P, g->input, g->n_input);
	put(P, " => ");
	put_value_infos(P, g->output, g->n_output);
	/* Initializers and value_info: the list onnx's parser reads between the outputs and the nodes,
	 * on lines of their own as onnx's newer printer writes them, one entry a line. */
	size_t n_extra = g->n_initializer + g->n_value_info;
	if (!n_extra)
		put_char(P, ' ');
	for (size_t i = 0; i < n_extra; i++) {
		if (i == 0) {
			newline(P);
			put_spaces(P, P->indent);
			put_char(P, '<');
		} else {
			put_char(P, ',');
			newline(P);
			put_spaces(P, P->indent + 1);
		}
		if (i < g->n_initializer)
			put_tensor(P, g->initializer[i], true);
		else
			put_value_info(P, g->value_info[i - g->n_initializer]);
	}
	if (n_extra) {
		put_char(P, '>');
		newline(P);
		/* onnx starts the nodes at the margin here; a subgraph's go where its closing brace goes. */
		if (P->indent > 3)
			put_spaces(P, P->indent - 3);
	}
	if (g->n_sparse_initializer) {
		if (P->with_weights)
			fail(P, "graph '%s': sparse initializers have no text form", g->name ? g->name : "");
		for (size_t i = 0; i < g->n_sparse_initializer; i++) {
			const Onnx__SparseTensorProto *s = g->sparse_initializer[i];
			put_spaces(P, P->indent);
			put(P, "# sparse initializer ");
			put_string(P, s->values && s->values->name ? s->values->name : "");
			put(P, " not shown");
			newline(P);
		}
	}
	put_nodes(P, g->node, g->n_node);
}

static void put_opsets(struct printer *P, Onnx__OperatorSetIdProto *const *o, size_t n, const char *sep)
{
	put_char(P, '[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			put(P, sep);
		put_string(P, o[i]->domain);
		put(P, " : ");
		put_int(P, o[i]->version);
	}
	put_char(P, ']');
}

static void put_function(struct printer *P, const Onnx__FunctionProto *f)
{
	put(P, "<\n  domain: ");
	put_string(P, f->domain);
	put(P, ",\n  opset_import: ");
	put_opsets(P, f->opset_import, f->n_opset_import, ",");
	if (f->doc_string) {
		put(P, ",\n  doc_string: ");
		put_string(P, f->doc_string);
	}
	put(P, "\n>\n");
	put_id(P, f->name);
	put_char(P, ' ');
	if (f->n_attribute) {
		put_char(P, '<');
		for (size_t i = 0; i < f->n_attribute; i++) {
			if (i)
				put_char(P, ',');
			put_id(P, f->attribute[i]);
		}
		put_char(P, '>');
	}
	put_char(P, '(');
	put_id_list(P, f->input, f->n_input, true);
	put(P, ") => (");
	put_id_list(P, f->output, f->n_output, true);
	put(P, ")\n");
	put_nodes(P, f->node, f->n_node);
}

/* TrainingInfoProto has no ONNX text form: it goes in extension lines, which ONNX's parser skips. */
static void put_training_info(struct printer *P, const Onnx__TrainingInfoProto *t)
{
	put(P, "\n" TEXT_EXT_MARKER " training_info <");
	P->ext = true;
	P->indent = 6;
	const char *sep = "";
	const struct {
		const char *key;
		const Onnx__GraphProto *graph;
		Onnx__StringStringEntryProto *const *pairs;
		size_t n_pairs;
	} items[] = {
	        {"initialization", t->initialization, NULL, 0},
	        {"algorithm", t->algorithm, NULL, 0},
	        {"initialization_binding", NULL, t->initialization_binding, t->n_initialization_binding},
	        {"update_binding", NULL, t->update_binding, t->n_update_binding},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(items); i++) {
		if (!items[i].graph && !items[i].n_pairs)
			continue;
		put(P, sep);
		newline(P);
		put(P, "   ");
		put(P, items[i].key);
		put(P, ": ");
		if (items[i].graph)
			put_graph(P, items[i].graph, true);
		else
			put_string_pairs(P, items[i].pairs, items[i].n_pairs);
		sep = ",";
	}
	newline(P);
	put_char(P, '>');
	P->ext = false;
	P->indent = 3;
}

static void put_model(struct printer *P, const Onnx__ModelProto *m)
{
	put(P, "<\n   ir_version: ");
	put_int(P, m->ir_version);
	put(P, ",\n   opset_import: ");
	put_opsets(P, m->opset_import, m->n_opset_import, ", ");
	const struct {
		const char *key;
		const char *value;
	} strings[] = {
	        {"producer_name", m->producer_name},
	        {"producer_version", m->producer_version},
	        {"domain", m->domain},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(strings); i++) {
		if (strings[i].value) {
			put(P, ",\n   ");
			put(P, strings[i].key);
			put(P, ": ");
			put_string(P, strings[i].value);
		}
	}
	if (m->has_model_version) {
		put(P, ",\n   model_version: ");
		put_int(P, m->model_version);
	}
	if (m->doc_string) {
		put(P, ",\n   doc_string: ");
		put_string(P, m->doc_string);
	}
	if (m->n_metadata_props) {
		put(P, ",\n   metadata_props: ");
		put_string_pairs(P, m->metadata_props, m->n_metadata_props);
	}
	put(P, "\n>\n");
	static const Onnx__GraphProto empty = ONNX__GRAPH_PROTO__INIT;
	put_graph(P, m->graph ? m->graph : &empty, false);
	for (size_t i = 0; i < m->n_functions; i++) {
		put_char(P, '\n');
		put_function(P, m->functions[i]);
	}
	for (size_t i = 0; i < m->n_training_info; i++)
		put_training_info(P, m->training_info[i]);
	put_char(P, '\n');
}

tern_status tern_text_print_model(const Onnx__ModelProto *model, int with_weights, char **out, size_t *size)
{
	*out = NULL;
	*size = 0;
	struct printer P = {.indent = 3, .with_weights = with_weights};
	put_model(&P, model);
	put_char(&P, '\0');
	if (P.oom || P.status) {
		free(P.buf);
		return P.oom ? tern_errorf(TERN_EOS, "out of memory writing the text syntax") : P.status;
	}
	*out = P.buf;
	*size = P.len - 1;
	return TERN_OK;
}
