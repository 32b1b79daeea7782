"""Four users' own HybridBlocks trained through mxfp16's five calls, float32 against ``auto``.

What a user of the library writes: their own Gluon networks (not
``mxfp16.models``), trained with ``resolve_precision``, ``activate``,
``cast_net``, ``make_loss_scaler`` and ``make_trainer``, then per batch
``cast_batch`` and ``train_step``, exactly as README.md shows. The data is
real and needs no download: scikit-learn's handwritten digits (1,797 8x8
scans with 17 grey levels), pixel values divided by 16, a fixed stratified
split holding out 25% of each digit (seed 0; the same rule as
``mxfp16.data.digits``: 1,347 training and 450 test images).

The models, each hybridized, and the optimizer each uses:

=========  ======================================================  ==========================
model      the user's block                                        optimizer
=========  ======================================================  ==========================
lstm       ``gluon.rnn.LSTM(64, layout='NTC')`` over the 8 rows,   adam
           last time step, Dense
gru        ``gluon.rnn.GRU(48, num_layers=2, bidirectional=True,   rmsprop
           layout='NTC')``, mean over time, Dense
attention  a self-attention encoder layer by hand: Dense row        lamb
           embedding + learned positions, Dense q/k/v,
           ``F.batch_dot``, ``F.softmax``, residual, ``LayerNorm``,
           a feed-forward sublayer, mean-pool, Dense
cnn        numpy mode (``npx.set_np()``, ``@mx.util.use_np``,      sgd (momentum 0.9)
           ``mx.np`` arrays): Conv2D, Conv2D, MaxPool2D, Dense,
           Dense on 1x8x8 images
=========  ======================================================  ==========================

Each child runs MXNet with one OpenMP thread (``OMP_NUM_THREADS=1``;
``--threads`` changes it): the models are tiny, and on a shared 2-core machine two
OpenMP threads per process, spinning against other jobs, ran many times
slower. Both precisions run with the same setting.

Every run uses a cosine learning-rate decay to 0 over its epochs (MXNet's
``CosineScheduler``), batch 32, Xavier initialisation, and the seed for the
initial weights and the batch order; the same seed is used for both
precisions, so runs pair by seed.

Modes
-----
``python run.py child --model lstm --precision auto --seed 3``
    One (model, precision, seed) in this process; prints one JSON line per
    model (model, optimizer, requested and resolved precision, seed, final
    test accuracy, epochs, seconds, the categories and messages of any
    Python warnings, and how many of the traced graph's operators compute in
    each dtype). ``--model`` takes a comma-separated list (the tests train
    all four in one process per precision); precision ``auto`` activates
    MXNet's process-global AMP, so each precision needs its own process.
``python run.py [main] --seeds 8``
    Every model x {float32, auto} x seeds 1..N, each in its own subprocess
    (``sys.executable run.py child ...``), then appends a header record
    (machine, commit, command) and every run's record to ``--out``
    (``results.jsonl`` here) in one atomic write (the old lines and the new
    ones go to a temporary file that is renamed over it), and prints the
    summary table for this invocation's runs.

The verdict rule
----------------
For each model the runs pair by seed: ``d_i = acc_auto(seed i) -
acc_float32(seed i)`` in percentage points. The table gives each
precision's mean accuracy over seeds, the mean paired difference and its 95%
Student-t interval, ``mean(d) +- t(0.975, n-1) * sd(d) / sqrt(n)`` (sd with
n-1). The verdict is **same within seed noise** when

1. the interval contains 0 (the seeds cannot tell the precisions apart), or
2. the interval excludes 0 but the gap is tiny against the noise: ``|mean(d)|``
   is at most a quarter of the float32 runs' seed-to-seed standard
   deviation, or at most one test image (100/450 = 0.22 points), whichever
   is larger. (This only matters when the paired differences are almost
   constant, which makes the interval very narrow.)

Otherwise the verdict is **differs** (auto higher or lower).
"""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_OUT = HERE / "results.jsonl"

MODEL_NAMES = ("lstm", "gru", "attention", "cnn")
PRECISIONS = ("float32", "auto")
BATCH_SIZE = 32
TEST_FRACTION = 0.25
SPLIT_SEED = 0
#: One test image, in percentage points (450 held out).
TEST_SIZE = 450

