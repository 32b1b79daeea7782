"""An export folder on disk: the model files of its format, ``export.json`` and the checksums of all of them.

``docs/inference.md`` describes the files ("What an export is"), how an
export is published and what a reader refuses. Each format's writer and
reader live in :mod:`mxfp16.inference.formats`; this module holds what they
share. Reading an export trusts nothing in it, and no message prints a
file's content.
"""
import hashlib
import math
import os
import re
import stat
from pathlib import Path

from ..plumbing.fileio import JSONFileError, parse_json, sha256_file, write_json
from ..plumbing.limits import MAX_IMAGE_SIDE
from ..plumbing.ndarray_file import NDArrayFileError, read_header
from ..plumbing.output import Contents, atomic_path, atomic_write, failed_write, shown
from ..plumbing.symbol_file import GraphFileError, check_graph

__all__ = ["SYMBOL_FILE", "PARAMS_FILE", "INFO_FILE", "CHECKSUM_FILE", "FILES", "REQUIRED", "FORMAT", "VERSION",
           "LOAD_WITH", "ExportError", "write_model", "write_info", "seal", "verify", "check_info", "read_info",
           "read_model", "read_verified", "file_entry", "export_file", "CONTENTS", "AGAIN"]

SYMBOL_FILE = "model-symbol.json"
PARAMS_FILE = "model-0000.params"
INFO_FILE = "export.json"
CHECKSUM_FILE = "SHA256SUMS"
#: Every file an export may hold and what it is. ``SHA256SUMS`` covers each one present; a new format is one entry.
FILES = {
    SYMBOL_FILE: "the graph (MXNet JSON)",
    PARAMS_FILE: "the parameters (MXNet's NDArray format)",
    "model.onnx": "the float32 graph and weights (ONNX, opset 13)",
    "model-float16.onnx": "the float16 graph and weights, float32 in and out (ONNX, opset 13)",
    INFO_FILE: "what the model needs to be used: classes, image size, preprocessing, precision, source",
}
#: Everything an export folder holds: what ``--overwrite`` replaces, and all it may replace.
CONTENTS = Contents("an export", (*FILES, CHECKSUM_FILE))
#: The file every export holds; the model files it lists in its ``files`` table are required too.
REQUIRED = (INFO_FILE,)
#: How plain MXNet loads the MXNet format's two files.
LOAD_WITH = "mxnet.gluon.SymbolBlock.imports('model-symbol.json', ['data'], 'model-0000.params')"
FORMAT = "mxfp16-export"
VERSION = 2
#: The largest ``export.json`` or ``SHA256SUMS`` read.
_MAX_RECORD_BYTES = 1 << 20
_CHECKSUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](\S.*)$")
#: What every refusal of a changed export asks for.
AGAIN = "export the run again rather than trust it"


class ExportError(RuntimeError):
    """An export that cannot be written or read; the message names the file and the fix."""


# ---- writing ---------------------------------------------------------------------------------------
def write_model(folder, deployable):
    """Write the graph and the parameters of a :class:`~mxfp16.inference.convert.Deployable` atomically.

    Returns ``{file name: {"sha256": hex, "bytes": int}}`` of the two files, for ``export.json``
    (``SHA256SUMS``, written last by :func:`seal`, is what a reader checks).
    """
    import mxnet as mx

    folder = Path(folder)
    with atomic_path(folder / SYMBOL_FILE) as tmp:
        # MXNet's save drops amp_cast nodes unless told not to; an AMP graph without them does
        # not even load (a bfloat16 weight beside a float32 input).
        deployable.symbol.save(tmp, remove_amp_cast=False)
    with atomic_path(folder / PARAMS_FILE) as tmp:
        try:
            mx.nd.save(tmp, deployable.params)
        except mx.base.MXNetError:  # a full disk, or ulimit -f: MXNet names neither
            raise failed_write(folder / PARAMS_FILE) from None
    return {name: file_entry(folder / name) for name in (SYMBOL_FILE, PARAMS_FILE)}


