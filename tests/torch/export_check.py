#!/usr/bin/python3
"""mgc export --format pytorch, checked in PyTorch (issue 36, item 5):

    /usr/bin/python3 tests/torch/export_check.py [--only NAME] [--out DIR]

For every net in nets/ and tests/nets/ (and ResNet-18 with --set
small_stem=true): a checkpoint of random tensors under the net's names (read
from `mgc NET --emit eval-ir`; the norms' weights, biases and running
statistics drawn away from 1 and 0 so that each counts),
`mgc export CK --net NET --format pytorch --out model.py`, the module imported
in this process, `load(CK)` (load_state_dict, strict) and Net run in eval mode
on a few random images; its logits against `mgc predict CK IMAGES.safetensors`
on the same images: max |torch - mgc| / max |mgc| <= 1e-5 (float32 both, the
sums in other orders), or 4 times PyTorch float32's own distance from float64
where the net is that ill-conditioned (MobileNetV2 here: PyTorch's own 1.2e-5;
BatchNorm's random statistics amplify). Weights drawn with He's bound so the
images reach the logits (they must differ across images by 1e-3 of the largest:
PyTorch's default init left GoogLeNet's and NIN's logits the biases' alone). Where tests/torch has the net's hand-written twin
(models.py, zoo.py), its state_dict keys (less num_batches_tracked) must be
the exported Net's, and the two, in float64 with the same tensors, must agree
to 1e-9: the same computation, not only close numbers.

Then what a checkpoint of --save carries: bn_lenet and resize_input trained an
epoch on 512 Fashion-MNIST images with --normalize (and --resize 32x40), SGD
with momentum (its buffers in the checkpoint, which load() leaves), exported
without --net: Net(transform(uint8 images)) against mgc predict on the same
uint8 images, and the file's constants and header against the metadata. Labels
that Python cannot write as attributes (digits, Python keywords, every name
nn.Module of this torch has, one starting with '_'; at the top and inside
blocks): a net of them checked the same way. load() through the safetensors
package where one is installed (a stand-in here). And the refusals: a
checkpoint without a tensor of the net, or with one of another shape.

mgc's kernels are compiled at -O0 here (MGC_CC, a wrapper): the same
kernels, a tenth of the compile time; --optimised leaves mgc's flags.

Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""
import argparse
import glob
import importlib.util
import json
import keyword
import os
import re
import sys
import time
import zlib

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ref import ROOT, MgcError, Report, run_mgc, st_load, st_save  # noqa: E402
import models  # noqa: E402

OUT = os.path.join(ROOT, "tests", "out", "export_py")
DATA = os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist"))
TOL = 1e-5         # exported Net (float32) against mgc predict: max abs difference over the logits' max abs,
                   # or 4x PyTorch float32's own from float64 where the net is that ill-conditioned
SPREAD = 1e-3      # the logits' largest deviation across images over their largest value, at least
TWIN_TOL = 1e-9    # exported Net against the hand-written twin, both float64
IMAGES = 3         # images per net


def rel(p):
    return os.path.relpath(p, ROOT)


def max_rel(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def eval_graph(net, sets=()):
    """From `mgc NET --emit eval-ir`: (name, shape) of every parameter and state tensor
    of the evaluation graph, and the input's shape without N."""
    out = run_mgc([net, "--emit", "eval-ir"] + [a for s in sets for a in ("--set", s)])
    found = []
    for line in out.splitlines():
        m = re.match(r"%\d+\s+= (param|state) (\S+) .*?\[([\d,]+)\]", line)
        if m:
            found.append((m.group(2), tuple(int(d) for d in m.group(3).split(","))))
    shape = re.search(r"= input\s+\[N,([\d,]+)\]", out).group(1)
    return found, tuple(int(d) for d in shape.split(","))


