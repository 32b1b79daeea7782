"""The documented Caltech-101 path, fetch -> split -> pack -> train, run as written on a small Caltech-shaped archive.

The commands come from the code block of docs/data.md's Caltech-101 section
and run unchanged through ``python -m mxfp16`` in a scratch folder (so their
``data/...`` folders land there); the test only fills in ``<HEX>`` and adds
flags that make them local and quick (``--url``, ``--no-progress``, a tiny
network, one epoch of two batches). A second test checks that every other
mention of the Caltech-101 folders (README, docs, notebooks, help texts, the
library) names the same folders as ``mxfp16.data.layout``.
"""
import hashlib
import io
import json
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from mxfp16.data import DataError, make_loaders
from mxfp16.data.layout import CALTECH101_TRAIN_PER_CLASS, caltech101_commands, caltech101_paths

import pytest
from conftest import child_env
from PIL import Image
from train_support import QUICK, REPO, ok, refused

#: Images per class: more than the 30 the protocol trains on, so every class keeps some for test.
#: Caltech-101 has BACKGROUND_Google beside its 101 categories; the documented split keeps it (102 classes).
CLASSES = {"BACKGROUND_Google": 33, "Faces_easy": 31, "accordion": 32}
#: What the test adds to each documented command (after it, so these win): local, quiet and quick.
QUICK_TRAIN = [*QUICK, "--precision", "float32", "--ctx", "cpu", "--epochs", "1", "--max-batches", "2"]
PATHS = caltech101_paths("data")


