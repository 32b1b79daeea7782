"""``auto`` with a route (mxfp16.measure.auto.ROUTES): amp-bfloat16 timed both as AMP runs the network and with its
recurrent layers unfused, the faster of the two against float32, and the verdict's route applied to the network."""
import json

from mxfp16._internals import renew_parameter_symbols
from mxfp16.amp import lists, recurrent
from mxfp16.machine import hardware
from mxfp16.measure import auto

import mxnet as mx
import numpy as np
import pytest
from conftest import BFLOAT16_RUNS, requires_bfloat16, run_python
from mxnet import gluon

CPU = [mx.cpu()]
ROUTE, LISTS = "unfused-rnn", "unaligned32"


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
    cnn.add(gluon.nn.Conv2D(16, 3), gluon.nn.Dense(2))
    assert auto.network_routes(cnn) == ()
    with pytest.raises(ValueError, match="amp-bfloat16 only"):
        auto.adopt("float32", CPU, "mxfp16", [_language_model()], route=ROUTE)


def _cnn(*layers):
    net = gluon.nn.HybridSequential()
    net.add(*layers)
    net.initialize()
    return net


def test_a_list_route_is_offered_under_the_lists_it_extends_only():
    unaligned = _cnn(gluon.nn.Conv2D(24, 1), gluon.nn.Conv2D(32, 1))  # MobileNet v2's 24 channels out
    assert auto.network_routes(unaligned) == (LISTS,)
    assert auto.network_routes(unaligned, "mxnet") == ()  # the user's own lists are kept
    assert auto.network_routes(unaligned, "mxfp16+unaligned32") == ()  # nothing left to change
    assert auto.network_routes(unaligned, "mxfp16+batchnorm32") == ()
    assert auto.route_lists(LISTS, "mxfp16") == "mxfp16+unaligned32"
    assert auto.route_lists(ROUTE, "measured") == auto.route_lists(None, "measured") == "measured"
    with pytest.raises(ValueError, match="differ in their operator lists"):
        lists.keeps_more_float32(unaligned, "mxnet", "mxfp16")


@pytest.mark.parametrize("layers, in_shape", [
    ((gluon.nn.Conv2D(32, 3, in_channels=3),), (1, 3, 8, 8)),  # 3 channels in
    ((gluon.nn.Conv2D(24, 1, in_channels=32),), (1, 32, 8, 8)),  # 24 out
    ((gluon.nn.Conv2D(32, 3, in_channels=16),), (1, 16, 8, 8)),
    ((gluon.nn.Conv2D(64, 7, in_channels=3),), (1, 3, 16, 16)),  # the stem: float32 under mxfp16's lists already
    ((gluon.nn.Conv2D(32, 3, groups=32, in_channels=32),), (1, 32, 8, 8)),  # depthwise: 32 in, 1 per group
    ((gluon.nn.Conv2D(24, 3, groups=2, in_channels=16),), (1, 16, 8, 8)),  # grouped: 24 out
    ((gluon.nn.Conv2DTranspose(3, 4, in_channels=16),), (1, 16, 4, 4)),  # Deconvolution: no such rule
    ((gluon.nn.Dense(24, in_units=16),), (1, 16)),
    ((gluon.nn.Conv2D(32, 3), gluon.nn.Conv2D(32, 1)), (1, 3, 8, 8)),  # deferred, 3 in: known once it ran
])
def test_the_lists_route_sees_what_the_graph_rules_keep_in_float32(layers, in_shape):
    """Read from the blocks before they run, against the rules applied to the traced graph's nodes."""
    net = _cnn(*layers)
    deferred = any(0 in p.shape for p in net.collect_params().values())
    before = lists.keeps_more_float32(net, "mxfp16+unaligned32", "mxfp16")
    net(mx.nd.zeros(in_shape))
    renew_parameter_symbols(net)  # Gluon cached the weights' symbols before their shapes were known
    symbol = net(mx.sym.var("data"))
    graph = set(lists.float32_layers(symbol, "bfloat16", "mxfp16+unaligned32")) - \
        set(lists.float32_layers(symbol, "bfloat16", "mxfp16"))
    assert lists.keeps_more_float32(net, "mxfp16+unaligned32", "mxfp16") == bool(graph)
    assert before == (bool(graph) and not deferred)  # a deferred layer is judged by its output channels only


