"""Deprecated: ``mxfp16.formats`` moved to :mod:`mxfp16.float_formats`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.formats moved to mxfp16.float_formats; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("mxfp16.float_formats")
