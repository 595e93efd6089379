#!/bin/sh
test_description='tern-show: text, onnx, dot and stats output; standard input and output; round trips'
. "$(dirname "$0")/test-lib.sh"

data=$TEST_DIRECTORY/data
golden=$TEST_DIRECTORY/golden

test_expect_success 'setup: binary models from the text syntax' '
	tern-show -f onnx -o mlp.onnx "$data/mlp.txt" &&
	tern-show -f onnx -o control.onnx "$data/control.txt" &&
	test -s mlp.onnx && test -s control.onnx
'

test_expect_success 'text is the default format' '
	tern-show mlp.onnx >default &&
	tern-show -f text mlp.onnx >text &&
	tern-show --text mlp.onnx >long &&
	test_cmp text default &&
	test_cmp text long &&
	grep "MatMul" text
'

test_expect_success 'the graph is read from standard input when absent or -' '
	tern-show -f text mlp.onnx >expect &&
	tern-show -f text <mlp.onnx >none &&
	tern-show -f text - <mlp.onnx >dash &&
	cat mlp.onnx | tern-show -f text >pipe &&
	test_cmp expect none &&
	test_cmp expect dash &&
	test_cmp expect pipe
'

test_expect_success 'text and binary input give the same output' '
	tern-show -f text --weights "$data/mlp.txt" >from-text &&
	tern-show -f text --weights mlp.onnx >from-onnx &&
	test_cmp from-text from-onnx
'

test_expect_success 'round trip: text to onnx to text is stable' '
	for m in mlp.onnx control.onnx; do
		tern-show -f text --weights $m >expect &&
		tern-show -f text --weights $m | tern-show -f onnx | tern-show -f text --weights >actual &&
		test_cmp expect actual || return 1
	done
'

test_expect_success 'round trip: text without weights is stable too' '
	tern-show -f text control.onnx >expect &&
	tern-show -f text control.onnx | tern-show -f onnx | tern-show -f text >actual &&
	test_cmp expect actual
'

test_expect_success 'round trip: onnx to onnx gives the same bytes' '
	tern-show -f onnx control.onnx >once &&
	tern-show -f onnx once >twice &&
	cmp once twice &&
	tern-show -f text --weights mlp.onnx | tern-show -f onnx >mlp-again.onnx &&
	tern-show -f onnx mlp.onnx | cmp - mlp-again.onnx
'

test_expect_success 'stats of the small MLP' '
	tern-show -f stats mlp.onnx >actual &&
	test_cmp "$golden/mlp.stats" actual
'

test_expect_success 'stats count subgraph nodes, functions and annotations' '
	tern-show --stats control.onnx >actual &&
	test_cmp "$golden/control.stats" actual
'

test_expect_success 'stats name standard input "-"' '
	tern-show -f stats <mlp.onnx | head -n 1 >actual &&
	grep "^model  *-$" actual
'

test_expect_success 'dot output has one node per operator and one edge per use' '
	tern-show -f dot mlp.onnx >mlp.dot &&
	grep "^digraph " mlp.dot &&
	test "$(grep -c "label=\"*\(MatMul\|Add\|Relu\)\"*[],]" mlp.dot)" = 3 &&
	grep -c -- "->" mlp.dot >edges &&
	echo 4 >expect &&
	test_cmp expect edges
'

test_expect_success 'dot with --weights draws the initializers' '
	tern-show -f dot --weights mlp.onnx >weights.dot &&
	grep -c "shape=note" weights.dot >count &&
	echo 2 >expect &&
	test_cmp expect count &&
	test "$(grep -c -- "->" weights.dot)" = 6
'

test_expect_success DOT 'dot output is valid for dot -Tsvg' '
	for m in mlp.onnx control.onnx; do
		tern-show -f dot --weights $m >g.dot &&
		dot -Tsvg g.dot >g.svg 2>err &&
		test_must_be_empty err &&
		grep "<svg" g.svg || return 1
	done
'

test_expect_success 'binary output goes to a pipe' '
	tern-show -f onnx mlp.onnx | cmp - mlp.onnx
'

test_expect_success 'an unknown format is a usage error' '
	test_expect_code 64 tern-show -f yaml mlp.onnx >out 2>err &&
	test_must_be_empty out &&
	grep "^tern-show: unknown format .yaml." err
'

test_expect_success 'two graphs are a usage error' '
	test_expect_code 64 tern-show mlp.onnx control.onnx 2>err &&
	grep "^tern-show: one graph at most" err
'

test_expect_success 'an unknown option is a usage error' '
	test_expect_code 64 tern-show --frobnicate mlp.onnx 2>err &&
	grep "^tern-show: " err
'

test_expect_success '--version and --help' '
	tern-show --version >out &&
	grep "^tern-show (tern) [0-9][0-9.]*$" out &&
	tern-show --help >help &&
	grep -- "--format=FORMAT" help &&
	grep -- "--output=FILE" help
'

test_done
