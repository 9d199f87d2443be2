"""onnxruntime's Python API on ember: `import ember.onnxruntime as ort` in place of `import onnxruntime as ort`.

    sess = ort.InferenceSession("model.onnx", providers=["WebGpuExecutionProvider", "CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})

ORT's error classes live where ORT keeps them, `ort.capi.onnxruntime_pybind11_state` (InvalidArgument, Fail,
NoSuchFile, ...), and `from ember.onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument` works too.
"""

from __future__ import annotations

import sys
import types

from . import session_types as _types
from .session import InferenceSession, get_all_providers, get_available_providers, get_device
from .session_io import IOBinding, OrtValue
from .session_types import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    ModelMetadata,
    NodeArg,
    RunOptions,
    SessionOptions,
)

__all__ = ["ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel", "IOBinding", "InferenceSession",
           "ModelMetadata", "NodeArg", "OrtValue", "RunOptions", "SessionOptions", "capi", "get_all_providers",
           "get_available_providers", "get_device", "set_default_logger_severity"]


def set_default_logger_severity(severity: int) -> None:
    """Accepted for ORT compatibility; ember has no native logger (its warnings are Python warnings)."""


# ORT's module path for its error classes, as a module object here and in sys.modules (so both attribute access
# and `from ... import` find it); `NotImplemented` is ORT's name for OrtNotImplemented.
_state = types.ModuleType(f"{__name__}.capi.onnxruntime_pybind11_state", "ORT's error classes, on ember.")
for _name in ("Fail", "InvalidArgument", "NoSuchFile", "InvalidProtobuf", "InvalidGraph", "RuntimeException",
              "EPFail"):
    setattr(_state, _name, getattr(_types, _name))
_state.NotImplemented = _types.OrtNotImplemented  # type: ignore[attr-defined]
capi = types.ModuleType(f"{__name__}.capi", "ORT's capi package, on ember: only onnxruntime_pybind11_state.")
capi.onnxruntime_pybind11_state = _state  # type: ignore[attr-defined]
sys.modules.setdefault(capi.__name__, capi)
sys.modules.setdefault(_state.__name__, _state)
