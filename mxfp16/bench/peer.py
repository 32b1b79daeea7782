"""A peer in the benchmark: the same training step in PyTorch, timed the same way, in its own process.

``mxfp16 bench --peer pytorch`` adds rows beside mxfp16's: the PyTorch network of the mxfp16 model's shape
(:data:`NETWORKS`, named in each record's ``network``), in float32 and ``torch.autocast`` bfloat16, eagerly and through
``torch.compile`` (:func:`variants` says which layouts run); ``--peer pytorch-eager`` leaves the compiled rows out. The
same as mxfp16's rows: sizes, synthetic data, SGD with momentum 0.9 and weight decay 1e-4 (a family: its own
optimizer), threads, warm-up, repeats, one process per row, peak resident memory.

A ResNet-50 peer is ResNet-50 v1.5 (torchvision's layout) where mxfp16's default is ResNet-50 v2: the same
convolutions and nearly the same work per image (about 4.1 GFLOPs forward at 224 px). torchvision has no CPU wheel for
every torch release, so :func:`_resnet50_v1_5` builds the same network when it does not import. The child imports
torch only, never MXNet.
"""
import contextlib
import importlib.util
import os
import resource
import time
from dataclasses import dataclass

import numpy as np

from .families import FAMILIES, family, record_fields, throughput_fields

__all__ = ["PeerSpec", "PEERS", "NETWORKS", "peer_network", "peer_models", "variants", "plan_peer",
           "run_in_subprocess", "build_network", "NETWORK"]

#: Peers ``--peer`` accepts: every row, or the eager rows only (no compiling).
PEERS = ("pytorch", "pytorch-eager")
#: GluonCV's MobileNet v2, the one zoo model besides ResNet-50 with a PyTorch twin.
MOBILENET_V2 = "mobilenetv2_1.0"
#: mxfp16's sequence models by ``--model`` name, as :data:`mxfp16.models.SEQUENCE_MODELS` spells them
#: (written out here because ``mxfp16.models`` imports MXNet, which the child never loads).
LSTM_CLASSIFIER = "lstm-classifier"
TRANSFORMER_ENCODER = "transformer-encoder"
#: What the PyTorch rows train for a ResNet-50.
NETWORK = "ResNet-50 v1.5 (torchvision layout)"
#: What the PyTorch rows train, by the mxfp16 model they stand beside (``"resnet50"``: any ResNet-50 name).
NETWORKS = {
    "resnet50": NETWORK,
    LSTM_CLASSIFIER: "LSTM classifier (nn.Linear+ReLU 128, nn.LSTM 128, mean over rows, nn.Linear; "
                     "the layers of mxfp16's lstm-classifier)",
    TRANSFORMER_ENCODER: "Transformer encoder classifier (nn.Linear 64 + learned positions, "
                         "2 x nn.TransformerEncoderLayer post-LN, 4 heads, GELU FFN 128, mean over rows, "
                         "nn.Linear; the layers of mxfp16's transformer-encoder)",
    MOBILENET_V2: "MobileNet v2 1.0 in torch.nn, GluonCV's layout (3x3 stem 32, 17 inverted residual blocks with "
                  "ReLU6, 1x1 to 1280, global pooling, 1x1 convolution head without bias)",
    **{name: f"{fam.title}; its twin in torch.nn" for name, fam in FAMILIES.items()},
}
#: The models whose networks are convolutions over images: channels_last applies.
CONVOLUTIONAL = ("resnet50", MOBILENET_V2, "dcgan")
#: (dtype, layout) of the eager rows, float32 NCHW first.
VARIANTS = (("float32", "NCHW"), ("float32", "channels_last"), ("bfloat16", "NCHW"), ("bfloat16", "channels_last"))
#: The rows of a sequence model. Its input is a sequence of image rows, fed to nn.Linear/nn.LSTM as
#: (N, H, 3*W): channels_last (a layout for 4-d convolution tensors) would change nothing these layers
#: compute, so it is not timed; "NCHW" says the rows are read from NCHW images, as the MXNet side does.
SEQUENCE_VARIANTS = (("float32", "NCHW"), ("bfloat16", "NCHW"))
#: The install that brings a CPU-only torch.
INSTALL = ("pip install -c constraints.txt 'mxfp16[peer]' --extra-index-url https://download.pytorch.org/whl/cpu "
           "(a CPU-only torch)")


def _key(model):
    """The :data:`NETWORKS` key for an mxfp16 model name, or ``None`` when the model has no peer."""
    if model in NETWORKS:
        return model
    # Every gluoncv ResNet-50 (v1, v1b, v1c, v1d, v2 ...) has ResNet-50's convolutions.
    return "resnet50" if model.lower().startswith("resnet50") else None


