"""``mxfp16 export``: a finished run's checkpoint as a deployable model, checked against float32 first.

:func:`export_run` rebuilds the run's network in float32, converts it (:func:`mxfp16.inference.convert.deployable`),
has the model format (:mod:`mxfp16.inference.formats`) write it to a staging folder and check it against float32 on
the run's test set, then publishes it in one step (``docs/inference.md``, "The agreement check").

Export holds the run folder's lock shared while it reads, and works from
a checked copy of the checkpoint (:func:`mxfp16.train.checkpoint.copy_params`);
``docs/getting-started.md`` ("Inputs are held too") says why.
"""
import datetime
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

import mxnet as mx

from .._internals import saved_parameter_shapes
from .._version import __version__
from ..data import DataError, make_loaders
from ..data.pipelines import MEAN_RGB, STD_RGB, resize_for
from ..devices import format_ctx, resolve_devices
from ..plumbing.fileio import JSONFileError, sha256_file
from ..plumbing.limits import MAX_IMAGE_SIDE
from ..plumbing.ndarray_file import NDArrayFileError, check_shapes
from ..plumbing.output import Output, OutputFolderError, PathBusyError, PathLock, check_output_path, shown
from ..precision import PrecisionError, resolve_precision
from ..train import checkpoint as ckpt
from ..train.checkpoint import CHECKPOINT_CHOICES
from ..train.outputs import RunOutputs
from ..train.parts import PartsSpec, build_network
from . import bundle, formats
from .agreement import DEFAULT_MARGIN
from .bundle import ExportError
from .convert import INPUT_NAME, deployable

__all__ = ["export_run", "ExportRequest"]


@dataclass(frozen=True)
class ExportRequest:
    """:func:`export_run`'s parameters (``dtypes``: its ``onnx_dtypes``), checked where they can be without reading.

    Raises
    ------
    ExportError
        A ``margin`` that is not a number of points between 0 and 100.
    """

    run: Union[str, Path]
    out: Union[str, Path]
    precision: Optional[str]
    checkpoint: str
    margin: float
    overwrite: bool
    amp_lists: str
    ctx: str
    data: Optional[str]
    batch_size: int
    model_format: str
    dtypes: Tuple[str, ...]

    def __post_init__(self):
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and 0 <= self.margin <= 100):
            raise ExportError(f"margin {self.margin!r}: must be a number of points between 0 and 100")


def _run_config(run):
    try:
        config = RunOutputs(run).read_config()
    except JSONFileError as err:
        raise ExportError(str(err)) from None
    if config is None:
        raise ExportError(f"{run} is not a run folder ({Path(run) / 'config.json'} not found); point --run at the "
                          "--out of a finished `mxfp16 train`")
    missing = [k for k in ("model", "image_size", "classes", "source") if k not in config]
    if missing:
        raise ExportError(f"{Path(run) / 'config.json'} lacks {', '.join(missing)}; it was not written by this "
                          "mxfp16's trainer")
    kinds = {"model": str, "image_size": int, "classes": list, "source": str}
    wrong = [k for k, kind in kinds.items() if not isinstance(config[k], kind) or isinstance(config[k], bool)]
    if not wrong:
        if not 8 <= config["image_size"] <= MAX_IMAGE_SIDE:
            wrong.append("image_size")
        if not config["classes"] or not all(isinstance(c, str) for c in config["classes"]):
            wrong.append("classes")
    if wrong:
        raise ExportError(f"{Path(run) / 'config.json'}: {', '.join(wrong)} of the wrong type or out of range; it "
                          "was changed after mxfp16 train wrote it. Restore it, or retrain")
    return config


def _finished(run, config):
    """A warning when the run stopped before its last epoch (``None`` when it finished)."""
    try:
        records = RunOutputs(run).metrics()
    except JSONFileError:
        return None  # --checkpoint best reads them and says so; last needs only the checkpoint
    planned = config.get("epochs")
    if not (Path(run) / "summary.json").exists() or (isinstance(planned, int) and len(records) < planned):
        return (f"warning: {run} has not finished: it completed {len(records)} of {planned} epochs, and the "
                "export is of its latest checkpoint. Finish it first (mxfp16 train --out RUN --resume) to export "
                "the trained model")
    return None


