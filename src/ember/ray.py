"""Batch inference on Ray Data with ember: `OnnxPredictor` for `Dataset.map_batches`, and `predict`.

    import ray, ember.ray
    ds = ray.data.from_numpy(images)                            # column "data"
    out = ember.ray.predict(ds, "model.onnx", input_columns={"data": "input"})
    # or, by hand: one actor per GPU, each loading the model once
    out = ds.map_batches(ember.ray.OnnxPredictor, fn_constructor_kwargs={"model": "model.onnx"},
                         batch_format="numpy", batch_size=32, num_gpus=1, **ember.ray.actor_pool(4))

Needs the `ray` extra (`pip install "ember[ray]"`). Each actor loads the model once, on the wgpu adapter Ray gave it
(`ray.get_gpu_ids()`, taken as an index among the machine's GPU adapters in Vulkan's order) or, where Ray sees no
GPUs, on the adapters in turn by actor (a small named counter actor hands out the indices); the cpu backend runs on
the host. Outputs are host arrays (keep_on_device is off: Ray moves numpy blocks between processes).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .model import Model, load_onnx
from .parallel import adapters, backend_name

__all__ = ["OnnxPredictor", "actor_pool", "pick_adapter", "predict", "require_ray"]

COUNTER_NAME = "ember_adapter_counter"
DEFAULT_BATCH_SIZE = 32
_COUNTER: list[Any] = [None]  # this process's handle on the job's adapter counter


def require_ray() -> Any:
    """The ray module, or ImportError naming the extra that installs it."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data comes with the "data" extra of ray)
    except ImportError as e:
        raise ImportError(f"ember.ray needs Ray Data: pip install 'ember[ray]' (or 'ray[data]>=2.9'); {e}") from e
    return ray


def pick_adapter(gpu_ids: Sequence[Any], names: Sequence[str], actor_index: Any) -> int:
    """The wgpu adapter index for an actor: its first assigned GPU id where Ray assigned GPUs (an index among the
    hardware adapters, software ones such as lavapipe left out), else `actor_index()` (called only then) over all
    adapters in turn."""
    hardware = [i for i, n in enumerate(names) if not n.endswith(", CPU)")]
    gpu = str(gpu_ids[0]) if gpu_ids else ""
    if gpu.isdigit() and hardware:  # an index (a GPU UUID says nothing about Vulkan's order: taken in turn)
        return hardware[int(gpu) % len(hardware)]
    if len(names) <= 1:
        return 0
    return int(actor_index()) % len(names)


def _actor_index() -> int:
    """0, 1, 2, ... for the actors that ask, from a named counter actor shared by the job; an actor-id hash where
    the counter cannot be made."""
    ray = require_ray()
    try:
        @ray.remote(num_cpus=0)
        class _Counter:
            def __init__(self) -> None:
                self.n = -1

            def next(self) -> int:
                self.n += 1
                return self.n

        # The first handle is kept for the process's life: a named actor whose owner drops its handle is collected.
        if _COUNTER[0] is None:
            _COUNTER[0] = _Counter.options(name=COUNTER_NAME, get_if_exists=True).remote()
        counter = _COUNTER[0]
        return int(ray.get(counter.next.remote(), timeout=30))
    except Exception:  # no counter: spread by the actor's id
        actor = ray.get_runtime_context().get_actor_id() or ""
        return zlib.crc32(actor.encode())


def _columns(spec: Any, names: list[str], what: str) -> dict[str, str]:
    """{column: model tensor name} for inputs (what="input") or {model tensor name: column} for outputs: None = the
    same names, a list = the model's order, a dict as given."""
    if spec is None:
        return {n: n for n in names}
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, Mapping):
        tensors = list(spec.values()) if what == "input" else list(spec)
        bad = [t for t in tensors if t not in names]
        if bad:
            raise ValueError(f"{what}_columns: unknown {what} name(s) {bad}; the model's {what}s are {names}")
        return dict(spec)
    spec = list(spec)
    if len(spec) != len(names):
        raise ValueError(f"{what}_columns: {len(spec)} column(s) {spec} for the model's {len(names)} {what}(s) "
                         f"{names}")
    return dict(zip(spec, names, strict=True)) if what == "input" else dict(zip(names, spec, strict=True))


