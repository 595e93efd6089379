/* text.c — operators on text and token sequences: StringNormalizer (stop words and case changes on
 * UTF-8 strings) and TfIdfVectorizer (counts of n-grams, with skips, of integer or string tokens). */
#include "internal.h"

#include <stdlib.h>

static tern_status out_of_memory(const tern_node *node)
{
	return tern_node_errorf(node, TERN_EOS, "out of memory");
}

/* The planner keeps params only from a prepare that succeeds: one that fails frees its own. */
static tern_status drop_params(tern_prepare_args *p, tern_status st)
{
	if (st && p->params) {
		p->free_params(p->params);
		p->params = NULL;
		p->free_params = NULL;
	}
	return st;
}

/* ---------------------------------------------------------------- string sets */

/* Strings to small integers, by open addressing; for stop words and the string pool of n-grams. */
typedef struct str_map {
	char **keys; /* owned; NULL = empty slot */
	int64_t *vals;
	size_t cap; /* a power of two, at least twice the entries */
} str_map;

static uint64_t str_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3u;
	return h;
}

static bool str_map_init(str_map *m, size_t n)
{
	m->cap = 16;
	while (m->cap < 2 * n)
		m->cap *= 2;
	m->keys = calloc(m->cap, sizeof *m->keys);
	m->vals = calloc(m->cap, sizeof *m->vals);
	return m->keys && m->vals;
}

static void str_map_free(str_map *m)
{
	for (size_t i = 0; m->keys && i < m->cap; i++)
		free(m->keys[i]);
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof *m);
}

static size_t str_map_slot(const str_map *m, const char *s)
{
	size_t i = (size_t)str_hash(s) & (m->cap - 1);
	while (m->keys[i] && strcmp(m->keys[i], s) != 0)
		i = (i + 1) & (m->cap - 1);
	return i;
}

/* The value of s, or -1 when absent. */
static int64_t str_map_get(const str_map *m, const char *s)
{
	size_t i = str_map_slot(m, s);
	return m->keys[i] ? m->vals[i] : -1;
}

/* Adds s (taking it) with value v unless present; *val gets the value it has. */
static void str_map_add(str_map *m, char *s, int64_t v, int64_t *val)
{
	size_t i = str_map_slot(m, s);
	if (m->keys[i]) {
		free(s);
	} else {
		m->keys[i] = s;
		m->vals[i] = v;
	}
	if (val)
		*val = m->vals[i];
}

/* Entry i of a STRINGS attribute as a C string (malloc'd); tern's strings end at their first NUL, so
 * an entry holding one could never match and is refused. */
static tern_status attr_strings_at(const tern_node *node, const Onnx__AttributeProto *a, const char *name, size_t i,
                                   char **out)
{
	const ProtobufCBinaryData *b = &a->strings[i];
	if (b->len && memchr(b->data, '\0', b->len))
		return tern_node_errorf(node, TERN_EDATA, "attribute '%s' entry %zu holds a NUL byte", name, i);
	char *s = malloc(b->len + 1);
	if (!s)
		return out_of_memory(node);
	if (b->len)
		memcpy(s, b->data, b->len);
	s[b->len] = '\0';
	*out = s;
	return TERN_OK;
}

/* ---------------------------------------------------------------- case mapping */

/* tern applies Unicode's simple (one character to one) case mapping to the letters of the blocks that
 * most Latin, Greek, Cyrillic and Armenian text uses: ASCII, Latin-1, Latin Extended-A, the regular
 * runs of Extended-B, Greek, Cyrillic and Armenian; the same in every locale it accepts. Other
 * characters (ß, which has no one-character capital; IPA; scripts beyond U+07FF) and bytes that are
 * not valid UTF-8 pass through unchanged. */

/* Upper case [first, last] and lower case [first + delta, last + delta]. */
static const struct {
	uint16_t first, last, delta;
} shifted[] = {
        {0x41, 0x5a, 0x20},   {0xc0, 0xd6, 0x20},   {0xd8, 0xde, 0x20},   {0x386, 0x386, 0x26},
        {0x388, 0x38a, 0x25}, {0x38c, 0x38c, 0x40}, {0x38e, 0x38f, 0x3f}, {0x391, 0x3a1, 0x20},
        {0x3a3, 0x3ab, 0x20}, {0x400, 0x40f, 0x50}, {0x410, 0x42f, 0x20}, {0x531, 0x556, 0x30},
};

