#!/bin/sh
test_description='tern-show -f dot: awkward names, subgraphs and functions give DOT that Graphviz accepts'
. "$(dirname "$0")/test-lib.sh"

data=$TEST_DIRECTORY/data

test_expect_success PYTHON 'setup' '
	"$TERN_PYTHON" "$TEST_DIRECTORY/make-models.py" .
'

test_expect_success PYTHON 'awkward names: quotes, backslashes, markup, unicode, newline, 5000 characters, bad UTF-8' '
	tern-show -f dot odd-names.onnx >odd.dot &&
	grep -c "label=\"Relu" odd.dot >count &&
	echo 10 >expect &&
	test_cmp expect count
'

test_expect_success PYTHON 'long names are cut in labels and kept whole in tooltips' '
	grep "label=\"Relu\\\\nLLLL*…\"" odd.dot &&
	test "$(grep -o "L*" odd.dot | awk "length > 4999" | wc -l)" -ge 1
'

test_expect_success PYTHON 'invalid UTF-8 and control characters are shown as \xNN' '
	grep "label=\"Relu\\\\n\\\\\\\\xff\\\\\\\\xfe" odd.dot &&
	grep "new\\\\\\\\x0aline" odd.dot
'

test_expect_success PYTHON,DOT 'dot -Tsvg accepts the awkward names without a warning' '
	dot -Tsvg odd.dot >odd.svg 2>err &&
	test_must_be_empty err &&
	grep -F "say &quot;hi&quot;" odd.svg &&
	grep -F "&lt;b&gt;html&lt;/b&gt;" odd.svg &&
	grep -F "back\\slash\\" odd.svg
'

test_expect_success 'subgraphs and functions are clusters' '
	tern-show -f dot "$data/control.txt" >control.dot &&
	grep "subgraph cluster_" control.dot >clusters &&
	test_line_count = 4 clusters &&
	grep "label=\"then_branch of If\"" control.dot &&
	grep "label=\"else_branch of If\"" control.dot &&
	grep "label=\"body of Loop\"" control.dot &&
	grep "label=\"function local.double\"" control.dot
'

test_expect_success 'values read from an enclosing graph are dashed edges into the cluster' '
	test "$(grep -c "style=dashed" control.dot)" = 5
'

test_expect_success DOT 'dot -Tsvg accepts subgraphs and functions' '
	dot -Tsvg control.dot >control.svg 2>err &&
	test_must_be_empty err
'

test_expect_success 'graph inputs and outputs are drawn apart from operators' '
	test "$(grep -c "shape=invhouse" control.dot)" = 7 &&
	test "$(grep -c "shape=house" control.dot)" = 7
'

test_expect_success 'a scheduled graph colours its operators by stream' '
	cat >fork.txt <<-\EOT &&
	<ir_version: 8, opset_import: ["" : 17]>
	fork (float[2] x) => (float[2] y) {
	   a = Relu (x)
	   b = Neg (x)
	   y = Add (a, b)
	}
	EOT
	tern-schedule -o fork.onnx fork.txt &&
	test "$(tern-show -f plan fork.onnx | cut -f2 | sort -u | wc -l)" = 2 &&
	tern-show -f dot fork.onnx >fork.dot &&
	grep -o "fillcolor=\"[0-9.]* 0.400 0.950\"" fork.dot | sort -u >colours &&
	test_line_count = 2 colours
'

test_expect_success 'an unscheduled graph has no stream colours' '
	tern-show -f dot fork.txt >plain.dot &&
	! grep "0.400 0.950" plain.dot
'

test_expect_success DOT 'dot -Tsvg accepts the colours' '
	dot -Tsvg fork.dot >fork.svg 2>err &&
	test_must_be_empty err
'

test_done
