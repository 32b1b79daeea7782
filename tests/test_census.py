"""The kernel census of `mxfp16 bench`: which kind of oneDNN kernel a step's time ran in.

Read from a recorded oneDNN 2.4.4 log (tests/data/dnnl-census.log: amp-bfloat16 steps of a small network on a
Zen 4, and four AMX lines written by hand in the same format; tests/data/README.md says which), and from a real
short bench run, whose census must agree with what mxfp16 says of this CPU.
"""
import csv
import json
import os

from mxfp16.bench import census
from mxfp16.bench.census import ExecLine, classify, exec_lines, isa_line, summarise
from mxfp16.cli import main

import pytest
from conftest import BFLOAT16, CPU_MIXED, REPO

LOG_PATH = os.path.join(REPO, "tests", "data", "dnnl-census.log")
with open(LOG_PATH, encoding="utf-8") as _handle:
    LOG = _handle.read().splitlines()
#: The hand-written AMX lines' times (ms), by pass.
AMX_MS = {"backward_weights": 40.0, "backward_data": 30.0, "forward_training": 30.0}


def _line(impl, dtype="bf16", primitive="convolution", prop="forward_training"):
    return ExecLine(primitive, impl, prop, dtype, "mb16_ic64oc64", 1.0)


def test_only_execution_lines_are_read():
    execs = exec_lines(LOG)
    assert len(execs) == sum(1 for line in LOG if line.startswith("dnnl_verbose,exec,"))  # info, comments: no
    first = next(e for e in execs if e.primitive == "rnn")
    assert (first.implementation, first.prop_kind, first.dtype) == ("ref:any", "forward_training", "f32")
    assert first.problem.startswith("l1t8mb4") and first.ms > 0
    assert isa_line(LOG) == "Intel AVX-512 with Intel DL Boost and bfloat16 support"
    assert exec_lines(["dnnl_verbose,exec,cpu,eltwise,jit:uni,forward_training,data_f32::blocked:a:f0,,,4,0.0x",
                       "dnnl_verbose,create:cache_miss,cpu,convolution,jit:avx2,forward_training,,,,mb16,0.2"]) == []


@pytest.mark.parametrize("impl, dtype, primitive, expected", [
    ("jit:avx512_core_amx_bf16", "bf16", "convolution", "amx"),
    ("brgconv:avx512_core_amx_bf16", "bf16", "convolution", "amx"),
    ("jit_1x1:avx512_core_amx_bf16", "bf16", "convolution", "amx"),
    ("jit_bf16:avx512_core_bf16", "bf16", "convolution", "avx512_bf16"),
    ("jit:avx512_core_bf16", "bf16", "eltwise", "avx512_bf16"),
    ("bnorm_jit:avx512_core_bf16", "bf16", "batch_normalization", "avx512_bf16"),
    ("x64:gemm:jit", "bf16", "inner_product", "bf16_other"),  # the bfloat16 GEMM names no ISA
    ("jit_bf16:avx512_core", "bf16", "convolution", "bf16_other"),  # bfloat16 emulated with AVX-512
    ("jit:avx512_common", "f32", "softmax", "float32"),
    ("x64:gemm:jit", "f32", "inner_product", "float32"),
    ("ref:any", "f32", "rnn", "float32"),  # oneDNN's RNN, however it computes; MXNet's fused LSTM's, float32 always
    ("ref:any", "bf16", "rnn", "bf16_other"),
    ("bnorm_ref:any", "bf16", "batch_normalization", "reference"),
    ("ncsp_bnorm:any", "bf16", "batch_normalization", "reference"),
    ("simple:any", "f32", "concat", "reference"),
    ("gemm:ref", "f32", "inner_product", "reference"),
    ("jit:uni", "bf16", "reorder", "reorder"),
    ("simple:any", "f32", "reorder", "reorder"),  # a reorder is a reorder, whatever its kernel
    ("jit:avx512_core_vnni", "s8", "convolution", "other"),
])
def test_each_implementation_is_filed_under_its_class(impl, dtype, primitive, expected):
    assert classify(_line(impl, dtype, primitive)) == expected


#: oneDNN 2.4.4's ISA lines: a Xeon where it may use AMX (bfloat16 and int8), and one capped at AMX int8.
AMX_ISA = ("Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and 8-bit integer "
           "support")
AMX_INT8_ISA = "Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX with 8-bit integer support"
GEMM = ("dnnl_verbose,exec,cpu,inner_product,x64:gemm:jit,{},src_{}::blocked:ab:f0 wei_{}::blocked:ab:f0,,,"
        "mb1120ic650oc10000,{}")


