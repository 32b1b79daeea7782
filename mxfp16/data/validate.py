"""Finding the images of a folder data set, and the ones that cannot be used.

Validation happens once, when a data set is opened (``make_loaders``,
``data split``, ``data pack``): a fast scan reads each file's header with
Pillow and, for JPEGs, checks the end-of-image marker, so corrupt, truncated
and non-image files are skipped -- each one logged with its path and counted
-- before the first batch. Grayscale, CMYK and palette images are fine: the
decoders convert them to 3-channel RGB. A decode error that still happens
inside an epoch is re-raised by the loaders as :class:`DataError` naming the
file (see ``pipelines.py``).
"""
import logging
from pathlib import Path

from PIL import Image, UnidentifiedImageError

__all__ = ["DataError", "IMAGE_EXTENSIONS", "FolderScan", "scan_image", "scan_classes"]

LOG = logging.getLogger("mxfp16.data")

# The extensions gluon.data.vision.ImageFolderDataset accepts.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# The modes OpenCV (and so MXNet's imdecode) turns into 3-channel colour.
_DECODABLE_MODES = {"RGB", "L", "CMYK", "P", "RGBA", "LA", "I;16", "YCbCr", "1"}
_TAIL_BYTES = 4096


class DataError(Exception):
    """A data set problem, with the path at fault and how to fix it."""


def scan_image(path):
    """Why ``path`` cannot be used as a training image, or ``None`` when it can.

    Reads only the header and, for JPEGs, the last few KB (a truncated JPEG
    has no end-of-image marker; OpenCV would decode it silently into a
    half-grey picture).

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    str or None
        A short reason such as ``'truncated JPEG (no end-of-image marker)'``.
    """
    path = Path(path)
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        return f"not an image file (extension {path.suffix or 'none'}; expected {', '.join(IMAGE_EXTENSIONS)})"
    try:
        size = path.stat().st_size
        with Image.open(path) as img:
            fmt, mode = img.format, img.mode
    except (UnidentifiedImageError, OSError, ValueError) as err:
        return f"not a readable image ({type(err).__name__}: {err})"
    if size == 0:
        return "empty file"
    if mode not in _DECODABLE_MODES:
        return f"unsupported colour mode {mode}"
    if fmt == "JPEG":
        with open(path, "rb") as handle:
            handle.seek(max(0, size - _TAIL_BYTES))
            if b"\xff\xd9" not in handle.read():
                return "truncated JPEG (no end-of-image marker)"
    return None


class FolderScan:
    """The usable images of a ``<root>/<class>/<image>`` folder and the skipped files.

    Attributes
    ----------
    root : Path
    classes : list of str
        Class folder names, sorted (label = index), including classes whose
        images were all skipped (see :meth:`require_every_class`).
    items : list of (str, str)
        ``(path, class name)`` of every usable image, sorted.
    skipped : list of (str, str)
        ``(path, reason)`` of every file left out.
    """

    def __init__(self, root, classes, items, skipped):
        self.root, self.classes, self.items, self.skipped = Path(root), classes, items, skipped

    def counts(self):
        """Usable images per class, ``{class: count}`` in class order."""
        counts = dict.fromkeys(self.classes, 0)
        for _, name in self.items:
            counts[name] += 1
        return counts

    def require_every_class(self):
        """Raise :class:`DataError` naming any class folder without a usable image."""
        empty = [name for name, count in self.counts().items() if count == 0]
        if empty:
            raise DataError(
                f"{len(empty)} class folder(s) under {self.root} have no usable images: "
                + ", ".join(str(self.root / name) for name in empty[:10])
                + (" ..." if len(empty) > 10 else "")
                + ". Add images to them or delete the folders (a class without training images cannot be learned).")
        return self


def scan_classes(root, what="data set"):
    """Scan ``root/<class>/*`` and return a :class:`FolderScan`; log each skipped file.

    Parameters
    ----------
    root : str or Path
        A folder whose sub-folders are the classes.
    what : str
        How to name ``root`` in error messages (``'training split'``).

    Raises
    ------
    DataError
        ``root`` is missing, not a folder, or has no class folders.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{what} folder {root} does not exist. Create it with `mxfp16 data synth --out ...`, "
                        "`mxfp16 data split ...` or `mxfp16 data fetch caltech101`, or pass the right path.")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{what} folder {root} has no class sub-folders; expected {root}/<class>/<image>.jpg.")
    items, skipped = [], []
    for name in classes:
        for path in sorted((root / name).iterdir()):
            if path.name.startswith(".") or path.is_dir():
                continue
            reason = scan_image(path)
            if reason:
                skipped.append((str(path), reason))
                LOG.warning("skipping %s: %s", path, reason)
            else:
                items.append((str(path), name))
    if skipped:
        LOG.warning("%s %s: skipped %d unusable file(s), kept %d images", what, root, len(skipped), len(items))
    return FolderScan(root, classes, items, skipped)
