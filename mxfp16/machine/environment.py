"""The process environment MXNet reads, checked and set once for every command: threads and float16 settings.

MXNet takes several settings from environment variables rather than from its
Python API. This module holds the ones mxfp16 needs and sets them the same way
for the trainer, the benchmark, the notebooks and library users. It imports
nothing from MXNet, so it can run before MXNet loads:
:func:`check_environment` reads MXNet's variables as MXNet would, and ``import
mxfp16`` lowers the thread counts (:func:`prepare_environment`), as
docs/getting-started.md ("Environment variables") says.

Threads
-------
MXNet 1.9.1 decides its OpenMP thread count once, when the library loads:
``OMP_NUM_THREADS`` if set, else half the processors (it assumes
hyper-threading on x86). On a VM with one thread per core that leaves half
the cores idle (2 cores: one thread; docs/benchmarks.md measures what the
second one gives). A later ``omp_set_num_threads`` cannot raise it past
that cap. So the count must be in the environment before ``import mxnet``:

* ``import mxfp16`` applies :func:`plan_threads` (every core this process
  may run on, ``os.sched_getaffinity``, unless ``OMP_NUM_THREADS`` or
  ``MXNET_OMP_MAX_THREADS`` is already set) as long as MXNet is not loaded yet;
* ``mxfp16 <command> --threads N`` does the same with N, before anything
  loads MXNet;
* a library user who imports MXNet first calls :func:`set_threads` before
  that, or exports ``OMP_NUM_THREADS``.

:func:`mxnet_threads` reads back what MXNet's OpenMP runtime uses, so the
setting is checked, not assumed.
"""
import argparse
import ctypes
import os
import re
import sys
import warnings
from dataclasses import dataclass, field

from ._mxnet_variables import VARIABLES as MXNET_VARIABLES

__all__ = ["FLOAT16_ENVIRONMENT", "set_float16_environment", "float16_environment", "ThreadSetting", "ThreadsError",
           "available_cores", "plan_threads", "set_threads", "mxnet_threads", "thread_report", "check_threads",
           "THREAD_VARIABLES", "EnvironmentCheck", "check_environment", "prepare_environment", "threads_argument",
           "ENGINE_TYPES", "THREAD_COUNT_VARIABLES"]

#: How ``--threads`` is described in every command's help.
THREADS_HELP = "OpenMP threads for MXNet's operators, fixed when MXNet loads"
THREADS_DEFAULT = "every core this process may run on, or OMP_NUM_THREADS / MXNET_OMP_MAX_THREADS when set"

#: Environment variables a user sets to choose MXNet's thread count, in the order they win.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS")
#: MXNet's other thread counts: at least 1 (0 hangs MXNet), and lowered to the cores like ``--threads``.
THREAD_COUNT_VARIABLES = ("MXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_PRIORITY_NTHREADS", "MXNET_CPU_NNPACK_NTHREADS",
                          "MXNET_GPU_WORKER_NTHREADS", "MXNET_GPU_COPY_NTHREADS", "MXNET_KVSTORE_REDUCTION_NTHREADS",
                          "MXNET_MP_WORKER_NTHREADS")
#: What ``MXNET_ENGINE_TYPE`` may name (``src/engine/engine.cc``); the last is MXNet's default.
ENGINE_TYPES = ("NaiveEngine", "ThreadedEngine", "ThreadedEnginePerDevice")


class ThreadsError(ValueError):
    """A thread count that cannot be used; the message names the setting and the fix."""


@dataclass(frozen=True)
class ThreadSetting:
    """How many OpenMP threads MXNet should run, and who said so.

    Attributes
    ----------
    threads : int
    source : str
        ``'--threads'``, ``'OMP_NUM_THREADS'``, ``'MXNET_OMP_MAX_THREADS'``
        or ``'default'`` (every core this process may run on).
    available : int
        Cores this process may run on.
    note : str or None
        What was changed from the request, e.g. more threads than cores.
    """

    threads: int
    source: str
    available: int
    note: object = None

    def describe(self):
        where = {"default": f"every core this process may run on ({self.available})"}.get(self.source, self.source)
        return f"{self.threads} thread(s), from {where}"


def available_cores():
    """Cores this process may run on (its CPU affinity; the CPU count where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _whole(value, what):
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1 or str(value).strip() != str(number):
        raise ThreadsError(f"{what} {value!r}: must be a whole number >= 1, e.g. {available_cores()} "
                           f"(the cores this process may run on)")
    return number


def _thread_list(value, name):
    """OpenMP's ``OMP_NUM_THREADS`` syntax: a count, or a list of counts per nesting level (``2,2``)."""
    try:
        return [_whole(part, name) for part in str(value).split(",")]
    except ThreadsError:
        raise ThreadsError(f"{name}={value!r}: must be a whole number >= 1, e.g. {available_cores()} (the cores this "
                           "process may run on), or OpenMP's list of one count per nesting level such as 2,2; set "
                           f"one, or unset {name}") from None


