"""GluonNLP 0.10's BERTClassifier trained through mxfp16's public API: tokens, segments and valid lengths.

A small BERTModel (2 layers) under GluonNLP's own classifier head, trained a
few steps on a synthetic task (is token 3001 in the sentence?) with token ids
above 2048, which a float16 cast of the inputs would change. No wrapper
block, no pass-through loss: the three inputs go to ``cast_batch`` as a
tuple, and ``train_step`` calls ``net(tokens, segments, valid_length)``.

Run each precision in its own process (AMP is process-global)::

    python examples/real_clients/gluonnlp_bert.py --precision float32
    python examples/real_clients/gluonnlp_bert.py --precision amp-bfloat16

GluonNLP 0.10 installs from its source archive without its dependency pins:
``pip install --no-deps gluonnlp==0.10.0`` (builds a small C extension).
"""
import argparse

import mxfp16  # before mxnet

import gluonnlp as nlp
import mxnet as mx
import numpy as np
from mxnet import gluon

VOCAB, LENGTH, MARKER = 4000, 12, 3001


def batches(steps, batch, seed):
    """Token ids in [1, VOCAB), random valid lengths; label 1 when MARKER is among the valid tokens."""
    rng = np.random.RandomState(seed)
    for _ in range(steps):
        tokens = rng.randint(1, VOCAB, (batch, LENGTH))
        valid = rng.randint(4, LENGTH + 1, batch)
        label = rng.randint(0, 2, batch)
        for i in range(batch):
            tokens[i, valid[i]:] = 0
            tokens[i, :valid[i]][tokens[i, :valid[i]] == MARKER] = MARKER + 1
            if label[i]:
                tokens[i, rng.randint(0, valid[i])] = MARKER
        segments = (np.arange(LENGTH) >= LENGTH // 2).astype("int32")[None].repeat(batch, 0)
        yield ((mx.nd.array(tokens, dtype="int32"), mx.nd.array(segments, dtype="int32"),
                mx.nd.array(valid, dtype="float32")), mx.nd.array(label, dtype="int32"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto", help="float32, amp-bfloat16, auto ... (default: auto)")
    parser.add_argument("--steps", type=int, default=40, help="training steps (default: 40)")
    args = parser.parse_args()

    mp = mxfp16.MixedPrecision(args.precision, "cpu")
    mx.random.seed(0)
    encoder = nlp.model.BERTEncoder(num_layers=2, units=64, hidden_size=128, max_length=LENGTH, num_heads=4)
    bert = nlp.model.BERTModel(encoder, vocab_size=VOCAB, token_type_vocab_size=2, units=64, embed_size=64,
                               use_pooler=True, use_decoder=False, use_classifier=False)
    net = nlp.model.BERTClassifier(bert, num_classes=2, dropout=0.0)
    net.initialize(mx.init.Normal(0.02), ctx=mp.ctx)
    net.hybridize(static_alloc=True)
    trainer = mp.prepare(net, "adam", {"learning_rate": 1e-3})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    print(f"precision {mp.precision.name} ({mp.precision.reason}); scaler {mp.scaler}")
    for step, (inputs, label) in enumerate(batches(args.steps, 32, seed=1)):
        data, labels = mp.cast_batch(inputs, label)
        result = mp.train_step(net, loss_fn, trainer, data, labels)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d} loss {result.loss.item():.4f}")
    correct = total = 0
    for inputs, label in batches(4, 64, seed=2):
        data, labels = mp.cast_batch(inputs, label)
        for out, y in zip(mxfp16.eval_step(net, data), labels):
            correct += (out.argmax(axis=1) == y.astype("float32")).sum().asscalar()
            total += y.shape[0]
    print(f"held-out accuracy {correct / total:.3f} on {total} sentences (chance 0.5)")
    print("input dtypes", [str(np.dtype(a.dtype)) for a in data[0]],
          "| output dtype before the float32 cast", net(*data[0]).dtype)


if __name__ == "__main__":
    main()
