"""Load the CUDA 11 libraries of MXNet's GPU build from pip's NVIDIA wheels.

``mxnet-cu112`` links ``libmxnet.so`` against CUDA 11 libraries it does not bundle; NVIDIA's wheels
(``nvidia-cudnn-cu11`` ...) unpack them where the dynamic loader never searches. :func:`preload` loads the ones
``libmxnet.so``'s ``DT_NEEDED`` entries name (read with :mod:`mxfp16.machine.gpu.elf`, without loading it) with
``RTLD_GLOBAL`` first, as docs/gpu.md ("How mxfp16 loads them") describes. Standard library only, never MXNet: it
runs inside ``import mxfp16``, before MXNet exists in the process.
"""
import ctypes
import importlib.util
import os
import re
import sys
from dataclasses import dataclass

from .elf import ElfError, dynamic_info

__all__ = ["CudaLibrary", "LibraryStatus", "LIBRARIES", "DRIVER", "preload", "status", "mxnet_library",
           "needed_by_mxnet", "is_cuda_build", "explain_load_error", "report"]


@dataclass(frozen=True)
class CudaLibrary:
    """One CUDA library MXNet's GPU build needs, and the wheel that provides it.

    Attributes
    ----------
    soname : str
        The name ``libmxnet.so`` (or another library) asks for.
    package : str
        The pip package whose ``nvidia/*/lib`` folder holds it.
    version : str
        The package version mxfp16 is tested with (pinned in constraints.txt).
    what : str
        A human name: ``'cuDNN 8'``.
    needs : tuple of str
        Sonames among :data:`LIBRARIES` this one links (it must load after them).
    """

    soname: str
    package: str
    version: str
    what: str
    needs: tuple = ()

    @property
    def fix(self):
        """The one command that installs it."""
        return f"pip install {self.package}=={self.version}"


#: In load order: each library after the ones it ``needs``. The versions are
#: the newest CUDA 11 wheels with these sonames (cuDNN 9 would be libcudnn.so.9).
LIBRARIES = (
    CudaLibrary("libcudart.so.11.0", "nvidia-cuda-runtime-cu11", "11.8.89", "CUDA runtime"),
    CudaLibrary("libnvToolsExt.so.1", "nvidia-nvtx-cu11", "11.8.86", "NVTX"),
    CudaLibrary("libcublasLt.so.11", "nvidia-cublas-cu11", "11.11.3.6", "cuBLASLt"),
    CudaLibrary("libcublas.so.11", "nvidia-cublas-cu11", "11.11.3.6", "cuBLAS", ("libcublasLt.so.11",)),
    CudaLibrary("libcufft.so.10", "nvidia-cufft-cu11", "10.9.0.58", "cuFFT"),
    CudaLibrary("libcurand.so.10", "nvidia-curand-cu11", "10.3.0.86", "cuRAND"),
    CudaLibrary("libcusolver.so.11", "nvidia-cusolver-cu11", "11.4.1.48", "cuSOLVER",
                ("libcublas.so.11", "libcublasLt.so.11")),
    CudaLibrary("libnvrtc.so.11.2", "nvidia-cuda-nvrtc-cu11", "11.8.89", "NVRTC"),
    CudaLibrary("libnccl.so.2", "nvidia-nccl-cu11", "2.21.5", "NCCL"),
    CudaLibrary("libcudnn.so.8", "nvidia-cudnn-cu11", "8.9.6.50", "cuDNN 8"),
)
_BY_SONAME = {lib.soname: lib for lib in LIBRARIES}

#: The NVIDIA driver's library. ``libmxnet.so`` links it directly, so the GPU
#: build cannot be imported without a driver; no pip package provides it.
DRIVER = "libcuda.so.1"
DRIVER_FIX = ("install the NVIDIA driver (R450 or later; CUDA 11 runs on it), or on a machine without an "
              "NVIDIA GPU use the CPU build: pip uninstall -y mxnet-cu112 && "
              "pip install -c constraints.txt 'mxfp16[cpu]'")
