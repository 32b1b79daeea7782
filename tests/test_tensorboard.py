"""TensorBoard events from a loop of one's own and from ``mxfp16 train``, read back with TensorBoard's own reader.

The Estimator's events are checked in tests/test_estimator.py. float32 and float16 (the elementwise MLP with
``allow_cpu_float16``) run in this process: neither switches AMP on.
"""
import json
from pathlib import Path
from types import SimpleNamespace

import mxfp16
from mxfp16.cli import main
from mxfp16.models import elementwise_mlp
from mxfp16.train import Progress, TrainConfig
from mxfp16.train.callbacks import open_tensorboard, tensorboard_folder
from mxfp16.train.outputs import RunOutputs

import mxnet as mx
import numpy as np
import pytest
from fault_injection import environment
from mxnet import gluon
from train_support import QUICK, metrics, ok, run_train, tiny_dataset

pytest.importorskip("tensorboardX")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

STEP_TAGS = {"train/loss", "train/lr", "precision/loss_scale", "precision/skipped_steps", "speed/images_per_second"}


def _events(folder):
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    events.Reload()
    return events


def _scalars(events):
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


class _InfAt:
    def __init__(self, step):
        self.step, self.calls, self.base = step, 0, gluon.loss.SoftmaxCrossEntropyLoss()

    def __call__(self, out, y):
        self.calls += 1
        return self.base(out, y) * (float("inf") if self.calls == self.step else 1.0)


def _own_loop(precision, logdir, steps=5, inf_at=3):
    """A loop of one's own with the logger: every step logged, then the epoch, the gradients and the config."""
    mp = mxfp16.MixedPrecision(precision, "cpu", allow_cpu_float16=True, loss_scale="dynamic",
                               init_scale=2.0 ** 10, growth_interval=1000)
    mx.random.seed(0)
    net = elementwise_mlp(2, [8], 2, batchnorm=False)
    net.initialize(mx.init.Xavier(), ctx=mp.ctx)
    trainer = mp.prepare(net, "sgd", {"learning_rate": 0.05})
    rng = np.random.RandomState(0)
    loss_fn, seen = _InfAt(inf_at), []
    with mxfp16.TensorBoardLogger(logdir) as tb:
        for step in range(1, steps + 1):
            x = mx.nd.array(rng.uniform(-1, 1, (16, 2)))
            y = mx.nd.array(rng.randint(0, 2, 16))
            result = mp.train_step(net, loss_fn, trainer, *mp.cast_batch(x, y))
            tb.log_step(step, result, mp, trainer)
            seen.append((result.skipped, None if result.skipped else result.loss.item(), mp.scaler.scale))
        tb.log_epoch(steps, {"val_top1": 0.75, "train_loss": float("nan"), "name with spaces": 2})
        tb.log_gradients(net, steps, result.loss_scale)
        tb.log_config({"precision": precision})
    grads = {name: p.grad().asnumpy().astype(np.float64) / result.loss_scale
             for name, p in net.collect_params().items()}
    return seen, grads, net.prefix


