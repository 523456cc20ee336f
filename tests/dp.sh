#!/usr/bin/env bash
# Data parallelism end to end: the command line's device errors; k replicas
# against one on the same global batches (LeNet a few hundred steps with an
# uneven last batch on cpu:1/2/3; ResNet-18 with --sync-bn on cpu:1/2,
# running statistics included); mpirun -np 2 against one process; a failing
# rank stops every rank. Needs $MGC_DATA. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
MGC=${MGC:-./mgc}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
SUITE=dp
. tests/lib.sh
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$tmp/cache}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

L=nets/lenet.net
expect cpu0 2 "no devices to train on; use cpu:1 or more" -- $L --devices cpu:0
expect cpux 2 "expected the number of CPU devices after 'cpu:'" -- $L --devices cpu:x
expect cpu-minus 2 "expected the number of CPU devices after 'cpu:'" -- $L --devices cpu:-2
expect too-many 2 "at most 64 CPU devices in one process" -- $L --devices cpu:65
expect batch-small 2 "--batch-size 2 is smaller than the 3 devices" -- $L --batch-size 2 --devices cpu:3
expect bucket-zero 2 "--bucket-mb must be more than 0" -- $L --bucket-mb 0
expect bucket-word 2 "--bucket-mb expects a number of megabytes" -- $L --bucket-mb big
if ! ldconfig -p 2> /dev/null | grep -q "libcuda.so.1 "; then   # no GPU driver here (CI): GPUs are refused at once
    expect cuda 2 "train on CPU devices with --devices cpu:1" -- $L --devices cuda:0
    expect gpus 2 "train on CPU devices with --devices cpu:2" -- $L --gpus 2
    expect gpus-same 2 "train on CPU devices with --devices cpu:2" -- $L --devices cuda:0,cuda:0
fi
expect cuda-bad 2 "'cuda:x' is not a GPU; write cuda:K" -- $L --devices cuda:0,cuda:x
expect gpus-zero 2 "--gpus must be in 1..64, got 0" -- $L --gpus 0
expect gpus-and-devices 2 "--gpus and --devices both say where to train: give one" -- $L --gpus 2 --devices cpu:2
expect sync-value 2 "--sync-bn takes no value" -- $L --sync-bn=yes

if [ -z "${MGC_DATA:-}" ]; then
    echo "skip: MGC_DATA is not set: no training runs"
    echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; exit
fi

# Two checkpoints: the largest, over tensors, of max|a - b| / max(max|b|, FLOOR)
# (running statistics included). FLOOR 0: plain relative differences.
compare() {  # A B TOL FLOOR WHAT
    if out=$($PY tests/st.py compare "$1" "$2" "$3" "$4"); then ok "$5: $out"; else bad "$5: $out (tolerance $3)"; fi
}

train() {  # OUT ARGS...: one run that must succeed
    local out=$1; shift
    if ! timeout 600 "$@" --save "$out" > "$tmp/log" 2>&1; then
        bad "run failed: $*"; tail -5 "$tmp/log" | sed 's/^/    /'; return 1
    fi
}

# LeNet: 200 steps of 64 and a last batch of 32 (11 + 11 + 10 on cpu:3). The
# learning rate is small enough that training does not amplify rounding: at
# lr 0.05 two runs on ONE device whose convolutions sum in another order (as
# MGC_CONV=gemm does) are 2e-2 apart after 200 steps; at 0.01, 3e-7 (and
# 2e-5 after 312). So this measures what data parallelism changes, the order
# of float sums (about 6e-8 here).
LA="--epochs 1 --limit-train 12832 --limit-test 256 --batch-size 64 --lr 0.01 --seed 7"
train "$tmp/l1.st" "$MGC" $L $LA --devices cpu:1 &&
train "$tmp/l2.st" "$MGC" $L $LA --devices cpu:2 &&
train "$tmp/l3.st" "$MGC" $L $LA --devices cpu:3 && {
    compare "$tmp/l2.st" "$tmp/l1.st" 1e-4 0 "LeNet 201 steps: cpu:2 = cpu:1"
    compare "$tmp/l3.st" "$tmp/l1.st" 1e-4 0 "LeNet 201 steps: cpu:3 = cpu:1"
}
# --augment's draws follow each example's index, not its replica: with them
# cpu:2 is cpu:1 as closely (another image on one replica would be far off)
AUG="--augment crop:4,flip,crop-resize:0.7,rotate:10,translate:0.1,erase:0.3 --normalize"
train "$tmp/la1.st" "$MGC" $L $LA $AUG --devices cpu:1 &&
    train "$tmp/la2.st" "$MGC" $L $LA $AUG --devices cpu:2 &&
    compare "$tmp/la2.st" "$tmp/la1.st" 1e-4 0 "LeNet 201 steps --augment (every kind) --normalize: cpu:2 = cpu:1"
