# tally.sh — sourced by tern-trace's shell tests: each check's line and the counts.
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
