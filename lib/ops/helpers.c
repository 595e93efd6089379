/* helpers.c — helpers shared by the operator families: numpy broadcasting of shapes, the stride tables
 * that let a kernel walk broadcast inputs without materialising them, and element stores. */
#include "internal.h"
#include "ops/ops_common.h"

#include <stdio.h>

static const char *dims_str(int rank, const int64_t *dims, char *buf, size_t size)
{
	size_t n = (size_t)snprintf(buf, size, "[");
	for (int i = 0; i < rank && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)dims[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

tern_status tern_broadcast_shape(const tern_node *node, int ra, const int64_t *da, int rb, const int64_t *db, int *rank,
                                 int64_t *dims)
{
	int r = ra > rb ? ra : rb;
	if (r > TERN_MAX_RANK)
		return tern_node_errorf(node, TERN_EDATA, "broadcast rank %d exceeds the limit %d", r, TERN_MAX_RANK);
	int64_t out[TERN_MAX_RANK];
	for (int i = 0; i < r; i++) {
		/* Align from the right; a missing leading dimension acts as 1. */
		int64_t a = i - (r - ra) >= 0 ? da[i - (r - ra)] : 1;
		int64_t b = i - (r - rb) >= 0 ? db[i - (r - rb)] : 1;
		if (a == b || b == 1)
			out[i] = a;
		else if (a == 1)
			out[i] = b;
		else if (a < 0 || b < 0) /* an unknown dimension must match the known one */
			out[i] = a < 0 ? b : a;
		else {
			char sa[160], sb[160];
			return tern_node_errorf(node, TERN_EDATA,
			                        "cannot broadcast shapes %s and %s (dimension %d: %lld vs %lld)",
			                        dims_str(ra, da, sa, sizeof sa), dims_str(rb, db, sb, sizeof sb), i,
			                        (long long)a, (long long)b);
		}
	}
	*rank = r;
	memcpy(dims, out, (size_t)r * sizeof *dims);
	return TERN_OK;
}

tern_status tern_broadcast_tensors(const tern_node *node, int n, const tern_tensor *const *in, int *rank, int64_t *dims)
{
	*rank = 0;
	for (int i = 0; i < n; i++) {
		if (!in[i])
			continue;
		tern_status st = tern_broadcast_shape(node, *rank, dims, in[i]->rank, in[i]->dims, rank, dims);
		if (st)
			return st;
	}
	return TERN_OK;
}

void tern_bcast_init(tern_bcast *b, int n_in, const tern_tensor *const *in, int out_rank, const int64_t *out_dims)
{
	memset(b, 0, sizeof *b);
	b->n_in = n_in;
	b->numel = tern_numel(out_rank, out_dims);
	/* Strides of every input against the output's dimensions, 0 where the input is broadcast. */
	int64_t st[TERN_BCAST_MAX_IN][TERN_MAX_RANK];
	for (int k = 0; k < n_in; k++) {
		int64_t s = 1;
		for (int d = out_rank - 1; d >= 0; d--) {
			int id = d - (out_rank - in[k]->rank);
			int64_t len = id >= 0 ? in[k]->dims[id] : 1;
			st[k][d] = len == 1 ? 0 : s;
			s *= len;
		}
	}
	/* Merge adjacent dimensions whenever every input steps through them the same way, so that the
	 * common cases (same shape, scalar, row or column broadcast) end with one or two dimensions. */
	int r = 0;
	for (int d = 0; d < out_rank; d++) {
		if (out_dims[d] == 1)
			continue;
		bool merge = r > 0;
		for (int k = 0; k < n_in && merge; k++)
			merge = st[k][d] * out_dims[d] == b->strides[k][r - 1];
		if (merge) {
			b->dims[r - 1] *= out_dims[d];
			for (int k = 0; k < n_in; k++)
				b->strides[k][r - 1] = st[k][d];
		} else {
			b->dims[r] = out_dims[d];
			for (int k = 0; k < n_in; k++)
				b->strides[k][r] = st[k][d];
			r++;
		}
	}
	if (r == 0) {
		b->dims[0] = 1;
		r = 1;
	}
	b->rank = r;
	b->inner = b->dims[r - 1];
	b->rows = b->inner ? b->numel / b->inner : 0;
	for (int k = 0; k < n_in; k++)
		b->inner_stride[k] = b->strides[k][r - 1];
}

void tern_bcast_seek(const tern_bcast *b, int64_t row, int64_t *idx, int64_t *off)
{
	for (int k = 0; k < b->n_in; k++)
		off[k] = 0;
	for (int d = b->rank - 2; d >= 0; d--) {
		idx[d] = row % b->dims[d];
		row /= b->dims[d];
		for (int k = 0; k < b->n_in; k++)
			off[k] += idx[d] * b->strides[k][d];
	}
}

void tern_bcast_next_row(const tern_bcast *b, int64_t *idx, int64_t *off)
{
	for (int d = b->rank - 2; d >= 0; d--) {
		if (++idx[d] < b->dims[d]) {
			for (int k = 0; k < b->n_in; k++)
				off[k] += b->strides[k][d];
			return;
		}
		idx[d] = 0;
		for (int k = 0; k < b->n_in; k++)
			off[k] -= (b->dims[d] - 1) * b->strides[k][d];
	}
}

void tern_store_f64(int dtype, void *data, int64_t i, double v)
{
	switch (dtype) {
	case TERN_FLOAT: ((float *)data)[i] = (float)v; break;
	case TERN_DOUBLE: ((double *)data)[i] = v; break;
	case TERN_FLOAT16: ((uint16_t *)data)[i] = tern_f32_to_f16((float)v); break;
	case TERN_BFLOAT16: ((uint16_t *)data)[i] = tern_f32_to_bf16((float)v); break;
	case TERN_BOOL: ((uint8_t *)data)[i] = v != 0; break;
	case TERN_INT8: ((int8_t *)data)[i] = tern_sat_i8(v); break;
	case TERN_INT16: ((int16_t *)data)[i] = tern_sat_i16(v); break;
	case TERN_INT32: ((int32_t *)data)[i] = tern_sat_i32(v); break;
	case TERN_INT64: ((int64_t *)data)[i] = tern_sat_i64(v); break;
	case TERN_UINT8: ((uint8_t *)data)[i] = tern_sat_u8(v); break;
	case TERN_UINT16: ((uint16_t *)data)[i] = tern_sat_u16(v); break;
	case TERN_UINT32: ((uint32_t *)data)[i] = tern_sat_u32(v); break;
	case TERN_UINT64: ((uint64_t *)data)[i] = tern_sat_u64(v); break;
	default: break;
	}
}
