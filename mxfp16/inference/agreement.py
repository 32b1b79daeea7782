"""Does the exported model predict what the float32 model predicts? Both on the same test images.

Four numbers answer it: the top-1 accuracy of each, the share of images
whose top-1 class differs between them (a model can keep its accuracy
while changing which images it gets right), and the largest difference in
any class probability. :func:`check_margin` turns them into a decision.
"""
import numpy as np

from ..casting import to_float32

__all__ = ["AgreementError", "compare", "check_margin", "softmax", "DEFAULT_MARGIN"]

#: Percentage points of top-1 an export may lose against float32 (``mxfp16 export --margin``).
DEFAULT_MARGIN = 0.5


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
        Blocks mapping a float32 NCHW batch to logits (any float dtype).
    batches : iterable of (NDArray, NDArray)
        float32 images and labels (``Loaders.test_batches()``).
    ctx : mx.Context
        Where both models' parameters are.

    Returns
    -------
    dict
        ``images``, ``top1_float32``, ``top1_export`` (fractions),
        ``top1_drop_points`` (float32's top-1 minus the export's, in
        percentage points), ``changed_images``, ``changed_share`` and
        ``max_probability_difference``.

    Raises
    ------
    ValueError
        No images.
    """
    images = right_ref = right_cand = changed = 0
    largest = 0.0
    for data, label in batches:
        x = data.as_in_context(ctx)
        # One host read per model and batch: the check runs once, off the training path.
        p_ref = softmax(to_float32(reference(x)).asnumpy())
        p_cand = softmax(to_float32(candidate(x)).asnumpy())
        y = label.asnumpy().astype(np.int64)
        top_ref, top_cand = p_ref.argmax(axis=1), p_cand.argmax(axis=1)
        images += len(y)
        right_ref += int((top_ref == y).sum())
        right_cand += int((top_cand == y).sum())
        changed += int((top_ref != top_cand).sum())
        largest = max(largest, float(np.abs(p_ref - p_cand).max()))
    if images == 0:
        raise ValueError("the test set gave no images to compare on")
    return {
        "images": images,
        "top1_float32": right_ref / images,
        "top1_export": right_cand / images,
        "top1_drop_points": 100.0 * (right_ref - right_cand) / images,
        "changed_images": changed,
        "changed_share": changed / images,
        "max_probability_difference": largest,
    }


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
