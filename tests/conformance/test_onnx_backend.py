"""ONNX's own backend test runner (`onnx.backend.test.BackendTest`) through ember's Backend API, cpu only.

`BackendTest(ember.onnx_backend, __name__)` builds one unittest method per ONNX test case and device; this file
publishes only the node cases of allowlist_cpu.txt on device "CPU" (class OnnxBackendNodeModelTest), so every
case ember is known to pass through its own harness (test_node_cases.py) must also pass through
`prepare(model, "CPU").run(inputs)` and the runner's own output comparison. A listed case that fails here is a
failure. Everything else is left out, not skipped: the other node cases (not passing, or not passed by ONNX
Runtime either), the "CUDA" copies (ember has no CUDA device), and the real/simple/pytorch model tests (the
runner downloads weights for those; nothing here may download). The runner marks the left-out methods skipped;
they are dropped from the class so pytest neither collects nor reports thousands of skips.

Keeping the lists current:
  * allowlist_cpu.txt is the source of truth, shared with test_node_cases.py; it grows with
        python tools/conformance.py --backend cpu --write-allowlist
    and this file picks up the new cases without any change.
  * onnx_backend_xfail_cpu.txt names allowlisted cases that pass ember's harness but not ONNX's runner (a
    difference between the two comparisons, e.g. an absent optional output the runner cannot compare). They
    run as expected failures (unittest.expectedFailure): one that starts passing fails as an unexpected success,
    so the list cannot go stale. Rebuild it (runs every allowlisted case through the runner, ~1 minute) with
        python -m tests.conformance.test_onnx_backend --write-xfail
    and look at each case it adds: a case that fails here and passes the harness may be an ember bug in the
    Backend API (positional inputs, output order) rather than a runner quirk.

Runtime: building the runner generates ONNX's node cases (~6 s, once per process, shared with the harness);
each case is one tiny model, so the ~1400 cases take about half a minute on the cpu backend.
"""

from __future__ import annotations

import argparse
import re
import sys
import unittest
import warnings
from collections.abc import Iterable

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.backend.test import BackendTest

import ember.onnx_backend as onnx_backend

from .harness import HERE, allowlist_path, read_names, write_names

DEVICE = "CPU"
SUFFIX = f"_{DEVICE.lower()}"  # the runner names a case's test for a device "<case>_<device>"
NODE_CLASS = "OnnxBackendNodeModelTest"
PASS_LIST = allowlist_path("cpu")
XFAIL_LIST = HERE / "onnx_backend_xfail_cpu.txt"
XFAIL_HEADER = (
    "Allowlisted cpu node cases (allowlist_cpu.txt) that pass ember's conformance harness but fail ONNX's own\n"
    "backend test runner through ember.onnx_backend (tests/conformance/test_onnx_backend.py runs them as\n"
    "expected failures). One case name a line, sorted. Rebuild with\n"
    "  python -m tests.conformance.test_onnx_backend --write-xfail"
)


def _exactly(names: Iterable[str]) -> str:
    """A regex matching exactly the runner's test names for `names` on DEVICE (one alternation: the runner tries
    every pattern on every one of its ~4000 tests)."""
    alternatives = "|".join(re.escape(n) for n in sorted(names))
    return rf"^(?:{alternatives}){re.escape(SUFFIX)}$"


def build_node_tests(names: list[str], xfails: list[str]) -> type[unittest.TestCase]:
    """The runner's node-case class holding a test for each of `names` on DEVICE, `xfails` as expected failures."""
    # Generating the cases computes overflowing casts and log(0) on purpose; those warnings are noise here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        runner = BackendTest(onnx_backend, __name__)
    runner.include(_exactly(names))
    if xfails:
        runner.xfail(_exactly(xfails))
    cls = runner.test_cases[NODE_CLASS]
    for attr, func in list(vars(cls).items()):
        if attr.startswith("test_") and getattr(func, "__unittest_skip__", False):
            delattr(cls, attr)  # not included, or a device ember lacks: left out rather than reported skipped
    return cls


def published_tests(cls: type[unittest.TestCase]) -> list[str]:
    """The test method names `cls` defines itself."""
    return sorted(a for a in vars(cls) if a.startswith("test_"))


PASSING = read_names(PASS_LIST)
XFAILS = read_names(XFAIL_LIST)

OnnxBackendNodeModelTest = build_node_tests(PASSING, XFAILS)


# ------------------------------------------------------------------------------------------ the lists


