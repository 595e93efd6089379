/* misc.c — random generators, NonMaxSuppression, RoiAlign, GridSample, DFT and STFT, window functions
 * and MelWeightMatrix. */
#include "internal.h"
#include "ops_common.h"
#include "autodiff/grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PI 3.14159265358979323846

static bool is_float_dtype(int dt)
{
	return dt == TERN_FLOAT || dt == TERN_DOUBLE || dt == TERN_FLOAT16 || dt == TERN_BFLOAT16;
}

static bool is_numeric_dtype(int dt)
{
	return dt != TERN_STRING && dt != TERN_BOOL && dt > TERN_UNDEFINED && dt <= TERN_BFLOAT16 &&
	        dt != TERN_COMPLEX64 && dt != TERN_COMPLEX128;
}

/* The value of a scalar (or one-element) input known while planning; false when it is not known yet. */
static tern_status scalar_input(tern_prepare_args *p, int i, const char *name, bool *known, double *v)
{
	const tern_tensor *t = i < p->n_in ? p->in[i] : NULL;
	*known = false;
	if (!t)
		return TERN_OK;
	if (tern_tensor_numel(t) != 1)
		return tern_node_errorf(p->node, TERN_EDATA, "input %d '%s' must hold one value, not %lld", i, name,
		                        (long long)tern_tensor_numel(t));
	if (t->data) {
		*known = true;
		*v = tern_tensor_get_f64(t, 0);
	}
	return TERN_OK;
}

static tern_status out_of_memory(void)
{
	return tern_errorf(TERN_EOS, "out of memory");
}

/* The position of a string attribute's value in the NULL-terminated list of choices. */
static tern_status attr_choice(const tern_node *node, const char *name, const char *dflt, const char *const *choices,
                               int *out)
{
	const char *v = tern_attr_string(node, name, dflt);
	char list[128] = "";
	for (int i = 0; choices[i]; i++) {
		if (strcmp(v, choices[i]) == 0) {
			*out = i;
			return TERN_OK;
		}
		snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", choices[i]);
	}
	return tern_node_errorf(node, TERN_EDATA, "attribute '%s' is '%s', not one of %s", name, v, list);
}

/* ---------------------------------------------------------------- random generators */

/* SplitMix64: a counter through a strong mixer. Each node keeps its own stream, seeded from the
 * `seed` attribute or else from its output's name, so a run is reproducible. */
static uint64_t rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_uniform(uint64_t *state)
{
	return (double)(rng_next(state) >> 11) * 0x1.0p-53;
}

static double rng_normal(uint64_t *state)
{
	double u1 = 1.0 - rng_uniform(state), u2 = rng_uniform(state); /* u1 in (0, 1] */
	return sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2);
}

enum rand_kind { RAND_UNIFORM, RAND_NORMAL, RAND_BERNOULLI, RAND_MULTINOMIAL };

typedef struct rand_params {
	enum rand_kind kind;
	uint64_t state;
	double a, b; /* low and high, or mean and scale */
	int64_t sample_size;
} rand_params;

static tern_status rand_kernel(const tern_kernel_args *a)
{
	rand_params *p = a->params;
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(y);
	switch (p->kind) {
	case RAND_UNIFORM:
		for (int64_t i = 0; i < n; i++)
			tern_store_f64(y->dtype, y->data, i, p->a + (p->b - p->a) * rng_uniform(&p->state));
		break;
	case RAND_NORMAL:
		for (int64_t i = 0; i < n; i++)
			tern_store_f64(y->dtype, y->data, i, p->a + p->b * rng_normal(&p->state));
		break;
	case RAND_BERNOULLI:
		for (int64_t i = 0; i < n; i++)
			tern_store_f64(y->dtype, y->data, i, rng_uniform(&p->state) < tern_tensor_get_f64(a->in[0], i));
		break;
	case RAND_MULTINOMIAL: {
		/* Inputs are unnormalised log-probabilities per batch row; sampling inverts the running sum. */
		const tern_tensor *x = a->in[0];
		int64_t classes = x->dims[1];
		double *cdf = a->scratch;
		for (int64_t b = 0; b < x->dims[0]; b++) {
			double top = -INFINITY, total = 0;
			for (int64_t c = 0; c < classes; c++)
				top = fmax(top, tern_tensor_get_f64(x, b * classes + c));
			for (int64_t c = 0; c < classes; c++)
				cdf[c] = total += exp(tern_tensor_get_f64(x, b * classes + c) - top);
			for (int64_t s = 0; s < p->sample_size; s++) {
				double u = rng_uniform(&p->state) * total;
				int64_t lo = 0, hi = classes - 1;
				while (lo < hi) {
					int64_t mid = (lo + hi) / 2;
					if (cdf[mid] > u)
						hi = mid;
					else
						lo = mid + 1;
				}
				tern_store_f64(y->dtype, y->data, b * p->sample_size + s, (double)lo);
			}
		}
		break;
	}
	}
	return TERN_OK;
}

static uint64_t seed_of(const tern_node *node)
{
	if (tern_attr(node, "seed")) {
		double seed = tern_attr_float(node, "seed", 0);
		uint64_t bits;
		memcpy(&bits, &seed, sizeof bits);
		return bits;
	}
	/* FNV-1a of the first output's name. */
	uint64_t h = 0xcbf29ce484222325u;
	const char *name = node->n_outputs && node->outputs[0] ? node->outputs[0]->name : node->name;
	for (const char *c = name; c && *c; c++)
		h = (h ^ (unsigned char)*c) * 0x100000001b3u;
	return h;
}

