/* fuzz_onnx.c — libFuzzer target: the model loader on arbitrary bytes (binary ONNX or text), then
 * validation and both writers. Any text written with weights must read back to the same text. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	tern_model *model = NULL;
	/* External tensor data resolves against a folder that does not exist: no file is read. */
	if (tern_model_load_bytes(data, size, "fuzz", "/nonexistent/tern-fuzz", &model) != TERN_OK)
		return 0;
	tern_model_validate(model);
	char *text = NULL;
	size_t n = 0;
	if (tern_model_save_text(model, 1, &text, &n) == TERN_OK) {
		Onnx__ModelProto *back = NULL;
		char *again = NULL;
		size_t n_again = 0;
		if (tern_text_parse_model(text, n, "fuzz", &back) != TERN_OK ||
		    tern_text_print_model(back, 1, &again, &n_again) != TERN_OK || n != n_again ||
		    memcmp(text, again, n) != 0) {
			fprintf(stderr, "fuzz_onnx: the written text does not read back to itself: %s\n", tern_error());
			abort();
		}
		free(again);
		onnx__model_proto__free_unpacked(back, NULL);
		free(text);
	}
	if (tern_model_save_text(model, 0, &text, &n) == TERN_OK)
		free(text);
	void *bytes = NULL;
	if (tern_model_save_bytes(model, &bytes, &n) == TERN_OK)
		free(bytes);
	tern_model_free(model);
	return 0;
}
