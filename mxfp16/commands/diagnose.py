"""``mxfp16 diagnose``: where a network's gradients fall in float16's range, and the loss scale to use.

Runs a few batches of real data through the network in float32 and reports,
per parameter and per layer, the share of gradients that would underflow
(flush to zero or round to 2^-24), land in the subnormal range or overflow in float16 at loss
scale 1, at --loss-scale and at the recommended loss scale. Writes
diagnose.txt, diagnose.json and gradient_histogram.png to --out. Then runs
the network once in float16 (where it can run) and names the first layer
whose output holds inf or NaN. An existing --out is refused; --overwrite
replaces it whole once the new diagnosis is written.
"""
import itertools
import json
import os

from ..plumbing.limits import MAX_BATCH, MAX_IMAGE_SIDE, MAX_STEPS, integer, number
from ..plumbing.output import error_line
from . import CommandError, add_ctx_argument, add_overwrite_argument, add_threads_argument, open_output

ORDER = 30
#: What a diagnosis writes into --out.
NAMES = ("diagnose.txt", "diagnose.json", "gradient_histogram.png")


def register(subparsers):
    import inspect

    from ..diagnostics.recommend import DEFAULT_MARGIN
    from ..scaler import LossScaler

    start = inspect.signature(LossScaler).parameters["init_scale"].default
    parser = subparsers.add_parser("diagnose", help="gradient ranges against float16: underflow, overflow and the "
                                                    "recommended loss scale", description=__doc__)
    data = parser.add_argument_group("data")
    data.add_argument("--data-dir", default=None,
                      help="folder with train/<class>/ images (default: the demo set, data/demo, made on first use)")
    data.add_argument("--image-size", type=integer(8, MAX_IMAGE_SIDE), default=32,
                      help="square input size in pixels (default: 32)")
    data.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=32,
                      help="images per batch; parameter gradients are sums over the batch, so use "
                           "the batch size you train with (default: 32)")
    data.add_argument("--batches", type=integer(1, MAX_STEPS), default=4,
                      help="training batches to measure (default: 4)")
    data.add_argument("--seed", type=integer(0, 2 ** 32 - 1), default=0,
                      help="seeds initialisation and batch order (default: 0)")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="cifar_resnet20_v1",
                       help="gluoncv model-zoo name, or elementwise-mlp (runs in float16 on a CPU, so the forward "
                            "check can run there) (default: cifar_resnet20_v1, small enough for a CPU)")
    model.add_argument("--params", default=None,
                       help="parameters to load (net.save_parameters / a trainer checkpoint's .params); gradients "
                            "of a trained network differ from those at initialisation (default: fresh initialisation)")
    add_ctx_argument(model, one=True)
    scale = parser.add_argument_group("loss scale")
    scale.add_argument("--loss-scale", type=number(2 ** -24, 65504.0 ** 2), default=start,
                       help=f"a power of two to report underflow and overflow at (default: {start:g}, the dynamic "
                            "loss scaler's starting scale)")
    scale.add_argument("--margin", type=number(1, 65504), default=DEFAULT_MARGIN,
                       help="the recommended scale keeps the largest gradient this many times under float16's max "
                            f"(default: {DEFAULT_MARGIN:g})")
    checks = parser.add_argument_group("what to measure")
    checks.add_argument("--no-activations", action="store_true",
                        help="parameter gradients only; skip the gradient at each layer's output (default: both)")
    checks.add_argument("--no-forward-check", action="store_true",
                        help="skip the float16 forward pass that names the first layer with inf/NaN output "
                             "(default: run it where float16 runs)")
    add_threads_argument(model)
    output = parser.add_argument_group("output")
    output.add_argument("--out", default="runs/diagnose",
                        help="folder for diagnose.txt, diagnose.json and gradient_histogram.png "
                             "(default: runs/diagnose)")
    output.add_argument("--json", action="store_true", help="print the JSON document instead of text (default: text)")
    output.add_argument("--rows", type=integer(0, 100_000), default=20,
                        help="table rows to print, worst underflow first; diagnose.txt has all (default: 20)")
    add_overwrite_argument(output)
    parser.set_defaults(func=run)


def _validate(args):
    from ..diagnostics import log2_of_scale

    try:
        log2_of_scale(args.loss_scale)
    except ValueError as err:
        raise CommandError(f"--loss-scale: {err}") from None
    if args.data_dir is not None and not os.path.isdir(os.path.join(args.data_dir, "train")):
        from ..data.layout import split_problem

        # The raw Caltech-101 download and other unsplit folders get the split command that fixes them.
        raise CommandError(split_problem(args.data_dir, then="pass --data-dir {split}")
                           or f"--data-dir {args.data_dir!r} has no train/ folder; point it at a folder with "
                           "train/<class>/ images (e.g. from `mxfp16 data split`) or leave it out for the demo set")
    if args.params is not None and not os.path.isfile(args.params):
        raise CommandError(f"--params {args.params!r} is not a file; give a .params file written by "
                           "net.save_parameters (e.g. from a trainer checkpoint folder) or leave it out")


