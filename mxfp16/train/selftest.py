"""``mxfp16 selftest``: does each precision that runs here train like float32?

Each precision that runs here (:func:`plan`) trains :func:`mxfp16.models.small_convnet` for a few steps through
:class:`~mxfp16.MixedPrecision`, each run in its own process (AMP patches MXNet for the life of a process), beside a
float32 control from the same initial weights and batches, and :func:`verdict` judges it. What it trains,
the pass rule, the controls of skipped steps and the measured tolerances: docs/gpu.md, "mxfp16 selftest".
"""
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from ..plumbing.child import call_in_child

#: What every run trains.
STEPS, BATCH_SIZE, IMAGE_SIZE, CLASSES = 20, 32, 16, 4
LEARNING_RATE, MOMENTUM = 0.1, 0.9
#: Loss is averaged over this many steps at the start and the end.
WINDOW = 3
#: Final loss within LOSS_ATOL + LOSS_RTOL * control. Measured on this project's 2-core
#: CPU (avx512_bf16), seeds 0-2: amp-bfloat16 ends at most 0.0004 from the control; a run
#: with --inject-fault at least 0.097 (docs/gpu.md, "mxfp16 selftest").
LOSS_ATOL, LOSS_RTOL = 0.02, 0.05
#: Largest parameter difference, relative to that parameter's largest control value.
#: Measured there: amp-bfloat16 1.4-3.2% (bfloat16 keeps 8 significant bits; float16's 11
#: do better); --inject-fault 145% or more.
PARAM_RTOL = 0.10
#: How hard --inject-fault hits: noise of this many times each parameter's spread.
FAULT_SCALE = 1.0

#: The precisions selftest can check, and where each runs.
CHECKED = (("float16", "gpu"), ("amp-float16", "gpu"), ("amp-bfloat16", "cpu"))


@dataclass(frozen=True)
class RunSpec:
    """One training run, in one process.

    Attributes
    ----------
    ctx : str
        ``'cpu'`` or ``'gpu:0'``.
    params_out : str
        Where the final parameters go (``.npz``, float32).
    save_init, init_params : str or None
        Write the initial parameters here (the first control on a device); start from these (every other run).
    skip_steps : tuple of int
        Steps to run forward only (a control matching a run whose loss scaler skipped them).
    fault_step : int or None
        After this step, add noise to the parameters (``--inject-fault``).
    """

    precision: str
    ctx: str
    params_out: str
    save_init: str = None
    init_params: str = None
    skip_steps: tuple = ()
    fault_step: int = None
    steps: int = STEPS
    seed: int = 0


