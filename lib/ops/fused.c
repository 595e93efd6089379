/* fused.c — tern's fused operators (domain "tern"), written by tern-optimize: Conv, Gemm and MatMul with
 * their bias and activation, chains of elementwise operators, Gelu, and Add + LayerNormalization.
 * Each runs the registry's own kernels: the main operator's, then an epilogue program of elementwise
 * kernels applied block by block over the output, so that a chain makes one pass over memory. */
#include "internal.h"
#include "ops/gemm.h"
#include "ops/ops_common.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* The row kernels below are compiled for AVX2 with FMA and for the baseline (TERN_ISA_VARIANTS2). */

/* Eight floats, written with GCC's vector extension so that row reductions vectorise without
 * reassociation flags; loads and stores go through memcpy since rows need not be aligned. */
typedef float fx_vf8 __attribute__((vector_size(32)));

/* Elements per block: large enough that a kernel call costs little against its work, small enough
 * that the registers of a program stay in cache. */
#define FX_BLOCK 4096
#define FX_MAX_STEPS 24
#define FX_MAX_ARGS 3
#define FX_MAX_CONSTS 8
#define FX_MAX_OPERANDS 8
#define FX_MAX_REGS 24
/* The elementwise kernels are prepared as the operators of this opset (Clip with inputs). */
#define FX_OPSET 17
#define FX_DOMAIN "tern"

/* ---------------------------------------------------------------- programs */

/* What a step reads: the program's input x (the chain's input 0, or the main operator's output), a
 * node input, a constant of the program, or an earlier step's result. */
enum fx_ref_kind { REF_NONE, REF_X, REF_INPUT, REF_CONST, REF_STEP };

typedef struct fx_ref {
	enum fx_ref_kind kind;
	int index;
} fx_ref;

/* The operators a step may run and the attributes its two parameters set. */
static const struct fx_op_def {
	const char *op_type;
	int arity;
	const char *attr[2];
} fx_ops[] = {
        {"Relu", 1, {0}},
        {"Sigmoid", 1, {0}},
        {"Tanh", 1, {0}},
        {"HardSwish", 1, {0}},
        {"Softplus", 1, {0}},
        {"Softsign", 1, {0}},
        {"Erf", 1, {0}},
        {"Exp", 1, {0}},
        {"Log", 1, {0}},
        {"Sqrt", 1, {0}},
        {"Abs", 1, {0}},
        {"Neg", 1, {0}},
        {"Reciprocal", 1, {0}},
        {"Floor", 1, {0}},
        {"Ceil", 1, {0}},
        {"Mish", 1, {0}},
        {"LeakyRelu", 1, {"alpha"}},
        {"Elu", 1, {"alpha"}},
        {"Celu", 1, {"alpha"}},
        {"ThresholdedRelu", 1, {"alpha"}},
        {"HardSigmoid", 1, {"alpha", "beta"}},
        {"Selu", 1, {"alpha", "gamma"}},
        {"Shrink", 1, {"lambd", "bias"}},
        {"Add", 2, {0}},
        {"Sub", 2, {0}},
        {"Mul", 2, {0}},
        {"Div", 2, {0}},
        {"Pow", 2, {0}},
        {"Max", 2, {0}},
        {"Min", 2, {0}},
        {"PRelu", 2, {0}},
        {"Clip", 3, {0}},
};

static const struct fx_op_def *fx_op_def(const char *op_type)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(fx_ops); i++)
		if (strcmp(fx_ops[i].op_type, op_type) == 0)
			return &fx_ops[i];
	return NULL;
}

/* One prepared kernel for one block length. */
typedef struct fx_prepared {
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *);
} fx_prepared;

typedef struct fx_step {
	const struct fx_op_def *def;
	float params[2];
	const char *param_names[2];
	int n_params;
	fx_ref args[FX_MAX_ARGS];
	int n_args;
	int reg; /* register of the result; -1 for the last step, which writes the output */
	/* The node the kernel is prepared for: only its operator and attributes matter. */
	tern_node node;
	Onnx__NodeProto proto;
	Onnx__AttributeProto attrs[2];
	Onnx__AttributeProto *attr_list[2];
	fx_prepared prep[2]; /* [0] full blocks, [1] the last, shorter block */
	/* Sigmoid(a) then Mul(a, it), the sigmoid read by the Mul alone: the Mul computes a * sigmoid(a)
	 * in one pass (silu_arg: a's argument index in this step, -1: no) and the Sigmoid is skipped */
	int silu_arg;
	bool skip;
} fx_step;

/* How an operand (a node input other than x) is read for a block of the output. */
enum fx_mode { MODE_SCALAR, MODE_FULL, MODE_GATHER };

typedef struct fx_operand {
	int input;
	enum fx_mode mode;
	int64_t inner, span; /* MODE_GATHER: element i of the output reads element (i / inner) % span */
	int reg;
} fx_operand;

typedef struct fx_program {
	fx_step steps[FX_MAX_STEPS];
	int n_steps;
	float consts[FX_MAX_CONSTS];
	int n_consts;
	fx_operand operands[FX_MAX_OPERANDS];
	int n_operands;
	int n_regs;
	int64_t numel, block;
	int workers; /* scratch slots: blocks run on at most this many threads at once */
} fx_program;

static tern_status fx_oom(const tern_node *node)
{
	return tern_node_errorf(node, TERN_EOS, "out of memory");
}

/* A node of a default-domain operator at FX_OPSET, standing for part of the fused node `owner` (whose
 * name messages give): the registry's prepare and kernel for op_type run on it. */
static void fx_synthetic(tern_node *node, Onnx__NodeProto *proto, const tern_node *owner, const char *op_type)
{
	onnx__node_proto__init(proto);
	proto->op_type = (char *)op_type;
	proto->name = (char *)owner->name;
	*node = (tern_node){.proto = proto,
	                    .name = owner->name,
	                    .op_type = op_type,
	                    .domain = "",
	                    .graph = owner->graph,
	                    .opset = FX_OPSET};
	node->op = tern_op_find("", op_type, FX_OPSET);
}

static tern_status fx_add_step(fx_program *pg, const tern_node *node, const char *op_type, const float *params,
                               int n_params, const fx_ref *args, int n_args)
{
	const struct fx_op_def *def = fx_op_def(op_type);
	if (!def)
		return tern_node_errorf(node, TERN_EDATA, "'%s' cannot be a step of a fused elementwise program",
		                        op_type);
	if (pg->n_steps == FX_MAX_STEPS)
		return tern_node_errorf(node, TERN_EDATA, "a fused elementwise program has at most %d steps",
		                        FX_MAX_STEPS);
	if (n_args != def->arity && !(def->arity == 3 && n_args >= 1))
		return tern_node_errorf(node, TERN_EDATA, "step %d (%s) has %d arguments, expected %d", pg->n_steps,
		                        op_type, n_args, def->arity);
	fx_step *s = &pg->steps[pg->n_steps++];
	s->def = def;
	for (int i = 0; i < 2 && def->attr[i]; i++)
		if (i < n_params && !isnan(params[i])) {
			s->params[s->n_params] = params[i];
			s->param_names[s->n_params++] = def->attr[i];
		}
	memcpy(s->args, args, (size_t)n_args * sizeof *args);
	s->n_args = n_args;
	return TERN_OK;
}

static fx_ref fx_const(fx_program *pg, float v)
{
	for (int i = 0; i < pg->n_consts; i++)
		if (pg->consts[i] == v)
			return (fx_ref){REF_CONST, i};
	pg->consts[pg->n_consts] = v;
	return (fx_ref){REF_CONST, pg->n_consts++};
}

static fx_ref fx_last(const fx_program *pg)
{
	return (fx_ref){REF_STEP, pg->n_steps - 1};
}

/* Appends the step op(*x) or op(*x, operand) and makes *x its result. */
static tern_status fx_then(fx_program *pg, const tern_node *node, const char *op, fx_ref *x, fx_ref operand)
{
	fx_ref args[2] = {*x, operand};
	tern_status st = fx_add_step(pg, node, op, NULL, 0, args, operand.kind == REF_NONE ? 1 : 2);
	if (!st)
		*x = fx_last(pg);
	return st;
}

