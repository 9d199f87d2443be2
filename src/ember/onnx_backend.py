"""ONNX's backend API (`onnx.backend.base.Backend`) on ember, so ONNX's own test runner and tools that speak it work:

    import ember.onnx_backend as backend
    rep = backend.prepare(model, device="CPU")        # or "WGPU" / "GPU" (":1" picks adapter 1)
    (y,) = rep.run([x])                              # outputs in graph-output order; rep.run(...)["y"] works too
    (y,) = backend.run_node(node, [x])               # one node, wrapped in a model of its own

    from onnx.backend.test import BackendTest
    globals().update(BackendTest(backend, __name__).test_cases)

Like ONNX Runtime's `onnxruntime.backend`, the module itself is the backend: `prepare`, `run_model`, `run_node`,
`supports_device` and `is_compatible` are `EmberBackend`'s classmethods.

Devices: "CPU" runs on ember's cpu backend; "WGPU", "GPU" or "WEBGPU" (optionally ":<adapter index>") on its wgpu
backend. `backend="cpu"|"wgpu"` among the keyword arguments overrides the device string. ONNX's runner asks for
"CPU" and "CUDA"; ember has no CUDA device, so `supports_device("CUDA")` is False and the runner skips those.
An op ember cannot run raises NotImplementedError at `prepare`, as ember's `load_onnx` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .backends import available_backends, canonical_name
from .model import Model, load_onnx

__all__ = ["EmberBackend", "EmberBackendRep", "is_compatible", "parse_device", "prepare", "run", "run_model",
           "run_node", "supports_device"]

# load_onnx's options that prepare passes on; everything else it is given is refused, except the keywords ONNX's
# test runner passes to every backend (its per-test tolerances and run_node's opset).
LOAD_OPTIONS = frozenset({"fuse", "precision", "autotune", "plan_cache_bytes", "adapter", "power_preference",
                          "webgpu", "external_data_dir"})
RUNNER_KEYWORDS = frozenset({"rtol", "atol", "opset_version"})


def parse_device(device: str) -> tuple[str, int | None]:
    """(ember backend name, adapter index or None) for an onnx.backend device string such as "CPU" or "WGPU:1".

    Raises ValueError for a device ember does not have (CUDA included), naming the ones it has."""
    if not isinstance(device, str):
        raise TypeError(f"device: expected a string such as 'CPU' or 'WGPU', got {type(device).__name__}")
    kind, _, index = device.strip().partition(":")
    try:
        name = canonical_name(kind)
    except ValueError:
        raise ValueError(f"device {device!r}: ember runs on 'CPU' and 'WGPU' (also 'GPU', 'WEBGPU'), "
                         f"optionally with ':<adapter index>' for WGPU") from None
    if not index:
        return name, None
    if not index.isdigit():
        raise ValueError(f"device {device!r}: the part after ':' must be a device index")
    if name == "cpu":
        if int(index) != 0:
            raise ValueError(f"device {device!r}: there is one CPU device, CPU:0")
        return name, None
    return name, int(index)


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    """A graph input's declaration from the value fed to it: a tensor, or a list of tensors (a sequence)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"input {name!r}: cannot infer the element type of an empty sequence")
        first = np.asarray(value[0])
        elem = helper.np_dtype_to_tensor_dtype(first.dtype)
        return helper.make_tensor_sequence_value_info(name, elem, None)
    arr = np.asarray(value)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _opset_version(domain: str, op_type: str, default: int) -> int:
    if domain in ("", "ai.onnx"):
        return default
    try:  # another domain (ai.onnx.ml, ...): its newest schema of the op
        return int(onnx.defs.get_schema(op_type, domain=domain).since_version)
    except onnx.defs.SchemaError:
        return 1


class EmberBackendRep(BackendRep):
    """A model loaded onto one ember backend, ready to run repeatedly (what `EmberBackend.prepare` returns)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.input_names = [i.name for i in model.inputs]
        self.output_names = [o.name for o in model.outputs]

    def __repr__(self) -> str:
        return f"EmberBackendRep({self.model!r})"

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run the model; outputs come back as a tuple in graph-output order that can also be indexed by name.

        inputs: a list/tuple with one value per graph input (initializers left out) in graph-input order, a
        mapping of input name to value, or a single array for a model of one input. kwargs are accepted for the
        Backend API's sake and ignored."""
        feeds = self._feeds(inputs)
        result = self.model.run(feeds)
        values = [result[name] for name in self.output_names]
        return namedtupledict("Outputs", self.output_names)(*values)

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if not isinstance(inputs, Sequence) or isinstance(inputs, (str, bytes)):
            raise TypeError(f"inputs: expected a list of values in graph-input order or a mapping of name to "
                            f"value, got {type(inputs).__name__}")
        if len(inputs) != len(self.input_names):
            raise ValueError(f"expected {len(self.input_names)} input(s) {self.input_names}, got {len(inputs)}")
        return dict(zip(self.input_names, inputs, strict=True))


