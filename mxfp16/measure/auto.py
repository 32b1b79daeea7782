"""``auto``: one decision procedure for the library and the commands alike.

Where timing cannot change the answer the rule per CPU class
(:func:`mxfp16.precision.auto_rule`) decides (``ruled: ...``); on a CPU with
native bfloat16 the network is timed in a forked copy of this process
(:class:`~mxfp16.measure.probe.NetworkProbe`, ``timed on this CPU: ...``).
docs/benchmarks.md, "What auto picks on each kind of CPU", tells the whole
procedure.

A network with a route (:data:`ROUTES`: another way to compute the same
layers under AMP, its parameters unchanged) gets amp-bfloat16 timed each way,
and the fastest is the candidate: a plain ``gluon.rnn.LSTM`` is timed fused
(its float32 kernel) and unfused (its products in bfloat16); a network with
convolutions oneDNN cannot block (MobileNet v2's 24 channels) under mxfp16's
lists and with those convolutions in float32 (``mxfp16+unaligned32``).

:func:`adopt` switches a verdict on, for :class:`mxfp16.MixedPrecision` and
the probe's child alike, so the same network and batch get the same verdict
whichever path asks.
"""
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, NamedTuple

from ..plumbing.fileio import cache_folder
from .cache import MachineCache, machine_busy
from .margin import pays, requirement, speed_ratio

__all__ = ["AutoVerdict", "decide_auto", "adopt", "timing_applies", "rule_verdict", "cache_file", "min_repeat_ms",
           "network_routes", "route_lists", "Route", "ROUTES", "CLEAR", "CANDIDATE"]

#: Timed steps per repeat in the probe's first round (:class:`mxfp16.measure.probe.NetworkProbe`).
PROBE_ITERS = 3
#: A first ratio beyond this (or below its inverse) decides at once; one nearer 1 is confirmed.
CLEAR = 1.25
#: Rounds after the first when it did not decide, and how long each timed repeat lasts at least to be trusted
#: (on a 2-core VM the LSTM's short step changed by half from one process to the next; 1 s of steps less).
CONFIRM_ROUNDS, MIN_REPEAT_MS, MAX_CONFIRM_ITERS = 2, 1000.0, 100
#: The variable that sets another repeat length (:func:`min_repeat_ms`).
REPEAT_MS_VARIABLE = "MXFP16_AUTO_REPEAT_MS"
#: The candidate ``auto`` measures against float32 on a CPU.
CANDIDATE = "amp-bfloat16"
# 6: list routes; 5: routes; 4: probes time MXNet's kernels on the parent's threads; 3: keyed by structure, batch
_CACHE_VERSION = 6


#: Sequence lengths after which a network ``auto`` unfused goes back to the fused kernel: the probe timed one length,
#: and each traces a graph of its own (a language model's last, shorter batch is a second; bucketing makes many).
UNFUSED_MAX_LENGTHS = 4


def _unfuse(net):
    from ..amp.recurrent import unfuse_rnn

    unfuse_rnn(net, max_lengths=UNFUSED_MAX_LENGTHS)


def _can_unfuse(net, amp_lists):
    from ..amp.recurrent import layers_to_unfuse

    return bool(layers_to_unfuse(net))


class Route(NamedTuple):
    """Another way to compute some layers under AMP: the same parameters (a checkpoint loads either way), only
    where the work runs changes."""

    description: str  #: what it does, for the verdict's reason
    applies: Callable  #: ``applies(net, amp_lists)``: whether ``net`` has layers it changes under those lists
    apply: Callable = None  #: ``apply(net)``: change them, in place (``None``: the network stays as it is)
    lists: str = None  #: the AMP list set it runs under in place of the user's (``None``: the user's)


def _lists_route(description, lists, base="mxfp16"):
    """A route that runs AMP under the list set ``lists`` where the user's is ``base`` and it keeps more of the
    network in float32 (an ``mxfp16+...32`` option, which pays on some networks and costs on others)."""
    def applies(net, amp_lists):
        from ..amp.lists import keeps_more_float32

        return amp_lists == base and keeps_more_float32(net, lists, base)

    return Route(f"{description} (amp_lists={lists!r})", applies, lists=lists)


#: The routes ``auto`` times amp-bfloat16 with, beside AMP's own computation, by name.
ROUTES = {
    "unfused-rnn": Route("recurrent layers unfused (mxfp16.amp.unfuse_rnn)", _can_unfuse, _unfuse),
    # MobileNet v2's 24-channel layers: oneDNN blocks channels by 16, and MXNet 1.9.1 refuses its padded layouts.
    "unaligned32": _lists_route("convolutions whose channels are not a multiple of 16 in float32",
                                "mxfp16+unaligned32"),
}