/* Ranges where upper and lower case alternate, the upper case on even (odd_upper 0) or odd code points. */
static const struct {
	uint16_t first, last, odd_upper;
} alternating[] = {
        {0x100, 0x12f, 0}, {0x132, 0x137, 0}, {0x139, 0x148, 1}, {0x14a, 0x177, 0}, {0x179, 0x17e, 1},
        {0x1a0, 0x1a5, 0}, {0x1cd, 0x1dc, 1}, {0x1de, 0x1ef, 0}, {0x1f4, 0x1f5, 0}, {0x1f8, 0x21f, 0},
        {0x222, 0x233, 0}, {0x246, 0x24f, 0}, {0x370, 0x373, 0}, {0x376, 0x377, 0}, {0x3d8, 0x3ef, 0},
        {0x460, 0x481, 0}, {0x48a, 0x4bf, 0}, {0x4c1, 0x4ce, 1}, {0x4d0, 0x52f, 0},
};

/* Mappings that go one way only, or pair letters of different ranges. */
static const struct {
	uint16_t from, to, upper; /* upper: from is lower case, to its capital */
} single[] = {
        {0xb5, 0x39c, 1}, {0xff, 0x178, 1},  {0x178, 0xff, 0},  {0x130, 0x69, 0},  {0x131, 0x49, 1},
        {0x17f, 0x53, 1}, {0x3c2, 0x3a3, 1}, {0x4c0, 0x4cf, 0}, {0x4cf, 0x4c0, 1},
};

static uint32_t case_map(uint32_t c, bool upper)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(shifted); i++) {
		uint32_t lo = shifted[i].first, hi = shifted[i].last, d = shifted[i].delta;
		if (!upper && c >= lo && c <= hi)
			return c + d;
		if (upper && c >= lo + d && c <= hi + d)
			return c - d;
	}
	for (size_t i = 0; i < TERN_ARRAY_LEN(alternating); i++)
		if (c >= alternating[i].first && c <= alternating[i].last) {
			bool is_upper = (c & 1u) == alternating[i].odd_upper;
			if (is_upper && !upper)
				return c + 1;
			if (!is_upper && upper)
				return c - 1;
			return c;
		}
	for (size_t i = 0; i < TERN_ARRAY_LEN(single); i++)
		if (c == single[i].from && (single[i].upper != 0) == upper)
			return single[i].to;
	return c;
}

/* s with its case changed (malloc'd; never longer than s, as every mapped letter and its image take
 * one or two bytes and a two-byte letter maps to at most two). */
static char *case_change(const char *s, bool upper)
{
	size_t n = strlen(s);
	char *out = malloc(n + 1);
	if (!out)
		return NULL;
	const unsigned char *p = (const unsigned char *)s;
	unsigned char *q = (unsigned char *)out;
	while (*p) {
		uint32_t c;
		if (*p < 0x80) {
			c = *p++;
		} else if (*p >= 0xc2 && *p <= 0xdf && (p[1] & 0xc0) == 0x80) {
			/* A two-byte sequence (U+0080 to U+07FF), which holds every letter mapped. Other bytes,
			 * including longer sequences whose bytes never look like these, are copied as they are. */
			c = ((uint32_t)(p[0] & 0x1f) << 6) | (p[1] & 0x3f);
			p += 2;
		} else {
			*q++ = *p++;
			continue;
		}
		c = case_map(c, upper);
		if (c < 0x80) {
			*q++ = (unsigned char)c;
		} else {
			*q++ = (unsigned char)(0xc0 | (c >> 6));
			*q++ = (unsigned char)(0x80 | (c & 0x3f));
		}
	}
	*q = '\0';
	return out;
}

/* Whether the case mapping above is right for a locale: "" (the platform's), C, POSIX and names
 * of the form language[_TERRITORY][.codeset][@modifier] (or language-TERRITORY), except the
 * languages whose rules differ from the default ones: Turkish and Azerbaijani (dotted and dotless
 * i) and Lithuanian (i with accents). Strings are UTF-8 whatever the codeset says. */
