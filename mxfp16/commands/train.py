"""``mxfp16 train``: the reference trainer (float32 against mixed precision).

With no arguments it trains on the generated demo set with ``--precision
auto`` in about two minutes on a 2-core CPU. With ``--data-dir`` it is the
tutorial's run: ResNet-50 v2 on Caltech-101 (on a GPU, in float16).
"""
import argparse
import sys
import textwrap

from ..cli import CommandError
from ..precision import PRECISIONS

ORDER = 20

_DEMO = "demo set"


def _profile_default(field):
    from ..train.config import PROFILES

    data, demo = PROFILES["dataset"][field], PROFILES["demo"][field]
    return f"{data} with --data-dir; {demo} on the {_DEMO}"


def register(subparsers):
    from ..train.config import KVSTORES, LR_SCHEDULES, PROFILES

    demo = PROFILES["demo"]
    parser = subparsers.add_parser(
        "train", help="train a network in float32 or mixed precision (demo set by default)",
        description=__doc__.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill(
            "Defaults that depend on the data: with --data-dir the tutorial's run (resnet50_v2, 224 px, SGD). "
            f"Without it, the demo set gets a network a 2-core CPU trains in about two minutes: {demo['model']} at "
            f"{demo['image_size']} px with {demo['optimizer']}. Measured here: ResNet-50 at 224 px trains at about "
            "7 img/s; an ImageNet ResNet at 32 px ends in 1x1 maps, where BatchNorm's statistics fail in evaluation; "
            "cifar_resnet20_v1 at 32 px is too small per operator for bfloat16 to gain; resnet18_v1 at 48 px runs "
            "1.27x faster in bfloat16 than in float32 and ends in 2x2 maps. "
            "Outputs in --out: config.json, metrics.jsonl, summary.json, checkpoints/. See docs/training.md."))

    data = parser.add_argument_group("data")
    data.add_argument("--data-dir", default=None,
                      help="folder with train/ and test/ class folders, or a RecordIO prefix with --pipeline recordio "
                           "(default: the demo set, generated under --data-root on first use)")
    data.add_argument("--data-root", default="data", help="where the demo set is generated (default: data)")
    data.add_argument("--image-size", type=int, default=None,
                      help=f"side of the square crops in pixels (default: {_profile_default('image_size')})")
    data.add_argument("--workers", type=int, default=0,
                      help="data-loading processes (folder) or decoding threads (recordio) (default: 0: decode in the "
                           "training process; on 2 cores extra processes compete with the network for the cores)")
    data.add_argument("--pipeline", choices=("folder", "recordio"), default="folder",
                      help="input pipeline: ImageFolderDataset+DataLoader or ImageRecordIter (default: folder)")

    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="any gluoncv classification model, e.g. resnet50_v2, resnet50_v1d, cifar_resnet20_v1, or "
                            f"elementwise-mlp (float16 on CPU) (default: {_profile_default('model')})")
    model.add_argument("--pretrained", action="store_true",
                       help="fine-tune from gluoncv ImageNet weights already on this machine; nothing is downloaded "
                            "(default: off, train from scratch)")

    precision = parser.add_argument_group("precision")
    precision.add_argument("--precision", choices=PRECISIONS, default="auto",
                           help="float32, float16 (GPU), amp-float16 (GPU), amp-bfloat16 (CPU), or auto: float16 on "
                                "GPUs, amp-bfloat16 on CPUs with native bfloat16, else float32 (default: auto)")
    precision.add_argument("--loss-scale", default=None,
                           help="dynamic, a fixed number such as 1024, or none (default: dynamic for float16 and "
                                "amp-float16, none otherwise)")
    precision.add_argument("--clip-grad-norm", type=float, default=None,
                           help="clip the global gradient norm to this value (default: no clipping)")
    precision.add_argument("--allow-cpu-float16", action="store_true",
                           help="allow float16 on a CPU, for --model elementwise-mlp only (default: off)")

    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--optimizer", default=None,
                     help=f"any MXNet optimizer name (default: {_profile_default('optimizer')})")
    opt.add_argument("--lr", type=float, default=None,
                     help=f"peak learning rate for the whole batch (default: {_profile_default('lr')}; "
                          "a tenth of it with --pretrained)")
    opt.add_argument("--momentum", type=float, default=0.9,
                     help="momentum, for optimizers that take one (default: 0.9)")
    opt.add_argument("--wd", type=float, default=None, help=f"weight decay (default: {_profile_default('wd')})")
    opt.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="cosine",
                     help="decay after warm-up: cosine to 0, or step (x0.1 at 50%% and 75%% of the epochs) "
                          "(default: cosine)")
    opt.add_argument("--warmup-epochs", type=int, default=None,
                     help=f"epochs of linear warm-up from 0 (default: {_profile_default('warmup_epochs')})")
    opt.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing epsilon (default: 0)")
    opt.add_argument("--epochs", type=int, default=None, help=f"epochs (default: {_profile_default('epochs')})")
    opt.add_argument("--batch-size", type=int, default=None,
                     help=f"images per step on each worker, split across devices "
                          f"(default: {_profile_default('batch_size')})")

    run = parser.add_argument_group("run")
    run.add_argument("--ctx", default="cpu", help="cpu, gpu, or a GPU list such as gpu:0,1 that splits each batch "
                                                 "(default: cpu)")
    run.add_argument("--kvstore", choices=KVSTORES, default="device",
                     help="Gluon kvstore, passed through; dist_* under `mxfp16 launch` (default: device)")
    run.add_argument("--gradient-compression", choices=("2bit",), default=None,
                     help="compress gradients on the kvstore; float32 parameters and --kvstore device only, "
                          "as MXNet 1.9.1 allows (default: off)")
    run.add_argument("--seed", type=int, default=0, help="seeds initialisation, data order and augmentation (default: 0)")
    run.add_argument("--out", default="runs/train", help="run folder for outputs and checkpoints (default: runs/train)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its last checkpoint (default: off; an --out that holds a "
                          "run is refused without it)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the run already in --out: its config, metrics, summaries and checkpoints are "
                          "deleted first (default: off; such an --out is refused)")
    run.add_argument("--max-batches", type=int, default=None,
                     help="at most N training and N evaluation batches per epoch, for smoke runs (default: all)")
    run.add_argument("--log-every", type=int, default=10,
                     help="steps between reads of the loss for the progress bar; each read waits for the device "
                          "(default: 10)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (default: bar on a terminal)")

    aids = parser.add_argument_group("testing aids (not for training runs)")
    aids.add_argument("--inject-overflow-step", type=int, default=None,
                      help="make the loss infinite at this global step, so the loss scaler must skip it "
                           "(default: off)")
    aids.add_argument("--inject-overflow-rank", type=int, default=None,
                      help="inject the overflow on this worker only (default: every worker)")
    aids.add_argument("--interrupt-at-step", type=int, default=None,
                      help="behave as if Ctrl-C arrived after this global step (default: off)")
    parser.set_defaults(func=run_command)


