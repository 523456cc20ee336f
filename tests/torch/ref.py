#!/usr/bin/python3
"""Check mgc against PyTorch (CPU, float64 reference) through mgc's test hooks.

    /usr/bin/python3 tests/torch/ref.py                # all cases
    /usr/bin/python3 tests/torch/ref.py --only op_conv # cases whose name contains / matches
    /usr/bin/python3 tests/torch/ref.py --list
    /usr/bin/python3 tests/torch/ref.py --skip 'dp_*'  # all cases but those
    /usr/bin/python3 tests/torch/ref.py --shard 1/4    # every 4th case from the second: 4 processes share them
    MGC=./mgc /usr/bin/python3 tests/torch/ref.py      # binary (default ./mgc; may be a command)
    /usr/bin/python3 tests/torch/ref.py --precision bf16  # mgc --precision bf16 against autocast (below)
    REF_DP_DEVICES=cuda:0 ...  # the dp_* cases' k replicas on one GPU (cuda:0 k times);
    REF_DP_DEVICES=cuda ...    # on k GPUs, cuda:0 .. cuda:k-1 (default cpu:k)

For every case: write a seeded random batch (x F32 [B,C,H,W], y I64 [B]);
`mgc NET --epochs 0 --seed S --save init.safetensors` gives mgc's initial
weights; they are loaded into the hand-written PyTorch twin (tests/torch/models.py);
`mgc NET --load init --check-batch batch --steps K --lr --momentum --weight-decay --dump out`
is compared with the same K SGD steps in PyTorch: loss of each step, logits,
grad.x, grad.<param>, final parameters, BN running stats, eval_logits.
Error = ||mgc - torch|| / max(||torch||, tiny), norm-wise.  Also: mgc's init
against PyTorch's init distributions, and finite-difference checks OF mgc
(central differences of mgc's own loss against mgc's own gradients).

With --precision bf16, mgc runs with --precision bf16 and PyTorch's same
steps run twice more: in float32 under torch.autocast(dtype=bfloat16), and
in float64 (exact, as above). Every quantity of mgc's must be within
max(2 x autocast's own error, 2^-8) of float64's: no further from exact
arithmetic than twice what autocast makes of the same steps, or one bf16
rounding (8 significant bits) of the norm; and where the net has a GEMM its
logits must be further than 1e-5 from float64 (the operands really were
rounded: float32 alone stays near 1e-7).

Prints one line per check and `N passed, M failed`; exits 1 on any failure.
Work files go to tests/out/torch/ (git-ignored), or --out DIR / $REF_OUT.
"""
import argparse
import copy
import re
import fnmatch
import glob
import math
import os
import shlex
import subprocess
import sys
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/ for st.py
import models  # noqa: E402

try:
    import st as _st  # the project's own reader/writer (tests/st.py)

    def st_load(path):
        return _st.load(path)

    def st_save(d, path):
        _st.save(d, path)
except ImportError:  # pragma: no cover - fallback: the safetensors package
    import safetensors.torch as _sft

    def st_load(path):
        return _sft.load_file(path)

    def st_save(d, path):
        _sft.save_file({k: v.contiguous() for k, v in d.items()}, path)

OUT = os.environ.get("REF_OUT", os.path.join(ROOT, "tests", "out", "torch"))
FD_LR = 0.1  # any: the finite differences use loss[0], the loss before the update
TINY = 1e-6  # norm floor: below this a reference is "zero" and the error absolute
PRECISION = "fp32"  # --precision: bf16 runs mgc --precision bf16 against autocast
# bf16 keeps 8 significant bits: a value rounded to it (to nearest) errs by at
# most 2^-9 of itself, a product of two by about 2^-8; the norm-wise floor of
# the bf16 checks is one such unit of the quantity's norm
BF16_UNIT = 2.0 ** -8
BF16_ROUNDED = 1e-5  # logits further than this from float64: bf16 rounding happened (float32 alone: ~1e-7)

# ----------------------------------------------------------------------------
# bookkeeping


class Report:
    def __init__(self, verbose=False):
        self.passed = self.failed = 0
        self.failures = []
        self.verbose = verbose

    def check(self, case, what, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(f"{case} {what}")
        print(f"{'PASS' if ok else 'FAIL'} {case:<22} {what:<38} {detail}", flush=True)
        return ok

    def compare(self, case, what, got, ref, tol, floor=0.0):
        if got is None:
            return self.check(case, what, False, "missing from mgc's output")
        got = got.detach().double()
        ref = ref.detach().double()
        if tuple(got.shape) != tuple(ref.shape):
            return self.check(case, what, False,
                              f"shape {list(got.shape)}, want {list(ref.shape)}")
        if not torch.isfinite(got).all():
            return self.check(case, what, False, "non-finite values")
        err, zero = dump_err(got, ref, floor)
        if zero:
            tol = 10 * tol
            return self.check(case, what, err <= tol, f"err {err:.2e} (tol {tol:.0e}, zero ref)")
        return self.check(case, what, err <= tol, f"err {err:.2e} (tol {tol:.0e})")


def dump_err(got, ref, floor=0.0):
    """(error, zero ref): relative, or where ref is zero in exact arithmetic (a
    conv bias just before a BatchNorm; float32 leaves rounding noise) against
    the floor's scale."""
    got, ref = got.detach().double(), ref.detach().double()
    if floor > 0 and float(ref.norm()) < 1e-3 * floor:
        return float((got - ref).norm()) / floor, True
    return rel_err(got, ref), False


def rel_err(a, b):
    return float((a - b).norm()) / max(float(b.norm()), TINY)


class MgcError(Exception):
    pass


def mgc_cmd():
    return shlex.split(os.environ.get("MGC", "./mgc"))


def run_mgc(args, log=None, timeout=int(os.environ.get("REF_MGC_TIMEOUT", "300"))):
    cmd = mgc_cmd() + [str(a) for a in args]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    if log is not None:
        log.append((" ".join(shlex.quote(c) for c in cmd), time.time() - t0))
    if p.returncode != 0:
        tail = p.stdout.decode(errors="replace").strip().splitlines()[-8:]
        raise MgcError(f"`{' '.join(cmd)}` exited {p.returncode}:\n    " + "\n    ".join(tail))
    return p.stdout.decode(errors="replace")


# ----------------------------------------------------------------------------
# data and reference


def make_batch(shape, n, seed, classes=10, real=False):
    g = torch.Generator().manual_seed(seed)
    if real:
        x = real_batch(n, seed)
        if x is not None:
            return x
    x = torch.randn((n,) + tuple(shape), generator=g, dtype=torch.float32)
    y = torch.randint(0, classes, (n,), generator=g, dtype=torch.int64)
    return x, y


def real_batch(n, seed):
    """n Fashion-MNIST training images (pixels / 255) if the data is there."""
    d = os.environ.get("MGC_DATA", os.path.join(ROOT, "..", "shared", "data", "fashion-mnist"))
    try:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        from torch_lenet import load_split
        x, y = load_split(d, "train", limit=max(n * 8, 512))
    except (OSError, ValueError, ImportError):
        return None
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:n]
    return x[idx].contiguous(), y[idx].contiguous()


