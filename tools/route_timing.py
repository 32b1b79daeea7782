"""Time issue 44's routes on and off on this CPU: what each one does to a training step.

Run on a CPU with avx512_bf16 (bfloat16 does not run without AVX-512; with
``--smoke`` the float32 rows run anywhere, at toy sizes, as the tests do)::

    python tools/route_timing.py --rounds 3 > routes.md
    python tools/route_timing.py --case lstm --case mobilenet --rounds 3

Each case is a network at the size issue 44 names, trained through
``mxfp16.MixedPrecision`` and ``train_step`` (the path ``mxfp16 train``
takes) in one variant per row: the precision, the AMP lists and the route.
Every row runs in its own process (AMP is process-global), the rows of a
round one after the other, and the median of the rounds' milliseconds per
step is printed, with each row's ratio to the case's float32 row:

* ``lstm`` / ``gru``: the word language model's recurrent layers (2 layers,
  650 units, 35 steps, batch 32): fused (MXNet's ``RNN``) against
  ``mxfp16.amp.unfuse_rnn``;
* ``encoder``: two BERT-base-sized encoder blocks (768 units, 12 heads,
  sequence 128, batch 8): shape operators following their input (mxfp16's
  lists) against in float32 (as MXNet's lists keep them);
* ``mobilenet``: MobileNet v2 1.0 at 224 px, batch 16: mxfp16's lists, with
  depthwise or 1x1 convolutions in float32, ``measured``, and every BatchNorm
  in float32 (``mxfp16+batchnorm32``);
* ``generator``: a generator of 64 px grey images (one output channel: the
  layer MXNet 1.9.1 cannot train, which mxfp16 computes as a convolution
  under AMP; its float32 row is expected to fail).

A row whose process fails is printed with the end of its error.
"""
import argparse
import os
import statistics
import sys

#: case -> [(row label, precision, amp lists, route)]
CASES = {
    "lstm": [("fused, float32", "float32", "mxfp16", "fused"),
             ("fused, amp-bfloat16", "amp-bfloat16", "mxfp16", "fused"),
             ("unfused, float32", "float32", "mxfp16", "unfused"),
             ("unfused, amp-bfloat16", "amp-bfloat16", "mxfp16", "unfused")],
    "encoder": [("float32", "float32", "mxfp16", None),
                ("amp-bfloat16, shape operators float32", "amp-bfloat16", "mxfp16", "shape-float32"),
                ("amp-bfloat16, shape operators follow", "amp-bfloat16", "mxfp16", None)],
    "mobilenet": [("float32", "float32", "mxfp16", None),
                  ("amp-bfloat16, mxfp16", "amp-bfloat16", "mxfp16", None),
                  ("amp-bfloat16, depthwise float32", "amp-bfloat16", "mxfp16+depthwise32", None),
                  ("amp-bfloat16, 1x1 float32", "amp-bfloat16", "mxfp16+pointwise32", None),
                  ("amp-bfloat16, both float32", "amp-bfloat16", "mxfp16+depthwise32+pointwise32", None),
                  ("amp-bfloat16, measured", "amp-bfloat16", "measured", None),
                  ("amp-bfloat16, BatchNorm float32", "amp-bfloat16", "mxfp16+batchnorm32", None)],
    "generator": [("float32", "float32", "mxfp16", None), ("amp-bfloat16", "amp-bfloat16", "mxfp16", None)],
}
CASES["gru"] = CASES["lstm"]


def build(case, smoke):
    """``(network, input shape)`` for a case, initialised."""
    from mxfp16.models.sequence import EncoderBlock

    import mxnet as mx
    from mxnet import gluon

    if case in ("lstm", "gru"):
        hidden, steps, batch = (16, 5, 4) if smoke else (650, 35, 32)
        net = gluon.nn.HybridSequential()
        kind = gluon.rnn.LSTM if case == "lstm" else gluon.rnn.GRU
        net.add(kind(hidden, num_layers=2, layout="NTC", input_size=hidden))
        shape = (batch, steps, hidden)
    elif case == "encoder":
        units, heads, length, batch = (16, 2, 8, 2) if smoke else (768, 12, 128, 8)
        net = gluon.nn.HybridSequential()
        net.add(EncoderBlock(units, heads, 4 * units), EncoderBlock(units, heads, 4 * units))
        shape = (batch, length, units)
    elif case == "mobilenet":
        from mxfp16.models import build_model

        size, batch = (32, 2) if smoke else (224, 16)
        net = build_model("mobilenetv2_0.25" if smoke else "mobilenetv2_1.0", 10, ctx=[mx.cpu()],
                          in_shape=(3, size, size))
        shape = (batch, 3, size, size)
    else:
        net = gluon.nn.HybridSequential()
        ngf, batch = (4, 2) if smoke else (64, 16)
        for channels, stride, pad in ((ngf * 8, 1, 0), (ngf * 4, 2, 1), (ngf * 2, 2, 1), (ngf, 2, 1)):
            net.add(gluon.nn.Conv2DTranspose(channels, 4, stride, pad, use_bias=False), gluon.nn.BatchNorm(),
                    gluon.nn.Activation("relu"))
        net.add(gluon.nn.Conv2DTranspose(1, 4, 2, 1, use_bias=False), gluon.nn.Activation("tanh"))
        shape = (batch, 100, 1, 1)
    net.initialize(mx.init.Xavier())
    return net, shape


