/* blocked_conv.c — runs of convolutions on activations in blocks of 16 channels (lib/ops/blocked.c).
 *
 * Convolutions (Conv, tern.FusedConv) of group 1 or depthwise (one group per channel) over 2-D images
 * whose input and output channels fill blocks of 16 well (channels_ok) become tern.BlockedConv, and so
 * do stems on planar input of few channels; the elementwise operators and channel Concats between
 * them follow when all their tensor inputs are blocked, and the pools and squeeze-and-excitation
 * scales have blocked operators of their own (follows). A tensor enters a run through tern.ToBlocks and
 * leaves it, under its own name, through tern.FromBlocks wherever something else reads it (or it is
 * a graph output). A run of fewer than three convolutions, or with more than one conversion for every
 * four convolutions, stays as it is: its conversions would cost what the blocked layout gains. */
#include "ops/gemm.h"
#include "passes/passes.h"

#include <stdio.h>
#include <stdlib.h>

#define BLK 16
#define MIN_CONVS 3

typedef struct blocked_state {
	tern_pass_ctx *c;
	tern_node **order; /* the live nodes, in topological order */
	size_t n_order;
	size_t n_values; /* values when the pass began: the flags below cover them */
	bool *blocked;   /* by value index: a blocked node writes it */
	int *component;  /* by node index: union-find parent (then the root), -1 when not blocked */
	int *convs;      /* by root: convolutions in the component */
	bool *stem;      /* by node index: a convolution that reads its planar input of few channels */
	size_t n_nodes;
} blocked_state;

static bool is_tern(const tern_node *n, const char *op_type)
{
	return !n->removed && strcmp(n->domain, TERN_DOMAIN) == 0 && strcmp(n->op_type, op_type) == 0;
}

static const tern_tensor *float4(tern_pass_ctx *c, const tern_value *v)
{
	const tern_tensor *t = v ? tern_pass_shape(c, v) : NULL;
	return t && t->dtype == TERN_FLOAT && t->rank == 4 ? t : NULL;
}

static bool is_conv(const tern_node *n)
{
	return tern_pass_is(n, "Conv") || is_tern(n, "FusedConv");
}

/* Whether input i of a node that may be blocked is an activation, blocked with it (not weights, bias
 * or Clip's bounds, nor a stem's planar input). */
static bool tensor_input(const blocked_state *s, const tern_node *n, size_t i)
{
	if (is_conv(n))
		return (i == 0 && !s->stem[n->index]) || i == 3;
	return !tern_pass_is(n, "Clip") || i == 0;
}

/* Channels that fill their blocks well enough: a multiple of 16, or at most a third more in blocks (24
 * in 32, 40 in 48: the lanes past the channels are computed for nothing, which costs less than leaving
 * the layout around them; 3 input channels in a block of 16 would multiply a stem's work by 5). */
static bool channels_ok(int64_t c)
{
	return c > 0 && 3 * ((c + BLK - 1) / BLK * BLK) <= 4 * c;
}

/* A convolution the blocked kernel computes: 1, or 2 for a stem, which reads planar input of fewer
 * channels than fill a block well (an image's 3) directly; 0 for none. */
static int conv_ok(tern_pass_ctx *c, const tern_node *n)
{
	bool fused = is_tern(n, "FusedConv");
	if (!is_conv(n) || n->n_outputs != 1 || n->n_inputs < 2 || n->n_inputs > (fused ? 4u : 3u))
		return false;
	const tern_tensor *x = float4(c, n->inputs[0]), *y = float4(c, n->outputs[0]);
	const tern_tensor *w = n->inputs[1] ? tern_pass_const(c, n->inputs[1]) : NULL;
	if (!x || !y || !w || w->dtype != TERN_FLOAT || w->rank != 4)
		return false;
	/* group 1, or depthwise: one group per channel */
	int64_t group = tern_attr_int(n, "group", 1);
	bool depthwise = group != 1 && group == x->dims[1] && group == y->dims[1] && w->dims[1] == 1;
	bool stem = !depthwise && x->dims[1] < BLK && !channels_ok(x->dims[1]);
	if ((!stem && !channels_ok(x->dims[1])) || !channels_ok(y->dims[1]) ||
	    (!depthwise && (group != 1 || w->dims[1] != x->dims[1])))
		return false;
	if (n->n_inputs > 2 && n->inputs[2] && !tern_pass_const(c, n->inputs[2]))
		return false;
	/* the activations applied as results are stored (tern.FusedConv's others, Elu, Softplus, Gelu,
	 * take its general path) */
	tern_act act;
	if (!tern_act_from_node(n, &act))
		return false;
	if (n->n_inputs > 3 && n->inputs[3] && !tern_pass_same_shape(tern_pass_shape(c, n->inputs[3]), y))
		return false;
	return stem ? 2 : 1;
}

