"""Model benchmarks: ember (wgpu, cpu) side by side with ONNX Runtime and PyTorch, in one process.

    python bench/bench_models.py [--models resnet18_b1,...] [--repeat 30] [--json out.json] [--md out.md]
        [--peers]   # also ONNX Runtime's WebGPU provider (installed by ../shared/tools/gpu-prep --peers)
        [--no-cpu] [--no-compile] [--f16] [--warmup 3] [--backends wgpu,cpu]

Each engine: warm-up, then the median (and p10/p90) of `repeat` timed runs, host arrays in and out (PyTorch
CUDA times include the copies to and from the GPU, as ember's do). Speed numbers are ratios taken in one
run on one machine; BENCHMARKS.md records them with date, hardware and command. The command line, model set
and columns are those of every earlier commit (runs of old and new copies are compared); timing goes through
bench/harness.py, and only ember's public API is used, so it runs against older sources too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness, also when imported as bench.bench_models
import harness  # noqa: E402  (puts this checkout's src and tests on sys.path)

import ember  # noqa: E402

ROOT = harness.ROOT

# ---- models ---------------------------------------------------------------------------------------------


def build_mobilenetv2_224() -> Any:
    """MobileNetV2 (torchvision's configuration, width 1.0, 1000 classes), built here since torchvision is absent."""
    import torch
    from torch import nn

    def cbr(cin: int, cout: int, k: int, s: int, g: int = 1, act: bool = True) -> list[Any]:
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(cout)]
        return layers + ([nn.ReLU6()] if act else [])

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, s: int, t: int) -> None:
            super().__init__()
            hid = cin * t
            self.res = s == 1 and cin == cout
            self.body = nn.Sequential(*(cbr(cin, hid, 1, 1) if t != 1 else []), *cbr(hid, hid, 3, s, hid),
                                      *cbr(hid, cout, 1, 1, act=False))

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.res else self.body(x)

    layers, cin = cbr(3, 32, 3, 2), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            layers.append(Block(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += cbr(cin, 1280, 1, 1) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    torch.manual_seed(0)
    model = nn.Sequential(*layers).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def export_torch(model: Any, inputs: dict[str, np.ndarray], name: str) -> Path:
    from tests.models.transformers import export

    return export(model, inputs, name)


def chain_model(n: int = 200, size: int = 4096) -> tuple[Path, dict[str, np.ndarray]]:
    """A chain of n elementwise nodes (Add, Mul, Relu, Tanh, ...): measures per-node cost."""
    import onnx
    from onnx import TensorProto, helper

    ops = ["Add", "Mul", "Relu", "Sub", "Tanh", "Abs", "Sigmoid", "Neg"]
    nodes, prev = [], "x"
    c = helper.make_tensor("c", TensorProto.FLOAT, [1], [0.5])
    for i in range(n):
        op = ops[i % len(ops)]
        ins = [prev, "c"] if op in ("Add", "Mul", "Sub") else [prev]
        nodes.append(helper.make_node(op, ins, [f"t{i}"]))
        prev = f"t{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, size])], [c])
    path = ROOT / ".cache" / "models" / f"chain{n}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    # IR 10: the ONNX Runtime builds measured against read up to IR 13; onnx 1.23 would write 14.
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path, {"x": np.random.default_rng(0).standard_normal((1, size)).astype(np.float32)}


def workloads() -> dict[str, Callable[[], tuple[Path, dict[str, np.ndarray], Any]]]:
    """name -> builder returning (onnx path, feeds, torch module or None)."""
    from tests.models import transformers as tr
    from tests.models import zoo

    def resnet(batch: int) -> Callable:
        def build() -> tuple:
            model = zoo.randomize_(zoo.build_resnet18(), 18, zoo.RESNET_INPUT)
            x = np.random.default_rng(0).random((batch, 3, 224, 224), dtype=np.float32)
            return export_torch(model, {"input": x}, f"bench_resnet18_b{batch}"), {"input": x}, model
        return build

    def mobilenet() -> tuple:
        model = build_mobilenetv2_224()
        x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        return export_torch(model, {"input": x}, "bench_mobilenetv2_b1"), {"input": x}, model

    def bert() -> tuple:
        model = tr.build_bert(layers=4, hidden=768, heads=12, ff=3072)
        feeds = tr.bert_inputs(1, 128, hidden=768)
        return export_torch(model, feeds, "bench_bert4_s128"), feeds, model

    def chain() -> tuple:
        path, feeds = chain_model()
        return path, feeds, None

    return {"resnet18_b1": resnet(1), "resnet18_b8": resnet(8), "mobilenetv2_b1": mobilenet,
            "bert4x768_s128": bert, "chain200": chain}


# ---- engines --------------------------------------------------------------------------------------------


def ember_engine(path: Path, feeds: dict, backend: str, fuse: bool = True,
                 precision: str = "f32") -> tuple[Callable, Any]:
    model = ember.load_onnx(path, backend=backend, fuse=fuse, precision=precision)
    return (lambda: model.run(feeds)), model


def ort_engine(path: Path, feeds: dict) -> Callable:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)


def torch_engines(module: Any, feeds: dict, compile: bool = True) -> dict[str, Callable]:
    torch = harness.cuda_torch()
    out: dict[str, Callable] = {}
    if module is None or torch is None:
        return out
    mod = module.cuda().eval()
    host = [torch.from_numpy(v) for v in feeds.values()]

    def eager() -> Any:
        with torch.no_grad():
            return mod(*(h.cuda() for h in host)).cpu()

    out["torch eager (CUDA)"] = eager
    if not compile:
        return out
    try:
        compiled = torch.compile(mod)

        def comp() -> Any:
            with torch.no_grad():
                return compiled(*(h.cuda() for h in host)).cpu()

        comp()
        out["torch.compile (CUDA)"] = comp
    except Exception as e:  # no Triton / compiler on the machine
        print(f"  torch.compile unavailable: {type(e).__name__}: {str(e)[:120]}")
    return out


# The peer runs in its own process and times with the same harness (its directory goes on PYTHONPATH).
PEER_SCRIPT = """
import json, sys, numpy as np, onnxruntime as ort, harness
path, feeds_path, repeat, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
feeds = dict(np.load(feeds_path))
so = ort.SessionOptions(); so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
s = ort.InferenceSession(path, so, providers=["WebGpuExecutionProvider"])
stats = harness.measure(lambda: s.run(None, feeds), repeat, warmup)
print(json.dumps({k: v for k, v in stats.as_dict().items() if k.endswith("_ms")}))
"""


def peer_webgpu(path: Path, feeds: dict, repeat: int, warmup: int = 3) -> dict | str:
    """ONNX Runtime's WebGPU provider, in a subprocess (its module name would shadow the CPU build)."""
    if not os.path.isdir("/tmp/peers"):
        return "not installed"
    fp = ROOT / ".cache" / "peer_feeds.npz"
    np.savez(fp, **feeds)
    env = dict(os.environ, PYTHONPATH=f"/tmp/peers:{harness.BENCH}:" + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", PEER_SCRIPT, str(path), str(fp), str(repeat), str(warmup)],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode:
        return "failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160]
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- main -----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b1,resnet18_b8,mobilenetv2_b1,bert4x768_s128,chain200")
    harness.add_common(ap, repeat=30, warmup=3)
    ap.add_argument("--peers", action="store_true", help="also ONNX Runtime's WebGPU provider")
    ap.add_argument("--no-cpu", action="store_true", help="skip the ember cpu backend (slow on big models)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compile takes a while)")
    ap.add_argument("--f16", action="store_true", help="also ember wgpu with precision='f16'")
    args = ap.parse_args()
    backends = harness.backend_list(args.backends, ember.available_backends())
    wl = workloads()
    report = harness.Report("Models: ember, ONNX Runtime and PyTorch, median ms per run (host arrays in and out)",
                            args, row_key="model", cells_key="engines", digits=2, meta={"backends": backends})
    for name in args.models.split(","):
        try:
            path, feeds, module = wl[name]()
        except Exception as e:  # an exporter missing on this machine: report it, go on with the others
            print(f"== {name}: could not build: {type(e).__name__}: {e}")
            report.add(name, {}, info={"error": str(e)})
            continue
        print(f"== {name}  ({path.name})", flush=True)
        ref = None
        engines: list[tuple[str, Callable[[], Any]]] = []
        info: dict[str, Any] = {}
        for b in backends:
            if b == "cpu" and args.no_cpu:
                continue
            try:
                fn, model = ember_engine(path, feeds, b)
            except Exception as e:
                info[b] = f"load failed: {type(e).__name__}: {e}"
                print(f"  ember {b}: load failed: {e}")
                continue
            engines.append((f"ember {b}", fn))
            info[b] = model.plan_info()
            if b == "wgpu":
                info["wgpu_adapter"] = harness.adapter_name(model.compute_backend)
                if name == "chain200":
                    fn2, m2 = ember_engine(path, feeds, b, fuse=False)
                    engines.append(("ember wgpu, fusion off", fn2))
                    info["wgpu_unfused_steps"] = m2.plan_info()["steps"]
                try:
                    info["wgpu_profile_top"] = [(lbl, round(ms, 4)) for lbl, ms in model.profile(feeds, top=8)]
                    info["wgpu_gpu_ms_run"] = round(model.gpu_time(feeds), 4)
                except Exception as e:  # profiling needs timestamp queries
                    info["wgpu_profile_top"] = f"unavailable: {e}"
                if args.f16 and name != "chain200":
                    try:
                        fn16, m16 = ember_engine(path, feeds, b, precision="f16")
                        engines.append(("ember wgpu f16", fn16))
                        info["wgpu_f16"] = m16.plan_info()
                        info["wgpu_f16_gpu_ms_run"] = round(m16.gpu_time(feeds), 4)
                    except Exception as e:
                        info["wgpu_f16"] = f"failed: {type(e).__name__}: {e}"
        engines.append(("onnxruntime cpu", ort_engine(path, feeds)))
        engines += [(k, v) for k, v in torch_engines(module, feeds, not args.no_compile).items()]
        cells: dict[str, Any] = {}
        outs: dict[str, np.ndarray] = {}
        for label, fn in engines:
            try:
                out = fn()
            except Exception as e:
                cells[label] = f"failed: {type(e).__name__}: {str(e)[:100]}"
                print(f"  {label}: failed: {e}")
                continue
            out0 = out[0] if isinstance(out, list) else next(iter(out.values())) if isinstance(out, dict) else out
            outs[label] = np.asarray(out0.numpy() if hasattr(out0, "numpy") else out0)
            if ref is None and label == "onnxruntime cpu":
                ref = outs[label]
            # Warm-up, then `repeat` timed runs: median and the p10 / p90 of the sorted times (harness.percentile).
            t = harness.measure(fn, args.repeat, args.warmup)
            cells[label] = {k: v for k, v in t.as_dict().items() if k.endswith("_ms")}
            print(f"  {label:28} {t.median:9.3f} ms  (p10 {t.p10:.3f}, p90 {t.p90:.3f})", flush=True)
        for label, t in cells.items():
            if isinstance(t, dict) and ref is not None and outs[label].shape == ref.shape:
                t["max_rel_err_vs_ort"] = float(np.abs(outs[label] - ref).max() / (np.abs(ref).max() + 1e-30))
        if args.peers:
            cells["onnxruntime webgpu (peer)"] = peer_webgpu(path, feeds, args.repeat, args.warmup)
            print(f"  onnxruntime webgpu: {cells['onnxruntime webgpu (peer)']}")
        report.add(name, cells, info=info)  # the JSON is rewritten after every model: a cut-short run keeps its rows
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
