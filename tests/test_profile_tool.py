"""tools/profile_families.py's reading of oneDNN's verbose log: per primitive, per implementation, per convolution kind.

The profiles in docs/benchmarks.md come from this summary; a log line it misreads would move time between
kinds (depthwise, 1x1, KxK) or drop it. The lines below are oneDNN 2.4's own format (``dnnl_verbose,exec,...``,
the problem description second to last, milliseconds last).
"""
import importlib.util
import os

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("profile_families", os.path.join(REPO, "tools", "profile_families.py"))
profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile)

LOG = [
    # MobileNet v2's depthwise 3x3 (groups == channels), forward and backward-data
    "dnnl_verbose,exec,cpu,convolution,jit_dw:avx2,forward_training,src_f32::blocked:aBcd8b:f0 wei_f32::blocked:"
    "Abcde8a:f0 bia_f32::blocked:a:f0 dst_f32::blocked:aBcd8b:f0,,alg:convolution_direct,"
    "mb16_g96ic96oc96_ih112oh56kh3sh2dh0ph0_iw112ow56kw3sw2dw0pw0,1.5",
    "dnnl_verbose,exec,cpu,convolution,jit_dw:avx2,backward_data,src_f32::blocked:aBcd8b:f0 wei_f32::blocked:"
    "Abcde8a:f0 bia_undef::undef::f0 dst_f32::blocked:aBcd8b:f0,,alg:convolution_direct,"
    "mb16_g96ic96oc96_ih112oh56kh3sh2dh0ph0_iw112ow56kw3sw2dw0pw0,2.5",
    # a 1x1 projection and a 3x3 stem
    "dnnl_verbose,exec,cpu,convolution,jit_1x1:avx2,forward_training,src_f32::blocked:aBcd8b:f0,,"
    "alg:convolution_direct,mb16_ic96oc24_ih56oh56kh1sh1dh0ph0_iw56ow56kw1sw1dw0pw0,4.0",
    "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:abcd:f0,,"
    "alg:convolution_direct,mb16_ic3oc32_ih224oh112kh3sh2dh0ph1_iw224ow112kw3sw2dw0pw1,6.0",
    "dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 dst_f32::blocked:aBcd8b:f0,,,"
    "16x3x224x224,1.0",
    # not executions: a creation line, another program's output, an empty line
    "dnnl_verbose,create:cache_miss,cpu,convolution,jit:avx2,forward_training,,,,mb16_ic3oc32,0.2",
    "PROFILE-MARK start",
    "",
]


def test_each_convolution_is_filed_under_its_kind_and_pass():
    summary = profile.summarise_dnnl(LOG, steps=1)
    assert summary["convolution_ms_per_step_by_kind"] == {
        "convolution 3x3 forward_training": 6.0, "convolution 1x1 forward_training": 4.0,
        "convolution depthwise backward_data": 2.5, "convolution depthwise forward_training": 1.5}


def test_times_are_per_step_and_only_executions_count():
    summary = profile.summarise_dnnl(LOG, steps=2)
    assert summary["ms_per_step_by_primitive"] == {"convolution": 7.0, "reorder": 0.5}
    assert summary["primitive_ms_per_step"] == pytest.approx(7.5)
    assert summary["percent_by_primitive"]["convolution"] == pytest.approx(100 * 7.0 / 7.5)
    assert summary["calls_per_step_by_primitive"] == {"convolution": 2.0, "reorder": 0.5}
    assert summary["ms_per_step_by_implementation"]["convolution jit_dw:avx2 backward_data"] == 1.25


def test_an_empty_log_sums_to_nothing():
    summary = profile.summarise_dnnl([], steps=3)
    assert summary["primitive_ms_per_step"] == 0 and summary["percent_by_primitive"] == {}


def test_the_census_comes_from_the_library_reader():
    from mxfp16.bench.census import summarise

    summary = profile.summarise_dnnl(LOG, steps=1)
    assert summary["census"] == summarise(LOG, steps=1)  # one reader for the tool and mxfp16 bench
    assert summary["census"]["percent"]["float32"] == pytest.approx(100 * 14.0 / 15.0)
    assert summary["census"]["percent"]["reorder"] == pytest.approx(100 * 1.0 / 15.0)
