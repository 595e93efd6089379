/* train.c — tern-run --train: slices the -i files into batches (shuffled per epoch from --seed),
 * runs the model's training step on each, logs, checkpoints, and writes the trained model.
 *
 * The order of the data is a function of (seed, epoch) only and the step count is stored in the
 * model (the tern.step initializer that tern-autodiff adds), so a run resumed from a checkpoint
 * takes the same batches as one that was never interrupted. */
#include "train.h"

#include <argp.h>
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


int train_parse_option(train_options *o, int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case TRAIN_OPT_STEPS: o->steps = tern_cli_count(state, "--steps", arg, 1, INT64_MAX); return 0;
	case TRAIN_OPT_EPOCHS: o->epochs = tern_cli_count(state, "--epochs", arg, 1, INT64_MAX); return 0;
	case TRAIN_OPT_BATCH: o->batch = tern_cli_count(state, "--batch", arg, 1, INT64_MAX); return 0;
	case TRAIN_OPT_DROP_LAST: o->drop_last = 1; return 0;
	case TRAIN_OPT_SHUFFLE: o->shuffle = 1; return 0;
	case TRAIN_OPT_LOG: o->log = arg; return 0;
	case TRAIN_OPT_LOG_EVERY: o->log_every = tern_cli_count(state, "--log-every", arg, 1, INT64_MAX); return 0;
	case TRAIN_OPT_CHECKPOINT_EVERY: o->checkpoint_every = tern_cli_count(state, "--checkpoint-every", arg, 1, INT64_MAX); return 0;
	case TRAIN_OPT_VAL:
		o->val_args = tern_cli_grow(o->val_args, (size_t)o->n_val_args + 1, sizeof *o->val_args);
		o->val_args[o->n_val_args++] = arg;
		return 0;
	default: return ARGP_ERR_UNKNOWN;
	}
}

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
	stop_signal = sig;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A permutation of 0..n-1 for one epoch: Fisher-Yates over splitmix64 seeded by (seed, epoch). */
