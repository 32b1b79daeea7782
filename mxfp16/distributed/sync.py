"""Keep the workers of a kvstore job in step: who they are, the same start, the same statistics.

:func:`sync_parameters` broadcasts rank 0's parameters before training and waits for it: Gluon's own broadcast comes
after the first backward pass and, with ``update_on_kvstore=False``, unordered against the first gradient push
(docs/distributed.md, "Starting from the same parameters", says what that did here). :func:`average_aux_states`
averages the BatchNorm running statistics, which nothing else keeps in step.
"""
import os

import mxnet as mx
import numpy as np
from mxnet.gluon.parameter import DeferredInitializationError

from .._internals import trainer_init_kvstore_params, trainer_params

__all__ = ["sync_parameters", "average_aux_states", "open_kvstore", "grad_bytes_per_step", "KVStoreError",
           "StopVote"]


class KVStoreError(ValueError):
    """A dist kvstore asked for outside a parameter-server job."""


def open_kvstore(name):
    """Create a distributed kvstore (which tells this process its rank), or pass a local name through.

    A ``dist_*`` name without the ``DMLC_*`` environment of a job raises :class:`KVStoreError`.

    Returns
    -------
    (kvstore, rank, num_workers)
        ``kvstore`` is an ``mx.kv.KVStore`` for ``dist_*`` names, else the name.
    """
    if not name.startswith("dist"):
        return name, 0, 1
    if "DMLC_ROLE" not in os.environ:
        raise KVStoreError(f"kvstore {name!r} needs the DMLC_* environment of a parameter-server job "
                           "(DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER); "
                           "start the workers with `mxfp16 launch`, or use --kvstore device on one machine")
    kv = mx.kv.create(name)
    return kv, kv.rank, kv.num_workers


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


def average_aux_states(trainer, kvstore=None, num_workers=1):
    """Give every device and worker the same BatchNorm running statistics (their mean).

    Parameters
    ----------
    trainer : gluon.Trainer
    kvstore : mx.kv.KVStore, optional
        The job's dist kvstore; ``None`` averages across this process's devices only.
    num_workers : int
    """
    kv = kvstore if num_workers > 1 and not isinstance(kvstore, (str, type(None))) else None
    for index, param in enumerate(trainer_params(trainer)):
        if param.grad_req != "null":
            continue
        copies = param.list_data()
        if len(copies) == 1 and kv is None:
            continue
        first = copies[0]
        if len(copies) > 1:
            first[:] = mx.nd.add_n(*[c.as_in_context(first.context) for c in copies]) / len(copies)
        if kv is not None:
            kv.pushpull(index, first, out=first)  # the key Gluon initialised for this parameter; never pushed otherwise
            first /= num_workers
        for other in copies[1:]:
            first.copyto(other)


def grad_bytes_per_step(params):
    """Bytes of gradient one worker pushes per step: size x itemsize over trained parameters."""
    return sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize for p in params if p.grad_req != "null")


class StopVote:
    """Workers agree on whether to stop: any worker that wants to stop stops them all at the same step.

    A signal reaches every worker of a job at slightly different moments; a worker that stopped one step before the
    others would leave them waiting forever for its gradients. :meth:`agree` sums one number over the workers, so the
    decision is taken together, at a step every worker reaches.

    Parameters
    ----------
    kvstore : mx.kv.KVStore
    key : int
        A key no parameter uses (Gluon numbers parameters from 0).
    """

    KEY = 2 ** 30

    def __init__(self, kvstore, key=KEY):
        self._kv, self._key = kvstore, key
        self._kv.init(key, mx.nd.zeros((1,)))

    def agree(self, wants_to_stop):
        """``True`` on every worker when any worker passed ``True`` (a host sync: call it where one happens anyway)."""
        vote = mx.nd.array([1.0 if wants_to_stop else 0.0])
        self._kv.pushpull(self._key, vote, out=vote)
        return bool(vote.asscalar() > 0)
