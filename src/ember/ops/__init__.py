"""ONNX ops, one class per op, one op family per module; importing this package registers them all."""

from . import (  # noqa: F401  (registration)
    bitwise,
    causal_conv,
    constant,
    control,
    conv,
    conv_transpose,
    deform_conv,
    elementwise,
    gather,
    grid_sample,
    host,
    linalg,
    linear_attention,
    loss,
    mask,
    ml,
    normalization,
    pad,
    pool,
    quantize,
    reduce,
    resize,
    rnn,
    scan,
    scatter,
    shape,
    spectral,
    topk,
    transformer,
    window,
)
from .base import COUNTERS, REGISTRY, Context, Op, Tensor, UnsupportedError, declare_counters, lookup, register

__all__ = ["COUNTERS", "REGISTRY", "Context", "Op", "Tensor", "UnsupportedError", "declare_counters", "lookup",
           "register"]
