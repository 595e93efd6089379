/* internal.h — the structures shared by libtern's layers (IR, operator registry, planner).
 * Not installed: tools use tern.h only. */
#ifndef TERN_INTERNAL_H
#define TERN_INTERNAL_H

#include "onnx.pb-c.h"
#include "values.pb-c.h"
#include "tern.h"
#include "tern_config.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define TERN_ALIGN 64
/* Instruction-set paths (isa.c): kernels are compiled for each and chosen by tern_isa(), the machine's
 * best capped by TERN_ISA. Ordered, so that "at least AVX2" is a comparison. */
enum { TERN_ISA_GENERIC, TERN_ISA_AVX2, TERN_ISA_AVX512 };
extern int tern_isa_level; /* set once when the library loads; read-only afterwards */
static inline int tern_isa(void)
{
	return tern_isa_level;
}
long tern_l2_bytes(void); /* bytes of one core's second-level cache (isa.c) */
#if defined(__x86_64__) && defined(__GNUC__)
#define TERN_HAVE_ISA_TARGETS 1
/* GCC vectorises loops 256 bits wide even for x86-64-v4 unless told otherwise */
#if defined(__clang__)
#define TERN_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#else
#define TERN_TARGET_AVX512 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))
#endif
#define TERN_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#else
#define TERN_HAVE_ISA_TARGETS 0
#define TERN_TARGET_AVX512
#define TERN_TARGET_AVX2
#endif
/* A kernel compiled once per path: write its body as
 *     TERN_ISA_BODY void F_body(PARAMS) { ... }
 * and then TERN_ISA_VARIANTS3(void, F, (PARAMS), (ARGS)) defines F, which calls the body built for
 * AVX-512, AVX2 + FMA or the baseline, whichever tern_isa() says; VARIANTS2 leaves AVX-512 out (for
 * loops that gain nothing from it). The body is inlined into each variant and so compiled for its
 * instruction set; the helpers it calls are compiled for the baseline unless they are inlined too. */
#define TERN_ISA_BODY static inline __attribute__((always_inline))
#if TERN_HAVE_ISA_TARGETS
#define TERN_ISA_VARIANTS3(RET, F, PARAMS, ARGS)                                   \
	TERN_TARGET_AVX512 static RET F##_avx512 PARAMS { return F##_body ARGS; } \
	TERN_TARGET_AVX2 static RET F##_avx2 PARAMS { return F##_body ARGS; }     \
	static RET F##_generic PARAMS { return F##_body ARGS; }                   \
	static RET F PARAMS                                                        \
	{                                                                          \
		if (tern_isa() == TERN_ISA_AVX512)                                 \
			return F##_avx512 ARGS;                                    \
		if (tern_isa() == TERN_ISA_AVX2)                                   \
			return F##_avx2 ARGS;                                      \
		return F##_generic ARGS;                                           \
	}
#define TERN_ISA_VARIANTS2(RET, F, PARAMS, ARGS)                               \
	TERN_TARGET_AVX2 static RET F##_avx2 PARAMS { return F##_body ARGS; } \
	static RET F##_generic PARAMS { return F##_body ARGS; }               \
	static RET F PARAMS                                                    \
	{                                                                      \
		if (tern_isa() >= TERN_ISA_AVX2)                               \
			return F##_avx2 ARGS;                                  \
		return F##_generic ARGS;                                       \
	}
