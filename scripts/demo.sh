#!/usr/bin/env bash
# Runs the demo on every available backend, next to ONNX Runtime.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test
.venv/bin/python -m ember.cli demo "$@"
