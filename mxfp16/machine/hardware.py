"""What this machine can do: MXNet build, GPUs, CPU bfloat16 support.

Everything is read live (MXNet's runtime features, ``/proc/cpuinfo``, ``nvidia-smi``), nothing assumed from the
package that was installed. The CPU half (flags, identity, :func:`bfloat16_support`) does not load MXNet, so
``import mxfp16`` can read it before MXNet loads; the MXNet half imports it on first use.
"""
import contextlib
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass

from .cpuinfo import cpu_flags, cpuinfo_fields

#: CPU flags that give native bfloat16 arithmetic to oneDNN.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
#: Every bfloat16-relevant flag, as /proc/cpuinfo names it where the kernel reports it: AVX-512 bfloat16 dot
#: products, AMX's bfloat16 tile multiply and the tile registers it needs, and AVX-NE-CONVERT's conversions.
BF16_INSTRUCTION_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx_ne_convert")

_INTEL, _AMD = "GenuineIntel", "AuthenticAMD"
#: (vendor, family, models, steppings or None for any, name) for the server CPUs whose bfloat16 support
#: decides what ``auto`` and oneDNN do. Sources: Intel, Linux's arch/x86/include/asm/intel-family.h; its model
#: 0x55 is Skylake SP, Cascade Lake (stepping 7 there) or Cooper Lake (stepping 11) by stepping, and Intel's
#: microcode release notes (intel/Intel-Linux-Processor-Microcode-Data-Files) list SKX-SP as 06-55-03/04,
#: CLX-SP as 06-55-06/07 and CPX-SP as 06-55-0b. AMD, Linux's arch/x86/kernel/cpu/amd.c, bsp_init_amd(),
#: which sets its ZEN3/ZEN4/ZEN5 feature by model range. Anything else is ``None``: the table names CPUs, it
#: does not guess them.
MICROARCHITECTURES = (
    (_INTEL, 6, range(0x55, 0x56), range(0, 5), "Skylake SP"),      # no bfloat16
    (_INTEL, 6, range(0x55, 0x56), range(5, 8), "Cascade Lake"),    # no bfloat16
    (_INTEL, 6, range(0x55, 0x56), range(10, 12), "Cooper Lake"),   # avx512_bf16
    (_INTEL, 6, range(0x6A, 0x6B), None, "Ice Lake SP"),            # no bfloat16
    (_INTEL, 6, range(0x6C, 0x6D), None, "Ice Lake D"),             # no bfloat16
    (_INTEL, 6, range(0x8F, 0x90), None, "Sapphire Rapids"),        # avx512_bf16, AMX
    (_INTEL, 6, range(0xCF, 0xD0), None, "Emerald Rapids"),         # avx512_bf16, AMX
    (_INTEL, 6, range(0xAD, 0xAE), None, "Granite Rapids"),         # avx512_bf16, AMX
    (_INTEL, 6, range(0xAE, 0xAF), None, "Granite Rapids D"),       # avx512_bf16, AMX
    (_INTEL, 6, range(0xAF, 0xB0), None, "Sierra Forest"),          # no AVX-512, no AMX
    (_INTEL, 19, range(0x01, 0x02), None, "Diamond Rapids"),
    (_AMD, 0x19, range(0x00, 0x10), None, "Zen 3"),                 # no bfloat16
    (_AMD, 0x19, range(0x20, 0x60), None, "Zen 3"),
    (_AMD, 0x19, range(0x10, 0x20), None, "Zen 4"),                 # avx512_bf16
    (_AMD, 0x19, range(0x60, 0xB0), None, "Zen 4"),
    (_AMD, 0x1A, range(0x00, 0x30), None, "Zen 5"),                 # avx512_bf16
    (_AMD, 0x1A, range(0x40, 0x50), None, "Zen 5"),
    (_AMD, 0x1A, range(0x60, 0x80), None, "Zen 5"),
)


