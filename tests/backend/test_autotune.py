"""The GEMM/conv tile autotune (ember/backends/wgpu/autotune.py) on the wgpu adapter here (lavapipe in CI): every
candidate correct against a float64 oracle, tuned results equal to the heuristic's, the on-disk cache (roundtrip,
hits without timing, corrupt files, per-adapter files, concurrent writers), and the on/off rules."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.wgpu import autotune as at
from ember.backends.wgpu import tune_cache
from ember.backends.wgpu.shader import tiles
from ember.backends.wgpu.shader.tiles import TILES, Tile

from ..kernels.gate import check, upload
from .test_conv2d import conv_ref

F32 = np.dtype(np.float32)


@pytest.fixture
def be(wgpu_be: ember.ComputeBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """The wgpu backend with a fresh tuner (a new process, as far as tuning goes) and a private cache dir."""
    monkeypatch.delenv("EMBER_AUTOTUNE", raising=False)  # the adapter's default, unless a test sets it
    with settings.override(cache_dir=tmp_path / "cache"):
        wgpu_be._autotuner = None
        yield wgpu_be
        wgpu_be._autotuner = None


def fresh_tuner(be: ember.ComputeBackend) -> at.Tuner:
    be._autotuner = None
    return at.tuner(be)


# ---- problems --------------------------------------------------------------------------------------------------
class Matmul:
    """z x (m x k) @ (k x n), A transposed in memory or not, B broadcast over the batch or not."""

    def __init__(self, be: ember.ComputeBackend, rng: np.random.Generator, z: int, m: int, n: int, k: int,
                 ta: bool = False, bcast_b: bool = False) -> None:
        self.be, self.shape = be, (z, m, n, k)
        self.a = rng.standard_normal((z, m, k)).astype(np.float32)
        self.b = rng.standard_normal((1 if bcast_b else z, k, n)).astype(np.float32)
        ha, va = upload(be, np.ascontiguousarray(self.a.transpose(0, 2, 1)) if ta else self.a, pad=1)
        self.va = va.permute((0, 2, 1)) if ta else va
        hb, vb = upload(be, self.b)
        self.vb = View(hb, F32, (z, k, n), (0, n, 1), 0) if bcast_b else vb
        self.ho, self.vo = upload(be, np.full((z, m, n), np.nan, np.float32))
        self.handles = [ha, hb, self.ho]

    def record(self) -> list:
        return self.be.record_matmul(self.va, self.vb, self.vo)

    def run(self) -> np.ndarray:
        self.be.execute(self.record())
        return self.be.download(self.vo)

    def ref(self) -> np.ndarray:
        return self.a.astype(np.float64) @ self.b.astype(np.float64)

    def free(self) -> None:
        for h in self.handles:
            self.be.free(h)


class Conv:
    def __init__(self, be: ember.ComputeBackend, rng: np.random.Generator, x: tuple, w: tuple, stride: tuple,
                 pads: tuple, groups: int = 1) -> None:
        self.be, self.stride, self.pads, self.groups = be, stride, pads, groups
        self.x = rng.standard_normal(x).astype(np.float32)
        self.w = rng.standard_normal(w).astype(np.float32)
        self.bias = rng.standard_normal(w[0]).astype(np.float32)
        p = (x[2] + pads[0] + pads[2] - w[2]) // stride[0] + 1
        q = (x[3] + pads[1] + pads[3] - w[3]) // stride[1] + 1
        self.out_shape = (x[0], w[0], p, q)
        hx, self.vx = upload(be, self.x)
        hw, self.vw = upload(be, self.w)
        hbias, self.vbias = upload(be, self.bias)
        self.ho, self.vo = upload(be, np.full(self.out_shape, np.nan, np.float32))
        self.handles = [hx, hw, hbias, self.ho]
        z, ncols = groups, x[0] * p * q
        self.shape = (z, w[0] // groups, ncols, w[1] * w[2] * w[3])

    def record(self) -> list:
        return self.be.record_conv(self.vx, self.vw, self.vbias, self.vo, self.stride, self.pads, (1, 1),
                                   self.groups)

    def run(self) -> np.ndarray:
        self.be.execute(self.record())
        return self.be.download(self.vo)

    def ref(self) -> np.ndarray:
        return conv_ref(self.x, self.w, self.bias, self.stride, self.pads, groups=self.groups)

    def free(self) -> None:
        for h in self.handles:
            self.be.free(h)


PROBLEMS = {
    "matmul": lambda be, rng: Matmul(be, rng, 1, 100, 260, 300),
    "matmul_ta": lambda be, rng: Matmul(be, rng, 1, 130, 70, 520, ta=True),
    "matmul_batched_bcast": lambda be, rng: Matmul(be, rng, 3, 70, 90, 200, bcast_b=True),
    "conv3x3_s2": lambda be, rng: Conv(be, rng, (2, 32, 21, 19), (48, 32, 3, 3), (2, 2), (1, 1, 1, 1)),
    "conv_grouped": lambda be, rng: Conv(be, rng, (1, 12, 20, 20), (18, 4, 3, 3), (1, 1), (0, 1, 2, 1), groups=3),
}


def last_dim(a: np.ndarray) -> int:
    return a.shape[-1]


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_candidate_is_correct(be: ember.ComputeBackend, rng: np.random.Generator, name: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each candidate the tuner may pick, forced in turn, matches the float64 oracle within the kernel gate."""
    prob = PROBLEMS[name](be, rng)
    try:
        z, m, n, k = prob.shape
        cands = at.candidates(be, m, n, k, z)
        assert cands[0] == tiles.plan_gemm(be, m, n, k, z) and 3 <= len(cands) <= at.MAX_CANDIDATES
        assert len(set(cands)) == len(cands)
        ref = prob.ref()
        for cand in cands:
            monkeypatch.setattr(at, "choose", lambda *a, cand=cand, **kw: cand)
            steps = prob.record()
            assert str(cand[0]) in steps[0].label
            be.execute(steps)
            check(be.download(prob.vo), ref, last_dim(ref), (name, str(cand[0]), cand[1]))
    finally:
        prob.free()


