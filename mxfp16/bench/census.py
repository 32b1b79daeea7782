"""The kernel census: which kind of oneDNN kernel a step's time ran in, read from oneDNN's verbose log.

Run with ``DNNL_VERBOSE=1``, the oneDNN 2.4.4 inside MXNet 1.9.1 prints one
line per executed primitive::

    dnnl_verbose,exec,cpu,convolution,jit:avx512_core_amx_bf16,backward_weights,src_bf16::blocked:aBcd16b:f0 ...,
    <attributes>,<auxiliary: alg:convolution_direct>,<problem: mb16_ic64oc64_ih56...>,<milliseconds>

:func:`exec_lines` reads those lines and :func:`classify` files each one's
time under one class of :data:`CLASSES`, first match wins;
docs/benchmarks.md, "The kernel census in every run", says what each means.
A primitive's data type is bfloat16 when any of its memory descriptors is
(``src_bf16`` ...), else float32 when one is.
"""
import collections
import re

__all__ = ["CLASSES", "CLASS_LABELS", "ExecLine", "exec_lines", "classify", "summarise", "format_census",
           "isa_line", "gemm_uses_amx", "reorder_layouts"]

#: The classes, in the order they are reported.
CLASSES = ("amx", "avx512_bf16", "bf16_other", "float32", "reference", "reorder", "other")
#: How the printed census names each class.
CLASS_LABELS = {"amx": "AMX", "avx512_bf16": "avx512_bf16", "bf16_other": "other bf16", "float32": "float32",
                "reference": "reference", "reorder": "reorders", "other": "other"}
#: Classes the printed census names even at 0%: the four that say why bfloat16 is slow or fast.
ALWAYS_SHOWN = ("amx", "avx512_bf16", "float32", "reference")
#: The reorders' share (%) from which the printed census names the largest ones.
REORDERS_SHOWN = 10.0
#: The markers of oneDNN's verbose lines (``onednn_verbose`` from oneDNN 3 on).
MARKERS = ("dnnl_verbose", "onednn_verbose")

#: One executed primitive; ``descriptors`` is the memory-descriptor field as printed (``src_bf16::blocked:...``).
ExecLine = collections.namedtuple("ExecLine", "primitive implementation prop_kind dtype problem ms descriptors",
                                  defaults=("",))


def _dtype(descriptors):
    """``bf16``, ``f32``, another type, or ``?`` from the memory-descriptor field (``src_bf16::blocked:...``)."""
    types = set()
    for md in descriptors.split():
        name = md.split("::", 1)[0]  # src_bf16, diff_dst_f32, ws_u8, bia_undef
        if "_" in name:
            types.add(name.rsplit("_", 1)[1])
    types.discard("undef")
    # bf16 and f32 before u8: a max pooling's workspace is u8 beside its bfloat16 data
    return next((known for known in ("bf16", "f32") if known in types), min(types, default="?"))


def exec_lines(lines):
    """The ``exec`` lines of a oneDNN verbose log, parsed; every other line (``info``, ``create``, output) is skipped.

    Parameters
    ----------
    lines : iterable of str

    Returns
    -------
    list of ExecLine
        ``ms`` is the execution time in milliseconds (the last field), ``dtype`` as the module docstring says.
    """
    found = []
    for line in lines:
        f = line.rstrip("\r\n").split(",")
        if len(f) < 7 or f[0] not in MARKERS or f[1] != "exec":
            continue
        try:
            ms = float(f[-1])
        except ValueError:  # a line cut short by another program's output
            continue
        found.append(ExecLine(f[3], f[4], f[5], _dtype(f[6]), f[-2], ms, f[6]))
    return found


def isa_line(lines):
    """What oneDNN says of this CPU's ISA (``Intel AVX-512 with Intel DL Boost and bfloat16 support``), or ``None``."""
    for line in lines:
        f = line.rstrip("\r\n").split(",", 3)
        if len(f) == 4 and f[0] in MARKERS and f[1] == "info" and f[2] == "cpu" and f[3].startswith("isa:"):
            return f[3][len("isa:"):]
    return None