static tern_status rand_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const char *op = node->op_type;
	bool like = strstr(op, "Like") != NULL;
	rand_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return out_of_memory();
	p->params = rp;
	p->free_params = free;
	rp->state = seed_of(node);
	rp->kind = strncmp(op, "RandomUniform", 13) == 0 ? RAND_UNIFORM
	        : strncmp(op, "RandomNormal", 12) == 0   ? RAND_NORMAL
	        : strcmp(op, "Bernoulli") == 0           ? RAND_BERNOULLI
	                                                 : RAND_MULTINOMIAL;
	bool uniform = rp->kind == RAND_UNIFORM;
	rp->a = tern_attr_float(node, uniform ? "low" : "mean", 0);
	rp->b = tern_attr_float(node, uniform ? "high" : "scale", 1);
	const tern_tensor *x = p->n_in ? p->in[0] : NULL;
	int dflt = x ? x->dtype : TERN_FLOAT;
	if (rp->kind == RAND_MULTINOMIAL)
		dflt = TERN_INT32;
	int dtype = (int)tern_attr_int(node, "dtype", dflt);
	if (!is_numeric_dtype(dtype) && !(rp->kind == RAND_BERNOULLI && dtype == TERN_BOOL))
		return tern_node_errorf(node, TERN_EDATA, "attribute 'dtype' is %d (%s), not a numeric type", dtype,
		                        tern_dtype_name(dtype));
	if (rp->kind == RAND_MULTINOMIAL) {
		if (!x || x->rank != 2)
			return tern_node_errorf(node, TERN_EDATA,
			                        "input 0 must be [batch_size, class_size], not rank %d",
			                        x ? x->rank : -1);
		if (dtype != TERN_INT32 && dtype != TERN_INT64)
			return tern_node_errorf(node, TERN_EDATA, "attribute 'dtype' is %s, not int32 or int64",
			                        tern_dtype_name(dtype));
		rp->sample_size = tern_attr_int(node, "sample_size", 1);
		if (rp->sample_size < 0 || x->dims[1] < 1)
			return tern_node_errorf(node, TERN_EDATA, "sample_size %lld from %lld classes is not possible",
			                        (long long)rp->sample_size, (long long)x->dims[1]);
		int64_t dims[2] = {x->dims[0], rp->sample_size};
		tern_set_shape(p->out[0], dtype, 2, dims);
		p->scratch_bytes = (size_t)x->dims[1] * sizeof(double);
	} else if (like || rp->kind == RAND_BERNOULLI) {
		if (!x)
			return tern_node_errorf(node, TERN_EDATA, "input 0 is required");
		tern_set_shape(p->out[0], dtype, x->rank, x->dims);
	} else {
		size_t rank;
		const int64_t *shape = tern_attr_ints(node, "shape", &rank);
		if (!tern_attr(node, "shape") || rank > TERN_MAX_RANK)
			return tern_node_errorf(node, TERN_EDATA,
			                        "attribute 'shape' is missing or has more than %d dimensions",
			                        TERN_MAX_RANK);
		for (size_t i = 0; i < rank; i++)
			if (shape[i] < 0)
				return tern_node_errorf(node, TERN_EDATA,
				                        "attribute 'shape' has negative dimension %lld",
				                        (long long)shape[i]);
		tern_set_shape(p->out[0], dtype, (int)rank, shape);
	}
	p->kernel = rand_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- NonMaxSuppression */

typedef struct scored_box {
	double score;
	int64_t idx;
} scored_box;

