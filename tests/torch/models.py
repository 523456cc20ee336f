"""Hand-written PyTorch equivalents of the test nets (tests/nets/*.net) and of
nets/lenet.net and nets/resnet18.net, with parameter names identical to mgc's
(the `label:` of each layer in the .net file).

BUILDERS maps a net file path (relative to the repository root) to
(builder, input_shape_without_N).  A builder takes no arguments and returns an
nn.Module whose forward returns logits (the softmax_cross_entropy at the end of
every .net is the loss, applied outside).
"""
from collections import OrderedDict

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402
from zoo import sdpa  # noqa: E402


class Fn(nn.Module):
    """A parameter-free op as a module, so nets read like the .net files."""

    def __init__(self, f, name=""):
        super().__init__()
        self.f, self.name = f, name

    def forward(self, x):
        return self.f(x)

    def extra_repr(self):
        return self.name


def relu():
    return Fn(F.relu, "relu")


def sigmoid():
    return Fn(torch.sigmoid, "sigmoid")


def tanh():
    return Fn(torch.tanh, "tanh")


def leaky_relu(slope=0.01):
    return nn.LeakyReLU(slope)


def silu():
    return nn.SiLU()


def gelu(approximate="none"):
    return nn.GELU(approximate=approximate)


def relu6():
    return nn.ReLU6()


def hardsigmoid():
    return nn.Hardsigmoid()


def hardswish():
    return nn.Hardswish()


def mish():
    return nn.Mish()


def elu(alpha=1.0):
    return nn.ELU(alpha)


def flatten():
    return Fn(lambda x: torch.flatten(x, 1), "flatten")


def gap():
    return nn.AdaptiveAvgPool2d(1)


def maxpool(k, stride=None, padding=0):
    return nn.MaxPool2d(k, stride if stride is not None else k, padding)


def avgpool(k, stride=None, padding=0):
    return nn.AvgPool2d(k, stride if stride is not None else k, padding,
                        count_include_pad=True)


def seq(*layers):
    """layers: modules, or (label, module) pairs; labels become name prefixes.
    Unlabelled layers must be parameter-free (they get names like _3)."""
    d = OrderedDict()
    for i, l in enumerate(layers):
        if isinstance(l, tuple):
            name, m = l
        else:
            name, m = f"_{i}", l
            assert not list(m.parameters()), "unlabelled layer with parameters"
            assert not list(m.buffers()), "unlabelled layer with buffers"
        d[name] = m
    return nn.Sequential(d)


def head(features, classes=10):
    return [flatten(), ("fc", nn.Linear(features, classes))]


# --- one net per op family (tests/nets/op_*.net) --------------------------

def op_conv():
    return seq(("conv", nn.Conv2d(3, 4, 3, padding=1)), *head(4 * 8 * 8))


def op_conv_groups():
    return seq(("g1", nn.Conv2d(4, 6, 3, padding=1, groups=2)), relu(),
               ("dw", nn.Conv2d(6, 12, 3, stride=2, padding=1, groups=6)),
               ("d1", nn.Conv2d(12, 4, 3, padding=2, dilation=2, bias=False)), relu(),
               ("gd", nn.Conv2d(4, 4, 2, stride=2, padding=1, groups=2, dilation=3)), *head(4 * 2 * 2))


def op_conv_groups_wide():
    return seq(("gw", nn.Conv2d(8, 80, 3, padding=1, groups=2)), relu(),
               ("gd", nn.Conv2d(80, 36, 3, padding=2, dilation=2, groups=4, bias=False)),
               ("dl", nn.Conv2d(36, 40, 3, stride=2, padding=2, dilation=2)), relu(), *head(40 * 3 * 3))


def op_conv_depthwise():
    return seq(("c0", nn.Conv2d(3, 3, 1)),
               ("dw1", nn.Conv2d(3, 6, 3, padding=1, groups=3)), relu(),
               ("dw2", nn.Conv2d(6, 6, 5, padding=3, dilation=2, groups=6)),
               ("dw3", nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6, bias=False)), *head(6 * 2 * 8))


def op_conv_depthwise_narrow():
    return seq(("c0", nn.Conv2d(4, 8, 1)),
               ("dw1", nn.Conv2d(8, 8, 3, padding=1, groups=8)), relu6(),
               ("dw2", nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=8, bias=False)), relu(),
               ("dw3", nn.Conv2d(16, 16, 5, padding=1, groups=16)),
               ("dw4", nn.Conv2d(16, 16, 3, padding=1, groups=16)), hardswish(),
               ("dw5", nn.Conv2d(16, 16, 5, groups=16)), *head(16 * 1 * 1))


def op_pointwise_act():
    return seq(("p1", nn.Conv2d(4, 8, 1)), relu(),
               ("p2", nn.Conv2d(8, 16, 1)), relu6(),
               ("p3", nn.Conv2d(16, 8, 1, bias=False)), leaky_relu(0.2),
               ("p4", nn.Conv2d(8, 8, 1)), hardsigmoid(),
               ("p5", nn.Conv2d(8, 8, 1)), hardswish(),
               ("p6", nn.Conv2d(8, 12, 1)), silu(),
               ("p7", nn.Conv2d(12, 8, 1)), *head(8 * 5 * 8))


