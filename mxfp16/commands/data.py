"""``mxfp16 data``: fetch Caltech-101, split it, generate the demo set, write the digits, pack RecordIO, time the
pipelines."""
import argparse
import logging
import sys

from ..data.extract import DEFAULT_MAX_EXTRACT_BYTES, DEFAULT_MAX_MEMBERS, DEFAULT_MAX_RATIO, ENTRY_OVERHEAD, parse_size
from ..data.synth import DEMO_SETTINGS as DEMO
from ..plumbing.fileio import read_json
from ..plumbing.limits import MAX_BATCH, MAX_COUNT, MAX_IMAGE_SIDE, MAX_SECONDS, integer, number
from . import CommandError, add_overwrite_argument, add_threads_argument, open_output

ORDER = 10


def register(subparsers):
    from ..data.layout import caltech101_commands, caltech101_paths

    caltech = caltech101_paths()
    # The documented Caltech-101 sequence, from the one place that names its folders (mxfp16/data/layout.py).
    steps = ["mxfp16 data fetch caltech101"] + caltech101_commands()
    parser = subparsers.add_parser("data", help="fetch, split, synthesise, pack and benchmark image data sets",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="Caltech-101 from download to training (docs/data.md; the pack is "
                                          "optional):\n" + "\n".join(f"  {step}" for step in steps))
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    for add in (_add_fetch, _add_split, _add_synth, _add_digits, _add_pack, _add_bench):
        add(sub, caltech)


def _add_fetch(sub, caltech):
    fetch = sub.add_parser("fetch", help="download and unpack Caltech-101 (resumable, checksummed, safe extraction)")
    fetch.add_argument("dataset", choices=["caltech101"], help="the data set to fetch")
    group = fetch.add_argument_group("source")
    group.add_argument("--root", default="data", help="folder that receives caltech101/ and downloads/ (default: data)")
    group.add_argument("--url", default=None,
                       help="mirror URL, file:// URL or local path of caltech-101.zip or 101_ObjectCategories.tar.gz "
                            "(default: the official data.caltech.edu URL)")
    group.add_argument("--sha256", default=None,
                       help="expected SHA-256 of the download (default: none known; the download is then not verified "
                            "and its checksum is recorded)")
    group.add_argument("--timeout", type=number(1e-3, MAX_SECONDS), default=60,
                       help="seconds without data before giving up, more than 0 (default: 60)")
    group.add_argument("--no-progress", action="store_true", help="hide the progress bar (default: shown)")
    group = fetch.add_argument_group("extraction limits (an archive past them is refused, nothing is kept)")
    group.add_argument("--max-extract-bytes", type=_size, default=DEFAULT_MAX_EXTRACT_BYTES, metavar="SIZE",
                       help="most bytes the archives may extract to in all, as bytes or with K/M/G/T (powers of "
                            f"1024); Caltech-101 needs about 300 MB (default: {DEFAULT_MAX_EXTRACT_BYTES >> 30}G, i.e. "
                            f"{DEFAULT_MAX_EXTRACT_BYTES} bytes)")
    group.add_argument("--max-ratio", type=number(1, 1e6), default=DEFAULT_MAX_RATIO, metavar="R",
                       help="most a member larger than 1 MiB may expand, uncompressed over compressed size; JPEGs "
                            f"stay near 1 (default: {DEFAULT_MAX_RATIO})")
    group.add_argument("--max-members", type=integer(1, 100_000_000), default=DEFAULT_MAX_MEMBERS, metavar="N",
                       help="most files and folders one archive may hold; Caltech-101 holds about 9,300, and each "
                            f"also counts {ENTRY_OVERHEAD} bytes toward --max-extract-bytes (default: "
                            f"{DEFAULT_MAX_MEMBERS})")
    fetch.set_defaults(func=run_fetch)


def _add_split(sub, caltech):
    split = sub.add_parser("split", help="deterministic train/test split of a class-folder data set")
    group = split.add_argument_group("input and output")
    group.add_argument("--src", required=True, help=f"folder of class folders, e.g. {caltech.images} (required)")
    group.add_argument("--out", required=True,
                       help=f"new folder for train/<class>/ and test/<class>/, e.g. {caltech.split} (required)")
    group = split.add_argument_group("protocol")
    how = group.add_mutually_exclusive_group(required=True)
    how.add_argument("--train-per-class", type=integer(1, MAX_COUNT),
                     help="training images per class, the rest test (Caltech-101: 30); this or --test-fraction is "
                          "required")
    how.add_argument("--test-fraction", type=number(0, 1), help="share of each class for test, e.g. 0.2 (no default)")
    group.add_argument("--seed", type=integer(0, 2 ** 32 - 1), default=0, help="shuffling seed (default: 0)")
    group.add_argument("--exclude", nargs="*", default=[], metavar="CLASS",
                       help="class folders to leave out, e.g. BACKGROUND_Google (default: none)")
    group.add_argument("--allow-empty-test", action="store_true",
                       help="write the split even when its test side holds no image (mxfp16 train refuses such a "
                            "data set) (default: off, refused)")
    add_overwrite_argument(split.add_argument_group("output"))
    split.set_defaults(func=run_split)


