#!/usr/bin/env bash
# The CUDA device without a GPU. tests/fakecuda/ stands in for the CUDA
# driver, NVRTC, cuBLAS and NCCL: what mgc calls of them, done on the CPU,
# the generated CUDA kernels compiled by the C++ compiler with its shim.h
# (each kernel's threads and barriers emulated). mgc opens those libraries
# with dlopen; pointed at it, the CUDA build runs its whole GPU path here and
# in CI, on fake GPUs: what tests/gpu/check.sh checks on a real one (whole
# nets on cuda:0 and on two replicas of one GPU against CPU devices in check
# mode, CUDA graphs on and off; every op against PyTorch on cuda:0); two GPUs
# through NCCL against cpu:2 in check mode; the data-parallel cases against
# PyTorch on k GPUs and on one; a training run on two GPUs whose checkpoint
# must match cpu:2's, and the same on two processes under mpirun, a GPU each;
# a learning rate that changes between epochs; parameters that stop being
# finite after an epoch; and the errors a user of GPUs meets. It finds what is wrong in what mgc asks of CUDA (kernels, launch
# geometry, cuBLAS's column-major operands, captures, collectives, the order
# of streams: each is a thread of its own, and copies to and from pinned
# memory run late), not speed: that needs a GPU. Needs $MGC_DATA for the runs
# on data. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
MGC=${MGC:-./mgc}
PY=/usr/bin/python3
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
SUITE=fakecuda
. tests/lib.sh
finish() { echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; exit; }

if ! nm "$MGC" 2> /dev/null | grep -q " cuda_launch"; then
    echo "skip: $MGC has no CUDA device (built without the CUDA toolkit)"; finish
fi
if [ "$(uname -m)" != x86_64 ]; then
    echo "skip: the fake GPUs' fibers switch with x86-64 instructions (this is $(uname -m))"; finish
fi
mkdir -p "$tmp/lib"
if ! cc -std=gnu11 -O1 -fPIC -shared -Wall -Wextra -Wno-unused-parameter -Werror -I"$CUDA_HOME/include" \
        -DFAKECUDA_SHIM="\"$PWD/tests/fakecuda/shim.h\"" tests/fakecuda/fakecuda.c -o "$tmp/lib/libfakecuda.so" \
        -lopenblas -ldl -lpthread -lrt > "$tmp/build" 2>&1; then
    bad "tests/fakecuda/fakecuda.c does not build"; sed 's/^/    /' "$tmp/build" | head -20; finish
fi
ln -s libfakecuda.so "$tmp/lib/libcuda.so.1"
export LD_LIBRARY_PATH=$tmp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MGC_NVRTC=$tmp/lib/libfakecuda.so MGC_CUBLAS=$tmp/lib/libfakecuda.so MGC_NCCL=$tmp/lib/libfakecuda.so
export XDG_CACHE_HOME=$tmp/cache FAKECUDA_GPUS=2
export OPENBLAS_NUM_THREADS=1   # the fake cuBLAS's GEMMs are small: OpenBLAS's threads would only spin

