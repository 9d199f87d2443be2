"""The plain pieces of ember's ONNX Runtime API (ember.session): option objects, enums, metadata and the error
classes, named and valued as in onnxruntime so code written against it reads them unchanged."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

# Every provider name ONNX Runtime knows (onnxruntime.get_all_providers()): one of these that ember does not run
# draws ORT's "not in available provider names" warning rather than an error, as in ORT.
ALL_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
                 "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider",
                 "QNNExecutionProvider", "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider",
                 "CoreMLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
                 "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
                 "CANNExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider")
# The providers ember runs, best first, and the backend each one is.
PROVIDER_BACKENDS = {"WebGpuExecutionProvider": "wgpu", "CPUExecutionProvider": "cpu"}
BACKEND_PROVIDERS = {b: p for p, b in PROVIDER_BACKENDS.items()}


# The error classes ORT raises (onnxruntime.capi.onnxruntime_pybind11_state), each also deriving from the Python
# class ember raises for the same fault, so `except ValueError` (ember's contract) and `except InvalidArgument`
# (ORT's) both catch it.
class Fail(RuntimeError):
    """A failure ORT reports as FAIL."""


class InvalidArgument(ValueError):
    """A bad feed or output name: wrong dtype, rank, dim, an unknown or missing name."""


class NoSuchFile(FileNotFoundError):
    """The model file (or a file of its external data) does not exist."""


class InvalidProtobuf(ValueError):
    """The bytes or file do not parse as an ONNX model."""


class InvalidGraph(ValueError):
    """The model parses but is malformed (structure, attributes, dtypes)."""


class OrtNotImplemented(NotImplementedError):
    """The model uses an op (or a feature) ember does not run; ORT's class of this name is `NotImplemented`."""


class RuntimeException(RuntimeError):
    """The backend failed while loading or running the model."""


class EPFail(RuntimeError):
    """The provider's device could not be opened (ember never switches providers during a run)."""


