"""Why ``Deconvolution`` stays float32 under AMP, and what bfloat16 would give: MXNet 1.9.1's own operator.

    OMP_NUM_THREADS=2 PYTHONPATH=. python docs/results/deconv-bf16-zen5/deconv_cases.py > cases.json

1. One training step (forward, backward) of a 512 -> 256 channel, 4x4, stride-2 ``Deconvolution`` on 16 4x4
   inputs, each case in its own process (a crash ends only it): the weight a leaf array, or computed in the graph
   (``w * 1``, or ``amp_cast`` as AMP inserts it), in float32 and bfloat16.
2. DCGAN's generator layers (batch 64) in both dtypes, forward and backward with a leaf weight: milliseconds per
   step, median of 5 after 2 untimed.
"""
import json
import os
import subprocess
import sys
import time

CASES = [(dtype, weight) for dtype in ("float32", "bfloat16") for weight in ("leaf", "w * 1", "amp_cast")
         if (dtype, weight) != ("float32", "amp_cast")]
GENERATOR = [(100, 512, 1, 1, 0), (512, 256, 4, 2, 1), (256, 128, 8, 2, 1), (128, 64, 16, 2, 1), (64, 3, 32, 2, 1)]


def arrays(dtype, shapes):
    import mxnet as mx
    import numpy as np

    bf16 = np.dtype([("bfloat16", np.uint16)])
    out = [mx.nd.random.uniform(-1, 1, shape=s) for s in shapes]
    return [mx.nd.amp_cast(a, dtype=bf16) for a in out] if dtype == "bfloat16" else out


def case(dtype, weight):
    import mxnet as mx
    import numpy as np
    from mxnet import autograd

    x, w = arrays(dtype if weight != "amp_cast" else "bfloat16", [(16, 512, 4, 4)])[0], arrays(
        "float32" if weight == "amp_cast" else dtype, [(512, 256, 4, 4)])[0]
    w.attach_grad()
    with autograd.record():
        wb = {"leaf": lambda: w, "w * 1": lambda: w * 1,
              "amp_cast": lambda: mx.nd.amp_cast(w, dtype=np.dtype([("bfloat16", np.uint16)]))}[weight]()
        y = mx.nd.Deconvolution(x, wb, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=256, no_bias=True)
    y.backward()
    mx.nd.waitall()


def layer_ms(dtype, cin, cout, size, stride, pad):
    import mxnet as mx
    from mxnet import autograd

    x, w = arrays(dtype, [(64, cin, size, size), (cin, cout, 4, 4)])
    x.attach_grad()
    w.attach_grad()
    times = []
    for i in range(7):
        tic = time.perf_counter()
        with autograd.record():
            y = mx.nd.Deconvolution(x, w, kernel=(4, 4), stride=(stride,) * 2, pad=(pad,) * 2, num_filter=cout,
                                    no_bias=True)
        y.backward()
        mx.nd.waitall()
        times.append((time.perf_counter() - tic) * 1000)
    return sorted(times[2:])[2]


def main():
    import mxfp16  # noqa: F401 -- MXNet's compat names, the threads

    if len(sys.argv) == 3:  # one case, in a child
        case(sys.argv[1], sys.argv[2])
        return

    results = {"threads": os.environ.get("OMP_NUM_THREADS"), "load_average": os.getloadavg(), "cases": []}
    for dtype, weight in CASES:
        proc = subprocess.run([sys.executable, __file__, dtype, weight], capture_output=True, text=True)
        results["cases"].append({"dtype": dtype, "weight": weight, "returncode": proc.returncode,
                                 "ok": proc.returncode == 0, "stderr_tail": proc.stderr.strip().splitlines()[-1:]})
    results["generator_ms"] = {dtype: {f"{cin}->{cout} at {size}px": round(layer_ms(dtype, cin, cout, size, s, p), 1)
                                       for cin, cout, size, s, p in GENERATOR} for dtype in ("float32", "bfloat16")}
    results["generator_total_ms"] = {d: round(sum(v.values()), 1) for d, v in results["generator_ms"].items()}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