#: Per model: optimizer, its parameters (before the schedule), default epochs.
SETTINGS = {
    "lstm": {"optimizer": "adam", "params": {"learning_rate": 0.01}, "epochs": 15},
    "gru": {"optimizer": "rmsprop", "params": {"learning_rate": 0.01}, "epochs": 15},
    "attention": {"optimizer": "lamb", "params": {"learning_rate": 0.01, "wd": 1e-4}, "epochs": 15},
    "cnn": {"optimizer": "sgd", "params": {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}, "epochs": 10},
}
#: OpenMP threads per child (--threads): these models are tiny, and on a shared 2-core machine
#: two spinning OpenMP threads per process ran many times slower than one.
CHILD_THREADS = 1


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def split_indices(labels, test_fraction=TEST_FRACTION, seed=SPLIT_SEED):
    """Stratified split: ``test_fraction`` of each digit held out, chosen by ``seed`` (``mxfp16 data digits``' split)."""
    from mxfp16.data.digits import stratified_split

    return stratified_split(labels, test_fraction, seed)


def load_digits_arrays(as_images, train_limit=None):
    """(x_train, y_train, x_test, y_test) as float32 numpy arrays, pixels in [0, 1].

    ``as_images``: (N, 1, 8, 8) for the CNN; else (N, 8, 8), 8 time steps of 8 pixels.
    """
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    if as_images:
        x = x[:, None, :, :]
    train, test = split_indices(digits.target)
    if train_limit:
        train = list(np.random.RandomState(SPLIT_SEED).permutation(train)[:train_limit])
    return x[train], y[train], x[test], y[test]


# ---------------------------------------------------------------------------
# The users' own networks
# ---------------------------------------------------------------------------

def build_model(name):
    """A fresh, uninitialised HybridBlock for ``name``, written as a user would."""
    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon import nn, rnn

    if name == "lstm":
        class LSTMNet(gluon.HybridBlock):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                with self.name_scope():
                    self.lstm = rnn.LSTM(64, layout="NTC")
                    self.out = nn.Dense(10)

            def hybrid_forward(self, F, x):
                seq = self.lstm(x)                                   # (N, T, 64)
                last = F.squeeze(F.slice_axis(seq, axis=1, begin=-1, end=None), axis=1)
                return self.out(last)

        return LSTMNet()

    if name == "gru":
        class BiGRUNet(gluon.HybridBlock):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                with self.name_scope():
                    self.gru = rnn.GRU(48, num_layers=2, bidirectional=True, layout="NTC")
                    self.out = nn.Dense(10)

            def hybrid_forward(self, F, x):
                return self.out(F.mean(self.gru(x), axis=1))         # (N, T, 96) -> (N, 96)

        return BiGRUNet()

    if name == "attention":
        class EncoderLayerNet(gluon.HybridBlock):
            def __init__(self, units=32, steps=8, **kwargs):
                super().__init__(**kwargs)
                self._units = units
                with self.name_scope():
                    self.embed = nn.Dense(units, flatten=False)
                    self.pos = self.params.get("pos", shape=(1, steps, units), init=mx.init.Normal(0.1))
                    self.query = nn.Dense(units, flatten=False, use_bias=False)
                    self.key = nn.Dense(units, flatten=False, use_bias=False)
                    self.value = nn.Dense(units, flatten=False, use_bias=False)
                    self.norm1 = nn.LayerNorm()
                    self.ffn1 = nn.Dense(64, flatten=False, activation="relu")
                    self.ffn2 = nn.Dense(units, flatten=False)
                    self.norm2 = nn.LayerNorm()
                    self.out = nn.Dense(10)

            def hybrid_forward(self, F, x, pos):
                h = F.broadcast_add(self.embed(x), pos)                 # (N, T, units)
                q, k, v = self.query(h), self.key(h), self.value(h)
                scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(self._units)
                attended = F.batch_dot(F.softmax(scores, axis=-1), v)
                h = self.norm1(h + attended)
                h = self.norm2(h + self.ffn2(self.ffn1(h)))
                return self.out(F.mean(h, axis=1))

        return EncoderLayerNet()

    if name == "cnn":
        @mx.util.use_np
        class NumpyCNN(gluon.HybridBlock):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                with self.name_scope():
                    self.conv1 = nn.Conv2D(16, 3, padding=1, activation="relu")
                    self.conv2 = nn.Conv2D(32, 3, padding=1, activation="relu")
                    self.pool = nn.MaxPool2D(2)
                    self.fc = nn.Dense(64, activation="relu")
                    self.out = nn.Dense(10)

            def hybrid_forward(self, F, x):
                h = self.pool(self.conv2(self.conv1(x)))             # (N, 32, 4, 4)
                h = F.np.reshape(h, (-1, 32 * 4 * 4))
                return self.out(self.fc(h))

        return NumpyCNN()

    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")


