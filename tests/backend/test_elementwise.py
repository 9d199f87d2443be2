"""Elementwise ops on every backend against float64 numpy oracles (fresh random inputs every run).

Results must be what numpy gives in float32: special values (log(0) = -inf, sqrt(-1) = NaN, NaN through
max/min, overflow to inf) exactly, finite values within TOL of max |ref|.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.backends.base import View
from ember.core.expr import BOOL, INT, call, const, inp

from .helpers import download, poisoned, rel_err, upload

TOL = 1e-5
F32 = np.dtype(np.float32)
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e-3, -1e-3, 7.0,
                     -7.0, 100.0, -100.0, np.inf, -np.inf, np.nan], np.float64)
SIZES = [1, 3, 17, 129, 100_003]
BIG = 65_535 * 256 + 1_000  # more workgroups of 256 than one grid dimension holds

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f32(x: np.ndarray) -> np.ndarray:
    """A float64 result as numpy float32 holds it (overflow to inf, underflow to 0)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return x.astype(np.float32).astype(np.float64)


UNARY_REF = {
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "neg": np.negative,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "erf": _erf,
    "reciprocal": lambda x: 1.0 / x,
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "ceil": np.ceil,
    "sign": np.sign,
}
BINARY_REF = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}


def close(got: np.ndarray, ref: np.ndarray, floor: float = 1.0) -> float:
    """rel_err with the scale floored at `floor`: a 1- or 3-element array whose results all lie deep in a
    function's tail (gelu(-7) ~ -3e-15, cos near a zero) is judged on the function's own scale, since a
    float32 kernel (numpy's included) is exact there only to about eps absolute."""
    err = rel_err(got, ref)
    finite = np.isfinite(ref)
    if err == float("inf") or not finite.any():
        return err
    scale = np.abs(ref[finite]).max()
    return err * scale / max(scale, floor) if scale > 0 else float(np.abs(got[finite]).max() / floor)


