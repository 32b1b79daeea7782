"""The PyTorch peer in the benchmark: its rows, its absence, its failure, and the comparison arithmetic.

CI has no torch, so the end-to-end test shows the skip; a stand-in torch
that cannot train shows a crashing peer row next to mxfp16 rows that still
run. The real comparison is recorded in docs/benchmarks.md. Where torch is
installed (the peer extra), the sequence models' PyTorch networks are
checked against the MXNet models (parameter count, output shape) and timed
end to end; without torch those tests skip.
"""
import json

from mxfp16.bench import peer, report
from mxfp16.cli import main
from mxfp16.models import SEQUENCE_MODELS, build_model

import pytest

SMALL = ["--no-census", "--model", "resnet50_v2", "--image-size", "32", "--batch-sizes", "2", "--precisions", "float32",
         "--iters", "1", "--warmup", "0", "--repeats", "1", "--no-plots", "--peer", "pytorch"]


def _rows(out):
    return json.loads((out / "bench.json").read_text())


@pytest.mark.slow
def test_without_torch_the_peer_rows_are_skipped_and_mxfp16_rows_run(tmp_path, monkeypatch):
    monkeypatch.setattr(peer.importlib.util, "find_spec", lambda name: None if name == "torch" else object())
    assert main(["bench", *SMALL, "--out", str(tmp_path)]) == 0
    doc = _rows(tmp_path)
    mine = [r for r in doc["results"] if r["framework"] == "mxfp16"]
    peers = [r for r in doc["results"] if r["framework"] == "pytorch"]
    assert [r["status"] for r in mine] == ["ok"]
    assert [(r["precision"], r["layout"], r["compiled"]) for r in peers] == \
        [(f"pytorch-{d}", l, c) for d, l, c in peer.variants("resnet50_v2")]  # eager, then compiled
    assert all(r["status"] == "skipped" and "PyTorch is not installed" in r["reason"] and "mxfp16[peer]" in r["reason"]
               for r in peers)
    assert doc["config"]["peer"] == "pytorch" and "peer" not in doc  # nothing to compare with


@pytest.mark.slow
def test_a_peer_that_crashes_is_reported(tmp_path, monkeypatch):
    stand_in = tmp_path / "fake"
    (stand_in / "torch").mkdir(parents=True)
    (stand_in / "torch" / "__init__.py").write_text("__version__ = '2.0.0'\n")  # no nn, no autocast
    monkeypatch.setenv("PYTHONPATH", str(stand_in))  # the child imports it
    monkeypatch.syspath_prepend(str(stand_in))  # and this process sees that torch is "installed"
    spec = peer.plan_peer(type("Base", (), dict(model="resnet50_v2", image_size=32, classes=4, iters=1, warmup=0,
                                                repeats=1, seed=0)), [2], threads=1)[0]
    record = peer.run_in_subprocess(spec, timeout=120)
    assert record["status"] == "failed" and "torch" in record["reason"]
    assert record["framework"] == "pytorch" and record["images_per_second"] is None


