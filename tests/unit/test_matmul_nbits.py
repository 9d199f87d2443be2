"""MatMulNBits (com.microsoft, src/ember/ops/quant_matmul.py) on every backend: weights quantised here in numpy the
way ONNX Runtime's own tests do (per block min/max, a zero point, codes packed low-first), and through
onnxruntime.quantization's MatMulNBitsQuantizer (the exporter path). Each output is compared with ONNX Runtime CPU
and with a float64 numpy dequantisation (the gate at the op's exact dequantised arithmetic), at rtol 1e-4 and an
absolute 1e-4 of the output's largest magnitude (float32 accumulation orders differ)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]


def quantize(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w (N, K) -> codes (N, n_blocks, block) uint8, scales (N, n_blocks), zero points (N, n_blocks) uint8."""
    n, k = w.shape
    nb = -(-k // block)
    padded = np.zeros((n, nb * block), np.float32)
    padded[:, :k] = w
    blocks = padded.reshape(n, nb, block)
    qmax = (1 << bits) - 1
    hi, lo = np.maximum(blocks.max(-1), 0), np.minimum(blocks.min(-1), 0)
    scales = ((hi - lo) / qmax).astype(np.float32)
    scales[scales == 0] = 1
    zp = np.clip(np.round(-lo / scales), 0, qmax).astype(np.uint8)
    codes = np.clip(np.round(blocks / scales[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    return codes, scales, zp


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes along the last axis into bytes, low bits first (the last byte zero-padded)."""
    per = 8 // bits
    length = codes.shape[-1]
    padded = np.zeros((*codes.shape[:-1], -(-length // per) * per), np.uint32)
    padded[..., :length] = codes
    grouped = padded.reshape(*codes.shape[:-1], -1, per)
    out = np.zeros(grouped.shape[:-1], np.uint32)
    for i in range(per):
        out |= grouped[..., i] << (bits * i)
    return out.astype(np.uint8)


def reference(a: np.ndarray, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, k: int,
              g_idx: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    """float64 A @ dequant(B)ᵀ + bias; zeros (N, n_blocks) as floats."""
    n, nb, block = codes.shape
    q = codes.reshape(n, nb * block)[:, :k].astype(np.float64)
    blk = np.arange(k) // block if g_idx is None else g_idx
    w = (q - zeros.astype(np.float64)[:, blk]) * scales.astype(np.float64)[:, blk]
    y = a.astype(np.float64) @ w.T
    return y + bias.astype(np.float64) if bias is not None else y


class Case:
    """One MatMulNBits model with its quantised weight, built from a random float weight."""

    def __init__(self, rng: np.random.Generator, bits: int, block: int, k: int, n: int, zp: str, bias: bool,
                 g_idx: bool = False, scales_2d: bool = False, a_dims: list | None = None,
                 accuracy_level: int = 0) -> None:
        w = rng.standard_normal((n, k)).astype(np.float32)
        codes, scales, zpc = quantize(w, bits, block)
        self.k, self.codes, self.scales = k, codes, scales
        inits = {"B": pack(codes, bits), "scales": scales if scales_2d else scales.reshape(-1)}
        self.zeros = np.full(scales.shape, 1 << (bits - 1), np.float32)
        if zp == "packed":
            inits["zp"] = pack(zpc, bits).reshape(-1)
            self.zeros = zpc.astype(np.float32)
        elif zp == "float":
            self.zeros = (zpc + rng.uniform(-0.5, 0.5, zpc.shape)).astype(np.float32)
            inits["zp"] = self.zeros.reshape(-1)
        self.g_idx = None
        if g_idx:
            self.g_idx = (np.arange(k) // block).astype(np.int32)
            rng.shuffle(self.g_idx)
            inits["g_idx"] = self.g_idx
        self.bias = rng.standard_normal(n).astype(np.float32) if bias else None
        if bias:
            inits["bias"] = self.bias
        names = ["a", "B", "scales", "zp" if zp != "none" else "", "g_idx" if g_idx else "", "bias" if bias else ""]
        while not names[-1]:
            names.pop()
        node = helper.make_node("MatMulNBits", names, ["y"], "nbits_node", domain=MS, K=k, N=n, bits=bits,
                                block_size=block, accuracy_level=accuracy_level)
        dims = a_dims if a_dims is not None else ["batch", k]
        graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, dims)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(v, name) for name, v in inits.items()])
        self.model = helper.make_model(graph, opset_imports=OPSETS)

    def reference(self, a: np.ndarray) -> np.ndarray:
        return reference(a, self.codes, self.scales, self.zeros, self.k, self.g_idx, self.bias)


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()), err_msg=what)


def run_both(model: onnx.ModelProto, feeds: list[np.ndarray], backend_name: str, ort_reference: bool = True
             ) -> list[np.ndarray]:
    data = model.SerializeToString()
    m = ember.load_onnx(data, backend=backend_name)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"]) if ort_reference else None
    outs = []
    for a in feeds:
        got = m.run({"a": a})["y"]
        if sess is not None:
            close(got, sess.run(None, {"a": a})[0], "vs onnxruntime")
        outs.append(got)
    return outs


@pytest.mark.parametrize(("bits", "block", "k", "n", "zp", "bias"), [
    (4, 16, 64, 8, "none", False),
    (4, 32, 100, 7, "packed", True),      # K not a multiple of the block (the last one padded), N odd
    (4, 16, 100, 5, "packed", False),     # 7 blocks: the packed zero points' last byte half used
    (4, 64, 200, 9, "float", True),
    (4, 128, 300, 11, "packed", True),
    (8, 16, 48, 6, "none", True),
    (8, 32, 100, 7, "packed", False),
    (8, 64, 130, 5, "packed", True),
    (8, 128, 256, 3, "none", False),
    (2, 32, 100, 7, "packed", True),
    (2, 16, 72, 4, "float", False),
    (4, 32, 520, 130, "packed", True),    # several GEMV column groups and output tiles
])
def test_matmul_nbits(backend_name: str, bits: int, block: int, k: int, n: int, zp: str, bias: bool) -> None:
    rng = np.random.default_rng(bits * 1000 + block + k)
    case = Case(rng, bits, block, k, n, zp, bias)
    feeds = [rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal((15, k)).astype(np.float32)]
    for a, got in zip(feeds, run_both(case.model, feeds, backend_name), strict=True):
        close(got, case.reference(a), "vs float64")


@pytest.mark.parametrize("a_shape", [(1, 1, 4), (3, 5, 4), (4,), (2, 70, 4)])
def test_matmul_nbits_batch_dims(backend_name: str, a_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(a_shape))
    k = 96
    shape = (*a_shape[:-1], k)
    case = Case(rng, 4, 32, k, 13, "packed", True, scales_2d=True, a_dims=list(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    (got,) = run_both(case.model, [a], backend_name)
    close(got, case.reference(a), "vs float64")


def test_matmul_nbits_accuracy_level(backend_name: str) -> None:
    # accuracy_level 4 lets ONNX Runtime quantise A to int8 (its results move by ~1 %); ember computes in float
    # at every level: the float64 gate only.
    rng = np.random.default_rng(4)
    case = Case(rng, 4, 32, 64, 8, "packed", False, accuracy_level=4)
    a = rng.standard_normal((2, 64)).astype(np.float32)
    (got,) = run_both(case.model, [a], backend_name, ort_reference=False)
    close(got, case.reference(a), "vs float64")


@pytest.mark.parametrize(("bits", "zp", "ort_reference"), [
    (4, "none", True), (4, "float", True),
    # ONNX Runtime 1.32's CPU kernel ignores uint8 zero points with g_idx and has no 8-bit g_idx: float64 only
    (4, "packed", False), (8, "packed", False),
])
def test_matmul_nbits_g_idx(backend_name: str, bits: int, zp: str, ort_reference: bool) -> None:
    rng = np.random.default_rng(bits)
    case = Case(rng, bits, 32, 128, 6, zp, True, g_idx=True)
    feeds = [rng.standard_normal((1, 128)).astype(np.float32), rng.standard_normal((9, 128)).astype(np.float32)]
    for a, got in zip(feeds, run_both(case.model, feeds, backend_name, ort_reference), strict=True):
        close(got, case.reference(a), "vs float64")


def test_matmul_nbits_quantizer(backend_name: str) -> None:
    """A float MatMul model quantised by onnxruntime.quantization (the exporter path), against ONNX Runtime."""
    mnq = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    rng = np.random.default_rng(7)
    k, n = 160, 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    node = helper.make_node("MatMul", ["a", "w"], ["y"], "mm")
    graph = helper.make_graph([node], "float", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for symmetric in (False, True):
        config = mnq.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric, bits=4)
        quant = mnq.MatMulNBitsQuantizer(model, algo_config=config)
        quant.process()
        q = quant.model.model
        assert [nd.op_type for nd in q.graph.node] == ["MatMulNBits"]
        feeds = [rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal((6, k)).astype(np.float32)]
        for a, got in zip(feeds, run_both(q, feeds, backend_name), strict=True):
            assert np.abs(got - a @ w).max() < 0.2 * np.abs(a @ w).max()  # quantisation error, not a wrong op


def test_matmul_nbits_float16(backend_name: str) -> None:
    rng = np.random.default_rng(16)
    k, n = 64, 10
    case = Case(rng, 4, 32, k, n, "packed", True)
    g = case.model.graph
    for t in list(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    g.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    g.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    data = case.model.SerializeToString()
    try:
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (an onnxruntime build without the float16 kernel)
        pytest.skip(f"onnxruntime has no float16 MatMulNBits: {e}")
    m = ember.load_onnx(data, backend=backend_name)
    a = rng.standard_normal((3, k)).astype(np.float16)
    got, want = m.run({"a": a})["y"], sess.run(None, {"a": a})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2,
                               atol=2e-2 * float(np.abs(want).max()))


# ---- bad input ---------------------------------------------------------------------------------------------------
def load_and_run(case: Case, backend_name: str) -> None:
    """Load (a plan is built there for a static input shape) and run (where the plan is built for a symbolic one)."""
    m = ember.load_onnx(case.model.SerializeToString(), backend=backend_name)
    m.run({"a": np.ones((1, case.k), np.float32)})


def test_matmul_nbits_wrong_packed_shape(backend_name: str) -> None:
    case = Case(np.random.default_rng(0), 4, 32, 100, 7, "none", False)
    b = case.model.graph.initializer[0]
    b.CopyFrom(numpy_helper.from_array(np.zeros((7, 3, 16), np.uint8), "B"))  # 100 / 32 needs 4 blocks
    with pytest.raises(ValueError, match="nbits_node.*input B has shape"):
        load_and_run(case, backend_name)


def test_matmul_nbits_wrong_scales(backend_name: str) -> None:
    case = Case(np.random.default_rng(0), 8, 32, 64, 5, "none", False)
    s = case.model.graph.initializer[1]
    s.CopyFrom(numpy_helper.from_array(np.ones(9, np.float32), "scales"))
    with pytest.raises(ValueError, match="nbits_node.*scales have shape"):
        load_and_run(case, backend_name)


def test_matmul_nbits_three_bits(backend_name: str) -> None:
    case = Case(np.random.default_rng(0), 4, 32, 64, 5, "none", False)
    for attr in case.model.graph.node[0].attribute:
        if attr.name == "bits":
            attr.i = 3
    with pytest.raises(NotImplementedError, match="bits=3"):
        ember.load_onnx(case.model.SerializeToString(), backend=backend_name)


def test_matmul_nbits_bad_block_size(backend_name: str) -> None:
    case = Case(np.random.default_rng(0), 4, 32, 64, 5, "none", False)
    for attr in case.model.graph.node[0].attribute:
        if attr.name == "block_size":
            attr.i = 24
    with pytest.raises(ValueError, match="nbits_node.*block_size=24"):
        ember.load_onnx(case.model.SerializeToString(), backend=backend_name)


def test_matmul_nbits_computed_scales(backend_name: str) -> None:
    """Scales and float zero points fed at run time (not constants): dequantised on every run."""
    rng = np.random.default_rng(11)
    k, n = 96, 7
    case = Case(rng, 4, 32, k, n, "float", True)
    g = case.model.graph
    keep = [t for t in g.initializer if t.name not in ("scales", "zp")]
    del g.initializer[:]
    g.initializer.extend(keep)
    g.input.extend([helper.make_tensor_value_info("scales", TensorProto.FLOAT, [n * 3]),
                    helper.make_tensor_value_info("zp", TensorProto.FLOAT, [n * 3])])
    data = case.model.SerializeToString()
    m = ember.load_onnx(data, backend=backend_name)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for scale in (1.0, 0.5):
        a = rng.standard_normal((2, k)).astype(np.float32)
        feeds = {"a": a, "scales": case.scales.reshape(-1) * scale, "zp": case.zeros.reshape(-1)}
        got = m.run(feeds)["y"]
        close(got, sess.run(None, feeds)[0], "vs onnxruntime")
        bias = case.bias
        assert bias is not None
        close(got, reference(a, case.codes, case.scales * scale, case.zeros, k, None, bias), "vs float64")