def threads_argument(text):
    """An argparse ``type=`` for ``--threads``: a whole number >= 1, with :func:`plan_threads`' message."""
    try:
        return _whole(text, "--threads")
    except ThreadsError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def plan_threads(requested=None, environ=None):
    """Decide MXNet's thread count: ``requested`` (``--threads``), else the environment, else every core.

    Parameters
    ----------
    requested : int or str, optional
        An explicit count. More than the available cores is reduced to them,
        and the setting's ``note`` says so (more threads than cores only adds
        switching).
    environ : mapping, optional
        Defaults to ``os.environ``.

    Returns
    -------
    ThreadSetting

    Raises
    ------
    ThreadsError
        ``requested``, or an environment variable, that is not a whole number >= 1.
    """
    environ = os.environ if environ is None else environ
    available = available_cores()

    def capped(threads, source, shown):
        if threads > available:
            note = f"{shown}: this process may run on {available} core(s); using {available}"
            return ThreadSetting(available, source, available, note)
        return ThreadSetting(threads, source, available)

    if requested is not None:
        threads = _whole(requested, "--threads")
        return capped(threads, "--threads", f"--threads {threads}")
    for name in THREAD_VARIABLES:
        if environ.get(name, "").strip():
            # OMP_NUM_THREADS may be a list per nesting level; MXNet's operators run at the first.
            threads = _thread_list(environ[name], name)[0] if name == "OMP_NUM_THREADS" else _whole(environ[name], name)
            return capped(threads, name, f"{name}={environ[name].strip()}")
    return ThreadSetting(available, "default", available)


def set_threads(setting=None):
    """Put ``setting`` (default: :func:`plan_threads`) in the environment for MXNet to read when it loads.

    Sets ``OMP_NUM_THREADS``; child processes (the benchmark's runs, data
    workers) inherit it. Does nothing to the environment once MXNet is
    loaded, because MXNet no longer reads it then.

    Returns
    -------
    (ThreadSetting, bool)
        The setting and whether it was applied (``False``: MXNet was already
        loaded; see :func:`mxnet_threads` for what it uses).
    """
    setting = setting or plan_threads()
    if "mxnet" in sys.modules:
        return setting, False
    os.environ["OMP_NUM_THREADS"] = str(setting.threads)
    # Child processes inherit both, so they can say where their count came from.
    os.environ["MXFP16_THREADS_SET"] = f"{setting.threads}:{setting.source}"
    return setting, True


def mxnet_threads():
    """The OpenMP thread count MXNet's runtime uses now (``None`` if MXNet is not loaded or uses no libgomp).

    MXNet sets the OpenMP runtime's thread count when it loads (to its cap,
    or to ``OMP_NUM_THREADS``), so ``omp_get_max_threads`` of the libgomp it
    links is what its operators get.
    """
    if "mxnet" not in sys.modules:
        return None
    try:
        return int(ctypes.CDLL("libgomp.so.1").omp_get_max_threads())
    except (OSError, AttributeError):
        return None


def thread_report():
    """What ``mxfp16 info``, config.json, summary.json and bench.json record about threads.

    Returns
    -------
    dict
        ``threads`` (what MXNet uses, read back), ``planned``, ``source``
        (who chose it) and ``available_cores``.
    """
    planned = plan_threads()
    source = planned.source
    value, _, origin = os.environ.get("MXFP16_THREADS_SET", "").partition(":")
    if source == "OMP_NUM_THREADS" and value == os.environ["OMP_NUM_THREADS"].strip():
        source = origin  # set by mxfp16 in this process or a parent, not by the user
    return {"threads": mxnet_threads(), "planned": planned.threads, "source": source,
            "available_cores": planned.available}


def check_threads(warn=True):
    """Warn when MXNet runs fewer threads than planned (it was loaded before mxfp16 could set them).

    Returns
    -------
    dict
        :func:`thread_report`.
    """
    report = thread_report()
    if warn and report["threads"] is not None and report["threads"] < report["planned"]:
        warnings.warn(f"MXNet runs {report['threads']} OpenMP thread(s) but {report['planned']} were planned "
                      f"({report['source']}): MXNet was loaded before the setting could take effect. Import mxfp16 "
                      "before mxnet, call mxfp16.machine.environment.set_threads() first, or export OMP_NUM_THREADS",
                      stacklevel=2)
    return report

#: What float16 training wants from MXNet's environment, and why.
FLOAT16_ENVIRONMENT = {
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": ("1", "cuDNN benchmarks convolution algorithms once per shape, "
                                          "picking tensor-core kernels for float16"),
    "MXNET_SAFE_ACCUMULATION": ("1", "reductions (sum, mean, norm, softmax) of float16 data accumulate in float32"),
}


def set_float16_environment():
    """Set the variables of :data:`FLOAT16_ENVIRONMENT` unless the user already did.

    MXNet reads them when an operator is created or run, so setting them
    before the network is built is enough.

    Returns
    -------
    dict
        ``{name: (value, why, set_here)}`` for the log.
    """
    set_here = {name for name in FLOAT16_ENVIRONMENT if name not in os.environ}
    return {name: (os.environ.setdefault(name, value), why, name in set_here)
            for name, (value, why) in FLOAT16_ENVIRONMENT.items()}


