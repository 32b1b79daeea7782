"""The benchmark matrix: every precision at every batch size, each in its own process."""
import uuid
from dataclasses import replace

from . import peer
from .runner import BenchSpec, not_run, run_in_subprocess


def plan(base, precisions, batch_sizes, amp_lists=("mxfp16",), auto=None, onnxruntime=False, auto_in_row=False):
    """The specs of one invocation, float32 first in each batch size so the baseline is measured early.

    Parameters
    ----------
    base : BenchSpec
        Everything except precision, batch size and AMP lists.
    precisions, batch_sizes
        Precision names as the user gave them (``auto`` included), and the batch sizes.
    amp_lists : sequence of str
        Each AMP precision runs once per list set (``'mxfp16'``, ``'mxnet'``); the others run once.
    auto : dict, optional
        ``{batch size: (precision name, list set or None)}`` where ``auto`` was decided by timing the model (the list
        set its route runs under, where that is not ``amp_lists[0]``); else the rule of
        :func:`mxfp16.resolve_precision` decides.
    onnxruntime : bool
        Inference: after mxfp16's rows of each batch size, onnxruntime's of :data:`ONNXRUNTIME_DTYPES`.
    auto_in_row : bool
        ``auto`` is a row of its own, decided in its process at its first step (a family's).

    Returns
    -------
    list of BenchSpec
        Otherwise ``auto`` and the name it resolves to are one run: float32 is never compared with itself.
    """
    specs = []
    for batch_size in batch_sizes:
        planned = set()
        for (key, only), (name, amp) in _resolve(base, precisions, batch_size, auto or {}, auto_in_row):
            # A measured auto goes to the child by the name it resolved to: the child would apply the rule.
            concrete = dict(precision=key, requested=name) if name == "auto" and auto else dict(precision=name)
            for lists in ((only,) if only else amp_lists if amp else amp_lists[:1]):
                if (key, lists) not in planned:  # an auto route's lists may be one of amp_lists already
                    planned.add((key, lists))
                    specs.append(replace(base, batch_size=int(batch_size), amp_lists=lists, **concrete))
        if onnxruntime:
            specs += [replace(base, precision=dtype, batch_size=int(batch_size), runtime="onnxruntime")
                      for dtype in ONNXRUNTIME_DTYPES]
    return specs


def _resolve(base, precisions, batch_size, auto, auto_in_row):
    """``[((precision, list set or None), (name asked, uses AMP)), ...]`` for one batch size, float32 first: each
    precision (and a list set auto's route runs under) once, the first name asked for it kept."""
    from ..precision import PrecisionError, resolve_precision

    resolved = {}
    for name in precisions:
        if name == "auto" and auto_in_row:
            resolved.setdefault((name, None), (name, False))
            continue
        chosen, only = auto.get(batch_size, (name, None)) if name == "auto" else (name, None)
        try:
            precision = resolve_precision(chosen, base.ctx)
            key, amp = precision.name, precision.amp
        except PrecisionError:
            key, amp = name, False  # the child reports why it cannot run
        resolved.setdefault((key, only if amp else None), (name, amp))
    return sorted(resolved.items(), key=lambda item: item[0][0] != "float32")


#: The ONNX files an inference benchmark times in onnxruntime.
ONNXRUNTIME_DTYPES = ("float32", "float16")
#: Why float16 ONNX is not timed on a CPU.
ONNXRUNTIME_CPU_FLOAT16 = (
    "onnxruntime float16 runs on GPU execution providers (CUDA, TensorRT). Its CPU provider has float16 kernels for "
    "few operators and puts casts around the others, so a float16 model there is usually slower than float32, and "
    "it runs no bfloat16 at all: a CPU serves model.onnx (float32)")


def _onnxruntime_cannot_run(spec):
    """Why an onnxruntime spec cannot run here (what ``export --format onnx`` refuses, float16 on a CPU), or None."""
    from ..devices import DeviceError, parse_devices
    from ..inference.bundle import ExportError
    from ..inference.formats import onnx as onnx_format

    try:
        onnx_format.check_exporter()
        if spec.precision != "float16":
            return None
        devices = parse_devices(spec.ctx)
        if all(kind == "cpu" for kind, _ in devices):
            return ONNXRUNTIME_CPU_FLOAT16
        onnx_format.execution_providers(f"gpu:{devices[0][1]}")
    except (ExportError, DeviceError) as err:
        return str(err)
    return None


def run_suite(specs, timeout=None, on_result=None, rounds=1, census=False):
    """Run every spec in its own process; skips and crashes are recorded, never raised.

    Parameters
    ----------
    specs : list of BenchSpec or PeerSpec
    timeout : float, optional
        Seconds one measurement may take before it is stopped and reported failed.
    on_result : callable, optional
        Called with each record as it arrives (progress output).
    rounds : int
        Run the whole list this many times, in turn, so a machine whose speed drifts meets every spec at every stage
        of the drift. A spec that failed or timed out is not run again (it would fail again, at the cost of up to
        ``timeout`` each time: PyTorch's emulated bfloat16); later rounds record it as skipped.
    census : bool
        Take the kernel census (:func:`mxfp16.bench.census_run.take_census`) of each mxfp16 row of the first round
        where oneDNN runs it, as the row's ``census``: the kernels do not change from round to round.

    Returns
    -------
    list of dict
        One record per spec and round, each stamped with the same
        ``invocation`` id and its ``round`` (from 1).
    """
    if int(rounds) < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds!r}")
    invocation = uuid.uuid4().hex[:12]
    records, failed = [], {}  # failed: spec index -> why it is not run again
    for round_ in range(1, int(rounds) + 1):
        for index, spec in enumerate(specs):
            record = _run_once(spec, timeout, failed.get(index))
            if census and round_ == 1 and record.get("status") == "ok" and not isinstance(spec, peer.PeerSpec):
                from .census_run import census_applies, take_census

                if census_applies(spec):  # where oneDNN runs the step; an auto row's as it settled
                    settled = replace(spec, precision=record["precision"], requested="auto") \
                        if spec.precision == "auto" else spec
                    record["census"] = take_census(settled, timeout=timeout)
            if record.get("status") == "failed" and index not in failed:
                last = (record.get("reason") or "").strip().splitlines()
                failed[index] = f"failed in round {round_} ({last[-1] if last else 'no reason given'}); not run again"
            record.update(invocation=invocation, round=round_)
            records.append(record)
            if on_result is not None:
                on_result(record)
    return records


def _run_once(spec, timeout, not_again=None):
    """``spec``'s record: measured in its own process, or skipped (``not_again``, or a precision that cannot run)."""
    is_peer = isinstance(spec, peer.PeerSpec)
    if reason := not_again or (None if is_peer else _cannot_run(spec)):
        return peer.not_run(spec, "skipped", reason) if is_peer else not_run(spec, "skipped", reason)
    return peer.run_in_subprocess(spec, timeout=timeout) if is_peer else run_in_subprocess(spec, timeout=timeout)


def _cannot_run(spec):
    """Why ``spec``'s precision cannot run on its devices, or ``None`` (no process needed to find out)."""
    from ..precision import PrecisionError, resolve_precision
    if spec.runtime == "onnxruntime":
        return _onnxruntime_cannot_run(spec)
    try:
        resolve_precision(spec.precision, spec.ctx)
    except PrecisionError as err:
        return str(err)
    return None


__all__ = ["BenchSpec", "plan", "run_suite"]
