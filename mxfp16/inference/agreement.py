"""Does the exported model predict what the float32 model predicts? Both on the same test images.

:func:`compare` gives the numbers of ``docs/inference.md`` ("The agreement
check"). :func:`check_margin` turns the accuracies into a decision;
:func:`check_scores` the scores, for a model that should compute what
float32 computes (an ONNX file), with a tolerance per dtype.
"""
import numpy as np

__all__ = ["AgreementError", "compare", "check_margin", "check_scores", "softmax", "DEFAULT_MARGIN",
           "SCORE_TOLERANCE"]

#: Percentage points of top-1 an export may lose against float32 (``mxfp16 export --margin``).
DEFAULT_MARGIN = 0.5
#: The largest score difference an ONNX model may show against the float32 MXNet network, as a fraction of the
#: largest float32 score (at least 1): float32 kernels of two libraries differ by rounding only; float16 keeps 11
#: significant bits, and its rounding grows through the layers.
SCORE_TOLERANCE = {"float32": 1e-4, "float16": 5e-2}
#: The largest finite float16.
FLOAT16_MAX = 65504.0


class AgreementError(RuntimeError):
    """The exported model's top-1 falls too far below float32's; the message names the numbers."""


def softmax(logits):
    """Row-wise softmax in float64 (the comparison must not add rounding of its own)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def compare(reference, candidate, batches, ctx):
    """Run both models on every batch and compare their predictions.

    Parameters
    ----------
    reference, candidate : callable
        Map a float32 NCHW batch to logits (any float dtype): Gluon blocks, which get the NDArray on ``ctx``, or
        a format's reader (``numpy_input=True``), which gets a numpy array and returns one.
    batches : iterable of (NDArray, NDArray)
        float32 images and labels (``Loaders.test_batches()``).
    ctx : mx.Context
        Where the blocks' parameters are.

    Returns
    -------
    dict
        ``images``, ``top1_float32``, ``top1_export`` (fractions),
        ``top1_drop_points`` (percentage points), ``changed_images``,
        ``changed_share``, ``max_probability_difference``,
        ``max_score_difference`` (logits), ``max_abs_score_float32`` and
        ``nonfinite_images`` (inf or NaN scores).

    Raises
    ------
    ValueError
        No images.
    """
    images = right_ref = right_cand = changed = nonfinite = 0
    largest = largest_score = scale = 0.0
    for data, label in batches:
        x = data.as_in_context(ctx)
        # One host read per model and batch: the check runs once, off the training path.
        s_ref, s_cand = _scores(reference, x), _scores(candidate, x)
        finite = np.isfinite(s_cand).all(axis=1)
        nonfinite += int((~finite).sum())
        p_ref, p_cand = softmax(s_ref), softmax(np.where(np.isfinite(s_cand), s_cand, 0.0))
        y = label.asnumpy().astype(np.int64)
        top_ref, top_cand = p_ref.argmax(axis=1), np.where(finite, p_cand.argmax(axis=1), -1)
        images += len(y)
        right_ref += int((top_ref == y).sum())
        right_cand += int((top_cand == y).sum())
        changed += int((top_ref != top_cand).sum())
        largest = max(largest, float(np.abs(p_ref - p_cand)[finite].max(initial=0.0)))
        largest_score = max(largest_score, float(np.abs(s_ref - s_cand)[finite].max(initial=0.0)))
        scale = max(scale, float(np.abs(s_ref).max()))
    if images == 0:
        raise ValueError("the test set gave no images to compare on")
    return {"images": images, "top1_float32": right_ref / images, "top1_export": right_cand / images,
            "top1_drop_points": 100.0 * (right_ref - right_cand) / images, "changed_images": changed,
            "changed_share": changed / images, "max_probability_difference": largest,
            "max_score_difference": largest_score, "max_abs_score_float32": scale, "nonfinite_images": nonfinite}


def _scores(model, x):
    """``model``'s float64 logits of the NDArray batch ``x``: a block gets ``x``, a format's reader numpy."""
    if getattr(model, "numpy_input", False):
        return np.asarray(model(x.asnumpy()), dtype=np.float64)
    from ..casting import to_float32

    return to_float32(model(x)).asnumpy().astype(np.float64)


def check_margin(result, margin_points, precision_name):
    """Raise :class:`AgreementError` when the export's top-1 is more than ``margin_points`` below float32's.

    Parameters
    ----------
    result : dict
        From :func:`compare`.
    margin_points : float
        Percentage points (0.5 allows 76.0% against 76.4%, not against 76.6%).
    precision_name : str
        For the message.
    """
    if result["top1_drop_points"] > margin_points:
        raise AgreementError(
            f"the {precision_name} export's top-1 is {100 * result['top1_export']:.2f}% against "
            f"{100 * result['top1_float32']:.2f}% in float32 on {result['images']} test images: "
            f"{result['top1_drop_points']:.2f} points lower, beyond the margin of {margin_points:g} points "
            f"({result['changed_images']} top-1 predictions changed, largest probability difference "
            f"{result['max_probability_difference']:.3f}). Nothing was written. Export in float32, try the other "
            "AMP lists (--amp-lists), or widen --margin if that loss is acceptable")


def check_scores(result, dtype, what, tolerance=None):
    """Raise :class:`AgreementError` when the export's scores are not what float32's are, within ``dtype``'s rounding.

    Parameters
    ----------
    result : dict
        From :func:`compare`.
    dtype : str
        What the export computes in: a key of :data:`SCORE_TOLERANCE`.
    what : str
        The file or model, for the message (``'model-float16.onnx'``).
    tolerance : float, optional
        Default :data:`SCORE_TOLERANCE` of ``dtype`` (a fraction of the largest float32 score, at least 1).

    Returns
    -------
    float
        The absolute tolerance applied.
    """
    tolerance = SCORE_TOLERANCE[dtype] if tolerance is None else tolerance
    allowed = tolerance * max(1.0, result["max_abs_score_float32"])
    if dtype == "float16" and result["max_abs_score_float32"] > FLOAT16_MAX:
        # onnxruntime's CPU provider computes the last layer in float32 behind casts it inserts, so the
        # scores may come back finite here; a GPU provider computes them in float16 and returns inf.
        raise AgreementError(
            f"{what}: the float32 network's scores reach {result['max_abs_score_float32']:.4g}, beyond float16's "
            f"range ({FLOAT16_MAX:g}), so a float16 model cannot hold them (an execution provider that computes the "
            "last layer in float16, as GPUs do, returns inf). float16 is the cause: export float32 only (drop "
            "--onnx-dtype float16). Nothing was written")
    if result["nonfinite_images"]:
        cause = ("float16 overflowed: a score or an activation went beyond float16's range (65504). Export float32 "
                 "only (drop --onnx-dtype float16)" if dtype == "float16" else
                 "the model computes inf or NaN where float32 MXNet does not. Export --format mxnet")
        raise AgreementError(
            f"{what} gave non-finite scores (inf or NaN) for {result['nonfinite_images']} of {result['images']} test "
            f"images, whose float32 scores reach {result['max_abs_score_float32']:.4g}: {cause}. Nothing was written")
    if result["max_score_difference"] > allowed:
        raise AgreementError(
            f"{what} ({dtype}) differs from the float32 network by up to {result['max_score_difference']:.3g} in a "
            f"score, beyond the {dtype} tolerance of {allowed:.3g} ({tolerance:g} of the largest float32 score, "
            f"{result['max_abs_score_float32']:.4g}); {result['changed_images']} top-1 predictions changed. Nothing "
            "was written. Export --format mxnet, or report the network: a converter computes something else")
    return allowed