#else
#define TERN_ISA_VARIANTS3(RET, F, PARAMS, ARGS) \
	static RET F PARAMS { return F##_body ARGS; }
#define TERN_ISA_VARIANTS2 TERN_ISA_VARIANTS3
#endif
#define TERN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- core helpers */

void *tern_xmalloc(size_t n); /* NULL on failure; callers report TERN_EOS */
void *tern_aligned_alloc(size_t n); /* 64-byte aligned, zeroed; free with free() */
void *tern_aligned_alloc_uninit(size_t n); /* the same, not zeroed */
char *tern_strdup(const char *s);
/* Growable array: *items of *count with capacity *cap; returns false when out of memory. */
bool tern_grow(void **items, size_t *cap, size_t need, size_t item_size);
double tern_now_us(void);
/* Reads all of f; `name` names it in messages. *out is malloc'd. */
tern_status tern_read_stream(FILE *f, const char *name, uint8_t **out, size_t *size);

/* Tensor <-> TensorProto. base_dir resolves external data; `what` names the tensor in messages. */
tern_status tern_tensor_from_proto(const Onnx__TensorProto *tp, const char *base_dir, const char *what,
                                   tern_tensor *out);
/* A view of the tensor's bytes where they lie (raw_data, or mapped external data), owning nothing;
 * false when the tensor is not stored that way (typed fields, strings) or not 16-byte aligned. Plans
 * and passes read weights through it, so neither adds a copy of the parameters. */
bool tern_tensor_view_proto(const Onnx__TensorProto *tp, tern_tensor *t);
/* Fills a freshly initialised TensorProto (raw_data encoding) from t. Allocations are malloc'd so
 * that onnx__tensor_proto__free_unpacked can free them. */
tern_status tern_tensor_to_proto(const tern_tensor *t, Onnx__TensorProto *tp);

/* ---------------------------------------------------------------- IR */

/* Type of a value: dtype and shape. rank -1 = unknown rank; dims[i] -1 = unknown (dim_param may
 * name it). */
typedef struct tern_type {
	int dtype;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	const char *dim_param[TERN_MAX_RANK]; /* points into the proto; may be NULL */
} tern_type;

enum tern_value_flags {
	TERN_VALUE_INPUT = 1 << 0, /* a graph input the caller provides */
	TERN_VALUE_INITIALIZER = 1 << 1, /* constant data in the graph */
	TERN_VALUE_OUTPUT = 1 << 2, /* a graph output */
	TERN_VALUE_OUTER = 1 << 3, /* defined in an enclosing graph (subgraph reference) */
};

struct tern_value {
	char *name; /* owned */
	tern_type type;
	unsigned flags;
	tern_node *producer; /* NULL for inputs, initializers, outer values */
	int producer_output;
	tern_node **consumers;
	size_t n_consumers, cap_consumers;
	Onnx__TensorProto *initializer; /* points into the proto when TERN_VALUE_INITIALIZER */
	tern_value *outer; /* the enclosing graph's value when TERN_VALUE_OUTER */
	int index; /* dense index within its graph */
};

struct tern_node {
	Onnx__NodeProto *proto; /* the node as stored; attributes and unknown fields stay here */
	const char *name; /* proto->name, or "" */
	const char *op_type;
	const char *domain; /* "" for the default domain */
	tern_graph *graph;
	tern_value **inputs; /* NULL entries for omitted optional inputs */
	size_t n_inputs;
	tern_value **outputs; /* NULL entries for omitted optional outputs */
	size_t n_outputs;
	tern_graph **subgraphs; /* graph attributes, in attribute order */
	size_t n_subgraphs;
	/* Values of this graph (or enclosing ones) that the node's subgraphs read: dependencies too. */
	tern_value **implicit;
	size_t n_implicit, cap_implicit;
	const struct tern_op *op; /* resolved registry entry, NULL until resolved */
	int64_t opset; /* version of the node's domain in this model */
	int index; /* position in graph->nodes */
	int removed;
};

enum tern_graph_kind { TERN_GRAPH_MAIN, TERN_GRAPH_SUBGRAPH, TERN_GRAPH_FUNCTION, TERN_GRAPH_TRAINING };

struct tern_graph {
	enum tern_graph_kind kind;
	Onnx__GraphProto *proto; /* for MAIN and SUBGRAPH */
	Onnx__FunctionProto *fproto; /* for FUNCTION */
	tern_model *model;
	tern_graph *parent; /* enclosing graph of a subgraph */
	tern_node *owner; /* node whose attribute holds this subgraph */
	const char *name;
	tern_node **nodes;
	size_t n_nodes, cap_nodes;
	tern_value **values; /* every value, dense by index */
	size_t n_values, cap_values;
	/* open-addressing hash of values by name */
	tern_value **table;
	size_t table_cap;
	tern_value **inputs; /* graph inputs in order (initializers included when the file lists them) */
	size_t n_inputs;
	tern_value **outputs;
	size_t n_outputs;
};

struct tern_model {
	Onnx__ModelProto *proto; /* owns every proto message */
	tern_graph *graph;
	tern_graph **functions;
	size_t n_functions;
	char *source; /* display name for messages */
	char *base_dir; /* for external data */
	struct tern_mapping **mappings; /* read-only maps of the external data files (external.c) */
	size_t n_mappings;
	size_t external_bytes; /* bytes of tensors that live in them */
	int ir_complete; /* the IR describes every proto node (a load did not stop half way) */
};

/* External data (external.c): maps every EXTERNAL tensor's bytes read-only and points its raw_data
 * there, keeping its location; tern_model_unmap releases the maps (after the protos are freed).
 * Every free of a proto message that may hold such a tensor passes &tern_pb_allocator, which leaves
 * mapped bytes alone. */
tern_status tern_model_map_external(tern_model *model);
void tern_model_unmap(tern_model *model);
extern ProtobufCAllocator tern_pb_allocator;
/* A deep copy of any protobuf message (through its wire form, so mapped bytes are copied too), to be
 * freed with tern_pb_allocator; NULL when out of memory. */
void *tern_pb_copy(const void *message);
/* Drops the resident pages of [p, p + n) when it lies in a mapping of external data (a kernel has
 * copied the bytes, packed); they are read from the file again if touched. Else nothing. */
void tern_mapped_release(const void *p, size_t n);
/* The whole pages inside [p, p + n) of a private file mapping given back (read again from the file
 * on the next access). */
void tern_pages_release(const void *p, size_t n);
/* The tensor's bytes are mapped from its external data file. */
bool tern_tensor_proto_mapped(const Onnx__TensorProto *tp);

/* Reverse-mode differentiation of the main graph (lib/autodiff): adds the nodes that compute the
 * gradient of sum_j <ys[j], seeds[j]> (seeds NULL, or an entry NULL: ones, so a scalar loss's own
 * gradient) with respect to each of wrt[0..n_wrt), and sets grads[i] to it (NULL when nothing
 * depends on wrt[i]). TERN_EDATA names a node without a rule. */
tern_status tern_autodiff(tern_model *model, tern_value *const *ys, tern_value *const *seeds, int n_ys,
                          tern_value *const *wrt, int n_wrt, tern_value **grads);
/* The same, with sparse gradients: for each wrt[i] with rows_ok[i] whose gradient flows only through
 * Gathers along axis 0 that read its rows (an embedding table), the gradient is given as rows instead
 * of a dense tensor of the table's size: grad_indices[i] the row indices (Gather's indices, any
 * integer type and shape, negative ones counting from the end, duplicates not summed) and grads[i]
 * the rows, [indices' shape..., the table's row shape]. Elsewhere grad_indices[i] is NULL and
 * grads[i] dense. */
tern_status tern_autodiff_rows(tern_model *model, tern_value *const *ys, tern_value *const *seeds, int n_ys,
                               tern_value *const *wrt, int n_wrt, const bool *rows_ok, tern_value **grads,
                               tern_value **grad_indices);
/* tern_autodiff_rows with flags: TERN_AUTODIFF_ANY, ys that depend on none of wrt give NULL gradients
 * instead of an error; TERN_AUTODIFF_FULL_SHAPE, every gradient has its value's shape (the gradient
 * of a kept call may be a zero scalar where a branch did not read the value). tern_autodiff_rows is
 * FULL_SHAPE. */
enum { TERN_AUTODIFF_ANY = 1, TERN_AUTODIFF_FULL_SHAPE = 2 };
tern_status tern_autodiff_impl(tern_model *model, tern_value *const *ys, tern_value *const *seeds, int n_ys,
                               tern_value *const *wrt, int n_wrt, const bool *rows_ok, tern_value **grads,
                               tern_value **grad_indices, int flags);
/* Gradients through calls of model-local functions, If and Loop (lib/autodiff/functions.c): lifts
 * each If branch that the main graph reaches into a function (and each Loop into the recursion of
 * its trips), in the domain TERN_GRAD_DOMAIN, writes F__fwd (F whose calls and Ifs
 * keep their frames, each giving a handle) and F__grad (its gradient, reading the kept frame through
 * tern.Saved) for every function reached, and makes the main graph's calls and Ifs kept ones, so that
 * tern_autodiff then emits tern.Backward for them. *model may be replaced (reloaded); *changed says
 * whether anything was done (nothing is when the main graph has no call and no If). */
tern_status tern_grad_prepare_calls(tern_model **model, bool *changed);
#define TERN_GRAD_DOMAIN "tern.grad"

/* The inputs a call of an ONNX operator version must have (lib/ops/arity.c, generated from onnx's
 * schemas): the least count and a mask of the required positions; and its attributes' names, each
 * between spaces (" alpha beta "). */
typedef struct tern_arity {
	const char *domain, *op_type;
	int since_version;
	int min_inputs;
	uint32_t required;
	const char *attributes;
} tern_arity;
extern const tern_arity tern_arities[];
extern const size_t tern_n_arities;
/* The entry for domain.op_type at opset (NULL: none known). */
const tern_arity *tern_arity_find(const char *domain, const char *op_type, int64_t opset);

/* BLAS runs on the calling thread: its own threads (started with the library) would spin beside
 * tern's. Once per process; plans and eager contexts call it. */
void tern_blas_own_threads(void);

/* Runs a graph node eagerly (lib/eager): its operator, attributes and opset, on in[0..n_inputs),
 * out[0..n_outputs) set to new references (NULL where left out). */
struct tern_ctx;
struct tern_var;
tern_status tern_call_node(struct tern_ctx *ctx, const tern_node *node, struct tern_var *const *in,
                           struct tern_var **out);

/* Adds domain at version to the model's opset imports unless it imports it already. */
tern_status tern_model_import_opset(tern_model *model, const char *domain, int64_t version);

/* Builds the IR of a model from its proto (graph, subgraphs, functions). */
tern_status tern_model_build_ir(tern_model *model);
/* Writes IR changes (node order, added and removed nodes, value types) back into the proto. */
tern_status tern_model_sync(tern_model *model);

tern_value *tern_graph_find(const tern_graph *g, const char *name);
/* Looks a name up in g and then its enclosing graphs. */
tern_value *tern_graph_lookup(const tern_graph *g, const char *name);
/* Finds or creates the value called name in g. */
tern_value *tern_graph_value(tern_graph *g, const char *name);
/* A name not yet used in the model, from a stem ("conv1_fused" -> "conv1_fused", "conv1_fused_1"). */
char *tern_graph_unique_name(tern_graph *g, const char *stem);

/* Reorders g->nodes topologically, keeping the current order wherever it already is one (removed
 * nodes last, for tern_model_sync to free). */
tern_status tern_graph_stable_order(tern_graph *g);
/* Nodes in topological order (a new array, *out malloc'd); TERN_EDATA naming a node on a cycle. */
tern_status tern_graph_toposort(tern_graph *g, tern_node ***out, size_t *n);

/* Graph editing, for passes. Added nodes get a fresh NodeProto; their inputs and outputs are
 * resolved or created by name. */
tern_node *tern_graph_add_node(tern_graph *g, const char *op_type, const char *domain, const char *name,
                               const char *const *inputs, size_t n_inputs, const char *const *outputs,
                               size_t n_outputs);
/* Puts node at position at of g->nodes (the file's order), the others after it moved along. */
void tern_graph_move_node(tern_graph *g, tern_node *node, size_t at);
void tern_graph_remove_node(tern_graph *g, tern_node *node);
void tern_node_set_input(tern_node *node, size_t i, tern_value *v);
/* Every use of old (node inputs and graph outputs) now reads new. */
void tern_value_replace_uses(tern_graph *g, tern_value *old_value, tern_value *new_value);
/* Attributes appended to a node created by tern_graph_add_node. */
tern_status tern_node_add_attr_int(tern_node *node, const char *name, int64_t v);
tern_status tern_node_add_attr_float(tern_node *node, const char *name, float v);
tern_status tern_node_add_attr_ints(tern_node *node, const char *name, const int64_t *v, size_t n);
tern_status tern_node_add_attr_floats(tern_node *node, const char *name, const float *v, size_t n);
tern_status tern_node_add_attr_string(tern_node *node, const char *name, const char *v);
/* The same on a node proto outside the IR (a function being written); tern_proto_new_attr appends an
 * attribute of that type for the caller to fill (NULL: out of memory). */
Onnx__AttributeProto *tern_proto_new_attr(Onnx__NodeProto *np, const char *name, Onnx__AttributeProto__AttributeType type);
tern_status tern_proto_add_attr_int(Onnx__NodeProto *np, const char *name, int64_t v);
tern_status tern_proto_add_attr_string(Onnx__NodeProto *np, const char *name, const char *v);
tern_status tern_proto_add_attr_tensor(Onnx__NodeProto *np, const char *name, const tern_tensor *t);
tern_status tern_node_add_attr_strings(tern_node *node, const char *name, const char *const *v, size_t n);
tern_status tern_node_add_attr_tensor(tern_node *node, const char *name, const tern_tensor *t);
/* Adds an initializer to the main graph (copying t). */
tern_value *tern_graph_add_initializer(tern_graph *g, const char *name, const tern_tensor *t);
/* The same, taking t's bytes when t owns them (t is left empty: tern_tensor_free on it is a no-op). */
tern_value *tern_graph_take_initializer(tern_graph *g, const char *name, tern_tensor *t);
/* Removes initializer v from the graph (its proto freed); not for initializers that are inputs. */
void tern_graph_drop_initializer(tern_graph *g, tern_value *v);
/* A new graph input name of type t / v as a new graph output (declared with v's type). */
tern_value *tern_graph_add_input(tern_graph *g, const char *name, const tern_type *t);
tern_status tern_graph_add_output(tern_graph *g, tern_value *v);
/* A TypeProto (tensor type) for t: dims as values, symbols as dim_param, others unknown. */
Onnx__TypeProto *tern_type_to_proto(const tern_type *t);

/* Attribute access. The getters return the default when the attribute is absent. */
const Onnx__AttributeProto *tern_attr(const tern_node *node, const char *name);
int64_t tern_attr_int(const tern_node *node, const char *name, int64_t dflt);
float tern_attr_float(const tern_node *node, const char *name, float dflt);
/* NUL-terminated copy is not made: returns the bytes and their length; dflt when absent. */
const char *tern_attr_string(const tern_node *node, const char *name, const char *dflt);
const int64_t *tern_attr_ints(const tern_node *node, const char *name, size_t *n);
const float *tern_attr_floats(const tern_node *node, const char *name, size_t *n);
const Onnx__TensorProto *tern_attr_tensor(const tern_node *node, const char *name);
tern_graph *tern_attr_graph(const tern_node *node, const char *name);

/* "node 'conv1' (Conv)" into buf, for messages. */
const char *tern_node_desc(const tern_node *node, char *buf, size_t size);
/* Sets an error that names the model source and the node: "SRC: node 'x' (Op): message". */
tern_status tern_node_errorf(const tern_node *node, tern_status status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* Type of a value from a ValueInfoProto / TypeProto. */
void tern_type_from_proto(const Onnx__TypeProto *tp, tern_type *out);
void tern_type_unknown(tern_type *t);

/* Text syntax (lib/graph/text_parse.c, text_print.c). */
tern_status tern_text_parse_model(const char *text, size_t len, const char *source, Onnx__ModelProto **out);
tern_status tern_text_print_model(const Onnx__ModelProto *model, int with_weights, char **out, size_t *size);

/* ---------------------------------------------------------------- threads */

/* Calls fn(ctx, i) for i in [0, n) spread over the pool; returns when all are done. fn must not
 * call tern_parallel_for on the same pool. A NULL pool runs serially. */
void tern_parallel_for(tern_threadpool *pool, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx);
/* The threads whose work a kernel may sum in parts: a kernel that would keep a partial sum per thread
 * (and so round differently with each count) keeps that many, not tern_threadpool_size's. A pool's
 * size; 1 on a team of guests. */
int tern_threadpool_sums(const tern_threadpool *pool);
/* A team of guests: member 0 is a thread of its own, the others threads that wait for it and join its
 * parallel loops meanwhile (tern_team_help_until_moved): eager's asynchronous kernels and the caller.
 * Its kernels give the results of the pool of one (tern_threadpool_sums is 1) while sharing out work
 * whose parts do not add up, and may hand out smaller parts, the guests being awake when they help
 * at all (tern_threadpool_guests: nonzero). */
tern_status tern_team_create_guests(int n_members, tern_threadpool **out);
int tern_threadpool_guests(const tern_threadpool *pool);

/* A team: a pool of n_members threads that the caller provides (the stream workers). Each member
 * calls tern_team_join once; its parallel_for jobs are then run by it and by any member calling
 * tern_team_help (which runs chunks of the jobs posted and returns whether it ran any). Freed with
 * tern_threadpool_free. */
tern_status tern_team_create(int n_members, tern_threadpool **out);
void tern_team_join(const tern_threadpool *team, int index);
int tern_team_help(tern_threadpool *team);
/* Member `me` of a team that is not one of its threads' own (a thread waiting on another that is
 * a member, lending its core meanwhile): runs chunks of the jobs posted while *gen stays at seen,
 * spinning between them; returns as tern_spin_until_moved does, its 200 microseconds counted from
 * the last chunk run. */
bool tern_team_help_until_moved(tern_threadpool *team, int me, const atomic_uint_fast64_t *gen, uint64_t seen);
/* Waiting for work without losing a wake-up: a member that found nothing to do calls tern_team_idle,
 * which helps with a posted job, or backs off and returns, or after a while sleeps unless has_work(ctx)
 * says otherwise, until the next tern_team_notify; whoever makes work (a finished step) calls that
 * after making it visible. Posted jobs notify by themselves. */
void tern_team_notify(tern_threadpool *team);
/* One pause of a spinning thread (x86's pause; nothing elsewhere). */
static inline void tern_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}
/* Spins (pausing) until *gen differs from seen or about 200 microseconds have passed; true if it
 * moved. A thread about to sleep until a generation counter moves calls it first, to skip the wake-up
 * when the wait is short. */
bool tern_spin_until_moved(const atomic_uint_fast64_t *gen, uint64_t seen);
/* The same, until *n is zero. */
bool tern_spin_until_zero(const atomic_int *n);
void tern_team_idle(tern_threadpool *team, bool (*has_work)(void *), void *ctx, int *spins);

/* ---------------------------------------------------------------- operators */

typedef struct tern_exec *tern_exec_ptr;

/* What a kernel sees: inputs and outputs bound to storage, parameters decided when planning. */
typedef struct tern_kernel_args {
	const tern_node *node;
	tern_tensor **in; /* NULL for omitted optional inputs */
	int n_in;
	tern_tensor **out; /* NULL for omitted optional outputs */
	int n_out;
	void *params; /* op-private, from prepare */
	void *scratch; /* scratch_bytes of per-run scratch, aligned */
	tern_threadpool *pool; /* never NULL (a team of stream workers on several streams) */
	tern_exec_ptr exec; /* the executor running this node (for operators that run subgraphs) */
} tern_kernel_args;

typedef tern_status (*tern_kernel_fn)(const tern_kernel_args *a);

/* What prepare sees and decides. Inputs have dtype and shape set; data is non-NULL only for values
 * known while planning (initializers, folded constants). prepare sets every present output's dtype
 * and shape, the kernel, and optionally params (freed with free_params) and scratch_bytes.
 * Returning TERN_EAGAIN-like `defer` (set p->defer = 1 and return TERN_OK) means an input value is
 * needed that only exists at run time: the planner then prepares this node when it runs, and its
 * outputs' storage is allocated then. */
typedef struct tern_prepare_args {
	const tern_node *node;
	tern_tensor **in; /* shapes set; data may be NULL */
	int n_in;
	tern_tensor **out; /* to fill: dtype, rank, dims (data not yet bound) */
	int n_out;
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *params);
	size_t scratch_bytes;
	int defer;
	/* The kernel's output shapes depend on input values (NonZero, Unique, Loop): the kernel allocates
	 * its outputs itself with tern_tensor_alloc. */
	int dynamic_output;
	/* With dynamic_output, bit o: output o's dtype and shape are set all the same, fixed by what the
	 * graph declares (an If whose branches declare it, a call of a function whose result is declared
	 * so): the output is allocated like any other, the kernel writes it in place and fails when what
	 * it computes differs, and the nodes that read it are planned ahead. */
	uint32_t fixed_outputs;
	/* With dynamic_output, bit o: output o's dtype and shape are set and the same at every run (the
	 * kernel checks), though the kernel gives its bytes (a view of a kept call's value): the nodes
	 * that read it are planned ahead. */
	uint32_t shaped_outputs;
	/* The kernel may write output i into input i's storage (elementwise ops, Reshape). */
	int inplace_ok;
	/* Bit j: any output of input j's dtype and shape may share input j's storage (every element of
	 * it is read before the same element of the output is written, and nothing else of it is read
	 * afterwards): the parameter updates of a training step, written in place. */
	uint32_t inplace_inputs;
	/* Output 0 aliases input 0's storage (Reshape, Squeeze, Flatten, Identity): no kernel runs. */
	int alias_input0;
	/* Bit j: the kernel made its own copy of input j's values here (packed weights) and never reads
	 * input j when it runs, so a plan that may (tern_plan_options.release_weights) frees the bytes of
	 * an initializer once every reader has packed it. */
	uint32_t packed_inputs;
	tern_exec_ptr exec; /* the executor planning this node (for operators that plan subgraphs) */
	tern_threadpool *pool; /* the pool the kernel will get */
} tern_prepare_args;

