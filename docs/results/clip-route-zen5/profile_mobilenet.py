"""MXNet's profiler on one MobileNet v2 training step under amp-bfloat16: milliseconds per step by operator.

    OMP_NUM_THREADS=2 PYTHONPATH=. python docs/results/clip-route-zen5/profile_mobilenet.py mxfp16 > out.json

MobileNet v2 1.0, 224 px, batch 16, 102 classes, built by ``mxfp16.train.parts.build_parts`` (the trainer's and
``mxfp16 bench``'s path) with the AMP lists named on the command line; 3 steps untimed, then 2 profiled (bulk
execution off, so each operator is timed on its own). Run in a checkout at each commit to compare them.
"""
import json
import os
import subprocess
import sys

os.environ["MXNET_EXEC_BULK_EXEC_TRAIN"] = "0"

import mxfp16  # noqa: E402 -- after the variable, which MXNet reads when it loads
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxfp16.train.parts import PartsSpec, build_parts  # noqa: E402

STEPS = 2


def main(lists):
    mixed = mxfp16.MixedPrecision("amp-bfloat16", "cpu", amp_lists=lists, log=lambda line: None)
    parts = build_parts(PartsSpec(model="mobilenetv2_1.0", classes=102, image_size=224, batch_size=16,
                                  optimizer="sgd", lr=0.01, momentum=0.9, wd=1e-4, seed=0), mixed)
    x = mx.nd.array(np.random.RandomState(0).standard_normal((16, 3, 224, 224)).astype(np.float32))
    y = mx.nd.array(np.arange(16) % 102)

    def step():
        data, label = mixed.cast_batch(x, y)
        return mixed.train_step(parts.net, parts.loss, parts.trainer, data, label).loss.asnumpy()

    for _ in range(3):
        step()
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=os.devnull)
    mx.profiler.set_state("run")
    for _ in range(STEPS):
        step()
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    operators = {}
    for line in mx.profiler.dumps(reset=True).splitlines():
        fields = line.split()
        # Operator rows: name, count, total ms, ...; the C API's rows (MX...) time the waits, not the work.
        if len(fields) >= 6 and fields[1].isdigit() and not fields[0].startswith("MX"):
            operators[fields[0]] = {"ms_per_step": round(float(fields[2]) / STEPS, 1),
                                    "calls_per_step": int(fields[1]) // STEPS}
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"lists": lists, "commit": commit, "threads": os.environ.get("OMP_NUM_THREADS"),
                      "load_average": os.getloadavg(),
                      "operator_ms_per_step": round(sum(o["ms_per_step"] for o in operators.values()), 1),
                      "operators": dict(sorted(operators.items(), key=lambda kv: -kv[1]["ms_per_step"]))},
                     indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
