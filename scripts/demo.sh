#!/usr/bin/env bash
# Runs the demo on every available backend, next to ONNX Runtime. Needs ember and onnxruntime only (the `demo`
# extra): the models are ImageNet nets that come with the onnx package, no torch export.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" demo
# The copies bundled in the onnx package have constant weights, which make every output the same:
# tests/models/zoo.py (numpy, onnx and onnxruntime; torch only for its own torch nets, imported on use)
# writes SqueezeNet and ShuffleNet with fixed-seed random weights into .cache/models/ once (small enough that
# the software GPU, lavapipe, runs them in seconds).
models=$(.venv/bin/python - <<'PY'
from tests.models import zoo
print(zoo.light_randomized("squeezenet"))
print(zoo.light_randomized("shufflenet"))
PY
)
args=()
for m in $models; do args+=(--model "$m"); done
.venv/bin/python -m ember.cli demo "${args[@]}" "$@"
