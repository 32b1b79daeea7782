"""The numbers behind float16, bfloat16 and float32, derived from each format's bit layout.

numpy has no bfloat16 type, so MXNet's own is :data:`BFLOAT16`. What MXNet's
float32 -> bfloat16 cast does with bfloat16's *subnormals* depends on the
CPU, so it is measured: :func:`measure_bfloat16_cast`.
"""
import functools
from dataclasses import asdict, dataclass

import numpy as np

from .machine import hardware
from .plumbing.output import error_line

#: MXNet 1.9.1 represents bfloat16 as this structured numpy dtype; pass it as
#: ``dtype=`` to ``mx.nd.amp_cast``.
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])


def is_bfloat16(x):
    """Whether ``x`` (a dtype, or anything with a ``dtype``: an array, a Gluon Parameter) is MXNet's bfloat16."""
    return np.dtype(x if isinstance(x, (np.dtype, type, str)) else x.dtype) == BFLOAT16


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
        return cls(name=name, bits=1 + exponent_bits + mantissa_bits, exponent_bits=exponent_bits,
                   mantissa_bits=mantissa_bits, max=(2.0 - 2.0 ** -mantissa_bits) * 2.0 ** bias,
                   smallest_normal=smallest_normal, smallest_subnormal=smallest_normal * 2.0 ** -mantissa_bits,
                   epsilon=2.0 ** -mantissa_bits)

    def spacing_at(self, value):
        """Gap between ``value`` and the next representable number above it."""
        value = abs(float(value))
        if value < self.smallest_normal:
            return self.smallest_subnormal
        return 2.0 ** (np.floor(np.log2(value)) - self.mantissa_bits)

    def as_dict(self):
        return asdict(self)


FLOAT16, FLOAT32 = (FloatFormat.from_layout(np.dtype(t).name, np.finfo(t).nexp, np.finfo(t).nmant)
                    for t in (np.float16, np.float32))
# bfloat16 is the top half of a float32: the same exponent, 7 of its 23
# mantissa bits.
BF16 = FloatFormat.from_layout("bfloat16", FLOAT32.exponent_bits, 7)

FORMATS = {f.name: f for f in (FLOAT16, BF16, FLOAT32)}


def format_scale(scale):
    """A number (a loss scale, a value a cast changes) as a person reads it: exactly, never rounded by ``%g``.

    Whole numbers up to 2**53 in full, other powers of two as ``2^k``, anything else with ``%g``.

    >>> format_scale(2.0 ** 24), format_scale(0.5 ** 30), format_scale(1.5)
    ('16777216', '2^-30', '1.5')
    """
    scale = float(scale)
    if np.isfinite(scale) and scale == int(scale) and abs(scale) <= 2.0 ** 53:
        return str(int(scale))
    mantissa, exponent = np.frexp(scale)
    return f"2^{int(exponent) - 1}" if mantissa == 0.5 else f"{scale:g}"


# bfloat16's subnormals through MXNet's cast: measured per CPU.

#: bfloat16 subnormals (below its smallest normal, 2**-126), each exactly representable in bfloat16, down to its
#: smallest, 2**-133: a cast that keeps subnormals returns each unchanged, one that flushes them returns 0.
SUBNORMAL_PROBES = (2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -130, 2.0 ** -133)

#: How oneDNN 2.4.4 (MXNet 1.9.1's ``amp_cast`` is a oneDNN reorder) converts float32 to bfloat16 on each class
#: of x86 CPU, and what that conversion does with subnormal inputs: ``{path: (subnormals, which code decides)}``.
#: From oneDNN's source (``cpu/x64/jit_avx512_core_bf16cvt.hpp``, ``common/bfloat16.cpp``) and Intel's SDM.
#: ``DNNL_MAX_CPU_ISA`` does not move the cast to another path: its stand-ins keep the CPU's own cast.
CAST_PATHS = {
    "avx512_bf16": ("flushed", "oneDNN converts with avx512_bf16's VCVTNEPS2BF16/VCVTNE2PS2BF16, which treat "
                               "denormal inputs as zero (Intel SDM)"),
    "avx512-emulation": ("kept", "this CPU has AVX-512 but no avx512_bf16, so oneDNN emulates VCVTNEPS2BF16 with "
                                 "AVX-512 integer arithmetic, which rounds the bits to nearest even in software and "
                                 "keeps subnormals"),
    "reference": ("flushed", "this CPU has no AVX-512, so oneDNN converts with its reference C++ code "
                             "(bfloat16_t), which sends denormals to zero"),
    "unknown": (None, "the CPU's flags cannot be read, so which conversion oneDNN uses is not known"),
}


def bfloat16_cast_path(flags=None):
    """Which of :data:`CAST_PATHS` MXNet's float32 -> bfloat16 cast takes on a CPU with ``flags``.

    Parameters
    ----------
    flags : set of str, optional
        The CPU's flags (default: ``/proc/cpuinfo``'s; ``'unknown'`` where they cannot be read).
    """
    if flags is None:
        fields = hardware.cpuinfo_fields()
        if fields is None:
            return "unknown"
        flags = set(fields.get("flags", "").split())
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if all(flag in flags for flag in hardware.AVX512_CORE_FLAGS):
        return "avx512-emulation"
    return "reference"


