"""Checkpoints that load no code, prove their files intact, and survive damage.

A checkpoint is ``<tag>.params``, ``<tag>.optimizer`` (NDArray files, no pickle: unpickling can run any code) and
``<tag>.json``, the record with their sha256, in ``<out>/checkpoints/``; ``latest.json``, a copy of the newest
record written last, is the commit point. The format and its guarantees: docs/training.md, ``checkpoints/`` and
"What a run folder may contain".
"""
import contextlib
import functools
import hashlib
import re
import shutil
import warnings
from pathlib import Path

from .._internals import (
    optimizer_update_counts,
    saved_parameter_shapes,
    set_optimizer_update_counts,
    set_trainer_updater_states,
    trainer_updater_states,
)
from .._lazy import module
from ..plumbing.fileio import JSONFileError, read_json, sha256_file, write_json
from ..plumbing.ndarray_file import NDArrayFileError, check_shapes, read_header
from ..plumbing.output import atomic_path, error_line
from .progress import Progress

mx = module("mxnet")

__all__ = ["CheckpointError", "CheckpointMismatchError", "write_checkpoint", "load_checkpoint", "read_record",
           "describe_mismatch", "is_checkpoint_file", "params_file", "RECORD", "FORMAT_VERSION",
           "FINGERPRINT_FIELDS", "DEFAULT_KEEP", "CHECKPOINT_CHOICES", "copy_params", "check_known_settings"]

RECORD = "latest.json"
FORMAT_VERSION = 4  # 4: the precision set-up's state (MixedPrecision.state_dict), not the scaler's alone
DEFAULT_KEEP = 2
#: Which checkpoint of a run a reader asks for (``mxfp16 export --checkpoint``): these, or a ``.params`` file.
CHECKPOINT_CHOICES = ("last", "best")
#: What must match for a checkpoint to continue a run.
FINGERPRINT_FIELDS = ("model", "precision", "param_dtype", "image_size", "classes", "batch_size",
                      "num_workers", "parameters")
#: Files a checkpoint writes (``.states``: the pickles of mxfp16 before format 3, removed by --overwrite).
_FILE = re.compile(r"^epoch-\d{4}(-batch-\d{5})?\.(params|optimizer|json|states)$")
_MISMATCH = ("does not match the sha256 its checkpoint record lists (truncated or changed since it was written); "
             "export another epoch (--checkpoint) or retrain")
_OLD_FORMAT = ("it was written by an older mxfp16 whose optimizer states are a Python pickle, and loading a "
               "pickle can run any code in it, so this mxfp16 does not load it. Start a new run with another "
               "--out (or --overwrite), or continue it with the mxfp16 version that wrote it")


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected, or one that could not be written."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint belongs to a different model, precision or data layout."""


def describe_mismatch(saved, wanted):
    """Human-readable differences between two fingerprints, ``[]`` when they match."""
    return [("parameters: the network's parameter names or shapes differ" if key == "parameters"
             else f"{key}: checkpoint {saved.get(key)!r}, this run {wanted.get(key)!r}")
            for key in FINGERPRINT_FIELDS if saved.get(key) != wanted.get(key)]


def is_checkpoint_file(name):
    """Whether a file name in ``checkpoints/`` is one a checkpoint writes (``--overwrite`` removes only these)."""
    return name == RECORD or bool(_FILE.match(name))


def _folder(out):
    return Path(out) / "checkpoints"


class _DamagedRecord(CheckpointError):
    """A checkpoint record that cannot be read as one (not JSON, no version or tag): skipped, never fatal."""


def _read_json(path):
    """A checkpoint record, checked as far as telling a damaged one from another format's needs."""
    try:
        record = read_json(path, "the record is damaged; --resume uses the newest intact checkpoint instead")
    except JSONFileError as err:
        raise _DamagedRecord(str(err)) from None
    version = record.get("version")
    if not (isinstance(version, int) and not isinstance(version, bool)) or not isinstance(record.get("tag"), str):
        raise _DamagedRecord(f"{path} lacks a format version or tag: the record is damaged")
    return record


def _read_latest(folder):
    """``latest.json`` of ``folder`` or ``None``; :class:`_DamagedRecord` if unreadable, else of another format."""
    path = folder / RECORD
    if not path.exists():
        return None
    record = _read_json(path)
    if record["version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {record['version']!r}, not {FORMAT_VERSION}: "
                              + (_OLD_FORMAT if record["version"] in (1, 2) else
                                 "it was written by another mxfp16 version"))
    return record


