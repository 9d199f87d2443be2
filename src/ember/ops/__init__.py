"""ONNX ops, one class per op, grouped by area; importing this package registers them all."""

from . import elementwise, index, linalg, misc, nn, reduce, shape, transformer  # noqa: F401  (registration)
from .base import REGISTRY, Context, Op, T, UnsupportedError, lookup, register

__all__ = ["REGISTRY", "Context", "Op", "T", "UnsupportedError", "lookup", "register"]