grep -q "communication per step" "$tmp/log" && ok "cpu:3 prints the communication report" || bad "no communication report on cpu:3"
# --precision bf16: k devices are one device as closely (9e-8 apart), and the run is
# not fp32's (1e-3 apart: the GEMMs' operands were rounded on the replicas too)
train "$tmp/lb1.st" "$MGC" $L $LA --precision bf16 --devices cpu:1 &&
    train "$tmp/lb3.st" "$MGC" $L $LA --precision bf16 --devices cpu:3 && {
    compare "$tmp/lb3.st" "$tmp/lb1.st" 1e-4 0 "LeNet 201 steps --precision bf16: cpu:3 = cpu:1"
    if [ -f "$tmp/l1.st" ] && out=$($PY tests/st.py compare "$tmp/lb1.st" "$tmp/l1.st" 1e-4 0); then
        bad "LeNet 201 steps --precision bf16 is fp32's run: $out"
    else
        ok "LeNet 201 steps --precision bf16 is not fp32's (more than 1e-4 apart)"
    fi
}

# CPU devices that keep their memory apart from the host's (MGC_CPU_OWN_MEMORY=1)
# take the paths a GPU takes: parameters uploaded after initialising, staged
# input, labels, votes and SGD scalars (the default cosine: a new rate every
# step), running statistics and checkpoints downloaded.
# Nothing else changes, so the numbers must be the same bits.
[ -f "$tmp/l2.st" ] && MGC_CPU_OWN_MEMORY=1 train "$tmp/l2own.st" "$MGC" $L $LA --devices cpu:2 &&
    compare "$tmp/l2own.st" "$tmp/l2.st" 0 0 "LeNet 201 steps on cpu:2 with device memory of their own = in host memory, bit for bit"

# ResNet-18, BatchNorm over the global batch: 2 steps of 32, running statistics
# included (about 1e-6 apart). Its 1x1 maps make the BatchNorms of stage 4
# ill-conditioned: from the third step on, the order of sums is amplified (on
# ONE device, direct against im2col convolutions: 0.15 apart after 3 steps).
RA="--epochs 1 --limit-train 64 --limit-test 32 --batch-size 32 --lr 0.01 --seed 3 --sync-bn"
R=nets/resnet18.net
train "$tmp/r1.st" "$MGC" $R $RA --devices cpu:1 &&
train "$tmp/r2.st" "$MGC" $R $RA --devices cpu:2 &&
    compare "$tmp/r2.st" "$tmp/r1.st" 1e-3 0 "ResNet-18 --sync-bn 2 steps: cpu:2 = cpu:1"

# Ctrl-C during an epoch on two devices: both stop at the same step (their
# votes are summed with the last bucket), exit 130, the checkpoint keeps the
# last finished epoch; no replica is left waiting for a sum
"$MGC" $L --devices cpu:2 --epochs 20 --momentum 0.9 --lr-schedule step:1 --lr-gamma 0.5 --save "$tmp/int.st" > "$tmp/int.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "^epoch 1/20" "$tmp/int.out" && break; sleep 0.1; done
sleep 0.3
kill -INT $pid
wait_for $pid 60
rc=$?
epoch=$($PY -c "import sys; sys.path.insert(0, 'tests'); import st; print(st.load_metadata(sys.argv[1]).get('epoch'))" "$tmp/int.st" 2>/dev/null)
during=$(sed -n 's/.*interrupted by SIGINT (Ctrl-C) during epoch \([0-9]*\).*/\1/p' "$tmp/int.out")
after=$(sed -n 's/.*interrupted by SIGINT (Ctrl-C) after epoch \([0-9]*\).*/\1/p' "$tmp/int.out")   # while it saved
[ -n "$after" ] && during=$((after + 1))
if [ $rc -eq 130 ] && [ -n "$during" ] && [ -n "$epoch" ] && [ "$epoch" -ge 1 ] && [ "$epoch" -eq $((during - 1)) ]; then
    ok "Ctrl-C on cpu:2 during epoch $during: exit 130, the checkpoint holds epoch $epoch"
