"""Fixtures for the model tests: zoo files (exported once per session) and ONNX Runtime references.

The references are computed once per (model, batch) and shared by every backend. At the end of a run the
terminal summary lists export times and each model test's load and run times, which is what to look at
when resizing the matrix in test_models.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from . import zoo

# (test id, load seconds, run seconds), appended through the record_timing fixture.
TIMINGS: list[tuple[str, float, float]] = []


@pytest.fixture
def record_timing(request: pytest.FixtureRequest) -> Callable[[float, float], None]:
    """Call with (load seconds, run seconds); the terminal summary lists them."""
    return lambda load, run: TIMINGS.append((request.node.name, load, run))


@pytest.fixture(scope="session")
def zoo_models() -> dict[str, zoo.ZooModel]:
    return zoo.all_models()


@pytest.fixture(scope="session")
def model_file(zoo_models: dict[str, zoo.ZooModel]) -> Callable[[str], Path]:
    """name -> path of the model's ONNX file, exporting it on first use."""
    paths: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in paths:
            try:
                paths[name] = zoo_models[name].path()
            except zoo.ExportUnavailable as e:
                # Only the dynamo exporter can land here (torch.export/onnxscript version drift): that is a
                # broken test environment, reported as a failure rather than hidden as a skip.
                pytest.fail(str(e))
        return paths[name]

    return get


Reference = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


@pytest.fixture(scope="session")
def ort_reference(
    zoo_models: dict[str, zoo.ZooModel], model_file: Callable[[str], Path]
) -> Callable[[str, int], Reference]:
    """(name, batch) -> (feeds, ONNX Runtime CPU outputs by name), computed once per session."""
    import onnxruntime as ort

    cache: dict[tuple[str, int], Reference] = {}

    def get(name: str, batch: int) -> Reference:
        if (name, batch) not in cache:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3  # IR-3 light models make ORT warn about every unused shape input
            sess = ort.InferenceSession(str(model_file(name)), opts, providers=["CPUExecutionProvider"])
            shape = (batch, *zoo_models[name].sample_shape)
            feeds = {i.name: zoo.input_array(name, shape) for i in sess.get_inputs()}
            outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
            cache[(name, batch)] = (feeds, outputs)
        return cache[(name, batch)]

    return get


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if zoo.EXPORT_SECONDS:
        took = {k: v for k, v in zoo.EXPORT_SECONDS.items() if v > 0}
        cached = len(zoo.EXPORT_SECONDS) - len(took)
        terminalreporter.write_sep(
            "-", f"model exports: {sum(took.values()):.1f} s, {cached} reused from cache"
        )
        for name, seconds in sorted(took.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"  {seconds:6.1f} s  {name}")
    if TIMINGS:
        total = sum(load + run for _, load, run in TIMINGS)
        terminalreporter.write_sep("-", f"model tests: load + run {total:.1f} s")
        for test_id, load, run in sorted(TIMINGS, key=lambda t: -(t[1] + t[2])):
            terminalreporter.write_line(f"  load {load:6.2f} s  run {run:6.2f} s  {test_id}")
