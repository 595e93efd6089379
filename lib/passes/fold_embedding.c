/* fold_embedding.c — a recurrent layer (RNN, GRU, LSTM) whose input rows are looked up in a constant
 * table, X = Gather(E, tokens) perhaps rearranged by Reshapes and Transposes that keep the last axis:
 * its input projection x W^T + biases is then a lookup too, in P = E W^T + biases, computed once here.
 * The layer becomes tern's operator of the same name with projected = 1, which reads the projections
 * from X instead of computing them at every run. Trades the file's size (P has directions x gates x
 * hidden columns where E has the layer's input size) for the largest matrix product of the layer's
 * first step; P is made only where it is no larger than what it leaves unread (W, and E when the lookup
 * was its only reader), so that the rewrite never grows the weights a run holds: a language model's P
 * (vocabulary x 4 x hidden for an LSTM) is several times E and W together, and folding it cost lstm_lm
 * 5 MB of peak memory for no measurable time (Xeon, one and two threads, 1.031 vs 1.030 ms). */
#include "passes/passes.h"

#include <stdlib.h>

#define FOLD_EMBEDDING_MAX_BYTES ((size_t)64 << 20)
#define MAX_CHAIN 4

static int gates_of(const tern_node *n)
{
	return tern_pass_is(n, "LSTM") ? 4 : tern_pass_is(n, "GRU") ? 3 : tern_pass_is(n, "RNN") ? 1 : 0;
}

/* A Transpose that keeps the last axis last, or a Reshape to a static shape whose last dimension is
 * its input's last: either moves whole rows of the table. */
static bool keeps_rows(tern_pass_ctx *c, const tern_node *n)
{
	const tern_tensor *in = tern_pass_shape(c, n->inputs[0]), *out = tern_pass_shape(c, n->outputs[0]);
	if (!in || !out || in->rank < 1 || out->rank < 1 || n->n_outputs != 1)
		return false;
	if (tern_pass_is(n, "Transpose")) {
		size_t np;
		const int64_t *perm = tern_attr_ints(n, "perm", &np);
		return perm && np == (size_t)in->rank && perm[np - 1] == in->rank - 1;
	}
	return tern_pass_is(n, "Reshape") && n->n_inputs == 2 && tern_pass_is_const(n->inputs[1]) &&
	        in->dims[in->rank - 1] == out->dims[out->rank - 1];
}

/* P[v, d * gh + j] = sum over i of E[v, i] W[d, j, i] + Wb[d, j] + Rb[d, j], but for a GRU with
 * linear_before_reset the candidate's Rb, which the reset gate scales (as the kernel folds them). */
static tern_status project(const tern_tensor *e, const tern_tensor *w, const tern_tensor *b, int64_t hidden, bool lbr,
                           tern_tensor *p)
{
	int64_t vocab = e->dims[0], in = e->dims[1], nd = w->dims[0], gh = w->dims[1];
	int64_t dims[2] = {vocab, nd * gh};
	tern_status st = tern_tensor_alloc(p, TERN_FLOAT, 2, dims);
	if (st)
		return st;
	const float *E = e->data, *W = w->data, *B = b ? b->data : NULL;
	float *P = p->data;
	for (int64_t d = 0; d < nd; d++)
		for (int64_t j = 0; j < gh; j++) {
			const float *wj = W + (d * gh + j) * in;
			float bias =
			        B ? B[d * 2 * gh + j] + (lbr && j >= 2 * hidden ? 0.0f : B[d * 2 * gh + gh + j]) : 0.0f;
			for (int64_t v = 0; v < vocab; v++) {
				const float *ev = E + v * in;
				float acc = 0.0f;
				for (int64_t i = 0; i < in; i++)
					acc += ev[i] * wj[i];
				P[v * nd * gh + d * gh + j] = acc + bias;
			}
		}
	return TERN_OK;
}