def test_bad_peer_combinations_are_refused(tmp_path, capsys):
    for model in ("cifar_resnet20_v1", "elementwise-mlp"):
        assert main(["bench", *SMALL[:-2], "--peer", "pytorch", "--model", model, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        # the refusal names the model it got and every model that has a peer
        assert repr(model) in err and "ResNet-50" in err and all(m in err for m in SEQUENCE_MODELS)
    assert main(["bench", *SMALL, "--mode", "inference", "--out", str(tmp_path)]) == 2
    assert "--mode train" in capsys.readouterr().err


def _row(framework, precision, ips, layout=None, ms=None):
    return {"framework": framework, "precision": precision, "layout": layout, "amp_lists": None, "status": "ok",
            "model": "resnet50_v2", "image_size": 224, "batch_size": 16, "mode": "train", "data": "synthetic",
            "ctx": "cpu", "images_per_second": ips, "ms_per_step": ms or 16000 / ips, "cpu_ms_per_step": None,
            "peak_memory_mb": 100.0}


def test_comparison_picks_the_fastest_rows_and_keeps_mxfp16_float32_as_the_baseline():
    records = [_row("mxfp16", "float32", 6.0), _row("mxfp16", "amp-bfloat16", 13.8),
               _row("pytorch", "pytorch-float32", 4.0, "NCHW"),
               _row("pytorch", "pytorch-float32", 5.0, "channels_last"),
               _row("pytorch", "pytorch-bfloat16", 9.0, "NCHW"),
               _row("pytorch", "pytorch-bfloat16", 12.0, "channels_last")]
    doc = report.bench_document({}, records)
    (entry,) = doc["peer"].values()
    assert entry["peer_mixed"] == {"label": "pytorch-bfloat16 (channels_last)", "images_per_second": 12.0}
    assert entry["mixed_ratio"] == pytest.approx(13.8 / 12.0) and entry["float32_ratio"] == pytest.approx(6.0 / 5.0)
    # every speedup, the peer's included, is against mxfp16's float32 row
    assert [r["speedup"] for r in records] == pytest.approx([1.0, 13.8 / 6.0, 4 / 6.0, 5 / 6.0, 9 / 6.0, 2.0])
    assert "13.80 img/s against pytorch-bfloat16 (channels_last) 12.00 img/s: 1.15x" in \
        report.format_peer_comparison(doc["peer"])


def test_with_rounds_the_peer_ratio_pairs_each_round():
    mine = [(6.0, 13.0), (4.0, 10.0), (5.0, 9.0)]  # (float32, amp-bfloat16) img/s per round
    peer = [(5.0, 12.0), (3.0, 8.0), (5.0, 12.0)]  # (float32, bfloat16) channels_last
    records = []
    for i, ((f, b), (pf, pb)) in enumerate(zip(mine, peer)):
        records += [dict(r, round=i + 1) for r in (
            _row("mxfp16", "float32", f), _row("mxfp16", "amp-bfloat16", b),
            _row("pytorch", "pytorch-float32", pf, "channels_last"),
            _row("pytorch", "pytorch-bfloat16", pb, "channels_last"))]
    doc = report.bench_document({}, records)
    assert len(doc["results"]) == 4 and all(len(r["rounds"]) == 3 for r in doc["results"])
    (entry,) = doc["peer"].values()
    mixed = sorted(b / pb for (_, b), (_, pb) in zip(mine, peer))  # 1.083, 1.25, 0.75
    assert entry["mixed_ratio"] == pytest.approx(mixed[1])
    assert entry["float32_ratio"] == pytest.approx(sorted(f / pf for (f, _), (pf, _) in zip(mine, peer))[1])
    assert entry["peer_mixed"] == {"label": "pytorch-bfloat16 (channels_last)", "images_per_second": 12.0}


# ---- the sequence models' PyTorch networks --------------------------------------------------------
def test_every_sequence_model_has_a_peer_of_its_own_with_nchw_rows_only_eager_and_compiled():
    assert {peer.LSTM_CLASSIFIER, peer.TRANSFORMER_ENCODER} == set(SEQUENCE_MODELS)  # peer.py spells them out
    networks = {peer.peer_network(m) for m in SEQUENCE_MODELS + ("resnet50_v2",)}
    assert len(networks) == 3 and peer.peer_network("resnet50_v1b") == peer.NETWORK
    assert peer.peer_network("cifar_resnet20_v1") is None and peer.peer_network("elementwise-mlp") is None
    for model in SEQUENCE_MODELS:
        base = type("Base", (), dict(model=model, image_size=8, classes=4, iters=1, warmup=0, repeats=1, seed=0))
        specs = peer.plan_peer(base, [2, 4], threads=1)
        assert [(s.batch_size, s.dtype, s.layout, s.compiled) for s in specs] == \
            [(b, d, "NCHW", c) for b in (2, 4) for c in (False, True) for d in ("float32", "bfloat16")]
        assert not any(s.compiled for s in peer.plan_peer(base, [2], threads=1, compiled=False))
        assert peer.not_run(specs[0], "skipped", "")["network"] == peer.peer_network(model)


def _mxnet_parameters(model, classes, size):
    net = build_model(model, classes, in_shape=(3, size, size))
    return sum(p.data().size for p in net.collect_params().values())


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
@pytest.mark.parametrize("classes, size", [(10, 8), (7, 16)])
def test_the_pytorch_network_has_the_mxnet_models_parameter_count(model, classes, size):
    pytest.importorskip("torch")
    net = peer.build_network(model, classes, size)
    # Counted independently on each side: the embedding's input width (3 * size) and, for the
    # Transformer, the position table (size rows) and the class count all enter both counts.
    assert sum(p.numel() for p in net.parameters()) == _mxnet_parameters(model, classes, size)


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_the_pytorch_network_maps_images_to_class_scores(model):
    torch = pytest.importorskip("torch")
    net = peer.build_network(model, 5, 8)
    x = torch.randn(3, 3, 8, 8)
    assert tuple(net(x).shape) == (3, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the bfloat16 row's forward pass
        assert tuple(net(x).shape) == (3, 5)


@pytest.mark.slow
def test_a_sequence_model_is_timed_beside_its_pytorch_peer(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["bench", "--model", "lstm-classifier", "--image-size", "8", "--batch-sizes", "8", "--classes", "10",
                 "--iters", "2", "--warmup", "1", "--repeats", "1", "--peer", "pytorch-eager", "--out", str(tmp_path),
                 "--no-plots", "--no-census"]) == 0
    doc = _rows(tmp_path)
    peers = [r for r in doc["results"] if r["framework"] == "pytorch"]
    assert [(r["precision"], r["layout"], r["status"]) for r in peers] == \
        [("pytorch-float32", "NCHW", "ok"), ("pytorch-bfloat16", "NCHW", "ok")], peers
    assert all(r["network"] == peer.peer_network("lstm-classifier") and r["images_per_second"] > 0
               and r["model"] == "lstm-classifier" and r["batch_size"] == 8 for r in peers)
    # The default precisions are float32 and auto. auto is amp-bfloat16 only where this CPU timed it faster (or,
    # without timing, where the rule says so); otherwise it is the float32 run, and there is one mxfp16 row.
    auto = doc["config"]["auto"]["8"]["precision"]
    mine = [r for r in doc["results"] if r["framework"] == "mxfp16"]
    assert sorted((r["precision"], r["status"]) for r in mine) == \
        sorted([("float32", "ok")] + ([] if auto == "float32" else [(auto, "ok")])), (auto, mine)
    (entry,) = doc["peer"].values()  # compared with the mxfp16 rows of the same shape
    assert entry["float32_ratio"]
    assert bool(entry["mixed_ratio"]) == (auto != "float32"), (auto, entry)
    assert f"against PyTorch ({peer.peer_network('lstm-classifier')}" in capsys.readouterr().out


def _mxnet_weights_by_torch_name(model, mxnet_net):
    """The MXNet model's weights under the PyTorch network's state_dict names (same gate and q/k/v order)."""
    import numpy as np

    params = {k.split("_", 1)[1]: p.data().asnumpy() for k, p in mxnet_net.collect_params().items()}
    if model == "lstm-classifier":
        return {"embed.0.weight": params["dense0_weight"], "embed.0.bias": params["dense0_bias"],
                **{f"rnn.{w}_{g}_l0": params[f"lstm0_l0_{m}_{w}"]
                   for w in ("weight", "bias") for g, m in (("ih", "i2h"), ("hh", "h2h"))},
                "output.weight": params["dense1_weight"], "output.bias": params["dense1_bias"]}
    weights = {"embed.weight": params["dense0_weight"], "embed.bias": params["dense0_bias"],
               "position": params["position"], "output.weight": params["dense1_weight"],
               "output.bias": params["dense1_bias"]}
    for i in range(2):
        block, layer = f"encoderblock{i}_", f"blocks.layers.{i}."
        attention = block + "selfattention0_"
        for w in ("weight", "bias"):  # MXNet's query, key, value Dense layers are PyTorch's packed in_proj
            weights[layer + f"self_attn.in_proj_{w}"] = np.concatenate([params[attention + f"dense{j}_{w}"]
                                                                         for j in range(3)])
            weights[layer + f"self_attn.out_proj.{w}"] = params[attention + f"dense3_{w}"]
            weights[layer + f"linear1.{w}"], weights[layer + f"linear2.{w}"] = (params[block + f"dense{j}_{w}"]
                                                                                for j in range(2))
        for j in (0, 1):
            weights[layer + f"norm{j + 1}.weight"] = params[block + f"layernorm{j}_gamma"]
            weights[layer + f"norm{j + 1}.bias"] = params[block + f"layernorm{j}_beta"]
    return weights


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_with_the_mxnet_weights_the_pytorch_network_computes_the_same_scores(model):
    # Beyond the shapes: rows read the same way, LSTM gate order, GELU, LayerNorm epsilon, post-LN order.
    torch = pytest.importorskip("torch")
    import mxnet as mx
    import numpy as np

    mxnet_net, net = build_model(model, 7, in_shape=(3, 12, 12)), peer.build_network(model, 7, 12)
    net.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                         for k, v in _mxnet_weights_by_torch_name(model, mxnet_net).items()})
    x = np.random.RandomState(0).standard_normal((4, 3, 12, 12)).astype(np.float32)
    with torch.no_grad():
        ours = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, mxnet_net(mx.nd.array(x)).asnumpy(), rtol=1e-4, atol=1e-5)
