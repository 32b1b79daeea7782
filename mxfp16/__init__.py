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
"""
from ._compat import check_stack as _check_stack

_check_stack()

from ._gluoncv import import_gluoncv  # noqa: E402
from ._version import __version__  # noqa: E402
from .casting import cast_batch, cast_net, dtype_report, to_float32  # noqa: E402
from .optim import make_trainer, optimizer_support  # noqa: E402
from .precision import PRECISIONS, Precision, PrecisionError, activate, resolve_precision  # noqa: E402
from .scaler import LossScaleDivergedError, LossScaler, make_loss_scaler  # noqa: E402
from .step import StepResult, train_step  # noqa: E402

__all__ = [
    "__version__",
    "PRECISIONS", "Precision", "PrecisionError", "resolve_precision", "activate",
    "cast_net", "cast_batch", "dtype_report", "to_float32",
    "make_trainer", "optimizer_support",
    "LossScaler", "LossScaleDivergedError", "make_loss_scaler",
    "StepResult", "train_step",
    "import_gluoncv",
]
