/* check.h — the smallest test harness: CHECK records a failure with its place and goes on. */
#ifndef TERN_CHECK_H
#define TERN_CHECK_H
#include <stdio.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                              \
	do {                                                                                     \
		check_count++;                                                                   \
		if (!(cond)) {                                                                   \
			check_failures++;                                                        \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                                \
	} while (0)

#define CHECK_OK(expr)                                                                                            \
	do {                                                                                                      \
		check_count++;                                                                                    \
		tern_status check_st_ = (expr);                                                                   \
		if (check_st_ != TERN_OK) {                                                                       \
			check_failures++;                                                                         \
			fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #expr, (int)check_st_, \
			        tern_error());                                                                    \
		}                                                                                                 \
	} while (0)

static inline int check_report(const char *name)
{
	fprintf(stderr, "%s: %d checks, %d failed\n", name, check_count, check_failures);
	return check_failures ? 1 : 0;
}
#endif
