/* rnn_grad.h — the recurrent layers' gradient kernels (tern.RNNGrad, tern.GRUGrad, tern.LSTMGrad) for
 * one element type: included twice from rnn.c's gradient section, with RNN_GRAD_T the element type
 * (float: RNN_GRAD_F32 1) and TS(name) naming this instance's functions. No include guard, on purpose. */
#define T RNN_GRAD_T
#if RNN_GRAD_F32
#define T_EXP expf
#define T_TANH tanhf
#define T_FABS fabsf
#define T_SOFTPLUS_LINEAR 20 /* as activate's */
#else
#define T_EXP exp
#define T_TANH tanh
#define T_FABS fabs
#define T_SOFTPLUS_LINEAR SOFTPLUS_LINEAR_F64
#endif

/* x = act(clip(x)) as the forward computes it (float: activate's fast functions) */
static inline void TS(gate_act)(const activation *a, T *x, int64_t n, T clip)
{
#if RNN_GRAD_F32
	activate(a, x, n, clip);
#else
	act_f64(a, x, n, clip);
#endif
}

/* g *= act'(clip(pre)), post = act(clip(pre)): 0 where the clip cut pre off. */
static void TS(act_grad)(const activation *a, const T *restrict pre, const T *restrict post, T *restrict g, int64_t n,
                         T clip)
{
	T al = (T)a->alpha, be = (T)a->beta;
	switch (a->kind) {
	case A_TANH:
		for (int64_t j = 0; j < n; j++)
			g[j] *= 1 - post[j] * post[j];
		break;
	case A_SIGMOID:
		for (int64_t j = 0; j < n; j++)
			g[j] *= post[j] * (1 - post[j]);
		break;
	case A_RELU:
		for (int64_t j = 0; j < n; j++)
			g[j] = pre[j] > 0 ? g[j] : 0;
		break;
	case A_AFFINE:
		for (int64_t j = 0; j < n; j++)
			g[j] *= al;
		break;
	case A_LEAKYRELU:
		for (int64_t j = 0; j < n; j++)
			g[j] *= pre[j] >= 0 ? 1 : al;
		break;
	case A_THRESHOLDEDRELU:
		for (int64_t j = 0; j < n; j++)
			g[j] = pre[j] >= al ? g[j] : 0;
		break;
	case A_SCALEDTANH:
		for (int64_t j = 0; j < n; j++) {
			T th = T_TANH(be * pre[j]);
			g[j] *= al * be * (1 - th * th);
		}
		break;
	case A_HARDSIGMOID:
		for (int64_t j = 0; j < n; j++) {
			T s = al * pre[j] + be;
			g[j] = s > 0 && s < 1 ? g[j] * al : 0;
		}
		break;
	case A_ELU:
		for (int64_t j = 0; j < n; j++)
			g[j] *= pre[j] >= 0 ? 1 : post[j] + al;
		break;
	case A_SOFTSIGN:
		for (int64_t j = 0; j < n; j++) {
			T q = 1 + T_FABS(pre[j]);
			g[j] /= q * q;
		}
		break;
	case A_SOFTPLUS:
		for (int64_t j = 0; j < n; j++)
			g[j] = pre[j] > T_SOFTPLUS_LINEAR ? g[j] : g[j] / (1 + T_EXP(-pre[j]));
		break;
	}
	if (clip > 0)
		for (int64_t j = 0; j < n; j++)
			g[j] = pre[j] > clip || pre[j] < -clip ? 0 : g[j];
}

