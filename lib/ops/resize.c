/* resize.c — Resize (nearest, linear and cubic; every coordinate transformation, antialias, axes and
 * keep_aspect_ratio_policy) and Upsample. Each axis's taps and weights are made when planning; nearest
 * is a gather for any element type, linear and cubic a weighted sum over float or double planes
 * (float16 and bfloat16 are computed in float). */
#include "ops/nn.h"

/* ---------------------------------------------------------------- Resize, Upsample */

enum resize_mode { RESIZE_NEAREST, RESIZE_LINEAR, RESIZE_CUBIC };
enum coord_mode { HALF_PIXEL, HALF_PIXEL_SYMMETRIC, PYTORCH_HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, TF_CROP_AND_RESIZE };
enum nearest_mode { ROUND_PREFER_FLOOR, ROUND_PREFER_CEIL, NEAREST_FLOOR, NEAREST_CEIL };

typedef struct resize_options {
	enum resize_mode mode;
	enum coord_mode coord;
	enum nearest_mode nearest;
	double cubic_a, extrapolation;
	bool exclude_outside, antialias;
} resize_options;

/* Per axis, each output coordinate reads `count` input elements at element offsets off[] with
 * weights w[] (taps slots reserved per coordinate), or is outside the input (tf_crop_and_resize). */
typedef struct resize_axis {
	int64_t in, out, taps, stride;
	int64_t *off;
	double *w;
	int *count;
	bool *outside;
} resize_axis;

typedef struct resize_params {
	int rank, first; /* axes before `first` are unchanged: whole planes */
	int64_t planes, in_plane, out_plane;
	bool nearest;
	double extrapolation;
	resize_axis ax[TERN_MAX_RANK];
} resize_params;

static void resize_free(void *p)
{
	resize_params *rp = p;
	for (int i = 0; rp && i < rp->rank; i++)
		free(rp->ax[i].off);
	free(rp);
}

static double cubic_weight(double x, double a)
{
	x = fabs(x);
	if (x <= 1)
		return ((a + 2) * x - (a + 3)) * x * x + 1;
	if (x < 2)
		return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
	return 0;
}

/* The input coordinate that output coordinate x maps to. */
static double source_coord(const resize_options *o, double x, double scale, int64_t in, int64_t out,
                           double roi_start, double roi_end)
{
	/* The length the scale implies, which may be fractional; the reference uses it as such. */
	double scaled = scale * (double)in;
	switch (o->coord) {
	case HALF_PIXEL:
		return (x + 0.5) / scale - 0.5;
	case HALF_PIXEL_SYMMETRIC: {
		double adjust = (double)out / scaled, offset = (double)in / 2 * (1 - adjust);
		return offset + (x + 0.5) / scale - 0.5;
	}
	case PYTORCH_HALF_PIXEL:
		return out > 1 ? (x + 0.5) / scale - 0.5 : 0;
	case ALIGN_CORNERS:
		return scaled == 1 ? 0 : x * (double)(in - 1) / (scaled - 1);
	case ASYMMETRIC:
		return x / scale;
	case TF_CROP_AND_RESIZE:
		if (scaled == 1)
			return (roi_end - roi_start) * (double)(in - 1) / 2 + roi_start * (double)(in - 1);
		return x * (roi_end - roi_start) * (double)(in - 1) / (scaled - 1) + roi_start * (double)(in - 1);
	}
	return 0;
}

/* Fills one axis's taps. Neighbours follow the reference: for a fractional coordinate the base is its
 * floor, for a whole one the element before (with ratio 1), so the tap of weight 1 is the element
 * itself; indices outside the input clamp to its edge. */
