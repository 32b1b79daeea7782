"""Where a run stands: one object the epoch loop advances and the checkpoint saves whole.

Only the checkpoint tag (:meth:`Progress.tag`) and the log count epochs from 1.
"""
from dataclasses import asdict, dataclass, field, fields

__all__ = ["EpochSums", "Progress"]


@dataclass
class EpochSums:
    """Running sums of the epoch in progress (a mid-epoch checkpoint keeps them, so a resumed epoch reports whole).

    Attributes
    ----------
    loss_sum : float
        Sum of batch-mean loss x images, over the steps that updated the parameters.
    correct : float
        Correct top-1 predictions over the same steps.
    images : int
        Images of the steps that updated the parameters.
    seen : int
        Every image fed to the network this epoch (skipped steps too).
    train_seconds : float
        Wall time of the training part of the epoch so far.
    """

    loss_sum: float = 0.0
    correct: float = 0.0
    images: int = 0
    seen: int = 0
    train_seconds: float = 0.0


@dataclass
class Progress:
    """The position of a run and what it has counted so far.

    Attributes
    ----------
    epoch : int
        Epochs finished (= 0-based index of the epoch in progress).
    batch : int
        Batches finished in the epoch in progress.
    global_step : int
        Steps taken since the run began (skipped steps included), counted from 1.
    sums : EpochSums
        The epoch in progress.
    peak_memory_mb : float
        The largest peak memory seen at an epoch's end.
    metrics : list of dict
        One record per finished epoch (``metrics.jsonl`` is written from these).
    """

    epoch: int = 0
    batch: int = 0
    global_step: int = 0
    sums: EpochSums = field(default_factory=EpochSums)
    peak_memory_mb: float = 0.0
    metrics: list = field(default_factory=list)

    def step_taken(self):
        """Count one step of the epoch in progress (its numbers arrive later, with :meth:`add_read`)."""
        self.global_step += 1
        self.batch += 1

    def add_read(self, images, loss, correct, skipped):
        """Add one step's host-read numbers to the epoch's sums; a skipped step adds only its images."""
        self.sums.seen += images
        if skipped:
            return
        self.sums.loss_sum += loss * images
        self.sums.correct += correct
        self.sums.images += images

    def epoch_finished(self, record=None, peak_memory_mb=0.0):
        """Keep the epoch's metrics ``record`` and move to the start of the next epoch with fresh sums."""
        if record is not None:
            self.metrics.append(dict(record))
        self.peak_memory_mb = max(self.peak_memory_mb, peak_memory_mb)
        self.epoch += 1
        self.batch = 0
        self.sums = EpochSums()

    @property
    def epoch_first_step(self):
        """The global number of the epoch in progress's first step."""
        return self.global_step - self.batch + 1

    def tag(self):
        """The checkpoint name of this position: ``epoch-0003`` or ``epoch-0003-batch-00017``."""
        if self.batch:
            return f"epoch-{self.epoch + 1:04d}-batch-{self.batch:05d}"
        return f"epoch-{self.epoch:04d}"

    def state_dict(self):
        """Plain JSON-ready values."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict`; :class:`ValueError` for a missing or malformed field."""
        try:
            # Older records also hold the skipped steps; the loss scaler's state has them.
            sums = EpochSums(**{f.name: state["sums"][f.name] for f in fields(EpochSums)})
            progress = cls(epoch=int(state["epoch"]), batch=int(state["batch"]),
                           global_step=int(state["global_step"]), sums=sums,
                           peak_memory_mb=float(state["peak_memory_mb"]),
                           metrics=[dict(r) for r in state["metrics"]])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"progress record is incomplete or malformed ({type(err).__name__}: {err})") from None
        if min(progress.epoch, progress.batch, progress.global_step) < 0:
            raise ValueError(f"progress record has a negative position: {state!r}")
        return progress
