"""``clip`` computed as ``maximum(minimum(x, a_max), a_min)``: MXNet 1.9.1's own ``clip`` is slow on CPUs.

MobileNet's ReLU6 is ``F.clip(x, 0, 6)`` in GluonCV, and MXNet's ``clip``
and its backward took most of MobileNet v2's step (in float32 under mxfp16's
lists: :data:`mxfp16.amp.lists.SLOW_IN_BFLOAT16`). The two scalar operators,
both in AMP's float32 list, give the same values and gradient (ties
included) in about a third of the time on a Zen 5
(docs/results/clip-route-zen5). :func:`mxfp16.amp.lists.init_amp` puts
:func:`clip_as_minimum_maximum` around ``clip`` where its lists run it in float32.
"""
from .wrappers import module_of, named_like

__all__ = ["clip_as_minimum_maximum"]


def clip_as_minimum_maximum(f):
    """``f`` (``clip``), computed by ``minimum`` and ``maximum`` with a scalar (see the module docstring).

    A call writing into ``out=``, or without both bounds, is ``f``'s own; a
    ``name`` is dropped (``mx.sym.maximum`` takes none). The operators are
    looked up at the call, so under AMP they are AMP's: float32.
    """
    names = ("data", "a_min", "a_max")

    def clip(*args, **kwargs):
        given = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
        rest = {k: v for k, v in kwargs.items() if k not in names}
        if len(args) > 3 or set(rest) - {"name"} or any(given.get(k) is None for k in names):
            return f(*args, **kwargs)
        F = module_of(given["data"])
        return F.maximum(F.minimum(given["data"], float(given["a_max"])), float(given["a_min"]))

    return named_like(clip, f, "clip")
