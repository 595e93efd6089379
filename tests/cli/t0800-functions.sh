#!/bin/sh
# Model-local functions run without inlining (tern-graph(5)): plain calls, tern.Invoke, recursion
# that ends under an If, the depth limit, and the pipeline around such a graph.
test_description='function calls'
. "$(dirname "$0")/test-lib.sh"

# An int64 .npy file from numbers: npy_i64 SHAPE VALUES... (SHAPE like 5, or "" for a scalar).
npy_i64() {
	python3 -c 'import struct, sys
shape = tuple(int(d) for d in sys.argv[1].split(",") if d)
h = "{\x27descr\x27: \x27<i8\x27, \x27fortran_order\x27: False, \x27shape\x27: %r, }" % (shape,)
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
v = [int(x) for x in sys.argv[2:]]
sys.stdout.buffer.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + struct.pack("<%dq" % len(v), *v))' "$@"
}

# A chain of N inner nodes (node i's left child is node i + 1, its right child a leaf), 2N + 1 nodes:
# chain N PREFIX writes PREFIX-left.npy, PREFIX-right.npy and PREFIX-value.npy (all ones).
chain() {
	n=$1
	left= right= ones=
	i=0
	while test $i -lt $n; do
		if test $i -lt $((n - 1)); then left="$left $((i + 1))"; else left="$left $((2 * n))"; fi
		right="$right $((n + i))"
		i=$((i + 1))
	done
	i=0
	while test $i -le $n; do left="$left -1"; right="$right -1"; i=$((i + 1)); done
	i=0
	while test $i -le $((2 * n)); do ones="$ones 1"; i=$((i + 1)); done
	npy_i64 $((2 * n + 1)) $left >"$2-left.npy" &&
	npy_i64 $((2 * n + 1)) $right >"$2-right.npy" &&
	npy $((2 * n + 1)) $ones >"$2-value.npy"
}

test_expect_success 'set up graphs' '
	cat >double.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
	g (float[3] x) => (float[3] y) {
	  h = local.Double (x)
	  y = local.Double (h)
	}
	<domain: "local", opset_import: ["" : 17]>
	Double (X) => (Y) { Y = Add (X, X) }
	EOF
	cp "$TEST_DIRECTORY/data/tree.txt" tree.txt &&
	cat >missing.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	g (float[2] x) => (float[2] y) {
	  y = tern.Invoke <function = "Nowhere", function_domain = "d"> (x)
	}
	EOF
	npy 3 1 2 3 >x.npy &&
	npy_i64 5 1 3 -1 -1 -1 >left.npy &&
	npy_i64 5 2 4 -1 -1 -1 >right.npy &&
	npy 5 1 2 4 8 16 >value.npy &&
	npy_i64 "" 0 >root.npy
'

test_expect_success 'a plain call of a model-local function runs' '
	tern-run -i x=x.npy double.txt >out &&
	grep -F "y float[3] [4, 8, 12]" out
'

# node 0 has children 1 and 2, node 1 has 3 and 4; leaves count twice (tree.Weight):
# 1 + 2 + 2 * (4 + 8 + 16) = 59
tree_inputs="-i left=left.npy -i right=right.npy -i value=value.npy -i root=root.npy"

test_expect_success 'tern.Invoke recurses until the If takes the leaf case' '
	tern-run $tree_inputs tree.txt >out &&
	grep -F "total float[] [59]" out
'

test_expect_success 'the same on two threads, after tern-optimize and tern-schedule, and repeated' '
	tern-optimize tree.txt | tern-schedule | tern-run --threads 2 --iters 5 $tree_inputs >out 2>err &&
	grep -F "total float[] [59]" out
'

test_expect_success 'a call of a subtree: the root is an input' '
	npy_i64 "" 1 >root1.npy &&
	tern-run -i left=left.npy -i right=right.npy -i value=value.npy -i root=root1.npy tree.txt >out &&
	grep -F "total float[] [50]" out
'

# 600 inner nodes: 600 ones + 601 leaves of weight 2 = 1802
test_expect_success 'a recursion 600 calls deep' '
	chain 600 c600 &&
	tern-run -i left=c600-left.npy -i right=c600-right.npy -i value=c600-value.npy -i root=root.npy tree.txt >out &&
	grep -F "total float[] [1802]" out
