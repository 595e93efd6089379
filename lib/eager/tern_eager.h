/* tern_eager.h — tern one operator at a time: reference-counted tensors, every operator of the
 * registry callable by name with ONNX attributes (through the same prepare functions and kernels that
 * plans use, with a cache of prepared calls), autograd that records a tape and runs the operators'
 * gradient rules eagerly, and optimizers with tern-autodiff's update rules.
 *
 * A context holds the thread pool, the cache, the random state and the grad mode. Tensors belong to
 * the context that made them; a context freed while tensors are alive is closed (its memory lives on
 * until the last tensor goes), and any call on such a tensor fails with TERN_EUSAGE.
 *
 * Every function returning tern_status sets the message tern_error() reads on failure: one line that
 * names the operator and the offending shape, dtype or attribute. */
#ifndef TERN_EAGER_H
#define TERN_EAGER_H

#include "tern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_ctx tern_ctx;
typedef struct tern_var tern_var;

/* ---------------------------------------------------------------- contexts */

tern_status tern_ctx_create(int n_threads, tern_ctx **out);
/* Closes the context (its tensors stay readable until released; operations on them fail). */
void tern_ctx_free(tern_ctx *ctx);
/* Seeds the random operators (RandomNormal, RandomUniform, Bernoulli, Dropout, ... without a seed
 * attribute draw theirs from this stream). */
void tern_ctx_manual_seed(tern_ctx *ctx, uint64_t seed);
/* Records the tape for operations on tensors that require gradients (the default: on); returns the
 * previous setting. */
int tern_ctx_set_grad_enabled(tern_ctx *ctx, int enabled);
int tern_ctx_grad_enabled(const tern_ctx *ctx);
/* The ai.onnx opset operators are called at (default: the newest tern implements). */
void tern_ctx_set_opset(tern_ctx *ctx, int64_t opset);
/* Asynchronous kernels (on: 1): a call checks its inputs, prepares, allocates its outputs and returns;
 * its kernel runs on a thread of the context's own, in the order of the calls, while the caller goes
 * on. Reading a tensor's bytes (tern_var_tensor) waits only for the calls that touch them. Results are
 * those of running each call at once, bit for bit. A small call (4096 elements read and written at
 * most) made while none is in flight runs at once on the caller's thread: handing it over would cost
 * more. A kernel's failure (rare once a call has prepared: an index out of range, memory) is returned
 * by the call itself when it ran at once, otherwise by the next call or by tern_ctx_sync. Off (0) waits for
 * every call issued. Returns the previous setting; TERN_EAGER_ASYNC=1 in the environment turns it on
 * for every new context. */
int tern_ctx_set_async(tern_ctx *ctx, int on);
/* Waits until every call issued has run; the first failure of a kernel since the last wait, if any. */
tern_status tern_ctx_sync(tern_ctx *ctx);
/* Calls served from the cache of prepared calls, and calls that prepared. */
void tern_ctx_cache_stats(const tern_ctx *ctx, int64_t *hits, int64_t *misses);

/* ---------------------------------------------------------------- tensors */

/* A tensor of zeros. */
tern_status tern_var_new(tern_ctx *ctx, int dtype, int rank, const int64_t *dims, tern_var **out);
/* A tensor holding a copy of data (numel * element size bytes, C order). */
tern_status tern_var_from(tern_ctx *ctx, int dtype, int rank, const int64_t *dims, const void *data, tern_var **out);
tern_var *tern_var_ref(tern_var *v);
void tern_var_unref(tern_var *v);
tern_ctx *tern_var_ctx(const tern_var *v);
/* Its dtype, shape and bytes. The bytes may be written (an optimizer, numpy interop); writes are not
 * seen by autograd. With asynchronous kernels (tern_ctx_set_async) it first waits until the calls
 * that read or write the tensor's bytes have run. */
const tern_tensor *tern_var_tensor(const tern_var *v);
/* Its dtype and shape at once; its bytes may still be being computed (asynchronous kernels): read
 * them through tern_var_tensor. */
