# tally.sh — sourced by tern-trace's shell tests: their setting up, each check's line and the counts.
# trace_setup PY: $T (tern-trace), $PY (the interpreter), the build's module on the path, the sanitizer
# build's runtime preloaded, and $tmp (a folder removed at exit).
trace_setup() {
	T="$TERN_BUILD/bin/tern-trace"
	PY="$1"
	[ -n "${TERN_TRACE_PRELOAD:-}" ] && export LD_PRELOAD="$TERN_TRACE_PRELOAD"
	export PYTHONPATH="$TERN_BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
}
# tally NAME STATUS [WHY]: STATUS 0 passes; otherwise prints WHY and the command's stderr ($tmp/err).
pass=0 fail=0
tally() {
	if [ "$2" = 0 ]; then
		pass=$((pass + 1))
		echo "ok $1"
	else
		fail=$((fail + 1))
		echo "FAIL $1${3:+: $3}"
		cat "$tmp/err"
	fi
}
# check NAME WANT GOT: GOT (a command's output) is WANT.
check() {
	[ "$2" = "$3" ]
	tally "$1" $? "'$3' (wanted '$2')"
}
