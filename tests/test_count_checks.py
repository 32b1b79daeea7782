"""tools/count_checks.py against a small tree whose numbers are known: tests, cases, asserts, notebook checks.

Issue 48 holds the suite to "no test dropped, no assertion lost" with these counts, so the counter must count
what pytest would run and every assert, and ``--compare`` must fail when one goes. The tree below is written
with its numbers worked out by hand in the comments; pytest's own collection of it is the second, independent
count of the cases.
"""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO

TOOL = os.path.join(REPO, "tools", "count_checks.py")
_spec = importlib.util.spec_from_file_location("count_checks", TOOL)
count_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(count_checks)

CONFTEST = '''
import pytest


@pytest.fixture(params=[1, 2, 3])
def three(request):
    return request.param


def helper(x):
    assert x  # 1 assert in a helper file
'''

TEST_A = '''
import numpy as np
import pytest

VALUES = (1, 2)
pytestmark = pytest.mark.filterwarnings("ignore")


def make():
    return [1, 2]


@pytest.fixture(params=["x", "y"])
def pair(three):  # 2 params times conftest's 3
    return three


def test_plain():  # 1 case, 2 asserts
    assert 1 == 1
    assert "é" != "assert"


@pytest.mark.parametrize("a", [1, 2, 3])
@pytest.mark.parametrize("b, c", [(1, 2), pytest.param(3, 4, id="p")])
def test_product(a, b, c):  # 3 * 2 = 6 cases, 1 assert
    assert a


@pytest.mark.parametrize("v", sorted(VALUES))
def test_named(v):  # 2 cases; a raises and an assert_allclose
    with pytest.raises(ValueError):
        int("x")
    np.testing.assert_allclose(1, 1)


@pytest.mark.parametrize("v", make())
def test_dynamic(v):  # not static: counted as 1 (pytest makes 2); a pytest.fail
    if v > 5:
        pytest.fail("no")


def test_fixture(pair):  # 6 cases, 1 assert
    assert pair


@pytest.mark.parametrize("pair", [0])
def test_overridden(pair):  # the mark replaces the fixture: 1 case
    pass


class TestGroup:
    @pytest.mark.parametrize("n", range(4))
    def test_method(self, n):  # 4 cases, 1 assert
        assert n >= 0

    def helper(self):  # not a test, 1 assert
        assert self


def helper():  # not a test, 1 assert
    assert True
'''
TEST_B = '''
def test_alone():  # 1 case, 1 assert
    assert [1] == [1]
'''
# totals: 8 tests; cases 1 + 6 + 2 + 1 + 6 + 1 + 4 + 1 = 22 (pytest collects 23: make() gives 2);
# asserts 2 + 1 + 1 + 1 + 1 + 1 = 7 in test_a.py, 1 in test_b.py, 1 in conftest.py
EXPECTED_TESTS = {"tests": 8, "cases": 22, "unexpanded": 1, "asserts": 9, "asserts in test files": 8,
                  "asserts in helpers": 1, "pytest.raises": 1, "pytest.warns": 0, "pytest.fail": 1, "assert_*": 1,
                  "test files": 2}
COLLECTED = 23

NOTEBOOK_CELLS = [
    ("markdown", "We assert that this is prose: assert x == 1 is not code."),
    ("code", "%matplotlib inline\n!ls\nx = 1\nassert x == 1, 'named'\nif x:\n    %time y = 2\n    assert y\n"),
    ("code", "files = !ls\ntext = 'assert inside a string'\ncheck('x is one', x == 1)\n"),
    ("code", "%%bash\nassert not python\n"),
    ("code", "%%time\nassert x\n"),
]
# 3 asserts (two in the first code cell, one under %%time), 1 named check