static tern_status check_locale(const tern_node *node, const char *loc)
{
	if (!*loc || strcmp(loc, "C") == 0 || strcmp(loc, "POSIX") == 0 || strncmp(loc, "C.", 2) == 0)
		return TERN_OK;
	size_t lang = 0;
	while ((loc[lang] >= 'a' && loc[lang] <= 'z') || (loc[lang] >= 'A' && loc[lang] <= 'Z'))
		lang++;
	bool ok = lang >= 2 && lang <= 3 && (!loc[lang] || strchr("_-.@", loc[lang]));
	if (!ok)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'locale' is '%s', not a locale name", loc);
	static const char *const special[] = {"tr", "az", "lt"};
	for (size_t i = 0; i < TERN_ARRAY_LEN(special); i++)
		if (lang == 2 && (loc[0] | 0x20) == special[i][0] && (loc[1] | 0x20) == special[i][1])
			return tern_node_errorf(node, TERN_EDATA,
			                        "locale '%s' is not supported: its case rules differ from the default",
			                        loc);
	return TERN_OK;
}

/* ---------------------------------------------------------------- StringNormalizer */

/* As the spec and onnxruntime have it: a stop word removes the elements equal to it (the ONNX reference
 * instead splits elements at spaces and drops matching words), compared in the output's case, or lower
 * case, unless is_case_sensitive; the remaining elements keep their order, empty strings included, and
 * then change case. */

enum case_action { CASE_NONE, CASE_LOWER, CASE_UPPER };

typedef struct norm_params {
	enum case_action action;
	bool case_sensitive;
	str_map stops; /* as given, or folded to the case compared when case-insensitive */
	size_t n_stops;
} norm_params;

static void norm_free(void *p)
{
	norm_params *np = p;
	str_map_free(&np->stops);
	free(np);
}

/* The case that case-insensitive matching compares in: the one the output takes, lower by default. */
static bool fold_upper(const norm_params *np)
{
	return np->action == CASE_UPPER;
}

static tern_status norm_kernel(const tern_kernel_args *a)
{
	const norm_params *np = a->params;
	const tern_tensor *x = a->in[0];
	tern_tensor *y = a->out[0];
	int64_t n = tern_tensor_numel(x);
	char *const *src = x->data;
	char **kept = calloc((size_t)n + 1, sizeof *kept);
	if (!kept)
		return out_of_memory(a->node);
	int64_t n_kept = 0;
	tern_status rc = TERN_OK;
	for (int64_t i = 0; i < n; i++) {
		const char *s = src[i] ? src[i] : "";
		char *folded = NULL;
		if (np->n_stops && !np->case_sensitive && !(folded = case_change(s, fold_upper(np)))) {
			rc = out_of_memory(a->node);
			break;
		}
		if (np->n_stops && str_map_get(&np->stops, folded ? folded : s) >= 0) {
			free(folded);
			continue;
		}
		char *out;
		if (np->action == CASE_NONE)
			out = tern_strdup(s);
		else if (folded) /* already in the output's case */
			out = folded, folded = NULL;
		else
			out = case_change(s, np->action == CASE_UPPER);
		free(folded);
		if (!out) {
			rc = out_of_memory(a->node);
			break;
		}
		kept[n_kept++] = out;
	}
	/* Every element dropped: the output is one empty string, [1] or [1, 1]. */
	if (!rc && n_kept == 0 && !(kept[n_kept++] = tern_strdup("")))
		rc = out_of_memory(a->node);
	int64_t dims[2] = {1, n_kept};
	if (!rc && (rc = tern_tensor_alloc(y, TERN_STRING, x->rank, x->rank == 1 ? dims + 1 : dims)))
		rc = tern_node_errorf(a->node, rc, "%s", tern_error());
	if (!rc) {
		memcpy(y->data, kept, (size_t)n_kept * sizeof *kept);
	} else {
		for (int64_t i = 0; i < n_kept; i++)
			free(kept[i]);
	}
	free(kept);
	return rc;
}

