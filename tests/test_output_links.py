"""The writing rule resolves links: an output that reaches into an input through them is refused, train included.

Issue 37's case: with ``runs/lnk2`` a symbolic link to ``data/tiny/train``,
``train --out runs/lnk2`` wrote ``config.json`` and ``checkpoints/`` into the
training split, where ``checkpoints/`` then counted as a class folder.
"""
import os

from mxfp16.cli import main
from mxfp16.plumbing.output import OutputFolderError, check_output_folder

import pytest
from train_support import QUICK, tiny_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("links"))


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("steps", [1, 3])
def test_train_refuses_an_out_that_is_a_link_into_the_data_set(data, tmp_path, capsys, steps):
    before = _files(data)
    target = data / "train"
    for step in range(steps):  # runs/lnk0 -> runs/lnk1 -> ... -> data/tiny/train
        link = tmp_path / f"lnk{step}"
        os.symlink(target if step == 0 else tmp_path / f"lnk{step - 1}", link)
    out = tmp_path / f"lnk{steps - 1}"
    assert main(["train", "--data-dir", str(data), "--out", str(out), "--precision", "float32", *QUICK]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} sits inside the data set {data}" in err and "Traceback" not in err
    assert _files(data) == before  # no config.json, no checkpoints/ class folder


def test_train_refuses_an_out_inside_a_linked_folder_that_does_not_exist_yet(data, tmp_path, capsys):
    os.symlink(data, tmp_path / "runs")
    out = tmp_path / "runs" / "new" / "run"
    assert main(["train", "--data-dir", str(data), "--out", str(out), "--precision", "float32", *QUICK]) == 2
    assert "sits inside the data set" in capsys.readouterr().err and not (data / "new").exists()


def test_the_rule_resolves_links_on_both_sides(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    os.symlink(tmp_path / "data", tmp_path / "alias")
    os.symlink(tmp_path / "alias", tmp_path / "alias2")
    os.symlink(tmp_path / "elsewhere", tmp_path / "dangling")
    for out, how in ((tmp_path / "alias2" / "train", "sits inside"), (tmp_path, "contains"),
                     (tmp_path / "alias", "is")):
        with pytest.raises(OutputFolderError, match=how):
            check_output_folder(out, [("the data set", tmp_path / "alias2")])
    check_output_folder(tmp_path / "dangling", [("the data set", tmp_path / "alias2")])  # leads elsewhere: fine
