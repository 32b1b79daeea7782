"""The figure check: quoted figures and tables against their recorded sources; untagged measurements flagged."""
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("figures", Path(REPO) / "docs" / "hooks" / "figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


@pytest.fixture
def sources(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.json").write_text(json.dumps(
        {"speedup": {"amp-bfloat16 vs float32, bs16": {"speedup": 1.9312}}, "results": [{"images_per_second": 12.44}]}))
    registry = {
        "speedup": {"file": "bench/bench.json", "path": "speedup[amp-bfloat16 vs float32, bs16].speedup",
                    "format": "{:.2f}x"},
        "bf16_ips": {"file": "bench/bench.json", "path": "results.0.images_per_second", "format": "{:.1f} img/s"},
        "rows": {"table": [["precision", "img/s"], ["amp-bfloat16", {"fig": "bf16_ips"}]]},
    }
    return registry, tmp_path


def check(text, sources):
    registry, results = sources
    return figures.problems([(Path("page.md"), text)], registry, results)


def test_a_matching_figure_and_table_pass(sources):
    text = ("bfloat16 runs <!-- fig speedup -->**1.93x**<!-- /fig --> float32.\n\n<!-- table rows -->\n"
            "| precision | img/s |\n|---|---|\n| amp-bfloat16 | 12.4 img/s |\n<!-- /table -->\n")
    assert check(text, sources) == []


def test_a_stale_figure_an_unknown_name_and_a_stale_table_fail(sources):
    found = check("<!-- fig speedup -->1.96x<!-- /fig --> and <!-- fig nothing -->2x<!-- /fig -->\n"
                  "<!-- table rows -->\n| precision | img/s |\n|---|---|\n| amp-bfloat16 | 99 |\n<!-- /table -->",
                  sources)
    assert any("quotes '1.96x', its source says '1.93x'" in p for p in found)
    assert any("'nothing' has no source" in p for p in found)
    assert any("table rows differs" in p for p in found)


def test_untagged_measurements_are_flagged_but_quotes_and_code_are_not(sources):
    found = check("It ran 1.46x faster at 208.6 img/s and ended 0.67 points lower (0.9667).", sources)
    assert len(found) == 4 and all("names no source" in p for p in found)
    assert check("<!-- quoted arXiv:1710.03740 -->ResNet-50: 76.04% mixed, 1.62x<!-- /quoted --> and "
                 "`--lr 0.1` with ```\nmxfp16 bench  # 2.0x\n``` and epoch-0003", sources) == []


def test_a_cell_of_parts_joins_its_figures_and_text(sources):
    registry, results = sources
    registry = dict(registry, joined={"table": [["both"], [[{"fig": "bf16_ips"}, " (", {"fig": "speedup"}, ")"]]]})
    assert figures.table("joined", registry, results).splitlines()[-1] == "| 12.4 img/s (1.93x) |"
    results.joinpath("bench", "bench.json").write_text(json.dumps(
        {"speedup": {"amp-bfloat16 vs float32, bs16": {"speedup": 1.5}}, "results": [{"images_per_second": 12.44}]}))
    assert figures.table("joined", registry, results).splitlines()[-1] == "| 12.4 img/s (1.50x) |"


def test_rewrite_refreshes_every_span(sources):
    registry, results = sources
    text = "x <!-- fig speedup -->1.50x<!-- /fig -->\n<!-- table rows -->\nold\n<!-- /table -->\n"
    new = figures.rewrite(text, registry, results)
    assert "<!-- fig speedup -->1.93x<!-- /fig -->" in new and "| amp-bfloat16 | 12.4 img/s |" in new
    assert figures.problems([(Path("p.md"), new)], registry, results) == []


def test_every_figure_in_the_repository_matches_its_recorded_source_or_names_one():
    """The README, docs/*.md and notebook markdown: every span matches docs/results, nothing measured stands bare."""
    found = figures.problems()
    assert not found, "\n".join(found)
    assert figures.registry(), "docs/results/figures.json is missing"
