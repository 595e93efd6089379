#!/bin/sh
test_description='tern-show: every class of bad input fails with one message line, exit 65 (66) and no output'
. "$(dirname "$0")/test-lib.sh"

data=$TEST_DIRECTORY/data

# A bad graph must exit with the code given, print exactly one stderr line starting "tern-show:"
# (naming the file), nothing on standard output, and leave no output file.
check_bad() {
	code=$1
	file=$2
	test_expect_code "$code" tern-show "$file" >out 2>err &&
	test_must_be_empty out &&
	test_one_error_line tern-show err &&
	grep -F "tern-show: $file: " err &&
	mkdir -p outdir &&
	test_expect_code "$code" tern-show -f onnx -o outdir/out.onnx "$file" 2>err &&
	test "$(ls -A outdir)" = ""
}

# A text model of opset 17 with the graph given.
write_graph() {
	printf '<ir_version: 8, opset_import: ["" : 17]>\n%s\n' "$2" >"$1"
}

test_expect_success 'setup' '
	tern-show -f onnx -o mlp.onnx "$data/mlp.txt" &&
	tern-show -f onnx -o control.onnx "$data/control.txt"
'

test_expect_success PYTHON 'setup: malformed models' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-models.py" .
'

test_expect_success 'an empty file' '
	: >empty.onnx &&
	check_bad 65 empty.onnx
'

test_expect_success 'empty standard input' '
	test_expect_code 65 tern-show </dev/null >out 2>err &&
	test_must_be_empty out &&
	test_one_error_line tern-show err
'

test_expect_success PYTHON 'random bytes' '
	check_bad 65 random-bytes.onnx
'

test_expect_success 'text that is not the text syntax' '
	printf "this is not a model\n" >prose.txt &&
	check_bad 65 prose.txt
'

test_expect_success 'a truncated binary model, cut at many places' '
	size=$(wc -c <control.onnx) &&
	for n in 1 2 5 10 20 50 100 200 300 400 500; do
		test $n -lt $size || continue
		head -c $n control.onnx >truncated.onnx &&
		check_bad 65 truncated.onnx || return 1
	done
'

test_expect_success 'a truncated text model' '
	head -n 9 "$data/mlp.txt" >truncated.txt &&
	check_bad 65 truncated.txt
'

test_expect_success PYTHON 'a cycle' '
	check_bad 65 cycle.onnx &&
	grep "cycle" err
'

test_expect_success 'a cycle in the text syntax' '
	write_graph cycle.txt "g (float[2] x) => (float[2] y) {
	   a = Add (x, b)
	   b = Relu (a)
	   y = Identity (b)
	}" &&
	check_bad 65 cycle.txt
'

test_expect_success PYTHON 'an input that nothing defines' '
	check_bad 65 undefined-input.onnx &&
	grep "nowhere" err
'

test_expect_success 'an undefined input in the text syntax' '
	write_graph undefined.txt "g (float[2] x) => (float[2] y) {
	   y = Add (x, nowhere)
	}" &&
	check_bad 65 undefined.txt
'

test_expect_success PYTHON 'two nodes defining the same output' '
	check_bad 65 duplicate-output.onnx
'

test_expect_success 'an output defined twice in the text syntax' '
	write_graph twice.txt "g (float[2] x) => (float[2] y) {
	   y = Relu (x)
	   y = Neg (x)
	}" &&
	check_bad 65 twice.txt
'

test_expect_success PYTHON 'an attribute of the wrong type' '
	check_bad 65 wrong-attribute-type.onnx &&
	grep "axis" err
'

test_expect_success 'an attribute of the wrong type in the text syntax' '
	write_graph attr.txt "g (float[2, 3] x) => (float[3, 2] y) {
	   y = Transpose <perm = \"backwards\"> (x)
	}" &&
	check_bad 65 attr.txt
'

test_expect_success PYTHON 'a negative dimension' '
	check_bad 65 negative-dimension.onnx
'

test_expect_success PYTHON 'an absurdly large initializer' '
	check_bad 65 absurd-dimension.onnx
'

test_expect_success PYTHON 'an initializer with less data than its shape' '
	check_bad 65 short-initializer.onnx
'

test_expect_success 'an absurd dimension in the text syntax' '
	write_graph huge.txt "g (float[2] x) => (float[2] y)
	<float[1099511627776, 1099511627776] w = {1.0}>
	{
	   y = Add (x, w)
	}" &&
	check_bad 65 huge.txt
'

test_expect_success PYTHON 'an unknown opset version' '
	check_bad 65 unknown-opset.onnx &&
	grep "9999" err
'

test_expect_success 'an unknown opset version in the text syntax' '
	cat >opset.txt <<-\EOT &&
	<ir_version: 8, opset_import: ["" : 9999]>
	g (float[2] x) => (float[2] y) {
	   y = Relu (x)
	}
	EOT
	check_bad 65 opset.txt
'

test_expect_success PYTHON 'a model without a graph' '
	check_bad 65 no-graph.onnx
'

test_expect_success 'a missing file' '
	check_bad 66 no-such-file.onnx
'

test_expect_success 'a folder instead of a file cannot be opened as one' '
	mkdir folder.onnx &&
	check_bad 66 folder.onnx
'

test_done