@dataclass(frozen=True)
class BFloat16Cast:
    """What MXNet's float32 -> bfloat16 cast (``mx.nd.amp_cast``, the cast AMP inserts) did with subnormals here.

    Attributes
    ----------
    subnormals : str
        ``'flushed'`` (every probe became 0), ``'kept'`` (every probe came back
        unchanged), ``'mixed'`` (anything else) or ``'unmeasured'`` (the cast failed).
    path : str
        The key of :data:`CAST_PATHS` the CPU's flags point to.
    expected : str or None
        What that path does with subnormals (``None`` where the flags cannot be read).
    inputs, outputs : tuple of float
        The probes and what came back (``outputs`` empty when unmeasured).
    error : str or None
        Why the cast could not be measured.
    bfloat16_runs : bool
        Whether bfloat16 arithmetic (a Dense or Convolution) runs on this CPU at all; the cast runs either way.
    bfloat16_reason : str
        Why (``BFloat16Support.reason``).
    """

    subnormals: str
    path: str
    expected: object
    inputs: tuple
    outputs: tuple
    error: object = None
    bfloat16_runs: bool = True
    bfloat16_reason: str = ""

    @property
    def flushes(self):
        return self.subnormals == "flushed"

    @property
    def decided_by(self):
        """The instruction or code that decides it, as :data:`CAST_PATHS` words it."""
        return CAST_PATHS[self.path][1]

    def sentence(self):
        """What the measurement says, in one sentence that holds on this CPU (and names what decides it)."""
        cast = "MXNet's float32 -> bfloat16 cast (amp_cast, the cast AMP inserts)"
        if self.subnormals == "unmeasured":
            text = f"{cast} could not be measured on this CPU: {self.error}."
        elif self.subnormals == "mixed":
            pairs = ", ".join(f"{a:.4g} -> {b:.4g}" for a, b in zip(self.inputs, self.outputs))
            text = f"{cast} flushes some of bfloat16's subnormals and keeps others on this CPU ({pairs})."
        else:
            what = ("flushes bfloat16's subnormals (below 2**-126) to zero" if self.flushes
                    else "keeps bfloat16's subnormals (down to 2**-133)")
            if self.expected in (None, self.subnormals):
                text = f"{cast} {what} on this CPU: {self.decided_by}."
            else:
                text = (f"{cast} {what} on this CPU, measured; its flags pointed to the path that "
                        f"{'flushes' if self.expected == 'flushed' else 'keeps'} them ({self.decided_by}), so "
                        "something else decides it here.")
        if not self.bfloat16_runs:
            text += (" The cast runs here, but bfloat16 arithmetic does not" if self.subnormals != "unmeasured"
                     else " Nor does bfloat16 arithmetic run here") + f": {self.bfloat16_reason}."
        return text

    def as_dict(self):
        return dict(asdict(self), flushes=self.flushes, decided_by=self.decided_by, sentence=self.sentence())


def classify_bfloat16_cast(inputs, outputs, error=None, flags=None, support=None):
    """A :class:`BFloat16Cast` from probes and what MXNet's cast returned for them.

    Parameters
    ----------
    inputs : sequence of float
        bfloat16 subnormals, each exactly representable (:data:`SUBNORMAL_PROBES`).
    outputs : sequence of float or None
        The cast's results, in order; ``None`` with ``error`` when it failed.
    error : str, optional
    flags : set of str, optional
        The CPU's flags, for :func:`bfloat16_cast_path`.
    support : BFloat16Support, optional
        Default :func:`mxfp16.machine.hardware.bfloat16_support` (of ``flags``, when given).
    """
    inputs = tuple(float(v) for v in inputs)
    outputs = () if outputs is None else tuple(float(v) for v in np.asarray(outputs, dtype=np.float64).ravel())
    if error is not None or len(outputs) != len(inputs):
        subnormals = "unmeasured"
        error = error or f"{len(outputs)} results for {len(inputs)} probes"
    elif all(b == 0.0 for b in outputs):
        subnormals = "flushed"
    elif outputs == inputs:
        subnormals = "kept"
    else:
        subnormals = "mixed"
    path = bfloat16_cast_path(flags)
    support = support or hardware.bfloat16_support(flags)
    return BFloat16Cast(subnormals, path, CAST_PATHS[path][0], inputs, outputs, error, support.runs, support.reason)


def bfloat16_roundtrip(values):
    """``values`` through MXNet's float32 -> bfloat16 -> float32 ``amp_cast``, in this process, as float64."""
    import mxnet as mx

    x = mx.nd.array(values, dtype="float32")
    return mx.nd.amp_cast(mx.nd.amp_cast(x, dtype=BFLOAT16), dtype="float32").asnumpy().astype(np.float64)


def measure_bfloat16_cast(in_process=False, timeout=300):
    """Measure what MXNet's float32 -> bfloat16 cast does with bfloat16's subnormals on this CPU.

    The cast runs once per process and way (the CPU does not change).

    Parameters
    ----------
    in_process : bool
        Cast in this process (it loads MXNet) instead of a child process: an
        MXNet error is asynchronous and can leave the process unusable.
    timeout : float
        Seconds the child may take.

    Returns
    -------
    BFloat16Cast
        ``'unmeasured'``, with the error, when the cast fails.
    """
    outputs, error = _cast_probes(in_process, timeout)
    return classify_bfloat16_cast(SUBNORMAL_PROBES, outputs, error)


@functools.lru_cache(maxsize=None)
def _cast_probes(in_process, timeout):
    """:data:`SUBNORMAL_PROBES` through the cast: ``(outputs, None)``, or ``(None, error)``."""
    if in_process:
        try:
            return tuple(bfloat16_roundtrip(SUBNORMAL_PROBES)), None
        except Exception as err:  # MXNetError, or no MXNet: reported, not raised
            return None, f"{type(err).__name__}: {error_line(err)}"
    out, error = hardware.python_child(_probes_roundtrip, timeout)
    return (None, error) if out is None else (tuple(out), None)


def _probes_roundtrip():
    """In :func:`_cast_probes`' child: :data:`SUBNORMAL_PROBES` through the cast, as a list."""
    return bfloat16_roundtrip(SUBNORMAL_PROBES).tolist()
