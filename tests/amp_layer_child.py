"""Train every layer of :data:`mxfp16.amp.table.LAYERS` a few steps in one precision; save what it learned.

Run as ``python tests/amp_layer_child.py PRECISION OUT.npz [LISTS]`` (one
process per precision: AMP is process-global). With ``LISTS`` ``measured``,
every convolution and dense layer is kept in float32 as a measurement would
keep those that do not gain (the far end of what ``--amp-lists measured``
does), through the same wrappers. Each layer sits behind a cast of its
input to the precision's 16-bit type (as after a Dense or convolution) and
is hybridized; the loss is float32. Saved per layer: the first step's
gradient of each parameter and of the input, and the loss of each of three
SGD steps, or the error it raised. ``tests/test_amp_layers.py`` compares
them with the float32 control.
"""
import json
import sys
import traceback

import mxfp16
from mxfp16.amp.table import LAYERS, _Cast, _numpy_scope
from mxfp16.float_formats import BFLOAT16

import numpy as np

STEPS = 3


def main(precision_name, out, lists="mxfp16"):
    import mxnet as mx
    from mxnet import autograd, gluon, nd

    precision = mxfp16.resolve_precision(precision_name, "cpu", allow_cpu_float16=True)
    mxfp16.activate(precision, lists)
    cast = {"amp-bfloat16": BFLOAT16, "float16": None}.get(precision.name)
    arrays, report = {}, {}
    for index, layer in enumerate(LAYERS):
        try:
            with _numpy_scope(layer.numpy_mode):
                if layer.numpy_mode:
                    mx.npx.set_np()
                try:
                    losses, grads = _train(layer, precision, cast, lists)
                finally:
                    if layer.numpy_mode:
                        mx.npx.reset_np()
            report[layer.name] = {"losses": losses}
            for j, g in enumerate(grads):
                arrays[f"{index}_{j}"] = g
        except Exception as err:  # the test names the layer and shows this
            report[layer.name] = {"error": f"{type(err).__name__}: {str(err)[-400:]}",
                                  "trace": traceback.format_exc()[-1500:]}
    np.savez(out, report=json.dumps(report), **arrays)
    del gluon, nd, autograd


def _keep_every_layer_float32(block, layer):
    """What a measurement that found no layer gaining keeps: each convolution and dense layer, in float32."""
    from mxfp16.amp.lists import keep_float32_measured
    from mxfp16.measure.per_layer import network_layers

    plain = not (layer.tokens or layer.numpy_mode or layer.states)
    rows = network_layers(block, [layer.shape]) if plain else []
    keep_float32_measured([{"op": r.op, "attrs": r.attrs, "weight": r.weight, "shapes": r.shapes} for r in rows])


def _train(layer, precision, cast, lists):
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    rng = np.random.RandomState(0)
    block = _Cast(layer.build(), cast, layer.states, layer.numpy_mode)
    block.initialize(mx.init.Xavier(magnitude=1.0))
    if lists == "measured":
        _keep_every_layer_float32(block, layer)
    if precision.name == "float16":
        mxfp16.cast_net(block, "float16")
    x, states = _inputs(layer, precision, rng)
    if layer.hybridize:
        block.hybridize()
    params = [p for p in block.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05, "multi_precision": True}) if params else None
    losses, grads = [], []
    for step in range(STEPS):
        mx.random.seed(step)  # Dropout masks: the same draw in every precision
        with autograd.record():
            out = block(x, *states)
            out = out[0] if isinstance(out, (list, tuple)) else out
            if layer.numpy_mode:
                out = out.as_nd_ndarray()
            out32 = mxfp16.to_float32(out) if hasattr(mxfp16, "to_float32") else out.astype("float32")
            loss = (out32 * out32).mean()  # positive: no cancellation to magnify rounding
        loss.backward()
        if step == 0:
            grads = [_np32(p.grad()) for p in params]
            if not layer.tokens:
                grads.append(_np32(x.grad.as_nd_ndarray() if layer.numpy_mode else x.grad))
        if trainer is not None:
            trainer.step(1)
        losses.append(float(loss.asscalar()))
    return losses, grads


def _inputs(layer, precision, rng):
    """The layer's input (its gradient attached, unless it is token ids) and begin states, drawn from ``rng``."""
    from mxnet import nd

    if layer.tokens:
        x = nd.array(rng.randint(0, 10, size=layer.shape))
    else:
        # Values bfloat16 holds exactly, so every precision starts from the same
        # input (rounding it would move max-pooling's argmax, for one).
        x = nd.array(_bfloat16_exact(rng.uniform(-1, 1, size=layer.shape)))
    if precision.name == "float16" and not layer.tokens:
        x = x.astype("float16")
    states = []
    if layer.states:
        states = [nd.array(rng.uniform(-0.5, 0.5, size=(1, layer.shape[0], 8))).astype(x.dtype) for _ in range(2)]
    if layer.numpy_mode:
        x = x.as_np_ndarray()
    if not layer.tokens:
        x.attach_grad()
    return x, states


def _bfloat16_exact(values):
    """``values`` as float32 with the low 16 bits of each cleared: exact in bfloat16 (and float16 here)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _np32(array):
    import mxnet as mx

    if array.dtype != np.float32 and array.dtype != np.float16:
        array = mx.nd.amp_cast(array, dtype="float32")
    return array.asnumpy().astype(np.float32)


if __name__ == "__main__":
    main(*sys.argv[1:4])
