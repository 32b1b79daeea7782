"""Prove oneDNN 2.4.4's AMX kernels right on this CPU before trusting them: AMX on against AMX off.

The oneDNN in MXNet 1.9.1 predates two AMX fixes later releases carry
("brgemm_ip_bwd_d: ensure oc_tail <= 32 on amx_bf16", v2.5, and a
brgemm-convolution tile-load workaround, v2.6). So on a CPU with AMX this runs
the same bfloat16 work twice, each in its own process: once with AMX on
(``import mxfp16`` asks for the tile state, ``DNNL_MAX_CPU_ISA=AVX512_CORE_AMX``)
and once with it off (``MXFP16_AMX=0``: oneDNN's ``avx512_core_bf16`` kernels),
and compares:

* ``dense``: the forward output and the gradients of inputs, weights and bias
  of Dense layers whose output sizes are not multiples of 32 (10, 33, 100,
  1000), where the inner-product backward-data fix applies;
* ``train``: N training steps of ResNet-50 v2 (224 px), the LSTM classifier and
  the Transformer encoder from the same weights and batches: the loss and the
  global gradient norm of every step.

Usage (from a checkout, in the project's venv)::

    python tools/amx_check.py --out docs/results/amx-check            # dense + 200 steps of each model
    python tools/amx_check.py --steps 20 --models lstm-classifier      # shorter

It writes ``amx-check.json`` (every difference, the tolerances, a verdict per
check). Each side's oneDNN trace (``DNNL_VERBOSE=1``) is read, in its child, for
which kernels ran. Each side is :func:`_side` in a child of its own, run by
:func:`mxfp16.plumbing.child.call_in_child`. On a CPU
without AMX it says so and exits 0 without running.
tests/test_amx_kernels.py runs a short version on AMX CPUs.
"""
import argparse
import ctypes
import json
import os
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
DENSE_SIZES = (10, 33, 100, 1000)
MODELS = {"resnet50_v2": 224, "lstm-classifier": 28, "transformer-encoder": 28}
#: AMX and AVX-512 bfloat16 kernels may sum in another order: bfloat16 keeps 8 significant bits, so results may
#: differ in the last of them. Relative to the largest magnitude of each array.
DENSE_RTOL = 2 ** -6
#: Over many steps two bfloat16 runs drift apart as two float32 runs of different summation order would not;
#: what must hold is that both train alike: the losses and gradient norms of each step within this relative gap.
TRAIN_RTOL = 0.05


def _child(spec, amx_on, trace):
    """``{'result', 'amx', 'kernels'}`` of one side, run in its own process (AMX is decided once per process)."""
    from mxfp16.plumbing.child import call_in_child

    # DNNL_MAX_CPU_ISA removed: each side's mxfp16 sets it from MXFP16_AMX, as a user's run would.
    env = {"PYTHONPATH": os.pathsep.join((TOOLS, REPO)), "MXFP16_AMX": "1" if amx_on else "0",
           "DNNL_MAX_CPU_ISA": None, "DNNL_VERBOSE": "1" if trace else None}
    record, problem = call_in_child("amx_check:_side", spec, env=env, tail_lines=40)
    if record is None:
        raise RuntimeError(f"{spec['kind']} with AMX {'on' if amx_on else 'off'} failed: {problem}")
    return record


def _side(spec):
    """In a side's child: ``spec``'s work, with the AMX state and the kernels oneDNN ran.

    ``spec`` is ``{'kind': 'dense', 'sizes'}`` or ``{'kind': 'train', 'model', 'image_size', 'steps'}``.
    """
    from mxfp16.machine import amx

    if spec["kind"] == "dense":
        result, kernels = _kernels_run(lambda: _dense(spec["sizes"]))
    else:
        result, kernels = _kernels_run(lambda: _train(spec["model"], spec["image_size"], spec["steps"]))
    return {"result": result, "amx": amx.status().as_dict(), "kernels": kernels}


