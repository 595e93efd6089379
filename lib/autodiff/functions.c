/* functions.c — gradients through calls of model-local functions and through If, recursion
 * included (tern-graph(5), "GRADIENTS OF CALLS").
 *
 * A call's gradient needs the values its body computed. They stay where the call computed them: the
 * forward pass calls F__fwd with keep=1, whose frame is kept (no two of its values share bytes) until
 * the main plan runs again, and the call's last output is a handle naming that frame. The gradient is
 * tern.Backward(handle, dy...), which calls F__grad(x..., handle, dy...) -> (dx...): F's backward
 * pass, reading each forward value it needs with tern.Saved(handle). A call inside F is a kept call
 * in F__fwd, and its gradient a tern.Backward in F__grad on the handle read from the frame: so a
 * recursion's gradient recurses the same way, each call's values saved once, nothing recomputed.
 *
 * An If's branches become functions of the values they read ("lifting": L(captures) -> outputs),
 * each branch a kept call of L__fwd that also returns its handle; the If gives the handle of the
 * branch that ran, and tern.Backward on it calls that branch's L__grad.
 *
 * Each function is typed from its first call's input types (shape inference through calls) and
 * differentiated by the same reverse pass as the main graph, on a scratch model whose main graph is
 * the function's body. */
#include "autodiff/grad.h"
#include "passes/passes.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct work {
	char *name, *domain;
	tern_type *types; /* the inputs' types at the call that found it */
	size_t n;
} work;

typedef struct named_type {
	char *name;
	tern_type type;
} named_type;

typedef struct gen {
	tern_model *m;
	Onnx__FunctionProto **fns; /* the model's, then those made here (owned from n_orig on) */
	size_t n_fns, cap_fns, n_orig;
	work *todo;
	size_t n_todo, cap_todo;
	int n_lifted;
	/* the body attributes taken off Loops made calls, and their nodes: the IR reads them until the
	 * model is read anew; put back if that fails */
	struct detached {
		Onnx__NodeProto *np;
		Onnx__AttributeProto *at;
	} *detached;
	size_t n_detached, cap_detached;
} gen;

static tern_status oom(void)
{
	return tern_errorf(TERN_EOS, "out of memory");
}

static Onnx__FunctionProto *find_fn(const gen *G, const char *domain, const char *name)
{
	for (size_t i = 0; i < G->n_fns; i++)
		if (G->fns[i]->name && !strcmp(G->fns[i]->name, name) && tern_same_domain(G->fns[i]->domain, domain))
			return G->fns[i];
	return NULL;
}

static char *cat(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	char *s = malloc(la + lb + 1);
	if (s) {
		memcpy(s, a, la);
		memcpy(s + la, b, lb + 1);
	}
	return s;
}

static tern_status add_fn(gen *G, Onnx__FunctionProto *fp)
{
	if (!tern_grow((void **)&G->fns, &G->cap_fns, G->n_fns + 1, sizeof *G->fns))
		return oom();
	G->fns[G->n_fns++] = fp;
	return TERN_OK;
}

/* Queues function name (domain) for F__fwd and F__grad, typed by the call's inputs. */
static tern_status push(gen *G, const char *domain, const char *name, tern_value *const *in, size_t n)
{
	for (size_t i = 0; i < G->n_todo; i++)
		if (!strcmp(G->todo[i].name, name) && tern_same_domain(G->todo[i].domain, domain))
			return TERN_OK;
	if (!tern_grow((void **)&G->todo, &G->cap_todo, G->n_todo + 1, sizeof *G->todo))
		return oom();
	work *w = &G->todo[G->n_todo];
	memset(w, 0, sizeof *w);
	w->name = tern_strdup(name);
	w->domain = tern_strdup(domain ? domain : "");
	w->types = calloc(n + 1, sizeof *w->types);
	if (!w->name || !w->domain || !w->types) {
		free(w->name);
		free(w->domain);
		free(w->types);
		return oom();
	}
	for (size_t i = 0; i < n; i++) {
		tern_type_unknown(&w->types[i]);
		if (in[i]) {
			w->types[i] = in[i]->type;
			/* symbols point into the scratch model's protos, which go: the dimension stays unknown */
			for (int d = 0; d < TERN_MAX_RANK; d++)
				w->types[i].dim_param[d] = NULL;
		}
	}
	w->n = n;
	G->n_todo++;
	return TERN_OK;
}

/* ---------------------------------------------------------------- proto helpers */

static tern_status set_string(char **field, const char *v)
{
	char *s = tern_strdup(v);
	if (!s)
		return oom();
	free(*field);
	*field = s;
	return TERN_OK;
}

static tern_status append_string(char ***list, size_t *n, const char *v)
{
	char **arr = realloc(*list, (*n + 1) * sizeof *arr);
	if (!arr)
		return oom();
	*list = arr;
	if (!(arr[*n] = tern_strdup(v)))
		return oom();
	(*n)++;
	return TERN_OK;
}

static void drop_attr(Onnx__NodeProto *np, const char *name)
{
	size_t k = 0;
	for (size_t i = 0; i < np->n_attribute; i++) {
		if (np->attribute[i]->name && !strcmp(np->attribute[i]->name, name))
			onnx__attribute_proto__free_unpacked(np->attribute[i], &tern_pb_allocator);
		else
			np->attribute[k++] = np->attribute[i];
	}
	np->n_attribute = k;
}

/* Sets attribute `name` of a node proto, replacing any it had. */
static tern_status attr_string(Onnx__NodeProto *np, const char *name, const char *v)
{
	drop_attr(np, name);
	return tern_proto_add_attr_string(np, name, v);
}

static tern_status attr_int(Onnx__NodeProto *np, const char *name, int64_t v)
{
	drop_attr(np, name);
	return tern_proto_add_attr_int(np, name, v);
}

/* A node proto op_type (domain) with inputs and outputs, no attributes. */
static Onnx__NodeProto *new_node(const char *domain, const char *op_type, const char *name, const char *const *in,
                                 size_t n_in, const char *const *out, size_t n_out)
{
	Onnx__NodeProto *np = calloc(1, sizeof *np);
	if (!np)
		return NULL;
	onnx__node_proto__init(np);
	bool ok = (np->op_type = tern_strdup(op_type)) && (np->domain = tern_strdup(domain)) &&
	          (np->name = tern_strdup(name));
	for (size_t i = 0; ok && i < n_in; i++)
		ok = !append_string(&np->input, &np->n_input, in[i]);
	for (size_t i = 0; ok && i < n_out; i++)
		ok = !append_string(&np->output, &np->n_output, out[i]);
	if (!ok) {
		onnx__node_proto__free_unpacked(np, NULL);
		return NULL;
	}
	return np;
}

