#!/bin/sh
# tern-partition and tern-dist-run: K steps on N ranks (mpiexec on this machine) equal K steps of one
# process on the global batch, for a dense CNN and for an LM with an embedding, under every strategy;
# logs carry the bytes by kind; a killed rank ends the job; bad input gets one line and a sysexits code.
test_description='distributed training'
. "$(dirname "$0")/test-lib.sh"

command -v mpiexec >/dev/null 2>&1 && test -x "$TERN_BUILD/bin/tern-dist-run" && test_set_prereq MPI

test_expect_success PYTHON 'set up an LM with an embedding and a dense CNN, with data' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" models 50 8 5 6 0 0.3 &&
	tern-autodiff --optimizer adam --lr 0.01 lm.onnx -o lm_train.onnx &&
	tern-autodiff --optimizer sgd --lr 0.1 --momentum 0.9 cnn.onnx -o cnn_train.onnx &&
	tern-run --train lm_train.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 --steps 6 \
		-o lm_one.onnx 2>/dev/null &&
	tern-run --train cnn_train.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 --steps 6 -o cnn_one.onnx 2>/dev/null
'

for strategy in hybrid allreduce allgather ps; do
	for n in 2 3 4; do
		test_expect_success PYTHON,MPI "$strategy on $n ranks: the LM and the CNN train as one process does" "
			tern-partition --ranks $n --strategy $strategy lm_train.onnx -o lm_$strategy$n.onnx &&
			tern-dist-run -n $n -q lm_$strategy$n.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 \
				--steps 6 -o lm_$strategy${n}_out.onnx &&
			\"\$TERN_PYTHON\" \"\$TEST_DIRECTORY/make-dist.py\" same lm_one.onnx lm_$strategy${n}_out.onnx lm_train.onnx &&
			tern-partition --ranks $n --strategy $strategy cnn_train.onnx -o cnn_$strategy$n.onnx &&
			tern-dist-run -n $n -q cnn_$strategy$n.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 \
				--steps 6 -o cnn_$strategy${n}_out.onnx &&
			\"\$TERN_PYTHON\" \"\$TEST_DIRECTORY/make-dist.py\" same cnn_one.onnx cnn_$strategy${n}_out.onnx cnn_train.onnx
		"
	done
done

test_expect_success PYTHON,MPI 'the partitioned file passes onnx.checker and says what it is' '
	tern-show -f stats lm_hybrid2.onnx | grep "^training  *3 parameters .*; 1 with the gradient as rows$" &&
	tern-show -f stats lm_hybrid2.onnx | grep "^optimizer  *tern.Adam " &&
	"$TERN_PYTHON" -c "
