#!/usr/bin/env bash
# Train LeNet, export it as a PyTorch module (model.py), load the checkpoint
# into it and predict the first 1,000 Fashion-MNIST test images in PyTorch,
# through the file's own transform(): the predictions are mgc predict's.
# PyTorch from /usr/bin/python3 (Debian's python3-torch). EPOCHS and LIMIT shorten it.
set -eu
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
out=${OUT:-$(mktemp -d)}
./mgc nets/lenet.net --normalize --epochs "${EPOCHS:-10}" ${LIMIT:+--limit-train $LIMIT} --save "$out/lenet.safetensors" | tail -1
./mgc export "$out/lenet.safetensors" --out "$out/lenet_model.py"
./mgc predict "$out/lenet.safetensors" --limit-test 1000 --out "$out/mgc.csv" | grep "^accuracy"
/usr/bin/python3 - "$out" "$MGC_DATA" <<'PY'
import csv, gzip, sys
import torch
out, data = sys.argv[1:3]
sys.path.insert(0, out)
import lenet_model                                   # the exported file: torch alone

net = lenet_model.load(out + "/lenet.safetensors")  # Net() with the checkpoint's tensors, eval mode
with gzip.open(data + "/t10k-images-idx3-ubyte.gz") as f:
    pixels = torch.frombuffer(bytearray(f.read()[16:16 + 1000 * 784]), dtype=torch.uint8).reshape(1000, 1, 28, 28)
with gzip.open(data + "/t10k-labels-idx1-ubyte.gz") as f:
    labels = torch.tensor(list(f.read()[8:1008]))
with torch.no_grad():
    pred = net(lenet_model.transform(pixels)).argmax(1)     # bytes / 255, the training set's mean and std
mgc = torch.tensor([int(r["pred"]) for r in csv.DictReader(open(out + "/mgc.csv"))])
print("PyTorch: %s, input %s, accuracy %.4f on 1,000 test images" % (type(net).__name__, lenet_model.INPUT_SHAPE, (pred == labels).double().mean()))
print("the same predictions as mgc predict: %d of %d" % ((pred == mgc).sum(), len(mgc)))
PY
