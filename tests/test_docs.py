"""The documentation site builds in strict mode, with every page it promises."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocs_jupyter")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out


def _page(site, name):
    with open(os.path.join(site, name, "index.html"), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.slow
def test_cli_reference_lists_every_subcommand_with_its_flags(site):
    import argparse

    from mxfp16.cli import build_parser

    page = _page(site, "cli")
    assert "mxfp16-cli" not in page, "the generation marker was left in the page"
    def check(parser, prefix):
        subparsers = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        for name, sub in (subparsers.choices.items() if subparsers else ()):
            assert f"{prefix} {name}" in page
            for action in sub._actions:
                for flag in action.option_strings:
                    assert flag in page, f"flag {flag} of {prefix} {name} missing from the CLI reference"
            check(sub, f"{prefix} {name}")
        return subparsers

    assert check(build_parser(), "mxfp16").choices, "mxfp16 has no subcommands"
    assert "mxfp16 data fetch" in page and "--sha256" in page  # nested subcommands too


@pytest.mark.slow
def test_every_notebook_is_rendered_with_its_outputs(site):
    names = sorted(n[:-len(".ipynb")] for n in os.listdir(os.path.join(REPO, "notebooks")) if n.endswith(".ipynb"))
    assert names
    for name in names:
        page = _page(site, os.path.join("notebooks", name))
        # Saved outputs appear as output areas; a notebook rendered without them has none.
        assert "jp-OutputArea" in page, f"{name} rendered without outputs"


#: Kinds nbconvert's HTML export prefers to image/png when an output holds several: such an output is not an <img>.
_RENDERED_BEFORE_PNG = ("text/html", "application/pdf", "text/latex", "image/svg+xml")
#: A matplotlib figure saved as its repr (no image formatter ran): a picture the page should have and lacks.
_FIGURE_REPR = re.compile(r"<Figure size [\d.]+x[\d.]+ with \d+ Axes>|<matplotlib\.figure\.Figure at 0x[0-9a-f]+>")
_IMG_SRC = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*[\"']([^\"']*)[\"']", re.I)


def _pictures_saved(notebook):
    """How many pictures a notebook's saved outputs put on its page: its PNG outputs, and its bare Figure reprs."""
    count = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = data.get("text/plain", "")
            text = ("".join(text) if isinstance(text, list) else text).strip()
            if "image/png" in data and not any(kind in data for kind in _RENDERED_BEFORE_PNG):
                count += 1
            elif _FIGURE_REPR.fullmatch(text) and not any(kind.startswith("image/") for kind in data):
                count += 1  # the picture this output should have been
    return count


def _pictures_shown(page, page_dir, site_dir):
    """How many <img> of a built page show a picture: a data: PNG, or a file the site holds."""
    count = 0
    for src in _IMG_SRC.findall(page):
        if src.startswith("data:image/png;base64,") and len(src) > len("data:image/png;base64,"):
            count += 1
        elif src and not src.startswith("data:") and "://" not in src and not src.startswith("//"):
            path = src.split("#")[0].split("?")[0]
            path = os.path.join(site_dir, path.lstrip("/")) if path.startswith("/") else os.path.join(page_dir, path)
            count += os.path.isfile(os.path.normpath(path))
    return count


def _missing_pictures(notebook, page, page_dir, site_dir):
    """``None`` when the page shows a picture for each picture the notebook saved, else what is missing."""
    saved, shown = _pictures_saved(notebook), _pictures_shown(page, page_dir, site_dir)
    if shown >= saved:
        return None
    bare = " (a matplotlib figure saved as its repr renders as text)" if "&lt;Figure size" in page else ""
    return f"{saved} saved picture(s), {shown} shown{bare}"


def test_missing_pictures_counts_figures_saved_as_text(tmp_path):
    """What notebook 7 once did: its prediction grid saved as ``<Figure size ...>`` next to three PNG plots."""
    import nbformat

    png = {"image/png": "iVBORw0KGgo=", "text/plain": "<IPython.core.display.Image object>"}
    cells = [nbformat.v4.new_code_cell("plots", outputs=[nbformat.v4.new_output("display_data", data=png)] * 3),
             nbformat.v4.new_code_cell("fig", outputs=[nbformat.v4.new_output(
                 "execute_result", data={"text/plain": "<Figure size 1000x460 with 10 Axes>"}, execution_count=1)])]
    notebook = nbformat.v4.new_notebook(cells=cells)
    (tmp_path / "grid.png").write_bytes(b"png")
    img = '<img alt="" src="data:image/png;base64,iVBORw0KGgo=">'
    as_text = img * 3 + "<pre>&lt;Figure size 1000x460 with 10 Axes&gt;</pre>"
    assert _missing_pictures(notebook, as_text, str(tmp_path), str(tmp_path)) == \
        "4 saved picture(s), 3 shown (a matplotlib figure saved as its repr renders as text)"
    assert _missing_pictures(notebook, img * 3 + '<img src="grid.png">', str(tmp_path), str(tmp_path)) is None
    assert _missing_pictures(notebook, img * 3 + '<img src="gone.png">', str(tmp_path), str(tmp_path)) is not None


