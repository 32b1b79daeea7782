"""One builder for the parts of a training run, shared by the trainer, the benchmark and export.

A run needs the same few objects whatever drives it: the devices, the
resolved precision, the network (built, cast, hybridized), the loss scaler,
the ``gluon.Trainer`` and the loss. :func:`build_parts` makes them in one
order, so what ``mxfp16 bench`` times is what ``mxfp16 train`` runs:

1. the spec's devices and precision arrive resolved and checked
   (:func:`mxfp16.devices.resolve_devices`, :func:`mxfp16.resolve_precision`:
   a GPU MXNet cannot see, or float16 on a CPU, is refused there, once);
2. the environment float16 wants (:mod:`mxfp16.machine.environment`);
3. AMP, for ``amp-*`` precisions, before the network exists (it patches
   MXNet's operators for the whole process);
4. seeds, then the network: built, initialised, cast with BatchNorm kept in
   float32, hybridized with static memory (:func:`build_network`, which
   ``mxfp16 export`` calls alone);
5. the loss scaler, the trainer (``multi_precision`` for float16 weights)
   and the loss (softmax cross-entropy on float32 outputs).
"""
import random
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..casting import cast_net
from ..losses import classification_loss
from ..machine.environment import set_float16_environment
from ..models import build_model
from ..optim import make_trainer, optimizer_params
from ..precision import Precision, activate
from ..scaler import make_loss_scaler

__all__ = ["PartsSpec", "Parts", "build_parts", "build_network", "classification_loss", "amp_list_kwargs"]


@dataclass(frozen=True)
class PartsSpec:
    """What to build. Everything :func:`build_parts` needs except how the run is driven.

    Attributes
    ----------
    model : str
        A gluoncv model-zoo name or ``'elementwise-mlp'`` (see :func:`mxfp16.models.build_model`).
    classes : int
    image_size : int
        Side of the square input images (the network is materialised for it).
    precision : Precision
        Resolved by :func:`mxfp16.resolve_precision` (never a name: the
        precision is resolved once, against these devices). Needed by
        :func:`build_parts`; :func:`build_network` takes its dtype instead.
    ctx : list of mx.Context
        Checked by :func:`mxfp16.devices.resolve_devices`; needed by :func:`build_parts`.
    optimizer : str
        A registered MXNet optimizer name.
    lr, momentum, wd : float
        ``momentum`` only reaches optimizers that take one.
    loss_scale : str, float or None
        See :func:`mxfp16.scaler.parse_loss_scale`; ``None`` is the precision's default.
    label_smoothing : float
    pretrained : bool
        Start from local gluoncv ImageNet weights (nothing is downloaded).
    amp_lists : str
        ``'mxfp16'`` (the tuned lists of :mod:`mxfp16.amp.lists`) or ``'mxnet'`` (MXNet's own).
    seed : int or None
        Seeds MXNet, numpy and Python's ``random`` before the network is built.
    """

    model: str
    classes: int
    image_size: int
    precision: Precision = None
    ctx: list = None
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    wd: float = 1e-4
    loss_scale: object = None
    label_smoothing: float = 0.0
    pretrained: bool = False
    amp_lists: str = "mxfp16"
    seed: object = None


@dataclass
class Parts:
    """The built parts of a run; :func:`mxfp16.train_step` takes them one by one.

    Attributes
    ----------
    ctx : list of mx.Context
    precision : Precision
    net : gluon.HybridBlock
    scaler : LossScaler
    trainer : gluon.Trainer
    loss : gluon.loss.Loss
        Receives float32 outputs and float32 labels.
    environment : dict
        What :func:`mxfp16.machine.environment.set_float16_environment` reported.
    """

    ctx: list
    precision: Precision
    net: gluon.HybridBlock
    scaler: object
    trainer: gluon.Trainer
    loss: object
    environment: dict


def amp_list_kwargs(amp_lists, precision):
    """The operator lists for :func:`mxfp16.activate`: ``{}`` (mxfp16's, its default) or MXNet's own."""
    from ..amp.lists import LIST_SETS, operator_lists

    if amp_lists not in LIST_SETS:
        raise ValueError(f"AMP lists {amp_lists!r}: choose one of {', '.join(LIST_SETS)}")
    if not precision.amp or amp_lists == "mxfp16":
        return {}
    return operator_lists(precision.compute_dtype, amp_lists)


def build_network(spec, ctx, param_dtype):
    """Step 4 of :func:`build_parts` alone: seeds, then the network built, initialised, cast, hybridized.

    ``mxfp16 export`` rebuilds a finished run's network with it (in float32,
    without AMP, which :func:`build_parts` would switch on for the whole
    process) before loading the checkpoint into it.

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
    if spec.seed is not None:
        mx.random.seed(spec.seed)
        np.random.seed(spec.seed)
        random.seed(spec.seed)
    net = build_model(spec.model, spec.classes, spec.pretrained, ctx, in_shape=(3, spec.image_size, spec.image_size))
    cast_net(net, param_dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def build_parts(spec, lr_scheduler=None, kvstore="device", update_on_kvstore=None, compression_params=None):
    """Build a run's parts in the order the module docstring gives.

    Parameters
    ----------
    spec : PartsSpec
    lr_scheduler : mx.lr_scheduler.LRScheduler, optional
        E.g. :func:`mxfp16.optim.lr_schedule`; a constant rate without one.
    kvstore : str or mx.kv.KVStore
        Passed to the trainer.
    update_on_kvstore : bool or None
        Gluon's default when ``None`` (forced off when the loss scaler is on).
    compression_params : dict, optional
        Gradient compression for the kvstore (see :func:`mxfp16.optim.check_compression`).

    Returns
    -------
    Parts

    Raises
    ------
    mxfp16.models.ModelError, mxfp16.optim.OptimizerError, ValueError
        A bad model, optimizer or loss scale, each before the next part is built.
    TypeError
        A precision or device list that was not resolved first.
    """
    precision, ctx = spec.precision, spec.ctx
    if not isinstance(precision, Precision):
        raise TypeError(f"PartsSpec.precision must be a resolved Precision, not {precision!r}: pass "
                        "mxfp16.resolve_precision(name, ctx)")
    if isinstance(ctx, str) or not ctx or not all(isinstance(c, mx.Context) for c in ctx):
        raise TypeError(f"PartsSpec.ctx must be a checked list of contexts, not {ctx!r}: pass "
                        "mxfp16.devices.resolve_devices(ctx)")
    scaler = make_loss_scaler(precision, spec.loss_scale)  # checks the setting before anything is built
    opt_params = optimizer_params(spec.optimizer, spec.lr, spec.wd, spec.momentum, lr_scheduler)
    loss = classification_loss(spec.classes, spec.label_smoothing)
    environment = set_float16_environment()
    activate(precision, **amp_list_kwargs(spec.amp_lists, precision))  # AMP patches MXNet: before the network
    net = build_network(spec, ctx, precision.param_dtype)
    trainer = make_trainer(net.collect_params(), spec.optimizer, opt_params, precision, scaler, kvstore=kvstore,
                           update_on_kvstore=update_on_kvstore, compression_params=compression_params)
    return Parts(ctx=ctx, precision=precision, net=net, scaler=scaler, trainer=trainer, loss=loss,
                 environment=environment)
