"""Deprecated: ``mxfp16.gpu`` moved to :mod:`mxfp16.machine.gpu`; this alias goes in the next release."""
import importlib
import sys
import warnings

warnings.warn("mxfp16.gpu moved to mxfp16.machine.gpu; import it from there (the old path goes in the next release)",
              DeprecationWarning, stacklevel=2)
for _sub in ['libraries', 'elf', 'coverage', 'wheel_kernels']:
    sys.modules[f"mxfp16.gpu.{_sub}"] = importlib.import_module(f"mxfp16.machine.gpu.{_sub}")
sys.modules[__name__] = importlib.import_module("mxfp16.machine.gpu")
