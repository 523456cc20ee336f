#!/usr/bin/env python3
"""Inference speed: mgc's exported C library against ONNX Runtime and PyTorch
2.x eager, side by side in one run (issue 36, item 3).

    /usr/bin/python3 bench/bench_infer.py --python /path/to/venv/bin/python
    /usr/bin/python3 bench/bench_infer.py --python VENV/bin/python --nets resnet18 --seconds 10 --rounds 5

For each net (default lenet, resnet18, mobilenetv2) one checkpoint (random
weights, BatchNorm's statistics away from 0 and 1, --normalize's statistics:
tests/export_c.py; --checkpoints DIR takes NET.safetensors from DIR instead)
and three forms of it, all computing the same logits from the same images
(checked: each against the C library's, relative to the largest logit):

  C        mgc export --format c, built by its Makefile (mgc's kernel flags),
           timed by bench/infer_main.c (one context of --threads threads)
  ORT      mgc export --format onnx (this mgc, or --onnx-mgc's), ONNX Runtime
           with intra_op_num_threads = --threads, inter_op 1, sequential,
           every graph optimisation
  PyTorch  mgc export --format pytorch (this mgc, or --pytorch-mgc's), eager
           under torch.inference_mode(), torch.set_num_threads(--threads)

Each times one call on --batch images (throughput, images/s) and one call on
one image (latency, ms), calling again and again for --seconds after a
warm-up: the median call. The three take turns, --rounds times, so that each
meets the machine's slow and fast phases alike; a form's figure is the median
of its rounds' (every round is printed). All three include the input's
normalisation. Where a form cannot be had (no exporter for it in this mgc, no
onnxruntime or torch 2.x under --python) its column says so.

The C library's memory: its weights, what it makes once, and its activations
a thread for the images a thread runs together (MODEL_MAX_BATCH, mgc export's
choice: model.c's header says them, and the memory plan's peak).

Prints a table and a last line `JSON {...}`. Numbers mean little on a busy
machine: on this project's 2 cores, another build or test halves them.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the ORT and PyTorch sides, run under --python: time one form, print one JSON line
TIMER = r'''
import json, sys, time, importlib.util
form, path, threads, batch, seconds, ck, images_out = sys.argv[1:8]
threads, batch, seconds = int(threads), int(batch), float(seconds)

def timed(call, warm):
    for _ in range(warm):
        call()
    t, t0 = [], time.perf_counter()
    while len(t) < 5 or time.perf_counter() - t0 < seconds:
        a = time.perf_counter()
        call()
        t.append(time.perf_counter() - a)
    t.sort()
    return t[len(t) // 2], t[0], len(t)

import numpy as np
rng = np.random.default_rng(12345)
if form == "ort":
    import onnxruntime as ort
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
    shape = [d if isinstance(d, int) else 1 for d in s.get_inputs()[0].shape]
    x = rng.integers(0, 256, size=[batch] + shape[1:]).astype(np.float32) / 255
    run = lambda x: s.run(None, {"images": x})[0]
    version = "onnxruntime " + ort.__version__
else:
    import torch
    torch.set_num_threads(threads)
    spec = importlib.util.spec_from_file_location("exported", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    net = m.load(ck)
    shape = (1,) + tuple(m.INPUT_SHAPE)
    x = rng.integers(0, 256, size=[batch] + list(shape[1:])).astype(np.float32) / 255
    def run(x):
        with torch.inference_mode():
            return net(m.transform(torch.from_numpy(x))).numpy()
    version = "torch " + torch.__version__
one = x[:1].copy()
med, best, calls = timed(lambda: run(x), 3)
lmed, lbest, lcalls = timed(lambda: run(one), 20)
np.save(images_out + ".logits.npy", run(x))
np.save(images_out + ".images.npy", x)
print(json.dumps({"images_per_s": batch / med, "best_images_per_s": batch / best, "calls": calls,
                  "latency_ms": 1e3 * lmed, "best_latency_ms": 1e3 * lbest, "latency_calls": lcalls, "version": version}))
'''


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def can_export(mgc, fmt):
    """whether this mgc writes --format fmt (an mgc without it says 'does not export')"""
    r = sh([mgc, "export", "/nonexistent.safetensors", "--format", fmt, "--out", "/nonexistent/x"])
    return "does not export" not in r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default="lenet,resnet18,mobilenetv2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement, after its warm-up")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", help="the interpreter with onnxruntime and torch 2.x (a bench virtual environment)")
    ap.add_argument("--mgc", default=os.path.join(ROOT, "mgc"))
    ap.add_argument("--onnx-mgc", help="an mgc that exports ONNX (default: --mgc, where it does)")
    ap.add_argument("--pytorch-mgc", help="an mgc that exports PyTorch (default: --mgc, where it does)")
    ap.add_argument("--checkpoints", help="a directory of NET.safetensors to use instead of random ones")
    ap.add_argument("--keep", help="a directory for the exports and logs (default: a temporary one, removed)")
    a = ap.parse_args()

    work = a.keep or tempfile.mkdtemp(prefix="bench_infer.")
    os.makedirs(work, exist_ok=True)
    onnx_mgc = a.onnx_mgc or (a.mgc if can_export(a.mgc, "onnx") else None)
    torch_mgc = a.pytorch_mgc or (a.mgc if can_export(a.mgc, "pytorch") else None)
    env = dict(os.environ, MGC=a.mgc)
    results, rows = {}, []
    for net in a.nets.split(","):
        d = os.path.join(work, net)
        os.makedirs(d, exist_ok=True)
        ck = os.path.join(a.checkpoints, net + ".safetensors") if a.checkpoints else os.path.join(d, "ck.safetensors")
        if not a.checkpoints:
            subprocess.run([sys.executable, os.path.join(ROOT, "tests/export_c.py"), "checkpoint", os.path.join(ROOT, "nets", net + ".net"),
                            ck, "0", "--normalize", "0.2860,0.3530"], check=True, cwd=ROOT, env=env)
        r = {"C": None, "ORT": None, "PyTorch": None, "notes": {}}
        # the C library
        lib = os.path.join(d, "c")
        shutil.rmtree(lib, ignore_errors=True)
        sh([a.mgc, "export", ck, "--format", "c", "--out", lib], check=True)   # its own pieces (MODEL_MAX_BATCH)
        sh(["make", "-s", "-C", lib], check=True)
        blas = "-lopenblas" if "-lopenblas" in open(os.path.join(lib, "Makefile")).read() else ""
        sh(f"cc -O2 -I{lib} {ROOT}/bench/infer_main.c {lib}/libmodel.a {blas} -lm -lpthread -o {lib}/infer_main", shell=True, check=True)
        head = open(os.path.join(lib, "model.c")).read(3000)
        lane = re.search(r"#define MODEL_MAX_BATCH (\d+)", open(os.path.join(lib, "model.h")).read())
        m = re.search(r"memory +weights ([\d.]+ MB), made once ([\d.]+ MB), activations ([\d.]+ MB(?: a thread)?).*?([\d.]+ MB) live at once", head, re.S)
        r["memory"] = dict(zip(["weights", "made_once", "activations", "live_peak"], m.groups())) if m else None
        if r["memory"] and lane:
            r["memory"]["images_a_thread"] = int(lane.group(1))
        forms = {"C": [f"{lib}/infer_main", f"{lib}/model.safetensors", str(a.threads), str(a.batch), str(a.seconds)]}
        if onnx_mgc and a.python:
            onnx = os.path.join(d, "model.onnx")
            e = sh([onnx_mgc, "export", ck, "--format", "onnx", "--out", onnx])
            if e.returncode == 0:
                forms["ORT"] = [a.python, "-c", TIMER, "ort", onnx, str(a.threads), str(a.batch), str(a.seconds), ck, os.path.join(d, "ort")]
            else:
                r["notes"]["ORT"] = e.stderr.strip()[:200]
        else:
            r["notes"]["ORT"] = "no ONNX exporter in this mgc (--onnx-mgc)" if a.python else "no --python"
        if torch_mgc and a.python:
            py = os.path.join(d, "exported_" + net + ".py")
            e = sh([torch_mgc, "export", ck, "--format", "pytorch", "--out", py])
            if e.returncode == 0:
                forms["PyTorch"] = [a.python, "-c", TIMER, "torch", py, str(a.threads), str(a.batch), str(a.seconds), ck, os.path.join(d, "torch")]
            else:
                r["notes"]["PyTorch"] = e.stderr.strip()[:200]
        else:
            r["notes"]["PyTorch"] = "no PyTorch exporter in this mgc (--pytorch-mgc)" if a.python else "no --python"
        runs = {k: [] for k in forms}
        for rnd in range(a.rounds):
            for k, cmd in forms.items():
                out = sh(cmd)
                if out.returncode != 0:
                    r["notes"][k] = (out.stderr.strip().splitlines() or ["failed"])[-1][:200]
                    continue
                v = json.loads(out.stdout.strip().splitlines()[-1])
                runs[k].append(v)
                print(f"{net:12} round {rnd + 1} {k:8} {v['images_per_s']:10.1f} images/s  {v['latency_ms']:8.3f} ms", flush=True)
        for k, v in runs.items():
            if v:
                r[k] = {"images_per_s": statistics.median(x["images_per_s"] for x in v),
                        "latency_ms": statistics.median(x["latency_ms"] for x in v),
                        "rounds": v, "version": v[0].get("version", "mgc export --format c")}
        # the same logits: ORT's and PyTorch's against the C library's on their own images
        for k, tag in (("ORT", "ort"), ("PyTorch", "torch")):
            img = os.path.join(d, tag + ".images.npy")
            if r[k] and os.path.exists(img):
                check = sh([a.python, "-c", f"""
