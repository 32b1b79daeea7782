"""A peer in the benchmark: the same training step in PyTorch, timed the same way, in its own process.

``mxfp16 bench --peer pytorch`` adds four rows beside mxfp16's: PyTorch's
ResNet-50 training step in float32 and with ``torch.autocast`` bfloat16,
each in NCHW and in ``channels_last`` memory layout. What is the same as the
mxfp16 rows: image size, batch size, class count, synthetic data, SGD with
momentum 0.9 and weight decay 1e-4, the thread count (``torch.set_num_threads``
with the count mxfp16 gives MXNet), warm-up steps, repeats of ``iters``
steps with the median taken, one process per row, peak resident memory.
What differs, and the report says so: the network is ResNet-50 v1.5
(torchvision's layout: post-activation blocks, stride in the 3x3
convolution) where mxfp16's default is gluoncv's ResNet-50 v2
(pre-activation); the two have the same convolutions and nearly the same
work per image (about 4.1 GFLOPs forward at 224 px).

torchvision's ``resnet50`` is used when it imports; otherwise (torchvision
has no CPU wheel matching every torch release) :func:`resnet50_v1_5` builds
the same network. The child imports torch only, never MXNet.
"""
import argparse
import importlib.util
import json
import os
import resource
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["PeerSpec", "PEERS", "plan_peer", "run_in_subprocess", "resnet50_v1_5", "NETWORK"]

#: Peers ``--peer`` accepts.
PEERS = ("pytorch",)
#: What the PyTorch rows train.
NETWORK = "ResNet-50 v1.5 (torchvision layout)"
#: (dtype, layout) of the rows, float32 NCHW first.
VARIANTS = (("float32", "NCHW"), ("float32", "channels_last"), ("bfloat16", "NCHW"), ("bfloat16", "channels_last"))
#: The install that brings a CPU-only torch.
INSTALL = ("pip install -c constraints.txt 'mxfp16[peer]' --extra-index-url https://download.pytorch.org/whl/cpu "
           "(a CPU-only torch)")


@dataclass(frozen=True)
class PeerSpec:
    """One PyTorch row: what :class:`~mxfp16.bench.runner.BenchSpec` holds, plus dtype and layout."""

    model: str
    image_size: int
    batch_size: int
    classes: int
    iters: int
    warmup: int
    repeats: int
    dtype: str = "float32"
    layout: str = "NCHW"
    threads: int = 1
    seed: int = 0

    @property
    def precision(self):
        return f"pytorch-{self.dtype}"

    def to_json(self):
        return json.dumps(asdict(self))


def plan_peer(base, batch_sizes, threads):
    """The PyTorch specs for ``base``'s model shape at every batch size."""
    return [PeerSpec(model=base.model, image_size=base.image_size, batch_size=int(b), classes=base.classes,
                     iters=base.iters, warmup=base.warmup, repeats=base.repeats, dtype=dtype, layout=layout,
                     threads=threads, seed=base.seed)
            for b in batch_sizes for dtype, layout in VARIANTS]


def _base_record(spec):
    return {"framework": "pytorch", "network": NETWORK, "precision": spec.precision,
            "requested_precision": spec.precision, "layout": spec.layout, "amp_lists": None,
            "batch_size": spec.batch_size, "image_size": spec.image_size, "model": spec.model, "mode": "train",
            "data": "synthetic", "ctx": "cpu", "threads": spec.threads}


def not_run(spec, status, reason):
    """The record of a PyTorch row that did not produce timings."""
    return dict(_base_record(spec), status=status, reason=reason, images_per_second=None, ms_per_step=None,
                ms_per_step_spread=None, peak_memory_mb=None)


def torch_missing():
    """Why the PyTorch rows cannot run here, or ``None`` when torch is installed."""
    if importlib.util.find_spec("torch") is None:
        return f"PyTorch is not installed: {INSTALL}"
    return None


def run_in_subprocess(spec, timeout=None):
    """Measure ``spec`` in a fresh process; never raises (see :func:`mxfp16.child.run_json_child`)."""
    from ..child import run_json_child

    missing = torch_missing()
    if missing:
        return not_run(spec, "skipped", missing)
    record, problem = run_json_child("mxfp16.bench.peer", ["--spec", spec.to_json()], timeout=timeout)
    return record if record is not None else not_run(spec, "failed", problem)


# ---- the child: torch only ---------------------------------------------------------------------
def resnet50_v1_5(classes):
    """torchvision's ResNet-50 (v1.5: stride in the 3x3 convolution), or the same network built here."""
    from torch import nn

    try:
        from torchvision.models import resnet50
        return resnet50(num_classes=classes)
    except Exception:  # torchvision missing, or built for another torch
        pass

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride):
            super().__init__()
            out = planes * 4
            self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                               if stride != 1 or inplanes != out else None)

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + identity)

    layers, inplanes = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                        nn.MaxPool2d(3, 2, 1)], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * 4
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, classes))
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


def measure(spec):
    """Time the PyTorch training step for ``spec`` in this process."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    net = resnet50_v1_5(spec.classes)
    rng = np.random.RandomState(spec.seed)
    x = torch.from_numpy(rng.standard_normal((spec.batch_size, 3, spec.image_size, spec.image_size))
                         .astype(np.float32))
    y = torch.from_numpy(rng.randint(0, spec.classes, spec.batch_size).astype(np.int64))
    if spec.layout == "channels_last":
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    bfloat16 = spec.dtype == "bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    for _ in range(spec.warmup):
        step()
    wall, cpu = [], []
    for _ in range(spec.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        losses = [step() for _ in range(spec.iters)]
        float(torch.stack(losses).sum())  # read once per repeat, as the mxfp16 rows do
        wall.append((time.perf_counter() - start) / spec.iters)
        cpu.append((time.process_time() - start_cpu) / spec.iters)
    median = float(np.median(wall))
    return dict(_base_record(spec), status="ok", reason=None, torch_version=torch.__version__,
                threads=torch.get_num_threads(), images_per_second=spec.batch_size / median,
                ms_per_step=1000.0 * median, ms_per_step_spread=500.0 * (max(wall) - min(wall)),
                ms_per_step_repeats=[1000.0 * t for t in wall], cpu_ms_per_step=1000.0 * float(np.median(cpu)),
                peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10,
                iters=spec.iters, warmup=spec.warmup, repeats=spec.repeats,
                load_average=list(os.getloadavg()))


def main(argv=None):
    """Child entry point: measure one PyTorch spec and write its record to ``--result``."""
    parser = argparse.ArgumentParser(prog="python -m mxfp16.bench.peer")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    spec = PeerSpec(**json.loads(args.spec))
    try:
        record = measure(spec)
    except Exception:  # the parent reports it and carries on with the other rows
        record = not_run(spec, "failed", traceback.format_exc(limit=6).strip())
    from ..fileio import write_json

    write_json(args.result, record)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