static Onnx__ValueInfoProto *value_info(const char *name, const tern_type *t)
{
	Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
	if (!vi)
		return NULL;
	onnx__value_info_proto__init(vi);
	if (!(vi->name = tern_strdup(name)) || (t && t->dtype && !(vi->type = tern_type_to_proto(t)))) {
		onnx__value_info_proto__free_unpacked(vi, NULL);
		return NULL;
	}
	return vi;
}

static tern_status append_node(Onnx__NodeProto ***list, size_t *n, Onnx__NodeProto *np)
{
	Onnx__NodeProto **arr = np ? realloc(*list, (*n + 1) * sizeof *arr) : NULL;
	if (!arr) {
		if (np)
			onnx__node_proto__free_unpacked(np, NULL);
		return oom();
	}
	*list = arr;
	arr[(*n)++] = np;
	return TERN_OK;
}

static tern_status copy_opsets(Onnx__OperatorSetIdProto ***out, size_t *n_out, Onnx__OperatorSetIdProto *const *in,
                               size_t n_in)
{
	static const char *const extra[] = {TERN_DOMAIN, TERN_GRAD_DOMAIN};
	*out = calloc(n_in + 3, sizeof **out);
	if (!*out)
		return oom();
	*n_out = 0;
	for (size_t i = 0; i < n_in; i++)
		if (!((*out)[(*n_out)++] = tern_pb_copy(in[i])))
			return oom();
	for (size_t e = 0; e < 2; e++) {
		bool have = false;
		for (size_t i = 0; i < n_in && !have; i++)
			have = in[i]->domain && !strcmp(in[i]->domain, extra[e]);
		if (have)
			continue;
		Onnx__OperatorSetIdProto *o = calloc(1, sizeof *o);
		if (!o)
			return oom();
		onnx__operator_set_id_proto__init(o);
		o->domain = tern_strdup(extra[e]);
		o->has_version = 1;
		o->version = e == 0 ? TERN_DOMAIN_VERSION : 1;
		(*out)[(*n_out)++] = o;
		if (!o->domain)
			return oom();
	}
	return TERN_OK;
}

static Onnx__FunctionProto *new_function(const char *name, const char *domain, const gen *G)
{
	Onnx__FunctionProto *fp = calloc(1, sizeof *fp);
	if (!fp)
		return NULL;
	onnx__function_proto__init(fp);
	if (!(fp->name = tern_strdup(name)) || !(fp->domain = tern_strdup(domain ? domain : "")) ||
	    copy_opsets(&fp->opset_import, &fp->n_opset_import, G->m->proto->opset_import, G->m->proto->n_opset_import)) {
		onnx__function_proto__free_unpacked(fp, NULL);
		return NULL;
	}
	return fp;
}

/* ---------------------------------------------------------------- scratch models */

/* A model whose main graph is nodes[0..n) with inputs in (typed) and outputs out, and every function
 * known so far: a function's body, to infer and differentiate like a graph. */
static tern_status scratch(gen *G, Onnx__NodeProto *const *nodes, size_t n, char *const *in, const tern_type *types,
                           size_t n_in, char *const *out, size_t n_out, tern_model **sm)
{
	*sm = NULL;
	Onnx__ModelProto mp;
	onnx__model_proto__init(&mp);
	Onnx__GraphProto gp;
	onnx__graph_proto__init(&gp);
	mp.has_ir_version = 1;
	mp.ir_version = G->m->proto->ir_version;
	mp.graph = &gp;
	gp.name = "function";
	tern_status st = copy_opsets(&mp.opset_import, &mp.n_opset_import, G->m->proto->opset_import,
	                             G->m->proto->n_opset_import);
	gp.node = calloc(n + 1, sizeof *gp.node);
	gp.input = calloc(n_in + 1, sizeof *gp.input);
	gp.output = calloc(n_out + 1, sizeof *gp.output);
	mp.functions = calloc(G->n_fns + 1, sizeof *mp.functions);
	if (!st && (!gp.node || !gp.input || !gp.output || !mp.functions))
		st = oom();
	/* borrowed: packed, then handed back */
	for (size_t i = 0; !st && i < n; i++)
		gp.node[gp.n_node++] = nodes[i];
	for (size_t i = 0; !st && i < G->n_fns; i++)
		mp.functions[mp.n_functions++] = G->fns[i];
	for (size_t i = 0; !st && i < n_in; i++)
		if (!(gp.input[gp.n_input++] = value_info(in[i], &types[i])))
			st = oom();
	for (size_t i = 0; !st && i < n_out; i++)
		if (!(gp.output[gp.n_output++] = value_info(out[i], NULL)))
			st = oom();
	uint8_t *buf = NULL;
	size_t size = 0;
	if (!st) {
		size = onnx__model_proto__get_packed_size(&mp);
		if (!(buf = malloc(size ? size : 1)))
			st = oom();
		else
			onnx__model_proto__pack(&mp, buf);
	}
	for (size_t i = 0; i < gp.n_input; i++)
		onnx__value_info_proto__free_unpacked(gp.input[i], NULL);
	for (size_t i = 0; i < gp.n_output; i++)
		onnx__value_info_proto__free_unpacked(gp.output[i], NULL);
	for (size_t i = 0; i < mp.n_opset_import; i++)
		if (mp.opset_import[i])
			onnx__operator_set_id_proto__free_unpacked(mp.opset_import[i], NULL);
	free(mp.opset_import);
	free(gp.node);
	free(gp.input);
	free(gp.output);
	free(mp.functions);
	if (!st)
		st = tern_model_load_bytes(buf, size, G->m->source, G->m->base_dir, sm);
	free(buf);
	return st;
}

/* ---------------------------------------------------------------- kept calls and lifted branches */

/* The names a subgraph reads from outside it, in order of first use, into *names. */
static tern_status captures(const Onnx__GraphProto *g, char ***names, size_t *n)
{
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *np = g->node[i];
		for (size_t k = 0; k <= np->n_input; k++) {
			char **sub = NULL;
			size_t n_sub = 0;
			const char *const *use;
			size_t n_use;
			if (k < np->n_input) {
				use = (const char *const *)&np->input[k];
				n_use = 1;
			} else {
				/* what its own subgraphs read from outside them */
				for (size_t a = 0; a < np->n_attribute; a++) {
					const Onnx__AttributeProto *at = np->attribute[a];
					tern_status st = at->g ? captures(at->g, &sub, &n_sub) : TERN_OK;
					for (size_t j = 0; !st && j < at->n_graphs; j++)
						st = captures(at->graphs[j], &sub, &n_sub);
					if (st)
						return st;
				}
				use = (const char *const *)sub;
				n_use = n_sub;
			}
			for (size_t u = 0; u < n_use; u++) {
				const char *name = use[u];
				bool local = !name || !*name;
				for (size_t j = 0; j < g->n_input && !local; j++)
					local = !strcmp(g->input[j]->name, name);
				for (size_t j = 0; j < g->n_initializer && !local; j++)
					local = !strcmp(g->initializer[j]->name, name);
				for (size_t j = 0; j < g->n_node && !local; j++)
					for (size_t o = 0; o < g->node[j]->n_output && !local; o++)
						local = !strcmp(g->node[j]->output[o], name);
				for (size_t j = 0; j < *n && !local; j++)
					local = !strcmp((*names)[j], name);
				tern_status st = local ? TERN_OK : append_string(names, n, name);
				if (st)
					return st;
			}
			for (size_t u = 0; u < n_sub; u++)
				free(sub[u]);
			free(sub);
		}
	}
	return TERN_OK;
}

