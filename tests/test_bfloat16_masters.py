"""Float32 master copies of bfloat16 weights (``mxfp16.optim.with_bfloat16_masters``), checked against float32.

MXNet 1.9.1's ``multi_precision`` keeps masters of float16 weights only. A bfloat16 weight's update must run on a
float32 master, exactly as the same optimizer updates a float32 weight with the same gradients; the weight is that
master rounded to bfloat16 (computed here in numpy, from the float32 bits). Only casts run in bfloat16, so this
runs on any CPU.
"""
import pickle

from mxfp16.float_formats import BFLOAT16
from mxfp16.optim import (
    OptimizerError,
    bfloat16_parameters,
    check_bfloat16_masters,
    make_trainer,
    with_bfloat16_masters,
)

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon


def round_to_bfloat16(values):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32: numpy on the bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def bf16(values):
    return mx.nd.amp_cast(mx.nd.array(values, dtype="float32"), dtype=BFLOAT16)


def as_float32(array):
    return mx.nd.amp_cast(array, dtype="float32").asnumpy()


def gradients(steps, shape, seed=0):
    """Gradients bfloat16 holds exactly (a bfloat16 gradient is cast to float32 before the update)."""
    rng = np.random.RandomState(seed)
    return [round_to_bfloat16(rng.standard_normal(shape).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("name, params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}),
    ("adam", {"learning_rate": 0.01, "beta1": 0.5}),
    ("rmsprop", {"learning_rate": 0.01}),
])
def test_a_bfloat16_weight_is_updated_through_a_float32_master_as_float32_is(name, params):
    start = round_to_bfloat16(np.random.RandomState(1).standard_normal((3, 5)).astype(np.float32))
    control_opt = mx.optimizer.create(name, rescale_grad=0.5, **params)
    opt = with_bfloat16_masters(type(control_opt))(rescale_grad=0.5, **params)
    control, weight = mx.nd.array(start), bf16(start)
    control_state = control_opt.create_state_multi_precision(0, control)
    state = opt.create_state_multi_precision(0, weight)
    for grad in gradients(4, start.shape):
        control_opt.update_multi_precision(0, control, mx.nd.array(grad), control_state)
        opt.update_multi_precision(0, weight, bf16(grad), state)
    master = state[0].asnumpy()
    assert weight.dtype == BFLOAT16 and state[0].dtype == np.float32
    np.testing.assert_array_equal(master, control.asnumpy())  # the same float32 arithmetic
    np.testing.assert_array_equal(as_float32(weight), round_to_bfloat16(master))
    assert not np.array_equal(master, start)


def test_updates_too_small_for_bfloat16_accumulate_in_the_master():
    # bfloat16 has 8 significant bits: 1 + 1e-3 rounds back to 1. A hundred such steps move the master by 0.1.
    opt = with_bfloat16_masters(mx.optimizer.SGD)(learning_rate=1e-3)
    weight = bf16(np.ones(4))
    state = opt.create_state_multi_precision(0, weight)
    alone = bf16(np.ones(4))  # what an update of the bfloat16 weight itself would hold
    for _ in range(100):
        opt.update_multi_precision(0, weight, bf16(-np.ones(4)), state)
        np.testing.assert_array_equal(as_float32(weight), round_to_bfloat16(state[0].asnumpy()))
        alone = bf16(as_float32(alone) + 1e-3)
    np.testing.assert_allclose(state[0].asnumpy(), 1.1, rtol=1e-5)
    assert as_float32(weight)[0] == 1.1015625 and as_float32(alone)[0] == 1.0  # the nearest bfloat16 to 1.1


def test_aggregated_updates_of_several_bfloat16_weights_match_float32():
    # Gluon's Trainer hands MXNet's Updater every weight at once; SGD then updates them in lists of one dtype.
    shapes = [(4,), (2, 3), (5,)]
    starts = [round_to_bfloat16(np.random.RandomState(i).standard_normal(s).astype(np.float32))
              for i, s in enumerate(shapes)]
    control_opt = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9)
    opt = with_bfloat16_masters(mx.optimizer.SGD)(learning_rate=0.05, momentum=0.9)
    assert opt.aggregate_num > 1
    controls, weights = [mx.nd.array(s) for s in starts], [bf16(s) for s in starts]
    control_update, update = mx.optimizer.get_updater(control_opt), mx.optimizer.get_updater(opt)
    for step in range(3):
        grads = [gradients(1, s, seed=10 * step + i)[0] for i, s in enumerate(shapes)]
        control_update(list(range(3)), [mx.nd.array(g) for g in grads], controls)
        update(list(range(3)), [bf16(g) for g in grads], weights)
    for control, weight in zip(controls, weights):
        np.testing.assert_array_equal(as_float32(weight), round_to_bfloat16(control.asnumpy()))


