"""The evaluation view of an image in numpy and Pillow alone, equal to the bit to what the test loader feeds.

``mxfp16 predict`` prepares images with it as
:func:`mxfp16.data.pipelines.center_view` and
:func:`~mxfp16.data.pipelines.normalise` prepared the run's test images;
``docs/inference.md`` ("What MXNet 1.9.1's ONNX exporter needs", "Image
decoding") says how each step matches MXNet's.
"""
import numpy as np

__all__ = ["decode", "resize_cubic", "resize_short", "center_view", "to_batch", "DecodeError"]

_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS
_CUBIC_A = np.float32(-0.75)
#: Values of a row that OpenCV's SSE2 vertical pass handles per step; the rest take its integer path.
_SIMD_WIDTH = 8


class DecodeError(ValueError):
    """An image file Pillow cannot decode; the message is the reason."""


def decode(path):
    """An image file as uint8 HWC RGB.

    Raises
    ------
    OSError
        The file cannot be read.
    DecodeError
        The bytes do not decode.
    """
    from PIL import Image

    with open(path, "rb") as handle:
        try:
            with Image.open(handle) as image:
                return np.asarray(image.convert("RGB"))
        except (Image.UnidentifiedImageError, Image.DecompressionBombError, SyntaxError, ValueError) as err:
            raise DecodeError(str(err) or type(err).__name__) from None


def _taps(source, target):
    """Source indices ``(target, 4)`` (edges replicated) and fixed-point cubic weights, as OpenCV computes them."""
    scale = source / target
    position = ((np.arange(target, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    start = np.floor(position).astype(np.int64)
    x = (position - start.astype(np.float32)).astype(np.float32)
    one, a = np.float32(1), _CUBIC_A
    w0 = ((a * (x + one) - np.float32(5) * a) * (x + one) + np.float32(8) * a) * (x + one) - np.float32(4) * a
    w1 = ((a + np.float32(2)) * x - (a + np.float32(3))) * x * x + one
    w2 = ((a + np.float32(2)) * (one - x) - (a + np.float32(3))) * (one - x) * (one - x) + one
    w3 = one - w0 - w1 - w2
    weights = np.rint(np.stack([w0, w1, w2, w3], axis=1) * np.float32(_COEF_SCALE)).astype(np.int64)
    index = np.clip(start[:, None] + np.arange(-1, 3)[None, :], 0, source - 1)
    return index, weights


def resize_cubic(image, width, height):
    """``image`` (uint8 HWC) resized to ``(height, width)`` as ``mx.image.imresize(..., interp=2)`` does.

    Returns
    -------
    numpy.ndarray
        uint8 ``(height, width, channels)``.
    """
    rows_in, cols_in, channels = image.shape
    col_index, col_weights = _taps(cols_in, width)
    row_index, row_weights = _taps(rows_in, height)
    # Horizontal pass in integers: (rows_in, width * channels).
    rows = (image.astype(np.int64)[:, col_index, :] * col_weights[None, :, :, None]).sum(axis=2)
    rows = rows.reshape(rows_in, width * channels)
    exact = (rows[row_index, :] * row_weights[:, :, None]).sum(axis=1)
    exact = (exact + (1 << (2 * _COEF_BITS - 1))) >> (2 * _COEF_BITS)
    # Vertical pass as the SSE2 code computes it: float32, added in tap order, rounded to nearest even.
    beta = row_weights.astype(np.float32) * np.float32(1.0 / (_COEF_SCALE * _COEF_SCALE))
    values = rows.astype(np.float32)
    total = values[row_index[:, 0]] * beta[:, 0:1]
    for tap in range(1, 4):
        total = total + values[row_index[:, tap]] * beta[:, tap:tap + 1]
    vector = width * channels // _SIMD_WIDTH * _SIMD_WIDTH
    exact[:, :vector] = np.rint(total[:, :vector])
    return np.clip(exact, 0, 255).astype(np.uint8).reshape(height, width, channels)


def resize_short(image, size):
    """The short side resized to ``size``, the aspect kept (``mx.image.resize_short``)."""
    height, width = image.shape[:2]
    if height > width:
        new_height, new_width = size * height // width, size
    else:
        new_height, new_width = size, size * width // height
    return resize_cubic(image, new_width, new_height)


def center_view(image, crop, short_side):
    """The short side resized to ``short_side``, then the central ``crop`` x ``crop`` square (uint8 HWC).

    Raises
    ------
    ValueError
        ``crop`` larger than ``short_side``.
    """
    if crop > short_side:
        raise ValueError(f"a {crop} px crop does not fit in a short side of {short_side} px")
    resized = resize_short(image, short_side)
    height, width = resized.shape[:2]
    top, left = int((height - crop) / 2), int((width - crop) / 2)
    return resized[top:top + crop, left:left + crop]


def to_batch(views, mean, std):
    """uint8 HWC views as one float32 NCHW batch, scaled to [0, 1] and normalised per channel."""
    batch = np.stack(views).astype(np.float32) / np.float32(255.0)
    batch = (batch - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))