struct tern_grad_ctx;
typedef struct tern_op {
	const char *domain; /* "" for ai.onnx */
	const char *op_type;
	int since_version; /* first opset this entry handles */
	int until_version; /* last opset it handles (0: up to the newest) */
	tern_status (*prepare)(tern_prepare_args *p);
	/* Dtypes the kernel accepts for input 0, as a bit mask (1u << dtype); 0 = prepare checks. */
	uint32_t dtypes;
	const char *family; /* source family, for the operator table */
	/* The gradient rule (lib/autodiff/grad.h), beside the forward code; NULL: not differentiable. */
	tern_status (*grad)(struct tern_grad_ctx *g);
} tern_op;

#define TERN_DT(x) (1u << TERN_##x)
#define TERN_DT_FLOATS (TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(FLOAT16) | TERN_DT(BFLOAT16))
#define TERN_DT_INTS                                                                                           \
	(TERN_DT(INT8) | TERN_DT(INT16) | TERN_DT(INT32) | TERN_DT(INT64) | TERN_DT(UINT8) | TERN_DT(UINT16) | \
	 TERN_DT(UINT32) | TERN_DT(UINT64))
#define TERN_DT_NUMERIC (TERN_DT_FLOATS | TERN_DT_INTS)
#define TERN_DT_ALL (TERN_DT_NUMERIC | TERN_DT(BOOL) | TERN_DT(STRING))

