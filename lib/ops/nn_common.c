/* nn_common.c — the shared parts of the neural-network families that are not inline helpers (nn.h
 * declares them): parallel loops over chunks of items, the float16 and bfloat16 staging around float
 * kernels, the reading of sliding-window attributes, the outer x n x inner view of an axis, and the
 * channel-block engine of the windowed operators (depthwise convolution in conv.c, max and average
 * pooling in pool.c), built once per vector width from window_blocks.h. */
#include "ops/nn.h"

/* ---------------------------------------------------------------- common helpers */

static void chunk_run(void *ctx, int64_t i)
{
	const chunked *c = ctx;
	int64_t b = i * c->per, e = b + c->per;
	if (c->slot_fn)
		c->slot_fn(c->ctx, b, e < c->n ? e : c->n, i);
	else
		c->fn(c->ctx, b, e < c->n ? e : c->n);
}

void tern_nn_parallel_chunks(tern_threadpool *pool, int64_t n, int64_t grain, int64_t max_chunks, const chunked *c0)
{
	if (n <= 0)
		return;
	int64_t chunks = slots_for(pool) < max_chunks ? slots_for(pool) : max_chunks;
	int64_t per = (n + chunks - 1) / chunks;
	if (per < grain)
		per = grain;
	chunked c = *c0;
	c.n = n;
	/* without a pool (a caller already on one of the team's threads) one chunk is all of them */
	c.per = per < n && pool ? per : n;
	if (c.per == n)
		chunk_run(&c, 0);
	else
		tern_parallel_for(pool, (n + c.per - 1) / c.per, chunk_run, &c);
}


tern_status tern_nn_axis_setup(tern_prepare_args *p, int64_t axis_default, bool coerce, axis_params **out)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	int axis = 0;
	tern_status st = check_real(node, x, 0);
	if (!st)
		st = axis_in(node, tern_attr_int(node, "axis", axis_default), x->rank, &axis);
	if (st)
		return st;
	axis_params *ap = calloc(1, sizeof *ap);
	if (!ap)
		return no_memory(node);
	p->params = ap;
	p->free_params = free;
	ap->outer = prod(x->dims, 0, axis);
	ap->n = coerce ? prod(x->dims, axis, x->rank) : (x->rank ? x->dims[axis] : 1);
	ap->inner = coerce ? 1 : prod(x->dims, axis + 1, x->rank);
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	*out = ap;
	return TERN_OK;
}

/* ---------------------------------------------------------------- float16 and bfloat16 */

#define STAGE_MAX 8

typedef struct staged {
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *);
	size_t in_off[STAGE_MAX], out_off[STAGE_MAX]; /* 0: not staged (offset 0 is the kernel's own scratch) */
} staged;

static void staged_free(void *p)
{
	staged *s = p;
	if (s && s->free_params)
		s->free_params(s->params);
	free(s);
}

static tern_status staged_kernel(const tern_kernel_args *a)
{
	const staged *s = a->params;
	tern_tensor in[STAGE_MAX], out[STAGE_MAX];
	tern_tensor *inp[STAGE_MAX], *outp[STAGE_MAX];
	char *scratch = a->scratch;
	for (int i = 0; i < a->n_in; i++) {
		inp[i] = a->in[i];
		if (!s->in_off[i] || !a->in[i])
			continue;
		in[i] = *a->in[i];
		in[i].dtype = TERN_FLOAT;
		in[i].data = scratch + s->in_off[i];
		in[i].nbytes = (size_t)tern_tensor_numel(&in[i]) * 4;
		tern_half_to_f32(a->in[i]->dtype, a->in[i]->data, in[i].data, tern_tensor_numel(&in[i]));
		inp[i] = &in[i];
	}
	for (int i = 0; i < a->n_out; i++) {
		outp[i] = a->out[i];
		if (!s->out_off[i] || !a->out[i])
			continue;
		out[i] = *a->out[i];
		out[i].dtype = TERN_FLOAT;
		out[i].data = scratch + s->out_off[i];
		out[i].nbytes = (size_t)tern_tensor_numel(&out[i]) * 4;
		outp[i] = &out[i];
	}
	tern_kernel_args inner = *a;
	inner.in = inp;
	inner.out = outp;
	inner.params = s->params;
	tern_status st = s->kernel(&inner);
	if (st)
		return st;
	for (int i = 0; i < a->n_out; i++)
		if (s->out_off[i] && a->out[i])
			tern_f32_to_half(a->out[i]->dtype, out[i].data, a->out[i]->data, tern_tensor_numel(a->out[i]));
	return TERN_OK;
}

