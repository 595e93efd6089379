/* ops.c — the communication operators tern-partition writes (domain tern), over the process's
 * communicator (comm.c):
 *
 *   tern.AllReduce(X1..Xk) -> Y1..Yk          the mean over the ranks of each Xi (one collective for all)
 *   tern.AllReduceStart(X1..Xk) -> B          the same started (B the packed sums, in flight) and
 *   tern.AllReduceWait(B, X1..Xk) -> Y1..Yk   waited for, so that the backward pass goes on between
 *   tern.Pull(S1..Sk, I) -> (R1..Rk[, route]) rows I of k tables sharded alike (one exchange); Si is this
 *                                             rank's shard; the route says who asked whom for what
 *   tern.Push([route,] I, G1..Gk) -> (J, H1..Hk)
 *                                             the rows Gt[k] of the tables' gradients at I[k], duplicates
 *                                             summed and divided by the ranks, sent to the shards' owners
 *                                             (only the rows with the route of the Pull of the same I; to
 *                                             the host's first rank first with the attribute leaders); J
 *                                             and Ht are the rows this rank's shards receive (J local rows)
 *   tern.AllGatherRows(I, G) -> (J, H)        every rank's (I, G/ranks) concatenated, as Horovod does
 *   tern.RowsToDense(I, G) -> D               the dense gradient [rows, ...] of rows G at I
 *
 * J and H have ranks x |I| places, fixed when planning so that the update after them is planned (and
 * in place) too: what arrives fills the front, the rest is row 0 with a zero gradient, which every
 * update rule leaves as it is. Pull and Push carry the shard map as attributes: rows (the table's),
 * starts (P+1 first rows of the P partitions), owners (each partition's rank), offsets (where a
 * partition starts in its owner's shard). Every operator carries ranks, the process count it was
 * partitioned for, which must be the communicator's. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define TERN_DOMAIN_NAME "tern"

static tern_status check_ranks(const tern_node *n)
{
	int64_t want = tern_attr_int(n, "ranks", 1);
	if (want != tern_comm_size())
		return tern_node_errorf(n, TERN_EUSAGE, "the step was partitioned for %lld ranks and runs on %d%s",
		                        (long long)want, tern_comm_size(),
		                        tern_comm_size() == 1 ? " (run it with tern-dist-run)" : "");
	return TERN_OK;
}

static int64_t row_index(const tern_tensor *idx, int64_t k)
{
	return idx->dtype == TERN_INT32 ? ((const int32_t *)idx->data)[k] : ((const int64_t *)idx->data)[k];
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* ---------------------------------------------------------------- the shard map */

typedef struct shard_map {
	int64_t rows;
	size_t n_parts;
	const int64_t *starts, *owners, *offsets;
} shard_map;

static tern_status read_map(const tern_node *n, shard_map *m)
{
	size_t ns = 0, no = 0, nf = 0;
	m->rows = tern_attr_int(n, "rows", -1);
	m->starts = tern_attr_ints(n, "starts", &ns);
	m->owners = tern_attr_ints(n, "owners", &no);
	m->offsets = tern_attr_ints(n, "offsets", &nf);
	m->n_parts = no;
	bool ok = m->rows >= 0 && m->starts && m->owners && m->offsets && no >= 1 && ns == no + 1 && nf == no &&
	          m->starts[0] == 0 && m->starts[no] == m->rows;
	for (size_t k = 0; ok && k < no; k++)
		ok = m->starts[k] <= m->starts[k + 1] && m->owners[k] >= 0 && m->owners[k] < tern_comm_size() &&
		     m->offsets[k] >= 0;
	return ok ? TERN_OK : tern_node_errorf(n, TERN_EDATA, "a malformed shard map (rows, starts, owners, offsets)");
}

/* What Pull and Push need from their attributes, read once when planning: the map (its arrays copied
 * behind the struct), whether the first input is a route, and the host leaders (NULL: none). */
typedef struct dist_params {
	shard_map m;
	int routed;
	const int64_t *leaders;
	int64_t mem[];
} dist_params;

static tern_status map_params(tern_prepare_args *p, int routed)
{
	shard_map m;
	tern_status st = read_map(p->node, &m);
	if (st)
		return st;
	size_t n_leaders = 0;
	const int64_t *leaders = tern_attr_ints(p->node, "leaders", &n_leaders);
	if (leaders && n_leaders != (size_t)tern_comm_size())
		return tern_node_errorf(p->node, TERN_EDATA, "leaders: %zu entries for %d ranks", n_leaders, tern_comm_size());
	size_t P = m.n_parts, n = 3 * P + 1 + (leaders ? n_leaders : 0);
	dist_params *d = malloc(sizeof *d + n * sizeof *d->mem);
	if (!d)
		return tern_errorf(TERN_EOS, "out of memory");
	int64_t *at = d->mem;
	memcpy(at, m.starts, (P + 1) * sizeof *at);
	memcpy(at + P + 1, m.owners, P * sizeof *at);
	memcpy(at + 2 * P + 1, m.offsets, P * sizeof *at);
	d->m = (shard_map){m.rows, P, at, at + P + 1, at + 2 * P + 1};
	d->routed = routed;
	d->leaders = NULL;
	if (leaders) {
		memcpy(at + 3 * P + 1, leaders, n_leaders * sizeof *at);
		d->leaders = at + 3 * P + 1;
	}
	p->params = d;
	p->free_params = free;
	return TERN_OK;
}

