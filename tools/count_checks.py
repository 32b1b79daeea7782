"""Count what the suite checks: tests, parametrized cases, ``assert`` statements, and the notebooks' checks.

Issue 48 asks that no test be dropped or weakened to save time, and that a merged test keep every assertion of
the tests it replaces; this prints the numbers that promise is held to, in a second, without importing a test
module or running pytest::

    python tools/count_checks.py                   # a table per file, and the totals
    python tools/count_checks.py --json            # the same, machine-readable
    python tools/count_checks.py --compare 61b844e # before (that commit) and after (this tree); exit 1 if a total fell
    python tools/count_checks.py --collect         # also pytest --collect-only's count (imports every test module)

Everything is read with :mod:`ast`:

* tests: functions named ``test*`` at module level and methods named ``test*`` in ``Test*`` classes of
  ``tests/test_*.py`` (pytest's default names, which setup.cfg keeps);
* cases: each test times the cases of its ``@pytest.mark.parametrize(names, values)`` decorators (and its
  class's, and the module's ``pytestmark``), and of the ``@pytest.fixture(params=...)`` fixtures it asks for
  (defined in its module or tests/conftest.py). ``values`` counts where it is static: a list, tuple, set or dict
  literal, ``range`` of literal integers, a module-level name bound once to one of those, or ``sorted``/``list``/
  ``tuple`` of one. Any other counts as one case and is reported as not expanded;
* asserts: ``assert`` statements in every .py file of tests/, the test files and the helpers (conftest.py, the
  child scripts, the support modules) apart; the checks that are calls get rows of their own:
  ``pytest.raises``, ``pytest.warns``, ``pytest.fail`` and ``assert_*`` (``np.testing.assert_allclose`` and the
  other numpy.testing asserts);
* notebooks: ``assert`` statements in the code cells of notebooks/*.ipynb (IPython magics and ``!`` lines
  removed first), and calls of a named check helper (:data:`CHECK_HELPERS`) should a notebook use one.

``--compare REF`` counts the same in a commit, read with ``git cat-file`` (nothing is checked out), prints both
and exits 1 when a total went down: tests, cases, asserts (test files and helpers together: an assert may move
into a helper) or any other check row, or a notebook total. A drop in one file alone is a note (tests move
between files); so is an assert or a test name that is gone from the whole tree, named with where it was.
"""
import argparse
import ast
import collections
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Names of functions a notebook might check a claim with; a call counts as one named check.
CHECK_HELPERS = ("check", "claim", "check_claim")
#: Rows of the test files and helpers: each is summed over tests/ and compared as a total.
CHECK_ROWS = ("tests", "cases", "asserts", "pytest.raises", "pytest.warns", "pytest.fail", "assert_*")
NOTEBOOK_ROWS = ("asserts", "checks")
#: The totals --compare holds: (section, row).
GUARDED = ([("tests", row) for row in CHECK_ROWS] + [("notebooks", row) for row in NOTEBOOK_ROWS])
_LISTED = 20  # gone asserts or tests named in full


# ---------------------------------------------------------------------------------------------------------------
# Reading the tree: the working tree, or a commit through git cat-file.

def _is_counted(path):
    folder, name = os.path.split(path)
    return (folder == "tests" and name.endswith(".py")) or (folder == "notebooks" and name.endswith(".ipynb"))


def read_tree(root):
    """``{relative path: text}`` of tests/*.py and notebooks/*.ipynb in the working tree under ``root``."""
    found = {}
    for folder in ("tests", "notebooks"):
        if not os.path.isdir(os.path.join(root, folder)):
            continue
        for name in sorted(os.listdir(os.path.join(root, folder))):
            path = f"{folder}/{name}"
            if _is_counted(path) and os.path.isfile(os.path.join(root, path)):
                with open(os.path.join(root, path), encoding="utf-8") as handle:
                    found[path] = handle.read()
    return found