tern_status tern_nn_stage_halves(tern_prepare_args *p)
{
	bool any = false;
	for (int i = 0; i < p->n_in; i++)
		any |= p->in[i] && is_half(p->in[i]->dtype);
	for (int i = 0; i < p->n_out; i++)
		any |= p->out[i] && is_half(p->out[i]->dtype);
	if (!any || !p->kernel)
		return TERN_OK;
	if (p->n_in > STAGE_MAX || p->n_out > STAGE_MAX)
		return tern_node_errorf(p->node, TERN_EDATA, "too many inputs or outputs for float16 staging");
	staged *s = calloc(1, sizeof *s);
	if (!s)
		return no_memory(p->node);
	s->kernel = p->kernel;
	s->params = p->params;
	s->free_params = p->free_params;
	size_t off = round_up(p->scratch_bytes ? p->scratch_bytes : 1);
	for (int i = 0; i < p->n_in; i++)
		if (p->in[i] && is_half(p->in[i]->dtype)) {
			s->in_off[i] = off;
			off += round_up((size_t)tern_tensor_numel(p->in[i]) * 4);
		}
	for (int i = 0; i < p->n_out; i++)
		if (p->out[i] && is_half(p->out[i]->dtype)) {
			s->out_off[i] = off;
			off += round_up((size_t)tern_numel(p->out[i]->rank, p->out[i]->dims) * 4);
		}
	p->kernel = staged_kernel;
	p->params = s;
	p->free_params = staged_free;
	p->scratch_bytes = off;
	return TERN_OK;
}


/* ---------------------------------------------------------------- sliding windows */

tern_status tern_nn_read_ints(const tern_node *node, const char *name, int nsp, int per, int64_t min, int64_t *dst0,
                              int64_t *dst1)
{
	size_t n;
	const int64_t *v = tern_attr_ints(node, name, &n);
	if (!v)
		return TERN_OK;
	if (n != (size_t)(nsp * per))
		return tern_node_errorf(node, TERN_EDATA, "attribute '%s' has %zu values; %d expected", name, n, nsp * per);
	for (int i = 0; i < nsp * per; i++)
		if (v[i] < min)
			return tern_node_errorf(node, TERN_EDATA, "attribute '%s' value %lld is below %lld", name,
			                        (long long)v[i], (long long)min);
	for (int i = 0; i < nsp; i++) {
		dst0[SP - nsp + i] = v[i];
		if (per == 2)
			dst1[SP - nsp + i] = v[nsp + i];
	}
	return TERN_OK;
}