/* The partition of a row (binary search over starts). */
static size_t part_of(const shard_map *m, int64_t row)
{
	size_t lo = 0, hi = m->n_parts;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (m->starts[mid] <= row)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* Sorted distinct rows of idx (negative ones from the end) into *uniq; their count, or -1 with an
 * error naming the node when one is out of range. */
static int64_t distinct_rows(const tern_node *n, const tern_tensor *idx, int64_t rows, int64_t *uniq)
{
	int64_t cnt = tern_tensor_numel(idx);
	for (int64_t k = 0; k < cnt; k++) {
		int64_t r = row_index(idx, k);
		if (r < -rows || r >= rows) {
			tern_node_errorf(n, TERN_EDATA, "row index %lld is out of range for %lld rows", (long long)r,
			                 (long long)rows);
			return -1;
		}
		uniq[k] = r < 0 ? r + rows : r;
	}
	qsort(uniq, (size_t)cnt, sizeof *uniq, cmp_i64);
	int64_t u = 0;
	for (int64_t k = 0; k < cnt; k++)
		if (!u || uniq[k] != uniq[u - 1])
			uniq[u++] = uniq[k];
	return u;
}

/* Per-rank counts and offsets of a send or receive buffer; off[n] is the total. */
static void offsets_of(const int64_t *cnt, int n, int64_t *off)
{
	off[0] = 0;
	for (int r = 0; r < n; r++)
		off[r + 1] = off[r] + cnt[r];
}

static void scaled(int64_t *dst, const int64_t *src, int n, int64_t by)
{
	for (int r = 0; r <= n; r++)
		dst[r] = src[r] * by;
}

/* The exchange both Pull and Push make: ids[k] (local shard rows, grouped by owner, cnt[r] to rank
 * r) go to their owners; *got gets what every rank sent here, rcnt[r] from rank r (malloc'd). */
typedef struct exchange {
	int n;
	int64_t *cnt, *off, *rcnt, *roff, *bytes, *bytes_off, *rbytes, *rbytes_off; /* n + 1 each */
} exchange;

static tern_status exchange_init(exchange *x)
{
	x->n = tern_comm_size();
	int64_t *mem = calloc(8 * ((size_t)x->n + 1), sizeof *mem);
	if (!mem)
		return tern_errorf(TERN_EOS, "out of memory");
	int64_t **arr[8] = {&x->cnt, &x->off, &x->rcnt, &x->roff, &x->bytes, &x->bytes_off, &x->rbytes, &x->rbytes_off};
	for (int i = 0; i < 8; i++)
		*arr[i] = mem + (size_t)i * ((size_t)x->n + 1);
	return TERN_OK;
}

static void exchange_free(exchange *x)
{
	free(x->cnt);
}

/* With x->cnt set: exchanges the counts and sends n_each elements of elem bytes per id. */
static tern_status exchange_counts(exchange *x, int kind)
{
	tern_status st = tern_comm_alltoall_counts(kind, x->cnt, x->rcnt);
	offsets_of(x->cnt, x->n, x->off);
	offsets_of(x->rcnt, x->n, x->roff);
	return st;
}

static tern_status exchange_data(exchange *x, int kind, const void *send, void *recv, int64_t unit, bool back)
{
	/* back: the replies, from the receivers of the first exchange to its senders */
	const int64_t *sc = back ? x->rcnt : x->cnt, *rc = back ? x->cnt : x->rcnt;
	for (int r = 0; r < x->n; r++) {
		x->bytes[r] = sc[r] * unit;
		x->rbytes[r] = rc[r] * unit;
	}
	scaled(x->bytes_off, back ? x->roff : x->off, x->n, unit);
	scaled(x->rbytes_off, back ? x->off : x->roff, x->n, unit);
	return tern_comm_alltoallv(kind, send, x->bytes, x->bytes_off, recv, x->rbytes, x->rbytes_off);
}

/* Groups the distinct rows uniq[0..u) by owner: x->cnt and x->off per rank, slot[k] uniq[k]'s place
 * in the send order, ids[slot[k]] its row in the owner's shard. fill: n_ranks zeros. */
static void group_by_owner(const shard_map *m, const int64_t *uniq, int64_t u, exchange *x, int64_t *fill,
                           int64_t *slot, int64_t *ids)
{
	for (int64_t k = 0; k < u; k++)
		x->cnt[m->owners[part_of(m, uniq[k])]]++;
	offsets_of(x->cnt, x->n, x->off);
	for (int64_t k = 0; k < u; k++) {
		size_t p = part_of(m, uniq[k]);
		int o = (int)m->owners[p];
		slot[k] = x->off[o] + fill[o]++;
		ids[slot[k]] = m->offsets[p] + uniq[k] - m->starts[p];
	}
}

/* ---------------------------------------------------------------- routes */

/* A Pull's route, for the Push of the same indices' gradient: which distinct rows this rank asked of
 * whom (u, cnt, uniq sorted, slot: each one's place in the send order) and which local rows others
 * asked of it (rcnt, asked). With it the Push sends the rows alone, in one collective: the owners know
 * which rows come. An int64 tensor of fixed size (planned), cap = |I| and n ranks:
 * [u, asked_n, n, cnt[n], rcnt[n], uniq[cap], slot[cap], asked[n cap]]. */
static int64_t route_size(int64_t cap, int n)
{
	return 3 + 2 * (int64_t)n + 2 * cap + (int64_t)n * cap;
}

typedef struct route {
	int64_t *u, *asked_n, *n, *cnt, *rcnt, *uniq, *slot, *asked;
} route;

static route route_at(int64_t *p, int64_t cap, int n)
{
	route r = {p, p + 1, p + 2, p + 3, p + 3 + n, p + 3 + 2 * n, p + 3 + 2 * n + cap, p + 3 + 2 * n + 2 * cap};
	return r;
}

/* ---------------------------------------------------------------- Pull */

/* tern.Pull(S1..Sk, I) -> (R1..Rk[, route]): the rows I of k tables sharded alike, one exchange for
 * all of them. */
static tern_status pull_kernel(const tern_kernel_args *a)
{
	int k_tables = a->n_in - 1;
	const tern_tensor *I = a->in[k_tables];
	bool routed = a->n_out > k_tables && a->out[k_tables];
	const shard_map m = ((const dist_params *)a->params)->m;
	tern_status st = TERN_OK;
	int64_t n = tern_tensor_numel(I), srows = a->in[0]->rank ? a->in[0]->dims[0] : 1;
	size_t rb_all = 0, rb[16];
	for (int t = 0; t < k_tables; t++)
		rb_all += rb[t] = srows ? a->in[t]->nbytes / (size_t)srows : 0;
	exchange x = {0};
	if ((st = exchange_init(&x)))
		return st;
	int64_t *uniq = malloc(((size_t)n + 1) * sizeof *uniq), *ids = malloc(((size_t)n + 1) * sizeof *ids);
	int64_t *slot = malloc(((size_t)n + 1) * sizeof *slot), *fill = calloc((size_t)x.n + 1, sizeof *fill);
	int64_t *asked = NULL;
	char *reply = NULL, *got = NULL;
	int64_t u = uniq ? distinct_rows(a->node, I, m.rows, uniq) : 0;
	if (!uniq || !ids || !slot || !fill)
		st = tern_errorf(TERN_EOS, "out of memory");
	else if (u < 0)
		st = TERN_EDATA;
	if (!st)
		group_by_owner(&m, uniq, u, &x, fill, slot, ids);
	double share = (double)(x.n - 1) / x.n;
	if (!st)
		tern_comm_expect(TERN_COMM_SPARSE_PULL, (double)u * (double)rb_all * share);
	if (!st && !(st = exchange_counts(&x, TERN_COMM_SPARSE_PULL))) {
		int64_t asked_n = x.roff[x.n];
		asked = malloc(((size_t)asked_n + 1) * sizeof *asked);
		reply = malloc((size_t)asked_n * rb_all + 1);
		got = malloc((size_t)u * rb_all + 1);
		if (!asked || !reply || !got)
			st = tern_errorf(TERN_EOS, "out of memory");
		if (!st)
			st = exchange_data(&x, TERN_COMM_SPARSE_PULL, ids, asked, sizeof *ids, false);
		/* a reply row: the asked row of every table, one after the other */
		for (int64_t k = 0; !st && k < asked_n; k++) {
			if (asked[k] < 0 || asked[k] >= srows) {
				st = tern_node_errorf(a->node, TERN_EDATA, "another rank asked for row %lld of a shard of %lld rows",
				                      (long long)asked[k], (long long)srows);
				break;
			}
			char *at = reply + (size_t)k * rb_all;
			for (int t = 0; t < k_tables; t++) {
				memcpy(at, (const char *)a->in[t]->data + (size_t)asked[k] * rb[t], rb[t]);
				at += rb[t];
			}
		}
		if (!st)
			st = exchange_data(&x, TERN_COMM_SPARSE_PULL, reply, got, (int64_t)rb_all, true);
	}
	/* every index's rows from where its distinct row arrived */
	for (int64_t k = 0; !st && k < n; k++) {
		int64_t r = row_index(I, k);
		r = r < 0 ? r + m.rows : r;
		const int64_t *at = bsearch(&r, uniq, (size_t)u, sizeof *uniq, cmp_i64);
		const char *src = got + (size_t)slot[at - uniq] * rb_all;
		for (int t = 0; t < k_tables; t++) {
			memcpy((char *)a->out[t]->data + (size_t)k * rb[t], src, rb[t]);
			src += rb[t];
		}
	}
	if (!st && routed) {
		route ro = route_at(a->out[k_tables]->data, n, x.n);
		*ro.u = u;
		*ro.asked_n = x.roff[x.n];
		*ro.n = x.n;
		memcpy(ro.cnt, x.cnt, (size_t)x.n * sizeof *x.cnt);
		memcpy(ro.rcnt, x.rcnt, (size_t)x.n * sizeof *x.rcnt);
		memcpy(ro.uniq, uniq, (size_t)u * sizeof *uniq);
		memcpy(ro.slot, slot, (size_t)u * sizeof *slot);
		memcpy(ro.asked, asked, (size_t)x.roff[x.n] * sizeof *asked);
	}
	free(uniq);
	free(ids);
	free(slot);
	free(fill);
	free(asked);
	free(reply);
	free(got);
	exchange_free(&x);
	return st;
}

static tern_status pull_prepare(tern_prepare_args *p)
{
	int k_tables = p->n_in - 1;
	const tern_tensor *I = p->n_in >= 2 ? p->in[k_tables] : NULL;
	bool ok = k_tables >= 1 && k_tables <= 16 && I && (I->dtype == TERN_INT64 || I->dtype == TERN_INT32) &&
	          (p->n_out == k_tables || p->n_out == k_tables + 1);
	for (int t = 0; ok && t < k_tables; t++)
		ok = p->in[t] && p->in[t]->rank >= 1 && p->in[t]->dims[0] == p->in[0]->dims[0] &&
		     I->rank + p->in[t]->rank - 1 <= TERN_MAX_RANK;
	if (!ok)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "takes 1 to 16 shards of equal rows and int32 or int64 indices, and gives their rows "
		                        "(and optionally a route)");
	tern_status st = check_ranks(p->node);
	if (st || (st = map_params(p, 0)))
		return st;
	for (int t = 0; t < k_tables; t++) {
		const tern_tensor *S = p->in[t];
		int64_t dims[TERN_MAX_RANK];
		memcpy(dims, I->dims, (size_t)I->rank * sizeof *dims);
		memcpy(dims + I->rank, S->dims + 1, (size_t)(S->rank - 1) * sizeof *dims);
		if (p->out[t])
			tern_set_shape(p->out[t], S->dtype, I->rank + S->rank - 1, dims);
	}
	if (p->n_out > k_tables && p->out[k_tables]) {
		int64_t size = route_size(tern_tensor_numel(I), tern_comm_size());
		tern_set_shape(p->out[k_tables], TERN_INT64, 1, &size);
	}
	p->kernel = pull_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- Push and AllGatherRows */

/* Sums the rows of G at equal indices and scales them by 1/ranks: rows[u] (sorted distinct indices
 * uniq[u]), in G's dtype (float or double). */
static tern_status coalesce(const tern_node *node, const tern_tensor *I, const tern_tensor *G, int64_t rows,
                            int64_t *uniq, int64_t *u_out, void *sums, int64_t D)
{
	int64_t u = distinct_rows(node, I, rows, uniq);
	if (u < 0)
		return TERN_EDATA;
	bool f64 = G->dtype == TERN_DOUBLE;
	size_t es = f64 ? 8 : 4;
	memset(sums, 0, (size_t)(u * D) * es);
	int64_t n = tern_tensor_numel(I);
	double scale = 1.0 / tern_comm_size();
	for (int64_t k = 0; k < n; k++) {
		int64_t r = row_index(I, k);
		r = r < 0 ? r + rows : r;
		int64_t at = (const int64_t *)bsearch(&r, uniq, (size_t)u, sizeof *uniq, cmp_i64) - uniq;
		if (f64) {
			double *d = (double *)sums + at * D;
			const double *s = (const double *)G->data + k * D;
			for (int64_t e = 0; e < D; e++)
				d[e] += s[e];
		} else {
			float *d = (float *)sums + at * D;
			const float *s = (const float *)G->data + k * D;
			for (int64_t e = 0; e < D; e++)
				d[e] += s[e];
		}
	}
	for (int64_t e = 0; e < u * D; e++) {
		if (f64)
			((double *)sums)[e] *= scale;
		else
			((float *)sums)[e] = (float)(((float *)sums)[e] * scale);
	}
	*u_out = u;
	return TERN_OK;
}

static int64_t row_elems(const tern_tensor *I, const tern_tensor *G)
{
	int64_t n = tern_tensor_numel(I);
	return n ? tern_tensor_numel(G) / n : 0;
}

/* The outputs (J, H) hold at most every rank's rows: their shape is fixed when planning, ranks times
 * I's count, so that the update after them is planned (and done in place) too. Received rows fill
 * the front; the rest is padding that every rule leaves as it is: row 0 with a zero gradient. Checks
 * that m rows fit. */
static tern_status rows_outputs(const tern_kernel_args *a, int64_t m, tern_tensor **J, tern_tensor **H)
{
	*J = a->out[0];
	*H = a->out[1];
	int64_t cap = (*J)->dims[0];
	if (m > cap)
		return tern_node_errorf(a->node, TERN_EINTERNAL, "%lld rows arrived for %lld places", (long long)m,
		                        (long long)cap);
	size_t rb = cap ? (*H)->nbytes / (size_t)cap : 0;
	memset((int64_t *)(*J)->data + m, 0, (size_t)(cap - m) * sizeof(int64_t));
	memset((char *)(*H)->data + (size_t)m * rb, 0, (size_t)(cap - m) * rb);
	return TERN_OK;
}

/* --local-aggregation: the distinct rows of the ranks on a host summed on the host's first rank (its
 * leader, leaders[r] for rank r) before anything goes to the owners, which then hear from one rank a
 * host. *uniq (sorted), *u and *sums (k tables one after the other, u rows of rb[t] each) are this
 * rank's on entry and its host's on the leader on return (nothing on the others). */
static tern_status aggregate_on_host(const int64_t *leaders, int k_tables, const size_t *rb, const int *dtype,
                                     size_t rb_all, int64_t **uniq, int64_t *u, char **sums)
{
	int me = tern_comm_rank();
	bool leader = leaders[me] == me;
	exchange x = {0};
	tern_status st = exchange_init(&x);
	if (st)
		return st;
	if (!leader)
		x.cnt[leaders[me]] = *u;
	/* rows as sent: a distinct row's sums in every table, one after the other */
	char *packed = malloc((size_t)*u * rb_all + 1), *got = NULL;
	int64_t *ids = NULL;
	if (!packed)
		st = tern_errorf(TERN_EOS, "out of memory");
	size_t tab_at = 0;
	for (int t = 0; !st && t < k_tables; t++) {
		for (int64_t k = 0; k < *u; k++)
			memcpy(packed + (size_t)k * rb_all + tab_at, *sums + tab_at * (size_t)*u + (size_t)k * rb[t], rb[t]);
		tab_at += rb[t];
	}
	if (!st)
		st = exchange_counts(&x, TERN_COMM_SPARSE_LOCAL);
	int64_t in_n = st ? 0 : x.roff[x.n];
	if (!st && (!(ids = malloc((size_t)(in_n + *u + 1) * sizeof *ids)) || !(got = malloc((size_t)(in_n + *u) * rb_all + 1))))
		st = tern_errorf(TERN_EOS, "out of memory");
	if (!st) {
		tern_comm_expect(TERN_COMM_SPARSE_LOCAL, leader ? 0.0 : (double)*u * (double)rb_all);
		st = exchange_data(&x, TERN_COMM_SPARSE_LOCAL, *uniq, ids, sizeof *ids, false);
	}
	if (!st)
		st = exchange_data(&x, TERN_COMM_SPARSE_LOCAL, packed, got, (int64_t)rb_all, false);
	if (!st && leader) {
		/* the host's rows: this rank's and what came, summed per index */
		memcpy(ids + in_n, *uniq, (size_t)*u * sizeof *ids);
		memcpy(got + (size_t)in_n * rb_all, packed, (size_t)*u * rb_all);
		int64_t all = in_n + *u, *nu = malloc((size_t)(all + 1) * sizeof *nu);
		char *ns = calloc((size_t)all * rb_all + 1, 1);
		if (!nu || !ns)
			st = tern_errorf(TERN_EOS, "out of memory");
		int64_t w = 0;
		if (!st) {
			memcpy(nu, ids, (size_t)all * sizeof *nu);
			qsort(nu, (size_t)all, sizeof *nu, cmp_i64);
			for (int64_t k = 0; k < all; k++)
				if (!w || nu[k] != nu[w - 1])
					nu[w++] = nu[k];
		}
		for (int64_t k = 0; !st && k < all; k++) {
			int64_t at = (const int64_t *)bsearch(&ids[k], nu, (size_t)w, sizeof *nu, cmp_i64) - nu;
			size_t off = 0;
			for (int t = 0; t < k_tables; t++) {
				char *d = ns + off * (size_t)w + (size_t)at * rb[t];
				const char *src = got + (size_t)k * rb_all + off;
				if (dtype[t] == TERN_DOUBLE)
					for (size_t e = 0; e < rb[t] / sizeof(double); e++)
						((double *)d)[e] += ((const double *)src)[e];
				else
					for (size_t e = 0; e < rb[t] / sizeof(float); e++)
						((float *)d)[e] += ((const float *)src)[e];
				off += rb[t];
			}
		}
		if (!st) {
			free(*uniq);
			free(*sums);
			*uniq = nu;
			*sums = ns;
			*u = w;
			nu = NULL;
			ns = NULL;
		}
		free(nu);
		free(ns);
	} else if (!st) {
		*u = 0;
	}
	free(packed);
	free(got);
	free(ids);
	exchange_free(&x);
	return st;
}

/* tern.Push([route,] I, G1..Gk) -> (J, H1..Hk): the gradients of k tables sharded alike, at the same
 * indices, one exchange for all. With a route (the Pull of the same I) only the rows travel. */
static tern_status push_kernel(const tern_kernel_args *a)
{
	const dist_params *dp = a->params;
	int routed = dp->routed;
	const tern_tensor *I = a->in[routed];
	int k_tables = a->n_in - 1 - routed;
	const shard_map m = dp->m;
	tern_status st = TERN_OK;
	int64_t n = tern_tensor_numel(I), D[16];
	size_t rb[16], rb_all = 0;
	for (int t = 0; t < k_tables; t++) {
		D[t] = row_elems(I, a->in[1 + routed + t]);
		rb_all += rb[t] = (size_t)D[t] * tern_dtype_size(a->in[1 + routed + t]->dtype);
	}
	exchange x = {0};
	if ((st = exchange_init(&x)))
		return st;
	int64_t *uniq = malloc(((size_t)n + 1) * sizeof *uniq), *ids = NULL;
	int64_t *fill = calloc((size_t)x.n + 1, sizeof *fill), u = 0, *slot = NULL;
	char *sums = malloc((size_t)n * rb_all + 1), *send = NULL;
	size_t sums_at = 0;
	int dtype[16];
	if (!uniq || !fill || !sums)
		st = tern_errorf(TERN_EOS, "out of memory");
	/* each table's rows summed per distinct index (tables one after the other in sums) */
	for (int t = 0; !st && t < k_tables; t++) {
		dtype[t] = a->in[1 + routed + t]->dtype;
		st = coalesce(a->node, I, a->in[1 + routed + t], m.rows, uniq, &u, sums + sums_at, D[t]);
		sums_at += (size_t)u * rb[t];
	}
	/* summed per host first (--local-aggregation): the leaders push for their hosts */
	const int64_t *leaders = dp->leaders;
	if (!st && leaders && !routed)
		st = aggregate_on_host(leaders, k_tables, rb, dtype, rb_all, &uniq, &u, &sums);
	if (!st && (!(ids = malloc(((size_t)u + 1) * sizeof *ids)) || !(slot = malloc(((size_t)u + 1) * sizeof *slot)) ||
	            !(send = malloc((size_t)u * rb_all + 1))))
		st = tern_errorf(TERN_EOS, "out of memory");
	route ro = {0};
	if (!st && routed) {
		/* the Pull's exchange, reused: the same distinct rows, to the same owners */
		ro = route_at(a->in[0]->data, n, x.n);
		bool same = *ro.u == u && *ro.n == x.n && !memcmp(ro.uniq, uniq, (size_t)u * sizeof *uniq);
		if (!same)
			st = tern_node_errorf(a->node, TERN_EDATA, "its indices are not those of the pull whose route it takes");
		for (int r = 0; !st && r < x.n; r++) {
			x.cnt[r] = ro.cnt[r];
			x.rcnt[r] = ro.rcnt[r];
		}
		if (!st) {
			offsets_of(x.cnt, x.n, x.off);
			offsets_of(x.rcnt, x.n, x.roff);
			memcpy(slot, ro.slot, (size_t)u * sizeof *slot);
		}
	} else if (!st) {
		group_by_owner(&m, uniq, u, &x, fill, slot, ids);
	}
	/* the share of rows owned elsewhere: of the ranks, or of the hosts when leaders push */
	int places = x.n;
	if (leaders && !routed) {
		places = 0;
		for (int r = 0; r < x.n; r++)
			places += leaders[r] == r;
	}
	if (!st && places > 0)
		tern_comm_expect(TERN_COMM_SPARSE_PUSH, (double)u * (double)rb_all * (places - 1) / places);
	/* a send row: the distinct row's sum in every table, one after the other */
	for (int64_t k = 0; !st && k < u; k++) {
		char *dst = send + (size_t)slot[k] * rb_all;
		size_t at = 0;
		for (int t = 0; t < k_tables; t++) {
			memcpy(dst, sums + at + (size_t)k * rb[t], rb[t]);
			dst += rb[t];
			at += (size_t)u * rb[t];
		}
	}
	int64_t m_rows = 0;
	char *recv = NULL;
	if (!st && !routed)
		st = exchange_counts(&x, TERN_COMM_SPARSE_PUSH);
	if (!st) {
		m_rows = x.roff[x.n];
		int64_t cap = a->out[0]->dims[0];
		if (m_rows > cap)
			st = tern_node_errorf(a->node, TERN_EINTERNAL, "%lld rows arrived for %lld places", (long long)m_rows,
			                      (long long)cap);
	}
	if (!st && !(recv = malloc((size_t)m_rows * rb_all + 1)))
		st = tern_errorf(TERN_EOS, "out of memory");
	int64_t *J = a->out[0]->data;
	if (!st) {
		if (routed)
			memcpy(J, ro.asked, (size_t)m_rows * sizeof *J);
		else
			st = exchange_data(&x, TERN_COMM_SPARSE_PUSH, ids, J, sizeof *ids, false);
	}
	if (!st)
		st = exchange_data(&x, TERN_COMM_SPARSE_PUSH, send, recv, (int64_t)rb_all, false);
	/* J and each H: what arrived, then padding (row 0, a zero gradient) */
	if (!st) {
		int64_t cap = a->out[0]->dims[0];
		memset(J + m_rows, 0, (size_t)(cap - m_rows) * sizeof *J);
		size_t at = 0;
		for (int t = 0; t < k_tables; t++) {
			char *H = a->out[1 + t]->data;
			for (int64_t k = 0; k < m_rows; k++)
				memcpy(H + (size_t)k * rb[t], recv + (size_t)k * rb_all + at, rb[t]);
			memset(H + (size_t)m_rows * rb[t], 0, (size_t)(cap - m_rows) * rb[t]);
			at += rb[t];
		}
	}
	free(recv);
	free(uniq);
	free(ids);
	free(fill);
	free(slot);
	free(sums);
	free(send);
	exchange_free(&x);
	return st;
}

static tern_status allgather_rows_kernel(const tern_kernel_args *a)
{
	const tern_tensor *I = a->in[0], *G = a->in[1];
	int n_ranks = tern_comm_size();
	int64_t n = tern_tensor_numel(I), D = row_elems(I, G);
	size_t es = tern_dtype_size(G->dtype);
	int64_t *cnt = calloc(4 * ((size_t)n_ranks + 1), sizeof *cnt), *mine = malloc(((size_t)n + 1) * sizeof *mine);
	char *scaled_rows = malloc((size_t)(n * D) * es + 1);
	tern_status st = cnt && mine && scaled_rows ? TERN_OK : tern_errorf(TERN_EOS, "out of memory");
	int64_t *bytes = cnt + n_ranks + 1, *off = bytes + n_ranks + 1, *one = off + n_ranks + 1;
	double scale = 1.0 / n_ranks;
	for (int64_t k = 0; !st && k < n; k++)
		mine[k] = row_index(I, k);
	for (int64_t e = 0; !st && e < n * D; e++) {
		if (G->dtype == TERN_DOUBLE)
			((double *)scaled_rows)[e] = ((const double *)G->data)[e] * scale;
		else
			((float *)scaled_rows)[e] = (float)(((const float *)G->data)[e] * scale);
	}
	/* every rank's count, then its indices and its rows */
	for (int r = 0; !st && r < n_ranks; r++) {
		one[r] = sizeof(int64_t);
		off[r] = r * (int64_t)sizeof(int64_t);
	}
	if (!st) {
		tern_comm_expect(TERN_COMM_SPARSE_PUSH, (double)(n * D) * (double)es * (n_ranks - 1));
		st = tern_comm_allgatherv(TERN_COMM_SPARSE_PUSH, &n, cnt, one, off);
	}
	tern_tensor *J = NULL, *H = NULL;
	int64_t total = 0;
	for (int r = 0; !st && r < n_ranks; r++)
		total += cnt[r];
	if (!st)
		st = rows_outputs(a, total, &J, &H);
	int64_t at = 0;
	for (int r = 0; !st && r < n_ranks; r++) {
		bytes[r] = cnt[r] * (int64_t)sizeof(int64_t);
		off[r] = at * (int64_t)sizeof(int64_t);
		at += cnt[r];
	}
	if (!st)
		st = tern_comm_allgatherv(TERN_COMM_SPARSE_PUSH, mine, J->data, bytes, off);
	for (int r = 0; r < n_ranks; r++) {
		bytes[r] = bytes[r] / (int64_t)sizeof(int64_t) * D * (int64_t)es;
		off[r] = off[r] / (int64_t)sizeof(int64_t) * D * (int64_t)es;
	}
	if (!st)
		st = tern_comm_allgatherv(TERN_COMM_SPARSE_PUSH, scaled_rows, H->data, bytes, off);
	free(cnt);
	free(mine);
	free(scaled_rows);
	return st;
}

/* (I, G1..Gk) -> (J, H1..Hk), after `skip` leading inputs (a route) */
static tern_status rows_prepare(tern_prepare_args *p, tern_kernel_fn kernel, int skip)
{
	int k_tables = p->n_in - 1 - skip;
	const tern_tensor *I = p->n_in > skip ? p->in[skip] : NULL;
	bool ok = k_tables >= 1 && k_tables <= 16 && p->n_out == 1 + k_tables && I &&
	          (I->dtype == TERN_INT64 || I->dtype == TERN_INT32) &&
	          (!skip || (p->in[0] && p->in[0]->dtype == TERN_INT64 && p->in[0]->rank == 1 &&
	                     p->in[0]->dims[0] == route_size(tern_tensor_numel(I), tern_comm_size())));
	for (int t = 0; ok && t < k_tables; t++) {
		const tern_tensor *G = p->in[1 + skip + t];
		ok = G && (G->dtype == TERN_FLOAT || G->dtype == TERN_DOUBLE) && G->rank >= I->rank &&
		     !memcmp(G->dims, I->dims, (size_t)I->rank * sizeof *I->dims);
	}
	if (!ok)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "takes %sint32 or int64 indices I and 1 to 16 float or double rows G of shape "
		                        "[I's shape, ...]",
		                        skip ? "a pull's route, " : "");
	tern_status st = check_ranks(p->node);
	if (!st && kernel == push_kernel)
		st = map_params(p, skip);
	if (st)
		return st;
	int64_t cap = tern_comm_size() * tern_tensor_numel(I);
	tern_set_shape(p->out[0], TERN_INT64, 1, &cap);
	for (int t = 0; t < k_tables; t++) {
		const tern_tensor *G = p->in[1 + skip + t];
		int64_t dims[TERN_MAX_RANK];
		dims[0] = cap;
		int extra = G->rank - I->rank;
		memcpy(dims + 1, G->dims + I->rank, (size_t)extra * sizeof *dims);
		tern_set_shape(p->out[1 + t], G->dtype, 1 + extra, dims);
	}
	p->kernel = kernel;
	return TERN_OK;
}

