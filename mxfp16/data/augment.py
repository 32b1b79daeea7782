"""The training augmentations, by name: what each does to an image, and what ``auto`` picks.

Imports nothing of MXNet, so the trainer's flags (``--augment``) and the
configuration check are built without it; :mod:`mxfp16.data.pipelines`
applies them. ``docs/training.md`` ("Which augmentation") says when to pick which.
"""
from dataclasses import dataclass

from .validate import DataError

__all__ = ["Augmentation", "augmentation", "resolve_augment", "AUGMENTATIONS", "AUGMENT_CHOICES",
           "DEFAULT_MIN_CROP_AREA", "CROP_RATIO", "SMALL_IMAGE"]

DEFAULT_MIN_CROP_AREA = 0.08
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
#: The training augmentations ``make_loaders`` offers (``docs/training.md`` says when to pick which).
AUGMENTATIONS = ("imagenet", "light", "none")
#: What ``augment=`` accepts: an augmentation, or ``auto`` (:func:`resolve_augment`).
AUGMENT_CHOICES = ("auto",) + AUGMENTATIONS
#: ``auto`` picks ``light`` below this image side: ImageNet's smallest crop (8% of the area) of a
#: 32 px image is 9 px wide, too little of a small image to keep its class; CIFAR-style recipes
#: (GluonCV's ``train_cifar10.py``) crop lightly and flip instead.
SMALL_IMAGE = 64


@dataclass(frozen=True)
class Augmentation:
    """What a training image goes through: a random-resized crop (or the evaluation crop) and a flip.

    Attributes
    ----------
    name : str
    crop : bool
        Random-resized crop; ``False`` uses the evaluation transform (resize the short side, center crop).
    area, ratio : (float, float)
        The crop's share of the image area and its aspect ratio range.
    flip : bool
        Random horizontal flip.
    """

    name: str
    crop: bool
    area: tuple = (1.0, 1.0)
    ratio: tuple = (1.0, 1.0)
    flip: bool = False


def augmentation(name, min_crop_area=DEFAULT_MIN_CROP_AREA):
    """The :class:`Augmentation` called ``name``; ``min_crop_area`` sets ``imagenet``'s smallest crop.

    An unknown name raises :class:`DataError`, listing the choices.
    """
    if name == "imagenet":
        return Augmentation("imagenet", True, (min_crop_area, 1.0), CROP_RATIO, True)
    if name == "light":
        return Augmentation("light", True, (0.64, 1.0), (0.9, 1.0 / 0.9), True)
    if name == "none":
        return Augmentation("none", False)
    raise DataError(f"augment {name!r}: choose one of {', '.join(AUGMENTATIONS)}")


def resolve_augment(name, image_size, manifest=None):
    """The augmentation ``auto`` means for a data set (``docs/training.md``); any other name is returned as it is.

    An unknown name, in the argument or the manifest, raises :class:`DataError`.

    Parameters
    ----------
    name : str
        One of :data:`AUGMENT_CHOICES`.
    image_size : int
    manifest : dict, optional
        The data set's ``manifest.json`` (folder) or ``PREFIX_classes.json`` (recordio).
    """
    manifest = manifest or {}
    if name not in AUGMENT_CHOICES:
        raise DataError(f"augment {name!r}: choose one of {', '.join(AUGMENT_CHOICES)}")
    if name != "auto":
        return name
    if manifest.get("augment") is not None:
        if manifest["augment"] not in AUGMENTATIONS:
            raise DataError(f"the data set's manifest asks for augment {manifest['augment']!r}, which is not one of "
                            f"{', '.join(AUGMENTATIONS)}; fix the manifest or pass --augment")
        return manifest["augment"]
    if manifest.get("min_crop_area") is not None:
        return "imagenet"
    return "light" if image_size < SMALL_IMAGE else "imagenet"
