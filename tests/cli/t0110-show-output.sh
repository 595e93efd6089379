#!/bin/sh
test_description='tern-show: -o replaces a file only on success, no terminal gets binary, signals clean up'
. "$(dirname "$0")/test-lib.sh"

data=$TEST_DIRECTORY/data

test_expect_success 'setup' '
	tern-show -f onnx -o mlp.onnx "$data/mlp.txt" &&
	printf "not a model" >broken.onnx
'

test_expect_success '-o writes the file and nothing on standard output' '
	tern-show -f stats -o out.stats mlp.onnx >stdout &&
	test_must_be_empty stdout &&
	tern-show -f stats mlp.onnx >expect &&
	test_cmp expect out.stats
'

test_expect_success '-o - means standard output' '
	tern-show -f stats -o - mlp.onnx >actual &&
	test_cmp expect actual
'

test_expect_success '-o replaces an existing file and keeps its mode' '
	echo old >kept.txt &&
	chmod 640 kept.txt &&
	tern-show -o kept.txt mlp.onnx &&
	tern-show mlp.onnx >expect &&
	test_cmp expect kept.txt &&
	test "$(stat -c %a kept.txt)" = 640
'

test_expect_success '-v says what is read and written, -q silences it' '
	tern-show -v -o verbose.txt mlp.onnx 2>err &&
	grep "^tern-show: read mlp.onnx$" err &&
	grep "^tern-show: wrote verbose.txt$" err &&
	tern-show -v -q -o quiet.txt mlp.onnx 2>err &&
	test_must_be_empty err
'

test_expect_success 'a new file gets the mode the umask allows' '
	(umask 027 && tern-show -o masked.txt mlp.onnx) &&
	test "$(stat -c %a masked.txt)" = 640
'

test_expect_success 'on bad input no output file is created and none is left behind' '
	mkdir fail &&
	test_expect_code 65 tern-show -o fail/out.txt broken.onnx 2>err &&
	test_one_error_line tern-show err &&
	test_path_is_missing fail/out.txt &&
	test "$(ls -A fail)" = ""
'

test_expect_success 'on bad input an existing output file is left as it was' '
	echo precious >fail/keep.txt &&
	test_expect_code 65 tern-show -o fail/keep.txt broken.onnx 2>err &&
	echo precious >expect &&
	test_cmp expect fail/keep.txt &&
	test "$(ls -A fail)" = "keep.txt"
'

test_expect_success 'a missing input leaves no output either' '
	test_expect_code 66 tern-show -o fail/none.txt no-such.onnx 2>err &&
	test_one_error_line tern-show err &&
	test "$(ls -A fail)" = "keep.txt"
'

test_expect_success 'an output folder that does not exist is an I/O error' '
	test_expect_code 74 tern-show -o no-such-dir/out.txt mlp.onnx 2>err &&
	test_one_error_line tern-show err &&
	grep "no-such-dir/out.txt" err
'

test_expect_success DEVFULL 'a failed write to -o is an I/O error' '
	test_expect_code 74 tern-show -f onnx -o /dev/full mlp.onnx 2>err &&
	test_one_error_line tern-show err
'

test_expect_success DEVFULL 'a failed write to standard output is an I/O error' '
	test_expect_code 74 tern-show mlp.onnx >/dev/full 2>err &&
	test_one_error_line tern-show err
'

# script(1) gives the command a pseudo-terminal as standard output.
test_expect_success SCRIPT 'binary output to a terminal is refused' '
	script -qec "tern-show -f onnx mlp.onnx" /dev/null >out 2>&1
	test $? = 64 &&
	grep "^tern-show: refusing to write binary output to a terminal" out
'

test_expect_success SCRIPT 'text output to a terminal is fine' '
	script -qec "tern-show -f stats mlp.onnx" /dev/null >out 2>&1 &&
	grep "MatMul" out
'

test_expect_success SCRIPT 'binary output to a terminal is refused before standard input is read' '
	script -qec "tern-show -f onnx" /dev/null >out 2>&1 </dev/null
	test $? = 64 &&
	grep "^tern-show: refusing" out
'

test_expect_success 'a signal removes the temporary output' '
	mkdir sig &&
	mkfifo sig.fifo &&
	{ tern-show -o sig/out.txt sig.fifo & } &&
	pid=$! &&
	for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
		test "$(ls -A sig)" != "" && break
		sleep 0.1
	done
	ls -A sig >during
	kill -TERM $pid
	wait $pid
	status=$?
	test -s during &&
	test $status = 143 &&
	test "$(ls -A sig)" = ""
'

test_done