/* Activations that are several steps, each applied to the running value and nothing, the activation's
 * input x, or a constant. */
enum { SEQ_NONE, SEQ_X, SEQ_CONST };
typedef struct fx_seq_step {
	const char *op;
	int operand;
	float k;
} fx_seq_step;

static const fx_seq_step silu_seq[] = {{"Sigmoid", SEQ_NONE, 0}, {"Mul", SEQ_X, 0}};
/* 0.5 x (1 + erf(x / sqrt(2))) */
static const fx_seq_step gelu_seq[] = {{"Mul", SEQ_CONST, 0.7071067811865476f},
                                       {"Erf", SEQ_NONE, 0},
                                       {"Add", SEQ_CONST, 1.0f},
                                       {"Mul", SEQ_X, 0},
                                       {"Mul", SEQ_CONST, 0.5f}};
/* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
static const fx_seq_step gelu_tanh_seq[] = {
        {"Mul", SEQ_X, 0},
        {"Mul", SEQ_X, 0},
        {"Mul", SEQ_CONST, 0.044715f},
        {"Add", SEQ_X, 0},
        {"Mul", SEQ_CONST, 0.7978845608028654f},
        {"Tanh", SEQ_NONE, 0},
        {"Add", SEQ_CONST, 1.0f},
        {"Mul", SEQ_X, 0},
        {"Mul", SEQ_CONST, 0.5f},
};

static const struct {
	const char *name;
	const fx_seq_step *steps;
	int n;
} fx_seqs[] = {
        {"Silu", silu_seq, TERN_ARRAY_LEN(silu_seq)},
        {"Gelu", gelu_seq, TERN_ARRAY_LEN(gelu_seq)},
        {"GeluTanh", gelu_tanh_seq, TERN_ARRAY_LEN(gelu_tanh_seq)},
};

/* The steps of one activation applied to `in`: the vocabulary of FusedConv, FusedGemm and FusedMatMul's
 * `activation` attribute, which adds Silu (x * sigmoid(x)) and Gelu (exact and tanh) to the
 * elementwise operators. */
static tern_status fx_add_activation(fx_program *pg, const tern_node *node, const char *name, const float *params,
                                     int n_params, fx_ref in)
{
	if (!*name)
		return TERN_OK;
	if (pg->n_consts + 4 > FX_MAX_CONSTS)
		return tern_node_errorf(node, TERN_EDATA, "too many constants in a fused elementwise program");
	for (size_t i = 0; i < TERN_ARRAY_LEN(fx_seqs); i++) {
		if (strcmp(name, fx_seqs[i].name) != 0)
			continue;
		fx_ref x = in;
		tern_status st = TERN_OK;
		for (int k = 0; k < fx_seqs[i].n && !st; k++) {
			const fx_seq_step *q = &fx_seqs[i].steps[k];
			fx_ref operand = q->operand == SEQ_X ? in
			        : q->operand == SEQ_CONST    ? fx_const(pg, q->k)
			                                     : (fx_ref){REF_NONE, 0};
			st = fx_then(pg, node, q->op, &x, operand);
		}
		return st;
	}
	if (strcmp(name, "Clip") == 0) {
		fx_ref args[3] = {in, fx_const(pg, n_params > 0 ? params[0] : -INFINITY),
		                  fx_const(pg, n_params > 1 ? params[1] : INFINITY)};
		return fx_add_step(pg, node, "Clip", NULL, 0, args, 3);
	}
	const struct fx_op_def *def = fx_op_def(name);
	if (!def || def->arity != 1)
		return tern_node_errorf(node, TERN_EDATA, "activation '%s' is not supported", name);
	return fx_add_step(pg, node, name, params, n_params, &in, 1);
}

/* The `activation` and `activation_params` attributes of a fused node. */
static tern_status fx_node_activation(fx_program *pg, const tern_node *node, fx_ref in)
{
	size_t n = 0;
	const float *params = tern_attr_floats(node, "activation_params", &n);
	return fx_add_activation(pg, node, tern_attr_string(node, "activation", ""), params, (int)(n < 2 ? n : 2), in);
}

/* How an operand of shape (rank, dims) is read against an output of shape (out_rank, out_dims): its
 * dimensions other than 1 must be one contiguous run equal to the output's there. */
static bool fx_classify(int rank, const int64_t *dims, int out_rank, const int64_t *out_dims, fx_operand *o)
{
	if (rank > out_rank)
		return false;
	int64_t numel = tern_numel(rank, dims);
	if (numel == 1) {
		o->mode = MODE_SCALAR;
		return true;
	}
	int first = -1, last = -1;
	for (int d = 0; d < rank; d++) {
		int od = d + out_rank - rank;
		if (dims[d] == 1)
			continue;
		if (dims[d] != out_dims[od] || (last >= 0 && last != od - 1))
			return false;
		if (first < 0)
			first = od;
		last = od;
	}
	o->inner = tern_numel(out_rank - last - 1, out_dims + last + 1);
	o->span = numel;
	o->mode = o->inner == 1 && numel == tern_numel(out_rank, out_dims) ? MODE_FULL : MODE_GATHER;
	return true;
}

bool tern_fused_operand_ok(int rank, const int64_t *dims, int out_rank, const int64_t *out_dims)
{
	fx_operand o;
	return fx_classify(rank, dims, out_rank, out_dims, &o);
}

/* Registers: each step's result lives from its step to its last reader; gathered operands for the
 * whole block. */
static tern_status fx_allocate(fx_program *pg, const tern_node *node)
{
	int last_use[FX_MAX_STEPS];
	for (int s = 0; s < pg->n_steps; s++) {
		last_use[s] = s;
		for (int t = s + 1; t < pg->n_steps; t++)
			for (int a = 0; a < pg->steps[t].n_args; a++)
				if (pg->steps[t].args[a].kind == REF_STEP && pg->steps[t].args[a].index == s)
					last_use[s] = t;
	}
	int n = 0;
	for (int i = 0; i < pg->n_operands; i++)
		pg->operands[i].reg = pg->operands[i].mode == MODE_GATHER ? n++ : -1;
	int first_free = n;
	int holder[FX_MAX_REGS];
	for (int r = 0; r < FX_MAX_REGS; r++)
		holder[r] = -1;
	for (int s = 0; s < pg->n_steps; s++) {
		fx_step *st = &pg->steps[s];
		if (s == pg->n_steps - 1) {
			st->reg = -1;
			break;
		}
		/* A register whose value dies at this step may take the result: elementwise kernels read
		 * each element before writing it. */
		int r = first_free;
		while (r < FX_MAX_REGS && holder[r] >= 0 && last_use[holder[r]] > s)
			r++;
		if (r == FX_MAX_REGS)
			return tern_node_errorf(node, TERN_EDATA,
			                        "a fused elementwise program needs too many registers");
		holder[r] = s;
		st->reg = r;
		if (r + 1 > n)
			n = r + 1;
	}
	pg->n_regs = n;
	return TERN_OK;
}

static int fx_operand_of(const fx_program *pg, int input)
{
	for (int i = 0; i < pg->n_operands; i++)
		if (pg->operands[i].input == input)
			return i;
	return -1;
}

static bool fx_same_ref(fx_ref a, fx_ref b)
{
	return a.kind == b.kind && a.index == b.index;
}

/* Marks each Sigmoid(a) followed by Mul(a, it), or Mul(it, a), with no other reader of the sigmoid:
 * swish in one pass of tern_sigmoid_f32 (times), rather than the sigmoid written and read back. */
