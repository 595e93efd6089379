/* model.c — loading and saving models (binary ONNX or text, detected), and model metadata. */
#include "internal.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The text syntax starts with its header '<', a comment '#', or a graph name. Binary ModelProto starts
 * with a field tag (0x08 ir_version, 0x12 producer, 0x3a graph, 0x42 opset_import) followed by a varint
 * or a length, so a letter-like tag is followed by a control byte. Text may hold raw control bytes
 * inside strings, so only the opening is looked at. */
static bool looks_like_text(const unsigned char *p, size_t n)
{
	size_t i = 0;
	while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
		i++;
	if (i == n)
		return false;
	if (p[i] == '<' || p[i] == '#')
		return true;
	bool name_start = (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= 'a' && p[i] <= 'z') || p[i] == '_' || p[i] == '"';
	return name_start && i + 1 < n && p[i + 1] >= 0x20 && p[i + 1] < 0x7f;
}

/* ---------------------------------------------------------------- unpacking without a second copy
 *
 * protobuf-c copies every bytes field out of the buffer it unpacks, so a model's weights were held
 * twice while it loaded: the file's bytes and the copies. Instead the large raw_data of the main
 * graph's initializers is cut out of a rebuilt (small) message, which protobuf-c unpacks, and each
 * tensor's bytes are then copied once from the file's mapping, whose pages are given back as soon as
 * they are copied. Anything unexpected in the wire format leaves it to protobuf-c on the whole file. */

#define LEAN_MIN_BYTES 4096 /* raw_data at least this long is cut out */

typedef struct lean_cut {
	size_t tensor;  /* index among the graph's initializers */
	size_t off, len; /* the payload in the file */
} lean_cut;

typedef struct lean_buf {
	uint8_t *p;
	size_t n, cap;
	bool failed;
} lean_buf;

