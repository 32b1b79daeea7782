"""Precision per layer, chosen by measurement: the ``measured`` AMP lists.

With ``MixedPrecision("amp-bfloat16", amp_lists="measured")`` (``mxfp16
train --amp-lists measured``) each layer AMP would run in bfloat16 is timed
alone (:func:`mxfp16.measure.layer_timing.time_layers`) and kept in float32
unless it gains by :data:`mxfp16.measure.margin.MARGIN`. docs/amp-table.md,
"Precision per layer, chosen by measurement", tells the details.

:class:`LayerChoice` holds the verdict; its :meth:`~LayerChoice.render` is
the table ``mxfp16 info --amp-table layers`` prints, and the trainer writes
its :meth:`~LayerChoice.record` to ``amp-layers.json`` in the run folder.
The verdict is applied by :func:`mxfp16.amp.lists.keep_float32_measured`.
"""
import os
from dataclasses import asdict, dataclass, replace

from ..plumbing.fileio import cache_folder
from ..plumbing.output import error_line
from .cache import MachineCache, machine_busy
from .layer_timing import LayerSpec, LayerTiming, time_layers
from .margin import MARGIN, pays, requirement, speed_ratio

__all__ = ["LayerRow", "LayerChoice", "network_layers", "choose_layers", "layers_apply", "cache_file", "LAYERS_FILE",
           "MEASURED"]

#: The operators AMP runs in bfloat16 under mxfp16's lists (MXNet's bfloat16 list): the layers timed.
MEASURED = ("Convolution", "FullyConnected")
#: The file the trainer writes the verdict to, in the run folder.
LAYERS_FILE = "amp-layers.json"
_CACHE_VERSION = 1


def cache_file(environ=None):
    """Where layer timings are kept: ``amp-layers.json`` in :func:`mxfp16.plumbing.fileio.cache_folder`."""
    return os.path.join(cache_folder(environ), "amp-layers.json")


@dataclass(frozen=True)
class LayerRow:
    """One layer of the network (a node of its graph) and what it runs in.

    Attributes
    ----------
    name, op : str
    attrs : dict
    weight : str or None
        Its weight parameter's name.
    shapes : tuple
        Its input shapes (``None`` entries where the graph could not tell).
    dtype, why : str
        ``'bfloat16'`` or ``'float32'``: what it runs in under the choice, and why.
    timing : LayerTiming or None
    """

    name: str
    op: str
    attrs: dict
    weight: object
    shapes: tuple
    dtype: str = "bfloat16"
    why: str = "not measured"
    timing: object = None

    @property
    def spec(self):
        """Its :class:`LayerSpec`, or ``None`` when a shape is unknown."""
        return None if any(s is None for s in self.shapes) else LayerSpec.of(self.op, self.attrs, self.shapes)

    def record(self):
        return dict(asdict(self), shapes=[list(s) if s is not None else None for s in self.shapes],
                    ratio=self.timing.ratio if self.timing else None)


