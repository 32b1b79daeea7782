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


# ---- issue 42, case 12: every command with standard output closed (`>&-`) ------------------------------
#: Each command once, small enough for seconds, in the order that gives each its input (data, a run, an export).
#: ``{D}`` and the like are folders made in the child's work folder.
CLOSED_STDOUT_COMMANDS = [
    ("info", ["info"]),
    ("data", ["data", "synth", "--out", "{D}", "--classes", "3", "--per-class", "8", "--test-per-class", "4",
              "--size", "32"]),
    ("train", ["train", "--data-dir", "{D}", "--out", "{R}", "--precision", "float32", "--epochs", "1",
               "--max-batches", "1", *QUICK]),
    ("compare", ["compare", "{R}", "--out", "{C}"]),
    ("diagnose", ["diagnose", "--data-dir", "{D}", "--model", "cifar_resnet20_v1", "--image-size", "16",
                  "--batch-size", "8", "--batches", "1", "--loss-scale", "1024", "--out", "{G}"]),
    ("export", ["export", "--run", "{R}", "--out", "{E}", "--precision", "float32", "--ctx", "cpu"]),
    ("predict", ["predict", "--model", "{E}", "{D}/test", "--ctx", "cpu", "--no-progress"]),
    ("bench", ["bench", "--model", "cifar_resnet20_v1", "--image-size", "16", "--batch-sizes", "4", "--precisions",
               "float32", "--iters", "2", "--warmup", "1", "--repeats", "1", "--no-plots", "--no-census",
               "--out", "{B}"]),
    ("launch", ["launch", "--workers", "1", "--servers", "1", "--python", "/bin/true", "--", sys.executable, "-c",
                "print('a line of the worker')"]),
    ("selftest", ["selftest", "--steps", "6"]),
    # The demo's own lines; the runs it starts are `train` and `compare`, above (stubbed here: minutes each).
    ("demo", ["demo", "--out", "{M}"]),
]

CLOSED_STDOUT_CHILD = """
import contextlib, json, os, sys
from mxfp16 import cli
from mxfp16.commands import demo

demo.resolve_auto = lambda: ("float32", "stubbed for the test")
demo._mxfp16 = lambda *args: True
commands, result = json.loads(sys.argv[1]), sys.argv[2]
codes = {}
for name, argv in commands:
    if sys.stdout is not None:
        sys.stdout.flush()
    with contextlib.suppress(OSError):  # as the shell's >&- leaves it: descriptor 1 closed, sys.stdout None
        os.close(1)
    sys.stdout = None
    codes[name] = cli.main(argv)
    with open(result, "w") as handle:
        json.dump(codes, handle)
"""


@pytest.mark.slow
def test_every_command_runs_with_standard_output_closed(tmp_path):
    from mxfp16.cli import command_modules

    assert {name for name, _ in CLOSED_STDOUT_COMMANDS} == {m.__name__.rsplit(".", 1)[1] for m in command_modules()}
    folders = {key: str(tmp_path / key) for key in "DRCGEBM"}
    commands = [(name, [a.format(**folders) for a in argv]) for name, argv in CLOSED_STDOUT_COMMANDS]
    result = tmp_path / "codes.json"
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-c", CLOSED_STDOUT_CHILD,
                           json.dumps(commands), str(result)], stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                          env=ENV, timeout=900)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert json.loads(result.read_text()) == {name: 0 for name, _ in commands}, proc.stderr[-3000:]
    assert (tmp_path / "R" / "summary.json").is_file() and (tmp_path / "E" / "SHA256SUMS").is_file()


def test_a_closed_stream_becomes_dev_null_before_any_file_takes_its_descriptor(tmp_path):
    """Without it the next file opened gets descriptor 1, and C code's prints land in it."""
    child = ("import os, sys\n"
             "from mxfp16.plumbing.console import reopen_closed_streams\n"
             "names = reopen_closed_streams()\n"
             "with open(sys.argv[1], 'w') as handle:\n"
             "    os.write(1, b'C code prints this')\n"
             "    print('Python prints this')\n"
             "    handle.write(' '.join(names) + ' ' + str(handle.fileno()))\n")
    target = tmp_path / "file"
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&- 2>&-', "sh", sys.executable, "-c", child, str(target)],
                          cwd=REPO, env=ENV, timeout=60)
    assert proc.returncode == 0
    names, fd = target.read_text().rsplit(" ", 1)
    assert names == "stdout stderr" and int(fd) > 2  # what was written to "standard output" went nowhere
