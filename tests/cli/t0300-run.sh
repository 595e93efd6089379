#!/bin/sh
# tern-run: inputs from files and --random, outputs to files and standard output, timings, the
# profile, and one clear error line with the right exit status for every kind of bad input.
test_description='tern-run'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'set up graphs' '
	cat >id.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	id (float[N] x) => (float[N] y) {
	  y = Identity(x)
	}
	EOF
	cat >add.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	add (float[2,3] a, float[2,3] b) => (float[2,3] sum, float[2,3] diff) {
	  sum = Add(a, b)
	  diff = Sub(a, b)
	}
	EOF
	cat >addn.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	addn (float[N] a, float[N] b) => (float[N] c) {
	  c = Add(a, b)
	}
	EOF
	cat >ints.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	ints (int64[N] x) => (int64[N] y, bool[N] odd, bfloat16[N] half) {
	  y = Identity(x)
	  two = Constant<value = int64 {2}>()
	  rem = Mod(x, two)
	  one = Constant<value = int64 {1}>()
	  odd = Equal(rem, one)
	  half = Cast<to = 16>(x)
	}
	EOF
	cat >unknown-op.txt <<-\EOF
	<ir_version: 8, opset_import: ["" : 17]>
	bad (float[2] x) => (float[2] y) {
	  y = Frobnicate(x)
	}
	EOF
'

test_expect_success '--random is reproducible and depends on --seed' '
	tern-run --random --dim N=100 id.txt >one &&
	tern-run --random --dim N=100 id.txt >two &&
	test_cmp one two &&
	tern-run --random --seed 7 --dim N=100 id.txt >three &&
	! cmp -s one three &&
	grep "^y float\[100\] \[" one
'

test_expect_success 'outputs written with -O read back as inputs give the same outputs' '
	tern-run --random --dim N=17 -O out id.txt &&
	test -f out/y.npy &&
	tern-run --random --dim N=17 --print id.txt >expect &&
	tern-run -i out/y.npy id.txt >actual &&
	test_cmp expect actual &&
	tern-run -i x=out/y.npy id.txt >actual &&
	test_cmp expect actual
'

test_expect_success '.pb outputs hold the same tensor as .npy ones' '
	tern-run --random --dim N=9 -O pb --output-format pb id.txt &&
	tern-run --random --dim N=9 -O npy id.txt &&
	test -f pb/y.pb &&
	tern-run -i pb/y.pb id.txt >from-pb &&
	tern-run -i npy/y.npy id.txt >from-npy &&
	test_cmp from-pb from-npy
'

test_expect_success '--print shows name, type, first values and checksums' '
	tern-run --random --dim N=3 -O in3 id.txt &&
	tern-run --random --dim N=3 -O in3b --seed 1 id.txt &&
	tern-run -i in3/y.npy -i in3b/y.npy addn.txt >printed &&
	test_line_count = 1 printed &&
	grep "^c float\[3\] \[[-0-9.e]*, [-0-9.e]*, [-0-9.e]*\] sum=[-0-9.e]* fnv64=[0-9a-f]\{16\}$" printed &&
	tern-run --random --dim N=20 id.txt >long &&
	grep ", \.\.\.\] sum=" long
'

test_expect_success 'named inputs go where named, bare ones fill the rest in order' '
	tern-run --random --dim N=4 -O p id.txt &&
	tern-run --random --dim N=4 --seed 3 -O q id.txt &&
	tern-run -i a=p/y.npy -i q/y.npy addn.txt >ab &&
	tern-run -i b=q/y.npy -i p/y.npy addn.txt >ba &&
	test_cmp ab ba
'

test_expect_success 'a missing input exits 65 and names it' '
	test_expect_code 65 tern-run add.txt >printed 2>err &&
	test_one_error_line tern-run err &&
	grep "input .a. (float\[2,3\]) has no value" err &&
	test_must_be_empty printed
'