static void free_strings(char **s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(s[i]);
	free(s);
}

/* The value of an enclosing graph that subgraph br reads as name. */
static tern_value *read_from_outside(tern_graph *br, const char *name)
{
	tern_value *v = tern_graph_lookup(br, name);
	while (v && (v->flags & TERN_VALUE_OUTER) && v->outer)
		v = v->outer;
	return v;
}

/* What subgraph g (br in the IR) reads from outside it, for the function it is lifted into: the
 * captures (*cap), but those a Constant node makes (no inputs) as copies of that node (*consts), so
 * that the function has the value itself, which shape inference reads (a Reshape's shape, an
 * Unsqueeze's axes) where an input would be unknown. */
static tern_status lifted_reads(const Onnx__GraphProto *g, tern_graph *br, char ***capp, size_t *n_cap,
                                Onnx__NodeProto ***consts, size_t *n_consts)
{
	size_t k = 0;
	tern_status st = captures(g, capp, n_cap);
	char **cap = *capp;
	for (size_t i = 0; i < *n_cap; i++) {
		tern_value *v = read_from_outside(br, cap[i]);
		const tern_node *p = v ? v->producer : NULL;
		if (!st && p && !*p->domain && !strcmp(p->op_type, "Constant") && !p->n_inputs && p->n_outputs == 1) {
			Onnx__NodeProto *c = tern_pb_copy(p->proto);
			Onnx__NodeProto **arr = c ? realloc(*consts, (*n_consts + 1) * sizeof *arr) : NULL;
			if (!arr) {
				if (c)
					onnx__node_proto__free_unpacked(c, NULL);
				st = oom();
			} else {
				*consts = arr;
				arr[(*n_consts)++] = c;
				free(cap[i]);
				continue;
			}
		}
		cap[k++] = cap[i];
	}
	*n_cap = k;
	return st;
}

static void free_nodes(Onnx__NodeProto **np, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (np[i])
			onnx__node_proto__free_unpacked(np[i], NULL);
	free(np);
}

/* A kept call's handle: a fresh name from the node's first output. */
static char *handle_name(tern_graph *g, const Onnx__NodeProto *np, const char *suffix)
{
	char stem[300];
	snprintf(stem, sizeof stem, "%.200s/%s", np->n_output && np->output[0] && *np->output[0] ? np->output[0]
	                                          : np->name && *np->name                          ? np->name
	                                                                                           : np->op_type,
	         suffix);
	return tern_graph_unique_name(g, stem);
}

/* The If branch attribute `which` of node n (in graph g, named ctx for the lifted function's name)
 * as a function of what it reads, queued; the branch becomes one kept call of it, returning the
 * branch's outputs and the handle named h. */
static tern_status lift(gen *G, tern_node *n, const char *which, const char *ctx, const char *ctx_domain,
                        const char *h)
{
	Onnx__AttributeProto *at = NULL;
	for (size_t a = 0; a < n->proto->n_attribute && !at; a++)
		if (n->proto->attribute[a]->name && !strcmp(n->proto->attribute[a]->name, which) && n->proto->attribute[a]->g)
			at = n->proto->attribute[a];
	tern_graph *br = tern_attr_graph(n, which);
	if (!at || !br)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the If has no %s graph", which);
	Onnx__GraphProto *g = at->g;
	if (g->n_initializer || g->n_sparse_initializer)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the %s has initializers (make them Constant nodes)", which);
	char **cap = NULL;
	size_t n_cap = 0, n_consts = 0;
	Onnx__NodeProto **consts = NULL;
	tern_status st = lifted_reads(g, br, &cap, &n_cap, &consts, &n_consts);
	char lname[512];
	snprintf(lname, sizeof lname, "%.200s__if%d_%s", ctx, G->n_lifted, which[0] == 't' ? "then" : "else");
	G->n_lifted += which[0] != 't';
	Onnx__FunctionProto *fp = st ? NULL : new_function(lname, ctx_domain, G);
	if (!st && !fp)
		st = oom();
	if (!st) {
		for (size_t i = 0; !st && i < n_cap; i++)
			st = append_string(&fp->input, &fp->n_input, cap[i]);
		for (size_t i = 0; !st && i < g->n_output; i++)
			st = append_string(&fp->output, &fp->n_output, g->output[i]->name);
		/* the constants it reads, then the branch's nodes, copied into the function */
		for (size_t i = 0; !st && i < n_consts; i++) {
			Onnx__NodeProto *c = consts[i];
			consts[i] = NULL; /* the function's now, or freed */
			st = append_node(&fp->node, &fp->n_node, c);
		}
		for (size_t i = 0; !st && i < g->n_node; i++)
			st = append_node(&fp->node, &fp->n_node, tern_pb_copy(g->node[i]));
	}
	if (fp && (st || (st = add_fn(G, fp))))
		onnx__function_proto__free_unpacked(fp, NULL);
	/* the captures' types, as the branch sees them */
	tern_value **cv = st ? NULL : calloc(n_cap + 1, sizeof *cv);
	if (!st && !cv)
		st = oom();
	for (size_t i = 0; !st && i < n_cap; i++) {
		cv[i] = read_from_outside(br, cap[i]);
	}
	if (!st)
		st = push(G, ctx_domain, lname, cv, n_cap);
	free(cv);
	/* the branch, through the IR (which writes it back): (outputs..., h) = tern.Invoke <function =
	 * L__fwd, keep = 1> (captures...) */
	char *fwd = st ? NULL : cat(lname, "__fwd");
	if (!st && !fwd)
		st = oom();
	if (!st) {
		for (size_t i = 0; i < br->n_nodes; i++)
			if (!br->nodes[i]->removed)
				tern_graph_remove_node(br, br->nodes[i]);
		const char **outs = calloc(br->n_outputs + 2, sizeof *outs);
		if (!outs)
			st = oom();
		for (size_t i = 0; !st && i < br->n_outputs; i++)
			outs[i] = br->outputs[i]->name;
		tern_node *call = NULL;
		if (!st) {
			outs[br->n_outputs] = h;
			call = tern_graph_add_node(br, "Invoke", TERN_DOMAIN, h, (const char *const *)cap, n_cap, outs,
			                           br->n_outputs + 1);
		}
		free(outs);
		if (!st && (!call || tern_node_add_attr_string(call, "function", fwd) ||
		            tern_node_add_attr_string(call, "function_domain", ctx_domain) ||
		            tern_node_add_attr_int(call, "keep", 1)))
			st = oom();
		if (!st) {
			tern_value *hv = call->outputs[call->n_outputs - 1];
			tern_type_unknown(&hv->type);
			hv->type.dtype = TERN_INT64;
			hv->type.rank = 0;
			st = tern_graph_add_output(br, hv);
		}
	}
	free(fwd);
	free_strings(cap, n_cap);
	free_nodes(consts, n_consts);
	return st;
}

