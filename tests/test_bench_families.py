"""The benchmark families: each builds at its documented sizes, trains through `mxfp16 bench`, and has a twin.

The MXNet networks are counted against the analytic parameter count of
their layers, written out here from the layer definitions (an LSTM or GRU
layer's gate matrices and two biases, a BERT block, MobileNet v2's
bottlenecks, DCGAN's 4x4 convolutions), at the sizes docs/benchmarks.md
names. One tiny step of each family runs through `mxfp16 bench`'s
processes. The PyTorch twins (skipped without torch) must hold the same
parameters as their MXNet networks and, for the language model and the
encoder, compute the same scores from the same weights.
"""
import json
import re

from mxfp16.bench import family_steps, peer, report
from mxfp16.bench.families import FAMILIES, FamilyError, resolve_options
from mxfp16.cli import main
from mxfp16.models import build_model

import mxnet as mx
import numpy as np
import pytest
from conftest import BFLOAT16

TINY = {"word-lm-lstm": ["vocab=40", "embed=8", "hidden=8", "seq_len=5"],
        "word-lm-gru": ["vocab=40", "embed=8", "hidden=8", "seq_len=5"],
        "bert-encoder": ["vocab=50", "units=16", "heads=2", "ffn=32", "seq_len=6", "max_length=8"],
        "dcgan": ["nz=10", "ngf=4", "ndf=4"]}


def _trainable(nets):
    """MXNet's trained parameters (BatchNorm's running statistics are state, as PyTorch's buffers)."""
    return sum(p.data().size for net in nets for p in net.collect_params().values() if p.grad_req != "null")


def _recurrent(gates, inputs, hidden, layers):
    """A stacked LSTM (4 gates) or GRU (3): per layer, input and recurrent matrices and a bias for each."""
    total = 0
    for layer in range(layers):
        width = inputs if layer == 0 else hidden
        total += gates * hidden * (width + hidden) + 2 * gates * hidden
    return total


def _bert(vocab, units, ffn, layers, positions, classes):
    block = 4 * (units * units + units) + (units * ffn + ffn) + (ffn * units + units) + 2 * 2 * units
    embeddings = (vocab + positions) * units + 2 * units  # and their LayerNorm
    return embeddings + layers * block + (units * units + units) + (units * classes + classes)  # pooler, classifier


def _mobilenet_v2(classes):
    """GluonCV's mobilenetv2_1.0: (expansion, out channels, repeats, first stride) as in the paper's table 2."""
    total, cin = 3 * 32 * 9 + 2 * 32, 32
    for t, cout, n, _ in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                          (6, 160, 3, 2), (6, 320, 1, 1)):
        for _ in range(n):
            wide = cin * t
            total += (cin * wide + 2 * wide if t != 1 else 0) + 9 * wide + 2 * wide + wide * cout + 2 * cout
            cin = cout
    return total + 320 * 1280 + 2 * 1280 + 1280 * classes


def _dcgan(nz, ngf, ndf):
    widths_g, widths_d = [nz, 8 * ngf, 4 * ngf, 2 * ngf, ngf, 3], [3, ndf, 2 * ndf, 4 * ndf, 8 * ndf, 2]
    g = sum(16 * a * b for a, b in zip(widths_g, widths_g[1:])) + 2 * (15 * ngf)
    d = sum(16 * a * b for a, b in zip(widths_d, widths_d[1:])) + 2 * (14 * ndf)
    return g, d


