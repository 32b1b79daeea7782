"""``auto`` on a CPU, decided by timing the model: never slower than float32 on the machine it runs on.

Whether amp-bfloat16 beats float32 depends on the CPU and on the model. On the
same AMD Zen CPU ResNet-50 at 224 px gains and a small network at 32 px or the
Transformer encoder loses (the casts around each operator outweigh the faster
arithmetic); on an Intel Xeon with AMX left off, ResNet-50 itself loses
(docs/benchmarks.md). A rule per CPU class (:func:`mxfp16.precision.auto_rule`)
cannot know the model; the trainer and the benchmark can. So for ``auto`` on a
CPU that runs bfloat16 natively they call :func:`measured_auto`, which times a
few training steps of the actual model, shape and batch in float32 and in
amp-bfloat16, each in its own process (AMP is process-global) through the
benchmark's runner (:func:`mxfp16.bench.runner.measure`, the trainer's own
step), and keeps amp-bfloat16 only when it is faster by :data:`MARGIN`.

The verdict is cached per machine and software (the CPU's identity, the AMX
state, ``DNNL_MAX_CPU_ISA``, MXNet's and mxfp16's versions, the thread
count), and per model, image size, batch size and classes, in
``$XDG_CACHE_HOME/mxfp16/auto-precision.json`` (``~/.cache`` by default;
``MXFP16_CACHE_DIR`` names another folder). Delete the file to measure again.
A verdict measured while other programs kept the CPU busy (a one-minute load
average of at least one per core before the probe) is used once and not
kept: wall-clock times taken under load say little about the next run.

Where measuring cannot help, the rule decides without a measurement: GPUs
(float16), CPUs that cannot run bfloat16, and CPUs that only emulate it.
"""
import json
import os
import time
from dataclasses import asdict, dataclass, replace

from ..fileio import JSONFileError, read_json, write_json
from .runner import BenchSpec, run_in_subprocess

__all__ = ["AutoVerdict", "measured_auto", "probe_spec", "cache_file", "MARGIN"]

#: amp-bfloat16 must be at least this much faster than float32 to be chosen: a tie, or a gain inside the
#: run-to-run spread of a short probe, keeps float32 (the same speed with no bfloat16 rounding to explain).
MARGIN = 1.05
#: The probe: steps not timed (graph build, oneDNN primitives), then repeats of a few timed steps each.
PROBE_WARMUP, PROBE_ITERS, PROBE_REPEATS = 2, 3, 3
#: The candidate ``auto`` measures against float32 on a CPU.
CANDIDATE = "amp-bfloat16"
_CACHE_VERSION = 1


@dataclass(frozen=True)
class AutoVerdict:
    """What ``auto`` resolved to for one model and shape here, and why.

    Attributes
    ----------
    precision : str
        ``'amp-bfloat16'`` or ``'float32'``.
    reason : str
        One sentence for the log: the ratio measured, or the rule that decided.
    measured : bool
        Whether the model was timed (now or in the cached verdict).
    cached : bool
        Whether the verdict came from the cache.
    float32_ms, candidate_ms : float or None
        Median milliseconds per step of each.
    """

    precision: str
    reason: str
    measured: bool = False
    cached: bool = False
    float32_ms: object = None
    candidate_ms: object = None

    @property
    def ratio(self):
        """float32's time over amp-bfloat16's: above 1 means bfloat16 is faster."""
        if not self.float32_ms or not self.candidate_ms:
            return None
        return self.float32_ms / self.candidate_ms


def cache_file(environ=None):
    """Where verdicts are kept: ``$MXFP16_CACHE_DIR`` or ``$XDG_CACHE_HOME/mxfp16`` (``~/.cache/mxfp16``)."""
    environ = os.environ if environ is None else environ
    folder = environ.get("MXFP16_CACHE_DIR") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mxfp16")
    return os.path.join(folder, "auto-precision.json")


def probe_spec(model, image_size, batch_size, classes, amp_lists="mxfp16", seed=0):
    """The :class:`BenchSpec` of the float32 probe (the candidate differs only in its precision)."""
    return BenchSpec(model=model, image_size=int(image_size), batch_size=int(batch_size), precision="float32",
                     mode="train", iters=PROBE_ITERS, warmup=PROBE_WARMUP, repeats=PROBE_REPEATS, ctx="cpu",
                     classes=int(classes), amp_lists=amp_lists, seed=seed)


def _machine_key():
    """What a verdict depends on besides the model: the CPU, how oneDNN may use it, the software, the threads."""
    import mxnet as mx

    from .._version import __version__
    from ..machine import amx, hardware
    from ..machine.environment import mxnet_threads

    cpu = hardware.cpu_identity()
    return {"cpu": [cpu.get(k) for k in ("vendor", "model_name", "family", "model", "stepping")]
            + [sorted(cpu.get("bfloat16_instructions") or [])],
            "amx": amx.status().state, "isa": os.environ.get("DNNL_MAX_CPU_ISA"),
            "mxnet": mx.__version__, "mxfp16": __version__, "threads": mxnet_threads()}


