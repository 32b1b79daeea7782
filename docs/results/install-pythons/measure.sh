#!/bin/sh
# Install time and demo time of the README's first command on each Python, from a fresh clone,
# wheels only, with pip's cache off (what a new machine downloads). One Python at a time, nothing
# else running. Writes one JSON line per Python to results.jsonl beside this script.
#   sh docs/results/install-pythons/measure.sh python3.12 python3.13 python3.8 python3
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
for python in "$@"; do
    work=$(mktemp -d)
    git clone -q "$repo" "$work/mxfp16"
    cd "$work/mxfp16"
    commit=$(git rev-parse --short HEAD)
    start=$(date +%s)
    PIP_ONLY_BINARY=numpy PIP_NO_CACHE_DIR=1 make .venv/.demo-installed PYTHON="$python" > "$work/install.log" 2>&1
    installed=$(date +%s)
    PIP_ONLY_BINARY=numpy make demo PYTHON="$python" > "$work/demo.log" 2>&1
    done_at=$(date +%s)
    versions=$(.venv/bin/python -c 'import mxfp16, sys, numpy, mxnet; print("%d.%d.%d" % sys.version_info[:3], numpy.__version__, mxnet.__version__)')
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '{"python": "%s", "numpy": "%s", "mxnet": "%s", "install_seconds": %d, "demo_seconds": %d, "commit": "%s", "load_after": "%s", "command": "PIP_ONLY_BINARY=numpy PIP_NO_CACHE_DIR=1 make .venv/.demo-installed PYTHON=%s; PIP_ONLY_BINARY=numpy make demo PYTHON=%s"}\n' \
        $versions "$((installed - start))" "$((done_at - installed))" "$commit" "$load" "$python" "$python" >> "$here/results.jsonl"
    grep -E "^(float32|auto) " "$work/demo.log" | sed "s/^/  $python: /"
    cd "$repo"
    rm -rf "$work"
done
