"""Deprecated: ``mxfp16.hardware`` moved to :mod:`mxfp16.machine.hardware`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.hardware moved to mxfp16.machine.hardware; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("mxfp16.machine.hardware")
