/* external.c — tensors whose bytes live outside the protobuf: mapping them at load, and the model
 * writer that puts tensors in a data file beside the model (or inlines them) on save.
 *
 * At load every TensorProto with data_location EXTERNAL gets raw_data pointing into a read-only
 * mapping of its data file, and keeps its location, so that the rest of the library reads it like any
 * raw tensor (plans use it in place) and the writer knows where it came from. Mapped bytes are never
 * freed by protobuf-c: every free of a proto message goes through tern_pb_allocator, which leaves
 * pointers into a live mapping alone. A model's mappings are released when the model is freed. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- mappings */

struct tern_mapping {
	char *path; /* the file as opened (base folder + location) */
	dev_t dev;
	ino_t ino;
	unsigned char *addr;
	size_t len;
};

/* Live mappings of every model, for the allocator below: few (one per data file), so a list. */
static struct {
	pthread_mutex_t lock;
	const struct tern_mapping **items;
	size_t n, cap;
} live = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool in_live_mapping(const void *p)
{
	const unsigned char *c = p;
	bool found = false;
	pthread_mutex_lock(&live.lock);
	for (size_t i = 0; i < live.n && !found; i++)
		found = c >= live.items[i]->addr && c < live.items[i]->addr + live.items[i]->len;
	pthread_mutex_unlock(&live.lock);
	return found;
}

void tern_mapped_release(const void *p, size_t n)
{
	if (n && in_live_mapping(p))
		tern_pages_release(p, n);
}

void tern_pages_release(const void *p, size_t n)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
	uintptr_t hi = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void *pb_alloc(void *data, size_t size)
{
	(void)data;
	return malloc(size);
}

static void pb_free(void *data, void *p)
{
	(void)data;
	if (p && !in_live_mapping(p))
		free(p);
}

ProtobufCAllocator tern_pb_allocator = {pb_alloc, pb_free, NULL};

void *tern_pb_copy(const void *message)
{
	const ProtobufCMessage *m = message;
	size_t size = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return NULL;
	protobuf_c_message_pack(m, buf);
	ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, &tern_pb_allocator, size, buf);
	free(buf);
	return copy;
}

static bool register_live(const struct tern_mapping *mp)
{
	pthread_mutex_lock(&live.lock);
	bool ok = tern_grow((void **)&live.items, &live.cap, live.n + 1, sizeof *live.items);
	if (ok)
		live.items[live.n++] = mp;
	pthread_mutex_unlock(&live.lock);
	return ok;
}

static void unregister_live(const struct tern_mapping *mp)
{
	pthread_mutex_lock(&live.lock);
	for (size_t i = 0; i < live.n; i++)
		if (live.items[i] == mp) {
			live.items[i] = live.items[--live.n];
			break;
		}
	pthread_mutex_unlock(&live.lock);
}

void tern_model_unmap(tern_model *m)
{
	for (size_t i = 0; i < m->n_mappings; i++) {
		struct tern_mapping *mp = m->mappings[i];
		unregister_live(mp);
		if (mp->addr)
			munmap(mp->addr, mp->len);
		free(mp->path);
		free(mp);
	}
	free(m->mappings);
	m->mappings = NULL;
	m->n_mappings = 0;
}

