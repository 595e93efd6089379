/* text_parse.c — reads the ONNX text syntax (what onnx.parser reads, in its 1.14 form and the newer
 * one: quoted names, node names, typed attributes) into a ModelProto built from malloc'd parts, so that
 * onnx__model_proto__free_unpacked frees it. Bad input gives TERN_EDATA "line L, column C: ...". */
#include "text.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_NUMBER 128

struct parser {
	const char *start, *p, *end;
	bool ext; /* the next token is on a TEXT_EXT_MARKER line */
	int depth;
};

#define TRY(expr)                             \
	do {                                  \
		tern_status try_st_ = (expr); \
		if (try_st_)                  \
			return try_st_;       \
	} while (0)

static tern_status oom(void)
{
	return tern_errorf(TERN_EOS, "out of memory reading the text syntax");
}

/* Repeated fields carry only their count: the capacity is the count rounded up to a power of two, so
 * an array grows when its count is zero or a power of two. */
static void *grow(void *arr, size_t n, size_t size)
{
	if (n & (n - 1))
		return arr;
	size_t cap = n ? n * 2 : 1;
	if (cap > SIZE_MAX / size)
		return NULL;
	return realloc(arr, cap * size);
}

#define RESERVE(arr, n)                                         \
	do {                                                    \
		void *grown_ = grow((arr), (n), sizeof *(arr)); \
		if (!grown_)                                    \
			return oom();                           \
		(arr) = grown_;                                 \
	} while (0)

#define PUSH(arr, n, value)             \
	do {                            \
		RESERVE(arr, n);        \
		(arr)[(n)++] = (value); \
	} while (0)

/* A new message, initialised and attached to its parent before anything can fail. */
#define NEW(dst, T, ...)                     \
	do {                                 \
		T *new_ = malloc(sizeof(T)); \
		if (!new_)                   \
			return oom();        \
		*new_ = (T)__VA_ARGS__;      \
		(dst) = new_;                \
	} while (0)

/* out = a new message appended to arr; the initialiser comes last because it holds commas. */
#define ADD_NEW(arr, n, out, T, ...)           \
	do {                                   \
		RESERVE(arr, n);               \
		NEW((arr)[n], T, __VA_ARGS__); \
		(out) = (arr)[(n)++];          \
	} while (0)

static tern_status push_string(char ***arr, size_t *n, char *s)
{
	void *grown = grow(*arr, *n, sizeof **arr);
	if (!grown) {
		free(s);
		return oom();
	}
	*arr = grown;
	(*arr)[(*n)++] = s;
	return TERN_OK;
}

static tern_status push_bytes(ProtobufCBinaryData **arr, size_t *n, char *s, size_t len)
{
	void *grown = grow(*arr, *n, sizeof **arr);
	if (!grown) {
		free(s);
		return oom();
	}
	*arr = grown;
	(*arr)[(*n)++] = (ProtobufCBinaryData){len, (uint8_t *)s};
	return TERN_OK;
}

static char *dup_span(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, s, n);
		d[n] = '\0';
	}
	return d;
}

/* ---------------------------------------------------------------- tokens */

static void skip_space(struct parser *P)
{
	while (P->p < P->end) {
		char c = *P->p;
		if (c == '\n') {
			P->ext = false;
			P->p++;
		} else if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f') {
			P->p++;
		} else if (c == '#') {
			if (P->end - P->p >= 2 && P->p[1] == TEXT_EXT_MARKER[1]) {
				P->ext = true;
				P->p += 2;
			} else {
				while (P->p < P->end && *P->p != '\n')
					P->p++;
			}
		} else
			break;
	}
}

static int peek(struct parser *P)
{
	skip_space(P);
	return P->p < P->end ? (unsigned char)*P->p : EOF;
}

