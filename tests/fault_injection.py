"""Faults for the trainer's tests, injected as callbacks; not part of the package.

In-process tests hand these callbacks to :func:`mxfp16.train.train_epoch` or
:func:`mxfp16.train.run.fit`. Runs in a child process (``python -m
mxfp16.train``, the workers of ``mxfp16 launch``) get them through the
trainer's callback variable, which :func:`environment` sets up::

    run_train(..., env=fault_injection.environment(overflow_step=2, interrupt_step=5))

``pause_file=PATH`` holds a run after its first step, its folder locked:
it creates ``PATH.paused`` and waits until ``PATH`` exists, so a test can
start a second command on the same folder while the first one surely runs.
"""
import os
import time

from mxfp16.train.callbacks import CALLBACKS_VARIABLE
from mxfp16.train.loop import Callback

TESTS = os.path.dirname(os.path.abspath(__file__))
OVERFLOW_STEP, OVERFLOW_RANK, INTERRUPT_STEP = ("MXFP16_TEST_OVERFLOW_STEP", "MXFP16_TEST_OVERFLOW_RANK",
                                                "MXFP16_TEST_INTERRUPT_STEP")
PAUSE_FILE = "MXFP16_TEST_PAUSE_FILE"
#: The longest a paused run waits for its test (a test that died leaves no run behind for long).
PAUSE_SECONDS = 300
#: ``overflow_step="every"``: every step overflows.
EVERY = "every"


class _InfiniteLoss:
    """``loss(output, label) * inf``: every gradient overflows, so a loss scaler must skip the step."""

    def __init__(self, loss):
        self.loss = loss

    def __call__(self, output, label):
        return self.loss(output, label) * float("inf")


class InjectOverflow(Callback):
    """Make the loss infinite at one global step (from 1; ``None``: every step), on one worker (``rank``) or all.

    It swaps ``parts.loss`` for the step and puts it back after: the loop
    reads ``parts.loss`` at every step and has no hook for this.
    """

    def __init__(self, parts, step, rank=None, this_rank=0):
        self.parts, self.step = parts, step
        self.active = rank is None or rank == this_rank
        self.original = parts.loss

    def _arm(self, progress):
        due = self.active and (self.step is None or progress.global_step + 1 == self.step)
        self.parts.loss = _InfiniteLoss(self.original) if due else self.original

    def on_epoch_begin(self, progress):
        self._arm(progress)

    def on_step_end(self, progress, result):
        self._arm(progress)

    def on_epoch_end(self, progress):
        self.parts.loss = self.original


class InterruptAtStep(Callback):
    """Behave as if Ctrl-C arrived right after one global step."""

    def __init__(self, step):
        self.step = step

    def stop_requested(self, progress):
        return progress.global_step == self.step


class PauseAfterFirstStep(Callback):
    """Create ``path.paused`` after the first step, then wait until ``path`` exists (at most :data:`PAUSE_SECONDS`)."""

    def __init__(self, path):
        self.path, self.done = path, False

    def on_step_end(self, progress, result):
        if self.done:
            return
        self.done = True
        open(self.path + ".paused", "w").close()
        deadline = time.monotonic() + PAUSE_SECONDS
        while not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.05)


def callbacks(run):
    """The trainer's callback variable points here: the faults the test's variables ask for."""
    hooks = []
    if os.environ.get(OVERFLOW_STEP):
        rank = os.environ.get(OVERFLOW_RANK)
        step = None if os.environ[OVERFLOW_STEP] == EVERY else int(os.environ[OVERFLOW_STEP])
        hooks.append(InjectOverflow(run.parts, step, None if rank is None else int(rank), run.cluster.rank))
    if os.environ.get(INTERRUPT_STEP):
        hooks.append(InterruptAtStep(int(os.environ[INTERRUPT_STEP])))
    if os.environ.get(PAUSE_FILE):
        hooks.append(PauseAfterFirstStep(os.environ[PAUSE_FILE]))
    return hooks


def command_prefix(**faults):
    """``["env", "NAME=value", ...]`` to put before a worker's command line (``mxfp16 launch`` workers)."""
    env = environment(**faults)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env["PYTHONPATH"], os.environ.get("PYTHONPATH")) if p)
    return ["env", *(f"{name}={value}" for name, value in env.items())]


def environment(overflow_step=None, overflow_rank=None, interrupt_step=None, pause_file=None):
    """Variables for a child run: this folder on PYTHONPATH, the callback variable, and the faults."""
    env = {"PYTHONPATH": TESTS, CALLBACKS_VARIABLE: "fault_injection:callbacks"}
    for name, value in ((OVERFLOW_STEP, overflow_step), (OVERFLOW_RANK, overflow_rank),
                        (INTERRUPT_STEP, interrupt_step), (PAUSE_FILE, pause_file)):
        if value is not None:
            env[name] = str(value)
    return env
