"""The helpers the notebooks share: the spirals data and the command runner."""
from mxfp16 import __version__
from mxfp16.data.spirals import spirals
from mxfp16.tutorial import mxfp16_command

import numpy as np
import pytest


def test_spirals_are_balanced_shuffled_and_lie_on_their_arms():
    points, labels, radius = spirals(300, classes=3, turns=1.0, noise=0.0, seed=4, return_radius=True)
    assert points.shape == (300, 2) and points.dtype == np.float32 and labels.dtype == np.float32
    assert np.bincount(labels.astype(int)).tolist() == [100, 100, 100]
    assert np.any(np.diff(labels) < 0)   # shuffled, not in class order
    # Independent check in float64: each point sits at its radius, at its arm's angle (no noise here).
    np.testing.assert_allclose(np.hypot(points[:, 0], points[:, 1]), radius, rtol=1e-6)
    angle = labels.astype(np.float64) * 2 * np.pi / 3 + radius * 2 * np.pi
    np.testing.assert_allclose(points, np.stack([radius * np.sin(angle), radius * np.cos(angle)], 1), atol=1e-6)


def test_spirals_depend_only_on_their_arguments():
    a, b = spirals(120, seed=7), spirals(120, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(spirals(120, seed=8)[0], a[0])
    assert len(spirals(120)) == 2
    with pytest.raises(ValueError, match="one point per class"):
        spirals(2, classes=3)


def test_the_command_runs_in_its_own_process_and_prints_its_tail(capsys):
    result = mxfp16_command("--version", show=1)
    assert result.stdout.strip() == f"mxfp16 {__version__}" and result.seconds > 0
    assert capsys.readouterr().out.splitlines() == ["$ mxfp16 --version", f"mxfp16 {__version__}"]


def test_a_result_left_as_a_cells_value_does_not_print_the_output_again():
    from mxfp16.tutorial import CommandResult
    result = CommandResult("first line\n\nsecond line\n" + "x" * 5000, "", 12.34)
    assert repr(result) == "CommandResult(3 lines of output, 12.3 s)"
    assert result.stdout.startswith("first line")       # the fields are still there


def test_a_failing_command_raises_with_its_error(capsys):
    with pytest.raises(RuntimeError, match=r"exited with status 2:(.|\n)*invalid choice"):
        mxfp16_command("no-such-command")


def test_recorded_results_are_read_from_the_checkout():
    import json
    import os

    from mxfp16.tutorial import recorded_result, recorded_results_folder

    from conftest import REPO
    assert os.path.samefile(recorded_results_folder(), os.path.join(REPO, "docs", "results"))
    with open(os.path.join(REPO, "docs", "results", "bench-r50-224-peer", "bench.json")) as handle:
        assert recorded_result("bench-r50-224-peer/bench.json") == json.load(handle)
    assert recorded_result("no-such-result/bench.json") is None


def test_the_recorded_headline_ratios_are_the_rounds_of_each_bench_json():
    import json
    import os
    import statistics

    from mxfp16.tutorial.records import HEADLINE_RECORDS, recorded_headline_ratios

    from conftest import REPO
    recorded = recorded_headline_ratios()
    assert [r.folder for r in recorded] == [folder for folder, _ in HEADLINE_RECORDS]
    for ratio in recorded:
        with open(os.path.join(REPO, "docs", "results", ratio.folder, "bench.json")) as handle:
            document = json.load(handle)
        rows = {r["precision"]: r for r in document["results"]
                if r["framework"] == "mxfp16" and r["batch_size"] == 16}
        # Each round's ratio straight from the raw per-round images/s, and the median of them.
        expected = [m["images_per_second"] / f["images_per_second"]
                    for m, f in zip(rows["amp-bfloat16"]["rounds"], rows["float32"]["rounds"])]
        assert len(expected) == 3 and ratio.rounds == pytest.approx(expected)
        assert ratio.speedup == pytest.approx(statistics.median(expected))
        assert ratio.load_start == document["config"]["load_average_start"][0]
    amd, intel = recorded
    assert amd.cpu.startswith("AMD EPYC (Zen 5 VM") and "Emerald Rapids" in intel.cpu and "amx_bf16" in intel.cpu
