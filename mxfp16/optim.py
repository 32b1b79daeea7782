"""Optimizers for mixed precision: the Trainer factory, the learning-rate schedule and the support table.

float16 weights cannot hold small updates (1.0 + 1e-4 rounds back to 1.0).
With ``multi_precision=True`` an MXNet optimizer keeps a float32 master copy
of every float16 weight and updates that. :func:`optimizer_support` runs each
registered optimizer in this mode and watches which kernels it calls.
"""
import functools
import inspect
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from ._lazy import module
from .float_formats import BFLOAT16, is_bfloat16
from .models.gluoncv import import_gluoncv
from .plumbing.output import error_line
from .precision import Precision, check_activated

mx = module("mxnet")
gluon = module("mxnet.gluon")

__all__ = ["make_trainer", "optimizer_support", "OptimizerSupport", "registered_optimizers", "OptimizerError",
           "lr_schedule", "optimizer_params", "LR_SCHEDULES", "check_compression", "GRADIENT_COMPRESSION",
           "with_bfloat16_masters", "bfloat16_parameters", "check_bfloat16_masters"]

#: Gradient compression types MXNet offers.
GRADIENT_COMPRESSION = ("2bit",)

#: Decays :func:`lr_schedule` offers after the warm-up.
LR_SCHEDULES = ("step", "cosine")


class OptimizerError(ValueError):
    """An unknown optimizer name."""


def registered_optimizers():
    """Names in MXNet's optimizer registry, sorted."""
    return sorted(mx.optimizer.Optimizer.opt_registry)


def _check_optimizer(name):
    if isinstance(name, mx.optimizer.Optimizer):
        return name
    key = str(name).lower()
    if key not in mx.optimizer.Optimizer.opt_registry:
        raise OptimizerError(f"unknown optimizer {name!r}; MXNet {mx.__version__} registers: "
                             f"{', '.join(registered_optimizers())}")
    return key


def check_compression(kind, kvstore, precision):
    """Gradient compression for Gluon, or ``None``; refuses what MXNet cannot compress (see the messages).

    Parameters
    ----------
    kind : str or None
        ``'2bit'`` or ``None``.
    kvstore : str or mx.kv.KVStore
    precision : Precision

    Returns
    -------
    dict or None
        ``compression_params`` for :func:`make_trainer`.
    """
    if kind is None:
        return None
    if kind not in GRADIENT_COMPRESSION:
        raise OptimizerError(f"gradient compression {kind!r}: MXNet offers only '2bit' (or none)")
    name = kvstore if isinstance(kvstore, str) else kvstore.type
    if name != "device":
        raise OptimizerError(
            f"--gradient-compression {kind} does not work with --kvstore {name} in MXNet 1.9.1 with Gluon "
            "(dist kvstores fail with \"Compression not supported with PushPull\"; local refuses it). Use "
            "--kvstore device (several GPUs on one machine), or drop --gradient-compression; for fewer bytes "
            "across machines, train in float16, whose gradients are half the size")
    if precision.param_dtype != "float32":
        raise OptimizerError(
            f"--gradient-compression {kind} works on float32 gradients only, and precision {precision.name} "
            f"has {precision.param_dtype} parameters and gradients. Use amp-float16 (float32 parameters) or "
            "float32, or drop --gradient-compression: float16 gradients already halve the bytes on the wire")
    return {"type": kind, "threshold": 0.5}


class _BFloat16Masters:
    """Mixed into an MXNet optimizer class: a float32 master copy of each bfloat16 weight, updated in its place.

    MXNet 1.9.1's ``multi_precision`` does this for float16 weights only,
    and has no update kernel for bfloat16 ones. Here a bfloat16 weight's
    state is ``(float32 master, the optimizer's own state of the master)``;
    an update casts the gradient to float32, runs the optimizer's float32
    update on the master and writes the master, rounded, into the weight.
    So the state travels where MXNet's float16 masters do
    (``Trainer.save_states``). Every other weight is updated as before.
    """

    def create_state_multi_precision(self, index, weight):
        if not is_bfloat16(weight):
            return super().create_state_multi_precision(index, weight)
        master = weight.astype("float32")
        return master, super().create_state_multi_precision(index, master)

    def update_multi_precision(self, index, weight, grad, state):
        listed = isinstance(weight, (list, tuple))  # MXNet's aggregated updates pass lists of one dtype
        weights, grads, states = (weight, grad, state) if listed else ([weight], [grad], [state])
        if not is_bfloat16(weights[0]):
            return super().update_multi_precision(index, weight, grad, state)
        masters, inner = [s[0] for s in states], [s[1] for s in states]
        grads = [g.astype("float32") for g in grads]
        if listed:
            super().update_multi_precision(index, masters, grads, inner)
        else:
            super().update_multi_precision(index, masters[0], grads[0], inner[0])
        for master, target in zip(masters, weights):
            mx.nd.amp_cast(master, dtype=BFLOAT16, out=target)
        return None

    def __reduce__(self):
        # The class is made at run time, so pickle (Trainer.save_states pickles the optimizer) rebuilds it by its base.
        return _new_with_bfloat16_masters, (self.masters_of,), self.__getstate__()


