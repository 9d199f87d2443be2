"""One backend object shared by models that load, plan, run and close in several threads at once, with raw
allocations beside them. Before the allocation table had a lock two threads could get the same handle, and
wgpu-native aborted the process on a destroyed buffer; the work runs in a subprocess so a crash fails the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import ember
    from tests.unit.test_plan_cache import Reference, conv3x3, mlp
    be = ember.backend(sys.argv[1])
    refs = {"mlp": Reference(mlp()), "conv": Reference(conv3x3())}
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for i in range(6):
                kind = "mlp" if (seed + i) % 2 else "conv"
                model = ember.load_onnx(mlp() if kind == "mlp" else conv3x3(), backend=be)
                for b in rng.integers(1, 6, 4):
                    shape = (int(b), 16) if kind == "mlp" else (int(b), 4, 8, 8)
                    x = rng.standard_normal(shape).astype(np.float32)
                    got = next(iter(model.run({"x": x}).values()))
                    np.testing.assert_allclose(got, refs[kind](x), rtol=1e-4, atol=1e-4)
                model.close()
                handles = [be.alloc(int(n)) for n in rng.integers(4, 5000, 20)]
                for h in handles:
                    be.free(h)
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("errors:", len(errors), errors[:2])
    sys.exit(1 if errors else 0)
""")


def test_models_on_one_backend_in_eight_threads(backend_name: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, backend_name], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
