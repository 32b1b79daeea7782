"""What commands print, when standard output closes or fills up, and under a C locale.

Issue 37's cases: ``mxfp16 info | head -1`` and ``train ... | head -1`` gave
``BrokenPipeError`` (the latter killed the run after epoch 1); ``> /dev/full``
gave ``OSError``; under ``LC_ALL=C PYTHONUTF8=0`` train dropped a valid UTF-8
class as "not UTF-8" and predict failed with ``UnicodeEncodeError``. Each runs
the real command in a child process, the way a shell would.
"""
import io
import json
import os
import subprocess
import sys

from mxfp16.plumbing.console import GuardedStdout

import pytest
from conftest import REPO
from export_support import images, tiny_export
from train_support import QUICK, tiny_dataset

ENV = dict(os.environ, PYTHONPATH=REPO)


def _first_line_then_close(argv, env=ENV, timeout=300):
    """Run ``argv`` with stdout piped, read one line and close the pipe (``| head -1``); (line, code, stderr)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    line = proc.stdout.readline().decode()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return line, proc.wait(timeout=timeout), err


def test_info_piped_into_head_ends_quietly():
    line, code, err = _first_line_then_close([sys.executable, "-m", "mxfp16", "info"])
    assert line and code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_a_training_run_survives_its_output_closing_after_one_line(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "run"
    line, code, err = _first_line_then_close([sys.executable, "-m", "mxfp16.train", "--data-dir", str(data),
                                              "--out", str(out), "--precision", "float32", "--epochs", "2",
                                              "--max-batches", "1", *QUICK])
    assert line.startswith("data: ") and code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert json.loads((out / "summary.json").read_text())["epochs"] == 2  # both epochs, after the pipe closed


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_standard_output_is_one_line_and_an_error():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mxfp16", "info"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, env=ENV, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "mxfp16 info: error: standard output could not be written (No space left on device); what the command "
        "printed from then on was lost (its files, if it writes any, are complete). Send the output to a file on a "
        "disk with space, or to a terminal"]


def test_the_guard_keeps_the_first_failure_and_drops_what_follows():
    class Closing(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    guard = GuardedStdout(Closing())
    assert guard.write("a line\n") == 7 and guard.write("another\n") == 8
    assert guard.outcome(0, "info") == (0, None)  # a closed pipe: quiet, the command's own status
    guard = GuardedStdout(Closing())
    guard.failure = OSError(5, "Input/output error")
    status, line = guard.outcome(0, "train")
    assert status == 2 and "Input/output error" in line


def test_under_a_c_locale_utf8_class_names_train_and_predict(tmp_path):
    data = tiny_dataset(tmp_path)
    for split in ("train", "test"):  # a class whose name is UTF-8 beyond ASCII
        (data / split / "crescent").rename(data / split / "crescent-ünïcödé")
    env = dict(ENV, LC_ALL="C", PYTHONUTF8="0", LANG="C")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mxfp16.train", "--data-dir", str(data), "--out", str(out),
                           "--precision", "float32", "--epochs", "1", "--max-batches", "1", *QUICK],
                          capture_output=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    assert "crescent-ünïcödé" in json.loads((out / "config.json").read_text(encoding="utf-8"))["classes"]
    assert b"not UTF-8" not in proc.stderr and b"Traceback" not in proc.stderr
    photos = tmp_path / "fotos-ünïcödé"
    images(photos, count=2)
    proc = subprocess.run([sys.executable, "-m", "mxfp16", "predict", "--model", str(tiny_export(tmp_path / "exp")),
                           str(photos), "--ctx", "cpu", "--no-progress"], capture_output=True, cwd=REPO, env=env,
                          timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode("utf-8", "replace")
    assert proc.stdout.decode("utf-8").count("fotos-ünïcödé/image-") == 2
