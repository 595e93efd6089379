/* test_text.c — the ONNX text syntax: handwritten graphs over the whole grammar read, written and read
 * again to the same text and the same proto; inferred attribute types; exact numbers; errors that
 * carry their line and column; and every truncation of a valid text refused or read without fault. */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>

static Onnx__ModelProto *parse(const char *text)
{
	Onnx__ModelProto *m = NULL;
	tern_status st = tern_text_parse_model(text, strlen(text), "test", &m);
	if (st)
		fprintf(stderr, "parse: %s\n", tern_error());
	return m;
}

static char *print(const Onnx__ModelProto *m, int with_weights)
{
	char *out = NULL;
	size_t size = 0;
	if (tern_text_print_model(m, with_weights, &out, &size)) {
		fprintf(stderr, "print: %s\n", tern_error());
		return NULL;
	}
	CHECK(strlen(out) == size);
	return out;
}

static bool same_proto(const Onnx__ModelProto *a, const Onnx__ModelProto *b)
{
	size_t na = onnx__model_proto__get_packed_size(a), nb = onnx__model_proto__get_packed_size(b);
	if (na != nb)
		return false;
	uint8_t *pa = malloc(na ? na : 1), *pb = malloc(nb ? nb : 1);
	onnx__model_proto__pack(a, pa);
	onnx__model_proto__pack(b, pb);
	bool same = memcmp(pa, pb, na) == 0;
	free(pa);
	free(pb);
	return same;
}

/* text -> parse -> print -> parse -> print: the two texts and the two protos are the same. */
static void check_stable(const char *what, const char *text)
{
	Onnx__ModelProto *m1 = parse(text);
	CHECK(m1 != NULL);
	if (!m1) {
		fprintf(stderr, "  in %s\n", what);
		return;
	}
	char *t1 = print(m1, 1);
	Onnx__ModelProto *m2 = t1 ? parse(t1) : NULL;
	char *t2 = m2 ? print(m2, 1) : NULL;
	CHECK(t1 && t2 && strcmp(t1, t2) == 0);
	CHECK(m2 && same_proto(m1, m2));
	if (!t1 || !t2 || strcmp(t1, t2) != 0)
		fprintf(stderr, "  in %s:\n%s\n---\n%s\n", what, t1 ? t1 : "", t2 ? t2 : "");
	free(t1);
	free(t2);
	onnx__model_proto__free_unpacked(m1, NULL);
	if (m2)
		onnx__model_proto__free_unpacked(m2, NULL);
}

