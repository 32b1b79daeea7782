"""Where one training step of a benchmark family spends its time: MXNet float32 and PyTorch (autocast bfloat16).

    python tools/profile_families.py --model word-lm-lstm --out docs/results/profile-word-lm-lstm-zen3
    python tools/profile_families.py --model mobilenetv2_1.0 --image-size 224 --batch-size 16 \\
        --out docs/results/profile-mobilenetv2-zen3

Three parts, each in its own process, each timing the step `mxfp16 bench` times (the same builders: the family's
step or the zoo model's ``build_parts`` + ``train_step``, and the PyTorch peer's step) with the bench's default
sizes unless given:

- ``mxnet``: MXNet's profiler (``mx.profiler``, aggregate statistics) over ``--steps`` float32 steps, every step
  waited for (``mx.nd.waitall()``: MXNet's engine is asynchronous, and a step not waited for would spill into the
  next). Bulk execution is switched off in this process (``MXNET_EXEC_BULK_EXEC_TRAIN=0``) so each operator is
  timed on its own instead of inside a bulked segment; the step time of that process is recorded beside it.
- ``dnnl``: oneDNN's own log (``DNNL_VERBOSE=1``) over the same number of float32 steps: every primitive it
  executed, its implementation (``jit:avx2``, ``gemm:jit``, ``ref:any`` ...) and its time, summed per step;
  convolutions are also split into depthwise, 1x1 and other kernels, and by pass; ``census`` is the kernel
  census ``mxfp16 bench`` takes (:mod:`mxfp16.bench.census`, the same reader): the share of oneDNN's time on
  AMX, avx512_bf16, other bfloat16 kernels, float32, reference kernels and reorders, per pass.
- ``torch``: ``torch.profiler`` over PyTorch's eager step (self CPU time per operator), autocast bfloat16 by
  default; ``--torch-dtype float32`` where PyTorch's bfloat16 cannot run or to compare like with like (on a CPU
  without AVX-512 its bfloat16 LSTM fails and its other bfloat16 kernels are emulated).

Operator times are summed over the operators the profiler saw; with two OpenMP threads an operator's time is wall
time inside it, and the shares are of the summed time. Writes ``profile.json`` into ``--out``.
"""
import argparse
import collections
import ctypes
import json
import os
import re
import sys
import tempfile
import time


def _spec(args):
    from mxfp16.bench.families import FAMILIES, resolve_options
    from mxfp16.bench.runner import BenchSpec

    fam = FAMILIES.get(args.model)
    batch = args.batch_size or (fam.batch_size if fam else 16)
    if fam:
        return BenchSpec(model=args.model, image_size=fam.image_size, batch_size=batch, ctx="cpu",
                         options=resolve_options(args.model, args.model_option))
    return BenchSpec(model=args.model, image_size=args.image_size, batch_size=batch, ctx="cpu")


def _mxnet_step(args):
    from mxfp16.bench.runner import _Batches, _train_step
    from mxfp16.devices import resolve_devices

    import mxnet as mx

    spec = _spec(args)
    step, _ = _train_step(spec, resolve_devices("cpu"), _Batches(spec))

    def waited():
        step()
        mx.nd.waitall()
    return waited


def _timed(step, count):
    start = time.perf_counter()
    for _ in range(count):
        step()
    return 1000.0 * (time.perf_counter() - start) / count


def part_mxnet(args):
    import mxnet as mx

    step = _mxnet_step(args)
    for _ in range(args.warmup):
        step()
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=os.devnull)
    mx.profiler.set_state("run")
    ms = _timed(step, args.steps)
    mx.profiler.set_state("stop")
    operators = json.loads(mx.profiler.dumps(reset=True, format="json"))["Time"]["operator"]
    per_step = {name: (stats["Total"] / args.steps, stats["Count"] / args.steps) for name, stats in operators.items()}
    total = sum(ms_ for ms_, _ in per_step.values())
    top = sorted(per_step.items(), key=lambda item: -item[1][0])[:args.top]
    return {"ms_per_step": ms, "operator_ms_per_step": total,
            "top_operators": [{"operator": name, "ms_per_step": t, "calls_per_step": calls,
                               "percent_of_operator_time": 100.0 * t / total} for name, (t, calls) in top]}


def part_dnnl(args):
    """oneDNN's log of the timed steps, summed: this process's C stdout, where oneDNN prints, read back."""
    step = _mxnet_step(args)
    for _ in range(args.warmup):
        step()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            ms = _timed(step, args.steps)
        finally:
            ctypes.CDLL(None).fflush(None)  # C's buffer: oneDNN's lines written before the file is read
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        lines = log.read().decode("utf-8", "replace").splitlines()
    return dict(ms_per_step=ms, **summarise_dnnl(lines, args.steps, 2 * args.top))


def _conv_kind(problem):
    """``depthwise``, ``1x1`` or ``KxK`` from a oneDNN convolution problem (``mb16_g96ic96oc96_..kh3..kw3..``)."""
    groups = re.search(r"_g(\d+)ic(\d+)", "_" + problem.split("_", 1)[1]) if "_g" in problem else None
    kernel = re.search(r"kh(\d+).*kw(\d+)", problem)
    if groups and int(groups.group(1)) == int(groups.group(2)) and int(groups.group(1)) > 1:
        return "depthwise"
    kh, kw = (kernel.group(1), kernel.group(2)) if kernel else ("?", "?")
    return "1x1" if (kh, kw) == ("1", "1") else f"{kh}x{kw}"


