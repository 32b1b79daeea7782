"""The kernel census of one bench row: its step run again under ``DNNL_VERBOSE=1``, in a process of its own.

oneDNN reads ``DNNL_VERBOSE`` once, when it first runs, and from then on
times every primitive it executes and prints a line for it (a system call
each). In the timed process that would cost a few microseconds per
primitive, more where primitives are small and many, and more for bfloat16,
which runs more reorders than float32: the speedup would be biased. So
``mxfp16 bench`` times each row without it and, after the timing, takes the
census in a separate short pass (:func:`take_census`): a fresh process
builds the row's step again (:func:`mxfp16.bench.runner.build_step`), runs
the row's warm-up steps untimed (at least :data:`CENSUS_WARMUP`: primitive
creation, first touches of memory), then :data:`CENSUS_STEPS` steps whose log lines
:func:`mxfp16.bench.census.summarise` reads. That child sends oneDNN's lines
(C's stdout) into a file of its own, so nothing else it prints mixes in.

The census is taken where oneDNN runs the step: MXNet built with it (the
``MKLDNN`` feature, as every pip wheel for CPUs is), not switched off
(``MXNET_MKLDNN_ENABLED=0``), on CPU devices, in MXNet (not onnxruntime).
"""
import ctypes
import os
import sys
import tempfile

from ..plumbing.child import call_in_child
from .census import isa_line, summarise

__all__ = ["CENSUS_WARMUP", "CENSUS_STEPS", "census_applies", "take_census"]

#: Untimed steps before the census window at least (the first builds the graph and creates oneDNN's
#: primitives); a row's own ``warmup`` where it is more, so the census reads steps in the state the timing did.
CENSUS_WARMUP = 1
#: Steps the census reads: the shares are what one step does, two of them guard against a one-off.
CENSUS_STEPS = 2


def census_applies(spec):
    """Whether oneDNN runs ``spec``'s step here, so a census can be taken.

    Parameters
    ----------
    spec : mxfp16.bench.runner.BenchSpec

    Returns
    -------
    bool
    """
    if spec.runtime != "mxnet" or os.environ.get("MXNET_MKLDNN_ENABLED", "").strip() == "0":
        return False
    import mxnet as mx

    from ..devices import DeviceError, resolve_devices

    try:
        contexts = resolve_devices(spec.ctx)
    except DeviceError:
        return False
    return all(c.device_type == "cpu" for c in contexts) and mx.runtime.Features().is_enabled("MKLDNN")


def take_census(spec, timeout=None, python=None):
    """The census of ``spec``'s step, taken in a fresh process with ``DNNL_VERBOSE=1``.

    Returns
    -------
    dict
        ``status`` ``'ok'`` with :func:`mxfp16.bench.census.summarise`'s
        fields, ``warmup``, and ``isa`` (what oneDNN says of the CPU); or
        ``status`` ``'failed'`` and ``reason``. It never raises for a failing child.
    """
    env = {"DNNL_VERBOSE": "1", "MKLDNN_VERBOSE": None}
    record, problem = call_in_child(census_of, spec, timeout=timeout, env=env, python=python)
    return record if record is not None else {"status": "failed", "reason": problem}


def _log_to(path):
    """Send this process's stdout (where oneDNN prints, through C's stdio) into ``path``.

    Whatever else is printed there lands in the file too; the reader skips every line that is not oneDNN's.
    """
    sys.stdout.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.close(fd)


def _flushed_size():
    """The log's length once C's buffered output is written."""
    ctypes.CDLL(None).fflush(None)
    return os.fstat(1).st_size


def census_of(spec):
    """In the census child: build ``spec``'s step, run the warm-up and the census steps, read their log lines."""
    import mxnet as mx

    from .runner import build_step

    handle, log_path = tempfile.mkstemp(prefix="mxfp16-dnnl-", suffix=".log")
    os.close(handle)
    try:
        _log_to(log_path)
        step = build_step(spec)[0]
        warmup = max(CENSUS_WARMUP, spec.warmup)
        for _ in range(warmup):
            step()
            mx.nd.waitall()  # MXNet is asynchronous: a step not waited for would spill into the window
        start = _flushed_size()
        for _ in range(CENSUS_STEPS):
            step()
            mx.nd.waitall()
        _flushed_size()
        with open(log_path, "rb") as log:  # bytes: ``start`` counts bytes
            head = log.read(start).decode("utf-8", "replace").splitlines()
            window = log.read().decode("utf-8", "replace").splitlines()
    finally:
        os.unlink(log_path)
    return {"status": "ok", "warmup": warmup, "isa": isa_line(head),
            **summarise(window, steps=CENSUS_STEPS)}
