/* text.h — what the reader and the writer of the ONNX text syntax share: attribute type names,
 * identifier rules and the limits of the syntax. Private to text_parse.c and text_print.c. */
#ifndef TERN_TEXT_H
#define TERN_TEXT_H

#include "internal.h"

/* Attribute type names as written in "name: type = value", indexed by AttributeType. */
static const char *const text_attr_type_names[] = {
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT] = "float",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT] = "int",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING] = "string",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR] = "tensor",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH] = "graph",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR] = "sparse_tensor",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO] = "type_proto",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS] = "floats",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS] = "ints",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS] = "strings",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS] = "tensors",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS] = "graphs",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS] = "sparse_tensors",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS] = "type_protos",
};

/* Words that start a type besides the element type names. */
static const char *const text_type_keywords[] = {"seq", "map", "optional", "sparse_tensor"};

/* Graphs in attributes and types in types nest: deeper input is refused (by both) rather than
 * overflowing the stack. */
#define TEXT_MAX_DEPTH 64

/* Lines that start with this marker carry what the ONNX syntax cannot express (training_info): ONNX's
 * parser skips them as comments, tern's reads the rest of the line as syntax. */
#define TEXT_EXT_MARKER "#@"

/* Where a tensor's values go outside raw_data, by ONNX's rules per data type; the text writes them
 * as those fields' numbers (float16 and float8 as their bit patterns, complex as pairs). */
enum text_field { F_NONE, F_INT32, F_INT64, F_UINT64, F_FLOAT, F_DOUBLE, F_STRING };

static inline enum text_field text_field_of(int dtype)
{
	switch (dtype) {
	case TERN_INT8:
	case TERN_INT16:
	case TERN_INT32:
	case TERN_UINT8:
	case TERN_UINT16:
	case TERN_BOOL:
	case TERN_FLOAT16:
	case TERN_BFLOAT16:
	case TERN_FLOAT8E4M3FN:
	case TERN_FLOAT8E4M3FNUZ:
	case TERN_FLOAT8E5M2:
	case TERN_FLOAT8E5M2FNUZ: return F_INT32;
	case TERN_INT64: return F_INT64;
	case TERN_UINT32:
	case TERN_UINT64: return F_UINT64;
	case TERN_FLOAT:
	case TERN_COMPLEX64: return F_FLOAT;
	case TERN_DOUBLE:
	case TERN_COMPLEX128: return F_DOUBLE;
	case TERN_STRING: return F_STRING;
	default: return F_NONE;
	}
}

static inline bool text_is_ident_start(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static inline bool text_is_ident_char(int c)
{
	return text_is_ident_start(c) || (c >= '0' && c <= '9');
}

#endif