def summarise_dnnl(lines, steps, top=25):
    """Per primitive, per implementation, per convolution kind, and the kernel census (``mxfp16 bench``'s)."""
    from mxfp16.bench.census import exec_lines, isa_line, summarise

    by_primitive, by_impl, conv = collections.Counter(), collections.Counter(), collections.Counter()
    calls = collections.Counter()
    execs = exec_lines(lines)  # the library's reader: the census of mxfp16 bench reads the same lines
    for line in execs:
        primitive, impl, prop, ms = line.primitive, line.implementation, line.prop_kind, line.ms
        by_primitive[primitive] += ms / steps
        calls[primitive] += 1 / steps
        by_impl[f"{primitive} {impl} {prop}"] += ms / steps
        if primitive in ("convolution", "deconvolution"):
            conv[f"{primitive} {_conv_kind(line.problem)} {prop}"] += ms / steps
    total = sum(by_primitive.values())
    return {"primitive_ms_per_step": total, "census": summarise(execs, steps, isa=isa_line(lines)),
            "ms_per_step_by_primitive": dict(by_primitive.most_common()),
            "calls_per_step_by_primitive": {k: round(v, 1) for k, v in calls.most_common()},
            "percent_by_primitive": {k: 100.0 * v / total for k, v in by_primitive.most_common()} if total else {},
            "ms_per_step_by_implementation": dict(by_impl.most_common(top)),
            "convolution_ms_per_step_by_kind": dict(conv.most_common())}


def part_torch(args):
    from mxfp16.bench.families import family
    from mxfp16.bench.peer import PeerSpec, _classifier_step
    from mxfp16.bench.peer_families import family_step

    import torch

    spec = _spec(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if family(args.model):
        step = family_step(args.model, spec.options, spec.batch_size, args.torch_dtype == "bfloat16", False,
                           channels_last=args.channels_last, seed=0)
    else:
        step = _classifier_step(PeerSpec(model=args.model, image_size=spec.image_size, batch_size=spec.batch_size,
                                         classes=spec.classes, iters=1, warmup=0, repeats=1, dtype=args.torch_dtype,
                                         layout="channels_last" if args.channels_last else "NCHW"))
    for _ in range(args.warmup):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ms = _timed(step, args.steps)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1000.0 / args.steps
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]
    return {"ms_per_step": ms, "dtype": args.torch_dtype, "self_cpu_ms_per_step": total,
            "layout": "channels_last" if args.channels_last else None,
            "top_operators": [{"operator": e.key, "self_cpu_ms_per_step": e.self_cpu_time_total / 1000.0 / args.steps,
                               "calls_per_step": e.count / args.steps,
                               "percent_of_self_cpu": 100.0 * e.self_cpu_time_total / 1000.0 / args.steps / total}
                              for e in top]}


PARTS = {"mxnet": part_mxnet, "dnnl": part_dnnl, "torch": part_torch}


def _child(args, part):
    """One part in a fresh process (:func:`part`): its summary, or ``{'error': why}``."""
    from mxfp16.plumbing.child import call_in_child

    tools = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (tools, os.path.dirname(tools), os.environ.get("PYTHONPATH")) if p),
           **({"MXNET_EXEC_BULK_EXEC_TRAIN": "0"} if part == "mxnet" else {}),
           **({"DNNL_VERBOSE": "1"} if part == "dnnl" else {})}
    result, problem = call_in_child("profile_families:part", dict(vars(args), part=part), env=env)
    return result if problem is None else {"error": problem.strip().splitlines()[-1]}


def part(spec):
    """In a part's child: ``PARTS[spec['part']]`` of ``spec`` (the command's arguments), every core for MXNet."""
    from mxfp16.machine.environment import set_threads

    set_threads()  # as mxfp16 bench does
    return PARTS[spec["part"]](argparse.Namespace(**spec))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-option", action="append", default=None)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--channels-last", action="store_true", help="the PyTorch step in channels_last")
    parser.add_argument("--torch-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the PyTorch step's precision: autocast bfloat16 (default) or float32")
    parser.add_argument("--parts", default="mxnet,dnnl,torch")
    parser.add_argument("--out", help="folder for profile.json (required)")
    args = parser.parse_args()
    if not args.out:
        parser.error("--out is required: the folder profile.json goes into")
    from mxfp16.machine.hardware import cpu_identity

    document = {"command": "python tools/profile_families.py " + " ".join(sys.argv[1:]),
                "model": args.model, "model_option": args.model_option, "cpu": cpu_identity(),
                "threads": args.threads, "warmup": args.warmup, "steps": args.steps,
                "load_average_start": list(os.getloadavg())}
    for part in args.parts.split(","):
        document[part] = _child(args, part)
        print(part, json.dumps(document[part])[:300], flush=True)
    document["load_average_end"] = list(os.getloadavg())
    from mxfp16.plumbing.fileio import write_json

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "profile.json"), document, indent=1)  # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
