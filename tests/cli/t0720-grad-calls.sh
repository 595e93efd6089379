#!/bin/sh
# Gradients through If and calls of model-local functions, recursion included (tern-graph(5),
# GRADIENTS OF CALLS): tern-autodiff keeps the forward calls' frames and runs F__grad on them through
# tern.Backward; a Loop's gradient is that of the recursion of its trips. An If in the main graph
# against numpy's SGD, Loops against finite differences; the recursive and the iterative TreeLSTM of
# scripts/make_recursive_models.py against finite differences and PyTorch, and so is one static graph
# unrolled per tree; bad handles refused.
test_description='gradients through If and recursive calls'
. "$(dirname "$0")/test-lib.sh"

test_expect_success PYTHON 'an If: each step differentiates the branch it took' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" if-data . &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 "$TEST_DIRECTORY/data/if-grad.txt" -o if_train.onnx &&
	tern-show if_train.onnx >shown &&
	grep "tern.Backward <wrt = \[\"w\"\]>" shown &&
	grep "^main__if0_then__fwd__grad\|^main__if0_then__grad" shown &&
	tern-run --train -i x=x -i c=c if_train.onnx -o if_trained.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" if-sgd . if_trained.onnx
'

test_expect_success PYTHON 'the training file of a recursive model passes onnx.checker' '
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_treebank.py" --seed 2 --train 12 --dev 2 --test 2 tb >/dev/null &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --hidden 8 m &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 1 m/treelstm-train.txt -o m/sgd1.onnx &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 m/treelstm-train.txt -o m/sgd.onnx &&
	"$TERN_PYTHON" -c "
import onnx
m = onnx.load(\"m/sgd.onnx\")
onnx.checker.check_model(m, full_check=True)
names = sorted(f.name for f in m.functions)
assert \"Node__fwd\" in names and \"Node__grad\" in names, names
"
'

T="-i left=tb/train/left.pb -i right=tb/train/right.pb -i word=tb/train/word.pb -i root=tb/train/root.pb -i label=tb/train/label.pb"

test_expect_success PYTHON 'gradients through the recursion equal finite differences' '
	tern-run --train $T --steps 1 m/sgd1.onnx -o m/step1.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-fd m tb m/sgd1.onnx m/step1.onnx
'

test_expect_success PYTHON 'ten steps, on one thread and two, equal PyTorch autograd' '
	tern-run --train $T --steps 10 m/sgd.onnx -o m/ten.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 10 0.1 m/ten.onnx &&
	tern-run --train --threads 2 $T --steps 10 m/sgd.onnx -o m/ten2.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 10 0.1 m/ten2.onnx
'

test_expect_success PYTHON 'a Loop: its trips (counted, or until a condition) as a recursion, against finite differences' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" loop-data . &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 "$TEST_DIRECTORY/data/loop-grad.txt" -o loop_train.onnx &&
	tern-show loop_train.onnx >shown &&
	grep "^main__loop0_entry__grad" shown &&
	tern-run --train --batch 2 -i x=x.npy -i n=n.npy loop_train.onnx -o loop_trained.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" loop-sgd . loop_trained.onnx
'

test_expect_success PYTHON 'the iterative TreeLSTM (one Loop over the nodes) equals the recursive one and PyTorch' '
	D="-i left=tb/dev/left.pb -i right=tb/dev/right.pb -i word=tb/dev/word.pb -i root=tb/dev/root.pb" &&
	tern-run $D m/treelstm-iter.txt -O iter_out &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --compare m tb/dev iter_out &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 m/treelstm-iter-train.txt -o m/iter.onnx &&
	"$TERN_PYTHON" -c "import onnx; onnx.checker.check_model(onnx.load(\"m/iter.onnx\"), full_check=True)" &&
	tern-run --train $T --steps 10 m/iter.onnx -o m/iter10.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 10 0.1 m/iter10.onnx &&
	tern-run --train --threads 2 $T --steps 10 m/iter.onnx -o m/iter10b.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 10 0.1 m/iter10b.onnx
'

test_expect_success PYTHON 'level-by-level batching (one Loop over the heights) equals the recursive TreeLSTM and PyTorch' '
	L="-i level_order=tb/dev/level_order.pb -i level_starts=tb/dev/level_starts.pb" &&
	tern-run -i left=tb/dev/left.pb -i right=tb/dev/right.pb -i word=tb/dev/word.pb -i root=tb/dev/root.pb $L \
		m/treelstm-levels.txt -O levels_out &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --compare m tb/dev levels_out &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 m/treelstm-levels-train.txt -o m/levels.onnx &&
	tern-run --train $T -i level_order=tb/train/level_order.pb -i level_starts=tb/train/level_starts.pb \
		--steps 10 m/levels.onnx -o m/levels10.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 10 0.1 m/levels10.onnx
'

test_expect_success PYTHON 'one static graph unrolled per tree equals the recursive TreeLSTM and PyTorch' '
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --unroll m tb/dev unrolled &&
	mkdir -p unrolled_out/logits &&
	for e in 0 1; do
		tern-run -i word=unrolled/$e-word.npy unrolled/$e.txt -O unrolled_out/tree &&
		mv unrolled_out/tree/logits.npy unrolled_out/logits/$e.npy || return 1
	done &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --compare m tb/dev unrolled_out &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --unroll --train --first 1 m tb/train unrolled_train &&
	tern-autodiff --loss-output loss --optimizer sgd --lr 0.1 unrolled_train/0.txt -o unrolled_train/0.onnx &&
	tern-run --train -i word=unrolled_train/0-word.npy -i label=unrolled_train/0-label.npy --steps 1 \
		unrolled_train/0.onnx -o unrolled_train/step1.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/recursive-grad.py" tree-torch m tb 1 0.1 unrolled_train/step1.onnx
'

test_expect_success 'the gradient of a Loop with scan outputs: one line, exit 65' '
	cat >scan.txt <<-\EOT &&
	<ir_version: 8, opset_import: ["" : 17]>
	g (float[4] x) => (float loss)
	   <float[4] w = {0.5, 1.0, 1.5, -0.5}>
	{
	  n = Constant <value = int64 {2}> ()
	  t = Constant <value = bool {1}> ()
	  y, ys = Loop (n, t, x) <body = b (int64 k, bool c, float[4] a) => (bool co, float[4] a2, float[4] s) {
	    co = Identity (c)
	    a2 = Mul (a, w)
	    s = Identity (a2)
	  }>
	  loss = ReduceSum <keepdims = 0> (y)
	}
	EOT
	test_expect_code 65 tern-autodiff --loss-output loss scan.txt -o scan.onnx 2>err &&
	test_one_error_line tern-autodiff err && grep "Loop with scan outputs" err &&
	test_path_is_missing scan.onnx
'

test_expect_success 'a handle that names no kept call: one line, exit 65' '
	cat >bad.txt <<-\EOT &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	g (int64 h) => (float y) {
	   y = tern.Saved <value = "x"> (h)
	}
	EOT
	"$TERN_PYTHON" -c "import numpy as np; np.save(\"h.npy\", np.array(7, np.int64))" &&
	test_expect_code 65 tern-run -i h=h.npy bad.txt 2>err &&
	test_one_error_line tern-run err && grep "names no call kept in this run" err
'

test_done
