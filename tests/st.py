"""Tiny pure-Python safetensors reader/writer (stdlib + torch), for tests and
benchmarks on machines without the `safetensors` package.

    load(path) -> dict name -> torch.Tensor, in file (header) order
    load_metadata(path) -> dict of str, or {}
    save(tensors: dict, path, metadata=None)  tensors written in dict order

Same format as huggingface/safetensors: u64 LE header length, JSON header
padded with spaces to a multiple of 8, then little-endian raw data.

Self-check / cross-check from the command line (used by tests/unit_runtime.c):
    python3 tests/st.py roundtrip IN OUT   load IN (ours), check, save as OUT
    python3 tests/st.py dump FILE          print name dtype shape sum
    python3 tests/st.py compare A B TOL [FLOOR]
        the largest, over tensors, of max|a - b| / max(max|b|, FLOOR) (FLOOR
        default 0: plain relative differences); exit 0 when it is <= TOL
"""
import json
import struct
import sys

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _read_header(f):
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw)
    if n > 100_000_000:
        raise ValueError("header length %d too large" % n)
    text = f.read(n)
    if len(text) != n:
        raise ValueError("truncated header")
    return json.loads(text.decode("utf-8")), 8 + n


def load(path):
    with open(path, "rb") as f:
        header, start = _read_header(f)
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError("%s: offsets outside the file" % name)
        shape = info["shape"]
        chunk = bytearray(data[begin:end])
        if len(chunk) == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(chunk, dtype=dtype).reshape(shape).clone()
        out[name] = t
    return out


def load_metadata(path):
    with open(path, "rb") as f:
        header, _ = _read_header(f)
    return dict(header.get("__metadata__", {}))


def save(tensors, path, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def max_relative_difference(a_path, b_path, floor=0.0):
    """(worst, tensor, count): the largest, over the tensors of two files that
    hold the same ones, of max|a - b| / max(max|b|, floor); NaN is the worst"""
    a, b = load(a_path), load(b_path)
    if set(a) != set(b):
        raise SystemExit(f"{a_path} and {b_path} hold different tensors: {sorted(set(a) ^ set(b))[:5]}")
    worst, name = 0.0, ""
    for k in a:
        if b[k].numel() == 0:
            continue
        scale = max(float(b[k].double().abs().max()), floor) or 1.0
        e = float((a[k].double() - b[k].double()).abs().max()) / scale
        if e > worst or e != e:
            worst, name = e, k
    return worst, name, len(a)


def _main(argv):
    if len(argv) in (4, 5) and argv[0] == "compare":
        worst, name, n = max_relative_difference(argv[1], argv[2], float(argv[4]) if len(argv) == 5 else 0.0)
        print(f"max relative difference {worst:.2e} ({name}), {n} tensors")
        return 0 if worst <= float(argv[3]) else 1
    if len(argv) == 2 and argv[0] == "dump":
        for name, t in load(argv[1]).items():
            print(name, _NAMES[t.dtype], list(t.shape), float(t.double().sum()))
        return 0
    if len(argv) == 3 and argv[0] == "roundtrip":
        tensors = load(argv[1])
        meta = load_metadata(argv[1])
        save(tensors, argv[2], meta)
        back = load(argv[2])
        assert list(back) == list(tensors)
        for k in tensors:
            assert torch.equal(back[k], tensors[k]), k
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
