/* tensorfile.c — tensors in files: NumPy .npy (versions 1.0 to 3.0) and ONNX TensorProto .pb.
 * Readers take untrusted bytes: every length is checked before it is used. */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* ---------------------------------------------------------------- npy dtypes */

/* The npy type code ("f4", "i8", "b1") of each dtype that NumPy has. */
static const struct {
	int dtype;
	char kind;
	int size;
} npy_types[] = {
        {TERN_FLOAT16, 'f', 2},   {TERN_FLOAT, 'f', 4},       {TERN_DOUBLE, 'f', 8}, {TERN_INT8, 'i', 1},
        {TERN_INT16, 'i', 2},     {TERN_INT32, 'i', 4},       {TERN_INT64, 'i', 8},  {TERN_UINT8, 'u', 1},
        {TERN_UINT16, 'u', 2},    {TERN_UINT32, 'u', 4},      {TERN_UINT64, 'u', 8}, {TERN_BOOL, 'b', 1},
        {TERN_COMPLEX64, 'c', 8}, {TERN_COMPLEX128, 'c', 16},
};

static bool host_is_little_endian(void)
{
	const uint16_t one = 1;
	uint8_t first;
	memcpy(&first, &one, 1);
	return first == 1;
}

/* Parses a descr such as "<f4", "|b1" or ">i8". Sets *swap when the file's byte order is not the
 * host's. */
static tern_status npy_parse_descr(const char *descr, const char *what, int *dtype, bool *swap)
{
	char order = descr[0];
	if (order != '<' && order != '>' && order != '|' && order != '=')
		return tern_errorf(TERN_EDATA, "%s: dtype '%s' has no byte order ('<', '>', '|' or '=')", what, descr);
	char kind = descr[1];
	if (kind == '?' && descr[2] == '\0')
		kind = 'b';
	else if (kind == 'O')
		return tern_errorf(TERN_EDATA, "%s: object arrays (dtype '%s') are not tensors; save a numeric array",
		                   what, descr);
	else if (kind == 'U' || kind == 'S' || kind == 'a')
		return tern_errorf(TERN_EDATA, "%s: string arrays (dtype '%s') are not supported in .npy files", what,
		                   descr);
	int size = 1;
	if (descr[1] != '?') {
		char *end;
		errno = 0;
		long v = descr[2] >= '0' && descr[2] <= '9' ? strtol(descr + 2, &end, 10) : -1;
		if (v <= 0 || v > 16 || errno || *end)
			return tern_errorf(TERN_EDATA, "%s: dtype '%s' is not a NumPy type code", what, descr);
		size = (int)v;
	}
	*dtype = TERN_UNDEFINED;
	for (size_t i = 0; i < TERN_ARRAY_LEN(npy_types); i++)
		if (npy_types[i].kind == kind && npy_types[i].size == size)
			*dtype = npy_types[i].dtype;
	if (*dtype == TERN_UNDEFINED)
		return tern_errorf(TERN_EDATA, "%s: dtype '%s' is not supported (f2 f4 f8 i1-i8 u1-u8 b1 c8 c16 are)",
		                   what, descr);
	if (order == '|' && size > 1)
		return tern_errorf(TERN_EDATA, "%s: dtype '%s' needs a byte order, '|' is for one-byte types", what,
		                   descr);
	*swap = (order == '<' && !host_is_little_endian()) || (order == '>' && host_is_little_endian());
	return TERN_OK;
}

/* ---------------------------------------------------------------- npy header */

/* The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
 * This reads exactly that subset: quoted strings, True/False, and tuples of integers. */
typedef struct header_reader {
	const char *start, *p, *end;
	const char *what;
} header_reader;

static void skip_space(header_reader *r)
{
	while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
		r->p++;
}

static bool accept(header_reader *r, char c)
{
	skip_space(r);
	if (r->p < r->end && *r->p == c) {
		r->p++;
		return true;
	}
	return false;
}

static tern_status header_error(header_reader *r, const char *expected)
{
	return tern_errorf(TERN_EDATA, "%s: malformed .npy header: expected %s at header byte %td", r->what, expected,
	                   r->p - r->start);
}

