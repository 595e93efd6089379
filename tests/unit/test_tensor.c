/* test_tensor.c — dtypes, half-precision conversions, tensors and their TensorProto form. */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>

static void test_dtypes(void)
{
	CHECK(tern_dtype_size(TERN_FLOAT) == 4);
	CHECK(tern_dtype_size(TERN_BOOL) == 1);
	CHECK(tern_dtype_size(TERN_COMPLEX128) == 16);
	CHECK(tern_dtype_size(TERN_STRING) == 0);
	CHECK(tern_dtype_size(999) == 0);
	for (int d = 1; d < TERN_DTYPE_COUNT; d++)
		CHECK(tern_dtype_from_name(tern_dtype_name(d)) == d);
	CHECK(tern_dtype_from_name("no-such-type") == TERN_UNDEFINED);
	CHECK(strcmp(tern_dtype_name(-3), "?") == 0);
}

static void test_half(void)
{
	/* Values from the IEEE 754 binary16 tables. */
	CHECK(tern_f32_to_f16(1.0f) == 0x3c00);
	CHECK(tern_f32_to_f16(-2.0f) == 0xc000);
	CHECK(tern_f32_to_f16(65504.0f) == 0x7bff);
	CHECK(tern_f32_to_f16(1e6f) == 0x7c00); /* overflow to infinity */
	CHECK(tern_f32_to_f16(5.9604645e-08f) == 0x0001); /* smallest subnormal */
	CHECK(tern_f32_to_f16(1e-9f) == 0x0000);
	CHECK(tern_f16_to_f32(0x3555) == 0.33325195f);
	CHECK(isnan(tern_f16_to_f32(tern_f32_to_f16(NAN))));
	/* Every finite half survives a round trip through float. */
	int bad = 0;
	for (uint32_t h = 0; h < 0x10000; h++)
		if ((h & 0x7c00) != 0x7c00 && tern_f32_to_f16(tern_f16_to_f32((uint16_t)h)) != h)
			bad++;
	CHECK(bad == 0);
	CHECK(tern_f32_to_bf16(1.0f) == 0x3f80);
	CHECK(tern_bf16_to_f32(0x4049) == 3.140625f);
	CHECK(tern_f32_to_bf16(1.00390625f) == 0x3f80); /* ties to even */
}

static void test_alloc_and_copy(void)
{
	tern_tensor t = {0}, c = {0};
	int64_t dims[2] = {3, 5};
	CHECK_OK(tern_tensor_alloc(&t, TERN_INT32, 2, dims));
	CHECK(t.nbytes == 60 && tern_tensor_numel(&t) == 15);
	CHECK(((uintptr_t)t.data % TERN_ALIGN) == 0);
	for (int i = 0; i < 15; i++)
		((int32_t *)t.data)[i] = i * 7;
	CHECK_OK(tern_tensor_copy(&c, &t));
	CHECK(memcmp(c.data, t.data, 60) == 0 && c.data != t.data);
	char buf[64];
	CHECK(strcmp(tern_shape_str(c.dtype, c.rank, c.dims, buf, sizeof buf), "int32[3,5]") == 0);
	tern_tensor_free(&t);
	tern_tensor_free(&c);
	int64_t neg[1] = {-1};
	CHECK(tern_tensor_alloc(&t, TERN_FLOAT, 1, neg) == TERN_EDATA);
	int64_t huge[3] = {1 << 30, 1 << 30, 1 << 30};
	CHECK(tern_tensor_alloc(&t, TERN_FLOAT, 3, huge) == TERN_EDATA);
}

