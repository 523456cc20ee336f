#!/usr/bin/env bash
# The CUDA text of every net's kernels (mgc --emit=cuda) compiles with NVRTC
# to sm_80 and sm_90 cubins, as the CUDA backend will at run time, without a
# warning (nvrtc_check fails on a non-empty log). Needs no GPU.
set -u
cd "$(dirname "$0")/.."
MGC=${MGC:-./mgc}
CUDA=${CUDA_HOME:-/usr/local/cuda}
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${CC:-cc} -DHAVE_NVRTC -Iruntime -I"$CUDA/include" tests/nvrtc_check.c runtime/ptx.c -L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lnvrtc -o build/nvrtc_check || { echo "0 passed, 1 failed"; exit 1; }
# nvrtc FILE LABEL: FILE compiles for sm_80 and sm_90, without a warning (the two side by side)
nvrtc() {
    local arch pid80 pid90 rc
    build/nvrtc_check "$1" sm_80 > "$tmp/out.sm_80" 2>&1 & pid80=$!
    build/nvrtc_check "$1" sm_90 > "$tmp/out.sm_90" 2>&1 & pid90=$!
    for arch in sm_80 sm_90; do
        if [ $arch = sm_80 ]; then wait $pid80; else wait $pid90; fi
        rc=$?
        if [ $rc -eq 0 ]; then
            pass=$((pass + 1)); [ -n "$2" ] && echo "ok   $2 ($arch): $(sed 's/.*NVRTC //' "$tmp/out.$arch")"
        else
            echo "FAIL ${2:-$1} ($arch):"; head -20 "$tmp/out.$arch"; fail=$((fail + 1))
        fi
    done
}
# Every convolution strategy on LeNet and a conv test net; ResNet-18 (300 kernels) as chosen; each for two architectures.
for net in nets/lenet.net tests/nets/op_conv.net tests/nets/op_dropout_half.net nets/resnet18.net; do
    for conv in direct vector gemm dense; do
        [ "$net" = nets/resnet18.net ] && [ $conv != direct ] && continue
        [ -f "$net" ] || continue
        MGC_CONV=$([ "$net" = nets/resnet18.net ] || echo $conv) "$MGC" "$net" --emit cuda > "$tmp/k.cu" 2> "$tmp/err" || { echo "FAIL $net: mgc --emit cuda"; cat "$tmp/err"; fail=$((fail + 1)); continue; }
        [ "$net" = nets/resnet18.net ] && conv=default
        nvrtc "$tmp/k.cu" "$net ($conv convs)"
    done