def peer_network(model):
    """The description (:data:`NETWORKS`) of the PyTorch network beside mxfp16's ``model``, or ``None``."""
    return NETWORKS.get(_key(model))


def peer_models():
    """The mxfp16 models that have a PyTorch peer, as a refusal message names them."""
    return (f"a ResNet-50 (resnet50_v2, resnet50_v1, resnet50_v1b ...), {LSTM_CLASSIFIER}, {TRANSFORMER_ENCODER}, "
            f"{MOBILENET_V2} or a family ({', '.join(FAMILIES)})")


def variants(model, compiled=True):
    """The rows timed for ``model``: ``(dtype, layout, compiled)``, eager ones first: :data:`VARIANTS` for a convolution
    network, :data:`SEQUENCE_VARIANTS` for an image read as rows, no layout for token ids; then with ``compiled`` each
    dtype in the faster layout (``channels_last`` for convolutions)."""
    key = _key(model)
    if key in CONVOLUTIONAL:
        eager, best = VARIANTS, "channels_last"
    elif family(model) is not None:
        eager, best = (("float32", None), ("bfloat16", None)), None
    else:
        eager, best = SEQUENCE_VARIANTS, "NCHW"
    rows = [(dtype, layout, False) for dtype, layout in eager]
    return rows + ([(dtype, best, True) for dtype in ("float32", "bfloat16")] if compiled else [])


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
    compiled: bool = False
    options: dict = None

    @property
    def precision(self):
        return f"pytorch-{self.dtype}"


def plan_peer(base, batch_sizes, threads, compiled=True):
    """The PyTorch specs for ``base``'s model shape at every batch size (rows as :func:`variants` says)."""
    return [PeerSpec(model=base.model, image_size=base.image_size, batch_size=int(b), classes=base.classes,
                     iters=base.iters, warmup=base.warmup, repeats=base.repeats, dtype=dtype, layout=layout,
                     threads=threads, seed=base.seed, compiled=is_compiled,
                     options=getattr(base, "options", None))
            for b in batch_sizes for dtype, layout, is_compiled in variants(base.model, compiled)]


def _base_record(spec):
    return {**record_fields(spec.model, spec.options),
            "framework": "pytorch", "network": peer_network(spec.model), "precision": spec.precision,
            "requested_precision": spec.precision, "layout": spec.layout, "compiled": spec.compiled,
            "amp_lists": None, "batch_size": spec.batch_size, "image_size": spec.image_size, "model": spec.model,
            "mode": "train", "data": "synthetic", "ctx": "cpu", "threads": spec.threads}


def not_run(spec, status, reason):
    """The record of a PyTorch row that did not produce timings."""
    return dict(_base_record(spec), status=status, reason=reason, images_per_second=None, ms_per_step=None,
                ms_per_step_spread=None, peak_memory_mb=None)


def run_in_subprocess(spec, timeout=None):
    """Measure ``spec`` in a fresh process; never raises (see :func:`mxfp16.plumbing.child.call_in_child`)."""
    from ..plumbing.child import call_in_child

    if importlib.util.find_spec("torch") is None:
        return not_run(spec, "skipped", f"PyTorch is not installed: {INSTALL}")
    record, problem = call_in_child(_measure, spec, timeout=timeout)
    return record if record is not None else not_run(spec, "failed", problem)


# ---- the child: torch only ---------------------------------------------------------------------
def _resnet50_v1_5(classes):
    """torchvision's ResNet-50 (v1.5: stride in the 3x3 convolution), or the same network built here."""
    from torch import nn

    with contextlib.suppress(Exception):  # torchvision missing, or built for another torch
        from torchvision.models import resnet50
        return resnet50(num_classes=classes)

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


def _rows(x):
    """``(N, C, H, W)`` images as ``(N, H, C*W)`` sequences, as :func:`mxfp16.models.sequence._rows` reads them."""
    return x.permute(0, 2, 1, 3).flatten(2)


def _lstm_classifier(classes, in_shape, hidden=128):
    """The layers of :class:`mxfp16.models.LSTMClassifier` in PyTorch, reading images as :func:`_rows` does (PyTorch
    has no deferred shapes). Two LSTM biases per gate, as MXNet's ``i2h`` and ``h2h``, so the parameter count is the
    MXNet model's."""
    from torch import nn

    channels, _, width = (int(n) for n in in_shape)

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Sequential(nn.Linear(channels * width, hidden), nn.ReLU())
            self.rnn = nn.LSTM(hidden, hidden, num_layers=1, batch_first=True)
            self.drop = nn.Dropout(0.0)
            self.output = nn.Linear(hidden, classes)

        def forward(self, x):
            seq, _ = self.rnn(self.embed(_rows(x)))
            return self.output(self.drop(seq.mean(dim=1)))

    return LSTMClassifier()