@pytest.mark.parametrize("isa, dtype, expected", [
    (AMX_ISA, "bf16", "amx"),  # oneDNN 2.4.4 builds its bfloat16 GEMM from AMX kernels where it may use them
    (AMX_INT8_ISA, "bf16", "bf16_other"),
    ("Intel AVX-512 with Intel DL Boost and bfloat16 support", "bf16", "bf16_other"),
    (None, "bf16", "bf16_other"),  # not known: what the name says
    (AMX_ISA, "f32", "float32"),
])
def test_the_bfloat16_gemm_counts_as_amx_where_the_isa_line_says_onednn_may_use_it(isa, dtype, expected):
    assert classify(_line("x64:gemm:jit", dtype, "inner_product"), isa) == expected
    assert classify(_line("ref:any", dtype, "rnn", "backward"), isa) == expected  # the RNN multiplies in that GEMM


def test_the_isa_comes_from_the_log_or_from_the_caller_for_a_window_of_it():
    info = f"dnnl_verbose,info,cpu,isa:{AMX_ISA}"
    window = [GEMM.format("forward_training", "bf16", "bf16", 30.0), GEMM.format("backward_data", "bf16", "bf16", 20.0),
              GEMM.format("forward_training", "f32", "f32", 10.0)]
    assert summarise([info] + window)["ms_per_step_by_class"]["amx"] == pytest.approx(50.0)
    assert summarise(window)["ms_per_step_by_class"]["bf16_other"] == pytest.approx(50.0)
    assert summarise(exec_lines(window), isa=AMX_ISA)["ms_per_step_by_class"]["amx"] == pytest.approx(50.0)


def test_the_census_child_reads_the_isa_printed_before_its_window(monkeypatch):
    # oneDNN prints its ISA line once, when the first primitive is made: in the warm-up, before the census window.
    from types import SimpleNamespace

    from mxfp16.bench import census_run, runner
    from mxfp16.plumbing.child import call_in_child

    printed = []

    def step():
        lines = ([f"dnnl_verbose,info,cpu,isa:{AMX_ISA}"] if not printed else []) + [
            GEMM.format("forward_training", "bf16", "bf16", 30.0)]
        printed.append(len(lines))
        os.write(1, ("\n".join(lines) + "\n").encode())

    monkeypatch.setattr(runner, "build_step", lambda spec: (step,))
    record, problem = call_in_child(census_run.census_of, SimpleNamespace(warmup=1), fork=True)
    assert problem is None and record["isa"] == AMX_ISA
    assert record["percent"]["amx"] == pytest.approx(100.0) and record["steps"] == census_run.CENSUS_STEPS


def test_the_data_type_is_bfloat16_where_any_descriptor_is():
    pooling = exec_lines(["dnnl_verbose,exec,cpu,pooling_v2,jit:avx512_core,forward_training,src_bf16::blocked:abcd:f0"
                          " dst_bf16::blocked:abcd:f0 ws_u8::blocked:abcd:f0,,alg:pooling_max,mb4ic8,0.5",
                          "dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:a:f0 dst_bf16::blocked:a:f0,"
                          ",,10,0.1"])
    assert [line.dtype for line in pooling] == ["bf16", "bf16"]


def test_the_recorded_log_shares_sum_to_100_in_total_and_in_every_pass():
    summary = summarise(LOG, steps=3)
    assert sum(summary["percent"].values()) == pytest.approx(100.0)
    assert set(summary["percent"]) == set(census.CLASSES)
    assert summary["ms_per_step"] == pytest.approx(sum(e.ms for e in exec_lines(LOG)) / 3)
    assert sum(summary["ms_per_step_by_class"].values()) == pytest.approx(summary["ms_per_step"])
    assert sum(p["percent_of_total"] for p in summary["passes"].values()) == pytest.approx(100.0)
    for entry in summary["passes"].values():
        assert sum(entry["percent"].values()) == pytest.approx(100.0)
    assert set(summary["passes"]) == {"forward_training", "backward_data", "backward_weights", "backward", "none"}
    assert summary["passes"]["none"]["percent"]["reorder"] == pytest.approx(100.0)  # reorders have no pass


def test_the_amx_lines_count_as_amx_and_the_rest_as_this_zen4_ran_them():
    summary = summarise(LOG, steps=1)
    by_class = summary["ms_per_step_by_class"]
    assert by_class["amx"] == pytest.approx(sum(AMX_MS.values()))
    for name, ms in AMX_MS.items():
        entry = summary["passes"][name]
        assert entry["ms_per_step"] * entry["percent"]["amx"] / 100 == pytest.approx(ms)
    # what Zen 4 ran: native bfloat16 kernels, the bfloat16 GEMM, a float32 softmax and LSTM, reference kernels
    assert min(by_class[k] for k in ("avx512_bf16", "bf16_other", "float32", "reference", "reorder")) > 0
    assert by_class["other"] == 0
    rnn = [e for e in summary["top"] if e["primitive"] == "rnn"]
    assert rnn and all(e["class"] == "float32" and e["dtype"] == "f32" for e in rnn)


