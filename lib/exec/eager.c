/* eager.c — one operator at a time on tensors, with the same kernels a plan uses: constant folding
 * in passes, and later eager execution, call this. */
#include "exec.h"

#include <stdlib.h>

tern_status tern_node_eval(const tern_node *node, tern_tensor *const *inputs, int n_inputs, tern_tensor *outputs,
                           int n_outputs, tern_threadpool *pool)
{
	const tern_op *op = tern_op_find(node->domain, node->op_type, node->opset);
	if (!op)
		return tern_node_errorf(node, TERN_EDATA, "unsupported operator: %s version %lld", node->op_type,
		                        (long long)node->opset);
	if (node->n_subgraphs)
		return tern_node_errorf(node, TERN_EUSAGE, "operators with subgraphs cannot run one at a time");
	tern_tensor **in = calloc((size_t)n_inputs + 1, sizeof *in);
	tern_tensor **out = calloc((size_t)n_outputs + 1, sizeof *out);
	if (!in || !out) {
		free(in);
		free(out);
		return tern_errorf(TERN_EOS, "out of memory");
	}
	for (int i = 0; i < n_inputs; i++)
		in[i] = inputs[i];
	for (int o = 0; o < n_outputs; o++) {
		memset(&outputs[o], 0, sizeof outputs[o]);
		out[o] = o < (int)node->n_outputs && node->outputs[o] ? &outputs[o] : NULL;
	}
	/* Kernels are written for a pool; without one they get a one-thread pool, the --threads 1 case. */
	tern_threadpool *own_pool = NULL;
	if (!pool) {
		tern_status rc0 = tern_threadpool_create(1, &own_pool);
		if (rc0) {
			free(in);
			free(out);
			return rc0;
		}
		pool = own_pool;
	}
	tern_prepare_args p = {0};
	p.node = node;
	p.in = in;
	p.n_in = n_inputs;
	p.out = out;
	p.n_out = n_outputs;
	p.pool = pool;
	tern_status rc = op->prepare(&p);
	if (!rc && p.defer)
		rc = tern_node_errorf(node, TERN_EINTERNAL, "prepare deferred although every input is known");
	void *scratch = NULL;
	for (int o = 0; !rc && o < n_outputs; o++) {
		if (!out[o])
			continue;
		if (p.alias_input0 && o == 0) {
			tern_tensor shape = outputs[0];
			rc = tern_tensor_alloc(&outputs[0], shape.dtype, shape.rank, shape.dims);
			if (!rc && outputs[0].nbytes)
				memcpy(outputs[0].data, in[0]->data, outputs[0].nbytes);
		} else if (!p.dynamic_output || tern_mask_has(p.fixed_outputs, o)) {
			tern_tensor shape = outputs[o];
			rc = tern_tensor_alloc(&outputs[o], shape.dtype, shape.rank, shape.dims);
		}
	}
	if (!rc && p.kernel && !p.alias_input0) {
		if (p.scratch_bytes && !(scratch = tern_aligned_alloc(p.scratch_bytes)))
			rc = tern_errorf(TERN_EOS, "out of memory");
		tern_kernel_args a = {node, in, n_inputs, out, n_outputs, p.params, scratch, pool, NULL};
		if (!rc)
			rc = p.kernel(&a);
	}
	free(scratch);
	if (p.free_params && p.params)
		p.free_params(p.params);
	if (rc)
		for (int o = 0; o < n_outputs; o++)
			tern_tensor_free(&outputs[o]);
	free(in);
	free(out);
	tern_threadpool_free(own_pool);
	return rc;
}