/* A node proto Constant of an int64 or bool scalar. */
static Onnx__NodeProto *scalar_const(const char *out, int dtype, int64_t v)
{
	Onnx__NodeProto *np = new_node("", "Constant", out, NULL, 0, &out, 1);
	tern_tensor t = {0};
	int64_t dims[1] = {0};
	bool ok = np && !tern_tensor_alloc(&t, dtype, 0, dims);
	if (ok) {
		if (dtype == TERN_BOOL)
			*(uint8_t *)t.data = v != 0;
		else
			*(int64_t *)t.data = v;
		ok = !tern_proto_add_attr_tensor(np, "value", &t);
	}
	tern_tensor_free(&t);
	if (!ok && np) {
		onnx__node_proto__free_unpacked(np, NULL);
		np = NULL;
	}
	return np;
}

/* A graph proto of nodes (taken) and outputs (untyped), for an If's branch. */
static Onnx__GraphProto *branch_graph(const char *name, Onnx__NodeProto **nodes, size_t n, char *const *out,
                                      size_t n_out)
{
	Onnx__GraphProto *gp = calloc(1, sizeof *gp);
	bool ok = gp != NULL;
	if (ok) {
		onnx__graph_proto__init(gp);
		ok = (gp->name = tern_strdup(name)) && (gp->output = calloc(n_out + 1, sizeof *gp->output));
	}
	for (size_t i = 0; ok && i < n_out; i++) {
		Onnx__ValueInfoProto *vi = value_info(out[i], NULL);
		if ((ok = vi != NULL))
			gp->output[gp->n_output++] = vi;
	}
	for (size_t i = 0; i < n; i++)
		if (!ok)
			onnx__node_proto__free_unpacked(nodes[i], NULL);
		else
			ok = !append_node(&gp->node, &gp->n_node, nodes[i]); /* which frees it if it fails */
	if (!ok && gp) {
		onnx__graph_proto__free_unpacked(gp, NULL);
		gp = NULL;
	}
	return gp;
}

/* An invocation of function name (domain) by a node proto, without keep. */
static Onnx__NodeProto *invoke_node(const char *name, const char *domain, const char *const *in, size_t n_in,
                                    const char *const *out, size_t n_out)
{
	Onnx__NodeProto *np = new_node(TERN_DOMAIN, "Invoke", out[0], in, n_in, out, n_out);
	if (np && (tern_proto_add_attr_string(np, "function", name) ||
	           tern_proto_add_attr_string(np, "function_domain", domain))) {
		onnx__node_proto__free_unpacked(np, NULL);
		np = NULL;
	}
	return np;
}

/* A Loop (node n of graph g) as a recursion, for its gradient:
 *     L(i, trips, cond, v..., captures...) = If (i < trips and cond) then L(i + 1, trips, body(i, cond, v...))
 *                                             else v
 *     E(M, cond, v..., captures...) = L(0, M, cond, v..., captures...)
 * and the Loop a plain call of E (made a kept call with the others). Each trip is then one call whose
 * values are kept, and the reverse pass is the recursion's: tern.Backward trip by trip, the last first.
 * The body's nodes are L's, under their own names; its inputs name L's first inputs. The Loop's body
 * proto is taken off the node into *detached (the IR still points at it until the model is read anew). */
