#!/usr/bin/env bash
# Fusion by rule (codegen/fuse.c): an activation after a convolution (any
# form), a linear layer, a BatchNorm (2-D, or 1-D through its reshape), an
# add, a mul or a sub runs in that kernel's store, so these nets' training
# programs have no kernel of an activation's own, on the CPU and on GPUs.
# And an activation after a BatchNorm is differentiated by the BatchNorm
# gradient's kernel (fuse_bn_grad_acts): op_bn_act (every activation) and
# MobileNetV2 have no kernel of an activation's gradient's own either.
# With fusion off (MGC_FUSE=0) they have them: the count can fail. The
# activations are ir/activations.def's rows: a new row is counted here too.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup fusion
acts=$(sed -n 's/^ACT([A-Z0-9_]*, *"\([a-z0-9_]*\)".*/\1/p' ir/activations.def | paste -sd'|')
[ -n "$acts" ] || { bad "no activations read from ir/activations.def"; echo "$pass passed, $fail failed"; exit 1; }
# standalone FILE: the kernels of FILE (--emit kernels) that compute an activation alone
standalone() { grep -oE '^KERNEL\(k[0-9]+_[a-z0-9_]+' "$1" | sed 's/^KERNEL(k[0-9]*_//' | grep -cxE "($acts)$2"; }
kernels() { grep -cE '^KERNEL\(' "$1"; }
check() {  # net, "" (activations) or _grad (their gradients), what
    local net=$1 grad=$2 what=$3 dev args on off
    for dev in cpu gpu; do
        args=(); [ $dev = gpu ] && args=(--gpus 1)
        if ! MGC_FUSE=1 "$MGC" "$net" "${args[@]}" --emit kernels > "$tmp/on" 2> "$tmp/err" ||
           ! MGC_FUSE=0 "$MGC" "$net" "${args[@]}" --emit kernels > "$tmp/off" 2>> "$tmp/err"; then
            bad "$net ($dev): mgc --emit kernels failed"; head -3 "$tmp/err" | sed 's/^/    /'; continue
        fi
        on=$(standalone "$tmp/on" "$grad") off=$(standalone "$tmp/off" "$grad")
        if [ "$on" -eq 0 ] && [ "$off" -gt 0 ]; then
            ok "$net ($dev): no $what kernel of its own ($off with fusion off); $(kernels "$tmp/off") kernels unfused, $(kernels "$tmp/on") fused"
        else
            bad "$net ($dev): $on $what kernels of their own with fusion on ($off off)"
            grep -oE '^KERNEL\(k[0-9]+_[a-z0-9_]+' "$tmp/on" | sed 's/^KERNEL(//' | grep -xE "k[0-9]+_($acts)$grad" | head -5 | sed 's/^/    /'
        fi
    done
}
for net in tests/nets/op_conv_act.net tests/nets/op_ew_act.net tests/nets/like/efficientnet.net tests/nets/like/convnext.net \
           nets/mobilenetv2.net nets/se_resnet.net nets/bn_lenet.net; do
    check "$net" "" activation
done
for net in tests/nets/op_bn_act.net nets/mobilenetv2.net; do
    check "$net" _grad "activation gradient"
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