def network_routes(net, amp_lists="mxfp16"):
    """The names of the :data:`ROUTES` that change something in ``net`` under the list set ``amp_lists``, in order."""
    return tuple(name for name, route in ROUTES.items() if route.applies(net, amp_lists))


def route_lists(route, amp_lists):
    """The AMP list set a verdict's ``route`` runs under, where the user asked for ``amp_lists``."""
    return (ROUTES[route].lists if route is not None else None) or amp_lists


def _label(route):
    """The candidate's name in messages: ``amp-bfloat16``, or with its route's description."""
    return CANDIDATE if route is None else f"{CANDIDATE} with its {ROUTES[route].description}"


@dataclass(frozen=True)
class AutoVerdict:
    """What ``auto`` resolved to for one network and batch here, and why.

    Attributes
    ----------
    precision : str
        ``'float16'`` (GPUs), ``'amp-bfloat16'`` or ``'float32'``.
    reason : str
        One sentence, starting ``timed on this CPU:`` or ``ruled:``.
    measured, cached : bool
        Whether the network was timed (now or in the cached verdict), and whether the verdict came from the cache.
    float32_ms, candidate_ms : float or None
        Median milliseconds per step of each (over the rounds).
    round_ratios : tuple of float
        Each round's own ratio, float32's time over amp-bfloat16's.
    route : str or None
        The :data:`ROUTES` entry the candidate was timed with, and :func:`adopt` applies (amp-bfloat16 only).
    alternatives : dict
        ``{route or 'amp': median ratio}`` of the candidates that were not chosen as the candidate (timed beside it).
    """

    precision: str
    reason: str
    measured: bool = False
    cached: bool = False
    float32_ms: object = None
    candidate_ms: object = None
    round_ratios: tuple = ()
    route: object = None
    alternatives: dict = field(default_factory=dict)

    @property
    def ratio(self):
        """float32's time over amp-bfloat16's (the median of the rounds' ratios): above 1, bfloat16 is faster."""
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return speed_ratio(self.float32_ms, self.candidate_ms)

    def record(self):
        """The verdict as plain values, for ``config.json`` and ``bench.json`` (``auto``)."""
        return dict(asdict(self), round_ratios=list(self.round_ratios), ratio=self.ratio)


def cache_file(environ=None):
    """Where verdicts are kept: ``$MXFP16_CACHE_DIR`` or ``$XDG_CACHE_HOME/mxfp16`` (``~/.cache/mxfp16``)."""
    return os.path.join(cache_folder(environ), "auto-precision.json")


def min_repeat_ms(environ=None):
    """How long each timed repeat of a probe lasts at least, in milliseconds: :data:`MIN_REPEAT_MS` by default.

    ``MXFP16_AUTO_REPEAT_MS`` trades the verdict's reliability for the
    probe's length (mxfp16's own suite uses 100).

    Raises
    ------
    PrecisionError
        For a value that is not a positive number, naming the variable.
    """
    from ..precision import PrecisionError

    environ = os.environ if environ is None else environ
    text = environ.get(REPEAT_MS_VARIABLE, "").strip()
    if not text:
        return MIN_REPEAT_MS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PrecisionError(f"{REPEAT_MS_VARIABLE}={text!r} is not a positive number of milliseconds (how long "
                             f"auto times each repeat of a network's steps); set e.g. {REPEAT_MS_VARIABLE}=1000, "
                             "or unset it for the default")
    return value


def timing_applies(ctx, support=None):
    """Whether timing can change ``auto``'s answer on ``ctx``: CPUs only, with native bfloat16.

    Parameters
    ----------
    ctx : list of mx.Context
    support : mxfp16.machine.hardware.BFloat16Support, optional
    """
    from ..machine import hardware

    if any(c.device_type != "cpu" for c in ctx) or not hasattr(os, "fork"):
        return False
    return (support or hardware.bfloat16_support()).native


def rule_verdict(on_gpu, why_not_timed=None):
    """The rule's answer as a verdict (:func:`mxfp16.precision.auto_rule`), its reason marked ``ruled:``."""
    from ..precision import auto_rule

    name, reason = auto_rule(on_gpu)
    return AutoVerdict(name, f"ruled: {reason}" + (f" (not timed: {why_not_timed})" if why_not_timed else ""))


def _amp_already_active():
    """The verdict where an earlier network of this process switched AMP on for ``auto``'s candidate, else ``None``:
    ``amp.init`` cannot be undone, so float32 cannot be had in this process any more, and timing the two would offer a
    choice that does not exist. Several networks under ``auto`` in one process (a notebook) then all run in it."""
    from ..precision import amp_target

    target = amp_target()
    if target is None or f"amp-{target}" != CANDIDATE:
        return None  # no AMP yet (timing decides), or another target (activate names the conflict)
    return AutoVerdict(CANDIDATE, f"ruled: AMP ({target}) is already active in this process, switched on for an "
                                  "earlier network, and cannot be undone, so float32 cannot be had here (not timed: "
                                  "run this network in a fresh process to let timing choose)")


