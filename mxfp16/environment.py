"""The process environment MXNet reads, set once for every command.

MXNet takes several settings from environment variables rather than from its
Python API. This module holds the ones mixed precision needs and sets them
the same way for the trainer, the benchmark and library users. It imports
nothing from MXNet, so it can run before MXNet loads.
"""
import os

__all__ = ["FLOAT16_ENVIRONMENT", "set_float16_environment"]

#: What float16 training wants from MXNet's environment, and why.
FLOAT16_ENVIRONMENT = {
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": ("1", "cuDNN benchmarks convolution algorithms once per shape, "
                                          "picking tensor-core kernels for float16"),
    "MXNET_SAFE_ACCUMULATION": ("1", "reductions (sum, mean, norm, softmax) of float16 data accumulate in float32"),
}


def set_float16_environment():
    """Set the variables of :data:`FLOAT16_ENVIRONMENT` unless the user already did.

    MXNet reads them when an operator is created or run, so setting them
    before the network is built is enough.

    Returns
    -------
    dict
        ``{name: (value, why, set_here)}`` for the log.
    """
    report = {}
    for name, (value, why) in FLOAT16_ENVIRONMENT.items():
        set_here = name not in os.environ
        if set_here:
            os.environ[name] = value
        report[name] = (os.environ[name], why, set_here)
    return report