static tern_status resize_axis_build(const resize_options *o, resize_axis *ax, double scale, double roi_start,
                                     double roi_end)
{
	double s = o->antialias && scale < 1 ? scale : 1; /* antialias widens the filter when shrinking */
	int64_t start = 0, taps = 1;
	if (o->mode == RESIZE_LINEAR) {
		start = (int64_t)floor(-1 / s) + 1;
		taps = 2 - 2 * start;
	} else if (o->mode == RESIZE_CUBIC) {
		start = (int64_t)floor(-2 / s) + 1;
		taps = 2 - 2 * start;
	}
	int64_t n = ax->out;
	size_t bytes = (size_t)(n * taps) * (sizeof(int64_t) + sizeof(double)) + (size_t)n * (sizeof(int) + sizeof(bool));
	char *mem = malloc(bytes ? bytes : 1);
	if (!mem)
		return TERN_EOS;
	ax->taps = taps;
	ax->off = (int64_t *)mem;
	ax->w = (double *)(ax->off + n * taps);
	ax->count = (int *)(ax->w + n * taps);
	ax->outside = (bool *)(ax->count + n);
	for (int64_t x = 0; x < n; x++) {
		int64_t *off = ax->off + x * taps;
		double *w = ax->w + x * taps;
		double xo = source_coord(o, (double)x, scale, ax->in, ax->out, roi_start, roi_end);
		ax->outside[x] = o->coord == TF_CROP_AND_RESIZE && (xo < 0 || xo > (double)(ax->in - 1));
		ax->count[x] = 0;
		if (ax->outside[x])
			continue;
		double fl = floor(xo);
		int64_t base = xo == fl ? (int64_t)fl - 1 : (int64_t)fl;
		double ratio = xo - (double)base;
		/* tap i reads element first + i; the weights go straight into w[], zero ones squeezed out after */
		int64_t first = base + start, m = taps;
		if (o->mode == RESIZE_NEAREST) {
			bool up = ratio == 1 || (o->nearest == ROUND_PREFER_FLOOR && ratio > 0.5) ||
			          (o->nearest == ROUND_PREFER_CEIL && ratio >= 0.5) || o->nearest == NEAREST_CEIL;
			first = base + (up ? 1 : 0);
			w[0] = 1;
		} else {
			double sum = 0;
			for (int64_t i = 0; i < m; i++) {
				double arg = ((double)(start + i) - ratio) * s;
				w[i] = o->mode == RESIZE_LINEAR ? fmax(0, 1 - fabs(arg)) : cubic_weight(arg, o->cubic_a);
				if (o->exclude_outside && (first + i < 0 || first + i >= ax->in))
					w[i] = 0;
				sum += w[i];
			}
			for (int64_t i = 0; i < m && sum != 0; i++)
				w[i] /= sum;
		}
		for (int64_t i = 0; i < m; i++) {
			if (w[i] == 0)
				continue;
			int64_t k = first + i < 0 ? 0 : first + i >= ax->in ? ax->in - 1 : first + i;
			off[ax->count[x]] = k * ax->stride;
			w[ax->count[x]++] = w[i];
		}
	}
	return TERN_OK;
}

static bool resize_axis_identity(const resize_axis *ax)
{
	if (ax->in != ax->out)
		return false;
	for (int64_t x = 0; x < ax->out; x++)
		if (ax->outside[x] || ax->count[x] != 1 || ax->off[x * ax->taps] != x * ax->stride || ax->w[x * ax->taps] != 1)
			return false;
	return true;
}

typedef struct resize_ctx {
	const resize_params *rp;
	size_t es;
	const void *x;
	void *y;
	const void *extra; /* the extrapolation value in the element type */
} resize_ctx;

