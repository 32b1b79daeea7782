"""No function in the package is longer than the longest one already there: ruff has no rule for length.

Length is counted in lines of code: from the ``def`` line to the function's
last line, without its docstring, blank lines and comment lines, so that
documenting a function never counts against it. A nested function counts
in its parent and on its own, as in ruff's statement count.
"""
import ast
import os

from conftest import REPO

#: The ceiling: today's longest function. Lower it as long functions are split, never raise it.
MAX_CODE_LINES = 53  # bench/invocation.py plan_invocation; then train/selftest.py train_run (50)


def _docstring_lines(node):
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return set(range(first.lineno, first.end_lineno + 1))
    return set()


def code_lines(node, lines):
    """Lines of code of function ``node`` in the source ``lines``: no docstring, blank or comment lines."""
    docstring = _docstring_lines(node)
    return sum(1 for number in range(node.lineno, node.end_lineno + 1)
               if number not in docstring and lines[number - 1].strip()
               and not lines[number - 1].strip().startswith("#"))


def package_functions():
    """``(path:line name, code lines)`` for every function and method under mxfp16/."""
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "mxfp16")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    where = f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name}"
                    found.append((where, code_lines(node, lines)))
    return found


def test_no_function_is_longer_than_the_ceiling():
    functions = package_functions()
    assert len(functions) > 500  # the walk found the package
    longer = [f"{where}: {length} lines" for where, length in functions if length > MAX_CODE_LINES]
    assert not longer, (f"longer than {MAX_CODE_LINES} lines of code (split them into named helpers): "
                        + "; ".join(longer))


def test_the_count_leaves_out_docstrings_comments_and_blank_lines():
    source = 'def f(x):\n    """Doc.\n\n    More.\n    """\n    # why\n\n    y = x\n    return y\n'
    node = ast.parse(source).body[0]
    assert code_lines(node, source.splitlines()) == 3
