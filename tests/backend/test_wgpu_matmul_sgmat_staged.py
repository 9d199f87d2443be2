"""The staged subgroup-matrix matmul (matmul_sgmat_staged.py): its emulated variant against the float64 oracle for
every STAGED_CHOICES entry (and a few shapes off the list), which products take it and which fall back to the
direct kernel, the choice of parameters, and the native WGSL text for a fake config.

run_case (test_wgpu_matmul_sgmat.py) runs one product through record_matmul; `spy` records which products reached
record_staged, since the staged and the direct kernel share their labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.wgpu import matmul_sgmat as sgmat
from ember.backends.wgpu import matmul_sgmat_staged as staged
from ember.backends.wgpu.matmul import matmul_epilogue
from ember.backends.wgpu.matmul_sgmat_staged import StagedParams
from ember.backends.wgpu.runtime import MatrixConfig
from ember.backends.wgpu.shader.bindings import Bindings
from ember.core.expr import call, inp

from .test_wgpu_matmul_sgmat import CASES, F16, F32, FakeDawn, run_case

CFG16 = MatrixConfig("f16", "f32", 16, 16, 16)
CFG8 = MatrixConfig("f16", "f32", 8, 8, 8)


@dataclass
class Spy:
    taken: list[StagedParams] = field(default_factory=list)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    seen = Spy()
    real = staged.record_staged

    def recorded(*args: object) -> list:
        seen.taken.append(args[-1])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(staged, "record_staged", recorded)
    return seen


def _limit(be: ember.ComputeBackend) -> int:
    return int(be.limits["max-compute-workgroup-storage-size"])  # type: ignore[attr-defined]


# ---- the emulated kernel against the oracle, every choice -----------------------------------------------------------
OPTIONS = [  # cycled over the choices: each option with double and single buffering, BK 32 and 64
    dict(bias="n"),
    dict(b_col=True, out_dtype=F16, act="relu"),
    dict(out_dtype=F16, residual=True, alpha=0.5, pad=8),
    dict(b_col=True, bias="m", beta=-2.0, act="gelu", offset=8),
    dict(b_shared=True, out_dtype=F16),
    dict(b_col=True, bias="n", residual=True, pad=8, offset=16),
]


@pytest.mark.parametrize("index", range(len(staged.STAGED_CHOICES)))
def test_every_choice_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                     monkeypatch: pytest.MonkeyPatch, spy: Spy, index: int) -> None:
    """Each STAGED_CHOICES entry, forced, on a batch of 2 with blocks ragged in M and N (the last block row and
    column mostly past the output) and 2 or 3 K blocks (the double buffer flips and flips back). Choices of more
    than 2 tiles a subgroup, or whose 16 x 16 x 16 arrays exceed this adapter's workgroup memory, run an 8 x 8 x 8
    config: the same code, halved (the emulated 4 x 4 kernel at 16 x 16 x 16 takes lavapipe 20 s to compile)."""
    p = staged.STAGED_CHOICES[index]
    opts = OPTIONS[index % len(OPTIONS)]
    b_col = bool(opts.get("b_col"))
    cfg = CFG16 if p.tm * p.tn <= 2 and p.workgroup_bytes(CFG16, b_col) <= _limit(wgpu_be) else CFG8
    assert p.workgroup_bytes(cfg, b_col) <= _limit(wgpu_be)
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", cfg)
    monkeypatch.setattr(staged, "STAGED_CHOICES", (p,))
    bm, bn = p.block(cfg)
    m, n, k = bm + cfg.m, 2 * bn - cfg.n, (3 if p.double else 2) * p.bk
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, 2, m, n, k, **opts)
    assert labels == [sgmat.LABEL_EMULATED] and spy.taken == [p]
    assert worst <= 1.0, f"{p.describe()} {opts}: error {worst:.3g} x the bound"


def test_choices_cover_the_space() -> None:
    """The sweep list holds both buffering settings and both K blocks, and every entry builds on a 48 KiB device."""
    choices = staged.STAGED_CHOICES
    assert {p.double for p in choices} == {True, False} and {p.bk for p in choices} == {16, 32}
    limits = {"max-compute-workgroup-storage-size": 49152, "max-compute-invocations-per-workgroup": 1024,
              "max-compute-workgroup-size-x": 1024}
    for b_col in (False, True):
        assert all(staged.usable(p, CFG16, b_col, 32, True, limits, 32) for p in choices)


OFF_LIST = {  # name: (config, virtual subgroup, params, (nb, m, n, k), options)
    "guarded_chunks_pad0": (CFG16, 32, StagedParams(2, 4, 1, 1, 32, True, 0), (1, 48, 128, 64), {}),
    "guarded_chunks_col_major": (CFG16, 32, StagedParams(2, 4, 1, 1, 32, False, 0), (2, 64, 80, 64),
                                 dict(b_col=True, bias="n")),
    "subgroup_16_config_8": (CFG8, 16, StagedParams(2, 2, 2, 2, 32, True, 8), (2, 40, 56, 96),
                             dict(out_dtype=F16, residual=True)),
    "config_4x4_fewer_elements_than_lanes": (MatrixConfig("f16", "f32", 4, 4, 8), 32, StagedParams(2, 2, 2, 2, 32),
                                             (1, 28, 40, 64), dict(act="relu")),
    "tall_4x2_layout": (CFG8, 32, StagedParams(4, 2, 2, 2, 32, False, 16), (1, 160, 96, 128),
                        dict(b_col=True, pad=8)),
    "bk64_double": (CFG8, 32, StagedParams(2, 2, 2, 2, 64, True, 8), (2, 48, 64, 192), dict(bias="m")),
}


@pytest.mark.parametrize("name", sorted(OFF_LIST))
def test_other_shapes_match_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                   monkeypatch: pytest.MonkeyPatch, spy: Spy, name: str) -> None:
    """Parameters off the list: chunk rounds that do not cover every invocation (guarded), no padding, other
    configs and subgroup sizes, a 4 x 2 subgroup layout, wider padding."""
    cfg, lanes, p, (nb, m, n, k), opts = OFF_LIST[name]
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", cfg)
    monkeypatch.setattr(sgmat, "EMULATED_SUBGROUP", lanes)
    monkeypatch.setattr(staged, "STAGED_CHOICES", (p,))
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    assert labels == [sgmat.LABEL_EMULATED] and spy.taken == [p]
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound"


def test_plans_choice_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator, spy: Spy) -> None:
    """The default list and chooser (no forcing) on a product big enough for a mid-sized block."""
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, 1, 256, 192, 128, bias="n", act="relu")
    assert labels == [sgmat.LABEL_EMULATED] and len(spy.taken) == 1
    assert worst <= 1.0


def test_bias_in_operand_buffer(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                monkeypatch: pytest.MonkeyPatch, spy: Spy) -> None:
    """A bias in A's buffer is read out of the vec4<u32> binding (WideBindings.scalar), odd element offsets too."""
    be, (m, n, k) = wgpu_be, (32, 48, 64)
    monkeypatch.setattr(staged, "STAGED_CHOICES", (StagedParams(2, 2, 1, 1, 32),))
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    vec = rng.standard_normal(n).astype(np.float16)
    packed = np.concatenate([a.ravel(), np.zeros(3, np.float16), vec])  # the bias at element m * k + 3
    ha, hb, ho = be.alloc(packed.nbytes + 16), be.alloc(b.nbytes), be.alloc(m * n * 4)
    try:
        be.upload(ha, packed)
        be.upload(hb, b)
        with settings.override(matrix="emulate"):
            steps = be.record_matmul(View(ha, F16, (1, m, k), (0, k, 1)), View(hb, F16, (1, k, n), (0, n, 1)),
                                     View(ho, F32, (1, m, n), (0, n, 1)),
                                     bias=View(ha, F16, (1, m, n), (0, 0, 1), m * k + 3))
        be.execute(steps)
        got = be.download(View.contiguous(ho, F32, (m, n))).astype(np.float64)
    finally:
        for h in (ha, hb, ho):
            be.free(h)
    ref = a.astype(np.float64) @ b.astype(np.float64) + vec.astype(np.float64)
    assert len(spy.taken) == 1
    assert np.abs(got - ref).max() <= 1e-5 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).max()


