"""Command line: `ember info MODEL`, `ember check MODEL`, `ember run MODEL`, `ember bench MODEL`, `ember profile
MODEL`, `ember generate MODEL`, `ember backends`, `ember demo`.

Errors are one line on stderr, `ember: error: ...` (a traceback with --debug), and every command exits with
0 ok, 1 outputs differ from ONNX Runtime's, 2 bad usage or arguments, 3 model rejected at load (malformed),
4 unsupported op, 5 other runtime error; with several backends, the highest of theirs. The model commands
live in ember/cli_commands.py (bench and profile in ember/cli_bench.py, generate in ember/cli_generate.py), what
they share (feeds, the ONNX Runtime reference, the comparison) in ember/cli_util.py. Progress of slow work (load,
plan build, autotune) shows on stderr when it is a terminal (ember/core/progress.py); `--quiet` or EMBER_PROGRESS=0
turns it off.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback

import numpy as np

import ember

from . import settings
from .cli_bench import bench, profile
from .cli_commands import Evaluation, check, error_line, info, run
from .cli_generate import add_parser as add_generate
from .cli_util import EXIT_CODES, RUNTIME, USAGE, FeedOptions, describe_error, median_ms


def run_model(path: str, backends: list[str], repeat: int, batch: int = 1) -> int:
    """Random inputs (symbolic dims = batch) on each backend next to ONNX Runtime, timed; the exit code."""
    return Evaluation(path, backends, FeedOptions(batch=batch), repeat=repeat).execute()


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

        ms = median_ms(gemm, 10)
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
        run_model(path, backends, args.repeat)  # a mismatch is shown, not an error, as before
        print()
    demo_primitives(backends)
    return 0


def _feed_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs (random unless given)")
    g.add_argument("--input", action="append", metavar="NAME=FILE", help="an input from a file: NAME=FILE.npy, "
                   "NAME=FILE.npz (its array NAME, or its only one) or FILE.npz (each array feeds the input of "
                   "its name); repeatable")
    g.add_argument("--shape", action="append", metavar="NAME=D0,D1,...", help="the shape of a random input "
                   "(needed where the model declares none), e.g. x=1,3,224,224; repeatable")
    g.add_argument("--batch", type=int, default=1, help="value for the dims the model leaves open that neither "
                   "--shape nor --input fixes (a symbolic dim takes the value another input gave it; default 1)")
    g.add_argument("--int-range", default="0,9", metavar="LO,HI", help="range of random integer inputs, both "
                   "ends included (default 0,9: valid indices for token ids and the like; negative: --int-range=-5,5)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def _tolerance_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("comparison with ONNX Runtime (CPU)",
                             "a float output matches where |ember - ort| <= atol + rtol * |ort|; integer and bool "
                             "outputs must be equal; 'rel err' is max abs err / max |ort|")
    g.add_argument("--rtol", type=float, default=1e-3, help="default 1e-3")
    g.add_argument("--atol", type=float, default=1e-4, help="default 1e-4")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    common.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                        help="show no progress on stderr (as EMBER_PROGRESS=0)")
    p = argparse.ArgumentParser(prog="ember", description=ember.__doc__, epilog=EXIT_CODES, parents=[common])
    p.add_argument("--version", action="version", version=f"ember {ember.__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog=EXIT_CODES,
                              parents=[common])

    i = command("info", "show a model's inputs, outputs, opsets, ops, weights and what each backend says of it")
    i.add_argument("model")
    i.add_argument("--backend", default="all", choices=["cpu", "wgpu", "all", "none"],
                   help="backends to load the model on (default: all available; none: no load)")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=info)
    c = command("check", "run a model on random (or given) inputs on each backend and compare with ONNX Runtime")
    c.add_argument("model")
    c.add_argument("--backend", default="all", choices=["cpu", "wgpu", "all"], help="default: all available")
    _feed_args(c)
    _tolerance_args(c)
    c.set_defaults(func=check)
    r = command("run", "run an ONNX model on given or random inputs, compare with ONNX Runtime, time it")
    r.add_argument("model")
    r.add_argument("--backend", default="all", choices=["cpu", "wgpu", "all"], help="default: all available")
    r.add_argument("--repeat", type=int, default=10, help="timed runs after a warm-up (default 10)")
    r.add_argument("--output", metavar="FILE.npz", help="write the outputs (of the first backend) to an .npz")
    r.add_argument("--no-compare", action="store_true", help="do not run ONNX Runtime")
    _feed_args(r)
    _tolerance_args(r)
    r.set_defaults(func=run)
    be = command("bench", "time model.run on each backend next to ONNX Runtime (CPU): median, p10, p90")
    be.add_argument("model")
    be.add_argument("--backend", default="all", choices=["cpu", "wgpu", "all"], help="default: all available")
    be.add_argument("--runs", type=int, default=20, help="timed runs per engine (default 20)")
    be.add_argument("--warmup", type=int, default=3, help="untimed runs before them, after the first run, which "
                    "builds the plan (default 3)")
    be.add_argument("--json", metavar="FILE.json", help="write the numbers (every run's time too) to a JSON file")
    be.add_argument("--no-ort", action="store_true", help="do not run ONNX Runtime (no ratio, no check)")
    _feed_args(be)
    _tolerance_args(be)
    be.set_defaults(func=bench)
    pr = command("profile", "time each node of a model's plan on each backend (GPU timestamps on wgpu)")
    pr.add_argument("model")
    pr.add_argument("--backend", default="all", choices=["cpu", "wgpu", "all"], help="default: all available")
    pr.add_argument("--top", type=int, default=20, help="the slowest nodes shown (default 20; 0: all)")
    pr.add_argument("--trace", metavar="FILE.json", help="write every step as a Chrome trace (chrome://tracing, "
                    "ui.perfetto.dev): one complete event per step, laid end to end in graph order")
    pr.add_argument("--html", metavar="FILE.html", help="write a self-contained HTML page with a bar chart of the "
                    "--top nodes")
    _feed_args(pr)
    pr.set_defaults(func=profile)
    add_generate(command)
    d = command("demo", "run a real model on every backend next to ONNX Runtime")
    d.add_argument("--model", action="append", help="an ONNX file, repeatable (default: SqueezeNet from the onnx "
                                                    "package, whose weights are all one constant)")
    d.add_argument("--repeat", type=int, default=10)
    d.set_defaults(func=demo)
    b = command("backends", "list the backends usable here")
    b.set_defaults(func=list_backends)
    return p


def list_backends(args: argparse.Namespace) -> int:
    from .backends.wgpu.runtime import dawn_installed

    for name in ember.available_backends():
        if name != "wgpu":
            print(name)
            continue
        # Each WebGPU runtime installed, with its adapter and matrix arm ("auto" says which one load_onnx takes).
        for webgpu in ("wgpu-native", "dawn") if dawn_installed() else ("wgpu-native",):
            try:
                info = ember.backend(name, webgpu=webgpu).runtime_info()
            except RuntimeError as e:
                print(f"{name} ({webgpu}): unavailable: {e}")
                continue
            configs = ", ".join(info["matrix_configs"]) or "none"
            print(f"{name} ({webgpu} {info['version']}): {info['adapter']}; matrix configs: {configs}; "
                  f"matrix arm: {info['matrix']}")
        from .backends.wgpu.runtime import resolve

        print(f"wgpu webgpu='auto' takes: {resolve()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) and bad usage (2): argparse has printed what to
        return e.code if isinstance(e.code, int) else (0 if e.code is None else USAGE)
    debug = getattr(args, "debug", False)
    quiet = settings.override(progress=False) if getattr(args, "quiet", False) else contextlib.nullcontext()
    try:
        with quiet:
            return args.func(args)
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except BrokenPipeError:  # `ember info m.onnx | head`: stop quietly (Python flushes stdout again at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if debug:
            traceback.print_exc()
        err = describe_error(e, at_load=False)
        error_line(str(err))
        return err.code if err.code else RUNTIME


if __name__ == "__main__":
    sys.exit(main())
