#!/usr/bin/env bash
# Two processes joined by MPI: `mpirun -np 2 ./mgc ... --devices cpu:1` trains
# one data-parallel group of two replicas, one per rank. Each rank reads its
# half of every global batch; the gradients are summed with MPI's allreduce on
# a communication thread while the backward pass goes on; only rank 0 prints
# and saves. The result is the checkpoint of --devices cpu:2 in one process,
# bit for bit. (Across machines: mpirun's --host or --hostfile, same command.)
set -euo pipefail
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
EPOCHS=${EPOCHS:-2}
LIMIT=${LIMIT:-60000}
[ -x ./mgc ] || make -s
# Open MPI refuses root unless told, and wants leave to run 2 ranks on fewer cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== mpirun -np 2, one CPU device per rank"
mpirun -np 2 ./mgc nets/lenet.net --epochs "$EPOCHS" --limit-train "$LIMIT" --devices cpu:1 --save "$out/mpi.safetensors"
echo "== one process, two CPU devices"
./mgc nets/lenet.net --epochs "$EPOCHS" --limit-train "$LIMIT" --devices cpu:2 --save "$out/threads.safetensors"
if cmp -s "$out/mpi.safetensors" "$out/threads.safetensors"; then
    echo "the two checkpoints are identical, bit for bit"
else
    echo "the two checkpoints differ"; exit 1
fi