def test_wide_bindings_text() -> None:
    """Only the wide handles change type; their scalar reads pick the f16 out of its chunk, as f32."""
    binds = Bindings(9, {}, {1: "f16", 2: "f16", 9: "f16"})
    binds.add(1, False)
    binds.add(2, False)
    for native, half in ((True, "bitcast<vec2<f16>>"), (False, "unpack2x16float")):
        wide = staged.WideBindings(binds, {1}, native)
        assert wide.declarations() == ["@group(0) @binding(0) var<storage, read> buf0: array<vec4<u32>>;",
                                       "@group(0) @binding(1) var<storage, read> buf1: array<f16>;",
                                       "@group(0) @binding(2) var<storage, read_write> out: array<f16>;"]
        assert wide.scalar(1, "i") == f"f32({half}(buf0[(i) >> 3u][((i) >> 1u) & 3u])[(i) & 1u])"
        assert wide.scalar(2, "i") == binds.scalar(2, "i") == "f32(buf1[i])"
        assert wide.buffers() == binds.buffers()
    assert binds.declarations()[0].endswith("buf0: array<f16>;")  # the caller's object is unchanged


# ---- which products take it -----------------------------------------------------------------------------------------
FALLBACK = {  # name: (nb, m, n, k, options): eligible for the direct kernel, not for the staged one
    "a_rows_misaligned": (1, 32, 32, 64, dict(pad=3)),
    "offset_misaligned": (2, 32, 48, 64, dict(offset=4, b_col=True)),
    "k_not_a_multiple_of_bk": (1, 64, 64, 48, {}),
    "k_misaligned_col_major": (1, 32, 32, 80, dict(b_col=True, pad=4)),
}