def _best_epoch(run):
    """The epoch with the highest val_top1 (the later one on a tie) and its val_top1."""
    try:
        records = RunOutputs(run).metrics()
    except JSONFileError as err:
        raise ExportError(f"--checkpoint best reads the epochs' accuracies: {err}") from None
    if not records:
        raise ExportError(f"--checkpoint best: {run} has no metrics.jsonl records to tell the best epoch; "
                          "use --checkpoint last")
    best = max(records, key=lambda r: (r["val_top1"], r["epoch"]))
    return best["epoch"], best["val_top1"]


def _checkpoint(run, which, config):
    """``(params path, description)`` of the checkpoint to export; refuse one written for another model."""
    try:
        if which not in CHECKPOINT_CHOICES:
            path = Path(which)
            if not path.is_file():
                raise ExportError(f"--checkpoint {which}: no such file; give last, best or a .params file")
            return path, {"checkpoint": str(path.resolve())}
        epoch, val_top1 = _best_epoch(run) if which == "best" else (None, None)
        path, record = ckpt.params_file(run, epoch)
    except ckpt.CheckpointError as err:
        raise ExportError(str(err)) from None
    saved = record.get("fingerprint", {})
    wanted = {"model": config["model"], "image_size": config["image_size"], "classes": list(config["classes"])}
    differ = [f"{k}: checkpoint {saved.get(k)!r}, config.json {v!r}" for k, v in wanted.items()
              if k in saved and saved[k] != v]
    if differ:
        raise ExportError(f"the checkpoint in {Path(run) / 'checkpoints'} was written for another model than "
                          f"{Path(run) / 'config.json'} describes ({'; '.join(differ)}); export the run that wrote it")
    source = {"checkpoint": which, "tag": path.stem}
    if epoch is not None:
        source.update(epoch=epoch, val_top1=val_top1)
    return path, source


def _copy_checkpoint(run, which, source, path, into):
    """A checked copy of the checkpoint in folder ``into`` (a run that trains may prune or replace the file)."""
    try:
        if which not in CHECKPOINT_CHOICES:
            return Path(shutil.copyfile(path, Path(into) / Path(path).name))
        copy, _ = ckpt.copy_params(run, into, source.get("epoch"))
    except ckpt.CheckpointError as err:
        raise ExportError(str(err)) from None
    source["tag"] = copy.stem  # the run may have moved on to a newer checkpoint since it was chosen
    return copy


def _reading_lock(run, log):
    """The run folder's lock, shared; ``None`` (and said so) when a run trains there, or where it cannot be taken."""
    lock = PathLock(run, "exporting it", exclusive=False)
    try:
        return lock.acquire()
    except PathBusyError:
        log(f"export: {run} is being written by {lock.holder()}; exporting its checkpoint as it stands now")
    except OSError:
        pass  # a folder this user may not write to: nothing can take the lock there to write either
    return None


def _load_network(config, params_path, ctx, param_dtype, shown_as=None):
    """The run's network rebuilt in ``param_dtype`` with the checkpoint's weights (cast on loading); ``shown_as``
    is the file to name in messages (the original of a copy)."""
    spec = PartsSpec(model=config["model"], classes=len(config["classes"]), image_size=config["image_size"])
    net = build_network(spec, ctx, param_dtype)
    what = f"{config['model']} ({len(config['classes'])} classes, {config['image_size']} px) as the run describes it"
    shown_as = shown(shown_as or params_path)
    try:
        # Names, shapes and sizes first: MXNet allocates what a file declares before reading it.
        check_shapes(params_path, saved_parameter_shapes(net), what)
    except (NDArrayFileError, OSError) as err:
        raise ExportError(f"{str(err).replace(shown(params_path), shown_as)}. It is not a checkpoint of this run's "
                          "model: give --checkpoint a .params file of this run (from its checkpoints/ folder), or "
                          "export the run that wrote it") from None
    try:
        net.load_parameters(str(params_path), ctx=ctx, cast_dtype=True, dtype_source="current")
    except (AssertionError, ValueError, KeyError, mx.base.MXNetError) as err:
        # Gluon names the first missing, unexpected or misshapen parameter.
        reason = " ".join(str(err).split())[:300].replace(str(params_path), shown_as)
        raise ExportError(f"{shown_as} does not fit {config['model']} ({len(config['classes'])} classes, "
                          f"{config['image_size']} px) as the run describes it: {reason}. It is a checkpoint of "
                          "another model; export the run that wrote it") from None
    return net


