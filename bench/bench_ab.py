"""A/B of any setting, load option or checkout, on any model, on the cpu and wgpu backends, in ONE process.

    python bench/bench_ab.py --set winograd=0 [--a KEY=VALUE] [--models resnet18_b1,fused] [--backends cpu,wgpu]
        [--pairs 20] [--block 1] [--drop 0] [--warmup 3] [--gpu-time] [--warm-s 0]
        [--against OTHER/src] [--swap] [--ort] [--threads 2] [--max-foreign 0.05] [--json out.json] [--md out.md]

Arm A runs with the defaults (or --a's values), arm B with --set's; a value is a load_onnx option (fuse,
precision, autotune) or an ember.settings key (`python -m ember.settings` lists them), scoped with
settings.override while the arm loads *and* while it runs (knobs read at run time: encode_ahead, wait_spin_us,
wgpu_py_encode, ...); sources without ember.settings get the EMBER_* variables instead. Each arm loads onto a
backend object of its own (its own device, pipeline cache and autotuner). --against puts arm B on another
checkout's ember (copied as `ember_b`, imported beside this one), for before/after comparisons of code; with
--set as well, B is that checkout with those values.

Separate processes each meet a shared machine in a different state (this project's 2-core VM read the same code
at 22-27 ms from one process to the next), so the arms' runs interleave in pairs (harness.ab; which goes first
alternates), and the steadiest figure is the per-pair ratio B / A: its median and p10-p90. --block N runs N of
each per pair and --drop leaves the first of each block out (idle OpenBLAS / ONNX Runtime workers spin after a
run and tax the next). --ort adds a block of ONNX Runtime (CPU) runs per round. --max-foreign re-runs rounds in
which other processes took more than that share of a core (Linux). Models: bench_models.py's names, chainN,
synthetic graphs and presets (graphs.py; `fused` = the five fused-pattern graphs, so `--set fuse=0 --gpu-time
--models fused --backends wgpu` is the fused-against-unfused table).

Not A/B-able in one process: native_gemm and cpu_threads (read once per process) — use --against with the same
checkout (its copy reads them afresh) or two processes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402


def import_checkout(src: Path, tmp: Path) -> ModuleType:
    """Another checkout's `ember` as package `ember_b` (its imports are relative), beside this one."""
    shutil.copytree(src / "ember", tmp / "ember_b", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(tmp))
    import ember_b  # type: ignore[import-not-found]

    return ember_b


