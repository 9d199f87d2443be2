"""The command line's timing commands: `ember bench` (model.run timed per backend next to ONNX Runtime) and
`ember profile` (per-node times, a Chrome trace, an HTML bar chart). ember/cli.py parses their arguments."""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import available_backends
from .cli_commands import error_line
from .cli_util import (
    MISMATCH,
    OK,
    USAGE,
    CliError,
    Reference,
    check_model_path,
    compare,
    describe_error,
    describe_feeds,
    feed_options,
    make_feeds,
    one_line,
    pick_backends,
)
from .core import progress
from .model import load_onnx

# ---- output --------------------------------------------------------------------------------------------------


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> None:
    """A table on stdout under its title: rich's where it is installed, else aligned text. `align` has one letter
    per column, l (left) or r (right)."""
    print(title, flush=True)
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(str(c).ljust(w) if a == "l" else str(c).rjust(w)
                             for c, w, a in zip(cells, widths, align, strict=True)).rstrip()

        for cells in (headers, *rows):
            print(line(cells))
        sys.stdout.flush()
        return
    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal:  # a pipe or a file: no wrapping of long node names at 80 columns
        console = Console(file=sys.stdout, highlight=False, width=max(console.width, 200))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for h, a in zip(headers, align, strict=True):
        table.add_column(h, justify="left" if a == "l" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console.print(table)
    sys.stdout.flush()


def _check_writable(option: str, path: str | None) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(USAGE, f"{option} {path}: no such folder {folder}")
    if os.path.isdir(path):
        raise CliError(USAGE, f"{option} {path}: is a folder")


def _write_json(path: str, data: Any) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _load(path: str, name: str) -> tuple[Any, float]:
    t = time.perf_counter()
    try:
        model = load_onnx(path, backend=name)
    except Exception as e:
        raise describe_error(e, at_load=True) from e
    return model, time.perf_counter() - t


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


# ---- ember bench ---------------------------------------------------------------------------------------------


def sample_ms(fn: Callable[[], object], runs: int, warmup: int, label: str) -> list[float]:
    """Milliseconds of each of `runs` calls of fn after `warmup` untimed ones."""
    times = []
    with progress.task(label, total=warmup + runs) as bar:
        for _ in range(warmup):
            fn()
            bar.advance()
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            bar.advance()
    return times


def summary(times: Sequence[float]) -> dict[str, Any]:
    p10, median, p90 = (float(v) for v in np.percentile(times, [10, 50, 90]))
    return {"median_ms": median, "p10_ms": p10, "p90_ms": p90, "min_ms": float(min(times)),
            "times_ms": [float(t) for t in times]}


def _bench_backend(args: Any, name: str, feeds: dict[str, np.ndarray] | None,
                   opts: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(result row, feeds, outputs) of one backend; CliError where it fails."""
    model, load_s = _load(args.model, name)
    try:
        if feeds is None:
            feeds = make_feeds(model.inputs, opts)
            print(f"  inputs: {describe_feeds(feeds) or 'none'}", flush=True)
        if name == "wgpu":
            print(f"  wgpu adapter: {model.compute_backend.adapter_name}", flush=True)
        try:
            t = time.perf_counter()
            out = {k: np.asarray(v) for k, v in model.run(feeds).items()}  # builds and compiles the plan
            first_ms = (time.perf_counter() - t) * 1e3
            times = sample_ms(lambda: model.run(feeds), args.runs, args.warmup, f"timing {name}")
            # Device time without the host's work, where the backend measures it (wgpu: timestamp queries).
            gpu_ms = float(model.gpu_time(feeds)) if name == "wgpu" else None
        except CliError:
            raise
        except Exception as e:
            raise describe_error(e, at_load=False) from e
    finally:
        model.close()
    row = {"engine": name, "ok": True, "load_s": load_s, "first_run_ms": first_ms, **summary(times),
           "gpu_ms": gpu_ms, "vs_ort": None, "check": None}
    return row, feeds, out


def _bench_reference(args: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    row: dict[str, Any] = {"engine": "onnxruntime", "ok": False}
    ort = Reference(args.model)
    if ort.error is not None:
        return {**row, "error": ort.error}, None
    try:
        t = time.perf_counter()
        ref = ort.run(feeds)
        first_ms = (time.perf_counter() - t) * 1e3
        times = sample_ms(lambda: ort.run(feeds), args.runs, args.warmup, "timing onnxruntime")
    except Exception as e:
        return {**row, "error": f"onnxruntime failed to run the model: {one_line(str(e))}"}, None
    return {**row, "ok": True, "first_run_ms": first_ms, **summary(times)}, ref


def bench(args: Any) -> int:
    check_model_path(args.model)
    if args.runs < 1:
        raise CliError(USAGE, f"--runs {args.runs}: expected a whole number >= 1")
    if args.warmup < 0:
        raise CliError(USAGE, f"--warmup {args.warmup}: expected a whole number >= 0")
    if args.rtol < 0 or args.atol < 0:
        raise CliError(USAGE, "--rtol and --atol must be >= 0")
    _check_writable("--json", args.json)
    backends = pick_backends(args.backend, available_backends())
    opts = feed_options(args)
    print(f"model: {args.model}", flush=True)
    code = OK
    rows: list[dict[str, Any]] = []
    outputs: dict[str, dict[str, np.ndarray]] = {}
    feeds: dict[str, np.ndarray] | None = None
    for name in backends:
        try:
            row, feeds, outputs[name] = _bench_backend(args, name, feeds, opts)
        except CliError as err:
            if err.code == USAGE:  # bad feeds: the same on every backend
                raise
            error_line(f"{name}: {err}")
            rows.append({"engine": name, "ok": False, "error": str(err), "exit_code": err.code})
            code = max(code, err.code)
            continue
        rows.append(row)
    ref_row = None
    if not args.no_ort and feeds is not None:
        ref_row, ref = _bench_reference(args, feeds)
        rows.append(ref_row)
        if ref is None:
            print(f"  no reference: {ref_row['error']}", flush=True)
        for row in rows:
            if row is ref_row or not row["ok"] or ref is None:
                continue
            c = compare(outputs[row["engine"]], ref, args.rtol, args.atol)
            row["vs_ort"] = row["median_ms"] / ref_row["median_ms"] if ref_row["median_ms"] > 0 else None
            row["check"] = "ok" if c.ok else "mismatch"
            row["max_rel_err"] = c.max_rel
            if not c.ok:
                error_line(f"{row['engine']}: outputs differ from onnxruntime's (rtol={args.rtol:g}, "
                           f"atol={args.atol:g}): {c.problems[0]}")
                code = max(code, MISMATCH)
    _print_bench(rows, args.runs, args.warmup)
    if args.json:
        _write_json(args.json, {
            "model": args.model, "runs": args.runs, "warmup": args.warmup,
            "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in (feeds or {}).items()},
            "results": rows, "exit_code": code})
        print(f"(wrote {args.json})", flush=True)
    return code


def _print_bench(rows: list[dict[str, Any]], runs: int, warmup: int) -> None:
    table: list[list[str]] = []
    for r in rows:
        engine = "onnxruntime (cpu)" if r["engine"] == "onnxruntime" else r["engine"]
        if not r["ok"]:
            table.append([engine, "-", "-", "-", "-", "-", "-", "-", "FAILED: " + r["error"].split(":", 1)[0]])
            continue
        ratio = "1.00x" if r["engine"] == "onnxruntime" else ("-" if r.get("vs_ort") is None else
                                                              f"{r['vs_ort']:.2f}x")
        check = "reference" if r["engine"] == "onnxruntime" else (r.get("check") or "-")
        table.append([engine, _fmt(r.get("load_s"), 2), _fmt(r["first_run_ms"], 2), _fmt(r["median_ms"]),
                      _fmt(r["p10_ms"]), _fmt(r["p90_ms"]), ratio, _fmt(r.get("gpu_ms")), check])
    ratio = "; vs ort: the median over onnxruntime's" if any(r["engine"] == "onnxruntime" for r in rows) else ""
    print_table(f"model.run, {runs} timed runs after {warmup} warm-up (ms{ratio})",
                ["engine", "load s", "1st run", "median", "p10", "p90", "vs ort", "gpu ms", "check"], table,
                "lrrrrrrrl")


# ---- ember profile -------------------------------------------------------------------------------------------


def by_node(steps: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
    """Steps grouped by the node that produced them (their label), slowest node first."""
    nodes: dict[str, dict[str, Any]] = {}
    for label, ms in steps:
        n = nodes.setdefault(label, {"node": label, "ms": 0.0, "steps": 0})
        n["ms"] += float(ms)
        n["steps"] += 1
    return sorted(nodes.values(), key=lambda n: -n["ms"])


def graph_order(model: Any, steps: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Steps in the order of the graph's nodes (model.profile gives them slowest first); steps whose label names
    no node (output conversions) last, each node's steps in the order profile gave them."""
    rank = {f"{node.name} ({node.op_type})": i for i, node in enumerate(model.graph.nodes)}
    return sorted(steps, key=lambda s: rank.get(s[0], len(rank)))


def trace_events(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Chrome's trace format (chrome://tracing, Perfetto): one complete event ("ph": "X") per step, in
    microseconds, laid end to end in graph order; one process per backend."""
    events: list[dict[str, Any]] = []
    for pid, (name, r) in enumerate(results.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"ember {name}"}})
        ts = 0.0
        for i, (label, ms) in enumerate(r["ordered"]):
            dur = float(ms) * 1e3
            events.append({"name": label, "cat": name, "ph": "X", "ts": round(ts, 3), "dur": round(dur, 3),
                           "pid": pid, "tid": 0, "args": {"step": i, "ms": float(ms)}})
            ts += dur
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def bar_chart_svg(nodes: Sequence[dict[str, Any]], bar_px: int = 480, row_px: int = 22) -> str:
    """A horizontal bar chart of node times as inline SVG."""
    label_px = min(600, 12 + 8 * max((len(n["node"]) for n in nodes), default=4))
    top = max((n["ms"] for n in nodes), default=0.0) or 1.0
    width, height = label_px + bar_px + 110, row_px * len(nodes) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">']
    for i, n in enumerate(nodes):
        y = 5 + i * row_px
        w = max(1.0, bar_px * n["ms"] / top)
        name, fit = html.escape(n["node"]), (label_px - 12) // 8  # characters (at most 8 px wide) left of the bars
        shown = html.escape(n["node"] if len(n["node"]) <= fit else n["node"][:fit - 1] + "\u2026")
        parts.append(f'<g><title>{name}: {n["ms"]:.4f} ms, {n["steps"]} step(s)</title>'
                     f'<text x="{label_px - 6}" y="{y + row_px / 2 + 4:.1f}" text-anchor="end">{shown}</text>'
                     f'<rect x="{label_px}" y="{y + 3}" width="{w:.1f}" height="{row_px - 6}" fill="#d9541e"/>'
                     f'<text x="{label_px + w + 6:.1f}" y="{y + row_px / 2 + 4:.1f}">{n["ms"]:.3f} ms</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def profile_html(model_path: str, results: dict[str, dict[str, Any]], top: int) -> str:
    sections = []
    for name, r in results.items():
        shown = r["nodes"][:top] if top else r["nodes"]
        sections.append(f"<h2>{html.escape(name)}: {r['total_ms']:.3f} ms over {len(r['steps'])} steps, "
                        f"{len(r['nodes'])} nodes (the {len(shown)} slowest shown)</h2>\n{bar_chart_svg(shown)}")
    title = html.escape(f"ember profile: {os.path.basename(model_path)}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>\n'
            "<style>body{font-family:sans-serif;margin:2em}h2{font-size:1.05em}</style></head>\n"
            f"<body><h1>{title}</h1>\n<p>{html.escape(model_path)}</p>\n" + "\n".join(sections) + "\n</body></html>\n")


def profile(args: Any) -> int:
    check_model_path(args.model)
    if args.top < 0:
        raise CliError(USAGE, f"--top {args.top}: expected a whole number >= 0 (0: every node)")
    _check_writable("--trace", args.trace)
    _check_writable("--html", args.html)
    backends = pick_backends(args.backend, available_backends())
    opts = feed_options(args)
    print(f"model: {args.model}", flush=True)
    code = OK
    results: dict[str, dict[str, Any]] = {}
    feeds: dict[str, np.ndarray] | None = None
    for name in backends:
        try:
            model, _ = _load(args.model, name)
        except CliError as err:
            error_line(f"{name}: {err}")
            code = max(code, err.code)
            continue
        try:
            if feeds is None:
                feeds = make_feeds(model.inputs, opts)
                print(f"  inputs: {describe_feeds(feeds) or 'none'}", flush=True)
            with progress.task(f"profiling on {name}"):
                steps = [(label, float(ms)) for label, ms in model.profile(feeds)]
            ordered = graph_order(model, steps)
        except CliError:
            raise
        except Exception as e:
            err = describe_error(e, at_load=False)
            error_line(f"{name}: {err}")
            code = max(code, err.code)
            continue
        finally:
            model.close()
        nodes = by_node(steps)
        total = sum(ms for _, ms in steps)
        results[name] = {"steps": steps, "ordered": ordered, "nodes": nodes, "total_ms": total}
        shown = nodes[:args.top] if args.top else nodes
        timing = "GPU timestamps" if name == "wgpu" else "host clock, step by step"
        rows = [[str(i), n["node"], str(n["steps"]), f"{n['ms']:.4f}",
                 f"{100 * n['ms'] / total:.1f}" if total > 0 else "-"] for i, n in enumerate(shown, start=1)]
        if len(results) > 1:
            print()
        print_table(f"{name}: {total:.3f} ms in all ({len(steps)} steps, {len(nodes)} nodes; {timing}), slowest "
                    f"node first", ["#", "node", "steps", "ms", "%"], rows, "rlrrr")
    if args.trace and results:
        _write_json(args.trace, trace_events(results))
        print(f"(wrote the Chrome trace {args.trace}: open it in chrome://tracing or ui.perfetto.dev)", flush=True)
    if args.html and results:
        with open(args.html, "w") as f:
            f.write(profile_html(args.model, results, args.top))
        print(f"(wrote {args.html})", flush=True)
    return code
