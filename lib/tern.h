/* tern.h — the public interface of libtern: graph files, tensors, plans and runs.
 * Every function returns a tern_status; on failure tern_error() holds a one-line message that names
 * the file, the node and the offending value. The library never prints and never exits. */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes are the sysexits(3) values, so a tool can exit with the status it got. */
typedef enum tern_status {
	TERN_OK = 0,
	TERN_EUSAGE = 64, /* bad call: wrong arguments, unknown option value */
	TERN_EDATA = 65, /* bad graph or tensor data, unsupported operator */
	TERN_ENOINPUT = 66, /* a file cannot be opened */
	TERN_EUNAVAILABLE = 69, /* a backend or service is not available */
	TERN_EINTERNAL = 70, /* a bug in tern */
	TERN_EOS = 71, /* out of memory, a system call failed */
	TERN_EIO = 74, /* read or write failed */
} tern_status;

/* The message of the last failure in this thread ("" when none). */
const char *tern_error(void);
/* Sets the message from a format and returns status; for use by the library and its tools. */
tern_status tern_errorf(tern_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "prefix: " (a file name, say). Returns status. */
tern_status tern_error_prefix(tern_status status, const char *prefix);
void tern_error_clear(void);

/* The instruction-set path the kernels run on ("avx512", "avx2" or "generic"): the best the processor
 * has, capped by the environment variable TERN_ISA when it names a lower one. Decided when the library
 * loads. */
const char *tern_isa_name(void);
/* The best path the processor has, whatever TERN_ISA says. */
const char *tern_isa_machine_name(void);
/* TERN_EUSAGE when TERN_ISA is set to something that names no path (the kernels then run on the
 * machine's best); TERN_OK otherwise. */
tern_status tern_isa_check(void);

/* ---------------------------------------------------------------- tensors */

/* Element types use ONNX's TensorProto.DataType numbers. */
typedef enum tern_dtype {
	TERN_UNDEFINED = 0,
	TERN_FLOAT = 1,
	TERN_UINT8 = 2,
	TERN_INT8 = 3,
	TERN_UINT16 = 4,
	TERN_INT16 = 5,
	TERN_INT32 = 6,
	TERN_INT64 = 7,
	TERN_STRING = 8,
	TERN_BOOL = 9,
	TERN_FLOAT16 = 10,
	TERN_DOUBLE = 11,
	TERN_UINT32 = 12,
	TERN_UINT64 = 13,
	TERN_COMPLEX64 = 14,
	TERN_COMPLEX128 = 15,
	TERN_BFLOAT16 = 16,
	TERN_FLOAT8E4M3FN = 17,
	TERN_FLOAT8E4M3FNUZ = 18,
	TERN_FLOAT8E5M2 = 19,
	TERN_FLOAT8E5M2FNUZ = 20,
	TERN_DTYPE_COUNT
} tern_dtype;

#define TERN_MAX_RANK 8

/* Values that are not tensors travel in a tern_tensor too, with one of these in dtype (beyond every
 * element type): an ONNX sequence (data: a tern_sequence, owned when owns_data; rank 0, nbytes 0),
 * and an optional that holds nothing (no data). An optional that holds a value is that value. */
enum { TERN_SEQUENCE = 30, TERN_NONE = 31 };
typedef struct tern_tensor tern_tensor;
typedef struct tern_sequence {
	int elem_dtype; /* the element type of its tensors (TERN_UNDEFINED: not known yet) */
	size_t n, cap;
	tern_tensor *items; /* each owns its data */
} tern_sequence;

/* Bytes per element (0 for STRING and unknown types). */
size_t tern_dtype_size(int dtype);
/* The name the ONNX text syntax uses ("float", "int64", "bool", ...); "?" when unknown. */
const char *tern_dtype_name(int dtype);
/* The inverse of tern_dtype_name; TERN_UNDEFINED when unknown. */
int tern_dtype_from_name(const char *name);

/* A dense tensor, row-major. For STRING tensors data holds numel char* (owned when owns_data). */
struct tern_tensor {
	int dtype;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	void *data;
	size_t nbytes;
	int owns_data;
	char *name; /* optional, owned */
};

int64_t tern_numel(int rank, const int64_t *dims);
static inline int64_t tern_tensor_numel(const tern_tensor *t)
{
	return tern_numel(t->rank, t->dims);
}
/* Sets dtype/shape and allocates zeroed, 64-byte aligned storage. */
tern_status tern_tensor_alloc(tern_tensor *t, int dtype, int rank, const int64_t *dims);
/* Frees what the tensor owns and zeroes it. */
void tern_tensor_free(tern_tensor *t);
/* A deep copy (data and name). */
tern_status tern_tensor_copy(tern_tensor *dst, const tern_tensor *src);
/* Element i of a real numeric or bool tensor as a double / int64 (float16 and bfloat16 converted). */
double tern_tensor_get_f64(const tern_tensor *t, int64_t i);
int64_t tern_tensor_get_i64(const tern_tensor *t, int64_t i);
/* Sequences: t becomes an empty sequence of elem_dtype (owned); items are deep copies, so a
 * sequence owns everything it holds. pos -1 appends. */
tern_status tern_sequence_new(tern_tensor *t, int elem_dtype);
tern_status tern_sequence_insert(tern_tensor *seq, const tern_tensor *item, int64_t pos);
/* The sequence a TERN_SEQUENCE tensor holds; NULL for anything else. */
tern_sequence *tern_sequence_of(const tern_tensor *t);
/* Formats "float[2,3]" into buf. */
const char *tern_shape_str(int dtype, int rank, const int64_t *dims, char *buf, size_t size);

/* Tensor files: .npy (NumPy) or .pb (ONNX TensorProto), chosen by the file's content on read and by
 * the path's extension on write. */
tern_status tern_tensor_read_file(const char *path, tern_tensor *out);
tern_status tern_tensor_write_file(const char *path, const tern_tensor *t);
tern_status tern_tensor_read_npy(const void *bytes, size_t size, const char *what, tern_tensor *out);
tern_status tern_tensor_write_npy(FILE *f, const tern_tensor *t);
tern_status tern_tensor_read_pb(const void *bytes, size_t size, const char *what, tern_tensor *out);
tern_status tern_tensor_write_pb(FILE *f, const tern_tensor *t);
/* Values that may not be tensors. kind TERN_SEQUENCE reads an ONNX SequenceProto, or a folder of
 * tensor files 0.npy (or .pb), 1.npy, ...; kind TERN_NONE reads an ONNX OptionalProto (a tensor, a
 * sequence, or nothing: TERN_NONE), a .npy file (a tensor) or a folder (a sequence); any other kind
 * reads a tensor file. */
tern_status tern_value_read_pb(const void *bytes, size_t size, int kind, const char *what, tern_tensor *out);
tern_status tern_value_read_file(const char *path, int kind, tern_tensor *out);
/* Writes a value: a tensor to PATH.EXT, a sequence as the folder PATH of 0.EXT, 1.EXT, ..., an empty
 * optional not at all. EXT is npy or pb. */
tern_status tern_value_write(const char *path, const tern_tensor *v, const char *ext);

/* ---------------------------------------------------------------- models */

typedef struct tern_model tern_model;
typedef struct tern_graph tern_graph;
typedef struct tern_node tern_node;
typedef struct tern_value tern_value;

/* Loads a model from bytes: binary ONNX or the ONNX text syntax, detected from the content.
 * `source` names the data in messages; `base_dir` is where external tensor data lives (may be NULL). */
tern_status tern_model_load_bytes(const void *bytes, size_t size, const char *source, const char *base_dir,
                                  tern_model **out);
/* Loads from a path, or from standard input when path is NULL or "-". */
tern_status tern_model_load(const char *path, tern_model **out);
void tern_model_free(tern_model *model);

/* Serialises to binary ONNX with every tensor inline (external data included); *out is malloc'd.
 * TERN_EUSAGE when that is over protobuf's 2 GB limit. */
tern_status tern_model_save_bytes(tern_model *model, void **out, size_t *size);
/* How tern_model_write places tensors. By default a tensor that was read from external data goes to
 * the data file and every other one stays in the model. */
typedef struct tern_save_options {
	int inline_all; /* every tensor in the model file (fails when that is over 2 GB) */
	long long external_threshold; /* tensors of at least this many bytes go to the data file too; -1: none */
} tern_save_options;
/* Writes the model as binary ONNX to model_out. With data_out, the tensors chosen by opts (all but
 * those under 1 KiB when the model would be over protobuf's 2 GB limit otherwise) are written to it
 * at 64-byte-aligned offsets and recorded as external data at `location` (relative to the model's
 * folder); data_name names data_out in messages; *wrote_data (may be NULL) says whether anything
 * went there. Without data_out everything is inline, and over 2 GB is TERN_EUSAGE. The model is
 * left as it was. */
tern_status tern_model_write(tern_model *model, FILE *model_out, FILE *data_out, const char *data_name,
                             const char *location, const tern_save_options *opts, int *wrote_data);
/* Bytes of the model's tensors that live in external data files (mapped read-only, not copied). */
size_t tern_model_external_bytes(const tern_model *model);
/* The ONNX text syntax; *out is malloc'd and NUL-terminated. With weights, initializer values are
 * written in full (so the text round trip is lossless); without, large ones are elided. */
tern_status tern_model_save_text(tern_model *model, int with_weights, char **out, size_t *size);
/* Graphviz DOT through cgraph. */
typedef struct tern_dot_options {
	/* Colouring hook: a group number per node (a stream, a rank), or -1 for none. */
	int (*node_group)(const tern_node *node, void *user);
	void *user;
	int show_weights; /* draw initializers as their own nodes */
} tern_dot_options;
tern_status tern_model_save_dot(tern_model *model, const tern_dot_options *opts, char **out, size_t *size);
/* Statistics as text (op counts, parameters, opsets, inputs and outputs). */
tern_status tern_model_stats(tern_model *model, char **out, size_t *size);

/* The model's schedule (tern.schedule, written by tern-schedule), checked against the graph, as text:
 * one line per node in launch order, NODE<TAB>STREAM<TAB>WAITS. TERN_EDATA when absent or invalid. */
tern_status tern_model_plan_text(tern_model *model, char **out, size_t *size);
/* For tern_dot_options.node_group: the stream of each node under the model's schedule. *groups is
 * malloc'd (NULL when the model has no schedule); pass it as `user` with tern_stream_group. */
tern_status tern_model_stream_groups(tern_model *model, void **groups);
int tern_stream_group(const tern_node *node, void *groups);

/* Checks the model: every node names the faulty place. Runs on subgraphs and functions too. */
tern_status tern_model_validate(tern_model *model);

/* The main graph and the model's metadata. */
tern_graph *tern_model_graph(tern_model *model);
const char *tern_model_source(const tern_model *model);
/* metadata_props: NULL when absent. Setting NULL removes the key. */
const char *tern_model_meta(const tern_model *model, const char *key);
tern_status tern_model_set_meta(tern_model *model, const char *key, const char *value);
/* Removes every metadata key that starts with prefix; returns how many were removed. */
int tern_model_drop_meta_prefix(tern_model *model, const char *prefix);
/* The opset version imported for a domain ("" or "ai.onnx" for the default), or -1. */
int64_t tern_model_opset(const tern_model *model, const char *domain);

/* ---------------------------------------------------------------- running */

typedef struct tern_plan tern_plan;
typedef struct tern_threadpool tern_threadpool;

/* A pool of n-1 persistent workers plus the calling thread. */
tern_status tern_threadpool_create(int n_threads, tern_threadpool **out);
void tern_threadpool_free(tern_threadpool *pool);
int tern_threadpool_size(const tern_threadpool *pool);

typedef struct tern_plan_options {
	int n_threads; /* threads (>= 1): stream workers that share the operators; at most the CPUs the
	                * process may run on are used */
	const char **dim_names; /* symbolic dimension values (--dim NAME=N) */
	const int64_t *dim_values;
	int n_dims;
	int single_stream; /* ignore a schedule in the file */
	/* In-place updates (a training step's parameters and optimizer state): the plan may write output
	 * inplace_output[i] straight into the caller's buffer of input inplace_input[i], so that after a
	 * run the input holds the new value and tern_plan_output()->data is the input's data. Taken for
	 * each pair where the planner can show it safe (the producer reads the input element by element
	 * and every other reader of the input finishes before it starts); the others stay in the arena.
	 * The caller must then pass the same buffers at every run. */
	const int *inplace_input, *inplace_output;
	int n_inplace;
	/* Free the bytes of each initializer that every reader packed while planning (weights of Conv,
	 * MatMul, Gemm and tern's fused forms), as soon as the last reader has: the weights are then held
	 * once, not twice. The model may not be written, planned again or trained afterwards. */
	int release_weights;
} tern_plan_options;

/* Plans the main graph for the given input tensors (shape and dtype matter, values do not):
 * shapes, kernels, memory, launch order. n_inputs must equal the number of graph inputs that are not
 * initializers, in graph order. */
tern_status tern_plan_create(tern_model *model, const tern_plan_options *opts, const tern_tensor *inputs, int n_inputs,
                             tern_plan **out);
void tern_plan_free(tern_plan *plan);
/* Runs once. Inputs must have the shapes the plan was made for (re-plan otherwise). Outputs are
 * written into outputs[0..n_outputs), which the plan owns until the next run or free. */
tern_status tern_plan_run(tern_plan *plan, const tern_tensor *inputs, int n_inputs);
int tern_plan_num_outputs(const tern_plan *plan);
const tern_tensor *tern_plan_output(const tern_plan *plan, int index);
const char *tern_plan_output_name(const tern_plan *plan, int index);
/* The graph inputs the caller supplies (non-initializer inputs), in order. */
int tern_model_num_inputs(tern_model *model);
const char *tern_model_input_name(tern_model *model, int index);
/* Declared dtype and shape of input `index`; dims of -1 are symbolic, named by dim_params[i]. */
/* What input `index` is: 0 a tensor, TERN_SEQUENCE a sequence, TERN_NONE an optional. */
int tern_model_input_kind(tern_model *model, int index);
tern_status tern_model_input_type(tern_model *model, int index, int *dtype, int *rank, int64_t *dims,
                                  const char **dim_params);
/* Bytes of the plan's activation arena (a planning figure, for -v and tests). */
size_t tern_plan_arena_bytes(const tern_plan *plan);
/* How many of tern_plan_options' in-place pairs the plan writes in place. */
int tern_plan_num_inplace(const tern_plan *plan);
/* Threads the plan runs on: the n_threads asked for, or fewer CPUs where the process has fewer. */
int tern_plan_num_threads(const tern_plan *plan);

/* Profiling: when enabled, each run records one event per executed node. */
typedef struct tern_profile_event {
	const char *name;
	const char *op_type;
	int stream;
	int thread;
	double start_us;
	double dur_us;
} tern_profile_event;
void tern_plan_enable_profile(tern_plan *plan, int enable);
const tern_profile_event *tern_plan_profile(const tern_plan *plan, int *count);

/* ---------------------------------------------------------------- optimisation (lib/passes) */

/* Which passes tern_optimize runs. Levels: 0 none; 1 rewrites that leave a standard ONNX graph;
 * 2 adds tern's fused operators (domain "tern"); 3 adds rewrites that reassociate floating-point
 * arithmetic. Passes repeat until the graph stops changing. */
typedef struct tern_optimize_options {
	int level;
	const char *const *passes; /* when n_passes > 0: exactly these passes, in this order */
	int n_passes;
	const char *const *dim_names; /* symbolic dimensions made static (--dim NAME=N) */
	const int64_t *dim_values;
	int n_dims;
} tern_optimize_options;

/* What one pass changed over all its runs. */
typedef struct tern_pass_stat {
	const char *name;
	int runs;
	int removed, added, fused, rewritten; /* nodes */
	double ms;
} tern_pass_stat;

/* Optimises the main graph in place. *stats (malloc'd, one entry per pass that ran, in pipeline order)
 * may be NULL. TERN_EUSAGE names an unknown pass. */
tern_status tern_optimize(tern_model *model, const tern_optimize_options *opts, tern_pass_stat **stats, int *n_stats);
/* Makes the named symbolic dimensions static (tern-optimize --dim) in the main graph's declared
 * inputs, outputs and value_info. TERN_EUSAGE names a dimension no shape uses. */
tern_status tern_model_bind_dims(tern_model *model, const char *const *names, const int64_t *values, int n);
/* Types every value of the main graph that tern's shape rules decide (symbolic dimensions kept where
 * a value's dimension is an input's symbol), in the IR; with write_value_info also as value_info
 * entries (and declared outputs that lacked a shape). *typed of *total node outputs got a type. */
tern_status tern_model_infer_shapes(tern_model *model, int write_value_info, int *typed, int *total);
/* ---------------------------------------------------------------- training */

/* What tern-autodiff adds (tern_model_add_training). Numbers < 0 (or 0 where noted) take the
 * default of torch.optim's optimizer of the same name. */
typedef struct tern_train_options {
	const char *loss; /* cross-entropy (default), mse, l1, bce-with-logits */
	const char *output; /* the model output the loss reads (NULL: the first) */
	const char *target; /* the name of the new target input (NULL: "target") */
	const char *loss_output; /* an output that is already the scalar loss (then loss is unused) */
	const char *optimizer; /* sgd (default), adam, adamw, adagrad */
	double lr; /* learning rate */
	double momentum; /* sgd */
	int nesterov; /* sgd */
	double weight_decay; /* < 0: 0 (adamw: 0.01) */
	double beta1, beta2, eps; /* adam, adamw; eps also adagrad; 0: torch's default */
	double clip_norm; /* > 0: clip the gradients' global norm */
	const char *lr_schedule; /* constant, step:EVERY:GAMMA, cosine:STEPS, warmup:STEPS (in steps) */
	const char *const *params; /* fnmatch globs of the initializers to train (none: every float one) */
	int n_params;
	const char *const *freeze; /* globs of initializers not to train */
	int n_freeze;
	/* An embedding table (a parameter that only Gathers along axis 0 read) gets its gradient as the
	 * rows read (tern.SGDRows, tern.AdamRows, tern.AdagradRows), never a dense tensor of its size;
	 * dense_gradients turns that off. The updates are the same either way. */
	int dense_gradients;
} tern_train_options;
typedef struct tern_train_summary {
	int n_params, n_state;
	int n_sparse; /* parameters whose gradient is rows */
	int64_t param_elems;
	int batchnorm_training; /* BatchNormalization nodes that train on batch statistics */
	int batchnorm_inference; /* those left in inference mode (opset < 14 has no training_mode) */
} tern_train_summary;
/* Adds an ONNX TrainingInfoProto whose algorithm graph is one training step (a training-mode copy of
 * the forward computation, the loss, the backward pass, the updates); optimizer state becomes zero
 * initializers of the main graph, and update_binding maps each parameter and state to its new value.
 * The inference graph is unchanged. summary may be NULL. */
tern_status tern_model_add_training(tern_model *model, const tern_train_options *opts, tern_train_summary *summary);

/* Whether the model carries a training algorithm (ONNX TrainingInfoProto). */
int tern_model_has_training(const tern_model *model);
/* Removes it, with the initializers only it reads (optimizer state, the step counter); returns how
 * many initializers went. */
int tern_model_drop_training(tern_model *model);
/* Planned training steps on a model that carries a training algorithm: the inference graph and the
 * algorithm combined and planned once (at the first step); parameters and optimizer state are held
 * by the trainer, fed to each step and replaced by their new values. */
typedef struct tern_trainer tern_trainer;
/* The training step as a model of its own: the inference graph and the algorithm combined, its
 * outputs the algorithm's, every bound initializer (parameter, state) a graph input. */
tern_status tern_model_training_step(tern_model *model, tern_model **out);
/* Optimises a model's training algorithm (tern-optimize on a model from tern-autodiff): the step is
 * optimised as one graph, with the parameters and optimizer state as inputs, so nothing computed from
 * them is folded; the result becomes the algorithm graph (constants the passes made as its
 * initializers). The inference graph, which the algorithm reads by name, is left as it is. */
tern_status tern_model_optimize_training(tern_model *model, const tern_optimize_options *opts, tern_pass_stat **stats,
                                         int *n_stats);
tern_status tern_trainer_create(tern_model *model, const tern_plan_options *opts, tern_trainer **out);
void tern_trainer_free(tern_trainer *trainer);
/* The step's data inputs (the inference graph's, then the algorithm's, such as the target). */
int tern_trainer_num_inputs(const tern_trainer *trainer);
const char *tern_trainer_input_name(const tern_trainer *trainer, int index);
tern_status tern_trainer_input_type(tern_trainer *trainer, int index, int *dtype, int *rank, int64_t *dims);
/* One step on data[0..num_inputs); *loss (may be NULL) gets the algorithm's first output. */
tern_status tern_trainer_step(tern_trainer *trainer, const tern_tensor *data, double *loss);
/* The current value of a bound tensor (a parameter, a state, "tern.step"); NULL if none. */
const tern_tensor *tern_trainer_state(const tern_trainer *trainer, const char *name);
/* Replaces the current value of a parameter or state tensor (same dtype and shape): for a caller that
 * sets parameters itself (another rank's, an eager program's). */
tern_status tern_trainer_set_state(tern_trainer *trainer, const char *name, const tern_tensor *value);
/* The parameters and state tensors (update_binding's keys), in binding order. */
int tern_trainer_num_state(const tern_trainer *trainer);
const char *tern_trainer_state_name(const tern_trainer *trainer, int index);
/* How many bound tensors the planned step updates in place (of *n_state); the others are copied in
 * after each step. 0 before the first step. */
int tern_trainer_num_inplace(const tern_trainer *trainer, int *n_state);
/* The bytes of the planned step's arena (activations, gradients, temporaries); 0 before a step. */
size_t tern_trainer_arena_bytes(const tern_trainer *trainer);
/* The step counter stored in the model (tern.step): the steps taken before this run. */
int64_t tern_trainer_stored_step(const tern_trainer *trainer);
/* The learning rate of the last step (the algorithm's second output, as tern-autodiff writes it);
 * NaN when there is none. */
double tern_trainer_lr(const tern_trainer *trainer);
/* Writes the current values into the model's initializers, so that saving it saves the training. */
tern_status tern_trainer_sync(tern_trainer *trainer);

/* ---------------------------------------------------------------- distribution (lib/dist) */

/* What tern-partition does (tern_model_partition). */
typedef struct tern_partition_options {
	int ranks; /* processes that train together (>= 1) */
	const char *strategy; /* hybrid (default), allreduce, allgather, ps */
	int partitions; /* row shards of each sparse table (0: one per server; -1: auto, which only writes the
	                 * annotation; tern-dist-run chooses and partitions) */
	int servers; /* servers (hosts) that hold the shards (0: one per rank) */
	const int *server_ranks; /* the rank of each server (NULL: spread evenly, s * ranks / servers) */
	int local_aggregation; /* sparse gradients summed per host before they are pushed */
	double bucket_mb; /* dense gradients reduced together up to this size (<= 0: 4 MiB) */
	int no_overlap; /* buckets reduced after the backward pass (tern.AllReduce), not started while it runs */
} tern_partition_options;
typedef struct tern_partition_summary {
	int n_dense, n_sparse; /* parameters by how their gradients travel */
	int n_buckets; /* AllReduce calls a step */
	int64_t dense_elems, sparse_elems;
} tern_partition_summary;
/* Rewrites a model's training algorithm into one SPMD step for opts->ranks processes: dense gradients
 * through tern.AllReduce, sparse tables (gradients as rows) by strategy, and the annotation
 * TERN_PARTITION_KEY that says so. */
tern_status tern_model_partition(tern_model *model, const tern_partition_options *opts, tern_partition_summary *summary);
/* The ranks a model's step was partitioned for (1: not partitioned). */
int tern_model_partition_ranks(const tern_model *model);
/* Whether the annotation asks for the partition count to be chosen by timing (--partitions auto);
 * then *opts gets what else it says (strategy a static string). */
int tern_model_partition_auto(const tern_model *model, tern_partition_options *opts);

/* The communicator the tern.AllReduce, tern.Pull, tern.Push and tern.AllGatherRows kernels use: one
 * per process, set before planning (tern-dist-run sets MPI's). Without one a process is rank 0 of 1.
 * Every function is collective (all ranks call it in the same order) and returns 0 on success. */
typedef struct tern_comm {
	int rank, size;
	void *ctx;
	/* buf[0..count) of dtype (float or double) summed over the ranks, in place */
	int (*allreduce)(void *ctx, void *buf, int64_t count, int dtype);
	/* send + send_off[r], send_bytes[r] bytes to rank r; recv_bytes[r] bytes from rank r to
	 * recv + recv_off[r] (the receiver knows the sizes) */
	int (*alltoallv)(void *ctx, const void *send, const int64_t *send_bytes, const int64_t *send_off, void *recv,
	                 const int64_t *recv_bytes, const int64_t *recv_off);
	/* every rank's bytes[r] at recv + off[r], its own from send */
	int (*allgatherv)(void *ctx, const void *send, void *recv, const int64_t *bytes, const int64_t *off);
	/* a message of what the last failure was (may be NULL) */
	const char *(*error)(void *ctx);
	/* Optional, for dense gradients reduced while the backward pass goes on (tern.AllReduceStart):
	 * start the sum of buf[0..count) in place and set *request; test sets *done once it has finished
	 * (and moves it on: the executor calls it between nodes); wait blocks until it has. Without
	 * iallreduce the start is the blocking allreduce. */
	int (*iallreduce)(void *ctx, void *buf, int64_t count, int dtype, void **request);
	int (*test)(void *ctx, void *request, int *done);
	int (*wait)(void *ctx, void *request);
} tern_comm;
void tern_comm_set(const tern_comm *comm);
const tern_comm *tern_comm_get(void);
/* Bytes this process sent and received through the communicator since the last reset, by kind: the
 * payload each collective moves (allreduce counted as a ring's 2(n-1)/n of the buffer each way,
 * alltoallv as what goes to and comes from other ranks, allgatherv as a ring's). */
enum {
	TERN_COMM_DENSE,
	TERN_COMM_SPARSE_PUSH,
	TERN_COMM_SPARSE_PULL,
	TERN_COMM_SPARSE_LOCAL, /* sparse gradients to the host's first rank (--local-aggregation) */
	TERN_COMM_OTHER,
	TERN_COMM_KINDS
};
const char *tern_comm_kind_name(int kind);
void tern_comm_bytes(int64_t sent[TERN_COMM_KINDS], int64_t received[TERN_COMM_KINDS]);
void tern_comm_reset_bytes(void);
/* The bytes each kind should have sent by the first-principles count (tern-dist-run(1)), from the rows
 * the operators actually touched (indices left out): an allreduce of w bytes 2w(n-1)/n, a pull or a
 * push of u distinct rows of r bytes u*r*(n-1)/n, an allgather of k rows k*r*(n-1). */
void tern_comm_expected(int64_t expected[TERN_COMM_KINDS]);
/* Collectives that count their bytes (kind TERN_COMM_*): for tools that talk beside the graph. */
tern_status tern_comm_allreduce(int kind, void *buf, int64_t count, int dtype);
tern_status tern_comm_allgatherv(int kind, const void *send, void *recv, const int64_t *bytes, const int64_t *off);

/* A trainer on a partitioned model: before the first step, each rank's shards of the sparse tables
 * (and their optimizer state) are filled from the model's full tables; tern_dist_gather writes the
 * shards of every rank back into the full tables of rank 0's model (collective; call before
 * tern_trainer_sync and writing the model). */
tern_status tern_dist_scatter(tern_trainer *trainer, tern_model *model);
tern_status tern_dist_gather(tern_trainer *trainer, tern_model *model);


/* The passes, in pipeline order: name, one-line description, and the lowest level that runs each. */
int tern_pass_count(void);
const char *tern_pass_name(int index);
const char *tern_pass_description(int index);
int tern_pass_level(int index);

#ifdef __cplusplus
}
#endif
#endif
