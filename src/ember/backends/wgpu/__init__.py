"""WebGPU backend (wgpu-py): a device (backend.py) over a program layer (program.py), kernels beside the WGSL they
run (kernels/*.wgsl) and a shader library they share (shader/).

Where things run: elementwise ops -> elementwise.py (generated), gemm/MatMul -> matmul.py over gemm.py's generated
tiled kernel, Conv -> conv.py (conv_depthwise.py, conv_direct.py, conv_igemm.py; Winograd in winograd.py, chosen
by winograd_cost.py), reductions -> reduce.py, attention -> attention.py (a decode step's split-KV kernels:
attention_decode.py), LayerNorm/RMSNorm and (log)softmax -> norm.py and softmax.py, pooling -> pool.py,
gather -> gather.py, scan/top-k/scatter -> loops.py, DFT -> spectral.py;
runtime sizes moved without recording again (live plans) -> resize.py.

Importing the kernel modules registers their record functions in program.KERNELS, where WgpuBackend looks them up.
"""

from . import (  # noqa: F401  (each registers its kernels in program.KERNELS)
    attention,
    attention_decode,
    autotune,
    conv,
    elementwise,
    gather,
    loops,
    matmul,
    matmul_df64,
    matmul_nbits,
    norm,
    pool,
    reduce,
    resize,
    softmax,
    spectral,
    winograd,
    winograd_cost,
)
from .backend import WgpuBackend

__all__ = ["WgpuBackend"]