def _key(spec):
    shape = {k: getattr(spec, k) for k in ("model", "image_size", "batch_size", "classes", "amp_lists")}
    return json.dumps({"machine": _machine_key(), "shape": shape}, sort_keys=True)


def _read_cache(path):
    try:
        doc = read_json(path, default={})
    except JSONFileError:
        return {}  # damaged: measured again and rewritten whole
    if not isinstance(doc, dict) or doc.get("version") != _CACHE_VERSION or not isinstance(doc.get("verdicts"), dict):
        return {}
    return doc["verdicts"]


def _from_cache(entry):
    try:
        verdict = AutoVerdict(**entry)
    except TypeError:
        return None
    if verdict.precision not in ("float32", CANDIDATE):
        return None
    return replace(verdict, cached=True)


def _busy():
    """A description of the load when the machine is busy (one-minute load average >= its cores), else ``None``."""
    from ..machine.environment import available_cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = available_cores()
    return f"1-minute load average {load:.1f} on {cores} core(s)" if load >= cores else None


def _decide(spec, float32, candidate):
    where = f"{spec.model} at {spec.image_size} px, batch {spec.batch_size}"
    failed = [r for r in (float32, candidate) if r.get("status") != "ok"]
    if failed:
        why = (failed[0].get("reason") or "no reason given").strip().splitlines()[-1]
        return AutoVerdict("float32", f"measuring {failed[0].get('precision')} for {where} failed ({why}); float32 "
                                      "is the safe side")
    f32, bf16 = float32["ms_per_step"], candidate["ms_per_step"]
    ratio = f32 / bf16
    if ratio >= MARGIN:
        return AutoVerdict(CANDIDATE, f"measured {CANDIDATE} at {ratio:.2f}x float32's speed for {where} on this "
                                      f"CPU ({bf16:.0f} against {f32:.0f} ms/step)", True, False, f32, bf16)
    return AutoVerdict("float32", f"measured {CANDIDATE} at {ratio:.2f}x float32's speed for {where} on this CPU "
                                  f"({bf16:.0f} against {f32:.0f} ms/step; it must be {MARGIN:.2f}x to be chosen)",
                       True, False, f32, bf16)


def measured_auto(spec, log=print, timeout=None, cache=None):
    """Resolve ``auto`` for ``spec``'s model on this CPU: the cached verdict, else time both precisions.

    Parameters
    ----------
    spec : BenchSpec
        From :func:`probe_spec` (its ``precision`` is ignored).
    log : callable
        Told, in one line each, that a measurement starts.
    timeout : float, optional
        Seconds allowed for each probe process.
    cache : str, optional
        The cache file (default :func:`cache_file`).

    Returns
    -------
    AutoVerdict
        The rule's answer (unmeasured) where the CPU cannot run bfloat16
        natively: then there is nothing to measure.
    """
    from ..machine import hardware
    from ..precision import auto_rule

    support = hardware.bfloat16_support()
    if not support.native:
        name, reason = auto_rule(False, support)
        return AutoVerdict(name, reason)
    cache = cache or cache_file()
    key = _key(spec)
    verdicts = _read_cache(cache)
    if key in verdicts:
        verdict = _from_cache(verdicts[key])
        if verdict is not None:
            return verdict
    busy = _busy()
    log(f"auto: timing {spec.model} ({spec.image_size} px, batch {spec.batch_size}) in float32 and {CANDIDATE}, "
        f"a few steps each in its own process; the verdict is kept in {cache}")
    tic = time.perf_counter()
    float32 = run_in_subprocess(replace(spec, precision="float32"), timeout=timeout)
    candidate = run_in_subprocess(replace(spec, precision=CANDIDATE), timeout=timeout)
    verdict = _decide(spec, float32, candidate)
    log(f"auto: measured in {time.perf_counter() - tic:.0f} s")
    if busy:
        log(f"auto: the CPU was busy when the probe started ({busy}); this verdict is used once and not kept")
        return replace(verdict, reason=f"{verdict.reason}; measured under load ({busy})")
    if verdict.measured:
        verdicts = _read_cache(cache)  # another process may have added its own since
        verdicts[key] = {k: v for k, v in asdict(verdict).items() if k != "cached"}
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            write_json(cache, {"version": _CACHE_VERSION, "verdicts": verdicts})
        except OSError as err:  # an unwritable cache costs a measurement next time, nothing more
            log(f"auto: could not keep the verdict in {cache} ({err.strerror or err}); it is measured again next time")
    return verdict
