/* trace.h — between the eager API (eager.c) and its tracer (trace.c); not installed. */
#ifndef TERN_EAGER_TRACE_H
#define TERN_EAGER_TRACE_H

#include "eager/tern_eager.h"
#include "internal.h"

/* What the tracer keeps on every tensor: a serial number unique in its context, the context's trace
 * epoch when it was made (0 before the first step, 2k - 1 inside step k, 2k after it), and, for
 * the output of a recorded operation, the step (its epoch + 1; 0: none), operation and output that made it.
 * A tensor sharing another's bytes (an alias, a saved output) carries the other's stamp. `input`: the
 * host marked it as a step's input data (tern_trace_input). */
typedef struct tern_trace_stamp {
	uint64_t serial;
	int64_t born;
	int64_t step;
	int32_t op, out;
	int32_t input;
} tern_trace_stamp;

tern_trace_stamp *tern_var_stamp(tern_var *v);
/* Its bytes to read: with asynchronous kernels, once the call that writes them has run (tern_var_tensor
 * waits for every call that touches them, for a caller that may write). */
const tern_tensor *tern_var_read(const tern_var *v);
/* The context's trace; NULL when it is not tracing. */
struct tern_trace *tern_ctx_trace(tern_ctx *c);
int64_t tern_ctx_epoch(tern_ctx *c);
void tern_ctx_next_epoch(tern_ctx *c);
void tern_ctx_set_trace(tern_ctx *c, struct tern_trace *t);
int64_t tern_ctx_opset(tern_ctx *c);
/* The caller of the outermost public call running (tern_call, tern_backward, tern_optim_step). */
const void *tern_ctx_c_site(tern_ctx *c);

/* The decimal digits of u at p, then a NUL; the NUL's address. Written by hand: snprintf's parsing
 * had been a tenth of recording a small call, and of naming a new signature's values. */
static inline char *tern_put_uint(char *p, unsigned long long u)
{
	char digits[24];
	int n = 0;
	do
		digits[n++] = (char)('0' + u % 10);
	while (u /= 10);
	while (n)
		*p++ = digits[--n];
	*p = 0;
	return p;
}

/* Whether attribute a holds a tensor, a graph or a type: what hashes and signatures of attributes
 * (trace.c, eager.c) take packed; the others they read field by field. */
static inline bool tern_attr_nested(const Onnx__AttributeProto *a)
{
	return a->t || a->g || a->sparse_tensor || a->tp || a->n_tensors || a->n_graphs || a->n_sparse_tensors ||
	       a->n_type_protos;
}

/* One call that ran (eager.c, after its outputs exist): recorded when a step is being traced. sig: the
 * call's signature (operator, attributes, input dtypes and shapes; equal signatures, equal attributes),
 * 0 when it has none. */
tern_status tern_trace_op(tern_ctx *c, const char *domain, const char *op_type, Onnx__AttributeProto *const *attrs,
                          int n_attrs, tern_var *const *in, int n_in, tern_var *const *out, int n_out, uint64_t sig);
void tern_trace_free(struct tern_trace *t);
/* --trace-only: in a replayed step the call is the first step's operation at the same position, run
 * on the replay's values (*handled); otherwise it runs as it is. */
tern_status tern_trace_replay(tern_ctx *c, Onnx__AttributeProto *const *attrs, int n_attrs, tern_var *const *in,
                              int n_in, tern_var **outv, int n_out, bool *handled);
/* eager.c's call of an operator with attributes as protos, recorded on the tape */
tern_status tern_eager_call_protos(tern_ctx *c, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                                   Onnx__AttributeProto *const *attrs, int n_attrs, tern_var **out, int n_out);

#endif
