"""Fuzzing in the suite (project issue 21): mutated models and mutated feeds, on every available backend.

Each case's outcome must be a result or one of ember's exception types raised by ember itself; a crash, a hang
or a Python-internal error (KeyError, IndexError, a numpy error...) fails, printing the recipe and a command that
replays it. The default sizes keep the folder around a minute or two; `pytest tests/fuzz --fuzz-long` runs 10k model
and 10k feed cases per backend, other cases than CI's (LONG_SEED). Both are deterministic: hypothesis draws the
recipes derandomized (CI) or from a fixed seed (long), so a failure comes back on every run until it is fixed."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import ember

from . import conftest
from .runner import failure_report, run_batch, summarize
from .strategies import FEED_RECIPES, MODEL_RECIPES, draw

BACKENDS = ember.available_backends()
CI_CASES = {"model": 4000, "feed": 2000}
LONG_CASES = {"model": 10_000, "feed": 10_000}
LONG_SEED = 21


@functools.cache
def _recipes(kind: str, n: int, seed: int | None) -> list[dict[str, Any]]:
    return draw(MODEL_RECIPES if kind == "model" else FEED_RECIPES, n, seed)


def _fuzz(request: pytest.FixtureRequest, kind: str, backend: str) -> None:
    long = request.config.getoption("--fuzz-long")
    seed = LONG_SEED if long else None
    n = (LONG_CASES if long else CI_CASES)[kind]
    recipes = _recipes(kind, n, seed)
    results = run_batch(recipes, backend)
    line = summarize(f"{kind} {backend}", results)
    conftest.SUMMARIES.append(line)
    print(line)
    report = failure_report(recipes, results, backend)
    assert not report, f"{line}\n{report}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_mutations(request: pytest.FixtureRequest, backend: str) -> None:
    _fuzz(request, "model", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_feed_fuzz(request: pytest.FixtureRequest, backend: str) -> None:
    _fuzz(request, "feed", backend)


def test_runner_reports_crash_and_hang() -> None:
    """A segfault or a hang fails its case, and the batch goes on in a fresh worker from the next case."""
    ok = {"kind": "feed", "model": "matmul_add_softmax", "seed": 0, "muts": []}
    crash = {"kind": "selftest", "model": "", "seed": 0, "muts": [["crash"]]}
    hang = {"kind": "selftest", "model": "", "seed": 0, "muts": [["hang"]]}
    results = run_batch([ok, crash, ok, hang, ok], "cpu", case_timeout=5.0)
    assert [r["outcome"] for r in results] == ["result", "crash", "result", "hang", "result"]
    assert "Segmentation fault" in results[1]["tb"]
