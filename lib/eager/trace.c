/* trace.c — eager calls recorded step by step and merged into one graph (tern_eager.h, tern-trace(1)).
 *
 * Recording. Every call of a traced step is an operation: its site (the stack the host gives, and
 * how many times that stack has called before in the step, so that loop iterations are told apart),
 * its operator and attributes, and per input where the value came from: an earlier operation of the
 * step (tensors carry a stamp, trace.h), or outside it (an external read: the tensor's serial
 * number, when it was made, and a hash of its bytes). Fetches mark outputs the host read; assignments
 * bind a tensor made before the trace to the value that overwrote its bytes.
 *
 * Merging. Steps whose operations agree one for one (site, operator, attributes, where each input
 * comes from) are one path. One path is a linear graph. Several paths share their longest common
 * prefix and suffix; what lies between becomes one case per path of an If chain on the fed scalar
 * tern_path (the path's number); suffix inputs that differ between paths, fetched values and updates
 * made between come out of the If (a case without one gives an empty tensor, or the state itself).
 *
 * External reads, by the graph input they stand for (a node's input, over all steps that ran it):
 * one tensor made before tracing, whose bytes never changed: an initializer (const_N); the same, but
 * updated by an assignment: a state initializer (state_N) that training_info updates; anything
 * else (made by the host during the steps, carried from one step to the next, changed in place by
 * the host): a graph input (feed_N), one per distinct sequence of tensors over the steps. */
#include "eager/trace.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { IN_NONE, IN_OP, IN_EXT };

typedef struct t_in {
	int kind;
	int32_t op, out; /* IN_OP */
	int32_t ext;     /* IN_EXT: index in the step's ext */
} t_in;

typedef struct t_op {
	const char *site; /* interned: the trace's */
	const char *stack; /* interned: the site's stack, without its occurrence */
	uint64_t key; /* the host's key for that stack (site_key); 0: none */
	char *domain, *op_type;
	Onnx__AttributeProto **attrs;
	int n_attrs;
	uint64_t attr_hash;
	uint64_t sig; /* the eager call's signature (operator, attributes, input shapes); 0: none */
	int n_in, n_out;
	t_in *in;
	int *dtype, *rank;
	int64_t *dims; /* n_out x TERN_MAX_RANK */
	uint8_t *fetched;
	tern_tensor *fetch_value; /* with record_dir: the fetched outputs' values */
	bool borrowed; /* site, domain, op_type and attrs are those of the graph's operation it matched */
	/* a path's first step's operation: per output, a bit per dimension that differs between the path's
	 * steps (symbolic in the graph), as of the trace's paths_gen varies_gen */
	uint8_t *varies;
	uint64_t varies_gen;
} t_op;

typedef struct t_ext {
	uint64_t serial;
	int64_t born;
	uint64_t hash;
	int dtype, rank;
	int64_t dims[TERN_MAX_RANK];
	tern_tensor value; /* a copy: the first read of each serial (initializers), every read with record_dir */
	bool frozen; /* --trace-only: made by the host in the first step, not its input: value is replayed */
} t_ext;

typedef struct t_bind {
	uint64_t serial;
	int32_t op, out;
} t_bind;

typedef struct t_site {
	const char *stack; /* interned (struct tern_trace's texts): compared by address */
	int count;
} t_site;

/* Interned strings: one copy of every distinct text, found by its hash (texts), or by the host's key
 * for the stack (keys: site_key), or as a stack's text with an occurrence ("stack#3", sites). */
typedef struct t_intern {
	uint64_t key; /* keys: the host's; texts: the text's hash; sites: of ref and occ */
	const char *ref; /* keys: the text (a texts entry); texts: the text; sites: the stack (a texts entry) */
	char *text; /* texts and sites: owned (sites: "stack#occ"); keys: NULL */
	int occ; /* sites: the occurrence */
} t_intern;

typedef struct t_table {
	t_intern *slots;
	size_t cap, n;
} t_table;

/* Memory for a step's operations' small arrays, given back with the step. */
typedef struct t_chunk {
	struct t_chunk *next;
	size_t cap, used;
	_Alignas(16) char data[];
} t_chunk;

typedef struct t_step {
	t_op *ops;
	size_t n_ops, cap_ops;
	t_chunk *chunks;
	t_ext *ext;
	size_t n_ext, cap_ext;
	t_bind *binds;
	size_t n_binds, cap_binds;
	uint64_t bound[4]; /* a bit per bind's serial (bind_bit): a read whose bit is clear looks no further */
	t_site *sites; /* open addressing */
	size_t cap_sites, n_sites;
	size_t counted; /* the operations whose stacks sites counts (those after took their path's sites) */
	/* lazy operations: the current path's (lazy_op), whose slots hold only a NULL site and in (NULL,
	 * or their inputs where one is a read: t_in.ext differs from the path's), until step_materialize.
	 * The current path does not change while there are any: checking another path makes them first. */
	size_t n_lazy;
	int path;
	int64_t number; /* a checked step's number in the run (tern_trace_step_begin's count) */
} t_step;

struct tern_trace {
	tern_ctx *ctx;
	char *path, *record_dir;
	int want_steps, verbose;
	int (*site)(void *user, char *buf, size_t size);
	uint64_t (*site_key)(void *user);
	void *user;
	t_table keys, texts, sites; /* interned call sites */
	t_step *steps;
	size_t n_steps, cap_steps;
	t_step implicit; /* calls before any step: the graph of a program that never calls one */
	t_step spare; /* the arrays of the last checked step that matched, empty, for the next */
	int in_step, written, explicit_steps;
	/* --coexec (checking): later steps are recorded and checked against the graph's paths as they go;
	 * one that diverges joins the trace and its paths at once (stale: the graph is made again and
	 * written at tern_trace_finish; making it took 15-30 ms a divergence on memory_bank, most of a
	 * diverged step's time) */
	int coexec, checking, diverged, stale;
	size_t traced; /* the steps traced before checking began */
	/* the paths the step may still take, checked lazily: only the current one (cur) at every
	 * operation, another from where it was last checked (upto) once the current one fails. Checking
	 * every path at every operation had cost memory_bank (40 paths sharing most operations) a third
	 * of its recording. */
	uint8_t *alive;
	size_t *upto;
	int cur;
	int *path_rep, n_paths; /* per path of the graph written: its first step */
	uint64_t paths_gen; /* counts changes to the steps' paths (t_op.varies) */
	struct lazy_fetch {
		int32_t op, out;
	} *lf; /* fetches of lazy operations, until they are made */
	size_t n_lf, cap_lf;
	int64_t coexecuted, fell_back, replans, steps_begun;
	char divergence[512];
	tern_status error;
	/* --trace-only: later steps replay the first one's operations, unchecked */
	int replay, replay_step, in_exec;
	size_t rpos;
	tern_var **rvals; /* per operation of the first step, per output: its value in this replay */
	size_t *roff;
	tern_var **rfrozen; /* per external read of the first step: the constant it is replayed as */
	int64_t replayed, beyond;
	/* the first value read of every serial made before tracing (or a gradient rule's constant, made
	 * afresh at every step), for initializers; found through first_slot (open addressing, indices + 1,
	 * 0 empty). A checked step that matched gives back those it added and did not bind: nothing refers
	 * to them, and they had grown by ten a step on memory_bank, each read scanning them all. */
	struct {
		uint64_t serial;
		tern_tensor value;
		int bound;
	} *firsts;
	size_t n_firsts, cap_firsts, firsts_mark;
	int32_t *first_slot;
	size_t first_cap;
};

/* ---------------------------------------------------------------- small helpers */

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
	return tern_hash_bytes(p, n, h);
}

/* A hash of a tensor's bytes, for telling whether they changed between steps: four independent lanes
 * of 64-bit words (FNV's byte at a time costs a cycle a byte, which over every parameter read in
 * every checked step was a third of co-execution's overhead), the tail and the lanes folded by fnv. */
static uint64_t bytes_hash(const void *p, size_t n, uint64_t h)
{
	const uint8_t *b = p;
	uint64_t lane[4] = {h, h ^ 0x9e3779b97f4a7c15ull, h + 0x632be59bd9b4e019ull, ~h};
	size_t i = 0;
	for (; i + 32 <= n; i += 32)
		for (int k = 0; k < 4; k++) {
			uint64_t w;
			memcpy(&w, b + i + 8 * k, sizeof w);
			lane[k] = (lane[k] ^ w) * 0xff51afd7ed558ccdull;
			lane[k] ^= lane[k] >> 29;
		}
	return fnv(b + i, n - i, fnv(lane, sizeof lane, h));
}

static void op_free(t_op *o)
{
	if (!o->borrowed) { /* the site is interned: the trace's */
		free(o->domain);
		free(o->op_type);
		for (int k = 0; k < o->n_attrs; k++)
			onnx__attribute_proto__free_unpacked(o->attrs[k], &tern_pb_allocator);
		free(o->attrs);
	}
	/* dims, in, dtype, rank and fetched are one block of the step's chunks */
	if (o->fetch_value)
		for (int k = 0; k < o->n_out; k++)
			tern_tensor_free(&o->fetch_value[k]);
	free(o->fetch_value);
}

/* A step joining the trace: its operations' own copies of what they borrowed from the graph's
 * operation they matched (tern_trace_op), whose step may later be left out of the graph and freed. */
static tern_status step_own(t_step *s)
{
	for (size_t i = 0; i < s->n_ops; i++) {
		t_op *o = &s->ops[i];
		if (!o->borrowed)
			continue;
		char *domain = tern_strdup(o->domain), *op_type = tern_strdup(o->op_type);
		Onnx__AttributeProto **attrs = calloc((size_t)o->n_attrs + 1, sizeof *attrs);
		int n = 0;
		while (attrs && n < o->n_attrs && (attrs[n] = tern_pb_copy(o->attrs[n])))
			n++;
		if (!domain || !op_type || !attrs || n < o->n_attrs) {
			free(domain);
			free(op_type);
			for (int k = 0; k < n; k++)
				onnx__attribute_proto__free_unpacked(attrs[k], &tern_pb_allocator);
			free(attrs);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		o->domain = domain;
		o->op_type = op_type;
		o->attrs = attrs;
		o->borrowed = false;
	}
	return TERN_OK;
}

/* What a step's operations and reads own (not the arrays that hold them). */
static void step_values_free(t_step *s)
{
	for (size_t i = 0; i < s->n_ops; i++)
		if (!s->n_lazy || s->ops[i].site) /* a lazy operation owns nothing */
			op_free(&s->ops[i]);
	for (size_t i = 0; i < s->n_ext; i++)
		tern_tensor_free(&s->ext[i].value);
}

static void step_free(t_step *s)
{
	step_values_free(s);
	free(s->ops);
	free(s->ext);
	free(s->binds);
	free(s->sites);
	for (t_chunk *k = s->chunks, *next; k; k = next) {
		next = k->next;
		free(k);
	}
	memset(s, 0, sizeof *s);
}

/* n bytes, cleared, from the step's chunks. */
static void *step_alloc(t_step *s, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	t_chunk *k = s->chunks;
	if (!k || k->used + n > k->cap) {
		size_t cap = n > 65536 ? n : 65536;
		if (!(k = malloc(sizeof *k + cap)))
			return NULL;
		k->next = s->chunks;
		k->cap = cap;
		k->used = 0;
		s->chunks = k;
	}
	void *p = k->data + k->used;
	k->used += n;
	memset(p, 0, n);
	return p;
}

/* A checked step that matched goes, its arrays kept for the next: a step of 600 calls had grown its
 * operations' array and its sites' table afresh each time, and made a block per call. */
static void step_recycle(struct tern_trace *t, t_step *s)
{
	step_values_free(s);
	for (t_chunk *k = s->chunks ? s->chunks->next : NULL, *next; k; k = next) {
		next = k->next;
		free(k);
	}
	if (s->chunks) {
		s->chunks->next = NULL;
		s->chunks->used = 0;
	}
	if (s->sites)
		memset(s->sites, 0, s->cap_sites * sizeof *s->sites);
	step_free(&t->spare);
	t->spare = (t_step){.ops = s->ops, .cap_ops = s->cap_ops, .chunks = s->chunks, .ext = s->ext,
	                    .cap_ext = s->cap_ext, .binds = s->binds, .cap_binds = s->cap_binds, .sites = s->sites,
	                    .cap_sites = s->cap_sites};
	memset(s, 0, sizeof *s);
}

/* The values of the replay running, given back at the end of its step. */
static void replay_release(struct tern_trace *t)
{
	if (t->rvals && t->n_steps) {
		const t_step *s = &t->steps[0];
		for (size_t i = 0; i < t->roff[s->n_ops]; i++)
			tern_var_unref(t->rvals[i]);
		memset(t->rvals, 0, t->roff[s->n_ops] * sizeof *t->rvals);
	}
	t->rpos = 0;
	t->replay_step = 0;
}

/* --trace-only: the constant that external read k of the first step is replayed as. */
static tern_status frozen_value(struct tern_trace *t, int32_t k, tern_var **out)
{
	const t_step *s = &t->steps[0];
	if (!t->rfrozen && !(t->rfrozen = calloc(s->n_ext + 1, sizeof *t->rfrozen)))
		return tern_errorf(TERN_EOS, "out of memory");
	const tern_tensor *v = &s->ext[k].value;
	if (!t->rfrozen[k]) {
		tern_status st = tern_var_from(t->ctx, v->dtype, v->rank, v->dims, v->data, &t->rfrozen[k]);
		if (st)
			return st;
	}
	*out = t->rfrozen[k];
	return TERN_OK;
}

tern_status tern_trace_replay(tern_ctx *c, Onnx__AttributeProto *const *attrs, int n_attrs, tern_var *const *in,
                              int n_in, tern_var **outv, int n_out, bool *handled)
{
	struct tern_trace *t = tern_ctx_trace(c);
	*handled = false;
	(void)attrs, (void)n_attrs;
	if (!t || !t->replay_step || t->in_exec || !t->n_steps)
		return TERN_OK;
	const t_step *s = &t->steps[0];
	if (t->rpos >= s->n_ops) { /* past the first step's operations: eager */
		t->beyond++;
		return TERN_OK;
	}
	if (!t->rvals) {
		t->roff = calloc(s->n_ops + 1, sizeof *t->roff);
		for (size_t j = 0; t->roff && j < s->n_ops; j++)
			t->roff[j + 1] = t->roff[j] + (size_t)s->ops[j].n_out;
		t->rvals = t->roff ? calloc(t->roff[s->n_ops] + 1, sizeof *t->rvals) : NULL;
		if (!t->rvals)
			return tern_errorf(TERN_EOS, "out of memory");
	}
	/* the first step's operation at this position, on the values the replay gave (operations' outputs)
	 * or the host's tensors at the same input positions (what the graph would be fed): no check */
	const t_op *o = &s->ops[t->rpos];
	tern_var *x[65] = {0}, *y[65] = {0};
	tern_var *detached[65] = {0};
	for (int i = 0; i < o->n_in && i < 64; i++) {
		x[i] = o->in[i].kind == IN_OP ? t->rvals[t->roff[o->in[i].op] + (size_t)o->in[i].out]
		       : o->in[i].kind == IN_EXT && i < n_in ? in[i]
		                                             : NULL;
		if (o->in[i].kind == IN_EXT && s->ext[o->in[i].ext].frozen) {
			tern_status st = frozen_value(t, o->in[i].ext, &x[i]);
			if (st)
				return st;
		}
		/* the program detached it (the tracer sees one value): so does the replay */
		if (x[i] && o->in[i].kind == IN_OP && i < n_in && in[i] && !tern_var_requires_grad(in[i]) &&
		    tern_var_requires_grad(x[i]))
			x[i] = detached[i] = tern_var_detach(x[i]);
		/* a parameter read after its update in the step: the trace has the update's value, the
		 * program the parameter itself, whose bytes hold it, and which gradients flow to */
		else if (x[i] && o->in[i].kind == IN_OP && i < n_in && in[i] && tern_var_requires_grad(in[i]) &&
		         tern_var_is_leaf(in[i]) && !tern_var_requires_grad(x[i]))
			x[i] = in[i];
	}
	t->in_exec = 1;
	tern_status st = tern_eager_call_protos(c, o->domain, o->op_type, x, o->n_in, o->attrs, o->n_attrs, y, o->n_out);
	t->in_exec = 0;
	for (int i = 0; i < o->n_in && i < 64; i++)
		tern_var_unref(detached[i]);
	if (st)
		return st;
	for (int k = 0; k < o->n_out; k++)
		t->rvals[t->roff[t->rpos] + (size_t)k] = y[k];
	for (int k = 0; k < n_out; k++)
		outv[k] = k < o->n_out && y[k] ? tern_var_ref(y[k]) : NULL;
	t->rpos++;
	t->replayed++;
	*handled = true;
	return TERN_OK;
}

void tern_trace_free(struct tern_trace *t)
{
	if (!t)
		return;
	replay_release(t);
	for (size_t i = 0; t->rfrozen && t->n_steps && i < t->steps[0].n_ext; i++)
		tern_var_unref(t->rfrozen[i]);
	free(t->rfrozen);
	free(t->rvals);
	free(t->roff);
	free(t->path_rep);
	free(t->lf);
	free(t->alive);
	free(t->upto);
	for (size_t i = 0; i < t->n_steps; i++)
		step_free(&t->steps[i]);
	free(t->steps);
	step_free(&t->implicit);
	step_free(&t->spare);
	for (size_t i = 0; i < t->n_firsts; i++)
		tern_tensor_free(&t->firsts[i].value);
	free(t->firsts);
	free(t->first_slot);
	free(t->path);
	free(t->record_dir);
	for (size_t i = 0; i < t->texts.cap; i++)
		free(t->texts.slots[i].text);
	for (size_t i = 0; i < t->sites.cap; i++)
		free(t->sites.slots[i].text);
	free(t->keys.slots);
	free(t->texts.slots);
	free(t->sites.slots);
	free(t);
}

static t_step *current(struct tern_trace *t)
{
	if (t->in_step)
		return &t->steps[t->n_steps - 1];
	if (!t->explicit_steps && !t->written)
		return &t->implicit;
	return NULL;
}

static size_t ptr_hash(const void *p)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
	return (size_t)(h ^ h >> 32);
}

