"""Text, JSON and PNG reports of a diagnosis built from synthetic gradients."""
import json

from mxfp16.diagnostics import Diagnosis, RangeCollector, recommend_loss_scale, total
from mxfp16.diagnostics.report import diagnosis_document, format_summary, format_table, plot_histogram
from mxfp16.float_formats import FLOAT16

import mxnet as mx
import numpy as np


def _diagnosis(loss_scale=1024.0):
    rng = np.random.default_rng(0)
    tensors = {
        # Half of these sit below 2^-24 / 1024: they underflow even at the asked scale.
        "tiny": np.concatenate([np.full(50, 2.0 ** -40), np.full(50, 2.0 ** -10)]),
        "normal": rng.uniform(0.01, 2.0, 300),
        "zeros": np.zeros(20),
    }
    collector = RangeCollector()
    collector.add_batch([(name, "activation" if name == "tiny" else "parameter", mx.nd.array(values))
                         for name, values in tensors.items()])
    stats = collector.stats
    return Diagnosis(stats=stats, loss_scale=loss_scale, recommendation=recommend_loss_scale(total(stats)),
                     forward_skipped="not asked"), tensors


def test_summary_states_underflow_and_the_recommended_scale():
    diagnosis, tensors = _diagnosis()
    text = format_summary(diagnosis)
    everything = np.abs(np.concatenate(list(tensors.values())))
    nonzero = everything[everything > 0]
    share = (nonzero < FLOAT16.smallest_subnormal).mean()
    assert f"{100 * share:.2f}% at S=1" in text
    assert f"recommended loss scale: {diagnosis.recommendation.scale:g} " in text
    assert "forward check: skipped: not asked" in text


def test_table_puts_the_worst_underflow_first_and_lists_every_tensor():
    diagnosis, tensors = _diagnosis()
    rows = format_table(diagnosis).splitlines()[2:-1]
    assert [row.split()[0] for row in rows] == ["tiny", "normal", "zeros"]
    assert rows[0].split()[4:6] == ["50.00%", "50.00%"]   # underflow at S=1 and at S=1024


def test_json_document_is_strict_json_with_fractions_at_each_scale():
    diagnosis, _ = _diagnosis()
    document = json.loads(json.dumps(diagnosis_document(diagnosis, {"model": "x"}), allow_nan=False))
    zeros = next(layer for layer in document["layers"] if layer["name"] == "zeros")
    assert zeros["min_nonzero"] is None and zeros["zeros"] == 20
    tiny = document["layers"][0]
    assert tiny["at_scale"]["1024"]["underflow"] == 0.5
    assert set(tiny["at_scale"]) == {"1", "1024", f"{diagnosis.recommendation.scale:g}"}


def test_histogram_png_is_written_atomically(tmp_path):
    diagnosis, _ = _diagnosis()
    path = tmp_path / "h.png"
    plot_histogram(diagnosis, path)
    assert path.read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in tmp_path.iterdir()] == ["h.png"]
