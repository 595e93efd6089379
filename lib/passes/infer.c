/* infer.c — shape inference for everyone to see: the type of every value of the main graph that tern's
 * own rules (each operator's prepare function, as the planner runs it) can decide, written back as
 * value_info, so that tern-show, DOT and any ONNX tool read the shapes tern-run will use.
 *
 * prepare functions compute with numbers, so a symbolic dimension is given a stand-in size. The graph
 * is inferred twice, each symbol standing for a different prime each time: a dimension that comes out
 * the same both times does not depend on the symbols and is written as a number; one that comes out
 * as a symbol's stand-in both times is that symbol (Reshape to [-1, 64] keeps the batch N); any other
 * is unknown. Small integer values are computed along the way (Shape, Gather, Concat, arithmetic on
 * them), so shapes that exporters compute in the graph are known where onnx's inference stops. */
#include "passes/passes.h"

#include <stdlib.h>

#define MAX_SYMBOLS 24
/* Values computed while inferring: integer tensors of at most this many elements (shape arithmetic). */
#define MAX_VALUE_ELEMS 1024

static const int64_t stand_in[2][MAX_SYMBOLS] = {
        {89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181, 191, 193,
         197, 199, 211},
        {223, 227, 229, 233, 239, 241, 251, 257, 263, 269, 271, 277, 281, 283, 293, 307, 311, 313, 317, 331,
         337, 347, 349, 353},
};

/* One value in one pass: its type, and its data when known (owned unless it views a weight). */
struct slot {
	bool known;
	tern_tensor t; /* dtype, rank, dims; data when known */
	bool owns;
};

struct symbols {
	const char *name[MAX_SYMBOLS]; /* NULL: an unnamed unknown dimension of an input */
	int n;
};

static int symbol_of(struct symbols *s, const char *name)
{
	if (name)
		for (int i = 0; i < s->n; i++)
			if (s->name[i] && strcmp(s->name[i], name) == 0)
				return i;
	if (s->n == MAX_SYMBOLS)
		return -1;
	s->name[s->n] = name;
	return s->n++;
}

static bool small_int(int dtype, int64_t numel)
{
	return (dtype == TERN_INT64 || dtype == TERN_INT32) && numel <= MAX_VALUE_ELEMS;
}

static bool deterministic(const tern_node *n)
{
	return strncmp(n->op_type, "Random", 6) != 0 && strcmp(n->op_type, "Bernoulli") != 0 &&
	       strcmp(n->op_type, "Multinomial") != 0;
}

static void release(struct slot *slots, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (slots[i].owns)
			tern_tensor_free(&slots[i].t);
	free(slots);
}

/* The inputs' shapes for pass `pass`, symbols replaced by their stand-ins. An input of unknown rank
 * stays unknown (nothing downstream of it is typed; the rest is). */
static void seed_inputs(tern_graph *g, struct slot *slots, struct symbols *sym, int pass)
{
	int unnamed = -1; /* the unnamed dimensions' symbols, in the order they were collected */
	for (size_t i = 0; i < g->n_inputs; i++) {
		tern_value *v = g->inputs[i];
		if (v->flags & TERN_VALUE_INITIALIZER)
			continue;
		if (!v->type.dtype || v->type.rank < 0 || v->type.rank > TERN_MAX_RANK)
			continue;
		int64_t dims[TERN_MAX_RANK];
		bool ok = true;
		for (int d = 0; d < v->type.rank; d++) {
			dims[d] = v->type.dims[d];
			if (dims[d] >= 0)
				continue;
			int s = -1;
			if (v->type.dim_param[d]) {
				s = symbol_of(sym, v->type.dim_param[d]);
			} else {
				while (++unnamed < sym->n && sym->name[unnamed])
					;
				s = unnamed < sym->n ? unnamed : -1;
			}
			if (s < 0)
				ok = false; /* more symbols than stand-ins */
			else
				dims[d] = stand_in[pass][s];
		}
		if (!ok)
			continue;
		slots[v->index].known = true;
		tern_set_shape(&slots[v->index].t, v->type.dtype, v->type.rank, dims);
		slots[v->index].t.data = NULL;
	}
}

