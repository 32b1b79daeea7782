"""``mxfp16 info``: what this machine and this MXNet build can do.

It also measures what MXNet's float32 -> bfloat16 cast does with bfloat16's
subnormals on this CPU (flushed or kept: it depends on the CPU's instructions).

For a CUDA build of MXNet it also lists each CUDA library (found where, or
the command that installs it), the GPU architectures the build has kernels
for, and a warning for any GPU they do not cover natively.
"""
import json
import sys

from ..machine.gpu import coverage, libraries, wheel_kernels
from ..plumbing.limits import MAX_BATCH, MAX_COUNT, MAX_IMAGE_SIDE, integer
from . import CommandError

ORDER = 0


def register(subparsers):
    parser = subparsers.add_parser("info", help="report MXNet, GPUs, CUDA libraries, CPU bfloat16 and which "
                                               "precisions run here",
                                   description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: text)")
    parser.add_argument("--amp-table", nargs="?", const="bfloat16",
                        choices=("bfloat16", "float16", "models", "layers"), metavar="VIEW",
                        help="print, as Markdown, the dtype every Gluon layer runs in under mxfp16's AMP "
                             "lists for a target (bfloat16, the default, with each operator's rule and the "
                             "probe's verdict, or float16), read from the graphs AMP builds; or 'models': per "
                             "GluonCV classification model, the share of its operators and of its "
                             "convolution and dense work that runs in 16-bit under each target (builds every "
                             "model, about a minute); or 'layers': for --model, each convolution and dense "
                             "layer timed in float32 and bfloat16 on this CPU and what --amp-lists measured "
                             "runs it in (timed once, cached) (docs/amp-table.md)")
    layers = parser.add_argument_group("--amp-table layers")
    layers.add_argument("--model", default="resnet50_v2",
                        help="the network: a gluoncv model-zoo name or a sequence model, as `mxfp16 train "
                             "--model` takes it (default: resnet50_v2)")
    layers.add_argument("--image-size", type=integer(1, MAX_IMAGE_SIDE), default=224,
                        help="square input size in pixels (default: 224)")
    layers.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=16,
                        help="samples per step, the batch the layers are timed at (default: 16)")
    layers.add_argument("--classes", type=integer(2, MAX_COUNT), default=102,
                        help="outputs of the classifier (default: 102)")
    parser.set_defaults(func=run)


def collect():
    """Everything ``mxfp16 info`` reports, as one JSON-ready dict."""
    from ..float_formats import FORMATS, measure_bfloat16_cast
    from ..machine import hardware
    from ..machine.environment import check_threads, float16_environment
    from ..machine.stack import stack_report
    from ..precision import resolve_precision, runnable_here

    machine = hardware.machine_summary()
    ctx = "gpu" if machine["gpus"] else "cpu"
    auto = resolve_precision("auto", ctx)
    # In this process, which has MXNet loaded already; last, so a failure (reported in the dict) touches nothing.
    cast = measure_bfloat16_cast(in_process=True)
    return {
        "machine": machine,
        "stack": stack_report(),
        "precisions": {name: {"runs": ok, "reason": why} for name, (ok, why) in runnable_here().items()},
        "auto": {"ctx": ctx, "resolves_to": auto.name, "reason": auto.reason},
        "formats": {name: fmt.as_dict() for name, fmt in FORMATS.items()},
        "bfloat16_cast": cast.as_dict(),
        "cuda": _cuda_section(machine["gpus"]),
        "threads": check_threads(warn=False),
        "environment": float16_environment(),
    }


def _cuda_section(gpus):
    """The CUDA libraries, the build's GPU kernels and each GPU's coverage (``None`` parts for a CPU build)."""
    section = libraries.report()
    cuda = section["build"] == "cuda"
    known = cuda and coverage.table_applies()
    section["kernels"] = ({"sass": [f"sm_{a}" for a in wheel_kernels.SASS],
                           "ptx": [f"compute_{a}" for a in wheel_kernels.PTX],
                           "source": wheel_kernels.SOURCE} if known else None)
    section["gpu_support"] = coverage.gpu_support(gpus) if cuda else []
    return section


