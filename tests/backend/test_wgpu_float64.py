"""float64 on the wgpu backend: double-float (df64) storage and arithmetic against float64 numpy.

A float64 element is stored as two f32 words (hi, lo). Inputs here are values the format holds exactly
(hi + lo), so every error measured is the kernels' own: add/sub/mul/div/sqrt, the reductions and scans, exp and
log are held to 1e-13 relative per element (df64's operations are ~2^-48 ≈ 3.6e-15: kernels/df64.wgsl); casts,
comparisons, min/max, floor/ceil/round/trunc and data movement are exact; fmod/mod to 1e-13 of max(|a|, |b|)
(the long division's remainders can need a bit more than df64's ~49: ~2^-48 |a| absolute, however large a / b).
Results past f32's exponent range overflow to inf or underflow (no float64 subnormals): documented, and excluded
from the accuracy checks.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ember
from ember.backends.base import View
from ember.core.expr import BOOL, FLOAT, INT, Expr, call, const, inp, load

F64, F32, F16, I64 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)
TOL = 1e-13


def representable(x: np.ndarray) -> np.ndarray:
    """x rounded to what df64 storage holds: hi = f32(x), lo = f32(x - hi), the value hi + lo."""
    with np.errstate(all="ignore"):
        hi = np.asarray(x, F64).astype(F32).astype(F64)
        lo = np.where(np.isfinite(hi), np.asarray(x, F64) - hi, 0.0).astype(F32).astype(F64)
        return np.where(np.isfinite(hi), hi + lo, hi)


def values(rng: np.random.Generator, n: int, lo_exp: int = -20, hi_exp: int = 20) -> np.ndarray:
    """Random signs and magnitudes 10^lo_exp .. 10^hi_exp, full 53-bit mantissas before rounding to df64."""
    x = rng.uniform(1, 10, n) * 10.0 ** rng.integers(lo_exp, hi_exp, n) * rng.choice([-1.0, 1.0], n)
    return representable(x)


SPECIALS = representable(np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, 1e30, -1e-30, 7.0,
                                  -7.0]))


def rel(got: np.ndarray, ref: np.ndarray, scale: np.ndarray | None = None) -> float:
    """Max elementwise |got - ref| / |scale| (default |ref|); NaN and infinities must match exactly."""
    got, ref = np.asarray(got, F64), np.asarray(ref, F64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    special = ~np.isfinite(ref)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[special & ~np.isnan(ref)], ref[special & ~np.isnan(ref)])
    finite = ~special
    if not finite.any():
        return 0.0
    s = np.abs(ref if scale is None else np.broadcast_to(scale, ref.shape))[finite]
    d = np.abs(got[finite] - ref[finite])
    return float(np.max(np.where(s > 0, d / np.where(s > 0, s, 1.0), d)))


class Dev:
    """Allocations on a backend, freed at the end of a test."""

    def __init__(self, be: ember.ComputeBackend) -> None:
        self.be, self.handles = be, []

    def put(self, x: np.ndarray) -> View:
        x = np.ascontiguousarray(x)
        h = self.be.alloc(max(x.size, 1) * self.be.storage_itemsize(x.dtype) + 16)
        self.handles.append(h)
        if x.size:
            self.be.upload(h, x)
        return View.contiguous(h, x.dtype, x.shape)

    def empty(self, dtype: np.dtype, shape: tuple[int, ...]) -> View:
        fill = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype)  # poison: unwritten shows
        return self.put(fill)

    def get(self, v: View) -> np.ndarray:
        return self.be.download(v)

    def free(self) -> None:
        for h in self.handles:
            self.be.free(h)


@pytest.fixture
def dev(wgpu_be: ember.ComputeBackend):
    d = Dev(wgpu_be)
    yield d
    d.free()


def run_expr(dev: Dev, expr: Expr, inputs: list[np.ndarray], out_dtype: np.dtype) -> np.ndarray:
    shape = np.broadcast_shapes(*(x.shape for x in inputs))
    views = [dev.put(x).broadcast_to(shape) for x in inputs]
    out = dev.empty(out_dtype, shape)
    dev.be.execute(dev.be.record_elementwise(expr, views, out))
    return dev.get(out)


def kind(x: np.ndarray) -> str:
    return {"f": FLOAT, "i": INT, "b": BOOL}[x.dtype.kind]


# ---- storage ------------------------------------------------------------------------------------------------
def test_round_trip_is_exact_for_representable_values(dev: Dev, rng: np.random.Generator) -> None:
    x = np.concatenate([values(rng, 5000, -35, 35), SPECIALS, representable(np.array([np.pi, -np.e, 1 / 3]))])
    got = dev.get(dev.put(x))
    assert got.dtype == F64
    np.testing.assert_array_equal(got, x)
    assert np.array_equal(np.signbit(got), np.signbit(x))  # -0.0 stays -0.0


def test_round_trip_of_arbitrary_float64_is_within_2_pow_minus_48(dev: Dev, rng: np.random.Generator) -> None:
    x = rng.standard_normal(4000) * 10.0 ** rng.integers(-25, 25, 4000)  # lo stays a normal f32
    assert rel(dev.get(dev.put(x)), x) <= 2.0**-48


def test_upload_past_float32_range_is_a_value_error(dev: Dev) -> None:
    with pytest.raises(ValueError, match=r"float64 tensor value 1(\.0*1)?e\+300 exceeds float32's range"):
        dev.put(np.array([1.0, -1e300, 1e300]))
    with pytest.raises(ValueError, match="float32's range"):
        dev.put(np.array([3.5e38]))
    np.testing.assert_array_equal(dev.get(dev.put(np.array([3.4e38, -3.4e38]))), representable([3.4e38, -3.4e38]))


# ---- elementwise ---------------------------------------------------------------------------------------------
def pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = values(rng, n, -15, 15), values(rng, n, -15, 15)
    near = rng.random(n) < 0.2  # near-cancelling pairs: a - b loses most of its leading bits
    b[near] = representable(a[near] * (1 + rng.uniform(-1e-9, 1e-9, near.sum())))
    s = np.repeat(SPECIALS, len(SPECIALS))
    t = np.tile(SPECIALS, len(SPECIALS))
    return np.concatenate([a, s]), np.concatenate([b, t])


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                    ("div", np.divide)])
def test_arithmetic(dev: Dev, rng: np.random.Generator, op: str, ref) -> None:
    a, b = pairs(rng, 3000)
    with np.errstate(all="ignore"):
        want = ref(a, b)
    ok = (np.abs(want) < 3e38) & ((np.abs(want) > 1e-30) | (want == 0))  # f32's exponent range (documented)
    got = run_expr(dev, call(op, inp(0), inp(1)), [a, b], F64)
    assert rel(got[ok | ~np.isfinite(want)], want[ok | ~np.isfinite(want)]) <= TOL


@pytest.mark.parametrize("op,ref", [("max", np.maximum), ("min", np.minimum)])
def test_max_min_propagate_nan(dev: Dev, rng: np.random.Generator, op: str, ref) -> None:
    a, b = pairs(rng, 2000)
    got = run_expr(dev, call(op, inp(0), inp(1)), [a, b], F64)
    np.testing.assert_array_equal(got, ref(a, b))


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_are_exact(dev: Dev, rng: np.random.Generator, op: str) -> None:
    a, b = pairs(rng, 1000)
    close = rng.random(a.size) < 0.3  # equal hi, different lo: only lo decides
    b[close] = representable(a[close] + np.where(rng.random(close.sum()) < 0.5, 1, -1) * np.abs(a[close]) * 2e-12)
    b[:50] = a[:50]
    got = run_expr(dev, call(op, inp(0), inp(1)), [a, b], np.dtype(bool))
    want = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal}[op](a, b)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["fmod", "mod"])
def test_fmod_and_mod(dev: Dev, rng: np.random.Generator, op: str) -> None:
    a, b = values(rng, 3000, -5, 5), values(rng, 3000, -5, 5)
    big = rng.random(a.size) < 0.3  # quotients up to 1e30: a single a - b * trunc(a / b) would lose every bit
    a[big] = representable(a[big] * 10.0 ** rng.integers(5, 25, big.sum()))
    ties = np.array([6.0, -6.0, 7.5, -7.5, 0.0, -0.0, 5.0, 1e20, np.inf, np.nan, 3.0, -3.0, 4.0, 2.0])
    by = np.array([3.0, 3.0, -2.5, 2.5, 2.0, -2.0, np.inf, np.inf, 2.0, 1.0, 0.0, np.inf, -np.inf, np.nan])
    a, b = np.concatenate([a, ties]), np.concatenate([b, by])
    with np.errstate(all="ignore"):
        want = np.fmod(a, b) if op == "fmod" else np.mod(a, b)
    got = run_expr(dev, call(op, inp(0), inp(1)), [a, b], F64)
    scale = np.maximum(np.abs(a), np.abs(b))
    small = np.abs(a / b) < 1e3
    assert rel(got[small], want[small], scale=scale[small]) <= TOL
    # Past a quotient of ~2^40 the rounding of ~2^-48 |a| can reach a remainder near 0 or |b| across the wrap:
    # the answer is then right modulo b (one |b| away), still in range and signed as the reference.
    with np.errstate(invalid="ignore"):
        wrapped = np.isfinite(want) & (np.abs(got - want) > np.abs(b) / 2)
    unwrapped = np.where(wrapped, got - np.sign(got - want) * np.abs(b), got)
    assert rel(unwrapped, want, scale=scale) <= TOL
    finite = np.isfinite(a) & np.isfinite(b) & (b != 0)
    assert np.all(np.abs(got[finite]) <= np.abs(b[finite]))
    signed = finite & (got != 0)
    np.testing.assert_array_equal(np.signbit(got[signed]), np.signbit(a if op == "fmod" else b)[signed])
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))  # numpy's signed zeros


@pytest.mark.parametrize("op", ["neg", "abs", "floor", "ceil", "round", "sign", "relu"])
def test_exact_unary(dev: Dev, rng: np.random.Generator, op: str) -> None:
    x = np.concatenate([values(rng, 2000, -3, 12), SPECIALS, [2.5, -2.5, 0.5, -0.5, 1.5, 3.5, -4.5],
                        representable(np.array([2.0**30 + 0.5, 2.0**40 + 1.5, -(2.0**40) - 0.5, 2.0**45 + 0.25]))])
    ref = {"neg": np.negative, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round,
           "sign": np.sign, "relu": lambda v: np.where(v < 0, 0.0, v)}[op]
    np.testing.assert_array_equal(run_expr(dev, call(op, inp(0)), [x], F64), ref(x))


@pytest.mark.parametrize("op", ["sqrt", "reciprocal", "exp", "log"])
def test_math_functions(dev: Dev, rng: np.random.Generator, op: str) -> None:
    if op == "exp":
        x = representable(rng.uniform(-69, 88, 3000))  # results from 1e-30: lo stays a normal f32
        x = np.concatenate([x, representable(rng.uniform(-1e-6, 1e-6, 200)), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    elif op == "log":
        x = np.concatenate([values(rng, 2000, -30, 30), representable(1 + rng.uniform(-1e-6, 1e-6, 500)),
                            [1.0, 0.0, -1.0, np.inf, np.nan, 2.0, 0.5]])
        x = np.abs(x) * np.where(np.arange(x.size) < x.size - 7, 1, np.sign(x) + (x == 0))
    else:
        x = np.concatenate([values(rng, 3000, -15, 15), SPECIALS])
    with np.errstate(all="ignore"):
        want = {"sqrt": np.sqrt, "reciprocal": np.reciprocal, "exp": np.exp, "log": np.log}[op](x)
    got = run_expr(dev, call(op, inp(0)), [x], F64)
    assert rel(got, want) <= TOL
    if op == "exp":  # past f32's exponent range: inf and 0, not float64's 7e86 and 1e-87
        np.testing.assert_array_equal(run_expr(dev, call("exp", inp(0)), [np.array([200.0, -200.0])], F64), [np.inf, 0])


def test_unsupported_float64_op_fails_at_plan_time(dev: Dev) -> None:
    x = dev.put(np.ones(4))
    with pytest.raises(NotImplementedError, match=r"'sin' on float64 operands"):
        dev.be.record_elementwise(call("sin", inp(0)), [x], dev.empty(F64, (4,)))
    # Also when the result is stored as float32: the math would have been float64's.
    with pytest.raises(NotImplementedError, match=r"'tanh' on float64"):
        dev.be.record_elementwise(call("tanh", inp(0)), [x], dev.empty(F32, (4,)))


# ---- casts and mixed dtypes ------------------------------------------------------------------------------------
def test_cast_float64_to_float32_and_float16_round_like_numpy(dev: Dev, rng: np.random.Generator) -> None:
    x = np.concatenate([values(rng, 3000, -9, 6), SPECIALS, [70000.0, 65519.0, 65520.0, -65520.0, 1e-8, 3e-8]])
    # float16 midpoints nudged by less than an f32 ulp: hi lands exactly on the midpoint, lo decides.
    mids = (rng.integers(1024, 2047, 300) + 0.5) * 2.0 ** rng.integers(-24, 5, 300)
    nudge = mids * 2.0**-30 * rng.choice([-1.0, 0.0, 1.0], 300)
    x = np.concatenate([x, representable(mids + nudge), -representable(mids + nudge)])
    np.testing.assert_array_equal(run_expr(dev, inp(0), [x], F32), x.astype(F32))
    with np.errstate(over="ignore"):
        want16 = x.astype(F16)
    got16 = run_expr(dev, inp(0), [x], F16)
    np.testing.assert_array_equal(got16, want16)


def test_cast_to_float64_is_exact(dev: Dev, rng: np.random.Generator) -> None:
    x32 = np.concatenate([rng.standard_normal(1000).astype(F32), SPECIALS.astype(F32)])
    np.testing.assert_array_equal(run_expr(dev, inp(0), [x32], F64), x32.astype(F64))
    x16 = x32.astype(F16)
    np.testing.assert_array_equal(run_expr(dev, inp(0), [x16], F64), x16.astype(F64))
    ints = np.concatenate([rng.integers(-(2**31), 2**31, 1000), [2**31 - 1, -(2**31), 2**24 + 1, -(2**24) - 1, 0]])
    np.testing.assert_array_equal(run_expr(dev, call("to_float", inp(0, INT)), [ints], F64), ints.astype(F64))
    b = rng.random(50) < 0.5
    np.testing.assert_array_equal(run_expr(dev, call("to_float", inp(0, BOOL)), [b], F64), b.astype(F64))


def test_cast_float64_to_int_truncates(dev: Dev, rng: np.random.Generator) -> None:
    x = np.concatenate([representable(rng.uniform(-2.1e9, 2.1e9, 2000)), rng.uniform(-5, 5, 200).round(1),
                        [2**31 - 1.0, -(2.0**31), 2.0**24 + 1, -(2.0**24) - 3, 0.5, -0.5, 0.0]])
    np.testing.assert_array_equal(run_expr(dev, call("to_int", inp(0)), [x], I64), np.trunc(x).astype(I64))
    np.testing.assert_array_equal(run_expr(dev, call("to_bool", inp(0)), [x], np.dtype(bool)), x != 0)


def test_mixed_float32_float64_and_literals(dev: Dev, rng: np.random.Generator) -> None:
    a = values(rng, 1000, -5, 5)
    b = rng.standard_normal(1000).astype(F32)
    # a * 0.1 + b, where(a > b, ..): the literal and the float32 operand are widened exactly, math in df64
    c = float(representable(np.array([0.1]))[0])
    e = call("where", call("gt", inp(0), inp(1)), call("add", call("mul", inp(0), const(c)), inp(1)), inp(1))
    want = np.where(a > b, a * c + b.astype(F64), b.astype(F64))
    assert rel(run_expr(dev, e, [a, b], F64), want, scale=np.abs(a * c) + np.abs(b)) <= TOL
    # a float64 result stored as float32 rounds once, from the df64 value
    got = run_expr(dev, call("add", inp(0), inp(1)), [a, b], F32)
    np.testing.assert_array_equal(got, (a + b.astype(F64)).astype(F32))


def test_data_movement(dev: Dev, rng: np.random.Generator) -> None:
    x = values(rng, 6 * 7 * 5, -30, 30).reshape(6, 7, 5)
    v = dev.put(x)
    out = dev.empty(F64, (5, 6, 7))
    dev.be.execute(dev.be.record_elementwise(inp(0), [v.permute((2, 0, 1))], out))
    np.testing.assert_array_equal(dev.get(out), x.transpose(2, 0, 1))
    idx = np.array([3, -1, 0, 5, 5], np.int64)
    g = dev.empty(F64, (6, 5, 5))
    dev.be.execute(dev.be.record_gather(v, dev.put(idx), 1, g))
    np.testing.assert_array_equal(dev.get(g), np.take(x, idx, axis=1))
    # an index expression (load at computed coordinates): a reversed copy
    rev = load(0, call("sub", const(5, INT), Expr("coord", value=0, kind=INT)), kind=FLOAT)
    r = dev.empty(F64, (6,))
    dev.be.execute(dev.be.record_elementwise(rev, [dev.put(x[:, 0, 0].copy())], r))
    np.testing.assert_array_equal(dev.get(r), x[::-1, 0, 0])


# ---- reductions, scans, matmul ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "sumsq", "l1", "l2", "logsum", "logsumexp",
                                "argmax", "argmin"])
@pytest.mark.parametrize("shape,perm", [((9, 37), None), ((37, 9), (1, 0)), ((2, 40000), None)])
def test_reductions(dev: Dev, rng: np.random.Generator, op: str, shape: tuple[int, int],
                    perm: tuple[int, int] | None) -> None:
    if op == "prod":
        width = min(0.5, 20.0 / shape[1])  # products stay well inside f32's exponent range
        x = representable(rng.uniform(1 - width, 1 + width, shape) * rng.choice([-1.0, 1.0], shape))
    elif op in ("logsum", "l2", "sumsq"):
        x = representable(np.abs(rng.standard_normal(shape)) * 1e3)
    else:
        x = representable(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape))
    if op in ("max", "min", "argmax", "argmin") and shape[0] > 2:
        x[1, 3] = np.nan  # numpy: NaN wins, the first one for arg ops
        x[2, :] = x[2, 0]  # ties: the first index
    v = dev.put(x)
    xv = x
    if perm is not None:
        v, xv = v.permute(perm), x.transpose(perm)
    arg = op.startswith("arg")
    out = dev.empty(I64 if arg else F64, (xv.shape[0],))
    dev.be.execute(dev.be.record_reduce_axes(op, v, out, 1))
    got = dev.get(out)
    with np.errstate(all="ignore"):
        ref = {"sum": lambda a: a.sum(1), "mean": lambda a: a.mean(1), "max": lambda a: a.max(1),
               "min": lambda a: a.min(1), "prod": lambda a: a.prod(1), "sumsq": lambda a: (a * a).sum(1),
               "l1": lambda a: np.abs(a).sum(1), "l2": lambda a: np.sqrt((a * a).sum(1)),
               "logsum": lambda a: np.log(a.sum(1)), "argmax": lambda a: a.argmax(1), "argmin": lambda a: a.argmin(1),
               "logsumexp": lambda a: a.max(1) + np.log(np.exp(a - a.max(1, keepdims=True)).sum(1))}[op](xv)
    if arg or op in ("max", "min"):
        np.testing.assert_array_equal(got, ref)
        return
    # A sum is exact to eps * sum |x| (cancellation), not eps * |result|.
    scale = {"sum": np.abs(xv).sum(1), "mean": np.abs(xv).mean(1)}.get(op)
    # A product of n factors compounds n roundings of at most 2^-46 each (df_mul's bound, cross terms included).
    assert rel(got, ref, scale=scale) <= (max(TOL, xv.shape[1] * 2.0**-46) if op == "prod" else TOL)


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_scans(dev: Dev, rng: np.random.Generator, op: str, exclusive: bool, reverse: bool) -> None:
    x = representable(rng.uniform(0.8, 1.25, (4, 50, 3)) * rng.choice([-1.0, 1.0], (4, 50, 3)))
    out = dev.empty(F64, x.shape)
    dev.be.execute(dev.be.record_scan(op, dev.put(x), out, 1, exclusive, reverse))
    y = x[:, ::-1] if reverse else x
    acc = np.cumsum(y, 1) if op == "sum" else np.cumprod(y, 1)
    if exclusive:
        acc = np.concatenate([np.full_like(acc[:, :1], 0.0 if op == "sum" else 1.0), acc[:, :-1]], 1)
    ref = acc[:, ::-1] if reverse else acc
    scale = np.cumsum(np.abs(y), 1) if op == "sum" else None
    if scale is not None and exclusive:
        scale = np.concatenate([np.ones_like(scale[:, :1]), scale[:, :-1]], 1)
    assert rel(dev.get(out), ref, scale=None if scale is None else (scale[:, ::-1] if reverse else scale)) <= TOL


def test_matmul(dev: Dev, rng: np.random.Generator) -> None:
    a = values(rng, 2 * 5 * 33, -3, 3).reshape(2, 5, 33)
    b = values(rng, 2 * 33 * 7, -3, 3).reshape(2, 33, 7)
    bias = values(rng, 7, -3, 3)
    out = dev.empty(F64, (2, 5, 7))
    bv = dev.put(bias)
    bias_view = View(bv.handle, F64, (2, 5, 7), (0, 0, 1), 0)
    act = call("max", inp(0), const(0.0))
    dev.be.execute(dev.be.record_matmul(dev.put(a), dev.put(b), out, alpha=0.3, bias=bias_view, beta=2.0, act=act))
    ref = np.maximum(0.3 * (a @ b) + 2.0 * bias, 0.0)
    scale = 0.3 * (np.abs(a) @ np.abs(b)) + 2.0 * np.abs(bias)
    assert rel(dev.get(out), ref, scale=scale) <= TOL


# ---- through a model ------------------------------------------------------------------------------------------
def test_float64_model_matches_onnxruntime(rng: np.random.Generator) -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
        helper.make_node("Add", ["x64", "y"], ["s"]),
        helper.make_node("Mul", ["s", "y"], ["p"]),
        helper.make_node("ReduceLogSumExp", ["p", "axes"], ["lse"], keepdims=1),
        helper.make_node("Sub", ["p", "lse"], ["d"]),
        helper.make_node("CumSum", ["d", "axis"], ["c"]),
        helper.make_node("Cast", ["c"], ["out32"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "f64", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8]),
                       helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 8])],
        [helper.make_tensor_value_info("c", TensorProto.DOUBLE, [3, 8]),
         helper.make_tensor_value_info("out32", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
         helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    feeds = {"x": rng.standard_normal((3, 8)).astype(F32), "y": representable(rng.standard_normal((3, 8)) * 3)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ember.load_onnx(model, backend="wgpu").run(feeds)
    assert got["c"].dtype == F64
    assert rel(got["c"], want[0], scale=np.abs(want[0]).max()) <= TOL
    np.testing.assert_allclose(got["out32"], want[1], rtol=1e-6, atol=1e-6)


def test_float64_model_without_df64_lowering_is_refused() -> None:
    graph = helper.make_graph([helper.make_node("Sin", ["a"], ["y"])], "sin64",
                              [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])])
    with pytest.raises(NotImplementedError, match="float64"):
        ember.load_onnx(helper.make_model(graph), backend="wgpu")
