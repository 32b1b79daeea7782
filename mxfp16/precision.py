"""One precision setting, resolved once into what a training step needs.

:func:`resolve_precision` validates a precision's name against the run's
devices and returns an immutable :class:`Precision`, which everything else
reads instead of comparing dtype strings.

============  ============  ===========  =====  ============  ==============
name          compute       parameters   AMP    loss scaling  master weights
============  ============  ===========  =====  ============  ==============
float32       float32       float32      no     no            no
float16       float16       float16      no     dynamic       yes (float32)
amp-float16   float16       float32      yes    dynamic       no (already)
amp-bfloat16  bfloat16      float32      yes    no            no (already)
============  ============  ===========  =====  ============  ==============

``auto`` picks float16 on GPUs. On a CPU, :func:`resolve_precision` follows
:func:`auto_rule`; given a network, :class:`mxfp16.MixedPrecision` times it
(:mod:`mxfp16.measure.auto`). :attr:`Precision.reason` says why.

bfloat16 on a CPU needs AVX-512 (the oneDNN 2.4.4 in MXNet 1.9.1 has no
bfloat16 path below it): ``amp-bfloat16`` is refused there with a
:class:`PrecisionError` naming the missing instructions.
"""
import json
from dataclasses import asdict, dataclass

from ._internals import amp_initialized, built_graphs
from .devices import as_context_list as _as_context_list
from .machine import hardware

PRECISIONS = ("float32", "float16", "amp-float16", "amp-bfloat16", "auto")


class PrecisionError(ValueError):
    """A precision name that is unknown or cannot run on the chosen devices."""


class AMPDtypeName(str):
    """The dtype name of an AMP precision's parameters (``'float32'``): ``cast_net`` sees it needs :func:`activate`."""

    precision = None


def precision_of(dtype):
    """The AMP precision a dtype name was taken from (``precision.param_dtype``), or ``None``."""
    return dtype.precision if isinstance(dtype, AMPDtypeName) else None


@dataclass(frozen=True)
class Precision:
    """How one run computes, stores parameters and scales its loss.

    Attributes
    ----------
    name : str
        The resolved name (never ``'auto'``).
    requested : str
        What the user asked for (may be ``'auto'``).
    compute_dtype : str
        The dtype the heavy operators run in.
    param_dtype : str
        The dtype of the network's parameters, and of the batches fed to it.
    amp : bool
        Whether MXNet's AMP (``mx.contrib.amp``) does the casting.
    loss_scaling : bool
        Whether a dynamic loss scale is the default.
    master_weights : bool
        Whether the optimizer keeps float32 copies (``multi_precision=True``).
    reason : str
        ``'asked for'``, or how ``auto`` chose it.
    """

    name: str
    requested: str
    compute_dtype: str
    param_dtype: str
    amp: bool
    loss_scaling: bool
    master_weights: bool
    reason: str = ""

    def __post_init__(self):
        if self.amp:  # the dtype name carries its precision (see AMPDtypeName)
            name = AMPDtypeName(self.param_dtype)
            name.precision = self
            object.__setattr__(self, "param_dtype", name)

    @property
    def data_dtype(self):
        """The dtype each batch is cast to before the forward pass (float32 under AMP, which casts inside)."""
        return self.param_dtype

    def as_dict(self):
        return asdict(self)

    def __str__(self):
        suffix = f" (from {self.requested})" if self.requested != self.name else ""
        return f"{self.name}{suffix}"


#: name -> (compute_dtype, param_dtype, amp, loss_scaling, master_weights): the module's table.
_TABLE = {"float32": ("float32", "float32", False, False, False),
          "float16": ("float16", "float16", False, True, True),
          "amp-float16": ("float16", "float32", True, True, False),
          "amp-bfloat16": ("bfloat16", "float32", True, False, False)}


def check_precision_name(name):
    """Normalise a precision name (``' AMP-BFloat16 '`` -> ``'amp-bfloat16'``): the one place names are validated.

    Raises
    ------
    PrecisionError
        For an unknown name; the message lists the choices.
    """
    if not isinstance(name, str) or name.strip().lower() not in PRECISIONS:
        raise PrecisionError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
    return name.strip().lower()


#: Where the measurements behind :func:`auto_rule` are recorded.
RECORDED = "docs/benchmarks.md, 'What decides the ratio on your CPU'"


