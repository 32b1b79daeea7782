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

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.predict import Predictor

import pytest
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
