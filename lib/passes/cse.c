/* cse.c — common-subexpression elimination: identical initializers become one, then a node that repeats
 * an earlier one (same operator, same inputs, same attributes) gives way to it. */
#include "passes/passes.h"

#include <stdlib.h>

static uint64_t fnv(uint64_t h, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* Equal tensors hash alike; candidates are compared in full afterwards, so a big tensor is hashed
 * from samples (its ends and 64 bytes of every 64 KiB): reading gigabytes of weights to find the
 * rare duplicate would cost more than the rest of the optimiser. */
static uint64_t hash_bytes(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = fnv(1469598103934665603ull, (const unsigned char *)&n, sizeof n);
	if (n <= (64u << 10))
		return fnv(h, b, n);
	h = fnv(h, b, 4096);
	for (size_t at = 4096; at + 64 <= n - 4096; at += 64u << 10)
		h = fnv(h, b + at, 64);
	return fnv(h, b + n - 4096, 4096);
}

static bool same_tensor(const tern_tensor *a, const tern_tensor *b)
{
	return a->dtype == b->dtype && a->rank == b->rank && a->nbytes == b->nbytes &&
	        memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0 &&
	        (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
}

typedef struct keyed {
	uint64_t hash;
	tern_value *v;
} keyed;

static int by_hash(const void *x, const void *y)
{
	const keyed *a = x, *b = y;
	if (a->hash != b->hash)
		return a->hash < b->hash ? -1 : 1;
	return (a->v->index > b->v->index) - (a->v->index < b->v->index);
}

static bool mergeable_const(const tern_value *v)
{
	return tern_pass_is_const(v) && !(v->flags & TERN_VALUE_OUTPUT) && !tern_pass_has_implicit_use(v) &&
	        tern_pass_uses(v) > 0;
}

static tern_status merge_initializers(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	keyed *k = malloc((g->n_values + 1) * sizeof *k);
	if (!k)
		return tern_errorf(TERN_EOS, "out of memory");
	size_t n = 0;
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		const tern_tensor *t = mergeable_const(v) ? tern_pass_const(c, v) : NULL;
		if (!t || t->dtype == TERN_STRING)
			continue;
		k[n].hash = hash_bytes(t->data, t->nbytes) ^ hash_bytes(t->dims, (size_t)t->rank * sizeof t->dims[0]) ^
		        (uint64_t)t->dtype;
		k[n++].v = v;
	}
	qsort(k, n, sizeof *k, by_hash);
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		for (; j < n && k[j].hash == k[i].hash; j++) {
			const tern_tensor *a = tern_pass_const(c, k[i].v), *b = tern_pass_const(c, k[j].v);
			if (!a || !b || !same_tensor(a, b))
				continue;
			tern_value_replace_uses(g, k[j].v, k[i].v);
			c->rewritten++;
			c->analyzed = false;
		}
		i = j;
	}
	free(k);
	return TERN_OK;
}

static bool same_attrs(const tern_node *a, const tern_node *b)
{
	const Onnx__NodeProto *pa = a->proto, *pb = b->proto;
	if (pa->n_attribute != pb->n_attribute)
		return false;
	for (size_t i = 0; i < pa->n_attribute; i++) {
		size_t na = onnx__attribute_proto__get_packed_size(pa->attribute[i]);
		size_t nb = onnx__attribute_proto__get_packed_size(pb->attribute[i]);
		if (na != nb)
			return false;
		uint8_t *ba = malloc(na ? na : 1), *bb = malloc(nb ? nb : 1);
		bool same = ba && bb;
		if (same) {
			onnx__attribute_proto__pack(pa->attribute[i], ba);
			onnx__attribute_proto__pack(pb->attribute[i], bb);
			same = memcmp(ba, bb, na) == 0;
		}
		free(ba);
		free(bb);
		if (!same)
			return false;
	}
	return true;
}

static bool candidate(const tern_node *n)
{
	return !n->removed && !n->n_subgraphs && !*n->domain && n->n_outputs > 0 &&
	        strncmp(n->op_type, "Random", 6) != 0 && strcmp(n->op_type, "Bernoulli") != 0 &&
	        strcmp(n->op_type, "Multinomial") != 0;
}

static bool same_node(const tern_node *a, const tern_node *b)
{
	if (strcmp(a->op_type, b->op_type) != 0 || a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
		return false;
	for (size_t i = 0; i < a->n_inputs; i++)
		if (a->inputs[i] != b->inputs[i])
			return false;
	for (size_t o = 0; o < a->n_outputs; o++)
		if ((a->outputs[o] == NULL) != (b->outputs[o] == NULL))
			return false;
	return same_attrs(a, b);
}

/* Replaces `later` by `first` when every output of later can be forwarded. */
static void merge_node(tern_pass_ctx *c, tern_node *first, tern_node *later)
{
	for (size_t o = 0; o < later->n_outputs; o++) {
		tern_value *v = later->outputs[o];
		if (!v)
			continue;
		if ((v->flags & TERN_VALUE_OUTPUT) || tern_pass_has_implicit_use(v))
			return;
	}
	for (size_t o = 0; o < later->n_outputs; o++)
		if (later->outputs[o])
			tern_pass_forward(c, later->outputs[o], first->outputs[o]);
	tern_pass_remove(c, later);
}

static tern_status run(tern_pass_ctx *c)
{
	tern_status st = merge_initializers(c);
	if (st)
		return st;
	tern_graph *g = c->graph;
	tern_node **order = NULL;
	size_t count = 0;
	if ((st = tern_graph_toposort(g, &order, &count)))
		return st;
	size_t *pos = malloc((g->n_nodes + 1) * sizeof *pos);
	if (!pos) {
		free(order);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (size_t i = 0; i < count; i++)
		pos[order[i]->index] = i;
	for (size_t i = 0; i < count; i++) {
		tern_node *n = order[i];
		if (!candidate(n) || !n->n_inputs || !n->inputs[0])
			continue;
		/* An equal earlier node reads the same first input. */
		tern_value *in0 = n->inputs[0];
		for (size_t k = 0; k < in0->n_consumers && !n->removed; k++) {
			tern_node *m = in0->consumers[k];
			if (m == n || !candidate(m) || m->graph != g || pos[m->index] >= i || !same_node(m, n))
				continue;
			merge_node(c, m, n);
		}
	}
	free(pos);
	free(order);
	return TERN_OK;
}

const tern_pass tern_pass_cse = {
        "cse",
        "merge identical initializers and nodes that repeat an earlier computation",
        1,
        run,
};
