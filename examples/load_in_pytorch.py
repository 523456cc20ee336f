#!/usr/bin/python3
"""Load a checkpoint written by mgc into PyTorch and evaluate it there.

    ./mgc nets/lenet.net --epochs 3 --save lenet.safetensors
    /usr/bin/python3 examples/load_in_pytorch.py lenet.safetensors

mgc saves safetensors files with PyTorch's names and layouts (conv1.weight is
OIHW, fc1.weight is [out, in]), so the tutorial's LeNet, written here in
PyTorch, takes them with load_state_dict. With the `safetensors` package,
`safetensors.torch.load_file(path)` reads the file; tests/st.py (the project's
own small reader) does the same without it. Prints PyTorch's test accuracy,
which is mgc's last "test acc" (the same weights, the same test set).
"""
import os
import sys

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import st  # noqa: E402
from torch_lenet import load_split  # noqa: E402


def lenet():
    """nets/lenet.net, layer by layer, with the same names."""
    return nn.ModuleDict({
        "conv1": nn.Conv2d(1, 6, 5), "conv2": nn.Conv2d(6, 16, 5),
        "fc1": nn.Linear(256, 120), "fc2": nn.Linear(120, 84), "fc3": nn.Linear(84, 10)})


def forward(m, x):
    x = torch.max_pool2d(torch.relu(m["conv1"](x)), 2, 2)
    x = torch.max_pool2d(torch.relu(m["conv2"](x)), 2, 2)
    x = torch.relu(m["fc1"](x.flatten(1)))
    x = torch.relu(m["fc2"](x))
    return m["fc3"](x)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    weights = st.load(sys.argv[1])
    model = lenet()
    model.load_state_dict(weights)   # strict: every name and shape must match
    data = os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist"))
    x, y = load_split(data, "t10k")
    with torch.no_grad():
        correct = sum(int((forward(model, x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
                      for i in range(0, len(y), 1000))
    print(f"{sys.argv[1]}: {len(weights)} tensors loaded into PyTorch; "
          f"PyTorch's test accuracy {correct / len(y):.4f}")


if __name__ == "__main__":
    main()