static tern_status lift_loop(gen *G, tern_node *n, const char *ctx, const char *ctx_domain,
                             Onnx__AttributeProto **detached)
{
	Onnx__NodeProto *np = n->proto;
	size_t at_i = np->n_attribute;
	for (size_t a = 0; a < np->n_attribute && at_i == np->n_attribute; a++)
		if (np->attribute[a]->name && !strcmp(np->attribute[a]->name, "body") && np->attribute[a]->g)
			at_i = a;
	tern_graph *br = tern_attr_graph(n, "body");
	if (at_i == np->n_attribute || !br)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the Loop has no body graph");
	const Onnx__GraphProto *b = np->attribute[at_i]->g;
	size_t nc = np->n_input >= 2 ? np->n_input - 2 : 0;
	if (np->n_input < 2 || b->n_input != nc + 2 || b->n_output < nc + 1)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the Loop's body has %zu inputs and %zu outputs for %zu "
		                                       "carried values", b->n_input, b->n_output, nc);
	if (b->n_output > nc + 1)
		return tern_node_errorf(n, TERN_EDATA, "gradient: a Loop with scan outputs (carry the values instead)");
	if (b->n_initializer || b->n_sparse_initializer)
		return tern_node_errorf(n, TERN_EDATA, "gradient: the Loop's body has initializers (make them Constant nodes)");
	char **cap = NULL;
	size_t n_cap = 0, n_consts = 0;
	Onnx__NodeProto **consts = NULL;
	tern_status st = lifted_reads(b, br, &cap, &n_cap, &consts, &n_consts);
	char lname[512], ename[520];
	snprintf(lname, sizeof lname, "%.200s__loop%d", ctx, G->n_lifted++);
	snprintf(ename, sizeof ename, "%s_entry", lname);
	static const char *const TRIPS = "tern.loop.trips", *const ONE = "tern.loop.one", *const NEXT = "tern.loop.next",
	                         *const MORE = "tern.loop.more", *const GO = "tern.loop.go", *const ZERO = "tern.loop.zero";
	/* names: L's inputs, its outputs, the branches' outputs, E's inputs */
	size_t n_args = 3 + nc + n_cap;
	char **names = calloc(4 * (nc + 1) + 2 * n_args, sizeof *names);
	char **outs = names, **rec = names + nc + 1, **ids = rec + nc + 1, **v = ids + nc + 1;
	const char **largs = (const char **)(v + nc + 1), **eargs = largs + n_args;
	if (!st && !names)
		st = oom();
	for (size_t k = 0; !st && k < nc; k++) {
		char buf[64];
		snprintf(buf, sizeof buf, "tern.loop.out%zu", k);
		outs[k] = tern_strdup(buf);
		snprintf(buf, sizeof buf, "tern.loop.rec%zu", k);
		rec[k] = tern_strdup(buf);
		snprintf(buf, sizeof buf, "tern.loop.same%zu", k);
		ids[k] = tern_strdup(buf);
		snprintf(buf, sizeof buf, "tern.loop.v%zu", k);
		v[k] = tern_strdup(buf);
		if (!outs[k] || !rec[k] || !ids[k] || !v[k])
			st = oom();
	}
	/* L */
	Onnx__FunctionProto *L = st ? NULL : new_function(lname, ctx_domain, G);
	if (!st && !L)
		st = oom();
	if (!st) {
		largs[0] = b->input[0]->name;
		largs[1] = TRIPS;
		for (size_t k = 1; k < nc + 2; k++)
			largs[k + 1] = b->input[k]->name;
		for (size_t c = 0; c < n_cap; c++)
			largs[3 + nc + c] = cap[c];
		for (size_t k = 0; !st && k < n_args; k++)
			st = append_string(&L->input, &L->n_input, largs[k]);
		for (size_t k = 0; !st && k < nc; k++)
			st = append_string(&L->output, &L->n_output, outs[k]);
	}
	if (!st) {
		const char *less_in[2] = {b->input[0]->name, TRIPS}, *and_in[2] = {MORE, b->input[1]->name};
		const char *inc_in[2] = {b->input[0]->name, ONE};
		/* the constants the body reads, L's own */
		for (size_t i = 0; !st && i < n_consts; i++) {
			Onnx__NodeProto *c = consts[i];
			consts[i] = NULL;
			st = append_node(&L->node, &L->n_node, c);
		}
		if (!st)
			st = append_node(&L->node, &L->n_node, new_node("", "Less", MORE, less_in, 2, &MORE, 1));
		if (!st)
			st = append_node(&L->node, &L->n_node, new_node("", "And", GO, and_in, 2, &GO, 1));
		/* then: the body, then L on the next trip; else: the carried values as they are */
		size_t n_then = b->n_node + 3;
		Onnx__NodeProto **then_nodes = st ? NULL : calloc(n_then, sizeof *then_nodes), *else_nodes[64];
		Onnx__NodeProto **els = nc <= 64 ? else_nodes : calloc(nc, sizeof *els);
		if (!st && (!then_nodes || !els))
			st = oom();
		size_t made = 0;
		for (size_t i = 0; !st && i < b->n_node; i++)
			if (!(then_nodes[made++] = tern_pb_copy(b->node[i])))
				st = oom();
		if (!st && !(then_nodes[made++] = scalar_const(ONE, TERN_INT64, 1)))
			st = oom();
		if (!st && !(then_nodes[made++] = new_node("", "Add", NEXT, inc_in, 2, &NEXT, 1)))
			st = oom();
		if (!st) {
			const char **next = calloc(n_args, sizeof *next);
			if (next) {
				next[0] = NEXT;
				next[1] = TRIPS;
				for (size_t k = 0; k < nc + 1; k++)
					next[2 + k] = b->output[k]->name;
				for (size_t c = 0; c < n_cap; c++)
					next[3 + nc + c] = cap[c];
			}
			if (!next || !(then_nodes[made++] = invoke_node(lname, ctx_domain, next, n_args,
			                                                 (const char *const *)rec, nc)))
				st = oom();
			free(next);
		}
		size_t n_els = 0;
		for (size_t k = 0; !st && k < nc; k++, n_els++) {
			const char *in = b->input[2 + k]->name;
			if (!(els[k] = new_node("", "Identity", ids[k], &in, 1, (const char *const *)&ids[k], 1)))
				st = oom();
		}
		Onnx__GraphProto *tg = NULL, *eg = NULL;
		if (!st) {
			tg = branch_graph("loop_trip", then_nodes, made, rec, nc);
			eg = branch_graph("loop_done", els, n_els, ids, nc);
			made = n_els = 0;
			if (!tg || !eg)
				st = oom();
		}
		for (size_t i = 0; i < made; i++)
			if (then_nodes[i])
				onnx__node_proto__free_unpacked(then_nodes[i], NULL);
		for (size_t i = 0; i < n_els; i++)
			if (els[i])
				onnx__node_proto__free_unpacked(els[i], NULL);
		if (els != else_nodes)
			free(els);
		free(then_nodes);
		Onnx__NodeProto *iff = st ? NULL : new_node("", "If", outs[0], &GO, 1,
		                                          (const char *const *)outs, nc);
		Onnx__AttributeProto *ta = iff ? tern_proto_new_attr(iff, "then_branch", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH) : NULL;
		if (ta)
			ta->g = tg, tg = NULL;
		Onnx__AttributeProto *ea = ta ? tern_proto_new_attr(iff, "else_branch", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH) : NULL;
		if (ea)
			ea->g = eg, eg = NULL;
		if (!st && !ea) {
			st = oom();
			if (iff)
				onnx__node_proto__free_unpacked(iff, NULL);
		} else if (!st)
			st = append_node(&L->node, &L->n_node, iff);
		if (tg)
			onnx__graph_proto__free_unpacked(tg, NULL);
		if (eg)
			onnx__graph_proto__free_unpacked(eg, NULL);
	}
	if (L && (st || (st = add_fn(G, L))))
		onnx__function_proto__free_unpacked(L, NULL);
	/* E: the Loop's own inputs (M and cond where given), L from trip 0 */
	Onnx__FunctionProto *E = st ? NULL : new_function(ename, ctx_domain, G);
	if (!st && !E)
		st = oom();
	size_t n_e = 0;
	if (!st) {
		bool has_m = np->input[0] && *np->input[0], has_c = np->input[1] && *np->input[1];
		if (has_m)
			eargs[n_e++] = TRIPS;
		if (has_c)
			eargs[n_e++] = GO;
		for (size_t k = 0; k < nc; k++)
			eargs[n_e++] = v[k];
		for (size_t c = 0; c < n_cap; c++)
			eargs[n_e++] = cap[c];
		for (size_t k = 0; !st && k < n_e; k++)
			st = append_string(&E->input, &E->n_input, eargs[k]);
		for (size_t k = 0; !st && k < nc; k++)
			st = append_string(&E->output, &E->n_output, outs[k]);
		if (!st)
			st = append_node(&E->node, &E->n_node, scalar_const(ZERO, TERN_INT64, 0));
		if (!st && !has_m)
			st = append_node(&E->node, &E->n_node, scalar_const(TRIPS, TERN_INT64, INT64_MAX));
		if (!st && !has_c)
			st = append_node(&E->node, &E->n_node, scalar_const(GO, TERN_BOOL, 1));
		const char *first[3] = {ZERO, TRIPS, GO};
		const char **call_in = st ? NULL : calloc(n_args, sizeof *call_in);
		if (!st && !call_in)
			st = oom();
		if (!st) {
			memcpy(call_in, first, sizeof first);
			for (size_t k = 0; k < nc; k++)
				call_in[3 + k] = v[k];
			for (size_t c = 0; c < n_cap; c++)
				call_in[3 + nc + c] = cap[c];
			st = append_node(&E->node, &E->n_node, invoke_node(lname, ctx_domain, call_in, n_args,
			                                                   (const char *const *)outs, nc));
		}
		free(call_in);
	}
	if (E && (st || (st = add_fn(G, E))))
		onnx__function_proto__free_unpacked(E, NULL);
	/* the Loop: a plain call of E (its inputs: M and cond where given, the carried values, the captures) */
	tern_value **ev = st ? NULL : calloc(n_e + 1, sizeof *ev);
	if (!st && !ev)
		st = oom();
	if (!st) {
		size_t k = 0;
		for (size_t i = 0; i < np->n_input; i++)
			if (i >= 2 || (np->input[i] && *np->input[i]))
				ev[k++] = i < n->n_inputs ? n->inputs[i] : NULL;
		for (size_t c = 0; c < n_cap; c++)
			ev[k++] = read_from_outside(br, cap[c]);
		/* the node's inputs: the Loop's given ones, then the captures */
		size_t kept = 0;
		for (size_t i = 0; i < np->n_input; i++)
			if (i >= 2 || (np->input[i] && *np->input[i]))
				np->input[kept++] = np->input[i];
			else
				free(np->input[i]);
		np->n_input = kept;
		for (size_t c = 0; !st && c < n_cap; c++)
			st = append_string(&np->input, &np->n_input, cap[c]);
		if (!st) {
			*detached = np->attribute[at_i];
			for (size_t a = at_i + 1; a < np->n_attribute; a++)
				np->attribute[a - 1] = np->attribute[a];
			np->n_attribute--;
		}
		if (!st)
			st = set_string(&np->op_type, ename);
		if (!st)
			st = set_string(&np->domain, ctx_domain);
	}
	if (!st)
		st = push(G, ctx_domain, ename, ev, n_e);
	free(ev);
	if (names)
		for (size_t k = 0; k < 4 * (nc + 1); k++)
			free(names[k]);
	free(names);
	free_strings(cap, n_cap);
	free_nodes(consts, n_consts);
	return st;
}