def test_the_fastest_list_set_is_the_candidate_and_named(native):
    probe = RoutedProbe({"float32": 1000.0, "amp-bfloat16": 800.0, f"amp-bfloat16+{LISTS}": 600.0}, key="cnn")
    probe.routes = (LISTS,)
    verdict = decide(probe, native)
    assert (verdict.precision, verdict.route) == ("amp-bfloat16", LISTS)
    assert verdict.ratio == pytest.approx(1000 / 600) and verdict.alternatives == {"amp": pytest.approx(1.25)}
    assert "in float32 (amp_lists='mxfp16+unaligned32') at 1.67x" in verdict.reason
    assert auto.route_lists(verdict.route, "mxfp16") == "mxfp16+unaligned32"


def _given_times(tmp_path, ms):
    """The start of a child's code: a stand-in CPU with native bfloat16 whose probe times are ``ms`` per candidate
    (``'amp-bfloat16+<route>'`` for a route's), its cache in ``tmp_path``, and ``mp = MixedPrecision('auto')``."""
    return f"""
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
        ms = {ms!r}
        probe.NetworkProbe.time = lambda self, p, iters, route=None, **_: {{
            "status": "ok", "precision": p, "ms_per_step": ms[p if route is None else p + "+" + route]}}
        mp = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)
"""


def test_a_verdict_with_the_route_unfuses_the_network_it_timed(tmp_path):
    """In a child (AMP is process-global): times given per candidate, the route wins, and the network that trains is
    the user's own gluon.rnn.LSTM unfused, with its parameters, its checkpoint and its numbers."""
    code = _given_times(tmp_path, {"float32": 900.0, "amp-bfloat16": 800.0, f"amp-bfloat16+{ROUTE}": 300.0}) + """
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Embedding(50, 16), gluon.rnn.LSTM(16, layout="NTC"), gluon.nn.Dense(50, flatten=False))
        net.initialize(mx.init.Uniform(0.1), ctx=mp.ctx)
        net.hybridize()
        lstm = net[1]
        names = sorted(net.collect_params().keys())
        trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})
        tokens = mx.nd.array([[1, 2, 3, 4, 5, 6]] * 4)
        loss = gluon.loss.SoftmaxCrossEntropyLoss()
        data, label = mp.cast_batch(tokens, tokens)
        ran = True
        try:
            mp.train_step(net, loss, trainer, data, label)
            mx.nd.waitall()
        except mx.base.MXNetError:
            ran = False  # bfloat16 may not run on this CPU: the verdict and the graph are under test
        ops = {n["op"] for _, sym in built_graphs(net) for n in json.loads(sym.tojson())["nodes"]}
        print(json.dumps({"precision": mp.precision.name, "route": mp.verdict.route, "ran": ran,
                          "unfused": type(lstm).__module__ + "." + type(lstm).__name__, "steps": lstm.steps,
                          "same_params": sorted(net.collect_params().keys()) == names,
                          "rnn_op": "RNN" in ops, "products": "FullyConnected" in ops,
                          "state": mp.state_dict()["auto"]["route"]}))
    """
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert (result["precision"], result["route"], result["state"]) == ("amp-bfloat16", ROUTE, ROUTE)
    assert result["unfused"] == "mxfp16.amp.recurrent.LSTM" and result["same_params"]
    if result["ran"]:  # traced and trained: the sequence length read from the batch, no fused RNN in the graph
        assert result["steps"] == 6 and not result["rnn_op"] and result["products"]
    assert result["ran"] or not BFLOAT16_RUNS


