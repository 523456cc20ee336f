#!/usr/bin/env bash
# mgc export --format onnx against ONNX Runtime: for every net of nets/ and
# every op net of tests/nets/, a checkpoint (one epoch on a few examples, so
# BatchNorm's running statistics and the parameters are not their initial
# values; LeNet and BN-LeNet on Fashion-MNIST), exported, checked by ONNX's
# own checker, and run by ONNX Runtime on the images mgc predict was given:
# the same logits within 1e-4 (relative to max(1, |logit|)) and the same
# predictions. Where a data file cannot hold a net's input (more than 4
# channels; [N, 2, 4, 4] reads as NHWC) the reference is check mode's
# evaluation logits after one SGD step, the exported checkpoint that step's
# tensors. Also: --normalize's statistics and --resize in the model's
# metadata, the export's errors (a missing tensor, a file that cannot be
# written), every forward op of mgc --list-ops in some net checked here, and
# tests/unit_export.c (the refusals of ops an evaluation graph never holds,
# the model read back with protobuf-c).
# Needs the project's virtual environment (.venv, made by .ci/setup from
# tests/requirements-onnx.txt): without onnxruntime there it says "skip"
# (under CI it fails). Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup export
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$tmp/cache}
PY=${MGC_VENV:-.venv}/bin/python
check="$PY tests/onnx_check.py"

if make -s build/unit_export > "$tmp/unit-build" 2>&1 && ./build/unit_export > "$tmp/unit" 2>&1; then
    ok "unit_export: $(tail -1 "$tmp/unit")"
else
    bad "unit_export: $(grep -h FAIL "$tmp/unit-build" "$tmp/unit" | head -5)$(tail -3 "$tmp/unit-build")"
fi
if ! "$MGC" --version | grep -q "^  ONNX      export to ONNX"; then
    echo "skip export: this mgc was built without ONNX export (apt-get install protobuf-c-compiler libprotobuf-c-dev libonnx-dev)"
    [ "${CI:-}" = true ] && bad "CI builds mgc without ONNX export: .ci/setup installs what it needs"
    echo "$pass passed, $fail failed"
    [ $fail -eq 0 ]; exit
fi
if ! $PY -c "import onnxruntime, onnx, numpy" 2> /dev/null; then
    echo "skip export: no onnxruntime in ${MGC_VENV:-.venv} (bash .ci/setup makes it, from tests/requirements-onnx.txt)"
    [ "${CI:-}" = true ] && bad "CI has no onnxruntime in ${MGC_VENV:-.venv}: .ci/setup makes it"
    echo "$pass passed, $fail failed"
    [ $fail -eq 0 ]; exit
fi

# shape NET: its input's C H W, from the evaluation IR
shape() { "$MGC" "$1" --emit eval-ir | awk '$3 == "input" { gsub(/[][N]/, "", $4); gsub(/,/, " ", $4); print $4; exit }'; }

# The cases, in three passes so that Python starts twice, not three times a net: the data and
# images of every case ($tmp/make), mgc's runs, then every comparison ($tmp/compare).
# A case is a line of $tmp/cases: NAME NET DIR ROUTE TRAINARGS...
#   predict: a checkpoint (TRAINARGS), mgc predict on DIR/x.safetensors, the export, ONNX Runtime
#   check:   one SGD step on a batch of 8 in check mode, the step's tensors exported, ONNX Runtime
#            against check mode's evaluation logits (where a data file cannot hold the input)
: > "$tmp/make"; : > "$tmp/cases"; : > "$tmp/compare"
nets_done=""
if [ -n "${MGC_DATA:-}" ] && [ -f "$MGC_DATA/t10k-images-idx3-ubyte.gz" ]; then
    # LeNet and BN-LeNet trained on Fashion-MNIST (normalised with its statistics; test accuracy 0.69 and 0.73), on its
    # first 64 test images
    for net in lenet bn_lenet; do
        mkdir -p "$tmp/$net"
        echo "images $tmp/$net/x.safetensors 64 1 28 28 0 $MGC_DATA/t10k-images-idx3-ubyte.gz" >> "$tmp/make"
        echo "$net nets/$net.net $tmp/$net predict --epochs 1 --limit-train 2000 --limit-test 500 --batch-size 32 --lr 0.1 --momentum 0.9 --normalize --data $MGC_DATA" >> "$tmp/cases"
        nets_done="$nets_done nets/$net.net"
    done
    # --resize in the metadata: NiN takes 96x96 (the images given to both are 96x96 already: resized to the same size, unchanged)
    mkdir -p "$tmp/nin_resize"
    echo "images $tmp/nin_resize/x.safetensors 8 1 96 96 3" >> "$tmp/make"
    echo "nin_resize nets/nin.net $tmp/nin_resize predict --epochs 1 --limit-train 64 --limit-test 64 --batch-size 32 --resize 96x96 --normalize --data $MGC_DATA" >> "$tmp/cases"
else
    echo "skip export: no \$MGC_DATA: LeNet and BN-LeNet are checked on random data"
fi
# every other net on random data of its input's shape: one epoch of 32 examples (batch 16), --normalize
for net in nets/*.net tests/nets/op_*.net tests/nets/small_resnet.net; do
    case " $nets_done " in *" $net "*) continue ;; esac
    name=$(basename "$net" .net) d=$tmp/$(basename "$net" .net)
    read -r c h w <<< "$(shape "$net")"
    mkdir -p "$d"
    if [ -z "$w" ] || [ "$c" -gt 4 ] || { [ "$c" != 1 ] && [ "$c" != 3 ] && [ "$c" != 4 ] && { [ "$w" = 1 ] || [ "$w" = 3 ] || [ "$w" = 4 ]; }; }; then
        echo "batch $d/b.safetensors 8 $c $h ${w:-0} 10 7" >> "$tmp/make"   # (w 0: an input [N, T, F])
        echo "$name $net $d check" >> "$tmp/cases"
    else
        echo "data $d 32 $c $h $w 10 1" >> "$tmp/make"
        echo "images $d/x.safetensors 8 $c $h $w 2" >> "$tmp/make"
        echo "$name $net $d predict --epochs 1 --batch-size 16 --normalize --data $d" >> "$tmp/cases"
    fi
    "$MGC" "$net" --emit eval-ir | awk 'NR > 1 { print $3 }' >> "$tmp/ops-checked"
done
$check run "$tmp/make" || bad "the cases' data: $($check run "$tmp/make" 2>&1 | tail -3)"

while read -r name net d route args; do
    if [ "$route" = predict ]; then
        # shellcheck disable=SC2086
        if ! "$MGC" "$net" $args --save "$d/ck.safetensors" > "$d/log" 2>&1; then bad "$name: training: $(tail -2 "$d/log")"; continue; fi
        if ! "$MGC" predict "$d/ck.safetensors" "$d/x.safetensors" --out "$d/p.safetensors" >> "$d/log" 2>&1; then
            bad "$name: mgc predict: $(tail -2 "$d/log")"; continue
        fi
        images=$d/x.safetensors reference=$d/p.safetensors
    else
        if ! "$MGC" "$net" --epochs 0 --save "$d/ck0.safetensors" > "$d/log" 2>&1 ||
           ! "$MGC" "$net" --load "$d/ck0.safetensors" --check-batch "$d/b.safetensors" --steps 1 --lr 0.1 --dump "$d/dump.safetensors" >> "$d/log" 2>&1 ||
           ! $check merge "$d/ck0.safetensors" "$d/dump.safetensors" "$d/ck.safetensors" >> "$d/log" 2>&1; then
            bad "$name: check mode: $(tail -2 "$d/log")"; continue
        fi
        images=$d/b.safetensors reference=$d/dump.safetensors name="$name (check mode)"
    fi
    if ! "$MGC" export "$d/ck.safetensors" --format onnx --out "$d/model.onnx" >> "$d/log" 2>&1; then
        bad "$name: mgc export: $(tail -2 "$d/log")"; continue
    fi
    echo "compare '$name' $d/model.onnx $images $reference" >> "$tmp/compare"
done < "$tmp/cases"

$check run "$tmp/compare" > "$tmp/compared" 2>&1
while read -r verdict line; do
    if [ "$verdict" = ok ]; then ok "$line"; else bad "$line"; fi
done < "$tmp/compared"
[ "$(grep -c . "$tmp/compared")" -eq "$(grep -c . "$tmp/compare")" ] || bad "ONNX Runtime's comparisons: $(tail -3 "$tmp/compared")"

if [ -f "$tmp/nin_resize/model.onnx" ]; then
    $check info "$tmp/nin_resize/model.onnx" > "$tmp/info"
    grep -q "^resize=96x96$" "$tmp/info" && grep -q "^normalize_mean=0.28604" "$tmp/info" && grep -q "^pixels=byte/255$" "$tmp/info" &&
        grep -q "^classes=10$" "$tmp/info" && grep -q "^opset=ai.onnx:17 ir_version=8$" "$tmp/info" &&
        ok "nin: the metadata says resize 96x96, Fashion-MNIST's mean, pixels byte/255, 10 classes; opset 17, IR 8" ||
        bad "nin's metadata: $(tr '\n' ' ' < "$tmp/info" | cut -c1-400)"
fi

if [ -f "$tmp/op_conv/model.onnx" ]; then   # random data: its own statistics, three channels, floats as stored
    $check info "$tmp/op_conv/model.onnx" > "$tmp/info"
    grep -qE "^normalize_mean=0\.[0-9]+,0\.[0-9]+,0\.[0-9]+$" "$tmp/info" && grep -qE "^normalize_std=0\.2[0-9]+,0\.2[0-9]+,0\.2[0-9]+$" "$tmp/info" &&
        grep -q "^pixels=float32$" "$tmp/info" && grep -q "^resize=none$" "$tmp/info" && grep -q "^initializer conv.weight \[4, 3, 3, 3\]$" "$tmp/info" &&
        ok "op_conv: the metadata says three channels' mean and std (about 0.29 for uniform pixels), float32 pixels, no resize" ||
        bad "op_conv's metadata: $(tr '\n' ' ' < "$tmp/info" | cut -c1-400)"
fi

# every forward op (one gradients flow through) but the loss is in some net checked above
missing=$("$MGC" --list-ops | awk '$3 == "grad" && $1 != "softmax_cross_entropy" { print $1 }' | while read -r op; do
    grep -qx "$op" "$tmp/ops-checked" || echo "$op"; done | tr '\n' ' ')
[ -z "$missing" ] && ok "every forward op of mgc --list-ops is in a net exported here ($(sort -u "$tmp/ops-checked" | wc -l) ops)" ||
    bad "forward ops in no net exported here: $missing(add an op net to tests/nets/)"

# errors: a checkpoint without a tensor, a tensor of another shape, a file that cannot be written
d=$tmp/op_conv
if [ -f "$d/ck.safetensors" ]; then
    $check merge "$d/ck.safetensors" - "$tmp/lacking.safetensors" --drop conv.bias
    expect missing-tensor 1 "the checkpoint has no tensor 'conv.bias' (of the conv2d at tests/nets/op_conv.net:" -- \
        export "$tmp/lacking.safetensors" --out "$tmp/lacking.onnx"
    $check merge "$d/ck.safetensors" - "$tmp/narrow.safetensors" --narrow conv.weight
    expect tensor-shape 1 "the checkpoint's 'conv.weight' is [3,3,3,3], the net's [4,3,3,3] (the conv2d at tests/nets/op_conv.net:4:23)" -- export "$tmp/narrow.safetensors" --out "$tmp/narrow.onnx"
    [ ! -e "$tmp/lacking.onnx" ] && [ ! -e "$tmp/narrow.onnx" ] && ok "a refused export leaves no file" || bad "a refused export left a file"
    # a checkpoint that cannot be read: said, status 1 (mgc export and predict freed a model never read: a crash)
    expect unreadable 1 "mgc: cannot read the checkpoint: $tmp/none.safetensors: cannot open" -- export "$tmp/none.safetensors" --out "$tmp/m.onnx"
    expect unreadable-predict 1 "mgc: cannot read the checkpoint: $tmp/none.safetensors: cannot open" -- \
        predict "$tmp/none.safetensors" "$d/x.safetensors" --out "$tmp/p.safetensors"
    expect unwritable 1 "cannot write $tmp/none/m.onnx (its temporary file $tmp/none/m.onnx.tmp): No such file or directory" -- \
        export "$d/ck.safetensors" --out "$tmp/none/m.onnx"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
