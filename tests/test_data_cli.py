"""``mxfp16 data ...`` end to end, in process: synth, split, pack, bench, and user errors."""
import json

from mxfp16.cli import main


def test_synth_split_pack_bench(tmp_path, capsys):
    src = tmp_path / "synth"
    assert main(["data", "synth", "--out", str(src), "--classes", "2", "--per-class", "5", "--test-per-class", "1",
                 "--size", "40"]) == 0
    assert len(list((src / "train").rglob("*.jpg"))) == 10
    # Split one folder of class folders (here the synthetic training split) the Caltech-101 way.
    out = tmp_path / "split"
    assert main(["data", "split", "--src", str(src / "train"), "--out", str(out), "--train-per-class", "3"]) == 0
    assert json.loads((out / "manifest.json").read_text())["totals"] == {"train": 6, "test": 4}
    assert main(["data", "pack", "--src", str(out), "--out", str(tmp_path / "rec" / "p"), "--workers", "1"]) == 0
    assert (tmp_path / "rec" / "p_classes.json").is_file()
    report = tmp_path / "bench.json"
    assert main(["data", "bench", "--src", str(out), "--image-size", "24", "--workers", "0", "--batch-size", "2",
                 "--images", "4", "--json", str(report)]) == 0
    rows = json.loads(report.read_text())["results"]
    assert [(r["pipeline"], r["workers"]) for r in rows] == [("folder", 0), ("recordio", 1)]
    assert all(r["images"] >= 4 and r["images_per_second"] > 0 and r["images_per_cpu_second"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "img/s" in printed and "mean 4" in printed


def test_user_errors_exit_2_with_the_fix(tmp_path, capsys):
    assert main(["data", "split", "--src", str(tmp_path / "missing"), "--out", str(tmp_path / "o"),
                 "--train-per-class", "30"]) == 2
    err = capsys.readouterr().err
    assert "mxfp16 data: error:" in err and str(tmp_path / "missing") in err and "does not exist" in err
    assert main(["data", "pack", "--src", str(tmp_path),
                 "--out", str(tmp_path.parent / f"{tmp_path.name}-p" / "p")]) == 2
    assert "training split folder" in capsys.readouterr().err
    # The writing rule: a pack or a split inside its own source is refused before anything is read or written.
    (tmp_path / "src" / "cat").mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["data", "pack", "--src", str(tmp_path), "--out", str(tmp_path / "p")]) == 2
    assert "sits inside the source data set" in capsys.readouterr().err
    assert main(["data", "split", "--src", str(tmp_path / "src"), "--out", str(tmp_path / "src" / "split"),
                 "--train-per-class", "1"]) == 2
    assert "sits inside the source folder --src" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert main(["data", "fetch", "caltech101", "--root", str(tmp_path), "--url", str(tmp_path / "no.zip"),
                 "--no-progress"]) == 2
    assert "no such file" in capsys.readouterr().err