static const char *const graphs[] = {
        /* onnx 1.14's printer output, as written */
        "<\n   ir_version: 7,\n   opset_import: [\"\" : 14],\n   producer_name: \"backend-test\"\n>\n"
        "test_gru_defaults (float[1,3,2] X, float[1,15,2] W, float[1,15,5] R) => (float[1,3,5] Y_h) {\n"
        "   , Y_h = GRU <hidden_size = 5> (X, W, R)\n}",

        /* comments, trailing commas, spacing, a model with every header key */
        "# a model\n<ir_version: 8, opset_import: [\"\": 17, \"com.x\" : 2,], producer_name: \"p\",\n"
        " producer_version: \"1.0\", domain: \"org.x\", model_version: 4, doc_string: \"two\nlines \\\"q\\\"\",\n"
        " metadata_props: [\"tern.schedule\": \"s 0\", \"k\": \"\",],>\n"
        "g(float[N, 3] x, int64 n,) => (float[N,3] y,) # outputs\n{\n  y = Relu(x)   # a node\n}\n",

        /* types: scalars, unknown rank, symbolic and unknown dims, seq, map, optional, sparse, untyped */
        "<ir_version: 8, opset_import: [\"\" : 17]>\n"
        "g (float s, float[] r, float[?,M,2] d, seq(float[N]) q, map(string, optional(int64)) p,"
        " sparse_tensor(float[3,3]) z, untyped, \"odd name\") => (float[] y)\n"
        "  <float[?] between, uint8[2] w = {0, 255}, string[2] names = {\"a\", \"b \\\"c\\\"\"}>\n"
        "{ y = Identity(r) }",

        /* attributes of every kind, inferred and declared, before or after the inputs */
        "<ir_version: 8, opset_import: [\"\" : 17, \"x\" : 1]>\n"
        "g (float[2] a) => (float[2] b) {\n"
        "  b = x.Op <i = -3, f = 1.5, e = 2e-3, s = \"str\", is = [1, 2, 3], fs = [1, 2.5], ss = [\"a\", \"b\"],\n"
        "    t = float[2] {1, 2}, tn = int64[2] named {3, 4}, tp = float[2], tps = [float, seq(int64)],\n"
        "    ts = [int32[1] {1}, string {\"s\"}], f2: float = 2, ei: ints = [], ef: floats = [],\n"
        "    ninf = -inf, pnan = NaN, big = 9223372036854775807, small = -9223372036854775808> (a)\n"
        "  [named] c, , d = x.Other (a, , a) <g = body (float[2] u) => (float[2] v) { v = Neg(u) },\n"
        "    gs = [first () => (float o) { o = Constant <value_float = 1.0> () }, \"\" () => () {}]>\n"
        "}",

        /* names in quotes, node names, domains, empty names, a lone empty name */
        "<ir_version: 8, opset_import: [\"\" : 17, \"my-domain\" : 1, \"ai.onnx.ml\" : 3]>\n"
        "\"main graph\" (float[2] \"input.1\") => (float[2] \"out/0\") {\n"
        "  [\"/conv/Conv\"] \"out/0\" = \"my-domain\".Op (\"input.1\")\n"
        "  [] e = ai.onnx.ml.Binarizer <threshold = 1.0> (\"input.1\")\n"
        "  f = OptionalHasElement (\"\")\n"
        "  , g, = Split (\"input.1\", )\n"
        "}",

        /* functions: header, attributes with references and defaults, typed inputs, nested calls */
        "<ir_version: 8, opset_import: [\"\" : 17, \"local\" : 1]>\n"
        "g (float[2] x) => (float[2] y) { y = local.Scale <k = 2.0> (x) }\n"
        "<domain: \"local\", opset_import: [\"\" : 17], doc_string: \"scales\">\n"
        "Scale <k, shift: float = 0.5> (float[2] X) => (Y)\n"
        "{\n  s = Constant <value_float: float = @k> ()\n  Y = Mul (X, s)\n}\n"
        "<domain: \"local\", opset_import: [\"\" : 17]> Twice (X) => (Y) { Y = local.Scale <k: float = 2> (X) }\n",

        /* tensors of every type, exact values, external data */
        "<ir_version: 8, opset_import: [\"\" : 17]>\n"
        "g () => (float[4] y)\n"
        "  <float[4] y = {0.1, -0, inf, 1.40129846e-45}, double[3] d = {0.1, -1e300, 4.9406564584124654e-324},\n"
        "   float16[2] h = {15360, 31744}, bfloat16[1] b = {16256}, int8[2] i8 = {-128, 127},\n"
        "   int16[1] i16 = {-32768}, int32[1] i32 = {2147483647}, int64[1] i64 = {-9223372036854775808},\n"
        "   uint16[1] u16 = {65535}, uint32[1] u32 = {4294967295}, uint64[1] u64 = {18446744073709551615},\n"
        "   bool[2] flags = {1, 0}, complex64[1] c = {1, -2}, complex128[1] cc = {0.5, 0.25},\n"
        "   float[2,0] none = {}, float scalar = {3}, float[2] ext = [\"location\": \"w.bin\", \"offset\": \"0\"]>\n"
        "{ }",

        /* training_info on extension lines, which onnx reads as comments */
        "<ir_version: 8, opset_import: [\"\" : 17]>\n"
        "g (float[2] x) => (float[2] y) <float[2] w = {1, 2}> { y = Add (x, w) }\n"
        "#@ training_info <\n"
        "#@    algorithm: step (float[2] g) => (float[2] w_new) { w_new = Sub (w, g) },\n"
        "#@    update_binding: [\"w\": \"w_new\"], initialization_binding: [\"w\": \"line\\nbreak\"]\n"
        "#@ >\n",
};

static void test_stable(void)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(graphs); i++) {
		char what[32];
		snprintf(what, sizeof what, "graph %zu", i);
		check_stable(what, graphs[i]);
	}
}

static const Onnx__AttributeProto *find_attr(const Onnx__NodeProto *n, const char *name)
{
	for (size_t i = 0; i < n->n_attribute; i++)
		if (!strcmp(n->attribute[i]->name, name))
			return n->attribute[i];
	return NULL;
}

