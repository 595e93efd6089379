/* seed_text.c — writes binary ONNX models as tern's text, the seed corpus of fuzz_text:
 * seed_text OUTDIR MODEL.onnx... writes OUTDIR/<folder of the model>.txt for each. */
#include "internal.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	unsigned char *buf = NULL;
	size_t cap = 0;
	*n = 0;
	for (;;) {
		if (*n == cap) {
			unsigned char *b = realloc(buf, cap = cap ? cap * 2 : 65536);
			if (!b)
				break;
			buf = b;
		}
		size_t got = fread(buf + *n, 1, cap - *n, f);
		if (!got)
			break;
		*n += got;
	}
	fclose(f);
	return buf;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: seed_text OUTDIR MODEL.onnx...\n");
		return 64;
	}
	int failures = 0;
	for (int i = 2; i < argc; i++) {
		size_t n = 0;
		unsigned char *bytes = slurp(argv[i], &n);
		Onnx__ModelProto *m = bytes ? onnx__model_proto__unpack(NULL, n, bytes) : NULL;
		free(bytes);
		char *text = NULL;
		size_t size = 0;
		if (!m || tern_text_print_model(m, 1, &text, &size) != TERN_OK) {
			failures += m != NULL;
			if (m)
				onnx__model_proto__free_unpacked(m, NULL);
			continue;
		}
		onnx__model_proto__free_unpacked(m, NULL);
		char *copy = tern_strdup(argv[i]), path[4096];
		snprintf(path, sizeof path, "%s/%s.txt", argv[1], basename(dirname(copy)));
		free(copy);
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(text, 1, size, f) != size)
			failures++;
		if (f)
			fclose(f);
		free(text);
	}
	return failures ? 1 : 0;
}
