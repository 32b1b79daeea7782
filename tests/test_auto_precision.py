"""``auto`` (mxfp16.measure.auto): one decision procedure, its rounds and cache, the forked probe, and one verdict for
the library and the trainer."""
import json
import os

import mxfp16
from mxfp16.machine import hardware
from mxfp16.measure import auto
from mxfp16.measure import probe as probes

import mxnet as mx
import numpy as np
import pytest
from conftest import BFLOAT16_RUNS, last_line_json, run_python

CPU = [mx.cpu()]
NATIVE = hardware.BFloat16Support("native", "avx512_bf16")


class FakeProbe:
    """A probe whose times are given: ``ms[precision]`` (a list: one time per round); ``runs`` records calls."""

    def __init__(self, ms, status=None, key="net-a"):
        self.ms, self.status, self.runs, self.iters, self._key = dict(ms), dict(status or {}), [], [], key

    @property
    def key(self):
        return {"network": self._key}

    where = "the stand-in network"

    def time(self, precision, iters):
        self.runs.append(precision)
        self.iters.append(iters)
        ms = self.ms[precision]
        ms = ms.pop(0) if isinstance(ms, list) else ms
        if self.status.get(precision, "ok") != "ok":
            return {"status": "failed", "precision": precision, "reason": "Traceback ...\nMXNetError: something broke"}
        return {"status": "ok", "precision": precision, "ms_per_step": ms}


@pytest.fixture
def native(monkeypatch, tmp_path):
    """A CPU where timing applies (native bfloat16), an idle machine, a cache of this test's own, and the default
    repeat length (the suite shortens it for the networks it does not test auto on: conftest.py)."""
    monkeypatch.delenv(auto.REPEAT_MS_VARIABLE, raising=False)
    monkeypatch.setattr(hardware, "bfloat16_support", lambda *a, **k: NATIVE)
    monkeypatch.setattr(auto, "machine_busy", lambda: None)
    return str(tmp_path / "cache" / "auto-precision.json")


def decide(probe, cache, log=None):
    return auto.decide_auto(CPU, probe, log=log or (lambda line: None), cache=cache)


@pytest.mark.parametrize("f32, bf16, chosen", [
    (1000.0, 500.0, "amp-bfloat16"),   # 2x
    (1000.0, 960.0, "float32"),        # 1.04x: inside the margin
    (1000.0, 2000.0, "float32"),       # slower
])
def test_the_faster_precision_is_chosen_beyond_the_margin(native, f32, bf16, chosen):
    verdict = decide(FakeProbe({"float32": f32, "amp-bfloat16": bf16}), native)
    assert verdict.precision == chosen and verdict.measured and not verdict.cached
    assert verdict.ratio == pytest.approx(f32 / bf16)
    assert verdict.reason.startswith("timed on this CPU:") and f"{f32 / bf16:.2f}x" in verdict.reason


def test_a_first_round_near_one_is_confirmed_by_more_rounds_and_their_median_decides(native):
    # 1.11x in the first round, 0.95x and 1.02x in the two after it: float32 (median 1.02x).
    probe = FakeProbe({"float32": [1000.0, 950.0, 1020.0], "amp-bfloat16": [900.0, 1000.0, 1000.0]})
    lines = []
    verdict = decide(probe, native, lines.append)
    assert probe.runs == ["float32", "amp-bfloat16"] * 3
    assert verdict.round_ratios == pytest.approx((1000 / 900, 0.95, 1.02)) and verdict.ratio == pytest.approx(1.02)
    assert verdict.precision == "float32" and "median of 3 rounds" in verdict.reason
    assert (verdict.float32_ms, verdict.candidate_ms) == (1000.0, 1000.0)   # each precision's median time
    assert any("close call" in line for line in lines)
    # A clear first round of long repeats decides alone, either way.
    for f32, bf16, chosen in ((1000.0, 700.0, "amp-bfloat16"), (1000.0, 1300.0, "float32")):
        clear_probe = FakeProbe({"float32": f32, "amp-bfloat16": bf16}, key=f"net-{f32}-{bf16}")
        clear = decide(clear_probe, native)
        assert clear.precision == chosen and len(clear_probe.runs) == 2 and len(clear.round_ratios) == 1
    # The cached verdict keeps its rounds.
    again = decide(FakeProbe({}), native)
    assert again.cached and again.round_ratios == pytest.approx(verdict.round_ratios)


