"""GatherBlockQuantized (com.microsoft): a Gather from a block-quantised table, as ONNX Runtime GenAI's model builder
writes quantised (tied) embeddings.

    out = Gather(dequant(data), indices, axis=gather_axis),
    dequant(data)[..., j, ...] = (code[..., j, ...] - zero(b)) * scale(b),   b = j // block_size along quantize_axis

- data uint8: `bits` 2, 4 or 8; with 2 or 4 bits each byte holds 8 / bits codes, low bits first, along the last
  axis (the output's last dim is data's times 8 / bits). ONNX Runtime requires gather_axis 0 and quantize_axis the
  last axis for it. zero_points are uint8 codes packed the same way along the last axis (ceil(n_blocks * bits / 8)
  bytes a row); absent, the zero point is 2^(bits - 1) (8 for 4 bits, 128 for 8), MatMulNBits' convention.
- data int4 / uint4 (bits 4): one code an element, any gather_axis and quantize_axis; zero_points of data's dtype
  and scales' shape; absent, the zero point is 0.
- scales: data's rank, ceil(dim / block_size) along quantize_axis (dim counted in codes), data's dims elsewhere;
  float32 or float16, which is the output's dtype. The arithmetic is ONNX Runtime's CPU kernel's: float(code -
  zero) * float(scale), rounded to the output dtype.

data, scales and zero_points must be constants (initializers, as every exporter writes them): the table is
dequantised on the host once per model (cached while its sources live, and keyed in the weight pool by their
identity) and the gather is a plain Gather over it, on every backend. That costs the table's float size in
device memory (and, while the model lives, in host memory) instead of the packed size.

Difference from ONNX Runtime (1.32): an out-of-range index is an error (Gather's: a ValueError for indices known
while planning, and at run time on cpu; clamped on wgpu), where ONNX Runtime writes zeros for that row.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Any

import numpy as np

from .base import Context, Tensor, call_op, register
from .contrib import MS, _Contrib
from .quant_matmul import unpack_codes

_PACKED = "uint8"
_NIBBLE = ("int4", "uint4")  # ml_dtypes' names for ONNX's INT4 / UINT4 (numpy_helper's arrays)

# Dequantised tables by the ids of their sources (data, scales, zero_points) and the node's attributes; an entry
# goes when any source is collected (weakref.finalize), so an id in a key always names the array it was made from.
_TABLES: dict[Hashable, np.ndarray] = {}
_LOCK = threading.Lock()


def _forget(key: Hashable) -> None:
    with _LOCK:
        _TABLES.pop(key, None)


def _codes(arr: np.ndarray) -> np.ndarray:
    """int4 / uint4 / uint8 codes as int32."""
    return np.asarray(arr).astype(np.int32)


def _along(values: np.ndarray, axis: int, block: int, length: int) -> np.ndarray:
    """Per-block values (one per block along `axis`) repeated to one per element, cut to `length`."""
    return np.repeat(values, block, axis=axis).take(np.arange(length), axis=axis)


@register("GatherBlockQuantized", 1, MS)
class GatherBlockQuantized(_Contrib):
    arity = (3, 4)
    f16 = True  # the only kernel is Gather's, which stores float16
    attrs = {"gather_axis": 0, "quantize_axis": 1, "block_size": 128, "bits": 4}

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        self.block, self.bits = int(self.attr["block_size"]), int(self.attr["bits"])
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"{node.describe()}: block_size={self.block}; it must be a power of 2, at least 16")
        if self.bits not in (2, 4, 8):
            raise ValueError(f"{node.describe()}: bits={self.bits}; expected 2, 4 or 8 (uint8 data) or 4 "
                             "(int4 / uint4 data)")

    def _bad(self, what: str) -> ValueError:
        return ValueError(f"{self.node.describe()}: {what}")

    def _axes(self, data: Tensor) -> tuple[int, int]:
        rank = data.rank
        if rank < 2:
            raise self._bad(f"data has shape {data.shape}; expected rank 2 or more")
        axes = []
        for name in ("gather_axis", "quantize_axis"):
            a = int(self.attr[name])
            if not -rank <= a < rank:
                raise self._bad(f"{name}={a} is out of range for data of rank {rank}")
            axes.append(a % rank)
        gather, quant = axes
        if data.dtype.name == _PACKED and (gather != 0 or quant != rank - 1):
            raise self._bad(f"gather_axis={self.attr['gather_axis']}, quantize_axis={self.attr['quantize_axis']} "
                            f"with uint8 data of rank {rank}; expected gather_axis 0 and quantize_axis {rank - 1} "
                            "(the last axis, which holds the packed codes)")
        return gather, quant

    def _check(self, data: Tensor, indices: Tensor, scales: Tensor,
               zp: Tensor | None) -> tuple[int, int, tuple[int, ...]]:
        """(gather_axis, quantize_axis, data's shape in codes), or a ValueError saying what is wrong."""
        kind = data.dtype.name
        if kind != _PACKED and kind not in _NIBBLE:
            raise self._bad(f"data is {data.dtype}; expected uint8 (packed codes), int4 or uint4")
        if kind in _NIBBLE and self.bits != 4:
            raise self._bad(f"bits={self.bits} with {kind} data; {kind} data takes bits=4")
        if indices.dtype not in (np.int32, np.int64):
            raise self._bad(f"indices are {indices.dtype}; expected int32 or int64")
        if scales.dtype.name == "bfloat16":
            raise self.fail("bfloat16 scales are not supported (ONNX Runtime's CPU kernel refuses them too)")
        if scales.dtype not in (np.float32, np.float16):
            raise self._bad(f"scales are {scales.dtype}; expected float32 or float16 (the output's dtype)")
        gather, quant = self._axes(data)
        per = 8 // self.bits if kind == _PACKED else 1
        logical = tuple(d * per if i == quant else d for i, d in enumerate(data.shape))
        n_blocks = -(-logical[quant] // self.block)
        want = tuple(n_blocks if i == quant else d for i, d in enumerate(logical))
        if scales.shape != want:
            raise self._bad(f"scales have shape {scales.shape}, expected {want} (data {data.shape} is {logical} "
                            f"codes at bits={self.bits}: ceil({logical[quant]} / block_size {self.block}) = "
                            f"{n_blocks} block(s) along quantize_axis {quant})")
        if zp is not None:
            if zp.dtype != data.dtype:
                raise self._bad(f"zero_points are {zp.dtype}; expected data's dtype {data.dtype}")
            zwant = tuple(-(-d // per) if i == quant else d for i, d in enumerate(want))
            if zp.shape != zwant:
                packed = f", {per} codes a byte along quantize_axis" if per > 1 else ""
                raise self._bad(f"zero_points have shape {zp.shape}, expected {zwant} (scales' shape {want}"
                                f"{packed})")
        return gather, quant, logical

    def _table(self, data: Tensor, scales: Tensor, zp: Tensor | None, quant: int,
               logical: tuple[int, ...]) -> np.ndarray:
        """The whole dequantised table, in scales' dtype (cached while its sources live)."""
        sources = [t.value for t in (data, scales, zp) if t is not None]
        key = (tuple(id(s) for s in sources), zp is None, self.bits, self.block, quant, scales.dtype.str)
        with _LOCK:
            hit = _TABLES.get(key)
        if hit is not None:
            return hit
        assert data.value is not None and scales.value is not None
        packed = data.dtype.name == _PACKED
        if packed and self.bits < 8:
            raw = np.ascontiguousarray(data.value, np.uint8)
            rows = raw.reshape(-1, raw.shape[-1])
            codes = unpack_codes(rows, self.bits, logical[-1]).reshape(logical).astype(np.int32)
        else:
            codes = _codes(data.value)
        length = logical[quant]
        if zp is None:
            zeros = np.int32(1 << (self.bits - 1)) if packed else np.int32(0)
        else:
            assert zp.value is not None
            nb = scales.shape[quant]
            if packed and self.bits < 8:
                zraw = np.ascontiguousarray(zp.value, np.uint8)
                zcodes = unpack_codes(zraw.reshape(-1, zraw.shape[-1]), self.bits, nb).reshape(scales.shape)
            else:
                zcodes = zp.value
            zeros = _along(_codes(zcodes), quant, self.block, length)
        scale = _along(np.asarray(scales.value, np.float32), quant, self.block, length)
        table = ((codes - zeros).astype(np.float32) * scale).astype(scales.dtype)
        table.flags.writeable = False
        try:
            for s in sources:
                weakref.finalize(s, _forget, key)
        except TypeError:  # not weak-referenceable: no cache
            return table
        with _LOCK:
            _TABLES[key] = table
        return table

    def run(self, ctx: Context, data: Tensor, indices: Tensor, scales: Tensor,
            zero_points: Tensor | None = None) -> list[Tensor]:
        gather, quant, logical = self._check(data, indices, scales, zero_points)
        for name, t in (("data", data), ("scales", scales), ("zero_points", zero_points)):
            if t is not None and not t.is_const:
                raise self.fail(f"input {name!r} must be a constant (an initializer): the table is dequantised "
                                "on the host while planning")
        table = self._table(data, scales, zero_points, quant, logical)
        if ctx.pool is not None:  # key the uploaded table by its sources' identity, not by hashing its contents
            others = [ctx.pool.identity_key(t.value, {}) for t in (scales, zero_points) if t is not None]
            if all(k is not None for k in others):
                ctx.derived(table, data, ("gather_block_quantized", tuple(others), zero_points is None, self.bits,
                                          self.block, quant, scales.dtype.str))
        return call_op(ctx, self, "Gather", ctx.const(table), indices, opset=13, axis=gather)
