"""The first processor's fields of ``/proc/cpuinfo``, and its feature flags: what
:mod:`~mxfp16.machine.hardware` and :mod:`~mxfp16.machine.amx` read.

Nothing here imports MXNet or any other part of mxfp16: ``import mxfp16`` reads the flags (for AMX)
before MXNet loads.
"""
CPUINFO = "/proc/cpuinfo"


def cpuinfo_fields(path=None):
    """The first processor's ``key: value`` fields of ``/proc/cpuinfo``, or ``None`` where it cannot be read."""
    fields = {}
    try:
        with open(CPUINFO if path is None else path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    if fields:
                        break  # every processor repeats the same description
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    return fields


def cpu_flags(path=None):
    """The CPU's feature flags (``avx512f``, ``amx_bf16`` ...), or ``None`` where ``/proc/cpuinfo`` cannot be read.

    ``None`` is "unknown", not "none": a caller that needs a set decides what
    an unreadable file means for it.
    """
    fields = cpuinfo_fields(path)
    return None if fields is None else set(fields.get("flags", "").split())