static tern_status push_prepare(tern_prepare_args *p)
{
	return rows_prepare(p, push_kernel, (int)tern_attr_int(p->node, "routed", 0) != 0);
}

static tern_status allgather_rows_prepare(tern_prepare_args *p)
{
	return rows_prepare(p, allgather_rows_kernel, 0);
}

/* ---------------------------------------------------------------- RowsToDense */

static tern_status rows_to_dense_kernel(const tern_kernel_args *a)
{
	const tern_tensor *I = a->in[0], *G = a->in[1];
	tern_tensor *Y = a->out[0];
	int64_t rows = Y->dims[0], n = tern_tensor_numel(I), D = row_elems(I, G);
	memset(Y->data, 0, Y->nbytes);
	for (int64_t k = 0; k < n; k++) {
		int64_t r = row_index(I, k);
		if (r < -rows || r >= rows)
			return tern_node_errorf(a->node, TERN_EDATA, "row index %lld is out of range for %lld rows",
			                        (long long)r, (long long)rows);
		r = r < 0 ? r + rows : r;
		if (G->dtype == TERN_DOUBLE)
			for (int64_t e = 0; e < D; e++)
				((double *)Y->data)[r * D + e] += ((const double *)G->data)[k * D + e];
		else
			for (int64_t e = 0; e < D; e++)
				((float *)Y->data)[r * D + e] += ((const float *)G->data)[k * D + e];
	}
	return TERN_OK;
}