def cpu_model():
    """The CPU's brand string (``model name``), or the platform's description where there is no /proc/cpuinfo."""
    name = (cpuinfo_fields() or {}).get("model name")
    return name or platform.processor() or platform.machine()


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def microarchitecture(vendor, family, model, stepping=None):
    """The name :data:`MICROARCHITECTURES` gives ``(vendor, family, model, stepping)``, or ``None`` when unknown.

    Only as good as what the CPU reports: a VM may report another family and model than its host's (one of this
    project's Intel VMs reports Rocket Lake, a desktop CPU without AMX, while its flags list ``amx_bf16``).
    """
    for known_vendor, known_family, models, steppings, name in MICROARCHITECTURES:
        if (vendor, family) == (known_vendor, known_family) and model in models and \
                (steppings is None or stepping in steppings):
            return name
    return None


def _platform_fields():
    """Vendor, family, model and stepping as /proc/cpuinfo names them, from Windows' description of the CPU.

    E.g. ``Intel64 Family 6 Model 143 Stepping 8, GenuineIntel``; elsewhere (macOS) only a name is known.
    """
    found = re.search(r"Family (\d+) Model (\d+) Stepping (\d+), (\w+)", platform.processor() or "")
    return dict(zip(("cpu family", "model", "stepping", "vendor_id"), found.groups())) if found else {}


def cpu_identity(path=None):
    """Which CPU this is, as far as it says: the facts a speed ratio depends on.

    Parameters
    ----------
    path : str, optional
        The ``/proc/cpuinfo`` to read (default ``/proc/cpuinfo``); where it cannot be read (macOS, Windows) the
        platform's description is used.

    Returns
    -------
    dict
        ``vendor``, ``model_name`` (the brand string), ``family``, ``model`` and ``stepping`` (ints),
        ``bfloat16_instructions`` (the flags of :data:`BF16_INSTRUCTION_FLAGS` present) and ``microarchitecture``
        (:func:`microarchitecture`); ``None`` where unknown.
    """
    fields = cpuinfo_fields(path)
    flags = None if fields is None else cpu_flags(path) or set()  # no flags to read: unknown, not absent
    fields = _platform_fields() if fields is None else fields
    identity = {"vendor": fields.get("vendor_id"),
                "model_name": fields.get("model name") or platform.processor() or platform.machine() or None,
                "family": _int(fields.get("cpu family")), "model": _int(fields.get("model")),
                "stepping": _int(fields.get("stepping")),
                "bfloat16_instructions": None if flags is None else [f for f in BF16_INSTRUCTION_FLAGS if f in flags]}
    identity["microarchitecture"] = microarchitecture(identity["vendor"], identity["family"], identity["model"],
                                                      identity["stepping"])
    return identity


def describe_cpu(cpu):
    """:func:`cpu_identity` in one line for a terminal.

    E.g. ``AMD EPYC (AuthenticAMD family 26 model 2, microarchitecture Zen 5;
    bfloat16 instructions: avx512_bf16)``.
    """
    known = [cpu.get("vendor")] + [f"{name} {cpu[name]}" for name in ("family", "model") if cpu.get(name) is not None]
    where = " ".join(part for part in known if part)
    arch = f"microarchitecture {cpu.get('microarchitecture') or 'unknown'}"
    units = cpu.get("bfloat16_instructions")
    units = "unknown" if units is None else ", ".join(units) or "none"
    inside = ", ".join(part for part in (where, arch) if part)
    return f"{cpu.get('model_name') or 'unknown CPU'} ({inside}; bfloat16 instructions: {units})"


def cpu_bfloat16_support():
    """Which native bfloat16 flags the CPU has, e.g. ``{'avx512_bf16': True, 'amx_bf16': False}`` (all ``False``
    where the flags cannot be read)."""
    flags = cpu_flags() or set()
    return {flag: flag in flags for flag in BF16_CPU_FLAGS}


