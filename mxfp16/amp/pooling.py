"""Global average pooling computed as a ``mean``: MXNet 1.9.1's oneDNN pooling sends reference kernels its gradient.

Why, and what it gained: docs/amp-table.md ("GlobalAvgPool"). On an AMD Zen 4
the reference kernels of the pooling's and the BatchNorm's backward took 61%
of oneDNN's time in a ``cifar_resnet20_v1`` step under amp-bfloat16 (41% in
float32), for 16 to 128 channels at small sizes.

Only global average pooling in a channels-first layout takes the route
(:func:`routed`); max pooling keeps oneDNN's (``max``'s gradient goes to
every tied maximum, pooling's to one). :func:`mxfp16.amp.lists.init_amp`
puts :func:`global_average_as_mean` around ``Pooling`` for bfloat16.
"""
from .wrappers import module_of, named_like

__all__ = ["global_average_as_mean", "routed"]


def routed(kwargs):
    """Whether a ``Pooling`` call with these arguments takes the ``mean`` route: global average, channels first."""
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