@pytest.mark.parametrize("name", sorted(FALLBACK))
def test_misaligned_takes_direct_kernel(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                        monkeypatch: pytest.MonkeyPatch, spy: Spy, name: str) -> None:
    nb, m, n, k, opts = FALLBACK[name]
    monkeypatch.setattr(staged, "STAGED_CHOICES", (StagedParams(2, 2, 1, 1, 32), StagedParams(2, 2, 1, 1, 64)))
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    assert labels == [sgmat.LABEL_EMULATED] and spy.taken == []
    assert worst <= 1.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_direct_kernel_when_switched_off(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                         monkeypatch: pytest.MonkeyPatch, spy: Spy, name: str) -> None:
    """STAGED = False: test_wgpu_matmul_sgmat's cases on the direct kernel (with it on, the aligned ones run staged), on
    an 8 x 8 x 8 config: the 16 x 16 x 16 4 x 4 kernel takes lavapipe 24 s to compile."""
    nb, m, n, k, tiles, opts = CASES[name]
    monkeypatch.setattr(sgmat, "STAGED", False)
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", CFG8)
    if tiles is not None:
        monkeypatch.setattr(sgmat, "TILE_CHOICES", (tiles,))
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    assert labels == [sgmat.LABEL_EMULATED] and spy.taken == []
    assert worst <= 1.0


def test_alignment_rules() -> None:
    def v(shape: tuple, strides: tuple, offset: int = 0) -> View:
        return View(1, F16, shape, strides, offset)

    a, b, bt = v((2, 32, 64), (2048, 64, 1)), v((2, 64, 48), (3072, 48, 1)), v((2, 64, 48), (3072, 1, 64))
    assert staged.aligned(a, b, False) and staged.aligned(a, bt, True)
    assert not staged.aligned(v((2, 32, 64), (2044, 64, 1)), b, False)  # A's batch stride
    assert staged.aligned(v((1, 32, 64), (2044, 64, 1)), b, False)  # ... unused without a batch
    assert not staged.aligned(a, v((2, 64, 48), (3072, 52, 1)), False)  # B's row stride
    assert not staged.aligned(a, v((2, 64, 20), (1280, 20, 1)), False)  # N for row-major B
    assert staged.aligned(a, v((2, 64, 20), (1280, 1, 64)), True)  # ... but not for B^T (rows of K)
    assert not staged.aligned(a, v((2, 64, 48), (3072, 1, 68)), True)  # B^T's row stride
    assert not staged.aligned(a, v((2, 64, 48), (3072, 1, 64), 4), True)  # B's offset
    assert not staged.aligned(v((2, 32, 64), (2048, 64, 1), 2), b, False)  # A's offset