def auto_rule(on_gpu, support=None):
    """What ``auto`` is without measuring the model: ``(name, reason)``, each reason naming its measurement.

    Recorded (:data:`RECORDED`): avx512_bf16 without AMX ran ResNet-50 at 1.7x-1.8x float32, an AMX CPU with AMX
    off at 0.81x.

    Parameters
    ----------
    on_gpu : bool
    support : BFloat16Support, optional
        Default :func:`mxfp16.machine.hardware.bfloat16_support`.
    """
    if on_gpu:
        return "float16", "GPUs: float16 with loss scaling and float32 master weights"
    support = support or hardware.bfloat16_support()
    if support.kind in ("none", "unknown"):
        return "float32", f"bfloat16 {hardware.BFLOAT16_KINDS[support.kind]} here: {support.reason}"
    if support.kind == "emulated":
        return "float32", f"bfloat16 is emulated here ({support.reason}), which is slower than float32"
    if support.kind == "native" and support.amx is None:
        return "amp-bfloat16", f"avx512_bf16 without AMX: amp-bfloat16 was recorded faster than float32 on such CPUs " \
                               f"(AMD Zen 4/5, ResNet-50; {RECORDED}); MixedPrecision times your network"
    if support.kind == "native":
        return "float32", "an AMX CPU without AMX in use: its avx512_bf16 kernels were recorded slower than float32 " \
                          f"({RECORDED}); mxfp16 info says why AMX is not in use"
    return "float32", "AMX in use: on an Emerald Rapids VM amp-bfloat16 was faster than float32 on some networks " \
                      "(ResNet-50, a Transformer encoder) and slower on others (DCGAN, MobileNet v2) " \
                      f"({RECORDED}), so without a network to time the rule keeps float32; " \
                      "MixedPrecision times your network"


def resolve_precision(name="auto", ctx=None, allow_cpu_float16=False):
    """Validate a precision name against the devices and return a :class:`Precision`.

    Parameters
    ----------
    name : str
        One of :data:`PRECISIONS`.
    ctx : mx.Context, list of mx.Context, str or None
        The devices the run uses; ``None`` means the current context.
    allow_cpu_float16 : bool
        Allow float16 or amp-float16 on a CPU (only elementwise networks run that way).

    Returns
    -------
    Precision
        ``auto`` follows :func:`auto_rule` (reason ``ruled: ...``): there is no network here to time.

    Raises
    ------
    PrecisionError
        An unknown name, or a precision these devices cannot run; the message says why and what to use.
    """
    requested = check_precision_name(name)
    contexts = _as_context_list(ctx)
    on_gpu = all(c.device_type == "gpu" for c in contexts)
    resolved, reason = (requested, "asked for") if requested != "auto" else auto_rule(on_gpu)
    if requested == "auto":  # resolve_precision has no network to time (mxfp16.measure.auto does, given one)
        reason = f"ruled: {reason}"
    if _TABLE[resolved][0] == "float16" and not on_gpu and not allow_cpu_float16:
        raise PrecisionError(
            f"precision {resolved!r} was asked for on a CPU, but MXNet has no float16 convolution or "
            "dense (FullyConnected) layer on CPU (\"FP16 gemm on cpu not implemented\"), so a real "
            "network would fail mid-step. Use --precision amp-bfloat16 (bfloat16 through MXNet's AMP, "
            "fast on CPUs with avx512_bf16/AMX) or run on a GPU (--ctx gpu:0). Networks built only "
            "from elementwise ops can opt in with allow_cpu_float16=True.")
    support = hardware.bfloat16_support() if resolved == "amp-bfloat16" and not on_gpu else None
    if support is not None and not support.runs:
        raise PrecisionError(f"precision {resolved!r} cannot run on this CPU: {support.reason}. Use --precision "
                             "float32 (or auto, which resolves to float32 here), or a machine with AVX-512 "
                             "(bfloat16 natively with avx512_bf16 or AMX).")
    return Precision(resolved, requested, *_TABLE[resolved], reason=reason)


# AMP is process-global: amp.init() patches mx.nd / mx.sym once and cannot be
# undone, so the process remembers which target it was initialised for.
_amp_target = None


def amp_target():
    """The target mxfp16 initialised AMP for in this process (``'bfloat16'``, ``'float16'``), or ``None``."""
    return _amp_target


class AMPStateError(RuntimeError):
    """AMP was already initialised in this process for something else."""