static tern_status norm_setup(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	char shape[96];
	if (x->dtype != TERN_STRING)
		return tern_node_errorf(node, TERN_EDATA, "input 0 is %s, not string", tern_dtype_name(x->dtype));
	if (!(x->rank == 1 || (x->rank == 2 && x->dims[0] == 1)))
		return tern_node_errorf(node, TERN_EDATA, "input 0 is %s, not [C] or [1, C]",
		                        tern_shape_str(x->dtype, x->rank, x->dims, shape, sizeof shape));
	norm_params *np = calloc(1, sizeof *np);
	if (!np)
		return out_of_memory(node);
	p->params = np;
	p->free_params = norm_free;
	const char *action = tern_attr_string(node, "case_change_action", "NONE");
	if (strcmp(action, "NONE") == 0)
		np->action = CASE_NONE;
	else if (strcmp(action, "LOWER") == 0)
		np->action = CASE_LOWER;
	else if (strcmp(action, "UPPER") == 0)
		np->action = CASE_UPPER;
	else
		return tern_node_errorf(node, TERN_EDATA,
		                        "attribute 'case_change_action' is '%s', not one of NONE, LOWER, UPPER",
		                        action);
	np->case_sensitive = tern_attr_int(node, "is_case_sensitive", 0) != 0;
	tern_status st = check_locale(node, tern_attr_string(node, "locale", "en_US"));
	if (st)
		return st;
	const Onnx__AttributeProto *stops = tern_attr(node, "stopwords");
	np->n_stops = stops ? stops->n_strings : 0;
	if (!str_map_init(&np->stops, np->n_stops))
		return out_of_memory(node);
	for (size_t i = 0; i < np->n_stops; i++) {
		char *w;
		if ((st = attr_strings_at(node, stops, "stopwords", i, &w)))
			return st;
		if (!np->case_sensitive) {
			char *f = case_change(w, fold_upper(np));
			free(w);
			if (!(w = f))
				return out_of_memory(node);
		}
		str_map_add(&np->stops, w, 0, NULL);
	}
	/* How many elements remain depends on their values. */
	int64_t dims[2] = {1, -1};
	tern_set_shape(p->out[0], TERN_STRING, x->rank, x->rank == 1 ? dims + 1 : dims);
	p->dynamic_output = 1;
	p->kernel = norm_kernel;
	return TERN_OK;
}

static tern_status norm_prepare(tern_prepare_args *p)
{
	return drop_params(p, norm_setup(p));
}

/* ---------------------------------------------------------------- TfIdfVectorizer */

/* The pool as a trie over tokens: node 0 is the root, and a node's id is the 1-based number of the
 * n-gram ending there in pool order (0 where only longer n-grams pass). Edges (parent, token) -> child
 * are kept in one open-addressing table. String tokens are first numbered by the pool's string table,
 * a token outside the pool becoming -1, which no edge carries. */
typedef struct trie_edge {
	int64_t token, parent, child; /* child -1: empty slot */
} trie_edge;

enum tfidf_mode { MODE_TF, MODE_IDF, MODE_TFIDF };

typedef struct tfidf_params {
	enum tfidf_mode mode;
	int64_t min_gram, max_gram, max_skip;
	int64_t *node_id; /* per trie node */
	int64_t n_nodes;
	trie_edge *edges;
	size_t cap_edges;
	int64_t *coord; /* output coordinate of n-gram id - 1 (ngram_indexes) */
	int64_t n_grams, out_size;
	const float *weights; /* per output coordinate, or NULL; points into the node's attribute */
	bool strings;
	str_map vocab; /* string pool entries -> token numbers */
} tfidf_params;

static void tfidf_free(void *p)
{
	tfidf_params *tp = p;
	free(tp->node_id);
	free(tp->edges);
	free(tp->coord);
	str_map_free(&tp->vocab);
	free(tp);
}

static size_t edge_slot(const tfidf_params *tp, int64_t parent, int64_t token)
{
	uint64_t h = (uint64_t)token * 0x9e3779b97f4a7c15u ^ (uint64_t)parent * 0xc2b2ae3d27d4eb4fu;
	h ^= h >> 29;
	size_t i = (size_t)h & (tp->cap_edges - 1);
	while (tp->edges[i].child >= 0 && (tp->edges[i].parent != parent || tp->edges[i].token != token))
		i = (i + 1) & (tp->cap_edges - 1);
	return i;
}

