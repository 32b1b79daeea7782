"""The loss scaler as a state machine."""
import json

from mxfp16 import LossScaleDivergedError, LossScaler, make_loss_scaler, resolve_precision

import pytest


def _expected_scale(outcomes, init, growth, backoff, interval, lo=1.0, hi=2.0 ** 24):
    """init * growth**k * backoff**j, counting k growths and j back-offs independently."""
    scale, clean = init, 0
    for overflow in outcomes:
        if overflow:
            scale, clean = max(scale * backoff, lo), 0
        else:
            clean += 1
            if clean == interval:
                scale, clean = min(scale * growth, hi), 0
    return scale


def test_exact_trajectory():
    outcomes = [False] * 3 + [True] + [False] * 2 + [True, True] + [False] * 7 + [True] + [False] * 3
    scaler = LossScaler(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    skipped = [scaler.update(o) for o in outcomes]
    assert skipped == outcomes
    assert scaler.skipped_steps == sum(outcomes) == 4
    # Growths: after steps 3, 11, 14 and 20; back-offs: 4 -> 1024 * 2**4 * 0.5**4.
    assert scaler.scale == _expected_scale(outcomes, 1024.0, 2.0, 0.5, 3) == 1024.0 * 2 ** 4 * 0.5 ** 4
    assert list(scaler.history) == [_expected_scale(outcomes[:i + 1], 1024.0, 2.0, 0.5, 3)
                                    for i in range(len(outcomes))]


def test_hysteresis_tolerates_overflows_before_backing_off():
    scaler = LossScaler(init_scale=256.0, hysteresis=3, growth_interval=100)
    assert [scaler.update(True) for _ in range(2)] == [True, True]
    assert scaler.scale == 256.0            # two overflows tolerated (both skipped)
    scaler.update(True)
    assert scaler.scale == 128.0            # the third backs off
    scaler.update(False)                    # a clean step resets the tolerance
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 128.0


def test_clamped_to_min_and_max():
    scaler = LossScaler(init_scale=4.0, min_scale=2.0, max_scale=16.0, growth_interval=1, max_overflows_at_min=10)
    for _ in range(5):
        scaler.update(False)
    assert scaler.scale == 16.0
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 2.0


def test_diverged_error_at_minimum():
    scaler = LossScaler(init_scale=4.0, min_scale=1.0, max_overflows_at_min=5)
    # 2 overflows to reach 1.0, then 5 more at the floor.
    for _ in range(2 + 4):
        scaler.update(True)
    with pytest.raises(LossScaleDivergedError, match="diverged"):
        scaler.update(True)


def test_static_scale_never_moves_but_skips_and_diverges():
    scaler = make_loss_scaler(resolve_precision("float32", "cpu"), "128", max_overflows_at_min=3)
    assert not scaler.dynamic and scaler.scale == 128.0
    assert scaler.update(True) and scaler.scale == 128.0
    for _ in range(1000):
        scaler.update(False)
    assert scaler.scale == 128.0
    scaler.update(True)
    scaler.update(True)
    with pytest.raises(LossScaleDivergedError):
        scaler.update(True)


def test_state_dict_round_trip_is_plain_json():
    a = LossScaler(init_scale=512.0, growth_interval=2, hysteresis=2)
    for o in [False, True, True, False, False, False, True]:
        a.update(o)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["version"] == LossScaler.STATE_VERSION
    b = LossScaler()
    b.load_state_dict(state)
    assert (b.scale, b.skipped_steps, b.steps, b.hysteresis, b.growth_interval) == \
        (a.scale, a.skipped_steps, a.steps, 2, 2)
    # Both continue identically.
    for o in [False, False, True, True, False, False]:
        assert a.update(o) == b.update(o)
        assert a.scale == b.scale
    with pytest.raises(ValueError, match="version"):
        b.load_state_dict(dict(state, version=99))


def test_disabled_is_a_no_op():
    scaler = LossScaler(enabled=False)
    assert scaler.scale == 1.0 and not scaler.checks_overflow
    assert scaler.update(True) is False
    assert (scaler.steps, scaler.skipped_steps, len(scaler.history)) == (0, 0, 0)


def test_precision_defaults_and_bad_settings():
    fp16 = resolve_precision("float16", "cpu", allow_cpu_float16=True)
    bf16 = resolve_precision("amp-bfloat16", "gpu:0")  # the default follows the precision, not the device
    assert make_loss_scaler(fp16).dynamic and make_loss_scaler(fp16).enabled
    assert not make_loss_scaler(bf16).enabled
    assert not make_loss_scaler(fp16, "none").enabled
    for bad in ("huge", "-4", "0.0", "inf"):
        with pytest.raises(ValueError):
            make_loss_scaler(fp16, bad)


def test_the_precision_is_settled_by_a_method_and_not_assigned_from_outside():
    float32, bf16 = resolve_precision("float32", "cpu"), resolve_precision("amp-bfloat16", "gpu:0")
    scaler = make_loss_scaler(float32, growth_interval=3)
    scaler.update(overflow=False)
    before = scaler.state_dict()
    assert scaler.precision is float32
    with pytest.raises(AttributeError):
        scaler.precision = bf16
    scaler.settle_precision(bf16)
    assert scaler.precision is bf16 and scaler.state_dict() == before  # the scale and its record stay
    with pytest.raises(TypeError, match="resolved mxfp16.Precision"):
        scaler.settle_precision("amp-bfloat16")
    assert scaler.precision is bf16 and LossScaler().precision is None


def test_one_parser_for_the_setting_and_the_trainer_agrees():
    from mxfp16.scaler import parse_loss_scale
    from mxfp16.train import ConfigError, TrainConfig

    assert [parse_loss_scale(v) for v in (None, "dynamic", " Off ", "none", "1024", 512)] == \
        [None, "dynamic", "none", "none", 1024.0, 512.0]
    for bad in ("0", 0, "nan", "-inf", "big", True):
        with pytest.raises(ValueError, match="positive number"):
            parse_loss_scale(bad)
        with pytest.raises(ConfigError, match="positive number"):
            TrainConfig(loss_scale=bad).resolve()


@pytest.mark.parametrize("kwargs", [dict(init_scale=float("nan")), dict(min_scale=float("nan")),
                                    dict(max_scale=float("inf")), dict(init_scale=0), dict(dynamic="no"),
                                    dict(enabled="false"), dict(growth_interval=2.5), dict(hysteresis=True)])
def test_settings_that_make_no_sense_are_refused(kwargs):
    with pytest.raises(ValueError):
        LossScaler(**kwargs)


@pytest.mark.parametrize("field, value", [("scale", -5), ("scale", 0), ("scale", float("nan")), ("scale", "1024"),
                                          ("enabled", "false"), ("dynamic", 1), ("steps", -1), ("skipped_steps", 1.5),
                                          ("last_step_skipped", "no"), ("init_scale", float("nan"))])
def test_a_damaged_state_is_refused_and_changes_nothing(field, value):
    scaler = LossScaler(init_scale=256.0)
    scaler.update(overflow=True)
    before = scaler.state_dict()
    with pytest.raises(ValueError):
        LossScaler().load_state_dict(dict(before, **{field: value}))
    target = LossScaler(init_scale=8.0)
    with pytest.raises(ValueError):
        target.load_state_dict(dict(before, **{field: value}))
    assert target.scale == 8.0 and target.steps == 0  # nothing half-applied


def test_make_trainer_wants_a_resolved_precision():
    from mxfp16 import make_trainer
    from mxfp16.models import elementwise_mlp

    net = elementwise_mlp(2, [4], 2)
    net.initialize()
    with pytest.raises(TypeError, match=r"resolve_precision\('float16', ctx\)"):
        make_trainer(net.collect_params(), "sgd", {}, "float16")


def test_skipped_steps_are_recorded_once_by_step_and_survive_the_state():
    scaler = LossScaler(init_scale=8.0, growth_interval=100)
    for overflow in (False, True, False, False, True):
        scaler.update(overflow)
    assert scaler.skipped_at == [2, 5] and scaler.skipped_steps == 2
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert (again.skipped_at, again.skipped_steps) == ([2, 5], 2)
    old = {k: v for k, v in scaler.state_dict().items() if k != "skipped_at"}  # written before skipped_at existed
    again.load_state_dict(old)
    assert (again.skipped_at, again.skipped_steps) == ([], 2)
    again.update(True)
    assert (again.skipped_at, again.skipped_steps) == ([6], 3)
    for bad in ([2], [2, 9], [0, 5], "2,5"):
        state = dict(scaler.state_dict(), skipped_at=bad)
        with pytest.raises(ValueError, match="skipped_at"):
            LossScaler().load_state_dict(state)
