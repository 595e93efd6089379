/* test_release.c — tern_plan_options.release_weights: an initializer that every reader packed while
 * planning has its bytes freed from the model, and one that anything else reads (an elementwise node,
 * the caller as a graph output, a subgraph) keeps them; either way the outputs equal those of a plan
 * that releases nothing, bit for bit. Under the sanitizer build a kernel that still read a freed
 * weight would be a use after free. Also: a binary model loaded from a file (read through a mapping,
 * each large tensor copied once) gives the same tensors as the same bytes loaded from memory. */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADER "<ir_version: 8, opset_import: [\"\" : 17]>\n"

/* w: 4 x 3 x 3 x 3 conv weights; m: 16 x 5 product weights; both deterministic */
static void append_values(char *buf, size_t cap, int64_t n, double scale)
{
	size_t len = strlen(buf);
	for (int64_t i = 0; i < n; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%.3f", i ? "," : "", sin((double)(i + 1) * 0.7) * scale);
}

static char *model_text_c(const char *signature, const char *body, int cout)
{
	size_t cap = 1 << 18;
	char *t = malloc(cap);
	snprintf(t, cap, HEADER "g %s <float[%d,3,3,3] w = {", signature, cout);
	append_values(t, cap, cout * 3 * 3 * 3, 0.5);
	strcat(t, "}, float[16,5] m = {");
	append_values(t, cap, 16 * 5, 0.3);
	strcat(t, "}> {\n");
	strcat(t, body);
	strcat(t, "}\n");
	return t;
}

static char *model_text(const char *signature, const char *body)
{
	return model_text_c(signature, body, 4);
}

/* text, loaded and written as binary ONNX (tensors as raw_data, as exporters write them), loaded */
static tern_model *binary_model(const char *text, const char *what)
{
	tern_model *m = NULL, *b = NULL;
	CHECK_OK(tern_model_load_bytes(text, strlen(text), what, NULL, &m));
	/* the text syntax gives float_data: move each tensor's floats to raw_data */
	for (size_t i = 0; m && i < m->proto->graph->n_initializer; i++) {
		Onnx__TensorProto *tp = m->proto->graph->initializer[i];
		if (!tp->n_float_data)
			continue;
		tp->raw_data.len = tp->n_float_data * sizeof(float);
		tp->raw_data.data = malloc(tp->raw_data.len);
		memcpy(tp->raw_data.data, tp->float_data, tp->raw_data.len);
		tp->has_raw_data = 1;
		free(tp->float_data);
		tp->float_data = NULL;
		tp->n_float_data = 0;
	}
	void *bytes = NULL;
	size_t size = 0;
	if (m)
		CHECK_OK(tern_model_save_bytes(m, &bytes, &size));
	if (bytes)
		CHECK_OK(tern_model_load_bytes(bytes, size, what, NULL, &b));
	free(bytes);
	tern_model_free(m);
	return b;
}

static const Onnx__TensorProto *initializer(tern_model *m, const char *name)
{
	const tern_value *v = tern_graph_find(m->graph, name);
	return v && (v->flags & TERN_VALUE_INITIALIZER) ? v->initializer : NULL;
}

/* Plans text twice (releasing and not) on the same input; checks the outputs agree, and which of w and
 * m kept their bytes. */
static void case_release(const char *what, const char *signature, const char *body, int w_kept, int m_kept)
{
	char *text = model_text(signature, body);
	tern_model *keep = binary_model(text, what), *rel = binary_model(text, what);
	free(text);
	if (!keep || !rel) {
		tern_model_free(keep);
		tern_model_free(rel);
		return;
	}
	int64_t dims[4] = {1, 3, 4, 4};
	tern_tensor x = {0};
	CHECK_OK(tern_tensor_alloc(&x, TERN_FLOAT, 4, dims));
	for (int64_t i = 0; i < 48; i++)
		((float *)x.data)[i] = (float)cos((double)i * 0.37);
	tern_plan_options o0 = {.n_threads = 1}, o1 = {.n_threads = 1, .release_weights = 1};
	tern_plan *p0 = NULL, *p1 = NULL;
	CHECK_OK(tern_plan_create(keep, &o0, &x, 1, &p0));
	CHECK_OK(tern_plan_create(rel, &o1, &x, 1, &p1));
	if (p0 && p1) {
		for (int run = 0; run < 2; run++) {
			CHECK_OK(tern_plan_run(p0, &x, 1));
			CHECK_OK(tern_plan_run(p1, &x, 1));
			CHECK(tern_plan_num_outputs(p0) == tern_plan_num_outputs(p1));
			for (int k = 0; k < tern_plan_num_outputs(p0); k++) {
				const tern_tensor *a = tern_plan_output(p0, k), *b = tern_plan_output(p1, k);
				CHECK(a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0);
			}
		}
		const Onnx__TensorProto *w = initializer(rel, "w"), *m = initializer(rel, "m");
		if (w_kept >= 0)
			CHECK(w && (w->raw_data.len > 0) == (w_kept == 1));
		if (m_kept >= 0)
			CHECK(m && (m->raw_data.len > 0) == (m_kept == 1));
		/* the plan that releases nothing leaves every byte */
		w = initializer(keep, "w");
		CHECK(w && w->raw_data.len == 4 * 27 * sizeof(float));
		if (check_failures)
			fprintf(stderr, "  (case: %s)\n", what);
	}
	tern_plan_free(p0);
	tern_plan_free(p1);
	tern_tensor_free(&x);
	tern_model_free(keep);
	tern_model_free(rel);
}

/* The same binary model from a file and from memory: the same initializer bytes. */
static void case_file(void)
{
	/* 64 x 27 floats: large enough to be cut out of the message and copied from the mapping */
	char *text = model_text_c("(float[1,3,4,4] x) => (float[1,64,4,4] y)", "   y = Conv <pads = [1,1,1,1]> (x, w)\n", 64);
	tern_model *m = binary_model(text, "text");
	free(text);
	if (!m)
		return;
	char path[] = "/tmp/test_release.XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	if (fd < 0) {
		tern_model_free(m);
		return;
	}
	void *bytes = NULL;
	size_t size = 0;
	CHECK_OK(tern_model_save_bytes(m, &bytes, &size));
	CHECK(bytes && write(fd, bytes, size) == (ssize_t)size);
	free(bytes);
	close(fd);
	tern_model *f = NULL;
	CHECK_OK(tern_model_load(path, &f));
	unlink(path);
	const Onnx__TensorProto *a = initializer(m, "w"), *b = f ? initializer(f, "w") : NULL;
	CHECK(a && b && a->raw_data.len == b->raw_data.len && a->raw_data.len == 64 * 27 * sizeof(float) &&
	      memcmp(a->raw_data.data, b->raw_data.data, a->raw_data.len) == 0);
	tern_model_free(m);
	tern_model_free(f);
}

