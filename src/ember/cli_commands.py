"""The command line's model commands: `ember info`, `ember check` and `ember run` (ember/cli.py parses)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import available_backends
from .cli_util import (
    MISMATCH,
    OK,
    REJECTED,
    RUNTIME,
    USAGE,
    CliError,
    Comparison,
    FeedOptions,
    Reference,
    check_model_path,
    compare,
    describe_error,
    describe_feeds,
    feed_options,
    format_shape,
    make_feeds,
    median_ms,
    one_line,
    pick_backends,
)
from .model import load_onnx


def error_line(message: str) -> None:
    print(f"ember: error: {message}", file=sys.stderr, flush=True)


# ---- ember info ----------------------------------------------------------------------------------------------


def _dtype_name(elem_type: int) -> str:
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"


def _value_info(vi: Any) -> dict[str, Any]:
    """name, dtype and shape (None: not declared; a dim: int, its symbolic name, or None where unnamed)."""
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        return {"name": vi.name, "dtype": kind or "undefined", "shape": None}
    t = vi.type.tensor_type
    shape: list[int | str | None] | None = None
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return {"name": vi.name, "dtype": _dtype_name(t.elem_type), "shape": shape}


def _count_ops(graph: Any, ops: Counter[str], nested: list[int], depth: int = 0) -> None:
    import onnx

    for node in graph.node:
        ops[f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type] += 1
        if depth:
            nested[0] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _count_ops(attr.g, ops, nested, depth + 1)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _count_ops(g, ops, nested, depth + 1)


def _tensor_bytes(t: Any) -> int:
    import onnx

    size = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    name = onnx.TensorProto.DataType.Name(t.data_type)
    if "4" in name and name not in ("FLOAT", "INT64", "UINT64"):  # INT4, UINT4, FLOAT4E2M1: two a byte
        return (size + 1) // 2
    try:
        return size * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:
        return 0


def model_summary(path: str, backends: Sequence[str]) -> dict[str, Any]:
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise CliError(REJECTED, f"model rejected: {path} is not an ONNX model ({one_line(str(e))})") from None
    g = proto.graph
    init_names = {t.name for t in g.initializer}
    ops: Counter[str] = Counter()
    nested = [0]
    _count_ops(g, ops, nested)
    inits = list(g.initializer) + [s.values for s in g.sparse_initializer]
    params = sum(int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1 for t in inits)
    info: dict[str, Any] = {
        "model": path,
        "ir_version": proto.ir_version,
        "producer": " ".join(p for p in (proto.producer_name, proto.producer_version) if p),
        "opsets": {(o.domain or "ai.onnx"): o.version for o in proto.opset_import},
        "inputs": [_value_info(vi) for vi in g.input if vi.name not in init_names],
        "outputs": [_value_info(vi) for vi in g.output],
        "nodes": sum(ops.values()),
        "nodes_in_subgraphs": nested[0],
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "initializers": {"count": len(inits), "parameters": params, "bytes": sum(_tensor_bytes(t) for t in inits)},
        "backends": {},
    }
    for name in backends:
        t = time.perf_counter()
        try:
            model = load_onnx(path, backend=name)
        except Exception as e:
            err = describe_error(e, at_load=True)
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            info["backends"][name] = {"ok": False, "exit_code": err.code, "error": str(err), "details": lines}
            continue
        info["backends"][name] = {"ok": True, "load_s": round(time.perf_counter() - t, 3)}
        model.close()
    return info


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def print_summary(info: dict[str, Any]) -> None:
    print(f"model: {info['model']}")
    producer = f", producer {info['producer']}" if info["producer"] else ""
    opsets = ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
    print(f"  IR version {info['ir_version']}{producer}; opsets: {opsets}")
    for title in ("inputs", "outputs"):
        print(f"{title}:")
        width = max((len(v["name"]) for v in info[title]), default=0)
        for v in info[title]:
            print(f"  {v['name']:{width}}  {v['dtype']:8} {format_shape(v['shape'])}")
    nested = f", {info['nodes_in_subgraphs']} in subgraphs" if info["nodes_in_subgraphs"] else ""
    print(f"ops: {info['nodes']} nodes{nested}, {len(info['ops'])} op types")
    width = max((len(k) for k in info["ops"]), default=0)
    for op, n in info["ops"].items():
        print(f"  {op:{width}}  {n:6}")
    i = info["initializers"]
    exact = f" ({i['bytes']:,} bytes)" if i["bytes"] >= 1024 else ""
    print(f"initializers: {i['count']} tensors, {i['parameters']:,} parameters, {_fmt_bytes(i['bytes'])}{exact}")
    print("backends:")
    for name, b in info["backends"].items():
        if b["ok"]:
            print(f"  {name:5} ok (load {b['load_s']:.2f} s)")
            continue
        head = b["error"].split(":", 1)[0]
        print(f"  {name:5} {head} (exit code {b['exit_code']}):")
        for line in b["details"]:
            print(f"        {line}")


def info(args: Any) -> int:
    check_model_path(args.model)
    backends = [] if args.backend == "none" else pick_backends(args.backend, available_backends())
    summary = model_summary(args.model, backends)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return OK


# ---- ember check / ember run ---------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """What `check` and `run` do: load per backend, run on the same feeds, compare with ONNX Runtime."""

    path: str
    backends: list[str]
    feeds: FeedOptions
    repeat: int = 0  # 0: time the one run; else the median of this many after a warm-up
    reference: bool = True  # compare with ONNX Runtime where it is installed and loads the model
    require_reference: bool = False  # no reference: exit with RUNTIME (ember check)
    rtol: float = 1e-3
    atol: float = 1e-4
    output: str | None = None  # .npz of the first backend's outputs
    _headed: bool = False

    def execute(self) -> int:
        print(f"model: {self.path}", flush=True)
        code = OK
        feeds: dict[str, np.ndarray] | None = None
        ref: dict[str, np.ndarray] | None = None
        ref_note: str | None = None
        saved = False
        for name in self.backends:
            t = time.perf_counter()
            try:
                model = load_onnx(self.path, backend=name)
            except Exception as e:
                code = max(code, self._failed(name, describe_error(e, at_load=True)))
                continue
            load_s = time.perf_counter() - t
            if feeds is None:
                feeds = self.make_feeds(model)
            self._header()
            if name == "wgpu":
                print(f"  wgpu adapter: {model.compute_backend.adapter_name}", flush=True)
            try:
                t = time.perf_counter()
                out = {k: np.asarray(v) for k, v in model.run(feeds).items()}
                ms = (time.perf_counter() - t) * 1e3
                if self.repeat:
                    ms = median_ms(lambda m=model, f=feeds: m.run(f), self.repeat)
            except Exception as e:
                code = max(code, self._failed(name, describe_error(e, at_load=False), load_s))
                continue
            if self.output and not saved:
                np.savez(self.output, **out)
                saved = True
                print(f"  (wrote {name}'s outputs to {self.output}: {', '.join(out)})", flush=True)
            if ref is None and ref_note is None:
                ref, ref_note = self._reference(feeds)
            if ref is None:
                print(f"{name:20} {load_s:7.2f} {ms:10.2f}  no reference ({ref_note})", flush=True)
                if self.require_reference:
                    error_line(f"cannot check against onnxruntime: {ref_note}")
                    code = max(code, RUNTIME)
                continue
            c = compare(out, ref, self.rtol, self.atol)
            print(f"{name:20} {load_s:7.2f} {ms:10.2f}  {self._note(c)}", flush=True)
            if not c.ok:
                for problem in c.problems:
                    print(f"    {problem}", flush=True)
                error_line(f"{name}: outputs differ from onnxruntime's (rtol={self.rtol:g}, atol={self.atol:g}): "
                           f"{c.problems[0]}" + (f" (and {len(c.problems) - 1} more)" if len(c.problems) > 1
                                                 else ""))
                code = max(code, MISMATCH)
        return code

    def _header(self) -> None:
        if not self._headed:
            self._headed = True
            print(f"{'engine':20} {'load s':>7} {'run ms' if self.repeat else '1st run ms':>10}  check", flush=True)

    def make_feeds(self, model: Any) -> dict[str, np.ndarray]:
        feeds = make_feeds(model.inputs, self.feeds)
        print(f"  inputs: {describe_feeds(feeds) or 'none'}", flush=True)
        return feeds

    def _reference(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """ONNX Runtime's outputs, made after ember's load and run so that ember's own errors come first."""
        if not self.reference:
            return None, "--no-compare"
        ort = Reference(self.path)
        if ort.error is not None:
            return None, ort.error
        try:
            ref = ort.run(feeds)
            ms = median_ms(lambda: ort.run(feeds), self.repeat) if self.repeat else float("nan")
        except Exception as e:
            return None, f"onnxruntime failed to run the model: {one_line(str(e))}"
        timing = f"{ms:10.2f}" if self.repeat else f"{'-':>10}"
        print(f"{'onnxruntime (cpu)':20} {'-':>7} {timing}  reference", flush=True)
        return ref, None

    def _note(self, c: Comparison) -> str:
        status = "ok" if c.ok else "MISMATCH"
        top1 = "" if c.top1_same else ", top-1 DIFFERENT"
        return f"{status}: {c.summary()}{top1}"

    def _failed(self, name: str, err: CliError, load_s: float | None = None) -> int:
        load = "-" if load_s is None else f"{load_s:.2f}"
        kind = str(err).split(":", 1)[0]
        self._header()
        print(f"{name:20} {load:>7} {'-':>10}  FAILED: {kind} (exit code {err.code})", flush=True)
        error_line(f"{name}: {err}")
        return err.code


def _evaluation(args: Any, **kw: Any) -> Evaluation:
    check_model_path(args.model)
    if args.rtol < 0 or args.atol < 0:
        raise CliError(USAGE, "--rtol and --atol must be >= 0")
    backends = pick_backends(args.backend, available_backends())
    return Evaluation(args.model, backends, feed_options(args), rtol=args.rtol, atol=args.atol, **kw)


def check(args: Any) -> int:
    return _evaluation(args, require_reference=True).execute()


def run(args: Any) -> int:
    if args.repeat < 0:
        raise CliError(USAGE, f"--repeat {args.repeat}: expected a whole number >= 0")
    return _evaluation(args, repeat=args.repeat, reference=not args.no_compare, output=args.output).execute()