def test_every_listed_case_is_run() -> None:
    """Each allowlisted case is a runner test here (a name onnx dropped or renamed would silently vanish)."""
    assert len(PASSING) > 500, f"{PASS_LIST.name} is missing or truncated"
    published = published_tests(OnnxBackendNodeModelTest)
    expected = sorted(n + SUFFIX for n in PASSING)
    missing = sorted(set(expected) - set(published))
    assert not missing, f"allowlisted but not node tests of onnx's runner: {missing[:20]}"
    assert published == expected


def test_xfail_list_is_well_formed() -> None:
    assert XFAILS == sorted(set(XFAILS)), f"{XFAIL_LIST.name} must be sorted and free of duplicates"
    stray = sorted(set(XFAILS) - set(PASSING))
    assert not stray, f"in {XFAIL_LIST.name} but not in {PASS_LIST.name} (drop them): {stray}"


# ------------------------------------------------------------------------------------- the Backend API


def _relu_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node, helper.make_node("Neg", ["x"], ["z"])], "relu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_rep_runs_positional_and_named_inputs_in_output_order() -> None:
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    rep = onnx_backend.prepare(_relu_model(), DEVICE)
    y, z = rep.run([x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(z, -x)
    by_name = rep.run({"x": x})
    np.testing.assert_array_equal(by_name["z"], -x)
    np.testing.assert_array_equal(onnx_backend.run_model(_relu_model(), x)[0], y)
    with pytest.raises(ValueError, match="expected 1 input"):
        rep.run([x, x])


def test_run_node_infers_or_takes_output_types() -> None:
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = onnx_backend.run_node(node, [a, a])
    np.testing.assert_array_equal(c, a + a)
    assert c.dtype == np.int64
    (c,) = onnx_backend.run_node(node, [a, a], outputs_info=[(np.int64, (2, 3))], opset_version=13)
    np.testing.assert_array_equal(c, a + a)


def test_devices() -> None:
    assert onnx_backend.supports_device("CPU")
    assert onnx_backend.supports_device("CPU:0")
    assert not onnx_backend.supports_device("CUDA")  # the runner's second device: ember has none
    assert not onnx_backend.supports_device("TPU")
    assert onnx_backend.parse_device("WGPU:1") == ("wgpu", 1)
    assert onnx_backend.parse_device("GPU") == ("wgpu", None)
    with pytest.raises(ValueError, match="CUDA"):
        onnx_backend.prepare(_relu_model(), "CUDA")
    with pytest.raises(TypeError, match="unexpected keyword"):
        onnx_backend.prepare(_relu_model(), DEVICE, fusee=False)
    # The runner passes its per-test tolerances to prepare; they are accepted and ignored.
    assert onnx_backend.prepare(_relu_model(), DEVICE, rtol=1e-3, atol=1e-7).model.backend == "cpu"


def test_unsupported_op_raises_not_implemented() -> None:
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(NotImplementedError):
        onnx_backend.prepare(model, DEVICE)


# ----------------------------------------------------------------------------------- rebuilding the list


def failing_through_runner(names: list[str]) -> dict[str, str]:
    """Case name -> first line of the failure, for the cases of `names` that fail ONNX's runner (no xfails)."""
    cls = build_node_tests(names, [])
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = unittest.TestResult()
        suite.run(result)
    failed: dict[str, str] = {}
    for test, trace in [*result.failures, *result.errors]:
        name = test.id().rsplit(".", 1)[-1].removesuffix(SUFFIX)
        failed[name] = trace.strip().splitlines()[-1][:200]
    return failed


def main(argv: list[str] | None = None) -> int:
    """Report (or with --write-xfail, record) the allowlisted cases ONNX's runner fails through ember."""
    ap = argparse.ArgumentParser(description="Rebuild onnx_backend_xfail_cpu.txt")
    ap.add_argument("--write-xfail", action="store_true", help=f"rewrite {XFAIL_LIST.name}")
    args = ap.parse_args(argv)
    failed = failing_through_runner(PASSING)
    for name, reason in sorted(failed.items()):
        print(f"{name}: {reason}")
    print(f"{len(failed)} of {len(PASSING)} allowlisted cases fail through ONNX's runner")
    if args.write_xfail:
        added, dropped = sorted(set(failed) - set(XFAILS)), sorted(set(XFAILS) - set(failed))
        write_names(XFAIL_LIST, failed, XFAIL_HEADER)
        print(f"wrote {XFAIL_LIST.name}: added {added}, dropped {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