int main(void)
{
	const char *sig1 = "(float[1,3,4,4] x) => (float[1,4,4,4] y)";
	case_release("a convolution's weight", sig1, "   y = Conv <pads = [1,1,1,1]> (x, w)\n", 0, -1);
	case_release("a weight another node reads when it runs",
	             "(float[1,3,4,4] x) => (float[1,4,4,4] y, float[4,3,3,3] w2)",
	             "   y = Conv <pads = [1,1,1,1]> (x, w)\n"
	             "   s = ReduceSum <keepdims = 0> (x)\n"
	             "   w2 = Mul (w, s)\n",
	             1, -1);
	/* a node folded while planning has finished reading: it does not keep the weight */
	case_release("a weight a folded node read", "(float[1,3,4,4] x) => (float[1,4,4,4] y, float[4,3,3,3] w2)",
	             "   y = Conv <pads = [1,1,1,1]> (x, w)\n"
	             "   w2 = Add (w, w)\n",
	             0, -1);
	case_release("a weight that is also an output", "(float[1,3,4,4] x) => (float[1,4,4,4] y, float[4,3,3,3] w)",
	             "   y = Conv <pads = [1,1,1,1]> (x, w)\n", 1, -1);
	case_release("two convolutions share a weight", "(float[1,3,4,4] x) => (float[1,4,4,4] y, float[1,4,4,4] z)",
	             "   y = Conv <pads = [1,1,1,1]> (x, w)\n"
	             "   x2 = Neg (x)\n"
	             "   z = Conv <pads = [1,1,1,1]> (x2, w)\n",
	             0, -1);
	case_release("a product's constant weight", "(float[1,3,4,4] x) => (float[3,5] y)",
	             "   r = Flatten <axis = 2> (x)\n"
	             "   y = MatMul (r, m)\n",
	             -1, 0);
	case_file();
	return check_report("test_release");
}
