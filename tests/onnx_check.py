"""The ONNX export's checks, on the side of ONNX's own tools (run by
tests/export.sh with the project's virtual environment, .venv/, which
.ci/setup makes from tests/requirements-onnx.txt: onnxruntime, onnx, numpy;
no torch). Safetensors are read and written here with numpy alone.

    onnx_check.py data DIR N C H W CLASSES SEED
        DIR/train.safetensors and DIR/test.safetensors: N random images
        (float32 in [0, 1), [N, C, H, W]) and labels (U8), for mgc --data
    onnx_check.py batch OUT N C H W CLASSES SEED
        OUT.safetensors with x (float32 in [0, 1), [N, C, H, W]) and y
        (I64): a batch for mgc's check mode (--batch)
    onnx_check.py merge CK DUMP|- OUT [--drop NAME] [--narrow NAME]
        OUT: CK (its metadata and tensors) with each tensor that DUMP (a
        check mode --dump) also holds replaced by DUMP's; without the
        tensor NAME (--drop), or with its first dimension one shorter
        (--narrow)
    onnx_check.py images OUT N C H W SEED [IDX.gz]
        OUT.safetensors with 'images' only: N random float32 images in
        [0, 1), or the first N of a Fashion-MNIST IDX file as U8 pixels
    onnx_check.py compare NAME MODEL.onnx IMAGES PREDICTED [TOL]
        onnx.checker.check_model (full), the model's input and output as
        the export promises (images [N, C, H, W] float, N symbolic; logits
        [N, classes]), then ONNX Runtime's logits on IMAGES (images, U8
        pixels divided by 255 as mgc reads them, or a batch's x) against
        mgc's (PREDICTED: mgc predict's logits and pred, or a check mode
        dump's eval_logits and their argmax). Prints one line, "NAME: " and
        the largest difference
        (absolute, and relative to max(1, |logits|)), whether every
        prediction is the same. Exit 0 when the relative difference is
        <= TOL (default 1e-4) and the predictions agree, else 1.
    onnx_check.py run FILE
        each line of FILE as the command line above, in one process (the
        imports once); a compare's line printed after "ok" or "FAIL"
    onnx_check.py info MODEL.onnx
        the ops the model uses, one line ("Conv 2, Gemm 3, ..."), and its
        metadata, a key=value line each
"""
import contextlib
import gzip
import io
import json
import shlex
import struct
import sys

import numpy as np

_DT = {"F32": np.float32, "F64": np.float64, "U8": np.uint8, "I64": np.int64, "I32": np.int32}
_NAME = {np.dtype(v).str: k for k, v in _DT.items()}


def st_load(path, metadata=False):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.dtype(_DT[t["dtype"]]).newbyteorder("<")).reshape(t["shape"])
    return (out, header.get("__metadata__", {})) if metadata else out


