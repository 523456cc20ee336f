#!/usr/bin/python3
"""Train nets/resnet18.net's ResNet-18 on Fashion-MNIST with PyTorch (CPU): the
baseline that mgc's ResNet-18 is measured against (see bench/README.md).

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/torch_resnet.py \
        --data ../shared/data/fashion-mnist --epochs 2 --threads 2 --limit-train 2560

The model is tests/torch/models.py's twin of nets/resnet18.net (the one the
reference tests check mgc against: same layers, biases, projections and
parameter names), so both sides train the identical architecture. `--net` and
`--set` pick another net that models.py knows, e.g. `--set small_stem=true`.

Per epoch it prints loss, train accuracy, test accuracy and training
throughput (examples/s over the SGD steps only: no data loading, no test pass),
then the final test accuracy and one line `JSON {...}` with the summary; the
options and the --log JSONL fields are those of bench/torch_lenet.py.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
from torch_lenet import DEFAULT_DATA, evaluate, load_split  # noqa: E402
import models  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--net", default="nets/resnet18.net",
                    help="a net of tests/torch/models.py (path relative to the repository root)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="the net's --set variant, as given to mgc (repeatable)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-train", type=int, default=None)
    ap.add_argument("--limit-test", type=int, default=None)
    ap.add_argument("--log", default=None, help="write one JSON object per epoch here")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)

    xtr, ytr = load_split(a.data, "train", a.limit_train)
    xte, yte = load_split(a.data, "t10k", a.limit_test)
    n = xtr.shape[0]

    try:
        model, shape = models.build(a.net, torch.float32, tuple(a.set))
    except KeyError:
        ap.error(f"tests/torch/models.py has no model for {' '.join([a.net] + a.set)!r}")
    if tuple(shape) != tuple(xtr.shape[1:]):
        ap.error(f"{a.net} takes inputs {tuple(shape)}, Fashion-MNIST is {tuple(xtr.shape[1:])}")
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    print(f"torch {torch.__version__}, {' '.join([a.net] + a.set)}: {nparams:,} parameters, "
          f"threads {torch.get_num_threads()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}, "
          f"train {n}, test {xte.shape[0]}, batch {a.batch_size}", flush=True)

    logf = open(a.log, "w") if a.log else None
    epochs = []
    total_train_s = 0.0
    for epoch in range(1, a.epochs + 1):
        model.train()
        perm = torch.randperm(n, generator=g)
        xs, ys = xtr[perm], ytr[perm]  # shuffle outside the timed loop
        loss_sum, correct, seen = 0.0, 0, 0
        t0 = time.perf_counter()
        for i in range(0, n, a.batch_size):
            xb, yb = xs[i:i + a.batch_size], ys[i:i + a.batch_size]
            opt.zero_grad(set_to_none=True)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            loss.backward()
            opt.step()
            b = yb.shape[0]
            loss_sum += loss.item() * b
            correct += (logits.argmax(1) == yb).sum().item()
            seen += b
        train_s = time.perf_counter() - t0
        total_train_s += train_s
        test_acc = evaluate(model, xte, yte, 1000)  # eval mode: BatchNorm's running statistics
        rec = {"epoch": epoch, "loss": loss_sum / seen, "train_acc": correct / seen,
               "test_acc": test_acc, "examples_per_s": seen / train_s,
               "seconds": train_s}
        epochs.append(rec)
        if logf:
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
        print(f"epoch {epoch:3d}  loss {rec['loss']:.4f}  train_acc {rec['train_acc']:.4f}  "
              f"test_acc {test_acc:.4f}  {rec['examples_per_s']:.0f} ex/s  "
              f"({train_s:.1f} s)", flush=True)

    final = epochs[-1]["test_acc"] if epochs else evaluate(model, xte, yte, 1000)
    trained = n * len(epochs)
    summary = {
        "impl": "pytorch", "net": " ".join([a.net] + a.set), "parameters": nparams,
        "torch": torch.__version__, "threads": a.threads,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "epochs": len(epochs), "batch_size": a.batch_size, "lr": a.lr,
        "final_test_acc": final,
        "final_loss": epochs[-1]["loss"] if epochs else None,
        "examples_per_s": trained / total_train_s if total_train_s else None,
        "train_seconds": total_train_s,
    }
    print(f"final test accuracy {final:.4f}")
    print("JSON " + json.dumps(summary), flush=True)
    if logf:
        logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
