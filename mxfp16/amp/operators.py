"""Which dtype each operator runs in under mxfp16's bfloat16 lists, and why: the operator views of the AMP table.

From MXNet's lists, mxfp16's and the verdicts of ``tools/amp_probe_ops.py``,
which ran every operator in float32 and bfloat16 on a CPU with avx512_bf16.
"""
from mxnet.contrib.amp.lists import symbol_bf16

from .lists import float32_fallbacks, follow_input_operators, join_operators, op_verdicts, operator_lists

probe = op_verdicts()

__all__ = ["render"]

_VERDICTS = {"bfloat16": "bfloat16 kernel agrees with float32", "float32": "no working bfloat16 kernel",
             "unprobed": "not run by the probe"}


def _verdict(name):
    """``(verdict, reason)`` from the probe, or None."""
    for verdict in ("bfloat16", "float32", "unprobed"):
        found = getattr(probe, verdict.upper())
        if name in found:
            return verdict, found[name]
    return tuple(probe.MXNET_FLOAT32[name]) if name in probe.MXNET_FLOAT32 else None


def _rule(name):
    """``(what mxfp16 runs it in, why)`` for a legacy or numpy-mode operator under mxfp16's bfloat16 lists."""
    from .numpy_mode import NUMPY_PREFIXES, numpy_operators

    lists = operator_lists("bfloat16")
    names = [name]
    if name.startswith(NUMPY_PREFIXES):
        names = numpy_operators().get(name) or [name]
    conditional = {n: (arg, values) for n, arg, values in lists["conditional_fp32_ops"]}
    fallbacks = set(float32_fallbacks())
    follow = set(follow_input_operators())
    for n in names:
        twin = f" (as {n})" if n != name else ""
        if n in follow:
            return "follows its input", f"mxfp16: it moves (or once scales) values; MXNet's lists keep it float32{twin}"
        if n in lists["target_precision_ops"]:
            return "bfloat16", f"MXNet's bfloat16 list{twin}"
        if n in conditional:
            arg, values = conditional[n]
            return "follows its input", f"float32 when {arg} is {' or '.join(values)}{twin}"
        if n in fallbacks:
            return "float32", f"mxfp16's fallback: no working bfloat16 kernel{twin}"
        if n in symbol_bf16.FP32_FUNCS:
            return "float32", f"MXNet's float32 list{twin}"
        if n in symbol_bf16.WIDEST_TYPE_CASTS:
            return "widest input", f"MXNet's WIDEST_TYPE_CASTS{twin}"
        if n in join_operators("bfloat16"):
            return "widest input", f"mxfp16's join rule{twin}"
        if n in symbol_bf16.BF16_FP32_FUNCS:
            return "follows its input", f"MXNet's either-dtype list{twin}"
    return "follows its input", "on no list; the probe ran it in bfloat16"


def _client_operators():
    """``{operator: clients}``: the contrib operators GluonCV and GluonNLP call, and every fused attention one."""
    import mxnet as mx

    ops = {name: tuple(clients) for name, clients in probe.CLIENT_OPERATORS.items()}
    for name in mx.operator.get_all_registered_operators():
        if name.startswith("_contrib_interleaved_matmul"):
            ops.setdefault(name, ("GluonNLP's fused attention kernels",))
    return dict(sorted(ops.items()))


def _md(text):
    return str(text).replace("|", "/")


def _clients_section():
    lines = ["### Contrib operators GluonCV and GluonNLP call",
             "",
             "| Operator | called by | runs in | why | probe verdict | probe's reason |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, clients in _client_operators().items():
        runs, why = _rule(name)
        verdict, reason = _verdict(name) or ("not probed", "")
        lines.append(f"| `{name}` | {', '.join(clients)} | {runs} | {_md(why)} | {_VERDICTS.get(verdict, verdict)} "
                     f"| {_md(reason)} |")
    return lines


def _joins_section():
    mxnet_widest = sorted(set(symbol_bf16.WIDEST_TYPE_CASTS))
    lines = ["### Joins: operators whose inputs must share one dtype",
             "",
             "Where a float32 input meets a bfloat16 one, a join runs in the widest dtype of its inputs: "
             "float32 when any input is float32 (nothing is rounded that would not be anyway), bfloat16 when "
             "all are bfloat16. MXNet's AMP does this for the operators it lists as `WIDEST_TYPE_CASTS` "
             f"({len(mxnet_widest)} of them, among them `elemwise_add`, `elemwise_mul`, `add_n`, `stack` and "
             "`where`). mxfp16 does it for those below: the probe gave each one input of the other dtype, "
             "and type inference or the bfloat16 kernel failed.",
             "",
             "| Operator | runs in | why it is a join |",
             "| --- | --- | --- |"]
    for name in join_operators("bfloat16"):
        lines.append(f"| `{name}` | widest input | {_md(probe.JOINS[name]['bfloat16'])} |")
    return lines


def _rows(verdict, entries, follow=()):
    """Table rows of ``{operator: reason}``: one per reason, in order of how many operators share it."""
    groups = {}
    for name, reason in entries.items():
        groups.setdefault(_shown(verdict, reason), []).append(name)
    return [f"| {_VERDICTS[verdict]} | {_md(reason)} | "
            + ", ".join(f"`{n}`" + (" *follows*" if n in follow else "") for n in sorted(names)) + " |"
            for reason, names in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))]


def _float32_list_section():
    lines = ["### MXNet's own float32 list, probed",
             "",
             "MXNet keeps these in float32 for range and precision, and so does mxfp16, except the operators "
             "that only move values, which follow their input (marked *follows*). The probe says, for each, "
             "whether a bfloat16 kernel exists and agrees with float32.",
             "",
             "| probe verdict | reason | operators |",
             "| --- | --- | --- |"]
    follow = set(follow_input_operators())
    for verdict in _VERDICTS:
        lines += _rows(verdict, {n: reason for n, (v, reason) in probe.MXNET_FLOAT32.items() if v == verdict}, follow)
    return lines


def _shown(verdict, reason):
    """The reason as the table groups it: a bfloat16 verdict without the input shape it was checked on."""
    if verdict == "bfloat16" and reason.startswith("matches float32"):
        return "matches float32, forward and backward"
    if verdict == "bfloat16":
        return "its integer or boolean output equals float32's"
    return reason


def _followers_section():
    lines = ["### Operators on no list: the probe's verdicts",
             "",
             "Legacy operators MXNet leaves unlisted (or casts to the widest input), and the numpy-mode "
             "operators that are no other name of a legacy one. A numpy-mode operator that is (`_npx_"
             "fully_connected` is `FullyConnected`) takes that operator's rule. Float32 verdicts become "
             "mxfp16's fallbacks (`Float32Fallback` warns once for each).",
             "",
             "| verdict | reason | operators |",
             "| --- | --- | --- |"]
    for verdict in _VERDICTS:
        lines += _rows(verdict, getattr(probe, verdict.upper()))
    return lines


def render():
    """The operator views as Markdown: clients' contrib operators, joins, MXNet's float32 list, the rest."""
    lines = ["## Operators: what each runs in, and why", "",
             f"Generated by `mxfp16 info --amp-table` from MXNet's lists, mxfp16's rules and the probe's "
             f"verdicts (MXNet {probe.MXNET_VERSION}, amp-bfloat16).", ""]
    for section in (_clients_section, _joins_section, _float32_list_section, _followers_section):
        lines += section() + [""]
    return "\n".join(lines)
