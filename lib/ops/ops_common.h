/* ops_common.h — helpers shared by the operator families: broadcasting of shapes over several
 * inputs, and stride tables for walking broadcast inputs row by row. */
#ifndef TERN_OPS_COMMON_H
#define TERN_OPS_COMMON_H

#include "internal.h"

/* Broadcasts the shapes of the non-NULL tensors in[0..n) together (numpy rules). */
tern_status tern_broadcast_tensors(const tern_node *node, int n, const tern_tensor *const *in, int *rank,
                                   int64_t *dims);

#define TERN_BCAST_MAX_IN 4

/* The output of a broadcast elementwise operation seen as rows of `inner` elements. Dimensions that
 * every input walks contiguously are merged, so same-shape inputs give one row of numel elements.
 * Within a row, input k advances by inner_stride[k] (1, or 0 when broadcast along the row). */
typedef struct tern_bcast {
	int n_in;
	int rank; /* merged rank, >= 1 */
	int64_t dims[TERN_MAX_RANK];
	int64_t strides[TERN_BCAST_MAX_IN][TERN_MAX_RANK]; /* in elements, 0 where broadcast */
	int64_t numel, inner, rows;
	int64_t inner_stride[TERN_BCAST_MAX_IN];
} tern_bcast;

/* n_in <= TERN_BCAST_MAX_IN inputs whose shapes broadcast to (out_rank, out_dims). */
void tern_bcast_init(tern_bcast *b, int n_in, const tern_tensor *const *in, int out_rank, const int64_t *out_dims);
/* Positions the row counter idx (rank - 1 entries) at `row`; off[k] = input k's element offset. */
void tern_bcast_seek(const tern_bcast *b, int64_t row, int64_t *idx, int64_t *off);
/* Advances idx and off to the next row. */
void tern_bcast_next_row(const tern_bcast *b, int64_t *idx, int64_t *off);

#endif
