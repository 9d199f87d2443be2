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
from .runner import differences, failure_report, run_batch, summarize
from .strategies import FEED_RECIPES, MODEL_RECIPES, draw

BACKENDS = ember.available_backends()
CI_CASES = {"model": 4000, "feed": 2000}
LONG_CASES = {"model": 10_000, "feed": 10_000}
LONG_SEED = 21


@functools.cache
def _recipes(kind: str, n: int, seed: int | None) -> list[dict[str, Any]]:
    return draw(MODEL_RECIPES if kind == "model" else FEED_RECIPES, n, seed)


CHECKED = {"EMBER_CHECKED_SHADERS": "1"}


def _sized(request: pytest.FixtureRequest, kind: str) -> list[dict[str, Any]]:
    long = request.config.getoption("--fuzz-long")
    return _recipes(kind, (LONG_CASES if long else CI_CASES)[kind], LONG_SEED if long else None)


_runs: dict[tuple[int, str, bool], list[dict[str, Any]]] = {}


def _run(recipes: list[dict[str, Any]], backend: str, checked: bool = False) -> list[dict[str, Any]]:
    """The outcomes of these recipes, run once per mode (the comparison reuses the trusted run)."""
    key = (id(recipes), backend, checked)
    if key not in _runs:
        _runs[key] = run_batch(recipes, backend, settings=CHECKED if checked else {"EMBER_CHECKED_SHADERS": "0"})
    return _runs[key]


def _fuzz(request: pytest.FixtureRequest, kind: str, backend: str) -> None:
    recipes = _sized(request, kind)
    results = _run(recipes, backend)
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


@pytest.mark.skipif("wgpu" not in BACKENDS, reason="no wgpu adapter: the comparison is of wgpu's two shader modes")
@pytest.mark.parametrize("kind", ["model", "feed"])
def test_checked_shaders_agree_with_trusted(request: pytest.FixtureRequest, kind: str) -> None:
    """Trusted shader modules run without bounds checks, so a kernel's memory safety rests on ember's host-side
    shape and index checks: the same cases with checked modules (EMBER_CHECKED_SHADERS=1, where an
    out-of-bounds access is clamped or fails) must give the same outcome and the same outputs."""
    recipes = _sized(request, kind)
    trusted, checked = _run(recipes, "wgpu"), _run(recipes, "wgpu", checked=True)
    line = summarize(f"{kind} wgpu, checked shaders", checked)
    conftest.SUMMARIES.append(line)
    report = failure_report(recipes, checked, "wgpu")
    assert not report, f"{line}\n{report}"
    modes = {(r["checked"], c["checked"]) for r, c in zip(trusted, checked, strict=True) if "checked" in c}
    assert modes == {(False, True)}, f"the runs did not use the two shader modes: {modes}"
    n, report = differences(recipes, trusted, checked, "wgpu", CHECKED)
    compared = sum(r["outcome"] == "result" for r in trusted)
    conftest.SUMMARIES.append(f"fuzz trusted vs checked [{kind} wgpu]: cases={len(recipes)} results compared="
                              f"{compared} differences={n}")
    assert n == 0, f"{n} of {len(recipes)} cases differ between trusted and checked shader modules\n{report}"


def test_differences_finds_outcomes_and_values_that_differ() -> None:
    recipes = [{"kind": "feed", "model": "m", "seed": i, "muts": []} for i in range(4)]
    out = {"y": {"dtype": "<f4", "shape": [2], "values": [1.0, float("nan")]}}
    a = [{"outcome": "result", "out": out}] * 3 + [{"outcome": "ValueError", "msg": "bad"}]
    b = [{"outcome": "result", "out": out},
         {"outcome": "result", "out": {"y": {**out["y"], "values": [1.001, float("nan")]}}},
         {"outcome": "result", "out": {"y": {**out["y"], "shape": [1, 2]}}},
         {"outcome": "result", "out": out}]
    n, report = differences(recipes, a, b, "wgpu", CHECKED)
    assert n == 3
    assert "values differ" in report and "shape" in report.lower() and "ValueError (bad) vs result" in report
    assert "EMBER_CHECKED_SHADERS=1 " in report


def test_runner_reports_crash_and_hang() -> None:
    """A segfault or a hang fails its case, and the batch goes on in a fresh worker from the next case."""
    ok = {"kind": "feed", "model": "matmul_add_softmax", "seed": 0, "muts": []}
    crash = {"kind": "selftest", "model": "", "seed": 0, "muts": [["crash"]]}
    hang = {"kind": "selftest", "model": "", "seed": 0, "muts": [["hang"]]}
    results = run_batch([ok, crash, ok, hang, ok], "cpu", case_timeout=5.0)
    assert [r["outcome"] for r in results] == ["result", "crash", "result", "hang", "result"]
    assert "Segmentation fault" in results[1]["tb"]
