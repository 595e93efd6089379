#!/bin/sh
# tern-optimize: levels, chosen passes, statistics, --dim, annotations dropped when stale, a fixed point
# (optimising twice is optimising once), outputs that do not change, and its errors.
test_description='tern-optimize'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'set up a graph with something for every level' '
	cat >net.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	net (float[1,3,8,8] x) => (float[1,16] y)
	   <float[4,3,1,1] w = {0.5,-0.25,0.125,1,0.5,-1,0.25,0.75,-0.5,0.1,0.2,0.3},
	    float[4] scale = {1,2,0.5,1.5}, float[4] bias = {0.1,-0.1,0.2,0}, float[4] mean = {0,0.5,-0.5,0.25},
	    float[4] var = {1,2,0.5,4}, float[16,16] fc = {1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
	    0,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 0,0,1,0,0,0,0,0,0,0,0,0,0,0,0,0, 0,0,0,1,0,0,0,0,0,0,0,0,0,0,0,0,
	    0,0,0,0,1,0,0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,1,0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,1,0,0,0,0,0,0,0,0,0,
	    0,0,0,0,0,0,0,1,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,1,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,1,0,0,0,0,0,0,
	    0,0,0,0,0,0,0,0,0,0,1,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,0,0,1,0,0,0,0, 0,0,0,0,0,0,0,0,0,0,0,0,1,0,0,0,
	    0,0,0,0,0,0,0,0,0,0,0,0,0,1,0,0, 0,0,0,0,0,0,0,0,0,0,0,0,0,0,1,0, 0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0.5},
	    float[16] fb = {0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,1}, int64[1] zero = {0}, int64[1] minus1 = {-1},
	    float half = {0.5}>
	{
	   c = Conv (x, w)
	   n = BatchNormalization (c, scale, bias, mean, var)
	   i = Identity (n)
	   r = Relu (i)
	   p = MaxPool <kernel_shape = [4,4], strides = [4,4]> (r)
	   s = Shape (p)
	   b = Gather <axis = 0> (s, zero)
	   shape = Concat <axis = 0> (b, minus1)
	   f = Reshape (p, shape)
	   m = MatMul (f, fc)
	   a = Add (m, fb)
	   h = Mul (a, half)
	   y = Sigmoid (h)
	}
	EOF
	cp "$TEST_DIRECTORY/data/mlp.txt" mlp.txt
'

test_expect_success '--list-passes names every pass with its level and exits' '
	tern-optimize --list-passes >list &&
	test "$(wc -l <list)" -ge 15 &&
	grep "^fold-constants  *-O1  " list &&
	grep "^fuse-conv  *-O2  " list &&
	grep "^fold-scales  *-O3  " list &&
	! grep -v -- " -O[123]  " list
'

test_expect_success '-O0 writes the graph as read' '
	tern-show net.txt >expect &&
	tern-optimize -O0 net.txt | tern-show >actual &&
	test_cmp expect actual
'

test_expect_success '-O1 leaves standard operators only; -O2 uses tern operators' '
	tern-optimize -O1 net.txt >o1.onnx &&
	tern-show -f stats o1.onnx >stats1 &&
	! grep "tern\." stats1 &&
	grep "^nodes  *7$" stats1 &&
	tern-optimize net.txt >o2.onnx &&
	tern-show -f stats o2.onnx >stats2 &&
	grep "^opsets .*tern 1" stats2 &&
	grep "tern.FusedConv" stats2 &&
	grep "tern.ElementwiseChain" stats2 &&
	grep "^nodes  *5$" stats2
'

test_expect_success 'optimising an optimised graph changes nothing (text comparison)' '
	for level in 1 2 3; do
		tern-optimize -O$level net.txt >once.onnx &&
		tern-show once.onnx >once &&
		tern-optimize -O$level once.onnx | tern-show >twice &&
		test_cmp once twice &&
		tern-optimize -O$level --stats once.onnx 2>stats >/dev/null &&
		grep "^total " stats | awk "{ exit \$3 + \$4 + \$5 + \$6 != 0 }" || return 1
	done
'

test_expect_success PYTHON 'outputs are the same at every level' '
	"$TERN_PYTHON" -c "import numpy as np; np.save(\"x.npy\", np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32))" &&
	tern-run -i x=x.npy -O ref net.txt &&
	for level in 1 2 3; do
		tern-optimize -O$level net.txt | tern-run -i x=x.npy -O out$level || return 1
	done &&
	"$TERN_PYTHON" -c "
import numpy as np
want = np.load(\"ref/y.npy\")
for level in (1, 2, 3):
    got = np.load(\"out%d/y.npy\" % level)
    assert got.shape == want.shape, (level, got.shape)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)) + 1e-5, level
