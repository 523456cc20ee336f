#!/usr/bin/env bash
# What mgc made of a net, stage by stage. None of this needs data or a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x ./mgc ] || make -s
NET=${1:-nets/lenet.net}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
show() {  # the first lines of each stage (LINES_EACH, default 25)
    echo; echo "== mgc $NET $*"
    ./mgc "$NET" "$@" > "$out"
    sed -n "1,${LINES_EACH:-25}p" "$out"; echo "   ... ($(wc -l < "$out") lines)"
}
show --emit ir                                   # the forward graph, shapes and .net locations
show --emit grad --momentum 0.9                  # forward, backward and SGD as one graph
show --emit dp --devices cpu:2 --bucket-mb 0.1   # replicas, gradient buckets, allreduce steps
show --emit kernels                              # the step list and the C kernels
show --emit cuda                                 # the same kernels for NVRTC
if ./mgc "$NET" --emit ptx --arch sm_90 > /dev/null 2>&1; then
    show --emit ptx --arch sm_90                 # NVRTC's PTX of them (a build with the CUDA toolkit)
fi
dir=$(mktemp -d)
./mgc "$NET" --dump-kernels "$dir"               # one file per kernel, headed by its IR nodes
echo "== the first of them, $(ls "$dir" | head -1):"
sed -n "1,${LINES_EACH:-25}p" "$dir/$(ls "$dir" | head -1)"
rm -rf "$dir"