# The sizes docs/benchmarks.md names for each family.
DOCUMENTED = {
    "word-lm-lstm": 10000 * 650 + 10000 + _recurrent(4, 650, 650, 2),  # tied: the decoder keeps its bias only
    "word-lm-gru": 10000 * 650 + 10000 + _recurrent(3, 650, 650, 2),
    "bert-encoder": _bert(30522, 768, 3072, 2, 512, 2),
    "dcgan": sum(_dcgan(100, 64, 64)),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_family_builds_at_its_documented_sizes(name):
    nets = family_steps.build_networks(name, resolve_options(name))
    assert _trainable(nets.values()) == DOCUMENTED[name]


def test_the_gan_networks_are_counted_apart_and_the_language_model_is_tied():
    g, d = _dcgan(100, 64, 64)
    nets = family_steps.build_networks("dcgan", resolve_options("dcgan"))
    assert (_trainable([nets["generator"]]), _trainable([nets["discriminator"]])) == (g, d)
    untied = family_steps.build_networks("word-lm-lstm", resolve_options("word-lm-lstm", ["tied=0"]))
    assert _trainable(untied.values()) == DOCUMENTED["word-lm-lstm"] + 650 * 10000  # its own decoder matrix


def test_mobilenet_v2_is_gluoncvs_layout():
    assert _trainable([build_model("mobilenetv2_1.0", 102, in_shape=(3, 32, 32))]) == _mobilenet_v2(102)


def test_model_options_are_checked():
    assert resolve_options("bert-encoder", ["layers=12"])["layers"] == 12
    assert resolve_options("word-lm-gru", {"dropout": "0.2"})["dropout"] == 0.2
    for bad, words in ((["hiden=16"], "no option 'hiden'"), (["hidden"], "not KEY=VALUE"),
                       (["hidden=1.5"], "integer"), (["dropout=1"], "[0, 1)"), (["tied=2"], "0 or 1"),
                       (["unfused_bf16=2"], "0 or 1"), (["layers=0"], "at least 1")):
        with pytest.raises(FamilyError, match=re.escape(words)):
            resolve_options("word-lm-lstm", bad)
    with pytest.raises(ValueError, match="embed_size == hidden_size"):
        family_steps.build_networks("word-lm-lstm", resolve_options("word-lm-lstm", ["embed=8", "hidden=16"]))


def test_one_gan_iteration_updates_both_networks():
    from mxfp16 import MixedPrecision
    from mxfp16.bench.runner import BenchSpec, _Batches

    spec = BenchSpec(model="dcgan", image_size=64, batch_size=2, options=resolve_options("dcgan", TINY["dcgan"]))
    mixed = MixedPrecision("float32", "cpu")
    nets = family_steps.build_networks("dcgan", spec.options, mixed.ctx)
    step = family_steps.family_step(spec, mixed, _Batches(spec), nets)

    def weights():
        return {name: p.data().asnumpy().copy() for net in nets.values()
                for name, p in net.collect_params().items() if p.grad_req != "null"}
    before = weights()
    step().wait_to_read()
    after = weights()
    assert {name for name in before if not np.array_equal(before[name], after[name])} == set(before)
    assert any(name.startswith("generator_") for name in before) and any(n.startswith("discriminator_") for n in before)


@pytest.mark.parametrize("name", sorted(TINY))
def test_one_tiny_step_of_each_family_is_measured_as_bench_measures_it(name):
    from mxfp16.bench.runner import BenchSpec, measure

    options = resolve_options(name, TINY[name])
    record = measure(BenchSpec(model=name, image_size=FAMILIES[name].image_size, batch_size=2, iters=1, warmup=0,
                               repeats=1, ctx="cpu", options=options))  # float32: no AMP in this process
    assert record["status"] == "ok" and record["options"] == options and record["network"] == FAMILIES[name].title
    field = "tokens_per_second" if FAMILIES[name].unit == "tokens" else "images_per_second"
    assert report.throughput_field(record) == field
    items = 2 * (options["seq_len"] if field == "tokens_per_second" else 1)  # tokens or images per step
    assert record[field] == pytest.approx(items / (record["ms_per_step"] / 1000))


@pytest.mark.slow
def test_a_family_runs_through_the_bench_command_with_its_refusals_recorded(tmp_path):
    options = [arg for option in TINY["word-lm-gru"] for arg in ("--model-option", option)]
    assert main(["bench", "--model", "word-lm-gru", *options, "--batch-sizes", "2", "--iters", "1", "--warmup", "0",
                 "--repeats", "1", "--no-plots", "--no-census", "--precisions", "float32,amp-bfloat16", "--out",
                 str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["precision"]: r for r in doc["results"]}
    assert rows["float32"]["status"] == "ok" and rows["float32"]["tokens_per_second"] > 0
    assert doc["config"]["model_option"] == TINY["word-lm-gru"]
    assert rows["amp-bfloat16"]["status"] == ("ok" if BFLOAT16.runs else "skipped")
    if not BFLOAT16.runs:  # refused before any process starts, with the family's shape kept for the report
        assert BFLOAT16.reason in rows["amp-bfloat16"]["reason"] and rows["amp-bfloat16"]["seq_len"] == 5


@pytest.mark.skipif(not BFLOAT16.runs, reason="amp-bfloat16 does not run on this CPU: no row to unfuse")
def test_unfused_bf16_takes_the_fused_rnn_out_of_the_bfloat16_rows_only(tmp_path):
    # AMP keeps MXNet's fused RNN in float32 (no bfloat16 kernel); the option computes it from bfloat16 products.
    options = [arg for option in TINY["word-lm-lstm"] + ["unfused_bf16=1"] for arg in ("--model-option", option)]
    assert main(["bench", "--model", "word-lm-lstm", *options, "--batch-sizes", "2", "--iters", "1", "--warmup", "0",
                 "--repeats", "1", "--no-plots", "--precisions", "float32,amp-bfloat16", "--out", str(tmp_path)]) == 0
    rows = {r["precision"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    top = {name: [(e["primitive"], e["dtype"]) for e in row["census"]["top"]] for name, row in rows.items()}
    assert ("rnn", "f32") in top["float32"]  # float32 keeps the fused layer
    assert not any(primitive == "rnn" for primitive, _ in top["amp-bfloat16"])
    assert ("inner_product", "bf16") in top["amp-bfloat16"] and rows["amp-bfloat16"]["options"]["unfused_bf16"] == 1


@pytest.mark.skipif(not BFLOAT16.runs, reason="amp-bfloat16 does not run on this CPU: no row to route")
def test_bf16_deconv_runs_the_generators_transposed_convolutions_in_bfloat16_rows_only(tmp_path):
    # AMP keeps Deconvolution in float32 (its backward crashes on AMP's cast); the option gives it bfloat16 weights.
    # The generator a little wider than TINY's, so that its transposed convolutions weigh in the census.
    options = [arg for option in TINY["dcgan"] + ["ngf=16", "bf16_deconv=1"] for arg in ("--model-option", option)]
    assert main(["bench", "--model", "dcgan", *options, "--batch-sizes", "2", "--iters", "1", "--warmup", "0",
                 "--repeats", "1", "--no-plots", "--precisions", "float32,amp-bfloat16", "--out", str(tmp_path)]) == 0
    rows = {r["precision"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    # The census's top rows shift with the machine's load: whichever transposed convolutions are among them.
    dtypes = {name: {e["dtype"] for e in row["census"]["top"] if e["primitive"] == "deconvolution"}
              for name, row in rows.items()}
    assert dtypes["float32"] <= {"f32"} and dtypes["amp-bfloat16"] <= {"bf16"}
    assert rows["amp-bfloat16"]["census"]["percent"]["float32"] < 10  # without the option, about a fifth here
    assert rows["amp-bfloat16"]["options"]["bf16_deconv"] == 1


def test_what_does_not_apply_to_a_family_is_refused(tmp_path, capsys):
    for extra, words in ((["--classes", "10"], "--classes does not apply"),
                         (["--image-size", "32"], "--image-size does not apply"),
                         (["--mode", "inference"], "--mode train"),
                         (["--model-option", "depth=3"], "no option 'depth'")):
        assert main(["bench", "--model", "word-lm-lstm", *extra, "--out", str(tmp_path)]) == 2
        assert words in capsys.readouterr().err
    assert main(["bench", "--model", "cifar_resnet20_v1", "--model-option", "layers=2", "--out", str(tmp_path)]) == 2
    assert "--model-option sets a family's sizes" in capsys.readouterr().err
    assert main(["bench", "--model", "bert-encoder", "--model-option", "heads=5", "--out", str(tmp_path)]) == 2
    assert "not a multiple of heads=5" in capsys.readouterr().err


@pytest.mark.parametrize("timed", [True, False])
def test_a_familys_auto_is_a_row_of_its_own_where_timing_decides_it_and_comes_after_its_sizes(tmp_path, capsys,
                                                                                             monkeypatch, timed):
    # Where auto would be timed (a CPU with native bfloat16: avx512_bf16 or AMX) a family's auto row decides in its
    # own process; elsewhere the rule names the row. Either way a wrong option is named first (auto is a default).
    import mxfp16.measure.auto
    from mxfp16.bench.invocation import plan_invocation

    monkeypatch.setattr(mxfp16.measure.auto, "timing_applies", lambda ctx, support=None: timed)
    assert main(["bench", "--model", "word-lm-lstm", "--model-option", "depth=3", "--out", str(tmp_path)]) == 2
    assert "no option 'depth'" in capsys.readouterr().err
    small = ["hidden=8", "embed=8", "vocab=50"]
    specs = plan_invocation(model="word-lm-lstm", model_options=small, precisions="float32,amp-bfloat16,auto",
                            log=lambda line: None).specs
    assert [s.precision for s in specs][:2] == ["float32", "amp-bfloat16"]
    assert [s.precision for s in specs[2:]] == (["auto"] if timed else [])  # else auto is the row the rule names


@pytest.mark.slow
def test_a_familys_auto_row_times_the_network_at_its_first_step_and_says_what_it_chose(tmp_path):
    from mxfp16.devices import resolve_devices
    from mxfp16.measure.auto import timing_applies

    if not timing_applies(resolve_devices("cpu")):
        pytest.skip("the rule decides auto on this CPU: no row of its own")
    options = [arg for option in TINY["dcgan"] for arg in ("--model-option", option)]
    assert main(["bench", "--model", "dcgan", *options, "--batch-sizes", "2", "--iters", "1", "--warmup", "1",
                 "--repeats", "1", "--no-plots", "--no-census", "--precisions", "float32,auto", "--out",
                 str(tmp_path)]) == 0
    auto = json.loads((tmp_path / "bench.json").read_text())["results"][1]
    assert auto["requested_precision"] == "auto" and auto["status"] == "ok", auto.get("reason")
    assert auto["auto_reason"].startswith("timed on this CPU") and "DiscriminatorPass" in auto["auto_reason"]
    # The fastest bfloat16 candidate is named before its ratio: amp-bfloat16, or with a route (its discriminator's
    # 3-channel input gets the mxfp16+unaligned32 lists timed too).
    ratio = float(re.search(r"timed on this CPU: amp-bfloat16.*? at ([0-9.]+)x float32's speed",
                            auto["auto_reason"]).group(1))
    if abs(ratio - 1.05) > 0.01:  # the reason's ratio is rounded: at the threshold either verdict is right
        assert auto["precision"] == ("amp-bfloat16" if ratio > 1.05 else "float32")  # what it timed decides the row
    route = auto.get("auto_route")
    assert auto["amp_lists"] == (None if auto["precision"] == "float32" else
                                 "mxfp16+unaligned32" if route == "unaligned32" else "mxfp16")
    assert report.label(auto) == f"auto: {auto['precision']}" + (f", {route}" if route else "") + \
        (f" ({auto['amp_lists']} lists)" if auto["amp_lists"] else "")


def _token_row(framework, precision, ms, round_, compiled=None):
    return {"framework": framework, "precision": precision, "layout": None, "compiled": compiled, "amp_lists": None,
            "status": "ok", "model": "word-lm-lstm", "image_size": None, "seq_len": 35, "unit": "tokens",
            "batch_size": 32, "mode": "train", "data": "synthetic", "ctx": "cpu", "ms_per_step": ms,
            "images_per_second": None, "tokens_per_second": 32 * 35 / (ms / 1000), "cpu_ms_per_step": None,
            "peak_memory_mb": 100.0, "round": round_}


def test_tokens_and_compiled_rows_are_their_own_measurements_in_the_report():
    rounds = {"mxfp16": (1000.0, 1400.0, 1200.0), "eager": (2000.0, 2200.0, 2100.0), "compiled": (900.0, 1300.0, 800.0)}
    records = []
    for i in range(3):
        records += [_token_row("mxfp16", "float32", rounds["mxfp16"][i], i + 1),
                    _token_row("pytorch", "pytorch-float32", rounds["eager"][i], i + 1, False),
                    _token_row("pytorch", "pytorch-float32", rounds["compiled"][i], i + 1, True)]
    doc = report.bench_document({}, records)
    assert [report.label(r) for r in doc["results"]] == ["float32", "pytorch-float32", "pytorch-float32 (compiled)"]
    for row, ms in zip(doc["results"], (1200.0, 2100.0, 900.0)):  # each row's median over its own rounds
        assert row["tokens_per_second"] == pytest.approx(32 * 35 / (ms / 1000))
    (key, entry), = doc["peer"].items()
    assert key == "word-lm-lstm 35tok bs32 train"
    assert entry["peer_float32"]["label"] == "pytorch-float32 (compiled)"  # the faster of eager and compiled
    ratios = sorted(c / m for m, c in zip(rounds["mxfp16"], rounds["compiled"]))
    assert entry["float32_ratio"] == pytest.approx(ratios[1])  # paired within each round
    assert "tokens/s against pytorch-float32 (compiled)" in report.format_peer_comparison(doc["peer"])
    assert "tokens/s" in report.format_table(doc["results"]).splitlines()[0]


# ---- the PyTorch twins ---------------------------------------------------------------------------
def test_every_family_and_mobilenet_has_a_peer_with_its_rows():
    for name in (*FAMILIES, peer.MOBILENET_V2):
        assert peer.peer_network(name)
    assert peer.variants("word-lm-lstm") == [("float32", None, False), ("bfloat16", None, False),
                                             ("float32", None, True), ("bfloat16", None, True)]
    for name in ("dcgan", peer.MOBILENET_V2, "resnet50_v2"):
        assert peer.variants(name) == [(d, layout, False) for d, layout in peer.VARIANTS] + \
            [("float32", "channels_last", True), ("bfloat16", "channels_last", True)]
        assert peer.variants(name, compiled=False) == [(d, layout, False) for d, layout in peer.VARIANTS]


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_family_twin_has_its_mxnet_networks_parameters(name):
    pytest.importorskip("torch")
    from mxfp16.bench import peer_families

    options = resolve_options(name)
    twins = peer_families.build_networks(name, options)
    assert sum(p.numel() for net in twins.values() for p in net.parameters()) == DOCUMENTED[name]


def test_the_mobilenet_twin_has_gluoncvs_parameters():
    pytest.importorskip("torch")
    from mxfp16.bench import peer_families

    assert sum(p.numel() for p in peer_families.mobilenet_v2(102).parameters()) == _mobilenet_v2(102)


def _mxnet_params(net):
    return {k.split("_", 1)[1]: p.data().asnumpy() for k, p in net.collect_params().items()}


def _language_model_weights(mxnet_net, mode):
    params, layers = _mxnet_params(mxnet_net), 2
    weights = {"encoder.weight": params["embedding0_weight"], "decoder.bias": params["embedding0_bias"]}
    for layer in range(layers):  # MXNet's i2h/h2h are PyTorch's ih/hh, gates in the same order
        for kind, torch_kind in (("i2h", "ih"), ("h2h", "hh")):
            for w in ("weight", "bias"):
                weights[f"rnn.{w}_{torch_kind}_l{layer}"] = params[f"{mode}0_l{layer}_{kind}_{w}"]
    return weights


def _bert_weights(mxnet_net, layers):
    params = _mxnet_params(mxnet_net)
    weights = {"word_embed.weight": params["embedding0_weight"], "position_embed.weight": params["embedding1_weight"],
               "embed_norm.weight": params["layernorm0_gamma"], "embed_norm.bias": params["layernorm0_beta"],
               "pooler.weight": params["dense0_weight"], "pooler.bias": params["dense0_bias"],
               "output.weight": params["dense1_weight"], "output.bias": params["dense1_bias"]}
    for i in range(layers):
        block, twin = f"encoderblock{i}_", f"blocks.{i}."
        attention = block + "selfattention0_"
        for w in ("weight", "bias"):
            weights[twin + f"attention.in_proj_{w}"] = np.concatenate([params[attention + f"dense{j}_{w}"]
                                                                       for j in range(3)])
            weights[twin + f"attention.out_proj.{w}"] = params[attention + f"dense3_{w}"]
            weights[twin + f"ffn1.{w}"], weights[twin + f"ffn2.{w}"] = (params[block + f"dense{j}_{w}"] for j in (0, 1))
        for j in (1, 2):
            weights[twin + f"norm{j}.weight"] = params[block + f"layernorm{j - 1}_gamma"]
            weights[twin + f"norm{j}.bias"] = params[block + f"layernorm{j - 1}_beta"]
    return weights


@pytest.mark.parametrize("name", ["word-lm-lstm", "word-lm-gru", "bert-encoder"])
def test_with_the_mxnet_weights_the_twin_computes_the_same_scores(name):
    # Beyond the counts: gate order, GRU's reset before the recurrent bias, tying, attention packing, GELU, the
    # pooler's first token (dropout off on both sides).
    torch = pytest.importorskip("torch")
    from mxfp16.bench import peer_families

    options = resolve_options(name, TINY[name] + ["dropout=0"])
    mxnet_net = family_steps.build_networks(name, options)["net"]
    twin = peer_families.build_networks(name, options)["net"]
    weights = (_bert_weights(mxnet_net, options["layers"]) if name == "bert-encoder" else
               _language_model_weights(mxnet_net, name.rsplit("-", 1)[1]))
    missing = twin.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()},
                                   strict=False).missing_keys
    assert missing == (["decoder.weight"] if name != "bert-encoder" else [])  # tied: it is encoder.weight
    tokens = np.random.RandomState(0).randint(0, options["vocab"], (3, options["seq_len"]))
    with torch.no_grad():
        ours = twin.eval()(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(ours, mxnet_net(mx.nd.array(tokens, dtype="int32")).asnumpy(), rtol=1e-4, atol=1e-5)
