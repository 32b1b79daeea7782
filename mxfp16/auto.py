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
A first ratio near 1 (between ``1/CLEAR`` and :data:`CLEAR`), or one taken
from steps too short to time reliably on a shared or virtual machine, is
confirmed by more rounds, float32 and amp-bfloat16 in turn, each repeat at
least :data:`MIN_REPEAT_MS` long, and the median of the rounds' own ratios
decides (:func:`_probe_rounds`).

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
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace

from .bench.runner import BenchSpec, run_in_subprocess
from .plumbing.fileio import JSONFileError, read_json, write_json

__all__ = ["AutoVerdict", "measured_auto", "probe_spec", "cache_file", "MARGIN"]

#: amp-bfloat16 must be at least this much faster than float32 to be chosen: a tie, or a gain inside the
#: run-to-run spread of a short probe, keeps float32 (the same speed with no bfloat16 rounding to explain).
MARGIN = 1.05
#: The probe: steps not timed (graph build, oneDNN primitives), then repeats of a few timed steps each.
PROBE_WARMUP, PROBE_ITERS, PROBE_REPEATS = 2, 3, 3
#: A first ratio beyond this (or below its inverse) decides at once; one nearer 1 is confirmed.
CLEAR = 1.25
#: Rounds after the first when it did not decide, and how long each timed repeat lasts at least to be trusted
#: (on a 2-core VM the LSTM's short step changed by half from one process to the next; 1 s of steps less).
CONFIRM_ROUNDS, MIN_REPEAT_MS, MAX_CONFIRM_ITERS = 2, 1000.0, 100
#: The candidate ``auto`` measures against float32 on a CPU.
CANDIDATE = "amp-bfloat16"
_CACHE_VERSION = 2  # 2: verdicts confirmed over rounds (version 1's came from one short round)


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
        Median milliseconds per step of each (over the rounds).
    round_ratios : list of float
        Each round's own ratio, float32's time over amp-bfloat16's.
    """

    precision: str
    reason: str
    measured: bool = False
    cached: bool = False
    float32_ms: object = None
    candidate_ms: object = None
    round_ratios: tuple = ()

    @property
    def ratio(self):
        """float32's time over amp-bfloat16's (the median of the rounds' ratios): above 1, bfloat16 is faster."""
        if self.round_ratios:
            return statistics.median(self.round_ratios)
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

    from ._version import __version__
    from .machine import amx, hardware
    from .machine.environment import mxnet_threads

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
    return replace(verdict, cached=True, round_ratios=tuple(verdict.round_ratios or ()))


def _busy():
    """A description of the load when the machine is busy (one-minute load average >= its cores), else ``None``."""
    from .machine.environment import available_cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = available_cores()
    return f"1-minute load average {load:.1f} on {cores} core(s)" if load >= cores else None


def _failure(spec, rounds):
    """The verdict when a probe did not run (float32, the safe side), else ``None``."""
    failed = [r for pair in rounds for r in pair if r.get("status") != "ok"]
    if not failed:
        return None
    where = f"{spec.model} at {spec.image_size} px, batch {spec.batch_size}"
    why = (failed[0].get("reason") or "no reason given").strip().splitlines()[-1]
    return AutoVerdict("float32", f"measuring {failed[0].get('precision')} for {where} failed ({why}); float32 "
                                  "is the safe side")


def _decide(spec, rounds):
    """The verdict from ``[(float32 record, candidate record), ...]``, one pair per round."""
    failure = _failure(spec, rounds)
    if failure is not None:
        return failure
    where = f"{spec.model} at {spec.image_size} px, batch {spec.batch_size}"
    ratios = [f["ms_per_step"] / c["ms_per_step"] for f, c in rounds]
    f32 = statistics.median(f["ms_per_step"] for f, _ in rounds)
    bf16 = statistics.median(c["ms_per_step"] for _, c in rounds)
    ratio = statistics.median(ratios)
    over = f", the median of {len(rounds)} rounds" if len(rounds) > 1 else ""
    measured = (f"measured {CANDIDATE} at {ratio:.2f}x float32's speed for {where} on this CPU "
                f"({bf16:.0f} against {f32:.0f} ms/step{over}")
    if ratio >= MARGIN:
        return AutoVerdict(CANDIDATE, measured + ")", True, False, f32, bf16, tuple(ratios))
    return AutoVerdict("float32", measured + f"; it must be {MARGIN:.2f}x to be chosen)", True, False, f32, bf16,
                       tuple(ratios))


def _probe_rounds(spec, timeout, log):
    """Rounds of float32 then amp-bfloat16, each in its own processes: ``[(float32, candidate), ...]``.

    The first round is short. It decides alone when its repeats were long
    (at least :data:`MIN_REPEAT_MS` of steps) and its ratio clear (beyond
    :data:`CLEAR` either way). A close call gets :data:`CONFIRM_ROUNDS` more
    rounds. A first round of short steps is only a measure of the step: on
    a shared or virtual machine a burst from a neighbour can move a short
    step by half, so :data:`CONFIRM_ROUNDS` + 1 rounds of long repeats decide
    instead, and the short round is left out.
    """
    def one_round(probe):
        return (run_in_subprocess(replace(probe, precision="float32"), timeout=timeout),
                run_in_subprocess(replace(probe, precision=CANDIDATE), timeout=timeout))

    first = one_round(spec)
    if _failure(spec, [first]) is not None:
        return [first]
    f32, bf16 = (r["ms_per_step"] for r in first)
    long_enough = spec.iters * min(f32, bf16) >= MIN_REPEAT_MS
    if long_enough and not 1 / CLEAR < f32 / bf16 < CLEAR:
        return [first]
    iters = min(MAX_CONFIRM_ITERS, max(spec.iters, math.ceil(MIN_REPEAT_MS / min(f32, bf16))))
    rounds, more = ([first], CONFIRM_ROUNDS) if long_enough else ([], CONFIRM_ROUNDS + 1)
    log(f"auto: {'a close call' if long_enough else 'steps too short to time once'} "
        f"({f32 / bf16:.2f}x); {more} more round(s) of {iters} steps per repeat")
    for _ in range(more):
        rounds.append(one_round(replace(spec, iters=iters)))
        if _failure(spec, rounds) is not None:
            break
    return rounds


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
    from .machine import hardware
    from .precision import auto_rule

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
    verdict = _decide(spec, _probe_rounds(spec, timeout, log))
    log(f"auto: measured in {time.perf_counter() - tic:.0f} s")
    if busy:
        log(f"auto: the CPU was busy when the probe started ({busy}); this verdict is used once and not kept")
        return replace(verdict, reason=f"{verdict.reason}; measured under load ({busy})")
    if verdict.measured:
        verdicts = _read_cache(cache)  # another process may have added its own since
        verdicts[key] = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(verdict).items() if k != "cached"}
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            write_json(cache, {"version": _CACHE_VERSION, "verdicts": verdicts})
        except OSError as err:  # an unwritable cache costs a measurement next time, nothing more
            log(f"auto: could not keep the verdict in {cache} ({err.strerror or err}); it is measured again next time")
    return verdict