def float16_environment(environ=None):
    """What :func:`set_float16_environment` would leave in the environment, without changing it (``mxfp16 info``).

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (default: ``os.environ``).

    Returns
    -------
    dict
        ``{name: {"value": str, "source": "mxfp16" | "yours", "default": str, "why": str}}``:
        ``value`` is what MXNet will read in a run mxfp16 sets up, ``source`` says
        whether it is mxfp16's default or already set in the environment.
    """
    environ = os.environ if environ is None else environ
    return {name: {"value": environ.get(name, value), "source": "yours" if name in environ else "mxfp16",
                   "default": value, "why": why} for name, (value, why) in FLOAT16_ENVIRONMENT.items()}


# ---- checking the environment before MXNet loads ------------------------------------------------
@dataclass(frozen=True)
class EnvironmentCheck:
    """What :func:`check_environment` found.

    Attributes
    ----------
    errors : tuple of str
        One line per value MXNet cannot use: the variable, its value, what is wrong and the fix.
    notes : tuple of str
        One line per value lowered (a thread count above the cores).
    settings : dict
        ``{name: value}`` that :func:`prepare_environment` puts in the environment (the lowered counts).
    """

    errors: tuple = ()
    notes: tuple = ()
    settings: dict = field(default_factory=dict)


_INT32 = re.compile(r"^\s*[-+]?\d+\s*$")
_FLOAT = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")
#: The kinds dmlc::GetEnv parses, as MXNet 1.9.1 does: (whether it reads a value, what is wrong, a value to set).
_PARSED = {
    "bool": (lambda v: v.lower() in ("true", "false", "1", "0"), "is not a boolean (true, false, 1 or 0)", "1 or 0"),
    "int": (lambda v: _INT32.match(v) and -2 ** 31 <= int(v) < 2 ** 31, "is not a whole number",
            "a whole number such as 1"),
    "float": (lambda v: _FLOAT.match(v), "is not a number", "a number such as 0.5"),
}


def check_environment(environ=None, cores=None):
    """Check the variables MXNet reads as it would parse them; lower thread counts above the cores.

    Parameters
    ----------
    environ : mapping, optional
        Defaults to ``os.environ``; never changed here.
    cores : int, optional
        The cores this process may run on (default: :func:`available_cores`).

    Returns
    -------
    EnvironmentCheck
    """
    environ = os.environ if environ is None else environ
    cores = cores or available_cores()
    errors, notes, settings = [], [], {}

    def lower(name, counts):
        if max(counts) > cores:
            settings[name] = ",".join(str(min(c, cores)) for c in counts)
            notes.append(f"{name}={environ[name].strip()}: this process may run on {cores} core(s); using "
                         f"{settings[name]} (more threads than cores only adds switching; a thread count far above "
                         "them can stall a run)")

    value = environ.get("OMP_NUM_THREADS", "")
    if value.strip():
        try:
            lower("OMP_NUM_THREADS", _thread_list(value, "OMP_NUM_THREADS"))
        except ThreadsError as err:
            errors.append(str(err))
    for name in sorted(n for n in environ if n.startswith("MXNET_")):
        value, kind = environ[name], MXNET_VARIABLES.get(name)
        if name == "MXNET_ENGINE_TYPE":
            if value not in ENGINE_TYPES:
                errors.append(f"{name}={value!r}: MXNet knows {', '.join(ENGINE_TYPES[:-1])} and {ENGINE_TYPES[-1]} "
                              f"(its default); set one of them, or unset {name}")
            continue
        if kind is None or not value:  # not one MXNet reads, or empty (MXNet then takes its default)
            continue
        reads, problem, example = _PARSED.get(kind, (bool, None, None))
        if not reads(value):
            errors.append(f"{name}={value!r} {problem}, which MXNet needs here (it aborts otherwise); set {example}, "
                          f"or unset {name} for MXNet's default")
        elif name in THREAD_COUNT_VARIABLES + ("MXNET_OMP_MAX_THREADS",):
            if int(value) < 1:
                errors.append(f"{name}={value!r}: a thread count must be at least 1 (MXNet hangs with 0 threads); "
                              f"set one such as {cores}, or unset {name} for MXNet's default")
            else:
                lower(name, [int(value)])
    return EnvironmentCheck(tuple(errors), tuple(notes), settings)


#: What :func:`prepare_environment` found when ``import mxfp16`` ran it (the notes say what it lowered).
PREPARED = {"check": EnvironmentCheck()}


def prepare_environment():
    """Check the environment (:func:`check_environment`), lower the thread counts, set MXNet's thread count.

    Runs at ``import mxfp16`` and never raises: a value that cannot be used
    is left as it is, for the command (or :func:`mxfp16.machine.stack.import_mxnet`)
    to report. Changes nothing once MXNet is loaded, because MXNet no longer
    reads the environment then.

    Returns
    -------
    EnvironmentCheck
    """
    check = check_environment()
    if "mxnet" not in sys.modules:
        os.environ.update(check.settings)
        try:
            set_threads()  # every core this process may use, unless the environment says otherwise
        except ThreadsError:
            pass  # an unusable value: in check.errors, reported where MXNet would load
    PREPARED["check"] = check
    return check