def child(case, precision, amp_lists, route, smoke, iters):
    """One row, in this process: milliseconds per training step."""
    import mxfp16
    from mxfp16.amp.recurrent import unfuse_rnn
    from mxfp16.measure.timing import time_steps

    import mxnet as mx

    mp = mxfp16.MixedPrecision(precision, "cpu", amp_lists=amp_lists, log=lambda line: None)
    net, shape = build(case, smoke)
    if route == "unfused":
        unfuse_rnn(net, steps=shape[1])  # layout NTC
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.normal(shape=shape)
    data, label = mp.cast_batch(x, mx.nd.zeros(shape[:1]))
    trainer = mp.prepare(net, "sgd", {"learning_rate": 1e-3}, example=(x, mx.nd.zeros(shape[:1])))

    def step():
        return mp.train_step(net, lambda out, y: (out * out).mean(), trainer, data, label).loss

    return time_steps(step, iters, 1, 2).ms_per_step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="a case (repeat; default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5, help="timed steps per row and round (default: 5)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, float32 rows only: checks the tool runs")
    args = parser.parse_args(argv)
    cases = args.case or sorted(CASES)
    lines = []
    for case in cases:
        rows = [row for row in CASES[case] if not args.smoke or row[1] == "float32"]
        times = {label: [] for label, _, _, _ in rows}
        for _ in range(args.rounds):
            for label, precision, lists, route in rows:
                times[label].append(_row(case, precision, lists, route, args))
        lines += [f"### {case}", "", "| row | ms/step (median) | rounds | against float32 |",
                  "| --- | --- | --- | --- |"]
        medians = {label: statistics.median(t) for label, t in times.items() if all(isinstance(v, float) for v in t)}
        base = medians.get(rows[0][0]) if rows[0][1] == "float32" else None
        for label, _, _, _ in rows:
            if label not in medians:
                failed = next(v for v in times[label] if not isinstance(v, float))
                lines.append(f"| {label} | failed: {failed} | | |")
                continue
            ratio = f"{base / medians[label]:.2f}" if base else ""
            rounds = ", ".join(f"{t:.1f}" for t in times[label])
            lines.append(f"| {label} | {medians[label]:.1f} | {rounds} | {ratio} |")
        lines.append("")
    print("\n".join(lines))
    return 0


def _row(case, precision, lists, route, args):
    """One row in a fresh process (:func:`row`): milliseconds per step, or why it failed."""
    tools = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(tools))
    from mxfp16.plumbing.child import call_in_child

    env = {"PYTHONPATH": os.pathsep.join(p for p in (tools, os.path.dirname(tools), os.environ.get("PYTHONPATH")) if p)}
    spec = {"case": case, "precision": precision, "amp_lists": lists, "route": route, "smoke": args.smoke,
            "iters": args.iters}
    ms, problem = call_in_child("route_timing:row", spec, env=env)
    return ms if problem is None else problem.strip().splitlines()[-1].replace("|", "/")[:160]


def row(spec):
    """In a row's child: :func:`child` of ``spec`` (its arguments by name).

    Route ``shape-float32`` is mxfp16's lists with the shape operators back in
    float32 (as MXNet's lists have them): AMP is switched on with those lists
    first, and MixedPrecision then finds it on.
    """
    if spec["route"] == "shape-float32":
        from mxfp16.amp.lists import SHAPE_OPERATORS, operator_lists
        from mxfp16.precision import activate, resolve_precision

        fp32_ops = operator_lists("bfloat16")["fp32_ops"] + list(SHAPE_OPERATORS)
        activate(resolve_precision(spec["precision"], "cpu"), fp32_ops=fp32_ops)
        spec = dict(spec, route=None)
    return child(**spec)


if __name__ == "__main__":
    sys.exit(main())
