"""What a run leaves in ``--out``: config.json, metrics.jsonl, summary.json, per-rank summaries (atomically).

Under a distributed kvstore only rank 0 writes the shared files; every worker writes ``summary.rank<R>.json``.
"""
import hashlib
import json
import tempfile
from functools import partialmethod
from pathlib import Path

import mxnet as mx
import numpy as np

from ..measure.per_layer import LAYERS_FILE
from ..plumbing.fileio import read_json, read_jsonl, write_json
from ..plumbing.output import atomic_write
from .checkpoint import is_checkpoint_file, restore_missing_record

__all__ = ["RunOutputs", "params_digest", "structural_names", "METRIC_FIELDS", "SUMMARY_FIELDS"]

#: Every record of ``metrics.jsonl`` has these (one record per epoch).
METRIC_FIELDS = ("epoch", "train_loss", "train_top1", "val_top1", "val_top5", "images_per_second",
                 "loss_scale", "skipped_steps", "lr", "seconds")
#: ``summary.json`` has these (and a few more).
SUMMARY_FIELDS = ("precision", "model", "epochs", "final_val_top1", "best_val_top1", "images_per_second",
                  "peak_memory_mb", "skipped_steps", "final_loss_scale", "params_digest")


def structural_names(net):
    """``{name without the network's prefix: Parameter}`` sorted by name: the same in every process.

    (Gluon prefixes parameter names with a per-process counter: ``resnetv20_``, ``resnetv21_`` ...)
    """
    prefix = net.prefix
    return dict(sorted((name[len(prefix):] if name.startswith(prefix) else name, p)
                       for name, p in net.collect_params().items()))


def params_digest(net):
    """sha256 (64 hex digits) over the network's parameters as :meth:`Block.save_parameters` names and stores them
    (the same in every process): equal digests mean bit-identical parameters."""
    h = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        net.save_parameters(f"{tmp}/params")
        arrays = mx.nd.load(f"{tmp}/params")
        for name in sorted(arrays):  # name, shape, then the float32 bytes
            value = np.ascontiguousarray(arrays[name].asnumpy().astype(np.float32))
            h.update(name.encode() + str(value.shape).encode() + value.tobytes())
    return h.hexdigest()


class RunOutputs:
    """The files of one run folder, written by rank 0 (and per-rank summaries by every rank)."""

    def __init__(self, out, rank=0, distributed=False):
        self.out = Path(out)
        # tensorboard: the events' default folder (--tensorboard may put them elsewhere)
        self.checkpoints, self.tensorboard = self.out / "checkpoints", self.out / "tensorboard"
        self.join(rank, distributed)

    def join(self, rank, distributed):
        """Set this worker's place in the job, known once the kvstore is open."""
        self.rank, self.distributed, self.is_writer = rank, distributed, rank == 0

    def has_run(self):
        """Whether the folder holds a run: metrics, a summary or a checkpoint record.

        Array files without a record are leftovers of an interrupted write, not a run (:meth:`remove_leftovers`).
        """
        if any((self.out / name).exists() for name in ("metrics.jsonl", "summary.json")):
            return True
        return self.checkpoints.is_dir() and any(p.suffix == ".json" and is_checkpoint_file(p.name)
                                                 for p in self.checkpoints.iterdir())

    def run_files(self):
        """Every file a run writes that is in the folder now (what ``--overwrite`` removes)."""
        names = [self.out / name for name in ("config.json", "metrics.jsonl", "summary.json", LAYERS_FILE)]
        names += sorted(self.out.glob("summary.rank*.json"))
        if self.checkpoints.is_dir():
            names += sorted(p for p in self.checkpoints.iterdir() if is_checkpoint_file(p.name))
        names += sorted(self.tensorboard.glob("events.out.tfevents.*"))
        return [p for p in names if p.is_file()]

    def remove_run(self):
        """Delete a previous run's files, and only those: anything else in the folder stays."""
        for path in self.run_files():
            path.unlink()
        for folder in (self.checkpoints, self.tensorboard):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def remove_leftovers(self):
        """Remove what interrupted writes left (temporary files, checkpoint arrays without their record); list it."""
        restore_missing_record(self.out)  # an intact checkpoint that only latest.json still describes is kept
        removed = []
        for folder in (self.out, self.checkpoints):
            if folder.is_dir():
                removed += [p for p in folder.glob(".*.tmp") if p.is_file()]  # mxfp16.plumbing.output's temporary names
        if self.checkpoints.is_dir():
            recorded = {p.stem for p in self.checkpoints.glob("epoch-*.json")}
            removed += [p for p in self.checkpoints.iterdir()
                        if is_checkpoint_file(p.name) and p.suffix in (".params", ".optimizer")
                        and p.name.split(".")[0] not in recorded]
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def _write_shared(self, name, document):
        """Write the shared JSON file ``name`` (on rank 0 only)."""
        if self.is_writer:
            write_json(self.out / name, document)

    write_config = partialmethod(_write_shared, "config.json")
    write_summary = partialmethod(_write_shared, "summary.json")
    #: ``amp-layers.json``: each layer's dtype and times (:mod:`mxfp16.measure.per_layer`).
    write_amp_layers = partialmethod(_write_shared, LAYERS_FILE)

    def read_config(self):
        """The run's ``config.json``, or ``None``; ``JSONFileError`` when it is not a JSON object."""
        return read_json(self.out / "config.json", "it is not a config.json written by mxfp16 train; restore it, or "
                         "see docs/training.md, \"A run without its config.json\"", default=None)

    def metrics(self):
        return read_jsonl(self.out / "metrics.jsonl")

    def write_metrics(self, records):
        """Write ``metrics.jsonl`` whole (atomically) from the epoch records a checkpoint holds."""
        if not self.is_writer:
            return
        with atomic_write(self.out / "metrics.jsonl") as handle:
            for r in records:
                handle.write(json.dumps(r) + "\n")

    def write_rank_summary(self, summary):
        if self.distributed:
            write_json(self.out / f"summary.rank{self.rank}.json", summary)
