"""The vocabulary of the ComputeBackend contract: the public API's op enums and argument checks, the memory error,
and the kernel selection's answer for a convolution."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class ReduceOp(enum.Enum):
    """The reductions of ComputeBackend.reduce."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    MEAN = "mean"


class UnaryOp(enum.Enum):
    """The elementwise functions of ComputeBackend.unary."""

    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    ABS = "abs"
    NEG = "neg"
    GELU = "gelu"
    ERF = "erf"
    RECIPROCAL = "reciprocal"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    SIGN = "sign"


class BinaryOp(enum.Enum):
    """The elementwise operations of ComputeBackend.binary."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"


@dataclass(frozen=True)
class ConvKernel:
    """The kernel selection's answer for one convolution (see ComputeBackend.select_conv).

    `record(x, w, bias, out, act, residual)` records it (`w` is `weight` uploaded, where the kernel brings a
    transformed filter of its own); `record_maxpool(x, w, bias, out, act, kernel, strides, pads, dilations)`,
    where not None, records the conv and a MaxPool of its result as one kernel."""

    algorithm: str  # "winograd" or "default" (record_conv's own choice); the plan counts conv.<algorithm>
    record: Callable[..., list]
    takes_residual: bool
    weight: np.ndarray | None = None
    record_maxpool: Callable[..., list] | None = None


class OutOfMemoryError(MemoryError):
    """The device could not provide the memory an allocation asked for."""


class DeviceLostError(RuntimeError):
    """The device a backend ran on is gone (a driver reset, the GPU removed, the device destroyed): that backend
    object runs nothing again. `Model.reload()` (or a new load) moves a model onto a new device."""


# Per enum, its members by value: a public op's name argument ("relu") found with one dict lookup per call.
_MEMBERS: dict[type, dict[str, Any]] = {}


def as_enum(kind: type[enum.Enum], value: Any, arg: str) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        members = _MEMBERS.get(kind)
        if members is None:
            members = _MEMBERS[kind] = {m.value: m for m in kind}
        found = members.get(value)
        if found is None:
            found = members.get(value.lower())
        if found is not None:
            return found
    valid = ", ".join(m.value for m in kind)
    raise ValueError(f"{arg}: unknown {kind.__name__} {value!r}; valid: {valid}")


def check_dim(value: Any, arg: str, *, minimum: int = 1) -> int:
    if type(value) is int and value >= minimum:  # the usual case, answered first (a public op checks several)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{arg} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{arg} must be >= {minimum}, got {value}")
    return int(value)


def check_pair(value: Any, arg: str, *, minimum: int) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{arg} must be an int or a pair of ints, got {value!r}")
    return check_dim(value[0], f"{arg}[0]", minimum=minimum), check_dim(value[1], f"{arg}[1]", minimum=minimum)


def check_shape(shape: Any, arg: str, rank: int | None = None) -> tuple[int, ...]:
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise ValueError(f"{arg} must be a sequence of ints, got {shape!r}")
    if rank is not None and len(shape) != rank:
        raise ValueError(f"{arg} must have {rank} dims, got {len(shape)}: {tuple(shape)}")
    if len(shape) == 0:
        raise ValueError(f"{arg} must have at least one dim")
    return tuple(check_dim(d, f"{arg}[{i}]") for i, d in enumerate(shape))
