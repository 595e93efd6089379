/* text_print.c — temporary: the ONNX text syntax is being written. */
#include "internal.h"
tern_status tern_text_print_model(const Onnx__ModelProto *model, int with_weights, char **out, size_t *size)
{
	(void)model; (void)with_weights; *out = NULL; *size = 0;
	return tern_errorf(TERN_EUNAVAILABLE, "the text syntax writer is not built yet");
}
