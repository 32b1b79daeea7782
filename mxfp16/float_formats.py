"""The numbers behind float16, bfloat16 and float32.

Every figure here is derived from a format's bit layout (exponent and
mantissa widths), and the widths of float16 and float32 are read from numpy's
``finfo`` rather than typed in. bfloat16 has float32's exponent and 7 mantissa
bits; numpy has no bfloat16 type, so MXNet's own bfloat16 dtype is exposed as
:data:`BFLOAT16` for casts, and the tests check the derived figures against
MXNet's cast.
"""
from dataclasses import asdict, dataclass

import numpy as np

#: MXNet 1.9.1 represents bfloat16 as this structured numpy dtype; pass it as
#: ``dtype=`` to ``mx.nd.amp_cast``.
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])


@dataclass(frozen=True)
class FloatFormat:
    """Range and precision of a binary floating-point format.

    Attributes
    ----------
    name : str
        ``'float16'``, ``'bfloat16'`` or ``'float32'``.
    bits, exponent_bits, mantissa_bits : int
        Storage width and field widths (the mantissa excludes the implicit bit).
    max : float
        Largest finite value.
    smallest_normal : float
        Smallest positive normal value.
    smallest_subnormal : float
        Smallest positive value (a subnormal).
    epsilon : float
        Distance from 1.0 to the next representable value.
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    epsilon: float

    @classmethod
    def from_layout(cls, name, exponent_bits, mantissa_bits):
        """Derive every figure of an IEEE-754-style format from its field widths."""
        bias = 2 ** (exponent_bits - 1) - 1
        smallest_normal = 2.0 ** (1 - bias)
        return cls(
            name=name,
            bits=1 + exponent_bits + mantissa_bits,
            exponent_bits=exponent_bits,
            mantissa_bits=mantissa_bits,
            max=(2.0 - 2.0 ** -mantissa_bits) * 2.0 ** bias,
            smallest_normal=smallest_normal,
            smallest_subnormal=smallest_normal * 2.0 ** -mantissa_bits,
            epsilon=2.0 ** -mantissa_bits,
        )

    def spacing_at(self, value):
        """Gap between ``value`` and the next representable number above it."""
        value = abs(float(value))
        if value < self.smallest_normal:
            return self.smallest_subnormal
        return 2.0 ** (np.floor(np.log2(value)) - self.mantissa_bits)

    def as_dict(self):
        return asdict(self)


def _from_numpy(dtype):
    info = np.finfo(dtype)
    return FloatFormat.from_layout(np.dtype(dtype).name, info.nexp, info.nmant)


FLOAT16 = _from_numpy(np.float16)
FLOAT32 = _from_numpy(np.float32)
# bfloat16 is the top half of a float32: the same exponent, 7 of its 23
# mantissa bits.
BF16 = FloatFormat.from_layout("bfloat16", FLOAT32.exponent_bits, 7)

FORMATS = {f.name: f for f in (FLOAT16, BF16, FLOAT32)}


def format_scale(scale):
    """A loss scale as a person reads it: exactly, never rounded by ``%g``.

    ``%g`` prints 2**24 as ``1.67772e+07``, which is neither the number nor
    recognisably a power of two. Whole numbers up to 2**53 (every float64
    integer is exact there) print in full, other powers of two as ``2^k``,
    anything else with ``%g``.

    >>> format_scale(2.0 ** 24), format_scale(0.5 ** 30), format_scale(1.5)
    ('16777216', '2^-30', '1.5')
    """
    scale = float(scale)
    if np.isfinite(scale) and scale == int(scale) and abs(scale) <= 2.0 ** 53:
        return str(int(scale))
    mantissa, exponent = np.frexp(scale)
    if mantissa == 0.5:
        return f"2^{int(exponent) - 1}"
    return f"{scale:g}"