class _Enum(enum.IntEnum):
    # ORT's enums print as "GraphOptimizationLevel.ORT_ENABLE_ALL"; IntEnum would print the number.
    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class GraphOptimizationLevel(_Enum):
    """How much ORT rewrites the graph. ember has one switch: ORT_DISABLE_ALL loads with fuse=False (no graph
    rewrites, no kernel fusion); every other level loads with fuse=True (all of ember's rewrites)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(_Enum):
    """ORT's node scheduling. ember records a plan and submits it whole, so both modes run the same way."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(_Enum):
    """ORT's node ordering. ember orders steps itself (topologically, reusing memory), so this is not read."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


def _config_entry(entries: dict[str, str], key: str, what: str) -> str:
    if key not in entries:
        raise RuntimeError(f"{what} does not have configuration with key: {key}")  # ORT's class and words
    return entries[key]


class SessionOptions:
    """ORT's session options with its defaults. What ember reads: graph_optimization_level (ORT_DISABLE_ALL ->
    no fusion), log_severity_level (3 or more silences the session's own warnings about ignored options), and
    the free-dimension overrides (they fix a symbolic dim: get_inputs() shows the number and feeds must match).
    Kept so code can set them, not read: the thread counts (ember's cpu backend computes with numpy, whose
    threads the BLAS library's environment sets), execution_mode/order, the memory switches, profiling (see
    Model.profile) and optimized_model_filepath (ember's fused plan is not an ONNX graph)."""

    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self.free_dimension_overrides: dict[str, int] = {}  # by dim_param name
        self.free_dimension_denotation_overrides: dict[str, int] = {}  # by dim denotation

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a session config entry (kept, not read by ember)."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """A config entry set before; RuntimeError for one never set, as in ORT."""
        return _config_entry(self._config, key, "SessionOptions")

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        """Fix the symbolic dim `name` to `value` in every input that has it."""
        self.free_dimension_overrides[str(name)] = int(value)

    def add_free_dimension_override_by_denotation(self, denotation: str, value: int) -> None:
        """Fix every dim whose denotation (e.g. "DATA_BATCH") is `denotation` to `value`."""
        self.free_dimension_denotation_overrides[str(denotation)] = int(value)

    def has_providers(self) -> bool:
        """False: ember's options never carry providers (add_provider_for_devices is not offered)."""
        return False

    def __repr__(self) -> str:
        return (f"SessionOptions(graph_optimization_level={self.graph_optimization_level}, "
                f"log_severity_level={self.log_severity_level})")


class RunOptions:
    """ORT's per-run options; ember reads none of them (a run is one submit and cannot be cancelled midway)."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Set a run config entry (kept, not read)."""
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        """A config entry set before; RuntimeError for one never set."""
        return _config_entry(self._config, key, "RunOptions")


def type_string(t: onnx.TypeProto) -> str:
    """ORT's spelling of a value's type: "tensor(float)", "seq(tensor(int64))", "map(string,tensor(float))"."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        name = onnx.TensorProto.DataType.Name(getattr(t, kind).elem_type).lower()
        return f"{'sparse_' if kind == 'sparse_tensor_type' else ''}tensor({name})"
    if kind == "sequence_type":
        return f"seq({type_string(t.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(t.map_type.key_type).lower()
        return f"map({key},{type_string(t.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_string(t.optional_type.elem_type)})"
    return "unknown"


def numpy_dtype(type_str: str) -> np.dtype | None:
    """The numpy dtype of a "tensor(...)" type string (None for other types or types numpy lacks)."""
    if not type_str.startswith("tensor("):
        return None
    elem = getattr(onnx.TensorProto, type_str[len("tensor("):-1].upper(), None)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:
        return None


@dataclass(frozen=True)
class NodeArg:
    """An input's or output's name, type string and shape, as ORT's NodeArg: a dim is an int, a str for a
    symbolic dim, or None for one the model leaves undeclared; an undeclared rank reads as []."""

    name: str
    type: str
    shape: list[int | str | None] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def node_arg(vi: onnx.ValueInfoProto, overrides: dict[str, int], by_denotation: dict[str, int]) -> NodeArg:
    """NodeArg of a value info, the session's free-dimension overrides applied (as ORT reports them)."""
    t = vi.type
    kind = t.WhichOneof("value")
    dims: list[int | str | None] = []
    shape = getattr(t, kind).shape if kind in ("tensor_type", "sparse_tensor_type") else None
    for d in shape.dim if shape is not None else ():
        if d.denotation and d.denotation in by_denotation:
            dims.append(by_denotation[d.denotation])
        elif d.HasField("dim_value") and d.dim_value >= 0:  # ORT reads -1 (some exporters' "free") as None
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(overrides.get(d.dim_param, d.dim_param))
        else:
            dims.append(None)
    return NodeArg(vi.name, type_string(t), dims)


@dataclass(frozen=True)
class ModelMetadata:
    """ORT's ModelMetadata, read from the ModelProto: producer_name, graph_name, graph_description, domain,
    description (the model's doc_string), version (model_version) and custom_metadata_map (metadata_props)."""

    producer_name: str = ""
    graph_name: str = ""
    graph_description: str = ""
    domain: str = ""
    description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, proto: onnx.ModelProto) -> ModelMetadata:
        """The metadata of a ModelProto."""
        return cls(proto.producer_name, proto.graph.name, proto.graph.doc_string, proto.domain, proto.doc_string,
                   int(proto.model_version), {p.key: p.value for p in proto.metadata_props})


def normalize_providers(providers: Sequence[Any] | None, provider_options: Sequence[Any] | None,
                        warn: Callable[[str], None]) -> tuple[list[str], list[dict[str, str]]]:
    """ORT's check_and_normalize_provider_args: the provider names in order with their options as str->str dicts.
    The same ValueErrors for malformed arguments; a duplicate draws a warning and is dropped. Which names ember
    runs is the caller's business. A bare string is one name (ORT would iterate its characters)."""
    if providers is None:
        return [], []
    if isinstance(providers, str):  # ORT would read each character as a provider name; ember reads the name
        providers = [providers]
    if not isinstance(providers, Sequence):
        if not hasattr(providers, "__iter__"):
            raise TypeError(f"providers: expected a list of provider names, got {type(providers).__name__}")
        raise ValueError("'providers' should be a sequence.")
    pairs: list[tuple[Any, Any]]
    if provider_options is not None:
        if not isinstance(provider_options, Sequence):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        if not all(isinstance(p, str) for p in providers):
            raise ValueError("Only string values for 'providers' are supported if 'provider_options' is given.")
        if not all(isinstance(o, dict) for o in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        pairs = list(zip(providers, provider_options, strict=True))
    else:
        pairs = []
        for p in providers:
            if isinstance(p, str):
                pairs.append((p, {}))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
                pairs.append(p)
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) tuples.")
    names: list[str] = []
    options: list[dict[str, str]] = []
    for name, opts in pairs:
        if name in names:
            warn(f"Duplicate provider '{name}' encountered, ignoring.")
            continue
        names.append(name)
        options.append({str(k): str(v) for k, v in opts.items()})
    return names, options
