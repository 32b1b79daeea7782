"""``mxfp16 bench``: float32 against mixed precision, side by side, each run in its own process.

Times the trainer's own step (forward, backward, update) after warm-up and
reports images/s, ms per step (median and spread over repeats), peak memory,
and the speedup and memory ratio against the float32 run of the same
invocation. --rounds N runs the whole set N times in turn and pairs the runs
of each round (for machines whose speed drifts). --mode inference times the
network as `mxfp16 export` converts it and `mxfp16 predict` runs it, each
call on its own: batch-1 latency (median, p90, p99) and batch-32 throughput
by default. Writes bench.json, bench.csv and PNG plots to --out.
"""
import os

from . import CommandError, add_ctx_argument, add_threads_argument, check_out
from ..fileio import JSONFileError, read_json
from ..limits import integer, number, MAX_BATCH, MAX_COUNT, MAX_IMAGE_SIDE, MAX_SECONDS, MAX_STEPS

ORDER = 40
#: Per-mode defaults: inference asks about one request (batch 1) and about a full batch.
BATCH_SIZES = {"train": "16,32", "inference": "1,32"}
ITERS = {"train": 10, "inference": 30}


def _int_list(text, flag, high=MAX_BATCH):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise CommandError(f"{flag} {text!r} is not a comma-separated list of positive integers; e.g. {flag} 16,32")
    if max(values) > high:
        raise CommandError(f"{flag} {max(values)}: at most {high}; e.g. {flag} 16,32")
    return values


