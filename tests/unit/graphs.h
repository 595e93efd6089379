/* graphs.h — what the graph-building unit tests share: a seeded generator and a one-input model,
 * packed with protobuf-c, that tests then grow with the IR editing API. */
#ifndef TERN_TEST_GRAPHS_H
#define TERN_TEST_GRAPHS_H

#include "internal.h"

static uint64_t rng_state;

static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

/* A model with input x: float[dim] and one graph output named `output`. */
static tern_status one_input_model(const char *output, int64_t dim, tern_model **out)
{
	Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
	Onnx__OperatorSetIdProto op = ONNX__OPERATOR_SET_ID_PROTO__INIT, *ops[1] = {&op};
	Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
	Onnx__ValueInfoProto x = ONNX__VALUE_INFO_PROTO__INIT, y = ONNX__VALUE_INFO_PROTO__INIT;
	Onnx__ValueInfoProto *in[1] = {&x}, *outs[1] = {&y};
	Onnx__TypeProto tp = ONNX__TYPE_PROTO__INIT;
	Onnx__TypeProto__Tensor tt = ONNX__TYPE_PROTO__TENSOR__INIT;
	Onnx__TensorShapeProto sh = ONNX__TENSOR_SHAPE_PROTO__INIT;
	Onnx__TensorShapeProto__Dimension d = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT, *dims[1] = {&d};
	d.value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
	d.dim_value = dim;
	sh.n_dim = 1;
	sh.dim = dims;
	tt.has_elem_type = 1;
	tt.elem_type = TERN_FLOAT;
	tt.shape = &sh;
	tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp.tensor_type = &tt;
	x.name = "x";
	x.type = &tp;
	y.name = (char *)output;
	m.has_ir_version = 1;
	m.ir_version = 8;
	op.domain = "";
	op.has_version = 1;
	op.version = 17;
	m.n_opset_import = 1;
	m.opset_import = ops;
	g.name = "test";
	g.n_input = g.n_output = 1;
	g.input = in;
	g.output = outs;
	m.graph = &g;
	uint8_t buf[512];
	size_t n = onnx__model_proto__pack(&m, buf);
	return tern_model_load_bytes(buf, n, "test", NULL, out);
}

#endif