/* Each family file defines one table, listed in lib/ops/registry.c. */
typedef struct tern_op_table {
	const tern_op *ops;
	size_t n_ops;
} tern_op_table;

/* The entry for (domain, op_type) at opset version; NULL when unsupported. */
const tern_op *tern_op_find(const char *domain, const char *op_type, int64_t opset);
/* Whether any entry has this name (to tell "unsupported opset" from "unknown operator"). */
bool tern_op_known(const char *domain, const char *op_type);
/* Every entry, for the operator table. */
size_t tern_op_count(void);
const tern_op *tern_op_at(size_t i);

/* Helpers for prepare functions. */
/* Numpy-style broadcast of shapes; TERN_EDATA (naming the node) when incompatible. */
tern_status tern_broadcast_shape(const tern_node *node, int ra, const int64_t *da, int rb, const int64_t *db, int *rank,
                                 int64_t *dims);
/* Set output i to (dtype, rank, dims). */
void tern_set_shape(tern_tensor *t, int dtype, int rank, const int64_t *dims);
/* float16/bfloat16 conversions. */
float tern_f16_to_f32(uint16_t h);
uint16_t tern_f32_to_f16(float f);
float tern_bf16_to_f32(uint16_t h);
uint16_t tern_f32_to_bf16(float f);
/* float8 (dtype: TERN_FLOAT8E4M3FN .. TERN_FLOAT8E5M2FNUZ) to and from float, rounding to nearest even as
 * ONNX's Cast does. Out-of-range values (infinity included) become the largest finite value when
 * saturate is set, else infinity (E5M2) or NaN. The _n forms convert n elements. */
float tern_f8_to_f32(int dtype, uint8_t v);
uint8_t tern_f32_to_f8(int dtype, float f, int saturate);
void tern_f8_to_f32_n(int dtype, const uint8_t *src, float *dst, int64_t n);
void tern_f32_to_f8_n(int dtype, const float *src, uint8_t *dst, int64_t n, int saturate);

/* ---------------------------------------------------------------- scheduling (lib/sched) */

/* A multi-stream schedule of a graph's nodes (Nimble): launch order, a stream per node, and the
 * nodes on other streams each node waits for. Stored in metadata_props under "tern.schedule" as one
 * line per node in launch order: NODE<TAB>STREAM<TAB>WAITS (WAITS: comma-separated node names, or -). */
typedef struct tern_schedule {
	int n_nodes;
	tern_node **order; /* launch order (a topological order) */
	int *stream; /* per launch position */
	int **waits; /* per launch position: launch positions of the nodes it waits for */
	int *n_waits;
	int n_streams;
} tern_schedule;

typedef struct tern_schedule_stats {
	int reduced_edges; /* edges of the transitive reduction */
	int matching; /* size of the maximum matching */
	int chains; /* minimum path cover */
	int streams; /* after merging and capping */
	int waits; /* cross-stream waits placed */
	int64_t lost_pairs; /* concurrent node pairs put on one stream by the cap */
} tern_schedule_stats;

