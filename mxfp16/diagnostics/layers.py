"""Reaching each layer's output in a Gluon network.

Gluon 1.x forward hooks see a layer's output but cannot replace it, and a hybridized network runs as one cached graph:
:func:`tap_outputs` pauses hybridization and patches each leaf's ``forward`` instead (through :mod:`mxfp16._internals`).
"""
import contextlib

from .._internals import block_children as _children
from .._internals import hybridization_paused
from .._lazy import module

mx = module("mxnet")

__all__ = ["leaf_blocks", "tap_outputs"]


def _blocks(net):
    """Every block of ``net``, itself included, depth first, once each."""
    blocks, seen = [], set()

    def visit(block):
        if id(block) not in seen:
            seen.add(id(block))
            blocks.append(block)
            for kid in _children(block):
                visit(kid)

    visit(net)
    return blocks


def leaf_blocks(net):
    """The blocks of ``net`` without children (convolutions, BatchNorm, activations ...), depth first, once each."""
    return [block for block in _blocks(net) if not _children(block)]


@contextlib.contextmanager
def tap_outputs(net, fn):
    """Within the context, every NDArray a leaf block returns becomes ``fn(block, output)``.

    Parameters
    ----------
    net : gluon.Block
        A hybridized one runs imperatively within the context (a cached graph never calls its leaves' ``forward``
        from Python), and is hybridized again afterwards.
    fn : callable
        ``fn(block, output) -> NDArray``; returns ``output`` to leave it unchanged.
    """
    leaves = leaf_blocks(net)
    patched = []
    with hybridization_paused(_blocks(net)):
        try:
            for block in leaves:
                original = block.forward

                def forward(*args, _block=block, _original=original, **kwargs):
                    out = _original(*args, **kwargs)
                    return fn(_block, out) if isinstance(out, mx.nd.NDArray) else out

                # An instance attribute shadows the class's forward; Block.__call__ looks it up on self.
                block.forward = forward
                patched.append(block)
            yield leaves
        finally:
            for block in patched:
                del block.forward