static tern_status read_quoted(header_reader *r, char *buf, size_t size)
{
	skip_space(r);
	if (r->p >= r->end || (*r->p != '\'' && *r->p != '"'))
		return header_error(r, "a quoted string");
	char quote = *r->p++;
	size_t n = 0;
	while (r->p < r->end && *r->p != quote) {
		if (n + 1 >= size)
			return tern_errorf(TERN_EDATA, "%s: malformed .npy header: string too long", r->what);
		buf[n++] = *r->p++;
	}
	if (r->p >= r->end)
		return tern_errorf(TERN_EDATA, "%s: malformed .npy header: unterminated string", r->what);
	r->p++;
	buf[n] = '\0';
	return TERN_OK;
}

static bool accept_word(header_reader *r, const char *word)
{
	skip_space(r);
	size_t n = strlen(word);
	if ((size_t)(r->end - r->p) >= n && memcmp(r->p, word, n) == 0) {
		r->p += n;
		return true;
	}
	return false;
}

static tern_status read_shape(header_reader *r, int *rank, int64_t *dims)
{
	if (!accept(r, '('))
		return header_error(r, "'(' starting the shape");
	*rank = 0;
	for (;;) {
		if (accept(r, ')'))
			return TERN_OK;
		skip_space(r);
		if (r->p >= r->end || *r->p < '0' || *r->p > '9')
			return header_error(r, "a non-negative integer in the shape");
		int64_t v = 0;
		while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
			if (v > (INT64_MAX - 9) / 10)
				return tern_errorf(TERN_EDATA, "%s: malformed .npy header: dimension too large",
				                   r->what);
			v = v * 10 + (*r->p++ - '0');
		}
		if (r->p < r->end && *r->p == 'L') /* Python 2 long */
			r->p++;
		if (*rank == TERN_MAX_RANK)
			return tern_errorf(TERN_EDATA, "%s: shape has more than %d dimensions", r->what, TERN_MAX_RANK);
		dims[(*rank)++] = v;
		if (!accept(r, ',')) {
			if (!accept(r, ')'))
				return header_error(r, "',' or ')' in the shape");
			return TERN_OK;
		}
	}
}

typedef struct npy_header {
	int dtype;
	bool swap;
	bool fortran_order;
	int rank;
	int64_t dims[TERN_MAX_RANK];
} npy_header;

static tern_status parse_header(const char *text, size_t len, const char *what, npy_header *h)
{
	header_reader r = {text, text, text + len, what};
	char key[32], descr[32] = "";
	bool have_descr = false, have_order = false, have_shape = false;
	tern_status st;
	if (!accept(&r, '{'))
		return header_error(&r, "'{'");
	while (!accept(&r, '}')) {
		if ((st = read_quoted(&r, key, sizeof key)))
			return st;
		if (!accept(&r, ':'))
			return header_error(&r, "':'");
		if (strcmp(key, "descr") == 0) {
			skip_space(&r);
			if (r.p < r.end && *r.p == '[')
				return tern_errorf(TERN_EDATA, "%s: structured arrays are not supported", what);
			if ((st = read_quoted(&r, descr, sizeof descr)))
				return st;
			have_descr = true;
		} else if (strcmp(key, "fortran_order") == 0) {
			if (accept_word(&r, "True"))
				h->fortran_order = true;
			else if (accept_word(&r, "False"))
				h->fortran_order = false;
			else
				return header_error(&r, "True or False for fortran_order");
			have_order = true;
		} else if (strcmp(key, "shape") == 0) {
			if ((st = read_shape(&r, &h->rank, h->dims)))
				return st;
			have_shape = true;
		} else {
			return tern_errorf(TERN_EDATA, "%s: malformed .npy header: unexpected key '%s'", what, key);
		}
		if (!accept(&r, ',')) {
			if (!accept(&r, '}'))
				return header_error(&r, "',' or '}'");
			break;
		}
	}
	if (!have_descr || !have_order || !have_shape)
		return tern_errorf(TERN_EDATA, "%s: malformed .npy header: missing '%s'", what,
		                   !have_descr           ? "descr"
		                           : !have_order ? "fortran_order"
		                                         : "shape");
	return npy_parse_descr(descr, what, &h->dtype, &h->swap);
}

/* ---------------------------------------------------------------- npy read */

static void swap_bytes(uint8_t *data, size_t n_units, size_t unit)
{
	for (size_t i = 0; i < n_units; i++, data += unit)
		for (size_t a = 0, b = unit - 1; a < b; a++, b--) {
			uint8_t t = data[a];
			data[a] = data[b];
			data[b] = t;
		}
}

