"""List the ``MXNET_*`` environment variables MXNet's C++ sources read, with the type each is parsed as.

MXNet reads its settings with ``dmlc::GetEnv(name, default)``, which parses
the value as the default's type; a value it cannot parse raises
``dmlc::ParamError``, which surfaces as an ``MXNetError`` or, when it is read
on an engine thread, aborts the process (SIGABRT). mxfp16 checks these
variables before MXNet loads (``mxfp16/machine/environment.py``);
``mxfp16/machine/_mxnet_variables.py`` holds the table this script prints.
Regenerate it from a checkout of the MXNet release mxfp16 runs on::

    git clone --branch 1.9.1 --depth 1 https://github.com/apache/mxnet /tmp/mxnet
    python tools/mxnet_variables.py /tmp/mxnet > mxfp16/machine/_mxnet_variables.py

The type comes from the default's spelling: ``true``/``false`` is a boolean
(dmlc accepts ``true``, ``false``, ``1`` and ``0``, in any case), a literal
or an arithmetic of integers is an integer, a decimal point makes a float,
a string is free text; :data:`DEFAULT_TYPES` names the type of the defaults
that are variables in the source.
"""
import os
import re
import sys

__all__ = ["scan", "render", "DEFAULT_TYPES"]

_CALL = re.compile(r'GetEnv\(\s*"(MXNET_[A-Z0-9_]+)"\s*,')
#: Defaults written as a variable or a call in MXNet 1.9.1, and the type they have there.
DEFAULT_TYPES = {"INT_MIN": "int", "this->mode_": "int", "default_num_streams": "int", "max_cores_default": "int",
                 "in_shape[0][0]": "int"}


def _kind(default):
    default = " ".join(default.split())
    inner = _CALL.search(default)
    if inner:  # another variable's value is the default: the same parser reads both
        return _kind(_argument(default, inner.end()))
    if default in ("true", "false") or default.startswith("dmlc::optional<bool>"):
        return "bool"
    if "string" in default or default.startswith('"') or "Subgraph" in default:
        return "string"
    if default in DEFAULT_TYPES:
        return DEFAULT_TYPES[default]
    if re.fullmatch(r"[-+*/ ()0-9]+", default):
        return "int"
    if re.fullmatch(r"[-+*/ ()0-9.]+f?", default):
        return "float"
    raise ValueError(f"default {default!r}: add its type to DEFAULT_TYPES")


def _argument(text, start):
    """The text of the call's last argument, from ``start`` to the parenthesis that closes the call."""
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "(":
            depth += 1
        elif text[end] == ")":
            if depth == 0:
                return text[start:end].strip()
            depth -= 1
    raise ValueError("a GetEnv call that never closes")


def scan(root):
    """``{name: type}`` of every ``dmlc::GetEnv("MXNET_...", default)`` under ``root/src`` and ``root/include``."""
    found = {}
    for top in ("src", "include"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith((".cc", ".h", ".cu", ".cuh")) or not os.path.isfile(os.path.join(folder, name)):
                    continue  # other files, and links into submodules a checkout may lack
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
                for match in _CALL.finditer(text):
                    variable, kind = match.group(1), _kind(_argument(text, match.end()))
                    if found.get(variable, kind) != kind:
                        raise ValueError(f"{variable} is read as {found[variable]} and as {kind}")
                    found[variable] = kind
    return dict(sorted(found.items()))


def render(table, version):
    lines = ['"""The ``MXNET_*`` variables MXNet reads with ``dmlc::GetEnv``, and the type each is parsed as.',
             "",
             f"Read from the sources of MXNet {version} by tools/mxnet_variables.py (generated; do not edit),",
             'which says how to regenerate it. ``MXNET_ENGINE_TYPE`` is read with ``getenv`` and checked on its own.',
             '"""', "", "VARIABLES = {"]
    lines += [f"    {name!r}: {kind!r}," for name, kind in table.items()]
    return "\n".join(lines + ["}", ""])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/mxnet_variables.py MXNET_SOURCE_TREE")
    root = sys.argv[1]
    version = "1.9.1"
    with open(os.path.join(root, "include", "mxnet", "base.h"), encoding="utf-8") as handle:
        parts = dict(re.findall(r"#define MXNET_(MAJOR|MINOR|PATCH) (\d+)", handle.read()))
    if parts:
        version = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    sys.stdout.write(render(scan(root), version))
