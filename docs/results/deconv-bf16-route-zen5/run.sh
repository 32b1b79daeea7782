#!/bin/bash
# The two DCGAN benches of README.md, one after the other, from a checkout with its .venv, on an idle machine:
#   OUT=/tmp/deconv-route bash docs/results/deconv-bf16-route-zen5/run.sh
OUT=${OUT:-/tmp/deconv-route}
mkdir -p "$OUT"
uptime > "$OUT/load_average.txt"
for r in route default; do
  opt=""; [ $r = route ] && opt="--model-option bf16_deconv=1"
  env -i HOME=$HOME PATH=/usr/bin:/bin PYTHONPATH=. OMP_NUM_THREADS=2 .venv/bin/python -m mxfp16 bench --model dcgan \
    $opt --precisions float32,amp-bfloat16 --rounds 3 --no-plots --out "$OUT/$r" > "$OUT/$r.log" 2>&1
  uptime >> "$OUT/load_average.txt"
done
