/* quant.c — linear quantization: QuantizeLinear and DequantizeLinear (per tensor or along one axis) and
 * DynamicQuantizeLinear, between float types and 8-, 16- and 32-bit integers or float8. */
#include "internal.h"
#include "ops/ops_common.h"

#include <math.h>
#include <stdlib.h>

/* A tensor seen around its quantization axis: `outer` blocks of `channels` rows of `inner` elements;
 * row r uses scale and zero point r % channels. Per-tensor quantization is one channel. */
typedef struct quant_layout {
	int64_t outer, channels, inner;
	int saturate; /* QuantizeLinear to float8: out-of-range values become the largest finite value */
} quant_layout;

/* Rows are cut into segments of this many elements, the unit of work for the thread pool. */
#define QUANT_SEGMENT 16384
/* Elements converted at a time through a float buffer on the stack (float16 and bfloat16 data). */
#define QUANT_PIECE 256

typedef struct quant_job {
	const quant_layout *l;
	const tern_tensor *x, *scale, *zero_point; /* zero_point may be NULL */
	tern_tensor *y;
	int64_t segments_per_row;
} quant_job;

static bool is_float_type(int dtype)
{
	return dtype == TERN_FLOAT || dtype == TERN_FLOAT16 || dtype == TERN_BFLOAT16;
}

static bool is_quant_int(int dtype)
{
	return dtype == TERN_UINT8 || dtype == TERN_INT8 || dtype == TERN_UINT16 || dtype == TERN_INT16;
}

static bool is_float8(int dtype)
{
	return dtype == TERN_FLOAT8E4M3FN || dtype == TERN_FLOAT8E4M3FNUZ || dtype == TERN_FLOAT8E5M2 ||
	        dtype == TERN_FLOAT8E5M2FNUZ;
}

static tern_status bad_dtype(const tern_node *node, int index, const char *what, int dtype, const char *allowed)
{
	return tern_node_errorf(node, TERN_EDATA, "input %d '%s' is %s; %s expected", index, what,
	                        tern_dtype_name(dtype), allowed);
}

/* Checks scale and zero point (inputs 1 and 2) against x and the axis attribute. */
static tern_status layout_setup(tern_prepare_args *p, const char *scale_name, const char *zero_name)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *scale = p->n_in > 1 ? p->in[1] : NULL, *zp = p->n_in > 2 ? p->in[2] : NULL;
	char s1[128], s2[128];
	if (!scale)
		return tern_node_errorf(node, TERN_EDATA, "input 1 '%s' is required", scale_name);
	int64_t block_size = tern_attr_int(node, "block_size", 0);
	if (block_size != 0)
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'block_size' = %lld: blocked quantization is not supported",
		                        (long long)block_size);
	if (scale->rank > 1)
		return tern_node_errorf(node, TERN_EDATA, "input 1 '%s' %s must be a scalar or 1-D", scale_name,
		                        tern_shape_str(scale->dtype, scale->rank, scale->dims, s1, sizeof s1));
	int64_t n = tern_tensor_numel(scale);
	/* A scalar and a one-element vector are both per-tensor (the float8 tests pair them, and the
	 * reference broadcasts one to the other). */
	if (zp && ((zp->rank != scale->rank && n != 1) || tern_tensor_numel(zp) != n))
		return tern_node_errorf(node, TERN_EDATA, "input 2 '%s' %s must have the shape of input 1 '%s' %s",
		                        zero_name, tern_shape_str(zp->dtype, zp->rank, zp->dims, s1, sizeof s1),
		                        scale_name,
		                        tern_shape_str(scale->dtype, scale->rank, scale->dims, s2, sizeof s2));
	quant_layout l = {1, 1, tern_tensor_numel(x), 1};
	if (n != 1) {
		if (node->opset < 13)
			return tern_node_errorf(node, TERN_EDATA,
			                        "input 1 '%s' has %lld elements; opset %lld quantizes per tensor only",
			                        scale_name, (long long)n, (long long)node->opset);
		int64_t axis = tern_attr_int(node, "axis", 1);
		int64_t a = axis < 0 ? axis + x->rank : axis;
		if (a < 0 || a >= x->rank)
			return tern_node_errorf(
			        node, TERN_EDATA, "attribute 'axis' = %lld is out of range for input 0 %s",
			        (long long)axis, tern_shape_str(x->dtype, x->rank, x->dims, s1, sizeof s1));
		if (x->dims[a] != n)
			return tern_node_errorf(
			        node, TERN_EDATA, "input 1 '%s' has %lld elements; input 0 %s has %lld along axis %lld",
			        scale_name, (long long)n, tern_shape_str(x->dtype, x->rank, x->dims, s1, sizeof s1),
			        (long long)x->dims[a], (long long)axis);
		l.outer = tern_numel((int)a, x->dims);
		l.channels = n;
		l.inner = tern_numel(x->rank - (int)a - 1, x->dims + a + 1);
	}
	quant_layout *lp = tern_xmalloc(sizeof *lp);
	if (!lp)
		return tern_errorf(TERN_EOS, "out of memory");
	*lp = l;
	p->params = lp;
	p->free_params = free;
	return TERN_OK;
}

