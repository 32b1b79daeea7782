"""The one rule a measurement decides by: bfloat16 is chosen only when it is :data:`MARGIN` times as fast.

``auto`` (:mod:`mxfp16.measure.auto`) compares a network's training step in
float32 and in amp-bfloat16; the ``measured`` lists
(:mod:`mxfp16.measure.per_layer`) compare each layer. Both read a ratio
(:func:`speed_ratio`) and keep bfloat16 only when :func:`pays` says so.
"""
__all__ = ["MARGIN", "speed_ratio", "pays", "requirement"]

#: bfloat16 must be at least this much faster than float32 to be chosen: a tie, or a gain inside the
#: run-to-run spread of a short measurement, keeps float32 (the same speed with no bfloat16 rounding to explain).
MARGIN = 1.05


def speed_ratio(float32_ms, bfloat16_ms):
    """float32's time over bfloat16's (above 1, bfloat16 is faster); ``None`` where either is missing or zero."""
    return float32_ms / bfloat16_ms if float32_ms and bfloat16_ms else None


def pays(ratio):
    """Whether a measured ``ratio`` (:func:`speed_ratio`) is enough to choose bfloat16."""
    return ratio is not None and ratio >= MARGIN


def requirement(what="bfloat16"):
    """The rule in words, for a verdict's reason: ``'bfloat16 must be 1.05x as fast as float32'``."""
    return f"{what} must be {MARGIN:.2f}x as fast as float32"