test_expect_success 'an input of the wrong type or shape exits 65' '
	tern-run --random --dim N=5 -O ints --output-format pb ints.txt &&
	tern-run --random --dim N=5 -O floats id.txt &&
	test_expect_code 65 tern-run -i ints/y.pb id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "input .x.: ints/y.pb holds int64\[5\], the graph wants float\[N\]" err &&
	test_expect_code 65 tern-run -i floats/y.npy --random add.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "holds float\[5\], the graph wants float\[2,3\]" err
'

test_expect_success 'a symbolic dimension must agree between inputs and --dim' '
	tern-run --random --dim N=3 -O n3 id.txt &&
	tern-run --random --dim N=4 -O n4 id.txt &&
	test_expect_code 65 tern-run -i n3/y.npy -i n4/y.npy addn.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "dimension .N. is 3" err &&
	test_expect_code 65 tern-run -i n3/y.npy --dim N=4 id.txt 2>err &&
	test_one_error_line tern-run err &&
	tern-run -i n3/y.npy --random addn.txt >printed &&
	grep "^c float\[3\]" printed
'

test_expect_success '--random needs --dim for a symbolic dimension' '
	test_expect_code 65 tern-run --random id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "dimension .N. with --dim N=SIZE" err
'

test_expect_success 'bad -i arguments exit 64' '
	test_expect_code 64 tern-run -i nosuch=in3/y.npy id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "the graph has no input .nosuch." err &&
	test_expect_code 64 tern-run -i in3/y.npy -i in3/y.npy id.txt 2>err &&
	test_one_error_line tern-run err &&
	test_expect_code 64 tern-run -i x=in3/y.npy -i x=in3/y.npy id.txt 2>err &&
	grep "given twice" err
'

test_expect_success 'a missing input file exits 66, a malformed one 65, naming the file' '
	test_expect_code 66 tern-run -i nothere.npy id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "nothere.npy" err &&
	echo "not a tensor" >junk.npy &&
	test_expect_code 65 tern-run -i junk.npy id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "junk.npy" err &&
	head -c 134 out/y.npy >short.npy &&
	test_expect_code 65 tern-run -i short.npy id.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "short.npy: float\[17\] needs 68 bytes of data, the file has 6" err
'

test_expect_success 'an unsupported operator exits 65 and names it' '
	test_expect_code 65 tern-run --random unknown-op.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "Frobnicate" err
'

test_expect_success 'bfloat16 cannot go to .npy but can go to .pb' '
	test_expect_code 65 tern-run --random --dim N=2 -O bf ints.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "output .half.: .*bfloat16.*--output-format pb" err &&
	test_path_is_missing bf/half.npy &&
	tern-run --random --dim N=2 -O bf --output-format pb ints.txt &&
	test -f bf/half.pb && test -f bf/odd.pb
'

test_expect_success '-O creates folders and fails with 74 when it cannot' '
	tern-run --random --dim N=2 -O deep/er/folder id.txt &&
	test -f deep/er/folder/y.npy &&
	: >blocker &&
	test_expect_code 74 tern-run --random --dim N=2 -O blocker/sub id.txt 2>err &&
	test_one_error_line tern-run err
'

test_expect_success '--json prints one object with timings, memory and outputs' '
	tern-run --random --iters 5 --warmup 2 --json add.txt >j 2>err &&
	test_must_be_empty err &&
	for key in graph iters warmup threads latency_ms median p90 min mean plan_ms arena_mb peak_rss_mb outputs
	do
		grep "\"$key\": " j || return 1
	done &&
	grep "\"iters\": 5, \"warmup\": 2, \"threads\": 1," j &&
	grep "\"name\": \"diff\"" j
'

test_expect_success PYTHON '--json is valid JSON' '
	tern-run --random --iters 3 --threads 2 --json add.txt >j &&
	"$TERN_PYTHON" -c "import json, sys; d = json.load(open(\"j\")); import os; assert d[\"iters\"] == 3 and d[\"threads\"] == min(2, len(os.sched_getaffinity(0))); assert len(d[\"outputs\"]) == 2; assert d[\"latency_ms\"][\"min\"] <= d[\"latency_ms\"][\"median\"] <= d[\"latency_ms\"][\"p90\"]"