const tern_tensor *tern_var_info(const tern_var *v);
int tern_var_requires_grad(const tern_var *v);
/* Only a leaf (a tensor no recorded operation made) can be marked; TERN_EUSAGE otherwise. */
tern_status tern_var_set_requires_grad(tern_var *v, int requires_grad);
int tern_var_is_leaf(const tern_var *v);
/* The accumulated gradient (borrowed), or NULL. */
tern_var *tern_var_grad(const tern_var *v);
/* Replaces the gradient (takes a reference; NULL clears it). */
void tern_var_set_grad(tern_var *v, tern_var *grad);
/* dst's bytes = src's (the same dtype and shape; src may be dst): an in-place assignment that autograd
 * does not see. With asynchronous kernels it runs in turn with the calls in flight. */
tern_status tern_var_copy(tern_var *dst, tern_var *src);
/* A new tensor sharing v's bytes, with no history and no gradient. */
tern_var *tern_var_detach(tern_var *v);

/* ---------------------------------------------------------------- operators */

enum {
	TERN_ATTR_INT = 1,
	TERN_ATTR_FLOAT,
	TERN_ATTR_STRING,
	TERN_ATTR_TENSOR,
	TERN_ATTR_INTS,
	TERN_ATTR_FLOATS,
	TERN_ATTR_STRINGS,
};

/* An ONNX attribute by name: kind says which field holds it (n: the length of a list). */
typedef struct tern_attr_arg {
	const char *name;
	int kind;
	int64_t i;
	double f;
	const char *s;
	const tern_tensor *t;
	const int64_t *ints;
	const double *floats;
	const char *const *strings;
	size_t n;
} tern_attr_arg;

/* Runs the operator domain.op_type ("" or "ai.onnx" for ONNX, "tern" for tern's own) on in[0..n_in)
 * (NULL entries: omitted optional inputs) and sets out[0..n_out) to new references (NULL where the
 * operator left an output out). n_out < 0 asks for the operator's usual outputs
 * (tern_op_outputs). With the grad mode on and an input that requires a gradient, the call is
 * recorded on the tape. */
tern_status tern_call(tern_ctx *ctx, const char *domain, const char *op_type, tern_var *const *in, int n_in,
                      const tern_attr_arg *attrs, int n_attrs, tern_var **out, int n_out);
/* How many outputs a call of the operator returns by default: 1 for most; LSTM 3, GRU and RNN 2,
 * TopK 2, Unique 4, Split as many as its split input or num_outputs says, ... */
int tern_op_outputs(const char *domain, const char *op_type, const tern_attr_arg *attrs, int n_attrs,
                    tern_var *const *in, int n_in);

/* ---------------------------------------------------------------- autograd */

/* Accumulates d(sum(y * seed))/dx into the gradient of every leaf x that requires one, running the
 * gradient rules of the recorded operations from y back. seed NULL: y must have one element (a
 * scalar loss), seed 1. The tape below y is released afterwards. */
tern_status tern_backward(tern_var *y, tern_var *seed);

/* ---------------------------------------------------------------- optimizers */

typedef struct tern_optim tern_optim;
/* tern-autodiff's optimizers (torch.optim's rules, the same tern.SGD, tern.Adam and tern.Adagrad
 * kernels): kind "sgd", "adam", "adamw" or "adagrad"; numbers < 0 take torch.optim's defaults. */
typedef struct tern_optim_options {
	const char *kind;
	double lr;
	double momentum;
	int nesterov;
	double weight_decay;
	double beta1, beta2, eps;
	double lr_decay;
} tern_optim_options;

tern_status tern_optim_create(tern_ctx *ctx, const tern_optim_options *opts, tern_var *const *params, int n_params,
                              tern_optim **out);
void tern_optim_free(tern_optim *opt);
/* Updates every parameter that has a gradient, in place. Each parameter counts its own steps (Adam's
 * bias correction, Adagrad's decay), as torch.optim does: one without a gradient does not advance. */
