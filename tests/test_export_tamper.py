"""A tampered export is refused with a message: checksums cover export.json, values are checked against the model.

Each case of issue 37's "a tampered export is believed" is made on a copy of
a small export (tests/export_support.py), usually with ``SHA256SUMS``
rewritten to match, so that the check under test, not the checksum, is what
refuses it. No message may print a file's content.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.predict import Predictor

import numpy as np
import pytest
from conftest import REPO
from export_support import CLASSES, images, tiny_export, tiny_network


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return tiny_export(tmp_path_factory.mktemp("tamper") / "export")


@pytest.fixture
def copy(export, tmp_path):
    return shutil.copytree(export, tmp_path / "copy", symlinks=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    images(folder)
    return folder


def _edit_info(folder, reseal=True, **changes):
    info = json.loads((folder / bundle.INFO_FILE).read_text())
    for key, value in changes.items():
        if key in info["preprocess"]:
            info["preprocess"][key] = value
        else:
            info[key] = value
    (folder / bundle.INFO_FILE).write_text(json.dumps(info))
    if reseal:
        bundle.seal(folder)


def _refused(folder, photos, capsys, *phrases):
    """``mxfp16 predict`` on ``folder`` exits 2 with one error line holding each phrase; returns it."""
    assert main(["predict", "--model", str(folder), str(photos), "--ctx", "cpu", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and not captured.out
    for phrase in phrases:
        assert phrase in captured.err, captured.err
    return captured.err


def test_the_untouched_export_predicts(export, photos, capsys):
    assert main(["predict", "--model", str(export), str(photos), "--ctx", "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().out.count("circle") == 3


def test_sha256sums_covers_export_json_and_every_model_file(export):
    lines = (export / bundle.CHECKSUM_FILE).read_text().splitlines()
    listed = {line.split()[1]: line.split()[0] for line in lines}
    # An MXNet export's files; bundle.FILES also names the ONNX format's, which this export does not hold.
    assert (set(listed) == {bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE}
            and set(listed) <= set(bundle.FILES))
    for name, digest in listed.items():  # independent of the library: hashlib over the bytes
        assert digest == hashlib.sha256((export / name).read_bytes()).hexdigest()


def test_an_edited_export_json_is_refused_by_its_checksum(copy, photos, capsys):
    _edit_info(copy, reseal=False, classes=list(reversed(CLASSES)))  # valid JSON, valid values: only the sum knows
    _refused(copy, photos, capsys, "export.json has changed since it was exported", bundle.CHECKSUM_FILE)


def test_an_export_without_sha256sums_is_refused(copy, photos, capsys):
    (copy / bundle.CHECKSUM_FILE).unlink()
    _refused(copy, photos, capsys, "has no SHA256SUMS", "Export the run again")


@pytest.mark.parametrize("names", [CLASSES + ["dog", "cat"], CLASSES[:1]], ids=["five names", "one name"])
def test_classes_must_be_one_name_per_output(copy, photos, capsys, names):
    _edit_info(copy, classes=names)
    _refused(copy, photos, capsys, f"lists {len(names)} classes", f"gives {len(CLASSES)} outputs per image")


def test_an_image_size_of_zero_is_refused_not_blamed_on_the_images(copy, photos, capsys):
    _edit_info(copy, image_size=0, center_crop=0)
    err = _refused(copy, photos, capsys, "image_size 0 is outside 8..4096")
    assert "cannot decode" not in err


def test_a_zero_standard_deviation_is_refused(copy, photos, capsys):
    _edit_info(copy, std_rgb=[0, 0, 0])
    _refused(copy, photos, capsys, "std_rgb is not three numbers in 0.001..1")


def test_a_graph_that_is_a_link_out_of_the_folder_is_refused_and_not_read(copy, photos, capsys):
    target = "/etc/passwd"
    (copy / bundle.SYMBOL_FILE).unlink()
    os.symlink(target, copy / bundle.SYMBOL_FILE)
    # Checksums rewritten to match, as a deliberate tamperer would: the link check must refuse it on its own.
    sums = (copy / bundle.CHECKSUM_FILE).read_text().splitlines()
    digest = hashlib.sha256(open(target, "rb").read()).hexdigest()
    (copy / bundle.CHECKSUM_FILE).write_text("".join(
        (f"{digest}  {bundle.SYMBOL_FILE}" if line.endswith(bundle.SYMBOL_FILE) else line) + "\n" for line in sums))
    err = _refused(copy, photos, capsys, "is a link to /etc/passwd, outside the export folder")
    first_line = open(target).readline().strip()
    assert first_line and first_line not in err


def test_a_link_to_another_file_of_the_folder_is_fine(copy, photos, capsys):
    os.replace(copy / bundle.SYMBOL_FILE, copy / "graph.json")
    os.symlink("graph.json", copy / bundle.SYMBOL_FILE)
    assert main(["predict", "--model", str(copy), str(photos), "--ctx", "cpu", "--no-progress"]) == 0
    capsys.readouterr()


def test_another_models_parameters_are_refused_before_mxnet_loads_them(copy, photos, capsys, tmp_path):
    other = tiny_export(tmp_path / "other", tiny_network(outputs=5, seed=1))
    shutil.copy(other / bundle.PARAMS_FILE, copy / bundle.PARAMS_FILE)
    bundle.seal(copy)
    _refused(copy, photos, capsys, "model-0000.params does not fit the graph", "belong to another model")


def _graph(folder):
    return json.loads((folder / bundle.SYMBOL_FILE).read_text())


def test_a_cyclic_graph_is_refused_before_mxnet_parses_it(copy, photos, capsys):
    graph = _graph(copy)
    first = next(i for i, n in enumerate(graph["nodes"]) if n["inputs"])
    graph["nodes"][first]["inputs"][0] = [len(graph["nodes"]) - 1, 0, 0]  # reads the output it feeds
    (copy / bundle.SYMBOL_FILE).write_text(json.dumps(graph))
    bundle.seal(copy)
    _refused(copy, photos, capsys, f"node {first} reads an input that is not an earlier node", "a cycle")


def test_a_graph_of_200000_nodes_is_refused(copy, photos, capsys):
    chain = ",".join(f'{{"op": "relu", "name": "r{i}", "inputs": [[{i}, 0, 0]]}}' for i in range(200_000))
    (copy / bundle.SYMBOL_FILE).write_text(f'{{"nodes": [{{"op": "null", "name": "data", "inputs": []}}, {chain}], '
                                           '"arg_nodes": [0], "heads": [[200000, 0, 0]]}')
    bundle.seal(copy)
    _refused(copy, photos, capsys, "has more than 100,000 nodes")


def test_a_graph_just_within_the_bounds_is_checked_whole(tmp_path):
    from mxfp16.plumbing.symbol_file import MAX_DEPTH, GraphFileError, check_graph

    path = tmp_path / "deep.json"
    chain = ",".join(f'{{"op": "relu", "name": "r{i}", "inputs": [[{i}, 0, 0]]}}' for i in range(MAX_DEPTH + 1))
    path.write_text(f'{{"nodes": [{{"op": "null", "name": "data", "inputs": []}}, {chain}], "arg_nodes": [0], '
                    f'"heads": [[{MAX_DEPTH + 1}, 0, 0]]}}')
    with pytest.raises(GraphFileError, match="more than 20,000 nodes deep"):
        check_graph(path)


def test_a_300_mb_graph_is_refused_before_it_is_read(copy, photos, capsys):
    with open(copy / bundle.SYMBOL_FILE, "r+b") as handle:  # sparse: no disk space, and never read whole
        handle.truncate(300 << 20)
    bundle.seal(copy)
    _refused(copy, photos, capsys, "model-symbol.json is 300 MB, more than the 32 MB")


def test_a_graph_that_is_not_json_is_refused_without_quoting_it(copy, photos, capsys):
    secret = "root:x:0:0:secret-first-line"
    (copy / bundle.SYMBOL_FILE).write_text(secret + "\n")
    bundle.seal(copy)
    err = _refused(copy, photos, capsys, "model-symbol.json is not valid JSON")
    assert secret not in err


def test_the_library_raises_the_same_errors(copy):
    _edit_info(copy, classes=CLASSES + ["dog"])
    with pytest.raises(ExportError, match="lists 4 classes"):
        Predictor(copy, ctx="cpu")


# ---- ONNX exports: the same refusals (issue 42, cases 6 and 15) ----------------------------------
@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return tiny_export(tmp_path_factory.mktemp("tamper-onnx") / "export", model_format="onnx")


@pytest.fixture
def onnx_copy(onnx_export, tmp_path):
    return shutil.copytree(onnx_export, tmp_path / "onnx-copy", symlinks=True)


def _replace_model(folder, data):
    """Write ``data`` as model.onnx with export.json's entry and SHA256SUMS updated, as a deliberate tamperer would."""
    (folder / "model.onnx").write_bytes(data)
    info = json.loads((folder / bundle.INFO_FILE).read_text())
    info["files"]["model.onnx"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / bundle.INFO_FILE).write_text(json.dumps(info))
    bundle.seal(folder)