static void fx_find_silu(fx_program *pg)
{
	for (int s = 0; s < pg->n_steps; s++)
		pg->steps[s].silu_arg = -1;
	for (int s = 0; s + 1 < pg->n_steps; s++) {
		fx_step *sig = &pg->steps[s], *mul = &pg->steps[s + 1];
		if (strcmp(sig->def->op_type, "Sigmoid") != 0 || strcmp(mul->def->op_type, "Mul") != 0 ||
		    mul->n_args != 2)
			continue;
		fx_ref self = {REF_STEP, s};
		int other = fx_same_ref(mul->args[0], self) ? 1 : fx_same_ref(mul->args[1], self) ? 0 : -1;
		fx_ref a = sig->args[0];
		/* a must be a whole block: a scalar operand or constant broadcasts */
		bool block = a.kind == REF_X || a.kind == REF_STEP ||
		        (a.kind == REF_INPUT && pg->operands[fx_operand_of(pg, a.index)].mode != MODE_SCALAR);
		if (other < 0 || !block || !fx_same_ref(mul->args[other], a))
			continue;
		bool read_later = false;
		for (int t = s + 2; t < pg->n_steps; t++)
			for (int k = 0; k < pg->steps[t].n_args; k++)
				read_later |= fx_same_ref(pg->steps[t].args[k], self);
		if (read_later)
			continue;
		sig->skip = true;
		mul->silu_arg = other;
	}
}

/* Tensors that step kernels see for one block of n elements starting at `off`. */
typedef struct fx_block {
	tern_tensor x, out, regs[FX_MAX_REGS], operands[FX_MAX_OPERANDS], consts[FX_MAX_CONSTS];
} fx_block;

static void fx_view(tern_tensor *t, const void *data, int64_t n)
{
	memset(t, 0, sizeof *t);
	t->dtype = TERN_FLOAT;
	t->rank = n < 0 ? 0 : 1;
	t->dims[0] = n;
	t->data = (void *)data;
	t->nbytes = (size_t)(n < 0 ? 1 : n) * sizeof(float);
}

static tern_tensor *fx_resolve(fx_block *b, const fx_program *pg, fx_ref r)
{
	switch (r.kind) {
	case REF_X: return &b->x;
	case REF_INPUT: return &b->operands[fx_operand_of(pg, r.index)];
	case REF_CONST: return &b->consts[r.index];
	case REF_STEP: return pg->steps[r.index].reg < 0 ? &b->out : &b->regs[pg->steps[r.index].reg];
	default: return NULL;
	}
}

/* Prepares every step's kernel for blocks of n elements (which = 0) and for the shorter last block. */
static tern_status fx_prepare_steps(fx_program *pg, const tern_node *owner, tern_tensor *const *in)
{
	int64_t lengths[2] = {pg->block, pg->numel % pg->block};
	for (int which = 0; which < 2; which++) {
		int64_t n = lengths[which];
		if (!n)
			continue;
		/* Values that exist only at run time have no data while preparing; scalars keep theirs, which
		 * are the same at every block. */
		fx_block b;
		fx_view(&b.x, NULL, n);
		fx_view(&b.out, NULL, n);
		for (int r = 0; r < FX_MAX_REGS; r++)
			fx_view(&b.regs[r], NULL, n);
		for (int c = 0; c < pg->n_consts; c++)
			fx_view(&b.consts[c], &pg->consts[c], -1);
		for (int i = 0; i < pg->n_operands; i++) {
			bool scalar = pg->operands[i].mode == MODE_SCALAR;
			fx_view(&b.operands[i], scalar ? in[pg->operands[i].input]->data : NULL, scalar ? -1 : n);
		}
		for (int s = 0; s < pg->n_steps; s++) {
			fx_step *st = &pg->steps[s];
			tern_tensor *args[FX_MAX_ARGS];
			for (int a = 0; a < st->n_args; a++)
				args[a] = fx_resolve(&b, pg, st->args[a]);
			tern_tensor result = {0};
			tern_tensor *outs[1] = {&result};
			tern_prepare_args p = {0};
			p.node = &st->node;
			p.in = args;
			p.n_in = st->n_args;
			p.out = outs;
			p.n_out = 1;
			tern_status rc = st->node.op ? st->node.op->prepare(&p) : TERN_EINTERNAL;
			st->prep[which] = (fx_prepared){p.kernel, p.params, p.free_params};
			if (rc)
				return rc;
			if (!p.kernel || p.defer || p.dynamic_output || p.alias_input0 || p.scratch_bytes ||
			    result.dtype != TERN_FLOAT || result.rank != 1 || result.dims[0] != n)
				return tern_node_errorf(owner, TERN_EDATA,
				                        "step %d (%s) of its elementwise program does not keep "
				                        "the shape and type of its input",
				                        s, st->def->op_type);
		}
	}
	return TERN_OK;
}

/* Completes a program once its steps are known: the synthetic nodes, operand modes against the output
 * shape, registers, and the kernels. x_shape is the shape the program runs over. */
static tern_status fx_finish(fx_program *pg, const tern_node *owner, tern_tensor *const *in, int n_in,
                             const tern_tensor *x_shape, tern_threadpool *pool)
{
	pg->numel = tern_tensor_numel(x_shape);
	for (int s = 0; s < pg->n_steps; s++) {
		fx_step *st = &pg->steps[s];
		fx_synthetic(&st->node, &st->proto, owner, st->def->op_type);
		for (int i = 0; i < st->n_params; i++) {
			onnx__attribute_proto__init(&st->attrs[i]);
			st->attrs[i].name = (char *)st->param_names[i];
			st->attrs[i].has_type = 1;
			st->attrs[i].type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
			st->attrs[i].has_f = 1;
			st->attrs[i].f = st->params[i];
			st->attr_list[i] = &st->attrs[i];
		}
		st->proto.n_attribute = (size_t)st->n_params;
		st->proto.attribute = st->attr_list;
		if (!st->node.op)
			return tern_node_errorf(owner, TERN_EDATA, "step %d (%s) has no kernel", s, st->def->op_type);
		for (int a = 0; a < st->n_args; a++) {
			fx_ref r = st->args[a];
			if (r.kind == REF_STEP && (r.index < 0 || r.index >= s))
				return tern_node_errorf(owner, TERN_EDATA,
				                        "step %d reads step %d, which does not come before it", s,
				                        r.index);
			if (r.kind != REF_INPUT || fx_operand_of(pg, r.index) >= 0)
				continue;
			if (r.index < 0 || r.index >= n_in || !in[r.index])
				return tern_node_errorf(owner, TERN_EDATA, "step %d reads input %d, which is missing",
				                        s, r.index);
			const tern_tensor *t = in[r.index];
			if (t->dtype != TERN_FLOAT)
				return tern_node_errorf(owner, TERN_EDATA,
				                        "input %d is %s; fused elementwise programs run on float",
				                        r.index, tern_dtype_name(t->dtype));
			if (pg->n_operands == FX_MAX_OPERANDS)
				return tern_node_errorf(owner, TERN_EDATA,
				                        "too many operands in a fused elementwise program");
			fx_operand *o = &pg->operands[pg->n_operands];
			o->input = r.index;
			if (!fx_classify(t->rank, t->dims, x_shape->rank, x_shape->dims, o)) {
				char sa[128], sb[128];
				return tern_node_errorf(
				        owner, TERN_EDATA,
				        "input %d %s does not broadcast to %s along one run of "
				        "dimensions",
				        r.index, tern_shape_str(t->dtype, t->rank, t->dims, sa, sizeof sa),
				        tern_shape_str(x_shape->dtype, x_shape->rank, x_shape->dims, sb, sizeof sb));
			}
			pg->n_operands++;
		}
	}
	if (!pg->n_steps)
		return tern_node_errorf(owner, TERN_EDATA, "an empty elementwise program");
	/* Blocks of whole periods of the first broadcast operand, so that its gathered register is filled
	 * once per worker. */
	pg->block = FX_BLOCK;
	for (int i = 0; i < pg->n_operands; i++)
		if (pg->operands[i].mode == MODE_GATHER) {
			int64_t period = pg->operands[i].inner * pg->operands[i].span;
			if (period <= FX_BLOCK)
				pg->block = FX_BLOCK / period * period;
			break;
		}
	if (pg->numel < pg->block)
		pg->block = pg->numel ? pg->numel : 1;
	int64_t blocks = (pg->numel + pg->block - 1) / pg->block;
	pg->workers = tern_threadpool_size(pool);
	if (pg->workers > blocks)
		pg->workers = blocks > 0 ? (int)blocks : 1;
	tern_status st = fx_allocate(pg, owner);
	if (st)
		return st;
	fx_find_silu(pg);
	return fx_prepare_steps(pg, owner, in);
}