def _views(m: int, n: int, k: int, b_col: bool = False) -> tuple[View, View, View, Bindings]:
    a = View(1, F16, (1, m, k), (0, k, 1))
    b = View(2, F16, (1, k, n), (0, 1, k) if b_col else (0, n, 1))
    out = View(3, F16, (1, m, n), (0, n, 1))
    binds = Bindings(3, {}, {1: "f16", 2: "f16", 3: "f16"})
    binds.add(1, False)
    binds.add(2, False)
    return a, b, out, binds


class FakeDevice(FakeDawn):
    def __init__(self, storage: int, invocations: int = 1024, biggest: int | None = None) -> None:
        super().__init__((CFG16,))
        self.limits = {"max-compute-workgroup-storage-size": storage,
                       "max-compute-invocations-per-workgroup": invocations, "max-compute-workgroup-size-x": 1024}
        self.subgroup_max_size = biggest


def test_native_planning() -> None:
    """Which choice a matrix GPU gets: by workgroup memory, invocations and subgroup sizes; None: the direct one."""
    native = sgmat.SgmatChoice(True, CFG16, 32, 4, 4, False)

    def plan(be: FakeDevice, *views: object) -> StagedParams | None:  # as record_sgmat's hook calls it
        return staged.plan_staged(be, *views, native, be.subgroup_max_size, sgmat.ENOUGH_WORKGROUPS,  # type: ignore
                                  sgmat.MAX_WASTE)

    big = _views(4096, 4096, 4096)
    assert plan(FakeDevice(49152), *big) == StagedParams(2, 2, 4, 4, 32, False, 8)
    assert plan(FakeDevice(20480), *big) == StagedParams(2, 2, 2, 4, 32, False, 8)  # 128 x 128 needs 23040 bytes
    # Subgroups of up to 256 lanes: 4 x 32 invocations might run as one subgroup, so only 8 x 32 choices qualify.
    assert plan(FakeDevice(49152, 1024, 256), *big) == StagedParams(2, 4, 4, 4, 32, False, 8)
    assert plan(FakeDevice(49152, 128, 256), *big) is None  # ... and those need 256 invocations
    # K a multiple of 16, not of 32: the BK = 16 choice.
    assert plan(FakeDevice(49152), *_views(4096, 4096, 4080)) == StagedParams(2, 2, 2, 2, 16, False, 8)
    assert plan(FakeDevice(8192), *big) is None  # nothing fits
    a, b, out, _ = big
    through_out = Bindings(1, {}, {1: "f16", 2: "f16"})  # A in the output's buffer: read through `out`
    through_out.add(2, False)
    assert plan(FakeDevice(49152), a, b, out, through_out) is None


def test_staged_choice() -> None:
    def choose(*args: object) -> StagedParams | None:
        return staged.choose_staged(*args, sgmat.ENOUGH_WORKGROUPS, sgmat.MAX_WASTE)  # type: ignore[arg-type]

    p44, p22, p11 = StagedParams(2, 2, 4, 4, 32), StagedParams(2, 2, 2, 2, 64), StagedParams(2, 2, 1, 1, 32)
    choices = (p44, p22, p11)
    assert choose(4096, 4096, 4096, 1, CFG16, choices) == p44
    assert choose(1024, 1024, 1024, 1, CFG16, choices) == p22  # 64 of 128 x 128 are too few
    assert choose(1024, 1024, 1056, 1, CFG16, choices) == p11  # K: BK 32, not 64
    assert choose(4096, 4096, 4096, 1, CFG16, (p22,)) == p22
    assert choose(64, 64, 48, 1, CFG16, choices) is None
    assert choose(160, 160, 64, 1, CFG16, (p44, p11)) == p11  # 128 x 128 wastes too much
    assert p44.workgroup_bytes(CFG16, False) == 2 * (128 * 40 + 32 * 136) * 2 + 4 * 16 * 16 * 4
    assert StagedParams(2, 2, 4, 4, 32, False).workgroup_bytes(CFG16, True) == (128 * 40 + 128 * 40) * 2 + 4096


