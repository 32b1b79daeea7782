"""The reference sequence models: an image read as a sequence of rows.

One time step, or one token, per row (as "sequential MNIST"):
:class:`LSTMClassifier` and :class:`TransformerEncoderClassifier` train with
the CNNs' pipeline, and on ``mxfp16 data digits`` with nothing to download.
"""
from mxnet import gluon, init

__all__ = ["LSTMClassifier", "TransformerEncoderClassifier", "SelfAttention", "EncoderBlock"]


def _rows(F, x):
    """``(N, C, H, W)`` images as ``(N, H, C*W)`` sequences: row ``h`` is time step ``h``."""
    return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)), shape=(0, 0, -1))


class LSTMClassifier(gluon.HybridBlock):
    """An LSTM over the rows of an image, mean-pooled over time, then a Dense classifier.

    Under AMP on a CPU the LSTM (MXNet's fused ``RNN``) stays float32 and the
    Dense layers run in bfloat16 (``docs/amp-table.md``).

    Parameters
    ----------
    classes : int
    hidden : int
        LSTM units per direction.
    num_layers : int
    bidirectional : bool
    dropout : float
        Between LSTM layers, and before the classifier.
    """

    def __init__(self, classes, hidden=128, num_layers=1, bidirectional=False, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Dense(hidden, flatten=False, activation="relu")
            self.rnn = gluon.rnn.LSTM(hidden, num_layers=num_layers, layout="NTC", dropout=dropout,
                                      bidirectional=bidirectional)
            self.drop = gluon.nn.Dropout(dropout)
            self.output = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, x):
        seq = self.rnn(self.embed(_rows(F, x)))
        return self.output(self.drop(F.mean(seq, axis=1)))


class SelfAttention(gluon.HybridBlock):
    """Multi-head self-attention from Dense, ``batch_dot`` and softmax (as GluonNLP's BERT does it).

    The scores ``q k^T / sqrt(d)`` and the softmax run in float32 under
    mxfp16's AMP (``batch_dot`` has no bfloat16 CPU kernel; softmax is kept
    float32 for its exponent's range); the projections run in bfloat16.
    """

    def __init__(self, units, heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if units % heads:
            raise ValueError(f"units={units} is not a multiple of heads={heads}")
        self._heads, self._scale = heads, 1.0 / (units // heads) ** 0.5
        with self.name_scope():
            self.query = gluon.nn.Dense(units, flatten=False)
            self.key = gluon.nn.Dense(units, flatten=False)
            self.value = gluon.nn.Dense(units, flatten=False)
            self.proj = gluon.nn.Dense(units, flatten=False)
            self.drop = gluon.nn.Dropout(dropout)

    def _split(self, F, x):
        # (N, T, U) -> (N, T, h, U/h) -> (N, h, T, U/h) -> (N*h, T, U/h)
        x = F.transpose(F.reshape(x, shape=(0, 0, self._heads, -1)), axes=(0, 2, 1, 3))
        return F.reshape(x, shape=(-1, 0, 0), reverse=True)

    def hybrid_forward(self, F, x):
        q, k, v = (self._split(F, layer(x)) for layer in (self.query, self.key, self.value))
        scores = F.batch_dot(q, k, transpose_b=True) * self._scale
        context = F.batch_dot(self.drop(F.softmax(scores, axis=-1)), v)
        # (N*h, T, U/h) -> (N, h, T, U/h) -> (N, T, h, U/h) -> (N, T, U)
        context = F.transpose(F.reshape(context, shape=(-1, self._heads, 0, 0), reverse=True), axes=(0, 2, 1, 3))
        return self.proj(F.reshape(context, shape=(0, 0, -1)))


class EncoderBlock(gluon.HybridBlock):
    """A BERT-style encoder block: attention and a GELU feed-forward, each residual and post-LayerNorm."""

    def __init__(self, units, heads, ffn_units, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.attention = SelfAttention(units, heads, dropout)
            self.norm1 = gluon.nn.LayerNorm()
            self.ffn1 = gluon.nn.Dense(ffn_units, flatten=False)
            self.gelu = gluon.nn.GELU()
            self.ffn2 = gluon.nn.Dense(units, flatten=False)
            self.drop = gluon.nn.Dropout(dropout)
            self.norm2 = gluon.nn.LayerNorm()

    def hybrid_forward(self, F, x):
        x = self.norm1(x + self.drop(self.attention(x)))
        return self.norm2(x + self.drop(self.ffn2(self.gelu(self.ffn1(x)))))


class TransformerEncoderClassifier(gluon.HybridBlock):
    """A small Transformer encoder over the rows of an image: one token per row, mean-pooled.

    Parameters
    ----------
    classes : int
    seq_len : int
        Tokens per input (image rows); sizes the learned position embedding.
    units, heads, ffn_units, num_layers : int
        Width, attention heads, feed-forward width and number of :class:`EncoderBlock`.
    dropout : float
    """

    def __init__(self, classes, seq_len, units=64, heads=4, ffn_units=128, num_layers=2, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Dense(units, flatten=False)
            self.position = self.params.get("position", shape=(1, seq_len, units), init=init.Normal(0.02))
            self.blocks = gluon.nn.HybridSequential()
            for _ in range(num_layers):
                self.blocks.add(EncoderBlock(units, heads, ffn_units, dropout))
            self.output = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, x, position):
        tokens = F.broadcast_add(self.embed(_rows(F, x)), position)
        return self.output(F.mean(self.blocks(tokens), axis=1))
