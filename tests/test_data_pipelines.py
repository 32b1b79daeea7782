"""The folder pipeline: batch format, evaluation transform, determinism, resume, sharding."""
import collections

from mxfp16.data import make_loaders, synth_dataset
from mxfp16.data.pipelines import MEAN_RGB, STD_RGB, resize_for

import cv2
import numpy as np
import pytest

SIZE = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth_dataset(tmp_path_factory.mktemp("data") / "s", classes=3, per_class=7, test_per_class=3, size=48)


def _collect(batches):
    return [(d.asnumpy(), l.asnumpy()) for d, l in batches]


def _label_histogram(batches, classes=3):
    return np.bincount(np.concatenate([l for _, l in batches]).astype(int), minlength=classes)


def test_training_batches_format_and_epoch_coverage(tiny):
    loaders = make_loaders(tiny, image_size=SIZE, batch_size=4)
    assert loaders.classes == ["bar", "circle", "crescent"]
    assert (loaders.num_train, loaders.num_test, loaders.train_batches_per_epoch) == (21, 9, 6)
    batches = _collect(loaders.train_batches(0))
    assert [d.shape for d, _ in batches] == [(4, 3, SIZE, SIZE)] * 5 + [(1, 3, SIZE, SIZE)]  # last partial batch kept
    assert all(d.dtype == np.float32 and l.dtype == np.float32 and l.shape == (len(d),) for d, l in batches)
    # Every training image once per epoch: the label histogram is the class counts.
    assert _label_histogram(batches).tolist() == [7, 7, 7]
    # Normalised: roughly zero mean, values in the range ImageNet normalisation allows.
    values = np.concatenate([d.ravel() for d, _ in batches])
    lo = min((0 - m) / s for m, s in zip(MEAN_RGB, STD_RGB))
    hi = max((1 - m) / s for m, s in zip(MEAN_RGB, STD_RGB))
    assert lo - 1e-5 <= values.min() and values.max() <= hi + 1e-5


def test_evaluation_transform_matches_an_opencv_float64_reference(tiny):
    loaders = make_loaders(tiny, image_size=SIZE, batch_size=5)
    data, label = _collect(loaders.test_batches())[0]
    paths = sorted((tiny / "test" / "bar").glob("*.jpg"))
    assert label[:3].tolist() == [0, 0, 0]
    for k, path in enumerate(paths):
        img = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        short = resize_for(SIZE)
        new = (short, int(h * short / w)) if w < h else (int(w * short / h), short)
        img = cv2.resize(img, new, interpolation=cv2.INTER_CUBIC).astype(np.float64)
        y0, x0 = (img.shape[0] - SIZE) // 2, (img.shape[1] - SIZE) // 2
        ref = ((img[y0:y0 + SIZE, x0:x0 + SIZE] / 255.0 - MEAN_RGB) / STD_RGB).transpose(2, 0, 1)
        # MXNet's bundled OpenCV and the cv2 wheel may round a few pixels one level apart.
        one_level = 1.0 / (255 * min(STD_RGB))
        np.testing.assert_allclose(data[k], ref, atol=one_level * 1.01)
        assert np.abs(data[k] - ref).mean() < 0.1 * one_level


def test_order_and_augmentation_are_a_function_of_seed_and_epoch(tiny):
    a = make_loaders(tiny, image_size=SIZE, batch_size=4, seed=3)
    b = make_loaders(tiny, image_size=SIZE, batch_size=4, seed=3)
    epoch1 = _collect(a.train_batches(1))
    again = _collect(b.train_batches(1))
    assert all(np.array_equal(x, y) and np.array_equal(p, q) for (x, p), (y, q) in zip(epoch1, again))
    resumed = _collect(b.train_batches(1, start_batch=4))
    assert len(resumed) == 2
    assert all(np.array_equal(x, y) and np.array_equal(p, q) for (x, p), (y, q) in zip(epoch1[4:], resumed))
    epoch2 = _collect(a.train_batches(2))
    assert not all(np.array_equal(x, y) for (x, _), (y, _) in zip(epoch1, epoch2))
    other_seed = _collect(make_loaders(tiny, image_size=SIZE, batch_size=4, seed=4).train_batches(1))
    assert not all(np.array_equal(x, y) for (x, _), (y, _) in zip(epoch1, other_seed))