def _setup(args):
    import mxnet as mx

    from ..data import DataError, demo_dataset, make_loaders
    from ..devices import DeviceError, parse_ctx, resolve_devices
    from ..models import ModelError, build_model

    try:
        ctx = parse_ctx(args.ctx)
        if args.ctx.strip().lower() == "auto":
            ctx = ctx[:1]
        if len(ctx) != 1:
            raise DeviceError(f"--ctx {args.ctx!r} names {len(ctx)} devices; diagnose runs on one, e.g. gpu:0")
        ctx = resolve_devices(ctx)[0]
        loaders = make_loaders(args.data_dir or demo_dataset(), image_size=args.image_size,
                               batch_size=args.batch_size, seed=args.seed)
        batches = list(itertools.islice(loaders.train_batches(0), args.batches))
        mx.random.seed(args.seed)
        net = build_model(args.model, len(loaders.classes), ctx=ctx, in_shape=(3, args.image_size, args.image_size))
    except (DataError, ModelError, DeviceError) as err:
        raise CommandError(str(err)) from None
    if args.params:
        from .._internals import saved_parameter_shapes
        from ..plumbing.ndarray_file import NDArrayFileError, check_shapes

        try:  # names, shapes and sizes before MXNet allocates what the file declares
            check_shapes(args.params, saved_parameter_shapes(net), f"{args.model} with {len(loaders.classes)} classes")
        except NDArrayFileError as err:
            raise CommandError(f"--params: {err}; give a file written by save_parameters for that --model") from None
        try:
            net.load_parameters(args.params, ctx=ctx, cast_dtype=True, dtype_source="current")
        except (AssertionError, mx.base.MXNetError) as err:
            raise CommandError(f"--params {args.params!r} cannot be loaded into {args.model} with "
                               f"{len(loaders.classes)} classes ({error_line(err)[:300]}); give a file written by "
                               "save_parameters for that --model") from None
    return ctx, net, batches


def run(args):
    from ..plumbing.output import Contents

    _validate(args)
    contents = Contents("a diagnosis", NAMES)
    with open_output(args.out, f"diagnosing {args.model}", args.overwrite,
                     [("the data set --data-dir", args.data_dir), ("the parameters --params", args.params)],
                     contents=contents) as output:
        return _diagnose(args, output)


def _diagnose(args, output):
    """Measure, then write diagnose.txt, diagnose.json and the histogram into ``output`` (opened, locked)."""
    from mxnet import gluon

    from .. import diagnostics as dg
    from ..casting import cast_net
    from ..plumbing.fileio import write_json
    from ..plumbing.output import atomic_write

    ctx, net, batches = _setup(args)
    if not batches:
        raise CommandError("the data set gave no training batches; check --data-dir")
    diagnosis = dg.diagnose(net, gluon.loss.SoftmaxCrossEntropyLoss(), batches, ctx=ctx, loss_scale=args.loss_scale,
                            margin=args.margin, activations=not args.no_activations)
    runs, why = (False, "--no-forward-check") if args.no_forward_check else dg.float16_forward_runs_here(net, ctx)
    if runs:
        cast_net(net, "float16")
        diagnosis.forward = dg.forward_check(net, batches[0][0].as_in_context(ctx).astype("float16"))
    else:
        diagnosis.forward_skipped = why

    config = {k: getattr(args, k) for k in ("data_dir", "image_size", "batch_size", "batches", "seed", "model",
                                            "params", "ctx", "loss_scale", "margin", "no_activations")}
    config["batches_measured"] = len(batches)
    heading = (f"mxfp16 diagnose: {args.model}, {args.image_size} px, {len(batches)} batch(es) of {args.batch_size} "
               f"from {args.data_dir or 'the demo set'}, float32 gradients on {ctx}")
    summary, table = dg.format_summary(diagnosis), dg.format_table(diagnosis)
    document = dg.diagnosis_document(diagnosis, config)
    staged = output.stage()
    with atomic_write(staged / NAMES[0]) as handle:
        handle.write(f"{heading}\n\n{summary}\n\n{table}\n")
    write_json(staged / NAMES[1], document)
    dg.plot_histogram(diagnosis, staged / NAMES[2])
    output.publish(staged)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{heading}\n\n{summary}")
    if args.rows:
        print(f"\n{dg.format_table(diagnosis, limit=args.rows)}")
    print("\nwrote " + ", ".join(os.path.join(args.out, name) for name in NAMES))
    return 0
