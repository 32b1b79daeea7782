#!/bin/bash
# The word-LM LSTM bench with its bfloat16 rows unfused, before (the library of commit BEFORE, default 9919c75) and
# after the gates' Activation (this checkout), then the same bench fused; one after the other, from a checkout with
# its .venv, on an idle machine:
#   OUT=/tmp/unfused-activation bash docs/results/unfused-activation-zen5/run.sh
OUT=${OUT:-/tmp/unfused-activation}
BEFORE=${BEFORE:-9919c75}
mkdir -p "$OUT"
old=$(mktemp -d)
git archive "$BEFORE" mxfp16 | tar -x -C "$old"
uptime > "$OUT/load_average.txt"
for r in before after fused; do
  src=.; opt="--model-option unfused_bf16=1"
  [ $r = before ] && src=$old
  [ $r = fused ] && opt=""
  env -i HOME=$HOME PATH=/usr/bin:/bin PYTHONPATH=$src OMP_NUM_THREADS=2 .venv/bin/python -m mxfp16 bench \
    --model word-lm-lstm $opt --precisions float32,amp-bfloat16 --rounds 3 --no-plots --out "$OUT/$r" \
    > "$OUT/$r.log" 2>&1
  uptime >> "$OUT/load_average.txt"
done
rm -rf "$old"
