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
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
from torch_lenet import add_options, setup, train  # noqa: E402
import models  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="nets/resnet18.net",
                    help="a net of tests/torch/models.py (path relative to the repository root)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="the net's --set variant, as given to mgc (repeatable)")
    ap.add_argument("--resize", type=int, metavar="S",
                    help="every image bilinear to S x S first, as mgc's --resize S (before training: not timed)")
    add_options(ap, epochs=2)
    a = ap.parse_args()
    g, train_set, test_set = setup(a)
    if a.resize:
        import torch.nn.functional as F
        train_set, test_set = ((F.interpolate(x, size=(a.resize, a.resize), mode="bilinear", align_corners=False), y)
                               for x, y in (train_set, test_set))
    try:
        model, shape = models.build(a.net, torch.float32, tuple(a.set))
    except KeyError:
        ap.error(f"tests/torch/models.py has no model for {' '.join([a.net] + a.set)!r}")
    if tuple(shape) != tuple(train_set[0].shape[1:]):
        ap.error(f"{a.net} takes inputs {tuple(shape)}, Fashion-MNIST is {tuple(train_set[0].shape[1:])}")
    nparams = sum(p.numel() for p in model.parameters())
    what = " ".join([a.net] + a.set)
    return train(model, a, g, train_set, test_set, f"{what}: {nparams:,} parameters, ",
                 {"net": what, "parameters": nparams})


if __name__ == "__main__":
    sys.exit(main())
