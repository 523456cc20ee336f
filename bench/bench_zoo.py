#!/usr/bin/python3
"""Training speed of every net of the zoo, mgc against PyTorch, in one run.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/bench_zoo.py --python VENV/bin/python
    /usr/bin/python3 bench/bench_zoo.py --python VENV/bin/python --nets se_resnet,mobilenetv2 --repeat 2

For each net of nets/ at its default size (AlexNet, NiN, GoogLeNet and
DenseNet on images resized to 96, VGG-11 to 64, as their files say) and the
two nets written from the docs (tests/nets/like/: EfficientNet-like and
ConvNeXt-like), each side trains --epochs epochs of --limit-train
Fashion-MNIST examples at --batch with --threads threads, the same learning
rate, data and OPENBLAS_CORETYPE: mgc (./mgc, its kernels compiled by a run
of --epochs 0 first) and PyTorch eager (bench/torch_resnet.py with
tests/torch's twin of the net, under --python: PyTorch 2.x from PyPI in a
virtual environment is what a user would pick; /usr/bin/python3's 1.13 by
default). A side's figure is the median of its epochs' training throughput
after the first (examples/s over the SGD steps only, from its --log: no data
loading, no test pass), the best of --repeat runs taken in turns.

Prints a table (mgc examples/s, PyTorch's, the ratio) and a last line
`JSON {...}`. The issue's target is mgc at 1.5x PyTorch or more on each.
Numbers mean little on a busy machine: on two cores another build halves them.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_cpu import add_common, bench_env, median_rate, run  # noqa: E402

# name -> (.net file, --resize (0: none), batch)
NETS = {
    "lenet": ("nets/lenet.net", 0, 256),
    "bn_lenet": ("nets/bn_lenet.net", 0, 256),
    "alexnet": ("nets/alexnet.net", 96, 128),
    "vgg11": ("nets/vgg11.net", 64, 128),
    "nin": ("nets/nin.net", 96, 128),
    "googlenet": ("nets/googlenet.net", 96, 128),
    "densenet": ("nets/densenet.net", 96, 64),
    "resnet18": ("nets/resnet18.net", 0, 128),
    "resnet9": ("nets/resnet9.net", 0, 128),
    "resnext": ("nets/resnext.net", 0, 128),
    "se_resnet": ("nets/se_resnet.net", 0, 128),
    "mobilenetv2": ("nets/mobilenetv2.net", 0, 128),
    "efficientnet_like": ("tests/nets/like/efficientnet.net", 0, 128),
    "convnext_like": ("tests/nets/like/convnext.net", 0, 128),
    "vit": ("nets/vit.net", 0, 128),
    "mixer": ("nets/mixer.net", 0, 128),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common(ap, "smoke run: 512 examples, two epochs, three nets")
    ap.add_argument("--python", default=os.environ.get("PYTHON", "/usr/bin/python3"),
                    help="the interpreter with PyTorch (a bench virtual environment's PyTorch 2.x)")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--limit-train", type=int, default=2560)
    ap.add_argument("--batch", type=int, help="every net's batch (default: the table's, 64 to 256)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, in turns; each side's best kept")
    a = ap.parse_args()
    mgc, _, env = bench_env(a)
    nets = "lenet,se_resnet,mobilenetv2" if a.quick and a.nets == ",".join(NETS) else a.nets
    limit = 512 if a.quick else a.limit_train
    tmp = tempfile.mkdtemp(prefix="mgc-zoo-")
    version = os.popen(f"{a.python} -c 'import torch; print(torch.__version__)'").read().strip() or "?"
    print(f"mgc {mgc} against PyTorch {version} ({a.python}); {a.threads} threads, {a.epochs} epochs of {limit} "
          f"examples, OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}")
    print(f"{'net':<18} {'size':>4} {'batch':>5} {'mgc ex/s':>9} {'torch ex/s':>10} {'mgc/torch':>9}")
    results = {}
    for name in nets.split(","):
        if name not in NETS:
            ap.error(f"--nets: no net '{name}' (the zoo: {', '.join(NETS)})")
        net, resize, batch = NETS[name]
        batch = a.batch or batch
        common = ["--epochs", str(a.epochs), "--batch-size", str(batch), "--threads", str(a.threads), "--lr", "0.05",
                  "--limit-train", str(limit), "--limit-test", "256", "--data", a.data]
        mlog, tlog = os.path.join(tmp, name + ".mgc.jsonl"), os.path.join(tmp, name + ".torch.jsonl")
        sized = ["--resize", str(resize)] if resize else []
        mcmd = [mgc, net] + sized + common + ["--log", mlog]
        tcmd = [a.python, os.path.join(HERE, "torch_resnet.py"), "--net", net] + sized + common + ["--log", tlog]
        run([mgc, net] + sized + ["--epochs", "0", "--batch-size", str(batch), "--data", a.data], env, mlog + ".warm")
        best = {"mgc": None, "torch": None}
        failed = []
        for rep in range(max(1, a.repeat)):
            for side, cmd, log in (("mgc", mcmd, mlog), ("torch", tcmd, tlog)):
                if os.path.exists(log):
                    os.remove(log)
                rc, _ = run(cmd, env, f"{log}.{rep}.out")
                rate = median_rate(log, skip_first=True)[0] if rc == 0 and os.path.exists(log) else None
                if rate is None:
                    failed.append(f"{side} exit {rc} ({log}.{rep}.out)")
                elif best[side] is None or rate > best[side]:
                    best[side] = rate
        m, t = best["mgc"], best["torch"]
        ratio = m / t if m and t else None
        results[name] = {"net": net, "resize": resize, "batch": batch, "mgc": m, "torch": t, "ratio": ratio}
        fmt = lambda v, w: f"{v:>{w},.0f}" if v else f"{'failed':>{w}}"
        print(f"{name:<18} {resize or 28:>4} {batch:>5} {fmt(m, 9)} {fmt(t, 10)} "
              f"{(f'{ratio:.2f}x' if ratio else '-'):>9}{'  ' + '; '.join(failed) if failed else ''}", flush=True)
    short = [n for n, r in results.items() if r["ratio"] is not None and r["ratio"] < 1.5]
    print(f"below 1.5x: {', '.join(short) if short else 'none'}")
    print("JSON " + json.dumps({"torch": version, "threads": a.threads, "epochs": a.epochs, "limit_train": limit,
                                "nets": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