def test_short_steps_are_timed_again_in_long_repeats_and_the_short_round_is_left_out(native):
    # A 20 ms step read 2x in one short round, then 0.97x, 1.0x and 0.98x over repeats of 1 s: float32.
    probe = FakeProbe({"float32": [20.0, 9.7, 10.0, 9.8], "amp-bfloat16": [10.0, 10.0, 10.0, 10.0]})
    lines = []
    verdict = decide(probe, native, lines.append)
    assert probe.runs == ["float32", "amp-bfloat16"] * 4
    assert verdict.round_ratios == pytest.approx((0.97, 1.0, 0.98)) and verdict.precision == "float32"
    # The long rounds time MIN_REPEAT_MS per repeat at least: 1000 ms of 10 ms steps is 100 steps.
    assert probe.iters[:2] == [auto.PROBE_ITERS] * 2 and probe.iters[2:] == [100] * 6
    assert any("too short" in line for line in lines)


def test_the_repeat_length_can_be_set_and_a_bad_one_is_refused_before_timing(native, monkeypatch):
    # 200 ms of 10 ms steps is 20 steps per repeat; a first round of 3 x 100 ms steps then decides alone.
    monkeypatch.setenv(auto.REPEAT_MS_VARIABLE, "200")
    probe = FakeProbe({"float32": [20.0, 9.7, 10.0, 9.8], "amp-bfloat16": [10.0, 10.0, 10.0, 10.0]})
    decide(probe, native)
    assert probe.iters == [auto.PROBE_ITERS] * 2 + [20] * 6
    slow = FakeProbe({"float32": 200.0, "amp-bfloat16": 100.0}, key="net-slow")
    assert decide(slow, native).precision == "amp-bfloat16" and slow.runs == ["float32", "amp-bfloat16"]
    assert auto.min_repeat_ms({}) == auto.MIN_REPEAT_MS == 1000.0
    for bad in ("0", "-5", "fast", "nan", "inf"):
        monkeypatch.setenv(auto.REPEAT_MS_VARIABLE, bad)
        probe = FakeProbe({"float32": 10.0, "amp-bfloat16": 10.0}, key=f"net-{bad}")
        with pytest.raises(mxfp16.PrecisionError, match=f"MXFP16_AUTO_REPEAT_MS='{bad}' is not a positive number.*"
                                                        "unset it"):
            decide(probe, native)
        assert probe.runs == []


def test_the_verdict_is_cached_per_network(native):
    first_probe = FakeProbe({"float32": 1000.0, "amp-bfloat16": 500.0})
    first = decide(first_probe, native)
    lines = []
    again = decide(FakeProbe({}), native, log=lines.append)
    assert again.cached and again.precision == first.precision
    assert len(lines) == 1 and "measured earlier" in lines[0] and native in lines[0]  # nothing timed, and it says so
    other = FakeProbe({"float32": 1000.0, "amp-bfloat16": 2000.0}, key="net-b")
    assert not decide(other, native).cached and other.runs  # another network is another verdict
    doc = json.loads(open(native).read())
    assert doc["version"] == auto._CACHE_VERSION and len(doc["verdicts"]) == 2


def test_a_damaged_cache_is_measured_again_and_rewritten(native):
    os.makedirs(os.path.dirname(native))
    with open(native, "w") as handle:
        handle.write("{not json")
    verdict = decide(FakeProbe({"float32": 1000.0, "amp-bfloat16": 500.0}), native)
    assert verdict.measured and json.loads(open(native).read())["version"] == auto._CACHE_VERSION


