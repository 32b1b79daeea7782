"""``auto`` with a route (mxfp16.measure.auto.ROUTES): amp-bfloat16 timed both as AMP runs the network and with its
recurrent layers unfused, the faster of the two against float32, and the verdict's route applied to the network."""
import json

from mxfp16.amp import recurrent
from mxfp16.machine import hardware
from mxfp16.measure import auto

import mxnet as mx
import numpy as np
import pytest
from conftest import BFLOAT16_RUNS, requires_bfloat16, run_python
from mxnet import gluon

CPU = [mx.cpu()]
ROUTE = "unfused-rnn"


class RoutedProbe:
    """A probe whose times are given per candidate: ``ms['amp-bfloat16+unfused-rnn']`` for the route's."""

    routes = (ROUTE,)
    where = "the stand-in language model"

    def __init__(self, ms, failed=(), key="lm-a"):
        self.ms, self.failed, self.runs, self._key = dict(ms), set(failed), [], key

    @property
    def key(self):
        return {"network": self._key}

    def time(self, precision, iters, route=None):
        name = precision if route is None else f"{precision}+{route}"
        self.runs.append(name)
        if name in self.failed:
            return {"status": "failed", "precision": precision, "reason": "Traceback ...\nValueError: cannot unfuse"}
        return {"status": "ok", "precision": precision, "ms_per_step": self.ms[name]}


@pytest.fixture
def native(monkeypatch, tmp_path):
    monkeypatch.delenv(auto.REPEAT_MS_VARIABLE, raising=False)
    monkeypatch.setattr(hardware, "bfloat16_support", lambda *a, **k: hardware.BFloat16Support("native", "stand-in"))
    monkeypatch.setattr(auto, "machine_busy", lambda: None)
    return str(tmp_path / "auto-precision.json")


def decide(probe, cache):
    return auto.decide_auto(CPU, probe, log=lambda line: None, cache=cache)


@pytest.mark.parametrize("f32, amp, routed, chosen, route", [
    (1000.0, 900.0, 500.0, "amp-bfloat16", ROUTE),  # only the route pays
    (1000.0, 500.0, 900.0, "amp-bfloat16", None),   # AMP as it runs the network is faster
    (1000.0, 1100.0, 980.0, "float32", None),       # the best candidate, 1.02x, is inside the margin
])
def test_the_faster_candidate_is_weighed_against_float32(native, f32, amp, routed, chosen, route):
    probe = RoutedProbe({"float32": f32, "amp-bfloat16": amp, f"amp-bfloat16+{ROUTE}": routed})
    verdict = decide(probe, native)
    rounds = len(probe.runs) // 3  # a close call (the last case) is timed in more rounds
    assert probe.runs == ["float32", "amp-bfloat16", f"amp-bfloat16+{ROUTE}"] * rounds
    assert (verdict.precision, verdict.route) == (chosen, route)
    best, other = (routed, amp) if routed < amp else (amp, routed)
    assert verdict.ratio == pytest.approx(f32 / best) and verdict.candidate_ms == best
    assert list(verdict.alternatives.values()) == pytest.approx([f32 / other])
    assert f"{f32 / best:.2f}x" in verdict.reason and f"{f32 / other:.2f}x" in verdict.reason
    assert ("recurrent layers unfused" in verdict.reason.split(" at ")[0]) == (routed < amp)


def test_a_route_that_fails_is_left_out_and_said(native):
    probe = RoutedProbe({"float32": 1000.0, "amp-bfloat16": 500.0}, failed={f"amp-bfloat16+{ROUTE}"})
    verdict = decide(probe, native)
    assert (verdict.precision, verdict.route) == ("amp-bfloat16", None) and verdict.measured
    assert "recurrent layers unfused (mxfp16.amp.unfuse_rnn) failed (ValueError: cannot unfuse)" in verdict.reason


def test_a_close_call_times_every_candidate_again(native):
    # 1.10x for the route in the first round: confirmed by two more rounds, each timing all three.
    ms = {"float32": 1000.0, "amp-bfloat16": 1200.0, f"amp-bfloat16+{ROUTE}": 910.0}
    probe = RoutedProbe(ms)
    verdict = decide(probe, native)
    assert probe.runs == ["float32", "amp-bfloat16", f"amp-bfloat16+{ROUTE}"] * 3
    assert verdict.route == ROUTE and len(verdict.round_ratios) == 3


def test_the_route_travels_in_the_cache_and_the_record(native):
    first = decide(RoutedProbe({"float32": 1000.0, "amp-bfloat16": 900.0, f"amp-bfloat16+{ROUTE}": 500.0}), native)
    again = decide(RoutedProbe({}), native)
    assert again.cached and again.route == first.route == ROUTE and again.alternatives == first.alternatives
    assert first.record()["route"] == ROUTE
    # An entry naming a route this mxfp16 does not have is measured again.
    doc = json.loads(open(native).read())
    for entry in doc["verdicts"].values():
        entry["route"] = "a-route-gone"
    open(native, "w").write(json.dumps(doc))
    probe = RoutedProbe({"float32": 1000.0, "amp-bfloat16": 900.0, f"amp-bfloat16+{ROUTE}": 500.0})
    assert not decide(probe, native).cached and probe.runs


def _language_model(projection=False):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Embedding(50, 16), gluon.rnn.LSTM(16, layout="NTC", projection_size=8 if projection else 0),
            gluon.nn.Dense(50, flatten=False))
    net.initialize(mx.init.Uniform(0.1))
    return net