/* A tensor of one value per channel (N x C x 1 x 1): converting it costs next to nothing. */
static bool per_channel(const tern_tensor *t)
{
	return t && t->rank == 4 && t->dims[2] == 1 && t->dims[3] == 1;
}

/* Whether v is blocked (written by a blocked node). */
static bool is_blocked(const blocked_state *s, const tern_value *v)
{
	return v && (size_t)v->index < s->n_values && s->blocked[v->index];
}

/* Mul of a tensor and one value per channel (a squeeze-and-excitation block's scale): input 1 the
 * scale, 0 the other, -1 when n is not such a Mul. */
static int scale_input(tern_pass_ctx *c, const tern_node *n)
{
	if (!tern_pass_is(n, "Mul") || n->n_inputs != 2 || n->n_outputs != 1)
		return -1;
	const tern_tensor *y = float4(c, n->outputs[0]);
	for (int i = 0; i < 2; i++) {
		const tern_tensor *a = float4(c, n->inputs[1 - i]), *b = float4(c, n->inputs[i]);
		if (y && a && b && tern_pass_same_shape(a, y) && per_channel(b) && !per_channel(y) &&
		    b->dims[0] == y->dims[0] && b->dims[1] == y->dims[1])
			return i;
	}
	return -1;
}

/* An operator that works on blocked tensors as it does on planar ones: elementwise without
 * broadcasting, or Concat along the channels, all of whose tensor inputs are blocked. And four that
 * have blocked forms: GlobalAveragePool, MaxPool and AveragePool (ceil_mode 0) of a blocked tensor
 * (tern.BlockedGlobalAveragePool, tern.BlockedMaxPool, tern.BlockedAveragePool), and Mul of a
 * blocked tensor and one value per channel, blocked or not (tern.BlockedScale). */
static bool follows(blocked_state *s, const tern_node *n)
{
	tern_pass_ctx *c = s->c;
	static const char *const unary[] = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu",
	                                    "Selu", "Softplus", "Neg", "Abs", "Identity"};
	static const char *const binary[] = {"Add", "Sub", "Mul", "Max", "Min"};
	if (n->n_outputs != 1 || !n->outputs[0] || !n->n_inputs)
		return false;
	const tern_tensor *y = float4(c, n->outputs[0]);
	if (!y)
		return false;
	int tensors = 0; /* inputs that must be blocked */
	for (size_t i = 0; i < TERN_ARRAY_LEN(unary); i++)
		tensors = tern_pass_is(n, unary[i]) && n->n_inputs == 1 ? 1 : tensors;
	for (size_t i = 0; i < TERN_ARRAY_LEN(binary); i++)
		tensors = tern_pass_is(n, binary[i]) && n->n_inputs == 2 ? 2 : tensors;
	if (tern_pass_is(n, "Clip")) {
		for (size_t i = 1; i < n->n_inputs; i++)
			if (n->inputs[i] && !tern_pass_const(c, n->inputs[i]))
				return false;
		tensors = 1;
	}
	bool concat = tern_pass_is(n, "Concat");
	if (concat) {
		int64_t axis = tern_attr_int(n, "axis", 0);
		if (axis != 1 && axis != -3)
			return false;
		tensors = (int)n->n_inputs;
	}
	bool avg = tern_pass_is(n, "AveragePool") && !tern_attr_int(n, "ceil_mode", 0);
	if (tern_pass_is(n, "GlobalAveragePool") || tern_pass_is(n, "MaxPool") || avg)
		return n->n_inputs == 1 && is_blocked(s, n->inputs[0]) && float4(c, n->inputs[0]);
	int scale = scale_input(c, n);
	if (scale >= 0)
		return is_blocked(s, n->inputs[1 - scale]);
	if (!tensors)
		return false;
	for (int i = 0; i < tensors; i++) {
		const tern_value *v = n->inputs[i];
		const tern_tensor *t = v ? float4(c, v) : NULL;
		/* Concat's inputs fill whole blocks, so that each starts at a block of the result */
		if (!t || !is_blocked(s, v) || (concat ? t->dims[1] % BLK != 0 : !tern_pass_same_shape(t, y)))
			return false;
	}
	return true;
}