def graph_dtypes(net, shape, numpy_mode):
    """How many of ``net``'s traced operators output each dtype (AMP's casts left out).

    Traces the network symbolically with AMP (if active) patching the
    operators, the way hybridize() builds its graph, and infers the types.
    """
    import numpy as np
    import mxnet as mx

    data = mx.sym.var("data")
    if numpy_mode:
        data = data.as_np_ndarray()
    out = net(data)
    if numpy_mode:
        out = out.as_nd_ndarray()
    internals = out.get_internals()
    _, types, _ = internals.infer_type_partial(data="float32")
    by_output = dict(zip(internals.list_outputs(), types))
    counts = {}
    for node in json.loads(out.tojson(remove_amp_cast=False))["nodes"]:
        if node["op"] in ("null", "amp_cast", "amp_multicast"):
            continue
        dtype = by_output.get(f"{node['name']}_output")
        if dtype is None:
            dtype = next((t for n, t in by_output.items() if n.startswith(f"{node['name']}_output")), None)
        if dtype is None:
            key = "unknown"
        else:
            dt = np.dtype(dtype)
            key = "bfloat16" if dt.names == ("bfloat16",) else dt.name
        counts[key] = counts.get(key, 0) + 1
    return counts


# ---------------------------------------------------------------------------
# child: one (model, precision, seed) through the five calls
# ---------------------------------------------------------------------------

def train_one(model, precision_name, seed, epochs=None, train_limit=None):
    """Train ``model`` in this process and return its record (a dict)."""
    import numpy as np
    import mxfp16  # noqa: F401 -- already imported by the caller, before mxnet
    import mxnet as mx
    from mxnet import gluon

    settings = SETTINGS[model]
    epochs = settings["epochs"] if epochs is None else epochs
    numpy_mode = model == "cnn"
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if numpy_mode:
            mx.npx.set_np()
        try:
            ctx = [mx.cpu()]
            precision = mxfp16.resolve_precision(precision_name, ctx)          # 1
            mxfp16.activate(precision)                                         # 2
            mx.random.seed(seed)
            np.random.seed(seed)
            net = build_model(model)
            net.initialize(mx.init.Xavier(), ctx=ctx)
            mxfp16.cast_net(net, precision.param_dtype)                        # 3
            net.hybridize()
            scaler = mxfp16.make_loss_scaler(precision)                        # 4
            x_train, y_train, x_test, y_test = load_digits_arrays(numpy_mode, train_limit)
            steps_per_epoch = math.ceil(len(x_train) / BATCH_SIZE)
            params = dict(settings["params"])
            params["lr_scheduler"] = mx.lr_scheduler.CosineScheduler(
                max_update=max(epochs * steps_per_epoch, 1), base_lr=params["learning_rate"], final_lr=0.0)
            trainer = mxfp16.make_trainer(net.collect_params(), settings["optimizer"], params,
                                          precision, scaler)                   # 5
            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
            array = mx.np.array if numpy_mode else mx.nd.array
            rng = np.random.RandomState(seed)
            losses, skipped = [], 0
            for _ in range(epochs):
                order = rng.permutation(len(x_train))
                total = 0.0
                for i in range(0, len(order), BATCH_SIZE):
                    idx = order[i:i + BATCH_SIZE]
                    data, label = mxfp16.cast_batch(array(x_train[idx]), array(y_train[idx]),
                                                    precision.data_dtype, ctx)
                    result = mxfp16.train_step(net, loss_fn, trainer, data, label, scaler)
                    skipped += int(result.skipped)
                    total += float(result.loss.asnumpy()[0]) * len(idx)
                losses.append(total / len(order))
            logits = mxfp16.to_float32(net(array(x_test, ctx=ctx[0])))
            predicted = logits.asnumpy().argmax(axis=1)
            accuracy = 100.0 * float((predicted == y_test).mean())
            seconds = time.perf_counter() - start
            dtypes = graph_dtypes(net, x_test.shape, numpy_mode)
        finally:
            if numpy_mode:
                mx.npx.reset_np()
    warned = [{"category": w.category.__name__, "message": str(w.message)[:300]} for w in caught]
    return {"kind": "run", "model": model, "optimizer": settings["optimizer"], "requested": precision_name,
            "precision": precision.name, "seed": seed, "accuracy": round(accuracy, 4), "epochs": epochs,
            "train_images": len(x_train), "test_images": len(x_test), "seconds": round(seconds, 2),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "losses": [round(v, 5) for v in losses], "skipped_steps": skipped,
            "graph_dtypes": dtypes, "warnings": sorted({w["category"] for w in warned}),
            "warning_messages": sorted({f"{w['category']}: {w['message']}" for w in warned})}