/* Nearest: a gather, the same for every element type. */
static void resize_gather(const resize_ctx *c, int axis, const char *x, char *y)
{
	const resize_axis *ax = &c->rp->ax[axis];
	int64_t out_stride = 1;
	for (int d = axis + 1; d < c->rp->rank; d++)
		out_stride *= c->rp->ax[d].out;
	for (int64_t o = 0; o < ax->out; o++) {
		char *yo = y + (size_t)(o * out_stride) * c->es;
		if (ax->outside[o]) {
			for (int64_t i = 0; i < out_stride; i++)
				memcpy(yo + (size_t)i * c->es, c->extra, c->es);
		} else if (axis == c->rp->rank - 1) {
			memcpy(yo, x + (size_t)ax->off[o * ax->taps] * c->es, c->es);
		} else {
			resize_gather(c, axis + 1, x + (size_t)ax->off[o * ax->taps] * c->es, yo);
		}
	}
}

static void resize_gather_planes(void *ctx, int64_t begin, int64_t end)
{
	const resize_ctx *c = ctx;
	for (int64_t i = begin; i < end; i++)
		resize_gather(c, c->rp->first, (const char *)c->x + (size_t)(i * c->rp->in_plane) * c->es,
		              (char *)c->y + (size_t)(i * c->rp->out_plane) * c->es);
}

