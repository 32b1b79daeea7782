"""Import gluoncv in any environment, including one that also holds PyTorch 2.

gluoncv 0.10.5 (the last release for MXNet 1.x) asks at import time whether
PyTorch is installed, so that it can offer its PyTorch models too. Its check
(``gluoncv.check._require_pytorch_version``) raises ``RuntimeError`` instead
of ``ImportError`` when it finds ``torch>=2.0``, and ``gluoncv/__init__``
only catches ``ImportError``, so ``import gluoncv`` fails in any environment
that also holds torch 2 ("Legacy torch==2.x detected").

mxfp16 uses gluoncv's MXNet half only (model zoo, learning-rate schedules):
:func:`import_gluoncv` hides torch while gluoncv's ``__init__`` runs, so it
takes its "no PyTorch" branch, and puts back what was there, so torch works
as usual in the same process.
"""
import importlib
import sys

__all__ = ["import_gluoncv"]

_ABSENT = object()


def import_gluoncv():
    """Return the ``gluoncv`` module, imported with its PyTorch probe disabled.

    Safe to call any number of times; once gluoncv is imported, later
    ``import gluoncv`` statements anywhere in the process also work.

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