/* ---------------------------------------------------------------- distribution (lib/dist) */

/* tern-partition's annotation: what the step was partitioned into (formats/annotations.md). */
#define TERN_PARTITION_KEY "tern.partition"
int tern_comm_rank(void);
int tern_comm_size(void);
/* Collectives that count their bytes under kind (comm.c); with one process they copy. */
tern_status tern_comm_alltoallv(int kind, const void *send, const int64_t *send_bytes, const int64_t *send_off,
                                void *recv, const int64_t *recv_bytes, const int64_t *recv_off);
tern_status tern_comm_alltoall_counts(int kind, const int64_t *send, int64_t *recv);
/* A nonblocking allreduce (sum, in place) of buf, which must stay untouched until tern_comm_wait(buf);
 * tern_comm_progress moves the pending ones on (cheap when there are none). */
tern_status tern_comm_iallreduce(int kind, void *buf, int64_t count, int dtype);
tern_status tern_comm_wait(const void *buf);
void tern_comm_progress(void);
/* Adds to the first-principles count of kind (tern_comm_expected). */
void tern_comm_expect(int kind, double bytes);
/* Replaces a model's training algorithm by a training step model's graph (as tern_model_training_step
 * made it, then edited): its nodes, its outputs, the algorithm's own inputs. */