done
# Every op net (tests/nets/op_*.net: every op of the table, its forward and gradient kernels), for
# sm_90, two at a time; the two architectures are LeNet's and ResNet-18's above
pids=() nets=()
for net in tests/nets/op_*.net; do
    k=${#nets[@]}
    if "$MGC" "$net" --emit cuda > "$tmp/op$k.cu" 2> "$tmp/err"; then
        build/nvrtc_check "$tmp/op$k.cu" sm_90 > "$tmp/op$k.out" 2>&1 & pids+=($!) nets+=("$net")
    else
        echo "FAIL $net: mgc --emit cuda"; head -3 "$tmp/err"; fail=$((fail + 1))
    fi
    if [ ${#pids[@]} -ge 2 ] || [ "$net" = "$(ls tests/nets/op_*.net | tail -1)" ]; then
        for j in "${!pids[@]}"; do
            wait "${pids[$j]}" && ok_op=1 || ok_op=0
            idx=$(( ${#nets[@]} - ${#pids[@]} + j ))
            if [ $ok_op = 1 ]; then pass=$((pass + 1)); else echo "FAIL ${nets[$idx]} (sm_90):"; head -10 "$tmp/op$idx.out"; fail=$((fail + 1)); fi
        done
        pids=()
    fi
done
echo "ok   $(ls tests/nets/op_*.net | wc -l) op nets compiled for sm_90"

# The zoo (nets/*.net): every net's kernels print for the GPU (tests/golden.sh
# keeps the C of most); NVRTC compiles the one whose kernels differ most from
# the op nets' (MobileNetV2's depthwise convolutions at 960 channels)
# every net's GPU program, fp32 and bf16 (cg_verify checks each: bf16 buffers only where a
# kernel stores them and GEMMs read them in pairs)
for net in nets/*.net; do
    for prec in fp32 bf16; do
        if "$MGC" "$net" --precision $prec --emit cuda > "$tmp/z.cu" 2> "$tmp/err" && [ "$(grep -c "^  step .* kernel " "$tmp/z.cu")" -gt 0 ]; then
            pass=$((pass + 1))
        else
            echo "FAIL $net: --precision $prec --emit cuda"; head -3 "$tmp/err"; fail=$((fail + 1))
        fi
    done
done
if "$MGC" nets/mobilenetv2.net --emit cuda > "$tmp/mb.cu" && build/nvrtc_check "$tmp/mb.cu" sm_90 > "$tmp/mb.out" 2>&1; then
    pass=$((pass + 1)); echo "ok   nets/mobilenetv2.net compiled for sm_90: $(tail -1 "$tmp/mb.out")"
else
    echo "FAIL nets/mobilenetv2.net (sm_90):"; head -10 "$tmp/mb.out" 2> /dev/null; fail=$((fail + 1))
fi
# --precision bf16: the GPU programs of LeNet and ResNet-18 (their GEMMs in bf16 through cuBLAS,
# the convolutions' packed operands stored as bf16: mgc_to_bf16's cvt from sm_80 on)
for net in nets/lenet.net nets/resnet18.net; do
    if "$MGC" "$net" --precision bf16 --emit cuda > "$tmp/bf.cu" 2> "$tmp/err" && grep -q "bf16 operands (stored bf16), fp32 sums" "$tmp/bf.cu" &&
            build/nvrtc_check "$tmp/bf.cu" sm_90 > "$tmp/bf.out" 2>&1; then
        pass=$((pass + 1)); echo "ok   $net --precision bf16 compiled for sm_90: $(tail -1 "$tmp/bf.out")"
    else
        echo "FAIL $net --precision bf16 (sm_90):"; head -5 "$tmp/err" "$tmp/bf.out" 2> /dev/null; fail=$((fail + 1))
    fi
done

# --shard-update and --accumulate on GPUs: the sharded SGD and AdamW kernels, the buckets'
# padding and accumulation kernels (fakecuda.sh runs them on the emulated GPUs)
for opt in "--momentum 0.9 --nesterov" "--optimizer adamw"; do
    if "$MGC" nets/lenet.net --gpus 3 --shard-update --accumulate 2 $opt --emit cuda > "$tmp/sh.cu" 2> "$tmp/err" &&
            grep -q "_shard(" "$tmp/sh.cu" && grep -q "zero_padding(" "$tmp/sh.cu" && grep -q "_accumulate(" "$tmp/sh.cu" &&
            build/nvrtc_check "$tmp/sh.cu" sm_90 > "$tmp/sh.out" 2>&1; then
        pass=$((pass + 1)); echo "ok   --shard-update --accumulate 2 $opt compiled for sm_90: $(tail -1 "$tmp/sh.out")"
    else
        echo "FAIL --shard-update --accumulate 2 $opt (sm_90):"; head -5 "$tmp/err" "$tmp/sh.out" 2> /dev/null; fail=$((fail + 1))
    fi
done

# --emit ptx: NVRTC inside mgc, for two architectures: a PTX entry for every kernel step
# (the GPU program's steps, as --emit cuda lists them: CPU-only fusions make fewer on the C target)
steps=$("$MGC" nets/lenet.net --emit cuda | grep -c "^  step .* kernel ")
for arch in sm_80 sm_90; do
    if "$MGC" nets/lenet.net --emit ptx --arch $arch > "$tmp/k.ptx" 2> "$tmp/err" && grep -q "^\.target $arch" "$tmp/k.ptx" &&
       [ "$(grep -c '^\.visible \.entry' "$tmp/k.ptx")" -eq "$steps" ]; then
        pass=$((pass + 1)); echo "ok   mgc --emit ptx --arch $arch: $steps entries"
    else
        echo "FAIL mgc --emit ptx --arch $arch:"; head -5 "$tmp/err"; fail=$((fail + 1))
    fi
done
# --dump-kernels: a kernel's own CUDA file compiles alone (a reduction's too), without a warning
"$MGC" nets/lenet.net --dump-kernels "$tmp/dk" > /dev/null
for f in $(ls "$tmp/dk"/*.cu | head -3) $(ls "$tmp/dk"/*bias_grad*.cu | head -1); do nvrtc "$f" ""; done
# the data-parallel kernels: --sync-bn's statistics, the global batch, the SGD fused per bucket (with momentum)
"$MGC" nets/resnet18.net --emit cuda --devices cpu:2 --sync-bn --momentum 0.9 > "$tmp/k.cu" 2> "$tmp/err" &&
    nvrtc "$tmp/k.cu" "nets/resnet18.net (cpu:2 --sync-bn)"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