class EmberBackend(Backend):
    """onnx.backend.base.Backend on ember: `prepare` loads a model onto the backend the device string names."""

    @classmethod
    def _backend_name(cls, device: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(ember backend name, load_onnx options) from a device string and prepare's keyword arguments."""
        unknown = sorted(set(kwargs) - LOAD_OPTIONS - RUNNER_KEYWORDS - {"backend"})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}; ember's prepare takes backend= and "
                            f"load_onnx's options {sorted(LOAD_OPTIONS)}")
        options = {k: v for k, v in kwargs.items() if k in LOAD_OPTIONS}
        name, adapter = parse_device(device)
        if kwargs.get("backend") is not None:
            name = canonical_name(kwargs["backend"])
        if adapter is not None and name == "wgpu":
            options.setdefault("adapter", adapter)
        if name == "cpu":  # wgpu's device options mean nothing to the cpu backend, which refuses options
            options.pop("adapter", None)
            options.pop("power_preference", None)
            options.pop("webgpu", None)
        return name, options

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether ember has the device; whether it runs every op is only known when `prepare` loads the model."""
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> EmberBackendRep:
        """Load `model` (onnx.ModelProto, bytes or a path) onto the device's ember backend.

        kwargs: backend="cpu"|"wgpu" (overrides the device), and load_onnx's options (fuse, precision, autotune,
        plan_cache_bytes, adapter, power_preference, external_data_dir). Raises NotImplementedError for an op
        ember cannot run, ValueError for a malformed model or a device ember does not have."""
        name, options = cls._backend_name(device, kwargs)
        return EmberBackendRep(load_onnx(model, backend=name, **options))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        """prepare(model, device, **kwargs).run(inputs): outputs in graph-output order."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on `inputs` (one value per non-empty node input, in order, or a mapping by name).

        The node is wrapped in a model whose inputs are declared from the values given; outputs_info (dtype,
        shape per output) declares the outputs, else ONNX shape inference does. opset_version= picks the default
        domain's opset (default: the installed onnx's newest). Returns the outputs in node-output order."""
        in_names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(values) != len(in_names):
                raise ValueError(f"node {node.op_type}: expected {len(in_names)} input(s) {in_names}, "
                                 f"got {len(values)}")
            feeds = dict(zip(in_names, values, strict=True))
        out_names = [n for n in node.output if n]
        if outputs_info is not None:
            if len(outputs_info) != len(out_names):
                raise ValueError(f"node {node.op_type}: outputs_info has {len(outputs_info)} entries for "
                                 f"{len(out_names)} output(s)")
            outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                       for n, (dt, shape) in zip(out_names, outputs_info, strict=True)]
        else:
            outputs = [onnx.ValueInfoProto(name=n) for n in out_names]
        opset = int(kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version())
        domains = {"": opset}
        if node.domain not in ("", "ai.onnx"):
            domains[node.domain] = _opset_version(node.domain, node.op_type, opset)
        graph = helper.make_graph([node], f"run_node_{node.op_type}", [_value_info(n, feeds[n]) for n in in_names],
                                  outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in domains.items()])
        if outputs_info is None:  # declare the outputs' types: ember needs each output's dtype
            inferred = onnx.shape_inference.infer_shapes(model)
            known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output] if v.type.HasField(
                "tensor_type") or v.type.HasField("sequence_type") or v.type.HasField("optional_type")}
            missing = [n for n in out_names if n not in known]
            if missing:
                raise ValueError(f"node {node.op_type}: shape inference gives no type for output(s) {missing}; "
                                 f"pass outputs_info")
            del model.graph.output[:]
            model.graph.output.extend(known[n] for n in out_names)
        rep = cls.prepare(model, device, **kwargs)
        return rep.run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether this machine can run ember on `device`: "CPU" always, "WGPU"/"GPU" where an adapter exists."""
        try:
            name, _ = parse_device(device)
        except (TypeError, ValueError):
            return False
        return name == "cpu" or name in available_backends()


# The module is the backend, as onnxruntime.backend is: BackendTest(ember.onnx_backend, __name__) works.
is_compatible = EmberBackend.is_compatible
prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
run = run_model
