"""One ``mxfp16 bench`` invocation as a library call: check the request, plan the runs, record the results.

:func:`plan_invocation` checks everything a user can get wrong before any run starts and returns the runs to make;
:func:`record_invocation` writes ``bench.json``, ``bench.csv`` and the plots. ``mxfp16 bench`` calls these two around
:func:`mxfp16.bench.suite.run_suite`.
"""
import os
from dataclasses import dataclass, field, replace

from ..plumbing.fileio import JSONFileError, read_json
from ..plumbing.limits import MAX_BATCH
from .families import FAMILIES, FamilyError, family, resolve_options

__all__ = ["BenchSetupError", "Invocation", "plan_invocation", "record_invocation", "BATCH_SIZES", "ITERS"]

#: Per-mode defaults: inference asks about one request (batch 1) and about a full batch.
BATCH_SIZES = {"train": "16,32", "inference": "1,32"}
ITERS = {"train": 10, "inference": 30}


class BenchSetupError(ValueError):
    """A benchmark request that cannot run; the message names the flag and the fix."""


@dataclass
class Invocation:
    """What :func:`plan_invocation` decided: the runs, and what the report records beside them."""

    specs: list
    iters: int
    batch_sizes: list
    classes: int
    tensor_cores: dict
    machine: dict
    threads: dict
    load_start: tuple
    peer_network: str = None
    input_size: str = ""
    auto: dict = field(default_factory=dict)


