#!/bin/sh
# tern-run with values that are not tensors: sequences in from a folder of tensor files or a
# SequenceProto, out as a folder; optionals empty when not given; printed with their items' types.
test_description='tern-run: sequences and optionals'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'set up a graph that splits, edits and joins a sequence' '
	cat >seq.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 18]>
	g (float[6] x, seq(float[]) extra) => (seq(float[]) parts, float[] joined, int64 n, bool given)
	   <int64 two = {2}, int64 zero = {0}>
	{
	   parts = SplitToSequence (x, two)
	   first = SequenceAt (parts, zero)
	   more = SequenceInsert (extra, first)
	   n = SequenceLength (more)
	   joined = ConcatFromSequence <axis = 0> (more)
	   o = Optional (first)
	   given = OptionalHasElement (o)
	}
	EOF
	mkdir in
'

test_expect_success 'a sequence input from a folder (an empty one too), outputs to folders' '
	tern-run --random -O first seq.txt -i extra=in 2>err || { cat err; false; } &&
	test -f first/parts/0.npy && test -f first/parts/2.npy && ! test -e first/parts/3.npy &&
	tern-run --random seq.txt -i extra=first/parts >out &&
	grep "^parts seq(3) \[float\[2\], float\[2\], float\[2\]\]" out &&
	grep "^n int64\[\] \[4\]" out &&
	grep "^joined float\[8\]" out &&
	grep "^given bool\[\] \[1\]" out
'

test_expect_success 'a missing sequence input is one clear error (65)' '
	test_expect_code 65 tern-run --random seq.txt 2>err &&
	test "$(wc -l <err)" = 1 &&
	grep "input .extra. is a sequence; give it with -i extra=FOLDER" err
'

test_expect_success 'a tensor file where a sequence belongs is refused (65)' '
	test_expect_code 65 tern-run --random seq.txt -i extra=first/parts/0.npy 2>err &&
	grep "not an ONNX SequenceProto" err
'

test_expect_success 'an optional input not given is empty' '
	cat >opt.txt <<-\EOF &&
	<ir_version: 8, opset_import: ["" : 18]>
	g (optional(float[2]) maybe) => (bool has) {
	   has = OptionalHasElement (maybe)
	}
	EOF
	tern-run opt.txt >out &&
	grep "^has bool\[\] \[0\]" out &&
	tern-run opt.txt -i maybe=first/parts/1.npy >out &&
	grep "^has bool\[\] \[1\]" out
'

test_done