def op_conv_stride2():
    return seq(("conv", nn.Conv2d(3, 5, 3, stride=2, padding=1)), *head(5 * 5 * 5))


def op_conv_bigpad():
    return seq(("conv", nn.Conv2d(1, 1, 57, stride=2, padding=40)), *head(1 * 20 * 20))


def op_conv_nobias():
    return seq(("conv", nn.Conv2d(3, 4, 2, bias=False)),
               ("proj", nn.Conv2d(4, 6, 1, stride=2, bias=False)), *head(6 * 4 * 4))


def op_conv_pool():
    return seq(("conv", nn.Conv2d(2, 3, 3)), relu(), maxpool(2), *head(3 * 5 * 5))


def op_conv_pool_nobias():
    return seq(("conv", nn.Conv2d(3, 4, 2, bias=False)), relu(), maxpool(2), *head(4 * 4 * 4))


def op_conv_pool2():
    return seq(("c1", nn.Conv2d(2, 5, 2)), relu(), maxpool(2), ("c2", nn.Conv2d(5, 3, 4)), relu(), maxpool(2),
               *head(3 * 3 * 3))


def op_conv_rows():
    return seq(("conv", nn.Conv2d(2, 3, 5)), relu(), ("proj", nn.Conv2d(3, 2, 1, bias=False)), *head(2 * 2 * 40))


def op_conv_rows_pool():
    return seq(("conv", nn.Conv2d(2, 3, 3, bias=False)), relu(), maxpool(2), *head(3 * 8 * 8))


def op_relu_pool_rows():
    return seq(("a", nn.Conv2d(2, 3, 3, padding=1)), relu(), maxpool(3, 2, 1),
               ("b", nn.Conv2d(3, 4, 3, padding=1, bias=False)), relu(), maxpool(4, 2, 2), *head(4 * 4 * 4))


def op_conv_winograd():
    return seq(("a", nn.Conv2d(32, 64, 3, padding=1)), relu(),
               ("b", nn.Conv2d(64, 64, 3, padding=1, bias=False)), ("bn", nn.BatchNorm2d(64)), relu(),
               ("c", nn.Conv2d(64, 16, 3, padding=1)), *head(16 * 13 * 11))


def op_linear():
    return seq(flatten(), ("fc1", nn.Linear(32, 12, bias=False)), ("fc2", nn.Linear(12, 10)))


def op_batchnorm():
    return seq(("conv", nn.Conv2d(3, 4, 3, padding=1, bias=False)),
               ("bn", nn.BatchNorm2d(4)), *head(4 * 6 * 6))


def op_batchnorm_args():
    return seq(("bn", nn.BatchNorm2d(3, eps=1e-3, momentum=0.3)), *head(3 * 5 * 5))


def op_act(act):
    return lambda: seq(act(), *head(3 * 6 * 6))


def op_xent_smooth():
    m = seq(flatten(), ("fc", nn.Linear(3 * 6 * 6, 10)), relu(), ("fc2", nn.Linear(10, 10)))
    m.label_smoothing = 0.1   # the loss's (ref.py's torch_steps reads it)
    return m


def op_batchnorm1d():
    return seq(flatten(), ("fc1", nn.Linear(3 * 6 * 6, 16)), ("bn", nn.BatchNorm1d(16, momentum=0.2)), relu(), *head(16))


class OpMulSub(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 1, 3, padding=1), nn.Linear(3 * 6 * 6, 10)

    def forward(self, x):
        g = torch.sigmoid(self.c1(x.mean((2, 3), keepdim=True)))
        m = torch.tanh(self.c2(x))
        return self.fc(torch.flatten((x * g - g) * m, 1))


class OpFusedAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.c2, self.bn2 = nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4)
        self.c3 = nn.Conv2d(4, 4, 1)
        self.fc1, self.fc = nn.Linear(4 * 6 * 6, 12), nn.Linear(12, 10)

    def forward(self, x):
        a = F.hardswish(self.bn1(self.c1(x)))
        b = self.bn2(self.c2(x))
        g = torch.sigmoid(self.c3(a.mean((2, 3), keepdim=True)))
        s = F.silu(a * g + b)
        t = F.gelu(s * g + s)
        u = F.elu(t - g, 0.5)
        v = F.leaky_relu(u * u, 0.1)
        w = F.relu(v - t)
        return self.fc(F.gelu(self.fc1(w.flatten(1)), approximate="tanh"))


class OpBnAct(nn.Module):
    def __init__(self):
        super().__init__()
        shapes = [(3, 3, 1, 1), (8, 3, 1, 1), (8, 3, 0, 1), (8, 1, 0, 1), (8, 3, 1, 8), (8, 3, 1, 1),
                  (8, 1, 0, 1), (8, 3, 1, 1), (8, 3, 0, 1), (8, 1, 0, 1), (8, 1, 0, 1), (8, 1, 0, 1)]
        for k, (c, kern, pad, groups) in enumerate(shapes, 1):
            stride = 2 if k == 6 else 1
            setattr(self, f"c{k}", nn.Conv2d(c, 8, kern, stride=stride, padding=pad, groups=groups, bias=False))
            setattr(self, f"bn{k}", nn.BatchNorm2d(8))
        self.fc = nn.Linear(8 * 2 * 2, 10)
        self.acts = [F.silu, F.relu, F.gelu, F.hardswish, F.relu6, lambda v: F.elu(v, 0.5),
                     lambda v: F.leaky_relu(v, 0.1), lambda v: F.gelu(v, approximate="tanh"), F.hardsigmoid,
                     torch.sigmoid, torch.tanh, F.mish]

    def forward(self, x):
        for k, act in enumerate(self.acts, 1):
            x = act(getattr(self, f"bn{k}")(getattr(self, f"c{k}")(x)))
        return self.fc(x.flatten(1))


class OpEwAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(48, 16)
        for k in range(1, 13):
            setattr(self, f"l{k}", nn.Linear(16, 16))
        self.fc = nn.Linear(16, 10)
        acts = [F.silu, lambda v: F.leaky_relu(v, 0.1), F.relu, lambda v: F.gelu(v, approximate="tanh"), F.gelu,
                F.hardsigmoid, F.hardswish, torch.sigmoid, F.relu6, torch.tanh, lambda v: F.elu(v, 0.5), F.mish]
        first = [(acts[2 * k], acts[2 * k + 1]) for k in range(6)]
        self.pairs = first + [(b, a) for a, b in first]   # blocks 7-12: each pair the other way round

    def forward(self, x):
        h = self.l0(x.flatten(1))
        for k, (after_linear, after_add) in enumerate(self.pairs, 1):
            h = after_add(after_linear(getattr(self, f"l{k}")(h)) + h)
        return self.fc(h)


class OpAddBroadcast(nn.Module):
    """tests/nets/op_add_broadcast.net: add with PyTorch's broadcasting"""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 1, 3, padding=1)
        self.c3, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)
        self.fc1, self.f2, self.fc = nn.Linear(108, 12), nn.Linear(12, 1), nn.Linear(12, 10)

    def forward(self, x):
        g = self.c1(x.mean((2, 3), keepdim=True))
        y = self.bn(self.c3(x))
        h = self.fc1(torch.flatten(F.relu(y + g) + self.c2(x) + x, 1))
        return self.fc(self.f2(h) + h)


class OpParam(nn.Module):
    """tests/nets/op_param.net: a net's own learned tensors (nn.Parameter)"""
    param_inits = {"pos": ("normal", 0.02), "s.gamma": ("constant", 0.5), "shift": ("constant", 0.0),
                   "w": ("constant", 1.0)}

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 3, 6, 6) * 0.02)
        self.shift, self.w = nn.Parameter(torch.zeros(1, 8, 1, 1)), nn.Parameter(torch.ones(1, 24))
        self.c1, self.fc1, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 6 * 6, 24), nn.Linear(24, 10)
        self.s = nn.Module()
        self.s.gamma = nn.Parameter(torch.full((1, 8, 1, 1), 0.5))

    def forward(self, x):
        z = F.relu(self.c1(x + self.pos) * self.s.gamma + self.shift)
        return self.fc(self.fc1(z.flatten(1)) * self.w)


