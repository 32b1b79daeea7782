"""``auto`` decided by timing the model (mxfp16.auto): the verdict, its cache, and the trainer's use of it."""
import json

from mxfp16 import auto
from mxfp16.machine import hardware

import pytest
from conftest import requires_bfloat16

NATIVE = hardware.BFloat16Support("native", "avx512_bf16")


def _record(precision, ms, status="ok"):
    return {"precision": precision, "status": status, "ms_per_step": ms if status == "ok" else None,
            "reason": None if status == "ok" else "Traceback ...\nMXNetError: something broke"}


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """A stand-in runner: ``timed.ms`` holds each precision's ms/step; ``timed.runs`` counts the probes."""
    class Timed:
        ms = {"float32": 1000.0, "amp-bfloat16": 500.0}   # long steps: a first round that can decide
        status = {}
        runs = []
        iters = []

    def run(spec, timeout=None):
        Timed.runs.append(spec.precision)
        Timed.iters.append(spec.iters)
        ms = Timed.ms[spec.precision]
        ms = ms.pop(0) if isinstance(ms, list) else ms   # a list: one time per round
        return _record(spec.precision, ms, Timed.status.get(spec.precision, "ok"))

    monkeypatch.setattr(auto, "run_in_subprocess", run)
    monkeypatch.setattr(hardware, "bfloat16_support", lambda: NATIVE)
    monkeypatch.setattr(auto, "_busy", lambda: None)
    Timed.cache = str(tmp_path / "cache" / "auto-precision.json")
    return Timed


SPEC = auto.probe_spec("cifar_resnet20_v1", 32, 8, 10)


@pytest.mark.parametrize("f32, bf16, chosen", [
    (1000.0, 500.0, "amp-bfloat16"),   # 2x
    (1000.0, 960.0, "float32"),        # 1.04x: inside the margin
    (1000.0, 2000.0, "float32"),       # slower
])
def test_the_faster_precision_is_chosen_beyond_the_margin(timed, f32, bf16, chosen):
    timed.ms = {"float32": f32, "amp-bfloat16": bf16}
    verdict = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert verdict.precision == chosen and verdict.measured and not verdict.cached
    assert verdict.ratio == pytest.approx(f32 / bf16)
    assert f"{f32 / bf16:.2f}x" in verdict.reason and "cifar_resnet20_v1" in verdict.reason


def test_a_first_round_near_one_is_confirmed_by_more_rounds_and_their_median_decides(timed):
    # 1.11x in the first round, 0.95x and 1.02x in the two after it: float32 (median 1.02x).
    timed.ms = {"float32": [1000.0, 950.0, 1020.0], "amp-bfloat16": [900.0, 1000.0, 1000.0]}
    lines = []
    verdict = auto.measured_auto(SPEC, log=lines.append, cache=timed.cache)
    assert timed.runs == ["float32", "amp-bfloat16"] * 3
    assert verdict.round_ratios == pytest.approx((1000 / 900, 0.95, 1.02)) and verdict.ratio == pytest.approx(1.02)
    assert verdict.precision == "float32" and "median of 3 rounds" in verdict.reason
    assert (verdict.float32_ms, verdict.candidate_ms) == (1000.0, 1000.0)   # each precision's median time
    assert any("close call" in line for line in lines)
    # A clear first round of long repeats decides alone, either way.
    for f32, bf16, chosen in ((1000.0, 700.0, "amp-bfloat16"), (1000.0, 1300.0, "float32")):
        timed.runs.clear()
        timed.ms = {"float32": f32, "amp-bfloat16": bf16}
        clear = auto.measured_auto(auto.probe_spec("cifar_resnet20_v1", 32, int(f32 + bf16), 10),
                                   log=lambda line: None, cache=timed.cache)
        assert clear.precision == chosen and len(timed.runs) == 2 and len(clear.round_ratios) == 1
    # The cached verdict keeps its rounds.
    again = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert again.cached and again.round_ratios == pytest.approx(verdict.round_ratios)


def test_short_steps_are_timed_again_in_long_repeats_and_the_short_round_is_left_out(timed):
    # A 20 ms step read 2x in one short round, then 0.97x, 1.0x and 0.98x over repeats of 1 s: float32.
    timed.ms = {"float32": [20.0, 9.7, 10.0, 9.8], "amp-bfloat16": [10.0, 10.0, 10.0, 10.0]}
    lines = []
    verdict = auto.measured_auto(SPEC, log=lines.append, cache=timed.cache)
    assert timed.runs == ["float32", "amp-bfloat16"] * 4
    assert verdict.round_ratios == pytest.approx((0.97, 1.0, 0.98)) and verdict.precision == "float32"
    # The long rounds time MIN_REPEAT_MS per repeat at least: 1000 ms of 10 ms steps is 100 steps.
    assert timed.iters[:2] == [auto.PROBE_ITERS] * 2 and timed.iters[2:] == [100] * 6
    assert any("too short" in line for line in lines)