def batches(steps, seed):
    """Random but learnable images: a fixed random template per class plus noise, and the labels."""
    rng = np.random.RandomState(seed)
    templates = rng.uniform(-1.0, 1.0, (CLASSES, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    labels = rng.randint(0, CLASSES, (steps, BATCH_SIZE))
    noise = rng.normal(0.0, 1.0, (steps, BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    return templates[labels] + noise, labels.astype(np.float32)


def train_run(spec):
    """Train one run in this process and return its record (see :func:`run_in_subprocess`)."""
    import mxfp16

    import mxnet as mx
    from mxnet import autograd, gluon

    from ..devices import as_context_list
    from ..models import small_convnet

    contexts = as_context_list(spec.ctx)
    mixed = mxfp16.MixedPrecision(spec.precision, contexts)  # the README's set-up: AMP before the network
    precision, scaler = mixed.precision, mixed.scaler
    mx.random.seed(spec.seed)
    net = small_convnet(CLASSES)
    net.initialize(mx.init.Xavier(), ctx=contexts)
    net(mx.nd.zeros((1, 3, IMAGE_SIZE, IMAGE_SIZE), ctx=contexts[0]))  # finish deferred initialisation
    if spec.save_init:
        net.save_parameters(spec.save_init)
    if spec.init_params:
        net.load_parameters(spec.init_params, ctx=contexts)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mixed.prepare(net, "sgd", {"learning_rate": LEARNING_RATE, "momentum": MOMENTUM})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    images, labels = batches(spec.steps, spec.seed)

    losses, skipped, start = [], [], None
    for step in range(spec.steps):
        data, label = mixed.cast_batch(mx.nd.array(images[step]), mx.nd.array(labels[step]))
        if step in spec.skip_steps:
            with autograd.record():  # the forward pass of a skipped step still updates BatchNorm's statistics
                loss = loss_fn(mxfp16.to_float32(net(data[0])), label[0]).mean()
            losses.append(loss.as_np_ndarray())
            skipped.append(step)
        else:
            result = mixed.train_step(net, loss_fn, trainer, data, label)
            losses.append(result.loss)
            if result.skipped:
                skipped.append(step)
        if step == spec.fault_step:
            _corrupt(net, spec.seed)
        if step == 0:
            mx.nd.waitall()  # the first step builds the graph: not timed
            start = time.perf_counter()
    mx.nd.waitall()
    elapsed = time.perf_counter() - start
    params = {name: p.data(contexts[0]).astype("float32").asnumpy() for name, p in net.collect_params().items()}
    np.savez(spec.params_out, **params)
    return {
        "status": "ok", "reason": None, "precision": precision.name, "ctx": spec.ctx, "steps": spec.steps,
        "losses": [l.item() for l in losses], "skipped_steps": skipped,
        "loss_scale": scaler.scale if scaler.enabled else None,
        "images_per_second": (spec.steps - 1) * BATCH_SIZE / elapsed if elapsed > 0 else None,
        "params": spec.params_out,
    }


def _corrupt(net, seed):
    """A broken update: noise as large as each parameter's own spread."""
    import mxnet as mx

    rng = np.random.RandomState(seed + 1)
    for param in net.collect_params().values():
        if param.grad_req == "null":
            continue
        for data in param.list_data():
            values = data.astype("float32").asnumpy()
            noise = rng.normal(0.0, FAULT_SCALE * (values.std() + 1e-3), values.shape)
            data[:] = mx.nd.array(values + noise, ctx=data.context).astype(data.dtype)


def run_in_subprocess(spec, timeout=None, env=None):
    """Run :func:`train_run` in a fresh process: its record, or one of ``status`` ``'failed'`` (never raises)."""
    record, problem = call_in_child(train_run, spec, timeout=timeout, env=env, tail_lines=8)
    return record or {"status": "failed", "reason": problem, "precision": spec.precision, "ctx": spec.ctx}


@dataclass(frozen=True)
class Planned:
    """A precision this machine can or cannot check, and where."""

    precision: str
    ctx: str
    runnable: bool
    reason: str = ""


def plan(n_gpus, bfloat16):
    """What to check on a machine with ``n_gpus`` GPUs and a CPU whose bfloat16 is ``bfloat16``.

    amp-bfloat16 is checked wherever it runs, emulated included (it must train right, not fast).

    Returns
    -------
    list of Planned
        One per precision in :data:`CHECKED`, in that order.
    """
    def one(precision, device):
        if device == "gpu":
            return Planned(precision, "gpu:0", True) if n_gpus else Planned(
                precision, "gpu", False, "no GPU here (MXNet has no float16 convolution on a CPU)")
        return Planned(precision, "cpu", True) if bfloat16.runs else Planned(
            precision, "cpu", False, f"bfloat16 does not run here: {bfloat16.reason}")
    return [one(precision, device) for precision, device in CHECKED]


def _loss_ends(record):
    """The mean loss of the first and of the last :data:`WINDOW` steps (NaN without steps)."""
    losses = record["losses"]
    return tuple(float(np.mean(part)) if part else float("nan") for part in (losses[:WINDOW], losses[-WINDOW:]))


def max_param_difference(params, control):
    """The largest ``|p - p_control|`` over all parameters, relative to that parameter's largest ``|p_control|``."""
    with np.load(params) as ours, np.load(control) as theirs:
        return max(float(np.max(np.abs(ours[name] - theirs[name])) / max(float(np.max(np.abs(theirs[name]))), 1e-6))
                   for name in theirs.files)


def verdict(record, control):
    """Compare a run with its float32 control.

    Returns
    -------
    dict
        A table row (:func:`_row`'s fields) whose ``verdict`` is ``'PASS'`` or ``'FAIL'``, with the ``reason``.
    """
    row = _row(record, record["precision"], "FAIL", None)
    if record["status"] != "ok" or control["status"] != "ok":
        row["reason"] = (record["reason"] if record["status"] != "ok"
                         else f"its float32 control failed: {control['reason']}")
        return row
    first, final = _loss_ends(record)
    control_first, control_final = _loss_ends(control)
    gap = abs(final - control_final)
    difference = max_param_difference(record["params"], control["params"])
    row.update(first_loss=first, final_loss=final, control_loss=control_final, loss_gap=gap,
               param_difference=difference)
    problems = []
    if not control_final < control_first:
        problems.append(f"the float32 control did not learn (loss {control_first:.3f} -> {control_final:.3f})")
    if not final < first:
        problems.append(f"loss did not fall ({first:.3f} -> {final:.3f})")
    if not gap <= LOSS_ATOL + LOSS_RTOL * control_final:
        problems.append(f"final loss {final:.3f} is {gap:.3f} from the control's {control_final:.3f} "
                        f"(allowed {LOSS_ATOL + LOSS_RTOL * control_final:.3f})")
    if not difference <= PARAM_RTOL:
        problems.append(f"parameters differ from the control's by {difference:.1%} (allowed {PARAM_RTOL:.0%})")
    row.update(verdict="FAIL" if problems else "PASS", reason="; ".join(problems) or None)
    return row


def _row(record, precision, verdict, reason):
    """A table row of ``record`` with no loss or parameter numbers yet."""
    return {"precision": precision, "ctx": record["ctx"], "steps": record.get("steps"),
            "skipped": len(record.get("skipped_steps") or []), "first_loss": None, "final_loss": None,
            "control_loss": None, "loss_gap": None, "param_difference": None,
            "images_per_second": record.get("images_per_second"), "verdict": verdict, "reason": reason}


def _control_row(record, note):
    row = _row(record, "float32", "control", note)
    if record["status"] == "ok":
        row["first_loss"], row["final_loss"] = _loss_ends(record)
        if not row["final_loss"] < row["first_loss"]:  # float32 itself must learn, or nothing below means anything
            row.update(verdict="FAIL", reason=f"float32 did not learn: loss {row['first_loss']:.4f} -> "
                                              f"{row['final_loss']:.4f}")
    else:
        row.update(verdict="FAIL", reason=record["reason"])
    return row


def run_selftest(steps=STEPS, inject_fault=None, timeout=600, n_gpus=None, bfloat16=None, progress=None):
    """Check every precision that runs here against a float32 control.

    Parameters
    ----------
    steps : int
    inject_fault : str, optional
        A precision whose run gets a broken update half-way (its verdict must be FAIL).
    timeout : float
        Seconds one run may take.
    n_gpus, bfloat16 : optional
        Override what :mod:`mxfp16.machine.hardware` finds (tests).
    progress : callable, optional
        Called with a line of text before each run.

    Returns
    -------
    list of dict
        Table rows (see :func:`verdict`): controls, checked precisions, and those not run here (``'not run'``).
    """
    from ..machine import hardware

    n_gpus = hardware.gpu_count() if n_gpus is None else n_gpus
    bfloat16 = hardware.bfloat16_support() if bfloat16 is None else bfloat16
    say = progress or (lambda line: None)
    rows, controls = [], {}
    with tempfile.TemporaryDirectory(prefix="mxfp16-selftest-") as tmp:
        def init(ctx):  # the initial weights every run on ctx starts from
            return os.path.join(tmp, f"init-{ctx.replace(':', '')}.params")

        def control_for(ctx, skip_steps=()):
            key = (ctx, tuple(skip_steps))
            if key not in controls:
                first = (ctx, ()) not in controls
                name = f"{ctx.replace(':', '')}-{len(controls)}"
                spec = RunSpec("float32", ctx, os.path.join(tmp, f"control-{name}.npz"), steps=steps,
                               save_init=init(ctx) if first else None, init_params=None if first else init(ctx),
                               skip_steps=tuple(skip_steps))
                say(f"float32 control on {ctx}" + (f", skipping steps {list(skip_steps)}" if skip_steps else ""))
                record = run_in_subprocess(spec, timeout, env={"NVIDIA_TF32_OVERRIDE": "0"})  # float32, not TF32
                controls[key] = record
                note = (f"skips steps {list(skip_steps)}, as the run below did" if skip_steps
                        else "same initial weights and batches as the runs below")
                rows.append(_control_row(record, note))
            return controls[key]

        # The float32 run always runs on the default device: on a machine where no mixed precision
        # runs, it still checks MXNet, the network and the step end to end.
        control_for("gpu:0" if n_gpus else "cpu")
        for planned in plan(n_gpus, bfloat16):
            if not planned.runnable:
                rows.append({"precision": planned.precision, "ctx": planned.ctx, "verdict": "not run",
                             "reason": planned.reason})
                continue
            base = control_for(planned.ctx)
            if base["status"] != "ok":
                rows.append(verdict({"status": "failed", "reason": "not run: the control failed",
                                     "precision": planned.precision, "ctx": planned.ctx}, base))
                continue
            spec = RunSpec(planned.precision, planned.ctx, os.path.join(tmp, f"{planned.precision}.npz"),
                           init_params=init(planned.ctx), steps=steps,
                           fault_step=steps // 2 if inject_fault == planned.precision else None)
            say(f"{planned.precision} on {planned.ctx}" + (" (with an injected fault)" if spec.fault_step else ""))
            record = run_in_subprocess(spec, timeout)
            skipped = tuple(record.get("skipped_steps") or ())
            rows.append(verdict(record, control_for(planned.ctx, skipped) if skipped else base))
    return rows


def passed(rows):
    """True when no row failed (precisions not run here do not fail)."""
    return all(row["verdict"] in ("PASS", "control", "not run") for row in rows)


def format_table(rows):
    """The pass/fail table ``mxfp16 selftest`` prints."""
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    header = (f"{'precision':<13} {'device':<6} {'steps':>5} {'skipped':>7} {'loss first->final':>18} "
              f"{'control':>8} {'max param diff':>14} {'img/s':>8}  verdict")
    lines = [header, "-" * len(header)]
    for row in rows:
        if row["verdict"] == "not run":
            lines.append(f"{row['precision']:<13} {row['ctx']:<6} {'':>5} {'':>7} {'':>18} {'':>8} {'':>14} "
                         f"{'':>8}  not run: {row['reason']}")
            continue
        loss = (f"{num(row['first_loss'], '.3f')}->{num(row['final_loss'], '.3f')}"
                if row["final_loss"] is not None else "-")
        text = row["verdict"] + (f": {row['reason']}" if row["reason"] else "")
        lines.append(f"{row['precision']:<13} {row['ctx']:<6} {num(row['steps'], 'd'):>5} {row['skipped'] or 0:>7} "
                     f"{loss:>18} {num(row['control_loss'], '.3f'):>8} {num(row['param_difference'], '.2%'):>14} "
                     f"{num(row['images_per_second'], '.1f'):>8}  {text}")
    return "\n".join(lines)


def tolerances_text(steps=STEPS):
    """What every run trains and what passing means, for the table's heading."""
    return (f"{steps} steps of batch {BATCH_SIZE}, {IMAGE_SIZE}x{IMAGE_SIZE} px, {CLASSES} classes; "
            f"pass: loss falls, final loss (mean of the last {WINDOW} steps) within {LOSS_ATOL:g} + "
            f"{LOSS_RTOL:.0%} of the float32 control's, every parameter within {PARAM_RTOL:.0%} of the control's "
            "(relative to the parameter's largest value)")