class OpBlockInputs(nn.Module):
    """tests/nets/op_block_inputs.net: blocks with several tensor inputs"""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1)
        self.u1 = nn.Module()
        self.u1.conv = nn.Conv2d(8, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        s = F.relu(self.c1(x))
        d = self.c2(F.max_pool2d(s, 2))
        u = F.relu(self.u1.conv(F.interpolate(d, scale_factor=2, mode="nearest")) + s)
        return self.fc((u * torch.sigmoid(u.mean((2, 3), keepdim=True))).flatten(1))


class OpLinearTokens(nn.Module):
    """tests/nets/op_linear_tokens.net: nn.Linear on [N, T, F]"""
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.fc = nn.Linear(6, 8), nn.Linear(8, 4, bias=False), nn.Linear(20, 10)

    def forward(self, x):
        return self.fc(self.l2(F.gelu(self.l1(x))).flatten(1))


class OpLayerNormTokens(nn.Module):
    """tests/nets/op_layernorm_tokens.net: nn.LayerNorm(D) on [N, T, D]"""
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(6), nn.LayerNorm(6, eps=1e-6)
        self.l1, self.fc = nn.Linear(6, 6), nn.Linear(30, 10)

    def forward(self, x):
        h = F.gelu(self.l1(self.ln1(x)))
        return self.fc(self.ln2(h + x).flatten(1))


class OpAttention(nn.Module):
    """tests/nets/op_attention.net"""
    def __init__(self):
        super().__init__()
        for name in ("q", "k", "v", "o", "cq", "cv"):
            setattr(self, name, nn.Linear(8, 8))
        self.fc = nn.Linear(40, 10)

    def forward(self, x):
        h = self.o(sdpa(self.q(x), self.k(x), self.v(x), 4)) + x
        return self.fc(sdpa(self.cq(h), h, self.cv(h), 1, causal=True).flatten(1))


def mgc_attention_mask(place, run, n, heads, tq, tk, p, dtype, first=0, seed=0):
    """mgc's dropout factors of attention op `place` (its place among the net's attention ops) in
    training run `run` (the first is 1): [n, heads, tq, tk], 0 where mgc_uniform(s, c) < p else
    1 / (1 - p), c the weight's place counted from the global batch's first example; s as
    runtime/exec.c makes it of --seed, the run and the op's key 2^48 + place; mgc_uniform as
    codegen/prelude.c's (splitmix64's finaliser, its top 24 bits). mgc's own masks, made again
    by the test, not PyTorch's."""
    import numpy as np
    u64 = np.uint64
    seed = (seed * 0x9E3779B97F4A7C15 + run * 0xD1B54A32D192ED03 + (1 << 48) + place) % (1 << 64)
    c = np.arange(n * heads * tq * tk, dtype=u64) + u64(first * heads * tq * tk)
    with np.errstate(over="ignore"):
        z = u64(seed) + (c + u64(1)) * u64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
    z ^= z >> u64(31)
    keep = (z >> u64(40)).astype(np.float64) / 16777216.0 >= float(np.float32(p))
    return torch.from_numpy(keep.reshape(n, heads, tq, tk)).to(dtype) / (1 - p)


class OpAttentionDropout(nn.Module):
    """tests/nets/op_attention_dropout.net: attention's weights dropped with mgc's own masks (each
    training forward a run of mgc's)"""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.fc = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(280, 10)
        self.runs = 1

    def forward(self, x):
        def mask(place, heads, p):
            return mgc_attention_mask(place, self.runs, x.shape[0], heads, 70, 70, p, x.dtype) if self.training else None
        a = sdpa(self.q(x), self.k(x), x, 2, causal=True, mask=mask(0, 2, 0.5))
        c = sdpa(a, a, self.v(x), 1, mask=mask(1, 1, 0.25))
        self.runs += self.training
        return self.fc(c.flatten(1))


class OpLayerNormShape(nn.Module):
    """tests/nets/op_layernorm_shape.net: nn.LayerNorm over several last dimensions"""
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.LayerNorm([4, 5]), nn.LayerNorm([3, 4, 5]), nn.LayerNorm(5, eps=1e-3)
        self.l4, self.fc = nn.LayerNorm([3, 20]), nn.Linear(60, 10)

    def forward(self, x):
        b = self.l3(self.l2(F.gelu(self.l1(x))))
        return self.fc(self.l4(b.flatten(2)).flatten(1))


class OpRank5(nn.Module):
    """tests/nets/op_rank5.net: tensors of five and six dimensions (timm's attention's qkv, and more)"""
    param_inits = {"bias5": ("normal", 0.5), "w5": ("normal", 0.5)}

    def __init__(self):
        super().__init__()
        self.bias5 = nn.Parameter(torch.randn(1, 1, 2, 1, 4) * 0.5)
        self.w5 = nn.Parameter(torch.randn(1, 3, 1, 4, 2) * 0.5)
        self.qkv, self.proj, self.mix = nn.Linear(8, 24), nn.Linear(8, 8), nn.Linear(8, 4)
        self.ln, self.fc = nn.LayerNorm([5, 4]), nn.Linear(120, 10)

    def forward(self, x):
        n = x.shape[0]
        qkv = self.qkv(x).reshape(n, 5, 3, 2, 4).permute(0, 2, 3, 1, 4)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        a = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.5, -1) @ v
        o = self.proj(a.transpose(1, 2).flatten(2))
        t = F.gelu(torch.softmax(qkv + self.bias5, 2))
        s = self.ln(self.mix(torch.cat([t, qkv], 4)))
        u = s.unflatten(4, (2, 2)).permute(0, 5, 2, 1, 3, 4).sum(3).mean(1, keepdim=True)
        m = F.relu(torch.matmul(qkv, self.w5))
        return self.fc(torch.cat([u.flatten(1), o.flatten(1), m.flatten(1)], 1))


class OpTokens(nn.Module):
    """tests/nets/op_tokens.net: flatten(2), transpose, a class token concatenated, select"""
    param_inits = {"cls": ("normal", 0.5)}

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 3) * 0.5)
        self.c1, self.l1 = nn.Conv2d(3, 3, 3, padding=1), nn.Linear(3, 6)
        self.l2, self.fc = nn.Linear(21, 6), nn.Linear(6, 10)

    def forward(self, x):
        t = self.c1(x).flatten(2).transpose(1, 2)
        h = F.gelu(self.l1(torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1)))
        return self.fc(h.select(1, 0) + self.l2(h.transpose(1, 2).select(1, 2)))


class OpTranspose(nn.Module):
    """tests/nets/op_transpose.net: transposes moving the last dimension (blocks of 8 and their
    remainders), across a dimension between, and keeping rows whole"""
    def __init__(self):
        super().__init__()
        self.l0, self.l1 = nn.Linear(11, 11), nn.Linear(9, 4)
        self.fa, self.fb, self.fc = nn.Linear(297, 10), nn.Linear(297, 10), nn.Linear(132, 10)

    def forward(self, x):
        h = self.l0(x)
        a = F.gelu(h.transpose(1, 3))
        b = h.transpose(1, 2)
        c = self.l1(h.flatten(2).transpose(1, 2))
        return self.fa(a.flatten(1)) + self.fb(b.flatten(1)) + self.fc(c.flatten(1))