def test_a_failed_probe_falls_back_to_float32_and_is_not_cached(native):
    probe = FakeProbe({"float32": 1000.0, "amp-bfloat16": 500.0}, status={"amp-bfloat16": "failed"})
    verdict = decide(probe, native)
    assert verdict.precision == "float32" and not verdict.measured and "something broke" in verdict.reason
    decide(probe, native)
    assert len(probe.runs) == 4  # measured again: a failure is not a verdict


def test_a_verdict_measured_under_load_is_used_once(native, monkeypatch):
    monkeypatch.setattr(auto, "machine_busy", lambda: "1-minute load average 3.0 on 2 core(s)")
    probe, lines = FakeProbe({"float32": 1000.0, "amp-bfloat16": 500.0}), []
    verdict = decide(probe, native, lines.append)
    assert "under load" in verdict.reason and any("not kept" in line for line in lines)
    decide(probe, native)
    assert len(probe.runs) == 4


@pytest.mark.parametrize("kind", ["none", "emulated", "unknown"])
def test_nothing_is_timed_where_bfloat16_is_not_native(native, monkeypatch, kind):
    monkeypatch.setattr(hardware, "bfloat16_support", lambda *a, **k: hardware.BFloat16Support(kind, "because"))
    probe = FakeProbe({"float32": 1000.0, "amp-bfloat16": 500.0})
    verdict = decide(probe, native)
    assert verdict.precision == "float32" and not verdict.measured and probe.runs == []
    assert verdict.reason.startswith("ruled:")


def test_without_a_network_the_rule_decides_and_says_it_was_not_timed(native):
    verdict = auto.decide_auto(CPU, None, cache=native)
    assert not verdict.measured and verdict.reason.startswith("ruled:") and "not timed" in verdict.reason
    assert mxfp16.resolve_precision("auto", CPU).reason.startswith("ruled:")


def test_the_cache_folder_follows_the_environment(tmp_path):
    assert auto.cache_file({"MXFP16_CACHE_DIR": str(tmp_path)}) == str(tmp_path / "auto-precision.json")
    assert auto.cache_file({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mxfp16" / "auto-precision.json")


# --------------------------------------------------------------------------
# The probe itself: the network timed in a forked copy of this process.
# --------------------------------------------------------------------------
def _mlp(classes=3, size=4):
    from mxfp16.models import build_model

    net = build_model("elementwise-mlp", classes, in_shape=(3, size, size), ctx=CPU)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def _batch(n=8, classes=3, size=4):
    rng = np.random.RandomState(0)
    return (mx.nd.array(rng.standard_normal((n, 3, size, size)).astype(np.float32)),
            mx.nd.array(rng.randint(0, classes, n).astype(np.float32)))


def test_the_probe_times_a_forked_copy_and_leaves_this_process_as_it_was():
    """The child trains at a large rate and may switch AMP on; the parent's parameters and AMP are untouched."""
    from mxfp16._internals import amp_initialized

    net = _mlp()
    before = {name: p.data().asnumpy().copy() for name, p in net.collect_params().items()}
    data, label = mxfp16.cast_batch(*_batch(), "float32", CPU)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 10.0})
    probe = probes.NetworkProbe(net, data, label, CPU, mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer)
    record = probe.time("float32", iters=2, warmup=1, repeats=1)
    assert record["status"] == "ok" and record["ms_per_step"] > 0
    candidate = probe.time("amp-bfloat16", iters=2, warmup=1, repeats=1)
    # Where bfloat16 runs the child times it; where it cannot, the failure comes back as a record, not raised.
    assert candidate["status"] == ("ok" if BFLOAT16_RUNS else "failed"), candidate
    assert not amp_initialized()
    for name, p in net.collect_params().items():
        assert np.array_equal(p.data().asnumpy(), before[name]), name