def test_the_untouched_onnx_export_predicts(onnx_export, photos, capsys):
    assert main(["predict", "--model", str(onnx_export), str(photos), "--ctx", "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().out.count("image-") == 3


@pytest.mark.parametrize("names", [CLASSES + ["dog"], CLASSES[:2]], ids=["four names", "two names"])
def test_onnx_classes_must_be_one_name_per_output(onnx_copy, photos, capsys, names):
    _edit_info(onnx_copy, classes=names)
    _refused(onnx_copy, photos, capsys, f"export.json lists {len(names)} classes but", "model.onnx gives "
             f"{len(CLASSES)} scores per image", "the labels would not be the model's")
    with pytest.raises(ExportError, match=f"lists {len(names)} classes"):
        Predictor(onnx_copy, ctx="cpu")


@pytest.mark.parametrize("damage", ["cut in half", "not a model", "an operator onnxruntime lacks", "two outputs"])
def test_a_damaged_onnx_model_is_an_export_error_naming_the_file(onnx_copy, photos, capsys, damage):
    import onnx

    raw = (onnx_copy / "model.onnx").read_bytes()
    model = onnx.load_from_string(raw)
    if damage == "an operator onnxruntime lacks":
        model.graph.node[0].op_type = "NoSuchOperator"
    elif damage == "two outputs":
        model.graph.output.extend([model.graph.output[0]])
    _replace_model(onnx_copy, {"cut in half": raw[:len(raw) // 2], "not a model": b"\x00" * 64 + raw[64:]}.get(
        damage, model.SerializeToString()))
    err = _refused(onnx_copy, photos, capsys, f"{onnx_copy / 'model.onnx'} ")
    assert "export the run again" in err and "onnxruntime_pybind11_state" not in err
    assert "NoSuchOperator" not in err  # what the file holds is not quoted


def test_onnx_external_data_is_refused_and_not_read(onnx_copy, photos, tmp_path):
    import onnx

    fifo = tmp_path / "weights-elsewhere"
    os.mkfifo(fifo)  # opening it to read would wait for a writer: a reader that tried would hang
    model = onnx.load_from_string((onnx_copy / "model.onnx").read_bytes())
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=str(fifo))
    _replace_model(onnx_copy, model.SerializeToString())
    proc = subprocess.run([sys.executable, "-m", "mxfp16", "predict", "--model", str(onnx_copy), str(photos),
                           "--ctx", "cpu", "--no-progress"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not proc.stdout, proc.stderr
    assert "keeps 1 tensor(s) in other files (ONNX external data)" in proc.stderr
    assert str(fifo) not in proc.stderr  # the file's content (where it points) is not printed


def test_scores_of_another_width_are_refused_whatever_model_gave_them(export, photos):
    predictor = Predictor(export, ctx="cpu")
    predictor.model = lambda batch: np.zeros((len(batch), len(CLASSES) + 1), dtype=np.float32)
    with pytest.raises(ExportError, match=f"lists {len(CLASSES)} classes"):
        predictor.predict_files(images(photos))
