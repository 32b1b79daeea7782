"""Check the numerical stack before anything imports MXNet.

MXNet 1.9.1 is the final release and predates numpy 1.24; importing it with a
newer numpy fails deep inside MXNet with an ``AttributeError`` that says
nothing about the fix. This module turns both common set-up mistakes (numpy
too new, MXNet missing) into one clear message.
"""
import importlib
import importlib.util

from .gpu import libraries

NUMPY_LIMIT = (1, 24)

INSTALL_HINT = (
    "Install mxfp16 with one MXNet wheel and the constraints file:\n"
    "    pip install -c constraints.txt 'mxfp16[cpu]'   # CPU: mxnet==1.9.1\n"
    "    pip install -c constraints.txt 'mxfp16[gpu]'   # GPU: mxnet-cu112==1.9.1 (CUDA 11.2, cuDNN 8)\n"
    "or, from a checkout, run `make demo`."
)


def _major_minor(version):
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def prepare_stack():
    """Everything that must hold before MXNet loads; imports nothing of MXNet.

    Checks numpy's version and that an MXNet wheel is installed, then
    preloads the CUDA wheels' libraries (a no-op with the CPU wheel).

    Raises
    ------
    ImportError
        numpy too new or missing, or no MXNet wheel; the message names the fix.
    """
    try:
        numpy = importlib.import_module("numpy")
    except ImportError as err:
        raise ImportError("mxfp16 needs numpy<1.24.\n" + INSTALL_HINT) from err
    if _major_minor(numpy.__version__) >= NUMPY_LIMIT:
        raise ImportError(
            f"mxfp16 found numpy {numpy.__version__}, but MXNet 1.9.1 needs numpy<1.24 "
            "(numpy 1.24 removed np.bool and numpy 2 removed np.PZERO, which MXNet uses).\n"
            "Fix: pip install 'numpy<1.24'  (or reinstall with -c constraints.txt).\n"
            + INSTALL_HINT
        )
    if importlib.util.find_spec("mxnet") is None:
        raise ImportError("mxfp16 needs MXNet 1.9.1, which is not installed.\n" + INSTALL_HINT)
    libraries.preload()  # the CUDA wheels' libraries, before libmxnet.so asks for them


def import_mxnet():
    """``import mxnet``, with a library that libmxnet.so cannot load named with its package and fix.

    Raises
    ------
    ImportError
    """
    try:
        return importlib.import_module("mxnet")
    except OSError as err:  # libmxnet.so is there but a library it links is not
        raise ImportError(libraries.explain_load_error(err)) from err


def check_stack():
    """:func:`prepare_stack`, then :func:`import_mxnet`.

    Returns
    -------
    module
        The imported ``mxnet`` module.
    """
    prepare_stack()
    return import_mxnet()
