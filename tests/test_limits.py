"""The writing rule for output folders, and the ranges of numeric flags (mxfp16.plumbing: limits, fileio)."""
import json
import math
import os

from mxfp16.cli import main
from mxfp16.plumbing.fileio import JSONFileError, read_json, read_jsonl, write_json
from mxfp16.plumbing.limits import LimitError, check, is_allocation_failure, max_batch, memory_bytes
from mxfp16.plumbing.output import OutputFolderError, check_output_folder

import pytest


# ---- the output-folder rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("relation,expected", [("same", "is"), ("parent", "contains"), ("child", "sits inside"),
                                               ("sibling", None)])
def test_an_output_folder_may_not_overlap_an_input(tmp_path, relation, expected):
    data = tmp_path / "data"
    data.mkdir()
    out = {"same": data, "parent": tmp_path, "child": data / "out", "sibling": tmp_path / "out"}[relation]
    if expected is None:
        check_output_folder(out, [("the data set", data), ("nothing", None)])
        return
    with pytest.raises(OutputFolderError, match=f"--out {out} {expected} the data set {data}"):
        check_output_folder(out, [("the data set", data)])


def test_the_rule_sees_through_symbolic_links_and_dots(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "link").symlink_to(data)
    with pytest.raises(OutputFolderError, match="is the data set"):
        check_output_folder(tmp_path / "link", [("the data set", data)])
    with pytest.raises(OutputFolderError, match="sits inside"):
        check_output_folder(f"{data}/./x/..", [("the data set", tmp_path)])


def test_bench_and_diagnose_refuse_an_out_inside_their_data(tmp_path, capsys):
    from train_support import tiny_dataset

    data = tiny_dataset(tmp_path)
    before = sorted(str(p) for p in data.rglob("*"))
    assert main(["bench", "--data", str(data), "--out", str(data / "bench"), "--iters", "1"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["diagnose", "--data-dir", str(data), "--out", str(data)]) == 2
    assert "is the data set --data-dir" in capsys.readouterr().err
    assert sorted(str(p) for p in data.rglob("*")) == before


# ---- numeric flags ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["data", "synth", "--out", "{tmp}/s", "--size", "100000"], "argument --size: 100000: must be between 8 and 4096"),
    (["data", "bench", "--src", "{tmp}", "--images", "0"], "argument --images: 0: must be between 1 and 1e+07"),
    (["bench", "--out", "{tmp}/b", "--timeout", "-1"], "argument --timeout: -1: must be between"),
    (["bench", "--out", "{tmp}/b", "--image-size", "nan"], "argument --image-size: 'nan' is not an integer"),
    (["predict", "--model", "{tmp}", "{tmp}", "--top-k", "0"], "argument --top-k: 0: must be between 1"),
    (["export", "--run", "{tmp}", "--out", "{tmp}/e", "--margin", "inf"], "argument --margin: inf: must be a finite"),
    (["launch", "--workers", "1", "--servers", "1", "--port", "70000", "--", "x"], "argument --port: 70000"),
    (["bench", "--out", "{tmp}/b", "--batch-sizes", "16,10000000000"], "--batch-sizes 10000000000: at most 65536"),
])
def test_numeric_flags_out_of_range_are_refused_naming_the_flag(tmp_path, capsys, argv, words):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == []  # nothing was made


def test_a_training_batch_beyond_the_machine_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--batch-size", "10000000000"]) == 2
    err = capsys.readouterr().err
    assert "batch_size=10000000000" in err and "quarter of this machine's memory" in err
    assert not (tmp_path / "r").exists()


def test_max_batch_follows_the_input_tensor_size():
    # 224 px float32: 602,112 bytes an image; with 64 GiB, a quarter holds 28,532 images.
    assert max_batch(224, memory=64 << 30) == (64 << 30) // 4 // (3 * 4 * 224 * 224)
    assert max_batch(32, memory=1 << 50) == 65536 and max_batch(4096, memory=1 << 20) == 1
    assert memory_bytes() > 1 << 28


@pytest.mark.parametrize("text, expected", [
    ("Failed to allocate CPU memory", True),
    ("std::bad_alloc", True),
    ("could not create a memory object", True),  # oneDNN's own allocation, under ulimit -v
    ("could not create a primitive descriptor for a convolution forward propagation primitive", False),
])
def test_an_allocation_failure_is_told_by_mxnets_and_onednns_wording(text, expected):
    from mxnet.base import MXNetError

    assert is_allocation_failure(MXNetError(f"MXNetError: {text}")) is expected
    assert is_allocation_failure(MemoryError()) and not is_allocation_failure(RuntimeError(text))


def test_check_names_the_setting_and_the_range():
    assert check(3, "--x", 1, 5, integer_only=True) == 3
    for value, words in ((0, "between 1 and 5"), (math.nan, "must be an integer"), (True, "must be an integer"),
                         (2.5, "must be an integer"), ("3", "must be an integer")):
        with pytest.raises(LimitError, match=words):
            check(value, "--x", 1, 5, integer_only=True)
    assert check(None, "--x", allow_none=True) is None
    with pytest.raises(LimitError, match="--y nan: must be a finite number"):
        check(math.nan, "--y", 0, 1)


# ---- the guarded JSON reader --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,words", [
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"a": ' * 40 + "1" + "}" * 40, "more than 32 deep"),
    ('{"a": NaN}', "NaN is not a number JSON allows"),
    ('{"a": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"a": 1e999}', "1e999 overflows a 64-bit float"),
    ("[1, 2]", "holds a list where an object belongs"),
    ('{"a": "1"}', "field 'a' is \"1\", where an integer belongs"),
    ('{"a": true}', "field 'a' is true, where an integer belongs"),
    ('{"b": 1}', "lacks the field 'a'"),
    ("\xff\xfe", "is not UTF-8 text"),
])
def test_read_json_refuses_what_a_hostile_file_holds(tmp_path, text, words):
    path = tmp_path / "f.json"
    path.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    with pytest.raises(JSONFileError, match="restore it") as info:
        read_json(path, "restore it", fields={"a": int})
    assert str(path) in str(info.value) and words in str(info.value)


def test_read_json_defaults_and_size_limit(tmp_path):
    assert read_json(tmp_path / "missing.json", default=None) is None
    with pytest.raises(JSONFileError, match="is missing"):
        read_json(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"a": "x" * 2000}))
    with pytest.raises(JSONFileError, match="more than the 0 MB"):
        read_json(big, max_bytes=1000)
    (tmp_path / "m.jsonl").write_text('{"a": 1}\n\n{"a": NaN}\n')
    with pytest.raises(JSONFileError, match="m.jsonl line 3 is not valid JSON"):
        read_jsonl(tmp_path / "m.jsonl")


def test_write_json_refuses_to_write_what_json_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json(tmp_path / "x.json", {"margin": float("nan")})
    assert not (tmp_path / "x.json").exists() and not list(tmp_path.iterdir())
