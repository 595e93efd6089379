/* grad.h — what a gradient rule sees and the builder it emits nodes through.
 *
 * A rule lives beside its operator's forward code (its tern_op entry's `grad`). Given the forward
 * node, its inputs x, outputs y and the gradients dy of the outputs (NULL where none flows), it sets
 * dx[i] for every input i with wants[i]. It computes with operator nodes only, through the builder:
 * in a graph (tern-autodiff) each call adds a node; eagerly (the eager API) each call runs one. Values
 * are opaque handles; their static type (element type, rank, dimensions, -1 where unknown) is known
 * in both modes, so a rule can choose by rank or skip work when shapes already agree. */
#ifndef TERN_GRAD_H
#define TERN_GRAD_H

#include "internal.h"

typedef struct tern_gval tern_gval;
typedef struct tern_grad_builder tern_grad_builder;

/* An attribute of an emitted node. */
typedef struct tern_gattr {
	const char *name;
	enum { TERN_GA_INT, TERN_GA_FLOAT, TERN_GA_INTS, TERN_GA_FLOATS, TERN_GA_STRING, TERN_GA_STRINGS } type;
	int64_t i;
	float f;
	const int64_t *ints;
	const float *floats;
	size_t n;
	const char *s;
	const char *const *strs; /* TERN_GA_STRINGS: n of them */
} tern_gattr;
#define TERN_GA_I(NAME, V) ((tern_gattr){.name = (NAME), .type = TERN_GA_INT, .i = (V)})
#define TERN_GA_F(NAME, V) ((tern_gattr){.name = (NAME), .type = TERN_GA_FLOAT, .f = (V)})
#define TERN_GA_IS(NAME, P, N) ((tern_gattr){.name = (NAME), .type = TERN_GA_INTS, .ints = (P), .n = (N)})
#define TERN_GA_S(NAME, V) ((tern_gattr){.name = (NAME), .type = TERN_GA_STRING, .s = (V)})

typedef struct tern_grad_ctx {
	const tern_node *node; /* the forward node: read its attributes with tern_attr_* */
	int n_in, n_out;
	tern_gval *const *x; /* forward inputs (NULL where omitted) */
	tern_gval *const *y; /* forward outputs (NULL where omitted) */
	tern_gval *const *dy; /* gradients of the outputs (NULL: none flows into that output) */
	const bool *wants; /* wants[i]: set dx[i] */
	tern_gval **dx; /* the rule's answer; leave NULL for an input with no gradient */
	tern_grad_builder *b;
} tern_grad_ctx;

/* ---------------------------------------------------------------- emitting nodes */

/* One node of op_type in domain ("" for ONNX, "tern" for tern's own) on inputs in[0..n_in) (NULL:
 * omitted), with attributes; returns its first output, or NULL on failure (the error is set). */
tern_gval *tern_g_op(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                     const tern_gattr *attrs, int n_attrs);
/* The same with n_out outputs into out[] (NULL entries: outputs not wanted). */
tern_status tern_g_op_n(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                        const tern_gattr *attrs, int n_attrs, tern_gval **out, int n_out);
/* A node that takes the forward node's attributes (all of them, then extra ones). */
tern_gval *tern_g_op_like(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in, int n_in,
                          const tern_gattr *extra, int n_extra);
tern_status tern_g_op_like_n(tern_grad_ctx *g, const char *domain, const char *op_type, tern_gval *const *in,
                             int n_in, const tern_gattr *extra, int n_extra, tern_gval **out, int n_out);

/* Shorthands for the nodes rules need most. */
tern_gval *tern_g_add(tern_grad_ctx *g, tern_gval *a, tern_gval *b);
tern_gval *tern_g_sub(tern_grad_ctx *g, tern_gval *a, tern_gval *b);
tern_gval *tern_g_mul(tern_grad_ctx *g, tern_gval *a, tern_gval *b);
tern_gval *tern_g_div(tern_grad_ctx *g, tern_gval *a, tern_gval *b);
tern_gval *tern_g_neg(tern_grad_ctx *g, tern_gval *a);
tern_gval *tern_g_unary(tern_grad_ctx *g, const char *op_type, tern_gval *a);
/* A scalar constant of like's element type. */
tern_gval *tern_g_scalar(tern_grad_ctx *g, double v, tern_gval *like);
/* An int64 vector constant. */
tern_gval *tern_g_ints(tern_grad_ctx *g, const int64_t *v, size_t n);
/* grad summed down to the shape of x, undoing numpy broadcasting (nothing when they are known equal). */
tern_gval *tern_g_sum_to(tern_grad_ctx *g, tern_gval *grad, tern_gval *x);
/* Shape(x), as int64[rank]. */
tern_gval *tern_g_shape(tern_grad_ctx *g, tern_gval *x);
/* Transpose with perm. */
tern_gval *tern_g_transpose(tern_grad_ctx *g, tern_gval *a, const int64_t *perm, int rank);
/* a reshaped to the shape of like (Reshape(a, Shape(like))). */
tern_gval *tern_g_reshape_like(tern_grad_ctx *g, tern_gval *a, tern_gval *like);

/* ---------------------------------------------------------------- types */

/* The static type of v: element type (0 unknown), rank (-1 unknown), dims (-1 unknown); NULL dims
 * allowed. */
void tern_g_type(tern_grad_ctx *g, const tern_gval *v, int *dtype, int *rank, int64_t *dims);
int tern_g_rank(tern_grad_ctx *g, const tern_gval *v);
/* The whole static type (symbolic dimension names included, in graph mode). */
void tern_g_full_type(tern_grad_ctx *g, const tern_gval *v, tern_type *out);
int tern_g_dtype(tern_grad_ctx *g, const tern_gval *v);

/* The status of the builder's first failure (a NULL handle came back), for a rule to return; TERN_OK
 * when nothing failed. A rule may chain builder calls and check once at the end: every builder call
 * given a NULL handle returns NULL. */
tern_status tern_g_status(tern_grad_ctx *g);
/* A rule's failure: "node 'x' (Op): gradient: ..." with TERN_EDATA. */
tern_status tern_g_fail(tern_grad_ctx *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- eager mode (lib/eager) */

/* Runs a rule eagerly: every node it emits is executed at once on the eager tensors that are its
 * handles (rule: lib/eager's state for one rule). */
tern_status tern_grad_run_eager(void *rule, const tern_node *forward, tern_grad_ctx *ctx);
/* lib/eager's side: run one emitted node, make a constant, read a handle's tensor. */
tern_status tern_eager_emit(void *rule, const tern_node *forward, const char *domain, const char *op_type,
                            tern_gval *const *in, int n_in, const tern_gattr *attrs, int n_attrs, bool like,
                            tern_gval **out, int n_out);
tern_gval *tern_eager_constant(void *rule, const tern_tensor *t);
const tern_tensor *tern_eager_gval_tensor(const tern_gval *v);

/* Whether the element type carries gradients (floating point). */
static inline bool tern_g_differentiable(int dtype)
{
	return dtype == TERN_FLOAT || dtype == TERN_DOUBLE || dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16;
}

#endif
