"""Training and evaluation batches from a folder split (``folder``) or from RecordIO (``recordio``).

What each pipeline yields, reads, augments, orders, resumes and shards, and why every worker gets as many training
images: ``docs/data.md`` ("The pipelines"); which augmentation to pick: ``docs/training.md`` ("Which augmentation").
"""
import hashlib
import logging
import math
import os
import random
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..plumbing.fileio import JSONFileError, read_json
from ..plumbing.output import error_line, shown
from .augment import DEFAULT_MIN_CROP_AREA, augmentation, resolve_augment
from .layout import MANIFEST, PIPELINES, pack_problem, read_manifest, split_problem
from .records import CHECKSUM as RECORD_CHECKSUM
from .records import damaged_records, read_index
from .validate import DataError, scan_classes

__all__ = ["Loaders", "make_loaders", "MEAN_RGB", "STD_RGB", "read_image", "resize_for", "center_view", "normalise"]

LOG = logging.getLogger("mxfp16.data")

MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)


def read_image(path):
    """Decode an image file as uint8 HWC RGB, whatever bytes its name holds.

    The file is read by Python and decoded from memory: ``mx.image.imread`` hands the name to C++ as UTF-8, which
    fails on a POSIX name that is not UTF-8. ``OSError``: the file cannot be read; ``mxnet.base.MXNetError``: the
    bytes do not decode.
    """
    return mx.image.imdecode(Path(path).read_bytes(), flag=1)


def resize_for(image_size):
    """The short side the evaluation transform resizes to before the center crop (256 for 224)."""
    return int(round(image_size / 0.875))


def center_view(image, crop, short_side=None):
    """The evaluation view of one decoded image: the short side resized, then the central square.

    :func:`mxfp16.inference.preprocess.center_view` is its numpy port (prediction runs without MXNet), with the
    same parameters and the same pixels.

    Parameters
    ----------
    image : NDArray
        uint8 HWC, RGB (``mx.image.imread``).
    crop : int
        Side of the square crop (the training ``image_size``).
    short_side : int, optional
        What the short side is resized to first (default :func:`resize_for` of ``crop``).

    Returns
    -------
    NDArray
        uint8 ``(crop, crop, 3)``.
    """
    short_side = resize_for(crop) if short_side is None else short_side
    return mx.image.center_crop(mx.image.resize_short(image, short_side), (crop, crop))[0]


def normalise(batch_hwc, mean=MEAN_RGB, std=STD_RGB):
    """uint8 NHWC -> float32 NCHW, scaled to [0, 1] then normalised (gluon's ToTensor + Normalize on a batch)."""
    return mx.nd.image.normalize(mx.nd.image.to_tensor(batch_hwc), mean=mean, std=std)


class _FolderImages(gluon.data.Dataset):
    """One view of ``items`` (``(path, label)``; ``epoch`` ``None``: the evaluation transform): decode, crop, flip."""

    def __init__(self, items, image_size, seed=0, epoch=None, augment=None):
        self.items, self._size, self._seed, self._epoch = items, image_size, seed, epoch
        self._augment = augment or augmentation("none")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        path, label = self.items[idx]
        try:
            img = read_image(path)
        except Exception as err:  # any decoder failure becomes a DataError with the path
            raise DataError(f"cannot decode {shown(path)} ({type(err).__name__}: {error_line(err)[:200]}). "
                            "Delete or replace the file, then restart; the scan when the data set is opened "
                            "normally skips such files.") from None
        if self._epoch is None:
            return center_view(img, self._size), label
        augment, state = self._augment, random.getstate()
        # Python's random is what mx.image.random_size_crop draws from: seeded per image, then restored.
        random.seed(f"{self._seed}/{self._epoch}/{idx}")
        try:
            if augment.crop:
                img = mx.image.random_size_crop(img, (self._size, self._size), augment.area, augment.ratio)[0]
            else:
                img = center_view(img, self._size)
            flip = augment.flip and random.random() < 0.5
        finally:
            random.setstate(state)
        if flip:
            img = mx.nd.flip(img, axis=1)
        return img, label


