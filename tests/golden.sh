#!/usr/bin/env bash
# Golden files: what the compiler prints for each net in nets/, at each stage;
# and docs/language.md's layer table against the layer table.
#   bash tests/golden.sh            compare (prints "N passed, M failed")
#   bash tests/golden.sh --update   rewrite tests/golden/ after an intended change (make golden)
# A refactor should show a zero diff here.
set -u
cd "$(dirname "$0")/.."
MGC=${MGC:-./mgc}
update=0
[ "${1:-}" = "--update" ] && update=1
mkdir -p tests/golden
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # name, then the mgc arguments
    local name=$1; shift
    if ! MGC_CONV= "$MGC" "$@" > "$tmp/out" 2> "$tmp/err"; then
        echo "FAIL golden $name: mgc $* exited non-zero"; sed 's/^/    /' "$tmp/err" | head -5
        fail=$((fail + 1)); return
    fi
    if [ $update = 1 ]; then
        cp "$tmp/out" "tests/golden/$name"; pass=$((pass + 1)); return
    fi
    if diff -u "tests/golden/$name" "$tmp/out" > "$tmp/diff" 2>&1; then
        pass=$((pass + 1))
    else
        echo "FAIL golden $name differs (make golden rewrites it if the change is intended):"
        head -20 "$tmp/diff" | sed 's/^/    /'
        fail=$((fail + 1))
    fi
}
for net in nets/*.net; do
    base=$(basename "$net" .net)
    check "$base.ir" "$net" --emit ir
    check "$base.eval-ir" "$net" --emit eval-ir
    check "$base.grad" "$net" --emit grad --momentum 0.9 --weight-decay 5e-4
    # the generated kernels of the large zoo nets (0.3-0.8 MB each) are not
    # kept: their kernels are the op nets' and ResNet-18's forms at other
    # sizes; tests/nvrtc.sh checks that they print and compile
    case " densenet googlenet mobilenetv2 resnext se_resnet " in
        *" $base "*) ;;
        *) check "$base.kernels" "$net" --emit kernels ;;
    esac
done
check lenet.cuda nets/lenet.net --emit cuda
# the inference rewrite (mgc export's graph): BatchNorm folded into convolutions and linear layers,
# layers without bias and depthwise ones
check bn_lenet.infer-ir nets/bn_lenet.net --emit infer-ir
check mobilenetv2.infer-ir nets/mobilenetv2.net --emit infer-ir
check resnet18-small-stem.ir nets/resnet18.net --emit ir --set small_stem=true
# data parallelism: the plan on two devices; small buckets on three; --sync-bn's graph
check lenet-cpu2.dp nets/lenet.net --emit dp --devices cpu:2
check resnet18-cpu2.kernels nets/resnet18.net --emit kernels --devices cpu:2 --momentum 0.9   # the SGD fused per bucket
check lenet-cpu3-buckets.dp nets/lenet.net --emit dp --devices cpu:3 --bucket-mb 0.05 --batch-size 100
check small-resnet-syncbn.grad tests/nets/small_resnet.net --emit grad --devices cpu:2 --sync-bn
# docs/language.md's layer table is the layer table (frontend/layers.c), as
# mgc --list-layers prints it: the docs cannot drift from what mgc checks
doc=docs/language.md
awk '/^\| layer \| arguments \| checks \|$/ { t = 1 } t && !/^\|/ { exit } t' "$doc" > "$tmp/doc-table"
"$MGC" --list-layers > "$tmp/layers"
if [ $update = 1 ]; then
    awk -v tbl="$tmp/layers" '/^\| layer \| arguments \| checks \|$/ { while ((getline l < tbl) > 0) print l; skip = 1; next }
        skip && /^\|/ { next } { skip = 0; print }' "$doc" > "$tmp/doc" && cp "$tmp/doc" "$doc"
    pass=$((pass + 1))
elif diff -u "$tmp/doc-table" "$tmp/layers" > "$tmp/diff"; then
    pass=$((pass + 1))
else
    echo "FAIL golden $doc's layer table is not mgc --list-layers (make golden rewrites it):"
    head -20 "$tmp/diff" | sed 's/^/    /'
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
