#!/bin/sh
# test.sh — builds tern and runs the whole test suite on a fresh machine: installs what is missing
# (scripts/setup.sh), then the release build's suites and the sanitizer build's (ASan + UBSan).
# The last line printed is "N passed, N failed, N skipped".
# Usage: scripts/test.sh [--quick]   (--quick: release build only)
set -u
cd "$(dirname "$0")/.."
scripts/setup.sh >&2 || { echo "setup failed" >&2; echo "0 passed, 1 failed"; exit 1; }

quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc 2>/dev/null || echo 2)

build() { # DIR ARGS...: configure once, then compile
	dir=$1
	shift
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; return 1; }
	fi
	ninja -C "$dir" -j "$jobs" >"$dir.ninja.log" 2>&1 || { tail -40 "$dir.ninja.log" >&2; return 1; }
}

status=0
run_suites() { # DIR SUITES...
	dir=$1
	shift
	args=""
	for s in "$@"; do args="$args --suite $s"; done
	# shellcheck disable=SC2086
	meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" $args || status=1
}

build build -Dcuda=auto -Dwerror=true || { echo "0 passed, 1 failed"; exit 1; }
run_suites build unit cli compat conformance models fuzz python programs trace
if [ $quick = 0 ]; then
	if build build-asan -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized; then
		run_suites build-asan unit cli conformance python programs trace
	else
		status=1
		echo "sanitizer build failed" >&2
	fi
	# ThreadSanitizer on the stream executor, the thread pools and asynchronous eager kernels.
	if build build-tsan -Dcuda=disabled -Db_sanitize=thread -Db_lundef=false -Dbuildtype=debugoptimized; then
		TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" meson test -C build-tsan --no-rebuild --print-errorlogs \
			test_streams test_sched test_tensor test_eager || status=1
	else
		status=1
		echo "thread-sanitizer build failed" >&2
	fi
fi

# Count every test of both builds from meson's JSON logs.
dirs=build
[ $quick = 0 ] && dirs="build build-asan build-tsan"
python3 scripts/count_tests.py $dirs
exit $status