def load_into(model, init, case, rep):
    """Copy mgc's initial tensors into the model; names must match exactly."""
    want = set(models.param_names(model))
    have = set(init)
    missing, extra = sorted(want - have), sorted(have - want)
    detail = ""
    if missing:
        detail += f"missing {missing[:6]}{'...' if len(missing) > 6 else ''} "
    if extra:
        detail += f"unexpected {extra[:6]}{'...' if len(extra) > 6 else ''}"
    ok = rep.check(case, "init: parameter names", not missing and not extra,
                   detail or f"{len(want)} tensors")
    sd = model.state_dict()
    shapes_ok, bad = True, []
    for k in want & have:
        t = init[k]
        if tuple(t.shape) != tuple(sd[k].shape):
            shapes_ok, bad = False, bad + [f"{k} {list(t.shape)} want {list(sd[k].shape)}"]
            continue
        if t.dtype != torch.float32:
            shapes_ok, bad = False, bad + [f"{k} dtype {t.dtype}"]
        sd[k] = t.to(sd[k].dtype)
    rep.check(case, "init: shapes and dtypes", shapes_ok, "; ".join(bad[:4]))
    model.load_state_dict(sd)
    return ok and shapes_ok


def shard_bounds(b, parts):
    """How mgc splits a batch over replicas: (first, count), sizes within one."""
    q, r = divmod(b, parts)
    out, first = [], 0
    for j in range(parts):
        n = q + (1 if j < r else 0)
        out.append((first, n))
        first += n
    return out


def torch_optimizer(params, lr, momentum, wd, optim=None):
    """PyTorch's optimizer for a case: SGD (optionally Nesterov) or, with
    optim={"kind": "adamw", "betas": (b1, b2), "eps": e}, AdamW."""
    optim = optim or {}
    if optim.get("kind") == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=optim.get("betas", (0.9, 0.999)),
                                 eps=optim.get("eps", 1e-8), weight_decay=wd)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd,
                           nesterov=optim.get("nesterov", False))


def optimizer_args(optim, momentum, wd):
    """mgc's flags for the same optimizer."""
    optim = optim or {}
    if optim.get("kind") == "adamw":
        b1, b2 = optim.get("betas", (0.9, 0.999))
        return ["--optimizer", "adamw", "--betas", f"{b1!r},{b2!r}", "--eps", repr(optim.get("eps", 1e-8)),
                "--weight-decay", wd]
    return (["--momentum", momentum, "--weight-decay", wd]
            + (["--nesterov"] if optim.get("nesterov") else []))


def torch_steps(model, x, y, steps, lr, momentum, wd, shards=1, optim=None, autocast=False):
    """K SGD steps on one batch; returns the dump mgc is expected to write.
    shards > 1: data parallelism as DDP does it, BatchNorm on each shard's own
    statistics: the loss is the global batch's mean (each shard's mean weighted
    by its share), and the running statistics are replica 0's.
    autocast: the forward passes (training and evaluation) under
    torch.autocast("cpu", dtype=torch.bfloat16) (a float32 model)."""
    # cache_enabled=False: autocast's cache of bf16 weight copies lives as long as its
    # context, and would hand later steps the weights of the first
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
        return _torch_steps(model, x, y, steps, lr, momentum, wd, shards, optim)


def _torch_steps(model, x, y, steps, lr, momentum, wd, shards, optim):
    model.train()
    dt = next(model.parameters()).dtype
    x = x.detach().to(dt).clone().requires_grad_(True)
    opt = torch_optimizer(model.parameters(), lr, momentum, wd, optim)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=getattr(model, "label_smoothing", 0.0))
    out = {"loss": torch.zeros(steps, dtype=dt)}
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        if x.grad is not None:
            x.grad = None
        if shards > 1:
            # shards after the first update copies of the running statistics,
            # dropped afterwards: the model keeps replica 0's
            bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
            parts, loss = [], 0
            for j, (f, n) in enumerate(shard_bounds(x.shape[0], shards)):
                own = [(m, m.running_mean, m.running_var) for m in bns]
                if j > 0:
                    for m in bns:
                        m.running_mean, m.running_var = m.running_mean.clone(), m.running_var.clone()
                parts.append(model(x[f:f + n]))
                loss = loss + loss_fn(parts[-1], y[f:f + n]) * (n / x.shape[0])
                for m, rm, rv in own:
                    m.running_mean, m.running_var = rm, rv
            logits = torch.cat(parts)
        else:
            logits = model(x)
            loss = loss_fn(logits, y)
        loss.backward()
        out["loss"][k] = loss.detach()
        if k == 0:
            out["logits"] = logits.detach().clone()
            out["grad.x"] = x.grad.detach().clone()
            for n, p in model.named_parameters():
                out["grad." + n] = p.grad.detach().clone()
        opt.step()
    for n, t in model.state_dict().items():
        if not n.endswith("num_batches_tracked"):
            out[n] = t.detach().clone()
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = model(x.detach())
    return out


# ----------------------------------------------------------------------------
# cases


def bf16r(t):
    """t rounded to bfloat16 (PyTorch's conversion: to nearest, ties to even), in t's dtype."""
    return t.float().to(torch.bfloat16).to(t.dtype)


class _Bf16Conv(torch.autograd.Function):
    """mgc's conv2d under --precision bf16, in t's precision: x and w rounded to
    bf16 in the forward, dy and w (input gradient) or dy and x (weight
    gradient) in the backward; the bias and its gradient unrounded."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups):
        xr, wr = bf16r(x), bf16r(w)
        ctx.save_for_backward(xr, wr)
        ctx.geom, ctx.has_b = (stride, padding, dilation, groups), b is not None
        return _F_CONV2D(xr, wr, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geom
        dyr = bf16r(dy)
        dx = torch.nn.grad.conv2d_input(xr.shape, wr, dyr, stride, padding, dilation, groups)
        dw = torch.nn.grad.conv2d_weight(xr, wr.shape, dyr, stride, padding, dilation, groups)
        return dx, dw, dy.sum((0, 2, 3)) if ctx.has_b else None, None, None, None, None


class _Bf16Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        xr, wr = bf16r(x), bf16r(w)
        ctx.save_for_backward(xr, wr)
        ctx.has_b = b is not None
        y = xr @ wr.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = bf16r(dy)   # [N, (T,) O]: every row of every example
        rows = lambda t: t.reshape(-1, t.shape[-1])
        return dyr @ wr, rows(dyr).t() @ rows(xr), rows(dy).sum(0) if ctx.has_b else None


class _Bf16ConvT(torch.autograd.Function):
    """mgc's conv_transpose2d under --precision bf16 (conv2d's input gradient as a layer): x and w
    rounded in the forward; dy and w (its input gradient, a convolution), dy and x (its weight
    gradient) in the backward; the bias (a broadcast add) unrounded."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, output_padding, groups, dilation):
        xr, wr = bf16r(x), bf16r(w)
        ctx.save_for_backward(xr, wr)
        ctx.geom, ctx.has_b = (stride, padding, dilation, groups), b is not None
        y = _F_CONV_T(xr, wr, None, stride, padding, output_padding, groups, dilation)
        return y + b.reshape(1, -1, 1, 1) if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geom
        dyr = bf16r(dy)
        dx = _F_CONV2D(dyr, wr, None, stride, padding, dilation, groups)
        dw = torch.nn.grad.conv2d_weight(dyr, wr.shape, xr, stride, padding, dilation, groups)
        return dx, dw, dy.sum((0, 2, 3)) if ctx.has_b else None, None, None, None, None, None


