"""Gradient fidelity of one configuration against float32 on real digits batches.
Saves/loads a reference (float32) from runs/gradref.npz. Same weights (seed 0 init, then the
trained float32 parameters of repro-f32-s1 if --trained), same 4 batches (eval transform), CE loss.
Reports the relative L2 error of every parameter gradient, summarised per group, and of the logits.
Usage: grad_fidelity.py --precision float32 (writes the reference) | --precision amp-bfloat16 [--fp32-ops ...]"""
import argparse, json, sys
p = argparse.ArgumentParser()
p.add_argument("--precision", default="amp-bfloat16")
p.add_argument("--fp32-ops", default="")
p.add_argument("--bf16-remove", default="")
p.add_argument("--trained", action="store_true")
p.add_argument("--tag", default="")
p.add_argument("--compare", action="store_true", help="float32: compare with the reference instead of writing it")
p.add_argument("--round-input", action="store_true", help="round the input batch to bfloat16 values (float32 run)")
a = p.parse_args()
import numpy as np, mxnet as mx
from mxnet import autograd, gluon
from mxfp16 import precision as P
from mxfp16.amp.lists import operator_lists
from mxfp16.models import build_model
from mxfp16.data import make_loaders
prec = P.resolve_precision(a.precision)
if prec.amp:
    if not (a.fp32_ops or a.bf16_remove):
        P.activate(prec)
    else:
        L = operator_lists("bfloat16")
        L["fp32_ops"] += [o for o in a.fp32_ops.split(",") if o]
        for o in filter(None, a.bf16_remove.split(",")):
            L["target_precision_ops"].remove(o)
        P.activate(prec, **L)
mx.random.seed(0); np.random.seed(0)
net = build_model("cifar_resnet20_v1", 10, ctx=[mx.cpu()], in_shape=(3, 32, 32))
if a.trained:
    net.load_parameters("/work/exp16/runs/repro-f32-s1/checkpoints/epoch-0010.params", ctx=mx.cpu())
net.hybridize(static_alloc=True, static_shape=True)
loaders = make_loaders("/work/exp16/digits", image_size=32, batch_size=64, seed=1)
lossf = gluon.loss.SoftmaxCrossEntropyLoss()
params = {k: v for k, v in net.collect_params().items() if v.grad_req != "null"}
res = {}
for i, (x, y) in enumerate(loaders.train_batches(0)):
    if i == 4: break
    if a.round_input:
        u = x.asnumpy().view(np.uint32); u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        x = mx.nd.array(u.view(np.float32))
    with autograd.record():
        out = net(x)
        loss = lossf(out.astype("float32"), y)
    loss.backward()
    res[f"logits{i}"] = out.astype("float32").asnumpy()
    for k, v in params.items():
        res[f"g{i}/{k}"] = v.grad().asnumpy().copy()
ref_path = f"/work/exp16/runs/gradref{'-trained' if a.trained else ''}.npz"
if not prec.amp and not a.compare:
    np.savez(ref_path, **res); print("reference written"); sys.exit()
ref = np.load(ref_path)
def rel(a_, b_): return float(np.linalg.norm(a_ - b_) / (np.linalg.norm(b_) + 1e-30))
groups = {}
for k in res:
    if k.startswith("logits"): continue
    name = k.split("/", 1)[1]
    grp = ("conv" if name.endswith("weight") and "conv" in name else "dense" if "dense" in name else
           "bn_gamma" if name.endswith("gamma") else "bn_beta" if name.endswith("beta") else name)
    stage = "stem" if "stage" not in name else name.split("_")[1]
    groups.setdefault((stage, grp), []).append(rel(res[k], ref[k]))
print(f"config precision={a.precision} fp32+={a.fp32_ops} bf16-={a.bf16_remove} trained={a.trained}")
print("logits rel err", np.mean([rel(res[f'logits{i}'], ref[f'logits{i}']) for i in range(4)]))
for key in sorted(groups):
    print(f"  {key[0]:7s} {key[1]:9s} median rel err {np.median(groups[key]):.4f}")
allg = [rel(res[k], ref[k]) for k in res if not k.startswith("logits")]
print("ALL median", np.median(allg), "mean", np.mean(allg))