def test_the_reorders_are_grouped_by_layouts_and_shape_as_the_log_reads():
    """Against the log read with plain string operations: each reorder line's source and destination layout."""
    expected = {}
    for text in LOG:
        f = text.split(",")
        if text.startswith("dnnl_verbose,exec,") and f[3] == "reorder":
            src, dst = (md.split("::")[0].split("_")[1] + " " + md.split(":")[3] for md in f[6].split())
            key = (f"{src} -> {dst}", f[-2])
            expected[key] = expected.get(key, 0.0) + float(f[-1]) / 3
    summary = summarise(LOG, steps=3)
    found = {(e["layouts"], e["shape"]): e["ms_per_step"] for e in summary["reorder_shapes"]}
    largest = sorted(expected.items(), key=lambda item: -item[1])[:len(found)]
    assert len(found) == min(8, len(expected)) and found == pytest.approx(dict(largest))
    assert ("f32 abcd -> bf16 abcd", "4x3x16x16") in found  # the batch cast to bfloat16: a reorder in oneDNN
    by_layouts = {}
    for (layouts, _), ms in expected.items():
        by_layouts[layouts] = by_layouts.get(layouts, 0.0) + ms
    found = {e["layouts"]: e["ms_per_step"] for e in summary["reorders"]}
    assert found == pytest.approx(dict(sorted(by_layouts.items(), key=lambda item: -item[1])[:8]))
    shares = sum(e["percent"] for e in summary["reorders"])  # the 8 largest of the log's 12 groups
    assert summary["percent"]["reorder"] * 0.9 < shares < summary["percent"]["reorder"]
    assert census.reorder_layouts("src_bf16::blocked:aBcd16b:f0 dst_f32::blocked:abcd:f0") == \
        "bf16 aBcd16b -> f32 abcd"


def test_the_printed_census_names_the_largest_reorders_where_they_take_a_share():
    summary = summarise(LOG, steps=3)
    shown = [line for line in census.format_census("x", summary) if line.strip().startswith("reorders: ")]
    assert bool(shown) == (summary["percent"]["reorder"] >= census.REORDERS_SHOWN)
    summary["percent"]["reorder"] = census.REORDERS_SHOWN  # as a step whose reorders took that share
    (line,) = [line for line in census.format_census("x", summary) if line.strip().startswith("reorders: ")]
    first = summary["reorders"][0]
    assert line.strip().startswith(f"reorders: {first['layouts']} {first['percent']:.0f}%")


def test_the_printed_census_names_the_classes_and_the_passes():
    lines = census.format_census("amp-bfloat16 batch 4", summarise(LOG, steps=3))
    assert lines[0].startswith("amp-bfloat16 batch 4 census: ")
    for label in ("% AMX", "% avx512_bf16", "% other bf16", "% float32", "% reference", "% reorders",
                  "ms of oneDNN time per step"):
        assert label in lines[0]
    assert any(line.strip().startswith(("forward_training (", "backward (")) for line in lines[1:])
    assert lines[-1].strip().startswith(("top: ", "reorders: "))
    assert census.format_census("float32 batch 4", summarise([])) == ["float32 batch 4 census: no oneDNN primitive ran"]


@pytest.mark.slow
def test_a_real_bench_run_carries_a_census_that_matches_this_cpu(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--model", "cifar_resnet20_v1", "--image-size", "32", "--classes", "10", "--batch-sizes",
                 "4", "--precisions", CPU_MIXED, "--iters", "1", "--warmup", "0", "--repeats", "1", "--no-plots",
                 "--out", str(out)]) == 0
    row = json.loads((out / "bench.json").read_text())["results"][0]
    taken = row["census"]
    assert taken["status"] == "ok", taken
    assert taken["steps"] > 0 and taken["ms_per_step"] > 0 and taken["isa"]
    assert sum(taken["percent"].values()) == pytest.approx(100.0)
    percent = taken["percent"]
    if BFLOAT16.kind != "amx":
        assert percent["amx"] == 0
    if CPU_MIXED == "amp-bfloat16" and BFLOAT16.native:  # some bfloat16 time runs in native kernels
        assert percent["amx"] + percent["avx512_bf16"] > 0
    if not BFLOAT16.native:  # no kernel built for bfloat16 instructions the CPU lacks
        assert percent["avx512_bf16"] == 0
    if CPU_MIXED == "float32":
        assert percent["avx512_bf16"] + percent["bf16_other"] == 0
    with open(out / "bench.csv", newline="") as handle:  # the same shares, one column per class
        csv_row = next(csv.DictReader(handle))
    assert {name: float(csv_row[f"census_{name}_percent"]) for name in percent} == pytest.approx(percent, abs=1e-4)
    printed = capsys.readouterr().out
    assert any(line.startswith(CPU_MIXED) and " batch 4 census: " in line for line in printed.splitlines())
    assert "kernel census" in printed
