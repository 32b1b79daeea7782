"""The devices a run uses: parse ``--ctx``, format it back, and check it against what MXNet sees.

:func:`parse_devices` reads the text without MXNet
(for onnxruntime); :func:`parse_ctx` makes MXNet contexts of the same list. A device list is checked once,
where it is first read (:func:`resolve_devices`). Errors are :class:`DeviceError`, whatever the precision.
"""
from ._lazy import module
from .machine import hardware

mx = module("mxnet")

__all__ = ["DeviceError", "as_context_list", "parse_devices", "parse_ctx", "format_ctx", "check_devices",
           "resolve_devices", "CTX_HELP", "ONE_DEVICE_HELP"]

#: What ``--ctx`` accepts, for every command's help (:func:`mxfp16.commands.add_ctx_argument`).
CTX_HELP = "devices: auto (every GPU MXNet sees, else the CPU), cpu, gpu, gpu:0 or a list such as gpu:0,1"
#: The same for a command that runs on one device.
ONE_DEVICE_HELP = "one device: auto (the first GPU MXNet sees, else the CPU), cpu or gpu:N"


class DeviceError(ValueError):
    """A device list that cannot be read, or names GPUs MXNet cannot see."""


def as_context_list(ctx=None):
    """Normalise ``None``, a context, a string like ``'gpu:0,1'`` or ``'auto'``, or a list into a list of contexts."""
    if ctx is None:
        return [mx.current_context()]
    if isinstance(ctx, mx.Context):
        return [ctx]
    if isinstance(ctx, str):
        return parse_ctx(ctx)
    return list(ctx)


def parse_devices(text, gpu_count=None):
    """Read ``'auto'``, ``'cpu'``, ``'gpu'``, ``'gpu:0'`` or ``'gpu:0,1,2'`` as ``[(kind, index)]``, without MXNet.

    Parameters
    ----------
    text : str
        What ``--ctx`` was given (case and surrounding spaces do not matter).
    gpu_count : callable, optional
        How many GPUs ``'auto'`` takes, called only then (default MXNet's count, which loads it).

    Returns
    -------
    list of (str, int)
        ``[('cpu', 0)]`` or ``[('gpu', 0), ('gpu', 1) ...]``.
    """
    text = str(text).strip().lower()
    if text == "auto":
        count = (gpu_count or hardware.gpu_count)()
        return [("gpu", i) for i in range(count)] if count else [("cpu", 0)]
    if text in ("cpu", "gpu"):
        return [(text, 0)]
    if text.startswith("gpu:"):
        try:
            devices = [("gpu", int(i)) for i in text[4:].split(",") if i.strip()]
        except ValueError:
            devices = []
        if devices:
            return devices
    raise DeviceError(f"cannot read device list {text!r}; use 'auto', 'cpu', 'gpu', 'gpu:0' or 'gpu:0,1'")


def parse_ctx(text):
    """Parse ``--ctx`` text into MXNet contexts: :func:`parse_devices`, with MXNet's GPU count for ``'auto'``."""
    return [mx.gpu(index) if kind == "gpu" else mx.cpu() for kind, index in parse_devices(text)]


def format_ctx(ctx_list):
    """The inverse of :func:`parse_ctx` for a resolved list: ``'cpu'`` or ``'gpu:0,1'``."""
    if all(c.device_type == "gpu" for c in ctx_list):
        return "gpu:" + ",".join(str(c.device_id) for c in ctx_list)
    return ",".join(c.device_type if c.device_type == "cpu" else f"gpu:{c.device_id}" for c in ctx_list)


def check_devices(ctx_list):
    """Refuse GPUs that MXNet cannot see, before anything is built on them; return ``ctx_list``.

    Parameters
    ----------
    ctx_list : list of mx.Context

    Returns
    -------
    list of mx.Context
    """
    wanted = [c.device_id for c in ctx_list if c.device_type == "gpu"]
    if wanted:
        visible = hardware.gpu_count()
        missing = [i for i in wanted if i >= visible]
        if missing:
            raise DeviceError(
                f"--ctx asks for GPU {', '.join(map(str, missing))} but MXNet sees {visible} GPU(s) "
                "(the CPU wheel, or no CUDA runtime); use --ctx auto (every visible GPU, else the CPU) or "
                "--ctx cpu, or install mxfp16[gpu] on a GPU machine")
    return ctx_list


def resolve_devices(ctx=None):
    """``ctx`` (``None``, ``'auto'``, ``'gpu:0,1'``, a context or a list) as a checked list of contexts."""
    return check_devices(as_context_list(ctx))
