/* The key of the Python stack at a traced call (tern-trace(1)): a hash of each frame's code object and
 * instruction offset. Same key, same stack: the trace keeps the stack's text, made once, under it.
 *
 * On CPython 3.11 the interpreter's own frames are walked (tstate->cframe->current_frame and each
 * one's previous): a load or two a frame. The public API (PyEval_GetFrame, PyFrame_GetBack, ...)
 * makes a frame object for every frame it passes and takes and drops a reference to each, which was
 * a tenth of checking memory_bank's co-executed calls (callgrind). Other versions take the public walk. This file alone is
 * built against the interpreter's internal frame layout. */
#include <Python.h>
#include <stdint.h>

#include "stack_key.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define Py_BUILD_CORE_MODULE 1
#include "internal/pycore_frame.h"
#define TERN_FAST_FRAMES 1
#endif

static inline uint64_t mix(uint64_t key, uint64_t part)
{
	key = (key ^ part) * 0x100000001b3ull;
	return key ^ key >> 31;
}

uint64_t tern_py_stack_key(void)
{
	uint64_t key = 0xcbf29ce484222325ull;
#ifdef TERN_FAST_FRAMES
	/* prev_instr points into its code object's bytecode: the code and the offset in one word */
	PyThreadState *ts = PyThreadState_Get();
	for (struct _PyInterpreterFrame *f = ts->cframe ? ts->cframe->current_frame : NULL; f; f = f->previous)
		key = mix(key, (uint64_t)(uintptr_t)f->prev_instr);
#elif PY_VERSION_HEX >= 0x030B0000
	PyFrameObject *f = PyEval_GetFrame();
	Py_XINCREF(f);
	while (f) {
		PyCodeObject *code = PyFrame_GetCode(f);
		key = mix(mix(key, (uint64_t)(uintptr_t)code), (uint64_t)PyFrame_GetLasti(f));
		Py_XDECREF(code);
		PyFrameObject *back = PyFrame_GetBack(f);
		Py_DECREF(f);
		f = back;
	}
#endif
	return key ? key : 1;
}