def export_run(run, out, precision=None, checkpoint="last", margin=DEFAULT_MARGIN, overwrite=False,
               amp_lists="mxfp16", ctx="auto", data=None, batch_size=32, log=print, model_format=formats.DEFAULT,
               onnx_dtypes=("float32",)):
    """Export a run's checkpoint for inference in ``precision`` (or as ONNX) after the agreement check.

    Parameters
    ----------
    run : str or Path
        A run folder of ``mxfp16 train``.
    out : str or Path
        The export folder to create.
    precision : str, optional
        A precision or ``auto`` (:func:`mxfp16.precision.resolve_precision`); default: the format's
        ``DEFAULT_PRECISION`` (ONNX takes only float32).
    checkpoint : str
        ``'last'``, ``'best'`` (the best val_top1 whose checkpoint is on disk) or a ``.params`` file's path.
    margin : float
        Refuse when the export's top-1 is more than this many percentage points below float32's.
    overwrite : bool
        Replace an existing ``out``.
    amp_lists : str
        ``'mxfp16'`` or ``'mxnet'`` (AMP precisions).
    ctx : str
        ``'auto'``, ``'cpu'`` or ``'gpu:N'``: where the check runs (one device).
    data : str, optional
        The data set whose test split the check uses (default: the run's, from ``config.json``).
    batch_size : int
        Images per batch in the check.
    log : callable
        Receives progress lines.
    model_format : str
        ``'mxnet'`` (symbol and parameters) or ``'onnx'`` (:mod:`mxfp16.inference.formats`).
    onnx_dtypes : sequence of str
        The ONNX files to write: ``'float32'`` (always) and ``'float16'``; an MXNet export refuses any but float32.

    Returns
    -------
    dict
        The content of ``export.json``.

    Raises
    ------
    ExportError
        Bad run, checkpoint, output folder or data, a precision or
        ``onnx_dtypes`` the format does not take, or (ONNX) an operator
        without a converter, named with its layer; nothing is written.
    mxfp16.inference.agreement.AgreementError
        The export fails the agreement check (``docs/inference.md``, "The
        agreement check"; ONNX: "ONNX: deploy without MXNet"); nothing is written.
    mxfp16.PrecisionError
        Unknown precision, or one these devices cannot hold.
    """
    request = ExportRequest(run=run, out=out, precision=precision, checkpoint=checkpoint, margin=margin,
                            overwrite=overwrite, amp_lists=amp_lists, ctx=ctx, data=data, batch_size=batch_size,
                            model_format=model_format, dtypes=tuple(onnx_dtypes))
    started = time.perf_counter()
    writer = formats.get(request.model_format)
    writer.check_request(request.precision, request.dtypes)  # before minutes of work, not after
    try:  # an --out that cannot be made is refused before anything is read
        check_output_path(request.out)
    except OutputFolderError as err:
        raise ExportError(str(err)) from None
    lock = _reading_lock(request.run, log)
    try:
        return _export(request, writer, log, started)
    finally:
        if lock is not None:
            lock.release()


def _export(request, writer, log, started):
    """:func:`export_run` once the run folder is locked: the run, its checkpoint, the output folder locked."""
    run, checkpoint = request.run, request.checkpoint
    config = _run_config(run)
    params_path, source = _checkpoint(run, checkpoint, config)
    dataset = request.data or config["source"]
    # The writing rule: nothing written, and nothing --overwrite removes, may be an input; the folder is
    # locked before anything decides whether it exists, and refused then, before minutes of work.
    inputs = [("the run folder", run), ("the checkpoint", params_path), ("the data set", dataset)]
    try:
        opened = Output(request.out, f"exporting {run}", overwrite=request.overwrite, inputs=inputs,
                        contents=bundle.CONTENTS).open()
    except (OutputFolderError, PathBusyError) as err:
        raise ExportError(str(err)) from None
    with opened as output:
        return _export_into(output, request, writer, log, started, (config, params_path, source, dataset))


