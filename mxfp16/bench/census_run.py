"""The kernel census of one bench row: its step run again under ``DNNL_VERBOSE=1``, in a process of its own.

oneDNN reads ``DNNL_VERBOSE`` once and then prints a line for every primitive it runs (a system call each): in the
timed process that would cost microseconds per primitive, more for bfloat16 (more reorders), and bias the speedup. So
``mxfp16 bench`` takes the census after the timing, in a fresh process (:func:`take_census`), where oneDNN runs the
step (:func:`census_applies`); docs/benchmarks.md, "The kernel census in every run", tells the rest.
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
    """Whether oneDNN runs ``spec``'s step here, so a census can be taken: MXNet built with it (``MKLDNN``, as every
    pip wheel for CPUs is), not switched off (``MXNET_MKLDNN_ENABLED=0``), on CPU devices, in MXNet, not onnxruntime."""
    if spec.runtime != "mxnet" or os.environ.get("MXNET_MKLDNN_ENABLED", "").strip() == "0":
        return False
    import mxnet as mx

    from ..devices import DeviceError, resolve_devices

    try:
        contexts = resolve_devices(spec.ctx)
    except DeviceError:
        return False
    return all(c.device_type == "cpu" for c in contexts) and mx.runtime.Features().is_enabled("MKLDNN")


def take_census(spec, timeout=None):
    """The census of ``spec``'s step, taken in a fresh process with ``DNNL_VERBOSE=1``.

    Returns
    -------
    dict
        ``status`` ``'ok'`` with :func:`mxfp16.bench.census.summarise`'s
        fields, ``warmup``, and ``isa`` (what oneDNN says of the CPU); or
        ``status`` ``'failed'`` and ``reason``. It never raises for a failing child.
    """
    record, problem = call_in_child(census_of, spec, timeout=timeout, env={"DNNL_VERBOSE": "1", "MKLDNN_VERBOSE": None})
    return record if record is not None else {"status": "failed", "reason": problem}


def _log_to(path):
    """Send this process's stdout (where oneDNN prints, through C's stdio) into ``path`` (its reader skips the rest)."""
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
        for i in range(warmup + CENSUS_STEPS):
            if i == warmup:
                start = _flushed_size()
            step()
            mx.nd.waitall()  # MXNet is asynchronous: a step not waited for would spill into the window
        _flushed_size()
        with open(log_path, "rb") as log:  # bytes: ``start`` counts bytes
            head = log.read(start).decode("utf-8", "replace").splitlines()
            window = log.read().decode("utf-8", "replace").splitlines()
    finally:
        os.unlink(log_path)
    isa = isa_line(head)  # oneDNN prints it once, before the window
    return {"status": "ok", "warmup": warmup, "isa": isa, **summarise(window, steps=CENSUS_STEPS, isa=isa)}