static bool match(struct parser *P, char c)
{
	if (peek(P) != (unsigned char)c)
		return false;
	P->p++;
	return true;
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* Length of the identifier at the current position (after white space), 0 when there is none. */
static size_t ident_len(struct parser *P)
{
	if (!text_is_ident_start(peek(P)))
		return 0;
	size_t n = 1;
	while (P->p + n < P->end && text_is_ident_char((unsigned char)P->p[n]))
		n++;
	return n;
}

static bool ident_is(struct parser *P, const char *word)
{
	size_t n = ident_len(P);
	return n && n == strlen(word) && !memcmp(P->p, word, n);
}

/* What is at the current position, for messages. */
static const char *describe(struct parser *P, char *buf, size_t size)
{
	int c = peek(P);
	size_t n = ident_len(P);
	if (c == EOF)
		snprintf(buf, size, "the end of the input");
	else if (n)
		snprintf(buf, size, "'%.*s'", (int)(n < 40 ? n : 40), P->p);
	else if (c >= 0x20 && c < 0x7f)
		snprintf(buf, size, "'%c'", c);
	else
		snprintf(buf, size, "byte 0x%02x", (unsigned)c);
	return buf;
}

static tern_status fail_at(const struct parser *P, const char *at, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static tern_status fail_at(const struct parser *P, const char *at, const char *fmt, ...)
{
	unsigned long line = 1, column = 1;
	for (const char *q = P->start; q < at; q++) {
		if (*q == '\n') {
			line++;
			column = 1;
		} else
			column++;
	}
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return tern_errorf(TERN_EDATA, "line %lu, column %lu: %s", line, column, msg);
}

/* "expected WHAT, found X" at the next token. */
static tern_status fail_expected(struct parser *P, const char *what)
{
	char found[64];
	describe(P, found, sizeof found);
	return fail_at(P, P->p, "expected %s, found %s", what, found);
}

static tern_status expect(struct parser *P, char c, const char *what)
{
	if (match(P, c))
		return TERN_OK;
	char buf[128];
	snprintf(buf, sizeof buf, "'%c' %s", c, what);
	return fail_expected(P, buf);
}

/* "=>" is one token: no space between its characters. */
static tern_status expect_arrow(struct parser *P, const char *what)
{
	if (peek(P) == '=' && P->end - P->p >= 2 && P->p[1] == '>') {
		P->p += 2;
		return TERN_OK;
	}
	char buf[128];
	snprintf(buf, sizeof buf, "'=>' %s", what);
	return fail_expected(P, buf);
}

/* A string literal. onnx's escape is a backslash before any character, which stands for itself; on
 * extension lines \n also stands for a line break, which cannot appear there raw. */
static tern_status take_string(struct parser *P, char **out, size_t *len)
{
	const char *open = P->p;
	const char *q = open + 1;
	size_t n = 0;
	while (q < P->end && *q != '"') {
		if (*q == '\\' && ++q == P->end)
			break;
		q++;
		n++;
	}
	if (q >= P->end)
		return fail_at(P, open, "string not closed (a '\"' is missing)");
	char *s = malloc(n + 1);
	if (!s)
		return oom();
	size_t k = 0;
	for (const char *r = open + 1; r < q; r++) {
		if (*r == '\\') {
			r++;
			s[k++] = P->ext && *r == 'n' ? '\n' : *r;
		} else
			s[k++] = *r;
	}
	s[k] = '\0';
	P->p = q + 1;
	*out = s;
	if (len)
		*len = k;
	return TERN_OK;
}

static tern_status take_string_value(struct parser *P, const char *what, char **out)
{
	if (peek(P) != '"')
		return fail_expected(P, what);
	char *s;
	TRY(take_string(P, &s, NULL));
	free(*out);
	*out = s;
	return TERN_OK;
}

/* A name: an identifier, or any string in quotes. */
static tern_status take_name(struct parser *P, const char *what, char **out)
{
	if (peek(P) == '"')
		return take_string(P, out, NULL);
	size_t n = ident_len(P);
	if (!n)
		return fail_expected(P, what);
	if (!(*out = dup_span(P->p, n)))
		return oom();
	P->p += n;
	return TERN_OK;
}

static bool is_float_word(const char *s, size_t n)
{
	static const char *const words[] = {"inf", "infinity", "nan"};
	for (size_t w = 0; w < TERN_ARRAY_LEN(words); w++) {
		if (strlen(words[w]) != n)
			continue;
		size_t i = 0;
		while (i < n && (s[i] | 0x20) == words[w][i])
			i++;
		if (i == n)
			return true;
	}
	return false;
}

enum literal { LIT_INT, LIT_FLOAT };

/* A number as onnx reads it: -?digits(.digits)?(e[+-]?digits)?, or -?(inf|infinity|nan) in any case.
 * The literal is copied NUL-terminated into buf for strtoll/strtof. */
static tern_status take_number(struct parser *P, char buf[MAX_NUMBER], enum literal *kind, const char **at)
{
	peek(P);
	const char *q = P->p;
	*at = q;
	if (q < P->end && *q == '-')
		q++;
	*kind = LIT_INT;
	if (q < P->end && text_is_ident_start((unsigned char)*q)) {
		const char *w = q;
		while (q < P->end && text_is_ident_char((unsigned char)*q))
			q++;
		if (!is_float_word(w, (size_t)(q - w)))
			return fail_at(P, *at, "expected a number, found '%.*s'", (int)(q - w < 40 ? q - w : 40), w);
		*kind = LIT_FLOAT;
	} else if (q < P->end && is_digit((unsigned char)*q)) {
		bool point = false;
		while (q < P->end && (is_digit((unsigned char)*q) || (*q == '.' && !point))) {
			point = point || *q == '.';
			q++;
		}
		if (q < P->end && (*q == 'e' || *q == 'E')) {
			q++;
			if (q < P->end && (*q == '+' || *q == '-'))
				q++;
			if (q == P->end || !is_digit((unsigned char)*q))
				return fail_at(P, *at, "number with an exponent but no digits after it");
			while (q < P->end && is_digit((unsigned char)*q))
				q++;
			point = true;
		}
		*kind = point ? LIT_FLOAT : LIT_INT;
	} else
		return fail_expected(P, "a number");
	size_t n = (size_t)(q - *at);
	if (n >= MAX_NUMBER)
		return fail_at(P, *at, "number longer than %d characters", MAX_NUMBER - 1);
	memcpy(buf, *at, n);
	buf[n] = '\0';
	P->p = q;
	return TERN_OK;
}

/* What a number is read as. */
enum number { N_INT64, N_UINT64, N_FLOAT, N_DOUBLE };

/* The literal in buf (read at `at`) as the number wanted, into *out (an int64_t, uint64_t, float or
 * double). Underflow gives the nearest value; overflow is a mistake. */
static tern_status convert(struct parser *P, const char *buf, enum literal kind, const char *at, enum number want,
                           void *out)
{
	errno = 0;
	switch (want) {
	case N_INT64: {
		if (kind != LIT_INT)
			return fail_at(P, at, "expected an integer, found %s", buf);
		long long x = strtoll(buf, NULL, 10);
		if (errno == ERANGE)
			return fail_at(P, at, "integer %s is out of range", buf);
		*(int64_t *)out = x;
		return TERN_OK;
	}
	case N_UINT64: {
		if (kind != LIT_INT || buf[0] == '-')
			return fail_at(P, at, "expected an unsigned integer, found %s", buf);
		unsigned long long x = strtoull(buf, NULL, 10);
		if (errno == ERANGE)
			return fail_at(P, at, "integer %s is out of range", buf);
		*(uint64_t *)out = x;
		return TERN_OK;
	}
	case N_FLOAT: {
		float x = strtof(buf, NULL);
		if (errno == ERANGE && isinf(x))
			return fail_at(P, at, "number %s is out of the range of float", buf);
		*(float *)out = x;
		return TERN_OK;
	}
	default: {
		double x = strtod(buf, NULL);
		if (errno == ERANGE && isinf(x))
			return fail_at(P, at, "number %s is out of the range of double", buf);
		*(double *)out = x;
		return TERN_OK;
	}
	}
}

static tern_status read_number(struct parser *P, enum number want, void *out)
{
	char buf[MAX_NUMBER];
	enum literal kind;
	const char *at;
	TRY(take_number(P, buf, &kind, &at));
	return convert(P, buf, kind, at, want, out);
}

/* ---------------------------------------------------------------- types */

/* The element type a word names (TERN_UNDEFINED for "undefined"), or -1. */
static int elem_type_of(const char *s, size_t n)
{
	char word[32];
	if (n == 0 || n >= sizeof word)
		return -1;
	memcpy(word, s, n);
	word[n] = '\0';
	if (!strcmp(word, "undefined"))
		return TERN_UNDEFINED;
	int t = tern_dtype_from_name(word);
	return t == TERN_UNDEFINED ? -1 : t;
}

/* Whether a type starts here. "undefined" (what onnx writes for a missing element type) counts only
 * where a type can stand: before a shape, a name or a tensor's values. */
static bool next_is_type(struct parser *P)
{
	size_t n = ident_len(P);
	if (!n)
		return false;
	const char *w = P->p;
	for (size_t i = 0; i < TERN_ARRAY_LEN(text_type_keywords); i++)
		if (strlen(text_type_keywords[i]) == n && !memcmp(w, text_type_keywords[i], n))
			return true;
	int t = elem_type_of(w, n);
	if (t > 0)
		return true;
	if (t < 0)
		return false;
	struct parser after = *P;
	after.p += n;
	int c = peek(&after);
	return c == '[' || c == '"' || c == '{' || text_is_ident_start(c);
}

static tern_status parse_type(struct parser *P, Onnx__TypeProto **out);

static tern_status take_elem_type(struct parser *P, int32_t *type, protobuf_c_boolean *has)
{
	size_t n = ident_len(P);
	int t = elem_type_of(P->p, n);
	if (t < 0)
		return fail_expected(P, "an element type (float, int64, ...)");
	P->p += n;
	*type = t;
	*has = t != TERN_UNDEFINED;
	return TERN_OK;
}

/* "[2,N,?]" after an element type; "[]" is an unknown rank (no shape), nothing a scalar. */
static tern_status parse_shape(struct parser *P, Onnx__TensorShapeProto **out)
{
	if (!match(P, '[')) {
		NEW(*out, Onnx__TensorShapeProto, ONNX__TENSOR_SHAPE_PROTO__INIT);
		return TERN_OK;
	}
	if (match(P, ']'))
		return TERN_OK;
	NEW(*out, Onnx__TensorShapeProto, ONNX__TENSOR_SHAPE_PROTO__INIT);
	Onnx__TensorShapeProto *s = *out;
	do {
		if (peek(P) == ']')
			break;
		Onnx__TensorShapeProto__Dimension *d;
		ADD_NEW(s->dim, s->n_dim, d, Onnx__TensorShapeProto__Dimension,
		        ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT);
		int c = peek(P);
		if (match(P, '?'))
			continue;
		if (c == '"' || text_is_ident_start(c)) {
			TRY(take_name(P, "a dimension", &d->dim_param));
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
		} else {
			TRY(read_number(P, N_INT64, &d->dim_value));
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
		}
	} while (match(P, ','));
	return expect(P, ']', "to close the shape");
}

/* The element type of seq(...), optional(...) or a map's value: may be left empty, as onnx writes a
 * missing one. */
static tern_status parse_inner_type(struct parser *P, Onnx__TypeProto **out)
{
	if (peek(P) == ')')
		return TERN_OK;
	return parse_type(P, out);
}

static tern_status parse_type_body(struct parser *P, Onnx__TypeProto *t)
{
	size_t n = ident_len(P);
	const char *w = P->p;
	if (elem_type_of(w, n) >= 0) {
		Onnx__TypeProto__Tensor *tt;
		NEW(tt, Onnx__TypeProto__Tensor, ONNX__TYPE_PROTO__TENSOR__INIT);
		t->tensor_type = tt;
		t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
		TRY(take_elem_type(P, &tt->elem_type, &tt->has_elem_type));
		return parse_shape(P, &tt->shape);
	}
	P->p += n;
	if (n == 3 && !memcmp(w, "seq", 3)) {
		NEW(t->sequence_type, Onnx__TypeProto__Sequence, ONNX__TYPE_PROTO__SEQUENCE__INIT);
		t->value_case = ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE;
		TRY(expect(P, '(', "after seq"));
		TRY(parse_inner_type(P, &t->sequence_type->elem_type));
	} else if (n == 8 && !memcmp(w, "optional", 8)) {
		NEW(t->optional_type, Onnx__TypeProto__Optional, ONNX__TYPE_PROTO__OPTIONAL__INIT);
		t->value_case = ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE;
		TRY(expect(P, '(', "after optional"));
		TRY(parse_inner_type(P, &t->optional_type->elem_type));
	} else if (n == 3 && !memcmp(w, "map", 3)) {
		NEW(t->map_type, Onnx__TypeProto__Map, ONNX__TYPE_PROTO__MAP__INIT);
		t->value_case = ONNX__TYPE_PROTO__VALUE_MAP_TYPE;
		TRY(expect(P, '(', "after map"));
		TRY(take_elem_type(P, &t->map_type->key_type, &t->map_type->has_key_type));
		TRY(expect(P, ',', "after the key type of a map"));
		TRY(parse_inner_type(P, &t->map_type->value_type));
	} else if (n == 13 && !memcmp(w, "sparse_tensor", 13)) {
		Onnx__TypeProto__SparseTensor *st;
		NEW(st, Onnx__TypeProto__SparseTensor, ONNX__TYPE_PROTO__SPARSE_TENSOR__INIT);
		t->sparse_tensor_type = st;
		t->value_case = ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE;
		TRY(expect(P, '(', "after sparse_tensor"));
		TRY(take_elem_type(P, &st->elem_type, &st->has_elem_type));
		TRY(parse_shape(P, &st->shape));
	} else {
		P->p = w;
		return fail_expected(P, "a type");
	}
	return expect(P, ')', "to close the type");
}

static tern_status parse_type(struct parser *P, Onnx__TypeProto **out)
{
	if (P->depth >= TEXT_MAX_DEPTH)
		return fail_at(P, P->p, "types nested more than %d deep", TEXT_MAX_DEPTH);
	NEW(*out, Onnx__TypeProto, ONNX__TYPE_PROTO__INIT);
	P->depth++;
	tern_status st = parse_type_body(P, *out);
	P->depth--;
	return st;
}

/* ---------------------------------------------------------------- tensors */

static tern_status parse_pairs(struct parser *P, Onnx__StringStringEntryProto ***arr, size_t *n)
{
	TRY(expect(P, '[', "to open the list of \"key\": \"value\" pairs"));
	do {
		if (peek(P) == ']')
			break;
		Onnx__StringStringEntryProto *e;
		ADD_NEW(*arr, *n, e, Onnx__StringStringEntryProto, ONNX__STRING_STRING_ENTRY_PROTO__INIT);
		TRY(take_string_value(P, "a key in quotes", &e->key));
		TRY(expect(P, ':', "after the key"));
		TRY(take_string_value(P, "a value in quotes", &e->value));
	} while (match(P, ','));
	return expect(P, ']', "to close the list of pairs");
}

static tern_status parse_element(struct parser *P, Onnx__TensorProto *t)
{
	int64_t i = 0;
	switch (text_field_of(t->data_type)) {
	case F_INT32: {
		const char *at = (peek(P), P->p);
		TRY(read_number(P, N_INT64, &i));
		if (i < INT32_MIN || i > INT32_MAX)
			return fail_at(P, at, "value %lld does not fit a %s tensor", (long long)i,
			               tern_dtype_name(t->data_type));
		PUSH(t->int32_data, t->n_int32_data, (int32_t)i);
		return TERN_OK;
	}
	case F_INT64:
		TRY(read_number(P, N_INT64, &i));
		PUSH(t->int64_data, t->n_int64_data, i);
		return TERN_OK;
	case F_UINT64: {
		uint64_t u = 0;
		TRY(read_number(P, N_UINT64, &u));
		PUSH(t->uint64_data, t->n_uint64_data, u);
		return TERN_OK;
	}
	case F_FLOAT: {
		float f = 0;
		TRY(read_number(P, N_FLOAT, &f));
		PUSH(t->float_data, t->n_float_data, f);
		return TERN_OK;
	}
	case F_DOUBLE: {
		double d = 0;
		TRY(read_number(P, N_DOUBLE, &d));
		PUSH(t->double_data, t->n_double_data, d);
		return TERN_OK;
	}
	case F_STRING: {
		if (peek(P) != '"')
			return fail_expected(P, "a string in quotes");
		char *s;
		size_t len;
		TRY(take_string(P, &s, &len));
		return push_bytes(&t->string_data, &t->n_string_data, s, len);
	}
	default:
		return fail_at(P, P->p, "a %s tensor cannot be given values in the text syntax",
		               tern_dtype_name(t->data_type));
	}
}

/* The values of a tensor whose type was just read (at type_at): {v, ...}, or [pairs] for external
 * data. */
static tern_status parse_tensor_data(struct parser *P, Onnx__TensorProto *t, const Onnx__TypeProto *type,
                                     const char *type_at)
{
	if (!type || type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
		return fail_at(P, type_at, "a tensor value needs a tensor type");
	const Onnx__TypeProto__Tensor *tt = type->tensor_type;
	t->has_data_type = 1;
	t->data_type = tt->elem_type;
	if (!tt->shape)
		return fail_at(P, type_at, "a tensor value needs a shape, not an unknown rank '[]'");
	for (size_t i = 0; i < tt->shape->n_dim; i++) {
		const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
		if (d->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
			return fail_at(P, type_at, "dimension %zu of a tensor value must be a number", i);
		PUSH(t->dims, t->n_dims, d->dim_value);
	}
	if (match(P, '{')) {
		do {
			if (peek(P) == '}')
				break;
			TRY(parse_element(P, t));
		} while (match(P, ','));
		return expect(P, '}', "to close the tensor's values");
	}
	if (peek(P) == '[') {
		t->has_data_location = 1;
		t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
		return parse_pairs(P, &t->external_data, &t->n_external_data);
	}
	if (P->end - P->p >= 3 && !memcmp(P->p, "...", 3))
		return fail_at(P, P->p,
		               "the tensor's values were left out ('...'): the text was written without weights");
	return fail_expected(P, "'{' and the tensor's values");
}

/* ---------------------------------------------------------------- attributes */

static tern_status parse_graph(struct parser *P, Onnx__GraphProto *g, bool name_optional);
static tern_status parse_graph_body(struct parser *P, Onnx__GraphProto *g);
static tern_status parse_graph_parts(struct parser *P, Onnx__GraphProto *g);

/* One attribute value as read, before it is stored in a single field or appended to a list. */
struct value {
	int type; /* AttributeType; UNDEFINED for a reference "@name" */
	int64_t i;
	float f;
	char *s;
	size_t s_len;
	char *ref;
	Onnx__TensorProto *t;
	Onnx__GraphProto *g;
	Onnx__TypeProto *tp;
};

static void value_free(struct value *v)
{
	free(v->s);
	free(v->ref);
	if (v->t)
		onnx__tensor_proto__free_unpacked(v->t, NULL);
	if (v->g)
		onnx__graph_proto__free_unpacked(v->g, NULL);
	if (v->tp)
		onnx__type_proto__free_unpacked(v->tp, NULL);
}

/* A tensor after its type: an optional name, an optional '=', the values. */
static tern_status parse_tensor_rest(struct parser *P, struct value *v, const char *type_at)
{
	NEW(v->t, Onnx__TensorProto, ONNX__TENSOR_PROTO__INIT);
	int c = peek(P);
	if (c == '"' || text_is_ident_start(c))
		TRY(take_name(P, "a tensor name", &v->t->name));
	else if (!(v->t->name = dup_span("", 0)))
		return oom();
	match(P, '=');
	TRY(parse_tensor_data(P, v->t, v->tp, type_at));
	onnx__type_proto__free_unpacked(v->tp, NULL);
	v->tp = NULL;
	v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
	return TERN_OK;
}

/* One value, its type inferred as onnx infers it: a type followed by a name or values is a tensor,
 * alone a type; inf and nan are floats; any other word starts a graph; a number with a point or an
 * exponent is a float. A quoted string followed by '(' is a graph with that name. */
static tern_status parse_single(struct parser *P, struct value *v)
{
	int c = peek(P);
	const char *at = P->p;
	if (text_is_ident_start(c)) {
		size_t n = ident_len(P);
		if (next_is_type(P)) {
			TRY(parse_type(P, &v->tp));
			c = peek(P);
			if (c == '{' || c == '=' || c == '"' || c == '.' || text_is_ident_start(c))
				return parse_tensor_rest(P, v, at);
			v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO;
			return TERN_OK;
		}
		if (is_float_word(P->p, n)) {
			TRY(read_number(P, N_FLOAT, &v->f));
			v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
			return TERN_OK;
		}
		NEW(v->g, Onnx__GraphProto, ONNX__GRAPH_PROTO__INIT);
		v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
		return parse_graph(P, v->g, false);
	}
	if (c == '"') {
		TRY(take_string(P, &v->s, &v->s_len));
		if (peek(P) != '(') {
			v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
			return TERN_OK;
		}
		NEW(v->g, Onnx__GraphProto, ONNX__GRAPH_PROTO__INIT);
		v->g->name = v->s;
		v->s = NULL;
		v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
		return parse_graph_body(P, v->g);
	}
	if (c == '@') {
		P->p++;
		v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED;
		return take_name(P, "the name of a function attribute after '@'", &v->ref);
	}
	if (c != '-' && !is_digit(c))
		return fail_expected(P, "an attribute value");
	char buf[MAX_NUMBER];
	enum literal kind;
	TRY(take_number(P, buf, &kind, &at));
	if (kind == LIT_INT) {
		v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
		return convert(P, buf, kind, at, N_INT64, &v->i);
	}
	v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
	return convert(P, buf, kind, at, N_FLOAT, &v->f);
}

static const char *attr_type_name(int type)
{
	const char *s =
	        type > 0 && (size_t)type < TERN_ARRAY_LEN(text_attr_type_names) ? text_attr_type_names[type] : NULL;
	return s ? s : "undefined";
}

/* Checks a value against the declared type; an integer stands for a float where one is declared. */
static tern_status check_declared(struct parser *P, struct value *v, int declared, const char *name, const char *at)
{
	if (!declared || declared == v->type || v->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED)
		return TERN_OK;
	if (declared == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT &&
	    v->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) {
		v->f = (float)v->i;
		v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
		return TERN_OK;
	}
	return fail_at(P, at, "attribute '%s' is declared %s but its value is a %s", name, attr_type_name(declared),
	               attr_type_name(v->type));
}

static void set_value(Onnx__AttributeProto *a, struct value *v)
{
	if (v->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED) {
		a->ref_attr_name = v->ref;
		v->ref = NULL;
		return;
	}
	a->has_type = 1;
	a->type = v->type;
	switch (v->type) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
		a->has_i = 1;
		a->i = v->i;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
		a->has_f = 1;
		a->f = v->f;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
		a->has_s = 1;
		a->s = (ProtobufCBinaryData){v->s_len, (uint8_t *)v->s};
		v->s = NULL;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
		a->t = v->t;
		v->t = NULL;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
		a->g = v->g;
		v->g = NULL;
		break;
	default:
		a->tp = v->tp;
		v->tp = NULL;
		break;
	}
}

static int list_type_of(int single)
{
	switch (single) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH: return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO:
		return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS;
	default: return 0;
	}
}

static int single_type_of(int list)
{
	if (!list)
		return 0;
	for (int t = 1; t < (int)TERN_ARRAY_LEN(text_attr_type_names); t++)
		if (list_type_of(t) == list)
			return t;
	return 0;
}

/* Appends one value to a list attribute. Untyped [1, 2.5] is a list of floats. */
static tern_status append_value(struct parser *P, Onnx__AttributeProto *a, struct value *v, bool declared,
                                const char *at)
{
	int list = list_type_of(v->type);
	if (!list)
		return fail_at(P, at, "attribute '%s': a list cannot hold a %s", a->name,
		               v->type ? attr_type_name(v->type) : "reference");
	if (a->has_type && (int)a->type != list) {
		if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS &&
		    list == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) {
			v->f = (float)v->i;
			v->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
		} else if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS &&
		           list == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS && !declared) {
			for (size_t i = 0; i < a->n_ints; i++)
				PUSH(a->floats, a->n_floats, (float)a->ints[i]);
			free(a->ints);
			a->ints = NULL;
			a->n_ints = 0;
		} else
			return fail_at(P, at, "attribute '%s': a list of %s cannot hold a %s", a->name,
			               attr_type_name(a->type), attr_type_name(v->type));
	}
	a->has_type = 1;
	a->type = list_type_of(v->type);
	switch (v->type) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: PUSH(a->ints, a->n_ints, v->i); break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: PUSH(a->floats, a->n_floats, v->f); break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
		TRY(push_bytes(&a->strings, &a->n_strings, v->s, v->s_len));
		v->s = NULL;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR:
		PUSH(a->tensors, a->n_tensors, v->t);
		v->t = NULL;
		break;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
		PUSH(a->graphs, a->n_graphs, v->g);
		v->g = NULL;
		break;
	default:
		PUSH(a->type_protos, a->n_type_protos, v->tp);
		v->tp = NULL;
		break;
	}
	return TERN_OK;
}

