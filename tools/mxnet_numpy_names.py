"""List the numpy attributes that MXNet's Python sources use, read from the installed ``mxnet`` package.

mxfp16 supplies the ones a newer numpy removed before MXNet loads
(``mxfp16/machine/stack.py``); ``mxfp16/machine/_mxnet_numpy_names.py`` holds the list this
script prints, and ``tests/test_numpy_compat.py`` checks the two agree with
the installed wheel. Regenerate after an MXNet upgrade::

    python tools/mxnet_numpy_names.py > mxfp16/machine/_mxnet_numpy_names.py

To try a new numpy, install it beside MXNet and list what it lacks (run it
before anything imports mxfp16, which supplies the names)::

    python tools/mxnet_numpy_names.py --missing

Each name listed needs an entry in ``_replacements`` in ``mxfp16/machine/stack.py``.

Three ways MXNet reaches numpy are read, by parsing (nothing is imported):

* ``alias.name`` (and ``alias.sub.name``) where ``import numpy as alias``;
* ``from numpy import name``;
* ``getattr(alias, var)`` inside ``for var in LIST``, where ``LIST`` is a
  module-level list of string literals (``numpy_dispatch_protocol.py``
  registers its operators this way; a dotted entry is a submodule path).
"""
import ast
import importlib.util
import os
import sys
import warnings

__all__ = ["scan", "render", "missing"]


def _numpy_aliases(tree):
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name == "numpy")
    return aliases


def _chain(node, aliases):
    """``'sub.name'`` for an attribute chain rooted at a numpy alias, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases and parts:
        return ".".join(reversed(parts))
    return None


def _string_lists(tree):
    lists = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.List, ast.Tuple))
                and node.value.elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                            for e in node.value.elts)):
            lists[node.targets[0].id] = [e.value for e in node.value.elts]
    return lists


def _looped_getattr(tree, aliases, lists):
    names = set()
    for loop in ast.walk(tree):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Name) and loop.iter.id in lists):
            continue
        uses_getattr = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                           and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id in aliases
                           for n in ast.walk(loop))
        if uses_getattr:
            names.update(lists[loop.iter.id])
    return names


def scan(root=None):
    """``{dotted numpy name: sorted files that use it}`` over every ``.py`` file under ``root``.

    Parameters
    ----------
    root : str, optional
        A package folder; default: the installed ``mxnet`` package (found
        without importing it).
    """
    if root is None:
        root = os.path.dirname(importlib.util.find_spec("mxnet").origin)
    found = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle, warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)  # old escapes in MXNet's tools/ scripts
                tree = ast.parse(handle.read(), filename=path)
            aliases = _numpy_aliases(tree)
            inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a.b of a.b.c
            names = {c for c in (_chain(n, aliases) for n in ast.walk(tree)
                                 if isinstance(n, ast.Attribute) and id(n) not in inner) if c}
            names.update(a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                         and n.module == "numpy" and n.level == 0 for a in n.names)
            names.update(_looped_getattr(tree, aliases, _string_lists(tree)))
            for dotted in names:
                found.setdefault(dotted, set()).add(os.path.relpath(path, root))
    return {k: sorted(v) for k, v in sorted(found.items())}


def render(names, source):
    """The text of ``mxfp16/machine/_mxnet_numpy_names.py`` for ``names``."""
    lines = ['"""The numpy attributes MXNet\'s Python sources use (generated; do not edit).',
             "",
             f"Read from {source} by tools/mxnet_numpy_names.py, which says how to",
             "regenerate it; tests/test_numpy_compat.py keeps it equal to the installed wheel.",
             '"""',
             "",
             "NAMES = ("]
    lines += [f"    {n!r}," for n in sorted(names)]
    lines.append(")")
    return "\n".join(lines) + "\n"


def missing(names, numpy=None):
    """The names in ``names`` that ``numpy`` does not have (default: the installed numpy, as it is now).

    Parameters
    ----------
    names : iterable of str
        Dotted names relative to ``numpy``.
    numpy : module, optional

    Returns
    -------
    list of str
    """
    if numpy is None:
        import numpy
    absent = []
    with warnings.catch_warnings():
        # numpy.core (deprecated in 2.0) and the 1.2x aliases still answer, with a warning each.
        warnings.simplefilter("ignore")
        for dotted in names:
            obj = numpy
            try:
                for part in dotted.split("."):
                    obj = getattr(obj, part)
            except (AttributeError, RuntimeError):  # numpy 1.x raises RuntimeError for some expired names
                absent.append(dotted)
    return absent


if __name__ == "__main__":
    import importlib.metadata

    version = importlib.metadata.version("mxnet") if importlib.util.find_spec("mxnet") else "?"
    names = scan()
    if sys.argv[1:] == ["--missing"]:
        import numpy

        sys.stdout.write(f"numpy {numpy.__version__} lacks {len(missing(names))} of the {len(names)} names "
                         f"mxnet {version} uses:\n")
        sys.stdout.write("".join(f"    {name}\n" for name in missing(names)))
    elif sys.argv[1:]:
        sys.exit("usage: python tools/mxnet_numpy_names.py [--missing]")
    else:
        sys.stdout.write(render(names, f"mxnet {version}"))
