"""Command line: `ember demo`, `ember run MODEL`, `ember backends`."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import ember


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (and, on wgpu, pipeline creation)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _ort_session(path: str) -> object | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def run_model(path: str, backends: list[str], repeat: int, batch: int = 1) -> int:
    print(f"model: {path}")
    ref_sess = _ort_session(path)
    rng = np.random.default_rng(0)
    feeds = None
    ref = None
    rows = []
    for name in backends:
        t = time.perf_counter()
        model = ember.load_onnx(path, backend=name)
        load_s = time.perf_counter() - t
        if feeds is None:
            feeds = {}
            for info in model.inputs:
                if info.shape is None:  # declared without a shape: the run needs one given (issue 18's --shape)
                    raise SystemExit(f"ember: input {info.name!r} declares no shape; this command cannot make one up")
                shape = [batch if not isinstance(d, int) else d for d in info.shape]
                feeds[info.name] = rng.random(shape, dtype=np.float64).astype(info.dtype)
            if ref_sess is not None:
                ref = ref_sess.run(None, feeds)
                ms = _median_ms(lambda f=feeds: ref_sess.run(None, f), repeat)
                rows.append(("onnxruntime (cpu)", "-", f"{ms:.2f}", "reference"))
        out = model.run(feeds)
        ms = _median_ms(lambda m=model, f=feeds: m.run(f), repeat)
        if ref is not None:
            errs, top_ok = [], True
            for got, want in zip(out.values(), ref, strict=True):
                errs.append(float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30)))
                top_ok = top_ok and (got.ndim < 2 or bool((got.argmax(-1) == want.argmax(-1)).all()))
            note = f"max rel err {max(errs):.1e}, top-1 {'same' if top_ok else 'DIFFERENT'}"
        else:
            note = "onnxruntime not installed: no reference"
        label = name if name != "wgpu" else f"wgpu ({model.compute_backend.adapter_name})"
        rows.append((label, f"{load_s:.2f}", f"{ms:.2f}", note))
    print(f"{'engine':48} {'load s':>7} {'run ms':>8}  check")
    for r in rows:
        print(f"{r[0]:48} {r[1]:>7} {r[2]:>8}  {r[3]}")
    return 0


def demo_primitives(backends: list[str]) -> None:
    """gemm and conv2d through the ComputeBackend API, checked against numpy."""
    rng = np.random.default_rng(0)
    m = n = k = 256
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ref = a.astype(np.float64) @ b
    print(f"\ngemm {m}x{n}x{k} through the ComputeBackend API:")
    for name in backends:
        be = ember.backend(name)
        ha, hb, hc = be.alloc(a.nbytes), be.alloc(b.nbytes), be.alloc(m * n * 4)
        be.copy_htod(ha, a)
        be.copy_htod(hb, b)

        def gemm(be=be, ha=ha, hb=hb, hc=hc) -> None:
            be.gemm(False, False, m, n, k, 1.0, ha, k, hb, n, 0.0, hc, n)
            be.synchronize()

        ms = _median_ms(gemm, 10)
        c = np.empty((m, n), np.float32)
        be.copy_dtoh(c, hc)
        err = np.abs(c - ref).max() / np.abs(ref).max()
        print(f"  {name:5} {ms:8.3f} ms  {2 * m * n * k / ms / 1e6:8.1f} GFLOP/s  rel err {err:.1e}")
        for h in (ha, hb, hc):
            be.free(h)


def demo(args: argparse.Namespace) -> int:
    backends = ember.available_backends()
    print(f"ember {ember.__version__}; available backends: {backends}")
    import onnx

    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for path in args.model or [os.path.join(light, "light_squeezenet.onnx")]:
        run_model(path, backends, args.repeat)
        print()
    demo_primitives(backends)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ember", description=ember.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a real model on every backend next to ONNX Runtime")
    d.add_argument("--model", action="append", help="an ONNX file, repeatable (default: SqueezeNet from the onnx "
                                                    "package, whose weights are all one constant)")
    d.add_argument("--repeat", type=int, default=10)
    r = sub.add_parser("run", help="run an ONNX model on random inputs, compare with ONNX Runtime, time it")
    r.add_argument("model")
    r.add_argument("--backend", default="all", help="cpu, wgpu or all (default)")
    r.add_argument("--batch", type=int, default=1, help="value for symbolic dims")
    r.add_argument("--repeat", type=int, default=10)
    sub.add_parser("backends", help="list the backends usable here")
    args = p.parse_args(argv)
    if args.cmd == "demo":
        return demo(args)
    if args.cmd == "run":
        backends = ember.available_backends() if args.backend == "all" else [args.backend]
        return run_model(args.model, backends, args.repeat, args.batch)
    for name in ember.available_backends():
        be = ember.backend(name)
        extra = f": {be.adapter_name}" if name == "wgpu" else ""
        print(f"{name}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