#: The AVX-512 subsets of oneDNN's ``avx512_core`` level (Skylake-SP and later). Below it the oneDNN 2.4.4 in
#: MXNet 1.9.1 has no bfloat16 path at all, neither native nor emulated: a Dense or Convolution with a
#: bfloat16 input fails with "could not create a primitive descriptor iterator".
AVX512_CORE_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
#: ``DNNL_MAX_CPU_ISA`` values (oneDNN 2.4.4 reads them exactly so spelled) that cap oneDNN below each level.
ISA_BELOW_AVX512_CORE = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_MIC", "AVX512_MIC_4OPS")
ISA_BELOW_NATIVE = ISA_BELOW_AVX512_CORE + ("AVX512_CORE", "AVX512_CORE_VNNI")

#: The CPU classes that decide what mxfp16's bfloat16 does, by instruction set, from least to most; every
#: CPU-dependent statement (``mxfp16 info``, the test suite's markers and failure reports, the benchmark's
#: results folder) names one of these. Below AVX2 (or without flags to read) a CPU is ``other``.
CPU_CLASSES = {
    "AVX2": "AVX2, no AVX-512: MXNet's bfloat16 does not run",
    "AVX-512": "AVX-512 without bfloat16 instructions: bfloat16 emulated, slower than float32",
    "avx512_bf16": "AVX-512 with avx512_bf16: native bfloat16 dot products",
    "AMX": "AMX bfloat16 tiles (amx_bf16, amx_tile) beside avx512_bf16",
    "other": "no AVX2, or flags that cannot be read",
}


def cpu_class(flags=None):
    """This CPU's class (a key of :data:`CPU_CLASSES`), read from its flags alone: ``DNNL_MAX_CPU_ISA`` or AMX's
    tile permission change what oneDNN uses (:func:`bfloat16_support`), not what the CPU is.

    Parameters
    ----------
    flags : set of str, optional
        Default ``/proc/cpuinfo``'s.
    """
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return "other"
    if all(flag in flags for flag in AVX512_CORE_FLAGS):
        if "amx_bf16" in flags and "amx_tile" in flags:
            return "AMX"
        return "avx512_bf16" if "avx512_bf16" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else "other"


#: What each :attr:`BFloat16Support.kind` means for MXNet 1.9.1's AMP on a CPU.
BFLOAT16_KINDS = {
    "amx": "native bfloat16 on AMX tiles and avx512_bf16",
    "native": "native bfloat16 (avx512_bf16)",
    "emulated": "runs, emulated with AVX-512 (no bfloat16 instructions)",
    "none": "does not run",
    "unknown": "unknown (the CPU's flags cannot be read)",
}


@dataclass(frozen=True)
class BFloat16Support:
    """Whether, and how, MXNet 1.9.1's bfloat16 runs on this CPU.

    Attributes
    ----------
    kind : str
        A key of :data:`BFLOAT16_KINDS`.
    reason : str
        Why, naming the instructions or the setting that decide it.
    missing : tuple of str
        CPU flags whose absence decides ``kind`` (empty when a setting decides it).
    amx : str or None
        The state :mod:`mxfp16.machine.amx` left AMX bfloat16 in (``'in-use'``, ``'refused'`` ...), if the CPU has it.
    """

    kind: str
    reason: str
    missing: tuple = ()
    amx: object = None

    @property
    def runs(self):
        """Whether a bfloat16 Dense or Convolution runs at all (``unknown`` is let through: MXNet will tell)."""
        return self.kind != "none"

    @property
    def native(self):
        return self.kind in ("amx", "native")

    def describe(self):
        return f"{BFLOAT16_KINDS[self.kind]}: {self.reason}"


