"""PyTorch twins of the CNN zoo in nets/ (bn_lenet, alexnet, vgg11, nin,
googlenet, densenet, mobilenetv2, se_resnet, resnext, resnet9, vit), written from the
papers and d2l's code, with the parameter names mgc gives the .net files'
labels. Each builder takes the net's parameters as keywords (the .net file's
names and defaults); models.BUILDERS registers the variants the tests run.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Named(nn.Module):
    """Children added by name, applied in order (nn.Sequential with our names)."""

    def __init__(self, *layers):
        super().__init__()
        self._order = []
        for i, l in enumerate(layers):
            name, m = l if isinstance(l, tuple) else (f"_{i}", l)
            self.add_module(name, m)
            self._order.append(name)

    def forward(self, x):
        for name in self._order:
            x = getattr(self, name)(x)
        return x


class Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


relu, sigmoid, relu6 = (lambda: Lambda(F.relu)), (lambda: Lambda(torch.sigmoid)), (lambda: Lambda(F.relu6))
flatten = lambda: Lambda(lambda x: torch.flatten(x, 1))
gap = lambda: nn.AdaptiveAvgPool2d(1)


def bn_lenet(classes=10, in_channels=1):
    return Named(("conv1", nn.Conv2d(in_channels, 6, 5)), ("bn1", nn.BatchNorm2d(6)), sigmoid(), nn.AvgPool2d(2, 2),
                 ("conv2", nn.Conv2d(6, 16, 5)), ("bn2", nn.BatchNorm2d(16)), sigmoid(), nn.AvgPool2d(2, 2),
                 flatten(),
                 ("fc1", nn.Linear(256, 120)), ("bn3", nn.BatchNorm1d(120)), sigmoid(),
                 ("fc2", nn.Linear(120, 84)), ("bn4", nn.BatchNorm1d(84)), sigmoid(),
                 ("fc3", nn.Linear(84, classes)))


def _pooled(size, k, s, p=0):
    return (size + 2 * p - k) // s + 1


def alexnet(classes=10, in_channels=1, size=96, dropout=0.5):
    m = _pooled(_pooled(_pooled(_pooled(size, 11, 4, 1), 3, 2), 3, 2), 3, 2)   # conv1, three pools
    return Named(("conv1", nn.Conv2d(in_channels, 96, 11, 4, 1)), relu(), nn.MaxPool2d(3, 2),
                 ("conv2", nn.Conv2d(96, 256, 5, padding=2)), relu(), nn.MaxPool2d(3, 2),
                 ("conv3", nn.Conv2d(256, 384, 3, padding=1)), relu(),
                 ("conv4", nn.Conv2d(384, 384, 3, padding=1)), relu(),
                 ("conv5", nn.Conv2d(384, 256, 3, padding=1)), relu(), nn.MaxPool2d(3, 2),
                 flatten(),
                 ("fc1", nn.Linear(256 * m * m, 4096)), relu(), nn.Dropout(dropout),
                 ("fc2", nn.Linear(4096, 4096)), relu(), nn.Dropout(dropout),
                 ("fc3", nn.Linear(4096, classes)))


def vgg11(classes=10, in_channels=1, size=64, width=16, dropout=0.5):
    def block(convs, cin, cout):
        layers = []
        for i in range(convs):
            layers += [(str(i), nn.Conv2d(cin if i == 0 else cout, cout, 3, padding=1)), relu()]
        return Named(*layers, nn.MaxPool2d(2, 2))
    w = width
    return Named(("b1", block(1, in_channels, w)), ("b2", block(1, w, 2 * w)), ("b3", block(2, 2 * w, 4 * w)),
                 ("b4", block(2, 4 * w, 8 * w)), ("b5", block(2, 8 * w, 8 * w)), flatten(),
                 ("fc1", nn.Linear(8 * w * (size // 32) ** 2, 4096)), relu(), nn.Dropout(dropout),
                 ("fc2", nn.Linear(4096, 4096)), relu(), nn.Dropout(dropout),
                 ("fc3", nn.Linear(4096, classes)))


def nin(classes=10, in_channels=1, size=96, dropout=0.5):
    def block(cin, cout, k, s, p):
        return Named(("conv1", nn.Conv2d(cin, cout, k, s, p)), relu(), ("conv2", nn.Conv2d(cout, cout, 1)), relu(),
                     ("conv3", nn.Conv2d(cout, cout, 1)), relu())
    return Named(("b1", block(in_channels, 96, 11, 4, 0)), nn.MaxPool2d(3, 2),
                 ("b2", block(96, 256, 5, 1, 2)), nn.MaxPool2d(3, 2),
                 ("b3", block(256, 384, 3, 1, 1)), nn.MaxPool2d(3, 2), nn.Dropout(dropout),
                 ("b4", block(384, classes, 3, 1, 1)), gap(), flatten())


class Inception(nn.Module):
    def __init__(self, cin, c1, c2a, c2b, c3a, c3b, c4):
        super().__init__()
        self.b1 = nn.Conv2d(cin, c1, 1)
        self.b2_1, self.b2_2 = nn.Conv2d(cin, c2a, 1), nn.Conv2d(c2a, c2b, 3, padding=1)
        self.b3_1, self.b3_2 = nn.Conv2d(cin, c3a, 1), nn.Conv2d(c3a, c3b, 5, padding=2)
        self.b4 = nn.Conv2d(cin, c4, 1)
        self.out = c1 + c2b + c3b + c4

    def forward(self, x):
        p1 = F.relu(self.b1(x))
        p2 = F.relu(self.b2_2(F.relu(self.b2_1(x))))
        p3 = F.relu(self.b3_2(F.relu(self.b3_1(x))))
        p4 = F.relu(self.b4(F.max_pool2d(x, 3, 1, 1)))
        return torch.cat([p1, p2, p3, p4], 1)


def googlenet(classes=10, in_channels=1, size=96):
    cfg = [("i3a", (64, 96, 128, 16, 32, 32)), ("i3b", (128, 128, 192, 32, 96, 64)), None,
           ("i4a", (192, 96, 208, 16, 48, 64)), ("i4b", (160, 112, 224, 24, 64, 64)),
           ("i4c", (128, 128, 256, 24, 64, 64)), ("i4d", (112, 144, 288, 32, 64, 64)),
           ("i4e", (256, 160, 320, 32, 128, 128)), None,
           ("i5a", (256, 160, 320, 32, 128, 128)), ("i5b", (384, 192, 384, 48, 128, 128))]
    layers = [("s1", nn.Conv2d(in_channels, 64, 7, 2, 3)), relu(), nn.MaxPool2d(3, 2, 1),
              ("s2_1", nn.Conv2d(64, 64, 1)), relu(), ("s2_2", nn.Conv2d(64, 192, 3, padding=1)), relu(),
              nn.MaxPool2d(3, 2, 1)]
    c = 192
    for item in cfg:
        if item is None:
            layers.append(nn.MaxPool2d(3, 2, 1))
            continue
        m = Inception(c, *item[1])
        layers.append((item[0], m))
        c = m.out
    return Named(*layers, gap(), flatten(), ("fc", nn.Linear(c, classes)))


class DenseStage(nn.Module):
    def __init__(self, cin, units, growth, last):
        super().__init__()
        self.units = units
        for i in range(units):
            self.add_module(str(i), Named(("bn", nn.BatchNorm2d(cin + i * growth)), relu(),
                                          ("conv", nn.Conv2d(cin + i * growth, growth, 3, padding=1))))
        self.out = cin + units * growth
        if not last:
            self.trans = Named(("bn", nn.BatchNorm2d(self.out)), relu(), ("conv", nn.Conv2d(self.out, self.out // 2, 1)),
                               nn.AvgPool2d(2, 2))
            self.out //= 2
        else:
            self.trans = None

    def forward(self, x):
        for i in range(self.units):
            x = torch.cat([x, getattr(self, str(i))(x)], 1)
        return self.trans(x) if self.trans is not None else x


def densenet(classes=10, in_channels=1, size=96, growth=32):
    layers = [("conv1", nn.Conv2d(in_channels, 64, 7, 2, 3)), ("bn1", nn.BatchNorm2d(64)), relu(), nn.MaxPool2d(3, 2, 1)]
    c = 64
    for i in range(4):
        s = DenseStage(c, 4, growth, i == 3)
        layers.append((str(i), s))
        c = s.out
    return Named(*layers, ("bn2", nn.BatchNorm2d(c)), relu(), gap(), flatten(), ("fc", nn.Linear(c, classes)))


class Inverted(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        h = cin * expand
        self.expand = expand != 1
        if self.expand:
            self.expand_conv, self.bn1 = nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h)
        self.dw, self.bn2 = nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h)
        self.project, self.bn3 = nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = F.relu6(self.bn1(self.expand_conv(x))) if self.expand else x
        y = self.bn3(self.project(F.relu6(self.bn2(self.dw(y)))))
        return y + x if self.residual else y


def mobilenetv2(classes=10, in_channels=1, dropout=0.2):
    cfg = [(16, 1, 1, 1), (24, 1, 6, 2), (32, 2, 6, 3), (64, 2, 6, 4), (96, 1, 6, 3), (160, 2, 6, 3), (320, 1, 6, 1)]
    layers = [("stem", nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False)), ("stem_bn", nn.BatchNorm2d(32)), relu6()]
    c = 32
    for g, (cout, stride, t, n) in enumerate(cfg):
        layers.append((f"g{g + 1}", Named(*[(str(i), Inverted(c if i == 0 else cout, cout, stride if i == 0 else 1, t))
                                            for i in range(n)])))
        c = cout
    return Named(*layers, ("head", nn.Conv2d(c, 1280, 1, bias=False)), ("head_bn", nn.BatchNorm2d(1280)), relu6(),
                 gap(), flatten(), nn.Dropout(dropout), ("fc", nn.Linear(1280, classes)))


class SqueezeExcite(nn.Module):
    def __init__(self, c, reduction):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // reduction, 1), nn.Conv2d(c // reduction, c, 1)

    def forward(self, x):
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        return x * s


class SEBlock(nn.Module):
    def __init__(self, cin, cout, stride, reduction):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.se = SqueezeExcite(cout, reduction)
        self.project = stride != 1 or cin != cout
        if self.project:
            self.proj, self.proj_bn = nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x):
        y = self.se(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return F.relu(y + (self.proj_bn(self.proj(x)) if self.project else x))


def se_resnet(classes=10, in_channels=1, width=16, reduction=8):
    layers = [("conv1", nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)), ("bn1", nn.BatchNorm2d(width)), relu()]
    c = width
    for s, (mult, stride) in enumerate([(1, 1), (2, 2), (4, 2), (8, 2)]):
        cout = width * mult
        layers.append((f"stage{s + 1}", Named(*[(str(i), SEBlock(c if i == 0 else cout, cout, stride if i == 0 else 1,
                                                                 reduction)) for i in range(2)])))
        c = cout
    return Named(*layers, gap(), flatten(), ("fc", nn.Linear(c, classes)))


class Bottleneck(nn.Module):
    def __init__(self, cin, cout, width, groups, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.project = stride != 1 or cin != cout
        if self.project:
            self.proj, self.proj_bn = nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(y)))))
        return F.relu(y + (self.proj_bn(self.proj(x)) if self.project else x))


def resnext(classes=10, in_channels=1, cardinality=8, bottleneck_width=4):
    w = cardinality * bottleneck_width
    layers = [("conv1", nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False)), ("bn1", nn.BatchNorm2d(32)), relu()]
    c = 32
    for s, (cout, width, stride) in enumerate([(64, w, 1), (128, 2 * w, 2), (256, 4 * w, 2)]):
        layers.append((f"stage{s + 1}", Named(*[(str(i), Bottleneck(c if i == 0 else cout, cout, width, cardinality,
                                                                    stride if i == 0 else 1)) for i in range(2)])))
        c = cout
    return Named(*layers, gap(), flatten(), ("fc", nn.Linear(c, classes)))


def _conv_bn(cin, cout):
    return Named(("conv", nn.Conv2d(cin, cout, 3, padding=1, bias=False)), ("bn", nn.BatchNorm2d(cout)), relu())


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a, self.b = _conv_bn(c, c), _conv_bn(c, c)

    def forward(self, x):
        return x + self.b(self.a(x))


def resnet9(classes=10, in_channels=1, width=24, label_smoothing=0.1):
    w = width
    m = Named(("prep", _conv_bn(in_channels, w)),
              ("layer1", _conv_bn(w, 2 * w)), nn.MaxPool2d(2), ("res1", Residual(2 * w)),
              ("layer2", _conv_bn(2 * w, 4 * w)), nn.MaxPool2d(2),
              ("layer3", _conv_bn(4 * w, 8 * w)), nn.MaxPool2d(2), ("res3", Residual(8 * w)),
              nn.AdaptiveMaxPool2d(1), flatten(), ("fc", nn.Linear(8 * w, classes)))
    m.label_smoothing = label_smoothing   # the loss's (ref.py and the benchmarks read it)
    return m


# net file -> (builder, its parameters' defaults' input size): the input is
# [in_channels, size, size] (28 for the nets without a size parameter)
class MBConv(nn.Module):
    """tests/nets/like/efficientnet.net's block: expansion, depthwise, SE gate (SiLU, hardsigmoid), projection"""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        h = cin * expand
        self.expand_conv, self.bn1 = nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h)
        self.dw, self.bn2 = nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h)
        self.se_reduce, self.se_expand = nn.Conv2d(h, cin // 4, 1), nn.Conv2d(cin // 4, h, 1)
        self.project, self.bn3 = nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = F.silu(self.bn2(self.dw(F.silu(self.bn1(self.expand_conv(x))))))
        s = F.hardsigmoid(self.se_expand(F.silu(self.se_reduce(F.adaptive_avg_pool2d(y, 1)))))
        y = self.bn3(self.project(y * s))
        return y + x if self.residual else y


def efficientnet_like(classes=10, in_channels=1):
    cfg = [(16, 1), (24, 2), (24, 1), (40, 2), (40, 1)]
    layers = [("stem", nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)), ("stem_bn", nn.BatchNorm2d(16)), Lambda(F.silu)]
    c = 16
    for i, (cout, stride) in enumerate(cfg):
        layers.append((f"b{i + 1}", MBConv(c, cout, stride, 4)))
        c = cout
    return Named(*layers, ("head", nn.Conv2d(c, 128, 1, bias=False)), ("head_bn", nn.BatchNorm2d(128)), Lambda(F.silu),
                 gap(), flatten(), ("fc", nn.Linear(128, classes)))


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of [N, C, H, W] at each position (mgc's layernorm on 4-D input)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """tests/nets/like/convnext.net's block: depthwise 7x7, LayerNorm, 1x1 by 4 with GELU, 1x1, the input added"""

    def __init__(self, c):
        super().__init__()
        self.dw, self.ln = nn.Conv2d(c, c, 7, padding=3, groups=c), ChannelNorm(c)
        self.pw1, self.pw2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)

    def forward(self, x):
        return self.pw2(F.gelu(self.pw1(self.ln(self.dw(x))))) + x


def convnext_like(classes=10, in_channels=1):
    return Named(("stem", nn.Conv2d(in_channels, 32, 2, 2)), ("stem_ln", ChannelNorm(32)),
                 ("s1a", ConvNeXtBlock(32)), ("s1b", ConvNeXtBlock(32)),
                 ("down", nn.Conv2d(32, 64, 2, 2)), ("down_ln", ChannelNorm(64)),
                 ("s2a", ConvNeXtBlock(64)), ("s2b", ConvNeXtBlock(64)),
                 gap(), flatten(), ("fc", nn.Linear(64, classes)))


def sdpa(q, k, v, heads, causal=False, dropout=0.0, mask=None):
    """attention(k, v, heads, causal, dropout) of mgc on [N, T, D]: PyTorch's scaled dot-product
    attention on q, k, v split into heads (written out: torch 1.13 has no F.scaled_dot_product_attention);
    dropout: of the weights, the caller's to zero outside training; mask: [N, heads, Tq, Tk], the
    weights' factors (0 or 1 / (1 - p): a given dropout mask, mgc's own)"""
    n, tq, d = q.shape
    split = lambda t: t.reshape(n, t.shape[1], heads, d // heads).transpose(1, 2)
    if mask is not None:
        s = split(q) @ split(k).transpose(-2, -1) / math.sqrt(d // heads)
        if causal:
            s = s.masked_fill(torch.ones(tq, k.shape[1], dtype=torch.bool).tril().logical_not(), float("-inf"))
        return ((torch.softmax(s, -1) * mask) @ split(v)).transpose(1, 2).reshape(n, tq, d)
    if hasattr(F, "scaled_dot_product_attention") and q.dtype != torch.float64:   # PyTorch 2's fused kernels (bench/)
        return F.scaled_dot_product_attention(split(q), split(k), split(v), dropout_p=dropout,
                                              is_causal=causal).transpose(1, 2).reshape(n, tq, d)
    s = split(q) @ split(k).transpose(-2, -1) / math.sqrt(d // heads)
    if causal:
        s = s.masked_fill(torch.ones(tq, k.shape[1], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return (F.dropout(torch.softmax(s, -1), dropout) @ split(v)).transpose(1, 2).reshape(n, tq, d)


class _PatchEmbedding(nn.Module):
    def __init__(self, channels, d, patch):
        super().__init__()
        self.conv = nn.Conv2d(channels, d, patch, stride=patch)

    def forward(self, x):
        return self.conv(x).flatten(2).transpose(1, 2)


class _MultiHeadAttention(nn.Module):
    """d2l.MultiHeadAttention with use_bias=False: its attention weights dropped with probability p"""
    def __init__(self, d, heads, p=0.0):
        super().__init__()
        self.heads, self.p = heads, p
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        return self.W_o(sdpa(self.W_q(x), self.W_k(x), self.W_v(x), self.heads, dropout=self.p if self.training else 0.0))


class _ViTMLP(nn.Module):
    def __init__(self, d, hidden, p):
        super().__init__()
        self.dense1, self.gelu, self.dropout1 = nn.Linear(d, hidden), nn.GELU(), nn.Dropout(p)
        self.dense2, self.dropout2 = nn.Linear(hidden, d), nn.Dropout(p)

    def forward(self, x):
        return self.dropout2(self.dense2(self.dropout1(self.gelu(self.dense1(x)))))


class _ViTBlock(nn.Module):
    def __init__(self, d, hidden, heads, p):
        super().__init__()
        self.ln1, self.attention = nn.LayerNorm(d), _MultiHeadAttention(d, heads, p)
        self.ln2, self.mlp = nn.LayerNorm(d), _ViTMLP(d, hidden, p)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """d2l's ViT (Dive into Deep Learning 11.8), its names: nets/vit.net's twin"""
    def __init__(self, classes, channels, image, patch, d, hidden, heads, blocks, p):
        super().__init__()
        self.patch_embedding = _PatchEmbedding(channels, d, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d))
        self.dropout = nn.Dropout(p)
        self.blks = nn.Sequential(*[_ViTBlock(d, hidden, heads, p) for _ in range(blocks)])
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, classes))

    def forward(self, x):
        x = self.patch_embedding(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), 1)
        x = self.dropout(x + self.pos_embedding)
        for blk in self.blks:
            x = blk(x)
        return self.head(x[:, 0])


def vit(classes=10, channels=1, image=28, patch=4, d=128, hidden=256, heads=4, blocks=2, p=0.1, label_smoothing=0.0):
    m = ViT(classes, channels, image, patch, d, hidden, heads, blocks, p)
    m.label_smoothing = label_smoothing   # the loss's (ref.py and the benchmarks read it)
    return m


class _MixerMlp(nn.Module):
    def __init__(self, d, hidden, out, p):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(d, hidden), nn.Linear(hidden, out), nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(F.gelu(self.fc1(x)))))


class _MixerBlock(nn.Module):
    def __init__(self, tokens, d, token_hidden, channel_hidden, p):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.mlp_tokens = _MixerMlp(tokens, token_hidden, tokens, p)
        self.mlp_channels = _MixerMlp(d, channel_hidden, d, p)

    def forward(self, x):
        x = x + self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp_channels(self.norm2(x))


class Mixer(nn.Module):
    """MLP-Mixer with timm's MlpMixer names: nets/mixer.net's twin"""
    def __init__(self, classes, channels, image, patch, d, token_hidden, channel_hidden, blocks, p):
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Module()
        self.stem.proj = nn.Conv2d(channels, d, patch, stride=patch)
        self.blocks = nn.Sequential(*[_MixerBlock(tokens, d, token_hidden, channel_hidden, p) for _ in range(blocks)])
        self.norm, self.head = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, classes)

    def forward(self, x):
        x = self.blocks(self.stem.proj(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


def mixer(classes=10, channels=1, image=28, patch=4, d=128, token_hidden=64, channel_hidden=256, blocks=4, p=0.0):
    return Mixer(classes, channels, image, patch, d, token_hidden, channel_hidden, blocks, p)


NETS = {
    "nets/bn_lenet.net": bn_lenet, "nets/alexnet.net": alexnet, "nets/vgg11.net": vgg11, "nets/nin.net": nin,
    "nets/googlenet.net": googlenet, "nets/densenet.net": densenet, "nets/mobilenetv2.net": mobilenetv2,
    "nets/se_resnet.net": se_resnet, "nets/resnext.net": resnext, "nets/resnet9.net": resnet9,
    "nets/vit.net": vit, "nets/mixer.net": mixer,
    "tests/nets/like/efficientnet.net": efficientnet_like, "tests/nets/like/convnext.net": convnext_like,
}


def builder(net, sets):
    """(builder, input shape) for a zoo net with `--set NAME=VALUE` strings."""
    kw = {}
    for s in sets:
        k, v = s.split("=", 1)
        kw[k] = float(v) if "." in v else int(v)
    f = NETS[net]
    side = "size" if "size" in f.__code__.co_varnames else "image"   # the ViT's and the Mixer's is `image`
    size = kw.get(side, f.__defaults__[list(f.__code__.co_varnames).index(side)] if side in f.__code__.co_varnames
                  else 28)
    return (lambda: f(**kw)), (kw.get("in_channels", kw.get("channels", 1)), size, size)
