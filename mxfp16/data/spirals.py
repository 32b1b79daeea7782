"""Interleaved spirals: the tutorial's small two-feature classification task.

Notebooks 2, 3 and 8 train elementwise networks on it, because MXNet 1.9.1
runs float16 elementwise operators on a CPU (its float16 convolution and
dense layers need a GPU). Three arms of points winding about the origin are
easy to learn in float32 and hard enough that a broken float16 recipe shows.
"""
import numpy as np

__all__ = ["spirals"]


def spirals(n, classes=3, turns=1.0, noise=0.15, seed=0, return_radius=False):
    """``classes`` spiral arms of ``n // classes`` points each, shuffled.

    Parameters
    ----------
    n : int
        Points in all; each class gets ``n // classes``.
    classes : int
        Number of arms (and labels ``0 .. classes-1``).
    turns : float
        How many times each arm winds about the origin.
    noise : float
        Standard deviation of the angular noise, in radians.
    seed : int
        The data are a function of the arguments alone.
    return_radius : bool
        Also return each point's distance from the origin (noise only turns a point), e.g. to split a task by radius.

    Returns
    -------
    points : numpy.ndarray
        float32, shape ``(classes * (n // classes), 2)``.
    labels : numpy.ndarray
        float32 class labels, as Gluon's ``SoftmaxCrossEntropyLoss`` takes them.
    radius : numpy.ndarray
        float64 radii, only with ``return_radius=True``.
    """
    if n < classes or classes < 1:
        raise ValueError(f"spirals needs at least one point per class: n={n}, classes={classes}")
    rng = np.random.RandomState(seed)
    per = n // classes
    radius = np.tile(np.linspace(0.1, 1.0, per), classes)
    label = np.repeat(np.arange(classes), per)
    angle = label * 2 * np.pi / classes + radius * turns * 2 * np.pi + rng.randn(per * classes) * noise
    points = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
    order = rng.permutation(len(label))
    result = points[order].astype("float32"), label[order].astype("float32")
    return result + (radius[order],) if return_radius else result