static bool is_list_type(int type)
{
	return single_type_of(type) != 0;
}

/* After an attribute's name: [: type] = value | [: type] = [value, ...]. */
static tern_status parse_attr_rest(struct parser *P, Onnx__AttributeProto *a)
{
	int declared = 0;
	if (match(P, ':')) {
		size_t n = ident_len(P);
		for (int t = 1; t < (int)TERN_ARRAY_LEN(text_attr_type_names) && !declared; t++)
			if (text_attr_type_names[t] && strlen(text_attr_type_names[t]) == n &&
			    !memcmp(P->p, text_attr_type_names[t], n))
				declared = t;
		if (!declared)
			return fail_expected(P, "an attribute type (int, floats, tensor, graph, ...)");
		P->p += n;
		a->has_type = 1;
		a->type = declared;
	}
	TRY(expect(P, '=', "after the attribute name"));
	if (match(P, '[')) {
		if (peek(P) == ']') {
			if (!is_list_type(declared))
				return fail_at(P, P->p,
				               "the empty list of attribute '%s' needs a list type: '%s: ints = []'",
				               a->name, a->name);
		} else if (declared && !is_list_type(declared)) {
			return fail_at(P, P->p, "attribute '%s' is declared %s but its value is a list", a->name,
			               attr_type_name(declared));
		}
		do {
			if (peek(P) == ']')
				break;
			struct value v = {0};
			const char *at = P->p;
			tern_status st = parse_single(P, &v);
			if (!st)
				st = check_declared(P, &v, single_type_of(declared), a->name, at);
			if (!st)
				st = append_value(P, a, &v, declared != 0, at);
			value_free(&v);
			TRY(st);
		} while (match(P, ','));
		return expect(P, ']', "to close the list");
	}
	struct value v = {0};
	const char *at = (peek(P), P->p);
	tern_status st = parse_single(P, &v);
	if (!st)
		st = check_declared(P, &v, declared, a->name, at);
	if (!st)
		set_value(a, &v);
	value_free(&v);
	return st;
}

