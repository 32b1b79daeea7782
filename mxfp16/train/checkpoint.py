"""Checkpoints: parameters, trainer states, loss scaler and position, written atomically.

A checkpoint is three files in ``<out>/checkpoints/``::

    <tag>.params   the network's parameters (``net.save_parameters``)
    <tag>.states   the trainer's states: optimizer, its update count (the LR
                   schedule's position) and, for float16 parameters, the
                   float32 master weights (``trainer.save_states``)
    latest.json    the commit record: which tag is current, the loss-scaler
                   state, the run's progress (position, the epoch's sums,
                   skipped steps; see :mod:`mxfp16.train.progress`) and the
                   run's fingerprint

Each file is written atomically and ``latest.json`` last, so a crash at any
moment leaves the previous checkpoint complete and current. The files of
older tags are removed only after the new record is in place.
"""
import json
from pathlib import Path

from ..fileio import atomic_path, write_json
from .progress import Progress

__all__ = ["CheckpointError", "CheckpointMismatchError", "save_checkpoint", "load_checkpoint",
           "read_record", "params_file", "RECORD", "FINGERPRINT_FIELDS"]

RECORD = "latest.json"
FORMAT_VERSION = 2
#: What must match for a checkpoint to continue a run.
FINGERPRINT_FIELDS = ("model", "precision", "param_dtype", "image_size", "classes", "batch_size",
                      "num_workers", "parameters")


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint belongs to a different model, precision or data layout."""


def describe_mismatch(saved, wanted):
    """Human-readable differences between two fingerprints, ``[]`` when they match."""
    lines = []
    for key in FINGERPRINT_FIELDS:
        a, b = saved.get(key), wanted.get(key)
        if a != b:
            if key == "parameters":
                lines.append("parameters: the network's parameter names or shapes differ")
            else:
                lines.append(f"{key}: checkpoint {a!r}, this run {b!r}")
    return lines


def _folder(out):
    return Path(out) / "checkpoints"


def read_record(out):
    """The current checkpoint record of run folder ``out``, or ``None`` when there is none."""
    path = _folder(out) / RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); the checkpoint cannot be trusted. "
                              "Start a new run with another --out.") from None
    if record.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {record.get('version')!r}, not {FORMAT_VERSION}; "
                              "it was written by another mxfp16 version")
    return record


def params_file(out, epoch=None):
    """The network parameters of a checkpoint of run folder ``out``, for reading them outside the trainer.

    Parameters
    ----------
    out : str or Path
        The run folder.
    epoch : int, optional
        The checkpoint written at the end of this epoch (counted from 1);
        ``None`` for the current one.

    Returns
    -------
    (Path, dict)
        The ``.params`` file (``net.save_parameters`` format) and the current
        record, whose ``fingerprint`` says which model, precision and image
        size wrote it.

    Raises
    ------
    CheckpointError
        No checkpoint, a record that cannot be read, or the file asked for is
        not on disk (the message lists the checkpoints that are).
    """
    folder = _folder(out)
    record = read_record(out)
    if record is None:
        raise CheckpointError(f"{out} has no checkpoint ({folder / RECORD} not found): it is not a run folder, or "
                              "its run stopped before the first epoch ended. Point at a finished run, or train one "
                              f"with `mxfp16 train --out {out}`")
    name = record.get("params_file") if epoch is None else f"{Progress(epoch=epoch).tag()}.params"
    path = folder / str(name)
    if not path.is_file():
        kept = sorted(p.stem for p in folder.glob("*.params")) or ["none"]
        what = "the current checkpoint's parameters" if epoch is None else f"the checkpoint of epoch {epoch}"
        raise CheckpointError(f"{what} ({path}) is not on disk; checkpoints kept in {folder}: {', '.join(kept)}")
    return path, record


def save_checkpoint(out, parts, progress, fingerprint, config_digest=None):
    """Write ``<tag>.params``, ``<tag>.states`` and then ``latest.json``; drop older tags.

    Parameters
    ----------
    out : str or Path
        The run folder.
    parts : mxfp16.parts.Parts
        The network, trainer and loss scaler to save.
    progress : Progress
        Saved whole; its :meth:`~Progress.tag` names the files.
    fingerprint : dict
        What a run must match to continue from this checkpoint.
    config_digest : str, optional

    Returns
    -------
    Path
        The record file.
    """
    folder = _folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    tag = progress.tag()
    with atomic_path(folder / f"{tag}.params") as tmp:
        parts.net.save_parameters(tmp)
    with atomic_path(folder / f"{tag}.states") as tmp:
        parts.trainer.save_states(tmp)
    write_json(folder / RECORD, {
        "version": FORMAT_VERSION, "tag": tag, "params_file": f"{tag}.params", "states_file": f"{tag}.states",
        "fingerprint": fingerprint, "scaler": parts.scaler.state_dict(), "progress": progress.state_dict(),
        "config_digest": config_digest,
    })
    for stale in folder.iterdir():
        if stale.suffix in (".params", ".states") and stale.stem != tag:
            stale.unlink()
    return folder / RECORD


def load_checkpoint(out, parts, fingerprint):
    """Restore the current checkpoint of ``out`` into ``parts``; return the saved progress.

    Parameters
    ----------
    out : str or Path
    parts : mxfp16.parts.Parts
        Built the same way as for the run that wrote the checkpoint.
    fingerprint : dict
        This run's fingerprint; any difference in :data:`FINGERPRINT_FIELDS`
        refuses the checkpoint.

    Returns
    -------
    Progress

    Raises
    ------
    CheckpointError
        No checkpoint in ``out``, or a record that cannot be read.
    CheckpointMismatchError
        The checkpoint's fingerprint differs; the message lists what differs.
    """
    record = read_record(out)
    if record is None:
        raise CheckpointError(f"--resume: no checkpoint in {_folder(out)}; run without --resume to start, "
                              "or point --out at the run to continue")
    differences = describe_mismatch(record.get("fingerprint", {}), fingerprint)
    if differences:
        raise CheckpointMismatchError(
            f"the checkpoint in {_folder(out)} belongs to a different run: " + "; ".join(differences)
            + ". Resume with the flags of that run, or start a new run with another --out.")
    try:
        progress = Progress.from_state_dict(record["progress"])
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"{_folder(out) / RECORD}: {err}; the checkpoint cannot be trusted") from None
    folder = _folder(out)
    parts.net.load_parameters(str(folder / record["params_file"]), ctx=parts.ctx)
    parts.trainer.load_states(str(folder / record["states_file"]))
    parts.scaler.load_state_dict(record["scaler"])
    return progress