/* Fortran (column-major) data into the tensor's row-major storage. */
static void fortran_to_c(const uint8_t *src, tern_tensor *t)
{
	size_t es = tern_dtype_size(t->dtype);
	int64_t n = tern_tensor_numel(t);
	int64_t idx[TERN_MAX_RANK] = {0};
	uint8_t *dst = t->data;
	for (int64_t i = 0; i < n; i++) {
		int64_t off = 0, stride = 1;
		for (int k = 0; k < t->rank; k++) {
			off += idx[k] * stride;
			stride *= t->dims[k];
		}
		memcpy(dst + (size_t)i * es, src + (size_t)off * es, es);
		for (int k = t->rank - 1; k >= 0; k--) {
			if (++idx[k] < t->dims[k])
				break;
			idx[k] = 0;
		}
	}
}

static uint32_t read_le(const uint8_t *p, int n)
{
	uint32_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

tern_status tern_tensor_read_npy(const void *bytes, size_t size, const char *what, tern_tensor *out)
{
	const uint8_t *b = bytes;
	memset(out, 0, sizeof *out);
	if (!what)
		what = ".npy data";
	if (size < 10 || memcmp(b, npy_magic, sizeof npy_magic) != 0)
		return tern_errorf(TERN_EDATA, "%s: not a .npy file (no \\x93NUMPY magic)", what);
	int major = b[6], minor = b[7];
	if (major < 1 || major > 3 || minor != 0)
		return tern_errorf(TERN_EDATA, "%s: .npy version %d.%d is not supported (1.0, 2.0 and 3.0 are)", what,
		                   major, minor);
	size_t len_bytes = major == 1 ? 2 : 4;
	if (size < 8 + len_bytes)
		return tern_errorf(TERN_EDATA, "%s: .npy file ends inside its header length", what);
	size_t header_len = read_le(b + 8, (int)len_bytes);
	size_t data_off = 8 + len_bytes;
	if (header_len > size - data_off)
		return tern_errorf(TERN_EDATA, "%s: .npy header of %zu bytes runs past the end of the file (%zu bytes)",
		                   what, header_len, size);
	npy_header h = {0};
	tern_status st = parse_header((const char *)b + data_off, header_len, what, &h);
	if (st)
		return st;
	data_off += header_len;
	/* Check the size against the file before allocating, so a forged shape cannot ask for memory. */
	size_t have = size - data_off, need = tern_dtype_size(h.dtype);
	bool overflow = false;
	for (int i = 0; i < h.rank; i++) {
		if (h.dims[i] && need > SIZE_MAX / (size_t)h.dims[i])
			overflow = true;
		need *= (size_t)h.dims[i];
	}
	char shape[160];
	tern_shape_str(h.dtype, h.rank, h.dims, shape, sizeof shape);
	if (overflow && need)
		return tern_errorf(TERN_EDATA, "%s: shape %s is too large", what, shape);
	if (have != need)
		return tern_errorf(TERN_EDATA, "%s: %s needs %zu bytes of data, the file has %zu", what, shape, need,
		                   have);
	st = tern_tensor_alloc(out, h.dtype, h.rank, h.dims);
	if (st)
		return tern_error_prefix(st, what);
	if (out->nbytes) {
		if (h.fortran_order && out->rank > 1)
			fortran_to_c(b + data_off, out);
		else
			memcpy(out->data, b + data_off, out->nbytes);
		if (h.swap) {
			size_t unit = tern_dtype_size(out->dtype);
			if (out->dtype == TERN_COMPLEX64 || out->dtype == TERN_COMPLEX128)
				unit /= 2;
			swap_bytes(out->data, out->nbytes / unit, unit);
		}
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- npy write */

static const char *npy_code(int dtype, char *buf)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(npy_types); i++)
		if (npy_types[i].dtype == dtype) {
			char order = npy_types[i].size == 1 ? '|' : host_is_little_endian() ? '<' : '>';
			snprintf(buf, 8, "%c%c%d", order, npy_types[i].kind, npy_types[i].size);
			return buf;
		}
	return NULL;
}

tern_status tern_tensor_write_npy(FILE *f, const tern_tensor *t)
{
	char code[8];
	if (!npy_code(t->dtype, code))
		return tern_errorf(TERN_EDATA, "%s tensors have no .npy type; write a .pb file instead",
		                   tern_dtype_name(t->dtype));
	char dict[64 + TERN_MAX_RANK * 22];
	int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", code);
	for (int i = 0; i < t->rank; i++)
		n += snprintf(dict + n, sizeof dict - (size_t)n, i ? " %lld," : "%lld,", (long long)t->dims[i]);
	if (t->rank > 1)
		n--; /* NumPy writes (3,) for one dimension and (2, 3) for more */
	n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
	/* Laid out as NumPy (1.24 and later) lays it out, so that files compare byte for byte: room for
	 * the first dimension to grow to 21 digits, then spaces and a newline that end the header on a
	 * multiple of 64 bytes (at least one space, a whole 64 when already aligned). */
	size_t growth = 0;
	if (t->rank > 0) {
		char digits[24];
		growth = 21 - (size_t)snprintf(digits, sizeof digits, "%lld", (long long)t->dims[0]);
	}
	size_t unpadded = (size_t)n + growth + 1;
	size_t header_len = unpadded + 64 - (10 + unpadded) % 64;
	uint8_t prefix[10];
	memcpy(prefix, npy_magic, sizeof npy_magic);
	prefix[6] = 1;
	prefix[7] = 0;
	prefix[8] = (uint8_t)(header_len & 0xff);
	prefix[9] = (uint8_t)(header_len >> 8);
	char pad[64 + 21];
	memset(pad, ' ', sizeof pad);
	size_t n_pad = header_len - (size_t)n - 1;
	if (fwrite(prefix, 1, sizeof prefix, f) != sizeof prefix || fwrite(dict, 1, (size_t)n, f) != (size_t)n ||
	    fwrite(pad, 1, n_pad, f) != n_pad || fputc('\n', f) == EOF ||
	    (t->nbytes && fwrite(t->data, 1, t->nbytes, f) != t->nbytes))
		return tern_errorf(TERN_EIO, "write failed: %s", strerror(errno));
	return TERN_OK;
}

/* ---------------------------------------------------------------- TensorProto */

static tern_status read_pb_in(const void *bytes, size_t size, const char *what, const char *base_dir, tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	if (!what)
		what = "TensorProto data";
	if (size == 0)
		return tern_errorf(TERN_EDATA, "%s: empty file, not a tensor", what);
	Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, size, bytes);
	if (!tp)
		return tern_errorf(TERN_EDATA, "%s: neither a .npy file nor an ONNX TensorProto", what);
	tern_status st;
	if (!tp->has_data_type)
		st = tern_errorf(TERN_EDATA, "%s: TensorProto has no data_type; not a tensor file", what);
	else
		st = tern_tensor_from_proto(tp, base_dir, tp->name && *tp->name ? tp->name : what, out);
	if (st && tp->name && *tp->name)
		tern_error_prefix(st, what);
	onnx__tensor_proto__free_unpacked(tp, NULL);
	return st;
}