static void seed_initializers(tern_graph *g, struct slot *slots)
{
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if (!(v->flags & TERN_VALUE_INITIALIZER) || !v->initializer)
			continue;
		struct slot *s = &slots[i];
		const Onnx__TensorProto *tp = v->initializer;
		if (tp->n_dims > TERN_MAX_RANK || !tp->has_data_type)
			continue;
		/* a default the caller may override has its type but no fixed value */
		bool fixed = !(v->flags & TERN_VALUE_INPUT);
		if (fixed && tern_tensor_view_proto(tp, &s->t)) {
			s->known = true;
		} else if (fixed && tern_tensor_from_proto(tp, g->model->base_dir, v->name, &s->t) == TERN_OK) {
			s->known = s->owns = true;
		} else {
			tern_error_clear();
			int64_t dims[TERN_MAX_RANK];
			for (size_t d = 0; d < tp->n_dims; d++)
				dims[d] = tp->dims[d];
			s->known = true;
			tern_set_shape(&s->t, tp->data_type, (int)tp->n_dims, dims);
			s->t.data = NULL;
		}
	}
}

/* ---------------------------------------------------------------- through calls and Ifs */

/* With tern_model_infer_types_through_calls: a call's outputs are typed from its body planned on
 * the call's input types, an If's from its branches (the first that types an output), a Loop's
 * carried values from one trip of its body, each body in
 * the scope of the values it reads from outside. A function already being typed further up (a
 * recursion) types nothing: the If around the recursive call types its outputs from the other
 * branch. */
struct scope {
	tern_graph *g;
	struct slot *slots;
	struct scope *up;
};
static _Thread_local struct scope *current_scope;
static _Thread_local int through_calls;
static _Thread_local const tern_graph *typing[64];
static _Thread_local int n_typing;

static void infer_node(struct slot *slots, tern_node *n);

/* A dimension that depends on data the inference does not have (a Slice whose bounds a Loop's trip
 * computes) stands in as a size of its own in each pass: typed downstream, unknown in the end. */
static _Thread_local int current_pass;
static _Thread_local bool data_dependent_made; /* then a second pass tells it from a number */
static const int64_t data_dependent[2] = {359, 367};

/* A Slice of known data whose bounds are not known: the data's type, each sliced axis (all where
 * axes is not given) of unknown size. */
static bool slice_of_unknown_bounds(const tern_node *n, tern_tensor *const *in, struct slot *slots)
{
	if (!tern_pass_is(n, "Slice") || n->n_inputs < 3 || !in[0] || n->n_outputs != 1 || !n->outputs[0])
		return false;
	bool all = n->n_inputs < 4 || !in[3], axes[TERN_MAX_RANK] = {false};
	if (!all && (!in[3]->data || tern_tensor_numel(in[3]) > TERN_MAX_RANK))
		return false;
	for (int64_t i = 0; !all && i < tern_tensor_numel(in[3]); i++) {
		int64_t a = tern_tensor_get_i64(in[3], i);
		a += a < 0 ? in[0]->rank : 0;
		if (a < 0 || a >= in[0]->rank)
			return false;
		axes[a] = true;
	}
	int64_t dims[TERN_MAX_RANK];
	for (int d = 0; d < in[0]->rank; d++)
		dims[d] = all || axes[d] ? data_dependent[current_pass & 1] : in[0]->dims[d];
	struct slot *o = &slots[n->outputs[0]->index];
	data_dependent_made = true;
	tern_set_shape(&o->t, in[0]->dtype, in[0]->rank, dims);
	o->t.data = NULL;
	o->known = true;
	return true;
}

/* Infers g's nodes in order on slots, in the scope of the graphs above (up). */
static tern_status infer_nodes(tern_graph *g, struct slot *slots, struct scope *up)
{
	tern_node **order;
	size_t count;
	tern_status st = tern_graph_toposort(g, &order, &count);
	if (st)
		return st;
	struct scope sc = {g, slots, up}, *saved = current_scope;
	current_scope = &sc;
	for (size_t i = 0; i < count; i++)
		infer_node(slots, order[i]);
	current_scope = saved;
	free(order);
	return TERN_OK;
}

static const struct slot *outer_slot_of(struct scope *sc, const tern_value *v)
{
	while (v && (v->flags & TERN_VALUE_OUTER))
		v = v->outer;
	for (; v && sc; sc = sc->up)
		if ((size_t)v->index < sc->g->n_values && sc->g->values[v->index] == v)
			return &sc->slots[v->index];
	return NULL;
}

/* Infers body g, its inputs typed by in[] (NULL: unknown) and its outer values from the scopes
 * above; returns its slots (NULL on failure). */
