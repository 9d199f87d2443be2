"""WebGPU backend (wgpu-py): launch code in *.py beside the WGSL it runs (kernels/*.wgsl).

Where things run: elementwise ops -> elementwise.py (generated), gemm/MatMul -> matmul.py,
Conv -> conv.py, reductions -> reduce.py, attention -> attention.py.
"""

from . import loops  # noqa: F401  (attaches the loop primitives)
from .backend import WgpuBackend

__all__ = ["WgpuBackend"]
