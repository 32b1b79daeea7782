"""Workers say they are making progress; ``mxfp16 launch`` stops a job whose workers all stopped saying it.

A synchronous job hangs as a whole, and the launcher cannot tell a slow step from a stalled one by looking at the
processes, so the workers tell it: ``launch`` names a folder in :data:`VARIABLE`, and each worker's trainer rewrites
``worker-<rank>`` there after its steps and evaluation batches (at most once a second, with what it last did).
:class:`Watch` reads the files' times; docs/distributed.md ("stalled") gives the rule it applies. Local jobs only:
over ssh the workers' files are on other machines.
"""
import contextlib
import os
import time
from pathlib import Path

__all__ = ["VARIABLE", "beat", "beating", "Watch", "DEFAULT_STALL"]

#: The folder the launcher watches, handed to every process of the job.
VARIABLE = "MXFP16_LAUNCH_HEARTBEAT"
#: Seconds without progress from any worker after which ``mxfp16 launch`` stops the job.
DEFAULT_STALL = 600.0
_EVERY = 1.0
_last = {"time": 0.0}


def beat(rank, what):
    """Record that worker ``rank`` is making progress (``what``: e.g. ``'step 120'``), at most once a second.

    Does nothing outside a job started by ``mxfp16 launch``.
    """
    folder = os.environ.get(VARIABLE)
    now = time.monotonic()
    if not folder or now - _last["time"] < _EVERY:
        return
    _last["time"] = now
    with contextlib.suppress(OSError):  # the launcher's folder is gone: the job is ending anyway
        Path(folder, f"worker-{rank}").write_text(f"{what}\n", encoding="utf-8")


def beating(iterable, rank, what="evaluation batch {}"):
    """Yield ``iterable``'s items, beating after each (an evaluation loop, which runs no training step)."""
    for number, item in enumerate(iterable, 1):
        yield item
        beat(rank, what.format(number))


class Watch:
    """The launcher's side: have all workers stopped making progress for ``stall`` seconds?

    Parameters
    ----------
    folder : str or Path
        The folder handed to the workers in :data:`VARIABLE`.
    workers : int
    stall : float
        Seconds; 0 or ``None`` never stalls.
    """

    def __init__(self, folder, workers, stall=DEFAULT_STALL):
        self.folder, self.workers, self.stall = Path(folder), int(workers), float(stall or 0)

    def _beats(self):
        found = {}
        for path in self.folder.glob("worker-*"):
            try:
                found[path.name] = (path.stat().st_mtime, path.read_text(encoding="utf-8").strip())
            except OSError:
                continue
        return found

    def latest(self):
        """The wall-clock time of the newest beat of any worker, ``None`` before the first."""
        return max((mtime for mtime, _ in self._beats().values()), default=None)

    def stalled(self, now=None):
        """``None`` while the job makes progress (or has not started beating); else the reason to stop it."""
        if not self.stall:
            return None
        beats = self._beats()
        if len(beats) < self.workers:
            return None  # a worker is still starting (or this command never beats)
        now = time.time() if now is None else now
        latest = max(mtime for mtime, _ in beats.values())
        if now - latest < self.stall:
            return None
        last = "; ".join(f"{name.replace('-', ' ')} at {what} ({now - mtime:.0f} s ago)"
                         for name, (mtime, what) in sorted(beats.items()))
        return (f"no worker made progress for {self.stall:g} s (--stall-timeout): a synchronous job waits at each step "
                f"for every worker, so one that stopped holds all of them. Last seen: {last}. Stopping every process")
