/* fuzz_text.c — libFuzzer target: the text syntax reader on arbitrary bytes. Whatever it reads must be
 * written back (with weights), and that text must read and write again to the very same text. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

static void broken(const char *what)
{
	fprintf(stderr, "fuzz_text: %s: %s\n", what, tern_error());
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Onnx__ModelProto *first = NULL, *second = NULL;
	if (tern_text_parse_model((const char *)data, size, "fuzz", &first) != TERN_OK)
		return 0;
	char *text = NULL, *again = NULL, *elided = NULL;
	size_t n = 0, n_again = 0, n_elided = 0;
	if (tern_text_print_model(first, 1, &text, &n) != TERN_OK)
		broken("what was read cannot be written");
	if (tern_text_parse_model(text, n, "fuzz", &second) != TERN_OK)
		broken("written text does not read back");
	if (tern_text_print_model(second, 1, &again, &n_again) != TERN_OK)
		broken("read-back model cannot be written");
	if (n != n_again || memcmp(text, again, n) != 0)
		broken("the text round trip changed the text");
	if (tern_text_print_model(first, 0, &elided, &n_elided) != TERN_OK)
		broken("cannot be written without weights");
	free(text);
	free(again);
	free(elided);
	onnx__model_proto__free_unpacked(first, NULL);
	onnx__model_proto__free_unpacked(second, NULL);
	return 0;
}