def _add_synth(sub, caltech):
    synth = sub.add_parser("synth", help="generate the synthetic shapes data set (the demo set's generator)")
    synth.add_argument("--out", required=True,
                       help="new output folder (required; the demo set itself lives in data/demo and is made on "
                            "first use)")
    group = synth.add_argument_group("settings (defaults: the demo set's)")
    group.add_argument("--classes", type=integer(1, 100_000), default=DEMO["classes"],
                       help=f"number of shape classes, 1-10 (default: {DEMO['classes']})")
    group.add_argument("--per-class", type=integer(1, 1_000_000), default=DEMO["per_class"],
                       help=f"training images per class (default: {DEMO['per_class']})")
    group.add_argument("--test-per-class", type=integer(0, 1_000_000), default=DEMO["test_per_class"],
                       help=f"test images per class (default: {DEMO['test_per_class']})")
    group.add_argument("--size", type=integer(8, MAX_IMAGE_SIDE), default=DEMO["size"],
                       help="typical image side; each side is drawn from [0.8, 1.25] times it "
                            f"(default: {DEMO['size']})")
    group.add_argument("--seed", type=integer(0, 2 ** 32 - 1), default=DEMO["seed"],
                       help=f"generator seed (default: {DEMO['seed']})")
    add_overwrite_argument(synth.add_argument_group("output"))
    synth.set_defaults(func=run_synth)


def _add_digits(sub, caltech):
    digits = sub.add_parser("digits", help="write scikit-learn's handwritten digits (8x8, 1,797 images, no "
                                           "download) as a train/test image folder, for the sequence models")
    digits.add_argument("--out", required=True, help="new output folder, e.g. data/digits (required)")
    digits.add_argument("--test-fraction", type=number(0.01, 0.9), default=0.25,
                        help="share of each digit's images held out for test/ (default: 0.25)")
    digits.add_argument("--seed", type=integer(0, 2 ** 32 - 1), default=0,
                        help="chooses the held-out images (default: 0)")
    add_overwrite_argument(digits)
    digits.set_defaults(func=run_digits)


def _add_pack(sub, caltech):
    pack = sub.add_parser("pack", help="pack a folder split into RecordIO (.rec, .idx, .lst + _classes.json)")
    group = pack.add_argument_group("input and output")
    group.add_argument("--src", required=True, help=f"folder with train/ and test/, e.g. {caltech.split} (required)")
    group.add_argument("--out", required=True,
                       help="output prefix; writes PREFIX_train.rec/.idx/.lst, PREFIX_test.* and PREFIX_classes.json, "
                            f"e.g. {caltech.pack}")
    group = pack.add_argument_group("encoding")
    group.add_argument("--resize", type=integer(0, MAX_IMAGE_SIDE), default=0,
                       help="resize the short side to this first (default: 0, keep)")
    group.add_argument("--quality", type=integer(1, 100), default=95, help="JPEG quality 1-100 (default: 95)")
    group.add_argument("--workers", type=integer(1, 256), default=2, help="encoding processes (default: 2)")
    add_overwrite_argument(pack.add_argument_group("output"), "the pack at --out")
    pack.set_defaults(func=run_pack)


def _add_bench(sub, caltech):
    bench = sub.add_parser("bench", help="images per second of the folder and RecordIO pipelines")
    group = bench.add_argument_group("input")
    group.add_argument("--src", default=None,
                       help="folder split (timed as folder, and packed to a temporary RecordIO) or pack prefix "
                            "(default: the demo set, generated if missing)")
    group.add_argument("--pack-resize", type=integer(0, MAX_IMAGE_SIDE), default=0,
                       help="short side of the temporary pack made from a folder (default: 0, keep sizes)")
    group = bench.add_argument_group("pipeline")
    group.add_argument("--image-size", type=integer(1, MAX_IMAGE_SIDE), default=224,
                       help="crop side in pixels (default: 224)")
    group.add_argument("--workers", type=integer(0, 256), default=2,
                       help="worker processes / decoding threads; 0 (1 thread for RecordIO) is always timed too "
                            "(default: 2)")
    group.add_argument("--batch-size", type=integer(1, MAX_BATCH), default=32, help="images per batch (default: 32)")
    group.add_argument("--images", type=integer(1, MAX_COUNT), default=600,
                       help="images timed per pipeline (default: 600)")
    add_threads_argument(group)
    group = bench.add_argument_group("output")
    group.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON (default: no file)")
    add_overwrite_argument(group, "the --json file")
    bench.set_defaults(func=run_bench)


