"""What amp-bfloat16 computes in which dtype, and what the optimizer sees (issue 16's candidate causes).

The speed comes from the heavy operators in bfloat16; accuracy needs the
parameters, every gradient the optimizer reads, BatchNorm's running
statistics and the loss to stay float32, and BatchNorm's statistics under
bfloat16 to match float32's to bfloat16 rounding. Each assertion guards one
of the candidates bisected for the parity table in docs/training.md. AMP is
process-global, so the network runs in a child process per precision.
"""
import subprocess
import sys

import numpy as np
from conftest import last_line_json, requires_bfloat16

CHILD = r'''
import json, sys
import mxfp16
import numpy as np, mxnet as mx
from mxnet import autograd
from mxfp16.amp.wrappers import dtype_name
from mxfp16.models import build_model
from mxfp16.train.parts import classification_loss

precision = mxfp16.resolve_precision(sys.argv[1], "cpu")
mxfp16.activate(precision)
mx.random.seed(0); np.random.seed(0)
net = build_model("cifar_resnet20_v1", 10, ctx=[mx.cpu()], in_shape=(3, 32, 32))
net.hybridize(static_alloc=True, static_shape=True)
params = net.collect_params()
before = {k: p.data().asnumpy().copy() for k, p in params.items() if k.endswith(("running_mean", "running_var"))}
x = mx.nd.array(np.random.RandomState(1).randn(16, 3, 32, 32).astype("float32"))
y = mx.nd.array(np.arange(16) % 10)
loss_fn = classification_loss(10)
with autograd.record():
    out = net(x)
    loss = loss_fn(mxfp16.to_float32(out), y)
loss.backward()
graph = net._cached_graph[1]
internals = graph.get_internals()
_, types, _ = internals.infer_type(data=np.float32)
dtype = dict(zip(internals.list_outputs(), types))
ops = {}
for node in json.loads(graph.tojson(remove_amp_cast=False))["nodes"]:
    if node["op"] in ("Convolution", "FullyConnected", "BatchNorm", "Pooling", "elemwise_add"):
        ops.setdefault(node["op"], set()).add(dtype_name(dtype[node["name"] + "_output"]))
print(json.dumps({
    "ops": {k: sorted(v) for k, v in ops.items()},
    "params": sorted({dtype_name(p.data().dtype) for p in params.values()}),
    "grads": sorted({dtype_name(p.grad().dtype) for p in params.values() if p.grad_req != "null"}),
    "loss": dtype_name(loss.dtype),
    "stat_updates": {k: (params[k].data().asnumpy() - v).tolist() for k, v in before.items()},
}))
'''


def _run(precision):
    done = subprocess.run([sys.executable, "-c", CHILD, precision], capture_output=True, text=True, check=True)
    return last_line_json(done.stdout)


@requires_bfloat16
def test_amp_bfloat16_runs_the_heavy_ops_in_bfloat16_and_keeps_what_training_reads_float32():
    bf16, f32 = _run("amp-bfloat16"), _run("float32")
    assert all(d == ["float32"] for d in f32["ops"].values())
    # The speed: convolutions and the classifier in bfloat16 (a 3x3 stem is not kept float32).
    assert bf16["ops"]["Convolution"] == ["bfloat16"]
    assert bf16["ops"]["FullyConnected"] == ["bfloat16"]
    # Documented in docs/benchmarks.md: BatchNorm follows its bfloat16 input (float32 BatchNorm was slower).
    assert bf16["ops"]["BatchNorm"] == ["bfloat16"]
    # What accuracy needs: float32 parameters, gradients (the optimizer's view) and loss.
    assert bf16["params"] == ["float32"]
    assert bf16["grads"] == ["float32"]
    assert bf16["loss"] == "float32"
    # BatchNorm's running statistics are float32 and move as float32's do, to bfloat16 rounding
    # of the activations they average (8 significant bits; 5% of the largest update is ~25 roundings).
    assert bf16["stat_updates"].keys() == f32["stat_updates"].keys()
    for key, update in f32["stat_updates"].items():
        a, b = np.asarray(bf16["stat_updates"][key]), np.asarray(update)
        assert np.abs(a - b).max() <= 0.05 * np.abs(b).max() + 1e-6, key
