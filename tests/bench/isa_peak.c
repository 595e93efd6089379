/* isa_peak — the processor's arithmetic and first-cache peaks on each instruction-set path it has, for
 * scripts/bench_kernels.py's "fraction of peak". Prints one JSON object:
 *   {"avx512": {"gflops": G, "gbps": B}, "avx2": {...}, "generic": {...}}
 * gflops: independent multiply-adds (FMA on AVX2 and AVX-512; a multiply and an add on the baseline,
 * which has no FMA) on one thread, two flops each; gbps: y += x over 16 KiB arrays that stay in the
 * first cache, bytes read plus written. The best of several timed runs. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_CHAINS 24 /* independent sums: more than the FMA latency times the FMA units */
#define STEPS 2000000
#define STREAM_FLOATS 4096
#define STREAM_PASSES 20000

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The loops are written with vector extensions so that each path gets its own width; the asm barrier
 * keeps the compiler from folding the sums. */
#define DEF_PEAK(NAME, ATTR, V, LANES, CHAINS, OP)                                             \
	ATTR static double NAME##_flops(void)                                                  \
	{                                                                                      \
		V acc[MAX_CHAINS], m = (V){0} + mul, a = (V){0} + add;                         \
		for (int c = 0; c < CHAINS; c++)                                               \
			acc[c] = (V){0} + (float)c;                                            \
		double t0 = now_s();                                                           \
		for (long s = 0; s < STEPS; s++) {                                             \
			_Pragma("GCC unroll 24") for (int c = 0; c < CHAINS; c++) acc[c] = OP; \
		}                                                                              \
		double t = now_s() - t0;                                                       \
		V sum = acc[0];                                                                \
		for (int c = 1; c < CHAINS; c++)                                               \
			sum += acc[c];                                                         \
		volatile float sink = sum[0];                                                  \
		(void)sink;                                                                    \
		return 2.0 * CHAINS * LANES * (double)STEPS / t * 1e-9;                        \
	}                                                                                      \
	ATTR static double NAME##_stream(float *x, float *y)                                   \
	{                                                                                      \
		double t0 = now_s();                                                           \
		for (int p = 0; p < STREAM_PASSES; p++) {                                      \
			for (int i = 0; i < STREAM_FLOATS; i += LANES) {                       \
				V xv, yv;                                                      \
				memcpy(&xv, x + i, sizeof xv);                                 \
				memcpy(&yv, y + i, sizeof yv);                                 \
				yv += xv;                                                      \
				memcpy(y + i, &yv, sizeof yv);                                 \
			}                                                                      \
			__asm__ volatile("" ::"r"(y) : "memory");                              \
		}                                                                              \
		double t = now_s() - t0;                                                       \
		return 3.0 * sizeof(float) * STREAM_FLOATS * STREAM_PASSES / t * 1e-9;         \
	}

typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
/* read at run time, so that the sums cannot be computed while compiling */
static volatile float mul = 0.999999f, add = 1e-7f;
#pragma GCC optimize("fp-contract=fast")
/* as many sums as the path has registers for, with two left for the operands */
DEF_PEAK(generic, , v4f, 4, 12, acc[c] * m + a)
DEF_PEAK(avx2, TERN_TARGET_AVX2, v8f, 8, 12, acc[c] * m + a)
DEF_PEAK(avx512, TERN_TARGET_AVX512, v16f, 16, 24, acc[c] * m + a)

typedef struct path {
	const char *name;
	int level;
	double (*flops)(void);
	double (*stream)(float *, float *);
} path;

int main(void)
{
	static const path paths[] = {
	        {"avx512", TERN_ISA_AVX512, avx512_flops, avx512_stream},
	        {"avx2", TERN_ISA_AVX2, avx2_flops, avx2_stream},
	        {"generic", TERN_ISA_GENERIC, generic_flops, generic_stream},
	};
	float *x = tern_aligned_alloc(STREAM_FLOATS * sizeof(float)),
	      *y = tern_aligned_alloc(STREAM_FLOATS * sizeof(float));
	if (!x || !y)
		return 71;
	printf("{");
	const char *sep = "";
	for (size_t i = 0; i < TERN_ARRAY_LEN(paths); i++) {
		if (paths[i].level > tern_isa()) /* a path the processor lacks, or one TERN_ISA caps away */
			continue;
		double g = 0, b = 0;
		for (int r = 0; r < 5; r++) {
			double gr = paths[i].flops(), br = paths[i].stream(x, y);
			g = gr > g ? gr : g;
			b = br > b ? br : b;
		}
		printf("%s\"%s\": {\"gflops\": %.2f, \"gbps\": %.2f}", sep, paths[i].name, g, b);
		sep = ", ";
	}
	printf("}\n");
	free(x);
	free(y);
	return 0;
}
