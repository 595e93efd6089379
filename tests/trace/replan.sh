#!/bin/sh
# A checked step that reads values (.item(), .numpy()) and then leaves its path: under --coexec the
# calls that matched their path before the divergence are only counted, and their record, fetches
# included, is made from the path's when the step leaves it. The graph made again at exit must be
# the one that tracing every step makes: the same inputs (and their shapes), outputs, initializers
# and operators; among the outputs, a value that only the diverging step read, before it diverged.
set -u
. "$(dirname "$0")/tally.sh"
trace_setup "$1"
cat >"$tmp/p.py" <<'P'
import numpy as np
import tern
rng = np.random.default_rng(3)
w = tern.Parameter(rng.standard_normal((5, 3)).astype(np.float32))
opt = tern.optim.SGD([w], lr=0.1)
for step in range(6):
    with tern.step():
        x = tern.step_input(rng.standard_normal((4, 5)).astype(np.float32))
        h = (x @ w).tanh()
        m = h.mean().item()  # read on the path, before the branch
        if step >= 3:  # first taken after tracing ended
            m += float(h.numpy()[0, 0])  # read only from here on: a value the traced steps did not read
            h = h * 2.0 + 0.1
        loss = (h * h).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, '%.6f %.6f' % (m, loss.item()))
P
cat >"$tmp/same.py" <<'P'
import collections, sys
import onnx
def summary(path):
    m = onnx.load(path)
    ops = collections.Counter()
    def walk(g):
        for n in g.node:
            ops[n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(m.graph)
    dims = lambda v: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
    return (len(m.graph.output), len(m.graph.initializer), sorted(ops.items()),
            [(i.name, dims(i)) for i in m.graph.input])
a, b = summary(sys.argv[1]), summary(sys.argv[2])
print('same' if a == b else 'traced %s\nco-executed %s' % (a, b))
P
plain=$("$PY" "$tmp/p.py" 2>"$tmp/err")
check "co-execution: the plain run's results" "$plain" \
	"$("$T" --coexec -v --steps 2 -o "$tmp/co.onnx" -- "$PY" "$tmp/p.py" 2>"$tmp/err")"
check "co-execution: one divergence, at the branch" \
	"tern-trace: co-execution: 3 steps matched the graph, 1 diverged (run as traced, then added to it), 1 re-plans" \
	"$(grep 'co-execution:' "$tmp/err")"
"$T" --steps 6 -o "$tmp/all.onnx" -- "$PY" "$tmp/p.py" >/dev/null 2>"$tmp/err2"
check "the graph made again is the graph of every step traced" "same" \
	"$("$PY" "$tmp/same.py" "$tmp/all.onnx" "$tmp/co.onnx" 2>&1)"
echo "# re-planned graph: $pass passed, $fail failed"
[ "$fail" = 0 ]
