"""What the trainer refuses, and how: wrong checkpoints, float16 on CPU, divergence, bad flags, bad images."""
import json
import shutil

from mxfp16.train import ConfigError, TrainConfig
from mxfp16.train.checkpoint import describe_mismatch

import pytest
from fault_injection import environment
from train_support import QUICK, metrics, ok, refused, run_train, run_train_here, tiny_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("refusals"))


@pytest.fixture(scope="module")
def float32_run(data, tmp_path_factory):
    """A one-epoch float32 run on a copy of the data with one corrupt JPEG (returns its folder and log)."""
    root = tmp_path_factory.mktemp("f32")
    copy = root / "data"
    shutil.copytree(data, copy)
    bad = next((copy / "train").iterdir()) / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    proc = ok(run_train("--data-dir", copy, "--precision", "float32", "--out", root / "run", "--epochs", 1,
                        "--max-batches", 2, *QUICK))
    return root / "run", proc


@pytest.mark.slow
def test_resume_across_precisions_is_refused_saying_what_differs(data, float32_run):
    float32_run, _ = float32_run
    before = (float32_run / "checkpoints" / "latest.json").read_text()
    proc = run_train("--data-dir", data, "--precision", "amp-bfloat16", "--out", float32_run, "--resume",
                     "--epochs", 2, "--max-batches", 2, *QUICK)
    refused(proc, "cannot change:", "precision 'float32' -> 'amp-bfloat16'", "another --out")
    assert (float32_run / "checkpoints" / "latest.json").read_text() == before  # nothing lost


def cli_refused(capsys, *args):
    """Run ``mxfp16 train ARGS`` in this process (for refusals that come before AMP or any network exists)."""
    from mxfp16.cli import main

    assert main(["train", *map(str, args)]) == 2
    return capsys.readouterr().err


@pytest.mark.slow
def test_an_existing_run_is_not_overwritten_without_resume(data, float32_run, capsys):
    float32_run, _ = float32_run
    before = sorted(p.name for p in float32_run.rglob("*"))
    message = cli_refused(capsys, "--data-dir", data, "--precision", "float32", "--out", float32_run, *QUICK)
    assert "already holds a run" in message and "--resume" in message and "--overwrite" in message
    assert sorted(p.name for p in float32_run.rglob("*")) == before


def test_float16_on_cpu_is_refused_with_the_explanation(tmp_path, capsys):
    message = cli_refused(capsys, "--data-dir", tmp_path / "no-data", "--precision", "float16", "--out", tmp_path / "x")
    assert "FP16 gemm on cpu not implemented" in message and "amp-bfloat16" in message
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_infinite_loss_in_float32_stops_naming_the_step_and_keeps_the_checkpoint(data, tmp_path):
    out = tmp_path / "nan"
    proc = run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 2, "--max-batches", 3,
                     *QUICK, env=environment(overflow_step=5))
    message = refused(proc, "step 5, epoch 2", "epoch-0001")
    assert "inf" in message or "nan" in message
    record = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert record["progress"]["epoch"] == 1 and [r["epoch"] for r in metrics(out)] == [1]


def test_gradient_compression_is_refused_for_float16_parameters(tmp_path, capsys):
    message = cli_refused(capsys, "--data-dir", tmp_path / "no-data", "--precision", "float16", "--allow-cpu-float16",
                          "--model", "elementwise-mlp", "--gradient-compression", "2bit", "--out", tmp_path / "gc")
    assert "float32 gradients only" in message and "float16" in message


def test_gradient_compression_is_refused_on_the_local_kvstore(tmp_path, capsys):
    # dist kvstores: tests/test_distributed_train.py
    message = cli_refused(capsys, "--data-dir", tmp_path / "no-data", "--precision", "float32", "--kvstore", "local",
                          "--gradient-compression", "2bit", "--out", tmp_path / "gc")
    assert "--kvstore local" in message and "--kvstore device" in message


@pytest.mark.slow
def test_a_corrupt_image_is_skipped_and_named(float32_run):
    """The data issue's rule: a file that does not decode is left out by the scan, counted and named."""
    out, proc = float32_run
    assert "skipped 1 unusable file(s)" in proc.stdout and "broken.jpg" in proc.stdout
    assert (out / "summary.json").exists()


# ---- in-process checks of the configuration (no training) -------------------
@pytest.mark.parametrize("field, value, phrase", [
    ("precision", "float8", "choose one of"),
    ("loss_scale", "big", "positive number"),
    ("loss_scale", "-4", "positive number"),
    ("lr", 0.0, "lr=0.0"),
    ("workers", -1, "workers=-1"),
    ("kvstore", "horovod", "choose one of"),
    ("gradient_compression", "1bit", "2bit"),
])
def test_bad_configuration_names_the_field(field, value, phrase):
    with pytest.raises(ConfigError, match=phrase):
        TrainConfig(**{field: value}).resolve()


def test_warmup_longer_than_the_run_is_refused():
    with pytest.raises(ConfigError, match="warmup_epochs=3"):
        TrainConfig(epochs=3, warmup_epochs=3).resolve()