L=nets/lenet.net
expect "--version lists the two fake GPUs" 0 "cuda:1, fakecuda (CPU emulation), sm_90" -- --version
expect "--gpus 3 on two GPUs" 2 "there is no cuda:2: this machine has 2 GPUs (cuda:0 to cuda:1)" -- $L --gpus 3 --epochs 0
expect "two replicas of one GPU beside another GPU" 2 "a GPU named twice holds replicas that all share it: put every replica on one GPU" -- $L --devices cuda:0,cuda:0,cuda:1 --epochs 0
FAKECUDA_GPUS=0 expect "--gpus 1 where the driver sees none" 2 "the CUDA driver sees no GPU on this machine; train on CPU devices" -- $L --gpus 1 --epochs 0
# memory: a GPU's is checked against the training program (the fake GPU has 8 GiB free); the
# host's against the data set alone (IDX headers that promise 100 TB, the data left out)
cat > "$tmp/wide.net" <<'NET'
net wide(classes = 10) {
    input x[N, 1, 28, 28]
    return x -> c1: conv2d(1024, kernel = 3, padding = 1) -> relu -> global_avgpool -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
expect "a net too large for the GPU" 1 "mgc: not enough memory: training wide at batch 4096 needs" -- "$tmp/wide.net" --gpus 1 --batch-size 4096 --epochs 0
grep -q "on cuda:0 (1 device x (" "$tmp/out" && grep -q "would fit" "$tmp/out" && ok "the GPU's memory: its figures and the batch that fits" ||
    bad "gpu-memory: $(head -c 400 "$tmp/out")"
mkdir -p "$tmp/huge"
$PY -c "
import gzip, struct, sys
for name, head in [('train-images-idx3-ubyte', (0x803, 100000000, 1000, 1000)), ('t10k-images-idx3-ubyte', (0x803, 10, 1000, 1000)),
                   ('train-labels-idx1-ubyte', (0x801, 100000000)), ('t10k-labels-idx1-ubyte', (0x801, 10))]:
    with gzip.open(sys.argv[1] + '/' + name + '.gz', 'wb') as f: f.write(struct.pack('>%dI' % len(head), *head))" "$tmp/huge"
expect "a data set too large for the host, on a GPU" 1 "on this machine (the data set in $tmp/huge, 100,000,010 IDX examples, 91.0 TiB), but" -- $L --gpus 1 --data "$tmp/huge" --epochs 1

if [ -z "${MGC_DATA:-}" ]; then echo "skip: MGC_DATA is not set: nothing runs on the fake GPUs"; finish; fi

# the GPU check, on the fake GPUs (ResNet-18's own reference cases, 14 s of
# each on the fake GPU, are left to its check-mode case; the optimizers' op-net
# variants to the dp_* cases below, whose AdamW case runs on the fake GPUs)
# (the emulated GPU runs every CUDA thread on the CPU beside the other lane: its reference pass over
# the op nets takes 2-3 minutes on two cores, past check.sh's 150 s for a real GPU, and 5 on a loaded
# AVX2 machine: the limit leaves room)
OUT=$tmp/gpu REF_SKIP='resnet18* *_nesterov3 *_adamw4' REF_TIMEOUT=${REF_TIMEOUT:-480} PY=$PY bash tests/gpu/check.sh --fake --phase check,ref > "$tmp/check" 2>&1
rc=$?
n_ok=$(grep -c "^ok  " "$tmp/check")
n_ref=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed (.*/\1/p' "$tmp/check" | tail -1)
pass=$((pass + n_ok + ${n_ref:-0}))
if [ $rc -eq 0 ] && [ "$n_ok" -ge 8 ] && [ "${n_ref:-0}" -gt 0 ]; then
    ok "tests/gpu/check.sh --fake: $n_ok nets in check mode, $n_ref op checks against PyTorch"
else
    bad "tests/gpu/check.sh --fake: exit $rc"; grep -E "^FAIL|^gpu check|^== " "$tmp/check" | head -20 | sed 's/^/    /'
fi
grep -E "^ok  " "$tmp/check" | sed 's/^/    /'

# the data-parallel reference cases (k replicas against PyTorch on the global batch,
# SyncBatchNorm's semantics included): on k GPUs through NCCL, and on one GPU
for where in cuda cuda:0; do
    skip=""
    [ $where = cuda:0 ] && skip=dp_resnet18_sync2   # ResNet-18's is the NCCL run's (12 s)
    FAKECUDA_GPUS=3 REF_DP_DEVICES=$where REF_OUT=$tmp/refdp timeout 300 $PY tests/torch/ref.py --only 'dp_*' ${skip:+--skip $skip} > "$tmp/refdp.log" 2>&1
    rc=$?
    line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$tmp/refdp.log" | tail -1)
    n=${line%% passed*}
    if [ $rc -eq 0 ] && [ "${n:-0}" -gt 0 ]; then
        pass=$((pass + n)); ok "the data-parallel reference cases on REF_DP_DEVICES=$where: $line"
    else
        bad "the data-parallel reference cases on REF_DP_DEVICES=$where: exit $rc, ${line:-no summary}"; grep "^FAIL" "$tmp/refdp.log" | head -5 | sed 's/^/    /'
    fi
done

# --precision bf16 on cuda:0 (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF, which the fake rounds
# to nearest even as the tensor cores do) against autocast and the emulated policy (the
# op nets: check.sh's ref phase above); k replicas on k GPUs in bf16 against one device
MGC="$MGC --devices cuda:0" REF_OUT=$tmp/refbf timeout 300 $PY tests/torch/ref.py --precision bf16 \
    --only lenet_sgd5 --only small_resnet > "$tmp/refbf.log" 2>&1
rc=$?
FAKECUDA_GPUS=3 REF_DP_DEVICES=cuda REF_OUT=$tmp/refbfdp timeout 300 $PY tests/torch/ref.py --precision bf16 \
    --only dp_small_resnet_sync2 --only dp_lenet_sgd5_cpu3 >> "$tmp/refbf.log" 2>&1
rc=$((rc | $?))
n=$(awk '/^[0-9]+ passed, [0-9]+ failed/ { s += $1 } END { print s + 0 }' "$tmp/refbf.log")
if [ $rc -eq 0 ] && [ "${n:-0}" -gt 0 ]; then
    pass=$((pass + n)); ok "--precision bf16 on the fake GPUs against autocast and the emulated policy: $n checks"
else
    bad "--precision bf16 on the fake GPUs: exit $rc"; grep "^FAIL" "$tmp/refbf.log" | head -5 | sed 's/^/    /'
fi

# The initial parameters do not depend on the order lowering makes their buffers in: in a bf16
# GPU program the first convolution's kernel copies the next 7 convolutions' weights too (their
# buffers made before their nodes' turn, ahead of the biases between them, which draw from the
# same random stream); the store still draws each tensor's values in the net's order
if timeout 300 "$MGC" nets/resnet18.net --gpus 1 --precision bf16 --epochs 0 --seed 3 --save "$tmp/i16.st" > "$tmp/i16" 2>&1 &&
        timeout 300 "$MGC" nets/resnet18.net --devices cpu:1 --epochs 0 --seed 3 --save "$tmp/i32.st" > "$tmp/i32" 2>&1 &&
        out=$($PY tests/st.py compare "$tmp/i16.st" "$tmp/i32.st" 0); then
    ok "the same initial parameters in a bf16 GPU program as on cpu:1 (seed 3): $out"
else
    bad "initial parameters of --gpus 1 --precision bf16 against cpu:1: ${out:-a run failed}"; tail -3 "$tmp/i16" "$tmp/i32" | sed 's/^/    /'
fi

# LeNet trained on two GPUs through NCCL, CUDA graphs and all, ends where cpu:2 ends: two
# epochs of 10 steps, the evaluation program between them run in the training program's
# memory (conv1's bias gradient, in slices of the batch, counts each channel's finished
# blocks in a buffer kept from step to step outside that memory: were it inside, epoch 2's
# gradients would be wrong)
A="--epochs 2 --limit-train 640 --limit-test 256 --batch-size 64 --lr 0.01 --seed 7"
if timeout 300 "$MGC" $L $A --gpus 2 --save "$tmp/g2.st" > "$tmp/g2" 2>&1 &&
        timeout 300 "$MGC" $L $A --devices cpu:2 --save "$tmp/c2.st" > "$tmp/c2" 2>&1; then
    if out=$($PY tests/st.py compare "$tmp/g2.st" "$tmp/c2.st" 1e-4); then ok "LeNet 2 epochs of 10 steps on --gpus 2 = cpu:2: $out"
    else bad "LeNet 2 epochs of 10 steps on --gpus 2 against cpu:2: $out (tolerance 1e-4)"; fi
    acc_g=$(sed -n 's/.*test acc \([0-9.]*\).*/\1/p' "$tmp/g2" | tr '\n' ' ') acc_c=$(sed -n 's/.*test acc \([0-9.]*\).*/\1/p' "$tmp/c2" | tr '\n' ' ')
    [ -n "$acc_g" ] && [ "$acc_g" = "$acc_c" ] && ok "the same test accuracy on --gpus 2 and cpu:2 ($acc_g)" ||
        bad "test accuracy on --gpus 2 '$acc_g', on cpu:2 '$acc_c'"
else
    bad "LeNet on --gpus 2 or cpu:2 failed"; tail -5 "$tmp/g2" "$tmp/c2" | sed 's/^/    /'
fi
# --accumulate on GPUs: 4 batches of 64 summed (the accumulation kernels, the micro-batches'
# runs recorded apart from the last's) are one batch of 256; 2 epochs of 3 steps, the last of 2
AA="--epochs 2 --limit-train 640 --limit-test 64 --lr 0.05 --momentum 0.9 --seed 3 --gpus 2"
if timeout 300 "$MGC" $L $AA --batch-size 64 --accumulate 4 --save "$tmp/ga.st" > "$tmp/ga" 2>&1 &&
        timeout 300 "$MGC" $L $AA --batch-size 256 --save "$tmp/gb.st" > "$tmp/gb" 2>&1; then
    if out=$($PY tests/st.py compare "$tmp/ga.st" "$tmp/gb.st" 1e-5); then ok "--accumulate 4 x 64 = batch 256 on --gpus 2: $out"
    else bad "--accumulate 4 x 64 against batch 256 on --gpus 2: $out (tolerance 1e-5)"; fi
else
    bad "--accumulate on --gpus 2 failed"; tail -5 "$tmp/ga" "$tmp/gb" | sed 's/^/    /'
fi
# --shard-update on GPUs: NCCL's reduce-scatter and all-gather (in place), the parameters of a
# bucket in one block of GPU memory, each GPU its chunk's update: the whole update's numbers, bit for
# bit (2 epochs, so the evaluation between them and CUDA graphs' replays too); replicas sharing a GPU
# sum on it without NCCL: refused
expect "--shard-update on replicas sharing a GPU: refused, saying why" 2 "--shard-update needs a GPU a replica" -- $L --devices cuda:0,cuda:0 --shard-update --epochs 1
for opt in "--momentum 0.9 --nesterov" "--optimizer adamw --lr 0.002"; do
    SA="--epochs 2 --limit-train 512 --limit-test 64 --lr 0.05 --seed 4 --gpus 2 $opt"
    if timeout 300 "$MGC" $L $SA --save "$tmp/gu.st" > "$tmp/gu" 2>&1 && timeout 300 "$MGC" $L $SA --shard-update --save "$tmp/gs.st" > "$tmp/gs" 2>&1; then
        if out=$($PY tests/st.py compare "$tmp/gs.st" "$tmp/gu.st" 0); then ok "--gpus 2 --shard-update = whole updates, bit for bit, ${opt%% --lr*}: $out"
        else bad "--gpus 2 --shard-update against whole updates, ${opt%% --lr*}: $out"; fi
    else
        bad "--gpus 2 --shard-update failed"; tail -5 "$tmp/gu" "$tmp/gs" | sed 's/^/    /'
    fi
done

# mgc predict on GPUs (the evaluation program alone, two GPUs sharing each batch) gives the CPU's
# predictions from the same checkpoint
if [ -f "$tmp/g2.st" ] && timeout 300 "$MGC" predict "$tmp/g2.st" --gpus 2 --limit-test 300 --batch-size 37 --out "$tmp/pg.safetensors" > "$tmp/pg" 2>&1 &&
        timeout 300 "$MGC" predict "$tmp/g2.st" --limit-test 300 --out "$tmp/pc.safetensors" > "$tmp/pc" 2>&1; then
    out=$($PY -c "
import sys; sys.path.insert(0, 'tests'); import st, torch
a, b = st.load(sys.argv[1]), st.load(sys.argv[2])
d = float((a['logits'] - b['logits']).abs().max() / b['logits'].abs().max())
print('%.1e' % d); sys.exit(0 if torch.equal(a['pred'], b['pred']) and d < 1e-5 else 1)" "$tmp/pg.safetensors" "$tmp/pc.safetensors") &&
        ok "mgc predict on --gpus 2 (batch 37) = on the CPU: the same 300 predictions, logits within $out" ||
        bad "mgc predict on --gpus 2 against the CPU: $out"
else
    bad "mgc predict on --gpus 2 or the CPU failed"; tail -3 "$tmp/pg" "$tmp/pc" | sed 's/^/    /'
fi

# a learning rate that changes between epochs reaches the GPU: a CUDA graph
# recorded at one rate is not replayed at another (rate 0 after epoch 1: the
# parameters stay epoch 1's, bit for bit)
S="--limit-train 256 --limit-test 64 --batch-size 128"
if timeout 300 "$MGC" $L $S --epochs 1 --gpus 1 --lr-schedule constant --save "$tmp/one.st" > "$tmp/s1" 2>&1 &&
        timeout 300 "$MGC" $L $S --epochs 3 --gpus 1 --lr-schedule step:1 --lr-gamma 0 --save "$tmp/frozen.st" > "$tmp/s3" 2>&1 &&
        out=$($PY tests/st.py compare "$tmp/frozen.st" "$tmp/one.st" 0); then
    ok "--lr-schedule step:1 --lr-gamma 0 on cuda:0: the parameters are epoch 1's: $out"
else
    bad "--lr-schedule on cuda:0: the rate of epochs 2 and 3 was not 0 (${out:-a run failed})"; tail -3 "$tmp/s3" | sed 's/^/    /'
fi

# a rate that changes every step (--lr-per step, --warmup): the recorded graph, replayed as it
# is, reads each step's rate from device memory; milestone 2 in steps is epoch 1's end (2 steps
# an epoch here); a cosine after a warmup on cuda:0 with CUDA graphs ends where it ends without
# them, bit for bit
W="--epochs 3 --gpus 1 --lr-per step --lr-schedule cosine --warmup 3"
if [ -f "$tmp/one.st" ] &&
        timeout 300 "$MGC" $L $S --epochs 3 --gpus 1 --lr-per step --lr-schedule step:2 --lr-gamma 0 --save "$tmp/frozen2.st" > "$tmp/s4" 2>&1 &&
        out=$($PY tests/st.py compare "$tmp/frozen2.st" "$tmp/one.st" 0); then
    ok "--lr-per step --lr-schedule step:2 --lr-gamma 0 on cuda:0: the parameters are epoch 1's: $out"
else
    bad "--lr-per step on cuda:0: the rate after step 2 was not 0 (${out:-a run failed})"; tail -3 "$tmp/s4" | sed 's/^/    /'
fi
if timeout 300 "$MGC" $L $S $W --save "$tmp/wg.st" > "$tmp/wg" 2>&1 &&
        MGC_CUDA_GRAPHS=0 timeout 300 "$MGC" $L $S $W --save "$tmp/wn.st" > "$tmp/wn" 2>&1 &&
        out=$($PY tests/st.py compare "$tmp/wg.st" "$tmp/wn.st" 0); then
    ok "--lr-per step --lr-schedule cosine --warmup 3 on cuda:0: CUDA graphs on = off, bit for bit: $out"
else
    bad "--lr-per step on cuda:0 with and without CUDA graphs: ${out:-a run failed}"; tail -3 "$tmp/wg" "$tmp/wn" | sed 's/^/    /'
fi

# parameters that stop being finite while the loss does not (issue 35): conv1's weights at 1e38
# before a BatchNorm, ReLU making numbers of its NaN; on GPUs the check downloads the store:
# epoch 2 stops with status 1, the checkpoint epoch 1's byte for byte, on one GPU and on two
cat > "$tmp/bnr.net" <<'NET'
net bnr(classes = 10) {
    input x[N, 1, 28, 28]
    return x -> conv1: conv2d(4, kernel = 5) -> bn1: batchnorm2d -> relu -> maxpool2d(2)
             -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
if timeout 300 "$MGC" "$tmp/bnr.net" $S --epochs 1 --save "$tmp/bn.st" > "$tmp/bn" 2>&1 &&
        $PY -c "
import sys; sys.path.insert(0, 'tests'); import st
t, m = st.load(sys.argv[1]), st.load_metadata(sys.argv[1]); t['conv1.weight'].fill_(1e38); st.save(t, sys.argv[2], m)" "$tmp/bn.st" "$tmp/big.st"; then
    sum=$(md5sum < "$tmp/big.st")
    for g in 1 2; do
        expect "--gpus $g: parameters not finite after epoch 2 stop the run" 1 "after epoch 2, parameter 'conv1.weight' holds 100 values that are not finite, of 100" -- "$tmp/bnr.net" $S --epochs 3 --gpus $g --resume "$tmp/big.st"
        [ "$(md5sum < "$tmp/big.st")" = "$sum" ] && grep -qF "$tmp/big.st keeps epoch 1, whose tensors were finite" "$tmp/out" &&
            ok "--gpus $g: the checkpoint of epoch 1 kept byte for byte" || bad "--gpus $g: the checkpoint changed: $(tail -1 "$tmp/out")"
    done
    # the check counts on the GPU (only the counts come back): a finite run says so with -v, and saves
    expect "--gpus 1: the epoch's check on the device" 0 "epoch 2's parameters and state checked in" -- "$tmp/bnr.net" $S --epochs 2 --gpus 1 --resume "$tmp/bn.st" --save "$tmp/bn2.st" -v
    grep -q "epoch 2's parameters and state checked in .* ms, on the device" "$tmp/out" && $PY -c "import sys; sys.path.insert(0, 'tests'); import st; st.load(sys.argv[1])" "$tmp/bn2.st" &&
        ok "--gpus 1: the epoch's check ran on the device, and the checkpoint was downloaded and saved" || bad "--gpus 1: the check on the device: $(grep checked "$tmp/out")"
else
    bad "no BatchNorm checkpoint to change: $(tail -2 "$tmp/bn")"
fi

# the same on two processes, a GPU each: NCCL's id sent by MPI, the ranks' GPUs taken in turn
if [ -f "$tmp/g2.st" ] && command -v mpirun > /dev/null && ldd "$MGC" | grep -q libmpi; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    if timeout 300 mpirun -np 2 "$MGC" $L $A --gpus 1 --save "$tmp/m2.st" > "$tmp/m2" 2>&1; then
        if out=$($PY tests/st.py compare "$tmp/m2.st" "$tmp/g2.st" 0); then ok "mpirun -np 2 x --gpus 1 = --gpus 2, bit for bit: $out"
        else bad "mpirun -np 2 x --gpus 1 against --gpus 2: $out"; fi
        if timeout 300 mpirun -np 2 "$MGC" $L $A --gpus 1 --shard-update --save "$tmp/ms.st" > "$tmp/ms" 2>&1 &&
                out=$($PY tests/st.py compare "$tmp/ms.st" "$tmp/g2.st" 0); then
            ok "mpirun -np 2 x --gpus 1 --shard-update (NCCL's halves across processes, the state gathered by MPI) = --gpus 2, bit for bit: $out"
        else
            bad "mpirun -np 2 x --gpus 1 --shard-update: ${out:-$(tail -3 "$tmp/ms")}"
        fi
    else
        bad "mpirun -np 2 $MGC --gpus 1 failed"; tail -5 "$tmp/m2" | sed 's/^/    /'
    fi
    # replicas sharing a GPU under mpirun: refused on every rank before anything starts
    timeout 120 mpirun -np 2 "$MGC" $L --devices cuda:0,cuda:0 --epochs 0 > "$tmp/m0" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "under mpirun every replica needs a GPU of its own" "$tmp/m0" &&
        ok "mpirun -np 2 --devices cuda:0,cuda:0: refused, exit $rc" ||
        { bad "mpirun -np 2 --devices cuda:0,cuda:0: exit $rc"; tail -3 "$tmp/m0" | sed 's/^/    /'; }
    # one GPU, two ranks that take a GPU each: rank 1 has none, says so, and neither waits for the other
    FAKECUDA_GPUS=1 timeout 120 mpirun -np 2 "$MGC" $L --gpus 1 --epochs 0 > "$tmp/m1" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1: --gpus 1: there is no cuda:1: this machine has 1 GPU (cuda:0), and its ranks take them in turn" "$tmp/m1"; then
        ok "mpirun -np 2 --gpus 1 on one GPU: rank 1 says it has none, both stop (exit $rc)"
    else
        bad "mpirun -np 2 --gpus 1 on one GPU: exit $rc$([ $rc -eq 124 ] && echo ', a hang')"; tail -5 "$tmp/m1" | sed 's/^/    /'
    fi
fi
finish
