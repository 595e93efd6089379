/* exec.h — the executor's structures: slots (one per value), steps (one per node to launch) and the
 * plan that binds them. Shared by plan.c (planning) and run.c (running). */
#ifndef TERN_EXEC_H
#define TERN_EXEC_H

#include "internal.h"

enum slot_kind {
	SLOT_UNSET,
	SLOT_CONST, /* data known while planning (initializer, folded); owned unless aliasing */
	SLOT_INPUT, /* bound to the caller's tensor at each run */
	SLOT_OUTER, /* a value of an enclosing graph: reads the parent's slot */
	SLOT_ARENA, /* lives at `offset` in the arena */
	SLOT_ALIAS, /* the bytes of slot `alias_of` with its own shape */
	SLOT_DYNAMIC, /* shape known only at run time: allocated then */
};

typedef struct slot {
	tern_tensor t;
	enum slot_kind kind;
	int known; /* dtype and shape are known */
	size_t offset;
	int alias_of; /* SLOT_ALIAS: the slot whose bytes these are */
	size_t alias_offset; /* SLOT_ALIAS: where in them (a Concat input written in place), in bytes */
	tern_tensor *outer; /* SLOT_OUTER: the parent's tensor */
	/* An input or outer value whose first dimension may change length from run to run without a
	 * re-plan: nothing planned depends on it (tern_value_len_free). */
	int len_free;
	int first_def; /* producing step (in-place outputs, a dynamic slot's spare bytes) */
	int owns; /* t.data is owned (CONST) */
	/* DYNAMIC, made by a late step with outputs of fixed shape: the last run's bytes, kept for the
	 * next run of the same size, so that a plan run again and again (a function's frame) does not
	 * allocate its late outputs anew every time. */
	void *spare;
	size_t spare_bytes;
} slot;

typedef struct step {
	tern_node *node;
	const tern_op *op;
	tern_kernel_fn kernel;
	tern_tensor **in;
	int n_in;
	tern_tensor **out;
	int n_out;
	int *in_slot, *out_slot; /* -1 for omitted */
	int *use_slot; /* every slot read (inputs and implicit), for liveness */
	int n_use;
	void *params;
	void (*free_params)(void *);
	size_t scratch_bytes;
	int late; /* prepared at run time */
	/* A late step whose prepare needed only its inputs' shapes (it succeeded without their bytes)
	 * is not prepared again while they stay: late_key holds them (dtype, rank, dims per input),
	 * late_out the output shapes that prepare gave. */
	int late_ready;
	int64_t *late_key;
	size_t late_key_len;
	tern_tensor *late_out;
	int dynamic_output; /* the kernel allocates its outputs */
	uint32_t fixed_outputs; /* but these, of the shapes prepare fixed (tern_prepare_args) */
	uint32_t shaped_outputs; /* of these it gives the bytes, in shapes prepare fixed */
	int alias; /* output 0 aliases input 0: nothing to launch */
	int noop; /* a scheduled node folded while planning: only its place in the order */
	int sums; /* Add or Sum: a late one whose other inputs are zero scalars gives one input's bytes */
	int sums_to_output; /* a late sum that gives a graph output: its inputs in the arena live to the end */
	uint32_t inplace_inputs; /* inputs an output may overwrite (tern_prepare_args.inplace_inputs) */
	uint32_t packed_inputs; /* inputs the kernel packed and does not read (tern_prepare_args) */
	int stream;
	/* Calls of functions that start here and may run at once: independent tern.Invoke or function
	 * call steps in a row (a tree node's children), their count; 0 elsewhere. */
	int group;
	int *waits; /* steps on other streams that must finish first */
	int n_waits;
} step;

/* Whether a and b agree in dtype, rank and every dimension from `from` on (1: past a first dimension
 * that may change length without a re-plan, slot.len_free). */
