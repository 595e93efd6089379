/* util.c — allocation and time helpers used across the library. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

void *tern_xmalloc(size_t n)
{
	return malloc(n ? n : 1);
}

void *tern_aligned_alloc_uninit(size_t n)
{
	size_t rounded = (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
	return aligned_alloc(TERN_ALIGN, rounded ? rounded : TERN_ALIGN);
}

void *tern_aligned_alloc(size_t n)
{
	void *p = tern_aligned_alloc_uninit(n);
	if (p)
		memset(p, 0, n ? (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN : TERN_ALIGN);
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

/* Reads a whole stream, sized from the file when it is a regular one. */
tern_status tern_read_stream(FILE *f, const char *name, uint8_t **out, size_t *size)
{
	size_t cap = 1 << 16, n = 0;
	struct stat sb;
	if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
		cap = (size_t)sb.st_size + 1;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return tern_errorf(TERN_EOS, "%s: out of memory reading %zu bytes", name, cap);
	for (;;) {
		if (n == cap) {
			uint8_t *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return tern_errorf(TERN_EOS, "%s: out of memory reading the file", name);
			}
			buf = nb;
			cap *= 2;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		int err = errno;
		free(buf);
		return tern_errorf(TERN_EIO, "%s: read failed: %s", name, strerror(err));
	}
	*out = buf;
	*size = n;
	return TERN_OK;
}
