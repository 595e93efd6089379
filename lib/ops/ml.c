/* ml.c — operators of the ai.onnx.ml domain that work on plain tensors: ArrayFeatureExtractor
 * (columns picked from the last axis) and Binarizer (a threshold). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

#define ML "ai.onnx.ml"

/* ---------------------------------------------------------------- ArrayFeatureExtractor */

/* Every index must name a column of the last axis: the reference's negative indices from the end are
 * not in the spec, and onnxruntime refuses them. */
static tern_status check_indices(const tern_node *node, const tern_tensor *idx, int64_t columns)
{
	const int64_t *v = idx->data;
	for (int64_t i = 0; i < tern_tensor_numel(idx); i++)
		if (v[i] < 0 || v[i] >= columns)
			return tern_node_errorf(node, TERN_EDATA, "input 1 element %lld is %lld, outside [0, %lld)",
			                        (long long)i, (long long)v[i], (long long)columns);
	return TERN_OK;
}

static tern_status afe_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0], *idx = a->in[1];
	tern_tensor *y = a->out[0];
	int64_t columns = x->dims[x->rank - 1], k = tern_tensor_numel(idx);
	int64_t rows = columns ? tern_tensor_numel(x) / columns : tern_numel(x->rank - 1, x->dims);
	const int64_t *v = idx->data;
	tern_status st = check_indices(a->node, idx, columns);
	if (st)
		return st;
	if (x->dtype == TERN_STRING) {
		char *const *src = x->data;
		char **dst = y->data;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t j = 0; j < k; j++) {
				const char *s = src[r * columns + v[j]];
				if (!(dst[r * k + j] = tern_strdup(s ? s : "")))
					return tern_node_errorf(a->node, TERN_EOS, "out of memory");
			}
		return TERN_OK;
	}
	size_t es = tern_dtype_size(x->dtype);
	const char *src = x->data;
	char *dst = y->data;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t j = 0; j < k; j++)
			memcpy(dst + (size_t)(r * k + j) * es, src + (size_t)(r * columns + v[j]) * es, es);
	return TERN_OK;
}

static tern_status afe_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *idx = p->n_in > 1 ? p->in[1] : NULL;
	const uint32_t types = TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(INT64) | TERN_DT(INT32) | TERN_DT(STRING);
	if (!idx)
		return tern_node_errorf(node, TERN_EDATA, "input 1 (the indices) is required");
	if (x->dtype <= 0 || x->dtype >= 32 || !(types & (1u << x->dtype)))
		return tern_node_errorf(node, TERN_EDATA, "input 0 is %s, not float, double, int64, int32 or string",
		                        tern_dtype_name(x->dtype));
	if (idx->dtype != TERN_INT64)
		return tern_node_errorf(node, TERN_EDATA, "input 1 is %s, not int64", tern_dtype_name(idx->dtype));
	if (x->rank < 1)
		return tern_node_errorf(node, TERN_EDATA, "input 0 is a scalar; it needs an axis to select from");
	if (idx->data) {
		tern_status st = check_indices(node, idx, x->dims[x->rank - 1]);
		if (st)
			return st;
	}
	/* The indices are flattened onto the last axis; a vector gives one row, [1, K], as in
	 * onnxruntime. */
	int64_t dims[TERN_MAX_RANK];
	int rank = x->rank == 1 ? 2 : x->rank;
	if (x->rank == 1)
		dims[0] = 1;
	else
		memcpy(dims, x->dims, sizeof(int64_t) * (size_t)(x->rank - 1));
	dims[rank - 1] = tern_tensor_numel(idx);
	tern_set_shape(p->out[0], x->dtype, rank, dims);
	p->kernel = afe_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- Binarizer */

typedef struct binarizer_params {
	float threshold;
	int64_t int_threshold; /* integers above it pass: floor(threshold), clamped */
	int int_all; /* for integers: 1 every value passes, -1 none, 0 compare with int_threshold */
} binarizer_params;

static tern_status binarizer_kernel(const tern_kernel_args *a)
{
	const binarizer_params *bp = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(x);
	/* NaN compares false, so it maps to 0, as in the reference. */
	switch (x->dtype) {
	case TERN_FLOAT: {
		const float *s = x->data;
		float *d = y->data;
		for (int64_t i = 0; i < n; i++)
			d[i] = s[i] > bp->threshold ? 1.0f : 0.0f;
		break;
	}
	case TERN_DOUBLE: {
		const double *s = x->data;
		double *d = y->data;
		for (int64_t i = 0; i < n; i++)
			d[i] = s[i] > (double)bp->threshold ? 1.0 : 0.0;
		break;
	}
	case TERN_INT32: {
		const int32_t *s = x->data;
		int32_t *d = y->data;
		for (int64_t i = 0; i < n; i++)
			d[i] = bp->int_all ? bp->int_all > 0 : s[i] > bp->int_threshold;
		break;
	}
	default: {
		const int64_t *s = x->data;
		int64_t *d = y->data;
		for (int64_t i = 0; i < n; i++)
			d[i] = bp->int_all ? bp->int_all > 0 : s[i] > bp->int_threshold;
		break;
	}
	}
	return TERN_OK;
}

static tern_status binarizer_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	if (x->dtype != TERN_FLOAT && x->dtype != TERN_DOUBLE && x->dtype != TERN_INT32 && x->dtype != TERN_INT64)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 is %s, not float, double, int64 or int32",
		                        tern_dtype_name(x->dtype));
	binarizer_params *bp = calloc(1, sizeof *bp);
	if (!bp)
		return tern_node_errorf(p->node, TERN_EOS, "out of memory");
	p->params = bp;
	p->free_params = free;
	bp->threshold = tern_attr_float(p->node, "threshold", 0);
	/* An integer v exceeds t exactly when it exceeds floor(t); comparing in int64 avoids rounding
	 * large values through double. */
	double t = floor((double)bp->threshold);
	if (isnan(t) || t >= 0x1p63)
		bp->int_all = -1;
	else if (t < -0x1p63)
		bp->int_all = 1;
	else
		bp->int_threshold = (int64_t)t;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	p->inplace_ok = 1;
	p->kernel = binarizer_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
        {ML, "ArrayFeatureExtractor", 1, 0, afe_prepare,
         TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(INT64) | TERN_DT(INT32) | TERN_DT(STRING), "ml"},
        {ML, "Binarizer", 1, 0, binarizer_prepare, TERN_DT(FLOAT) | TERN_DT(DOUBLE) | TERN_DT(INT64) | TERN_DT(INT32),
         "ml"},
};

const tern_op_table tern_ops_ml = {ops, TERN_ARRAY_LEN(ops)};