def _size(text):
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _guard(call):
    """``call(mxfp16.data)``, its DataError a CommandError; the data code's log shown."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    from .. import data

    try:
        return call(data)
    except data.DataError as err:
        raise CommandError(str(err)) from None


def run_fetch(args):
    from ..data.fetch import ExtractLimits, fetch_caltech101
    from ..data.layout import caltech101_commands

    limits = ExtractLimits(args.max_extract_bytes, args.max_ratio, args.max_members)
    path = _guard(lambda data: fetch_caltech101(args.root, args.url, args.sha256, not args.no_progress, args.timeout,
                                                limits))
    manifest = read_json(path / "manifest.json")
    print(f"{path}: {manifest['classes']} class folders, {manifest['files']} files, sha256 {manifest['sha256']}"
          + ("" if manifest["sha256_verified"] else " (NOT verified: no expected checksum given)"))
    split, train, pack, train_rec = caltech101_commands(args.root)
    print(f"next, split it and train on the split (docs/data.md):\n  {split}\n  {train}\n"
          f"or pack the split into RecordIO and train on the pack:\n  {pack}\n  {train_rec}")


def run_split(args):
    from ..data.split import split_folder

    manifest = _guard(lambda data: split_folder(args.src, args.out, args.train_per_class, args.test_fraction,
                                                args.seed, args.exclude, args.allow_empty_test, args.overwrite))
    print(f"{args.out}: {len(manifest['classes'])} classes, {manifest['totals']['train']} train and "
          f"{manifest['totals']['test']} test images ({manifest['files']}), {len(manifest['skipped'])} files skipped")


def run_synth(args):
    path = _guard(lambda data: data.synth_dataset(args.out, args.classes, args.per_class, args.test_per_class,
                                                  args.size, args.seed, overwrite=args.overwrite))
    print(f"{path}: {args.classes} classes, {args.per_class} train and {args.test_per_class} test images per class")


def run_digits(args):
    from ..data.digits import digits_dataset

    path = _guard(lambda data: digits_dataset(args.out, args.test_fraction, args.seed, args.overwrite))
    manifest = read_json(f"{path}/manifest.json")
    print(f"{path}: 10 digits, {manifest['per_class']['train']} train and {manifest['per_class']['test']} test "
          "images, 8x8 px; train a sequence model on it with: mxfp16 train --data-dir "
          f"{path} --model lstm-classifier --image-size 8")


def run_pack(args):
    from ..data.pack import pack_recordio

    meta = _guard(lambda data: pack_recordio(args.src, args.out, args.resize, args.quality, args.workers,
                                             args.overwrite))
    print(f"{args.out}_{{train,test}}.rec/.idx/.lst: {meta['counts']['train']} train and {meta['counts']['test']} "
          f"test images, {len(meta['classes'])} classes, {len(meta['skipped'])} files skipped")


def run_bench(args):
    from ..data.timing import bench_pipelines
    from ..plumbing.fileio import write_json

    with open_output(args.json, "timing the data pipelines", args.overwrite, [("the data set --src", args.src)],
                     "--json", kind="file") as output:
        report = _guard(lambda data: bench_pipelines(args.src or data.demo_dataset(), args.image_size, args.workers,
                                                     args.batch_size, args.images, args.pack_resize))
        sizes = report["image_sizes"]
        if sizes and sizes.get("count"):
            print(f"images: {sizes['count']} training images, mean {sizes['mean_width']:.0f}x"
                  f"{sizes['mean_height']:.0f} px (min {sizes['min'][0]}x{sizes['min'][1]}, max {sizes['max'][0]}x"
                  f"{sizes['max'][1]}); crops {args.image_size} px, batch {args.batch_size}")
        print(f"{'pipeline':<10}{'workers':>8}{'img/s':>10}{'img/CPU-s':>11}{'first batch s':>15}")
        for row in report["results"]:
            per_cpu = f"{row['images_per_cpu_second']:.0f}" if row["images_per_cpu_second"] else "-"
            print(f"{row['pipeline']:<10}{row['workers']:>8}{row['images_per_second']:>10.0f}{per_cpu:>11}"
                  f"{row['first_batch_s']:>15.2f}")
        load = report["load_average"]
        print(f"load average (1 min) {load['before'][0]:.2f} before, {load['after'][0]:.2f} after, "
              f"{report['settings']['cpu_count']} CPUs")
        if output is not None:
            staged = output.stage()
            write_json(staged, report)
            output.publish(staged)
