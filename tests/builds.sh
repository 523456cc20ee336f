#!/usr/bin/env bash
# mgc builds and runs without the optional parts: CUDA=0 MPI=0 gives a binary
# that says what it lacks (--gpus, --emit ptx: a clear message, exit 2 or 1)
# and trains on CPU devices the same as the full build. And the full build
# has the CUDA device, linking only NVRTC. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL builds $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
P=build/plain
rm -f $P/mgc   # linked again: the build report comes with the link, also when the objects are up to date
if make -s -j2 CUDA=0 MPI=0 BUILD=$P BIN=$P/mgc > "$tmp/build" 2>&1; then
    grep -q "without MPI (MPI=0)" "$tmp/build" && grep -q "no CUDA (CUDA=0)" "$tmp/build" &&
        ok "CUDA=0 MPI=0 builds and says so: $(grep -c . "$tmp/build") lines" || { bad "the plain build's report"; cat "$tmp/build"; }
    ! ldd $P/mgc | grep -qE "nvrtc|libmpi" && ok "the plain build links neither NVRTC nor MPI" || bad "the plain build links NVRTC or MPI"
    $P/mgc nets/lenet.net --gpus 1 > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "built without CUDA" "$tmp/out" && grep -q "train on CPU devices with --devices cpu:1" "$tmp/out" &&
        ok "plain build: --gpus 1 says it was built without CUDA (exit 2)" || { bad "plain build --gpus 1: exit $rc"; cat "$tmp/out"; }
    $P/mgc nets/lenet.net --emit ptx > "$tmp/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && grep -q "built without NVRTC" "$tmp/out" && ok "plain build: --emit ptx says it was built without NVRTC" ||
        { bad "plain build --emit ptx: exit $rc"; head -3 "$tmp/out"; }
    if [ -n "${MGC_DATA:-}" ]; then
        A="nets/lenet.net --devices cpu:2 --epochs 1 --limit-train 1024 --limit-test 256 --seed 4"
        if $P/mgc $A --log "$tmp/plain.jsonl" > /dev/null 2>&1 && ./mgc $A --log "$tmp/full.jsonl" > /dev/null 2>&1 &&
           [ "$(cut -d, -f1-4 "$tmp/plain.jsonl")" = "$(cut -d, -f1-4 "$tmp/full.jsonl")" ]; then
            ok "plain build trains on cpu:2 to the full build's loss and accuracies"
        else
            bad "plain and full builds differ: $(cut -c1-90 "$tmp/plain.jsonl" "$tmp/full.jsonl" 2>&1)"
        fi
    fi
else
    bad "CUDA=0 MPI=0 build failed"; tail -5 "$tmp/build"
fi
if [ -f /usr/local/cuda/include/cuda.h ]; then
    ldd ./mgc | grep -q libnvrtc && ! ldd ./mgc | grep -qE "libcuda\.|libcublas|libnccl" &&
        ok "the CUDA build links NVRTC only (driver, cuBLAS, NCCL opened when a GPU is asked for)" ||
        bad "the CUDA build's libraries: $(ldd ./mgc | grep -E 'cuda|nvrtc|cublas|nccl' | tr '\n' ' ')"
    nm ./mgc | grep -q " cuda_launch" && ok "the CUDA device is in the build" || bad "the build has no CUDA device"
    ./mgc nets/lenet.net --gpus 1 > "$tmp/out" 2>&1
    if ldconfig -p | grep -q "libcuda.so.1 "; then
        echo "note: this machine has a GPU driver: the no-driver message is not checked"
    else
        grep -q "no CUDA driver on this machine" "$tmp/out" && ok "CUDA build, no driver: --gpus 1 says so" || { bad "--gpus 1 without a driver"; cat "$tmp/out"; }
    fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