static void test_proto_round_trip(void)
{
	static const int dtypes[] = {TERN_FLOAT, TERN_DOUBLE,  TERN_INT8,    TERN_INT16,  TERN_INT32,
	                             TERN_INT64, TERN_UINT8,   TERN_UINT16,  TERN_UINT32, TERN_UINT64,
	                             TERN_BOOL,  TERN_FLOAT16, TERN_BFLOAT16};
	for (size_t k = 0; k < TERN_ARRAY_LEN(dtypes); k++) {
		tern_tensor t = {0}, back = {0};
		int64_t dims[3] = {2, 3, 2};
		CHECK_OK(tern_tensor_alloc(&t, dtypes[k], 3, dims));
		unsigned char *p = t.data;
		for (size_t i = 0; i < t.nbytes; i++)
			p[i] = (unsigned char)(i * 37 + k);
		if (dtypes[k] == TERN_BOOL)
			for (size_t i = 0; i < t.nbytes; i++)
				p[i] &= 1;
		Onnx__TensorProto tp;
		onnx__tensor_proto__init(&tp);
		CHECK_OK(tern_tensor_to_proto(&t, &tp));
		/* Pack and unpack, as a file would. */
		size_t n = onnx__tensor_proto__get_packed_size(&tp);
		uint8_t *buf = malloc(n);
		onnx__tensor_proto__pack(&tp, buf);
		Onnx__TensorProto *up = onnx__tensor_proto__unpack(NULL, n, buf);
		CHECK(up != NULL);
		CHECK_OK(tern_tensor_from_proto(up, NULL, "t", &back));
		CHECK(back.dtype == t.dtype && back.rank == 3 && back.dims[1] == 3);
		CHECK(back.nbytes == t.nbytes && memcmp(back.data, t.data, t.nbytes) == 0);
		onnx__tensor_proto__free_unpacked(up, NULL);
		free(buf);
		free(tp.dims);
		free(tp.raw_data.data);
		tern_tensor_free(&t);
		tern_tensor_free(&back);
	}
}

static void test_typed_fields(void)
{
	/* float16 stored in int32_data, as older exporters write it. */
	Onnx__TensorProto tp;
	onnx__tensor_proto__init(&tp);
	int64_t dims[1] = {2};
	int32_t halves[2] = {0x3c00, 0xc000};
	tp.has_data_type = 1;
	tp.data_type = TERN_FLOAT16;
	tp.n_dims = 1;
	tp.dims = dims;
	tp.n_int32_data = 2;
	tp.int32_data = halves;
	tern_tensor t = {0};
	CHECK_OK(tern_tensor_from_proto(&tp, NULL, "h", &t));
	CHECK(tern_tensor_get_f64(&t, 0) == 1.0 && tern_tensor_get_f64(&t, 1) == -2.0);
	tern_tensor_free(&t);
	/* Too few values for the shape is an error naming the tensor. */
	tp.n_int32_data = 1;
	CHECK(tern_tensor_from_proto(&tp, NULL, "h", &t) == TERN_EDATA);
	CHECK(strstr(tern_error(), "'h'") != NULL);
	/* A raw_data length that does not match the shape. */
	tp.n_int32_data = 0;
	tp.has_raw_data = 1;
	uint8_t raw[3] = {0};
	tp.raw_data.data = raw;
	tp.raw_data.len = 3;
	CHECK(tern_tensor_from_proto(&tp, NULL, "h", &t) == TERN_EDATA);
}

static void sum_squares(void *ctx, int64_t i)
{
	int64_t *out = ctx;
	out[i] = i * i;
}

static void test_threadpool(void)
{
	for (int threads = 1; threads <= 3; threads++) {
		tern_threadpool *pool;
		CHECK_OK(tern_threadpool_create(threads, &pool));
		CHECK(tern_threadpool_size(pool) == threads);
		int64_t out[1000];
		for (int round = 0; round < 50; round++) {
			memset(out, 0xff, sizeof out);
			tern_parallel_for(pool, 1000, sum_squares, out);
			int wrong = 0;
			for (int64_t i = 0; i < 1000; i++)
				wrong += out[i] != i * i;
			CHECK(wrong == 0);
		}
		tern_threadpool_free(pool);
	}
}

int main(void)
{
	test_dtypes();
	test_half();
	test_alloc_and_copy();
	test_proto_round_trip();
	test_typed_fields();
	test_threadpool();
	return check_report("test_tensor");
}