else
    bad "Ctrl-C on cpu:2: exit $rc, checkpoint epoch '$epoch'"; tail -3 "$tmp/int.out" | sed 's/^/    /'
fi

# --resume goes on from that checkpoint and ends bit for bit where a run never
# interrupted ends (the epoch's shuffle, the step count, momentum buffers, the
# epoch's learning rate: halved after epoch 1)
if [ -n "$epoch" ] && [ "$epoch" -ge 1 ] 2> /dev/null; then
    to=$((epoch + 1))
    "$MGC" $L --devices cpu:2 --epochs $to --momentum 0.9 --lr-schedule step:1 --lr-gamma 0.5 --save "$tmp/int.st" --resume "$tmp/int.st" > "$tmp/res.out" 2>&1 &&
        "$MGC" $L --devices cpu:2 --epochs $to --momentum 0.9 --lr-schedule step:1 --lr-gamma 0.5 --save "$tmp/whole.st" > /dev/null 2>&1 &&
        grep -q "going on from $tmp/int.st after epoch $epoch" "$tmp/res.out" && grep -q "^epoch $to/$to" "$tmp/res.out"
    if [ $? -eq 0 ] && cmp -s "$tmp/int.st" "$tmp/whole.st"; then
        ok "--resume after Ctrl-C: epoch $to on from epoch $epoch = $to epochs never stopped, bit for bit"
    else
        bad "--resume after Ctrl-C: the checkpoints differ, or it failed"; tail -3 "$tmp/res.out" | sed 's/^/    /'
    fi
fi

# AdamW's state (both moments, and the step count in its bias corrections)
# is in the checkpoint: one epoch, then --resume to two = two epochs at once
AW="--devices cpu:2 --optimizer adamw --lr 0.002 --lr-schedule constant --betas 0.8,0.99 --limit-train 2048 --limit-test 256 --seed 5"
train "$tmp/aw1.st" "$MGC" $L $AW --epochs 1 &&
    train "$tmp/aw2.st" "$MGC" $L $AW --epochs 2 &&
    if "$MGC" $L $AW --epochs 2 --resume "$tmp/aw1.st" > "$tmp/aw.out" 2>&1 && cmp -s "$tmp/aw1.st" "$tmp/aw2.st"; then
        ok "AdamW --resume: epoch 1, then epoch 2 from its checkpoint = 2 epochs at once, bit for bit"
    else
        bad "AdamW --resume: the checkpoints differ, or it failed"; tail -3 "$tmp/aw.out" | sed 's/^/    /'
    fi

# a diverging loss on two devices: both stop at the same step, exit 1, no hang
expect diverge 1 "training diverged; try a smaller --lr" -- $L --devices cpu:2 --epochs 2 --lr 1e6 --limit-train 20000

# --log carries the communication report
if timeout 300 "$MGC" $L --epochs 1 --limit-train 2048 --limit-test 256 --devices cpu:2 --log "$tmp/log.jsonl" > /dev/null 2>&1 &&
   $PY -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); c=r['comm']; sys.exit(not (r['replicas']==2 and c['steps']==8 and c['bytes_per_step']>0 and abs(c['bytes_per_step']-c['ring_bound_per_step'])<=8))" "$tmp/log.jsonl"; then
    ok "--log: replicas, steps and bytes against the ring bound"
else
    bad "--log lacks a sound communication report: $(head -c 400 "$tmp/log.jsonl" 2>/dev/null)"
fi

