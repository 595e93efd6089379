/* passes.h — what the graph passes share: the pass table entry, the context a pass edits the graph
 * through (so that its changes are counted), and the static analysis of shapes and constants. */
#ifndef TERN_PASSES_H
#define TERN_PASSES_H

#include "internal.h"

/* The domain and opset version of tern's own operators. */
#define TERN_DOMAIN "tern"
#define TERN_DOMAIN_VERSION 1

typedef struct tern_pass_ctx tern_pass_ctx;

typedef struct tern_pass {
	const char *name;
	const char *description; /* one line */
	/* The lowest -O level that runs it: 1 keeps a standard ONNX graph, 2 adds tern operators, 3 adds
	 * rewrites that reassociate floating-point arithmetic. */
	int level;
	tern_status (*run)(tern_pass_ctx *c);
} tern_pass;

/* What the analysis knows about a value: its type when every dimension is static, and its data when
 * it is a constant (an initializer that is not also a graph input). */
typedef struct tern_value_info {
	bool known;
	tern_tensor shape; /* dtype, rank, dims; data is the constant's (borrowed) or NULL */
} tern_value_info;

struct tern_pass_ctx {
	tern_model *model;
	tern_graph *graph;
	int level;
	/* Counts of the running pass; the manager adds them to its statistics. */
	int removed, added, fused, rewritten;
	/* Analysis, by value index; rebuilt after any change (see tern_pass_analyze). */
	tern_value_info *info;
	size_t n_info;
	bool analyzed;
	/* Loaded initializer data, by value index (owned). */
	tern_tensor **data;
	size_t n_data;
};

/* ---------------------------------------------------------------- analysis (analyze.c) */

/* Infers static shapes by preparing every node on shape-only tensors in topological order, as the
 * planner does; values whose shape depends on run-time data stay unknown. Cheap when nothing changed. */
tern_status tern_pass_analyze(tern_pass_ctx *c);
/* The analysis of v (after tern_pass_analyze); NULL when unknown. */
const tern_tensor *tern_pass_shape(tern_pass_ctx *c, const tern_value *v);
/* v's data when it is a constant; NULL otherwise (or when it cannot be read). */
const tern_tensor *tern_pass_const(tern_pass_ctx *c, const tern_value *v);
bool tern_pass_is_const(const tern_value *v);
/* The constant's single element as a double (a scalar or any one-element tensor). */
bool tern_pass_scalar(tern_pass_ctx *c, const tern_value *v, double *out);
/* Every element of the constant equals x. */
bool tern_pass_const_all(tern_pass_ctx *c, const tern_value *v, double x);
/* Releases the analysis and the loaded data. */
void tern_pass_ctx_free(tern_pass_ctx *c);

/* ---------------------------------------------------------------- editing (edit.c) */

/* Default-domain node of this type (not removed). */
bool tern_pass_is(const tern_node *n, const char *op_type);
/* Runs op's prepare on n with inputs in[] (shapes, data where known) for the output types only: true
 * when it decided them (into out_t, with out[] pointing there or NULL for omitted outputs), false when
 * it failed, deferred or leaves them to the kernel. Nothing is kept (params are freed). */
bool tern_prepare_shapes(const tern_op *op, const tern_node *n, tern_tensor **in, tern_tensor *out_t, tern_tensor **out);
/* The node that produces v in the main graph, when it is one of op_type (NULL: any). */
tern_node *tern_pass_producer(const tern_value *v, const char *op_type);
/* v has exactly one consumer, through an explicit input, and is not a graph output. */
bool tern_pass_single_use(const tern_value *v);
/* Some node reads v inside a subgraph: such uses are by name and cannot be rewired. */
bool tern_pass_has_implicit_use(const tern_value *v);
/* Number of live consumers (explicit or implicit), plus one if v is a graph output. */
size_t tern_pass_uses(const tern_value *v);

/* Same dtype and dimensions (false when either is unknown). */
bool tern_pass_same_shape(const tern_tensor *a, const tern_tensor *b);
/* Whether two declared types are the same: element type, rank, dimensions and their names. */
bool tern_type_same(const tern_type *a, const tern_type *b);
/* Calls fn on every live node of op_type in domain (NULL: the default domain) whose input 0 and output 0
 * are present, in the current node order, until one fails. */
tern_status tern_pass_each(tern_pass_ctx *c, const char *domain, const char *op_type,
                           tern_status (*fn)(tern_pass_ctx *c, tern_node *n));

