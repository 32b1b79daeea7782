"""The ranges every numeric setting must fall in, so a typo fails at once with its flag named.

docs/getting-started.md ("Limits") lists the bounds and why. A ``NaN`` would
switch a check off silently (``nan < x`` is always false). Each command's
argparse flags take their type from :func:`integer` and :func:`number`, and
the trainer's configuration checks its fields with :func:`check`.
"""
import argparse
import math
import os

__all__ = ["LimitError", "check", "integer", "number", "memory_bytes", "max_batch", "MAX_BATCH", "MAX_IMAGE_SIDE",
           "MAX_COUNT", "MAX_SECONDS", "MAX_STEPS", "is_allocation_failure", "allocation_message"]

#: Images per batch: far beyond any CPU or GPU of today, far below a typo.
MAX_BATCH = 65536
#: Side of a square image in pixels (4096 px: 48 MB per image in float32).
MAX_IMAGE_SIDE = 4096
#: Images, classes, epochs and similar counts.
MAX_COUNT = 10_000_000
#: Timeouts: one week.
MAX_SECONDS = 7 * 24 * 3600.0
#: Iterations and steps a benchmark or diagnosis may ask for.
MAX_STEPS = 1_000_000


class LimitError(ValueError):
    """A setting outside its range; the message names it, the range and the value."""


def memory_bytes():
    """Physical memory of this machine in bytes (a large default where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 40


def max_batch(image_size, memory=None):
    """The largest batch whose float32 input tensor alone takes at most a quarter of the machine's memory."""
    per_image = 3 * 4 * max(1, int(image_size)) ** 2
    return max(1, min(MAX_BATCH, (memory or memory_bytes()) // 4 // per_image))


#: What MXNet (and the C++ runtime under it) says when an allocation fails.
# The last is oneDNN's wording when its own allocation fails (seen under `ulimit -v` with 2 threads busy elsewhere).
_ALLOCATION_FAILURES = ("Failed to allocate", "bad_alloc", "out of memory", "Cannot allocate memory",
                        "could not create a memory object")


def is_allocation_failure(err):
    """Whether ``err`` is a failed allocation: ``MemoryError``, or an ``MXNetError`` saying so."""
    return isinstance(err, MemoryError) or (
        type(err).__name__ == "MXNetError" and any(text in str(err) for text in _ALLOCATION_FAILURES))


def _address_space_limit():
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return None if limit == resource.RLIM_INFINITY else limit


def allocation_message(batch_size=None, image_size=None):
    """One line for an allocation that failed: the flags that shrink memory, and :func:`max_batch`'s estimate.

    Parameters
    ----------
    batch_size, image_size : int, optional
        The command's ``--batch-size`` and ``--image-size`` (those it has).
    """
    memory = memory_bytes()
    limit = _address_space_limit()
    flags = [f"{flag} (now {value})" for flag, value in (("--batch-size", batch_size), ("--image-size", image_size))
             if value] or ["--batch-size", "--image-size"]
    size = image_size or 224
    text = (f"out of memory: an allocation failed. Lower {' or '.join(flags)}: at {size} px at most "
            f"{max_batch(size, min(memory, limit or memory))} images fit in a quarter of the "
            f"{min(memory, limit or memory) / 2 ** 30:.1f} GiB this process may use as float32 input alone, and the "
            "network's activations take many times that")
    if limit is not None and limit < memory:
        text += (f"; this process may address only {limit / 2 ** 30:.1f} GiB (ulimit -v) of the machine's "
                 f"{memory / 2 ** 30:.1f} GiB: raising that limit also helps")
    return text


def check(value, name, low=None, high=None, integer_only=False, allow_none=False):
    """``value`` when it is a finite number in ``[low, high]``; else :class:`LimitError` naming ``name``.

    Parameters
    ----------
    value : int or float or None
    name : str
        How the setting is called where the user set it (``--batch-size``).
    low, high : number, optional
    integer_only : bool
    allow_none : bool
    """
    if value is None and allow_none:
        return value
    kind = "an integer" if integer_only else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer_only and not isinstance(value, int)):
        raise LimitError(f"{name} {value!r}: must be {kind}")
    if not math.isfinite(value):
        raise LimitError(f"{name} {value}: must be a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        raise LimitError(f"{name} {value:g}: must be between {_bound(low)} and {_bound(high)}")
    return value


def _bound(value):
    return "-inf" if value is None else f"{value:g}"


def _parser(name, low, high, integer_only):
    def parse(text):
        try:
            value = int(text) if integer_only else float(text)
        except ValueError:
            kind = "an integer" if integer_only else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        try:
            return check(value, "", low, high, integer_only)
        except LimitError as err:
            raise argparse.ArgumentTypeError(f"{text}: {str(err).split(': ', 1)[1]}") from None
    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def integer(low=1, high=MAX_COUNT):
    """An argparse ``type=`` for an integer in ``[low, high]``."""
    return _parser("integer", low, high, True)


def number(low=None, high=None):
    """An argparse ``type=`` for a finite number in ``[low, high]``."""
    return _parser("number", low, high, False)