/* Higher scores first; equal scores keep the lower box index first. */
static int by_score(const void *a, const void *b)
{
	const scored_box *x = a, *y = b;
	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Corners (y1, x1, y2, x2) of box i, ordered min then max. */
static void box_corners(const tern_tensor *boxes, int64_t i, bool center, double c[4])
{
	double v[4];
	for (int k = 0; k < 4; k++)
		v[k] = tern_tensor_get_f64(boxes, i * 4 + k);
	if (center) { /* (x_center, y_center, width, height) */
		c[0] = v[1] - v[3] / 2;
		c[2] = v[1] + v[3] / 2;
		c[1] = v[0] - v[2] / 2;
		c[3] = v[0] + v[2] / 2;
		return;
	}
	c[0] = fmin(v[0], v[2]);
	c[2] = fmax(v[0], v[2]);
	c[1] = fmin(v[1], v[3]);
	c[3] = fmax(v[1], v[3]);
}

static bool suppresses(const double a[4], const double b[4], double iou_threshold)
{
	double ih = fmin(a[2], b[2]) - fmax(a[0], b[0]), iw = fmin(a[3], b[3]) - fmax(a[1], b[1]);
	if (ih <= 0 || iw <= 0)
		return false;
	double inter = ih * iw, area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
	double uni = area_a + area_b - inter;
	if (area_a <= 0 || area_b <= 0 || uni <= 0)
		return false;
	return inter / uni > iou_threshold;
}

static tern_status nms_kernel(const tern_kernel_args *a)
{
	const tern_tensor *boxes = a->in[0], *scores = a->in[1];
	const tern_tensor *max_t = a->n_in > 2 ? a->in[2] : NULL, *iou_t = a->n_in > 3 ? a->in[3] : NULL;
	const tern_tensor *score_t = a->n_in > 4 ? a->in[4] : NULL;
	bool center = tern_attr_int(a->node, "center_point_box", 0) != 0;
	int64_t max_out = max_t && tern_tensor_numel(max_t) ? tern_tensor_get_i64(max_t, 0) : 0;
	double iou = iou_t && tern_tensor_numel(iou_t) ? tern_tensor_get_f64(iou_t, 0) : 0;
	bool use_score = score_t && tern_tensor_numel(score_t);
	double min_score = use_score ? tern_tensor_get_f64(score_t, 0) : 0;
	int64_t batches = boxes->dims[0], n_boxes = boxes->dims[1], classes = scores->dims[1];
	if (iou < 0 || iou > 1)
		return tern_node_errorf(a->node, TERN_EDATA, "input 3 'iou_threshold' is %g, outside [0, 1]", iou);
	if (max_out > n_boxes)
		max_out = n_boxes;
	/* Scratch: the candidates of one class, the corners of the kept ones, and every selected triple. */
	scored_box *cand = a->scratch;
	double(*kept)[4] = (double(*)[4])(cand + n_boxes);
	int64_t *sel = (int64_t *)(kept + n_boxes), n_sel = 0;
	for (int64_t b = 0; b < batches; b++)
		for (int64_t c = 0; c < classes && max_out > 0; c++) {
			int64_t n_cand = 0, n_kept = 0;
			for (int64_t i = 0; i < n_boxes; i++) {
				double s = tern_tensor_get_f64(scores, (b * classes + c) * n_boxes + i);
				if (!use_score || s > min_score)
					cand[n_cand++] = (scored_box){s, i};
			}
			qsort(cand, (size_t)n_cand, sizeof *cand, by_score);
			for (int64_t k = 0; k < n_cand && n_kept < max_out; k++) {
				double box[4];
				box_corners(boxes, b * n_boxes + cand[k].idx, center, box);
				bool keep = true;
				for (int64_t j = 0; j < n_kept && keep; j++)
					keep = !suppresses(box, kept[j], iou);
				if (!keep)
					continue;
				memcpy(kept[n_kept++], box, sizeof box);
				sel[3 * n_sel] = b;
				sel[3 * n_sel + 1] = c;
				sel[3 * n_sel + 2] = cand[k].idx;
				n_sel++;
			}
		}
	int64_t dims[2] = {n_sel, 3};
	tern_status st = tern_tensor_alloc(a->out[0], TERN_INT64, 2, dims);
	if (st)
		return st;
	if (n_sel)
		memcpy(a->out[0]->data, sel, (size_t)n_sel * 3 * sizeof(int64_t));
	return TERN_OK;
}

static tern_status nms_prepare(tern_prepare_args *p)
{
	const tern_tensor *boxes = p->in[0], *scores = p->n_in > 1 ? p->in[1] : NULL;
	if (!scores || boxes->rank != 3 || boxes->dims[2] != 4 || scores->rank != 3 ||
	    scores->dims[0] != boxes->dims[0] || scores->dims[2] != boxes->dims[1]) {
		char b[96], s[96];
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "boxes %s and scores %s must be [batch, boxes, 4] and [batch, classes, boxes]",
		                        tern_shape_str(boxes->dtype, boxes->rank, boxes->dims, b, sizeof b),
		                        scores ? tern_shape_str(scores->dtype, scores->rank, scores->dims, s, sizeof s)
		                               : "missing");
	}
	int64_t n = boxes->dims[1];
	p->scratch_bytes = (size_t)n * (sizeof(scored_box) + 4 * sizeof(double)) +
	        (size_t)(boxes->dims[0] * scores->dims[1] * n) * 3 * sizeof(int64_t);
	p->dynamic_output = 1;
	int64_t dims[2] = {-1, 3};
	tern_set_shape(p->out[0], TERN_INT64, 2, dims);
	p->kernel = nms_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- RoiAlign */

typedef struct roi_params {
	int64_t out_h, out_w, sampling_ratio;
	double spatial_scale;
	bool max_mode, half_pixel;
	bool grad; /* tern.RoiAlignGrad(dY, X, rois, batch_indices) -> dX */
} roi_params;

/* The backward's per-channel record of the largest weighted corner (max mode): value, position, weight. */
typedef struct roi_best {
	double v, w;
	int64_t pos;
} roi_best;

/* One bilinear sample: four positions in the H x W plane and their weights (all zero outside). */
typedef struct roi_sample {
	int64_t pos[4];
	double w[4];
} roi_sample;

static double rnd(bool single, double v)
{
	return single ? (double)(float)v : v;
}

static roi_sample roi_sample_at(double y, double x, int64_t height, int64_t width)
{
	roi_sample s = {{0, 0, 0, 0}, {0, 0, 0, 0}};
	if (y < -1.0 || y > (double)height || x < -1.0 || x > (double)width)
		return s;
	y = fmax(y, 0);
	x = fmax(x, 0);
	int64_t y_lo = (int64_t)y, x_lo = (int64_t)x, y_hi, x_hi;
	if (y_lo >= height - 1) {
		y_hi = y_lo = height - 1;
		y = (double)y_lo;
	} else {
		y_hi = y_lo + 1;
	}
	if (x_lo >= width - 1) {
		x_hi = x_lo = width - 1;
		x = (double)x_lo;
	} else {
		x_hi = x_lo + 1;
	}
	double ly = y - (double)y_lo, lx = x - (double)x_lo, hy = 1 - ly, hx = 1 - lx;
	s = (roi_sample){{y_lo * width + x_lo, y_lo * width + x_hi, y_hi * width + x_lo, y_hi * width + x_hi},
	                 {hy * hx, hy * lx, ly * hx, ly * lx}};
	return s;
}

/* RoiAlign, and (p->grad) its backward: every sample's bilinear weights scatter dY / count into dX
 * (avg), or dY into the corner the forward's maximum came from (max, the first of ties). */
static tern_status roi_kernel(const tern_kernel_args *a)
{
	const roi_params *p = a->params;
	const tern_tensor *dy = p->grad ? a->in[0] : NULL;
	const tern_tensor *x = a->in[p->grad], *rois = a->in[p->grad + 1], *idx = a->in[p->grad + 2];
	tern_tensor *y = a->out[0];
	if (p->grad)
		memset(y->data, 0, (size_t)tern_tensor_numel(y) * tern_dtype_size(y->dtype));
	int64_t channels = x->dims[1], height = x->dims[2], width = x->dims[3], plane = height * width;
	int64_t n_rois = rois->dims[0], oh = p->out_h, ow = p->out_w;
	double offset = p->half_pixel ? 0.5 : 0;
	for (int64_t r = 0; r < n_rois; r++) {
		int64_t batch = tern_tensor_get_i64(idx, r);
		if (batch < 0 || batch >= x->dims[0])
			return tern_node_errorf(a->node, TERN_EDATA,
			                        "input 2 'batch_indices' element %lld is %lld, outside [0, %lld)",
			                        (long long)r, (long long)batch, (long long)x->dims[0]);
		/* The geometry is rounded to the element type at each step, as the reference computes it, so
		 * that sample counts (a ceiling) agree. */
		bool single = x->dtype != TERN_DOUBLE;
		double start_w = rnd(single, rnd(single, tern_tensor_get_f64(rois, r * 4) * p->spatial_scale) - offset);
		double start_h =
		        rnd(single, rnd(single, tern_tensor_get_f64(rois, r * 4 + 1) * p->spatial_scale) - offset);
		double end_w =
		        rnd(single, rnd(single, tern_tensor_get_f64(rois, r * 4 + 2) * p->spatial_scale) - offset);
		double end_h =
		        rnd(single, rnd(single, tern_tensor_get_f64(rois, r * 4 + 3) * p->spatial_scale) - offset);
		double roi_w = rnd(single, end_w - start_w), roi_h = rnd(single, end_h - start_h);
		if (!p->half_pixel) {
			roi_w = fmax(roi_w, 1.0);
			roi_h = fmax(roi_h, 1.0);
		}
		double bin_h = rnd(single, roi_h / (double)oh), bin_w = rnd(single, roi_w / (double)ow);
		int64_t grid_h = p->sampling_ratio > 0 ? p->sampling_ratio : (int64_t)ceil(roi_h / (double)oh);
		int64_t grid_w = p->sampling_ratio > 0 ? p->sampling_ratio : (int64_t)ceil(roi_w / (double)ow);
		double count = (double)(grid_h * grid_w > 1 ? grid_h * grid_w : 1);
		const int64_t base_in = batch * channels * plane, base_out = r * channels * oh * ow;
		for (int64_t ph = 0; ph < oh; ph++)
			for (int64_t pw = 0; pw < ow; pw++) {
				double *acc = a->scratch; /* one per channel */
				roi_best *best = (roi_best *)(acc + channels);
				for (int64_t iy = 0; iy < grid_h; iy++)
					for (int64_t ix = 0; ix < grid_w; ix++) {
						double yy = rnd(single,
						                rnd(single, start_h + rnd(single, (double)ph * bin_h)) +
						                        rnd(single,
						                            rnd(single, ((double)iy + 0.5) * bin_h) /
						                                    (double)grid_h));
						double xx = rnd(single,
						                rnd(single, start_w + rnd(single, (double)pw * bin_w)) +
						                        rnd(single,
						                            rnd(single, ((double)ix + 0.5) * bin_w) /
						                                    (double)grid_w));
						roi_sample s = roi_sample_at(yy, xx, height, width);
						bool first = iy == 0 && ix == 0;
						for (int64_t c = 0; c < channels; c++) {
							int64_t in = base_in + c * plane;
							double v[4];
							for (int k = 0; k < 4; k++)
								v[k] = s.w[k] * tern_tensor_get_f64(x, in + s.pos[k]);
							if (dy && !p->max_mode) {
								double gv = tern_tensor_get_f64(dy, base_out + (c * oh + ph) * ow + pw) / count;
								for (int k = 0; k < 4; k++)
									if (s.w[k] != 0)
										tern_store_f64(y->dtype, y->data, in + s.pos[k],
										               tern_tensor_get_f64(y, in + s.pos[k]) + s.w[k] * gv);
								continue;
							}
							/* Max mode keeps the largest weighted corner, as the reference does. */
							if (p->max_mode) {
								int km = 0;
								for (int k = 1; k < 4; k++)
									km = v[k] > v[km] ? k : km;
								double m = v[km];
								if (dy && (first || m > best[c].v))
									best[c] = (roi_best){m, s.w[km], in + s.pos[km]};
								acc[c] = first ? m : fmax(acc[c], m);
							} else {
								acc[c] = (first ? 0 : acc[c]) +
								        (v[0] + v[1] + v[2] + v[3]) / count;
							}
						}
					}
				if (dy) {
					for (int64_t c = 0; p->max_mode && grid_h * grid_w > 0 && c < channels; c++)
						if (best[c].w != 0)
							tern_store_f64(y->dtype, y->data, best[c].pos,
							               tern_tensor_get_f64(y, best[c].pos) +
							                       best[c].w * tern_tensor_get_f64(dy, base_out + (c * oh + ph) * ow + pw));
					continue;
				}
				for (int64_t c = 0; c < channels; c++)
					tern_store_f64(y->dtype, y->data, base_out + (c * oh + ph) * ow + pw,
					               grid_h * grid_w > 0 ? acc[c] : 0);
			}
	}
	return TERN_OK;
}

static tern_status roi_setup(tern_prepare_args *p, int first, roi_params **out)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[first], *rois = p->n_in > first + 1 ? p->in[first + 1] : NULL,
	                  *idx = p->n_in > first + 2 ? p->in[first + 2] : NULL;
	if (!rois || !idx || x->rank != 4 || rois->rank != 2 || rois->dims[1] != 4 || idx->rank != 1 ||
	    idx->dims[0] != rois->dims[0])
		return tern_node_errorf(
		        node, TERN_EDATA,
		        "inputs must be X [N, C, H, W], rois [num_rois, 4] and batch_indices [num_rois]");
	if (!is_float_dtype(x->dtype))
		return tern_node_errorf(node, TERN_EDATA, "input 0 'X' has unsupported type %s",
		                        tern_dtype_name(x->dtype));
	roi_params *rp = calloc(1, sizeof *rp);
	if (!rp)
		return out_of_memory();
	p->params = rp;
	p->free_params = free;
	rp->out_h = tern_attr_int(node, "output_height", 1);
	rp->out_w = tern_attr_int(node, "output_width", 1);
	rp->sampling_ratio = tern_attr_int(node, "sampling_ratio", 0);
	rp->spatial_scale = tern_attr_float(node, "spatial_scale", 1.0f);
	static const char *const modes[] = {"avg", "max", NULL},
	                         *const ctms[] = {"output_half_pixel", "half_pixel", NULL};
	int mode, ctm;
	tern_status st;
	if ((st = attr_choice(node, "mode", "avg", modes, &mode)) ||
	    (st = attr_choice(node, "coordinate_transformation_mode", ctms[node->opset >= 16], ctms, &ctm)))
		return st;
	if (rp->out_h < 1 || rp->out_w < 1 || rp->sampling_ratio < 0)
		return tern_node_errorf(node, TERN_EDATA, "output %lldx%lld with sampling_ratio %lld is not possible",
		                        (long long)rp->out_h, (long long)rp->out_w, (long long)rp->sampling_ratio);
	rp->max_mode = mode == 1;
	rp->half_pixel = ctm == 1;
	p->scratch_bytes = (size_t)x->dims[1] * (sizeof(double) + sizeof(roi_best));
	p->kernel = roi_kernel;
	*out = rp;
	return TERN_OK;
}

