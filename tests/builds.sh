#!/usr/bin/env bash
# mgc builds and runs without the optional parts: CUDA=0 MPI=0 ONNX=0 gives a binary
# that says what it lacks (--gpus, --emit ptx, export --format onnx: a clear message, exit 2 or 1)
# and trains on CPU devices the same as the full build. And the full build
# has the CUDA device and links no CUDA library (NVRTC, the driver, cuBLAS
# and NCCL are opened at run time): without NVRTC it still trains on CPU
# devices and says what --emit ptx lacks. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
SUITE=builds
. tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
P=build/plain
rm -f $P/mgc   # linked again: the build report comes with the link, also when the objects are up to date
if make -s -j2 CUDA=0 MPI=0 ONNX=0 TB=0 IMAGES=0 BUILD=$P BIN=$P/mgc > "$tmp/build" 2>&1; then
    grep -q "without MPI (MPI=0)" "$tmp/build" && grep -q "no CUDA (CUDA=0)" "$tmp/build" && grep -q "no ONNX export (ONNX=0)" "$tmp/build" &&
        grep -q "no TensorBoard event files (TB=0)" "$tmp/build" && grep -q "no image folders (IMAGES=0)" "$tmp/build" &&
        ok "CUDA=0 MPI=0 ONNX=0 builds and says so: $(grep -c . "$tmp/build") lines" || { bad "the plain build's report"; cat "$tmp/build"; }
    ! ldd $P/mgc | grep -qE "nvrtc|libmpi|protobuf-c|libpng|libjpeg" && ok "the plain build links neither NVRTC nor MPI nor protobuf-c nor libpng/libjpeg" ||
        bad "the plain build links NVRTC, MPI, protobuf-c, libpng or libjpeg"
    mkdir -p "$tmp/imgs/train/a" "$tmp/imgs/test/a" && printf x > "$tmp/imgs/train/a/1.png" && printf x > "$tmp/imgs/test/a/1.png"
    $P/mgc nets/lenet.net --epochs 1 --data "$tmp/imgs" > "$tmp/out" 2>&1
    [ $? -eq 1 ] && grep -q "built without libpng and libjpeg, which decode image folders" "$tmp/out" &&
        ok "plain build: an image folder says what to install (exit 1)" || { bad "plain build image folder"; cat "$tmp/out"; }
    $P/mgc nets/lenet.net --epochs 0 --save "$tmp/ck.safetensors" > /dev/null 2>&1
    $P/mgc export "$tmp/ck.safetensors" --out "$tmp/m.onnx" > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "built without ONNX export; install protoc-c, protobuf-c and ONNX's onnx.proto (Debian: apt-get install protobuf-c-compiler libprotobuf-c-dev libonnx-dev)" "$tmp/out" &&
        [ ! -e "$tmp/m.onnx" ] && ok "plain build: export --format onnx says what to install (exit 1)" || { bad "plain build export --format onnx: exit $rc"; cat "$tmp/out"; }
    make -s CUDA=0 MPI=0 ONNX=0 TB=0 IMAGES=0 BUILD=$P BIN=$P/mgc $P/unit_export > "$tmp/out" 2>&1 && $P/unit_export >> "$tmp/out" 2>&1 &&
        ok "plain build: unit_export ($(tail -1 "$tmp/out"))" || { bad "plain build: unit_export"; tail -5 "$tmp/out"; }
    $P/mgc nets/lenet.net --epochs 1 --limit-train 256 --tensorboard "$tmp/tb" > "$tmp/out" 2>&1
    [ $? -eq 1 ] && grep -q "built without protobuf-c, which writes TensorBoard's events" "$tmp/out" &&
        ok "plain build: --tensorboard says what it lacks (exit 1)" || { bad "plain build --tensorboard"; cat "$tmp/out"; }
    $P/mgc nets/lenet.net --gpus 1 > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "built without CUDA" "$tmp/out" && grep -q "train on CPU devices with --devices cpu:1" "$tmp/out" &&
        ok "plain build: --gpus 1 says it was built without CUDA (exit 2)" || { bad "plain build --gpus 1: exit $rc"; cat "$tmp/out"; }
    $P/mgc --version > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q "^  MPI       not built in" "$tmp/out" && grep -q "^  CUDA      not built in" "$tmp/out" &&
        grep -q "^  NVRTC     this mgc was built without NVRTC" "$tmp/out" && grep -q "^  OpenBLAS  0\.[0-9]" "$tmp/out" &&
        grep -q "^  ONNX      not built in" "$tmp/out" &&
        ! grep -q "^  GPUs" "$tmp/out" && ok "plain build: --version says MPI, CUDA and ONNX export are not built in" || { bad "plain --version: exit $rc"; cat "$tmp/out"; }
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
    ! ldd ./mgc | grep -qE "nvrtc|libcuda\.|libcublas|libnccl" &&
        ok "the CUDA build links no CUDA library (NVRTC, driver, cuBLAS, NCCL opened when asked for)" ||
        bad "the CUDA build's libraries: $(ldd ./mgc | grep -E 'cuda|nvrtc|cublas|nccl' | tr '\n' ' ')"
    MGC_NVRTC=$tmp/none/libnvrtc.so ./mgc nets/lenet.net --emit ptx > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "cannot open NVRTC ($tmp/none/libnvrtc.so: .*set MGC_NVRTC to its path" "$tmp/out" &&
        ok "CUDA build, no NVRTC: --emit ptx says what is missing and what to do (exit 1)" || { bad "--emit ptx without NVRTC: exit $rc"; cat "$tmp/out"; }
    if [ -n "${MGC_DATA:-}" ]; then
        MGC_NVRTC=$tmp/none/libnvrtc.so ./mgc nets/lenet.net --devices cpu:2 --epochs 1 --limit-train 512 --limit-test 128 > "$tmp/out" 2>&1 &&
            grep -q "^epoch 1/1 .* test acc " "$tmp/out" && ok "CUDA build, no NVRTC: trains on cpu:2" || { bad "CUDA build without NVRTC does not train on CPU"; tail -3 "$tmp/out"; }
    fi
    ./mgc nets/lenet.net --emit ptx --arch sm_60 > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "compiles for sm_75, .*nothing as old as sm_60: use a CUDA toolkit" "$tmp/out" &&
        ok "--emit ptx --arch sm_60: NVRTC's architectures listed, what to do said" || { bad "--arch sm_60: exit $rc"; cat "$tmp/out"; }
    ./mgc nets/lenet.net --emit ptx --arch sm_95 > "$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] && grep -q "does not compile for sm_95; it compiles for sm_75, .*sm_90" "$tmp/out" &&
        ok "--emit ptx --arch sm_95: not an architecture NVRTC knows, its list given" || { bad "--arch sm_95: exit $rc"; cat "$tmp/out"; }
    nm ./mgc | grep -q " cuda_launch" && ok "the CUDA device is in the build" || bad "the build has no CUDA device"
    ./mgc --version > "$tmp/out" 2>&1
    cuda_v=$(awk '/define CUDA_VERSION/ { printf "%d.%d", $3 / 1000, $3 % 1000 / 10 }' /usr/local/cuda/include/cuda.h)
    grep -q "^  CUDA      built with CUDA $cuda_v, cuBLAS [0-9]*\.[0-9]*, " "$tmp/out" && grep -q "^  NVRTC     NVRTC [0-9]" "$tmp/out" &&
        grep -q "^  GPUs      " "$tmp/out" && ok "--version: CUDA $cuda_v, NVRTC, and the GPUs or why there are none" || { bad "--version of the CUDA build"; cat "$tmp/out"; }
    MGC_NVRTC=$tmp/none/libnvrtc.so ./mgc --version 2>&1 | grep -q "^  NVRTC     cannot open NVRTC" &&
        ok "--version without NVRTC says it cannot open it" || bad "--version without NVRTC"
    ./mgc nets/lenet.net --gpus 1 > "$tmp/out" 2>&1
    if ldconfig -p | grep -q "libcuda.so.1 "; then
        echo "note: this machine has a GPU driver: the no-driver message is not checked"
    else
        grep -q "no CUDA driver on this machine" "$tmp/out" && ok "CUDA build, no driver: --gpus 1 says so" || { bad "--gpus 1 without a driver"; cat "$tmp/out"; }
    fi