# The fused SGD update of a bucket (codegen/fuse.c: one kernel per group of a
# bucket's parameters) gives the numbers of one kernel per parameter, bit for bit:
# small ResNet on cpu:2 with momentum and weight decay, fused and unfused
$PY -c "
import sys, torch; sys.path.insert(0, 'tests'); import st
g = torch.Generator().manual_seed(7)
st.save({'x': torch.randn(8, 1, 12, 12, generator=g), 'y': torch.randint(0, 10, (8,), generator=g)}, sys.argv[1])" "$tmp/fb.st"
F="tests/nets/small_resnet.net --devices cpu:2 --momentum 0.9 --weight-decay 5e-4"
if "$MGC" tests/nets/small_resnet.net --epochs 0 --batch-size 8 --save "$tmp/fi.st" > "$tmp/out" 2>&1 &&
   MGC_FUSE=1 "$MGC" $F --load "$tmp/fi.st" --check-batch "$tmp/fb.st" --steps 3 --dump "$tmp/f1.st" >> "$tmp/out" 2>&1 &&
   MGC_FUSE=0 "$MGC" $F --load "$tmp/fi.st" --check-batch "$tmp/fb.st" --steps 3 --dump "$tmp/f0.st" >> "$tmp/out" 2>&1; then
    nf=$(MGC_FUSE=1 "$MGC" $F --emit kernels | grep -c "kernel k[0-9]*_sgd_bucket(")
    nu=$(MGC_FUSE=0 "$MGC" $F --emit kernels | grep -c "kernel k[0-9]*_sgd(")
    if [ "$nf" -gt 0 ] && [ "$nf" -lt "$nu" ]; then
        compare "$tmp/f1.st" "$tmp/f0.st" 0 0 "SGD fused per bucket ($nf kernels) = unfused ($nu kernels), bit for bit"
    else
        bad "fused SGD: $nf bucket kernels fused, $nu unfused"
    fi
else
    bad "fused SGD: a run failed"; tail -5 "$tmp/out" | sed 's/^/    /'
fi

# --accumulate K: K batches summed before one update are one batch K times as
# large (LeNet has no BatchNorm): SGD with Nesterov momentum on 640 examples in
# steps of 256, 256 and 128 (the last of two batches of 64), and AdamW on 512
# (two steps: AdamW's first steps move each weight by about lr whatever its
# gradient, so a gradient near 0 that rounds the other way makes a
# difference of lr, and a third step shows that as 1e-4 to 1e-2 between any
# two summation orders, cpu:2 against cpu:1 without accumulation included),
# on one, two and three replicas (a batch of 64 split 22 + 21 + 21)
expect accumulate-zero 2 "--accumulate must be in 1..1048576, got 0" -- $L --accumulate 0
expect accumulate-sync-bn 2 "--accumulate sums the gradients of several batches, --sync-bn's BatchNorm gradients are summed apart" -- $L --accumulate 2 --sync-bn
AC="--epochs 1 --limit-train 640 --limit-test 64 --lr 0.05 --seed 3"
for opt in "--momentum 0.9 --nesterov" "--optimizer adamw --lr 0.002 --limit-train 512"; do
    for d in 1 2 3; do
        train "$tmp/ab.st" "$MGC" $L $AC $opt --devices cpu:$d --batch-size 256 &&
        steps=3 && [[ $opt == *adamw* ]] && steps=2
        train "$tmp/aa.st" "$MGC" $L $AC $opt --devices cpu:$d --batch-size 64 --accumulate 4 --log "$tmp/acc$steps.jsonl" --log-every 1 &&
            compare "$tmp/aa.st" "$tmp/ab.st" 1e-5 0 "--accumulate 4 x 64 = batch 256, $steps steps, cpu:$d, ${opt%% --lr*}"
    done
done
n=$(grep -c '"step"' "$tmp/acc3.jsonl" 2> /dev/null)
[ "$n" = 3 ] && grep -q '"epoch_step": 3' "$tmp/acc3.jsonl" && ok "--accumulate: 10 batches are 3 steps in --log" ||
    bad "--accumulate: $n step records, not 3: $(head -c 300 "$tmp/acc3.jsonl")"
"$MGC" $L --accumulate 4 --emit kernels > "$tmp/k" 2>&1
grep -q "kernel k[0-9]*_accumulate" "$tmp/k" && grep -q "mode 1 (the first): acc = grads" "$tmp/k" &&
    ok "--emit kernels shows the accumulation kernel before the bucket's sum" || bad "--accumulate: no accumulation kernel in --emit kernels"

