"""AMP for numpy-mode networks: the ``mx.np`` / ``mx.npx`` functions get the casts ``amp.init`` gives ``mx.nd``.

MXNet 1.9.1's ``amp.init`` replaces the functions of ``mx.nd`` and ``mx.sym``
only (docs/amp-table.md, "numpy mode"). Like ``amp.init``, this cannot reach
a function a user bound to a name of their own before AMP was activated.
"""
import sys

from .._internals import numpy_operator_functions, operator_aliases
from . import wrappers as w

__all__ = ["NUMPY_PREFIXES", "FFI_FUNCTIONS", "numpy_operators", "numpy_rules", "wrap_numpy_functions",
           "ran_in_target_dtype"]

#: The registered-name prefixes of numpy-mode operators (``mxnet/base.py``).
NUMPY_PREFIXES = ("_np_", "_npx_", "_npi_")

#: The functions that reach an operator through MXNet's C++ function table (``_api_internal``), by their public
#: home: ``{operator: [(module, function)]}``. In MXNet 1.9.1 only ``tensordot`` (and ``zeros``, which takes no tensor).
FFI_FUNCTIONS = {"_npi_tensordot": [("mxnet.ndarray.numpy", "tensordot")]}

#: Counts numpy-mode calls cast to the target dtype (:func:`ran_in_target_dtype`): a numpy-mode network for which
#: it stays 0 ran nothing in 16-bit.
_state = {"target_calls": 0}


def numpy_operators():
    """``{numpy-mode operator: its legacy names}`` (``[]`` for numpy-only ones) for every registered one."""
    aliases = operator_aliases()
    return {name: [n for n in aliases[name] if not n.startswith(NUMPY_PREFIXES)]
            for name in sorted(aliases) if name.startswith(NUMPY_PREFIXES)}


def numpy_rules(lists, target_dtype, widest, joins, fallbacks):
    """What each numpy-mode operator does under AMP: ``{operator: (rule, detail)}``.

    Parameters
    ----------
    lists : dict
        The lists ``amp.init`` got.
    target_dtype : str
    widest : set of str
        MXNet's ``WIDEST_TYPE_CASTS`` for the target.
    joins : set of str
        :func:`mxfp16.amp.lists.join_operators`.
    fallbacks : set of str
        Operators with no working 16-bit path (:func:`mxfp16.amp.lists.float32_fallbacks`).

    Returns
    -------
    dict
        ``rule`` is ``'target'``, ``'conditional'`` (``detail``: ``[(argument, values)]``),
        ``'float32'`` (``detail``: the name warned about, or None), or ``'widest'``.
        Operators that follow their inputs' dtype are left out.
    """
    target = set(lists["target_precision_ops"])
    fp32 = set(lists["fp32_ops"])
    conditional = {}
    for name, arg, values in lists["conditional_fp32_ops"]:
        conditional.setdefault(name, []).append((arg, list(values)))
    rules = {}
    for name, legacy in numpy_operators().items():
        names = legacy or [name]
        if target & set(names):
            rules[name] = ("target", None)
        elif any(n in conditional for n in names):
            rules[name] = ("conditional", [r for n in names for r in conditional.get(n, [])])
        elif fp32 & set(names) or fallbacks & set(names):
            warned = next((n for n in names if n in fallbacks), None)
            rules[name] = ("float32", warned)
        elif (widest | joins) & set(names):
            rules[name] = ("widest", None)
    return rules


def _counting(f):
    def counted(*args, **kwargs):
        _state["target_calls"] += 1
        return f(*args, **kwargs)

    return w.named_like(counted, f, "op")


def _wrapped(f, name, rule, detail, target_dtype, warn):
    if rule == "target":
        return _counting(w.target_call(f, name, target_dtype))
    if rule == "conditional":
        return w.conditional_float32_call(f, name, detail)
    if rule == "widest":
        return w.widest_call(f, name, target_dtype)
    return w.float32_call(f, name, warn if detail else None)


def _bindings(functions):
    """``{id(function): [(module, attribute)]}``: every place under ``mxnet.*`` each function is bound."""
    wanted = {id(f) for f in functions}
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "mxnet" or module_name.startswith("mxnet.")):
            continue
        for attribute, value in list(vars(module).items()):
            if id(value) in wanted:
                found.setdefault(id(value), []).append((module, attribute))
    return found


def wrap_numpy_functions(rules, target_dtype, warn=None, float32_rules=None):
    """Replace each numpy-mode function that has a rule, wherever ``mxnet.*`` binds it.

    Parameters
    ----------
    rules : dict
        :func:`numpy_rules`.
    target_dtype : str
    warn : callable, optional
        ``warn(name)``, called at the first use of a float32 fallback.
    float32_rules : dict, optional
        :func:`mxfp16.amp.lists.float32_rules`, applied to the numpy-mode twins (``_npx_convolution``).

    Returns
    -------
    int
        How many function bindings were replaced.
    """
    import importlib

    float32_rules = float32_rules or {}
    twins = numpy_operators()
    plan = []
    for name, (rule, detail) in rules.items():
        homes = numpy_operator_functions(name)
        homes += [(importlib.import_module(m), a) for m, a in FFI_FUNCTIONS.get(name, [])]
        for module, attribute in homes:
            plan.append((getattr(module, attribute), name, rule, detail))
    bindings = _bindings([f for f, _, _, _ in plan])
    replaced = 0
    for f, name, rule, detail in plan:
        new = _wrapped(f, detail if rule == "float32" and detail else name, rule, detail, target_dtype, warn)
        legacy = next((op for op in twins.get(name, []) if op in float32_rules), None)
        if legacy is not None:
            new = w.float32_where(f, new, float32_rules[legacy], legacy)
        for module, attribute in bindings.get(id(f), []):
            setattr(module, attribute, new)
            replaced += 1
    return replaced


def ran_in_target_dtype():
    """Whether any numpy-mode operator has cast its inputs to the target dtype in this process."""
    return _state["target_calls"] > 0