def _cuda_text(cuda):
    if cuda["build"] != "cuda":
        return ["CUDA libraries: CPU build: no CUDA libraries needed" if cuda["build"] == "cpu"
                else "CUDA libraries: MXNet is not installed"]
    rows = cuda["libraries"]
    width = max([len(r["soname"]) for r in rows] + [len(libraries.DRIVER)])
    lines = ["CUDA libraries (linked by libmxnet.so; mxfp16 loads them from the nvidia-*-cu11 wheels):"]
    for r in rows:
        if r["error"]:
            where = f"BROKEN   {r['path']}: {r['error']}  (reinstall: {r['fix']} --force-reinstall)"
        elif r["path"]:
            where = f"found    {r['path']}"
        elif r["loaded_from"]:
            where = f"system   {r['loaded_from']}"
        else:
            where = f"MISSING  fix: {r['fix']}"
        lines.append(f"  {r['soname']:<{width}}  {r['what']:<12}  {where}")
    driver = cuda["driver"]
    lines.append(f"  {driver['soname']:<{width}}  {'driver':<12}  " +
                 (f"loaded   {driver['loaded_from']}" if driver["loaded_from"] else f"MISSING  fix: {driver['fix']}"))
    kernels = cuda["kernels"]
    if kernels:
        lines.append(f"GPU kernels of {kernels['source']['distribution']} {kernels['source']['version']}: "
                     f"SASS {', '.join(kernels['sass']) or 'none'}; PTX {', '.join(kernels['ptx']) or 'none'} "
                     "(docs/gpu.md has the table per GPU generation)")
    said = {coverage.NATIVE: ("", "native, "),
            coverage.PTX_JIT: ("WARNING ", "no native kernels; runs only through the driver's PTX JIT: "),
            coverage.UNSUPPORTED: ("WARNING ", "this MXNet build cannot run on it, not even through PTX JIT: ")}
    for gpu in cuda["gpu_support"]:
        if gpu["status"] in said:
            warning, what = said[gpu["status"]]
            lines.append(f"  {warning}gpu:{gpu['index']} ({gpu['capability']}): {what}{gpu['detail']}")
        else:
            lines.append(f"  gpu:{gpu['index']}: coverage unknown: {gpu['detail']}")
    return lines


def _text(report):
    from ..machine.amx import SWITCH
    from ..machine.hardware import BFLOAT16_KINDS, CPU_CLASSES, describe_cpu

    m = report["machine"]
    lines = [
        f"MXNet {m['mxnet_version']} (Python {m['python']})",
        f"  build features: {', '.join(m['mxnet_features'])}",
        *_stack_text(report["stack"]),
        f"CPU: {describe_cpu(m['cpu'])}, {m['cpu_cores']} cores",
        f"  class: {m['cpu_class']} ({CPU_CLASSES[m['cpu_class']]})",
        _threads_text(report["threads"]),
        f"  bfloat16 in MXNet: {BFLOAT16_KINDS[m['bfloat16']['kind']]}: {m['bfloat16']['reason']}",
        _cast_text(report["bfloat16_cast"]),
        f"  AMX: {m['amx']['state']}{_errno(m['amx']['errno'])}: {m['amx']['detail']} "
        f"(DNNL_MAX_CPU_ISA={m['amx']['isa'] or 'unset'}; {SWITCH}=0 turns AMX off)",
        f"GPUs: {len(m['gpus'])}",
    ]
    for gpu in m["gpus"]:
        tc = {True: "yes", False: "no", None: "unknown"}[gpu["tensor_cores"]]
        mem = f"{gpu['memory_mb']:.0f} MB" if gpu["memory_mb"] else "memory unknown"
        lines.append(f"  gpu:{gpu['index']} {gpu['name'] or ''} {mem}, compute capability "
                     f"{gpu['compute_capability'] or 'unknown'}, tensor cores {tc}")
    lines += _cuda_text(report["cuda"])
    lines.append("Environment for mixed precision (MixedPrecision sets it, and so every command, unless you did):")
    for name, row in report["environment"].items():
        source = "set by you" if row["source"] == "yours" else "mxfp16's default"
        lines.append(f"  {name}={row['value']} ({source}): {row['why']}")
    lines += ["Precisions here:", *(f"  {name:<13} {'yes' if row['runs'] else 'no ':<4} {row['reason']}"
                                    for name, row in report["precisions"].items())]
    lines.append(f"  auto -> {report['auto']['resolves_to']} (on {report['auto']['ctx']}): {report['auto']['reason']}")
    lines += ["Formats:",
              f"  {'':<9}{'max':>13}{'min normal':>13}{'min subnormal':>15}{'epsilon':>12}{'mantissa bits':>15}"]
    for name, f in report["formats"].items():
        lines.append(f"  {name:<9}{f['max']:>13.6g}{f['smallest_normal']:>13.6g}{f['smallest_subnormal']:>15.6g}"
                     f"{f['epsilon']:>12.6g}{f['mantissa_bits']:>15d}")
    return "\n".join(lines)