tern_status tern_model_set_training_step(tern_model *model, tern_model *step);
/* Replaces the bytes of initializer v by value's (same dtype and shape), as raw data it owns. */
tern_status tern_initializer_replace(tern_value *v, const tern_tensor *value);

#define TERN_SCHEDULE_KEY "tern.schedule"
/* The schedule of a model's training step (the inference graph and its training algorithm combined,
 * tern_model_training_step), in the same form. */
#define TERN_TRAINING_SCHEDULE_KEY "tern.training_schedule"

/* Computes a schedule for graph g: max_streams 0 = uncapped. */
tern_status tern_schedule_compute(tern_graph *g, int max_streams, tern_schedule **out, tern_schedule_stats *stats);
/* The annotation text of a schedule (malloc'd). */
tern_status tern_schedule_format(const tern_schedule *s, char **out);
/* Parses and checks an annotation against g: every node once, streams and waits well formed, every
 * dependency ordered by stream order and waits. */
tern_status tern_schedule_parse(tern_graph *g, const char *text, tern_schedule **out);
void tern_schedule_free(tern_schedule *s);
/* Schedules a model's training step and stores it under TERN_TRAINING_SCHEDULE_KEY; the algorithm's
 * nodes are named first where they lack unique names. */
tern_status tern_model_schedule_training(tern_model *model, int max_streams, tern_schedule_stats *stats, int *n_nodes);

/* ---------------------------------------------------------------- execution (lib/exec) */

typedef struct tern_exec tern_exec;
/* Plans graph g (the main graph or a subgraph, whose outer references read parent's values) for
 * inputs of the given shapes (data not needed). */
tern_status tern_exec_create(tern_exec *parent, tern_graph *g, tern_tensor *const *inputs, int n_inputs,
                             tern_threadpool *pool, tern_exec **out);
/* Binds input data and runs; re-plans first when an input's shape differs from the planned one. */
tern_status tern_exec_run(tern_exec *e, tern_tensor *const *inputs, int n_inputs);
int tern_exec_num_outputs(const tern_exec *e);
tern_tensor *tern_exec_output(tern_exec *e, int i);
/* Whether output i's bytes are the plan's to give away: a value a kernel allocated this run (not a
 * constant, the arena or an input), which the plan makes anew at its next run. */
bool tern_exec_output_movable(const tern_exec *e, int i);
void tern_exec_free(tern_exec *e);
/* Calls of model-local functions (calls.c). A node calls one when its domain and type are the
 * function's, or through tern.Invoke. tern_call_begin takes a frame of fn (a plan of its body, reused
 * from call to call), runs it on the inputs and hands it over, outputs ready; tern_call_end gives it
 * back. Calls nested deeper than TERN_CALL_DEPTH_MAX on one thread fail with TERN_EDATA. */
#define TERN_CALL_DEPTH_MAX 1000
typedef struct tern_calls tern_calls;
tern_graph *tern_function_find(const tern_model *m, const char *domain, const char *name);
/* Whether v, an input of g or a value g reads from an enclosing graph, is read only in ways that do
 * not depend on the length of its first dimension (Gather along axis 0, calls and subgraphs that read
 * it so): a plan of g then serves every length. A main graph's input whose declared first dimension is
 * a number is not. */
bool tern_value_len_free(const tern_graph *g, const tern_value *v);
/* The inputs of function fn that tern_value_len_free finds so, as a mask of the first 64: computed
 * when a call is planned and given to tern_call_begin, whose frames then serve every length of them. */
uint64_t tern_function_len_free(const tern_graph *fn);
/* Whether two operator domains are one ("" and "ai.onnx" name the default; NULL is ""). */
bool tern_same_domain(const char *a, const char *b);
/* FNV-1a of a string (the IR's tables of names, the operator registry's). */
uint64_t tern_hash_name(const char *s);
/* A hash of n bytes from seed h, eight bytes at a time (FNV's byte at a time costs a multiply's
 * latency a byte): the eager API's call signatures, the tracer's sites, shapes and attributes. Not
 * stable between releases: nothing hashed with it is written out. */
uint64_t tern_hash_bytes(const void *p, size_t n, uint64_t h);
/* Whether a tensor of dtype dt holds plain bytes: not strings (heap pointers), a sequence or an absent
 * optional. */
