"""What fusion buys on real exports: the test matrix's `transformers` architectures (tests/models/architectures.py,
small configs, random weights) as torch.onnx's exporters write them, run by ember with the fused arms (load_onnx's
default) and without (`fuse=False`: the exporter's chains op by op), next to ONNX Runtime CPU.

    python bench/bench_fusion.py [--archs distilbert,qwen2,vit] [--exporters torchscript,dynamo]
        [--batch 2] [--length 64] [--backends wgpu] [--repeat 30] [--json out.json] [--md out.md]

Per row (architecture · exporter · backend): median ms fused and unfused, their ratio, the fused arms counted in
one fused run (`model.stats()`: LayerNorm/RMSNorm/GELU/QuickGELU/attention), how far the fused outputs are from
ONNX Runtime's (max relative error to the largest output), and ONNX Runtime CPU's median ms.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ARMS = ("layernorm", "rmsnorm", "gelu", "quickgelu", "attention")


def fused_counts(stats: dict[str, Any]) -> str:
    hits = [f"{a} {stats[f'{a}.fused']}" for a in ARMS if stats.get(f"{a}.fused")]
    return ", ".join(hits) or "none"


def main() -> None:
    from tests.models import architectures as archs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(archs.ARCHS))
    ap.add_argument("--exporters", default="torchscript,dynamo")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=64, help="text models' sequence length")
    harness.add_common(ap)
    args = ap.parse_args()

    import onnxruntime as ort

    import ember

    report = harness.Report("Fusion on real exports: ember fused vs fuse=False, ONNX Runtime CPU (median ms)", args,
                            lead=["fused ms", "unfused ms", "unfused / fused", "fused arms"])
    backends = harness.backend_list(args.backends, ember.available_backends())
    for name in args.archs.split(","):
        arch = archs.ARCHS[name]
        for exporter in args.exporters.split(","):
            try:
                path = archs.export(arch, exporter)
            except archs.ExportFailed as e:
                report.note(f"{name} · {exporter}: export failed ({str(e).splitlines()[0][:120]})")
                continue
            feeds = arch.feeds(args.batch, args.length)
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            want = sess.run(None, feeds)[0]
            ort_ms = harness.measure(lambda s=sess, f=feeds: s.run(None, f), args.repeat, args.warmup).median
            for backend in backends:
                row = f"{name} · {exporter} · {backend}"
                cells: dict[str, Any] = {"onnxruntime cpu ms": ort_ms}
                for fuse in (True, False):
                    model = ember.load_onnx(str(path), backend=backend, fuse=fuse)
                    got = model.run(feeds)[arch.outputs[0]]
                    arms = fused_counts(model.stats())  # one run's: the counters add up over runs
                    stats = harness.measure(lambda m=model, f=feeds: m.run(f), args.repeat, args.warmup)
                    if fuse:
                        cells["fused ms"] = stats.median
                        cells["fused arms"] = arms
                        cells["max rel err vs ORT"] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                    else:
                        cells["unfused ms"] = stats.median
                    model.close()
                cells["unfused / fused"] = cells["unfused ms"] / cells["fused ms"]
                report.add(row, cells)
                print(f"[bench_fusion] {row}: {cells}", file=sys.stderr, flush=True)
    report.note(f"batch {args.batch}, text length {args.length}; host arrays in and out of every run")
    report.finish()


if __name__ == "__main__":
    main()
