"""Benchmarking float32 against mixed precision, and comparing training runs.

Each measurement runs in its own process (AMP is process-global) and times
:func:`mxfp16.train_step`, the trainer's own step.
"""
from .report import add_speedups, bench_document
from .runner import BenchSpec, measure, run_in_subprocess
from .suite import plan, run_suite
from .tensor_cores import tensor_core_report

__all__ = ["BenchSpec", "measure", "run_in_subprocess", "plan", "run_suite", "add_speedups", "bench_document",
           "tensor_core_report"]
