"""Every GluonCV classification model builds and type-checks under mxfp16's AMP lists, for both targets.

The models come from ``gluoncv.model_zoo`` itself (:func:`mxfp16.amp.zoo.classification_models`),
so a model GluonCV adds is covered. Building needs no weights and no
arithmetic: it runs on any CPU. Where bfloat16 runs, one model per family
also trains three SGD steps against a float32 control
(``tests/amp_zoo_child.py``, one process per precision).
"""
import json
import os
import subprocess
import sys

from mxfp16.amp import zoo as amp_zoo

import numpy as np
import pytest
from conftest import REPO, child_env, last_line_json, requires_bfloat16, run_python

CHILD = os.path.join(REPO, "tests", "amp_zoo_child.py")


@pytest.fixture(scope="module")
def zoo():
    """``{target: rows}`` for bfloat16 and float16, built in two processes side by side."""
    return amp_zoo.generate()


def test_every_classification_model_builds_and_type_checks_under_both_targets(zoo):
    assert set(zoo) == {"bfloat16", "float16"}
    names = amp_zoo.classification_models()
    for target, rows in zoo.items():
        assert [r["model"] for r in rows] == names
        failed = {r["model"]: r["error"] for r in rows if "error" in r}
        unexpected = {n: e for n, e in failed.items() if n not in amp_zoo.BROKEN_IN_GLUONCV}
        assert not unexpected, f"under amp-{target}: {json.dumps(unexpected, indent=1)}"
        for name, error in failed.items():
            assert amp_zoo.BROKEN_IN_GLUONCV[name] in error, (name, error)
        for row in rows:
            if "error" not in row:
                assert 0 < row["low_operators"] <= row["operators"], row
                assert 0 < row["low_gemm_flops"] <= row["gemm_flops"], row


def test_densenet_builds_now_that_its_concat_is_a_join(zoo):
    rows = {r["model"]: r for r in zoo["bfloat16"]}
    for name in ("densenet121", "densenet161", "densenet169", "densenet201", "shufflenet_v2"):
        assert "error" not in rows[name], rows[name]


def test_the_models_gluoncv_cannot_build_fail_without_amp_too():
    code = f"""
        import warnings
        warnings.simplefilter("ignore")
        import mxfp16, mxnet as mx
        from mxfp16.models.gluoncv import import_gluoncv
        zoo = import_gluoncv().model_zoo
        for name in {sorted(amp_zoo.BROKEN_IN_GLUONCV)!r}:
            try:
                zoo.get_model(name, pretrained=False)(mx.sym.var("data"))
                print(name, "builds")
            except Exception as err:
                print(name, "fails:", str(err).splitlines()[-1])
    """
    out = run_python(code).stdout
    for name, error in amp_zoo.BROKEN_IN_GLUONCV.items():
        assert f"{name} fails:" in out and error in out, f"{name} now builds in float32: drop it from " \
                                                         f"BROKEN_IN_GLUONCV\n{out}"


def test_the_list_is_gluoncvs_own_so_a_new_model_is_covered(monkeypatch):
    from mxfp16.models.gluoncv import import_gluoncv

    registry = import_gluoncv().model_zoo.model_zoo._models

    def new_classifier(**kwargs):
        return registry["resnet18_v1"](**kwargs)

    new_classifier.__module__ = "gluoncv.model_zoo.some_new_family"
    monkeypatch.setitem(registry, "some_new_classifier", new_classifier)
    names = amp_zoo.classification_models()
    assert "some_new_classifier" in names
    for family in ("resnet50_v1", "resnet50_v2", "resnet50_v1d", "resnext50_32x4d", "se_resnet50_v1",
                   "mobilenet1.0", "mobilenetv2_1.0", "mobilenetv3_small", "densenet121", "vgg16", "vgg16_bn",
                   "squeezenet1.1", "inceptionv3", "googlenet", "alexnet", "darknet53", "cifar_resnet20_v1",
                   "cifar_wideresnet16_10", "cifar_resnext29_32x4d", "resnest50"):
        assert family in names
    for task in ("ssd_300_vgg16_atrous_voc", "fcn_resnet50_voc", "yolo3_darknet53_coco", "resnet50_v1_int8",
                 "simple_pose_resnet18_v1b", "i3d_resnet50_v1_kinetics400"):
        assert task not in names


def test_the_models_view_in_the_docs_is_the_generated_one(zoo):
    with open(os.path.join(REPO, "docs", "amp-table.md"), encoding="utf-8") as f:
        doc = f.read()
    assert amp_zoo.render(zoo) in doc, "docs/amp-table.md is out of date: regenerate its models view with " \
                                       "`mxfp16 info --amp-table models`"


