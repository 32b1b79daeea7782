"""Reading the header of an MXNet NDArray file (``.params``) before MXNet allocates what it declares.

``mx.nd.load`` and ``Block.load_parameters`` allocate every array at the
shape the file declares before reading its bytes: a file that declares a
2^30 x 2^30 array (damaged, or made to do that) asks for 4 EiB and takes the
process down. :func:`read_header` walks the file's structure in Python
without allocating an array, and refuses one whose arrays need more bytes
than the file holds; :func:`check_shapes` compares the declared names and
shapes with the network's before ``load_parameters`` runs.

The layout, as MXNet 1.9.1 writes it (``NDArray::Save`` in
``src/ndarray/ndarray.cc``; dmlc streams are little-endian): a uint64 magic
``0x112`` and a reserved uint64; a uint64 count, then each array: a uint32
magic (``0xF993FAC9``, or ``0xF993FACA`` for numpy shapes), an int32 storage
type (0: dense), the shape (int32 ndim, int64 dimensions), the context
(two int32), an int32 dtype flag, and the raw data; then a uint64 count of
names, each a uint64 length and the UTF-8 bytes.
"""
import math
import os
import struct

from .output import shown

__all__ = ["NDArrayFileError", "read_header", "check_shapes", "DTYPE_BYTES"]

_LIST_MAGIC = 0x112
_ARRAY_MAGICS = (0xF993FAC9, 0xF993FACA)
#: mshadow type flags -> (name, bytes per element).
DTYPE_BYTES = {0: ("float32", 4), 1: ("float64", 8), 2: ("float16", 2), 3: ("uint8", 1), 4: ("int32", 4),
               5: ("int8", 1), 6: ("int64", 8), 7: ("bool", 1), 12: ("bfloat16", 2)}
_MAX_NDIM = 32
_MAX_NAME = 4096


class NDArrayFileError(ValueError):
    """A ``.params`` file whose structure is not what MXNet writes, or that does not fit the network."""


class _Reader:
    def __init__(self, handle, size, where):
        self.handle, self.size, self.where = handle, size, where

    def take(self, fmt):
        width = struct.calcsize(fmt)
        data = self.handle.read(width)
        if len(data) != width:
            raise NDArrayFileError(f"{self.where} ends in the middle of its header (truncated?)")
        return struct.unpack(fmt, data)

    def skip(self, count, what):
        left = self.size - self.handle.tell()
        if count > left:
            raise NDArrayFileError(f"{self.where} declares {what} of {count:,} bytes but only {left:,} bytes follow: "
                                   "it is damaged, or not a parameters file MXNet wrote")
        self.handle.seek(count, os.SEEK_CUR)

    def array(self, index):
        """Read array ``index``'s header and skip its data: ``(shape, dtype name)``."""
        array_magic, stype = self.take("<Ii")
        if array_magic not in _ARRAY_MAGICS:
            raise NDArrayFileError(f"{self.where}: array {index} has no array marker (0x{array_magic:08x}); the file "
                                   "is damaged or from an MXNet older than 1.0")
        if stype != 0:
            raise NDArrayFileError(f"{self.where}: array {index} is sparse; parameters mxfp16 loads are dense")
        (ndim,) = self.take("<i")
        if ndim < 0 or ndim > _MAX_NDIM:
            raise NDArrayFileError(f"{self.where}: array {index} declares {ndim} dimensions")
        shape = self.take(f"<{ndim}q") if ndim else ()
        if any(d < 0 for d in shape):
            raise NDArrayFileError(f"{self.where}: array {index} declares a negative dimension {shape}")
        if ndim == 0:  # an empty (none) array: no context, dtype or data follow
            return (), "none"
        self.take("<ii")  # context
        (flag,) = self.take("<i")
        if flag not in DTYPE_BYTES:
            raise NDArrayFileError(f"{self.where}: array {index} has an unknown dtype flag {flag}")
        name, width = DTYPE_BYTES[flag]
        self.skip(math.prod(shape) * width, f"array {index} of shape {tuple(shape)} ({name})")
        return tuple(shape), name

    def names(self, count):
        """The names of the ``count`` arrays, or ``None`` for each where the file has none (saved from a list)."""
        names = [None] * count
        if self.handle.tell() >= self.size:
            return names
        (name_count,) = self.take("<Q")
        if name_count not in (0, count):
            raise NDArrayFileError(f"{self.where} names {name_count} arrays but holds {count}")
        for index in range(name_count):
            (length,) = self.take("<Q")
            if length > _MAX_NAME:
                raise NDArrayFileError(f"{self.where}: name {index} is {length:,} bytes long")
            raw = self.handle.read(length)
            if len(raw) != length:
                raise NDArrayFileError(f"{self.where} ends in the middle of its names (truncated?)")
            names[index] = raw.decode("utf-8", "replace")
        return names


def read_header(path):
    """The arrays a ``.params`` file declares, read without allocating them.

    Returns
    -------
    list of (str or None, tuple, str)
        ``(name, shape, dtype)`` per array; names are ``None`` in a file
        saved from a list.

    Raises
    ------
    NDArrayFileError
        Not an NDArray file, a structure that does not parse, or arrays that
        need more bytes than the file holds.
    """
    where = shown(path)
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        reader = _Reader(handle, size, where)
        magic, _ = reader.take("<QQ")
        if magic != _LIST_MAGIC:
            raise NDArrayFileError(f"{where} is not an MXNet parameters file (it does not start with MXNet's "
                                   "NDArray-list marker)")
        (count,) = reader.take("<Q")
        if count > size:  # each array takes several bytes: more arrays than bytes is impossible
            raise NDArrayFileError(f"{where} declares {count:,} arrays in {size:,} bytes: it is damaged")
        arrays = [reader.array(index) for index in range(count)]
        names = reader.names(count)
    return [(n, *a) for n, a in zip(names, arrays)]


def check_shapes(path, expected, what="the network"):
    """Refuse (:class:`NDArrayFileError`) a ``.params`` file whose arrays lack ``expected``'s names and shapes.

    Parameters
    ----------
    path : str or Path
    expected : dict
        ``{name: shape}`` as ``Block.save_parameters`` names them (an ``arg:``/``aux:`` prefix in the file is ignored).
    what : str
        How to name the network in the message.
    """
    declared = {}
    for name, shape, _ in read_header(path):
        if name is None:
            raise NDArrayFileError(f"{shown(path)} holds unnamed arrays; parameters are saved with their names")
        declared[name.split(":", 1)[1] if name.startswith(("arg:", "aux:")) else name] = tuple(shape)
    missing = sorted(set(expected) - set(declared))
    extra = sorted(set(declared) - set(expected))
    wrong = sorted(n for n in set(expected) & set(declared) if tuple(expected[n]) != declared[n])
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} parameter(s) missing, e.g. {missing[0]}")
        if extra:
            parts.append(f"{len(extra)} not in {what}, e.g. {extra[0]}")
        if wrong:
            parts.append(f"{len(wrong)} of another shape, e.g. {wrong[0]} {declared[wrong[0]]} where "
                         f"{tuple(expected[wrong[0]])} belongs")
        raise NDArrayFileError(f"{shown(path)} does not fit {what}: {'; '.join(parts)}")