static struct slot *infer_body(tern_graph *g, const struct slot *const *in, size_t n_in, struct scope *up)
{
	struct slot *slots = calloc(g->n_values ? g->n_values : 1, sizeof *slots);
	if (!slots)
		return NULL;
	seed_initializers(g, slots);
	for (size_t i = 0; i < g->n_inputs && i < n_in; i++)
		if (in[i] && in[i]->known) {
			slots[g->inputs[i]->index] = *in[i];
			slots[g->inputs[i]->index].owns = false;
		}
	for (size_t i = 0; i < g->n_values; i++)
		if (g->values[i]->flags & TERN_VALUE_OUTER) {
			const struct slot *o = outer_slot_of(up, g->values[i]);
			if (o && o->known) {
				slots[i] = *o;
				slots[i].owns = false;
			}
		}
	if (infer_nodes(g, slots, up)) {
		tern_error_clear();
		release(slots, g->n_values);
		return NULL;
	}
	return slots;
}

/* Sets out's type (no data) from a body's slot. */
static void take_type(struct slot *out, const struct slot *from)
{
	if (!from || !from->known || out->known)
		return;
	out->known = true;
	tern_set_shape(&out->t, from->t.dtype, from->t.rank, from->t.dims);
	out->t.data = NULL;
}

static void infer_call_or_if(struct slot *slots, tern_node *n)
{
	struct scope *sc = current_scope;
	if (!sc || n->n_inputs > 64)
		return;
	if (tern_pass_is(n, "If")) {
		for (int b = 0; b < 2; b++) {
			tern_graph *br = tern_attr_graph(n, b ? "else_branch" : "then_branch");
			struct slot *bs = br ? infer_body(br, NULL, 0, sc) : NULL;
			for (size_t o = 0; bs && o < n->n_outputs && o < br->n_outputs; o++)
				if (n->outputs[o])
					take_type(&slots[n->outputs[o]->index], &bs[br->outputs[o]->index]);
			if (bs)
				release(bs, br->n_values);
		}
		return;
	}
	if (tern_pass_is(n, "Loop")) {
		/* the carried values as the body gives them back from one trip on the Loop's inputs (a
		 * carried value whose shape changes from trip to trip is typed by its first); scan outputs
		 * stay unknown */
		tern_graph *body = tern_attr_graph(n, "body");
		if (!body || n->n_inputs < 2 || body->n_inputs != n->n_inputs || body->n_outputs + 1 < n->n_inputs)
			return;
		struct slot iter = {.known = true}, cond = {.known = true};
		tern_set_shape(&iter.t, TERN_INT64, 0, NULL);
		tern_set_shape(&cond.t, TERN_BOOL, 0, NULL);
		const struct slot *in[64] = {&iter, &cond};
		for (size_t i = 2; i < n->n_inputs; i++)
			in[i] = n->inputs[i] ? &slots[n->inputs[i]->index] : NULL;
		struct slot *bs = infer_body(body, in, n->n_inputs, sc);
		for (size_t o = 0; bs && o + 2 < n->n_inputs && o < n->n_outputs; o++)
			if (n->outputs[o])
				take_type(&slots[n->outputs[o]->index], &bs[body->outputs[o + 1]->index]);
		if (bs)
			release(bs, body->n_values);
		return;
	}
	const char *domain, *name = tern_node_callee(n, &domain);
	tern_graph *fn = tern_function_find(n->graph->model, domain, name);
	if (!fn || n_typing >= (int)TERN_ARRAY_LEN(typing))
		return;
	for (int i = 0; i < n_typing; i++)
		if (typing[i] == fn)
			return;
	const struct slot *in[64];
	for (size_t i = 0; i < n->n_inputs; i++)
		in[i] = n->inputs[i] ? &slots[n->inputs[i]->index] : NULL;
	typing[n_typing++] = fn;
	struct slot *fs = infer_body(fn, in, n->n_inputs, NULL);
	n_typing--;
	for (size_t o = 0; fs && o < n->n_outputs && o < fn->n_outputs; o++)
		if (n->outputs[o])
			take_type(&slots[n->outputs[o]->index], &fs[fn->outputs[o]->index]);
	/* a kept call's handle */
	int kh = tern_node_kept_handle(n);
	if (fs && kh >= 0 && n->outputs[kh]) {
		struct slot *h = &slots[n->outputs[kh]->index];
		h->known = true;
		tern_set_shape(&h->t, TERN_INT64, 0, NULL);
		h->t.data = NULL;
	}
	if (fs)
		release(fs, fn->n_values);
}

static void infer_plain(struct slot *slots, tern_node *n, tern_tensor *in_t, tern_tensor **in, tern_tensor *out_t,
                        tern_tensor **out, tern_tensor *val);

