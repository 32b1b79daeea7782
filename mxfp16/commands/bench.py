"""``mxfp16 bench``: float32 against mixed precision, side by side, each run in its own process.

Times the trainer's own step (forward, backward, update) after warm-up and
reports images/s, ms per step (median and spread over repeats), peak memory,
and the speedup and memory ratio against the float32 run of the same
invocation. --rounds N runs the whole set N times in turn and pairs the runs
of each round (for machines whose speed drifts). --mode inference times the
network as `mxfp16 export` converts it and `mxfp16 predict` runs it, each
call on its own: batch-1 latency (median, p90, p99) and batch-32 throughput
by default; --onnxruntime adds the network as `mxfp16 export --format onnx`
writes it, run by onnxruntime (float32, and float16 where its execution
provider runs it). Writes bench.json, bench.csv and PNG plots to --out: a
new folder (--overwrite replaces an earlier benchmark's whole, nothing of it
left behind), locked for the whole benchmark, so a second one into the same
--out is refused at once.
"""
import os

from ..bench.families import FAMILIES
from ..bench.invocation import BATCH_SIZES, ITERS
from ..bench.peer import PEERS
from ..plumbing.limits import MAX_COUNT, MAX_IMAGE_SIDE, MAX_SECONDS, MAX_STEPS, integer, number
from . import CommandError, add_ctx_argument, add_overwrite_argument, add_threads_argument, open_output

ORDER = 40


def register(subparsers):
    parser = subparsers.add_parser("bench", help="time float32 against mixed precision (throughput, memory, speedup)",
                                   description=__doc__)
    _add_what_to_run(parser.add_argument_group("what to run"))
    _add_timing(parser.add_argument_group("timing"))
    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, help="folder for bench.json, bench.csv and the PNG plots (required)")
    output.add_argument("--no-plots", action="store_true", help="skip the PNG plots (default: plots are drawn)")
    add_overwrite_argument(output)
    parser.set_defaults(func=run)


def _add_what_to_run(what):
    """The network, data, precisions and devices a benchmark runs."""
    from ..data.layout import PIPELINES

    what.add_argument("--model", default="resnet50_v2",
                      help="gluoncv model-zoo name, or a family with its own sizes and step: "
                           f"{', '.join(FAMILIES)} (see --model-option) (default: resnet50_v2)")
    what.add_argument("--model-option", action="append", default=None, metavar="KEY=VALUE",
                      help="a family's size, repeatable, e.g. --model-option layers=12 for bert-encoder "
                           "(a language model's unfused_bf16=1: its amp-bfloat16 rows compute the LSTM or GRU "
                           "unfused, in bfloat16; dcgan's bf16_deconv=1: its amp-bfloat16 rows give the generator's "
                           "transposed convolutions bfloat16 weights, so they run in bfloat16); "
                           + "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in fam.options.items())}"
                                       for name, fam in FAMILIES.items()) + " (default: those sizes)")
    what.add_argument("--image-size", type=integer(1, MAX_IMAGE_SIDE), default=None,
                      help="square input size in pixels of an image model (default: 224; a family has its own)")
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
                      help="input pipeline for --data, as `mxfp16 train --pipeline`: folder (image files + "
                           "DataLoader) or recordio (ImageRecordIter) (default: folder)")
    what.add_argument("--workers", type=integer(0, 256), default=0,
                      help="data-loading processes (folder) or decoding threads (recordio), as `mxfp16 train "
                           "--workers` (default: 0, decode in the training process)")
    what.add_argument("--classes", type=integer(1, MAX_COUNT), default=None,
                      help="image model output classes with synthetic data (default: 102, Caltech-101)")
    what.add_argument("--peer", choices=PEERS, default=None,
                      help="also time the same network shape in PyTorch, each row in its own process with the "
                           "same threads, batch, warm-up and repeats: for a ResNet-50 model ResNet-50 v1.5, for "
                           "mobilenetv2_1.0, lstm-classifier, transformer-encoder and the families the same layers "
                           "in torch.nn; float32 and autocast bfloat16, NCHW and channels_last for convolutions, "
                           "eager and (pytorch, not pytorch-eager) torch.compile; CPU, train mode and synthetic data "
                           "only; needs the peer extra (default: no peer)")
    what.add_argument("--onnxruntime", action="store_true",
                      help="with --mode inference: also time the network as `mxfp16 export --format onnx` writes it, "
                           "in onnxruntime with the same threads, batches and timing: float32, and float16 on a GPU "
                           "execution provider (on a CPU its row says why not); needs the onnx extra (default: off)")
    add_ctx_argument(what)


def _add_timing(timing):
    """How each run is timed: steps, warm-up, repeats, rounds, threads and a time limit."""
    timing.add_argument("--iters", type=integer(1, MAX_STEPS), default=None,
                        help=f"steps per timed repeat (default: {ITERS['train']} for train, {ITERS['inference']} "
                             "for inference, where every call is a latency sample)")
    timing.add_argument("--warmup", type=integer(0, MAX_STEPS), default=3, help="untimed steps first (default: 3)")
    timing.add_argument("--repeats", type=integer(1, 1000), default=3,
                        help="timed repeats; median and spread over these (default: 3)")
    timing.add_argument("--rounds", type=integer(1, 1000), default=1,
                        help="run every measurement this many times, in turn (float32, mixed, ..., float32, mixed, "
                             "...), and report the median over rounds; a speedup is then the median of each round's "
                             "own ratio, recorded with those ratios and their range (round_min, round_max). Use 3 or "
                             "more where the machine's speed drifts (shared or virtual machines) (default: 1)")
    timing.add_argument("--no-census", action="store_true",
                        help="skip the kernel census: by default, after each row's timing on a oneDNN CPU, its step "
                             "runs again for a few steps in a process of its own under DNNL_VERBOSE=1, and the row "
                             "records which share of oneDNN's time ran on AMX, avx512_bf16, other bfloat16 kernels, "
                             "float32, reference kernels and reorders, per pass (default: the census is taken)")
    add_threads_argument(timing)
    timing.add_argument("--timeout", type=number(1e-3, MAX_SECONDS), default=None,
                        help="seconds one run may take before it is stopped and reported failed (default: none)")