/* Linear and cubic: each output element is the weighted sum over the product of its axes' taps. */
#define DEF_RESIZE(S, T)                                                                                  \
	static double resize_value_##S(const resize_params *rp, int axis, const T *x, const int64_t *o)       \
	{                                                                                                     \
		const resize_axis *ax = &rp->ax[axis];                                                            \
		const int64_t *off = ax->off + o[axis] * ax->taps;                                                \
		const double *w = ax->w + o[axis] * ax->taps;                                                     \
		double sum = 0;                                                                                   \
		if (axis == rp->rank - 1)                                                                         \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				sum += w[i] * x[off[i]];                                                                  \
		else                                                                                              \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				sum += w[i] * resize_value_##S(rp, axis + 1, x + off[i], o);                              \
		return sum;                                                                                       \
	}                                                                                                     \
	/* The common case, the last two axes resized: loops without recursion. */                          \
	static void resize_2d_##S(const resize_params *rp, const T *x, T *y)                                  \
	{                                                                                                     \
		const resize_axis *ah = &rp->ax[rp->rank - 2], *aw = &rp->ax[rp->rank - 1];                       \
		for (int64_t oh = 0; oh < ah->out; oh++) {                                                        \
			const int64_t *offh = ah->off + oh * ah->taps;                                                \
			const double *wh = ah->w + oh * ah->taps;                                                     \
			T *yr = y + oh * aw->out;                                                                     \
			for (int64_t ow = 0; ow < aw->out; ow++) {                                                    \
				if (ah->outside[oh] || aw->outside[ow]) {                                                 \
					yr[ow] = (T)rp->extrapolation;                                                        \
					continue;                                                                             \
				}                                                                                         \
				const int64_t *offw = aw->off + ow * aw->taps;                                            \
				const double *ww = aw->w + ow * aw->taps;                                                 \
				double sum = 0;                                                                           \
				for (int th = 0; th < ah->count[oh]; th++) {                                              \
					const T *row = x + offh[th];                                                          \
					double part = 0;                                                                      \
					for (int tw = 0; tw < aw->count[ow]; tw++)                                            \
						part += ww[tw] * row[offw[tw]];                                                   \
					sum += wh[th] * part;                                                                 \
				}                                                                                         \
				yr[ow] = (T)sum;                                                                          \
			}                                                                                             \
		}                                                                                                 \
	}                                                                                                     \
	TERN_ISA_BODY void resize_planes_##S##_body(void *ctx, int64_t begin, int64_t end)                              \
	{                                                                                                     \
		const resize_ctx *c = ctx;                                                                        \
		const resize_params *rp = c->rp;                                                                  \
		for (int64_t plane = begin; plane < end; plane++) {                                               \
			const T *x = (const T *)c->x + plane * rp->in_plane;                                          \
			T *y = (T *)c->y + plane * rp->out_plane;                                                     \
			if (rp->first == rp->rank - 2) {                                                              \
				resize_2d_##S(rp, x, y);                                                                  \
				continue;                                                                                 \
			}                                                                                             \
			int64_t o[TERN_MAX_RANK] = {0};                                                               \
			for (int64_t i = 0; i < rp->out_plane; i++) {                                                 \
				bool outside = false;                                                                     \
				for (int d = rp->first; d < rp->rank; d++)                                                \
					outside |= rp->ax[d].outside[o[d]];                                                   \
				y[i] = outside ? (T)rp->extrapolation : (T)resize_value_##S(rp, rp->first, x, o);         \
				for (int d = rp->rank - 1; d >= rp->first; d--) {                                         \
					if (++o[d] < rp->ax[d].out)                                                           \
						break;                                                                            \
					o[d] = 0;                                                                             \
				}                                                                                         \
			}                                                                                             \
		}                                                                                                 \
	} \
	TERN_ISA_VARIANTS3(void, resize_planes_##S, (void *ctx, int64_t begin, int64_t end), (ctx, begin, end))

DEF_RESIZE(f32, float)
DEF_RESIZE(f64, double)

static tern_status resize_kernel(const tern_kernel_args *a)
{
	const resize_params *rp = a->params;
	int dtype = a->in[0]->dtype;
	union {
		double d;
		float f;
		int64_t i64;
		int32_t i32;
		int16_t i16;
		int8_t i8;
	} extra;
	memset(&extra, 0, sizeof extra);
	switch (dtype) {
	case TERN_DOUBLE: extra.d = rp->extrapolation; break;
	case TERN_FLOAT: extra.f = (float)rp->extrapolation; break;
	case TERN_INT64: case TERN_UINT64: extra.i64 = (int64_t)rp->extrapolation; break;
	case TERN_INT32: case TERN_UINT32: extra.i32 = (int32_t)rp->extrapolation; break;
	case TERN_INT16: case TERN_UINT16: extra.i16 = (int16_t)rp->extrapolation; break;
	default: extra.i8 = (int8_t)rp->extrapolation; break;
	}
	resize_ctx c = {rp, tern_dtype_size(dtype), a->in[0]->data, a->out[0]->data, &extra};
	range_fn fn = rp->nearest ? resize_gather_planes : dtype == TERN_DOUBLE ? resize_planes_f64 : resize_planes_f32;
	parallel_range(a->pool, rp->planes, grain_for(rp->out_plane), fn, &c);
	return TERN_OK;
}

/* Builds the taps of every axis from per-axis scales and output sizes (into p->params) and output 0's
 * shape. */
static tern_status resize_build(tern_prepare_args *p, const resize_options *o, const double *scale,
                                 const int64_t *out, const double *roi)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	if (o->mode != RESIZE_NEAREST && !(x->dtype == TERN_FLOAT || x->dtype == TERN_DOUBLE || is_half(x->dtype)))
		return tern_node_errorf(node, TERN_EDATA, "linear and cubic modes need a floating-point input, got %s",
		                        tern_dtype_name(x->dtype));
	resize_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return no_memory(node);
	p->params = rp;
	p->free_params = resize_free;
	rp->rank = x->rank;
	rp->nearest = o->mode == RESIZE_NEAREST;
	rp->extrapolation = o->extrapolation;
	int64_t stride = 1;
	for (int d = x->rank - 1; d >= 0; d--) {
		resize_axis *ax = &rp->ax[d];
		ax->in = x->dims[d];
		ax->out = out[d];
		ax->stride = stride;
		stride *= ax->in;
		if (out[d] < 0 || (out[d] > 0 && ax->in == 0))
			return tern_node_errorf(node, TERN_EDATA, "axis %d: cannot resize %lld elements to %lld", d,
			                        (long long)ax->in, (long long)out[d]);
		if (resize_axis_build(o, ax, scale[d], roi ? roi[d] : 0, roi ? roi[x->rank + d] : 1))
			return no_memory(node);
	}
	rp->first = 0;
	while (rp->first < rp->rank && resize_axis_identity(&rp->ax[rp->first]))
		rp->first++;
	rp->planes = prod(x->dims, 0, rp->first);
	rp->in_plane = prod(x->dims, rp->first, x->rank);
	rp->out_plane = prod(out, rp->first, x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank, out);
	return TERN_OK;
}