# --shard-update (ZeRO-1): each replica updates its chunk of every bucket after a
# reduce-scatter, an all-gather brings the rest: the same arithmetic on the same
# sums, so the unsharded run's numbers (optimizer state gathered into the
# checkpoint by parameter): bit for bit on cpu:2; on cpu:3 (equal chunks of
# 14,809, the last 14,808) to float rounding, as the ring adds a chunk's three
# terms starting from another replica than the allreduce's chunks do: LeNet SGD
# with Nesterov and AdamW, ResNet-18 one step with several buckets, BatchNorm,
# --sync-bn (its BatchNorm updates whole), bf16 (AdamW on cpu:2: its first step
# moves every weight by about lr whatever its gradient, so rounding a gradient
# near 0 the other way moves a weight by lr); with --accumulate
expect shard-one 2 "--shard-update shards the update across replicas, and this run has one: give --devices cpu:N" -- $L --shard-update --epochs 0
expect shard-check 2 "--shard-update applies to training; check mode" -- $L --shard-update --devices cpu:2 --check-batch x.st
SH="--epochs 1 --limit-train 512 --limit-test 64 --lr 0.05 --seed 5"
for opt in "--momentum 0.9 --nesterov" "--optimizer adamw --lr 0.002"; do
    for d in 2 3; do
        train "$tmp/su.st" "$MGC" $L $SH $opt --devices cpu:$d &&
        train "$tmp/ss.st" "$MGC" $L $SH $opt --devices cpu:$d --shard-update &&
            compare "$tmp/ss.st" "$tmp/su.st" $([ $d = 2 ] && echo 0 || { [[ $opt == *adamw* ]] && echo 1e-5 || echo 1e-6; }) 0 \
                "--shard-update = whole updates: LeNet cpu:$d ${opt%% --lr*}"
    done
done
# replicas in one memory share each bucket's parameter block (each updates its chunk in place, the
# all-gather copies nothing): a step sends the reduce-scatter's half of the allreduce's bytes; with
# MGC_SHARED_PARAMS=0 each keeps its blocks and the all-gather sends the other half; the same numbers
comm_mb() { sed -n 's/.*communication per step: \([0-9.]*\) MB sent by the busiest replica (the ring.s bound \([0-9.]*\) MB).*/\1 \2/p' "$1" | head -1; }
if timeout 300 "$MGC" $L $SH --momentum 0.9 --devices cpu:2 --save "$tmp/u.st" > "$tmp/lu" 2>&1 &&
        timeout 300 "$MGC" $L $SH --momentum 0.9 --devices cpu:2 --shard-update --save "$tmp/s.st" > "$tmp/ls" 2>&1 &&
        timeout 300 env MGC_SHARED_PARAMS=0 "$MGC" $L $SH --momentum 0.9 --devices cpu:2 --shard-update --save "$tmp/n.st" > "$tmp/ln" 2>&1 &&
        cmp -s "$tmp/s.st" "$tmp/u.st" && cmp -s "$tmp/n.st" "$tmp/u.st" &&
        $PY -c "import sys; u, s, n = (list(map(float, a.split())) for a in sys.argv[1:]); sys.exit(not (u[0] > 0.1 and s == [u[0] / 2] * 2 and n == u))" \
            "$(comm_mb "$tmp/lu")" "$(comm_mb "$tmp/ls")" "$(comm_mb "$tmp/ln")"; then
    ok "--shard-update on cpu:2 shares the parameter blocks: MB sent / bound a step $(comm_mb "$tmp/ls" | tr ' ' /) against $(comm_mb "$tmp/lu" | tr ' ' /) unsharded (MGC_SHARED_PARAMS=0: $(comm_mb "$tmp/ln" | tr ' ' /)), the same bits"
else
    bad "shared parameter blocks: sent/bound $(comm_mb "$tmp/lu") / $(comm_mb "$tmp/ls") / $(comm_mb "$tmp/ln"); $(tail -2 "$tmp/ls")"
fi
# devices with memory of their own (as GPUs): the blocks there too, the slices downloaded to save
train "$tmp/so.st" env MGC_CPU_OWN_MEMORY=1 "$MGC" $L $SH --momentum 0.9 --devices cpu:2 --shard-update &&
train "$tmp/su.st" "$MGC" $L $SH --momentum 0.9 --devices cpu:2 &&
    compare "$tmp/so.st" "$tmp/su.st" 0 0 "--shard-update on cpu:2 with device memory of their own = whole updates in host memory, bit for bit"
R="nets/resnet18.net --epochs 1 --limit-train 128 --limit-test 16 --batch-size 128 --seed 5"
RX=("--momentum 0.9 --devices cpu:2" "--momentum 0.9 --devices cpu:2 --sync-bn" "--optimizer adamw --lr 0.001 --devices cpu:2 --precision bf16"
    "--momentum 0.9 --devices cpu:3 --precision bf16")