def random_tensors(params, seed):
    """A checkpoint's tensors: uniform weights and biases, and for norms' weights, biases
    and running statistics values away from 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    norms = {n.rsplit(".", 1)[0] for n, _ in params if n.endswith(".running_var")}
    norms |= {n.rsplit(".", 1)[0] for n, s in params if n.endswith(".weight") and len(s) == 1}   # LayerNorm
    t = {}
    weights = dict(params)
    for name, shape in params:
        prefix, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        if prefix + ".weight" not in weights:   # a net's own tensor ('param pos[1, 3, 6, 6]'): no layer, no fan-in
            t[name] = 0.5 * torch.randn(shape, generator=g)
        elif prefix in norms:
            if leaf == "running_var":
                t[name] = 0.5 + torch.rand(shape, generator=g)
            elif leaf == "weight":
                t[name] = 1 + 0.2 * torch.randn(shape, generator=g)
            else:
                t[name] = 0.2 * torch.randn(shape, generator=g)
        else:
            fan_in = 1
            for d in (weights[prefix + ".weight"][1:]):
                fan_in *= d
            # He's uniform bound for weights (PyTorch's default, 1/sqrt(fan_in), lets the
            # images fade out of deep nets' logits), PyTorch's for biases
            bound = (6 / fan_in) ** 0.5 if leaf == "weight" else fan_in ** -0.5
            t[name] = (2 * torch.rand(shape, generator=g) - 1) * bound
    return {k: v.float().contiguous() for k, v in t.items()}


def import_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mgc_logits(ck, net, x, d, sets=()):
    """mgc predict's logits of images x (a safetensors file of them) from checkpoint ck."""
    st_save({"images": x}, os.path.join(d, "images.safetensors"))
    run_mgc(["predict", rel(ck), rel(os.path.join(d, "images.safetensors")), "--out",
             rel(os.path.join(d, "predict.safetensors"))] + (["--net", net] if net else [])
            + [a for s in sets for a in ("--set", s)])
    return st_load(os.path.join(d, "predict.safetensors"))["logits"]


def export(ck, d, name, net=None, sets=()):
    py = os.path.join(d, name + ".py")
    run_mgc(["export", rel(ck), "--format", "pytorch", "--out", rel(py)] + (["--net", net] if net else [])
            + [a for s in sets for a in ("--set", s)])
    return import_file(py, name), py


def check_net(rep, net, sets=(), out=None):
    """Export net with a random checkpoint; Net against mgc and the twin."""
    name = os.path.splitext(os.path.basename(net))[0] + "".join("_" + re.sub(r"\W", "_", s) for s in sets)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    params, shape = eval_graph(net, sets)
    seed = zlib.crc32(name.encode())
    tensors = random_tensors(params, seed)
    ck = os.path.join(d, "ck.safetensors")
    st_save(tensors, ck)
    x = torch.randn((IMAGES,) + shape, generator=torch.Generator().manual_seed(seed + 1))
    ref = mgc_logits(ck, net, x, d, sets)
    mod, _ = export(ck, d, name + "_model", net, sets)
    model = mod.load(ck)
    keys = set(model.state_dict())
    rep.check(name, "state_dict keys = the checkpoint's", keys == set(tensors),
              f"{len(keys)} tensors" if keys == set(tensors) else f"extra {sorted(keys - set(tensors))[:4]}, "
              f"missing {sorted(set(tensors) - keys)[:4]}")
    with torch.no_grad():
        got = model(x)
        exact = model.double()(x.double())
    spread = (ref.std(0).max() / ref.abs().max()).item()
    rep.check(name, "the logits depend on the images", spread >= SPREAD,
              f"spread {spread:.1e} of the largest (at least {SPREAD:.0e})")
    err = mgc_err = max_rel(got, ref)
    tol = max(TOL, 4 * max_rel(got, exact))
    rep.check(name, "Net against mgc predict", tuple(got.shape) == tuple(ref.shape) and err <= tol,
              f"max rel {err:.2e} (tol {tol:.1e}), logits {list(ref.shape)}")
    key = " ".join([net] + list(sets))
    if net in models.zoo.NETS or key in models.BUILDERS:
        twin, _ = models.build(net, torch.float64, sets)
        twin_keys = set(models.param_names(twin))
        rep.check(name, "twin's state_dict keys", twin_keys == keys,
                  "" if twin_keys == keys else f"twin only {sorted(twin_keys - keys)[:4]}, export only {sorted(keys - twin_keys)[:4]}")
        if twin_keys == keys:
            twin.load_state_dict({k: v.double() for k, v in tensors.items()}, strict=False)
            twin.eval()
            with torch.no_grad():
                err = max_rel(exact, twin(x.double()))
            rep.check(name, "Net against the twin (float64)", err <= TWIN_TOL, f"max rel {err:.2e} (tol {TWIN_TOL:.0e})")
    return mgc_err


