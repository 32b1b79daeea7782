"""One source for every figure: measured results live in docs/results/, prose quotes them by name.

A figure in README.md, docs/*.md or a notebook's markdown is written as a
literal number inside a named span, so it reads normally on the site and on
a repository browse::

    amp-bfloat16 runs <!-- fig bench224.bf16_speedup -->1.93x<!-- /fig --> float32

and a whole table between ``<!-- table NAME -->`` and ``<!-- /table -->``.
``docs/results/figures.json`` says where each name comes from: a recorded
result file under ``docs/results/`` (what ``mxfp16 bench``, ``mxfp16
train`` and ``mxfp16 compare`` wrote, with the command, machine, load and
threads), the path to the value in it, and its format. Tables come from the
builders in :data:`TABLES`.

``python docs/hooks/figures.py`` (the test suite runs the same
check) fails when a quoted figure or table differs from its source, names an
unknown figure, or when a number that looks like a measurement (``1.9x``,
``12.5 img/s``, ``-0.4 points``, ``0.973``) stands outside a span. A number
quoted from elsewhere (a paper, a goal) goes in ``<!-- quoted SOURCE -->``
... ``<!-- /quoted -->``. ``--write`` rewrites every span from the sources.
"""
import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
REGISTRY = RESULTS / "figures.json"

FIGURE = re.compile(r"<!-- fig ([\w.\-]+) -->(.*?)<!-- /fig -->", re.S)
TABLE = re.compile(r"<!-- table ([\w.\-]+) -->\n(.*?)<!-- /table -->", re.S)
QUOTED = re.compile(r"<!-- quoted [^>]*-->.*?<!-- /quoted -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
#: What looks like a measured figure when it stands alone in prose.
MEASURED = re.compile(r"(?<![\w.])(?:[+-]?\d+(?:\.\d+)?x\b|\d+(?:\.\d+)? img/s|[+-]?\d+\.\d+ points?\b|0\.9\d\d\d?\b)")


def documents(root=ROOT):
    """``(path, text)`` of every page that quotes figures: the README, docs/*.md and notebook markdown."""
    yield root / "README.md", (root / "README.md").read_text(encoding="utf-8")
    for path in sorted((root / "docs").glob("*.md")):
        yield path, path.read_text(encoding="utf-8")
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        yield path, "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _lookup(document, path):
    """``a.b[key with spaces].c`` -> document["a"]["b"]["key with spaces"]["c"]; integers index lists."""
    value = document
    for part in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", path):
        key = part[0] or part[1]
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def registry(path=REGISTRY):
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def value(name, figures=None, results=RESULTS):
    """The formatted figure ``name`` (``KeyError`` for an unknown name)."""
    figures = registry() if figures is None else figures
    spec = figures[name]
    document = json.loads((results / spec["file"]).read_text(encoding="utf-8"))
    raw = _lookup(document, spec["path"])
    scale = spec.get("scale", 1)
    return spec["format"].format(raw * scale if isinstance(raw, (int, float)) else raw)


def _markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table(name, figures=None, results=RESULTS):
    """A table named in the registry: ``{"table": [[header...], [cell, ...], ...]}``.

    A cell is text, ``{"fig": NAME}``, or a list of both, joined (``[{"fig": A}, " (", {"fig": B}, ")"]``).
    """
    figures = registry() if figures is None else figures
    header, *rows = figures[name]["table"]

    def cell(c):
        if isinstance(c, list):
            return "".join(cell(part) for part in c)
        return value(c["fig"], figures, results) if isinstance(c, dict) else c

    return _markdown_table(header, [[cell(c) for c in row] for row in rows])


def problems(docs=None, figures=None, results=RESULTS):
    """Every disagreement between the pages and their sources, as readable lines (``[]`` when none)."""
    figures = registry() if figures is None else figures
    found = []
    for path, text in (documents() if docs is None else docs):
        where = getattr(path, "name", str(path))
        for match in FIGURE.finditer(text):
            name, quoted = match.group(1), match.group(2)
            try:
                expected = value(name, figures, results)
            except (KeyError, IndexError, FileNotFoundError) as err:
                found.append(f"{where}: figure {name!r} has no source ({type(err).__name__}: {err})")
                continue
            if quoted.strip().strip("*") != expected:
                found.append(f"{where}: figure {name} quotes {quoted!r}, its source says {expected!r}")
        for match in TABLE.finditer(text):
            name = match.group(1)
            try:
                expected = table(name, figures, results)
            except (KeyError, IndexError, FileNotFoundError) as err:
                found.append(f"{where}: table {name!r} has no source ({type(err).__name__}: {err})")
                continue
            if match.group(2) != expected:
                found.append(f"{where}: table {name} differs from its source; run python docs/hooks/figures.py --write")
        bare = CODE.sub(" ", COMMENT.sub(" ", TABLE.sub(" ", FIGURE.sub(" ", QUOTED.sub(" ", text)))))
        for match in MEASURED.finditer(bare):
            line = bare[:match.start()].count("\n") + 1
            context = bare[max(0, match.start() - 40):match.end() + 20].replace("\n", " ")
            found.append(f"{where}: {match.group(0)!r} looks measured but names no source (…{context}…); wrap it "
                         "in <!-- fig NAME -->…<!-- /fig --> or <!-- quoted SOURCE -->…<!-- /quoted -->"
                         + ("" if path.suffix == ".ipynb" else f" (line {line})"))
    return found


def rewrite(text, figures=None, results=RESULTS):
    """``text`` with every figure and table span refreshed from its source."""
    figures = registry() if figures is None else figures
    text = FIGURE.sub(lambda m: f"<!-- fig {m.group(1)} -->{value(m.group(1), figures, results)}<!-- /fig -->", text)
    return TABLE.sub(lambda m: f"<!-- table {m.group(1)} -->\n{table(m.group(1), figures, results)}<!-- /table -->",
                     text)


def write_all(root=ROOT):
    """Refresh every span in the README, docs/*.md and notebook markdown cells; return the files changed."""
    changed = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        edited = False
        for cell in notebook["cells"]:
            if cell["cell_type"] == "markdown":
                text = "".join(cell["source"])
                new = rewrite(text)
                if new != text:
                    cell["source"] = new.splitlines(keepends=True)
                    edited = True
        if edited:
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(path)
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python docs/hooks/figures.py", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="refresh every figure and table from its source")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_all():
            print(f"updated {path.relative_to(ROOT)}")
    found = problems()
    print("\n".join(found) if found else "every figure matches its source")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
