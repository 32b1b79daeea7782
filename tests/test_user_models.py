"""Users' own HybridBlocks (LSTM, bidirectional GRU, self-attention layer, numpy-mode CNN) through the five calls.

The full comparison is ``docs/results/user-models/run.py``; here each model
trains one epoch on the digits in float32 and in ``auto``, each precision in
its own subprocess (AMP is process-global), and the summary statistics are
checked against an independent computation.
"""
import importlib.util
import json
import math
import os

import numpy as np
import pytest

RUN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "docs", "results", "user-models", "run.py")


def _load_run_py():
    spec = importlib.util.spec_from_file_location("user_models_run", RUN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


um = _load_run_py()

ALL_MODELS = ",".join(um.MODEL_NAMES)


@pytest.mark.parametrize("precision", ["float32", "auto"])
def test_each_model_trains_one_epoch(precision):
    from mxfp16 import resolve_precision

    auto = resolve_precision("auto", "cpu")  # a user's own loop follows the rule per CPU class
    if precision == "auto" and auto.name == "float32":
        pytest.skip(f"auto resolves to float32 here ({auto.reason}): nothing to compare")
    records = um.run_child(ALL_MODELS, precision, seed=1, epochs=1, timeout=240)
    assert [r["model"] for r in records] == list(um.MODEL_NAMES)
    optimizers = {r["model"]: r["optimizer"] for r in records}
    assert set(optimizers.values()) == {"adam", "rmsprop", "lamb", "sgd"}
    for r in records:
        assert r["requested"] == precision
        assert r["epochs"] == 1 and r["train_images"] == 1347 and r["test_images"] == 450
        assert all(math.isfinite(v) for v in r["losses"]), r
        assert r["accuracy"] > 20.0, f"{r['model']} {precision}: {r['accuracy']:.1f}% after one epoch (chance is 10%)"
        assert r["skipped_steps"] == 0
        if precision == "float32":
            assert r["precision"] == "float32"
            assert set(r["graph_dtypes"]) == {"float32"}, r["graph_dtypes"]
        else:
            assert r["precision"] == "amp-bfloat16"
            # the numpy-mode CNN too: mxfp16.amp.numpy_mode gives the mx.np / mx.npx functions AMP's lists
            assert r["graph_dtypes"].get("bfloat16", 0) >= 1, (r["model"], r["graph_dtypes"])


def test_split_is_stratified_and_fixed():
    labels = np.repeat(np.arange(10), 20)
    train, test = um.split_indices(labels)
    assert len(test) == 50 and len(train) == 150 and not set(train) & set(test)
    assert np.bincount(labels[test], minlength=10).tolist() == [5] * 10
    assert um.split_indices(labels) == (train, test)


def _independent_interval(f32, auto):
    d = np.asarray(auto, dtype=np.float64) - np.asarray(f32, dtype=np.float64)
    n = len(d)
    half = 2.3646242510102993 * d.std(ddof=1) / np.sqrt(n)  # t(0.975, 7), from tables
    return d.mean(), d.mean() - half, d.mean() + half


def test_paired_summary_matches_independent_computation():
    from scipy import stats

    rng = np.random.RandomState(3)
    f32 = list(97.0 + rng.normal(0, 0.6, size=8))
    auto = [a + b for a, b in zip(f32, rng.normal(0.05, 0.3, size=8))]
    s = um.paired_summary(f32, auto)
    mean, low, high = _independent_interval(f32, auto)
    assert s["n"] == 8
    assert s["diff"] == pytest.approx(mean, abs=1e-12)
    assert s["low"] == pytest.approx(low, abs=1e-9) and s["high"] == pytest.approx(high, abs=1e-9)
    ci = stats.ttest_rel(auto, f32).confidence_interval(0.95)
    assert (s["low"], s["high"]) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))
    assert s["mean_float32"] == pytest.approx(np.mean(f32)) and s["mean_auto"] == pytest.approx(np.mean(auto))
    assert s["sd_float32"] == pytest.approx(np.std(f32, ddof=1))
    assert s["contains_zero"] == (low <= 0 <= high)


def test_paired_summary_verdicts():
    f32 = [96.0, 97.0, 98.0, 97.5, 96.5, 97.2]
    # equal runs: a zero-width interval at 0
    same = um.paired_summary(f32, list(f32))
    assert (same["low"], same["high"], same["verdict"]) == (0.0, 0.0, "same within seed noise")
    # differences that straddle 0
    noisy = um.paired_summary(f32, [a + d for a, d in zip(f32, [0.4, -0.4, 0.2, -0.2, 0.0, 0.1])])
    assert noisy["contains_zero"] and noisy["verdict"] == "same within seed noise"
    # an almost constant gap of one test image: the interval misses 0, the gap is tiny
    tiny = um.paired_summary(f32, [a + 0.2 + 0.001 * i for i, a in enumerate(f32)])
    assert not tiny["contains_zero"] and tiny["verdict"] == "same within seed noise (gap tiny)"
    # a real gap
    lower = um.paired_summary(f32, [a - 2.0 + 0.1 * (i % 2) for i, a in enumerate(f32)])
    assert lower["verdict"] == "differs: auto lower"
    with pytest.raises(ValueError):
        um.paired_summary([97.0], [97.0])


def test_summary_table_and_atomic_append(tmp_path):
    records = [{"kind": "run", "model": "lstm", "optimizer": "adam", "requested": p, "seed": s,
                "precision": {"float32": "float32", "auto": "amp-bfloat16"}[p], "accuracy": 97.0 + s / 10}
               for p in ("float32", "auto") for s in (1, 2, 3)]
    lines = um.summary_table(records)
    assert len(lines) == 3 and lines[2].startswith("| lstm | adam | 3 | 97.20")
    assert "amp-bfloat16" in lines[2] and "same within seed noise" in lines[2]
    out = tmp_path / "results.jsonl"
    out.write_text('{"kind": "header", "old": true}\n')
    um.append_atomically(out, records[:2])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"kind": "header", "old": True} and rows[1:] == records[:2]
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]