tern_status tern_optim_step(tern_optim *opt);
/* Clears the parameters' gradients. */
void tern_optim_zero_grad(tern_optim *opt);
void tern_optim_set_lr(tern_optim *opt, double lr);
double tern_optim_lr(const tern_optim *opt);
/* Steps taken. */
int64_t tern_optim_steps(const tern_optim *opt);
/* The state kept per parameter, for saving and restoring it (torch.optim's state_dict): how many
 * tensors (SGD with momentum 1: the momentum buffer; Adam and AdamW 2: the first and second moment;
 * Adagrad 1: the sum of squares; else 0), tensor `slot` of parameter `param` (a borrowed reference,
 * of the parameter's shape and dtype, whose bytes the next step reads; NULL out of range), and the
 * parameter's own step count. */
int tern_optim_num_state(const tern_optim *opt);
tern_var *tern_optim_state(tern_optim *opt, int param, int slot);
int64_t tern_optim_param_steps(const tern_optim *opt, int param);
tern_status tern_optim_set_param_steps(tern_optim *opt, int param, int64_t steps);

/* Tracing (tern-trace(1)): the calls of the first `steps` steps (a step: between
 * tern_trace_step_begin and _end; tern.step() in Python) recorded with their call sites and merged into
 * one graph, written to `path` when they are done or at tern_trace_finish. The same operation at the
 * same site (and the same occurrence there in its step) with the same attributes is one node; where
 * steps took different paths, If nodes choose among them by the fed input tern_path. Tensors the
 * host makes become graph inputs, tensors it reads (tern_trace_fetch) outputs, and parameters that
 * optimizers (or tern_trace_assign) update initializers with a training_info that updates them. */
typedef struct tern_trace_options {
	const char *path;
	int steps; /* 0: 1 */
	/* The current call site as text (Python: the stack of file:line outside the tern package), into
	 * buf; NULL: the C caller's return address */
	int (*site)(void *user, char *buf, size_t size);
	/* Optional: a key for the current call site, nonzero, the same whenever site would give the same
	 * text (Python: a hash of the frames' code objects and instruction offsets); the tracer then asks
	 * site for the text only once per key. NULL, or 0 returned: the text is asked for at every call. */
	uint64_t (*site_key)(void *user);
	void *user;
	const char *record_dir; /* NULL, or a folder that gets every traced step's inputs and fetched outputs */
	int verbose; /* a summary on stderr when the file is written */
	/* the trace-only baseline (torch.jit.trace's): after the traced steps, every later step runs the
	 * first one's operations in order on the graph's values, without checking that the program asks
	 * for them; the host's tensors reach them where they were made before the step, carried from an
	 * earlier one or marked as its input (tern_trace_input), and a tensor the host made inside the
	 * first step without the mark is replayed as the constant it was then */
	int replay;
	/* after the traced steps, every later step is recorded and checked against the graph's paths as
	 * it runs; a step that diverges (another branch, a new shape, an operation the graph lacks) is
	 * reported, joins the trace, and the graph is written again. In this release the step's operations
	 * still run on the calling thread, through the same kernels. */
	int coexec;
} tern_trace_options;
tern_status tern_trace_start(tern_ctx *ctx, const tern_trace_options *opts);
tern_status tern_trace_step_begin(tern_ctx *ctx);
tern_status tern_trace_step_end(tern_ctx *ctx);
/* The step being traced did not complete (an exception): it is left out of the graph. */
void tern_trace_step_abandon(tern_ctx *ctx);
/* The host reads v (its values leave the graph). */
void tern_trace_fetch(tern_var *v);
/* v is input data of the step (a minibatch, its labels): the trace-only baseline feeds it anew at
 * every replayed step, as torch.jit.trace does the traced function's arguments, and replays every
 * other tensor that the host made inside the traced step as the constant it was then. Tracing and
 * co-execution treat it as any tensor the host makes. */
void tern_trace_input(tern_var *v);
/* dst's bytes were overwritten with src's (an in-place update of a parameter or state). */
void tern_trace_assign(tern_var *dst, tern_var *src);
/* Writes the graph if steps were recorded and it is not written yet. */
tern_status tern_trace_finish(tern_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
