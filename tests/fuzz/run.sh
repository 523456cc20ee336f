#!/usr/bin/env bash
# Runs the fuzz target: tests/fuzz/run.sh BINARY RUNS [JOBS [WORK]]
#   RUNS executions in all (split between JOBS processes), starting from the
#   nets, the test nets and the bad-input corpus; new inputs go to
#   WORK/corpus, anything that fails to WORK/ (crash-*, leak-*, timeout-*,
#   oom-*); WORK is the binary's directory unless given. tests/fuzz/regress/
#   holds every input that ever failed, byte for byte (so its variant too).
#   Prints "N passed, M failed" (M = failing processes). Every failure found
#   is fixed, its input kept in tests/fuzz/regress/ and, with the message it
#   now gets, in tests/bad/ (or in tests/nets/ if it is a valid net).
set -u
cd "$(dirname "$0")/../.."
bin=${1:?usage: tests/fuzz/run.sh BINARY RUNS [JOBS [WORK]]} runs=${2:-10000000} jobs=${3:-1}
work=${4:-$(dirname "$bin")}
mkdir -p "$work/corpus"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
per=$(( (runs + jobs - 1) / jobs ))
t0=$(date +%s)
pids=()
for j in $(seq 1 "$jobs"); do
    "$bin" -runs="$per" -max_len=4096 -timeout=20 -rss_limit_mb=2048 -seed="$j" \
        -dict=tests/fuzz/net.dict -artifact_prefix="$work/" -print_final_stats=1 \
        "$work/corpus" nets tests/nets tests/bad tests/fuzz/regress > "$work/fuzz-$j.log" 2>&1 &
    pids+=($!)
done
fail=0
for j in $(seq 1 "$jobs"); do
    wait "${pids[$((j - 1))]}" || fail=$((fail + 1))
done
execs=0
for j in $(seq 1 "$jobs"); do
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz-$j.log" | tail -1)
    execs=$((execs + ${n:-0}))
    if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|fuzz_net: " "$work/fuzz-$j.log"; then
        grep -E "ERROR|runtime error|fuzz_net:|Test unit written|SUMMARY" "$work/fuzz-$j.log" | head -8
    fi
done
secs=$(( $(date +%s) - t0 ))
echo "fuzz: $execs executions in ${secs} s ($jobs processes), corpus $(ls "$work/corpus" | wc -l) inputs"
echo "$((jobs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
