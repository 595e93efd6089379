#!/bin/sh
# tern-trace's own failures: a program's exit status passed on, usage errors, nothing to trace, a
# program that cannot be run; and no graph file left behind by any of them.
set -u
T="$TERN_BUILD/bin/tern-trace"
PY="$1"
# the sanitizer build: its runtime first in the traced programs
[ -n "${TERN_TRACE_PRELOAD:-}" ] && export LD_PRELOAD="$TERN_TRACE_PRELOAD"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/tally.sh"
check() { # NAME WANT_STATUS COMMAND...
	name=$1 want=$2
	shift 2
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	[ "$got" = "$want" ] && [ ! -e "$tmp/g.onnx" ] && [ "$(wc -l <"$tmp/err")" -ge 1 ]
	tally "$name" $? "status $got (wanted $want)"
	rm -f "$tmp/g.onnx"
}
check "program's status" 3 "$T" -o "$tmp/g.onnx" -- "$PY" -c "import tern, sys; (tern.tensor([1.0]) * 2).item(); sys.exit(3)"
check "exception in the program" 1 "$T" -o "$tmp/g.onnx" -- "$PY" -c "import tern; raise RuntimeError('boom')"
check "no -o, nothing traced" 65 "$T" -- "$PY" -c "pass"
# without -o the graph goes to standard output and the program's own output to standard error
if "$T" -- "$PY" -c "import tern; print('hello'); print((tern.tensor([1.0, 2.0]) * 3).sum().item())" \
	>"$tmp/stdout.onnx" 2>"$tmp/err" && "$TERN_BUILD/bin/tern-show" -f stats "$tmp/stdout.onnx" >/dev/null &&
	grep -q hello "$tmp/err" && ! grep -q hello "$tmp/stdout.onnx"; then
	tally "graph on standard output" 0
else
	tally "graph on standard output" 1
fi
check "no program" 64 "$T" -o "$tmp/g.onnx"
check "bad --steps" 64 "$T" -o "$tmp/g.onnx" --steps 0 -- "$PY" -c "pass"
check "nothing traced" 65 "$T" -o "$tmp/g.onnx" -- "$PY" -c "print('no tern here')"
check "no such program" 69 "$T" -o "$tmp/g.onnx" -- "$tmp/no-such-program"
check "killed" 137 "$T" -o "$tmp/g.onnx" -- "$PY" -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
# a stale file from before is removed, not reported as this run's graph
touch "$tmp/g.onnx"
check "stale output removed" 65 "$T" -o "$tmp/g.onnx" -- "$PY" -c "pass"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
