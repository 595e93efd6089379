/* dnnl_conv — one float convolution through oneDNN, the way onnxruntime's DNNL provider and OpenVINO run
 * it: source, weights and destination in the layouts the primitive picks (format_tag_any, blocked by
 * channels), weights reordered once, activations kept blocked between convolutions and reordered only at
 * the graph's edges. For scripts/bench_kernels.py, which compares it with tern's kernels per shape class.
 *
 *   dnnl_conv C H W M K STRIDE GROUP PAD ITERS
 *
 * prints {"ms": median of the primitive alone, "edge_ms": median with the reorders from and to NCHW,
 * "src_layout": the source layout oneDNN chose, "impl": its implementation's name}. One thread: run it with
 * OMP_NUM_THREADS=1; DNNL_MAX_CPU_ISA caps oneDNN's instruction set as TERN_ISA caps tern's. */
#include <oneapi/dnnl/dnnl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                    \
	do {                                                                           \
		dnnl_status_t s_ = (call);                                             \
		if (s_ != dnnl_success) {                                              \
			fprintf(stderr, "dnnl_conv: %s: status %d\n", #call, (int)s_); \
			exit(70);                                                      \
		}                                                                      \
	} while (0)

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static dnnl_memory_t make_memory(const dnnl_memory_desc_t *md, dnnl_engine_t engine, float fill)
{
	dnnl_memory_t m;
	CHECK(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE));
	void *p;
	CHECK(dnnl_memory_get_data_handle(m, &p));
	size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
	for (size_t i = 0; i < n; i++)
		((float *)p)[i] = fill * (float)((i * 7919) % 17) - 8 * fill;
	return m;
}

/* A reorder from one layout to another, made once and run per iteration. */
static dnnl_primitive_t make_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, dnnl_engine_t engine)
{
	dnnl_primitive_desc_t pd;
	CHECK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL));
	dnnl_primitive_t p;
	CHECK(dnnl_primitive_create(&p, pd));
	CHECK(dnnl_primitive_desc_destroy(pd));
	return p;
}

static void run_reorder(dnnl_primitive_t r, dnnl_stream_t stream, dnnl_memory_t from, dnnl_memory_t to)
{
	dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
	CHECK(dnnl_primitive_execute(r, stream, 2, args));
}

