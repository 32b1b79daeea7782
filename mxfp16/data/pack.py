"""Pack a folder split into RecordIO for ``mx.io.ImageRecordIter``.

What a pack holds, and how it is written so that an interrupted or
concurrent pack never looks complete, is ``docs/data.md`` ("Pack
(RecordIO)"); every record carries a checksum
(:func:`mxfp16.data.records.record_checksum`).
"""
import logging
import os
import urllib.parse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import mxnet as mx
import numpy as np

from ..plumbing.fileio import write_json
from ..plumbing.output import Contents, Output, failed_write, refusals_as, shown
from .layout import read_manifest, split_problem
from .records import CHECKSUM as RECORD_CHECKSUM
from .records import damaged_records, read_index, record_checksum
from .validate import DataError, scan_classes

__all__ = ["pack_recordio", "escape_name", "unescape_name", "CONTENTS"]

LOG = logging.getLogger("mxfp16.data")
#: The file that marks a pack complete, written last.
_MARKER = "_classes.json"
#: A pack's files, by what follows the prefix in their names (mxfp16.data.pipelines reads them by these names).
CONTENTS = Contents("a pack", tuple(f"_{split}.{ext}" for split in ("train", "test") for ext in ("rec", "idx", "lst"))
                    + (_MARKER,))