static inline bool tern_same_shape_from(const tern_tensor *a, const tern_tensor *b, int from)
{
	if (a->dtype != b->dtype || a->rank != b->rank)
		return false;
	for (int i = from; i < a->rank; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return true;
}

/* Whether the executor allocates output o of a step (its shape is known once prepared), rather
 * than the kernel. */
static inline bool tern_step_sized_output(const step *st, int o)
{
	return !st->dynamic_output || tern_mask_has(st->fixed_outputs, o);
}

typedef struct stream_worker stream_worker;

struct tern_exec {
	tern_graph *graph;
	tern_exec *parent;
	tern_threadpool *pool;
	tern_threadpool *kernel_pool; /* what prepare and kernels get: pool, or team on several workers */
	tern_threadpool *team; /* the stream workers as a pool (tern_team_create), made when needed */
	slot *slots; /* by value index */
	size_t n_slots;
	step *steps;
	int n_steps;
	int *input_slot; /* graph inputs the caller binds, in order */
	int n_inputs;
	int *output_slot;
	int n_outputs;
	void *arena;
	size_t arena_bytes;
	void *scratch;
	size_t scratch_bytes;
	int has_late; /* some step is prepared or allocates its outputs at run time */
	int release_weights; /* tern_plan_options.release_weights (the main graph's plan only) */
	/* In-place outputs (tern_plan_options.inplace_*): output inplace_out[i] may be written into the
	 * caller's input inplace_in[i]; `donated` lists the output slots that are (aliases of the input,
	 * rebound to the caller's buffer at each run). */
	const int *inplace_in, *inplace_out;
	int n_inplace;
	int *donated;
	int n_donated;
	/* Streams (Nimble): the schedule this plan follows (NULL: one stream, steps in order). */
	const tern_schedule *schedule;
	int n_streams;
	/* Threads running the streams: --threads of them; the caller is worker 0. Any worker runs the
	 * next step of any stream whose waits are met, as a device runs its streams; kernels get `team`,
	 * so a worker with nothing ready helps with the kernels the others run. */
	int n_workers;
	int **queue; /* per stream: its steps in launch order */
	int *queue_len;
	void **worker_scratch; /* per worker */
	stream_worker *workers;
	struct stream_sync *sync;
	int keep_values; /* a kept call's frame: no two values share bytes, for a gradient to read later */
	tern_calls *calls; /* the main plan's: frames of the model-local functions its nodes call (calls.c) */
	size_t call_slot; /* a frame's: its place in the main plan's frames */
	int is_frame; /* a function's frame (calls.c), not a main plan or a subgraph's */
	tern_tensor *const *planning_inputs; /* while tern_exec_plan runs: the inputs it plans for */
	tern_grad_sinks *sinks; /* a frame's: the gradient sinks its calls see (tern_call_begin_sinks) */
	/* profiling */
	int profile;
	tern_profile_event *events;
	int n_events, cap_events;
};

tern_status tern_exec_plan(tern_exec *e, tern_tensor *const *inputs, int n_inputs);
tern_status tern_exec_run_step(tern_exec *e, int k, void *scratch, int worker);
/* Runs step *k, or the group of calls starting there on the kernel pool's threads at once, and moves
 * *k past what ran. */
tern_status tern_exec_run_next(tern_exec *e, int *k, void *scratch, int worker);
/* Multi-stream set-up and running (streams.c). */
tern_status tern_exec_setup_streams(tern_exec *e);
tern_status tern_exec_run_streams(tern_exec *e);
void tern_exec_stop_streams(tern_exec *e);
/* Between two plans of one executor: what the plan sized goes, the workers stay, idle, for the next
 * (tern_exec_setup_streams takes them up again); planning anew for each example of its own size
 * would otherwise start and join threads every run. */
void tern_exec_park_streams(tern_exec *e);
void tern_exec_release(tern_exec *e);
/* tern_exec_release before planning again: stream workers parked, not stopped. */
void tern_exec_release_for_replan(tern_exec *e);

#endif
