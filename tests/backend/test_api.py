"""The public error contract, case by case: backend choice, life cycle, handles, copies, op arguments."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ember
from ember.backends import ALIASES
from ember.backends.cpu import CpuBackend
from ember.backends.wgpu import WgpuBackend

from .helpers import download, upload

HAS_WGPU = "wgpu" in ember.available_backends()
# The suite installs lavapipe where there is no GPU, so a missing adapter is a failure, not a skip.
needs_wgpu = pytest.mark.usefixtures("wgpu_be")


# ---- choosing a backend ---------------------------------------------------------------------------------
def test_unknown_backend_names_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        ember.backend("cuda")
    msg = str(err.value)
    assert "'cuda'" in msg
    for name in ("auto", "cpu", "wgpu", "gpu", "webgpu", "numpy"):
        assert name in msg, (name, msg)


@pytest.mark.parametrize("bad", ["", "cpu0", "web gpu"])
def test_unknown_backend_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="valid names"):
        ember.backend(bad)


def test_cpu_aliases() -> None:
    for name in ("cpu", "numpy", "CPU", "NumPy"):
        be = ember.backend(name)
        assert be.name == "cpu" and be.is_initialized() and isinstance(be, CpuBackend), name


@needs_wgpu
def test_wgpu_aliases() -> None:
    for name in ("wgpu", "gpu", "webgpu", "WebGPU"):
        be = ember.backend(name)
        assert be.name == "wgpu" and be.is_initialized() and isinstance(be, WgpuBackend), name


def test_alias_table() -> None:
    assert ALIASES["gpu"] == ALIASES["webgpu"] == ALIASES["wgpu"] == "wgpu"
    assert ALIASES["numpy"] == ALIASES["cpu"] == "cpu"


def test_cpu_takes_no_options() -> None:
    with pytest.raises(ValueError, match="option"):
        ember.backend("cpu", adapter=0)


def test_auto_follows_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_BACKEND", "numpy")
    assert ember.backend().name == "cpu"
    assert ember.backend("auto").name == "cpu"
    monkeypatch.setenv("EMBER_BACKEND", " cpu ")
    assert ember.backend().name == "cpu"
    # an explicit name wins over the variable
    if HAS_WGPU:
        assert ember.backend("wgpu").name == "wgpu"


@pytest.mark.parametrize("value", [None, "", "auto"])
def test_auto_without_env_is_the_best_available(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("EMBER_BACKEND", raising=False)
    else:
        monkeypatch.setenv("EMBER_BACKEND", value)
    assert ember.backend().name == ember.available_backends()[0]


def test_auto_with_bad_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_BACKEND", "tpu")
    with pytest.raises(ValueError, match="tpu"):
        ember.backend()


def test_available_backends() -> None:
    names = ember.available_backends()
    assert isinstance(names, list)
    assert names[-1] == "cpu"  # always there, and the fallback
    assert set(names) <= {"wgpu", "cpu"} and len(set(names)) == len(names)
    from ember.backends.wgpu.device import adapters_available

    assert ("wgpu" in names) == adapters_available()
    if "wgpu" in names:
        assert names[0] == "wgpu"  # best first


@needs_wgpu
def test_wgpu_unknown_adapter_lists_adapters() -> None:
    from ember.backends.wgpu.device import _describe, compute_adapters

    with pytest.raises(RuntimeError) as err:
        ember.backend("wgpu", adapter="no-such-gpu-xyz")
    msg = str(err.value)
    assert "wgpu" in msg and "no-such-gpu-xyz" in msg
    for a in compute_adapters():
        assert _describe(a) in msg


@needs_wgpu
def test_wgpu_adapter_choice() -> None:
    from ember.backends.wgpu.device import _describe, compute_adapters

    first = compute_adapters()[0]
    be = ember.backend("wgpu", adapter=0)
    assert be.adapter_name == _describe(first)
    # a name substring, any case
    assert ember.backend("wgpu", adapter=first.info["device"].upper()[:6]).adapter_name == _describe(first)
    with pytest.raises(ValueError, match="adapter"):
        ember.backend("wgpu", adapter=len(compute_adapters()))
    with pytest.raises(ValueError, match="power_preference"):
        ember.backend("wgpu", power_preference="fast")


# ---- life cycle -------------------------------------------------------------------------------------------
def _backend_classes() -> list:
    return [CpuBackend, *([WgpuBackend] if HAS_WGPU else [])]


UNINIT_CALLS = {
    "alloc": lambda be: be.alloc(16),
    "free": lambda be: be.free(1),
    "copy_htod": lambda be: be.copy_htod(1, b"1234"),
    "copy_dtoh": lambda be: be.copy_dtoh(bytearray(4), 1),
    "synchronize": lambda be: be.synchronize(),
    "unary": lambda be: be.unary("relu", 1, 2, 1),
    "binary": lambda be: be.binary("add", 1, 2, 3, 1),
    "reduce": lambda be: be.reduce("sum", 1, 2, (4,), 0),
    "gemm": lambda be: be.gemm(False, False, 1, 1, 1, 1.0, 1, 1, 2, 1, 0.0, 3, 1),
    "attention": lambda be: be.attention(1, 2, 3, 4, 1, 1, 1, 1, 1, 1.0),
    "conv2d_forward": lambda be: be.conv2d_forward(1, (1, 1, 3, 3), 2, (1, 1, 1, 1), 3, (1, 1, 3, 3)),
}


@pytest.mark.parametrize("call", list(UNINIT_CALLS))
@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda c: c.__name__)
def test_not_initialised(cls: type, call: str) -> None:
    be = cls()
    assert not be.is_initialized()
    with pytest.raises(RuntimeError, match=r"not initiali[sz]ed.*init\(\)"):
        UNINIT_CALLS[call](be)


def test_init_returns_self_and_is_idempotent() -> None:
    be = CpuBackend()
    assert be.init() is be and be.init() is be and be.is_initialized()
    h = be.alloc(8)
    be.free(h)
    assert "initialised" in repr(be)


# ---- memory and handles -----------------------------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [0, -1, -(2**40)])
def test_alloc_nonpositive(be: ember.ComputeBackend, nbytes: int) -> None:
    with pytest.raises(ValueError, match="nbytes"):
        be.alloc(nbytes)


@pytest.mark.parametrize("nbytes", [1.5, "16", None, True, np.float32(4)])
def test_alloc_not_an_int(be: ember.ComputeBackend, nbytes: object) -> None:
    with pytest.raises(ValueError, match="nbytes"):
        be.alloc(nbytes)


def test_alloc_numpy_int(be: ember.ComputeBackend) -> None:
    h = be.alloc(np.int64(24))
    assert be.nbytes(h) == 24
    be.free(h)


def test_out_of_memory(be: ember.ComputeBackend) -> None:
    before = dict(be._sizes)
    huge = be.max_buffer + 1 if be.name == "wgpu" else 2**62
    with pytest.raises(ember.OutOfMemoryError) as err:
        be.alloc(huge)
    assert isinstance(err.value, MemoryError)
    assert be._sizes == before  # no handle for a failed allocation
    h = be.alloc(16)  # still usable
    be.free(h)


def test_out_of_memory_is_a_memory_error() -> None:
    assert issubclass(ember.OutOfMemoryError, MemoryError)


def test_free_twice(be: ember.ComputeBackend) -> None:
    h = be.alloc(16)
    be.free(h)
    with pytest.raises(ValueError, match=rf"^handle: handle {h} is freed"):
        be.free(h)


@pytest.mark.parametrize("handle", [10**9, -3, 0])
def test_free_unknown(be: ember.ComputeBackend, handle: int) -> None:
    with pytest.raises(ValueError, match=rf"^handle: handle {handle} is unknown"):
        be.free(handle)


@pytest.mark.parametrize("handle", ["1", 1.0, None, True])
def test_free_not_a_handle(be: ember.ComputeBackend, handle: object) -> None:
    with pytest.raises(ValueError, match="^handle: a handle is an int"):
        be.free(handle)


def test_freed_handle_in_ops(be: ember.ComputeBackend) -> None:
    live = [be.alloc(64) for _ in range(3)]
    dead = be.alloc(64)
    be.free(dead)
    try:
        cases = [
            ("input", lambda: be.unary("relu", dead, live[0], 4)),
            ("output", lambda: be.unary("relu", live[0], dead, 4)),
            ("a", lambda: be.binary("add", dead, live[0], live[1], 4)),
            ("b", lambda: be.binary("add", live[0], dead, live[1], 4)),
            ("output", lambda: be.binary("add", live[0], live[1], dead, 4)),
            ("input", lambda: be.reduce("sum", dead, live[0], (4,), 0)),
            ("dst_handle", lambda: be.copy_htod(dead, b"1234")),
            ("src_handle", lambda: be.copy_dtoh(bytearray(4), dead)),
        ]
        for arg, fn in cases:
            with pytest.raises(ValueError, match=rf"^{arg}: handle {dead} is freed"):
                fn()
    finally:
        for h in live:
            be.free(h)


def _sized(be: ember.ComputeBackend, n_floats: int) -> int:
    return be.alloc(4 * n_floats)


SMALL_CASES = {
    # op -> (arguments as a function of the handles, {arg: floats it needs}); every other handle is big
    "unary": (lambda h: ("sigmoid", h["input"], h["output"], 10), {"input": 10, "output": 10}),
    "binary": (lambda h: ("mul", h["a"], h["b"], h["output"], 10), {"a": 10, "b": 10, "output": 10}),
    "reduce": (lambda h: ("sum", h["input"], h["output"], (4, 5), 1), {"input": 20, "output": 4}),
    "gemm": (lambda h: (False, True, 3, 4, 5, 1.0, h["a"], 5, h["b"], 5, 0.0, h["c"], 4),
             {"a": 15, "b": 20, "c": 12}),
    "attention": (lambda h: (h["q"], h["k"], h["v"], h["o"], 1, 2, 3, 4, 5, 0.5),
                  {"q": 30, "k": 40, "v": 40, "o": 30}),
    "conv2d_forward": (lambda h: (h["input"], (1, 2, 5, 5), h["filter"], (3, 2, 3, 3), h["output"], (1, 3, 3, 3)),
                       {"input": 50, "filter": 54, "output": 27}),
}


@pytest.mark.parametrize("op,arg", [(op, arg) for op, (_, need) in SMALL_CASES.items() for arg in need])
def test_handle_too_small(be: ember.ComputeBackend, op: str, arg: str) -> None:
    make, need = SMALL_CASES[op]
    handles = {name: _sized(be, n - 1 if name == arg else n) for name, n in need.items()}
    try:
        with pytest.raises(ValueError, match=rf"^{arg}: allocation of {4 * (need[arg] - 1)} bytes is smaller"):
            getattr(be, op)(*make(handles))
        # and with every handle big enough, the same call runs
        be.free(handles[arg])
        handles[arg] = _sized(be, need[arg])
        getattr(be, op)(*make(handles))
    finally:
        for h in handles.values():
            be.free(h)


@pytest.mark.parametrize("n", [0, -2, 2.0, True])
def test_bad_element_count(be: ember.ComputeBackend, n: object) -> None:
    a, b = be.alloc(64), be.alloc(64)
    try:
        with pytest.raises(ValueError, match="^n "):
            be.unary("relu", a, b, n)
        with pytest.raises(ValueError, match="^n "):
            be.binary("add", a, b, b, n)
    finally:
        be.free(a)
        be.free(b)


def test_attention_and_gemm_arguments(be: ember.ComputeBackend) -> None:
    hs = [be.alloc(4096) for _ in range(4)]
    try:
        with pytest.raises(ValueError, match="^seq_kv"):
            be.attention(*hs, 1, 1, 2, 0, 4, 1.0)
        with pytest.raises(ValueError, match="scale"):
            be.attention(*hs, 1, 1, 2, 2, 4, float("nan"))
        with pytest.raises(ValueError, match="^lda"):
            be.gemm(False, False, 2, 2, 3, 1.0, hs[0], 2, hs[1], 2, 0.0, hs[2], 2)
        with pytest.raises(ValueError, match="alpha"):
            be.gemm(False, False, 2, 2, 2, float("inf"), hs[0], 2, hs[1], 2, 0.0, hs[2], 2)
        with pytest.raises(ValueError, match="output_shape"):
            be.conv2d_forward(hs[0], (1, 1, 4, 4), hs[1], (1, 1, 3, 3), hs[2], (1, 1, 4, 4))
        with pytest.raises(ValueError, match="input channels"):
            be.conv2d_forward(hs[0], (1, 2, 4, 4), hs[1], (1, 1, 3, 3), hs[2], (1, 1, 2, 2))
    finally:
        for h in hs:
            be.free(h)


# ---- copies -----------------------------------------------------------------------------------------------
def test_copy_htod_too_large(be: ember.ComputeBackend) -> None:
    h = be.alloc(16)
    try:
        with pytest.raises(ValueError, match="^src: 20 bytes do not fit in dst_handle's 16 bytes"):
            be.copy_htod(h, np.zeros(5, np.float32))
        with pytest.raises(ValueError, match="^src"):
            be.copy_htod(h, bytes(17))
    finally:
        be.free(h)


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "ndarray", "ndarray_f64"])
def test_copy_htod_accepts_buffers(be: ember.ComputeBackend, kind: str) -> None:
    data = np.arange(8, dtype=np.float32)
    src = {"bytes": data.tobytes(), "bytearray": bytearray(data.tobytes()), "memoryview": memoryview(data),
           "ndarray": data, "ndarray_f64": data.astype(np.float64)}[kind]
    nbytes = 64 if kind == "ndarray_f64" else 32
    h = be.alloc(nbytes)
    try:
        be.copy_htod(h, src)
        back = bytearray(nbytes)
        be.copy_dtoh(back, h)
        expected = src.tobytes() if isinstance(src, np.ndarray) else bytes(src)
        assert bytes(back) == expected
    finally:
        be.free(h)


def test_copy_htod_partial_and_odd_sizes(be: ember.ComputeBackend) -> None:
    """A shorter source writes a prefix, any byte count (not only multiples of 4) included."""
    h = upload(be, np.full(4, 7.0, np.float32))
    try:
        be.copy_htod(h, b"\x01\x02\x03\x04\x05")
        back = bytearray(16)
        be.copy_dtoh(back, h)
        assert back[:5] == b"\x01\x02\x03\x04\x05"
        assert bytes(back[5:8]) == np.float32(7.0).tobytes()[1:]
        assert np.frombuffer(bytes(back[8:]), np.float32).tolist() == [7.0, 7.0]
    finally:
        be.free(h)


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "ndarray"])
def test_copy_dtoh_smaller_dst(be: ember.ComputeBackend, kind: str) -> None:
    data = np.arange(10, dtype=np.float32)
    h = upload(be, data)
    try:
        if kind == "ndarray":
            dst = np.full(3, -1.0, np.float32)
            be.copy_dtoh(dst, h)
            assert dst.tolist() == [0.0, 1.0, 2.0]
        else:
            buf = bytearray(6)
            be.copy_dtoh(buf if kind == "bytearray" else memoryview(buf), h)
            assert bytes(buf) == data.tobytes()[:6]
    finally:
        be.free(h)


def test_copy_dtoh_bad_dst(be: ember.ComputeBackend) -> None:
    h = upload(be, np.arange(4, dtype=np.float32))
    try:
        with pytest.raises(ValueError, match="^dst: 20 bytes is larger than src_handle's 16 bytes"):
            be.copy_dtoh(np.zeros(5, np.float32), h)
        with pytest.raises(ValueError, match="^dst"):
            be.copy_dtoh(bytes(4), h)  # read-only
        with pytest.raises(ValueError, match="^dst"):
            be.copy_dtoh(np.zeros(8, np.float32)[::2], h)  # not contiguous
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="^dst"):
            be.copy_dtoh(ro, h)
    finally:
        be.free(h)


def test_round_trip_is_exact(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    x = rng.standard_normal(1001).astype(np.float32)
    x[:3] = [np.nan, np.inf, -0.0]
    h = upload(be, x)
    try:
        got = download(be, h, x.shape)
        assert got.tobytes() == x.tobytes()
    finally:
        be.free(h)


# ---- op names and axes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("op_kind,call", [
    ("UnaryOp", lambda be, h, op: be.unary(op, h, h, 4)),
    ("BinaryOp", lambda be, h, op: be.binary(op, h, h, h, 4)),
    ("ReduceOp", lambda be, h, op: be.reduce(op, h, h, (2, 2), 0)),
])
@pytest.mark.parametrize("op", ["frobnicate", "", 3, None])
def test_unknown_op(be: ember.ComputeBackend, op_kind: str, call: object, op: object) -> None:
    h = be.alloc(64)
    try:
        with pytest.raises(ValueError) as err:
            call(be, h, op)
        msg = str(err.value)
        assert msg.startswith("op: ") and op_kind in msg
        for member in getattr(ember, op_kind):
            assert re.search(rf"\b{member.value}\b", msg), (member, msg)
    finally:
        be.free(h)


@pytest.mark.parametrize("axis", [2, -3, 10, 1.0, True, None, "0"])
def test_reduce_bad_axis(be: ember.ComputeBackend, axis: object) -> None:
    h, o = be.alloc(64), be.alloc(64)
    try:
        with pytest.raises(ValueError, match="^axis"):
            be.reduce("sum", h, o, (2, 3), axis)
    finally:
        be.free(h)
        be.free(o)


@pytest.mark.parametrize("shape", [(), (2, 0), (2, -1), "23", (2.0, 3), None])
def test_reduce_bad_shape(be: ember.ComputeBackend, shape: object) -> None:
    h, o = be.alloc(64), be.alloc(64)
    try:
        with pytest.raises(ValueError, match="^shape"):
            be.reduce("sum", h, o, shape, 0)
    finally:
        be.free(h)
        be.free(o)


# ---- the wgpu pipeline cache --------------------------------------------------------------------------------
@needs_wgpu
def test_pipeline_cache() -> None:
    be = ember.backend("wgpu")
    x = upload(be, np.ones(4 * 64, np.float32))
    y = upload(be, np.ones(4 * 64, np.float32))
    o = be.alloc(4 * 64 * 4)

    def work() -> None:
        be.unary("tanh", x, o, 200)
        be.binary("add", x, y, o, 200)
        be.reduce("max", x, o, (8, 32), 1)
        be.reduce("mean", x, o, (4, 3000 // 64), 0)
        be.attention(x, y, x, o, 1, 2, 4, 8, 16, 0.25, True)
        be.gemm(False, False, 8, 8, 8, 1.0, x, 8, y, 8, 0.0, o, 8)

    try:
        work()
        created = be.pipelines_created
        assert created >= 5
        for _ in range(3):
            work()
        assert be.pipelines_created == created
        # a new shape is a new specialisation
        be.unary("tanh", x, o, 201)
        assert be.pipelines_created == created + 1
    finally:
        for h in (x, y, o):
            be.free(h)
