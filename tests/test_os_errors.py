"""Every OS error a writing command meets is one line naming the path and the fix, never a traceback.

Issue 37's cases: ``PermissionError`` from export, data synth/split/pack,
compare and predict's ``--output`` on an unwritable folder; ``ENAMETOOLONG``
for long paths in every writing command, and a legal 250-byte name refused
because its temporary name was longer; ``--out`` naming an existing file;
predict given a file in a folder it may not enter; MXNet's raw "Failed to
allocate CPU Memory". Commands run in-process (MXNet is loaded once);
permissions are tested without root's power to override them when the suite
runs as root (root may write anywhere; see :func:`_unprivileged`, which works
wherever the checkout lies), the allocation failure under a ``ulimit -v`` in
a child process.
"""
import contextlib
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mxfp16.cli import main
from mxfp16.plumbing.fileio import write_json
from mxfp16.plumbing.output import NAME_MAX, describe_os_error, temporary_file, temporary_folder

import pytest
from conftest import REPO
from export_support import images, tiny_export
from train_support import QUICK, tiny_dataset

LONG = "n" * 300  # longer than any file system's name limit


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    """A folder every user may enter and read (pytest's own are private to root): the inputs live here."""
    folder = Path(tempfile.mkdtemp(prefix="mxfp16-public-"))
    folder.chmod(0o755)
    data = tiny_dataset(folder)
    export = tiny_export(folder / "export")
    photos = folder / "photos"
    images(photos)
    runs = folder / "runs"
    for name in ("a", "b"):  # two finished runs, as compare reads them
        (runs / name).mkdir(parents=True)
        write_json(runs / name / "config.json", {"precision": "float32", "seed": 0})
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield {"root": folder, "data": data, "export": export, "photos": photos, "runs": runs}
    shutil.rmtree(folder, ignore_errors=True)


def _commands(p, out):
    """Each writing command with ``out`` as what it writes; inputs that exist."""
    return {
        "train": ["train", "--data-dir", p["data"], "--out", out, "--precision", "float32", *QUICK],
        "export": ["export", "--run", p["runs"] / "a", "--out", out, "--precision", "float32", "--ctx", "cpu"],
        "data synth": ["data", "synth", "--out", out, "--classes", "1", "--per-class", "1", "--size", "16"],
        "data split": ["data", "split", "--src", p["data"] / "train", "--out", out, "--train-per-class", "1"],
        "data pack": ["data", "pack", "--src", p["data"], "--out", Path(out) / "tiny", "--workers", "1"],
        "data digits": ["data", "digits", "--out", out],
        "compare": ["compare", p["runs"] / "a", p["runs"] / "b", "--out", out],
        "bench": ["bench", "--out", out, "--iters", "1"],
        "diagnose": ["diagnose", "--out", out],
        "predict --output": ["predict", "--model", p["export"], p["photos"], "--ctx", "cpu", "--no-progress",
                             "--output", Path(out) / "p.csv"],
    }


def _one_line_error(capsys, code, *phrases):
    err = capsys.readouterr().err
    assert code == 2, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("command", list(_commands({k: Path("x") for k in
                                                    ("data", "export", "photos", "runs")}, "o")))
def test_a_name_longer_than_the_file_system_allows_is_one_line(public, tmp_path, capsys, command):
    out = tmp_path / LONG / "out"
    code = main([str(a) for a in _commands(public, out)[command]])
    _one_line_error(capsys, code, f"is 300 bytes, longer than the {NAME_MAX} this file system allows")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", list(_commands({k: Path("x") for k in
                                                    ("data", "export", "photos", "runs")}, "o")))
def test_an_out_that_is_a_file_is_one_line(public, tmp_path, capsys, command):
    taken = tmp_path / "taken"
    taken.write_text("mine")
    argv = _commands(public, taken)[command]
    code = main([str(a) for a in argv])
    _one_line_error(capsys, code, str(taken), "is a file")
    assert taken.read_text() == "mine"


