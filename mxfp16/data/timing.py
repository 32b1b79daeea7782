"""Images per second of the input pipelines, with the sizes of the images used (``docs/data.md``, "Benchmark").

The clock starts after the first batch (start-up is ``first_batch_s``). ``images_per_cpu_second`` divides by the CPU
time this process spent (all its threads; not worker processes): on a busy machine, an estimate of one idle core.
"""
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from ..plumbing.fileio import read_json
from .pack import pack_recordio
from .pipelines import classes_file, make_loaders

__all__ = ["bench_pipelines"]


def _image_sizes(folder, limit=2000):
    """Width and height statistics of up to ``limit`` images under ``folder`` (headers only)."""
    sizes = []
    for path in sorted(Path(folder).rglob("*")):
        if path.suffix.lower() in (".jpg", ".jpeg", ".png"):
            with Image.open(path) as img:
                sizes.append(img.size)
            if len(sizes) >= limit:
                break
    if not sizes:
        return {"count": 0}
    w, h = np.array(sizes).T
    return {"count": len(sizes), "mean_width": float(w.mean()), "mean_height": float(h.mean()),
            "min": [int(w.min()), int(h.min())], "max": [int(w.max()), int(h.max())]}


def _time_pipeline(source, pipeline, workers, image_size=224, batch_size=32, images=600):
    """Time one pipeline's training batches; returns a dict with ``images_per_second``."""
    loaders = make_loaders(source, image_size=image_size, batch_size=batch_size, workers=workers, pipeline=pipeline)
    counted, first_batch_s, epoch = 0, None, 0
    start = time.perf_counter()
    while counted < images:
        for data, label in loaders.train_batches(epoch):
            data.wait_to_read()
            label.wait_to_read()
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
                start, cpu_start = time.perf_counter(), time.process_time()
                continue
            counted += data.shape[0]
            if counted >= images:
                break
        epoch += 1
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    in_process = pipeline == "recordio" or workers == 0
    # ImageRecordIter decodes on preprocess_threads (at least one); the folder loader's DataLoader on processes.
    parallel = ("threads", max(1, workers)) if pipeline == "recordio" else ("processes", workers)
    return {"pipeline": pipeline, "workers": workers, parallel[0]: parallel[1],
            "images": counted, "seconds": elapsed, "images_per_second": counted / elapsed,
            "cpu_seconds": cpu if in_process else None,
            "images_per_cpu_second": counted / cpu if in_process and cpu > 0 else None,
            "first_batch_s": first_batch_s}


def bench_pipelines(src, image_size=224, workers=2, batch_size=32, images=600, pack_resize=0):
    """Benchmark the folder pipeline (0 and ``workers`` workers) and RecordIO (1 and ``workers`` threads).

    Parameters
    ----------
    src : str or Path
        A folder split (``train/``, ``test/``): it is packed into a temporary
        RecordIO (``pack_resize`` short side, 0 keeps the size) so both
        pipelines read the same images. Or a pack prefix: RecordIO only.
    image_size, workers, batch_size : int
    images : int
        Images timed per pipeline (after the first batch).
    pack_resize : int

    Returns
    -------
    dict
        ``results`` (one row per pipeline), ``image_sizes``, ``settings``, ``load_average``.
    """
    src = Path(src)
    counts = sorted({0, workers})
    load_before = os.getloadavg()
    results, sizes, pack_s = [], None, None
    with tempfile.TemporaryDirectory(prefix="mxfp16-bench-") as tmp:
        if classes_file(src).is_file():
            prefix = src
            meta = read_json(classes_file(src), "re-run `mxfp16 data pack`")
            source = Path(meta.get("source", ""))
            # A resized pack holds other sizes than its source: report sizes only for an unresized one.
            if not meta.get("resize") and (source / "train").is_dir():
                sizes = _image_sizes(source / "train")
        else:
            sizes = _image_sizes(src / "train")
            for n in counts:
                results.append(_time_pipeline(src, "folder", n, image_size, batch_size, images))
            prefix = Path(tmp) / "pack"
            start = time.perf_counter()
            pack_recordio(src, prefix, resize=pack_resize, workers=max(1, workers))
            pack_s = time.perf_counter() - start
        for n in sorted({max(1, c) for c in counts}):
            results.append(_time_pipeline(prefix, "recordio", n, image_size, batch_size, images))
    return {"results": results, "image_sizes": sizes, "pack_seconds": pack_s,
            "settings": {"source": str(src), "image_size": image_size, "batch_size": batch_size,
                         "images": images, "workers": workers, "pack_resize": pack_resize, "cpu_count": os.cpu_count()},
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())}}