'

test_expect_success '--json with --print sends the printed outputs to standard error' '
	tern-run --random --json --print add.txt >j 2>printed &&
	test_line_count = 2 printed &&
	! grep "^sum float" j
'

test_expect_success '--iters reports timings on standard error, -q silences them' '
	tern-run --random --iters 3 add.txt >printed 2>err &&
	grep "^tern-run: 3 runs: median [0-9.]* ms" err &&
	tern-run --random --iters 3 -q add.txt >printed 2>err &&
	test_must_be_empty err
'

test_expect_success '-o writes the printed outputs to a file' '
	tern-run --random add.txt >expect &&
	tern-run --random -o printed add.txt >stdout &&
	test_must_be_empty stdout &&
	test_cmp expect printed
'

test_expect_success '--profile writes a trace event per node' '
	tern-run --random --profile trace.json add.txt >/dev/null &&
	test "$(grep -c "\"ph\": \"X\"" trace.json)" = 2 &&
	grep "\"cat\": \"Add\"" trace.json &&
	grep "\"cat\": \"Sub\"" trace.json
'

test_expect_success PYTHON '--profile is a valid Chrome trace' '
	tern-run --random --iters 2 --profile trace.json add.txt >/dev/null &&
	"$TERN_PYTHON" -c "import json; ev = json.load(open(\"trace.json\"))[\"traceEvents\"]; x = [e for e in ev if e[\"ph\"] == \"X\"]; assert sorted(e[\"cat\"] for e in x) == [\"Add\", \"Sub\"]; assert all(e[\"dur\"] >= 0 and e[\"ts\"] >= 0 for e in x)"
'

test_expect_success 'threads and --single-stream do not change outputs' '
	tern-run --random add.txt >expect &&
	tern-run --random --threads 3 add.txt >actual &&
	test_cmp expect actual &&
	tern-run --random --single-stream add.txt >actual &&
	test_cmp expect actual
'

test_expect_success PYTHON 'grouped convolutions give the same outputs on one, two and three threads' '
	"$TERN_PYTHON" - <<-\EOF &&
	import numpy as np, onnx
	from onnx import helper, TensorProto, numpy_helper
	# (channels, groups, kernel, stride, size, images): the groups or the images are shared out
	cases = [(48, 6, 3, 2, 56, 1), (104, 13, 3, 1, 14, 1), (32, 8, 3, 2, 9, 2), (64, 4, 1, 1, 20, 1)]
	for i, (c, g, k, s, h, n) in enumerate(cases):
	    rng = np.random.default_rng(i)
	    w = rng.standard_normal((c, c // g, k, k)).astype(np.float32)
	    b = rng.standard_normal(c).astype(np.float32)
	    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=g, kernel_shape=[k, k],
	                              pads=[k // 2] * 4, strides=[s, s]),
	             helper.make_node("Relu", ["c"], ["y"])]
	    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, h])],
	                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
	                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
	    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
	    model.ir_version = 8
	    onnx.save(model, f"grouped{i}.onnx")
	EOF
	for i in 0 1 2 3; do
		tern-run --random grouped$i.onnx >expect &&
		tern-run --random --threads 2 grouped$i.onnx >actual &&
		test_cmp expect actual &&
		tern-run --random --threads 3 grouped$i.onnx >actual &&
		test_cmp expect actual || return 1
	done
'

test_expect_success 'the graph can come from standard input' '
	tern-run --random add.txt >expect &&
	tern-run --random <add.txt >actual &&
	test_cmp expect actual &&
	tern-run --random - <add.txt >actual &&
	test_cmp expect actual
'

test_expect_success 'an input can come from standard input, unless the graph does' '
	tern-run --random --dim N=6 -O six id.txt &&
	tern-run -i six/y.npy id.txt >expect &&
	tern-run -i - id.txt <six/y.npy >actual &&
	test_cmp expect actual &&
	test_expect_code 64 tern-run -i - <id.txt 2>err &&
	test_one_error_line tern-run err
