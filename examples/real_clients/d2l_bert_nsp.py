"""d2l 1.0.3's BERTModel trained on next-sentence prediction alone, through mxfp16's public API.

d2l's BERT returns ``(encoded, mlm_scores, nsp_scores)``; trained on the
next-sentence task alone its masked-LM head receives no gradient, and a
plain ``trainer.update`` stops at that head's first parameter. Here the loss
function picks the next-sentence scores and ``skip_unused_params=True``
leaves the unused head as it is; without it the step names the head's
parameters and that option. d2l's model runs in numpy mode, which MXNet
1.9.1's AMP does not wrap: under amp-bfloat16 it trains in float32 and
mxfp16 says so once (a ``Float32Fallback`` warning).

Run each precision in its own process (AMP is process-global)::

    python examples/real_clients/d2l_bert_nsp.py --precision float32
    python examples/real_clients/d2l_bert_nsp.py --precision amp-bfloat16

d2l installs without its dependency pins: ``pip install --no-deps d2l==1.0.3``.
"""
import argparse

import mxfp16  # before mxnet

import mxnet as mx
import numpy as onp
from d2l import mxnet as d2l
from mxnet import gluon, np, npx

VOCAB, LENGTH = 3000, 16


def pairs(steps, batch, seed):
    """``<cls>`` (id 1), then two 'sentences' of ids; a real pair (label 1) draws its second from the lower half."""
    rng = onp.random.RandomState(seed)
    half = LENGTH // 2
    for _ in range(steps):
        label = rng.randint(0, 2, batch)
        first = rng.randint(5, VOCAB, (batch, half))
        first[:, 0] = 1  # <cls>: the next-sentence head reads its encoding
        second = onp.where(label[:, None] == 1, rng.randint(5, VOCAB // 2, (batch, half)),
                           rng.randint(VOCAB // 2, VOCAB, (batch, half)))
        segments = (onp.arange(LENGTH) >= half)[None].repeat(batch, 0)
        yield ((np.array(onp.concatenate([first, second], axis=1), dtype="int32"), np.array(segments, dtype="int32"),
                np.full((batch,), LENGTH, dtype="float32")), np.array(label, dtype="float32"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto", help="float32, amp-bfloat16, auto ... (default: auto)")
    parser.add_argument("--steps", type=int, default=100, help="training steps (default: 100)")
    args = parser.parse_args()

    mp = mxfp16.MixedPrecision(args.precision, "cpu")
    npx.set_np()
    mx.random.seed(0)
    net = d2l.BERTModel(VOCAB, num_hiddens=64, ffn_num_hiddens=128, num_heads=2, num_blks=2, dropout=0.1,
                        max_len=LENGTH)
    net.initialize(mx.init.Xavier(), ctx=mp.ctx)
    (tokens, segments, valid), _ = next(pairs(1, 2, seed=0))
    net(tokens, segments, valid, np.zeros((2, 1), dtype="int32"))  # d2l's own start: every head materialised
    trainer = mp.prepare(net, "adam", {"learning_rate": 2e-3})
    ce = gluon.loss.SoftmaxCrossEntropyLoss()
    nsp_only = lambda outputs, label: ce(outputs[2], label)  # noqa: E731 -- (encoded, mlm, nsp): the last
    print(f"precision {mp.precision.name} ({mp.precision.reason}); scaler {mp.scaler}")
    data, label = mp.cast_batch(*next(pairs(1, 8, seed=1)))
    try:
        mp.train_step(net, nsp_only, trainer, data, label)
    except mxfp16.UnusedParameterError as err:
        print("without the option:", str(err).split(". ")[0])
    for step, (inputs, label) in enumerate(pairs(args.steps, 32, seed=2)):
        data, labels = mp.cast_batch(inputs, label)
        result = mp.train_step(net, nsp_only, trainer, data, labels, skip_unused_params=True)
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:3d} next-sentence loss {result.loss.item():.4f}")
    correct = total = 0
    for inputs, label in pairs(4, 64, seed=3):
        data, labels = mp.cast_batch(inputs, label)
        for out, y in zip(mxfp16.eval_step(net, data), labels):
            correct += (out[2].argmax(axis=1).astype("float32") == y).sum().item()
            total += y.shape[0]
    print(f"held-out next-sentence accuracy {correct / total:.3f} on {total} pairs (chance 0.5)")


if __name__ == "__main__":
    main()
