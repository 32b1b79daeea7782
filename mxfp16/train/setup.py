"""Building a run's pieces from a resolved :class:`TrainConfig`.

Each function does one job and is called once by :func:`mxfp16.train.train`:
the environment, the kvstore, the learning-rate schedule, the optimizer
arguments, the objective. Keeping them here leaves the loop readable.
"""
import inspect
import os

import mxnet as mx
import numpy as np
from gluoncv.utils import LRScheduler, LRSequential
from mxnet import autograd, gluon

from .config import ConfigError

__all__ = ["set_float16_environment", "check_devices", "open_kvstore", "lr_schedule", "optimizer_params",
           "compression_params", "Objective", "grad_bytes_per_step", "FLOAT16_ENVIRONMENT"]

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
    report = {}
    for name, (value, why) in FLOAT16_ENVIRONMENT.items():
        set_here = name not in os.environ
        if set_here:
            os.environ[name] = value
        report[name] = (os.environ[name], why, set_here)
    return report


def check_devices(ctx_list):
    """Refuse GPUs that MXNet cannot see, before anything is built on them."""
    from ..hardware import gpu_count

    wanted = [c.device_id for c in ctx_list if c.device_type == "gpu"]
    if wanted:
        visible = gpu_count()
        missing = [i for i in wanted if i >= visible]
        if missing:
            raise ConfigError(f"--ctx asks for GPU {', '.join(map(str, missing))} but MXNet sees {visible} GPU(s) "
                              "(the CPU wheel, or no CUDA runtime); use --ctx cpu, or install mxfp16[gpu] on a GPU machine")
    return ctx_list


def open_kvstore(name):
    """Create a distributed kvstore (which tells this process its rank), or pass a local name through.

    Returns
    -------
    (kvstore, rank, num_workers)
        ``kvstore`` is an ``mx.kv.KVStore`` for ``dist_*`` names, else the name.
    """
    if not name.startswith("dist"):
        return name, 0, 1
    if "DMLC_ROLE" not in os.environ:
        raise ConfigError(f"kvstore {name!r} needs the DMLC_* environment of a parameter-server job "
                          "(DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER); "
                          "start the workers with `mxfp16 launch`, or use --kvstore device on one machine")
    kv = mx.kv.create(name)
    return kv, kv.rank, kv.num_workers


def lr_schedule(config, steps_per_epoch):
    """gluoncv's linear warm-up followed by ``step`` or ``cosine`` decay, counted in updates.

    The schedule reads the optimizer's update count, which the trainer
    states carry, so a resumed run continues at the same point. Phases
    shorter than two updates are constant (gluoncv divides by ``niters - 1``).
    """
    parts = []
    warmup_iters = config.warmup_epochs * steps_per_epoch
    if warmup_iters >= 2:
        parts.append(LRScheduler("linear", base_lr=0.0, target_lr=config.lr, niters=warmup_iters))
    main_iters = (config.epochs - config.warmup_epochs) * steps_per_epoch
    if main_iters < 2:
        parts.append(LRScheduler("constant", base_lr=config.lr, niters=max(main_iters, 1)))
    elif config.lr_schedule == "step":
        steps = [max(e - config.warmup_epochs, 0) * steps_per_epoch for e in config.step_epochs]
        parts.append(LRScheduler("step", base_lr=config.lr, niters=main_iters, step_iter=steps, step_factor=0.1))
    else:
        parts.append(LRScheduler("cosine", base_lr=config.lr, target_lr=0.0, niters=main_iters))
    schedule = LRSequential(parts)
    # The optimizer warns unless learning_rate equals the schedule's base_lr (which LRSequential ignores).
    schedule.base_lr = config.lr
    return schedule


def optimizer_params(config, scheduler):
    """The keyword arguments for the optimizer; ``momentum`` only for optimizers that take one."""
    params = {"learning_rate": config.lr, "wd": config.wd, "lr_scheduler": scheduler}
    cls = mx.optimizer.Optimizer.opt_registry.get(config.optimizer.lower())
    if cls is not None and "momentum" in inspect.signature(cls.__init__).parameters:
        params["momentum"] = config.momentum
    return params


def compression_params(config, precision):
    """Gradient compression for Gluon, or None; refuses what MXNet cannot compress.

    MXNet's ``2bit`` compression quantises float32 gradients only; float16
    parameters have float16 gradients. And with Gluon 1.9.1 it works on the
    ``device`` kvstore only (checked): the ``local`` kvstore refuses it, and
    every ``dist_*`` kvstore fails at the first step with "Compression not
    supported with PushPull", because Gluon exchanges dense gradients with
    ``pushpull``.
    """
    if config.gradient_compression is None:
        return None
    if config.kvstore != "device":
        raise ConfigError(
            f"--gradient-compression {config.gradient_compression} does not work with --kvstore "
            f"{config.kvstore} in MXNet 1.9.1 with Gluon (dist kvstores fail with \"Compression not "
            "supported with PushPull\"; local refuses it). Use --kvstore device (several GPUs on one "
            "machine), or drop --gradient-compression; for fewer bytes across machines, train in "
            "float16, whose gradients are half the size")
    if precision.param_dtype != "float32":
        raise ConfigError(
            f"--gradient-compression {config.gradient_compression} works on float32 gradients only, and "
            f"precision {precision.name} has {precision.param_dtype} parameters and gradients. Use "
            "amp-float16 (float32 parameters) or float32, or drop --gradient-compression: float16 "
            "gradients already halve the bytes on the wire")
    return {"type": config.gradient_compression, "threshold": 0.5}


def grad_bytes_per_step(params):
    """Bytes of gradient one worker pushes per step: size x itemsize over trained parameters."""
    total = 0
    for p in params:
        if p.grad_req != "null":
            total += int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
    return total


class Objective:
    """The loss :func:`mxfp16.train_step` minimises, and the correct predictions counted on the side.

    ``train_step`` calls ``loss_fn(float32_output, label)`` once per device;
    this object computes softmax cross-entropy (with optional label
    smoothing) and queues, on the device and without a host sync, how many
    predictions were right, so the loop can report training accuracy
    without a second forward pass.

    Parameters
    ----------
    classes : int
    label_smoothing : float
    """

    def __init__(self, classes, label_smoothing=0.0):
        self.classes = classes
        self.label_smoothing = label_smoothing
        self._loss = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=label_smoothing == 0)
        self.correct = []
        self.poison = False

    def start_step(self, poison=False):
        """Clear the per-step counts; ``poison`` makes this step's loss infinite (a testing aid)."""
        self.correct = []
        self.poison = poison

    def __call__(self, output, label):
        with autograd.pause():
            self.correct.append((output.argmax(axis=1) == label).sum())
        target = label
        if self.label_smoothing:
            eps = self.label_smoothing
            target = mx.nd.one_hot(label, self.classes) * (1 - eps) + eps / self.classes
        loss = self._loss(output, target)
        if self.poison:
            loss = loss * float("inf")
        return loss
