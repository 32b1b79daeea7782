"""Two commands on one output at once, the overlap forced rather than timed; not part of the package.

:func:`race` runs the first command in a thread and holds it inside its
publishing step (:meth:`mxfp16.plumbing.output.Output.publish`, or
``publish_files`` for a pack): its work is done and the output's lock is
held. The second command runs meanwhile, in the test's own thread, and
then the first goes on. ``flock`` locks of two open files conflict within
one process too, so this is the same contest as two processes, in order.
"""
import threading

from mxfp16.plumbing.output import Output

#: The longest a step of the race may take (a first command that never reaches publish fails the test).
SECONDS = 600


def race(monkeypatch, first, second, step="publish"):
    """Run ``first()`` until it publishes, ``second()`` meanwhile, then let ``first`` finish.

    Parameters
    ----------
    first, second : callable
        Each runs one command; what it returns (or raises) is its outcome.
    step : str
        The :class:`~mxfp16.plumbing.output.Output` method the first is held in.

    Returns
    -------
    (object, object)
        The two outcomes: a return value, or the exception raised.
    """
    real = getattr(Output, step)
    inside, go, held = threading.Event(), threading.Event(), []

    def holding(self, *args, **kwargs):
        if not held:  # the first caller waits; any later one (a second command that got through) goes on
            held.append(self.path)
            inside.set()
            go.wait(SECONDS)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Output, step, holding)
    outcomes = {}

    def run_first():
        try:
            outcomes["first"] = first()
        except BaseException as err:  # the outcome is what the test checks
            outcomes["first"] = err
        finally:
            inside.set()  # a first command that failed before publishing must not leave the test waiting

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert inside.wait(SECONDS), "the first command never reached its publishing step"
        try:
            outcomes["second"] = second()
        except BaseException as err:  # as for the first
            outcomes["second"] = err
    finally:
        go.set()
        thread.join(SECONDS)
    assert held, f"the first command ended before publishing: {outcomes.get('first')!r}"
    return outcomes["first"], outcomes["second"]