def gemm_uses_amx(isa):
    """Whether oneDNN's bfloat16 GEMM ran on AMX tiles, from its ISA line (:func:`isa_line`; ``None``: not known).

    oneDNN 2.4.4 builds it from AMX kernels wherever it may use AMX with bfloat16
    (``src/cpu/x64/gemm/gemm_info.cpp``, ``jit_init``), which its ISA line then names.
    """
    return bool(isa) and "AMX with bfloat16" in isa


def classify(line, isa=None):
    """The class of one :class:`ExecLine`: a name of :data:`CLASSES`. ``isa``: the log's :func:`isa_line`."""
    impl = line.implementation
    if line.primitive == "reorder":
        return "reorder"
    # Two names that say nothing of the kernel: the GEMM (x64:gemm:jit, behind Dense layers) and the RNN, which
    # oneDNN 2.4.4 names ref:any however it computes (src/cpu/rnn/ref_rnn.hpp); both multiply in that JIT GEMM.
    if line.primitive == "rnn" or impl.endswith("gemm:jit"):
        return {"bf16": "amx" if gemm_uses_amx(isa) else "bf16_other", "f32": "float32"}.get(line.dtype, "other")
    if {"ref", "any"} & set(re.split("[_:]", impl)):  # ref:any, bnorm_ref:any, ncsp_bnorm:any, simple:any, gemm:ref
        return "reference"
    if "amx" in impl:
        return "amx"
    if line.dtype == "bf16":
        return "avx512_bf16" if "avx512_core_bf16" in impl else "bf16_other"
    return "float32" if line.dtype == "f32" else "other"


def reorder_layouts(descriptors):
    """``bf16 aBcd16b -> f32 abcd``: a reorder's source and destination type and layout, from its descriptors."""
    found = {}
    for md in descriptors.split():
        name, _, rest = md.partition("::")  # src_bf16, blocked:aBcd16b:f0
        role, _, dtype = name.rpartition("_")
        fields = rest.split(":")
        found[role] = f"{dtype} {fields[1] if len(fields) > 1 else rest}"
    return f"{found.get('src', '?')} -> {found.get('dst', '?')}"


def _reorders(execs, steps, total, by_shape, count=8):
    """The ``count`` largest groups of reorders by layouts (and shape, ``by_shape``): what ``reorder`` time moved."""
    groups = collections.defaultdict(lambda: [0, 0.0])
    for line in execs:
        if line.primitive == "reorder":
            layouts = reorder_layouts(line.descriptors)
            entry = groups[(layouts, line.problem) if by_shape else (layouts,)]
            entry[0] += 1
            entry[1] += line.ms / steps
    ranked = sorted(groups.items(), key=lambda item: -item[1][1])[:count]
    return [{"layouts": key[0], **({"shape": key[1]} if by_shape else {}), "calls_per_step": calls / steps,
             "ms_per_step": ms, "percent": 100.0 * ms / total if total else 0.0} for key, (calls, ms) in ranked]


def _pass(prop_kind):
    """A line's pass: its prop_kind (``forward_training``, ``backward_data`` ...), ``none`` where it has none
    (``undef``: reorder, sum, concat), ``forward_scoring`` as its synonym ``forward_inference``."""
    return {"forward_scoring": "forward_inference", "undef": "none", "": "none"}.get(prop_kind, prop_kind)


def _shares(ms_by_class, total):
    return {name: (100.0 * ms_by_class.get(name, 0.0) / total if total else 0.0) for name in CLASSES}


