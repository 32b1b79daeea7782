"""``mxfp16 train``: the reference trainer (float32 against mixed precision).

With no arguments it trains on the generated demo set with ``--precision
auto`` in about two minutes on a 2-core CPU. With ``--data-dir`` it is the
tutorial's run: ResNet-50 v2 on Caltech-101 (on a GPU, in float16).
"""
import argparse
import sys
import textwrap
import typing

from . import CommandError

ORDER = 20


def _int_list(text):
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers, "
                                         "e.g. 10,20") from None


def _add_config_arguments(parser):
    """One flag per :class:`~mxfp16.train.TrainConfig` field, grouped, typed and documented from its metadata."""
    from ..train.config import GROUPS, TrainConfig, default_text, fields_by_name

    hints = typing.get_type_hints(TrainConfig)
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for name, field in fields_by_name().items():
        meta, kind = field.metadata, hints[name]
        # argparse formats help with %: a literal percent sign must be doubled.
        text = f"{meta['help']} (default: {default_text(name)})".replace("%", "%%")
        options = dict(dest=name, help=text, default=argparse.SUPPRESS)
        if kind is bool:
            options["action"] = "store_false" if field.default else "store_true"
        else:
            options["type"] = _int_list if kind is tuple else kind
            for key in ("choices", "metavar"):
                if key in meta:
                    options[key] = meta[key]
        groups[meta["group"]].add_argument(meta.get("flag") or "--" + name.replace("_", "-"), **options)


def _given_fields(args):
    """The configuration fields set on the command line (flags not given are absent from ``args``)."""
    from ..train.config import fields_by_name

    return {name for name in fields_by_name() if hasattr(args, name)}


def _config_from_args(args):
    """The :class:`~mxfp16.train.TrainConfig` the flags describe (unresolved): flags not given keep their default."""
    from ..train.config import TrainConfig

    return TrainConfig(**{name: getattr(args, name) for name in _given_fields(args)})


def register(subparsers):
    from ..train.config import PROFILES

    demo = PROFILES["demo"]
    parser = subparsers.add_parser(
        "train", help="train a network in float32 or mixed precision (demo set by default)",
        description=__doc__.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill(
            "Defaults that depend on the data: with --data-dir the tutorial's run (resnet50_v2, 224 px, SGD). "
            f"Without it, the demo set gets a network a 2-core CPU trains in about two minutes: {demo['model']} at "
            f"{demo['image_size']} px with {demo['optimizer']}. Why (docs/training.md): ResNet-50 at 224 px is too "
            "slow for that; an ImageNet ResNet at 32 px ends in 1x1 maps, where BatchNorm's statistics fail in "
            "evaluation; cifar_resnet20_v1 at 32 px is too small per operator for bfloat16 to gain; resnet18_v1 at "
            "48 px still gains from bfloat16 and ends in 2x2 maps. "
            "Outputs in --out: config.json (with the command line), metrics.jsonl, summary.json, checkpoints/, and "
            "tensorboard/ where tensorboardX is installed."))
    _add_config_arguments(parser)
    parser.set_defaults(func=run_command)


def run_command(args):
    from ..data import DataError
    from ..devices import DeviceError
    from ..distributed import KVStoreError
    from ..distributed.agree import SettingsMismatchError
    from ..models import ModelError
    from ..optim import OptimizerError
    from ..plumbing.limits import allocation_message, is_allocation_failure
    from ..precision import AMPStateError, PrecisionError
    from ..train import CheckpointError, ConfigError, TrainingDivergedError, TrainingInterrupted, fit, prepare

    run = None
    try:
        run = prepare(_config_from_args(args), given=_given_fields(args), command=getattr(args, "command_line", None))
        fit(run)
    except (ConfigError, PrecisionError, DeviceError, AMPStateError, DataError, ModelError, OptimizerError,
            KVStoreError, CheckpointError, TrainingDivergedError, SettingsMismatchError) as err:
        raise CommandError(str(err)) from None
    except TrainingInterrupted as err:
        print(str(err), file=sys.stderr)
        raise
    except Exception as err:  # a failed allocation, told with the run's own sizes
        if not is_allocation_failure(err):
            raise
        config = run.config if run is not None else _resolved_or_none(args)
        raise CommandError(allocation_message(getattr(config, "batch_size", None),
                                              getattr(config, "image_size", None))) from None
    return 0


def _resolved_or_none(args):
    """The configuration the flags resolve to (the profile's sizes filled in), or ``None`` if it cannot be."""
    from ..train import ConfigError

    try:
        return _config_from_args(args).resolve()
    except (ConfigError, ValueError):
        return None