def test_augmentation_varies_between_epochs_for_the_same_image(tiny):
    # batch_size = all images and one class: compare each epoch's sorted per-image means.
    loaders = make_loaders(tiny, image_size=SIZE, batch_size=32, seed=0)
    means = [np.sort(_collect(loaders.train_batches(e))[0][0].mean(axis=(1, 2, 3))) for e in range(2)]
    assert not np.allclose(means[0], means[1])


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(tiny):
    serial = _collect(make_loaders(tiny, image_size=SIZE, batch_size=4, workers=0, seed=1).train_batches(0))
    parallel = _collect(make_loaders(tiny, image_size=SIZE, batch_size=4, workers=2, seed=1).train_batches(0))
    assert len(serial) == len(parallel)
    assert all(np.array_equal(x, y) and np.array_equal(p, q) for (x, p), (y, q) in zip(serial, parallel))


def test_shards_are_equal_sized_and_disjoint(tiny):
    shards = [make_loaders(tiny, image_size=SIZE, batch_size=4, shard=(r, 2)) for r in range(2)]
    assert [s.num_train for s in shards] == [10, 10] and [s.num_test for s in shards] == [9, 9]
    assert len({s.train_batches_per_epoch for s in shards}) == 1
    whole = _collect(make_loaders(tiny, image_size=SIZE, batch_size=1).train_batches(0))
    parts = [_collect(s.train_batches(0)) for s in shards]
    assert [sum(len(l) for _, l in p) for p in parts] == [10, 10]
    # Same (seed, epoch): the shards deal out the whole run's images, so their crops are among its crops.
    crops = {x.tobytes() for x, _ in whole}
    seen = [x[i].tobytes() for p in parts for x, _ in p for i in range(len(x))]
    assert len(set(seen)) == 20 and set(seen) <= crops
    with pytest.raises(ValueError, match="rank"):
        make_loaders(tiny, shard=(2, 2))


def test_test_split_missing_a_class_keeps_training_labels(tiny, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    shutil.rmtree(copy / "test" / "bar")
    loaders = make_loaders(copy, image_size=SIZE, batch_size=16)
    labels = np.concatenate([l for _, l in _collect(loaders.test_batches())])
    assert collections.Counter(labels.tolist()) == {1.0: 3, 2.0: 3}


def test_min_crop_area_comes_from_the_manifest_unless_given(tiny, tmp_path):
    import json
    import shutil

    from mxfp16.data.pack import pack_recordio
    from mxfp16.data.synth import MIN_CROP_AREA

    assert make_loaders(tiny).min_crop_area == MIN_CROP_AREA
    assert make_loaders(tiny, min_crop_area=0.5).min_crop_area == 0.5
    plain = tmp_path / "plain"
    shutil.copytree(tiny, plain)
    (plain / "manifest.json").unlink()
    assert make_loaders(plain).min_crop_area == 0.08
    pack_recordio(tiny, tmp_path / "p")
    assert json.loads((tmp_path / "p_classes.json").read_text())["min_crop_area"] == MIN_CROP_AREA
    assert make_loaders(tmp_path / "p", pipeline="recordio", batch_size=8).min_crop_area == MIN_CROP_AREA
    # A full-area crop of a square image is the whole image: the crop area really reaches the transform.
    whole = _collect(make_loaders(tiny, image_size=SIZE, batch_size=32, min_crop_area=1.0).train_batches(0))
    small = _collect(make_loaders(tiny, image_size=SIZE, batch_size=32, min_crop_area=0.1).train_batches(0))
    assert not np.array_equal(whole[0][0], small[0][0])
    with pytest.raises(Exception, match="min_crop_area"):
        make_loaders(tiny, min_crop_area=0)


def _multiset(batches):
    """The images of a list of batches, order-free (each image's bytes, sorted)."""
    return sorted(d[i].tobytes() for d, _ in batches for i in range(len(d)))


@pytest.fixture(scope="module")
def mirrored(tiny, tmp_path_factory):
    """The tiny set with test/ a copy of train/, so the evaluation transform of the training images is known."""
    import shutil

    root = tmp_path_factory.mktemp("mirrored") / "m"
    shutil.copytree(tiny, root)
    shutil.rmtree(root / "test")
    shutil.copytree(root / "train", root / "test")
    return root


@pytest.mark.parametrize("pipeline", ["folder", "recordio"])
def test_the_augmentation_choice_changes_what_the_pipeline_produces(mirrored, tmp_path, pipeline):
    from mxfp16.data.pack import pack_recordio

    source = mirrored
    if pipeline == "recordio":
        source = tmp_path / "pack"
        pack_recordio(mirrored, source)

    def train(augment, epoch):
        return _collect(make_loaders(source, image_size=SIZE, batch_size=32, pipeline=pipeline,
                                     augment=augment).train_batches(epoch))

    evaluation = _collect(make_loaders(source, image_size=SIZE, batch_size=32, pipeline=pipeline).test_batches())
    # none: every epoch is exactly the evaluation transform of the training images, in a new order.
    none0, none1 = train("none", 0), train("none", 1)
    assert _multiset(none0) == _multiset(none1) == _multiset(evaluation)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(none0, none1))  # the order still changes
    # light and imagenet crop and flip: images differ from the evaluation transform and between epochs.
    light0, imagenet0 = train("light", 0), train("imagenet", 0)
    for augmented in (light0, imagenet0):
        assert len(set(_multiset(augmented)) & set(_multiset(evaluation))) < len(evaluation[0][0]) // 2
    assert _multiset(light0) != _multiset(imagenet0) != _multiset(train("imagenet", 1))
    assert [l.tolist() for _, l in light0] == [l.tolist() for _, l in none0]  # same order for the same seed/epoch
    with pytest.raises(Exception, match="choose one of auto, imagenet, light, none"):
        make_loaders(source, pipeline=pipeline, augment="heavy")


