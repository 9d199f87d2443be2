"""Generation over folders written by ONNX Runtime GenAI's model builder: `transformers` decoders built from configs
(random weights, a word-level tokenizer), through `python -m onnxruntime_genai.models.builder -p PRECISION -e TARGET`,
then generated greedily by each engine from the same prompt.

    python bench/bench_genai.py [--models llama-1b] [--precisions int4,fp16,fp32] [--target webgpu] [--prompt 32]
        [--new 64] [--engines ember-wgpu,og-cpu,torch,ort-webgpu] [--work DIR] [--json out.json] [--md out.md]

Per row: prefill ms, decode ms/token (median over the steps after the first two) and tokens/s, plans built during
the timed generation, and whether the tokens equal ONNX Runtime GenAI's (else how many leading ones do; og-cpu: its
CPU provider on the same folder with the provider options removed). ember runs a first generation to warm up
(plans, pipelines) and times a second one; torch is the transformers model the folder was built from, eager on
CUDA (f32 rows: float32; fp16 and int4 rows: float16), greedy with a DynamicCache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from tests.models import decoders, genai  # noqa: E402

from ember.generate import Generator  # noqa: E402

MODELS = {
    "llama-1b": decoders.Decoder("llama", layers=16, hidden=2048, heads=32, kv_heads=8, ff=8192, vocab=32000,
                                 positions=2048),
    "llama-tiny": decoders.LLAMA,
}


def ember_run(folder: Path, prompt: list[int], new: int) -> dict:
    gen = Generator(str(folder), backend="wgpu")
    gen.generate(prompt, new)  # plans, pipelines, templates
    builds = gen.model.cache_info()["builds"]
    tokens = gen.generate(prompt, new)
    st = gen.stats
    steps = sorted(st.step_ms[2:]) or st.step_ms
    ms = float(np.median(steps))
    return {"prefill ms": st.prefill_ms, "ms/token": ms, "tok/s": 1e3 / ms,
            "builds": gen.model.cache_info()["builds"] - builds, "tokens": [int(t) for t in tokens]}


def og_run(folder: Path, prompt: list[int], new: int, work: Path) -> dict:
    import onnxruntime_genai as og

    cpu = genai.cpu_copy(folder, work / f"cpu-{folder.name}")
    model = og.Model(str(cpu))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(np.array([prompt], np.int32))
    gen.generate_next_token()
    prefill = (time.perf_counter() - t0) * 1e3
    times = []
    while not gen.is_done():
        t = time.perf_counter()
        gen.generate_next_token()
        times.append((time.perf_counter() - t) * 1e3)
    ms = float(np.median(times[2:] or times))
    return {"prefill ms": prefill, "ms/token": ms, "tok/s": 1e3 / ms,
            "tokens": [int(t) for t in list(gen.get_sequence(0))[len(prompt):]]}


def torch_run(cfg: decoders.Decoder, prompt: list[int], new: int, half: bool) -> dict | None:
    torch = harness.cuda_torch()
    if torch is None:
        return None
    model = decoders.build(cfg).cuda()
    if half:
        model = model.half()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        times = {}
        for n in (1, new):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
            times[n] = (time.perf_counter() - t0) * 1e3
    ms = (times[new] - times[1]) / (new - 1)
    return {"prefill ms": times[1], "ms/token": ms, "tok/s": 1e3 / ms,
            "tokens": [int(t) for t in out[0, len(prompt):].tolist()]}


# ONNX Runtime's WebGPU provider on the folder's model.onnx, greedy, in its own process (its module name would
# shadow the CPU build). The KV cache is fed back as OrtValues bound on the device where the build allows
# (io_binding, "webgpu"), else through host arrays (the row says which).
PEER_SCRIPT = """
import json, sys, time, numpy as np, onnxruntime as ort
folder, prompt, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cfg = json.load(open(folder + "/genai_config.json"))
share = bool(cfg.get("search", {}).get("past_present_share_buffer", False))
so = ort.SessionOptions()  # shape nodes on its CPU provider, as ONNX Runtime places them
s = ort.InferenceSession(folder + "/" + cfg["model"]["decoder"]["filename"], so, providers=["WebGpuExecutionProvider"])
ins = {i.name: i for i in s.get_inputs()}
kv = [n for n in ins if n.startswith("past_key_values")]
dt = {"tensor(float16)": np.float16, "tensor(float)": np.float32}
dec = cfg["model"]["decoder"]
heads, hd = dec["num_key_value_heads"], dec["head_size"]
cap = len(prompt) + new
past = {n: np.zeros((1, heads, cap if share else 0, hd), dt[ins[n].type]) for n in kv}
def step(ids, total):
    f = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
    if "position_ids" in ins:
        f["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
    f.update(past)
    outs = s.run(None, f)
    names = [o.name for o in s.get_outputs()]
    for n, v in zip(names, outs):
        if n.startswith("present"):
            past[n.replace("present", "past_key_values")] = v
    return int(np.argmax(outs[names.index("logits")][0, -1]))
t0 = time.perf_counter(); tok = step(prompt, len(prompt)); prefill = (time.perf_counter() - t0) * 1e3
tokens, times = [tok], []
for i in range(new - 1):
    t = time.perf_counter(); tok = step([tok], len(prompt) + i + 1); times.append((time.perf_counter() - t) * 1e3)
    tokens.append(tok)
ms = float(np.median(times[2:] or times))
print(json.dumps({"prefill ms": prefill, "ms/token": ms, "tok/s": 1e3 / ms, "tokens": tokens,
                  "note": "KV through host arrays" + (", shared buffer" if share else "")}))
"""


def ort_webgpu_run(folder: Path, prompt: list[int], new: int) -> dict:
    """ONNX Runtime's WebGPU build (../shared/tools/gpu-prep --peers puts it in /tmp/peers)."""
    if not os.path.isdir("/tmp/peers"):
        raise RuntimeError("ONNX Runtime's WebGPU build is not installed (/tmp/peers)")
    env = dict(os.environ, PYTHONPATH="/tmp/peers:" + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", PEER_SCRIPT, str(folder), json.dumps(prompt), str(new)],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise RuntimeError((r.stderr.strip().splitlines() or ["?"])[-1][:300])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama-1b")
    ap.add_argument("--precisions", default="int4,fp16,fp32")
    ap.add_argument("--target", default="webgpu")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--engines", default="ember-wgpu,og-cpu,torch")
    ap.add_argument("--work", default=None, help="where the folders are built (default: a temporary directory)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    engines = args.engines.split(",")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_genai_"))
    rows = []
    for name in args.models.split(","):
        cfg = MODELS[name]
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, cfg.vocab, args.prompt)]
        hf = work / f"hf-{name}"
        if not (hf / "tokenizer.json").exists():
            genai.save_hf(decoders.build(cfg), cfg.vocab, hf)
        for precision in args.precisions.split(","):
            out = work / f"{name}-{precision}-{args.target}"
            t0 = time.perf_counter()
            if not (out / "genai_config.json").exists():
                genai.run_builder(hf, out, precision, args.target, work / "cache")
            print(f"{out.name}: built in {time.perf_counter() - t0:.0f} s", flush=True)
            results = {}
            for engine in engines:
                try:
                    if engine == "ember-wgpu":
                        r = ember_run(out, prompt, args.new)
                    elif engine == "og-cpu":
                        r = og_run(out, prompt, args.new, work)
                    elif engine == "ort-webgpu":
                        r = ort_webgpu_run(out, prompt, args.new)
                    elif engine == "torch":
                        r = torch_run(cfg, prompt, args.new, half=precision != "fp32")
                    else:
                        raise SystemExit(f"unknown engine {engine!r}")
                except Exception as e:  # one engine's failure is a row, not the end of the run
                    r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if r is not None:
                    results[engine] = r
                    print(engine, json.dumps({k: v for k, v in r.items() if k != "tokens"}), flush=True)
            ref = results.get("og-cpu", {}).get("tokens")
            for engine, r in results.items():
                same = {}
                if ref is not None and "tokens" in r:  # equal, or how many leading tokens agree (random weights
                    # leave top-2 logits close: float16 / int4 rounding between engines can flip a greedy pick)
                    lead = len(os.path.commonprefix([r["tokens"], ref]))
                    same = {"same tokens as og": r["tokens"] == ref or f"first {lead} of {len(ref)}"}
                rows.append({"model": name, "precision": precision, "engine": engine, **r, **same})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.md:
        lines = ["| model | precision | engine | prefill ms | ms/token | tok/s | builds | tokens = og |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['precision']} | {r['engine']} | {r['error']} |||||")
                continue
            lines.append(f"| {r['model']} | {r['precision']} | {r['engine']} | {r['prefill ms']:.1f} | "
                         f"{r['ms/token']:.2f} | {r['tok/s']:.0f} | {r.get('builds', '')} | "
                         f"{r.get('same tokens as og', '')} |")
        Path(args.md).write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
