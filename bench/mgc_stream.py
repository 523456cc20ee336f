"""mgc's data stream in Python: the order of the training examples in each epoch
and each example's crop offsets and flip, as mgc draws them from --seed
(data/data.c's data_epoch_order, data/transform.c's per-example draws, the
generators of runtime/rng.h), so that a PyTorch twin trains on the very
batches mgc trains on (bench/torch_lenet.py --stream mgc).

    order = epoch_order(60000, seed, epoch)        # examples in mgc's order
    oy, ox, flip = crop_flip(60000, seed, epoch, pad)   # per example index

check_dump(...) compares the first batch these make with the one mgc wrote
with --dump-batch (tests/cli.sh runs it), so a change on either side shows.
"""
import json
import struct

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(x):
    """(next state, output) of splitmix64 from state x"""
    x = (x + GOLDEN) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Xoshiro:
    """xoshiro256** seeded as rng_seed2(seed, stream)"""

    def __init__(self, seed, stream):
        _, mixed = _splitmix64(stream & M64)
        x = (seed ^ mixed) & M64
        self.s = []
        for _ in range(4):
            x, z = _splitmix64(x)
            self.s.append(z)
        if not any(self.s):
            self.s[0] = 1

    def next(self):
        s = self.s
        result = (_rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def below(self, n):
        """uniform in [0, n): Lemire's multiply with rejection, as rng_below"""
        if n <= 1:
            return 0
        m = (self.next() >> 32) * n
        low = m & 0xFFFFFFFF
        if low < n:
            threshold = ((1 << 32) - n) % n
            while low < threshold:
                m = (self.next() >> 32) * n
                low = m & 0xFFFFFFFF
        return m >> 32


def epoch_order(n, seed, epoch):
    """the examples of epoch `epoch` in mgc's order: a Fisher-Yates shuffle (data_epoch_order)"""
    r = Xoshiro(seed, 0x5348554646 + epoch)   # "SHUFF" + epoch
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = r.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return np.array(order, dtype=np.int64)


def _hash(seed, index):
    """rng_hash(seed, index) for an array of indices: 32 bits each (uint64 arithmetic wraps mod 2^64)"""
    with np.errstate(over="ignore"):
        k = np.uint64((seed + GOLDEN) & M64)
        k = (k ^ (k >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        k = (k ^ (k >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        k ^= k >> np.uint64(31)
        z = k + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z >> np.uint64(32)


def crop_flip(n, seed, epoch, pad):
    """(oy, ox, flip) of examples 0..n-1 in epoch `epoch`: the crop window's offsets in [0, 2 pad]
    and whether it is flipped, as transform_gather draws them (draw(seed, epoch, index, k))"""
    key = (seed ^ ((0x4155474D454E54 + epoch * GOLDEN) & M64)) & M64
    index = np.arange(n, dtype=np.uint64) * np.uint64(4)
    draws = [_hash(key, index + np.uint64(k)) for k in range(3)]
    oy, ox = ((d * np.uint64(2 * pad + 1)) >> np.uint64(32) for d in draws[:2])
    return oy.astype(np.int64), ox.astype(np.int64), (draws[2] >> np.uint64(31)).astype(bool)


def read_safetensors(path):
    """{name: float32 numpy array} of a safetensors file of F32 tensors"""
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}; mgc's checkpoints hold F32")
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + size + lo:8 + size + hi], dtype=np.float32).reshape(t["shape"])
    return out


def check_dump(dump, images, seed, pad, flip, normalize=True):
    """The largest difference between epoch 1's first batch as these draws make it from images
    [n, C, H, W] (pixels / 255) and mgc's --dump-batch file `dump` (-1 if its examples differ)"""
    d = read_safetensors(dump)
    b = d["x"].shape[0]
    here = epoch_order(images.shape[0], seed, 1)[:b]
    if not (d["index"].astype(np.int64).reshape(-1) == here).all():
        return -1.0
    oy, ox, flipped = (v[here] for v in crop_flip(images.shape[0], seed, 1, pad))
    x = np.pad(images[here], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    h, w = images.shape[2], images.shape[3]
    out = np.stack([x[i, :, oy[i]:oy[i] + h, ox[i]:ox[i] + w] for i in range(b)]) if pad else images[here].copy()
    if flip:
        out[flipped] = out[flipped][..., ::-1]
    if normalize:
        out = (out - images.mean(dtype=np.float64)) / images.std(dtype=np.float64, ddof=1)
    return float(np.abs(out - d["x"]).max())