/* Calls fn on every live node in topological order (the reverse when backwards) until one fails. */
tern_status tern_pass_each_sorted(tern_pass_ctx *c, bool backwards, tern_status (*fn)(tern_pass_ctx *c, tern_node *n));

/* Marks the node removed and counts it. */
void tern_pass_remove(tern_pass_ctx *c, tern_node *n);
/* A node to add: inputs and outputs by name ("" for an omitted one), and the node whose attributes it
 * copies (NULL: none) but for those named in skip (NULL-terminated, may be NULL). */
typedef struct tern_pass_node {
	const char *op_type;
	const char *domain; /* NULL: the default domain */
	const char *name;
	const char *const *inputs;
	size_t n_inputs;
	const char *const *outputs;
	size_t n_outputs;
	const tern_node *attrs_from;
	const char *const *skip;
} tern_pass_node;

/* Replaces nodes old[0..n_old) by one new node, placed where the last of them stood in the node order,
 * and counts them as fused. NULL when out of memory (error set). */
tern_node *tern_pass_replace(tern_pass_ctx *c, tern_node *const *old, int n_old, const tern_pass_node *nw);
/* Makes `from` disappear in favour of `to`: every reader of `from` reads `to`. When `from` is a graph
 * output its name must survive, so the producer of `to` is made to write `from` instead (possible
 * only when `to` is a node output that nothing else reads); returns false when neither works. */
bool tern_pass_forward(tern_pass_ctx *c, tern_value *from, tern_value *to);
/* A new initializer named after stem (made unique) holding t's bytes: taken when t owns them (t is
 * then left empty), else copied. */
tern_value *tern_pass_add_const(tern_pass_ctx *c, const char *stem, tern_tensor *t);
/* An int64 initializer of n elements (shape [n]). */
tern_value *tern_pass_add_ints(tern_pass_ctx *c, const char *stem, const int64_t *v, int n);
/* Drops v when it is an initializer that nothing reads any more: a rewrite that replaced a weight
 * frees the old one at once rather than at the next dce, so that the two are not held together. */
void tern_pass_drop_if_unused(tern_pass_ctx *c, tern_value *v);
/* Removes an initializer from the main graph's proto (not a graph input). */
void tern_pass_drop_initializer(tern_pass_ctx *c, tern_value *v);
/* A STRINGS attribute (tern_node_add_attr_* has no list of strings). */
tern_status tern_pass_add_attr_strings(tern_node *n, const char *name, const char *const *v, size_t count);
/* Makes the graph's model import the tern domain (needed before adding tern operators). */
tern_status tern_pass_import_tern(tern_pass_ctx *c);

/* ---------------------------------------------------------------- activations (shared by fusions) */

/* An activation that a fused tern operator can apply: the node computing it from x, as recognised by
 * tern_pass_match_activation: its name for the `activation` attribute and up to two parameters. */
typedef struct tern_activation {
	const char *name;
	float params[2];
	int n_params;
	tern_node *nodes[2]; /* the nodes that compute it (Silu is two) */
	int n_nodes;
	tern_value *out;
} tern_activation;

/* Whether the only consumers of x compute a supported activation of x, float32 and shape-preserving. */
bool tern_pass_match_activation(tern_pass_ctx *c, tern_value *x, tern_activation *act);
/* Sets the activation and activation_params attributes. */
tern_status tern_pass_set_activation(tern_node *n, const tern_activation *act);

/* ---------------------------------------------------------------- the passes */

extern const tern_pass tern_pass_fold_constants, tern_pass_dce, tern_pass_cse, tern_pass_noop, tern_pass_fold_batchnorm,
        tern_pass_matmul_add_gemm, tern_pass_reshapes, tern_pass_slices_split, tern_pass_fold_pad, tern_pass_layernorm,
        tern_pass_gelu, tern_pass_fuse_conv, tern_pass_fuse_matmul, tern_pass_fuse_layernorm,
        tern_pass_fuse_elementwise, tern_pass_fold_scales, tern_pass_fuse_attention, tern_pass_fold_embedding,
        tern_pass_blocked_conv;

/* tern_model_infer_shapes that also types the outputs of calls (from the callee's body on the call's
 * input types) and of Ifs (from their branches): for the gradients of calls (lib/autodiff). */
tern_status tern_model_infer_types_through_calls(tern_model *m);

#endif
