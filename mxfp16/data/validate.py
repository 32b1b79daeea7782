"""Finding the images of a folder data set, and the ones that cannot be used.

Validation happens once, when a data set is opened (``make_loaders``,
``data split``, ``data pack``): a fast scan (:func:`scan_image`) skips every
file the decoder would fail on, each one logged with its path and counted,
before the first batch; ``docs/data.md`` ("Bad input") lists what it skips.
Only the formats of :data:`DECODABLE_FORMATS` are admitted: Pillow reads
many that MXNet's decoder (OpenCV inside libmxnet) does not, such as a GIF
named ``.png``.
"""
import logging
import os
import stat
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from ..plumbing.output import shown

__all__ = ["DataError", "IMAGE_EXTENSIONS", "DECODABLE_FORMATS", "FolderScan", "scan_image", "scan_classes"]

LOG = logging.getLogger("mxfp16.data")

# The extensions gluon.data.vision.ImageFolderDataset accepts.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
#: The image formats (as Pillow names them) MXNet 1.9.1's ``mx.image.imdecode`` decodes; its OpenCV was built
#: without GIF, WebP, JPEG 2000 and the rest (tests/test_data_bad_images.py checks it against the decoder).
DECODABLE_FORMATS = ("JPEG", "PNG", "BMP", "TIFF")
# The modes OpenCV (and so MXNet's imdecode) turns into 3-channel colour.
_DECODABLE_MODES = {"RGB", "L", "CMYK", "P", "RGBA", "LA", "I;16", "YCbCr", "1"}
_TAIL_BYTES = 4096
_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class DataError(Exception):
    """A data set problem, with the path at fault and how to fix it."""


def _not_a_regular_file(path, root=None):
    """Why ``path`` is not a regular file that may be opened, or ``None``; opens nothing.

    Opening a FIFO blocks until someone writes to it, and a device node can
    be endless (``/dev/zero``), so they are named and skipped. A symbolic
    link must lead to a regular file, inside ``root`` when one is given.
    """
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            target = Path(os.path.realpath(path))
            try:
                info = path.stat()
            except OSError as err:  # a missing target, or a loop of links
                return f"dangling symbolic link (to {os.readlink(path)}: {err.strerror})"
            link = f"symbolic link to {target}, "
        else:
            target, link = path, ""
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _SPECIAL if test(info.st_mode)), "not a regular file")
        return f"{link}{kind}: only regular files are read"
    if link and root is not None and Path(root).resolve() not in (target, *target.parents):
        return f"{link}outside {root}: copy the file into the data set (or hard-link it) to use it"
    return None


def scan_image(path, root=None):
    """Why ``path`` cannot be used as a training image, or ``None`` when it can.

    Reads only the header and, for JPEGs, the last few KB (a truncated JPEG
    has no end-of-image marker; OpenCV would decode it silently into a
    half-grey picture); ``docs/data.md`` ("Bad input") lists what is refused.

    Parameters
    ----------
    path : str or Path
    root : str or Path, optional
        The data set folder: a symbolic link leading out of it is refused.

    Returns
    -------
    str or None
        A short reason such as ``'truncated JPEG (no end-of-image marker)'``.
    """
    path = Path(path)
    special = _not_a_regular_file(path, root)
    if special:
        return special
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        return f"not an image file (extension {path.suffix or 'none'}; expected {', '.join(IMAGE_EXTENSIONS)})"
    try:
        # O_NONBLOCK: should the file have become a FIFO since the check above, opening it returns at once.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return "not a regular file: only regular files are read"
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return "empty file"
            with warnings.catch_warnings():
                # Pillow only warns between 1x and 2x its limit; such an image is as unusable.
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(handle) as img:
                    fmt, mode = img.format, img.mode
            if fmt == "JPEG":
                handle.seek(max(0, size - _TAIL_BYTES))
                if b"\xff\xd9" not in handle.read():
                    return "truncated JPEG (no end-of-image marker)"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        return f"too many pixels to decode safely, a possible decompression bomb ({err})"
    except (UnidentifiedImageError, OSError, ValueError) as err:
        return f"not a readable image ({type(err).__name__}: {err})"
    if fmt not in DECODABLE_FORMATS:
        return (f"a {fmt} image named {path.suffix}, which MXNet's decoder cannot read (it reads "
                f"{', '.join(DECODABLE_FORMATS)}); convert it, e.g. to PNG")
    if mode not in _DECODABLE_MODES:
        return f"unsupported colour mode {mode}"
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

    A ``root`` that is missing, not a folder, or without class folders raises :class:`DataError`.

    Parameters
    ----------
    root : str or Path
        A folder whose sub-folders are the classes.
    what : str
        How to name ``root`` in error messages (``'training split'``).
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{what} folder {shown(root)} does not exist. Create it with `mxfp16 data synth --out ...` or "
                        "`mxfp16 data split ...` (Caltech-101: `mxfp16 data fetch caltech101`, then the split "
                        "command it prints), or pass the right path.")
    folders = sorted(p for p in _listing(root) if p.is_dir() and not p.name.startswith("."))
    classes, skipped = [], []
    for folder in folders:
        problem = _class_name_problem(folder.name)
        if problem:  # a class name is a label: printed, stored in JSON, written to RecordIO lists
            skipped.append((str(folder), problem))
            LOG.warning("skipping class folder %s: %s", shown(folder), problem)
        else:
            classes.append(folder.name)
    if not classes:
        raise DataError(f"{what} folder {shown(root)} has no usable class sub-folders; expected "
                        f"{shown(root)}/<class>/<image>.jpg.")
    items = []
    for name in classes:
        for path in sorted(_listing(root / name)):
            if path.name.startswith(".") or path.is_dir():
                continue
            reason = scan_image(path, root)
            if reason:
                skipped.append((str(path), reason))
                LOG.warning("skipping %s: %s", shown(path), reason)
            else:
                items.append((str(path), name))  # any bytes in the file name: the loaders read it by Python
    if skipped:
        LOG.warning("%s %s: skipped %d unusable file(s), kept %d images", what, shown(root), len(skipped), len(items))
    return FolderScan(root, classes, items, skipped)


def _listing(folder):
    """The entries of ``folder``, or a :class:`DataError` naming it when it cannot be read."""
    try:
        return list(Path(folder).iterdir())
    except OSError as err:
        raise DataError(f"{shown(folder)} cannot be read ({err.strerror or err}): give this user read access "
                        f"(chmod -R u+rX {shown(folder)}) or move it out of the data set.") from None


def _class_name_problem(name):
    """Why a folder name cannot be a class name, or ``None``."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8 text, and a class name is a label that is printed and stored; rename it"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "its name holds a control character (a newline, a tab, ...); rename it"
    return None