'

test_expect_success 'deeper than the limit: one error line, exit 65' '
	chain 1200 c1200 &&
	test_expect_code 65 tern-run -i left=c1200-left.npy -i right=c1200-right.npy -i value=c1200-value.npy \
		-i root=root.npy tree.txt >out 2>err &&
	test_one_error_line tern-run err &&
	grep -F "nested 1000 deep" err &&
	test_must_be_empty out
'

test_expect_success 'invoking a function the model does not define: one error line, exit 65' '
	test_expect_code 65 tern-run --random missing.txt >out 2>err &&
	test_one_error_line tern-run err &&
	grep -F "invokes d.Nowhere, which the model does not define" err
'

test_expect_success 'a function that calls itself on every path (directly or through another): one line, exit 65' '
	cat >endless.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	g (float[2] x) => (float[2] y) {
	  y = tern.Invoke <function = "Forever", function_domain = "d"> (x)
	}
	<domain: "d", opset_import: ["" : 17, "tern" : 1]>
	Forever (a) => (b) {
	  c = Neg (a)
	  b = tern.Invoke <function = "Forever", function_domain = "d"> (c)
	}
	EOF
	cat >mutual.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1]>
	g (float[2] x) => (float[2] y) {
	  y = tern.Invoke <function = "Ping", function_domain = "d"> (x)
	}
	<domain: "d", opset_import: ["" : 17, "tern" : 1]>
	Ping (a) => (b) { b = tern.Invoke <function = "Pong", function_domain = "d"> (a) }
	<domain: "d", opset_import: ["" : 17, "tern" : 1]>
	Pong (a) => (b) { c = Neg (a) b = tern.Invoke <function = "Ping", function_domain = "d"> (c) }
	EOF
	for f in endless mutual; do
		test_expect_code 65 tern-run --random $f.txt >out 2>err &&
		test_one_error_line tern-run err &&
		grep -F "calls itself on every path" err &&
		test_must_be_empty out || return 1
	done
'

test_expect_success 'a call with the wrong number of inputs or outputs: one line, exit 65' '
	cat >arity.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
	g (float[3] x) => (float[3] y) {
	  y = local.Double (x, x)
	}
	<domain: "local", opset_import: ["" : 17]>
	Double (X) => (Y) { Y = Add (X, X) }
	EOF
	cat >arity2.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
	g (float[3] x) => (float[3] y) {
	  y, z = local.Double (x)
	}
	<domain: "local", opset_import: ["" : 17]>
	Double (X) => (Y) { Y = Add (X, X) }
	EOF
	test_expect_code 65 tern-run -i x=x.npy arity.txt >out 2>err &&
	test_one_error_line tern-run err && grep -F "2 inputs given; Double takes 1" err &&
	test_expect_code 65 tern-run -i x=x.npy arity2.txt >out 2>err &&
	test_one_error_line tern-run err && grep -F "2 outputs asked for; Double returns 1" err
'

# The outputs of an If, or of a call whose result an If gives, take the type the branches declare
# (tern-graph(5)): a branch that computes another shape is refused where it runs; branches that
# declare different shapes leave the output's shape to the run.
test_expect_success 'a branch whose value differs from its declared type: one line, exit 65' '
	cat >liar.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "d" : 1, "tern" : 1]>
	g (float[3] x, int64 k) => (float[4] y) {
	  c = Cast <to = 9> (k)
	  t = tern.Invoke <function = "Pick", function_domain = "d"> (x, c)
	  y = Concat <axis = 0> (t, t)
	}
	<domain: "d", opset_import: ["" : 17]>
	Pick (x, c) => (y) {
	  y = If (c) <then_branch = a () => (float[2] ya) { ya = Slice (x, s0, s2) },
	              else_branch = b () => (float[2] yb) { yb = Identity (x) }>
	  s0 = Constant <value = int64[1] {0}> ()
	  s2 = Constant <value = int64[1] {2}> ()
	}
	EOF
	cat >fork.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17]>
	g (float[3] x, int64 k) => (float[N] y) {
	  c = Cast <to = 9> (k)
	  s0 = Constant <value = int64[1] {0}> ()
	  s2 = Constant <value = int64[1] {2}> ()
	  y = If (c) <then_branch = a () => (float[2] ya) { ya = Slice (x, s0, s2) },
	              else_branch = b () => (float[3] yb) { yb = Identity (x) }>
	}
	EOF
	npy_i64 "" 1 >true.npy &&
	npy_i64 "" 0 >false.npy &&
	tern-run -i x=x.npy -i k=true.npy liar.txt >out &&
	grep -F "y float[4] [1, 2, 1, 2]" out &&
	test_expect_code 65 tern-run -i x=x.npy -i k=false.npy liar.txt >out 2>err &&
	test_one_error_line tern-run err &&
	grep -F "output 0 is float[3], where the graph declares float[2]" err &&
	test_must_be_empty out &&
	tern-run -i x=x.npy -i k=true.npy fork.txt >out &&
	grep -F "y float[2] [1, 2]" out &&
	tern-run -i x=x.npy -i k=false.npy fork.txt >out &&
	grep -F "y float[3] [1, 2, 3]" out