def test_a_resumed_run_takes_its_own_route_and_this_mxfp16_drops_one_it_does_not_know():
    """The trainer's resume (own_precision) and load_state_dict: the route recorded with the run is applied to the
    networks prepared, with no timing; a route beside float32, or one this mxfp16 lacks, is dropped."""
    code = """
        import json, warnings
        warnings.simplefilter("ignore")
        import mxfp16
        from mxfp16.measure import probe
        from mxfp16.machine import hardware
        import mxnet as mx
        from mxnet import gluon
        hardware.bfloat16_support = lambda *a, **k: hardware.BFloat16Support("native", "stand-in")
        probe.NetworkProbe.time = lambda *a, **k: 1 / 0  # nothing may be timed
        def language_model():
            net = gluon.nn.HybridSequential()
            net.add(gluon.nn.Embedding(50, 16), gluon.rnn.LSTM(16, layout="NTC"), gluon.nn.Dense(50, flatten=False))
            net.initialize()
            return net
        found = {}
        for name, route in (("float32", "unfused-rnn"), ("amp-bfloat16", "unfused-rnn"),  # float32 before AMP is on
                            ("amp-bfloat16", "a-route-gone")):
            mp = mxfp16.MixedPrecision("auto", "cpu", own_precision=(name, "runs/x/config.json", route),
                                       log=lambda line: None)
            net = language_model()
            mp.prepare(net, "sgd")
            found[f"{name} {route}"] = [type(net[1]).__name__, type(net[1]).__module__, mp.verdict.route,
                                        mp.state_dict()["auto"]["route"]]
        pending = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)  # a library user's own resume
        net = language_model()
        pending.prepare(net, "sgd")
        pending.load_state_dict(dict(pending.state_dict(), precision="amp-bfloat16", requested="auto",
                                     auto={"route": "unfused-rnn"}))
        found["load_state_dict"] = [type(net[1]).__name__, type(net[1]).__module__, pending.verdict.route, None]
        print(json.dumps(found))
    """
    found = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert found["amp-bfloat16 unfused-rnn"] == ["LSTM", "mxfp16.amp.recurrent", ROUTE, ROUTE]
    assert found["load_state_dict"] == ["LSTM", "mxfp16.amp.recurrent", ROUTE, None]
    for dropped in ("amp-bfloat16 a-route-gone", "float32 unfused-rnn"):
        assert found[dropped] == ["LSTM", "mxnet.gluon.rnn.rnn_layer", None, None]


def test_a_verdict_with_the_list_route_trains_under_its_lists(tmp_path):
    """In a child: the list route wins, and MixedPrecision runs AMP under ``mxfp16+unaligned32``, judging its deferred
    network again once the first step gave it shapes, as it does for those lists asked for by name."""
    code = _given_times(tmp_path, {"float32": 900.0, "amp-bfloat16": 800.0, f"amp-bfloat16+{LISTS}": 500.0}) + """
        from mxfp16.amp.wrappers import dtype_name
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(24, 1), gluon.nn.Conv2D(32, 1), gluon.nn.Conv2D(32, 1))  # deferred: 32 in, unknown
        net.initialize(ctx=mp.ctx)
        net.hybridize()
        trainer = mp.prepare(net, "sgd", {"learning_rate": 0.01})
        data, label = mp.cast_batch(mx.nd.ones((2, 32, 4, 4)), mx.nd.zeros((2,)))
        ran, dtypes = True, []
        try:
            for _ in range(2):
                mp.train_step(net, lambda out, y: (out * out).mean(), trainer, data, label)
            mx.nd.waitall()
            graph = built_graphs(net)[0][1]
            internals = graph.get_internals()
            _, types, _ = internals.infer_type(data="float32")
            dtype = dict(zip(internals.list_outputs(), types))
            dtypes = [dtype_name(dtype[n["name"] + "_output"]) for n in json.loads(graph.tojson())["nodes"]
                      if n["op"] == "Convolution"]
        except mx.base.MXNetError:
            ran = False  # bfloat16 may not run on this CPU: the verdict and the lists are under test
        print(json.dumps({"precision": mp.precision.name, "lists": mp.amp_lists, "ran": ran, "dtypes": dtypes,
                          "state": mp.state_dict()["auto"]["route"]}))
    """
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert (result["precision"], result["lists"], result["state"]) == ("amp-bfloat16", "mxfp16+unaligned32", LISTS)
    if result["ran"]:  # 32 -> 24 and 24 -> 32 in float32 (the second known only after the first step)
        assert result["dtypes"] == ["float32", "float32", "bfloat16"]
    assert result["ran"] or not BFLOAT16_RUNS


@requires_bfloat16
def test_the_probe_times_the_list_route_on_a_deferred_network_in_its_child():
    from mxfp16.measure.probe import NetworkProbe

    net = _cnn(gluon.nn.Conv2D(24, 1), gluon.nn.Conv2D(32, 1))
    net.hybridize()
    probe = NetworkProbe(net, [mx.nd.ones((2, 32, 4, 4))], None, CPU)
    assert probe.routes == (LISTS,)
    record = probe.time("amp-bfloat16", iters=2, warmup=1, repeats=1, route=LISTS)
    assert record["status"] == "ok", record
    assert 0 in net[0].weight.shape  # the child's step gave the shapes there, not here