fi
# make install: the binary, the nets and the docs under DESTDIR/PREFIX; the installed mgc trains an
# installed net from another directory; make uninstall takes them away again
I=$tmp/root
if make -s install DESTDIR="$I" PREFIX=/opt/mgc > "$tmp/out" 2>&1 && [ -x "$I/opt/mgc/bin/mgc" ] &&
   [ -f "$I/opt/mgc/share/mgc/nets/lenet.net" ] && [ -f "$I/opt/mgc/share/doc/mgc/README.md" ]; then
    (cd "$tmp" && "$I/opt/mgc/bin/mgc" "$I/opt/mgc/share/mgc/nets/lenet.net" --epochs 1 --limit-train 256 --limit-test 64 \
        --batch-size 64 ${MGC_DATA:+--data "$MGC_DATA"} > "$tmp/inst.out" 2>&1) &&
        grep -q "test acc" "$tmp/inst.out" && ok "make install: the installed mgc trains the installed lenet.net elsewhere" ||
        { bad "the installed mgc"; tail -3 "$tmp/inst.out"; }
    make -s uninstall DESTDIR="$I" PREFIX=/opt/mgc > /dev/null 2>&1 && [ ! -e "$I/opt/mgc/bin/mgc" ] && [ ! -e "$I/opt/mgc/share/mgc" ] &&
        ok "make uninstall removes what install put there" || bad "make uninstall left files"
else
    bad "make install DESTDIR=$I PREFIX=/opt/mgc"; tail -3 "$tmp/out"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