static int find(int *parent, int i)
{
	while (parent[i] != i)
		i = parent[i] = parent[parent[i]];
	return i;
}

static char *blocked_name(const tern_value *v)
{
	size_t n = strlen(v->name) + 8;
	char *s = malloc(n);
	if (s)
		snprintf(s, n, "%s_b%d", v->name, BLK);
	return s;
}

/* Whether a node that stays planar, a subgraph or the graph's outputs read v. */
static bool planar_use(const blocked_state *s, const tern_value *v)
{
	if ((v->flags & TERN_VALUE_OUTPUT) || tern_pass_has_implicit_use(v))
		return true;
	for (size_t i = 0; i < v->n_consumers; i++) {
		const tern_node *n = v->consumers[i];
		if (!n->removed && ((size_t)n->index >= s->n_nodes || s->component[n->index] < 0))
			return true;
	}
	return false;
}

static tern_status to_blocks(blocked_state *s, tern_value *v, bool *done, char **name)
{
	*name = blocked_name(v);
	if (!*name)
		return tern_errorf(TERN_EOS, "out of memory");
	if (done[v->index])
		return TERN_OK;
	done[v->index] = true;
	const char *in[1] = {v->name}, *out[1] = {*name};
	tern_pass_node nw = {"ToBlocks", TERN_DOMAIN, "", in, 1, out, 1, NULL, NULL};
	return tern_pass_replace(s->c, NULL, 0, &nw) ? TERN_OK : TERN_EOS;
}

static tern_status rewrite(blocked_state *s, tern_node *n, bool *done)
{
	tern_pass_ctx *c = s->c;
	bool conv = is_conv(n);
	char *names[8] = {NULL};
	const char *in[8];
	size_t n_in = n->n_inputs;
	tern_status st = TERN_OK;
	for (size_t i = 0; i < n_in && !st; i++) {
		tern_value *v = n->inputs[i];
		in[i] = v ? v->name : "";
		if (!v || !tensor_input(s, n, i))
			continue;
		if (s->blocked[v->index]) {
			if (!(names[i] = blocked_name(v)))
				st = tern_errorf(TERN_EOS, "out of memory");
		} else {
			st = to_blocks(s, v, done, &names[i]);
		}
		in[i] = names[i];
	}
	tern_value *y = n->outputs[0];
	char *out_name = st ? NULL : blocked_name(y);
	if (!st && !out_name)
		st = tern_errorf(TERN_EOS, "out of memory");
	bool concat = tern_pass_is(n, "Concat");
	static const char *const skip_axis[] = {"axis", NULL};
	if (!st) {
		const char *out[1] = {out_name};
		int scale = scale_input(c, n);
		const char *op = conv                                   ? "BlockedConv"
		                 : tern_pass_is(n, "GlobalAveragePool") ? "BlockedGlobalAveragePool"
		                 : tern_pass_is(n, "MaxPool")           ? "BlockedMaxPool"
		                 : tern_pass_is(n, "AveragePool")       ? "BlockedAveragePool"
		                 : scale >= 0                           ? "BlockedScale"
		                                                        : NULL;
		if (scale == 0) { /* the scaled tensor first */
			const char *t = in[0];
			in[0] = in[1];
			in[1] = t;
		}
		tern_pass_node nw = {op ? op : n->op_type, op ? TERN_DOMAIN : n->domain, n->name, in, n_in, out, 1, n,
		                     concat ? skip_axis : NULL};
		tern_node *b = tern_pass_replace(c, &n, 1, &nw);
		if (!b)
			st = TERN_EOS;
		else if (concat)
			st = tern_node_add_attr_int(b, "axis", 1);
	}
	if (!st && planar_use(s, y)) {
		const char *fi[1] = {out_name}, *fo[1] = {y->name};
		tern_pass_node nw = {"FromBlocks", TERN_DOMAIN, "", fi, 1, fo, 1, NULL, NULL};
		tern_node *f = tern_pass_replace(c, NULL, 0, &nw);
		const tern_tensor *t = f ? float4(c, y) : NULL;
		st = !f ? TERN_EOS : !t ? tern_errorf(TERN_EDATA, "blocked-conv: '%s' lost its shape", y->name)
		                        : tern_node_add_attr_int(f, "channels", t->dims[1]);
	}
	for (size_t i = 0; i < n_in; i++)
		free(names[i]);
	free(out_name);
	return st;
}