import onnx
m = onnx.load(\"lm_hybrid2.onnx\")
onnx.checker.check_model(m, full_check=True)
meta = dict((p.key, p.value) for p in m.metadata_props)[\"tern.partition\"]
assert meta.startswith(\"ranks 2\nstrategy hybrid\n\"), meta
ops = [n.op_type for n in m.training_info[0].algorithm.node if n.domain == \"tern\"]
for op in (\"Pull\", \"Push\", \"AllReduceStart\", \"AllReduceWait\", \"AdamRows\"):
    assert op in ops, (op, ops)
# the dense sum starts before the sparse push, and is waited for after it
assert ops.index(\"AllReduceStart\") < ops.index(\"Push\") < ops.index(\"AllReduceWait\"), ops
keys = [b.key for b in m.training_info[0].update_binding]
assert \"emb/shard\" in keys and \"emb\" not in keys, keys
"
'

test_expect_success PYTHON,MPI 'dense buckets start while the backward pass runs; --no-overlap reduces them after it' '
	tern-partition --ranks 3 --bucket-mb 0.00001 cnn_train.onnx -o cnn_small.onnx &&
	tern-partition --ranks 3 --bucket-mb 0.00001 --no-overlap cnn_train.onnx -o cnn_after.onnx &&
	"$TERN_PYTHON" -c "
import onnx
def order(f):
    m = onnx.load(f)
    onnx.checker.check_model(m, full_check=True)
    return [n.op_type for n in m.training_info[0].algorithm.node], dict((p.key, p.value) for p in m.metadata_props)[\"tern.partition\"]
ops, meta = order(\"cnn_small.onnx\")
starts = [i for i, o in enumerate(ops) if o == \"AllReduceStart\"]
waits = [i for i, o in enumerate(ops) if o == \"AllReduceWait\"]
backward = [i for i, o in enumerate(ops) if o.endswith(\"Grad\")]
assert len(starts) == len(waits) > 2 and \"AllReduce\" not in ops, ops
assert starts[0] < backward[-1] and min(waits) > backward[-1], ops
assert \"\noverlap 1\n\" in meta, meta
ops, meta = order(\"cnn_after.onnx\")
assert \"AllReduceStart\" not in ops and min(i for i, o in enumerate(ops) if o == \"AllReduce\") > max(
    i for i, o in enumerate(ops) if o.endswith(\"Grad\")), ops
assert \"\noverlap 0\n\" in meta, meta
" &&
	for f in cnn_small cnn_after; do
		tern-dist-run -n 3 -q $f.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 --steps 6 -o ${f}_out.onnx &&
		"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same cnn_one.onnx ${f}_out.onnx cnn_train.onnx || return 1
	done
'

test_expect_success PYTHON,MPI 'gradients clipped by their global norm: the norm of the means, as one process' '
	tern-autodiff --optimizer sgd --lr 0.1 --clip-norm 0.05 cnn.onnx -o cnn_clip.onnx &&
	tern-run --train cnn_clip.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 --steps 6 -o clip_one.onnx \
		2>/dev/null &&
	for s in hybrid allreduce; do
		tern-partition --ranks 3 --strategy $s cnn_clip.onnx -o clip_$s.onnx &&
		tern-dist-run -n 3 -q clip_$s.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 --steps 6 \
			-o clip_${s}_out.onnx &&
		"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same clip_one.onnx clip_${s}_out.onnx cnn_clip.onnx || return 1
	done &&
	test_expect_code 64 tern-partition --ranks 2 --strategy ps cnn_clip.onnx -o p.onnx 2>err &&
	grep "not supported with --strategy ps" err &&
	tern-autodiff --optimizer adam --lr 0.01 --clip-norm 0.05 lm.onnx -o lm_clip.onnx &&
	test_expect_code 64 tern-partition --ranks 2 lm_clip.onnx -o p.onnx 2>err &&
	grep "global norm of sparse gradients" err &&
	! test -e p.onnx
'

test_expect_success PYTHON,MPI 'tern-show -f dot colours the training step by role and draws the communication' '
	tern-show --training -f dot lm_hybrid2.onnx >step.dot &&
	test "$(grep -c "shape=cds" step.dot)" = 4 &&
	grep -q "fillcolor=\"#f6b26b\"" step.dot &&
	grep -q "fillcolor=\"#6fa8dc\"" step.dot &&
	grep -q "fillcolor=\"#93c47d\"" step.dot &&
	grep -q "penwidth=2.5" step.dot &&
	tern-show --training -f dot lm_allgather2.onnx | grep -q "fillcolor=\"#e06666\""
'

test_expect_success PYTHON,MPI 'a plain mpiexec runs it too, and the log has a line per step and rank with bytes by kind' '
	mpiexec -n 2 tern-dist-run -q lm_hybrid2.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 \
		--steps 6 --log log.jsonl -o plain.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same lm_one.onnx plain.onnx lm_train.onnx &&
	"$TERN_PYTHON" -c "
import json
rows = [json.loads(l) for l in open(\"log.jsonl\")]
assert sorted((r[\"step\"], r[\"rank\"]) for r in rows) == [(s, k) for s in range(1, 7) for k in range(2)], rows
for r in rows:
    for key in (\"loss\", \"samples_per_s\"):
        assert r[key] > 0, r
    for d in (\"bytes_sent\", \"bytes_received\"):
        assert set(r[d]) >= {\"dense\", \"sparse_push\", \"sparse_pull\"}, r
        assert r[d][\"dense\"] > 0 and r[d][\"sparse_push\"] > 0 and r[d][\"sparse_pull\"] > 0, r
# what one rank sends the other receives
for s in range(1, 7):
    a, b = [r for r in rows if r[\"step\"] == s]
    for k in (\"dense\", \"sparse_push\", \"sparse_pull\"):
        assert a[\"bytes_sent\"][k] == b[\"bytes_received\"][k], (s, k, a, b)
"
'

test_expect_success PYTHON,MPI 'hybrid moves fewer bytes than allreduce on the LM' '
	for s in hybrid allreduce; do
		tern-dist-run -n 2 -q lm_${s}2.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 --steps 2 \
			--log $s.jsonl || return 1
	done &&
	"$TERN_PYTHON" -c "
import json
def total(f): return sum(sum(json.loads(l)[\"bytes_sent\"].values()) for l in open(f))
h, a = total(\"hybrid.jsonl\"), total(\"allreduce.jsonl\")
assert 0 < h < a, (h, a)
"
'

test_expect_success MPI 'a graph not partitioned for N ranks, or not at all, is refused with nothing written' '
	test_expect_code 64 tern-dist-run -n 3 lm_hybrid2.onnx -i tokens=tokens.npy -i target=lm_target.npy \
		--batch 24 -o out.onnx 2>err &&
	grep "partitioned for 2 ranks, not 3" err &&
	test_expect_code 64 tern-dist-run -n 2 lm_train.onnx -i tokens=tokens.npy -i target=lm_target.npy \
		--batch 24 -o out.onnx 2>err &&
	grep "partitioned for 1 rank, not 2" err &&
	test_expect_code 64 tern-dist-run -n 2 lm_hybrid2.onnx -i tokens=tokens.npy -i target=lm_target.npy \
		--batch 23 -o out.onnx 2>err &&
	grep "does not divide among 2 ranks" err &&
	test_expect_code 64 tern-run --train lm_hybrid2.onnx -i tokens=tokens.npy -i target=lm_target.npy \
		--batch 24 -o out.onnx 2>err &&
	grep "partitioned for 2 ranks and runs on 1 (run it with tern-dist-run)" err &&
	! test -e out.onnx
'

test_expect_success MPI 'ranks that read different graphs are refused' '
	cp lm_hybrid2.onnx g0.onnx && cp lm_allreduce2.onnx g1.onnx &&
	! mpiexec -n 2 sh -c "exec tern-dist-run g\$PMI_RANK.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24" 2>err &&
	grep "ranks 0 and 1 read different graphs" err
'

test_expect_success MPI 'tern-partition: bad options and host files get one line and a sysexits code' '
	test_expect_code 64 tern-partition lm_train.onnx -o p.onnx 2>err && grep "ranks N is required" err &&
	test_expect_code 64 tern-partition -n 2 --strategy nope lm_train.onnx -o p.onnx 2>err &&
	grep "unknown strategy .nope." err &&
	printf "node1:2\nnode2:x\n" >bad_hosts &&
	test_expect_code 65 tern-partition -n 4 --hosts bad_hosts lm_train.onnx -o p.onnx 2>err &&
	grep "bad_hosts:2: the slots" err &&
	printf "node1:2\nnode2:1\n" >short_hosts &&
	test_expect_code 64 tern-partition -n 4 --hosts short_hosts lm_train.onnx -o p.onnx 2>err &&
	grep "add up to 3, not the 4 ranks" err &&
	test_expect_code 64 tern-partition -n 2 lm_hybrid2.onnx -o p.onnx 2>err &&
	grep "partitioned already" err &&
	test_expect_code 65 tern-partition -n 2 lm.onnx -o p.onnx 2>err &&
	grep "no training algorithm" err &&
	! test -e p.onnx
'

test_expect_success PYTHON,MPI 'local aggregation: two hosts of two ranks sum their rows first and train as one process does' '
	printf "a:2\nb:2\n" >hosts22 &&
	tern-partition -n 4 --hosts hosts22 --local-aggregation lm_train.onnx -o lm_local.onnx &&
	tern-show -f text lm_local.onnx | grep -q "leaders = \[0, 0, 2, 2\]" &&
	tern-dist-run -n 4 -q lm_local.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 --steps 6 \
		--log local.jsonl -o lm_local_out.onnx &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same lm_one.onnx lm_local_out.onnx lm_train.onnx &&
	"$TERN_PYTHON" -c "
import json
rows = [json.loads(l) for l in open(\"local.jsonl\")]
for r in rows:
    # ranks 1 and 3 send their rows to 0 and 2 (the others only counts, 8 bytes a rank); only 0 and 2
    # push rows to the servers
    local, push = r[\"bytes_sent\"][\"sparse_local\"], r[\"bytes_sent\"][\"sparse_push\"]
    assert (local > 100) == (r[\"rank\"] in (1, 3)), r
    assert (push > 100) == (r[\"rank\"] in (0, 2)), r
" &&
	test_expect_code 64 tern-partition -n 4 --local-aggregation lm_train.onnx -o p.onnx 2>err &&
	grep "needs hosts of several ranks" err
'

test_expect_success PYTHON 'data for long runs' '
	"$TERN_PYTHON" -c "
import numpy as np
r = np.random.default_rng(1)
np.save(\"many_tokens.npy\", r.integers(0, 50, (96000, 6)).astype(np.int64))
np.save(\"many_target.npy\", r.integers(0, 5, (96000,)).astype(np.int64))
"
'

test_expect_success MPI 'a host file puts one server on the first rank of each host' '
	printf "a:1\nb:3\n" >hosts &&
	tern-partition -n 4 --hosts hosts lm_train.onnx -o lm_hosts.onnx &&
	tern-show -f text lm_hosts.onnx >shown &&
	grep "^servers 2$" shown && grep "^server_ranks 0,1$" shown &&
	grep "owners=0,1 " shown
'

test_expect_success PYTHON,MPI 'SIGTERM to tern-dist-run stops every rank after the same step and writes the model' '
	{ tern-dist-run -n 2 -q lm_hybrid2.onnx -i tokens=many_tokens.npy -i target=many_target.npy --batch 4 \
		--epochs 100 --log stopped.jsonl -o stopped.onnx 2>stop_err & } &&
	job=$! &&
	sleep 4 &&
	kill -TERM $job &&
	{ wait $job; rc=$?; } ;
	test $rc = 143 &&
	"$TERN_PYTHON" -c "
import json, onnx
from onnx import numpy_helper as nh
step = [int(nh.to_array(t)) for t in onnx.load(\"stopped.onnx\").graph.initializer if t.name == \"tern.step\"][0]
rows = [json.loads(l) for l in open(\"stopped.jsonl\")]
last = {r: max(x[\"step\"] for x in rows if x[\"rank\"] == r) for r in (0, 1)}
assert last[0] == last[1] == step > 0, (last, step)
"
'

test_expect_success PYTHON,MPI 'killing one rank mid-run ends every rank, non-zero, within 10 s' '
	{ tern-dist-run -n 3 -q lm_hybrid3.onnx -i tokens=many_tokens.npy -i target=many_target.npy --batch 3 \
		--epochs 100 -o killed.onnx 2>kill_err & } &&
	job=$! &&
	sleep 2 &&
	victim=$(pgrep -f "tern-dist-run --worker" | sed -n 2p) &&
	test -n "$victim" &&
	kill -9 $victim &&
	start=$(date +%s) &&
	{ wait $job; rc=$?; } ;
	end=$(date +%s) &&
	echo "exit $rc after $((end - start)) s" &&
	test $rc -ne 0 &&
	test $((end - start)) -le 10 &&
	! pgrep -f "tern-dist-run --worker" &&
	! test -e killed.onnx
'

test_done