def escape_name(name):
    """A file name as one line of text: ``%XX`` for ``%``, control characters and bytes that are not UTF-8.

    Every other character stays, so ordinary names read as they are; :func:`unescape_name` gives the bytes back.
    """
    out = []
    for ch in os.fsencode(name).decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, kept by surrogateescape
            out.append(f"%{code - 0xDC00:02X}")
        elif code < 0x20 or code == 0x7F or ch == "%":
            out.append(f"%{code:02X}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_name(text):
    """The file name :func:`escape_name` wrote (as ``str``, undecodable bytes as surrogates)."""
    return os.fsdecode(urllib.parse.unquote_to_bytes(text))


def _encode_image(path, resize=0, quality=95):
    """JPEG bytes of ``path`` as 3-channel colour, its short side resized to ``resize`` (0 keeps the size), or ``None``.

    Read by Python and decoded from memory, so any bytes in its name work (``cv2.imread`` takes the name as UTF-8).
    """
    try:
        data = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
    except OSError:
        return None
    img = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if img is None:
        return None
    if resize:
        h, w = img.shape[:2]
        scale = resize / min(h, w)
        img = cv2.resize(img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    return buf.tobytes() if ok else None


def _write_split(output, items, classes, root, split, resize, quality, workers):
    """Write one split's ``.rec``, ``.idx`` and ``.lst`` as staged files of ``output``, checked record by record.

    Returns the records written, the files skipped, the count per class and
    ``{end of the name: staged file}``.
    """
    rec_name, idx_name, lst_name = f"_{split}.rec", f"_{split}.idx", f"_{split}.lst"
    tmp = {name: output.stage(name) for name in (rec_name, idx_name, lst_name)}
    index = {name: i for i, name in enumerate(classes)}
    skipped, written, per_class = [], 0, {}
    jobs = ([path for path, _ in items], [resize] * len(items), [quality] * len(items))
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        encoded = pool.map(_encode_image, *jobs, chunksize=16) if pool else map(_encode_image, *jobs)
        record = mx.recordio.MXIndexedRecordIO(str(tmp[idx_name]), str(tmp[rec_name]), "w")
        with open(tmp[lst_name], "w", encoding="utf-8") as lst:
            for (path, name), jpeg in zip(items, encoded):
                if jpeg is None:
                    skipped.append((path, "OpenCV cannot decode it"))
                    LOG.warning("skipping %s: OpenCV cannot decode it", shown(path))
                    continue
                label = index[name]
                # id2, which ImageRecordIter never reads, holds the record's checksum (mxfp16.data.records).
                header = mx.recordio.IRHeader(0, float(label), written, record_checksum(label, written, jpeg))
                try:
                    record.write_idx(written, mx.recordio.pack(header, jpeg))
                except mx.base.MXNetError:  # a full disk, or ulimit -f: MXNet names neither
                    raise failed_write(tmp[rec_name]) from None
                lst.write(f"{written}\t{label}\t{escape_name(os.path.relpath(path, root))}\n")
                per_class[name] = per_class.get(name, 0) + 1
                written += 1
        record.close()
        entries = read_index(tmp[idx_name])
        damaged = damaged_records(tmp[rec_name], tmp[idx_name], entries=entries, checksums=True)
        if damaged or len(entries) != written:
            what = "; ".join(f"record {key}: {why}" for key, _, why in damaged[:3]) or (
                f"{len(entries)} records indexed, {written} written")
            raise DataError(f"the {split} records just written for {shown(output.path)}{rec_name} do not check out "
                            f"({what}); nothing was replaced. Is the disk full or failing? Pack again")
    finally:
        if pool:
            pool.shutdown()
    return written, skipped, per_class, tmp


def pack_recordio(src, prefix, resize=0, quality=95, workers=1, overwrite=False):
    """Pack the folder split ``src`` into ``PREFIX_{train,test}.{rec,idx,lst}`` + ``PREFIX_classes.json``.

    Parameters
    ----------
    src : str or Path
        A folder with ``train/<class>/`` and ``test/<class>/``.
    prefix : str or Path
        Output prefix, e.g. ``data/caltech101-rec/caltech101``.
    resize : int
        Resize each image's short side to this many pixels before encoding
        (0: keep the size). Packing at about ``1.15 * image_size`` makes
        decoding cheaper.
    quality : int
        JPEG quality, 1-100.
    workers : int
        Processes that decode and encode.
    overwrite : bool
        Replace a pack already at ``prefix`` (all of its files).

    Returns
    -------
    dict
        The contents of ``PREFIX_classes.json``.

    Raises
    ------
    DataError
        Bad settings or source; a prefix inside ``src``, holding a pack
        (without ``overwrite``), or in use by another command (a pack, a
        ``train`` reading it), naming it.
    """
    src, prefix = Path(src), Path(prefix)
    if not 1 <= quality <= 100 or resize < 0:
        raise DataError(f"quality={quality}, resize={resize}: need 1 <= quality <= 100 and resize >= 0.")
    # The writing rule: the pack's files may not land in (or over) the folder it reads.
    output = Output(prefix, f"packing {src} into {prefix}", kind="prefix", overwrite=overwrite,
                    inputs=[("the source data set", src)], contents=CONTENTS)
    with refusals_as(DataError):
        output.check()  # before anything is read
        problem = split_problem(src, then="pack {split} (--src {split})")  # e.g. the raw Caltech-101 download
        if problem:
            raise DataError(problem)
        with output:
            return _pack(output, src, resize, quality, workers)


def _pack(output, src, resize, quality, workers):
    """:func:`pack_recordio` once the prefix is locked: both splits staged and checked, then published."""
    train = scan_classes(src / "train", "training split").require_every_class()
    test = scan_classes(src / "test", "test split")
    unknown = sorted(set(test.classes) - set(train.classes))
    if unknown:
        raise DataError(f"{src / 'test'} has classes that {src / 'train'} lacks: {', '.join(unknown[:10])}.")
    counts, skipped, per_class = {}, train.skipped + test.skipped, {name: [0, 0] for name in train.classes}
    staged = {}
    for column, (split, scan) in enumerate((("train", train), ("test", test))):
        counts[split], bad, written, files = _write_split(output, scan.items, train.classes, src, split, resize,
                                                          quality, workers)
        staged.update(files)
        skipped += bad
        for name, count in written.items():
            per_class[name][column] = count
    meta = {"classes": train.classes, "counts": counts, "per_class": per_class, "source": str(src), "resize": resize,
            "quality": quality, "skipped": [list(s) for s in skipped], "record_checksum": RECORD_CHECKSUM}
    hints = read_manifest(src) or {}  # the training hints of the source's manifest that it sets
    meta.update({k: hints[k] for k in ("min_crop_area", "augment") if hints.get(k) is not None})
    staged[_MARKER] = output.stage(_MARKER)
    write_json(staged[_MARKER], meta)
    output.publish_files(staged, last=_MARKER)
    return meta