def test_a_250_byte_name_is_written_its_temporary_name_is_shortened(public, tmp_path, capsys):
    name = "r" * 246 + ".csv"  # legal: 250 bytes
    assert main(["predict", "--model", str(public["export"]), str(public["photos"]), "--ctx", "cpu",
                 "--no-progress", "--output", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text().startswith("path,class_1")
    capsys.readouterr()
    folder = "s" * 250
    assert main(["data", "split", "--src", str(public["data"] / "train"), "--out", str(tmp_path / folder),
                 "--train-per-class", "20"]) == 0
    assert json.loads((tmp_path / folder / "manifest.json").read_text())["totals"]["train"] == 60
    twice = [temporary_file(tmp_path / ("é" * 125)) for _ in range(2)]  # 250 bytes of two-byte characters
    assert twice[0] != twice[1] and all(len(os.fsencode(os.path.basename(t))) <= NAME_MAX for t in twice)
    assert len(os.fsencode(temporary_folder(tmp_path / name, ".staging").name)) <= NAME_MAX


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522
#: CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: what lets root read, write and enter any folder.
_DAC_CAPABILITIES = (1 << 1) | (1 << 2)


def _capabilities(libc, data=None):
    """This thread's capability sets (``data is None``), or set them to ``data``."""
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    if data is None:
        data = (_CapData * 2)()
        call = libc.capget
    else:
        call = libc.capset
    if call(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return data


@contextlib.contextmanager
def _unprivileged():
    """Lose root's power to override file permissions for the block; a user without it has none to lose.

    Switching to another user (``nobody``) would test the same refusals, but that user must then be able
    to read this checkout and its venv: one cloned into a private folder (mode 0700, e.g. root's home)
    could not even import the commands. Dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from this
    thread's effective set keeps root's identity (the checkout stays readable: root owns it) while
    permission bits apply to it as to anyone: a folder of mode 0555 cannot be written, one of mode
    0000 cannot be entered. The commands tested do their file work on this (the main) thread.
    """
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    saved = _capabilities(libc)
    lowered = (_CapData * 2)()
    for i in range(2):
        lowered[i].permitted, lowered[i].inheritable = saved[i].permitted, saved[i].inheritable
        lowered[i].effective = saved[i].effective & ~(_DAC_CAPABILITIES if i == 0 else 0)
    _capabilities(libc, lowered)
    try:
        yield
    finally:
        _capabilities(libc, saved)


def test_the_unprivileged_block_is_refused_what_permission_bits_refuse(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with _unprivileged():
        with pytest.raises(PermissionError):
            (locked / "f").write_text("x")
    (locked / "f").write_text("x")  # and privileges come back after it (as root; a user owns tmp_path anyway)
    assert (locked / "f").read_text() == "x"


@pytest.mark.parametrize("command", ["export", "data synth", "data split", "data pack", "compare",
                                     "predict --output"])
def test_an_unwritable_folder_is_one_line(public, capsys, command):
    locked = public["root"] / f"locked-{command.replace(' ', '-')}"
    locked.mkdir(mode=0o555)
    try:
        with _unprivileged():
            code = main([str(a) for a in _commands(public, locked / "out")[command]])
        _one_line_error(capsys, code, str(locked), "cannot be written", "choose a folder you can write to")
        assert list(locked.iterdir()) == []
    finally:
        locked.rmdir()


def test_predict_given_a_file_in_a_folder_it_may_not_enter_skips_it(public, capsys):
    hidden = public["root"] / "private"
    hidden.mkdir()
    shutil.copy(next(public["photos"].iterdir()), hidden / "photo.png")
    hidden.chmod(0o000)  # nobody may enter it: not this user, not root without its override
    try:
        with _unprivileged():
            code = main(["predict", "--model", str(public["export"]), str(hidden / "photo.png"),
                         str(public["photos"]), "--ctx", "cpu", "--no-progress"])
        captured = capsys.readouterr()
        assert code == 0 and "Traceback" not in captured.err
        assert f"skipped {hidden / 'photo.png'}: cannot be read (Permission denied)" in captured.err
        assert captured.out.count("circle") == 3  # the readable images are predicted
    finally:
        hidden.chmod(0o700)
        shutil.rmtree(hidden)


def test_an_os_error_deep_in_a_command_is_one_line_naming_the_folder(monkeypatch, capsys, tmp_path):
    from mxfp16.commands import info

    temporary = tmp_path / "sub" / ".summary.json.k2j4h1ab.tmp"  # output's temporary names: name the folder

    def fails(args):
        raise OSError(28, "No space left on device", str(temporary))

    monkeypatch.setattr(info, "run", fails)
    line = _one_line_error(capsys, main(["info"]), f"{tmp_path / 'sub'}: No space left on device",
                           "the disk is full", "free some space")
    assert ".tmp" not in line
    assert "a part of the path is a file" in describe_os_error(NotADirectoryError(20, "Not a directory", "/a/b"))


def test_an_allocation_failure_names_the_flags_and_the_estimate(public, tmp_path):
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2500 << 20, resource.RLIM_INFINITY))

    proc = subprocess.run([sys.executable, "-m", "mxfp16.train", "--data-dir", str(public["data"]), "--out",
                           str(tmp_path / "run"), "--model", "cifar_resnet20_v1", "--image-size", "512",
                           "--batch-size", "8", "--no-progress", "--epochs", "1", "--max-batches", "1",
                           "--precision", "float32"], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), preexec_fn=limit_memory)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("mxfp16 train: error: out of memory") and "Failed to allocate" not in line
    assert "Lower --batch-size (now 8) or --image-size (now 512)" in line and "(ulimit -v)" in line
    assert "images fit in a quarter of the 2.4 GiB" in line


def test_a_command_whose_module_fails_to_import_names_the_module_and_the_error(monkeypatch, capsys):
    import importlib

    from mxfp16 import cli

    real = importlib.import_module

    def import_module(name, *args):
        if name == "mxfp16.commands.export":
            raise PermissionError(13, "Permission denied", "/private/mxfp16/commands/export.py")
        return real(name, *args)

    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    line = _one_line_error(capsys, main(["export", "--run", "r", "--out", "o"]), "mxfp16 export: error:",
                           "mxfp16.commands.export could not be imported", "Permission denied",
                           "/private/mxfp16/commands/export.py")
    assert line.startswith("mxfp16 export: error:")
    assert main(["--help"]) == 0  # every other command is still there, the broken one listed as unavailable
    out = capsys.readouterr().out
    assert "train" in out and "predict" in out and "unavailable: mxfp16.commands.export failed to import" in out


def test_an_unreadable_commands_folder_is_one_line_not_an_empty_choice(monkeypatch, tmp_path, capsys):
    from mxfp16 import commands

    private = tmp_path / "commands"
    private.mkdir(mode=0o000)
    monkeypatch.setattr(commands, "__path__", [str(private)])
    try:
        with _unprivileged():
            code = main(["export", "--run", "r", "--out", "o"])
    finally:
        private.chmod(0o700)
    line = _one_line_error(capsys, code, f"cannot list mxfp16's commands in {private}: Permission denied",
                           "install mxfp16 where this user may read it")
    assert "choose from" not in line
