"""``mxfp16 info``: what this machine and this MXNet build can do."""
import json

from .. import hardware
from ..formats import FORMATS
from ..precision import resolve_precision, runnable_here

ORDER = 0


def register(subparsers):
    parser = subparsers.add_parser("info", help="report MXNet, GPUs, CPU bfloat16 and which precisions run here",
                                   description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: text)")
    parser.set_defaults(func=run)


def collect():
    """Everything ``mxfp16 info`` reports, as one JSON-ready dict."""
    machine = hardware.machine_summary()
    ctx = "gpu" if machine["gpus"] else "cpu"
    auto = resolve_precision("auto", ctx)
    return {
        "machine": machine,
        "precisions": {name: {"runs": ok, "reason": why} for name, (ok, why) in runnable_here().items()},
        "auto": {"ctx": ctx, "resolves_to": auto.name},
        "formats": {name: fmt.as_dict() for name, fmt in FORMATS.items()},
    }


def _text(report):
    m = report["machine"]
    lines = [
        f"MXNet {m['mxnet_version']} (Python {m['python']})",
        f"  build features: {', '.join(m['mxnet_features'])}",
        f"CPU: {m['cpu_model']}, {m['cpu_cores']} cores",
        "  bfloat16: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m["cpu_bfloat16"].items()),
        f"GPUs: {len(m['gpus'])}",
    ]
    for gpu in m["gpus"]:
        tc = {True: "yes", False: "no", None: "unknown"}[gpu["tensor_cores"]]
        mem = f"{gpu['memory_mb']:.0f} MB" if gpu["memory_mb"] else "memory unknown"
        lines.append(f"  gpu:{gpu['index']} {gpu['name'] or ''} {mem}, compute capability "
                     f"{gpu['compute_capability'] or 'unknown'}, tensor cores {tc}")
    lines.append("Precisions here:")
    for name, row in report["precisions"].items():
        lines.append(f"  {name:<13} {'yes' if row['runs'] else 'no ':<4} {row['reason']}")
    lines.append(f"  auto -> {report['auto']['resolves_to']} (on {report['auto']['ctx']})")
    lines.append("Formats:")
    lines.append(f"  {'':<9}{'max':>13}{'min normal':>13}{'min subnormal':>15}{'epsilon':>12}{'mantissa bits':>15}")
    for name, f in report["formats"].items():
        lines.append(f"  {name:<9}{f['max']:>13.6g}{f['smallest_normal']:>13.6g}{f['smallest_subnormal']:>15.6g}"
                     f"{f['epsilon']:>12.6g}{f['mantissa_bits']:>15d}")
    return "\n".join(lines)


def run(args):
    report = collect()
    print(json.dumps(report, indent=2) if args.json else _text(report))