/* The kernel for parameters resize_build made (nothing when planning was deferred). */
static tern_status resize_done(tern_prepare_args *p, tern_status st)
{
	const resize_params *rp = p->params;
	if (st || !rp)
		return st;
	p->kernel = resize_kernel;
	return rp->nearest ? TERN_OK : tern_nn_stage_halves(p);
}

/* Resize's parameters as at opset `opset`, or p->defer. */
static tern_status resize_plan(tern_prepare_args *p, int64_t opset)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	int r = x->rank;
	bool v10 = opset < 11;
	const tern_tensor *roi = v10 || p->n_in < 2 ? NULL : p->in[1];
	const tern_tensor *scales = p->n_in > (v10 ? 1 : 2) ? p->in[v10 ? 1 : 2] : NULL;
	const tern_tensor *sizes = !v10 && p->n_in > 3 ? p->in[3] : NULL;
	if (roi && tern_tensor_numel(roi) == 0)
		roi = NULL;
	if (scales && tern_tensor_numel(scales) == 0)
		scales = NULL;
	if (sizes && tern_tensor_numel(sizes) == 0)
		sizes = NULL;
	if ((scales && !scales->data) || (sizes && !sizes->data) || (roi && !roi->data)) {
		p->defer = 1;
		return TERN_OK;
	}
	if (!scales == !sizes)
		return tern_node_errorf(node, TERN_EDATA, "exactly one of 'scales' and 'sizes' must be given");
	resize_options o = {0};
	static const char *const modes[] = {"nearest", "linear", "cubic"};
	static const char *const coords[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
	                                     "align_corners", "asymmetric", "tf_crop_and_resize"};
	static const char *const nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
	int mode = 0, coord = 0, nm = 0;
	tern_status st = parse_enum(node, "mode", "nearest", modes, 3, &mode);
	if (!st)
		st = parse_enum(node, "coordinate_transformation_mode", v10 ? "asymmetric" : "half_pixel", coords, 6, &coord);
	if (!st)
		st = parse_enum(node, "nearest_mode", v10 ? "floor" : "round_prefer_floor", nearest, 4, &nm);
	if (st)
		return st;
	o.mode = mode;
	o.coord = coord;
	o.nearest = nm;
	o.cubic_a = tern_attr_float(node, "cubic_coeff_a", -0.75f);
	o.exclude_outside = tern_attr_int(node, "exclude_outside", 0) != 0;
	o.extrapolation = tern_attr_float(node, "extrapolation_value", 0.0f);
	o.antialias = tern_attr_int(node, "antialias", 0) != 0 && mode != RESIZE_NEAREST;
	/* The listed axes (all by default) get the given scales, sizes and roi; the rest stay. */
	size_t n_axes;
	const int64_t *axes_attr = tern_attr_ints(node, "axes", &n_axes);
	int axes[TERN_MAX_RANK];
	if (!axes_attr)
		n_axes = (size_t)r;
	bool seen[TERN_MAX_RANK] = {false};
	for (size_t i = 0; i < n_axes; i++) {
		if (axes_attr && (st = axis_in(node, axes_attr[i], r, &axes[i])))
			return st;
		if (!axes_attr)
			axes[i] = (int)i;
		if (seen[axes[i]])
			return tern_node_errorf(node, TERN_EDATA, "attribute 'axes' repeats axis %d", axes[i]);
		seen[axes[i]] = true;
	}
	const tern_tensor *given = scales ? scales : sizes;
	if (tern_tensor_numel(given) != (int64_t)n_axes)
		return tern_node_errorf(node, TERN_EDATA, "'%s' has %lld values for %zu axes", scales ? "scales" : "sizes",
		                        (long long)tern_tensor_numel(given), n_axes);
	if (roi && tern_tensor_numel(roi) != 2 * (int64_t)n_axes)
		return tern_node_errorf(node, TERN_EDATA, "'roi' has %lld values for %zu axes", (long long)tern_tensor_numel(roi),
		                        n_axes);
	double scale[TERN_MAX_RANK], roi_full[2 * TERN_MAX_RANK];
	int64_t out[TERN_MAX_RANK];
	for (int d = 0; d < r; d++) {
		scale[d] = 1;
		out[d] = x->dims[d];
		roi_full[d] = 0;
		roi_full[r + d] = 1;
	}
	for (size_t i = 0; i < n_axes; i++) {
		int d = axes[i];
		if (roi) {
			roi_full[d] = tern_tensor_get_f64(roi, (int64_t)i);
			roi_full[r + d] = tern_tensor_get_f64(roi, (int64_t)(n_axes + i));
		}
		if (scales) {
			scale[d] = tern_tensor_get_f64(scales, (int64_t)i);
			if (!(scale[d] > 0))
				return tern_node_errorf(node, TERN_EDATA, "scale %g for axis %d is not positive", scale[d], d);
			out[d] = (int64_t)floor(scale[d] * (double)x->dims[d]);
		} else {
			out[d] = tern_tensor_get_i64(sizes, (int64_t)i);
			scale[d] = x->dims[d] ? (double)out[d] / (double)x->dims[d] : 1;
		}
	}
	const char *policy = tern_attr_string(node, "keep_aspect_ratio_policy", "stretch");
	if (sizes && !streq(policy, "stretch")) {
		if (!streq(policy, "not_larger") && !streq(policy, "not_smaller"))
			return bad_attr(node, "keep_aspect_ratio_policy", policy);
		double s = scale[axes[0]];
		for (size_t i = 1; i < n_axes; i++)
			s = streq(policy, "not_larger") ? fmin(s, scale[axes[i]]) : fmax(s, scale[axes[i]]);
		for (size_t i = 0; i < n_axes; i++) {
			scale[axes[i]] = s;
			out[axes[i]] = (int64_t)(s * (double)x->dims[axes[i]] + 0.5);
		}
	}
	return resize_build(p, &o, scale, out, roi ? roi_full : NULL);
}

