"""The workers of a job agree on their settings before the first step, or all stop, naming what differs.

docs/distributed.md ("The same settings on every worker") says why and what
the fingerprint holds. :func:`agree_settings` sums, over the workers, the
first 64 bits of its digest, one bit per number (one ``pushpull`` of 64
values): the digests are equal when every sum is 0 or the number of workers.
Small integers stay exact whatever the kvstore sums in (it was seen to round
float64 values of 2**37 and more). Only when they differ do the workers
exchange the fingerprints themselves, so that each can name the fields that
differ and every worker's value.
"""
import hashlib
import json

from .._lazy import module

mx = module("mxnet")

__all__ = ["SettingsMismatchError", "settings_fingerprint", "agree_settings", "differences", "PER_WORKER_FIELDS"]

#: Configuration fields that may differ between the workers of one job.
PER_WORKER_FIELDS = ("ctx", "threads", "workers", "progress", "log_every", "data_dir", "data_root", "out",
                     "overwrite", "accept_changed_data")
#: kvstore keys no parameter uses (Gluon numbers parameters from 0; the stop vote is 2**30).
_DIGEST_KEY, _DETAIL_KEY = 2 ** 30 + 1, 2 ** 30 + 2
#: Bits of the digest compared (one number each).
_BITS = 64
#: Bytes each worker's fingerprint may take in the exchange that names the differences.
_DETAIL_BYTES = 16384
_LONGEST_VALUE = 120


class SettingsMismatchError(ValueError):
    """The workers of a job run with different settings; the message names the fields and each worker's value."""


def _short(value):
    text = json.dumps(value, sort_keys=True)
    if len(text) > _LONGEST_VALUE:  # a long list (the classes): its digest stands for it
        return f"<{len(text)} characters, sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}>"
    return text


def settings_fingerprint(run, data_fingerprint):
    """What every worker of ``run``'s job must share, as ``{field: short JSON text}``.

    Parameters
    ----------
    run : mxfp16.train.run.Run
    data_fingerprint : dict
        :meth:`mxfp16.data.Loaders.fingerprint` (the same on every worker that reads the same data).
    """
    settings = {k: v for k, v in run.config.to_dict().items() if k not in PER_WORKER_FIELDS}
    settings.update({f"resolved {k}": v for k, v in run.fingerprint().items()})
    settings.update({"resolved steps_per_epoch": run.steps_per_epoch, "data files": data_fingerprint.get("files"),
                     "data sha256": data_fingerprint.get("sha256")})
    return {k: _short(v) for k, v in sorted(settings.items())}


def differences(fingerprints):
    """``{field: [value of worker 0, value of worker 1, ...]}`` for each field the fingerprints disagree on."""
    fields = sorted(set().union(*fingerprints))
    return {f: [fp.get(f, "(absent)") for fp in fingerprints] for f in fields
            if len({fp.get(f, "(absent)") for fp in fingerprints}) > 1}


def _pushpull_sum(kvstore, key, values, dtype):
    array = mx.nd.array(values, dtype=dtype)
    kvstore.init(key, mx.nd.zeros(array.shape, dtype=dtype))
    kvstore.pushpull(key, array, out=array)
    return array.asnumpy()  # a host sync: once, before the first step


def agree_settings(kvstore, rank, num_workers, fingerprint):
    """Return when every worker's ``fingerprint`` equals this one's; else raise :class:`SettingsMismatchError` on all.

    Every worker of the job must call it at the same point (before its first step).
    """
    digest = int(hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest(), 16)
    bits = [float((digest >> i) & 1) for i in range(_BITS)]
    if all(round(float(s)) in (0, num_workers) for s in _pushpull_sum(kvstore, _DIGEST_KEY, bits, "float32")):
        return
    own = json.dumps(fingerprint, sort_keys=True).encode("utf-8")[:_DETAIL_BYTES]
    slots = [0.0] * (_DETAIL_BYTES * num_workers)
    slots[rank * _DETAIL_BYTES:rank * _DETAIL_BYTES + len(own)] = [float(b) for b in own]
    gathered = _pushpull_sum(kvstore, _DETAIL_KEY, slots, "float32")
    fingerprints = []
    for worker in range(num_workers):
        raw = bytes(int(b) for b in gathered[worker * _DETAIL_BYTES:(worker + 1) * _DETAIL_BYTES]).rstrip(b"\0")
        try:
            fingerprints.append(json.loads(raw.decode("utf-8")))
        except ValueError:
            fingerprints.append({"(fingerprint)": "(too long to exchange)"})
    differ = differences(fingerprints)
    listed = "; ".join(f"{field}: " + ", ".join(f"worker {w} {v}" for w, v in enumerate(values))
                       for field, values in differ.items())
    raise SettingsMismatchError(
        f"the {num_workers} workers of this job run with different settings ({listed or 'their fingerprints differ'}"
        f"). A synchronous job would wait forever for the worker that runs differently; start every worker with the "
        "same flags (`mxfp16 launch ... -- COMMAND` runs one command line on all of them)")
