"""Gradient-range diagnostics: see float16 underflow before it costs accuracy.

For a few batches of real data, the float32 gradients of every parameter and
(where Gluon lets us reach them) of every layer's output are summarised on
the device: exact zeros, the share that would underflow, land in the
subnormal range or overflow in float16 at a loss scale S, and a histogram of
log2|g|. From that, a recommended static loss scale, and a forward check that
names the first layer whose float16 output holds inf or NaN. See
``docs/diagnostics.md``::

    from mxfp16.diagnostics import diagnose, format_summary
    diagnosis = diagnose(net, gluon.loss.SoftmaxCrossEntropyLoss(), batches, loss_scale=1024)
    print(format_summary(diagnosis))
"""
from .collect import gradient_ranges
from .diagnosis import Diagnosis, diagnose
from .forward_check import ForwardCheck, float16_forward_runs_here, forward_check
from .recommend import DEFAULT_MARGIN, Recommendation, recommend_loss_scale
from .report import diagnosis_document, format_summary, format_table, plot_histogram
from .stats import RangeCollector, RangeStats, log2_of_scale, total

__all__ = [
    "diagnose", "Diagnosis", "gradient_ranges", "RangeCollector", "RangeStats", "log2_of_scale", "total",
    "recommend_loss_scale", "Recommendation", "DEFAULT_MARGIN",
    "forward_check", "ForwardCheck", "float16_forward_runs_here",
    "format_summary", "format_table", "plot_histogram", "diagnosis_document",
]
