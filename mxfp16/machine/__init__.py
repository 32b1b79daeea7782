"""What this machine and this Python stack are: :mod:`~mxfp16.machine.stack` (numpy names, ``distutils``, tested
versions, what MXNet's load is spared), :mod:`~mxfp16.machine.operator_cache` (MXNet's operator functions compiled
once per machine), :mod:`~mxfp16.machine.environment` (threads and float16 variables, set before MXNet loads),
:mod:`~mxfp16.machine.hardware` (CPU bfloat16 support, GPUs, memory) and :mod:`~mxfp16.machine.gpu` (the CUDA
wheels' libraries and the GPUs the wheel's kernels cover). Nothing here imports MXNet at module level.
"""