/* The mapping of the data file at path, made on first use. */
static tern_status map_file(tern_model *m, const char *path, const char *what, const struct tern_mapping **out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': cannot open external data '%s': %s", m->source, what,
		                   path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		int err = errno;
		close(fd);
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data '%s' is not a regular file%s%s", m->source,
		                   what, path, err ? ": " : "", err ? strerror(err) : "");
	}
	for (size_t i = 0; i < m->n_mappings; i++)
		if (m->mappings[i]->dev == sb.st_dev && m->mappings[i]->ino == sb.st_ino) {
			close(fd);
			*out = m->mappings[i];
			return TERN_OK;
		}
	struct tern_mapping *mp = calloc(1, sizeof *mp);
	size_t cap = m->n_mappings;
	if (!mp || !(mp->path = tern_strdup(path)) ||
	    !tern_grow((void **)&m->mappings, &cap, m->n_mappings + 1, sizeof *m->mappings)) {
		close(fd);
		if (mp)
			free(mp->path);
		free(mp);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	mp->dev = sb.st_dev;
	mp->ino = sb.st_ino;
	mp->len = (size_t)sb.st_size;
	if (mp->len) {
		void *a = mmap(NULL, mp->len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (a == MAP_FAILED) {
			int err = errno;
			close(fd);
			free(mp->path);
			free(mp);
			return tern_errorf(TERN_EOS, "%s: tensor '%s': cannot map external data '%s': %s", m->source, what,
			                   path, strerror(err));
		}
		mp->addr = a;
		/* weights are read in order once per run; let the kernel read ahead */
		madvise(a, mp->len, MADV_WILLNEED);
	}
	close(fd);
	if (!register_live(mp)) {
		if (mp->addr)
			munmap(mp->addr, mp->len);
		free(mp->path);
		free(mp);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	m->mappings[m->n_mappings++] = mp;
	*out = mp;
	return TERN_OK;
}

/* ---------------------------------------------------------------- walking every tensor */

typedef tern_status (*tensor_fn)(Onnx__TensorProto *tp, void *ctx);

static tern_status walk_graph(Onnx__GraphProto *g, tensor_fn fn, void *ctx);

static tern_status walk_attrs(Onnx__AttributeProto **attrs, size_t n, tensor_fn fn, void *ctx)
{
	tern_status st = TERN_OK;
	for (size_t i = 0; i < n && !st; i++) {
		Onnx__AttributeProto *a = attrs[i];
		if (a->t)
			st = fn(a->t, ctx);
		for (size_t k = 0; k < a->n_tensors && !st; k++)
			st = fn(a->tensors[k], ctx);
		if (a->sparse_tensor && !st) {
			if (a->sparse_tensor->values)
				st = fn(a->sparse_tensor->values, ctx);
			if (a->sparse_tensor->indices && !st)
				st = fn(a->sparse_tensor->indices, ctx);
		}
		for (size_t k = 0; k < a->n_sparse_tensors && !st; k++) {
			Onnx__SparseTensorProto *s = a->sparse_tensors[k];
			if (s->values)
				st = fn(s->values, ctx);
			if (s->indices && !st)
				st = fn(s->indices, ctx);
		}
		if (a->g && !st)
			st = walk_graph(a->g, fn, ctx);
		for (size_t k = 0; k < a->n_graphs && !st; k++)
			st = walk_graph(a->graphs[k], fn, ctx);
	}
	return st;
}

static tern_status walk_nodes(Onnx__NodeProto **nodes, size_t n, tensor_fn fn, void *ctx)
{
	tern_status st = TERN_OK;
	for (size_t i = 0; i < n && !st; i++)
		st = walk_attrs(nodes[i]->attribute, nodes[i]->n_attribute, fn, ctx);
	return st;
}

static tern_status walk_graph(Onnx__GraphProto *g, tensor_fn fn, void *ctx)
{
	if (!g)
		return TERN_OK;
	tern_status st = TERN_OK;
	for (size_t i = 0; i < g->n_initializer && !st; i++)
		st = fn(g->initializer[i], ctx);
	for (size_t i = 0; i < g->n_sparse_initializer && !st; i++) {
		Onnx__SparseTensorProto *s = g->sparse_initializer[i];
		if (s->values)
			st = fn(s->values, ctx);
		if (s->indices && !st)
			st = fn(s->indices, ctx);
	}
	if (!st)
		st = walk_nodes(g->node, g->n_node, fn, ctx);
	return st;
}

static tern_status walk_model(Onnx__ModelProto *mp, tensor_fn fn, void *ctx)
{
	tern_status st = walk_graph(mp->graph, fn, ctx);
	for (size_t i = 0; i < mp->n_functions && !st; i++)
		st = walk_nodes(mp->functions[i]->node, mp->functions[i]->n_node, fn, ctx);
	for (size_t i = 0; i < mp->n_training_info && !st; i++) {
		st = walk_graph(mp->training_info[i]->initialization, fn, ctx);
		if (!st)
			st = walk_graph(mp->training_info[i]->algorithm, fn, ctx);
	}
	return st;
}

/* ---------------------------------------------------------------- load */

static bool is_external(const Onnx__TensorProto *tp)
{
	return tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* Bytes of a tensor's elements from its type and shape; false when unknown or absurd. */
static bool tensor_bytes(const Onnx__TensorProto *tp, size_t *out)
{
	int dtype = tp->has_data_type ? tp->data_type : 0;
	if (dtype <= 0 || dtype >= TERN_DTYPE_COUNT || dtype == TERN_STRING || tp->n_dims > TERN_MAX_RANK)
		return false;
	uint64_t n = 1;
	for (size_t i = 0; i < tp->n_dims; i++) {
		if (tp->dims[i] < 0 || (tp->dims[i] && n > UINT64_MAX / (uint64_t)tp->dims[i]))
			return false;
		n *= (uint64_t)tp->dims[i];
	}
	size_t es = tern_dtype_size(dtype);
	if (n > SIZE_MAX / es)
		return false;
	*out = (size_t)(n * es);
	return true;
}

struct resolve_ctx {
	tern_model *m;
	size_t mapped; /* bytes of tensors now in mappings */
	size_t tensors;
};

static tern_status parse_location(const Onnx__TensorProto *tp, const char *src, const char *what,
                                  const char **location, long long *offset, long long *length)
{
	*location = NULL;
	*offset = 0;
	*length = -1;
	for (size_t i = 0; i < tp->n_external_data; i++) {
		const Onnx__StringStringEntryProto *e = tp->external_data[i];
		if (!e->key || !e->value)
			continue;
		char *end = NULL;
		if (strcmp(e->key, "location") == 0) {
			*location = e->value;
		} else if (strcmp(e->key, "offset") == 0 || strcmp(e->key, "length") == 0) {
			errno = 0;
			long long v = strtoll(e->value, &end, 10);
			if (errno || end == e->value || *end || v < 0)
				return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data %s '%s' is not a byte count",
				                   src, what, e->key, e->value);
			*(e->key[0] == 'o' ? offset : length) = v;
		}
	}
	if (!*location || !**location)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data without a location", src, what);
	if ((*location)[0] == '/' || strstr(*location, ".."))
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data location '%s' leaves the model's folder", src,
		                   what, *location);
	return TERN_OK;
}

static tern_status resolve_one(Onnx__TensorProto *tp, void *vctx)
{
	struct resolve_ctx *c = vctx;
	if (!is_external(tp))
		return TERN_OK;
	const char *what = tp->name && *tp->name ? tp->name : "(unnamed)";
	const char *src = c->m->source;
	if (tp->has_data_type && tp->data_type == TERN_STRING)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external string data is not supported", src, what);
	size_t nbytes;
	if (!tensor_bytes(tp, &nbytes))
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data of an unknown type or shape", src, what);
	const char *location;
	long long offset, length;
	tern_status st = parse_location(tp, src, what, &location, &offset, &length);
	if (st)
		return st;
	if (length >= 0 && (size_t)length != nbytes)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data length %lld, its shape needs %zu bytes", src,
		                   what, length, nbytes);
	char path[PATH_MAX];
	const char *base = c->m->base_dir && *c->m->base_dir ? c->m->base_dir : ".";
	if ((size_t)snprintf(path, sizeof path, "%s/%s", base, location) >= sizeof path)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data path too long", src, what);
	const struct tern_mapping *mp = NULL;
	if ((st = map_file(c->m, path, what, &mp)))
		return st;
	if ((unsigned long long)offset > mp->len || nbytes > mp->len - (size_t)offset)
		return tern_errorf(TERN_EDATA, "%s: tensor '%s': external data '%s' has %zu bytes, the tensor needs %zu at offset %lld",
		                   src, what, path, mp->len, nbytes, offset);
	/* a tensor that holds both (not valid ONNX) is taken from where its location says */
	if (tp->has_raw_data && tp->raw_data.data)
		tern_pb_allocator.free(NULL, tp->raw_data.data);
	tp->has_raw_data = 1;
	tp->raw_data.data = nbytes ? mp->addr + offset : NULL;
	tp->raw_data.len = nbytes;
	c->mapped += nbytes;
	c->tensors++;
	return TERN_OK;
}

