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


def dump(rep, name, args):
    """mgc's first training batch with args: x [B, C, H, W] and the examples' indices, or None (said)"""
    out = os.path.join(tempfile.mkdtemp(prefix="mgc-data-"), "batch.safetensors")
    try:
        run_mgc(["nets/lenet.net", "--dump-batch", out, "--batch-size", 128] + args)
    except MgcError as e:
        rep.check(name, "mgc --dump-batch", False, str(e))
        return None, None
    b = st_load(out)
    return b["x"].double(), b["index"].long()


def bilinear(img, top, left, h, w, H, W):
    """img [C, H, W]'s window resized to H x W: F.interpolate's bilinear (align_corners=False)"""
    return F.interpolate(img[None, :, top:top + h, left:left + w], size=(H, W), mode="bilinear", align_corners=False)[0]


def check_augment_ops(rep, images):
    """The augmentations past crop and flip, each alone, by what they must do to each image:
    translate:F an integer shift within F of the size (zeros in), found exactly; rotate:D a
    rotation by an angle within D (nearest, zeros in), found on a grid of angles; crop-resize:S a
    window of area at least S and aspect within (3/4, 4/3), resized back (bilinear), found among
    every such window; erase:P the image with a rectangle of area at most a third zeroed, in about
    P of them. And each spread over what it may draw."""
    x, index = dump(rep, "translate", ["--augment", "translate:0.15", "--seed", 7])
    if x is not None:
        shifts, ok = [], 0
        for i, k in enumerate(index.tolist()[:64]):
            img = images[k].double() / 255
            for dy in range(-4, 5):
                for dx in range(-4, 5):
                    cand = torch.zeros_like(img)
                    ys, yd = (slice(0, 28 - dy), slice(dy, 28)) if dy >= 0 else (slice(-dy, 28), slice(0, 28 + dy))
                    xs, xd = (slice(0, 28 - dx), slice(dx, 28)) if dx >= 0 else (slice(-dx, 28), slice(0, 28 + dx))
                    cand[:, yd, xd] = img[:, ys, xs]
                    if (cand - x[i]).abs().max().item() <= 1e-6:
                        ok += 1
                        shifts.append((dy, dx))
                        break
                else:
                    continue
                break
        rep.check("translate", "each image a shift of at most 0.15 x 28 = 4.2 pixels", ok == 64, f"{ok}/64")
        rep.check("translate", "shifts spread", len(set(shifts)) >= 20, f"{len(set(shifts))} distinct")
    x, index = dump(rep, "rotate", ["--augment", "rotate:20", "--seed", 8])
    if x is not None:
        ys, xs = torch.meshgrid(torch.arange(28, dtype=torch.float64), torch.arange(28, dtype=torch.float64), indexing="ij")
        u, v = xs - 13.5, ys - 13.5
        grid = torch.arange(-20, 20.001, 0.02, dtype=torch.float64)
        exact, angles, worst = 0, [], 0.0
        for i, k in enumerate(index.tolist()[:32]):
            img = (images[k].double() / 255)[0]
            best, at = None, None
            for a in grid.tolist():
                r = a * torch.pi / 180
                sx = torch.floor(torch.cos(torch.tensor(r)) * u + torch.sin(torch.tensor(r)) * v + 13.5 + 0.5).long()
                sy = torch.floor(-torch.sin(torch.tensor(r)) * u + torch.cos(torch.tensor(r)) * v + 13.5 + 0.5).long()
                inside = (sx >= 0) & (sx < 28) & (sy >= 0) & (sy < 28)
                cand = torch.where(inside, img[sy.clamp(0, 27), sx.clamp(0, 27)], torch.zeros(()))
                err = (cand - x[i][0]).abs().gt(1e-6).double().mean().item()
                if best is None or err < best:
                    best, at = err, a
                if best == 0:
                    break
            exact += best == 0
            worst = max(worst, best)
            angles.append(at)
        rep.check("rotate", "each image a rotation within 20 degrees", exact >= 30 and worst <= 0.01,
                  f"{exact}/32 exactly at a grid angle; the rest {worst:.3%} of pixels off at most")
        rep.check("rotate", "angles spread both ways", min(angles) < -10 and max(angles) > 10, f"{min(angles):.1f}..{max(angles):.1f}")
    x, index = dump(rep, "crop_resize", ["--augment", "crop-resize:0.6", "--seed", 9])
    if x is not None:
        ok, areas = 0, []
        for i, k in enumerate(index.tolist()[:16]):
            img = images[k].float() / 255
            done = False
            for h in range(1, 29):
                for w in range(1, 29):
                    if h * w < 0.6 * 784 - 40 or not 0.75 - 0.05 <= w / h <= 4 / 3 + 0.05:
                        continue
                    for top in range(0, 29 - h):
                        for left in range(0, 29 - w):
                            cand = bilinear(img, top, left, h, w, 28, 28).double()
                            if (cand - x[i]).abs().max().item() <= 1e-5:
                                ok, done = ok + 1, True
                                areas.append(h * w / 784)
                                break
                        if done:
                            break
                    if done:
                        break
                if done:
                    break
        rep.check("crop_resize", "each image a window of area >= 0.6, aspect 3/4..4/3, resized", ok == 16, f"{ok}/16")
        rep.check("crop_resize", "areas spread", len(areas) > 1 and max(areas) - min(areas) > 0.1,
                  f"{min(areas or [0]):.2f}..{max(areas or [0]):.2f}")
    x, index = dump(rep, "erase", ["--augment", "erase:0.5", "--seed", 10])
    if x is not None:
        erased, ok = 0, 0
        for i, k in enumerate(index.tolist()):
            img = images[k].double() / 255
            diff = (x[i] - img).abs() > 1e-6
            if not diff.any():
                ok += 1
                continue
            ys, xs = diff[0].nonzero(as_tuple=True)
            box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
            ok += bool((x[i][diff] == 0).all()) and box.item() <= 0.33 * 784 + 28
            erased += 1
        rep.check("erase", "each image itself, or with a rectangle of at most 0.33 of it zeroed", ok == len(index),
                  f"{ok}/{len(index)}")
        rep.check("erase", "about half erased (a rectangle on the black background shows no change)",
                  0.25 <= erased / len(index) <= 0.6, f"{erased}/{len(index)}")


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
    check_augment_ops(rep, images)
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