def summarise(lines, steps=1, isa=None):
    """The census of a oneDNN verbose log: time per class, per pass, and the primitives that took most.

    Parameters
    ----------
    lines : iterable of str or of ExecLine
        The log (other lines are skipped), or :func:`exec_lines`'s result.
    steps : int
        How many steps the log covers: times are per step.
    isa : str, optional
        The log's :func:`isa_line`, where ``lines`` do not hold it (a window of a longer log, or ExecLines).

    Returns
    -------
    dict
        ``ms_per_step`` (oneDNN's summed time), ``calls_per_step``, ``percent`` and ``ms_per_step_by_class`` (every
        class of :data:`CLASSES`), ``passes`` (the classes' shares within each pass) and ``top`` (the 8 largest groups
        of primitive, implementation, pass and dtype), ``reorders`` (the 8 largest groups of reorders by source and
        destination type and layout, :func:`reorder_layouts`) and ``reorder_shapes`` (the same by shape too).
    """
    lines = list(lines)
    execs = lines if all(isinstance(x, ExecLine) for x in lines) else exec_lines(lines)
    isa = isa or isa_line(x for x in lines if isinstance(x, str))
    by_class, by_pass, groups = collections.Counter(), {}, {}
    for line in execs:
        kind, ms = classify(line, isa), line.ms / steps
        by_class[kind] += ms
        by_pass.setdefault(_pass(line.prop_kind), collections.Counter())[kind] += ms
        key = (line.primitive, line.implementation, _pass(line.prop_kind), line.dtype, kind)
        calls, total_ms = groups.get(key, (0, 0.0))
        groups[key] = (calls + 1, total_ms + ms)
    total = sum(by_class.values())
    passes = {name: {"ms_per_step": sum(c.values()), "percent_of_total": 100.0 * sum(c.values()) / total,
                     "percent": _shares(c, sum(c.values()))}
              for name, c in sorted(by_pass.items(), key=lambda item: -sum(item[1].values()))} if total else {}
    ranked = sorted(groups.items(), key=lambda item: -item[1][1])[:8]
    return {"ms_per_step": total, "calls_per_step": len(execs) / steps, "steps": steps,
            "ms_per_step_by_class": {name: by_class.get(name, 0.0) for name in CLASSES},
            "percent": _shares(by_class, total), "passes": passes,
            "top": [{"primitive": p, "implementation": i, "pass": ps, "dtype": d, "class": k, "ms_per_step": ms,
                     "calls_per_step": calls / steps, "percent": 100.0 * ms / total if total else 0.0}
                    for (p, i, ps, d, k), (calls, ms) in ranked],
            "reorders": _reorders(execs, steps, total, by_shape=False),
            "reorder_shapes": _reorders(execs, steps, total, by_shape=True)}


def _class_list(percent, always=ALWAYS_SHOWN):
    """``62% AMX, 11% avx512_bf16, 20% float32, 7% reference``: the shown classes and every other above 0."""
    return ", ".join(f"{percent[name]:.0f}% {CLASS_LABELS[name]}" for name in CLASSES
                     if name in always or percent.get(name, 0.0) >= 0.5)


def format_census(name, census):
    """Lines for the terminal: the classes' shares, the three largest passes' own split, the top three primitives and
    the three largest reorders.

    Parameters
    ----------
    name : str
        What the census is of (``amp-bfloat16 batch 16``).
    census : dict
        :func:`summarise`'s result.

    Returns
    -------
    list of str
        ``amp-bfloat16 batch 16 census: 62% AMX, 11% avx512_bf16, 20% float32, 7% reference, 5% reorders
        (12.3 ms of oneDNN time per step)``, then indented lines per pass, for the top primitives, and, where
        reorders took :data:`REORDERS_SHOWN` percent or more, for the largest reorders.
    """
    if not census.get("ms_per_step"):
        return [f"{name} census: no oneDNN primitive ran"]
    lines = [f"{name} census: {_class_list(census['percent'])} "
             f"({census['ms_per_step']:.1f} ms of oneDNN time per step)"]
    for pass_name, entry in list(census["passes"].items())[:3]:
        shown = "no pass (reorder, sum, concat)" if pass_name == "none" else pass_name
        lines.append(f"    {shown} ({entry['percent_of_total']:.0f}%): {_class_list(entry['percent'], ())}")
    if census["top"]:
        lines.append("    top: " + "; ".join(f"{e['primitive']} {e['implementation']} {e['pass']} {e['dtype']} "
                                              f"{e['percent']:.0f}%" for e in census["top"][:3]))
    if census.get("reorders") and census["percent"]["reorder"] >= REORDERS_SHOWN:  # where the reorders' time went
        largest = census["reorders"][:3]
        lines.append("    reorders: " + "; ".join(f"{e['layouts']} {e['percent']:.0f}%" for e in largest))
    return lines
