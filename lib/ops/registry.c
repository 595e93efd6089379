/* registry.c — the operator registry: every family's table, looked up by domain, name and opset. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

/* Family tables; each family file defines one. */
extern const tern_op_table tern_ops_elementwise, tern_ops_shape, tern_ops_matmul, tern_ops_reduce, tern_ops_rnn,
        tern_ops_misc, tern_ops_control, tern_ops_quant, tern_ops_training;
extern const tern_op_table tern_ops_conv, tern_ops_pool, tern_ops_norm, tern_ops_softmax, tern_ops_resize;
extern const tern_op_table tern_ops_fused, tern_ops_sequence, tern_ops_text, tern_ops_ml, tern_ops_blocked,
        tern_ops_dist;

/* Searched in this order: the first entry that fits wins. */
static const tern_op_table *const families[] = {
        &tern_ops_elementwise, &tern_ops_shape,   &tern_ops_conv,    &tern_ops_pool,     &tern_ops_norm,
        &tern_ops_softmax,     &tern_ops_resize,  &tern_ops_matmul,  &tern_ops_reduce,   &tern_ops_rnn,
        &tern_ops_misc,        &tern_ops_control, &tern_ops_quant,   &tern_ops_training, &tern_ops_fused,
        &tern_ops_sequence,    &tern_ops_text,    &tern_ops_ml,      &tern_ops_blocked,    &tern_ops_dist,
};

bool tern_same_domain(const char *a, const char *b)
{
	/* "" and "ai.onnx" name the same default domain. */
	if (!a || strcmp(a, "ai.onnx") == 0)
		a = "";
	if (!b || strcmp(b, "ai.onnx") == 0)
		b = "";
	return strcmp(a, b) == 0;
}

/* Every entry by name, for tern_op_find (a plan looks up each of its nodes; frames of recursive
 * functions are planned by the thousand): open addressing on a hash of op_type, filled in family
 * order, so that entries of one name are met in the order a search of the families meets them. */
static const tern_op **by_name;
static size_t by_name_cap;
static pthread_once_t by_name_once = PTHREAD_ONCE_INIT;

static void index_by_name(void)
{
	size_t n = 0, cap = 64;
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++)
		n += families[f]->n_ops;
	while (cap < 4 * n)
		cap *= 2;
	const tern_op **t = calloc(cap, sizeof *t);
	if (!t)
		return; /* tern_op_find searches the families instead */
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++)
		for (size_t i = 0; i < families[f]->n_ops; i++) {
			size_t k = (size_t)tern_hash_name(families[f]->ops[i].op_type) & (cap - 1);
			while (t[k])
				k = (k + 1) & (cap - 1);
			t[k] = &families[f]->ops[i];
		}
	by_name = t;
	by_name_cap = cap;
}

static bool fits_opset(const tern_op *op, const char *domain, int64_t opset)
{
	return tern_same_domain(op->domain, domain) && opset >= op->since_version &&
	       (op->until_version == 0 || opset <= op->until_version);
}

const tern_op *tern_op_find(const char *domain, const char *op_type, int64_t opset)
{
	pthread_once(&by_name_once, index_by_name);
	if (by_name) {
		for (size_t k = (size_t)tern_hash_name(op_type) & (by_name_cap - 1); by_name[k]; k = (k + 1) & (by_name_cap - 1))
			if (strcmp(by_name[k]->op_type, op_type) == 0 && fits_opset(by_name[k], domain, opset))
				return by_name[k];
		return NULL;
	}
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++) {
		const tern_op_table *t = families[f];
		for (size_t i = 0; i < t->n_ops; i++) {
			const tern_op *op = &t->ops[i];
			if (strcmp(op->op_type, op_type) == 0 && fits_opset(op, domain, opset))
				return op;
		}
	}
	return NULL;
}

bool tern_op_known(const char *domain, const char *op_type)
{
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++)
		for (size_t i = 0; i < families[f]->n_ops; i++)
			if (strcmp(families[f]->ops[i].op_type, op_type) == 0 &&
			    tern_same_domain(families[f]->ops[i].domain, domain))
				return true;
	return false;
}

size_t tern_op_count(void)
{
	size_t n = 0;
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++)
		n += families[f]->n_ops;
	return n;
}

const tern_op *tern_op_at(size_t i)
{
	for (size_t f = 0; f < TERN_ARRAY_LEN(families); f++) {
		if (i < families[f]->n_ops)
			return &families[f]->ops[i];
		i -= families[f]->n_ops;
	}
	return NULL;
}

const tern_arity *tern_arity_find(const char *domain, const char *op_type, int64_t opset)
{
	/* sorted by domain, name, version: the last version <= opset of the name */
	size_t lo = 0, hi = tern_n_arities;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(tern_arities[mid].domain, domain);
		if (!c)
			c = strcmp(tern_arities[mid].op_type, op_type);
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	const tern_arity *best = NULL;
	for (size_t i = lo; i < tern_n_arities && !strcmp(tern_arities[i].domain, domain) &&
	                    !strcmp(tern_arities[i].op_type, op_type);
	     i++)
		if (tern_arities[i].since_version <= opset)
			best = &tern_arities[i];
	return best;
}
