"""``mxfp16 predict``: the top classes of image files, from an export folder of any format.

Images go through the evaluation view of training, computed in numpy by
:mod:`mxfp16.inference.preprocess`, so an ONNX export predicts with
onnxruntime alone and never loads MXNet. A file that fails the scan
(:func:`mxfp16.data.scan_image`) or the decoder is reported and skipped,
never fatal. Names in the outputs stay one line each and give their bytes
back; ``docs/inference.md`` ("Predicting") gives the escapes and why.
"""
import csv
import errno
import io
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.validate import scan_image
from ..plumbing.output import error_line
from . import formats, preprocess
from .agreement import softmax
from .bundle import ExportError, read_info

__all__ = ["Predictor", "Prediction", "image_files", "to_csv", "to_document", "escape_text", "unescape_text",
           "csv_cell"]


#: The short escapes of :func:`escape_text`.
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Characters that print nothing or break a line: control, format (bidirectional overrides), line and paragraph.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp")
_ESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8})|(.))", re.S)
#: What a spreadsheet takes for the start of a formula (an escaped name never starts with a tab or a carriage
#: return), and the quote itself, so that one leading quote is always ours.
_FORMULA = ("=", "+", "-", "@", "\t", "\r", "'")


def escape_text(text):
    r"""``text`` as one line of printable text from which :func:`unescape_text` gives it back.

    The backslash escapes are the table of ``docs/inference.md`` ("Predicting"); a byte of a file name that is
    not UTF-8 (a lone surrogate, ``surrogateescape``) is ``\xNN``. Every other character, in any script, stays.
    """
    out = []
    for ch in os.fspath(text):
        code = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80 and unicodedata.category(ch) == "Cc":
            out.append(f"\\x{code:02x}")
        elif unicodedata.category(ch) in _HIDDEN or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_text(text):
    """The text :func:`escape_text` was given (a file name's undecodable bytes as surrogates: ``os.fsencode``
    gives the bytes)."""
    def one(match):
        byte, short, long, other = match.groups()
        if byte is not None:
            code = int(byte, 16)
            return chr(code + 0xDC00 if code >= 0x80 else code)
        if short or long:
            return chr(int(short or long, 16))
        return {"n": "\n", "r": "\r", "t": "\t"}.get(other, other)
    return _ESCAPE.sub(one, text)


def csv_cell(text):
    """``text`` escaped (:func:`escape_text`) for a CSV cell, with ``'`` before what a spreadsheet would run (drop
    a leading ``'``, then :func:`unescape_text` gives the name)."""
    text = escape_text(text)
    return "'" + text if text.startswith(_FORMULA) else text


@dataclass
class Prediction:
    """The top classes of one image.

    Attributes
    ----------
    path : str
    top : list of (str, int, float)
        ``(class name, class index, probability)``, most likely first.
    """

    path: str
    top: list


def image_files(inputs):
    """The files named by ``inputs``, folders walked recursively (sorted, hidden entries left out).

    Returns
    -------
    (list of str, list of (str, str))
        The files, and ``(path, reason)`` of inputs that name nothing.
    """
    files, missing = [], []
    for item in map(Path, inputs):
        try:
            info = os.lstat(item)
        except OSError as err:  # missing, or in a folder this user may not enter
            missing.append((str(item), "no such file or folder" if err.errno == errno.ENOENT else
                            f"cannot be read ({err.strerror}): give this user access to it and its folders"))
            continue
        if stat.S_ISDIR(info.st_mode) or (stat.S_ISLNK(info.st_mode) and os.path.isdir(item)):
            for root, dirs, names in os.walk(item, onerror=lambda err: missing.append(
                    (err.filename, f"cannot be read ({err.strerror}): give this user access to it"))):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        else:
            files.append(str(item))  # scan_image says what is wrong with anything that is not an image
    return files, missing


