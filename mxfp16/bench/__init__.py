"""Benchmarking float32 against mixed precision, and a PyTorch peer beside them.

Each measurement runs in its own process (AMP is process-global) and times
:func:`mxfp16.train_step`, the trainer's own step, or (``mode='inference'``)
the network as ``mxfp16 export`` converts it. The names below load on first
use, so the PyTorch peer's process never loads MXNet.
"""
from .._lazy import exports

_EXPORTS = {
    "BenchSpec": "runner", "measure": "runner", "run_in_subprocess": "runner", "plan": "suite",
    "run_suite": "suite", "merge_rounds": "report", "add_speedups": "report", "bench_document": "report",
    "tensor_core_report": "tensor_cores",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS)
