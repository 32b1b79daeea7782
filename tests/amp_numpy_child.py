"""Train two small numpy-mode networks three SGD steps in one precision; save what they learned.

Run as ``python tests/amp_numpy_child.py PRECISION OUT.npz`` (one process per
precision: AMP is process-global). The networks are written as d2l writes
them (``npx.set_np()``, ``mx.np`` arrays, ``npx.relu``, ``+`` for the
residual): one plain ``nn.Block`` run imperatively, one ``HybridBlock``
hybridized. Saved per network: the first step's gradient of every parameter,
the loss of each step, the output's dtype and how many operators of the
hybridized graph compute in each dtype. ``tests/test_amp_numpy.py`` compares
them with the float32 run.
"""
import json
import sys

import mxfp16

import numpy as np

STEPS = 3


def build(hybrid):
    """The network: imperative (``forward``) or hybridizable (``hybrid_forward``), the same layers."""
    from mxnet import gluon, np, npx
    from mxnet.gluon import nn

    def layers(block, channels):
        block.conv1 = nn.Conv2D(channels, 3, padding=1)
        block.conv2 = nn.Conv2D(channels, 3, padding=1)
        block.conv3 = nn.Conv2D(channels, 1)
        block.bn1, block.bn2 = nn.BatchNorm(), nn.BatchNorm()

    class Residual(gluon.Block):
        """d2l's ``Residual`` block, with the 1x1 projection."""

        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            layers(self, channels)

        def forward(self, x):
            y = npx.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return npx.relu(y + self.conv3(x))

    class HybridResidual(gluon.HybridBlock):
        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            layers(self, channels)

        def hybrid_forward(self, F, x):
            y = F.npx.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.npx.relu(y + self.conv3(x))

    def parts(block):
        block.stem = nn.Conv2D(4, 3, padding=1)
        block.block = (HybridResidual if hybrid else Residual)(6)
        block.pool = nn.GlobalAvgPool2D()
        block.head = nn.Dense(5)

    class Net(gluon.Block):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            parts(self)

        def forward(self, x):
            h = self.block(self.stem(x))
            return self.head(self.pool(np.concatenate([h, x], axis=1)))

    class HybridNet(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            parts(self)

        def hybrid_forward(self, F, x):
            h = self.block(self.stem(x))
            return self.head(self.pool(F.np.concatenate([h, x], axis=1)))

    return HybridNet() if hybrid else Net()


def graph_dtypes(net):
    """``{dtype: count}`` of the hybridized graph's operators (AMP's casts left out)."""
    from mxfp16.amp.wrappers import dtype_name

    import mxnet as mx

    out = net(mx.sym.var("data").as_np_ndarray()).as_nd_ndarray()
    internals = out.get_internals()
    _, types, _ = internals.infer_type_partial(data="float32")
    by_output = dict(zip(internals.list_outputs(), types))
    counts = {}
    for node in json.loads(out.tojson(remove_amp_cast=False))["nodes"]:
        if node["op"] in ("null", "amp_cast", "amp_multicast"):
            continue
        dtype = by_output.get(f"{node['name']}_output")
        key = dtype_name(dtype) if dtype is not None else "unknown"
        counts[key] = counts.get(key, 0) + 1
    return counts


def train(hybrid):
    from mxfp16.amp.wrappers import cast, dtype_name

    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    rng = np.random.RandomState(0)
    net = build(hybrid)
    net.initialize(mx.init.Xavier(magnitude=1.0))
    x = mx.np.array(rng.uniform(-1, 1, size=(4, 3, 6, 6)).astype(np.float32))
    y = mx.np.array(rng.randint(0, 5, size=(4,)).astype(np.float32))
    net(x)  # finish deferred initialisation
    if hybrid:
        dtypes = graph_dtypes(net)
        net.hybridize()
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1, "multi_precision": True})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, grads, out_dtype = [], [], None
    for step in range(STEPS):
        with autograd.record():
            out = net(x)
            if step == 0:
                out_dtype = dtype_name(out.dtype)
            loss = loss_fn(cast(out, "float32"), y).mean()
        loss.backward()
        if step == 0:
            grads = [cast(p.grad(), "float32").asnumpy() for p in params]
        trainer.step(1)
        losses.append(float(loss.item()))
    report = {"losses": losses, "output_dtype": out_dtype}
    if hybrid:
        report["graph_dtypes"] = dtypes
    return report, grads


def main(precision_name, out):
    from mxfp16.amp import numpy_mode as amp_numpy

    from mxnet import npx

    precision = mxfp16.resolve_precision(precision_name, "cpu")
    mxfp16.activate(precision)
    npx.set_np()
    arrays, report = {}, {}
    for kind, hybrid in (("imperative", False), ("hybridized", True)):
        report[kind], grads = train(hybrid)
        for j, g in enumerate(grads):
            arrays[f"{kind}_{j}"] = g
    report["ran_in_target_dtype"] = amp_numpy.ran_in_target_dtype()
    np.savez(out, report=json.dumps(report), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
