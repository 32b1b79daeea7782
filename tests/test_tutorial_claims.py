"""The tutorial's prose against its own saved outputs and against the facts the project records.

A notebook asserts what it computes; these tests read what it *says*: the
markdown of every notebook (and the README and docs pages where a claim is
shared) next to the outputs the notebook was saved with, the GPU support table
read from MXNet's wheel, and float16's rounding. Each test names the notebook
and the sentence that went wrong.
"""
import glob
import json
import os
import re

from mxfp16.machine.gpu.coverage import GENERATIONS, UNSUPPORTED, generation_table

import numpy as np
import pytest
from conftest import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "[0-9][0-9]_*.ipynb")))
PAGES = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _cells(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["cells"]


def _markdown(path):
    if path.endswith(".ipynb"):
        return "\n\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _outputs(path):
    """``(cell index, text)`` of every saved text output of a notebook."""
    for index, cell in enumerate(_cells(path)):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) or "".join(output.get("data", {}).get("text/plain", ""))
            if text:
                yield index, text


def _notebook(prefix):
    (path,) = [p for p in NOTEBOOKS if os.path.basename(p).startswith(prefix)]
    return path


def _sentences(text):
    """Sentences and list items, code blocks and HTML comments removed."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    for block in re.split(r"\n\s*\n|\n\s*[*-] |\n\|", text):
        yield from (s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*])", block) if s.strip())


def _name(path):
    return os.path.relpath(path, REPO)


NEGATION = re.compile(r"\b(no|not|cannot|can't|never|none|nothing|unsupported)\b", re.I)


def test_no_page_says_a_gpu_runs_that_the_wheel_has_no_kernels_for():
    """docs/gpu.md's table is read from the wheel; every sentence naming such a GPU must say it cannot run."""
    unsupported = {generation for generation, _ in GENERATIONS
                   if all(cov.status == UNSUPPORTED for g, cov in generation_table() if g == generation)}
    assert {"Hopper", "Blackwell"} <= unsupported
    wrong = []
    for path in NOTEBOOKS + PAGES:
        for sentence in _sentences(_markdown(path)):
            named = [g for g in unsupported if re.search(rf"\b{g}\b", sentence)]
            claims_to_run = re.search(r"\b(work|works|run|runs|supports?|supported)\b", sentence, re.I)
            if named and ((claims_to_run and not NEGATION.search(sentence))
                          or re.search(r"\bexpect\b[^.]*\bto work\b", sentence)):
                wrong.append(f"{_name(path)}: {sentence[:200]!r} names {named} without saying it cannot run")
    assert not wrong, "\n".join(wrong)


def test_the_benchmarking_notebook_prints_the_wheels_gpu_table_as_docs_gpu_md_has_it():
    with open(os.path.join(REPO, "docs", "gpu.md"), encoding="utf-8") as handle:
        rows = re.findall(r"^\| ([A-Za-z ]+) \| (\d+\.\d+) \| ([^|]+) \|", handle.read(), re.M)
    runs = {}
    for generation, _, status in rows:
        runs.setdefault(generation, []).append(status.strip() != "**no**")
    printed = dict(re.findall(r"^(\w+)\s+(runs|does not run) mxnet-cu112 1\.9\.1$",
                              "\n".join(text for _, text in _outputs(_notebook("06_"))), re.M))
    assert set(printed) >= {"Volta", "Ampere", "Hopper"}, printed
    for generation, verdict in printed.items():
        assert all(runs[generation]) == (verdict == "runs"), (generation, verdict, runs[generation])


LAYER_WORDS = {"Conv2D": "convolution", "Dense": "dense", "BatchNorm": "BatchNorm", "Activation": "activation",
               "GlobalAvgPool2D": "pooling"}


def test_the_amp_notebook_names_every_layer_its_output_shows_running_in_bfloat16():
    path = _notebook("04_")
    lines = [m.group(1) for _, text in _outputs(path) for m in re.finditer(r"^ran in bfloat16: (.+)$", text, re.M)]
    assert lines, "notebook 4 saved no 'ran in bfloat16:' line"
    layers = [name.strip() for name in lines[0].split(",")]
    assert {"Conv2D", "BatchNorm", "Dense"} <= set(layers)
    text = _markdown(path)
    (row,) = [line for line in text.splitlines() if line.startswith("| which operators run in 16 bits")]
    amp_column = row.split("|")[3]
    summary = text[text.index("## Summary"):]
    (bullet,) = [b for b in summary.split("\n* ") if b.startswith("AMP keeps")]
    for layer in layers:
        word = LAYER_WORDS[layer]
        assert word.lower() in amp_column.lower(), f"the AMP column of the table does not name {word}: {amp_column}"
        assert word.lower() in bullet.lower(), f"the summary does not name {word}: {bullet}"


