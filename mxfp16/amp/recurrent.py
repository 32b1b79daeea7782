"""Recurrent layers whose matrix products run in bfloat16 under AMP: ``gluon.rnn.LSTM``, ``GRU`` and ``RNN`` unfused.

MXNet 1.9.1's fused ``RNN`` operator has no bfloat16 CPU kernel (oneDNN's
path takes float32 only, its own kernels reject bfloat16). The layers here
compute the same from operators that have one (docs/amp-table.md, "recurrent
layers"). The input projection of all steps is cast to float32 and ``split``
once (a ``slice_axis`` per step would copy the whole sequence every step), and
the recurrent weight is cast once per call. The gates' sigmoid and tanh are
``Activation``: oneDNN's vector kernels, where the ``sigmoid`` and ``tanh``
operators are MXNet's scalar loops and sit in AMP's float32 list, which casts
each one's input again (three more casts a step). Each step still runs a dozen
operators, so it pays only at large hidden sizes.

The unrolled graph is built for one sequence length: a layer called on
arrays reads it (and rebuilds when it changes); one traced inside a larger
hybridized network needs it given (``steps=``).
"""
import numpy as np
from mxnet import gluon, ndarray
from mxnet.util import is_np_array

from .._internals import RNNSettings, block_children, rebuild_graphs
from . import wrappers as w
from .lists import amp_target

__all__ = ["LSTM", "GRU", "RNN", "unfuse_rnn", "unfused_support"]

#: Gates per step (the rows of each weight matrix are ``gates * hidden``), in MXNet's (cuDNN's) order:
#: LSTM input, forget, cell, output; GRU reset, update, new.
_GATES = {"lstm": 4, "gru": 3, "rnn_relu": 1, "rnn_tanh": 1}


def unfused_support(layer):
    """Why ``layer`` (a ``gluon.rnn`` layer) cannot be computed unfused, or ``None`` when it can."""
    settings = RNNSettings(layer)
    if settings.projection_size:
        return "it has a projection (projection_size)"
    if any(v is not None and v is not False for v in settings.state_clip):
        return "it clips the LSTM cell state (lstm_state_clip_*)"
    if settings.use_sequence_length:
        return "it takes sequence lengths (use_sequence_length)"
    if is_np_array():
        return "numpy mode (npx.set_np()) is on: the unfused layers are written with mx.nd / mx.sym operators"
    return None


class _Unfused:
    """The unfused computation of a ``gluon.rnn`` layer; mixed into a subclass of that layer."""

    #: The sequence length the graph is built for, when it cannot be read from the input (see the module docstring).
    steps = None

    def __init__(self, *args, steps=None, **kwargs):
        super().__init__(*args, **kwargs)
        why = unfused_support(self)
        if why is not None:
            raise ValueError(f"mxfp16.amp.recurrent.{type(self).__name__} cannot be built: {why}; use "
                             f"gluon.rnn.{type(self).__name__}, whose fused kernel runs it (in float32 under AMP)")
        self.steps = steps

    def __call__(self, inputs, states=None, sequence_length=None, **kwargs):
        if isinstance(inputs, ndarray.NDArray):
            steps = inputs.shape[RNNSettings(self).layout.find("T")]
            if steps != self.steps:
                self.steps = steps
                rebuild_graphs(self)  # a graph unrolled over another length cannot run this one
        return super().__call__(inputs, states, sequence_length, **kwargs)

    def hybrid_forward(self, F, inputs, states, sequence_length=None, **params):
        settings = RNNSettings(self)
        why = unfused_support(self)
        if why is not None:
            raise ValueError(f"{self.name} cannot run unfused: {why}")
        if self.steps is None:
            raise ValueError(f"{self.name} is an unfused recurrent layer traced inside a hybridized network, so it "
                             "cannot read its sequence length from its input: give it as steps=T (mxfp16.amp."
                             "unfuse_rnn(net, steps=T), or layer.steps = T)")
        if F is ndarray:
            batch = inputs.shape[settings.layout.find("N")]
            for state, info in zip(states, self.state_info(batch)):
                if state.shape != info["shape"]:
                    raise ValueError(f"Invalid recurrent state shape. Expecting {info['shape']}, got {state.shape}.")
        x = F.swapaxes(inputs, dim1=0, dim2=1) if settings.layout == "NTC" else inputs
        output, out_states = _unrolled(F, x, states, params, settings, self.steps)
        if settings.layout == "NTC":
            output = F.swapaxes(output, dim1=0, dim2=1)
        return output if self.skip_states else (output, out_states)


class LSTM(_Unfused, gluon.rnn.LSTM):
    """``gluon.rnn.LSTM``, unfused: its matrix products in bfloat16 under AMP (see the module docstring).

    Takes ``gluon.rnn.LSTM``'s arguments, and ``steps``: the sequence length,
    needed only when it is traced inside a larger hybridized network.
    """


class GRU(_Unfused, gluon.rnn.GRU):
    """``gluon.rnn.GRU``, unfused: its matrix products in bfloat16 under AMP (see the module docstring)."""


class RNN(_Unfused, gluon.rnn.RNN):
    """``gluon.rnn.RNN``, unfused: its matrix products in bfloat16 under AMP (see the module docstring)."""


_UNFUSED = {gluon.rnn.LSTM: LSTM, gluon.rnn.GRU: GRU, gluon.rnn.RNN: RNN}


