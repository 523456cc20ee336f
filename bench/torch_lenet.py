#!/usr/bin/python3
"""Train the tutorial's LeNet on Fashion-MNIST with PyTorch (CPU): the baseline
that mgc's nets/lenet.net is measured against (see bench/README.md).

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/torch_lenet.py \
        --data ../shared/data/fashion-mnist --epochs 10 --threads 2

Per epoch it prints loss, train accuracy, test accuracy and training
throughput (examples/s over the SGD steps only: no data loading, no test pass),
then the final test accuracy and one line `JSON {...}` with the summary.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import mgc_stream  # noqa: E402  (bench/: mgc's data stream, for --stream mgc and --init)

DEFAULT_DATA = os.environ.get("MGC_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "fashion-mnist"))


def read_idx(path):
    """Read one (optionally gzipped) IDX file into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: size mismatch")
    return data.reshape(dims)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{stem}[.gz] not in {data_dir}")


def load_split(data_dir, prefix, limit=None):
    x = read_idx(find(data_dir, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(find(data_dir, f"{prefix}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)  # [N,1,28,28]
    y = torch.from_numpy(y.astype(np.int64))
    return x, y


class LeNet(nn.Module):
    """Same layers and parameter names as nets/lenet.net."""

    def __init__(self, classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@torch.no_grad()
def peak_resident_mb():
    """This process's peak resident memory since its exec (VmHWM), in MB, or None:
    getrusage's ru_maxrss would also count what a fork copied from the parent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def evaluate(model, x, y, batch):
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], batch):
        correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    return correct / x.shape[0]


def recalibrated_accuracy(model, xtr, xte, yte, batches, batch_size):
    """Test accuracy of the trained weights with every BatchNorm's running
    statistics recomputed: the plain average of the batch statistics of the
    first `batches` training batches (train mode, no update), instead of the
    exponential average that training left. A diagnostic: how much of a
    test accuracy's spread comes from the running statistics rather than from
    the weights. The model is left as it was."""
    import copy
    m = copy.deepcopy(model)
    bns = [b for b in m.modules() if isinstance(b, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return None
    for b in bns:
        b.reset_running_stats()
        b.momentum = None   # a cumulative average
    m.train()
    with torch.no_grad():
        for i in range(batches):
            xb = xtr[i * batch_size:(i + 1) * batch_size]
            if xb.shape[0] == 0:
                break
            m(xb)
    with torch.no_grad():
        return evaluate(m, xte, yte, 1000)


def add_options(ap, epochs):
    """The options every baseline takes (bench/torch_resnet.py too)."""
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=epochs)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true", help="SGD with Nesterov momentum: mgc's --nesterov")
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    ap.add_argument("--betas", default="0.9,0.999", help="AdamW's B1,B2")
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW's")
    ap.add_argument("--augment", default="",
                    help="crop[:P],flip as mgc's --augment: RandomCrop(padding=P) and RandomHorizontalFlip on the "
                         "training batches (drawn from --seed's generator, inside the timed loop)")
    ap.add_argument("--normalize", action="store_true",
                    help="(x - mean) / std with the training set's mean and std (transforms.Normalize): mgc's")
    ap.add_argument("--lr-schedule", default="cosine",
                    help="cosine (CosineAnnealingLR over the run), constant or step:E1,E2,... (MultiStepLR): mgc's, "
                         "with its default")
    ap.add_argument("--lr-gamma", type=float, default=0.1, help="step:...'s factor")
    ap.add_argument("--lr-per", choices=("epoch", "step"), default=None,
                    help="how often the schedule moves; default: every step for cosine (T_max = all the run's "
                         "steps), once an epoch for step:... (milestones in epochs): mgc's")
    ap.add_argument("--warmup", type=int, default=0,
                    help="the first N steps scale the rate by (t+1)/N (LinearLR chained with the schedule): mgc's")
    ap.add_argument("--weight-decay", type=float, default=None,
                    help="default 0 for SGD, 0.01 for AdamW (PyTorch's and mgc's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-train", type=int, default=None)
    ap.add_argument("--limit-test", type=int, default=None)
    ap.add_argument("--log", default=None, help="write one JSON object per epoch here")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop after the first epoch that ends past this many minutes (test passes included); "
                         "the schedule stays the one for --epochs")
    ap.add_argument("--autocast", choices=("off", "bf16"), default="off",
                    help="bf16: the training step's forward under torch.autocast(dtype=bfloat16) "
                         "(mgc's --precision bf16 is measured against it)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU check, tests/gpu/check.sh)")
    ap.add_argument("--recalibrate-bn", type=int, default=0, metavar="B",
                    help="also print the final test accuracy with BatchNorm's running statistics recomputed "
                         "over B training batches (a diagnostic of their share in the spread)")
    ap.add_argument("--shards", type=int, default=1,
                    help="K > 1: data parallelism's semantics on one process, as DDP on K replicas: "
                         "each batch in K shards (sizes within one), BatchNorm on each shard's own "
                         "statistics, the running statistics replica 0's")
    ap.add_argument("--stream", choices=("torch", "mgc"), default="torch",
                    help="mgc: the epochs' example orders and each example's crop and flip drawn as mgc draws them "
                         "from --seed (bench/mgc_stream.py), so the twin trains on mgc's very batches")
    ap.add_argument("--init", metavar="CK.safetensors",
                    help="start from these parameters (mgc's names), e.g. mgc's own initialisation: "
                         "mgc NET --epochs 0 --seed S --save CK")


def forward_shards(model, xb, yb, k, loss_fn):
    """The global batch's mean loss over k shards, each normalised alone (as
    k DDP replicas do); running statistics from the first shard only."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    b = xb.shape[0]
    q, r = divmod(b, k)
    parts, loss, first = [], 0, 0
    for j in range(k):
        n = q + (1 if j < r else 0)
        own = [(m, m.running_mean, m.running_var) for m in bns]
        if j > 0:   # later shards update copies, dropped afterwards
            for m in bns:
                m.running_mean, m.running_var = m.running_mean.clone(), m.running_var.clone()
        parts.append(model(xb[first:first + n]))
        loss = loss + loss_fn(parts[-1], yb[first:first + n]) * (n / b)
        for m, rm, rv in own:
            m.running_mean, m.running_var = rm, rv
        first += n
    return torch.cat(parts), loss


def parse_augment(text):
    """'crop:2,flip' -> (2, True); 'crop' is crop:4 (mgc's)."""
    pad, flip = 0, False
    for item in filter(None, text.split(",")):
        if item == "flip":
            flip = True
        elif item == "crop":
            pad = 4
        elif item.startswith("crop:"):
            pad = int(item[5:])
        else:
            raise SystemExit(f"--augment {text}: crop[:P] and flip")
    return pad, flip


def augment_batch(xb, pad, flip, g, drawn=None):
    """RandomCrop(size, padding=pad) then RandomHorizontalFlip, per example, on
    a batch [B, C, H, W] of pixels as ToTensor gives them (zeros around); the
    offsets and flips from g, or given: drawn = (oy, ox, flipped) per example."""
    b, _, h, w = xb.shape
    if pad:
        xp = F.pad(xb, (pad, pad, pad, pad))
        if drawn:
            oy, ox = drawn[0], drawn[1]
        else:
            oy = torch.randint(0, 2 * pad + 1, (b,), generator=g)
            ox = torch.randint(0, 2 * pad + 1, (b,), generator=g)
        rows = (oy[:, None] + torch.arange(h))[:, None, :, None]
        cols = (ox[:, None] + torch.arange(w))[:, None, None, :]
        xb = xp[torch.arange(b)[:, None, None, None], torch.arange(xb.shape[1])[None, :, None, None], rows, cols]
    if flip:
        m = drawn[2] if drawn else torch.rand(b, generator=g) < 0.5
        xb = torch.where(m[:, None, None, None], xb.flip(-1), xb)
    return xb


def setup(a):
    """Threads, seeds and the data: (generator, (xtr, ytr), (xte, yte))."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    return g, load_split(a.data, "train", a.limit_train), load_split(a.data, "t10k", a.limit_test)


def train(model, a, g, train_set, test_set, what="", extra=None):
    """a.epochs of SGD on train_set (reshuffled every epoch by g), the test
    accuracy after each (eval mode); prints and logs each epoch, then the
    summary line `JSON {...}` (with extra's fields). Returns 0."""
    (xtr, ytr), (xte, yte) = train_set, test_set
    dev = torch.device(a.device)
    if a.init:   # the parameters (and buffers) by name; the optimizer's state in the file is left
        saved = mgc_stream.read_safetensors(a.init)
        model.load_state_dict({k: torch.from_numpy(saved[k].copy()) for k in model.state_dict() if k in saved})
    model.to(dev)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    n = xtr.shape[0]
    if a.optimizer == "adamw":
        b1, b2 = (float(v) for v in a.betas.split(","))
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(b1, b2), eps=a.eps,
                                weight_decay=0.01 if a.weight_decay is None else a.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                              weight_decay=a.weight_decay or 0.0)
    pad, flip = parse_augment(a.augment)
    mean, std = (xtr.mean().item(), xtr.std().item()) if a.normalize else (0.0, 1.0)
    if a.normalize:   # the test set once; training batches after their crop and flip
        xte = (xte - mean) / std
    # the schedule steps once an epoch, or once a step (--lr-per step); a warmup
    # (LinearLR) steps once a step and multiplies: PyTorch's chainable forms compose
    per_step = a.lr_per == "step" if a.lr_per else a.lr_schedule == "cosine"
    clock = a.epochs * -(-n // a.batch_size) if per_step else a.epochs
    sched = None
    if a.lr_schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=clock)
    elif a.lr_schedule.startswith("step:"):
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(e) for e in a.lr_schedule[5:].split(",")], gamma=a.lr_gamma)
    elif a.lr_schedule != "constant":
        raise SystemExit(f"--lr-schedule {a.lr_schedule}: constant, cosine or step:E1,E2,...")
    warm = torch.optim.lr_scheduler.LinearLR(opt, 1 / a.warmup, 1.0, a.warmup - 1) if a.warmup > 1 else None
    loss_fn = nn.CrossEntropyLoss(label_smoothing=getattr(model, "label_smoothing", 0.0))
    print(f"torch {torch.__version__} on {a.device}, {what}threads {torch.get_num_threads()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}, "
          f"train {n}, test {xte.shape[0]}, batch {a.batch_size}", flush=True)

    logf = open(a.log, "w") if a.log else None
    epochs = []
    total_train_s = 0.0
    start = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        model.train()
        if a.stream == "mgc":   # mgc's order, and its crops and flips by example
            perm = torch.from_numpy(mgc_stream.epoch_order(n, a.seed, epoch)).to(dev)
            drawn = [torch.from_numpy(v) for v in mgc_stream.crop_flip(n, a.seed, epoch, pad)]
        else:
            perm = torch.randperm(n, generator=g).to(dev)
        xs, ys = xtr[perm], ytr[perm]  # shuffle outside the timed loop
        loss_sum, correct, seen = 0.0, 0, 0
        t0 = time.perf_counter()
        for i in range(0, n, a.batch_size):
            xb, yb = xs[i:i + a.batch_size], ys[i:i + a.batch_size]
            if pad or flip:
                drawn_here = None
                if a.stream == "mgc":   # this batch's examples' draws (a host copy of their indices: not PyTorch's path)
                    here = perm[i:i + a.batch_size].cpu()
                    drawn_here = [v[here].to(dev) for v in drawn]
                xb = augment_batch(xb, pad, flip, g, drawn_here)
            if a.normalize:
                xb = (xb - mean) / std
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
                if a.shards > 1:
                    logits, loss = forward_shards(model, xb, yb, a.shards, loss_fn)
                else:
                    logits = model(xb)
                    loss = loss_fn(logits, yb)
            loss.backward()
            opt.step()
            lr = opt.param_groups[0]["lr"]   # this step's
            if warm:
                warm.step()
            if sched and per_step:
                sched.step()
            b = yb.shape[0]
            loss_sum += loss.item() * b
            correct += (logits.argmax(1) == yb).sum().item()
            seen += b
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        if sched and not per_step:
            sched.step()
        total_train_s += train_s
        test_acc = evaluate(model, xte, yte, 1000)  # eval mode: BatchNorm's running statistics
        rec = {"epoch": epoch, "loss": loss_sum / seen, "train_acc": correct / seen,
               "test_acc": test_acc, "lr": lr, "examples_per_s": seen / train_s,
               "seconds": train_s, "elapsed_s": time.perf_counter() - start,
               "peak_resident_mb": peak_resident_mb()}
        epochs.append(rec)
        if logf:
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
        print(f"epoch {epoch:3d}  loss {rec['loss']:.4f}  train_acc {rec['train_acc']:.4f}  "
              f"test_acc {test_acc:.4f}  {rec['examples_per_s']:.0f} ex/s  "
              f"({train_s:.1f} s)", flush=True)
        if a.max_minutes is not None and rec["elapsed_s"] > 60 * a.max_minutes and epoch < a.epochs:
            print(f"stopped after epoch {epoch} of {a.epochs}: {rec['elapsed_s'] / 60:.1f} minutes, past --max-minutes "
                  f"{a.max_minutes:g}", flush=True)
            break

    final = epochs[-1]["test_acc"] if epochs else evaluate(model, xte, yte, 1000)
    trained = n * len(epochs)
    summary = dict(extra or {})
    summary.update({
        "impl": "pytorch", "torch": torch.__version__, "device": a.device, "threads": a.threads,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "epochs": len(epochs), "batch_size": a.batch_size, "lr": a.lr, "shards": a.shards,
        "final_test_acc": final,
        "final_loss": epochs[-1]["loss"] if epochs else None,
        "examples_per_s": trained / total_train_s if total_train_s else None,
        "train_seconds": total_train_s,
    })
    print(f"final test accuracy {final:.4f}")
    if a.recalibrate_bn > 0:
        recal = recalibrated_accuracy(model, xtr, xte, yte, a.recalibrate_bn, a.batch_size)
        summary["recalibrated_test_acc"] = recal
        if recal is not None:
            print(f"final test accuracy with BatchNorm statistics recomputed over {a.recalibrate_bn} "
                  f"training batches: {recal:.4f}")
    print("JSON " + json.dumps(summary), flush=True)
    if logf:
        logf.close()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(ap, epochs=10)
    a = ap.parse_args()
    g, train_set, test_set = setup(a)
    return train(LeNet(), a, g, train_set, test_set)


if __name__ == "__main__":
    sys.exit(main())
