/* stats.c — a short text summary of a model: operators by count, parameters, opsets, inputs and
 * outputs with their types, functions and tern annotations. */
#include "internal.h"

#include <stdlib.h>

struct op_count {
	const char *domain;
	const char *op_type;
	size_t count;
};

struct census {
	struct op_count *ops;
	size_t n_ops, cap_ops;
	size_t nodes;
	size_t subgraph_nodes;
	size_t initializers;
	int64_t parameters;
	int64_t bytes;
	bool failed;
};

static void count_op(struct census *c, const tern_node *node)
{
	for (size_t i = 0; i < c->n_ops; i++)
		if (!strcmp(c->ops[i].op_type, node->op_type) && !strcmp(c->ops[i].domain, node->domain)) {
			c->ops[i].count++;
			return;
		}
	if (!tern_grow((void **)&c->ops, &c->cap_ops, c->n_ops + 1, sizeof *c->ops)) {
		c->failed = true;
		return;
	}
	c->ops[c->n_ops++] = (struct op_count){node->domain, node->op_type, 1};
}

static void count_initializer(struct census *c, const Onnx__TensorProto *tp)
{
	int64_t numel = 1;
	for (size_t i = 0; i < tp->n_dims; i++)
		numel = tp->dims[i] > 0 && numel <= INT64_MAX / tp->dims[i] ? numel * tp->dims[i] : 0;
	int64_t bytes = numel * (int64_t)tern_dtype_size(tp->data_type);
	if (tp->data_type == TERN_STRING)
		for (size_t i = 0; i < tp->n_string_data; i++)
			bytes += (int64_t)tp->string_data[i].len;
	c->initializers++;
	c->parameters += numel;
	c->bytes += bytes;
}

/* Counts a graph and the subgraphs of its nodes. */
static void count_graph(struct census *c, const tern_graph *g, bool nested)
{
	for (size_t i = 0; i < g->n_values; i++)
		if ((g->values[i]->flags & TERN_VALUE_INITIALIZER) && g->values[i]->initializer)
			count_initializer(c, g->values[i]->initializer);
	for (size_t i = 0; i < g->n_nodes; i++) {
		const tern_node *node = g->nodes[i];
		if (node->removed)
			continue;
		c->nodes++;
		c->subgraph_nodes += nested;
		count_op(c, node);
		for (size_t k = 0; k < node->n_subgraphs; k++)
			count_graph(c, node->subgraphs[k], true);
	}
}

/* Most frequent first; ties by name, so the order is stable. */
static int by_count(const void *a, const void *b)
{
	const struct op_count *x = a, *y = b;
	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	int d = strcmp(x->domain, y->domain);
	return d ? d : strcmp(x->op_type, y->op_type);
}

/* A name padded to width; control characters as \xNN, so that a name cannot break the lines. */
static void print_name(FILE *f, const char *name, int width)
{
	int n = 0;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		n += *c < 0x20 || *c == 0x7f ? fprintf(f, "\\x%02x", *c) : (fputc(*c, f), 1);
	fprintf(f, "%*s", width > n ? width - n : 0, "");
}

static void print_type(FILE *f, const tern_type *t)
{
	fputs(t->dtype == TERN_UNDEFINED ? "?" : tern_dtype_name(t->dtype), f);
	if (t->rank < 0)
		return;
	fputc('[', f);
	for (int i = 0; i < t->rank && i < TERN_MAX_RANK; i++) {
		if (i)
			fputc(',', f);
		if (t->dims[i] >= 0)
			fprintf(f, "%lld", (long long)t->dims[i]);
		else
			print_name(f, t->dim_param[i] && t->dim_param[i][0] ? t->dim_param[i] : "?", 0);
	}
	fputc(']', f);
}

/* "  domain.name          count", the counts in one column. */
static void print_entry(FILE *f, const char *domain, const char *name, size_t count, const char *unit)
{
	fputs("  ", f);
	if (domain[0]) {
		print_name(f, domain, 0);
		fputc('.', f);
	}
	print_name(f, name, 20 - (domain[0] ? (int)strlen(domain) + 1 : 0));
	fprintf(f, " %zu%s\n", count, unit);
}

/* Graph inputs or outputs with their types; initializers listed among the inputs are parameters. */
static void print_values(FILE *f, const char *title, tern_value *const *values, size_t n, bool skip_initializers)
{
	size_t shown = 0;
	for (size_t i = 0; i < n; i++)
		shown += !(skip_initializers && (values[i]->flags & TERN_VALUE_INITIALIZER));
	fprintf(f, "%-12s %zu\n", title, shown);
	for (size_t i = 0; i < n; i++) {
		if (skip_initializers && (values[i]->flags & TERN_VALUE_INITIALIZER))
			continue;
		fputs("  ", f);
		print_name(f, values[i]->name, 20);
		fputc(' ', f);
		print_type(f, &values[i]->type);
		fputc('\n', f);
	}
}

static void print_header(FILE *f, const tern_model *model)
{
	const Onnx__ModelProto *mp = model->proto;
	fprintf(f, "%-12s ", "model");
	print_name(f, model->source, 0);
	fprintf(f, "\n%-12s ", "graph");
	print_name(f, model->graph->name ? model->graph->name : "", 0);
	fputc('\n', f);
	if (mp->has_ir_version)
		fprintf(f, "%-12s %lld\n", "ir_version", (long long)mp->ir_version);
	if (mp->producer_name && mp->producer_name[0]) {
		fprintf(f, "%-12s ", "producer");
		print_name(f, mp->producer_name, 0);
		if (mp->producer_version && mp->producer_version[0]) {
			fputc(' ', f);
			print_name(f, mp->producer_version, 0);
		}
		fputc('\n', f);
	}
	fprintf(f, "%-12s", "opsets");
	for (size_t i = 0; i < mp->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *op = mp->opset_import[i];
		fprintf(f, "%s %s %lld", i ? "," : "", op->domain && op->domain[0] ? op->domain : "ai.onnx",
		        (long long)op->version);
	}
	fputc('\n', f);
}

