"""One setting object for a training script: the whole set-up in two statements, so it cannot be left half done.

``auto`` on a CPU with native bfloat16 is decided by timing the network
(:mod:`mxfp16.measure.auto`) on the ``example`` given to
:meth:`~MixedPrecision.prepare`, or else the first batch of
:meth:`~MixedPrecision.train_step`. Until then AMP is off: on a CPU float32
and amp-bfloat16 differ only in AMP, so nothing built before changes. With
``amp_lists="measured"`` the layers are timed the same way first
(:mod:`mxfp16.measure.per_layer`).
"""
import weakref
from dataclasses import replace

from ._internals import rebuild_graphs
from .amp.lists import check_list_set, keep_float32_measured, reads_weight_shapes, shapes_pending
from .casting import cast_batch, cast_net
from .devices import resolve_devices
from .machine.environment import set_float16_environment
from .measure import auto as _auto
from .measure import per_layer as _per_layer
from .measure.probe import NetworkProbe
from .optim import make_trainer
from .precision import Precision, activate, resolve_precision
from .scaler import make_loss_scaler
from .step import eval_step, train_step

__all__ = ["MixedPrecision"]


class MixedPrecision:
    """The run's precision, devices and loss scaler, with AMP active when the precision uses it.

    Create it before the network's first forward pass: a graph traced before AMP stays float32.

    Parameters
    ----------
    precision : str or Precision, default 'auto'
        A name (:data:`mxfp16.PRECISIONS`), resolved against ``ctx``, or an
        already resolved :class:`~mxfp16.Precision`.
    ctx : str, mx.Context or list, default 'auto'
        The devices: ``'auto'`` is every GPU MXNet sees, else the CPU.
    loss_scale : str, float or None
        As for :func:`mxfp16.make_loss_scaler`.
    allow_cpu_float16 : bool
        As for :func:`mxfp16.resolve_precision`.
    amp_lists : str, default 'mxfp16'
        Which operator lists an AMP precision uses (:data:`mxfp16.amp.lists.LIST_SETS`,
        docs/amp-table.md); ``'measured'`` keeps the layers that do not gain here in float32.
    time_auto : bool, default True
        Decide ``auto`` by timing the network where that can change the
        answer (a CPU with native bfloat16). ``False`` keeps the rule.
    log : callable, default print
        Told when ``auto`` times the network and what it chose.
    own_precision : tuple, optional
        ``(name, where)`` or ``(name, where, route)``: the resolved precision
        of the run this one continues, where it was recorded, and the route
        its ``auto`` settled on (:data:`mxfp16.measure.auto.ROUTES`); with
        ``'auto'`` they are taken as they are: the route runs under its lists,
        and :meth:`prepare` applies it to each network.
    **scaler_options
        Passed to :class:`~mxfp16.LossScaler` (``growth_interval`` ...).

    Attributes
    ----------
    precision : Precision
        Its ``reason`` says why. While :attr:`pending`, the rule's answer.
    ctx : list of mx.Context
    scaler : LossScaler
        Shared by every trainer :meth:`prepare` builds.
    verdict : mxfp16.measure.auto.AutoVerdict or None
        For ``auto``: what decided it; ``None`` for a precision asked for by name.
    amp_lists : str
        The list set AMP runs under: the one asked for, or the one ``auto``'s
        route runs under (``'mxfp16+unaligned32'``, :data:`mxfp16.measure.auto.ROUTES`).
    layer_choice : mxfp16.measure.per_layer.LayerChoice or None
        With ``amp_lists='measured'``, once a batch was seen: each layer's dtype and times.
    environment : dict
        What ``set_float16_environment`` set.
    """

    STATE_VERSION = 1

    def __init__(self, precision="auto", ctx="auto", loss_scale=None, allow_cpu_float16=False, amp_lists="mxfp16",
                 time_auto=True, log=print, own_precision=None, **scaler_options):
        check_list_set(amp_lists)
        self.ctx = resolve_devices(ctx)
        self._allow_cpu_float16 = allow_cpu_float16
        # The one place a resumed auto run's precision is decided: taken from its record, never ruled or timed.
        own = self._own_verdict(*own_precision) if precision == "auto" and own_precision else None
        if own is not None:
            self.precision = replace(resolve_precision(own.precision, self.ctx, allow_cpu_float16=allow_cpu_float16),
                                     requested="auto", reason=own.reason)
        else:
            self.precision = precision if isinstance(precision, Precision) else resolve_precision(
                precision, self.ctx, allow_cpu_float16=allow_cpu_float16)
        self.amp_lists, self._log = _auto.route_lists(own.route if own else None, amp_lists), log
        self.environment = set_float16_environment()
        is_auto = self.precision.requested == "auto"
        # A Precision passed in is settled (a resumed run's own); a name "auto" may still be timed.
        self._pending = is_auto and not isinstance(precision, Precision) and own is None and time_auto and \
            _auto.timing_applies(self.ctx)
        self.verdict = own or (_auto.AutoVerdict(self.precision.name, self.precision.reason) if is_auto else None)
        self._nets = weakref.WeakSet()  # what prepare() cast: rebuilt once AMP goes on
        # A list set whose rule reads weight shapes: the networks it judged before their shapes were known, again.
        self._stepped = weakref.WeakSet() if reads_weight_shapes(self.amp_lists) else None
        self.layer_choice = None
        self._layers_pending = _per_layer.layers_apply(self.amp_lists, None if self._pending else self.precision)
        if not self._pending:
            activate(self.precision, self.amp_lists)
        self.scaler = make_loss_scaler(self.precision, loss_scale, **scaler_options)

    @property
    def pending(self):
        """Whether ``auto`` still waits for a network and a batch to time."""
        return self._pending

    @property
    def layers_pending(self):
        """Whether ``amp_lists='measured'`` still waits for a network and a batch to time its layers."""
        return self._layers_pending

    def prepare(self, net, optimizer="sgd", optimizer_params=None, example=None, loss_fn=None, **trainer_options):
        """Cast ``net`` for the precision (BatchNorm stays float32) and return its trainer.

        Parameters
        ----------
        net : gluon.Block
            Initialised, and not yet run under another precision.
        optimizer : str or mx.optimizer.Optimizer
        optimizer_params : dict, optional
        example : tuple, optional
            ``(data, label)``, one batch as :meth:`cast_batch` takes it: for
            ``auto`` (and ``amp_lists='measured'``), time ``net`` now rather
            than at the first :meth:`train_step`.
        loss_fn : callable, optional
            The loss the timed steps use with ``example`` (by default the sum of the outputs).
        **trainer_options
            ``kvstore``, ``update_on_kvstore``, ``compression_params`` (see :func:`mxfp16.make_trainer`).

        Returns
        -------
        gluon.Trainer
        """
        self._nets.add(net)
        route = None if self.pending or self.verdict is None else self.verdict.route
        if route is not None and _auto.ROUTES[route].apply is not None:
            _auto.ROUTES[route].apply(net)  # a resumed run's route, or a net prepared after auto settled
        if self._stepped is not None:
            rebuild_graphs(net)  # Gluon's shape inference cached each weight's symbol without its input channels
        if (self.pending or self.layers_pending) and example is not None:
            data, label = example if isinstance(example, tuple) and len(example) == 2 else (example, None)
            data, label = self.cast_batch(data, label)
            if self.layers_pending:
                self._choose_layers(net, data)
            if self.pending:
                self._decide(net, data, label, loss_fn, None)
        # While auto is pending its candidates share everything but AMP: float32 parameters, this trainer.
        settled = resolve_precision("float32", self.ctx) if self.pending else self.precision
        cast_net(net, settled)
        return make_trainer(net.collect_params(), optimizer, optimizer_params, settled, self.scaler,
                            **trainer_options)

    def cast_batch(self, data, label=None, keep=()):
        """:func:`mxfp16.cast_batch` for this precision and these devices (``keep``: inputs passed as they are)."""
        return cast_batch(data, label, self.precision.data_dtype, self.ctx, keep)

    def train_step(self, net, loss_fn, trainer, data, label=None, **options):
        """:func:`mxfp16.train_step` with this object's scaler (``options``: ``batch_size``, ``clip_grad_norm`` ...).

        With ``amp_lists='mxfp16+unaligned32'`` a network whose
        parameters had no shapes yet is traced again after its first step.
        """
        if self.layers_pending:
            self._choose_layers(net, data)
        if self.pending:
            self._decide(net, data, label, loss_fn, trainer)
        retrace = self._stepped is not None and net not in self._stepped and shapes_pending(net)
        result = train_step(net, loss_fn, trainer, data, label, self.scaler, **options)
        if self._stepped is not None:
            self._stepped.add(net)
        if retrace:
            rebuild_graphs(net)
        return result

    def eval_step(self, net, data):
        """:func:`mxfp16.eval_step`: float32 outputs in inference mode, one per device."""
        return eval_step(net, data)

    def state_dict(self):
        """The precision and the loss scaler's state, as plain values for a checkpoint."""
        return {"version": self.STATE_VERSION, "precision": self.precision.name,
                "requested": self.precision.requested, "reason": self.precision.reason,
                "auto": self.verdict.record() if self.verdict is not None else None,
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state):
        """Continue a run from :meth:`state_dict`: its loss scale, and for a pending ``auto`` its precision."""
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else state
            raise ValueError(f"MixedPrecision state version {found!r} is not {self.STATE_VERSION}: it was not "
                             "written by this mxfp16's state_dict()")
        name = state.get("precision")
        if self.pending and state.get("requested") == "auto":
            self._settle(self._own_verdict(name, state.get("reason"), (state.get("auto") or {}).get("route")))
        elif name != self.precision.name:
            raise ValueError(f"the state is of a run in {name}, but this MixedPrecision is {self.precision.name}: "
                             f"create MixedPrecision({name!r}) to continue that run")
        self.scaler.load_state_dict(state["scaler"])

    @staticmethod
    def _own_verdict(name, where, route=None):
        """``auto``'s verdict for a resumed run: its own precision ``name`` and ``route``, as recorded in ``where``
        (a route this mxfp16 does not know, or one beside another precision, is dropped: the precision stands)."""
        route = route if name == _auto.CANDIDATE and route in _auto.ROUTES else None
        return _auto.AutoVerdict(name, f"the run's own ({where})", route=route)

    def _choose_layers(self, net, data):
        """Time ``net``'s layers (:mod:`mxfp16.measure.per_layer`), keep those that do not gain in float32, retrace."""
        self.layer_choice = _per_layer.choose_layers(net, data, self.ctx, log=self._log)
        self._layers_pending = False
        keep_float32_measured(self.layer_choice.float32_layers())
        for traced in {net, *self._nets}:
            rebuild_graphs(traced)  # traced with every layer in bfloat16: trace again with the choice

    def _decide(self, net, data, label, loss_fn, trainer):
        probe = NetworkProbe(net, data, label, self.ctx, loss_fn, trainer, self.amp_lists)
        self._settle(_auto.decide_auto(self.ctx, probe, log=self._log), net)

    def _settle(self, verdict, timed=None):
        """Adopt ``auto``'s verdict: the precision, AMP switched on for it (and its route applied to the network it
        timed and the prepared ones), the prepared networks' graphs rebuilt."""
        # The prepared networks may have been traced before AMP (a float32 evaluation, say): adopt traces them again.
        routed = verdict.route is not None and timed is not None and timed not in self._nets
        nets = list(self._nets) + ([timed] if routed else [])
        self.precision = _auto.adopt(verdict.precision, self.ctx, self.amp_lists, nets,
                                     allow_cpu_float16=self._allow_cpu_float16, route=verdict.route,
                                     requested="auto", reason=verdict.reason)
        self.amp_lists = _auto.route_lists(verdict.route, self.amp_lists)  # a route may run under other lists
        if self._stepped is None and reads_weight_shapes(self.amp_lists):
            self._stepped = weakref.WeakSet()  # as __init__ would have for these lists: judged again after a step
        self.verdict, self._pending = verdict, False
        self.scaler.settle_precision(self.precision)

    def __repr__(self):
        state = ", pending" if self.pending else ""
        return f"MixedPrecision({self.precision}{state}, ctx={self.ctx}, scaler={self.scaler!r})"
