"""The model formats an export folder can hold: one module each, with a writer, its check and a reader.

A format module defines:

``NAME``
    What ``mxfp16 export --format`` and ``export.json``'s ``model_format`` call it.
``SUMMARY``
    One line for ``--help``.
``DEFAULT_PRECISION``
    The precision an export is made in when none is asked for.
``check_request(precision, dtypes)``
    Refuses, before any work, what the format cannot write: ``precision`` (``None``: ``DEFAULT_PRECISION``),
    model files in ``dtypes`` it does not hold, an exporter that is not installed. Raises
    :class:`~mxfp16.inference.bundle.ExportError`.
``write(folder, model, options)``
    Writes the model files of a :class:`~mxfp16.inference.convert.Deployable` into a staging folder, as
    :class:`WriteOptions` asks, and returns ``(files, section)``: the ``files`` table of ``export.json`` (the
    entries the bundle's checksum covers) and the format's own section, with ``load_with`` (how a user loads it).
    It needs MXNet.
``check(folder, files, section, inputs)``
    The agreement check of what ``write`` staged, loaded back the way a user loads it, against
    :class:`CheckInputs`. Returns ``export.json``'s ``agreement`` record; raises
    :class:`~mxfp16.inference.agreement.AgreementError` on a miss.
``seconds(writing, checking)``
    ``export.json``'s ``seconds`` from the time spent writing and checking.
``load(folder, info, ctx="auto", dtype=None)``
    The reader: a callable from a float32 NCHW numpy batch to float32 logits, with ``device`` and ``dtype``.
    It checks its files against ``info`` first and imports only what that format needs to run.

A later format is one new module here; :func:`get` finds it by name, and
:mod:`mxfp16.inference.export` calls it through these names only.
"""
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

from ..bundle import ExportError

__all__ = ["names", "get", "of", "DEFAULT", "WriteOptions", "CheckInputs"]

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


@dataclass(frozen=True)
class WriteOptions:
    """What every format's ``write`` is handed; each uses what applies to it.

    Attributes
    ----------
    input_shape : tuple of int
        One input without the batch axis, ``(3, H, W)``.
    dtypes : tuple of str
        The model files asked for, by dtype (``check_request`` has accepted them).
    """

    input_shape: Tuple[int, int, int]
    dtypes: Tuple[str, ...]


@dataclass(frozen=True)
class CheckInputs:
    """What a format's agreement check compares its staged files with: the float32 network on the test split.

    Attributes
    ----------
    reference : gluon.HybridBlock
        The run's network in float32, with the checkpoint's weights.
    net : gluon.HybridBlock
        The network the export was converted from, in its parameter dtype (``reference`` for float32 ones).
    precision : mxfp16.Precision
        The precision the export was converted to.
    image_size : int
    classes : list of str
        In logit order.
    loaders : mxfp16.data.Loaders
        Whose ``test_batches()`` the check runs on.
    data : str
        The data set those come from, for the log.
    device : mx.Context
    margin : float
        Percentage points of top-1 the export may lose against float32.
    log : callable
        Receives progress lines.
    """

    reference: Any
    net: Any
    precision: Any
    image_size: int
    classes: List[str]
    loaders: Any
    data: str
    device: Any
    margin: float
    log: Callable[[str], None]
