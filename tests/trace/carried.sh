#!/bin/sh
# A tensor made in one step and read in the next (a value carried between steps, as memory_bank's
# bank of keys): under --coexec every checked step must match the graph. Each output carries the
# step that made it; when that was the step's index, a checked step that matched gave its index to
# the next, which then read the carried tensor as the output of its own operation at the same
# position: a dependence that was not there, and a divergence at every other step.
set -u
. "$(dirname "$0")/tally.sh"
trace_setup "$1"
cat >"$tmp/p.py" <<'P'
import numpy as np
import tern
prev = tern.tensor(np.zeros(4, np.float32))
sums = []
for k in range(8):
    with tern.step():
        x = tern.step_input(np.full(4, k, np.float32))
        a = x * 2.0
        sums.append((a + prev).sum().item())
        prev = a
print(' '.join('%g' % v for v in sums))
P
check "plain run" "0 8 24 40 56 72 88 104" "$("$PY" "$tmp/p.py" 2>"$tmp/err")"
check "co-execution: the plain run's results" "0 8 24 40 56 72 88 104" \
	"$("$T" --coexec -v --steps 2 -o "$tmp/g.onnx" -- "$PY" "$tmp/p.py" 2>"$tmp/err")"
check "co-execution: every checked step matched" \
	"tern-trace: co-execution: 6 steps matched the graph, 0 diverged (run as traced, then added to it), 0 re-plans" \
	"$(grep 'co-execution:' "$tmp/err")"
echo "# carried values: $pass passed, $fail failed"
[ "$fail" = 0 ]
