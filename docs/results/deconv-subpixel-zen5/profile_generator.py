"""A transposed convolution computed as a sub-pixel convolution in bfloat16: does it pay in MXNet 1.9.1?

    OMP_NUM_THREADS=2 PYTHONPATH=. python docs/results/deconv-subpixel-zen5/profile_generator.py {deconvolution|subpixel}

DCGAN's generator (``mxfp16.bench.networks.dcgan_generator``, batch 64, hybridized), trained under amp-bfloat16 with
mxfp16's lists. ``deconvolution``: as mxfp16 runs it, each ``Conv2DTranspose`` a float32 ``Deconvolution``
(MXNet's list: its bfloat16 kernel crashes). ``subpixel``: each computed by the route below, whose ``Convolution``
AMP runs in bfloat16. Prints milliseconds per step (3 untimed, 3 timed), then MXNet's profiler over 2 more steps
(bulk execution off, so each operator is timed on its own), by operator.

The route: with stride ``s`` dividing the kernel, output pixel ``o`` of phase ``(o + pad) mod s`` reads taps ``r, r +
s, ...`` only, so one convolution with ``s * s`` times the output channels (the sub-kernels, flipped, in/out axes
swapped) computes every phase, ``depth_to_space`` interleaves them and a slice drops the padding. It matches
``Deconvolution`` in float32 to 3e-6 (outputs and weight gradients, this generator).
"""
import json
import os
import sys
import time

os.environ["MXNET_EXEC_BULK_EXEC_TRAIN"] = "0"

import mxfp16  # noqa: E402 -- after the variable, which MXNet reads when it loads
import mxfp16.amp.lists as amp_lists  # noqa: E402
import mxnet as mx  # noqa: E402
from mxfp16.amp.wrappers import as_tuple, module_of  # noqa: E402
from mxfp16.bench.networks import dcgan_generator  # noqa: E402
from mxnet import autograd  # noqa: E402


def subpixel(data, weight, kwargs):
    F = module_of(data)
    kernel, s = as_tuple(kwargs["kernel"]), as_tuple(kwargs["stride"])[0]
    pad = as_tuple(kwargs.get("pad", "")) or (0, 0)
    taps = tuple(k // s for k in kernel)
    w = F.reshape(weight, shape=(0, 0, taps[0], s, taps[1], s))  # (in, out, mh, s, mw, s): tap = m * s + r
    w = F.transpose(F.flip(F.flip(w, axis=2), axis=4), axes=(3, 5, 1, 0, 2, 4))
    w = F.reshape(F.reshape(w, shape=(-3, 0, 0, 0, 0)), shape=(-3, 0, 0, 0))
    out = F.Convolution(data, w, kernel=taps, num_filter=int(kwargs["num_filter"]) * s * s, no_bias=True,
                        pad=tuple(m - 1 for m in taps))
    out = F.depth_to_space(out, block_size=s) if s > 1 else out
    return F.slice(out, begin=(None, None) + pad, end=(None, None) + tuple(-p or None for p in pad))


def routed(f):
    def deconvolution(data, weight=None, **kwargs):  # the generator's layers: no bias, adj or groups
        return f(data, **kwargs) if weight is None else subpixel(data, weight, kwargs)
    return deconvolution


def main(route):
    if route == "subpixel":
        amp_lists.single_channel_as_convolution = routed  # what init_amp puts around Deconvolution
    mixed = mxfp16.MixedPrecision("amp-bfloat16", "cpu", log=lambda line: None)
    net = dcgan_generator()
    net.initialize(mx.init.Normal(0.02))
    trainer = mixed.prepare(net, "sgd", {"learning_rate": 0.0})
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=(64, 100, 1, 1))

    def step():
        with autograd.record():
            loss = (net(x).astype("float32") ** 2).mean()
        loss.backward()
        trainer.step(64)
        mx.nd.waitall()

    for _ in range(3):
        step()
    tic = time.perf_counter()
    for _ in range(3):
        step()
    ms = (time.perf_counter() - tic) / 3 * 1000
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=os.devnull)
    mx.profiler.set_state("run")
    for _ in range(2):
        step()
    mx.profiler.set_state("stop")
    operators = {}
    for line in mx.profiler.dumps(reset=True).splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1].isdigit() and not fields[0].startswith("MX"):
            operators[fields[0]] = round(float(fields[2]) / 2, 1)
    print(json.dumps({"route": route, "threads": os.environ.get("OMP_NUM_THREADS"), "load_average": os.getloadavg(),
                      "ms_per_step": round(ms, 1),
                      "operator_ms_per_step": dict(sorted(operators.items(), key=lambda kv: -kv[1]))}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