def bfloat16_support(flags=None, environ=None, amx_state=None):
    """Classify this CPU for MXNet 1.9.1's bfloat16: AMX, native, emulated, none.

    oneDNN 2.4.4 runs bfloat16 natively with avx512_bf16 (and on AMX tiles
    where :mod:`mxfp16.machine.amx` turned them on), emulates it with plain
    AVX-512 (Skylake-SP, Cascade Lake, Ice Lake), and has no path below
    AVX-512 (AVX2-only CPUs: most laptops, AMD Zen 3 and older, VMs that hide
    AVX-512). Two settings take it away: ``MXNET_MKLDNN_ENABLED=0`` (MXNet's
    own CPU operators have no bfloat16 kernels) and a ``DNNL_MAX_CPU_ISA``
    below ``AVX512_CORE`` (``DNNL_MAX_CPU_ISA=AVX2`` makes this CPU behave, for
    bfloat16, as an AVX2-only one: the test suite's proof that it passes there).

    Parameters
    ----------
    flags : set of str, optional
        The CPU's flags (default: ``/proc/cpuinfo``'s; unknown where it cannot be read).
    environ : mapping, optional
        Default ``os.environ``.
    amx_state : str, optional
        Default :func:`mxfp16.machine.amx.status`'s state.

    Returns
    -------
    BFloat16Support
    """
    environ = os.environ if environ is None else environ
    flags = cpu_flags() if flags is None else flags
    if environ.get("MXNET_MKLDNN_ENABLED", "").strip() == "0":
        return BFloat16Support("none", "MXNET_MKLDNN_ENABLED=0 turns oneDNN off, and MXNet's own CPU operators "
                                       "have no bfloat16 kernels; unset it")
    isa = (environ.get("DNNL_MAX_CPU_ISA") or "").strip()
    if isa in ISA_BELOW_AVX512_CORE:
        return BFloat16Support("none", f"DNNL_MAX_CPU_ISA={isa} keeps oneDNN below AVX-512, where it has no "
                                       "bfloat16 path; unset it")
    if flags is None:
        return BFloat16Support("unknown", "no /proc/cpuinfo to read the CPU's flags from")
    missing = tuple(flag for flag in AVX512_CORE_FLAGS if flag not in flags)
    if missing:
        return BFloat16Support("none", f"this CPU lacks {', '.join(missing)}: the oneDNN 2.4.4 in MXNet 1.9.1 runs "
                                       "bfloat16 only on AVX-512 CPUs (natively with avx512_bf16 or AMX, else "
                                       "emulated)", missing)
    amx = None
    if "amx_bf16" in flags and "amx_tile" in flags:
        if amx_state is None:
            from .amx import status

            amx_state = status().state
        amx = amx_state
    if isa in ISA_BELOW_NATIVE:
        return BFloat16Support("emulated", f"DNNL_MAX_CPU_ISA={isa} keeps oneDNN below its bfloat16 instructions",
                               amx=amx)
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return BFloat16Support("emulated", "this CPU has AVX-512 but no bfloat16 instructions (avx512_bf16, "
                                           "amx_bf16)", ("avx512_bf16", "amx_bf16"))
    if amx == "in-use":
        return BFloat16Support("amx", "amx_bf16 and amx_tile, with the tile state granted (mxfp16.machine.amx)",
                               amx=amx)
    if amx is not None:
        return BFloat16Support("native", f"avx512_bf16; AMX is not in use ({amx}: mxfp16 info says why)", amx=amx)
    return BFloat16Support("native", "this CPU has avx512_bf16, which oneDNN's avx512_core_bf16 kernels use")


def _bfloat16_dense():
    """In the probe's child: the sum of a bfloat16 Dense of ones, 2x4 by 3x4 (24.0 where bfloat16 runs right)."""
    import mxnet as mx
    import numpy as np

    bfloat16 = np.dtype([("bfloat16", np.uint16)])  # mxfp16.float_formats.BFLOAT16, which imports this module
    x, w = (mx.nd.amp_cast(mx.nd.ones(shape), dtype=bfloat16) for shape in ((2, 4), (3, 4)))
    out = mx.nd.FullyConnected(x, w, num_hidden=3, no_bias=True)
    return float(mx.nd.amp_cast(out, dtype="float32").sum().asscalar())


