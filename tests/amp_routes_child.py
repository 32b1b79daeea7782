"""Type the networks of issue 44's families under one AMP list set; print each one's casts and operator dtypes.

Run as ``python tests/amp_routes_child.py LISTS`` (AMP is process-global: one
process per list set). ``LISTS`` is a name of ``mxfp16.amp.lists.LIST_SETS``,
or ``shape-float32``: mxfp16's lists with the shape operators back in
float32, as MXNet's lists have them (the lists before they followed their
input). Nothing runs: the graphs are traced and typed (any CPU).
"""
import json
import sys
import warnings

import mxfp16  # noqa: F401 -- the numpy names MXNet needs, before it loads
from mxfp16.amp.graph import count_casts, trace
from mxfp16.amp.lists import SHAPE_OPERATORS, init_amp, operator_lists
from mxfp16.amp.recurrent import unfuse_rnn
from mxfp16.amp.table import FusedSelfAttention
from mxfp16.models.sequence import EncoderBlock, LSTMClassifier, SelfAttention, TransformerEncoderClassifier

from mxnet import gluon

STEPS = 8


class Generator(gluon.HybridBlock):
    """DCGAN's generator as MXNet's example writes it: 1x1 noise to 4x4, then strided Conv2DTranspose, tanh.

    The channel counts are those that need oneDNN's padded layouts (100 in, 3 out).
    """

    def __init__(self, ngf=16, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Conv2DTranspose(ngf * 2, 4, 1, 0, use_bias=False), gluon.nn.BatchNorm(),
                          gluon.nn.Activation("relu"),
                          gluon.nn.Conv2DTranspose(ngf, 4, 2, 1, use_bias=False), gluon.nn.BatchNorm(),
                          gluon.nn.Activation("relu"),
                          gluon.nn.Conv2DTranspose(3, 4, 2, 1, use_bias=False), gluon.nn.Activation("tanh"))

    def hybrid_forward(self, F, z):
        return self.body(z)


class DenseGenerator(gluon.HybridBlock):
    """The issue's generator: Dense -> BatchNorm -> reshape -> Conv2DTranspose x2 -> tanh, 16 px grey images."""

    def __init__(self, ngf=16, channels=1, **kwargs):
        super().__init__(**kwargs)
        self._ngf = ngf
        with self.name_scope():
            self.dense = gluon.nn.Dense(ngf * 2 * 4 * 4)
            self.norm = gluon.nn.BatchNorm()
            self.up1 = gluon.nn.Conv2DTranspose(ngf, 4, 2, 1)
            self.up2 = gluon.nn.Conv2DTranspose(channels, 4, 2, 1)

    def hybrid_forward(self, F, z):
        x = F.relu(self.norm(self.dense(z)))
        x = F.reshape(x, shape=(0, self._ngf * 2, 4, 4))
        return F.tanh(self.up2(F.relu(self.up1(x))))


def separable_block():
    """MobileNet's depthwise-separable block: 1x1 expansion, 3x3 depthwise, 1x1 projection."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(32, 1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(32, 3, padding=1, groups=32), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(16, 1), gluon.nn.BatchNorm())
    return net


class ReLU6Block(gluon.HybridBlock):
    """MobileNet v2's convolution, BatchNorm and ReLU6, as GluonCV writes ReLU6 (``F.clip(x, 0, 6)``), then a 1x1."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv, self.norm, self.project = gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), \
                gluon.nn.Conv2D(8, 1)

    def hybrid_forward(self, F, x):
        return self.project(F.clip(self.norm(self.conv(x)), 0, 6))


def unaligned_block():
    """Channels as MobileNet v2's: a 3-channel input, a 24-channel projection and the expansion reading it (each
    not a multiple of 16), then an aligned depthwise and 1x1 pair. The input channels are given, as a network's
    parameters have their shapes once it ran (and its symbols were renewed: mxfp16.MixedPrecision.prepare)."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(32, 3, padding=1, in_channels=3), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(24, 1, in_channels=32), gluon.nn.Conv2D(32, 1, in_channels=24),
            gluon.nn.Conv2D(32, 3, padding=1, groups=32, in_channels=32), gluon.nn.Conv2D(16, 1, in_channels=32))
    return net


def pooled_cnn(pool):
    """A ResNet's end: convolution, BatchNorm, ReLU, global pooling (GlobalAvgPool2D or GlobalMaxPool2D), Dense."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            pool(), gluon.nn.Dense(10))
    return net


def lstm(unfused):
    net = LSTMClassifier(10, 16, num_layers=2)
    if unfused:
        unfuse_rnn(net, steps=STEPS)
    return net


#: name -> (build, input shapes)
NETWORKS = {
    "transformer-encoder": (lambda: TransformerEncoderClassifier(10, 8, units=16, heads=2, ffn_units=32,
                                                                 num_layers=2), [(2, 1, 8, 8)]),
    "self-attention": (lambda: SelfAttention(16, 2), [(2, 8, 16)]),
    "encoder-block": (lambda: EncoderBlock(16, 2, 32), [(2, 8, 16)]),
    "fused-attention": (lambda: FusedSelfAttention(16, 2), [(8, 2, 16)]),
    "lstm": (lambda: lstm(False), [(2, 1, STEPS, 8)]),
    "lstm-unfused": (lambda: lstm(True), [(2, 1, STEPS, 8)]),
    "dcgan-generator": (Generator, [(2, 100, 1, 1)]),
    "dense-generator": (DenseGenerator, [(2, 100)]),
    "separable-block": (separable_block, [(2, 16, 8, 8)]),
    "relu6-block": (ReLU6Block, [(2, 16, 8, 8)]),
    "unaligned-block": (unaligned_block, [(2, 3, 8, 8)]),
    "global-avg-pool": (lambda: pooled_cnn(gluon.nn.GlobalAvgPool2D), [(2, 3, 8, 8)]),
    "global-max-pool": (lambda: pooled_cnn(gluon.nn.GlobalMaxPool2D), [(2, 3, 8, 8)]),
}


def _cast_in(node, producers):
    """Whether AMP cast a data input of ``node`` (not a parameter) to a dtype that input did not have."""
    for entry in node.inputs:
        cast = producers.get(entry)
        if cast is None or cast.op not in ("amp_cast", "amp_multicast"):
            continue
        k = int(entry.rsplit("_output", 1)[1] or 0)  # amp_multicast's output k is its input k
        k = k if cast.op == "amp_multicast" else 0
        if not cast.parameters[k] and cast.input_dtypes[k] not in (None, cast.dtype):
            return True
    return False


def main(which):
    warnings.simplefilter("ignore")
    if which == "shape-float32":
        lists = operator_lists("bfloat16")
        lists["fp32_ops"] += [name for name in SHAPE_OPERATORS if name not in lists["fp32_ops"]]
        init_amp("bfloat16", lists=lists)
    else:
        init_amp("bfloat16", which)
    report = {}
    for name, (build, shapes) in NETWORKS.items():
        net = build()
        net.initialize()
        nodes = trace(net, shapes)
        casts = count_casts(nodes)
        producers = {f"{n.name}_output{suffix}": n for n in nodes for suffix in [""] + [str(k) for k in range(8)]}
        # Each operator: its dtype, and whether AMP cast one of its data inputs to a dtype it did not have.
        report[name] = {"casts": [casts.data, casts.parameters],
                        "ops": [[n.op, n.dtype, _cast_in(n, producers)] for n in nodes
                                if n.op not in ("amp_cast", "amp_multicast")]}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
