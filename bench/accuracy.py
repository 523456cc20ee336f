#!/usr/bin/python3
"""Test accuracy over seeds, mgc beside PyTorch: is a difference in one run's
accuracy a difference between the two, or the spread of training itself?

    /usr/bin/python3 bench/accuracy.py --net lenet --seeds 0-15              # about 25 minutes on 2 cores
    /usr/bin/python3 bench/accuracy.py --net resnet18 --epochs 1 --seeds 0-5 --devices cpu:2 --torch-shards 2

For every seed it trains the net in mgc (./mgc NET --seed S, with the given
epochs, batch, learning rate, devices) and in PyTorch (bench/torch_lenet.py or
bench/torch_resnet.py, the same settings; --torch-shards K gives PyTorch the
semantics of K data-parallel replicas: BatchNorm on each shard alone), one
after the other with the same threads and OPENBLAS_CORETYPE (default
the newest kernels the CPU runs). The two start from different initial weights (each its own random
generator, the same distributions) and see the batches in different orders:
the comparison is between the two distributions of outcomes, not run by run.

It prints a row per seed (the last epoch's test accuracy of each, and the
last two epochs' of mgc, to show how far one epoch moves it), then per side:
mean, standard deviation, median, min, max, the share of seeds at or above
--threshold; and the difference of the means with Welch's t statistic and a
95% interval. A last line `JSON {...}` holds all of it. --no-torch runs mgc
alone, --no-mgc PyTorch alone. --torch-recalibrate-bn B adds a column: the
same PyTorch weights tested with BatchNorm's running statistics recomputed
over B training batches (how much of the spread is the statistics').
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cpu import blas_core  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

NETS = {"lenet": ("nets/lenet.net", "bench/torch_lenet.py", 10),
        "resnet18": ("nets/resnet18.net", "bench/torch_resnet.py", 1)}


def seed_list(text):
    """'0-7' or '0,3,5' or '0-3,9' -> [ints]"""
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise argparse.ArgumentTypeError(f"no seeds in '{text}'")
    return out


def last_accuracies(log_path):
    """The test accuracy of every epoch from a --log JSONL file (mgc's and the baselines' alike)."""
    try:
        rows = [json.loads(line) for line in open(log_path) if line.strip()]
    except (OSError, ValueError):
        return []
    return [r.get("test_acc") for r in rows]


def run(cmd, env, out_path):
    with open(out_path, "w") as out:
        return subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode


def summary(xs, threshold):
    if not xs:
        return None
    return {"n": len(xs), "mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "at_or_above": sum(x >= threshold for x in xs) / len(xs)}


def t_quantile_975(df):
    """Student's t 0.975 quantile: a table to 30 degrees of freedom, then the normal's with a correction."""
    table = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
             2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
             2.045, 2.042]
    if df < 1:
        return float("nan")
    if df <= 30:
        return table[int(math.floor(df)) - 1]
    return 1.960 + 2.4 / df


def welch(a, b):
    """(difference of means a - b, t, degrees of freedom, 95% half-width), or None."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return {"diff": d, "t": float("inf") if d else 0.0, "df": float("nan"), "half_width": 0.0}
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return {"diff": d, "t": d / se, "df": df, "half_width": t_quantile_975(df) * se}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--net", choices=sorted(NETS), default="lenet")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a net parameter, for both sides")
    ap.add_argument("--seeds", type=seed_list, default=seed_list("0-7"))
    ap.add_argument("--epochs", type=int, default=None, help="default: 10 for LeNet, 1 for ResNet-18")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--lr-schedule", default="cosine", help="cosine (mgc's default), constant or step:E1,E2,... (both sides)")
    ap.add_argument("--lr-per", choices=("epoch", "step"), default=None,
                    help="how often the schedule moves (both sides; default mgc's: step for cosine, epoch for step:...)")
    ap.add_argument("--warmup", type=int, default=0, help="linear warmup steps (both sides)")
    ap.add_argument("--devices", default="cpu:1", help="mgc's devices (cpu:N)")
    ap.add_argument("--sync-bn", action="store_true", help="mgc's --sync-bn")
    ap.add_argument("--torch-shards", type=int, default=1, help="PyTorch's --shards (per-replica BatchNorm of K replicas)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--threshold", type=float, default=0.84, help="the accuracy a run is asked to reach")
    ap.add_argument("--limit-train", type=int, default=None, help="the first N training examples only (a smoke run)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-mgc", action="store_true")
    ap.add_argument("--torch-recalibrate-bn", type=int, default=0, metavar="B",
                    help="PyTorch's --recalibrate-bn: also its accuracy with BatchNorm statistics recomputed over B batches")
    ap.add_argument("--mgc", default=os.path.join(ROOT, "mgc"))
    ap.add_argument("--data", default=os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist")))
    a = ap.parse_args()
    net, baseline, epochs = NETS[a.net]
    if a.epochs is None:
        a.epochs = epochs
    env = dict(os.environ)
    env["OPENBLAS_CORETYPE"] = blas_core()
    if a.no_mgc and a.no_torch:
        ap.error("--no-mgc and --no-torch leave nothing to run")
    if not a.no_mgc and not os.path.isfile(a.mgc):
        sys.exit(f"accuracy.py: no mgc at {a.mgc} (run make)")
    common = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--momentum", str(a.momentum),
              "--lr-schedule", a.lr_schedule, "--warmup", str(a.warmup)] + (["--lr-per", a.lr_per] if a.lr_per else [])
    if a.limit_train:
        common += ["--limit-train", str(a.limit_train)]
    sets = [x for s in a.set for x in ("--set", s)]
    per = a.lr_per or ("step" if a.lr_schedule == "cosine" else "epoch")
    recipe = f" ({a.lr_schedule}{'' if a.lr_schedule == 'constant' else f' per {per}'}" \
             f"{f', warmup {a.warmup} steps' if a.warmup else ''})"
    print(f"{net}: {a.epochs} epoch{'s' if a.epochs != 1 else ''}, batch {a.batch_size}, lr {a.lr}{recipe}"
          f"{f', momentum {a.momentum}' if a.momentum else ''}, seeds "
          f"{a.seeds[0]}..{a.seeds[-1]} ({len(a.seeds)})"
          f"{'' if a.no_mgc else f'; mgc on {a.devices}' + (' --sync-bn' if a.sync_bn else '')}"
          f"{'' if a.no_torch else f', PyTorch with {a.torch_shards} shard' + ('s' if a.torch_shards != 1 else '')}"
          f"; {a.threads} threads, OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mgc-accuracy-") as tmp:
        recal = a.torch_recalibrate_bn > 0 and not a.no_torch
        print(f"{'seed':>5} {'mgc':>7} {'(epoch before)':>15} {'PyTorch':>8}" + (f" {'(recalibrated)':>15}" if recal else ""),
              flush=True)
        for s in a.seeds:
            row = {"seed": s, "mgc": None, "mgc_before": None}
            if not a.no_mgc:
                log = os.path.join(tmp, f"mgc.{s}.jsonl")
                cmd = [a.mgc, net, *common, "--seed", str(s), "--devices", a.devices, "--threads", str(a.threads),
                       "--data", a.data, "--log", log, *sets] + (["--sync-bn"] if a.sync_bn else [])
                rc = run(cmd, env, os.path.join(tmp, f"mgc.{s}.out"))
                accs = last_accuracies(log)
                row["mgc"] = accs[-1] if rc == 0 and accs else None
                row["mgc_before"] = accs[-2] if rc == 0 and len(accs) > 1 else None
                if rc != 0:
                    print(f"  mgc failed (exit {rc}): {open(os.path.join(tmp, f'mgc.{s}.out')).read()[-400:]}", file=sys.stderr)
            if not a.no_torch:
                log = os.path.join(tmp, f"torch.{s}.jsonl")
                out = os.path.join(tmp, f"torch.{s}.out")
                cmd = ["/usr/bin/python3", baseline, *common, "--seed", str(s), "--threads", str(a.threads),
                       "--data", a.data, "--log", log, "--shards", str(a.torch_shards), *sets]
                if recal:
                    cmd += ["--recalibrate-bn", str(a.torch_recalibrate_bn)]
                rc = run(cmd, env, out)
                accs = last_accuracies(log)
                row["torch"] = accs[-1] if rc == 0 and accs else None
                if recal:
                    js = [json.loads(line[5:]) for line in open(out) if line.startswith("JSON ")]
                    row["torch_recalibrated"] = js[-1].get("recalibrated_test_acc") if rc == 0 and js else None
                if rc != 0:
                    print(f"  PyTorch failed (exit {rc}): {open(out).read()[-400:]}", file=sys.stderr)
            rows.append(row)

            def f(v):
                return "-" if v is None else f"{v:.4f}"
            print(f"{s:>5} {f(row['mgc']):>7} {f(row['mgc_before']):>15} {f(row.get('torch')):>8}"
                  + (f" {f(row.get('torch_recalibrated')):>15}" if recal else ""), flush=True)
    result = {"net": net, "epochs": a.epochs, "batch_size": a.batch_size, "lr": a.lr, "devices": a.devices,
              "sync_bn": a.sync_bn, "torch_shards": a.torch_shards, "threshold": a.threshold, "rows": rows}
    sides = ([] if a.no_mgc else [("mgc", "mgc")]) + ([] if a.no_torch else [("torch", "PyTorch")])
    if recal:
        sides.append(("torch_recalibrated", "PyTorch, BatchNorm statistics recomputed"))
    for key, name in sides:
        xs = [r[key] for r in rows if r.get(key) is not None]
        result[key] = summary(xs, a.threshold)
        if result[key]:
            m = result[key]
            print(f"{name}: mean {m['mean']:.4f}  sd {m['sd']:.4f}  median {m['median']:.4f}  min {m['min']:.4f}  "
                  f"max {m['max']:.4f}  at or above {a.threshold}: {m['at_or_above']:.0%} of {m['n']}")
    moved = [abs(r["mgc"] - r["mgc_before"]) for r in rows if r.get("mgc") is not None and r.get("mgc_before") is not None]
    if moved:
        result["mgc_last_epoch_move"] = statistics.fmean(moved)
        print(f"mgc's test accuracy moved by {statistics.fmean(moved):.4f} on average in the last epoch (largest {max(moved):.4f})")
    if not a.no_torch and not a.no_mgc:
        w = welch([r["mgc"] for r in rows if r.get("mgc") is not None], [r["torch"] for r in rows if r.get("torch") is not None])
        result["welch"] = w
        if w:
            print(f"mgc - PyTorch: {w['diff']:+.4f} (95% interval {w['diff'] - w['half_width']:+.4f} .. "
                  f"{w['diff'] + w['half_width']:+.4f}; Welch's t {w['t']:+.2f}, {w['df']:.1f} degrees of freedom)")
    print("JSON " + json.dumps(result))
    failed = any((not a.no_mgc and r.get("mgc") is None) or (not a.no_torch and r.get("torch") is None) for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