/* Runs fn over every segment of every row of the layout, spread over the pool. */
static void run_segments(const tern_kernel_args *a, quant_job *j, void (*fn)(void *ctx, int64_t i))
{
	j->segments_per_row = (j->l->inner + QUANT_SEGMENT - 1) / QUANT_SEGMENT;
	int64_t total = j->l->outer * j->l->channels * j->segments_per_row;
	if (total > 1)
		tern_parallel_for(a->pool, total, fn, j);
	else if (total == 1)
		fn(j, 0);
}

/* Segment i of a job: element offset, element count and the channel whose scale it uses. */
static void segment_at(const quant_job *j, int64_t i, int64_t *off, int64_t *n, int64_t *channel)
{
	int64_t row = i / j->segments_per_row, start = i % j->segments_per_row * QUANT_SEGMENT;
	*off = row * j->l->inner + start;
	*n = j->l->inner - start < QUANT_SEGMENT ? j->l->inner - start : QUANT_SEGMENT;
	*channel = row % j->l->channels;
}

/* ---------------------------------------------------------------- QuantizeLinear */

/* saturate(round(x / s) + z), rounding half to even. Adding and subtracting 1.5 * 2^23 rounds that way
 * and vectorises where nearbyintf may not; the quotient is clamped first to where the trick is exact,
 * which saturation makes harmless. NaN gives the zero point. */
static inline float quantize_value(float x, float s, float z, float lo, float hi)
{
	const float magic = 12582912.0f, big = 4194304.0f;
	float q = x / s;
	q = tern_select_f32(q == q, q, 0.0f);
	q = tern_select_f32(q < -big, -big, q);
	q = tern_select_f32(q > big, big, q);
	q = (q + magic) - magic + z;
	q = tern_select_f32(q < lo, lo, q);
	return tern_select_f32(q > hi, hi, q);
}

#define QUANTIZE_ROW(name, T, LO, HI)                                                              \
	static void name(const float *restrict x, void *restrict out, int64_t n, float s, float z) \
	{                                                                                          \
		T *restrict y = out;                                                               \
		for (int64_t i = 0; i < n; i++)                                                    \
			y[i] = (T)quantize_value(x[i], s, z, LO, HI);                              \
	}
QUANTIZE_ROW(quantize_u8, uint8_t, 0.0f, 255.0f)
QUANTIZE_ROW(quantize_i8, int8_t, -128.0f, 127.0f)
QUANTIZE_ROW(quantize_u16, uint16_t, 0.0f, 65535.0f)
QUANTIZE_ROW(quantize_i16, int16_t, -32768.0f, 32767.0f)
#undef QUANTIZE_ROW

typedef void (*quantize_row_fn)(const float *restrict x, void *restrict out, int64_t n, float s, float z);

static quantize_row_fn quantize_row_for(int dtype)
{
	switch (dtype) {
	case TERN_UINT8: return quantize_u8;
	case TERN_INT8: return quantize_i8;
	case TERN_UINT16: return quantize_u16;
	default: return quantize_i16;
	}
}

/* float16 and bfloat16 elements [off, off + n) of t as floats. */
static void load_halves(const tern_tensor *t, int64_t off, int64_t n, float *out)
{
	const uint16_t *h = (const uint16_t *)t->data + off;
	if (t->dtype == TERN_FLOAT16)
		for (int64_t i = 0; i < n; i++)
			out[i] = tern_f16_to_f32(h[i]);
	else
		for (int64_t i = 0; i < n; i++)
			out[i] = tern_bf16_to_f32(h[i]);
}

/* A float8 zero point's value (0 when there is none). */
static float float8_zero_point(const tern_tensor *zp, int64_t c)
{
	return zp ? tern_f8_to_f32(zp->dtype, ((const uint8_t *)zp->data)[c]) : 0.0f;
}

/* To float8: x / s (+ z) in float, rounded to nearest even by the conversion itself. The zero point is
 * added only when it is not 0, so that -0 stays -0 as in the reference (which ignores it). */
