"""Run each real client in float32 and amp-bfloat16, each in its own process, and record what it printed.

Usage, from the repository root, after installing the three libraries
without their dependency pins (README.md beside this file)::

    .venv/bin/python examples/real_clients/record.py [--out docs/results/real-clients]

Writes one ``<client>-<precision>.txt`` per run: the versions, the command,
the script's output and the warnings mxfp16 gave. amp-bfloat16 is left out
where the CPU cannot run bfloat16. Nothing here is timed.
"""
import argparse
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CLIENTS = {"gluonnlp_bert": "gluonnlp", "gluonts_feedforward": "gluonts", "d2l_bert_nsp": "d2l"}


def versions():
    code = ("import importlib.metadata as m; print(' '.join(f'{p} {m.version(p)}' for p in "
            "('mxnet', 'numpy', 'gluonnlp', 'gluonts', 'd2l')))")
    libraries = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return f"Python {platform.python_version()}, {libraries}, mxfp16 at {commit.stdout.strip() or 'unknown'}"


def _local(line):
    """A warning's location without this machine's folders."""
    line = line.replace(REPO + os.sep, "")
    return re.sub(r"\S*site-packages" + re.escape(os.sep), "<site-packages>/", line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "results", "real-clients"),
                        help="folder for the records (default: docs/results/real-clients)")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from mxfp16.machine.hardware import bfloat16_support
    from mxfp16.plumbing.output import atomic_write

    precisions = ["float32"] + (["amp-bfloat16"] if bfloat16_support().runs else [])
    os.makedirs(args.out, exist_ok=True)
    header = versions()
    for script in CLIENTS:
        for precision in precisions:
            command = [sys.executable, os.path.join(HERE, f"{script}.py"), "--precision", precision]
            proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
            said = sorted({_local(line.strip()) for line in proc.stderr.splitlines() if "mxfp16" in line})
            text = (f"# {header}\n# python examples/real_clients/{script}.py --precision {precision}"
                    f" (exit {proc.returncode})\n{proc.stdout}"
                    + "".join(f"warning: {line}\n" for line in said)
                    + (proc.stderr[-3000:] if proc.returncode else ""))
            with atomic_write(os.path.join(args.out, f"{script}-{precision}.txt")) as handle:
                handle.write(text)
            print(f"{script} {precision}: exit {proc.returncode}")


if __name__ == "__main__":
    main()
