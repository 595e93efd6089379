#!/bin/sh
# Examples of their own sizes (tern-run(1), EXAMPLES): every input a sequence of examples, a folder of
# 0.npy, 1.npy, ... or an ONNX SequenceProto file; tern-run runs each once, tern-run --train takes one
# a step. A bag-of-words classifier over token lists of 1 to 12 words against numpy.
test_description='examples of their own sizes'
. "$(dirname "$0")/test-lib.sh"

test_expect_success PYTHON 'set up token lists of different lengths' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-examples.py" data 40 8 4 10 3 &&
	tern-autodiff --optimizer sgd --lr 0.1 bow.onnx -o bow_train.onnx
'

test_expect_success PYTHON 'tern-run runs each example once and writes a sequence of outputs' '
	tern-run -i tokens=tokens bow.onnx >printed &&
	grep "^logits seq(10) \[float\[1,4\]" printed &&
	tern-run -i tokens=tokens bow.onnx -O out &&
	tern-run -i tokens=tokens.pb bow.onnx -O out_pb &&
	"$TERN_PYTHON" -c "
import numpy as np, onnx
from onnx import numpy_helper as nh
p = {t.name: nh.to_array(t) for t in onnx.load(\"bow.onnx\").graph.initializer}
for e in range(10):
    tok = np.load(\"tokens/%d.npy\" % e)
    want = p[\"emb\"][tok].mean(axis=1) @ p[\"w\"] + p[\"b\"]
    for d in (\"out\", \"out_pb\"):
        got = np.load(\"%s/logits/%d.npy\" % (d, e))
        assert got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-6), (d, e, got, want)
"
'

test_expect_success PYTHON 'tern-run --train takes one example a step, as numpy does, and resumes' '
	tern-run --train bow_train.onnx -i tokens=tokens -i target=target --steps 25 -o trained.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-examples.py" sgd bow.onnx 25 0.1 ref.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same ref.onnx trained.onnx bow.onnx &&
	tern-run --train bow_train.onnx -i tokens=tokens.pb -i target=target.pb --steps 12 -o half.onnx &&
	tern-run --train half.onnx -i tokens=tokens -i target=target --steps 25 -o resumed.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same ref.onnx resumed.onnx
'

test_expect_success PYTHON 'mixed or mismatched inputs, batches and timing options: one line and a sysexits code' '
	"$TERN_PYTHON" -c "import numpy as np; np.save(\"t9.npy\", np.zeros(9, np.int64))" &&
	mkdir t5 && cp target/0.npy target/1.npy target/2.npy target/3.npy target/4.npy t5/ &&
	test_expect_code 64 tern-run --train bow_train.onnx -i tokens=tokens -i target=target --batch 2 -o x.onnx 2>err &&
	test_one_error_line tern-run err && grep "go one a step: --batch must be 1" err &&
	test_expect_code 64 tern-run --train bow_train.onnx -i tokens=tokens -i target=t9.npy -o x.onnx 2>err &&
	test_one_error_line tern-run err && grep "is a tensor of samples and others are sequences" err &&
	test_expect_code 65 tern-run --train bow_train.onnx -i tokens=tokens -i target=t5 -o x.onnx 2>err &&
	test_one_error_line tern-run err && grep "disagree on the number of examples" err &&
	test_expect_code 64 tern-run -i tokens=tokens --iters 3 bow.onnx 2>err &&
	test_one_error_line tern-run err && grep "run once each" err &&
	! test -e x.onnx
'

test_expect_success PYTHON 'a generated treebank reaches a recursive graph, one tree a run' '
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_treebank.py" --seed 1 --train 30 --dev 4 --test 4 tb >stats &&
	"$TERN_PYTHON" -c "
import onnx
from onnx import numpy_helper as nh
q = onnx.SequenceProto()
q.ParseFromString(open(\"tb/train/word.pb\", \"rb\").read())
v = onnx.SequenceProto(name=\"value\", elem_type=onnx.SequenceProto.TENSOR)
v.tensor_values.extend(nh.from_array(nh.to_array(t).astype(\"float32\")) for t in q.tensor_values)
open(\"value.pb\", \"wb\").write(v.SerializeToString())
" &&
	tern-run -i left=tb/train/left.pb -i right=tb/train/right.pb -i value=value.pb -i root=tb/train/root.pb \
		--threads 2 "$TEST_DIRECTORY/data/tree.txt" -O sums &&
	"$TERN_PYTHON" -c "
import json, numpy as np, onnx
from onnx import numpy_helper as nh
stats = json.load(open(\"stats\"))
assert stats[\"trees\"] == {\"train\": 30, \"dev\": 4, \"test\": 4}, stats
def seq(f):
    q = onnx.SequenceProto()
    q.ParseFromString(open(f, \"rb\").read())
    return [nh.to_array(t) for t in q.tensor_values]
left, word, label, root = (seq(\"tb/train/%s.pb\" % k) for k in (\"left\", \"word\", \"label\", \"root\"))
for e in range(30):
    n = len(left[e])
    assert int(root[e]) == n - 1 and len(label[e]) == n and label[e].min() >= 0 and label[e].max() <= 4
    # children first: every child index below its parent
    assert all(c < i for i, c in enumerate(left[e]) if c >= 0)
    # tree.txt doubles the leaves (inner nodes have word 0)
    assert float(np.load(\"sums/total/%d.npy\" % e)) == 2 * float(word[e].sum()), e
"
'

test_expect_success PYTHON 'a TreeLSTM in the text syntax runs each tree recursively, as numpy does' '
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --hidden 16 models &&
	tern-run -i left=tb/train/left.pb -i right=tb/train/right.pb -i word=tb/train/word.pb -i root=tb/train/root.pb \
		--threads 2 models/treelstm.txt -O lstm_out &&
	"$TERN_PYTHON" "$TERN_SOURCE/scripts/make_recursive_models.py" --compare models tb/train lstm_out
'

test_done
