"""The image-folder loader (--data DIR with DIR/train/CLASS/NAME.png and DIR/test/...)
against Pillow, which writes the folders and reads them back:

    .venv/bin/python tests/images_check.py make DIR IDX_DIR N      # N Fashion-MNIST images a set, as PNG and JPEG
    .venv/bin/python tests/images_check.py check DIR BATCH.safetensors RGB   # mgc --dump-batch's x against Pillow

`make` writes DIR/png (every image a grayscale PNG, lossless) and DIR/jpg (JPEG,
quality 90) in torchvision's ImageFolder layout, the classes named by
Fashion-MNIST's labels (class_0 ... class_9), and DIR/rgb (the PNGs as RGB, each
channel a tint of the gray, 32x32: the net's 28x28 is a resize). `check` reads the
batch mgc dumped (its first batch: x and the examples' indices in the training
set, which is ImageFolder's order: classes sorted, files sorted) and compares
every image with Pillow's decode of that file: equal for PNG and JPEG (the same
libjpeg-turbo, its defaults), and for RGB with mgc's bilinear resize computed
here in float64 (within 1 of 255, its rounding)."""
import gzip
import json
import os
import struct
import sys

import numpy as np
from PIL import Image

NAMES = [f"class_{k}" for k in range(10)]


def idx(path):
    raw = gzip.open(path).read()
    n = struct.unpack(">I", raw[4:8])[0]
    if raw[3] == 3:
        h, w = struct.unpack(">II", raw[8:16])
        return np.frombuffer(raw, np.uint8, offset=16).reshape(n, h, w)
    return np.frombuffer(raw, np.uint8, offset=8)


def make(d, src, n):
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = idx(f"{src}/{prefix}-images-idx3-ubyte.gz")[:n]
        y = idx(f"{src}/{prefix}-labels-idx1-ubyte.gz")[:n]
        for i, (im, lab) in enumerate(zip(x, y)):
            for kind in ("png", "jpg", "rgb"):
                cd = f"{d}/{kind}/{split}/{NAMES[lab]}"
                os.makedirs(cd, exist_ok=True)
                if kind == "png":
                    Image.fromarray(im, "L").save(f"{cd}/{i:05d}.png")
                elif kind == "jpg":
                    Image.fromarray(im, "L").save(f"{cd}/{i:05d}.jpg", quality=90)
                else:
                    big = np.pad(im, 2)   # 32x32
                    rgb = np.stack([big, big // 2, 255 - big], -1).astype(np.uint8)
                    Image.fromarray(rgb, "RGB").save(f"{cd}/{i:05d}.png")


def files(d):
    root = f"{d}/train"
    return [f"{root}/{c}/{f}" for c in sorted(os.listdir(root)) for f in sorted(os.listdir(f"{root}/{c}"))]


def st_read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64, "I32": np.int32}[v["dtype"]]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dt).reshape(v["shape"])
    return out


def resize(img, oh, ow):
    """mgc's (PyTorch's F.interpolate bilinear, align_corners=False) on one channel, float64"""
    h, w = img.shape

    def taps(i_n, o_n):
        r = np.maximum((np.arange(o_n) + 0.5) * i_n / o_n - 0.5, 0)
        i0 = r.astype(int)
        return i0, np.minimum(i0 + 1, i_n - 1), r - i0
    y0, y1, ly = taps(h, oh)
    x0, x1, lx = taps(w, ow)
    f = img.astype(np.float64)
    top = f[y0][:, x0] * (1 - lx) + f[y0][:, x1] * lx
    bot = f[y1][:, x0] * (1 - lx) + f[y1][:, x1] * lx
    return top * (1 - ly)[:, None] + bot * ly[:, None]


def check(d, batch, rgb):
    b = st_read(batch)
    x, index = b["x"], b["index"].astype(int)
    paths = files(d)
    worst = 0.0
    for k, i in enumerate(index):
        im = Image.open(paths[i])
        if rgb:
            ref = np.stack([resize(c, x.shape[2], x.shape[3]) for c in np.moveaxis(np.asarray(im.convert("RGB")), -1, 0)])
        else:
            ref = np.asarray(im.convert("L"), np.float64)[None]
        worst = max(worst, float(np.abs(x[k] * 255.0 - ref).max()))
    tol = 1.0 if rgb else 1e-3
    assert worst <= tol, (worst, tol)
    print(f"ok   {len(index)} images of {d} as Pillow decodes them: largest difference {worst:.4f} of 255")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4] == "rgb")
