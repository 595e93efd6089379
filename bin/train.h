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
} train_options;

/* Trains model (which carries a training algorithm) and writes it to cli->output; never returns on
 * failure (a one-line error and the sysexits code). Returns the exit status: 0, or 130/143 after
 * SIGINT/SIGTERM stopped it (the model written first). */
int tern_run_train(const train_options *o, const tern_cli *cli, tern_model *model);

#endif