static tern_status rows_to_dense_prepare(tern_prepare_args *p)
{
	const tern_tensor *I = p->in[0], *G = p->n_in > 1 ? p->in[1] : NULL;
	int64_t rows = tern_attr_int(p->node, "rows", -1);
	if (p->n_in != 2 || !I || !G || (I->dtype != TERN_INT64 && I->dtype != TERN_INT32) ||
	    (G->dtype != TERN_FLOAT && G->dtype != TERN_DOUBLE) || G->rank < I->rank || rows < 0 ||
	    memcmp(G->dims, I->dims, (size_t)I->rank * sizeof *I->dims) != 0)
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "takes int32 or int64 indices I, float or double rows G of shape [I's shape, ...] "
		                        "and the attribute rows");
	int64_t dims[TERN_MAX_RANK];
	dims[0] = rows;
	int extra = G->rank - I->rank;
	memcpy(dims + 1, G->dims + I->rank, (size_t)extra * sizeof *dims);
	tern_set_shape(p->out[0], G->dtype, 1 + extra, dims);
	p->kernel = rows_to_dense_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- AllReduce */

/* Checks k float or double tensors of one dtype; *bytes their size together. */
static tern_status check_reduced(const tern_prepare_args *p, int first, size_t *bytes)
{
	int dtype = p->in[first] ? p->in[first]->dtype : 0;
	*bytes = 0;
	for (int i = first; i < p->n_in; i++) {
		if (!p->in[i] || p->in[i]->dtype != dtype || (dtype != TERN_FLOAT && dtype != TERN_DOUBLE))
			return tern_node_errorf(p->node, TERN_EDATA, "reduces float or double tensors, all of one dtype");
		*bytes += tern_tensor_numel(p->in[i]) * tern_dtype_size(dtype);
	}
	return check_ranks(p->node);
}