def test_the_probes_child_gives_mxnets_own_kernels_the_threads_this_process_has():
    # MXNet's fork handler leaves a child's own kernels (clip, elementwise, casts) one OpenMP thread while oneDNN
    # keeps its threads: MobileNet v2's float32 step, timed forked, took 1.6x its time here. The probe's child puts
    # this process's setting back. Two threads are asked for, so that one is distinguishable on any machine.
    code = """
        import json
        import mxfp16, mxnet as mx
        from mxfp16._internals import mxnet_kernel_threads, mxnet_openmp_ceiling, restore_mxnet_openmp
        from mxfp16.measure.probe import NetworkProbe
        from mxfp16.plumbing.child import call_in_child

        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(3))
        net.initialize(ctx=[mx.cpu()])
        x = mx.nd.ones((2, 4))
        net(x).wait_to_read()
        probe = NetworkProbe(net, [x], None, [mx.cpu()])
        probe._time_here = lambda *args: mxnet_kernel_threads()  # what the child's timing would run on
        plain, _ = call_in_child(mxnet_kernel_threads, fork=True)
        refused = restore_mxnet_openmp(7)  # not a forked child: nothing is written
        probed = probe.time("float32", iters=1)
        print(json.dumps([mxnet_kernel_threads(), plain, probed, refused, mxnet_openmp_ceiling()]))
    """
    parent, plain, probed, refused, ceiling = last_line_json(run_python(code, env={"OMP_NUM_THREADS": "2"}).stdout)
    assert parent == 2 and ceiling == 2 and refused is False
    assert plain == 1  # MXNet's handler, which the probe undoes
    assert probed == {"status": "ok", "precision": "float32", "ms_per_step": 2}


@pytest.mark.skipif(not BFLOAT16_RUNS, reason="needs bfloat16 arithmetic (CPU classes AVX-512, avx512_bf16, AMX)")
def test_a_network_that_ran_in_float32_first_is_timed_and_trained_under_amp_bfloat16():
    # An inference pass (how mxfp16.models.build_model gives a network its shapes) leaves each convolution's
    # float32 weight in oneDNN's blocked layout, which AMP's cast could not reorder for a depthwise convolution:
    # auto's probe of MobileNet v2 failed there and fell back to float32. (prepare() casts the network, which gives
    # it new arrays: a network prepared after AMP went on trains.)
    code = """
        import json
        import mxfp16, mxnet as mx
        from mxfp16.measure.probe import NetworkProbe

        def built():
            net = mx.gluon.nn.HybridSequential()
            net.add(mx.gluon.nn.Conv2D(16, 3, padding=1), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
                    mx.gluon.nn.Conv2D(16, 3, padding=1, groups=16), mx.gluon.nn.GlobalAvgPool2D(),
                    mx.gluon.nn.Dense(4))
            net.initialize(ctx=[mx.cpu()])
            net(mx.nd.zeros((1, 3, 16, 16)))  # its shapes, by a float32 inference pass
            net.hybridize()
            return net

        x, y = mx.nd.ones((4, 3, 16, 16)), mx.nd.zeros((4,))
        data, label = mxfp16.cast_batch(x, y, "float32", [mx.cpu()])
        net = built()
        probed = NetworkProbe(net, data, label, [mx.cpu()]).time("amp-bfloat16", iters=1, warmup=1, repeats=1)
        mp = mxfp16.MixedPrecision("amp-bfloat16", "cpu", log=lambda line: None)  # after the float32 pass
        trainer = mp.prepare(net, "sgd", {"learning_rate": 0.1})
        loss = mp.train_step(net, mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer, *mp.cast_batch(x, y)).loss
        print(json.dumps([probed, loss.item()]))
    """
    probed, loss = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert probed["status"] == "ok", probed
    assert np.isfinite(loss)


