"""Gradients of a network on real batches, summarised per parameter and per layer.

The gradients are computed in float32: a float32 backward pass answers what *would* happen to them in float16 at
every loss scale S at once (:mod:`mxfp16.diagnostics.stats`), so the diagnostics run on a CPU with real convolutional
networks. The gradient is the one :func:`mxfp16.train_step` produces before the optimizer divides by ``batch_size *
S``: that of the *sum* of the per-sample losses, so larger batches give proportionally larger parameter gradients.
Activation gradients are read with a probe (``y + p``, then ``p.grad``), not an ``autograd.Function`` identity, whose
``backward`` MXNet 1.9.1 does not wait for: docs/diagnostics.md ("Definitions and limits") says why, as measured.
"""
import contextlib

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..casting import to_float32
from ..devices import as_context_list
from .layers import tap_outputs
from .stats import RangeCollector

__all__ = ["gradient_ranges"]


@contextlib.contextmanager
def _activation_probes(net, enabled):
    probes = []
    if not enabled:
        yield probes
        return

    def probe(block, output):
        if not autograd.is_recording():
            return output
        zero = mx.nd.zeros(output.shape, ctx=output.context, dtype=output.dtype)
        if isinstance(output, mx.np.ndarray):  # a numpy-mode network: add like to like
            zero = zero.as_np_ndarray()
        zero.attach_grad()
        probes.append((block.name, zero))
        return output + zero

    with tap_outputs(net, probe):
        yield probes


def gradient_ranges(net, loss_fn, batches, ctx=None, activations=True, collector=None):
    """Float32 gradients of ``net`` on each batch, summarised on the device (one host sync per batch).

    Parameters
    ----------
    net : gluon.Block
        Initialised, float32, not hybridized when ``activations`` is on; not changed.
    loss_fn : gluon.loss.Loss
        Returns per-sample losses, e.g. ``SoftmaxCrossEntropyLoss()``.
    batches : iterable of (NDArray, NDArray)
    ctx : mx.Context or list of mx.Context, optional
        Where to compute (default: the current context); of a list, the first.
    activations : bool
        Also summarise the gradient arriving at every leaf layer's output.
    collector : RangeCollector, optional
        Accumulate into this one (default: a new one).

    Returns
    -------
    RangeCollector
        ``.stats``: one :class:`~mxfp16.diagnostics.stats.RangeStats` per parameter and per layer.

    Raises
    ------
    ValueError
        A parameter is not float32.
    """
    # One device is enough to measure ranges; accept the list form the rest of mxfp16 uses.
    ctx = as_context_list(ctx)[0]
    collector = collector or RangeCollector()
    params = [(name, p) for name, p in net.collect_params().items() if p.grad_req != "null"]
    narrow = [name for name, p in params if np.dtype(p.dtype) != np.float32]
    if narrow:
        raise ValueError(f"{len(narrow)} parameters are not float32 (e.g. {narrow[0]}); the diagnosis computes "
                         "float32 gradients and derives what float16 would do to them, so build the network in "
                         "float32 (no cast_net, no AMP)")
    for data, label in batches:
        data, label = data.as_in_context(ctx), label.as_in_context(ctx)
        with _activation_probes(net, activations) as probes:
            with autograd.record():
                loss = loss_fn(to_float32(net(data)), label)
            loss.backward()
        tensors = [(name, "parameter", p.grad(ctx)) for name, p in params]
        tensors += [(name, "activation", probe.grad) for name, probe in probes]
        collector.add_batch(tensors)
    return collector
