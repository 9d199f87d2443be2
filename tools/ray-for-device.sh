#!/usr/bin/env bash
# Ray for the lent GPU machine, which has no Ray and no network (its Python 3.12 has pyarrow, pandas, msgpack,
# click, grpc and aiohttp): a trimmed Ray 2.60 and the few packages it lacks, as .gpu/ray.tar.xz (~30 MB of the
# 64 MiB a run may carry). Run after ../shared/tools/gpu-prep; on the GPU machine:
#   source .gpu/env.sh && mkdir -p /tmp/rayx && tar -xJf .gpu/ray.tar.xz -C /tmp/rayx \
#     && export PYTHONPATH=$PYTHONPATH:/tmp/rayx && python3 bench/bench_ray.py --gpus 1 ...
# Kept: ray/core (raylet, gcs_server), ray/thirdparty_files (the workers import its vendored modules), ray.data,
# ray.train, ray.serve. Dropped: the Java jars, rllib, llm, tests, the dashboard's web client.
# Checked on this VM with Python 3.12.1 and the device's packages: a local Ray Data actor pipeline runs.
set -euo pipefail
py=${PY_VERSION:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip=${PIP:-.venv/bin/pip}
"$pip" download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  "ray==2.60.0" jsonschema referencing rpds-py jsonschema-specifications -d "$work/whl"
# pip install --target keeps the binaries' exec bits (a plain unzip does not).
"$pip" install -q --no-deps --no-compile --no-index --target "$work/site" \
  --python-version "$py" --only-binary=:all: --implementation cp "$work"/whl/*.whl
cd "$work/site"
rm -rf ray/jars ray/rllib ray/llm ray/dashboard/client
find . -type d -name tests -prune -exec rm -rf {} +
strip --strip-unneeded ray/_raylet.so ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet || true
cd - >/dev/null
tar -cJf .gpu/ray.tar.xz -C "$work/site" .
ls -la .gpu/ray.tar.xz
