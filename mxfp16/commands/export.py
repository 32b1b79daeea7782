"""``mxfp16 export --run RUN --out DIR``: a trained run as a deployable model, checked against float32.

Loads the run's last (or best) checkpoint into the network the trainer
built, converts it (AMP graph conversion for amp-*, a cast with BatchNorm in
float32 for float16) and writes DIR/model-symbol.json, DIR/model-0000.params
and DIR/export.json. Plain MXNet loads the model with
gluon.SymbolBlock.imports. Before anything is written, the exported files
are run against the float32 model on the run's test set; an export whose
top-1 falls more than --margin points below float32 is refused.

--format onnx writes DIR/model.onnx instead (opset 13, from the float32
graph; with --onnx-dtype float16 also DIR/model-float16.onnx, float32 in and
out), checked in onnxruntime against the float32 network: the same top-1
margin, and every score within the file's dtype tolerance. A layer whose
operator has no ONNX converter is refused, by name, before anything is
written. mxfp16 predict runs an ONNX export with onnxruntime alone.

An existing --out is refused; --overwrite replaces it whole (no file of the
old export stays) once the new one has passed its check, and refuses a
folder holding anything an export does not write. A second export to the
same --out meanwhile is refused at once, naming this one.
"""
from ..plumbing.limits import MAX_BATCH, integer, number
from . import CommandError, add_ctx_argument, add_overwrite_argument, add_threads_argument

ORDER = 50


def register(subparsers):
    from ..inference.agreement import DEFAULT_MARGIN
    from ..inference.formats import DEFAULT, names
    from ..train.checkpoint import CHECKPOINT_CHOICES

    parser = subparsers.add_parser("export", help="export a trained run for inference, checked against float32",
                                   description=__doc__)
    what = parser.add_argument_group("what to export")
    what.add_argument("--run", required=True, help="run folder of `mxfp16 train` (its --out) (required)")
    what.add_argument("--checkpoint", default="last", metavar="last|best|FILE",
                      help=f"{' or '.join(CHECKPOINT_CHOICES)} checkpoint of the run (best: the epoch with the "
                           "highest val_top1, if its checkpoint is still kept), or a .params file (default: last)")
    what.add_argument("--precision", default=None,
                      help="float32, float16, amp-bfloat16, amp-float16 or auto: float16 on a GPU, amp-bfloat16 on "
                           "a CPU with bfloat16, else float32 (default: auto; float32 with --format onnx, the only "
                           "precision it takes)")
    what.add_argument("--format", dest="model_format", default=DEFAULT, choices=names(),
                      help="mxnet: model-symbol.json and model-0000.params, in --precision; onnx: model.onnx (opset "
                           f"13, float32) for onnxruntime and other ONNX runtimes (default: {DEFAULT})")
    what.add_argument("--onnx-dtype", default="float32", metavar="float32|float16",
                      help="with --format onnx: float16 also writes model-float16.onnx (float16 inside, float32 in "
                           "and out; for GPU execution providers), checked like model.onnx (default: float32)")
    what.add_argument("--amp-lists", default="mxfp16", choices=("mxfp16", "mxnet"),
                      help="operator lists of an AMP conversion: mxfp16's (stem convolution in float32) or "
                           "MXNet's (default: mxfp16)")
    check = parser.add_argument_group("agreement check")
    check.add_argument("--margin", type=number(0, 100), default=DEFAULT_MARGIN, metavar="POINTS",
                       help=f"refuse the export when its top-1 is more than this many percentage points below "
                            f"float32's (default: {DEFAULT_MARGIN:g})")
    check.add_argument("--data", default=None,
                       help="data set whose test split the check runs on (default: the run's own, from config.json)")
    check.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=32,
                       help="images per batch in the check (default: 32)")
    add_ctx_argument(check, one=True, where="the agreement check")
    add_threads_argument(check)
    output = parser.add_argument_group("output")
    output.add_argument("--out", required=True, help="export folder to create (required)")
    add_overwrite_argument(output)
    parser.set_defaults(func=run)


def run(args):
    from ..devices import DeviceError
    from ..inference.agreement import AgreementError
    from ..inference.bundle import ExportError
    from ..inference.export import export_run
    from ..precision import PrecisionError

    try:  # the format refuses a --precision or --onnx-dtype it cannot write, before any work
        export_run(args.run, args.out, precision=args.precision, checkpoint=args.checkpoint, margin=args.margin,
                   overwrite=args.overwrite, amp_lists=args.amp_lists, ctx=args.ctx, data=args.data,
                   batch_size=args.batch_size, model_format=args.model_format,
                   onnx_dtypes=("float32", args.onnx_dtype))
    except (ExportError, AgreementError, PrecisionError, DeviceError) as err:
        raise CommandError(str(err)) from None