static void quantize_float8_segment(const quant_job *j, int64_t off, int64_t n, int64_t c)
{
	const tern_tensor *x = j->x;
	uint8_t *y = (uint8_t *)j->y->data + off;
	float s = (float)tern_tensor_get_f64(j->scale, c), z = float8_zero_point(j->zero_point, c);
	float buf[QUANT_PIECE];
	for (int64_t k = 0; k < n; k += QUANT_PIECE) {
		int64_t m = n - k < QUANT_PIECE ? n - k : QUANT_PIECE;
		if (x->dtype == TERN_INT32) {
			const int32_t *xi = (const int32_t *)x->data + off + k;
			for (int64_t e = 0; e < m; e++)
				buf[e] = (float)(xi[e] / (double)s);
		} else {
			const float *xf = (const float *)x->data + off + k;
			if (x->dtype != TERN_FLOAT) {
				load_halves(x, off + k, m, buf);
				xf = buf;
			}
			for (int64_t e = 0; e < m; e++)
				buf[e] = xf[e] / s;
		}
		if (z != 0)
			for (int64_t e = 0; e < m; e++)
				buf[e] += z;
		tern_f32_to_f8_n(j->y->dtype, buf, y + k, m, j->l->saturate);
	}
}

static void quantize_segment(void *ctx, int64_t i)
{
	const quant_job *j = ctx;
	int64_t off, n, c;
	segment_at(j, i, &off, &n, &c);
	const tern_tensor *x = j->x;
	tern_tensor *y = j->y;
	if (is_float8(y->dtype)) {
		quantize_float8_segment(j, off, n, c);
		return;
	}
	double s = tern_tensor_get_f64(j->scale, c);
	double z = j->zero_point ? (double)tern_tensor_get_i64(j->zero_point, c) : 0;
	size_t ysize = tern_dtype_size(y->dtype);
	if (x->dtype == TERN_INT32) {
		/* int32 data does not fit a float's mantissa: divide in double. */
		const int32_t *xi = (const int32_t *)x->data + off;
		for (int64_t k = 0; k < n; k++)
			tern_store_f64(y->dtype, y->data, off + k, nearbyint(xi[k] / s) + z);
		return;
	}
	quantize_row_fn row = quantize_row_for(y->dtype);
	if (x->dtype == TERN_FLOAT) {
		row((const float *)x->data + off, (char *)y->data + off * ysize, n, (float)s, (float)z);
		return;
	}
	float buf[QUANT_PIECE];
	for (int64_t k = 0; k < n; k += QUANT_PIECE) {
		int64_t m = n - k < QUANT_PIECE ? n - k : QUANT_PIECE;
		load_halves(x, off + k, m, buf);
		row(buf, (char *)y->data + (off + k) * ysize, m, (float)s, (float)z);
	}
}

static tern_status quantize_kernel(const tern_kernel_args *a)
{
	quant_job j = {.l = a->params,
	               .x = a->in[0],
	               .scale = a->in[1],
	               .zero_point = a->n_in > 2 ? a->in[2] : NULL,
	               .y = a->out[0]};
	run_segments(a, &j, quantize_segment);
	return TERN_OK;
}

static tern_status quantize_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *zp = p->n_in > 2 ? p->in[2] : NULL;
	if (!is_float_type(x->dtype) && x->dtype != TERN_INT32)
		return bad_dtype(node, 0, "x", x->dtype, "float, float16, bfloat16 or int32");
	if (p->n_in > 1 && p->in[1] && !is_float_type(p->in[1]->dtype) && p->in[1]->dtype != TERN_INT32)
		return bad_dtype(node, 1, "y_scale", p->in[1]->dtype, "float, float16, bfloat16 or int32");
	if (zp && !is_quant_int(zp->dtype) && !is_float8(zp->dtype))
		return bad_dtype(node, 2, "y_zero_point", zp->dtype, "uint8, int8, uint16, int16 or a float8 type");
	tern_status st = layout_setup(p, "y_scale", "y_zero_point");
	if (st)
		return st;
	/* Opset 19's saturate only concerns float8 outputs. */
	((quant_layout *)p->params)->saturate = tern_attr_int(node, "saturate", 1) != 0;
	tern_set_shape(p->out[0], zp ? zp->dtype : TERN_UINT8, x->rank, x->dims);
	p->kernel = quantize_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- DequantizeLinear */

/* y = (x - z) * s, the difference taken exactly in the integer type W. */
#define DEQUANTIZE_ROW(name, T, W)                                                                  \
	static void name(const void *restrict in, float *restrict y, int64_t n, int64_t z, float s) \
	{                                                                                           \
		const T *restrict x = in;                                                           \
		W zw = (W)z;                                                                        \
		for (int64_t i = 0; i < n; i++)                                                     \
			y[i] = (float)((W)x[i] - zw) * s;                                           \
	}
