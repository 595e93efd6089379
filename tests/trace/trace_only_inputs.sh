#!/bin/sh
# tern-trace --trace-only's rule for host tensors (tern-trace(1)): a tensor marked as the step's
# input (tern.step_input) is fed anew at every replayed step; one the program makes inside the traced
# step without the mark is replayed as the constant it was then; one made before the steps is the
# program's own. Step k adds input k, an in-step tensor 10 k and a tensor made before of 100, four
# elements each: the plain run sums 400 + 44 k, the replay 400 + 4 k.
set -u
. "$(dirname "$0")/tally.sh"
trace_setup "$1" # the build's module on the path is the plain run's; tern-trace adds it itself
cat >"$tmp/p.py" <<'P'
import numpy as np
import tern
before = tern.tensor(np.full(4, 100.0, np.float32))
sums = []
for k in range(3):
    with tern.step():
        x = tern.step_input(np.full(4, k, np.float32))
        m = tern.tensor(np.full(4, 10.0 * k, np.float32))
        sums.append((x + m + before).sum().item())
print(' '.join('%g' % v for v in sums))
P
check "plain run" "400 444 488" "$("$PY" "$tmp/p.py" 2>"$tmp/err")"
check "trace-only: inputs fed, in-step tensors frozen" "400 404 408" \
	"$("$T" --trace-only -o "$tmp/g.onnx" -- "$PY" "$tmp/p.py" 2>"$tmp/err")"
check "co-execution: the plain run's results" "400 444 488" \
	"$("$T" --coexec --steps 1 -o "$tmp/g.onnx" -- "$PY" "$tmp/p.py" 2>"$tmp/err")"
echo "# trace-only inputs: $pass passed, $fail failed"
[ "$fail" = 0 ]
