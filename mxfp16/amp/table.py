"""Which dtype every Gluon layer runs in under mxfp16's AMP lists, read from the graph AMP builds.

Each entry of :data:`LAYERS` is a layer as a user would build it;
:func:`layer_dtypes` calls it on a symbol with AMP active, and MXNet's type
inference gives each operator's output dtype: the dtype it computes in, for
a float32 input (a first layer) and a 16-bit one (after a Dense). ``mxfp16
info --amp-table`` prints :func:`generate`'s Markdown, which
``docs/amp-table.md`` holds (``tests/test_amp_layers.py`` keeps them equal).
"""
import contextlib
import json
import warnings

import mxnet as mx
from mxnet import gluon
from mxnet import numpy as mnp
from mxnet.gluon import nn, rnn
from mxnet.gluon.contrib import nn as cnn

from .._internals import numpy_symbol_class
from ..float_formats import BFLOAT16
from ..plumbing.output import error_line
from . import recurrent
from .lists import init_amp
from .wrappers import cast, dtype_name

__all__ = ["LAYERS", "CONTAINERS", "Layer", "layer_dtypes", "operator_dtypes"]


class Layer:
    """One table entry: how to build the layer and what it takes.

    Parameters
    ----------
    name : str
        The row's label: the Gluon class, and its arguments where a variant matters.
    build : callable
        ``build() -> HybridBlock`` (called with AMP already active).
    shape : tuple of int
        Input shape, batch first.
    tokens : bool
        The input is integer token ids in ``[0, 10)`` (Embedding).
    numpy_mode : bool
        Build and call it under ``npx.set_np()`` semantics.
    states : bool
        Pass explicit begin states (RNN layers), not only the input.
    hybridize : bool
        Whether training it hybridized works in MXNet 1.9.1 (not for ``Identity``: no operator to record).
    """

    def __init__(self, name, build, shape, tokens=False, numpy_mode=False, states=False, hybridize=True):
        self.name, self.build, self.shape = name, build, tuple(shape)
        self.tokens, self.numpy_mode, self.states = tokens, numpy_mode, states
        self.hybridize = hybridize


class _Unrolled(gluon.HybridBlock):
    """A recurrent cell unrolled over ``length`` steps, as a HybridBlock (cells are not layers)."""

    def __init__(self, cell, length, **kwargs):
        super().__init__(**kwargs)
        self._length = length
        with self.name_scope():
            self.cell = cell()

    def hybrid_forward(self, F, x):
        self.cell.reset()
        out, _ = self.cell.unroll(self._length, x, layout="NTC", merge_outputs=True)
        return out


class _SelfAttention(gluon.HybridBlock):
    """A user's own one-head self-attention layer: Dense projections, ``batch_dot``, softmax, LayerNorm.

    ``masked`` attends to the first 3 positions of each sequence through softmax's ``length``.
    """

    def __init__(self, units=8, masked=False, **kwargs):
        super().__init__(**kwargs)
        self._units, self._masked = units, masked
        with self.name_scope():
            self.query = gluon.nn.Dense(units, flatten=False)
            self.key = gluon.nn.Dense(units, flatten=False)
            self.value = gluon.nn.Dense(units, flatten=False)
            self.norm = gluon.nn.LayerNorm()

    def hybrid_forward(self, F, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = F.batch_dot(q, k, transpose_b=True) / (self._units ** 0.5)
        if self._masked:
            length = F.ones_like(F.slice_axis(F.sum(x, axis=2), axis=1, begin=0, end=1)) * 3
            length = F.broadcast_like(length, F.sum(x, axis=2)).astype("int32")
            weights = F.softmax(scores, length, axis=-1, use_length=True)
        else:
            weights = F.softmax(scores, axis=-1)
        return self.norm(x + F.batch_dot(weights, v))


class FusedSelfAttention(gluon.HybridBlock):
    """GluonNLP's self-attention with its fused operators: one Dense for q, k and v, ``interleaved_matmul_selfatt``.

    Input ``(T, N, C)``, as in GluonNLP's BERT. The fused operators run in float32 only on CPU.
    """

    def __init__(self, units=6, heads=2, **kwargs):
        super().__init__(**kwargs)
        self._heads = heads
        with self.name_scope():
            self.qkv = gluon.nn.Dense(3 * units, flatten=False)
            self.proj = gluon.nn.Dense(units, flatten=False)
            self.norm = gluon.nn.LayerNorm()

    def hybrid_forward(self, F, x):
        qkv = self.qkv(x)
        scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=self._heads)
        context = F.contrib.interleaved_matmul_selfatt_valatt(qkv, F.softmax(scores, axis=-1), heads=self._heads)
        return self.norm(x + self.proj(context))


