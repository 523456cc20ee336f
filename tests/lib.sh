# The shell suites' shared helpers (sourced). The suite sets SUITE (its name
# in FAIL lines), MGC and tmp; pass and fail count its checks, and its last
# line says "N passed, M failed" (run.sh sums them).
pass=0 fail=0

# suite_setup NAME: the suite's name (in FAIL lines), $MGC (default ./mgc),
# and a work directory $tmp, removed at exit
suite_setup() {
    SUITE=$1
    MGC=${MGC:-./mgc}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
}
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $SUITE $*"; }

# expect NAME STATUS TEXT -- ARGS: mgc ARGS exits with STATUS within two
# minutes ($MGC_EXPECT_TIMEOUT seconds where set), prints TEXT (stdout or
# stderr), and shows no crash
expect() {
    local name=$1 status=$2 text=$3; shift 4
    timeout "${MGC_EXPECT_TIMEOUT:-120}" "$MGC" "$@" > "$tmp/out" 2>&1
    local rc=$?
    if [ $rc -ne "$status" ]; then bad "$name: exit $rc, wanted $status (mgc $*)"; head -5 "$tmp/out" | sed 's/^/    /'
    elif ! grep -qF -- "$text" "$tmp/out"; then bad "$name: output lacks '$text' (mgc $*)"; head -5 "$tmp/out" | sed 's/^/    /'
    elif grep -qE "Segmentation|AddressSanitizer|runtime error|Assertion" "$tmp/out"; then bad "$name: crashed (mgc $*)"; head -5 "$tmp/out" | sed 's/^/    /'
    else pass=$((pass + 1)); fi
}

# wait_for PID SECONDS: waits for a background mgc, killing it (-9) after
# SECONDS; returns its exit status (137 when it had to be killed). No
# watchdog subshell: one killed early would run the suite's EXIT trap.
wait_for() {
    local pid=$1 ticks=$(($2 * 10))
    while [ $ticks -gt 0 ] && kill -0 "$pid" 2> /dev/null; do sleep 0.1; ticks=$((ticks - 1)); done
    kill -9 "$pid" 2> /dev/null
    wait "$pid"
}