def test_the_bench_runs_auto_once_under_its_routes_lists(monkeypatch):
    """A model the bench decides auto for in its parent (a zoo model's): the row goes to its child by the list set the
    route runs under, and is not run twice where amp-bfloat16 is asked for under those lists too."""
    from mxfp16.bench.runner import BenchSpec
    from mxfp16.bench.suite import plan

    monkeypatch.setattr(hardware, "bfloat16_support", lambda *a, **k: hardware.BFloat16Support("native", "stand-in"))
    base, verdict = BenchSpec(image_size=32, ctx="cpu"), {4: ("amp-bfloat16", "mxfp16+unaligned32")}

    def rows(precisions, amp_lists, auto=verdict):
        return [(s.precision, s.requested, s.amp_lists) for s in plan(base, precisions, [4], amp_lists, auto=auto)]

    assert rows(["float32", "auto"], ("mxfp16",)) == [("float32", None, "mxfp16"),
                                                      ("amp-bfloat16", "auto", "mxfp16+unaligned32")]
    both = ("mxfp16", "mxfp16+unaligned32")
    assert rows(["float32", "amp-bfloat16", "auto"], both) == [("float32", None, "mxfp16"),
                                                               ("amp-bfloat16", None, "mxfp16"),
                                                               ("amp-bfloat16", None, "mxfp16+unaligned32")]
    # Without a route auto is one run with amp-bfloat16 under each list set, as before.
    assert rows(["float32", "amp-bfloat16", "auto"], both, {4: ("amp-bfloat16", None)}) == \
        rows(["float32", "amp-bfloat16"], both, None)


def test_the_measure_table_takes_autos_row_by_its_lists():
    from mxfp16.bench import measure_plan

    from conftest import REPO

    path = f"{REPO}/docs/results/bench-families-amx-emerald-rapids/bench-mbv2/bench.json"
    doc = json.loads(open(path, encoding="utf-8").read())  # float32; amp-bfloat16 under three list sets
    bf16 = [r for r in doc["results"] if r.get("framework", "mxfp16") == "mxfp16" and r["precision"] == "amp-bfloat16"]
    chosen = bf16[-1]  # not the first row: the lists pick it
    assert len({r["speedup"] for r in bf16}) == len(bf16) == 3
    doc["config"]["precisions"] = "float32,amp-bfloat16,auto"
    doc["config"]["auto"] = {"16": {"precision": "amp-bfloat16", "route": LISTS, "amp_lists": chosen["amp_lists"]}}
    row = measure_plan.summary_row(doc)
    assert row["auto"] == f"amp-bfloat16, {LISTS}" and row["auto_over_fp32"] == chosen["speedup"]


@requires_bfloat16
def test_a_familys_auto_row_records_the_lists_its_route_ran_under(tmp_path):
    """DCGAN's discriminator reads 3 channels and writes 1: the list route is offered, and given the times, chosen."""
    code = f"""
        import json, os, warnings
        warnings.simplefilter("ignore")
        os.environ["MXFP16_CACHE_DIR"] = {str(tmp_path)!r}
        from mxfp16.measure import auto, probe
        from mxfp16.machine import hardware
        from mxfp16.bench import report, runner
        from mxfp16.bench.families import resolve_options
        auto.machine_busy = lambda: None
        offered = []
        def time(self, p, iters, route=None, **_):
            offered.append(route)
            return {{"status": "ok", "precision": p, "ms_per_step": {{None: 900.0, "unaligned32": 500.0}}.get(
                route, 800.0) if p != "float32" else 1000.0}}
        probe.NetworkProbe.time = time
        spec = runner.BenchSpec(model="dcgan", precision="auto", ctx="cpu", batch_size=4, iters=1, warmup=0,
                                repeats=1, image_size=64, options=resolve_options("dcgan", ["nz=10", "ngf=4", "ndf=4"]))
        record = runner.measure(spec)
        print(json.dumps({{"offered": sorted(set(map(str, offered))), "route": record.get("auto_route"),
                          "lists": record["amp_lists"], "label": report.label(record)}}))
    """
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert LISTS in result["offered"] and (result["route"], result["lists"]) == (LISTS, "mxfp16+unaligned32")
    assert result["label"] == f"auto: amp-bfloat16, {LISTS} (mxfp16+unaligned32 lists)"


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