static void lean_put(lean_buf *b, const void *src, size_t n)
{
	if (b->failed || !n)
		return;
	if (!tern_grow((void **)&b->p, &b->cap, b->n + n, 1)) {
		b->failed = true;
		return;
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}

static void lean_varint(lean_buf *b, uint64_t v)
{
	uint8_t t[10];
	size_t n = 0;
	do {
		t[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
		v >>= 7;
	} while (v);
	lean_put(b, t, n);
}

static bool get_varint(const uint8_t *p, size_t end, size_t *pos, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64 && *pos < end; shift += 7) {
		uint8_t c = p[(*pos)++];
		*v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return true;
	}
	return false;
}

/* One field at *pos of [.., end): its number, wire type and extent [*start, *pos); for length-delimited
 * fields the payload is [*data, *data + *len). */
static bool next_field(const uint8_t *p, size_t end, size_t *pos, uint32_t *num, int *wt, size_t *start, size_t *data,
                       size_t *len)
{
	*start = *pos;
	uint64_t key, v;
	if (!get_varint(p, end, pos, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
		return false;
	*num = (uint32_t)(key >> 3);
	*wt = (int)(key & 7);
	switch (*wt) {
	case 0:
		return get_varint(p, end, pos, &v);
	case 1:
		*pos += 8;
		return *pos <= end;
	case 5:
		*pos += 4;
		return *pos <= end;
	case 2:
		if (!get_varint(p, end, pos, &v) || v > end - *pos)
			return false;
		*data = *pos;
		*len = (size_t)v;
		*pos += (size_t)v;
		return true;
	default: /* groups: not in onnx.proto */
		return false;
	}
}

/* The TensorProto at [from, to) without a large raw_data (recorded in cuts), or as it is. */
static bool lean_tensor(const uint8_t *p, size_t from, size_t to, size_t index, lean_buf *out, lean_cut **cuts,
                        size_t *n_cuts, size_t *cap_cuts)
{
	size_t pos = from, start, data = 0, len = 0;
	uint32_t num;
	int wt;
	bool cut = false;
	while (pos < to) {
		if (!next_field(p, to, &pos, &num, &wt, &start, &data, &len))
			return false;
		if (num == 9 && wt == 2 && len >= LEAN_MIN_BYTES && !cut) {
			if (!tern_grow((void **)cuts, cap_cuts, *n_cuts + 1, sizeof **cuts))
				return false;
			(*cuts)[(*n_cuts)++] = (lean_cut){index, data, len};
			cut = true;
			continue;
		}
		if (num == 9 && cut) /* a second raw_data: protobuf-c would keep the last */
			return false;
		lean_put(out, p + start, pos - start);
	}
	return true;
}

/* A field number and length-delimited payload, written. */
static void lean_field(lean_buf *b, uint32_t num, const lean_buf *payload)
{
	lean_varint(b, (uint64_t)num << 3 | 2);
	lean_varint(b, payload->n);
	lean_put(b, payload->p, payload->n);
}

static Onnx__ModelProto *lean_unpack(const uint8_t *p, size_t size, bool release)
{
	lean_buf model = {0}, graph = {0}, tensor = {0};
	lean_cut *cuts = NULL;
	size_t n_cuts = 0, cap_cuts = 0, n_graphs = 0, index = 0;
	bool ok = true;
	size_t pos = 0, start, data = 0, len = 0;
	uint32_t num;
	int wt;
	while (ok && pos < size) {
		if (!(ok = next_field(p, size, &pos, &num, &wt, &start, &data, &len)))
			break;
		if (num != 7 || wt != 2) {
			lean_put(&model, p + start, pos - start);
			continue;
		}
		if (++n_graphs > 1) { /* merged messages: leave them to protobuf-c */
			ok = false;
			break;
		}
		size_t gpos = data, gend = data + len;
		while (ok && gpos < gend) {
			size_t gs, gd = 0, gl = 0;
			uint32_t gn;
			int gw;
			if (!(ok = next_field(p, gend, &gpos, &gn, &gw, &gs, &gd, &gl)))
				break;
			if (gn != 5 || gw != 2) {
				lean_put(&graph, p + gs, gpos - gs);
				continue;
			}
			tensor.n = 0;
			ok = lean_tensor(p, gd, gd + gl, index++, &tensor, &cuts, &n_cuts, &cap_cuts);
			if (ok)
				lean_field(&graph, 5, &tensor);
		}
		if (ok)
			lean_field(&model, 7, &graph);
	}
	Onnx__ModelProto *mp = NULL;
	ok = ok && n_cuts && !model.failed && !graph.failed && !tensor.failed;
	if (ok)
		mp = onnx__model_proto__unpack(NULL, model.n, model.p);
	free(model.p);
	free(graph.p);
	free(tensor.p);
	Onnx__GraphProto *g = mp ? mp->graph : NULL;
	for (size_t i = 0; mp && i < n_cuts; i++) {
		const lean_cut *c = &cuts[i];
		Onnx__TensorProto *tp = g && c->tensor < g->n_initializer ? g->initializer[c->tensor] : NULL;
		void *bytes = tp ? malloc(c->len) : NULL;
		if (!bytes) {
			onnx__model_proto__free_unpacked(mp, NULL);
			mp = NULL;
			break;
		}
		memcpy(bytes, p + c->off, c->len);
		tp->has_raw_data = 1;
		tp->raw_data.data = bytes;
		tp->raw_data.len = c->len;
		if (release) /* the mapping's pages of this tensor, copied: given back */
			tern_pages_release(p + c->off, c->len);
	}
	free(cuts);
	return mp;
}

static tern_model *model_new(const char *source, const char *base_dir)
{
	tern_model *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	m->source = tern_strdup(source ? source : "-");
	m->base_dir = tern_strdup(base_dir ? base_dir : ".");
	if (!m->source || !m->base_dir) {
		free(m->source);
		free(m->base_dir);
		free(m);
		return NULL;
	}
	return m;
}

static tern_status load_bytes(const void *bytes, size_t size, const char *source, const char *base_dir, bool mapped,
                              tern_model **out)
{
	*out = NULL;
	if (!source)
		source = "-";
	if (size == 0)
		return tern_errorf(TERN_EDATA, "%s: empty input (no model)", source);
	tern_model *m = model_new(source, base_dir);
	if (!m)
		return tern_errorf(TERN_EOS, "%s: out of memory", source);
	if (looks_like_text(bytes, size)) {
		tern_status st = tern_text_parse_model(bytes, size, source, &m->proto);
		if (st) {
			tern_model_free(m);
			return tern_error_prefix(st, source);
		}
	} else {
		m->proto = lean_unpack(bytes, size, mapped);
		if (!m->proto)
			m->proto = onnx__model_proto__unpack(NULL, size, bytes);
		if (!m->proto) {
			tern_model_free(m);
			return tern_errorf(TERN_EDATA, "%s: not an ONNX model (the protobuf is malformed or truncated)",
			                   source);
		}
	}
	if (!m->proto->graph) {
		tern_model_free(m);
		return tern_errorf(TERN_EDATA, "%s: the model has no graph", source);
	}
	tern_status st = tern_model_map_external(m);
	if (!st)
		st = tern_model_build_ir(m);
	if (st) {
		tern_model_free(m);
		return st;
	}
	*out = m;
	return TERN_OK;
}

tern_status tern_model_load_bytes(const void *bytes, size_t size, const char *source, const char *base_dir,
                                  tern_model **out)
{
	return load_bytes(bytes, size, source, base_dir, false, out);
}

tern_status tern_model_load(const char *path, tern_model **out)
{
	*out = NULL;
	bool use_stdin = !path || strcmp(path, "-") == 0;
	FILE *f = use_stdin ? stdin : fopen(path, "rb");
	const char *what = use_stdin ? "-" : path;
	if (!f)
		return tern_errorf(TERN_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
	struct stat sb;
	if (!use_stdin && fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
		fclose(f);
		return tern_errorf(TERN_ENOINPUT, "%s: cannot open: it is a directory", path);
	}
	char *dir_copy = tern_strdup(use_stdin ? "." : path);
	if (!dir_copy) {
		if (!use_stdin)
			fclose(f);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	const char *base = use_stdin ? "." : dirname(dir_copy);
	/* A binary model in a regular file is read through a mapping, whose pages lean_unpack gives back
	 * tensor by tensor; anything else is read whole. */
	void *map = MAP_FAILED;
	size_t map_len = 0;
	if (!use_stdin && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
		map_len = (size_t)sb.st_size;
		map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fileno(f), 0);
		if (map != MAP_FAILED && looks_like_text(map, map_len)) {
			munmap(map, map_len);
			map = MAP_FAILED;
		}
	}
	tern_status st;
	if (map != MAP_FAILED) {
		fclose(f);
		st = load_bytes(map, map_len, what, base, true, out);
		munmap(map, map_len);
	} else {
		unsigned char *bytes = NULL;
		size_t size = 0;
		st = tern_read_stream(f, what, &bytes, &size);
		if (!use_stdin)
			fclose(f);
		if (!st)
			st = tern_model_load_bytes(bytes, size, what, base, out);
		free(bytes);
	}
	free(dir_copy);
	return st;
}

void tern_graph_free_ir(tern_graph *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->n_nodes; i++) {
		tern_node *n = g->nodes[i];
		for (size_t s = 0; s < n->n_subgraphs; s++)
			tern_graph_free_ir(n->subgraphs[s]);
		free(n->subgraphs);
		free(n->inputs);
		free(n->outputs);
		free(n->implicit);
		free(n);
	}
	for (size_t i = 0; i < g->n_values; i++) {
		free(g->values[i]->name);
		free(g->values[i]->consumers);
		free(g->values[i]);
	}
	free(g->nodes);
	free(g->values);
	free(g->table);
	free(g->inputs);
	free(g->outputs);
	free(g);
}

void tern_model_free_ir(tern_model *m);
void tern_model_free_ir(tern_model *m)
{
	tern_graph_free_ir(m->graph);
	m->graph = NULL;
	for (size_t i = 0; i < m->n_functions; i++)
		tern_graph_free_ir(m->functions[i]);
	free(m->functions);
	m->functions = NULL;
	m->n_functions = 0;
}

void tern_model_free(tern_model *m)
{
	if (!m)
		return;
	/* Nodes added or removed since the last save are owned by the IR until synced into the protos. A
	 * partly built IR (a load that failed) does not describe the protos: nothing to sync then. */
	if (m->ir_complete)
		tern_model_sync(m);
	tern_model_free_ir(m);
	if (m->proto)
		onnx__model_proto__free_unpacked(m->proto, &tern_pb_allocator);
	tern_model_unmap(m);
	free(m->source);
	free(m->base_dir);
	free(m);
}

tern_status tern_model_save_bytes(tern_model *m, void **out, size_t *size)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return tern_errorf(TERN_EOS, "out of memory");
	tern_status st = tern_model_write(m, f, NULL, NULL, NULL, NULL, NULL);
	if (fclose(f) != 0 && !st)
		st = tern_errorf(TERN_EOS, "out of memory");
	if (st) {
		free(buf);
		return st;
	}
	*out = buf;
	*size = n;
	return TERN_OK;
}

tern_status tern_model_save_text(tern_model *m, int with_weights, char **out, size_t *size)
{
	tern_status st = tern_model_sync(m);
	if (st)
		return st;
	return tern_text_print_model(m->proto, with_weights, out, size);
}

tern_graph *tern_model_graph(tern_model *m)
{
	return m->graph;
}
const char *tern_model_source(const tern_model *m)
{
	return m->source;
}

const char *tern_model_meta(const tern_model *m, const char *key)
{
	for (size_t i = 0; i < m->proto->n_metadata_props; i++) {
		const Onnx__StringStringEntryProto *e = m->proto->metadata_props[i];
		if (e->key && strcmp(e->key, key) == 0)
			return e->value ? e->value : "";
	}
	return NULL;
}

static void remove_meta_at(Onnx__ModelProto *p, size_t i)
{
	onnx__string_string_entry_proto__free_unpacked(p->metadata_props[i], NULL);
	memmove(&p->metadata_props[i], &p->metadata_props[i + 1],
	        (p->n_metadata_props - i - 1) * sizeof p->metadata_props[0]);
	p->n_metadata_props--;
}

tern_status tern_model_set_meta(tern_model *m, const char *key, const char *value)
{
	Onnx__ModelProto *p = m->proto;
	for (size_t i = 0; i < p->n_metadata_props; i++) {
		Onnx__StringStringEntryProto *e = p->metadata_props[i];
		if (!e->key || strcmp(e->key, key) != 0)
			continue;
		if (!value) {
			remove_meta_at(p, i);
			return TERN_OK;
		}
		char *v = tern_strdup(value);
		if (!v)
			return tern_errorf(TERN_EOS, "out of memory");
		if (e->value != protobuf_c_empty_string)
			free(e->value);
		e->value = v;
		return TERN_OK;
	}
	if (!value)
		return TERN_OK;
	Onnx__StringStringEntryProto *e = malloc(sizeof *e);
	Onnx__StringStringEntryProto **arr = realloc(p->metadata_props, (p->n_metadata_props + 1) * sizeof *arr);
	if (!e || !arr) {
		free(e);
		if (arr)
			p->metadata_props = arr;
		return tern_errorf(TERN_EOS, "out of memory");
	}
	p->metadata_props = arr;
	onnx__string_string_entry_proto__init(e);
	e->key = tern_strdup(key);
	e->value = tern_strdup(value);
	if (!e->key || !e->value) {
		free(e->key);
		free(e->value);
		free(e);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	arr[p->n_metadata_props++] = e;
	return TERN_OK;
}

int tern_model_drop_meta_prefix(tern_model *m, const char *prefix)
{
	int dropped = 0;
	size_t len = strlen(prefix);
	for (size_t i = 0; i < m->proto->n_metadata_props;) {
		const char *k = m->proto->metadata_props[i]->key;
		if (k && strncmp(k, prefix, len) == 0) {
			remove_meta_at(m->proto, i);
			dropped++;
		} else {
			i++;
		}
	}
	return dropped;
}

int64_t tern_model_opset(const tern_model *m, const char *domain)
{
	if (!domain || strcmp(domain, "ai.onnx") == 0)
		domain = "";
	for (size_t i = 0; i < m->proto->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = m->proto->opset_import[i];
		const char *d = o->domain && strcmp(o->domain, "ai.onnx") != 0 ? o->domain : "";
		if (strcmp(d, domain) == 0)
			return o->has_version ? o->version : 1;
	}
	return -1;
}

tern_status tern_model_import_opset(tern_model *m, const char *domain, int64_t version)
{
	Onnx__ModelProto *mp = m->proto;
	if (tern_model_opset(m, domain) >= 0)
		return TERN_OK;
	Onnx__OperatorSetIdProto *o = malloc(sizeof *o);
	Onnx__OperatorSetIdProto **arr = realloc(mp->opset_import, (mp->n_opset_import + 1) * sizeof *arr);
	if (arr)
		mp->opset_import = arr;
	if (!o || !arr) {
		free(o);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	onnx__operator_set_id_proto__init(o);
	o->domain = tern_strdup(domain);
	if (!o->domain) {
		free(o);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	o->has_version = 1;
	o->version = version;
	mp->opset_import[mp->n_opset_import++] = o;
	return TERN_OK;
}

int tern_model_num_inputs(tern_model *m)
{
	int n = 0;
	for (size_t i = 0; i < m->graph->n_inputs; i++)
		if (!(m->graph->inputs[i]->flags & TERN_VALUE_INITIALIZER))
			n++;
	return n;
}

static tern_value *user_input(tern_model *m, int index)
{
	for (size_t i = 0; i < m->graph->n_inputs; i++)
		if (!(m->graph->inputs[i]->flags & TERN_VALUE_INITIALIZER) && index-- == 0)
			return m->graph->inputs[i];
	return NULL;
}

int tern_model_input_kind(tern_model *m, int index)
{
	tern_value *v = user_input(m, index);
	const Onnx__GraphProto *gp = m->graph->proto;
	for (size_t i = 0; v && i < gp->n_input; i++) {
		const Onnx__TypeProto *t = gp->input[i]->type;
		if (!gp->input[i]->name || strcmp(gp->input[i]->name, v->name) != 0 || !t)
			continue;
		if (t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE)
			return TERN_SEQUENCE;
		if (t->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE)
			return TERN_NONE;
	}
	return 0;
}

const char *tern_model_input_name(tern_model *m, int index)
{
	tern_value *v = user_input(m, index);
	return v ? v->name : NULL;
}

tern_status tern_model_input_type(tern_model *m, int index, int *dtype, int *rank, int64_t *dims,
                                  const char **dim_params)
{
	tern_value *v = user_input(m, index);
	if (!v)
		return tern_errorf(TERN_EUSAGE, "%s: the graph has no input %d", m->source, index);
	*dtype = v->type.dtype;
	*rank = v->type.rank;
	for (int i = 0; i < v->type.rank && i < TERN_MAX_RANK; i++) {
		dims[i] = v->type.dims[i];
		if (dim_params)
			dim_params[i] = v->type.dim_param[i];
	}
	return TERN_OK;
}
