#!/usr/bin/env bash
# After training (issue 36): a checkpoint holds its model, and mgc evaluate,
# mgc predict and mgc NET --evaluate --load use it alone.
#   - a normalised run's checkpoint is evaluated with its own mean and std,
#     without a flag, at the run's accuracy; predict's predictions have it too
#   - predict's logits are the evaluation program's, bit for bit (against
#     check mode's eval_logits, for LeNet, a BatchNorm net and every op net)
#   - the outputs: .safetensors, .csv, .jsonl; one file of images without labels
#   - the checkpoint alone: the .net file gone, --set values kept
#   - bad input: no metadata (--net then), a truncated file, data of the wrong
#     shape, a command line that contradicts the checkpoint
# Needs $MGC_DATA for the Fashion-MNIST cases. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup predict
export XDG_CACHE_HOME="$tmp/cache"
PY=/usr/bin/python3
L=nets/lenet.net
st() { $PY -c "import sys; sys.path.insert(0, 'tests'); import st, torch, math, json; $1" "${@:2}"; }

# ------------------------------------------------------------ a normalised run, evaluated alone
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    "$MGC" $L --epochs 1 --limit-train 6000 --normalize --save "$tmp/ck.st" > "$tmp/run" 2>&1
    run_acc=$(sed -n 's/.*test acc \([0-9.]*\) .*/\1/p' "$tmp/run" | tail -1)
    if [ -z "$run_acc" ]; then
        bad "no run to evaluate: $(tail -2 "$tmp/run")"
    else
        near() { $PY -c "import sys; sys.exit(0 if abs(float('$1') - float('$2')) < 0.00051 else 1)"; }
        expect evaluate 0 "test acc" -- evaluate "$tmp/ck.st" "$MGC_DATA"
        ev=$(sed -n 's/^test acc \([0-9.]*\) .*/\1/p' "$tmp/out")
        near "$ev" "$run_acc" && ok "mgc evaluate: $ev, the run's $run_acc, with the checkpoint's mean and std and no flag" ||
            bad "mgc evaluate: $ev, the run said $run_acc"
        expect evaluate-alias 0 "test acc" -- $L --evaluate --load "$tmp/ck.st"
        ev2=$(sed -n 's/^test acc \([0-9.]*\) .*/\1/p' "$tmp/out")
        [ "$ev2" = "$ev" ] && grep -q "normalize (mean 0.2860 std 0.3530)" "$tmp/out" &&
            ok "mgc NET --evaluate --load, without --normalize: $ev2, the checkpoint's transform" || bad "evaluate-alias: $ev2 against $ev"
        # predict: the test set's logits, its predictions at the run's accuracy, the labels as published
        expect predict 0 "predicted 10,000 test examples" -- predict "$tmp/ck.st" "$MGC_DATA" --out "$tmp/p.safetensors"
        out=$(st "
import gzip
t = st.load(sys.argv[1])
raw = gzip.open(sys.argv[2] + '/t10k-labels-idx1-ubyte.gz').read()[8:]
labels = torch.tensor(list(raw), dtype=torch.int64)
assert t['logits'].shape == (10000, 10) and t['pred'].dtype == torch.int64, 'shapes'
assert torch.equal(t['pred'], t['logits'].argmax(1)), 'pred is not the argmax'
assert torch.equal(t['labels'], labels), 'labels are not the published ones'
assert int(t['confusion'].sum()) == 10000 and torch.equal(t['confusion'].sum(1), torch.bincount(labels, minlength=10)), 'confusion'
print('%.4f' % float((t['pred'] == labels).double().mean()))" "$tmp/p.safetensors" "$MGC_DATA" 2>&1)
        [ "$out" = "$ev" ] && grep -q "^accuracy $ev (" "$tmp/out" &&
            ok "mgc predict: pred the logits' argmax, the published labels, accuracy $out = mgc evaluate's, confusion by label" ||
            bad "predict: $out (evaluate $ev); $(grep accuracy "$tmp/out")"
        # the same predictions on two devices with an odd batch (shards of the batch put back in order)
        expect predict-cpu2 0 "predicted" -- predict "$tmp/ck.st" "$MGC_DATA" --out "$tmp/p2.safetensors" --devices cpu:2 --batch-size 37
        out=$(st "
a, b = st.load(sys.argv[1]), st.load(sys.argv[2])
d = float((a['logits'] - b['logits']).abs().max())
assert torch.equal(a['pred'], b['pred']) and d < 1e-5, d
print('%.1e' % d)" "$tmp/p.safetensors" "$tmp/p2.safetensors" 2>&1) &&
            ok "predict on cpu:2, batch 37 = cpu:1, batch 256: the same predictions, logits within $out (the GEMMs' blocking)" ||
            bad "predict-cpu2: $out"
        # rows: csv and jsonl, each example's probabilities
        expect predict-csv 0 "predicted 100 test examples" -- predict "$tmp/ck.st" "$MGC_DATA" --out "$tmp/p.csv" --limit-test 100
        expect predict-jsonl 0 "predicted 100 test examples" -- predict "$tmp/ck.st" "$MGC_DATA" --out "$tmp/p.jsonl" --limit-test 100
        out=$(st "
import csv
t = st.load(sys.argv[1])
rows = list(csv.DictReader(open(sys.argv[2])))
lines = [json.loads(l) for l in open(sys.argv[3])]
assert len(rows) == len(lines) == 100, (len(rows), len(lines))
p = torch.softmax(t['logits'][:100].double(), 1)
for i, (r, j) in enumerate(zip(rows, lines)):
    assert int(r['index']) == j['index'] == i and int(r['pred']) == j['pred'] == int(t['pred'][i])
    assert int(r['label']) == j['label'] == int(t['labels'][i])
    probs = [float(r['p%d' % k]) for k in range(10)]
    assert max(abs(a - b) for a, b in zip(probs, j['probs'])) == 0 and abs(sum(probs) - 1) < 1e-5
    assert max(abs(a - float(b)) for a, b in zip(probs, p[i])) < 1e-6
print('ok')" "$tmp/p.safetensors" "$tmp/p.csv" "$tmp/p.jsonl" 2>&1)
        [ "$out" = ok ] && ok "predict's .csv and .jsonl: a row an example, the prediction, the label, softmax's probabilities" ||
            bad "predict rows: $out"
        # --split train
        expect predict-train 0 "predicted 60,000 training examples" -- predict "$tmp/ck.st" "$MGC_DATA" --split train --out "$tmp/pt.safetensors"
        expect evaluate-train 0 "train acc" -- evaluate "$tmp/ck.st" "$MGC_DATA" --split train
        # one file of images, no labels: predictions and no accuracy; evaluate needs labels
        st "t = st.load(sys.argv[1]); torch.manual_seed(1); st.save({'images': (torch.rand(5, 28, 28) * 255).to(torch.uint8)}, sys.argv[2])" \
            "$tmp/p.safetensors" "$tmp/five.safetensors"
        expect predict-file 0 "predicted 5 test examples" -- predict "$tmp/ck.st" "$tmp/five.safetensors" --out "$tmp/five-p.safetensors"
        ! grep -q accuracy "$tmp/out" && st "t = st.load(sys.argv[1]); assert set(t) == {'logits', 'pred'}, set(t)" "$tmp/five-p.safetensors" &&
            ok "predict on a file of images alone: logits and predictions, no accuracy, no labels" || bad "predict-file: $(cat "$tmp/out")"
        expect evaluate-unlabelled 1 "has no \`labels\`" -- evaluate "$tmp/ck.st" "$tmp/five.safetensors"
        # the contradictions
        expect contradict-resize 2 "was trained on images with normalize (mean 0.286 std 0.353), not --resize 32x32" -- evaluate "$tmp/ck.st" --resize 32
        expect contradict-net 2 "holds its net" -- predict "$tmp/ck.st" --net $L --out "$tmp/x.csv"
        expect contradict-set 2 "--set goes with --net NET.net" -- predict "$tmp/ck.st" --set classes=12 --out "$tmp/x.csv"
        expect normalize-same 0 "test acc" -- evaluate "$tmp/ck.st" --normalize
    fi
else
    echo "skip the Fashion-MNIST cases: no \$MGC_DATA"
fi

# ------------------------------------------------------------ the checkpoint alone
# the .net file gone after training, a --set value: the checkpoint has both
cp $L "$tmp/gone.net"
"$MGC" "$tmp/gone.net" --set classes=12 --epochs 0 --save "$tmp/gone.st" > /dev/null 2>&1
rm "$tmp/gone.net"
st "torch.manual_seed(2); st.save({'images': torch.rand(3, 1, 28, 28)}, sys.argv[1])" "$tmp/three.safetensors"
expect alone 0 "predicted 3 test examples" -- predict "$tmp/gone.st" "$tmp/three.safetensors" --out "$tmp/alone.safetensors"
st "t = st.load(sys.argv[1]); assert t['logits'].shape == (3, 12), t['logits'].shape" "$tmp/alone.safetensors" &&
    ok "the .net file removed after training, --set classes=12: predict builds the net from the checkpoint (12 logits)" ||
    bad "alone: $(head -3 "$tmp/out")"
st "m = st.load_metadata(sys.argv[1]); assert m['set'] == 'classes=12\n' and m['net_file'].endswith('gone.net') and 'net lenet' in m['net_source'] and m['input'] == '1x28x28' and m['classes'] == '12' and m['precision'] == 'fp32' and m['mgc_version'], m" "$tmp/gone.st" &&
    ok "the checkpoint's metadata: the net's text and file, --set, input, classes, precision, version" || bad "metadata: $(st "print(st.load_metadata(sys.argv[1]))" "$tmp/gone.st" | head -c 300)"

# the classes' names where the data has them: CIFAR-10's batches.meta.txt, into the checkpoint and
# predict's rows
$PY -c "
import os, sys, random
d = os.path.join(sys.argv[1], 'cifar', 'cifar-10-batches-bin'); os.makedirs(d)
random.seed(4)
for k, name in enumerate(['data_batch_%d' % i for i in range(1, 6)] + ['test_batch']):
    open(os.path.join(d, name + '.bin'), 'wb').write(b''.join(bytes([i % 10]) + bytes(random.randrange(256) for _ in range(3072)) for i in range(20)))
open(os.path.join(d, 'batches.meta.txt'), 'w').write('airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n')" "$tmp"
"$MGC" $L --set in_channels=3 --resize 28 --epochs 1 --data "$tmp/cifar" --save "$tmp/cifar.st" > "$tmp/cifar.out" 2>&1
expect names-predict 0 "classes: 0 airplane, 1 automobile, 2 bird" -- predict "$tmp/cifar.st" "$tmp/cifar" --out "$tmp/names.csv"
"$MGC" predict "$tmp/cifar.st" "$tmp/cifar" --out "$tmp/names.jsonl" > /dev/null 2>&1
out=$(st "
import csv
names = 'airplane automobile bird cat deer dog frog horse ship truck'.split()
assert st.load_metadata(sys.argv[1])['class_names'] == '\n'.join(names) + '\n'
rows = list(csv.DictReader(open(sys.argv[2]))); lines = [json.loads(l) for l in open(sys.argv[3])]
assert len(rows) == len(lines) == 20
assert all(r['pred_name'] == names[int(r['pred'])] == j['pred_name'] for r, j in zip(rows, lines))
print('ok')" "$tmp/cifar.st" "$tmp/names.csv" "$tmp/names.jsonl" 2>&1)
[ "$out" = ok ] && ok "CIFAR-10's class names (batches.meta.txt) kept in the checkpoint and given with each prediction" ||
    bad "class names: $out; $(tail -2 "$tmp/cifar.out")"

# ------------------------------------------------------------ predict = the evaluation program, bit for bit
# check mode's eval_logits are the evaluation program's on a batch after a step (--lr 0: the
# parameters stay; BatchNorm's running statistics move), and its --save is that state with the
# model's metadata: predicted on the same images, the same bits
# (One Python process makes every batch and one compares every pair: torch's import is
# 1.6 s, twice a net.)
nets=("lenet:$L" "bn_lenet:nets/bn_lenet.net")
for net in tests/nets/op_*.net; do nets+=("$(basename "$net" .net):$net"); done
ops=$((${#nets[@]} - 2))
: > "$tmp/shapes"
for item in "${nets[@]}"; do   # name c,h,w classes: the input's shape and the logits' width
    name=${item%%:*} net=${item#*:}
    "$MGC" "$net" --emit eval-ir > "$tmp/eir" 2> /dev/null
    shape=$(sed -n 's/^%0 *= input *\[N,\([0-9,]*\)\].*/\1/p' "$tmp/eir")
    logits=$(grep ' softmax_cross_entropy ' "$tmp/eir" | sed -n 's/.*%\([0-9]*\) %[0-9]* .*/\1/p')
    classes=$(sed -n "s/^%$logits *=.*\[N,\([0-9]*\)\].*/\1/p" "$tmp/eir")
    echo "$name ${shape:-?} ${classes:-?}" >> "$tmp/shapes"
done
st "
for line in open(sys.argv[1]):
    name, shape, classes = line.split()
    if '?' in (shape, classes): continue
    dims = [int(d) for d in shape.split(',')]   # [C, H, W], or [T, F]
    torch.manual_seed(3); st.save({'x': torch.rand(7, *dims), 'y': torch.randint(0, int(classes), (7,))}, sys.argv[2] + name + '.batch.st')
    st.save({'images': st.load(sys.argv[2] + name + '.batch.st')['x']}, sys.argv[2] + name + '.imgs.safetensors')" "$tmp/shapes" "$tmp/" ||
    bad "no batches for the op nets"
: > "$tmp/pairs"
for item in "${nets[@]}"; do
    name=${item%%:*} net=${item#*:}
    [ -f "$tmp/$name.batch.st" ] || { bad "$name: no batch for its input ($(grep "^$name " "$tmp/shapes"))"; continue; }
    "$MGC" "$net" --check-batch "$tmp/$name.batch.st" --steps 1 --lr 0 --dump "$tmp/$name.dump.st" --save "$tmp/$name.b1.st" > "$tmp/cm" 2>&1 ||
        { bad "$name: check mode: $(tail -1 "$tmp/cm")"; continue; }
    "$MGC" predict "$tmp/$name.b1.st" "$tmp/$name.imgs.safetensors" --out "$tmp/$name.bp.safetensors" --batch-size 7 > "$tmp/bp" 2>&1 ||
        { bad "$name: predict: $(tail -1 "$tmp/bp")"; continue; }
    echo "$name" >> "$tmp/pairs"
done
differ=$(st "
for name in open(sys.argv[1]).read().split():
    a = st.load(sys.argv[2] + name + '.bp.safetensors')['logits']
    b = st.load(sys.argv[2] + name + '.dump.st')['eval_logits']
    if not torch.equal(a, b): print(name)" "$tmp/pairs" "$tmp/") || bad "comparing predict's logits: $differ"
same=$(( $(wc -w < "$tmp/pairs") - $(echo $differ | wc -w) ))
for name in $differ; do bad "$name: predict's logits differ from check mode's eval_logits"; done
[ $same -eq $((ops + 2)) ] && ok "predict's logits = the evaluation program's (check mode's eval_logits), bit for bit: LeNet, BatchNorm-LeNet, $ops op nets"

# ------------------------------------------------------------ bad input
# a checkpoint without metadata (an older mgc's): --net then, and its --set values
st "st.save(st.load(sys.argv[1]), sys.argv[2])" "$tmp/gone.st" "$tmp/bare.st"
expect bare 1 "does not hold its net (a checkpoint of an older mgc, or not mgc's): give it with --net NET.net" -- predict "$tmp/bare.st" "$tmp/three.safetensors" --out "$tmp/x.csv"
expect bare-net 0 "predicted 3 test examples" -- predict "$tmp/bare.st" "$tmp/three.safetensors" --net $L --set classes=12 --out "$tmp/x.csv"
expect bare-net-wrong 1 "tensor 'fc3.weight' has shape [12,84] but the net needs [10,84]" -- predict "$tmp/bare.st" "$tmp/three.safetensors" --net $L --out "$tmp/x.csv"
head -c 3000 "$tmp/gone.st" > "$tmp/cut.st"
expect truncated 1 "cannot read the checkpoint" -- predict "$tmp/cut.st" "$tmp/three.safetensors" --out "$tmp/x.csv"
expect no-file 1 "cannot read the checkpoint" -- evaluate "$tmp/none.st" "$tmp/three.safetensors"
st "m = st.load_metadata(sys.argv[1]); m['input'] = '1x28'; st.save(st.load(sys.argv[1]), sys.argv[2], m)" "$tmp/gone.st" "$tmp/meta.st"
expect bad-metadata 1 "the checkpoint's metadata 'input' is '1x28', which mgc --save never writes" -- evaluate "$tmp/meta.st" "$tmp/three.safetensors"
st "st.save({'images': torch.rand(2, 3, 32, 32)}, sys.argv[1])" "$tmp/cifar.safetensors"
expect wrong-shape 1 "takes images [N,1,28,28], but $tmp/cifar.safetensors holds safetensors images [N,3,32,32]: give images of the net's shape" -- predict "$tmp/gone.st" "$tmp/cifar.safetensors" --out "$tmp/x.csv"
expect data-file-missing 1 "the data file '$tmp/nothing.safetensors' does not exist" -- predict "$tmp/gone.st" "$tmp/nothing.safetensors" --out "$tmp/x.csv"
echo "not a data set" > "$tmp/data.txt"
expect data-not-safetensors 1 "is a file: give a directory as --data takes" -- predict "$tmp/gone.st" "$tmp/data.txt" --out "$tmp/x.csv"
expect out-format 2 "mgc predict writes FILE.safetensors, FILE.csv or FILE.jsonl" -- predict "$tmp/gone.st" --out "$tmp/x.txt"
expect out-missing-dir 2 "--out $tmp/nowhere/p.csv: the directory $tmp/nowhere does not exist" -- predict "$tmp/gone.st" "$tmp/three.safetensors" --out "$tmp/nowhere/p.csv"
expect no-out 2 "mgc predict needs --out FILE" -- predict "$tmp/gone.st" "$tmp/three.safetensors"
expect no-checkpoint 2 "no checkpoint given: mgc evaluate CK.safetensors DATA" -- evaluate
expect training-option 2 "--epochs is for training (mgc NET.net ...), not for mgc predict" -- predict "$tmp/gone.st" --epochs 3 --out "$tmp/x.csv"
expect predict-option 2 "--out is mgc predict's" -- $L --out "$tmp/x.csv"
expect split-bad 2 "--split expects test or train, got 'dev'" -- predict "$tmp/gone.st" --split dev --out "$tmp/x.csv"
expect export-no-format 2 "say what to export there with --format c|cuda|onnx|pytorch" -- export "$tmp/gone.st" --out "$tmp/dir"
expect two-data 2 "one checkpoint and one data set" -- predict "$tmp/gone.st" a b --out "$tmp/x.csv"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