/* Rewrites graph g's nodes (protos) for the forward pass of a step: calls become kept calls of the
 * callee's F__fwd, Ifs have their branches lifted; the callees are queued. ctx names g (the function,
 * or "main") for the lifted functions' names. */
static tern_status keep_calls(gen *G, tern_graph *g, const char *ctx, const char *ctx_domain)
{
	tern_status st = TERN_OK;
	for (size_t i = 0; i < g->n_nodes && !st; i++) {
		tern_node *n = g->nodes[i];
		if (n->removed)
			continue;
		Onnx__NodeProto *np = n->proto;
		if (!*n->domain && !strcmp(n->op_type, "If")) {
			char *h = handle_name(g, np, "handle");
			if (!h)
				return oom();
			char ht[320], he[320];
			snprintf(ht, sizeof ht, "%s_then", h);
			snprintf(he, sizeof he, "%s_else", h);
			st = lift(G, n, "then_branch", ctx, ctx_domain, ht);
			if (!st)
				st = lift(G, n, "else_branch", ctx, ctx_domain, he);
			if (!st)
				st = append_string(&np->output, &np->n_output, h);
			free(h);
			continue;
		}
		const char *domain, *name;
		if (!*n->domain && !strcmp(n->op_type, "Loop")) {
			/* a plain call of the Loop's entry function (queued), kept below like any call */
			if (!tern_grow((void **)&G->detached, &G->cap_detached, G->n_detached + 1, sizeof *G->detached))
				return oom();
			G->detached[G->n_detached].np = np;
			G->detached[G->n_detached].at = NULL;
			st = lift_loop(G, n, ctx, ctx_domain, &G->detached[G->n_detached].at);
			if (G->detached[G->n_detached].at)
				G->n_detached++; /* taken off, whether or not what followed failed */
			if (st)
				break;
			name = np->op_type;
			domain = np->domain;
		} else {
			name = tern_node_callee(n, &domain);
			if (!name || !find_fn(G, domain, name))
				continue;
			if ((st = push(G, domain, name, n->inputs, n->n_inputs)))
				break;
		}
		char *fwd = cat(name, "__fwd"), *dom = tern_strdup(domain), *h = handle_name(g, np, "handle");
		if (!fwd || !dom || !h)
			st = oom();
		if (!st)
			st = set_string(&np->op_type, "Invoke");
		if (!st)
			st = set_string(&np->domain, TERN_DOMAIN);
		if (!st)
			st = attr_string(np, "function", fwd);
		if (!st)
			st = attr_string(np, "function_domain", dom);
		if (!st)
			st = attr_int(np, "keep", 1);
		if (!st)
			st = append_string(&np->output, &np->n_output, h);
		free(fwd);
		free(dom);
		free(h);
	}
	return st;
}

/* Every value's type in g and the graphs under it, by name. */
static tern_status collect_types(tern_graph *g, named_type **out, size_t *n, size_t *cap)
{
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if ((v->flags & TERN_VALUE_OUTER) || !v->type.dtype)
			continue;
		if (!tern_grow((void **)out, cap, *n + 1, sizeof **out))
			return oom();
		named_type *t = &(*out)[*n];
		if (!(t->name = tern_strdup(v->name)))
			return oom();
		t->type = v->type;
		for (int d = 0; d < TERN_MAX_RANK; d++)
			t->type.dim_param[d] = NULL;
		(*n)++;
	}
	return TERN_OK;
}

/* The types found before the rewrite, by name, onto the rewritten graph's values; handles are int64
 * scalars. */
static void restore_types(tern_graph *g, const named_type *t, size_t n)
{
	for (size_t i = 0; i < g->n_values; i++) {
		tern_value *v = g->values[i];
		if (v->flags & TERN_VALUE_OUTER)
			continue;
		for (size_t k = 0; k < n; k++)
			if (!strcmp(t[k].name, v->name)) {
				v->type = t[k].type;
				break;
			}
		if (v->producer && v->producer_output == tern_node_kept_handle(v->producer)) {
			tern_type_unknown(&v->type);
			v->type.dtype = TERN_INT64;
			v->type.rank = 0;
		}
	}
}

static void free_types(named_type *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(t[i].name);
	free(t);
}

/* ---------------------------------------------------------------- F__fwd and F__grad */

/* F__grad from the scratch model s of F__fwd's body, after the reverse pass: its backward nodes,
 * each forward value they read as tern.Saved of the frame (input "tern.frame"). */