def int_list(text, flag, high=MAX_BATCH):
    """``'16,32'`` as ``[16, 32]``, each between 1 and ``high``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchSetupError(f"{flag} {text!r} is not a comma-separated list of positive integers; e.g. {flag} 16,32")
    if max(values) > high:
        raise BenchSetupError(f"{flag} {max(values)}: at most {high}; e.g. {flag} 16,32")
    return values


def _precisions(text):
    from ..precision import PRECISIONS, PrecisionError, check_precision_name

    precisions, unknown = [], []
    for name in (p for p in text.split(",") if p.strip()):
        try:
            precisions.append(check_precision_name(name))
        except PrecisionError:
            unknown.append(name.strip())
    if not precisions or unknown:
        raise BenchSetupError(f"unknown precision(s) {', '.join(unknown) or '(none given)'}; choose from "
                              f"{', '.join(PRECISIONS)}, e.g. --precisions float32,auto")
    return precisions


def _amp_lists(text):
    from ..amp.lists import LIST_SETS

    lists = [name.strip() for name in text.split(",") if name.strip()]
    if not lists or any(name not in LIST_SETS for name in lists):
        raise BenchSetupError(f"--amp-lists {text!r}: choose from {', '.join(LIST_SETS)}, "
                              "e.g. --amp-lists mxfp16,mxnet")
    return lists


def data_classes(data, pipeline):
    """The class count of a data set named by ``--data``/``--pipeline``, checked before any run starts."""
    if pipeline == "folder" and not os.path.isdir(data):
        hint = ("; it looks like a RecordIO pack: add --pipeline recordio"
                if os.path.isfile(f"{data}_train.rec") else "")
        raise BenchSetupError(f"--data {data!r} is neither 'synthetic' nor a folder{hint}; make one with "
                              "`mxfp16 data synth --out DIR` or use --data synthetic")
    if pipeline == "recordio":
        from ..data.layout import pack_problem
        from ..data.pipelines import classes_file

        if problem := pack_problem(data, flag="--data"):  # a split or the raw download: name the pack command
            raise BenchSetupError(problem)
        meta = classes_file(data)
        try:
            return len(read_json(meta, fields={"classes": list})["classes"])
        except JSONFileError:
            raise BenchSetupError(f"--data {data!r} with --pipeline recordio: {meta} is missing or unreadable, so "
                                  f"{data!r} is not a complete pack; make one with `mxfp16 data pack --src DIR "
                                  f"--out {data}`") from None
    train = os.path.join(data, "train")
    if not os.path.isdir(train):
        from ..data.layout import split_problem

        if problem := split_problem(data, then="pass --data {split}"):
            raise BenchSetupError(problem)
        raise BenchSetupError(f"--data {data!r} has no train/ folder; make one with `mxfp16 data split` or "
                              "`mxfp16 data synth --out DIR`, or use --data synthetic")
    return len([d for d in os.listdir(train) if os.path.isdir(os.path.join(train, d))])


def plan_invocation(model="resnet50_v2", image_size=None, batch_sizes=None, precisions="float32,auto",
                    amp_lists="mxfp16", mode="train", data="synthetic", pipeline="folder", workers=0, classes=None,
                    ctx="auto", iters=None, warmup=3, repeats=3, peer=None, onnxruntime=False, model_options=None,
                    log=print):
    """Check a benchmark request and plan its runs (the ``mxfp16 bench`` flags, as text where they are text).

    image_size, classes : int or None
        An image model's (``None``: 224 px and 102 classes); a family has
        its own sizes and refuses both.
    peer : str or None
        ``'pytorch'`` (eager and compiled rows) or ``'pytorch-eager'``.
    model_options : sequence of str or dict, optional
        A family's sizes to change (``["hidden=16"]``, see
        :func:`mxfp16.bench.families.resolve_options`).
    log : callable
        Told what ``auto`` resolved to, and why (one line per batch size).

    Returns
    -------
    Invocation

    Raises
    ------
    BenchSetupError
        Anything that would make a run fail: names, sizes, the data set, the
        model, ``peer`` outside its conditions, or ``onnxruntime`` outside
        inference mode.
    """
    from ..machine import hardware
    from ..machine.environment import thread_report
    from ..measure.auto import route_lists
    from ..models import ModelError
    from .report import input_size
    from .runner import BenchSpec
    from .suite import plan
    from .tensor_cores import family_tensor_core_report, model_tensor_core_report

    precision_names, lists = _precisions(precisions), _amp_lists(amp_lists)
    fam = family(model)
    if fam is not None:
        options = _family_request(fam, image_size, classes, mode, data, model_options)
        image_size = fam.image_size  # classes stays None: a family's sizes are its options
        batch_sizes = batch_sizes or str(fam.batch_size)
    elif model_options:
        raise BenchSetupError(f"--model-option sets a family's sizes ({', '.join(FAMILIES)}); {model!r} takes "
                              "--image-size and --classes")
    else:
        options, image_size, classes = None, 224 if image_size is None else image_size, classes or 102
    sizes = int_list(batch_sizes or BATCH_SIZES[mode], "--batch-sizes")
    if onnxruntime and mode != "inference":
        raise BenchSetupError("--onnxruntime times the exported network's forward pass: use it with --mode inference")
    network = _peer_network(peer, model, mode, data, ctx)
    iters = ITERS[mode] if iters is None else iters
    try:
        base = BenchSpec(model=model, image_size=image_size, mode=mode, iters=iters, warmup=warmup,
                         repeats=repeats, data=data, pipeline=pipeline, workers=workers, ctx=ctx, classes=classes,
                         options=options)
    except ValueError as err:
        raise BenchSetupError(f"{err}; see mxfp16 bench --help") from None
    n_classes = classes if data == "synthetic" else data_classes(data, pipeline)
    try:
        # Building the model here also checks its name (and a family's sizes) before any run starts.
        tensor_cores = (family_tensor_core_report(model, options, sizes) if fam else
                        model_tensor_core_report(model, n_classes, image_size, sizes))
    except (ModelError, ValueError) as err:
        raise BenchSetupError(str(err)) from None
    verdicts = _auto_verdicts(replace(base, amp_lists=lists[0]), precision_names, sizes, n_classes, log)
    auto_lists = {size: route_lists(verdict.route, lists[0]) for size, verdict in verdicts.items()}
    specs = plan(base, precision_names, sizes, lists,
                 auto={size: (verdict.precision, auto_lists[size] if verdict.route else None)
                       for size, verdict in verdicts.items()} or None,
                 onnxruntime=onnxruntime, auto_in_row=fam is not None and _timed_auto(precision_names, ctx))
    machine, threads = hardware.machine_summary(), thread_report()
    specs += _peer_specs(peer, machine, ctx, base, sizes, threads)
    return Invocation(specs=specs, iters=iters, batch_sizes=sizes, classes=n_classes, tensor_cores=tensor_cores,
                      machine=machine, threads=threads, load_start=os.getloadavg(), peer_network=network,
                      input_size=input_size({"image_size": image_size, "seq_len": (options or {}).get("seq_len")}),
                      auto={str(size): dict(v.record(), amp_lists=auto_lists[size]) for size, v in verdicts.items()})


def _peer_specs(peer, machine, ctx, base, sizes, threads):
    """The PyTorch peer's runs (none without ``peer``), after refusing a peer that would not run on the CPU."""
    if not peer:
        return []
    if machine["gpus"] and ctx.strip().lower() == "auto":
        raise BenchSetupError("--peer pytorch runs on the CPU; add --ctx cpu to compare on the CPU")
    from .peer import plan_peer

    return plan_peer(base, sizes, threads["planned"], compiled=peer == "pytorch")


