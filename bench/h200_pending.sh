#!/usr/bin/env bash
# The GPU-machine runs still owed to issues 14 and 16 (BENCHMARKS.md, session 14), in one call of at most 600 s.
# Prepare once: `../shared/tools/gpu-prep --peers` (ONNX Runtime's WebGPU build), the ONNX Runtime GenAI wheel in
# .gpu/og (`pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_28_x86_64 onnxruntime-genai==0.18.0 -d .gpu/og`), and an old tree for the A/B
# (`git archive REV src | tar -x -C .gpu/base`); keep .gpu under the 64 MiB carry. Then run with carry [".gpu"]:
#   source .gpu/env.sh && bash bench/h200_pending.sh
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
pip install -q --no-deps --no-index --target /tmp/og .gpu/og/*.whl 2>/dev/null
export PYTHONPATH=$PYTHONPATH:/tmp/og
date -u
# The GEMV against the tiled GEMM, per kernel, interleaved in one process (decode-shaped products).
timeout 90 python3 bench/bench_ab.py --set gemv=0 --models matmul:1x2048x8192,matmul:1x8192x2048,matmul:1x768x2304 \
  --backends wgpu --gpu-time --pairs 10 --md "$out/gemv_ab.md" > "$out/gemv_ab.log" 2>&1; echo gemv rc=$?
# Fixed shapes must lose nothing: the old tree against this one, interleaved.
if [ -d .gpu/base/src ]; then
  timeout 150 python3 bench/bench_ab.py --against .gpu/base/src --models resnet18_b1,mobilenetv2_b1,bert4x768_s128 \
    --backends wgpu --gpu-time --pairs 10 --md "$out/fixed_ab.md" > "$out/fixed_ab.log" 2>&1; echo fixed rc=$?
fi
# GenAI builder folders: ember against ONNX Runtime's WebGPU provider and ONNX Runtime GenAI (CPU), then prefill.
timeout 240 python3 bench/bench_genai.py --models llama-1b --precisions int4,fp16 --target webgpu --prompt 32 --new 64 \
  --engines ember-wgpu,ort-webgpu,og-cpu --work /tmp/gw --md "$out/genai64.md" > "$out/genai64.log" 2>&1
echo genai rc=$?
timeout 100 python3 bench/bench_genai.py --models llama-1b --precisions fp16,int4 --target webgpu --prompt 512 --new 8 \
  --engines ember-wgpu,ort-webgpu --work /tmp/gw --md "$out/genai512.md" > "$out/genai512.log" 2>&1
echo prefill rc=$?
for f in "$out"/*.md; do echo "== $f"; grep -E "^\|" "$f" | head -12; done
date -u