/* ---------------------------------------------------------------- nodes and graphs */

/* Value names separated by commas, as onnx reads them: a comma with no name before it stands for an
 * empty name (an omitted optional input or output), so "(, x, )" is "", "x", "". Types before the
 * names (function inputs and outputs) are read and dropped when typed is set: this ONNX version has no
 * place for them. */
static tern_status parse_id_list(struct parser *P, char ***arr, size_t *n, bool typed)
{
	for (bool first = true;; first = false) {
		if (typed && next_is_type(P)) {
			Onnx__TypeProto *tp = NULL;
			tern_status st = parse_type(P, &tp);
			if (tp)
				onnx__type_proto__free_unpacked(tp, NULL);
			TRY(st);
			if (peek(P) != '"' && !ident_len(P))
				return fail_expected(P, "a name after the type");
		}
		int c = peek(P);
		char *s;
		if (c == '"' || text_is_ident_start(c))
			TRY(take_name(P, "a name", &s));
		else if (first && c != ',')
			return TERN_OK;
		else if (!(s = dup_span("", 0)))
			return oom();
		TRY(push_string(arr, n, s));
		if (!match(P, ','))
			return TERN_OK;
	}
}

static tern_status join_domain(char **domain, char *part)
{
	if (!*domain) {
		*domain = part;
		return TERN_OK;
	}
	size_t a = strlen(*domain), b = strlen(part);
	char *d = realloc(*domain, a + b + 2);
	if (!d) {
		free(part);
		return oom();
	}
	d[a] = '.';
	memcpy(d + a + 1, part, b + 1);
	free(part);
	*domain = d;
	return TERN_OK;
}

