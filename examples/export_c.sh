#!/usr/bin/env bash
# Train LeNet, export it as a standalone C library (mgc export --format c),
# build it in its own directory with its Makefile, and run its example
# program on the first 1,000 Fashion-MNIST test images: the predictions are
# mgc predict's. The library needs a C compiler, libm, pthreads and OpenBLAS,
# nothing of mgc's. EPOCHS and LIMIT shorten the training.
set -eu
cd "$(dirname "$0")/.."
export MGC_DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
out=${OUT:-$(mktemp -d)}
./mgc nets/lenet.net --normalize --epochs "${EPOCHS:-10}" ${LIMIT:+--limit-train $LIMIT} --save "$out/lenet.safetensors" | tail -1
./mgc export "$out/lenet.safetensors" --format c --out "$out/lenet"
make -s -C "$out/lenet"
./mgc predict "$out/lenet.safetensors" --limit-test 1000 --out "$out/mgc.csv" | grep "^accuracy"
# the first 1,000 test images as U8 in a safetensors file, the example program's input
/usr/bin/python3 - "$MGC_DATA" "$out/images.safetensors" <<'PY'
import gzip, json, struct, sys
with gzip.open(sys.argv[1] + "/t10k-images-idx3-ubyte.gz") as f:
    _, n, rows, cols = struct.unpack(">IIII", f.read(16))
    pixels = f.read(1000 * rows * cols)
head = json.dumps({"images": {"dtype": "U8", "shape": [1000, rows, cols], "data_offsets": [0, len(pixels)]}}).encode()
head += b" " * (-len(head) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(head)) + head + pixels)
PY
"$out/lenet/mgc_predict" "$out/images.safetensors" "$out/logits.safetensors"
/usr/bin/python3 - "$out/logits.safetensors" "$out/mgc.csv" <<'PY'
import csv, json, struct, sys
raw = open(sys.argv[1], "rb").read()
(size,) = struct.unpack("<Q", raw[:8])
t = json.loads(raw[8:8 + size])["logits"]
n, k = t["shape"]
a, b = t["data_offsets"]
v = struct.unpack("<%df" % (n * k), raw[8 + size + a:8 + size + b])
pred = [max(range(k), key=lambda j: v[i * k + j]) for i in range(n)]
mgc = [int(r["pred"]) for r in csv.DictReader(open(sys.argv[2]))]
print("the same predictions as mgc predict: %d of %d" % (sum(p == q for p, q in zip(pred, mgc)), len(mgc)))
PY
