"""The ``mxfp16+batchnorm32`` option: every BatchNorm in float32 under bfloat16 AMP, the convolutions in bfloat16.

oneDNN 2.4.4 runs a BatchNorm on the plain layout with ``ncsp_bnorm:any``, which in bfloat16 took about 4x its
float32 time on an AMD Zen 4 (``mxfp16.amp.lists.batch_norm``). tests/test_amp_routes.py reads the option from the
typed graphs; here a training step runs with it on a CPU with bfloat16 arithmetic: oneDNN's log shows every
BatchNorm in float32 and the convolutions in bfloat16, and the loss matches float32's within bfloat16's rounding.
"""
import json

import numpy as np
from conftest import requires_bfloat16, run_python

#: bfloat16's unit roundoff (8 significant bits, round to nearest).
BF16_U = 2.0 ** -8

_STEP = """
    import json
    import numpy as np
    import mxfp16
    import mxnet as mx
    from mxnet import gluon
    mp = mxfp16.MixedPrecision("{precision}", "cpu", amp_lists="{lists}", log=lambda line: None)
    mx.random.seed(0)
    np.random.seed(0)
    net = gluon.nn.HybridSequential()  # MobileNet's block at 24 channels: plain layouts, ncsp BatchNorm
    net.add(gluon.nn.Conv2D(24, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(24, 3, padding=1, groups=24, use_bias=False), gluon.nn.BatchNorm(),
            gluon.nn.Activation("relu"), gluon.nn.Conv2D(24, 1, use_bias=False), gluon.nn.BatchNorm(),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=(16, 3, 12, 12))
    y = mx.nd.array(np.arange(16) % 10)
    data, label = mp.cast_batch(x, y)
    trainer = mp.prepare(net, "sgd", {{"learning_rate": 0.0}}, example=(x, y))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = [float(mp.train_step(net, loss, trainer, data, label).loss.mean().asnumpy()) for _ in range(2)]
    print("LOSSES " + json.dumps(losses), flush=True)
"""


def _run(precision, lists):
    proc = run_python(_STEP.format(precision=precision, lists=lists), env={"DNNL_VERBOSE": "1", "OMP_NUM_THREADS": "1"})
    lines = proc.stdout.splitlines()
    losses = json.loads(next(line for line in lines if line.startswith("LOSSES "))[len("LOSSES "):])
    return losses, [line.split(",") for line in lines if line.startswith("dnnl_verbose,exec,")]


@requires_bfloat16
def test_the_option_runs_every_batchnorm_in_float32_and_the_convolutions_in_bfloat16():
    reference, _ = _run("float32", "mxfp16")
    losses, execs = _run("amp-bfloat16", "mxfp16+batchnorm32")
    norms = [f for f in execs if f[3] == "batch_normalization"]
    convolutions = [f for f in execs if f[3] == "convolution"]
    assert norms and all("_f32:" in f[6] and "bf16" not in f[6] for f in norms), {f[6] for f in norms}
    assert convolutions and all("bf16" in f[6] for f in convolutions)
    # Learning rate 0: both steps see the same weights. The bfloat16 convolutions round their inputs once
    # (u = 2^-8) over reductions of up to 9 * 24 products: relative, with sqrt(K) growth.
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, reference, rtol=BF16_U * np.sqrt(9 * 24) * 2)


@requires_bfloat16
def test_without_the_option_those_batchnorms_run_in_bfloat16():
    _, execs = _run("amp-bfloat16", "mxfp16")
    norms = [f for f in execs if f[3] == "batch_normalization"]
    assert norms and all("bf16" in f[6] for f in norms)
