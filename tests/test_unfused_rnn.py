"""The unfused recurrent layers (mxfp16.amp.recurrent): the fused layer's numbers, its parameters, its place.

Their float32 outputs, final states and every gradient are checked against MXNet's fused ``RNN`` operator
(an independent implementation: oneDNN's or MXNet's own kernel), so they hold on any CPU. What they run in
under AMP is read from the graph (tests/test_amp_routes.py counts its casts); whether they are faster needs a
CPU with avx512_bf16 (docs/benchmarks.md).
"""
import json

from mxfp16.amp import recurrent

import mxnet as mx
import numpy as np
import pytest
from conftest import run_python
from mxnet import autograd, gluon

HIDDEN = 8


def _run(layer, x, with_states):
    """Output, final states, and the gradients of a loss on both, for input ``x`` (N or T first per layout)."""
    x = x.copy()
    x.attach_grad()
    batch = x.shape[layer._layout.find("N")]
    begin = layer.begin_state(batch_size=batch) if with_states else None
    params = list(layer.collect_params().values())
    for p in params:
        p.zero_grad()
    with autograd.record():
        result = layer(x, begin) if with_states else layer(x)
        out, states = (result[0], result[1]) if with_states else (result, [])
        loss = (out * out).sum() + sum((s * s * 0.5).sum() for s in states)
    loss.backward()
    return [out.asnumpy()] + [s.asnumpy() for s in states] + [x.grad.asnumpy()] + [p.grad().asnumpy() for p in params]


CASES = [("LSTM", {"layout": "NTC"}, True), ("LSTM", {"num_layers": 2, "bidirectional": True}, True),
         ("GRU", {"layout": "NTC", "num_layers": 2}, True), ("GRU", {"bidirectional": True}, False),
         ("RNN", {"activation": "tanh", "num_layers": 2}, True), ("RNN", {"layout": "NTC"}, False)]


@pytest.mark.parametrize("kind, options, with_states", CASES)
@pytest.mark.parametrize("hybridize", [False, True])
def test_unfused_layers_compute_what_the_fused_kernel_computes(kind, options, with_states, hybridize):
    mx.random.seed(0)
    fused = getattr(gluon.rnn, kind)(HIDDEN, prefix="rnn_", **options)
    fused.initialize(mx.init.Uniform(0.4))
    unfused = getattr(recurrent, kind)(HIDDEN, prefix="rnn_", params=fused.collect_params(), **options)
    if hybridize:
        fused.hybridize()
        unfused.hybridize()
    x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (3, 5, 4)))
    expected, got = _run(fused, x, with_states), _run(unfused, x, with_states)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        assert np.abs(g - e).max() <= 1e-5 * max(np.abs(e).max(), 1.0)


def test_the_comparison_can_fail():
    mx.random.seed(0)
    fused = gluon.rnn.LSTM(HIDDEN, prefix="rnn_")
    fused.initialize(mx.init.Uniform(0.4))
    other = recurrent.LSTM(HIDDEN, prefix="rnn_")  # parameters of its own: other numbers
    other.initialize(mx.init.Uniform(0.4))
    x = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (3, 5, 4)))
    assert np.abs(_run(fused, x, False)[0] - _run(other, x, False)[0]).max() > 1e-3


def test_weights_load_both_ways(tmp_path):
    x = mx.nd.array(np.random.RandomState(2).uniform(-1, 1, (5, 3, 4)))
    fused = gluon.rnn.GRU(HIDDEN, num_layers=2, bidirectional=True, input_size=4)
    fused.initialize(mx.init.Uniform(0.4))
    fused.save_parameters(str(tmp_path / "fused.params"))
    unfused = recurrent.GRU(HIDDEN, num_layers=2, bidirectional=True)
    unfused.load_parameters(str(tmp_path / "fused.params"))
    assert np.allclose(unfused(x).asnumpy(), fused(x).asnumpy(), atol=1e-5)
    unfused.save_parameters(str(tmp_path / "unfused.params"))
    again = gluon.rnn.GRU(HIDDEN, num_layers=2, bidirectional=True)
    again.load_parameters(str(tmp_path / "unfused.params"))
    assert np.allclose(again(x).asnumpy(), fused(x).asnumpy(), atol=1e-5)


def test_unfuse_rnn_changes_the_computation_in_place_and_keeps_what_it_cannot():
    from mxfp16.models.sequence import LSTMClassifier

    class Net(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.classifier = LSTMClassifier(4, HIDDEN, num_layers=2)
                self.projected = gluon.rnn.LSTM(HIDDEN, projection_size=4, layout="NTC")

        def hybrid_forward(self, F, x):
            return self.classifier(x), self.projected(F.reshape(x, shape=(0, 0, -1)))

    net = Net()
    net.initialize(mx.init.Uniform(0.3))
    net.hybridize()
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, (2, 1, 6, 5)))
    before = [o.asnumpy() for o in net(x)]
    params = dict(net.collect_params().items())
    layer = net.classifier.rnn
    report = recurrent.unfuse_rnn(net, steps=6)
    assert report == {layer.name: "unfused", net.projected.name: "it has a projection (projection_size)"}
    assert net.classifier.rnn is layer and isinstance(layer, recurrent.LSTM)
    assert type(net.projected) is gluon.rnn.LSTM
    assert dict(net.collect_params().items()) == params  # the same Parameter objects
    after = [o.asnumpy() for o in net(x)]  # traced again: the parent graph was built fused
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(after, before))


