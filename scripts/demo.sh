#!/usr/bin/env bash
# Runs the demo on every available backend, next to ONNX Runtime.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test
# Real models with random weights (the copies bundled in the onnx package have constant weights, which make
# every output the same): SqueezeNet with randomised weights and a ResNet-18 exported from torch.
models=$(.venv/bin/python - <<'PY'
from tests.models import zoo
print(zoo.light_randomized("squeezenet"))
print(zoo.all_models()["resnet18_opset17"].path())
PY
)
args=()
for m in $models; do args+=(--model "$m"); done
.venv/bin/python -m ember.cli demo "${args[@]}" "$@"
