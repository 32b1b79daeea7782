"""The export format seam: every format module defines the protocol, export.py names none, refusals come first.

Fast: nothing here trains or exports a network. The exports themselves are
tests/test_inference_export.py (MXNet) and tests/test_inference_onnx.py.
"""
import ast
import inspect
import re

from mxfp16.inference import export as export_module
from mxfp16.inference import formats
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.export import export_run

import pytest
from conftest import run_python

#: What mxfp16.inference.formats' docstring says a format module defines.
PROTOCOL = {"NAME": str, "SUMMARY": str, "DEFAULT_PRECISION": str, "check_request": callable, "write": callable,
            "check": callable, "seconds": callable, "load": callable}


@pytest.mark.parametrize("name", formats.names())
def test_every_format_module_defines_the_protocol_with_its_signatures(name):
    module = formats.get(name)
    for attribute, kind in PROTOCOL.items():
        value = getattr(module, attribute)
        assert (callable(value) if kind is callable else isinstance(value, kind)), f"{name}.{attribute}"
    assert module.NAME == name
    assert list(inspect.signature(module.check_request).parameters) == ["precision", "dtypes"]
    assert list(inspect.signature(module.write).parameters) == ["folder", "model", "options"]
    assert list(inspect.signature(module.check).parameters) == ["folder", "files", "section", "inputs"]
    assert list(inspect.signature(module.seconds).parameters) == ["writing", "checking"]
    assert list(inspect.signature(module.load).parameters)[:4] == ["folder", "info", "ctx", "dtype"]


def test_export_py_names_no_format():
    """Format names in export.py's code (docstrings aside) would be a branch the formats' modules should own."""
    tree = ast.parse(inspect.getsource(export_module))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    words = re.compile(r"\b({})\b".format("|".join(formats.names())))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += words.findall(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in formats.names():
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "formats":
            found += [alias.name for alias in node.names if alias.name in formats.names()]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [m for m in modules if re.search(r"\bformats\.", m)]
    assert found == []


def test_an_mxnet_export_refuses_a_float16_file_before_reading_the_run(tmp_path):
    """It used to write the MXNet export and drop the float16 request without a word."""
    with pytest.raises(ExportError, match=r"--onnx-dtype float16 is for --format onnx.*onnx_dtypes is for "
                                          r"model_format='onnx'"):
        export_run(tmp_path / "no-run", tmp_path / "out", model_format="mxnet", onnx_dtypes=("float32", "float16"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_onnx_export_refuses_a_precision_and_an_unknown_dtype_before_reading_the_run(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    with pytest.raises(ExportError, match="--precision amp-bfloat16 with --format onnx: .*--onnx-dtype float16"):
        export_run(tmp_path / "no-run", tmp_path / "out", precision="amp-bfloat16", model_format="onnx")
    with pytest.raises(ExportError, match="--onnx-dtype bfloat16: choose from float32, float16"):
        export_run(tmp_path / "no-run", tmp_path / "out", model_format="onnx", onnx_dtypes=("float32", "bfloat16"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("margin", [-1, 101, float("nan"), "1"])
def test_a_margin_out_of_range_is_refused(margin, tmp_path):
    with pytest.raises(ExportError, match="must be a number of points between 0 and 100"):
        export_run(tmp_path / "no-run", tmp_path / "out", margin=margin)


def test_export_json_keeps_each_formats_seconds():
    assert formats.get("mxnet").seconds(2.0, 3.0) == {"export": 5.0}
    assert formats.get("onnx").seconds(2.0, 3.0) == {"convert_and_write": 2.0, "agreement_check": 3.0}


def test_internals_and_the_format_modules_import_no_mxnet_onnx_or_gluoncv():
    proc = run_python("""
        import sys
        import mxfp16._internals
        from mxfp16.inference import formats
        for name in formats.names():
            formats.get(name)
        print(sorted(m for m in ("mxnet", "onnx", "onnxruntime", "gluoncv") if m in sys.modules))
    """)
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_exporter_hooks_see_every_node_and_are_undone_even_when_a_converter_fails():
    onnx = pytest.importorskip("onnx")
    from mxfp16._internals import mx2onnx_graph

    import mxnet as mx
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph

    before = (inspect.getattr_static(MXNetGraph, "convert_layer").__func__, onnx.checker.check_graph)
    data = mx.sym.var("data")
    symbol = mx.sym.FullyConnected(mx.sym.Activation(data, act_type="relu", name="act"), num_hidden=2, name="fc")
    weights = {"fc_weight": mx.nd.ones((2, 4)), "fc_bias": mx.nd.zeros((2,))}
    seen = []
    graph = mx2onnx_graph(symbol, weights, (4,), 13, seen.append)
    assert {node["name"] for node in seen} >= {"act", "fc"} and len(graph.node) >= 2
    assert (inspect.getattr_static(MXNetGraph, "convert_layer").__func__, onnx.checker.check_graph) == before

    def failing(node):
        if node["name"] == "fc":
            raise ValueError("a converter failed")

    with pytest.raises(ValueError, match="a converter failed"):
        mx2onnx_graph(symbol, weights, (4,), 13, failing)
    assert (inspect.getattr_static(MXNetGraph, "convert_layer").__func__, onnx.checker.check_graph) == before