def test_a_traced_layer_without_its_sequence_length_says_how_to_give_it():
    from mxfp16.models.sequence import LSTMClassifier

    net = LSTMClassifier(4, HIDDEN)
    net.initialize()
    recurrent.unfuse_rnn(net)
    with pytest.raises(ValueError, match="steps=T"):
        net(mx.sym.var("data"))
    net.rnn.steps = 6
    net(mx.sym.var("data"))


def test_a_layer_called_on_arrays_reads_the_length_and_retraces_when_it_changes():
    layer = recurrent.LSTM(HIDDEN)
    layer.initialize()
    layer.hybridize()
    assert layer(mx.nd.ones((5, 2, 3))).shape == (5, 2, HIDDEN)
    assert layer(mx.nd.ones((7, 2, 3))).shape == (7, 2, HIDDEN) and layer.steps == 7


def test_options_only_the_fused_kernel_has_are_refused_with_the_alternative():
    with pytest.raises(ValueError, match="use gluon.rnn.LSTM"):
        recurrent.LSTM(HIDDEN, projection_size=4)
    with pytest.raises(ValueError, match="cell state"):
        recurrent.LSTM(HIDDEN, state_clip_min=-1, state_clip_max=1)


def test_under_amp_the_products_are_bfloat16_and_the_gates_float32():
    code = """
        import json, warnings
        warnings.simplefilter("ignore")
        import mxfp16
        from mxfp16.amp.lists import init_amp
        from mxfp16.amp.graph import trace
        from mxfp16.amp import recurrent
        init_amp("bfloat16")
        layer = recurrent.GRU(8, num_layers=2, layout="NTC", steps=5)
        layer.initialize()
        ops = sorted({(n.op, n.dtype) for n in trace(layer, [(2, 5, 4)]) if n.op not in ("amp_cast", "amp_multicast")})
        casts = {}
        for steps in (5, 10):
            lstm = recurrent.LSTM(8, layout="NTC", steps=steps)
            lstm.initialize()
            casts[steps] = sum(n.op == "amp_cast" for n in trace(lstm, [(2, steps, 4)]))
        print(json.dumps([ops, casts]))
    """
    ops, casts = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    ops = {tuple(op) for op in ops}
    assert ("FullyConnected", "bfloat16") in ops and ("FullyConnected", "float32") not in ops
    assert {dtype for op, dtype in ops if op in ("Activation", "elemwise_mul", "SliceChannel")} == {"float32"}
    # The gates' sigmoid and tanh are Activation (oneDNN's kernels; no AMP list, so no cast before each), not the
    # sigmoid and tanh operators: those are MXNet's scalar loops, and AMP casts each one's input to float32 again.
    assert not ops & {("sigmoid", "float32"), ("tanh", "float32")}
    # So a step adds three casts (h to bfloat16 for its product, the product to float32, the gates' split), not six.
    assert casts["10"] - casts["5"] == 5 * 3


def test_dropout_between_layers_only_in_training():
    layer = recurrent.LSTM(HIDDEN, num_layers=2, dropout=0.5)
    layer.initialize()
    x = mx.nd.ones((4, 3, 5))
    assert np.allclose(layer(x).asnumpy(), layer(x).asnumpy())  # inference: no dropout
    with autograd.record(train_mode=True):
        a, b = layer(x), layer(x)
    assert not np.allclose(a.asnumpy(), b.asnumpy())


def test_inside_a_hybridized_network_each_length_is_read_from_its_input_and_a_new_one_retraces():
    from mxfp16._internals import built_graphs
    from mxfp16.models.sequence import LSTMClassifier

    net = LSTMClassifier(4, HIDDEN, num_layers=2)
    net.initialize(mx.init.Uniform(0.3))
    net.hybridize()
    rng = np.random.RandomState(3)
    batches = [mx.nd.array(rng.uniform(-1, 1, shape)) for shape in ((2, 1, 6, 5), (3, 1, 9, 5), (5, 1, 9, 5))]
    fused = [net(x).asnumpy() for x in batches]
    assert recurrent.unfuse_rnn(net) == {net.rnn.name: "unfused"}  # no steps=: read from the network's input
    graphs, lengths = [], []
    for x, expected in zip(batches + batches[:1], fused + fused[:1]):
        got = net(x).asnumpy()
        assert np.abs(got - expected).max() < 1e-5
        graphs.append(built_graphs(net)[0][1])
        lengths.append(net.rnn.steps)
    assert lengths == [6, 9, 9, 6]
    # Another batch size with the same length runs the same graph; another length is traced again.
    assert graphs[2] is graphs[1] and graphs[1] is not graphs[0] and graphs[3] is not graphs[2]


def test_an_export_traces_the_unfused_layers_fused_for_any_length_and_leaves_them_unfused():
    from mxfp16.inference.convert import traced

    net = gluon.nn.HybridSequential()
    net.add(gluon.rnn.LSTM(HIDDEN, layout="NTC"), gluon.nn.Dense(3, flatten=False))
    net.initialize(mx.init.Uniform(0.3))
    net.hybridize()
    x = mx.nd.array(np.random.RandomState(5).uniform(-1, 1, (2, 6, 4)))
    recurrent.unfuse_rnn(net)
    expected = net(x).asnumpy()  # unfused, traced for 6 steps
    symbol, args, auxs = traced(net)
    ops = {node["op"] for node in json.loads(symbol.tojson())["nodes"]}
    assert "RNN" in ops and "SliceChannel" not in ops and isinstance(net[0], recurrent.LSTM)
    # The exported graph runs another length too, and agrees with the network it came from.
    assert symbol.eval(mx.cpu(), data=mx.nd.ones((2, 9, 4)), **args)[0].shape == (2, 9, 3)
    assert np.abs(symbol.eval(mx.cpu(), data=x, **args)[0].asnumpy() - expected).max() < 1e-5