def _numpy_dense_conv():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.Activation("relu"), gluon.nn.Dense(5))
    return net


class StemJoin(gluon.HybridBlock):
    """A 7x7 stem (float32 under mxfp16's rule) joined with a convolution of it (bfloat16), as in DenseNet.

    ``join`` is ``'concat'`` (channels) or ``'add'`` (a residual sum). In
    numpy mode the join is ``np.concatenate`` / ``+``.
    """

    def __init__(self, join="concat", **kwargs):
        super().__init__(**kwargs)
        self._join = join
        with self.name_scope():
            self.stem = gluon.nn.Conv2D(4, 7, padding=3)
            self.conv = gluon.nn.Conv2D(4, 3, padding=1)

    def hybrid_forward(self, F, x):
        stem = self.stem(x)
        branch = self.conv(stem)
        if self._join == "add":
            return stem + branch
        if isinstance(stem, (mnp.ndarray, numpy_symbol_class())):
            return F.np.concatenate([stem, branch], axis=1)
        return F.concat(stem, branch, dim=1)


_SEQ = (2, 5, 6)
_IMG = (2, 3, 6, 6)
_VEC = (2, 6)

#: Every layer of gluon.nn, gluon.rnn and gluon.contrib.nn (and its variants
#: that change the operators), plus the operator-level pieces of attention.
LAYERS = [
    Layer("nn.Dense", lambda: nn.Dense(8), _VEC),
    Layer("nn.Dense(flatten=False)", lambda: nn.Dense(8, flatten=False), _SEQ),
    Layer("nn.Conv1D", lambda: nn.Conv1D(4, 3), (2, 3, 8)),
    Layer("nn.Conv2D", lambda: nn.Conv2D(4, 3), _IMG),
    Layer("nn.Conv2D(7x7 stem)", lambda: nn.Conv2D(4, 7, padding=3), (2, 3, 8, 8)),
    Layer("nn.Conv2D(depthwise, groups=channels)", lambda: nn.Conv2D(3, 3, groups=3, in_channels=3), _IMG),
    Layer("nn.Conv2D(1x1)", lambda: nn.Conv2D(4, 1), _IMG),
    Layer("nn.Conv3D", lambda: nn.Conv3D(4, 3), (2, 3, 4, 4, 4)),
    Layer("nn.Conv1DTranspose", lambda: nn.Conv1DTranspose(4, 3), (2, 3, 8)),
    Layer("nn.Conv2DTranspose", lambda: nn.Conv2DTranspose(4, 3), _IMG),
    Layer("nn.Conv3DTranspose", lambda: nn.Conv3DTranspose(4, 3), (2, 3, 4, 4, 4)),
    Layer("nn.Activation(relu)", lambda: nn.Activation("relu"), _VEC),
    Layer("nn.Activation(sigmoid)", lambda: nn.Activation("sigmoid"), _VEC),
    Layer("nn.Activation(tanh)", lambda: nn.Activation("tanh"), _VEC),
    Layer("nn.Activation(softrelu)", lambda: nn.Activation("softrelu"), _VEC),
    Layer("nn.LeakyReLU", lambda: nn.LeakyReLU(0.1), _VEC),
    Layer("nn.PReLU", lambda: nn.PReLU(), _VEC),
    Layer("nn.ELU", lambda: nn.ELU(), _VEC),
    Layer("nn.SELU", lambda: nn.SELU(), _VEC),
    Layer("nn.GELU", lambda: nn.GELU(), _VEC),
    Layer("nn.Swish", lambda: nn.Swish(), _VEC),
    Layer("nn.Dropout", lambda: nn.Dropout(0.5), _VEC),
    Layer("nn.BatchNorm", lambda: nn.BatchNorm(), _IMG),
    Layer("nn.BatchNormReLU", lambda: nn.BatchNormReLU(), _IMG),
    Layer("nn.InstanceNorm", lambda: nn.InstanceNorm(), _IMG),
    Layer("nn.LayerNorm", lambda: nn.LayerNorm(), _SEQ),
    Layer("nn.GroupNorm", lambda: nn.GroupNorm(num_groups=3), _IMG),
    Layer("nn.Embedding", lambda: nn.Embedding(10, 6), (2, 5), tokens=True),
    Layer("nn.Flatten", lambda: nn.Flatten(), _IMG),
    *[Layer(f"nn.{pool}{d}D", getattr(nn, f"{pool}{d}D"), shape)
      for pool in ("MaxPool", "AvgPool", "GlobalMaxPool", "GlobalAvgPool")
      for d, shape in ((1, (2, 3, 8)), (2, _IMG), (3, (2, 3, 4, 4, 4)))],
    Layer("nn.ReflectionPad2D", lambda: nn.ReflectionPad2D(1), _IMG),
    Layer("rnn.RNN", lambda: rnn.RNN(8, layout="NTC"), _SEQ),
    Layer("rnn.LSTM", lambda: rnn.LSTM(8, layout="NTC"), _SEQ),
    Layer("rnn.LSTM(begin states)", lambda: rnn.LSTM(8, layout="NTC"), _SEQ, states=True),
    Layer("rnn.LSTM(2 layers, bidirectional)",
          lambda: rnn.LSTM(8, num_layers=2, bidirectional=True, layout="NTC"), _SEQ),
    Layer("rnn.GRU", lambda: rnn.GRU(8, layout="NTC"), _SEQ),
    Layer("rnn.GRU(2 layers, bidirectional)",
          lambda: rnn.GRU(8, num_layers=2, bidirectional=True, layout="NTC"), _SEQ),
    Layer("mxfp16.amp.recurrent.LSTM (unfused)", lambda: recurrent.LSTM(8, layout="NTC", steps=5), _SEQ),
    Layer("mxfp16.amp.recurrent.LSTM (unfused, 2 layers, bidirectional)",
          lambda: recurrent.LSTM(8, num_layers=2, bidirectional=True, layout="NTC", steps=5), _SEQ),
    Layer("mxfp16.amp.recurrent.GRU (unfused)", lambda: recurrent.GRU(8, layout="NTC", steps=5), _SEQ),
    Layer("rnn.RNNCell", lambda: _Unrolled(lambda: rnn.RNNCell(8), 5), _SEQ),
    Layer("rnn.LSTMCell", lambda: _Unrolled(lambda: rnn.LSTMCell(8), 5), _SEQ),
    Layer("rnn.GRUCell", lambda: _Unrolled(lambda: rnn.GRUCell(8), 5), _SEQ),
    Layer("rnn.HybridSequentialRNNCell(LSTMCell, LSTMCell)", lambda: _Unrolled(_stacked_cells, 5), _SEQ),
    Layer("rnn.BidirectionalCell(LSTMCell, LSTMCell)", lambda: _Unrolled(
        lambda: rnn.BidirectionalCell(rnn.LSTMCell(8), rnn.LSTMCell(8)), 5), _SEQ),
    Layer("rnn.ResidualCell(GRUCell)", lambda: _Unrolled(lambda: rnn.ResidualCell(rnn.GRUCell(6)), 5), _SEQ),
    Layer("rnn.ZoneoutCell(LSTMCell)", lambda: _Unrolled(
        lambda: rnn.ZoneoutCell(rnn.LSTMCell(8), 0.2, 0.2), 5), _SEQ),
    Layer("rnn.DropoutCell", lambda: _Unrolled(lambda: rnn.DropoutCell(0.5), 5), _SEQ),
    Layer("contrib.nn.Identity", lambda: cnn.Identity(), _VEC, hybridize=False),
    Layer("contrib.nn.PixelShuffle1D", lambda: cnn.PixelShuffle1D(2), (2, 4, 6)),
    Layer("contrib.nn.PixelShuffle2D", lambda: cnn.PixelShuffle2D(2), (2, 8, 4, 4)),
    Layer("contrib.nn.PixelShuffle3D", lambda: cnn.PixelShuffle3D(2), (2, 16, 2, 2, 2)),
    Layer("contrib.nn.SyncBatchNorm", lambda: cnn.SyncBatchNorm(), _IMG),
    Layer("self-attention (Dense, batch_dot, softmax, LayerNorm)", lambda: _SelfAttention(6), _SEQ),
    Layer("masked self-attention (softmax with length)", lambda: _SelfAttention(6, masked=True), _SEQ),
    Layer("self-attention with GluonNLP's fused operators (interleaved_matmul_selfatt)", FusedSelfAttention, _SEQ),
    Layer("join: Concat of a 7x7 stem and a convolution of it", StemJoin, (2, 3, 8, 8)),
    Layer("join: sum of a 7x7 stem and a convolution of it", lambda: StemJoin("add"), (2, 3, 8, 8)),
    Layer("numpy mode: Conv2D, Activation, Dense", _numpy_dense_conv, _IMG, numpy_mode=True),
    Layer("numpy mode: concatenate of a 7x7 stem and a convolution of it", StemJoin, (2, 3, 8, 8),
          numpy_mode=True),
    Layer("numpy mode: sum of a 7x7 stem and a convolution of it", lambda: StemJoin("add"), (2, 3, 8, 8),
          numpy_mode=True),
]