def _from_cache(entry):
    try:
        verdict = AutoVerdict(**{k: v for k, v in entry.items() if k != "ratio"})
    except TypeError:
        return None
    known = verdict.precision in ("float32", CANDIDATE) and verdict.route in (None, *ROUTES)
    return replace(verdict, cached=True, round_ratios=tuple(verdict.round_ratios or ())) if known else None


def _failure(where, rounds):
    """The verdict when float32's or AMP's own probe did not run (float32, the safe side), else ``None``. A route's
    failure leaves that route out instead (:func:`_route_failures`)."""
    failed = [r for one in rounds for r in one[:2] if r.get("status") != "ok"]
    if not failed:
        return None
    return AutoVerdict("float32", f"timed on this CPU: measuring {failed[0].get('precision')} for {where} failed "
                                  f"({_why(failed[0])}); float32 is the safe side")


def _why(record):
    return (record.get("reason") or "no reason given").strip().splitlines()[-1]


def _route_failures(rounds, routes):
    """``{route: why}`` for each route whose probe failed in a round."""
    failed = {}
    for one in rounds:
        for route, record in zip(routes, one[2:]):
            if record.get("status") != "ok":
                failed.setdefault(route, _why(record))
    return failed


def _decide(where, rounds, routes=()):
    """The verdict from ``[[float32 record, candidate record, one per route ...], ...]``, one list per round."""
    if (failure := _failure(where, rounds)) is not None:
        return failure
    broken = _route_failures(rounds, routes)
    columns = {route: [one[k + 1] for one in rounds] for k, route in enumerate((None, *routes)) if route not in broken}
    ratios = {route: [speed_ratio(one[0]["ms_per_step"], record["ms_per_step"]) for one, record in zip(rounds, column)]
              for route, column in columns.items()}
    best = max(ratios, key=lambda route: statistics.median(ratios[route]))  # AMP's own first: it wins a tie
    f32 = statistics.median(one[0]["ms_per_step"] for one in rounds)
    bf16 = statistics.median(record["ms_per_step"] for record in columns[best])
    ratio = statistics.median(ratios[best])
    over = f", the median of {len(rounds)} rounds" if len(rounds) > 1 else ""
    beside = [f"{_label(route)} {statistics.median(r):.2f}x" for route, r in ratios.items() if route != best]
    beside += [f"{_label(route)} failed ({why})" for route, why in broken.items()]
    measured = (f"timed on this CPU: {_label(best)} at {ratio:.2f}x float32's speed for {where} "
                f"({bf16:.0f} against {f32:.0f} ms/step{over}" + "".join(f"; {text}" for text in beside))
    chosen, tail = (CANDIDATE, ")") if pays(ratio) else ("float32", f"; {requirement('it')} to be chosen)")
    alternatives = {route or "amp": statistics.median(r) for route, r in ratios.items() if route != best}
    return AutoVerdict(chosen, measured + tail, True, False, f32, bf16, tuple(ratios[best]),
                       best if chosen == CANDIDATE else None, alternatives)


def _probe_rounds(probe, log, repeat_ms=MIN_REPEAT_MS, routes=()):
    """Rounds of float32, amp-bfloat16, then amp-bfloat16 with each route: ``[[float32 record, candidate record,
    ...], ...]``. A short first round decides alone when its repeats lasted ``repeat_ms`` and its best candidate's
    ratio is beyond :data:`CLEAR` either way; a close call gets :data:`CONFIRM_ROUNDS` more rounds, a round of short
    steps one more than that."""
    def one_round(iters):
        return [probe.time("float32", iters), probe.time(CANDIDATE, iters)] + \
            [probe.time(CANDIDATE, iters, route=route) for route in routes]

    first = one_round(PROBE_ITERS)
    if _failure(probe.where, [first]) is not None:
        return [first]
    f32 = first[0]["ms_per_step"]
    bf16 = min(r["ms_per_step"] for r in first[1:] if r.get("status") == "ok")
    long_enough = PROBE_ITERS * min(f32, bf16) >= repeat_ms
    if long_enough and not 1 / CLEAR < f32 / bf16 < CLEAR:
        return [first]
    iters = min(MAX_CONFIRM_ITERS, max(PROBE_ITERS, math.ceil(repeat_ms / min(f32, bf16))))
    rounds, more = ([first], CONFIRM_ROUNDS) if long_enough else ([], CONFIRM_ROUNDS + 1)
    log(f"auto: {'a close call' if long_enough else 'steps too short to time once'} "
        f"({f32 / bf16:.2f}x); {more} more round(s) of {iters} steps per repeat")
    for _ in range(more):
        rounds.append(one_round(iters))
        if _failure(probe.where, rounds) is not None:
            break
    return rounds


