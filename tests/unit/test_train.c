/* test_train.c — the library's training API: planned steps update parameters and optimizer state in
 * place (the plan writes the optimizer's outputs into the caller's buffers), the values match SGD
 * with momentum computed here by hand, tern_trainer_set_state replaces a parameter, and an embedding
 * table's update from rows equals the dense update. */
#include "check.h"

#include "tern.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static tern_model *load(const char *text)
{
	tern_model *m = NULL;
	CHECK_OK(tern_model_load_bytes(text, strlen(text), "test", NULL, &m));
	return m;
}

static float *floats(const tern_tensor *t)
{
	return (float *)t->data;
}

/* y = x w (x [4,2], w [2,1]), mse against t, SGD lr 0.1 momentum 0.5: two steps by hand. */
static void sgd_in_place(void)
{
	tern_model *m = load("<ir_version: 8, opset_import: [\"\" : 17]>\n"
	                     "lin (float[N,2] x) => (float[N,1] y) <float[2,1] w = {0.5, -1}> { y = MatMul (x, w) }\n");
	if (!m)
		return;
	tern_train_options o = {.loss = "mse", .optimizer = "sgd", .lr = 0.1, .momentum = 0.5, .weight_decay = -1};
	CHECK_OK(tern_model_add_training(m, &o, NULL));
	tern_trainer *tr = NULL;
	CHECK_OK(tern_trainer_create(m, NULL, &tr));
	if (!tr) {
		tern_model_free(m);
		return;
	}
	CHECK(tern_trainer_num_inputs(tr) == 2);
	CHECK(tern_trainer_num_state(tr) == 3); /* w, its buffer, the step counter */
	float xv[8] = {1, 2, 0, 1, -1, 3, 2, 2}, tv[4] = {1, 0, 2, -1};
	tern_tensor data[2] = {0};
	int64_t xd[2] = {4, 2}, td[2] = {4, 1};
	CHECK_OK(tern_tensor_alloc(&data[0], TERN_FLOAT, 2, xd));
	CHECK_OK(tern_tensor_alloc(&data[1], TERN_FLOAT, 2, td));
	memcpy(data[0].data, xv, sizeof xv);
	memcpy(data[1].data, tv, sizeof tv);
	const float *w_before = floats(tern_trainer_state(tr, "w"));
	double w[2] = {0.5, -1}, buf[2] = {0, 0};
	for (int step = 0; step < 2; step++) {
		/* by hand: dL/dw = 2/N x^T (x w - t) */
		double g[2] = {0, 0};
		for (int i = 0; i < 4; i++) {
			double r = xv[2 * i] * w[0] + xv[2 * i + 1] * w[1] - tv[i];
			g[0] += 2.0 / 4 * xv[2 * i] * r;
			g[1] += 2.0 / 4 * xv[2 * i + 1] * r;
		}
		for (int k = 0; k < 2; k++) {
			buf[k] = 0.5 * buf[k] + g[k];
			w[k] -= 0.1 * buf[k];
		}
		double loss = 0;
		CHECK_OK(tern_trainer_step(tr, data, &loss));
	}
	int n_state = 0;
	CHECK(tern_trainer_num_inplace(tr, &n_state) == n_state && n_state == 3);
	const tern_tensor *wt = tern_trainer_state(tr, "w");
	CHECK(wt && floats(wt) == w_before); /* the same buffer, updated in place */
	CHECK(wt && fabs(floats(wt)[0] - w[0]) < 1e-5 && fabs(floats(wt)[1] - w[1]) < 1e-5);
	CHECK(tern_trainer_stored_step(tr) == 2);
	/* a parameter set by the caller */
	tern_tensor nw = {0};
	int64_t wd[2] = {2, 1};
	CHECK_OK(tern_tensor_alloc(&nw, TERN_FLOAT, 2, wd));
	floats(&nw)[0] = 3;
	floats(&nw)[1] = 4;
	CHECK_OK(tern_trainer_set_state(tr, "w", &nw));
	CHECK(floats(tern_trainer_state(tr, "w"))[1] == 4);
	CHECK(tern_trainer_set_state(tr, "w", &data[0]) == TERN_EDATA);
	CHECK(tern_trainer_set_state(tr, "nothing", &nw) == TERN_EUSAGE);
	/* saved: the model's initializer is the trained value */
	CHECK_OK(tern_trainer_sync(tr));
	tern_tensor_free(&nw);
	tern_tensor_free(&data[0]);
	tern_tensor_free(&data[1]);
	tern_trainer_free(tr);
	tern_model_free(m);
}

/* Gather rows of a table (duplicates, a negative index), Adam: the rows update equals the dense one. */
static void rows_equal_dense(void)
{
	const char *text = "<ir_version: 8, opset_import: [\"\" : 17]>\n"
	                   "emb (int64[N] ids) => (float[N,3] y) <float[5,3] e = {1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}>"
	                   " { y = Gather (e, ids) }\n";
	float result[2][15];
	for (int dense = 0; dense < 2; dense++) {
		tern_model *m = load(text);
		if (!m)
			return;
		tern_train_options o = {.loss = "mse", .optimizer = "adam", .lr = 0.01, .weight_decay = -1,
		                        .dense_gradients = dense};
		tern_train_summary s;
		CHECK_OK(tern_model_add_training(m, &o, &s));
		CHECK(s.n_sparse == !dense);
		tern_trainer *tr = NULL;
		CHECK_OK(tern_trainer_create(m, NULL, &tr));
		tern_tensor data[2] = {0};
		int64_t nd[1] = {4}, td[2] = {4, 3};
		CHECK_OK(tern_tensor_alloc(&data[0], TERN_INT64, 1, nd));
		CHECK_OK(tern_tensor_alloc(&data[1], TERN_FLOAT, 2, td));
		int64_t ids[4] = {1, 3, 1, -1};
		memcpy(data[0].data, ids, sizeof ids);
		for (int i = 0; i < 12; i++)
			floats(&data[1])[i] = (float)(i % 5) - 2;
		for (int step = 0; tr && step < 3; step++)
			CHECK_OK(tern_trainer_step(tr, data, NULL));
		const tern_tensor *e = tr ? tern_trainer_state(tr, "e") : NULL;
		if (e)
			memcpy(result[dense], e->data, sizeof result[dense]);
		/* rows 0 and 2 were never read: Adam's moments stay zero there, so they do not move */
		CHECK(e && floats(e)[0] == 1 && floats(e)[6] == 7);
		tern_tensor_free(&data[0]);
		tern_tensor_free(&data[1]);
		tern_trainer_free(tr);
		tern_model_free(m);
	}
	CHECK(memcmp(result[0], result[1], sizeof result[0]) == 0);
	CHECK(result[0][3] != 4 && result[0][12] != 13); /* rows 1 and 4 (-1) trained */
}

int main(void)
{
	sgd_in_place();
	rows_equal_dense();
	return check_report("test_train");
}