#: Classes in those modules that hold other layers or are abstract: their
#: dtypes are those of what they hold. SparseEmbedding is imperative-only
#: (row-sparse gradients): its operator, Embedding, has its row above.
CONTAINERS = {
    "nn": {"Block", "HybridBlock", "Sequential", "HybridSequential", "Lambda", "HybridLambda", "SymbolBlock"},
    "rnn": {"RecurrentCell", "HybridRecurrentCell", "ModifierCell", "SequentialRNNCell"},
    "contrib.nn": {"Concurrent", "HybridConcurrent", "SparseEmbedding"},
}


def _stacked_cells():
    cells = rnn.HybridSequentialRNNCell()
    cells.add(rnn.LSTMCell(8))
    cells.add(rnn.LSTMCell(8))
    return cells


class _Cast(gluon.HybridBlock):
    """``layer(amp_cast(x))``: the layer as it sits after a 16-bit layer (``dtype`` None: as it is)."""

    def __init__(self, layer, dtype, states, numpy_mode=False, **kwargs):
        super().__init__(**kwargs)
        self._dtype, self._states, self._numpy_mode = dtype, states, numpy_mode
        self.layer = layer

    def hybrid_forward(self, F, x, *begin):
        if self._dtype is not None:
            x = cast(x, self._dtype)
        return self.layer(x, list(begin)) if self._states else self.layer(x)