# ---- the native WGSL text -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b_col,double", [(False, True), (True, False)])
def test_native_source_text(wgpu_be: ember.ComputeBackend, b_col: bool, double: bool) -> None:
    be, cfg = wgpu_be, MatrixConfig("f16", "f32", 8, 16, 4)  # distinct M, N, K: each lands in its slot
    p = StagedParams(2, 4, 2, 2, 32, double, 8)  # block 32 x 128, 256 invocations
    nb, m, n, k = 2, 48, 144, 96
    a = View(11, F16, (nb, m, k), (m * 104, 104, 1), 8)
    b = View(12, F16, (nb, k, n), (0, 1, 112) if b_col else (0, 152, 1), 16)
    out = View(13, F32, (nb, m, n), (m * n, n, 1))
    bias = View(14, F16, (nb, m, n), (0, 0, 1))
    binds = Bindings(13, {}, {11: "f16", 12: "f16", 13: "f32", 14: "f16"})
    for h in (a.handle, b.handle, bias.handle):
        binds.add(h, False)
    ep = matmul_epilogue(out, bias, 1.0, 1.0, call("relu", inp(0)), m, n, False, False, None)
    choice = sgmat.SgmatChoice(True, cfg, 32, 1, 1, b_col)  # tm / tn: the staged params' instead
    src, grid = staged.staged_source(be, a, b, out, ep, binds, choice, p)
    assert src.startswith("enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;\n"
                          "diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);\n")
    assert "${" not in src and "fn mma(" not in src and "unpack2x16float" not in src
    assert f"staged BK=32 {'double' if double else 'single'}-buffered, rows +8 (native)" in src
    assert "alias Left = subgroup_matrix_left<f16, 4, 8>;" in src
    assert "alias Right = subgroup_matrix_right<f16, 16, 4>;" in src
    assert "alias Acc = subgroup_matrix_result<f32, 16, 8>;" in src
    assert "@compute @workgroup_size(256)" in src
    assert ("@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32, "
            "@builtin(subgroup_invocation_id) lane: u32") in src
    assert "@group(0) @binding(0) var<storage, read> buf0: array<vec4<u32>>;" in src
    assert "@group(0) @binding(1) var<storage, read> buf1: array<vec4<u32>>;" in src
    assert "@group(0) @binding(2) var<storage, read> buf2: array<f16>;" in src  # the bias: scalar as before
    assert "let h0 = bitcast<vec2<f16>>(v.x);" in src and "sh_b[i + 7u] = h3.y;" in src
    nbuf = 2 if double else 1
    # A: 2 x 2 tiles of 8 rows a subgroup row -> 32 rows x (32 + 8); B^T 128 rows x 40, or B 32 rows x (128 + 8).
    assert f"var<workgroup> sh_a: array<f16, {nbuf * 32 * 40}>;" in src
    assert f"var<workgroup> sh_b: array<f16, {nbuf * (128 * 40 if b_col else 32 * 136)}>;" in src
    assert "var<workgroup> scratch: array<f32, 1024>;" in src  # 8 subgroups x 8 x 16
    assert "subgroupMatrixLoad<Left>(&sh_a, abuf + ta_1 + kk, false, 40u)" in src
    right = ("subgroupMatrixLoad<Right>(&sh_b, bbuf + tb_1 + kk, true, 40u)" if b_col
             else "subgroupMatrixLoad<Right>(&sh_b, bbuf + tb_1 + kk * 136u, false, 136u)")
    assert right in src and "kk += 4u" in src
    assert src.count("subgroupMatrixMultiplyAccumulate(") == 4
    assert "let ta_1 = (sg_row + 8u) * 40u;" in src and "let sg_row = (sg / 4u) * 16u;" in src
    # Chunks: A 32 x 4 = 128 for 256 invocations (guarded); A rows clamped to M, in vec4s: z * (48 * 104 / 8).
    assert "let ga_0 = z * 624u + min(brow + lid / 4u, 47u) * 13u + 1u + lid % 4u;" in src
    first = "ra_0 = buf0[ga_0];" if double else "ra_0 = buf0[ga_0 + (s) * 4u];"
    assert f"if (lid < 128u) {{ {first} }}" in src
    if b_col:  # B^T rows (N) clamped, 96 / 8 vec4s per K block... 4 a block of 32
        assert "let gb_0 = min(bcol + lid / 4u, 143u) * 14u + 2u + lid % 4u;" in src
        assert "let gb_1 = min(bcol + (lid + 256u) / 4u, 143u) * 14u + 2u + (lid + 256u) % 4u;" in src
    else:  # B rows of K, chunk columns clamped to N / 8 - 1
        assert "let gb_0 = lid / 16u * 19u + 2u + min(bcol / 8u + lid % 16u, 17u);" in src
    # The epilogue's 2 a tile, the first's 1 (4 tiles: 7); the K loop's 1 and the prologue's, or the loop's 2.
    assert src.count("workgroupBarrier()") == 7 + 2
    assert src.count("for (var s = 0u; s < 3u; s++)") == 1
    assert grid == (2 * 2 * 2, 1, 1) and "if (g >= 8u) { return; }" in src  # 2 block rows, 2 columns, Z = 2