/* The child of parent along token, added when absent (there is room: a node per pool entry). */
static int64_t trie_child(tfidf_params *tp, int64_t parent, int64_t token)
{
	trie_edge *e = &tp->edges[edge_slot(tp, parent, token)];
	if (e->child < 0) {
		*e = (trie_edge){token, parent, tp->n_nodes};
		tp->node_id[tp->n_nodes++] = 0;
	}
	return e->child;
}

typedef struct tfidf_run {
	const tfidf_params *tp;
	const tern_tensor *x;
	float *y;
	int64_t *tokens; /* scratch: the input as token numbers */
	int64_t row_len;
} tfidf_run;

static void tfidf_row(void *ctx, int64_t r)
{
	const tfidf_run *run = ctx;
	const tfidf_params *tp = run->tp;
	int64_t c = run->row_len, *tok = c ? run->tokens + r * c : NULL;
	float *y = run->y + r * tp->out_size;
	for (int64_t i = 0; i < c; i++) {
		int64_t at = r * c + i;
		if (tp->strings) {
			const char *s = ((char *const *)run->x->data)[at];
			tok[i] = str_map_get(&tp->vocab, s ? s : "");
		} else {
			tok[i] = run->x->dtype == TERN_INT32 ? ((const int32_t *)run->x->data)[at]
			                                     : ((const int64_t *)run->x->data)[at];
		}
	}
	memset(y, 0, (size_t)tp->out_size * sizeof *y);
	/* Every start and every distance between items (skip + 1) walks the trie as far as it matches,
	 * counting each n-gram of a wanted length met on the way. Unigrams do not depend on the distance,
	 * so after the first distance only n-grams of two items and more are counted. Counts are exact
	 * in float up to 2^24 per cell. */
	int64_t min_len = tp->min_gram;
	for (int64_t dist = 1; dist <= tp->max_skip + 1; dist++) {
		for (int64_t start = 0; start + dist * (min_len - 1) < c; start++) {
			int64_t node = 0;
			for (int64_t len = 1, i = start; len <= tp->max_gram && i < c; len++, i += dist) {
				trie_edge *e = &tp->edges[edge_slot(tp, node, tok[i])];
				if (e->child < 0)
					break;
				node = e->child;
				int64_t id = tp->node_id[node];
				if (len >= min_len && id)
					y[tp->coord[id - 1]] += 1;
			}
		}
		if (min_len == 1 && ++min_len > tp->max_gram)
			break;
	}
	for (int64_t i = 0; i < tp->out_size; i++) {
		double w = tp->weights ? tp->weights[i] : 1.0;
		if (tp->mode == MODE_IDF)
			y[i] = y[i] > 0 ? (float)w : 0.0f;
		else if (tp->mode == MODE_TFIDF)
			y[i] = (float)(w * y[i]);
	}
}

static tern_status tfidf_kernel(const tern_kernel_args *a)
{
	const tfidf_params *tp = a->params;
	const tern_tensor *x = a->in[0];
	int64_t rows = x->rank == 2 ? x->dims[0] : 1, c = x->rank == 0 ? 1 : x->dims[x->rank - 1];
	tfidf_run run = {tp, x, a->out[0]->data, a->scratch, c};
	if (rows * tp->out_size == 0)
		return TERN_OK;
	tern_parallel_for(rows > 1 ? a->pool : NULL, rows, tfidf_row, &run);
	return TERN_OK;
}

/* Reads the pool into the trie: the n-grams of length k + 1 are pool[ngram_counts[k] ..
 * ngram_counts[k + 1]) (the last run to the end), k + 1 tokens each. Ids run through every length,
 * but only lengths within [min_gram, max_gram] go into the trie. */
