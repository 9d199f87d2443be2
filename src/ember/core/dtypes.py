"""Dtype vocabulary shared by ops and backends."""

from __future__ import annotations

from typing import Any

import numpy as np

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def kind_of(dtype: Any) -> str:
    """The expression kind of a numpy dtype: "float", "bool" or "int"."""
    k = np.dtype(dtype).kind
    return "float" if k == "f" else "bool" if k == "b" else "int"