def test_a_probe_that_hangs_is_stopped_and_reported(monkeypatch):
    import time as time_module

    net = _mlp()
    data, label = mxfp16.cast_batch(*_batch(), "float32", CPU)
    probe = probes.NetworkProbe(net, data, label, CPU)
    shape = "x".join(map(str, data[0].shape))
    assert probe.where == f"{type(net).__name__} at batch {shape} float32"  # what auto's log lines name
    monkeypatch.setattr(probe, "_time_here", lambda *args: time_module.sleep(60))
    record = probe.time("float32", iters=1, timeout=1.0)
    assert record["status"] == "failed" and "timed out after 1 s" in record["reason"]


def test_the_network_signature_ignores_names_and_sees_shapes():
    a, b = _mlp(), _mlp()  # two instances: other prefixes (elementwisemlp0_, elementwisemlp1_), same network
    assert probes.network_signature(a) == probes.network_signature(b)
    assert probes.network_signature(_mlp(classes=4)) != probes.network_signature(a)


# --------------------------------------------------------------------------
# One auto: MixedPrecision, the trainer, the benchmark and the demo reach one verdict.
# --------------------------------------------------------------------------
def _timed(monkeypatch, ms):
    """NetworkProbe.time returns these times (no fork), and records which network it was asked about."""
    asked = []

    def fake_time(self, precision, iters, **_):
        asked.append(self.key["network"])
        return {"status": "ok", "precision": precision, "ms_per_step": ms[precision]}
    monkeypatch.setattr(probes.NetworkProbe, "time", fake_time)
    return asked


