#!/usr/bin/env bash
# Runs the whole test suite on every available backend, installing what it needs first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test,docs
# Every backend the machine has must be tested: fail rather than silently test cpu only.
.venv/bin/python -c 'import ember; b = ember.available_backends(); print("backends:", b); assert "wgpu" in b, "no wgpu adapter"'
.venv/bin/python -m ruff check src tests bench tools docs
# The layering contracts in pyproject.toml: no upward imports, no cycles inside a package.
.venv/bin/lint-imports
# The documentation site, strictly (a broken link or docstring reference fails), built outside the repository.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true .venv/bin/mkdocs build --strict --site-dir "$site_dir"
rm -rf "$site_dir"
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
# The GPU kernels again with checked shader modules: an out-of-bounds access fails here instead of
# corrupting memory in trusted mode.
EMBER_CHECKED_SHADERS=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/backend -k wgpu
# The GPU kernels again on Dawn, the second WebGPU runtime (webgpu="dawn"). Dawn rejects Debian 12's Mesa 22
# lavapipe: scripts/mesa-backports.sh unpacks Mesa 25's beside it for this pass only (the passes above keep the
# system's driver).
dawn_sees_adapter() {
  .venv/bin/python -c 'import sys; from ember.backends.wgpu import device as d, runtime as r
sys.exit(0 if d.adapters_available(r.runtime("dawn")) else 1)' 2>/dev/null
}
if ! dawn_sees_adapter; then
  eval "$(scripts/mesa-backports.sh "${XDG_CACHE_HOME:-$HOME/.cache}/ember/mesa-backports")"
fi
if ! dawn_sees_adapter; then
  echo "Dawn (wgpudawn) sees no Vulkan adapter: install Mesa >= 24's mesa-vulkan-drivers or a GPU driver" >&2
  exit 1
fi
# With the decoders' decode loops: plans from templates run the runtime-sized kernels (Tint checks uniformity).
EMBER_WEBGPU=dawn .venv/bin/python -m pytest -q -p no:cacheprovider tests/backend tests/models/test_decode.py -k wgpu
