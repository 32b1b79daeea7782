"""A word-level language model: the network of MXNet's ``example/gluon/word_language_model``.

:class:`WordLanguageModel` is that example's ``RNNModel`` (MXNet 1.9.1):
an embedding, dropout, a fused multi-layer LSTM or GRU (MXNet's ``RNN``
operator) with dropout between its layers, dropout, and a decoder to the
vocabulary whose weight can be the embedding's own (``--tied``, weight
tying). Two things differ, neither of them in the layers: it reads a batch
as ``(batch, time)`` token ids, batch first as every mxfp16 batch is, and
it starts each segment from a zero state, where the example carries the
(detached) state from one 35-token segment to the next; the work per step
is the same.

Under AMP on a CPU the recurrent layers stay float32 (MXNet 1.9.1's ``RNN``
operator has no bfloat16 CPU kernel) and the embedding and decoder follow
the operator lists.
"""
import mxnet as mx
from mxnet import gluon

__all__ = ["WordLanguageModel", "RECURRENT_MODES"]

#: The recurrent layer of each mode, with its number of gate blocks per unit (what its weights hold).
RECURRENT_MODES = {"lstm": (gluon.rnn.LSTM, 4), "gru": (gluon.rnn.GRU, 3)}


class WordLanguageModel(gluon.HybridBlock):
    """Embedding -> dropout -> LSTM or GRU -> dropout -> decoder: next-word scores at every step.

    Parameters
    ----------
    mode : str
        ``'lstm'`` or ``'gru'``.
    vocab_size : int
        Words in the vocabulary: the embedding's rows and the decoder's outputs.
    embed_size, hidden_size : int
        Embedding width and recurrent units per layer (equal when tied).
    num_layers : int
    dropout : float
        On the embedding, between recurrent layers and on the recurrent
        output, as in the example.
    tie_weights : bool
        The decoder's weight is the embedding's (Press and Wolf's weight
        tying); the decoder keeps a bias of its own.

    Raises
    ------
    ValueError
        An unknown mode, or tied weights with ``embed_size != hidden_size``.
    """

    def __init__(self, mode, vocab_size, embed_size=650, hidden_size=650, num_layers=2, dropout=0.5,
                 tie_weights=True, **kwargs):
        super().__init__(**kwargs)
        if mode not in RECURRENT_MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(RECURRENT_MODES)}")
        if tie_weights and embed_size != hidden_size:
            raise ValueError(f"tied weights need embed_size == hidden_size, got {embed_size} and {hidden_size}: "
                             "the decoder's weight is the embedding's")
        layer, _ = RECURRENT_MODES[mode]
        with self.name_scope():
            self.drop = gluon.nn.Dropout(dropout)
            self.encoder = gluon.nn.Embedding(vocab_size, embed_size, weight_initializer=mx.init.Uniform(0.1))
            self.rnn = layer(hidden_size, num_layers, layout="NTC", dropout=dropout, input_size=embed_size)
            shared = dict(params=self.encoder.params) if tie_weights else {}
            self.decoder = gluon.nn.Dense(vocab_size, flatten=False, in_units=hidden_size, **shared)

    def hybrid_forward(self, F, tokens):
        """``(batch, time)`` token ids -> ``(batch, time, vocab_size)`` scores for the next word."""
        return self.decoder(self.drop(self.rnn(self.drop(self.encoder(tokens)))))