def test_the_library_and_the_trainer_reach_one_verdict_for_one_model(native, monkeypatch, tmp_path):
    """float32 wins here (this process must stay free of AMP): MixedPrecision, then the trainer, same verdict."""
    from mxfp16.train import TrainConfig, prepare

    from train_support import tiny_dataset

    monkeypatch.setenv("MXFP16_CACHE_DIR", os.path.dirname(native))
    asked = _timed(monkeypatch, {"float32": 500.0, "amp-bfloat16": 800.0})
    data_dir = tiny_dataset(tmp_path)
    classes, size, batch = 3, 16, 8
    # The library, as the README writes it, with the trainer's model and batch shape.
    mp = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)
    assert mp.pending and not mp.precision.reason.startswith("timed")
    from mxfp16.models import build_model

    net = build_model("elementwise-mlp", classes, in_shape=(3, size, size), ctx=mp.ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    mp.prepare(net, "sgd", {"learning_rate": 0.1}, example=_batch(batch, classes, size))
    assert not mp.pending and mp.precision.name == "float32" and mp.precision.requested == "auto"
    assert mp.precision.reason.startswith("timed on this CPU:") and mp.verdict.measured and len(asked) == 2
    # The trainer: the same verdict, from the cache the library filled (nothing timed again).
    run = prepare(TrainConfig(model="elementwise-mlp", precision="auto", data_dir=str(data_dir),
                              image_size=size, batch_size=batch, epochs=1, out=str(tmp_path / "run"),
                              progress=False), log=lambda line: None)
    try:
        assert run.parts.precision.name == mp.precision.name and run.parts.mixed.verdict.cached
        assert run.parts.precision.reason == mp.precision.reason and len(asked) == 2
        config = json.loads((tmp_path / "run" / "config.json").read_text())
        assert config["auto"]["precision"] == "float32" and config["auto"]["measured"] is True
    finally:
        run.lock.release()


def test_amp_bfloat16_chosen_by_timing_switches_amp_on_and_rebuilds_the_graph(tmp_path):
    """In a child (AMP is process-global): the verdict reaches MixedPrecision, AMP goes on, the graph is redone."""
    code = f"""
        import json, os
        os.environ["MXFP16_CACHE_DIR"] = {str(tmp_path)!r}
        import mxfp16
        from mxfp16.measure import auto, probe
        from mxfp16.machine import hardware
        import mxnet as mx
        from mxfp16._internals import amp_initialized, built_graphs
        hardware.bfloat16_support = lambda *a, **k: hardware.BFloat16Support("native", "stand-in")
        auto.machine_busy = lambda: None
        probe.NetworkProbe.time = lambda self, p, iters, **_: {{"status": "ok", "precision": p,
                                                              "ms_per_step": {{"float32": 900.0}}.get(p, 300.0)}}
        mp = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(3))
        net.initialize(ctx=mp.ctx)
        net.hybridize()
        x, y = mx.nd.ones((8, 12)), mx.nd.zeros((8,))
        net(x)  # a float32 graph, traced before the verdict
        assert built_graphs(net) and not amp_initialized()
        trainer = mp.prepare(net, "sgd", {{"learning_rate": 0.1}})
        assert mp.pending  # no example: the first train_step decides
        data, label = mp.cast_batch(x, y)
        mp.state_dict()  # a pending auto has a state too
        try:
            mp.train_step(net, mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer, data, label)
        except mx.base.MXNetError:
            pass  # bfloat16 may not run on this CPU: the verdict, not the arithmetic, is under test
        graphs = [json.loads(sym.tojson(remove_amp_cast=False)) for _, sym in built_graphs(net)]
        ops = {{node["op"] for graph in graphs for node in graph["nodes"]}}
        print(json.dumps({{"precision": mp.precision.name, "reason": mp.precision.reason, "amp": amp_initialized(),
                          "cast": bool(ops & {{"amp_cast", "amp_multicast"}}), "state": mp.state_dict()["precision"]}}))
    """
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert result["precision"] == result["state"] == "amp-bfloat16" and result["amp"]
    assert result["cast"]  # the float32 graph traced before the verdict was traced again, under AMP
    assert result["reason"].startswith("timed on this CPU: amp-bfloat16 at 3.00x")


def test_the_benchmark_and_the_demo_ask_the_trainers_question(native, monkeypatch):
    """auto_verdict (bench, demo) times the network build_parts builds, on the batch it builds: one cache entry."""
    from mxfp16.train.parts import PartsSpec, auto_verdict, build_parts

    monkeypatch.setenv("MXFP16_CACHE_DIR", os.path.dirname(native))
    asked = _timed(monkeypatch, {"float32": 500.0, "amp-bfloat16": 900.0})
    spec = PartsSpec(model="elementwise-mlp", classes=3, image_size=8, batch_size=4)
    verdict = auto_verdict(spec, CPU, log=lambda line: None)
    parts = build_parts(spec, mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None))
    assert parts.mixed.verdict.cached and parts.precision.name == verdict.precision == "float32"
    assert len(asked) == 2 and len(set(asked)) == 1


def test_the_trainer_resumes_in_its_own_precision_and_workers_keep_the_rule(native, monkeypatch):
    from mxfp16 import mixed as mixed_module
    from mxfp16.train import run

    asked = _timed(monkeypatch, {"float32": 500.0, "amp-bfloat16": 900.0})
    activated = []  # the rule on the stand-in CPU is amp-bfloat16: AMP stays out of this process
    monkeypatch.setattr(mixed_module, "activate", lambda precision, lists: activated.append(precision.name))
    # A verdict is adopted through mxfp16.measure.auto.adopt, which activates through mxfp16.precision.
    monkeypatch.setattr(mxfp16.precision, "activate", lambda precision, lists: activated.append(precision.name))

    class Config:
        precision, resume, out, allow_cpu_float16, loss_scale, kvstore = "auto", True, "runs/x", False, None, "device"
        amp_lists = "mxfp16"

    mixed = run._mixed_precision(Config(), CPU, {"resolved_precision": "float32"}, print)
    assert not mixed.pending and "the run's own" in mixed.precision.reason
    Config.resume, Config.kvstore = False, "dist_sync"
    mixed = run._mixed_precision(Config(), CPU, None, print)
    assert not mixed.pending and mixed.precision.reason.startswith("ruled:") and asked == []
    assert activated == ["float32", mixed.precision.name]
    # A run whose auto settled on a list route resumes under its lists; one asked for by name keeps its own.
    Config.resume, Config.kvstore = True, "device"
    saved = {"resolved_precision": "amp-bfloat16", "auto": {"precision": "amp-bfloat16", "route": "unaligned32"}}
    assert run._mixed_precision(Config(), CPU, saved, print).amp_lists == "mxfp16+unaligned32"
    Config.precision = "amp-bfloat16"
    assert run._mixed_precision(Config(), CPU, saved, print).amp_lists == "mxfp16"