static tern_status fold(tern_pass_ctx *c, tern_node *rnn)
{
	int n_gates = gates_of(rnn);
	if (!n_gates || tern_attr_int(rnn, "layout", 0) != 0 || rnn->n_inputs < 3 || !rnn->inputs[1] || !rnn->inputs[2])
		return TERN_OK;
	/* Back from X to the Gather, through single-use row-keeping rearrangements. */
	tern_node *chain[MAX_CHAIN];
	int n_chain = 0;
	tern_value *x = rnn->inputs[0];
	tern_node *g = tern_pass_producer(x, NULL);
	while (g && !tern_pass_is(g, "Gather") && n_chain < MAX_CHAIN && tern_pass_single_use(g->outputs[0]) &&
	       keeps_rows(c, g)) {
		chain[n_chain++] = g;
		g = tern_pass_producer(g->inputs[0], NULL);
	}
	if (!tern_pass_is(g, "Gather") || g->n_inputs != 2 || !g->inputs[1] || tern_attr_int(g, "axis", 0) != 0 ||
	    !tern_pass_single_use(g->outputs[0]))
		return TERN_OK;
	const tern_tensor *e = tern_pass_const(c, g->inputs[0]), *w = tern_pass_const(c, rnn->inputs[1]);
	const tern_tensor *b = rnn->n_inputs > 3 && rnn->inputs[3] ? tern_pass_const(c, rnn->inputs[3]) : NULL;
	const tern_tensor *r = tern_pass_shape(c, rnn->inputs[2]);
	if (!e || !w || !r || e->dtype != TERN_FLOAT || w->dtype != TERN_FLOAT || e->rank != 2 || w->rank != 3 ||
	    r->rank != 3 || w->dims[2] != e->dims[1] || w->dims[1] != n_gates * r->dims[2] ||
	    (rnn->n_inputs > 3 && rnn->inputs[3] && (!b || b->dtype != TERN_FLOAT)))
		return TERN_OK;
	int64_t cols = w->dims[0] * w->dims[1];
	size_t p_bytes = (size_t)e->dims[0] * (size_t)cols * sizeof(float);
	size_t freed = tern_pass_single_use(rnn->inputs[1]) ? w->nbytes : 0;
	if (tern_pass_single_use(g->inputs[0]))
		freed += e->nbytes;
	if (p_bytes > FOLD_EMBEDDING_MAX_BYTES || p_bytes > freed)
		return TERN_OK;
	/* The Reshapes' new shapes: their outputs' with `cols` last (taken before any edit). */
	int64_t shapes[MAX_CHAIN][TERN_MAX_RANK];
	int ranks[MAX_CHAIN];
	for (int k = 0; k < n_chain; k++) {
		const tern_tensor *os = tern_pass_shape(c, chain[k]->outputs[0]);
		ranks[k] = os->rank;
		memcpy(shapes[k], os->dims, (size_t)os->rank * sizeof os->dims[0]);
		shapes[k][os->rank - 1] = cols;
	}
	bool lbr = n_gates == 3 && tern_attr_int(rnn, "linear_before_reset", 0) != 0;
	tern_tensor p = {0};
	tern_status st = project(e, w, b, r->dims[2], lbr, &p);
	tern_value *pv = st ? NULL : tern_pass_add_const(c, g->inputs[0]->name, &p);
	tern_tensor_free(&p);
	if (!pv)
		return st ? st : TERN_EOS;
	if ((st = tern_pass_import_tern(c)))
		return st;

	/* The lookup and the rearrangements again, on rows of `cols` projections. */
	char *name = tern_graph_unique_name(c->graph, g->outputs[0]->name);
	if (!name)
		return tern_errorf(TERN_EOS, "out of memory");
	const char *gin[2] = {pv->name, g->inputs[1]->name}, *gout[1] = {name};
	tern_pass_node ng = {"Gather", NULL, g->name, gin, 2, gout, 1, g, NULL};
	tern_node *made = tern_pass_replace(c, &g, 1, &ng);
	free(name);
	if (!made)
		return TERN_EOS;
	tern_value *cur = made->outputs[0];
	for (int k = n_chain - 1; k >= 0; k--) {
		tern_node *n = chain[k];
		tern_value *shape = NULL;
		if (tern_pass_is(n, "Reshape") &&
		    !(shape = tern_pass_add_ints(c, n->inputs[1]->name, shapes[k], ranks[k])))
			return TERN_EOS;
		if (!(name = tern_graph_unique_name(c->graph, n->outputs[0]->name)))
			return tern_errorf(TERN_EOS, "out of memory");
		const char *in[2] = {cur->name, shape ? shape->name : ""}, *out[1] = {name};
		tern_pass_node nn = {n->op_type, NULL, n->name, in, shape ? 2 : 1, out, 1, n, NULL};
		made = tern_pass_replace(c, &n, 1, &nn);
		free(name);
		if (!made)
			return TERN_EOS;
		cur = made->outputs[0];
	}
	/* The layer: X the projections, W and the biases folded into them (a GRU with linear_before_reset
	 * keeps B for its candidate's recurrent bias). */
	const char *inputs[8], *outputs[3];
	size_t n_in = rnn->n_inputs;
	for (size_t i = 0; i < n_in; i++)
		inputs[i] = rnn->inputs[i] ? rnn->inputs[i]->name : "";
	inputs[0] = cur->name;
	inputs[1] = "";
	if (n_in > 3 && !lbr)
		inputs[3] = "";
	while (n_in > 3 && !*inputs[n_in - 1])
		n_in--; /* no trailing omitted inputs */
	for (size_t o = 0; o < rnn->n_outputs; o++)
		outputs[o] = rnn->outputs[o] ? rnn->outputs[o]->name : "";
	tern_pass_node nr = {rnn->op_type, TERN_DOMAIN, rnn->name, inputs, n_in, outputs, rnn->n_outputs, rnn, NULL};
	tern_node *layer = tern_pass_replace(c, &rnn, 1, &nr);
	return layer ? tern_node_add_attr_int(layer, "projected", 1) : TERN_EOS;
}

static tern_status run(tern_pass_ctx *c)
{
	static const char *const cells[] = {"LSTM", "GRU", "RNN"};
	tern_status st = TERN_OK;
	for (size_t i = 0; i < TERN_ARRAY_LEN(cells) && !st; i++)
		st = tern_pass_each(c, NULL, cells[i], fold);
	return st;
}

const tern_pass tern_pass_fold_embedding = {
        "fold-embedding",
        "fold a constant lookup table into the input projection of the RNN, GRU or LSTM it feeds (tern.LSTM ...)",
        2,
        run,
};
