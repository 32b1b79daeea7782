"""Distributed training over MXNet's parameter server (kvstore ``dist_sync``).

:mod:`~mxfp16.distributed.plan` decides which processes a job needs and their
``DMLC_*`` environment; :mod:`~mxfp16.distributed.launcher` runs them on this machine
(or over ssh) and cleans up. The ``mxfp16 launch`` command joins the two.
"""
from .._lazy import exports

#: Public name -> the module of this package that defines it; they load on first use (``launcher`` and
#: ``plan`` import nothing of MXNet, so ``mxfp16 launch`` builds its flags without it).
_EXPORTS = {
    "launch": "launcher", "LaunchResult": "launcher", "LaunchError": "launcher", "DEFAULT_GRACE": "launcher",
    "Slot": "plan", "LaunchPlanError": "plan", "local_plan": "plan", "host_plan": "plan", "read_hostfile": "plan",
    "format_plan": "plan", "free_port": "plan", "ssh_argv": "plan",
    "sync_parameters": "sync", "average_aux_states": "sync", "open_kvstore": "sync", "grad_bytes_per_step": "sync",
    "KVStoreError": "sync", "StopVote": "sync",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = exports(__name__, _EXPORTS)