DEQUANTIZE_ROW(dequantize_u8, uint8_t, int32_t)
DEQUANTIZE_ROW(dequantize_i8, int8_t, int32_t)
DEQUANTIZE_ROW(dequantize_u16, uint16_t, int32_t)
DEQUANTIZE_ROW(dequantize_i16, int16_t, int32_t)
DEQUANTIZE_ROW(dequantize_i32, int32_t, int64_t)
#undef DEQUANTIZE_ROW

typedef void (*dequantize_row_fn)(const void *restrict in, float *restrict y, int64_t n, int64_t z, float s);

static dequantize_row_fn dequantize_row_for(int dtype)
{
	switch (dtype) {
	case TERN_UINT8: return dequantize_u8;
	case TERN_INT8: return dequantize_i8;
	case TERN_UINT16: return dequantize_u16;
	case TERN_INT16: return dequantize_i16;
	default: return dequantize_i32;
	}
}

/* From float8: (x - z) * s in float; the zero point is subtracted only when it is not 0, as in
 * quantize_float8_segment. A float output is decoded into in place. */
static void dequantize_float8_segment(const quant_job *j, int64_t off, int64_t n, int64_t c)
{
	const uint8_t *x = (const uint8_t *)j->x->data + off;
	tern_tensor *y = j->y;
	float s = (float)tern_tensor_get_f64(j->scale, c), z = float8_zero_point(j->zero_point, c);
	float buf[QUANT_PIECE];
	for (int64_t k = 0; k < n; k += QUANT_PIECE) {
		int64_t m = n - k < QUANT_PIECE ? n - k : QUANT_PIECE;
		float *v = y->dtype == TERN_FLOAT ? (float *)y->data + off + k : buf;
		tern_f8_to_f32_n(j->x->dtype, x + k, v, m);
		if (z != 0)
			for (int64_t e = 0; e < m; e++)
				v[e] -= z;
		for (int64_t e = 0; e < m; e++)
			v[e] *= s;
		uint16_t *h = (uint16_t *)y->data + off + k;
		if (y->dtype == TERN_FLOAT16)
			for (int64_t e = 0; e < m; e++)
				h[e] = tern_f32_to_f16(v[e]);
		else if (y->dtype == TERN_BFLOAT16)
			for (int64_t e = 0; e < m; e++)
				h[e] = tern_f32_to_bf16(v[e]);
	}
}

static void dequantize_segment(void *ctx, int64_t i)
{
	const quant_job *j = ctx;
	int64_t off, n, c;
	segment_at(j, i, &off, &n, &c);
	const tern_tensor *x = j->x;
	tern_tensor *y = j->y;
	if (is_float8(x->dtype)) {
		dequantize_float8_segment(j, off, n, c);
		return;
	}
	float s = (float)tern_tensor_get_f64(j->scale, c);
	int64_t z = j->zero_point ? tern_tensor_get_i64(j->zero_point, c) : 0;
	const char *xd = (const char *)x->data + off * (int64_t)tern_dtype_size(x->dtype);
	dequantize_row_fn row = dequantize_row_for(x->dtype);
	if (y->dtype == TERN_FLOAT) {
		row(xd, (float *)y->data + off, n, z, s);
		return;
	}
	float buf[QUANT_PIECE];
	uint16_t *h = (uint16_t *)y->data + off;
	for (int64_t k = 0; k < n; k += QUANT_PIECE) {
		int64_t m = n - k < QUANT_PIECE ? n - k : QUANT_PIECE;
		row(xd + k * (int64_t)tern_dtype_size(x->dtype), buf, m, z, s);
		if (y->dtype == TERN_FLOAT16)
			for (int64_t e = 0; e < m; e++)
				h[k + e] = tern_f32_to_f16(buf[e]);
		else
			for (int64_t e = 0; e < m; e++)
				h[k + e] = tern_f32_to_bf16(buf[e]);
	}
}

static tern_status dequantize_kernel(const tern_kernel_args *a)
{
	quant_job j = {.l = a->params,
	               .x = a->in[0],
	               .scale = a->in[1],
	               .zero_point = a->n_in > 2 ? a->in[2] : NULL,
	               .y = a->out[0]};
	run_segments(a, &j, dequantize_segment);
	return TERN_OK;
}