def child(args):
    import mxfp16  # noqa: F401 -- must come before mxnet

    for model in args.model.split(","):
        record = train_one(model.strip(), args.precision, args.seed, args.epochs, args.train_limit)
        print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------
# main: every model x precision x seed, one subprocess each
# ---------------------------------------------------------------------------

def t_quantile_975(df):
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def paired_summary(float32, auto, test_size=TEST_SIZE):
    """Compare accuracies (percentage points) paired by seed; see the module docstring for the rule.

    Parameters
    ----------
    float32, auto : sequence of float
        Accuracy of each seed, in the same seed order.

    Returns
    -------
    dict
        n, mean_float32, mean_auto, sd_float32, sd_auto, diff (mean of auto -
        float32), sd_diff, half_width, low, high, contains_zero, verdict.
    """
    if len(float32) != len(auto) or len(float32) < 2:
        raise ValueError("need at least two seeds with both precisions")
    n = len(float32)
    diffs = [b - a for a, b in zip(float32, auto)]

    def mean(v):
        return math.fsum(v) / len(v)

    def sd(v):
        m = mean(v)
        return math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))

    diff, sd_diff = mean(diffs), sd(diffs)
    half = t_quantile_975(n - 1) * sd_diff / math.sqrt(n)
    low, high = diff - half, diff + half
    contains_zero = low <= 0.0 <= high
    tiny = max(0.25 * sd(float32), 100.0 / test_size)
    if contains_zero:
        verdict = "same within seed noise"
    elif abs(diff) <= tiny:
        verdict = "same within seed noise (gap tiny)"
    else:
        verdict = "differs: auto " + ("higher" if diff > 0 else "lower")
    return {"n": n, "mean_float32": mean(float32), "mean_auto": mean(auto), "sd_float32": sd(float32),
            "sd_auto": sd(auto), "diff": diff, "sd_diff": sd_diff, "half_width": half, "low": low, "high": high,
            "contains_zero": contains_zero, "verdict": verdict}