def test_a_resumed_auto_run_takes_its_own_precision_in_one_place_and_its_scaler_sees_it(native, monkeypatch):
    """MixedPrecision decides a resumed auto run's precision from the record alone: no rule, no timing, no second
    resolution; a precision asked for by name ignores the record, and the scaler holds the settled precision."""
    from mxfp16 import mixed as mixed_module

    asked = _timed(monkeypatch, {"float32": 500.0, "amp-bfloat16": 900.0})
    activated, resolved = [], []
    monkeypatch.setattr(mixed_module, "activate", lambda precision, lists: activated.append(precision.name))
    real_resolve = mixed_module.resolve_precision
    monkeypatch.setattr(mixed_module, "resolve_precision",
                        lambda name, *a, **k: resolved.append(name) or real_resolve(name, *a, **k))
    mp = mxfp16.MixedPrecision("auto", CPU, own_precision=("float32", "runs/x/config.json"), log=print)
    assert not mp.pending and asked == [] and resolved == ["float32"] and activated == ["float32"]
    assert (mp.precision.name, mp.precision.requested) == ("float32", "auto")
    assert mp.precision.reason == mp.verdict.reason == "the run's own (runs/x/config.json)"
    assert mp.scaler.precision is mp.precision
    named = mxfp16.MixedPrecision("float32", CPU, own_precision=("amp-bfloat16", "runs/x/config.json"))
    assert named.precision.requested == "float32" and named.verdict is None
    # A pending auto that loads a run's state settles through the scaler's own method, not by assignment.
    pending = mxfp16.MixedPrecision("auto", CPU, log=lambda line: None)
    assert pending.pending
    pending.load_state_dict(dict(mp.state_dict(), precision="float32", reason="ruled: x"))
    assert pending.precision.reason == "the run's own (ruled: x)" and pending.scaler.precision is pending.precision
    assert asked == []


def test_this_machine_times_where_timing_applies():
    """Whatever this CPU is: MixedPrecision('auto') waits for a network exactly where timing can change the answer."""
    mp = mxfp16.MixedPrecision("auto", "cpu", log=lambda line: None)
    applies = auto.timing_applies(mp.ctx)
    assert applies == hardware.bfloat16_support().native
    assert mp.pending == applies
    if not applies:
        assert mp.precision.reason.startswith("ruled:") and mp.precision.name == "float32"


def test_once_amp_is_on_in_this_process_auto_keeps_it_and_times_nothing(native, monkeypatch):
    """A second network under auto in a process where AMP is on (a script's next recipe): float32 is not there."""
    from mxfp16 import precision

    probe = FakeProbe({"float32": 100.0, "amp-bfloat16": 900.0})  # float32 would win if it could be had
    monkeypatch.setattr(precision, "_amp_target", "bfloat16")
    verdict = decide(probe, native)
    assert verdict.precision == "amp-bfloat16" and not verdict.measured and probe.runs == []
    assert verdict.reason.startswith("ruled: AMP (bfloat16) is already active in this process")
    assert "fresh process" in verdict.reason
    monkeypatch.setattr(precision, "_amp_target", "float16")  # another target: not auto's to settle
    assert auto._amp_already_active() is None
    monkeypatch.setattr(precision, "_amp_target", None)
    assert decide(probe, native).precision == "float32" and probe.runs  # without AMP, timing decides again