static tern_status dequantize_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *scale = p->n_in > 1 ? p->in[1] : NULL, *zp = p->n_in > 2 ? p->in[2] : NULL;
	if (!is_quant_int(x->dtype) && x->dtype != TERN_INT32 && !is_float8(x->dtype))
		return bad_dtype(node, 0, "x", x->dtype, "uint8, int8, uint16, int16, int32 or a float8 type");
	if (scale && !is_float_type(scale->dtype))
		return bad_dtype(node, 1, "x_scale", scale->dtype, "float, float16 or bfloat16");
	if (zp && zp->dtype != x->dtype)
		return tern_node_errorf(node, TERN_EDATA, "input 2 'x_zero_point' is %s; input 0 'x' is %s",
		                        tern_dtype_name(zp->dtype), tern_dtype_name(x->dtype));
	tern_status st = layout_setup(p, "x_scale", "x_zero_point");
	if (st)
		return st;
	tern_set_shape(p->out[0], scale->dtype, x->rank, x->dims);
	p->kernel = dequantize_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- DynamicQuantizeLinear */

/* Quantizes x to uint8 over the range [min(x, 0), max(x, 0)], so that 0 is exactly representable. */
static tern_status dynamic_quantize_kernel(const tern_kernel_args *a)
{
	const tern_tensor *x = a->in[0];
	const float *xd = x->data;
	int64_t n = tern_tensor_numel(x);
	/* Minimum and maximum per lane, then across lanes: a loop over lanes vectorises, a reduction of
	 * selects does not. */
	enum { LANES = 16 };
	float lanes_lo[LANES] = {0}, lanes_hi[LANES] = {0};
	int64_t whole = n - n % LANES;
	for (int64_t i = 0; i < whole; i += LANES)
		for (int l = 0; l < LANES; l++) {
			float v = xd[i + l];
			lanes_lo[l] = tern_select_f32(v < lanes_lo[l], v, lanes_lo[l]);
			lanes_hi[l] = tern_select_f32(v > lanes_hi[l], v, lanes_hi[l]);
		}
	for (int64_t i = whole; i < n; i++) {
		lanes_lo[0] = tern_select_f32(xd[i] < lanes_lo[0], xd[i], lanes_lo[0]);
		lanes_hi[0] = tern_select_f32(xd[i] > lanes_hi[0], xd[i], lanes_hi[0]);
	}
	float lo = 0, hi = 0;
	for (int l = 0; l < LANES; l++) {
		lo = lanes_lo[l] < lo ? lanes_lo[l] : lo;
		hi = lanes_hi[l] > hi ? lanes_hi[l] : hi;
	}
	float scale = (hi - lo) / 255.0f;
	/* An all-zero input has no range: scale 0 and zero point 0 quantize it to zeros, where the formula
	 * would divide by zero. */
	uint8_t zero = 0;
	if (scale != 0)
		zero = (uint8_t)quantize_value(-lo, scale, 0, 0, 255);
	tern_tensor s = {.dtype = TERN_FLOAT, .rank = 0, .data = &scale, .nbytes = sizeof scale};
	tern_tensor z = {.dtype = TERN_UINT8, .rank = 0, .data = &zero, .nbytes = sizeof zero};
	if (a->out[0]) {
		quant_layout l = {1, 1, n, 1};
		if (scale == 0)
			memset(a->out[0]->data, 0, (size_t)n);
		else {
			quant_job j = {.l = &l, .x = x, .scale = &s, .zero_point = &z, .y = a->out[0]};
			run_segments(a, &j, quantize_segment);
		}
	}
	if (a->n_out > 1 && a->out[1])
		*(float *)a->out[1]->data = scale;
	if (a->n_out > 2 && a->out[2])
		*(uint8_t *)a->out[2]->data = zero;
	return TERN_OK;
}

static tern_status dynamic_quantize_prepare(tern_prepare_args *p)
{
	const tern_tensor *x = p->in[0];
	if (x->dtype != TERN_FLOAT)
		return bad_dtype(p->node, 0, "x", x->dtype, "float");
	if (p->out[0])
		tern_set_shape(p->out[0], TERN_UINT8, x->rank, x->dims);
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], TERN_FLOAT, 0, NULL);
	if (p->n_out > 2 && p->out[2])
		tern_set_shape(p->out[2], TERN_UINT8, 0, NULL);
	p->kernel = dynamic_quantize_kernel;
	return TERN_OK;
}

static const tern_op ops[] = {
        {"", "QuantizeLinear", 10, 0, quantize_prepare, 0, "quant"},
        {"", "DequantizeLinear", 10, 0, dequantize_prepare, 0, "quant"},
        {"", "DynamicQuantizeLinear", 11, 0, dynamic_quantize_prepare, TERN_DT(FLOAT), "quant"},
};

const tern_op_table tern_ops_quant = {ops, TERN_ARRAY_LEN(ops)};
