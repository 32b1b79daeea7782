"""Which GPUs a build runs on, from the kernels it carries.

Two rules of CUDA decide it (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"; docs/gpu.md,
"Which GPUs run it"): SASS for ``sm_XY`` runs on compute capability ``X.Z`` with ``Z >= Y``; PTX for ``compute_XY``
is compiled by the driver for any GPU of capability ``X.Y`` or later. A GPU is *native* when some cubin fits it, *PTX
JIT* when none does but some PTX is old enough, and *unsupported* otherwise (every MXNet operator then fails with "no
kernel image is available for execution on the device"). The ``mxnet-cu112`` 1.9.1 wheel's kernels are in
:mod:`mxfp16.machine.gpu.wheel_kernels`.
"""
from dataclasses import dataclass
from importlib import metadata

from . import wheel_kernels

__all__ = ["GENERATIONS", "Coverage", "parse_capability", "classify", "wheel_coverage", "generation_table",
           "table_applies", "gpu_support"]

#: GPU generations and their compute capabilities.
GENERATIONS = (
    ("Kepler", ("3.0", "3.2", "3.5", "3.7")),
    ("Maxwell", ("5.0", "5.2", "5.3")),
    ("Pascal", ("6.0", "6.1", "6.2")),
    ("Volta", ("7.0", "7.2")),
    ("Turing", ("7.5",)),
    ("Ampere", ("8.0", "8.6", "8.7")),
    ("Ada Lovelace", ("8.9",)),
    ("Hopper", ("9.0",)),
    ("Blackwell", ("10.0", "10.3", "11.0", "12.0", "12.1")),
)

NATIVE, PTX_JIT, UNSUPPORTED = "native", "ptx-jit", "unsupported"


@dataclass(frozen=True)
class Coverage:
    """How one compute capability runs a build.

    Attributes
    ----------
    capability : str
        ``'8.6'``.
    status : str
        ``'native'``, ``'ptx-jit'`` or ``'unsupported'``.
    detail : str
        Which kernels serve it, or why none does.
    """

    capability: str
    status: str
    detail: str

    def as_dict(self):
        return {"capability": self.capability, "status": self.status, "detail": self.detail}


def parse_capability(text):
    """``'8.6'`` -> ``(8, 6)``; ``86`` (an architecture number) -> ``(8, 6)``; ``120`` -> ``(12, 0)``."""
    if isinstance(text, int):
        return divmod(text, 10)
    major, _, minor = str(text).strip().partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(f"compute capability {text!r} is not of the form '8.6'") from None


def classify(capability, sass, ptx):
    """Classify a GPU's compute capability against a build's kernels.

    Parameters
    ----------
    capability : str
        ``'8.6'``, as ``nvidia-smi --query-gpu=compute_cap`` prints it.
    sass, ptx : iterable of int
        Architecture numbers with cubins / with PTX (86 = sm_86).

    Returns
    -------
    Coverage
    """
    cap = parse_capability(capability)
    name = f"{cap[0]}.{cap[1]}"
    fitting = sorted(a for a in sass if parse_capability(a)[0] == cap[0] and parse_capability(a) <= cap)
    if fitting:
        return Coverage(name, NATIVE, f"sm_{fitting[-1]} SASS")
    older_ptx = sorted(a for a in ptx if parse_capability(a) <= cap)
    if older_ptx:
        return Coverage(name, PTX_JIT, f"compute_{older_ptx[-1]} PTX, compiled by the driver at load time "
                                       "(slow first start)")
    everything = sorted(list(sass) + list(ptx), key=parse_capability)
    if everything and parse_capability(everything[0]) > cap:
        why = f"older than the oldest kernels (sm_{everything[0]})"
    elif not ptx:
        why = f"no sm_{cap[0]}x SASS and no PTX to compile"
    else:
        why = f"no sm_{cap[0]}x SASS and only newer PTX"
    return Coverage(name, UNSUPPORTED, why)


def wheel_coverage(capability):
    """:func:`classify` against the ``mxnet-cu112`` 1.9.1 wheel's kernels (:mod:`mxfp16.machine.gpu.wheel_kernels`)."""
    return classify(capability, wheel_kernels.SASS, wheel_kernels.PTX)


def generation_table(sass=None, ptx=None):
    """One row per generation and capability: ``(generation, Coverage)``, of the wheel's kernels by default."""
    sass = wheel_kernels.SASS if sass is None else sass
    ptx = wheel_kernels.PTX if ptx is None else ptx
    return [(generation, classify(cap, sass, ptx)) for generation, caps in GENERATIONS for cap in caps]


def table_applies():
    """Whether the installed MXNet is the wheel :mod:`mxfp16.machine.gpu.wheel_kernels` was read from, by name and
    version (another CUDA build needs its own table: ``python tools/gpu/fatbin.py`` in a source checkout)."""
    try:
        return metadata.version(wheel_kernels.SOURCE["distribution"]) == wheel_kernels.SOURCE["version"]
    except metadata.PackageNotFoundError:
        return False


def gpu_support(gpus):
    """How each GPU runs the installed build, for ``mxfp16 info``.

    Parameters
    ----------
    gpus : list of dict
        The ``gpus`` rows of :func:`mxfp16.machine.hardware.machine_summary` (``index``,
        ``compute_capability``).

    Returns
    -------
    list of dict
        ``index``, ``capability``, ``status`` (:class:`Coverage`'s, or ``'unknown'``) and ``detail``.
    """
    rows = []
    for gpu in gpus:
        cap = gpu.get("compute_capability")
        if not cap:
            row = {"capability": None, "status": "unknown", "detail": "compute capability unknown (no nvidia-smi)"}
        elif not table_applies():
            row = {"capability": cap, "status": "unknown",
                   "detail": "no kernel table for this MXNet build: python tools/gpu/fatbin.py <its libmxnet.so> "
                             "(in a source checkout of mxfp16)"}
        else:
            row = wheel_coverage(cap).as_dict()
        rows.append({"index": gpu["index"], **row})
    return rows


def support_table_markdown(sass=None, ptx=None):
    """The docs' support table (``docs/gpu.md``), as Markdown; a test keeps the page equal to it."""
    marks = {NATIVE: "native", PTX_JIT: "PTX JIT only", UNSUPPORTED: "**no**"}
    lines = ["| generation | compute capability | runs mxnet-cu112 1.9.1 | why |", "| --- | --- | --- | --- |"]
    for generation, cov in generation_table(sass, ptx):
        lines.append(f"| {generation} | {cov.capability} | {marks[cov.status]} | {cov.detail} |")
    return "\n".join(lines)
