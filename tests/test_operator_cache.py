"""MXNet's operator functions compiled once per machine (:mod:`mxfp16.machine.operator_cache`).

What a process did is read from ``mxfp16 info``'s source (``stack_report()['operator_cache']``); each import runs in a
fresh interpreter, since MXNet loads once per process. The functions a process got from the file are checked
against MXNet's own: each one's source generated again by MXNet's register modules and compiled here.
"""
import ctypes
import json
import subprocess
import sys

from mxfp16.machine import operator_cache

import pytest
from conftest import REPO, child_env, last_line_json

#: A child's report: what the cache did, and every generated function of ``mx.nd.op`` and ``mx.sym.op`` that
#: differs from a fresh compile of the source MXNet's own generator writes for it in this process.
REPORT = """
import ctypes, json, types
import mxfp16, mxnet as mx
from mxnet.base import _LIB, OpHandle, c_str, check_call
from mxnet.ndarray.register import _generate_ndarray_function_code
from mxnet.symbol.register import _generate_symbol_function_code
from mxfp16.machine.stack import stack_report

checked, differ = 0, []
for module, generate in ((mx.nd.op, _generate_ndarray_function_code), (mx.sym.op, _generate_symbol_function_code)):
    for name, fn in sorted(vars(module).items()):
        if not isinstance(fn, types.FunctionType) or fn.__code__.co_filename != "<string>":
            continue
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        source, _ = generate(handle, name, name)
        fresh = [c for c in compile(source, "<string>", "exec").co_consts if isinstance(c, types.CodeType)]
        checked += 1
        if fresh != [fn.__code__]:
            differ.append(module.__name__ + "." + name)
ones = mx.nd.ones((2, 3))
print(json.dumps({"cache": stack_report()["operator_cache"], "checked": checked, "differ": differ,
                  "sum": float((ones * 2).sum().asscalar()),
                  "symbol": (mx.sym.var("a") + 1).list_arguments()}))
"""


def _import(cache_dir):
    env = {"MXFP16_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=180,
                          env=child_env(env), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_line_json(proc.stdout)


def _works(seen):
    assert seen["checked"] > 500 and not seen["differ"], seen["differ"][:10]
    assert seen["sum"] == 12.0 and seen["symbol"] == ["a"]


@pytest.fixture(scope="module")
def two_imports(tmp_path_factory):
    """Two processes in turn on one empty cache folder: the first compiles and keeps, the second reads."""
    folder = tmp_path_factory.mktemp("operator-cache")
    return folder, _import(folder), _import(folder)


def test_the_first_import_compiles_and_keeps_the_functions(two_imports):
    folder, first, _ = two_imports
    cache = first["cache"]
    assert cache["read"] == 0 and cache["compiled"] > 1000 and cache["written"] is True
    assert cache["file"] == str(folder / f"mxnet-operators.{sys.implementation.cache_tag}.marshal")
    _works(first)


def test_the_next_import_compiles_nothing_and_gets_mxnets_own_functions_with_its_own_handles(two_imports):
    _, first, second = two_imports
    cache = second["cache"]
    assert cache["compiled"] == 0 and cache["written"] is False
    assert cache["read"] == first["cache"]["compiled"]
    _works(second)  # each function equals a fresh compile of MXNet's source, which holds this process's handle


@pytest.mark.parametrize("damage", ["cut", "flipped", "other-format", "writable-by-others"])
def test_a_damaged_or_unsafe_file_is_not_read_but_compiled_anew_and_rewritten(two_imports, tmp_path, damage):
    folder, first, _ = two_imports
    name = first["cache"]["file"].rsplit("/", 1)[1]
    kept = (folder / name).read_bytes()
    damaged = {"cut": kept[:len(kept) // 2],
               "flipped": kept[:-10] + bytes([kept[-10] ^ 0xFF]) + kept[-9:],
               "other-format": b"not" + kept[3:]}.get(damage, kept)
    (tmp_path / name).write_bytes(damaged)
    if damage == "writable-by-others":  # intact, but anyone could have put code in it
        (tmp_path / name).chmod(0o666)
    seen = _import(tmp_path)
    assert seen["cache"]["read"] == 0 and seen["cache"]["compiled"] == first["cache"]["compiled"]
    assert seen["cache"]["written"] is True
    _works(seen)


def test_a_cache_folder_that_cannot_be_made_costs_only_the_compiling(tmp_path):
    (tmp_path / "a-file").write_text("")
    seen = _import(tmp_path / "a-file" / "cache")
    assert seen["cache"]["compiled"] > 1000 and seen["cache"]["written"] is False
    _works(seen)


def invoke(*args):
    """What a kept function calls (MXNet's are ``_imperative_invoke``): a global of the caller of ``exec``."""
    return args


def _make_function(exec_, handle):
    """Builds an operator's function as MXNet's ``_make_ndarray_function(handle, ...)`` does."""
    local = {}
    exec_("def Op(x):\n    return invoke(%d, x, 'Op')\n" % handle.value, None, local)
    return local["Op"]


def test_a_kept_function_takes_the_handle_of_the_process_that_uses_it():
    first = operator_cache.CompiledOperators()
    first.codes = {}  # no file: what this instance compiles is all it holds
    assert _make_function(first, ctypes.c_void_p(123456789))("x") == (123456789, "x", "Op")
    assert first.stats["compiled"] == 1

    second = operator_cache.CompiledOperators()
    second.codes = dict(first.used)  # what the file would hold
    kept, builtin = (_make_function(e, ctypes.c_void_p(987654321)) for e in (second, exec))
    assert kept("y") == builtin("y") == (987654321, "y", "Op")
    assert kept.__code__ == builtin.__code__  # column positions included
    assert second.stats["compiled"] == 0


def test_the_file_is_rewritten_with_what_this_process_used_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("MXFP16_CACHE_DIR", str(tmp_path))
    stale = operator_cache.CompiledOperators()
    stale.code("def Old(): pass\n")  # another MXNet build's function
    stale.save()
    assert stale.stats["written"] is True

    current = operator_cache.CompiledOperators()
    assert current.code("def New(): pass\n").co_consts[0].co_name == "New"
    assert current.stats == {"file": str(tmp_path / operator_cache.cache_file().rsplit("/", 1)[1]), "read": 1,
                             "compiled": 1, "written": False}
    current.save()
    assert current.stats["written"] is True and current.codes == {}  # let go once MXNet has loaded
    again = operator_cache.CompiledOperators()
    again.code("def New(): pass\n")
    assert again.stats["read"] == 1 and again.stats["compiled"] == 0  # New alone: Old was not carried over


def test_a_source_that_holds_its_handle_twice_is_kept_as_it_is():
    cache = operator_cache.CompiledOperators()
    cache.codes = {}
    source = "x = 42\ny = 42\n"
    code = cache.code(source, handle=42)
    namespace = {}
    exec(code, namespace)
    assert (namespace["x"], namespace["y"]) == (42, 42)
    assert cache.stats["compiled"] == 1


def test_info_says_what_the_cache_did():
    from mxfp16.commands.info import _operator_cache_text

    path = "/c/mxnet-operators.marshal"
    read = _operator_cache_text({"file": path, "read": 2334, "compiled": 0, "written": False})
    assert read == f"2334 read from {path}"
    assert "could not be kept" in _operator_cache_text({"file": path, "read": 0, "compiled": 5, "written": False})
    assert "compiled by MXNet" in _operator_cache_text({"file": None, "read": 0, "compiled": 0, "written": False})
    json.dumps(operator_cache.EXEC.stats)  # the report is JSON (mxfp16 info --json)