/* C (+)= op(A) op(B), as tern_gemm_f32 / f64 with alpha 1. */
static inline void TS(gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                            int64_t ldb, T beta, T *c, int64_t ldc)
{
#if RNN_GRAD_F32
	tern_gemm_f32(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
#else
	tern_gemm_f64(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
#endif
}

/* C[m, n] (+ with acc)= op(A) op(B): op(A) [m, k] (ta: A is stored [k, m]), op(B) [k, n] (tb: B is stored
 * [n, k]), rows lda, ldb and ldc apart; false when out of memory. float32 packs one operand per call
 * for tern's register-blocked kernels (several times faster here than BLAS's): the smaller of op(A) and
 * op(B)^T, which the larger other side amortises. float64 calls BLAS. */
static bool TS(mm)(tern_threadpool *pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T *a, int64_t lda,
                   const T *b, int64_t ldb, bool acc, T *c, int64_t ldc)
{
#if RNN_GRAD_F32
	if (m <= 0 || n <= 0)
		return true;
	if (k <= 0) {
		for (int64_t i = 0; i < m && !acc; i++)
			memset(c + i * ldc, 0, (size_t)n * sizeof(T));
		return true;
	}
	tern_packed *pk;
	if (m <= n) {
		/* op(A) packed, op(B) read where it lies */
		if (!(pk = tern_pack_a(m, k, a, lda, ta, 1.0f)))
			return false;
		tern_gemm_b bm = tb ? (tern_gemm_b){b, NULL, 1, n, 0, ldb} : (tern_gemm_b){b, NULL, ldb, n, n, 1};
		tern_gemm_c cm = {c, ldc, false, acc, NULL, NULL, NULL};
		tern_gemm_packed_run(pool, pk, n, &bm, &cm, TERN_GEMM_AUTO);
	} else {
		/* C^T = op(B)^T op(A)^T: op(B)^T packed, op(A)^T read where it lies, C stored transposed */
		if (!(pk = tern_pack_a(n, k, b, ldb, !tb, 1.0f)))
			return false;
		tern_gemm_b bm = ta ? (tern_gemm_b){a, NULL, lda, m, m, 1} : (tern_gemm_b){a, NULL, 1, m, 0, lda};
		tern_gemm_c cm = {c, ldc, true, acc, NULL, NULL, NULL};
		tern_gemm_packed_run(pool, pk, m, &bm, &cm, TERN_GEMM_COLS);
	}
	tern_packed_free(pk);
#else
	(void)pool;
	TS(gemm)(ta, tb, m, n, k, a, lda, b, ldb, acc ? 1 : 0, c, ldc);
#endif
	return true;
}

/* out[nb, n] (+ with acc)= dgs[nb, k] (rows ld apart) r[k, n]: one step's product with R's rows, through
 * pk (R^T packed, float) when there is one. */
static void TS(back_product)(tern_threadpool *pool, const tern_packed *pk, int64_t nb, int64_t n, int64_t k,
                             const T *dgs, int64_t ld, const T *r, T *out, bool acc)
{
#if RNN_GRAD_F32
	if (pk) {
		tern_gemm_b bm = {dgs, NULL, 1, nb, 0, ld};
		tern_gemm_c cm = {out, n, true, acc, NULL, NULL, NULL};
		tern_gemm_packed_run(pool, pk, nb, &bm, &cm, TERN_GEMM_COLS);
		return;
	}
#else
	(void)pk;
#endif
	(void)pool;
	TS(gemm)(false, false, nb, n, k, dgs, ld, r, n, acc ? 1 : 0, out, n);
}

typedef struct TS(grad_io) {
	const T *x, *w, *r, *b, *h0, *c0, *peep, *y, *dy, *dyh, *dyc; /* NULL where omitted */
	T *dx, *dw, *dr, *db, *dh0, *dc0, *dp; /* NULL where not asked for */
	T *buf[GB_COUNT];
	const int64_t *lens;
} TS(grad_io);

static tern_status TS(grad_direction)(const rnn_params *p, const TS(grad_io) *io, int d, tern_threadpool *pool)
{
	int64_t n = p->hidden, gh = p->n_gates * n, in = p->input, nb = p->batch, rows = p->seq * nb;
	bool reverse = p->reverse || d == 1, gru = p->cell == CELL_GRU, lbr = gru && p->linear_before_reset;
	const activation *acts = p->acts[d];
	T clip = (T)p->clip;
	const T *w = io->w + d * gh * in, *r = io->r + d * gh * n;
	const T *bias = io->b ? io->b + d * 2 * gh : NULL, *peep = io->peep ? io->peep + d * 3 * n : NULL;
	const int64_t *lens = io->lens;
	T *A = io->buf[GB_A], *G = io->buf[GB_G], *Hp = io->buf[GB_HP], *C = io->buf[GB_C], *aux = io->buf[GB_AUX];
	T *dG = io->buf[GB_DG], *dGh = io->buf[GB_DGH], *dGs = io->buf[GB_DGS], *dh = io->buf[GB_DH];
	T *dc = io->buf[GB_DC], *tmp = io->buf[GB_TMP], *dp = io->buf[GB_DP];
	const size_t ts = sizeof(T), nts = (size_t)n * sizeof(T);
#define STEP_T(s, b) (reverse ? lens[b] - 1 - (s) : (s))
#define PREV_T(t) (reverse ? (t) + 1 : (t) - 1)
/* LSTM's c_{t-1} at step s (NULL: zeros) */
#define C_PREV(s, t, b) ((s) ? C + x_row(p, PREV_T(t), b) * n : io->c0 ? io->c0 + state_at(p, d, b) : NULL)

	/* R^T packed for the products per step (R's candidate rows apart for GRU without linear_before_reset) */
	tern_packed *pk = NULL, *pk_h = NULL;
#if RNN_GRAD_F32
	if (!TERN_HAVE_BLAS || nb <= PACKED_MAX_ROWS) {
		pk = tern_pack_a(n, gru && !lbr ? 2 * n : gh, r, n, true, 1.0f);
		pk_h = gru && !lbr ? tern_pack_a(n, n, r + 2 * n * n, n, true, 1.0f) : NULL;
		if (!pk || (gru && !lbr && !pk_h)) {
			tern_packed_free(pk);
			tern_packed_free(pk_h);
			return tern_errorf(TERN_EOS, "out of memory");
		}
	}
#endif

	/* h_{t-1} of every step, from Y (initial_h before the first); zero past a sequence's end */
	memset(Hp, 0, (size_t)rows * nts);
	for (int64_t b = 0; b < nb; b++)
		for (int64_t s = 0; s < lens[b]; s++) {
			int64_t t = STEP_T(s, b);
			const T *src = s         ? io->y + y_at(p, PREV_T(t), d, b)
			               : io->h0 ? io->h0 + state_at(p, d, b)
			                        : NULL;
			if (src)
				memcpy(Hp + x_row(p, t, b) * n, src, nts);
		}

	/* every step's pre-activations A and gates G: two products over all the steps, then the cells */
	bool ok = TS(mm)(pool, false, true, rows, gh, in, io->x, in, w, in, false, A, gh) &&
	          TS(mm)(pool, false, true, rows, gru ? 2 * n : gh, n, Hp, n, r, n, true, A, gh);
	for (int64_t row = 0; bias && row < rows; row++)
		for (int64_t j = 0; j < gh; j++)
			A[row * gh + j] += bias[j] + (lbr && j >= 2 * n ? 0 : bias[gh + j]);
	memcpy(G, A, (size_t)(rows * gh) * ts);
	switch (p->cell) {
	case CELL_RNN: TS(gate_act)(&acts[0], G, rows * n, clip); break;
	case CELL_GRU:
		for (int64_t row = 0; row < rows; row++)
			TS(gate_act)(&acts[0], G + row * gh, 2 * n, clip);
		if (lbr) {
			/* aux = h R_h^T + Rbh, which r scales into the candidate */
			ok = ok && TS(mm)(pool, false, true, rows, n, n, Hp, n, r + 2 * n * n, n, false, aux, n);
			for (int64_t row = 0; row < rows; row++)
				for (int64_t j = 0; j < n; j++) {
					aux[row * n + j] += bias ? bias[gh + 2 * n + j] : 0;
					A[row * gh + 2 * n + j] += G[row * gh + n + j] * aux[row * n + j];
				}
		} else {
			/* aux = r * h, whose product with R_h joins the candidate */
			for (int64_t row = 0; row < rows; row++)
				for (int64_t j = 0; j < n; j++)
					aux[row * n + j] = G[row * gh + n + j] * Hp[row * n + j];
			ok = ok && TS(mm)(pool, false, true, rows, n, n, aux, n, r + 2 * n * n, n, true, A + 2 * n, gh);
		}
		for (int64_t row = 0; row < rows; row++) {
			memcpy(G + row * gh + 2 * n, A + row * gh + 2 * n, nts);
			TS(gate_act)(&acts[1], G + row * gh + 2 * n, n, clip);
		}
		break;
	case CELL_LSTM:
		/* c_t = f c_{t-1} + i g runs through the steps (and the peepholes read it) */
		for (int64_t b = 0; b < nb; b++)
			for (int64_t s = 0; s < lens[b]; s++) {
				int64_t t = STEP_T(s, b), row = x_row(p, t, b);
				const T *cp = C_PREV(s, t, b);
				T *a = A + row * gh, *g = G + row * gh, *c = C + row * n;
				if (peep)
					for (int64_t j = 0; j < n; j++) {
						T cj = cp ? cp[j] : 0;
						g[j] = a[j] += peep[j] * cj;
						g[2 * n + j] = a[2 * n + j] += peep[2 * n + j] * cj;
					}
				TS(gate_act)(&acts[0], g, n, clip);
				if (p->input_forget)
					for (int64_t j = 0; j < n; j++)
						g[2 * n + j] = 1 - g[j];
				else
					TS(gate_act)(&acts[0], g + 2 * n, n, clip);
				TS(gate_act)(&acts[1], g + 3 * n, n, clip);
				for (int64_t j = 0; j < n; j++)
					c[j] = g[2 * n + j] * (cp ? cp[j] : 0) + g[j] * g[3 * n + j];
				if (peep)
					for (int64_t j = 0; j < n; j++)
						g[n + j] = a[n + j] += peep[n + j] * c[j];
				TS(gate_act)(&acts[0], g + n, n, clip);
			}
		break;
	}

	if (!ok) {
		tern_packed_free(pk);
		tern_packed_free(pk_h);
		return tern_errorf(TERN_EOS, "out of memory");
	}

	/* back through the steps; dh, dc: the gradients of the state after the step, per batch row */
	for (int64_t b = 0; b < nb; b++)
		for (int64_t j = 0; j < n; j++) {
			dh[b * n + j] = io->dyh ? io->dyh[state_at(p, d, b) + j] : 0;
			dc[b * n + j] = io->dyc ? io->dyc[state_at(p, d, b) + j] : 0;
		}
	memset(dG, 0, (size_t)(rows * gh) * ts);
	if (dGh)
		memset(dGh, 0, (size_t)rows * nts);
	memset(dp, 0, 3 * nts);
	for (int64_t s = p->seq - 1; s >= 0; s--) {
		bool any = false;
		for (int64_t b = 0; b < nb; b++) {
			T *gs = dGs + b * gh, *dhb = dh + b * n, *dcb = dc + b * n;
			if (s >= lens[b]) {
				memset(gs, 0, (size_t)gh * ts);
				continue;
			}
			any = true;
			int64_t t = STEP_T(s, b), row = x_row(p, t, b);
			const T *a = A + row * gh, *g = G + row * gh;
			if (io->dy)
				for (int64_t j = 0; j < n; j++)
					dhb[j] += io->dy[y_at(p, t, d, b) + j];
			switch (p->cell) {
			case CELL_RNN:
				memcpy(gs, dhb, nts);
				TS(act_grad)(&acts[0], a, g, gs, n, clip);
				memset(dhb, 0, nts);
				break;
			case CELL_LSTM: {
				const T *c = C + row * n;
				const T *cp = C_PREV(s, t, b);
				T *tc = tmp + b * n, *di = gs, *dO = gs + n, *df = gs + 2 * n, *dg = gs + 3 * n;
				memcpy(tc, c, nts);
				TS(gate_act)(&acts[2], tc, n, 0);
				/* h = o h(c) */
				for (int64_t j = 0; j < n; j++) {
					dO[j] = dhb[j] * tc[j];
					dhb[j] *= g[n + j];
				}
				TS(act_grad)(&acts[2], c, tc, dhb, n, 0);
				TS(act_grad)(&acts[0], a + n, g + n, dO, n, clip);
				/* c = f c_{t-1} + i g */
				for (int64_t j = 0; j < n; j++) {
					T cj = cp ? cp[j] : 0;
					dcb[j] += dhb[j] + (peep ? dO[j] * peep[n + j] : 0);
					di[j] = dcb[j] * g[3 * n + j];
					dg[j] = dcb[j] * g[j];
					df[j] = dcb[j] * cj;
					dcb[j] *= g[2 * n + j];
				}
				if (p->input_forget)
					for (int64_t j = 0; j < n; j++) {
						di[j] -= df[j];
						df[j] = 0;
					}
				else
					TS(act_grad)(&acts[0], a + 2 * n, g + 2 * n, df, n, clip);
				TS(act_grad)(&acts[0], a, g, di, n, clip);
				TS(act_grad)(&acts[1], a + 3 * n, g + 3 * n, dg, n, clip);
				if (peep)
					for (int64_t j = 0; j < n; j++) {
						T cj = cp ? cp[j] : 0;
						dcb[j] += di[j] * peep[j] + df[j] * peep[2 * n + j];
						dp[j] += di[j] * cj;
						dp[n + j] += dO[j] * c[j];
						dp[2 * n + j] += df[j] * cj;
					}
				memset(dhb, 0, nts);
				break;
			}
			case CELL_GRU: {
				/* h = (1 - z) hh + z h_{t-1} */
				const T *hp = Hp + row * n;
				T *dz = gs, *dr = gs + n, *dah = gs + 2 * n;
				for (int64_t j = 0; j < n; j++) {
					dz[j] = dhb[j] * (hp[j] - g[2 * n + j]);
					dah[j] = dhb[j] * (1 - g[j]);
					dhb[j] *= g[j];
				}
				TS(act_grad)(&acts[0], a, g, dz, n, clip);
				TS(act_grad)(&acts[1], a + 2 * n, g + 2 * n, dah, n, clip);
				if (lbr) {
					/* hh = act(x W_h^T + Wbh + r aux) */
					for (int64_t j = 0; j < n; j++)
						dr[j] = dah[j] * aux[row * n + j];
					TS(act_grad)(&acts[0], a + n, g + n, dr, n, clip);
					memcpy(dG + row * gh, gs, (size_t)gh * ts);
					for (int64_t j = 0; j < n; j++)
						dah[j] *= g[n + j];
					memcpy(dGh + row * n, dah, nts);
				} else {
					memset(dr, 0, nts); /* after the product with R_h */
				}
				break;
			}
			}
			if (!gru)
				memcpy(dG + row * gh, gs, (size_t)gh * ts);
		}
		if (!any)
			continue;
		if (gru && !lbr) {
			/* d(r h) = da_h R_h, into tmp: the reset gate's gradient, and h_{t-1}'s through r h */
			TS(back_product)(pool, pk_h, nb, n, n, dGs + 2 * n, gh, r + 2 * n * n, tmp, false);
			for (int64_t b = 0; b < nb; b++) {
				if (s >= lens[b])
					continue;
				int64_t row = x_row(p, STEP_T(s, b), b);
				const T *hp = Hp + row * n, *a = A + row * gh, *g = G + row * gh, *drh = tmp + b * n;
				T *gs = dGs + b * gh;
				for (int64_t j = 0; j < n; j++) {
					gs[n + j] = drh[j] * hp[j];
					dh[b * n + j] += drh[j] * g[n + j];
				}
				TS(act_grad)(&acts[0], a + n, g + n, gs + n, n, clip);
				memcpy(dG + row * gh, gs, (size_t)gh * ts);
			}
			TS(back_product)(pool, pk, nb, n, 2 * n, dGs, gh, r, dh, true);
		} else {
			TS(back_product)(pool, pk, nb, n, gh, dGs, gh, r, dh, true);
		}
	}
	tern_packed_free(pk);
	tern_packed_free(pk_h);

	/* the parameters' gradients, over all the steps at once */
	if (io->dx)
		ok = ok && TS(mm)(pool, false, false, rows, in, gh, dG, gh, w, in, d > 0, io->dx, in);
	if (io->dw)
		ok = ok && TS(mm)(pool, true, false, gh, in, rows, dG, gh, io->x, in, false, io->dw + d * gh * in, in);
	if (io->dr) {
		T *drd = io->dr + d * gh * n;
		ok = ok && TS(mm)(pool, true, false, gru ? 2 * n : gh, n, rows, dG, gh, Hp, n, false, drd, n);
		if (gru)
			ok = ok && TS(mm)(pool, true, false, n, n, rows, lbr ? dGh : dG + 2 * n, lbr ? n : gh,
			                  lbr ? Hp : aux, n, false, drd + 2 * n * n, n);
	}
	if (io->db) {
		T *dbd = io->db + d * 2 * gh;
		memset(dbd, 0, (size_t)(2 * gh) * ts);
		for (int64_t row = 0; row < rows; row++)
			for (int64_t j = 0; j < gh; j++)
				dbd[j] += dG[row * gh + j];
		memcpy(dbd + gh, dbd, (size_t)gh * ts);
		if (lbr) {
			memset(dbd + gh + 2 * n, 0, nts);
			for (int64_t row = 0; row < rows; row++)
				for (int64_t j = 0; j < n; j++)
					dbd[gh + 2 * n + j] += dGh[row * n + j];
		}
	}
	for (int64_t b = 0; b < nb; b++) {
		if (io->dh0)
			memcpy(io->dh0 + state_at(p, d, b), dh + b * n, nts);
		if (io->dc0)
			memcpy(io->dc0 + state_at(p, d, b), dc + b * n, nts);
	}
	if (io->dp)
		memcpy(io->dp + d * 3 * n, dp, 3 * nts);
#undef STEP_T
#undef PREV_T
#undef C_PREV
	return ok ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
}

static tern_status TS(grad_kernel)(const tern_kernel_args *a)
{
	const rnn_params *p = a->params;
	bool lstm = p->cell == CELL_LSTM;
#define GIN(i) ((i) < a->n_in && a->in[i] ? (const T *)a->in[i]->data : NULL)
#define GOUT(o) ((o) < a->n_out && a->out[o] && !(p->skipped >> (o) & 1) ? (T *)a->out[o]->data : NULL)
	TS(grad_io) io = {
	        GIN(IN_X), GIN(IN_W), GIN(IN_R), GIN(IN_B), GIN(IN_H0), lstm ? GIN(IN_C0) : NULL,
	        lstm ? GIN(IN_P) : NULL, GIN(GIN_Y), GIN(GIN_DY), GIN(GIN_DYH), lstm ? GIN(GIN_DYC) : NULL,
	        GOUT(GOUT_DX), GOUT(GOUT_DW), GOUT(GOUT_DR), GOUT(GOUT_DB), GOUT(GOUT_DH0), GOUT(GOUT_DC0),
	        GOUT(GOUT_DP), {NULL}, NULL,
	};
#undef GIN
#undef GOUT
	size_t off[GB_COUNT], lens_off;
	grad_carve(p, sizeof(T), off, &lens_off);
	for (int i = 0; i < GB_COUNT; i++)
		io.buf[i] = off[i] == SIZE_MAX ? NULL : (T *)((char *)a->scratch + off[i]);
	int64_t *lens = (int64_t *)((char *)a->scratch + lens_off);
	tern_status st = rnn_lens(a, p, lens);
	io.lens = lens;
	for (int o = 0; o < a->n_out; o++)
		if (a->out[o] && p->skipped >> o & 1)
			memset(a->out[o]->data, 0, a->out[o]->nbytes);
	for (int d = 0; !st && d < p->n_dir; d++)
		st = TS(grad_direction)(p, &io, d, a->pool);
	return st;
}

#undef T
#undef T_EXP
#undef T_TANH
#undef T_FABS
#undef T_SOFTPLUS_LINEAR
