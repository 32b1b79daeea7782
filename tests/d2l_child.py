"""Train d2l 1.0.3's numpy-mode models a few steps in one precision, as a reader of the book would.

Run as ``python tests/d2l_child.py PRECISION OUT.npz`` (one process per
precision: AMP is process-global). d2l is a real client, installed with
``pip install --no-deps d2l==1.0.3``: its ``resnet18``, ``TransformerEncoder``
and ``BERTModel`` are plain ``nn.Block``\\ s in numpy mode, never hybridized.
Each trains three SGD steps with ``autograd`` directly (BERT takes four inputs
and returns three outputs). Saved per model: the loss of each step, the
first step's gradient of every parameter, and how many numpy-mode operator
calls returned each dtype, counted by wrapping every ``mx.np`` / ``mx.npx``
function after AMP has wrapped them. ``tests/test_d2l_models.py`` compares
the runs.
"""
import json
import sys

import mxfp16

import numpy as np

STEPS = 3


class DtypeCounter:
    """Counts, per dtype, the numpy-mode operator calls whose first output has it."""

    def __init__(self):
        from mxfp16._internals import numpy_operator_functions
        from mxfp16.amp.numpy_mode import numpy_operators
        from mxfp16.amp.wrappers import dtype_name

        import mxnet as mx

        self.counts = {}
        functions = {id(getattr(m, a)): getattr(m, a) for name in numpy_operators()
                     for m, a in numpy_operator_functions(name)}
        for module_name, module in list(sys.modules.items()):
            if module is None or not module_name.startswith("mxnet"):
                continue
            for attribute, value in list(vars(module).items()):
                if id(value) in functions:
                    setattr(module, attribute, self._counted(value, dtype_name, mx))

    def _counted(self, f, dtype_name, mx):
        def counted(*args, **kwargs):
            out = f(*args, **kwargs)
            first = out[0] if isinstance(out, (list, tuple)) and out else out
            if isinstance(first, mx.nd.NDArray):
                key = dtype_name(first.dtype)
                self.counts[key] = self.counts.get(key, 0) + 1
            return out
        counted.__name__ = getattr(f, "__name__", "op")
        return counted


def build(name):
    """The model, its inputs and a float32 loss of its outputs."""
    from mxfp16.amp.wrappers import cast

    from d2l import mxnet as d2l
    from mxnet import gluon, np

    source = __import__("numpy").random.RandomState(0)  # d2l's np is MXNet's
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    if name == "resnet18":
        net = d2l.resnet18(10)
        x = np.array(source.uniform(0, 1, (4, 1, 28, 28)).astype("float32"))
        y = np.array(source.randint(0, 10, (4,)).astype("float32"))
        return net, (x,), lambda out: ce(cast(out, "float32"), y).mean()
    if name == "TransformerEncoder":
        net = d2l.TransformerEncoder(100, 32, 64, 4, 2, 0.0)
        tokens = np.array(source.randint(0, 100, (4, 12)).astype("float32"))
        valid = np.array([12.0, 9.0, 6.0, 3.0])
        return net, (tokens, valid), lambda out: (cast(out, "float32") ** 2).mean()
    if name == "BERTModel":
        net = d2l.BERTModel(100, 32, 64, 4, 2, 0.0, max_len=64)
        tokens = np.array(source.randint(0, 100, (4, 12)).astype("float32"))
        segments = np.array(np.concatenate([np.zeros((4, 6)), np.ones((4, 6))], axis=1))
        valid = np.array([12.0, 10.0, 8.0, 12.0])
        positions = np.array(source.randint(1, 8, (4, 3)).astype("float32"))
        mlm_labels = np.array(source.randint(0, 100, (4, 3)).astype("float32"))
        nsp_labels = np.array([0.0, 1.0, 1.0, 0.0])

        def loss(out):
            _, mlm, nsp = out
            mlm_loss = ce(cast(mlm, "float32").reshape(-1, 100), mlm_labels.reshape(-1)).mean()
            return mlm_loss + ce(cast(nsp, "float32"), nsp_labels).mean()

        return net, (tokens, segments, valid, positions), loss
    raise ValueError(name)


def train(name):
    from mxfp16.amp.wrappers import cast

    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    net, inputs, loss_of = build(name)
    net.initialize(mx.init.Xavier())
    net(*inputs)  # finish deferred initialisation
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05, "multi_precision": True})
    losses, grads = [], []
    for step in range(STEPS):
        with autograd.record():
            loss = loss_of(net(*inputs))
        loss.backward()
        if step == 0:
            grads = [cast(p.grad(), "float32").asnumpy() for p in params]
        trainer.step(1)
        losses.append(float(loss.item()))
    return losses, grads


def main(precision_name, out):
    import warnings

    from mxnet import npx

    warnings.simplefilter("ignore")
    mxfp16.activate(mxfp16.resolve_precision(precision_name, "cpu"))
    npx.set_np()
    counter = DtypeCounter()
    report, arrays = {}, {}
    for name in ("resnet18", "TransformerEncoder", "BERTModel"):
        counter.counts = {}
        losses, grads = train(name)
        report[name] = {"losses": losses, "dtypes": dict(counter.counts)}
        for j, g in enumerate(grads):
            arrays[f"{name}_{j}"] = g
    np.savez(out, report=json.dumps(report), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