def _numpy_scope(on):
    """MXNet's numpy shape and array semantics while it is entered, when ``on`` (else nothing)."""
    stack = contextlib.ExitStack()
    for scope in (mx.util.np_shape, mx.util.np_array) if on else ():
        stack.enter_context(scope(True))
    return stack


def layer_dtypes(layer, input_dtype="float32"):
    """The dtype of each operator ``layer`` builds, with AMP active in this process.

    Parameters
    ----------
    layer : Layer
    input_dtype : str
        ``'float32'``, or the AMP target (``'bfloat16'`` / ``'float16'``) for a
        layer that follows a 16-bit layer.

    Returns
    -------
    list of (str, str)
        ``(operator, dtype)`` in graph order, without AMP's own casts.
    """
    cast = {"float32": None, "bfloat16": BFLOAT16, "float16": "float16"}[input_dtype]
    with _numpy_scope(layer.numpy_mode):
        if layer.numpy_mode:
            mx.npx.set_np()
        try:
            block = _Cast(layer.build(), cast, layer.states, layer.numpy_mode)
            data = mx.sym.var("data")
            if layer.numpy_mode:
                data = data.as_np_ndarray()
            begin = [mx.sym.var(f"state{i}") for i in range(2 if layer.states else 0)]
            out = block(data, *begin)
            out = out[0] if isinstance(out, (list, tuple)) else out
            if layer.numpy_mode:
                out = out.as_nd_ndarray()
            internals = out.get_internals()
            _, types, _ = internals.infer_type_partial(data="float32", **{s.name: "float32" for s in begin})
        except mx.MXNetError as err:
            # A layer AMP cannot type is a finding for the table, not a crash of it.
            return [("FAILS:", error_line(err).replace("|", "/")[:160])]
        finally:
            if layer.numpy_mode:
                mx.npx.reset_np()
    return [(op, dtype_name(dtype) if dtype is not None else "unknown")
            for op, dtype in operator_dtypes(out, internals, types)]