def st_save(tensors, path, metadata=None):
    header, blobs, at = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAME[a.dtype.newbyteorder("<").str], "shape": list(a.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def random_images(n, c, h, w, seed):
    return np.random.default_rng(seed).random((n, c, h, w), dtype=np.float32)


def cmd_data(d, n, c, h, w, classes, seed):
    rng = np.random.default_rng(seed)
    for split, count in (("train", n), ("test", max(n // 4, 8))):
        st_save({"images": rng.random((count, c, h, w), dtype=np.float32),
                 "labels": rng.integers(0, classes, count).astype(np.uint8)}, "%s/%s.safetensors" % (d, split))


def cmd_batch(out, n, c, h, w, classes, seed):
    """A check-mode batch of inputs [n, c, h, w], or [n, c, h] where w is 0 (tokens)."""
    rng = np.random.default_rng(seed)
    st_save({"x": rng.random((n, c, h, w) if w else (n, c, h), dtype=np.float32), "y": rng.integers(0, classes, n).astype(np.int64)}, out)


def cmd_merge(ck, dump, out, options):
    tensors, meta = st_load(ck, metadata=True)
    tensors = dict(tensors)
    if dump != "-":
        for name, a in st_load(dump).items():
            if name in tensors:
                tensors[name] = a
    for opt, name in zip(options[::2], options[1::2]):
        if opt == "--drop":
            del tensors[name]
        elif opt == "--narrow":
            tensors[name] = tensors[name][:-1]
    st_save(tensors, out, meta)


def cmd_images(out, n, c, h, w, seed, idx=None):
    if idx:
        with gzip.open(idx, "rb") as f:
            magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
            pixels = np.frombuffer(f.read(n * rows * cols), dtype=np.uint8)
        st_save({"images": pixels.reshape(n, 1, rows, cols)}, out)
    else:
        st_save({"images": random_images(n, c, h, w, seed)}, out)


def cmd_compare(name, model_path, images_path, predicted_path, tol=1e-4):
    import onnx
    import onnxruntime as ort

    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    inputs, outputs = model.graph.input, model.graph.output
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    if [i.name for i in inputs] != ["images"] or [o.name for o in outputs] != ["logits"]:
        print("%s: the model's input and output are %s -> %s, not images -> logits"
              % (name, [i.name for i in inputs], [o.name for o in outputs]))
        return 1
    if dims(inputs[0])[0] != "N" or dims(outputs[0])[0] != "N" or len(dims(outputs[0])) != 2:
        print("%s: the batch dimension is not symbolic: images %s, logits %s" % (name, dims(inputs[0]), dims(outputs[0])))
        return 1
    given = st_load(images_path)
    x = given["images"] if "images" in given else given["x"]
    x = x.astype(np.float32) / np.float32(255) if x.dtype == np.uint8 else x.astype(np.float32)
    ref = st_load(predicted_path)
    if "eval_logits" in ref:
        want = ref["eval_logits"].astype(np.float64)
        want_pred = want.argmax(1)
    else:
        want, want_pred = ref["logits"].astype(np.float64), ref["pred"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"images": x})[0]
    if got.shape != want.shape:
        print("%s: ONNX Runtime's logits are %s, mgc's %s" % (name, got.shape, want.shape))
        return 1
    # a second batch size from the same model: the batch dimension is dynamic
    half = sess.run(["logits"], {"images": x[:3]})[0]
    diff = np.abs(got.astype(np.float64) - want)
    rel = (diff / np.maximum(1.0, np.abs(want))).max()
    same = int((got.argmax(1) == want_pred).sum())
    stable = np.abs(half - got[:3]).max()
    print("%s: max |diff| %.3g, relative %.3g, predictions %d/%d the same, batch of 3 within %.3g, |logits| up to %.3g"
          % (name, diff.max(), rel, same, len(want_pred), stable, np.abs(want).max()))
    return 0 if rel <= tol and same == len(want_pred) and stable <= tol * max(1.0, np.abs(want).max()) else 1


def cmd_info(model_path):
    import onnx

    model = onnx.load(model_path)
    ops = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(", ".join("%s %d" % kv for kv in sorted(ops.items())))
    print("opset=%s ir_version=%d" % (",".join("%s:%d" % (o.domain or "ai.onnx", o.version) for o in model.opset_import),
                                      model.ir_version))
    for p in model.metadata_props:
        print("%s=%s" % (p.key, p.value))
    for t in model.graph.initializer:
        print("initializer %s %s" % (t.name, list(t.dims)))
    return 0


def run(args):
    cmd, args = args[0], args[1:]
    if cmd == "data":
        cmd_data(args[0], *map(int, args[1:7]))
    elif cmd == "batch":
        cmd_batch(args[0], *map(int, args[1:7]))
    elif cmd == "merge":
        cmd_merge(args[0], args[1], args[2], args[3:])
    elif cmd == "images":
        cmd_images(args[0], *map(int, args[1:6]), *(args[6:7]))
    elif cmd == "compare":
        return cmd_compare(*args[0:4], *(float(a) for a in args[4:5]))
    elif cmd == "info":
        return cmd_info(args[0])
    elif cmd == "run":
        failed = 0
        with open(args[0]) as f:
            for line in f:
                words = shlex.split(line)
                if not words:
                    continue
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        rc = run(words)
                except Exception as e:  # a case that cannot run fails alone
                    rc, out = 1, io.StringIO("%s: %s: %s" % (" ".join(words[:2]), type(e).__name__, e))
                failed += rc != 0
                text = out.getvalue().strip()
                if words[0] == "compare" or rc:
                    print("%s %s" % ("ok  " if rc == 0 else "FAIL", text.replace("\n", "; ")))
        return 1 if failed else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