@functools.lru_cache(maxsize=None)
def with_bfloat16_masters(optimizer_class):
    """``optimizer_class`` (an MXNet optimizer) with float32 master copies of bfloat16 weights.

    :func:`make_trainer` uses it when a network has bfloat16 parameters
    (:func:`mxfp16.amp.bfloat16_deconvolution`). Its instances pickle.

    Parameters
    ----------
    optimizer_class : type
        A subclass of ``mx.optimizer.Optimizer``.

    Returns
    -------
    type
        A subclass of both (one per class: later calls return the same).
    """
    if issubclass(optimizer_class, _BFloat16Masters):
        return optimizer_class
    return type(optimizer_class.__name__, (_BFloat16Masters, optimizer_class),
                {"masters_of": optimizer_class, "__module__": optimizer_class.__module__,
                 "__doc__": f"{optimizer_class.__name__}, with float32 master copies of bfloat16 weights "
                            "(mxfp16.optim.with_bfloat16_masters)."})


def _new_with_bfloat16_masters(optimizer_class):
    cls = with_bfloat16_masters(optimizer_class)
    return cls.__new__(cls)


def bfloat16_parameters(params):
    """The names of the bfloat16 parameters among ``params`` (a ParameterDict or a list of Parameters)."""
    values = params.values() if hasattr(params, "values") else params
    return [param.name for param in values if is_bfloat16(param)]


def _first_names(names):
    """``'a, b, c ...'``: the first three of ``names``, for a message."""
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def check_bfloat16_masters(trainer, params):
    """Refuse to update bfloat16 ``params`` with a ``trainer`` whose optimizer keeps no float32 masters.

    A trainer made before :func:`mxfp16.amp.bfloat16_deconvolution` has a
    plain MXNet optimizer: its update of a bfloat16 weight fails inside
    MXNet's engine ("Unknown type enum 12"), reported only at a later read
    or at exit, with the weights not updated.

    Raises
    ------
    OptimizerError
        Names the parameters and the order that works.
    """
    names = bfloat16_parameters(params)
    if names and not isinstance(trainer.optimizer, _BFloat16Masters):
        raise OptimizerError(
            f"{_first_names(names)} are bfloat16, but this trainer's "
            f"{type(trainer.optimizer).__name__} was made before they were and keeps no float32 master copies: "
            "call mxfp16.amp.bfloat16_deconvolution(net) before mixed.prepare(net, ...) (or make_trainer), "
            "then train with the trainer that returns")


def _bfloat16_optimizer(optimizer, opt_params, kvstore, update_on_kvstore, names):
    """An optimizer instance that keeps float32 masters of the bfloat16 parameters ``names`` (see make_trainer)."""
    name = kvstore if isinstance(kvstore, str) else getattr(kvstore, "type", "")
    if update_on_kvstore or str(name).startswith("dist"):
        raise OptimizerError(
            f"{_first_names(names)} are bfloat16 (mxfp16.amp.bfloat16_deconvolution)"
            f", and their float32 master copies live in this process's optimizer: kvstore {name!r} with updates on "
            "the kvstore cannot keep them. Use a local kvstore ('device') with update_on_kvstore unset, or keep "
            "those layers float32")
    if isinstance(optimizer, mx.optimizer.Optimizer):
        optimizer.__class__ = with_bfloat16_masters(type(optimizer))
        return optimizer
    cls = with_bfloat16_masters(mx.optimizer.Optimizer.opt_registry[optimizer])
    return cls(**opt_params)