_F_CONV2D, _F_LINEAR, _F_CONV_T = F.conv2d, F.linear, F.conv_transpose2d


def _conv_t_bf16(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    if groups > 1 and w.shape[1] == 1:   # a channel a group: mgc keeps it in float32
        return _F_CONV_T(x, w, b, stride, padding, output_padding, groups, dilation)
    return _Bf16ConvT.apply(x, w, b, stride, padding, output_padding, groups, dilation)


def _conv2d_bf16(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    if groups > 1 and w.shape[1] == 1:   # depthwise: mgc keeps it in float32
        return _F_CONV2D(x, w, b, stride, padding, dilation, groups)
    return _Bf16Conv.apply(x, w, b, stride, padding, dilation, groups)


class emulated_bf16:
    """Within it, F.conv2d, F.linear and F.conv_transpose2d (what nn.Conv2d, nn.Linear and
    nn.ConvTranspose2d call) are
    mgc's --precision bf16 semantics (ir/precision.c) in the model's own
    precision: the reference for mgc's bf16 written with PyTorch's rounding."""

    def __enter__(self):
        F.conv2d, F.linear = _conv2d_bf16, lambda x, w, b=None: _Bf16Linear.apply(x, w, b)
        F.conv_transpose2d = _conv_t_bf16

    def __exit__(self, *exc):
        F.conv2d, F.linear, F.conv_transpose2d = _F_CONV2D, _F_LINEAR, _F_CONV_T


def case_dir(name):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    return d


def rel(p):
    return os.path.relpath(p, ROOT)


def set_args(sets):
    return [a for s in sets for a in ("--set", s)]


def mgc_init(net, d, seed, log, sets=(), batch=8, extra=()):
    """mgc's initial weights.  --batch-size only keeps mgc's buffers small: the
    initial weights must not depend on it."""
    init = os.path.join(d, "init.safetensors")
    if os.path.exists(init):
        os.remove(init)
    run_mgc([net, "--epochs", 0, "--seed", seed, "--batch-size", batch, "--save", rel(init)]
            + set_args(sets) + list(extra), log)
    return init


def mgc_dump(net, init, batch, out, steps, lr, momentum, wd, log, sets=(), extra=(), optim=None):
    if os.path.exists(out):
        os.remove(out)
    run_mgc([net, "--load", rel(init), "--check-batch", rel(batch), "--steps", steps, "--lr", lr]
            + optimizer_args(optim, momentum, wd) + ["--dump", rel(out)] + set_args(sets) + list(extra)
            + (["--precision", PRECISION] if PRECISION != "fp32" else []), log)
    return st_load(out)


def run_compare_case(c, rep, log):
    """The main check: mgc's dump against PyTorch's, same init, same batch."""
    name, net = c["name"], c["net"]
    if not os.path.exists(os.path.join(ROOT, net)):
        rep.check(name, "net file", False, f"{net} does not exist")
        return
    d = case_dir(name)
    sets = c.get("set", ())
    model, shape = models.build(net, torch.float64, sets)
    x, y = make_batch(shape, c["batch"], c["seed"], real=c.get("real", False))
    batch = os.path.join(d, "batch.safetensors")
    st_save({"x": x, "y": y}, batch)
    try:
        init = mgc_init(net, d, c["seed"], log, sets, c["batch"], c.get("mgc_args", ()))
        init_t = st_load(init)
    except MgcError as e:
        rep.check(name, "mgc --epochs 0 --save", False, str(e))
        return
    if not load_into(model, init_t, name, rep):
        return
    if c.get("check_init"):
        check_init_distribution(model, init_t, name, rep)
    try:
        got = mgc_dump(net, init, batch, os.path.join(d, "out.safetensors"), c["steps"],
                       c["lr"], c["momentum"], c["wd"], log, sets, c.get("mgc_args", ()), c.get("optim"))
    except MgcError as e:
        rep.check(name, "mgc --check-batch --dump", False, str(e))
        return
    m32 = copy.deepcopy(model).float() if c.get("f32_tol") else None
    mac = copy.deepcopy(model).float() if PRECISION == "bf16" else None
    mem = copy.deepcopy(model) if PRECISION == "bf16" else None
    ref = torch_steps(model, x, y, c["steps"], c["lr"], c["momentum"], c["wd"], c.get("shards", 1),
                      c.get("optim"))
    # f32_tol: a net whose float32 arithmetic is ill-conditioned at this size
    # (MobileNetV2's ReLU6/BatchNorm chain: PyTorch's own float32 is 1e-2 from
    # float64 on some gradients) is held to PyTorch's float32 instead: each
    # quantity within 6x PyTorch's float32 distance from float64 (or the tolerance):
    # mgc's float32 sums in another order (on an AVX2 CPU, 8-float vectors: 5x on
    # MobileNetV2's g3.1.bn1.weight gradient, 3e-2 from float64 to PyTorch's 2.5e-2)
    ref32 = (torch_steps(m32, x, y, c["steps"], c["lr"], c["momentum"], c["wd"], c.get("shards", 1), c.get("optim"))
             if m32 is not None else None)
    refac = refem = None
    if mem is not None:
        try:
            refac = torch_steps(mac, x, y, c["steps"], c["lr"], c["momentum"], c["wd"], c.get("shards", 1), c.get("optim"),
                                autocast=True)
        except RuntimeError as e:   # PyTorch 1.13's CPU autocast lacks a few bf16 kernels (ReLU6's gradient, ...)
            print(f"NOTE {name}: no autocast reference: {str(e).splitlines()[0][:100]}")
        bad = [k for k, t in (refac or {}).items() if t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:   # (1.13's CPU autocast of a float32 parameter concatenated to bf16 activations: NaN gradients)
            print(f"NOTE {name}: no autocast reference: its {bad[0]} is not finite")
            refac = None
        with emulated_bf16():
            refem = torch_steps(mem, x, y, c["steps"], c["lr"], c["momentum"], c["wd"], c.get("shards", 1), c.get("optim"))
        check_bf16(c, rep, got, ref, refac, refem)
        if c.get("mgc_args"):
            check_replicas(c, rep, got)
        return
    if c.get("mgc_args"):
        check_replicas(c, rep, got)
    gk, g_rms, param_keys = grad_scale(ref)
    for k, v in ref.items():
        if c.get("keys") is not None and k not in c["keys"]:
            continue
        floor = zero_floor(k, v, c, gk, g_rms, param_keys)
        tol = tolerance(c["tol"], k)
        if ref32 is not None and k in ref32:
            e32, zero = dump_err(ref32[k], v, floor)
            tol = max(tol, 6 * (e32 / 10 if zero else e32))
        rep.compare(name, k, got.get(k), v, tol, floor)
    if c.get("extra"):
        c["extra"](c, rep, model, x, y, got)


def grad_scale(ref):
    """The parameter gradients' keys, their RMS over all of them, and the
    parameters' names: zero_floor's scales."""
    gk = [k for k in ref if k.startswith("grad.") and k != "grad.x"]
    allg = torch.cat([ref[k].flatten() for k in gk]) if gk else torch.zeros(1)
    return gk, float(allg.norm()) / math.sqrt(max(1, allg.numel())), {k[len("grad."):] for k in gk}


def zero_floor(k, v, c, gk, g_rms, param_keys):
    """The scale against which quantity k (reference v) is measured where it is
    zero in exact arithmetic (see dump_err), or 0."""
    # scale for gradients that are exactly zero in exact arithmetic: 0.1 x the
    # RMS of all parameter gradients, times sqrt(numel); likewise what a step
    # leaves at zero (a BatchNorm's bias whose gradient is zero: a 1x1 conv and
    # BatchNorm after it, as MobileNetV2's), and running means of zero-mean
    # activations: against a step's scale, and BatchNorm's momentum (0.1) times
    # activations of order 1
    return (0.1 * g_rms * math.sqrt(v.numel()) if k in gk else
            0.1 * c["lr"] * g_rms * math.sqrt(v.numel()) if k in param_keys else
            0.01 * math.sqrt(v.numel()) if k.endswith("running_mean") else 0.0)


def check_bf16(c, rep, got, ref, refac, refem):
    """mgc --precision bf16 (see the module's docstring): refem is PyTorch's
    float64 with mgc's bf16 policy (emulated_bf16), refac PyTorch's autocast
    (None where it cannot run the net), ref float64."""
    name = c["name"]
    keys = [k for k in ref if c.get("keys") is None or k in c["keys"]]
    gk, g_rms, param_keys = grad_scale(ref)
    if not bf16_gemms(c):
        for k in keys:   # nothing multiplies in bf16: float32 as without --precision
            rep.compare(name, k, got.get(k), ref[k], tolerance(c["tol"], k), zero_floor(k, ref[k], c, gk, g_rms, param_keys))
        return
    # the rounding happened: where the emulation's rounding shows (it does not where
    # every operand is a bf16 value or zero: a convolution that only sees padding),
    # some quantity of mgc's is further from float64 than float32 alone goes
    far = max((dump_err(got[k], ref[k])[0] for k in keys if k in got), default=0.0)
    shows = max((dump_err(refem[k], ref[k])[0] for k in keys), default=0.0)
    if shows > BF16_ROUNDED:
        rep.check(name, "bf16: operands rounded", far > BF16_ROUNDED,
                  f"furthest quantity {far:.2e} from float64 (more than {BF16_ROUNDED:.0e} expected)")
    # (a) mgc computes what it says: the first step's logits and gradients against
    # the emulation, float32's tolerance times 10 (an operand mgc computes in
    # float32 may round to the other bf16 neighbour of the float64 one: rare,
    # each such flip 2^-8 of that element). Winograd's form rounds its
    # transformed operands instead of the layer's (codegen/winograd.c): another
    # rounding of the same size; and in a net whose float32 is already
    # ill-conditioned (f32_tol: PyTorch's float32 1e-2 from float64) one flip
    # moves everything after it, as in the zoo's nets at batches of 2 to 8
    # (BatchNorm over few values: BN-LeNet's first step moves 2e-3 with one
    # operand of conv2 rounded the other way, where float32 alone moves 7e-7;
    # GoogLeNet's at batch 2 up to 1.4x the larger distance: 3x there). There two bf16 roundings' errors of size e are
    # at most about 2e apart: mgc within twice the larger of the emulation's and
    # autocast's distances from float64, or of one bf16 unit. (After an update a flip's
    # difference goes through the optimizer, AdamW's dividing by the gradient's
    # size: the later quantities are held to (b).)
    loose = winograd_in(c) or c.get("f32_tol") or name.startswith("zoo_")
    for k in keys:
        if k != "logits" and not k.startswith("grad."):
            continue
        floor = zero_floor(k, ref[k], c, gk, g_rms, param_keys)
        eem, zero = dump_err(refem[k], ref[k], floor)
        eac = dump_err(refac[k], ref[k], floor)[0] if refac is not None and k in refac else 0.0
        f = 3 if name.startswith("zoo_") else 2
        tol = f * max(max(eem, eac) / (10 if zero else 1), BF16_UNIT) if loose else 10 * tolerance(c["tol"], k)
        rep.compare(name, "emulated: " + k, got.get(k), refem[k], tol, floor)
    # (b) against autocast: no further from float64 than 4x the larger of
    # autocast's and the emulated policy's own distances from it, or one bf16
    # unit (2^-8) of the norm: the two policies round at different points
    # (autocast also rounds every activation and gradient between the GEMMs),
    # and on these small batches either one's error may be a few times the other's
    if refac is None:
        return
    for k in keys:
        if k not in refac:
            continue
        floor = zero_floor(k, ref[k], c, gk, g_rms, param_keys)
        eac, zero = dump_err(refac[k], ref[k], floor)
        eem, _ = dump_err(refem[k], ref[k], floor)
        tol = max(4 * max(eac, eem), BF16_UNIT) / (10 if zero else 1)
        rep.compare(name, "autocast: " + k, got.get(k), ref[k], tol, floor)


def winograd_in(c):
    """Whether mgc's program for the case takes Winograd's form somewhere."""
    args = ([c["net"]] + set_args(c.get("set", ())) + list(c.get("mgc_args", ())) + ["--precision", PRECISION, "--emit", "kernels"])
    p = subprocess.run(mgc_cmd() + args, capture_output=True, text=True, cwd=ROOT)
    return "_winograd" in p.stdout


def check_replicas(c, rep, got):
    """The replicas must hold the same parameters and momentum, bit for bit,
    and with --sync-bn the same running statistics before any copy."""
    name = c["name"]
    n = got.get("replicas.count")
    rep.check(name, "replicas: count", n is not None and int(n[0]) == c["replicas"],
              f"{None if n is None else int(n[0])} replicas, want {c['replicas']}")
    pd = got.get("replicas.param_diff")
    rep.check(name, "replicas: same parameters", pd is not None and float(pd[0]) == 0.0,
              f"max difference {None if pd is None else float(pd[0]):.3g}")
    if "--sync-bn" in c["mgc_args"]:
        sd = got.get("replicas.state_diff")
        rep.check(name, "replicas: same running stats", sd is not None and float(sd[0]) == 0.0,
                  f"max difference {None if sd is None else float(sd[0]):.3g}")


def bf16_gemms(c):
    """Whether mgc --precision bf16 multiplies some node of the case's net in bf16 (--emit grad)."""
    args = ([c["net"]] + set_args(c.get("set", ())) + list(c.get("mgc_args", ())) + ["--precision", "bf16", "--emit", "grad"])
    p = subprocess.run(mgc_cmd() + args, capture_output=True, text=True, cwd=ROOT)
    return "bf16*bf16" in p.stdout


def tolerance(tol, key):
    """tol: a number, or a dict with "default", optionally "grad" (every
    grad.*) and exact dump keys."""
    if not isinstance(tol, dict):
        return tol
    if key in tol:
        return tol[key]
    if key.startswith("grad.") and "grad" in tol:
        return tol["grad"]
    return tol["default"]


def dropout_extra(c, rep, model, x, y, got):
    """op_dropout_half: x -> dropout(0.5) -> flatten -> fc.  PyTorch's mask is
    not mgc's, so infer mgc's step-0 mask from grad.x (zero where dropped) and
    check mgc against itself: logits = fc(x*mask/(1-p)) with the initial
    weights, grad.x, grad.fc.weight, the SGD update, and eval_logits = fc(x)
    (no dropout in eval mode) with the final weights."""
    name = c["name"]
    need = ["grad.x", "logits", "eval_logits", "grad.fc.weight", "fc.weight", "fc.bias"]
    miss = [k for k in need if k not in got]
    if miss:
        rep.check(name, "dropout: dump keys", False, f"missing {miss}")
        return
    gx = got["grad.x"].double()
    kept = (gx != 0).double()
    frac = float(kept.mean())
    rep.check(name, "dropout: kept fraction ~ 1-p", 0.35 < frac < 0.65, f"kept {frac:.3f}")
    init = st_load(os.path.join(OUT, name, "init.safetensors"))
    w, b = init["fc.weight"].double(), init["fc.bias"].double()
    xd = x.double()
    xm = (xd * kept * 2.0).flatten(1)
    logits = xm @ w.t() + b
    rep.compare(name, "dropout: logits = fc(x*mask/(1-p))", got["logits"], logits, 1e-4)
    p = torch.softmax(logits, 1)
    p[torch.arange(len(y)), y] -= 1
    p /= len(y)
    rep.compare(name, "dropout: grad.x", gx.flatten(1), (p @ w) * 2.0 * kept.flatten(1), 1e-4)
    rep.compare(name, "dropout: grad.fc.weight", got["grad.fc.weight"], p.t() @ xm, 1e-4)
    w1 = w - c["lr"] * (p.t() @ xm)
    b1 = b - c["lr"] * p.sum(0)
    rep.compare(name, "dropout: fc.weight after SGD", got["fc.weight"], w1, 1e-4)
    rep.compare(name, "dropout: eval_logits = fc(x)", got["eval_logits"],
                xd.flatten(1) @ w1.t() + b1, 1e-4)


def check_init_distribution(model, init, case, rep):
    """kaiming_uniform(a=sqrt(5)) and bias U(+-1/sqrt(fan_in)); BN 1, 0, 0, 1."""
    for mname, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            w = init[mname + ".weight"].double()
            fan_in = w[0].numel()
            bound = 1 / math.sqrt(fan_in)
            inside = float(w.abs().max()) <= bound * (1 + 1e-6)
            std = float(w.std())
            want = bound / math.sqrt(3)
            n = w.numel()
            # the sample std of n uniforms is within ~5/sqrt(n) of the truth
            close = abs(std / want - 1) < max(0.05, 5 / math.sqrt(n))
            mean_ok = abs(float(w.mean())) < 5 * want / math.sqrt(n)
            rep.check(case, f"init: {mname}.weight U(+-1/sqrt({fan_in}))",
                      inside and close and mean_ok,
                      f"max {float(w.abs().max()):.4f} <= {bound:.4f}, std {std:.4f} ~ {want:.4f}")
            if m.bias is not None:
                b = init[mname + ".bias"].double()
                rep.check(case, f"init: {mname}.bias U(+-1/sqrt({fan_in}))",
                          float(b.abs().max()) <= bound * (1 + 1e-6) and float(b.std()) > 0,
                          f"max {float(b.abs().max()):.4f}")
        elif isinstance(m, nn.BatchNorm2d):
            ok = (torch.all(init[mname + ".weight"] == 1) and torch.all(init[mname + ".bias"] == 0)
                  and torch.all(init[mname + ".running_mean"] == 0)
                  and torch.all(init[mname + ".running_var"] == 1))
            rep.check(case, f"init: {mname} = (1, 0, 0, 1)", bool(ok))
    # a net's own learned tensors ('param'): the twin says how PyTorch would start them
    for pname, (kind, arg) in getattr(model, "param_inits", {}).items():
        t = init[pname].double()
        if kind == "normal":   # torch.randn(shape) * std: the sample's mean and std within ~5/sqrt(n)
            n = t.numel()
            ok = abs(float(t.mean())) < 5 * arg / math.sqrt(n) and abs(float(t.std()) / arg - 1) < max(0.05, 5 / math.sqrt(n))
            rep.check(case, f"init: {pname} ~ N(0, {arg}^2)", ok, f"mean {float(t.mean()):.4g}, std {float(t.std()):.4g}")
        else:                  # torch.full(shape, value), torch.zeros, torch.ones
            rep.check(case, f"init: {pname} = {arg}", bool(torch.all(t == torch.tensor(arg, dtype=torch.float32).double())))


def run_seed_case(c, rep, log):
    """Same seed -> same init; another seed -> another init; --batch-size
    plays no part (the other cases initialise with their own batch size)."""
    name, net = c["name"], c["net"]
    if not os.path.exists(os.path.join(ROOT, net)):
        rep.check(name, "net file", False, f"{net} does not exist")
        return
    d = case_dir(name)
    try:
        a = st_load(mgc_init(net, d, 1, log))
        os.rename(os.path.join(d, "init.safetensors"), os.path.join(d, "a.safetensors"))
        b = st_load(mgc_init(net, d, 1, log))
        os.rename(os.path.join(d, "init.safetensors"), os.path.join(d, "b.safetensors"))
        e = st_load(mgc_init(net, d, 2, log))
        f = st_load(mgc_init(net, d, 1, log, batch=256))
    except MgcError as err:
        rep.check(name, "mgc --epochs 0 --save", False, str(err))
        return
    same = set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    rep.check(name, "same --seed, same init", same)
    rep.check(name, "init independent of --batch-size",
              set(a) == set(f) and all(torch.equal(a[k], f[k]) for k in a))
    w = [k for k in a if k.endswith(".weight") and a[k].dim() > 1]
    diff = bool(w) and all(not torch.equal(a[k], e[k]) for k in w if k in e)
    rep.check(name, "other --seed, other init", diff)


def run_fd_case(c, rep, log):
    """Finite differences OF mgc: central differences of mgc's own loss (one
    step, lr 0, --dump's loss[0]) against mgc's own gradient (grad.x,
    grad.<param>), both for single coordinates (n_x of x, n_p parameters) and
    along whole-tensor directions (dirs: the gradient's own direction, whose
    derivative is ||g|| and so is far above float32 noise, and a random one).
    The perturbed batch / weights are written as new files for mgc to read."""
    name, net = c["name"], c["net"]
    if not os.path.exists(os.path.join(ROOT, net)):
        rep.check(name, "net file", False, f"{net} does not exist")
        return
    d = case_dir(name)
    _, shape = models.build(net)
    x, y = make_batch(shape, c["batch"], c["seed"])
    batch = os.path.join(d, "batch.safetensors")
    st_save({"x": x, "y": y}, batch)
    try:
        init = mgc_init(net, d, c["seed"], log, batch=c["batch"])
        w0 = st_load(init)
        base = mgc_dump(net, init, batch, os.path.join(d, "out.safetensors"), 1, FD_LR, 0.0, 0.0,
                        log)
    except MgcError as e:
        rep.check(name, "mgc runs", False, str(e))
        return
    g = torch.Generator().manual_seed(c["seed"] + 1)
    pb, pi = os.path.join(d, "batch_pert.safetensors"), os.path.join(d, "init_pert.safetensors")
    params = [k for k in w0 if ("grad." + k) in base and w0[k].dtype == torch.float32]
    if not params:
        rep.check(name, "grad.<param> in dump", False, "no parameter gradients in the dump")
        return
    order = [params[int(i)] for i in torch.randperm(len(params), generator=g)]

    def value(what):
        return x if what == "x" else w0[what]

    def grad(what):
        return base["grad.x" if what == "x" else "grad." + what].double()

    def loss_at(what, new):
        """mgc's step-0 loss with tensor `what` replaced by `new` (float32)."""
        if what == "x":
            st_save({"x": new, "y": y}, pb)
            args = (init, pb)
        else:
            wp = dict(w0)
            wp[what] = new
            st_save(wp, pi)
            args = (pi, batch)
        out = mgc_dump(net, args[0], args[1], os.path.join(d, "out_pert.safetensors"),
                       1, FD_LR, 0.0, 0.0, log)
        return float(out["loss"].double()[0])

    def central(what, direction, step):
        """(L(v + step*dir) - L(v - step*dir)) and the actual float32 delta."""
        v = value(what)
        plus = (v.double() + step * direction).float()
        minus = (v.double() - step * direction).float()
        return loss_at(what, plus) - loss_at(what, minus), (plus.double() - minus.double())

    def check(label, what, direction, step, rtol, scale):
        try:
            dl, delta = central(what, direction, step)
        except MgcError as e:
            rep.check(name, label, False, str(e))
            return
        n = float(delta.norm())
        fd = dl / n                                   # derivative along delta/|delta|
        an = float((grad(what) * delta).sum()) / n    # mgc's gradient, same direction
        err = abs(fd - an)
        rep.check(name, label, err <= rtol * scale + c["atol"],
                  f"fd {fd:+.5e} mgc {an:+.5e} err/scale {err / max(scale, 1e-30):.1e}")

    # single coordinates, among those whose gradient is not tiny
    def pick(gr, k):
        flat = gr.flatten().abs()
        cand = torch.nonzero(flat >= 0.2 * float(flat.max())).flatten()
        return [int(i) for i in cand[torch.randperm(len(cand), generator=g)[:k]]]

    coords = [("x", i) for i in pick(grad("x"), c["n_x"])]
    coords += [(p, i) for p in order[:c["n_p"]] for i in pick(grad(p), 1)]
    for what, i in coords:
        e = torch.zeros(value(what).numel(), dtype=torch.float64)
        e[i] = 1
        gi = float(grad(what).flatten()[i])
        check(f"fd d loss/d {what}[{i}]", what, e.view(value(what).shape), c["h"],
              c["rtol"], abs(gi))

    # whole-tensor directions (unit vectors); the step changes the loss by
    # about dl on each side (far above float32 rounding of the loss) but is at
    # most h_max (ReLU kinks and curvature: ~1e-3 keeps ReLU nets within 0.1%)
    for what in ["x"] + order[:c["n_dirs"]]:
        gr = grad(what)
        gn = float(gr.norm())
        if gn == 0:
            rep.check(name, f"fd along grad {what}", False, "mgc's gradient is all zero")
            continue
        v = value(what).double()
        step = min(c["dl"] / gn, c["h_max"])
        check(f"fd along grad {what}", what, gr / gn, step, c["rtol"], gn)
        if c.get("random_dirs", True):
            r = torch.randn(v.shape, generator=g, dtype=torch.float64)
            check(f"fd along random dir {what}", what, r / r.norm(), step, c["rtol"], gn)


# case table ------------------------------------------------------------------

# Every tests/nets/op_*.net (each with its twin in models.py), and two small nets of
# several layers; check_coverage() fails when an op of mgc's op table is in none of them.
# (op_dropout_half and op_conv_winograd have cases of their own, below.)
OWN_CASES = {"op_dropout_half", "op_conv_winograd"}
OP_NETS = sorted(n for n in (os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, "tests/nets/op_*.net")))
                 if n not in OWN_CASES) + ["smooth", "small_resnet"]


def geometry_cases(count=20, seed=2026):
    """Convolutions (and a pool after some) of random geometry: odd and
    non-square maps, strides up to 3, padding up to 4 (wider than some
    kernels' reach), 1x1 maps, kernels as large as the padded input, with and
    without bias and ReLU. Each case's net is written under OUT and its
    PyTorch twin registered with models.py. Named op_conv_geom_K, so the
    strategy suites (MGC_CONV=direct|vector|gemm|dense|chunked|winograd, --only 'op_conv*') run
    every geometry through every strategy."""
    import random
    rnd = random.Random(seed)
    cs = []
    for k in range(count):
        c, o = rnd.randint(1, 3), rnd.randint(1, 4)
        h, w = rnd.randint(1, 11), rnd.randint(1, 11)
        pad = rnd.choice([0, 0, 1, 2, 4])
        kmax = min(9, h + 2 * pad, w + 2 * pad)
        ker = rnd.randint(1, kmax)
        st = rnd.choice([1, 1, 2, 3])
        bias, relu = rnd.random() < 0.7, rnd.random() < 0.5
        oh, ow = (h + 2 * pad - ker) // st + 1, (w + 2 * pad - ker) // st + 1
        conv_txt = (f"conv: conv2d({o}, kernel = {ker}, stride = {st}, padding = {pad}"
                    + ("" if bias else ", bias = false") + ")" + (" -> relu" if relu else ""))
        layers = [("conv", nn.Conv2d(c, o, ker, stride=st, padding=pad, bias=bias))]
        if relu:
            layers.append(models.Fn(torch.relu, "relu"))
        pool_txt = ""
        if rnd.random() < 0.5 and min(oh, ow) >= 1:
            pk = rnd.randint(1, min(3, oh, ow))
            ps, pp = rnd.randint(1, 2), rnd.randint(0, pk // 2)
            kind = rnd.choice(["maxpool2d", "avgpool2d"])
            pool_txt = f" -> {kind}({pk}, stride = {ps}, padding = {pp})"
            layers.append((models.maxpool if kind == "maxpool2d" else models.avgpool)(pk, ps, pp))
            oh, ow = (oh + 2 * pp - pk) // ps + 1, (ow + 2 * pp - pk) // ps + 1
        name = f"op_conv_geom_{k}"
        d = os.path.join(OUT, "nets")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, name + ".net")
        with open(path, "w") as f:
            f.write(f"# {c}x{h}x{w}, conv {o} kernel {ker} stride {st} padding {pad}{pool_txt}\n"
                    f"net {name}(classes = 10) {{\n    input x[N, {c}, {h}, {w}]\n"
                    f"    return x -> {conv_txt}{pool_txt}\n"
                    f"             -> flatten -> fc: linear(classes) -> softmax_cross_entropy\n}}\n")
        net = os.path.relpath(path, ROOT)
        feats = o * oh * ow
        models.BUILDERS[net] = ((lambda ls=tuple(layers), n=feats: models.seq(*ls, *models.head(n))),
                                (c, h, w))
        cs.append(dict(kind="compare", name=name, net=net, batch=5, seed=300 + k, steps=1,
                       lr=0.1, momentum=0.0, wd=0.0, tol=1e-4))
    return cs


def cases():
    cs = []
    for i, n in enumerate(OP_NETS):
        # 1 step plain SGD: forward/backward of the op; then 3 steps with
        # momentum and weight decay so the update rule is exercised too.
        base = dict(kind="compare", net=f"tests/nets/{n}.net", batch=4, seed=100 + zlib.crc32(n.encode()) % 900,
                    tol=1e-4)   # the seed of its name: the same whatever other nets there are
        cs.append(dict(base, name=n, steps=1, lr=0.1, momentum=0.0, wd=0.0, check_init=n in ("op_param", "op_tokens", "op_views", "op_matmul", "op_conv_transpose")))
        if n in ("op_conv", "op_batchnorm", "op_linear", "op_param"):
            cs.append(dict(base, name=n + "_sgd3", steps=3, lr=0.05, momentum=0.9, wd=1e-3))
            cs.append(dict(base, name=n + "_nesterov3", steps=3, lr=0.05, momentum=0.9, wd=1e-3,
                           optim={"nesterov": True}))
            cs.append(dict(base, name=n + "_adamw4", steps=4, lr=0.01, momentum=0.0, wd=0.05,
                           optim={"kind": "adamw", "betas": (0.8, 0.99), "eps": 1e-6}))
    cs += geometry_cases()
    # ResNet-18's 3x3 layers on the C target (Winograd's F(2x2, 3x3)): several chunks of examples
    cs.append(dict(kind="compare", name="op_conv_winograd", net="tests/nets/op_conv_winograd.net", batch=20,
                   seed=150, steps=1, lr=0.1, momentum=0.0, wd=0.0, tol=1e-4))
    cs.append(dict(kind="compare", name="op_dropout_half", net="tests/nets/op_dropout_half.net",
                   batch=8, seed=7, steps=1, lr=0.1, momentum=0.0, wd=0.0, tol=1e-4,
                   keys=set(), extra=dropout_extra))
    cs.append(dict(kind="compare", name="lenet_init", net="nets/lenet.net", batch=16, seed=3,
                   steps=1, lr=0.1, momentum=0.0, wd=0.0, tol=1e-4, check_init=True))
    cs.append(dict(kind="compare", name="lenet_sgd5", net="nets/lenet.net", batch=32, seed=4,
                   steps=5, lr=0.1, momentum=0.9, wd=5e-4, tol=1e-4, real=True))
    cs.append(dict(kind="compare", name="lenet_adamw5", net="nets/lenet.net", batch=32, seed=8,
                   steps=5, lr=0.003, momentum=0.0, wd=0.01, tol=1e-4, real=True,
                   optim={"kind": "adamw", "betas": (0.9, 0.999), "eps": 1e-8}))
    cs.append(dict(kind="seed", name="lenet_seed", net="nets/lenet.net"))
    cs.append(dict(kind="compare", name="resnet18", net="nets/resnet18.net", batch=8, seed=5,
                   steps=2, lr=0.05, momentum=0.9, wd=5e-4, check_init=True,
                   # step-0 quantities at 1e-4; what depends on step 1 (through the
                   # ill-conditioned BN over 8 values at 1x1 in stage4) drifts more:
                   # PyTorch's own float32 is ~3e-5 from float64 there
                   tol={"default": 3e-4, "loss": 1e-4, "logits": 1e-4, "grad": 1e-4}))
    cs.append(dict(kind="compare", name="resnet18_small_stem", net="nets/resnet18.net",
                   set=("small_stem=true",), batch=4, seed=6, steps=1, lr=0.1, momentum=0.0,
                   wd=0.0, tol=1e-4))
    # the CNN zoo (nets/*.net against tests/torch/zoo.py), at small sizes where
    # the net takes one, without dropout (its masks are mgc's own)
    for name, sets, batch, steps in (("bn_lenet", (), 8, 2), ("alexnet", ("size=67", "dropout=0"), 2, 1),
                                     ("vgg11", ("size=32", "dropout=0"), 2, 1), ("nin", ("size=67", "dropout=0"), 2, 1),
                                     ("googlenet", ("size=32",), 2, 1), ("densenet", ("size=64",), 4, 1),
                                     ("mobilenetv2", ("dropout=0",), 4, 1), ("se_resnet", (), 4, 2),
                                     ("resnext", (), 4, 2), ("resnet9", ("width=8",), 4, 2),
                                     ("vit", ("d=32", "hidden=48", "p=0"), 4, 2),
                                     ("mixer", ("d=24", "token_hidden=16", "channel_hidden=40", "blocks=2"), 4, 2)):
        cs.append(dict(kind="compare", name="zoo_" + name, net=f"nets/{name}.net", set=sets, batch=batch,
                       seed=400 + zlib.crc32(name.encode()) % 100, steps=steps, lr=0.05, momentum=0.9, wd=5e-4,
                       tol=1e-4, real=False, check_init=name in ("googlenet", "se_resnet"),
                       f32_tol=name in ("mobilenetv2", "resnext"),
                       # bf16: at batch 4 MobileNetV2's gradients in bf16 are noise (the
                       # emulated policy's 100% from float64, autocast cannot run it)
                       bf16=name != "mobilenetv2"))
    # nets written from the docs by the fusion work (an EfficientNet-like and a ConvNeXt-like
    # one: every activation after a convolution fused into its store)
    for name in ("efficientnet", "convnext"):
        cs.append(dict(kind="compare", name="like_" + name, net=f"tests/nets/like/{name}.net", batch=4,
                       seed=460 + len(name), steps=2, lr=0.05, momentum=0.9, wd=5e-4, tol=1e-4, real=False))
    cs.append(dict(kind="fd", name="fd_smooth", net="tests/nets/smooth.net", batch=4, seed=11,
                   n_x=2, n_p=3, h=1e-2, n_dirs=3, dl=2e-3, h_max=5e-2, rtol=1e-2, atol=1e-4))
    cs.append(dict(kind="fd", name="fd_small_resnet", net="tests/nets/small_resnet.net", batch=4,
                   seed=12, n_x=0, n_p=0, h=1e-3, n_dirs=4, dl=2e-5, h_max=1e-3, rtol=3e-2, atol=1e-4,
                   random_dirs=False))
    # Data parallelism: k replicas on one global batch against one device in
    # PyTorch. With --sync-bn BatchNorm is over the global batch (SyncBatchNorm's
    # semantics, i.e. plain BatchNorm on the whole batch); without it, each
    # replica normalises its own shard (shards=k in the reference, as DDP).
    def dp(name, net, replicas, sync, batch, seed, steps=2, tol=1e-4, shards=None, **kw):
        where = os.environ.get("REF_DP_DEVICES", "cpu")
        devices = (f"cpu:{replicas}" if where == "cpu" else ",".join([where] * replicas) if ":" in where
                   else ",".join(f"cuda:{k}" for k in range(replicas)))
        args = ["--devices", devices] + (["--sync-bn"] if sync else [])
        cs.append(dict(kind="compare", name=name, net=net, batch=batch, seed=seed, steps=steps,
                       lr=0.05, momentum=0.9, wd=1e-3, tol=tol, mgc_args=args, replicas=replicas,
                       shards=shards or (1 if sync else replicas), **kw))
    dp("dp_op_batchnorm_sync3", "tests/nets/op_batchnorm.net", 3, True, 7, 200)
    dp("dp_op_batchnorm_shards2", "tests/nets/op_batchnorm.net", 2, False, 8, 201)
    dp("dp_small_resnet_sync2", "tests/nets/small_resnet.net", 2, True, 6, 202)
    dp("dp_small_resnet_shards3", "tests/nets/small_resnet.net", 3, False, 8, 203)
    dp("dp_lenet_sgd5_cpu3", "nets/lenet.net", 3, False, 32, 204, steps=5, real=True)
    dp("dp_lenet_adamw_cpu2", "nets/lenet.net", 2, False, 32, 207, steps=4, real=True,
       optim={"kind": "adamw", "betas": (0.9, 0.99), "eps": 1e-7})
    dp("dp_op_dropout_cpu2", "tests/nets/op_dropout.net", 2, False, 4, 205, steps=1)
    # attention's dropout: masks by the global example, so 3 replicas drop what one does (the twin
    # runs the whole batch at once: no BatchNorm, so its shards would change nothing but the masks'
    # count); 2 steps, 2 runs' masks
    dp("dp_op_attention_dropout_cpu3", "tests/nets/op_attention_dropout.net", 3, False, 6, 210, shards=1)
    # the token nets: reductions along the tokens, concat along other dimensions (3 replicas: an
    # uneven split of 8 is not allowed, so 6)
    dp("dp_mixer_cpu3", "nets/mixer.net", 3, False, 6, 208, set=("d=24", "token_hidden=16", "channel_hidden=40", "blocks=2"))
    dp("dp_op_views_cpu2", "tests/nets/op_views.net", 2, False, 4, 209)
    dp("dp_op_rank5_cpu2", "tests/nets/op_rank5.net", 2, False, 4, 211)
    # step-0 quantities at 1e-4, as for one device; what follows the second step
    # drifts more (see "resnet18" above): 4e-4 with this seed on cpu:1 or cpu:2
    # with --sync-bn, from the rounding of the statistics' sums alone
    dp("dp_resnet18_sync2", "nets/resnet18.net", 2, True, 8, 206,
       tol={"default": 1e-3, "loss": 1e-4, "logits": 1e-4, "grad": 1e-4})
    return cs


def check_coverage(sel, rep):
    """Every op of mgc's op table (mgc --list-ops) is made by some case's net:
    the cases' nets are compiled as the cases run them (--emit grad and
    eval-ir, with their --set, --devices, --sync-bn and optimizer), the ops they make
    collected; an op no case makes has no reference test, and fails."""
    exe = mgc_cmd()
    listed = subprocess.run(exe + ["--list-ops"], capture_output=True, text=True, cwd=ROOT)
    if listed.returncode:
        rep.check("coverage", "mgc --list-ops", False, listed.stderr.strip()[:200])
        return
    ops = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    made, seen = set(), set()
    for c in sel:
        if c["kind"] not in ("compare", "fd"):
            continue
        args = ([c["net"]] + set_args(c.get("set", ())) + list(c.get("mgc_args", ()))
                + [str(a) for a in optimizer_args(c.get("optim"), c.get("momentum", 0.0), c.get("wd", 0.0))])
        if tuple(args) in seen:
            continue
        seen.add(tuple(args))
        for stage in ("grad", "eval-ir"):
            p = subprocess.run(exe + args + ["--emit", stage], capture_output=True, text=True, cwd=ROOT)
            made.update(m.group(1) for m in re.finditer(r"^%\d+ += ([a-z0-9_]+)", p.stdout, re.M))
    missing = [op for op in ops if op not in made]
    rep.check("coverage", "every op of the op table in a reference case", not missing,
              f"{len(ops)} ops" if not missing else f"no case makes {', '.join(missing)}: add a net to OP_NETS "
              "(tests/nets/op_NAME.net and its twin in tests/torch/models.py)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    help="run cases whose name contains PATTERN or matches it as a glob (repeatable)")
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out cases whose name contains PATTERN or matches it as a glob (repeatable)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--shard", metavar="K/N", help="of the cases selected, every N-th from the K-th (0-based): "
                    "N processes with K = 0..N-1 run each case once (tests/gpu/check.sh)")
    ap.add_argument("--out", help="work directory (default $REF_OUT or tests/out/torch)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: mgc --precision bf16 against PyTorch's autocast (see above)")
    a = ap.parse_args()
    global OUT, PRECISION
    PRECISION = a.precision
    if a.out:
        OUT = os.path.abspath(a.out)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.manual_seed(0)

    sel = cases()
    if PRECISION == "bf16":   # the finite differences and seed checks are of float32 arithmetic
        sel = [c for c in sel if c["kind"] == "compare" and not c.get("extra") and c.get("bf16", True)]   # extra: dropout's masks
    def named(c, patterns):   # the name contains a pattern or matches it as a glob
        return any(p in c["name"] or fnmatch.fnmatch(c["name"], p) for p in patterns)

    if a.only:
        sel = [c for c in sel if named(c, a.only)]
    sel = [c for c in sel if not named(c, a.skip)]
    if a.shard:
        try:
            k, n = (int(v) for v in a.shard.split("/"))
            assert 0 <= k < n
        except (ValueError, AssertionError):
            ap.error(f"--shard expects K/N with 0 <= K < N, got '{a.shard}'")
        sel = sel[k::n]
    if a.list:
        for c in sel:
            print(c["name"], c["kind"], c["net"])
        return 0
    rep = Report()
    if not a.only and not a.skip and not a.shard and PRECISION == "fp32":
        check_coverage(sel, rep)
    exe = mgc_cmd()[0]
    if not (os.path.exists(os.path.join(ROOT, exe)) or os.path.isabs(exe) and os.path.exists(exe)
            or "/" not in exe):
        rep.check("mgc", "binary", False, f"{exe} not found (build it: make)")
        print(f"{rep.passed} passed, {rep.failed} failed")
        return 1
    log = []
    t0 = time.time()
    for c in sel:
        tc = time.time()
        try:
            {"compare": run_compare_case, "seed": run_seed_case, "fd": run_fd_case}[c["kind"]](
                c, rep, log)
        except Exception as e:  # a harness bug or an unreadable dump: one failure, go on
            rep.check(c["name"], "harness", False, f"{type(e).__name__}: {e}")
        print(f"---- {c['name']}: {time.time() - tc:.1f} s", flush=True)
    print(f"{len(log)} mgc runs, {sum(t for _, t in log):.1f} s in mgc, "
          f"{time.time() - t0:.1f} s total")
    if rep.failures:
        print("failed: " + ", ".join(rep.failures[:30]) + (" ..." if len(rep.failures) > 30 else ""))
    print(f"{rep.passed} passed, {rep.failed} failed")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
