"""`mxfp16 bench --data`: real batches from a folder or a RecordIO pack, as the trainer reads them."""
import json

from mxfp16.bench.runner import BenchSpec, _Batches
from mxfp16.cli import main
from mxfp16.data import synth_dataset
from mxfp16.data.pack import pack_recordio

import numpy as np
import pytest


@pytest.fixture(scope="module")
def data_sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("benchdata")
    folder = synth_dataset(root / "shapes", classes=3, per_class=6, test_per_class=2, size=40)
    prefix = root / "pack" / "shapes"
    pack_recordio(folder, prefix)
    return folder, prefix


@pytest.mark.parametrize("pipeline", ["folder", "recordio"])
def test_batches_come_from_the_data_set_through_its_pipeline(data_sets, pipeline):
    folder, prefix = data_sets
    spec = BenchSpec(model="cifar_resnet20_v1", image_size=32, batch_size=4, data=str(
        folder if pipeline == "folder" else prefix), pipeline=pipeline)
    batches = _Batches(spec)
    assert batches.classes == 3  # the data set's, not the synthetic default of 102
    labels = []
    for _ in range(9):  # 18 images at batch 4: 4 full batches per epoch, so this crosses into the next epochs
        data, label = batches.next()
        assert data.shape == (4, 3, 32, 32) and data.dtype == np.float32
        labels.extend(label.asnumpy().astype(int).tolist())
    # Real images, normalised as the trainer's pipeline does (synthetic tensors are N(0, 1) noise).
    assert set(labels) == {0, 1, 2}
    assert abs(float(data.mean().asscalar())) < 3 and float(data.max().asscalar()) > 0


def test_bad_data_flags_name_the_fix(data_sets, tmp_path, capsys):
    folder, prefix = data_sets
    # A pack prefix given without --pipeline recordio: the error says to add it.
    assert main(["bench", "--data", str(prefix), "--out", str(tmp_path)]) == 2
    assert "--pipeline recordio" in capsys.readouterr().err
    # --pipeline recordio with something that is not a pack: the error names `mxfp16 data pack`.
    assert main(["bench", "--data", str(folder), "--pipeline", "recordio", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "mxfp16 data pack" in err and "pass --data " in err  # bench's flag, not the trainer's --data-dir
    assert main(["bench", "--data", str(folder), "--workers", "-1", "--out", str(tmp_path)]) == 2
    assert "--workers" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_bench_on_a_pack_records_its_pipeline(data_sets, tmp_path):
    _, prefix = data_sets
    out = tmp_path / "bench"
    assert main(["bench", "--data", str(prefix), "--pipeline", "recordio", "--model", "cifar_resnet20_v1",
                 "--image-size", "32", "--batch-sizes", "4", "--precisions", "float32", "--iters", "2",
                 "--warmup", "1", "--repeats", "1", "--no-plots", "--no-census", "--out", str(out)]) == 0
    document = json.loads((out / "bench.json").read_text())
    assert document["config"]["pipeline"] == "recordio"
    [record] = document["results"]
    assert record["status"] == "ok" and record["pipeline"] == "recordio" and record["data"] == str(prefix)