/* "Op" or "domain.parts.Op". */
static tern_status parse_op(struct parser *P, Onnx__NodeProto *node)
{
	char *domain = NULL, *part = NULL;
	tern_status st = take_name(P, "an operator name", &part);
	while (!st && match(P, '.')) {
		st = join_domain(&domain, part);
		part = NULL;
		if (!st)
			st = take_name(P, "an operator name after '.'", &part);
	}
	if (!st && !domain && !(domain = dup_span("", 0)))
		st = oom();
	node->domain = domain;
	node->op_type = part;
	return st;
}

static tern_status parse_attrs(struct parser *P, Onnx__NodeProto *node)
{
	TRY(expect(P, '<', "to open the attributes"));
	do {
		if (peek(P) == '>')
			break;
		Onnx__AttributeProto *a;
		ADD_NEW(node->attribute, node->n_attribute, a, Onnx__AttributeProto, ONNX__ATTRIBUTE_PROTO__INIT);
		TRY(take_name(P, "an attribute name", &a->name));
		TRY(parse_attr_rest(P, a));
	} while (match(P, ','));
	return expect(P, '>', "to close the attributes");
}

/* [name] outputs = domain.Op <attributes> (inputs) <attributes> */
static tern_status parse_node(struct parser *P, Onnx__NodeProto *node)
{
	if (match(P, '[')) {
		if (peek(P) == ']') {
			if (!(node->name = dup_span("", 0)))
				return oom();
		} else
			TRY(take_name(P, "the node name", &node->name));
		TRY(expect(P, ']', "after the node name"));
	}
	TRY(parse_id_list(P, &node->output, &node->n_output, false));
	TRY(expect(P, '=', "after the node outputs"));
	TRY(parse_op(P, node));
	if (peek(P) == '<')
		TRY(parse_attrs(P, node));
	TRY(expect(P, '(', "before the node inputs"));
	TRY(parse_id_list(P, &node->input, &node->n_input, false));
	TRY(expect(P, ')', "after the node inputs"));
	if (node->n_attribute == 0 && peek(P) == '<')
		TRY(parse_attrs(P, node));
	return TERN_OK;
}