def file_entry(path):
    """The ``files`` entry of ``export.json`` for one written model file: ``{"sha256", "bytes"}``."""
    return {"sha256": sha256_file(path), "bytes": Path(path).stat().st_size}


def write_info(folder, info):
    """Write ``export.json`` (atomically)."""
    write_json(Path(folder) / INFO_FILE, info)


def seal(folder):
    """Write ``SHA256SUMS``: the sha256 of every file of :data:`FILES` in ``folder``, in ``sha256sum``'s format.

    The last step of writing an export; call it again after changing any of its files on purpose. Returns
    ``{file name: sha256}``.
    """
    folder = Path(folder)
    sums = {name: sha256_file(export_file(folder, name)) for name in FILES if os.path.lexists(folder / name)}
    with atomic_write(folder / CHECKSUM_FILE) as handle:
        handle.write("".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items())))
    return sums


# ---- reading ---------------------------------------------------------------------------------------
def export_file(folder, name):
    """``folder / name`` when it is a regular file inside ``folder``; else :class:`ExportError`.

    A symbolic link may lead to another file of the folder, never out of it (a graph that links to
    ``/etc/passwd`` is refused, and nothing of that file is read).
    """
    folder, path = Path(folder), Path(folder) / name
    if not os.path.lexists(path):
        raise ExportError(f"{shown(path)} is missing; the export is incomplete. Export the run again")
    target = Path(os.path.realpath(path))
    if Path(os.path.realpath(folder)) not in target.parents:
        raise ExportError(f"{shown(path)} is a link to {shown(target)}, outside the export folder; an export's files "
                          f"are its own: {AGAIN}")
    try:
        mode = target.stat().st_mode
    except OSError as err:
        raise ExportError(f"{shown(path)} cannot be read ({err.strerror}); {AGAIN}") from None
    if not stat.S_ISREG(mode):
        raise ExportError(f"{shown(path)} is not a regular file; {AGAIN}")
    return path


def _read_text(path, what):
    with open(path, "rb") as handle:
        raw = handle.read(_MAX_RECORD_BYTES + 1)
    if len(raw) > _MAX_RECORD_BYTES:
        raise ExportError(f"{shown(path)} is larger than {what} ever is; {AGAIN}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ExportError(f"{shown(path)} is not UTF-8 text; {AGAIN}") from None


def verify(folder):
    """Check every file ``SHA256SUMS`` lists against its sha256: ``{file name: sha256}``.

    ``export.json`` must be listed (and :func:`read_info` then requires every model file it names).

    Raises
    ------
    ExportError
        No ``SHA256SUMS`` (not an export, or one written before it existed),
        a line it should not hold, a file missing, a link out of the folder,
        or a file whose sha256 differs.
    """
    folder = Path(folder)
    if not os.path.lexists(folder / CHECKSUM_FILE):
        if os.path.lexists(folder / INFO_FILE):
            raise ExportError(f"{shown(folder)} has no {CHECKSUM_FILE}: it was exported by an older mxfp16, or is "
                              "incomplete. Export the run again with this mxfp16")
        raise ExportError(f"{shown(folder)} is not an mxfp16 export ({shown(folder / INFO_FILE)} not found); make "
                          "one with `mxfp16 export --run RUN --out DIR`")
    text = _read_text(export_file(folder, CHECKSUM_FILE), "a checksum list")
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _CHECKSUM_LINE.match(line)
        if not match or match.group(2) not in FILES:
            raise ExportError(f"{shown(folder / CHECKSUM_FILE)} line {number} is not '<sha256>  <file of the export>'; "
                              f"{AGAIN}")
        sums[match.group(2)] = match.group(1)
    missing = [name for name in REQUIRED if name not in sums]
    if missing:
        raise ExportError(f"{shown(folder / CHECKSUM_FILE)} does not list {', '.join(missing)}; {AGAIN}")
    for name, digest in sums.items():
        if sha256_file(export_file(folder, name)) != digest:
            raise ExportError(f"{shown(folder / name)} has changed since it was exported (its sha256 differs from "
                              f"the one in {CHECKSUM_FILE}); {AGAIN}")
    return sums


def _numbers(value, count, low, high, low_open=False):
    return (isinstance(value, list) and len(value) == count and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        and (low < v if low_open else low <= v) and v <= high for v in value))