/* Types (and where cheap, values) of the node's outputs from its inputs. */
static void infer_node(struct slot *slots, tern_node *n)
{
	if (through_calls && (n->n_subgraphs || tern_op_calls_function(tern_op_find(n->domain, n->op_type, n->opset)) ||
	                      tern_function_find(n->graph->model, n->domain, n->op_type))) {
		infer_call_or_if(slots, n);
		return;
	}
	if (n->n_subgraphs)
		return;
	/* most nodes have a few inputs and outputs; a Sum or Concat of many gets room on the heap */
	enum { FEW = 16 };
	if (n->n_inputs <= FEW && n->n_outputs <= FEW) {
		tern_tensor in_t[FEW], out_t[FEW], val[FEW];
		tern_tensor *in[FEW], *out[FEW];
		infer_plain(slots, n, in_t, in, out_t, out, val);
		return;
	}
	size_t ni = n->n_inputs, no = n->n_outputs;
	tern_tensor *t = calloc(ni + 2 * no, sizeof *t);
	tern_tensor **p = calloc(ni + no, sizeof *p);
	if (t && p)
		infer_plain(slots, n, t, p, t + ni, p + ni, t + ni + no);
	free(t);
	free(p);
}

/* infer_node for a node without subgraphs, given room for its inputs, outputs and values. */
static void infer_plain(struct slot *slots, tern_node *n, tern_tensor *in_t, tern_tensor **in, tern_tensor *out_t,
                        tern_tensor **out, tern_tensor *val)
{
	const tern_op *op = tern_op_find(n->domain, n->op_type, n->opset);
	if (!op || !op->prepare)
		return;
	bool all_data = true;
	for (size_t i = 0; i < n->n_inputs; i++) {
		in[i] = NULL;
		if (!n->inputs[i])
			continue;
		struct slot *s = &slots[n->inputs[i]->index];
		if (!s->known)
			return;
		in_t[i] = s->t;
		in_t[i].name = NULL;
		in_t[i].owns_data = 0;
		/* big float data never decides a shape; given to prepare, weights would be packed for nothing */
		if (in_t[i].data && !small_int(in_t[i].dtype, tern_tensor_numel(&in_t[i])) &&
		    tern_tensor_numel(&in_t[i]) > 4096)
			in_t[i].data = NULL;
		all_data &= in_t[i].data != NULL || tern_tensor_numel(&in_t[i]) == 0;
		in[i] = &in_t[i];
	}
	if (!tern_prepare_shapes(op, n, in, out_t, out)) {
		slice_of_unknown_bounds(n, in, slots);
		return;
	}
	bool small = true;
	for (size_t o = 0; o < n->n_outputs; o++) {
		if (!n->outputs[o])
			continue;
		if (!out_t[o].dtype || out_t[o].rank < 0)
			return;
		small &= small_int(out_t[o].dtype, tern_tensor_numel(&out_t[o]));
	}
	bool shape_only = (tern_pass_is(n, "Shape") || tern_pass_is(n, "Size")) && n->n_inputs == 1;
	bool have_val = false;
	if (small && deterministic(n) && (all_data || shape_only)) {
		have_val = tern_node_eval(n, in, (int)n->n_inputs, val, (int)n->n_outputs, NULL) == TERN_OK;
		if (!have_val)
			tern_error_clear();
	}
	for (size_t o = 0; o < n->n_outputs; o++) {
		if (!n->outputs[o])
			continue;
		struct slot *s = &slots[n->outputs[o]->index];
		if (have_val) {
			s->t = val[o];
			free(s->t.name);
			s->t.name = NULL;
			s->owns = true;
		} else {
			tern_set_shape(&s->t, out_t[o].dtype, out_t[o].rank, out_t[o].dims);
			s->t.data = NULL;
		}
		s->known = true;
	}
}

static tern_status infer_pass(tern_graph *g, struct symbols *sym, int pass, struct slot **out)
{
	current_pass = pass;
	struct slot *slots = calloc(g->n_values ? g->n_values : 1, sizeof *slots);
	if (!slots)
		return tern_errorf(TERN_EOS, "out of memory");
	seed_initializers(g, slots);
	seed_inputs(g, slots, sym, pass);
	tern_status st = infer_nodes(g, slots, NULL);
	if (st) {
		release(slots, g->n_values);
		return st;
	}
	*out = slots;
	return TERN_OK;
}

/* The two passes' answers as one type: numbers where they agree, symbols where both are the same
 * symbol's stand-ins, unknown otherwise. */