class OpReduce(nn.Module):
    """tests/nets/op_reduce.net: sum, mean (keepdim too) and softmax along a dimension"""
    def __init__(self):
        super().__init__()
        self.c1, self.l1 = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 5)
        self.c2, self.fc = nn.Conv2d(3, 2, 1), nn.Linear(4 + 5 + 36 + 2, 10)

    def forward(self, x):
        t = self.c1(x).flatten(2).transpose(1, 2)
        pooled = (t * t.softmax(1)).sum(1)
        m = self.l1(t).softmax(-1).mean(1)
        s = (t * t.mean(-1, keepdim=True)).sum(2)
        r = self.c2(x).mean(2).sum(-1)
        return self.fc(torch.cat([pooled, m, s, r], 1))


class OpViews(nn.Module):
    """tests/nets/op_views.net: permute, reshape, concat along other dimensions, unflatten"""
    param_inits = {"e1": ("normal", 0.5)}

    def __init__(self):
        super().__init__()
        self.e1 = nn.Parameter(torch.randn(1, 15, 2) * 0.5)
        self.c1, self.l0 = nn.Conv2d(4, 4, 1), nn.Linear(4, 6)
        self.c2, self.fc = nn.Conv2d(6, 2, 3, padding=1), nn.Linear(60, 10)

    def forward(self, x):
        n = x.shape[0]
        b = self.c1(x).permute(0, 2, 3, 1).reshape(n, 15, 4)
        c = torch.cat([b, self.e1.expand(n, -1, -1)], 2)
        d = torch.cat([c, self.l0(x.flatten(2).transpose(1, 2))], -2)
        v = self.c2(d.unflatten(1, (5, -1)).permute(0, 3, 1, 2))
        return self.fc(v.reshape(n, -1))


class OpMatmul(nn.Module):
    """tests/nets/op_matmul.net: torch.matmul of ranks 3 and 4, a learned [1, D, P] broadcast"""
    param_inits = {"w": ("normal", 0.5)}

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(1, 6, 3) * 0.5)
        self.lq, self.lk, self.lk2 = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.fc = nn.Linear(15, 10)

    def forward(self, x):
        a = torch.matmul(torch.matmul(self.lq(x), self.lk(x).transpose(1, 2)).softmax(-1), x)
        qh = a.unflatten(2, (2, 3)).permute(0, 2, 1, 3)
        kh = self.lk2(x).unflatten(2, (2, 3)).permute(0, 2, 3, 1)
        h = torch.matmul(torch.matmul(qh, kh).softmax(-1), qh).permute(0, 2, 1, 3).reshape(x.shape[0], 5, 6)
        return self.fc(torch.matmul(h, self.w).flatten(1))


class OpConvTranspose(nn.Module):
    """tests/nets/op_conv_transpose.net: nn.ConvTranspose2d, strided, padded, output_padding, grouped"""
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.up1, self.up2 = nn.ConvTranspose2d(6, 4, 2, stride=2), nn.ConvTranspose2d(4, 4, 3, padding=1)
        self.up3 = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, bias=False, groups=2)
        self.fc = nn.Linear(6 * 12 * 12, 10)

    def forward(self, x):
        u = self.up2(F.relu(self.up1(F.relu(self.c1(x)))))
        return self.fc(self.up3(u).flatten(1))


class OpUpsampleBilinear(nn.Module):
    """tests/nets/op_upsample_bilinear.net: nn.Upsample(mode="bilinear"), align_corners=False"""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 3, stride=2)
        self.fc = nn.Linear(2 * 12 * 18, 10)

    def forward(self, x):
        h = self.c2(F.interpolate(self.c1(x), scale_factor=2, mode="bilinear", align_corners=False))
        return self.fc(F.interpolate(h, scale_factor=3, mode="bilinear", align_corners=False).flatten(1))


class OpPoolModes(nn.Module):
    """tests/nets/op_pool_modes.net: ceil_mode and count_include_pad=False"""
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3, self.c4 = (nn.Conv2d(3, 4, 1) for _ in range(4))
        self.fc = nn.Linear(4 * 4 * 5 + 4 * 5 * 5 + 4 * 4 * 5 + 4 * 3 * 3, 10)

    def forward(self, x):
        a = F.max_pool2d(self.c1(x), 2, ceil_mode=True)
        b = F.avg_pool2d(self.c2(x), 3, 2, 1, ceil_mode=True)
        c = F.avg_pool2d(self.c3(x), 3, 2, 1, count_include_pad=False)
        d = F.max_pool2d(F.avg_pool2d(self.c4(x), 2, ceil_mode=True, count_include_pad=False), 3, 2, 1, ceil_mode=True)
        return self.fc(torch.cat([a.flatten(1), b.flatten(1), c.flatten(1), d.flatten(1)], 1))


class OpAttentionLong(nn.Module):
    """tests/nets/op_attention_long.net"""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.fc = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(280, 10)

    def forward(self, x):
        a = sdpa(self.q(x), self.k(x), x, 2, causal=True)
        return self.fc(sdpa(a, a, x, 1).flatten(1))


class OpScale(nn.Module):
    """tests/nets/op_scale.net: a tensor by a number, PyTorch's arithmetic"""
    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc1, self.fc = nn.Linear(8 * 6 * 6, 24), nn.Linear(24, 10)

    def forward(self, x):
        c = self.c1(x * 2 - 1)
        b = 1 - self.bn(c * 0.5)
        u = -F.relu((b + c) / 4)
        return self.fc(self.fc1(u.flatten(1)) * -3 + 0.5)


class OpConvAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 1)
        self.c4, self.c5 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 16, 3, padding=1)
        self.c6, self.c7 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3)
        self.c8, self.c9 = nn.Conv2d(16, 8, 1, bias=False), nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.c10, self.c11 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.gelu(self.c2(F.silu(self.c1(x))))
        x = F.elu(self.c4(F.hardswish(self.c3(x))), 0.5)
        x = F.gelu(self.c6(F.leaky_relu(self.c5(x), 0.1)), approximate="tanh")
        x = F.hardsigmoid(self.c8(F.relu6(self.c7(x))))
        x = torch.tanh(self.c10(torch.sigmoid(self.c9(x))))
        return self.fc(F.mish(self.c11(x)).flatten(1))


class OpConcat(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1, self.b2 = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 3, padding=1)
        self.fc0, self.fc = nn.Linear(3 * 6 * 6, 5), nn.Linear(11 * 6 * 6 + 5, 10)

    def forward(self, x):
        f = torch.cat([x, self.b1(x), F.relu(self.b2(x)), F.max_pool2d(x, 3, 1, 1)], 1).flatten(1)
        return self.fc(torch.cat([f, self.fc0(x.flatten(1))], 1))


class OpResample(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 2, 3, padding=1), nn.Conv2d(3, 3, 1)
        self.fc = nn.Linear(2 * 3 * 4 + 3 * 9 * 3 + 3, 10)

    def forward(self, x):
        a = F.adaptive_avg_pool2d(F.interpolate(self.c1(x), scale_factor=2, mode="nearest"), (3, 4)).flatten(1)
        b = F.adaptive_avg_pool2d(x, (9, 3)).flatten(1)
        m = F.adaptive_max_pool2d(self.c2(x), 1).flatten(1)
        return self.fc(torch.cat([a, b, m], 1))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of [N, C, H, W] at each position (mgc's layernorm on 4-D input)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def op_layernorm():
    return seq(("c1", nn.Conv2d(3, 6, 3, padding=1)), ("ln1", LayerNorm2d(6)), relu(), flatten(),
               ("fc1", nn.Linear(6 * 5 * 4, 12)), ("ln2", nn.LayerNorm(12, eps=1e-3)), *head(12))


def op_act2(act):
    """act on the input, then between two linear layers (fc1, fc)"""
    return lambda: seq(act(), flatten(), ("fc1", nn.Linear(3 * 6 * 6, 24)), act(), *head(24))


def op_maxpool():
    return seq(maxpool(2), maxpool(3, 2, 1), *head(3 * 2 * 2))


def op_avgpool():
    return seq(avgpool(2), avgpool(3, 2, 1), *head(3 * 2 * 2))


def op_gap():
    return seq(gap(), *head(6))


def op_flatten():
    return seq(*head(2 * 3 * 5))


def op_dropout():
    return seq(flatten(), ("fc1", nn.Linear(48, 16)), nn.Dropout(0.0), relu(),
               ("fc2", nn.Linear(16, 10)))


def op_dropout_half():
    return seq(nn.Dropout(0.5), *head(3 * 4 * 4))


class OpAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 3, 3, padding=1)
        self.b = nn.Conv2d(3, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 6 * 6, 10)

    def forward(self, x):
        y = self.b(F.relu(self.a(x)))
        return self.fc(torch.flatten(F.relu(y + x), 1))


class Smooth(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 3 * 3, 10)

    def forward(self, x):
        x = F.avg_pool2d(torch.tanh(self.conv(x)), 2)
        return self.fc(torch.flatten(torch.sigmoid(self.bn(x)), 1))


class SmallResNet(nn.Module):
    def __init__(self, classes=10, in_channels=1):
        super().__init__()
        c = lambda i, o, k, s=1: nn.Conv2d(i, o, k, stride=s, padding=k // 2, bias=False)
        self.conv1, self.bn1 = c(in_channels, 8, 3), nn.BatchNorm2d(8)
        self.b1conv1, self.b1bn1 = c(8, 8, 3), nn.BatchNorm2d(8)
        self.b1conv2, self.b1bn2 = c(8, 8, 3), nn.BatchNorm2d(8)
        self.b2down, self.b2dbn = c(8, 16, 1, 2), nn.BatchNorm2d(16)
        self.b2conv1, self.b2bn1 = c(8, 16, 3, 2), nn.BatchNorm2d(16)
        self.b2conv2, self.b2bn2 = c(16, 16, 3), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        s = F.relu(self.bn1(self.conv1(x)))
        r1 = self.b1bn2(self.b1conv2(F.relu(self.b1bn1(self.b1conv1(s)))))
        t = F.relu(r1 + s)
        p = self.b2dbn(self.b2down(t))
        r2 = self.b2bn2(self.b2conv2(F.relu(self.b2bn1(self.b2conv1(t)))))
        u = F.relu(r2 + p)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(u, 1), 1))


# --- nets/lenet.net ---------------------------------------------------------

# LeNet: the benchmark's model (same layers and parameter names as nets/lenet.net).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from torch_lenet import LeNet  # noqa: E402,F401