def _transformer_encoder_classifier(classes, in_shape, units=64, heads=4, ffn_units=128, num_layers=2):
    """The layers of :class:`mxfp16.models.TransformerEncoderClassifier` in PyTorch (mxfp16's default sizes), reading
    images as :func:`_rows` does. ``nn.TransformerEncoderLayer`` post-LN with GELU is mxfp16's
    :class:`~mxfp16.models.EncoderBlock`: its packed q/k/v projection holds MXNet's three Dense layers' weights."""
    import torch
    from torch import nn

    channels, height, width = (int(n) for n in in_shape)

    class TransformerEncoderClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(channels * width, units)
            self.position = nn.Parameter(torch.empty(1, height, units))
            nn.init.normal_(self.position, std=0.02)  # as MXNet's init.Normal(0.02)
            layer = nn.TransformerEncoderLayer(units, heads, dim_feedforward=ffn_units, dropout=0.0,
                                               activation="gelu", batch_first=True, norm_first=False)
            # enable_nested_tensor only matters with padding masks, and warns for batch_first layers
            self.blocks = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
            self.output = nn.Linear(units, classes)

        def forward(self, x):
            tokens = self.embed(_rows(x)) + self.position
            return self.output(self.blocks(tokens).mean(dim=1))

    return TransformerEncoderClassifier()


def build_network(model, classes, image_size):
    """The PyTorch network beside mxfp16's ``model`` (:func:`peer_network`) for square images of ``image_size``; a
    ``ValueError`` where ``model`` has none, or is a family (:func:`mxfp16.bench.peer_families.build_networks`)."""
    key = _key(model)
    in_shape = (3, image_size, image_size)
    if key == "resnet50":
        return _resnet50_v1_5(classes)
    if key == MOBILENET_V2:
        from .peer_families import mobilenet_v2

        return mobilenet_v2(classes)
    if key == LSTM_CLASSIFIER:
        return _lstm_classifier(classes, in_shape)
    if key == TRANSFORMER_ENCODER:
        return _transformer_encoder_classifier(classes, in_shape)
    raise ValueError(f"{model!r} has no PyTorch peer; the peer times {peer_models()}")


def _classifier_step(spec):
    """An image classifier's step: SGD with momentum on a fixed synthetic batch, forward under autocast."""
    import torch
    import torch.nn.functional as F

    if spec.layout != "NCHW" and _key(spec.model) not in CONVOLUTIONAL:
        raise ValueError(f"{spec.model!r} reads image rows as a sequence: only the NCHW layout applies, "
                         f"not {spec.layout!r}")
    net = build_network(spec.model, spec.classes, spec.image_size)
    rng = np.random.RandomState(spec.seed)
    x = torch.from_numpy(rng.standard_normal((spec.batch_size, 3, spec.image_size, spec.image_size))
                         .astype(np.float32))
    y = torch.from_numpy(rng.randint(0, spec.classes, spec.batch_size).astype(np.int64))
    if spec.layout == "channels_last":
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    run = torch.compile(net) if spec.compiled else net
    bfloat16 = spec.dtype == "bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            loss = F.cross_entropy(run(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def _measure(spec):
    """Time the PyTorch training step for ``spec`` in this process.

    A compiled row runs at least one untimed step, the one that compiles (``compile_seconds``). CPU steps return when
    their work is done, so each repeat's clock stops on a finished step.
    """
    import torch

    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    if family(spec.model) is not None:
        from .peer_families import family_step

        step = family_step(spec.model, spec.options, spec.batch_size, spec.dtype == "bfloat16", spec.compiled,
                           channels_last=spec.layout == "channels_last", seed=spec.seed)
    else:
        step = _classifier_step(spec)
    warmup = max(spec.warmup, 1) if spec.compiled else spec.warmup
    compile_seconds = None
    for i in range(warmup):
        start = time.perf_counter()
        step()
        if i == 0 and spec.compiled:
            compile_seconds = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(spec.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        losses = [step() for _ in range(spec.iters)]
        float(torch.stack(losses).sum())  # read once per repeat, as the mxfp16 rows do
        wall.append((time.perf_counter() - start) / spec.iters)
        cpu.append((time.process_time() - start_cpu) / spec.iters)
    median = float(np.median(wall))
    return dict(_base_record(spec), status="ok", reason=None, torch_version=torch.__version__,
                threads=torch.get_num_threads(),
                **throughput_fields(spec.model, spec.batch_size, spec.options, median),
                ms_per_step=1000.0 * median, ms_per_step_spread=500.0 * (max(wall) - min(wall)),
                ms_per_step_repeats=[1000.0 * t for t in wall], cpu_ms_per_step=1000.0 * float(np.median(cpu)),
                peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10,
                iters=spec.iters, warmup=warmup, repeats=spec.repeats, compile_seconds=compile_seconds,
                load_average=list(os.getloadavg()))