# ---- issue 42, case 9: schedule flags that would be ignored or cannot act as written ---------------
@pytest.mark.parametrize("settings, phrases", [
    (dict(step_epochs=(5, 2)), ["--step-epochs 5,2 is for --lr-schedule step", "--lr-schedule cosine would ignore"]),
    (dict(lr_schedule="step", step_epochs=(5, 2)), ["--step-epochs 5,2 is out of order", "--step-epochs 2,5"]),
    (dict(lr_schedule="step", step_epochs=(2, 5, 2)), ["--step-epochs 2,5,2 lists epoch 2 twice"]),
    (dict(lr_schedule="step", step_epochs=(2, 12)), ["epoch 12 is not before the end of the run (--epochs 10)"]),
    (dict(lr_schedule="step", step_epochs=(10,)), ["epoch 10 is not before the end of the run (--epochs 10)"]),
    (dict(lr_schedule="step", step_epochs=(1, 5), warmup_epochs=2), ["epoch 1 falls within the 2 warm-up epochs",
                                                                    "--warmup-epochs"]),
    (dict(lr_schedule="step", step_epochs=(2.5,)), ["--step-epochs 2.5: whole numbers"]),
])
def test_conflicting_schedule_flags_are_refused_naming_the_flag(settings, phrases):
    with pytest.raises(ConfigError) as refusal:
        TrainConfig(**dict(dict(data_dir="d", epochs=10, warmup_epochs=0), **settings)).resolve()
    for phrase in phrases:
        assert phrase in str(refusal.value)


@pytest.mark.parametrize("epochs, warmup, steps", [(8, 0, (4, 6)), (4, 3, (3,)), (1, 0, ()), (2, 1, (1,))])
def test_default_step_epochs_are_drops_the_schedule_can_make(epochs, warmup, steps):
    config = TrainConfig(data_dir="d", epochs=epochs, warmup_epochs=warmup, lr_schedule="step").resolve()
    assert config.step_epochs == steps
    assert all(warmup <= e < epochs for e in config.step_epochs)


def test_resuming_a_step_run_under_cosine_leaves_its_step_epochs_behind():
    saved = TrainConfig(data_dir="d", epochs=8, lr_schedule="step").resolve().to_dict()
    resumed, changes = TrainConfig(data_dir="d", lr_schedule="cosine", resume=True).for_resume(saved, {"lr_schedule"})
    assert resumed.resolve().step_epochs is None and changes == {"lr_schedule": ("step", "cosine")}
    with pytest.raises(ConfigError, match="--step-epochs 3 is for --lr-schedule step"):
        TrainConfig(data_dir="d", lr_schedule="cosine", step_epochs=(3,), resume=True).for_resume(
            saved, {"lr_schedule", "step_epochs"})[0].resolve()


@pytest.mark.slow
def test_the_command_line_refuses_step_epochs_under_cosine(tmp_path):
    refused(run_train_here("--out", tmp_path / "run", "--step-epochs", "5,2", *QUICK),
            "--step-epochs 5,2 is for --lr-schedule step")
    assert not (tmp_path / "run").exists()


def test_profiles_fill_only_what_was_left_open():
    demo = TrainConfig().resolve()
    dataset = TrainConfig(data_dir="somewhere", epochs=1).resolve()
    assert dataset.model == "resnet50_v2" and dataset.image_size == 224 and dataset.warmup_epochs == 0
    assert demo.model != "resnet50_v2"
    assert TrainConfig(model="resnet18_v1", image_size=96).resolve().image_size == 96
    assert TrainConfig(pretrained=True, data_dir="x").resolve().lr == pytest.approx(dataset.lr / 10)


def test_config_round_trips_through_json():
    config = TrainConfig(lr_schedule="step", epochs=8, data_dir="d").resolve()
    again = TrainConfig.from_dict(json.loads(config.to_json()))
    assert again == config and again.step_epochs == (4, 6)
    with pytest.raises(ConfigError, match="unknown configuration field"):
        TrainConfig.from_dict({"learning_rate": 1})


def test_overwrite_removes_only_what_a_run_writes(tmp_path):
    from mxfp16.train.outputs import RunOutputs

    run_files = ["config.json", "metrics.jsonl", "summary.json", "summary.rank1.json", "checkpoints/latest.json"]
    for name in run_files + ["notes.txt"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    outputs = RunOutputs(tmp_path)
    assert outputs.has_run()
    outputs.remove_run()
    assert not outputs.has_run()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_and_overwrite_exclude_each_other():
    with pytest.raises(ConfigError, match="exclude each other"):
        TrainConfig(resume=True, overwrite=True).resolve()


def test_mismatch_lists_every_difference():
    saved = {"model": "a", "precision": "float32", "image_size": 32, "parameters": "x"}
    lines = describe_mismatch(saved, dict(saved, model="b", parameters="y"))
    assert lines == ["model: checkpoint 'a', this run 'b'",
                     "parameters: the network's parameter names or shapes differ"]


def test_a_gpu_that_is_not_there_is_refused_before_any_work(tmp_path, capsys):
    from mxfp16.machine.hardware import gpu_count

    missing = gpu_count()  # the first GPU index MXNet cannot see
    message = cli_refused(capsys, "--data-dir", tmp_path / "no-data", "--ctx", f"gpu:{missing}",
                          "--out", tmp_path / "x")
    assert f"GPU {missing}" in message and "--ctx auto" in message and "--ctx cpu" in message
    assert not (tmp_path / "x").exists()


def test_the_callback_variable_loads_module_function_or_says_what_is_wrong():
    from mxfp16.train.callbacks import CALLBACKS_VARIABLE, callbacks_from_environment
    from mxfp16.train.config import ConfigError

    assert callbacks_from_environment(None, {}) == []
    made = callbacks_from_environment("the run", {CALLBACKS_VARIABLE: "fault_injection:callbacks"})
    assert made == []  # the module loaded; no fault variable is set here, so it adds none
    for bad in ("no_such_module_xyz:callbacks", "fault_injection:no_such_function", "fault_injection"):
        with pytest.raises(ConfigError, match=CALLBACKS_VARIABLE):
            callbacks_from_environment(None, {CALLBACKS_VARIABLE: bad})