static bool merge(const struct slot *a, const struct slot *b, const struct symbols *sym, tern_type *t)
{
	if (!a->known || (b && (!b->known || b->t.dtype != a->t.dtype)))
		return false;
	if (a->t.dtype <= 0 || a->t.dtype >= TERN_DTYPE_COUNT)
		return false; /* a sequence or an optional: value_info would need their own types */
	tern_type_unknown(t);
	t->dtype = a->t.dtype;
	if (b && b->t.rank != a->t.rank)
		return true; /* the rank depends on the symbols: the element type is all that is known */
	t->rank = a->t.rank;
	for (int d = 0; d < t->rank; d++) {
		int64_t x = a->t.dims[d], y = b ? b->t.dims[d] : x;
		t->dims[d] = -1;
		if (x == y) {
			t->dims[d] = x;
			continue;
		}
		for (int s = 0; s < sym->n; s++)
			if (x == stand_in[0][s] && y == stand_in[1][s]) {
				t->dim_param[d] = sym->name[s];
				break;
			}
	}
	return true;
}

bool tern_type_same(const tern_type *a, const tern_type *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++) {
		if (a->dims[d] != b->dims[d])
			return false;
		const char *p = a->dim_param[d], *q = b->dim_param[d];
		if ((p == NULL) != (q == NULL) || (p && strcmp(p, q) != 0))
			return false;
	}
	return true;
}

/* ---------------------------------------------------------------- value_info */

/* Sets (or adds) the value_info entry of v to its type; the IR's dim_param pointers then point into
 * the new proto. */
static tern_status write_value_info(tern_graph *g, tern_value *v)
{
	Onnx__GraphProto *gp = g->proto;
	Onnx__ValueInfoProto *vi = NULL;
	for (size_t i = 0; i < gp->n_value_info && !vi; i++)
		if (gp->value_info[i]->name && strcmp(gp->value_info[i]->name, v->name) == 0)
			vi = gp->value_info[i];
	Onnx__TypeProto *tp = tern_type_to_proto(&v->type);
	if (!tp)
		return tern_errorf(TERN_EOS, "out of memory");
	if (!vi) {
		vi = calloc(1, sizeof *vi);
		Onnx__ValueInfoProto **arr = realloc(gp->value_info, (gp->n_value_info + 1) * sizeof *arr);
		if (arr)
			gp->value_info = arr;
		if (!vi || !arr || !(vi->name = NULL, onnx__value_info_proto__init(vi), vi->name = tern_strdup(v->name))) {
			free(vi);
			onnx__type_proto__free_unpacked(tp, NULL);
			return tern_errorf(TERN_EOS, "out of memory");
		}
		gp->value_info[gp->n_value_info++] = vi;
	} else if (vi->type) {
		onnx__type_proto__free_unpacked(vi->type, NULL);
	}
	vi->type = tp;
	tern_type_from_proto(tp, &v->type);
	return TERN_OK;
}

/* ---------------------------------------------------------------- entry */

tern_status tern_model_infer_shapes(tern_model *m, int write_value_info_protos, int *typed, int *total)
{
	tern_graph *g = m->graph;
	struct symbols sym = {0};
	for (size_t i = 0; i < g->n_inputs; i++) {
		tern_value *v = g->inputs[i];
		if (v->flags & TERN_VALUE_INITIALIZER || v->type.rank < 0)
			continue;
		for (int d = 0; d < v->type.rank && d < TERN_MAX_RANK; d++)
			if (v->type.dims[d] < 0)
				symbol_of(&sym, v->type.dim_param[d]);
	}
	struct slot *pass[2] = {NULL, NULL};
	data_dependent_made = false;
	tern_status st = infer_pass(g, &sym, 0, &pass[0]);
	if (!st && (sym.n || data_dependent_made))
		st = infer_pass(g, &sym, 1, &pass[1]);
	int n_typed = 0, n_total = 0;
	for (size_t i = 0; !st && i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if (!v->producer || v->producer->removed)
			continue;
		n_total++;
		tern_type t;
		if (!merge(&pass[0][i], pass[1] ? &pass[1][i] : NULL, &sym, &t))
			continue;
		n_typed++;
		/* a graph output keeps what it declares; others get what the rules say */
		if ((v->flags & TERN_VALUE_OUTPUT) && v->type.dtype && v->type.rank >= 0)
			continue;
		if (tern_type_same(&t, &v->type) && !write_value_info_protos)
			continue;
		v->type = t;
		if (write_value_info_protos && !(v->flags & TERN_VALUE_OUTPUT))
			st = write_value_info(g, v);
	}
	release(pass[0], pass[0] ? g->n_values : 0);
	if (pass[1])
		release(pass[1], g->n_values);
	if (typed)
		*typed = n_typed;
	if (total)
		*total = n_total;
	return st;
}

tern_status tern_model_infer_types_through_calls(tern_model *m)
{
	through_calls = 1;
	n_typing = 0;
	tern_status st = tern_model_infer_shapes(m, 0, NULL, NULL);
	through_calls = 0;
	return st;
}
