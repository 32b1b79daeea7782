"""Devices: --ctx parsed, formatted and checked once, with their own error type."""

from mxfp16.devices import DeviceError, check_devices, format_ctx, parse_ctx, parse_devices, resolve_devices
from mxfp16.machine.hardware import gpu_count
from mxfp16.precision import PrecisionError

import mxnet as mx
import pytest
from conftest import run_python


def test_parse_ctx():
    assert parse_ctx("cpu") == [mx.cpu()]
    assert parse_ctx("gpu:0,1") == [mx.gpu(0), mx.gpu(1)]
    with pytest.raises(DeviceError):
        parse_ctx("tpu")


def test_parse_devices_reads_the_text_and_counts_gpus_only_for_auto():
    def no_count():
        raise AssertionError("only 'auto' counts GPUs")

    assert parse_devices("cpu", no_count) == [("cpu", 0)]
    assert parse_devices(" GPU ", no_count) == [("gpu", 0)]
    assert parse_devices("gpu:1,3", no_count) == [("gpu", 1), ("gpu", 3)]
    assert parse_devices("auto", lambda: 0) == [("cpu", 0)]
    assert parse_devices("auto", lambda: 2) == [("gpu", 0), ("gpu", 1)]
    for bad in ("tpu", "gpu:", "gpu:x", ""):
        with pytest.raises(DeviceError, match="'auto', 'cpu'"):
            parse_devices(bad, no_count)


def test_parse_devices_does_not_load_mxnet():
    proc = run_python("""
        import sys
        from mxfp16.devices import parse_devices
        assert parse_devices("gpu:0,1") == [("gpu", 0), ("gpu", 1)]
        print("mxnet" in sys.modules)
    """)
    assert proc.stdout.strip() == "False"


def test_a_device_error_is_not_a_precision_error():
    assert not issubclass(DeviceError, PrecisionError)
    with pytest.raises(DeviceError):
        resolve_devices(f"gpu:{gpu_count()}")


def test_missing_gpus_are_refused_before_anything_is_built():
    visible = gpu_count()
    with pytest.raises(DeviceError, match=f"GPU {visible} but MXNet sees {visible} GPU"):
        check_devices([mx.gpu(visible)])
    assert check_devices([mx.cpu()]) == [mx.cpu()]
    assert resolve_devices("cpu") == [mx.cpu()]


def test_ctx_auto_is_every_visible_gpu_else_the_cpu():
    visible = gpu_count()
    expected = [mx.gpu(i) for i in range(visible)] or [mx.cpu()]
    assert parse_ctx("auto") == parse_ctx(" AUTO ") == expected
    assert format_ctx(expected) == (f"gpu:{','.join(map(str, range(visible)))}" if visible else "cpu")
    assert format_ctx(parse_ctx("gpu:0,2")) == "gpu:0,2"
    for bad in ("tpu", "gpu:", "gpu:x", ""):
        with pytest.raises(DeviceError, match="'auto', 'cpu'"):
            parse_ctx(bad)


def test_the_device_names_live_in_devices_only():
    import mxfp16.precision as precision

    for name in ("parse_ctx", "format_ctx", "as_context_list", "check_devices"):
        assert callable(getattr(__import__("mxfp16.devices").devices, name))
        assert not hasattr(precision, name), f"mxfp16.precision.{name} is an alias of mxfp16.devices.{name}"


def test_the_builder_takes_the_runs_one_set_up():
    from mxfp16.train.parts import PartsSpec, build_parts

    with pytest.raises(TypeError, match="MixedPrecision"):
        build_parts(PartsSpec(model="elementwise-mlp", classes=2, image_size=8), "float32")


def test_every_command_shares_one_ctx_help():
    from mxfp16.cli import build_parser

    parser = build_parser()
    from mxfp16.devices import CTX_HELP, ONE_DEVICE_HELP

    helps = [option.help for command in parser._subparsers._group_actions[0].choices.values()
             for option in command._actions if "--ctx" in option.option_strings]
    assert len(helps) >= 5  # train, bench, diagnose, export, predict
    assert all(h.startswith(CTX_HELP) or h.startswith(ONE_DEVICE_HELP) for h in helps), helps