def check_info(info, where=INFO_FILE):
    """Refuse an ``export.json`` whose values no export holds: sizes, preprocessing, classes out of range.

    Raises
    ------
    ExportError
        Naming the field, its range and the fix (never a file's content beyond the field's value).
    """
    pre, size = info["preprocess"], info["image_size"]
    problems = []
    if not 8 <= size <= MAX_IMAGE_SIDE:
        problems.append(f"image_size {size} is outside 8..{MAX_IMAGE_SIDE}")
    crop, short = pre.get("center_crop"), pre.get("resize_short")
    if not (isinstance(crop, int) and not isinstance(crop, bool) and crop == size):
        problems.append(f"preprocess.center_crop {str(crop)[:20]} is not the image_size {size}")
    if not (isinstance(short, int) and not isinstance(short, bool) and size <= short <= 2 * MAX_IMAGE_SIDE):
        problems.append(f"preprocess.resize_short {str(short)[:20]} is not between the image_size and "
                        f"{2 * MAX_IMAGE_SIDE}")
    if not _numbers(pre.get("mean_rgb"), 3, 0.0, 1.0):
        problems.append("preprocess.mean_rgb is not three numbers in 0..1")
    if not _numbers(pre.get("std_rgb"), 3, 0.001, 1.0):
        problems.append("preprocess.std_rgb is not three numbers in 0.001..1 (a standard deviation of 0 makes "
                        "every image the same)")
    classes = info["classes"]
    if not classes or not all(isinstance(c, str) and c for c in classes) or len(set(classes)) != len(classes):
        problems.append("classes is not a list of distinct names")
    if info["compute_dtype"] not in ("float32", "float16", "bfloat16"):
        problems.append(f"compute_dtype {info['compute_dtype'][:20]!r} is not float32, float16 or bfloat16")
    if problems:
        raise ExportError(f"{where}: {'; '.join(problems)}. It was changed after mxfp16 export wrote it; {AGAIN}")
    return info


def read_info(folder):
    """``export.json`` of an export folder, after every file was checked against ``SHA256SUMS``.

    Raises
    ------
    ExportError
        Not an export, a file changed or out of the folder (:func:`verify`),
        unreadable JSON, another format or version, or values out of range
        (:func:`check_info`).
    """
    folder = Path(folder)
    sums = verify(folder)
    path = folder / INFO_FILE
    try:
        info = parse_json(_read_text(path, "an export.json"), shown(path), "export the run again", fields={
            "format": str, "version": int, "files": dict, "classes": list, "image_size": int, "precision": str,
            "compute_dtype": str, "preprocess": dict})
    except JSONFileError as err:
        raise ExportError(str(err)) from None
    if info.get("format") != FORMAT or info.get("version") != VERSION:
        raise ExportError(f"{shown(path)} is format {str(info.get('format'))[:40]!r} version "
                          f"{str(info.get('version'))[:10]}; this mxfp16 reads {FORMAT!r} version {VERSION}. Export "
                          "the run again with this mxfp16")
    unlisted = [str(name)[:80] for name in info["files"] if name not in sums]
    if unlisted:  # a model file export.json promises but SHA256SUMS does not cover (or that is gone)
        raise ExportError(f"{shown(folder / CHECKSUM_FILE)} does not list {', '.join(unlisted)}; {AGAIN}")
    return check_info(info, shown(path))


