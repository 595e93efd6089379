/* test_tensorfile.c — .npy and .pb tensor files: round trips for every dtype, odd shapes, and
 * malformed input that must fail with TERN_EDATA and a message naming the file. */
#include "check.h"
#include "internal.h"

#include <stdlib.h>
#include <unistd.h>

static const int all_dtypes[] = {
        TERN_FLOAT,   TERN_UINT8,  TERN_INT8,   TERN_UINT16, TERN_INT16,     TERN_INT32,      TERN_INT64,    TERN_BOOL,
        TERN_FLOAT16, TERN_DOUBLE, TERN_UINT32, TERN_UINT64, TERN_COMPLEX64, TERN_COMPLEX128, TERN_BFLOAT16,
};

static char tmpdir[] = "/tmp/test_tensorfile.XXXXXX";

static void fill(tern_tensor *t)
{
	uint8_t *b = t->data;
	for (size_t i = 0; i < t->nbytes; i++)
		b[i] = (uint8_t)(i * 37 + 11);
	if (t->dtype == TERN_BOOL)
		for (size_t i = 0; i < t->nbytes; i++)
			b[i] &= 1;
}

static bool same(const tern_tensor *a, const tern_tensor *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes)
		return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0;
}

static void round_trip(int dtype, int rank, const int64_t *dims, const char *ext)
{
	tern_tensor t = {0}, back = {0};
	CHECK_OK(tern_tensor_alloc(&t, dtype, rank, dims));
	fill(&t);
	char path[256];
	snprintf(path, sizeof path, "%s/t_%s_%d%s", tmpdir, tern_dtype_name(dtype), rank, ext);
	bool npy_has_type = dtype != TERN_BFLOAT16;
	tern_status st = tern_tensor_write_file(path, &t);
	if (strcmp(ext, ".npy") == 0 && !npy_has_type) {
		CHECK(st == TERN_EDATA);
		CHECK(strstr(tern_error(), "bfloat16") && strstr(tern_error(), path));
		CHECK(access(path, F_OK) != 0);
	} else {
		CHECK_OK(st);
		CHECK_OK(tern_tensor_read_file(path, &back));
		if (!same(&t, &back))
			fprintf(stderr, "round trip differs: %s\n", path);
		CHECK(same(&t, &back));
	}
	unlink(path);
	tern_tensor_free(&t);
	tern_tensor_free(&back);
}

static void test_round_trips(void)
{
	static const int64_t shapes[][3] = {{0}, {5}, {2, 3}, {2, 0, 4}, {3, 1, 2}};
	static const int ranks[] = {0, 1, 2, 3, 3};
	for (size_t d = 0; d < TERN_ARRAY_LEN(all_dtypes); d++)
		for (size_t s = 0; s < TERN_ARRAY_LEN(shapes); s++) {
			round_trip(all_dtypes[d], ranks[s], shapes[s], ".npy");
			round_trip(all_dtypes[d], ranks[s], shapes[s], ".pb");
		}
}

/* A .npy file from a literal header dict and data bytes, with the usual padding. */
static size_t make_npy(uint8_t *buf, int major, const char *dict, const void *data, size_t nbytes)
{
	size_t len_bytes = major == 1 ? 2 : 4;
	size_t dl = strlen(dict);
	size_t total = (8 + len_bytes + dl + 1 + 63) / 64 * 64;
	size_t hl = total - 8 - len_bytes;
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (uint8_t)major;
	buf[7] = 0;
	for (size_t i = 0; i < len_bytes; i++)
		buf[8 + i] = (uint8_t)(hl >> (8 * i));
	memcpy(buf + 8 + len_bytes, dict, dl);
	memset(buf + 8 + len_bytes + dl, ' ', hl - dl - 1);
	buf[total - 1] = '\n';
	if (nbytes)
		memcpy(buf + total, data, nbytes);
	return total + nbytes;
}