static tern_status roi_prepare(tern_prepare_args *p)
{
	roi_params *rp = NULL;
	tern_status st = roi_setup(p, 0, &rp);
	if (st)
		return st;
	const tern_tensor *x = p->in[0];
	int64_t dims[4] = {p->in[1]->dims[0], x->dims[1], rp->out_h, rp->out_w};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	return TERN_OK;
}

/* tern.RoiAlignGrad(dY, X, rois, batch_indices) with RoiAlign's attributes: dX, of X's shape. */
static tern_status roi_grad_prepare(tern_prepare_args *p)
{
	roi_params *rp = NULL;
	tern_status st = p->n_in < 4 ? tern_node_errorf(p->node, TERN_EDATA, "needs dY, X, rois and batch_indices")
	                             : roi_setup(p, 1, &rp);
	if (st)
		return st;
	const tern_tensor *dy = p->in[0], *x = p->in[1];
	int64_t want[4] = {p->in[2]->dims[0], x->dims[1], rp->out_h, rp->out_w};
	if (dy->dtype != x->dtype || dy->rank != 4 || memcmp(dy->dims, want, sizeof want))
		return tern_node_errorf(p->node, TERN_EDATA, "dY must be %s [%lld,%lld,%lld,%lld], RoiAlign's output",
		                        tern_dtype_name(x->dtype), (long long)want[0], (long long)want[1],
		                        (long long)want[2], (long long)want[3]);
	rp->grad = true;
	tern_set_shape(p->out[0], x->dtype, 4, x->dims);
	return TERN_OK;
}

