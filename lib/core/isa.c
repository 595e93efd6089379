/* isa.c — which instruction-set path the kernels run on: the best the processor has, capped by the
 * environment variable TERN_ISA, decided once when the library loads so that every kernel of a
 * process (and every thread) agrees. */
#include "internal.h"

#include <stdlib.h>
#include <unistd.h>

int tern_isa_level = TERN_ISA_GENERIC;
static int machine_level = TERN_ISA_GENERIC;
static long l2_bytes = 1L << 20;
static const char *bad_request; /* a TERN_ISA value that names no path, kept for tern_isa_check */

static const char *const level_names[] = {"generic", "avx2", "avx512"};

static int detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	/* The AVX-512 kernels use the F, VL, BW and DQ subsets (x86-64-v4); the AVX2 ones need FMA too. */
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return TERN_ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return TERN_ISA_AVX2;
#endif
	return TERN_ISA_GENERIC;
}

/* Before main and before any thread, so that the level is read-only while kernels run. */
__attribute__((constructor)) static void isa_init(void)
{
	machine_level = detect();
#ifdef _SC_LEVEL2_CACHE_SIZE
	/* one core's second-level cache as the C library reads it; 1 MiB where it cannot tell (some
	 * virtual machines) */
	long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
	if (l2 >= (64L << 10))
		l2_bytes = l2;
#endif
	tern_isa_level = machine_level;
	const char *req = getenv("TERN_ISA");
	if (!req || !*req)
		return;
	for (int l = 0; l < (int)TERN_ARRAY_LEN(level_names); l++)
		if (strcmp(req, level_names[l]) == 0) {
			tern_isa_level = l < machine_level ? l : machine_level;
			return;
		}
	bad_request = req;
}

long tern_l2_bytes(void)
{
	return l2_bytes;
}

const char *tern_isa_name(void)
{
	return level_names[tern_isa_level];
}

const char *tern_isa_machine_name(void)
{
	return level_names[machine_level];
}

tern_status tern_isa_check(void)
{
	if (bad_request)
		return tern_errorf(TERN_EUSAGE, "TERN_ISA: '%s' is not one of avx512, avx2, generic", bad_request);
	return TERN_OK;
}