def make_trainer(params, optimizer="sgd", optimizer_params=None, precision=None,
                 loss_scaler=None, kvstore="device", update_on_kvstore=None,
                 compression_params=None):
    """A ``gluon.Trainer`` set up for ``precision``.

    Parameters
    ----------
    params : ParameterDict or list of Parameter
    optimizer : str or mx.optimizer.Optimizer
        A registered name (case-insensitive).
    optimizer_params : dict, optional
    precision : Precision, optional
        ``multi_precision=True`` is set when its parameters are float16.
        Bfloat16 parameters (:func:`mxfp16.amp.bfloat16_deconvolution`) get
        float32 master copies whatever the precision
        (:func:`with_bfloat16_masters`).
    loss_scaler : LossScaler, optional
        When it is enabled, ``update_on_kvstore`` is False: the step must see the reduced gradients.
    kvstore : str
    update_on_kvstore : bool or None
    compression_params : dict, optional
        Checked with :func:`check_compression`.

    Returns
    -------
    gluon.Trainer

    Raises
    ------
    OptimizerError
        An unknown optimizer, or gradient compression it cannot use.
    ValueError
        ``update_on_kvstore=True`` beside an enabled loss scaler.
    mxfp16.precision.AMPStateError
        An AMP precision whose :func:`mxfp16.activate` was not called.
    """
    if precision is not None and not isinstance(precision, Precision):
        raise TypeError(f"precision must be a Precision, not {precision!r}: pass "
                        f"mxfp16.resolve_precision({precision!r}, ctx), which also checks it can run on ctx")
    check_activated(precision)
    optimizer = _check_optimizer(optimizer)
    if compression_params and precision is not None:
        check_compression(compression_params.get("type"), kvstore, precision)
    opt_params = dict(optimizer_params or {})
    if precision is not None and precision.master_weights and not isinstance(optimizer, mx.optimizer.Optimizer):
        opt_params["multi_precision"] = True
    if loss_scaler is not None and loss_scaler.enabled:
        if update_on_kvstore:
            raise ValueError("loss scaling needs update_on_kvstore=False: the overflow check must see the reduced "
                             "gradients before any update, and the kvstore cannot divide by a scale that changes "
                             "every step; leave update_on_kvstore unset (make_trainer sets it) or pass False")
        update_on_kvstore = False
    bfloat16 = bfloat16_parameters(params)
    if bfloat16:
        given = isinstance(optimizer, mx.optimizer.Optimizer)  # then Trainer checks opt_params is empty itself
        optimizer, opt_params = (_bfloat16_optimizer(optimizer, opt_params, kvstore, update_on_kvstore, bfloat16),
                                 opt_params if given else None)
    return gluon.Trainer(params, optimizer, opt_params, kvstore=kvstore,
                         update_on_kvstore=update_on_kvstore, compression_params=compression_params)