class OnnxPredictor:
    """A callable class for `Dataset.map_batches(OnnxPredictor, fn_constructor_kwargs={...}, batch_format="numpy")`:
    loads `model` once per actor and maps each batch {column: array} to {column: output array}.

    model: a path (readable on every node), bytes or an onnx.ModelProto. backend: "auto", "wgpu" or "cpu"; on
    wgpu the adapter comes from the actor's GPU (or is handed out in turn), unless load_options name `adapter`.
    input_columns: which batch column feeds which model input (None: columns named as the inputs; a list in the
    model's input order; a dict {column: input}). output_columns: the output columns (None: named as the outputs;
    a list in the model's output order; a dict {output: column}; outputs left out of a dict are dropped).
    passthrough: columns copied from the batch into the result unchanged (an id, a path). load_options:
    load_onnx's (precision, fuse, plan_cache_bytes, autotune, safe, ...)."""

    def __init__(self, model: Any, backend: str = "auto", input_columns: Any = None, output_columns: Any = None,
                 passthrough: Sequence[str] = (), **load_options: Any) -> None:
        ray = require_ray()
        name = backend_name(backend)
        if name == "wgpu" and load_options.get("adapter") is None:
            load_options["adapter"] = pick_adapter(ray.get_gpu_ids(), adapters(), _actor_index)
        self.model: Model = load_onnx(model, backend=name, **load_options)
        self.adapter = load_options.get("adapter")
        self._inputs = _columns(input_columns, [i.name for i in self.model.inputs], "input")
        self._outputs = _columns(output_columns, [o.name for o in self.model.outputs], "output")
        self._passthrough = list(passthrough)

    def __repr__(self) -> str:
        return f"OnnxPredictor({self.model!r}, adapter={self.adapter})"

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [c for c in (*self._inputs, *self._passthrough) if c not in batch]
        if missing:
            raise ValueError(f"batch column(s) {missing} missing; the batch has {sorted(batch)} (map columns to "
                             f"the model's inputs {[i.name for i in self.model.inputs]} with input_columns=)")
        feeds = {tensor: np.asarray(batch[column]) for column, tensor in self._inputs.items()}
        result = self.model.run(feeds, output_names=list(self._outputs))
        out = {column: result[tensor] for tensor, column in self._outputs.items()}
        for column in self._passthrough:
            out[column] = batch[column]
        return out


def actor_pool(concurrency: int) -> dict[str, Any]:
    """map_batches' keyword for `concurrency` actors: compute=ActorPoolStrategy(size=n) from Ray 2.51 on (where
    `concurrency` is deprecated), concurrency=n before."""
    ray = require_ray()
    major, minor = (int(p) for p in ray.__version__.split(".")[:2])
    if (major, minor) >= (2, 51):
        return {"compute": ray.data.ActorPoolStrategy(size=concurrency)}
    return {"concurrency": concurrency}


def predict(dataset: Any, model: Any, *, backend: str = "auto", batch_size: int | None = None,
            concurrency: int | None = None, num_gpus: float | None = None, num_cpus: float | None = None,
            input_columns: Any = None,
            output_columns: Any = None, passthrough: Sequence[str] = (), **load_options: Any) -> Any:
    """`dataset.map_batches(OnnxPredictor, ...)` with defaults: batch_size 32; on wgpu where the cluster has GPUs,
    one actor per GPU (`num_gpus=1` each), else one actor (the cpu backend, or wgpu on a software adapter); num_cpus
    per actor: Ray's default (1) unless given. The result is a lazy Dataset of the output (and passthrough)
    columns; a failing batch raises, where the dataset is consumed, Ray's RayTaskError holding ember's error and
    the actor's traceback."""
    ray = require_ray()
    name = backend_name(backend)
    gpus = int(ray.cluster_resources().get("GPU", 0)) if name == "wgpu" else 0
    if num_gpus is None:
        num_gpus = 1 if gpus else 0
    if concurrency is None:
        concurrency = max(1, int(gpus // num_gpus)) if num_gpus else 1
    kwargs = {"model": model, "backend": name, "input_columns": input_columns, "output_columns": output_columns,
              "passthrough": list(passthrough), **load_options}
    return dataset.map_batches(OnnxPredictor, fn_constructor_kwargs=kwargs, batch_format="numpy",
                               batch_size=batch_size or DEFAULT_BATCH_SIZE, num_gpus=num_gpus,
                               **({} if num_cpus is None else {"num_cpus": num_cpus}), **actor_pool(concurrency))