static size_t fx_scratch_bytes(const fx_program *pg)
{
	return (size_t)pg->workers * (size_t)pg->n_regs * (size_t)pg->block * sizeof(float);
}

static void fx_program_free(void *p)
{
	fx_program *pg = p;
	if (!pg)
		return;
	for (int s = 0; s < pg->n_steps; s++)
		for (int w = 0; w < 2; w++)
			if (pg->steps[s].prep[w].free_params && pg->steps[s].prep[w].params)
				pg->steps[s].prep[w].free_params(pg->steps[s].prep[w].params);
	free(pg);
}

/* One run of a program: x is read from `x` (may be the output itself), the result written to out. */
typedef struct fx_run {
	const fx_program *pg;
	const tern_node *node;
	const float *x;
	float *out;
	tern_tensor *const *in;
	float *scratch;
	atomic_int status;
} fx_run;

/* Fills dst with the n elements of a broadcast operand that output elements off.. read. */
static void fx_gather(const fx_operand *o, const float *src, float *dst, int64_t off, int64_t n)
{
	if (o->inner == 1) {
		/* Periodic: whole runs of the operand. */
		for (int64_t e = 0, j = off % o->span; e < n; j = 0) {
			int64_t len = o->span - j < n - e ? o->span - j : n - e;
			memcpy(dst + e, src + j, (size_t)len * sizeof *dst);
			e += len;
		}
		return;
	}
	int64_t rem = off % o->inner, j = (off / o->inner) % o->span;
	for (int64_t e = 0; e < n;) {
		int64_t len = o->inner - rem < n - e ? o->inner - rem : n - e;
		float v = src[j];
		for (int64_t k = 0; k < len; k++)
			dst[e + k] = v;
		e += len;
		rem = 0;
		j = j + 1 == o->span ? 0 : j + 1;
	}
}

/* What a worker's gathered registers hold: the phase and length of the block they were filled for. */
typedef struct fx_filled {
	int64_t phase[FX_MAX_OPERANDS], n[FX_MAX_OPERANDS];
} fx_filled;

static tern_status fx_block_run(const fx_run *r, float *regs, fx_filled *filled, int64_t off, int64_t n)
{
	const fx_program *pg = r->pg;
	int which = n == pg->block ? 0 : 1;
	fx_block b;
	fx_view(&b.x, r->x + off, n);
	fx_view(&b.out, r->out + off, n);
	for (int k = 0; k < pg->n_regs; k++)
		fx_view(&b.regs[k], regs + (size_t)k * (size_t)pg->block, n);
	for (int c = 0; c < pg->n_consts; c++)
		fx_view(&b.consts[c], &pg->consts[c], -1);
	for (int i = 0; i < pg->n_operands; i++) {
		const fx_operand *o = &pg->operands[i];
		const float *src = r->in[o->input]->data;
		if (o->mode == MODE_SCALAR) {
			fx_view(&b.operands[i], src, -1);
		} else if (o->mode == MODE_FULL) {
			fx_view(&b.operands[i], src + off, n);
		} else {
			/* Blocks are whole periods when they can be: then one fill serves every block. */
			int64_t phase = off % (o->inner * o->span);
			if (filled->phase[i] != phase || filled->n[i] != n) {
				fx_gather(o, src, b.regs[o->reg].data, off, n);
				filled->phase[i] = phase;
				filled->n[i] = n;
			}
			b.operands[i] = b.regs[o->reg];
		}
	}
	for (int s = 0; s < pg->n_steps; s++) {
		const fx_step *st = &pg->steps[s];
		if (st->skip)
			continue;
		tern_tensor *args[FX_MAX_ARGS];
		for (int a = 0; a < st->n_args; a++)
			args[a] = fx_resolve(&b, pg, st->args[a]);
		tern_tensor *dst = st->reg < 0 ? &b.out : &b.regs[st->reg];
		if (st->silu_arg >= 0) {
			tern_sigmoid_f32(args[st->silu_arg]->data, NULL, dst->data, n, true);
			continue;
		}
		tern_kernel_args ka = {&st->node, args, st->n_args, &dst, 1, st->prep[which].params, NULL, NULL, NULL};
		tern_status rc = st->prep[which].kernel(&ka);
		if (rc)
			return rc;
	}
	return TERN_OK;
}

static void fx_worker(void *ctx, int64_t w)
{
	fx_run *r = ctx;
	const fx_program *pg = r->pg;
	int64_t blocks = (pg->numel + pg->block - 1) / pg->block;
	int64_t lo = blocks * w / pg->workers, hi = blocks * (w + 1) / pg->workers;
	float *regs = r->scratch + (size_t)w * (size_t)pg->n_regs * (size_t)pg->block;
	fx_filled filled;
	for (int i = 0; i < FX_MAX_OPERANDS; i++)
		filled.phase[i] = filled.n[i] = -1;
	for (int64_t k = lo; k < hi; k++) {
		int64_t off = k * pg->block, n = pg->numel - off < pg->block ? pg->numel - off : pg->block;
		tern_status rc = fx_block_run(r, regs, &filled, off, n);
		if (rc)
			atomic_store(&r->status, (int)rc);
	}
}

static tern_status fx_program_run(const fx_program *pg, const tern_kernel_args *a, const float *x, float *out,
                                  void *scratch)
{
	if (!pg->numel)
		return TERN_OK;
	fx_run r = {pg, a->node, x, out, a->in, scratch, TERN_OK};
	if (pg->workers > 1)
		tern_parallel_for(a->pool, pg->workers, fx_worker, &r);
	else
		fx_worker(&r, 0);
	return (tern_status)atomic_load(&r.status);
}

/* ---------------------------------------------------------------- a main operator plus an epilogue */

/* The main operator's kernel, run with the first n_main inputs, then the epilogue over its output. */
typedef struct fx_fused {
	tern_kernel_fn kernel;
	void *params;
	void (*free_params)(void *);
	int n_main;
	size_t main_scratch; /* the epilogue's registers follow, aligned */
	fx_program *pg; /* NULL: no epilogue */
} fx_fused;

static void fx_fused_free(void *p)
{
	fx_fused *f = p;
	if (!f)
		return;
	if (f->free_params && f->params)
		f->free_params(f->params);
	fx_program_free(f->pg);
	free(f);
}

static size_t fx_round(size_t n)
{
	return (n + TERN_ALIGN - 1) / TERN_ALIGN * TERN_ALIGN;
}

static tern_status fx_fused_kernel(const tern_kernel_args *a)
{
	const fx_fused *f = a->params;
	tern_kernel_args inner = *a;
	inner.n_in = f->n_main < a->n_in ? f->n_main : a->n_in;
	inner.params = f->params;
	tern_status st = f->kernel(&inner);
	if (st || !f->pg)
		return st;
	float *y = a->out[0]->data;
	return fx_program_run(f->pg, a, y, y, (char *)a->scratch + f->main_scratch);
}

/* Prepares the default-domain operator op_type on the node's first n_main inputs (the fused node
 * carries that operator's attributes), leaving the epilogue program empty for the caller to fill. */
