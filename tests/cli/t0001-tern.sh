#!/bin/sh
test_description='tern dispatcher: tool list, running tern-X, version'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'tern alone prints the tool list on stderr and exits 64' '
	test_expect_code 64 tern >out 2>err &&
	test_must_be_empty out &&
	grep "^usage: tern TOOL" err &&
	grep "^  show " err
'

test_expect_success 'tern --help lists the tools found, one line each' '
	tern --help >out &&
	grep "^  show  *print a graph" out &&
	grep "^  run  *run a graph" out &&
	test "$(grep -c "^  [a-z-]*  " out)" -ge 2
'

test_expect_success 'tern --version' '
	tern --version >out &&
	grep "^tern (tern) [0-9][0-9.]*$" out
'

test_expect_success 'tern show runs tern-show with its arguments' '
	tern show --version >actual &&
	tern-show --version >expect &&
	test_cmp expect actual &&
	grep "^tern-show (tern) " actual
'

test_expect_success 'the exit status of the tool is passed on' '
	test_expect_code 66 tern show no-such-file.onnx 2>err &&
	grep "^tern-show: no-such-file.onnx: " err
'

test_expect_success 'tools beside tern are found without PATH' '
	PATH=/usr/bin:/bin "$TERN_BUILD/bin/tern" show --version >actual &&
	grep "^tern-show (tern) " actual
'

test_expect_success 'an unknown tool is a usage error with one message line' '
	test_expect_code 64 tern no-such-tool 2>err &&
	test_line_count = 1 err &&
	grep "^tern: .no-such-tool. is not a tern tool" err
'

test_expect_success 'a tool name cannot be a path' '
	test_expect_code 64 tern ../bin/tern-show --version 2>err &&
	test_line_count = 1 err
'

test_expect_success 'an unknown option is a usage error' '
	test_expect_code 64 tern --frobnicate 2>err &&
	test_line_count = 1 err
'

test_done
