"""ember: run neural networks on any vendor's GPU through WebGPU, with a numpy CPU backend."""

from . import settings
from .backends import (
    BinaryOp,
    ComputeBackend,
    DeviceLostError,
    OutOfMemoryError,
    ReduceOp,
    UnaryOp,
    available_backends,
    backend,
)
from .device_array import DeviceArray
from .generate import Generator, generate
from .model import Model, TensorInfo, load_onnx
from .parallel import DataParallel, adapters
from .session import InferenceSession, SessionOptions

__version__ = "0.1.0"

__all__ = ["BinaryOp", "ComputeBackend", "DeviceArray", "DeviceLostError", "OutOfMemoryError", "ReduceOp", "UnaryOp",
           "__version__",
           "settings",
           "InferenceSession", "Model", "SessionOptions", "TensorInfo",
           "DataParallel", "adapters",
           "available_backends", "backend", "load_onnx",
           "Generator", "generate"]
