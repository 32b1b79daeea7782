"""AMX for MXNet's own oneDNN: ask Linux for the tile state, then let oneDNN use it.

Intel's Advanced Matrix Extensions (AMX, from Sapphire Rapids on) multiply bfloat16 tiles in hardware. The oneDNN v2.4.4
in MXNet 1.9.1's ``libmxnet.so`` carries AMX bfloat16 kernels (convolution forward, backward-data and backward-weights,
brgemm) but leaves them off twice over:

* its default maximum ISA excludes AMX ("initial support, turned off by default");
  ``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX`` turns it on;
* since Linux 5.16 a process must ask the kernel for AMX's tile state before its first tile instruction, or get
  SIGILL (exit status 132). oneDNN asks from v2.5 on (``amx::init()`` in ``src/cpu/x64/cpu_isa_traits.cpp``);
  v2.4.4 never does.

So ``import mxfp16`` asks as v2.5 does, then lets oneDNN use AMX (:func:`enable_amx`; docs/benchmarks.md, "With AMX").
The permission covers every thread of the process and is inherited on fork but cleared on exec: a child that runs MXNet
asks again by importing mxfp16 first (the benchmark's children, ``mxfp16 launch``'s workers, data workers and notebook
kernels all do). The environment is inherited over exec, so once oneDNN has read ``DNNL_MAX_CPU_ISA`` mxfp16 takes back
the AMX value it set (:func:`release_isa`): a child that runs MXNet without mxfp16 gets oneDNN's default instead of
tiles it may not use.

The kernel refuses the request (``ENOSPC``) while any thread's alternate signal stack is too small for a signal frame
that holds the tiles (about 11 KB). CPython's faulthandler, which pytest turns on before any test module is imported,
installed such a stack before the 3.9-3.11 backports that size it from ``sysconf(_SC_MINSIGSTKSZ)`` (3.8 never got one).
On ``ENOSPC`` the calling thread's stack is replaced by one large enough and the request made once more.

``MXFP16_AMX=0`` (off) is for an AMX-against-AVX-512 comparison, or an AMX kernel that misbehaves. A
``DNNL_MAX_CPU_ISA`` that names AMX, even the user's, is lowered to ``AVX512_CORE_BF16`` when the kernel refuses the
tiles, because oneDNN would then die of SIGILL at its first tile instruction. Nothing here imports MXNet.
"""
import ctypes
import errno
import os
import platform
import sys
from dataclasses import asdict, dataclass

from .cpuinfo import cpu_flags

__all__ = ["AmxStatus", "ArchPrctl", "enable_amx", "request_amx", "release_isa", "status", "SWITCH", "ISA_VARIABLE",
           "AMX_ISA", "STATES"]

#: Linux's ``arch_prctl`` on x86-64 and the codes of ``arch/x86/include/uapi/asm/prctl.h``.
SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_SUPP = 0x1021
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
#: The tile data's bit in the extended-state masks.
XFEATURE_XTILEDATA = 18

#: The user's switch: ``MXFP16_AMX=0`` leaves AMX off.
SWITCH = "MXFP16_AMX"
#: What oneDNN reads for its highest instruction set, and the values mxfp16 sets.
ISA_VARIABLE = "DNNL_MAX_CPU_ISA"
AMX_ISA = "AVX512_CORE_AMX"
NO_AMX_ISA = "AVX512_CORE_BF16"
#: Set beside ``DNNL_MAX_CPU_ISA`` when mxfp16 (in this process or a parent) chose its value, so a child can
#: tell its parent's choice from the user's.
MARKER = "MXFP16_AMX_ISA_SET"
#: CPU flags AMX bfloat16 needs.
AMX_FLAGS = ("amx_bf16", "amx_tile")
#: Size of the alternate signal stack installed on ENOSPC: the AMX signal frame is about 11.5 KB (8 KB of
#: tiles, the rest of XSAVE and the frame); 64 KB leaves room for the handler itself.
SIGNAL_STACK_BYTES = 64 * 1024

#: Every value :attr:`AmxStatus.state` takes, and what it means.
STATES = {
    "in-use": "oneDNN may run its AMX kernels: the kernel granted the tile state and DNNL_MAX_CPU_ISA allows AMX",
    "granted": "the kernel granted the tile state, but DNNL_MAX_CPU_ISA (set by you) keeps oneDNN below AMX",
    "not-on-this-cpu": "this CPU has no AMX bfloat16 (amx_bf16 and amx_tile)",
    "refused": "the CPU has AMX but the kernel did not grant the tile state",
    "off": f"turned off by {SWITCH}=0",
    "too-late": "MXNet was loaded before mxfp16, so oneDNN may already have read its settings",
}


