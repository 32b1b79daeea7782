"""Import gluoncv in any environment, including one that also holds PyTorch 2.

gluoncv 0.10.5 (the last release for MXNet 1.x) checks at import time for
PyTorch (``gluoncv.check._require_pytorch_version``), and raises
``RuntimeError``, which its ``__init__`` does not catch, when it finds
``torch>=2.0`` ("Legacy torch==2.x detected"). mxfp16 uses gluoncv's MXNet
half only: :func:`import_gluoncv` hides torch while gluoncv's ``__init__``
runs, then puts back what was there.
"""
import importlib
import sys

__all__ = ["import_gluoncv"]

_ABSENT = object()


def import_gluoncv():
    """Return the ``gluoncv`` module, imported with its PyTorch probe disabled (then ``import gluoncv`` works too).

    Returns
    -------
    module
        ``gluoncv``.

    Raises
    ------
    ImportError
        gluoncv is not installed (``pip install -c constraints.txt
        gluoncv==0.10.5.post0``, which ``mxfp16`` depends on).
    """
    if "gluoncv" in sys.modules:
        return sys.modules["gluoncv"]
    saved = sys.modules.get("torch", _ABSENT)
    sys.modules["torch"] = None  # `import torch` now raises ImportError: gluoncv's "no PyTorch" path
    try:
        return importlib.import_module("gluoncv")
    finally:
        if saved is _ABSENT:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved
