"""Mixed-precision training in one page: scikit-learn's digits, a small CNN, MixedPrecision, a checkpoint.

    python examples/train_minimal.py                              # auto: the fastest precision that runs here
    python examples/train_minimal.py --precision float32 --epochs 3
    python examples/train_minimal.py --epochs 6 --resume          # continue runs/train-minimal to epoch 6
"""
import argparse
import json
import os

import mxfp16  # before mxnet: it prepares the stack and MXNet's thread count

import mxnet as mx
import numpy as np
from mxnet import gluon
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--precision", default="auto", help=f"one of {', '.join(mxfp16.PRECISIONS)} (default: auto)")
parser.add_argument("--ctx", default="auto", help="devices, e.g. cpu or gpu:0,1 (default: auto, every GPU else CPU)")
parser.add_argument("--epochs", type=int, default=4, help="epochs in all, resumed ones included (default: 4)")
parser.add_argument("--batch-size", type=int, default=64, help="images per step (default: 64)")
parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default: 0.1)")
parser.add_argument("--out", default="runs/train-minimal", help="checkpoint folder (default: runs/train-minimal)")
parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
args = parser.parse_args()

# Precision and devices first: AMP patches MXNet for the whole process, before the network's first step.
try:
    mp = mxfp16.MixedPrecision(args.precision, args.ctx)
except (mxfp16.PrecisionError, mxfp16.DeviceError) as err:  # a precision or device this machine cannot run
    parser.error(str(err))

# Data: 1,797 handwritten digits of 8x8 pixels (17 grey levels), shipped inside scikit-learn; a fixed split.
digits = load_digits()
images = (digits.images[:, None] / 16.0).astype(np.float32)
labels = digits.target.astype(np.float32)
order = np.random.RandomState(0).permutation(len(images))
test, train = order[:360], order[360:]


def batches(index, shuffle_seed=None):
    """Full batches only (a hybridized graph with static shapes keeps one shape), as MXNet arrays."""
    if shuffle_seed is not None:
        index = np.random.RandomState(shuffle_seed).permutation(index)
    for start in range(0, len(index) - args.batch_size + 1, args.batch_size):
        chunk = index[start:start + args.batch_size]
        yield mx.nd.array(images[chunk]), mx.nd.array(labels[chunk])


# The network: Conv2D and Dense run in the precision's dtype, BatchNorm keeps float32 statistics.
mx.random.seed(0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(32, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.Conv2D(64, 3, strides=2, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier(), ctx=mp.ctx)
net.hybridize(static_alloc=True, static_shape=True)
trainer = mp.prepare(net, "sgd", {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

# Resume: parameters, optimizer state, and the precision with its loss scale (mp.state_dict()).
checkpoint = os.path.join(args.out, "checkpoint")
first_epoch = 0
if args.resume:
    with open(checkpoint + ".json") as handle:
        saved = json.load(handle)
    mp.load_state_dict(saved["mixed_precision"])  # refuses a run of another precision, naming it
    net.load_parameters(checkpoint + ".params", ctx=mp.ctx)
    trainer.load_states(checkpoint + ".states")  # Gluon's own format, a pickle: load only files you wrote
    first_epoch = saved["epoch"]
    print(f"resuming {args.out} after epoch {first_epoch}")
print(f"precision {mp.precision.name}: {mp.precision.reason}")


def save(epoch):
    """Each file written under a temporary name, then renamed: a crash leaves the previous checkpoint whole."""
    os.makedirs(args.out, exist_ok=True)
    net.save_parameters(checkpoint + ".params.tmp")
    trainer.save_states(checkpoint + ".states.tmp")
    with open(checkpoint + ".json.tmp", "w") as handle:
        json.dump({"epoch": epoch, "mixed_precision": mp.state_dict()}, handle)
    for suffix in (".params", ".states", ".json"):  # the record last: it says the other two are complete
        os.replace(checkpoint + suffix + ".tmp", checkpoint + suffix)


for epoch in range(first_epoch, args.epochs):
    losses = []
    for x, y in batches(train, shuffle_seed=epoch):
        data, label = mp.cast_batch(x, y)
        losses.append(mp.train_step(net, loss_fn, trainer, data, label).loss)  # not read yet: no host sync
    correct = seen = 0
    for x, y in batches(test):
        data, label = mp.cast_batch(x, y)
        for out, truth in zip(mp.eval_step(net, data), label):  # float32 outputs, one per device
            correct += int((out.argmax(axis=1) == truth).sum().asscalar())
            seen += truth.shape[0]
    mean_loss = float(np.mean([loss.item() for loss in losses]))  # one sync per epoch, here
    print(f"epoch {epoch + 1}: loss {mean_loss:.4f}, test accuracy {correct / seen:.4f}, "
          f"loss scale {mp.scaler.scale:g}, skipped steps {mp.scaler.skipped_steps}")
    save(epoch + 1)