[[ $MGC == *san* ]] && RX=("${RX[0]}")   # under the sanitizers (asan-dp) one ResNet-18 case: the rest is the same code, slower
for extra in "${RX[@]}"; do
    train "$tmp/su.st" "$MGC" $R $extra &&
    train "$tmp/ss.st" "$MGC" $R $extra --shard-update &&
        compare "$tmp/ss.st" "$tmp/su.st" $([[ $extra == *cpu:2* ]] && echo 0 || echo 1e-6) 0 "--shard-update = whole updates: ResNet-18 one step, $extra"
done
# the MLP-Mixer reads a LayerNorm's weight (its input gradient) after the reduce-scatter of the bucket
# holding it has started: that bucket's update waits for the next bucket's too, so that the replicas
# still share its block (--emit dp says so), two steps bit for bit
M="nets/mixer.net --epochs 1 --limit-train 256 --limit-test 16 --batch-size 128 --seed 5 --optimizer adamw --lr 0.001 --devices cpu:2"
if "$MGC" $M --shard-update --emit dp 2>&1 | grep -q "replicas in one memory (a process's CPU devices) share each block"; then
    train "$tmp/su.st" "$MGC" $M &&
    train "$tmp/ss.st" "$MGC" $M --shard-update &&
        compare "$tmp/ss.st" "$tmp/su.st" 0 0 "--shard-update, shared blocks = whole updates: MLP-Mixer two steps, AdamW, cpu:2"
else
    bad "--shard-update: the MLP-Mixer's replicas do not share their parameter blocks"
fi
train "$tmp/sa.st" "$MGC" $L $SH --momentum 0.9 --devices cpu:3 --batch-size 64 --accumulate 4 --shard-update &&
train "$tmp/sb.st" "$MGC" $L $SH --momentum 0.9 --devices cpu:3 --batch-size 256 &&
    compare "$tmp/sa.st" "$tmp/sb.st" 1e-5 0 "--shard-update --accumulate 4 x 64 = whole updates at batch 256, cpu:3"
# resume across replica counts: a sharded checkpoint holds the whole state (epoch 1 on cpu:2),
# which a sharded run on cpu:3 scatters; the same as the unsharded runs, bit for bit
SR="--limit-train 512 --limit-test 64 --lr 0.02 --momentum 0.9 --batch-size 128 --lr-schedule constant --seed 5"
train "$tmp/u1.st" "$MGC" $L $SR --epochs 1 --devices cpu:2 && cp "$tmp/u1.st" "$tmp/u1e1.st" &&
train "$tmp/s1.st" "$MGC" $L $SR --epochs 1 --devices cpu:2 --shard-update &&
    compare "$tmp/s1.st" "$tmp/u1.st" 0 0 "a sharded checkpoint: the whole momentum by parameter, bit for bit the unsharded one's"
if timeout 300 "$MGC" $L $SR --epochs 2 --devices cpu:3 --resume "$tmp/u1.st" > "$tmp/log" 2>&1 &&
        timeout 300 "$MGC" $L $SR --epochs 2 --devices cpu:3 --shard-update --resume "$tmp/s1.st" > "$tmp/log" 2>&1; then
    compare "$tmp/s1.st" "$tmp/u1.st" 1e-6 0 "--resume of a cpu:2 checkpoint on cpu:3 --shard-update = unsharded"
else
    bad "--shard-update --resume failed: $(tail -3 "$tmp/log")"
fi
"$MGC" nets/resnet18.net --devices cpu:2 --shard-update --optimizer adamw --emit dp > "$tmp/k" 2>&1
if state=$(grep -o "the optimizer's state: [0-9.]* MB a replica, of [0-9.]* MB in all" "$tmp/k") &&
        $PY -c "import sys; w = sys.argv[1].split(); a, b = float(w[3]), float(w[8]); sys.exit(not (b > 80 and abs(a - b / 2) < 0.01 * b))" "$state" &&
        grep -q "start c[0-9]* *reduce-scatter" "$tmp/k" && grep -q "start c[0-9]* *all-gather" "$tmp/k" &&
        grep -q "replicas in one memory (a process's CPU devices) share each block" "$tmp/k"; then
    ok "--emit dp: reduce-scatters, all-gathers, shared blocks, and $state (AdamW on cpu:2: a half)"
else
    bad "--emit dp --shard-update: '$state'; $(grep -c "reduce-scatter" "$tmp/k") reduce-scatters"
fi

