"""Measurements kept between runs: one JSON file per kind, its records keyed by the machine and what was measured.

``auto``'s verdicts (:mod:`mxfp16.measure.auto`) and the per-layer timings
(:mod:`mxfp16.measure.per_layer`) are measured once per machine and kept
through :class:`MachineCache`. A file that is damaged, of another version or
missing reads as empty: what it held is measured again and the file
rewritten whole, never patched.
"""
import hashlib
import json
import os

from ..plumbing.fileio import JSONFileError, read_json, write_json

__all__ = ["MachineCache", "machine_key", "machine_busy", "amp_digest"]


def amp_digest(folder=None):
    """A digest of the sources of :mod:`mxfp16.amp` (default ``folder``): its operator lists and routes.

    A verdict or a layer's time measured under other lists or routes (an upgrade that moves an operator to float32,
    a new route) is stale, though the version number may not have moved: the sources themselves are the key.
    """
    folder = folder or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "amp")
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith((".py", ".json")):
            with open(os.path.join(folder, name), "rb") as handle:
                digest.update(name.encode() + b"\0" + handle.read())
    return digest.hexdigest()[:16]


def machine_key():
    """What a measurement depends on besides what it measures: the CPU, how oneDNN may use it, software, threads."""
    import mxnet as mx

    from .._version import __version__
    from ..machine import amx, hardware
    from ..machine.environment import mxnet_threads

    cpu = hardware.cpu_identity()
    return {"cpu": [cpu.get(k) for k in ("vendor", "model_name", "family", "model", "stepping")]
            + [sorted(cpu.get("bfloat16_instructions") or [])],
            "amx": amx.status().state, "isa": amx.status().isa,
            "mxnet": mx.__version__, "mxfp16": __version__, "amp_sources": amp_digest(), "threads": mxnet_threads()}


def machine_busy():
    """A description of the load when the machine is busy (one-minute load average >= its cores), else ``None``."""
    from ..machine.environment import available_cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = available_cores()
    return f"1-minute load average {load:.1f} on {cores} core(s)" if load >= cores else None


class MachineCache:
    """A JSON file ``{"version": N, section: {key: record}}`` of measurements of this machine: each key names the
    machine and what was measured.

    Parameters
    ----------
    path : str
    version : int
        A file of another version reads as empty (its records' meaning changed).
    section : str
        The name of the dictionary of records (``'verdicts'``).
    kind : str
        What a key's second entry is called (``'probe'``, ``'spec'``).
    """

    def __init__(self, path, version, section, kind):
        self.path, self.version, self.section = path, version, section
        self.kind, self._machine = kind, None

    def read(self):
        """``{key: record}``; empty for a missing, damaged or other-version file."""
        try:
            doc = read_json(self.path, default={})
        except JSONFileError:
            return {}
        ok = isinstance(doc, dict) and doc.get("version") == self.version and isinstance(doc.get(self.section), dict)
        return doc[self.section] if ok else {}

    def keep(self, records, log=print):
        """Add ``records`` (``{key: record}``) to what the file holds now (another process may have added some). An
        unwritable cache costs a measurement next time, nothing more: it is told to ``log`` and otherwise ignored."""
        held = self.read()
        held.update(records)
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            write_json(self.path, {"version": self.version, self.section: held})
        except OSError as err:
            log(f"could not keep the measurement in {self.path} ({err.strerror or err}); it is measured again "
                "next time")

    def key(self, what):
        """The record's key for ``what`` (plain values) on this machine (:func:`machine_key`, read once)."""
        if self._machine is None:
            self._machine = machine_key()
        return json.dumps({"machine": self._machine, self.kind: what}, sort_keys=True)

    def keep_unless_busy(self, records, busy, log):
        """Keep ``records`` unless ``busy`` (:func:`machine_busy`, read before the measurement) says the machine was
        busy: times taken under load say little about the next run, so they are used once, and ``log`` is told so."""
        if busy:
            log(f"the CPU was busy when the measurement started ({busy}); it is used once and not kept")
            return
        self.keep(records, log=log)