static tern_status fx_prepare_main(tern_prepare_args *p, const char *op_type, int n_main, fx_fused **out)
{
	*out = NULL;
	const tern_op *op = tern_op_find("", op_type, FX_OPSET);
	if (!op)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no %s kernel to fuse with", op_type);
	if (!p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "output 0 is missing");
	for (int i = 1; i < p->n_out; i++)
		if (p->out[i])
			return tern_node_errorf(p->node, TERN_EDATA, "has one output, not %d", p->n_out);
	tern_prepare_args inner = *p;
	inner.n_in = n_main < p->n_in ? n_main : p->n_in;
	inner.n_out = 1;
	inner.params = NULL;
	inner.free_params = NULL;
	tern_status st = op->prepare(&inner);
	fx_fused *f = calloc(1, sizeof *f);
	if (!f) {
		if (inner.free_params && inner.params)
			inner.free_params(inner.params);
		return fx_oom(p->node);
	}
	f->kernel = inner.kernel;
	f->params = inner.params;
	f->free_params = inner.free_params;
	f->n_main = n_main;
	f->main_scratch = fx_round(inner.scratch_bytes);
	p->packed_inputs |= inner.packed_inputs; /* the main inputs are the first of ours */
	p->params = f;
	p->free_params = fx_fused_free;
	if (st)
		return st;
	if (inner.defer) {
		p->defer = 1;
		return TERN_OK;
	}
	if (!inner.kernel || inner.dynamic_output || inner.alias_input0)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "the %s kernel cannot take an epilogue", op_type);
	if (p->out[0]->dtype != TERN_FLOAT)
		return tern_node_errorf(p->node, TERN_EDATA, "output is %s; fused operators run on float",
		                        tern_dtype_name(p->out[0]->dtype));
	f->pg = calloc(1, sizeof *f->pg);
	if (!f->pg)
		return fx_oom(p->node);
	p->kernel = fx_fused_kernel;
	*out = f;
	return TERN_OK;
}

/* Completes the epilogue once its steps are in; none at all leaves the main kernel alone. */
static tern_status fx_prepare_epilogue(tern_prepare_args *p, fx_fused *f)
{
	if (!f->pg->n_steps) {
		free(f->pg);
		f->pg = NULL;
		p->scratch_bytes = f->main_scratch;
		return TERN_OK;
	}
	tern_status st = fx_finish(f->pg, p->node, p->in, p->n_in, p->out[0], p->pool);
	if (st)
		return st;
	p->scratch_bytes = f->main_scratch + fx_scratch_bytes(f->pg);
	return TERN_OK;
}

/* The main operator on the first n_main inputs, then: a scale by the `alpha` attribute when `scaled`,
 * input add_input added when present (-1: none), and the activation. */
static tern_status fx_prepare_fused(tern_prepare_args *p, const char *main_op, int n_main, bool scaled, int add_input)
{
	fx_fused *f;
	tern_status st = fx_prepare_main(p, main_op, n_main, &f);
	if (st || !f)
		return st;
	fx_ref x = {REF_X, 0};
	float alpha = scaled ? tern_attr_float(p->node, "alpha", 1.0f) : 1.0f;
	if (alpha != 1.0f && (st = fx_then(f->pg, p->node, "Mul", &x, fx_const(f->pg, alpha))))
		return st;
	if (add_input >= 0 && p->n_in > add_input && p->in[add_input] &&
	    (st = fx_then(f->pg, p->node, "Add", &x, (fx_ref){REF_INPUT, add_input})))
		return st;
	if ((st = fx_node_activation(f->pg, p->node, x)))
		return st;
	return fx_prepare_epilogue(p, f);
}

/* tern.FusedConv (X, W, [B], [Z]): activation(Conv(X, W, B) + Z), Z of the output's shape. The convolution
 * applies Z and the activation itself as it stores its outputs when it can. */
static tern_status fused_conv_prepare(tern_prepare_args *p)
{
	tern_status st = tern_fused_conv_prepare(p);
	if (st || p->kernel)
		return st;
	return fx_prepare_fused(p, "Conv", 3, false, 3);
}

/* tern.FusedGemm (A, B, [C]): activation(Gemm(A, B, C)) with Gemm's attributes. */
static tern_status fused_gemm_prepare(tern_prepare_args *p)
{
	return fx_prepare_fused(p, "Gemm", 3, false, -1);
}

/* tern.FusedMatMul (A, B, [bias]): activation(alpha * MatMul(A, B) + bias). */
static tern_status fused_matmul_prepare(tern_prepare_args *p)
{
	tern_status st = tern_fused_matmul_prepare(p);
	if (st || p->kernel)
		return st;
	return fx_prepare_fused(p, "MatMul", 2, true, 2);
}

/* ---------------------------------------------------------------- programs on their own */

static tern_status fx_chain_kernel(const tern_kernel_args *a)
{
	const fx_program *pg = a->params;
	return fx_program_run(pg, a, a->in[0]->data, a->out[0]->data, a->scratch);
}

static tern_status fx_chain_setup(tern_prepare_args *p, fx_program **out)
{
	*out = NULL;
	if (p->n_in < 1 || !p->in[0] || !p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 and output 0 are required");
	if (p->in[0]->dtype != TERN_FLOAT)
		return tern_node_errorf(p->node, TERN_EDATA, "input 0 is %s; fused elementwise programs run on float",
		                        tern_dtype_name(p->in[0]->dtype));
	fx_program *pg = calloc(1, sizeof *pg);
	if (!pg)
		return fx_oom(p->node);
	p->params = pg;
	p->free_params = fx_program_free;
	tern_set_shape(p->out[0], TERN_FLOAT, p->in[0]->rank, p->in[0]->dims);
	*out = pg;
	return TERN_OK;
}

static tern_status fx_chain_finish(tern_prepare_args *p, fx_program *pg)
{
	tern_status st = fx_finish(pg, p->node, p->in, p->n_in, p->in[0], p->pool);
	if (st)
		return st;
	p->kernel = fx_chain_kernel;
	p->scratch_bytes = fx_scratch_bytes(pg);
	return TERN_OK;
}

/* tern.ElementwiseChain (X, operands...): attribute `ops` names each step's operator, `args` gives
 * FX_MAX_ARGS references per step (k < inputs: input k, where input 0 is X; inputs + j: step j's
 * result; -1: none) and `params` two floats per step, the values of the operator's attributes (alpha,
 * beta; NaN: the default; ignored by operators without them). The output, the
 * last step's result, has X's shape; operands broadcast into it. */
static tern_status chain_prepare(tern_prepare_args *p)
{
	fx_program *pg;
	tern_status st = fx_chain_setup(p, &pg);
	if (st)
		return st;
	const Onnx__AttributeProto *ops = tern_attr(p->node, "ops");
	size_t n_args = 0, n_params = 0;
	const int64_t *args = tern_attr_ints(p->node, "args", &n_args);
	const float *params = tern_attr_floats(p->node, "params", &n_params);
	size_t n_ops = ops ? ops->n_strings : 0;
	if (!n_ops || n_args != n_ops * FX_MAX_ARGS || (n_params && n_params != n_ops * 2))
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "attributes 'ops' (%zu), 'args' (%zu) and 'params' (%zu) do not "
		                        "describe the same steps",
		                        n_ops, n_args, n_params);
	for (size_t s = 0; s < n_ops; s++) {
		char name[32];
		const ProtobufCBinaryData *nm = &ops->strings[s];
		snprintf(name, sizeof name, "%.*s", (int)(nm->len < 31 ? nm->len : 31), (const char *)nm->data);
		fx_ref refs[FX_MAX_ARGS];
		int n = 0;
		for (int k = 0; k < FX_MAX_ARGS; k++) {
			int64_t r = args[s * FX_MAX_ARGS + (size_t)k];
			if (r < 0)
				break;
			refs[n++] = r == 0    ? (fx_ref){REF_X, 0}
			        : r < p->n_in ? (fx_ref){REF_INPUT, (int)r}
			                      : (fx_ref){REF_STEP, (int)(r - p->n_in)};
		}
		if ((st = fx_add_step(pg, p->node, name, params ? params + 2 * s : NULL, params ? 2 : 0, refs, n)))
			return st;
	}
	return fx_chain_finish(p, pg);
}