/* How many times this stack (interned) has called before in the step (then counts this call). */
static int occurrence(t_step *s, const char *stack)
{
	if (s->n_sites * 2 >= s->cap_sites) {
		size_t cap = s->cap_sites ? s->cap_sites * 2 : 256;
		t_site *n = calloc(cap, sizeof *n);
		if (!n)
			return -1;
		for (size_t i = 0; i < s->cap_sites; i++) {
			if (!s->sites[i].stack)
				continue;
			size_t h = ptr_hash(s->sites[i].stack) & (cap - 1);
			while (n[h].stack)
				h = (h + 1) & (cap - 1);
			n[h] = s->sites[i];
		}
		free(s->sites);
		s->sites = n;
		s->cap_sites = cap;
	}
	size_t h = ptr_hash(stack) & (s->cap_sites - 1);
	while (s->sites[h].stack && s->sites[h].stack != stack)
		h = (h + 1) & (s->cap_sites - 1);
	if (!s->sites[h].stack) {
		s->sites[h].stack = stack;
		s->n_sites++;
	}
	return s->sites[h].count++;
}

/* The slot of table b that holds key (texts: and text; sites: stack ref and occ), or the empty one
 * where it goes. Tables are kept at most half full. */
static t_intern *table_find(t_table *b, uint64_t key, const char *ref, int occ, bool by_text)
{
	size_t mask = b->cap - 1, h = (size_t)(key ^ key >> 29) & mask;
	for (;; h = (h + 1) & mask) {
		t_intern *e = &b->slots[h];
		if (!e->ref || (e->key == key && e->occ == occ && (!ref || (by_text ? !strcmp(e->ref, ref) : e->ref == ref))))
			return e;
	}
}

