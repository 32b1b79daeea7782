"""d2l 1.0.3's TransformerEncoder (numpy mode) training: amp-bfloat16 against float32, speed and peak memory.

``mxfp16 bench`` times the models ``mxfp16 train`` builds; d2l's encoder is
a client's numpy-mode ``nn.Block`` (never hybridized), so it is timed here,
the same way: each measurement in its own process (AMP is process-global),
warm-up steps first, then ``--repeats`` timed repeats of ``--iters`` steps
(forward, backward, SGD update) bracketed by ``waitall``, the median ms per
step, and the process's peak resident memory. ``--rounds N`` runs float32
and amp-bfloat16 in turn N times; each round's speedup is its own ratio and
the record keeps the median and the range.

The network is the book's (d2l chapter 11.7): 2 encoder blocks, 256 hidden
units, 4 heads, feed-forward 64, dropout 0.2, a vocabulary of 10,000 and
sequences of 35 tokens, with a Dense head over the vocabulary and softmax
cross-entropy against random targets.

Run from the repository root (records go to ``--out``, results.json, written atomically)::

    python docs/results/bench-d2l-transformer/run.py --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PRECISIONS = ("float32", "amp-bfloat16")
VOCAB, HIDDENS, FFN, HEADS, BLOCKS, DROPOUT = 10000, 256, 64, 4, 2, 0.2


def child(args):
    """One measurement in this process: prints one JSON record."""
    import warnings

    import mxfp16

    warnings.simplefilter("ignore")
    precision = mxfp16.resolve_precision(args.precision, "cpu")
    mxfp16.activate(precision)
    import mxnet as mx
    import numpy as onp
    from d2l import mxnet as d2l
    from mxnet import autograd, gluon, np, npx

    from mxfp16.amp.wrappers import cast
    from mxfp16.machine.hardware import peak_memory_mb

    npx.set_np()
    mx.random.seed(0)
    encoder = d2l.TransformerEncoder(VOCAB, HIDDENS, FFN, HEADS, BLOCKS, DROPOUT)
    head = gluon.nn.Dense(VOCAB, flatten=False)
    encoder.initialize(mx.init.Xavier())
    head.initialize(mx.init.Xavier())
    rng = onp.random.RandomState(0)
    tokens = np.array(rng.randint(0, VOCAB, (args.batch_size, args.seq_len)).astype("float32"))
    targets = np.array(rng.randint(0, VOCAB, (args.batch_size, args.seq_len)).astype("float32"))
    valid = np.array(rng.randint(args.seq_len // 2, args.seq_len + 1, (args.batch_size,)).astype("float32"))
    params = list(encoder.collect_params().values()) + list(head.collect_params().values())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            logits = head(encoder(tokens, valid))
            loss = loss_fn(cast(logits, "float32"), targets).mean()
        loss.backward()
        trainer.step(1)
        return loss

    head(encoder(tokens, valid))  # deferred initialisation, before the trainer reads the shapes
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.01, "multi_precision": True})
    for _ in range(args.warmup):
        step()
    mx.nd.waitall()
    wall = []
    for _ in range(args.repeats):
        mx.nd.waitall()
        start = time.perf_counter()
        losses = [step() for _ in range(args.iters)]
        float(losses[-1].item())
        mx.nd.waitall()
        wall.append((time.perf_counter() - start) / args.iters)
    ms = statistics.median(wall) * 1000
    print(json.dumps({"precision": precision.name, "requested": args.precision, "ms_per_step": round(ms, 2),
                      "ms_spread": [round(w * 1000, 2) for w in wall],
                      "tokens_per_second": round(args.batch_size * args.seq_len / (ms / 1000), 1),
                      "peak_memory_mb": round(peak_memory_mb([mx.cpu()]), 1),
                      "batch_size": args.batch_size, "seq_len": args.seq_len, "iters": args.iters,
                      "warmup": args.warmup, "repeats": args.repeats,
                      "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}))


def main(args):
    from mxfp16.plumbing.fileio import write_json
    from mxfp16.machine.hardware import machine_summary

    rounds = []
    for r in range(args.rounds):
        runs = {}
        for precision in PRECISIONS:
            cmd = [sys.executable, os.path.abspath(__file__), "child", "--precision", precision,
                   "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--iters", str(args.iters),
                   "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{precision} failed:\n{proc.stderr[-3000:]}")
            runs[precision] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"round {r + 1} {precision}: {runs[precision]['ms_per_step']} ms/step, "
                  f"{runs[precision]['peak_memory_mb']} MiB", flush=True)
        runs["speedup"] = round(runs["float32"]["ms_per_step"] / runs["amp-bfloat16"]["ms_per_step"], 3)
        runs["memory_ratio"] = round(runs["amp-bfloat16"]["peak_memory_mb"] / runs["float32"]["peak_memory_mb"], 3)
        rounds.append(runs)
    speedups = [r["speedup"] for r in rounds]
    memory = [r["memory_ratio"] for r in rounds]
    document = {"model": "d2l 1.0.3 TransformerEncoder + Dense head (numpy mode, imperative)",
                "config": {"vocab": VOCAB, "hiddens": HIDDENS, "ffn": FFN, "heads": HEADS, "blocks": BLOCKS,
                           "dropout": DROPOUT, "command": " ".join(sys.argv)},
                "machine": machine_summary(), "rounds": rounds,
                "speedup": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
                "memory_ratio": statistics.median(memory), "memory_ratio_range": [min(memory), max(memory)]}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "results.json"), document)
    print(f"amp-bfloat16 / float32: speedup {document['speedup']}x (rounds {min(speedups)}-{max(speedups)}), "
          f"memory {document['memory_ratio']}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="main", choices=("main", "child"))
    parser.add_argument("--precision", default="float32", choices=PRECISIONS, help="child: precision")
    parser.add_argument("--rounds", type=int, default=3, help="float32 and amp-bfloat16 in turn, N times (default 3)")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step (default 64)")
    parser.add_argument("--seq-len", type=int, default=35, help="tokens per sequence (default 35)")
    parser.add_argument("--iters", type=int, default=10, help="steps per timed repeat (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats, median over them (default 3)")
    parser.add_argument("--out", default=HERE, help="folder for results.json (default: this folder)")
    parsed = parser.parse_args()
    child(parsed) if parsed.mode == "child" else main(parsed)
