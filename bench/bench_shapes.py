"""Memory and build time over many input shapes: a plan per shape, the weights shared, the plan cache bounded.

    python bench/bench_shapes.py [--models lm,resnet18_b1] [--shapes 60] [--backends cpu,wgpu] [--cache-mb 1024]
        [--run] [--json out.json] [--md out.md]

`bert-hf` is a transformers BertModel (4 layers, width 768) fed a new sequence length per shape; `bert-small` the
test suite's small BertModel (2 layers, width 64) with 1100 positions, fed lengths 2 ... shapes + 1 in a shuffled
order (the issue's "1000 distinct sequence lengths": `--models bert-small --shapes 1000 --run`); `lm` is a
GPT-2-like net built here (84 MB of weights: an 8192 x 768 embedding, a 1024 x 768 position table sliced
to the length, two 768/3072 MLP blocks, a tied head) fed ids (1, S) for S = 8, 16, ...; `resnet18_b1` is
bench_models' ResNet-18 fed batches 1, 2, ... Each shape builds a plan (`Model.plan_info`, or a run with --run);
the table gives the RSS and backend bytes the shapes added after the first and after the first tenth (the
allocator's high-water mark is set by then), the build time and (wgpu) new pipelines per shape,
Model.cache_info() at the end, and what `close()` leaves on the backend.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from tests.models.memory import rss_mb  # noqa: E402

import ember  # noqa: E402


def lm_model() -> Any:
    rng = np.random.default_rng(0)
    vocab, width, hidden, context = 8192, 768, 3072, 1024

    def weight(name: str, *shape: int) -> Any:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name)

    inits = [weight("wte", vocab, width), weight("wpe", context, width), weight("w1", width, hidden),
             weight("w2", hidden, width), weight("w3", width, hidden), weight("w4", hidden, width),
             numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64),
                                                                                              "one")]
    nodes = [helper.make_node("Shape", ["ids"], ["ids_shape"]),
             helper.make_node("Gather", ["ids_shape", "one"], ["length"], axis=0),
             helper.make_node("Slice", ["wpe", "zero", "length"], ["positions"]),
             helper.make_node("Gather", ["wte", "ids"], ["tokens"]),
             helper.make_node("Add", ["tokens", "positions"], ["h0"])]
    h = "h0"
    for i, (up, down) in enumerate((("w1", "w2"), ("w3", "w4"))):
        nodes += [helper.make_node("MatMul", [h, up], [f"u{i}"]), helper.make_node("Gelu", [f"u{i}"], [f"g{i}"]),
                  helper.make_node("MatMul", [f"g{i}", down], [f"d{i}"]),
                  helper.make_node("Add", [h, f"d{i}"], [f"h{i + 1}"])]
        h = f"h{i + 1}"
    nodes += [helper.make_node("Transpose", ["wte"], ["head"], perm=[1, 0]),
              helper.make_node("MatMul", [h, "head"], ["logits"])]
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "length"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def workload(name: str, shapes: int) -> tuple[Any, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    if name == "lm":
        return lm_model(), [{"ids": rng.integers(0, 8192, (1, 8 * (i + 1))).astype(np.int64)} for i in range(shapes)]
    if name == "bert-hf":  # a transformers BertModel, 4 layers of BERT-base width, a new sequence length per shape
        from tests.models import encoders

        cfg = encoders.Encoder(layers=4, hidden=768, heads=12, ff=3072, vocab=30522)
        return str(encoders.export(cfg)), [cfg.feeds(1, 8 + 5 * i, seed=i) for i in range(shapes)]
    if name == "bert-small":
        from tests.models import encoders

        cfg = encoders.Encoder(positions=max(512, shapes + 2))
        lengths = rng.permutation(np.arange(2, shapes + 2))
        return str(encoders.export(cfg)), [cfg.feeds(1, int(n), seed=i) for i, n in enumerate(lengths)]
    import graphs

    source, feeds, _ = graphs.resolve(name)
    key, value = next(iter(feeds.items()))
    return source, [{key: rng.random((b, *value.shape[1:]), dtype=np.float32)} for b in range(1, shapes + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lm")
    ap.add_argument("--shapes", type=int, default=60)
    ap.add_argument("--cache-mb", type=float, help="load_onnx(plan_cache_bytes=...) in MiB (default: ember's)")
    ap.add_argument("--run", action="store_true", help="run each shape instead of only planning it")
    harness.add_common(ap)
    args = ap.parse_args()
    report = harness.Report("Memory over input shapes (MB after the first shape; cache_info at the end)", args)
    opts = {} if args.cache_mb is None else {"plan_cache_bytes": int(args.cache_mb * (1 << 20))}
    for name in args.models.split(","):
        for backend in harness.backend_list(args.backends, ember.available_backends()):
            source, feeds = workload(name, args.shapes)
            be = ember.backend(backend)
            gc.collect()
            model = ember.load_onnx(source, backend=be, **opts)
            builds, first, tenth = [], None, None
            pipes = [getattr(be, "pipelines_created", 0)]
            for i, fd in enumerate(feeds):
                t = time.perf_counter()
                model.run(fd) if args.run else model.plan_info(fd)
                builds.append((time.perf_counter() - t) * 1e3)
                gc.collect()
                if first is None:
                    first = (rss_mb(), be.memory_info()["bytes"])
                    pipes.append(getattr(be, "pipelines_created", 0))
                if i == len(feeds) // 10:
                    tenth = (rss_mb(), be.memory_info()["bytes"])
            assert first is not None and tenth is not None
            info = model.cache_info() if hasattr(model, "cache_info") else {}
            cells = {"shapes": len(feeds), "RSS +MB": rss_mb() - first[0],
                     "backend +MB": (be.memory_info()["bytes"] - first[1]) / 2**20,
                     "RSS +MB after 1/10": rss_mb() - tenth[0], "RSS at 1/10 MB": tenth[0],
                     "backend +MB after 1/10": (be.memory_info()["bytes"] - tenth[1]) / 2**20,
                     "build ms (median)": float(np.median(builds[1:] or builds)),
                     # wgpu: pipelines built per shape after the first (0 would be a shape-polymorphic plan)
                     "new pipelines/shape": (getattr(be, "pipelines_created", 0) - pipes[-1]) / max(len(feeds) - 1, 1),
                     **{k: (v / 2**20 if k.endswith("bytes") else v) for k, v in info.items()}}
            model.close()
            gc.collect()
            cells["left after close"] = be.memory_info()["allocations"]
            report.add(f"{name} · {backend}", cells)
    report.finish()


if __name__ == "__main__":
    main()
