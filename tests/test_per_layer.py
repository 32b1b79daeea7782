"""Precision per layer, chosen by measurement (mxfp16.measure.per_layer, ``--amp-lists measured``).

The decision, the cache and the table are checked with an injected timer (fake times): the times of a real
CPU say nothing that holds on every CPU. The graph a choice produces is typed in a child process (AMP is
process-global) with the choice applied through ``MixedPrecision``, so a layer kept in float32 by
measurement is seen in float32 and the others in bfloat16. The real timing process runs here too: float32
everywhere, bfloat16 where the CPU can.
"""
import json
import os
import shutil

import mxfp16.amp
from mxfp16.amp.lists import keep_float32_measured, measured_float32
from mxfp16.amp.wrappers import LayerCall
from mxfp16.machine.hardware import BFloat16Support
from mxfp16.measure import cache as measure_cache
from mxfp16.measure import layer_timing, per_layer
from mxfp16.measure.layer_timing import LayerSpec, LayerTiming
from mxfp16.measure.per_layer import choose_layers

import mxnet as mx
import pytest
from conftest import REPO, run_python
from mxnet import gluon

NATIVE = BFloat16Support("native", "a stand-in: avx512_bf16")
NONE = BFloat16Support("none", "a stand-in: no AVX-512")


def _network():
    """A 7x7 stem (float32 by mxfp16's rule), a 3x3 and a 1x1 convolution, and a Dense."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 7, padding=3), gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.Conv2D(16, 1),
            gluon.nn.Dense(4))
    net.initialize()
    return net


def _batch(n=2):
    return [mx.nd.zeros((n, 3, 8, 8))]


class FakeTimer:
    """Times a 1x1 convolution as slower in bfloat16, everything else 2x faster; counts what it was asked."""

    def __init__(self, fail=()):
        self.asked, self.fail = [], fail

    def __call__(self, specs):
        self.asked.append([s.key for s in specs])
        found = {}
        for spec in specs:
            attrs = dict(spec.attrs)
            if spec.op in self.fail:
                found[spec.key] = LayerTiming(1.0, failed="MXNetError: no bfloat16 kernel")
            elif attrs.get("kernel") == "(1, 1)":
                found[spec.key] = LayerTiming(1.0, 1.5, 0.2)
            else:
                found[spec.key] = LayerTiming(2.0, 1.0, 0.2)
        return found


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(per_layer, "machine_busy", lambda: None)
    return lambda line: None


def test_layers_that_do_not_gain_are_kept_float32_and_the_rule_layers_are_not_timed(tmp_path, quiet):
    timer = FakeTimer()
    choice = choose_layers(_network(), _batch(), timer=timer, cache=str(tmp_path / "c.json"), log=quiet,
                           support=NATIVE)
    assert choice.measured and choice.cached == 0
    dtypes = [(row.attrs.get("kernel", row.op), row.dtype) for row in choice.rows]
    assert dtypes == [("(7, 7)", "float32"), ("(3, 3)", "bfloat16"), ("(1, 1)", "float32"),
                      ("FullyConnected", "bfloat16")]
    assert choice.rows[0].timing is None and "stem" in choice.rows[0].why
    assert len(timer.asked) == 1 and len(timer.asked[0]) == 3  # the stem is float32 by rule: not timed
    kept = choice.float32_layers()
    assert [layer["weight"] for layer in kept] == [choice.rows[2].weight]
    assert "1 of 3 layers timed run in float32" in choice.reason


def test_a_layer_whose_bfloat16_kernel_fails_runs_in_float32(tmp_path, quiet):
    choice = choose_layers(_network(), _batch(), timer=FakeTimer(fail=("FullyConnected",)),
                           cache=str(tmp_path / "c.json"), log=quiet, support=NATIVE)
    dense = choice.rows[-1]
    assert dense.dtype == "float32" and "no bfloat16 kernel" in dense.why


def test_the_cache_is_used_per_machine_and_shape_and_a_damaged_one_is_measured_again(tmp_path, quiet):
    cache = tmp_path / "c.json"
    timer = FakeTimer()
    first = choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    again = choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 1 and again.cached == 3
    assert [r.dtype for r in again.rows] == [r.dtype for r in first.rows]
    assert [r.timing for r in again.rows] == [r.timing for r in first.rows]
    # Another batch is another shape for every layer: each is timed, the first batch's stay.
    choose_layers(_network(), _batch(4), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 2 and len(timer.asked[1]) == 3
    assert len(json.loads(cache.read_text())["timings"]) == 6
    # Another machine (here: another thread count in its key) measures again.
    key = measure_cache.machine_key()  # one machine key for auto's verdicts and the layers' times
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_cache, "machine_key", lambda: dict(key, threads=(key["threads"] or 0) + 1))
        choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 3
    cache.write_text("{ not json")
    choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 4
    assert json.loads(cache.read_text())["version"] == 1  # rewritten whole


def test_a_change_to_the_amp_sources_measures_again(tmp_path, quiet):
    # An upgrade that moves an operator to float32 or adds a route keeps mxfp16's version number: the key must
    # follow the lists' and routes' sources, or a verdict timed under the old routes is reused.
    folder = tmp_path / "amp"
    shutil.copytree(os.path.dirname(mxfp16.amp.__file__), folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert measure_cache.amp_digest(str(folder)) == measure_cache.amp_digest() == measure_cache.machine_key()[
        "amp_sources"]
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "lists.cpython.pyc").write_bytes(b"compiled")
    assert measure_cache.amp_digest(str(folder)) == measure_cache.amp_digest()  # only sources count
    with open(folder / "lists.py", "a", encoding="utf-8") as handle:
        handle.write("# a route changed\n")
    changed = measure_cache.amp_digest(str(folder))
    assert changed != measure_cache.amp_digest()
    cache, timer = tmp_path / "c.json", FakeTimer()
    choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 1
    key = measure_cache.machine_key()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_cache, "machine_key", lambda: dict(key, amp_sources=changed))
        choose_layers(_network(), _batch(), timer=timer, cache=str(cache), log=quiet, support=NATIVE)
    assert len(timer.asked) == 2


def test_times_taken_under_load_are_used_once_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(per_layer, "machine_busy", lambda: "1-minute load average 9.0 on 2 core(s)")
    said = []
    choose_layers(_network(), _batch(), timer=FakeTimer(), cache=str(tmp_path / "c.json"), log=said.append,
                  support=NATIVE)
    assert not (tmp_path / "c.json").exists()
    assert any("not kept" in line for line in said)


def test_layers_sharing_a_weight_are_decided_together_on_their_summed_times(tmp_path, quiet):
    class Tied(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.dense = gluon.nn.Dense(6, in_units=6)

        def hybrid_forward(self, F, x):
            return self.dense(self.dense(x))  # the same weight, on a 2x6 and then again on a 2x6 input

    def timer(specs):
        assert len(specs) == 1  # one type-and-shape
        return {specs[0].key: LayerTiming(1.0, 0.5, 0.1)}

    net = Tied()
    net.initialize()
    choice = choose_layers(net, [mx.nd.zeros((2, 6))], timer=timer, cache=str(tmp_path / "c.json"), log=quiet,
                           support=NATIVE)
    assert [r.dtype for r in choice.rows] == ["bfloat16", "bfloat16"]
    assert "other use" in choice.rows[0].why


def test_where_bfloat16_cannot_run_nothing_is_timed_and_it_says_so(tmp_path, quiet):
    timer = FakeTimer()
    choice = choose_layers(_network(), _batch(), timer=timer, cache=str(tmp_path / "c.json"), log=quiet,
                           support=NONE)
    assert not choice.measured and timer.asked == [] and "bfloat16 cannot run" in choice.reason
    assert choice.float32_layers() == [] and not (tmp_path / "c.json").exists()
    assert "not measured" in choice.render()


def test_the_table_and_the_record(tmp_path, quiet):
    choice = choose_layers(_network(), _batch(), timer=FakeTimer(), cache=str(tmp_path / "c.json"), log=quiet,
                           support=NATIVE)
    table = choice.render().splitlines()
    assert table[0] == choice.reason
    rows = [line for line in table if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 4 and all(row.endswith(" |") for row in rows)
    assert "| 1.00 | 1.50 | 0.67x | 0.20 | float32 |" in rows[2]
    record = json.loads(json.dumps(choice.record()))  # plain values
    assert [layer["dtype"] for layer in record["layers"]] == [r.dtype for r in choice.rows]
    assert record["layers"][1]["ratio"] == 2.0 and record["margin"] == per_layer.MARGIN


def test_a_measured_layer_is_matched_by_its_weight_in_a_graph_and_by_its_shapes_on_arrays():
    attrs = {"kernel": "(1, 1)", "num_filter": "16"}
    keep_float32_measured([{"op": "Convolution", "attrs": attrs, "weight": "conv9_weight",
                            "shapes": ((2, 8, 8, 8), (16, 8, 1, 1), (16,))}])
    try:
        weight = mx.sym.var("conv9_weight")
        assert measured_float32(LayerCall.of_call("Convolution", (mx.sym.var("x"), weight), attrs))
        assert not measured_float32(LayerCall.of_call("Convolution", (mx.sym.var("x"), mx.sym.var("other")), attrs))
        arrays = (mx.nd.zeros((2, 8, 8, 8)), mx.nd.zeros((16, 8, 1, 1)), mx.nd.zeros((16,)))
        assert measured_float32(LayerCall.of_call("Convolution", arrays, dict(kernel=(1, 1), num_filter=16)))
        assert not measured_float32(LayerCall.of_call("Convolution", (mx.nd.zeros((4, 8, 8, 8)),) + arrays[1:],
                                                      dict(kernel=(1, 1), num_filter=16)))
    finally:
        keep_float32_measured([])


def test_mixed_precision_types_the_measured_layer_float32_and_the_others_bfloat16():
    code = f"""
        import json, sys
        sys.path.insert(0, {os.path.join(REPO, "tests")!r})
        import mxfp16, mxnet as mx
        from mxfp16.measure import per_layer
        from mxfp16.amp.graph import trace
        from mxfp16.machine import hardware
        from mxfp16.precision import resolve_precision
        from test_per_layer import FakeTimer, NATIVE, _network, _batch

        # AMP is only switched on and graphs typed: nothing runs in bfloat16, so any CPU will do.
        hardware.bfloat16_support = lambda *a, **k: NATIVE
        timer = FakeTimer()
        per_layer.time_layers = timer
        mp = mxfp16.MixedPrecision(resolve_precision("amp-bfloat16", "gpu:0"), "cpu", amp_lists="measured",
                                   log=lambda line: None)
        assert mp.layers_pending
        net = _network()
        net.hybridize()
        mp.prepare(net, "sgd", {{"learning_rate": 0.1}}, example=(_batch()[0], mx.nd.zeros((2,))))
        assert not mp.layers_pending and len(timer.asked) == 1
        print(json.dumps([[n.op, n.attrs.get("kernel"), n.dtype] for n in trace(net, [(2, 3, 8, 8)])
                          if n.op in ("Convolution", "FullyConnected")]))
    """
    found = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert found == [["Convolution", "(7, 7)", "float32"], ["Convolution", "(3, 3)", "bfloat16"],
                     ["Convolution", "(1, 1)", "float32"], ["FullyConnected", None, "bfloat16"]]


def test_the_timing_process_times_float32_and_bfloat16_or_says_why_not():
    spec = LayerSpec.of("FullyConnected", {"num_hidden": "4", "no_bias": "False", "flatten": "True"},
                        [(2, 6), (4, 6), (4,)])
    timing = layer_timing.time_layers([spec])[spec.key]
    assert timing.float32_ms > 0
    assert (timing.bfloat16_ms or 0) > 0 or timing.failed, timing


def test_a_timing_process_that_dies_costs_only_its_layer(monkeypatch):
    from mxfp16.plumbing import child

    specs = [LayerSpec.of("Convolution", {"kernel": str((k, k))}, [(1, 1, 4, 4), (1, 1, k, k)]) for k in (1, 3)]

    def run(function, keys, timeout=None):
        assert function is layer_timing.time_keys
        if specs[1].key in keys:
            return None, "exit status -6: double free or corruption"
        return {key: LayerTiming(1.0, 0.5, 0.1).record() for key in keys}, None

    monkeypatch.setattr(child, "call_in_child", run)
    found = layer_timing.time_layers(specs)
    assert found[specs[0].key] == LayerTiming(1.0, 0.5, 0.1)
    assert "double free" in found[specs[1].key].failed


def test_info_prints_the_layer_table(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mxfp16", "info", "--amp-table", "layers", "--model", "resnet18_v1",
                           "--image-size", "32", "--batch-size", "2"], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env=dict(os.environ, MXFP16_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| resnetv10_")]
    assert len(rows) == 21  # 20 convolutions and the classifier
    assert "runs in" in proc.stdout and ("not measured" in proc.stdout or "measured on this CPU" in proc.stdout)


def test_an_unknown_list_set_is_refused_with_the_choices():
    import mxfp16

    with pytest.raises(ValueError, match="choose one of: mxfp16, mxnet, measured"):
        mxfp16.MixedPrecision("float32", "cpu", amp_lists="fastest")
    assert not mxfp16.MixedPrecision("float32", "cpu", amp_lists="measured").layers_pending  # no AMP: no layer


def test_the_trainer_takes_measured_lists_and_writes_the_table_where_amp_runs(tmp_path):
    from conftest import CPU_MIXED
    from train_support import QUICK, ok, run_train, tiny_dataset

    out = tmp_path / "run"
    ok(run_train("--data-dir", tiny_dataset(tmp_path), *QUICK, "--epochs", "1", "--max-batches", "2",
                 "--precision", CPU_MIXED, "--amp-lists", "measured", "--out", out,
                 env={"MXFP16_CACHE_DIR": str(tmp_path / "cache")}))
    assert json.loads((out / "config.json").read_text())["amp_lists"] == "measured"
    if CPU_MIXED == "float32":  # nothing runs in bfloat16 here: nothing to choose, no table
        assert not (out / per_layer.LAYERS_FILE).exists()
        return
    record = json.loads((out / per_layer.LAYERS_FILE).read_text())
    assert record["measured"] and record["layers"]
    assert {layer["op"] for layer in record["layers"]} == {"Convolution", "FullyConnected"}


def test_a_network_whose_graph_cannot_be_read_is_not_measured_and_says_why(tmp_path, quiet):
    class Imperative(gluon.Block):
        def forward(self, x):
            return x

    timer = FakeTimer()
    choice = choose_layers(Imperative(), _batch(), timer=timer, cache=str(tmp_path / "c.json"), log=quiet,
                           support=NATIVE)
    assert not choice.measured and timer.asked == [] and "not a gluon.HybridBlock" in choice.reason
