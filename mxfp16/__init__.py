"""mxfp16: mixed-precision (float16 / bfloat16) training with MXNet Gluon.

The five calls a training loop needs::

    precision = mxfp16.resolve_precision("auto", ctx)      # one validated setting
    mxfp16.activate(precision)                             # AMP, when the precision uses it
    net = mxfp16.cast_net(net, precision.param_dtype)      # BatchNorm stays float32
    scaler = mxfp16.make_loss_scaler(None, precision)      # dynamic for float16, off otherwise
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", {...}, precision, scaler)
    ...
    data, label = mxfp16.cast_batch(x, y, precision.data_dtype, ctx)
    result = mxfp16.train_step(net, loss_fn, trainer, data, label, scaler)

``import mxfp16`` does not import MXNet. It prepares the stack (supplies the
numpy names and ``distutils`` that numpy 1.24+, numpy 2 and Python 3.12
removed and MXNet 1.9.1 still uses, :mod:`mxfp16.machine.stack`; checks that an
MXNet wheel is installed), preloads the CUDA wheels' libraries, checks the
environment variables MXNet reads and puts the thread count there
(:mod:`mxfp16.machine.environment`; a value MXNet cannot use is reported when
MXNet is about to load, never here) and, on
an Intel CPU with AMX, asks Linux for the tile state so MXNet's oneDNN can use
it (:mod:`mxfp16.machine.amx`), all of which
MXNet reads only when it loads: import mxfp16 before mxnet. The names below import their module
(and MXNet) on first use.
"""
from . import _lazy
from .machine import amx as _amx
from .machine import environment as _environment
from .machine.stack import prepare_stack as _prepare_stack
from ._version import __version__

_amx.enable_amx()  # first: the tile request fails once a small signal stack exists; MXNet reads the ISA at load
_prepare_stack()
_environment.prepare_environment()  # MXNet's variables checked, thread counts set; never raises

#: Public name -> the module that defines it.
_EXPORTS = {
    "PRECISIONS": "precision", "Precision": "precision", "PrecisionError": "precision",
    "resolve_precision": "precision", "activate": "precision",
    "cast_net": "casting", "cast_batch": "casting", "dtype_report": "casting", "to_float32": "casting",
    "make_trainer": "optim", "optimizer_support": "optim",
    "LossScaler": "scaler", "LossScaleDivergedError": "scaler", "make_loss_scaler": "scaler",
    "StepResult": "step", "train_step": "step",
    "import_gluoncv": "_gluoncv", "stack_report": "_compat",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
