"""Layers timed alone, in a fresh process: what the ``measured`` AMP lists decide by.

Each :class:`LayerSpec` is timed forward and backward in float32 and in
bfloat16 as AMP runs it inside a bfloat16 part of the network, through
:func:`mxfp16.measure.timing.time_steps`; casting the data in and out is
timed apart (:class:`LayerTiming`). The choice is
:mod:`mxfp16.measure.per_layer`.
"""
import json
from dataclasses import asdict, dataclass

from ..plumbing.output import error_line
from .margin import speed_ratio

__all__ = ["LayerSpec", "LayerTiming", "time_layers", "time_keys", "WARMUP", "ITERS", "REPEATS", "TIMEOUT"]

#: Per layer and precision: untimed calls, then repeats of a few timed calls each.
WARMUP, ITERS, REPEATS = 2, 3, 3
#: Seconds the timing process may take before it is stopped (its layers then stay bfloat16: nothing measured).
TIMEOUT = 1800.0


@dataclass(frozen=True)
class LayerSpec:
    """One operator type-and-shape: what is timed and cached.

    Attributes
    ----------
    op : str
    attrs : tuple
        ``((argument, str(value)), ...)``, sorted: the node's attributes.
    shapes : tuple
        Each input's shape (data, weight, bias).
    """

    op: str
    attrs: tuple
    shapes: tuple

    @classmethod
    def of(cls, op, attrs, shapes):
        return cls(op, tuple(sorted(attrs.items())), tuple(tuple(int(d) for d in s) for s in shapes))

    @property
    def key(self):
        return json.dumps({"op": self.op, "attrs": dict(self.attrs), "shapes": [list(s) for s in self.shapes]},
                          sort_keys=True)

    @classmethod
    def from_key(cls, key):
        doc = json.loads(key)
        return cls.of(doc["op"], doc["attrs"], doc["shapes"])


@dataclass(frozen=True)
class LayerTiming:
    """Milliseconds per forward and backward call of one :class:`LayerSpec`, or why it was not timed.

    Attributes
    ----------
    float32_ms, bfloat16_ms : float or None
        bfloat16: with bfloat16 data in and out, the weight and bias cast at the call (as AMP runs it).
    casts_ms : float or None
        Casting the data in and the output out, what a layer between float32 neighbours adds.
    failed : str or None
        Why bfloat16 (or float32) could not be timed: the layer stays float32 when bfloat16 failed.
    """

    float32_ms: object = None
    bfloat16_ms: object = None
    casts_ms: object = None
    failed: object = None

    @property
    def ratio(self):
        """float32's time over bfloat16's: above 1, bfloat16 is faster."""
        return None if self.failed else speed_ratio(self.float32_ms, self.bfloat16_ms)

    def record(self):
        return asdict(self)


def time_layers(specs, timeout=TIMEOUT):
    """Time each spec in a fresh process (AMP off there; each operator given its dtypes): ``{key: LayerTiming}``.
    Should that process die (a kernel that crashes it), each spec is timed again in a process of its own, and the one
    that died is recorded as failed: its layers stay float32."""
    from ..plumbing.child import call_in_child

    record, why = call_in_child(time_keys, [s.key for s in specs], timeout=timeout)
    if record is not None:
        return {key: LayerTiming(**value) for key, value in record.items()}
    if len(specs) == 1:
        lines = why.strip().splitlines()  # a traceback ends with its exception; a crash starts with its status
        line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
        return {specs[0].key: LayerTiming(failed=f"the timing process ended: {line}")}
    return {key: timing for spec in specs for key, timing in time_layers([spec], timeout).items()}


def time_keys(keys):
    """``{key: LayerTiming.record()}`` of :class:`LayerSpec` keys, timed here (a process without AMP on)."""
    return {key: _time_spec(LayerSpec.from_key(key)).record() for key in keys}


def _time_spec(spec):
    """:class:`LayerTiming` of one spec, in this process (which must not have AMP on)."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd
    from mxnet.contrib.amp.amp import bfloat16

    from .timing import time_steps

    op, attrs = getattr(mx.nd, spec.op), dict(spec.attrs)
    rng = np.random.RandomState(0)
    arrays = [mx.nd.array(rng.uniform(-1, 1, shape)) for shape in spec.shapes]
    for a in arrays:
        a.attach_grad()

    def timed(step):
        return time_steps(step, ITERS, REPEATS, WARMUP).ms_per_step

    def float32_step():
        with autograd.record():
            out = op(*arrays, **attrs)
        out.backward()
        return arrays[1].grad

    out_shape = op(*arrays, **attrs).shape
    float32_ms = timed(float32_step)
    data16 = mx.nd.amp_cast(arrays[0], dtype=bfloat16)
    data16.attach_grad()

    def bfloat16_step():
        with autograd.record():
            out = op(data16, *[mx.nd.amp_cast(a, dtype=bfloat16) for a in arrays[1:]], **attrs)
        out.backward()
        return arrays[1].grad

    out16 = mx.nd.amp_cast(mx.nd.ones(out_shape), dtype=bfloat16)
    out16.attach_grad()

    def casts_step():
        with autograd.record():
            cast_in = mx.nd.amp_cast(arrays[0], dtype=bfloat16)
            cast_out = mx.nd.amp_cast(out16, dtype="float32")
        autograd.backward([cast_in, cast_out])
        return arrays[0].grad

    try:
        bfloat16_ms = timed(bfloat16_step)
    except mx.MXNetError as err:
        return LayerTiming(float32_ms, failed=error_line(err)[:200])
    return LayerTiming(float32_ms, bfloat16_ms, timed(casts_step))
