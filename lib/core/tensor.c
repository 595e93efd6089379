/* tensor.c — dtypes, dense tensors, and conversion to and from ONNX TensorProto. */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

static const struct {
	const char *name;
	size_t size;
} dtype_info[TERN_DTYPE_COUNT] = {
        [TERN_UNDEFINED] = {"undefined", 0},
        [TERN_FLOAT] = {"float", 4},
        [TERN_UINT8] = {"uint8", 1},
        [TERN_INT8] = {"int8", 1},
        [TERN_UINT16] = {"uint16", 2},
        [TERN_INT16] = {"int16", 2},
        [TERN_INT32] = {"int32", 4},
        [TERN_INT64] = {"int64", 8},
        [TERN_STRING] = {"string", 0},
        [TERN_BOOL] = {"bool", 1},
        [TERN_FLOAT16] = {"float16", 2},
        [TERN_DOUBLE] = {"double", 8},
        [TERN_UINT32] = {"uint32", 4},
        [TERN_UINT64] = {"uint64", 8},
        [TERN_COMPLEX64] = {"complex64", 8},
        [TERN_COMPLEX128] = {"complex128", 16},
        [TERN_BFLOAT16] = {"bfloat16", 2},
        [TERN_FLOAT8E4M3FN] = {"float8e4m3fn", 1},
        [TERN_FLOAT8E4M3FNUZ] = {"float8e4m3fnuz", 1},
        [TERN_FLOAT8E5M2] = {"float8e5m2", 1},
        [TERN_FLOAT8E5M2FNUZ] = {"float8e5m2fnuz", 1},
};