/* RoiAlign: X's gradient (tern.RoiAlignGrad); the boxes and indices have none, as in torchvision. */
static tern_status roi_grad(tern_grad_ctx *g)
{
	if (!g->wants[0])
		return TERN_OK;
	tern_gval *in[4] = {g->dy[0], g->x[0], g->x[1], g->x[2]};
	/* the coordinate mode's default depends on the forward's opset: made explicit for the backward */
	const char *ctm = tern_attr_string(g->node, "coordinate_transformation_mode",
	                                   g->node->opset >= 16 ? "half_pixel" : "output_half_pixel");
	tern_gattr at[1] = {TERN_GA_S("coordinate_transformation_mode", ctm)};
	g->dx[0] = tern_g_op_like(g, "tern", "RoiAlignGrad", in, 4, at, 1);
	return g->dx[0] ? TERN_OK : tern_g_status(g);
}

/* ---------------------------------------------------------------- GridSample */

enum grid_mode { GRID_LINEAR, GRID_NEAREST, GRID_CUBIC };
enum grid_pad { PAD_ZEROS, PAD_BORDER, PAD_REFLECTION };

typedef struct grid_params {
	enum grid_mode mode;
	enum grid_pad pad;
	bool align_corners;
} grid_params;

/* Reflects x into [lo, hi] by its nearer border, as often as needed. */
static double grid_reflect(double x, double lo, double hi)
{
	double range = hi - lo;
	if (x >= lo && x <= hi)
		return x;
	double d = x < lo ? lo - x : x - hi;
	double n = floor(d / range), r = d - n * range;
	bool even = fmod(n, 2) == 0;
	if (x < lo)
		return even ? lo + r : hi - r;
	return even ? hi - r : lo + r;
}

/* The element offset of pixel (r, c) under the padding mode, or -1 for a zero. */
static int64_t grid_pixel(const grid_params *p, int64_t r, int64_t c, int64_t h, int64_t w, const double border[4])
{
	switch (p->pad) {
	case PAD_ZEROS: return r >= 0 && r < h && c >= 0 && c < w ? r * w + c : -1;
	case PAD_BORDER:
		r = r < 0 ? 0 : r >= h ? h - 1 : r;
		c = c < 0 ? 0 : c >= w ? w - 1 : c;
		return r * w + c;
	case PAD_REFLECTION:
		c = (int64_t)grid_reflect((double)c, border[0], border[2]);
		r = (int64_t)grid_reflect((double)r, border[1], border[3]);
		return r * w + c;
	}
	return -1;
}

/* Keys' cubic convolution weights (A = -0.75) for a point t in [0, 1) past the second tap. */
static void cubic_weights(double t, double w[4])
{
	const double A = -0.75;
	double x = t + 1;
	w[0] = ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
	w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
	x = 1 - t;
	w[2] = ((A + 2) * x - (A + 3)) * x * x + 1;
	x = 2 - t;
	w[3] = ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
}

static tern_status grid_kernel(const tern_kernel_args *a)
{
	const grid_params *p = a->params;
	const tern_tensor *x = a->in[0], *grid = a->in[1];
	tern_tensor *y = a->out[0];
	int64_t n_batch = x->dims[0], channels = x->dims[1], h = x->dims[2], w = x->dims[3];
	int64_t oh = grid->dims[1], ow = grid->dims[2];
	double border[4] = {-0.5, -0.5, (double)w - 0.5, (double)h - 0.5};
	if (p->align_corners) {
		border[0] = border[1] = 0;
		border[2] = (double)w - 1;
		border[3] = (double)h - 1;
	}
	for (int64_t n = 0; n < n_batch; n++)
		for (int64_t o = 0; o < oh * ow; o++) {
			double gx = tern_tensor_get_f64(grid, (n * oh * ow + o) * 2),
			       gy = tern_tensor_get_f64(grid, (n * oh * ow + o) * 2 + 1);
			double fx = p->align_corners ? (gx + 1) / 2 * (double)(w - 1) : ((gx + 1) * (double)w - 1) / 2;
			double fy = p->align_corners ? (gy + 1) / 2 * (double)(h - 1) : ((gy + 1) * (double)h - 1) / 2;
			if (p->mode == GRID_NEAREST) {
				fx = nearbyint(fx);
				fy = nearbyint(fy);
			}
			if (fx < border[0] || fx > border[2] || fy < border[1] || fy > border[3]) {
				if (p->pad == PAD_BORDER) {
					fx = fmin(fmax(fx, 0), (double)(w - 1));
					fy = fmin(fmax(fy, 0), (double)(h - 1));
				} else if (p->pad == PAD_REFLECTION) {
					fx = grid_reflect(fx, border[0], border[2]);
					fy = grid_reflect(fy, border[1], border[3]);
				}
			}
			/* Up to 16 taps: offsets in the H x W plane (-1 reads zero) and weights. */
			int64_t pos[16];
			double wt[16];
			int taps = 0;
			if (p->mode == GRID_NEAREST) {
				pos[0] = grid_pixel(p, (int64_t)fy, (int64_t)fx, h, w, border);
				wt[taps++] = 1;
			} else {
				int64_t x0 = (int64_t)floor(fx), y0 = (int64_t)floor(fy),
				        k = p->mode == GRID_CUBIC ? 4 : 2;
				double cx[4], cy[4];
				if (k == 4) {
					cubic_weights(fx - (double)x0, cx);
					cubic_weights(fy - (double)y0, cy);
					x0--;
					y0--;
				} else {
					cx[1] = fx - (double)x0;
					cx[0] = 1 - cx[1];
					cy[1] = fy - (double)y0;
					cy[0] = 1 - cy[1];
				}
				for (int64_t i = 0; i < k; i++)
					for (int64_t j = 0; j < k; j++) {
						pos[taps] = grid_pixel(p, y0 + i, x0 + j, h, w, border);
						wt[taps++] = cy[i] * cx[j];
					}
			}
			for (int64_t c = 0; c < channels; c++) {
				int64_t plane = (n * channels + c) * h * w;
				double v = 0;
				for (int t = 0; t < taps; t++)
					if (pos[t] >= 0)
						v += wt[t] * tern_tensor_get_f64(x, plane + pos[t]);
				tern_store_f64(y->dtype, y->data, (n * channels + c) * oh * ow + o, v);
			}
		}
	return TERN_OK;
}

