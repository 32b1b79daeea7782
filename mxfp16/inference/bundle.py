"""An export folder on disk: the model files of its format and ``export.json``, with their checksums.

::

    DIR/model-symbol.json   the graph (MXNet JSON, amp_cast nodes kept)       } the MXNet format
    DIR/model-0000.params   the parameters (arg:/aux: names, as HybridBlock.export writes them)
    DIR/model.onnx          float32, opset 13 (and model-float16.onnx)        } the ONNX format
    DIR/export.json         what a user of the model needs to know: format, classes, image size,
                            preprocessing, precision, source run, agreement check, and the
                            sha256 and size of every model file (its ``files`` table)

Each format's writer and reader live in :mod:`mxfp16.inference.formats`;
every model file they write is listed in ``files`` and checked against it
before use (:func:`read_model`, :func:`read_verified`).

The MXNet format's two files are what ``HybridBlock.export(DIR/model)`` would write,
so plain MXNet loads them with ``gluon.SymbolBlock.imports``. An export is
written into a staging folder beside ``DIR`` and moved into place only when
it is complete and checked (:func:`staging`, :func:`publish`), so a refused
export leaves nothing behind. A new ``DIR`` is renamed into place whole;
over an existing one (``--overwrite``) only the export's own files are
replaced, ``export.json`` last, and anything else in ``DIR`` stays: the
command never deletes a file it did not write.
"""
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from ..fileio import JSONFileError, atomic_path, default_mode, read_json, sha256_file, write_json
from ..ndarray_file import NDArrayFileError, read_header

__all__ = ["SYMBOL_FILE", "PARAMS_FILE", "INFO_FILE", "FORMAT", "VERSION", "LOAD_WITH", "ExportError", "write_model",
           "write_info", "read_info", "read_model", "file_entry", "read_verified", "staging", "publish"]

SYMBOL_FILE = "model-symbol.json"
PARAMS_FILE = "model-0000.params"
INFO_FILE = "export.json"
#: How plain MXNet loads the MXNet format's two files.
LOAD_WITH = "mxnet.gluon.SymbolBlock.imports('model-symbol.json', ['data'], 'model-0000.params')"
FORMAT = "mxfp16-export"
VERSION = 1


class ExportError(RuntimeError):
    """An export that cannot be written or read; the message names the file and the fix."""


def write_model(folder, deployable):
    """Write the graph and the parameters of a :class:`~mxfp16.inference.convert.Deployable` atomically.

    Returns
    -------
    dict
        ``{file name: {"sha256": hex, "bytes": int}}`` of the two files.
    """
    import mxnet as mx

    folder = Path(folder)
    with atomic_path(folder / SYMBOL_FILE) as tmp:
        # MXNet's save drops amp_cast nodes unless told not to; an AMP graph without them does
        # not even load (a bfloat16 weight beside a float32 input).
        deployable.symbol.save(tmp, remove_amp_cast=False)
    with atomic_path(folder / PARAMS_FILE) as tmp:
        mx.nd.save(tmp, deployable.params)
    return {name: file_entry(folder / name) for name in (SYMBOL_FILE, PARAMS_FILE)}


def file_entry(path):
    """The ``files`` entry of ``export.json`` for one written model file: ``{"sha256", "bytes"}``."""
    return {"sha256": sha256_file(path), "bytes": Path(path).stat().st_size}


def read_verified(folder, info, name):
    """The bytes of model file ``name``, checked against its entry in ``export.json`` before anyone uses them.

    The bytes returned are the bytes hashed, so what runs is what was checked
    (no second read of a file that could change in between).

    Raises
    ------
    ExportError
        The file is not listed, missing, not a regular file inside ``folder``, or its sha256 differs.
    """
    import hashlib

    folder = Path(folder)
    entry = info.get("files", {}).get(name)
    wanted = entry.get("sha256") if isinstance(entry, dict) else None
    if wanted is None:
        raise ExportError(f"{folder / INFO_FILE} lists no {name}; the export is incomplete. Export the run again")
    path = folder / name
    if path.is_symlink() or not path.is_file():
        raise ExportError(f"{path} is missing or not a regular file; the export is incomplete or was changed. "
                          "Export the run again")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != wanted:
        raise ExportError(f"{path} has changed since it was exported (its sha256 differs from the one in "
                          f"{folder / INFO_FILE}); export the run again rather than trust it")
    return data


