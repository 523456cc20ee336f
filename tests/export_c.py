"""Helpers of tests/export_c.sh (mgc export --format c|cuda), with tests/st.py:

    python3 tests/export_c.py checkpoint NET.net OUT.safetensors [SEED [--normalize M1,S1]]
        a checkpoint of NET as mgc --save writes one (its model's metadata:
        the net's text, input, classes, fp32, no transform) with random
        parameters, initialised as PyTorch's layers are, and BatchNorm's
        weight, bias and running statistics drawn away from 1 and 0, so that
        folding them into a layer changes its numbers; the names and shapes
        from `mgc NET.net --emit eval-ir` (no kernel is compiled)
    python3 tests/export_c.py images C H W N OUT.safetensors [SEED]
        N random U8 images [N, C, H, W]
    python3 tests/export_c.py compare A.safetensors B.safetensors TOL
        A's and B's `logits`: prints the largest |a - b| over the largest |b|;
        exit 0 when that is at most TOL (0: bit for bit) and every example
        whose top two logits in B are apart by more than 10 TOL max|b| has
        the same prediction in A
"""
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

MGC = os.environ.get("MGC", "./mgc")


def checkpoint(net, out, seed=0, normalize=None):
    text = open(net).read()
    ir = subprocess.run([MGC, net, "--emit", "eval-ir"], capture_output=True, text=True, check=True).stdout
    g = torch.Generator().manual_seed(seed)
    tensors, shape_of_input, classes = {}, None, None
    for line in ir.splitlines():
        m = re.match(r"%\d+\s+= (param|state|input) ?(\S*)(?: init=(\S+))?\s+\[([^\]]*)\]", line)
        if not m:
            continue
        kind, name, init, dims = m.groups()
        shape = [int(d) for d in dims.split(",") if d != "N"]
        if kind == "input":
            shape_of_input = shape
            continue
        n = torch.Size(shape)
        if init and init.startswith("uniform"):
            fan_in = int(re.search(r"fan_in=(\d+)", init).group(1))
            b = fan_in ** -0.5
            t = (torch.rand(n, generator=g) * 2 - 1) * b
        elif name.endswith("running_var"):
            t = 0.5 + torch.rand(n, generator=g)               # 0.5 .. 1.5
        elif name.endswith("running_mean"):
            t = (torch.rand(n, generator=g) - 0.5) * 0.2
        elif init == "ones":
            t = 0.75 + 0.5 * torch.rand(n, generator=g)       # BatchNorm's weight
        else:
            t = (torch.rand(n, generator=g) - 0.5) * 0.2      # BatchNorm's bias
        tensors[name] = t.contiguous()
    shapes = dict(re.findall(r"^%(\d+)\s+= .*?\[([^\]]*)\]", ir, re.M))
    xent = re.search(r"= softmax_cross_entropy %(\d+)", ir)
    classes = int(shapes[xent.group(1)].split(",")[1])
    meta = {"mgc_version": "0.1.0", "net_file": net, "net_source": text, "set": "",
            "input": "x".join(str(d) for d in shape_of_input), "classes": str(classes), "precision": "fp32",
            "resize": "none", "pixels": "byte/255", "data": "random (tests/export_c.py)"}
    if normalize:
        mean, std = normalize.split(",")
        meta["normalize_mean"], meta["normalize_std"] = mean, std
    st.save(tensors, out, metadata=meta)


def images(c, h, w, n, out, seed=1):
    g = torch.Generator().manual_seed(seed)
    st.save({"images": torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)}, out)


def compare(a_path, b_path, tol):
    a, b = st.load(a_path)["logits"].double(), st.load(b_path)["logits"].double()
    if a.shape != b.shape:
        print("shapes differ: %s and %s" % (list(a.shape), list(b.shape)))
        return 1
    scale = b.abs().max().item() or 1.0
    worst = (a - b).abs().max().item() / scale
    top2 = b.topk(2, dim=1).values if b.shape[1] > 1 else None
    clear = (top2[:, 0] - top2[:, 1] > 10 * tol * scale) if top2 is not None else torch.ones(b.shape[0], dtype=torch.bool)
    differ = int(((a.argmax(1) != b.argmax(1)) & clear).sum())
    same_all = bool((a.argmax(1) == b.argmax(1)).all())
    print("relative difference %.3g (tolerance %g)%s; predictions %s (%d examples)" % (
        worst, tol, ", bit for bit" if torch.equal(a, b) else "",
        "the same" if same_all else "the same where clear, %d of %d differ where the top two are within rounding"
        % int((a.argmax(1) != b.argmax(1)).sum()), b.shape[0]))
    ok = (worst == 0 if tol == 0 else worst <= tol) and differ == 0
    return 0 if ok else 1


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "checkpoint":
        checkpoint(args[0], args[1], int(args[2]) if len(args) > 2 else 0, args[4] if len(args) > 4 else None)
    elif cmd == "images":
        c, h, w, n = (int(x) for x in args[:4])
        images(c, h, w, n, args[4], int(args[5]) if len(args) > 5 else 1)
    elif cmd == "compare":
        sys.exit(compare(args[0], args[1], float(args[2])))
    else:
        sys.exit("unknown command " + cmd)