static tern_status grid_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *grid = p->n_in > 1 ? p->in[1] : NULL;
	if (!grid || x->rank != 4 || grid->rank != 4 || grid->dims[0] != x->dims[0] || grid->dims[3] != 2)
		return tern_node_errorf(
		        node, TERN_EDATA,
		        "inputs must be X [N, C, H, W] and grid [N, H_out, W_out, 2] (only 2-D sampling is supported)");
	if (!is_float_dtype(x->dtype) || !is_float_dtype(grid->dtype))
		return tern_node_errorf(node, TERN_EDATA, "inputs have unsupported types %s and %s",
		                        tern_dtype_name(x->dtype), tern_dtype_name(grid->dtype));
	grid_params *gp = calloc(1, sizeof *gp);
	if (!gp)
		return out_of_memory();
	p->params = gp;
	p->free_params = free;
	/* Opset 20 renamed bilinear and bicubic to linear and cubic. */
	static const char *const modes[] = {"bilinear", "linear", "bicubic", "cubic", "nearest", NULL};
	static const char *const pads[] = {"zeros", "border", "reflection", NULL};
	static const enum grid_mode mode_of[] = {GRID_LINEAR, GRID_LINEAR, GRID_CUBIC, GRID_CUBIC, GRID_NEAREST};
	int mode, pad;
	tern_status st;
	if ((st = attr_choice(node, "mode", modes[node->opset >= 20], modes, &mode)) ||
	    (st = attr_choice(node, "padding_mode", "zeros", pads, &pad)))
		return st;
	gp->mode = mode_of[mode];
	gp->pad = (enum grid_pad)pad;
	gp->align_corners = tern_attr_int(node, "align_corners", 0) != 0;
	int64_t dims[4] = {x->dims[0], x->dims[1], grid->dims[1], grid->dims[2]};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	p->kernel = grid_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- DFT, STFT */

/* Fourier transform of n complex values (re, im interleaved) in place, unscaled; the inverse
 * conjugates the twiddles. Radix-2 when n is a power of two, direct summation otherwise. tw and tmp
 * hold 2n doubles each. */
static void dft_line(double *v, int64_t n, bool inverse, double *tw, double *tmp)
{
	double sign = inverse ? 1 : -1;
	for (int64_t k = 0; k < n; k++) {
		tw[2 * k] = cos(2 * PI * (double)k / (double)n);
		tw[2 * k + 1] = sign * sin(2 * PI * (double)k / (double)n);
	}
	if (n > 1 && (n & (n - 1)) == 0) {
		for (int64_t i = 1, j = 0; i < n; i++) {
			int64_t bit = n >> 1;
			for (; j & bit; bit >>= 1)
				j ^= bit;
			j ^= bit;
			if (i < j)
				for (int q = 0; q < 2; q++) {
					double t = v[2 * i + q];
					v[2 * i + q] = v[2 * j + q];
					v[2 * j + q] = t;
				}
		}
		for (int64_t len = 2; len <= n; len <<= 1)
			for (int64_t s = 0; s < n; s += len)
				for (int64_t k = 0; k < len / 2; k++) {
					double wr = tw[2 * (k * (n / len))], wi = tw[2 * (k * (n / len)) + 1];
					double *a = v + 2 * (s + k), *b = v + 2 * (s + k + len / 2);
					double br = b[0] * wr - b[1] * wi, bi = b[0] * wi + b[1] * wr;
					b[0] = a[0] - br;
					b[1] = a[1] - bi;
					a[0] += br;
					a[1] += bi;
				}
		return;
	}
	memcpy(tmp, v, (size_t)n * 2 * sizeof(double));
	for (int64_t k = 0; k < n; k++) {
		double re = 0, im = 0;
		for (int64_t j = 0, t = 0; j < n; j++, t = (t + k) % n) {
			re += tmp[2 * j] * tw[2 * t] - tmp[2 * j + 1] * tw[2 * t + 1];
			im += tmp[2 * j] * tw[2 * t + 1] + tmp[2 * j + 1] * tw[2 * t];
		}
		v[2 * k] = re;
		v[2 * k + 1] = im;
	}
}

/* A signal axis seen as [outer, n_in, inner, complex] and transformed at length `length`; the first
 * n_out bins are kept. STFT frames the signal first. */
typedef struct dft_params {
	int64_t outer, n_in, inner, length, n_out;
	int complex_in; /* 1 for real input, 2 for complex */
	bool inverse;
	int64_t frame_step, frames; /* STFT */
} dft_params;

static tern_status dft_kernel(const tern_kernel_args *a)
{
	const dft_params *p = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	double *line = a->scratch, *tw = line + 2 * p->length, *tmp = tw + 2 * p->length;
	double scale = p->inverse ? 1.0 / (double)p->length : 1.0;
	for (int64_t o = 0; o < p->outer; o++)
		for (int64_t i = 0; i < p->inner; i++) {
			for (int64_t k = 0; k < p->length; k++)
				for (int q = 0; q < 2; q++) {
					int64_t at = ((o * p->n_in + k) * p->inner + i) * p->complex_in + q;
					line[2 * k + q] =
					        k < p->n_in && q < p->complex_in ? tern_tensor_get_f64(x, at) : 0;
				}
			dft_line(line, p->length, p->inverse, tw, tmp);
			for (int64_t k = 0; k < p->n_out; k++)
				for (int q = 0; q < 2; q++)
					tern_store_f64(y->dtype, y->data, ((o * p->n_out + k) * p->inner + i) * 2 + q,
					               line[2 * k + q] * scale);
		}
	return TERN_OK;
}

/* Reads an optional scalar input whose value decides the output shape; *defer when not known yet. */
static tern_status shape_scalar(tern_prepare_args *p, int i, const char *name, int64_t dflt, int64_t *v, bool *defer)
{
	bool known;
	double d;
	tern_status st = scalar_input(p, i, name, &known, &d);
	if (st)
		return st;
	if (i < p->n_in && p->in[i] && !known)
		*defer = true;
	*v = known ? (int64_t)d : dflt;
	return TERN_OK;
}

static tern_status dft_params_new(tern_prepare_args *p, dft_params **out)
{
	dft_params *dp = calloc(1, sizeof *dp);
	if (!dp)
		return out_of_memory();
	p->params = dp;
	p->free_params = free;
	*out = dp;
	return TERN_OK;
}

