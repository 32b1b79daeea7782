"""What `mxfp16 predict` writes of a name is one line, safe in a spreadsheet, and gives the name back.

Issue 42, case 17: a file name with a newline printed across two lines, a
name that is not UTF-8 became U+FFFD in the CSV, and a name starting with
``=`` went into the CSV as a formula. The export here is the small one of
``tests/export_support.py``; its class names are made as hostile as the
file names (``export.json`` edited, checksums updated).
"""
import csv
import json
import os
import shutil

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.predict import csv_cell, escape_text, unescape_text

import pytest
from export_support import images, tiny_export

#: File names (bytes, as the OS holds them) a spreadsheet or a line-based reader would take for something else.
HOSTILE = [b"=HYPERLINK(\"x\",\"y\").png", b"+cmd.png", b"-2+3.png", b"@sum.png", b"'quoted.png",
           b"new\nline.png", b"carriage\rreturn.png", b"tab\tfirst.png", b"\xff\xfe-not-utf8.png",
           "\u202egnp.exe.png".encode(), "line\u2028separator.png".encode(), b"back\\slash.png",
           "caf\u00e9.png".encode()]
CLASSES = ["=1+1", "two\nlines", "plain"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    export = tiny_export(root / "export")
    info = json.loads((export / bundle.INFO_FILE).read_text())
    info["classes"] = CLASSES
    (export / bundle.INFO_FILE).write_text(json.dumps(info))
    bundle.seal(export)
    sample = images(root / "sample", count=1)[0]
    folder = root / "photos"
    folder.mkdir()
    for name in HOSTILE:
        shutil.copyfile(sample, os.path.join(os.fsencode(folder), name))
    return export, folder


def _name(path):
    return os.path.basename(os.fsencode(path))


def test_every_name_is_one_line_and_comes_back(hostile, tmp_path, capsys):
    export, folder = hostile
    out_csv, out_json = tmp_path / "p.csv", tmp_path / "p.json"
    for out in (out_csv, out_json):
        assert main(["predict", "--model", str(export), str(folder), "--top-k", "3", "--output", str(out),
                     "--no-progress", "--ctx", "cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 * len(HOSTILE)  # one line per image, twice
    names = {_name(unescape_text(line.split(": ")[0])) for line in printed}
    assert names == set(HOSTILE)
    for line in printed:
        assert {unescape_text(c.rsplit(" ", 1)[0]) for c in line.split(": ", 1)[1].split(", ")} == set(CLASSES)

    raw = out_csv.read_bytes()
    text = raw.decode("utf-8")  # valid UTF-8: no byte of a name written raw
    assert "\ufffd" not in text and text.count("\n") == len(HOSTILE) + 1  # a header and one line per image
    rows = list(csv.reader(text.splitlines()))[1:]
    cells = [cell for row in rows for cell in row if cell]
    assert not [c for c in cells if c[0] in "=+-@\t\r"]  # nothing a spreadsheet would run
    cells = {(c[1:] if c.startswith("'") else c) for c in cells}  # one leading quote is always mxfp16's
    assert {_name(unescape_text(row[0][1:] if row[0].startswith("'") else row[0])) for row in rows} == set(HOSTILE)
    assert set(CLASSES) <= {unescape_text(c) for c in cells}

    document = json.loads(out_json.read_text())  # JSON holds each name exactly, in its own escapes
    assert {_name(p["path"]) for p in document["predictions"]} == set(HOSTILE)
    assert {t["class"] for p in document["predictions"] for t in p["top"]} == set(CLASSES)


@pytest.mark.parametrize("text, written", [
    ("a\nb", "a\\nb"), ("\\n", "\\\\n"), (os.fsdecode(b"\xe9t\xe9"), "\\xe9t\\xe9"), ("\u00e9t\u00e9", "\u00e9t\u00e9"),
    ("\x85", "\\u0085"), ("\x1b[31m", "\\x1b[31m"), ("\U000e0001", "\\U000e0001"),
])
def test_escapes_tell_bytes_from_characters(text, written):
    assert escape_text(text) == written and unescape_text(written) == text


@pytest.mark.parametrize("text, cell", [("=1+1", "'=1+1"), ("-x", "'-x"), ("'x", "''x"), ("x=1", "x=1"),
                                        ("\tx", "\\tx")])
def test_csv_cells_are_never_formulas(text, cell):
    assert csv_cell(text) == cell