tern_status tern_model_map_external(tern_model *m)
{
	struct resolve_ctx c = {m, 0, 0};
	tern_status st = walk_model(m->proto, resolve_one, &c);
	m->external_bytes = c.mapped;
	return st;
}

bool tern_tensor_proto_mapped(const Onnx__TensorProto *tp)
{
	return is_external(tp) && tp->has_raw_data;
}

size_t tern_model_external_bytes(const tern_model *m)
{
	return m->external_bytes;
}

/* ---------------------------------------------------------------- save */

/* The largest message protobuf's readers accept (a signed 32-bit length). */
#define PROTOBUF_LIMIT ((size_t)INT32_MAX)
/* With no data file asked for, a model over the limit moves tensors of at least this size out (as
 * onnx's convert_model_to_external_data does by default). */
#define SPILL_THRESHOLD 1024
#define DATA_ALIGN 64

/* A tensor's state before the writer touched it, to put back afterwards. */
struct saved {
	Onnx__TensorProto *tp;
	protobuf_c_boolean has_raw_data, has_data_location;
	ProtobufCBinaryData raw;
	int data_location;
	Onnx__StringStringEntryProto **ext;
	size_t n_ext;
	int external; /* goes to the data file */
	uint64_t offset;
	Onnx__StringStringEntryProto entries[3];
	Onnx__StringStringEntryProto *entry_ptrs[3];
	char offset_s[24], length_s[24];
};

