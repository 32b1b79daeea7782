"""mxfp16 beside PyTorch: torch 2, torch 1 and no torch, each in a fresh process.

gluoncv 0.10.5 raises RuntimeError at import when it finds torch>=2
(mxfp16/models/gluoncv.py). A stand-in ``torch`` package with a chosen
``__version__`` on PYTHONPATH reproduces what gluoncv sees; the first test
proves the stand-in triggers the real failure, so the others test the fix.
"""

import pytest
from conftest import last_line_json, run_python
from train_support import QUICK, ok, run_train, summary, tiny_dataset

TORCH_VERSIONS = ["2.13.0+cpu", "1.13.1", None]


def _stand_in(root, version):
    """An env dict whose PYTHONPATH holds a stand-in torch of ``version`` (or nothing for ``None``)."""
    if version is None:
        return {}
    (root / "torch").mkdir()
    # tensorboardX (which `mxfp16 train` writes its logs with) reads torch.Tensor at import when torch imports.
    (root / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\nSTAND_IN = True\n"
                                                "class Tensor:\n    pass\n")
    return {"PYTHONPATH": str(root)}  # run_python keeps the repository first


def test_the_stand_in_reproduces_gluoncvs_failure(tmp_path):
    # mxfp16 first only for the numpy names MXNet needs on numpy 1.24+; it does not import gluoncv.
    proc = run_python("import mxfp16\nimport gluoncv", env=_stand_in(tmp_path, "2.13.0+cpu"), check=False)
    assert proc.returncode != 0 and "Legacy torch==2.13.0+cpu detected" in proc.stderr


@pytest.mark.parametrize("version", TORCH_VERSIONS, ids=lambda v: f"torch-{v}" if v else "no-torch")
def test_every_entry_point_imports_and_torch_stays_usable(version, tmp_path):
    proc = run_python("""
        import json, sys
        import mxfp16, mxfp16.train, mxfp16.data
        from mxfp16.models import build_model
        from mxfp16 import import_gluoncv
        net = build_model("cifar_resnet20_v1", 3)          # gluoncv's model zoo
        from mxfp16.optim import lr_schedule               # gluoncv's schedules
        schedule = lr_schedule(0.1, epochs=2, warmup_epochs=1, steps_per_epoch=4)
        import gluoncv                                     # a user's own import now works too
        try:
            import torch
            seen = torch.__version__
        except ImportError:
            seen = None
        print(json.dumps({"torch": seen, "found_pytorch": gluoncv._found_pytorch,
                          "lr": schedule(6), "gluoncv": import_gluoncv() is gluoncv}))
    """, env=_stand_in(tmp_path, version))
    result = last_line_json(proc.stdout)
    assert result["torch"] == version  # the same torch, importable after gluoncv
    assert result["found_pytorch"] is False and result["gluoncv"] is True
    assert 0 < result["lr"] < 0.1


@pytest.mark.parametrize("version", [v for v in TORCH_VERSIONS if v])
def test_torch_imported_first_is_put_back_untouched(version, tmp_path):
    proc = run_python("""
        import sys, torch
        before = sys.modules["torch"]
        from mxfp16.models import build_model
        build_model("cifar_resnet20_v1", 3)
        assert sys.modules["torch"] is before and torch.STAND_IN
        print("same module")
    """, env=_stand_in(tmp_path, version))
    assert "same module" in proc.stdout


def test_cli_help_and_a_short_training_run_beside_torch_2(tmp_path):
    (tmp_path / "fake").mkdir()
    env = _stand_in(tmp_path / "fake", "2.13.0+cpu")
    assert "train" in run_python("import sys; from mxfp16.cli import main; sys.exit(main(['--help']))",
                                 env=env, check=False).stdout
    data = tiny_dataset(tmp_path)
    out = tmp_path / "run"
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 1, "--max-batches", 2,
                 *QUICK, env=env))
    assert summary(out)["epochs"] == 1