def unfuse_rnn(net, steps=None):
    """Compute every ``gluon.rnn.LSTM``, ``GRU`` and ``RNN`` layer in ``net`` unfused, in place.

    Each layer keeps its parameters, states and settings (a checkpoint loads either way); built graphs are traced again.

    Parameters
    ----------
    net : gluon.Block
    steps : int, optional
        The sequence length, for layers traced inside a larger hybridized network.

    Returns
    -------
    dict
        ``{layer name: 'unfused' or why it stays fused}`` (see :func:`unfused_support`).
    """
    done = {}

    def visit(block):
        kind = _UNFUSED.get(type(block))
        if kind is not None:
            why = unfused_support(block)
            if why is None:
                # The subclass adds behaviour and no state: the layer object (and every reference to it,
                # its parameters, its place in its parent) stays the same; only its methods change.
                block.__class__ = kind
                block.steps = steps
            done[block.name] = why or "unfused"
        for child in block_children(block):
            visit(child)

    visit(net)
    rebuild_graphs(net)
    return done


# The computation, on mx.nd or mx.sym (F).
def _as_dtype(F, x, dtype):
    """``x`` in ``dtype``; an array already in it is returned as it is (a graph's cast to its own dtype is free)."""
    if F is ndarray and np.dtype(x.dtype) == np.dtype(dtype):
        return x
    return w.cast(x, dtype)


def _parts(F, x, count, axis, squeeze=False):
    """``x`` split into ``count`` equal parts along ``axis`` (``squeeze``: of length 1, the axis removed): a list."""
    parts = F.split(x, num_outputs=count, axis=axis, squeeze_axis=squeeze)
    return list(parts) if count > 1 else [parts]


def _unrolled(F, x, states, params, settings, steps):
    """The layer on ``x`` (``(T, N, C)``): ``(output (T, N, directions * H), [h_n, c_n])``."""
    gates, hidden = _GATES[settings.mode], settings.hidden_size
    compute = np.dtype(settings.dtype).name
    lstm = settings.mode == "lstm"
    count = settings.num_layers * settings.directions
    # Each begin state per layer and direction: [[h0 ...], [c0 ...]].
    begin = [_parts(F, state, count, axis=0, squeeze=True) for state in states]
    finals = [[] for _ in states]
    target = amp_target()
    for layer in range(settings.num_layers):
        if layer and settings.dropout:
            x = F.Dropout(x, p=settings.dropout)
        outputs = []
        for d, side in enumerate("lr"[:settings.directions]):
            name = f"{side}{layer}"
            k = layer * settings.directions + d
            w_ih, w_hh = params[f"{name}_i2h_weight"], params[f"{name}_h2h_weight"]
            b_ih, b_hh = params[f"{name}_i2h_bias"], params[f"{name}_h2h_bias"]
            # Both biases join the input projection, except the GRU's recurrent one (inside its reset gate).
            bias = b_ih if settings.mode == "gru" else b_ih + b_hh
            projected = F.FullyConnected(x, w_ih, bias, num_hidden=gates * hidden, flatten=False)
            projected = _parts(F, _as_dtype(F, projected, compute), steps, axis=0, squeeze=True)
            if target is not None:  # cast once here, not by AMP at each step's product
                w_hh = w.cast(w_hh, target)
                b_hh = w.cast(b_hh, target) if settings.mode == "gru" else b_hh
            h = begin[0][k]
            c = begin[1][k] if lstm else None
            seq = []
            order = range(steps) if side == "l" else reversed(range(steps))
            for t in order:
                if settings.mode == "gru":
                    recurrent = F.FullyConnected(h, w_hh, b_hh, num_hidden=gates * hidden)
                else:
                    recurrent = F.FullyConnected(h, w_hh, num_hidden=gates * hidden, no_bias=True)
                h, c = _step(F, settings.mode, projected[t], _as_dtype(F, recurrent, compute), h, c)
                seq.append(h)
            if side == "r":
                seq.reverse()
            outputs.append(F.stack(*seq, axis=0))
            finals[0].append(h)
            if lstm:
                finals[1].append(c)
        x = outputs[0] if len(outputs) == 1 else F.concat(*outputs, dim=2)
    return x, [F.stack(*final, axis=0) for final in finals]


def _sigmoid(F, x):
    return F.Activation(x, act_type="sigmoid")  # oneDNN's kernel, and no AMP cast (see the module docstring)


def _tanh(F, x):
    return F.Activation(x, act_type="tanh")


def _step(F, mode, projected, recurrent, h, c):
    """One time step: ``(h, c)`` after it (``c`` is ``None`` but for the LSTM)."""
    if mode == "lstm":
        i, f, g, o = _parts(F, projected + recurrent, 4, axis=1)
        c = _sigmoid(F, f) * c + _sigmoid(F, i) * _tanh(F, g)
        return _sigmoid(F, o) * _tanh(F, c), c
    if mode == "gru":
        x_r, x_z, x_n = _parts(F, projected, 3, axis=1)
        h_r, h_z, h_n = _parts(F, recurrent, 3, axis=1)
        reset, update = _sigmoid(F, x_r + h_r), _sigmoid(F, x_z + h_z)
        new = _tanh(F, x_n + reset * h_n)
        return new + update * (h - new), None
    act = "relu" if mode == "rnn_relu" else "tanh"
    return F.Activation(projected + recurrent, act_type=act), None
