"""A small, learnable image-classification set: shapes on noisy backgrounds (``docs/data.md``, "The demo set")."""
import logging
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ..plumbing.fileio import write_json
from ..plumbing.output import Output, refusals_as
from .layout import MANIFEST, data_set_contents, read_manifest
from .validate import DataError

__all__ = ["SHAPES", "synth_dataset", "demo_dataset", "DEMO_SETTINGS"]

LOG = logging.getLogger("mxfp16.data")

SHAPES = ("bar", "circle", "crescent", "cross", "lshape", "ring", "square", "star", "triangle", "two_dots")
FORMAT_VERSION = 4
# A random resized crop down to 8% of the area (the ImageNet default) keeps less than 60% of the
# shape in about 35% of the crops; down to 40%, in about 10%. make_loaders reads this hint.
MIN_CROP_AREA = 0.4
DEMO_SETTINGS = {"classes": 10, "per_class": 100, "test_per_class": 100, "size": 128, "seed": 0}
#: Seconds :func:`demo_dataset` waits for another process making the demo set (a few seconds of work).
DEMO_WAIT = 600
#: JPEG quality of the generated images.
QUALITY = 90


# Shapes are drawn near upright (tilted at most MAX_TILT radians): full rotations made the set far
# harder to learn from 100 images per class without making it more instructive.
MAX_TILT = 0.35
_UPRIGHT = {"square": math.pi / 4, "triangle": -math.pi / 2, "star": -math.pi / 2}


def _polygon(rng_angle, radius, center, corners, inner=None):
    """Vertices of a regular polygon (or a star when ``inner`` is a radius ratio)."""
    points = []
    steps = corners * (2 if inner else 1)
    for k in range(steps):
        r = radius * (inner if inner and k % 2 else 1.0)
        a = rng_angle + 2 * math.pi * k / steps
        points.append((center[0] + r * math.cos(a), center[1] + r * math.sin(a)))
    return points


def _rotated_rect(angle, half_w, half_h, center):
    c, s = math.cos(angle), math.sin(angle)
    return [(center[0] + x * c - y * s, center[1] + x * s + y * c)
            for x, y in ((-half_w, -half_h), (half_w, -half_h), (half_w, half_h), (-half_w, half_h))]


def _draw_mask(shape, draw, rng, center, r):
    """Draw ``shape`` in white (255) on the mask; black (0) cuts holes."""
    cx, cy = center
    angle = _UPRIGHT.get(shape, 0.0) + rng.uniform(-MAX_TILT, MAX_TILT)
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=255)
    elif shape == "ring":
        draw.ellipse(box, fill=255)
        k = r * rng.uniform(0.45, 0.65)
        draw.ellipse((cx - k, cy - k, cx + k, cy + k), fill=0)
    elif shape == "crescent":
        draw.ellipse(box, fill=255)
        d = r * rng.uniform(0.35, 0.6)
        ox, oy = cx + d * math.cos(angle), cy + d * math.sin(angle)
        draw.ellipse((ox - r, oy - r, ox + r, oy + r), fill=0)
    elif shape in ("square", "triangle"):
        draw.polygon(_polygon(angle, r, center, 4 if shape == "square" else 3), fill=255)
    elif shape == "lshape":
        arm = r * rng.uniform(0.3, 0.4)
        corner = [(-r, -r), (r, -r), (r, -r + arm), (-r + arm, -r + arm), (-r + arm, r), (-r, r)]
        c, s = math.cos(angle), math.sin(angle)
        draw.polygon([(cx + x * c - y * s, cy + x * s + y * c) for x, y in corner], fill=255)
    elif shape == "star":
        draw.polygon(_polygon(angle, r, center, 5, inner=rng.uniform(0.35, 0.5)), fill=255)
    elif shape == "cross":
        arm = r * rng.uniform(0.22, 0.32)
        draw.polygon(_rotated_rect(angle, r, arm, center), fill=255)
        draw.polygon(_rotated_rect(angle, arm, r, center), fill=255)
    elif shape == "bar":
        draw.polygon(_rotated_rect(angle, r, r * rng.uniform(0.15, 0.25), center), fill=255)
    elif shape == "two_dots":
        k, d = r * rng.uniform(0.3, 0.4), r * 0.6
        for sign in (-1, 1):
            ox, oy = cx + sign * d * math.cos(angle), cy + sign * d * math.sin(angle)
            draw.ellipse((ox - k, oy - k, ox + k, oy + k), fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}")


_LUMA = np.array([0.299, 0.587, 0.114])


def _contrasting_colour(rng, background):
    """A random colour whose brightness differs from ``background``'s by at least 80 of 255."""
    for _ in range(50):
        colour = rng.integers(0, 256, 3)
        if abs(float((colour - background) @ _LUMA)) >= 80:
            return colour
    return np.where(background @ _LUMA > 127, 0, 255) * np.ones(3, dtype=np.int64)


