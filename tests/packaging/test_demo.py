"""scripts/demo.sh needs ember and onnxruntime only (the `demo` extra): the zoo helper it calls imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_models_need_no_torch() -> None:
    # What demo.sh runs (shufflenet is its other model: the same code path), then the check.
    code = ("import sys\nfrom tests.models import zoo\nzoo.light_randomized('squeezenet')\n"
            "assert 'torch' not in sys.modules, 'the demo imported torch'")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