def read_commit(root, ref):
    """The same files as :func:`read_tree`, as they are in commit ``ref`` of the repository at ``root``."""
    listing = subprocess.run(["git", "ls-tree", "--name-only", ref, "tests/", "notebooks/"], cwd=root,
                             capture_output=True, text=True)
    if listing.returncode:
        raise SystemExit(f"error: git ls-tree {ref}: {listing.stderr.strip()}")
    paths = [p for p in listing.stdout.splitlines() if _is_counted(p)]
    blobs = subprocess.run(["git", "cat-file", "--batch"], cwd=root, capture_output=True, check=True,
                           input="".join(f"{ref}:{p}\n" for p in paths).encode())
    found, data, at = {}, blobs.stdout, 0
    for path in paths:
        header_end = data.index(b"\n", at)
        size = int(data[at:header_end].split()[2])
        found[path] = data[header_end + 1:header_end + 1 + size].decode("utf-8")
        at = header_end + 1 + size + 1
    return found


# ---------------------------------------------------------------------------------------------------------------
# Python files: tests, cases, asserts.

def _dotted(node):
    """``pytest.mark.parametrize`` for the expression that names it; '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _module_literals(tree):
    """``{name: value node}`` of module-level names bound exactly once by a plain assignment."""
    bound = collections.Counter()
    values = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Name):
                bound[target.id] += 1
                values[target.id] = getattr(node, "value", None)
    return {name: values[name] for name, times in bound.items() if times == 1 and values[name] is not None}


def static_length(node, names, seen=()):
    """How many values ``node`` holds, where that is static (see the module's docstring); None where not."""
    if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        return len(node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return len(node.keys)
    if isinstance(node, ast.Set) and all(isinstance(e, ast.Constant) for e in node.elts):
        return len({e.value for e in node.elts})
    if isinstance(node, ast.Name) and node.id in names and node.id not in seen:
        return static_length(names[node.id], names, seen + (node.id,))
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords \
            and _dotted(node.func) in ("sorted", "list", "tuple", "reversed"):
        return static_length(node.args[0], names, seen)
    if isinstance(node, ast.Call) and _dotted(node.func) == "range" and not node.keywords and node.args \
            and all(isinstance(a, ast.Constant) and isinstance(a.value, int) for a in node.args):
        return len(range(*[a.value for a in node.args]))
    return None


def _argnames(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {n.strip() for n in node.value.split(",") if n.strip()}
    if isinstance(node, (ast.List, ast.Tuple)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _parametrizations(decorators, names):
    """``[(argument names, cases or None)]`` of the ``parametrize`` marks among ``decorators``."""
    found = []
    for decorator in decorators:
        if not (isinstance(decorator, ast.Call) and _dotted(decorator.func).endswith("parametrize")):
            continue
        arguments = dict(zip(("argnames", "argvalues"), decorator.args))
        arguments.update({k.arg: k.value for k in decorator.keywords if k.arg in ("argnames", "argvalues")})
        if "argvalues" in arguments:
            found.append((_argnames(arguments.get("argnames")), static_length(arguments["argvalues"], names)))
    return found


def _fixtures(tree, names):
    """``{fixture name: (its arguments, params: cases, None when not static, 1 when it has none)}``."""
    found = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if _dotted(getattr(decorator, "func", decorator)) not in ("pytest.fixture", "fixture"):
                continue
            params = [k.value for k in getattr(decorator, "keywords", ()) if k.arg == "params"]
            name = next((k.value.value for k in getattr(decorator, "keywords", ())
                         if k.arg == "name" and isinstance(k.value, ast.Constant)), node.name)
            found[name] = ([a.arg for a in node.args.args], static_length(params[0], names) if params else 1)
    return found


def _fixture_cases(arguments, fixtures, overridden):
    """The product of the params of the fixtures ``arguments`` ask for, directly or through other fixtures."""
    cases, unexpanded, seen, todo = 1, 0, set(), list(arguments)
    while todo:
        name = todo.pop()
        if name in seen or name in overridden or name not in fixtures:
            continue
        seen.add(name)
        wanted, params = fixtures[name]
        todo.extend(wanted)
        if params is None:
            unexpanded += 1
        else:
            cases *= params
    return cases, unexpanded


def _test_functions(tree):
    """``(qualified name, function node, decorators that apply from its classes)`` of every test in ``tree``."""
    def walk(body, prefix, inherited):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                yield prefix + node.name, node, inherited
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from walk(node.body, f"{prefix}{node.name}::", inherited + node.decorator_list)
    yield from walk(tree.body, "", [])


def _module_marks(tree):
    marks = [n.value for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    return [m for mark in marks for m in (mark.elts if isinstance(mark, (ast.List, ast.Tuple)) else [mark])]


def count_cases(tree, shared_fixtures):
    """``({test name: cases}, [test name, once per mark or fixture of it whose values are not static])``."""
    names = _module_literals(tree)
    fixtures = dict(shared_fixtures)
    fixtures.update(_fixtures(tree, names))
    module_marks = _module_marks(tree)
    cases, unexpanded = {}, []
    for name, node, inherited in _test_functions(tree):
        product, overridden = 1, set()
        for argnames, values in _parametrizations(node.decorator_list + inherited + module_marks, names):
            overridden |= argnames
            if values is None:
                unexpanded.append(name)
            else:
                product *= values
        from_fixtures, fixtures_unexpanded = _fixture_cases([a.arg for a in node.args.args], fixtures, overridden)
        cases[name] = product * from_fixtures
        unexpanded += [name] * fixtures_unexpanded
    return cases, unexpanded


def _segment(lines, node):
    """The source of ``node`` on one line; ``lines``: the source's lines as bytes (ast's offsets count bytes,
    and its own helper splits the whole source at every call)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        text = lines[first][node.col_offset:node.end_col_offset]
    else:
        text = b"\n".join([lines[first][node.col_offset:]] + lines[first + 1:last]
                          + [lines[last][:node.end_col_offset]])
    return " ".join(text.decode("utf-8", "replace").split())


def _call_row(node):
    """The check row a call belongs to, or None."""
    name = _dotted(node.func)
    if name in ("pytest.raises", "pytest.warns", "pytest.fail"):
        return name
    if name.rsplit(".", 1)[-1].startswith("assert_"):
        return "assert_*"
    return None


def _nodes_with_owner(node, owner="<module>"):
    """``(node, name of the innermost function around it)`` for every node under ``node``."""
    for child in ast.iter_child_nodes(node):
        yield child, owner
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else owner
        yield from _nodes_with_owner(child, inner)


def count_python(path, source, shared_fixtures):
    """The rows of one .py file of tests/, and ``{"asserts": [(function, text)], "tests": [name],
    "unexpanded": [test name]}``."""
    tree = ast.parse(source, filename=path)
    row = dict.fromkeys(CHECK_ROWS, 0)
    asserts, lines = [], source.encode("utf-8").splitlines()
    for node, owner in _nodes_with_owner(tree):
        if isinstance(node, ast.Assert):
            asserts.append((owner, _segment(lines, node)))
        elif isinstance(node, ast.Call) and _call_row(node):
            row[_call_row(node)] += 1
    row["asserts"] = len(asserts)
    found = {"asserts": asserts, "tests": [], "unexpanded": []}
    if _is_test_file(path):
        cases, found["unexpanded"] = count_cases(tree, shared_fixtures)
        row["tests"], row["cases"], found["tests"] = len(cases), sum(cases.values()), sorted(cases)
    row["unexpanded"] = len(found["unexpanded"])
    return row, found


# ---------------------------------------------------------------------------------------------------------------
# Notebooks.

_MAGIC = re.compile(r"^(\s*)(?:[%!]|[\w.]+\s*=\s*[%!])")


def notebook_code(cell_source):
    """A code cell's source as Python: magics, shell lines and ``?`` help lines become ``pass``."""
    lines = cell_source.splitlines()
    if lines and lines[0].startswith("%%"):
        if not re.match(r"%%(time|timeit|capture|prun)\b", lines[0]):
            return ""  # a cell of another language
        lines = lines[1:]
    code = []
    for line in lines:
        magic = _MAGIC.match(line) or (line.rstrip().endswith("?") and re.match(r"^(\s*)[\w.]+\?+$", line.rstrip()))
        code.append(magic.group(1) + "pass" if magic else line)
    return "\n".join(code)


def count_notebook(path, text):
    """The rows of one notebook, its assert statements as ``(cell, text)``, and its cells that did not parse."""
    row, asserts, unparsed = dict.fromkeys(NOTEBOOK_ROWS, 0), [], 0
    for index, cell in enumerate(json.loads(text).get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        code = notebook_code(source)
        try:
            tree = ast.parse(code)
        except SyntaxError:
            unparsed += 1
            asserts.extend((f"cell {index}", line.strip()) for line in code.splitlines()
                           if re.match(r"\s*assert\b", line))
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                asserts.append((f"cell {index}", _segment(code.encode("utf-8").splitlines(), node)))
            elif isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in CHECK_HELPERS:
                row["checks"] += 1
    row["asserts"] = len(asserts)
    return row, asserts, unparsed


# ---------------------------------------------------------------------------------------------------------------
# The whole tree.

def count(files):
    """Counts of ``{path: text}`` (from :func:`read_tree` or :func:`read_commit`)."""
    shared = {}
    if "tests/conftest.py" in files:
        tree = ast.parse(files["tests/conftest.py"])
        shared = _fixtures(tree, _module_literals(tree))
    result = {"tests": {}, "notebooks": {}, "asserts": {}, "test_names": {}, "unexpanded": {}, "notes": []}
    for path in sorted(files):
        if path.endswith(".py"):
            result["tests"][path], found = count_python(path, files[path], shared)
            asserts, result["test_names"][path] = found["asserts"], found["tests"]
            if found["unexpanded"]:
                result["unexpanded"][path] = found["unexpanded"]
        else:
            row, asserts, unparsed = count_notebook(path, files[path])
            result["notebooks"][path] = row
            if unparsed:
                result["notes"].append(f"{path}: {unparsed} code cell(s) did not parse; their asserts were "
                                       "counted by line")
        result["asserts"][path] = asserts
    result["totals"] = totals(result)
    return result


def _is_test_file(path):
    return os.path.basename(path).startswith("test_")


def totals(result):
    """``{section: {row: total}}``; tests' asserts also split into test files and helpers."""
    rows = result["tests"].values()
    tests = {row: sum(r[row] for r in rows) for row in CHECK_ROWS + ("unexpanded",)}
    tests["asserts in test files"] = sum(r["asserts"] for p, r in result["tests"].items() if _is_test_file(p))
    tests["asserts in helpers"] = tests["asserts"] - tests["asserts in test files"]
    tests["test files"] = sum(1 for p in result["tests"] if _is_test_file(p))
    notebooks = {row: sum(r[row] for r in result["notebooks"].values()) for row in NOTEBOOK_ROWS}
    notebooks["notebooks"] = len(result["notebooks"])
    return {"tests": tests, "notebooks": notebooks}


def collect(root):
    """``(collected, {file: collected})`` from ``pytest --collect-only -q`` run in ``root``."""
    # pytest's own command line, not a function of mxfp16's: not mxfp16.plumbing.child's call_in_child.
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=root, capture_output=True, text=True)
    per_file = collections.Counter(line.split("::", 1)[0] for line in run.stdout.splitlines() if "::" in line)
    match = re.search(r"(\d+)(?:/\d+)? tests? collected", run.stdout)
    if not match:
        raise SystemExit(f"error: pytest --collect-only gave no count (exit {run.returncode}):\n"
                         + (run.stdout + run.stderr)[-3000:])
    return int(match.group(1)), dict(per_file)


# ---------------------------------------------------------------------------------------------------------------
# Output.

TEST_COLUMNS = ("tests", "cases", "asserts", "pytest.raises", "pytest.warns", "pytest.fail", "assert_*")


def _cell(before, after):
    return str(after) if before == after else f"{before}->{after}"


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % w for i, w in enumerate(widths))
    return [line.format(*header)] + [line.format(*map(str, r)) for r in rows]


def file_tables(after, before=None):
    """The per-file tables: one of tests/, one of notebooks/; ``before->after`` where a number changed."""
    out = []
    for section, columns in (("tests", TEST_COLUMNS), ("notebooks", NOTEBOOK_ROWS)):
        paths = sorted(set(after[section]) | set((before or {}).get(section, {})))
        rows = []
        for path in paths:
            new = after[section].get(path, dict.fromkeys(columns, 0))
            old = before[section].get(path, dict.fromkeys(columns, 0)) if before else new
            mark = "" if before is None or old == new else (" (new)" if path not in before[section] else
                                                            " (gone)" if path not in after[section] else " *")
            rows.append([path + mark] + [_cell(old[c], new[c]) for c in columns])
        out += _table([section + "/"] + list(columns), rows) + [""]
    return out


def total_lines(after, before=None):
    out = []
    for section in ("tests", "notebooks"):
        if before is None:
            rows = [[row, value] for row, value in after["totals"][section].items()]
            out += _table([f"{section} totals", ""], rows) + [""]
            continue
        rows = [[row, before["totals"][section][row], value, "%+d" % (value - before["totals"][section][row])]
                for row, value in after["totals"][section].items()]
        out += _table([f"{section} totals", "before", "after", "change"], rows) + [""]
    return out


def _gone(before, after, key):
    """Items of ``before[key]`` (per file) found nowhere in ``after[key]``: ``[(file, item)]``."""
    left = collections.Counter(item for items in after[key].values() for item in map(_item_text, items))
    gone = []
    for path, items in sorted(before[key].items()):
        for item in items:
            if left[_item_text(item)]:
                left[_item_text(item)] -= 1
            else:
                gone.append((path, item))
    return gone


def _item_text(item):
    return item[1] if isinstance(item, tuple) else item


def compare_notes(before, after):
    """``(notes, failures)``: per-file drops and vanished checks; the totals that went down."""
    notes, failures = [], []
    for section, row in GUARDED:
        old, new = before["totals"][section][row], after["totals"][section][row]
        if new < old:
            failures.append(f"{section} {row}: {old} -> {new}")
    for section in ("tests", "notebooks"):
        for path, old in sorted(before[section].items()):
            new = after[section].get(path)
            dropped = [f"{c} {old[c]} -> {new[c] if new else 0}" for c in old
                       if c != "unexpanded" and (new[c] if new else 0) < old[c]]
            if dropped:
                notes.append(f"{path}: " + ", ".join(dropped) + ("" if new else " (file gone)"))
    for key, what in (("asserts", "assert"), ("test_names", "test")):
        gone = _gone(before, after, key)
        for path, item in gone[:_LISTED]:
            notes.append(f"assert no longer anywhere in {path} ({item[0]}): {item[1]}" if isinstance(item, tuple)
                         else f"test no longer anywhere: {path}::{item}")
        if len(gone) > _LISTED:
            notes.append(f"... and {len(gone) - _LISTED} more {what}s no longer anywhere")
    return notes, failures


def report(after, before=None, ref=None, collected=None):
    lines = []
    if ref:
        lines.append(f"before: {ref}; after: the working tree")
        lines.append("")
    lines += file_tables(after, before) + total_lines(after, before)
    unexpanded = after["totals"]["tests"]["unexpanded"]
    lines.append(f"{unexpanded} parametrize marks or fixture params are not static and count as one case each "
                 "(--json lists them)")
    if collected is not None:
        lines.append(f"pytest --collect-only: {collected[0]} tests collected (the static count: "
                     f"{after['totals']['tests']['cases']} cases)")
    lines += after["notes"]
    failures = []
    if before is not None:
        notes, failures = compare_notes(before, after)
        lines += ["", "notes:"] + (notes or ["none: no file lost a test or a check"])
        lines += ["", "went down:" if failures else f"no total is lower than at {ref}"] + failures
    return "\n".join(lines), failures


def as_json(after, before=None, collected=None):
    def strip(result):
        return {k: result[k] for k in ("tests", "notebooks", "totals", "unexpanded", "notes")}
    data = {"after": strip(after)}
    if before is not None:
        notes, failures = compare_notes(before, after)
        data.update(before=strip(before), compare_notes=notes, went_down=failures)
    if collected is not None:
        data["collected"], data["collected_per_file"] = collected
    return json.dumps(data, indent=1, sort_keys=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=ROOT, help="the repository (default: this checkout)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--compare", metavar="REF", help="count the same in git commit REF; exit 1 if a total fell")
    parser.add_argument("--collect", action="store_true", help="also run pytest --collect-only -q (slow)")
    args = parser.parse_args(argv)
    after = count(read_tree(args.root))
    before = count(read_commit(args.root, args.compare)) if args.compare else None
    collected = collect(args.root) if args.collect else None
    text, failures = report(after, before, args.compare, collected)
    print(as_json(after, before, collected) if args.json else text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
