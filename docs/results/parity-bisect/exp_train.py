"""One run of mxfp16's own trainer (mxfp16.train.train, i.e. exactly `mxfp16 train`) with a chosen AMP
operator-list configuration and (optionally) a different training augmentation.

AMP is initialised here, before train() runs; Run() then calls activate() which sees AMP already
initialised for the same target and returns. One configuration per process.

Examples:
  exp_train.py --precision amp-bfloat16 --seed 1 --out runs/x --fp32-ops BatchNorm
  exp_train.py --precision amp-bfloat16 --seed 1 --out runs/x --bf16-remove FullyConnected
  exp_train.py --precision float32 --seed 1 --out runs/x --augment none
"""
import argparse, json, os, sys
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--precision", required=True)
p.add_argument("--seed", type=int, required=True)
p.add_argument("--out", required=True)
p.add_argument("--lists", default="mxfp16", choices=["mxfp16", "mxnet"])
p.add_argument("--fp32-ops", default="", help="comma list appended to fp32_ops")
p.add_argument("--bf16-remove", default="", help="comma list removed from target_precision_ops")
p.add_argument("--bf16-add", default="", help="comma list appended to target_precision_ops")
p.add_argument("--stem-fp32", action="store_true", help="the convolution that reads the network input in float32")
p.add_argument("--augment", default="imagenet", choices=["imagenet", "light", "none"])
p.add_argument("--data-dir", default="/work/exp16/digits")
p.add_argument("--data-root", default=None)
p.add_argument("--model", default="cifar_resnet20_v1")
p.add_argument("--image-size", type=int, default=32)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--lr-schedule", default="cosine")
p.add_argument("--demo", action="store_true", help="use the demo profile (no data_dir; defaults from the profile)")
args = p.parse_args()

import mxnet as mx
from mxnet import ndarray, symbol
from mxnet.contrib import amp
import mxfp16
from mxfp16 import precision as P
from mxfp16.amp.lists import operator_lists, stem_convolution
from mxfp16.amp.wrappers import float32_where

prec = P.resolve_precision(args.precision)
desc = {"lists": args.lists, "fp32_ops+": args.fp32_ops, "bf16-": args.bf16_remove, "bf16+": args.bf16_add,
        "stem_fp32": args.stem_fp32, "augment": args.augment}
if prec.amp:
    lists = operator_lists("bfloat16", args.lists)
    for op in filter(None, args.bf16_remove.split(",")):
        lists["target_precision_ops"].remove(op)
    lists["target_precision_ops"] += [o for o in args.bf16_add.split(",") if o]
    lists["fp32_ops"] += [o for o in args.fp32_ops.split(",") if o]
    modules = [m for module in (symbol, ndarray) for m in (module, module.op)]
    originals = {m: m.Convolution for m in modules}
    amp.init(target_dtype="bfloat16", **lists)
    if args.lists == "mxfp16":  # mxfp16's 7x7 stem rule, as amp_lists.init_amp does
        for m in modules:
            m.Convolution = float32_where(originals[m], m.Convolution, stem_convolution)
    if args.stem_fp32:
        def stem_rule(original, wrapped):
            def conv(*a, **kw):
                x = a[0] if a else kw.get("data")
                if isinstance(x, symbol.Symbol) and x.name == "data" or \
                   isinstance(x, ndarray.NDArray) and x.shape[1] == 3:
                    a = [symbol.amp_cast(v, dtype="float32") if isinstance(v, symbol.Symbol) else v for v in a]
                    kw = {k: symbol.amp_cast(v, dtype="float32") if isinstance(v, symbol.Symbol) else v for k, v in kw.items()}
                    return original(*a, **kw)
                return wrapped(*a, **kw)
            return conv
        for m in modules:
            m.Convolution = stem_rule(originals[m], m.Convolution)
    P._amp_target = "bfloat16"

if args.augment != "imagenet":
    from mxfp16.data import augment, pipelines
    orig = pipelines._FolderImages.__getitem__
    def getitem(self, idx):
        if self._epoch is None:
            return orig(self, idx)
        if args.augment == "none":      # the evaluation transform (resize short side, center crop), no flip
            epoch, self._epoch = self._epoch, None
            try:
                return orig(self, idx)
            finally:
                self._epoch = epoch
        # light: random resized crop of 50-100% of the area, no flip
        img, label = self._base[idx]
        with pipelines._python_random_seeded(f"{self._seed}/{self._epoch}/{idx}"):
            img = mx.image.random_size_crop(img, (self._size, self._size), (0.5, 1.0), augment.CROP_RATIO)[0]
        return img, label
    pipelines._FolderImages.__getitem__ = getitem

from mxfp16.train import train
cfg = dict(precision=args.precision, seed=args.seed, out=args.out, progress=False, overwrite=True)
if not args.demo:
    cfg.update(data_dir=args.data_dir, model=args.model, image_size=args.image_size, batch_size=args.batch_size,
               epochs=args.epochs, lr=args.lr, lr_schedule=args.lr_schedule)
elif args.data_root:
    cfg.update(data_root=args.data_root)
summary = train(cfg, log=lambda m: print(m, flush=True))
json.dump(desc, open(os.path.join(args.out, "experiment.json"), "w"))
print("RESULT", json.dumps({"out": args.out, **desc, "val_top1": summary["final_val_top1"]}))