# MPI: two ranks of cpu:1 are cpu:2 in one process; two ranks of cpu:2 are cpu:4
if command -v mpirun > /dev/null && "$MGC" --help | grep -q mpirun && ldd "$MGC" | grep -q libmpi; then
    # Open MPI's own components leak at MPI_Finalize: not ours to report (sanitizer builds)
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}detect_leaks=0"
    MA="--epochs 1 --limit-train 4000 --limit-test 256 --batch-size 100 --lr 0.05 --seed 9"
    train "$tmp/m1.st" mpirun -np 2 "$MGC" $L $MA --devices cpu:1 &&
    train "$tmp/p2.st" "$MGC" $L $MA --devices cpu:2 &&
        compare "$tmp/m1.st" "$tmp/p2.st" 0 0 "mpirun -np 2 x cpu:1 = cpu:2, bit for bit"
    train "$tmp/m2.st" mpirun -np 2 "$MGC" $L $MA --devices cpu:2 &&
    train "$tmp/p4.st" "$MGC" $L $MA --devices cpu:4 &&
        compare "$tmp/m2.st" "$tmp/p4.st" 1e-4 0 "mpirun -np 2 x cpu:2 = cpu:4"
    # --shard-update across ranks: each rank's replicas own neighbouring chunks, the ring's halves
    # within the process and MPI's reduce-scatter and all-gather across; the state gathered over
    # the ranks into rank 0's checkpoint, scattered from it on --resume
    train "$tmp/ms1.st" mpirun -np 2 "$MGC" $L $MA --devices cpu:1 --shard-update &&
        compare "$tmp/ms1.st" "$tmp/p2.st" 0 0 "mpirun -np 2 x cpu:1 --shard-update = cpu:2, bit for bit"
    train "$tmp/ms2.st" mpirun -np 2 "$MGC" $L $MA --devices cpu:2 --shard-update &&
        compare "$tmp/ms2.st" "$tmp/p4.st" 1e-6 0 "mpirun -np 2 x cpu:2 --shard-update = cpu:4"
    cp "$tmp/u1e1.st" "$tmp/mu1.st" && cp "$tmp/u1e1.st" "$tmp/u2.st"
    if timeout 300 mpirun -np 2 "$MGC" $L $SR --epochs 2 --devices cpu:1 --shard-update --resume "$tmp/mu1.st" > "$tmp/log" 2>&1 &&
            timeout 300 "$MGC" $L $SR --epochs 2 --devices cpu:2 --resume "$tmp/u2.st" > "$tmp/log" 2>&1; then
        compare "$tmp/mu1.st" "$tmp/u2.st" 0 0 "--resume on mpirun -np 2 x cpu:1 --shard-update = on cpu:2 unsharded, bit for bit"
    else
        bad "mpirun --shard-update --resume failed: $(tail -3 "$tmp/log")"
    fi
    # a rank short of memory at a checkpoint (tests/fault/failcalloc.c on rank 1: the calloc of fc1.weight's
    # state, 120 x 256 + 1 floats, fails): no rank waits for it in a collective; the parameters are saved
    # without the state, said so; --resume from a whole checkpoint stops on every rank with the reason
    if ! ldd "$MGC" | grep -q asan && cc -shared -fPIC -O1 tests/fault/failcalloc.c -o "$tmp/failcalloc.so" -ldl; then
        FAILING="-x LD_PRELOAD=$tmp/failcalloc.so -x FAILCALLOC_N=30721"
        rm -f "$tmp/oom.st"
        # shellcheck disable=SC2086
        timeout 120 mpirun -np 1 "$MGC" $L $SH --momentum 0.9 --devices cpu:1 --shard-update --save "$tmp/oom.st" : \
            -np 1 $FAILING "$MGC" $L $SH --momentum 0.9 --devices cpu:1 --shard-update --save "$tmp/oom.st" > "$tmp/log" 2>&1
        rc=$?
        if [ $rc = 0 ] && grep -q "out of memory for --shard-update's optimizer state" "$tmp/log" &&
                grep -q "holds the parameters without the optimizer's state" "$tmp/log" &&
                $PY -c "import sys; sys.path.insert(0, 'tests'); import st; d = st.load(sys.argv[1])
