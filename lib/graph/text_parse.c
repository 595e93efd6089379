/* text_parse.c — temporary: the ONNX text syntax is being written. */
#include "internal.h"
tern_status tern_text_parse_model(const char *text, size_t len, const char *source, Onnx__ModelProto **out)
{
	(void)text; (void)len; (void)source; *out = NULL;
	return tern_errorf(TERN_EUNAVAILABLE, "the text syntax reader is not built yet");
}