static tern_status dft_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	bool defer = false;
	int64_t axis, length;
	tern_status st;
	if (node->opset >= 20)
		st = shape_scalar(p, 2, "axis", -2, &axis, &defer);
	else
		axis = tern_attr_int(node, "axis", 1), st = TERN_OK;
	if (st || (st = shape_scalar(p, 1, "dft_length", 0, &length, &defer)))
		return st;
	if (defer) {
		p->defer = 1;
		return TERN_OK;
	}
	if (x->rank < 2 || (x->dims[x->rank - 1] != 1 && x->dims[x->rank - 1] != 2))
		return tern_node_errorf(node, TERN_EDATA,
		                        "input 0 must end in a dimension of 1 (real) or 2 (complex), rank %d", x->rank);
	if (!is_float_dtype(x->dtype))
		return tern_node_errorf(node, TERN_EDATA, "input 0 has unsupported type %s", tern_dtype_name(x->dtype));
	if (axis < 0)
		axis += x->rank;
	if (axis < 0 || axis >= x->rank - 1)
		return tern_node_errorf(node, TERN_EDATA, "axis %lld is not a signal axis of input 0 (rank %d)",
		                        (long long)axis, x->rank);
	dft_params *dp = NULL;
	if ((st = dft_params_new(p, &dp)))
		return st;
	dp->outer = tern_numel((int)axis, x->dims);
	dp->n_in = x->dims[axis];
	dp->inner = tern_numel(x->rank - (int)axis - 2, x->dims + axis + 1);
	dp->complex_in = (int)x->dims[x->rank - 1];
	dp->length = p->n_in > 1 && p->in[1] ? length : dp->n_in;
	dp->inverse = tern_attr_int(node, "inverse", 0) != 0;
	if (dp->length < 1)
		return tern_node_errorf(node, TERN_EDATA, "input 1 'dft_length' is %lld, not positive",
		                        (long long)dp->length);
	dp->n_out = tern_attr_int(node, "onesided", 0) ? dp->length / 2 + 1 : dp->length;
	int64_t dims[TERN_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	dims[axis] = dp->n_out;
	dims[x->rank - 1] = 2;
	tern_set_shape(p->out[0], x->dtype, x->rank, dims);
	p->scratch_bytes = (size_t)dp->length * 6 * sizeof(double);
	p->kernel = dft_kernel;
	return TERN_OK;
}

static tern_status stft_kernel(const tern_kernel_args *a)
{
	const dft_params *p = a->params;
	const tern_tensor *x = a->in[0], *window = a->n_in > 2 ? a->in[2] : NULL;
	tern_tensor *y = a->out[0];
	double *line = a->scratch, *tw = line + 2 * p->length, *tmp = tw + 2 * p->length;
	for (int64_t b = 0; b < p->outer; b++)
		for (int64_t f = 0; f < p->frames; f++) {
			for (int64_t k = 0; k < p->length; k++) {
				int64_t t = f * p->frame_step + k;
				double w = window ? tern_tensor_get_f64(window, k) : 1;
				for (int q = 0; q < 2; q++)
					line[2 * k + q] = t < p->n_in && q < p->complex_in
					        ? w * tern_tensor_get_f64(x, (b * p->n_in + t) * p->complex_in + q)
					        : 0;
			}
			dft_line(line, p->length, false, tw, tmp);
			for (int64_t k = 0; k < p->n_out; k++)
				for (int q = 0; q < 2; q++)
					tern_store_f64(y->dtype, y->data, ((b * p->frames + f) * p->n_out + k) * 2 + q,
					               line[2 * k + q]);
		}
	return TERN_OK;
}

static tern_status stft_prepare(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0], *window = p->n_in > 2 ? p->in[2] : NULL;
	bool defer = false;
	int64_t step, length;
	tern_status st;
	if ((st = shape_scalar(p, 1, "frame_step", 0, &step, &defer)) ||
	    (st = shape_scalar(p, 3, "frame_length", window ? window->dims[0] : x->dims[1], &length, &defer)))
		return st;
	if (defer) {
		p->defer = 1;
		return TERN_OK;
	}
	if (x->rank != 3 || (x->dims[2] != 1 && x->dims[2] != 2))
		return tern_node_errorf(node, TERN_EDATA,
		                        "input 0 'signal' must be [batch, length, 1 or 2], not rank %d", x->rank);
	if (!is_float_dtype(x->dtype))
		return tern_node_errorf(node, TERN_EDATA, "input 0 has unsupported type %s", tern_dtype_name(x->dtype));
	if (window && (window->rank != 1 || window->dims[0] != length))
		return tern_node_errorf(node, TERN_EDATA, "input 2 'window' must be [%lld], the frame length",
		                        (long long)length);
	if (step < 1 || length < 1 || length > x->dims[1])
		return tern_node_errorf(node, TERN_EDATA,
		                        "frame_step %lld and frame_length %lld do not fit a signal of %lld",
		                        (long long)step, (long long)length, (long long)x->dims[1]);
	dft_params *dp = NULL;
	if ((st = dft_params_new(p, &dp)))
		return st;
	dp->outer = x->dims[0];
	dp->n_in = x->dims[1];
	dp->complex_in = (int)x->dims[2];
	dp->length = length;
	dp->frame_step = step;
	dp->frames = 1 + (x->dims[1] - length) / step;
	dp->n_out = tern_attr_int(node, "onesided", 1) ? length / 2 + 1 : length;
	int64_t dims[4] = {dp->outer, dp->frames, dp->n_out, 2};
	tern_set_shape(p->out[0], x->dtype, 4, dims);
	p->scratch_bytes = (size_t)length * 6 * sizeof(double);
	p->kernel = stft_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- windows, MelWeightMatrix */

/* Cosine-sum windows: a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N). */
static const struct window_def {
	const char *op_type;
	double a0, a1, a2;
} window_defs[] = {
        {"HannWindow", 0.5, 0.5, 0},
        {"HammingWindow", 25.0 / 46.0, 21.0 / 46.0, 0},
        {"BlackmanWindow", 0.42, 0.5, 0.08},
};

static tern_status window_kernel(const tern_kernel_args *a)
{
	const struct window_def *def = a->params;
	tern_tensor *y = a->out[0];
	int64_t size = y->dims[0];
	double n = tern_attr_int(a->node, "periodic", 1) ? (double)size : (double)(size - 1);
	for (int64_t i = 0; i < size; i++) {
		double t = n > 0 ? 2 * PI * (double)i / n : 0;
		tern_store_f64(y->dtype, y->data, i, def->a0 - def->a1 * cos(t) + def->a2 * cos(2 * t));
	}
	return TERN_OK;
}