'

test_expect_success 'no more threads than the CPUs the process may run on' '
	taskset -c 0 tern-run -v --random --threads 3 --json add.txt >j 2>err &&
	grep "\"threads\": 1," j &&
	grep "3 threads asked for, 1 used" err &&
	tern-run --random add.txt >expect &&
	taskset -c 0 tern-run --random --threads 3 add.txt >actual &&
	test_cmp expect actual
'

test_expect_success 'bad option values exit 64' '
	test_expect_code 64 tern-run --iters 0 add.txt 2>err &&
	test_expect_code 64 tern-run --dim N add.txt 2>err &&
	test_expect_code 64 tern-run --output-format txt add.txt 2>err &&
	test_expect_code 64 tern-run --threads -1 add.txt 2>err
'

test_expect_success 'Concat written in place: unscheduled, scheduled on one and on two threads, the same' '
	cat >cat.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	cat (float[1,16,4] a, float[1,3,4] b, float[1,16,4] c) => (float[1,35,4] y, float[1,16,4] ra, float[1,35,4] z) {
	  ra = Relu(a)
	  rb = Relu(b)
	  rc = Neg(c)
	  y = Concat<axis = 1>(ra, rc, rb)
	  s = Sigmoid(ra)
	  t = Concat<axis = 1>(s, rb, rc)
	  z = Add(t, y)
	}
	EOF
	tern-run --random --seed 3 cat.txt >expect.unscheduled &&
	tern-schedule cat.txt | tern-run --random --seed 3 >actual.scheduled &&
	test_cmp expect.unscheduled actual.scheduled &&
	tern-run --random --seed 3 --optimize 0 cat.txt >actual.as-given &&
	test_cmp expect.unscheduled actual.as-given &&
	tern-schedule cat.txt | tern-run --threads 2 --iters 20 --random --seed 3 >actual.two 2>/dev/null &&
	test_cmp expect.unscheduled actual.two
'

test_expect_success PYTHON 'pieces of a Concat made on two streams share its bytes: the arena is no larger than unscheduled' '
	cat >wide.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	wide (float[1,64,1024] a, float[1,64,1024] c) => (float[1,1,1] z) {
	  ra = Relu(a)
	  rc = Neg(c)
	  y = Concat<axis = 1>(ra, rc)
	  z = ReduceSum(y)
	}
	EOF
	tern-schedule --streams 2 -o wide-s.onnx wide.txt &&
	tern-show -f text wide-s.onnx >plan && grep -qE "^Neg_1[[:space:]]1[[:space:]]" plan &&
	tern-run --json --random wide.txt >one.json &&
	tern-run --json --threads 2 --iters 5 --random wide-s.onnx >two.json &&
	python3 -c "import json,sys; a, b = (json.load(open(f))[\"arena_mb\"] for f in (\"one.json\", \"two.json\")); sys.exit(0 if b <= a else print(a, b) or 1)"
'

test_expect_success 'TERN_ISA caps the kernels and is reported; outputs stay within rounding' '
	TERN_ISA=generic tern-run -v --random --json add.txt >j 2>err &&
	grep "\"isa\": \"generic\"" j &&
	grep "generic kernels" err &&
	for isa in avx512 avx2 generic; do
		TERN_ISA=$isa tern-run --random add.txt >out.$isa || return 1
	done &&
	test_cmp out.avx512 out.avx2 &&
	test_cmp out.avx2 out.generic
'

test_expect_success 'a TERN_ISA that names no path exits 64 in every tool' '
	test_expect_code 64 env TERN_ISA=avx3 tern-run --random add.txt 2>err &&
	test_one_error_line tern-run err &&
	grep "TERN_ISA: .avx3. is not one of avx512, avx2, generic" err &&
	test_expect_code 64 env TERN_ISA=sse tern-show -f text add.txt 2>err &&
	test_one_error_line tern-show err
'

test_done