def unary_ref(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _f32(UNARY_REF[op](np.asarray(x, np.float32).astype(np.float64)))


def binary_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _f32(BINARY_REF[op](np.asarray(a, np.float32).astype(np.float64),
                                   np.asarray(b, np.float32).astype(np.float64)))


def run_unary(be: ember.ComputeBackend, op: object, x: np.ndarray) -> np.ndarray:
    hx, ho = upload(be, x), poisoned(be, x.size)
    try:
        be.unary(op, hx, ho, x.size)
        return download(be, ho, x.shape)
    finally:
        be.free(hx)
        be.free(ho)


def run_binary(be: ember.ComputeBackend, op: object, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ha, hb, ho = upload(be, a), upload(be, b), poisoned(be, a.size)
    try:
        be.binary(op, ha, hb, ho, a.size)
        return download(be, ho, a.shape)
    finally:
        for h in (ha, hb, ho):
            be.free(h)


def unary_inputs(rng: np.random.Generator, op: str, n: int) -> np.ndarray:
    if op in ("exp", "sigmoid", "tanh", "gelu", "erf"):
        x = rng.uniform(-10, 10, n)
    elif op in ("sin", "cos"):
        x = rng.uniform(-8, 8, n)
    else:
        x = rng.standard_normal(n) * 4  # log and sqrt get negatives too: NaN positions must match
    return x.astype(np.float32)


# ---- unary -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [o.value for o in ember.UnaryOp])
def test_unary_specials(be: ember.ComputeBackend, op: str) -> None:
    x = SPECIALS.astype(np.float32)
    got, ref = run_unary(be, op, x), unary_ref(op, x)
    assert rel_err(got, ref) <= TOL, list(zip(x.tolist(), got.tolist(), ref.tolist(), strict=True))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", [o.value for o in ember.UnaryOp])
def test_unary_sizes(be: ember.ComputeBackend, rng: np.random.Generator, op: str, n: int) -> None:
    x = unary_inputs(rng, op, n)
    got, ref = run_unary(be, op, x), unary_ref(op, x)
    assert close(got, ref) <= TOL, (op, n, x[:3], got[:3], ref[:3])


def test_unary_op_spellings(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    x = rng.standard_normal(33).astype(np.float32)
    ref = unary_ref("relu", x)
    for op in ("relu", "RELU", "Relu", ember.UnaryOp.RELU):
        assert rel_err(run_unary(be, op, x), ref) == 0.0, op


def test_unary_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    x = rng.standard_normal(BIG).astype(np.float32)
    got = run_unary(be, "neg", x)
    np.testing.assert_array_equal(got, -x)


# ---- binary ------------------------------------------------------------------------------------------
def mismatches(a: np.ndarray, b: np.ndarray, got: np.ndarray, ref: np.ndarray) -> list[tuple]:
    """The (a, b, got, ref) quadruples that break the rel_err rule, for failure messages."""
    finite = np.isfinite(ref)
    scale = np.abs(ref[finite]).max() if finite.any() else 1.0
    with np.errstate(invalid="ignore"):
        ok = (got == ref) | (np.isnan(got) & np.isnan(ref)) | (finite & (np.abs(got - ref) <= TOL * scale))
    return list(zip(a[~ok], b[~ok], got[~ok], ref[~ok], strict=True))


@pytest.mark.parametrize("op", [o.value for o in ember.BinaryOp])
def test_binary_specials(be: ember.ComputeBackend, op: str) -> None:
    a, b = np.meshgrid(SPECIALS, SPECIALS, indexing="ij")
    a, b = a.ravel().astype(np.float32), b.ravel().astype(np.float32)
    got, ref = run_binary(be, op, a, b), binary_ref(op, a, b)
    assert rel_err(got, ref) <= TOL, [tuple(map(float, m)) for m in mismatches(a, b, got, ref)]


def binary_inputs(rng: np.random.Generator, op: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = rng.standard_normal(n) * 4, rng.standard_normal(n) * 4
    if op == "pow":
        a = rng.uniform(0.05, 4, n)
        b = rng.uniform(-4, 4, n)
        neg = rng.random(n) < 0.3  # negative bases: integer exponents, and some x.5 ones (NaN)
        a[neg] *= -1
        b[neg] = np.round(b[neg]) + np.where(rng.random(int(neg.sum())) < 0.8, 0.0, 0.5)
    if op in ("max", "min"):
        a[rng.random(n) < 0.05] = np.nan
        b[rng.random(n) < 0.1] = np.nan
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", [o.value for o in ember.BinaryOp])
def test_binary_sizes(be: ember.ComputeBackend, rng: np.random.Generator, op: str, n: int) -> None:
    a, b = binary_inputs(rng, op, n)
    got, ref = run_binary(be, op, a, b), binary_ref(op, a, b)
    assert close(got, ref) <= TOL, (op, n, a[:3], b[:3], got[:3], ref[:3])


def test_binary_op_spellings(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    a, b = rng.standard_normal(10).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    for op in ("add", "ADD", ember.BinaryOp.ADD):
        assert rel_err(run_binary(be, op, a, b), binary_ref("add", a, b)) <= TOL, op


def test_binary_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    a = rng.standard_normal(BIG).astype(np.float32)
    b = rng.standard_normal(BIG).astype(np.float32)
    got = run_binary(be, "add", a, b)
    np.testing.assert_array_equal(got, a + b)  # float32 addition is exact-rounded on both backends


def test_in_place(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """The output may be an input: out = out * b."""
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    ha, hb = upload(be, a), upload(be, b)
    try:
        be.binary("mul", ha, hb, ha, a.size)
        be.unary("neg", ha, ha, a.size)
        got = download(be, ha, a.shape)
    finally:
        be.free(ha)
        be.free(hb)
    assert rel_err(got, -(a.astype(np.float64) * b)) <= TOL


# ---- record_elementwise: broadcasting, strides, int and bool ------------------------------------------
def put(be: ember.ComputeBackend, a: np.ndarray, extra: int = 0) -> int:
    """An allocation holding `a` (logical dtype), with room for `extra` more elements."""
    n = a.size + extra
    h = be.alloc(max(n, 1) * be.storage_itemsize(a.dtype) + 16)
    full = np.concatenate([a.ravel(), np.zeros(extra, a.dtype)]) if extra else a.ravel()
    be.upload(h, np.ascontiguousarray(full))
    return h


def poisoned_like(be: ember.ComputeBackend, ref: np.ndarray) -> int:
    """An output allocation holding values the result must overwrite everywhere."""
    if ref.dtype == np.bool_:
        return put(be, ~ref)
    if ref.dtype.kind in "iu":
        return put(be, (ref + 12345).astype(ref.dtype))
    return put(be, np.full(ref.shape, np.nan, ref.dtype))


def run_expr(be: ember.ComputeBackend, expr: object, views: list[View], ref: np.ndarray,
             handles: list[int]) -> np.ndarray:
    ho = poisoned_like(be, ref)
    handles.append(ho)
    out = View.contiguous(ho, ref.dtype, ref.shape)
    be.execute(be.record_elementwise(expr, views, out))
    return be.download(out)


@pytest.fixture
def handles(be: ember.ComputeBackend):
    hs: list[int] = []
    yield hs
    for h in hs:
        be.free(h)


def test_broadcast_and_strides_float(be: ember.ComputeBackend, rng: np.random.Generator,
                                     handles: list[int]) -> None:
    shape = (3, 4, 5)
    a = rng.standard_normal((3, 1, 5)).astype(np.float32)  # broadcast over dim 1
    b = rng.standard_normal((5, 4, 3)).astype(np.float32)  # used transposed
    c = np.array([0.75], np.float32)  # a scalar broadcast everywhere
    ha, hb, hc = put(be, a), put(be, b), put(be, c)
    handles += [ha, hb, hc]
    va = View.contiguous(ha, F32, a.shape).broadcast_to(shape)
    vb = View.contiguous(hb, F32, b.shape).permute((2, 1, 0))
    vc = View(hc, F32, shape, (0, 0, 0))
    x, y, z = inp(0), inp(1), inp(2)
    expr = call("where", call("gt", x, y), call("add", x, call("mul", y, z)), call("sub", call("max", x, y), z))
    a64, b64 = a.astype(np.float64), b.astype(np.float64).transpose(2, 1, 0)
    ref = np.where(a64 > b64, a64 + b64 * 0.75, np.maximum(a64, b64) - 0.75)
    got = run_expr(be, expr, [va, vb, vc], ref.astype(np.float32), handles)
    assert rel_err(got, ref) <= TOL


def test_offset_and_slice(be: ember.ComputeBackend, rng: np.random.Generator, handles: list[int]) -> None:
    base = rng.standard_normal(200).astype(np.float32)
    hb = put(be, base)
    handles.append(hb)
    # rows 2..6 of a (10, 20) matrix, every other column from 1: offset 41, strides (20, 2)
    v = View(hb, F32, (5, 9), (20, 2), 41)
    ref = np.exp(base.reshape(10, 20)[2:7, 1:19:2].astype(np.float64))
    got = run_expr(be, call("exp", inp(0)), [v], ref.astype(np.float32), handles)
    assert rel_err(got, ref) <= TOL


def test_int_exprs(be: ember.ComputeBackend, rng: np.random.Generator, handles: list[int]) -> None:
    i64 = np.dtype(np.int64)
    a = rng.integers(-50, 50, (4, 6)).astype(np.int64)
    b = rng.integers(1, 9, (6,)).astype(np.int64) * rng.choice([-1, 1], 6)
    ha, hb = put(be, a, extra=3), put(be, b)
    handles += [ha, hb]
    # `a` read through an offset view: the allocation holds 3 leading zeros
    be.upload(ha, np.concatenate([np.zeros(3, np.int64), a.ravel()]))
    va = View.contiguous(ha, i64, a.shape, offset=3)
    vb = View.contiguous(hb, i64, b.shape).broadcast_to(a.shape)
    x, y = inp(0, INT), inp(1, INT)
    expr = call("add", call("mul", call("mod", x, y), const(3, INT)), call("div", x, y))  # div truncates
    ref = np.mod(a, b) * 3 + np.trunc(a / b).astype(np.int64)
    got = run_expr(be, expr, [va, vb], ref, handles)
    np.testing.assert_array_equal(got, ref)
    expr2 = call("where", call("lt", x, y), call("max", x, y), call("neg", call("abs", x)))
    ref2 = np.where(a < b, np.maximum(a, b), -np.abs(a))
    np.testing.assert_array_equal(run_expr(be, expr2, [va, vb], ref2, handles), ref2)


def test_casts(be: ember.ComputeBackend, rng: np.random.Generator, handles: list[int]) -> None:
    f = (rng.standard_normal(300) * 20).astype(np.float32)
    f[:4] = [2.5, -2.5, 0.0, -0.999]
    hf = put(be, f)
    handles.append(hf)
    vf = View.contiguous(hf, F32, f.shape)
    # float -> int truncates toward zero
    ref_i = np.trunc(f).astype(np.int64)
    np.testing.assert_array_equal(run_expr(be, call("to_int", inp(0)), [vf], ref_i, handles), ref_i)
    # float -> bool, and int -> float through a comparison of ints
    ref_b = f != 0
    np.testing.assert_array_equal(run_expr(be, call("to_bool", inp(0)), [vf], ref_b, handles), ref_b)
    expr = call("to_float", call("mul", call("to_int", inp(0)), const(2, INT)))
    ref_f = (np.trunc(f) * 2).astype(np.float32)
    np.testing.assert_array_equal(run_expr(be, expr, [vf], ref_f, handles), ref_f)


def test_bool_exprs(be: ember.ComputeBackend, rng: np.random.Generator, handles: list[int]) -> None:
    shape = (7, 9)
    a = rng.standard_normal(shape).astype(np.float32)
    a[0, :3] = [np.nan, np.inf, -np.inf]
    m = rng.random((1, 9)) < 0.5  # a bool mask broadcast over rows
    ha, hm = put(be, a), put(be, m)
    handles += [ha, hm]
    va = View.contiguous(ha, F32, shape)
    vm = View.contiguous(hm, np.dtype(np.bool_), m.shape).broadcast_to(shape)
    x, mask = inp(0), inp(1, BOOL)
    expr = call("or", call("and", mask, call("ge", x, const(0.0))), call("isnan", x))
    ref = (m & (a >= 0)) | np.isnan(a)
    np.testing.assert_array_equal(run_expr(be, expr, [va, vm], ref, handles), ref)
    expr2 = call("where", call("not", mask), call("to_float", mask), call("relu", x))
    with np.errstate(invalid="ignore"):
        ref2 = np.where(~m, m.astype(np.float32), np.where(a < 0, 0, a)).astype(np.float32)
    got2 = run_expr(be, expr2, [va, vm], ref2, handles)
    assert rel_err(got2, ref2) == 0.0
    # comparisons of bools, and bools to int
    expr3 = call("to_int", call("eq", mask, call("lt", x, const(0.0))))
    ref3 = (m == (a < 0)).astype(np.int64)
    np.testing.assert_array_equal(run_expr(be, expr3, [va, vm], ref3, handles), ref3)


def test_broadcast_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator,
                                   handles: list[int]) -> None:
    """A broadcast add whose output needs a 2-D grid: row vector + column vector."""
    rows, cols = 4099, 4099  # 16.8M outputs > 65,535 * 256
    r = rng.standard_normal((rows, 1)).astype(np.float32)
    c = rng.standard_normal((1, cols)).astype(np.float32)
    hr, hc = put(be, r), put(be, c)
    handles += [hr, hc]
    shape = (rows, cols)
    views = [View.contiguous(hr, F32, r.shape).broadcast_to(shape),
             View.contiguous(hc, F32, c.shape).broadcast_to(shape)]
    ref = r + c
    got = run_expr(be, call("sub", inp(0), call("neg", inp(1))), views, ref, handles)
    np.testing.assert_array_equal(got, ref)
