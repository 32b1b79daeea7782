"""The probe: a network's training step timed in a forked copy of this process.

``auto`` (:mod:`mxfp16.measure.auto`) asks a :class:`NetworkProbe` for
milliseconds per step in float32 and in amp-bfloat16, timed through
:func:`mxfp16.measure.timing.time_steps` as the benchmark does.

A forked child would run MXNet's own (non-oneDNN) kernels on one thread:
MXNet's fork handler turns its OpenMP use off in a child (``src/initialize.cc``,
``atfork_child``), while oneDNN keeps its threads. That slowed the precision
that spends more in MXNet's own kernels: MobileNet v2's float32 step (its
``clip``) took 1.6x its in-process time, and the probe overstated bfloat16's
gain. The child puts the parent's switch back before it times anything
(:func:`mxfp16._internals.restore_mxnet_openmp`; docs/results/probe-fork-zen5/).
"""
import functools
import hashlib
import json

__all__ = ["NetworkProbe", "network_signature", "PROBE_WARMUP", "PROBE_REPEATS", "PROBE_TIMEOUT"]

#: Steps not timed (graph build, oneDNN primitives), and timed repeats per precision and round.
PROBE_WARMUP, PROBE_REPEATS = 2, 3
#: Seconds a probe child may take before it is stopped (and float32, the safe side, is kept).
PROBE_TIMEOUT = 600.0


def _probe_loss(outputs, *labels):
    """Stands in for a loss the caller did not give: the cost of a step is the network's, not its loss's."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return functools.reduce(lambda a, b: a + b, (out.reshape((out.shape[0], -1)).sum(axis=1) for out in outputs))


def network_signature(net):
    """A digest of a network's structure: each block's class and each parameter's shape and dtype, in order. Names
    are left out: Gluon numbers its prefixes per process (``dense0_``), and the same network must get the same verdict.
    """
    import numpy as np

    from .._internals import block_children

    def walk(block):
        yield type(block).__module__ + "." + type(block).__qualname__
        for child in block_children(block):
            yield from walk(child)

    params = [(list(p.shape or ()), np.dtype(p.dtype).name) for p in net.collect_params().values()]
    text = json.dumps({"blocks": list(walk(net)), "params": params})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _batch_signature(value):
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return [_batch_signature(v) for v in value]
    import numpy as np

    return [list(value.shape), np.dtype(value.dtype).name]


def _batch_text(value):
    if isinstance(value, (tuple, list)):
        return ", ".join(_batch_text(v) for v in value)
    shape, dtype = _batch_signature(value)
    return f"{'x'.join(map(str, shape))} {dtype}"


class NetworkProbe:
    """Times a network's training step in a precision, in a forked copy of this process.

    The child switches AMP on if the precision uses it (and applies a route, when one is asked for) and times
    :func:`mxfp16.train_step` on the example batch with the caller's trainer and loss. Nothing it does (AMP, the
    route, the updates to the parameters or the trainer's state) reaches this process.

    Parameters
    ----------
    net : gluon.Block
        Initialised (its parameters have shapes), not under AMP.
    data, label : list
        One batch, one entry per device, as :func:`mxfp16.cast_batch` returns
        it for float32 (``label`` may be ``None`` for a network that returns
        its own loss). float32 and amp-bfloat16 batches are both float32.
    ctx : list of mx.Context
    loss_fn : callable, optional
        As :func:`mxfp16.train_step` takes it; by default the sum of the outputs.
    trainer : gluon.Trainer, optional
        By default plain SGD at a learning rate of 0.
    amp_lists : str
        Which operator lists an AMP precision uses (``'mxfp16'`` or ``'mxnet'``).
    """

    def __init__(self, net, data, label, ctx, loss_fn=None, trainer=None, amp_lists="mxfp16"):
        self.net, self.data, self.label, self.ctx = net, data, label, list(ctx)
        self.loss_fn = loss_fn if loss_fn is not None or label is None else _probe_loss
        self.trainer, self.amp_lists = trainer, amp_lists

    @property
    def key(self):
        """What the verdict depends on besides the machine: the network, the batch, the operator lists."""
        return {"network": network_signature(self.net), "data": _batch_signature(self.data),
                "label": _batch_signature(self.label), "devices": len(self.ctx), "amp_lists": self.amp_lists}

    @property
    def routes(self):
        """The routes ``auto`` times amp-bfloat16 with for this network (:func:`mxfp16.measure.auto.network_routes`)."""
        from .auto import network_routes

        return network_routes(self.net, self.amp_lists)

    @property
    def where(self):
        """The network and its batch, for messages: ``ResNetV1 at batch 32x3x48x48 float32`` (one per device)."""
        return f"{type(self.net).__name__} at batch {_batch_text(self.data)}"

    def time(self, precision, iters, warmup=PROBE_WARMUP, repeats=PROBE_REPEATS, timeout=PROBE_TIMEOUT, route=None):
        """``{'status': 'ok', 'ms_per_step': ...}`` or ``{'status': 'failed', 'reason': ...}``; never raises.

        ``route``: a :data:`mxfp16.measure.auto.ROUTES` name, applied in the child after AMP.
        """
        import mxnet as mx

        from .._internals import mxnet_openmp_ceiling
        from ..plumbing.child import call_in_child

        mx.nd.waitall()  # MXNet's fork handler drains the engine too; the caller's errors surface here first
        ceiling = mxnet_openmp_ceiling()  # read here: the fork handler overwrites the child's copy
        ms, problem = call_in_child(functools.partial(self._time_forked, ceiling, precision, iters, warmup, repeats,
                                                      route), timeout=timeout, fork=True)
        if problem is not None:
            return {"status": "failed", "precision": precision, "reason": problem}
        return {"status": "ok", "precision": precision, "ms_per_step": ms}

    def _time_forked(self, ceiling, *args):
        from .._internals import restore_mxnet_openmp

        restore_mxnet_openmp(ceiling)
        return self._time_here(*args)

    def _time_here(self, name, iters, warmup, repeats, route=None):
        from .._internals import rebuild_graphs
        from ..amp.lists import reads_weight_shapes, shapes_pending
        from ..optim import make_trainer
        from ..scaler import make_loss_scaler
        from ..step import train_step
        from .auto import adopt, route_lists
        from .timing import time_steps

        precision = adopt(name, self.ctx, self.amp_lists, [self.net], route=route)  # as MixedPrecision adopts one
        scaler = make_loss_scaler(precision)
        trainer = self.trainer or make_trainer(self.net.collect_params(), "sgd", {"learning_rate": 0.0}, precision)

        def step():
            return train_step(self.net, self.loss_fn, trainer, self.data, self.label, scaler).loss

        if precision.amp and reads_weight_shapes(route_lists(route, self.amp_lists)) and shapes_pending(self.net):
            step()  # as MixedPrecision.train_step: the shapes are known once it is traced; the rules judge again
            rebuild_graphs(self.net)
        return time_steps(step, iters, repeats, warmup).ms_per_step