tern_status tern_tensor_read_pb(const void *bytes, size_t size, const char *what, tern_tensor *out)
{
	return read_pb_in(bytes, size, what, NULL, out);
}

tern_status tern_tensor_write_pb(FILE *f, const tern_tensor *t)
{
	Onnx__TensorProto *tp = malloc(sizeof *tp);
	if (!tp)
		return tern_errorf(TERN_EOS, "out of memory");
	onnx__tensor_proto__init(tp);
	tern_status st = tern_tensor_to_proto(t, tp);
	uint8_t *buf = NULL;
	size_t n = 0;
	if (!st) {
		n = onnx__tensor_proto__get_packed_size(tp);
		buf = tern_xmalloc(n);
		if (!buf)
			st = tern_errorf(TERN_EOS, "out of memory packing a %zu-byte tensor", n);
	}
	if (!st) {
		onnx__tensor_proto__pack(tp, buf);
		if (fwrite(buf, 1, n, f) != n)
			st = tern_errorf(TERN_EIO, "write failed: %s", strerror(errno));
	}
	free(buf);
	onnx__tensor_proto__free_unpacked(tp, NULL);
	return st;
}

/* ---------------------------------------------------------------- SequenceProto, OptionalProto */

static tern_status from_sequence_proto(const Onnx__SequenceProto *sp, const char *what, tern_tensor *out)
{
	if (sp->has_elem_type && sp->elem_type != ONNX__SEQUENCE_PROTO__DATA_TYPE__TENSOR &&
	    !(sp->elem_type == ONNX__SEQUENCE_PROTO__DATA_TYPE__UNDEFINED && !sp->n_sequence_values && !sp->n_map_values))
		return tern_errorf(TERN_EDATA, "%s: a sequence of sequences, maps or optionals is not supported", what);
	int elem = sp->n_tensor_values && sp->tensor_values[0]->has_data_type ? sp->tensor_values[0]->data_type : 0;
	tern_status st = tern_sequence_new(out, elem);
	for (size_t i = 0; !st && i < sp->n_tensor_values; i++) {
		tern_tensor t;
		st = tern_tensor_from_proto(sp->tensor_values[i], NULL, what, &t);
		if (!st) {
			st = tern_sequence_insert(out, &t, -1);
			tern_tensor_free(&t);
		}
	}
	if (st)
		tern_tensor_free(out);
	return st;
}

