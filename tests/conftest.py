"""Shared fixtures: every backend test runs once per available backend (ids 'cpu' and 'wgpu')."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ember

# Kernel autotune (on by default on hardware GPUs) would time candidates in every GEMM/conv test and write to the
# user's cache: the suite runs the heuristic's kernels unless EMBER_AUTOTUNE says otherwise; test_autotune.py
# turns tuning on explicitly.
os.environ.setdefault("EMBER_AUTOTUNE", "0")

BACKENDS = ember.available_backends()


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