def _export_into(output, request, writer, log, started, read):
    """Once the export folder is locked: devices, precision, the conversion, its check, the publishing."""
    run, checkpoint = request.run, request.checkpoint
    config, params_path, source, dataset = read
    unfinished = _finished(run, config) if checkpoint != "best" and source.get("tag") else None
    contexts = resolve_devices(request.ctx)[:1]
    wanted = resolve_precision(request.precision or writer.DEFAULT_PRECISION, contexts, allow_cpu_float16=True)
    if wanted.compute_dtype == "bfloat16" and contexts[0].device_type != "cpu":
        raise PrecisionError("amp-bfloat16 runs on CPUs (oneDNN); export it with --ctx cpu")
    loaders = _test_loaders(dataset, config, request.batch_size)

    staged = output.stage()
    copies = staged / ".checkpoint"
    copies.mkdir()
    params_copy = _copy_checkpoint(run, checkpoint, source, params_path, copies)
    if checkpoint in CHECKPOINT_CHOICES:
        params_path = params_path.with_name(params_copy.name)
    log(f"export: {run} ({config['model']}, {len(config['classes'])} classes, {config['image_size']} px), "
        f"checkpoint {source.get('tag', params_path.name)}, as {wanted} on {format_ctx(contexts)}")
    if unfinished:
        log(f"export: {unfinished}")
    reference = _load_network(config, params_copy, contexts, "float32", params_path)
    net = reference if wanted.param_dtype == "float32" else _load_network(config, params_copy, contexts,
                                                                          wanted.param_dtype, params_path)
    model = deployable(net, wanted, request.amp_lists)
    size = int(config["image_size"])
    files, section = writer.write(staged, model, formats.WriteOptions(input_shape=(3, size, size),
                                                                      dtypes=request.dtypes))
    written = time.perf_counter()
    agreement = writer.check(staged, files, section, formats.CheckInputs(
        reference=reference, net=net, precision=wanted, image_size=size, classes=list(config["classes"]),
        loaders=loaders, data=dataset, device=contexts[0], margin=request.margin, log=log))
    record = dict(model_format=writer.NAME, files=files, section=section, agreement={"data": str(dataset), **agreement},
                  seconds=writer.seconds(written - started, time.perf_counter() - written))
    info = _info(config, _source(run, source, params_path, params_copy, config), model, record)
    return _publish(copies, staged, output, info, log)


def _test_loaders(dataset, config, batch_size):
    """The loaders of the test split the agreement check runs on; refused unless its classes are the run's."""
    classes = list(config["classes"])
    try:
        loaders = make_loaders(dataset, image_size=config["image_size"], batch_size=batch_size,
                               pipeline=config.get("pipeline", "folder"))
    except (DataError, ValueError, OSError) as err:
        raise ExportError(f"the agreement check needs the run's test set: {err} Pass --data DIR to use another "
                          "copy of it") from None
    if list(loaders.classes) != classes:
        raise ExportError(f"the test set at {dataset} has classes {loaders.classes[:5]}... but the run was trained "
                          f"on {classes[:5]}...; pass --data with the run's own data set")
    return loaders


def _publish(copies, staged, output, info, log):
    """Drop the checkpoint copies, write export.json, seal the folder (SHA256SUMS) and move it into place."""
    shutil.rmtree(copies)
    bundle.write_info(staged, info)
    bundle.seal(staged)
    try:
        output.publish(staged)
    except OutputFolderError as err:
        raise ExportError(str(err)) from None
    log(f"export: wrote {output.path} ({', '.join(info['files'])}, {bundle.INFO_FILE}, {bundle.CHECKSUM_FILE})")
    return info


def _source(run, source, params_path, params_copy, config):
    """``export.json``'s ``source``: the run, its checkpoint (``params_copy``: the bytes read of ``params_path``)."""
    return {"run": str(Path(run).resolve()), **source, "params_file": str(Path(params_path).resolve()),
            "params_sha256": sha256_file(params_copy),
            "trained_precision": config.get("resolved_precision", config.get("precision"))}


def _info(config, source, model, written):
    """The content of ``export.json``: the run's model and checkpoint (``source``), the conversion, the format's."""
    size = int(config["image_size"])
    return {
        "format": bundle.FORMAT, "version": bundle.VERSION, "model": config["model"],
        "precision": model.precision.name, "compute_dtype": model.precision.compute_dtype,
        "classes": list(config["classes"]), "image_size": size,
        "input": {"name": INPUT_NAME, "dtype": "float32", "layout": "NCHW", "shape": [None, 3, size, size]},
        "output": {"dtype": "float32", "meaning": "logits, one per class in `classes` order; softmax gives "
                                                  "probabilities"},
        "preprocess": {"decode": "RGB", "resize_short": resize_for(size), "center_crop": size,
                       "scale": "1/255 to [0, 1] (ToTensor)", "mean_rgb": list(MEAN_RGB), "std_rgb": list(STD_RGB)},
        "conversion": model.notes, "source": source, "agreement": written["agreement"], "files": written["files"],
        "mxnet_version": mx.__version__, "mxfp16_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_format": written["model_format"], written["model_format"]: written["section"],
        "seconds": written["seconds"], "load_with": written["section"]["load_with"],
    }