def lr_schedule(lr, epochs, warmup_epochs, steps_per_epoch, kind="cosine", step_epochs=None):
    """gluoncv's linear warm-up from 0, then ``step`` or ``cosine`` decay, counted in updates (resumed runs too).

    Phases shorter than two updates are constant (gluoncv divides by ``niters - 1``).

    Parameters
    ----------
    lr : float
        The peak rate (after warm-up).
    epochs, warmup_epochs, steps_per_epoch : int
    kind : {'cosine', 'step'}
        ``cosine`` decays to 0 at the end; ``step`` divides by 10 at each
        epoch in ``step_epochs``.
    step_epochs : sequence of int, optional
        For ``step``: the epochs (counted from the start of the run) where
        the rate drops.

    Returns
    -------
    gluoncv.utils.LRSequential
        ``schedule(n)`` is the rate of update ``n``.
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"lr schedule {kind!r}: choose one of {', '.join(LR_SCHEDULES)}")
    utils = import_gluoncv().utils
    parts = []
    warmup_iters = warmup_epochs * steps_per_epoch
    if warmup_iters >= 2:
        parts.append(utils.LRScheduler("linear", base_lr=0.0, target_lr=lr, niters=warmup_iters))
    main_iters = (epochs - warmup_epochs) * steps_per_epoch
    if main_iters < 2:
        parts.append(utils.LRScheduler("constant", base_lr=lr, niters=max(main_iters, 1)))
    elif kind == "step":
        steps = [max(e - warmup_epochs, 0) * steps_per_epoch for e in (step_epochs or ())]
        parts.append(utils.LRScheduler("step", base_lr=lr, niters=main_iters, step_iter=steps, step_factor=0.1))
    else:
        parts.append(utils.LRScheduler("cosine", base_lr=lr, target_lr=0.0, niters=main_iters))
    schedule = utils.LRSequential(parts)
    # The optimizer warns unless learning_rate equals the schedule's base_lr (which LRSequential ignores).
    schedule.base_lr = lr
    return schedule


def optimizer_params(optimizer, lr, wd=0.0, momentum=None, lr_scheduler=None):
    """Keyword arguments for an MXNet optimizer; ``momentum`` only goes to optimizers that take one.

    Raises
    ------
    OptimizerError
        For an unknown optimizer name.
    """
    params = {"learning_rate": lr, "wd": wd, **({} if lr_scheduler is None else {"lr_scheduler": lr_scheduler})}
    cls = mx.optimizer.Optimizer.opt_registry[_check_optimizer(optimizer)]
    if momentum is not None and "momentum" in inspect.signature(cls.__init__).parameters:
        params["momentum"] = momentum
    return params


@dataclass(frozen=True)
class OptimizerSupport:
    """One row of :func:`optimizer_support`.

    Attributes
    ----------
    name : str
    multi_precision : bool
        ``multi_precision=True`` updated a float16 weight and kept it float16 and finite.
    kernel : str
        ``'fused'`` for a mixed-precision kernel (``mp_*`` operators), ``'generic'``
        for the base class's float32 copy (a ``Cast`` and the float32 update), ``'-'`` on failure.
    master_keeps_small_update : bool
        An update of about 1e-4 on a weight of 1.0 reached the float32 master copy.
    float16_alone_keeps_small_update : bool or None
        The same update without master weights changed the float16 weight
        (expected False); None when the optimizer has no such update.
    operators : tuple of str
        MXNet operators the multi-precision update ran, from the profiler.
    error : str or None
    """

    name: str
    multi_precision: bool
    kernel: str
    master_keeps_small_update: bool
    float16_alone_keeps_small_update: bool
    operators: tuple
    error: object = None

    def as_dict(self):
        return asdict(self)


_OPERATOR_ROW = re.compile(r"^\s*([A-Za-z_][\w]*)\s+\d+\s", re.M)
# MXNet's C API calls show up in the profiler too; they are not operators.
_NOT_OPERATORS = re.compile(r"^(MX|WaitForVar|DeleteVariable|ResourceParallel|CopyCPU2CPU)")


def _float32_arrays(state):
    if isinstance(state, mx.nd.NDArray):
        return [state] if state.dtype == np.float32 else []
    if isinstance(state, (list, tuple)):
        return [a for s in state for a in _float32_arrays(s)]
    return []


def _small_update(name, multi_precision):
    """An optimizer, float16 ones, a float16 gradient of ones and the state: ``(opt, weight, grad, state)``."""
    opt = mx.optimizer.create(name, learning_rate=1e-4, multi_precision=multi_precision, rescale_grad=1.0)
    # 2-D because group-wise optimizers (groupadagrad) need rows.
    weight = mx.nd.ones((4, 4), dtype="float16")
    grad = mx.nd.ones((4, 4), dtype="float16")
    state = opt.create_state_multi_precision(0, weight)
    return opt, weight, grad, state


def _probe(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float16-without-master warning is the point here
        try:
            opt, weight, grad, state = _small_update(name, multi_precision=True)
            masters_before = [m.copy() for m in _float32_arrays(state)]
            mx.nd.waitall()
            mx.profiler.set_state("run")
            try:
                opt.update_multi_precision(0, weight, grad, state)
                mx.nd.waitall()
            finally:
                mx.profiler.set_state("stop")
            table = mx.profiler.dumps(reset=True)
        except Exception as err:  # every failure is a finding for the table
            return OptimizerSupport(name, False, "-", False, _float16_alone(name), (),
                                    f"{type(err).__name__}: {error_line(err)}")
    operators = tuple(sorted({op for op in _OPERATOR_ROW.findall(table) if not _NOT_OPERATORS.match(op)}))
    works = weight.dtype == np.float16 and bool(np.isfinite(weight.asnumpy()).all())
    fused = any(op.startswith("mp_") or "_mp_" in op for op in operators)
    kept = any(bool((a.asnumpy() != b.asnumpy()).any())
               for a, b in zip(_float32_arrays(state), masters_before) if a.shape == weight.shape)
    return OptimizerSupport(name, works, "fused" if fused else "generic", kept, _float16_alone(name), operators)


def _float16_alone(name):
    """Whether the same small update changes a float16 weight without master weights (``None``: it cannot run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            opt, weight, grad, state = _small_update(name, multi_precision=False)
            opt.update_multi_precision(0, weight, grad, state)
            return bool((weight.asnumpy() != 1.0).any())
        except Exception:  # no float16 kernel for this optimizer
            return None


def optimizer_support(names=None):
    """Run every registered optimizer with ``multi_precision=True`` on a float16 weight of ones, with a 1e-4 step.

    Parameters
    ----------
    names : iterable of str, optional
        Default: :func:`registered_optimizers`.

    Returns
    -------
    list of OptimizerSupport
    """
    names = registered_optimizers() if names is None else [_check_optimizer(n) for n in names]
    with tempfile.TemporaryDirectory() as tmp:
        mx.profiler.set_config(profile_imperative=True, aggregate_stats=True, filename=f"{tmp}/profile.json")
        return [_probe(name) for name in names]


def format_support_table(rows):
    """A fixed-width text table of :func:`optimizer_support` rows."""
    lines = [f"{'optimizer':<14}{'multi_precision':<17}{'kernel':<9}{'master keeps 1e-4':<19}float16 alone keeps 1e-4"]
    for r in rows:
        mp = "yes" if r.multi_precision else "no"
        lines.append(f"{r.name:<14}{mp:<17}{r.kernel:<9}{str(r.master_keeps_small_update).lower():<19}"
                     f"{ {None: 'fails', True: 'true', False: 'false'}[r.float16_alone_keeps_small_update]}"
                     + (f"  ({r.error[:70]})" if r.error else ""))
    return "\n".join(lines)