/* tern.Gelu (X): 0.5 x (1 + erf(x / sqrt(2))), or with approximate = "tanh" the tanh form (as the
 * opset-20 Gelu). */
static tern_status gelu_prepare(tern_prepare_args *p)
{
	fx_program *pg;
	tern_status st = fx_chain_setup(p, &pg);
	if (st)
		return st;
	const char *approx = tern_attr_string(p->node, "approximate", "none");
	if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
		return tern_node_errorf(p->node, TERN_EDATA, "attribute 'approximate' is '%s', not none or tanh",
		                        approx);
	if ((st = fx_add_activation(pg, p->node, approx[0] == 't' ? "GeluTanh" : "Gelu", NULL, 0, (fx_ref){REF_X, 0})))
		return st;
	return fx_chain_finish(p, pg);
}

/* ---------------------------------------------------------------- Add + LayerNormalization */

typedef struct fx_skip_ln {
	int64_t rows, cols; /* the float path */
	float eps;
	int chunks;
	fx_prepared add, norm;
	size_t add_scratch, norm_scratch, sum_offset; /* the sum lives in scratch unless output 1 holds it */
	tern_node add_node;
	Onnx__NodeProto add_proto;
	tern_tensor sum_shape;
} fx_skip_ln;

static void fx_skip_ln_free(void *p)
{
	fx_skip_ln *s = p;
	if (!s)
		return;
	if (s->add.free_params && s->add.params)
		s->add.free_params(s->add.params);
	if (s->norm.free_params && s->norm.params)
		s->norm.free_params(s->norm.params);
	free(s);
}

static tern_status skip_ln_kernel(const tern_kernel_args *a)
{
	const fx_skip_ln *s = a->params;
	tern_tensor sum = s->sum_shape;
	bool keep = a->n_out > 1 && a->out[1];
	sum.data = keep ? a->out[1]->data : (char *)a->scratch + s->sum_offset;
	tern_tensor *sum_p = &sum;
	tern_kernel_args add = {&s->add_node, a->in, 2, &sum_p, 1, s->add.params, a->scratch, a->pool, a->exec};
	tern_status st = s->add.kernel(&add);
	if (st)
		return st;
	tern_tensor *norm_in[3] = {&sum, a->in[2], a->n_in > 3 ? a->in[3] : NULL};
	tern_kernel_args norm = {a->node, norm_in, 3, a->out, 1, s->norm.params, a->scratch, a->pool, a->exec};
	return s->norm.kernel(&norm);
}

/* By pointer: a vector argument would be passed differently by the AVX2 clone of the caller and by
 * this baseline function. */
static float fx_lanes_sum(const fx_vf8 *v)
{
	float l[8];
	memcpy(l, v, sizeof l);
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* One row of the float path: t = x + s (kept in sum, or in y), then its mean and variance in two
 * passes over the row while it sits in L1, then y = (t - mean) / sqrt(var + eps) * g + b. */
TERN_ISA_BODY void skip_ln_row_body(const float *x, const float *s, const float *g, const float *b, float *y, float *sum,
                                  int64_t n, float eps)
{
	float *t = sum ? sum : y;
	fx_vf8 acc = {0};
	int64_t i = 0, v8 = n / 8 * 8;
	for (; i < v8; i += 8) {
		fx_vf8 u, w;
		memcpy(&u, x + i, sizeof u);
		memcpy(&w, s + i, sizeof w);
		u += w;
		memcpy(t + i, &u, sizeof u);
		acc += u;
	}
	float total = fx_lanes_sum(&acc);
	for (; i < n; i++) {
		t[i] = x[i] + s[i];
		total += t[i];
	}
	float mean = total / (float)n;
	fx_vf8 sq = {0};
	for (i = 0; i < v8; i += 8) {
		fx_vf8 u;
		memcpy(&u, t + i, sizeof u);
		u -= mean;
		sq += u * u;
	}
	float var = fx_lanes_sum(&sq);
	for (; i < n; i++)
		var += (t[i] - mean) * (t[i] - mean);
	float inv = 1.0f / sqrtf(var / (float)n + eps);
	for (i = 0; i < n; i++)
		y[i] = (t[i] - mean) * inv * g[i] + (b ? b[i] : 0.0f);
}
TERN_ISA_VARIANTS2(void, skip_ln_row, (const float *x, const float *s, const float *g, const float *b, float *y, float *sum, int64_t n, float eps), (x, s, g, b, y, sum, n, eps))

typedef struct fx_skip_rows {
	const tern_kernel_args *a;
	const fx_skip_ln *s;
} fx_skip_rows;

static void skip_ln_chunk(void *ctx, int64_t chunk)
{
	const fx_skip_rows *c = ctx;
	const fx_skip_ln *s = c->s;
	const tern_kernel_args *a = c->a;
	const float *x = a->in[0]->data, *sk = a->in[1]->data, *g = a->in[2]->data;
	const float *b = a->n_in > 3 && a->in[3] ? a->in[3]->data : NULL;
	float *y = a->out[0]->data, *sum = a->n_out > 1 && a->out[1] ? a->out[1]->data : NULL;
	int64_t lo = s->rows * chunk / s->chunks, hi = s->rows * (chunk + 1) / s->chunks;
	for (int64_t r = lo; r < hi; r++)
		skip_ln_row(x + r * s->cols, sk + r * s->cols, g, b, y + r * s->cols, sum ? sum + r * s->cols : NULL,
		            s->cols, s->eps);
}

static tern_status skip_ln_fast_kernel(const tern_kernel_args *a)
{
	fx_skip_rows c = {a, a->params};
	if (c.s->chunks > 1)
		tern_parallel_for(a->pool, c.s->chunks, skip_ln_chunk, &c);
	else
		skip_ln_chunk(&c, 0);
	return TERN_OK;
}

/* The float path: X and S of one shape, scale and B one value per normalised element. */
static bool skip_ln_fast(tern_prepare_args *p, fx_skip_ln *s)
{
	const tern_tensor *x = p->in[0], *sk = p->in[1], *g = p->in[2], *b = p->n_in > 3 ? p->in[3] : NULL;
	int64_t axis = tern_attr_int(p->node, "axis", -1);
	axis += axis < 0 ? x->rank : 0;
	if (axis < 0 || axis >= x->rank || x->dtype != TERN_FLOAT || sk->dtype != TERN_FLOAT ||
	    g->dtype != TERN_FLOAT || (b && b->dtype != TERN_FLOAT) || tern_tensor_numel(sk) != tern_tensor_numel(x))
		return false;
	if (sk->rank != x->rank || memcmp(sk->dims, x->dims, (size_t)x->rank * sizeof x->dims[0]) != 0)
		return false;
	s->cols = tern_numel(x->rank - (int)axis, x->dims + axis);
	s->rows = s->cols ? tern_tensor_numel(x) / s->cols : 0;
	if (!s->cols || tern_tensor_numel(g) != s->cols || (b && tern_tensor_numel(b) != s->cols))
		return false;
	s->eps = tern_attr_float(p->node, "epsilon", 1e-5f);
	/* Rows worth handing to another thread: a few thousand elements each. */
	int64_t per = 4096 / s->cols + 1;
	s->chunks = (int)((s->rows + per - 1) / per);
	if (s->chunks > tern_threadpool_size(p->pool))
		s->chunks = tern_threadpool_size(p->pool);
	if (s->chunks < 1)
		s->chunks = 1;
	tern_set_shape(p->out[0], x->dtype, x->rank, x->dims);
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], x->dtype, x->rank, x->dims);
	p->kernel = skip_ln_fast_kernel;
	return true;
}

/* tern.SkipLayerNormalization (X, S, scale, [B]) -> (Y, [sum]): LayerNormalization(X + S) with
 * LayerNormalization's axis and epsilon; output 1, when present, is X + S. */
