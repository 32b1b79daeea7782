"""Global average pooling computed as a ``mean``: MXNet 1.9.1's oneDNN pooling sends reference kernels its gradient.

The backward pass of MXNet 1.9.1's oneDNN ``Pooling`` with a 1x1 output
(Gluon's ``GlobalAvgPool2D``, the end of every ResNet and MobileNet) lets
oneDNN choose the layout of the input gradient from the output gradient's,
and for a 1x1 output ``nChw16c`` and the channels-last blocked ``acdB16b``
describe the same bytes: oneDNN picks ``acdB16b``. No JIT kernel takes that
layout, so the pooling's backward runs oneDNN's reference code
(``pooling_v2 ref:any backward_data``), and so does the backward of the
``BatchNorm`` that feeds it (``bnorm_ref:any``: its data in ``nChw16c``, its
gradient in ``acdB16b``), through the ReLU and the residual sum between them.
On an AMD Zen 4 with avx512_bf16 those two took 61% of oneDNN's time in a
training step of ``cifar_resnet20_v1`` (32 px, batch 64) under amp-bfloat16,
the BatchNorm about 1000 times its JIT kernel's time; float32 has the same
fault (41%). Which shapes oneDNN does this for depends on the channels and
the pooled size (seen there, batch 16, a blocked bfloat16 input: 16 and 32
channels at 4 to 14 px, 64 channels from 7 px, 128 at 14 px; not 256 up to
14 px, nor ResNet-50's 2048 at 7 px), and where the pooling's input arrives
in the plain layout (MobileNet v2, after its ``clip`` ReLU6) oneDNN's JIT
pooling runs and the route only costs a few small casts.

``mean`` over the spatial axes computes the same thing, and its backward (a
broadcast) hands the ReLU and the BatchNorm a plain gradient that oneDNN
reorders once into their own layout: their JIT kernels run. Under AMP
``mean`` is on the float32 list, so the pooled values are summed in float32
from the bfloat16 input (no worse than bfloat16 pooling) and the tiny
``(N, C, 1, 1)`` result is cast back by the next bfloat16 layer.

Only average pooling over the whole input (``global_pool=True``,
``pool_type='avg'``) in a channels-first layout takes the route; max pooling
keeps oneDNN's (``max``'s gradient goes to every tied maximum, pooling's to
one), and so does everything else. :func:`mxfp16.amp.lists.init_amp` puts
:func:`global_average_as_mean` around ``mx.nd.Pooling`` and
``mx.sym.Pooling`` for bfloat16; a float32 run without AMP is MXNet's own.
"""
from .wrappers import module_of, named_like

__all__ = ["global_average_as_mean", "routed"]


def routed(kwargs):
    """Whether a ``Pooling`` call with these arguments takes the ``mean`` route.

    Global (``global_pool`` true) average pooling in a channels-first
    layout (``layout`` unset, ``NCW``, ``NCHW`` or ``NCDHW``).
    """
    return (str(kwargs.get("global_pool", False)).strip().lower() in ("true", "1")
            and str(kwargs.get("pool_type", "max")) == "avg"
            and kwargs.get("layout") in (None, "None", "NCW", "NCHW", "NCDHW"))


def global_average_as_mean(f):
    """``f`` (``Pooling``), with global average pooling computed as ``mean`` (see the module docstring).

    ``mean`` is looked up when the layer is called (``mx.nd`` or ``mx.sym``
    by its input), so under AMP it is AMP's: float32.
    """

    def pooling(*args, **kwargs):
        data = args[0] if args else kwargs.get("data")
        if data is None or len(args) > 1 or not routed(kwargs):
            return f(*args, **kwargs)
        F = module_of(data)
        # Every axis but batch and channel, whatever the input's rank: the output keeps them as 1 (Pooling's shape).
        return F.mean(data, axis=(0, 1), exclude=True, keepdims=True, name=kwargs.get("name"))

    return named_like(pooling, f, "Pooling")