static void pack(char *buf, tern_tensor *const *x, int k)
{
	for (int i = 0; i < k; i++) {
		if (x[i]->nbytes && buf != x[i]->data)
			memcpy(buf, x[i]->data, x[i]->nbytes);
		buf += x[i]->nbytes;
	}
}

/* The sums in buf divided by the ranks, into y[0..k) (where present; y[i] may be buf itself). */
static void unpack_mean(char *buf, tern_tensor *const *y, tern_tensor *const *like, int k, int dtype)
{
	double scale = 1.0 / tern_comm_size(); /* exact on one rank */
	for (int i = 0; i < k; i++) {
		int64_t m = tern_tensor_numel(like[i]);
		char *to = y[i] ? y[i]->data : NULL;
		for (int64_t e = 0; to && e < m; e++) {
			if (dtype == TERN_DOUBLE)
				((double *)to)[e] = ((const double *)buf)[e] * scale;
			else
				((float *)to)[e] = (float)(((const float *)buf)[e] * scale);
		}
		buf += like[i]->nbytes;
	}
}

static void expect_dense(int64_t total, size_t es)
{
	int n_ranks = tern_comm_size();
	tern_comm_expect(TERN_COMM_DENSE, 2.0 * (double)total * (double)es * (n_ranks - 1) / n_ranks);
}

