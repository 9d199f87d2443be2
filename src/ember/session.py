"""An ONNX Runtime drop-in: `InferenceSession` with onnxruntime's Python API over `ember.load_onnx`.

Providers map to ember backends: "WebGpuExecutionProvider" is the wgpu backend, "CPUExecutionProvider" the cpu
one. `import ember.onnxruntime as ort` gives the whole API under ORT's names.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .backends import ComputeBackend, available_backends
from .device_array import DeviceArray
from .model import PRECISIONS, Model, check_f16, check_plan_cache_bytes, load_onnx, shared_backend
from .onnx.importer import read_proto
from .session_io import IOBinding, OrtValue
from .session_types import (
    ALL_PROVIDERS,
    BACKEND_PROVIDERS,
    PROVIDER_BACKENDS,
    EPFail,
    Fail,
    GraphOptimizationLevel,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelMetadata,
    NodeArg,
    NoSuchFile,
    OrtNotImplemented,
    RunOptions,
    RuntimeException,
    SessionOptions,
    node_arg,
    normalize_providers,
)

__all__ = ["InferenceSession", "get_all_providers", "get_available_providers", "get_device"]

# Keyword arguments ORT's InferenceSession takes (enable_fallback is read, the others accepted and unused), and
# ember's own load options, passed through to load_onnx.
_ORT_KWARGS = ("enable_fallback", "read_config_from_model", "disabled_optimizers")
_EMBER_KWARGS = ("precision", "plan_cache_bytes", "autotune")  # and external_data_dir, which the session reads
# Provider options that are ember backend options (ember.backend's keywords), per provider.
_BACKEND_OPTIONS = {"WebGpuExecutionProvider": ("adapter", "power_preference"), "CPUExecutionProvider": ()}


class _ProviderArgumentError(ValueError):
    """Malformed `providers`/`provider_options` (ORT's ValueError), which InferenceSession() answers with ORT's
    fallback to CPU."""


def get_available_providers() -> list[str]:
    """The providers ember runs on this machine, best first: "WebGpuExecutionProvider" where a WebGPU adapter
    exists (a hardware GPU or a software one such as lavapipe), and "CPUExecutionProvider"."""
    return [BACKEND_PROVIDERS[b] for b in available_backends()]


def get_all_providers() -> list[str]:
    """Every provider name ONNX Runtime knows (ember runs the two get_available_providers lists)."""
    return list(ALL_PROVIDERS)


def get_device() -> str:
    """"GPU" where the wgpu backend has an adapter, else "CPU" (ORT names its build's device this way)."""
    return "GPU" if "wgpu" in available_backends() else "CPU"


def _reraise(e: BaseException, cls: type[BaseException], source: str = "") -> BaseException:
    """`e` as ORT's class `cls`, with ember's message and traceback (one message, not a chain). The session hands
    load_onnx a ModelProto: `source` puts back what the caller gave in the message."""
    args = tuple(a.replace("the given ModelProto", source) if source and isinstance(a, str) else a for a in e.args)
    if isinstance(e, cls) and args == e.args:
        return e
    return cls(*args).with_traceback(e.__traceback__)


def _read_model(path_or_bytes: Any) -> tuple[onnx.ModelProto, Path | None, str]:
    """The ModelProto (external data not read: load_onnx reads it), the folder its external data lives in, and
    what it is for messages; the importer's errors as ORT's classes."""
    if isinstance(path_or_bytes, onnx.ModelProto):  # ember takes a ModelProto as well; ORT only paths and bytes
        return path_or_bytes, None, "the given ModelProto"
    if not isinstance(path_or_bytes, (str, os.PathLike, bytes, bytearray, memoryview)):
        raise TypeError(f"Unable to load from type '{type(path_or_bytes)}': expected a file path or the bytes of an "
                        "ONNX model")
    try:
        proto, source, folder = read_proto(path_or_bytes)
    except FileNotFoundError as e:
        raise _reraise(e, NoSuchFile) from None
    except ValueError as e:
        raise _reraise(e, InvalidProtobuf) from None
    return proto, folder, source


def _inferred_output_shapes(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Outputs as ONNX shape inference sees them, for outputs the file declares without a shape (ORT reports the
    inferred shape there). Empty when inference fails (a model over protobuf's 2 GiB, an op onnx does not know)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:
        return {}
    g = proto.graph
    declared = {d.dim_param for v in (*g.input, *g.output, *g.value_info) for d in v.type.tensor_type.shape.dim}
    for o in inferred.graph.output:
        for d in o.type.tensor_type.shape.dim:
            # onnx names each dim it cannot tell "unk__<n>"; ORT reports those as undeclared (None).
            if d.dim_param.startswith("unk__") and d.dim_param not in declared:
                d.Clear()
    return {o.name: o for o in inferred.graph.output}


class InferenceSession:
    """onnxruntime.InferenceSession on ember. `providers` in order of preference, names or (name, options) pairs:
    the first one ember runs is used ("WebGpuExecutionProvider" -> the wgpu backend, "CPUExecutionProvider" ->
    cpu); none given: ember's "auto" (EMBER_BACKEND, else the best available). A name ember does not run draws
    ORT's warning and is skipped; if none of the names is available the session falls back to CPU, as ORT does.
    WebGpu's provider options `adapter` and `power_preference` pick the device; others are ignored with a
    warning. Malformed `providers` (not a list, options of another length) fall back to CPU with a warning, as in
    ORT, unless enable_fallback=0. Extra keywords: ORT's enable_fallback is read, its read_config_from_model and
    disabled_optimizers accepted and unused; ember's load options precision, plan_cache_bytes and autotune are
    passed to ember.load_onnx, and external_data_dir names the folder of a model's external data (default: the
    model file's folder; a model given as bytes has none).

    Errors use ORT's classes (InvalidArgument for bad feeds, NoSuchFile, InvalidProtobuf, InvalidGraph, ...), each
    also a subclass of the Python class ember raises (ValueError, FileNotFoundError, ...)."""

    def __init__(self, path_or_bytes: str | bytes | os.PathLike, sess_options: Any = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[Any] | None = None,
                 **kwargs: Any) -> None:
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._ember_opts = {k: kwargs.pop(k) for k in _EMBER_KWARGS if k in kwargs}
        self._external_dir = kwargs.pop("external_data_dir", None)
        unknown = sorted(set(kwargs) - set(_ORT_KWARGS))
        if unknown:  # ORT ignores keywords it does not read; ember says so, with the closest one it reads
            known = [*_ORT_KWARGS, *_EMBER_KWARGS, "external_data_dir"]
            close = {k: m[0] for k in unknown if (m := difflib.get_close_matches(k, known, n=1))}
            hint = "".join(f" ({k!r}: did you mean {m!r}?)" for k, m in close.items())
            self._warn(f"InferenceSession: ignoring unknown keyword argument(s) {unknown}{hint}")
        self._source = path_or_bytes  # kept for set_providers, as ORT keeps it
        try:
            self._create(providers, provider_options)
        except _ProviderArgumentError as e:
            # ORT catches its own ValueError about malformed providers and retries on CPU unless enable_fallback=0.
            if int(kwargs.get("enable_fallback", 1)) != 1:
                raise
            self._warn(f"{e} (providers={providers!r}); falling back to ['CPUExecutionProvider'], as ORT does")
            self._create(["CPUExecutionProvider"], None)

    # -- construction ---------------------------------------------------------------------------------------------

    def _create(self, providers: Sequence[Any] | None, provider_options: Sequence[Any] | None) -> None:
        try:
            names, options = normalize_providers(providers, provider_options, self._warn)
        except ValueError as e:
            raise _ProviderArgumentError(str(e)) from None
        provider, backend_opts, given = self._choose_provider(names, options)
        proto, folder, self._source_name = _read_model(self._source)
        self._folder = self._external_dir if self._external_dir is not None else folder
        self._meta = ModelMetadata.from_proto(proto)
        so = self._sess_options
        level = getattr(so, "graph_optimization_level", GraphOptimizationLevel.ORT_ENABLE_ALL)
        self._load_opts = {"fuse": int(level) != GraphOptimizationLevel.ORT_DISABLE_ALL, **self._ember_opts}
        for attr, why in (("enable_profiling", "use ember's Model.profile(feeds) (session.model) for per-step times"),
                          ("optimized_model_filepath", "ember's fused plan is not an ONNX graph, nothing is written")):
            if getattr(so, attr, None):
                self._warn(f"SessionOptions.{attr} is ignored: {why}")
        self._model = self._load(proto, self._backend(PROVIDER_BACKENDS.get(provider, "auto"), backend_opts))
        self._providers = [provider or BACKEND_PROVIDERS[self._model.backend]]
        self._provider_options = {self._providers[0]: given}
        self._describe(proto)
        # Feeding an overridable initializer runs a second model where they are inputs, built on first use: so
        # the proto (and its weights) is kept only for models that have some.
        self._proto = proto if self._overridable else None
        self._override_model: Model | None = None

    def _warn(self, message: str) -> None:
        # ORT's log_severity_level: 3 (error) or 4 (fatal) hides warnings; the session's own are these.
        if getattr(self._sess_options, "log_severity_level", -1) < 3:
            warnings.warn(message, UserWarning, stacklevel=3)

    def _choose_provider(self, names: list[str],
                         options: list[dict[str, str]]) -> tuple[str | None, dict[str, Any], dict[str, str]]:
        """The provider to use (None: ember's auto), its ember backend options, and its options as given."""
        available = get_available_providers()
        for name in names:
            if name not in available:
                why = (" (no WebGPU adapter on this machine)" if name == "WebGpuExecutionProvider" else
                       "" if name in ALL_PROVIDERS else " (not a provider name ONNX Runtime knows)")
                self._warn(f"Specified provider '{name}' is not in available provider names{why}. Available "
                           f"providers: '{', '.join(available)}' (ember runs every GPU through "
                           "WebGpuExecutionProvider)")
        chosen = [(n, o) for n, o in zip(names, options, strict=True) if n in available]
        if not chosen:
            # ORT falls back to its CPU provider when none of the requested ones can run.
            return ("CPUExecutionProvider" if names else None), {}, {}
        name, opts = chosen[0]
        backend_opts: dict[str, Any] = {}
        for key, value in opts.items():
            if key not in _BACKEND_OPTIONS[name]:
                self._warn(f"{name}: provider option {key!r} is ignored by ember (it reads "
                           f"{list(_BACKEND_OPTIONS[name]) or 'none'})")
            else:  # ORT passes options as strings: an adapter index comes back to an int
                backend_opts[key] = int(value) if key == "adapter" and value.isdigit() else value
        return name, backend_opts, opts

    def _backend(self, name: str, opts: dict[str, Any]) -> ComputeBackend:
        """The provider's backend (the one load_onnx shares for this name and options), with the load options that
        depend on it checked: a fault there is the provider's or an option's, not the model's."""
        try:
            be = shared_backend(name, **opts)
            check_plan_cache_bytes(self._ember_opts.get("plan_cache_bytes"))
            precision = self._ember_opts.get("precision", "f32")
            if precision not in PRECISIONS:
                raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")
            if precision == "f16":
                check_f16(be)
        except ValueError as e:
            raise _reraise(e, InvalidArgument) from None
        except RuntimeError as e:  # the device could not be opened
            raise _reraise(e, EPFail) from None
        return be

    def _load(self, proto: onnx.ModelProto, backend: ComputeBackend) -> Model:
        try:
            return load_onnx(proto, backend, external_data_dir=self._folder, **self._load_opts)
        except FileNotFoundError as e:
            raise _reraise(e, NoSuchFile, self._source_name) from None
        except NotImplementedError as e:
            raise _reraise(e, OrtNotImplemented, self._source_name) from None
        except TypeError:
            raise
        except ValueError as e:
            raise _reraise(e, InvalidGraph, self._source_name) from None
        except RuntimeError as e:
            raise _reraise(e, RuntimeException, self._source_name) from None

    def _describe(self, proto: onnx.ModelProto) -> None:
        """The NodeArgs of the inputs, outputs and overridable initializers, as ORT reports them."""
        so = self._sess_options
        fixed = dict(getattr(so, "free_dimension_overrides", {}))
        by_denotation = dict(getattr(so, "free_dimension_denotation_overrides", {}))
        g = proto.graph
        inits = {t.name for t in g.initializer}
        produced = {o for n in g.node for o in n.output}
        self._inputs = [node_arg(v, fixed, by_denotation) for v in g.input if v.name not in inits | produced]
        # IR < 4 lists every weight as a graph input; ORT treats those as constants, not overridable.
        self._overridable = [node_arg(v, fixed, by_denotation) for v in g.input
                             if v.name in inits and proto.ir_version >= 4]
        self._override_names = frozenset(a.name for a in self._overridable)
        inferred: dict[str, onnx.ValueInfoProto] | None = None
        known = {o.name: o.shape for o in self._model.outputs}
        self._outputs = []
        for vi in g.output:
            t = vi.type
            if t.WhichOneof("value") == "tensor_type" and not t.tensor_type.HasField("shape"):
                inferred = _inferred_output_shapes(proto) if inferred is None else inferred
                if vi.name in inferred and inferred[vi.name].type.tensor_type.HasField("shape"):
                    vi = inferred[vi.name]
                elif known.get(vi.name) is not None:  # ember's plan knows it (static inputs)
                    vi = onnx.helper.make_tensor_value_info(vi.name, t.tensor_type.elem_type, known[vi.name])
            self._outputs.append(node_arg(vi, fixed, by_denotation))
        # Dims the options fixed: ember's model still has them symbolic, so feeds are checked against these.
        self._fixed_dims = {a.name: a.shape for a in self._inputs} if fixed or by_denotation else {}

    # -- ORT's accessors ------------------------------------------------------------------------------------------

    @property
    def model(self) -> Model:
        """The ember Model behind the session (plan_info, profile, stats, ...)."""
        return self._model

    @property
    def backend(self) -> str:
        """The ember backend the session runs on: "wgpu" or "cpu"."""
        return self._model.backend

    def get_inputs(self) -> list[NodeArg]:
        """The inputs the caller feeds (initializers excluded), as NodeArgs."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The outputs, as NodeArgs (an output the file declares without a shape: its inferred shape)."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers the model also lists as inputs (IR >= 4): a feed of that name replaces the weight."""
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata (producer, graph name, domain, doc string, version, metadata_props)."""
        return self._meta

    def get_providers(self) -> list[str]:
        """The provider the session runs on (ember runs the whole model on one backend, so one name)."""
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """{provider: its options as str -> str}, as given."""
        return {k: dict(v) for k, v in self._provider_options.items()}

    def get_session_options(self) -> Any:
        """The SessionOptions the session was made with (defaults if none were given)."""
        return self._sess_options

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[Any] | None = None) -> None:
        """Load the model again onto other providers (None: ember's auto choice), as ORT re-creates its session."""
        try:
            self._create(providers, provider_options)
        except _ProviderArgumentError as e:
            raise ValueError(str(e)) from None

    def end_profiling(self) -> str:
        """"": ember writes no profile file (SessionOptions.enable_profiling is ignored; see Model.profile)."""
        return ""

    def disable_fallback(self) -> None:
        """No-op: ember never switches providers during a run."""

    def enable_fallback(self) -> None:
        """No-op: ember never switches providers during a run."""

    # -- running --------------------------------------------------------------------------------------------------

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list[np.ndarray]:
        """Run the model: the outputs named (None or []: all, in the model's order) as numpy arrays. Feeds are
        numpy arrays (or lists, scalars), OrtValues, ember DeviceArrays, torch tensors or other arrays with
        __array__ or __dlpack__ (read on the host: ember.interop)."""
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        result = self._execute(input_feed, names, keep_on_device=False)
        return [result[n] for n in names]

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values: Mapping[str, Any],
                            run_options: RunOptions | None = None) -> list[OrtValue]:
        """Run with OrtValue feeds; the outputs come back as OrtValues, on the device for a wgpu session (chain
        them into the next run without a host round trip), numpy-backed for a cpu one."""
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        result = self._execute(input_dict_ort_values, names, keep_on_device=self.backend == "wgpu")
        return [OrtValue(result[n]) for n in names]

    def io_binding(self) -> IOBinding:
        """A new IOBinding for this session."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run with the values bound in `iobinding`; read the outputs with iobinding.get_outputs() or
        copy_outputs_to_cpu()."""
        if not isinstance(iobinding, IOBinding) or iobinding._session is not self:
            raise ValueError("IOBinding must be used with the session that created it.")
        iobinding._run()

    def _feed(self, value: Any) -> Any:
        """A feed as ember's Model takes it: OrtValues unwrapped; a device array of another backend object read
        back (ORT copies a value between devices for the run)."""
        if isinstance(value, OrtValue):
            value = value.device_array if value.device_array is not None else value.numpy()
        if isinstance(value, DeviceArray) and value.backend is not self._model.compute_backend:
            value = value.numpy()
        return value

    def _execute(self, input_feed: Mapping[str, Any], names: list[str], keep_on_device: bool) -> dict[str, Any]:
        """One run of the outputs `names` (run, run_with_ort_values and IOBinding all come here), ember's feed
        errors as ORT's classes."""
        if not isinstance(input_feed, Mapping):
            raise TypeError(f"input_feed must be a dict of input name -> value, got {type(input_feed).__name__}")
        feeds = {k: self._feed(v) for k, v in input_feed.items()}
        if self._fixed_dims:
            self._check_fixed_dims(feeds)
        model = self._model
        if self._override_names and not self._override_names.isdisjoint(feeds):
            model = self._overrides()
            feeds = {**self._defaults, **feeds}
        try:
            return model.run(feeds, names, keep_on_device=keep_on_device)
        except ValueError as e:
            raise _reraise(e, InvalidArgument) from None
        except NotImplementedError as e:
            raise _reraise(e, OrtNotImplemented) from None

    def _check_fixed_dims(self, feeds: dict[str, Any]) -> None:
        """Feeds against the dims SessionOptions fixed (ember's model, loaded before, still has them symbolic)."""
        for name, dims in self._fixed_dims.items():
            got = getattr(feeds.get(name), "shape", None)
            if got is None or len(got) != len(dims):
                continue  # absent or of another rank: ember's check names that
            bad = [f"dim {i} must be {d}, got {g}" for i, (d, g) in enumerate(zip(dims, got, strict=True))
                   if isinstance(d, int) and d != g]
            if bad:
                raise InvalidArgument(f"input {name!r}: {'; '.join(bad)} (shape {list(got)}, expected {dims}: "
                                      "SessionOptions fixed a free dimension)")

    def _overrides(self) -> Model:
        """The model with the overridable initializers as inputs (their values the defaults), built once."""
        if self._override_model is None:
            assert self._proto is not None
            over = self._override_names
            proto = onnx.ModelProto()
            proto.CopyFrom(self._proto)
            keep = [t for t in proto.graph.initializer if t.name not in over]
            del proto.graph.initializer[:]
            proto.graph.initializer.extend(keep)
            folder = str(self._folder) if self._folder is not None else ""
            try:
                self._defaults = {t.name: numpy_helper.to_array(t, base_dir=folder)
                                  for t in self._proto.graph.initializer if t.name in over}
            except Exception as e:
                raise Fail(f"cannot read the default values of the overridable initializers: {e}") from e
            self._override_model = self._load(proto, self._model.compute_backend)
        return self._override_model

    def __repr__(self) -> str:
        ins = ", ".join(f"{a.name}: {a.type}{a.shape}" for a in self._inputs)
        outs = ", ".join(f"{a.name}: {a.type}{a.shape}" for a in self._outputs)
        return f"<ember.InferenceSession on {self._providers[0]}; inputs ({ins}); outputs ({outs})>"
