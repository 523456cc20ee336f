#!/usr/bin/python3
"""A stand-in for ./mgc's test hooks, in PyTorch float32, to test ref.py itself
(and to see how far float32 may drift from the float64 reference):

    MGC="/usr/bin/python3 tests/torch/fake_mgc.py" /usr/bin/python3 tests/torch/ref.py

Implements only: NET --epochs 0 [--seed S] --save F, and
NET --load F --check-batch B --steps K --lr --momentum --weight-decay
[--optimizer --nesterov --betas --eps] --dump OUT.
FAKE_MGC_BREAK=name makes it deliberately wrong (see BREAKS) so that one can
see ref.py catch it.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import models  # noqa: E402
from ref import st_load, st_save, torch_steps  # noqa: E402

BREAKS = ("grad", "running_var", "init_name", "momentum")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("net")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save")
    ap.add_argument("--load")
    ap.add_argument("--check-batch", dest="batch")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--betas", default="0.9,0.999")
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--dump")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    brk = os.environ.get("FAKE_MGC_BREAK", "")
    torch.manual_seed(a.seed)
    model, _ = models.build(a.net, torch.float32, a.set)
    if a.load:
        sd = st_load(a.load)
        model.load_state_dict(sd, strict=False)
    if a.epochs == 0 and a.save:
        sd = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
        if brk == "init_name":
            k = next(iter(sd))
            sd["x" + k] = sd.pop(k)
        st_save(sd, a.save)
        return 0
    if a.batch and a.dump:
        b = st_load(a.batch)
        mom = a.momentum * (0.5 if brk == "momentum" else 1)
        optim = {"kind": a.optimizer, "nesterov": a.nesterov, "eps": a.eps,
                 "betas": tuple(float(v) for v in a.betas.split(","))}
        out = torch_steps(model, b["x"], b["y"], a.steps, a.lr, mom, a.weight_decay, optim=optim)
        if brk == "grad":
            k = [k for k in out if k.startswith("grad.") and k != "grad.x"][0]
            out[k] = out[k] * 1.01
        if brk == "running_var":
            for k in out:
                if k.endswith("running_var"):
                    out[k] = out[k] * 0.999
        st_save({k: v.float().contiguous() for k, v in out.items()}, a.dump)
        return 0
    print("fake_mgc: unsupported arguments", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