struct save_ctx {
	const tern_save_options *o;
	int data_file; /* a data file may be written */
	size_t threshold; /* SIZE_MAX: none by size */
	struct saved **items; /* each on its own: the tensors point into them while they are written */
	size_t n, cap;
	uint64_t data_size;
	const char *location;
};

/* Tensors kept in typed fields (float_data, int64_data, ...) are turned into raw bytes before they
 * can go to a data file; tern writes raw_data itself, so this is for models from other writers. */
static tern_status make_raw(Onnx__TensorProto *tp)
{
	tern_tensor t;
	tern_status st = tern_tensor_from_proto(tp, NULL, tp->name, &t);
	if (st)
		return st;
	uint8_t *bytes = malloc(t.nbytes ? t.nbytes : 1);
	if (!bytes) {
		tern_tensor_free(&t);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	if (t.nbytes)
		memcpy(bytes, t.data, t.nbytes);
	tern_tensor_free(&t);
	free(tp->float_data), tp->float_data = NULL, tp->n_float_data = 0;
	free(tp->int32_data), tp->int32_data = NULL, tp->n_int32_data = 0;
	free(tp->int64_data), tp->int64_data = NULL, tp->n_int64_data = 0;
	free(tp->double_data), tp->double_data = NULL, tp->n_double_data = 0;
	free(tp->uint64_data), tp->uint64_data = NULL, tp->n_uint64_data = 0;
	tp->has_raw_data = 1;
	tp->raw_data.data = bytes;
	tp->raw_data.len = t.nbytes;
	return TERN_OK;
}

static tern_status choose_one(Onnx__TensorProto *tp, void *vctx)
{
	struct save_ctx *c = vctx;
	size_t nbytes = 0;
	bool typed = tensor_bytes(tp, &nbytes);
	/* from a data file: mapped at load, or raw bytes in memory that keep (or were given) an external
	 * location — a trained parameter, the optimizer state of one */
	bool from_external = tern_tensor_proto_mapped(tp) || (is_external(tp) && tp->has_raw_data);
	bool out = c->data_file && typed && !c->o->inline_all &&
	           (from_external || (c->threshold != SIZE_MAX && nbytes >= c->threshold));
	if (!out && !from_external)
		return TERN_OK;
	if (out && !tp->has_raw_data) {
		tern_status st = make_raw(tp);
		if (st)
			return st;
	}
	if (out && tp->raw_data.len != nbytes)
		return tern_errorf(TERN_EDATA, "tensor '%s': raw_data has %zu bytes, its shape needs %zu",
		                   tp->name ? tp->name : "", tp->raw_data.len, nbytes);
	struct saved *s = calloc(1, sizeof *s);
	if (!s || !tern_grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items)) {
		free(s);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	c->items[c->n++] = s;
	s->tp = tp;
	s->has_raw_data = tp->has_raw_data;
	s->raw = tp->raw_data;
	s->has_data_location = tp->has_data_location;
	s->data_location = tp->data_location;
	s->ext = tp->external_data;
	s->n_ext = tp->n_external_data;
	s->external = out;
	if (out) {
		c->data_size = (c->data_size + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
		s->offset = c->data_size;
		c->data_size += nbytes;
		snprintf(s->offset_s, sizeof s->offset_s, "%llu", (unsigned long long)s->offset);
		snprintf(s->length_s, sizeof s->length_s, "%zu", nbytes);
		const char *keys[3] = {"location", "offset", "length"};
		const char *vals[3] = {c->location, s->offset_s, s->length_s};
		for (int k = 0; k < 3; k++) {
			onnx__string_string_entry_proto__init(&s->entries[k]);
			s->entries[k].key = (char *)keys[k];
			s->entries[k].value = (char *)vals[k];
			s->entry_ptrs[k] = &s->entries[k];
		}
		tp->has_raw_data = 0;
		tp->raw_data.data = NULL;
		tp->raw_data.len = 0;
		tp->has_data_location = 1;
		tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
		tp->external_data = s->entry_ptrs;
		tp->n_external_data = 3;
	} else {
		/* mapped, written inline: the raw bytes stand in the message, the location goes */
		tp->has_data_location = 0;
		tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
		tp->external_data = NULL;
		tp->n_external_data = 0;
	}
	return TERN_OK;
}

static void restore(struct save_ctx *c)
{
	for (size_t i = c->n; i-- > 0;) {
		struct saved *s = c->items[i];
		s->tp->has_raw_data = s->has_raw_data;
		s->tp->raw_data = s->raw;
		s->tp->has_data_location = s->has_data_location;
		s->tp->data_location = s->data_location;
		s->tp->external_data = s->ext;
		s->tp->n_external_data = s->n_ext;
		free(s);
	}
	free(c->items);
	c->items = NULL;
	c->n = c->cap = 0;
	c->data_size = 0;
}

struct file_buffer {
	ProtobufCBuffer base;
	FILE *f;
	int failed;
};

static void file_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
	struct file_buffer *fb = (struct file_buffer *)b;
	if (!fb->failed && len && fwrite(data, 1, len, fb->f) != len)
		fb->failed = 1;
}

static tern_status write_data(struct save_ctx *c, FILE *f, const char *data_name)
{
	static const uint8_t zeros[DATA_ALIGN];
	uint64_t at = 0;
	for (size_t i = 0; i < c->n; i++) {
		const struct saved *s = c->items[i];
		if (!s->external)
			continue;
		if (s->offset > at && fwrite(zeros, 1, (size_t)(s->offset - at), f) != s->offset - at)
			goto failed;
		if (s->raw.len && fwrite(s->raw.data, 1, s->raw.len, f) != s->raw.len)
			goto failed;
		tern_mapped_release(s->raw.data, s->raw.len); /* written: its pages can go */
		at = s->offset + s->raw.len;
	}
	return TERN_OK;
failed:
	return tern_errorf(TERN_EIO, "%s: write failed: %s", data_name, strerror(errno));
}

tern_status tern_model_write(tern_model *m, FILE *model_out, FILE *data_out, const char *data_name,
                             const char *location, const tern_save_options *opts, int *wrote_data)
{
	static const tern_save_options defaults = {.external_threshold = -1};
	const tern_save_options *o = opts ? opts : &defaults;
	if (wrote_data)
		*wrote_data = 0;
	tern_status st = tern_model_sync(m);
	if (st)
		return st;
	struct save_ctx c = {o, data_out != NULL, o->external_threshold < 0 ? SIZE_MAX : (size_t)o->external_threshold};
	c.location = location;
	st = walk_model(m->proto, choose_one, &c);
	size_t size = st ? 0 : onnx__model_proto__get_packed_size(m->proto);
	if (!st && size > PROTOBUF_LIMIT && data_out && !o->inline_all && c.threshold > SPILL_THRESHOLD) {
		/* too big for one protobuf: everything but small tensors goes to the data file */
		restore(&c);
		c.threshold = SPILL_THRESHOLD;
		st = walk_model(m->proto, choose_one, &c);
		size = st ? 0 : onnx__model_proto__get_packed_size(m->proto);
	}
	if (!st && size > PROTOBUF_LIMIT) {
		if (!data_out)
			st = tern_errorf(TERN_EUSAGE,
			                 "%s: the model is %.2f GB, over protobuf's 2 GB limit for one file; write it "
			                 "with -o FILE, which puts the tensors in FILE.data",
			                 m->source, (double)size / 1e9);
		else
			st = tern_errorf(TERN_EUSAGE, "%s: the model is %.2f GB, over protobuf's 2 GB limit for one file%s",
			                 m->source, (double)size / 1e9,
			                 o->inline_all ? "; drop --inline to put its tensors in a data file" : "");
	}
	if (!st && data_out && c.data_size) {
		st = write_data(&c, data_out, data_name);
		if (!st && wrote_data)
			*wrote_data = 1;
	}
	if (!st) {
		struct file_buffer fb = {{file_append}, model_out, 0};
		onnx__model_proto__pack_to_buffer(m->proto, &fb.base);
		if (fb.failed)
			st = tern_errorf(TERN_EIO, "write failed: %s", strerror(errno));
	}
	restore(&c);
	return st;
}