static tern_status parse_nodes(struct parser *P, Onnx__NodeProto ***nodes, size_t *n)
{
	TRY(expect(P, '{', "to open the nodes"));
	while (!match(P, '}')) {
		if (peek(P) == EOF)
			return fail_at(P, P->p, "the nodes end without a '}'");
		Onnx__NodeProto *node;
		ADD_NEW(*nodes, *n, node, Onnx__NodeProto, ONNX__NODE_PROTO__INIT);
		TRY(parse_node(P, node));
	}
	return TERN_OK;
}

static tern_status parse_value_info(struct parser *P, Onnx__ValueInfoProto *vi, const char **type_at)
{
	*type_at = (peek(P), P->p);
	if (next_is_type(P))
		TRY(parse_type(P, &vi->type));
	return take_name(P, "a value name", &vi->name);
}

/* "= {values}" after a value-info: the initializer of that name and type. */
static tern_status parse_initializer(struct parser *P, Onnx__GraphProto *g, const Onnx__ValueInfoProto *vi,
                                     const char *type_at)
{
	Onnx__TensorProto *t;
	ADD_NEW(g->initializer, g->n_initializer, t, Onnx__TensorProto, ONNX__TENSOR_PROTO__INIT);
	if (!(t->name = dup_span(vi->name, strlen(vi->name))))
		return oom();
	return parse_tensor_data(P, t, vi->type, type_at);
}

