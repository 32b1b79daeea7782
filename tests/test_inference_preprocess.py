"""The numpy view of an image equals MXNet's, bit for bit: the resize on random images, the whole view on files."""
from mxfp16.data.pipelines import MEAN_RGB, STD_RGB, center_view, normalise, read_image, resize_for
from mxfp16.inference import preprocess

import numpy as np
import pytest


@pytest.mark.parametrize("seed", range(4))
def test_the_cubic_resize_is_mxnets_on_random_images_up_and_down(seed):
    import mxnet as mx

    rng = np.random.RandomState(seed)
    for _ in range(25):
        rows, cols = rng.randint(3, 300, 2)
        height, width = rng.randint(1, 260, 2)
        image = rng.randint(0, 256, (rows, cols, 3)).astype(np.uint8)
        if rng.rand() < 0.5:  # smooth gradients as well as noise: rounding ties show up there
            image = np.clip(image // 8 + np.linspace(0, 200, cols)[None, :, None], 0, 255).astype(np.uint8)
        wanted = mx.image.imresize(mx.nd.array(image, dtype="uint8"), int(width), int(height), interp=2).asnumpy()
        assert np.array_equal(preprocess.resize_cubic(image, width, height), wanted), (rows, cols, height, width)


def test_files_give_the_test_loaders_arrays(tmp_path):
    from mxfp16.data import synth_dataset

    import mxnet as mx

    data = synth_dataset(tmp_path / "set", classes=3, per_class=2, test_per_class=6, size=80, seed=1)
    files = sorted((data / "test").glob("*/*.jpg"))
    for size in (16, 48):
        short = resize_for(size)
        mine = [preprocess.center_view(preprocess.decode(str(f)), size, short) for f in files]
        theirs = [center_view(read_image(str(f)), size, short).asnumpy() for f in files]
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs))
        assert np.array_equal(center_view(read_image(str(files[0])), size).asnumpy(), theirs[0])  # the default
        batch = preprocess.to_batch(mine, MEAN_RGB, STD_RGB)
        assert batch.dtype == np.float32 and batch.shape == (len(files), 3, size, size)
        assert np.array_equal(batch, normalise(mx.nd.array(np.stack(theirs), dtype="uint8")).asnumpy())


def test_decode_names_what_is_not_an_image(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("not an image")
    with pytest.raises(preprocess.DecodeError):
        preprocess.decode(str(path))
    with pytest.raises(ValueError, match="does not fit"):
        preprocess.center_view(np.zeros((10, 10, 3), np.uint8), 12, 10)