@pytest.mark.slow
def test_every_saved_picture_of_a_notebook_is_on_its_page(site):
    """Each PNG a notebook saved (and each figure it saved as text instead) is an image on its site page."""
    import nbformat

    missing = []
    for name in sorted(n for n in os.listdir(os.path.join(REPO, "notebooks")) if n.endswith(".ipynb")):
        notebook = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
        page_dir = os.path.join(site, "notebooks", name[:-len(".ipynb")])
        problem = _missing_pictures(notebook, _page(site, os.path.relpath(page_dir, site)), page_dir, str(site))
        if problem:
            missing.append(f"{name}: {problem}")
    assert not missing, missing


@pytest.mark.slow
def test_api_reference_documents_the_exported_names(site):
    import mxfp16

    page = _page(site, "api")
    for name in mxfp16.__all__:
        if not name.startswith("_"):
            assert name in page, f"{name} is exported but not in the API reference"


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _run_blocks(blocks, label, cwd=REPO):
    """Run each block in its own namespace, in order, in one fresh process in ``cwd``; return what each printed."""
    from conftest import run_python

    code = "import contextlib, io\nblocks = %r\n" % (blocks,) + (
        "for i, block in enumerate(blocks):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        exec(compile(block, '%s block %%d' %% i, 'exec'), {'__name__': '__main__'})\n"
        "    print('BLOCK', i, repr(out.getvalue()))\n" % label)
    printed = [line.split(" ", 2) for line in run_python(code, timeout=400, cwd=cwd).stdout.splitlines()
               if line.startswith("BLOCK ")]
    assert [int(i) for _, i, _ in printed] == list(range(len(blocks)))
    return [eval(text) for _, _, text in printed]


def _own(printed):
    """What the examples printed themselves: ``MixedPrecision("auto")`` logs its timing (``auto: ...`` lines) on a
    CPU where timing decides (native bfloat16: avx512_bf16 or AMX), and only there; the rest is the example's.

    A block's own output follows whatever auto logged. The auto lines are checked to come only from a CPU whose
    bfloat16 is native (elsewhere the rule decides, silently).
    """
    from mxfp16.machine import hardware

    support = hardware.bfloat16_support()
    texts = [printed] if isinstance(printed, str) else list(printed)
    owns = []
    for text in texts:
        lines = text.splitlines(keepends=True)
        logged = [line for line in lines if line.startswith("auto: ")]
        assert not logged or support.native, (
            f"auto timed a network on a CPU whose bfloat16 is {support.kind} ({support.describe()}): {logged}")
        owns.append("".join(line for line in lines if not line.startswith("auto: ")))
    return owns[0] if isinstance(printed, str) else owns


def _number(text, key):
    """The number a recipe printed after ``key``: ``_number('lossD 0.7 lossG 0.6', 'lossG')`` is 0.6."""
    return float(re.search(re.escape(key) + r" (\S+)", text).group(1))


def test_every_python_example_of_getting_started_runs_as_written(tmp_path):
    """Every Python block a new user may copy from getting-started, each in a namespace of its own, in one process
    on this machine (all of them use the same precision, ``auto``)."""
    text = open(os.path.join(REPO, "docs", "getting-started.md"), encoding="utf-8").read()
    blocks = _python_blocks(text)
    assert len(blocks) >= 4
    printed = _own(_run_blocks(blocks, "getting-started.md", cwd=tmp_path))
    loop = printed[[i for i, b in enumerate(blocks) if "mp.train_step(" in b][0]].split()
    assert loop[0] in ("float32", "amp-bfloat16", "float16") and 0 < float(loop[2]) < 10 and loop[4] == "False"
    own = printed[[i for i, b in enumerate(blocks) if "scaler.accumulate(" in b][0]].split()
    assert own[:2] == ["grad", "norm"] and float(own[2]) > 0 and own[4] == "False"