class Loaders:
    """Training and test batches of one data set for one worker.

    Attributes
    ----------
    classes : list of str
        Class names; the label of class ``classes[i]`` is ``i``.
    num_train : int
        Training images per epoch in this worker's shard.
    num_test : int
    batch_size : int
    train_batches_per_epoch : int
        The last partial batch counts.
    skipped : list of (str, str)
        ``(path, reason)`` of files left out by the scan (folder pipeline).
    pipeline : str
    min_crop_area : float
        Smallest random-resized-crop area used for training.
    """

    pipeline = None
    min_crop_area = DEFAULT_MIN_CROP_AREA

    def __init__(self, classes, num_train, num_test, batch_size, skipped=()):
        self.classes, self.num_train, self.num_test = list(classes), num_train, num_test
        self.batch_size, self.skipped = batch_size, list(skipped)

    @property
    def train_batches_per_epoch(self):
        return math.ceil(self.num_train / self.batch_size)

    def train_batches(self, epoch, start_batch=0):
        """Iterate over ``(data, label)`` training batches of ``epoch``, from batch ``start_batch``."""
        raise NotImplementedError

    def test_batches(self):
        """Iterate over ``(data, label)`` test batches (evaluation transform, fixed order)."""
        raise NotImplementedError

    def fingerprint(self):
        """What identifies the data cheaply, for ``--resume`` to notice a data set changed at the same path.

        Returns
        -------
        dict
            ``files``: how many files; ``sha256``: over each file's name
            (relative to the data set) and size, in order; ``per_class``:
            ``{class: [train files, test files]}``.
        """
        entries = self._fingerprint_entries()
        digest = hashlib.sha256()
        for name, size in entries:
            digest.update(os.fsencode(name) + b"\0" + str(size).encode() + b"\n")
        return {"files": len(entries), "sha256": digest.hexdigest(), "per_class": self._class_counts()}

    def _check_start(self, start_batch):
        if not 0 <= start_batch <= self.train_batches_per_epoch:
            raise ValueError(f"start_batch={start_batch} is outside 0..{self.train_batches_per_epoch}")


def _crop_area(value, manifest, where):
    """``value``, else the ``min_crop_area`` the data set's ``manifest`` (read from ``where``) asks for, else 0.08."""
    if value is None:
        value = manifest.get("min_crop_area")
    value = DEFAULT_MIN_CROP_AREA if value is None else float(value)
    if not 0 < value <= 1:
        raise DataError(f"min_crop_area={value} (from the argument or {where}): need 0 < min_crop_area <= 1.")
    return value


def _epoch_order(num_items, seed, epoch):
    return np.random.RandomState(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]).permutation(num_items)