#define ATTR_TYPE(n, name, T)                                                                        \
	do {                                                                                         \
		const Onnx__AttributeProto *a_ = find_attr(n, name);                                 \
		CHECK(a_ && a_->has_type && a_->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##T); \
	} while (0)

static void test_attributes(void)
{
	Onnx__ModelProto *m = parse(graphs[3]);
	CHECK(m != NULL);
	if (!m)
		return;
	const Onnx__NodeProto *n = m->graph->node[0];
	CHECK(!strcmp(n->domain, "x") && !strcmp(n->op_type, "Op"));
	ATTR_TYPE(n, "i", INT);
	ATTR_TYPE(n, "f", FLOAT);
	ATTR_TYPE(n, "e", FLOAT);
	ATTR_TYPE(n, "s", STRING);
	ATTR_TYPE(n, "is", INTS);
	ATTR_TYPE(n, "fs", FLOATS);
	ATTR_TYPE(n, "ss", STRINGS);
	ATTR_TYPE(n, "t", TENSOR);
	ATTR_TYPE(n, "tp", TYPE_PROTO);
	ATTR_TYPE(n, "tps", TYPE_PROTOS);
	ATTR_TYPE(n, "ts", TENSORS);
	ATTR_TYPE(n, "f2", FLOAT);
	ATTR_TYPE(n, "ei", INTS);
	ATTR_TYPE(n, "ninf", FLOAT);
	const Onnx__AttributeProto *a = find_attr(n, "fs");
	CHECK(a && a->n_floats == 2 && a->floats[0] == 1.0f && a->floats[1] == 2.5f && a->n_ints == 0);
	a = find_attr(n, "f2");
	CHECK(a && a->has_f && a->f == 2.0f);
	a = find_attr(n, "ninf");
	CHECK(a && isinf(a->f) && a->f < 0);
	a = find_attr(n, "pnan");
	CHECK(a && isnan(a->f));
	a = find_attr(n, "small");
	CHECK(a && a->i == INT64_MIN);
	a = find_attr(n, "tn");
	CHECK(a && a->t && !strcmp(a->t->name, "named") && a->t->n_int64_data == 2 && a->t->int64_data[1] == 4);
	const Onnx__NodeProto *o = m->graph->node[1];
	CHECK(o->name && !strcmp(o->name, "named"));
	CHECK(o->n_output == 3 && !strcmp(o->output[1], "") && o->n_input == 3 && !strcmp(o->input[1], ""));
	ATTR_TYPE(o, "g", GRAPH);
	ATTR_TYPE(o, "gs", GRAPHS);
	a = find_attr(o, "gs");
	CHECK(a && a->n_graphs == 2 && !strcmp(a->graphs[1]->name, ""));
	onnx__model_proto__free_unpacked(m, NULL);

	m = parse(graphs[4]);
	CHECK(m != NULL);
	if (!m)
		return;
	CHECK(!strcmp(m->graph->name, "main graph"));
	CHECK(!strcmp(m->graph->node[0]->domain, "my-domain") && !strcmp(m->graph->node[0]->name, "/conv/Conv"));
	CHECK(!strcmp(m->graph->node[1]->domain, "ai.onnx.ml") && !strcmp(m->graph->node[1]->name, ""));
	CHECK(m->graph->node[2]->n_input == 1 && !strcmp(m->graph->node[2]->input[0], ""));
	/* "(x, )": a comma with no name after it is an empty name, as onnx 1.14 reads it */
	const Onnx__NodeProto *split = m->graph->node[3];
	CHECK(split->n_output == 3 && !strcmp(split->output[0], "") && !strcmp(split->output[2], ""));
	CHECK(split->n_input == 2 && !strcmp(split->input[1], ""));
	onnx__model_proto__free_unpacked(m, NULL);

	m = parse(graphs[5]);
	CHECK(m && m->n_functions == 2);
	if (m) {
		const Onnx__FunctionProto *f = m->functions[0];
		CHECK(!strcmp(f->name, "Scale") && f->n_attribute == 1 && !strcmp(f->attribute[0], "k"));
		CHECK(f->n_input == 1 && !strcmp(f->input[0], "X") && !strcmp(f->doc_string, "scales"));
		a = find_attr(f->node[0], "value_float");
		CHECK(a && a->ref_attr_name && !strcmp(a->ref_attr_name, "k") &&
		      a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
		onnx__model_proto__free_unpacked(m, NULL);
	}

	m = parse(graphs[7]);
	CHECK(m && m->n_training_info == 1);
	if (m && m->n_training_info == 1) {
		const Onnx__TrainingInfoProto *t = m->training_info[0];
		CHECK(t->algorithm && !strcmp(t->algorithm->name, "step") && t->n_update_binding == 1);
		CHECK(t->n_initialization_binding == 1 && !strcmp(t->initialization_binding[0]->value, "line\nbreak"));
	}
	if (m)
		onnx__model_proto__free_unpacked(m, NULL);
}

/* Random bit patterns, written and read back: the same bits (every NaN becomes a canonical one). */
static void test_exact_numbers(void)
{
	const char *text = "<ir_version: 8, opset_import: [\"\" : 17]>\n"
	                   "g () => (float[1] f) <float[1] f = {0}, double[1] d = {0}> { }";
	Onnx__ModelProto *m = parse(text);
	CHECK(m != NULL);
	if (!m)
		return;
	enum { N = 4096 };
	Onnx__TensorProto *f = m->graph->initializer[0], *d = m->graph->initializer[1];
	f->float_data = realloc(f->float_data, N * sizeof(float));
	d->double_data = realloc(d->double_data, N * sizeof(double));
	f->n_float_data = d->n_double_data = f->dims[0] = d->dims[0] = N;
	uint64_t state = 0x9e3779b97f4a7c15u;
	for (int i = 0; i < N; i++) {
		state = state * 6364136223846793005u + 1442695040888963407u;
		uint32_t b32 = (uint32_t)(state >> 32);
		uint64_t b64 = state ^ (state << 17);
		if (i < 8) {
			/* the edges: zeros, subnormals, the largest values, infinities */
			static const uint32_t e32[] = {0,           0x80000000u, 1,           0x807fffffu,
			                               0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u};
			static const uint64_t e64[] = {0,
			                               1ull << 63,
			                               1,
			                               0x800fffffffffffffull,
			                               0x7fefffffffffffffull,
			                               0xffefffffffffffffull,
			                               0x7ff0000000000000ull,
			                               0xfff0000000000000ull};
			b32 = e32[i];
			b64 = e64[i];
		}
		memcpy(&f->float_data[i], &b32, 4);
		memcpy(&d->double_data[i], &b64, 8);
		if (isnan(f->float_data[i]))
			f->float_data[i] = signbit(f->float_data[i]) ? -NAN : NAN;
		if (isnan(d->double_data[i]))
			d->double_data[i] = signbit(d->double_data[i]) ? -(double)NAN : (double)NAN;
	}
	char *t = print(m, 1);
	Onnx__ModelProto *m2 = t ? parse(t) : NULL;
	CHECK(m2 && m2->graph->initializer[0]->n_float_data == N && m2->graph->initializer[1]->n_double_data == N);
	if (m2 && m2->graph->initializer[0]->n_float_data == N && m2->graph->initializer[1]->n_double_data == N) {
		CHECK(!memcmp(m2->graph->initializer[0]->float_data, f->float_data, N * sizeof(float)));
		CHECK(!memcmp(m2->graph->initializer[1]->double_data, d->double_data, N * sizeof(double)));
	}
	/* Without weights the large tensors are elided, and that text is refused when read. */
	char *elided = print(m, 0);
	CHECK(elided && strstr(elided, "float[4096] f = ...") && strstr(elided, "double[4096] d = ..."));
	Onnx__ModelProto *none = NULL;
	CHECK(elided && tern_text_parse_model(elided, strlen(elided), "t", &none) == TERN_EDATA && !none);
	CHECK(strstr(tern_error(), "without weights") != NULL);
	free(elided);
	free(t);
	onnx__model_proto__free_unpacked(m, NULL);
	if (m2)
		onnx__model_proto__free_unpacked(m2, NULL);

	/* onnx's layout for a float attribute with an integral value would read back as an int */
	m = parse("<ir_version: 8, opset_import: [\"\" : 17]> g (float x) => (float y) "
	          "{ y = LeakyRelu <alpha: float = 2> (x) }");
	t = m ? print(m, 1) : NULL;
	CHECK(t && strstr(t, "<alpha = 2.0>"));
	free(t);
	if (m)
		onnx__model_proto__free_unpacked(m, NULL);
}

struct bad {
	const char *text;
	const char *message; /* how the error starts */
};

static const struct bad bad_texts[] = {
        {"", "line 1, column 1: expected '=>'"},
        {"<ir_version: x>", "line 1, column 14: expected a number"},
        {"<\n  ir_version: 8,\n  colour: \"red\"\n> g () => () {}", "line 3, column 3: unknown model key 'colour'"},
        {"g (float x) => (float y) {\n  y = Relu (x\n}", "line 3, column 1: expected ')' after the node inputs"},
        {"g (float x) => (float y) {\n  y = Relu (x)\n", "line 3, column 1: the nodes end without a '}'"},
        {"g (float x) = > (float y) {}", "line 1, column 13: expected '=>'"},
        {"g () => () { y = C <s = \"open> () }", "line 1, column 25: string not closed"},
        {"g () => () { y = C <a = 99999999999999999999> () }",
         "line 1, column 25: integer 99999999999999999999 is out of range"},
        {"g () => () { y = C <a = 1e999> () }", "line 1, column 25: number 1e999 is out of the range of float"},
        {"g () => () { y = C <a: int = 1.5> () }",
         "line 1, column 30: attribute 'a' is declared int but its value is a float"},
        {"g () => () { y = C <a = []> () }", "line 1, column 26: the empty list of attribute 'a' needs a list type"},
        {"g () => () { y = C <a = [1, \"s\"]> () }",
         "line 1, column 29: attribute 'a': a list of ints cannot hold a string"},
        {"g () => () <float[N] w = {1}> {}", "line 1, column 13: dimension 0 of a tensor value must be a number"},
        {"g () => () <int8[1] w = {1.5}> {}", "line 1, column 26: expected an integer, found 1.5"},
        {"g () => () <int8[1] w = {3000000000}> {}", "line 1, column 26: value 3000000000 does not fit a int8 tensor"},
        {"g () => () <uint64[1] w = {-1}> {}", "line 1, column 28: expected an unsigned integer"},
        {"g () => () <float[2] w = ...> {}", "line 1, column 26: the tensor's values were left out"},
        {"g (flot x) => () {}", "line 1, column 9: expected ')' to close the graph inputs, found 'x'"},
        {"g (map(float16[2], int64) x) => () {}", "line 1, column 15: expected ',' after the key type of a map"},
        {"g () => () {} <domain: \"d\"> f (x) => (y) { y = Op (x) } trailing",
         "line 1, column 65: expected '(' to open the function inputs"},
        {"g () => () {} #@ training_info <update_binding: [\"a\" \"b\"]>",
         "line 1, column 54: expected ':' after the key"},
        {"g () => () { y = C <a = @> () }", "line 1, column 26: expected the name of a function attribute"},
        {"g () => () { y = C <a = nonsense> () }", "line 1, column 33: expected '=>'"},
        {"g () => () { y = C <a = 1.5.2> () }", "line 1, column 28: expected '>' to close the attributes"},
};

static void test_errors(void)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(bad_texts); i++) {
		Onnx__ModelProto *m = (Onnx__ModelProto *)1;
		tern_status st = tern_text_parse_model(bad_texts[i].text, strlen(bad_texts[i].text), "t", &m);
		bool ok = st == TERN_EDATA && m == NULL &&
		        !strncmp(tern_error(), bad_texts[i].message, strlen(bad_texts[i].message));
		CHECK(ok);
		if (!ok)
			fprintf(stderr, "  text %zu: got \"%s\", want \"%s...\"\n", i, tern_error(),
			        bad_texts[i].message);
	}

	/* nesting deep enough to exhaust a stack is refused */
	size_t depth = 100000;
	char *deep = malloc(depth * 4 + 4), *p = deep;
	memcpy(p, "g (", 3);
	p += 3;
	for (size_t i = 0; i < depth; i++, p += 4)
		memcpy(p, "seq(", 4);
	*p = '\0';
	Onnx__ModelProto *m = NULL;
	CHECK(tern_text_parse_model(deep, strlen(deep), "t", &m) == TERN_EDATA && !m);
	CHECK(strstr(tern_error(), "nested more than") != NULL);
	free(deep);
}

