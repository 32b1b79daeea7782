"""One worker of the raw kvstore test (run under ``mxfp16 launch``; see test_distributed.py).

It trains ``mxfp16.models.elementwise_mlp`` for a few steps with
``mxfp16.train_step`` and a ``dist_sync`` kvstore, on its own shard of a
global batch that every worker can regenerate from a seed, and writes
``rank<R>.json`` to ``--out``:

* ``digest``: SHA-256 of the final trainable parameters, in a fixed order;
* ``bytes_pushed``: gradient bytes handed to the kvstore at each step,
  counted on the arrays themselves, and ``tcp_bytes_sent_per_step``: what
  this process really sent over TCP per step after the first (``ss``);
* ``skipped``: the steps the loss scaler skipped, and the parameter digests
  before and after each step;
* with ``--reference``, rank 0 also trains the same network in this one
  process on the whole global batch and records the largest difference.

``--kill-step K`` makes worker ``--overflow-rank`` die by SIGKILL at step K.

``--overflow-step K --overflow-rank R``: at step K, worker R's local
gradient is set to inf just before it is pushed. The other workers' local
gradients stay finite, so only a check on the *reduced* gradients makes
every worker skip that step.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import mxfp16  # before mxnet: the numpy names MXNet 1.9.1 needs on numpy 1.24+
from mxfp16.distributed import sync_parameters
from mxfp16.models import elementwise_mlp

import mxnet as mx
import numpy as np

IN_UNITS, HIDDEN, CLASSES = 8, 16, 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--precision", default="float32", choices=["float32", "float16"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8, help="samples per worker per step")
    parser.add_argument("--out", required=True)
    parser.add_argument("--overflow-step", type=int, default=-1)
    parser.add_argument("--overflow-rank", type=int, default=1)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--kill-step", type=int, default=-1,
                        help="worker --overflow-rank kills itself (SIGKILL) at this step")
    return parser.parse_args(argv)


def global_batches(steps, batch, num_workers):
    """The same global batches on every worker (fixed seed); row i goes to worker i % num_workers."""
    rng = np.random.RandomState(0)
    size = batch * num_workers
    return [(rng.uniform(-1, 1, (size, IN_UNITS)).astype("float32"),
             rng.randint(0, CLASSES, size).astype("float32")) for _ in range(steps)]


def build(precision, seed):
    mx.random.seed(seed)
    net = elementwise_mlp(IN_UNITS, [HIDDEN], CLASSES, batchnorm=False, prefix="mlp_")
    net.initialize(ctx=mx.cpu())
    mxfp16.cast_net(net, precision.param_dtype)
    return net


def make_scaler(precision):
    # 2**10 rather than 2**16: scaled float16 gradients of this network fit,
    # so the injected overflow is the only skipped step.
    return mxfp16.make_loss_scaler(precision, init_scale=2.0 ** 10)


def trainable(net):
    return [p for _, p in sorted(net.collect_params().items()) if p.grad_req != "null"]


def digest(net):
    sha = hashlib.sha256()
    for p in trainable(net):
        value = p.data().asnumpy()
        sha.update(f"{p.name}:{value.dtype}:{value.shape};".encode())
        sha.update(np.ascontiguousarray(value).tobytes())
    return sha.hexdigest()


def tcp_bytes_sent():
    """Bytes this process has sent over its TCP sockets (``ss`` from iproute2), or None without ``ss``."""
    try:
        text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    total, mine = 0, False
    for line in text.splitlines():
        if not line[:1].isspace():  # a socket line; its details follow on an indented line
            mine = f"pid={os.getpid()}," in line
        elif mine:
            found = re.search(r"bytes_sent:(\d+)", line)
            total += int(found.group(1)) if found else 0
    return total


class WireTap:
    """Wraps ``kv.pushpull``: counts the bytes of every pushed gradient, can poison one push."""

    def __init__(self, kv):
        self.kv, self.pushpull = kv, kv.pushpull
        self.bytes = 0
        self.poison_next = False
        kv.pushpull = self

    def __call__(self, key, value, out=None, priority=0):
        arrays = value if isinstance(value, (list, tuple)) else [value]
        if self.poison_next:
            arrays[0][:] = np.inf
            self.poison_next = False
        self.bytes += sum(a.size * np.dtype(a.dtype).itemsize for a in arrays)
        return self.pushpull(key, value, out=out, priority=priority)


def train(net, trainer, scaler, batches, rows, args, tap=None, rank=0, first_step=0):
    """Run the steps; return per-step records."""
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    precision = mxfp16.resolve_precision(args.precision, "cpu", allow_cpu_float16=True)
    records = []
    global_size = len(batches[0][0])
    for step, (x, y) in enumerate(batches, first_step):
        data, label = mxfp16.cast_batch(mx.nd.array(x[rows]), mx.nd.array(y[rows]), precision.data_dtype, [mx.cpu()])
        if step == args.kill_step and rank == args.overflow_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash the worker cannot report
        before = digest(net)
        if tap is not None:
            tap.bytes = 0
            tap.poison_next = step == args.overflow_step and rank == args.overflow_rank
        # Every worker divides by the global batch: the update then equals one
        # process training on the whole global batch.
        result = mxfp16.train_step(net, loss_fn, trainer, data, label, scaler, batch_size=global_size)
        records.append({"step": step, "skipped": result.skipped, "loss_scale": result.loss_scale,
                        "loss": result.loss.item(), "digest_before": before, "digest_after": digest(net),
                        "bytes_pushed": tap.bytes if tap is not None else None})
    return records


def reference_difference(initial, batches, args):
    """Train the same network in this process on the whole global batch; largest |difference| later."""
    precision = mxfp16.resolve_precision(args.precision, "cpu", allow_cpu_float16=True)
    net = build(precision, seed=12345)
    for p, value in zip(trainable(net), initial):
        p.set_data(value)
    scaler = make_scaler(precision)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, precision, scaler,
                                  kvstore=None)
    train(net, trainer, scaler, batches, slice(None), args)
    return net


def main(argv=None):
    args = parse_args(argv)
    kv = mx.kv.create("dist_sync")
    rank, workers = kv.rank, kv.num_workers
    precision = mxfp16.resolve_precision(args.precision, "cpu", allow_cpu_float16=True)
    mxfp16.activate(precision)
    # A different seed per worker: equal parameters can only come from the kvstore.
    net = build(precision, seed=1 + rank)
    initial = [p.data().copy() for p in trainable(net)]
    scaler = make_scaler(precision)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, precision, scaler,
                                  kvstore=kv, update_on_kvstore=False)
    sync_parameters(trainer)
    start_digest = digest(net)
    tap = WireTap(kv)
    batches = global_batches(args.steps, args.batch, workers)
    rows = np.arange(rank, args.batch * workers, workers)  # this worker's shard of every global batch
    records = train(net, trainer, scaler, batches[:1], rows, args, tap, rank)
    mx.nd.waitall()
    sent_before = tcp_bytes_sent()  # after the first step: set-up traffic excluded
    records += train(net, trainer, scaler, batches[1:], rows, args, tap, rank, first_step=1)
    mx.nd.waitall()
    sent_after = tcp_bytes_sent()
    report = {
        "rank": rank, "num_workers": workers, "precision": args.precision,
        "param_dtypes": sorted({str(np.dtype(p.dtype)) for p in trainable(net)}),
        "start_digest": start_digest, "digest": digest(net), "steps": records,
        "skipped": [r["step"] for r in records if r["skipped"]],
        "tcp_bytes_sent_per_step": None if sent_before is None else (sent_after - sent_before) / (len(records) - 1),
        "kvstore_keys": len(trainable(net)),
    }
    if args.reference and rank == 0:
        ref = reference_difference(initial, batches, args)
        report["reference_max_abs_diff"] = max(
            float(np.abs(a.data().asnumpy().astype("float64") - b.data().asnumpy()).max())
            for a, b in zip(trainable(ref), trainable(net)))
        report["reference_max_abs_change"] = max(
            float(np.abs(a.data().asnumpy().astype("float64") - b.asnumpy()).max())
            for a, b in zip(trainable(ref), initial))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle, indent=1)
    print(f"rank {rank}: {len(records)} steps, skipped {report['skipped']}, digest {report['digest'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
