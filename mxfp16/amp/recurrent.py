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

The unrolled graph is built for one sequence length. A layer called on
arrays reads it (and rebuilds when it changes). One traced inside a larger
hybridized network reads it from the shapes that network is called with,
when :func:`unfuse_rnn` was given that network (it watches the network's calls
and traces it again when a batch brings another length); otherwise it needs
the length given (``steps=``).

A graph of the network is unrolled too: Gluon's ``export`` of an unfused
network writes one sequence length. mxfp16's export traces it fused
(:func:`fused`), and :func:`fuse_rnn` switches it back for good.
"""
import contextlib
import threading
import warnings
import weakref

import numpy as np
from mxnet import gluon, ndarray
from mxnet.util import is_np_array

from .._internals import RNNSettings, block_children, rebuild_graphs
from . import wrappers as w
from .lists import amp_target

__all__ = ["LSTM", "GRU", "RNN", "unfuse_rnn", "fuse_rnn", "fused", "layers_to_unfuse", "unfused_support"]

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
        if F is not ndarray:
            self.steps = _traced_length(self, inputs, settings.layout) or self.steps
        if self.steps is None:
            raise ValueError(f"{self.name} is an unfused recurrent layer traced inside a hybridized network, so it "
                             "cannot read its sequence length from its input: give it as steps=T (mxfp16.amp."
                             "unfuse_rnn(net, steps=T), or layer.steps = T), or call mxfp16.amp.unfuse_rnn(net) on "
                             "the network you call, which reads it from that network's input")
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
_FUSED = {unfused: fused for fused, unfused in _UNFUSED.items()}


def _layers_of(net, switch):
    """The blocks of ``net`` whose exact class is a key of ``switch`` (:data:`_UNFUSED` or :data:`_FUSED`), in order."""
    found = [net] if type(net) in switch else []
    for child in block_children(net):
        found += _layers_of(child, switch)
    return found


def _switch(layers, switch):
    """Give each layer the class ``switch`` maps its own to: unfused, or fused again (same object, same state)."""
    for layer in layers:
        layer.__class__ = switch[type(layer)]


def layers_to_unfuse(net):
    """The layers of ``net`` that :func:`unfuse_rnn` would switch: a list (empty when there are none)."""
    return [layer for layer in _layers_of(net, _UNFUSED) if unfused_support(layer) is None]


def unfuse_rnn(net, steps=None, max_lengths=None):
    """Compute every ``gluon.rnn.LSTM``, ``GRU`` and ``RNN`` layer in ``net`` unfused, in place.

    Each layer keeps its parameters, states and settings (a checkpoint loads either way); built graphs are traced again.

    Parameters
    ----------
    net : gluon.Block
    steps : int, optional
        The sequence length, for layers traced inside a larger hybridized
        network. By default each reads its own from the shapes ``net`` is
        called with (see the module docstring).
    max_lengths : int, optional
        Without ``steps``: once ``net`` has been called with more sequence
        lengths than this, its layers go back to the fused kernel
        (:func:`fuse_rnn`, with a warning), since each length traces a graph
        of its own. By default they stay unfused.

    Returns
    -------
    dict
        ``{layer name: 'unfused' or why it stays fused}`` (see :func:`unfused_support`).
    """
    done = {}
    unfused = []
    for layer in _layers_of(net, _UNFUSED):
        why = unfused_support(layer)
        if why is None:
            # The subclass adds behaviour and no state: the layer object (and every reference to it, its
            # parameters, its place in its parent) stays the same; only its methods change.
            _switch([layer], _UNFUSED)
            layer.steps = steps
            unfused.append(layer)
        done[layer.name] = why or "unfused"
    if steps is None and unfused:
        watch = _LengthWatch.on(net)
        watch.layers.update(unfused)
        watch.max_lengths = max_lengths
    rebuild_graphs(net)
    return done


def fuse_rnn(net):
    """Compute the layers of ``net`` that :func:`unfuse_rnn` switched with MXNet's fused kernel again, in place.

    Returns
    -------
    list of str
        The names of the layers switched back.
    """
    switched = _layers_of(net, _FUSED)
    _switch(switched, _FUSED)
    watch = _LengthWatch._watches.pop(net, None)
    if watch is not None:
        watch.stop()
    rebuild_graphs(net)
    return [layer.name for layer in switched]


@contextlib.contextmanager
def fused(net):
    """Inside the block, ``net``'s unfused layers compute with MXNet's fused kernel; after it, unfused again.

    For a symbolic trace that must not be unrolled for one sequence length
    (an export: ``mxfp16.inference.convert.traced`` uses it). The graphs
    ``net`` built for its own calls are left as they are.
    """
    switched = _layers_of(net, _FUSED)
    _switch(switched, _FUSED)
    try:
        yield net
    finally:
        _switch(switched, _UNFUSED)


# Each sequence length read from the shapes a watched network is called with.
_CALLS = threading.local()  # .active: [(watch, {input name: shape})], the watched calls in progress, innermost last


def _input_shapes(args):
    """The shapes of a Gluon call's arguments by the names its trace gives them (``data``, or ``data0``, ``data1`` ...
    in the order of the flattened arguments), or ``None`` when one is not an array (a symbol: a trace of its own)."""
    flat = []

    def walk(value):
        if isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        else:
            flat.append(value)
    walk(args)
    arrays = [a for a in flat if a is not None]
    if not arrays or not all(isinstance(a, ndarray.NDArray) for a in arrays):
        return None
    if len(arrays) == 1:
        return {"data": arrays[0].shape}
    return {f"data{i}": a.shape for i, a in enumerate(arrays)}


def _length_of(symbol, shapes, layout):
    """The sequence length of a traced layer's input ``symbol`` when the network's inputs have ``shapes``, or None."""
    names = set(symbol.list_arguments())
    known = {name: shape for name, shape in shapes.items() if name in names}
    if not known:
        return None
    _, outputs, _ = symbol.infer_shape_partial(**known)
    shape = outputs[0] if outputs else None
    return shape[layout.find("T")] or None if shape and len(shape) == 3 else None


def _traced_length(layer, inputs, layout):
    """``layer``'s sequence length in the watched call being traced (``inputs``: its input symbol), or None."""
    for watch, shapes in reversed(getattr(_CALLS, "active", [])):
        if layer in watch.layers:
            watch.traced[layer] = (inputs, layout)
            return _length_of(inputs, shapes, layout)
    return None


