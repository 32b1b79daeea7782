"""The recorded results the notebooks print beside their live figures (``docs/results`` of a checkout)."""
from pathlib import Path
from typing import NamedTuple

from ..plumbing.fileio import read_json

__all__ = ["RecordedRatio", "recorded_headline_ratios", "recorded_result", "recorded_results_folder",
           "HEADLINE_RECORDS"]


def recorded_results_folder():
    """``docs/results`` of the source checkout this mxfp16 runs from, or ``None`` (an installed wheel has none)."""
    folder = Path(__file__).resolve().parents[2] / "docs" / "results"
    return folder if folder.is_dir() else None


def recorded_result(relative_path):
    """The recorded result ``docs/results/RELATIVE_PATH`` (a JSON file), or ``None`` outside a checkout.

    Parameters
    ----------
    relative_path : str

    Returns
    -------
    dict or None
    """
    folder = recorded_results_folder()
    if folder is None or not (folder / relative_path).is_file():
        return None
    return read_json(folder / relative_path)


#: docs/benchmarks.md's headline command (ResNet-50 v2, 224 px, batch 16, float32 against ``auto``) as recorded
#: on two CPUs: the folder under docs/results, and the CPU where its bench.json predates ``machine.cpu``.
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
        One per entry of :data:`HEADLINE_RECORDS`; empty outside a source checkout.
    """
    from ..bench.report import round_ratios
    from ..machine.hardware import describe_cpu

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
