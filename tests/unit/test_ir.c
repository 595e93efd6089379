/* test_ir.c — the IR over ONNX protos: building, lookup, order, validation faults, editing and the
 * lossless binary round trip. Models are built with protobuf-c directly so that this test depends on
 * nothing but the loader. */
#include "check.h"
#include "internal.h"

#include <stdlib.h>

/* A tiny model builder: nodes "out = op(in0, in1)" in the order given. */
typedef struct spec_node {
	const char *name, *op, *in0, *in1, *out;
} spec_node;

static char *dup(const char *s)
{
	return tern_strdup(s);
}

static Onnx__ValueInfoProto *value_info(const char *name, int dtype, int64_t dim0)
{
	Onnx__ValueInfoProto *vi = malloc(sizeof *vi);
	onnx__value_info_proto__init(vi);
	vi->name = dup(name);
	vi->type = malloc(sizeof *vi->type);
	onnx__type_proto__init(vi->type);
	vi->type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	vi->type->tensor_type = malloc(sizeof *vi->type->tensor_type);
	onnx__type_proto__tensor__init(vi->type->tensor_type);
	vi->type->tensor_type->has_elem_type = 1;
	vi->type->tensor_type->elem_type = dtype;
	Onnx__TensorShapeProto *sh = malloc(sizeof *sh);
	onnx__tensor_shape_proto__init(sh);
	sh->n_dim = 1;
	sh->dim = malloc(sizeof *sh->dim);
	sh->dim[0] = malloc(sizeof **sh->dim);
	onnx__tensor_shape_proto__dimension__init(sh->dim[0]);
	sh->dim[0]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
	sh->dim[0]->dim_value = dim0;
	vi->type->tensor_type->shape = sh;
	return vi;
}

/* Packs a model with inputs x, y (float[4]), the given nodes, output `out`. */
static void *make_model(const spec_node *nodes, size_t n, const char *out, int64_t opset, size_t *size)
{
	Onnx__ModelProto *m = malloc(sizeof *m);
	onnx__model_proto__init(m);
	m->has_ir_version = 1;
	m->ir_version = 8;
	m->n_opset_import = 1;
	m->opset_import = malloc(sizeof *m->opset_import);
	m->opset_import[0] = malloc(sizeof **m->opset_import);
	onnx__operator_set_id_proto__init(m->opset_import[0]);
	m->opset_import[0]->domain = dup("");
	m->opset_import[0]->has_version = 1;
	m->opset_import[0]->version = opset;
	Onnx__GraphProto *g = malloc(sizeof *g);
	onnx__graph_proto__init(g);
	g->name = dup("g");
	g->n_input = 2;
	g->input = malloc(2 * sizeof *g->input);
	g->input[0] = value_info("x", TERN_FLOAT, 4);
	g->input[1] = value_info("y", TERN_FLOAT, 4);
	g->n_output = 1;
	g->output = malloc(sizeof *g->output);
	g->output[0] = value_info(out, TERN_FLOAT, 4);
	g->n_node = n;
	g->node = malloc(n * sizeof *g->node);
	for (size_t i = 0; i < n; i++) {
		Onnx__NodeProto *np = malloc(sizeof *np);
		onnx__node_proto__init(np);
		np->name = dup(nodes[i].name);
		np->op_type = dup(nodes[i].op);
		np->n_input = nodes[i].in1 ? 2 : 1;
		np->input = malloc(2 * sizeof *np->input);
		np->input[0] = dup(nodes[i].in0);
		if (nodes[i].in1)
			np->input[1] = dup(nodes[i].in1);
		np->n_output = 1;
		np->output = malloc(sizeof *np->output);
		np->output[0] = dup(nodes[i].out);
		g->node[i] = np;
	}
	m->graph = g;
	*size = onnx__model_proto__get_packed_size(m);
	void *buf = malloc(*size);
	onnx__model_proto__pack(m, buf);
	onnx__model_proto__free_unpacked(m, NULL);
	return buf;
}

static tern_status load(const spec_node *nodes, size_t n, const char *out, int64_t opset, tern_model **m)
{
	size_t size;
	void *bytes = make_model(nodes, n, out, opset, &size);
	tern_status st = tern_model_load_bytes(bytes, size, "t.onnx", NULL, m);
	free(bytes);
	return st;
}

static void test_build_and_order(void)
{
	/* Listed out of order: c needs b. */
	const spec_node nodes[] = {{"n2", "Mul", "b", "y", "c"}, {"n1", "Add", "x", "y", "b"}};
	tern_model *m;
	CHECK_OK(load(nodes, 2, "c", 17, &m));
	if (!m)
		return;
	CHECK_OK(tern_model_validate(m));
	tern_graph *g = tern_model_graph(m);
	tern_value *b = tern_graph_find(g, "b");
	CHECK(b && b->producer && strcmp(b->producer->name, "n1") == 0);
	CHECK(b && b->n_consumers == 1 && strcmp(b->consumers[0]->name, "n2") == 0);
	tern_value *y = tern_graph_find(g, "y");
	CHECK(y && y->n_consumers == 2 && (y->flags & TERN_VALUE_INPUT));
	CHECK(tern_model_num_inputs(m) == 2 && strcmp(tern_model_input_name(m, 1), "y") == 0);
	tern_node **order;
	size_t count;
	CHECK_OK(tern_graph_toposort(g, &order, &count));
	CHECK(count == 2 && strcmp(order[0]->name, "n1") == 0 && strcmp(order[1]->name, "n2") == 0);
	free(order);
	CHECK(tern_model_opset(m, "") == 17 && tern_model_opset(m, "ai.onnx") == 17 && tern_model_opset(m, "x") == -1);
	tern_model_free(m);
}

