#!/usr/bin/env bash
# Train LeNet, export it as ONNX, and run the model in ONNX Runtime on the
# first 1,000 Fashion-MNIST test images: the predictions are mgc predict's.
# ONNX Runtime from the project's virtual environment (.ci/setup makes .venv),
# or any python3 that has onnxruntime (PYTHON=...). EPOCHS and LIMIT shorten it.
set -eu
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
py=${PYTHON:-.venv/bin/python}
out=${OUT:-$(mktemp -d)}
./mgc nets/lenet.net --normalize --epochs "${EPOCHS:-10}" ${LIMIT:+--limit-train $LIMIT} --save "$out/lenet.safetensors" | tail -1
./mgc export "$out/lenet.safetensors" --out "$out/lenet.onnx"
./mgc predict "$out/lenet.safetensors" --limit-test 1000 --out "$out/mgc.csv" | grep "^accuracy"
"$py" - "$out/lenet.onnx" "$MGC_DATA" "$out/mgc.csv" <<'PY'
import csv, gzip, struct, sys
import numpy as np
import onnxruntime as ort

model, data, mgc_csv = sys.argv[1:4]
sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
meta = sess.get_modelmeta().custom_metadata_map
with gzip.open(data + "/t10k-images-idx3-ubyte.gz") as f:
    _, n, rows, cols = struct.unpack(">IIII", f.read(16))
    images = np.frombuffer(f.read(1000 * rows * cols), dtype=np.uint8).reshape(1000, 1, rows, cols)
with gzip.open(data + "/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read()[8:1008], dtype=np.uint8)
logits = sess.run(["logits"], {"images": images.astype(np.float32) / np.float32(255)})[0]
pred = logits.argmax(1)
mgc = np.array([int(r["pred"]) for r in csv.DictReader(open(mgc_csv))])
print("ONNX Runtime: %s -> %s, normalize %s; accuracy %.4f on 1,000 test images" % (meta["input"], meta["output"], meta["normalize"], (pred == labels).mean()))
print("the same predictions as mgc predict: %d of %d" % ((pred == mgc).sum(), len(mgc)))
PY
