#!/usr/bin/env bash
# make test: every check that needs no GPU, in a few minutes on two cores.
# Each suite prints "N passed, M failed"; this sums them into the last line.
# Data-dependent checks use $MGC_DATA (the four Fashion-MNIST files).
# The suites run in two lanes side by side (lane_a, lane_b below), each lane's
# one after another: most of a suite's time is one core's (a compiler, a fake
# GPU, a single-threaded reference), so the second core would idle. A suite's
# lines print when it ends, whole; MAKE_TEST_LANES=1 runs everything in one lane.
set -u
cd "$(dirname "$0")/.."
export MGC=${MGC:-./mgc}
CC=${CC:-cc}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# A fresh kernel cache, so the tests compile what they run.
export XDG_CACHE_HOME="$log/cache"

# SUITE=a,b (make test SUITE=a,b): only those suites
only=${SUITE:-}
wants() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }   # is one of these suites asked for?
wants_any() { local n; for n in "$@"; do wants "$n" && return 0; done; return 1; }
suite() {  # name, command...
    local name=$1; shift
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then return; fi
    local t0=$SECONDS
    "$@" > "$log/$name" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^[a-z]*:? ?[0-9]+ passed, [0-9]+ failed' "$log/$name" | tail -1)
    local p f
    p=$(echo "$line" | sed -E 's/.*\b([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*passed, ([0-9]+) failed.*/\1/')
    [ -z "$line" ] && { p=0; f=1; }
    [ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && f=1
    count "$p" "$f"
    {
        printf '%-10s %4d passed, %d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - t0))
        # a failure, and the indented lines after it (what the suite showed of the run that failed)
        if [ "$f" -ne 0 ]; then
            awk '/FAIL|error|Error/ {print; more = 1; next} more && /^    / {print; next} {more = 0}' "$log/$name" | head -40 | sed 's/^/    /'
        fi
        grep -E "^(ok|skip|note)" "$log/$name" | sed 's/^/    /'
    } > "$log/$name.summary"
    cat "$log/$name.summary"   # one write: the other lane's lines do not cut into it
}
# count PASSED FAILED: into the totals (a file: the lanes are processes of their own)
count() { echo "$1 $2" >> "$log/counts"; }
say() { local line; line=$(printf '%s\n' "$@"); echo "$line"; }

mkdir -p build
: > "$log/counts"
# what both lanes' suites build, built before they start (two makes of one file at once would clash)
make -s mgc build/unit_frontend build/unit_verify build/unit_runtime build/unit_comm build/unit_bgemm build/unit_export build/unit_export_py > "$log/unit-build" 2>&1 ||
    { echo "the unit test programs do not build:"; tail -5 "$log/unit-build" | sed 's/^/    /'; }

# lane a: the CUDA suites (NVRTC, the fake GPUs: one core's work), the fuzzer, the
# sanitizer build and its suites, the builds and examples. One lane took 15 minutes
# on this project's two-core machines, two take 12 (each lane about 11 of them).
lane_a() {
    if ! wants_any nvrtc fakecuda; then :
    elif [ -f /usr/local/cuda/include/nvrtc.h ]; then
        suite nvrtc bash tests/nvrtc.sh
        suite fakecuda bash tests/fakecuda.sh   # the CUDA device on GPUs emulated on the CPU
    else
        echo "nvrtc      skipped: no CUDA toolkit at /usr/local/cuda"
    fi
    # The fuzz target for a fixed number of executions from the seed corpus (make
    # fuzz runs it for millions), where clang and libFuzzer are installed.
    if ! wants fuzz; then :
    elif command -v clang > /dev/null && make -s build/fuzz/fuzz_net > "$log/fuzz-build" 2>&1; then
        mkdir -p "$log/fuzz-work"
        suite fuzz bash tests/fuzz/run.sh build/fuzz/fuzz_net 30000 1 "$log/fuzz-work"
    else
        say "fuzz       skipped: no clang with libFuzzer (apt-get install clang libclang-rt-14-dev)" "$(tail -3 "$log/fuzz-build" 2>/dev/null | sed 's/^/    /')"
    fi
    suite examples bash tests/examples.sh
    suite predict bash tests/predict.sh   # mgc evaluate, predict: a checkpoint alone
    suite images bash tests/images.sh   # image folders (PNG, JPEG) against Pillow
    suite builds bash tests/builds.sh
    suite export bash tests/export.sh   # mgc export --format onnx against ONNX Runtime (.venv), every net: 2-3 minutes
    # The bad-input corpus and the command-line checks again under AddressSanitizer
    # and UBSan (the host code; generated kernels are plain).
    if ! wants_any asan-bad asan-cli asan-dp; then :
    elif make -s -j2 SANITIZE=address,undefined BUILD=build/san BIN=build/san/mgc > "$log/san-build" 2>&1; then
        export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        suite asan-bad env MGC=build/san/mgc bash tests/bad.sh
        suite asan-cli env MGC=build/san/mgc bash tests/cli.sh
        suite asan-dp env MGC=build/san/mgc bash tests/dp.sh
    else
        say "sanitize   the sanitizer build failed:" "$(tail -5 "$log/san-build" | sed 's/^/    /')"
        count 0 1
    fi
}

# lane b: the unit programs, the command line, data parallelism, hardening and the
# reference checks against PyTorch
lane_b() {
    suite frontend sh -c "make -s build/unit_frontend && ./build/unit_frontend"
    suite verify sh -c "make -s build/unit_verify && ./build/unit_verify"
    suite includes python3 tests/includes.py   # no two files of a folder need each other (make's objects, by nm)
    suite runtime sh -c "make -s build/unit_runtime && ./build/unit_runtime"
    suite comm sh -c "make -s build/unit_comm && ./build/unit_comm"
    suite bgemm sh -c "make -s build/unit_bgemm && ./build/unit_bgemm"
    suite export_refuse sh -c "make -s build/unit_export_py && ./build/unit_export_py"   # the PyTorch export's refusals
    suite bad bash tests/bad.sh
    suite golden bash tests/golden.sh
    suite fusion bash tests/fusion.sh   # no activation kernel of its own where a producer's store can apply it
    suite cli bash tests/cli.sh
    suite dp bash tests/dp.sh
    suite hardening bash tests/hardening.sh
    suite export_c bash tests/export_c.sh   # mgc export --format c|cuda: each library built alone, against mgc predict
    if ! wants_any torch data export_py unfused direct dense chunked winograd vector bf16; then :
    elif /usr/bin/python3 -c "import torch" 2>/dev/null; then
        suite torch /usr/bin/python3 tests/torch/ref.py --out "$log/ref"
        suite data /usr/bin/python3 tests/torch/data_check.py   # --resize, --augment, --normalize against torchvision's recipe
        # mgc export --format pytorch: every net's module against mgc predict and the twins
        suite export_py /usr/bin/python3 tests/torch/export_check.py --out "$log/export-py-work"
        # The same checks with fusion off and every convolution through im2col + GEMM.
        # (Under each forced convolution form, the optimizers' variants of the op
        # nets add nothing: the update kernels are the same; groups and dilation
        # run the direct form whatever is forced.)
        noopt="--skip *_nesterov3 --skip *_adamw4 --skip op_conv_groups"
        suite unfused env MGC_FUSE=0 MGC_CONV=gemm /usr/bin/python3 tests/torch/ref.py --out "$log/ref-unfused" --only 'op_*' --only 'lenet*' --only small_resnet
        suite direct env MGC_CONV=direct /usr/bin/python3 tests/torch/ref.py --out "$log/ref-direct" --only 'op_conv*' $noopt --only small_resnet --only fd_small_resnet
        suite dense env MGC_CONV=dense /usr/bin/python3 tests/torch/ref.py --out "$log/ref-dense" --only 'op_conv*' $noopt --only small_resnet --only fd_small_resnet
        suite chunked env MGC_CONV=chunked /usr/bin/python3 tests/torch/ref.py --out "$log/ref-chunked" --only 'op_conv*' $noopt --only small_resnet --only fd_small_resnet --only lenet_sgd5
        suite winograd env MGC_CONV=winograd /usr/bin/python3 tests/torch/ref.py --out "$log/ref-winograd" --only 'op_conv*' $noopt --only fd_small_resnet
        # --precision bf16 against PyTorch's autocast and against mgc's policy emulated in
        # float64 (ref.py's docstring): every op net, LeNet, a ResNet with Winograd's form,
        # k replicas in bf16 against one device
        suite bf16 /usr/bin/python3 tests/torch/ref.py --precision bf16 --out "$log/ref-bf16" --only 'op_*' $noopt --only lenet_sgd5 \
            --only small_resnet --only dp_small_resnet_sync2 --only dp_lenet_sgd5_cpu3
        suite vector env MGC_CONV=vector /usr/bin/python3 tests/torch/ref.py --out "$log/ref-vector" --only 'op_conv*' $noopt --only small_resnet --only fd_small_resnet --only lenet_sgd5
    else
        echo "torch      skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
        count 0 1
    fi
}

# Two lanes: each on half of the CPUs this may use (taskset), so that mgc, which sizes its
# thread pool by the CPUs it may run on, runs one lane's work on its own cores: two lanes'
# pools on the same cores wait for each other's descheduled threads (the torch suite took
# 377 s beside the other lane, 130 s alone).
read -ra cpus <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))' 2> /dev/null)"
pin() {  # first last: this shell on cpus[first..last]
    [ ${#cpus[@]} -ge 2 ] && command -v taskset > /dev/null || return 0
    local list=${cpus[*]:$1:$(($2 - $1 + 1))}
    taskset -cp "${list// /,}" $BASHPID > /dev/null
}
if [ "${MAKE_TEST_LANES:-2}" = 1 ]; then
    lane_b; lane_a
else
    half=$(( ${#cpus[@]} / 2 ))
    ( pin 0 $((half - 1)); lane_a ) & a=$!
    ( pin $half $((${#cpus[@]} - 1)); lane_b )
    wait $a
fi
read -r total_pass total_fail < <(awk '{ p += $1; f += $2 } END { print p + 0, f + 0 }' "$log/counts")
[ -n "$only" ] && [ $total_pass -eq 0 ] && { echo "SUITE=$only: no such suite (see tests/run.sh)"; total_fail=$((total_fail + 1)); }
echo "total: $total_pass passed, $total_fail failed"
[ $total_fail -eq 0 ]