/* The elements reduced together, counted when planning (the kernels' params). */
static tern_status plan_total(tern_prepare_args *p, size_t bytes)
{
	int64_t *total = malloc(sizeof *total);
	if (!total)
		return tern_errorf(TERN_EOS, "out of memory");
	*total = (int64_t)(bytes / tern_dtype_size(p->in[0]->dtype));
	p->params = total;
	p->free_params = free;
	return TERN_OK;
}

static tern_status allreduce_kernel(const tern_kernel_args *a)
{
	int dtype = a->in[0]->dtype;
	int64_t total = *(const int64_t *)a->params;
	/* one tensor: reduced where it is to go; several: packed into the scratch */
	char *buf = a->n_in == 1 ? a->out[0]->data : a->scratch;
	pack(buf, a->in, a->n_in);
	expect_dense(total, tern_dtype_size(dtype));
	tern_status st = tern_comm_allreduce(TERN_COMM_DENSE, buf, total, dtype);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	unpack_mean(buf, a->out, a->in, a->n_in, dtype);
	return TERN_OK;
}

static tern_status allreduce_prepare(tern_prepare_args *p)
{
	if (p->n_in < 1 || p->n_out != p->n_in)
		return tern_node_errorf(p->node, TERN_EDATA, "takes k >= 1 tensors and gives k");
	size_t bytes;
	tern_status st = check_reduced(p, 0, &bytes);
	if (st)
		return st;
	for (int i = 0; i < p->n_in; i++)
		if (p->out[i])
			tern_set_shape(p->out[i], p->in[i]->dtype, p->in[i]->rank, p->in[i]->dims);
	if (p->n_in > 1)
		p->scratch_bytes = bytes;
	else
		p->inplace_ok = 1;
	p->kernel = allreduce_kernel;
	return plan_total(p, bytes);
}