size_t tern_dtype_size(int dtype)
{
	return dtype > 0 && dtype < TERN_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

const char *tern_dtype_name(int dtype)
{
	/* element types only: TERN_SEQUENCE and TERN_NONE are not (the text syntax prints this name) */
	return dtype >= 0 && dtype < TERN_DTYPE_COUNT && dtype_info[dtype].name ? dtype_info[dtype].name : "?";
}

int tern_dtype_from_name(const char *name)
{
	for (int i = 1; i < TERN_DTYPE_COUNT; i++)
		if (dtype_info[i].name && strcmp(dtype_info[i].name, name) == 0)
			return i;
	return TERN_UNDEFINED;
}

int64_t tern_numel(int rank, const int64_t *dims)
{
	int64_t n = 1;
	for (int i = 0; i < rank; i++)
		n *= dims[i];
	return n;
}

static bool size_of(int dtype, int rank, const int64_t *dims, size_t *nbytes)
{
	size_t n = 1;
	for (int i = 0; i < rank; i++) {
		if (dims[i] < 0)
			return false;
		if (dims[i] && n > SIZE_MAX / (size_t)dims[i])
			return false;
		n *= (size_t)dims[i];
	}
	size_t es = dtype == TERN_STRING ? sizeof(char *) : tern_dtype_size(dtype);
	if (es && n > SIZE_MAX / es / 2)
		return false;
	*nbytes = n * es;
	return true;
}

void tern_set_shape(tern_tensor *t, int dtype, int rank, const int64_t *dims)
{
	t->dtype = dtype;
	t->rank = rank;
	for (int i = 0; i < rank; i++)
		t->dims[i] = dims[i];
}

static tern_status tensor_alloc(tern_tensor *t, int dtype, int rank, const int64_t *dims, bool zero);

tern_status tern_tensor_alloc(tern_tensor *t, int dtype, int rank, const int64_t *dims)
{
	return tensor_alloc(t, dtype, rank, dims, true);
}

tern_status tern_tensor_alloc_uninit(tern_tensor *t, int dtype, int rank, const int64_t *dims)
{
	/* strings and sequences hold pointers, which must start NULL */
	return tensor_alloc(t, dtype, rank, dims, dtype == TERN_STRING || dtype == TERN_SEQUENCE);
}

static tern_status tensor_alloc(tern_tensor *t, int dtype, int rank, const int64_t *dims, bool zero)
{
	if (rank < 0 || rank > TERN_MAX_RANK)
		return tern_errorf(TERN_EDATA, "rank %d is out of range (0..%d)", rank, TERN_MAX_RANK);
	size_t nbytes;
	if (!size_of(dtype, rank, dims, &nbytes))
		return tern_errorf(TERN_EDATA, "tensor shape is negative or too large");
	if (nbytes > ((size_t)1 << 40))
		return tern_errorf(TERN_EDATA, "tensor of %zu bytes is too large", nbytes);
	void *p = zero ? tern_aligned_alloc(nbytes) : tern_aligned_alloc_uninit(nbytes);
	if (!p)
		return tern_errorf(TERN_EOS, "out of memory allocating %zu bytes", nbytes);
	char *name = t->name;
	memset(t, 0, sizeof *t);
	t->name = name;
	tern_set_shape(t, dtype, rank, dims);
	t->data = p;
	t->nbytes = nbytes;
	t->owns_data = 1;
	return TERN_OK;
}

void tern_tensor_free(tern_tensor *t)
{
	if (t->owns_data && t->data && t->dtype == TERN_SEQUENCE) {
		tern_sequence *q = t->data;
		for (size_t i = 0; i < q->n; i++)
			tern_tensor_free(&q->items[i]);
		free(q->items);
		free(q);
		t->data = NULL;
	}
	if (t->owns_data && t->data) {
		if (t->dtype == TERN_STRING) {
			char **s = t->data;
			int64_t n = tern_tensor_numel(t);
			for (int64_t i = 0; i < n; i++)
				free(s[i]);
		}
		free(t->data);
	}
	free(t->name);
	memset(t, 0, sizeof *t);
}

tern_status tern_tensor_copy(tern_tensor *dst, const tern_tensor *src)
{
	memset(dst, 0, sizeof *dst);
	if (src->dtype == TERN_NONE) {
		dst->dtype = TERN_NONE;
		return src->name && !(dst->name = tern_strdup(src->name)) ? tern_errorf(TERN_EOS, "out of memory") : TERN_OK;
	}
	if (src->dtype == TERN_SEQUENCE) {
		const tern_sequence *q = src->data;
		tern_status st = tern_sequence_new(dst, q ? q->elem_dtype : TERN_UNDEFINED);
		for (size_t i = 0; !st && q && i < q->n; i++)
			st = tern_sequence_insert(dst, &q->items[i], -1);
		if (!st && src->name && !(dst->name = tern_strdup(src->name)))
			st = tern_errorf(TERN_EOS, "out of memory");
		if (st)
			tern_tensor_free(dst);
		return st;
	}
	tern_status st = tern_tensor_alloc(dst, src->dtype, src->rank, src->dims);
	if (st)
		return st;
	if (src->dtype == TERN_STRING) {
		const char *const *s = src->data;
		char **d = dst->data;
		for (int64_t i = 0; i < tern_tensor_numel(src); i++)
			if (s[i] && !(d[i] = tern_strdup(s[i]))) {
				tern_tensor_free(dst);
				return tern_errorf(TERN_EOS, "out of memory");
			}
	} else if (src->nbytes) {
		memcpy(dst->data, src->data, src->nbytes);
	}
	if (src->name && !(dst->name = tern_strdup(src->name))) {
		tern_tensor_free(dst);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	return TERN_OK;
}

tern_sequence *tern_sequence_of(const tern_tensor *t)
{
	return t && t->dtype == TERN_SEQUENCE ? t->data : NULL;
}

tern_status tern_sequence_new(tern_tensor *t, int elem_dtype)
{
	tern_sequence *q = calloc(1, sizeof *q);
	if (!q)
		return tern_errorf(TERN_EOS, "out of memory");
	q->elem_dtype = elem_dtype;
	char *name = t->name;
	memset(t, 0, sizeof *t);
	t->name = name;
	t->dtype = TERN_SEQUENCE;
	t->data = q;
	t->owns_data = 1;
	return TERN_OK;
}

tern_status tern_sequence_insert(tern_tensor *seq, const tern_tensor *item, int64_t pos)
{
	tern_sequence *q = tern_sequence_of(seq);
	if (!q)
		return tern_errorf(TERN_EINTERNAL, "not a sequence");
	if (item->dtype == TERN_SEQUENCE || item->dtype == TERN_NONE)
		return tern_errorf(TERN_EDATA, "a sequence holds tensors, not %s",
		                   item->dtype == TERN_SEQUENCE ? "a sequence" : "an empty optional");
	if (q->elem_dtype && item->dtype != q->elem_dtype)
		return tern_errorf(TERN_EDATA, "a sequence of %s cannot hold a %s tensor", tern_dtype_name(q->elem_dtype),
		                   tern_dtype_name(item->dtype));
	if (pos < 0)
		pos = (int64_t)q->n;
	if ((size_t)pos > q->n)
		return tern_errorf(TERN_EDATA, "position %lld is outside a sequence of %zu", (long long)pos, q->n);
	if (!tern_grow((void **)&q->items, &q->cap, q->n + 1, sizeof *q->items))
		return tern_errorf(TERN_EOS, "out of memory");
	tern_tensor copy;
	tern_status st = tern_tensor_copy(&copy, item);
	if (st)
		return st;
	free(copy.name);
	copy.name = NULL;
	memmove(&q->items[pos + 1], &q->items[pos], (q->n - (size_t)pos) * sizeof *q->items);
	q->items[pos] = copy;
	q->n++;
	q->elem_dtype = item->dtype;
	return TERN_OK;
}

const char *tern_shape_str(int dtype, int rank, const int64_t *dims, char *buf, size_t size)
{
	if (dtype == TERN_SEQUENCE || dtype == TERN_NONE) {
		snprintf(buf, size, "%s", dtype == TERN_SEQUENCE ? "seq" : "none");
		return buf;
	}
	size_t n = (size_t)snprintf(buf, size, "%s[", tern_dtype_name(dtype));
	for (int i = 0; i < rank && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)dims[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
	return buf;
}

double tern_tensor_get_f64(const tern_tensor *t, int64_t i)
{
	const void *d = t->data;
	switch (t->dtype) {
	case TERN_FLOAT: return ((const float *)d)[i];
	case TERN_DOUBLE: return ((const double *)d)[i];
	case TERN_FLOAT16: return tern_f16_to_f32(((const uint16_t *)d)[i]);
	case TERN_BFLOAT16: return tern_bf16_to_f32(((const uint16_t *)d)[i]);
	case TERN_INT8: return ((const int8_t *)d)[i];
	case TERN_INT16: return ((const int16_t *)d)[i];
	case TERN_INT32: return ((const int32_t *)d)[i];
	case TERN_INT64: return (double)((const int64_t *)d)[i];
	case TERN_UINT8:
	case TERN_BOOL: return ((const uint8_t *)d)[i];
	case TERN_UINT16: return ((const uint16_t *)d)[i];
	case TERN_UINT32: return ((const uint32_t *)d)[i];
	case TERN_UINT64: return (double)((const uint64_t *)d)[i];
	default: return 0;
	}
}

int64_t tern_tensor_get_i64(const tern_tensor *t, int64_t i)
{
	const void *d = t->data;
	switch (t->dtype) {
	case TERN_INT8: return ((const int8_t *)d)[i];
	case TERN_INT16: return ((const int16_t *)d)[i];
	case TERN_INT32: return ((const int32_t *)d)[i];
	case TERN_INT64: return ((const int64_t *)d)[i];
	case TERN_UINT8:
	case TERN_BOOL: return ((const uint8_t *)d)[i];
	case TERN_UINT16: return ((const uint16_t *)d)[i];
	case TERN_UINT32: return ((const uint32_t *)d)[i];
	case TERN_UINT64: return (int64_t)((const uint64_t *)d)[i];
	default: return (int64_t)tern_tensor_get_f64(t, i);
	}
}

/* ---------------------------------------------------------------- TensorProto */

static tern_status read_external(const Onnx__TensorProto *tp, const char *base_dir, const char *what, size_t nbytes,
                                 void *dst)
{
	const char *location = NULL;
	long long offset = 0, length = -1;
	for (size_t i = 0; i < tp->n_external_data; i++) {
		const Onnx__StringStringEntryProto *e = tp->external_data[i];
		if (!e->key || !e->value)
			continue;
		if (strcmp(e->key, "location") == 0)
			location = e->value;
		else if (strcmp(e->key, "offset") == 0)
			offset = strtoll(e->value, NULL, 10);
		else if (strcmp(e->key, "length") == 0)
			length = strtoll(e->value, NULL, 10);
	}
	if (!location || !*location)
		return tern_errorf(TERN_EDATA, "tensor '%s': external data without a location", what);
	if (location[0] == '/' || strstr(location, ".."))
		return tern_errorf(TERN_EDATA, "tensor '%s': external data location '%s' leaves the model's folder",
		                   what, location);
	if (offset < 0 || (length >= 0 && (size_t)length != nbytes))
		return tern_errorf(TERN_EDATA, "tensor '%s': external data offset/length do not fit its shape", what);
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/%s", base_dir && *base_dir ? base_dir : ".", location);
	FILE *f = fopen(path, "rb");
	if (!f)
		return tern_errorf(TERN_EDATA, "tensor '%s': cannot open external data '%s': %s", what, path,
		                   strerror(errno));
	tern_status st = TERN_OK;
	if (fseeko(f, offset, SEEK_SET) != 0 || fread(dst, 1, nbytes, f) != nbytes)
		st = tern_errorf(TERN_EDATA, "tensor '%s': external data '%s' is shorter than %zu bytes at offset %lld",
		                 what, path, nbytes, offset);
	fclose(f);
	return st;
}

/* Weights stored as raw little-endian bytes (what exporters write), or mapped from external data,
 * are used where they lie in the loaded model rather than copied: a plan adds no second copy of the
 * parameters. */
bool tern_tensor_view_proto(const Onnx__TensorProto *tp, tern_tensor *t)
{
	int dtype = tp->has_data_type ? tp->data_type : 0;
	/* mapped external data is raw too; a tensor at an odd offset of its file is copied (aligned) */
	if (!tp->has_raw_data || dtype == TERN_STRING || dtype <= 0 || dtype >= TERN_DTYPE_COUNT ||
	    tp->n_dims > TERN_MAX_RANK || ((uintptr_t)tp->raw_data.data & 15))
		return false;
	memset(t, 0, sizeof *t);
	t->dtype = dtype;
	t->rank = (int)tp->n_dims;
	for (size_t i = 0; i < tp->n_dims; i++) {
		if (tp->dims[i] < 0)
			return false;
		t->dims[i] = tp->dims[i];
	}
	if ((uint64_t)tern_tensor_numel(t) * tern_dtype_size(dtype) != tp->raw_data.len)
		return false;
	t->data = tp->raw_data.data;
	t->nbytes = tp->raw_data.len;
	return true;
}

/* Copies n elements from a typed repeated field into dst of `dtype`. */
static void unpack_int32_field(const int32_t *src, int dtype, size_t n, void *dst)
{
	for (size_t i = 0; i < n; i++) {
		switch (dtype) {
		case TERN_INT8: ((int8_t *)dst)[i] = (int8_t)src[i]; break;
		case TERN_UINT8:
		case TERN_BOOL:
		case TERN_FLOAT8E4M3FN:
		case TERN_FLOAT8E4M3FNUZ:
		case TERN_FLOAT8E5M2:
		case TERN_FLOAT8E5M2FNUZ: ((uint8_t *)dst)[i] = (uint8_t)src[i]; break;
		case TERN_INT16: ((int16_t *)dst)[i] = (int16_t)src[i]; break;
		case TERN_UINT16:
		case TERN_FLOAT16:
		case TERN_BFLOAT16: ((uint16_t *)dst)[i] = (uint16_t)src[i]; break;
		default: ((int32_t *)dst)[i] = src[i]; break;
		}
	}
}

/* The elements a proto holds inline, by the field its type uses. */
static size_t stored_values(const Onnx__TensorProto *tp, int dtype)
{
	switch (dtype) {
	case TERN_STRING: return tp->n_string_data;
	case TERN_FLOAT: return tp->n_float_data;
	case TERN_COMPLEX64: return tp->n_float_data / 2;
	case TERN_DOUBLE: return tp->n_double_data;
	case TERN_COMPLEX128: return tp->n_double_data / 2;
	case TERN_INT64: return tp->n_int64_data;
	case TERN_UINT32:
	case TERN_UINT64: return tp->n_uint64_data;
	default: return tp->n_int32_data;
	}
}

tern_status tern_tensor_from_proto(const Onnx__TensorProto *tp, const char *base_dir, const char *what,
                                   tern_tensor *out)
{
	memset(out, 0, sizeof *out);
	if (!what)
		what = tp->name ? tp->name : "";
	int dtype = tp->has_data_type ? tp->data_type : TERN_UNDEFINED;
	if (dtype <= 0 || dtype >= TERN_DTYPE_COUNT)
		return tern_errorf(TERN_EDATA, "tensor '%s': unknown data type %d", what, dtype);
	if (tp->n_dims > TERN_MAX_RANK)
		return tern_errorf(TERN_EDATA, "tensor '%s': rank %zu exceeds %d", what, tp->n_dims, TERN_MAX_RANK);
	for (size_t i = 0; i < tp->n_dims; i++)
		if (tp->dims[i] < 0)
			return tern_errorf(TERN_EDATA, "tensor '%s': negative dimension %lld", what,
			                   (long long)tp->dims[i]);
	/* the shape checked against the values held inline before anything is allocated: bytes that are
	 * not a TensorProto (another message's) may decode as one with any dimensions */
	bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL &&
	                !tp->has_raw_data;
	size_t need = 1, es = tern_dtype_size(dtype);
	for (size_t i = 0; i < tp->n_dims; i++) {
		if (tp->dims[i] && need > SIZE_MAX / 16 / (size_t)tp->dims[i])
			return tern_errorf(TERN_EDATA, "tensor '%s': its shape holds more elements than memory can", what);
		need *= (size_t)tp->dims[i];
	}
	if (!external && tp->has_raw_data && dtype != TERN_STRING && tp->raw_data.len != need * es)
		return tern_errorf(TERN_EDATA, "tensor '%s': raw_data has %zu bytes, its shape needs %zu", what,
		                   tp->raw_data.len, need * es);
	if (!external && (!tp->has_raw_data || dtype == TERN_STRING) && stored_values(tp, dtype) != need)
		return tern_errorf(TERN_EDATA, dtype == TERN_STRING ? "tensor '%s': %zu strings for %zu elements"
		                                                    : "tensor '%s': %zu values stored, its shape needs %zu",
		                   what, stored_values(tp, dtype), need);
	tern_status st = tern_tensor_alloc(out, dtype, (int)tp->n_dims, tp->dims);
	if (st)
		return tern_error_prefix(st, what);
	size_t n = (size_t)tern_tensor_numel(out);
	/* external data a model load has mapped reads as raw_data */
	if (external) {
		if (dtype == TERN_STRING)
			st = tern_errorf(TERN_EDATA, "tensor '%s': external string data is not supported", what);
		else
			st = read_external(tp, base_dir, what, out->nbytes, out->data);
	} else if (dtype == TERN_STRING) {
		char **s = out->data;
		for (size_t i = 0; i < n; i++) {
			s[i] = malloc(tp->string_data[i].len + 1);
			if (!s[i]) {
				st = tern_errorf(TERN_EOS, "out of memory");
				break;
			}
			if (tp->string_data[i].len)
				memcpy(s[i], tp->string_data[i].data, tp->string_data[i].len);
			s[i][tp->string_data[i].len] = '\0';
		}
	} else if (tp->has_raw_data) {
		if (n)
			memcpy(out->data, tp->raw_data.data, out->nbytes);
	} else if (n) {
		/* as many values as the shape needs: checked above */
		switch (dtype) {
		case TERN_FLOAT: memcpy(out->data, tp->float_data, n * 4); break;
		case TERN_COMPLEX64: memcpy(out->data, tp->float_data, n * 8); break;
		case TERN_DOUBLE: memcpy(out->data, tp->double_data, n * 8); break;
		case TERN_COMPLEX128: memcpy(out->data, tp->double_data, n * 16); break;
		case TERN_INT64: memcpy(out->data, tp->int64_data, n * 8); break;
		case TERN_UINT32:
		case TERN_UINT64:
			for (size_t i = 0; i < n; i++) {
				if (dtype == TERN_UINT32)
					((uint32_t *)out->data)[i] = (uint32_t)tp->uint64_data[i];
				else
					((uint64_t *)out->data)[i] = tp->uint64_data[i];
			}
			break;
		default: unpack_int32_field(tp->int32_data, dtype, n, out->data); break;
		}
	}
	if (!st && tp->name && !(out->name = tern_strdup(tp->name)))
		st = tern_errorf(TERN_EOS, "out of memory");
	if (st)
		tern_tensor_free(out);
	return st;
}

tern_status tern_tensor_to_proto(const tern_tensor *t, Onnx__TensorProto *tp)
{
	tp->has_data_type = 1;
	tp->data_type = t->dtype;
	tp->n_dims = (size_t)t->rank;
	tp->dims = t->rank ? malloc(sizeof(int64_t) * (size_t)t->rank) : NULL;
	if (t->rank && !tp->dims)
		return tern_errorf(TERN_EOS, "out of memory");
	for (int i = 0; i < t->rank; i++)
		tp->dims[i] = t->dims[i];
	if (t->name && !(tp->name = tern_strdup(t->name)))
		return tern_errorf(TERN_EOS, "out of memory");
	if (t->dtype == TERN_STRING) {
		size_t n = (size_t)tern_tensor_numel(t);
		tp->string_data = calloc(n ? n : 1, sizeof(ProtobufCBinaryData));
		if (!tp->string_data)
			return tern_errorf(TERN_EOS, "out of memory");
		tp->n_string_data = n;
		char *const *s = t->data;
		for (size_t i = 0; i < n; i++) {
			size_t len = s[i] ? strlen(s[i]) : 0;
			tp->string_data[i].data = malloc(len ? len : 1);
			if (!tp->string_data[i].data)
				return tern_errorf(TERN_EOS, "out of memory");
			if (len)
				memcpy(tp->string_data[i].data, s[i], len);
			tp->string_data[i].len = len;
		}
		return TERN_OK;
	}
	tp->has_raw_data = 1;
	tp->raw_data.len = t->nbytes;
	tp->raw_data.data = malloc(t->nbytes ? t->nbytes : 1);
	if (!tp->raw_data.data)
		return tern_errorf(TERN_EOS, "out of memory");
	if (t->nbytes)
		memcpy(tp->raw_data.data, t->data, t->nbytes);
	return TERN_OK;
}