def _kernels_run(work):
    """``(work(), kernels)``: what oneDNN's trace (``DNNL_VERBOSE=1``) says ran while ``work`` did.

    oneDNN prints the trace on the process's standard output (file descriptor 1, through C's stdio), so
    that descriptor goes to a file for the while, C's buffers are flushed into it, and it is read back.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as trace:
        os.dup2(trace.fileno(), 1)
        try:
            result = work()
        finally:
            ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        trace.seek(0)
        lines = trace.read().decode("utf-8", "replace").splitlines()
    return result, sorted({line.split(",")[4] for line in lines
                           if line.startswith("dnnl_verbose,exec,") and line.count(",") > 5})


def _dense(sizes):
    """Forward and backward of one Dense per size, bfloat16 through AMP, from fixed inputs."""
    import mxfp16

    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    mxfp16.activate(mxfp16.resolve_precision("amp-bfloat16", mx.cpu()))
    out = {}
    for size in sizes:
        rng = np.random.RandomState(size)
        x = mx.nd.array(rng.standard_normal((64, 256)).astype(np.float32))
        layer = gluon.nn.Dense(size, in_units=256)
        layer.initialize(mx.init.Constant(0))
        layer.weight.set_data(mx.nd.array(rng.standard_normal((size, 256)).astype(np.float32) / 16))
        layer.bias.set_data(mx.nd.array(rng.standard_normal(size).astype(np.float32)))
        x.attach_grad()
        with autograd.record():
            y = layer(x).astype("float32")
            loss = (y * y).sum()
        loss.backward()
        out[str(size)] = {"output": y.asnumpy().tolist(), "grad_x": x.grad.asnumpy().tolist(),
                          "grad_w": layer.weight.grad().asnumpy().tolist(),
                          "grad_b": layer.bias.grad().asnumpy().tolist()}
    return out


def _train(model, image_size, steps, batch_size=8):
    """``steps`` training steps from seed 0: the loss and global gradient norm of each (mxfp16's own step)."""
    import mxfp16
    from mxfp16.train.parts import PartsSpec, build_parts

    import mxnet as mx
    import numpy as np

    ctx = [mx.cpu()]
    mixed = mxfp16.MixedPrecision("amp-bfloat16", ctx)
    parts = build_parts(PartsSpec(model=model, classes=10, image_size=image_size, batch_size=batch_size, lr=0.01,
                                  seed=0), mixed)
    rng = np.random.RandomState(0)
    losses, norms = [], []
    for _ in range(steps):
        x = mx.nd.array(rng.standard_normal((batch_size, 3, image_size, image_size)).astype(np.float32))
        y = mx.nd.array(rng.randint(0, 10, batch_size).astype(np.float32))
        data, label = mixed.cast_batch(x, y)
        result = mixed.train_step(parts.net, parts.loss, parts.trainer, data, label,
                                  clip_grad_norm=1e9)  # clipping at 1e9 never clips; it reports the norm
        losses.append(result.loss.item())
        norms.append(result.grad_norm.item())
    return {"losses": losses, "grad_norms": norms}


def _relative(a, b):
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def compare_dense(on, off):
    rows = {}
    for size, arrays in off.items():
        worst = {name: _relative(on[size][name], values) for name, values in arrays.items()}
        rows[size] = dict(worst, ok=all(v <= DENSE_RTOL for v in worst.values()))
    return rows


def compare_train(on, off):
    gaps = {name: max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(on[name], off[name]))
            for name in ("losses", "grad_norms")}
    return dict(gaps, ok=all(v <= TRAIN_RTOL for v in gaps.values()))


def check(models, steps, trace=True, sizes=DENSE_SIZES):
    """Run every check; ``{'dense': {...}, 'train': {...}, 'ok': bool}``."""
    report = {"dense_rtol": DENSE_RTOL, "train_rtol": TRAIN_RTOL, "steps": steps}
    dense = {"kind": "dense", "sizes": list(sizes)}
    on, off = _child(dense, True, trace), _child(dense, False, trace)
    report["dense"] = compare_dense(on["result"], off["result"])
    report["kernels"] = {"amx_on": on["kernels"], "amx_off": off["kernels"]}
    report["train"] = {}
    for model in models:
        train = {"kind": "train", "model": model, "image_size": MODELS[model], "steps": steps}
        on, off = _child(train, True, trace), _child(train, False, trace)
        report["train"][model] = dict(compare_train(on["result"], off["result"]),
                                      amx_on=on["result"], amx_off=off["result"],
                                      kernels={"amx_on": on["kernels"], "amx_off": off["kernels"]})
    report["ok"] = all(r["ok"] for r in report["dense"].values()) and all(
        r["ok"] for r in report["train"].values())
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="folder for amx-check.json (default: print only)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per model (default: 200)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)
    from mxfp16.machine import amx

    status = amx.status()
    if not status.in_use:
        print(f"AMX is not in use here ({status.describe()}): nothing to check")
        return 0
    report = check([m for m in args.models.split(",") if m], args.steps)
    text = json.dumps(report, indent=1)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "amx-check.json"), "w") as handle:
            handle.write(text)
    for size, row in report["dense"].items():
        print(f"dense {size:>5}: {'ok' if row['ok'] else 'DIFFERS'}  " +
              "  ".join(f"{k} {v:.2e}" for k, v in row.items() if k != "ok"))
    for model, row in report["train"].items():
        print(f"{model}: {'ok' if row['ok'] else 'DIFFERS'}  losses {row['losses']:.2e}  "
              f"grad norms {row['grad_norms']:.2e}")
    print("AMX kernels: " + ("agree with AVX-512 bfloat16" if report["ok"] else "DISAGREE: keep MXFP16_AMX=0"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