def check_trained(rep, out, net, extra, name, sets=()):
    """A checkpoint of --save (its metadata: the net, its --set values, the transform)
    exported without --net: Net(transform(uint8 images)) against mgc predict."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    ck = os.path.join(d, "ck.safetensors")
    run_mgc([net, "--data", DATA, "--epochs", 1, "--limit-train", 512, "--limit-test", 256, "--batch-size", 64,
             "--momentum", 0.9, "--save", rel(ck)] + list(extra) + [a for s in sets for a in ("--set", s)])
    saved = st_load(ck)
    rep.check(name, "the checkpoint holds momentum buffers", any(k.endswith(".momentum_buffer") for k in saved),
              "(load() must leave them)")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from torch_lenet import load_split
    images, _ = load_split(DATA, "t10k", limit=5)
    u8 = (images * 255).round().to(torch.uint8)   # the IDX bytes again
    ref = mgc_logits(ck, None, u8, d)
    mod, py = export(ck, d, name + "_model")
    model = mod.load(ck)
    with torch.no_grad():
        got = model(mod.transform(u8))
    err = max_rel(got, ref)
    rep.check(name, "Net(transform(uint8)) against mgc predict", err <= TOL, f"max rel {err:.2e} (tol {TOL:.0e})")
    text = open(py).read()
    meta = json.loads(open(ck, "rb").read()[8:8 + int.from_bytes(open(ck, "rb").read(8), "little")])["__metadata__"]
    mean = [float(v) for v in meta["normalize_mean"].split(",")]
    rep.check(name, "MEAN is the checkpoint's", torch.equal(torch.tensor(mod.MEAN), torch.tensor(mean)),
              f"{mod.MEAN} against {mean}")
    if "resize" in meta and meta["resize"] != "none":
        rep.check(name, "RESIZE is the checkpoint's", "x".join(map(str, mod.RESIZE)) == meta["resize"], str(mod.RESIZE))
    rep.check(name, "INPUT_SHAPE and CLASSES", "x".join(map(str, mod.INPUT_SHAPE)) == meta["input"]
              and mod.CLASSES == int(meta["classes"]), f"{mod.INPUT_SHAPE} {mod.CLASSES}")
    header = text.split('"""')[1]
    rep.check(name, "the file's header names the net" + (" and its --set values" if sets else ""),
              meta["net_file"] in header and (not sets or "Its --set values: " + " ".join(sets) in header))
    return err


def module_names():
    """Names a Scope's attributes cannot hold here: nn.Module's, and Python's keywords
    that the .net language takes as labels."""
    lang = {"net", "block", "input", "return", "if", "then", "else", "for", "in", "and", "or", "not", "true", "false"}
    taken = sorted(n for n in dir(nn.Module()) if not n.startswith("_"))
    kw = [k for k in keyword.kwlist if k not in lang]
    return taken, kw


def check_names(rep, out):
    """A net labelled with every name nn.Module has, Python's keywords, digits and a
    leading underscore, at the top and inside blocks."""
    taken, kw = module_names()
    d = os.path.join(out, "names")
    os.makedirs(d, exist_ok=True)
    net = os.path.join(d, "names.net")
    lines = ["block pair(c)(x) {", "    return x -> train: conv2d(c, kernel = 1) -> 0: conv2d(c, kernel = 1)"
             " -> lambda: batchnorm2d -> tanh", "}", "net names(classes = 4) {", "    input x[N, 2, 5, 5]",
             "    y = x"]
    for i, n in enumerate(taken + kw):   # side by side, summed: each counts in the logits
        lines.append(f"    y = x -> {n}: conv2d(2, kernel = 1)" + (" -> tanh" if i % 4 == 3 else "") + " -> add(y)")
    lines += ["    y = y -> 7: pair(2) -> _under: pair(2) -> 8: pair(2)",
              "    return y -> flatten -> 9: linear(classes) -> softmax_cross_entropy", "}"]
    with open(net, "w") as f:
        f.write("\n".join(lines) + "\n")
    err = check_net(rep, rel(net), out=out)
    rep.check("names", f"{len(taken)} nn.Module names and {len(kw)} keywords as labels", err <= TOL)


def lenet_export(out):
    """nets/lenet.net's random checkpoint and exported file (no mgc predict): (checkpoint, .py)."""
    d = os.path.join(out, "lenet_plain")
    os.makedirs(d, exist_ok=True)
    ck = os.path.join(d, "ck.safetensors")
    st_save(random_tensors(eval_graph("nets/lenet.net")[0], 7), ck)
    _, py = export(ck, d, "lenet_plain_model", "nets/lenet.net")
    return ck, py


