"""Every use of a private MXNet attribute, in one place.

Gluon 1.9.1 has no public way to ask a Trainer for its parameters or whether
it updates on the kvstore, to list a Block's direct children, to ask whether
``hybridize()`` took effect or to read a layer's operator arguments, to
renew a parameter's cached symbol, nor to ask AMP whether it is active. If
MXNet ever changes these, this is the only file to fix.
"""
import contextlib

from ._lazy import module

_amp = module("mxnet.contrib.amp")


def amp_initialized():
    """True once ``mx.contrib.amp.init()`` has run in this process."""
    return bool(_amp.amp._amp_initialized)


def trainer_params(trainer):
    """The parameters a ``gluon.Trainer`` updates, in its index order."""
    return list(trainer._params)


def trainer_updates_on_kvstore(trainer):
    """Whether ``trainer`` applies updates on the kvstore (resolved lazily by Gluon)."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    return bool(trainer._kvstore) and bool(trainer._update_on_kvstore)


def trainer_update_on_kvstore_setting(trainer):
    """What ``update_on_kvstore`` the trainer was built with (``None``: Gluon decides when the kvstore starts)."""
    return trainer._kvstore_params["update_on_kvstore"]


def trainer_init_kvstore_params(trainer):
    """Create the trainer's kvstore and put the parameters in it now.

    Gluon does this lazily inside the first ``allreduce_grads`` / ``step``,
    after the first backward pass; with a dist kvstore that first step then
    uses each worker's own initial parameters, and the broadcast's pull can
    race with the first gradient push (see :func:`mxfp16.distributed.sync_parameters`).
    """
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()


def block_children(block):
    """A Block's direct children, in registration order."""
    return list(block._children.values())


def block_is_hybridized(block):
    """Whether ``hybridize()`` took effect on ``block``."""
    return bool(getattr(block, "_active", False))


@contextlib.contextmanager
def hybridization_paused(blocks):
    """Within the context, ``blocks`` run imperatively; afterwards each is hybridized as before.

    ``hybridize(False)`` drops a block's flags (``static_alloc`` ...), so the
    flags are kept here and put back, and the cached graph is rebuilt on the
    next call.
    """
    saved = [(block, block._active, list(block._flags)) for block in blocks if block_is_hybridized(block)]
    for block, _, _ in saved:
        block._active = False
        block._clear_cached_op()
    try:
        yield [block for block, _, _ in saved]
    finally:
        for block, active, flags in saved:
            block._active, block._flags = active, flags
            block._clear_cached_op()


def block_op_kwargs(block):
    """The operator arguments a Gluon layer was built with (e.g. ``num_group``)."""
    return dict(getattr(block, "_kwargs", {}))


def renew_parameter_symbols(block):
    """Drop the symbols ``Parameter.var()`` cached, so the next trace declares each parameter's current dtype.

    ``Parameter.var()`` keeps the symbol it first made, with the dtype the
    parameter had then; ``cast()`` does not renew it, so a network cast to
    float16 after its first trace would declare float32 weights.
    """
    for param in block.collect_params().values():
        param._var = None


def trainer_updater_states(trainer):
    """``{parameter index: optimizer state}`` of the trainer's (first) updater.

    With ``update_on_kvstore=False`` every device has an updater; they hold
    the same states after each step, as ``Trainer.save_states`` assumes.
    """
    if trainer_updates_on_kvstore(trainer):
        raise ValueError("the optimizer states live on the kvstore (update_on_kvstore=True); "
                         "build the trainer with update_on_kvstore=False to checkpoint them")
    return dict(trainer._updaters[0].states)


def set_trainer_updater_states(trainer, states):
    """Give every updater ``states``; each moves them to its device at its next update."""
    if trainer_updates_on_kvstore(trainer):
        raise ValueError("the optimizer states live on the kvstore (update_on_kvstore=True)")
    for updater in trainer._updaters:
        updater.states = dict(states)
        updater.states_synced = dict.fromkeys(states, False)


def optimizer_update_counts(trainer):
    """The optimizer's update counters (the LR schedule's position and Adam's bias correction read them)."""
    optimizer = trainer.optimizer
    return {"num_update": int(optimizer.num_update),
            "index_update_counts": {str(device): {str(i): int(n) for i, n in counts.items()}
                                    for device, counts in optimizer._all_index_update_counts.items()}}


def set_optimizer_update_counts(trainer, counts):
    """Restore :func:`optimizer_update_counts` into the trainer's optimizer."""
    optimizer = trainer.optimizer
    optimizer.num_update = int(counts["num_update"])
    optimizer._all_index_update_counts = {int(device): {int(i): int(n) for i, n in per.items()}
                                          for device, per in counts["index_update_counts"].items()}
    optimizer._all_index_update_counts.setdefault(0, {})
    optimizer._index_update_count = optimizer._all_index_update_counts[0]


def saved_parameter_shapes(block):
    """``{name: shape}`` as ``Block.save_parameters`` names the block's parameters (structural names)."""
    return {name: tuple(p.shape) for name, p in block._collect_params_with_prefix().items()}
