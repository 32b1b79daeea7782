"""What this machine and this Python stack are: one roof for the facts mxfp16 reads before and beside MXNet.

* :mod:`mxfp16.machine.stack`: the Python/numpy/MXNet stack (the numpy names
  MXNet 1.9.1 needs supplied, ``distutils``, the tested versions);
* :mod:`mxfp16.machine.environment`: threads and the float16 environment
  variables, set before MXNet loads;
* :mod:`mxfp16.machine.hardware`: CPU bfloat16 support, GPUs, memory;
* :mod:`mxfp16.machine.gpu`: the CUDA wheels' libraries, and which GPUs the
  wheel's kernels cover.

Nothing here imports MXNet at module level.
"""
