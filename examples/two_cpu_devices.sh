#!/usr/bin/env bash
# Data-parallel training on two CPU devices in one process.
#
# --devices cpu:2 makes two replicas, each on its own thread with half the
# cores; each takes half of every batch of 256, and the gradients are summed
# by a ring allreduce that overlaps the backward pass. The run prints the
# device list and, after each epoch, the communication report. The numbers
# are those of one device with the same batch (up to the order of float sums).
set -euo pipefail
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
EPOCHS=${EPOCHS:-3}
LIMIT=${LIMIT:-60000}
[ -x ./mgc ] || make -s

echo "== LeNet on one device"
./mgc nets/lenet.net --epochs "$EPOCHS" --limit-train "$LIMIT"
echo "== LeNet on two devices: the same numbers"
./mgc nets/lenet.net --epochs "$EPOCHS" --limit-train "$LIMIT" --devices cpu:2

# ResNet-18 with BatchNorm over the global batch (--sync-bn): the statistics of
# both halves are summed in the forward pass, and so are the two gradient sums
# of BatchNorm's backward pass. A subset: ResNet-18 takes minutes per epoch here.
echo "== ResNet-18 on two devices, BatchNorm synchronised (a subset)"
./mgc nets/resnet18.net --epochs 1 --limit-train "$(( LIMIT < 2048 ? LIMIT : 2048 ))" --limit-test 1000 \
    --devices cpu:2 --sync-bn
