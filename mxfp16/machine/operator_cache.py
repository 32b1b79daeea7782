"""MXNet's operator functions, compiled once per machine instead of at every ``import mxnet``.

At import, MXNet 1.9.1 writes the Python source of one function per operator
(about 2,600: ``mxnet/ndarray/register.py`` and ``mxnet/symbol/register.py``,
for ``mx.nd``, ``mx.sym``, ``mx.np`` and ``mx.npx``) and compiles each with
``exec``; the compiling is a large share of ``import mxnet``'s time, in every
process. The sources are the same at every import of one MXNet build, so the
compiled code objects are kept in a file in mxfp16's cache folder
(:func:`mxfp16.plumbing.fileio.cache_folder`), one per Python (marshal's
format is the interpreter's), keyed by a digest of each source. A source the
file does not hold (another MXNet build, an operator library loaded later) is
compiled as before; once MXNet has loaded, the file is rewritten whole with
the functions this process used. Code runs from this file, so one that
another user owns, or that others may write, is not read; nor is one that is
damaged or of another format. Any of these, a missing file or a folder that
cannot be written costs only the compiling. Nothing else about the functions
changes: MXNet names, documents and registers them as it always does.

:class:`mxfp16.machine.stack._LeanMXNetImport` puts :data:`EXEC` in the two
register modules' namespaces before their code runs, where MXNet's own
``exec(code, None, local)`` finds it first.
"""
import builtins
import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import types

#: The start of the file: its kind, marshal's version and the bytecode's (what a .pyc file starts with); then a
#: digest of the payload, then the payload.
_MAGIC = b"mxfp16-operator-code\0" + marshal.version.to_bytes(2, "little") + importlib.util.MAGIC_NUMBER
_DIGEST = 32


def _stand_in(text):
    """What stands for the operator's handle ``text`` in a kept source: as many nines as it has digits.

    MXNet writes the handle (the address of the operator's entry in libmxnet, which differs from process to
    process) into each source as a number; the kept code object has this number in its place, and gets the
    process's own handle back when it is used. Of the same length, so that the code's column positions (what a
    traceback marks) are the handle's own.
    """
    return "9" * len(text)


def cache_file(environ=None):
    """The file of this Python's compiled operator functions in :func:`mxfp16.plumbing.fileio.cache_folder`."""
    from ..plumbing.fileio import cache_folder

    return os.path.join(cache_folder(environ), f"mxnet-operators.{sys.implementation.cache_tag}.marshal")


def _with_constant(code, old, new):
    """``code`` with the constant ``old`` replaced by ``new`` in it and the code objects it holds, or None."""
    found, consts = False, []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            replaced = _with_constant(const, old, new)
            found, const = (True, replaced) if replaced is not None else (found, const)
        elif type(const) is int and const == old:
            found, const = True, new
        consts.append(const)
    return code.replace(co_consts=tuple(consts)) if found else None


class CompiledOperators:
    """A drop-in ``exec`` that takes each source's code object from the file or compiles it once.

    ``stats`` says what happened in this process: ``{'file', 'read', 'compiled', 'written'}`` (``read``: the
    functions the file held; ``compiled``: the sources it lacked; ``written``: whether the file was rewritten).
    """

    def __init__(self):
        self.codes = None  # the file's, by digest of the source with the handle's stand-in
        self.used = {}  # what this process used: the file is rewritten with these alone
        self.stats = {"file": None, "read": 0, "compiled": 0, "written": False}

    def __call__(self, source, globals=None, locals=None, **kwargs):
        frame = sys._getframe(1)
        if globals is None:  # exec's default: the caller's namespaces
            globals = frame.f_globals
            locals = frame.f_locals if locals is None else locals
        if isinstance(source, str):
            handle = getattr(frame.f_locals.get("handle"), "value", None)  # MXNet's _make_*_function's argument
            source = self.code(source, handle if type(handle) is int else None)
        return builtins.exec(source, globals, locals, **kwargs)

    def code(self, source, handle=None):
        """The code object of ``source`` (compiled as ``exec`` would, file name ``<string>``).

        ``handle``: the operator's handle, which the source holds once as a number (MXNet's generated functions).
        """
        if self.codes is None:
            self.codes = self._read()
        text = str(handle) if handle is not None else None
        usable = text and source.count(text) == 1 and _stand_in(text) not in source
        kept = source.replace(text, _stand_in(text)) if usable else source
        key = hashlib.blake2b(kept.encode("utf-8"), digest_size=16).digest()
        code = self.codes.get(key)
        if code is None:
            code = self.codes[key] = compile(kept, "<string>", "exec")
            self.stats["compiled"] += 1
        self.used[key] = code
        if kept is source:
            return code
        own = _with_constant(code, int(_stand_in(text)), handle)
        return own if own is not None else compile(source, "<string>", "exec")

    def _read(self):
        try:
            self.stats["file"] = path = cache_file()
            with open(path, "rb") as handle:
                status = os.fstat(handle.fileno())
                # Code is run from this file: only one that no other user could have written.
                owner = getattr(os, "getuid", lambda: status.st_uid)()  # Windows: no owners to compare
                if status.st_uid != owner or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    return {}
                blob = handle.read()
            payload = blob[len(_MAGIC) + _DIGEST:]
            if blob[:len(_MAGIC)] != _MAGIC or blob[len(_MAGIC):len(_MAGIC) + _DIGEST] != hashlib.sha256(
                    payload).digest():
                return {}
            codes = marshal.loads(payload)
        except (OSError, ValueError, EOFError, TypeError):  # missing, unreadable or damaged: compile
            return {}
        if not isinstance(codes, dict) or not all(isinstance(c, types.CodeType) for c in codes.values()):
            return {}
        self.stats["read"] = len(codes)
        return codes

    def save(self):
        """Once MXNet has loaded: rewrite the file with the functions this process used, if it compiled any (a
        folder that refuses is left alone), then let go of the code objects (an operator library loaded later is
        compiled as MXNet does)."""
        codes, self.codes, self.used = self.used, {}, {}
        if not self.stats["compiled"] or self.stats["written"] or not self.stats["file"]:
            return
        from ..plumbing.output import atomic_write

        payload = marshal.dumps(codes)
        try:
            with atomic_write(self.stats["file"], "wb") as handle:
                handle.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        except OSError:  # a read-only or full cache folder costs the next import its compiling, nothing more
            return
        self.stats["written"] = True


#: The one instance this process uses (its ``stats`` are :func:`mxfp16.machine.stack.stack_report`'s).
EXEC = CompiledOperators()