static void print_footer(FILE *f, const tern_model *model)
{
	const Onnx__ModelProto *mp = model->proto;
	if (model->n_functions) {
		fprintf(f, "%-12s %zu\n", "functions", model->n_functions);
		for (size_t i = 0; i < model->n_functions; i++) {
			const tern_graph *fn = model->functions[i];
			const char *domain = fn->fproto && fn->fproto->domain ? fn->fproto->domain : "";
			print_entry(f, domain, fn->name ? fn->name : "", fn->n_nodes,
			            fn->n_nodes == 1 ? " node" : " nodes");
		}
	}
	for (size_t i = 0; i < mp->n_training_info; i++) {
		const Onnx__TrainingInfoProto *ti = mp->training_info[i];
		/* what the updates are: parameters (the P of an optimizer node) and everything else bound */
		size_t n_params = 0, n_state = 0, n_rows = 0;
		uint64_t param_values = 0, param_bytes = 0, state_bytes = 0;
		const Onnx__NodeProto *opt = NULL;
		for (size_t b = 0; b < ti->n_update_binding; b++) {
			const char *key = ti->update_binding[b]->key;
			const tern_value *v = key ? tern_graph_find(model->graph, key) : NULL;
			const Onnx__TensorProto *t = v ? v->initializer : NULL;
			if (!t)
				continue;
			uint64_t n = 1;
			for (size_t d = 0; d < t->n_dims; d++)
				n *= (uint64_t)t->dims[d];
			uint64_t bytes = n * tern_dtype_size(t->data_type);
			bool param = false;
			const Onnx__GraphProto *alg = ti->algorithm;
			for (size_t k = 0; alg && k < alg->n_node && !param; k++) {
				const Onnx__NodeProto *nd = alg->node[k];
				/* the rules, dense or with the gradient as rows (an embedding table's) */
				const char *op = nd->op_type ? nd->op_type : "";
				size_t len = strlen(op);
				bool rows = len > 4 && strcmp(op + len - 4, "Rows") == 0;
				size_t base = rows ? len - 4 : len;
				if (!nd->domain || strcmp(nd->domain, "tern") ||
				    !((base == 3 && !strncmp(op, "SGD", 3)) || (base == 4 && !strncmp(op, "Adam", 4)) ||
				      (base == 7 && !strncmp(op, "Adagrad", 7))))
					continue;
				size_t p = base == 3 ? 1 : 2;
				if (nd->n_input > p && strcmp(nd->input[p], key) == 0) {
					param = true;
					n_rows += rows;
					if (!opt || !rows)
						opt = nd;
				}
			}
			if (param) {
				n_params++;
				param_values += n;
				param_bytes += bytes;
			} else {
				n_state++;
				state_bytes += bytes;
			}
		}
		fprintf(f, "%-12s %zu parameters (%llu values, %.3f MB), %zu state tensors (%.3f MB)", "training", n_params,
		        (unsigned long long)param_values, (double)param_bytes / 1e6, n_state, (double)state_bytes / 1e6);
		if (n_rows)
			fprintf(f, "; %zu with the gradient as rows", n_rows);
		fputc('\n', f);
		if (opt) {
			fprintf(f, "%-12s tern.%s", "optimizer", opt->op_type);
			for (size_t a = 0; a < opt->n_attribute; a++) {
				const Onnx__AttributeProto *at = opt->attribute[a];
				if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)
					fprintf(f, " %s=%g", at->name, at->f);
				else if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
					fprintf(f, " %s=%lld", at->name, (long long)at->i);
			}
			fputc('\n', f);
		}
	}
	size_t annotations = 0;
	for (size_t i = 0; i < mp->n_metadata_props; i++)
		if (!strncmp(mp->metadata_props[i]->key, "tern.", 5)) {
			fprintf(f, "%-12s ", annotations++ ? "" : "annotations");
			print_name(f, mp->metadata_props[i]->key, 0);
			fputc('\n', f);
		}
}

tern_status tern_model_stats(tern_model *model, char **out, size_t *size)
{
	*out = NULL;
	*size = 0;
	struct census c = {0};
	count_graph(&c, model->graph, false);
	if (c.failed) {
		free(c.ops);
		return tern_errorf(TERN_EOS, "%s: out of memory", model->source);
	}
	qsort(c.ops, c.n_ops, sizeof *c.ops, by_count);

	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		free(c.ops);
		return tern_errorf(TERN_EOS, "%s: out of memory", model->source);
	}
	print_header(f, model);
	fprintf(f, "%-12s %zu", "nodes", c.nodes);
	if (c.subgraph_nodes)
		fprintf(f, " (%zu in subgraphs)", c.subgraph_nodes);
	fputc('\n', f);
	for (size_t i = 0; i < c.n_ops; i++)
		print_entry(f, c.ops[i].domain, c.ops[i].op_type, c.ops[i].count, "");
	fprintf(f, "%-12s %lld in %zu initializers, %lld bytes\n", "parameters", (long long)c.parameters,
	        c.initializers, (long long)c.bytes);
	print_values(f, "inputs", model->graph->inputs, model->graph->n_inputs, true);
	print_values(f, "outputs", model->graph->outputs, model->graph->n_outputs, false);
	print_footer(f, model);
	free(c.ops);
	if (fclose(f) != 0) {
		free(buf);
		return tern_errorf(TERN_EOS, "%s: out of memory", model->source);
	}
	*out = buf;
	*size = len;
	return TERN_OK;
}
