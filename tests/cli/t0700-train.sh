#!/bin/sh
# tern-autodiff and tern-run --train: a regression that learns its weights, the training algorithm
# as ONNX sees it, checkpoints that resume bit-identically, logs, and one clear error for every kind
# of bad input with nothing left behind.
test_description='training'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'set up a linear model' '
	cat >lin.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	lin (float[N,3] x) => (float[N,2] y)
	   <float[3,2] w = {0,0,0,0,0,0}, float[2] b = {0,0}>
	{
	   y = Gemm (x, w, b)
	}
	EOF
	npy 2,3 1 2 3 4 5 6 >x2.npy
'

test_expect_success PYTHON 'and data from known weights' '
	"$TERN_PYTHON" -c "
import numpy as np
r = np.random.default_rng(0)
x = r.standard_normal((96, 3)).astype(np.float32)
w = np.array([[1, -2], [0.5, 3], [-1, 0.25]], np.float32)
np.save(\"x.npy\", x)
np.save(\"t.npy\", (x @ w + np.array([0.5, -1], np.float32)).astype(np.float32))
np.save(\"x_short.npy\", x[:50])
"
'

test_expect_success PYTHON 'tern-autodiff adds a training algorithm that onnx accepts and the inference graph intact' '
	tern-autodiff --loss mse --optimizer sgd --lr 0.1 --momentum 0.9 lin.txt -o train.onnx &&
	tern-show -f stats train.onnx >stats &&
	grep "^training  *2 parameters (8 values" stats &&
	grep "^optimizer  *tern.SGD momentum=0.9" stats &&
	"$TERN_PYTHON" -c "
import onnx, onnxruntime as ort, numpy as np
m = onnx.load(\"train.onnx\")
onnx.checker.check_model(m, full_check=True)
keys = sorted(b.key for b in m.training_info[0].update_binding)
assert keys == [\"b\", \"b.momentum_buffer\", \"tern.step\", \"w\", \"w.momentum_buffer\"], keys
s = ort.InferenceSession(\"train.onnx\", providers=[\"CPUExecutionProvider\"])
y = s.run(None, {\"x\": np.ones((2, 3), np.float32)})[0]
assert np.allclose(y, 0), y
"
'

test_expect_success PYTHON 'tern-run --train learns the weights' '
	tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 16 --epochs 40 --shuffle --log log.jsonl \
		-o trained.onnx 2>err &&
	test "$(wc -l <log.jsonl)" = 240 &&
	grep "^{\"step\": 240, \"epoch\": 40, \"loss\": " log.jsonl &&
	grep "\"samples_per_s\": " log.jsonl | grep -q "\"lr\": 0.1" &&
	"$TERN_PYTHON" -c "
import json, onnx, numpy as np
from onnx import numpy_helper
log = [json.loads(l) for l in open(\"log.jsonl\")]
assert log[-1][\"loss\"] < 1e-4 < log[0][\"loss\"], (log[0], log[-1])
w = {t.name: numpy_helper.to_array(t) for t in onnx.load(\"trained.onnx\").graph.initializer}
assert np.allclose(w[\"w\"], [[1, -2], [0.5, 3], [-1, 0.25]], atol=1e-2), w[\"w\"]
assert np.allclose(w[\"b\"], [0.5, -1], atol=1e-2), w[\"b\"]
assert int(w[\"tern.step\"]) == 240
"
'

test_expect_success PYTHON 'parameters, momentum and the step counter are updated in place' '
	tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 2 -v -o inplace.onnx 2>err &&
	grep "5 of 5 parameters and state tensors updated in place" err
'

test_expect_success PYTHON 'learning-rate schedules are computed in the graph from the step' '
	for sched in step:2:0.5 cosine:4 warmup:4; do
		tern-autodiff --loss mse --lr 1 --lr-schedule $sched lin.txt -o s.onnx &&
		tern-run --train s.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 6 --log $sched.jsonl || return 1
	done &&
	"$TERN_PYTHON" -c "
import json, math
lr = lambda f: [json.loads(l)[\"lr\"] for l in open(f)]
want = {\"step:2:0.5\": [1, 1, .5, .5, .25, .25],
        \"cosine:4\": [(1 + math.cos(math.pi * min(t - 1, 4) / 4)) / 2 for t in range(1, 7)],
        \"warmup:4\": [min(1, t / 4) for t in range(1, 7)]}
for k, w in want.items():
    got = lr(k + \".jsonl\")
    assert all(abs(a - b) < 1e-6 for a, b in zip(got, w)) and len(got) == 6, (k, got, w)
"
'

test_expect_success PYTHON 'a run resumed from its checkpoint ends bit-identical to one never stopped' '
	tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 30 --shuffle --seed 7 -o whole.onnx &&
	tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 13 --shuffle --seed 7 -o half.onnx &&
	tern-run --train half.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 30 --shuffle --seed 7 -o resumed.onnx &&
	cmp whole.onnx resumed.onnx &&
	! cmp -s whole.onnx half.onnx
'

test_expect_success PYTHON 'SIGINT finishes the step, writes the model and exits 130; SIGTERM 143' '
	for sig in INT TERM; do
		rm -f progress.jsonl
		# (alone: "A && B &" would put the whole list, not tern-run, in the background)
		tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 100000000 --log progress.jsonl \
			-o stopped.onnx &
		pid=$!
		while ! test -s progress.jsonl; do sleep 0.1; done &&
		kill -$sig $pid &&
		{ wait $pid; rc=$?; } &&
		{ { test $sig = INT && test $rc = 130; } || { test $sig = TERM && test $rc = 143; }; } &&
		"$TERN_PYTHON" -c "
import onnx
from onnx import numpy_helper
s = {t.name: numpy_helper.to_array(t) for t in onnx.load(\"stopped.onnx\").graph.initializer}[\"tern.step\"]
assert 0 < int(s) < 100000000, s
" || return 1
		rm -f stopped.onnx
	done
'

test_expect_success PYTHON 'a model that has trained to --steps already does nothing' '
	tern-run --train whole.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 30 -o again.onnx 2>err &&
	grep "nothing to do" err &&
	cmp whole.onnx again.onnx
'

test_expect_success PYTHON 'a diverging loss stops naming the step, writing nothing (65)' '
	tern-autodiff --loss mse --lr 1e6 lin.txt -o wild.onnx &&
	test_expect_code 65 tern-run --train wild.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 50 -o wild-out.onnx 2>err &&
	test "$(wc -l <err)" = 1 &&
	grep "step [0-9]* (epoch 1): the loss is inf" err &&
	! test -e wild-out.onnx
'

test_expect_success PYTHON 'bad data is one line: samples that disagree, a batch too big, a missing target' '
	test_expect_code 65 tern-run --train train.onnx -i x=x_short.npy -i target=t.npy -o o.onnx 2>err &&
	grep "the -i files disagree on the number of samples" err &&
	test_expect_code 64 tern-run --train train.onnx -i x=x.npy -i target=t.npy --batch 500 -o o.onnx 2>err &&
	grep "batch 500 is larger than the 96 samples" err &&
	test_expect_code 65 tern-run --train train.onnx -i x=x.npy -o o.onnx 2>err &&
	grep "input .target. has no data" err &&
	! test -e o.onnx
'

test_expect_success 'tern-run --train on a model without a training algorithm (65)' '
	test_expect_code 65 tern-run --train lin.txt -i x=x2.npy 2>err &&
	test "$(wc -l <err)" = 1 &&
	grep "has no training algorithm; make one with tern-autodiff" err
'

test_expect_success 'tern-autodiff refuses what it cannot train (65, nothing written)' '
	cat >nothing.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	g (float[2] x) => (float[2] y) {
	   y = Identity (x)
	}
	EOF
	test_expect_code 65 tern-autodiff nothing.txt -o n.onnx 2>err &&
	grep "no trainable parameter" err &&
	test_expect_code 65 tern-autodiff --loss-output y lin.txt -o n.onnx 2>err &&
	grep "is not a scalar" err &&
	cat >mm.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	mm (float[1,1,4,4] x) => (float[1,2,4,4] y)
	   <float[2,1,1,1] w = {1,-1}, float[2] b = {1,-1}>
	{
	   c = Conv (x, w, b)
	   y = Relu (c)
	}
	EOF
	tern-optimize mm.txt -o fused.onnx &&
	tern-show fused.onnx | grep "tern\." &&
	test_expect_code 65 tern-autodiff --loss mse fused.onnx -o n.onnx 2>err &&
	grep "no gradient rule for .* (a fused operator: run tern-autodiff before tern-optimize -O2)" err &&
	test_expect_code 64 tern-autodiff --optimizer rmsprop lin.txt -o n.onnx 2>err &&
	grep "unknown optimizer" err &&
	! test -e n.onnx
'

test_expect_success PYTHON 'tern-optimize | tern-schedule | tern-run --train: the step optimised and scheduled, the inference graph kept' '
	tern-autodiff --loss mse --optimizer adam --lr 0.05 lin.txt -o t2.onnx &&
	tern-optimize -v t2.onnx 2>opt.err | tern-schedule -v 2>sched.err >t3.onnx &&
	grep "optimised the training step" opt.err &&
	grep "training step: [0-9]* nodes" sched.err &&
	"$TERN_PYTHON" -c "
import onnx
a, b = onnx.load(\"t2.onnx\"), onnx.load(\"t3.onnx\")
onnx.checker.check_model(b, full_check=True)
nodes = lambda m: [(n.op_type, list(n.input), list(n.output)) for n in m.graph.node]
assert nodes(a) == nodes(b), \"the inference graph changed\"
assert [t.SerializeToString() for t in a.graph.initializer] == [t.SerializeToString() for t in b.graph.initializer]
keys = [p.key for p in b.metadata_props]
assert \"tern.training_schedule\" in keys, keys
assert len(b.training_info[0].algorithm.node) < len(a.training_info[0].algorithm.node), \"nothing optimised\"
" &&
	tern-run --train t2.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 30 --log la.jsonl -o ta.onnx &&
	tern-run --train t3.onnx -i x=x.npy -i target=t.npy --batch 16 --steps 30 --threads 2 --log lb.jsonl -o tb.onnx &&
	"$TERN_PYTHON" -c "
import json, onnx, numpy as np
from onnx import numpy_helper
la = [json.loads(l)[\"loss\"] for l in open(\"la.jsonl\")]
lb = [json.loads(l)[\"loss\"] for l in open(\"lb.jsonl\")]
assert np.allclose(la, lb, rtol=1e-5), (la, lb)
wa = {t.name: numpy_helper.to_array(t) for t in onnx.load(\"ta.onnx\").graph.initializer}
wb = {t.name: numpy_helper.to_array(t) for t in onnx.load(\"tb.onnx\").graph.initializer}
assert all(np.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7) for k in wa), \"parameters differ\"
"
'

test_expect_success PYTHON 'tern-optimize --dim on a training model is refused (64)' '
	test_expect_code 64 tern-optimize --dim N=4 t2.onnx -o t4.onnx 2>err &&
	test_line_count = 1 err && ! test -e t4.onnx
'

test_done
