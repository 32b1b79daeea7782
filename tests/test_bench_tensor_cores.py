"""The tensor-core report: Conv/Dense sizes and batch sizes that are not multiples of 8."""
from mxfp16.bench.tensor_cores import format_report, tensor_core_report

from mxnet import gluon


def _net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(12, 3, padding=1),           # in 3, out 12: misaligned
            gluon.nn.Conv2D(16, 3, padding=1),           # in 12: misaligned
            gluon.nn.Conv2D(16, 1),                      # 16 -> 16: aligned
            gluon.nn.Conv2D(16, 3, padding=1, groups=4),  # grouped, 16 -> 16: aligned
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Flatten(),
            gluon.nn.Dense(24), gluon.nn.Dense(10))      # 16 -> 24 aligned, 24 -> 10 misaligned
    net.initialize()
    return net


def test_reports_exactly_the_layers_with_a_dimension_off_the_multiple_of_8():
    net = _net()
    report = tensor_core_report(net, [8, 12], sample_shape=(3, 8, 8))
    # Independent check from the weight shapes Gluon inferred.
    expected = []
    for block in net:
        if hasattr(block, "weight"):
            shape = block.weight.shape
            n_out = shape[0]
            n_in = shape[1] * (4 if block is net[3] else 1)
            if n_in % 8 or n_out % 8:
                expected.append((n_in, n_out))
    assert [(r["in"], r["out"]) for r in report["misaligned"]] == expected == [(3, 12), (12, 16), (24, 10)]
    assert report["layers"] == 6
    assert report["batch_sizes"] == {8: True, 12: False}
    assert report["aligned"] is False
    text = format_report(report, "tiny")
    assert "batch size 12: NOT a multiple of 8" in text and "3 misaligned" in text


def test_aligned_network_and_batch():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, in_units=8))
    net.initialize()
    report = tensor_core_report(net, 32)
    assert report["aligned"] is True and report["misaligned"] == []