static tern_status resize_prepare(tern_prepare_args *p) { return resize_done(p, resize_plan(p, p->node->opset)); }

/* Upsample's parameters as at opset `opset`, or p->defer. */
static tern_status upsample_plan(tern_prepare_args *p, int64_t opset)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	double scale[TERN_MAX_RANK];
	int64_t out[TERN_MAX_RANK];
	if (opset >= 9) {
		const tern_tensor *s = p->n_in > 1 ? p->in[1] : NULL;
		if (!s)
			return tern_node_errorf(node, TERN_EDATA, "input 1 'scales' is required");
		if (!s->data) {
			p->defer = 1;
			return TERN_OK;
		}
		if (tern_tensor_numel(s) != x->rank)
			return tern_node_errorf(node, TERN_EDATA, "'scales' has %lld values for rank %d",
			                        (long long)tern_tensor_numel(s), x->rank);
		for (int d = 0; d < x->rank; d++)
			scale[d] = tern_tensor_get_f64(s, d);
	} else {
		size_t n;
		const float *s = tern_attr_floats(node, "scales", &n);
		if (!s || n != (size_t)x->rank)
			return tern_node_errorf(node, TERN_EDATA, "attribute 'scales' needs %d values", x->rank);
		for (int d = 0; d < x->rank; d++)
			scale[d] = s[d];
	}
	for (int d = 0; d < x->rank; d++) {
		if (!(scale[d] >= 1))
			return tern_node_errorf(node, TERN_EDATA, "scale %g for axis %d is below 1", scale[d], d);
		out[d] = (int64_t)floor(scale[d] * (double)x->dims[d]);
	}
	resize_options o = {0};
	const char *mode = tern_attr_string(node, "mode", "nearest");
	if (streq(mode, "nearest"))
		o.mode = RESIZE_NEAREST;
	else if (streq(mode, "linear") || streq(mode, "bilinear"))
		o.mode = RESIZE_LINEAR;
	else
		return bad_attr(node, "mode", mode);
	o.coord = ASYMMETRIC;
	o.nearest = NEAREST_FLOOR;
	return resize_build(p, &o, scale, out, NULL);
}

