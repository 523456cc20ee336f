#!/usr/bin/env bash
# The command line, the data loader's and checkpoints' error paths, the kernel
# cache, and a short end-to-end run that must learn. Needs $MGC_DATA for the
# data cases (skipped without it). Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
MGC=${MGC:-./mgc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
SUITE=cli
. tests/lib.sh
export XDG_CACHE_HOME="$tmp/cache"

L=nets/lenet.net
# The kernel cache (empty at first): the second run compiles nothing.
expect cache-first 0 "compiled kernels" -- $L --epochs 0 -v
expect cache-second 0 "kernels found in cache" -- $L --epochs 0 -v
if "$MGC" $L --epochs 0 -v 2>&1 | grep -q "compiled kernels"; then
    echo "FAIL cli cache-nothing-compiled: a third run compiled again"; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
# OpenBLAS's kernels: where it takes this CPU for an older one (0.3.21 calls
# some AVX-512 CPUs a Prescott) and nobody chose, mgc starts again with the
# kernels the CPU runs; a choice in OPENBLAS_CORETYPE is kept.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
want=""
if [[ $flags == *" avx512f"* && $flags == *" avx512bw"* && $flags == *" avx512dq"* && $flags == *" avx512vl"* ]]; then
    want="SkylakeX|Cooperlake|SapphireRapids"
elif [[ $flags == *" avx2"* && $flags == *" fma"* ]]; then
    want="Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids"
fi
core=$(env -u OPENBLAS_CORETYPE "$MGC" $L --epochs 0 -v 2>&1 | sed -n 's/^mgc: OpenBLAS kernels for \([A-Za-z0-9]*\).*/\1/p')
if [ -z "$core" ] || { [ -n "$want" ] && ! [[ $core =~ ^($want)$ ]]; }; then
    echo "FAIL cli blas-core: OpenBLAS runs '$core' kernels on a CPU for ${want:-any}"; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
OPENBLAS_CORETYPE=Prescott expect blas-core-chosen 0 "OpenBLAS kernels for Prescott (OPENBLAS_CORETYPE)" -- $L --epochs 0 -v
# a choice of kernels for instructions the CPU lacks is refused, not run into an illegal instruction
if [[ $want == SkylakeX* ]]; then
    OPENBLAS_CORETYPE=SkylakeX expect blas-core-avx512 0 "OpenBLAS kernels for SkylakeX (OPENBLAS_CORETYPE)" -- $L --epochs 1 --limit-train 256 --limit-test 256 -v
else
    OPENBLAS_CORETYPE=SkylakeX expect blas-core-avx512 2 "names OpenBLAS kernels for instructions this CPU lacks (AVX-512): unset it" -- $L --epochs 1 --limit-train 256 --limit-test 256
fi
# A damaged cache entry (truncated, then garbage) is found out by its seal and
# compiled again: no crash in dlopen, the run succeeds, and says so.
for damage in "truncate -s 1000" "dd if=/dev/urandom bs=4096 count=1 status=none of="; do
    so=$(ls "$XDG_CACHE_HOME/mgc/kernels/"*.so | head -1)
    if [ "${damage%=}" != "$damage" ]; then $damage"$so"; else $damage "$so"; fi
    if "$MGC" $L --epochs 0 > "$tmp/out" 2>&1 && grep -q "are damaged" "$tmp/out" && "$MGC" $L --epochs 0 -v 2>&1 | grep -q "found in cache $so"; then
        pass=$((pass + 1))
    else
        echo "FAIL cli cache-damaged ($damage): $(head -3 "$tmp/out")"; fail=$((fail + 1))
    fi
done
# A cache directory whose name holds quotes and $(...) is only a name: the
# compiler runs without a shell, so nothing in the path is executed.
odd="$tmp/c'x \$(touch $tmp/pwned) \"y \`touch $tmp/pwned2\`"
if XDG_CACHE_HOME="$odd" "$MGC" $L --epochs 0 -v > "$tmp/out" 2>&1 && grep -q "compiled kernels" "$tmp/out" &&
   [ ! -e "$tmp/pwned" ] && [ ! -e "$tmp/pwned2" ] && ls "$odd/mgc/kernels/"*.so > /dev/null 2>&1; then
    pass=$((pass + 1))
else
    echo "FAIL cli cache-dir-quotes: a cache path with quotes and \$(...) ran something or failed"; head -3 "$tmp/out"; fail=$((fail + 1))
fi
# A compiler that fails on the kernels (not on --version): the piece's source and
# messages are named, and nothing broken enters the cache
printf '#!/bin/sh\ncase "$*" in *--version*) exec cc --version;; esac\necho "mgc-test: refused" >&2\nexit 1\n' > "$tmp/badcc"
chmod +x "$tmp/badcc"
# (in the compile's private work directory, which stays to be read)
MGC_CC="$tmp/badcc" XDG_CACHE_HOME="$tmp/cache-bad" expect cc-fails 1 "the C compiler failed on the generated kernels; source $tmp/cache-bad/mgc/kernels/" -- $L --epochs 0
src=$(sed -n 's/.*; source \([^,]*\), messages \(.*\)$/\1/p' "$tmp/out") msgs=$(sed -n 's/.*; source \([^,]*\), messages \(.*\)$/\2/p' "$tmp/out")
if ls "$tmp/cache-bad/mgc/kernels/"*.so > /dev/null 2>&1 || ! grep -q "mgc-test: refused" "$msgs" || ! grep -q "mgc_kernel\|void" "$src" ||
   [[ $src != "$tmp/cache-bad/mgc/kernels/"*.build.*/*.c ]] || [ "$(stat -c %a "$(dirname "$src")")" != 700 ]; then
    echo "FAIL cli cc-fails-cache: a failed compile left an entry, or its source and messages are not where it says ($src, $msgs)"; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
# The cache is kept to MGC_CACHE_MB: past it, the entries used least recently
# go first. Two nets' kernels (A, B), then A used again, then a third (C)
# with a limit of 1.4 times what two take: B goes, A and C stay.
lru="$tmp/cache-lru"
size_of() { find "$lru/mgc/kernels" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }
XDG_CACHE_HOME="$lru" "$MGC" $L --epochs 0 --set classes=10 > /dev/null 2>&1
XDG_CACHE_HOME="$lru" "$MGC" $L --epochs 0 --set classes=11 > /dev/null 2>&1
two=$(size_of)
limit=$(awk -v b="$two" 'BEGIN { printf "%.6f", b * 1.4 / 1e6 }')
XDG_CACHE_HOME="$lru" MGC_CACHE_MB=$limit "$MGC" $L --epochs 0 --set classes=10 -v 2>&1 | grep -q "kernels found in cache" &&
XDG_CACHE_HOME="$lru" MGC_CACHE_MB=$limit "$MGC" $L --epochs 0 --set classes=12 -v > "$tmp/out" 2>&1
after=$(size_of)
hit() { XDG_CACHE_HOME="$lru" MGC_CACHE_MB=$limit "$MGC" $L --epochs 0 --set classes=$1 -v 2>&1 | grep -q "kernels found in cache"; }
if grep -q "over its limit of .* removed 1 entry used least recently" "$tmp/out" && [ "$after" -le $((two * 112 / 100)) ] && hit 12 && hit 10 && ! hit 11; then
    pass=$((pass + 1))
else
    echo "FAIL cli cache-limit: cache of $two bytes for two nets, $after after a third at $limit MB; $(grep -m1 "limit" "$tmp/out")"
    fail=$((fail + 1))
fi
# (the last check compiled B again, and that pushed out the one used least recently)
if XDG_CACHE_HOME="$lru" "$MGC" --cache-info | grep -q "kernel cache $lru/mgc/kernels: 2 entries (2 complete), 0.[0-9] MB of at most 1000 MB" &&
   XDG_CACHE_HOME="$lru" "$MGC" --cache-clear | grep -q "removed 2 entries" && [ "$(size_of)" = 0 ]; then
    pass=$((pass + 1))
else
    echo "FAIL cli cache-info-clear: $(XDG_CACHE_HOME="$lru" "$MGC" --cache-info 2>&1)"; fail=$((fail + 1))
fi
# What a compile left and never finished (a killed run) goes after a day, when
# the next entry is added; a failed compile's log of today stays to be read
# (its work directory, or the loose files an older mgc left)
kd="$lru/mgc/kernels"
old_w="$kd/0123456789abcdef.build.0123456789ab" new_w="$kd/fedcba9876543210.build.0123456789ab"
mkdir -m 700 "$old_w" "$new_w"
touch "$kd/0123456789abcdef.0.c" "$kd/0123456789abcdef.0.77.log" "$old_w/0.c" "$old_w/0.log" "$new_w/0.log"
touch -d '2 days ago' "$kd/0123456789abcdef.0.c" "$kd/0123456789abcdef.0.77.log" "$old_w/0.c" "$old_w/0.log" "$old_w"
XDG_CACHE_HOME="$lru" "$MGC" $L --epochs 0 --set classes=13 > /dev/null 2>&1
if [ ! -e "$kd/0123456789abcdef.0.c" ] && [ ! -e "$kd/0123456789abcdef.0.77.log" ] && [ ! -e "$old_w" ] && [ -e "$new_w/0.log" ]; then
    pass=$((pass + 1))
else
    echo "FAIL cli cache-stale: $(ls "$kd" | grep -c 0123456789abcdef) files of a day-old unfinished compile left, $(ls "$kd" | grep -c fedcba9876543210) of today's"
    fail=$((fail + 1))
fi
# The environment's switches: a value mgc does not know stops it, naming the values it does
MGC_CONV=fast expect env-conv-bad 2 "MGC_CONV='fast' is not one of direct|vector|gemm|dense|chunked|winograd" -- $L --emit ir
MGC_FUSE=no expect env-fuse-bad 2 "MGC_FUSE='no' is not one of 0|1" -- $L --emit ir
MGC_PROFILE=yes expect env-profile-bad 2 "MGC_PROFILE='yes' is not one of 0|1" -- $L --emit ir
MGC_SHARED_PARAMS=no expect env-shared-bad 2 "MGC_SHARED_PARAMS='no' is not one of 0|1" -- $L --emit ir
MGC_PROFILE=0 MGC_CONV= expect env-defaults 0 "kernel k0_" -- $L --emit kernels
# --emit kernels on GPUs: the cost model (no GPU needed). LeNet's fc1 at batch 1000 is a GEMM
# [1000 x 256] . [256 x 120]: it reads 4 (1000*256 + 256*120) bytes, writes 4*1000*120, does
# 2*1000*120*256 FLOPs; the predicted step (in a CUDA graph) is the sum of the steps' times and
# a graph launch (1 us) each. The model named must be one mgc knows.
expect gpu-model-bad 2 "--gpu-model expects one of h200, h100, got 'a100'" -- $L --emit kernels --gpus 1 --gpu-model a100
# an option of one printout, given without it, is refused with the fix (it was ignored)
# an unknown layer far from every name: the message lists every built-in layer (--list-layers' table)
"$MGC" tests/bad/unknown_layer_far.net > "$tmp/out" 2>&1
missing=$("$MGC" --list-layers | sed -n 's/^| `\([a-z0-9_]*\)`.*/\1/p' | while read -r l; do grep -q "[(, ]$l[,;]" "$tmp/out" || echo "$l"; done)
[ -z "$missing" ] && [ "$("$MGC" --list-layers | grep -c '^| `')" -gt 25 ] && { ok "unknown layer: the message names all $("$MGC" --list-layers | grep -c '^| `') layers"; } ||
    bad "unknown layer: the message lacks: $missing"
expect gpu-model-alone 2 "--gpu-model applies to --emit kernels on GPUs (--gpus N) and --emit cuda" -- $L --epochs 0 --gpu-model h100
expect gpu-model-cpu 2 "add --emit kernels --gpus N" -- $L --emit kernels --gpu-model h100
expect gpu-model-cuda 0 "steps of the training program of lenet" -- $L --emit cuda --gpu-model h100
expect arch-alone 2 "--arch applies to --emit ptx" -- $L --emit kernels --gpus 1 --arch sm_80
if "$MGC" $L --emit kernels --gpus 1 --batch-size 1000 --gpu-model h100 > "$tmp/cost" 2>&1 &&
   grep -q "cost model: NVIDIA H100 SXM" "$tmp/cost" && grep -q "predicted epoch of 60000 examples (60 steps of 1000)" "$tmp/cost" &&
   awk -v r="$(awk 'BEGIN { printf "%.2f %.2f %.1f", 4 * (1000 * 256 + 256 * 120) / 1e6, 4 * 1000 * 120 / 1e6, 2 * 1000 * 120 * 256 / 1e6 }')" '
       $1 == "step" && $3 == "gemm" && $4 == "1000x120x256" { g = ($8 " " $9 " " $10 == r) }
       $1 == "step" && $2 ~ /^[0-9]+$/ && $NF ~ /^(memory|compute|launch)$/ { sum += $(NF - 3) + 1.0; n++ }   # fp32 us
       /predicted step/ { for (i = 1; i <= NF; i++) if ($i == "fp32") ms = $(i + 1) }
       END { d = sum / 1000 - ms; exit !(g && n > 40 && d < 0.02 && d > -0.02) }' "$tmp/cost"; then
    pass=$((pass + 1))
else
    echo "FAIL cli gpu-cost: the cost model's GEMM line or its step sum is off:"; grep -E "gemm 1000x120x256|predicted step" "$tmp/cost" | sed 's/^/    /'
    fail=$((fail + 1))
fi
# the token nets on GPUs, by the same model: their reductions over tokens (LayerNorm's, the bias
# gradients', over N * T rows) in slices of the batch or a block a row, no kernel a few threads
# summing every row alone (the ViT's step was predicted at 282 ms on an H200, the mixer's 1,010;
# now about 1.3 each): the step under 5 ms, no kernel but a GEMM over 100 us
for tn in vit mixer; do
    if "$MGC" nets/$tn.net --emit kernels --gpus 1 --batch-size 256 > "$tmp/cost_$tn" 2>&1 &&
       awk '$1 == "step" && $2 ~ /^[0-9]+$/ && $3 != "gemm" && $NF ~ /^(memory|compute|launch)$/ && $(NF - 3) > 100 { slow = slow " " $3 }
            /predicted step/ { for (i = 1; i <= NF; i++) if ($i == "fp32") ms = $(i + 1) }
            END { if (slow != "") print "slow kernels:" slow; exit !(ms > 0 && ms < 5 && slow == "") }' "$tmp/cost_$tn" > "$tmp/cost_${tn}_why"; then
        pass=$((pass + 1))
    else
        echo "FAIL cli gpu-cost-$tn: the predicted step or a kernel of it is slow:"; cat "$tmp/cost_${tn}_why" | sed 's/^/    /'
        grep "predicted step" "$tmp/cost_$tn" | sed 's/^/    /'
        fail=$((fail + 1))
    fi
done
# --precision: what it takes; what --emit ir shows of it (the GEMM-class nodes in bf16, forward
# and backward; MobileNetV2's depthwise layers and every other node f32); --emit kernels
# (the GEMMs, and the chunked kernels calling the bf16 GEMM)
expect precision-bad 2 "--precision expects fp32 or bf16, got 'fp16'" -- $L --precision fp16
expect precision-ir 0 "precision bf16: GEMMs multiply bf16 operands, sum and store f32" -- $L --precision bf16 --emit ir
"$MGC" $L --precision bf16 --emit grad > "$tmp/bf.ir" 2>&1
"$MGC" nets/mobilenetv2.net --precision bf16 --emit grad > "$tmp/bfm.ir" 2>&1
"$MGC" $L --precision bf16 --emit kernels > "$tmp/bf.k" 2>&1
if [ "$(grep -c 'bf16\*bf16->f32' "$tmp/bf.ir")" = 14 ] &&   # 2 conv + 3 linear forward; 9 gradients (conv1 has no input gradient)
   ! grep -E '^%[0-9]+ += (conv2d|linear)' "$tmp/bf.ir" | grep -qv 'bf16\*bf16' &&
   ! grep -v '^#' "$tmp/bf.ir" | grep -E -v '= (conv2d|linear)' | grep -q 'bf16' &&
   grep -E 'conv2d(_grad_[xw])? %[0-9]+ %[0-9]+ .*groups=' "$tmp/bfm.ir" | grep -q ' f32 ' &&   # depthwise, all of them
   ! grep -E 'conv2d(_grad_[xw])? %[0-9]+ %[0-9]+ .*groups=' "$tmp/bfm.ir" | grep -q bf16 &&
   grep -E '= conv2d %[0-9]+ %[0-9]+ stride=1 pad=0 ' "$tmp/bfm.ir" | grep -q 'bf16\*bf16' &&   # its 1x1 layers
   [ "$(grep -c 'gemm .*bf16 operands, fp32 sums' "$tmp/bf.k")" = 9 ] && grep -q 'mgc_sbgemm(MGC_ROW_MAJOR' "$tmp/bf.k" &&
   ! "$MGC" $L --emit kernels | grep -q 'bf16 operands'; then
    pass=$((pass + 1))
else
    echo "FAIL cli precision-nodes: --precision bf16 marks other nodes than the GEMM-class ones (or fp32 shows bf16)"
    grep -E 'conv2d|linear' "$tmp/bf.ir" | head -12 | sed 's/^/    /'
    fail=$((fail + 1))
fi
# --precision bf16 on GPUs (--emit kernels --gpus 1, no GPU needed): the convolutions' GEMMs
# read bf16 matrices that im2col, the gradient's transposition and a copy of each weight store
# rounded (conv1: forward and weight gradient, its columns kept; conv2: all three; the two
# weights' copies in one kernel), the linear
# layers' fp32 matrices rounded by cuBLAS; only GEMMs read LeNet's bf16 buffers (it has no
# BatchNorm, below); an fp32 GPU program has none
"$MGC" $L --gpus 1 --precision bf16 --emit kernels > "$tmp/bfg.k" 2>&1
if [ "$(grep -c 'gemm .*bf16 operands (stored bf16), fp32 sums' "$tmp/bfg.k")" = 5 ] &&
   [ "$(grep -c 'gemm .*bf16 operands, fp32 sums' "$tmp/bfg.k")" = 9 ] &&
   [ "$(grep -c 'kernel k[0-9]*_weights_bf16(' "$tmp/bfg.k")" = 1 ] &&   # both weights' copies, one launch
   [ "$(grep -c '^    mgc_bf16 \*RESTRICT [a-z0-9]* = (mgc_bf16 \*)a.t\[[0-9]*\];' "$tmp/bfg.k")" = 6 ] &&
   [ "$(grep -c '= mgc_to_bf16(' "$tmp/bfg.k")" = 6 ] && ! grep -q 'const mgc_bf16' "$tmp/bfg.k" &&
   grep -q 'this program, mgc.s --precision bf16' "$tmp/bfg.k" &&
   ! "$MGC" $L --gpus 1 --emit kernels | grep -q 'mgc_bf16 \*RESTRICT'; then
    pass=$((pass + 1))
else
    echo "FAIL cli precision-gpu-storage: the GPU program's bf16 GEMM operands are not as expected"
    grep -E 'gemm|weights_bf16' "$tmp/bfg.k" | head -20 | sed 's/^/    /'
    fail=$((fail + 1))
fi
# and a tensor every reader of which rounds it to bf16 anyway (or reads its sign) is stored bf16
# by the kernel that makes it (mgc_bf16: a float read or stored, rounded); none in fp32.
# small_resnet: its 6 BatchNorm input gradients, each read only by its convolution's
# gradients, which pack it (6 bn_grad_x store bf16, 6 packing kernels read it); the ReLU
# outputs that only convolutions' im2col and the ReLU's gradient read (3 of its 5: the stem's
# and the last feed an add or the pool): 2 bn_apply and 1 bn_apply_add (the ReLU fused in
# place) store them, 4 of the 6 im2col read them, and 1 of the 2 relu_grad left (the 3 after a
# BatchNorm alone are folded into its gradient, which recomputes the ReLU from the BatchNorm's
# input: codegen/fuse.c, fuse_bn_grad_acts)
kinds_with() {   # FILE KIND TEXT: the steps of kernel KIND whose code (own or shared) has TEXT
    awk -v K="$2" -v P="$3" '
        $0 ~ "^KERNEL\\(k[0-9]+_" K "\\)" { cur = $0; sub(/^KERNEL\(/, "", cur); sub(/\).*/, "", cur); next }
        cur && index($0, P) { has[cur] = 1 }
        /^}/ { cur = "" }
        $0 ~ "^  step [0-9]+ +%[0-9]+ +kernel k[0-9]+_" K "\\(" {
            k = $0; sub(/.* kernel /, "", k); sub(/\(.*/, "", k)
            if (match($0, "= k[0-9]+_" K "'"'"'s code")) k = substr($0, RSTART + 2, RLENGTH - 9)
            steps[++n] = k
        }
        END { c = 0; for (i = 1; i <= n; i++) c += (steps[i] in has); print c }' "$1"
}
R=tests/nets/small_resnet.net
"$MGC" $R --gpus 1 --precision bf16 --emit kernels > "$tmp/bfr.k" 2>&1
"$MGC" $R --gpus 1 --emit kernels > "$tmp/bfr32.k" 2>&1
got="$(kinds_with "$tmp/bfr.k" bn_grad_x 'mgc_bf16 *RESTRICT dx = ') $(kinds_with "$tmp/bfr.k" pack_grad 'const mgc_bf16 *RESTRICT dy = ')"
got="$got $(kinds_with "$tmp/bfr.k" bn_apply 'mgc_bf16 *RESTRICT y = ') $(kinds_with "$tmp/bfr.k" bn_apply_add 'mgc_bf16 *RESTRICT y = ')"
got="$got $(kinds_with "$tmp/bfr.k" im2col 'const mgc_bf16 *RESTRICT x = ') $(kinds_with "$tmp/bfr.k" relu_grad 'const mgc_bf16 *RESTRICT y = ')"
got="$got $(grep -c 'mgc_bf16 \*RESTRICT' "$tmp/bfr32.k")"
if [ "$got" = "6 6 2 1 4 1 0" ]; then
    pass=$((pass + 1))
else
    echo "FAIL cli precision-gpu-act-storage: bf16 stores and reads (bn_grad_x, pack_grad, bn_apply, bn_apply_add, im2col," \
         "relu_grad; mgc_bf16 in fp32) '$got', wanted '6 6 2 1 4 1 0'"
    fail=$((fail + 1))
fi
expect typo-cache 2 "unknown option '--cache-inf'; did you mean '--cache-info'?" -- --cache-inf
MGC_CACHE_MB=lots expect cache-limit-bad 2 "MGC_CACHE_MB='lots' is not a size in MB" -- --cache-info
# MGC_CC that is not a compiler: a clear message, no crash
MGC_CC=no-such-cc expect cc-missing 1 "cannot run the C compiler 'no-such-cc'" -- $L --epochs 0
expect help 0 "usage: mgc NET.net" -- --help
# the usage text: every line within 110 columns, every option at the start of its own line (a missing
# \n between two of the C strings glues one option's text to the next option)
bad=$("$MGC" --help 2>&1 | awk 'length > 110 || /[^ ]  --[a-z]/' | head -1)
if [ -z "$bad" ]; then
    pass=$((pass + 1))
else
    echo "FAIL cli help-lines: a line of --help too long or with two options: '$bad'"
    fail=$((fail + 1))
fi
expect version 0 "mgc " -- --version
expect no-net 2 "no net given" -- --epochs 1
expect unknown-option 2 "unknown option '--epoch'; did you mean '--epochs'?" -- $L --epoch 3
expect batch-zero 2 "--batch-size must be in 1.." -- $L --batch-size 0
expect lr-word 2 "--lr expects a number, got 'fast'" -- $L --lr fast
expect lr-negative 2 "--lr must be >= 0" -- $L --lr -1
expect momentum-range 2 "--momentum must be in [0, 1], got 1.5" -- $L --momentum 1.5
expect optimizer-name 2 "--optimizer expects sgd or adamw, got 'adam'" -- $L --optimizer adam
expect adamw-momentum 2 "--momentum is SGD's; AdamW has --betas B1,B2" -- $L --optimizer adamw --momentum 0.9
expect adamw-nesterov 2 "--nesterov is SGD's" -- $L --optimizer adamw --nesterov
expect sgd-betas 2 "--betas is AdamW's: give --optimizer adamw too" -- $L --betas 0.9,0.99
expect sgd-eps 2 "--eps is AdamW's: give --optimizer adamw too" -- $L --eps 1e-6
expect nesterov-alone 2 "--nesterov needs a momentum (--momentum M above 0)" -- $L --nesterov
expect betas-one 2 "--betas expects B1,B2 (e.g. 0.9,0.999), got '0.9'" -- $L --optimizer adamw --betas 0.9
expect betas-three 2 "--betas expects B1,B2 (e.g. 0.9,0.999), got '0.9,0.99,0.3'" -- $L --optimizer adamw --betas 0.9,0.99,0.3
expect betas-range 2 "--betas' first must be in [0, 1), got 1" -- $L --optimizer adamw --betas 1,0.9
expect betas-word 2 "--betas' first expects a number, got 'x'" -- $L --optimizer adamw --betas x,y
expect eps-range 2 "--eps must be in (0, 1], got 0" -- $L --optimizer adamw --eps 0
# A range holds for the number as it is kept, rounded to float32 (issue 35): --eps 1e-50
# would be 0 (AdamW's step 0/0 for an unused weight), --betas 0.99999999 would be 1
expect eps-rounds-to-zero 2 "--eps 1e-50 rounds to 0 in float32, outside (0, 1]: the nearest float32 in it is 1.40129846e-45" -- $L --optimizer adamw --eps 1e-50
expect betas-round-to-one 2 "--betas' first 0.99999999 rounds to 1 in float32, outside [0, 1): the nearest float32 in it is 0.99999994" -- $L --optimizer adamw --betas 0.99999999,0.999
expect lr-rounds-to-zero 2 "--lr 1e-50 rounds to 0 in float32: write 0, or at least 1.40129846e-45" -- $L --lr 1e-50
expect lr-subnormal 0 "initialised" -- $L --lr 1e-40 --epochs 0
expect augment-zero 2 "--augment crop:P expects P from 1 to 64 (zeros around the image), got 'crop:0'" -- $L --augment crop:0
expect augment-word 2 "--augment expects a list of crop[:P] (a random crop after P zeros around, default 4), flip, crop-resize:S, rotate:D, translate:F, erase:P, e.g. crop:4,flip; got 'crop:4,flop'" -- $L --augment crop:4,flop
expect resize-bad 2 "--resize expects H or HxW (each 1 to 4096), e.g. 32 or 64x48, got '32x'" -- $L --resize 32x
expect resize-three 2 "got '32x40x3'" -- $L --resize 32x40x3
expect dump-batch-evaluate 2 "--dump-batch writes a training batch and exits; it does not go with --evaluate" -- $L --dump-batch x.st --evaluate
expect resize-input 1 "does not match Fashion-MNIST images after --resize [N,1,32,32]; declare 'input x[N, 1, 32, 32]', or bring the images to the net's size with --resize 28x28" -- $L --resize 32 --epochs 1 --data "$tmp/none"
expect input-resize-hint 1 "or bring the images to the net's size with --resize 32x40" -- tests/nets/resize_input.net --epochs 1 --data "$tmp/none"
expect adamw-grad 0 "AdamW: lr 0.003, betas 0.8,0.99, eps 1e-06, weight decay 0.01" -- $L --optimizer adamw --lr 0.003 --betas 0.8,0.99 --eps 1e-6 --emit grad
expect epochs-word 2 "--epochs expects a whole number" -- $L --epochs ten
expect missing-value 2 "--seed needs a value" -- $L --seed
expect bad-emit 2 "--emit expects ir, eval-ir, grad, kernels, cuda, ptx, dp or infer-ir" -- $L --emit asm
expect bad-arch 2 "--arch expects a GPU architecture such as sm_80" -- $L --emit ptx --arch 90
expect dump-kernels-dir 1 "--dump-kernels /nonexistent/x: cannot create the directory" -- $L --dump-kernels /nonexistent/x
# --dump-kernels: one .c and one .cu a kernel step (no .cu for the C-only ones: their bodies call CBLAS or the
# C prelude's GEMM, or use its vectors), each headed by its IR nodes, each C file compiles alone
if "$MGC" $L --dump-kernels "$tmp/dk" > "$tmp/out" 2>&1; then
    steps=$("$MGC" $L --emit kernels | grep -c "^  step .* kernel ")
    nc=$(ls "$tmp/dk"/*.c | wc -l); ncu=$(ls "$tmp/dk"/*.cu | wc -l)
    conly=$(grep -o "[0-9]* C only" "$tmp/out" | grep -o "^[0-9]*"); conly=${conly:-0}   # CPU-only kernels have no .cu
    bad=0
    for f in "$tmp/dk"/*.c; do
        head -2 "$f" | grep -q "^%[0-9]* *= " || bad=$((bad + 1))
        ${CC:-cc} -std=gnu11 -fsyntax-only "$f" 2> /dev/null || bad=$((bad + 1))
    done
    if [ "$nc" -eq "$steps" ] && [ "$ncu" -eq $((steps - conly)) ] && [ "$conly" -eq $(for f in "$tmp/dk"/*.c; do awk '/^KERNEL\(/ { k = 1 } k' "$f" | grep -qE "cblas_sgemm\(|mgc_gemm_tn\(|mgc_f(8|16) " && echo "$f"; done | wc -l) ] && [ $bad -eq 0 ] && grep -q "fused into it" "$tmp/dk"/k0_*.c; then
        pass=$((pass + 1))
    else
        echo "FAIL cli dump-kernels: $nc .c and $ncu .cu files for $steps kernel steps, $bad without a header or not compiling"
        fail=$((fail + 1))
    fi
else
    echo "FAIL cli dump-kernels: mgc failed"; head -3 "$tmp/out"; fail=$((fail + 1))
fi
expect bad-set 2 "--set expects NAME=VALUE" -- $L --set classes
expect two-nets 2 "more than one net" -- $L nets/resnet18.net
expect devices 2 "unknown device list" -- $L --devices tpu
ldconfig -p 2> /dev/null | grep -q "libcuda.so.1 " || expect gpus 2 "train on CPU devices with --devices cpu:2" -- $L --gpus 2
expect dump-alone 2 "--dump needs --check-batch" -- $L --dump x.st
expect log-every-alone 2 "--log-every K writes its records into --log FILE" -- $L --log-every 5
# progress off a terminal: a line every --progress-every seconds; --log-every's step records beside the epochs'
if "$MGC" $L --epochs 1 --limit-train 6400 --limit-test 256 --batch-size 64 --progress-every 0.001 --log "$tmp/steps.jsonl" \
       --log-every 25 > "$tmp/out" 2>&1 && grep -qE "^  epoch 1/1  step [0-9]+/100  loss [0-9.]+  [0-9,]+ examples/s  eta .* \(epoch\), .* \(run\)$" "$tmp/out" &&
   [ "$(grep -c '"step": ' "$tmp/steps.jsonl")" = 4 ] && [ "$(grep -c '"test_acc": ' "$tmp/steps.jsonl")" = 1 ] &&
   grep -q '^{"step": 100, "epoch": 1, "epoch_step": 100, "loss": ' "$tmp/steps.jsonl"; then pass=$((pass + 1))
else echo "FAIL cli progress-lines/log-every: $(head -c 400 "$tmp/out"; head -c 300 "$tmp/steps.jsonl")"; fail=$((fail + 1)); fi
# --val-split: a share held out and measured each epoch; --save-best keeps the best epoch's parameters;
# --early-stop ends a run that stopped improving (lr 0: never better than epoch 1, so it stops after 1 + K)
V="--limit-train 3000 --limit-test 500 --batch-size 100 --val-split 0.2"
expect val-split 0 "2,400 training (600 held out for validation, --val-split 0.2)" -- $L --epochs 1 $V
expect early-stop 0 "stopped early after epoch 3 of 10: the validation accuracy has not improved for 2 epochs (best" -- \
    $L --epochs 10 $V --lr 0 --early-stop 2
expect save-best-alone 2 "--save-best measures the validation accuracy: give --val-split F" -- $L --save-best --save "$tmp/b.st"
expect val-split-empty 1 "--val-split 0.001 of 100 training examples leaves none to validate on" -- $L --limit-train 100 --val-split 0.001
if "$MGC" $L --epochs 3 $V --lr 0.1 --momentum 0.9 --normalize --save "$tmp/vb.safetensors" --save-best --log "$tmp/vb.jsonl" > "$tmp/out" 2>&1 &&
   "$MGC" $L --epochs 1 $V --lr 0 --log "$tmp/vl1.jsonl" > /dev/null 2>&1 &&
   "$MGC" $L --epochs 1 $V --lr 0 --devices cpu:2 --log "$tmp/vl2.jsonl" > /dev/null 2>&1 &&
   /usr/bin/python3 - "$tmp" << 'PY'
import json, struct, sys
t = sys.argv[1]
one = [json.loads(l) for l in open(f"{t}/vb.jsonl")]
v1, v2 = (json.loads(open(f"{t}/vl{k}.jsonl").readline()) for k in (1, 2))
best = max(one, key=lambda r: (r["val_acc"], -r["epoch"]))   # the first epoch of the best accuracy
raw = open(f"{t}/vb.best.safetensors", "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
assert int(meta["epoch"]) == best["epoch"], (meta["epoch"], best)
# the same examples held out on two devices as on one: with lr 0 the initial parameters' accuracy on them, the same
assert v1["val_acc"] == v2["val_acc"] and v2["replicas"] == 2, (v1, v2)
assert all(0 < r["val_acc"] < 1 for r in one)
PY
then pass=$((pass + 1)); else echo "FAIL cli save-best/val-split on cpu:2: $(tail -3 "$tmp/out")"; fail=$((fail + 1)); fi
# --normalize=MEAN,STD: the values given, not the training set's: pixels 0..1 come out at (p - 0.5) / 0.25, -2..2
expect normalize-given-channels 1 "--normalize= gives the mean and std of 3 channels, and the images have 1" -- $L --epochs 1 --normalize=imagenet
expect normalize-given-odd 2 "an odd count of numbers" -- $L --normalize=0.2
if "$MGC" $L --normalize=0.5,0.25 --limit-train 512 --dump-batch "$tmp/nb.safetensors" > "$tmp/out" 2>&1 &&
   grep -q "normalize (mean 0.5000 std 0.2500)" "$tmp/out" && /usr/bin/python3 - "$tmp/nb.safetensors" << 'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
a, b = h["x"]["data_offsets"]
x = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
assert min(x) == -2.0 and max(x) == 2.0, (min(x), max(x))
PY
then pass=$((pass + 1)); else echo "FAIL cli normalize-given: $(head -3 "$tmp/out")"; fail=$((fail + 1)); fi
# bench/mgc_stream.py (a PyTorch twin's --stream mgc) draws mgc's batches: its first batch is --dump-batch's,
# the same examples, crops and flips (and a crop of 2, or another seed, is not)
if [ -n "${MGC_DATA:-}" ]; then
    if "$MGC" $L --seed 7 --augment crop:3,flip --normalize --dump-batch "$tmp/sb.safetensors" > "$tmp/out" 2>&1 &&
       /usr/bin/python3 - "$tmp/sb.safetensors" "$MGC_DATA" << 'PY'
import gzip, os, sys
import numpy as np
sys.path.insert(0, "bench")
import mgc_stream
raw = gzip.open(os.path.join(sys.argv[2], "train-images-idx3-ubyte.gz")).read()[16:]
x = (np.frombuffer(raw, np.uint8).reshape(-1, 1, 28, 28) / np.float32(255)).astype(np.float32)
err = mgc_stream.check_dump(sys.argv[1], x, 7, 3, True)
assert 0 <= err < 1e-5, err
assert mgc_stream.check_dump(sys.argv[1], x, 7, 2, True) > 0.1 and mgc_stream.check_dump(sys.argv[1], x, 8, 3, True) == -1
PY
    then pass=$((pass + 1)); else echo "FAIL cli mgc-stream: bench/mgc_stream.py does not make --dump-batch's batch"; fail=$((fail + 1)); fi
fi
# --tensorboard: TensorBoard's own reader (from .venv, .ci/setup) reads the events back, CRCs and all, and
# finds the --log's numbers in them
TBPY=${MGC_VENV:-.venv}/bin/python
if "$TBPY" -c "import tensorboard.backend.event_processing.event_accumulator" 2> /dev/null; then
    if "$MGC" $L --epochs 2 --limit-train 2000 --limit-test 500 --batch-size 100 --val-split 0.1 --tensorboard "$tmp/tb/run" \
           --log "$tmp/tb.jsonl" > "$tmp/out" 2>&1 && "$TBPY" tests/tensorboard_check.py "$tmp/tb/run" "$tmp/tb.jsonl" 2 18 > "$tmp/tbc" 2>&1; then
        pass=$((pass + 1))
    else echo "FAIL cli tensorboard: $(tail -3 "$tmp/out") $(tail -3 "$tmp/tbc")"; fail=$((fail + 1)); fi
else
    echo "skip tensorboard: no tensorboard in ${MGC_VENV:-.venv} (bash .ci/setup makes it)"
    [ "${CI:-}" = true ] && { echo "FAIL cli: CI has no tensorboard in .venv"; fail=$((fail + 1)); }
fi
expect tensorboard-unwritable 1 "--tensorboard: cannot make the directory /proc/nope" -- $L --epochs 1 --tensorboard /proc/nope/tb
# mgc plot: the runs' --log files as SVG curves (the step records left out); the points are the epochs',
# higher values higher up; a missing file and a wrong --out said
if "$MGC" plot "$tmp/vb.jsonl" "$tmp/steps.jsonl" --out "$tmp/curves.svg" > "$tmp/out" 2>&1 && /usr/bin/python3 - "$tmp" << 'PY'
import json, sys
import xml.etree.ElementTree as ET
t = sys.argv[1]
lines = {p.get("data-run") + "/" + p.get("data-series"): [tuple(map(float, q.split(","))) for q in p.get("points").split()]
         for p in ET.parse(f"{t}/curves.svg").getroot().iter("{http://www.w3.org/2000/svg}polyline")}
assert sorted(lines) == sorted(["vb.jsonl/loss", "vb.jsonl/test_acc", "vb.jsonl/val_acc", "vb.jsonl/train_acc",
                                "steps.jsonl/loss", "steps.jsonl/test_acc", "steps.jsonl/train_acc"]), sorted(lines)
log = [json.loads(l) for l in open(f"{t}/vb.jsonl")]
for series in ("test_acc", "val_acc", "loss"):
    pts, vals = lines["vb.jsonl/" + series], [r[series] for r in log]
    assert len(pts) == len(vals) == 3 and pts[0][0] < pts[1][0] < pts[2][0], pts
    for i in range(3):
        for j in range(3):   # SVG's y grows downwards: a larger value is drawn higher
            assert (vals[i] > vals[j]) == (pts[i][1] < pts[j][1] - 1e-9) or vals[i] == vals[j], (series, vals, pts)
assert len(lines["steps.jsonl/loss"]) == 1   # its 4 step records are not epochs
PY
then pass=$((pass + 1)); else echo "FAIL cli plot: $(tail -3 "$tmp/out")"; fail=$((fail + 1)); fi
expect plot-missing 1 "mgc plot: cannot read $tmp/none.jsonl" -- plot "$tmp/none.jsonl" --out "$tmp/c.svg"
expect plot-out 2 "mgc plot RUN.jsonl [RUN2.jsonl ...] --out curves.svg" -- plot "$tmp/vb.jsonl" --out "$tmp/c.png"
expect batch-old-name 2 "'--batch' is now '--check-batch FILE'" -- $L --batch 64
expect option-far 2 "unknown option '--bs'" -- $L --bs 64
HOME=$tmp/no-home XDG_CACHE_HOME= expect home-missing 0 "HOME=$tmp/no-home: No such file or directory" -- $L --epochs 0
expect resume-load 2 "--load and --resume both name a checkpoint" -- $L --load a.st --resume b.st
expect resume-load-order 2 "--load and --resume both name a checkpoint" -- $L --resume b.st --load a.st
expect resume-batch 2 "check mode (--check-batch) takes --load" -- $L --resume a.st --check-batch b.st --steps 1
expect schedule-word 2 "--lr-schedule expects constant, cosine or step:E1,E2,..." -- $L --lr-schedule wobble
expect schedule-order 2 "--lr-schedule step:3,2: the milestones must increase" -- $L --lr-schedule step:3,2
expect schedule-epochs 2 "step: expects epochs (or steps) E1,E2,... (whole numbers from 1), got 'step:1,x'" -- $L --lr-schedule step:1,x
expect schedule-gamma 2 "--lr-gamma is the factor of --lr-schedule step:E1,E2,...; give that too" -- $L --lr-gamma 0.5
expect lr-per 2 "--lr-per expects step or epoch, got 'batch'" -- $L --lr-per batch
expect warmup-negative 2 "--warmup must be in 0..1000000000, got -3" -- $L --warmup -3
expect schedule-gamma-range 2 "--lr-gamma must be in [0, 1], got 2" -- $L --lr-schedule step:1 --lr-gamma 2
# Tensor operators: 'a + b', 'a - b', 'a * b' on tensors are the layers add, sub
# and mul. The nets of tests/nets/op_add.net and op_mul_sub.net written with
# them (and an unlabelled conv2d, for the automatic names) print the same IR as
# written with the layers, up to the source positions.
ir_of() { "$MGC" "$1" --emit ir 2>&1 | sed -E 's/ +[^ ]+:[0-9]+:[0-9]+$//'; }
cat > "$tmp/add_op.net" <<'NET'
net op_add(classes = 10) {
    input x[N, 3, 6, 6]
    y = x -> a: conv2d(3, kernel = 3, padding = 1) -> relu -> b: conv2d(3, kernel = 3, padding = 1)
    return y + x -> relu -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
cat > "$tmp/mul_sub_op.net" <<'NET'
# mul and sub with PyTorch's broadcasting, as tests/nets/op_mul_sub.net
net op_mul_sub(classes = 10) {
    input x[N, 3, 6, 6]
    g = x -> global_avgpool -> c1: conv2d(3, kernel = 1) -> sigmoid
    m = x -> c2: conv2d(1, kernel = 3, padding = 1) -> tanh
    return (x * g - g) * m -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
sed 's/-> mul(g) -> sub(g) -> mul(m)/-> mul(g) -> sub(g) -> mul(m) -> conv2d(3, kernel = 1)/' tests/nets/op_mul_sub.net > "$tmp/mul_sub_layers.net"
sed 's/(x \* g - g) \* m/((x * g - g) * m -> conv2d(3, kernel = 1))/' "$tmp/mul_sub_op.net" > "$tmp/mul_sub_op2.net"
for pair in "tests/nets/op_add.net $tmp/add_op.net" "tests/nets/op_mul_sub.net $tmp/mul_sub_op.net" \
            "$tmp/mul_sub_layers.net $tmp/mul_sub_op2.net"; do
    set -- $pair
    if ir_of "$1" > "$tmp/ir_layers" && ir_of "$2" > "$tmp/ir_ops" && grep -q '= add\|= mul' "$tmp/ir_ops" &&
       cmp -s "$tmp/ir_layers" "$tmp/ir_ops"; then
        ok "tensor operators: $(basename "$2") prints the IR of $(basename "$1")"
    else
        bad "tensor operators: $(basename "$2") and $(basename "$1") print different IR"
        diff "$tmp/ir_layers" "$tmp/ir_ops" | head -5
    fi
done
grep -q 'conv2d_0.weight' "$tmp/ir_ops" && ok "tensor operators: an unlabelled layer after them is conv2d_0" ||
    bad "tensor operators: the automatic name after them is not conv2d_0"
# --resume on a checkpoint that holds the epochs asked for trains nothing; on
# one that is not --save's (a check-mode dump has no epoch) it says so
"$MGC" $L --epochs 0 --save "$tmp/e0.st" > /dev/null 2>&1
expect resume-done 0 "holds 0 epochs already, --epochs 0: nothing to train" -- $L --epochs 0 --resume "$tmp/e0.st"
# a cosine over 0 epochs saved, resumed as a cosine over 1: the rate recipe differs, and is named
if [ -n "${MGC_DATA:-}" ]; then
    expect resume-schedule 0 "the checkpoint was trained with lr 0.1, cosine over 0 epochs, every step; this run has lr 0.1, cosine over 1 epoch, every step: epoch 1 goes on along this run's schedule" -- $L --epochs 1 --limit-train 256 --limit-test 64 --resume "$tmp/e0.st" --save "$tmp/e0b.st"
fi
# another optimizer goes on from the parameters, its own state from zero (and says so)
if [ -n "${MGC_DATA:-}" ]; then
    expect resume-optimizer 0 "this run goes on with adamw betas 0.9,0.999 eps 1e-08 weight decay 0.01 (its state starts afresh)" -- $L --epochs 1 --limit-train 256 --limit-test 64 --optimizer adamw --resume "$tmp/e0.st" --save "$tmp/e0c.st"
fi
/usr/bin/python3 -c "import sys; sys.path.insert(0, 'tests'); import st, torch; st.save({'x': torch.zeros(2)}, sys.argv[1])" "$tmp/foreign.st" 2> /dev/null &&
    expect resume-foreign 1 "does not say its epoch (not one of mgc --save's" -- $L --epochs 1 --resume "$tmp/foreign.st"
expect missing-net 1 "cannot open 'nope.net'" -- nope.net --emit ir
expect unknown-param 2 "clases" -- $L --set clases=5 --emit ir
expect set-type 2 "classes" -- $L --set classes=abc --emit ir
expect set-ok 0 "[N,5]" -- $L --set classes=5 --emit ir
expect few-classes 1 "use --set classes=10" -- $L --set classes=5 --epochs 1 --data "$tmp/none"
expect wrong-input 1 "does not match Fashion-MNIST images" -- nets/resnet18.net --set in_channels=3 --epochs 1 --data "$tmp/none"
expect missing-data 1 "t10k-labels-idx1-ubyte" -- $L --epochs 1 --data "$tmp/none"
expect missing-data-url 1 "github.com/zalandoresearch/fashion-mnist" -- $L --epochs 1 --data "$tmp/none"
expect data-is-file 1 "--data 'nets/lenet.net' is a file, not a directory" -- $L --epochs 1 --data nets/lenet.net
# The other data formats, found by their files in --data (tiny sets written here): CIFAR-10 in the
# folder its archive unpacks to, CIFAR-100, and a safetensors pair written with PyTorch. The first
# line names the format; the net is checked against its shape before anything is read, and against
# its classes.
/usr/bin/python3 - "$tmp" <<'PY'
import os, random, sys
random.seed(3)
def batch(path, n, hundred):
    with open(path, "wb") as f:
        for i in range(n):
            f.write((bytes([i % 20, i % 100]) if hundred else bytes([random.randrange(10)])) + os.urandom(3072))
c10 = os.path.join(sys.argv[1], "c10", "cifar-10-batches-bin")
os.makedirs(c10)
for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
    batch(os.path.join(c10, name + ".bin"), 24, False)
os.makedirs(os.path.join(sys.argv[1], "c100"))
batch(os.path.join(sys.argv[1], "c100", "train.bin"), 100, True)
batch(os.path.join(sys.argv[1], "c100", "test.bin"), 30, True)
PY
R18="nets/resnet18.net --set in_channels=3 --resize 28"
expect cifar10-resnet18 0 "; 64 training and 24 test examples (CIFAR-10, 3x32x32), batch 32" -- $R18 --epochs 1 --limit-train 64 --batch-size 32 --data "$tmp/c10"
expect cifar10-channels 1 "the net's input [N,1,28,28] does not match CIFAR-10 images [N,3,32,32]; declare 'input x[N, 3, 32, 32]', or give the net 3 input channels with --set in_channels=3" -- $L --epochs 1 --data "$tmp/c10"
expect cifar10-resize 1 "does not match CIFAR-10 images [N,3,32,32]; declare 'input x[N, 3, 32, 32]', or bring the images to the net's size with --resize 28x28" -- $L --set in_channels=3 --epochs 1 --data "$tmp/c10"
expect cifar100-classes 1 "the net has 10 outputs but the data (CIFAR-100) has 100 classes (labels 0..99); use --set classes=100" -- $L --set in_channels=3 --resize 28 --epochs 1 --data "$tmp/c100"
expect cifar100-trains 0 "; 100 training and 30 test examples (CIFAR-100, 3x32x32), batch 256" -- $L --set in_channels=3 --set classes=100 --resize 28 --augment crop:2,flip --normalize --epochs 1 --data "$tmp/c100"
head -c -5 "$tmp/c100/test.bin" > "$tmp/c100/cut" && mv "$tmp/c100/cut" "$tmp/c100/test.bin"
expect cifar100-truncated 1 "test.bin: 92215 bytes are not a whole number of 3074-byte CIFAR-100 records: 29 records and 3069 bytes left over (file truncated?" -- $L --set in_channels=3 --set classes=100 --resize 28 --epochs 1 --data "$tmp/c100"
if /usr/bin/python3 - "$tmp" <<'PY'
import os, sys
sys.path.insert(0, "tests")
import st, torch
g = torch.Generator().manual_seed(0)
for kind, shape, make in (("u8", (28, 28, 3), lambda s: torch.randint(0, 256, s, dtype=torch.uint8, generator=g)),
                          ("f32", (3, 28, 28), lambda s: torch.randn(s, generator=g))):
    os.makedirs(os.path.join(sys.argv[1], "st-" + kind))
    for name, n in (("train", 96), ("test", 32)):
        st.save({"images": make((n,) + shape), "labels": torch.arange(n) % 12},
                os.path.join(sys.argv[1], "st-" + kind, name + ".safetensors"))
# --normalize's deviations: channel 0 constant (shifted only), channel 1 constant but
# for one value of float32's least step (its deviation, 5.1e-48, rounds to 0 in float32;
# mgc divided by it: NaN and infinite inputs, made numbers by ReLU: a finite loss)
os.makedirs(os.path.join(sys.argv[1], "st-flat"))
for name, n in (("train", 96), ("test", 32)):
    x = torch.randn((n, 3, 28, 28), generator=g)
    x[:, 0] = 0.5
    x[:, 1] = 0.0
    x[3, 1, 4, 5] = torch.finfo(torch.float32).tiny * 2.0 ** -23
    st.save({"images": x, "labels": torch.arange(n) % 12}, os.path.join(sys.argv[1], "st-flat", name + ".safetensors"))
PY
then
    expect st-u8-nhwc 0 "; 96 training and 32 test examples (safetensors, 3x28x28, 12 classes), batch 32" -- $L --set in_channels=3 --set classes=12 --epochs 1 --batch-size 32 --data "$tmp/st-u8"
    expect st-f32 0 "; 96 training and 32 test examples (safetensors, 3x28x28 floats, 12 classes), batch 32" -- $L --set in_channels=3 --set classes=12 --epochs 1 --batch-size 32 --normalize --data "$tmp/st-f32"
    expect normalize-flat 1 "mgc: --normalize: channel 1 of the training images has standard deviation 5.11e-48, which rounds to 0 in float32" -- $L --set in_channels=3 --set classes=12 --epochs 1 --batch-size 32 --normalize --data "$tmp/st-flat"
    expect st-classes 1 "the net has 10 outputs but the data (safetensors) has 12 classes (labels 0..11); use --set classes=12" -- $L --set in_channels=3 --epochs 1 --data "$tmp/st-u8"
    rm "$tmp/st-u8/test.safetensors"
    expect st-missing-test 1 "is incomplete: missing test.safetensors" -- $L --set in_channels=3 --set classes=12 --epochs 1 --data "$tmp/st-u8"
else
    bad "safetensors data sets: /usr/bin/python3 could not write them with torch (tests/st.py)"
fi
# A memory plan larger than the machine is refused before anything is allocated,
# with the largest buffers and a batch that fits (40 TiB at the largest batch)
cat > "$tmp/wide.net" <<'NET'
net wide(classes = 10) {
    input x[N, 1, 28, 28]
    return x -> c1: conv2d(1024, kernel = 3, padding = 1) -> relu
             -> c2: conv2d(1024, kernel = 3, padding = 1) -> relu
             -> global_avgpool -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
expect memory-plan 1 "mgc: not enough memory: training wide at batch 1048576" -- "$tmp/wide.net" --epochs 0 --batch-size 1048576
expect memory-largest 1 "of %7 conv2d [N,1024,28,28] ($tmp/wide.net:4)" -- "$tmp/wide.net" --epochs 0 --batch-size 1048576
expect memory-fits 1 "would fit" -- "$tmp/wide.net" --epochs 0 --batch-size 1048576 --devices cpu:2
expect memory-small-ok 0 "initialised" -- "$tmp/wide.net" --epochs 0 --batch-size 2
# Deep and large inputs. 64 nested block instances, each nesting its stage 300
# levels deep inside add(...): within every per-body limit, past the total
# (once a stack overflow); a clear error, no crash.
awk 'BEGIN {
    for (i = 0; i < 64; i++) {
        e = (i < 63) ? "x -> b" (i + 1) : "x -> relu"
        for (k = 0; k < 300; k++) e = "x -> add(" e ")"
        printf "block b%d(x) {\n    return %s\n}\n", i, e
    }
    print "net deep {\n    input x[N, 1, 28, 28]\n    return x -> b0 -> flatten -> linear(10) -> softmax_cross_entropy\n}"
}' > "$tmp/deep.net"
expect deep-blocks 1 "error: this is nested too deeply" -- "$tmp/deep.net" --emit ir
# 30,000 layers (60,000 parameters) elaborate in well under a second: names
# are hashed (timeout 60 s catches a quadratic lookup, which took minutes);
# 120,000 are refused by the statement limit, also without the quadratic work.
for n in 30000 120000; do
    awk -v n=$n 'BEGIN {
        print "net many {\n    input x[N, 1, 28, 28]\n    y = x -> flatten -> l0: linear(8)"
        for (i = 1; i < n; i++) printf "    y = y -> l%d: linear(8)\n", i
        print "    return y -> softmax_cross_entropy\n}"
    }' > "$tmp/many$n.net"
done
if timeout 60 "$MGC" "$tmp/many30000.net" --emit ir > "$tmp/out" 2>&1 && grep -q "in 60000 tensors" "$tmp/out"; then
    pass=$((pass + 1))
else
    echo "FAIL cli many-layers: 30,000 layers did not elaborate within 60 s: $(head -c 300 "$tmp/out")"; fail=$((fail + 1))
fi
if timeout 60 "$MGC" "$tmp/many120000.net" --emit ir > "$tmp/out" 2>&1; rc=$?; [ $rc -eq 1 ] && grep -q "would run" "$tmp/out"; then
    pass=$((pass + 1))
else
    echo "FAIL cli too-many-statements: exit $rc: $(head -c 300 "$tmp/out")"; fail=$((fail + 1))
fi
# More threads than cores: said, and capped at the cores
expect threads-cap 0 "is more than the" -- $L --epochs 0 --threads 1024
expect load-missing 1 "cannot load checkpoint" -- $L --epochs 0 --load "$tmp/none.safetensors"
expect save-unwritable 2 "the directory $tmp/no/such/dir does not exist" -- $L --epochs 0 --save "$tmp/no/such/dir/x.safetensors"
expect init-save 0 "saved to" -- $L --epochs 0 --save "$tmp/lenet.safetensors"
expect load-other-net 1 "is a checkpoint of the net 'lenet', not of 'resnet18'" -- nets/resnet18.net --epochs 0 --load "$tmp/lenet.safetensors"
if [ "$("$MGC" nets/resnet18.net --epochs 0 --load "$tmp/lenet.safetensors" 2>&1 | wc -l)" -eq 1 ]; then pass=$((pass + 1)); else echo "FAIL cli load-other-net: more than one line"; fail=$((fail + 1)); fi
expect load-wrong-shape 1 "has shape [6,1,5,5] but the net needs [6,3,5,5]" -- $L --set in_channels=3 --epochs 0 --load "$tmp/lenet.safetensors"
printf 'not a checkpoint at all' > "$tmp/junk.safetensors"
expect load-junk 1 "cannot load checkpoint" -- $L --epochs 0 --load "$tmp/junk.safetensors"
mkfifo "$tmp/ck.fifo"   # refused, never opened to wait for a writer
expect load-fifo 1 "cannot load checkpoint: $tmp/ck.fifo: is a FIFO, not a regular file" -- $L --epochs 0 --load "$tmp/ck.fifo"
# A checkpoint holding NaN (the first value of every tensor) is refused, naming the first four
# tensors, then how many (issue 35: it loaded with a warning, trained on and saved NaN).
python3 - "$tmp/lenet.safetensors" "$tmp/nan.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])
for name, t in head.items():
    if name != "__metadata__":
        data[t["data_offsets"][0]:t["data_offsets"][0] + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(raw[:8 + n] + bytes(data))
PY
expect load-nan 1 "nan.safetensors: parameter 'conv1.weight' holds 1 value that is not finite, of 150 (the first, element 0, is nan)" -- $L --epochs 0 --load "$tmp/nan.safetensors"
expect load-nan-summary 1 "10 tensors hold such values: the checkpoint was saved from a run that diverged, or is damaged; load an earlier one" -- $L --epochs 0 --load "$tmp/nan.safetensors"

if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    # Corrupt copies of the data set, each named as such before training starts.
    mk() { rm -rf "$tmp/d"; mkdir -p "$tmp/d"; cp "$MGC_DATA"/*.gz "$tmp/d/"; }
    mk; head -c 100000 "$MGC_DATA/t10k-images-idx3-ubyte.gz" > "$tmp/d/t10k-images-idx3-ubyte.gz"
    expect truncated-gz 1 "t10k-images-idx3-ubyte" -- $L --epochs 1 --data "$tmp/d"
    mk; gzip -dc "$MGC_DATA/t10k-labels-idx1-ubyte.gz" | head -c 9000 | gzip > "$tmp/d/t10k-labels-idx1-ubyte.gz"
    expect short-labels 1 "t10k-labels-idx1-ubyte" -- $L --epochs 1 --data "$tmp/d"
    mk; cp "$MGC_DATA/t10k-labels-idx1-ubyte.gz" "$tmp/d/t10k-images-idx3-ubyte.gz"
    expect bad-magic 1 "magic" -- $L --epochs 1 --data "$tmp/d"
    mk; printf 'garbage, not gzip and not IDX' > "$tmp/d/train-labels-idx1-ubyte.gz"
    expect garbage 1 "train-labels-idx1-ubyte" -- $L --epochs 1 --data "$tmp/d"
    mk; rm "$tmp/d/t10k-labels-idx1-ubyte.gz"; mkdir "$tmp/d/t10k-labels-idx1-ubyte.gz"
    expect data-entry-dir 1 "t10k-labels-idx1-ubyte.gz' is a directory, not a regular file" -- $L --epochs 1 --data "$tmp/d"
    mk; rm "$tmp/d/t10k-labels-idx1-ubyte.gz"; mkfifo "$tmp/d/t10k-labels-idx1-ubyte.gz"
    expect data-entry-fifo 1 "t10k-labels-idx1-ubyte.gz' is a FIFO, not a regular file" -- $L --epochs 1 --data "$tmp/d"
    mkdir -p "$tmp/cf"; for k in 1 2 3 4 5; do : > "$tmp/cf/data_batch_$k.bin"; done; mkfifo "$tmp/cf/test_batch.bin"
    expect cifar-fifo 1 "CIFAR-10 file '$tmp/cf/test_batch.bin' is a FIFO, not a regular file: replace it with the file test_batch.bin" -- $L --epochs 1 --set in_channels=3 --resize 28 --data "$tmp/cf"

    # A short run on a subset must learn: chance is 0.10.
    "$MGC" $L --epochs 3 --limit-train 10000 --limit-test 2000 --lr 0.05 --momentum 0.9 --log "$tmp/log.jsonl" --save "$tmp/e2e.safetensors" > "$tmp/e2e" 2>&1
    acc=$(/usr/bin/env python3 -c "import json,sys; print(json.loads(open('$tmp/log.jsonl').read().splitlines()[-1])['test_acc'])" 2>/dev/null)
    if python3 -c "import sys; sys.exit(0 if float('${acc:-0}') > 0.5 else 1)" 2>/dev/null; then
        pass=$((pass + 1)); echo "ok   e2e: LeNet, 3 epochs on 10,000 examples: test accuracy $acc"
    else
        echo "FAIL e2e: test accuracy ${acc:-none}, wanted > 0.5"; sed 's/^/    /' "$tmp/e2e" | tail -5; fail=$((fail + 1))
    fi
    if python3 - "$tmp/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["epoch"] for r in rows] == [1, 2, 3]
for r in rows:
    for k in ("epoch", "loss", "train_acc", "test_acc", "examples_per_s", "seconds"):
        assert k in r, k
PY
    then pass=$((pass + 1)); else echo "FAIL log: --log jsonl lacks fields"; fail=$((fail + 1)); fi
    # No test examples: the log says null for the accuracy, and stays JSON
    "$MGC" $L --epochs 1 --limit-train 512 --limit-test 0 --log "$tmp/notest.jsonl" > "$tmp/notest" 2>&1
    if python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).read()); sys.exit(0 if r['test_acc'] is None else 1)" "$tmp/notest.jsonl"; then
        pass=$((pass + 1)); else echo "FAIL log-null: --limit-test 0 did not log test_acc null"; fail=$((fail + 1)); fi
    # Divergence: the loss says so and points at --check-nan, which names the first
    # step, kernel and layer that wrote a value that is not finite (also where the
    # device's memory is apart from the host's, so that outputs are read back)
    expect diverged 1 "training diverged; try a smaller --lr (--check-nan names" -- $L --epochs 1 --limit-train 2048 --limit-test 64 --lr 1e30
    expect check-nan 1 "computing %8 conv2d [N,16,8,8] (nets/lenet.net:8)" -- $L --epochs 1 --limit-train 2048 --limit-test 64 --lr 1e30 --check-nan
    MGC_CPU_OWN_MEMORY=1 expect check-nan-own-memory 1 "computing %8 conv2d [N,16,8,8]" -- $L --epochs 1 --limit-train 2048 --limit-test 64 --lr 1e30 --check-nan
    expect check-nan-fine 0 "test acc" -- $L --epochs 1 --limit-train 512 --limit-test 64 --check-nan
    # A log that cannot be written (a full disk) is said at once, and the run ends with status 1
    expect log-full 1 "cannot write --log /dev/full: No space left on device" -- $L --epochs 1 --limit-train 512 --limit-test 64 --log /dev/full
    # Resuming from the checkpoint gives the same test accuracy as the run that saved it.
    "$MGC" $L --epochs 1 --lr 1e-9 --limit-train 256 --limit-test 2000 --load "$tmp/e2e.safetensors" > "$tmp/resume" 2>&1
    got=$(sed -n 's/.*test acc \([0-9.]*\).*/\1/p' "$tmp/resume" | tail -1)
    if python3 -c "import sys; sys.exit(0 if abs(float('${got:-9}') - float('${acc:-0}')) < 0.0006 else 1)"; then
        pass=$((pass + 1))
    else
        echo "FAIL resume: --load did not restore the trained weights (test acc ${got:-none}, wanted $acc)"; tail -2 "$tmp/resume"; fail=$((fail + 1))
    fi
    # --evaluate measures the saved parameters: exactly the accuracy of the epoch that saved them
    "$MGC" $L --evaluate --limit-test 2000 --load "$tmp/e2e.safetensors" > "$tmp/eval" 2>&1
    want=$(printf '%.4f' "${acc:-9}")
    if grep -q "^test acc $want  on 2,000 test examples in .* s, parameters from $tmp/e2e.safetensors" "$tmp/eval" &&
       ! grep -q "^epoch" "$tmp/eval"; then
        pass=$((pass + 1))
    else
        echo "FAIL evaluate: wanted test acc $want"; tail -2 "$tmp/eval" | sed 's/^/    /'; fail=$((fail + 1))
    fi
    # --lr-schedule: the rate of each epoch's last step (the log's "lr") is PyTorch's schedulers':
    # per epoch, stepped once an epoch; per step (2 steps an epoch here: t = 1, 3, ..., 13), stepped
    # every step: a warmup as LinearLR(1/W -> 1 over W-1 steps) chained with CosineAnnealingLR(T_max =
    # all 14 steps); MultiStepLR with milestones in steps; and the default, no schedule option: cosine
    # every step
    S="--limit-train 256 --limit-test 64 --batch-size 128"
    : > "$tmp/sched"
    for run in "cos:--lr-schedule cosine --lr-per epoch" "step:--lr-schedule step:2,5 --lr-gamma 0.3" \
               "scos:--lr-per step --lr-schedule cosine --warmup 5" "sstep:--lr-per step --lr-schedule step:3,8 --lr-gamma 0.3" \
               "swarm:--lr-schedule constant --warmup 4" "sdef:"; do
        "$MGC" $L $S --epochs 7 --lr 0.2 ${run#*:} --log "$tmp/${run%%:*}.jsonl" >> "$tmp/sched" 2>&1 || echo "FAILED: ${run#*:}" >> "$tmp/sched"
    done
    if out=$(/usr/bin/python3 - "$tmp" <<'PY'
import json, sys, torch
S = torch.optim.lr_scheduler
def torch_lrs(make, steps, every):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.2)
    sched, lrs = make(opt), []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step(); sched.step()
    return lrs[every - 1::every]   # each epoch's last step
worst = 0.0
for name, steps, every, make in (
        ("cos", 7, 1, lambda o: S.CosineAnnealingLR(o, T_max=7)),
        ("step", 7, 1, lambda o: S.MultiStepLR(o, milestones=[2, 5], gamma=0.3)),
        ("scos", 14, 2, lambda o: S.ChainedScheduler([S.LinearLR(o, 1 / 5, 1.0, 4), S.CosineAnnealingLR(o, T_max=14)])),
        ("sstep", 14, 2, lambda o: S.MultiStepLR(o, milestones=[3, 8], gamma=0.3)),
        ("swarm", 14, 2, lambda o: S.LinearLR(o, 1 / 4, 1.0, 3)),
        ("sdef", 14, 2, lambda o: S.CosineAnnealingLR(o, T_max=14))):
    got = [json.loads(l)["lr"] for l in open(f"{sys.argv[1]}/{name}.jsonl")]
    want = torch_lrs(make, steps, every)
    assert len(got) == len(want), (name, got, want)
    worst = max(worst, max(abs(g - w) / w for g, w in zip(got, want)))
print(f"per epoch: cosine, step:2,5; per step: cosine after a 5-step warmup, step:3,8, a warmup alone, "
      f"the default cosine; worst relative difference {worst:.1e}")
sys.exit(0 if worst < 1e-6 else 1)
PY
    ); then ok "--lr-schedule, --lr-per, --warmup = PyTorch's CosineAnnealingLR, MultiStepLR and LinearLR: $out"
    else bad "--lr-schedule against PyTorch's schedulers: $out"; tail -3 "$tmp/sched" | sed 's/^/    /'; fi
    "$MGC" $L $S --epochs 1 --lr-schedule constant --save "$tmp/one.st" > /dev/null 2>&1 &&
        "$MGC" $L $S --epochs 3 --lr-schedule step:1 --lr-gamma 0 --save "$tmp/frozen.st" > "$tmp/frozen" 2>&1 &&
        grep -q "^epoch 3/3 .* lr 0 " "$tmp/frozen" &&
        /usr/bin/python3 tests/st.py compare "$tmp/frozen.st" "$tmp/one.st" 0 > /dev/null &&
        ok "--lr-schedule step:1 --lr-gamma 0: epochs 2 and 3 train at rate 0, the parameters are epoch 1's" ||
        bad "--lr-schedule step:1 --lr-gamma 0 moved the parameters after epoch 1"
    # counted in steps, the same milestone: after step 2 (epoch 1's end) the same parameters; after
    # step 3 (epoch 2's first step trains) not (tests/fakecuda.sh: the same on a GPU's recorded step)
    "$MGC" $L $S --epochs 3 --lr-per step --lr-schedule step:2 --lr-gamma 0 --save "$tmp/frozen2.st" > /dev/null 2>&1 &&
        /usr/bin/python3 tests/st.py compare "$tmp/frozen2.st" "$tmp/one.st" 0 > /dev/null &&
        "$MGC" $L $S --epochs 3 --lr-per step --lr-schedule step:3 --lr-gamma 0 --save "$tmp/frozen3.st" > /dev/null 2>&1 &&
        ! /usr/bin/python3 tests/st.py compare "$tmp/frozen3.st" "$tmp/one.st" 0 > /dev/null 2>&1 &&
        ok "--lr-per step: milestone 2 (epoch 1's 2 steps) freezes epoch 1's parameters bit for bit, milestone 3 trains one step more" ||
        bad "--lr-per step --lr-schedule step:N --lr-gamma 0 froze the parameters at the wrong step"
    expect evaluate-save 2 "--evaluate only measures the parameters on the test set: it takes --load, not --save" -- $L --evaluate --save x.st
    # ResNet-18 (BatchNorm in training form): a few steps on a small subset lower the loss.
    "$MGC" nets/resnet18.net --epochs 2 --limit-train 256 --limit-test 64 --batch-size 32 --lr 0.05 --log "$tmp/rn.jsonl" > "$tmp/rn" 2>&1
    if python3 - "$tmp/rn.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("ok   resnet18: loss %.3f -> %.3f over two epochs of 256 examples" % (rows[0]["loss"], rows[1]["loss"]))
sys.exit(0 if len(rows) == 2 and rows[1]["loss"] < 0.8 * rows[0]["loss"] else 1)
PY
    then pass=$((pass + 1)); else echo "FAIL resnet18 did not lower the loss"; tail -3 "$tmp/rn"; fail=$((fail + 1)); fi
else
    echo "skip data cases: MGC_DATA is not set"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