ALL_FIX = "pip install -c constraints.txt 'mxfp16[gpu]' (in a checkout: pip install -c constraints.txt -e '.[gpu]')"


@dataclass(frozen=True)
class LibraryStatus:
    """Where one library was found and whether :func:`preload` loaded it.

    Attributes
    ----------
    library : CudaLibrary
    path : str or None
        The file in a wheel's ``nvidia/*/lib`` folder, or None when no wheel has it.
    loaded : bool
        :func:`preload` loaded it (False before or without a preload).
    error : str or None
        Why loading the file failed (a broken or foreign file).
    """

    library: CudaLibrary
    path: str = None
    loaded: bool = False
    error: str = None

    def as_dict(self):
        lib = self.library
        return {"soname": lib.soname, "what": lib.what, "package": lib.package, "version": lib.version,
                "path": self.path, "loaded": self.loaded, "error": self.error,
                "fix": None if self.path and not self.error else lib.fix}


def mxnet_library():
    """The ``libmxnet.so`` that ``import mxnet`` would load, found without importing it; None without MXNet.

    Honours ``MXNET_LIBRARY_PATH`` as MXNet's own ``libinfo`` does.
    """
    override = os.environ.get("MXNET_LIBRARY_PATH")
    if override and os.path.isfile(override):
        return override
    try:
        spec = importlib.util.find_spec("mxnet")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "libmxnet.so")
        if os.path.isfile(candidate):
            return candidate
    return None


def needed_by_mxnet(library=None):
    """The ``DT_NEEDED`` sonames of ``libmxnet.so`` (empty when it cannot be read)."""
    library = library or mxnet_library()
    if not library:
        return ()
    try:
        return dynamic_info(library).needed
    except (ElfError, OSError):
        return ()


def is_cuda_build(needed):
    """Whether a library that needs these sonames is a CUDA build (it links the CUDA runtime)."""
    return any(name.startswith("libcudart.so") for name in needed)


def _wanted(needed):
    """The :data:`LIBRARIES` that ``needed`` asks for, with what they need, in load order."""
    names = {name for name in needed if name in _BY_SONAME}
    while extra := {dep for name in names for dep in _BY_SONAME[name].needs} - names:
        names |= extra
    return [lib for lib in LIBRARIES if lib.soname in names]


def _find(soname, paths=None):
    """The first ``<entry>/nvidia/*/lib/<soname>`` for the entries of ``paths`` (default ``sys.path``), or None."""
    for entry in (sys.path if paths is None else paths):
        root = os.path.join(entry or os.getcwd(), "nvidia")
        try:
            subfolders = sorted(os.listdir(root))
        except OSError:  # no such folder, or not one
            continue
        for sub in subfolders:
            candidate = os.path.join(root, sub, "lib", soname)
            if os.path.isfile(candidate):
                return candidate
    return None


def status(needed=None, paths=None):
    """Find, without loading, each library a CUDA build of MXNet needs.

    Parameters
    ----------
    needed : iterable of str, optional
        ``libmxnet.so``'s ``DT_NEEDED`` entries; read from the installed MXNet by default.
    paths : list of str, optional
        Folders to search instead of ``sys.path``.

    Returns
    -------
    list of LibraryStatus
        In load order; empty for a CPU build (or no MXNet).
    """
    needed = needed_by_mxnet() if needed is None else needed
    if not is_cuda_build(needed):
        return []
    loaded = {s.library.soname: s for s in (_REPORT or [])}
    return [loaded.get(lib.soname) or LibraryStatus(lib, _find(lib.soname, paths)) for lib in _wanted(needed)]


_HANDLES = {}  # loaded libraries, referenced for the life of the process
_REPORT = None