/* (inputs) => (outputs) <initializers and value_info> {nodes}, after the graph's name. */
static tern_status parse_graph_body(struct parser *P, Onnx__GraphProto *g)
{
	if (P->depth >= TEXT_MAX_DEPTH)
		return fail_at(P, P->p, "graphs nested more than %d deep", TEXT_MAX_DEPTH);
	P->depth++;
	tern_status st = parse_graph_parts(P, g);
	P->depth--;
	return st;
}

static tern_status parse_graph_parts(struct parser *P, Onnx__GraphProto *g)
{
	const char *type_at;
	if (match(P, '(')) {
		do {
			if (peek(P) == ')')
				break;
			Onnx__ValueInfoProto *vi;
			ADD_NEW(g->input, g->n_input, vi, Onnx__ValueInfoProto, ONNX__VALUE_INFO_PROTO__INIT);
			TRY(parse_value_info(P, vi, &type_at));
			if (match(P, '='))
				TRY(parse_initializer(P, g, vi, type_at));
		} while (match(P, ','));
		TRY(expect(P, ')', "to close the graph inputs"));
	}
	TRY(expect_arrow(P, "between the graph inputs and outputs"));
	TRY(expect(P, '(', "to open the graph outputs"));
	do {
		if (peek(P) == ')')
			break;
		Onnx__ValueInfoProto *vi;
		ADD_NEW(g->output, g->n_output, vi, Onnx__ValueInfoProto, ONNX__VALUE_INFO_PROTO__INIT);
		TRY(parse_value_info(P, vi, &type_at));
	} while (match(P, ','));
	TRY(expect(P, ')', "to close the graph outputs"));
	if (match(P, '<')) {
		do {
			if (peek(P) == '>')
				break;
			Onnx__ValueInfoProto *vi;
			ADD_NEW(g->value_info, g->n_value_info, vi, Onnx__ValueInfoProto, ONNX__VALUE_INFO_PROTO__INIT);
			TRY(parse_value_info(P, vi, &type_at));
			if (match(P, '=')) {
				TRY(parse_initializer(P, g, vi, type_at));
				onnx__value_info_proto__free_unpacked(vi, NULL);
				g->n_value_info--;
			}
		} while (match(P, ','));
		TRY(expect(P, '>', "to close the initializers and value infos"));
	}
	return parse_nodes(P, &g->node, &g->n_node);
}

static tern_status parse_graph(struct parser *P, Onnx__GraphProto *g, bool name_optional)
{
	int c = peek(P);
	if (c == '"' || text_is_ident_start(c) || !name_optional)
		TRY(take_name(P, "a graph name", &g->name));
	else if (!(g->name = dup_span("", 0)))
		return oom();
	return parse_graph_body(P, g);
}

/* ---------------------------------------------------------------- functions and the model */

static tern_status parse_opsets(struct parser *P, Onnx__OperatorSetIdProto ***arr, size_t *n)
{
	TRY(expect(P, '[', "to open the opset imports"));
	do {
		if (peek(P) == ']')
			break;
		Onnx__OperatorSetIdProto *o;
		ADD_NEW(*arr, *n, o, Onnx__OperatorSetIdProto, ONNX__OPERATOR_SET_ID_PROTO__INIT);
		TRY(take_string_value(P, "a domain in quotes", &o->domain));
		TRY(expect(P, ':', "after the opset domain"));
		TRY(read_number(P, N_INT64, &o->version));
		o->has_version = 1;
	} while (match(P, ','));
	return expect(P, ']', "to close the opset imports");
}

/* The "key: value, ..." list of a model or function header; handle reads the value of one key. */
static tern_status parse_header(struct parser *P, void *target,
                                tern_status (*handle)(struct parser *P, void *target, const char *key, size_t n))
{
	if (!match(P, '<'))
		return TERN_OK;
	do {
		if (peek(P) == '>')
			break;
		size_t n = ident_len(P);
		if (!n)
			return fail_expected(P, "a key (ir_version, opset_import, ...)");
		const char *key = P->p;
		P->p += n;
		TRY(expect(P, ':', "after the key"));
		TRY(handle(P, target, key, n));
	} while (match(P, ','));
	return expect(P, '>', "to close the header");
}

static bool key_is(const char *key, size_t n, const char *word)
{
	return strlen(word) == n && !memcmp(key, word, n);
}

static tern_status unknown_key(struct parser *P, const char *key, size_t n, const char *what)
{
	return fail_at(P, key, "unknown %s key '%.*s'", what, (int)(n < 40 ? n : 40), key);
}

static tern_status function_key(struct parser *P, void *target, const char *key, size_t n)
{
	Onnx__FunctionProto *f = target;
	if (key_is(key, n, "domain"))
		return take_string_value(P, "the domain in quotes", &f->domain);
	if (key_is(key, n, "doc_string"))
		return take_string_value(P, "the doc string in quotes", &f->doc_string);
	if (key_is(key, n, "opset_import"))
		return parse_opsets(P, &f->opset_import, &f->n_opset_import);
	return unknown_key(P, key, n, "function");
}

/* <domain: "d", opset_import: [...]> name <attribute names> (inputs) => (outputs) {nodes}. Attribute
 * defaults ("b: int = 3") and value types are read and dropped: this ONNX version has no field for them. */