def _record(verdict):
    """The verdict as the cache keeps it: plain values, without ``cached``."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(verdict).items() if k != "cached"}


def decide_auto(ctx, probe=None, log=print, cache=None):
    """What ``auto`` is on ``ctx``: ruled where timing cannot change it, else ``probe``'s network timed (cached).

    Parameters
    ----------
    ctx : list of mx.Context
        Resolved devices (:func:`mxfp16.devices.resolve_devices`).
    probe : mxfp16.measure.probe.NetworkProbe, optional
        The network to time; without one the rule decides, and says the network was not timed.
    log : callable
        Told when a measurement starts and ends, or that the verdict is the cache's.
    cache : str, optional
        The cache file (default :func:`cache_file`).

    Returns
    -------
    AutoVerdict
    """
    on_gpu = all(c.device_type == "gpu" for c in ctx)
    if not timing_applies(ctx):
        return rule_verdict(on_gpu)
    if probe is None:
        return rule_verdict(on_gpu, "no network and batch to time; mxfp16.MixedPrecision times the one it prepares")
    if (settled := _amp_already_active()) is not None:
        return settled
    store = MachineCache(cache or cache_file(), _CACHE_VERSION, "verdicts", "probe")
    key = store.key(probe.key)
    verdict = _from_cache(store.read().get(key, {}))
    if verdict is not None:  # said, so a reader knows nothing was timed now and how to time again
        log(f"auto: {verdict.precision} for {probe.where}, as measured earlier on this machine and kept in "
            f"{store.path} (delete it to measure again)")
        return verdict
    repeat_ms = min_repeat_ms()  # read once; a bad MXFP16_AUTO_REPEAT_MS is refused before anything is timed
    busy = machine_busy()
    routes = tuple(getattr(probe, "routes", ()))
    timed = ", ".join(["float32", CANDIDATE] + [_label(route) for route in routes])
    log(f"auto: timing {probe.where} in {timed}, a few steps each in a forked process; "
        f"the verdict is kept in {store.path}")
    tic = time.perf_counter()
    verdict = _decide(probe.where, _probe_rounds(probe, log, repeat_ms, routes), routes)
    log(f"auto: {verdict.precision} ({time.perf_counter() - tic:.0f} s): {verdict.reason}")
    if verdict.measured:
        store.keep_unless_busy({key: _record(verdict)}, busy, log=lambda line: log(f"auto: {line}"))
    if busy:
        return replace(verdict, reason=f"{verdict.reason}; measured under load ({busy})")
    return verdict


def adopt(name, ctx, amp_lists, nets=(), allow_cpu_float16=False, route=None, **fields):
    """The precision ``name`` switched on here: resolved for ``ctx``, AMP activated, ``nets`` traced again under AMP.

    Parameters
    ----------
    name : str
    ctx : list of mx.Context
    amp_lists : str
        As :func:`mxfp16.activate` takes it.
    nets : iterable of gluon.Block
        Networks whose graphs may have been traced before AMP (they would stay float32).
    allow_cpu_float16 : bool
        As :func:`mxfp16.resolve_precision` takes it.
    route : str, optional
        A :data:`ROUTES` name, applied to ``nets``, AMP under its list set (``name`` must be amp-bfloat16).
    **fields
        Replaced in the resolved :class:`~mxfp16.Precision` (``requested``, ``reason``).

    Returns
    -------
    mxfp16.Precision
    """
    from .._internals import rebuild_graphs, renew_parameter_arrays
    from ..precision import activate, resolve_precision

    precision = resolve_precision(name, ctx, allow_cpu_float16=allow_cpu_float16)
    precision = replace(precision, **fields) if fields else precision
    if route is not None and precision.name != CANDIDATE:
        raise ValueError(f"the route {route!r} is timed and applied with {CANDIDATE} only, not {precision.name}")
    activate(precision, route_lists(route, amp_lists))
    if precision.amp:
        for net in list(nets):
            if route is not None and ROUTES[route].apply is not None:
                ROUTES[route].apply(net)
            rebuild_graphs(net)  # a graph built before AMP stays float32: trace it again under AMP
            if all(c.device_type == "cpu" for c in ctx):
                renew_parameter_arrays(net)  # float32 passes may have left oneDNN's layouts, which AMP cannot cast
    return precision
