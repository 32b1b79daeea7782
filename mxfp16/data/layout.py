"""Where the documented Caltech-101 sequence puts each stage, and what to do with a folder that is not a split.

The sequence is the code block of ``docs/data.md`` ("Caltech-101"); :func:`caltech101_commands` gives it under any
root. The folder names live here and nowhere else in the code (``tests/test_caltech_path.py`` checks every mention).
"""
import shlex
from collections import namedtuple
from pathlib import Path

from ..plumbing.fileio import JSONFileError, read_json
from ..plumbing.output import Contents

__all__ = ["CALTECH101_TRAIN_PER_CLASS", "Caltech101Paths", "caltech101_paths", "caltech101_commands",
           "split_problem", "pack_problem", "PIPELINES", "MANIFEST",
           "read_manifest", "data_set_contents"]

#: What describes a data set folder mxfp16 writes (``data split``, ``synth``, ``digits``): its kind and settings.
MANIFEST = "manifest.json"

#: The two layouts a data set comes in, named by the pipeline that reads each: a folder split
#: (``train/<class>/``, ``test/<class>/``) and a RecordIO pack (a prefix of ``mxfp16 data pack``).
PIPELINES = ("folder", "recordio")

#: The usual Caltech-101 protocol: 30 training images per class, the rest for test.
CALTECH101_TRAIN_PER_CLASS = 30
#: The folder ``fetch`` renames into place under its root, and the archive's folder of class folders inside it.
FETCHED, IMAGES = "caltech101", "101_ObjectCategories"
SPLIT = f"caltech101-{CALTECH101_TRAIN_PER_CLASS}"
PACK = ("caltech101-rec", "caltech101")

Caltech101Paths = namedtuple("Caltech101Paths", "fetched images split pack")
Caltech101Paths.__doc__ = """The documented Caltech-101 folders under one data root.

``fetched``: what ``data fetch`` returns (``manifest.json`` and ``images``);
``images``: its class folders, the ``--src`` of ``data split``; ``split``:
``train/`` and ``test/``, the ``--data-dir`` of the folder pipeline;
``pack``: the RecordIO prefix, the ``--data-dir`` of ``--pipeline recordio``.
"""


def caltech101_paths(root="data"):
    """The documented Caltech-101 folders under ``root`` (the ``--root`` of ``data fetch``).

    Parameters
    ----------
    root : str or Path

    Returns
    -------
    Caltech101Paths
    """
    root = Path(root)
    return Caltech101Paths(root / FETCHED, root / FETCHED / IMAGES, root / SPLIT, root.joinpath(*PACK))


def _q(path):
    """``path`` as a shell word: the commands are printed for copying, and a root may hold a space."""
    return shlex.quote(str(path))


def _split_command(src, out, train_per_class=CALTECH101_TRAIN_PER_CLASS):
    """The ``mxfp16 data split`` command line that turns ``src`` (class folders) into the split ``out``."""
    return f"mxfp16 data split --src {_q(src)} --out {_q(out)} --train-per-class {train_per_class} --seed 0"


def _pack_command(src, prefix):
    """The ``mxfp16 data pack`` command line that packs the split ``src`` into RecordIO at ``prefix``."""
    return f"mxfp16 data pack --src {_q(src)} --out {_q(prefix)}"


def caltech101_commands(root="data"):
    """The documented steps after ``data fetch``, as command lines with the folders under ``root``.

    Parameters
    ----------
    root : str or Path
        The ``--root`` of ``data fetch``.

    Returns
    -------
    list of str
        Split, train on the split, pack (optional), train on the pack.
    """
    p = caltech101_paths(root)
    return [_split_command(p.images, p.split), f"mxfp16 train --data-dir {_q(p.split)}", _pack_command(p.split, p.pack),
            f"mxfp16 train --pipeline recordio --data-dir {_q(p.pack)}"]