static tern_status window_prepare(tern_prepare_args *p)
{
	const struct window_def *def = NULL;
	for (size_t i = 0; i < TERN_ARRAY_LEN(window_defs); i++)
		if (strcmp(window_defs[i].op_type, p->node->op_type) == 0)
			def = &window_defs[i];
	bool defer = false;
	int64_t size;
	tern_status st = shape_scalar(p, 0, "size", 0, &size, &defer);
	if (st || !def)
		return st ? st : tern_node_errorf(p->node, TERN_EINTERNAL, "no window is registered under this name");
	if (defer) {
		p->defer = 1;
		return TERN_OK;
	}
	int dtype = (int)tern_attr_int(p->node, "output_datatype", TERN_FLOAT);
	if (!is_numeric_dtype(dtype))
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'output_datatype' is %d, not a numeric type",
		                        dtype);
	if (size < 0)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 'size' is %lld, negative", (long long)size);
	tern_set_shape(p->out[0], dtype, 1, &size);
	p->params = (void *)def;
	p->kernel = window_kernel;
	return TERN_OK;
}

static double hz_to_mel(double hz)
{
	return 2595 * log10(1 + hz / 700);
}

/* The FFT bin of mel point i (of n_mel + 2 evenly spaced between the edges). */
static int64_t mel_bin(int64_t i, int64_t n_mel, int64_t dft_length, double rate, double lo, double hi)
{
	double step = (hz_to_mel(hi) - hz_to_mel(lo)) / (double)(n_mel + 2);
	double hz = 700 * (pow(10, ((double)i * step + hz_to_mel(lo)) / 2595) - 1);
	return (int64_t)floor((double)(dft_length + 1) * hz / rate);
}

static tern_status mel_kernel(const tern_kernel_args *a)
{
	tern_tensor *y = a->out[0];
	int64_t n_spec = y->dims[0], n_mel = y->dims[1], dft_length = tern_tensor_get_i64(a->in[1], 0);
	double rate = tern_tensor_get_f64(a->in[2], 0), lo = tern_tensor_get_f64(a->in[3], 0),
	       hi = tern_tensor_get_f64(a->in[4], 0);
	for (int64_t i = 0; i < n_spec * n_mel; i++)
		tern_store_f64(y->dtype, y->data, i, 0);
	for (int64_t m = 0; m < n_mel; m++) {
		int64_t left = mel_bin(m, n_mel, dft_length, rate, lo, hi);
		int64_t center = mel_bin(m + 1, n_mel, dft_length, rate, lo, hi);
		int64_t right = mel_bin(m + 2, n_mel, dft_length, rate, lo, hi);
		/* Rising edge up to the centre, then the falling edge (which rewrites the centre as 1). */
		for (int64_t j = left; j <= center; j++)
			if (j >= 0 && j < n_spec)
				tern_store_f64(y->dtype, y->data, j * n_mel + m,
				               center == left ? 1 : (double)(j - left) / (double)(center - left));
		for (int64_t j = center; j < right; j++)
			if (j >= 0 && j < n_spec)
				tern_store_f64(y->dtype, y->data, j * n_mel + m,
				               (double)(right - j) / (double)(right - center));
	}
	return TERN_OK;
}

static tern_status mel_prepare(tern_prepare_args *p)
{
	static const char *const names[] = {"num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
	                                    "upper_edge_hertz"};
	double v[5];
	for (int i = 0; i < 5; i++) {
		bool known;
		tern_status st = scalar_input(p, i, names[i], &known, &v[i]);
		if (st)
			return st;
		if (i < p->n_in && p->in[i] && !known) {
			p->defer = 1;
			return TERN_OK;
		}
		if (i >= p->n_in || !p->in[i])
			return tern_node_errorf(p->node, TERN_EDATA, "input %d '%s' is required", i, names[i]);
	}
	int dtype = (int)tern_attr_int(p->node, "output_datatype", TERN_FLOAT);
	if (!is_numeric_dtype(dtype))
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'output_datatype' is %d, not a numeric type",
		                        dtype);
	if (v[0] < 1 || v[1] < 1 || v[2] <= 0)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "num_mel_bins %g, dft_length %g and sample_rate %g must be positive", v[0],
		                        v[1], v[2]);
	int64_t dims[2] = {(int64_t)v[1] / 2 + 1, (int64_t)v[0]};
	tern_set_shape(p->out[0], dtype, 2, dims);
	p->kernel = mel_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
        {"", "RandomUniform", 1, 0, rand_prepare, 0, "misc"},
        {"", "RandomNormal", 1, 0, rand_prepare, 0, "misc"},
        {"", "RandomUniformLike", 1, 0, rand_prepare, 0, "misc"},
        {"", "RandomNormalLike", 1, 0, rand_prepare, 0, "misc"},
        {"", "Bernoulli", 15, 0, rand_prepare, TERN_DT_FLOATS, "misc"},
        {"", "Multinomial", 7, 0, rand_prepare, TERN_DT_FLOATS, "misc"},
        {"", "NonMaxSuppression", 10, 0, nms_prepare, TERN_DT(FLOAT), "misc"},
        {"", "RoiAlign", 10, 0, roi_prepare, TERN_DT_FLOATS, "misc", roi_grad},
        {"tern", "RoiAlignGrad", 1, 0, roi_grad_prepare, TERN_DT_FLOATS, "misc"},
        {"", "GridSample", 16, 0, grid_prepare, TERN_DT_FLOATS, "misc"},
        {"", "DFT", 17, 0, dft_prepare, TERN_DT_FLOATS, "misc"},
        {"", "STFT", 17, 0, stft_prepare, TERN_DT_FLOATS, "misc"},
        {"", "HannWindow", 17, 0, window_prepare, TERN_DT(INT32) | TERN_DT(INT64), "misc"},
        {"", "HammingWindow", 17, 0, window_prepare, TERN_DT(INT32) | TERN_DT(INT64), "misc"},
        {"", "BlackmanWindow", 17, 0, window_prepare, TERN_DT(INT32) | TERN_DT(INT64), "misc"},
        {"", "MelWeightMatrix", 17, 0, mel_prepare, TERN_DT(INT32) | TERN_DT(INT64), "misc"},
};

const tern_op_table tern_ops_misc = {ops, TERN_ARRAY_LEN(ops)};
