#!/usr/bin/python3
"""CPU speed, in one run: mgc against PyTorch on LeNet and ResNet-18, with the
sgemm roof, peak memory and mgc's ResNet-18 step profile by kind.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/bench_cpu.py          # about two minutes on 2 cores
    /usr/bin/python3 bench/bench_cpu.py --quick                              # smoke run, about a minute

On an otherwise idle machine it runs, each in mgc (./mgc) and in PyTorch
(bench/torch_lenet.py, bench/torch_resnet.py: tests/torch/models.py's twins of
the .net files), with the same batch, learning rate, thread count, data and
OPENBLAS_CORETYPE (default: SkylakeX on AVX-512 CPUs, Haswell on AVX2 ones; set for every process):

  lenet         nets/lenet.net, batch 256, T threads (default nproc)
  lenet-1t      the same on one thread
  resnet18      nets/resnet18.net (the tutorial's stem: 7x7/2 conv, max-pool), batch 256
  resnet18-s    nets/resnet18.net --set small_stem=true (3x3 stem, 28x28 maps), batch 32

and prints per case: examples/s of each (the median over epochs of the
training steps' throughput from each --log: no start-up, no test pass; each
side run --repeat times (default 2), alternating, its best run kept), the
ratio mgc/PyTorch, GFLOP/s of each as a share of the sgemm roof (OpenBLAS on
2048^3 with the case's threads, measured by bench/sgemm_roof.c just before
each case, since a shared machine's speed drifts within a run; a training
step is counted as 3x the multiply-adds x 2 of the convolutions and linear
layers, the same count for both), and peak resident memory of each process.
Then mgc's ResNet-18 step (MGC_PROFILE=1) grouped by kind: GEMM, data
movement (im2col, col2im, packing), convolution kernels (chunked: im2col +
CBLAS in cache; direct loops), normalisation, pooling, element-wise,
loss, SGD update. Then mgc's start-up: seconds from its start to the first
training step (`-v`), with an empty kernel cache (a fresh XDG_CACHE_HOME:
every kernel compiled) and with the cache that run left (warm). A last line
`JSON {...}` holds all of it.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))



def blas_core():
    """OPENBLAS_CORETYPE for every run: the environment's, else the newest kernels this CPU runs
    (SkylakeX with AVX-512 F/BW/DQ/VL, else Haswell with AVX2 and FMA, else Prescott), as mgc chooses."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = []
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl")):
        return "SkylakeX"
    return "Haswell" if "avx2" in flags and "fma" in flags else "Prescott"

def run(cmd, env, out_path):
    """Runs cmd; returns (exit status, peak resident MB of that process and
    the children it waited for)."""
    with open(out_path, "w") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024.0


def median_rate(log_path, skip_first):
    """(median examples/s, last test accuracy, peak resident MB as the process itself
    saw it (VmHWM), or None) from a --log file."""
    rows = [json.loads(line) for line in open(log_path) if line.strip()]
    rates = [r["examples_per_s"] for r in rows if r.get("examples_per_s")]
    if skip_first and len(rates) > 1:
        rates = rates[1:]   # the first epoch pays for first touches of memory
    peaks = [r["peak_resident_mb"] for r in rows if r.get("peak_resident_mb")]
    return (statistics.median(rates) if rates else None, rows[-1].get("test_acc") if rows else None,
            max(peaks) if peaks else None)


def train_flops(net, sets):
    """Multiply-adds of the convolutions and linear layers per example, x2
    (FLOPs) x3 (forward, input gradient, weight gradient)."""
    import torch
    import models
    model, shape = models.build(net, torch.float32, tuple(sets))
    macs = [0]

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
            macs[0] += out.numel() * k
        elif isinstance(mod, torch.nn.Linear):
            macs[0] += out.numel() * mod.in_features

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(hook)
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1,) + tuple(shape)))
    return 6.0 * macs[0]


KINDS = [
    ("GEMM", r"^gemm$"),
    ("data movement", r"im2col|col2im|pack|unpack|transpose|dense_weights|dense_grad_w|copy"),
    ("convolution kernels", r"^conv2d_(?!dense)"),   # GEMMs inside (chunked, Winograd) or loops; the dense form's own steps are above or element-wise
    ("normalisation", r"^bn_|batchnorm"),
    ("pooling", r"pool"),
    ("loss", r"softmax|cross_entropy|correct"),
    ("SGD update", r"^sgd"),
    ("collectives", r"allreduce"),
    ("element-wise", r"."),
]