def config_from_args(args):
    """The :class:`~mxfp16.train.TrainConfig` the flags describe (unresolved)."""
    from ..train import TrainConfig

    return TrainConfig(
        data_dir=args.data_dir, data_root=args.data_root, image_size=args.image_size, workers=args.workers,
        pipeline=args.pipeline, model=args.model, pretrained=args.pretrained, precision=args.precision,
        loss_scale=args.loss_scale, clip_grad_norm=args.clip_grad_norm, allow_cpu_float16=args.allow_cpu_float16,
        optimizer=args.optimizer, lr=args.lr, momentum=args.momentum, wd=args.wd, lr_schedule=args.lr_schedule,
        warmup_epochs=args.warmup_epochs, label_smoothing=args.label_smoothing, epochs=args.epochs,
        batch_size=args.batch_size, ctx=args.ctx, kvstore=args.kvstore,
        gradient_compression=args.gradient_compression, seed=args.seed, out=args.out, resume=args.resume,
        overwrite=args.overwrite,
        max_batches=args.max_batches, log_every=args.log_every, progress=not args.no_progress,
        inject_overflow_step=args.inject_overflow_step, inject_overflow_rank=args.inject_overflow_rank,
        interrupt_at_step=args.interrupt_at_step,
    )


def run_command(args):
    from ..data import DataError
    from ..models import ModelError
    from ..optim import OptimizerError
    from ..precision import AMPStateError, PrecisionError
    from ..train import (CheckpointError, ConfigError, TrainingDivergedError, TrainingInterrupted, train)

    try:
        train(config_from_args(args))
    except (ConfigError, PrecisionError, AMPStateError, DataError, ModelError, OptimizerError,
            CheckpointError, TrainingDivergedError) as err:
        raise CommandError(str(err)) from None
    except TrainingInterrupted as err:
        print(str(err), file=sys.stderr)
        raise
    return 0