static void test_npy_variants(void)
{
	uint8_t buf[512];
	tern_tensor t = {0};
	const float f[6] = {1, 2, 3, 4, 5, 6};

	for (int major = 1; major <= 3; major++) {
		size_t n = make_npy(buf, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, 24);
		CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
		CHECK(t.dtype == TERN_FLOAT && t.rank == 2 && t.dims[0] == 2 && t.dims[1] == 3);
		CHECK(t.data && ((float *)t.data)[5] == 6);
		tern_tensor_free(&t);
	}

	/* Keys in another order, double quotes, no trailing comma, a Python 2 long. */
	size_t n = make_npy(buf, 1, "{\"shape\": (6L,), \"fortran_order\": False, \"descr\": \"<f4\"}", f, 24);
	CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
	CHECK(t.rank == 1 && t.dims[0] == 6 && ((float *)t.data)[2] == 3);
	tern_tensor_free(&t);

	/* Fortran order: column-major [[1,3,5],[2,4,6]] stored as 1..6. */
	n = make_npy(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f, 24);
	CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
	const float want_c[6] = {1, 3, 5, 2, 4, 6};
	CHECK(t.nbytes == 24 && memcmp(t.data, want_c, 24) == 0);
	tern_tensor_free(&t);

	/* Big-endian int32 is converted. */
	const uint8_t be[8] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};
	n = make_npy(buf, 1, "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", be, 8);
	CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
	CHECK(t.dtype == TERN_INT32 && ((int32_t *)t.data)[0] == 258 && ((int32_t *)t.data)[1] == -2);
	tern_tensor_free(&t);

	/* Big-endian complex64 swaps each float separately. */
	const uint8_t bc[8] = {0x3f, 0x80, 0, 0, 0x40, 0, 0, 0};
	n = make_npy(buf, 1, "{'descr': '>c8', 'fortran_order': False, 'shape': (), }", bc, 8);
	CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
	CHECK(t.dtype == TERN_COMPLEX64 && t.rank == 0 && ((float *)t.data)[0] == 1 && ((float *)t.data)[1] == 2);
	tern_tensor_free(&t);

	const uint8_t bools[3] = {1, 0, 1};
	n = make_npy(buf, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", bools, 3);
	CHECK_OK(tern_tensor_read_npy(buf, n, "v.npy", &t));
	CHECK(t.dtype == TERN_BOOL && ((uint8_t *)t.data)[2] == 1);
	tern_tensor_free(&t);
}

/* What the writer produces must be what NumPy writes for the same array. */
static void test_npy_bytes(void)
{
	tern_tensor t = {0};
	const int64_t dims[2] = {2, 3};
	CHECK_OK(tern_tensor_alloc(&t, TERN_INT64, 2, dims));
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);
	CHECK_OK(tern_tensor_write_npy(f, &t));
	fclose(f);
	const char *want = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }";
	CHECK(size == 128 + 48);
	CHECK(size > 10 + strlen(want) && memcmp(buf + 10, want, strlen(want)) == 0);
	CHECK(buf[8] == 118 && buf[9] == 0 && buf[127] == '\n');
	free(buf);
	tern_tensor_free(&t);

	const int64_t one = 7;
	CHECK_OK(tern_tensor_alloc(&t, TERN_UINT8, 1, &one));
	f = open_memstream(&buf, &size);
	CHECK_OK(tern_tensor_write_npy(f, &t));
	fclose(f);
	want = "{'descr': '|u1', 'fortran_order': False, 'shape': (7,), }";
	CHECK(size == 128 + 7 && memcmp(buf + 10, want, strlen(want)) == 0);
	free(buf);
	tern_tensor_free(&t);
}

static void expect_bad_npy(int major, const char *dict, size_t nbytes, const char *needle)
{
	static uint8_t buf[4096];
	static const uint8_t zeros[64];
	size_t n = make_npy(buf, major, dict, zeros, nbytes);
	tern_tensor t = {0};
	tern_status st = tern_tensor_read_npy(buf, n, "bad.npy", &t);
	CHECK(st == TERN_EDATA);
	if (st != TERN_EDATA || !strstr(tern_error(), "bad.npy") || !strstr(tern_error(), needle))
		fprintf(stderr, "for %s: got (%d) '%s', want '%s'\n", dict, st, tern_error(), needle);
	CHECK(strstr(tern_error(), "bad.npy") && strstr(tern_error(), needle));
	CHECK(t.data == NULL);
}

static void test_npy_malformed(void)
{
	static const struct {
		const char *dict;
		size_t nbytes;
		const char *needle;
	} bad_headers[] = {
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, "needs 24 bytes"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28, "the file has 28"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4000000000, 4000000000, 4000000000), }", 0,
	         "too large"},
	        {"{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", 12, "string arrays"},
	        {"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8, "object arrays"},
	        {"{'descr': '<f3', 'fortran_order': False, 'shape': (1,), }", 3, "not supported"},
	        {"{'descr': 'f4', 'fortran_order': False, 'shape': (1,), }", 4, "byte order"},
	        {"{'descr': '|f4', 'fortran_order': False, 'shape': (1,), }", 4, "needs a byte order"},
	        {"{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,), }", 4, "True or False"},
	        {"{'descr': '<f4', 'shape': (1,), }", 4, "missing 'fortran_order'"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4, "unexpected key"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 4, "non-negative"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }", 4, "more than 8"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2), }", 4, "',' or ')'"},
	        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4, "structured"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ", 4, "quoted string"},
	        {"{'descr': '<f4", 0, "string"},
	        {"['descr']", 0, "'{'"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': 99999999999999999999, }", 0, "'('"},
	        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0, "too large"},
	};
	for (size_t i = 0; i < TERN_ARRAY_LEN(bad_headers); i++)
		expect_bad_npy(1, bad_headers[i].dict, bad_headers[i].nbytes, bad_headers[i].needle);

	/* Broken preambles: truncations at every length must fail cleanly, never read past the end. */
	uint8_t good[256];
	const float f[2] = {1, 2};
	size_t n = make_npy(good, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f, 8);
	for (size_t cut = 0; cut < n; cut++) {
		uint8_t *copy = malloc(cut ? cut : 1);
		memcpy(copy, good, cut);
		tern_tensor t = {0};
		CHECK(tern_tensor_read_npy(copy, cut, "cut.npy", &t) == TERN_EDATA);
		CHECK(strstr(tern_error(), "cut.npy") != NULL);
		free(copy);
	}
	uint8_t bad[256];
	memcpy(bad, good, n);
	bad[6] = 4;
	tern_tensor t = {0};
	CHECK(tern_tensor_read_npy(bad, n, "bad.npy", &t) == TERN_EDATA && strstr(tern_error(), "version 4.0"));
	memcpy(bad, good, n);
	bad[8] = 0xff;
	bad[9] = 0xff;
	CHECK(tern_tensor_read_npy(bad, n, "bad.npy", &t) == TERN_EDATA && strstr(tern_error(), "past the end"));
}