static tern_status tfidf_load(const tern_node *node, tfidf_params *tp, const Onnx__AttributeProto *pool_s,
                              const int64_t *pool_i, size_t pool_n)
{
	size_t n_counts;
	const int64_t *counts = tern_attr_ints(node, "ngram_counts", &n_counts);
	if (!tern_attr(node, "ngram_counts"))
		return tern_node_errorf(node, TERN_EDATA, "attribute 'ngram_counts' is required");
	int64_t *tokens = calloc(pool_n + 1, sizeof *tokens);
	tp->node_id = calloc(pool_n + 1, sizeof *tp->node_id);
	tp->cap_edges = 16;
	while (tp->cap_edges < 2 * (pool_n + 1))
		tp->cap_edges *= 2;
	tp->edges = malloc(tp->cap_edges * sizeof *tp->edges);
	if (!tokens || !tp->node_id || !tp->edges || (pool_s && !str_map_init(&tp->vocab, pool_n))) {
		free(tokens);
		return out_of_memory(node);
	}
	for (size_t i = 0; i < tp->cap_edges; i++)
		tp->edges[i].child = -1;
	tp->n_nodes = 1;
	tern_status st = TERN_OK;
	for (size_t i = 0; i < pool_n && !st; i++) {
		char *s;
		if (!pool_s)
			tokens[i] = pool_i[i];
		else if (!(st = attr_strings_at(node, pool_s, "pool_strings", i, &s)))
			str_map_add(&tp->vocab, s, (int64_t)i, &tokens[i]);
	}
	for (size_t k = 0; k < n_counts && !st; k++)
		if (counts[k] < (k ? counts[k - 1] : 0) || counts[k] > (int64_t)pool_n)
			st = tern_node_errorf(
			        node, TERN_EDATA,
			        "attribute 'ngram_counts' entry %zu is %lld: the starts must not decrease "
			        "and must lie within the pool of %zu",
			        k, (long long)counts[k], pool_n);
	int64_t id = 0;
	for (size_t k = 0; k < n_counts && !st; k++) {
		int64_t begin = counts[k], end = k + 1 < n_counts ? counts[k + 1] : (int64_t)pool_n,
		        len = (int64_t)k + 1;
		if ((end - begin) % len) {
			st = tern_node_errorf(node, TERN_EDATA,
			                      "the %lld-grams take %lld pool entries, not a multiple of %lld",
			                      (long long)len, (long long)(end - begin), (long long)len);
			break;
		}
		bool wanted = len >= tp->min_gram && len <= tp->max_gram;
		for (int64_t g = begin; g < end; g += len) {
			id++;
			if (!wanted)
				continue;
			int64_t at = 0;
			for (int64_t j = 0; j < len; j++)
				at = trie_child(tp, at, tokens[g + j]);
			tp->node_id[at] = id; /* a repeated n-gram counts under its last id */
		}
	}
	free(tokens);
	tp->n_grams = id;
	return st;
}