'

test_expect_success 'tern-show -f dot draws each call as an edge to the function' '
	tern-show -f dot tree.txt >tree.dot &&
	test "$(grep -c "label=calls" tree.dot)" = 4 &&
	grep "label=\"function tree.TreeSum\"" tree.dot &&
	grep "label=\"function tree.Weight\"" tree.dot
'

test_expect_success DOT 'dot -Tsvg accepts it without a warning' '
	dot -Tsvg tree.dot >tree.svg 2>err &&
	test_must_be_empty err
'

test_expect_success PYTHON 'the file passes onnx.checker with full_check' '
	tern-show -f onnx -o tree.onnx tree.txt &&
	"$TERN_PYTHON" -c "import onnx; onnx.checker.check_model(onnx.load(\"tree.onnx\"), full_check=True)"
'

test_expect_success 'a function called with different weights computes with each (nothing kept from the last call)' '
	cat >lin.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
	g (float[1,2] x, float[2,2] w1, float[2,2] w2, int64 c) => (float[1,2] y1, float[1,2] y2) {
	  cb = Cast <to = 9> (c)
	  y1 = local.Lin (x, w1, cb)
	  y2 = local.Lin (x, w2, cb)
	}
	<domain: "local", opset_import: ["" : 17]>
	Lin (x, w, c) => (y) {
	  y = If (c) <then_branch = t () => (float[1,2] yt) { yt = MatMul (x, w) },
	              else_branch = f () => (float[1,2] yf) { yf = Identity (x) }>
	}
	EOF
	npy 1,2 1 2 >lx.npy &&
	npy 2,2 1 0 0 1 >w1.npy &&
	npy 2,2 2 0 0 2 >w2.npy &&
	npy_i64 "" 1 >c.npy &&
	tern-run -i x=lx.npy -i w1=w1.npy -i w2=w2.npy -i c=c.npy lin.txt >out &&
	grep -F "y1 float[1,2] [1, 2]" out &&
	grep -F "y2 float[1,2] [2, 4]" out
'

# One plan of a function serves arrays of every length when it only indexes them (Gather along axis
# 0) or passes them on: each run bounds the indices by the length it is given, and a function that
# reads the length itself (Shape) is planned for each one.
test_expect_success PYTHON 'a function that indexes an array runs on every length, bounded by each' '
	cat >pick.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
	g (int64[N] a, int64 k) => (int64 y, int64 n) {
	  y = local.Pick (a, k)
	  n = local.Len (a)
	}
	<domain: "local", opset_import: ["" : 17]>
	Pick (a, k) => (y) { y = Gather <axis = 0> (a, k) }
	<domain: "local", opset_import: ["" : 17]>
	Len (a) => (n) {
	  s = Shape (a)
	  n = Squeeze (s)
	}
	EOF
	"$TERN_PYTHON" -c "