/* Every prefix of a valid text, and the text with each byte replaced, is read or refused cleanly (the
 * sanitizers catch the rest). */
static void test_truncations(void)
{
	for (size_t g = 0; g < TERN_ARRAY_LEN(graphs); g++) {
		const char *text = graphs[g];
		size_t len = strlen(text);
		for (size_t n = 0; n <= len; n++) {
			char *copy = malloc(n ? n : 1);
			memcpy(copy, text, n);
			Onnx__ModelProto *m = NULL;
			tern_status st = tern_text_parse_model(copy, n, "t", &m);
			CHECK(st == TERN_OK || st == TERN_EDATA);
			CHECK((st == TERN_OK) == (m != NULL));
			if (m)
				onnx__model_proto__free_unpacked(m, NULL);
			free(copy);
		}
		char *copy = malloc(len);
		for (size_t i = 0; i < len; i++) {
			memcpy(copy, text, len);
			copy[i] = "\"#@{}[]<>(),=:.-0a\\\n"[i % 20];
			Onnx__ModelProto *m = NULL;
			tern_status st = tern_text_parse_model(copy, len, "t", &m);
			CHECK(st == TERN_OK || st == TERN_EDATA);
			if (m)
				onnx__model_proto__free_unpacked(m, NULL);
		}
		free(copy);
	}
}

int main(void)
{
	test_stable();
	test_attributes();
	test_exact_numbers();
	test_errors();
	test_truncations();
	return check_report("test_text");
}