tern_status tern_nn_window_read(const tern_node *node, const tern_tensor *x, const int64_t *kernel, window *w)
{
	int nsp = x->rank - 2;
	if (nsp < 1 || nsp > SP) {
		char s[128];
		return tern_node_errorf(node, TERN_EDATA, "input 0 %s: 1 to %d spatial dimensions are supported",
		                        tern_shape_str(x->dtype, x->rank, x->dims, s, sizeof s), SP);
	}
	window_init(w, nsp);
	for (int i = 0; i < nsp; i++)
		w->in[SP - nsp + i] = x->dims[2 + i];
	tern_status st = TERN_OK;
	if (kernel) {
		for (int i = 0; i < nsp; i++)
			w->k[SP - nsp + i] = kernel[i];
		size_t n;
		const int64_t *ks = tern_attr_ints(node, "kernel_shape", &n);
		for (size_t i = 0; ks && i < n; i++)
			if (n != (size_t)nsp || ks[i] != kernel[i])
				return tern_node_errorf(node, TERN_EDATA, "attribute 'kernel_shape' disagrees with the weights' shape");
	} else {
		if (!tern_attr(node, "kernel_shape"))
			return tern_node_errorf(node, TERN_EDATA, "attribute 'kernel_shape' is required");
		st = tern_nn_read_ints(node, "kernel_shape", nsp, 1, 1, w->k, NULL);
	}
	if (!st)
		st = tern_nn_read_ints(node, "strides", nsp, 1, 1, w->s, NULL);
	if (!st)
		st = tern_nn_read_ints(node, "dilations", nsp, 1, 1, w->d, NULL);
	if (!st)
		st = tern_nn_read_ints(node, "pads", nsp, 2, 0, w->pb, w->pe);
	return st;
}

