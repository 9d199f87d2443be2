"""Run ONNX's own node conformance cases against an ember backend or against ONNX Runtime.

The cases come from `onnx.backend.test.case.node.collect_testcases`: one small model per case (one node,
or the node's function body for `*_expanded` cases) with one or more (inputs, expected outputs) data sets.
Outputs are compared the way onnx's backend test runner does (`onnx/backend/test/runner/__init__.py`,
`assert_similar_outputs`): same count, same shape, same dtype, then `np.testing.assert_allclose` with the
case's rtol/atol (every case in onnx 1.23 uses the runner's defaults, rtol=1e-3, atol=1e-7).

ember is imported lazily so ONNX Runtime's pass list can be built without a working ember.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.test_case import TestCase

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
ORT_PASSES_FILE = HERE / "ort_cpu_passes.txt"
CACHE_DIR = REPO_ROOT / ".cache"

# The onnx backend test runner's defaults; TestCase carries its own, these only back up a missing one.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

# A feed/output value: a tensor, a sequence of tensors, or None for an absent optional.
Value = Any
Runner = Callable[[Sequence[Value]], Sequence[Value]]


# ---------------------------------------------------------------------------------------------- cases


@functools.cache
def all_cases() -> dict[str, TestCase]:
    """Every node test case in the installed onnx, by name (sorted).

    Building them runs each op's reference code once (~6 s); collect_testcases keeps module-level state,
    so it must be called once per process, hence the cache.
    """
    from onnx.backend.test.case.node import collect_testcases

    # The case generators compute overflowing casts and log(0) on purpose; their warnings are noise here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return {c.name: c for c in sorted(cases, key=lambda c: c.name)}


def _node_op_type(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@functools.cache
def case_op_type(name: str) -> str:
    """The op type a case tests: its single node's, or for an `*_expanded` case its parent case's."""
    cases = all_cases()
    base = _EXPANDED.sub("", name)
    case = cases.get(base, cases[name])
    assert case.model is not None
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return _node_op_type(nodes[0])
    # No single-node parent: name it by the distinct op types it uses.
    return "+".join(sorted({_node_op_type(n) for n in nodes}))


def graph_input_names(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that are real feeds: old IRs list initializers as inputs too."""
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def graph_output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def _normalize(value: Value) -> Value:
    # Case data may hold TensorProto (float8, int4, ...) and lists for sequence types.
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, np.generic):  # scalar inputs such as a window length: feed them as 0-d tensors
        return np.asarray(value)
    return value


def case_data(case: TestCase) -> list[tuple[list[Value], list[Value]]]:
    assert case.data_sets is not None
    return [([_normalize(x) for x in ins], [_normalize(y) for y in outs]) for ins, outs in case.data_sets]


# ----------------------------------------------------------------------------------------- comparing


def assert_similar_outputs(
    expected: Sequence[Value], actual: Sequence[Value], rtol: float, atol: float
) -> None:
    """onnx's runner comparison: count, shape, dtype, then allclose (bfloat16 gets two ULPs of rtol)."""
    assert len(actual) == len(expected), f"got {len(actual)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, actual, strict=True)):
        if isinstance(ref, (list, tuple)):
            assert isinstance(out, (list, tuple)), (
                f"output {i}: expected a sequence, got {type(out).__name__}"
            )
            assert_similar_outputs(ref, out, rtol, atol)
            continue
        if ref is None:
            assert out is None, f"output {i}: expected an absent optional, got {type(out).__name__}"
            continue
        assert isinstance(out, np.ndarray) or np.isscalar(out), f"output {i}: got {type(out).__name__}"
        out = np.asarray(out)
        assert out.shape == ref.shape, f"output {i}: shape {out.shape}, expected {ref.shape}"
        if ref.dtype == object:  # strings
            np.testing.assert_array_equal(out, ref, err_msg=f"output {i}")
            continue
        assert out.dtype == ref.dtype, f"output {i}: dtype {out.dtype}, expected {ref.dtype}"
        out_rtol = rtol
        if out.dtype.name == "bfloat16":  # numpy cannot promote ml_dtypes' bfloat16 with a Python float
            out_rtol = max(rtol, 2**-6)
            out, ref = out.astype(np.float32), ref.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=out_rtol, atol=atol, err_msg=f"output {i}")


def check_with(case: TestCase, make_runner: Callable[[onnx.ModelProto], Runner]) -> None:
    """Raise unless every data set of `case` comes out right through the runner `make_runner` builds."""
    assert case.model is not None
    runner = make_runner(case.model)
    rtol = case.rtol if case.rtol is not None else DEFAULT_RTOL
    atol = case.atol if case.atol is not None else DEFAULT_ATOL
    for inputs, expected in case_data(case):
        assert_similar_outputs(expected, list(runner(inputs)), rtol, atol)