static tern_status from_optional_proto(const Onnx__OptionalProto *op, const char *what, tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	if (op->tensor_value)
		return tern_tensor_from_proto(op->tensor_value, NULL, what, out);
	if (op->sequence_value)
		return from_sequence_proto(op->sequence_value, what, out);
	if (op->sparse_tensor_value || op->map_value || op->optional_value)
		return tern_errorf(TERN_EDATA, "%s: an optional sparse tensor, map or optional is not supported", what);
	out->dtype = TERN_NONE;
	return TERN_OK;
}

tern_status tern_value_read_pb(const void *bytes, size_t size, int kind, const char *what, tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	if (!what)
		what = "protobuf data";
	if (kind != TERN_SEQUENCE && kind != TERN_NONE)
		return tern_tensor_read_pb(bytes, size, what, out);
	tern_status st;
	if (kind == TERN_SEQUENCE) {
		Onnx__SequenceProto *sp = onnx__sequence_proto__unpack(NULL, size, bytes);
		if (!sp)
			return tern_errorf(TERN_EDATA, "%s: not an ONNX SequenceProto", what);
		st = from_sequence_proto(sp, what, out);
		onnx__sequence_proto__free_unpacked(sp, NULL);
	} else {
		Onnx__OptionalProto *op = onnx__optional_proto__unpack(NULL, size, bytes);
		if (!op)
			return tern_errorf(TERN_EDATA, "%s: not an ONNX OptionalProto", what);
		st = from_optional_proto(op, what, out);
		onnx__optional_proto__free_unpacked(op, NULL);
	}
	return st;
}

/* A folder of tensor files 0.npy (or 0.pb), 1.npy, ... as a sequence, in that order. */
static tern_status read_sequence_folder(const char *path, tern_tensor *out)
{
	tern_status st = tern_sequence_new(out, TERN_UNDEFINED);
	for (int i = 0; !st; i++) {
		char file[PATH_MAX];
		struct stat sb;
		snprintf(file, sizeof file, "%s/%d.npy", path, i);
		if (stat(file, &sb) != 0) {
			snprintf(file, sizeof file, "%s/%d.pb", path, i);
			if (stat(file, &sb) != 0)
				break;
		}
		tern_tensor t;
		st = tern_tensor_read_file(file, &t);
		if (!st) {
			st = tern_sequence_insert(out, &t, -1);
			if (st)
				tern_error_prefix(st, file);
			tern_tensor_free(&t);
		}
	}
	if (st)
		tern_tensor_free(out);
	return st;
}

tern_status tern_value_read_file(const char *path, int kind, tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	struct stat sb;
	bool folder = strcmp(path, "-") != 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
	if (folder && (kind == TERN_SEQUENCE || kind == TERN_NONE))
		return read_sequence_folder(path, out);
	if (kind != TERN_SEQUENCE && kind != TERN_NONE)
		return tern_tensor_read_file(path, out);
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f)
		return tern_errorf(TERN_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
	uint8_t *bytes;
	size_t size;
	tern_status st = tern_read_stream(f, path, &bytes, &size);
	if (f != stdin)
		fclose(f);
	if (st)
		return st;
	if (kind == TERN_NONE && size >= sizeof npy_magic && memcmp(bytes, npy_magic, sizeof npy_magic) == 0)
		st = tern_tensor_read_npy(bytes, size, path, out); /* an optional holding a tensor */
	else
		st = tern_value_read_pb(bytes, size, kind, path, out);
	free(bytes);
	return st;
}