def split_problem(folder, then="train on {split} (--data-dir {split})"):
    """Why ``folder`` cannot feed the folder pipeline, with the command that fixes it; ``None`` if it can.

    It recognises what people point ``--data-dir`` at by mistake; anything
    else (a missing folder, an empty one) is left to the scan, which names it.

    Parameters
    ----------
    folder : str or Path
        What was given as the folder pipeline's source.
    then : str
        The step after the split, ``{split}`` for its folder (``data pack`` says "pack {split} (--src {split})").

    Returns
    -------
    str or None
        The message for a :class:`~mxfp16.data.DataError`.
    """
    folder = Path(folder)
    if (folder / "train").is_dir():
        return None
    if (folder / IMAGES).is_dir():  # <root>/caltech101, as data fetch leaves it
        p = caltech101_paths(folder.parent)
        return (f"{folder} is Caltech-101 as `mxfp16 data fetch` leaves it ({folder / IMAGES}), not a train/test "
                f"split: it has no train/ folder. Split it first with `{_split_command(folder / IMAGES, p.split)}`, "
                f"then {then.format(split=p.split)}.")
    if folder.name == IMAGES and folder.is_dir():
        p = caltech101_paths(folder.parent.parent)
        return (f"{folder} holds Caltech-101's class folders, not a train/test split: it has no train/ folder. "
                f"Split it first with `{_split_command(folder, p.split)}`, then {then.format(split=p.split)}.")
    if Path(f"{folder}_classes.json").is_file():
        return (f"{folder} is a RecordIO pack prefix ({folder}_classes.json), not a folder split: it is already "
                "packed; read it with the recordio pipeline (--pipeline recordio).")
    if folder.name in ("train", "test") and (folder.parent / "train").is_dir():
        return (f"{folder} is one half of the split {folder.parent}: {then.format(split=folder.parent)} "
                "instead.")
    if folder.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in folder.iterdir()):
        out = folder.with_name(folder.name + "-split")
        return (f"{folder} has class folders but no train/ folder: it is not split into train/ and test/ yet. "
                f"Split it with `mxfp16 data split --src {folder} --out {out} --test-fraction 0.2 --seed 0` "
                f"(or --train-per-class N), then {then.format(split=out)}.")
    if folder.name == SPLIT and not folder.exists():
        p = caltech101_paths(folder.parent)
        split = _split_command(p.images, p.split)
        if p.images.is_dir():
            return f"{folder} does not exist yet: make it from the download in {p.images} with `{split}`."
        root = "" if folder.parent == Path("data") else f" --root {folder.parent}"
        return (f"{folder} does not exist yet: fetch Caltech-101 with `mxfp16 data fetch caltech101{root}`, then "
                f"split it with `{split}`.")
    return None


def pack_problem(prefix, flag="--data-dir"):
    """Why ``prefix`` is not a RecordIO pack prefix, when it is a folder instead; ``None`` otherwise.

    The message gives the ``data pack`` command (and the split before it); a missing prefix is left to the caller.

    Parameters
    ----------
    prefix : str or Path
        What was given as the recordio pipeline's source.
    flag : str
        The command's flag for that source (``--data-dir`` for train, ``--data`` for bench).

    Returns
    -------
    str or None
    """
    prefix = Path(prefix)
    if not prefix.is_dir() or Path(f"{prefix}_classes.json").is_file():
        return None
    if (prefix / "train").is_dir():
        target = (caltech101_paths(prefix.parent).pack if prefix.name == SPLIT
                  else prefix.with_name(prefix.name + "-rec") / prefix.name)
        return (f"{prefix} is a folder split, not a RecordIO pack prefix. Train on it with --pipeline folder, or "
                f"pack it with `{_pack_command(prefix, target)}` and pass {flag} {target}.")
    if (prefix / IMAGES).is_dir() or prefix.name == IMAGES:  # the raw download, or its class folders
        images = prefix / IMAGES if (prefix / IMAGES).is_dir() else prefix
        p = caltech101_paths(images.parent.parent)
        return (f"{prefix} is Caltech-101 as `mxfp16 data fetch` leaves it, not a RecordIO pack prefix. Split it "
                f"with `{_split_command(images, p.split)}`, pack the split with `{_pack_command(p.split, p.pack)}`, "
                f"then pass {flag} {p.pack}.")
    return (f"{prefix} is a folder, not a RecordIO pack prefix (PREFIX_train.rec, PREFIX_classes.json, ...). Make "
            "a train/test split of it with `mxfp16 data split`, pack that with `mxfp16 data pack --src SPLIT --out "
            "PREFIX` and pass PREFIX, or read a split with --pipeline folder.")


def read_manifest(folder):
    """The :data:`MANIFEST` of a data set folder, or ``None`` when it has no readable one."""
    try:
        return read_json(Path(folder) / MANIFEST)
    except JSONFileError:
        return None


def data_set_contents(kind, what):
    """What a data set folder of ``kind`` holds (:data:`MANIFEST`, ``train/``, ``test/``), as
    :class:`~mxfp16.plumbing.output.Contents`: one is what ``--overwrite`` may replace when its manifest says
    ``kind``, never another folder.

    Parameters
    ----------
    kind : str
        The manifest's ``kind`` (``'split'``, ``'synth'``, ``'digits'``).
    what : str
        What such a folder is, for messages (``'a synthetic set'``).
    """
    return Contents(what, (MANIFEST, "train", "test"),
                    is_one=lambda folder: (read_manifest(folder) or {}).get("kind") == kind)