static tern_status upsample_prepare(tern_prepare_args *p) { return resize_done(p, upsample_plan(p, p->node->opset)); }

/* ---------------------------------------------------------------- gradients */

/* tern.ResizeGrad(dY, x_shape, <the forward's other inputs>) -> dX, with the forward's attributes and
 * `forward` ("Resize" or "Upsample") and `opset` (the forward's): the adjoint of the resize, every
 * output element's gradient added back onto the input elements it read, times their weights (nearest:
 * the one it copied; linear and cubic: the taps, edges clamped as the forward's; an output outside
 * the input, tf_crop_and_resize's extrapolation, sends nothing back). */
#define DEF_RESIZE_GRAD(S, T)                                                                              \
	static void resize_scatter_##S(const resize_params *rp, int axis, T *dx, const int64_t *o, double g)   \
	{                                                                                                     \
		const resize_axis *ax = &rp->ax[axis];                                                            \
		const int64_t *off = ax->off + o[axis] * ax->taps;                                                \
		const double *w = ax->w + o[axis] * ax->taps;                                                     \
		if (axis == rp->rank - 1)                                                                         \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				dx[off[i]] += (T)(w[i] * g);                                                              \
		else                                                                                              \
			for (int i = 0; i < ax->count[o[axis]]; i++)                                                  \
				resize_scatter_##S(rp, axis + 1, dx + off[i], o, w[i] * g);                               \
	}                                                                                                     \
	static void resize_grad_planes_##S(void *ctx, int64_t begin, int64_t end)                            \
	{                                                                                                     \
		const resize_ctx *c = ctx; /* x: dY, y: dX */                                                     \
		const resize_params *rp = c->rp;                                                                  \
		for (int64_t plane = begin; plane < end; plane++) {                                               \
			const T *dy = (const T *)c->x + plane * rp->out_plane;                                        \
			T *dx = (T *)c->y + plane * rp->in_plane;                                                     \
			memset(dx, 0, (size_t)rp->in_plane * sizeof *dx);                                             \
			int64_t o[TERN_MAX_RANK] = {0};                                                               \
			for (int64_t i = 0; i < rp->out_plane; i++) {                                                 \
				bool outside = false;                                                                     \
				for (int d = rp->first; d < rp->rank; d++)                                                \
					outside |= rp->ax[d].outside[o[d]];                                                   \
				if (!outside && rp->first < rp->rank)                                                     \
					resize_scatter_##S(rp, rp->first, dx, o, dy[i]);                                      \
				else if (!outside)                                                                        \
					dx[0] += dy[i];                                                                       \
				for (int d = rp->rank - 1; d >= rp->first; d--) {                                         \
					if (++o[d] < rp->ax[d].out)                                                           \
						break;                                                                            \
					o[d] = 0;                                                                             \
				}                                                                                         \
			}                                                                                             \
		}                                                                                                 \
	}

DEF_RESIZE_GRAD(f32, float)
DEF_RESIZE_GRAD(f64, double)