import numpy as np, onnx
from onnx import numpy_helper as nh
def seq(name, arrays):
    q = onnx.SequenceProto(name=name, elem_type=onnx.SequenceProto.TENSOR)
    q.tensor_values.extend(nh.from_array(np.array(x, dtype=np.int64)) for x in arrays)
    open(name + \".pb\", \"wb\").write(q.SerializeToString())
seq(\"a\", [[10, 20, 30, 40, 50], [7, 8], [1, 2, 3], [4, 5, 6, 7, 8, 9]])
seq(\"k\", [4, 1, -1, 0])
seq(\"far\", [4, 4])
seq(\"a2\", [[10, 20, 30, 40, 50], [7, 8]])
" &&
	tern-run -i a=a.pb -i k=k.pb pick.txt -O picked &&
	"$TERN_PYTHON" -c "
import numpy as np
got = [(int(np.load(\"picked/y/%d.npy\" % e)), int(np.load(\"picked/n/%d.npy\" % e))) for e in range(4)]
assert got == [(50, 5), (8, 2), (3, 3), (4, 6)], got
" &&
	test_expect_code 65 tern-run -i a=a2.pb -i k=far.pb pick.txt -O far >out 2>err &&
	test_one_error_line tern-run err &&
	grep "Gather" err && grep "4" err
'

# A TreeRNN over a balanced tree of 255 nodes: a leaf is its word embedding, an inner node
# tanh([left; right] W + b), against numpy's recursion; on every kernel path and on two threads,
# where a node's two calls may run at once.
test_expect_success PYTHON 'a recursive network matches numpy on every path and thread count' '
	cat >treernn.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
	main (int64[N] left, int64[N] right, int64[N] word, int64 root, float[50,100] E, float[200,100] W, float[100] b) => (float[100] h) {
	  h = tern.Invoke <function = "Node", function_domain = "tree"> (root, left, right, word, E, W, b)
	}
	<domain: "tree", opset_import: ["" : 17, "tern" : 1, "tree" : 1]>
	Node (node, left, right, word, E, W, b) => (h) {
	  l = Gather <axis = 0> (left, node)
	  zero = Constant <value = int64 {0}> ()
	  leaf = Less (l, zero)
	  h = If (leaf) <then_branch = leaf_case () => (float[100] hl) {
	      w = Gather <axis = 0> (word, node)
	      hl = Gather <axis = 0> (E, w)
	    },
	    else_branch = inner_case () => (float[100] hi) {
	      r = Gather <axis = 0> (right, node)
	      a = tern.Invoke <function = "Node", function_domain = "tree"> (l, left, right, word, E, W, b)
	      c = tern.Invoke <function = "Node", function_domain = "tree"> (r, left, right, word, E, W, b)
	      ac = Concat <axis = 0> (a, c)
	      m = MatMul (ac, W)
	      mb = Add (m, b)
	      hi = Tanh (mb)
	  }>
	}
	EOF
	"$TERN_PYTHON" -c "
import numpy as np
n = 255
left = np.full(n, -1, np.int64); right = np.full(n, -1, np.int64)
for i in range(n // 2):
    left[i], right[i] = 2 * i + 1, 2 * i + 2
rng = np.random.default_rng(3)
word = rng.integers(0, 50, n).astype(np.int64)
E = rng.standard_normal((50, 100)).astype(np.float32)
W = (rng.standard_normal((200, 100)) * 0.1).astype(np.float32)
b = (rng.standard_normal(100) * 0.1).astype(np.float32)
for k, v in dict(left=left, right=right, word=word, E=E, W=W, b=b, root=np.array(0, np.int64)).items():
    np.save(k + \".npy\", v)
def h(i):
    if left[i] < 0:
        return E[word[i]].astype(np.float64)
    return np.tanh(np.concatenate([h(left[i]), h(right[i])]) @ W + b)
np.save(\"expect.npy\", h(0))
" &&
	for run in "1 avx512" "1 avx2" "1 generic" "2 avx512" "2 generic"; do
		set -- $run
		TERN_ISA=$2 tern-run --threads $1 -O got-$1-$2 -i left=left.npy -i right=right.npy -i word=word.npy \
			-i root=root.npy -i E=E.npy -i W=W.npy -i b=b.npy treernn.txt || return 1
		"$TERN_PYTHON" -c "
import numpy as np, sys
got, want = np.load(\"got-$1-$2/h.npy\"), np.load(\"expect.npy\")
err = np.abs(got - want).max()
print(\"threads $1, $2: largest difference\", err)
sys.exit(0 if err < 1e-5 else 1)
" || return 1
	done
'

test_done
