#!/usr/bin/env bash
# Train LeNet with normalised images, then use the checkpoint alone: its test
# accuracy (mgc evaluate), and every test image's prediction with its
# probabilities (mgc predict), with the checkpoint's own mean and std.
# EPOCHS and LIMIT shorten it (the tests run it with EPOCHS=1).
set -eu
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
out=${OUT:-$(mktemp -d)}
./mgc nets/lenet.net --normalize --epochs "${EPOCHS:-10}" ${LIMIT:+--limit-train $LIMIT} --save "$out/lenet.safetensors" | tail -1
./mgc evaluate "$out/lenet.safetensors"
./mgc predict "$out/lenet.safetensors" --out "$out/predictions.csv" | grep -E "^(mgc: predicted|accuracy)"
echo "the first predictions ($out/predictions.csv):"
head -4 "$out/predictions.csv" | cut -d, -f1-3
