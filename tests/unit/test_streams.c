/* test_streams.c — the multi-stream executor: seeded random branchy graphs, scheduled with and
 * without a stream cap, run many times on several workers; every output must equal the
 * single-stream one-thread run bit for bit. The last trials use values large enough that kernels
 * split their work, so that idle workers help with the kernels of others (the team pool), and also
 * run unscheduled on several threads. Run under ThreadSanitizer by scripts/test.sh. */
#include "check.h"
#include "graphs.h"

#include <stdio.h>
#include <stdlib.h>

/* Random branches of unary and binary elementwise nodes, joined into y. */
static tern_model *branchy(int n_nodes, int64_t len)
{
	static const char *unary[] = {"Relu", "Sigmoid", "Tanh", "Abs", "Neg"};
	static const char *binary[] = {"Add", "Mul", "Sub"};
	tern_model *m;
	if (one_input_model("y", len, &m) != TERN_OK)
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

/* Softmax over 2^22 floats runs on one thread for milliseconds, long enough for an idle worker to go to
 * sleep; the Relu after it posts a job that must wake it, and the end of the run (after the last
 * Softmax) must wake it again. A lost wake-up hangs the test. */
static tern_model *sleepy(void)
{
	tern_model *m;
	if (one_input_model("y", (int64_t)1 << 22, &m) != TERN_OK)
		return NULL;
	tern_graph *g = tern_model_graph(m);
	const char *names[] = {"x", "a", "b", "c", "y"}, *ops[] = {"Relu", "Softmax", "Relu", "Softmax"};
	for (int i = 0; i < 4; i++) {
		char node[8];
		snprintf(node, sizeof node, "n%d", i);
		const char *ins[1] = {names[i]}, *outs[1] = {names[i + 1]};
		tern_graph_add_node(g, ops[i], "", node, ins, 1, outs, 1);
	}
	tern_model_sync(m);
	tern_model_build_ir(m);
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
	for (int trial = 0; trial < 15; trial++) {
		rng_state = (uint64_t)trial * 7919 + 3;
		/* 3 x 2^15 floats split into several chunks per kernel. */
		int64_t len = trial < 12 ? 64 : 3 << 15;
		int iters = trial < 12 ? 25 : 4;
		tern_model *m = branchy(trial < 12 ? 40 + trial * 10 : 30, len);
		CHECK(m != NULL);
		if (!m)
			continue;
		CHECK_OK(tern_model_validate(m));
		tern_tensor x = {0};
		int64_t dims[1] = {len};
		CHECK_OK(tern_tensor_alloc(&x, TERN_FLOAT, 1, dims));
		for (int64_t i = 0; i < len; i++)
			((float *)x.data)[i] = (float)((int)(rnd() % 2001) - 1000) / 500.0f;
		tern_tensor want = {0};
		run_once(m, 1, 1, &x, &want, 1);
		for (int threads = 2; threads <= 3; threads++) {
			tern_tensor got = {0};
			run_once(m, threads, 1, &x, &got, iters);
			CHECK(got.nbytes == want.nbytes && memcmp(got.data, want.data, want.nbytes) == 0);
			tern_tensor_free(&got);
		}
		for (int cap = 0; cap <= 3; cap += 3) {
			tern_schedule *s;
			CHECK_OK(tern_schedule_compute(tern_model_graph(m), cap, &s, NULL));
			char *text = NULL;
			CHECK_OK(tern_schedule_format(s, &text));
			CHECK_OK(tern_model_set_meta(m, TERN_SCHEDULE_KEY, text));
			CHECK(cap || s->n_streams > 1);
			for (int threads = 1; threads <= 3; threads++) {
				tern_tensor got = {0};
				run_once(m, threads, 0, &x, &got, iters);
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
	tern_model *m = sleepy();
	CHECK(m != NULL);
	if (m) {
		CHECK_OK(tern_model_validate(m));
		tern_tensor x = {0}, want = {0}, got = {0};
		int64_t dims[1] = {(int64_t)1 << 22};
		CHECK_OK(tern_tensor_alloc(&x, TERN_FLOAT, 1, dims));
		for (int64_t i = 0; i < dims[0]; i++)
			((float *)x.data)[i] = (float)((int)(rnd() % 2001) - 1000) / 100.0f;
		run_once(m, 1, 1, &x, &want, 1);
		run_once(m, 2, 1, &x, &got, 4);
		CHECK(got.nbytes == want.nbytes && memcmp(got.data, want.data, want.nbytes) == 0);
		tern_tensor_free(&x);
		tern_tensor_free(&want);
		tern_tensor_free(&got);
		tern_model_free(m);
	}
	return check_report("test_streams");
}
