#!/bin/sh
test_description='tern-schedule: the plan annotation, its properties, and scheduled runs equal to single-stream runs'
. "$(dirname "$0")/test-lib.sh"

test_expect_success PYTHON 'setup: a branchy graph and a random input' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-branchy.py" branchy.onnx 3 &&
	"$TERN_PYTHON" -c "import numpy as np; np.save(\"x.npy\", np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32))"
'

test_expect_success PYTHON 'tern-schedule writes a graph that tern-show reads, with a plan line per node' '
	tern-schedule -o sched.onnx branchy.onnx &&
	tern-show -f plan sched.onnx >plan &&
	tern-show -f stats branchy.onnx >stats &&
	test "$(wc -l <plan)" -gt 100 &&
	awk -F "\t" "NF != 3 { bad = 1 } END { exit bad }" plan
'

test_expect_success PYTHON 'the graph has concurrency: auto uses several streams' '
	test "$(cut -f2 plan | sort -u | wc -l)" -gt 2
'

test_expect_success PYTHON 'scheduled outputs equal single-stream outputs exactly' '
	mkdir one many two &&
	tern-run -i x=x.npy -O one branchy.onnx &&
	tern-run -i x=x.npy -O many sched.onnx &&
	tern-run -i x=x.npy -O many --threads 2 sched.onnx &&
	cmp one/y.npy many/y.npy &&
	tern-schedule --streams 2 branchy.onnx | tern-run -i x=x.npy -O two &&
	cmp one/y.npy two/y.npy
'

test_expect_success PYTHON 'repeated scheduled runs stay identical' '
	for i in 1 2 3 4 5; do tern-run -i x=x.npy -O rep --iters 20 sched.onnx && cmp one/y.npy rep/y.npy || return 1; done
'

test_expect_success PYTHON 'runs after the first three, which pick streams by rank, equal single-stream runs' '
	for i in 1 2 3; do
		tern-run -i x=x.npy -O ranked --threads 2 --warmup 4 --iters 20 sched.onnx &&
		cmp one/y.npy ranked/y.npy || return 1
	done &&
	TERN_STREAM_RANKS=0 tern-run -i x=x.npy -O unranked --threads 2 --warmup 4 --iters 20 sched.onnx &&
	cmp one/y.npy unranked/y.npy
'

test_expect_success PYTHON '--streams 1 puts every node on one stream with no waits' '
	tern-schedule --streams 1 branchy.onnx | tern-show -f plan >plan1 &&
	test "$(cut -f2 plan1 | sort -u)" = 0 &&
	test "$(cut -f3 plan1 | sort -u)" = -
'

test_expect_success PYTHON 'a schedule edited to drop a needed wait is refused with exit 65' '
	"$TERN_PYTHON" -c "
import onnx
m = onnx.load(\"sched.onnx\")
for p in m.metadata_props:
    if p.key == \"tern.schedule\":
        lines = p.value.splitlines()
        lines = [\"\t\".join(l.split(\"\t\")[:2] + [\"-\"]) for l in lines]
        p.value = \"\n\".join(lines) + \"\n\"
onnx.save(m, \"broken.onnx\")
" &&
	test_expect_code 65 tern-run -i x=x.npy broken.onnx 2>err &&
	test_one_error_line tern-run err &&
	grep "tern.schedule" err &&
	tern-run -i x=x.npy --single-stream broken.onnx >/dev/null
'

test_expect_success '--streams with a bad value is a usage error' '
	test_expect_code 64 tern-schedule --streams 0 nothing.onnx 2>err &&
	test_expect_code 64 tern-schedule --streams many nothing.onnx 2>err
'

test_done
