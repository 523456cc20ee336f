#!/usr/bin/python3
"""bf16 on the CPU, in one run: mgc --precision bf16 against mgc fp32 and
against PyTorch's bf16 autocast, on ResNet-18 with the small stem and with the
tutorial's stem.

    PYTHON=/work/venv-torch/bin/python OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/bench_bf16.py
    /usr/bin/python3 bench/bench_bf16.py --quick        # smoke run

On an otherwise idle machine it runs, for each case, four trainings with the
same batch, learning rate, thread count, data and OPENBLAS_CORETYPE (default
SkylakeX): mgc fp32, mgc --precision bf16, PyTorch fp32 and PyTorch under
torch.autocast(dtype=bfloat16) (bench/torch_resnet.py --autocast bf16; PYTHON
picks the interpreter, e.g. a virtual environment with PyTorch 2.x: the
issue's yardstick). Each is run --repeat times (default 2), the four in turn,
the best kept; the rate is the median over epochs after the first of the
training steps' examples/s (--log). Cases:

  resnet18-s   nets/resnet18.net --set small_stem=true, batch 32
  resnet18     nets/resnet18.net (7x7/2 stem, max pool), batch 256

It prints examples/s of each and the ratios bf16/fp32 (mgc) and mgc bf16 /
PyTorch bf16, with the CPU's bf16 path (mgc: AVX512_BF16 or emulated), and the
one-thread GFLOP/s of mgc's bf16 GEMM and OpenBLAS's sgemm on a square
product and the convolutions' shapes (bench/sbgemm_roof.c). A last line `JSON {...}` holds it all.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_cpu import add_common, bench_env, median_rate, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common(ap, "smoke run: small subsets, two epochs")
    ap.add_argument("--cases", default="resnet18-s,resnet18")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    mgc, python, env = bench_env(a)
    T = a.threads
    tmp = tempfile.mkdtemp(prefix="mgc-bench-bf16-")
    torch_version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True, env=env).stdout.strip()

    roof_bin = os.path.join(tmp, "sbgemm_roof")
    subprocess.run(["cc", "-O2", "-D_GNU_SOURCE", "-I", os.path.join(ROOT, "runtime"), "-o", roof_bin,
                    os.path.join(HERE, "sbgemm_roof.c"), os.path.join(ROOT, "runtime", "bgemm.c"), "-lopenblas", "-lm"],
                   check=True)
    roof = subprocess.run([roof_bin], env=env, capture_output=True, text=True).stdout.strip()
    print(roof or "(bench/sbgemm_roof.c failed)")

    epochs = 2 if a.quick else a.epochs
    cases = {
        "resnet18-s": ("nets/resnet18.net", ["small_stem=true"], 32, 256 if a.quick else 640, 256),
        "resnet18": ("nets/resnet18.net", [], 256, 768 if a.quick else 2560, 1000),
    }
    results = {"threads": T, "torch": torch_version, "gemm_roof": roof, "cases": {}}
    for name in a.cases.split(","):
        net, sets, batch, limit, limit_test = cases[name]
        setargs = sum((["--set", s] for s in sets), [])
        common = ["--epochs", str(epochs), "--batch-size", str(batch), "--threads", str(T), "--lr", "0.1",
                  "--limit-train", str(limit), "--limit-test", str(limit_test), "--data", a.data]
        for p in ("fp32", "bf16"):   # kernels compiled first
            run([mgc, net] + setargs + ["--epochs", "0", "--batch-size", str(batch), "--precision", p], env,
                os.path.join(tmp, f"{name}.{p}.warm"))
        sides = {
            "mgc fp32": [mgc, net] + setargs + common,
            "mgc bf16": [mgc, net] + setargs + common + ["--precision", "bf16"],
            "torch fp32": [python, os.path.join(HERE, "torch_resnet.py"), "--net", net] + setargs + common,
            "torch bf16": [python, os.path.join(HERE, "torch_resnet.py"), "--net", net] + setargs + common + ["--autocast", "bf16"],
        }
        best, path = {}, ""
        for rep in range(max(1, a.repeat)):
            for side, cmd in sides.items():
                log = os.path.join(tmp, f"{name}.{side.replace(' ', '_')}.jsonl")
                if os.path.exists(log):
                    os.remove(log)
                out = f"{log}.{rep}.out"
                rc, _ = run(cmd + ["--log", log], env, out)
                if rc:
                    print(f"{name}: {side} failed (exit {rc}); see {out}")
                    continue
                if side == "mgc bf16" and not path:
                    path = next((line.split("(")[-1].rstrip(")\n") for line in open(out) if "precision bf16" in line), "")
                rate, acc, _ = median_rate(log, epochs > 1)
                if rate and rate > best.get(side, (0, None))[0]:
                    best[side] = (rate, acc)
        if len(best) < 4:
            continue
        r = {k: v[0] for k, v in best.items()}
        print(f"{name} (batch {batch}, {T} threads, {epochs} epochs of {limit}; mgc bf16: {path}; PyTorch {torch_version}):")
        for side in sides:
            print(f"  {side:<11} {r[side]:>9,.1f} examples/s   test acc {best[side][1]}")
        print(f"  mgc bf16 / mgc fp32     {r['mgc bf16'] / r['mgc fp32']:.2f}x")
        print(f"  mgc bf16 / torch bf16   {r['mgc bf16'] / r['torch bf16']:.2f}x")
        print(f"  torch bf16 / torch fp32 {r['torch bf16'] / r['torch fp32']:.2f}x")
        results["cases"][name] = {"batch": batch, "examples_per_s": r, "bf16_path": path,
                                  "mgc_bf16_over_fp32": r["mgc bf16"] / r["mgc fp32"],
                                  "mgc_bf16_over_torch_bf16": r["mgc bf16"] / r["torch bf16"]}
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