tern_status tern_nn_window_forward(const tern_node *node, window *w, bool ceil_mode)
{
	const char *auto_pad = tern_attr_string(node, "auto_pad", "NOTSET");
	bool same_upper = streq(auto_pad, "SAME_UPPER"), same_lower = streq(auto_pad, "SAME_LOWER");
	bool valid = streq(auto_pad, "VALID");
	if (!same_upper && !same_lower && !valid && !streq(auto_pad, "NOTSET"))
		return bad_attr(node, "auto_pad", auto_pad);
	for (int i = SP - w->nsp; i < SP; i++) {
		int64_t dk = (w->k[i] - 1) * w->d[i] + 1;
		if (same_upper || same_lower) {
			w->out[i] = ceil_div(w->in[i], w->s[i]);
			int64_t total = (w->out[i] - 1) * w->s[i] + dk - w->in[i];
			if (total < 0)
				total = 0;
			w->pb[i] = same_upper ? total / 2 : total - total / 2;
			w->pe[i] = total - w->pb[i];
			continue;
		}
		if (valid)
			w->pb[i] = w->pe[i] = 0;
		int64_t span = w->in[i] + w->pb[i] + w->pe[i] - dk;
		w->out[i] = (span < 0 ? -1 : (ceil_mode ? ceil_div(span, w->s[i]) : span / w->s[i])) + 1;
		/* a window must start inside the input or its leading padding */
		if (ceil_mode && w->out[i] > 1 && (w->out[i] - 1) * w->s[i] >= w->in[i] + w->pb[i])
			w->out[i]--;
		if (w->out[i] < 1)
			return tern_node_errorf(node, TERN_EDATA,
			                        "spatial dimension %d: input %lld with kernel %lld, dilation %lld and pads %lld+%lld "
			                        "leaves no output",
			                        i - (SP - w->nsp), (long long)w->in[i], (long long)w->k[i], (long long)w->d[i],
			                        (long long)w->pb[i], (long long)w->pe[i]);
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- windows over blocks of channels */

#if HAVE_WB
/* Channels in a block: one vector of the path. */
static int64_t wb_lanes(void) { return tern_isa() == TERN_ISA_AVX512 ? 16 : 8; }

/* Which instance of a kind suits the window: one of the fixed shapes, else the general one (4). */
static int wb_shape(const window *w)
{
	if (w->d[1] == 1 && w->d[2] == 1 && w->k[1] == w->k[2] && w->s[1] == w->s[2] && w->s[1] <= 2 &&
	    (w->k[1] == 3 || w->k[1] == 5))
		return (w->k[1] == 5) * 2 + (w->s[1] == 2);
	return 4;
}

/* Padded input rows a band of `band` output rows reads. */
static int64_t wb_rows(const window *w, int64_t band) { return (band - 1) * w->s[1] + (w->k[1] - 1) * w->d[1] + 1; }

#define WB_BAND_FLOATS (16 * 1024) /* a band's padded input, so that it stays in the first caches */

bool tern_nn_wb_plan(const window *w, int64_t *band, int64_t *slot_elems)
{
	if (tern_isa() < TERN_ISA_AVX2 || w->k[0] != 1 || w->in[0] != 1 || w->k[1] * w->k[2] > 64)
		return false;
	int64_t wp = wb_extent(w, 2), b = w->out[1], lanes = wb_lanes();
	while (b > 1 && wb_rows(w, b) * wp * lanes > WB_BAND_FLOATS)
		b--;
	*band = b;
	*slot_elems = (wb_rows(w, b) * wp + b * w->out[2]) * lanes;
	return true;
}

#define WB_PREFETCH 64 /* floats ahead in each plane of a block */

/* AVX2 helpers of the engine's 8-channel build. */
#define WB8 TERN_TARGET_AVX2

/* Transposes 8 x 8 floats held in 8 AVX registers: r[i] lane j becomes r[j] lane i. */
WB8 static inline __attribute__((always_inline)) void tr8(__m256 r[8])
{
	__m256 t[8], u[8];
	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
	}
	for (int i = 0; i < 8; i += 4) {
		u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
		u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
		u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
		u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
	}
	for (int i = 0; i < 4; i++) {
		r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
		r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
	}
}

/* Lanes below n set: a mask for the AVX2 masked loads and stores. */
WB8 static inline __attribute__((always_inline)) __m256i lanes_below(int64_t n)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The engine, built once per vector width: window_blocks.h is written against the WB_ vocabulary. */
#define WB_LANES 16
#define WB_ATTR TERN_TARGET_AVX512
#define WB_V __m512
#define WB_MASK_T __mmask16
#define WB_MASK(n) ((__mmask16)(0xffffu >> (16 - (n))))
#define WB_LOAD _mm512_load_ps
#define WB_LOADU _mm512_loadu_ps
#define WB_STORE _mm512_store_ps
#define WB_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define WB_MSTORE(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define WB_SET1 _mm512_set1_ps
#define WB_ZERO _mm512_setzero_ps
#define WB_VFMA _mm512_fmadd_ps
#define WB_VMAX _mm512_max_ps
#define WB_VADD _mm512_add_ps
#define WB_VMUL _mm512_mul_ps
#define WB_TRANSPOSE tern_tr16
#include "ops/window_blocks.h"

#define WB_LANES 8
#define WB_ATTR TERN_TARGET_AVX2
#define WB_V __m256
#define WB_MASK_T __m256i
#define WB_MASK lanes_below
#define WB_LOAD _mm256_load_ps
#define WB_LOADU _mm256_loadu_ps
#define WB_STORE _mm256_store_ps
#define WB_MLOAD(m, p) _mm256_maskload_ps(p, m)
#define WB_MSTORE(p, m, v) _mm256_maskstore_ps(p, m, v)
#define WB_SET1 _mm256_set1_ps
#define WB_ZERO _mm256_setzero_ps
#define WB_VFMA _mm256_fmadd_ps
#define WB_VMAX _mm256_max_ps
#define WB_VADD _mm256_add_ps
#define WB_VMUL _mm256_mul_ps
#define WB_TRANSPOSE tr8
#include "ops/window_blocks.h"

void tern_nn_wb_run(tern_threadpool *pool, const wb_job *j, int64_t slots)
{
	int64_t lanes = wb_lanes(), blocks = j->n * ((j->channels + lanes - 1) / lanes);
	int64_t work = lanes * j->w->out[1] * j->w->out[2] * j->w->k[1] * j->w->k[2];
	parallel_slots(pool, blocks, grain_for(work), slots, lanes == 16 ? wb_task_16 : wb_task_8, (void *)j);
}
#else
bool tern_nn_wb_plan(const window *w, int64_t *band, int64_t *slot_elems) { return false; }
void tern_nn_wb_run(tern_threadpool *pool, const wb_job *j, int64_t slots) {}
#endif

/* ---------------------------------------------------------------- gradients */

tern_status tern_nn_g_done(tern_grad_ctx *g, uint32_t none)
{
	for (int i = 0; i < g->n_in; i++)
		if (g->wants[i] && !g->dx[i] && !tern_mask_has(none, i))
			return tern_g_status(g);
	return TERN_OK;
}

tern_gval *tern_nn_g_reduce_sum(tern_grad_ctx *g, tern_gval *v, const int64_t *axes, int n_axes, bool keepdims)
{
	if (!v)
		return NULL;
	tern_gattr keep = TERN_GA_I("keepdims", keepdims);
	if (g->node->opset >= 13) {
		tern_gval *in[2] = {v, tern_g_ints(g, axes, (size_t)n_axes)};
		return in[1] ? tern_g_op(g, "", "ReduceSum", in, 2, &keep, 1) : NULL;
	}
	tern_gattr at[2] = {TERN_GA_IS("axes", axes, (size_t)n_axes), keep};
	return tern_g_op(g, "", "ReduceSum", &v, 1, at, 2);
}

tern_gval *tern_nn_g_channel_sum(tern_grad_ctx *g, tern_gval *v)
{
	int rank = v ? tern_g_rank(g, v) : -1;
	if (rank < 2) {
		if (v)
			tern_g_fail(g, "the bias gradient needs an output of known rank");
		return NULL;
	}
	int64_t axes[TERN_MAX_RANK];
	int n = 0;
	for (int d = 0; d < rank; d++)
		if (d != 1)
			axes[n++] = d;
	return tern_nn_g_reduce_sum(g, v, axes, n, false);
}

tern_gval *tern_nn_g_shape(tern_grad_ctx *g, tern_gval *v)
{
	if (!v)
		return NULL;
	int rank;
	int64_t dims[TERN_MAX_RANK];
	tern_g_type(g, v, NULL, &rank, dims);
	bool known = rank >= 0;
	for (int d = 0; known && d < rank; d++)
		known = dims[d] >= 0;
	return known ? tern_g_ints(g, dims, (size_t)rank) : tern_g_shape(g, v);
}

tern_status tern_nn_shape_input(tern_prepare_args *p, int index, int *rank, int64_t *dims, bool *ready)
{
	const tern_tensor *s = index < p->n_in ? p->in[index] : NULL;
	*ready = false;
	if (!s || s->dtype != TERN_INT64 || s->rank != 1 || s->dims[0] > TERN_MAX_RANK)
		return tern_node_errorf(p->node, TERN_EDATA, "input %d must be a shape (int64, rank 1)", index);
	if (!s->data) {
		p->defer = 1;
		return TERN_OK;
	}
	*rank = (int)s->dims[0];
	for (int d = 0; d < *rank; d++)
		if ((dims[d] = ((const int64_t *)s->data)[d]) < 0)
			return tern_node_errorf(p->node, TERN_EDATA, "input %d: dimension %d is negative", index, d);
	*ready = true;
	return TERN_OK;
}

tern_status tern_nn_check_dy(const tern_prepare_args *p)
{
	const tern_tensor *dy = p->in[0], *y = p->out[0];
	bool same = dy->rank == y->rank;
	for (int d = 0; same && d < y->rank; d++)
		same = dy->dims[d] == y->dims[d];
	if (same)
		return TERN_OK;
	char s1[128], s2[128];
	return tern_node_errorf(p->node, TERN_EDATA, "input 0 %s (the output's gradient) does not match the output %s",
	                        tern_shape_str(dy->dtype, dy->rank, dy->dims, s1, sizeof s1),
	                        tern_shape_str(y->dtype, y->rank, y->dims, s2, sizeof s2));
}