# --- nets/resnet18.net --------------------------------------------------------
# As nets/resnet18.net builds it: torchvision's ResNet-18 except that every
# conv has a bias and the skip-path projection is a 1x1 conv alone (named
# `proj`, no BatchNorm): 20 convs x 2 + 17 BNs x 2 + fc x 2 = 76 parameters.
#   default stem:            conv1: 7x7 stride 2 pad 3 -> bn1 -> relu -> maxpool2d(3, 2, 1)
#   --set small_stem=true:   conv1: 3x3 stride 1 pad 1 -> bn1 -> relu
# stageK (K = 1..4, widths 64..512) holds blocks stageK.0, stageK.1; the first
# block of stages 2-4 has stride 2 and a projection.
RESNET18 = dict(
    widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), stem_kernel=7, stem_stride=2,
    stem_pool=(3, 2, 1),       # maxpool2d(kernel, stride, padding), or None
    conv_bias=True, shortcut="proj", shortcut_bn=None,
    stage="stage{}",           # stage names, 1-based
)
RESNET18_SMALL_STEM = dict(stem_kernel=3, stem_stride=1, stem_pool=None)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, cfg):
        super().__init__()
        b = cfg["conv_bias"]
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=b)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=b)
        self.bn2 = nn.BatchNorm2d(cout)
        self._skip = []
        if stride != 1 or cin != cout:
            self.add_module(cfg["shortcut"], nn.Conv2d(cin, cout, 1, stride, 0, bias=b))
            self._skip = [cfg["shortcut"]]
            if cfg["shortcut_bn"]:
                self.add_module(cfg["shortcut_bn"], nn.BatchNorm2d(cout))
                self._skip.append(cfg["shortcut_bn"])

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        s = x
        for name in self._skip:
            s = getattr(self, name)(s)
        return F.relu(y + s)