int main(int argc, char **argv)
{
	if (argc != 10) {
		fprintf(stderr, "usage: dnnl_conv C H W M K STRIDE GROUP PAD ITERS\n");
		return 64;
	}
	long v[9];
	for (int i = 0; i < 9; i++) {
		char *end;
		v[i] = strtol(argv[i + 1], &end, 10);
		if (*end || v[i] < (i == 7 ? 0 : 1)) {
			fprintf(stderr, "dnnl_conv: argument %d: '%s' is not a positive integer\n", i + 1, argv[i + 1]);
			return 64;
		}
	}
	long c = v[0], h = v[1], w = v[2], m = v[3], k = v[4], s = v[5], g = v[6], pad = v[7];
	int iters = (int)v[8];
	long ho = (h + 2 * pad - k) / s + 1, wo = (w + 2 * pad - k) / s + 1;

	dnnl_engine_t engine;
	CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
	dnnl_stream_t stream;
	CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));

	dnnl_dims_t src_dims = {1, c, h, w}, dst_dims = {1, m, ho, wo}, bias_dims = {m};
	dnnl_dims_t w_dims = {g, m / g, c / g, k, k}, strides = {s, s}, dilates = {0, 0}, pads = {pad, pad};
	dnnl_memory_desc_t src_any, w_any, dst_any, bias_md, src_plain, w_plain, dst_plain;
	CHECK(dnnl_memory_desc_init_by_tag(&src_any, 4, src_dims, dnnl_f32, dnnl_format_tag_any));
	CHECK(dnnl_memory_desc_init_by_tag(&dst_any, 4, dst_dims, dnnl_f32, dnnl_format_tag_any));
	CHECK(dnnl_memory_desc_init_by_tag(&w_any, 5, w_dims, dnnl_f32, dnnl_format_tag_any));
	CHECK(dnnl_memory_desc_init_by_tag(&bias_md, 1, bias_dims, dnnl_f32, dnnl_a));
	CHECK(dnnl_memory_desc_init_by_tag(&src_plain, 4, src_dims, dnnl_f32, dnnl_nchw));
	CHECK(dnnl_memory_desc_init_by_tag(&dst_plain, 4, dst_dims, dnnl_f32, dnnl_nchw));
	CHECK(dnnl_memory_desc_init_by_tag(&w_plain, 5, w_dims, dnnl_f32, dnnl_goihw));

	dnnl_convolution_desc_t cd;
	CHECK(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &src_any,
	                                                 &w_any, &bias_md, &dst_any, strides, dilates, pads, pads));
	dnnl_primitive_desc_t pd;
	CHECK(dnnl_primitive_desc_create(&pd, &cd, NULL, engine, NULL));
	const dnnl_memory_desc_t *src_md = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
	const dnnl_memory_desc_t *w_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
	const dnnl_memory_desc_t *dst_md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
	const char *impl = "?";
	CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));

	dnnl_memory_t src_nchw = make_memory(&src_plain, engine, 0.01f), dst_nchw = make_memory(&dst_plain, engine, 0);
	dnnl_memory_t w_oihw = make_memory(&w_plain, engine, 0.001f), bias = make_memory(&bias_md, engine, 0.01f);
	dnnl_memory_t src = make_memory(src_md, engine, 0), wt = make_memory(w_md, engine, 0), dst = make_memory(dst_md, engine, 0);
	dnnl_primitive_t to_blocked = make_reorder(&src_plain, src_md, engine);
	dnnl_primitive_t from_blocked = make_reorder(dst_md, &dst_plain, engine);
	dnnl_primitive_t w_reorder = make_reorder(&w_plain, w_md, engine);
	run_reorder(w_reorder, stream, w_oihw, wt); /* once, as at planning */
	dnnl_primitive_t conv;
	CHECK(dnnl_primitive_create(&conv, pd));
	dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}};

	double *alone = malloc((size_t)iters * sizeof *alone), *edge = malloc((size_t)iters * sizeof *edge);
	if (!alone || !edge)
		return 71;
	for (int i = 0; i < iters / 5 + 2; i++) { /* warm-up */
		run_reorder(to_blocked, stream, src_nchw, src);
		CHECK(dnnl_primitive_execute(conv, stream, 4, args));
		run_reorder(from_blocked, stream, dst, dst_nchw);
		CHECK(dnnl_stream_wait(stream));
	}
	for (int i = 0; i < iters; i++) {
		double t0 = now_ms();
		CHECK(dnnl_primitive_execute(conv, stream, 4, args));
		CHECK(dnnl_stream_wait(stream));
		alone[i] = now_ms() - t0;
		t0 = now_ms();
		run_reorder(to_blocked, stream, src_nchw, src);
		CHECK(dnnl_primitive_execute(conv, stream, 4, args));
		run_reorder(from_blocked, stream, dst, dst_nchw);
		CHECK(dnnl_stream_wait(stream));
		edge[i] = now_ms() - t0;
	}
	/* the source layout oneDNN chose: channel blocks (nChwXc), channels last (nhwc) or planes (nchw) */
	const dnnl_blocking_desc_t *bd = &src_md->format_desc.blocking;
	char layout[32] = "other";
	if (src_md->format_kind == dnnl_blocked && bd->inner_nblks > 0)
		snprintf(layout, sizeof layout, "nChw%ldc", (long)bd->inner_blks[0]);
	else if (src_md->format_kind == dnnl_blocked)
		snprintf(layout, sizeof layout, "%s", bd->strides[1] == 1 ? "nhwc" : "nchw");
	printf("{\"ms\": %.6f, \"edge_ms\": %.6f, \"src_layout\": \"%s\", \"impl\": \"%s\"}\n", median(alone, iters),
	       median(edge, iters), layout, impl);
	free(alone);
	free(edge);
	dnnl_primitive_destroy(conv);
	dnnl_primitive_destroy(to_blocked);
	dnnl_primitive_destroy(from_blocked);
	dnnl_primitive_destroy(w_reorder);
	dnnl_primitive_desc_destroy(pd);
	dnnl_memory_destroy(src_nchw);
	dnnl_memory_destroy(dst_nchw);
	dnnl_memory_destroy(w_oihw);
	dnnl_memory_destroy(bias);
	dnnl_memory_destroy(src);
	dnnl_memory_destroy(wt);
	dnnl_memory_destroy(dst);
	dnnl_stream_destroy(stream);
	dnnl_engine_destroy(engine);
	return 0;
}
