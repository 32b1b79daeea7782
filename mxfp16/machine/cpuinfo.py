"""The first processor's fields of ``/proc/cpuinfo``: what :mod:`~mxfp16.machine.hardware` and
:mod:`~mxfp16.machine.amx` read.

Nothing here imports MXNet or any other part of mxfp16.
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
