"""Find which MXNet operators have a working bfloat16 path on this CPU, by running them.

MXNet's AMP lists (``mxnet/contrib/amp/lists/symbol_bf16.py``) name the
operators cast to bfloat16, those cast to float32, and those that accept
either; every other operator runs in whatever dtype arrives. Many of those
others have no bfloat16 CPU kernel (``dot``, ``batch_dot``, ``linalg_gemm2``
...), so a bfloat16 tensor reaching them stops training with an MXNetError.
This script runs each unlisted operator that takes tensor inputs, once in
float32 and once with bfloat16 inputs, forward and backward, and sorts it:

* ``bfloat16``: ran, and matched float32 within bfloat16's precision;
* ``float32``: float32 ran but bfloat16 failed or disagreed (no kernel);
* ``unprobed``: no generic input made even float32 run (the operator needs
  particular shapes, integer indices or parameters).

``mxfp16/_amp_op_probe.py`` holds its output, and ``mxfp16.amp_lists`` runs
the last two groups in float32 (see its docstring). ``tests/test_amp_layers.py``
re-probes a sample against the installed wheel. Regenerate after an MXNet
upgrade, on a CPU with avx512_bf16::

    python tools/amp_probe_ops.py > mxfp16/_amp_op_probe.py

Each batch of operators runs in a child process, so an operator that crashes
the process is found and recorded as ``float32`` without stopping the scan.
"""
import json
import subprocess
import sys

#: Input shapes tried in turn until float32 runs: matrices first (dot, gemm),
#: then batches of matrices, images and vectors.
SHAPES = [(4, 4), (2, 4, 4), (2, 3, 4, 4), (8,), (2, 3, 4, 4, 4)]
BATCH = 40


#: Operators that are not layers (optimizer updates, AMP's own casts, graph
#: plumbing) or whose output is random (no float32 reference to compare with).
NOT_LAYERS = ("shuffle", "_shuffle", "amp_cast", "amp_multicast", "reset_arrays", "multi_lars", "multi_sum_sq",
              "_CachedOpThreadSafe", "_contrib_calibrate_entropy", "_contrib_allclose")


def candidates():
    """Operators whose dtype follows their inputs under AMP's bfloat16 lists, taking tensors.

    Those AMP leaves unlisted, and those it runs in the widest of their
    inputs' dtypes (``WIDEST_TYPE_CASTS``): a bfloat16 input reaches all of
    them. The operators MXNet lists as running in either dtype
    (``BF16_FP32_FUNCS``) are taken at MXNet's word: some keep float32
    parameters beside bfloat16 data (BatchNorm), which a generic probe cannot
    feed.
    """
    import mxfp16  # noqa: F401  (numpy names for MXNet)
    import mxnet as mx
    from mxnet.contrib.amp.lists import symbol_bf16 as L

    fixed = set(L.BF16_FUNCS) | set(L.FP32_FUNCS) | set(L.LOSS_OUTPUT_FUNCTIONS) | set(L.BF16_FP32_FUNCS)
    fixed |= {name for name, _, _ in L.CONDITIONAL_FP32_FUNCS}
    names = []
    for name in sorted(mx.operator.get_all_registered_operators()):
        if name in fixed or name.replace("_contrib_", "") in fixed or name in NOT_LAYERS or name.startswith(("_backward", "_np", "_image", "_sparse")):
            continue
        if "update" in name or name.startswith(("_contrib_quantize", "_contrib_dgl", "preloaded_")):
            continue
        if "NDArray-or-Symbol" not in " ".join(mx.operator.get_operator_arguments(name).types):
            continue
        if _function(name) is not None:
            names.append(name)
    return names


def _function(name):
    """``mx.nd``'s function for operator ``name``, found as AMP finds it, or None."""
    from mxnet import ndarray
    from mxnet.contrib.amp.amp import _get_fun_to_wrap
    from mxnet import base

    submodules = {p: getattr(ndarray, p[1:-1]) for p in base._OP_NAME_PREFIX_LIST}
    try:
        fun_name, module = _get_fun_to_wrap(name, ndarray, submodules)
        return getattr(module, fun_name)
    except AttributeError:
        return None


