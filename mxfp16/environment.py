"""Deprecated: ``mxfp16.environment`` moved to :mod:`mxfp16.machine.environment`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.environment moved to mxfp16.machine.environment; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("mxfp16.machine.environment")