def documented_commands():
    """The ``mxfp16 ...`` command lines of the first bash block under docs/data.md's "## Caltech-101", as argv lists."""
    text = (Path(REPO) / "docs" / "data.md").read_text(encoding="utf-8")
    section = text[text.index("## Caltech-101"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            assert argv[0] == "mxfp16", line
            commands.append(argv[1:])
    return commands


def _jpeg(index, colour, mode="RGB"):
    """A small JPEG, a little different per image (Caltech's are about 300x200; these 40x30 or so)."""
    image = Image.new("RGB", (36 + index % 8, 28 + index % 5), colour)
    image.paste((255 - colour[0], index * 7 % 256, 128), (4, 4, 12 + index % 9, 14))
    buf = io.BytesIO()
    image.convert(mode).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def caltech_archive(path):
    """A zip shaped like caltech-101.zip: ``caltech-101/101_ObjectCategories.tar.gz`` (+ annotations).

    Each class has one grayscale image, as Caltech-101 has (the pack turns them into RGB).
    """
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w:gz") as tf:
        for c, (name, count) in enumerate(CLASSES.items()):
            colour = (60 + 80 * c, 200 - 60 * c, 40 * c)
            for i in range(1, count + 1):
                data = _jpeg(i, colour, "L" if i == 1 else "RGB")
                info = tarfile.TarInfo(f"101_ObjectCategories/{name}/image_{i:04d}.jpg")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("caltech-101/101_ObjectCategories.tar.gz", tar.getvalue())
        zf.writestr("caltech-101/Annotations.tar", b"annotations")
    return path


def mxfp16(cwd, *args, timeout=300):
    """``python -m mxfp16 ARGS`` in ``cwd``, a fresh process each (AMP is process-global); never raises."""
    env = child_env()
    return subprocess.run([sys.executable, "-m", "mxfp16", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def _flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.slow
def test_the_documented_caltech101_path_runs_end_to_end(tmp_path, monkeypatch):
    archive = caltech_archive(tmp_path / "caltech-101.zip")
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    work = tmp_path / "work"  # the folder the reader types the commands in: data/ and runs/ land here
    work.mkdir()
    steps = documented_commands()
    assert [argv[:2] if argv[0] == "data" else argv[:1] for argv in steps] == [
        ["data", "fetch"], ["data", "split"], ["train"], ["data", "pack"], ["train"]]
    fetch, split, train_folder, pack, train_pack = steps

    # fetch, as documented, from the local archive
    assert "<HEX>" in fetch
    proc = ok(mxfp16(work, *[sha256 if a == "<HEX>" else a for a in fetch], "--url", archive.as_uri(),
                     "--no-progress"))
    manifest = json.loads((work / PATHS.fetched / "manifest.json").read_text())
    assert manifest["sha256_verified"] and manifest["classes"] == len(CLASSES)
    assert sorted(p.name for p in (work / PATHS.images).iterdir()) == sorted(CLASSES)
    # Its printed next steps are the documented ones, word for word.
    printed = [shlex.split(line) for line in proc.stdout.splitlines() if line.startswith("  mxfp16 ")]
    assert printed == [shlex.split(c) for c in caltech101_commands("data")]
    assert printed[0][1:] == split and printed[2][1:] == pack

    # The download itself is not a split: the trainer stops and names the documented split command.
    message = refused(mxfp16(work, "train", "--data-dir", PATHS.fetched, *QUICK_TRAIN, "--out", "runs/wrong"),
                      "not a train/test split", caltech101_commands("data")[0], f"--data-dir {PATHS.split}")
    assert "Traceback" not in message and not (work / "runs" / "wrong" / "summary.json").exists()

    # split
    ok(mxfp16(work, *split))
    counts = json.loads((work / PATHS.split / "manifest.json").read_text())["counts"]
    n = CALTECH101_TRAIN_PER_CLASS
    assert counts == {name: {"train": n, "test": count - n} for name, count in CLASSES.items()}

    # train on the folder split
    proc = ok(mxfp16(work, *train_folder, *QUICK_TRAIN))
    train_images, test_images = n * len(CLASSES), sum(CLASSES.values()) - n * len(CLASSES)
    assert (f"data: folder {PATHS.split}: {len(CLASSES)} classes, {train_images} training images, "
            f"{test_images} test images") in proc.stdout
    out = work / _flag(train_folder, "--out")
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1

    # pack (one encoding process: the machine is shared)
    ok(mxfp16(work, *pack, "--workers", "1"))
    packed = json.loads(Path(f"{work / PATHS.pack}_classes.json").read_text())
    assert packed["classes"] == sorted(CLASSES) and packed["counts"] == {"train": train_images, "test": test_images}

    # train on the RecordIO pack
    proc = ok(mxfp16(work, *train_pack, *QUICK_TRAIN))
    assert (f"data: recordio {PATHS.pack}: {len(CLASSES)} classes, {train_images} training images, "
            f"{test_images} test images") in proc.stdout
    assert json.loads((work / _flag(train_pack, "--out") / "summary.json").read_text())["epochs"] == 1

    # The loaders name the step that was skipped, with the documented folders.
    monkeypatch.chdir(work)  # relative paths, as the reader types them
    for wrong, pipeline, fix in [(PATHS.images, "folder", caltech101_commands("data")[0]),
                                 (PATHS.split, "recordio", caltech101_commands("data")[2]),
                                 (PATHS.fetched, "recordio", caltech101_commands("data")[2]),
                                 (PATHS.pack, "folder", "--pipeline recordio")]:
        with pytest.raises(DataError) as err:
            make_loaders(wrong, image_size=16, batch_size=8, pipeline=pipeline)
        assert fix in str(err.value), (wrong, pipeline, str(err.value))


def test_the_documented_commands_use_the_layout_folders():
    split_cmd, train_cmd, pack_cmd, train_rec_cmd = (shlex.split(c)[1:] for c in caltech101_commands("data"))
    fetch, split, train_folder, pack, train_pack = documented_commands()
    assert fetch[:3] == ["data", "fetch", "caltech101"] and _flag(fetch, "--root") is None  # the default root, data
    assert split == split_cmd and pack == pack_cmd
    assert train_folder[:len(train_cmd)] == train_cmd and train_pack[:len(train_rec_cmd)] == train_rec_cmd
    assert (_flag(split, "--src"), _flag(split, "--out")) == (str(PATHS.images), str(PATHS.split))
    assert (_flag(pack, "--src"), _flag(pack, "--out")) == (str(PATHS.split), str(PATHS.pack))
    assert _flag(train_folder, "--data-dir") == str(PATHS.split) and "--pipeline" not in train_folder
    assert _flag(train_pack, "--data-dir") == str(PATHS.pack) and _flag(train_pack, "--pipeline") == "recordio"


def _texts():
    """``(name, text)`` of every place a reader meets the Caltech-101 folders, outside the tests."""
    import nbformat

    root = Path(REPO)
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "mxfp16").rglob("*.py"))]:
        yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for i, cell in enumerate(nb.cells):
            yield f"{path.name} cell {i}", cell.source
            for output in cell.get("outputs", []):
                yield f"{path.name} cell {i} output", str(output.get("text", ""))
    import argparse

    from mxfp16.cli import build_parser

    def helps(parser, prog):  # every subcommand's --help, nested ones too
        yield f"{prog} --help", parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from helps(sub, f"{prog} {name}")

    yield from helps(build_parser(), "mxfp16")


def test_every_mention_of_the_caltech101_folders_agrees():
    fetched = f"{PATHS.fetched}/"
    allowed = {str(p) for p in PATHS} | {f"{fetched}manifest.json"}
    # Which folders each flag may take: data split reads the images and writes the split, pack reads the split.
    by_flag = {"--src": {str(PATHS.images), str(PATHS.split)}, "--out": {str(PATHS.split), str(PATHS.pack)},
               "--data-dir": {str(PATHS.split), str(PATHS.pack)}}
    seen, wrong = set(), []
    for name, text in _texts():
        for match in re.finditer(r"data/caltech101[\w./-]*", text):
            path = match.group(0).rstrip(".")
            seen.add(path)
            if path not in allowed:
                wrong.append(f"{name}: {path}")
        for flag, folders in by_flag.items():
            for match in re.finditer(re.escape(flag) + r"[\s\"',\\]+(data/caltech101[\w./-]*)", text):
                if match.group(1).rstrip(".") not in folders:
                    wrong.append(f"{name}: {flag} {match.group(1)}")
        # The RecordIO prefix is only ever trained on with the recordio pipeline.
        for line in text.splitlines():
            if re.search(r"--data-dir[\s\"',]+" + re.escape(str(PATHS.pack)), line) and "recordio" not in line:
                wrong.append(f"{name}: --data-dir {PATHS.pack} without --pipeline recordio: {line.strip()}")
    assert not wrong, "Caltech-101 folders that are not the documented ones:\n" + "\n".join(wrong)
    assert {str(PATHS.images), str(PATHS.split), str(PATHS.pack)} <= seen


def test_other_folders_without_train_get_the_command_that_fixes_them(tmp_path):
    from mxfp16.data.layout import split_problem

    data = tmp_path / "data"
    for folder in (data / "demo" / "train" / "circle", data / "shapes" / "circle"):
        folder.mkdir(parents=True)
        (folder / "a.jpg").write_bytes(_jpeg(1, (10, 20, 30)))
    # Half of a split: give the split itself.
    assert f"--data-dir {data / 'demo'}" in split_problem(data / "demo" / "train")
    # An unsplit folder of class folders: split it.
    assert f"mxfp16 data split --src {data / 'shapes'} --out {data / 'shapes-split'}" in split_problem(data / "shapes")
    # The documented split before anything was fetched: fetch into that root, then the documented split.
    paths = caltech101_paths(data)
    message = split_problem(paths.split)
    assert f"mxfp16 data fetch caltech101 --root {data}" in message and caltech101_commands(data)[0] in message
    # Anything else is left to the scan's own message ("... does not exist", "no class sub-folders").
    assert split_problem(tmp_path / "nope") is None and split_problem(data / "demo") is None