class _FolderLoaders(Loaders):
    """The ``folder`` pipeline (see the module docstring)."""

    pipeline = "folder"

    def __init__(self, root, image_size, batch_size, workers, seed, shard, min_crop_area=None, augment="auto"):
        root = Path(root)
        problem = split_problem(root)  # the raw download, a pack prefix, ...: name the command that fixes it
        if problem:
            raise DataError(problem)
        manifest = read_manifest(root) or {}  # it only holds hints
        self.min_crop_area = _crop_area(min_crop_area, manifest, root / MANIFEST)
        self.augment = augmentation(resolve_augment(augment, image_size, manifest), self.min_crop_area)
        train_scan = scan_classes(root / "train", "training split").require_every_class()
        test_scan = scan_classes(root / "test", "test split")
        unknown = sorted(set(test_scan.classes) - set(train_scan.classes))
        if unknown:
            raise DataError(f"{root / 'test'} has classes that {root / 'train'} lacks: {', '.join(unknown[:10])}. "
                            "Both splits must come from the same `mxfp16 data split`.")
        classes = train_scan.classes
        index = {name: i for i, name in enumerate(classes)}  # TRAINING classes label both: a test split may lack one
        # The scan's files; the test view is the evaluation view, a training view is made per epoch.
        self._train, self._test = (_FolderImages([(path, index[name]) for path, name in scan.items], image_size)
                                   for scan in (train_scan, test_scan))
        self._rank, self._parts = shard
        per_shard = len(self._train.items) // self._parts
        if per_shard == 0:
            raise DataError(f"{root / 'train'} has {len(self._train.items)} images, fewer than the "
                            f"{self._parts} workers sharing it.")
        super().__init__(classes, per_shard, len(self._test.items), batch_size, train_scan.skipped + test_scan.skipped)
        self._size, self._workers, self._seed, self._root = image_size, workers, seed, root

    def _batches(self, view, batch_indices):
        loader = gluon.data.DataLoader(view, batch_sampler=batch_indices, num_workers=self._workers)
        for data, label in loader:
            yield normalise(data), label.astype("float32")

    def train_batches(self, epoch, start_batch=0):
        self._check_start(start_batch)
        order = _epoch_order(len(self._train.items), self._seed, epoch)[self._rank::self._parts][:self.num_train]
        batches = [order[i:i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size)]
        view = _FolderImages(self._train.items, self._size, self._seed, epoch, self.augment)
        return self._batches(view, batches[start_batch:])

    def test_batches(self):
        n = len(self._test.items)
        batches = [list(range(i, min(i + self.batch_size, n))) for i in range(0, n, self.batch_size)]
        return self._batches(self._test, batches)

    def _fingerprint_entries(self):
        entries = []
        for dataset in (self._train, self._test):
            for path, _ in dataset.items:
                try:
                    size = os.stat(path).st_size
                except OSError:
                    size = -1  # gone since the scan: a change like any other
                entries.append((os.path.relpath(path, self._root), size))
        return entries

    def _class_counts(self):
        counts = {name: [0, 0] for name in self.classes}
        for column, dataset in enumerate((self._train, self._test)):
            for _, label in dataset.items:
                counts[self.classes[label]][column] += 1
        return counts


def record_files(prefix, split):
    """The ``.rec`` and ``.idx`` paths of ``split`` ('train' or 'test') under a pack prefix."""
    return Path(f"{prefix}_{split}.rec"), Path(f"{prefix}_{split}.idx")


def classes_file(prefix):
    """The JSON file beside a pack that lists the classes and counts."""
    return Path(f"{prefix}_classes.json")


def _check_record_files(prefix, split, count, checksums):
    """Refuse a missing, truncated, mismatched or damaged ``.rec``/``.idx`` pair before ImageRecordIter reads it.

    MXNet's C++ reader aborts the process on a damaged record; ``checksums`` also catches changed image or label bytes.
    """
    rec, idx = record_files(prefix, split)
    fix = f"re-run `mxfp16 data pack --src DIR --out {shown(prefix)}`"
    for path in (rec, idx):
        if not path.is_file():
            raise DataError(f"{shown(path)} not found; {fix}.")
    try:
        entries = read_index(idx)
        damaged = damaged_records(rec, idx, entries=entries, checksums=checksums)
    except (ValueError, OSError) as err:
        raise DataError(f"{shown(idx)} cannot be read ({err}); {fix}.") from None
    if len(entries) != count:
        raise DataError(f"{shown(idx)} lists {len(entries)} records but {shown(classes_file(prefix))} says {count}; "
                        f"{fix}.")
    if damaged:
        listed = "; ".join(f"record {key} at byte {offset}: {why}" for key, offset, why in damaged[:5])
        raise DataError(f"{shown(rec)} has damaged records ({listed}{' ...' if len(damaged) > 5 else ''}): the "
                        f"file was truncated or changed after packing; {fix}.")


