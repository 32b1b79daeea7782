"""The parts of a training run, built through :class:`mxfp16.MixedPrecision`: the README's path.

:func:`build_parts` makes the network, loss scaler, ``gluon.Trainer`` and loss with the set-up a user writes from
the README, so what ``bench`` times is what ``train`` runs: (1) the caller's :class:`~mxfp16.MixedPrecision`
(devices and precision resolved once, AMP on or pending for ``auto``); (2) seeds, then the network, materialised
and hybridized; (3) :meth:`MixedPrecision.prepare`: ``auto`` and the ``measured`` lists' layers timed where
pending, the network cast, the trainer beside the loss scaler; (4) the loss, on float32 outputs.
:func:`build_network` is step 2 alone, cast to a dtype, for inference: no trainer, no loss scaler, no AMP.
"""
import random
from dataclasses import dataclass
from operator import attrgetter

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..casting import cast_net
from ..losses import classification_loss
from ..mixed import MixedPrecision
from ..models import build_model
from ..optim import optimizer_params

__all__ = ["PartsSpec", "Parts", "build_parts", "build_network", "auto_verdict"]


@dataclass(frozen=True)
class PartsSpec:
    """What to build, besides the precision and devices (a :class:`~mxfp16.MixedPrecision` holds those).

    Attributes
    ----------
    model : str
        A name :func:`mxfp16.models.build_model` takes (gluoncv zoo, sequence model, ``'elementwise-mlp'``).
    image_size : int
        Side of the square input images (the network is materialised for it).
    batch_size : int
        Samples per step over all devices: the shape ``auto`` is timed at.
    lr, momentum, wd : float
        ``momentum`` only reaches optimizers that take one.
    pretrained : bool
        Start from local gluoncv ImageNet weights (nothing is downloaded).
    seed : int or None
        Seeds MXNet, numpy and Python's ``random`` before the network is built.
    """

    model: str
    classes: int
    image_size: int
    batch_size: int = 16
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    wd: float = 1e-4
    label_smoothing: float = 0.0
    pretrained: bool = False
    seed: object = None


@dataclass
class Parts:
    """The built parts of a run; :func:`mxfp16.train_step` takes them one by one.

    Attributes
    ----------
    mixed : MixedPrecision
        The set-up they were built through (its ``state_dict()`` travels in the checkpoint).
    net : gluon.HybridBlock
    trainer : gluon.Trainer
    loss : gluon.loss.Loss
        Receives float32 outputs and float32 labels.
    """

    mixed: MixedPrecision
    net: gluon.HybridBlock
    trainer: gluon.Trainer
    loss: object

    ctx = property(attrgetter("mixed.ctx"))
    precision = property(attrgetter("mixed.precision"))
    scaler = property(attrgetter("mixed.scaler"))
    #: What :func:`mxfp16.machine.environment.set_float16_environment` reported.
    environment = property(attrgetter("mixed.environment"))


def _seeded_model(spec, ctx):
    if spec.seed is not None:
        mx.random.seed(spec.seed)
        np.random.seed(spec.seed)
        random.seed(spec.seed)
    return build_model(spec.model, spec.classes, spec.pretrained, ctx, in_shape=(3, spec.image_size, spec.image_size))


def build_network(spec, ctx, param_dtype):
    """Step 2 of :func:`build_parts` alone, cast to ``param_dtype``: an inference network, without AMP.

    Parameters
    ----------
    spec : PartsSpec
        Only ``model``, ``classes``, ``image_size``, ``pretrained`` and ``seed`` are read.
    ctx : list of mx.Context
    param_dtype : str
        ``'float32'`` or ``'float16'`` (BatchNorm keeps float32, see :func:`mxfp16.cast_net`).

    Returns
    -------
    gluon.HybridBlock
        Hybridized with static memory and shapes, every parameter materialised.
    """
    net = _seeded_model(spec, ctx)
    cast_net(net, param_dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def _example_batch(spec):
    """A synthetic batch of the run's shape: what ``auto`` times (the speed of a step does not depend on values)."""
    rng = np.random.RandomState(0)
    data = rng.standard_normal((spec.batch_size, 3, spec.image_size, spec.image_size)).astype(np.float32)
    label = rng.randint(0, spec.classes, spec.batch_size).astype(np.float32)
    return mx.nd.array(data), mx.nd.array(label)


def build_parts(spec, mixed, lr_scheduler=None, kvstore="device", update_on_kvstore=None, compression_params=None):
    """Build a run's parts through ``mixed``, in the order the module docstring gives.

    Parameters
    ----------
    spec : PartsSpec
    mixed : MixedPrecision
        Created by the caller, once: it resolved the precision and devices.
    lr_scheduler : mx.lr_scheduler.LRScheduler, optional
        E.g. :func:`mxfp16.optim.lr_schedule`; a constant rate without one.
    kvstore : str or mx.kv.KVStore
    update_on_kvstore : bool or None
        Gluon's default when ``None`` (forced off when the loss scaler is on).
    compression_params : dict, optional
        See :func:`mxfp16.optim.check_compression`.

    Returns
    -------
    Parts

    Raises
    ------
    mxfp16.models.ModelError, mxfp16.optim.OptimizerError, ValueError, TypeError
        A bad model, optimizer, loss scale or ``mixed``, each before the next part is built.
    """
    if not isinstance(mixed, MixedPrecision):
        raise TypeError(f"build_parts() takes the run's MixedPrecision, not {mixed!r}: create it once with "
                        "mxfp16.MixedPrecision(precision, ctx, loss_scale=...) and pass it here")
    opt_params = optimizer_params(spec.optimizer, spec.lr, spec.wd, spec.momentum, lr_scheduler)
    loss = classification_loss(spec.classes, spec.label_smoothing)
    net = _seeded_model(spec, mixed.ctx)
    net.hybridize(static_alloc=True, static_shape=True)  # before auto's probe: it times the graph training runs
    example = _example_batch(spec) if mixed.pending or mixed.layers_pending else None
    trainer = mixed.prepare(net, spec.optimizer, opt_params, example=example, loss_fn=loss, kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore, compression_params=compression_params)
    return Parts(mixed=mixed, net=net, trainer=trainer, loss=loss)


def auto_verdict(spec, ctx, amp_lists="mxfp16", log=print):
    """What ``auto`` trains a run of ``spec`` in on ``ctx``, decided as :func:`build_parts` decides it.

    The same network and batch go to the same probe, so the cached verdict is the run's. This process stays free
    of AMP: the network is timed in forked copies of it.

    Parameters
    ----------
    spec : PartsSpec
    ctx : list of mx.Context
    amp_lists : str
    log : callable

    Returns
    -------
    mxfp16.measure.auto.AutoVerdict
    """
    from ..amp.lists import keep_float32_measured
    from ..casting import cast_batch
    from ..measure.auto import decide_auto, timing_applies
    from ..measure.per_layer import choose_layers, layers_apply
    from ..measure.probe import NetworkProbe

    if not timing_applies(ctx):
        return decide_auto(ctx, log=log)
    net = _seeded_model(spec, ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    data, label = cast_batch(*_example_batch(spec), "float32", ctx)
    if layers_apply(amp_lists):  # as MixedPrecision does: the layers first, so the probe times what would train
        keep_float32_measured(choose_layers(net, data, ctx, log=log).float32_layers())
    loss = classification_loss(spec.classes, spec.label_smoothing)
    return decide_auto(ctx, NetworkProbe(net, data, label, ctx, loss, None, amp_lists), log=log)