static tern_status tfidf_setup(tern_prepare_args *p)
{
	const tern_node *node = p->node;
	const tern_tensor *x = p->in[0];
	char shape[96];
	tfidf_params *tp = calloc(1, sizeof *tp);
	if (!tp)
		return out_of_memory(node);
	p->params = tp;
	p->free_params = tfidf_free;
	static const char *const required[] = {"mode", "min_gram_length", "max_gram_length", "max_skip_count",
	                                       "ngram_indexes"};
	for (size_t i = 0; i < TERN_ARRAY_LEN(required); i++)
		if (!tern_attr(node, required[i]))
			return tern_node_errorf(node, TERN_EDATA, "attribute '%s' is required", required[i]);
	const char *mode = tern_attr_string(node, "mode", "");
	if (strcmp(mode, "TF") == 0)
		tp->mode = MODE_TF;
	else if (strcmp(mode, "IDF") == 0)
		tp->mode = MODE_IDF;
	else if (strcmp(mode, "TFIDF") == 0)
		tp->mode = MODE_TFIDF;
	else
		return tern_node_errorf(node, TERN_EDATA, "attribute 'mode' is '%s', not one of TF, IDF, TFIDF", mode);
	tp->min_gram = tern_attr_int(node, "min_gram_length", 0);
	tp->max_gram = tern_attr_int(node, "max_gram_length", 0);
	tp->max_skip = tern_attr_int(node, "max_skip_count", 0);
	if (tp->min_gram < 1 || tp->max_gram < tp->min_gram || tp->max_skip < 0)
		return tern_node_errorf(node, TERN_EDATA,
		                        "min_gram_length %lld, max_gram_length %lld and max_skip_count %lld must "
		                        "satisfy 1 <= min <= max and skips >= 0",
		                        (long long)tp->min_gram, (long long)tp->max_gram, (long long)tp->max_skip);

	const Onnx__AttributeProto *pool_s = tern_attr(node, "pool_strings");
	size_t pool_n = 0;
	const int64_t *pool_i = tern_attr_ints(node, "pool_int64s", &pool_n);
	if (pool_s && tern_attr(node, "pool_int64s"))
		return tern_node_errorf(node, TERN_EDATA, "attributes 'pool_strings' and 'pool_int64s' are both set");
	if (!pool_s && !tern_attr(node, "pool_int64s"))
		return tern_node_errorf(node, TERN_EDATA,
		                        "one of attributes 'pool_strings' and 'pool_int64s' is required");
	tp->strings = pool_s != NULL;
	if (pool_s)
		pool_n = pool_s->n_strings;
	if (tp->strings ? x->dtype != TERN_STRING : (x->dtype != TERN_INT32 && x->dtype != TERN_INT64))
		return tern_node_errorf(node, TERN_EDATA, "input 0 is %s; with %s it must be %s",
		                        tern_dtype_name(x->dtype), tp->strings ? "pool_strings" : "pool_int64s",
		                        tp->strings ? "string" : "int32 or int64");
	if (x->rank > 2)
		return tern_node_errorf(node, TERN_EDATA, "input 0 is %s, not [C] or [N, C]",
		                        tern_shape_str(x->dtype, x->rank, x->dims, shape, sizeof shape));
	tern_status st = tfidf_load(node, tp, pool_s, pool_i, pool_n);
	if (st)
		return st;

	size_t n_idx;
	const int64_t *idx = tern_attr_ints(node, "ngram_indexes", &n_idx);
	if ((int64_t)n_idx != tp->n_grams)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'ngram_indexes' has %zu entries for %lld n-grams",
		                        n_idx, (long long)tp->n_grams);
	if (!(tp->coord = malloc((n_idx + 1) * sizeof *tp->coord)))
		return out_of_memory(node);
	tp->out_size = 0;
	for (size_t i = 0; i < n_idx; i++) {
		if (idx[i] < 0 || idx[i] >= ((int64_t)1 << 40))
			return tern_node_errorf(node, TERN_EDATA,
			                        "attribute 'ngram_indexes' entry %zu is %lld, not an output coordinate",
			                        i, (long long)idx[i]);
		tp->coord[i] = idx[i];
		if (idx[i] + 1 > tp->out_size)
			tp->out_size = idx[i] + 1;
	}
	/* onnxruntime and the ONNX reference weigh output coordinates (weights[j] scales Y[..., j]), which
	 * is the spec's "weight of the i-th n-gram" when ngram_indexes numbers the pool in order. */
	size_t n_w;
	const float *w = tern_attr_floats(node, "weights", &n_w);
	if (tern_attr(node, "weights") && (int64_t)n_w < tp->out_size)
		return tern_node_errorf(node, TERN_EDATA, "attribute 'weights' has %zu entries for %lld outputs", n_w,
		                        (long long)tp->out_size);
	tp->weights = w;

	int64_t dims[2] = {x->rank == 2 ? x->dims[0] : 1, tp->out_size};
	tern_set_shape(p->out[0], TERN_FLOAT, x->rank == 2 ? 2 : 1, x->rank == 2 ? dims : dims + 1);
	p->scratch_bytes = (size_t)tern_tensor_numel(x) * sizeof(int64_t);
	p->kernel = tfidf_kernel;
	return TERN_OK;
}

static tern_status tfidf_prepare(tern_prepare_args *p)
{
	return drop_params(p, tfidf_setup(p));
}

/* ---------------------------------------------------------------- table */

static const tern_op ops[] = {
        {"", "StringNormalizer", 10, 0, norm_prepare, TERN_DT(STRING), "text"},
        {"", "TfIdfVectorizer", 9, 0, tfidf_prepare, TERN_DT(STRING) | TERN_DT(INT32) | TERN_DT(INT64), "text"},
};

const tern_op_table tern_ops_text = {ops, TERN_ARRAY_LEN(ops)};
