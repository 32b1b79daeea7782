"""The networks only the benchmark runs: MXNet's DCGAN, its word language model, and a BERT-sized encoder.

The PyTorch peer (:mod:`mxfp16.bench.peer_families`) builds the same layers;
:mod:`mxfp16.bench.family_steps` times one training step of each. Under AMP
on a CPU, ``Deconvolution``, ``RNN`` and ``batch_dot`` stay float32
(docs/amp-table.md): the generator and the recurrent layers run in float32.

The DCGAN has the layers of MXNet 1.9.1's ``example/gluon/dc_gan`` (64 px);
the discriminator ends in a ``Flatten``, which the example does with a
``reshape`` after the call.

:class:`WordLanguageModel` is the ``RNNModel`` of
``example/gluon/word_language_model`` with two differences outside the
layers: it reads ``(batch, time)`` token ids, batch first as every mxfp16
batch is, and starts each segment from a zero state where the example
carries the detached state on; the work per step is the same.

:class:`BertEncoderClassifier` is BERT's encoder as GluonNLP builds it for
sentence classification, at BERT-base's widths with 2 blocks instead of 12,
so one training step fits a small CPU's minutes, and without the two-row
segment table (a single-segment task adds a constant row to every token).
"""
import mxnet as mx
from mxnet import gluon, init

from ..models.sequence import EncoderBlock

__all__ = ["dcgan_generator", "dcgan_discriminator", "DiscriminatorPass", "WordLanguageModel", "RECURRENT_MODES",
           "BertEncoderClassifier"]


def dcgan_generator(nz=100, ngf=64):
    """Noise ``(batch, nz, 1, 1)`` -> images ``(batch, 3, 64, 64)`` in [-1, 1].

    Parameters
    ----------
    nz, ngf : int
        Length of the noise vector; channels of the last hidden layer (the earlier ones have 2, 4 and 8 times as many).

    Returns
    -------
    gluon.nn.HybridSequential
        Not initialised (the example draws every weight from N(0, 0.02)).
    """
    net = gluon.nn.HybridSequential(prefix="generator_")
    with net.name_scope():
        for i, width in enumerate((ngf * 8, ngf * 4, ngf * 2, ngf)):
            stride, pad = (1, 0) if i == 0 else (2, 1)  # 1x1 -> 4x4, then doubling
            net.add(gluon.nn.Conv2DTranspose(width, 4, stride, pad, use_bias=False), gluon.nn.BatchNorm(),
                    gluon.nn.Activation("relu"))
        net.add(gluon.nn.Conv2DTranspose(3, 4, 2, 1, use_bias=False), gluon.nn.Activation("tanh"))
    return net


def dcgan_discriminator(ndf=64):
    """Images ``(batch, 3, 64, 64)`` -> ``(batch, 2)`` scores (fake, real) for softmax cross-entropy.

    Parameters
    ----------
    ndf : int
        Channels of the first layer; the later ones have 2, 4 and 8 times as many.

    Returns
    -------
    gluon.nn.HybridSequential
        Not initialised.
    """
    net = gluon.nn.HybridSequential(prefix="discriminator_")
    with net.name_scope():
        net.add(gluon.nn.Conv2D(ndf, 4, 2, 1, use_bias=False), gluon.nn.LeakyReLU(0.2))
        for width in (ndf * 2, ndf * 4, ndf * 8):
            net.add(gluon.nn.Conv2D(width, 4, 2, 1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.LeakyReLU(0.2))
        net.add(gluon.nn.Conv2D(2, 4, 1, 0, use_bias=False), gluon.nn.Flatten())
    return net


class DiscriminatorPass(gluon.Block):
    """The discriminator update's forward pass: ``(real, noise) -> (D(real), D(fake), fake)``.

    ``fake = generator(noise)``; the discriminator sees it detached, so the
    update's backward pass stops at the generator, and ``fake`` itself is
    returned with its history, for the generator's update. Not hybridized
    itself (the detach is between two graphs); the generator and
    discriminator inside it are.

    Parameters
    ----------
    generator, discriminator : gluon.Block
    """

    def __init__(self, generator, discriminator, **kwargs):
        super().__init__(**kwargs)
        self.generator, self.discriminator = generator, discriminator

    def forward(self, real, noise):
        fake = self.generator(noise)
        return self.discriminator(real), self.discriminator(fake.detach()), fake


#: The recurrent layer of each mode.
RECURRENT_MODES = {"lstm": gluon.rnn.LSTM, "gru": gluon.rnn.GRU}


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
        layer = RECURRENT_MODES[mode]
        with self.name_scope():
            self.drop = gluon.nn.Dropout(dropout)
            self.encoder = gluon.nn.Embedding(vocab_size, embed_size, weight_initializer=mx.init.Uniform(0.1))
            self.rnn = layer(hidden_size, num_layers, layout="NTC", dropout=dropout, input_size=embed_size)
            shared = dict(params=self.encoder.params) if tie_weights else {}
            self.decoder = gluon.nn.Dense(vocab_size, flatten=False, in_units=hidden_size, **shared)

    def hybrid_forward(self, F, tokens):
        """``(batch, time)`` token ids -> ``(batch, time, vocab_size)`` scores for the next word."""
        return self.decoder(self.drop(self.rnn(self.drop(self.encoder(tokens)))))


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
            self.embed_norm, self.embed_drop = gluon.nn.LayerNorm(), gluon.nn.Dropout(dropout)
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