def render(shape, rng, size):
    """One RGB image of ``shape`` (a ``PIL.Image``), its size drawn around ``size``."""
    width, height = (int(size * rng.uniform(0.8, 1.25)) for _ in range(2))
    base = rng.integers(0, 256, 3).astype(np.float32)
    tilt = rng.integers(-60, 61, 3).astype(np.float32)
    ramp = (np.linspace(-0.5, 0.5, width, dtype=np.float32)[None, :, None] * tilt
            + np.linspace(-0.5, 0.5, height, dtype=np.float32)[:, None, None] * tilt[::-1])
    # One noise field serves both layers (scaled differently): drawing it is most of the cost.
    noise = rng.standard_normal((height, width, 3), dtype=np.float32)
    background = base + ramp + noise * np.float32(rng.uniform(4, 14))
    colour = _contrasting_colour(rng, base)
    foreground = colour.astype(np.float32) + noise[::-1] * np.float32(6)

    mask = Image.new("L", (width, height), 0)
    r = min(width, height) * rng.uniform(0.24, 0.4)
    center = (rng.uniform(r, width - r), rng.uniform(r, height - r))
    _draw_mask(shape, ImageDraw.Draw(mask), rng, center, r)
    alpha = np.asarray(mask.filter(ImageFilter.GaussianBlur(0.7)), dtype=np.float32)[..., None] / np.float32(255)
    pixels = background * (1 - alpha) + foreground * alpha

    clutter = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    lines = ImageDraw.Draw(clutter)
    for _ in range(int(rng.integers(0, 3))):
        xy = [(float(rng.uniform(0, width)), float(rng.uniform(0, height))) for _ in range(2)]
        lines.line(xy, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=1)
    return clutter


def _expected_manifest(classes, per_class, test_per_class, size, seed):
    return {"kind": "synth", "format_version": FORMAT_VERSION, "classes": list(SHAPES[:classes]),
            "per_class": {"train": per_class, "test": test_per_class}, "size": size, "seed": seed,
            "min_crop_area": MIN_CROP_AREA}


def _is_complete(out, expected):
    """True when ``out`` holds the set ``expected`` describes, every file present."""
    manifest = read_manifest(out)
    if manifest is None or {k: manifest.get(k) for k in expected} != expected:
        return False
    return all((out / split / name).is_dir() and sum(1 for _ in (out / split / name).glob("*.jpg")) == count
               for split, count in expected["per_class"].items() for name in expected["classes"])


def synth_dataset(out, classes=10, per_class=100, test_per_class=30, size=128, seed=0, quality=QUALITY,
                  overwrite=False):
    """Generate the shapes set into ``out`` (``train/<class>/*.jpg``, ``test/...``, ``manifest.json``).

    ``out`` is an :class:`mxfp16.plumbing.output.Output`; the same set there (every file present) is reused.

    Parameters
    ----------
    out : str or Path
    classes : int
        Number of classes, at most ``len(SHAPES)`` (10).
    per_class, test_per_class : int
        Training and test images per class.
    size : int
        Typical image side in pixels; each image's width and height are drawn
        from ``[0.8 size, 1.25 size]``.
    seed : int
    quality : int
        JPEG quality.
    overwrite : bool
        Replace a different synthetic set at ``out`` (never anything else).

    Returns
    -------
    Path
    """
    if not 1 <= classes <= len(SHAPES):
        raise DataError(f"--classes {classes}: the synthetic set has 1 to {len(SHAPES)} classes ({', '.join(SHAPES)}).")
    if per_class < 1 or test_per_class < 0 or size < 16:
        raise DataError(f"per_class={per_class}, test_per_class={test_per_class}, size={size}: need per_class >= 1, "
                        "test_per_class >= 0 and size >= 16.")
    return _synth(Path(out), _expected_manifest(classes, per_class, test_per_class, size, seed), quality, overwrite)


def _synth(out, expected, quality, overwrite, wait=0):
    """:func:`synth_dataset` of the settings ``expected`` describes; ``wait``: for a process making it meanwhile."""
    output = Output(out, "generating a synthetic set", overwrite=overwrite, contents=CONTENTS, wait=wait,
                    reuse=lambda folder: _is_complete(folder, expected),
                    refusal="it does not hold this synthetic set (settings differ or files are missing). Replace it "
                            "with --overwrite (a synthetic set only), delete it, or choose another --out")
    with refusals_as(DataError), output:
        if not output.reused:
            _generate(output, expected, quality)
    return out


def _generate(output, expected, quality):
    """Draw every image of the set ``expected`` describes into a staging folder, and publish it."""
    tmp = output.stage()
    classes, size, seed = len(expected["classes"]), expected["size"], expected["seed"]
    counts = expected["per_class"]
    for split_index, split in enumerate(("train", "test")):
        for class_index, shape in enumerate(expected["classes"]):
            folder = tmp / split / shape
            folder.mkdir(parents=True)
            for i in range(counts[split]):
                rng = np.random.default_rng([seed, split_index, class_index, i])
                render(shape, rng, size).save(folder / f"{shape}_{i:05d}.jpg", quality=quality)
    write_json(tmp / MANIFEST, dict(expected, counts={split: count * classes for split, count in counts.items()}))
    output.publish(tmp)
    LOG.info("generated %s", output.path)


#: What a synthetic set's folder holds: one whose manifest says it is one is what ``overwrite`` may replace.
CONTENTS = data_set_contents("synth", "a synthetic set")


def demo_path(root="data"):
    """Where :func:`demo_dataset` keeps the demo set under ``root`` (without generating it)."""
    return Path(root) / "demo"


def demo_dataset(root="data"):
    """The demo set: ``<root>/demo``, generated on first use (a few seconds), reused afterwards.

    :func:`synth_dataset` with :data:`DEMO_SETTINGS`; one made with other settings (an older mxfp16's) is regenerated.

    Parameters
    ----------
    root : str or Path

    Returns
    -------
    Path
    """
    # The workers of one job start together: one makes the set, the others wait for it and reuse it.
    return _synth(demo_path(root), _expected_manifest(**DEMO_SETTINGS), QUALITY, overwrite=True, wait=DEMO_WAIT)
