"""JSON files, written atomically and read back with every check a hand-edited or hostile file needs; file digests.

Every JSON file mxfp16 reads back (a run's config, summary and metrics, checkpoint records, export.json,
manifests) goes through :func:`read_json` / :func:`read_jsonl`; writing goes through
:func:`mxfp16.plumbing.output.atomic_write`.
"""
import hashlib
import json
import math
import os
from pathlib import Path

from .output import atomic_write, shown

__all__ = ["write_json", "append_jsonl", "parse_json", "read_json", "read_jsonl", "JSONFileError", "MAX_JSON_BYTES",
           "MAX_JSON_DEPTH", "sha256_file", "cache_folder"]

#: A JSON file mxfp16 reads is a record of a run, not data: beyond this size it is refused.
MAX_JSON_BYTES = 64 << 20
#: The deepest nesting of lists and objects a JSON file mxfp16 reads may have (its own files need 6).
MAX_JSON_DEPTH = 32


def cache_folder(environ=None):
    """Where mxfp16 keeps what it measured or compiled once per machine (:mod:`mxfp16.measure.cache`,
    :mod:`mxfp16.machine.operator_cache`): ``$MXFP16_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxfp16``
    (``~/.cache/mxfp16`` by default)."""
    environ = os.environ if environ is None else environ
    return environ.get("MXFP16_CACHE_DIR") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mxfp16")


class JSONFileError(ValueError):
    """A JSON file that cannot be used; the message names the file, what is wrong and the fix."""


def write_json(path, obj, indent=2):
    """Write ``obj`` as JSON, atomically; a NaN or infinity raises ``ValueError`` (JSON has neither)."""
    text = json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False)
    with atomic_write(path) as handle:
        handle.write(text + "\n")


def append_jsonl(path, record):
    """Append one JSON record as a line, atomically: the file (a record per epoch) is rewritten whole."""
    path = Path(path)
    old = path.read_bytes() if path.exists() else b""
    with atomic_write(path, "wb") as handle:
        handle.write(old + (json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows (a NaN or infinite value was written)")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a 64-bit float")
    return value


def _depth(value, limit):
    """The nesting depth of ``value``, or ``limit + 1`` as soon as it passes ``limit`` (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _type_name(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _is(value, types):
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:  # JSON true is not the number 1 here
        return False
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, types)


def parse_json(text, where, fix="", expect=dict, fields=None, max_depth=MAX_JSON_DEPTH):
    """Parse JSON ``text`` with :func:`read_json`'s checks; ``where`` names it in errors."""
    tail = f"; {fix}" if fix else ""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise JSONFileError(f"{where} is nested too deeply to be a file mxfp16 wrote{tail}") from None
    except ValueError as err:
        raise JSONFileError(f"{where} is not valid JSON ({err}){tail}") from None
    if _depth(value, max_depth) > max_depth:
        raise JSONFileError(f"{where} nests lists or objects more than {max_depth} deep; mxfp16 never writes that"
                            f"{tail}")
    if expect is not None and not _is(value, expect):
        raise JSONFileError(f"{where} holds {_type_name(type(value))} where {_type_name(expect)} belongs{tail}")
    for name, types in (fields or {}).items():
        if name not in value:
            raise JSONFileError(f"{where} lacks the field {name!r}{tail}")
        if not _is(value[name], types):
            raise JSONFileError(f"{where}: field {name!r} is {json.dumps(value[name])[:80]}, where "
                                f"{_type_name(types)} belongs{tail}")
    return value


_MISSING = object()


def _read(path, fix, max_bytes, missing):
    """The bytes of ``path``, or ``missing`` when it does not exist; a :class:`JSONFileError` for anything else."""
    tail = f"; {fix}" if fix else ""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise JSONFileError(f"{shown(path)} is {size / 2 ** 20:.0f} MB, more than the {max_bytes >> 20} MB "
                                    f"a file mxfp16 writes can be{tail}")
            return handle.read(max_bytes + 1)
    except FileNotFoundError:
        if missing is not _MISSING:
            return missing
        raise JSONFileError(f"{shown(path)} is missing{tail}") from None
    except IsADirectoryError:
        raise JSONFileError(f"{shown(path)} is a folder, not a JSON file{tail}") from None
    except OSError as err:
        raise JSONFileError(f"{shown(path)} cannot be read ({err.strerror or err}){tail}") from None


def _text(raw, where, fix):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise JSONFileError(f"{where} is not UTF-8 text ({err.reason} at byte {err.start})"
                            + (f"; {fix}" if fix else "")) from None


def read_json(path, fix="", expect=dict, fields=None, default=_MISSING, max_bytes=MAX_JSON_BYTES,
              max_depth=MAX_JSON_DEPTH):
    """Read a JSON file mxfp16 (or a user) wrote, refusing what cannot be trusted.

    Parameters
    ----------
    path : str or Path
    fix : str
        What the user should do about a bad file; ends every message.
    expect : type or tuple of types, optional
        The top-level type (default: an object); ``None`` accepts any.
    fields : dict, optional
        ``{name: type or tuple of types}`` the object must have (``float`` takes integers; ``bool`` is no number).
    default : optional
        Returned when the file does not exist (default: raise).
    max_bytes, max_depth : int

    Raises
    ------
    JSONFileError
        Missing (without ``default``), unreadable, too large, not UTF-8, not JSON, nested too deeply,
        holding NaN/Infinity or a number that overflows, or of the wrong type; the message names the file.
    """
    raw = _read(path, fix, max_bytes, default)
    if raw is default:
        return default
    return parse_json(_text(raw, shown(path), fix), shown(path), fix, expect, fields, max_depth)


def read_jsonl(path, fix="", expect=dict, max_bytes=MAX_JSON_BYTES, max_depth=MAX_JSON_DEPTH):
    """The records of a JSON-lines file (an empty list when it does not exist), each checked as :func:`read_json`."""
    lines = _read(path, fix, max_bytes, b"").split(b"\n")
    return [parse_json(_text(line, f"{shown(path)} line {number}", fix), f"{shown(path)} line {number}", fix,
                       expect, None, max_depth) for number, line in enumerate(lines, 1) if line.strip()]


def sha256_file(path, chunk=1 << 20):
    """Hex SHA-256 of a file, read in chunks (a checkpoint or an export may not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
