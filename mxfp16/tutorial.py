"""What the tutorial notebooks share: running an ``mxfp16`` command in its own process, and the recorded results.

AMP patches MXNet for the whole process and cannot be undone, so a notebook
that compares precisions runs each one as a fresh ``mxfp16`` command, exactly
as a user would type it, and reads what it printed and wrote. The spirals data
the float16 notebooks train on is :func:`mxfp16.data.spirals.spirals`.
"""
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from .plumbing.fileio import read_json

__all__ = ["CommandResult", "RecordedRatio", "mxfp16_command", "recorded_headline_ratios", "recorded_result",
           "recorded_results_folder"]


class CommandResult(NamedTuple):
    """What one ``mxfp16`` command printed, and how long it took."""

    stdout: str
    stderr: str
    seconds: float

    def lines(self):
        """The non-blank lines of ``stdout``."""
        return [line for line in self.stdout.splitlines() if line.strip()]

    def __repr__(self):
        # A notebook cell that ends with the call shows this: mxfp16_command already printed the output,
        # so the repr says what is there instead of printing it all a second time.
        return f"CommandResult({len(self.lines())} lines of output, {self.seconds:.1f} s)"


def mxfp16_command(*args, show=None, env=None, echo=True, timeout=3600):
    """Run ``mxfp16 ARGS...`` in a fresh Python process and print what it printed.

    Parameters
    ----------
    *args : str
        The command line after ``mxfp16``, e.g. ``"bench", "--out", folder``.
    show : int or None
        Print only the last ``show`` non-blank lines of its output (all when
        ``None``; ``0`` prints none).
    env : dict or None
        Variables to set for the command, on top of this process's.
    echo : bool
        Print the command line first, as ``$ mxfp16 ...``.
    timeout : float
        Seconds before the command is stopped.

    Returns
    -------
    CommandResult
        Its standard output, standard error and wall time.

    Raises
    ------
    RuntimeError
        When the command exits with an error: the message holds the exit
        status and the end of its standard error, so a notebook cell shows why.
    """
    args = [str(a) for a in args]
    if echo:
        print("$ mxfp16", " ".join(args))
    start = time.monotonic()
    # MXNet 1.9.1 prints numpy deprecation warnings on import; they are not the command's output.
    proc = subprocess.run([sys.executable, "-m", "mxfp16", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})))
    result = CommandResult(proc.stdout, proc.stderr, time.monotonic() - start)
    if proc.returncode != 0:
        raise RuntimeError(f"mxfp16 {' '.join(args[:1])} exited with status {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    lines = result.lines()
    if show is None or show > 0:
        print("\n".join(lines if show is None else lines[-show:]))
    return result


def recorded_results_folder():
    """``docs/results`` of the source checkout this mxfp16 runs from, or ``None``.

    The notebooks print a live figure beside the recorded one it can be
    compared with; an installed wheel carries no recorded results, and then
    the notebooks say so instead of comparing.
    """
    folder = Path(__file__).resolve().parent.parent / "docs" / "results"
    return folder if folder.is_dir() else None


def recorded_result(relative_path):
    """The recorded result ``docs/results/RELATIVE_PATH`` (a JSON file), or ``None`` outside a checkout.

    Parameters
    ----------
    relative_path : str
        For example ``"bench-r50-224-peer/bench.json"``.

    Returns
    -------
    dict or None
    """
    folder = recorded_results_folder()
    if folder is None or not (folder / relative_path).is_file():
        return None
    return read_json(folder / relative_path)


#: docs/benchmarks.md's headline command (ResNet-50 v2, 224 px, batch 16, float32 against ``auto``, three rounds)
#: as recorded on two CPUs: the folder under docs/results, and the CPU as the project records it where the
#: folder's bench.json predates ``machine.cpu`` (the AMD VM reported only the brand string "AMD EPYC").
HEADLINE_RECORDS = (("bench-r50-224-peer",
                     "Zen 5 VM, as the project records it; bfloat16 instructions: avx512_bf16, no AMX"),
                    ("bench-r50-224-intel", None))


class RecordedRatio(NamedTuple):
    """amp-bfloat16 against float32 in one recorded run of the headline benchmark."""

    folder: str          # under docs/results
    speedup: float       # the median of the rounds' own ratios
    rounds: list         # each round's ratio, in the order the rounds ran
    cpu: str             # the recorded machine's CPU, as ``mxfp16 info`` describes it
    load_start: float    # 1-minute load average when the benchmark started


def recorded_headline_ratios():
    """The headline's bfloat16 speedup on every CPU it was recorded on, to print beside a live one.

    Returns
    -------
    list of RecordedRatio
        One per entry of :data:`HEADLINE_RECORDS`; empty outside a source
        checkout (an installed wheel carries no recorded results).
    """
    from .bench.report import round_ratios
    from .machine.hardware import describe_cpu

    found = []
    for folder, recorded_cpu in HEADLINE_RECORDS:
        document = recorded_result(f"{folder}/bench.json")
        if document is None:
            return []
        (entry,) = [e for key, e in round_ratios(document)["speedup"].items()
                    if key.startswith("amp-bfloat16 (mxfp16 lists) vs float32")]
        machine = document["machine"]
        cpu = describe_cpu(machine["cpu"]) if "cpu" in machine else f"{machine['cpu_model']} ({recorded_cpu})"
        found.append(RecordedRatio(folder, entry["speedup"], entry["round_ratios"], cpu,
                                   document["config"]["load_average_start"][0]))
    return found