static tern_status grad_function(gen *G, const char *base, const Onnx__FunctionProto *f, tern_model *s,
                                 char *const *fwd_out, size_t n_fwd_out, char *const *dy_names,
                                 tern_value *const *grads, Onnx__FunctionProto **out)
{
	*out = NULL;
	char *gname = cat(base, "__grad");
	Onnx__FunctionProto *fp = gname ? new_function(gname, f->domain, G) : NULL;
	free(gname);
	if (!fp)
		return oom();
	tern_status st = tern_model_sync(s);
	for (size_t i = 0; !st && i < f->n_input; i++)
		st = append_string(&fp->input, &fp->n_input, f->input[i]);
	if (!st)
		st = append_string(&fp->input, &fp->n_input, "tern.frame");
	for (size_t i = 0; !st && i < f->n_output; i++)
		st = append_string(&fp->input, &fp->n_input, dy_names[i]);
	const Onnx__GraphProto *gp = s->proto->graph;
	char **saved = NULL;
	size_t n_saved = 0;
	for (size_t i = 0; !st && i < gp->n_node; i++) {
		const Onnx__NodeProto *np = gp->node[i];
		bool forward = false;
		for (size_t o = 0; o < np->n_output && !forward; o++)
			for (size_t k = 0; k < n_fwd_out && !forward; k++)
				forward = !strcmp(np->output[o], fwd_out[k]);
		if (forward)
			continue;
		for (size_t k = 0; k < np->n_input && !st; k++) {
			bool from_fwd = false, have = false;
			for (size_t j = 0; j < n_fwd_out && !from_fwd; j++)
				from_fwd = !strcmp(np->input[k], fwd_out[j]);
			for (size_t j = 0; j < n_saved && !have; j++)
				have = !strcmp(saved[j], np->input[k]);
			if (from_fwd && !have)
				st = append_string(&saved, &n_saved, np->input[k]);
		}
		Onnx__NodeProto *copy = st ? NULL : tern_pb_copy(np);
		if (!st)
			st = append_node(&fp->node, &fp->n_node, copy);
	}
	/* the reads of the frame come first */
	size_t n_back = fp->n_node;
	for (size_t j = 0; !st && j < n_saved; j++) {
		const char *in = "tern.frame";
		Onnx__NodeProto *np = new_node(TERN_DOMAIN, "Saved", saved[j], &in, 1, (const char *const *)&saved[j], 1);
		if (!np || attr_string(np, "value", saved[j])) {
			if (np)
				onnx__node_proto__free_unpacked(np, NULL);
			st = oom();
		} else {
			st = append_node(&fp->node, &fp->n_node, np);
		}
	}
	if (!st && n_saved) {
		Onnx__NodeProto **ordered = malloc(fp->n_node * sizeof *ordered);
		if (!ordered) {
			st = oom();
		} else {
			memcpy(ordered, fp->node + n_back, n_saved * sizeof *ordered);
			memcpy(ordered + n_saved, fp->node, n_back * sizeof *ordered);
			free(fp->node);
			fp->node = ordered;
		}
	}
	/* outputs: each input's gradient, a zero scalar where none flows */
	for (size_t i = 0; !st && i < f->n_input; i++) {
		if (grads[i]) {
			st = append_string(&fp->output, &fp->n_output, grads[i]->name);
			continue;
		}
		char zname[300];
		snprintf(zname, sizeof zname, "%.200s/grad.zero", f->input[i]);
		Onnx__NodeProto *np = new_node("", "Constant", zname, NULL, 0, (const char *const *)&(const char *){zname}, 1);
		tern_tensor z = {0};
		if (!np || tern_tensor_alloc(&z, TERN_FLOAT, 0, NULL)) {
			if (np)
				onnx__node_proto__free_unpacked(np, NULL);
			st = oom();
			break;
		}
		st = tern_proto_add_attr_tensor(np, "value", &z); /* alloc zeroed it */
		tern_tensor_free(&z);
		if (!st)
			st = append_node(&fp->node, &fp->n_node, np);
		else
			onnx__node_proto__free_unpacked(np, NULL);
		if (!st)
			st = append_string(&fp->output, &fp->n_output, zname);
	}
	free_strings(saved, n_saved);
	if (st) {
		onnx__function_proto__free_unpacked(fp, NULL);
		return st;
	}
	*out = fp;
	return TERN_OK;
}

