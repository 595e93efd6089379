/* test_streams.c — the multi-stream executor: seeded random branchy graphs, scheduled with and
 * without a stream cap, run many times on several workers; every output must equal the
 * single-stream run bit for bit. Run under ThreadSanitizer by scripts/test.sh. */
#include "check.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state;
static uint32_t rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng_state >> 33);
}

/* A model with input x: float[64] and output y, built with protobuf-c. */
static tern_status base_model(tern_model **out)
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
	d.dim_value = 64;
	sh.n_dim = 1;
	sh.dim = dims;
	tt.has_elem_type = 1;
	tt.elem_type = TERN_FLOAT;
	tt.shape = &sh;
	tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	tp.tensor_type = &tt;
	x.name = "x";
	x.type = &tp;
	y.name = "y";
	m.has_ir_version = 1;
	m.ir_version = 8;
	op.domain = "";
	op.has_version = 1;
	op.version = 17;
	m.n_opset_import = 1;
	m.opset_import = ops;
	g.name = "branchy";
	g.n_input = g.n_output = 1;
	g.input = in;
	g.output = outs;
	m.graph = &g;
	uint8_t buf[512];
	size_t n = onnx__model_proto__pack(&m, buf);
	return tern_model_load_bytes(buf, n, "branchy", NULL, out);
}

/* Random branches of unary and binary elementwise nodes, joined into y. */
static tern_model *branchy(int n_nodes)
{
	static const char *unary[] = {"Relu", "Sigmoid", "Tanh", "Abs", "Neg"};
	static const char *binary[] = {"Add", "Mul", "Sub"};
	tern_model *m;
	if (base_model(&m) != TERN_OK)
		return NULL;
	tern_graph *g = tern_model_graph(m);
	char(*names)[16] = calloc((size_t)n_nodes + 1, sizeof *names);
	char *used = calloc((size_t)n_nodes + 1, 1);
	strcpy(names[0], "x");
	for (int i = 1; i <= n_nodes; i++) {
		char node[16];
		snprintf(names[i], sizeof names[i], "v%d", i);
		snprintf(node, sizeof node, "n%d", i);
		int lo = i > 8 ? i - 8 : 0;
		int a = lo + (int)(rnd() % (unsigned)(i - lo)), b = (int)(rnd() % (unsigned)i);
		const char *outs[1] = {names[i]};
		used[a] = used[b] = 1;
		if (rnd() % 2) {
			const char *ins[2] = {names[a], names[b]};
			tern_graph_add_node(g, binary[rnd() % 3], "", node, ins, 2, outs, 1);
		} else {
			const char *ins[1] = {names[a]};
			used[b] = b == a ? used[b] : used[b];
			tern_graph_add_node(g, unary[rnd() % 5], "", node, ins, 1, outs, 1);
		}
	}
	/* Sum every unread value into y, so that every branch reaches the output. */
	char acc[16] = "", next[16], join[16];
	int joins = 0;
	for (int i = 1; i <= n_nodes; i++) {
		if (used[i])
			continue;
		if (!*acc) {
			strcpy(acc, names[i]);
			continue;
		}
		snprintf(next, sizeof next, "j%d", joins);
		snprintf(join, sizeof join, "join%d", joins++);
		const char *ins[2] = {acc, names[i]}, *outs[1] = {next};
		tern_graph_add_node(g, "Add", "", join, ins, 2, outs, 1);
		strcpy(acc, next);
	}
	const char *ins[1] = {acc}, *outs[1] = {"y"};
	tern_graph_add_node(g, "Identity", "", "out", ins, 1, outs, 1);
	/* The graph output y was declared before its producer existed: rebuild the IR from the protos. */
	tern_model_sync(m);
	tern_model_build_ir(m);
	free(names);
	free(used);
	return m;
}

static void run_once(tern_model *m, int threads, int single, const tern_tensor *x, tern_tensor *out, int iters)
{
	tern_plan_options o = {.n_threads = threads, .single_stream = single};
	tern_plan *p;
	CHECK_OK(tern_plan_create(m, &o, x, 1, &p));
	if (!p)
		return;
	for (int i = 0; i < iters; i++) {
		CHECK_OK(tern_plan_run(p, x, 1));
		if (i == 0)
			CHECK_OK(tern_tensor_copy(out, tern_plan_output(p, 0)));
		else
			CHECK(memcmp(out->data, tern_plan_output(p, 0)->data, out->nbytes) == 0);
	}
	tern_plan_free(p);
}

int main(void)
{
	for (int trial = 0; trial < 12; trial++) {
		rng_state = (uint64_t)trial * 7919 + 3;
		tern_model *m = branchy(40 + trial * 10);
		CHECK(m != NULL);
		if (!m)
			continue;
		CHECK_OK(tern_model_validate(m));
		tern_tensor x = {0};
		int64_t dims[1] = {64};
		CHECK_OK(tern_tensor_alloc(&x, TERN_FLOAT, 1, dims));
		for (int i = 0; i < 64; i++)
			((float *)x.data)[i] = (float)((int)(rnd() % 2001) - 1000) / 500.0f;
		tern_tensor want = {0};
		run_once(m, 1, 1, &x, &want, 1);
		for (int cap = 0; cap <= 3; cap += 3) {
			tern_schedule *s;
			CHECK_OK(tern_schedule_compute(tern_model_graph(m), cap, &s, NULL));
			char *text = NULL;
			CHECK_OK(tern_schedule_format(s, &text));
			CHECK_OK(tern_model_set_meta(m, TERN_SCHEDULE_KEY, text));
			CHECK(cap || s->n_streams > 1);
			for (int threads = 1; threads <= 3; threads++) {
				tern_tensor got = {0};
				run_once(m, threads, 0, &x, &got, 25);
				CHECK(got.nbytes == want.nbytes && memcmp(got.data, want.data, want.nbytes) == 0);
				tern_tensor_free(&got);
			}
			free(text);
			tern_schedule_free(s);
		}
		tern_tensor_free(&want);
		tern_tensor_free(&x);
		tern_model_free(m);
	}
	return check_report("test_streams");
}
