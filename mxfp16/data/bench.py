"""Deprecated: ``mxfp16.data.bench`` moved to :mod:`mxfp16.data.timing`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.data.bench moved to mxfp16.data.timing; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("mxfp16.data.timing")
