#!/usr/bin/env bash
# The examples in examples/ run, quickly (EPOCHS=1 and few examples), and say
# what they promise. Needs $MGC_DATA. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export EPOCHS=1 LIMIT=1024 LINES_EACH=3
# the examples' own default: the data beside the checkout
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
if [ ! -d "$MGC_DATA" ]; then
    echo "skip: no data at $MGC_DATA (set MGC_DATA): no examples run"
    echo "0 passed, 0 failed"
    exit 0
fi

run() {  # NAME TEXT COMMAND...: the command succeeds and prints TEXT
    local name=$1 text=$2; shift 2
    if ! timeout 300 "$@" > "$tmp/out" 2>&1; then
        echo "FAIL examples $name: exit $? ($*)"; tail -5 "$tmp/out" | sed 's/^/    /'; fail=$((fail + 1))
    elif ! grep -qF -- "$text" "$tmp/out"; then
        echo "FAIL examples $name: output lacks '$text'"; tail -5 "$tmp/out" | sed 's/^/    /'; fail=$((fail + 1))
    else
        echo "ok   $name: $(grep -F -- "$text" "$tmp/out" | tail -1 | cut -c1-120)"; pass=$((pass + 1))
    fi
}
run two_cpu_devices "on [cpu:0, cpu:1]" bash examples/two_cpu_devices.sh
grep -q "BatchNorm synchronised" "$tmp/out" && pass=$((pass + 1)) || { echo "FAIL examples: no --sync-bn run"; fail=$((fail + 1)); }
run mpirun "identical, bit for bit" bash examples/mpirun.sh
run inspect "kernel k0_" bash examples/inspect.sh
# the exports: ONNX Runtime's and PyTorch's predictions are mgc predict's
if [ -x .venv/bin/python ] && .venv/bin/python -c "import onnxruntime" 2> /dev/null; then
    run export_onnx "the same predictions as mgc predict: 1000 of 1000" bash examples/export_onnx.sh
else
    echo "skip export_onnx: no onnxruntime in .venv (bash .ci/setup makes it)"
fi
run export_pytorch "the same predictions as mgc predict: 1000 of 1000" bash examples/export_pytorch.sh
run export_c "the same predictions as mgc predict: 1000 of 1000" bash examples/export_c.sh
# predict: the checkpoint's accuracy by evaluate and by predict's predictions, the same
run predict "index,pred,label" bash examples/predict.sh
ev=$(sed -n 's/^test acc \([0-9.]*\) .*/\1/p' "$tmp/out") pr=$(sed -n 's/^accuracy \([0-9.]*\) .*/\1/p' "$tmp/out")
[ -n "$ev" ] && [ "$ev" = "$pr" ] && { echo "ok   predict: mgc evaluate's $ev = mgc predict's"; pass=$((pass + 1)); } ||
    { echo "FAIL examples predict: evaluate '$ev', predict '$pr'"; fail=$((fail + 1)); }
./mgc nets/lenet.net --epochs 2 --limit-train 8192 --lr-schedule constant --save "$tmp/l.safetensors" > "$tmp/mgc.txt" 2>&1
acc=$(sed -n 's/.*test acc \([0-9.]*\).*/\1/p' "$tmp/mgc.txt" | tail -1)
run load_in_pytorch "10 tensors loaded into PyTorch" /usr/bin/python3 examples/load_in_pytorch.py "$tmp/l.safetensors"
# the same weights and test set in PyTorch: the same accuracy (3 decimals printed by mgc)
tacc=$(sed -n "s/.*PyTorch's test accuracy \([0-9.]*\).*/\1/p" "$tmp/out")
if [ -n "$acc" ] && [ -n "$tacc" ] && awk -v a="$acc" -v b="$tacc" 'BEGIN { d = a - b; exit !(d < 0.0006 && d > -0.0006 && b > 0.3) }'; then
    echo "ok   load_in_pytorch: PyTorch's accuracy $tacc is mgc's $acc"; pass=$((pass + 1))
else
    echo "FAIL examples load_in_pytorch: PyTorch's accuracy '$tacc', mgc's '$acc'"; fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
