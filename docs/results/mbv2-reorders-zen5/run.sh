#!/bin/bash
# MobileNet v2 at 224 px, batch 16, in float32 and in amp-bfloat16 under the mxfp16+unaligned32 lists, one round,
# with the kernel census that names the largest reorders; from a checkout with its .venv, on an idle machine:
#   OUT=docs/results/mbv2-reorders-zen5 bash docs/results/mbv2-reorders-zen5/run.sh
OUT=${OUT:-/tmp/mbv2-reorders}
mkdir -p "$OUT"
uptime > "$OUT/load_average.txt"
env -i HOME=$HOME PATH=/usr/bin:/bin PYTHONPATH=. .venv/bin/python -m mxfp16 bench --model mobilenetv2_1.0 \
  --image-size 224 --batch-sizes 16 --precisions float32,amp-bfloat16 --amp-lists mxfp16+unaligned32 --rounds 1 \
  --no-plots --overwrite --out "$OUT/bench" > "$OUT/bench.log" 2>&1
uptime >> "$OUT/load_average.txt"
