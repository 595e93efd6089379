/* train.h — tern-run --train: the training loop over a model's training algorithm (train.c). */
#ifndef TERN_TRAIN_H
#define TERN_TRAIN_H

#include "cli.h"

#include <stdint.h>

typedef struct train_options {
	int64_t steps; /* total steps for the model (0: from epochs) */
	int64_t epochs; /* total epochs (0: 1 unless steps) */
	int64_t batch; /* 0: the declared first dimension, or 32 */
	int drop_last;
	int shuffle;
	uint64_t seed;
	const char *log; /* JSON lines */
	int64_t log_every; /* 0: 1 with --log */
	int64_t checkpoint_every; /* 0: only at the end */
	int threads;
	const char **input_args; /* -i [NAME=]FILE */
	int n_input_args;
	const char **val_args; /* --val NAME=FILE: the inference inputs and the target */
	int n_val_args;
	/* tern-dist-run: this process is a rank of a communicator (tern_comm_set); each takes its slice of
	 * every batch, the loss is the ranks' mean, rank 0 writes, logs carry the bytes moved */
	int dist;
	int report; /* print the bytes moved a step by kind beside the first-principles count */
	double *median_step_s; /* when set: the median step time after the first two steps (ranks' mean) */
} train_options;

/* The training options tern-run --train and tern-dist-run share: entries for an argp option table
 * (in group G), and their parser (ARGP_ERR_UNKNOWN for other keys). */
enum {
	TRAIN_OPT_STEPS = 0x1000,
	TRAIN_OPT_EPOCHS,
	TRAIN_OPT_BATCH,
	TRAIN_OPT_DROP_LAST,
	TRAIN_OPT_SHUFFLE,
	TRAIN_OPT_LOG,
	TRAIN_OPT_LOG_EVERY,
	TRAIN_OPT_CHECKPOINT_EVERY,
	TRAIN_OPT_VAL,
};
#define TRAIN_ARGP_OPTIONS(G)                                                                                           \
	{"steps", TRAIN_OPT_STEPS, "N", 0, "train to N steps in all (counted from the model's first training)", G},     \
	        {"epochs", TRAIN_OPT_EPOCHS, "E", 0, "train to E epochs in all (default 1)", G},                        \
	        {"batch", TRAIN_OPT_BATCH, "B", 0, "samples a step, sliced from every -i file along axis 0", G},         \
	        {"drop-last", TRAIN_OPT_DROP_LAST, NULL, 0, "skip an epoch's last batch when it is short", G},          \
	        {"shuffle", TRAIN_OPT_SHUFFLE, NULL, 0, "a new order of the samples every epoch, from --seed", G},      \
	        {"log", TRAIN_OPT_LOG, "FILE", 0, "one JSON object a logged step: step, epoch, loss, samples_per_s, lr", \
	         G},                                                                                                    \
	        {"log-every", TRAIN_OPT_LOG_EVERY, "K", 0, "log every K steps (default 1)", G},                         \
	        {"checkpoint-every", TRAIN_OPT_CHECKPOINT_EVERY, "K", 0, "write -o every K steps too", G},              \
	        {"val", TRAIN_OPT_VAL, "NAME=FILE", 0,                                                                  \
	         "validation data (the inputs and the target): loss, and accuracy for classes, after every epoch", G}
struct argp_state;
int train_parse_option(train_options *o, int key, char *arg, struct argp_state *state);

/* Trains model (which carries a training algorithm) and writes it to cli->output; never returns on
 * failure (a one-line error and the sysexits code). Returns the exit status: 0, or 130/143 after
 * SIGINT/SIGTERM stopped it (the model written first). */
int tern_run_train(const train_options *o, const tern_cli *cli, tern_model *model);

#endif