def preload(paths=None):
    """Load the CUDA libraries MXNet's GPU build needs from the NVIDIA wheels, before the first ``import mxnet``.

    A second call returns the first call's result. Never raises: a library missing or failing to load is reported, and
    the import that follows fails with the loader's message (:func:`explain_load_error`).

    Parameters
    ----------
    paths : list of str, optional
        Folders to search instead of ``sys.path`` (tests).

    Returns
    -------
    list of LibraryStatus
        Empty for the CPU build: nothing was loaded.
    """
    global _REPORT
    if _REPORT is not None:
        return _REPORT
    report = []
    for found in status(paths=paths):
        if found.path is not None:
            try:
                _HANDLES[found.library.soname] = ctypes.CDLL(found.path, mode=ctypes.RTLD_GLOBAL)
                found = LibraryStatus(found.library, found.path, loaded=True)
            except OSError as err:
                found = LibraryStatus(found.library, found.path, loaded=False, error=str(err))
        report.append(found)
    _REPORT = report
    return report


def loaded_path(soname):
    """Where this process mapped a library whose file name starts with ``soname`` (Linux), else None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.rstrip("\n").split(None, 5)
                path = parts[5] if len(parts) == 6 else ""
                if os.path.basename(path).startswith(soname):
                    return path
    except OSError:
        pass
    return None


def _state(s):
    if s.error:
        return f"BROKEN   {s.path}: {s.error}"
    return f"found    {s.path}" if s.path else f"MISSING  {s.library.fix}"


def _table(statuses):
    width = max((len(s.library.soname) for s in statuses), default=0)
    return "\n".join(f"  {s.library.soname:<{width}}  {_state(s)}" for s in statuses)


def explain_load_error(error, statuses=None):
    """Turn the loader's message for ``libmxnet.so`` into one that names the library, its package and the fix.

    Parameters
    ----------
    error : OSError or str
        E.g. ``libcudnn.so.8: cannot open shared object file: No such file or directory``.
    statuses : list of LibraryStatus, optional
        Defaults to :func:`status` of the installed MXNet.

    Returns
    -------
    str
    """
    message = str(error)
    statuses = status() if statuses is None else statuses
    missing = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", message)
    soname = missing.group(1) if missing else None
    lines = [f"MXNet's native library could not be loaded: {message}"]
    lib = _BY_SONAME.get(soname)
    if lib is not None:
        lines += [f"{soname} is {lib.what}, from the pip package {lib.package}.",
                  f"Fix: {lib.fix}",
                  f"  or every CUDA library at once: {ALL_FIX}"]
    elif soname == DRIVER:
        lines += [f"{DRIVER} is the NVIDIA driver's library, which no pip package provides; MXNet's GPU "
                  "build (mxnet-cu112) links it, so it cannot even be imported without the driver.",
                  f"Fix: {DRIVER_FIX}"]
    elif soname:
        lines.append(f"{soname} is not one of the CUDA libraries mxfp16 knows; install what provides it "
                     "or put its folder on LD_LIBRARY_PATH.")
    if statuses:
        lines += ["CUDA libraries mxfp16 looked for in site-packages (nvidia/*/lib):", _table(statuses)]
    return "\n".join(lines)


def report():
    """The CUDA libraries of the installed MXNet, for ``mxfp16 info``.

    Returns
    -------
    dict
        ``build`` (``'cuda'``, ``'cpu'`` or ``'not installed'``), ``mxnet_library``,
        ``libraries`` (one dict per library: soname, package, path in a wheel,
        ``loaded_from`` in this process, ``fix`` when it is missing) and
        ``driver`` (``libcuda.so.1``: where it was loaded from, or the fix).
    """
    library = mxnet_library()
    needed = needed_by_mxnet(library)
    build = "not installed" if not library else "cuda" if is_cuda_build(needed) else "cpu"
    rows = []
    for s in status(needed):
        row = s.as_dict()
        row["loaded_from"] = loaded_path(s.library.soname)
        if row["loaded_from"] and not row["path"]:
            row["fix"] = None  # the system provides it (LD_LIBRARY_PATH, a CUDA toolkit)
        rows.append(row)
    driver = None
    if build == "cuda":
        where = loaded_path(DRIVER)
        driver = {"soname": DRIVER, "loaded_from": where, "fix": None if where else DRIVER_FIX}
    return {"build": build, "mxnet_library": library, "libraries": rows, "driver": driver}
