"""Gradient-range diagnostics: see float16 underflow before it costs accuracy.

For a few batches, the float32 gradients of every parameter and layer output are summarised on the device (underflow,
subnormal and overflow in float16 at a loss scale S, a log2|g| histogram), giving a recommended static loss scale; a
forward check names the first layer whose float16 output holds inf or NaN. See ``docs/diagnostics.md``::

    from mxfp16.diagnostics import diagnose, format_summary
    diagnosis = diagnose(net, gluon.loss.SoftmaxCrossEntropyLoss(), batches, loss_scale=1024)
    print(format_summary(diagnosis))

The same histograms can be watched during training in TensorBoard
(:class:`TensorBoardLogger`). The names load on first use: importing this package does not load MXNet.
"""
from .._lazy import exports

# Imported here, not on first use: the function is named as its module, and any import of the module
# would otherwise leave the package's attribute pointing at the module rather than the function.
from .forward_check import ForwardCheck, float16_forward_runs_here, forward_check

_EXPORTS = {
    "diagnose": "diagnosis", "Diagnosis": "diagnosis", "gradient_ranges": "collect",
    "RangeCollector": "stats", "RangeStats": "stats", "log2_of_scale": "stats", "total": "stats",
    "recommend_loss_scale": "recommend", "Recommendation": "recommend", "DEFAULT_MARGIN": "recommend",
    "format_summary": "report", "format_table": "report", "plot_histogram": "report",
    "diagnosis_document": "report",
    "TensorBoardLogger": "tensorboard", "TensorBoardUnavailableError": "tensorboard",
    "tensorboard_available": "tensorboard",
}

__all__ = ["forward_check", "ForwardCheck", "float16_forward_runs_here", *_EXPORTS]

__getattr__, __dir__ = exports(__name__, _EXPORTS)