def python_child(function, timeout=300):
    """Call ``function()`` in a fresh Python process (this interpreter, this checkout's mxfp16 first on the path).

    An MXNet failure there (asynchronous, it can leave a process unusable) cannot reach the caller.

    Returns
    -------
    (object or None, str or None)
        What ``function`` returned and ``None``; or ``None`` and why there is none (the child's last error line).
    """
    from ..plumbing.child import call_in_child

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
           "PYTHONWARNINGS": "ignore"}
    value, problem = call_in_child(function, timeout=timeout, env=env)
    return value, None if problem is None else problem.strip().splitlines()[-1]


def probe_bfloat16_arithmetic(timeout=300):
    """Run one small bfloat16 Dense (``FullyConnected``) in a child process: does bfloat16 arithmetic run here?

    Where :func:`bfloat16_support` has no flags to read (``'unknown'``: macOS, Windows) only running MXNet tells.

    Returns
    -------
    (bool, str)
        Whether it ran and gave the right sum, and what happened (the child's last error line where it failed).
    """
    out, error = python_child(_bfloat16_dense, timeout)
    if out == 24.0:
        return True, "a bfloat16 Dense ran in a child process"
    return False, f"a bfloat16 Dense failed in a child process: {error or f'it returned {out}, not 24.0'}"


def gpu_count():
    import mxnet as mx

    try:
        return mx.context.num_gpus()
    except mx.base.MXNetError:
        return 0


def _nvidia_smi():
    """Name, memory and compute capability per GPU, or ``{}`` without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = ([part.strip() for part in line.split(",")] for line in out.strip().splitlines())
    return {int(row[0]): {"name": row[1], "memory_mb": float(row[2]), "compute_capability": row[3]}
            for row in rows if len(row) == 4 and row[0].isdigit()}


def _gpus():
    """One dict per GPU MXNet can see: name, memory, compute capability, tensor cores (from 7.0, Volta; ``None``
    where the capability cannot be read)."""
    import mxnet as mx

    count = gpu_count()
    smi = _nvidia_smi() if count else {}
    found = []
    for index in range(count):
        row = {"index": index, "name": None, "memory_mb": None, "compute_capability": None, **smi.get(index, {})}
        with contextlib.suppress(mx.base.MXNetError):
            row["memory_mb"] = mx.context.gpu_memory_info(index)[1] / 2 ** 20
        cap = row["compute_capability"]
        row["tensor_cores"] = None if not cap else float(cap) >= 7.0
        found.append(row)
    return found


def peak_memory_mb(ctx_list):
    """Peak memory of the run in MiB: the process's peak resident set on a CPU; on GPUs the largest memory in use
    on any of them now (MXNet reports no peak; call this at the end of each epoch and keep the maximum)."""
    import mxnet as mx

    gpus = [mx.context.gpu_memory_info(c.device_id) for c in ctx_list if c.device_type == "gpu"]
    if gpus:
        return max((total - free) / 2 ** 20 for free, total in gpus)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10  # bytes on macOS, KiB on Linux


def machine_summary():
    """The facts a benchmark or a run should record about where it ran."""
    import mxnet as mx

    from .amx import status

    support = bfloat16_support()
    return {
        "cpu_model": cpu_model(),
        "cpu": cpu_identity(),
        "cpu_cores": os.cpu_count(),
        "cpu_bfloat16": cpu_bfloat16_support(),
        "cpu_class": cpu_class(),
        "bfloat16": {"kind": support.kind, "runs": support.runs, "reason": support.reason},
        "amx": status().as_dict(),
        "gpus": _gpus(),
        "mxnet_version": mx.__version__,
        "mxnet_features": sorted(name for name, feat in mx.runtime.Features().items() if feat.enabled),
        "python": platform.python_version(),
    }