def operator_dtypes(out, internals, types, nodes=None):
    """``[(operator, dtype)]`` for each operator node of graph ``out``, AMP's own casts left out.

    ``internals`` is ``out.get_internals()``, ``types`` its inferred types, ``nodes`` the graph's JSON nodes.
    """
    variables = set(out.list_inputs())
    first = {}
    for name, dtype in zip(internals.list_outputs(), types):
        if name not in variables:
            first.setdefault(name.rsplit("_", 1)[0], dtype)
    nodes = nodes if nodes is not None else json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    return [(node["op"], first.get(node["name"])) for node in nodes
            if node["op"] not in ("null", "amp_cast", "amp_multicast")]


def _cell(rows):
    """``'FullyConnected bfloat16, LayerNorm float32'``: each operator once, in graph order."""
    return ", ".join(f"{op} {dtype}" for op, dtype in dict.fromkeys(map(tuple, rows))) or "(no operator)"


def generate(target="bfloat16"):
    """The Markdown layer table ``mxfp16 info --amp-table`` prints, built in a child process (AMP is process-global).

    Raises
    ------
    RuntimeError
        The child failed; the message ends with its error output.
    """
    from ..plumbing.child import call_in_child

    markdown, problem = call_in_child(_markdown_under, target)
    if markdown is None:
        raise RuntimeError(f"generating the AMP table failed: {problem}")
    if target != "bfloat16":
        return markdown
    from .operators import render as render_operators

    return markdown + "\n" + render_operators()


def _amp_on(target):
    """In a child process of :func:`generate` (or :func:`mxfp16.amp.zoo.generate`): AMP on for ``target``."""
    warnings.simplefilter("ignore")
    # Nothing runs: the graphs are only built and typed, so either target's lists apply on any CPU,
    # one without float16 or bfloat16 arithmetic included.
    init_amp(target)


def _markdown_under(target):
    """In generate's child: every :data:`LAYERS` entry's operators and dtypes for both inputs, as Markdown."""
    _amp_on(target)
    lines = [f"Generated by `mxfp16 info --amp-table` (MXNet {mx.__version__}, amp-{target}, "
             "mxfp16's operator lists). Each operator is followed by the dtype it computes in.",
             "",
             f"| Layer | float32 input | {target} input (after a 16-bit layer) |",
             "| --- | --- | --- |"]
    for layer in LAYERS:
        float32, low = (_cell(layer_dtypes(layer, dtype)) for dtype in ("float32", target))
        lines.append(f"| {layer.name} | {float32} | {low} |")
    return "\n".join(lines) + "\n"
