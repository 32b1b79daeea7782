"""`mxfp16 export --format onnx`: the files, the agreement check in onnxruntime, predict, and every refusal.

One tiny float32 run is trained in a child process; the exports run in this
process (nothing here calls ``amp.init``). A venv without MXNet proves that
``mxfp16 predict`` runs an ONNX export on onnxruntime alone.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.agreement import AgreementError
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.export import export_run
from mxfp16.inference.formats import onnx as onnx_format
from mxfp16.inference.predict import Predictor, image_files
from mxfp16.plumbing.fileio import sha256_file

import numpy as np
import pytest
from conftest import REPO, requires_bfloat16
from train_support import QUICK, ok, run_train, tiny_dataset

pytestmark = pytest.mark.slow
onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("onnx-data"))


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx-run") / "run"
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 2, *QUICK))
    return out


@pytest.fixture(scope="module")
def onnx_export(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx-exports") / "onnx"
    assert main(["export", "--run", str(run), "--out", str(out), "--format", "onnx", "--onnx-dtype", "float16",
                 "--ctx", "cpu"]) == 0
    return out, json.loads((out / bundle.INFO_FILE).read_text())


@pytest.fixture(scope="module")
def mxnet_export(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx-exports") / "f32"
    return out, export_run(run, out, precision="float32", ctx="cpu", log=_quiet)


def test_the_export_holds_both_files_checked_with_their_sha256_and_what_a_runtime_needs(onnx_export):
    out, info = onnx_export
    assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "export.json", "model-float16.onnx", "model.onnx"]
    assert bundle.verify(out).keys() == {"export.json", "model-float16.onnx", "model.onnx"}  # the checksums cover both
    assert info["model_format"] == "onnx" and info["precision"] == "float32"
    assert info["onnx"]["opset"] == 13 and info["onnx"]["files"] == {"float32": "model.onnx",
                                                                     "float16": "model-float16.onnx"}
    for name, entry in info["files"].items():
        assert entry["sha256"] == sha256_file(out / name) and entry["bytes"] == (out / name).stat().st_size
    for dtype, name in info["onnx"]["files"].items():
        model = onnx.load(str(out / name))
        onnx.checker.check_model(model)
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)] and model.ir_version == 7
        # One input with a free batch axis, float32 in and out whatever runs inside; weights are not inputs.
        (inp,), (outp,) = model.graph.input, model.graph.output
        assert inp.name == "data" and outp.name == "logits"
        assert inp.type.tensor_type.elem_type == outp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        dims = inp.type.tensor_type.shape.dim
        assert not dims[0].HasField("dim_value") and [d.dim_value for d in dims[1:]] == [3, 16, 16]
        weights = {t.data_type for t in model.graph.initializer if len(t.dims) == 4}
        assert weights == {onnx.TensorProto.FLOAT if dtype == "float32" else onnx.TensorProto.FLOAT16}
        checked = info["agreement"]["by_dtype"][dtype]
        assert checked["file"] == name and checked["images"] == 24 and checked["nonfinite_images"] == 0
        assert checked["max_score_difference"] <= checked["score_tolerance"]
    assert info["agreement"]["max_score_difference"] == info["agreement"]["by_dtype"]["float32"]["max_score_difference"]


def test_onnx_predictions_are_mxnets_float32_predictions(data, onnx_export, mxnet_export):
    files, _ = image_files([data / "test"])
    reference, _ = Predictor(mxnet_export[0], ctx="cpu").predict_files(files, top_k=3)
    for dtype, places in (("float32", 4), ("float16", 2)):
        predictor = Predictor(onnx_export[0], ctx="cpu", dtype=dtype)
        assert predictor.format == "onnx" and predictor.model.dtype == dtype and predictor.model.device == "cpu"
        results, skipped = predictor.predict_files(files, top_k=3, batch_size=5)
        assert skipped == [] and [r.path for r in results] == [r.path for r in reference]
        assert [r.top[0][0] for r in results] == [r.top[0][0] for r in reference]
        for mine, theirs in zip(results, reference):
            np.testing.assert_almost_equal([p for _, _, p in mine.top][:1], [p for _, _, p in theirs.top][:1], places)
    right = sum(r.top[0][0] == r.path.split("/")[-2] for r in reference)
    assert right / 24 == pytest.approx(onnx_export[1]["agreement"]["top1_export"])


def test_a_changed_onnx_file_is_refused(onnx_export, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(onnx_export[0], copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the weights: the file still parses
    (copy / "model.onnx").write_bytes(bytes(data))
    for dtype in ("float32", "float16"):  # SHA256SUMS covers the folder: one changed file refuses the export
        with pytest.raises(ExportError, match="model.onnx has changed since it was exported"):
            Predictor(copy, ctx="cpu", dtype=dtype)
    shutil.copy(onnx_export[0] / "model.onnx", copy / "model.onnx")
    Predictor(copy, ctx="cpu", dtype="float16")
    (copy / "model-float16.onnx").unlink()
    (copy / "model-float16.onnx").symlink_to(onnx_export[0] / "model-float16.onnx")
    assert main(["predict", "--model", str(copy), "--onnx-dtype", "float16", str(copy), "--no-progress"]) == 2
    assert "outside the export folder" in capsys.readouterr().err
    (copy / "model-float16.onnx").unlink()  # and an export.json whose model file the checksums do not cover
    bundle.seal(copy)
    with pytest.raises(ExportError, match="does not list model-float16.onnx"):
        Predictor(copy, ctx="cpu")


def test_the_float16_check_catches_an_overflow_and_names_float16(run, tmp_path):
    import mxnet as mx

    params = mx.nd.load(str(sorted((run / "checkpoints").glob("*.params"))[-1]))
    # Scores far beyond float16's 65504: the output layer's weights and bias scaled up.
    big = {k: v * 5000 if k.startswith("output.") else v for k, v in params.items()}
    path = tmp_path / "big.params"
    mx.nd.save(str(path), big)
    with pytest.raises(AgreementError, match="beyond float16's range.*float16 is the cause") as caught:
        export_run(run, tmp_path / "x", checkpoint=str(path), ctx="cpu", log=_quiet, model_format="onnx",
                   onnx_dtypes=("float32", "float16"))
    assert "model-float16.onnx" in str(caught.value) and "Nothing was written" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.params"]  # no folder, no staging left
    info = export_run(run, tmp_path / "x", checkpoint=str(path), ctx="cpu", log=_quiet, model_format="onnx")
    assert info["agreement"]["max_abs_score_float32"] > 65504  # float32 holds them


def test_an_amp_precision_with_onnx_is_refused_with_the_reason(run, tmp_path, capsys):
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--format", "onnx", "--precision",
                 "amp-bfloat16", "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "written from the float32 graph" in err and "--onnx-dtype float16" in err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--onnx-dtype", "float16"]) == 2
    assert "--onnx-dtype float16 is for --format onnx" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_operators_without_a_converter_are_refused_naming_the_layer():
    import mxnet as mx
    from mxnet import gluon

    class Unexportable(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(4)

        def hybrid_forward(self, F, x):
            return F.erfinv(F.tanh(self.dense(x)), name="inverse")

    net = Unexportable(prefix="mine_")
    net.initialize()
    net(mx.nd.zeros((1, 3, 4, 4)))
    with pytest.raises(ExportError, match="operator erfinv of layer mine_inverse: .*no converter for it"):
        onnx_format.from_block(net, (3, 4, 4))
    # numpy-mode operators have none either.
    np_graph = mx.sym.np.absolute(mx.sym.var("data").as_np_ndarray()).as_nd_ndarray()
    assert onnx_format.unsupported_operators(np_graph)[0][0] == "_npi_absolute"
    assert "numpy-mode" in onnx_format.unsupported_operators(np_graph)[0][2]


@requires_bfloat16
def test_an_amp_converted_graph_is_refused_saying_what_to_export_instead():
    from mxfp16.inference.convert import deployable
    from mxfp16.models import build_model
    from mxfp16.precision import resolve_precision

    # Its casts have no converter, and the message says what to do instead.
    cnn = build_model("cifar_resnet20_v1", 3, in_shape=(3, 16, 16))
    amp = deployable(cnn, resolve_precision("amp-bfloat16", "cpu"))
    with pytest.raises(ExportError, match="operator amp_cast of layer .*an AMP cast.*--onnx-dtype float16"):
        onnx_format.to_onnx(amp.symbol, amp.params, (3, 16, 16))


# resnet18_v2 has every operator of resnet50_v2 (whose conversion alone takes half a minute here); the export of a
# trained ResNet-50 v2 is docs/inference.md's recorded run.
@pytest.mark.parametrize("model,size", [("resnet18_v2", 32), ("transformer-encoder", 8), ("lstm-classifier", 8)])
def test_reference_and_zoo_networks_convert_and_agree_in_onnxruntime(model, size):
    from mxfp16.models import build_model

    import mxnet as mx

    net = build_model(model, 5, in_shape=(3, size, size))
    x = np.random.RandomState(0).standard_normal((3, 3, size, size)).astype(np.float32)
    expected = net(mx.nd.array(x)).asnumpy()
    converted = onnx_format.from_block(net, (3, size, size))
    session = onnxruntime.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"data": x})[0]
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-4 * max(1, np.abs(expected).max())


def test_an_onnx_without_onnx_mapping_is_named_with_the_install_that_works(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnx.mapping" else real(name, *a))
    with pytest.raises(ExportError, match=r"no onnx.mapping.*mxfp16\[onnx\]"):
        onnx_format.check_exporter()


#: What the venv without MXNet gets: the packages `mxfp16 predict` needs for an ONNX export, nothing more.
NO_MXNET_PACKAGES = ("numpy", "onnxruntime", "Pillow", "tqdm")


def test_predict_runs_an_onnx_export_in_a_venv_without_mxnet(data, onnx_export, mxnet_export, tmp_path):
    venv = tmp_path / "venv"
    start = time.perf_counter()
    # No pip of its own (bootstrapping one costs seconds): this environment's pip installs into it, from its cache.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                          "--disable-pip-version-check", "--only-binary=:all:",
                          "-c", os.path.join(REPO, "constraints.txt"), *NO_MXNET_PACKAGES],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    installed = time.perf_counter() - start
    env = dict(os.environ, PYTHONPATH=REPO)
    absent = subprocess.run([python, "-c", "import mxnet"], capture_output=True, text=True, env=env, timeout=60)
    assert absent.returncode != 0 and "No module named 'mxnet'" in absent.stderr
    out = tmp_path / "p.json"
    proc = subprocess.run([python, "-m", "mxfp16", "predict", "--model", str(onnx_export[0]), str(data / "test"),
                           "--top-k", "3", "--output", str(out), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    files, _ = image_files([data / "test"])
    here, _ = Predictor(onnx_export[0], ctx="cpu").predict_files(files, top_k=3)
    assert [p["path"] for p in document["predictions"]] == [r.path for r in here]
    assert [p["top"][0]["class"] for p in document["predictions"]] == [r.top[0][0] for r in here]
    assert np.allclose([[t["probability"] for t in p["top"]] for p in document["predictions"]],
                       [[prob for _, _, prob in r.top] for r in here], atol=1e-6)
    # An MXNet export there is refused with the install that runs it, not a traceback.
    refused = subprocess.run([python, "-m", "mxfp16", "predict", "--model", str(mxnet_export[0]), str(data / "test")],
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "needs MXNet 1.9.1, which is not installed" in refused.stderr and "mxfp16[cpu]" in refused.stderr
    print(f"venv without MXNet: {installed:.1f} s to create and install {', '.join(NO_MXNET_PACKAGES)}")


def test_the_check_counts_non_finite_scores_and_blames_float16_only_for_float16():
    from mxfp16.inference.agreement import check_scores, compare

    import mxnet as mx

    class Scores:
        numpy_input = True

        def __init__(self, overflow):
            self.overflow = overflow

        def __call__(self, batch):
            scores = batch.reshape(len(batch), -1)[:, :3].astype(np.float64) * 10
            if self.overflow:
                scores[::2, 0] = np.inf  # what a float16 layer returns past 65504
            return scores

    rng = np.random.RandomState(0)
    batches = [(mx.nd.array(rng.standard_normal((4, 3, 2, 2))), mx.nd.array(rng.randint(0, 3, 4)))
               for _ in range(2)]
    same = compare(Scores(False), Scores(False), batches, mx.cpu())
    assert same["max_score_difference"] == 0 and same["nonfinite_images"] == 0 and same["changed_images"] == 0
    assert check_scores(same, "float32", "model.onnx") == pytest.approx(1e-4 * same["max_abs_score_float32"])
    broken = compare(Scores(False), Scores(True), batches, mx.cpu())
    assert broken["nonfinite_images"] == 4 and np.isfinite(broken["max_probability_difference"])
    with pytest.raises(AgreementError, match="4 of 8 test images.*float16 overflowed"):
        check_scores(broken, "float16", "model-float16.onnx")
    with pytest.raises(AgreementError, match="computes inf or NaN where float32 MXNet does not"):
        check_scores(broken, "float32", "model.onnx")
    shifted = dict(same, max_score_difference=0.2, max_abs_score_float32=100.0)
    with pytest.raises(AgreementError, match="beyond the float32 tolerance of 0.01"):
        check_scores(shifted, "float32", "model.onnx")
    assert check_scores(shifted, "float16", "model-float16.onnx") == pytest.approx(5.0)
