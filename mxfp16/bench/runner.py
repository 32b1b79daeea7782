"""One benchmark measurement: one precision, one batch size, one process.

AMP patches MXNet once per process and cannot be undone, so every measurement runs in a fresh Python process
(:func:`run_in_subprocess`), which returns one JSON record. :func:`measure` times what the user runs: the trainer's
own step (``train``), or the network as ``mxfp16 export`` converts it and ``mxfp16 predict`` loads it, every call
timed on its own for the latency (``inference``; with ``runtime='onnxruntime'`` the ONNX export in onnxruntime).
"""
import json
import os
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..machine.environment import mxnet_threads
from ..plumbing.child import call_in_child
from ..plumbing.fileio import parse_json
from .families import family, record_fields, throughput_fields

MODES = ("train", "inference")
#: What runs an inference measurement: MXNet (the export's own format) or onnxruntime (the ONNX export).
RUNTIMES = ("mxnet", "onnxruntime")


@dataclass(frozen=True)
class BenchSpec:
    """What one measurement runs.

    Attributes
    ----------
    model : str
        A gluoncv model-zoo name, or a family of :mod:`mxfp16.bench.families` (training only, synthetic data).
    image_size : int or None
        Side of the square input images; ``None`` for a family whose input is token ids.
    batch_size, iters, warmup, repeats, seed : int
        ``iters`` steps per timed repeat, after ``warmup`` untimed steps; median and spread over the ``repeats``.
    precision : str
        A name from :data:`mxfp16.PRECISIONS` (``auto`` is resolved in the child).
    mode : str
        ``'train'`` (forward, backward, update) or ``'inference'`` (the exported network's forward pass).
    data, pipeline, workers
        ``'synthetic'`` (random tensors), else as ``mxfp16 train --data/--pipeline/--workers``.
    ctx : str
        As ``--ctx``: ``'auto'``, ``'cpu'``, ``'gpu:0'`` ...
    classes : int
        Output classes with synthetic data.
    amp_lists : str
        ``'mxfp16'`` or ``'mxnet'``.
    requested : str, optional
        What the user asked for when ``precision`` was resolved before the run (``'auto'``, decided by timing);
        recorded as ``requested_precision``.
    runtime : str
        ``'mxnet'``, or ``'onnxruntime'`` (inference only; ``precision`` is then the ONNX file's dtype).
    options : dict, optional
        A family's sizes, resolved (:func:`mxfp16.bench.families.resolve_options`).
    """

    model: str = "resnet50_v2"
    image_size: int = 224
    batch_size: int = 16
    precision: str = "float32"
    mode: str = "train"
    iters: int = 10
    warmup: int = 3
    repeats: int = 3
    data: str = "synthetic"
    pipeline: str = "folder"
    workers: int = 0
    ctx: str = "auto"
    classes: int = 102
    amp_lists: str = "mxfp16"
    seed: int = 0
    requested: str = None
    runtime: str = "mxnet"
    options: dict = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.runtime not in RUNTIMES or (self.runtime != "mxnet" and self.mode != "inference"):
            raise ValueError(f"runtime {self.runtime!r}: {', '.join(RUNTIMES)}, and onnxruntime in inference mode only")
        if self.image_size is None and family(self.model) is None:
            raise ValueError(f"image_size is needed for {self.model!r}, which reads images")
        for name, low in (("image_size", 1), ("batch_size", 1), ("iters", 1), ("repeats", 1), ("classes", 1),
                          ("warmup", 0), ("workers", 0)):
            value = getattr(self, name)
            if value is None and name in ("image_size", "classes"):  # a family without images or classes
                continue
            if value is None or int(value) < low:
                raise ValueError(f"{name} must be {'at least 1' if low else '0 or more'}, got {getattr(self, name)!r}")

    def to_json(self):
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text):
        values = parse_json(text, "the benchmark spec")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class _Batches:
    """An endless source of (data, label) batches of one shape: images with float32 class labels, or a family's
    own (:func:`mxfp16.bench.family_steps.synthetic_batch`)."""

    def __init__(self, spec):
        import mxnet as mx
        self.classes = spec.classes
        if spec.data == "synthetic" and family(spec.model) is not None:
            from .family_steps import synthetic_batch

            self._fixed = synthetic_batch(spec.model, spec.options, spec.batch_size, spec.seed)
            return
        if spec.data == "synthetic":
            rng = np.random.RandomState(spec.seed)
            shape = (spec.batch_size, 3, spec.image_size, spec.image_size)
            self._fixed = (mx.nd.array(rng.standard_normal(shape).astype(np.float32)),
                           mx.nd.array(rng.randint(0, spec.classes, spec.batch_size).astype(np.float32)))
            return
        from ..data import make_loaders
        self._fixed = None
        self._loaders = make_loaders(spec.data, image_size=spec.image_size, batch_size=spec.batch_size,
                                     workers=spec.workers, pipeline=spec.pipeline, seed=spec.seed)
        self.classes = len(self._loaders.classes)
        self._batch_size = spec.batch_size
        self._epoch = 0
        self._it = self._loaders.train_batches(self._epoch)

    def next(self):
        """The next batch; real data cycles through epochs and skips a short last batch (static shapes)."""
        if self._fixed is not None:
            return self._fixed
        for _ in range(2):
            for data, label in self._it:
                if data.shape[0] == self._batch_size:
                    return data, label
            self._epoch += 1
            self._it = self._loaders.train_batches(self._epoch)
        raise RuntimeError(f"the data set has fewer than {self._batch_size} training images; lower the batch size")