static inline bool tern_dtype_plain(int dt)
{
	return dt != TERN_STRING && dt != TERN_SEQUENCE && dt != TERN_NONE;
}
/* Bit i of a mask of at most 32 inputs or outputs (tern_prepare_args.fixed_outputs, ...). */
static inline bool tern_mask_has(uint32_t mask, int i)
{
	return i >= 0 && i < 32 && (mask >> i & 1u);
}
tern_status tern_call_begin(tern_exec *caller, const tern_node *node, const tern_graph *fn, tern_tensor *const *in,
                            int n_in, tern_threadpool *pool, int keep, uint64_t free_len, tern_exec **frame);
void tern_call_end(tern_exec *caller, tern_exec *frame);
/* Gradient sinks (control.c, tern.Backward): where the gradients of a step's weights are summed as
 * the calls of a recursion's backward pass make them, instead of being returned up through every
 * call. tern_call_begin_sinks is tern_call_begin for a frame that sees `sinks` (NULL: none); any
 * other frame sees those of the frame that calls it, found by tern_exec_sinks. */
typedef struct tern_grad_sinks tern_grad_sinks;
tern_status tern_call_begin_sinks(tern_exec *caller, const tern_node *node, const tern_graph *fn,
                                  tern_tensor *const *in, int n_in, tern_threadpool *pool, uint64_t free_len,
                                  tern_grad_sinks *sinks, tern_exec **frame);
tern_grad_sinks *tern_exec_sinks(const tern_exec *e);
/* Kept calls (tern.Invoke keep=1, for gradients): a frame begun with keep keeps every value (none
 * shares bytes with another) and, ended with tern_call_keep instead of tern_call_end, stays out of
 * the pool until the main plan runs again; *handle names it to tern_call_kept (NULL: not a frame
 * kept in this run). */
tern_status tern_call_keep(tern_exec *caller, tern_exec *frame, int64_t *handle);
tern_exec *tern_call_kept(tern_exec *caller, int64_t handle);
void tern_calls_release_kept(tern_calls *c);
/* tern_exec_create for a plan that keeps every value when keep is set. */
tern_status tern_exec_create_kept(tern_exec *parent, tern_graph *g, tern_tensor *const *inputs, int n_inputs,
                                  tern_threadpool *pool, int keep, tern_exec **out);
/* tern_tensor_alloc without zeroing the bytes (strings and sequences are zeroed all the same): for
 * outputs a kernel writes whole. */
tern_status tern_tensor_alloc_uninit(tern_tensor *t, int dtype, int rank, const int64_t *dims);
/* Frees a graph's IR (values, nodes, the IR of their subgraphs), not its protos. */
void tern_graph_free_ir(tern_graph *g);
/* Appends function fp (taken) to the model, its IR built. */
tern_status tern_model_add_function(tern_model *m, Onnx__FunctionProto *fp);
/* A slot of a plan by value name (-1: none), and its tensor. */
int tern_exec_slot_of(const tern_exec *e, const char *name);
tern_tensor *tern_exec_slot_tensor(tern_exec *e, int slot);
/* The inputs a plan ran on last, and the graph it runs. */
tern_tensor *tern_exec_input(tern_exec *e, int i);
const tern_graph *tern_exec_graph(const tern_exec *e);
/* While e is planned: the value given for the input whose slot tensor is t (NULL for others). */
const tern_tensor *tern_exec_planning_input(const tern_exec *e, const tern_tensor *t);
/* Whether the slot's type is fixed by the plan (the same at every run), a numeric tensor. */
bool tern_exec_slot_static(const tern_exec *e, int slot);
tern_calls *tern_calls_new(void);
void tern_calls_free(tern_calls *c);
/* The operator of a node that calls a function by its domain and type (control.c); whether an
 * operator is that or tern.Invoke. */
extern const tern_op tern_op_function_call;
bool tern_op_calls_function(const tern_op *op);
/* Whether a node makes kept calls (tern.Invoke keep=1, or an If whose branches do): what it reads
 * must outlive the run, for the gradient that reads the kept frames. */
bool tern_node_keeps_calls(const tern_node *n);
/* The output holding a kept call's handle: tern.Invoke keep=1's last, or that of an If whose branches
 * are kept calls; -1 for other nodes. */
int tern_node_kept_handle(const tern_node *n);
/* The function a node would call: tern.Invoke's attributes name it, else its domain and type (it is
 * a call when the model has that function). */
const char *tern_node_callee(const tern_node *n, const char **domain);
/* F for a function named F__fwd (the forward of a step's kept calls), into base[0..cap); false for
 * other names. */
bool tern_fwd_base(const char *name, char *base, size_t cap);

/* Runs one node on tensors that all have data (constant folding, eager mode): outputs[0..n_outputs)
 * are allocated and owned by the caller; omitted outputs (node->outputs[i] NULL) stay empty. */
tern_status tern_node_eval(const tern_node *node, tern_tensor *const *inputs, int n_inputs, tern_tensor *outputs,
                           int n_outputs, tern_threadpool *pool);

/* ---------------------------------------------------------------- fused operators (lib/ops/fused.c) */

/* Whether tern's fused elementwise programs can read an operand of shape (rank, dims) against an
 * output of shape (out_rank, out_dims): a scalar, or dimensions other than 1 forming one run equal to
 * the output's there (a bias per channel, per row, or the whole shape). */
bool tern_fused_operand_ok(int rank, const int64_t *dims, int out_rank, const int64_t *out_dims);

#endif