def _outcome(check: Callable[[], None]) -> tuple[bool, str]:
    """(ok, reason) from a check; the reason's first word says the kind of failure."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            check()
    except NotImplementedError as e:
        return False, f"unsupported: {_first_line(e)}"
    except AssertionError as e:
        return False, f"mismatch: {_first_line(e)}"
    except Exception as e:  # a harness must survive any runtime bug and report it
        return False, f"error: {type(e).__name__}: {_first_line(e)}"
    return True, "ok"


def _first_line(e: BaseException) -> str:
    # assert_allclose's message opens with the header; keep it and the lines that say how far off it was.
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    extra = [ln for ln in lines[1:] if ln.startswith(("output ", "Mismatched", "Max absolute"))]
    return "; ".join([lines[0], *extra])[:300]


# ------------------------------------------------------------------------------------------- ember


def ember_runner(backend: str) -> Callable[[onnx.ModelProto], Runner]:
    def make(model: onnx.ModelProto) -> Runner:
        import ember

        loaded = ember.load_onnx(model, backend=backend)
        in_names = graph_input_names(model)
        out_names = graph_output_names(model)

        def run(inputs: Sequence[Value]) -> list[Value]:
            # Case data holds one value per graph input, in graph-input order.
            result = loaded.run(dict(zip(in_names, inputs, strict=True)))
            missing = [n for n in out_names if n not in result]
            if missing:  # an API fault, not a numeric mismatch
                raise RuntimeError(f"run() returned no {missing}; it returned {sorted(result)}")
            return [result[n] for n in out_names]

        return run

    return make


def check_case(case: TestCase, backend: str) -> None:
    """Raise (NotImplementedError, AssertionError, anything) unless ember's `backend` passes `case`."""
    check_with(case, ember_runner(backend))


def run_case(case: TestCase, backend: str) -> tuple[bool, str]:
    """(ok, reason) for one case on one ember backend; reason starts with unsupported/mismatch/error."""
    return _outcome(lambda: check_case(case, backend))


# -------------------------------------------------------------------------------------- onnxruntime


def ort_runner(model: onnx.ModelProto) -> Runner:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # ORT logs every rejected model at error level; the reason is raised anyway
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]

    def run(inputs: Sequence[Value]) -> list[Value]:
        return list(sess.run(None, dict(zip(in_names, inputs, strict=False))))

    return run


def run_case_ort(case: TestCase) -> tuple[bool, str]:
    """(ok, reason) for one case on ONNX Runtime's CPU provider, compared like an ember run."""
    return _outcome(lambda: check_with(case, ort_runner))


def ort_passing_cases(cases: Iterable[TestCase] | None = None) -> list[str]:
    """Names (sorted) of the cases ONNX Runtime CPU passes; ~1 minute for all of them."""
    chosen = all_cases().values() if cases is None else cases
    return sorted(c.name for c in chosen if run_case_ort(c)[0])


# ------------------------------------------------------------------------------------- name lists


def read_names(path: Path) -> list[str]:
    """Names one a line; '#' starts a comment; a missing file is an empty list."""
    if not path.exists():
        return []
    names = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [n for n in names if n]


def write_names(path: Path, names: Iterable[str], header: str) -> None:
    lines = [f"# {h}" if h else "#" for h in header.strip().splitlines()]
    path.write_text("\n".join([*lines, *sorted(set(names))]) + "\n")


def allowlist_path(backend: str) -> Path:
    return HERE / f"allowlist_{backend}.txt"


def allowlist_header(backend: str, misses: Mapping[str, str] | None = None) -> str:
    """The allowlist's comment block; `misses`: the cases ONNX Runtime CPU passes and this backend does not, each
    with the first line of why (listed so a miss is a known, explained gap rather than a silent one)."""
    text = (
        f"ONNX node conformance cases (onnx.backend.test.case.node) the `{backend}` backend must pass.\n"
        "One case name a line, sorted. Only cases ONNX Runtime CPU also passes (ort_cpu_passes.txt) belong\n"
        "here. tests/conformance/test_node_cases.py runs each of them; regenerate with\n"
        f"  python tools/conformance.py --backend {backend} --write-allowlist"
    )
    if misses:
        text += f"\n\n{len(misses)} case(s) ONNX Runtime CPU passes that `{backend}` does not, and why:\n"
        text += "\n".join(f"  {n}: {' '.join(r.split())[:150]}" for n, r in sorted(misses.items()))
    return text


ORT_PASSES_HEADER = (
    "ONNX node conformance cases ONNX Runtime's CPU provider passes with the harness's comparison\n"
    "(tests/conformance/harness.py). Only these may enter an allowlist: a case ORT fails is usually a\n"
    "case whose expected data or opset is newer than any runtime implements. Regenerate with\n"
    "  python tools/conformance.py --write-ort-passes"
)


def ort_passes() -> list[str]:
    return read_names(ORT_PASSES_FILE)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0