def _cast_text(cast):
    """The measured float32 -> bfloat16 cast in one line: what it does with subnormals, and what decides it."""
    head = "  float32 -> bfloat16 cast (amp_cast, what AMP inserts), measured:"
    if cast["subnormals"] == "unmeasured":
        return f"{head} could not be measured: {cast['error']}"
    what = {"flushed": "flushes bfloat16's subnormals to zero", "kept": "keeps bfloat16's subnormals",
            "mixed": "flushes some of bfloat16's subnormals and keeps others"}[cast["subnormals"]]
    if cast["expected"] not in (None, cast["subnormals"]):
        return f"{head} {what}, which this CPU's flags do not explain ({cast['decided_by']})"
    return f"{head} {what}: {cast['decided_by']}"


def _errno(number):
    import errno

    return f" ({errno.errorcode.get(number, number)})" if number else ""


def _stack_text(stack):
    tested = (f"tested with this Python: numpy {stack['numpy_tested']}" if stack["python_tested"]
              else "this Python is not among the tested 3.8 to 3.13")
    supplied = stack["numpy_names_supplied"]
    names = (f"{len(supplied)}: {', '.join(supplied)} (--json says what each one is)" if supplied
             else "none needed")
    return [f"  Python {stack['python']}, numpy {stack['numpy']} ({tested})",
            f"  numpy names mxfp16 supplied for MXNet: {names}",
            f"  distutils: {stack['distutils']}",
            f"  MXNet's operator functions: {_operator_cache_text(stack['operator_cache'])}"]


def _operator_cache_text(cache):
    if not cache["file"]:
        return "compiled by MXNet (MXNet was loaded before mxfp16)"
    if not cache["compiled"]:
        return f"{cache['read']} read from {cache['file']}"
    kept = "kept in" if cache["written"] else "could not be kept in"
    return f"{cache['compiled']} compiled at this import, {kept} {cache['file']}"


def _threads_text(threads):
    where = {"default": f"every core this process may run on ({threads['available_cores']})"}.get(
        threads["source"], threads["source"])
    line = f"  MXNet threads: {threads['threads']} (planned {threads['planned']}, from {where})"
    if threads["threads"] is not None and threads["threads"] < threads["planned"]:
        line += ("; fewer than planned: MXNet was loaded before mxfp16 could set them (export OMP_NUM_THREADS, "
                 "or import mxfp16 before mxnet)")
    return line + "; change with --threads N or OMP_NUM_THREADS"


def report_broken_install(error, as_json=False):
    """What ``mxfp16 info`` can still say when MXNet does not load: the CUDA libraries and the error; returns 2."""
    section = libraries.report()
    if as_json:
        print(json.dumps({"error": str(error), "cuda": section}, indent=2))
    else:
        print("\n".join(_cuda_text(dict(section, kernels=None, gpu_support=[]))))
        print(f"mxfp16 info: error: MXNet cannot be loaded: {error}", file=sys.stderr)
    return 2


def layer_table(args):
    """The ``--amp-table layers`` view: ``args.model``'s layers timed here (``per_layer.choose_layers``)."""
    import mxnet as mx

    from ..measure.per_layer import choose_layers
    from ..models import ModelError, build_model

    ctx = [mx.cpu()]
    try:
        net = build_model(args.model, args.classes, ctx=ctx, in_shape=(3, args.image_size, args.image_size))
    except ModelError as err:
        raise CommandError(str(err)) from None
    batch = mx.nd.zeros((args.batch_size, 3, args.image_size, args.image_size))
    choice = choose_layers(net, [batch], ctx, log=lambda line: print(line, file=sys.stderr))
    return (f"Per-layer precision of {args.model} at {args.image_size} px, batch {args.batch_size} "
            f"(`mxfp16 info --amp-table layers`; what `--amp-lists measured` runs).\n\n" + choice.render())


def run(args):
    view = getattr(args, "amp_table", None)
    if view == "layers":
        sys.stdout.write(layer_table(args))
    elif view == "models":
        from ..amp.zoo import generate, render
        sys.stdout.write(render(generate()))
    elif view:
        from ..amp.table import generate
        sys.stdout.write(generate(view))
    else:
        report = collect()
        print(json.dumps(report, indent=2) if args.json else _text(report))
    return 0
