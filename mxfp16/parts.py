"""Deprecated: ``mxfp16.parts`` moved to :mod:`mxfp16.training_parts`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.parts moved to mxfp16.training_parts; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("mxfp16.training_parts")