class _LengthWatch:
    """Watches a network's calls for the sequence lengths of its unfused layers (:func:`unfuse_rnn` without ``steps``).

    Before each call it notes the input shapes, for the layers traced in
    that call; when they change, it reads each traced layer's length for the
    new shapes from the layer's input symbol (shape inference, no
    computation) and has the network traced again if one moved.
    """

    _watches = weakref.WeakKeyDictionary()

    def __init__(self):
        self.layers = weakref.WeakSet()
        self.traced = weakref.WeakKeyDictionary()  # layer: (its input symbol, its layout) in the last trace
        self.shapes, self.max_lengths, self.lengths, self.stopped = None, None, set(), False

    @classmethod
    def on(cls, net):
        """``net``'s watch, registered on its first use."""
        watch = cls._watches.get(net)
        if watch is None:
            watch = cls._watches[net] = cls()
            net.register_forward_pre_hook(watch.before)
            net.register_forward_hook(watch.after)
        return watch

    def stop(self):
        """Watch no more. The hooks stay, doing nothing: this may run inside one, while Gluon iterates over them."""
        self.stopped = True
        self.after(None, None, None)

    def before(self, net, args):
        if self.stopped:
            return
        shapes = _input_shapes(args)
        active = [entry for entry in getattr(_CALLS, "active", []) if entry[0] is not self]  # a raised call's, gone
        _CALLS.active = active + [(self, shapes)] if shapes is not None else active
        if shapes is None or shapes == self.shapes:
            return
        self.shapes = shapes
        traced = [(layer, how) for layer, how in self.traced.items() if isinstance(layer, _Unfused)]  # not fused again
        lengths = tuple(_length_of(symbol, shapes, layout) for _, (symbol, layout) in traced)
        self.lengths.update({lengths, tuple(layer.steps for layer, _ in traced)} if traced else ())
        if self.max_lengths is not None and len(self.lengths) > self.max_lengths:
            warnings.warn(f"the recurrent layers of {net.name} go back to MXNet's fused kernel: it was called with "
                          f"{len(self.lengths)} sequence lengths, and unfused layers trace a graph for each "
                          "(mxfp16.amp.unfuse_rnn(net, max_lengths=...))", stacklevel=2)
            fuse_rnn(net)
        elif any(length not in (None, layer.steps) for (layer, _), length in zip(traced, lengths)):
            self.traced.clear()
            rebuild_graphs(net)  # an unrolled graph runs one length only

    def after(self, net, args, out):
        _CALLS.active = [entry for entry in getattr(_CALLS, "active", []) if entry[0] is not self]


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