def read_record(out):
    """The current checkpoint record of run folder ``out`` (``latest.json``), or ``None`` when there is none.

    A damaged ``latest.json`` is only a copy: the newest per-checkpoint record stands in, with a warning.

    Raises
    ------
    CheckpointError
        ``latest.json`` of another format version, or damaged with no other record to stand in.
    """
    folder = _folder(out)
    try:
        return _read_latest(folder)
    except _DamagedRecord as err:
        records = [r for r in _records(folder) if r["version"] == FORMAT_VERSION]
        if not records:
            raise CheckpointError(f"{err}; no other checkpoint record in {folder} can stand in for it. Start a new "
                                  "run with another --out (or --overwrite)") from None
        warnings.warn(f"{err}; using the newest checkpoint record, {records[0]['tag']}", stacklevel=2)
        return records[0]


def params_file(out, epoch=None, verify=True):
    """The network parameters of a checkpoint of run folder ``out`` (while it trains, use :func:`copy_params`).

    Parameters
    ----------
    out : str or Path
        The run folder.
    epoch : int, optional
        The checkpoint written at the end of this epoch (counted from 1);
        ``None`` for the current one.
    verify : bool
        Check the file against the sha256 its record lists.

    Returns
    -------
    (Path, dict)
        The ``.params`` file and the current record (its ``fingerprint`` names model, precision, image size).

    Raises
    ------
    CheckpointError
        No checkpoint, an unreadable record, the file is not on disk, or (``verify``) it fails its sha256.
    """
    folder = _folder(out)
    record = read_record(out)
    if record is None:
        raise CheckpointError(f"{out} has no checkpoint ({folder / RECORD} not found): it is not a run folder, or "
                              "its run stopped before the first epoch ended. Point at a finished run, or train one "
                              f"with `mxfp16 train --out {out}`")
    tag = record.get("tag") if epoch is None else Progress(epoch=epoch).tag()
    path = folder / f"{tag}.params"
    if not path.is_file():
        kept = sorted(p.stem for p in folder.glob("*.params")) or ["none"]
        what = "the current checkpoint's parameters" if epoch is None else f"the checkpoint of epoch {epoch}"
        raise CheckpointError(f"{what} ({path}) is not on disk; checkpoints kept in {folder}: {', '.join(kept)}")
    if epoch is not None:
        with contextlib.suppress(CheckpointError):
            record = _read_json(folder / f"{tag}.json")
    digest = record.get("files", {}).get(path.name)
    try:
        if verify and digest is not None and sha256_file(path) != digest:
            raise CheckpointError(f"{path} {_MISMATCH}")
    except FileNotFoundError:
        raise CheckpointError(f"{path} was removed while it was read: its run is still training and pruned it; "
                              "read it with mxfp16.train.checkpoint.copy_params") from None
    return path, record


def copy_params(out, into, epoch=None, attempts=5):
    """Copy a checkpoint's parameters into the folder ``into``, checked against its record; safe while it trains.

    The file is hashed as it is copied: pruning it meanwhile removes only its name; one pruned before it was opened
    is looked up again.

    Parameters
    ----------
    out : str or Path
    into : str or Path
        An existing folder for the copy.
    epoch : int, optional
    attempts : int

    Returns
    -------
    (Path, dict)
        The copy (named as the checkpoint's file) and its record.
    """
    for _ in range(attempts):
        path, record = params_file(out, epoch, verify=False)
        try:
            source = open(path, "rb")
        except FileNotFoundError:
            continue  # pruned since the record was read
        digest, copy = hashlib.sha256(), Path(into) / path.name
        with source, open(copy, "wb") as target:
            for block in iter(functools.partial(source.read, 1 << 20), b""):
                digest.update(block)
                target.write(block)
        wanted = record.get("files", {}).get(path.name)
        if wanted is not None and digest.hexdigest() != wanted:
            raise CheckpointError(f"{path} {_MISMATCH}")
        return copy, record
    raise CheckpointError(f"the run in {out} replaced its checkpoint {attempts} times while it was being read; "
                          "export it when it has finished, or with --keep-checkpoints above 1")


def _flatten(state, key, arrays):
    if state is None:
        return None
    if isinstance(state, mx.nd.NDArray):
        arrays[key] = state
        return {"array": key}
    if isinstance(state, (tuple, list)):
        return {type(state).__name__: [_flatten(s, f"{key}.{i}", arrays) for i, s in enumerate(state)]}
    if isinstance(state, (bool, int, float)):
        return {"value": state}
    raise CheckpointError(f"an optimizer state of type {type(state).__name__} cannot be saved as arrays; "
                          "mxfp16 checkpoints hold arrays and numbers only")


def _unflatten(node, arrays):
    if node is None:
        return None
    if "array" in node:
        return arrays[node["array"]]
    if "value" in node:
        return node["value"]
    kind, items = next(iter(node.items()))
    values = [_unflatten(item, arrays) for item in items]
    return tuple(values) if kind == "tuple" else values


