"""Train one GluonCV classification model per family three SGD steps in one precision; save what they learned.

Run as ``python tests/amp_zoo_child.py PRECISION OUT.npz MODEL...`` (one process
per precision: AMP is process-global). Each model is built as GluonCV builds it
(its own number of classes), initialised from the same seed, and trained on the same
random batch of 2 images at the smallest size of :data:`SIZES` its graph accepts (shape
inference on the traced graph, nothing computed). Saved per model: the loss
of each step, the first step's gradient of the classifier (the last
parameter with one row per class), and the size used, or the error it raised.
``tests/test_amp_zoo.py`` compares the runs.
"""
import json
import sys
import time
import traceback

import mxfp16

import numpy as np

STEPS = 3
BATCH = 2
#: Input sizes tried in turn: the smallest at which the network's last feature map is still 2x2 or more
#: for ImageNet models (32x downsampling), CIFAR's, and what Inception and NASNet need.
SIZES = (32, 64, 96, 128, 224, 299, 331)


def smallest_size(net, name):
    """``(size, classes)``: the smallest input size whose output is ``(batch, classes)``."""
    import mxnet as mx

    out = net(mx.sym.var("data"))
    out = out[0] if isinstance(out, (list, tuple)) else out
    sizes = SIZES if name.startswith("cifar_") else SIZES[1:]
    for size in sizes:
        try:
            _, shapes, _ = out.infer_shape_partial(data=(BATCH, 3, size, size))
        except mx.MXNetError:
            continue
        if shapes and shapes[0] and len(shapes[0]) == 2 and all(shapes[0]):
            return size, shapes[0][1]
    raise ValueError(f"{name}: no input size in {sizes} gives a (batch, classes) output")


def train(name):
    from mxfp16.amp.wrappers import cast
    from mxfp16.models.gluoncv import import_gluoncv

    import mxnet as mx
    from mxnet import autograd, gluon

    zoo = import_gluoncv().model_zoo
    mx.random.seed(0)
    start = time.process_time()
    net = zoo.get_model(name, pretrained=False)
    size, classes = smallest_size(net, name)
    net.initialize(mx.init.Xavier())
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.uniform(-1, 1, size=(BATCH, 3, size, size)).astype(np.float32))
    y = mx.nd.array(rng.randint(0, 10, size=(BATCH,)).astype(np.float32))  # CIFAR's models have 10 classes
    net(x)  # finish deferred initialisation
    net.hybridize()
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.01, "multi_precision": True})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, grads = [], []
    for step in range(STEPS):
        mx.random.seed(step)  # Dropout masks: the same draw in every precision
        with autograd.record():
            out = net(x)
            out = out[0] if isinstance(out, (list, tuple)) else out
            loss = loss_fn(cast(out, "float32"), y).mean()
        loss.backward()
        if step == 0:
            # The classifier's gradient: the last parameter with one row per class. Earlier layers' are not
            # compared (tests/test_amp_zoo.py says why), and all of them would be gigabytes.
            head = [p for p in params if len(p.shape) >= 2 and p.shape[0] == classes][-1]
            grads = [cast(head.grad(), "float32").asnumpy()]
        trainer.step(1)
        losses.append(float(loss.asscalar()))
    return {"losses": losses, "size": size, "cpu_seconds": round(time.process_time() - start, 2)}, grads


def main(precision_name, out, names):
    import warnings

    warnings.simplefilter("ignore")
    mxfp16.activate(mxfp16.resolve_precision(precision_name, "cpu"))
    report, arrays = {}, {}
    for name in names:
        try:
            report[name], grads = train(name)
        except Exception as err:  # the test names the model and shows this
            report[name] = {"error": f"{type(err).__name__}: {str(err)[-400:]}",
                            "trace": traceback.format_exc()[-1500:]}
            continue
        for j, g in enumerate(grads):
            arrays[f"{name}/{j}"] = g
    np.savez(out, report=json.dumps(report), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