static bool table_room(t_table *b)
{
	if ((b->n + 1) * 2 <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap * 2 : 256;
	t_intern *n = calloc(cap, sizeof *n);
	if (!n)
		return false;
	for (size_t i = 0; i < b->cap; i++)
		if (b->slots[i].ref) {
			size_t h = (size_t)(b->slots[i].key ^ b->slots[i].key >> 29) & (cap - 1);
			while (n[h].ref)
				h = (h + 1) & (cap - 1);
			n[h] = b->slots[i];
		}
	free(b->slots);
	b->slots = n;
	b->cap = cap;
	return true;
}

/* The interned copy of a stack's text. */
static const char *intern_text(struct tern_trace *t, const char *text)
{
	uint64_t h = fnv(text, strlen(text), 0xcbf29ce484222325ull);
	if (!table_room(&t->texts))
		return NULL;
	t_intern *e = table_find(&t->texts, h, text, 0, true);
	if (!e->ref) {
		if (!(e->text = tern_strdup(text)))
			return NULL;
		e->ref = e->text;
		e->key = h;
		t->texts.n++;
	}
	return e->ref;
}

/* The interned "stack#occurrence" of an interned stack: the operation's site. */
static const char *intern_site(struct tern_trace *t, const char *stack, int occ)
{
	uint64_t h = (uint64_t)ptr_hash(stack) * 31 + (uint64_t)occ;
	if (!table_room(&t->sites))
		return NULL;
	t_intern *e = table_find(&t->sites, h, stack, occ, false);
	if (e->ref)
		return e->text;
	size_t len = strlen(stack);
	char *site = malloc(len + 24);
	if (!site)
		return NULL;
	memcpy(site, stack, len);
	site[len] = '#';
	tern_put_uint(site + len + 1, (unsigned)occ);
	e->key = h;
	e->occ = occ;
	e->ref = stack;
	e->text = site;
	t->sites.n++;
	return site;
}

static void default_site(char *buf, size_t size, const void *ret);

/* The interned text of the current call's stack: by the host's key for it when it gives one (a few
 * loads a frame, where the text costs its copy and hash at every call), else by its text. */
static const char *stack_now(struct tern_trace *t, uint64_t key)
{
	char stack[4096];
	t_intern *e = NULL;
	if (key) {
		if (!table_room(&t->keys))
			return NULL;
		e = table_find(&t->keys, key, NULL, 0, false);
		if (e->ref)
			return e->ref;
	}
	stack[0] = 0;
	if (t->site)
		t->site(t->user, stack, sizeof stack);
	else
		default_site(stack, sizeof stack, tern_ctx_c_site(t->ctx));
	const char *text = intern_text(t, stack);
	if (e && text) {
		e->key = key;
		e->ref = text;
		t->keys.n++;
	}
	return text;
}

static void default_site(char *buf, size_t size, const void *ret)
{
	Dl_info info;
	if (ret && dladdr(ret, &info) && info.dli_fname)
		snprintf(buf, size, "%s+0x%lx", info.dli_fname, (unsigned long)((const char *)ret - (const char *)info.dli_fbase));
	else
		snprintf(buf, size, "%p", ret);
}

static size_t serial_slot(uint64_t serial, size_t cap)
{
	return (size_t)((serial * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

static int first_index(struct tern_trace *t, uint64_t serial)
{
	if (!t->first_cap)
		return -1;
	for (size_t h = serial_slot(serial, t->first_cap);; h = (h + 1) & (t->first_cap - 1)) {
		int32_t i = t->first_slot[h] - 1;
		if (i < 0)
			return -1;
		if (t->firsts[i].serial == serial)
			return i;
	}
}

/* Places firsts[i] in the index. */
static void first_slot_put(struct tern_trace *t, size_t i)
{
	size_t h = serial_slot(t->firsts[i].serial, t->first_cap);
	while (t->first_slot[h])
		h = (h + 1) & (t->first_cap - 1);
	t->first_slot[h] = (int32_t)i + 1;
}

/* The index of firsts made again for its entries, at twice their count at least. */
static bool firsts_index(struct tern_trace *t)
{
	size_t cap = t->first_cap ? t->first_cap : 64;
	while (cap < 2 * (t->n_firsts + 1))
		cap *= 2;
	int32_t *slots = calloc(cap, sizeof *slots);
	if (!slots)
		return false;
	free(t->first_slot);
	t->first_slot = slots;
	t->first_cap = cap;
	for (size_t i = 0; i < t->n_firsts; i++)
		first_slot_put(t, i);
	return true;
}

/* After a checked step that matched: the firsts it added go, but those it bound. */
static void firsts_forget(struct tern_trace *t)
{
	size_t kept = t->firsts_mark;
	for (size_t i = t->firsts_mark; i < t->n_firsts; i++) {
		if (t->firsts[i].bound)
			t->firsts[kept++] = t->firsts[i];
		else
			tern_tensor_free(&t->firsts[i].value);
	}
	if (kept == t->n_firsts)
		return;
	t->n_firsts = kept;
	memset(t->first_slot, 0, t->first_cap * sizeof *t->first_slot);
	for (size_t i = 0; i < t->n_firsts; i++)
		first_slot_put(t, i);
}

/* Remembers the first value of a tensor made before tracing (an initializer's, if it becomes one). */
static tern_status remember_first(struct tern_trace *t, uint64_t serial, tern_var *var, int bound)
{
	int i = first_index(t, serial);
	if (i >= 0) {
		t->firsts[i].bound |= bound;
		return TERN_OK;
	}
	if (!tern_grow((void **)&t->firsts, &t->cap_firsts, t->n_firsts + 1, sizeof *t->firsts) ||
	    (2 * (t->n_firsts + 1) > t->first_cap && !firsts_index(t)))
		return tern_errorf(TERN_EOS, "out of memory");
	memset(&t->firsts[t->n_firsts], 0, sizeof t->firsts[0]);
	t->firsts[t->n_firsts].serial = serial;
	t->firsts[t->n_firsts].bound = bound;
	tern_status st = tern_tensor_copy(&t->firsts[t->n_firsts].value, tern_var_read(var));
	if (st)
		return st;
	first_slot_put(t, t->n_firsts++);
	return TERN_OK;
}

/* ---------------------------------------------------------------- recording */

tern_status tern_trace_start(tern_ctx *c, const tern_trace_options *o)
{
	if (tern_ctx_trace(c))
		return tern_errorf(TERN_EUSAGE, "trace: the context is tracing already");
	if (!o || !o->path || !*o->path)
		return tern_errorf(TERN_EUSAGE, "trace: no output file");
	struct tern_trace *t = calloc(1, sizeof *t);
	if (!t || !(t->path = tern_strdup(o->path)) || (o->record_dir && !(t->record_dir = tern_strdup(o->record_dir)))) {
		tern_trace_free(t);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	t->ctx = c;
	t->want_steps = o->steps > 0 ? o->steps : 1;
	t->verbose = o->verbose;
	t->site = o->site;
	t->site_key = o->site_key;
	t->user = o->user;
	t->replay = o->replay;
	t->coexec = o->coexec && !o->replay;
	tern_ctx_set_trace(c, t);
	/* co-execution: the operations run on the context's own thread while the program goes on; the
	 * program's reads wait for what they read */
	if (t->coexec)
		tern_ctx_set_async(c, 1);
	return TERN_OK;
}

tern_status tern_trace_step_begin(tern_ctx *c)
{
	struct tern_trace *t = tern_ctx_trace(c);
	tern_ctx_next_epoch(c);
	if (t)
		t->steps_begun++;
	if (t && t->replay && t->written && t->n_steps) {
		replay_release(t);
		t->replay_step = 1;
		return TERN_OK;
	}
	if (t && t->coexec && t->written && !t->in_step && t->n_paths > 0) {
		/* a step to check: recorded as a traced one */
		if (!tern_grow((void **)&t->steps, &t->cap_steps, t->n_steps + 1, sizeof *t->steps))
			return tern_errorf(TERN_EOS, "out of memory");
		t->steps[t->n_steps] = t->spare;
		memset(&t->spare, 0, sizeof t->spare);
		t->steps[t->n_steps++].number = t->steps_begun;
		t->in_step = t->checking = 1;
		t->diverged = 0;
		t->n_lf = 0;
		t->firsts_mark = t->n_firsts;
		uint8_t *alive = realloc(t->alive, (size_t)t->n_paths);
		size_t *upto = alive ? realloc(t->upto, (size_t)t->n_paths * sizeof *upto) : NULL;
		if (alive)
			t->alive = alive;
		if (!upto)
			return tern_errorf(TERN_EOS, "out of memory");
		t->upto = upto;
		memset(t->alive, 1, (size_t)t->n_paths);
		memset(t->upto, 0, (size_t)t->n_paths * sizeof *t->upto);
		/* the path the last matched step took, which the next most often takes too */
		if (t->cur < 0 || t->cur >= t->n_paths)
			t->cur = 0;
		return TERN_OK;
	}
	if (!t || t->written || t->in_step)
		return TERN_OK;
	if ((int)t->n_steps >= t->want_steps)
		return TERN_OK;
	if (!tern_grow((void **)&t->steps, &t->cap_steps, t->n_steps + 1, sizeof *t->steps))
		return tern_errorf(TERN_EOS, "out of memory");
	memset(&t->steps[t->n_steps++], 0, sizeof t->steps[0]);
	t->in_step = 1;
	t->explicit_steps = 1;
	step_free(&t->implicit);
	return TERN_OK;
}

static tern_status trace_write(struct tern_trace *t);
static bool path_takes(struct tern_trace *t, t_step *s);
static bool step_materialize(struct tern_trace *t, t_step *s);
static int path_of(const struct tern_trace *t, const int *rep, int n, const t_step *s);

/* The graph made again with the steps that diverged, at exit. A step that the graph cannot hold with
 * the others (trace_write fails other than for memory or the file) is left out: then the diverged
 * steps are added one at a time, in order, each kept only if the graph holds it. */
static tern_status trace_rewrite(struct tern_trace *t)
{
	t->stale = 0;
	t->written = 0;
	tern_status st = trace_write(t);
	if (!st || st == TERN_EOS || st == TERN_EIO)
		return st;
	size_t all = t->n_steps, kept = t->traced;
	for (size_t i = t->traced; i < all; i++) {
		t->steps[kept++] = t->steps[i];
		t->n_steps = kept;
		t->written = 0;
		st = trace_write(t);
		if (st == TERN_EOS || st == TERN_EIO)
			return st;
		if (st) {
			fprintf(stderr, "tern-trace: step %lld is left out of the graph: %s\n", (long long)t->steps[kept - 1].number,
			        tern_error());
			step_free(&t->steps[--kept]);
			t->n_steps = kept;
		}
	}
	t->written = 0;
	return trace_write(t);
}

tern_status tern_trace_step_end(tern_ctx *c)
{
	struct tern_trace *t = tern_ctx_trace(c);
	tern_ctx_next_epoch(c);
	if (t && t->replay_step) {
		replay_release(t);
		return TERN_OK;
	}
	if (t && t->checking) {
		t->in_step = t->checking = 0;
		t_step *s = &t->steps[t->n_steps - 1];
		bool done = !t->diverged && path_takes(t, s);
		if (t->error)
			return t->error;
		if (done) { /* the graph had it: nothing new */
			firsts_forget(t);
			step_recycle(t, s);
			t->n_steps--;
			t->coexecuted++;
			return TERN_OK;
		}
		if (!t->diverged)
			snprintf(t->divergence, sizeof t->divergence, "the step ended after %zu operations, before the graph's "
			                                              "path did", s->n_ops);
		t->fell_back++;
		t->replans++;
		if (s->n_lazy && !step_materialize(t, s))
			return tern_errorf(TERN_EOS, "out of memory");
		tern_status own = step_own(s);
		if (own)
			return own;
		if (t->verbose)
			fprintf(stderr, "tern-trace: step %lld diverged: %s; it joins the trace (the graph is made again at "
			                "exit)\n",
			        (long long)t->steps_begun, t->divergence);
		/* its path: one the graph has (with shapes it had not seen) or a new one */
		int p = path_of(t, t->path_rep, t->n_paths, s);
		if (p == t->n_paths) {
			int *rep = realloc(t->path_rep, ((size_t)p + 2) * sizeof *rep);
			if (!rep)
				return tern_errorf(TERN_EOS, "out of memory");
			t->path_rep = rep;
			t->path_rep[t->n_paths++] = (int)(t->n_steps - 1);
		}
		s->path = p;
		t->paths_gen++;
		t->stale = 1;
		return TERN_OK;
	}
	if (!t || !t->in_step)
		return TERN_OK;
	t->in_step = 0;
	if ((int)t->n_steps >= t->want_steps && !t->written) {
		t->traced = t->n_steps;
		return trace_write(t);
	}
	return TERN_OK;
}

void tern_trace_step_abandon(tern_ctx *c)
{
	struct tern_trace *t = tern_ctx_trace(c);
	tern_ctx_next_epoch(c);
	if (!t || !t->in_step)
		return;
	step_free(&t->steps[--t->n_steps]);
	t->in_step = t->checking = 0;
}

tern_status tern_trace_finish(tern_ctx *c)
{
	struct tern_trace *t = tern_ctx_trace(c);
	if (t && t->coexec && t->written)
		fprintf(stderr, "tern-trace: co-execution: %lld steps matched the graph, %lld diverged (run as traced, "
		                "then added to it), %lld re-plans\n",
		        (long long)t->coexecuted, (long long)t->fell_back, (long long)t->replans);
	if (t && t->written && t->replay && t->verbose)
		fprintf(stderr, "tern-trace: trace-only: %lld operations replayed from the first step, %lld run as asked "
		                "(past its end)\n",
		        (long long)t->replayed, (long long)t->beyond);
	if (t && t->written && t->stale)
		return trace_rewrite(t);
	if (!t || t->written)
		return TERN_OK;
	if (t->in_step) { /* the last step did not finish (an exception): it is left out */
		step_free(&t->steps[--t->n_steps]);
		t->in_step = 0;
	}
	if (!t->n_steps && t->implicit.n_ops) { /* no step was ever marked: the whole run is one */
		if (!tern_grow((void **)&t->steps, &t->cap_steps, 1, sizeof *t->steps))
			return tern_errorf(TERN_EOS, "out of memory");
		t->steps[0] = t->implicit;
		memset(&t->implicit, 0, sizeof t->implicit);
		t->n_steps = 1;
	}
	if (!t->n_steps) /* nothing to write: tern-trace says so */
		return TERN_OK;
	return trace_write(t);
}

/* A hash of an attribute: its fields, read as they are; one holding a tensor or a graph, packed
 * (packing them all, as before, was a sixth of a small call's record). */
static uint64_t attr_hash(const Onnx__AttributeProto *a, uint64_t h)
{
	if (tern_attr_nested(a)) {
		size_t n = onnx__attribute_proto__get_packed_size(a);
		uint8_t small[512], *buf = n <= sizeof small ? small : malloc(n);
		if (buf) {
			onnx__attribute_proto__pack(a, buf);
			h = fnv(buf, n, h);
			if (buf != small)
				free(buf);
		}
		return h;
	}
	const char *name = a->name ? a->name : "";
	uint32_t fbits;
	memcpy(&fbits, &a->f, sizeof fbits);
	uint64_t head[7] = {(uint64_t)a->type, (uint64_t)a->i, fbits, a->s.len, a->n_ints, a->n_floats, a->n_strings};
	h = fnv(name, strlen(name) + 1, h);
	h = fnv(head, sizeof head, h);
	h = fnv(a->s.data, a->s.len, h);
	h = fnv(a->ints, a->n_ints * sizeof *a->ints, h);
	h = fnv(a->floats, a->n_floats * sizeof *a->floats, h);
	for (size_t i = 0; i < a->n_strings; i++)
		h = fnv(a->strings[i].data, a->strings[i].len, h);
	return h;
}

/* A hash of an operation's attributes, in their order. */
static uint64_t attrs_hash(Onnx__AttributeProto *const *attrs, int n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (int k = 0; k < n; k++)
		h = attr_hash(attrs[k], h);
	return h;
}

/* The bit of t_step.bound for serial. */
static void bind_bit(uint64_t serial, int *word, uint64_t *bit)
{
	unsigned b = (unsigned)((serial * 0x9e3779b97f4a7c15ull) >> 56);
	*word = (int)(b >> 6);
	*bit = 1ull << (b & 63);
}

/* What a step's outputs carry as their step (trace.h): the context's epoch, so that no two steps
 * share it. Not the step's index: a checked step that matched is given back and the next one takes
 * its index, and then a tensor the last step made and the host kept (memory_bank's bank of keys)
 * read as an output of this step's operation at the same position, a dependence that was not there
 * (and a divergence that was not one, at a third of its steps). */
static int64_t step_id(struct tern_trace *t)
{
	return tern_ctx_epoch(t->ctx) + 1;
}

/* Whether value v (stamp ts) is an earlier operation's output in step s (*r), as made or as the new
 * value of a state the step updated; else it is a read. */
static bool op_ref(const t_step *s, int64_t step_no, const tern_trace_stamp *ts, t_in *r)
{
	if (ts->step == step_no && ts->op >= 0 && (size_t)ts->op < s->n_ops) {
		*r = (t_in){IN_OP, ts->op, ts->out, 0};
		return true;
	}
	int w;
	uint64_t bit;
	bind_bit(ts->serial, &w, &bit);
	for (size_t i = s->bound[w] & bit ? s->n_binds : 0; i-- > 0;)
		if (s->binds[i].serial == ts->serial) {
			*r = (t_in){IN_OP, s->binds[i].op, s->binds[i].out, 0};
			return true;
		}
	return false;
}

/* Where input value v comes from in step s: an earlier operation, or an external read. */
static tern_status input_ref(struct tern_trace *t, t_step *s, int64_t step_no, tern_var *v, t_in *r)
{
	tern_trace_stamp *ts = tern_var_stamp(v);
	if (op_ref(s, step_no, ts, r))
		return TERN_OK;
	/* only a tensor made before tracing and never updated can be a constant, which is what the hash
	 * of its bytes tells: the others are fed or states whatever their bytes, and are not waited for
	 * (with asynchronous kernels, their bytes may still be being computed) */
	int fi = ts->born == 0 ? first_index(t, ts->serial) : -1;
	bool hash_bytes = ts->born == 0 && !(fi >= 0 && t->firsts[fi].bound);
	/* --trace-only, as torch.jit.trace: what the host made in the traced step, other than its input
	 * data, is a constant of the replay */
	bool freeze = t->replay && s == t->steps && ts->born == tern_ctx_epoch(t->ctx) && !ts->input &&
	              tern_var_info(v)->dtype != TERN_STRING;
	const tern_tensor *x = hash_bytes || freeze || t->record_dir ? tern_var_read(v) : tern_var_info(v);
	if (!tern_grow((void **)&s->ext, &s->cap_ext, s->n_ext + 1, sizeof *s->ext))
		return tern_errorf(TERN_EOS, "out of memory");
	/* every field set, not the whole cleared */
	t_ext *e = &s->ext[s->n_ext];
	e->serial = ts->serial;
	e->born = ts->born;
	e->dtype = x->dtype;
	e->rank = x->rank;
	memcpy(e->dims, x->dims, (size_t)x->rank * sizeof *x->dims);
	memset(e->dims + x->rank, 0, (size_t)(TERN_MAX_RANK - x->rank) * sizeof *e->dims);
	memset(&e->value, 0, sizeof e->value);
	e->frozen = false;
	/* the type and shape, a word at a time */
	uint64_t h = (0xcbf29ce484222325ull ^ (uint64_t)(uint32_t)x->dtype) * 0x100000001b3ull;
	for (int d = 0; d < x->rank; d++) {
		h = (h ^ (uint64_t)x->dims[d]) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	e->hash = h;
	if (x->dtype == TERN_STRING) {
		for (int64_t i = 0; i < tern_tensor_numel(x); i++) {
			const char *str = ((char *const *)x->data)[i];
			e->hash = fnv(str ? str : "", str ? strlen(str) + 1 : 1, e->hash);
		}
	} else if (x->data && hash_bytes) {
		e->hash = bytes_hash(x->data, (size_t)tern_tensor_numel(x) * tern_dtype_size(x->dtype), e->hash);
	}
	tern_status st = TERN_OK;
	if (ts->born == 0)
		st = remember_first(t, ts->serial, v, 0);
	if (!st && (t->record_dir || freeze))
		st = tern_tensor_copy(&e->value, x);
	if (st)
		return st;
	e->frozen = freeze;
	*r = (t_in){IN_EXT, 0, 0, (int32_t)s->n_ext++};
	return TERN_OK;
}

static bool same_op(const t_op *a, const t_op *b, bool producers);

/* Output k of o has the shape (and type) that operation j of some step on path p recorded. */
static bool same_shapes(const t_op *r, const t_op *o)
{
	for (int k = 0; k < o->n_out; k++)
		if (r->dtype[k] != o->dtype[k] || r->rank[k] != o->rank[k] ||
		    memcmp(&r->dims[k * TERN_MAX_RANK], &o->dims[k * TERN_MAX_RANK], (size_t)o->rank[k] * sizeof *o->dims))
			return false;
	return true;
}

/* The dimensions of path p's operation j that differ between the path's steps (t_op.varies), made
 * again only when the steps' paths have changed: at every checked call, making them had scanned the
 * path's steps (rcnn's box counts differ from its first step's at many calls). NULL: out of memory. */
static const uint8_t *varying_dims(struct tern_trace *t, int p, size_t j)
{
	t_step *rep = &t->steps[t->path_rep[p]];
	t_op *r = &rep->ops[j];
	if (r->varies && r->varies_gen == t->paths_gen)
		return r->varies;
	if (!r->varies && !(r->varies = step_alloc(rep, (size_t)r->n_out + 1)))
		return NULL;
	memset(r->varies, 0, (size_t)r->n_out);
	for (size_t s = 0; s + 1 < t->n_steps; s++) {
		const t_step *st = &t->steps[s];
		if (st == rep || st->path != p || j >= st->n_ops)
			continue;
		const t_op *o = &st->ops[j];
		for (int k = 0; k < r->n_out && k < o->n_out; k++)
			for (int d = 0; d < r->rank[k] && d < o->rank[k]; d++)
				if (r->dims[k * TERN_MAX_RANK + d] != o->dims[k * TERN_MAX_RANK + d])
					r->varies[k] |= (uint8_t)(1u << d);
	}
	r->varies_gen = t->paths_gen;
	return r->varies;
}

/* Output k of o has the shape (and type) of operation j of the path's steps, but where a dimension
 * differs between those steps: symbolic in the graph, any size there. */
static bool shape_seen(struct tern_trace *t, int p, size_t j, const t_op *o)
{
	/* most often the path's first step made the same shapes */
	const t_op *first = &t->steps[t->path_rep[p]].ops[j];
	if (first->n_out == o->n_out && same_shapes(first, o))
		return true;
	const uint8_t *varies = varying_dims(t, p, j);
	bool fits = varies && first->n_out == o->n_out;
	for (int k = 0; k < o->n_out && fits; k++) {
		fits = first->dtype[k] == o->dtype[k] && first->rank[k] == o->rank[k];
		for (int d = 0; d < o->rank[k] && fits; d++)
			fits = varies[k] >> d & 1 || first->dims[k * TERN_MAX_RANK + d] == o->dims[k * TERN_MAX_RANK + d];
	}
	if (fits)
		return true;
	/* a step of the path with a rank of its own */
	for (size_t s = 0; s + 1 < t->n_steps; s++) {
		const t_step *st = &t->steps[s];
		if (st->path == p && j < st->n_ops && st->ops[j].n_out == o->n_out && same_shapes(&st->ops[j], o))
			return true;
	}
	return false;
}

/* Whether the step's operation j is that of path p (site, operator, attributes, where inputs come
 * from, shapes the path has made); why not, in *why. */
static bool path_has(struct tern_trace *t, int p, const t_step *s, size_t j, const char **why)
{
	const t_op *o = &s->ops[j];
	const t_step *r = &t->steps[t->path_rep[p]];
	if (j >= r->n_ops)
		*why = "an operation the graph does not have (its path ends here)";
	else if (!same_op(&r->ops[j], o, true))
		*why = strcmp(r->ops[j].site, o->site) || strcmp(r->ops[j].op_type, o->op_type)
		               ? "another operation or site than the graph's (another branch)"
		               : "the same operation with other attributes or inputs";
	else if (!shape_seen(t, p, j, o))
		*why = "a shape the graph has not seen";
	else
		return true;
	return false;
}

/* Path p checked up to the step's operation j (included); dropped if it differs. */
static bool path_upto(struct tern_trace *t, int p, const t_step *s, size_t j, const char **why)
{
	for (; t->upto[p] <= j; t->upto[p]++)
		if (!path_has(t, p, s, t->upto[p], why)) {
			t->alive[p] = 0;
			return false;
		}
	return true;
}

/* Operation j of the step being checked: against the current path, and when that one differs,
 * against the others still possible (from where each was last checked), the first that agrees
 * becoming the current one; when none is left, the step has diverged here. */
static void check_op(struct tern_trace *t, t_step *s, size_t j)
{
	const t_op *o = &s->ops[j];
	const char *why = NULL, *other; /* the reason the current path differs here, which -v reports */
	if (t->alive[t->cur] && path_upto(t, t->cur, s, j, &why))
		return;
	if (s->n_lazy && !step_materialize(t, s)) { /* the other paths read the step's record */
		t->error = TERN_EOS;
		return;
	}
	for (int p = 0; p < t->n_paths; p++)
		if (t->alive[p] && path_upto(t, p, s, j, why ? &other : &why)) {
			t->cur = p;
			return;
		}
	t->diverged = 1;
	const t_op *want = NULL;
	for (int p = 0; p < t->n_paths && !want; p++)
		if (j < t->steps[t->path_rep[p]].n_ops)
			want = &t->steps[t->path_rep[p]].ops[j];
	snprintf(t->divergence, sizeof t->divergence, "at operation %zu, %s at %s: %s%s%s%s%s%s", j, o->op_type, o->site,
	         why ? why : "", want ? " (the graph has " : "", want ? want->op_type : "", want ? " at " : "",
	         want ? want->site : "", want ? ")" : "");
}

/* At the end of a checked step that has not diverged: a path it took whole (the current one, or
 * another of the same length that agrees everywhere), which becomes the current one. */
static bool path_takes(struct tern_trace *t, t_step *s)
{
	const char *why;
	for (int k = -1; k < t->n_paths; k++) {
		int p = k < 0 ? t->cur : k; /* the current path first */
		if (k == 0 && s->n_lazy && !step_materialize(t, s)) { /* the others read the step's record */
			t->error = TERN_EOS;
			return false;
		}
		if (!t->alive[p] || t->steps[t->path_rep[p]].n_ops != s->n_ops ||
		    (s->n_ops && !path_upto(t, p, s, s->n_ops - 1, &why)))
			continue;
		t->cur = p;
		return true;
	}
	return false;
}

/* Operation o's arrays (dims, in, dtype, rank, fetched), cleared, in one block of step s's; false:
 * out of memory (they stay NULL). */
static bool op_arrays(t_step *s, t_op *o, int n_in, int n_out)
{
	size_t no = (size_t)n_out + 1, ni = (size_t)n_in + 1;
	char *block = step_alloc(s, no * TERN_MAX_RANK * sizeof *o->dims + ni * sizeof *o->in + 2 * no * sizeof(int) + no);
	if (!block) {
		o->dims = NULL;
		o->in = NULL;
		o->dtype = o->rank = NULL;
		o->fetched = NULL;
		return false;
	}
	o->dims = (int64_t *)block;
	o->in = (t_in *)(block + no * TERN_MAX_RANK * sizeof *o->dims);
	o->dtype = (int *)((char *)o->in + ni * sizeof *o->in);
	o->rank = o->dtype + no;
	o->fetched = (uint8_t *)(o->rank + no);
	return true;
}

/* The step's lazy operations made, as copies of their path's (sharing its names and attributes),
 * with the fetches they had; false: out of memory. */
static bool step_materialize(struct tern_trace *t, t_step *s)
{
	const t_step *rep = &t->steps[t->path_rep[t->cur]];
	for (size_t j = 0; j < s->n_ops && s->n_lazy; j++) {
		t_op *o = &s->ops[j];
		if (o->site)
			continue;
		const t_op *r = &rep->ops[j];
		const t_in *in = o->in ? o->in : r->in;
		size_t no = (size_t)r->n_out + 1, ni = (size_t)r->n_in + 1;
		*o = *r;
		o->borrowed = true;
		o->varies = NULL;
		o->varies_gen = 0;
		o->fetch_value = NULL;
		if (!op_arrays(s, o, r->n_in, r->n_out))
			return false;
		memcpy(o->dims, r->dims, no * TERN_MAX_RANK * sizeof *o->dims);
		memcpy(o->in, in, ni * sizeof *o->in);
		memcpy(o->dtype, r->dtype, no * sizeof *o->dtype);
		memcpy(o->rank, r->rank, no * sizeof *o->rank);
		s->n_lazy--;
	}
	for (size_t i = 0; i < t->n_lf; i++)
		s->ops[t->lf[i].op].fetched[t->lf[i].out] = 1;
	t->n_lf = 0;
	return true;
}

/* A call of a checked step that is its path's next operation in every respect the path's check
 * looks at (the caller has found the same stack): the same eager signature (operator, attributes,
 * input shapes), inputs from the same operations (or reads where the path read), the same output
 * shapes. It is not recorded (*done), only counted, its outputs stamped and its reads noted: the
 * step's record is made from the path's when the step needs it (step_materialize), which a step
 * that keeps to one path never does. Recording and checking had cost rcnn's co-executed calls about
 * 290 ns each (against asynchronous eager). Non-zero: out of memory. */
static int lazy_op(struct tern_trace *t, t_step *s, int64_t step_no, const t_op *want, int n_attrs,
                   tern_var *const *in, int n_in, tern_var *const *out, int n_out, uint64_t sig, bool *done)
{
	if (!sig || want->sig != sig || want->n_attrs != n_attrs || want->n_in != n_in || want->n_out != n_out ||
	    t->record_dir || n_in > 64)
		return 0;
	for (int k = 0; k < n_out; k++) {
		if (!out[k]) {
			if (want->dtype[k])
				return 0;
			continue;
		}
		const tern_tensor *y = tern_var_info(out[k]);
		if (want->dtype[k] != y->dtype || want->rank[k] != y->rank ||
		    memcmp(&want->dims[k * TERN_MAX_RANK], y->dims, (size_t)y->rank * sizeof *y->dims))
			return 0;
	}
	t_in ref[64];
	bool reads = false;
	for (int i = 0; i < n_in; i++) {
		if (!in[i]) {
			if (want->in[i].kind != IN_NONE)
				return 0;
			ref[i] = (t_in){IN_NONE, 0, 0, 0};
		} else if (op_ref(s, step_no, tern_var_stamp(in[i]), &ref[i])) {
			if (want->in[i].kind != IN_OP || want->in[i].op != ref[i].op || want->in[i].out != ref[i].out)
				return 0;
		} else if (want->in[i].kind != IN_EXT) {
			return 0;
		} else {
			reads = true;
		}
	}
	/* it is the path's: its reads recorded as any call's are */
	for (int i = 0; i < n_in && reads; i++)
		if (in[i] && want->in[i].kind == IN_EXT && input_ref(t, s, step_no, in[i], &ref[i]))
			return -1;
	if (!tern_grow((void **)&s->ops, &s->cap_ops, s->n_ops + 1, sizeof *s->ops))
		return -1;
	t_op *o = &s->ops[s->n_ops];
	o->site = NULL;
	o->in = NULL;
	if (reads) {
		if (!(o->in = step_alloc(s, ((size_t)n_in + 1) * sizeof *o->in)))
			return -1;
		memcpy(o->in, ref, (size_t)n_in * sizeof *o->in);
	}
	for (int k = 0; k < n_out; k++)
		if (out[k]) {
			tern_trace_stamp *ts = tern_var_stamp(out[k]);
			ts->step = step_no;
			ts->op = (int32_t)s->n_ops;
			ts->out = k;
		}
	s->n_ops++;
	s->n_lazy++;
	t->upto[t->cur] = s->n_ops;
	*done = true;
	return 0;
}

tern_status tern_trace_op(tern_ctx *c, const char *domain, const char *op_type, Onnx__AttributeProto *const *attrs,
                          int n_attrs, tern_var *const *in, int n_in, tern_var *const *out, int n_out, uint64_t sig)
{
	struct tern_trace *t = tern_ctx_trace(c);
	t_step *s = t && !t->error ? current(t) : NULL;
	if (!s)
		return TERN_OK;
	int64_t step_no = step_id(t);
	uint64_t key = t->site_key ? t->site_key(t->user) : 0;
	/* A checked step on its path so far, at a call from the stack the path's operation here was called
	 * from, calls from that site: the stacks of the operations before it are those of the path's, so
	 * the occurrence is the same too. The stack's text and the count of its occurrences are left to
	 * the first call off the path (interning them was 5 % of checking memory_bank's calls). */
	const t_op *want = NULL;
	if (key && t->checking && !t->diverged && t->alive[t->cur] && t->upto[t->cur] == s->n_ops &&
	    s->n_ops < t->steps[t->path_rep[t->cur]].n_ops)
		want = &t->steps[t->path_rep[t->cur]].ops[s->n_ops];
	bool done = false;
	if (want && want->key == key && lazy_op(t, s, step_no, want, n_attrs, in, n_in, out, n_out, sig, &done))
		return t->error = TERN_EOS;
	if (done)
		return TERN_OK;
	const char *stack, *site;
	if (want && want->key == key) {
		stack = want->stack;
		site = want->site;
	} else {
		stack = stack_now(t, key);
		for (; stack && s->counted < s->n_ops; s->counted++) {
			const t_op *done_op = &s->ops[s->counted];
			if (!done_op->site) /* lazy: its path's */
				done_op = &t->steps[t->path_rep[t->cur]].ops[s->counted];
			if (occurrence(s, done_op->stack) < 0)
				stack = NULL;
		}
		int occ = stack ? occurrence(s, stack) : -1;
		site = occ >= 0 ? intern_site(t, stack, occ) : NULL;
		s->counted = s->n_ops + 1;
	}
	if (!site || !tern_grow((void **)&s->ops, &s->cap_ops, s->n_ops + 1, sizeof *s->ops))
		return t->error = tern_errorf(TERN_EOS, "out of memory");
	t_op *o = &s->ops[s->n_ops];
	memset(o, 0, sizeof *o);
	o->stack = stack;
	o->key = key;
	/* A step being checked mostly repeats the graph's operations: one that matches the operation at
	 * this position of a path still possible (the current one first) shares its text and attributes
	 * instead of copies. One whose eager signature is the call's has the same operator and
	 * attributes: its hash is taken, not made again (a seventh of recording a call of rcnn's). */
	const t_op *ref = NULL;
	uint64_t h = 0;
	bool hashed = false;
	for (int k = -1; t->checking && !t->diverged && k < t->n_paths && !ref; k++) {
		int p = k < 0 ? t->cur : k;
		const t_step *r = &t->steps[t->path_rep[p]];
		if (!t->alive[p] || s->n_ops >= r->n_ops)
			continue;
		const t_op *c = &r->ops[s->n_ops];
		if (c->site != site || c->n_attrs != n_attrs)
			continue;
		if (sig && c->sig == sig) {
			ref = c;
			h = c->attr_hash;
			hashed = true;
			break;
		}
		if (!hashed) {
			h = attrs_hash(attrs, n_attrs);
			hashed = true;
		}
		if (c->attr_hash == h && !strcmp(c->op_type, op_type) && !strcmp(c->domain, domain))
			ref = c;
	}
	if (!hashed)
		h = attrs_hash(attrs, n_attrs);
	if (ref) {
		o->borrowed = true;
		o->site = ref->site;
		o->domain = ref->domain;
		o->op_type = ref->op_type;
		o->attrs = ref->attrs;
		o->n_attrs = ref->n_attrs;
	} else {
		o->site = site;
		o->domain = tern_strdup(domain);
		o->op_type = tern_strdup(op_type);
		o->attrs = calloc((size_t)n_attrs + 1, sizeof *o->attrs);
	}
	op_arrays(s, o, n_in, n_out);
	if (t->record_dir)
		o->fetch_value = calloc((size_t)n_out + 1, sizeof *o->fetch_value);
	o->n_out = n_out;
	if (!o->site || !o->domain || !o->op_type || !o->attrs || !o->in || !o->dtype || !o->rank || !o->dims ||
	    !o->fetched || (t->record_dir && !o->fetch_value)) {
		op_free(o);
		return t->error = tern_errorf(TERN_EOS, "out of memory");
	}
	for (int k = 0; k < n_attrs && !ref; k++) {
		if (!(o->attrs[k] = tern_pb_copy(attrs[k]))) {
			op_free(o);
			return t->error = tern_errorf(TERN_EOS, "out of memory");
		}
		o->n_attrs++;
	}
	o->attr_hash = h;
	o->sig = sig;
	tern_status st = TERN_OK;
	for (int i = 0; i < n_in && !st; i++) {
		if (in[i])
			st = input_ref(t, s, step_no, in[i], &o->in[i]);
		o->n_in = i + 1;
	}
	if (st) {
		op_free(o);
		return t->error = st;
	}
	for (int k = 0; k < n_out; k++) {
		if (!out[k])
			continue;
		const tern_tensor *y = tern_var_info(out[k]);
		o->dtype[k] = y->dtype;
		o->rank[k] = y->rank;
		memcpy(&o->dims[k * TERN_MAX_RANK], y->dims, (size_t)y->rank * sizeof *y->dims);
		tern_trace_stamp *ts = tern_var_stamp(out[k]);
		ts->step = step_no;
		ts->op = (int32_t)s->n_ops;
		ts->out = k;
	}
	s->n_ops++;
	if (t->checking && !t->diverged)
		check_op(t, s, s->n_ops - 1);
	return TERN_OK;
}

void tern_trace_fetch(tern_var *v)
{
	if (!v)
		return;
	struct tern_trace *t = tern_ctx_trace(tern_var_ctx(v));
	t_step *s = t && !t->error ? current(t) : NULL;
	if (!s)
		return;
	int64_t step_no = step_id(t);
	tern_trace_stamp *ts = tern_var_stamp(v);
	if (ts->step != step_no || ts->op < 0 || (size_t)ts->op >= s->n_ops)
		return;
	if (s->n_lazy && !s->ops[ts->op].site) { /* a lazy operation's: noted for when it is made */
		if (!tern_grow((void **)&t->lf, &t->cap_lf, t->n_lf + 1, sizeof *t->lf)) {
			t->error = TERN_EOS;
			return;
		}
		t->lf[t->n_lf++] = (struct lazy_fetch){ts->op, ts->out};
		return;
	}
	t_op *o = &s->ops[ts->op];
	if (o->fetched[ts->out])
		return;
	o->fetched[ts->out] = 1;
	if (o->fetch_value && tern_tensor_copy(&o->fetch_value[ts->out], tern_var_read(v)))
		t->error = TERN_EOS;
}

void tern_trace_input(tern_var *v)
{
	if (v)
		tern_var_stamp(v)->input = 1;
}

void tern_trace_assign(tern_var *dst, tern_var *src)
{
	if (!dst || !src)
		return;
	struct tern_trace *t = tern_ctx_trace(tern_var_ctx(dst));
	t_step *s = t && !t->error ? current(t) : NULL;
	if (!s)
		return;
	int64_t step_no = step_id(t);
	tern_trace_stamp *d = tern_var_stamp(dst), *r = tern_var_stamp(src);
	if (d->born != 0 || r->step != step_no || r->op < 0)
		return; /* only tensors made before tracing are state; only traced values update them */
	/* the state's value before this update (called before its bytes change): its initializer */
	if (remember_first(t, d->serial, dst, 1)) {
		t->error = TERN_EOS;
		return;
	}
	int w;
	uint64_t bit;
	bind_bit(d->serial, &w, &bit);
	for (size_t i = 0; s->bound[w] & bit && i < s->n_binds; i++)
		if (s->binds[i].serial == d->serial) {
			s->binds[i].op = r->op;
			s->binds[i].out = r->out;
			return;
		}
	if (!tern_grow((void **)&s->binds, &s->cap_binds, s->n_binds + 1, sizeof *s->binds)) {
		t->error = TERN_EOS;
		return;
	}
	s->binds[s->n_binds++] = (t_bind){d->serial, r->op, r->out};
	s->bound[w] |= bit;
}

/* ---------------------------------------------------------------- merging */

/* Operations a and b are the same node: site, operator, attributes, and (with producers) where
 * each input comes from. */
static bool same_op(const t_op *a, const t_op *b, bool producers)
{
	if (a->attr_hash != b->attr_hash || a->n_in != b->n_in || a->n_out != b->n_out ||
	    (a->site != b->site && strcmp(a->site, b->site)) || (a->domain != b->domain && strcmp(a->domain, b->domain)) ||
	    (a->op_type != b->op_type && strcmp(a->op_type, b->op_type)))
		return false;
	for (int i = 0; i < a->n_in; i++) {
		if (a->in[i].kind != b->in[i].kind)
			return false;
		if (producers && a->in[i].kind == IN_OP && (a->in[i].op != b->in[i].op || a->in[i].out != b->in[i].out))
			return false;
	}
	for (int k = 0; k < a->n_out; k++)
		if ((a->dtype[k] == 0) != (b->dtype[k] == 0))
			return false;
	return true;
}

static bool same_path(const t_step *a, const t_step *b)
{
	if (a->n_ops != b->n_ops)
		return false;
	for (size_t j = 0; j < a->n_ops; j++)
		if (!same_op(&a->ops[j], &b->ops[j], true))
			return false;
	return true;
}

/* The path among n (rep: each one's first step) that step s takes; n when none does. */
static int path_of(const struct tern_trace *t, const int *rep, int n, const t_step *s)
{
	int p = 0;
	while (p < n && !same_path(&t->steps[rep[p]], s))
		p++;
	return p;
}

/* A growable list of pointers (nodes, inputs, ...) with an error flag for the whole build. */
typedef struct plist {
	void **p;
	size_t n, cap;
} plist;

typedef struct builder {
	struct tern_trace *t;
	int n_paths;
	int *rep;       /* per path: its first step */
	size_t L, S;    /* common prefix and suffix lengths */
	size_t *len;    /* per path: its operations */
	int failed;
	/* graph inputs and initializers */
	plist inputs, inits;
	/* the slots: per (region, path, position, input) the name it reads */
	struct slot {
		int region; /* 0 prefix, 1 suffix, 2 middle */
		int path;   /* middle only */
		size_t pos;
		int input;
		char *name;
	} *slots;
	size_t n_slots, cap_slots;
	struct feed {
		char *name;
		uint64_t *serial; /* per step: the tensor it stood for (0: not read) */
		int dtype, rank;
		int64_t dims[TERN_MAX_RANK];
		int varies[TERN_MAX_RANK];
	} *feeds;
	size_t n_feeds, cap_feeds;
	int n_consts, n_states;
	struct state {
		uint64_t serial;
		char *name;
		int dtype;
		int is_const; /* a constant initializer (one per tensor), not updated */
		int rank;
	} *states;
	size_t n_states_list, cap_states;
	int n_if;
} builder;

static void *bnew(builder *b, size_t n)
{
	void *p = calloc(1, n);
	if (!p)
		b->failed = 1;
	return p;
}

static char *bstr(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *bstr(builder *b, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	char *s = tern_strdup(buf);
	if (!s)
		b->failed = 1;
	return s;
}

static void push(builder *b, plist *l, void *p)
{
	if (!p || !tern_grow((void **)&l->p, &l->cap, l->n + 1, sizeof *l->p)) {
		b->failed = 1;
		return;
	}
	l->p[l->n++] = p;
}

/* The step's operation of path p at position j of its own numbering. */
static const t_op *op_at(const builder *b, int p, size_t j)
{
	return &b->t->steps[b->rep[p]].ops[j];
}

static Onnx__NodeProto *make_node(builder *b, const char *domain, const char *op_type, char **in, int n_in,
                                  char **out, int n_out)
{
	Onnx__NodeProto *n = bnew(b, sizeof *n);
	if (!n) {
		for (int i = 0; i < n_in; i++)
			free(in[i]);
		for (int k = 0; k < n_out; k++)
			free(out[k]);
		return NULL;
	}
	onnx__node_proto__init(n);
	n->op_type = tern_strdup(op_type);
	n->domain = tern_strdup(domain);
	n->input = calloc((size_t)n_in + 1, sizeof *n->input);
	n->output = calloc((size_t)n_out + 1, sizeof *n->output);
	if (!n->op_type || !n->domain || !n->input || !n->output)
		b->failed = 1;
	for (int i = 0; i < n_in; i++)
		if (n->input)
			n->input[n->n_input++] = in[i] ? in[i] : tern_strdup("");
		else
			free(in[i]);
	for (int k = 0; k < n_out; k++)
		if (n->output)
			n->output[n->n_output++] = out[k] ? out[k] : tern_strdup("");
		else
			free(out[k]);
	return n;
}

static void add_attr(builder *b, Onnx__NodeProto *n, Onnx__AttributeProto *a)
{
	if (!n || !a) {
		b->failed = 1;
		return;
	}
	Onnx__AttributeProto **arr = realloc(n->attribute, (n->n_attribute + 1) * sizeof *arr);
	if (!arr) {
		onnx__attribute_proto__free_unpacked(a, &tern_pb_allocator);
		b->failed = 1;
		return;
	}
	n->attribute = arr;
	arr[n->n_attribute++] = a;
}

/* A Constant node making name: an int64 scalar, or an empty tensor of type (TYPE_OF). */
static Onnx__NodeProto *constant(builder *b, char *name, int type, int64_t value, bool scalar)
{
	int dtype = type & 0xffff, rank = (type >> 16) - 1;
	if (rank < 1)
		rank = rank < 0 ? 1 : 0;
	char *out[1] = {name};
	Onnx__NodeProto *n = make_node(b, "", "Constant", NULL, 0, out, 1);
	Onnx__AttributeProto *a = bnew(b, sizeof *a);
	Onnx__TensorProto *tp = bnew(b, sizeof *tp);
	if (!n || !a || !tp) {
		free(a);
		free(tp);
		return n;
	}
	onnx__attribute_proto__init(a);
	onnx__tensor_proto__init(tp);
	a->name = tern_strdup("value");
	a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
	a->has_type = 1;
	a->t = tp;
	tern_tensor v = {0};
	int64_t zero[TERN_MAX_RANK] = {0};
	if (tern_tensor_alloc(&v, scalar ? TERN_INT64 : dtype, scalar ? 0 : rank, zero))
		b->failed = 1;
	else if (scalar)
		*(int64_t *)v.data = value;
	if (!b->failed && tern_tensor_to_proto(&v, tp))
		b->failed = 1;
	tern_tensor_free(&v);
	add_attr(b, n, a);
	return n;
}

static Onnx__ValueInfoProto *value_info(builder *b, const char *name, const tern_type *ty)
{
	Onnx__ValueInfoProto *vi = bnew(b, sizeof *vi);
	if (!vi)
		return NULL;
	onnx__value_info_proto__init(vi);
	vi->name = tern_strdup(name);
	vi->type = tern_type_to_proto(ty);
	if (!vi->name || !vi->type)
		b->failed = 1;
	return vi;
}

/* An element type and a rank in one int, for the lists below: the rank + 1 above bit 16 (0: unknown). */
#define TYPE_OF(dtype, rank) ((dtype) | ((rank) + 1) << 16)

static tern_type dtype_only(int type)
{
	tern_type ty = {0};
	ty.dtype = type & 0xffff;
	ty.rank = (type >> 16) - 1;
	for (int d = 0; d < ty.rank && d < TERN_MAX_RANK; d++)
		ty.dims[d] = -1;
	return ty;
}

static const char *slot_name(const builder *b, int region, int path, size_t pos, int input)
{
	for (size_t i = 0; i < b->n_slots; i++) {
		const struct slot *s = &b->slots[i];
		if (s->region == region && s->pos == pos && s->input == input && (region != 2 || s->path == path))
			return s->name;
	}
	return "";
}

/* The region of operation j of path p: 0 prefix, 1 suffix (pos: its index in the suffix), 2 middle. */
static int region_of(const builder *b, int p, size_t j, size_t *pos)
{
	if (j < b->L) {
		*pos = j;
		return 0;
	}
	if (j >= b->len[p] - b->S) {
		*pos = j - (b->len[p] - b->S);
		return 1;
	}
	*pos = j - b->L;
	return 2;
}

static char *value_name(builder *b, int p, size_t j, int k)
{
	size_t pos;
	int r = region_of(b, p, j, &pos);
	if (r == 0)
		return bstr(b, "v%zu_%d", pos, k);
	if (r == 1)
		return bstr(b, "s%zu_%d", pos, k);
	return bstr(b, "c%d_m%zu_%d", p, pos, k);
}

/* The external read slot sl stands for in step s; NULL when that step does not run it or reads an
 * operation's value there. */
static const t_ext *slot_read(const builder *b, const struct slot *sl, size_t s)
{
	const t_step *st = &b->t->steps[s];
	if (sl->region == 2 && st->path != sl->path)
		return NULL;
	size_t j = sl->region == 0 ? sl->pos : sl->region == 1 ? b->len[st->path] - b->S + sl->pos : b->L + sl->pos;
	const t_in *r = &st->ops[j].in[sl->input];
	return r->kind == IN_EXT ? &st->ext[r->ext] : NULL;
}

/* Classifies the external reads of one slot over the steps that ran it and names what it reads. */
static void classify_slot(builder *b, struct slot *sl)
{
	struct tern_trace *t = b->t;
	uint64_t serial = 0;
	uint64_t hash = 0;
	bool same_serial = true, same_hash = true, first = true, pre = true, any_bound = false;
	const t_ext *e0 = NULL;
	for (size_t s = 0; s < t->n_steps; s++) {
		const t_ext *e = slot_read(b, sl, s);
		if (!e)
			continue;
		if (first) {
			serial = e->serial;
			hash = e->hash;
			e0 = e;
		}
		same_serial &= e->serial == serial;
		same_hash &= e->hash == hash;
		pre &= e->born == 0;
		int fi = first_index(t, e->serial);
		any_bound |= fi >= 0 && t->firsts[fi].bound;
		first = false;
	}
	if (!e0)
		return;
	int fi = first_index(t, serial);
	/* an initializer: a state when an update binds it, else a constant (one per tensor) */
	bool state = pre && same_serial && any_bound, cnst = pre && same_hash && !any_bound;
	if ((state || cnst) && fi >= 0) {
		for (size_t i = 0; i < b->n_states_list; i++)
			if (b->states[i].serial == serial) {
				sl->name = tern_strdup(b->states[i].name);
				return;
			}
		char *name = state ? bstr(b, "state_%d", b->n_states++) : bstr(b, "const_%d", b->n_consts++);
		Onnx__TensorProto *tp = bnew(b, sizeof *tp);
		if (name && tp) {
			onnx__tensor_proto__init(tp);
			if (tern_tensor_to_proto(&t->firsts[fi].value, tp))
				b->failed = 1;
			tp->name = tern_strdup(name);
			push(b, &b->inits, tp);
		}
		if (tern_grow((void **)&b->states, &b->cap_states, b->n_states_list + 1, sizeof *b->states)) {
			b->states[b->n_states_list].serial = serial;
			b->states[b->n_states_list].dtype = t->firsts[fi].value.dtype;
			b->states[b->n_states_list].rank = t->firsts[fi].value.rank;
			b->states[b->n_states_list].is_const = !state;
			b->states[b->n_states_list++].name = tern_strdup(name ? name : "");
		} else {
			b->failed = 1;
		}
		sl->name = name;
		return;
	}
	/* a graph input: one per tensor each step, shared by the slots that read the same tensors on the
	 * steps that run both */
	uint64_t *ser = calloc(t->n_steps + 1, sizeof *ser);
	if (!ser) {
		b->failed = 1;
		return;
	}
	for (size_t s = 0; s < t->n_steps; s++) {
		const t_ext *e = slot_read(b, sl, s);
		if (e)
			ser[s] = e->serial;
	}
	for (size_t i = 0; i < b->n_feeds; i++) {
		bool common = false, clash = false;
		for (size_t s = 0; s < t->n_steps; s++)
			if (ser[s] && b->feeds[i].serial[s])
				common = true, clash |= ser[s] != b->feeds[i].serial[s];
		if (common && !clash) {
			for (size_t s = 0; s < t->n_steps; s++)
				if (ser[s])
					b->feeds[i].serial[s] = ser[s];
			free(ser);
			sl->name = tern_strdup(b->feeds[i].name);
			return;
		}
	}
	if (!tern_grow((void **)&b->feeds, &b->cap_feeds, b->n_feeds + 1, sizeof *b->feeds)) {
		b->failed = 1;
		return;
	}
	struct feed *f = &b->feeds[b->n_feeds];
	memset(f, 0, sizeof *f);
	f->serial = ser;
	f->name = bstr(b, "feed_%zu", b->n_feeds);
	f->dtype = e0->dtype;
	f->rank = e0->rank;
	memcpy(f->dims, e0->dims, sizeof f->dims);
	for (size_t s = 0; s < t->n_steps; s++) {
		const t_ext *e = slot_read(b, sl, s);
		if (!e)
			continue;
		for (int d = 0; d < f->rank; d++)
			if (e->rank != f->rank || e->dims[d] != f->dims[d])
				f->varies[d] = 1;
	}
	b->n_feeds++;
	sl->name = tern_strdup(f->name);
	if (!f->name || !sl->name)
		b->failed = 1;
}

static void add_slot(builder *b, int region, int path, size_t pos, int input)
{
	if (!tern_grow((void **)&b->slots, &b->cap_slots, b->n_slots + 1, sizeof *b->slots)) {
		b->failed = 1;
		return;
	}
	struct slot *s = &b->slots[b->n_slots++];
	*s = (struct slot){region, path, pos, input, NULL};
	classify_slot(b, s);
	if (!s->name)
		s->name = tern_strdup("");
}

/* The name input i of operation j of path p reads, seen from where that operation is emitted;
 * override: the suffix inputs routed through the If. */
static char *input_name(builder *b, int p, size_t j, int i, char **override)
{
	const t_op *o = op_at(b, p, j);
	const t_in *r = &o->in[i];
	if (r->kind == IN_NONE)
		return tern_strdup("");
	if (override && override[i])
		return tern_strdup(override[i]);
	if (r->kind == IN_OP)
		return value_name(b, p, (size_t)r->op, r->out);
	size_t pos;
	int region = region_of(b, p, j, &pos);
	return tern_strdup(slot_name(b, region, p, pos, i));
}

static Onnx__NodeProto *emit_op(builder *b, int p, size_t j, char **override)
{
	const t_op *o = op_at(b, p, j);
	char **in = calloc((size_t)o->n_in + 1, sizeof *in), **out = calloc((size_t)o->n_out + 1, sizeof *out);
	if (!in || !out) {
		free(in);
		free(out);
		b->failed = 1;
		return NULL;
	}
	for (int i = 0; i < o->n_in; i++)
		in[i] = input_name(b, p, j, i, override);
	for (int k = 0; k < o->n_out; k++)
		out[k] = o->dtype[k] ? value_name(b, p, j, k) : tern_strdup("");
	Onnx__NodeProto *n = make_node(b, o->domain, o->op_type, in, o->n_in, out, o->n_out);
	free(in);
	free(out);
	for (int k = 0; n && k < o->n_attrs; k++)
		add_attr(b, n, tern_pb_copy(o->attrs[k]));
	if (n) {
		n->name = bstr(b, "%s", o->site);
		/* a site with its occurrence names the node: readable, and what co-execution matches */
	}
	return n;
}

/* The If outputs: per path the value each stands for (NULL: none on that path), their dtype, and
 * what reads them at the top level. */
typedef struct if_out {
	char **value; /* n_paths */
	int dtype;
	char *name;
} if_out;

static Onnx__GraphProto *new_graph(builder *b, const char *name)
{
	Onnx__GraphProto *g = bnew(b, sizeof *g);
	if (g) {
		onnx__graph_proto__init(g);
		g->name = tern_strdup(name);
	}
	return g;
}

static void graph_add(builder *b, Onnx__GraphProto *g, plist *nodes)
{
	if (!g) {
		for (size_t i = 0; i < nodes->n; i++)
			onnx__node_proto__free_unpacked(nodes->p[i], NULL);
		free(nodes->p);
		return;
	}
	g->node = (Onnx__NodeProto **)nodes->p;
	g->n_node = nodes->n;
	memset(nodes, 0, sizeof *nodes);
	(void)b;
}

/* The case of path p: its middle operations, then one Identity (or empty Constant) per If output. */
static Onnx__GraphProto *case_graph(builder *b, int p, if_out *outs, size_t n_outs)
{
	Onnx__GraphProto *g = new_graph(b, "case");
	plist nodes = {0};
	for (size_t j = b->L; j < b->len[p] - b->S; j++)
		push(b, &nodes, emit_op(b, p, j, NULL));
	Onnx__ValueInfoProto **vo = calloc(n_outs + 1, sizeof *vo);
	if (!vo)
		b->failed = 1;
	for (size_t o = 0; o < n_outs && vo; o++) {
		char *name = bstr(b, "c%d_out%zu", p, o);
		if (outs[o].value[p]) {
			char *in[1] = {tern_strdup(outs[o].value[p])}, *out[1] = {tern_strdup(name)};
			push(b, &nodes, make_node(b, "", "Identity", in, 1, out, 1));
		} else {
			push(b, &nodes, constant(b, tern_strdup(name), outs[o].dtype, 0, false));
		}
		tern_type ty = dtype_only(outs[o].dtype);
		vo[o] = value_info(b, name ? name : "", &ty);
		free(name);
	}
	graph_add(b, g, &nodes);
	if (g) {
		g->output = vo;
		g->n_output = vo ? n_outs : 0;
	} else if (vo) {
		for (size_t o = 0; o < n_outs; o++)
			if (vo[o])
				onnx__value_info_proto__free_unpacked(vo[o], NULL);
		free(vo);
	}
	return g;
}

static Onnx__AttributeProto *graph_attr(builder *b, const char *name, Onnx__GraphProto *g)
{
	Onnx__AttributeProto *a = bnew(b, sizeof *a);
	if (!a) {
		if (g)
			onnx__graph_proto__free_unpacked(g, NULL);
		return NULL;
	}
	onnx__attribute_proto__init(a);
	a->name = tern_strdup(name);
	a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
	a->has_type = 1;
	a->g = g;
	if (!g || !a->name)
		b->failed = 1;
	return a;
}

/* The If chain over paths [first, n_paths) into nodes, its outputs named out_names. */
static void if_chain(builder *b, plist *nodes, int first, if_out *outs, size_t n_outs, char **out_names)
{
	char *cond = bstr(b, "tern_path_is_%d", first), *k = bstr(b, "tern_path_%d", first);
	push(b, nodes, constant(b, tern_strdup(k ? k : ""), TERN_INT64, first, true));
	char *eq_in[2] = {tern_strdup("tern_path"), k}, *eq_out[1] = {tern_strdup(cond ? cond : "")};
	push(b, nodes, make_node(b, "", "Equal", eq_in, 2, eq_out, 1));
	char **o = calloc(n_outs + 1, sizeof *o);
	if (!o)
		b->failed = 1;
	for (size_t i = 0; i < n_outs && o; i++)
		o[i] = tern_strdup(out_names[i]);
	char *if_in[1] = {cond};
	Onnx__NodeProto *n = make_node(b, "", "If", if_in, 1, o ? o : NULL, o ? (int)n_outs : 0);
	free(o);
	if (n)
		n->name = bstr(b, "tern_path=%d", first);
	add_attr(b, n, graph_attr(b, "then_branch", case_graph(b, first, outs, n_outs)));
	Onnx__GraphProto *else_g;
	if (first + 2 == b->n_paths) {
		else_g = case_graph(b, first + 1, outs, n_outs);
	} else {
		else_g = new_graph(b, "else");
		plist inner = {0};
		char **names = calloc(n_outs + 1, sizeof *names);
		for (size_t i = 0; i < n_outs && names; i++)
			names[i] = bstr(b, "e%d_out%zu", first, i);
		if_chain(b, &inner, first + 1, outs, n_outs, names);
		graph_add(b, else_g, &inner);
		Onnx__ValueInfoProto **vo = calloc(n_outs + 1, sizeof *vo);
		for (size_t i = 0; i < n_outs && vo && names; i++) {
			tern_type ty = dtype_only(outs[i].dtype);
			vo[i] = value_info(b, names[i] ? names[i] : "", &ty);
		}
		if (else_g && vo) {
			else_g->output = vo;
			else_g->n_output = n_outs;
		} else {
			b->failed = 1;
			free(vo);
		}
		for (size_t i = 0; i < n_outs && names; i++)
			free(names[i]);
		free(names);
	}
	add_attr(b, n, graph_attr(b, "else_branch", else_g));
	push(b, nodes, n);
}

/* ---------------------------------------------------------------- the graph */

typedef struct outset {
	char **names;
	int *dtype;
	size_t n, cap;
} outset;

static void outset_add(builder *b, outset *s, const char *name, int dtype)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->names[i], name))
			return;
	size_t cap = s->cap;
	if (!tern_grow((void **)&s->names, &cap, s->n + 1, sizeof *s->names) ||
	    !tern_grow((void **)&s->dtype, &s->cap, s->n + 1, sizeof *s->dtype)) {
		b->failed = 1;
		return;
	}
	if (!(s->names[s->n] = tern_strdup(name)))
		b->failed = 1;
	s->dtype[s->n++] = dtype;
}

static size_t if_out_add(builder *b, if_out **outs, size_t *n, size_t *cap, int dtype)
{
	if (!tern_grow((void **)outs, cap, *n + 1, sizeof **outs)) {
		b->failed = 1;
		return (size_t)-1;
	}
	if_out *o = &(*outs)[*n];
	o->value = calloc((size_t)b->n_paths, sizeof *o->value);
	o->dtype = dtype;
	o->name = bstr(b, "if_%zu", *n);
	if (!o->value)
		b->failed = 1;
	return (*n)++;
}

/* Where operation j's input i of every path comes from, for a suffix operation: 1 when the
 * suffix's own value at the same place on every path, 0 when the same prefix value on every path,
 * -1 when it must come out of the If, -2 when the suffix cannot start at or before this operation. */
static int suffix_input(const builder *b, size_t u, int i)
{
	int kind = 2;
	long rel = -1, abs_q = -1;
	bool mixed_prefix = false;
	for (int p = 0; p < b->n_paths; p++) {
		size_t j = b->len[p] - b->S + u;
		const t_in *r = &op_at(b, p, j)->in[i];
		if (r->kind != IN_OP)
			return 0;
		size_t q = (size_t)r->op;
		int k = q >= b->len[p] - b->S ? 1 : q < b->L ? 0 : -1;
		if (p == 0) {
			kind = k;
			rel = k == 1 ? (long)(q - (b->len[p] - b->S)) : -1;
			abs_q = k == 0 ? (long)q : -1;
		} else {
			if ((k == 1) != (kind == 1))
				return -2;
			if (k == 1 && (long)(q - (b->len[p] - b->S)) != rel)
				return -2;
			if (k != kind || (k == 0 && (long)q != abs_q))
				mixed_prefix = true;
		}
	}
	if (kind == 1)
		return 1;
	return kind == 0 && !mixed_prefix ? 0 : -1;
}

static tern_status write_record(struct tern_trace *t, builder *b, char ****fetch_of);
/* The training step's copy: every value its nodes make renamed train/NAME, so that the step and the
 * main graph can be planned together (tern-autodiff's convention). */
typedef struct nameset {
	char **p;
	size_t n, cap;
} nameset;

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void collect_outputs(builder *b, const Onnx__GraphProto *g, nameset *s)
{
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		for (size_t k = 0; k < n->n_output; k++) {
			if (!*n->output[k])
				continue;
			if (!tern_grow((void **)&s->p, &s->cap, s->n + 1, sizeof *s->p)) {
				b->failed = 1;
				return;
			}
			s->p[s->n++] = n->output[k];
		}
		for (size_t a = 0; a < n->n_attribute; a++)
			if (n->attribute[a]->g)
				collect_outputs(b, n->attribute[a]->g, s);
	}
}

static void rename_in(builder *b, char **name, const nameset *s)
{
	if (!**name || !bsearch(name, s->p, s->n, sizeof *s->p, cmp_str))
		return;
	char *r = bstr(b, "train/%s", *name);
	if (r) {
		free(*name);
		*name = r;
	}
}

static void rename_graph(builder *b, Onnx__GraphProto *g, const nameset *s)
{
	for (size_t i = 0; i < g->n_node; i++) {
		Onnx__NodeProto *n = g->node[i];
		for (size_t k = 0; k < n->n_input; k++)
			rename_in(b, &n->input[k], s);
		for (size_t k = 0; k < n->n_output; k++)
			rename_in(b, &n->output[k], s);
		for (size_t a = 0; a < n->n_attribute; a++)
			if (n->attribute[a]->g)
				rename_graph(b, n->attribute[a]->g, s);
	}
	for (size_t o = 0; o < g->n_output; o++)
		rename_in(b, &g->output[o]->name, s);
}

static void rename_step(builder *b, Onnx__GraphProto *g)
{
	nameset s = {0};
	collect_outputs(b, g, &s);
	/* the names point into g: copied before g changes */
	for (size_t i = 0; i < s.n; i++)
		if (!(s.p[i] = tern_strdup(s.p[i])))
			b->failed = 1;
	qsort(s.p, s.n, sizeof *s.p, cmp_str);
	if (!b->failed)
		rename_graph(b, g, &s);
	for (size_t i = 0; i < s.n; i++)
		free(s.p[i]);
	free(s.p);
}


static tern_status trace_write(struct tern_trace *t)
{
	t->written = 1;
	if (t->error)
		return tern_errorf(t->error, "trace: recording failed (out of memory)");
	builder B = {0}, *b = &B;
	b->t = t;
	/* paths */
	b->rep = calloc(t->n_steps + 1, sizeof *b->rep);
	b->len = calloc(t->n_steps + 1, sizeof *b->len);
	if (!b->rep || !b->len) {
		free(b->rep);
		free(b->len);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (size_t s = 0; s < t->n_steps; s++) {
		int p = path_of(t, b->rep, b->n_paths, &t->steps[s]);
		if (p == b->n_paths) {
			b->rep[b->n_paths] = (int)s;
			b->len[b->n_paths++] = t->steps[s].n_ops;
		}
		t->steps[s].path = p;
	}
	t->paths_gen++;
	free(t->path_rep);
	t->path_rep = calloc((size_t)b->n_paths + 1, sizeof *t->path_rep);
	t->n_paths = t->path_rep ? b->n_paths : 0;
	for (int p = 0; p < t->n_paths; p++)
		t->path_rep[p] = b->rep[p];
	size_t min_len = b->len[0];
	for (int p = 1; p < b->n_paths; p++)
		if (b->len[p] < min_len)
			min_len = b->len[p];
	if (b->n_paths == 1) {
		b->L = b->len[0];
	} else {
		while (b->L < min_len) {
			bool same = true;
			for (int p = 1; p < b->n_paths && same; p++)
				same = same_op(op_at(b, p, b->L), op_at(b, 0, b->L), true);
			if (!same)
				break;
			b->L++;
		}
		while (b->L + b->S < min_len) {
			bool same = true;
			for (int p = 1; p < b->n_paths && same; p++)
				same = same_op(op_at(b, p, b->len[p] - 1 - b->S), op_at(b, 0, b->len[0] - 1 - b->S), false);
			if (!same)
				break;
			b->S++;
		}
		/* a suffix operation reading the suffix on one path and not on another starts a shorter suffix */
		for (bool again = true; again;) {
			again = false;
			for (size_t u = 0; u < b->S && !again; u++) {
				const t_op *o = op_at(b, 0, b->len[0] - b->S + u);
				for (int i = 0; i < o->n_in && !again; i++)
					if (suffix_input(b, u, i) == -2) {
						b->S -= u + 1;
						again = true;
					}
			}
		}
	}
	/* slots: every external read */
	for (size_t j = 0; j < b->L; j++)
		for (int i = 0; i < op_at(b, 0, j)->n_in; i++)
			if (op_at(b, 0, j)->in[i].kind == IN_EXT)
				add_slot(b, 0, 0, j, i);
	for (size_t u = 0; u < b->S; u++) {
		const t_op *o = op_at(b, 0, b->len[0] - b->S + u);
		for (int i = 0; i < o->n_in; i++)
			if (o->in[i].kind == IN_EXT)
				add_slot(b, 1, 0, u, i);
	}
	for (int p = 0; p < b->n_paths && b->n_paths > 1; p++)
		for (size_t j = b->L; j < b->len[p] - b->S; j++)
			for (int i = 0; i < op_at(b, p, j)->n_in; i++)
				if (op_at(b, p, j)->in[i].kind == IN_EXT)
					add_slot(b, 2, p, j - b->L, i);
	/* states updated but never read: initializers all the same */
	for (size_t f = 0; f < t->n_firsts; f++) {
		if (!t->firsts[f].bound)
			continue;
		bool known = false;
		for (size_t i = 0; i < b->n_states_list; i++)
			known |= b->states[i].serial == t->firsts[f].serial;
		if (known)
			continue;
		char *name = bstr(b, "state_%d", b->n_states++);
		Onnx__TensorProto *tp = bnew(b, sizeof *tp);
		if (name && tp) {
			onnx__tensor_proto__init(tp);
			if (tern_tensor_to_proto(&t->firsts[f].value, tp))
				b->failed = 1;
			tp->name = tern_strdup(name);
			push(b, &b->inits, tp);
		}
		if (tern_grow((void **)&b->states, &b->cap_states, b->n_states_list + 1, sizeof *b->states)) {
			b->states[b->n_states_list].serial = t->firsts[f].serial;
			b->states[b->n_states_list].dtype = t->firsts[f].value.dtype;
			b->states[b->n_states_list].rank = t->firsts[f].value.rank;
			b->states[b->n_states_list++].name = tern_strdup(name ? name : "");
		}
		free(name);
	}
	/* If outputs: suffix inputs routed through it, fetches and updates made in the middle */
	if_out *outs = NULL;
	size_t n_outs = 0, cap_outs = 0;
	char ***override = calloc(b->S + 1, sizeof *override);
	if (!override)
		b->failed = 1;
	for (size_t u = 0; u < b->S && override; u++) {
		const t_op *o = op_at(b, 0, b->len[0] - b->S + u);
		for (int i = 0; i < o->n_in; i++) {
			if (suffix_input(b, u, i) != -1)
				continue;
			if (!override[u] && !(override[u] = calloc((size_t)o->n_in + 1, sizeof *override[u]))) {
				b->failed = 1;
				break;
			}
			const t_in *r0 = &o->in[i];
			const t_op *pr = op_at(b, 0, (size_t)r0->op);
			size_t k = if_out_add(b, &outs, &n_outs, &cap_outs, TYPE_OF(pr->dtype[r0->out], pr->rank[r0->out]));
			if (k == (size_t)-1)
				break;
			override[u][i] = tern_strdup(outs[k].name ? outs[k].name : "");
			for (int p = 0; p < b->n_paths; p++) {
				const t_in *r = &op_at(b, p, b->len[p] - b->S + u)->in[i];
				outs[k].value[p] = value_name(b, p, (size_t)r->op, r->out);
			}
		}
	}
	outset fetches = {0};
	char ****fetch_of = calloc(t->n_steps + 1, sizeof *fetch_of); /* per step and op: per output, its graph output */
	if (!fetch_of)
		b->failed = 1;
	for (size_t s = 0; s < t->n_steps && fetch_of; s++) {
		const t_step *st = &t->steps[s];
		int p = st->path;
		if (!(fetch_of[s] = calloc(st->n_ops + 1, sizeof *fetch_of[s]))) {
			b->failed = 1;
			break;
		}
		for (size_t j = 0; j < st->n_ops; j++) {
			const t_op *o = &st->ops[j];
			for (int k = 0; k < o->n_out; k++) {
				if (!o->fetched[k])
					continue;
				size_t pos;
				char *name = NULL;
				if (region_of(b, p, j, &pos) != 2) {
					name = value_name(b, p, j, k);
				} else {
					char *v = value_name(b, p, j, k);
					for (size_t x = 0; x < n_outs && !name; x++)
						if (outs[x].value[p] && v && !strcmp(outs[x].value[p], v) &&
						    !strncmp(outs[x].name, "if_", 3))
							name = tern_strdup(outs[x].name);
					if (!name) {
						size_t x = if_out_add(b, &outs, &n_outs, &cap_outs, TYPE_OF(o->dtype[k], o->rank[k]));
						if (x != (size_t)-1) {
							outs[x].value[p] = v;
							v = NULL;
							name = tern_strdup(outs[x].name);
						}
					}
					free(v);
				}
				if (!name) {
					b->failed = 1;
					continue;
				}
				outset_add(b, &fetches, name, TYPE_OF(o->dtype[k], o->rank[k]));
				if (!fetch_of[s][j] && !(fetch_of[s][j] = calloc((size_t)o->n_out + 1, sizeof *fetch_of[s][j])))
					b->failed = 1;
				if (fetch_of[s][j])
					fetch_of[s][j][k] = name;
				else
					free(name);
			}
		}
	}
	/* updates */
	outset updates = {0};
	char **update_state = calloc(b->n_states_list + 1, sizeof *update_state);
	tern_status st = TERN_OK;
	for (size_t q = 0; q < b->n_states_list && update_state; q++) {
		char **where = calloc((size_t)b->n_paths + 1, sizeof *where);
		int regions = 0; /* bit 0 top level, 1 middle */
		bool any = false;
		for (int p = 0; p < b->n_paths && where; p++) {
			const t_step *s0 = &t->steps[b->rep[p]];
			for (size_t x = 0; x < s0->n_binds; x++)
				if (s0->binds[x].serial == b->states[q].serial) {
					size_t pos;
					int r = region_of(b, p, (size_t)s0->binds[x].op, &pos);
					where[p] = value_name(b, p, (size_t)s0->binds[x].op, s0->binds[x].out);
					regions |= r == 2 ? 2 : r == 1 ? 4 : 1;
					any = true;
				}
		}
		if (!where) {
			b->failed = 1;
			break;
		}
		bool same = any;
		for (int p = 1; p < b->n_paths && same; p++)
			same = where[p] && where[0] && !strcmp(where[p], where[0]);
		if (same) {
			update_state[q] = tern_strdup(where[0]);
		} else if (any && (regions & 4)) {
			st = tern_errorf(TERN_EUSAGE, "trace: %s is updated after the paths meet again on some paths and "
			                              "elsewhere on others, which one graph cannot say", b->states[q].name);
		} else if (any) {
			size_t k = if_out_add(b, &outs, &n_outs, &cap_outs, TYPE_OF(b->states[q].dtype, b->states[q].rank));
			if (k != (size_t)-1) {
				for (int p = 0; p < b->n_paths; p++)
					outs[k].value[p] = where[p] ? where[p] : tern_strdup(b->states[q].name), where[p] = NULL;
				update_state[q] = tern_strdup(outs[k].name);
			}
		}
		for (int p = 0; p < b->n_paths; p++)
			free(where[p]);
		free(where);
	}
	/* the main graph */
	Onnx__GraphProto *g = new_graph(b, "trace");
	plist nodes = {0};
	for (size_t j = 0; j < b->L; j++)
		push(b, &nodes, emit_op(b, 0, j, NULL));
	if (b->n_paths > 1) {
		char **names = calloc(n_outs + 1, sizeof *names);
		for (size_t o = 0; o < n_outs && names; o++)
			names[o] = outs[o].name;
		if_chain(b, &nodes, 0, outs, n_outs, names ? names : NULL);
		free(names);
	}
	for (size_t u = 0; u < b->S; u++)
		push(b, &nodes, emit_op(b, 0, b->len[0] - b->S + u, override ? override[u] : NULL));
	graph_add(b, g, &nodes);
	plist ins = {0}, outl = {0};
	if (b->n_paths > 1) {
		tern_type ty = {.dtype = TERN_INT64, .rank = 0};
		push(b, &ins, value_info(b, "tern_path", &ty));
	}
	char dimbuf[TERN_MAX_RANK][32];
	for (size_t f = 0; f < b->n_feeds; f++) {
		tern_type ty = {.dtype = b->feeds[f].dtype, .rank = b->feeds[f].rank};
		for (int d = 0; d < ty.rank; d++) {
			ty.dims[d] = b->feeds[f].varies[d] ? -1 : b->feeds[f].dims[d];
			snprintf(dimbuf[d], sizeof dimbuf[d], "%s_d%d", b->feeds[f].name, d);
			ty.dim_param[d] = b->feeds[f].varies[d] ? dimbuf[d] : NULL;
		}
		push(b, &ins, value_info(b, b->feeds[f].name, &ty));
	}
	for (size_t o = 0; o < fetches.n; o++) {
		tern_type ty = dtype_only(fetches.dtype[o]);
		push(b, &outl, value_info(b, fetches.names[o], &ty));
	}
	if (g) {
		g->input = (Onnx__ValueInfoProto **)ins.p;
		g->n_input = ins.n;
		g->output = (Onnx__ValueInfoProto **)outl.p;
		g->n_output = outl.n;
		g->initializer = (Onnx__TensorProto **)b->inits.p;
		g->n_initializer = b->inits.n;
		memset(&b->inits, 0, sizeof b->inits);
	}
	Onnx__ModelProto *m = bnew(b, sizeof *m);
	if (m) {
		onnx__model_proto__init(m);
		m->ir_version = 8;
		m->has_ir_version = 1;
		m->producer_name = tern_strdup("tern-trace");
		m->graph = g;
		m->opset_import = calloc(3, sizeof *m->opset_import);
		const char *doms[2] = {"", "tern"};
		int64_t vers[2] = {tern_ctx_opset(t->ctx), 1};
		for (int d = 0; d < 2 && m->opset_import; d++) {
			Onnx__OperatorSetIdProto *op = bnew(b, sizeof *op);
			if (!op)
				break;
			onnx__operator_set_id_proto__init(op);
			op->domain = tern_strdup(doms[d]);
			op->version = vers[d];
			op->has_version = 1;
			m->opset_import[m->n_opset_import++] = op;
		}
		/* training_info: the same step, its outputs the fetches and the updated states */
		bool updates_any = false;
		for (size_t q = 0; q < b->n_states_list && update_state; q++)
			updates_any |= update_state[q] != NULL;
		if (updates_any && g) {
			Onnx__TrainingInfoProto *ti = bnew(b, sizeof *ti);
			Onnx__GraphProto *alg = tern_pb_copy(g);
			if (ti && alg) {
				onnx__training_info_proto__init(ti);
				for (size_t i = 0; i < alg->n_initializer; i++)
					onnx__tensor_proto__free_unpacked(alg->initializer[i], &tern_pb_allocator);
				free(alg->initializer);
				alg->initializer = NULL;
				alg->n_initializer = 0;
				/* the main graph's inputs are the step's too (as tern-autodiff writes it): not listed again */
				for (size_t i = 0; i < alg->n_input; i++)
					onnx__value_info_proto__free_unpacked(alg->input[i], &tern_pb_allocator);
				free(alg->input);
				alg->input = NULL;
				alg->n_input = 0;
				free(alg->name);
				alg->name = tern_strdup("trace_step");
				rename_step(b, alg);
				ti->algorithm = alg;
				ti->update_binding = calloc(b->n_states_list + 1, sizeof *ti->update_binding);
				for (size_t q = 0; q < b->n_states_list && ti->update_binding; q++) {
					if (!update_state[q])
						continue;
					Onnx__StringStringEntryProto *e = bnew(b, sizeof *e);
					if (!e)
						break;
					onnx__string_string_entry_proto__init(e);
					e->key = tern_strdup(b->states[q].name);
					e->value = bstr(b, "train/%s", update_state[q]);
					ti->update_binding[ti->n_update_binding++] = e;
					outset_add(b, &updates, e->value ? e->value : "", TYPE_OF(b->states[q].dtype, b->states[q].rank));
				}
				/* the algorithm's outputs: the fetches, then what the bindings name */
				Onnx__ValueInfoProto **vo = realloc(alg->output, (alg->n_output + updates.n + 1) * sizeof *vo);
				if (vo) {
					alg->output = vo;
					for (size_t u = 0; u < updates.n; u++) {
						bool dup = false;
						for (size_t o = 0; o < alg->n_output; o++)
							dup |= !strcmp(alg->output[o]->name, updates.names[u]);
						if (dup)
							continue;
						tern_type ty = dtype_only(updates.dtype[u]);
						alg->output[alg->n_output] = value_info(b, updates.names[u], &ty);
						if (alg->output[alg->n_output])
							alg->n_output++;
					}
				} else {
					b->failed = 1;
				}
				m->training_info = calloc(1, sizeof *m->training_info);
				if (m->training_info) {
					m->training_info[0] = ti;
					m->n_training_info = 1;
				} else {
					onnx__training_info_proto__free_unpacked(ti, NULL);
					b->failed = 1;
				}
			} else {
				free(ti);
				if (alg)
					onnx__graph_proto__free_unpacked(alg, &tern_pb_allocator);
			}
		}
	} else if (g) {
		onnx__graph_proto__free_unpacked(g, NULL);
	}
	if (!st && b->failed)
		st = tern_errorf(TERN_EOS, "trace: out of memory building the graph");
	/* checked by loading it as any tool would, then written whole or not at all */
	void *bytes = NULL;
	size_t size = 0;
	tern_model *model = NULL;
	if (!st && m) {
		size = onnx__model_proto__get_packed_size(m);
		if (!(bytes = malloc(size ? size : 1)))
			st = tern_errorf(TERN_EOS, "out of memory");
		else
			onnx__model_proto__pack(m, bytes);
	}
	if (!st)
		st = tern_model_load_bytes(bytes, size, t->path, NULL, &model);
	if (!st) {
		size_t n = strlen(t->path) + 16;
		char *tmp = malloc(n);
		FILE *f = tmp ? (snprintf(tmp, n, "%s.partial", t->path), fopen(tmp, "wb")) : NULL;
		if (!f) {
			st = tern_errorf(TERN_EIO, "%s: %s", tmp ? tmp : t->path, strerror(errno));
		} else {
			/* the bytes just checked (writing the loaded model would pack it all again) */
			if (size && fwrite(bytes, 1, size, f) != size)
				st = tern_errorf(TERN_EIO, "%s: %s", tmp, strerror(errno));
			if (fclose(f) && !st)
				st = tern_errorf(TERN_EIO, "%s: %s", tmp, strerror(errno));
			if (!st && rename(tmp, t->path))
				st = tern_errorf(TERN_EIO, "%s: %s", t->path, strerror(errno));
			if (st)
				remove(tmp);
		}
		free(tmp);
	}
	if (!st && t->record_dir)
		st = write_record(t, b, fetch_of);
	if (!st && t->verbose) {
		fprintf(stderr, "tern-trace: %s: %zu steps, %d path%s, %zu nodes shared before and %zu after the branch, %zu "
		                "inputs, %zu outputs, %d states\n",
		        t->path, t->n_steps, b->n_paths, b->n_paths == 1 ? "" : "s", b->L, b->S, b->n_feeds, fetches.n,
		        b->n_states);
	}
	tern_model_free(model);
	free(bytes);
	if (m)
		onnx__model_proto__free_unpacked(m, &tern_pb_allocator);
	/* the builder's own */
	for (size_t x = 0; x < n_outs; x++) {
		for (int p = 0; p < b->n_paths; p++)
			free(outs[x].value[p]);
		free(outs[x].value);
		free(outs[x].name);
	}
	free(outs);
	for (size_t u = 0; u < b->S && override; u++) {
		if (!override[u])
			continue;
		for (int i = 0; i < op_at(b, 0, b->len[0] - b->S + u)->n_in; i++)
			free(override[u][i]);
		free(override[u]);
	}
	free(override);
	for (size_t s = 0; s < t->n_steps && fetch_of; s++) {
		for (size_t j = 0; fetch_of[s] && j < t->steps[s].n_ops; j++) {
			for (int k = 0; fetch_of[s][j] && k < t->steps[s].ops[j].n_out; k++)
				free(fetch_of[s][j][k]);
			free(fetch_of[s][j]);
		}
		free(fetch_of[s]);
	}
	free(fetch_of);
	for (size_t o = 0; o < fetches.n; o++)
		free(fetches.names[o]);
	free(fetches.names);
	free(fetches.dtype);
	for (size_t o = 0; o < updates.n; o++)
		free(updates.names[o]);
	free(updates.names);
	free(updates.dtype);
	for (size_t q = 0; q < b->n_states_list; q++) {
		free(b->states[q].name);
		if (update_state)
			free(update_state[q]);
	}
	free(update_state);
	free(b->states);
	for (size_t i = 0; i < b->n_slots; i++)
		free(b->slots[i].name);
	free(b->slots);
	for (size_t f = 0; f < b->n_feeds; f++) {
		free(b->feeds[f].name);
		free(b->feeds[f].serial);
	}
	free(b->feeds);
	for (size_t i = 0; i < b->inits.n; i++)
		onnx__tensor_proto__free_unpacked(b->inits.p[i], NULL);
	free(b->inits.p);
	free(b->rep);
	free(b->len);
	return st;
}

/* record_dir/stepN/: tern_path.npy and each graph input the step fed (NAME.npy), and the fetched
 * outputs under fetched/NAME.npy, so that the graph can be run on a step and compared. */
static tern_status write_record(struct tern_trace *t, builder *b, char ****fetch_of)
{
	if (mkdir(t->record_dir, 0777) && errno != EEXIST)
		return tern_errorf(TERN_EIO, "%s: %s", t->record_dir, strerror(errno));
	char path[4096];
	for (size_t s = 0; s < t->n_steps; s++) {
		const t_step *st = &t->steps[s];
		snprintf(path, sizeof path, "%s/step%zu", t->record_dir, s + 1);
		if (mkdir(path, 0777) && errno != EEXIST)
			return tern_errorf(TERN_EIO, "%s: %s", path, strerror(errno));
		snprintf(path, sizeof path, "%s/step%zu/fetched", t->record_dir, s + 1);
		if (mkdir(path, 0777) && errno != EEXIST)
			return tern_errorf(TERN_EIO, "%s: %s", path, strerror(errno));
		tern_tensor sel = {0};
		tern_status rc = tern_tensor_alloc(&sel, TERN_INT64, 0, NULL);
		if (rc)
			return rc;
		*(int64_t *)sel.data = st->path;
		snprintf(path, sizeof path, "%s/step%zu/tern_path.npy", t->record_dir, s + 1);
		if (b->n_paths > 1)
			rc = tern_tensor_write_file(path, &sel);
		tern_tensor_free(&sel);
		if (rc)
			return rc;
		char *seen = calloc(b->n_slots + 1, 1);
		if (!seen)
			return tern_errorf(TERN_EOS, "out of memory");
		for (size_t i = 0; i < b->n_slots; i++) {
			const struct slot *sl = &b->slots[i];
			bool state = !strncmp(sl->name, "state_", 6);
			if ((strncmp(sl->name, "feed_", 5) && !state) || (sl->region == 2 && sl->path != st->path))
				continue;
			bool dup = false; /* a state's value as the step first read it (before its update) */
			for (size_t q = 0; q < i && state; q++)
				dup |= seen[q] && !strcmp(b->slots[q].name, sl->name);
			if (dup)
				continue;
			seen[i] = 1;
			const t_ext *e = slot_read(b, sl, s);
			if (!e)
				continue;
			snprintf(path, sizeof path, "%s/step%zu/%s.npy", t->record_dir, s + 1, sl->name);
			if ((rc = tern_tensor_write_file(path, &e->value))) {
				free(seen);
				return rc;
			}
		}
		free(seen);
		/* inputs only another path reads: zeros of their shape, so that every step runs as a whole */
		for (size_t f = 0; f < b->n_feeds; f++) {
			if (b->feeds[f].serial[s])
				continue;
			tern_tensor z = {0};
			int64_t dims[TERN_MAX_RANK];
			for (int d = 0; d < b->feeds[f].rank; d++)
				dims[d] = b->feeds[f].varies[d] ? 1 : b->feeds[f].dims[d];
			snprintf(path, sizeof path, "%s/step%zu/%s.npy", t->record_dir, s + 1, b->feeds[f].name);
			if ((rc = tern_tensor_alloc(&z, b->feeds[f].dtype, b->feeds[f].rank, dims)) ||
			    (rc = tern_tensor_write_file(path, &z))) {
				tern_tensor_free(&z);
				return rc;
			}
			tern_tensor_free(&z);
		}
		for (size_t j = 0; j < st->n_ops; j++)
			for (int k = 0; fetch_of[s][j] && k < st->ops[j].n_out; k++) {
				if (!fetch_of[s][j][k] || !st->ops[j].fetch_value)
					continue;
				snprintf(path, sizeof path, "%s/step%zu/fetched/%s.npy", t->record_dir, s + 1, fetch_of[s][j][k]);
				if ((rc = tern_tensor_write_file(path, &st->ops[j].fetch_value[k])))
					return rc;
			}
	}
	return TERN_OK;
}
