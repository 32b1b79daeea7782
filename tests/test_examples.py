"""The real-client examples use only mxfp16's public API, with no wrapper block, and their recorded runs learned.

The scripts need GluonNLP, GluonTS and d2l, which the suite does not install
(examples/real_clients/README.md says why); what can be checked without them
is checked here: what they call, and what they printed when they were run
(docs/results/real-clients/, written by examples/real_clients/record.py).
"""
import ast
import glob
import os
import re

import mxfp16

import pytest
from conftest import REPO

EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "real_clients", "*.py")))
CLIENTS = [p for p in EXAMPLES if not p.endswith("record.py")]
RECORDS = os.path.join(REPO, "docs", "results", "real-clients")


def _tree(path):
    with open(path, encoding="utf-8") as handle:
        return ast.parse(handle.read(), filename=path)


@pytest.mark.parametrize("path", CLIENTS, ids=os.path.basename)
def test_an_example_uses_only_public_names_and_no_wrapper_block(path):
    tree = _tree(path)
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mxfp16"}
    assert used and used <= set(mxfp16.__all__), used - set(mxfp16.__all__)
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in modules if m.startswith("mxfp16")}, "an example imports from inside the package"
    classes = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    assert not classes, f"an example defines {classes}: the client's own model must go in as it is"
    assert "--precision" in ast.unparse(tree)


@pytest.mark.parametrize("path", CLIENTS, ids=os.path.basename)
def test_each_recorded_run_exited_cleanly_and_learned(path):
    script = os.path.basename(path)[:-3]
    records = sorted(glob.glob(os.path.join(RECORDS, f"{script}-*.txt")))
    assert any(r.endswith("-float32.txt") for r in records), f"no float32 record for {script}"
    for record in records:
        with open(record, encoding="utf-8") as handle:
            text = handle.read()
        precision = os.path.basename(record)[len(script) + 1:-4]
        assert f"--precision {precision} (exit 0)" in text and f"precision {precision} " in text
        losses = [float(v) for v in re.findall(r"^step +\d+ [\w -]+ ([-\d.]+)$", text, re.M)]
        assert len(losses) >= 3 and losses[-1] < losses[0], (record, losses)
        held_out = re.search(r"held-out (accuracy|next-sentence accuracy) ([\d.]+)", text)
        if held_out:
            assert float(held_out.group(2)) >= 0.9, record


MINIMAL = os.path.join(REPO, "examples", "train_minimal.py")


def test_the_minimal_script_is_a_page_of_public_api():
    tree = _tree(MINIMAL)
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mxfp16"}
    assert {"MixedPrecision", "PrecisionError"} <= used <= set(mxfp16.__all__)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    with open(MINIMAL, encoding="utf-8") as handle:
        assert len(handle.read().splitlines()) <= 110


def test_the_minimal_script_learns_checkpoints_and_resumes(tmp_path):
    """Three epochs learn the digits; a fourth resumes from the checkpoint, its precision and loss scale."""
    import subprocess
    import sys

    out = tmp_path / "run"

    def run(*args):
        proc = subprocess.run([sys.executable, MINIMAL, "--out", str(out), "--ctx", "cpu", *args],
                              capture_output=True, text=True, timeout=600, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    first = run("--epochs", "3")
    accuracy = [float(m) for m in re.findall(r"test accuracy ([0-9.]+)", first)]
    assert len(accuracy) == 3 and accuracy[-1] > 0.6  # 10 classes: chance is 0.1
    with open(out / "checkpoint.json") as handle:
        record = __import__("json").load(handle)
    assert record["epoch"] == 3 and record["mixed_precision"]["scaler"]["version"] == 1
    second = run("--epochs", "4", "--resume")
    assert "resuming" in second and re.findall(r"^epoch (\d+)", second, re.M) == ["4"]
    assert f"precision {record['mixed_precision']['precision']}" in second
    refused = subprocess.run([sys.executable, MINIMAL, "--precision", "float17", "--out", str(out)],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert refused.returncode == 2 and "unknown precision 'float17'" in refused.stderr
    assert "Traceback" not in refused.stderr