def test_the_verdict_is_cached_per_shape(timed):
    first = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    again = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert again.cached and again.precision == first.precision and timed.runs == ["float32", "amp-bfloat16"]
    other = auto.measured_auto(auto.probe_spec("cifar_resnet20_v1", 32, 16, 10), log=lambda line: None,
                               cache=timed.cache)
    assert not other.cached and len(timed.runs) == 4  # another batch size is another verdict
    doc = json.loads(open(timed.cache).read())
    assert doc["version"] == auto._CACHE_VERSION and len(doc["verdicts"]) == 2


def test_a_damaged_cache_is_measured_again_and_rewritten(timed):
    import os
    os.makedirs(os.path.dirname(timed.cache))
    with open(timed.cache, "w") as handle:
        handle.write("{not json")
    verdict = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert verdict.measured and json.loads(open(timed.cache).read())["version"] == auto._CACHE_VERSION


def test_a_failed_probe_falls_back_to_float32_and_is_not_cached(timed):
    timed.status = {"amp-bfloat16": "failed"}
    verdict = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert verdict.precision == "float32" and not verdict.measured and "something broke" in verdict.reason
    auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert len(timed.runs) == 4  # measured again: a failure is not a verdict


def test_a_verdict_measured_under_load_is_used_once(timed, monkeypatch):
    monkeypatch.setattr(auto, "_busy", lambda: "1-minute load average 3.0 on 2 core(s)")
    lines = []
    verdict = auto.measured_auto(SPEC, log=lines.append, cache=timed.cache)
    assert "under load" in verdict.reason and any("not kept" in line for line in lines)
    auto.measured_auto(SPEC, log=lines.append, cache=timed.cache)
    assert len(timed.runs) == 4


@pytest.mark.parametrize("kind", ["none", "emulated", "unknown"])
def test_nothing_is_timed_where_bfloat16_is_not_native(timed, monkeypatch, kind):
    monkeypatch.setattr(hardware, "bfloat16_support", lambda: hardware.BFloat16Support(kind, "because"))
    verdict = auto.measured_auto(SPEC, log=lambda line: None, cache=timed.cache)
    assert verdict.precision == "float32" and not verdict.measured and timed.runs == []


def test_the_cache_folder_follows_the_environment(tmp_path):
    assert auto.cache_file({"MXFP16_CACHE_DIR": str(tmp_path)}) == str(tmp_path / "auto-precision.json")
    assert auto.cache_file({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mxfp16" / "auto-precision.json")


@requires_bfloat16
def test_a_real_probe_times_both_precisions_in_their_own_processes(tmp_path):
    """No stand-in: two child processes, each timing the trainer's own step."""
    if not hardware.bfloat16_support().native:
        pytest.skip("bfloat16 is not native here: auto follows the rule without timing")
    verdict = auto.measured_auto(auto.probe_spec("cifar_resnet20_v1", 32, 8, 10), log=lambda line: None,
                                 cache=str(tmp_path / "auto.json"))
    assert verdict.float32_ms > 0 and verdict.candidate_ms > 0
    assert verdict.precision == ("amp-bfloat16" if verdict.ratio >= auto.MARGIN else "float32")


class _Config:
    precision, resume, out, model, image_size, batch_size, seed, allow_cpu_float16 = \
        "auto", False, "runs/x", "resnet18_v1", 48, 32, 1, False


class _Cluster:
    distributed = False


def test_the_trainer_times_its_own_model_for_auto(monkeypatch):
    from mxfp16.precision import resolve_precision
    from mxfp16.train import run

    import mxnet as mx

    asked = []

    def fake(spec, log):
        asked.append(spec)
        return auto.AutoVerdict("float32", "measured 0.80x", True)

    monkeypatch.setattr(auto, "measured_auto", fake)
    rule = resolve_precision("float32", "cpu")
    chosen, record = run._auto_precision(_Config(), rule, [mx.cpu()], None, 10, _Cluster(), print)
    assert (chosen.name, chosen.requested, chosen.reason) == ("float32", "auto", "measured 0.80x")
    # config.json's auto: what decided it, so a reader can check the choice against the times
    assert (record["precision"], record["reason"], record["measured"]) == ("float32", "measured 0.80x", True)
    (spec,) = asked
    assert (spec.model, spec.image_size, spec.batch_size, spec.classes) == ("resnet18_v1", 48, 32, 10)
    # A resumed run keeps the precision it started with, whatever a new measurement would say.
    resumed = type("Resumed", (_Config,), {"resume": True})()
    saved = {"resolved_precision": "float32", "auto": dict(record)}
    again, kept = run._auto_precision(resumed, rule, [mx.cpu()], saved, 10, _Cluster(), print)
    assert again.name == "float32" and "the run's own" in again.reason and len(asked) == 1
    assert kept == record   # the verdict the run started with travels with it
    # Distributed workers keep the rule: each timing under the others' load could choose differently.
    cluster = type("Dist", (), {"distributed": True})()
    kept_rule, record = run._auto_precision(_Config(), rule, [mx.cpu()], None, 10, cluster, print)
    assert kept_rule is rule and record["measured"] is False and len(asked) == 1
    # A precision asked for by name is never timed.
    named = type("Named", (_Config,), {"precision": "float32"})()
    assert run._auto_precision(named, rule, [mx.cpu()], None, 10, _Cluster(), print) == (rule, None)
    assert len(asked) == 1