static void test_faults(void)
{
	tern_model *m = NULL;
	const spec_node cycle[] = {{"a", "Add", "x", "d", "c"}, {"b", "Relu", "c", NULL, "d"}};
	CHECK_OK(load(cycle, 2, "d", 17, &m));
	CHECK(m && tern_model_validate(m) == TERN_EDATA && strstr(tern_error(), "cycle"));
	tern_model_free(m);

	const spec_node undefined[] = {{"a", "Add", "x", "nowhere", "c"}};
	CHECK_OK(load(undefined, 1, "c", 17, &m));
	CHECK(m && tern_model_validate(m) == TERN_EDATA && strstr(tern_error(), "node 'a' (Add)") &&
	      strstr(tern_error(), "'nowhere'"));
	tern_model_free(m);

	const spec_node twice[] = {{"a", "Add", "x", "y", "c"}, {"b", "Mul", "x", "y", "c"}};
	CHECK(load(twice, 2, "c", 17, &m) == TERN_EDATA && strstr(tern_error(), "node 'b' (Mul)"));
	CHECK(m == NULL);

	const spec_node ok[] = {{"a", "Add", "x", "y", "c"}};
	CHECK_OK(load(ok, 1, "c", 9999, &m));
	CHECK(m && tern_model_validate(m) == TERN_EDATA && strstr(tern_error(), "9999"));
	tern_model_free(m);

	CHECK(tern_model_load_bytes("", 0, "empty.onnx", NULL, &m) == TERN_EDATA && strstr(tern_error(), "empty.onnx"));
	const unsigned char junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
	CHECK(tern_model_load_bytes(junk, sizeof junk, "junk", NULL, &m) == TERN_EDATA);
	CHECK(tern_model_load("/nonexistent/model.onnx", &m) == TERN_ENOINPUT);
}

static void test_edit_round_trip(void)
{
	const spec_node nodes[] = {{"n1", "Add", "x", "y", "b"}, {"n2", "Relu", "b", NULL, "c"}};
	tern_model *m;
	CHECK_OK(load(nodes, 2, "c", 17, &m));
	if (!m)
		return;
	tern_graph *g = tern_model_graph(m);
	/* Replace Relu by Sigmoid reading the same value. */
	const char *in[] = {"b"}, *out[] = {"c2"};
	tern_node *s = tern_graph_add_node(g, "Sigmoid", "", "n3", in, 1, out, 1);
	CHECK(s != NULL);
	tern_value *c = tern_graph_find(g, "c");
	tern_value *c2 = tern_graph_find(g, "c2");
	tern_value_replace_uses(g, c, c2);
	tern_graph_remove_node(g, g->nodes[1]);
	CHECK_OK(tern_node_add_attr_int(s, "k", 3));
	CHECK_OK(tern_model_set_meta(m, "tern.schedule", "n1 0 -"));
	CHECK_OK(tern_model_set_meta(m, "other", "v"));
	CHECK(tern_model_drop_meta_prefix(m, "tern.") == 1 && tern_model_meta(m, "other"));
	void *bytes;
	size_t size;
	CHECK_OK(tern_model_save_bytes(m, &bytes, &size));
	tern_model *m2;
	CHECK_OK(tern_model_load_bytes(bytes, size, "m2", NULL, &m2));
	if (m2) {
		CHECK_OK(tern_model_validate(m2));
		tern_graph *g2 = tern_model_graph(m2);
		CHECK(g2->n_nodes == 2 && strcmp(g2->nodes[1]->op_type, "Sigmoid") == 0);
		CHECK(tern_attr_int(g2->nodes[1], "k", 0) == 3 && tern_attr_int(g2->nodes[1], "absent", 7) == 7);
		CHECK(strcmp(g2->outputs[0]->name, "c2") == 0);
		/* Saving again gives the same bytes: the round trip is stable. */
		void *bytes2;
		size_t size2;
		CHECK_OK(tern_model_save_bytes(m2, &bytes2, &size2));
		CHECK(size2 == size && memcmp(bytes, bytes2, size) == 0);
		free(bytes2);
		tern_model_free(m2);
	}
	free(bytes);
	tern_model_free(m);
}

static void test_unknown_fields_survive(void)
{
	/* A model field this proto version does not know (number 99, varint 5) must survive a round trip. */
	const spec_node nodes[] = {{"n1", "Add", "x", "y", "c"}};
	size_t size;
	unsigned char *bytes = make_model(nodes, 1, "c", 17, &size);
	unsigned char *extended = malloc(size + 3);
	memcpy(extended, bytes, size);
	extended[size] = 0x98; /* tag (99 << 3 | 0) as a varint: 0x318 */
	extended[size + 1] = 0x06;
	extended[size + 2] = 0x05;
	tern_model *m;
	CHECK_OK(tern_model_load_bytes(extended, size + 3, "x", NULL, &m));
	if (m) {
		void *out;
		size_t n;
		CHECK_OK(tern_model_save_bytes(m, &out, &n));
		CHECK(n == size + 3);
		CHECK(n == size + 3 && memcmp((unsigned char *)out + size, extended + size, 3) == 0);
		free(out);
		tern_model_free(m);
	}
	free(bytes);
	free(extended);
}

int main(void)
{
	test_build_and_order();
	test_faults();
	test_edit_round_trip();
	test_unknown_fields_survive();
	return check_report("test_ir");
}
