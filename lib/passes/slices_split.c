/* slices_split.c — Slices that cut one tensor into consecutive pieces along one axis (the query, key and
 * value of a packed attention projection) become one Split. */
#include "passes/passes.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct piece {
	tern_node *slice;
	int64_t start, end;
	int axis;
} piece;

static bool const_ints(tern_pass_ctx *c, const tern_node *n, size_t i, const char *attr, int64_t *v, size_t *count)
{
	if (n->opset < 10) {
		size_t k;
		const int64_t *a = tern_attr_ints(n, attr, &k);
		if (!a || k > TERN_MAX_RANK)
			return false;
		memcpy(v, a, k * sizeof *a);
		*count = k;
		return true;
	}
	if (i >= n->n_inputs || !n->inputs[i])
		return false;
	const tern_tensor *t = tern_pass_const(c, n->inputs[i]);
	if (!t || t->rank != 1 || t->dims[0] > TERN_MAX_RANK)
		return false;
	*count = (size_t)t->dims[0];
	for (size_t k = 0; k < *count; k++)
		v[k] = tern_tensor_get_i64(t, (int64_t)k);
	return true;
}

/* One Slice along a single axis with step 1, its bounds clamped as ONNX does. */
static bool read_piece(tern_pass_ctx *c, tern_node *s, const tern_tensor *xs, piece *p)
{
	int64_t starts[TERN_MAX_RANK], ends[TERN_MAX_RANK], axes[TERN_MAX_RANK] = {0}, steps[TERN_MAX_RANK];
	size_t ns, ne, na = 1, nst = 0;
	if (s->n_outputs != 1 || !s->outputs[0] || !const_ints(c, s, 1, "starts", starts, &ns) ||
	    !const_ints(c, s, 2, "ends", ends, &ne) || ns != 1 || ne != 1)
		return false;
	bool has_axes = s->opset < 10 ? tern_attr(s, "axes") != NULL : s->n_inputs > 3 && s->inputs[3];
	if (has_axes && (!const_ints(c, s, 3, "axes", axes, &na) || na != 1))
		return false;
	if (s->opset >= 10 && s->n_inputs > 4 && s->inputs[4] &&
	    (!const_ints(c, s, 4, "", steps, &nst) || nst != 1 || steps[0] != 1))
		return false;
	int64_t axis = axes[0] < 0 ? axes[0] + xs->rank : axes[0];
	if (axis < 0 || axis >= xs->rank)
		return false;
	int64_t d = xs->dims[axis], b = starts[0], e = ends[0];
	b = b < 0 ? b + d : b;
	e = e < 0 ? e + d : e;
	p->slice = s;
	p->axis = (int)axis;
	p->start = b < 0 ? 0 : b > d ? d : b;
	p->end = e < 0 ? 0 : e > d ? d : e;
	return p->end > p->start;
}

static int by_start(const void *a, const void *b)
{
	const piece *x = a, *y = b;
	return (x->start > y->start) - (x->start < y->start);
}

static tern_status split_value(tern_pass_ctx *c, tern_value *v)
{
	const tern_tensor *xs = tern_pass_shape(c, v);
	if (!xs || v->n_consumers < 2)
		return TERN_OK;
	piece *pieces = calloc(v->n_consumers, sizeof *pieces);
	if (!pieces)
		return tern_errorf(TERN_EOS, "out of memory");
	size_t n = 0;
	for (size_t i = 0; i < v->n_consumers; i++) {
		tern_node *s = v->consumers[i];
		bool seen = false;
		for (size_t k = 0; k < n && !seen; k++)
			seen = pieces[k].slice == s;
		if (!seen && tern_pass_is(s, "Slice") && s->inputs[0] == v && read_piece(c, s, xs, &pieces[n]))
			n++;
	}
	qsort(pieces, n, sizeof *pieces, by_start);
	/* The pieces must tile the whole axis. */
	bool tiles = n >= 2 && pieces[0].start == 0 && pieces[n - 1].end == xs->dims[pieces[0].axis];
	for (size_t k = 1; tiles && k < n; k++)
		tiles = pieces[k].axis == pieces[0].axis && pieces[k].start == pieces[k - 1].end;
	tern_status st = TERN_OK;
	if (tiles && n <= 64) {
		int64_t sizes[64];
		const char *outs[64];
		tern_node *old[64];
		for (size_t k = 0; k < n; k++) {
			sizes[k] = pieces[k].end - pieces[k].start;
			outs[k] = pieces[k].slice->outputs[0]->name;
			old[k] = pieces[k].slice;
		}
		bool split_input = old[0]->opset >= 13;
		tern_value *sv = NULL;
		char stem[256];
		snprintf(stem, sizeof stem, "%s_split", v->name);
		if (split_input && !(sv = tern_pass_add_ints(c, stem, sizes, (int)n))) {
			st = TERN_EOS;
			goto done;
		}
		const char *inputs[2] = {v->name, sv ? sv->name : NULL};
		tern_pass_node nw = {"Split", NULL, old[0]->name, inputs, split_input ? 2 : 1, outs, n};
		tern_node *split = tern_pass_replace(c, old, (int)n, &nw);
		st = split ? tern_node_add_attr_int(split, "axis", pieces[0].axis) : TERN_EOS;
		if (!st && !split_input)
			st = tern_node_add_attr_ints(split, "split", sizes, n);
	}
done:
	free(pieces);
	return st;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_graph *g = c->graph;
	tern_status st = TERN_OK;
	for (size_t i = 0; !st && i < g->n_values; i++)
		if (!tern_pass_has_implicit_use(g->values[i]))
			st = split_value(c, g->values[i]);
	return st;
}

const tern_pass tern_pass_slices_split = {
        "slices-to-split",
        "replace Slices that cut a tensor into consecutive pieces along one axis by one Split",
        1,
        run,
};