/* F__fwd and F__grad for one queued function. */
static tern_status differentiate(gen *G, const work *w)
{
	Onnx__FunctionProto *f = find_fn(G, w->domain, w->name);
	if (!f)
		return tern_errorf(TERN_EDATA, "%s: the model has no function %s", G->m->source, w->name);
	if (w->n != f->n_input)
		return tern_errorf(TERN_EDATA, "%s: %s is called with %zu inputs; it takes %zu", G->m->source, w->name, w->n,
		                   f->n_input);
	/* 1. typed: the body on the call's input types, through its calls and Ifs */
	tern_model *s = NULL;
	tern_status st = scratch(G, f->node, f->n_node, f->input, w->types, f->n_input, f->output, f->n_output, &s);
	named_type *types = NULL;
	size_t n_types = 0, cap_types = 0;
	if (!st)
		st = tern_model_infer_types_through_calls(s);
	if (!st)
		st = collect_types(s->graph, &types, &n_types, &cap_types);
	/* 2. F__fwd: its calls and Ifs kept */
	if (!st)
		st = keep_calls(G, s->graph, f->name, f->domain && *f->domain ? f->domain : TERN_GRAD_DOMAIN);
	char *fname = st ? NULL : cat(f->name, "__fwd");
	Onnx__FunctionProto *fwd = fname ? new_function(fname, f->domain, G) : NULL;
	free(fname);
	if (!st && !fwd)
		st = oom();
	for (size_t i = 0; !st && i < f->n_input; i++)
		st = append_string(&fwd->input, &fwd->n_input, f->input[i]);
	for (size_t i = 0; !st && i < f->n_output; i++)
		st = append_string(&fwd->output, &fwd->n_output, f->output[i]);
	if (!st)
		st = tern_model_sync(s);
	for (size_t i = 0; !st && i < s->proto->graph->n_node; i++)
		st = append_node(&fwd->node, &fwd->n_node, tern_pb_copy(s->proto->graph->node[i]));
	tern_model_free(s);
	s = NULL;
	if (!st && (st = add_fn(G, fwd)))
		onnx__function_proto__free_unpacked(fwd, NULL);
	if (st) {
		free_types(types, n_types);
		return st;
	}
	/* 3. its reverse pass, on a scratch model of F__fwd's body */
	st = scratch(G, fwd->node, fwd->n_node, fwd->input, w->types, fwd->n_input, fwd->output, fwd->n_output, &s);
	if (!st)
		restore_types(s->graph, types, n_types);
	free_types(types, n_types);
	char **fwd_out = NULL, **dy_names = NULL;
	size_t n_fwd_out = 0, n_dy = 0;
	for (size_t i = 0; !st && i < s->graph->n_nodes; i++)
		for (size_t o = 0; !st && o < s->graph->nodes[i]->n_outputs; o++)
			if (s->graph->nodes[i]->outputs[o])
				st = append_string(&fwd_out, &n_fwd_out, s->graph->nodes[i]->outputs[o]->name);
	size_t n_x = f->n_input, n_y = f->n_output;
	tern_value **ys = calloc(n_y + 1, sizeof *ys), **seeds = calloc(n_y + 1, sizeof *seeds);
	tern_value **wrt = calloc(n_x + 1, sizeof *wrt), **grads = calloc(n_x + 1, sizeof *grads);
	int *wrt_of = calloc(n_x + 1, sizeof *wrt_of);
	if (!st && (!ys || !seeds || !wrt || !grads || !wrt_of))
		st = oom();
	int k_y = 0, k_x = 0;
	for (size_t o = 0; !st && o < n_y; o++) {
		tern_value *y = s->graph->outputs[o];
		char stem[300];
		snprintf(stem, sizeof stem, "%.200s/grad.in", y->name);
		char *dn = tern_graph_unique_name(s->graph, stem);
		if (!dn || append_string(&dy_names, &n_dy, dn)) {
			free(dn);
			st = oom();
			break;
		}
		free(dn);
		if (!tern_g_differentiable(y->type.dtype))
			continue;
		tern_value *seed = tern_graph_add_input(s->graph, dy_names[o], &y->type);
		if (!seed) {
			st = oom();
			break;
		}
		ys[k_y] = y;
		seeds[k_y++] = seed;
	}
	for (size_t i = 0; !st && i < n_x; i++) {
		tern_value *x = s->graph->inputs[i];
		if (tern_g_differentiable(x->type.dtype)) {
			wrt_of[k_x] = (int)i;
			wrt[k_x++] = x;
		}
	}
	tern_value **got = calloc((size_t)k_x + 1, sizeof *got);
	if (!st && !got)
		st = oom();
	if (!st && k_y && k_x)
		st = tern_autodiff_impl(s, ys, seeds, k_y, wrt, k_x, NULL, got, NULL, TERN_AUTODIFF_ANY);
	for (int j = 0; !st && j < k_x; j++)
		grads[wrt_of[j]] = got[j];
	Onnx__FunctionProto *gfp = NULL;
	if (!st)
		st = grad_function(G, f->name, fwd, s, fwd_out, n_fwd_out, dy_names, grads, &gfp);
	if (!st && (st = add_fn(G, gfp)))
		onnx__function_proto__free_unpacked(gfp, NULL);
	if (st)
		st = tern_error_prefix(st, w->name);
	free(got);
	free(ys);
	free(seeds);
	free(wrt);
	free(grads);
	free(wrt_of);
	free_strings(fwd_out, n_fwd_out);
	free_strings(dy_names, n_dy);
	tern_model_free(s);
	return st;
}

static bool has_calls(const tern_graph *g)
{
	for (size_t i = 0; i < g->n_nodes; i++) {
		const tern_node *n = g->nodes[i];
		const char *domain, *name = tern_node_callee(n, &domain);
		if (!n->removed && ((!*n->domain && (!strcmp(n->op_type, "If") || !strcmp(n->op_type, "Loop"))) ||
		                    (name && tern_function_find(g->model, domain, name))))
			return true;
	}
	return false;
}

tern_status tern_grad_prepare_calls(tern_model **pm, bool *changed)
{
	tern_model *m = *pm;
	*changed = false;
	if (!has_calls(m->graph))
		return TERN_OK;
	gen G = {.m = m};
	tern_status st = tern_model_infer_types_through_calls(m);
	for (size_t i = 0; !st && i < m->proto->n_functions; i++)
		st = add_fn(&G, m->proto->functions[i]);
	G.n_orig = G.n_fns;
	named_type *types = NULL;
	size_t n_types = 0, cap_types = 0;
	if (!st)
		st = collect_types(m->graph, &types, &n_types, &cap_types);
	if (!st)
		st = keep_calls(&G, m->graph, "main", TERN_GRAD_DOMAIN);
	for (size_t i = 0; !st && i < G.n_todo; i++)
		st = differentiate(&G, &G.todo[i]);
	/* into the model: the functions made, the tern domains; then its IR anew */
	for (size_t i = G.n_orig; !st && i < G.n_fns; i++) {
		Onnx__FunctionProto **arr = realloc(m->proto->functions, (m->proto->n_functions + 1) * sizeof *arr);
		if (!arr) {
			st = oom();
			break;
		}
		m->proto->functions = arr;
		arr[m->proto->n_functions++] = G.fns[i];
		G.fns[i] = NULL;
	}
	if (!st)
		st = tern_model_import_opset(m, TERN_DOMAIN, TERN_DOMAIN_VERSION);
	if (!st)
		st = tern_model_import_opset(m, TERN_GRAD_DOMAIN, 1);
	void *bytes = NULL;
	size_t size = 0;
	tern_model *re = NULL;
	if (!st)
		st = tern_model_save_bytes(m, &bytes, &size);
	if (!st)
		st = tern_model_load_bytes(bytes, size, m->source, m->base_dir, &re);
	free(bytes);
	if (!st) {
		restore_types(re->graph, types, n_types);
		tern_model_free(m);
		*pm = re;
		*changed = true;
		for (size_t i = 0; i < G.n_detached; i++)
			onnx__attribute_proto__free_unpacked(G.detached[i].at, &tern_pb_allocator);
	} else
		for (size_t i = 0; i < G.n_detached; i++) {
			/* back on its node, where the IR and the model's free expect it */
			Onnx__NodeProto *np = G.detached[i].np;
			Onnx__AttributeProto **arr = realloc(np->attribute, (np->n_attribute + 1) * sizeof *arr);
			if (arr) {
				np->attribute = arr;
				arr[np->n_attribute++] = G.detached[i].at;
			} else
				onnx__attribute_proto__free_unpacked(G.detached[i].at, &tern_pb_allocator);
		}
	free(G.detached);
	free_types(types, n_types);
	for (size_t i = G.n_orig; i < G.n_fns; i++)
		if (G.fns[i])
			onnx__function_proto__free_unpacked(G.fns[i], NULL);
	free(G.fns);
	for (size_t i = 0; i < G.n_todo; i++) {
		free(G.todo[i].name);
		free(G.todo[i].domain);
		free(G.todo[i].types);
	}
	free(G.todo);
	return st;
}
