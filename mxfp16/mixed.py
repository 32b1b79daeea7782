"""One setting object for a training script: the whole set-up in two statements.

:class:`MixedPrecision` resolves the precision for the devices and switches
AMP on at once, so the set-up cannot be left half done (AMP after the
network, or not at all); :meth:`MixedPrecision.prepare` casts a network and
builds its trainer beside the run's loss scaler. The loop body is then two
calls::

    mp = mxfp16.MixedPrecision("auto")                       # before the network
    net = build_my_net(); net.initialize(ctx=mp.ctx)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})
    for x, y in loader:
        data, label = mp.cast_batch(x, y)
        result = mp.train_step(net, loss_fn, trainer, data, label)

Each method passes the object's precision, devices and scaler to the
library function of the same name (:func:`mxfp16.cast_net`,
:func:`mxfp16.make_trainer`, :func:`mxfp16.cast_batch`,
:func:`mxfp16.train_step`), which remain the pieces for a set-up this
object does not cover.
"""
from .casting import cast_batch, cast_net
from .devices import resolve_devices
from .optim import make_trainer
from .precision import Precision, activate, resolve_precision
from .scaler import make_loss_scaler
from .step import train_step

__all__ = ["MixedPrecision"]


class MixedPrecision:
    """The run's precision, devices and loss scaler, with AMP active when the precision uses it.

    Create it first, before the network exists: AMP patches MXNet's
    operators for the whole process, and a graph built before it stays
    float32.

    Parameters
    ----------
    precision : str or Precision, default 'auto'
        A name (:data:`mxfp16.PRECISIONS`), resolved against ``ctx``, or an
        already resolved :class:`~mxfp16.Precision`.
    ctx : str, mx.Context or list, default 'auto'
        The devices: ``'auto'`` is every GPU MXNet sees, else the CPU.
    loss_scale : str, float or None
        ``None`` is the precision's default (dynamic for float16), else
        ``'dynamic'``, ``'none'`` or a static scale (see
        :func:`mxfp16.make_loss_scaler`).
    allow_cpu_float16 : bool
        As for :func:`mxfp16.resolve_precision`.
    **scaler_options
        Passed to :class:`~mxfp16.LossScaler` (``growth_interval`` ...).

    Attributes
    ----------
    precision : Precision
    ctx : list of mx.Context
    scaler : LossScaler
        Shared by every trainer :meth:`prepare` builds; its ``state_dict()``
        belongs in the checkpoint.

    Raises
    ------
    mxfp16.PrecisionError, mxfp16.devices.DeviceError
        A precision or devices that cannot run here, naming the fix.
    """

    def __init__(self, precision="auto", ctx="auto", loss_scale=None, allow_cpu_float16=False, **scaler_options):
        self.ctx = resolve_devices(ctx)
        self.precision = precision if isinstance(precision, Precision) else resolve_precision(
            precision, self.ctx, allow_cpu_float16=allow_cpu_float16)
        activate(self.precision)
        self.scaler = make_loss_scaler(self.precision, loss_scale, **scaler_options)

    def prepare(self, net, optimizer="sgd", optimizer_params=None, **trainer_options):
        """Cast ``net`` for the precision (BatchNorm stays float32) and return its trainer.

        Parameters
        ----------
        net : gluon.Block
            Built after this object was created.
        optimizer : str or mx.optimizer.Optimizer
        optimizer_params : dict, optional
        **trainer_options
            ``kvstore``, ``update_on_kvstore``, ``compression_params`` (see
            :func:`mxfp16.make_trainer`).

        Returns
        -------
        gluon.Trainer
            ``multi_precision`` for float16 parameters, ``update_on_kvstore``
            off when the scaler is on.
        """
        cast_net(net, self.precision)
        return make_trainer(net.collect_params(), optimizer, optimizer_params, self.precision, self.scaler,
                            **trainer_options)

    def cast_batch(self, data, label=None):
        """:func:`mxfp16.cast_batch` for this precision and these devices."""
        return cast_batch(data, label, self.precision.data_dtype, self.ctx)

    def train_step(self, net, loss_fn, trainer, data, label=None, **options):
        """:func:`mxfp16.train_step` with this object's scaler (``options``: ``clip_grad_norm`` ...)."""
        return train_step(net, loss_fn, trainer, data, label, self.scaler, **options)

    def __repr__(self):
        return f"MixedPrecision({self.precision}, ctx={self.ctx}, scaler={self.scaler!r})"