def probe(name):
    """``'bfloat16'``, ``'float32'`` or ``'unprobed'`` for one operator, with the reason."""
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, nd
    from mxnet.contrib.amp.amp import bfloat16

    fn = _function(name)
    args = mx.operator.get_operator_arguments(name)
    tensors = [t for t in args.types if t.startswith("NDArray-or-Symbol")]
    # Optional tensor inputs (softmax's ``length``) are not marked as such: try
    # the fewest inputs first.
    counts = [2] if tensors == ["NDArray-or-Symbol[]"] else range(1, len(tensors) + 1)

    def run(shape, dtype, n_inputs):
        rng = np.random.RandomState(0)
        inputs = [nd.array(rng.uniform(0.1, 0.9, size=shape)) for _ in range(n_inputs)]
        if dtype is not None:
            inputs = [nd.amp_cast(x, dtype=dtype) for x in inputs]
        for x in inputs:
            x.attach_grad()
        with autograd.record():
            out = fn(*inputs)
            out = out[0] if isinstance(out, (list, tuple)) else out
            loss = nd.amp_cast(out, dtype="float32").sum() if out.dtype != np.float32 else out.sum()
        value = nd.amp_cast(out, dtype="float32").asnumpy() if out.dtype != np.float32 else out.asnumpy()
        try:
            loss.backward()
            grads = [nd.amp_cast(x.grad, dtype="float32").asnumpy() if x.grad.dtype != np.float32
                     else x.grad.asnumpy() for x in inputs]
        except mx.MXNetError:
            grads = None
        return value, grads

    for shape, n_inputs in ((s, n) for n in counts for s in SHAPES):
        try:
            ref, ref_grads = run(shape, None, n_inputs)
        except (mx.MXNetError, TypeError, ValueError, IndexError):
            continue
        if not np.issubdtype(ref.dtype, np.floating) or ref.size == 0:
            return "unprobed", "float32 output is not floating point"
        try:
            low, low_grads = run(shape, bfloat16, n_inputs)
        except (mx.MXNetError, TypeError, ValueError, IndexError) as e:
            lines = [line for line in str(e).splitlines() if line.strip()]
            return "float32", (lines[-1] if lines else type(e).__name__)[:160]
        scale = max(float(np.abs(ref).max()), 1e-3)
        if not np.allclose(low, ref, atol=0.03 * scale, rtol=0.03, equal_nan=True):
            return "float32", "bfloat16 result differs from float32 beyond bfloat16's precision"
        if ref_grads is not None:
            if low_grads is None:
                return "float32", "no bfloat16 backward"
            for g, g_ref in zip(low_grads, ref_grads):
                gscale = max(float(np.abs(g_ref).max()), 1e-3)
                if not np.allclose(g, g_ref, atol=0.03 * gscale, rtol=0.03, equal_nan=True):
                    return "float32", "bfloat16 gradient differs from float32 beyond bfloat16's precision"
        return "bfloat16", f"matches float32 on shape {shape}"
    return "unprobed", "no generic input shape ran in float32"


def _child(names):
    import mxfp16  # noqa: F401
    for name in names:
        verdict, why = probe(name)
        print(json.dumps([name, verdict, why]), flush=True)


def scan(names, python=sys.executable):
    """``{name: (verdict, reason)}``, probing in child processes; a crash marks its operator float32."""
    results = {}
    pending = list(names)
    while pending:
        batch, pending = pending[:BATCH], pending[BATCH:]
        proc = subprocess.run([python, __file__, "--child", *batch], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("["):
                name, verdict, why = json.loads(line)
                results[name] = (verdict, why)
        done = [n for n in batch if n in results]
        if len(done) < len(batch):
            crashed = batch[len(done)]
            results[crashed] = ("float32", f"the process died running it with bfloat16 inputs (exit {proc.returncode})")
            pending = batch[len(done) + 1:] + pending
    return results


def render(results):
    lines = [
        '"""Which MXNet operators AMP leaves unlisted run in bfloat16 on CPU: generated, do not edit.',
        "",
        "Written by ``python tools/amp_probe_ops.py > mxfp16/_amp_op_probe.py``, which runs each",
        "operator in float32 and with bfloat16 inputs (forward and backward) and compares.",
        '"""',
        "#: The MXNet these verdicts were measured on.",
        f"MXNET_VERSION = {__import__('mxnet').__version__!r}",
        "",
    ]
    for verdict, doc in (("bfloat16", "Ran in bfloat16 and matched float32."),
                         ("float32", "No bfloat16 path on CPU: failed, crashed or disagreed with float32."),
                         ("unprobed", "No generic input ran them (they need set shapes, indices or "
                                      "parameters): float32 unless MXNet's lists say otherwise.")):
        names = sorted(n for n, (v, _) in results.items() if v == verdict)
        lines.append(f"#: {doc}")
        lines.append(f"{verdict.upper()} = {{")
        for n in names:
            lines.append(f"    {n!r},  # {results[n][1]}" if verdict == "float32" else f"    {n!r},")
        lines.append("}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    else:
        only = sys.argv[1:]
        print(render(scan(only or candidates())))
