#!/bin/sh
# tern-show --infer-shapes and --dim: the types tern's shape rules give every value, written as
# value_info (symbolic dimensions kept where a value's dimension is an input's symbol), and DOT edge
# labels from them.
test_description='tern-show --infer-shapes'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'set up a graph with a symbolic batch and shape arithmetic' '
	cat >sym.txt <<-\EOF
	<ir_version: 8, opset_import: ["" : 17]>
	g (float[N,3,8,8] x, float[B,S,16] t) => (float[N,?] y, float[B,S,4,4] u, float[?] v)
	   <float[4,3,1,1] w = {0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5},
	    int64[1] zero = {0}, int64[1] m1 = {-1}, int64[4] heads = {0,0,4,4}>
	{
	   c = Conv (x, w)
	   r = Relu (c)
	   s = Shape (r)
	   b = Gather <axis = 0> (s, zero)
	   shape = Concat <axis = 0> (b, m1)
	   y = Reshape (r, shape)
	   p = MaxPool <kernel_shape = [2,2], strides = [2,2]> (r)
	   u = Reshape <allowzero = 0> (t, heads)
	   f = Flatten <axis = 0> (t)
	   v = Squeeze (f, zero)
	}
	EOF
'

test_expect_success '--infer-shapes writes every value, symbols kept' '
	tern-show --infer-shapes sym.txt >out &&
	grep "float\[N,4,8,8\] c," out &&
	grep "float\[N,4,8,8\] r," out &&
	grep "int64\[4\] s," out &&
	grep "int64\[2\] shape," out &&
	grep "float\[N,4,4,4\] p," out &&
	grep "float\[1,?\] f" out
'

test_expect_success 'declared outputs stay as declared' '
	tern-show --infer-shapes sym.txt >out &&
	grep "=> (float\[N,?\] y, float\[B,S,4,4\] u, float\[?\] v)" out
'

test_expect_success '--dim makes them concrete' '
	tern-show --infer-shapes --dim N=2 --dim B=3 --dim S=5 sym.txt >out &&
	grep "float\[2,4,8,8\] c," out &&
	grep "float\[1,240\] f" out &&
	grep "=> (float\[2,?\] y, float\[3,5,4,4\] u" out
'

test_expect_success 'the binary output carries them as value_info' '
	tern-show -f onnx --infer-shapes sym.txt -o typed.onnx &&
	tern-show typed.onnx >out &&
	grep "float\[N,4,4,4\] p," out &&
	tern-show -f onnx sym.txt | tern-show >plain &&
	! grep "float\[N,4,4,4\] p," plain
'

test_expect_success 'a --dim no shape uses is a usage error' '
	test_expect_code 64 tern-show --dim Q=2 sym.txt 2>err &&
	grep "no graph input, output or value has a dimension named .Q." err &&
	test_expect_code 64 tern-show --dim N=0 sym.txt 2>err &&
	grep "positive integer" err
'

test_expect_success 'DOT labels every edge with its type' '
	tern-show -f dot sym.txt >g.dot &&
	test "$(grep -c -- "->" g.dot)" -gt 8 &&
	! grep -- "->" g.dot | grep -v "label=\"[a-z0-9]*\[" &&
	grep "label=\"float\[N,4,8,8\]\"" g.dot
'

test_done