def _record_checksums(meta, meta_path):
    """Whether the pack's records carry checksums (an older mxfp16's pack has none: used, with a warning)."""
    kind = meta.get("record_checksum")
    if kind == RECORD_CHECKSUM:
        return True
    if kind is not None:
        raise DataError(f"{shown(meta_path)} names record checksums {str(kind)[:40]!r}, which this mxfp16 does not "
                        "know; re-run `mxfp16 data pack` with this mxfp16.")
    LOG.warning("%s was packed by an older mxfp16 whose records carry no checksum: bytes changed inside a record "
                "cannot be detected. Re-run `mxfp16 data pack` to have every record checked", shown(meta_path))
    return False


class _RecordLoaders(Loaders):
    """The ``recordio`` pipeline (see the module docstring)."""

    pipeline = "recordio"

    def __init__(self, prefix, image_size, batch_size, workers, seed, shard, min_crop_area=None, augment="auto"):
        meta_path = classes_file(prefix)
        if not meta_path.is_file():
            raise DataError(pack_problem(prefix) or f"{shown(meta_path)} not found: {shown(prefix)} is not a complete "
                            f"pack. Create it with `mxfp16 data pack --src DIR --out {shown(prefix)}`.")
        try:
            meta = read_json(meta_path, "re-run `mxfp16 data pack`", fields={"classes": list, "counts": dict})
            counts = {split: meta["counts"][split] for split in ("train", "test")}
        except (JSONFileError, KeyError) as err:
            why = err if isinstance(err, JSONFileError) else f"{shown(meta_path)} lacks counts"
            raise DataError(f"{why}.") from None
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts.values()) or not all(
                isinstance(c, str) for c in meta["classes"]):
            raise DataError(f"{shown(meta_path)} holds counts or classes of the wrong type; re-run `mxfp16 data pack`.")
        checksums = _record_checksums(meta, meta_path)
        for split in ("train", "test"):
            _check_record_files(prefix, split, counts[split], checksums)
        self._prefix, self._size, self._seed = str(prefix), image_size, seed
        self.min_crop_area = _crop_area(min_crop_area, meta, meta_path)
        self.augment = augmentation(resolve_augment(augment, image_size, meta), self.min_crop_area)
        self._threads = max(1, workers)
        self._rank, self._parts = shard
        total = meta["counts"]["train"]
        # ImageRecordIter gives part r the records [r*step, (r+1)*step) with step = ceil(total / parts);
        # the last part is the smallest, and every worker stops there.
        per_shard = total - (self._parts - 1) * math.ceil(total / self._parts)
        if per_shard <= 0:
            raise DataError(f"{prefix} has {total} training images, too few for {self._parts} workers "
                            "(ImageRecordIter's last part would be empty); use fewer workers or the folder pipeline.")
        # ImageRecordIter fills a last batch by wrapping around once; with more than twice the images of a
        # split (or a worker's part) in one batch it fails inside C++ ("number of input images must be
        # bigger than the batch size", checked here: 6 images serve a batch of 12, not of 13).
        for what, count in (("training" + (" part of each worker" if self._parts > 1 else ""), per_shard),
                            ("test", meta["counts"]["test"])):
            if batch_size > 2 * count:
                raise DataError(f"{shown(prefix)}'s {what} split holds {count} images, too few for a batch of "
                                f"{batch_size}: MXNet's RecordIO reader serves at most twice a split's images in "
                                f"one batch. Use --batch-size {2 * count} or less, or the folder pipeline.")
        super().__init__(meta["classes"], per_shard, meta["counts"]["test"], batch_size, meta.get("skipped", []))
        self._meta = meta

    def _fingerprint_entries(self):
        files = [*record_files(self._prefix, "train"), *record_files(self._prefix, "test"), classes_file(self._prefix)]
        return [(path.name, path.stat().st_size if path.exists() else -1) for path in files]

    def _class_counts(self):
        per_class = self._meta.get("per_class") or {}
        return {name: list(per_class.get(name, [None, None])) for name in self.classes}

    def _iter(self, split, **kwargs):
        rec, idx = record_files(self._prefix, split)
        return mx.io.ImageRecordIter(
            path_imgrec=str(rec), path_imgidx=str(idx), data_shape=(3, self._size, self._size),
            batch_size=self.batch_size, preprocess_threads=self._threads, verbose=False,
            mean_r=MEAN_RGB[0] * 255, mean_g=MEAN_RGB[1] * 255, mean_b=MEAN_RGB[2] * 255,
            std_r=STD_RGB[0] * 255, std_g=STD_RGB[1] * 255, std_b=STD_RGB[2] * 255, **kwargs)

    @staticmethod
    def _strip(batches, limit):
        """Drop ImageRecordIter's padding (``batch.pad``) and stop after ``limit`` images."""
        seen = 0
        for batch in batches:
            n = min(batch.data[0].shape[0] - batch.pad, limit - seen)
            if n <= 0:
                return
            data, label = batch.data[0], batch.label[0]
            if n < data.shape[0]:
                data, label = data[:n], label[:n]
            seen += n
            yield data, label.reshape((-1,)).astype("float32")
            if seen >= limit:
                return

    def train_batches(self, epoch, start_batch=0):
        self._check_start(start_batch)
        key = int(np.random.SeedSequence([self._seed, epoch]).generate_state(1)[0] % (2 ** 31))
        a = self.augment
        crop = (dict(random_resized_crop=True, min_random_area=a.area[0], max_random_area=a.area[1],
                     min_aspect_ratio=a.ratio[0], max_aspect_ratio=a.ratio[1]) if a.crop
                else dict(resize=resize_for(self._size)))  # the evaluation transform: short side, then center crop
        it = self._iter("train", shuffle=True, seed=key, seed_aug=key, rand_mirror=a.flip,
                        part_index=self._rank, num_parts=self._parts, **crop)
        batches = self._strip(it, self.num_train)
        for _ in range(start_batch):
            next(batches, None)
        return batches

    def test_batches(self):
        return self._strip(self._iter("test", shuffle=False, resize=resize_for(self._size)), self.num_test)


