#!/usr/bin/python3
"""The loader's transforms against torchvision's recipe, in PyTorch:

    /usr/bin/python3 tests/torch/data_check.py

mgc --dump-batch writes epoch 1's first training batch as the net sees it,
with each example's index in the training set. For each example this test
rebuilds the image from the IDX file (read here with gzip, not by mgc) the
way torchvision would (ToTensor; Resize((H, W), antialias=False), i.e.
F.interpolate bilinear with align_corners=False; RandomCrop(padding=P); a
horizontal flip; Normalize with the training set's mean and std computed
here) and looks for the crop offset and flip that give mgc's image: one must
match within 1e-6 (1e-5 resized: PyTorch's float32 bilinear weights round
differently by a few ulps). The draws must spread over every offset and flip about
half the images; another seed draws others, the same seed the same. The
same on three channels of safetensors data sets written here: U8 pixels
[N, H, W, C] and F32 values (taken as they are, not / 255), normalised per
channel.
"""
import gzip
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ref import ROOT, MgcError, Report, run_mgc, st_load, st_save  # noqa: E402

DATA = os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist"))


def idx_raw(path):
    """The bytes of the IDX file path[.gz], decompressed."""
    for p in (path + ".gz", path):
        if os.path.exists(p):
            with open(p, "rb") as f:
                raw = f.read()
            return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    raise OSError(f"no {path}[.gz]")


def idx_images(path):
    raw = idx_raw(path)
    n, h, w = (int.from_bytes(raw[k:k + 4], "big") for k in (4, 8, 12))
    return torch.frombuffer(bytearray(raw[16:16 + n * h * w]), dtype=torch.uint8).view(n, 1, h, w)


def idx_labels(path):
    return torch.frombuffer(bytearray(idx_raw(path)[8:]), dtype=torch.uint8).long()


def candidates(img, pad, flip):
    """Every image RandomCrop(padding=pad) and the flip could make of img [C, H, W]."""
    c, h, w = img.shape
    padded = F.pad(img, (pad, pad, pad, pad))
    out = {}
    for oy in range(2 * pad + 1):
        for ox in range(2 * pad + 1):
            win = padded[:, oy:oy + h, ox:ox + w]
            out[(oy, ox, False)] = win
            if flip:
                out[(oy, ox, True)] = torch.flip(win, dims=[2])
    return out


def check(rep, name, args, images, labels, mean, std, pad, flip, size, net=None, scale=255.0):
    """images [N, C, H, W] as stored (bytes: scale 255, as ToTensor; floats: scale 1, as they are)."""
    out = os.path.join(tempfile.mkdtemp(prefix="mgc-data-"), "batch.safetensors")
    net = net or ("nets/lenet.net" if size is None else "tests/nets/resize_input.net")
    try:
        run_mgc([net, "--dump-batch", out, "--batch-size", 128] + args)
    except MgcError as e:
        rep.check(name, "mgc --dump-batch", False, str(e))
        return None
    b = st_load(out)
    x, y, index = b["x"], b["y"], b["index"].long()
    rep.check(name, "labels are the examples'", torch.equal(y.long(), labels[index]),
              f"{len(index)} examples")
    rep.check(name, "indices distinct", len(set(index.tolist())) == len(index), "")
    # bilinear weights round differently in PyTorch's float32 kernel (a few
    # ulps of 1: 8e-7 seen), and Normalize divides by std ~0.35
    tol = 1e-6 if size is None else 1e-5
    found, worst, draws = 0, 0.0, []
    for i, k in enumerate(index.tolist()):
        img = images[k].float() / scale   # ToTensor's float32, resized in float32 as torchvision does
        if size is not None:
            img = F.interpolate(img[None], size=size, mode="bilinear", align_corners=False)[0]
        img = img.double()
        best, how = None, None
        for key, cand in candidates(img, pad, flip).items():
            if mean is not None:
                cand = (cand - mean) / std
            err = (cand - x[i].double()).abs().max().item()
            if best is None or err < best:
                best, how = err, key
        worst = max(worst, best)
        if best <= tol:
            found += 1
            draws.append(how)
    rep.check(name, "every image a crop/flip of its own", found == len(index),
              f"{found}/{len(index)} within {tol:g} (worst {worst:.2e})")
    if pad:
        offs = {d[0] for d in draws} | {d[1] for d in draws}
        rep.check(name, "crop offsets spread", offs == set(range(2 * pad + 1)), f"offsets seen {sorted(offs)}")
    if flip:
        share = sum(d[2] for d in draws) / max(len(draws), 1)
        rep.check(name, "about half flipped", 0.35 <= share <= 0.65, f"{share:.2f}")
    return x


def check_rgb(rep):
    """Three channels from the other formats: safetensors U8 [N, H, W, C] (byte / 255) and F32
    values (as they are, not / 255), resized, cropped, flipped and normalised per channel with
    the training set's statistics."""
    tmp = tempfile.mkdtemp(prefix="mgc-data-")
    g = torch.Generator().manual_seed(5)
    labels = torch.arange(300) % 10
    for kind, images, scale in (
            ("u8", torch.randint(0, 256, (300, 32, 32, 3), dtype=torch.uint8, generator=g), 255.0),
            ("f32", torch.randn(300, 20, 24, 3, generator=g) * 3 + 1, 1.0)):
        d = os.path.join(tmp, kind)
        os.makedirs(d)
        st_save({"images": images, "labels": labels}, os.path.join(d, "train.safetensors"))
        st_save({"images": images[:20].contiguous(), "labels": labels[:20].contiguous()}, os.path.join(d, "test.safetensors"))
        nchw = images.permute(0, 3, 1, 2).contiguous()
        px = nchw.double() / scale
        mean = px.mean(dim=(0, 2, 3)).view(3, 1, 1)
        std = px.std(dim=(0, 2, 3), unbiased=False).view(3, 1, 1)
        check(rep, f"rgb_{kind}", ["--augment", "crop:3,flip", "--normalize", "--resize", "28x28", "--data", d,
                                   "--set", "in_channels=3"], nchw, labels, mean, std, 3, True, (28, 28),
              net="nets/lenet.net", scale=scale)
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    rep = Report()
    try:
        images = idx_images(os.path.join(DATA, "train-images-idx3-ubyte"))
        labels = idx_labels(os.path.join(DATA, "train-labels-idx1-ubyte"))
    except OSError as e:
        rep.check("data", "Fashion-MNIST", False, f"{e} (set MGC_DATA)")
        print(f"{rep.passed} passed, {rep.failed} failed")
        return 1
    px = images.double() / 255
    mean, std = px.mean().item(), px.std(unbiased=False).item()
    a = check(rep, "crop_flip_normalize", ["--augment", "crop:4,flip", "--normalize", "--seed", 3],
              images, labels, mean, std, 4, True, None)
    check(rep, "crop2", ["--augment", "crop:2", "--seed", 4], images, labels, None, None, 2, False, None)
    check(rep, "resize", ["--resize", "32x40"], images, labels, None, None, 0, False, (32, 40))
    check(rep, "resize_all", ["--resize", "32x40", "--augment", "flip,crop:3", "--normalize"],
          images, labels, mean, std, 3, True, (32, 40))
    # the draws are the seed's: the same again, others with another seed
    b = check(rep, "same_seed", ["--augment", "crop:4,flip", "--normalize", "--seed", 3],
              images, labels, mean, std, 4, True, None)
    if a is not None and b is not None:
        rep.check("same_seed", "bit for bit as before", torch.equal(a, b), "")
    check_rgb(rep)
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