static tern_status resize_grad_kernel(const tern_kernel_args *a)
{
	const resize_params *rp = a->params;
	int dtype = a->in[0]->dtype;
	resize_ctx c = {rp, compute_size(dtype), a->in[0]->data, a->out[0]->data, NULL};
	parallel_range(a->pool, rp->planes, grain_for(rp->out_plane * 4),
	               dtype == TERN_DOUBLE ? resize_grad_planes_f64 : resize_grad_planes_f32, &c);
	return TERN_OK;
}

static tern_status resize_grad_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *dy = p->in[0];
	int rank = 0;
	int64_t dims[TERN_MAX_RANK];
	bool ready;
	tern_status st = check_real(node, dy, 0);
	if (st || (st = tern_nn_shape_input(p, 1, &rank, dims, &ready)) || !ready)
		return st;
	if (p->n_in > 6)
		return tern_node_errorf(node, TERN_EDATA, "too many inputs");
	/* the forward's planning, on X's shape and its other inputs */
	tern_tensor x = tern_nn_shape_only(dy->dtype, rank, dims), y;
	memset(&y, 0, sizeof y);
	tern_tensor *fin[5] = {&x}, *fout[1] = {&y};
	for (int i = 2; i < p->n_in; i++)
		fin[i - 1] = p->in[i];
	tern_prepare_args f = *p;
	f.in = fin;
	f.n_in = p->n_in - 1;
	f.out = fout;
	f.n_out = 1;
	int64_t opset = tern_attr_int(node, "opset", 13);
	st = streq(tern_attr_string(node, "forward", "Resize"), "Upsample") ? upsample_plan(&f, opset) : resize_plan(&f, opset);
	p->params = f.params;
	p->free_params = f.free_params;
	p->defer = f.defer;
	if (st || f.defer)
		return st;
	bool same = dy->rank == y.rank;
	for (int d = 0; same && d < y.rank; d++)
		same = dy->dims[d] == y.dims[d];
	if (!same) {
		char s1[128], s2[128];
		return tern_node_errorf(node, TERN_EDATA, "input 0 %s (the output's gradient) does not match the output %s",
		                        tern_shape_str(dy->dtype, dy->rank, dy->dims, s1, sizeof s1),
		                        tern_shape_str(y.dtype, y.rank, y.dims, s2, sizeof s2));
	}
	tern_set_shape(p->out[0], dy->dtype, rank, dims);
	p->kernel = resize_grad_kernel;
	return tern_nn_stage_halves(p);
}

/* Resize and Upsample: tern.ResizeGrad (roi, scales and sizes carry no gradient). */
static tern_status resize_grad_rule(tern_grad_ctx *g, const char *forward)
{
	if (!g->wants[0])
		return tern_nn_g_done(g, ~0u);
	tern_gval *in[6] = {g->dy[0], tern_nn_g_shape(g, g->x[0])};
	if (g->n_in > 5)
		return tern_g_fail(g, "too many inputs");
	for (int i = 1; i < g->n_in; i++)
		in[i + 1] = g->x[i];
	tern_gattr at[2] = {TERN_GA_S("forward", forward), TERN_GA_I("opset", g->node->opset)};
	g->dx[0] = in[1] ? tern_g_op_like(g, "tern", "ResizeGrad", in, g->n_in + 1, at, 2) : NULL;
	return tern_nn_g_done(g, ~1u);
}

static tern_status resize_grad(tern_grad_ctx *g) { return resize_grad_rule(g, "Resize"); }
static tern_status upsample_grad(tern_grad_ctx *g) { return resize_grad_rule(g, "Upsample"); }

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
	{"", "Resize", 10, 0, resize_prepare, 0, "resize", resize_grad},
	{"", "Upsample", 7, 9, upsample_prepare, 0, "resize", upsample_grad},
	{"tern", "ResizeGrad", 1, 0, resize_grad_prepare, TERN_DT_FLOATS, "resize"},
};

const tern_op_table tern_ops_resize = {ops, TERN_ARRAY_LEN(ops)};
