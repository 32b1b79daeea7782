"""`mxfp16 predict`: top-k from an export, the training view of each image, bad files skipped, CSV/JSON."""
import csv
import io
import json
import shutil

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.export import export_run
from mxfp16.inference.predict import Predictor, image_files

import numpy as np
import pytest
from conftest import CPU_MIXED
from train_support import QUICK, ok, run_train, tiny_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("predict-data"))


@pytest.fixture(scope="module")
def export(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", root / "run", "--epochs", 2, *QUICK))
    # amp-bfloat16 where this CPU runs it: predict reads it as it reads a float32 export, which it gets elsewhere.
    info = export_run(root / "run", root / "mixed", precision=CPU_MIXED, ctx="cpu", log=lambda *_: None)
    return root / "mixed", info


@pytest.fixture
def mixed_folder(data, tmp_path):
    """Four good test images, a truncated JPEG, a text file named .jpg, a .txt file and a hidden file."""
    folder = tmp_path / "images"
    (folder / "nested").mkdir(parents=True)
    good = sorted((data / "test").glob("*/*.jpg"))[:4]
    for i, path in enumerate(good):
        shutil.copy(path, (folder if i % 2 else folder / "nested") / f"{path.parent.name}_{path.name}")
    whole = good[0].read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[:len(whole) * 2 // 3])  # a readable header, no end marker
    (folder / "text.jpg").write_text("not an image at all")
    (folder / "notes.txt").write_text("hello")
    (folder / ".hidden.jpg").write_bytes(good[0].read_bytes())
    return folder


def test_predictions_match_the_agreement_checks_top1_on_the_test_set(data, export):
    folder, info = export
    predictor = Predictor(folder, ctx="cpu")
    files, missing = image_files([data / "test"])
    results, skipped = predictor.predict_files(files, top_k=2, batch_size=5)  # 24 images: a short last batch
    assert missing == [] and skipped == [] and len(results) == 24
    right = sum(r.top[0][0] == r.path.split("/")[-2] for r in results)
    assert right / 24 == pytest.approx(info["agreement"]["top1_export"])
    for r in results:
        probs = [p for _, _, p in r.top]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert [predictor.classes[i] for _, i, _ in r.top] == [name for name, _, _ in r.top]


def test_the_model_sees_each_image_as_the_test_loader_prepared_it(data, export):
    from mxfp16.data import make_loaders
    from mxfp16.data.pipelines import MEAN_RGB, STD_RGB
    from mxfp16.inference import preprocess

    predictor = Predictor(export[0], ctx="cpu")
    first_batch, _ = next(iter(make_loaders(data, image_size=16, batch_size=4).test_batches()))
    first_files = sorted((data / "test").glob("*/*.jpg"))[:4]  # the loader's order: class, then name
    views = [predictor.view(preprocess.decode(str(p))) for p in first_files]
    assert np.array_equal(preprocess.to_batch(views, MEAN_RGB, STD_RGB), first_batch.asnumpy())


def test_bad_files_are_reported_and_skipped_and_csv_keeps_them(export, mixed_folder, tmp_path, capsys):
    out = tmp_path / "p.csv"
    status = main(["predict", "--model", str(export[0]), str(mixed_folder), str(tmp_path / "missing.png"),
                   "--top-k", "2", "--output", str(out), "--ctx", "cpu", "--no-progress"])
    assert status == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 4
    for name, reason in (("truncated.jpg", "truncated JPEG"), ("text.jpg", "not a readable image"),
                         ("notes.txt", "not an image file"), ("missing.png", "no such file or folder")):
        assert f"skipped {tmp_path / 'missing.png' if name == 'missing.png' else mixed_folder / name}: {reason}" \
               in captured.err
    assert ".hidden" not in captured.err + captured.out
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["error"] == "" for r in rows] == [True] * 4 + [False] * 4
    assert list(rows[0]) == ["path", "class_1", "probability_1", "class_2", "probability_2", "error"]
    assert all(float(r["probability_1"]) >= float(r["probability_2"]) for r in rows[:4])


def test_json_output_and_top_k_capped_at_the_classes(export, mixed_folder, tmp_path):
    out = tmp_path / "p.json"
    assert main(["predict", "--model", str(export[0]), str(mixed_folder), "--top-k", "10", "--output", str(out),
                 "--ctx", "cpu", "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert doc["precision"] == CPU_MIXED and len(doc["predictions"]) == 4 and len(doc["skipped"]) == 3
    assert all(len(p["top"]) == 3 for p in doc["predictions"])  # three classes in the tiny set
    assert {s["path"].rsplit("/", 1)[-1] for s in doc["skipped"]} == {"truncated.jpg", "text.jpg", "notes.txt"}


def test_only_bad_files_is_an_error_and_bad_flags_are_refused(export, mixed_folder, tmp_path, capsys):
    assert main(["predict", "--model", str(export[0]), str(mixed_folder / "notes.txt"), "--ctx", "cpu"]) == 2
    assert "no image could be read" in capsys.readouterr().err
    assert main(["predict", "--model", str(export[0]), str(mixed_folder), "--output", str(tmp_path / "p.xml")]) == 2
    assert "name a .csv or a .json file" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path), str(mixed_folder)]) == 2
    assert "is not an mxfp16 export" in capsys.readouterr().err


def test_a_changed_export_is_refused(export, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(export[0], copy)
    with open(copy / bundle.PARAMS_FILE, "r+b") as handle:
        handle.seek(-4, 2)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(ExportError, match="has changed since it was exported"):
        Predictor(copy, ctx="cpu")


def test_a_float16_export_is_refused_on_a_cpu(export, tmp_path):
    copy = tmp_path / "f16"
    shutil.copytree(export[0], copy)
    info = json.loads((copy / bundle.INFO_FILE).read_text())
    info.update(precision="float16", compute_dtype="float16")
    (copy / bundle.INFO_FILE).write_text(json.dumps(info))
    bundle.seal(copy)
    with pytest.raises(ExportError, match="no float16 convolution on a CPU"):
        Predictor(copy, ctx="cpu")
