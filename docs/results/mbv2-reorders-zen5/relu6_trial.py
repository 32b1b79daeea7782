"""A ReLU6 between two depthwise 3x3 convolutions (float32, 16 x 96 x 112 x 112, MobileNet v2's widest), forward and
backward, in ms: as mxfp16 runs it (maximum(minimum(x, 6), 0), MXNet's plain kernels: the input is reordered out of
oneDNN's blocked layout) against one built from oneDNN operators only (relu(x) - relu(x - 6): two ReLUs, a frozen
BatchNorm for the shift, one for the sign, add_n), which keeps the blocked layout; and the two convolutions alone.

    env -i HOME=$HOME PATH=/usr/bin:/bin PYTHONPATH=. .venv/bin/python docs/results/mbv2-reorders-zen5/relu6_trial.py
"""
import json
import time

import mxnet as mx
from mxnet import autograd, nd

N, C, H = 16, 96, 112
x = nd.random.normal(shape=(N, C, H, H)) * 4
w = nd.random.normal(shape=(C, 1, 3, 3)) * 0.3
ones, zeros, six = nd.ones((C,)), nd.zeros((C,)), nd.full((C,), 6.0)
unit_var, minus = nd.full((C,), 1.0 - 1e-5), nd.full((C,), -1.0)  # (x - mean) / sqrt(var + eps) with var + eps = 1


def conv(v):
    return nd.Convolution(v, w, no_bias=True, kernel=(3, 3), pad=(1, 1), num_filter=C, num_group=C)


def scalar_ops(y):
    return nd.maximum(nd.minimum(y, 6.0), 0.0)


def onednn_ops(y):
    shifted = nd.BatchNorm(y, ones, zeros, six, unit_var, use_global_stats=True, fix_gamma=False, eps=1e-5)
    upper = nd.BatchNorm(nd.Activation(shifted, act_type="relu"), minus, zeros, zeros, unit_var,
                         use_global_stats=True, fix_gamma=False, eps=1e-5)
    return nd.add_n(nd.Activation(y, act_type="relu"), upper)


def convolutions_only(y):
    return y


def ms_per_pass(relu6, reps=10, warmup=3):
    x.attach_grad()
    for i in range(warmup + reps):
        if i == warmup:
            nd.waitall()
            tic = time.perf_counter()
        with autograd.record():
            out = conv(relu6(conv(x)))
        out.backward()
    nd.waitall()
    return 1000 * (time.perf_counter() - tic) / reps


y = conv(x)
result = {"max_abs_difference": float((scalar_ops(y) - onednn_ops(y)).abs().max().asscalar()),
          "mxnet": mx.__version__}
for relu6 in (scalar_ops, onednn_ops, convolutions_only) * 2:  # twice, in turn: the second reading is reported
    result[relu6.__name__ + "_ms"] = round(ms_per_pass(relu6), 1)
print(json.dumps(result))
