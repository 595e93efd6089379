/* The key of the Python stack at a traced call (stack_key.c); 1 where the version has no key (never 0). */
#ifndef TERN_PY_STACK_KEY_H
#define TERN_PY_STACK_KEY_H
#include <stdint.h>
uint64_t tern_py_stack_key(void);
#endif