sys.exit(0 if 'fc1.weight' in d and not any(k.endswith('momentum_buffer') for k in d) else 1)" "$tmp/oom.st"; then
            ok "a rank out of memory gathering --shard-update's state: no wait, the parameters saved without it, said"
        else
            bad "a rank out of memory gathering the sharded state: exit $rc; $(grep mgc: "$tmp/log" | tail -2)"
        fi
        cp "$tmp/u1e1.st" "$tmp/oomr.st"
        # shellcheck disable=SC2086
        timeout 120 mpirun -np 1 "$MGC" $L $SR --epochs 2 --devices cpu:1 --shard-update --resume "$tmp/oomr.st" : \
            -np 1 $FAILING "$MGC" $L $SR --epochs 2 --devices cpu:1 --shard-update --resume "$tmp/oomr.st" > "$tmp/log" 2>&1
        rc=$?
        if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "out of memory for its optimizer's state" "$tmp/log" &&
                cmp -s "$tmp/oomr.st" "$tmp/u1e1.st"; then
            ok "a rank out of memory loading --shard-update's state: every rank stops (exit $rc), the checkpoint untouched"
        else
            bad "a rank out of memory loading the sharded state: exit $rc; $(grep mgc: "$tmp/log" | tail -2)"
        fi
    fi
    train "$tmp/ma.st" mpirun -np 2 "$MGC" $L $AC --devices cpu:1 --batch-size 64 --accumulate 4 &&
    train "$tmp/pa.st" "$MGC" $L $AC --devices cpu:2 --batch-size 256 &&
        compare "$tmp/ma.st" "$tmp/pa.st" 1e-5 0 "mpirun -np 2 --accumulate 4 x 64 = cpu:2 batch 256"
    # --sync-bn across ranks, in check mode (the dump every rank contributes rows
    # of): two ranks of cpu:1 give the dump of cpu:2, bit for bit
    $PY -c "
import sys, torch; sys.path.insert(0, 'tests'); import st
g = torch.Generator().manual_seed(5)
st.save({'x': torch.randn(6, 1, 12, 12, generator=g), 'y': torch.randint(0, 10, (6,), generator=g)}, sys.argv[1])" "$tmp/b.st"
    S="tests/nets/small_resnet.net --sync-bn --batch-size 6"
    if "$MGC" $S --epochs 0 --save "$tmp/i.st" > /dev/null 2>&1 &&
       timeout 120 mpirun -np 2 "$MGC" $S --devices cpu:1 --load "$tmp/i.st" --check-batch "$tmp/b.st" --steps 2 --dump "$tmp/dm.st" > "$tmp/out" 2>&1 &&
       "$MGC" $S --devices cpu:2 --load "$tmp/i.st" --check-batch "$tmp/b.st" --steps 2 --dump "$tmp/dt.st" >> "$tmp/out" 2>&1 &&
       MGC_CPU_OWN_MEMORY=1 "$MGC" $S --devices cpu:2 --load "$tmp/i.st" --check-batch "$tmp/b.st" --steps 2 --dump "$tmp/do.st" >> "$tmp/out" 2>&1; then
        compare "$tmp/dm.st" "$tmp/dt.st" 0 0 "--sync-bn check mode: mpirun -np 2 x cpu:1 = cpu:2, bit for bit"
        compare "$tmp/do.st" "$tmp/dt.st" 0 0 "--sync-bn check mode on cpu:2 with device memory of their own = in host memory, bit for bit"
    else
        bad "--sync-bn check mode under mpirun failed"; tail -5 "$tmp/out" | sed 's/^/    /'
    fi
    # a rank that fails after the ranks agreed (its copy of the data has the
    # same headers and gzip trailer, but a damaged stream) stops every rank,
    # with a message naming it, and no hang
    mkdir -p "$tmp/damaged"
    cp "$MGC_DATA"/*-ubyte* "$tmp/damaged/"
    f=$(ls "$tmp/damaged"/train-images-idx3-ubyte*)
    printf 'garbage!garbage!' | dd of="$f" bs=1 seek=100000 conv=notrunc status=none
    t0=$SECONDS
    timeout 120 mpirun -np 1 "$MGC" $L --epochs 1 : -np 1 "$MGC" $L --epochs 1 --data "$tmp/damaged" > "$tmp/out" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1: .*$tmp/damaged" "$tmp/out" &&
       grep -q "rank 0: stopping, another rank failed" "$tmp/out"; then
        ok "a failing rank stops both, exit $rc in $((SECONDS - t0)) s"
    else
        bad "failing ranks: exit $rc"; head -8 "$tmp/out" | sed 's/^/    /'
    fi
else
    echo "skip: mgc built without MPI, or no mpirun: the MPI checks did not run"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
