"""Private names of MXNet, GluonCV and onnx are reached in one module only: ``mxfp16/_internals.py``.

When one of those libraries renames a private attribute, ``_internals.py`` is the one place to fix, each access
behind a named helper that says what it touches and why. This test reads every other module of the package with
``ast`` and fails on:

- an attribute ``X._name`` (one leading underscore, not a dunder) whose name mxfp16 does not define itself:
  the package's own functions, classes, methods, module globals, imported aliases, attributes it assigns on
  ``self``/``cls`` and its own module names are its own; any other private attribute is someone else's;
- ``getattr``/``hasattr``/``setattr``/``delattr`` with such a name as a literal string;
- an import from ``mxnet``, ``gluoncv`` or ``onnx`` of a private name or through a private module
  (``from mxnet.base import _LIB``, ``import mxnet._ctypes``), and a literal module path with a private part
  (``importlib.import_module("mxnet.ndarray._internal")``).

The rule cannot know an object's type: a name mxfp16 defines for itself hides the same name on an MXNet object.
"""
import ast
import os

import pytest
from conftest import REPO

PACKAGE = os.path.join(REPO, "mxfp16")

#: The one module allowed to reach private names.
INTERNALS = os.path.join("mxfp16", "_internals.py")

#: The libraries whose private names only INTERNALS may reach.
GUARDED = ("mxnet", "gluoncv", "onnx")

#: Underscored names of the standard library, not of the guarded libraries: those it documents as public (a
#: namedtuple's methods, ``os._exit``, ``sys._getframe``), and ``threading._shutdown`` and
#: ``atexit._run_exitfuncs``, what CPython's own shutdown calls, which :func:`mxfp16.plumbing.child.end_process`
#: calls the same way before ``os._exit``.
PUBLIC_UNDERSCORED = {"_asdict", "_replace", "_fields", "_field_defaults", "_make", "_exit", "_getframe",
                      "_shutdown", "_run_exitfuncs"}

#: ``(file, name)`` accesses in files other helpers are editing right now (issue 50): move each into
#: ``_internals.py`` and delete its line when the file settles. Keep this list empty otherwise.
ALLOWED = set()

_ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}


def _is_private(name):
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _guarded_module(dotted):
    return dotted.split(".")[0] in GUARDED


def _private_part(dotted):
    """The first private part of dotted path ``dotted``, or ``None``."""
    return next((part for part in dotted.split(".") if _is_private(part)), None)


def _self_names(function):
    """Names of the first argument of a method (``self``, ``cls``)."""
    args = function.args.posonlyargs + function.args.args
    return {args[0].arg} if args else set()


def defined_names(tree):
    """Every name a module defines for itself: defs, classes, globals, aliases, ``self.x = ...`` attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            owners = _self_names(function)
            for node in ast.walk(function):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                        and isinstance(node.value, ast.Name) and node.value.id in owners):
                    names.add(node.attr)
    return names


def package_files():
    """``{path relative to the repository: source}`` for every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    found[os.path.relpath(path, REPO)] = handle.read()
    return found


def package_names(files):
    """What mxfp16 defines anywhere, module names included. ``_internals.py``'s assignments to foreign
    objects (``block._active = ...``) are not definitions: only its own functions and globals are counted."""
    names = set()
    for path, source in files.items():
        for part in path[:-len(".py")].split(os.sep):
            names.add(part)
        names |= defined_names(ast.parse(source))
    return names


def _import_findings(node):
    if isinstance(node, ast.Import):
        for alias in node.names:
            if _guarded_module(alias.name) and _private_part(alias.name):
                yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module and _guarded_module(node.module):
        if _private_part(node.module):
            yield node.lineno, node.module
        for alias in node.names:
            if _is_private(alias.name):
                yield node.lineno, f"{node.module}.{alias.name}"


def private_accesses(source, own_names):
    """``[(line, name)]``: every private access to a foreign object or guarded library in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        found.extend(_import_findings(node))
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTRIBUTE_CALLS
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
            name = node.args[1].value
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value
              and _guarded_module(node.value) and _private_part(node.value)):
            found.append((node.lineno, node.value))
            continue
        else:
            continue
        if name not in own_names and name not in PUBLIC_UNDERSCORED:
            found.append((node.lineno, name))
    return sorted(set(found))


def test_the_checker_catches_planted_private_access():
    """A vacuous checker would pass the package: it must flag each kind of access and spare mxfp16's own names."""
    planted = (
        "import mxnet._ctypes\n"
        "from mxnet.base import _LIB\n"
        "from mxnet._deferred_compute import is_deferred_compute\n"
        "from .own import _helper\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def read(self, trainer, block):\n"
        "        block._children.clear()\n"
        "        getattr(trainer, '_kvstore', None)\n"
        "        importlib.import_module('mxnet.ndarray._internal')\n"
        "        return self._mine, trainer._params, _helper, os._exit, block.__class__\n"
    )
    found = private_accesses(planted, defined_names(ast.parse(planted)))
    assert found == [(1, "mxnet._ctypes"), (2, "mxnet.base._LIB"), (3, "mxnet._deferred_compute"),
                     (9, "_children"), (10, "_kvstore"), (11, "mxnet.ndarray._internal"), (12, "_params")]


def test_the_package_defines_names_the_checker_spares():
    """The collection of mxfp16's own names is not empty: ``self._x`` attributes and private helpers are in it."""
    names = package_names(package_files())
    assert {"_internals", "_lazy", "_init_kvstore"} <= names
    assert any(name.startswith("_") and not name.startswith("__") for name in names - {"_internals", "_lazy"})


def test_only_internals_reaches_private_names_of_mxnet_gluoncv_and_onnx():
    files = package_files()
    own = package_names({path: source for path, source in files.items() if path != INTERNALS})
    own |= {node.name for node in ast.parse(files[INTERNALS]).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    found, stale = [], set(ALLOWED)
    for path, source in sorted(files.items()):
        if path == INTERNALS:
            continue
        for line, name in private_accesses(source, own):
            if (path, name) in ALLOWED:
                stale.discard((path, name))
            else:
                found.append(f"{path}:{line} {name}")
    if found:
        pytest.fail("private MXNet/GluonCV/onnx access outside mxfp16/_internals.py; move each into a named, "
                    "documented helper in _internals.py and call that:\n  " + "\n  ".join(found))
    assert not stale, f"ALLOWED lists accesses that are gone; delete these entries: {sorted(stale)}"
