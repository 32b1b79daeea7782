"""Reaching each layer's output in a Gluon network.

Gluon 1.x forward hooks see a layer's output but cannot replace it, and a
hybridized network runs as one cached graph in which no Python code sees
per-layer outputs. So, for a network that is not hybridized, this module
temporarily replaces each leaf block's ``forward`` with one that passes the
output through a function, and restores the original afterwards.

The two private Gluon attributes this needs (a block's children, whether
``hybridize()`` took effect) are read through :mod:`mxfp16._internals`.
"""
import contextlib

import mxnet as mx

from .._internals import block_children as _children
from .._internals import block_is_hybridized as _hybridized

__all__ = ["leaf_blocks", "tap_outputs"]


def leaf_blocks(net):
    """The blocks of ``net`` without children (convolutions, BatchNorm, activations ...), depth first, once each."""
    leaves, seen = [], set()

    def visit(block):
        if id(block) in seen:
            return
        seen.add(id(block))
        kids = _children(block)
        if not kids:
            leaves.append(block)
        for kid in kids:
            visit(kid)

    visit(net)
    return leaves


@contextlib.contextmanager
def tap_outputs(net, fn):
    """Within the context, every NDArray a leaf block returns becomes ``fn(block, output)``.

    Parameters
    ----------
    net : gluon.Block
        Must not be hybridized (a hybridized network never calls its leaves'
        ``forward`` from Python).
    fn : callable
        ``fn(block, output) -> NDArray``; returns ``output`` to leave it unchanged.

    Raises
    ------
    ValueError
        ``net`` is hybridized.
    """
    leaves = leaf_blocks(net)
    if any(_hybridized(block) for block in [net] + leaves):
        raise ValueError(f"{net.name} is hybridized, so its layers run inside one cached graph and cannot be "
                         "inspected one by one; build the network again without calling hybridize()")
    patched = []
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
