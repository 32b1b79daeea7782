"""Start every worker of a dist kvstore job from the same parameters.

Gluon's Trainer copies rank 0's parameters to the other workers lazily,
inside the first ``allreduce_grads`` or ``step``: after the first backward
pass, so that step's gradients come from each worker's own initialisation.
Worse, with ``update_on_kvstore=False`` (what loss scaling needs) the pull
of that broadcast is not ordered against the first gradient push of the
same key, and a worker can receive the summed gradients as its parameters
(seen here with float16: one layer's weights became inf on a skipped step).
:func:`sync_parameters` does the broadcast before training and waits for it.
"""
from mxnet.gluon.parameter import DeferredInitializationError

from .._internals import trainer_init_kvstore_params, trainer_params

__all__ = ["sync_parameters"]


def sync_parameters(trainer):
    """Broadcast rank 0's parameters to every worker now and wait until they arrived.

    Call once after the network is initialised and the trainer is built,
    before the first training step. Harmless without a kvstore.

    Parameters
    ----------
    trainer : gluon.Trainer
        From :func:`mxfp16.make_trainer`.
    """
    trainer_init_kvstore_params(trainer)
    for param in trainer_params(trainer):
        try:
            arrays = param.list_data()
        except DeferredInitializationError:
            continue  # shape unknown until the first forward: Gluon broadcasts it then
        for array in arrays:
            array.wait_to_read()
