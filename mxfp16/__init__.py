"""mxfp16: mixed-precision (float16 / bfloat16) training with MXNet Gluon.

A training script's set-up is two statements around the network, and the
loop body two calls::

    mp = mxfp16.MixedPrecision("auto")                  # 1. precision for the devices, AMP on; before the network
    net = build_my_net(); net.initialize(ctx=mp.ctx)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})   # 2. net cast, trainer beside the loss scaler
    for x, y in loader:
        data, label = mp.cast_batch(x, y)                # float data cast, integers and labels kept
        result = mp.train_step(net, loss_fn, trainer, data, label)

``MixedPrecision`` is the one set-up path (the trainer, the benchmark and the
self-test build through it); ``auto`` is timed on the network it prepares
where that can change the answer (:mod:`mxfp16.measure.auto`). The pieces behind it,
the loss scaler's seams for a step of your own, the errors a script catches
and :class:`TensorBoardLogger` are here too (docs/api.md lists them; MXNet's
own ``Estimator`` trains in mixed precision with :mod:`mxfp16.estimator`).

``import mxfp16`` does not import MXNet. It prepares the stack (the numpy
names and ``distutils`` that MXNet 1.9.1 still uses, :mod:`mxfp16.machine.stack`),
preloads the CUDA wheels' libraries, checks the environment variables MXNet
reads and sets the thread count (:mod:`mxfp16.machine.environment`) and, on
an Intel CPU with AMX, asks Linux for the tile state (:mod:`mxfp16.machine.amx`),
all of which MXNet reads only when it loads: import mxfp16 before mxnet. The
names below import their module (and MXNet) on first use.
"""
from . import _lazy
from ._version import __version__
from .machine import amx as _amx
from .machine import environment as _environment
from .machine.stack import prepare_stack as _prepare_stack

_amx.enable_amx()  # first: the tile request fails once a small signal stack exists; MXNet reads the ISA at load
_prepare_stack()
_environment.prepare_environment()  # MXNet's variables checked, thread counts set; never raises

#: Public name -> the module that defines it.
_EXPORTS = {
    "PRECISIONS": "precision", "Precision": "precision", "PrecisionError": "precision", "AMPStateError": "precision",
    "DeviceError": "devices", "OptimizerError": "optim", "ModelError": "models.zoo",
    "resolve_precision": "precision", "activate": "precision",
    "cast_net": "casting", "cast_batch": "casting", "dtype_report": "casting", "to_float32": "casting",
    "make_trainer": "optim", "optimizer_support": "optim",
    "LossScaler": "scaler", "LossScaleDivergedError": "scaler", "make_loss_scaler": "scaler",
    "StepOrderError": "scaler", "UnusedParameterError": "scaler", "Gradients": "gradients",
    "StepResult": "step", "BatchLoss": "step", "train_step": "step", "eval_step": "step", "MixedPrecision": "mixed",
    "import_gluoncv": "models.gluoncv", "stack_report": "machine.stack",
    "TensorBoardLogger": "diagnostics.tensorboard",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