def test_float32_weights_beside_them_are_updated_as_before():
    opt, control_opt = with_bfloat16_masters(mx.optimizer.Adam)(learning_rate=0.1), mx.optimizer.Adam(learning_rate=0.1)
    weight, control = mx.nd.ones(3), mx.nd.ones(3)
    state = opt.create_state_multi_precision(0, weight)
    control_state = control_opt.create_state_multi_precision(0, control)
    assert len(state) == len(control_state) == 2  # Adam's own (mean, variance), no master copy
    opt.update_multi_precision(0, weight, mx.nd.array([1.0, -2.0, 3.0]), state)
    control_opt.update_multi_precision(0, control, mx.nd.array([1.0, -2.0, 3.0]), control_state)
    np.testing.assert_array_equal(weight.asnumpy(), control.asnumpy())
    for mine, theirs in zip(state, control_state):
        np.testing.assert_array_equal(mine.asnumpy(), theirs.asnumpy())


def test_the_class_is_made_once_and_its_instances_pickle_with_their_settings():
    cls = with_bfloat16_masters(mx.optimizer.Adam)
    assert with_bfloat16_masters(mx.optimizer.Adam) is cls and with_bfloat16_masters(cls) is cls
    assert issubclass(cls, mx.optimizer.Adam) and cls.__name__ == "Adam"
    back = pickle.loads(pickle.dumps(cls(learning_rate=0.125, beta1=0.5)))
    assert type(back) is cls and back.lr == 0.125 and back.beta1 == 0.5


def _bfloat16_parameter(name, values):
    param = gluon.Parameter(name, shape=np.shape(values))
    param.initialize(init=mx.init.Constant(0), ctx=mx.cpu())
    param.set_data(mx.nd.array(values))
    param.cast(BFLOAT16)
    return param


def test_make_trainer_gives_bfloat16_parameters_masters_and_they_travel_in_save_states(tmp_path):
    weight, bias = _bfloat16_parameter("w", np.ones((2, 2))), gluon.Parameter("b", shape=(2,))
    bias.initialize(ctx=mx.cpu())
    assert bfloat16_parameters([weight, bias]) == ["w"]
    trainer = make_trainer([weight, bias], "adam", {"learning_rate": 0.01})
    assert isinstance(trainer._optimizer, mx.optimizer.Adam)
    assert type(trainer._optimizer) is with_bfloat16_masters(mx.optimizer.Adam)
    plain = make_trainer([bias], "adam", {"learning_rate": 0.01})
    assert type(plain._optimizer) is mx.optimizer.Adam  # nothing changes without bfloat16 parameters
    given = mx.optimizer.SGD(learning_rate=0.5)
    assert type(make_trainer([weight], given)._optimizer) is with_bfloat16_masters(mx.optimizer.SGD)

    updater = trainer._updaters[0]
    updater(0, bf16(np.full((2, 2), 0.5)), weight.data())
    master = updater.states[0][0].asnumpy()
    trainer.save_states(str(tmp_path / "states"))
    fresh = make_trainer([_bfloat16_parameter("w", np.ones((2, 2))), bias], "adam", {"learning_rate": 0.01})
    fresh.load_states(str(tmp_path / "states"))
    assert type(fresh._optimizer) is with_bfloat16_masters(mx.optimizer.Adam)
    np.testing.assert_array_equal(fresh._updaters[0].states[0][0].asnumpy(), master)


@pytest.mark.parametrize("options", [{"kvstore": "dist_sync"}, {"update_on_kvstore": True}])
def test_masters_kept_on_a_kvstore_are_refused_with_the_way_out(options):
    with pytest.raises(OptimizerError, match="master copies live in this process.*update_on_kvstore unset"):
        make_trainer([_bfloat16_parameter("w", np.ones(3))], "sgd", {"learning_rate": 0.1}, **options)


def test_a_trainer_made_before_its_parameters_turned_bfloat16_is_refused_with_the_order():
    param = gluon.Parameter("w", shape=(3,))
    param.initialize(ctx=mx.cpu())
    early = make_trainer([param], "adam", {"learning_rate": 0.1})
    check_bfloat16_masters(early, [param])  # float32: nothing to refuse
    param.cast(BFLOAT16)
    with pytest.raises(OptimizerError, match="w are bfloat16, but this trainer's Adam was made before"):
        check_bfloat16_masters(early, [param])
    check_bfloat16_masters(make_trainer([param], "adam", {"learning_rate": 0.1}), [param])