static tern_status run(tern_pass_ctx *c)
{
	tern_status st = tern_pass_analyze(c);
	if (st)
		return st;
	blocked_state s = {.c = c, .n_values = c->graph->n_values, .n_nodes = c->graph->n_nodes};
	st = tern_graph_toposort(c->graph, &s.order, &s.n_order);
	s.blocked = calloc(s.n_values + 1, sizeof *s.blocked);
	s.component = malloc((s.n_nodes + 1) * sizeof *s.component);
	s.convs = calloc(s.n_nodes + 1, sizeof *s.convs);
	s.stem = calloc(s.n_nodes + 1, sizeof *s.stem);
	int *conversions = calloc(s.n_nodes + 1, sizeof *conversions), *seen = malloc((s.n_values + 1) * sizeof *seen);
	bool *done = calloc(s.n_values + 1, sizeof *done);
	if (!st && (!s.blocked || !s.component || !s.convs || !s.stem || !conversions || !seen || !done))
		st = tern_errorf(TERN_EOS, "out of memory");
	for (size_t i = 0; !st && i < s.n_nodes; i++)
		s.component[i] = -1;
	for (size_t v = 0; !st && v < s.n_values; v++)
		seen[v] = -1;
	/* which nodes may be blocked, and the components they form through blocked values */
	for (size_t k = 0; !st && k < s.n_order; k++) {
		tern_node *n = s.order[k];
		int conv = conv_ok(c, n);
		if (!conv && !follows(&s, n))
			continue;
		int i = n->index;
		s.stem[i] = conv == 2;
		s.component[i] = i;
		s.convs[i] = conv != 0;
		s.blocked[n->outputs[0]->index] = true;
		for (size_t j = 0; j < n->n_inputs; j++) {
			const tern_value *v = n->inputs[j];
			if (!v || !tensor_input(&s, n, j) || !s.blocked[v->index])
				continue;
			int a = find(s.component, i), b = find(s.component, v->producer->index);
			if (a != b) {
				s.component[a] = b;
				s.convs[b] += s.convs[a];
			}
		}
	}
	/* every node to its root, and the conversions each component needs: planar tensors it reads,
	 * blocked ones read outside it */
	for (size_t k = 0; !st && k < s.n_order; k++) {
		tern_node *n = s.order[k];
		if (s.component[n->index] < 0)
			continue;
		int r = s.component[n->index] = find(s.component, n->index);
		for (size_t j = 0; j < n->n_inputs; j++) {
			const tern_value *v = n->inputs[j];
			if (v && tensor_input(&s, n, j) && !s.blocked[v->index] && seen[v->index] != r) {
				seen[v->index] = r;
				conversions[r] += !per_channel(float4(c, v));
			}
		}
		conversions[r] += planar_use(&s, n->outputs[0]) && !per_channel(float4(c, n->outputs[0]));
	}
	/* components that would not pay for their conversions stay planar: fewer than MIN_CONVS
	 * convolutions, or more than one conversion for every four of them (GoogLeNet's and SqueezeNet's
	 * pools between a few convolutions) */
	for (size_t k = 0; !st && k < s.n_order; k++) {
		tern_node *n = s.order[k];
		int r = s.component[n->index];
		if (r >= 0 && (s.convs[r] < MIN_CONVS || 4 * conversions[r] > s.convs[r])) {
			s.component[n->index] = -1;
			s.blocked[n->outputs[0]->index] = false;
		}
	}
	/* the tern domain: imported by the pass manager for every pass of level 2 */
	for (size_t k = 0; !st && k < s.n_order; k++) {
		tern_node *n = s.order[k];
		if (s.component[n->index] >= 0)
			st = rewrite(&s, n, done);
	}
	free(s.order);
	free(s.blocked);
	free(s.component);
	free(s.convs);
	free(s.stem);
	free(conversions);
	free(seen);
	free(done);
	return st;
}

const tern_pass tern_pass_blocked_conv = {
        "blocked-conv",
        "run chains of convolutions (group 1 or depthwise, channels filling blocks of 16, at least 4 for each conversion) on "
        "activations in blocks of 16 channels",
        2,
        run,
};