def summary_table(records):
    """The per-model summary of ``records`` (kind 'run'), as Markdown lines."""
    lines = ["| model | optimizer | seeds | float32 acc % (sd) | auto acc % (sd) | auto precision "
             "| auto - float32, points [95% t interval] | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for model in MODEL_NAMES:
        runs = [r for r in records if r["model"] == model]
        by = {p: {r["seed"]: r for r in runs if r["requested"] == p} for p in PRECISIONS}
        seeds = sorted(set(by["float32"]) & set(by["auto"]))
        if len(seeds) < 2:
            continue
        s = paired_summary([by["float32"][k]["accuracy"] for k in seeds], [by["auto"][k]["accuracy"] for k in seeds])
        resolved = ", ".join(sorted({by["auto"][k]["precision"] for k in seeds}))
        lines.append(f"| {model} | {runs[0]['optimizer']} | {s['n']} | {s['mean_float32']:.2f} ({s['sd_float32']:.2f}) "
                     f"| {s['mean_auto']:.2f} ({s['sd_auto']:.2f}) | {resolved} "
                     f"| {s['diff']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] | {s['verdict']} |")
    return lines


def machine():
    """CPU model, cores, load and the commit, for the header record."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        flags = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
    except OSError:
        pass

    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {"cpu": model, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "bfloat16_flags": sorted({f for f in flags.split() if "bf16" in f}),
            "uptime": run(["uptime"]), "loadavg": list(os.getloadavg()),
            "python": platform.python_version(), "commit": run(["git", "rev-parse", "HEAD"]),
            "tree_changes_in_mxfp16": bool(run(["git", "status", "--porcelain", "--", "mxfp16"]))}


def run_child(model, precision, seed, epochs=None, train_limit=None, timeout=900, threads=CHILD_THREADS):
    """One ``run.py child`` subprocess with ``threads`` OpenMP threads; returns the records it printed.

    The thread count is always set: ``import mxfp16`` in a parent process
    (pytest's, for one) has already put its own OMP_NUM_THREADS in the
    environment the child would inherit.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "child", "--model", model, "--precision", precision,
           "--seed", str(seed)]
    if epochs is not None:
        cmd += ["--epochs", str(epochs)]
    if train_limit is not None:
        cmd += ["--train-limit", str(train_limit)]
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.pop("MXFP16_THREADS_SET", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for record in records:
        record["stderr_tail"] = proc.stderr[-500:] if proc.stderr.strip() else ""
    return records


def append_atomically(path, records):
    """Write the file's old lines plus ``records`` to a temporary file, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(old + "".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(args):
    invocation = time.strftime("%Y%m%dT%H%M%S")
    header = {"kind": "header", "invocation": invocation, "command": " ".join([Path(sys.executable).name] + sys.argv),
              "seeds": list(range(1, args.seeds + 1)), "epochs": args.epochs or {m: SETTINGS[m]["epochs"] for m in MODEL_NAMES},
              "batch_size": BATCH_SIZE, "threads_per_child": args.threads, "split": {"test_fraction": TEST_FRACTION, "seed": SPLIT_SEED},
              "optimizers": {m: SETTINGS[m] for m in MODEL_NAMES}, "machine": machine()}
    records, started = [], time.perf_counter()
    for seed in range(1, args.seeds + 1):
        for model in MODEL_NAMES:
            for precision in PRECISIONS:
                load = os.getloadavg()[0]
                for record in run_child(model, precision, seed, args.epochs, threads=args.threads):
                    record.update(invocation=invocation, load_before=round(load, 2))
                    records.append(record)
                    print(f"{model:<9} {precision:<7} seed {seed}: {record['accuracy']:6.2f}%  ({record['precision']}, "
                          f"{record['seconds']:.1f} s, warnings: {', '.join(record['warnings']) or 'none'})", flush=True)
    header["wall_seconds"] = round(time.perf_counter() - started, 1)
    header["machine_after"] = {"uptime": machine()["uptime"]}
    append_atomically(args.out, [header] + records)
    print(f"\n{len(records)} runs in {header['wall_seconds']:.0f} s; appended to {args.out}\n")
    print("\n".join(summary_table(records)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="main", choices=("main", "child"))
    parser.add_argument("--seeds", type=int, default=8, help="seeds 1..N per model and precision (main)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs for every model (default: per model)")
    parser.add_argument("--threads", type=int, default=CHILD_THREADS, help="OpenMP threads per child (main)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON-lines file the records are appended to")
    parser.add_argument("--model", default=",".join(MODEL_NAMES), help="child: model(s), comma-separated")
    parser.add_argument("--precision", default="float32", choices=PRECISIONS, help="child: precision")
    parser.add_argument("--seed", type=int, default=1, help="child: seed")
    parser.add_argument("--train-limit", type=int, default=None, help="child: train on this many images only")
    return parser.parse_args(argv)


if __name__ == "__main__":
    _args = parse_args()
    if _args.mode == "child":
        child(_args)
    else:
        main(_args)
