"""Long runs and threads: many runs alternating input shapes keep memory flat; several threads running the same
model and different models at once all get ONNX Runtime's results; a closed model gives its device memory back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import ember

from ..unit.test_plan_cache import Reference, conv3x3, mlp
from . import encoders

ort = pytest.importorskip("onnxruntime")

TOL = {"rtol": 1e-4, "atol": 1e-4}
ROOT = Path(__file__).resolve().parents[2]


SOAK = textwrap.dedent("""
    import gc, json, sys, tracemalloc
    import numpy as np
    import ember
    from tests.models.memory import rss_mb
    from tests.unit.test_plan_cache import Reference, mlp
    backend_name, runs = sys.argv[1], int(sys.argv[2])
    model = ember.load_onnx(mlp(), backend=backend_name)
    ref = Reference(mlp())
    rng = np.random.default_rng(0)
    xs = {b: rng.standard_normal((b, 16)).astype(np.float32) for b in (1, 2, 3, 5)}
    want = {b: ref(x) for b, x in xs.items()}
    be = model.compute_backend
    marks, wrong = [], []
    tracemalloc.start()
    for i in range(runs):
        b = (1, 2, 3, 5)[i % 4]
        got = model.run({"x": xs[b]})["y"]
        if i % 997 == 0 and not np.allclose(got, want[b], rtol=1e-4, atol=1e-4):
            wrong.append(i)
        if i in (1000, runs - 1):
            gc.collect()
            marks.append((rss_mb(), be.memory_info()["bytes"], tracemalloc.get_traced_memory()[0]))
    info = model.cache_info()
    print(json.dumps({"marks": marks, "wrong": wrong, "plans": info["plans"], "builds": info["builds"],
                      "evictions": info["evictions"]}))
""")


def test_soak_alternating_shapes_keeps_memory_flat(backend_name: str) -> None:
    """10k runs (2k on the software GPU) over four batch sizes, all four plans held: after the first thousand,
    Python's heap grows by less than 64 KiB, RSS by less than 2 MB and the backend's bytes not at all. The runs
    go in a fresh process: in the suite's own (1.6 GB after the model tests) the allocator's arenas move RSS by
    a few MB whatever the code under test does."""
    runs = 10_000 if backend_name == "cpu" else 2_000
    done = subprocess.run([sys.executable, "-c", SOAK, backend_name, str(runs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["wrong"], f"runs {out['wrong']} differ from the reference"
    (rss0, dev0, py0), (rss1, dev1, py1) = out["marks"]
    assert py1 - py0 < 64 * 1024, f"Python's heap grew {py1 - py0} bytes over {runs - 1000} runs"
    assert rss1 - rss0 < 2, f"RSS grew {rss1 - rss0:.1f} MB over {runs - 1000} runs"
    assert dev1 == dev0
    # Four shapes, four plans: three built, the fourth (the trace that verified their template) its live plan.
    assert out["plans"] == 4 and out["builds"] == 3 and out["evictions"] == 0


def test_threads_run_different_models_at_once(backend_name: str) -> None:
    """Two threads on each of three models (an MLP, a conv, a transformers BERT export) on one backend: every
    run equals ONNX Runtime's."""
    rng = np.random.default_rng(1)
    bert_path = str(encoders.export())
    bert_sess = ort.InferenceSession(bert_path, providers=["CPUExecutionProvider"])
    cases = []
    for proto in (mlp(), conv3x3()):
        ref = Reference(proto)
        shape = (3, 16) if proto.graph.name == "mlp" else (2, 4, 8, 8)
        feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(2)]
        cases.append((ember.load_onnx(proto, backend=backend_name), feeds, [ref(f["x"]) for f in feeds]))
    bert_feeds = [encoders.BERT.feeds(1, n, seed=n) for n in (7, 12)]
    cases.append((ember.load_onnx(bert_path, backend=backend_name), bert_feeds,
                  [bert_sess.run(None, f)[0] for f in bert_feeds]))
    errors: list[BaseException] = []

    def work(model: ember.Model, feeds: list, want: list, seed: int) -> None:
        try:
            for j in np.random.default_rng(seed).integers(0, len(feeds), 20):
                got = next(iter(model.run(feeds[j]).values()))
                np.testing.assert_allclose(got, want[j], **TOL)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(*case, 2 * i + k)) for i, case in enumerate(cases) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread is still running after 10 minutes"
    assert not errors, errors[0]
    for model, _, _ in cases:
        model.close()


def test_a_closed_model_gives_its_device_memory_back(backend_name: str) -> None:
    be = ember.backend(backend_name)  # a backend of the test's own: only this model allocates on it
    before = be.memory_info()
    model = ember.load_onnx(str(encoders.export()), backend=be)
    for n in (5, 9, 17):
        model.run(encoders.BERT.feeds(2, n))
    held = be.memory_info()
    assert held["bytes"] > before["bytes"] + model.cache_info()["weight_bytes"] // 2
    model.close()
    after = be.memory_info()
    assert after["bytes"] == before["bytes"] and after["allocations"] == before["allocations"]