def test_a_route_is_offered_where_it_changes_a_layer():
    assert auto.network_routes(_language_model()) == (ROUTE,)
    assert auto.network_routes(_language_model(projection=True)) == ()  # the fused kernel's own option
    cnn = gluon.nn.HybridSequential()
    cnn.add(gluon.nn.Conv2D(4, 3), gluon.nn.Dense(2))
    assert auto.network_routes(cnn) == ()
    with pytest.raises(ValueError, match="amp-bfloat16 only"):
        auto.adopt("float32", CPU, "mxfp16", [_language_model()], route=ROUTE)


def test_a_verdict_with_the_route_unfuses_the_network_it_timed(tmp_path):
    """In a child (AMP is process-global): times given per candidate, the route wins, and the network that trains is
    the user's own gluon.rnn.LSTM unfused, with its parameters, its checkpoint and its numbers."""
    code = f"""
        import json, os, warnings
        warnings.simplefilter("ignore")
        os.environ["MXFP16_CACHE_DIR"] = {str(tmp_path)!r}
        import mxfp16
        from mxfp16.measure import auto, probe
        from mxfp16.machine import hardware
        from mxfp16._internals import built_graphs
        import mxnet as mx
        from mxnet import gluon
        hardware.bfloat16_support = lambda *a, **k: hardware.BFloat16Support("native", "stand-in")
        auto.machine_busy = lambda: None
        ms = {{"float32": 900.0, "amp-bfloat16": 800.0, "amp-bfloat16+unfused-rnn": 300.0}}
        probe.NetworkProbe.time = lambda self, p, iters, route=None, **_: {{
            "status": "ok", "precision": p, "ms_per_step": ms[p if route is None else p + "+" + route]}}
        mp = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Embedding(50, 16), gluon.rnn.LSTM(16, layout="NTC"), gluon.nn.Dense(50, flatten=False))
        net.initialize(mx.init.Uniform(0.1), ctx=mp.ctx)
        net.hybridize()
        lstm = net[1]
        names = sorted(net.collect_params().keys())
        trainer = mp.prepare(net, "sgd", {{"learning_rate": 0.1}})
        tokens = mx.nd.array([[1, 2, 3, 4, 5, 6]] * 4)
        loss = gluon.loss.SoftmaxCrossEntropyLoss()
        data, label = mp.cast_batch(tokens, tokens)
        ran = True
        try:
            mp.train_step(net, loss, trainer, data, label)
            mx.nd.waitall()
        except mx.base.MXNetError:
            ran = False  # bfloat16 may not run on this CPU: the verdict and the graph are under test
        ops = {{n["op"] for _, sym in built_graphs(net) for n in json.loads(sym.tojson())["nodes"]}}
        print(json.dumps({{"precision": mp.precision.name, "route": mp.verdict.route, "ran": ran,
                          "unfused": type(lstm).__module__ + "." + type(lstm).__name__, "steps": lstm.steps,
                          "same_params": sorted(net.collect_params().keys()) == names,
                          "rnn_op": "RNN" in ops, "products": "FullyConnected" in ops,
                          "state": mp.state_dict()["auto"]["route"]}}))
    """
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert (result["precision"], result["route"], result["state"]) == ("amp-bfloat16", ROUTE, ROUTE)
    assert result["unfused"] == "mxfp16.amp.recurrent.LSTM" and result["same_params"]
    if result["ran"]:  # traced and trained: the sequence length read from the batch, no fused RNN in the graph
        assert result["steps"] == 6 and not result["rnn_op"] and result["products"]
    assert result["ran"] or not BFLOAT16_RUNS


@requires_bfloat16
def test_the_probe_times_the_route_in_its_child_and_this_process_keeps_the_fused_layer():
    from mxfp16.measure.probe import NetworkProbe

    net = _language_model()
    net.hybridize()
    tokens = mx.nd.array(np.random.RandomState(0).randint(0, 50, (4, 7)))
    probe = NetworkProbe(net, [tokens], [tokens], CPU, gluon.loss.SoftmaxCrossEntropyLoss())
    assert probe.routes == (ROUTE,)
    record = probe.time("amp-bfloat16", iters=2, warmup=1, repeats=1, route=ROUTE)
    assert record["status"] == "ok", record
    assert type(net[1]) is gluon.rnn.LSTM and not recurrent.fuse_rnn(net)  # nothing unfused here


def test_a_network_auto_unfused_goes_back_to_the_fused_kernel_after_too_many_lengths():
    net = _language_model()
    net.hybridize()
    auto.ROUTES[ROUTE].apply(net)  # as adopt applies the route
    assert isinstance(net[1], recurrent.LSTM)
    rng = np.random.RandomState(1)
    lengths = list(range(3, 3 + auto.UNFUSED_MAX_LENGTHS + 1))
    outputs = {}
    for length in lengths[:-1]:
        outputs[length] = net(mx.nd.array(rng.randint(0, 50, (2, length))))
        assert isinstance(net[1], recurrent.LSTM) and net[1].steps == length
    with pytest.warns(UserWarning, match="go back to MXNet's fused kernel"):
        net(mx.nd.array(rng.randint(0, 50, (2, lengths[-1]))))
    assert type(net[1]) is gluon.rnn.LSTM