def register(subparsers):
    from ..data.pipelines import PIPELINES

    parser = subparsers.add_parser("bench", help="time float32 against mixed precision (throughput, memory, speedup)",
                                   description=__doc__)
    what = parser.add_argument_group("what to run")
    what.add_argument("--model", default="resnet50_v2",
                      help="gluoncv model-zoo name (default: resnet50_v2)")
    what.add_argument("--image-size", type=integer(1, MAX_IMAGE_SIDE), default=224, help="square input size in pixels (default: 224)")
    what.add_argument("--batch-sizes", default=None,
                      help=f"comma-separated batch sizes (default: {BATCH_SIZES['train']} for train, "
                           f"{BATCH_SIZES['inference']} for inference)")
    what.add_argument("--precisions", default="float32,auto",
                      help="comma-separated precisions; float32 is the baseline (default: float32,auto)")
    what.add_argument("--amp-lists", default="mxfp16",
                      help="AMP operator lists for AMP precisions, comma-separated: mxfp16 (tuned) and/or mxnet "
                           "(MXNet's defaults); each runs separately (default: mxfp16)")
    what.add_argument("--mode", choices=("train", "inference"), default="train",
                      help="train: forward, backward and update; inference: the exported network's forward pass, "
                           "float32 images in, every call timed for its latency (default: train)")
    what.add_argument("--data", default="synthetic",
                      help="'synthetic' (random tensors), a data folder with train/ and test/, or with --pipeline "
                           "recordio the prefix given to `mxfp16 data pack`; real batches are loaded inside the "
                           "timed steps, as in training (default: synthetic)")
    what.add_argument("--pipeline", choices=PIPELINES, default="folder",
                      help="input pipeline for --data, as `mxfp16 train --pipeline`: folder (ImageFolderDataset + "
                           "DataLoader) or recordio (ImageRecordIter) (default: folder)")
    what.add_argument("--workers", type=integer(0, 256), default=0,
                      help="data-loading processes (folder) or decoding threads (recordio), as `mxfp16 train "
                           "--workers` (default: 0, decode in the training process)")
    what.add_argument("--classes", type=integer(1, MAX_COUNT), default=102,
                      help="model output classes with synthetic data (default: 102, Caltech-101)")
    what.add_argument("--peer", choices=("pytorch",), default=None,
                      help="also time the same network shape in PyTorch, each row in its own process with the "
                           "same threads, batch, warm-up and repeats: for a ResNet-50 model ResNet-50 v1.5 (float32 "
                           "and autocast bfloat16, NCHW and channels_last), for lstm-classifier and "
                           "transformer-encoder the same layers in torch.nn (float32 and autocast bfloat16); CPU, "
                           "train mode and synthetic data only; needs the peer extra (default: no peer)")
    add_ctx_argument(what)
    timing = parser.add_argument_group("timing")
    timing.add_argument("--iters", type=integer(1, MAX_STEPS), default=None,
                        help=f"steps per timed repeat (default: {ITERS['train']} for train, {ITERS['inference']} "
                             "for inference, where every call is a latency sample)")
    timing.add_argument("--warmup", type=integer(0, MAX_STEPS), default=3, help="untimed steps first (default: 3)")
    timing.add_argument("--repeats", type=integer(1, 1000), default=3, help="timed repeats; median and spread over these (default: 3)")
    timing.add_argument("--rounds", type=integer(1, 1000), default=1,
                        help="run every measurement this many times, in turn (float32, mixed, ..., float32, mixed, "
                             "...), and report the median over rounds; a speedup is then the median of each round's "
                             "own ratio. Use 3 or more where the machine's speed drifts (shared or virtual "
                             "machines) (default: 1)")
    add_threads_argument(timing)
    timing.add_argument("--timeout", type=number(1e-3, MAX_SECONDS), default=None,
                        help="seconds one run may take before it is stopped and reported failed (default: none)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, help="folder for bench.json, bench.csv and the PNG plots (required)")
    output.add_argument("--no-plots", action="store_true", help="skip the PNG plots (default: plots are drawn)")
    parser.set_defaults(func=run)


def _validate(args):
    from ..amp_lists import LIST_SETS
    from ..precision import PRECISIONS, PrecisionError, check_precision_name

    precisions, unknown = [], []
    for name in (p for p in args.precisions.split(",") if p.strip()):
        try:
            precisions.append(check_precision_name(name))
        except PrecisionError:
            unknown.append(name.strip())
    if not precisions or unknown:
        raise CommandError(f"unknown precision(s) {', '.join(unknown) or '(none given)'}; choose from "
                           f"{', '.join(PRECISIONS)}, e.g. --precisions float32,auto")
    lists = [name.strip() for name in args.amp_lists.split(",") if name.strip()]
    if not lists or any(name not in LIST_SETS for name in lists):
        raise CommandError(f"--amp-lists {args.amp_lists!r}: choose from {', '.join(LIST_SETS)}, e.g. --amp-lists mxfp16,mxnet")
    if args.data != "synthetic" and args.pipeline == "folder" and not os.path.isdir(args.data):
        hint = (f"; it looks like a RecordIO pack: add --pipeline recordio"
                if os.path.isfile(f"{args.data}_train.rec") else "")
        raise CommandError(f"--data {args.data!r} is neither 'synthetic' nor a folder{hint}; make one with "
                           "`mxfp16 data synth --out DIR` or use --data synthetic")
    return precisions, _int_list(args.batch_sizes or BATCH_SIZES[args.mode], "--batch-sizes"), lists


def _data_classes(data, pipeline):
    """The class count of a data set named by ``--data``/``--pipeline``, checked before any run starts."""
    if pipeline == "recordio":
        from ..data.layout import pack_problem
        from ..data.pipelines import classes_file

        problem = pack_problem(data, flag="--data")  # a split or the raw download: name the pack command
        if problem:
            raise CommandError(problem)
        meta = classes_file(data)
        try:
            return len(read_json(meta, fields={"classes": list})["classes"])
        except JSONFileError:
            raise CommandError(f"--data {data!r} with --pipeline recordio: {meta} is missing or unreadable, so "
                               f"{data!r} is not a complete pack; make one with `mxfp16 data pack --src DIR "
                               f"--out {data}`") from None
    train = os.path.join(data, "train")
    if not os.path.isdir(train):
        from ..data.layout import split_problem

        problem = split_problem(data, then="pass --data {split}")
        if problem:
            raise CommandError(problem)
        raise CommandError(f"--data {data!r} has no train/ folder; make one with `mxfp16 data split` or "
                           "`mxfp16 data synth --out DIR`, or use --data synthetic")
    return len([d for d in os.listdir(train) if os.path.isdir(os.path.join(train, d))])


def run(args):
    from ..machine import hardware
    from ..machine.environment import thread_report
    from ..bench import report
    from ..bench.plots import write_plots
    from ..bench.runner import BenchSpec
    from ..bench.suite import plan, run_suite
    from ..bench.tensor_cores import format_report, model_tensor_core_report
    from ..models import ModelError

    precisions, batch_sizes, lists = _validate(args)
    check_out(args.out, [("the data set --data", None if args.data == "synthetic" else args.data)])
    if args.peer and (args.mode != "train" or args.data != "synthetic" or args.ctx.strip().lower() not in ("auto", "cpu")):
        raise CommandError("--peer pytorch times a CPU training step on synthetic data: use it with --mode train, "
                           "--data synthetic and --ctx cpu (or auto on a machine without GPUs)")
    if args.peer:
        from ..bench.peer import peer_models, peer_network  # imports neither torch nor MXNet

        if peer_network(args.model) is None:
            raise CommandError(f"--peer pytorch has a PyTorch network only for {peer_models()}: use --model with "
                               f"one of these, not {args.model!r}")
    try:
        iters = ITERS[args.mode] if args.iters is None else args.iters
        base = BenchSpec(model=args.model, image_size=args.image_size, mode=args.mode, iters=iters,
                         warmup=args.warmup, repeats=args.repeats, data=args.data, pipeline=args.pipeline,
                         workers=args.workers, ctx=args.ctx, classes=args.classes)
    except ValueError as err:
        raise CommandError(f"{err}; see mxfp16 bench --help") from None
    classes = args.classes if args.data == "synthetic" else _data_classes(args.data, args.pipeline)
    try:
        # Building the model here also checks its name before any run starts.
        tensor_cores = model_tensor_core_report(args.model, classes, args.image_size, batch_sizes)
    except ModelError as err:
        raise CommandError(str(err)) from None
    specs = plan(base, precisions, batch_sizes, lists)
    machine = hardware.machine_summary()
    threads = thread_report()
    if args.peer:
        if machine["gpus"] and args.ctx.strip().lower() == "auto":
            raise CommandError("--peer pytorch runs on the CPU; add --ctx cpu to compare on the CPU")
        from ..bench.peer import plan_peer

        specs += plan_peer(base, batch_sizes, threads["planned"])
    load = os.getloadavg()
    print(f"{machine['cpu_model']}, {machine['cpu_cores']} cores, {len(machine['gpus'])} GPU(s), "
          f"MXNet {machine['mxnet_version']}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"threads: {threads['planned']} for MXNet in every run (from {threads['source']}; "
          f"{threads['available_cores']} cores available)")
    rounds = f" x {args.rounds} rounds in turn" if args.rounds > 1 else ""
    print(f"{len(specs)} runs{rounds}, each in its own process: {args.model} {args.image_size}px {args.mode}, "
          f"{args.warmup} warm-up + {args.repeats} x {iters} timed steps")

    def progress(record):
        what = (f"  round {record['round']}: " if args.rounds > 1 else "  ") + \
            f"{report.label(record)} batch {record['batch_size']}: "
        if record.get("status") == "ok":
            latency = (f"; latency median {record['latency_ms_median']:.1f}, p90 {record['latency_ms_p90']:.1f}, "
                       f"p99 {record['latency_ms_p99']:.1f} ms" if record.get("latency_ms_median") else "")
            print(what + f"{record['images_per_second']:.2f} img/s, {record['ms_per_step']:.1f} "
                         f"+/- {record['ms_per_step_spread']:.1f} ms/step{latency}", flush=True)
        else:
            reason = (record.get("reason") or "").strip().splitlines()
            print(what + f"{record['status']}: {reason[-1] if reason else ''}", flush=True)

    records = run_suite(specs, timeout=args.timeout, on_result=progress, rounds=args.rounds)
    config = {k: getattr(args, k) for k in ("model", "image_size", "batch_sizes", "precisions", "amp_lists", "mode",
                                            "data", "pipeline", "workers", "classes", "ctx", "iters", "warmup",
                                            "repeats", "rounds", "peer")}
    config.update(batch_sizes=",".join(map(str, batch_sizes)), iters=iters, threads=threads)
    config["load_average_start"] = list(load)
    config["load_average_end"] = list(os.getloadavg())
    # The command as typed, so a recorded result says how to reproduce it.
    config["command"] = getattr(args, "command_line", None)
    document = report.bench_document(machine, records, config=config, tensor_cores=tensor_cores)
    records = document["results"]  # one row per measurement, its rounds merged
    paths = list(report.write_outputs(args.out, document))
    if not args.no_plots:
        paths += write_plots(args.out, records)
    print()
    print(report.format_table(records))
    print()
    print(format_report(tensor_cores, args.model))
    print()
    if document.get("peer"):
        print(f"against PyTorch ({peer_network(args.model)}; mxfp16 runs {args.model}), same threads, batch and "
              "timing:")
        print(report.format_peer_comparison(document["peer"]))
        print()
    print("wrote " + ", ".join(paths))
    if not any(r.get("status") == "ok" for r in records):
        raise CommandError("no run succeeded; see the reasons above")
