"""The documentation site builds in strict mode, with every page it promises."""
import os
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


@pytest.mark.slow
def test_api_reference_documents_the_exported_names(site):
    import mxfp16

    page = _page(site, "api")
    for name in mxfp16.__all__:
        if not name.startswith("_"):
            assert name in page, f"{name} is exported but not in the API reference"


def test_the_own_loop_snippet_of_getting_started_runs_as_written():
    """The library snippet a new user copies first: extracted from the page and run in a fresh process."""
    import re

    from conftest import run_python

    text = open(os.path.join(REPO, "docs", "getting-started.md"), encoding="utf-8").read()
    section = text[text.index("## Mixed precision in your own loop"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = run_python(code).stdout.strip().splitlines()[-1].split()
    name, loss, skipped = out[0], float(out[2]), out[4]
    assert name in ("float32", "amp-bfloat16", "float16") and loss == loss and 0 < loss < 10 and skipped == "False"


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