@pytest.fixture(scope="module")
def own_loops(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard")
    return {precision: (root / precision, *_own_loop(precision, root / precision)) for precision in
            ("float32", "float16")}


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_a_loop_of_ones_own_reads_back_step_by_step(own_loops, precision):
    folder, seen, _, _ = own_loops[precision]
    scalars = _scalars(_events(folder))
    assert [s for s, (skipped, _, _) in enumerate(seen, 1) if skipped] == [3]
    assert scalars["train/loss"] == {s: pytest.approx(loss, rel=1e-6) for s, (skipped, loss, _) in enumerate(seen, 1)
                                     if not skipped}
    assert scalars["precision/loss_scale"] == {s: scale for s, (_, _, scale) in enumerate(seen, 1)}
    assert scalars["precision/loss_scale"][5] == 2.0 ** 9  # backed off once, at the overflow
    assert scalars["precision/skipped_steps"] == {1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert scalars["train/lr"] == {s: pytest.approx(0.05) for s in range(1, 6)}
    assert sorted(scalars["speed/images_per_second"]) == [2, 3, 4, 5] and min(
        scalars["speed/images_per_second"].values()) > 0
    # The epoch's numbers under epoch/, a NaN left out, spaces made tag-safe.
    assert scalars["epoch/val_top1"] == {5: 0.75} and scalars["epoch/name_with_spaces"] == {5: 2}
    assert "epoch/train_loss" not in scalars


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_the_gradient_histograms_count_the_binary_exponents(own_loops, precision):
    """Against numpy float64: log2 of every non-zero gradient, unscaled, floored, counted."""
    folder, _, grads, prefix = own_loops[precision]
    events = _events(folder)
    everything = np.concatenate([g.ravel() for g in grads.values()])
    nonzero = np.abs(everything[(everything != 0) & np.isfinite(everything)])
    exponents, counts = np.unique(np.floor(np.log2(nonzero)).astype(int), return_counts=True)
    histogram = events.Histograms("gradients/all")[-1].histogram_value
    assert histogram.num == len(nonzero) and histogram.max - histogram.min == len(histogram.bucket)
    got = {int(limit) - 1: count for limit, count in zip(histogram.bucket_limit, histogram.bucket) if count}
    expected = dict(zip(exponents.tolist(), counts.tolist()))
    # A magnitude within a float32 rounding of 2**k may land in the binade beside it: at most one such here.
    moved = sum(abs(got.get(k, 0) - expected.get(k, 0)) for k in set(got) | set(expected))
    assert moved <= 2, (got, expected)
    assert min(got) - 1 <= exponents.min() and max(got) + 1 >= exponents.max()
    zeros = _scalars(events)["gradients/zero_fraction"][5]
    assert zeros == pytest.approx(np.mean(everything == 0), abs=1e-7)
    # One histogram per parameter, named without the network's per-process prefix.
    names = {name[len(prefix):] for name in grads}
    assert set(events.Tags()["histograms"]) == {"gradients/all"} | {f"gradients/{n}" for n in names}


def test_the_tags_do_not_depend_on_the_precision(own_loops):
    tags = {}
    for precision, (folder, *_) in own_loops.items():
        found = _events(folder).Tags()
        tags[precision] = (set(found["scalars"]), set(found["histograms"]), set(found["tensors"]))
    assert tags["float32"] == tags["float16"]
    assert STEP_TAGS <= tags["float32"][0] and "config/text_summary" in tags["float32"][2]


def test_a_restarted_writer_hides_what_the_run_logged_after_its_checkpoint(tmp_path):
    """``mxfp16 train --resume`` logs from its checkpoint's step again: the steps logged after it are purged."""
    config = TrainConfig(out=str(tmp_path / "run"))
    outputs = RunOutputs(config.out)
    parts = SimpleNamespace(scaler=SimpleNamespace(scale=1.0))
    run = SimpleNamespace(config=config, outputs=outputs, parts=parts, cluster=SimpleNamespace(rank=0, num_workers=1),
                          progress=Progress())
    with open_tensorboard(run) as board:  # the first run: steps 1..6, a checkpoint at 4, then a crash
        for step in range(1, 7):
            board.logger.log_training(step, loss=float(step))
    run.progress = Progress(epoch=1, global_step=4)
    with open_tensorboard(run) as board:  # resumed at the checkpoint
        for step in range(5, 8):
            board.logger.log_training(step, loss=10.0 * step)
    assert _scalars(_events(tmp_path / "run" / "tensorboard"))["train/loss"] == {
        1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 50.0, 6: 60.0, 7: 70.0}
    run.progress = Progress()
    with open_tensorboard(run) as board:  # started again from nothing (say --overwrite): all of it goes
        board.logger.log_training(1, loss=-1.0)
    assert _scalars(_events(tmp_path / "run" / "tensorboard"))["train/loss"] == {1: -1.0}


def test_where_the_events_go(tmp_path):
    out = str(tmp_path / "run")
    assert tensorboard_folder(TrainConfig(out=out)) == Path(out) / "tensorboard"
    assert tensorboard_folder(TrainConfig(out=out, tensorboard_dir="tb/f32")) == Path("tb/f32")
    assert tensorboard_folder(TrainConfig(out=out, tensorboard_dir="tb/f32", tensorboard=False)) is None
    # --overwrite removes the replaced run's events with its other files.
    events = Path(out) / "tensorboard" / "events.out.tfevents.1.host"
    events.parent.mkdir(parents=True)
    events.write_bytes(b"")
    (Path(out) / "notes.txt").write_text("mine")
    RunOutputs(out).remove_run()
    assert sorted(p.name for p in Path(out).iterdir()) == ["notes.txt"]


def test_tensorboard_inside_the_data_set_is_refused(tmp_path, capsys):
    data = tiny_dataset(tmp_path)
    code = main(["train", "--data-dir", str(data), "--out", str(tmp_path / "run"), "--precision", "float32",
                 "--tensorboard", str(data / "train" / "tb"), *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and "--tensorboard" in err and "sits inside the data set" in err and "Traceback" not in err
    assert not (data / "train" / "tb").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_mxfp16_train_writes_events_that_match_its_metrics(tmp_path):
    data = tiny_dataset(tmp_path)
    out = tmp_path / "run"
    proc = ok(run_train("--data-dir", data, "--out", out, "--precision", "float32", "--loss-scale", "dynamic",
                        "--epochs", 2, "--max-batches", 3, "--log-every", 2, *QUICK, env=environment(overflow_step=2)))
    assert f"tensorboard: events in {out / 'tensorboard'}" in proc.stdout
    events = _events(out / "tensorboard")
    scalars = _scalars(events)
    records = metrics(out)
    assert STEP_TAGS <= set(scalars)
    for name in ("val_top1", "train_top1", "train_loss", "images_per_second", "skipped_steps"):
        assert scalars[f"epoch/{name}"] == {3: pytest.approx(records[0][name]), 6: pytest.approx(records[1][name])}
    # Read every --log-every steps and at each epoch's end; step 2 overflowed (injected) and was skipped.
    assert sorted(scalars["train/loss"]) == [2, 3, 5, 6]
    assert scalars["precision/skipped_steps"] == {2: 1, 3: 1, 5: 1, 6: 1}
    assert scalars["precision/loss_scale"][2] == 2.0 ** 15
    # Each read's loss is the mean over its window's updating steps: together they make the epoch's train_loss.
    loss = scalars["train/loss"]
    assert (loss[2] + loss[3]) / 2 == pytest.approx(records[0]["train_loss"], rel=1e-5)  # steps 1 | 3
    assert (2 * loss[5] + loss[6]) / 3 == pytest.approx(records[1]["train_loss"], rel=1e-5)  # steps 4, 5 | 6
    assert scalars["train/lr"][6] == pytest.approx(records[1]["lr"], abs=1e-9)
    histograms = events.Tags()["histograms"]
    assert "gradients/all" in histograms and len(histograms) > 10
    assert not any(tag.startswith("gradients/cifarresnet") for tag in histograms)  # no per-process prefix
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(config.strip("`\n")) == json.loads((out / "config.json").read_text())