def write_checkpoint(out, parts, progress, fingerprint, config_digest=None, keep=DEFAULT_KEEP):
    """Write a checkpoint of ``progress``'s position and make it current; keep the newest ``keep``.

    Parameters
    ----------
    out : str or Path
    parts : mxfp16.train.parts.Parts
        The network, trainer (``update_on_kvstore=False``) and loss scaler to save.
    progress : Progress
        Saved whole; its :meth:`~Progress.tag` names the files.
    fingerprint : dict
        What a run must match to continue from this checkpoint.
    config_digest : str, optional
    keep : int
        Checkpoints to keep, this one included.

    Returns
    -------
    Path

    Raises
    ------
    CheckpointError
        The files could not be written; the previous checkpoint stays current and complete.
    """
    folder = _folder(out)
    had_previous = (folder / RECORD).exists()
    tag = progress.tag()
    arrays = {}
    structure = {str(i): _flatten(s, f"state.{i}", arrays) for i, s in trainer_updater_states(parts.trainer).items()}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / f"{tag}.params") as tmp:
            parts.net.save_parameters(tmp)
        with atomic_path(folder / f"{tag}.optimizer") as tmp:
            mx.nd.save(tmp, arrays)
        record = {
            "version": FORMAT_VERSION, "tag": tag,
            "files": {name: sha256_file(folder / name) for name in (f"{tag}.params", f"{tag}.optimizer")},
            "optimizer": {"states": structure, "update_counts": optimizer_update_counts(parts.trainer)},
            "fingerprint": fingerprint, "mixed_precision": parts.mixed.state_dict(),
            "progress": progress.state_dict(), "config_digest": config_digest}
        write_json(folder / f"{tag}.json", record)
        write_json(folder / RECORD, record)  # the commit point
    except (OSError, mx.base.MXNetError) as err:
        state = ("The previous checkpoint is kept and current; free some space (or fix the folder's "
                 "permissions) and continue with --resume" if had_previous else
                 "No checkpoint had been written yet, so there is none to resume from; free some space (or "
                 "fix the folder's permissions) and start the run again (with --overwrite if it says the "
                 "folder holds a run)")
        raise CheckpointError(f"could not write checkpoint {tag} in {folder} ({error_line(err)}"
                              f"{_space_note(folder, out)}). {state}") from None
    _prune(folder, keep)
    return folder / RECORD


def _space_note(folder, out):
    """Why a write may have failed: the file-size limit (``ulimit -f``) when one is set, else the free space.

    MXNet reports both as "FileStream.Write incomplete"; under a limit the disk may have plenty of room.
    """
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        limit = None
    if limit is not None and limit != getattr(resource, "RLIM_INFINITY", -1):
        return (f"; this process may not write files larger than {limit / 2 ** 20:.1f} MB (ulimit -f), and a "
                "checkpoint's files can be larger: raise the limit")
    existing = next((p for p in (folder, Path(out)) if p.exists()), None)
    return f"; {shutil.disk_usage(existing).free / 2 ** 20:.0f} MB free on that disk" if existing else ""


def _records(folder):
    """Every readable per-tag record in ``folder``, newest first."""
    found = []
    for path in folder.glob("epoch-*.json"):
        try:
            record = _read_json(path)
            position = (record["progress"]["global_step"], record["progress"]["epoch"])
        except (CheckpointError, KeyError, TypeError):
            continue  # a damaged record is not a checkpoint; load_checkpoint says so when it matters
        if all(isinstance(n, int) for n in position):
            found.append((*position, path.stem, record))
    return [r for *_, r in sorted(found, key=lambda item: item[:3], reverse=True)]


def _prune(folder, keep):
    kept = {r["tag"] for r in _records(folder)[:max(1, keep)]}
    for path in folder.iterdir():
        if _FILE.match(path.name) and path.name.split(".")[0] not in kept:
            path.unlink()


def restore_missing_record(out):
    """Write the current checkpoint's own record from ``latest.json`` when only that copy is left.

    Only when its files match their sha256; then neither the clean-up at start-up nor pruning takes them for
    leftovers. Returns the record's path, or ``None``.
    """
    folder = _folder(out)
    try:
        latest = _read_latest(folder)
    except CheckpointError:  # damaged or of another format: nothing to restore from
        return None
    if not latest or not _FILE.match(f"{latest['tag']}.json"):
        return None
    path = folder / f"{latest['tag']}.json"
    if path.exists() or _problems(folder, latest):
        return None
    write_json(path, latest)
    return path


def _problems(folder, record):
    """Why ``record``'s files cannot be trusted (``[]`` when they can)."""
    problems = []
    for name, digest in record.get("files", {}).items():
        if not (folder / name).exists():
            problems.append(f"{name} is missing")
        elif sha256_file(folder / name) != digest:
            problems.append(f"{name} does not match its sha256 (truncated or changed since it was written)")
    return problems if record.get("files") else problems + ["the record lists no files"]