static void epoch_order(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch, int shuffle)
{
	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	if (!shuffle)
		return;
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + (uint64_t)epoch * 0xbf58476d1ce4e5b9ull + 1;
	for (int64_t i = n - 1; i > 0; i--) {
		x += 0x9e3779b97f4a7c15ull;
		uint64_t z = x;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		int64_t j = (int64_t)(z % (uint64_t)(i + 1));
		int64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}

/* Rows rows[0..m) of src (along axis 0) into dst, whose storage is allocated once for `cap` rows and
 * reused by every later batch (a short last batch is a shorter view of it). */
static void gather_rows(const tern_tensor *src, const int64_t *rows, int64_t m, int64_t cap, tern_tensor *dst)
{
	size_t row = src->nbytes / (size_t)(src->dims[0] ? src->dims[0] : 1);
	if (!dst->data) {
		int64_t dims[TERN_MAX_RANK];
		memcpy(dims, src->dims, sizeof dims);
		dims[0] = cap;
		tern_cli_check(tern_tensor_alloc(dst, src->dtype, src->rank, dims));
	}
	dst->dims[0] = m;
	dst->nbytes = (size_t)m * row;
	for (int64_t r = 0; r < m; r++)
		memcpy((char *)dst->data + (size_t)r * row, (const char *)src->data + (size_t)rows[r] * row, row);
}

static void write_model(const tern_cli *cli, tern_trainer *tr, tern_model *model, bool dist)
{
	if (!cli->output)
		return;
	/* a partitioned step's shards are gathered into rank 0's tables, which alone writes */
	if (dist) {
		tern_cli_check(tern_dist_gather(tr, model));
		if (tern_comm_get()->rank != 0)
			return;
	}
	tern_cli_check(tern_trainer_sync(tr));
	FILE *out = tern_cli_open_output(cli, 1);
	tern_cli_write_model(out, model);
}

static void progress(int64_t step, int64_t total, double loss, double rate, double eta)
{
	int e = (int)(eta + 0.5);
	fprintf(stderr, "\rstep %lld/%lld  loss %.5g  %.0f samples/s  ETA %d:%02d:%02d ", (long long)step,
	        (long long)total, loss, rate, e / 3600, e / 60 % 60, e % 60);
	fflush(stderr);
}

/* ---------------------------------------------------------------- validation */

struct val {
	tern_tensor *in; /* the inference graph's inputs */
	int n_in;
	tern_tensor target;
	int64_t rows;
};

static void read_val(const train_options *o, tern_trainer *tr, tern_model *model, struct val *v)
{
	memset(v, 0, sizeof *v);
	if (!o->n_val_args)
		return;
	v->n_in = tern_model_num_inputs(model);
	v->in = calloc((size_t)v->n_in + 1, sizeof *v->in);
	if (!v->in)
		tern_cli_fail(TERN_EOS, "out of memory");
	for (int a = 0; a < o->n_val_args; a++) {
		const char *arg = o->val_args[a], *eq = strchr(arg, '=');
		if (!eq)
			tern_cli_fail(TERN_EUSAGE, "--val takes NAME=FILE, not '%s'", arg);
		size_t len = (size_t)(eq - arg);
		tern_tensor *dst = NULL;
		for (int i = 0; i < v->n_in && !dst; i++)
			if (strlen(tern_model_input_name(model, i)) == len && !strncmp(tern_model_input_name(model, i), arg, len))
				dst = &v->in[i];
		for (int i = 0; i < tern_trainer_num_inputs(tr) && !dst; i++)
			if (strlen(tern_trainer_input_name(tr, i)) == len && !strncmp(tern_trainer_input_name(tr, i), arg, len))
				dst = &v->target;
		if (!dst)
			tern_cli_fail(TERN_EUSAGE, "--val %s: no input '%.*s'", arg, (int)len, arg);
		tern_cli_check(tern_tensor_read_file(eq + 1, dst));
		if (dst->rank < 1 || (v->rows >= 0 && v->rows && dst->dims[0] != v->rows))
			tern_cli_fail(TERN_EDATA, "--val %s: %lld samples, the other --val files %lld", arg,
			              dst->rank ? (long long)dst->dims[0] : 0LL, (long long)v->rows);
		v->rows = dst->dims[0];
	}
	for (int i = 0; i < v->n_in; i++)
		if (!v->in[i].dtype)
			tern_cli_fail(TERN_EUSAGE, "--val: no data for the input '%s'", tern_model_input_name(model, i));
	if (!v->target.dtype)
		tern_cli_fail(TERN_EUSAGE, "--val: no data for the target");
}

/* The model's first output on the validation data in batches of b, scored against the target:
 * accuracy and mean cross-entropy for integer targets of [N, C] outputs, else the mean squared error. */
static void validate(struct val *v, tern_model *model, int threads, int64_t b, double *loss, double *acc)
{
	*loss = NAN;
	*acc = NAN;
	tern_plan *plan = NULL;
	tern_plan_options po = {.n_threads = threads};
	tern_tensor *batch = calloc((size_t)v->n_in + 1, sizeof *batch);
	int64_t *rows = malloc((size_t)b * sizeof *rows);
	if (!batch || !rows)
		tern_cli_fail(TERN_EOS, "out of memory");
	double sum_loss = 0, right = 0;
	bool classes = v->target.dtype == TERN_INT64 || v->target.dtype == TERN_INT32;
	for (int64_t start = 0; start < v->rows; start += b) {
		int64_t m = start + b <= v->rows ? b : v->rows - start;
		for (int64_t r = 0; r < m; r++)
			rows[r] = start + r;
		for (int i = 0; i < v->n_in; i++)
			gather_rows(&v->in[i], rows, m, b, &batch[i]);
		if (!plan)
			tern_cli_check(tern_plan_create(model, &po, batch, v->n_in, &plan));
		tern_status st = tern_plan_run(plan, batch, v->n_in);
		if (st)
			tern_cli_fail(st, "validation: %s", tern_error());
		const tern_tensor *y = tern_plan_output(plan, 0);
		if (classes && y->rank == 2 && y->dims[0] == m) {
			int64_t c = y->dims[1];
			for (int64_t r = 0; r < m; r++) {
				int64_t best = 0, label = tern_tensor_get_i64(&v->target, start + r);
				double mx = -INFINITY, se = 0;
				for (int64_t k = 0; k < c; k++) {
					double z = tern_tensor_get_f64(y, r * c + k);
					if (z > mx)
						mx = z, best = k;
				}
				for (int64_t k = 0; k < c; k++)
					se += exp(tern_tensor_get_f64(y, r * c + k) - mx);
				right += best == label;
				if (label >= 0 && label < c)
					sum_loss += log(se) + mx - tern_tensor_get_f64(y, r * c + label);
			}
		} else {
			int64_t per = tern_tensor_numel(y) / (m ? m : 1);
			for (int64_t k = 0; k < tern_tensor_numel(y); k++) {
				double d = tern_tensor_get_f64(y, k) - tern_tensor_get_f64(&v->target, start * per + k);
				sum_loss += d * d / (double)per;
			}
			classes = false;
		}
	}
	*loss = sum_loss / (double)v->rows;
	if (classes)
		*acc = right / (double)v->rows;
	for (int i = 0; i < v->n_in; i++)
		tern_tensor_free(&batch[i]);
	free(batch);
	free(rows);
	tern_plan_free(plan);
}

static void free_val(struct val *v)
{
	for (int i = 0; i < v->n_in; i++)
		tern_tensor_free(&v->in[i]);
	free(v->in);
	tern_tensor_free(&v->target);
}

/* Every rank waits for the others (a one-double allreduce). */
static void dist_barrier(void)
{
	double nothing = 0;
	tern_cli_check(tern_comm_allreduce(TERN_COMM_OTHER, &nothing, 1, TERN_DOUBLE));
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* --report: per step and rank, the bytes each kind sent (mean over the ranks) beside the
 * first-principles count of the rows the step touched, and throughput. Collective. */
static void report(int64_t steps, double seconds, int64_t batch, int rank, int ranks)
{
	int64_t sent[TERN_COMM_KINDS], recv[TERN_COMM_KINDS], want[TERN_COMM_KINDS];
	tern_comm_bytes(sent, recv);
	tern_comm_expected(want);
	double v[3 * TERN_COMM_KINDS + 1];
	for (int k = 0; k < TERN_COMM_KINDS; k++) {
		v[k] = (double)sent[k];
		v[TERN_COMM_KINDS + k] = (double)recv[k];
		v[2 * TERN_COMM_KINDS + k] = (double)want[k];
	}
	v[3 * TERN_COMM_KINDS] = seconds;
	tern_cli_check(tern_comm_allreduce(TERN_COMM_OTHER, v, 3 * TERN_COMM_KINDS + 1, TERN_DOUBLE));
	if (rank != 0 || steps <= 0)
		return;
	double per = 1.0 / ((double)steps * ranks);
	fprintf(stderr, "%-12s %16s %16s %16s %8s\n", "kind", "sent/step", "received/step", "first-principles",
	        "ratio");
	double total_sent = 0, total_want = 0;
	for (int k = 0; k < TERN_COMM_KINDS; k++) {
		double s = v[k] * per, r = v[TERN_COMM_KINDS + k] * per, w = v[2 * TERN_COMM_KINDS + k] * per;
		total_sent += s;
		if (k == TERN_COMM_OTHER) {
			fprintf(stderr, "%-12s %16.0f %16.0f %16s %8s\n", tern_comm_kind_name(k), s, r, "-", "-");
			continue;
		}
		total_want += w;
		if (w > 0)
			fprintf(stderr, "%-12s %16.0f %16.0f %16.0f %8.3f\n", tern_comm_kind_name(k), s, r, w, s / w);
		else
			fprintf(stderr, "%-12s %16.0f %16.0f %16.0f %8s\n", tern_comm_kind_name(k), s, r, w, "-");
	}
	fprintf(stderr, "%-12s %16.0f %16s %16.0f %8.3f\n", "all", total_sent, "", total_want,
	        total_want > 0 ? total_sent / total_want : 0.0);
	double mean_s = v[3 * TERN_COMM_KINDS] / ranks;
	fprintf(stderr, "bytes a rank a step; %lld steps on %d ranks, %.4g s a step, %.6g samples/s\n", (long long)steps,
	        ranks, mean_s / (double)steps, (double)steps * (double)batch / mean_s);
}

int tern_run_train(const train_options *o, const tern_cli *cli, tern_model *model)
{
	/* from the start: a signal before the first step must still end in a written model */
	struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	/* a distributed step runs its nodes in one order on every rank: collectives must meet */
	tern_plan_options po = {.n_threads = o->threads, .single_stream = o->dist};
	tern_trainer *tr = NULL;
	tern_cli_check(tern_trainer_create(model, &po, &tr));
	int n = tern_trainer_num_inputs(tr);
	/* distributed: this rank's shards from the model's tables; a slice of every batch */
	bool dist = o->dist && tern_comm_get();
	int rank = dist ? tern_comm_get()->rank : 0, ranks = dist ? tern_comm_get()->size : 1;
	if (dist)
		tern_cli_check(tern_dist_scatter(tr, model));

	/* the data: every input of the step from -i, NAME=FILE or in order */
	tern_tensor *data = calloc((size_t)n + 1, sizeof *data), *batch = calloc((size_t)n + 1, sizeof *batch);
	if (!data || !batch)
		tern_cli_fail(TERN_EOS, "out of memory");
	int next = 0;
	for (int a = 0; a < o->n_input_args; a++) {
		const char *arg = o->input_args[a], *eq = strchr(arg, '=');
		int i = -1;
		for (int k = 0; eq && k < n && i < 0; k++)
			if (strlen(tern_trainer_input_name(tr, k)) == (size_t)(eq - arg) &&
			    strncmp(tern_trainer_input_name(tr, k), arg, (size_t)(eq - arg)) == 0)
				i = k;
		const char *path = i >= 0 ? eq + 1 : arg;
		if (i < 0) {
			while (next < n && data[next].dtype)
				next++;
			if (next == n)
				tern_cli_fail(TERN_EUSAGE, "-i %s: the training step has only %d inputs", arg, n);
			i = next;
		}
		if (data[i].dtype)
			tern_cli_fail(TERN_EUSAGE, "input '%s' is given twice", tern_trainer_input_name(tr, i));
		tern_cli_check(tern_cli_read_samples(path, &data[i]));
		if (data[i].dtype != TERN_SEQUENCE && data[i].rank < 1)
			tern_cli_fail(TERN_EDATA, "%s: a scalar cannot be cut into batches (input '%s')", path,
			              tern_trainer_input_name(tr, i));
	}
	/* examples: every input a sequence, an example of its own sizes at each place */
	int seqs = 0;
	for (int i = 0; i < n; i++)
		seqs += data[i].dtype == TERN_SEQUENCE;
	bool examples = seqs > 0;
	int64_t rows = -1;
	for (int i = 0; i < n; i++) {
		if (!data[i].dtype)
			tern_cli_fail(TERN_EDATA, "the training step's input '%s' has no data; give it with -i %s=FILE",
			              tern_trainer_input_name(tr, i), tern_trainer_input_name(tr, i));
		if (examples && data[i].dtype != TERN_SEQUENCE)
			tern_cli_fail(TERN_EUSAGE, "input '%s' is a tensor of samples and others are sequences of examples: give "
			              "every input as a sequence (a folder of 0.npy, 1.npy, ...) or none", tern_trainer_input_name(tr, i));
		int64_t count = examples ? (int64_t)tern_sequence_of(&data[i])->n : data[i].dims[0];
		if (rows >= 0 && count != rows)
			tern_cli_fail(TERN_EDATA, "the -i files disagree on the number of %s: '%s' has %lld, '%s' %lld",
			              examples ? "examples" : "samples", tern_trainer_input_name(tr, 0), (long long)rows,
			              tern_trainer_input_name(tr, i), (long long)count);
		rows = count;
	}
	if (examples && o->batch > 1)
		tern_cli_fail(TERN_EUSAGE, "examples of their own sizes go one a step: --batch must be 1, not %lld",
		              (long long)o->batch);
	if (examples && dist)
		tern_cli_fail(TERN_EUSAGE, "examples of their own sizes are not yet spread over ranks: give tensors of samples");
	if (examples && o->n_val_args)
		tern_cli_fail(TERN_EUSAGE, "--val with examples of their own sizes is not supported yet");
	if (examples && rows < 1)
		tern_cli_fail(TERN_EDATA, "the -i sequences hold no examples");
	/* the batch: as asked, one example, or the declared first dimension when it is fixed */
	int64_t b = examples ? 1 : o->batch;
	if (!b) {
		int dt, rank;
		int64_t dims[TERN_MAX_RANK];
		tern_cli_check(tern_trainer_input_type(tr, 0, &dt, &rank, dims));
		b = rank > 0 && dims[0] > 0 ? dims[0] : 32;
		if (b > rows)
			b = rows;
	}
	if (b > rows)
		tern_cli_fail(TERN_EUSAGE, "--batch %lld is larger than the %lld samples", (long long)b, (long long)rows);
	if (b % ranks)
		tern_cli_fail(TERN_EUSAGE, "--batch %lld does not divide among %d ranks", (long long)b, ranks);
	/* ranks take equal slices, so that the mean of their losses is the batch's: no short batch */
	int64_t per_epoch = o->drop_last || dist ? rows / b : (rows + b - 1) / b;
	if (per_epoch < 1)
		tern_cli_fail(TERN_EUSAGE, "no batch of %lld in %lld samples", (long long)b, (long long)rows);
	int64_t total = o->steps ? o->steps : (o->epochs ? o->epochs : 1) * per_epoch;
	int64_t step = tern_trainer_stored_step(tr);
	if (step >= total)
		tern_cli_verbose(0, "the model has taken %lld steps already (of %lld): nothing to do", (long long)step,
		                 (long long)total);
	else if (step)
		tern_cli_verbose(1, "resuming at step %lld of %lld", (long long)step, (long long)total);
	tern_cli_verbose(1, "%lld %s, batch %lld, %lld steps an epoch, %d threads", (long long)rows,
	                 examples ? "examples" : "samples", (long long)b, (long long)per_epoch, o->threads);

	FILE *log = NULL;
	if (dist && o->log) {
		/* one file for all ranks: rank 0 starts it, then every rank appends whole lines */
		if (rank == 0 && !step && !(log = fopen(o->log, "w")))
			tern_cli_fail(TERN_EIO, "%s: %s", o->log, strerror(errno));
		if (log)
			fclose(log);
		dist_barrier();
		log = fopen(o->log, "a");
		if (!log)
			tern_cli_fail(TERN_EIO, "%s: %s", o->log, strerror(errno));
	} else if (o->log && !(log = fopen(o->log, step ? "a" : "w"))) {
		tern_cli_fail(TERN_EIO, "%s: %s", o->log, strerror(errno));
	}
	int64_t log_every = o->log_every ? o->log_every : 1;
	bool bar = isatty(STDERR_FILENO) && !cli->quiet && rank == 0;
	int64_t slice = b / ranks;
	int64_t sent0[TERN_COMM_KINDS], recv0[TERN_COMM_KINDS], sent1[TERN_COMM_KINDS], recv1[TERN_COMM_KINDS];
	struct val val;
	read_val(o, tr, model, &val);
	int64_t *perm = malloc((size_t)rows * sizeof *perm), *take = malloc((size_t)b * sizeof *take);
	if (!perm || !take)
		tern_cli_fail(TERN_EOS, "out of memory");
	int64_t perm_epoch = -1;
	if (dist)
		tern_comm_reset_bytes();
	double t_start = now_s(), t_log = t_start, loss = NAN;
	int64_t samples_since = 0, first = step;
	double *times = o->median_step_s ? calloc((size_t)(total - step) + 1, sizeof *times) : NULL;
	int64_t n_times = 0;
	if (o->median_step_s && !times)
		tern_cli_fail(TERN_EOS, "out of memory");
	/* distributed: every rank stops after the same step, agreed on with the step's loss */
	int agreed_stop = 0;
	for (; step < total; step++) {
		if (dist ? agreed_stop : stop_signal != 0)
			break;
		int64_t epoch = step / per_epoch, pos = step % per_epoch;
		if (epoch != perm_epoch) {
			epoch_order(perm, rows, o->seed, epoch, o->shuffle);
			perm_epoch = epoch;
		}
		int64_t start = pos * b, m = start + b <= rows ? b : rows - start;
		for (int64_t r = 0; r < m; r++)
			take[r] = perm[start + r];
		/* this rank's slice (all of it on one process); an example as it is */
		for (int i = 0; i < n; i++) {
			if (examples) {
				batch[i] = tern_sequence_of(&data[i])->items[take[0]];
				batch[i].owns_data = 0; /* a view: the sequence frees it */
				batch[i].name = NULL;
			} else {
				gather_rows(&data[i], take + rank * slice, m / ranks, slice, &batch[i]);
			}
		}
		if (dist)
			tern_comm_bytes(sent0, recv0);
		double t_step = now_s();
		tern_status st = tern_trainer_step(tr, batch, &loss);
		if (st)
			tern_cli_fail(st, "step %lld: %s", (long long)step + 1, tern_error());
		t_step = now_s() - t_step;
		double local_loss = loss;
		if (dist) {
			tern_comm_bytes(sent1, recv1);
			double agree[2] = {loss / ranks, stop_signal != 0};
			tern_cli_check(tern_comm_allreduce(TERN_COMM_OTHER, agree, 2, TERN_DOUBLE));
			loss = agree[0];
			if (agree[1] > 0) {
				agreed_stop = 1;
				stop_signal = stop_signal ? stop_signal : SIGTERM;
			}
		}
		if (!isfinite(loss))
			tern_cli_fail(TERN_EDATA, "step %lld (epoch %lld): the loss is %g; nothing written", (long long)step + 1,
			              (long long)epoch + 1, loss);
		if (step == first) {
			int n_state, n_inplace = tern_trainer_num_inplace(tr, &n_state);
			tern_cli_verbose(1, "%d of %d parameters and state tensors updated in place; arena %zu bytes", n_inplace,
			                 n_state, tern_trainer_arena_bytes(tr));
		}
		if (times && step >= first + 2)
			times[n_times++] = t_step;
		samples_since += m;
		double now = now_s();
		if (log && ((step + 1) % log_every == 0 || step + 1 == total)) {
			double rate = samples_since / (now - t_log > 1e-9 ? now - t_log : 1e-9);
			if (!dist) {
				fprintf(log, "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"samples_per_s\": %.6g, \"lr\": %.9g}\n",
				        (long long)step + 1, (long long)epoch + 1, loss, rate, tern_trainer_lr(tr));
			} else {
				/* per rank: its own loss and the bytes its step moved, by kind */
				char line[1024];
				int k = snprintf(line, sizeof line,
				                 "{\"step\": %lld, \"rank\": %d, \"epoch\": %lld, \"loss\": %.9g, \"mean_loss\": %.9g, "
				                 "\"samples_per_s\": %.6g, \"step_s\": %.6g, \"lr\": %.9g",
				                 (long long)step + 1, rank, (long long)epoch + 1, local_loss, loss, rate, t_step,
				                 tern_trainer_lr(tr));
				for (int dir = 0; dir < 2; dir++) {
					k += snprintf(line + k, sizeof line - (size_t)k, ", \"%s\": {", dir ? "bytes_received" : "bytes_sent");
					for (int kind = 0; kind < TERN_COMM_KINDS; kind++)
						k += snprintf(line + k, sizeof line - (size_t)k, "%s\"%s\": %lld", kind ? ", " : "",
						              tern_comm_kind_name(kind),
						              (long long)(dir ? recv1[kind] - recv0[kind] : sent1[kind] - sent0[kind]));
					k += snprintf(line + k, sizeof line - (size_t)k, "}");
				}
				snprintf(line + k, sizeof line - (size_t)k, "}\n");
				fputs(line, log);
			}
			fflush(log);
			t_log = now;
			samples_since = 0;
		}
		if (bar) {
			double rate = (double)(step + 1 - first) * (double)b / (now - t_start > 1e-9 ? now - t_start : 1e-9);
			progress(step + 1, total, loss, rate, (double)(total - step - 1) * (double)b / (rate > 0 ? rate : 1));
		}
		if (o->checkpoint_every && (step + 1) % o->checkpoint_every == 0 && step + 1 < total)
			write_model(cli, tr, model, dist);
		if (val.rows && ((step + 1) % per_epoch == 0 || step + 1 == total)) {
			/* the inference graph with the current parameters, on the validation data (rank 0) */
			double vl, va;
			if (dist) {
				tern_cli_check(tern_dist_gather(tr, model));
				if (rank)
					continue;
			}
			tern_cli_check(tern_trainer_sync(tr));
			validate(&val, model, o->threads, b, &vl, &va);
			if (bar)
				fputc('\n', stderr);
			tern_cli_verbose(0, "epoch %lld: validation loss %.6g%s%.4g", (long long)epoch + 1, vl,
			                 isnan(va) ? "" : ", accuracy ", isnan(va) ? 0.0 : va);
			if (log) {
				fprintf(log, "{\"step\": %lld, \"epoch\": %lld, \"val_loss\": %.9g", (long long)step + 1,
				        (long long)epoch + 1, vl);
				if (!isnan(va))
					fprintf(log, ", \"val_accuracy\": %.6g", va);
				fputs("}\n", log);
				fflush(log);
			}
		}
	}
	if (bar)
		fputc('\n', stderr);
	if (dist && o->report)
		report(step - first, now_s() - t_start, b, rank, ranks);
	if (times) {
		qsort(times, (size_t)n_times, sizeof *times, by_value);
		double med = n_times ? times[n_times / 2] : NAN;
		if (dist) {
			med /= ranks;
			tern_cli_check(tern_comm_allreduce(TERN_COMM_OTHER, &med, 1, TERN_DOUBLE));
		}
		*o->median_step_s = med;
		free(times);
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	write_model(cli, tr, model, dist);
	if (dist) {
		/* no rank leaves before rank 0 has written: mpiexec ends a job's other ranks when one exits
		 * with a non-zero status (after a signal) */
		dist_barrier();
	}
	if (rank == 0)
		tern_cli_verbose(0, "step %lld of %lld: loss %.6g", (long long)step, (long long)total, loss);
	if (log && fclose(log) != 0)
		tern_cli_fail(TERN_EIO, "%s: %s", o->log, strerror(errno));
	for (int i = 0; i < n; i++) {
		tern_tensor_free(&data[i]);
		tern_tensor_free(&batch[i]);
	}
	free(data);
	free(batch);
	free(perm);
	free(take);
	free_val(&val);
	tern_trainer_free(tr);
	if (stop_signal == SIGINT)
		return 130;
	if (stop_signal == SIGTERM)
		return 143;
	return 0;
}
