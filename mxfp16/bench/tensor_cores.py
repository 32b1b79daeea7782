"""Which layers miss float16 tensor cores: channel, unit and batch counts that are not multiples of 8.

Volta and later GPUs run float16 matrix products on tensor cores only when
the matrix dimensions (convolution input/output channels, dense input/output
units, and the batch) are multiples of 8; other shapes fall back to slower
kernels or pay for padding.
"""
import mxnet as mx
from mxnet import gluon

from .._internals import block_op_kwargs

MULTIPLE = 8
_CONVOLUTIONS = (gluon.nn.Conv1D, gluon.nn.Conv2D, gluon.nn.Conv3D,
                 gluon.nn.Conv1DTranspose, gluon.nn.Conv2DTranspose, gluon.nn.Conv3DTranspose)


def _layer_shapes(net):
    """``(name, kind, in, out)`` for each Conv and Dense layer, from its (initialised) weight; grouped convolutions
    report their total input channels."""
    rows = []

    def visit(block):
        if isinstance(block, gluon.nn.Dense):
            shape = block.weight.shape
            rows.append((block.name, "Dense", int(shape[1]), int(shape[0])))
        elif isinstance(block, _CONVOLUTIONS):
            shape, groups = block.weight.shape, block_op_kwargs(block).get("num_group", 1)
            transposed = "Transpose" in type(block).__name__
            n_in, n_out = (shape[0], shape[1] * groups) if transposed else (shape[1] * groups, shape[0])
            rows.append((block.name, "Conv", int(n_in), int(n_out)))

    net.apply(visit)
    return rows


def tensor_core_report(net, batch_size, sample_shape=None):
    """Layers and batch size that miss tensor cores.

    Parameters
    ----------
    net : gluon.Block
        Initialised. Layers with deferred shapes are completed by one forward
        pass of a zero batch of ``sample_shape``.
    batch_size : int or sequence of int
    sample_shape : tuple, optional
        One input without the batch axis, e.g. ``(3, 224, 224)``; needed only
        when some shapes are still unknown.

    Returns
    -------
    dict
        ``{"multiple": 8, "layers": n, "misaligned": [{"name", "kind", "in", "out"}, ...],
        "batch_sizes": {bs: bool multiple-of-8}, "aligned": bool}``.
    """
    if sample_shape is not None and any(0 in p.shape for p in net.collect_params().values() if p.shape):
        net(mx.nd.zeros((1,) + tuple(sample_shape)))
    rows = _layer_shapes(net)
    misaligned = [{"name": name, "kind": kind, "in": n_in, "out": n_out}
                  for name, kind, n_in, n_out in rows if n_in % MULTIPLE or n_out % MULTIPLE]
    sizes = [batch_size] if isinstance(batch_size, int) else list(batch_size)
    batches = {int(bs): int(bs) % MULTIPLE == 0 for bs in sizes}
    return {"multiple": MULTIPLE, "layers": len(rows), "misaligned": misaligned, "batch_sizes": batches,
            "aligned": not misaligned and all(batches.values())}


def format_report(report, model=""):
    """The report as text lines for the terminal."""
    head = f"Tensor cores (float16 on Volta+ needs multiples of {report['multiple']})" + (f", {model}" if model else "")
    lines = [head + f": {report['layers']} Conv/Dense layers, {len(report['misaligned'])} misaligned"]
    for row in report["misaligned"]:
        lines.append(f"  {row['kind']:<5} {row['name']:<32} in {row['in']:>5}  out {row['out']:>5}")
    for bs, ok in report["batch_sizes"].items():
        lines.append(f"  batch size {bs}: {'multiple of 8' if ok else 'NOT a multiple of 8'}")
    return "\n".join(lines)


def model_tensor_core_report(model, classes, image_size, batch_sizes):
    """:func:`tensor_core_report` for a model by name, built here in float32 (no AMP in this process)."""
    from ..models import build_model

    net = build_model(model, classes, in_shape=(3, image_size, image_size))
    return tensor_core_report(net, list(batch_sizes))


def family_tensor_core_report(name, options, batch_sizes):
    """:func:`tensor_core_report` over a benchmark family's networks (both of the GAN's), built in float32."""
    from .family_steps import build_networks

    networks = gluon.nn.Sequential()
    networks.add(*build_networks(name, options).values())
    return tensor_core_report(networks, list(batch_sizes))
