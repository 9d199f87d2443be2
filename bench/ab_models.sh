#!/usr/bin/env bash
# bench_models.py for two checkouts in separate processes, alternating, on the GPU machine.
# Usage (repository root, after `source .gpu/env.sh`): bench/ab_models.sh BASE_DIR ORDER TAG
#   BASE_DIR: an unpacked older tree with its own src/, bench/ and tests/ (e.g. `git archive REV src bench tests`
#             into .gpu/base, which travels to the GPU machine with carry [".gpu"]);
#   ORDER: "old new" or "new old"; TAG names the output files ($OUT/old_TAG.txt, $OUT/new_TAG.txt, .json).
set -u
base=$1
models=${MODELS:-resnet18_b1,resnet18_b8,mobilenetv2_b1,bert4x768_s128}
root=$(pwd)
for arm in $2; do
  if [ "$arm" = old ]; then
    (cd "$base" && timeout 280 python3 bench/bench_models.py --no-cpu --no-compile --models "$models" \
       --repeat 50 --json "$OUT/old_$3.json" > "$OUT/old_$3.txt" 2>&1; echo "old rc=$?")
  else
    (cd "$root" && timeout 280 python3 bench/bench_models.py --no-cpu --no-compile --models "$models" --repeat 50 \
       --json "$OUT/new_$3.json" > "$OUT/new_$3.txt" 2>&1; echo "new rc=$?")
  fi
done
for f in "$OUT"/*_"$3".txt; do echo "== $f"; grep -E "^\|" "$f" | head -8; done