static tern_status skip_ln_prepare(tern_prepare_args *p)
{
	const tern_op *ln_op = tern_op_find("", "LayerNormalization", FX_OPSET);
	if (!ln_op)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no Add or LayerNormalization kernel to fuse");
	if (p->n_in < 3 || !p->in[0] || !p->in[1] || !p->in[2] || !p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "inputs X, S and scale and output Y are required");
	fx_skip_ln *s = calloc(1, sizeof *s);
	if (!s)
		return fx_oom(p->node);
	p->params = s;
	p->free_params = fx_skip_ln_free;
	if (skip_ln_fast(p, s))
		return TERN_OK;
	fx_synthetic(&s->add_node, &s->add_proto, p->node, "Add");
	tern_tensor *sum_p = &s->sum_shape;
	tern_prepare_args add = {
	        .node = &s->add_node, .in = p->in, .n_in = 2, .out = &sum_p, .n_out = 1, .pool = p->pool};
	if (!s->add_node.op)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no Add kernel to fuse");
	tern_status st = s->add_node.op->prepare(&add);
	s->add = (fx_prepared){add.kernel, add.params, add.free_params};
	if (st)
		return st;
	const tern_tensor *x = p->in[0];
	if (add.defer || !add.kernel || s->sum_shape.rank != x->rank ||
	    memcmp(s->sum_shape.dims, x->dims, (size_t)x->rank * sizeof x->dims[0]) != 0)
		return tern_node_errorf(p->node, TERN_EDATA, "input 1 'S' must broadcast to input 0's shape");
	tern_tensor *norm_in[3] = {&s->sum_shape, p->in[2], p->n_in > 3 ? p->in[3] : NULL};
	tern_prepare_args norm = {
	        .node = p->node, .in = norm_in, .n_in = 3, .out = p->out, .n_out = 1, .pool = p->pool};
	st = ln_op->prepare(&norm);
	s->norm = (fx_prepared){norm.kernel, norm.params, norm.free_params};
	if (st)
		return st;
	if (norm.defer || !norm.kernel)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "the LayerNormalization kernel cannot be fused");
	if (p->n_out > 1 && p->out[1])
		tern_set_shape(p->out[1], x->dtype, x->rank, x->dims);
	s->add_scratch = add.scratch_bytes;
	s->norm_scratch = norm.scratch_bytes;
	size_t shared = s->add_scratch > s->norm_scratch ? s->add_scratch : s->norm_scratch;
	s->sum_offset = fx_round(shared);
	p->scratch_bytes = s->sum_offset + (size_t)tern_tensor_numel(x) * tern_dtype_size(x->dtype);
	p->kernel = skip_ln_kernel;
	return TERN_OK;
}

/* ---------------------------------------------------------------- attention */

typedef struct fx_attention {
	int64_t l, s, n, d, dv; /* Q [l, n, d], K [s, n, d], V [s, n, dv] */
	float scale;
	int workers;
	bool direct; /* attention_head_avx512 runs the heads */
	tern_node softmax_node;
	Onnx__NodeProto softmax_proto;
	fx_prepared softmax;
	size_t softmax_scratch, per_worker; /* bytes of scratch per worker: scores, weights, softmax's own */
} fx_attention;

static void fx_attention_free(void *p)
{
	fx_attention *at = p;
	if (at && at->softmax.free_params && at->softmax.params)
		at->softmax.free_params(at->softmax.params);
	free(at);
}

typedef struct fx_attention_run {
	const fx_attention *at;
	const tern_kernel_args *a;
	atomic_int status;
} fx_attention_run;

/* The heads of one worker: scores = scale Q_h K_h^T, softmax over each row, then weights V_h written
 * straight into the output's [l, n, dv] layout; Q_h, K_h and V_h are read where they lie, as every
 * n-th row segment. */
#if defined(__x86_64__) && defined(__GNUC__)
#define ATT_ROWS 4 /* query rows at a time */
#define AVX512 __attribute__((target("avx512f")))

/* The softmax of n scores (n a multiple of 16) in place, unnormalised; returns 1 / their sum. */
AVX512 static float attention_softmax_row(float *restrict row, int64_t n)
{
	__m512 m = _mm512_loadu_ps(row);
	for (int64_t s = 16; s < n; s += 16)
		m = _mm512_max_ps(m, _mm512_loadu_ps(row + s));
	const float max = _mm512_reduce_max_ps(m);
	for (int64_t s = 0; s < n; s++)
		row[s] = tern_fast_expf(row[s] - max);
	__m512 sum = _mm512_setzero_ps();
	for (int64_t s = 0; s < n; s += 16)
		sum = _mm512_add_ps(sum, _mm512_loadu_ps(row + s));
	return 1.0f / _mm512_reduce_add_ps(sum);
}

/* Rows r < nr of C (ldc apart, columns [0, n), n a multiple of 16) = mul[r] * sum over t < T of
 * a[r][t] * B row t (ldb apart): ATT_ROWS rows by two blocks of sixteen columns at a time, the sums in
 * registers. Rows of a beyond nr must still be readable (they are computed and dropped). */
AVX512 static void attention_rows_times(const float *const a[ATT_ROWS], int nr, int64_t T, const float *b, int64_t ldb,
                                        int64_t n, const float mul[ATT_ROWS], float *c, int64_t ldc)
{
	for (int64_t x = 0; x < n; x += 32) {
		const bool two = x + 16 < n;
		__m512 a0[ATT_ROWS], a1[ATT_ROWS];
		for (int r = 0; r < ATT_ROWS; r++)
			a0[r] = a1[r] = _mm512_setzero_ps();
		for (int64_t t = 0; t < T; t++) {
			const __m512 b0 = _mm512_loadu_ps(b + t * ldb + x);
			const __m512 b1 = two ? _mm512_loadu_ps(b + t * ldb + x + 16) : b0;
			for (int r = 0; r < ATT_ROWS; r++) {
				const __m512 ar = _mm512_set1_ps(a[r][t]);
				a0[r] = _mm512_fmadd_ps(ar, b0, a0[r]);
				a1[r] = _mm512_fmadd_ps(ar, b1, a1[r]);
			}
		}
		for (int r = 0; r < nr; r++) {
			const __m512 m = _mm512_set1_ps(mul[r]);
			_mm512_storeu_ps(c + r * ldc + x, _mm512_mul_ps(a0[r], m));
			if (two)
				_mm512_storeu_ps(c + r * ldc + x + 16, _mm512_mul_ps(a1[r], m));
		}
	}
}

/* One head with s, d and dv multiples of 16: K_h transposed into kt (d x s) sixteen by sixteen in
 * registers, then for ATT_ROWS query rows at a time the scaled scores Q K^T, the softmax of each row
 * and the weighted sums of V's rows. rows: ATT_ROWS x s floats. */
AVX512 static void attention_head_avx512(const fx_attention *at, const float *q, const float *k, const float *v,
                                         float *out, float *restrict kt, float *restrict rows)
{
	const int64_t L = at->l, S = at->s, D = at->d, ldk = at->n * at->d, ldv = at->n * at->dv;
	for (int64_t s0 = 0; s0 < S; s0 += 16)
		for (int64_t d0 = 0; d0 < D; d0 += 16) {
			__m512 r[16];
			for (int i = 0; i < 16; i++)
				r[i] = _mm512_loadu_ps(k + (s0 + i) * ldk + d0);
			tern_tr16(r);
			for (int j = 0; j < 16; j++)
				_mm512_storeu_ps(kt + (d0 + j) * S + s0, r[j]);
		}
	const float scale[ATT_ROWS] = {at->scale, at->scale, at->scale, at->scale};
	for (int64_t i0 = 0; i0 < L; i0 += ATT_ROWS) {
		const int nr = L - i0 < ATT_ROWS ? (int)(L - i0) : ATT_ROWS;
		const float *qr[ATT_ROWS], *pr[ATT_ROWS];
		float inv[ATT_ROWS] = {0};
		for (int r = 0; r < ATT_ROWS; r++) {
			qr[r] = q + (i0 + (r < nr ? r : 0)) * ldk; /* missing rows repeat the first */
			pr[r] = rows + (r < nr ? r : 0) * S;
		}
		attention_rows_times(qr, nr, D, kt, S, S, scale, rows, S);
		for (int r = 0; r < nr; r++)
			inv[r] = attention_softmax_row(rows + r * S, S);
		attention_rows_times(pr, nr, S, v, ldv, at->dv, inv, out + i0 * ldv, ldv);
	}
}
#endif