@dataclass(frozen=True)
class AmxStatus:
    """What :func:`enable_amx` did, for ``mxfp16 info`` and ``bench.json``.

    Attributes
    ----------
    state : str
        A key of :data:`STATES`.
    detail : str
        One sentence for a person: why, and what to do about it.
    errno : int or None
        The kernel's error for a refused request.
    isa : str or None
        ``DNNL_MAX_CPU_ISA`` as oneDNN will read it (``None``: unset, oneDNN's default, which excludes AMX).
    """

    state: str
    detail: str
    errno: object = None
    isa: object = None

    @property
    def in_use(self):
        return self.state == "in-use"

    def as_dict(self):
        return asdict(self)

    def describe(self):
        code = f" ({errno.errorcode.get(self.errno, self.errno)})" if self.errno else ""
        return f"{self.state}{code}: {self.detail}"


class ArchPrctl:
    """The ``arch_prctl`` calls :func:`enable_amx` makes, through libc's ``syscall`` (tests use a stand-in)."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long

    def get_mask(self, code):
        """``(mask, 0)`` for ``ARCH_GET_XCOMP_SUPP`` / ``ARCH_GET_XCOMP_PERM``, or ``(None, errno)``."""
        mask = ctypes.c_uint64(0)
        if self._libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), ctypes.byref(mask)) != 0:
            return None, ctypes.get_errno()
        return mask.value, 0

    def request(self, feature):
        """``ARCH_REQ_XCOMP_PERM`` for ``feature``: 0, or the errno."""
        if self._libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                              ctypes.c_long(feature)) != 0:
            return ctypes.get_errno()
        return 0

    def enlarge_signal_stack(self, size=SIGNAL_STACK_BYTES):
        """Give the calling thread an alternate signal stack of ``size`` bytes, kept for the life of the process (a
        signal may arrive on it at any time); ``True`` when installed."""
        class StackT(ctypes.Structure):  # stack_t of x86-64 Linux
            _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]

        buffer = ctypes.create_string_buffer(size)
        stack = StackT(ctypes.cast(buffer, ctypes.c_void_p), 0, size)
        if self._libc.sigaltstack(ctypes.byref(stack), None) != 0:
            return False
        _KEEP.append(buffer)
        return True


_KEEP = []       # signal stacks installed by ArchPrctl.enlarge_signal_stack
_status = None   # what enable_amx decided in this process


def _has_bit(mask, bit=XFEATURE_XTILEDATA):
    return mask is not None and bool(mask >> bit & 1)


def _request_tiles(calls):
    """Ask for the tile state; ``None`` when granted, else ``(detail, errno)``."""
    supported, err = calls.get_mask(ARCH_GET_XCOMP_SUPP)
    if supported is None:
        return ("the kernel does not answer ARCH_GET_XCOMP_SUPP (Linux before 5.16 cannot give a process AMX's "
                "tile state)", err)
    if not _has_bit(supported):
        return ("the kernel does not offer the tile state (XFEATURE_XTILEDATA): a hypervisor can hide it even "
                "where the CPU reports amx_tile", None)
    granted, err = calls.get_mask(ARCH_GET_XCOMP_PERM)
    if _has_bit(granted):
        return None  # already granted (inherited over fork, or another library asked)
    err = calls.request(XFEATURE_XTILEDATA)
    if err == errno.ENOSPC and calls.enlarge_signal_stack():
        err = calls.request(XFEATURE_XTILEDATA)
    if err:
        why = (" while a thread's alternate signal stack is too small for the tiles" if err == errno.ENOSPC else "")
        return f"the kernel refused the tile state{why}", err
    granted, err = calls.get_mask(ARCH_GET_XCOMP_PERM)
    if not _has_bit(granted):
        return "the kernel accepted the request but does not list the tile state as granted", err or None
    return None


def enable_amx():
    """Run :func:`request_amx` for this process and remember its :class:`AmxStatus` (``import mxfp16`` calls it)."""
    global _status
    _status = request_amx()
    return _status


def request_amx(environ=None, flags=None, calls=None, machine=None, mxnet_loaded=None):
    """Ask for AMX's tile state and, when granted, let oneDNN use it.

    Parameters
    ----------
    environ : mapping, optional
        Read for ``MXFP16_AMX`` and ``DNNL_MAX_CPU_ISA``, and given the new one (default ``os.environ``).
    flags : set of str, optional
        The CPU's flags (default: ``/proc/cpuinfo``).
    calls : ArchPrctl, optional
        The syscall layer (a stand-in in tests).
    machine : str, optional
        ``'Linux x86_64'``-style platform (default: this one); AMX is asked for on Linux x86-64 only.
    mxnet_loaded : bool, optional
        Whether MXNet is already loaded (default: ``'mxnet' in sys.modules``).

    Returns
    -------
    AmxStatus
    """
    environ = os.environ if environ is None else environ
    flags = (cpu_flags() or set()) if flags is None else set(flags)  # unreadable: no AMX to ask for
    machine = machine or f"{platform.system()} {platform.machine()}"
    mxnet_loaded = "mxnet" in sys.modules if mxnet_loaded is None else mxnet_loaded
    isa = environ.get(ISA_VARIABLE) or None
    ours = environ.get(MARKER) == "1" and isa in (AMX_ISA, NO_AMX_ISA)  # a parent mxfp16's choice

    def finish(state, detail, err=None):
        return AmxStatus(state, detail, err, environ.get(ISA_VARIABLE) or None)

    def lower_isa(why):
        """Never leave oneDNN allowed to run tiles the kernel did not grant: that is SIGILL."""
        if (environ.get(ISA_VARIABLE) or "").strip().upper() in (AMX_ISA, "ALL"):
            environ[ISA_VARIABLE] = NO_AMX_ISA
            environ[MARKER] = "1"
            return f"{why}; {ISA_VARIABLE} lowered to {NO_AMX_ISA}, because AMX without the tile state is SIGILL"
        return why

    if not all(flag in flags for flag in AMX_FLAGS):
        return finish("not-on-this-cpu", STATES["not-on-this-cpu"])
    if machine != "Linux x86_64":
        return finish("not-on-this-cpu", f"AMX is asked for on Linux x86-64 only, not on {machine}")
    if environ.get(SWITCH, "").strip().lower() in ("0", "off", "false", "no"):
        # No request is made, so an ISA that allows AMX (a parent's choice, or yours) must come down.
        return finish("off", lower_isa(f"{STATES['off']}; oneDNN runs its AVX-512 bfloat16 kernels"))
    refused = _request_tiles(calls or ArchPrctl())
    if refused:
        detail, err = refused
        return finish("refused", lower_isa(detail), err)
    if isa is not None and not ours:
        if isa.strip().upper() in (AMX_ISA, "ALL"):
            return finish("in-use", f"the tile state is granted and {ISA_VARIABLE}={isa} (yours) allows AMX")
        return finish("granted", f"the tile state is granted but {ISA_VARIABLE}={isa} (yours) keeps oneDNN below AMX")
    environ[ISA_VARIABLE] = AMX_ISA
    environ[MARKER] = "1"
    if mxnet_loaded:
        return finish("too-late", f"{STATES['too-late']} (import mxfp16 before mxnet); the tile state is granted and "
                                  f"{ISA_VARIABLE}={AMX_ISA} is set for oneDNN's first read")
    return finish("in-use", f"the tile state is granted and {ISA_VARIABLE}={AMX_ISA} lets oneDNN use AMX")


def status():
    """The :class:`AmxStatus` of this process (``import mxfp16`` decides it once)."""
    return _status if _status is not None else enable_amx()


def _first_primitive():
    """Run one oneDNN primitive (a ReLU, whose dtype no AMP target changes), so that oneDNN reads its settings."""
    import mxnet as mx

    mx.nd.Activation(mx.nd.ones((1, 1, 1, 1), ctx=mx.cpu()), act_type="relu").wait_to_read()


def release_isa(environ=None, read=_first_primitive):
    """Take back the ``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX`` mxfp16 set, once oneDNN has read it (``read`` makes sure).

    The tile permission is cleared on exec and the environment is not: a child that ran MXNet without importing
    mxfp16 would inherit the value without the permission and die of SIGILL at its first tile instruction. oneDNN
    reads the variable once, so this process keeps AMX. A value you set, or one lowered to ``AVX512_CORE_BF16``
    (safe for any child), stays; so does mxfp16's own under a oneDNN trace (``DNNL_VERBOSE``, the kernel
    census), which would otherwise show the read's primitive. :func:`mxfp16.machine.stack.import_mxnet` calls it.

    Returns
    -------
    bool
        Whether the variable was taken back.
    """
    environ = os.environ if environ is None else environ
    if environ.get(MARKER) != "1" or environ.get(ISA_VARIABLE) != AMX_ISA or \
            any(environ.get(name, "0").strip() not in ("", "0") for name in ("DNNL_VERBOSE", "ONEDNN_VERBOSE")):
        return False
    try:
        read()
    except Exception:  # a read that fails (an MXNet without oneDNN): keep the value rather than fail the import
        return False
    environ.pop(ISA_VARIABLE, None)
    environ.pop(MARKER, None)
    return True
