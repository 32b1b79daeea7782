"""Distributed training over MXNet's parameter server (kvstore ``dist_sync``).

:mod:`~mxfp16.distributed.plan` decides which processes a job needs and their
``DMLC_*`` environment; :mod:`~mxfp16.distributed.launcher` runs them on this machine
(or over ssh) and cleans up. The ``mxfp16 launch`` command joins the two.
"""
from .launcher import DEFAULT_GRACE, LaunchError, LaunchResult, launch
from .sync import KVStoreError, StopVote, average_aux_states, grad_bytes_per_step, open_kvstore, sync_parameters
from .plan import LaunchPlanError, Slot, format_plan, free_port, host_plan, local_plan, read_hostfile, ssh_argv

__all__ = ["launch", "LaunchResult", "LaunchError", "DEFAULT_GRACE", "Slot", "LaunchPlanError",
           "local_plan", "host_plan", "read_hostfile", "format_plan", "free_port", "ssh_argv",
           "sync_parameters", "average_aux_states", "open_kvstore", "grad_bytes_per_step", "KVStoreError", "StopVote"]