def test_gemm_flops_are_counted_from_the_shapes():
    # ResNet-50 v1 at 224 px: about 4.1 G multiply-adds in its convolutions and dense layer (the figure
    # every paper quotes), i.e. 8.2 GFLOP at two operations each.
    code = """
        import json, warnings
        warnings.simplefilter("ignore")
        import mxfp16
        from mxfp16.amp.zoo import model_dtypes
        print(json.dumps(model_dtypes("resnet50_v1")))
    """
    row = last_line_json(run_python(code).stdout)
    assert row["operators"] > 100 and row["low_operators"] == 0  # no AMP in this process: all float32
    assert row["input_size"] == 224 and row["output_shape"] == [1, 1000]
    assert 7.6e9 < row["gemm_flops"] < 8.4e9, row


def _train(precision, names, tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo") / f"{precision}.npz"
    env = child_env()
    return subprocess.Popen([sys.executable, CHILD, precision, str(out), *names], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env), out


def _load(proc, out):
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    arrays = np.load(out)
    return json.loads(str(arrays["report"])), arrays


def representatives(zoo):
    """The classifier with the least work of each family (models view rows), GluonCV's broken ones left out."""
    rows = {r["model"]: r for r in zoo["bfloat16"] if "error" not in r and len(r["output_shape"]) == 2}
    return [min((n for n in names if n in rows), key=lambda n: rows[n]["gemm_flops"])
            for names in amp_zoo.families().values() if any(n in rows for n in names)]


#: From random weights and two images, a deep network's backward pass amplifies any rounding on its way
#: down: the early layers' gradients of the bfloat16 run point elsewhere than float32's (as they do under
#: MXNet's own mx.nd AMP). So the runs are compared where that does not dominate: the first loss (the whole
#: forward pass, every 16-bit layer in it), and that three bfloat16 steps train. The classifier's gradient,
#: fed by the forward pass alone, must point the same way; through a final BatchNorm over 2 images x 2 x 2
#: positions its cosine with float32's came down to 0.57 (xception71), 0.9 and above for most models.
LOSS_TOLERANCE = 0.05
MIN_CLASSIFIER_COSINE = 0.3
#: Families MXNet 1.9.1 cannot train on a CPU in float32 either (oneDNN refuses a layout in the backward
#: pass): the test checks that both precisions still fail so, and says when one starts to train.
UNTRAINABLE = {"nasnet": "could not construct a sub-memory"}


@requires_bfloat16
def test_one_model_per_family_trains_in_bfloat16_like_float32(zoo, tmp_path_factory):
    families = {name: family for family, members in amp_zoo.families().items() for name in members}
    # The models known to fail go last: after oneDNN fails to build a primitive, the next model trained in
    # the same process can fail too (a float32 ResidualAttentionNet after NASNet: "could not construct a
    # sub-memory"), which would blame a model that trains on its own.
    names = sorted(representatives(zoo), key=lambda name: families[name] in UNTRAINABLE)
    assert len(names) >= 20
    runs = [_train(p, names, tmp_path_factory) for p in ("float32", "amp-bfloat16")]
    (ref, ref_arrays), (low, low_arrays) = [_load(*run) for run in runs]
    problems = []
    for name in names:
        expected = UNTRAINABLE.get(families[name])
        if expected:
            if not (expected in ref[name].get("error", "") and expected in low[name].get("error", "")):
                problems.append(f"{name}: expected '{expected}' in both precisions (drop it from UNTRAINABLE "
                                f"if it trains now): {ref[name]} / {low[name]}")
            continue
        if "error" in low[name] or "error" in ref[name]:
            problems.append(f"{name}: {low[name].get('error') or ref[name].get('error')}")
            continue
        r, g = ref_arrays[f"{name}/0"].ravel().astype(np.float64), low_arrays[f"{name}/0"].ravel().astype(np.float64)
        cosine = float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g)))
        losses, ref_losses = low[name]["losses"], ref[name]["losses"]
        first = abs(losses[0] - ref_losses[0]) / ref_losses[0]
        trains = all(np.isfinite(losses)) and losses[-1] < losses[0] and losses != ref_losses
        if cosine < MIN_CLASSIFIER_COSINE or first > LOSS_TOLERANCE or not trains:
            problems.append(f"{name} ({low[name]['size']} px): classifier gradient cosine {cosine:.3f}, first loss "
                            f"{first:.4f} off, losses {losses} vs {ref_losses}")
    assert not problems, "\n".join(problems)