def test_light_crops_keep_most_of_the_image(tiny):
    """A light crop keeps at least 64% of the area: mean pixel error to the full view stays far below imagenet's."""
    def error(augment):
        crops = _collect(make_loaders(tiny, image_size=SIZE, batch_size=32, augment=augment).train_batches(0))
        full = _collect(make_loaders(tiny, image_size=SIZE, batch_size=32, augment="none").train_batches(0))
        # Flips make the comparison symmetric: take the closer of the image and its mirror.
        a, b = crops[0][0], full[0][0]
        return float(np.mean(np.minimum(np.abs(a - b).mean(axis=(1, 2, 3)),
                                        np.abs(a - b[..., ::-1]).mean(axis=(1, 2, 3)))))

    assert error("light") < error("imagenet")


def test_auto_augmentation_follows_the_manifest_then_the_image_size(mirrored, tmp_path):
    """``auto`` (the default): the manifest's choice, else imagenet when it sets a crop area, else by image size."""
    import json
    import shutil

    from mxfp16.data.augment import DataError, resolve_augment
    from mxfp16.data.pack import pack_recordio

    assert resolve_augment("auto", 32) == "light" and resolve_augment("auto", 64) == "imagenet"
    assert resolve_augment("auto", 32, {"min_crop_area": 0.4}) == "imagenet"
    assert resolve_augment("auto", 224, {"augment": "none"}) == "none"
    assert resolve_augment("none", 32, {"augment": "light"}) == "none"  # an explicit choice wins
    with pytest.raises(DataError, match="manifest asks for augment 'heavy'"):
        resolve_augment("auto", 32, {"augment": "heavy"})

    # The loaders resolve it, and what they produce is that augmentation's output.
    assert make_loaders(mirrored, image_size=SIZE).augment.name == "imagenet"  # the synthetic set sets 0.4
    bare = tmp_path / "bare"
    shutil.copytree(mirrored, bare)
    (bare / "manifest.json").unlink()
    auto = make_loaders(bare, image_size=SIZE, batch_size=32)
    assert auto.augment.name == "light"
    assert _multiset(_collect(auto.train_batches(0))) == _multiset(
        _collect(make_loaders(bare, image_size=SIZE, batch_size=32, augment="light").train_batches(0)))
    assert make_loaders(bare, image_size=64).augment.name == "imagenet"
    (bare / "manifest.json").write_text(json.dumps({"augment": "none"}))
    assert make_loaders(bare, image_size=SIZE).augment.name == "none"
    # A pack carries the manifest's choice to the recordio pipeline.
    pack_recordio(bare, tmp_path / "pack")
    assert make_loaders(tmp_path / "pack", image_size=SIZE, pipeline="recordio").augment.name == "none"
