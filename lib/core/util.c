/* util.c — allocation and time helpers used across the library. */
#include "internal.h"

#include <stdlib.h>
#include <time.h>

void *tern_xmalloc(size_t n) { return malloc(n ? n : 1); }

void *tern_aligned_alloc(size_t n)
{
	size_t rounded = (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	void *p = aligned_alloc(TERN_ALIGN, rounded ? rounded : TERN_ALIGN);
	if (p)
		memset(p, 0, rounded ? rounded : TERN_ALIGN);
	return p;
}

char *tern_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

bool tern_grow(void **items, size_t *cap, size_t need, size_t item_size)
{
	if (need <= *cap)
		return true;
	size_t ncap = *cap ? *cap * 2 : 8;
	while (ncap < need)
		ncap *= 2;
	void *p = realloc(*items, ncap * item_size);
	if (!p)
		return false;
	memset((char *)p + *cap * item_size, 0, (ncap - *cap) * item_size);
	*items = p;
	*cap = ncap;
	return true;
}

double tern_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