def make_loaders(source, image_size=224, batch_size=32, workers=0, pipeline="folder", seed=0, shard=(0, 1),
                 min_crop_area=None, augment="auto"):
    """Training and test batches of a data set, for one worker of ``shard[1]``.

    Parameters
    ----------
    source : str or Path
        ``pipeline='folder'``: a folder with ``train/<class>/`` and ``test/<class>/`` (``mxfp16.data.demo_dataset()``,
        ``mxfp16 data split``). ``pipeline='recordio'``: the prefix given to ``mxfp16 data pack``.
    image_size : int
        Side of the square crops.
    batch_size : int
    workers : int
        DataLoader worker processes (folder) or decoding threads (recordio, at least 1).
    pipeline : {'folder', 'recordio'}
    seed : int
        Seeds the order and the augmentation of every epoch.
    shard : (int, int)
        ``(rank, num_workers)``: read only this worker's share of the training data.
    augment : str
        One of :data:`~mxfp16.data.augment.AUGMENT_CHOICES`; the loaders' ``augment.name`` says what ``auto`` chose.
    min_crop_area : float, optional
        Smallest area of the random resized crop, as a share of the image (``None``: the manifest's, else 0.08).

    Returns
    -------
    Loaders

    Raises
    ------
    DataError
        The data set is missing, empty, has a class without images, or is an incomplete pack.
    """
    rank, parts = (int(v) for v in shard)
    if not 0 <= rank < parts:
        raise ValueError(f"shard={shard}: need 0 <= rank < num_workers")
    if batch_size < 1 or image_size < 8 or workers < 0:
        raise ValueError(f"batch_size={batch_size}, image_size={image_size}, workers={workers}: need batch_size >= 1, "
                         "image_size >= 8, workers >= 0")
    kinds = {"folder": _FolderLoaders, "recordio": _RecordLoaders}
    if pipeline not in kinds:
        raise ValueError(f"pipeline={pipeline!r}: choose one of {', '.join(PIPELINES)}")
    return kinds[pipeline](source, image_size, batch_size, workers, seed, (rank, parts), min_crop_area, augment)
