#!/bin/sh
# tern-dist-run in a cluster of network namespaces on this machine (scripts/netns-cluster): ranks
# that reach each other only over veth links limited to 1 Gbit/s, MPICH over TCP. K steps on 3 ranks
# equal one process on the global batch, and the bytes the ranks count cross the links. Needs root,
# ip and tc; the test makes the cluster and removes it.
test_description='distributed training across network namespaces'
. "$(dirname "$0")/test-lib.sh"

CLUSTER=$TERN_SOURCE/scripts/netns-cluster
PREFIX=tt$$
test "$(id -u)" = 0 && command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 &&
	command -v mpiexec >/dev/null 2>&1 && test -x "$TERN_BUILD/bin/tern-dist-run" && test_set_prereq CLUSTER
trap '"$CLUSTER" down --prefix $PREFIX >/dev/null 2>&1' EXIT INT TERM

test_expect_success PYTHON,CLUSTER 'set up a cluster of 3 namespaces, an LM with an embedding and a CNN' '
	"$CLUSTER" up 3 --prefix $PREFIX --rate 1gbit >/dev/null &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" models 3000 32 7 8 2 0.2 &&
	tern-autodiff --optimizer adagrad --lr 0.1 lm.onnx -o lm_train.onnx &&
	tern-autodiff --optimizer sgd --lr 0.1 --momentum 0.9 cnn.onnx -o cnn_train.onnx &&
	tern-run --train lm_train.onnx -i tokens=tokens.npy -i target=lm_target.npy --batch 24 --steps 4 -o lm_one.onnx \
		2>/dev/null &&
	tern-run --train cnn_train.onnx -i x=x.npy -i target=cnn_target.npy --batch 24 --steps 4 -o cnn_one.onnx 2>/dev/null
'

for strategy in hybrid allgather allreduce ps; do
	test_expect_success PYTHON,CLUSTER "$strategy across the namespaces: 4 steps on 3 ranks equal one process" "
		tern-partition --ranks 3 --strategy $strategy lm_train.onnx -o lm_$strategy.onnx &&
		\"\$CLUSTER\" run 3 --prefix \$PREFIX -- tern-dist-run -q lm_$strategy.onnx -i tokens=tokens.npy \
			-i target=lm_target.npy --batch 24 --steps 4 --log lm_$strategy.jsonl -o lm_${strategy}_out.onnx &&
		\"\$TERN_PYTHON\" \"\$TEST_DIRECTORY/make-dist.py\" same lm_one.onnx lm_${strategy}_out.onnx &&
		tern-partition --ranks 3 --strategy $strategy cnn_train.onnx -o cnn_$strategy.onnx &&
		\"\$CLUSTER\" run 3 --prefix \$PREFIX -- tern-dist-run -q cnn_$strategy.onnx -i x=x.npy \
			-i target=cnn_target.npy --batch 24 --steps 4 -o cnn_${strategy}_out.onnx &&
		\"\$TERN_PYTHON\" \"\$TEST_DIRECTORY/make-dist.py\" same cnn_one.onnx cnn_${strategy}_out.onnx
	"
done

# Rows through the shards are counted as they go (alltoallv); an allreduce as a ring's share, whatever
# algorithm MPICH picks: hybrid's bytes are almost all rows.
test_expect_success PYTHON,CLUSTER 'the bytes the ranks count cross the veth links' '
	"$CLUSTER" stats --prefix $PREFIX >before &&
	"$CLUSTER" run 3 --prefix $PREFIX -- tern-dist-run -q lm_hybrid.onnx -i tokens=tokens.npy \
		-i target=lm_target.npy --batch 24 --steps 4 --log counted.jsonl &&
	"$CLUSTER" stats --prefix $PREFIX >after &&
	"$TERN_PYTHON" -c "
import json
def tx(f):
    return {int(l.split()[0]): int(l.split()[3]) for l in open(f) if l.split() and l.split()[0].isdigit()}
b, a = tx(\"before\"), tx(\"after\")
rows = [json.loads(l) for l in open(\"counted.jsonl\")]
for r in range(3):
    counted = sum(sum(x[\"bytes_sent\"].values()) for x in rows if x[\"rank\"] == r)
    assert counted > 20000, (r, counted)
    wire = a[r] - b[r]
    # TCP/IP headers and MPI start-up on top of the payload; never less than it
    assert counted <= wire <= 1.5 * counted + 200000, (r, counted, wire)
"
'

# Two ranks a namespace: hosts whose ranks reach each other over loopback and the other host over
# its link; local aggregation sums a host's rows on its first rank, the only one that pushes.
test_expect_success PYTHON,CLUSTER 'two hosts of two ranks, local aggregation: 4 steps equal one process' '
	printf "a:2\nb:2\n" >hosts22 &&
	tern-partition -n 4 --hosts hosts22 --local-aggregation lm_train.onnx -o lm_la.onnx &&
	"$CLUSTER" stats --prefix $PREFIX >before &&
	"$CLUSTER" run 4 --per-host 2 --prefix $PREFIX -- tern-dist-run -q lm_la.onnx -i tokens=tokens.npy \
		-i target=lm_target.npy --batch 24 --steps 4 --log la.jsonl -o lm_la_out.onnx &&
	"$CLUSTER" stats --prefix $PREFIX >after &&
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-dist.py" same lm_one.onnx lm_la_out.onnx &&
	"$TERN_PYTHON" -c "
import json
def tx(f):
    return {int(l.split()[0]): int(l.split()[3]) for l in open(f) if l.split() and l.split()[0].isdigit()}
b, a = tx(\"before\"), tx(\"after\")
rows = [json.loads(l) for l in open(\"la.jsonl\")]
# the two hosts talk over their links; the third namespace is idle
assert a[0] - b[0] > 20000 and a[1] - b[1] > 20000 and a[2] - b[2] < 5000, (a, b)
assert {r[\"rank\"] for r in rows} == {0, 1, 2, 3}, rows
" &&
	test_expect_code 1 "$CLUSTER" run 8 --per-host 2 --prefix $PREFIX -- true 2>err &&
	grep "need 4" err
'

test_expect_success CLUSTER 'remove the cluster' '
	"$CLUSTER" down --prefix $PREFIX >/dev/null &&
	! ip netns list | grep -q "^$PREFIX"
'

test_done