class Predictor:
    """An export folder loaded for prediction (its files checked against ``export.json`` first).

    Parameters
    ----------
    folder : str or Path
        Written by ``mxfp16 export``, in any format.
    ctx : str
        ``'auto'``, ``'cpu'`` or ``'gpu:N'`` (one device).
    dtype : str, optional
        Which model of an ONNX export runs: ``'float32'`` (the default) or
        ``'float16'`` when it was exported.

    Attributes
    ----------
    model : callable
        The format's loaded model (``model.device``, ``model.dtype``).

    Raises
    ------
    ExportError
        Not an export, changed files, a dtype the export lacks, or a float16 MXNet export on a CPU.
    """

    def __init__(self, folder, ctx="auto", dtype=None):
        self.folder = Path(folder)
        self.info = read_info(folder)
        reader = formats.of(self.info)
        self.format = reader.NAME
        self.model = reader.load(folder, self.info, ctx=ctx, dtype=dtype)
        self.classes = list(self.info["classes"])
        pre = self.info["preprocess"]
        self._size, self._short = int(pre["center_crop"]), int(pre["resize_short"])
        self._mean, self._std = tuple(pre["mean_rgb"]), tuple(pre["std_rgb"])

    def __repr__(self):
        return (f"Predictor({str(self.folder)!r}, {self.format} {self.info['precision']}, {self.model.dtype} on "
                f"{self.model.device})")

    @property
    def description(self):
        """What runs, for a summary line: ``'amp-bfloat16 (mxnet)'``, ``'float16 (onnx)'``."""
        return f"{self.model.dtype if self.format == 'onnx' else self.info['precision']} ({self.format})"

    def view(self, image):
        """The uint8 HWC crop the model sees of a decoded RGB image (:func:`mxfp16.inference.preprocess.decode`)."""
        return preprocess.center_view(image, self._size, self._short)

    def probabilities(self, views):
        """Class probabilities of a list of :meth:`view` crops, as a float64 array ``(N, classes)``.

        Raises
        ------
        ExportError
            The model gave another number of scores than ``export.json`` lists classes.
        """
        scores = self.model(preprocess.to_batch(views, self._mean, self._std))
        if np.ndim(scores) != 2 or np.shape(scores) != (len(views), len(self.classes)):
            raise ExportError(f"{self.folder}: the model gave scores of shape {tuple(np.shape(scores))} for "
                              f"{len(views)} image(s), and export.json lists {len(self.classes)} classes; the labels "
                              "would not be the model's. Export the run again")
        return softmax(scores)

    def predict_files(self, files, top_k=5, batch_size=32, progress=None):
        """Top-``top_k`` classes of every image among ``files``.

        Parameters
        ----------
        files : sequence of str or Path
            Files, not folders (:func:`image_files` expands those).
        top_k : int
            At most the number of classes.
        batch_size : int
        progress : callable, optional
            Called with the number of files handled after each one (a progress bar's ``update``).

        Returns
        -------
        (list of Prediction, list of (str, str))
            Predictions in input order, and ``(path, reason)`` of every file skipped.
        """
        if top_k < 1 or batch_size < 1:
            raise ValueError(f"top_k={top_k}, batch_size={batch_size}: both must be at least 1")
        top_k = min(top_k, len(self.classes))
        results, skipped, paths, views = [], [], [], []

        def flush():
            if views:
                for path, probs in zip(paths, self.probabilities(views)):
                    order = np.argsort(-probs, kind="stable")[:top_k]
                    results.append(Prediction(path, [(self.classes[i], int(i), float(probs[i])) for i in order]))
                paths.clear()
                views.clear()

        for path in map(str, files):
            reason = scan_image(path)
            if reason is None:
                try:
                    views.append(self.view(preprocess.decode(path)))
                    paths.append(path)
                except (preprocess.DecodeError, OSError) as err:  # passed the scan, but reading or decoding failed
                    reason = f"cannot decode: {error_line(err)[:200]}"
            if reason is not None:
                skipped.append((path, reason))
            if len(views) == batch_size:
                flush()
            if progress is not None:
                progress(1)
        flush()
        return results, skipped


def to_document(predictor, results, skipped):
    """The ``--output FILE.json`` content: the model, each image's top classes, the skipped files."""
    return {
        "model": str(predictor.folder.resolve()),
        "precision": predictor.info["precision"],
        "model_format": predictor.format,
        "dtype": predictor.model.dtype,
        "predictions": [{"path": r.path, "top": [{"class": c, "index": i, "probability": p} for c, i, p in r.top]}
                        for r in results],
        "skipped": [{"path": path, "reason": reason} for path, reason in skipped],
    }


def to_csv(results, skipped, top_k):
    """The ``--output FILE.csv`` content: one row per image, ``class_1, probability_1, ...``, then ``error``.

    A skipped file has a row with only its path and the reason. Every text cell is a :func:`csv_cell`.
    """
    buffer = io.StringIO()
    fields = ["path"] + [f"{name}_{rank}" for rank in range(1, top_k + 1) for name in ("class", "probability")]
    writer = csv.DictWriter(buffer, fieldnames=fields + ["error"], lineterminator="\n")
    writer.writeheader()
    for r in results:
        row = {"path": csv_cell(r.path), "error": ""}
        for rank, (name, _, prob) in enumerate(r.top, 1):
            row.update({f"class_{rank}": csv_cell(name), f"probability_{rank}": f"{prob:.6f}"})
        writer.writerow(row)
    for path, reason in skipped:
        writer.writerow({"path": csv_cell(path), "error": csv_cell(reason)})
    return buffer.getvalue()
