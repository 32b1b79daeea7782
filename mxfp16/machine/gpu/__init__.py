"""MXNet's GPU build: its CUDA libraries, the GPUs its kernels cover, and a check of a GPU install.

* :mod:`mxfp16.machine.gpu.libraries` loads the CUDA 11 libraries from pip's NVIDIA
  wheels before MXNet needs them (standard library only; runs inside
  ``import mxfp16``, before MXNet is imported).
* :mod:`mxfp16.machine.gpu.elf` reads a shared library's dependencies and sections.
* :mod:`mxfp16.machine.gpu.coverage` says which GPUs run those kernels natively, through
  the driver's PTX compiler, or not at all; :mod:`mxfp16.machine.gpu.wheel_kernels` is
  the table read from the ``mxnet-cu112`` 1.9.1 wheel.
The release tools that produce and check these (``tools/gpu/fatbin.py``,
which lists the kernels in a library's fat binaries and writes the table;
``tools/gpu/check.py``, which is ``make gpu-check``; and
``tools/gpu/driver_standin.py``, its stand-in for the NVIDIA driver) live in
the source tree, not in the installed package.

Nothing here imports MXNet at module level.
"""