class ResNet18(nn.Module):
    def __init__(self, classes=10, in_channels=1, cfg=None):
        super().__init__()
        cfg = dict(RESNET18, **(cfg or {}))
        self.cfg = cfg
        w = cfg["widths"]
        k = cfg["stem_kernel"]
        self.conv1 = nn.Conv2d(in_channels, w[0], k, cfg["stem_stride"], k // 2,
                               bias=cfg["conv_bias"])
        self.bn1 = nn.BatchNorm2d(w[0])
        self.stages = []
        cin = w[0]
        for i, (cout, n) in enumerate(zip(w, cfg["blocks"])):
            blocks = nn.Sequential(*[BasicBlock(cin if j == 0 else cout, cout,
                                                (1 if i == 0 else 2) if j == 0 else 1, cfg)
                                     for j in range(n)])
            name = cfg["stage"].format(i + 1)
            self.add_module(name, blocks)
            self.stages.append(name)
            cin = cout
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.cfg["stem_pool"]:
            k, s, p = self.cfg["stem_pool"]
            x = F.max_pool2d(x, k, s, p)
        for name in self.stages:
            x = getattr(self, name)(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


BUILDERS = {
    "tests/nets/op_conv.net": (op_conv, (3, 8, 8)),
    "tests/nets/op_conv_stride2.net": (op_conv_stride2, (3, 9, 9)),
    "tests/nets/op_conv_nobias.net": (op_conv_nobias, (3, 8, 8)),
    "tests/nets/op_conv_bigpad.net": (op_conv_bigpad, (1, 16, 16)),
    "tests/nets/op_conv_pool.net": (op_conv_pool, (2, 12, 12)),
    "tests/nets/op_conv_rows.net": (op_conv_rows, (2, 6, 44)),
    "tests/nets/op_conv_rows_pool.net": (op_conv_rows_pool, (2, 18, 18)),
    "tests/nets/op_conv_pool2.net": (op_conv_pool2, (2, 19, 19)),
    "tests/nets/op_conv_pool_nobias.net": (op_conv_pool_nobias, (3, 9, 9)),
    "tests/nets/op_relu_pool_rows.net": (op_relu_pool_rows, (2, 14, 14)),
    "tests/nets/op_conv_winograd.net": (op_conv_winograd, (32, 13, 11)),
    "tests/nets/op_linear.net": (op_linear, (2, 4, 4)),
    "tests/nets/op_batchnorm.net": (op_batchnorm, (3, 6, 6)),
    "tests/nets/op_batchnorm_args.net": (op_batchnorm_args, (3, 5, 5)),
    "tests/nets/op_relu.net": (op_act(relu), (3, 6, 6)),
    "tests/nets/op_sigmoid.net": (op_act(sigmoid), (3, 6, 6)),
    "tests/nets/op_tanh.net": (op_act(tanh), (3, 6, 6)),
    "tests/nets/op_leaky_relu.net": (op_act2(lambda: leaky_relu(0.2)), (3, 6, 6)),
    "tests/nets/op_silu.net": (op_act2(silu), (3, 6, 6)),
    "tests/nets/op_gelu.net": (op_act2(gelu), (3, 6, 6)),
    "tests/nets/op_gelu_tanh.net": (op_act2(lambda: gelu("tanh")), (3, 6, 6)),
    "tests/nets/op_xent_smooth.net": (op_xent_smooth, (3, 6, 6)),
    "tests/nets/op_batchnorm1d.net": (op_batchnorm1d, (3, 6, 6)),
    "tests/nets/op_mul_sub.net": (OpMulSub, (3, 6, 6)),
    "tests/nets/op_concat.net": (OpConcat, (3, 6, 6)),
    "tests/nets/op_fused_act.net": (OpFusedAct, (3, 6, 6)),
    "tests/nets/op_conv_act.net": (OpConvAct, (3, 12, 12)),
    "tests/nets/op_bn_act.net": (OpBnAct, (3, 10, 10)),
    "tests/nets/op_ew_act.net": (OpEwAct, (3, 4, 4)),
    "tests/nets/op_scale.net": (OpScale, (3, 6, 6)),
    "tests/nets/op_attention_long.net": (OpAttentionLong, (70, 4)),
    "tests/nets/op_tokens.net": (OpTokens, (3, 4, 5)),
    "tests/nets/op_transpose.net": (OpTranspose, (9, 3, 11)),
    "tests/nets/op_reduce.net": (OpReduce, (3, 6, 6)),
    "tests/nets/op_pool_modes.net": (OpPoolModes, (3, 8, 9)),
    "tests/nets/op_upsample_bilinear.net": (OpUpsampleBilinear, (3, 5, 7)),
    "tests/nets/op_conv_transpose.net": (OpConvTranspose, (4, 5, 5)),
    "tests/nets/op_matmul.net": (OpMatmul, (5, 6)),
    "tests/nets/op_views.net": (OpViews, (4, 3, 5)),
    "tests/nets/op_attention.net": (OpAttention, (5, 8)),
    "tests/nets/op_attention_dropout.net": (OpAttentionDropout, (70, 4)),
    "tests/nets/op_layernorm_shape.net": (OpLayerNormShape, (3, 4, 5)),
    "tests/nets/op_rank5.net": (OpRank5, (5, 8)),
    "tests/nets/op_layernorm_tokens.net": (OpLayerNormTokens, (5, 6)),
    "tests/nets/op_linear_tokens.net": (OpLinearTokens, (5, 6)),
    "tests/nets/op_block_inputs.net": (OpBlockInputs, (3, 8, 8)),
    "tests/nets/op_param.net": (OpParam, (3, 6, 6)),
    "tests/nets/op_add_broadcast.net": (OpAddBroadcast, (3, 6, 6)),
    "tests/nets/op_resample.net": (OpResample, (3, 7, 5)),
    "tests/nets/op_conv_groups.net": (op_conv_groups, (4, 9, 8)),
    "tests/nets/op_conv_groups_wide.net": (op_conv_groups_wide, (8, 6, 6)),
    "tests/nets/op_conv_depthwise.net": (op_conv_depthwise, (3, 6, 18)),
    "tests/nets/op_conv_depthwise_narrow.net": (op_conv_depthwise_narrow, (4, 7, 7)),
    "tests/nets/op_pointwise_act.net": (op_pointwise_act, (4, 5, 8)),
    "tests/nets/op_layernorm.net": (op_layernorm, (3, 5, 4)),
    "tests/nets/op_relu6.net": (op_act2(relu6), (3, 6, 6)),
    "tests/nets/op_hardsigmoid.net": (op_act2(hardsigmoid), (3, 6, 6)),
    "tests/nets/op_hardswish.net": (op_act2(hardswish), (3, 6, 6)),
    "tests/nets/op_mish.net": (op_act2(mish), (3, 6, 6)),
    "tests/nets/op_elu.net": (op_act2(lambda: elu(0.7)), (3, 6, 6)),
    "tests/nets/op_maxpool.net": (op_maxpool, (3, 9, 9)),
    "tests/nets/op_avgpool.net": (op_avgpool, (3, 9, 9)),
    "tests/nets/op_gap.net": (op_gap, (6, 5, 7)),
    "tests/nets/op_flatten.net": (op_flatten, (2, 3, 5)),
    "tests/nets/op_dropout.net": (op_dropout, (3, 4, 4)),
    "tests/nets/op_dropout_half.net": (op_dropout_half, (3, 4, 4)),
    "tests/nets/op_add.net": (OpAdd, (3, 6, 6)),
    "tests/nets/smooth.net": (Smooth, (2, 6, 6)),
    "tests/nets/small_resnet.net": (SmallResNet, (1, 12, 12)),
    "nets/lenet.net": (LeNet, (1, 28, 28)),
    "nets/resnet18.net": (ResNet18, (1, 28, 28)),
    # variants: "<net> <--set NAME=VALUE ...>"
    "nets/resnet18.net small_stem=true": (lambda: ResNet18(cfg=RESNET18_SMALL_STEM), (1, 28, 28)),
}


def build(net, dtype=torch.float64, sets=()):
    """net: path of the .net file; sets: its --set NAME=VALUE strings."""
    if net in zoo.NETS:
        builder, shape = zoo.builder(net, sets)
    else:
        builder, shape = BUILDERS[" ".join([net] + list(sets))]
    return builder().to(dtype), shape


def param_names(model):
    """Names mgc must use: parameters and BN running stats (no num_batches_tracked)."""
    return [k for k in model.state_dict() if not k.endswith("num_batches_tracked")]
