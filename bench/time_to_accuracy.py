#!/usr/bin/python3
"""Time to accuracy on Fashion-MNIST: mgc and PyTorch train the same net with
the same recipe, seed after seed, and each run's test accuracy is set against
the minutes it has trained.

    /usr/bin/python3 bench/time_to_accuracy.py --seeds 0-2 --torch-python /path/to/venv/bin/python
    /usr/bin/python3 bench/time_to_accuracy.py --smoke            # the whole path in about a minute

The recipe (the defaults, docs/benchmarks.md): nets/resnet9.net (width 24,
labels smoothed by 0.1), 20 epochs of batch 256, SGD with Nesterov momentum
0.9, weight decay 5e-4, lr 0.1 along a cosine every step after a linear
warmup of one epoch (234 steps), random crop with 2 pixels of padding and
horizontal flips, inputs normalised by the training set's mean and std. The
PyTorch side is bench/torch_resnet.py with tests/torch/zoo.py's twin of the
net (the one the reference tests check mgc against) and the same options.

Minutes are those of each run's epochs, test passes included (mgc: the sum
of its --log `seconds`; PyTorch: `elapsed_s`), not start-up. Per seed and
side it prints when the test accuracy first reached --target (at an epoch's
end) and where it ended, then both curves (test accuracy against minutes,
epoch by epoch, seed means), and a last line `JSON {...}`. --keep DIR keeps
the runs' logs there and reuses any run whose log there is complete, so an
interrupted benchmark goes on where it stopped. Both sides get the same
threads and OPENBLAS_CORETYPE (default SkylakeX); measure on an otherwise
idle machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from accuracy import seed_list  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cpu import blas_core  # noqa: E402


def read_log(path):
    """[(epoch, cumulative minutes, test accuracy)] from a --log JSONL of either side."""
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        return []
    out, total = [], 0.0
    for r in (r for r in rows if "test_acc" in r):   # not --log-every's step records
        total = r["elapsed_s"] if "elapsed_s" in r else total + r["seconds"]
        out.append((r["epoch"], total / 60.0, r["test_acc"]))
    return out


def first_reach(curve, target):
    for epoch, minutes, acc in curve:
        if acc >= target:
            return epoch, minutes
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--net", default="nets/resnet9.net")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a net parameter, for both sides")
    ap.add_argument("--seeds", type=seed_list, default=seed_list("0-2"))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                    help="adamw: PyTorch's AdamW on both sides (--betas; --momentum and Nesterov unused)")
    ap.add_argument("--betas", default="0.9,0.999", help="AdamW's B1,B2")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--no-nesterov", action="store_true", help="plain momentum instead of Nesterov's")
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=234, help="linear warmup steps (default one epoch of batch 256)")
    ap.add_argument("--augment", default="crop:2,flip")
    ap.add_argument("--no-normalize", action="store_true")
    ap.add_argument("--target", type=float, default=0.94, help="the test accuracy to reach")
    ap.add_argument("--minutes", type=float, default=30.0, help="the time it is to be reached in")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--sides", default="mgc,torch", help="mgc, torch or both (mgc,torch)")
    ap.add_argument("--torch-python", default=os.environ.get("PYTHON", "/usr/bin/python3"),
                    help="the interpreter with torch (default $PYTHON, else /usr/bin/python3: PyTorch 1.13; a "
                         "virtual environment's python for the current PyTorch)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the logs in DIR and reuse the complete ones")
    ap.add_argument("--report", action="store_true", help="run nothing: report the logs in --keep DIR as they are")
    ap.add_argument("--torch-max-minutes", type=float, default=None, metavar="M",
                    help="stop each PyTorch run after the first epoch past M minutes (its schedule still the one "
                         "for --epochs): its curve up to the budget when it trains slower")
    ap.add_argument("--smoke", action="store_true", help="2 epochs of 2,560 examples, seed 0: the path, not the numbers")
    ap.add_argument("--mgc", default=os.path.join(ROOT, "mgc"))
    ap.add_argument("--data", default=os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist")))
    a = ap.parse_args()
    sides = [s for s in a.sides.split(",") if s]
    if not sides or any(s not in ("mgc", "torch") for s in sides):
        ap.error("--sides: mgc, torch or mgc,torch")
    if a.report and not a.keep:
        ap.error("--report reads the logs of --keep DIR")
    if "mgc" in sides and not a.report and not os.path.isfile(a.mgc):
        sys.exit(f"time_to_accuracy.py: no mgc at {a.mgc} (run make)")
    limit = []
    if a.smoke:
        a.epochs, a.seeds, a.warmup = 2, [0], 4
        limit = ["--limit-train", "2560", "--limit-test", "1000"]
    env = dict(os.environ)
    env["OPENBLAS_CORETYPE"] = blas_core()
    common = ["--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
              "--weight-decay", str(a.weight_decay), "--warmup", str(a.warmup),
              "--threads", str(a.threads), "--data", a.data] + limit
    if a.optimizer == "adamw":
        common += ["--optimizer", "adamw", "--betas", a.betas]
    else:
        common += ["--momentum", str(a.momentum)] + ([] if a.no_nesterov else ["--nesterov"])
    common += ["--augment", a.augment] if a.augment else []
    common += [] if a.no_normalize else ["--normalize"]
    sets = [x for s in a.set for x in ("--set", s)]
    opt = (f"AdamW betas {a.betas}" if a.optimizer == "adamw"
           else f"SGD momentum {a.momentum}{'' if a.no_nesterov else ' (Nesterov)'}")
    print(f"{a.net} {' '.join(a.set)}: {a.epochs} epochs, batch {a.batch_size}, lr {a.lr} (cosine every step, "
          f"warmup {a.warmup} steps), {opt}, weight decay "
          f"{a.weight_decay}, augment {a.augment or 'none'}{'' if a.no_normalize else ', normalize'}; seeds "
          f"{','.join(map(str, a.seeds))}; {a.threads} threads, OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}; "
          f"target {a.target} within {a.minutes:g} minutes", flush=True)

    tmp = tempfile.TemporaryDirectory(prefix="mgc-tta-")
    where = a.keep or tmp.name
    os.makedirs(where, exist_ok=True)
    curves = {s: {} for s in sides}
    versions = {}
    failed = False
    for seed in a.seeds:
        for side in sides:
            log = os.path.join(where, f"{side}.s{seed}.jsonl")
            out = os.path.join(where, f"{side}.s{seed}.out")
            curve = read_log(log) if a.keep else []
            stopped = os.path.exists(out) and "past --max-minutes" in open(out).read()
            if len(curve) < a.epochs and not stopped and not a.report:
                if side == "mgc":
                    cmd = [a.mgc, a.net, *common, "--seed", str(seed), "--log", log, *sets]
                else:
                    cmd = [a.torch_python, os.path.join(HERE, "torch_resnet.py"), "--net", a.net, *common,
                           "--seed", str(seed), "--log", log, *sets]
                    if a.torch_max_minutes:
                        cmd += ["--max-minutes", str(a.torch_max_minutes)]
                with open(out, "w") as f:
                    rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
                if rc != 0:
                    failed = True
                    print(f"  {side} seed {seed} failed (exit {rc}): {open(out).read()[-600:]}", file=sys.stderr)
                curve = read_log(log)
            try:
                text = open(out).read()
                if side == "torch" and '"torch": "' in text:
                    versions[side] = "PyTorch " + text.split('"torch": "')[1].split('"')[0]
            except OSError:
                pass
            if a.report and not curve:
                continue   # a run never made: nothing to report
            curves[side][seed] = curve
            hit = first_reach(curve, a.target)
            end = curve[-1] if curve else None
            name = versions.get(side, "PyTorch") if side == "torch" else "mgc"
            print(f"seed {seed}  {name:>14}: "
                  + (f"{a.target} at epoch {hit[0]}, {hit[1]:.1f} min; " if hit else f"{a.target} not reached; ")
                  + (f"ends at {end[2]:.4f} after {end[0]} epochs, {end[1]:.1f} min" if end else "no epoch"),
                  flush=True)

    result = {"net": a.net, "set": a.set, "epochs": a.epochs, "target": a.target, "minutes": a.minutes,
              "seeds": a.seeds, "threads": a.threads, "openblas_coretype": env["OPENBLAS_CORETYPE"], "sides": {}}
    for side in sides:
        cs = [c for c in curves[side].values() if c]
        hits = [first_reach(c, a.target) for c in cs]
        within = sum(1 for h in hits if h and h[1] <= a.minutes)
        finals = [c[-1][2] for c in cs]
        at_budget = [max([acc for _, m, acc in c if m <= a.minutes] or [0.0]) for c in cs]
        result["sides"][side] = {
            "name": versions.get(side, "mgc" if side == "mgc" else "PyTorch"),
            "curves": {str(s): c for s, c in curves[side].items()},
            "reached_within": within, "runs": len(cs),
            "minutes_to_target": [h[1] if h else None for h in hits],
            "final_mean": statistics.fmean(finals) if finals else None,
            "best_within_budget_mean": statistics.fmean(at_budget) if at_budget else None,
        }
        r = result["sides"][side]
        if cs:
            print(f"{r['name']}: reached {a.target} within {a.minutes:g} min in {within} of {len(cs)} runs; final test "
                  f"accuracy mean {r['final_mean']:.4f}; best within {a.minutes:g} min, mean {r['best_within_budget_mean']:.4f}")
    # both curves, seed means epoch by epoch
    print(f"\n{'epoch':>5}" + "".join(f" {result['sides'][s]['name'] + ' min':>20} {'acc':>7}" for s in sides))
    for e in range(1, a.epochs + 1):
        cells = []
        for side in sides:
            pts = [c[e - 1] for c in curves[side].values() if len(c) >= e]
            cells.append(f" {statistics.fmean(p[1] for p in pts):>20.1f} {statistics.fmean(p[2] for p in pts):>7.4f}"
                         if pts else f" {'-':>20} {'-':>7}")
        print(f"{e:>5}" + "".join(cells))
    print("JSON " + json.dumps(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
