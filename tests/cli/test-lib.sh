# test-lib.sh — the harness of the cli suite, in the manner of git's: a script sets test_description,
# sources this file, lists test_expect_success blocks and ends with test_done. Output is TAP; the last
# line says "N passed, N failed". Run a script alone with -v to see each test's output, -i to stop at
# the first failure, -d to keep the trash directory.
#
#   test_expect_success [PREREQ,...] 'what' 'shell commands'
#   test_expect_code CODE command args...      (inside a test: the command must exit with CODE)
#   test_cmp expect actual                     (inside a test: the files must be equal)

set -u

test_verbose=
test_immediate=
test_keep_trash=
for arg in "$@"; do
	case $arg in
	-v | --verbose) test_verbose=t ;;
	-i | --immediate) test_immediate=t ;;
	-d | --debug) test_keep_trash=t ;;
	*) echo "usage: $0 [-v] [-i] [-d]" >&2; exit 64 ;;
	esac
done

test_name=$(basename "$0" .sh)
TERN_SOURCE=${TERN_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}
TERN_BUILD=${TERN_BUILD:-$TERN_SOURCE/build}
TERN_PYTHON=$TERN_SOURCE/.venv/bin/python
TEST_DIRECTORY=$TERN_SOURCE/tests/cli
PATH=$TERN_BUILD/bin:$PATH
export TERN_SOURCE TERN_BUILD TERN_PYTHON TEST_DIRECTORY PATH
# Messages and sorting do not depend on the caller's locale.
LC_ALL=C
export LC_ALL

TRASH_DIRECTORY=$TERN_BUILD/tests/cli/trash.$test_name
test_log=$TERN_BUILD/tests/cli/$test_name.out
rm -rf "$TRASH_DIRECTORY" || exit 1
mkdir -p "$TRASH_DIRECTORY" || exit 1
cd "$TRASH_DIRECTORY" || exit 1

test_count=0
test_passed=0
test_failed=0
test_skipped=0
test_prereqs=" "

# Prerequisites: a test names them before its description and is skipped when one is missing.
test_set_prereq() { test_prereqs="$test_prereqs$1 "; }
test_have_prereq() {
	for p in $(echo "$1" | tr , ' '); do
		case $test_prereqs in *" $p "*) ;; *) return 1 ;; esac
	done
	return 0
}

test -x "$TERN_PYTHON" && "$TERN_PYTHON" -c 'import onnx' 2>/dev/null && test_set_prereq PYTHON
command -v dot >/dev/null 2>&1 && test_set_prereq DOT
command -v script >/dev/null 2>&1 && test_set_prereq SCRIPT
test -w /dev/full 2>/dev/null && test_set_prereq DEVFULL

# A float32 .npy file from numbers, without numpy: npy SHAPE VALUES... (SHAPE like 1,2).
npy() {
	python3 -c 'import struct, sys
shape = tuple(int(d) for d in sys.argv[1].split(","))
h = "{\x27descr\x27: \x27<f4\x27, \x27fortran_order\x27: False, \x27shape\x27: %r, }" % (shape,)
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
v = [float(x) for x in sys.argv[2:]]
sys.stdout.buffer.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + struct.pack("<%df" % len(v), *v))' "$@"
}

# Runs one test body in a subshell in the trash directory; its output goes to the log (and to the
# terminal with -v) as TAP comments.
test_run_() {
	(cd "$TRASH_DIRECTORY" && eval "$1") >"$test_log" 2>&1 </dev/null
}

test_report_output_() {
	sed 's/^/# /' "$test_log"
}

test_expect_success() {
	prereq=
	if test $# = 3; then
		prereq=$1
		shift
	fi
	test $# = 2 || { echo "bug in the test script: test_expect_success needs 2 or 3 arguments" >&2; exit 70; }
	test_count=$((test_count + 1))
	if test -n "$prereq" && ! test_have_prereq "$prereq"; then
		test_skipped=$((test_skipped + 1))
		echo "ok $test_count # skip $1 (missing $prereq)"
		return
	fi
	if test_run_ "$2"; then
		test_passed=$((test_passed + 1))
		echo "ok $test_count - $1"
		test -n "$test_verbose" && test_report_output_
	else
		test_failed=$((test_failed + 1))
		echo "not ok $test_count - $1"
		echo "$2" | sed 's/^/#	/'
		test_report_output_
		if test -n "$test_immediate"; then
			test_done
		fi
	fi
	return 0
}

# Helpers run in the test's shell: their variables are prefixed so as not to clobber the test's.
test_expect_code() {
	test_code_wanted_=$1
	shift
	"$@"
	test_code_got_=$?
	test "$test_code_got_" = "$test_code_wanted_" && return 0
	echo "test_expect_code: command exited $test_code_got_, wanted $test_code_wanted_: $*"
	return 1
}

test_cmp() {
	diff -u "$1" "$2"
}

test_must_be_empty() {
	if test -s "$1"; then
		echo "'$1' is not empty:"
		cat "$1"
		return 1
	fi
}

test_path_is_missing() {
	if test -e "$1"; then
		echo "'$1' exists"
		return 1
	fi
}

test_line_count() {
	# test_line_count = 1 file
	if ! test "$(wc -l <"$3")" "$1" "$2"; then
		echo "test_line_count: '$3' has $(wc -l <"$3") lines, wanted $1 $2:"
		cat "$3"
		return 1
	fi
}

# The error contract of every tool: exactly one stderr line, starting with the tool's name.
test_one_error_line() {
	test_line_count = 1 "$2" || return 1
	if ! grep -q "^$1: " "$2"; then
		echo "the message does not start with '$1: ':"
		cat "$2"
		return 1
	fi
}

test_done() {
	echo "1..$test_count"
	echo "# $test_name: $test_passed passed, $test_failed failed, $test_skipped skipped"
	if test "$test_failed" = 0 && test -z "$test_keep_trash"; then
		cd "$TERN_BUILD" && rm -rf "$TRASH_DIRECTORY" "$test_log"
	fi
	test "$test_failed" = 0
	exit $?
}