def load_checkpoint(out, parts, fingerprint):
    """Restore the newest intact checkpoint of ``out`` into ``parts``; return its progress.

    Parameters
    ----------
    out : str or Path
    parts : mxfp16.train.parts.Parts
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
        No checkpoint in ``out``, none intact, or one written by an older mxfp16 (a pickle, never loaded).
    CheckpointMismatchError
        The checkpoint's fingerprint differs; the message lists what differs.
    """
    folder = _folder(out)
    damaged = []
    try:
        latest = _read_latest(folder)
    except _DamagedRecord as err:  # only a copy of the newest record: the records themselves are the checkpoints
        latest = None
        damaged.append(str(err))
    candidates = _records(folder)
    if latest is not None:
        candidates = [latest] + [r for r in candidates if r["tag"] != latest["tag"]]
    old = [p.name for p in folder.glob("*.states")]
    if not candidates:
        if old:
            raise CheckpointError(f"{folder} holds {', '.join(sorted(old))}: " + _OLD_FORMAT)
        if damaged:
            raise CheckpointError(f"no intact checkpoint in {folder}: {' | '.join(damaged)}, and no other checkpoint "
                                  "record is there. Start a new run with another --out (or --overwrite)")
        raise CheckpointError(f"--resume: no checkpoint in {folder}; run without --resume to start, "
                              "or point --out at the run to continue")
    for record in candidates:
        problems = ([f"format version {record.get('version')!r}"] if record.get("version") != FORMAT_VERSION
                    else _problems(folder, record))
        if problems:
            damaged.append(f"{record.get('tag')}: {'; '.join(problems)}")
            continue
        differences = describe_mismatch(record.get("fingerprint", {}), fingerprint)
        if differences:
            raise _mismatch(folder, differences)
        try:
            progress = _restore(folder, record, parts)
        except CheckpointError as err:  # intact files that do not load (written by something else): fall back
            damaged.append(str(err))
            continue
        if damaged:
            warnings.warn(f"checkpoint(s) damaged in {folder} ({' | '.join(damaged)}); resuming from the newest "
                          f"intact one, {record['tag']}", stacklevel=2)
        return progress
    raise CheckpointError(f"no intact checkpoint in {folder}: {' | '.join(damaged)}. Start a new run with "
                          "another --out (or --overwrite)")


def _mismatch(folder, differences):
    return CheckpointMismatchError(f"the checkpoint in {folder} belongs to a different run: " + "; ".join(differences)
                                   + ". Resume with the flags of that run, or start a new run with another --out.")


def check_known_settings(out, settings):
    """Refuse a resume whose settings differ from the newest checkpoint's, before the data is read and ``auto``
    times the network; :func:`load_checkpoint` compares the whole fingerprint later, and handles an unreadable record.

    Parameters
    ----------
    out : str or Path
    settings : dict
        Fingerprint fields (:data:`FINGERPRINT_FIELDS`) and this run's values; ``None`` values are not compared.

    Raises
    ------
    CheckpointMismatchError
    """
    try:
        record = _read_latest(_folder(out))
    except CheckpointError:
        return
    saved = (record or {}).get("fingerprint")
    if not isinstance(saved, dict):
        return
    known = {key: value for key, value in settings.items() if value is not None and key in saved}
    differences = describe_mismatch({key: saved[key] for key in known}, known)
    if differences:
        raise _mismatch(_folder(out), differences)


def _restore(folder, record, parts):
    try:
        # Sizes and shapes first: MXNet allocates what a file declares before reading it.
        read_header(folder / f"{record['tag']}.optimizer")
        check_shapes(folder / f"{record['tag']}.params", saved_parameter_shapes(parts.net))
    except (NDArrayFileError, OSError) as err:
        raise CheckpointError(f"{record.get('tag')}: cannot be restored ({err})") from None
    try:
        progress = Progress.from_state_dict(record["progress"])
        optimizer = record["optimizer"]
        arrays = mx.nd.load(str(folder / f"{record['tag']}.optimizer")) if optimizer["states"] else {}
        states = {int(i): _unflatten(node, arrays) for i, node in optimizer["states"].items()}
        parts.mixed.load_state_dict(record["mixed_precision"])
        parts.net.load_parameters(str(folder / f"{record['tag']}.params"), ctx=parts.ctx)
    except (KeyError, TypeError, ValueError, mx.base.MXNetError) as err:
        raise CheckpointError(f"{record.get('tag')}: cannot be restored ({error_line(err)})") from None
    set_trainer_updater_states(parts.trainer, states)
    set_optimizer_update_counts(parts.trainer, optimizer["update_counts"])
    return progress