def _peer_network(peer, model, mode, data, ctx):
    """The PyTorch network ``peer`` times for ``model`` (``None`` without a peer), after refusing what it cannot."""
    if not peer:
        return None
    from .peer import PEERS, peer_models, peer_network  # imports neither torch nor MXNet

    if peer not in PEERS:
        raise BenchSetupError(f"--peer {peer!r}: choose from {', '.join(PEERS)}")
    if mode != "train" or data != "synthetic" or ctx.strip().lower() not in ("auto", "cpu"):
        raise BenchSetupError("--peer pytorch times a CPU training step on synthetic data: use it with --mode train, "
                              "--data synthetic and --ctx cpu (or auto on a machine without GPUs)")
    if (network := peer_network(model)) is None:
        raise BenchSetupError(f"--peer pytorch has a PyTorch network only for {peer_models()}: use --model with "
                              f"one of these, not {model!r}")
    return network


def _family_request(fam, image_size, classes, mode, data, model_options):
    """A family's resolved sizes, after refusing what does not apply to it."""
    if image_size not in (None, fam.image_size) or classes is not None:
        what = "--classes" if classes is not None else "--image-size"
        raise BenchSetupError(f"{fam.name} has its own sizes, so {what} does not apply; change them with "
                              f"--model-option KEY=VALUE ({', '.join(f'{k}={v}' for k, v in fam.options.items())})")
    if mode != "train" or data != "synthetic":
        raise BenchSetupError(f"{fam.name} is timed as a training step on synthetic batches: use --mode train and "
                              "--data synthetic")
    try:
        return resolve_options(fam.name, model_options)
    except FamilyError as err:
        raise BenchSetupError(str(err)) from None


def _timed_auto(precisions, ctx):
    """Whether ``auto`` is asked for where timing decides it (a CPU with native bfloat16): a family's ``auto`` row then
    decides in its own process, at its first step (:func:`mxfp16.bench.suite.plan`)."""
    from ..devices import resolve_devices
    from ..measure.auto import timing_applies

    return "auto" in precisions and timing_applies(resolve_devices(ctx))


def _auto_verdicts(base, precisions, sizes, classes, log):
    """``{batch size: AutoVerdict}`` where ``auto`` is decided by timing the model (training on a CPU), else ``{}``:
    what the trainer would train in for this model, shape and batch (:func:`mxfp16.train.parts.auto_verdict`)."""
    from ..devices import resolve_devices
    from ..train.parts import PartsSpec, auto_verdict

    ctx = resolve_devices(base.ctx)
    if "auto" not in precisions or base.mode != "train" or any(c.device_type != "cpu" for c in ctx) \
            or family(base.model) is not None:  # a family's auto decides in its own row (plan's auto_in_row)
        return {}
    verdicts = {}
    for size in sizes:
        spec = PartsSpec(model=base.model, classes=classes, image_size=base.image_size, batch_size=size,
                         seed=base.seed)
        verdicts[size] = verdict = auto_verdict(spec, ctx, base.amp_lists, log=log)
        log(f"auto at batch {size}: {verdict.precision}: {verdict.reason}")
    return verdicts


def record_invocation(out, invocation, records, config, plots=True):
    """Merge the rounds, write ``bench.json``/``bench.csv`` (and the plots) to ``out``.

    Parameters
    ----------
    config : dict
        The request as given (flags); the planned values, threads, loads and
        ``command`` are added here.

    Returns
    -------
    (dict, list of str)
        The document and the paths written.
    """
    from . import report

    config = dict(config, batch_sizes=",".join(map(str, invocation.batch_sizes)), iters=invocation.iters,
                  auto=invocation.auto, threads=invocation.threads, load_average_start=list(invocation.load_start),
                  load_average_end=list(os.getloadavg()))
    document = report.bench_document(invocation.machine, records, config=config, tensor_cores=invocation.tensor_cores)
    paths = list(report.write_outputs(out, document))
    if plots:
        # Imported only here: --no-plots runs where matplotlib is not installed (MXNet's wheel and a checkout).
        from .plots import write_plots

        paths += write_plots(out, document["results"])
    return document, paths