def measure(spec):
    """Build what ``spec.mode`` runs (:func:`build_step`) and time it in this process.

    Parameters
    ----------
    spec : BenchSpec

    Returns
    -------
    dict
        The result record (see :func:`mxfp16.bench.report.RESULT_FIELDS`).

    Raises
    ------
    mxfp16.PrecisionError
        When the precision cannot run on ``spec.ctx`` (float16 on a CPU).
    """
    from ..devices import format_ctx
    from ..machine.environment import check_threads
    from ..machine.hardware import peak_memory_mb
    from ..measure.timing import time_steps

    check_threads()  # warns when MXNet runs fewer threads than planned
    step, precision, contexts, provider = build_step(spec)
    times = time_steps(step, spec.iters, spec.repeats, spec.warmup, per_call=spec.mode == "inference")
    record = _record(spec, precision, times, peak_memory_mb(contexts), format_ctx(contexts))
    if spec.precision == "auto" and getattr(step, "auto_route", None):
        record.update(auto_route=step.auto_route, amp_lists=step.amp_lists)  # a route may run under other lists
    if times.latencies:
        record.update(latency_fields(times.latencies))
    if provider:
        record.update(precision=spec.precision, execution_provider=provider)
    return record


def build_step(spec):
    """What ``spec`` times, built: ``(step, precision, contexts, provider)``: one training step or one inference call
    (see :func:`measure`), and onnxruntime's execution provider (``None`` for MXNet). The census builds the same step.
    """
    from ..devices import resolve_devices
    from ..precision import resolve_precision

    contexts = resolve_devices(spec.ctx)[:1 if spec.mode == "inference" else None]  # one device answers one request
    batches = _Batches(spec)
    provider = None
    if spec.runtime == "onnxruntime":
        step, provider = _onnxruntime_step(spec, contexts, batches)
        precision = resolve_precision("float32", contexts)  # the float32 network's ONNX file (float16 is made from it)
    elif spec.mode == "inference":
        precision = resolve_precision(spec.precision, contexts)
        step = _inference_step(spec, precision, contexts, batches)
    else:
        step, precision = _train_step(spec, contexts, batches)
    return step, precision, contexts, provider


def _train_step(spec, contexts, batches):
    """One training step of the trainer's run (:func:`mxfp16.train.parts.build_parts`, SGD at a constant rate), or a
    family's own (:func:`mxfp16.bench.family_steps.family_step`); returns ``(step, precision)``."""
    from ..mixed import MixedPrecision
    from ..train.parts import PartsSpec, build_parts

    mixed = MixedPrecision(spec.precision, contexts, amp_lists=spec.amp_lists)
    if family(spec.model) is not None:
        from .family_steps import family_step

        step = family_step(spec, mixed, batches)
        if mixed.pending:  # auto: its first step times the network and settles the precision; that step is untimed
            step()
        # The row names a route auto applied, and the lists AMP ran under (measure()).
        step.auto_route, step.amp_lists = getattr(mixed.verdict, "route", None), mixed.amp_lists
        return step, mixed.precision
    parts = build_parts(PartsSpec(model=spec.model, classes=batches.classes, image_size=spec.image_size,
                                  batch_size=spec.batch_size, optimizer="sgd", lr=0.01, momentum=0.9, wd=1e-4,
                                  seed=spec.seed), mixed)

    def step():
        data, label = mixed.cast_batch(*batches.next())
        return mixed.train_step(parts.net, parts.loss, parts.trainer, data, label).loss.as_nd_ndarray()
    return step, mixed.precision


def _inference_step(spec, precision, contexts, batches):
    """One forward pass of the network as ``mxfp16 export`` writes it (random weights: speed does not depend on
    them) and ``mxfp16 predict`` loads it, on the first device; batches go in as float32."""
    from ..inference.convert import deployable, load_block
    from ..train.parts import PartsSpec, build_network

    device = contexts[0]
    # The plain dtype name: an AMP precision's param_dtype makes cast_net require amp.init
    # (mxfp16.precision.AMPDtypeName), which an export neither needs nor has: its casts are in the converted graph.
    net = build_network(PartsSpec(model=spec.model, classes=batches.classes, image_size=spec.image_size,
                                  seed=spec.seed), contexts, str(precision.param_dtype))
    model = deployable(net, precision, spec.amp_lists)
    block = load_block(model.symbol, model.params, device)

    def step():
        return block(batches.next()[0].as_in_context(device))
    return step