/* AllReduceStart(X1..Xk) -> B: the Xi packed into B, whose sum over the ranks is started; B must not
 * be touched until AllReduceWait(B, X1..Xk) -> Y1..Yk, which waits and gives the means (shaped as the
 * Xi, which it reads for nothing else: Yi may take Xi's storage). */
static tern_status allreduce_start_kernel(const tern_kernel_args *a)
{
	int dtype = a->in[0]->dtype;
	int64_t total = *(const int64_t *)a->params;
	pack(a->out[0]->data, a->in, a->n_in);
	expect_dense(total, tern_dtype_size(dtype));
	tern_status st = tern_comm_iallreduce(TERN_COMM_DENSE, a->out[0]->data, total, dtype);
	return st ? tern_node_errorf(a->node, st, "%s", tern_error()) : TERN_OK;
}

static tern_status allreduce_start_prepare(tern_prepare_args *p)
{
	if (p->n_in < 1 || p->n_out != 1 || !p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "takes k >= 1 tensors and gives one buffer");
	size_t bytes;
	tern_status st = check_reduced(p, 0, &bytes);
	if (st)
		return st;
	if ((st = plan_total(p, bytes)))
		return st;
	tern_set_shape(p->out[0], p->in[0]->dtype, 1, (const int64_t *)p->params);
	p->kernel = allreduce_start_kernel;
	return TERN_OK;
}