@dataclass(frozen=True)
class LayerChoice:
    """The dtype of each layer AMP would run in bfloat16, chosen by measurement or not measured (and why).

    Attributes
    ----------
    rows : tuple of LayerRow
    measured : bool
        Whether times decided (now or from the cache).
    reason : str
        One sentence: what was timed, or why nothing was.
    cached : int
        How many layer shapes' times came from the cache.
    """

    rows: tuple
    measured: bool
    reason: str
    cached: int = 0

    def float32_layers(self):
        """What :func:`mxfp16.amp.lists.keep_float32_measured` takes: the layers measurement keeps float32."""
        return [{"op": r.op, "attrs": r.attrs, "weight": r.weight, "shapes": r.shapes}
                for r in self.rows if r.dtype == "float32" and r.timing is not None]

    def record(self):
        """The choice as plain values (``amp-layers.json``)."""
        return {"measured": self.measured, "reason": self.reason, "margin": MARGIN,
                "layers": [r.record() for r in self.rows]}

    def render(self):
        """The Markdown table ``mxfp16 info --amp-table layers`` prints."""
        lines = [self.reason, "",
                 "| Layer | operator | input shapes | float32 ms | bfloat16 ms | ratio | data casts ms | runs in "
                 "| why |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in self.rows:
            t = r.timing or LayerTiming()
            shapes = " ".join("x".join(str(d) for d in s) if s else "?" for s in r.shapes)
            lines.append(f"| {r.name} | {_describe(r.op, r.attrs)} | {shapes} | {_ms(t.float32_ms)} | "
                         f"{_ms(t.bfloat16_ms)} | {_ms(t.ratio, 'x')} | {_ms(t.casts_ms)} | {r.dtype} | "
                         f"{r.why.replace('|', '/')} |")
        return "\n".join(lines) + "\n"


def _ms(value, unit=""):
    return "" if value is None else f"{value:.2f}{unit}"


def _describe(op, attrs):
    if op == "Convolution":
        groups = attrs.get("num_group", "1")
        return (f"Convolution {attrs.get('kernel', '')} x{attrs.get('num_filter', '?')}"
                + (f" groups {groups}" if groups != "1" else ""))
    if op == "FullyConnected":
        return f"FullyConnected {attrs.get('num_hidden', '?')}"
    return op


def input_shapes(data):
    """The shapes of one device's batch: ``data`` as :func:`mxfp16.train_step` takes it (one entry per device)."""
    first = data[0] if isinstance(data, list) else data
    return [tuple(x.shape) for x in first] if isinstance(first, (list, tuple)) else [tuple(first.shape)]


def network_layers(net, shapes):
    """A row for each layer of ``net`` that AMP would run in bfloat16 under mxfp16's lists, or keeps float32 by rule.

    Parameters
    ----------
    net : gluon.HybridBlock
    shapes : list of tuple
        One per input, batch first.

    Returns
    -------
    list of LayerRow
        Not measured yet: the stem rule's layers say so, the others are bfloat16.
    """
    from ..amp.graph import trace
    from ..amp.lists import float32_rules

    rules = float32_rules("bfloat16", "mxfp16")
    rows = []
    for node in trace(net, shapes):
        if node.op not in MEASURED:
            continue
        row = LayerRow(node.name, node.op, node.attrs, node.call.weight, node.shapes)
        if node.op in rules and rules[node.op](node.call):
            row = replace(row, dtype="float32", why="mxfp16's rule (the 7x7 stem)")
        rows.append(row)
    return rows


def layers_apply(amp_lists, precision=None):
    """Whether the layers are timed: ``amp_lists='measured'`` and AMP in bfloat16 runs, or may (``auto``).

    Parameters
    ----------
    amp_lists : str
    precision : mxfp16.Precision or None
        The precision settled on; ``None`` while ``auto`` is still to be
        timed: its candidate, amp-bfloat16, is measured first, so ``auto``
        then times the network as it would train.
    """
    return amp_lists == "measured" and (precision is None or (precision.amp and precision.compute_dtype == "bfloat16"))


def choose_layers(net, data, ctx=None, timer=None, cache=None, log=print, support=None):
    """Time the layers of ``net`` AMP would run in bfloat16, here, and keep in float32 those that do not gain.

    Parameters
    ----------
    net : gluon.HybridBlock
        Initialised or not (only its graph is read).
    data : list or NDArray
        One batch as :func:`mxfp16.train_step` takes it: the shapes timed.
    ctx : list of mx.Context, optional
        Only CPUs are measured (bfloat16 on a GPU is not what AMP runs there).
    timer : callable, optional
        ``timer([LayerSpec]) -> {spec.key: LayerTiming}``; default :func:`mxfp16.measure.layer_timing.time_layers`.
    cache : str, optional
        The cache file (default :func:`cache_file`).
    log : callable
    support : mxfp16.machine.hardware.BFloat16Support, optional

    Returns
    -------
    LayerChoice
    """
    import mxnet as mx

    from ..machine import hardware

    try:
        rows = network_layers(net, input_shapes(data))
    except (TypeError, ValueError, mx.MXNetError) as err:  # a Block that is not a HybridBlock, a graph that fails
        return LayerChoice((), False, f"not measured: the network's graph could not be read ({error_line(err)}); "
                                      "the lists stay mxfp16's")
    support = support or hardware.bfloat16_support()
    if ctx is not None and any(c.device_type != "cpu" for c in ctx):
        return LayerChoice(tuple(rows), False, "not measured: per-layer measurement is for bfloat16 on CPUs; the "
                                               "lists stay mxfp16's")
    if not support.runs:
        return LayerChoice(tuple(rows), False, f"not measured: bfloat16 cannot run on this CPU ({support.reason}); "
                                               "the lists stay mxfp16's")
    specs = sorted({r.spec for r in rows if r.dtype == "bfloat16" and r.spec is not None}, key=lambda s: s.key)
    store = MachineCache(cache or cache_file(), _CACHE_VERSION, "timings", "spec")
    held = store.read()
    timings = {s.key: _timing(held[store.key(s.key)]) for s in specs
               if _timing(held.get(store.key(s.key))) is not None}
    missing = [s for s in specs if s.key not in timings]
    if missing:
        busy = machine_busy()
        log(f"amp lists measured: timing {len(missing)} layer shape(s) in float32 and bfloat16 in a fresh process; "
            f"the times are kept in {store.path}")
        found = (timer or time_layers)(missing)
        timings.update(found)
        store.keep_unless_busy({store.key(s.key): found[s.key].record() for s in missing if s.key in found}, busy,
                               log=lambda line: log(f"amp lists measured: {line}"))
    rows = _decide(rows, timings)
    kept = sum(1 for r in rows if r.dtype == "float32" and r.timing is not None)
    reason = (f"measured on this CPU: {kept} of {sum(1 for r in rows if r.timing is not None)} layers timed run in "
              f"float32 ({requirement()} to be kept)")
    return LayerChoice(tuple(rows), True, reason, cached=len(specs) - len(missing))


def _timing(record):
    fields = ("float32_ms", "bfloat16_ms", "casts_ms", "failed")
    return LayerTiming(**{k: record.get(k) for k in fields}) if isinstance(record, dict) else None


def _decide(rows, timings):
    """Each measured row's dtype: layers sharing a weight are decided together, on their summed times."""
    groups = {}
    for index, row in enumerate(rows):
        if row.dtype == "bfloat16" and (spec := row.spec) is not None and spec.key in timings:
            groups.setdefault(row.weight or row.name, []).append(index)
    rows = list(rows)
    for members in groups.values():
        times = [timings[rows[i].spec.key] for i in members]
        failed = next((t.failed for t in times if t.failed), None)
        if failed:
            dtype, why = "float32", f"bfloat16 did not run: {failed}"
        else:
            ratio = speed_ratio(sum(t.float32_ms for t in times), sum(t.bfloat16_ms for t in times))
            shared = f" (with {len(members) - 1} other use(s) of its weight)" if len(members) > 1 else ""
            dtype = "bfloat16" if pays(ratio) else "float32"
            why = f"measured: bfloat16 at {ratio or 0:.2f}x float32's speed{shared}"
        for i, t in zip(members, times):
            rows[i] = replace(rows[i], dtype=dtype, why=why, timing=t)
    return rows