def activate(precision, amp_lists="mxfp16", target_precision_ops=None, conditional_fp32_ops=None, fp32_ops=None):
    """Prepare the process for ``precision`` (AMP's ``init``, once per process); call before the first forward pass.

    Parameters
    ----------
    precision : Precision
    amp_lists : str
        A name of :data:`mxfp16.amp.lists.LIST_SETS`, for an AMP precision.
    target_precision_ops, conditional_fp32_ops, fp32_ops : list of str, optional
        Explicit lists, as ``amp.init`` takes them, in place of ``amp_lists``'s.

    Raises
    ------
    AMPStateError
        AMP already ran for another target, or is active and a non-AMP precision is asked for.
    ValueError
        An unknown ``amp_lists``.
    """
    global _amp_target

    from .amp.lists import LIST_SETS, init_amp

    if amp_lists not in LIST_SETS:
        raise ValueError(f"AMP lists {amp_lists!r}: choose one of {', '.join(LIST_SETS)}")
    initialised = amp_initialized()
    if not precision.amp:
        if initialised:
            raise AMPStateError(f"AMP is already active in this process (target {_amp_target or 'unknown'}), so "
                                f"a {precision.name} run here would not be {precision.name}. Run each precision "
                                "in its own process.")
        return
    target = precision.compute_dtype
    if initialised:
        if _amp_target != target:
            raise AMPStateError(f"AMP was initialised for {_amp_target or 'another target'} in this process and "
                                f"cannot switch to {target}. Run each precision in its own process.")
        return
    given = {key: value for key, value in (("target_precision_ops", target_precision_ops),
                                           ("conditional_fp32_ops", conditional_fp32_ops),
                                           ("fp32_ops", fp32_ops)) if value is not None}
    init_amp(target, which=amp_lists, lists=given or None)
    _amp_target = target


#: Operators every AMP set-up wraps with casts, whatever its lists: a graph holding one of them and no cast
#: was built before AMP patched MXNet.
_ALWAYS_CAST = frozenset({"Convolution", "FullyConnected"})


def check_activated(precision, net=None):
    """Refuse a set-up that would train an AMP precision in float32 without saying so.

    Parameters
    ----------
    precision : Precision or None
        Nothing is checked for ``None`` or a precision without AMP.
    net : gluon.Block, optional
        Its graphs, when already built, must contain AMP's casts.

    Raises
    ------
    AMPStateError
        Naming the missing call and where it goes.
    """
    if precision is None or not precision.amp:
        return
    target = precision.compute_dtype
    if not amp_initialized():
        raise AMPStateError(
            f"precision {precision.name} runs through MXNet's AMP, but mxfp16.activate(precision) was not called, "
            "so the network would train in float32 and every step would succeed. Call mxfp16.activate(precision) "
            "right after resolve_precision, before the network is built (mxfp16.MixedPrecision does both)")
    if _amp_target not in (None, target):
        raise AMPStateError(f"AMP is active for {_amp_target} in this process, not for {precision.name}'s {target}; "
                            "run each precision in its own process")
    if net is None:
        return
    # numpy-mode graphs too: mxfp16 wraps their operators as AMP wraps mx.nd's (mxfp16.amp.numpy_mode).
    for block, symbol in built_graphs(net):
        ops = {node["op"] for node in json.loads(symbol.tojson(remove_amp_cast=False))["nodes"]}
        if ops & _ALWAYS_CAST and not ops & {"amp_cast", "amp_multicast"}:
            raise AMPStateError(
                f"the network's graph ({block.name}) was built before mxfp16.activate(precision): it ran once, "
                f"hybridized, before AMP was switched on, and Gluon keeps that float32 graph, so {precision.name} "
                "would train in float32. Call mxfp16.activate(precision) before the network's first forward pass "
                "(right after resolve_precision), or call net.hybridize() again after it to rebuild the graph")


def runnable_here():
    """Which precisions can run on this machine, and why not where they cannot.

    Returns
    -------
    dict
        ``{name: (runnable: bool, reason: str)}`` for every concrete precision.
    """
    n_gpus = hardware.gpu_count()
    support = hardware.bfloat16_support()
    gpu_reason = f"{n_gpus} GPU(s) visible" if n_gpus else "needs a GPU: MXNet has no float16 conv/dense on CPU"
    return {"float32": (True, "always"), "float16": (n_gpus > 0, gpu_reason), "amp-float16": (n_gpus > 0, gpu_reason),
            "amp-bfloat16": (support.runs, support.describe())}
