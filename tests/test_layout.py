"""The house: every module stands on a floor, imports only its own floor or lower ones, and no imports loop.

The floors, bottom up (the package docstring of each folder says what it holds):

1. ``foundations``: what runs before MXNet loads and knows nothing of training (the machine, files and processes,
   the numbers of the formats);
2. ``mxnet-glue``: every private MXNet access, the devices, the networks, AMP's tables and wrappers;
3. ``library``: what the README teaches (precision, casting, scaler, step, MixedPrecision, auto ...);
4. ``services``: data, diagnostics, distributed training;
5. ``trainer``; 6. ``inference``; 7. ``benchmark``;
8. ``applications``: the commands, the notebooks' helpers, the package's face.

Imports are read with ``ast`` from every ``import`` statement, those inside functions too: a lazy import is still
a dependency.
"""
import ast
import os
from collections import defaultdict

import pytest
from conftest import REPO

PACKAGE = os.path.join(REPO, "mxfp16")

#: Floor -> module prefixes (a folder's prefix covers everything in it). Order is bottom up.
FLOORS = [
    ("foundations", ["mxfp16._version", "mxfp16._lazy", "mxfp16.machine", "mxfp16.plumbing", "mxfp16.float_formats"]),
    ("mxnet-glue", ["mxfp16._internals", "mxfp16.devices", "mxfp16.models", "mxfp16.amp"]),
    ("library", ["mxfp16.precision", "mxfp16.casting", "mxfp16.gradients", "mxfp16.scaler", "mxfp16.optim",
                 "mxfp16.losses", "mxfp16.measure", "mxfp16.step", "mxfp16.mixed",
                 "mxfp16.estimator"]),
    ("services", ["mxfp16.data", "mxfp16.diagnostics", "mxfp16.distributed"]),
    ("trainer", ["mxfp16.train"]),
    ("inference", ["mxfp16.inference"]),
    ("benchmark", ["mxfp16.bench"]),
    ("applications", ["mxfp16.commands", "mxfp16.tutorial", "mxfp16.cli", "mxfp16.__main__", "mxfp16"]),
]


def _modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


MODULES = _modules()


def _floor(module):
    best = None
    for number, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (number, len(prefix))
    return None if best is None else best[0]


def _imports():
    """``{module: {imported module}}`` over every import statement of the package, lazy ones included."""
    edges = defaultdict(set)
    for module, path in MODULES.items():
        is_package = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{alias.name}" for alias in node.names]
                targets = [n if n in MODULES else target for n in names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                while target not in MODULES and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in MODULES and target not in (module, "mxfp16"):
                    edges[module].add(target)
    return edges


def test_every_module_stands_on_a_floor():
    assert [m for m in MODULES if _floor(m) is None] == []


def test_no_module_imports_a_floor_above_its_own():
    upward = [f"{a} ({FLOORS[_floor(a)][0]}) -> {b} ({FLOORS[_floor(b)][0]})"
              for a, targets in sorted(_imports().items()) for b in sorted(targets) if _floor(b) > _floor(a)]
    assert upward == []


def test_the_import_graph_has_no_cycle():
    edges, state, cycles = _imports(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_root_holds_the_library_and_its_entry_points():
    """The package root shows the architecture: about 20 modules, none of them plumbing or an application."""
    root = sorted(m for m, p in MODULES.items() if os.path.dirname(p) == PACKAGE and not p.endswith("__init__.py"))
    assert len(root) <= 20, root
    allowed = {"mxfp16.cli", "mxfp16.__main__"} | {p for _, prefixes in FLOORS[:3] for p in prefixes}
    assert [m for m in root if m not in allowed] == []


@pytest.mark.parametrize("folder", sorted({m.split(".")[1] for m, p in MODULES.items()
                                           if os.path.basename(p) == "__init__.py" and m.count(".") == 1}))
def test_every_folder_says_what_it_holds(folder):
    """A newcomer finds anything from the folder names: each folder's face has a docstring saying what is there."""
    with open(os.path.join(PACKAGE, folder, "__init__.py"), encoding="utf-8") as handle:
        assert ast.get_docstring(ast.parse(handle.read())), folder