static tern_status allreduce_wait_kernel(const tern_kernel_args *a)
{
	tern_status st = tern_comm_wait(a->in[0]->data);
	if (st)
		return tern_node_errorf(a->node, st, "%s", tern_error());
	unpack_mean(a->in[0]->data, a->out, a->in + 1, a->n_out, a->in[0]->dtype);
	return TERN_OK;
}

static tern_status allreduce_wait_prepare(tern_prepare_args *p)
{
	if (p->n_in < 2 || p->n_out != p->n_in - 1 || !p->in[0])
		return tern_node_errorf(p->node, TERN_EDATA, "takes a started buffer B and the k tensors it packs, and gives k");
	size_t bytes;
	tern_status st = check_reduced(p, 1, &bytes);
	if (st)
		return st;
	size_t have = (size_t)tern_tensor_numel(p->in[0]) * tern_dtype_size(p->in[0]->dtype);
	if (p->in[0]->dtype != p->in[1]->dtype || have != bytes)
		return tern_node_errorf(p->node, TERN_EDATA, "the buffer B does not hold the k tensors (%zu bytes, not %zu)",
		                        have, bytes);
	for (int i = 1; i < p->n_in; i++) {
		if (p->out[i - 1])
			tern_set_shape(p->out[i - 1], p->in[i]->dtype, p->in[i]->rank, p->in[i]->dims);
		if (i < 32)
			p->inplace_inputs |= 1u << i; /* never read */
	}
	p->kernel = allreduce_wait_kernel;
	return TERN_OK;
}

static const tern_op ops[] = {
        {TERN_DOMAIN_NAME, "AllReduce", 1, 0, allreduce_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "AllReduceStart", 1, 0, allreduce_start_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "AllReduceWait", 1, 0, allreduce_wait_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "Pull", 1, 0, pull_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "Push", 1, 0, push_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "AllGatherRows", 1, 0, allgather_rows_prepare, 0, "distribution"},
        {TERN_DOMAIN_NAME, "RowsToDense", 1, 0, rows_to_dense_prepare, 0, "distribution"},
};

const tern_op_table tern_ops_dist = {ops, TERN_ARRAY_LEN(ops)};
