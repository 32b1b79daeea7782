"""``mxfp16 predict --model DIR IMAGE_OR_FOLDER ...``: the top classes of images, from an export.

Reads an export folder of `mxfp16 export` (its files checked against the
sha256s in export.json), prepares each image as the run's test images were
(short side resized, central crop, ImageNet normalisation) and prints the
top-k classes with their probabilities. Folders are walked recursively, in
batches, with a progress bar. Corrupt, truncated and non-image files are
reported and skipped. --output writes CSV or JSON (a new file; --overwrite
replaces one; never the export's own files or an input). An ONNX export (mxfp16
export --format onnx) runs on onnxruntime alone: MXNet is not imported, so
a deployment needs only pip install 'mxfp16[onnx]'.
"""
import sys
from pathlib import Path

from ..plumbing.limits import MAX_BATCH, MAX_COUNT, integer
from . import CommandError, add_ctx_argument, add_overwrite_argument, add_threads_argument, open_output

ORDER = 55
FORMATS = (".csv", ".json")


def register(subparsers):
    parser = subparsers.add_parser("predict", help="top-k classes of images, from an exported model",
                                   description=__doc__)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE_OR_FOLDER", help="image files and folders of images")
    parser.add_argument("--model", required=True, help="export folder of `mxfp16 export` (required)")
    parser.add_argument("--top-k", type=integer(1, MAX_COUNT), default=5,
                        help="classes per image, most likely first (default: 5)")
    parser.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=32,
                        help="images per forward pass (default: 32)")
    parser.add_argument("--output", default=None, metavar="FILE.csv|FILE.json",
                        help="also write the predictions and the skipped files, as CSV or JSON by the file's "
                             "extension (default: print only)")
    add_overwrite_argument(parser, "--output")
    parser.add_argument("--onnx-dtype", default=None, metavar="float32|float16",
                        help="which model of an ONNX export runs: float16 where it was exported (--onnx-dtype float16 "
                             "of mxfp16 export; for GPU execution providers) (default: float32)")
    add_ctx_argument(parser, one=True)
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (default: a bar on a terminal)")
    add_threads_argument(parser)
    parser.set_defaults(func=run)


def run(args):
    from ..inference.predict import image_files

    suffix = Path(args.output).suffix.lower() if args.output else None
    if args.output and suffix not in FORMATS:
        raise CommandError(f"--output {args.output}: name a .csv or a .json file")
    files, skipped = image_files(args.inputs)
    # Locked and refused before minutes of predicting, not after: an existing file without --overwrite, the
    # export's own files (export.json, the model) and every image read.
    inputs = [("the export --model", args.model)] + [("an input image", path) for path in files]
    with open_output(args.output, "writing predictions", args.overwrite, inputs, "--output", kind="file") as output:
        return _predict(args, files, skipped, output)


def _predict(args, files, skipped, output):
    """Predict ``files`` with the export, print the results, and write ``output`` (an Output, or ``None``)."""
    from tqdm.auto import tqdm

    from ..devices import DeviceError
    from ..inference.bundle import ExportError
    from ..inference.predict import Predictor, escape_text, to_csv, to_document
    from ..plumbing.fileio import write_json
    from ..plumbing.output import atomic_write

    try:
        predictor = Predictor(args.model, ctx=args.ctx, dtype=args.onnx_dtype)
    except (ExportError, DeviceError, ImportError) as err:  # ImportError: an MXNet export where MXNet is missing
        raise CommandError(str(err)) from None
    with tqdm(total=len(files), unit="image", desc="predict", leave=False, dynamic_ncols=True, file=sys.stderr,
              disable=True if not args.progress else None) as bar:
        try:
            results, unreadable = predictor.predict_files(files, top_k=args.top_k, batch_size=args.batch_size,
                                                          progress=bar.update)
        except ExportError as err:  # a model that fails on a batch, or gives another number of scores
            raise CommandError(str(err)) from None
    skipped += unreadable
    # escape_text: one line per name, whatever it holds (a newline, bytes that are not UTF-8), and reversible.
    for r in results:
        print(escape_text(r.path) + ": " + ", ".join(f"{escape_text(name)} {prob:.3f}" for name, _, prob in r.top))
    for path, reason in skipped:
        print(f"mxfp16 predict: skipped {escape_text(path)}: {escape_text(reason)}", file=sys.stderr)
    print(f"{len(results)} image(s) predicted with {predictor.description} ({args.model}), "
          f"{len(skipped)} skipped", file=sys.stderr)
    if output is not None:
        staged = output.stage()
        if output.path.suffix.lower() == ".json":
            write_json(staged, to_document(predictor, results, skipped))
        else:
            with atomic_write(staged) as handle:  # UTF-8 throughout: every name in it is escaped
                handle.write(to_csv(results, skipped, min(args.top_k, len(predictor.classes))))
        output.publish(staged)
        print(f"wrote {args.output}", file=sys.stderr)
    if not results:
        raise CommandError("no image could be read; see the skipped files above")