def test_no_page_says_master_weights_halve_weight_memory():
    (ratio,) = [float(m.group(1)) for _, text in _outputs(_notebook("02_"))
                for m in re.finditer(r"weights with their master copies: ([\d.]+)x float32's", text)]
    assert ratio > 1.0      # the float32 copy outweighs what float16 saves on the weights themselves
    wrong = [f"{_name(path)}: {s[:200]!r}" for path in NOTEBOOKS + PAGES for s in _sentences(_markdown(path))
             if re.search(r"weights?\b.*\bhalve[sd]?\b|\bhalve[sd]?\b.*\bweights?\b", s, re.I)
             and re.search(r"memory|bytes", s, re.I) and not NEGATION.search(s)
             and not re.search(r"master|float32 cop", s, re.I)]   # says what comes on top
    assert not wrong, "\n".join(wrong)


def test_no_page_says_everything_below_the_smallest_subnormal_flushes_to_zero():
    """float16 rounds to nearest: values between 2**-25 and 2**-24 become 2**-24 (notebook 1 shows it)."""
    saved = "\n".join(text for _, text in _outputs(_notebook("01_")))
    assert re.search(r"^4\.470e-08 -> 5\.960e-08$", saved, re.M)     # 1.5 * 2**-25 -> 2**-24
    wrong = []
    for path in NOTEBOOKS + PAGES:
        for sentence in _sentences(_markdown(path)):
            if (re.search(r"2(\*\*|\^)-24", sentence) and re.search(r"flush|to zero|becomes? 0\b", sentence, re.I)
                    and not re.search(r"2(\*\*|\^)-25|round|half", sentence)):
                wrong.append(f"{_name(path)}: {sentence[:200]!r}")
    assert not wrong, "\n".join(wrong)


def _rounded_power_of_two(value):
    """A whole power of two (a loss scale: 2**10 to 2**53) that ``%g`` rounded to six digits."""
    exponent = np.round(np.log2(abs(value)))
    return 10 <= exponent <= 53 and value != 2.0 ** exponent and abs(value / 2.0 ** exponent - 1) < 1e-5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p)[:2] for p in NOTEBOOKS])
def test_saved_outputs_print_powers_of_two_exactly(path):
    """``%g`` prints 2**24 as 1.67772e+07: not the number, and not visibly a power of two."""
    wrong = [f"cell {i}: {m.group(0)}" for i, text in _outputs(path)
             for m in re.finditer(r"(?<![\w.])\d\.\d{4,5}e[+-]\d\d\b", text)
             if _rounded_power_of_two(float(m.group(0)))]
    assert not wrong, f"{os.path.basename(path)} prints a power of two rounded: {wrong}"


NUMBER = re.compile(r"[+-]?[\d.,]*\d[x%]?")


def _is_row(line):
    """A line of a printed table: six or more columns, most of them numbers."""
    cells = line.split()
    return len(cells) >= 6 and sum(bool(NUMBER.fullmatch(c)) for c in cells) >= len(cells) / 2


def _is_header(line):
    cells = line.split()
    return len(cells) >= 3 and not any(NUMBER.fullmatch(c) for c in cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p)[:2] for p in NOTEBOOKS])
def test_saved_tables_keep_their_header(path):
    """A printed table starts with its header (showing the tail of a command's output must not cut it off)."""
    wrong = []
    for index, text in _outputs(path):
        lines = [line for line in text.splitlines() if line.strip()]
        for n, line in enumerate(lines):
            first_row = (_is_row(line) and n + 1 < len(lines) and _is_row(lines[n + 1])
                         and not (n and _is_row(lines[n - 1])))
            if re.fullmatch(r"-{20,}", line.strip()) or first_row:
                above = lines[max(0, n - 2):n]
                if not any(_is_header(l) for l in above):
                    wrong.append(f"cell {index}: {line[:100]!r} has no header above it")
    assert not wrong, f"{os.path.basename(path)}: " + "; ".join(wrong)


SPREAD_SECTION = "../docs/benchmarks.md#how-far-one-invocations-ratio-moves"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p)[:2] for p in NOTEBOOKS])
def test_a_live_speed_ratio_beside_a_recorded_one_is_explained(path):
    """Where a cell prints a recorded speed ratio beside the live one, the next text cell says why they differ."""
    cells = _cells(path)
    pairs = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
             and re.search(r"\brecorded\b", "".join(c["source"])) and "speedup" in "".join(c["source"])]
    for index in pairs:
        # The explanation may come just before the cell (what to expect) or just after it (what it showed).
        near = [c for c in cells[max(0, index - 2):index] + cells[index + 1:index + 4] if c["cell_type"] == "markdown"]
        explained = [c for c in near if all(re.search(p, "".join(c["source"]))
                                            for p in (r"recorded", r"\bload\b", r"\bCPU\b|machine"))]
        assert explained, f"{os.path.basename(path)} cell {index}: no text beside the live-vs-recorded cell says " \
            "why the figures differ (the spread, the load, the CPU)"
        assert any(SPREAD_SECTION in "".join(c["source"]) for c in explained), \
            f"{os.path.basename(path)} cell {index}: the text beside it does not link {SPREAD_SECTION}"