def profile_by_kind(text):
    """MGC_PROFILE=1's table -> {kind: ms per step}, steps per run."""
    kinds = {k: 0.0 for k, _ in KINDS}
    runs = None
    for line in text.splitlines():
        m = re.match(r"profile \(.*\): (\d+) runs", line)
        if m:
            runs = int(m.group(1))
            continue
        m = re.match(r"\s+\d+\s+%-?\d+\s+[\d.]+%\s+([\d.]+)\s+(.+)$", line)
        if not m:
            continue
        ms, what = float(m.group(1)), m.group(2).strip()
        name = re.sub(r"^k\d+_", "", what)
        for kind, pattern in KINDS:
            if re.search(pattern, name):
                kinds[kind] += ms
                break
    return kinds, runs


def add_common(ap, quick_help):
    """The options every CPU benchmark takes: threads, data, --quick."""
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--data", default=os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist")))
    ap.add_argument("--quick", action="store_true", help=quick_help)


def bench_env(a):
    """(mgc, python, env): the binary ($MGC), PyTorch's interpreter ($PYTHON) and
    the environment every run takes (OPENBLAS_CORETYPE default blas_core(), the data,
    no MGC_PROFILE)."""
    mgc = os.environ.get("MGC", os.path.join(ROOT, "mgc"))
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    env = dict(os.environ, OPENBLAS_CORETYPE=blas_core(), MGC_DATA=a.data)
    env.pop("MGC_PROFILE", None)
    return mgc, python, env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common(ap, "smoke run: small subsets, one epoch")
    ap.add_argument("--cases", default="lenet,lenet-1t,resnet18,resnet18-s")
    ap.add_argument("--lenet-epochs", type=int, default=2)
    ap.add_argument("--resnet-epochs", type=int, default=3)
    ap.add_argument("--resnet-limit-train", type=int, default=2560)
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of each side, alternating (mgc, torch, mgc, ...): each side's best is kept, so that "
                         "a burst of load from elsewhere on a shared machine slows neither side's figure")
    a = ap.parse_args()
    mgc, python, env = bench_env(a)
    T = a.threads
    tmp = tempfile.mkdtemp(prefix="mgc-bench-")

    # the roof, in this run
    roof_bin = os.path.join(tmp, "sgemm_roof")
    subprocess.run(["cc", "-O2", "-o", roof_bin, os.path.join(HERE, "sgemm_roof.c"), "-lopenblas"], check=True)
    roof_out = subprocess.run([roof_bin, str(T)], env=env, capture_output=True, text=True, check=True).stdout.split()
    roof, core = float(roof_out[1]), roof_out[3]
    print(f"sgemm roof: {roof:.0f} GFLOP/s on {T} thread{'s' if T != 1 else ''} (OpenBLAS core {core}, 2048^3)")

    le, re_, rl = (1, 1, 512) if a.quick else (a.lenet_epochs, a.resnet_epochs, a.resnet_limit_train)
    lenet_limit = ["--limit-train", "10240"] if a.quick else []
    cases = {
        "lenet": ("nets/lenet.net", [], 256, T, le, lenet_limit + ["--limit-test", "2000"]),
        "lenet-1t": ("nets/lenet.net", [], 256, 1, le, lenet_limit + ["--limit-test", "2000"]),
        "resnet18": ("nets/resnet18.net", [], 256, T, re_, ["--limit-train", str(rl), "--limit-test", "1000"]),
        "resnet18-s": ("nets/resnet18.net", ["small_stem=true"], 32, T, re_,
                       ["--limit-train", str(max(rl // 8, 128)), "--limit-test", "256"]),
    }
    results = {"roof_gflops": roof, "openblas_core": core, "threads": T, "cases": {}}
    print(f"{'case':<11} {'batch':>5} {'thr':>3} {'mgc ex/s':>9} {'torch ex/s':>10} {'ratio':>6}  "
          f"{'mgc GF/s':>8} {'roof':>5} {'torch GF/s':>10} {'roof':>5} {'roof GF/s':>9}  {'mgc MB':>6} {'torch MB':>8}  acc mgc/torch")
    for name in a.cases.split(","):
        net, sets, batch, threads, epochs, extra = cases[name]
        common = ["--epochs", str(epochs), "--batch-size", str(batch), "--threads", str(threads), "--lr", "0.1"] + extra
        mlog, tlog = os.path.join(tmp, name + ".mgc.jsonl"), os.path.join(tmp, name + ".torch.jsonl")
        mcmd = [mgc, net] + sum((["--set", s] for s in sets), []) + common + ["--data", a.data, "--log", mlog]
        script = "torch_lenet.py" if "lenet" in net else "torch_resnet.py"
        tcmd = [python, os.path.join(HERE, script)] + (["--net", net] if script == "torch_resnet.py" else [])
        tcmd += sum((["--set", s] for s in sets), []) + common + ["--data", a.data, "--log", tlog]
        # kernels compiled first (--epochs 0), so that the peak memory is the run's, not the C compiler's
        run([mgc, net] + sum((["--set", s] for s in sets), []) + ["--epochs", "0", "--batch-size", str(batch),
            "--threads", str(threads)], env, mlog + ".warm")
        roof_here = float(subprocess.run([roof_bin, str(threads)], env=env, capture_output=True, text=True,
                                         check=True).stdout.split()[1])
        best = {"m": (None, None, None), "t": (None, None, None)}   # rate, accuracy, peak MB
        failed = False
        for rep in range(max(1, a.repeat)):
            for side, cmd, log in (("m", mcmd, mlog), ("t", tcmd, tlog)):
                if os.path.exists(log):
                    os.remove(log)
                rc, mem = run(cmd, env, f"{log}.{rep}.out")
                if rc:
                    print(f"{name}: a run failed ({'mgc' if side == 'm' else 'torch'} exit {rc}); see {tmp}")
                    failed = True
                    break
                rate, acc, peak = median_rate(log, epochs > 1)
                # the process's own peak: wait4's counts the pages a fork copied from this
                # Python process (with PyTorch loaded, a floor of about 250 MB)
                mem = peak if peak else mem
                if best[side][0] is None or (rate or 0) > best[side][0]:
                    best[side] = (rate, acc, mem)
            if failed:
                break
        if failed:
            continue
        (rate_m, acc_m, mem_m), (rate_t, acc_t, mem_t) = best["m"], best["t"]
        flops = train_flops(net, sets)
        gf_m, gf_t = rate_m * flops / 1e9, rate_t * flops / 1e9
        print(f"{name:<11} {batch:>5} {threads:>3} {rate_m:>9,.0f} {rate_t:>10,.0f} {rate_m / rate_t:>5.2f}x  "
              f"{gf_m:>8.1f} {gf_m / roof_here:>4.0%} {gf_t:>10.1f} {gf_t / roof_here:>4.0%} {roof_here:>9.0f}  "
              f"{mem_m:>6.0f} {mem_t:>8.0f}  {acc_m if acc_m is None else round(acc_m, 3)}/{acc_t if acc_t is None else round(acc_t, 3)}")
        results["cases"][name] = {"net": " ".join([net] + sets), "batch": batch, "threads": threads,
                                  "mgc_examples_per_s": rate_m, "torch_examples_per_s": rate_t,
                                  "ratio": rate_m / rate_t, "train_mflop_per_example": flops / 1e6,
                                  "mgc_gflops": gf_m, "torch_gflops": gf_t, "roof_gflops": roof_here,
                                  "mgc_peak_mb": mem_m, "torch_peak_mb": mem_t,
                                  "mgc_test_acc": acc_m, "torch_test_acc": acc_t}

    # where mgc's ResNet-18 step goes
    if "resnet18" in a.cases.split(","):
        out = os.path.join(tmp, "profile.out")
        penv = dict(env, MGC_PROFILE="1")
        run([mgc, "nets/resnet18.net", "--epochs", "1", "--limit-train", "1280" if not a.quick else "512",
             "--limit-test", "0", "--threads", str(T), "--data", a.data], penv, out)
        kinds, runs = profile_by_kind(open(out).read())
        total = sum(kinds.values())
        print(f"mgc ResNet-18 step by kind (batch 256, {T} threads, MGC_PROFILE=1, {runs} steps): {total:.0f} ms")
        for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
            if ms > 0:
                print(f"  {kind:<15} {ms:8.1f} ms  {ms / total:6.1%}")
        results["resnet18_profile_ms"] = kinds
    # start-up: to the first training step, cold (empty kernel cache) and warm
    startup = {}
    for net in ("nets/lenet.net", "nets/resnet18.net"):
        cache = tempfile.mkdtemp(prefix="cache-", dir=tmp)
        senv = dict(env, XDG_CACHE_HOME=cache)
        got = []
        for state in ("cold", "warm"):
            out = os.path.join(tmp, f"startup.{os.path.basename(net)}.{state}.out")
            rc, _ = run([mgc, net, "-v", "--epochs", "1", "--limit-train", "256", "--limit-test", "0",
                         "--threads", str(T), "--data", a.data], senv, out)
            m = re.search(r"first training step starts ([0-9.]+) s after", open(out).read())
            got.append(float(m.group(1)) if rc == 0 and m else None)
        startup[net] = {"cold_s": got[0], "warm_s": got[1]}
        print(f"mgc start-up, {net}: {got[0]} s with an empty kernel cache, {got[1]} s warm (to the first training step)")
    results["startup"] = startup
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
