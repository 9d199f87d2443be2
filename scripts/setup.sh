#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: a virtual environment in .venv with ember installed.
# Usage: source scripts/setup.sh [pip extras, e.g. test]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
# WebGPU needs a Vulkan driver; on a machine without a GPU, Mesa's lavapipe is a software one.
if ! .venv/bin/python -c 'import sys, ember.backends.wgpu.device as d; sys.exit(0 if d.adapters_available() else 1)' 2>/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "no Vulkan adapter found: installing mesa-vulkan-drivers (software Vulkan)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else
    echo "warning: no Vulkan adapter and cannot install mesa-vulkan-drivers; only the cpu backend will run" >&2
  fi
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