def run(args):
    from ..bench.invocation import BenchSetupError, plan_invocation, record_invocation
    from ..bench.suite import run_suite
    from ..plumbing.output import Contents

    contents = Contents("a benchmark", ("bench.json", "bench.csv", "*.png", "round_ratios.json"))
    with open_output(args.out, f"benchmarking {args.model}", args.overwrite,
                     [("the data set --data", None if args.data == "synthetic" else args.data)],
                     contents=contents) as output:
        config = {k: getattr(args, k) for k in ("model", "model_option", "image_size", "batch_sizes", "precisions",
                                                "amp_lists", "mode", "data", "pipeline", "workers", "classes", "ctx",
                                                "iters", "warmup", "repeats", "rounds", "peer", "onnxruntime")}
        try:
            plan = plan_invocation(**{k: v for k, v in config.items() if k not in ("model_option", "rounds")},
                                   model_options=args.model_option)
        except BenchSetupError as err:
            raise CommandError(str(err)) from None
        _print_plan(args, plan)
        records = run_suite(plan.specs, timeout=args.timeout, on_result=lambda record: _print_row(record, args.rounds),
                            rounds=args.rounds, census=not args.no_census)
        config["census"] = not args.no_census
        config["command"] = getattr(args, "command_line", None)  # as typed: how to reproduce the result
        staged = output.stage()
        document, paths = record_invocation(staged, plan, records, config, plots=not args.no_plots)
        output.publish(staged)
        _print_results(args, plan, document)
        print("wrote " + ", ".join(str(output.path / os.path.basename(path)) for path in paths))
        if not any(r.get("status") == "ok" for r in document["results"]):
            raise CommandError("no run succeeded; see the reasons above")


def _print_plan(args, plan):
    """The machine, the threads and the runs, before any of them starts."""
    from ..machine.hardware import describe_cpu

    machine, threads, load = plan.machine, plan.threads, plan.load_start
    print(f"{describe_cpu(machine['cpu'])}, {machine['cpu_cores']} cores, {len(machine['gpus'])} GPU(s), "
          f"MXNet {machine['mxnet_version']}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"threads: {threads['planned']} for MXNet in every run (from {threads['source']}; "
          f"{threads['available_cores']} cores available)")
    rounds = f" x {args.rounds} rounds in turn" if args.rounds > 1 else ""
    print(f"{len(plan.specs)} runs{rounds}, each in its own process: {args.model} {plan.input_size} {args.mode}, "
          f"{args.warmup} warm-up + {args.repeats} x {plan.iters} timed steps")


def _print_row(record, rounds):
    """One run's line as soon as it ends: its speed, or why it did not run."""
    from ..bench import report

    what = (f"  round {record['round']}: " if rounds > 1 else "  ") + \
        f"{report.label(record)} batch {record['batch_size']}: "
    if record.get("status") == "ok":
        latency = (f"; latency median {record['latency_ms_median']:.1f}, p90 {record['latency_ms_p90']:.1f}, "
                   f"p99 {record['latency_ms_p99']:.1f} ms" if record.get("latency_ms_median") else "")
        field = report.throughput_field(record)
        print(what + f"{record[field]:.2f} {report.UNITS[field]}, {record['ms_per_step']:.1f} "
                     f"+/- {record['ms_per_step_spread']:.1f} ms/step{latency}", flush=True)
    else:
        reason = (record.get("reason") or "").strip().splitlines()
        print(what + f"{record['status']}: {reason[-1] if reason else ''}", flush=True)


def _print_results(args, plan, document):
    """The table of every measurement (its rounds merged), the tensor-core report, speedups and the peer's."""
    from ..bench import report
    from ..bench.census_run import CENSUS_STEPS
    from ..bench.tensor_cores import format_report

    print(f"\n{report.format_table(document['results'])}\n\n{format_report(plan.tensor_cores, args.model)}\n")
    census = report.format_census(document["results"])
    if census:
        print(f"kernel census: the share of oneDNN's time per kind of kernel over {CENSUS_STEPS} steps, each row's "
              "step run again after its timing, in a process of its own under DNNL_VERBOSE=1 (--no-census skips "
              f"it):\n{census}\n")
    if args.rounds > 1 and document["speedup"]:
        print(f"speedups against float32, the median of {args.rounds} rounds' own ratios (and their range):\n"
              f"{report.format_speedups(document['speedup'])}\n")
    if document.get("peer"):
        print(f"against PyTorch ({plan.peer_network}; mxfp16 runs {args.model}), same threads, batch and timing:\n"
              f"{report.format_peer_comparison(document['peer'])}\n")