def load(arm: harness.Arm, source: Any, feeds: dict, backend: str) -> dict[str, Any]:
    """The arm's model on a backend object of its own, loaded and run once inside the arm's scope."""
    pkg = arm.pkg or ember
    with arm.scope():
        be = pkg.backend(backend)
        t0 = time.perf_counter()
        model = pkg.load_onnx(source, backend=be, **arm.load)
        load_s = time.perf_counter() - t0
        out = model.run(feeds)
    return {"model": model, "load_s": load_s, "out": next(iter(out.values())), "run": lambda: model.run(feeds)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_settings(ap, "--set", "arm B's load options / settings, KEY=VALUE (repeatable or comma-separated)")
    harness.add_settings(ap, "--a", "arm A's, KEY=VALUE (default: the defaults)")
    ap.add_argument("--models", default="resnet18_b1", help="names, chainN, synthetic specs or presets (graphs.py)")
    harness.add_common(ap, repeat=20, warmup=3)
    ap.add_argument("--pairs", type=int, help="pairs (rounds) of runs (default: --repeat)")
    ap.add_argument("--block", type=int, default=1, help="runs of each arm per pair")
    ap.add_argument("--drop", type=int, default=0, help="runs left out at the start of each block")
    ap.add_argument("--against", type=Path, help="arm B runs this other checkout's src (its ember package)")
    ap.add_argument("--swap", action="store_true", help="load B first (load order can favour one by a few %%)")
    ap.add_argument("--gpu-time", action="store_true", help="also each arm's Model.gpu_time (device time per run)")
    ap.add_argument("--warm-s", type=float, default=0.0, help="seconds of both arms' runs before timing (GPU clocks)")
    ap.add_argument("--ort", action="store_true", help="also ONNX Runtime (CPU) runs each round, as a yardstick")
    ap.add_argument("--threads", type=int, default=0, help="ONNX Runtime's intra-op threads (0: its default)")
    ap.add_argument("--max-foreign", type=float, help="re-run rounds where others took more than this of a core")
    args = ap.parse_args()
    backends = harness.backend_list(args.backends, ember.available_backends())
    tmp = Path(tempfile.mkdtemp(prefix="ember_ab_"))
    try:
        pkg_b = import_checkout(args.against, tmp) if args.against else ember
        arm_a = harness.Arm.parse("A", args.a, ember)
        arm_b = harness.Arm.parse("B", args.set, pkg_b)
        where = f" of {args.against}" if args.against else ""
        title = f"A/B: A = {arm_a.describe()}; B = {arm_b.describe()}{where}; ms per run, B / A per pair"
        report = harness.Report(title, args, row_key="model · backend",
                                meta={"a": arm_a.describe(), "b": arm_b.describe(), "against": str(args.against),
                                      "ember": ember.__file__, "ember_b": pkg_b.__file__})
        for name in graphs.expand(args.models):
            source, feeds, _ = graphs.resolve(name)
            for backend in backends:
                run_one(report, f"{name} · {backend}", arm_a, arm_b, source, feeds, backend, args)
        report.note(f"B / A: median of the per-pair ratios [p10, p90]; {args.block} run(s) per arm per pair, "
                    f"the first {args.drop} of each left out.")
        report.finish()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_one(report: harness.Report, row: str, arm_a: harness.Arm, arm_b: harness.Arm, source: Any, feeds: dict,
            backend: str, args: argparse.Namespace) -> None:
    try:
        order = (arm_b, arm_a) if args.swap else (arm_a, arm_b)
        loaded = {arm.label: load(arm, source, feeds, backend) for arm in order}
    except Exception as e:  # an arm this backend or checkout cannot run: report it, go on
        print(f"{row}: load failed: {type(e).__name__}: {e}", flush=True)
        report.add(row, {"A ms": f"failed: {type(e).__name__}: {str(e)[:80]}"})
        return
    a, b = loaded["A"], loaded["B"]
    fns = {"A": arm_a.wrap(a["run"]), "B": arm_b.wrap(b["run"])}
    if args.ort:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if args.threads:
            so.intra_op_num_threads = args.threads
        blob = source.SerializeToString() if hasattr(source, "SerializeToString") else str(source)
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        fns["ORT"] = lambda: sess.run(None, feeds)
    res = harness.interleave(fns, args.pairs or args.repeat, block=args.block, drop=args.drop, warmup=args.warmup,
                             warm_s=args.warm_s, max_foreign=args.max_foreign)
    sa, sb = res.stats["A"], res.stats["B"]
    cells: dict[str, Any] = {"A ms": sa, "B ms": sb, "B / A": res.ratios["B"]}
    if args.ort:
        so_ = res.stats["ORT"]
        cells.update({"ORT ms": so_, "A / ORT": sa.median / so_.median, "B / ORT": sb.median / so_.median})
    if args.gpu_time:
        for key, arm in (("A", arm_a), ("B", arm_b)):
            try:
                with arm.scope():
                    cells[f"GPU {key} ms"] = loaded[key]["model"].gpu_time(feeds)
            except Exception as e:  # no timestamp queries on this adapter
                cells[f"GPU {key} ms"] = f"unavailable: {type(e).__name__}"
    info = {k: loaded[k]["model"].plan_info() for k in ("A", "B")}
    cells["steps A / B"] = f"{info['A'].get('steps')} / {info['B'].get('steps')}"
    cells["load s A / B"] = f"{a['load_s']:.2f} / {b['load_s']:.2f}"
    cells["max rel diff"] = f"{harness.max_rel_err(b['out'], a['out']):.1e}"
    stats = {k: {s: v for s, v in loaded[k]["model"].stats().items() if v} for k in ("A", "B")}
    if stats["A"] != stats["B"]:  # which kernels the arms took differs: say how
        cells["arms differ"] = "; ".join(f"{k}: {stats[k]}" for k in ("A", "B"))
    rounds = f"{res.rounds} pairs" + (f" of {res.tried}" if res.tried != res.rounds else "")
    print(f"{row}: A {harness.fmt(sa)}, B {harness.fmt(sb)}, B / A {harness.fmt(res.ratios['B'])} ({rounds})",
          flush=True)
    report.add(row, cells, plan_info=info, stats=stats, rounds=res.rounds, tried=res.tried,
               timing=res.as_dict())


if __name__ == "__main__":
    raise SystemExit(main())