def _onnxruntime_step(spec, contexts, batches):
    """One onnxruntime call on the network as ``mxfp16 export --format onnx`` writes it; returns ``(step, provider)``.
    A synthetic batch is read to numpy once; real batches on every call, as a server would receive them."""
    from ..devices import format_ctx
    from ..inference.convert import deployable
    from ..inference.formats import onnx as onnx_format
    from ..precision import resolve_precision
    from ..train.parts import PartsSpec, build_network

    net = build_network(PartsSpec(model=spec.model, classes=batches.classes, image_size=spec.image_size,
                                  seed=spec.seed), contexts, "float32")
    model = deployable(net, resolve_precision("float32", contexts))
    converted = onnx_format.to_onnx(model.symbol, model.params, (3, spec.image_size, spec.image_size))
    if spec.precision == "float16":
        converted = onnx_format.to_float16(converted)
    session = onnx_format.Model(converted.SerializeToString(), spec.precision, ctx=format_ctx(contexts))
    fixed = batches.next()[0].asnumpy() if spec.data == "synthetic" else None

    def step():
        return session(fixed if fixed is not None else batches.next()[0].asnumpy())
    return step, session.provider


def latency_fields(latencies):
    """``latency_ms_median``, ``latency_ms_p90``, ``latency_ms_p99`` and ``latency_samples`` of per-call seconds
    (with fewer than 100 samples the p99 is close to the slowest call)."""
    ms = 1000.0 * np.asarray(latencies, dtype=np.float64)
    return {"latency_ms_median": float(np.median(ms)), "latency_ms_p90": float(np.percentile(ms, 90)),
            "latency_ms_p99": float(np.percentile(ms, 99)), "latency_samples": int(ms.size)}


def _head(spec, precision, amp_lists, ctx, status, reason):
    """The fields every mxfp16 record starts with, timed or not, in ``bench.json``'s order."""
    return {
        "framework": "mxfp16" if spec.runtime == "mxnet" else spec.runtime, "precision": precision,
        "requested_precision": spec.requested or spec.precision, "amp_lists": amp_lists, "batch_size": spec.batch_size,
        "image_size": spec.image_size, "model": spec.model, "mode": spec.mode, "data": spec.data,
        "pipeline": None if spec.data == "synthetic" else spec.pipeline, "ctx": ctx, "status": status, "reason": reason,
        **record_fields(spec.model, spec.options),
    }


def _record(spec, precision, times, peak_mb, ctx):
    return {
        **_head(spec, precision.name, spec.amp_lists if precision.amp else None, ctx, "ok", None),
        **({"auto_reason": precision.reason} if spec.precision == "auto" else {}),  # decided in this row's process
        **throughput_fields(spec.model, spec.batch_size, spec.options, times.ms_per_step / 1000.0),
        "ms_per_step": times.ms_per_step, "ms_per_step_spread": times.ms_per_step_spread,
        "ms_per_step_repeats": [1000.0 * t for t in times.wall],
        # Process CPU time per step: less sensitive than wall time to other programs on a shared machine (it still
        # counts their cache pressure).
        "cpu_ms_per_step": 1000.0 * float(np.median(times.cpu)), "peak_memory_mb": peak_mb, "iters": spec.iters,
        "warmup": spec.warmup, "repeats": spec.repeats,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, "threads": mxnet_threads(),
    }


def not_run(spec, status, reason):
    """The record of a measurement that did not produce timings."""
    return {**_head(spec, spec.precision, None, spec.ctx, status, reason), "images_per_second": None,
            "ms_per_step": None, "ms_per_step_spread": None, "peak_memory_mb": None}


def run_in_subprocess(spec, timeout=None):
    """Run :func:`measure` for ``spec`` in a fresh Python process.

    Returns
    -------
    dict
        The child's record; ``status`` is ``'ok'``, ``'skipped'`` or ``'failed'`` (crashed or timed out), with
        ``reason``. It never raises for a failing child.
    """
    record, problem = call_in_child(_measure_or_skip, spec, timeout=timeout)
    return record if record is not None else not_run(spec, "failed", problem)


def _measure_or_skip(spec):
    """In the child: :func:`measure`, or a ``'skipped'`` record where the precision cannot run on these devices."""
    from ..devices import DeviceError
    from ..precision import PrecisionError

    try:
        return measure(spec)
    except (PrecisionError, DeviceError) as err:
        return not_run(spec, "skipped", str(err))
