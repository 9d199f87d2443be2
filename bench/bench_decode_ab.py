"""KV-cache decode steps of two ember checkouts and ONNX Runtime CPU, interleaved in one process.

    python bench/bench_decode_ab.py [--models gpt2-tiny] [--against OTHER/src] [--backend cpu] [--past 8]
        [--span 64] [--rounds 40] [--block 8] [--replay] [--json out.json] [--md out.md]

Each engine runs bench_decode.py's loop (tests/models/decoders.py's export, greedy, a token a step, the cache fed
back: `keep_on_device=True` for ember) from a random cache of --past positions; after --span steps it starts
again from --past, so every timed step is a new past length served by the live plan (grown to its capacity in
the untimed first span). --replay times the same length every step instead (a cached plan, host feeds: the old
"replay" figure). The engines take turns in rounds of --block steps (the first of each block left out: a switch
costs the next step its caches); per engine the median ms per step over all rounds, and per round each ember's
median over ONNX Runtime's (median [p10, p90] of those ratios): the figure issue 14's target is stated in.
Arm A is this checkout's ember; --against adds arm B, another checkout's src (copied as `ember_b`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_ab  # noqa: E402
import bench_decode  # noqa: E402
import harness  # noqa: E402
from tests.models import decoders  # noqa: E402

import ember  # noqa: E402


def looper(cfg: decoders.Decoder, run: Callable[[dict], dict], host: Callable[[Any], np.ndarray], past: int,
           span: int, replay: bool) -> Callable[[], None]:
    """One decode step per call: feeds for the next length, run, the next token and the cache fed back."""
    names = cfg.output_names()
    start = cfg.past(1, past)
    state: dict[str, Any] = {"step": 0, "cache": dict(start), "token": 1}

    def step() -> None:
        length = past + 1 + (0 if replay else state["step"])
        feeds = {"input_ids": np.array([[state["token"]]], np.int64),
                 "attention_mask": np.ones((1, length), np.int64)}
        out = run({**feeds, **state["cache"]})
        state["token"] = int(host(out["logits"])[0, -1].argmax())
        if replay:
            return
        state["cache"] = {f"past{n[len('present'):]}": out[n] for n in names[1:]}
        state["step"] += 1
        if state["step"] >= span:
            state["step"], state["cache"] = 0, dict(start)

    return step


def ort_arm(path: str, cfg: decoders.Decoder, args: argparse.Namespace) -> Callable:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = cfg.output_names()
    return looper(cfg, lambda feeds: dict(zip(names, sess.run(names, feeds), strict=True)), lambda x: x, args.past,
                  args.span, args.replay)


def ember_arm(pkg: Any, path: str, backend: str, cfg: decoders.Decoder, args: argparse.Namespace) -> Callable:
    model = pkg.load_onnx(path, backend=pkg.backend(backend))
    resident = not args.replay
    return looper(cfg, lambda feeds: model.run(feeds, keep_on_device=resident),
                  lambda x: x if isinstance(x, np.ndarray) else x.numpy(), args.past, args.span, args.replay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-tiny", help=f"of {sorted(bench_decode.MODELS)}")
    ap.add_argument("--against", type=Path, help="arm B: this other checkout's src (its ember package)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--past", type=int, default=8, help="cache positions the loop starts from")
    ap.add_argument("--span", type=int, default=64, help="steps before the loop starts again from --past")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=8, help="steps of each engine per round (the first left out)")
    ap.add_argument("--replay", action="store_true", help="the same length every step (a cached plan)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ember_decode_ab_"))
    try:
        pkg_b = bench_ab.import_checkout(args.against, tmp) if args.against else None
        report = harness.Report("KV-cache decode steps, interleaved: ms per step; ember / ONNX Runtime per round",
                                args, meta={"against": str(args.against)})
        for name in args.models.split(","):
            cfg = bench_decode.MODELS[name]
            path = str(decoders.export(cfg, "torchscript"))
            fns = {"ORT": ort_arm(path, cfg, args), "A": ember_arm(ember, path, args.backend, cfg, args)}
            if pkg_b is not None:
                fns["B"] = ember_arm(pkg_b, path, args.backend, cfg, args)
            t0 = time.perf_counter()
            for fn in fns.values():  # a whole span each: the live plans grown to their capacity
                for _ in range(args.span + 4):
                    fn()
            res = harness.interleave(fns, args.rounds, block=args.block, drop=1, warmup=0)
            cells: dict[str, Any] = {f"{k} ms": s for k, s in res.stats.items()}
            cells.update({f"{k} / ORT": r for k, r in res.ratios.items()})
            if pkg_b is not None:
                cells["A / B"] = res.stats["A"].median / res.stats["B"].median
            report.add(f"{name} · {args.backend}" + (" · replay" if args.replay else ""), cells,
                       rounds=res.rounds, seconds=time.perf_counter() - t0)
        report.note("ms: median per step over every round; X / ORT: per-round ratio of medians, median [p10, p90].")
        report.finish()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
