"""The sequence reference models and the digits set they train on."""
import json

from mxfp16.data import DataError
from mxfp16.data.digits import digits_dataset
from mxfp16.models import SEQUENCE_MODELS, LSTMClassifier, ModelError, SelfAttention, build_model

import mxnet as mx
import numpy as np
import pytest
from conftest import CPU_MIXED
from PIL import Image
from train_support import ok, run_train


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return digits_dataset(tmp_path_factory.mktemp("digits") / "digits")


def test_digits_folder_holds_every_scan_once_stratified(digits):
    from sklearn.datasets import load_digits

    source = load_digits()
    manifest = json.loads((digits / "manifest.json").read_text())
    assert manifest["augment"] == "none" and manifest["size"] == 8
    files = {split: sorted((digits / split).glob("*/*.png")) for split in ("train", "test")}
    indices = [int(p.stem) for split in files.values() for p in split]
    assert sorted(indices) == list(range(len(source.target)))  # each scan exactly once
    for digit in range(10):
        held = len(list((digits / "test" / str(digit)).glob("*.png")))
        total = int((source.target == digit).sum())
        assert abs(held - 0.25 * total) <= 1
    sample = files["test"][0]
    pixels = np.asarray(Image.open(sample))[:, :, 0]
    assert int(sample.parent.name) == source.target[int(sample.stem)]
    np.testing.assert_array_equal(pixels, np.round(source.images[int(sample.stem)] * 255 / 16).astype(np.uint8))


def test_digits_reuses_refuses_and_replaces(digits, tmp_path):
    stamp = (digits / "manifest.json").stat().st_mtime_ns
    digits_dataset(digits)  # same settings: nothing rewritten
    assert (digits / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="other settings"):
        digits_dataset(digits, seed=1)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("user file")
    with pytest.raises(DataError, match="not a digits folder"):
        digits_dataset(other)
    assert (other / "keep.txt").read_text() == "user file"
    with pytest.raises(DataError, match="test_fraction"):
        digits_dataset(tmp_path / "x", test_fraction=0.0)


def test_lstm_reads_rows_as_time_steps():
    net = LSTMClassifier(3, hidden=4, prefix="rows_")
    net.initialize()
    x = np.random.RandomState(0).rand(2, 3, 5, 4).astype(np.float32)
    rows = mx.nd.reshape(mx.nd.transpose(mx.nd.array(x), axes=(0, 2, 1, 3)), shape=(0, 0, -1)).asnumpy()
    expected = x.transpose(0, 2, 1, 3).reshape(2, 5, 12)  # step h = row h of every channel
    np.testing.assert_array_equal(rows, expected)
    assert net(mx.nd.array(x)).shape == (2, 3)


def _attention_float64(x, layer, heads):
    """Multi-head self-attention in numpy float64, from the layer's weights."""
    w = {name.split("_")[-2] + "_" + name.split("_")[-1]: p.data().asnumpy().astype(np.float64)
         for name, p in layer.collect_params().items()}
    def dense(v, key):
        return v @ w[f"{key}_weight"].T + w[f"{key}_bias"]
    n, t, u = x.shape
    d = u // heads
    def split(v):
        return v.reshape(n, t, heads, d).transpose(0, 2, 1, 3)
    q, k, v = (split(dense(x, name)) for name in ("dense0", "dense1", "dense2"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(n, t, u)
    return dense(context, "dense3")


@pytest.mark.parametrize("hybrid", [False, True])
def test_self_attention_matches_numpy_float64(hybrid):
    layer = SelfAttention(8, heads=2, prefix="att_")
    layer.initialize(mx.init.Xavier())
    if hybrid:
        layer.hybridize()
    x = np.random.RandomState(1).randn(3, 5, 8)
    out = layer(mx.nd.array(x)).asnumpy()
    np.testing.assert_allclose(out, _attention_float64(x, layer, 2), rtol=1e-4, atol=1e-5)


def test_build_sequence_models_needs_a_shape_and_no_pretrained():
    for name in SEQUENCE_MODELS:
        net = build_model(name, 10, in_shape=(3, 8, 8))
        assert net(mx.nd.zeros((2, 3, 8, 8))).shape == (2, 10)
        with pytest.raises(ModelError, match="in_shape"):
            build_model(name, 10)
        with pytest.raises(ModelError, match="pretrained"):
            build_model(name, 10, pretrained=True, in_shape=(3, 8, 8))


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_sequence_model_learns_digits_in_float32_and_mixed_precision(digits, model, tmp_path):
    results = {}
    for precision in dict.fromkeys(("float32", CPU_MIXED)):
        out = tmp_path / precision
        ok(run_train("--data-dir", digits, "--model", model, "--image-size", "8", "--epochs", "2",
                     "--batch-size", "32", "--optimizer", "adam", "--lr", "0.003", "--precision", precision,
                     "--out", out, "--no-progress"))
        results[precision] = json.loads((out / "summary.json").read_text())
    for summary in results.values():
        assert summary["final_val_top1"] > 0.5  # chance is 0.1
    assert abs(results["float32"]["final_val_top1"] - results[CPU_MIXED]["final_val_top1"]) < 0.1
    _exports_to_onnx_and_predicts_what_it_checked(tmp_path / "float32", digits)


def _exports_to_onnx_and_predicts_what_it_checked(run, digits):
    """The trained float32 run as ONNX (float32 and float16): both pass the check; predict agrees with it."""
    pytest.importorskip("onnxruntime")
    from mxfp16.inference.export import export_run
    from mxfp16.inference.predict import Predictor, image_files

    info = export_run(run, run.parent / "onnx", ctx="cpu", log=lambda *_: None, model_format="onnx",
                      onnx_dtypes=("float32", "float16"))
    for dtype, checked in info["agreement"]["by_dtype"].items():  # export_run refuses a file that misses
        assert checked["max_score_difference"] <= checked["score_tolerance"] and checked["nonfinite_images"] == 0
        files, _ = image_files([digits / "test"])
        results, skipped = Predictor(run.parent / "onnx", ctx="cpu", dtype=dtype).predict_files(files, top_k=1)
        right = sum(r.top[0][0] == r.path.split("/")[-2] for r in results)
        assert skipped == [] and right / len(results) == pytest.approx(checked["top1_export"])


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_diagnose_reads_a_hybridized_sequence_model_on_digits(digits, model):
    from mxfp16.diagnostics import diagnose
    from mxfp16.diagnostics.layers import leaf_blocks

    from mxnet import gluon

    net = build_model(model, 10, in_shape=(3, 8, 8))
    net.hybridize()
    images = sorted((digits / "train").glob("*/*.png"))[:16]
    x = mx.nd.array(np.stack([np.asarray(Image.open(p)).transpose(2, 0, 1) / 255.0 for p in images]))
    y = mx.nd.array([int(p.parent.name) for p in images])
    diagnosis = diagnose(net, gluon.loss.SoftmaxCrossEntropyLoss(), [(x, y)], loss_scale=1024)
    parameters = [s for s in diagnosis.stats if s.kind == "parameter"]
    activations = [s for s in diagnosis.stats if s.kind == "activation"]
    assert [s.name for s in parameters] == list(net.collect_params().keys())
    # in the order the layers ran (attention's dropout before its output projection)
    assert sorted(s.name for s in activations) == sorted(b.name for b in leaf_blocks(net))
    assert all(s.count > 0 and s.max_abs > 0 for s in parameters if not s.name.endswith("position"))
    assert net._active  # hybridized again afterwards