import numpy as np, struct, json, subprocess
x = np.load('{img}'); y = np.load('{d}/{tag}.logits.npy')
hdr = json.dumps({{"images": {{"dtype": "F32", "shape": list(x.shape), "data_offsets": [0, x.nbytes]}}}}).encode()
hdr += b" " * (-len(hdr) % 8)
open('{d}/{tag}.in.safetensors', 'wb').write(struct.pack('<Q', len(hdr)) + hdr + x.astype('<f4').tobytes())
subprocess.run(['{lib}/mgc_predict', '{d}/{tag}.in.safetensors', '{d}/{tag}.c.safetensors'], check=True, capture_output=True, cwd='{lib}')
b = open('{d}/{tag}.c.safetensors', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
c = np.frombuffer(b[8 + n:], dtype='<f4').reshape(y.shape)
print(float(np.abs(c - y).max() / np.abs(c).max()))"""])
                if check.returncode == 0:
                    r[k]["max_rel_diff_vs_C"] = float(check.stdout.strip())
                else:
                    r["notes"][k + " check"] = check.stderr.strip()[-200:]
        results[net] = r

    def fmt(v, key, f):
        return f.format(v[key]) if v else "-"
    print(f"\n{a.batch} images a call for throughput, 1 for latency; {a.threads} threads; median of {a.rounds} rounds")
    print(f"{'net':12} {'C img/s':>10} {'ORT img/s':>10} {'PyTorch':>10} {'C/ORT':>6} {'C/PT':>6} | {'C ms':>8} {'ORT ms':>8} {'PT ms':>8}")
    for net, r in results.items():
        c, o, p = r["C"], r["ORT"], r["PyTorch"]
        ratio = lambda x: f"{c['images_per_s'] / x['images_per_s']:.2f}" if c and x else "-"
        print(f"{net:12} {fmt(c, 'images_per_s', '{:10.0f}')} {fmt(o, 'images_per_s', '{:10.0f}')} {fmt(p, 'images_per_s', '{:10.0f}')} "
              f"{ratio(o):>6} {ratio(p):>6} | {fmt(c, 'latency_ms', '{:8.3f}')} {fmt(o, 'latency_ms', '{:8.3f}')} {fmt(p, 'latency_ms', '{:8.3f}')}")
        if r.get("memory"):
            mm = r["memory"]
            print(f"{'':12} C library memory: weights {mm['weights']}, made once {mm['made_once']}, activations {mm['activations']} "
                  f"for {mm.get('images_a_thread', '?')} images (at most {mm['live_peak']} live at once)")
        for k in ("ORT", "PyTorch"):
            if r[k] and "max_rel_diff_vs_C" in r[k]:
                print(f"{'':12} {k} logits against C's: {r[k]['max_rel_diff_vs_C']:.2g} of the largest")
        for k, n in r["notes"].items():
            print(f"{'':12} {k}: {n}")
    print("JSON " + json.dumps({"threads": a.threads, "batch": a.batch, "rounds": a.rounds, "seconds": a.seconds, "nets": results}))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