def read_verified(folder, info, name):
    """The bytes of model file ``name``, checked against its sha256 in ``export.json`` as they are handed over.

    ``info`` comes from :func:`read_info`; the bytes returned are the bytes hashed here, so what runs is what was
    checked, however the file changes after this call.

    Raises
    ------
    ExportError
        The file is not listed, missing, not a regular file of the folder, or its sha256 differs.
    """
    folder = Path(folder)
    entry = info.get("files", {}).get(name)
    wanted = entry.get("sha256") if isinstance(entry, dict) else None
    if wanted is None:
        raise ExportError(f"{shown(folder / INFO_FILE)} lists no {name}; the export is incomplete. Export the run "
                          "again")
    data = export_file(folder, name).read_bytes()
    if hashlib.sha256(data).hexdigest() != wanted:
        raise ExportError(f"{shown(folder / name)} has changed since it was exported (its sha256 differs from the "
                          f"one in {INFO_FILE}); {AGAIN}")
    return data


def read_model(folder, info=None):
    """The graph and parameters of an export folder, checked against each other before MXNet loads them.

    :func:`read_info` checks the checksums; this checks what they cannot:
    the graph's structure and size (:func:`mxfp16.plumbing.symbol_file.check_graph`),
    the parameters' names and shapes against the graph's, and, given
    ``info``, one output per class of ``info["classes"]``.

    Returns
    -------
    (mx.sym.Symbol, dict)

    Raises
    ------
    ExportError
    """
    import mxnet as mx

    folder = Path(folder)
    symbol_path, params_path = export_file(folder, SYMBOL_FILE), export_file(folder, PARAMS_FILE)
    try:
        check_graph(symbol_path, AGAIN)
        declared = read_header(params_path)  # before MXNet allocates what it declares
    except (GraphFileError, NDArrayFileError) as err:
        raise ExportError(str(err)) from None
    try:
        symbol = mx.sym.load(str(symbol_path))
        arguments, auxiliary = symbol.list_arguments(), symbol.list_auxiliary_states()
        shapes = outputs = aux = None
        if info is not None:
            size = int(info["image_size"])
            shapes, outputs, aux = symbol.infer_shape(data=(1, 3, size, size))
    except mx.base.MXNetError:  # its message may quote the file: say what failed, not what MXNet read
        raise ExportError(f"{shown(symbol_path)} is not a graph MXNet can run (it could not be loaded, or its shapes "
                          f"not inferred); {AGAIN}") from None
    expected = {f"arg:{n}": s for n, s in zip(arguments, shapes or [None] * len(arguments)) if n != "data"}
    expected.update({f"aux:{n}": s for n, s in zip(auxiliary, aux or [None] * len(auxiliary))})
    _check_parameters(params_path, {name or "(unnamed)": tuple(shape) for name, shape, _ in declared}, expected)
    if info is not None:
        classes = len(info["classes"])
        if len(outputs) != 1 or tuple(outputs[0]) != (1, classes):
            raise ExportError(f"{shown(folder / INFO_FILE)} lists {classes} classes but the model in {SYMBOL_FILE} "
                              f"gives {outputs[0][-1] if outputs and outputs[0] else '?'} outputs per image; the "
                              f"labels would not be the model's. {AGAIN[0].upper()}{AGAIN[1:]}")
    try:
        return symbol, mx.nd.load(str(params_path))
    except mx.base.MXNetError:
        raise ExportError(f"{shown(params_path)} could not be loaded by MXNet; {AGAIN}") from None


def _check_parameters(path, declared, expected):
    """Refuse parameters whose names or shapes are not the graph's (another model's ``.params``)."""
    missing = sorted(set(expected) - set(declared))
    extra = sorted(set(declared) - set(expected))
    wrong = sorted(n for n in set(expected) & set(declared)
                   if expected[n] is not None and tuple(expected[n]) != declared[n])
    if not (missing or extra or wrong):
        return
    parts = ([f"{len(missing)} parameter(s) of the graph missing, e.g. {missing[0][:80]}"] if missing else []) + (
        [f"{len(extra)} not in the graph, e.g. {extra[0][:80]}"] if extra else []) + (
        [f"{len(wrong)} of another shape, e.g. {wrong[0][:80]} {declared[wrong[0]]} where {tuple(expected[wrong[0]])} "
         "belongs"] if wrong else [])
    raise ExportError(f"{shown(path)} does not fit the graph in {SYMBOL_FILE} ({'; '.join(parts)}): the parameters "
                      f"belong to another model; {AGAIN}")
