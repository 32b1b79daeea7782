"""Layers given bfloat16 weights, so that they run in bfloat16 under AMP: the transposed convolutions.

AMP keeps MXNet 1.9.1's ``Deconvolution`` in float32, since its backward
crashes on a computed weight such as AMP's cast; with a bfloat16 leaf weight
it trains in bfloat16 (:mod:`mxfp16.amp.deconvolution`). The optimizer keeps
a float32 master copy of each such weight (:func:`mxfp16.optim.with_bfloat16_masters`).
"""
from .._internals import rebuild_graphs, renew_parameter_arrays
from ..float_formats import BFLOAT16
from .lists import amp_target

__all__ = ["bfloat16_deconvolution"]


def bfloat16_deconvolution(net):
    """Give each ``Conv2DTranspose`` of ``net`` bfloat16 parameters, so that it trains in bfloat16 under amp-bfloat16.

    Under AMP MXNet 1.9.1 runs transposed convolutions in float32 (the
    module docstring says why). A layer whose parameters are bfloat16
    arrays runs in bfloat16 instead
    (:func:`mxfp16.amp.deconvolution.bfloat16_weight_call`): DCGAN's
    generator layers took 70-81 ms against 120-122 ms in float32 on an
    avx512_bf16 CPU (docs/results/deconv-bf16-zen5). The optimizer keeps a
    float32 master copy of each, which :func:`mxfp16.make_trainer` (and
    :meth:`mxfp16.MixedPrecision.prepare`, which keeps these parameters in
    bfloat16) arranges when it sees them: call this before either.
    ``net.save_parameters`` then saves the bfloat16 values.

    Parameters
    ----------
    net : gluon.Block
        Initialised, with its shapes known (one batch run through it).

    Returns
    -------
    list of str
        The names of the parameters now bfloat16 (none when ``net`` has no transposed convolution).

    Raises
    ------
    RuntimeError
        AMP is not on in bfloat16 in this process, or a layer's parameters have no shapes yet.
    """
    from mxnet import gluon
    from mxnet.ndarray import amp_cast

    if amp_target() != BFLOAT16:
        raise RuntimeError("bfloat16_deconvolution needs AMP in bfloat16: create mxfp16.MixedPrecision('amp-bfloat16') "
                           "(or call mxfp16.activate) before the network; without AMP a bfloat16 weight meets "
                           "float32 data")
    layers = []
    net.apply(lambda block: layers.append(block) if isinstance(block, gluon.nn.Conv2DTranspose) else None)
    params = [param for layer in layers for param in layer.params.values()]
    unready = [param.name for param in params if not _has_values(param)]
    if unready:
        raise RuntimeError(f"{', '.join(unready)} have no values yet: initialise the network and run one batch "
                           "through it before bfloat16_deconvolution (MXNet's initialisers cannot fill a bfloat16 "
                           "parameter)")
    for layer in layers:
        # An inference pass (Gluon's shape inference) left the weight in oneDNN's blocked layout, and the cast of
        # such an array keeps its float32 layout description: the bfloat16 layer's backward then fails.
        renew_parameter_arrays(layer)
    for param in params:
        # Rounded to nearest, as AMP's casts round; Parameter.cast (NDArray.astype) would truncate.
        rounded = [amp_cast(array, dtype=BFLOAT16) for array in param.list_data()]
        param.cast(BFLOAT16)
        for array, values in zip(param.list_data(), rounded):
            values.copyto(array)
    rebuild_graphs(net)  # a traced graph declares the float32 weights; the next one declares bfloat16
    return [param.name for param in params]


def _has_values(param):
    """Whether ``param`` holds arrays (initialised, its shape known)."""
    try:
        param.list_data()
    except RuntimeError:  # not initialised, or deferred (MXNet's DeferredInitializationError is a RuntimeError)
        return False
    return True
