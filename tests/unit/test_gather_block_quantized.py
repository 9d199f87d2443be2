"""GatherBlockQuantized (com.microsoft, src/ember/ops/gather_quantized.py) on every backend: random codes, zero
points and scales, packed here the way ONNX Runtime reads them (uint8: 8 / bits codes a byte, low bits first, along
the last axis). Each output is compared with a float64 numpy dequantise-then-gather reference and with ONNX Runtime
CPU. Cases this onnxruntime build refuses (bits=2 / 8 and int4 / uint4 data came after the op itself) are checked
against the reference only."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

from .test_matmul_nbits import pack  # codes into bytes, low bits first: MatMulNBits' packing

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
ELEM = {"uint8": TensorProto.UINT8, "int4": TensorProto.INT4, "uint4": TensorProto.UINT4}
FLOAT = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def expand(per_block: np.ndarray, axis: int, block: int, length: int) -> np.ndarray:
    idx = np.arange(length) // block
    return np.take(per_block, idx, axis=axis)


class Case:
    """One GatherBlockQuantized model over a random table of `shape` codes."""

    def __init__(self, rng: np.random.Generator, shape: tuple[int, ...], *, kind: str = "uint8", bits: int = 4,
                 block: int = 16, zp: bool = False, scale_dtype: type = np.float32, gather_axis: int = 0,
                 quantize_axis: int | None = None, indices: np.ndarray | None = None,
                 index_dtype: type = np.int64, attrs: dict | None = None) -> None:
        q = len(shape) - 1 if quantize_axis is None else quantize_axis % len(shape)
        lo, hi = (-8, 8) if kind == "int4" else (0, 1 << bits)
        codes = rng.integers(lo, hi, shape).astype(np.int32)
        nb = -(-shape[q] // block)
        sshape = tuple(nb if i == q else d for i, d in enumerate(shape))
        scales = rng.uniform(0.01, 0.5, sshape).astype(scale_dtype)
        zcodes = rng.integers(lo, hi, sshape).astype(np.int32) if zp else None
        default_zero = (1 << (bits - 1)) if kind == "uint8" else 0
        zeros = zcodes if zcodes is not None else np.full(sshape, default_zero, np.int32)
        table = (codes - expand(zeros, q, block, shape[q])) * expand(scales.astype(np.float64), q, block, shape[q])
        if indices is None:
            indices = rng.integers(0, shape[gather_axis], (2, 3))
        self.indices = indices.astype(index_dtype)
        self.want = np.take(table, self.indices, axis=gather_axis, mode="wrap")  # float64 (wrap: the bad-index test)
        self.dtype = scale_dtype

        inits = [numpy_helper.from_array(scales, "scales")]
        if kind == "uint8":
            inits.append(numpy_helper.from_array(pack(codes.astype(np.uint8), bits), "data"))
            if zcodes is not None:
                inits.append(numpy_helper.from_array(pack(zcodes.astype(np.uint8), bits), "zp"))
        else:
            inits.append(helper.make_tensor("data", ELEM[kind], shape, codes.reshape(-1).tolist()))
            if zcodes is not None:
                inits.append(helper.make_tensor("zp", ELEM[kind], sshape, zcodes.reshape(-1).tolist()))
        node_attrs = {"block_size": block, "gather_axis": gather_axis}
        if bits != 4:
            node_attrs["bits"] = bits
        if quantize_axis is not None:
            node_attrs["quantize_axis"] = quantize_axis
        node_attrs.update(attrs or {})
        inputs = ["data", "idx", "scales"] + (["zp"] if zp else [])
        node = helper.make_node("GatherBlockQuantized", inputs, ["y"], domain=MS, name="gbq_node", **node_attrs)
        graph = helper.make_graph(
            [node], "g",
            [helper.make_tensor_value_info("idx", helper.np_dtype_to_tensor_dtype(self.indices.dtype),
                                           self.indices.shape)],
            [helper.make_tensor_value_info("y", FLOAT[scale_dtype], None)], initializer=inits)
        self.model = helper.make_model(graph, opset_imports=OPSETS)
        self.feeds = {"idx": self.indices}

    def ember(self, backend_name: str) -> np.ndarray:
        return ember.load_onnx(self.model.SerializeToString(), backend=backend_name).run(self.feeds)["y"]

    def ort(self) -> np.ndarray:
        sess = ort.InferenceSession(self.model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, self.feeds)[0]


def check(case: Case, backend_name: str, *, ort_optional: bool = False) -> None:
    got = case.ember(backend_name)
    assert got.dtype == case.dtype and got.shape == case.want.shape
    tol = 1e-3 if case.dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), case.want, rtol=tol, atol=tol * np.abs(case.want).max())
    try:
        ref = case.ort()
    except Exception as e:  # noqa: BLE001  (only where the case says this ORT build may refuse it)
        if not ort_optional:
            raise
        print(f"onnxruntime {ort.__version__} refuses the case ({str(e)[:200]}); checked against numpy only")
        return
    np.testing.assert_array_equal(got, ref)  # the same float32 products, rounded the same way


@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("cols", [64, 40, 256])  # 40: the last block short of block_size
def test_gather_block_quantized_4bit(backend_name: str, rng: np.random.Generator, block: int, zp: bool,
                                    cols: int) -> None:
    check(Case(rng, (7, cols), block=block, zp=zp), backend_name)


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("bits", [8, 2])
def test_gather_block_quantized_8_and_2_bits(backend_name: str, rng: np.random.Generator, bits: int,
                                            zp: bool) -> None:
    check(Case(rng, (6, 48), bits=bits, block=16, zp=zp), backend_name, ort_optional=True)


@pytest.mark.parametrize("zp", [False, True])
def test_gather_block_quantized_float16(backend_name: str, rng: np.random.Generator, zp: bool) -> None:
    check(Case(rng, (9, 64), block=32, zp=zp, scale_dtype=np.float16), backend_name)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_block_quantized_negative_indices(backend_name: str, rng: np.random.Generator,
                                                 index_dtype: type) -> None:
    idx = np.array([[-1, 0, 3], [-5, 2, -2]])
    check(Case(rng, (5, 32), indices=idx, index_dtype=index_dtype, zp=True), backend_name)


def test_gather_block_quantized_rank3(backend_name: str, rng: np.random.Generator) -> None:
    check(Case(rng, (4, 3, 32), quantize_axis=2), backend_name)
    check(Case(rng, (4, 3, 32), quantize_axis=-1, zp=True), backend_name)


@pytest.mark.parametrize("kind", ["int4", "uint4"])
@pytest.mark.parametrize("axes", [(0, 1), (1, 0)])
def test_gather_block_quantized_int4(backend_name: str, rng: np.random.Generator, kind: str,
                                     axes: tuple[int, int]) -> None:
    gather, quant = axes
    idx = rng.integers(0, (6, 32)[gather], (2, 3))
    check(Case(rng, (6, 32), kind=kind, zp=True, gather_axis=gather, quantize_axis=quant, indices=idx),
          backend_name, ort_optional=True)


def test_gather_block_quantized_scalar_index(backend_name: str, rng: np.random.Generator) -> None:
    check(Case(rng, (5, 32), indices=np.array(3)), backend_name)


# ---- errors ------------------------------------------------------------------------------------------------------
def load_and_run(case: Case, backend_name: str) -> None:
    ember.load_onnx(case.model.SerializeToString(), backend=backend_name).run(case.feeds)


def replace_init(case: Case, name: str, arr: np.ndarray) -> None:
    inits = case.model.graph.initializer
    for i, t in enumerate(inits):
        if t.name == name:
            inits[i].CopyFrom(numpy_helper.from_array(arr, name))


@pytest.mark.parametrize("block", [8, 24, 0])
def test_gather_block_quantized_bad_block_size(backend_name: str, rng: np.random.Generator, block: int) -> None:
    case = Case(rng, (4, 32), attrs={"block_size": block})
    with pytest.raises(ValueError, match=f"gbq_node.*block_size={block}; it must be a power of 2, at least 16"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_bad_bits(backend_name: str, rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match="gbq_node.*bits=3; expected 2, 4 or 8"):
        load_and_run(Case(rng, (4, 32), attrs={"bits": 3}), backend_name)
    with pytest.raises(ValueError, match="gbq_node.*bits=8 with int4 data; int4 data takes bits=4"):
        load_and_run(Case(rng, (4, 32), kind="int4", attrs={"bits": 8}), backend_name)


@pytest.mark.parametrize("attrs", [{"quantize_axis": 0}, {"gather_axis": 1}])
def test_gather_block_quantized_uint8_axes(backend_name: str, rng: np.random.Generator, attrs: dict) -> None:
    with pytest.raises(ValueError, match="gbq_node.*with uint8 data of rank 2; expected gather_axis 0 and "
                                         "quantize_axis 1"):
        load_and_run(Case(rng, (4, 32), attrs=attrs), backend_name)


def test_gather_block_quantized_rank3_default_quantize_axis(backend_name: str, rng: np.random.Generator) -> None:
    # quantize_axis defaults to 1, which for rank-3 uint8 data is not the last axis (ONNX Runtime refuses it too)
    case = Case(rng, (4, 3, 32))
    node = case.model.graph.node[0]
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute("block_size", 16)])
    with pytest.raises(ValueError, match="gbq_node.*quantize_axis=1 with uint8 data of rank 3"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_axis_out_of_range(backend_name: str, rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match="gbq_node.*quantize_axis=2 is out of range for data of rank 2"):
        load_and_run(Case(rng, (4, 32), attrs={"quantize_axis": 2}), backend_name)


def test_gather_block_quantized_bad_scales(backend_name: str, rng: np.random.Generator) -> None:
    case = Case(rng, (4, 64), block=16)
    replace_init(case, "scales", np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"gbq_node.*scales have shape \(4, 3\), expected \(4, 4\)"):
        load_and_run(case, backend_name)
    replace_init(case, "scales", np.ones((16,), np.float32))
    with pytest.raises(ValueError, match=r"gbq_node.*scales have shape \(16,\), expected \(4, 4\)"):
        load_and_run(case, backend_name)
    replace_init(case, "scales", np.ones((4, 4), np.float64))
    with pytest.raises(ValueError, match="gbq_node.*scales are float64; expected float32 or float16"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_bad_zero_points(backend_name: str, rng: np.random.Generator) -> None:
    case = Case(rng, (4, 96), block=16, zp=True)  # 6 blocks: 3 zero-point bytes a row
    replace_init(case, "zp", np.zeros((4, 6), np.uint8))
    with pytest.raises(ValueError, match=r"gbq_node.*zero_points have shape \(4, 6\), expected \(4, 3\)"):
        load_and_run(case, backend_name)
    replace_init(case, "zp", np.zeros((4, 3), np.int8))
    with pytest.raises(ValueError, match="gbq_node.*zero_points are int8; expected data's dtype uint8"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_bad_data(backend_name: str, rng: np.random.Generator) -> None:
    case = Case(rng, (4, 32))
    replace_init(case, "data", np.zeros((4, 16), np.int8))
    with pytest.raises(ValueError, match="gbq_node.*data is int8; expected uint8"):
        load_and_run(case, backend_name)
    replace_init(case, "data", np.zeros((16,), np.uint8))
    replace_init(case, "scales", np.ones((2,), np.float32))
    with pytest.raises(ValueError, match=r"gbq_node.*data has shape \(16,\); expected rank 2 or more"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_input_count(backend_name: str, rng: np.random.Generator) -> None:
    case = Case(rng, (4, 32))
    del case.model.graph.node[0].input[2:]
    with pytest.raises(ValueError, match="gbq_node.*2 input.*3 to 4"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_computed_data(backend_name: str, rng: np.random.Generator) -> None:
    """data fed at run time: the table cannot be dequantised while planning."""
    case = Case(rng, (4, 32))
    graph = case.model.graph
    data = next(t for t in graph.initializer if t.name == "data")
    graph.initializer.remove(data)
    graph.input.append(helper.make_tensor_value_info("data", TensorProto.UINT8, (4, 16)))
    case.feeds["data"] = numpy_helper.to_array(data)
    with pytest.raises(NotImplementedError, match="gbq_node.*input 'data' must be a constant"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_out_of_range_index(rng: np.random.Generator) -> None:
    """ONNX Runtime writes zeros for an out-of-range row; ember's cpu backend refuses it (Gather's check). wgpu
    clamps run-time Gather indices (docs/limits.md), so this is a cpu test."""
    backend_name = "cpu"
    case = Case(rng, (4, 32), indices=np.array([0, 4]))
    assert not case.ort()[1].any()
    with pytest.raises(ValueError, match="out of range"):
        load_and_run(case, backend_name)


def test_gather_block_quantized_reuses_table(rng: np.random.Generator) -> None:
    """Plans for several index shapes share one dequantised table."""
    from ember.ops import gather_quantized

    case = Case(rng, (8, 64), zp=True)
    case.model.graph.input[0].CopyFrom(helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"]))
    m = ember.load_onnx(case.model.SerializeToString(), backend="cpu")
    ref = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    before = len(gather_quantized._TABLES)
    for shape in [(1,), (3,), (6,)]:
        idx = rng.integers(-8, 8, shape)
        np.testing.assert_array_equal(m.run({"idx": idx})["y"], ref.run(None, {"idx": idx})[0])
    assert len(gather_quantized._TABLES) <= before + 1

