"""scikit-learn's handwritten digits as an image folder: real data with nothing to download.

``sklearn.datasets.load_digits``: 1,797 scans of 8x8 pixels with 17 grey
levels, written as ``docs/data.md`` ("scikit-learn's digits") describes.
"""
from pathlib import Path

import numpy as np

from ..plumbing.fileio import write_json
from ..plumbing.output import Output, refusals_as
from .layout import MANIFEST, data_set_contents, read_manifest
from .validate import DataError

__all__ = ["digits_dataset", "stratified_split", "DIGITS_SETTINGS"]

FORMAT_VERSION = 1
#: The default split: a quarter of each digit's images held out.
DIGITS_SETTINGS = {"test_fraction": 0.25, "seed": 0}


#: What a digits folder holds: one whose manifest says it is one is what ``overwrite`` may replace.
CONTENTS = data_set_contents("digits", "a digits folder")


def _load():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("the digits set comes from scikit-learn, which is not installed: "
                        "pip install scikit-learn (mxfp16's own install includes it)") from None
    digits = load_digits()
    return digits.images, digits.target


def _expected_manifest(test_fraction, seed, counts):
    return {"kind": "digits", "format_version": FORMAT_VERSION,
            "source": "sklearn.datasets.load_digits (UCI optical recognition of handwritten digits)",
            "classes": [str(d) for d in range(10)], "per_class": counts, "size": 8,
            "test_fraction": test_fraction, "seed": seed, "augment": "none"}


def stratified_split(labels, test_fraction=0.25, seed=0):
    """Indices of the training and test images: ``test_fraction`` of each digit, chosen by ``seed``."""
    rng = np.random.RandomState(seed)
    train, test = [], []
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        rng.shuffle(members)
        cut = int(round(len(members) * test_fraction))
        test.extend(members[:cut])
        train.extend(members[cut:])
    return sorted(train), sorted(test)


def digits_dataset(out, test_fraction=0.25, seed=0, overwrite=False):
    """Write the digits into ``out`` as an image folder; reuse it when it is already there.

    Bad settings, scikit-learn missing, or ``out`` holding something else raise :class:`DataError`.

    Parameters
    ----------
    out : str or Path
    test_fraction : float
        Share of each digit's images in ``test/`` (between 0 and 0.9).
    seed : int
        Chooses which images are held out.
    overwrite : bool
        Replace a digits folder written with other settings (never any other folder).

    Returns
    -------
    Path
    """
    if not 0.0 < test_fraction <= 0.9:
        raise DataError(f"test_fraction={test_fraction}: must be above 0 and at most 0.9")
    out = Path(out)
    images, labels = _load()
    train, test = stratified_split(labels, test_fraction, seed)
    counts = {"train": len(train), "test": len(test)}
    expected = _expected_manifest(test_fraction, seed, counts)
    output = Output(out, "writing the digits", overwrite=overwrite, contents=CONTENTS,
                    reuse=lambda folder: read_manifest(folder) == expected, refusal=_refusal)
    with refusals_as(DataError), output:
        if not output.reused:
            _write(output, images, labels, (train, test), expected)
    return out


def _refusal(out):
    """What to do about a folder at ``out`` that is not the digits asked for."""
    found = read_manifest(out) or {}
    if found.get("kind") != "digits":
        return "it is not a digits folder (no digits manifest.json); choose an empty or new folder"
    return (f"it holds the digits with other settings (test fraction {found.get('test_fraction')}, seed "
            f"{found.get('seed')}); replace it with --overwrite (overwrite=True) or choose another folder")


def _write(output, images, labels, splits, expected):
    """The images of both splits as PNGs and the manifest, into a staging folder; then published."""
    from PIL import Image

    staging = output.stage()
    for split, indices in zip(("train", "test"), splits):
        for index in indices:
            folder = staging / split / str(labels[index])
            folder.mkdir(parents=True, exist_ok=True)
            pixels = np.round(images[index] * (255.0 / 16.0)).astype(np.uint8)
            Image.fromarray(pixels, mode="L").convert("RGB").save(folder / f"{index:04d}.png")
    write_json(staging / MANIFEST, expected)
    output.publish(staging)
