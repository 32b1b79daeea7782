"""``mxfp16 selftest``: it passes on this CPU, fails when a run is corrupted, and compares like with like."""
import json
import subprocess
import sys

from mxfp16.machine import hardware
from mxfp16.train import selftest

import numpy as np
import pytest
from conftest import BFLOAT16, BFLOAT16_RUNS, REPO, requires_bfloat16, requires_gpu


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mxfp16", "selftest", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def _rows(path):
    with open(path) as handle:
        return {(row["precision"], row["verdict"] == "control"): row for row in json.load(handle)}


@pytest.mark.slow
def test_selftest_passes_on_this_cpu(tmp_path):
    out = tmp_path / "selftest.json"
    proc = _cli("--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(out)
    control = rows[("float32", True)]
    assert control["ctx"] == "cpu" and control["final_loss"] < control["first_loss"]
    bf16 = rows[("amp-bfloat16", False)]
    if BFLOAT16_RUNS:
        assert bf16["verdict"] == "PASS" and bf16["steps"] == selftest.STEPS
        assert bf16["param_difference"] <= selftest.PARAM_RTOL and bf16["images_per_second"] > 0
    elif not BFLOAT16.runs:  # mxfp16 knows this CPU cannot: not run, and why
        assert bf16["verdict"] == "not run" and BFLOAT16.reason in bf16["reason"]
    else:  # flags unreadable ('unknown'): mxfp16 lets amp-bfloat16 try, and MXNet cannot run it here
        assert bf16["verdict"] != "PASS"
    for name in ("float16", "amp-float16"):
        assert rows[(name, False)]["verdict"] == ("not run" if not hardware.gpu_count() else "PASS")
    assert "selftest: PASSED" in proc.stdout and "verdict" in proc.stdout


@requires_bfloat16
@pytest.mark.slow
def test_a_corrupted_step_fails_the_selftest(tmp_path):
    out = tmp_path / "selftest.json"
    proc = _cli("--inject-fault", "amp-bfloat16", "--steps", "10", "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = _rows(out)[("amp-bfloat16", False)]
    assert row["verdict"] == "FAIL" and row["param_difference"] > selftest.PARAM_RTOL
    assert "selftest: FAILED" in proc.stdout


@requires_gpu
@pytest.mark.gpu
def test_selftest_passes_the_float16_recipes_on_a_gpu(tmp_path):
    out = tmp_path / "selftest.json"
    proc = _cli("--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(out)
    assert rows[("float16", False)]["verdict"] == "PASS" and rows[("amp-float16", False)]["verdict"] == "PASS"


def test_bad_flags_are_refused_before_any_run(capsys, monkeypatch):
    from mxfp16.cli import main

    monkeypatch.setattr(selftest, "run_in_subprocess", lambda *a, **k: pytest.fail("a run was started"))
    assert main(["selftest", "--inject-fault", "bfloat16"]) == 2
    assert "amp-bfloat16" in capsys.readouterr().err
    assert main(["selftest", "--steps", "2"]) == 2
    assert "--steps" in capsys.readouterr().err


AVX2_ONLY = hardware.bfloat16_support({"avx2", "fma"}, {}, None)
EMULATED = hardware.bfloat16_support({"avx512f", "avx512bw", "avx512vl", "avx512dq"}, {}, None)


def test_plan_follows_the_hardware():
    on_gpu = {p.precision: p for p in selftest.plan(n_gpus=2, bfloat16=AVX2_ONLY)}
    assert on_gpu["float16"].runnable and on_gpu["float16"].ctx == "gpu:0"
    assert on_gpu["amp-float16"].runnable
    # Where bfloat16 cannot run the row says why, naming the missing instructions.
    assert not on_gpu["amp-bfloat16"].runnable and "avx512f" in on_gpu["amp-bfloat16"].reason
    # Emulated bfloat16 runs: the selftest checks that it trains right, not that it is fast.
    assert selftest.plan(n_gpus=0, bfloat16=EMULATED)[-1].runnable
    on_cpu = {p.precision: p for p in selftest.plan(n_gpus=0, bfloat16=EMULATED)}
    assert on_cpu["amp-bfloat16"].runnable and on_cpu["amp-bfloat16"].ctx == "cpu"
    assert not on_cpu["float16"].runnable and "GPU" in on_cpu["float16"].reason


class FakeRuns:
    """Stands in for the child processes: records each spec, returns a scripted record."""

    def __init__(self, skipped_by_precision, offset_by_precision=None):
        self.specs, self.envs = [], []
        self.skipped = skipped_by_precision
        self.offset = offset_by_precision or {}

    def __call__(self, spec, timeout=None, env=None):
        self.specs.append(spec)
        self.envs.append(env or {})
        # A float32 control that skips steps ends elsewhere than one that does not.
        value = 1.0 + 0.01 * len(spec.skip_steps) + self.offset.get(spec.precision, 0.0)
        np.savez(spec.params_out, w=np.full(4, value, np.float32))
        losses = list(np.linspace(1.4, 0.8, spec.steps) + (0.0 if spec.precision == "float32" else 0.001))
        return {"status": "ok", "reason": None, "precision": spec.precision, "ctx": spec.ctx, "steps": spec.steps,
                "losses": losses, "skipped_steps": list(self.skipped.get(spec.precision, [])),
                "images_per_second": 100.0, "params": spec.params_out, "loss_scale": None}


def test_a_run_that_skipped_steps_is_compared_with_a_control_that_skipped_them_too(monkeypatch):
    fake = FakeRuns({"float16": [0, 1]}, offset_by_precision={"float16": 0.02})
    monkeypatch.setattr(selftest, "run_in_subprocess", fake)
    rows = selftest.run_selftest(steps=8, n_gpus=1, bfloat16=EMULATED)
    controls = [s for s in fake.specs if s.precision == "float32"]
    assert [(s.ctx, s.skip_steps) for s in controls] == [("gpu:0", ()), ("gpu:0", (0, 1)), ("cpu", ())]
    assert all(env.get("NVIDIA_TF32_OVERRIDE") == "0" for s, env in zip(fake.specs, fake.envs)
               if s.precision == "float32")
    # Every run on a device starts from the weights its first control saved.
    init = {s.ctx: s.save_init for s in controls if s.save_init}
    assert all(s.init_params == init[s.ctx] for s in fake.specs if not s.save_init)
    by_name = {r["precision"]: r for r in rows if r["verdict"] != "control"}
    # float16 ends at 1.02 against its matching control's 1.02: no difference; against the plain one it would be 2%.
    assert by_name["float16"]["param_difference"] == pytest.approx(0.0, abs=1e-6)
    assert by_name["float16"]["skipped"] == 2 and by_name["float16"]["verdict"] == "PASS"
    assert by_name["amp-float16"]["verdict"] == "PASS" and by_name["amp-bfloat16"]["verdict"] == "PASS"
    assert selftest.passed(rows)


def test_a_control_that_does_not_learn_fails_the_comparison(tmp_path):
    flat = {"status": "ok", "precision": "float32", "ctx": "cpu", "steps": 8, "losses": [1.0] * 8,
            "params": str(tmp_path / "c.npz")}
    run = dict(flat, precision="amp-bfloat16", losses=list(np.linspace(1.0, 0.5, 8)), params=str(tmp_path / "r.npz"))
    for record in (flat, run):
        np.savez(record["params"], w=np.ones(3, np.float32))
    row = selftest.verdict(run, flat)
    assert row["verdict"] == "FAIL" and "control did not learn" in row["reason"]
    control_row = selftest._control_row(flat, "note")
    assert control_row["verdict"] == "FAIL" and "float32 did not learn" in control_row["reason"]
    assert not selftest.passed([control_row])


def test_the_float32_run_happens_even_where_no_mixed_precision_runs(monkeypatch):
    fake = FakeRuns({})
    monkeypatch.setattr(selftest, "run_in_subprocess", fake)
    rows = selftest.run_selftest(steps=8, n_gpus=0, bfloat16=AVX2_ONLY)
    assert [(s.precision, s.ctx) for s in fake.specs] == [("float32", "cpu")]
    assert [r["verdict"] for r in rows] == ["control", "not run", "not run", "not run"]
    assert selftest.passed(rows)