static void attention_heads(void *ctx, int64_t w)
{
	fx_attention_run *r = ctx;
	const fx_attention *at = r->at;
	const tern_kernel_args *a = r->a;
	const float *q = a->in[0]->data, *k = a->in[1]->data, *v = a->in[2]->data;
	float *out = a->out[0]->data;
	char *scratch = (char *)a->scratch + (size_t)w * at->per_worker;
	float *scores = (float *)scratch, *weights = scores + at->l * at->s;
	void *softmax_scratch = scratch + fx_round((size_t)(2 * at->l * at->s) * sizeof(float));
	int64_t lo = at->n * w / at->workers, hi = at->n * (w + 1) / at->workers;
	int64_t dims[2] = {at->l, at->s};
	tern_tensor st = {TERN_FLOAT, 2, {dims[0], dims[1]}}, wt = st;
	st.data = scores;
	wt.data = weights;
	tern_tensor *sp = &st, *wp = &wt;
#if defined(__x86_64__) && defined(__GNUC__)
	if (at->direct) {
		float *kt = (float *)scratch, *rows = kt + at->d * at->s;
		for (int64_t h = lo; h < hi; h++)
			attention_head_avx512(at, q + h * at->d, k + h * at->d, v + h * at->dv, out + h * at->dv, kt,
			                      rows);
		return;
	}
#endif
	for (int64_t h = lo; h < hi; h++) {
		tern_gemm_f32(false, true, at->l, at->s, at->d, at->scale, q + h * at->d, at->n * at->d, k + h * at->d,
		              at->n * at->d, 0.0f, scores, at->s);
		tern_kernel_args sa = {&at->softmax_node, &sp,  1,   &wp, 1, at->softmax.params,
		                       softmax_scratch,   NULL, NULL};
		tern_status rc = at->softmax.kernel(&sa);
		if (rc) {
			atomic_store(&r->status, (int)rc);
			return;
		}
		tern_gemm_f32(false, false, at->l, at->dv, at->s, 1.0f, weights, at->s, v + h * at->dv, at->n * at->dv,
		              0.0f, out + h * at->dv, at->n * at->dv);
	}
}

static tern_status attention_kernel(const tern_kernel_args *a)
{
	fx_attention_run r = {a->params, a, TERN_OK};
	if (r.at->workers > 1)
		tern_parallel_for(a->pool, r.at->workers, attention_heads, &r);
	else
		attention_heads(&r, 0);
	return (tern_status)atomic_load(&r.status);
}

/* tern.Attention (Q, K, V): multi-head scaled dot-product attention on sequence-major tensors, Q
 * [L, N, d], K [S, N, d], V [S, N, dv] with N the batch times the heads; output [L, N, dv] with
 * out[l, n] = sum over s of softmax_s(scale Q[l, n] . K[s, n]) V[s, n]. Attribute `scale` (default 1). */
static tern_status attention_prepare(tern_prepare_args *p)
{
	if (p->n_in < 3 || !p->in[0] || !p->in[1] || !p->in[2] || !p->out[0])
		return tern_node_errorf(p->node, TERN_EDATA, "inputs Q, K and V and the output are required");
	const tern_tensor *q = p->in[0], *k = p->in[1], *v = p->in[2];
	char sq[96], sk[96], sv[96];
	if (q->dtype != TERN_FLOAT || k->dtype != TERN_FLOAT || v->dtype != TERN_FLOAT || q->rank != 3 ||
	    k->rank != 3 || v->rank != 3 || k->dims[0] != v->dims[0] || q->dims[1] != k->dims[1] ||
	    k->dims[1] != v->dims[1] || q->dims[2] != k->dims[2])
		return tern_node_errorf(p->node, TERN_EDATA,
		                        "Q %s, K %s and V %s are not float [L,N,d], [S,N,d], [S,N,dv]",
		                        tern_shape_str(q->dtype, q->rank, q->dims, sq, sizeof sq),
		                        tern_shape_str(k->dtype, k->rank, k->dims, sk, sizeof sk),
		                        tern_shape_str(v->dtype, v->rank, v->dims, sv, sizeof sv));
	fx_attention *at = calloc(1, sizeof *at);
	if (!at)
		return fx_oom(p->node);
	p->params = at;
	p->free_params = fx_attention_free;
	at->l = q->dims[0];
	at->n = q->dims[1];
	at->d = q->dims[2];
	at->s = k->dims[0];
	at->dv = v->dims[2];
	at->scale = tern_attr_float(p->node, "scale", 1.0f);
	fx_synthetic(&at->softmax_node, &at->softmax_proto, p->node, "Softmax");
	if (!at->softmax_node.op)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "no Softmax kernel to fuse");
	tern_tensor scores = {TERN_FLOAT, 2, {at->l, at->s}}, weights = {0};
	tern_tensor *sp = &scores, *wp = &weights;
	tern_prepare_args sm = {.node = &at->softmax_node, .in = &sp, .n_in = 1, .out = &wp, .n_out = 1};
	tern_status st = at->softmax_node.op->prepare(&sm);
	at->softmax = (fx_prepared){sm.kernel, sm.params, sm.free_params};
	if (st)
		return st;
	if (!sm.kernel || sm.defer || sm.dynamic_output || sm.alias_input0)
		return tern_node_errorf(p->node, TERN_EINTERNAL, "the Softmax kernel cannot be fused");
	at->workers = tern_threadpool_size(p->pool);
	if (at->workers > at->n)
		at->workers = at->n > 0 ? (int)at->n : 1;
	at->per_worker = fx_round((size_t)(2 * at->l * at->s) * sizeof(float)) + fx_round(sm.scratch_bytes);
#if defined(__x86_64__) && defined(__GNUC__)
	/* Heads whose sizes are multiples of 16, K^T within 256 KiB: the direct kernel. */
	size_t direct_bytes = (size_t)((at->d + ATT_ROWS) * at->s) * sizeof(float);
	at->direct = tern_isa() == TERN_ISA_AVX512 && at->s % 16 == 0 && at->d % 16 == 0 && at->dv % 16 == 0 &&
	        at->s > 0 && at->d > 0 && at->dv > 0 && direct_bytes <= 262144;
	if (at->direct && fx_round(direct_bytes) > at->per_worker)
		at->per_worker = fx_round(direct_bytes);
#endif
	int64_t dims[3] = {at->l, at->n, at->dv};
	tern_set_shape(p->out[0], TERN_FLOAT, 3, dims);
	p->scratch_bytes = (size_t)at->workers * at->per_worker;
	p->kernel = attention_kernel;
	return TERN_OK;
}

static const tern_op ops[] = {
        {FX_DOMAIN, "FusedConv", 1, 0, fused_conv_prepare, TERN_DT(FLOAT), "fused"},
        {FX_DOMAIN, "FusedGemm", 1, 0, fused_gemm_prepare, TERN_DT(FLOAT), "fused"},
        {FX_DOMAIN, "FusedMatMul", 1, 0, fused_matmul_prepare, TERN_DT(FLOAT), "fused"},
        {FX_DOMAIN, "ElementwiseChain", 1, 0, chain_prepare, TERN_DT(FLOAT), "fused"},
        {FX_DOMAIN, "Gelu", 1, 0, gelu_prepare, TERN_DT(FLOAT), "fused"},
        {FX_DOMAIN, "SkipLayerNormalization", 1, 0, skip_ln_prepare, TERN_DT_FLOATS, "fused"},
        {FX_DOMAIN, "Attention", 1, 0, attention_prepare, TERN_DT(FLOAT), "fused"},
};

const tern_op_table tern_ops_fused = {ops, TERN_ARRAY_LEN(ops)};
