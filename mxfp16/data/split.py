"""A deterministic train/test split of a ``<class>/<image>`` folder (``docs/data.md``, "Split")."""
import collections
import os
import shutil
import zlib
from pathlib import Path

import numpy as np

from ..plumbing.fileio import write_json
from ..plumbing.output import Output, refusals_as
from .layout import MANIFEST, data_set_contents, read_manifest
from .validate import DataError, scan_classes

__all__ = ["split_folder", "CONTENTS"]

#: What a split folder holds: one made by ``data split`` is what ``overwrite`` may replace.
CONTENTS = data_set_contents("split", "a split made by `mxfp16 data split`")


def _plan_split(files, class_name, seed, train_per_class=None, test_fraction=None):
    """Which of one class's usable ``files`` (names, any order) train and which test: ``(train, test)``."""
    files = sorted(files)
    order = np.random.default_rng([seed, zlib.crc32(class_name.encode("utf-8"))]).permutation(len(files))
    shuffled = [files[i] for i in order]
    if train_per_class is not None:
        if len(files) <= train_per_class:
            raise DataError(f"class {class_name} has {len(files)} usable images, not more than "
                            f"--train-per-class {train_per_class}, so its test split would be empty. "
                            f"Lower --train-per-class or add --exclude {class_name}.")
        n_train = train_per_class
    else:
        n_train = len(files) - int(round(len(files) * test_fraction))
        if n_train < 1:
            raise DataError(f"class {class_name} has {len(files)} usable images; --test-fraction {test_fraction} "
                            f"leaves none for training. Lower it or add --exclude {class_name}.")
    return shuffled[:n_train], shuffled[n_train:]


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"


def _counts_text(by_class):
    """The per-class image counts in a few words: ``2000 classes of 1 image``, ``3 of 2 and 1 of 5``."""
    groups = sorted(collections.Counter(len(files) for files in by_class.values()).items())
    parts = [f"{classes} class{'es' if classes > 1 else ''} of {count} usable image{'s' if count > 1 else ''}"
             for count, classes in groups[:6]]
    return ", ".join(parts) + (" ..." if len(groups) > 6 else "")


def split_folder(src, out, train_per_class=None, test_fraction=None, seed=0, exclude=(), allow_empty_test=False,
                 overwrite=False):
    """Split ``src/<class>/*`` into ``out/train/<class>/`` and ``out/test/<class>/``.

    Parameters
    ----------
    src : str or Path
        A folder of class folders (for Caltech-101,
        ``data/caltech101/101_ObjectCategories``).
    out : str or Path
        Must not exist yet (or hold the same split, which is then reused).
    train_per_class : int, optional
        Training images per class; the rest are test images (Caltech-101: 30).
    test_fraction : float, optional
        The share of each class for test, instead of ``train_per_class``.
    seed : int
    exclude : iterable of str
        Class folder names to leave out (e.g. ``BACKGROUND_Google``).
    allow_empty_test : bool
        Write a split whose test side holds no image (refused otherwise).
    overwrite : bool
        Replace another split at ``out`` (a folder whose manifest says it is
        a split, holding nothing else).

    Returns
    -------
    dict
        The manifest written to ``out/manifest.json``.
    """
    _check_sizes(train_per_class, test_fraction)
    src, out = Path(src), Path(out)
    settings = {"source": str(src.resolve()), "seed": seed, "train_per_class": train_per_class,
                "test_fraction": test_fraction, "exclude": sorted(set(exclude))}
    # The writing rule: inside --src the split would become one more class folder of its own source.
    output = Output(out, f"splitting {src}", overwrite=overwrite, inputs=[("the source folder --src", src)],
                    contents=CONTENTS, reuse=lambda folder: _same(folder, settings),
                    refusal="it holds other contents or settings. Replace it with --overwrite (a split only), or "
                            "choose another --out")
    with refusals_as(DataError), output:
        return read_manifest(out) if output.reused else _split(output, src, settings, allow_empty_test)


def _check_sizes(train_per_class, test_fraction):
    """Refuse anything but exactly one of ``train_per_class`` (at least 1) and ``test_fraction`` (in (0, 1))."""
    if (train_per_class is None) == (test_fraction is None):
        raise DataError("give exactly one of --train-per-class N and --test-fraction F.")
    if train_per_class is not None and train_per_class < 1:
        raise DataError(f"--train-per-class {train_per_class}: need at least 1.")
    if test_fraction is not None and not 0 < test_fraction < 1:
        raise DataError(f"--test-fraction {test_fraction}: need a number between 0 and 1 (exclusive).")


def _files_by_class(scan, src, exclude):
    """``{class: [file name]}`` of the usable images of every class ``scan`` found that ``exclude`` does not name."""
    missing = sorted(exclude - set(scan.classes))
    if missing:
        raise DataError(f"--exclude {' '.join(missing)}: no such class folder in {src} "
                        f"(classes: {', '.join(scan.classes[:8])}{' ...' if len(scan.classes) > 8 else ''}).")
    by_class = {name: [] for name in scan.classes if name not in exclude}
    if not by_class:
        raise DataError(f"every class of {src} is excluded; nothing to split.")
    for path, name in scan.items:
        if name in by_class:
            by_class[name].append(Path(path).name)
    empty = [name for name, files in by_class.items() if not files]
    if empty:
        raise DataError(f"class folder(s) without usable images: {', '.join(str(src / n) for n in empty[:10])}. "
                        "Add images, delete the folders or --exclude them.")
    return by_class


def _same(folder, settings):
    """Whether ``folder`` holds the split of ``settings`` (it is then reused)."""
    manifest = read_manifest(folder)
    return manifest is not None and {k: manifest.get(k) for k in settings} == settings


def _split(output, src, settings, allow_empty_test):
    """:func:`split_folder` once ``out`` is locked and free: plan, link or copy into a staging folder, publish."""
    train_per_class, test_fraction, seed = settings["train_per_class"], settings["test_fraction"], settings["seed"]
    exclude = set(settings["exclude"])
    scan = scan_classes(src, "source")
    by_class = _files_by_class(scan, src, exclude)
    classes = list(by_class)
    plans = {name: _plan_split(files, name, seed, train_per_class, test_fraction) for name, files in by_class.items()}
    if not allow_empty_test and not any(test for _, test in plans.values()):
        raise DataError(f"--test-fraction {test_fraction} leaves the test split empty: {src} has "
                        f"{_counts_text(by_class)}, and round(images x {test_fraction}) is 0 for each. Training "
                        "evaluates every epoch on the test split; raise --test-fraction, add images, or pass "
                        "--allow-empty-test to write this split anyway.")
    tmp = output.stage()
    methods = set()
    for name, (train, test) in plans.items():
        for split, files in (("train", train), ("test", test)):
            folder = tmp / split / name
            folder.mkdir(parents=True)
            for file_name in files:
                methods.add(_link_or_copy(src / name / file_name, folder / file_name))
    manifest = dict(settings, kind="split", classes=classes,
                    counts={name: {"train": len(tr), "test": len(te)} for name, (tr, te) in plans.items()},
                    totals={"train": sum(len(tr) for tr, _ in plans.values()),
                            "test": sum(len(te) for _, te in plans.values())},
                    files={frozenset({"link"}): "hard links", frozenset({"copy"}): "copies"}.get(
                        frozenset(methods), "links and copies"),
                    skipped=[list(s) for s in scan.skipped if Path(s[0]).parent.name not in exclude])
    write_json(tmp / MANIFEST, manifest)
    output.publish(tmp)
    return manifest
