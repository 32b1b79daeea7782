"""A BERT-sized encoder over token ids, with BERT's classification head.

:class:`BertEncoderClassifier` is BERT's encoder as GluonNLP builds it for
sentence classification: word and learned position embeddings, LayerNorm
and dropout, post-LayerNorm encoder blocks (:class:`~mxfp16.models.sequence.EncoderBlock`:
attention from ``Dense`` and ``batch_dot``, GELU feed-forward), then the
pooler (``tanh`` Dense on the first token) and a Dense classifier. The
defaults are BERT-base's widths (768 units, 12 heads, feed-forward 3072,
30,522 words, 512 positions, dropout 0.1) with 2 blocks instead of 12, so
one training step fits a small CPU's minutes. One input only: BERT's
two-row segment table is left out (a single-segment task adds a constant
row to every token).

Under AMP on a CPU the Dense layers run in bfloat16; ``batch_dot``,
softmax, LayerNorm and the embeddings' lookups follow the operator lists
(``batch_dot`` has no bfloat16 CPU kernel in MXNet 1.9.1).
"""
from mxnet import gluon, init

from .sequence import EncoderBlock

__all__ = ["BertEncoderClassifier"]


class BertEncoderClassifier(gluon.HybridBlock):
    """Token ids -> embeddings -> ``num_layers`` encoder blocks -> pooler on the first token -> class scores.

    Parameters
    ----------
    classes : int
    vocab_size : int
        Rows of the word embedding (BERT's uncased WordPiece vocabulary: 30,522).
    units, heads, ffn_units, num_layers : int
        Width, attention heads, feed-forward width and blocks.
    max_length : int
        Rows of the position embedding: the longest sequence it reads.
    dropout : float
        After the embeddings, on the attention weights and on each block's
        two residual branches, as BERT.

    Raises
    ------
    ValueError
        ``units`` not a multiple of ``heads``.
    """

    def __init__(self, classes=2, vocab_size=30522, units=768, heads=12, ffn_units=3072, num_layers=2,
                 max_length=512, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.word_embed = gluon.nn.Embedding(vocab_size, units, weight_initializer=init.Normal(0.02))
            self.position_embed = gluon.nn.Embedding(max_length, units, weight_initializer=init.Normal(0.02))
            self.embed_norm = gluon.nn.LayerNorm()
            self.embed_drop = gluon.nn.Dropout(dropout)
            self.blocks = gluon.nn.HybridSequential()
            for _ in range(num_layers):
                self.blocks.add(EncoderBlock(units, heads, ffn_units, dropout))
            self.pooler = gluon.nn.Dense(units, activation="tanh", flatten=False)
            self.output = gluon.nn.Dense(classes)

    def hybrid_forward(self, F, tokens):
        """``(batch, time)`` token ids -> ``(batch, classes)`` scores."""
        positions = self.position_embed(F.contrib.arange_like(tokens, axis=1))  # (time, units)
        x = F.broadcast_add(self.word_embed(tokens), F.expand_dims(positions, axis=0))
        x = self.blocks(self.embed_drop(self.embed_norm(x)))
        first = F.squeeze(F.slice_axis(x, axis=1, begin=0, end=1), axis=1)  # BERT's [CLS] position
        return self.output(self.pooler(first))
