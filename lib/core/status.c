/* status.c — the per-thread error message behind every tern_status. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char message[1024];

const char *tern_error(void)
{
	return message;
}

void tern_error_clear(void)
{
	message[0] = '\0';
}

tern_status tern_errorf(tern_status status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(message, sizeof message, fmt, ap);
	va_end(ap);
	return status;
}

tern_status tern_error_prefix(tern_status status, const char *prefix)
{
	char old[sizeof message];
	memcpy(old, message, sizeof old);
	size_t n = strlen(prefix);
	if (n > sizeof message / 2)
		n = sizeof message / 2;
	memcpy(message, prefix, n);
	memcpy(message + n, ": ", 2);
	size_t room = sizeof message - n - 3;
	size_t len = strnlen(old, room);
	memcpy(message + n + 2, old, len);
	message[n + 2 + len] = '\0';
	return status;
}
