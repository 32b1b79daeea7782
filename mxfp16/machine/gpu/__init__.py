"""MXNet's GPU build: its CUDA libraries (:mod:`~mxfp16.machine.gpu.libraries`, read with
:mod:`~mxfp16.machine.gpu.elf`) and the GPUs its kernels cover (:mod:`~mxfp16.machine.gpu.coverage`, from
:mod:`~mxfp16.machine.gpu.wheel_kernels`).

The release tools that produce and check these (``tools/gpu/fatbin.py``, ``tools/gpu/check.py`` behind ``make
gpu-check``, ``tools/gpu/driver_standin.py``) live in the source tree, not in the installed package. Nothing here
imports MXNet at module level.
"""
