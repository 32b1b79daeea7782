"""GluonTS 0.14's SimpleFeedForwardTrainingNetwork trained through mxfp16's public API: the network's own loss.

GluonTS training networks take the past and future of each series and
return the negative log-likelihood per series: there is no loss function to
give. ``train_step(net, None, trainer, data)`` sums what the network returns;
the inputs (past values, future values, the future's observed mask) go to
``cast_batch`` as one tuple, with no labels.

Run each precision in its own process (AMP is process-global)::

    python examples/real_clients/gluonts_feedforward.py --precision float32
    python examples/real_clients/gluonts_feedforward.py --precision amp-bfloat16

GluonTS installs without its dependency pins: ``pip install --no-deps
gluonts==0.14.4 toolz 'pydantic<2'``.
"""
import argparse

import mxfp16  # before mxnet

import mxnet as mx
import numpy as np
from gluonts.mx.distribution import StudentTOutput
from gluonts.mx.model.simple_feedforward._network import SimpleFeedForwardTrainingNetwork

CONTEXT, PREDICTION = 24, 8


def windows(count, seed):
    """Noisy sine waves of random period, level and phase: (past, future, observed) windows."""
    rng = np.random.RandomState(seed)
    t = np.arange(CONTEXT + PREDICTION)
    period, level, phase = rng.uniform(6, 14, count), rng.uniform(5, 50, count), rng.uniform(0, 6, count)
    series = level[:, None] * (1.5 + np.sin(2 * np.pi * t[None] / period[:, None] + phase[:, None]))
    series += rng.normal(0, 0.05, series.shape) * level[:, None]
    series = series.astype("float32")
    return (mx.nd.array(series[:, :CONTEXT]), mx.nd.array(series[:, CONTEXT:]),
            mx.nd.ones((count, PREDICTION)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto", help="float32, amp-bfloat16, auto ... (default: auto)")
    parser.add_argument("--steps", type=int, default=60, help="training steps (default: 60)")
    args = parser.parse_args()

    mp = mxfp16.MixedPrecision(args.precision, "cpu")
    mx.random.seed(0)
    net = SimpleFeedForwardTrainingNetwork(num_hidden_dimensions=[40, 40], prediction_length=PREDICTION,
                                           context_length=CONTEXT, batch_normalization=False, mean_scaling=True,
                                           distr_output=StudentTOutput())
    net.initialize(mx.init.Xavier(), ctx=mp.ctx)
    net.hybridize()
    trainer = mp.prepare(net, "adam", {"learning_rate": 3e-3})
    print(f"precision {mp.precision.name} ({mp.precision.reason}); scaler {mp.scaler}")
    for step in range(args.steps):
        data, label = mp.cast_batch(windows(32, seed=step), None)
        result = mp.train_step(net, None, trainer, data)  # the network returns its own loss
        if step % 15 == 0 or step == args.steps - 1:
            print(f"step {step:3d} negative log-likelihood {result.loss.item():.4f}")
    held_out = mxfp16.eval_step(net, mp.cast_batch(windows(256, seed=10_000), None)[0])
    print(f"held-out negative log-likelihood {held_out[0].mean().asscalar():.4f} on 256 series; "
          f"output dtype {held_out[0].dtype.__name__}")


if __name__ == "__main__":
    main()