@pytest.mark.parametrize("name", ["matmul_ta", "conv3x3_s2"])
def test_tuned_matches_heuristic(be: ember.ComputeBackend, rng: np.random.Generator, name: str) -> None:
    prob = PROBLEMS[name](be, rng)
    try:
        with be.autotune_scope(False):
            heuristic = prob.run()
        t = at.tuner(be)
        with be.autotune_scope(True):
            tuned = prob.run()
        assert t.stats["tuned"] == 1 and t.stats["timed"] >= 3
        ref = prob.ref()
        check(tuned, ref, last_dim(ref), "tuned")
        check(heuristic, ref, last_dim(ref), "heuristic")
        # Both within the gate of the oracle; split-K orders differ, so equal up to rounding, not bitwise.
        check(tuned, heuristic.astype(np.float64), last_dim(ref), "tuned vs heuristic")
    finally:
        prob.free()


def test_tuning_leaves_buffers_alone(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Candidates run on the problem's buffers: gemm's beta * C (C = the output) must survive the timing runs."""
    m, n, k = 96, 130, 400
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n + 3)).astype(np.float32)
    (ha, _), (hb, _), (hc, vc) = upload(be, a), upload(be, b), upload(be, c)
    try:
        with be.autotune_scope(True):
            be.gemm(False, False, m, n, k, 0.5, ha, k, hb, n, 2.0, hc, n + 3)
        got = be.download(vc)
    finally:
        for h in (ha, hb, hc):
            be.free(h)
    assert at.tuner(be).stats["tuned"] == 1
    ref = c.astype(np.float64)
    ref[:, :n] = 0.5 * (a.astype(np.float64) @ b) + 2.0 * c[:, :n]
    check(got, ref, n + 3, "gemm beta=2 after tuning")


# ---- the cache -------------------------------------------------------------------------------------------------
def test_second_load_hits_the_cache(be: ember.ComputeBackend, rng: np.random.Generator,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A model tuned once loads again (a new tuner: as in a new process) from the disk cache, timing nothing."""
    w1 = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32 * 16 * 16, 128)).astype(np.float32), "w2")
    shape = numpy_helper.from_array(np.array([8, -1], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Reshape", ["r", "shape"], ["f"]),
         helper.make_node("MatMul", ["f", "w2"], ["y"])],
        "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 128])], [w1, w2, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((8, 16, 16, 16)).astype(np.float32)

    heuristic = ember.load_onnx(model, be, autotune=False)(x)[0]
    assert at.tuner(be).stats["tuned"] == 0
    first = ember.load_onnx(model, be, autotune=True)
    stats = at.tuner(be).stats
    assert stats["tuned"] == 2 and stats["hits"] == 0 and stats["seconds"] > 0
    info = first.plan_info()
    assert info["autotune.tuned"] == 2 and info["autotune.timed"] >= 6 and info["autotune.seconds"] > 0
    files = list(Path(tune_cache.cache_dir()).glob("autotune-*.json"))
    assert len(files) == 1 and len(json.loads(files[0].read_text())["entries"]) == 2

    timed = []
    monkeypatch.setattr(at, "time_candidates", lambda *a, **kw: timed.append(1) or pytest.fail("timed again"))
    t = fresh_tuner(be)
    second = ember.load_onnx(model, be, autotune=True)
    assert t.stats["hits"] == 2 and t.stats["tuned"] == 0 and t.stats["timed"] == 0 and not timed
    info = second.plan_info()
    assert info["autotune.hits"] == 2 and info["autotune.tuned"] == 0 and info["autotune.seconds"] == 0
    for got in (first(x)[0], second(x)[0]):
        check(got, heuristic.astype(np.float64), 128, "tuned model")


def test_cache_roundtrip_and_version(tmp_path: Path) -> None:
    ident = {"device": "Some GPU", "description": "driver 1.2"}
    c = tune_cache.TuneCache(tmp_path / "a.json", ident, "v1")
    entry = {"tile": "64x128x16/4x8", "splits": 4, "ms": 1.5}
    c.put("matmul f32 z1 m64 n3136 k576 A:k4 B:x4", entry)
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["adapter"] == ident and data["generator"] == "v1" and data["format"] == tune_cache.CACHE_FORMAT
    again = tune_cache.TuneCache(tmp_path / "a.json", ident, "v1")
    assert again.get("matmul f32 z1 m64 n3136 k576 A:k4 B:x4") == entry
    assert tune_cache.TuneCache(tmp_path / "a.json", ident, "v2").entries == {}  # other kernels: stale
    assert tune_cache.TuneCache(tmp_path / "a.json", {**ident, "device": "Other"}, "v1").entries == {}
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed over the cache


def test_cache_entry_must_be_legal(be: ember.ComputeBackend) -> None:
    assert at._entry_plan(be, {"tile": "64x64x16/4x4", "splits": 1}, 100, 100, 100, 1) == (TILES["medium"], 1)
    # K = 100 is 7 K tiles of 16: 5 or 8 splits would leave one empty.
    for bad in ({"tile": "64x64x16/4x4", "splits": 5}, {"tile": "64x64x16/4x4", "splits": 8},
                {"tile": "64x64x16/3x4", "splits": 1}, {"tile": "4096x64x16/4x4", "splits": 1},
                {"tile": [64, 64], "splits": 1}, {"splits": 1}):
        assert at._entry_plan(be, bad, 100, 100, 100, 1) is None, bad


def test_corrupt_cache_is_ignored_then_rewritten(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    t = at.tuner(be)
    path = t.cache.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1, "entries": {"x": ')  # a torn write by some other tool
    t = fresh_tuner(be)
    with pytest.warns(UserWarning, match="corrupt"):
        assert t.cache.entries == {}
    prob = PROBLEMS["matmul"](be, rng)
    try:
        with be.autotune_scope(True):
            got = prob.run()
    finally:
        prob.free()
    check(got, prob.ref(), 260, "after a corrupt cache")
    assert t.stats["tuned"] == 1
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_adapters_have_separate_files(tmp_path: Path) -> None:
    a = {"vendor": "nvidia", "device": "NVIDIA H200", "description": "550.54", "backend_type": "Vulkan"}
    b = {**a, "description": "560.10"}  # the same GPU under another driver tunes anew
    c = {**a, "device": "NVIDIA L4"}
    paths = {tune_cache.cache_path(tmp_path, x) for x in (a, b, c)}
    assert len(paths) == 3 and tune_cache.cache_path(tmp_path, dict(a)) == tune_cache.cache_path(tmp_path, a)
    tune_cache.TuneCache(tune_cache.cache_path(tmp_path, a), a, "v").put("k", {"tile": "64x64x16/4x4", "splits": 1})
    assert tune_cache.TuneCache(tune_cache.cache_path(tmp_path, b), b, "v").get("k") is None
    assert tune_cache.TuneCache(tune_cache.cache_path(tmp_path, a), a, "v").get("k") is not None


def test_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    path, ident = tmp_path / "c.json", {"device": "x"}

    def writer(i: int) -> None:
        c = tune_cache.TuneCache(path, ident, "v")  # each as a separate process would: its own view of the file
        for j in range(15):
            c.put(f"w{i} p{j}", {"tile": "32x32x8/4x4", "splits": 1})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(tune_cache.TuneCache(path, ident, "v").entries) == 60


def test_unwritable_cache_warns_once(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = tune_cache.TuneCache(blocker / "sub" / "x.json", {}, "v")  # the directory cannot be made: a file is in the way
    with pytest.warns(UserWarning, match="cannot write"):
        c.put("a", {"tile": "32x32x8/4x4", "splits": 1})
    c.put("b", {"tile": "32x32x8/4x4", "splits": 1})
    assert set(c.entries) == {"a", "b"}


# ---- candidates, timing, switches ------------------------------------------------------------------------------
def test_candidates_respect_device_limits(be: ember.ComputeBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(be, "limits", {**be.limits, "max-compute-workgroup-storage-size": 16384})
    for m, n, k in ((64, 3136, 576), (512, 49, 4608), (1024, 1024, 64)):
        cands = at.candidates(be, m, n, k, 1)
        assert all(t.smem_bytes() <= 16384 for t, _ in cands) and at.WIDE not in [t for t, _ in cands]
    monkeypatch.setattr(be, "limits", {**be.limits, "max-compute-invocations-per-workgroup": 64})
    assert {t for t, _ in at.candidates(be, 300, 300, 300, 1)[1:]} <= {TILES["small"]}
    assert not at.tile_legal(be, Tile(64, 64, 16, 4, 4))


def test_wall_clock_timing_without_timestamps(be: ember.ComputeBackend, rng: np.random.Generator,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    prob = PROBLEMS["matmul"](be, rng)
    try:
        steps = prob.record()
        monkeypatch.setattr(be, "features", be.features - {"timestamp-query"})
        ms = at.time_candidates(be, [steps, steps], None, reps=2)
        assert len(ms) == 2 and all(0 < v < 10_000 for v in ms)
    finally:
        prob.free()


def test_small_problems_are_not_tuned(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    prob = Matmul(be, rng, 1, 16, 16, 64)
    try:
        with be.autotune_scope(True):
            got = prob.run()
    finally:
        prob.free()
    check(got, prob.ref(), 16, "small")
    assert at.tuner(be).stats["skipped"] == 1 and at.tuner(be).stats["tuned"] == 0


def test_switches(be: ember.ComputeBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    t = at.tuner(be)
    software = be.adapter.info["adapter_type"] == "CPU"
    assert t.enabled() is not software  # default: on for GPUs, off for software adapters
    with settings.override(autotune=False):
        assert not t.enabled()
        with be.autotune_scope(True):
            assert t.enabled()  # load_onnx(autotune=True) wins over the setting
    monkeypatch.setenv("EMBER_AUTOTUNE", "0")  # the variable itself, read when asked
    assert not t.enabled()
    monkeypatch.setenv("EMBER_AUTOTUNE", "1")
    assert t.enabled()
    with be.autotune_scope(False):
        assert not t.enabled()
    with pytest.raises(TypeError, match="autotune"):
        ember.load_onnx(helper.make_model(helper.make_graph([], "t", [], [])), be, autotune="yes")


def test_a_failing_candidate_is_ruled_out(be: ember.ComputeBackend, rng: np.random.Generator,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = (Tile(64, 64, 16, 4, 4), 1), (Tile(64, 64, 12, 4, 4), 1)  # K step 12: the generator refuses it
    monkeypatch.setattr(at, "candidates", lambda *a: [tiles.plan_gemm(be, 100, 260, 300, 1), *bogus])
    prob = PROBLEMS["matmul"](be, rng)
    try:
        with be.autotune_scope(True):
            got = prob.run()
    finally:
        prob.free()
    check(got, prob.ref(), 260, "with a failing candidate")
    t = at.tuner(be)
    assert t.stats["tuned"] == 1 and t.stats["timed"] == 2
    (entry,) = t.cache.entries.values()
    assert entry["candidates"]["64x64x12/4x4/s1"] is None


def test_unusable_timestamps_fall_back_to_the_host_clock(be: ember.ComputeBackend, rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    prob = PROBLEMS["matmul"](be, rng)
    try:
        steps = prob.record()
        host = []
        monkeypatch.setattr(at, "_time_gpu", lambda *a: None)
        monkeypatch.setattr(at, "_time_host", lambda *a, f=at._time_host: host.append(1) or f(*a))
        assert len(at.time_candidates(be, [steps], None, reps=1)) == 1 and host
    finally:
        prob.free()


def test_sizes_of_one_class_share_a_tuning(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """A GEMM whose rows change from run to run (a sequence length) is tuned once per size class (exact to 64,
    then powers of two), and the shared choice still computes each size right."""
    assert [at.size_class(v) for v in (1, 64, 65, 100, 128, 129)] == [1, 64, 128, 128, 128, 256]
    n, k = 130, 400
    b = rng.standard_normal((k, n)).astype(np.float32)
    t = fresh_tuner(be)
    for m in (96, 100, 120):
        a = rng.standard_normal((m, k)).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        (ha, _), (hb, _), (hc, vc) = upload(be, a), upload(be, b), upload(be, c)
        try:
            with be.autotune_scope(True):
                be.gemm(False, False, m, n, k, 1.0, ha, k, hb, n, 0.0, hc, n)
            got = be.download(vc)
        finally:
            for h in (ha, hb, hc):
                be.free(h)
        check(got, a.astype(np.float64) @ b, n, f"gemm m={m} with its class's tuning")
    assert t.stats["tuned"] == 1 and t.stats["hits"] == 2
