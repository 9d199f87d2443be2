"""Shared fixtures: every backend test runs once per available backend (ids 'cpu' and 'wgpu')."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx.helper
import pytest

import ember

# Kernel autotune (on by default on hardware GPUs) would time candidates in every GEMM/conv test and write to the
# user's cache: the suite runs the heuristic's kernels unless EMBER_AUTOTUNE says otherwise; test_autotune.py
# turns tuning on explicitly.
os.environ.setdefault("EMBER_AUTOTUNE", "0")

BACKENDS = ember.available_backends()


_EXIT_STATUS = [0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS[0] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # The suite loads both WebGPU runtimes (wgpu-native and Dawn) and their Vulkan drivers into one process; their
    # C destructors at interpreter shutdown then run in no fixed order and have crashed the process (a segfault
    # after "N passed", once in four fresh-clone runs). Everything the tests assert is done here: leave without
    # the interpreter's teardown, keeping pytest's exit status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[0])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-long", action="store_true",
                     help="tests/fuzz: the long run (10k model and 10k feed cases per backend)")


# Models the tests build are written at IR version 10 unless a test says otherwise: a newer onnx writes its own
# latest IR (onnx 1.23: 14), which the onnxruntime builds the suite meets may not read yet (the lent GPU
# machine's: at most 13; onnxruntime 1.18, the oldest allowed, at most 10).
_make_model = onnx.helper.make_model


def _make_model_ir10(graph: onnx.GraphProto, **kwargs: object) -> onnx.ModelProto:
    kwargs.setdefault("ir_version", min(onnx.IR_VERSION, 10))
    return _make_model(graph, **kwargs)


onnx.helper.make_model = _make_model_ir10


@pytest.fixture(scope="session", params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def be(backend_name: str) -> ember.ComputeBackend:
    return ember.backend(backend_name)


@pytest.fixture
def rng() -> np.random.Generator:
    # Fresh inputs every run, on purpose; the seed is printed on failure through the test id's repr.
    return np.random.default_rng()


@pytest.fixture(scope="session")
def wgpu_be() -> ember.ComputeBackend:
    """The wgpu backend, for wgpu-only checks. The suite installs lavapipe where there is no GPU, so a machine
    without an adapter fails here rather than skipping GPU tests."""
    return ember.backend("wgpu")