def test_emulated_source_unpacks(wgpu_be: ember.ComputeBackend) -> None:
    """The emulated text uses the same arrays, with unpack2x16float where naga lacks the f16 bitcast."""
    a, b, out, binds = _views(64, 64, 64)
    ep = matmul_epilogue(out, None, 1.0, 1.0, None, 64, 64, False, False, None)
    src, _ = staged.staged_source(wgpu_be, a, b, out, ep, binds, sgmat.SgmatChoice(False, CFG16, 32, 1, 1, False),
                                  StagedParams(2, 2, 1, 1, 32))
    assert "vec2<f16>(unpack2x16float(v.x))" in src and "bitcast<vec2<f16>>" not in src
    assert "fn mma(" in src and "sh_a[lo + r * 40u + kk]" in src and "sh_b[ro + kk * 40u + c]" in src
    assert "let left_0 = abuf + ta_0 + kk;" in src and "mma(lane, left_0, right_0, &acc_0_0);" in src


# ---- the native kernel: on the matrix units where the adapter has them, else the GEMM, both against the oracle -----
NATIVE = {  # name: (choice index or None (the plan's), nb, m, n, k, options)
    "plan_4096_like": (None, 1, 256, 256, 256, {}),
    "first_choice_batch_col_major_f16": (0, 2, 144, 240, 96, dict(b_col=True, out_dtype=F16, bias="n")),
    "block_64x128_residual_gelu": (2, 1, 128, 128, 128, dict(residual=True, act="gelu", pad=8)),
    "block_32x64_shared_b": (4, 2, 160, 128, 64, dict(b_shared=True)),
    "block_64x32_row_bias_offsets": (5, 1, 96, 272, 96, dict(bias="m", offset=8, pad=8)),
    "double_small_blocks_relu_f16": (6, 3, 48, 80, 64, dict(out_dtype=F16, act="relu")),
    "bk16_col_major": (7, 1, 64, 96, 80, dict(b_col=True)),
}


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_native_or_gemm_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                       monkeypatch: pytest.MonkeyPatch, spy: Spy, name: str) -> None:
    """EMBER_MATRIX=on: with an f16 -> f32 config the native staged kernel runs (where the forced choice builds on
    the adapter, else the direct one); without one the same products take the tiled GEMM."""
    index, nb, m, n, k, opts = NATIVE[name]
    if index is not None:
        monkeypatch.setattr(staged, "STAGED_CHOICES", (staged.STAGED_CHOICES[index],))
    with settings.override(matrix="on"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    cfg = next((c for c in getattr(wgpu_be, "matrix_configs", ()) if c.component == "f16" and c.result == "f32"),
               None)
    if cfg is not None:
        assert labels == [sgmat.LABEL_NATIVE]
        size = sgmat.subgroup_size(wgpu_be, cfg)  # type: ignore[arg-type]
        builds = [p for p in staged.STAGED_CHOICES if staged.usable(
            p, cfg, bool(opts.get("b_col")), size or 0, True, wgpu_be.limits,  # type: ignore[attr-defined]
            sgmat._max_subgroup_size(wgpu_be))]
        assert len(spy.taken) == (1 if builds else 0), (builds, spy.taken)
    else:
        assert sgmat.LABEL_NATIVE not in labels and sgmat.LABEL_EMULATED not in labels and spy.taken == []
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound ({labels})"