def _notebook(cells):
    return json.dumps({"cells": [{"cell_type": kind, "metadata": {}, "source": source.splitlines(True)}
                                 for kind, source in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _write_tree(root):
    files = {"tests/conftest.py": CONFTEST, "tests/test_a.py": TEST_A, "tests/test_b.py": TEST_B,
             "notebooks/01_demo.ipynb": _notebook(NOTEBOOK_CELLS), "pytest.ini": "[pytest]\ntestpaths = tests\n"}
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as handle:
            handle.write(textwrap.dedent(text).lstrip())


def test_the_counts_of_a_known_tree(tmp_path):
    _write_tree(tmp_path)
    result = count_checks.count(count_checks.read_tree(str(tmp_path)))
    assert result["totals"]["tests"] == EXPECTED_TESTS
    assert result["totals"]["notebooks"] == {"asserts": 3, "checks": 1, "notebooks": 1}
    assert result["tests"]["tests/test_a.py"]["cases"] == 21 and result["tests"]["tests/test_b.py"]["asserts"] == 1
    assert result["unexpanded"] == {"tests/test_a.py": ["test_dynamic"]}
    assert result["test_names"]["tests/test_a.py"] == sorted(
        ["test_plain", "test_product", "test_named", "test_dynamic", "test_fixture", "test_overridden",
         "TestGroup::test_method"])


def test_pytest_collects_the_static_cases_plus_what_was_not_expanded(tmp_path):
    _write_tree(tmp_path)
    collected, per_file = count_checks.collect(str(tmp_path))
    assert collected == COLLECTED == EXPECTED_TESTS["cases"] + 1  # test_dynamic's make() gives 2, counted as 1
    assert per_file == {"tests/test_a.py": 22, "tests/test_b.py": 1}


def test_the_notebook_code_keeps_python_and_drops_magics():
    code = count_checks.notebook_code("%load_ext foo\nx = 1\nout = !ls\nfor i in x:\n    %time f(i)\nthing?\n")
    assert code == "pass\nx = 1\npass\nfor i in x:\n    pass\npass"
    assert count_checks.notebook_code("%%bash\necho hi\n") == ""


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root, check=True,
                   capture_output=True)


def _compare(root, ref, *extra):
    return subprocess.run([sys.executable, TOOL, "--root", str(root), "--compare", ref, *extra],
                          capture_output=True, text=True)


def test_compare_fails_when_an_assert_is_dropped_and_names_it(tmp_path):
    _write_tree(tmp_path)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "before")
    path = tmp_path / "tests" / "test_b.py"
    path.write_text(path.read_text().replace("    assert [1] == [1]\n", "    pass\n"))
    _git(tmp_path, "commit", "-q", "-am", "after: one assert fewer")

    same = _compare(tmp_path, "HEAD")  # the working tree is HEAD
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no total is lower than at HEAD" in same.stdout

    dropped = _compare(tmp_path, "HEAD~1")
    assert dropped.returncode == 1, dropped.stdout + dropped.stderr
    assert "tests asserts: 9 -> 8" in dropped.stdout
    assert "tests/test_b.py: asserts 1 -> 0" in dropped.stdout
    assert "assert no longer anywhere in tests/test_b.py (test_alone): assert [1] == [1]" in dropped.stdout
    data = json.loads(_compare(tmp_path, "HEAD~1", "--json").stdout)
    assert data["went_down"] == ["tests asserts: 9 -> 8"]
    assert data["before"]["totals"]["tests"]["asserts"] == 9 and data["after"]["totals"]["tests"]["asserts"] == 8


def test_compare_passes_when_a_test_moves_to_another_file(tmp_path):
    _write_tree(tmp_path)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "before")
    (tmp_path / "tests" / "test_b.py").unlink()
    with open(tmp_path / "tests" / "test_c.py", "w") as handle:
        handle.write(TEST_B)

    moved = _compare(tmp_path, "HEAD")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "tests/test_b.py: tests 1 -> 0, cases 1 -> 0, asserts 1 -> 0 (file gone)" in moved.stdout
    assert "no longer anywhere" not in moved.stdout