def _section(text, heading):
    """The text of the ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 3)
    return text[start:] if end < 0 else text[start:end]


def test_the_estimator_and_tensorboard_recipes_of_the_porting_page_run_as_written(tmp_path):
    """The two recipes, in one process in a folder of their own: what they print and the files they leave."""
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    porting = open(os.path.join(REPO, "docs", "porting-gluoncv.md"), encoding="utf-8").read()
    blocks = [block for heading in ("MXNet's Estimator", "TensorBoard")
              for block in _python_blocks(_section(porting, heading))]
    assert len(blocks) == 2
    estimator, tensorboard = _own(_run_blocks(blocks, "porting-gluoncv.md", cwd=tmp_path))
    precision = estimator.splitlines()[-1].split()[0]
    assert precision in ("float32", "amp-bfloat16", "float16") and "validation accuracy" in estimator
    checkpoints = sorted(p.name for p in (tmp_path / "runs" / "estimator").iterdir())
    assert "model-epoch1batch8.params" in checkpoints and "model-epoch1batch8.mxfp16.json" in checkpoints
    state = json.loads((tmp_path / "runs" / "estimator" / "model-epoch1batch8.mxfp16.json").read_text())
    assert state["precision"] == precision
    logdir = tensorboard.split()[0]
    assert logdir == "runs/tensorboard/own-loop"
    events = EventAccumulator(str(tmp_path / logdir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    assert {e.step for e in events.Scalars("train/loss")} == {4, 8}
    assert [e.value for e in events.Scalars("precision/loss_scale")][-1] == float(tensorboard.split()[1])
    assert 0.0 <= events.Scalars("epoch/val_top1")[0].value <= 1.0
    assert "gradients/all" in events.Tags()["histograms"]


def test_every_recipe_of_the_porting_guide_runs_as_written(tmp_path):
    """The guide's recipes (a GluonCV classification script, a GAN, clipping, SSD's loss over two devices), each in
    a namespace of its own, in one process, each under ``auto``; the Estimator and TensorBoard recipes have a test
    of their own below."""
    import math

    guide = open(os.path.join(REPO, "docs", "porting-gluoncv.md"), encoding="utf-8").read()
    for heading in ("MXNet's Estimator", "TensorBoard"):
        guide = guide.replace(_section(guide, heading), "")
    blocks = _python_blocks(guide)
    printed = _own(_run_blocks(blocks, "porting-gluoncv.md", cwd=tmp_path))

    def output(marker):
        return printed[[i for i, b in enumerate(blocks) if marker in b][0]]

    from mxfp16.machine import hardware

    # Where timing decides (native bfloat16) each recipe's network gets its own verdict; once one of them switched
    # AMP on, every later one runs in it (float32 cannot be had in that process any more). Where the rule decides,
    # all are the rule's one precision.
    precisions = [text.split()[0] for text in printed]
    assert set(precisions) <= {"float32", "amp-bfloat16", "float16"}, printed
    first_amp = precisions.index("amp-bfloat16") if "amp-bfloat16" in precisions else len(precisions)
    assert set(precisions[first_amp:]) <= {"amp-bfloat16"}, printed
    support = hardware.bfloat16_support()
    if not support.native:
        assert len(set(precisions)) == 1, f"{printed}: the rule decides on this CPU ({support.describe()})"
    assert "accuracy" in output("gcv.model_zoo.get_model")
    gan = output("trainerG = mp.prepare")
    assert math.isfinite(_number(gan, "lossD")) and math.isfinite(_number(gan, "lossG"))
    assert _number(gan, "skipped") == 0
    clipped = output("scaler.clip_global_norm(")
    assert _number(clipped, "grad norm") > 0 and math.isfinite(_number(clipped, "loss"))
    ssd = output("mxfp16.BatchLoss(ssd_loss)")
    assert _number(ssd, "devices") == 2 and 0 < _number(ssd, "loss") < float("inf")


def test_the_library_example_of_the_readme_runs_as_written():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("As a library"):]
    printed = _own(_run_blocks(_python_blocks(section)[:1], "README.md"))
    name, loss = printed[0].split()[:2]
    assert name.split()[0] in ("float32", "amp-bfloat16", "float16") and 0 < float(loss) < 20


def test_relative_links_resolve_in_the_repository():
    """Links in the pages work on a repository browser too (the site's build checks them as the site sees them)."""
    import re

    broken = []
    for name in sorted(os.listdir(os.path.join(REPO, "docs"))):
        if not name.endswith(".md"):
            continue
        with open(os.path.join(REPO, "docs", name), encoding="utf-8") as handle:
            text = handle.read()
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(REPO, "docs", target))):
                broken.append(f"docs/{name}: {target}")
    assert not broken, broken


@pytest.mark.slow
def test_links_in_the_rendered_notebooks_lead_to_pages_of_the_site(site):
    """A notebook links docs pages as ``../docs/<page>.md``; on the site that must reach the page."""
    from urllib.parse import unquote, urlparse

    checked, broken = 0, []
    for folder in sorted(glob.glob(os.path.join(site, "notebooks", "*", ""))):
        page = _page(site, os.path.relpath(folder, site))
        for href in re.findall(r'<a [^>]*href="([^"]+)"', page):
            url = urlparse(href)
            if url.scheme or url.netloc or href.startswith("#") or not url.path:
                continue
            target = os.path.normpath(os.path.join(folder, unquote(url.path)))
            checked += 1
            if not (os.path.isfile(target) or os.path.isfile(os.path.join(target, "index.html"))):
                broken.append(f"{os.path.basename(os.path.dirname(folder + '/'))}: {href}")
    assert checked, "no relative links found in the rendered notebooks"
    assert not broken, "links that lead nowhere on the site:\n" + "\n".join(broken)