tern_status tern_value_write(const char *path, const tern_tensor *v, const char *ext)
{
	if (v->dtype == TERN_NONE)
		return TERN_OK;
	if (v->dtype != TERN_SEQUENCE) {
		char file[PATH_MAX];
		snprintf(file, sizeof file, "%s.%s", path, ext);
		return tern_tensor_write_file(file, v);
	}
	if (mkdir(path, 0777) != 0 && errno != EEXIST)
		return tern_errorf(TERN_EIO, "%s: cannot create the folder: %s", path, strerror(errno));
	const tern_sequence *q = v->data;
	for (size_t i = 0; i < q->n; i++) {
		char file[PATH_MAX];
		snprintf(file, sizeof file, "%s/%zu.%s", path, i, ext);
		tern_status st = tern_tensor_write_file(file, &q->items[i]);
		if (st)
			return st;
	}
	return TERN_OK;
}

/* ---------------------------------------------------------------- files */

tern_status tern_tensor_read_file(const char *path, tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	bool from_stdin = strcmp(path, "-") == 0;
	const char *name = from_stdin ? "standard input" : path;
	FILE *f = from_stdin ? stdin : fopen(path, "rb");
	if (!f)
		return tern_errorf(TERN_ENOINPUT, "%s: cannot open: %s", path, strerror(errno));
	struct stat sb;
	if (!from_stdin && fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
		fclose(f);
		return tern_errorf(TERN_ENOINPUT, "%s: is a folder, not a tensor file", path);
	}
	uint8_t *bytes;
	size_t size;
	tern_status st = tern_read_stream(f, name, &bytes, &size);
	if (!from_stdin)
		fclose(f);
	if (st)
		return st;
	if (size >= sizeof npy_magic && memcmp(bytes, npy_magic, sizeof npy_magic) == 0) {
		st = tern_tensor_read_npy(bytes, size, name, out);
	} else {
		char dir[PATH_MAX] = ".";
		const char *slash = from_stdin ? NULL : strrchr(path, '/');
		if (slash)
			snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) ? (int)(slash - path) : 1, path);
		st = read_pb_in(bytes, size, name, dir, out);
	}
	free(bytes);
	return st;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Writes to a temporary file next to path and renames it, so a failure leaves nothing behind and a
 * reader never sees half a tensor. */
tern_status tern_tensor_write_file(const char *path, const tern_tensor *t)
{
	tern_status (*write)(FILE *, const tern_tensor *);
	if (has_suffix(path, ".npy"))
		write = tern_tensor_write_npy;
	else if (has_suffix(path, ".pb"))
		write = tern_tensor_write_pb;
	else
		return tern_errorf(TERN_EUSAGE, "%s: cannot tell the tensor format; name the file .npy or .pb", path);
	/* A hidden name beside the target, on the same file system so that rename is atomic. */
	size_t n = strlen(path);
	const char *slash = strrchr(path, '/');
	int dir_len = slash ? (int)(slash - path + 1) : 0;
	char *tmp = tern_xmalloc(n + 9);
	if (!tmp)
		return tern_errorf(TERN_EOS, "out of memory");
	snprintf(tmp, n + 9, "%.*s.%s.XXXXXX", dir_len, path, path + dir_len);
	int fd = mkstemp(tmp);
	if (fd < 0) {
		tern_status st = tern_errorf(TERN_EIO, "%s: cannot create: %s", path, strerror(errno));
		free(tmp);
		return st;
	}
	FILE *f = fdopen(fd, "wb");
	if (!f) {
		close(fd);
		unlink(tmp);
		free(tmp);
		return tern_errorf(TERN_EOS, "%s: fdopen failed: %s", path, strerror(errno));
	}
	/* mkstemp makes the file 0600; a tensor file is as readable as any other the user writes. */
	mode_t mask = umask(0);
	umask(mask);
	fchmod(fd, 0666 & ~mask);
	tern_status st = write(f, t);
	if (fclose(f) != 0 && !st)
		st = tern_errorf(TERN_EIO, "write failed: %s", strerror(errno));
	if (!st && rename(tmp, path) != 0)
		st = tern_errorf(TERN_EIO, "cannot rename %s: %s", tmp, strerror(errno));
	if (st) {
		unlink(tmp);
		if (strncmp(tern_error(), path, n) != 0)
			tern_error_prefix(st, path);
	}
	free(tmp);
	return st;
}