def write_info(folder, info):
    """Write ``export.json`` (atomically)."""
    write_json(Path(folder) / INFO_FILE, info)


def read_info(folder):
    """``export.json`` of an export folder, checked for format and version.

    Raises
    ------
    ExportError
        Not an export folder, unreadable JSON, or another format or version.
    """
    path = Path(folder) / INFO_FILE
    if not path.is_file():
        raise ExportError(f"{folder} is not an mxfp16 export ({path} not found); make one with "
                          "`mxfp16 export --run RUN --out DIR`")
    try:
        info = read_json(path, "export the run again", fields={
            "format": str, "version": int, "files": dict, "classes": list, "image_size": int, "precision": str,
            "compute_dtype": str, "preprocess": dict})
    except JSONFileError as err:
        raise ExportError(str(err)) from None
    if info.get("format") != FORMAT or info.get("version") != VERSION:
        raise ExportError(f"{path} is format {info.get('format')!r} version {info.get('version')!r}; this mxfp16 "
                          f"reads {FORMAT!r} version {VERSION}. Export the run again with this mxfp16")
    return info


def read_model(folder, info):
    """The graph and parameters of an export folder, after checking both files against ``export.json``.

    Returns
    -------
    (mx.sym.Symbol, dict)

    Raises
    ------
    ExportError
        A file is missing, or its sha256 differs from the one recorded (changed or damaged since export).
    """
    import mxnet as mx

    folder = Path(folder)
    for name in (SYMBOL_FILE, PARAMS_FILE):
        path = folder / name
        if not path.is_file():
            raise ExportError(f"{path} is missing; the export is incomplete. Export the run again")
        entry = info.get("files", {}).get(name)
        wanted = entry.get("sha256") if isinstance(entry, dict) else None
        if sha256_file(path) != wanted:
            raise ExportError(f"{path} has changed since it was exported (its sha256 differs from the one in "
                              f"{folder / INFO_FILE}); export the run again rather than trust it")
    try:
        read_header(folder / PARAMS_FILE)  # before MXNet allocates what it declares
    except NDArrayFileError as err:
        raise ExportError(f"{err}; export the run again") from None
    return mx.sym.load(str(folder / SYMBOL_FILE)), mx.nd.load(str(folder / PARAMS_FILE))


@contextlib.contextmanager
def staging(out, overwrite=False):
    """A fresh folder beside ``out`` to write an export into; removed on any error.

    Raises
    ------
    ExportError
        ``out`` exists and ``overwrite`` is off, or ``out`` is a file.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder; choose another --out")
    if out.exists() and not overwrite:
        raise ExportError(f"--out {out} already exists; replace it with --overwrite or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=out.parent))
    os.chmod(folder, default_mode(folder=True))  # mkdtemp makes it private; the export is an ordinary folder
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(folder, out):
    """Move a complete staged export to ``out``.

    A new ``out`` is the staged folder renamed into place. Into an existing
    one only the export's own files go (those of any format, listed in the
    staged ``export.json``), each renamed over its old version (atomic per
    file), ``export.json`` last: until it is replaced, the old
    ``export.json`` lists other checksums, so a reader that catches the
    folder mid-way refuses it rather than trusting a mixture. Nothing else
    in ``out`` is touched.
    """
    out = Path(out)
    if not out.exists():
        os.replace(folder, out)
        return
    for name in read_json(Path(folder) / INFO_FILE)["files"]:
        os.replace(Path(folder) / name, out / name)
    os.replace(Path(folder) / INFO_FILE, out / INFO_FILE)