static void test_pb_malformed(void)
{
	tern_tensor t = {0};
	CHECK(tern_tensor_read_pb("", 0, "empty.pb", &t) == TERN_EDATA && strstr(tern_error(), "empty.pb"));
	const char junk[] = "hello, this is text";
	CHECK(tern_tensor_read_pb(junk, sizeof junk - 1, "junk.pb", &t) == TERN_EDATA &&
	      strstr(tern_error(), "junk.pb"));

	/* A float tensor of shape [3] whose raw_data holds 4 bytes. */
	Onnx__TensorProto tp;
	onnx__tensor_proto__init(&tp);
	int64_t dims[1] = {3};
	uint8_t raw[4] = {0};
	tp.has_data_type = 1;
	tp.data_type = TERN_FLOAT;
	tp.n_dims = 1;
	tp.dims = dims;
	tp.has_raw_data = 1;
	tp.raw_data.len = 4;
	tp.raw_data.data = raw;
	tp.name = "x";
	uint8_t buf[64];
	size_t n = onnx__tensor_proto__pack(&tp, buf);
	CHECK(tern_tensor_read_pb(buf, n, "short.pb", &t) == TERN_EDATA);
	CHECK(strstr(tern_error(), "short.pb") && strstr(tern_error(), "raw_data"));
	for (size_t cut = 1; cut < n; cut++) {
		tern_status st = tern_tensor_read_pb(buf, cut, "cut.pb", &t);
		CHECK(st == TERN_EDATA && strstr(tern_error(), "cut.pb"));
		if (st == TERN_OK)
			tern_tensor_free(&t);
	}
}

static void test_files(void)
{
	tern_tensor t = {0};
	char path[256];
	snprintf(path, sizeof path, "%s/missing.npy", tmpdir);
	CHECK(tern_tensor_read_file(path, &t) == TERN_ENOINPUT && strstr(tern_error(), path));

	CHECK(tern_tensor_read_file(tmpdir, &t) == TERN_ENOINPUT && strstr(tern_error(), "folder"));

	const int64_t dims[1] = {4};
	CHECK_OK(tern_tensor_alloc(&t, TERN_FLOAT, 1, dims));
	snprintf(path, sizeof path, "%s/x.txt", tmpdir);
	CHECK(tern_tensor_write_file(path, &t) == TERN_EUSAGE && strstr(tern_error(), path));
	snprintf(path, sizeof path, "%s/no/such/dir/x.npy", tmpdir);
	CHECK(tern_tensor_write_file(path, &t) == TERN_EIO && strstr(tern_error(), path));

	/* The name survives a .pb round trip; a malformed file on disk names its path. */
	t.name = tern_strdup("input.1");
	snprintf(path, sizeof path, "%s/named.pb", tmpdir);
	CHECK_OK(tern_tensor_write_file(path, &t));
	tern_tensor back = {0};
	CHECK_OK(tern_tensor_read_file(path, &back));
	CHECK(back.name && strcmp(back.name, "input.1") == 0);
	tern_tensor_free(&back);
	FILE *f = fopen(path, "wb");
	fputs("\x93NUMPY\x01", f);
	fclose(f);
	CHECK(tern_tensor_read_file(path, &back) == TERN_EDATA && strstr(tern_error(), path));
	unlink(path);
	tern_tensor_free(&t);
}

int main(void)
{
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_round_trips();
	test_npy_variants();
	test_npy_bytes();
	test_npy_malformed();
	test_pb_malformed();
	test_files();
	rmdir(tmpdir);
	return check_report("test_tensorfile");
}