def check_safetensors_package(rep, out):
    """load() reads through safetensors.torch.load_file where the package is installed:
    a stand-in package on sys.path, counting its calls."""
    ck, py = lenet_export(out)
    d = os.path.join(out, "pkg", "safetensors")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "__init__.py"), "w").close()
    with open(os.path.join(d, "torch.py"), "w") as f:
        f.write("import sys\nsys.path.insert(0, %r)\nimport st\ncalls = []\n\n\ndef load_file(path):\n"
                "    calls.append(path)\n    return st.load(path)\n" % os.path.dirname(HERE))
    sys.path.insert(0, os.path.dirname(d))
    try:
        import safetensors.torch as fake
        model = import_file(py, "lenet_with_package").load(ck)
        ok = fake.calls == [ck] and set(model.state_dict()) == set(st_load(ck))
        rep.check("safetensors", "load() reads with the package where installed", ok, f"calls {fake.calls}")
    finally:
        sys.path.remove(os.path.dirname(d))
        for m in ("safetensors.torch", "safetensors"):
            sys.modules.pop(m, None)


def check_refusals(rep, out):
    """A checkpoint without a tensor of the net, or with one of another shape: status 1, named."""
    ck, _ = lenet_export(out)
    tensors = st_load(ck)
    d = os.path.dirname(ck)
    for what, change, text in (("missing", lambda t: t.pop("fc2.bias"), "has no tensor 'fc2.bias'"),
                               ("shape", lambda t: t.update({"conv2.weight": t["conv2.weight"][:8]}),
                                "'conv2.weight' is F32 [8,6,5,5], the net's is F32 [16,6,5,5]")):
        t = dict(tensors)
        change(t)
        bad = os.path.join(d, f"bad_{what}.safetensors")
        st_save(t, bad)
        py = os.path.join(d, f"bad_{what}.py")
        try:
            run_mgc(["export", rel(bad), "--net", "nets/lenet.net", "--format", "pytorch", "--out", rel(py)])
            rep.check("refusals", f"a tensor {what}", False, "exported")
        except MgcError as e:
            rep.check("refusals", f"a tensor {what}", "exited 1" in str(e) and text in str(e) and not os.path.exists(py),
                      str(e).splitlines()[-1].strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    help="the nets and other checks whose name contains this (repeatable)")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--optimised", action="store_true", help="mgc's kernels as it compiles them (-O3), not at -O0")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    if not a.optimised:
        # The kernels at -O0: the same text mgc compiles, a tenth of the compile time
        # (GoogLeNet's evaluation program: 0.8 s, not 7); the torch suites check them optimised.
        cc = os.path.join(out, "cc-O0")
        with open(cc, "w") as f:
            f.write("#!/bin/sh\nexec %s \"$@\" -O0\n" % os.environ.get("MGC_CC", "cc"))
        os.chmod(cc, 0o755)
        os.environ["MGC_CC"] = cc
    rep = Report()
    t0 = time.time()
    nets = [(rel(p), ()) for p in sorted(glob.glob(os.path.join(ROOT, "nets", "*.net")))
            + sorted(glob.glob(os.path.join(ROOT, "tests", "nets", "*.net")))]
    nets.append(("nets/resnet18.net", ("small_stem=true",)))   # --set: its twin is models.BUILDERS'
    worst = {}
    for net, sets in nets:
        label = " ".join((net,) + sets)
        if a.only and not any(o in label for o in a.only):
            continue
        tc = time.time()
        try:
            worst[label] = check_net(rep, net, sets, out=out)
        except Exception as e:  # a harness bug or mgc failing: one failure, go on
            rep.check(label, "harness", False, f"{type(e).__name__}: {e}")
        print(f"---- {label}: {time.time() - tc:.1f} s", flush=True)
    extras = (("trained_bn_lenet", check_trained, ("nets/bn_lenet.net", ["--normalize"], "trained_bn_lenet",
                                                   ("in_channels=1", "classes=10"))),
              ("trained_resize", check_trained, ("tests/nets/resize_input.net", ["--normalize", "--resize", "32x40"],
                                                 "trained_resize")),
              ("names", check_names, ()), ("safetensors", check_safetensors_package, ()),
              ("refusals", check_refusals, ()))
    for name, fn, args in extras:
        if a.only and not any(o in name for o in a.only):
            continue
        tc = time.time()
        try:
            fn(rep, out, *args)
        except Exception as e:
            rep.check(name, "harness", False, f"{type(e).__name__}: {e}")
        print(f"---- {name}: {time.time() - tc:.1f} s", flush=True)
    if worst:
        top = max(worst, key=worst.get)
        print(f"largest difference from mgc: {worst[top]:.2e} ({top}); {time.time() - t0:.0f} s")
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