"
'

test_expect_success 'a fused swish (Sigmoid, then Mul by its input) gives the unfused outputs bit for bit' '
	cat >swish.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	swish (float[2,3,40,40] x) => (float[2,3,40,40] y1, float[2,3,40,40] y2) {
	  s1 = Sigmoid(x)
	  y1 = Mul(x, s1)
	  t = Abs(x)
	  s2 = Sigmoid(t)
	  y2 = Mul(s2, t)
	}
	EOF
	cat >reread.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	reread (float[2,3,40,40] x) => (float[2,3,40,40] y) {
	  y = tern.ElementwiseChain <ops = ["Sigmoid", "Mul", "Add"], args = [0, -1, -1, 0, 1, -1, 2, 1, -1], params = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]> (x)
	}
	EOF
	cat >reread-plain.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	reread (float[2,3,40,40] x) => (float[2,3,40,40] y) {
	  s = Sigmoid(x)
	  m = Mul(x, s)
	  y = Add(m, s)
	}
	EOF
	tern-optimize swish.txt >swish.opt &&
	test $(tern-show swish.opt | grep -c "tern.ElementwiseChain <ops = \[\"Sigmoid\", \"Mul\"\]") = 2 &&
	for isa in avx512 avx2 generic; do
		TERN_ISA=$isa tern-run --random --optimize 0 swish.txt >expect &&
		TERN_ISA=$isa tern-run --random swish.opt >actual &&
		test_cmp expect actual &&
		TERN_ISA=$isa tern-run --random --optimize 0 reread-plain.txt >expect &&
		TERN_ISA=$isa tern-run --random --optimize 0 reread.txt >actual &&
		test_cmp expect actual || return 1
	done
'

test_expect_success '--passes runs exactly the passes named' '
	tern-optimize --passes eliminate-noops --stats net.txt 2>stats >noops.onnx &&
	test "$(grep -c -v -e "^pass " -e "^total " stats)" = 1 &&
	grep "^eliminate-noops " stats &&
	tern-show noops.onnx >text &&
	! grep Identity text &&
	grep BatchNormalization text
'

test_expect_success '--stats prints a line per pass and a total on standard error' '
	tern-optimize --stats net.txt 2>stats >/dev/null &&
	head -n 1 stats | grep "^pass  *runs  *removed  *added  *fused  *rewritten  *ms$" &&
	grep "^fold-batchnorm  *[1-9]" stats &&
	tail -n 1 stats | grep "^total "
'

test_expect_success '--dim makes a symbolic dimension static' '
	tern-optimize --dim N=4 mlp.txt | tern-show >text &&
	grep "float\[4,4\] x" text &&
	grep "Gemm" text &&
	tern-optimize mlp.txt | tern-show >dynamic &&
	grep "MatMul" dynamic
'

test_expect_success 'a stale schedule is dropped, and -v says so' '
	tern-schedule net.txt >sched.onnx &&
	tern-optimize -v sched.onnx 2>err >opt.onnx &&
	grep "dropped the annotation tern.schedule" err &&
	test_expect_code 65 tern-show -f plan opt.onnx 2>/dev/null
'

test_expect_success 'a schedule of a graph that nothing changes is kept' '
	tern-optimize net.txt | tern-schedule >final.onnx &&
	tern-optimize -v final.onnx 2>err | tern-show -f plan >plan &&
	! grep dropped err &&
	test -s plan
'

test_expect_success 'usage errors exit 64; an unknown pass or dimension in one line' '
	test_expect_code 64 tern-optimize -O4 net.txt 2>err &&
	grep "^tern-optimize: -O takes a level from 0 to 3" err &&
	test_expect_code 64 tern-optimize --passes no-such-pass net.txt 2>err &&
	test_one_error_line tern-optimize err &&
	grep no-such-pass err &&
	test_expect_code 64 tern-optimize --dim N net.txt 2>err &&
	test_expect_code 64 tern-optimize --dim N=0 net.txt 2>err &&
	test_expect_code 64 tern-optimize --dim Q=3 mlp.txt 2>err &&
	test_one_error_line tern-optimize err
'

test_expect_success 'bad and missing graphs exit 65 and 66' '
	echo "not a graph" >bad.txt &&
	test_expect_code 65 tern-optimize bad.txt 2>err >/dev/null &&
	test_one_error_line tern-optimize err &&
	test_expect_code 66 tern-optimize missing.onnx 2>err &&
	test_one_error_line tern-optimize err &&
	test_path_is_missing out.onnx &&
	test_expect_code 66 tern-optimize -o out.onnx missing.onnx 2>err &&
	test_path_is_missing out.onnx
'

test_done
