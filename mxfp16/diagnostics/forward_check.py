"""Which layer's float16 output first holds inf or NaN.

A float16 forward pass that overflows poisons everything after it, so the useful answer is the *first* layer, in
execution order, whose output is not finite. The network runs in its own dtype (:func:`mxfp16.cast_net` first); the
finiteness flags stay on the device until one copy at the end. On a CPU, MXNet has no float16 GEMM (the failure is
asynchronous and poisons the process): :func:`float16_forward_runs_here`.
"""
from dataclasses import dataclass

import numpy as np

from .._lazy import module
from .layers import leaf_blocks, tap_outputs

mx, autograd, gluon = module("mxnet"), module("mxnet.autograd"), module("mxnet.gluon")

__all__ = ["ForwardCheck", "forward_check", "float16_forward_runs_here"]


@dataclass(frozen=True)
class ForwardCheck:
    """Finiteness of each layer's output in one forward pass.

    Attributes
    ----------
    dtype : str
        The dtype of the network's output.
    layers : tuple of (str, bool)
        ``(layer name, output finite)`` per call, in execution order.
    output_finite : bool
    """

    dtype: str
    layers: tuple
    output_finite: bool

    @property
    def first_bad_layer(self):
        """Name of the first layer whose output holds inf or NaN, or ``None``."""
        return next((name for name, finite in self.layers if not finite), None)

    def as_dict(self):
        return {"dtype": self.dtype, "first_bad_layer": self.first_bad_layer, "output_finite": self.output_finite,
                "layers": [{"name": n, "finite": f} for n, f in self.layers]}


def _all_finite(array):
    # |x| <= dtype max is False for inf and NaN; computed in the array's own dtype.
    limit = float(np.finfo(np.dtype(array.dtype)).max)
    return (array.abs() <= limit).min().astype("float32").reshape((1,))


def forward_check(net, data):
    """Run ``net`` on ``data`` once (training-mode BatchNorm, nothing recorded) and flag non-finite outputs.

    Parameters
    ----------
    net : gluon.Block
        Not hybridized; already in the dtype to check.
    data : NDArray
        A batch in the network's input dtype.

    Returns
    -------
    ForwardCheck
    """
    names, flags = [], []

    def record(block, output):
        names.append(block.name)
        flags.append(_all_finite(output))
        return output

    with tap_outputs(net, record), autograd.train_mode():
        output = net(data)
    head = output[0] if isinstance(output, (list, tuple)) else output
    ctx = head.context
    host = mx.nd.concat(*[f.as_in_context(ctx) for f in flags], _all_finite(head), dim=0).asnumpy()  # one sync
    layers = tuple((name, bool(flag >= 1.0)) for name, flag in zip(names, host[:-1]))
    return ForwardCheck(dtype=np.dtype(head.dtype).name, layers=layers, output_finite=bool(host[-1] >= 1.0))


def float16_forward_runs_here(net, ctx):
    """Whether ``net`` can run a float16 forward pass on ``ctx``, and why not.

    Returns
    -------
    (bool, str)
    """
    if ctx.device_type == "gpu":
        return True, "float16 runs on GPUs"
    nn = gluon.nn  # the layers backed by GEMM kernels, which MXNet 1.9.1 lacks in float16 on CPU
    layers = (nn.Dense, nn.Conv1D, nn.Conv2D, nn.Conv3D, nn.Conv1DTranspose, nn.Conv2DTranspose, nn.Conv3DTranspose)
    gemm = sorted({type(b).__name__ for b in leaf_blocks(net) if isinstance(b, layers)})
    if gemm:
        return False, (f"the network has {', '.join(gemm)} layers, which MXNet cannot run in float16 on a CPU; "
                       "run on a GPU (--ctx gpu:0) or check an elementwise network (--model elementwise-mlp)")
    return True, "no convolution or dense layers"
