"""Timing a step: untimed warm-up, then timed repeats, every one waited for.

MXNet's engine is asynchronous: a timer that does not wait for it times how
fast Python queues work. :func:`time_steps` waits for the engine before and
after each repeat and reads the steps' outputs once per repeat. The
benchmark, ``auto``'s probe and the per-layer timing all time through it, so
a speed ``auto`` measured is a speed the benchmark would report.
"""
import time
from dataclasses import dataclass

import numpy as np

from .._lazy import module

mx = module("mxnet")

__all__ = ["StepTimes", "time_steps"]


@dataclass(frozen=True)
class StepTimes:
    """Seconds per step of each timed repeat.

    Attributes
    ----------
    wall : tuple of float
        Wall-clock seconds per step, one entry per repeat.
    cpu : tuple of float
        This process's CPU seconds per step (all its threads), one per repeat: less sensitive than wall time to other
        programs on a shared machine.
    latencies : tuple of float
        With ``per_call=True``: the seconds of every single call, each waited for.
    """

    wall: tuple
    cpu: tuple
    latencies: tuple = ()

    @property
    def ms_per_step(self):
        """The median over the repeats, in milliseconds."""
        return 1000.0 * float(np.median(self.wall))

    @property
    def ms_per_step_spread(self):
        """Half the range over the repeats, in milliseconds: the +/- a reader can expect."""
        return 500.0 * (max(self.wall) - min(self.wall))


def _first_values(outputs):
    """One element of each step's output, concatenated: reading it waits for every step that produced one."""
    arrays = [o.as_nd_ndarray() if hasattr(o, "as_nd_ndarray") else o for o in outputs if hasattr(o, "reshape")]
    if arrays:
        mx.nd.concat(*[a.reshape((-1,))[:1].astype("float32") for a in arrays], dim=0).asnumpy()


def time_steps(step, iters=10, repeats=3, warmup=3, per_call=False):
    """Time ``step()``: ``warmup`` calls untimed, then ``repeats`` repeats of ``iters`` calls.

    Parameters
    ----------
    step : callable
        One step; an MXNet array it returns (a loss, an output) is read once per repeat.
    iters, repeats : int
        Calls per timed repeat, and timed repeats.
    warmup : int
        Calls before timing starts: the first builds the graph and oneDNN's primitives, which no later step pays for.
    per_call : bool
        Also time every call on its own, waiting for its answer (inference latency).

    Returns
    -------
    StepTimes
    """
    for _ in range(warmup):
        step()
    mx.nd.waitall()
    wall, cpu, latencies = [], [], []
    for _ in range(repeats):
        mx.nd.waitall()
        start, start_cpu = time.perf_counter(), time.process_time()
        if per_call:
            for _ in range(iters):
                tic = time.perf_counter()
                out = step()
                if hasattr(out, "wait_to_read"):  # a caller waits for its answer: that wait is the latency
                    out.wait_to_read()
                latencies.append(time.perf_counter() - tic)
        else:
            _first_values([step() for _ in range(iters)])
        mx.nd.waitall()
        wall.append((time.perf_counter() - start) / iters)
        cpu.append((time.process_time() - start_cpu) / iters)
    return StepTimes(tuple(wall), tuple(cpu), tuple(latencies))