static tern_status parse_function(struct parser *P, Onnx__FunctionProto *f)
{
	TRY(parse_header(P, f, function_key));
	TRY(take_name(P, "a function name", &f->name));
	if (match(P, '<')) {
		do {
			if (peek(P) == '>')
				break;
			char *name;
			TRY(take_name(P, "an attribute name", &name));
			int c = peek(P);
			if (c != ':' && c != '=') {
				TRY(push_string(&f->attribute, &f->n_attribute, name));
				continue;
			}
			Onnx__AttributeProto *a = malloc(sizeof *a);
			if (!a) {
				free(name);
				return oom();
			}
			*a = (Onnx__AttributeProto)ONNX__ATTRIBUTE_PROTO__INIT;
			a->name = name;
			tern_status st = parse_attr_rest(P, a);
			onnx__attribute_proto__free_unpacked(a, NULL);
			TRY(st);
		} while (match(P, ','));
		TRY(expect(P, '>', "to close the function's attributes"));
	}
	TRY(expect(P, '(', "to open the function inputs"));
	TRY(parse_id_list(P, &f->input, &f->n_input, true));
	TRY(expect(P, ')', "to close the function inputs"));
	TRY(expect_arrow(P, "between the function inputs and outputs"));
	TRY(expect(P, '(', "to open the function outputs"));
	TRY(parse_id_list(P, &f->output, &f->n_output, true));
	TRY(expect(P, ')', "to close the function outputs"));
	if (match(P, '<')) {
		do {
			if (peek(P) == '>')
				break;
			Onnx__ValueInfoProto *vi = malloc(sizeof *vi);
			if (!vi)
				return oom();
			*vi = (Onnx__ValueInfoProto)ONNX__VALUE_INFO_PROTO__INIT;
			const char *type_at;
			tern_status st = parse_value_info(P, vi, &type_at);
			onnx__value_info_proto__free_unpacked(vi, NULL);
			TRY(st);
		} while (match(P, ','));
		TRY(expect(P, '>', "to close the function's value infos"));
	}
	return parse_nodes(P, &f->node, &f->n_node);
}

static tern_status training_graph(struct parser *P, Onnx__GraphProto **g)
{
	if (*g)
		onnx__graph_proto__free_unpacked(*g, NULL);
	NEW(*g, Onnx__GraphProto, ONNX__GRAPH_PROTO__INIT);
	return parse_graph(P, *g, false);
}

static tern_status training_key(struct parser *P, void *target, const char *key, size_t n)
{
	Onnx__TrainingInfoProto *t = target;
	if (key_is(key, n, "initialization"))
		return training_graph(P, &t->initialization);
	if (key_is(key, n, "algorithm"))
		return training_graph(P, &t->algorithm);
	if (key_is(key, n, "initialization_binding"))
		return parse_pairs(P, &t->initialization_binding, &t->n_initialization_binding);
	if (key_is(key, n, "update_binding"))
		return parse_pairs(P, &t->update_binding, &t->n_update_binding);
	return unknown_key(P, key, n, "training_info");
}

static tern_status model_key(struct parser *P, void *target, const char *key, size_t n)
{
	Onnx__ModelProto *m = target;
	if (key_is(key, n, "ir_version")) {
		m->has_ir_version = 1;
		return read_number(P, N_INT64, &m->ir_version);
	}
	if (key_is(key, n, "model_version")) {
		m->has_model_version = 1;
		return read_number(P, N_INT64, &m->model_version);
	}
	if (key_is(key, n, "opset_import"))
		return parse_opsets(P, &m->opset_import, &m->n_opset_import);
	if (key_is(key, n, "metadata_props"))
		return parse_pairs(P, &m->metadata_props, &m->n_metadata_props);
	static const char *const strings[] = {"producer_name", "producer_version", "domain", "doc_string"};
	char **fields[] = {&m->producer_name, &m->producer_version, &m->domain, &m->doc_string};
	for (size_t i = 0; i < TERN_ARRAY_LEN(strings); i++)
		if (key_is(key, n, strings[i]))
			return take_string_value(P, "a string in quotes", fields[i]);
	return unknown_key(P, key, n, "model");
}

/* <header> graph functions..., and training_info blocks on extension lines. */
static tern_status parse_model(struct parser *P, Onnx__ModelProto *m)
{
	TRY(parse_header(P, m, model_key));
	NEW(m->graph, Onnx__GraphProto, ONNX__GRAPH_PROTO__INIT);
	TRY(parse_graph(P, m->graph, true));
	while (peek(P) != EOF) {
		if (P->ext && ident_is(P, "training_info")) {
			P->p += strlen("training_info");
			Onnx__TrainingInfoProto *t;
			ADD_NEW(m->training_info, m->n_training_info, t, Onnx__TrainingInfoProto,
			        ONNX__TRAINING_INFO_PROTO__INIT);
			if (peek(P) != '<')
				return fail_expected(P, "'<' after training_info");
			TRY(parse_header(P, t, training_key));
		} else {
			Onnx__FunctionProto *f;
			ADD_NEW(m->functions, m->n_functions, f, Onnx__FunctionProto, ONNX__FUNCTION_PROTO__INIT);
			TRY(parse_function(P, f));
		}
	}
	return TERN_OK;
}

tern_status tern_text_parse_model(const char *text, size_t len, const char *source, Onnx__ModelProto **out)
{
	*out = NULL;
	if (!text)
		text = "";
	struct parser P = {.start = text, .p = text, .end = text + len};
	/* A byte order mark is no part of the syntax. */
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
		P.p += 3;
	Onnx__ModelProto *m = malloc(sizeof *m);
	if (!m)
		return oom();
	*m = (Onnx__ModelProto)ONNX__MODEL_PROTO__INIT;
	tern_status st = parse_model(&P, m);
	if (st) {
		onnx__model_proto__free_unpacked(m, NULL);
		return st;
	}
	*out = m;
	return TERN_OK;
}
