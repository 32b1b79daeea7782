"""The model formats an export folder can hold: one module each, with a writer and a reader.

A format module defines:

``NAME``
    What ``mxfp16 export --format`` and ``export.json``'s ``model_format`` call it
    (the module's own name).
``SUMMARY``
    One line for ``--help``.
``write(folder, model, **options)``
    Writes the model files of a :class:`~mxfp16.inference.convert.Deployable`
    (float32 graph and parameters, or one converted to a precision) into a
    staging folder and returns ``(files, section)``: the ``files`` table of
    ``export.json`` (``{name: {"sha256", "bytes", ...}}``, the entries the
    bundle's checksum covers) and what ``export.json`` records under the
    format's name. It needs MXNet.
``load(folder, info, ctx="auto", dtype=None)``
    The reader: the export's model ready to run, a callable from a float32
    NCHW numpy batch to float32 logits, with ``device`` (where it runs) and
    ``dtype`` (what it computes in). It checks its files against ``info``
    first and imports only what that format needs to run.

A later format is one new module here; :func:`get` finds it by name.
"""
import importlib
import pkgutil

from ..bundle import ExportError

__all__ = ["names", "get", "of", "DEFAULT"]

#: The format of an export whose ``export.json`` names none (written before formats existed).
DEFAULT = "mxnet"


def names():
    """The format names, sorted."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")))


def get(name):
    """The module of format ``name``.

    Raises
    ------
    ExportError
        No such format; the message lists the ones there are.
    """
    if name not in names():
        raise ExportError(f"unknown model format {name!r}; choose one of {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}")


def of(info):
    """The module of the format ``export.json`` (``info``) records."""
    name = info.get("model_format", DEFAULT)
    if not isinstance(name, str) or name not in names():
        raise ExportError(f"export.json names model format {name!r}, which this mxfp16 cannot read (it reads "
                          f"{', '.join(names())}); export the run again with this mxfp16")
    return get(name)
