"""What this machine can do: MXNet build, GPUs, CPU bfloat16 support.

Everything is read live (MXNet's runtime features, ``/proc/cpuinfo``,
``nvidia-smi``); nothing is assumed from the package that was installed.
"""
import os
import platform
import resource
import shutil
import subprocess
import sys

import mxnet as mx

#: CPU flags that give native bfloat16 arithmetic to oneDNN.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags():
    """Return the set of CPU feature flags (empty where they cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_bfloat16_support():
    """Which native bfloat16 flags the CPU has, e.g. ``{'avx512_bf16': True, 'amx_bf16': False}``."""
    flags = cpu_flags()
    return {flag: flag in flags for flag in BF16_CPU_FLAGS}


def has_cpu_bfloat16():
    """Whether the CPU has native bfloat16 (``MXFP16_CPU_BFLOAT16=0|1`` overrides the probe).

    The override exists for containers whose ``/proc/cpuinfo`` misreports
    the host, and for testing the paths of a CPU without bfloat16.
    """
    forced = os.environ.get("MXFP16_CPU_BFLOAT16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return any(cpu_bfloat16_support().values())


def mxnet_features():
    """Names of the features this MXNet build was compiled with."""
    return sorted(name for name, feat in mx.runtime.Features().items() if feat.enabled)


def gpu_count():
    try:
        return mx.context.num_gpus()
    except mx.base.MXNetError:
        return 0


def _nvidia_smi():
    """Name, memory and compute capability per GPU, or ``{}`` without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = {}
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            rows[int(parts[0])] = {"name": parts[1], "memory_mb": float(parts[2]), "compute_capability": parts[3]}
    return rows


def gpus():
    """One dict per GPU MXNet can see: name, memory, compute capability, tensor cores.

    Tensor cores (float16 matrix units) exist from compute capability 7.0
    (Volta) on; where the capability cannot be read the answer is ``None``.
    """
    count = gpu_count()
    smi = _nvidia_smi() if count else {}
    found = []
    for index in range(count):
        row = {"index": index, "name": None, "memory_mb": None, "compute_capability": None}
        row.update(smi.get(index, {}))
        try:
            free, total = mx.context.gpu_memory_info(index)
            row["memory_mb"] = total / 2 ** 20
        except mx.base.MXNetError:
            pass
        cap = row["compute_capability"]
        row["tensor_cores"] = None if not cap else float(cap) >= 7.0
        found.append(row)
    return found


def peak_memory_mb(ctx_list):
    """Peak memory of the run in MiB.

    CPU: the process's peak resident set (``getrusage``). GPU: the largest
    memory in use on any of the run's GPUs now (MXNet reports no peak; call
    this at the end of each epoch and keep the maximum).
    """
    gpus = [c for c in ctx_list if c.device_type == "gpu"]
    if gpus:
        used = []
        for c in gpus:
            free, total = mx.context.gpu_memory_info(c.device_id)
            used.append((total - free) / 2 ** 20)
        return max(used)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10  # bytes on macOS, KiB on Linux


def machine_summary():
    """The facts a benchmark or a run should record about where it ran."""
    return {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_bfloat16": cpu_bfloat16_support(),
        "gpus": gpus(),
        "mxnet_version": mx.__version__,
        "mxnet_features": mxnet_features(),
        "python": platform.python_version(),
    }
