"""Ray with ember: batch inference on Ray Data (`OnnxPredictor` for `Dataset.map_batches`, and `predict`) and
online inference on Ray Serve (`OnnxDeployment`, `serve_deployment`).

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

    from ray import serve
    handle = serve.run(ember.ray.serve_deployment("model.onnx", max_batch_size=32), route_prefix=None)
    y = handle.remote({"input": image}).result()["output"]   # concurrent requests batched into one run

Ray Serve needs the `serve` extra (`pip install "ember[serve]"`).
"""

from __future__ import annotations

import asyncio
import importlib
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Model, load_onnx
from .parallel import adapters, backend_name

__all__ = ["OnnxDeployment", "OnnxPredictor", "actor_pool", "pick_adapter", "predict", "require_ray", "require_serve",
           "serve_deployment"]

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


def _load_here(model: Any, backend: str, load_options: dict[str, Any]) -> tuple[Model, Any]:
    """The model loaded in this actor or replica, and its wgpu adapter: the one of the GPU Ray gave it (or the
    adapters in turn), unless load_options name `adapter`."""
    name = backend_name(backend)
    if name == "wgpu" and load_options.get("adapter") is None:
        import ray

        load_options["adapter"] = pick_adapter(ray.get_gpu_ids(), adapters(), _actor_index)
    return load_onnx(model, backend=name, **load_options), load_options.get("adapter")


def _actor_index() -> int:
    """0, 1, 2, ... for the actors that ask, from a named counter actor shared by the job; an actor-id hash where
    the counter cannot be made."""
    import ray  # not require_ray(): a Serve replica (the serve extra) need not have Ray Data

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
        require_ray()
        self.model, self.adapter = _load_here(model, backend, load_options)
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


# Ray Serve: online inference, concurrent requests batched into one Model.run per shape.

DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_BATCH_WAIT_S = 0.01


def require_serve() -> Any:
    """The ray.serve module, or ImportError naming the extra that installs it."""
    try:
        # import_module, not `from ray import serve`: the latter finds a stale ray.serve attribute of the package.
        return importlib.import_module("ray.serve")
    except ImportError as e:
        raise ImportError(f"ember.ray's Serve deployment needs Ray Serve: pip install 'ember[serve]' (or "
                          f"'ray[serve]>=2.10'); {e}") from e


@dataclass
class _Request:
    feeds: Any  # for model.run: a single sample's inputs with the batch axis added; as sent where not batchable
    rows: int  # samples along dim 0
    single: bool  # one sample without the batch axis: its outputs lose the axis again
    key: tuple[Any, ...] | None  # requests with equal keys concatenate along dim 0; None: run alone


def _bucket(rows: int) -> int:
    """The next power of two: the rows a padded run has (a plan per bucket, not per row count)."""
    return 1 << max(rows - 1, 0).bit_length()


def _unbatch(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v[0] if v.ndim and v.shape[0] == 1 else v for k, v in out.items()}


class OnnxDeployment:
    """A Ray Serve replica class (`serve.deployment(OnnxDeployment).bind(model, ...)`; `serve_deployment` does it
    with defaults): loads `model` once per replica and answers requests, concurrent ones batched by `@serve.batch`.

    A request is {input name: array} (a bare array for a one-input model), one sample (an input's declared rank
    less one) or a batch along dim 0; the reply is {output name: array} for it, a sample's without the batch axis.
    Where every input has a symbolic dim 0, the requests of one Serve batch that agree on dtypes and the other dims
    are concatenated into one `model.run` (requests of other shapes, e.g. sequence lengths, run as groups of their
    own) and the outputs split back; elsewhere each request runs alone. pad_batches: a concatenated run's rows are
    padded up to a power of two (the last row repeated) so that a model compiles a plan per bucket, not per row
    count. A bad request gets `model.run`'s own error (ValueError for a missing input or a wrong dtype) without
    failing the others of its batch. Over HTTP a request is a JSON object {input: nested lists}, the reply too.
    backend, adapter choice and load_options as for `OnnxPredictor`."""

    def __init__(self, model: Any, backend: str = "auto", max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_S, pad_batches: bool = True,
                 **load_options: Any) -> None:
        serve = require_serve()
        self.model, self.adapter = _load_here(model, backend, load_options)
        self._pad = pad_batches
        infos = self.model.inputs
        # Sample vs batch needs every input's rank; concatenation a batch dim that is not fixed.
        self._ranked = all(i.shape for i in infos)
        self._concat = self._ranked and all(not isinstance(i.shape[0], int) for i in infos)
        self._batch_sizes: Counter[int] = Counter()  # requests per Serve batch
        self._run_rows: Counter[int] = Counter()  # rows per model.run (padding included)
        # One thread runs the model: the replica's event loop stays free to take the next batch's requests.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ember-serve")
        # Decorated per instance, not on the class: the batch parameters are the deployment's arguments.
        self._batched = serve.batch(max_batch_size=max_batch_size,
                                    batch_wait_timeout_s=batch_wait_timeout_s)(self._serve_batch)

    def __repr__(self) -> str:
        return f"OnnxDeployment({self.model!r}, adapter={self.adapter})"

    async def __call__(self, request: Any) -> Any:
        http = hasattr(request, "scope") and hasattr(request, "json")  # a starlette Request from Serve's proxy
        if http:
            request = self._from_json(await request.json())
        result = await self._batched(request)
        if isinstance(result, BaseException):  # this request's own error, raised to its caller only
            raise result
        return {k: v.tolist() for k, v in result.items()} if http else result

    def stats(self) -> dict[str, dict[int, int]]:
        """{"batches": {requests in a Serve batch: count}, "runs": {rows of a model.run: count}}."""
        return {"batches": dict(self._batch_sizes), "runs": dict(self._run_rows)}

    async def _serve_batch(self, requests: list[Any]) -> list[Any]:
        self._batch_sizes[len(requests)] += 1
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.run_batch, requests)

    def run_batch(self, requests: Sequence[Any]) -> list[dict[str, np.ndarray] | Exception]:
        """Every request's outputs (or its exception), requests of one shape run together."""
        prepared = [self._prepare(r) for r in requests]
        results: list[Any] = [None] * len(prepared)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, p in enumerate(prepared):
            if p.key is None:
                results[i] = self._run_alone(p)
            else:
                groups.setdefault(p.key, []).append(i)
        for members in groups.values():
            for i, result in zip(members, self._run_group([prepared[i] for i in members]), strict=True):
                results[i] = result
        return results

    def _from_json(self, body: Any) -> Any:
        dtypes = {i.name: i.dtype for i in self.model.inputs}
        if not isinstance(body, Mapping):
            body = {self.model.inputs[0].name: body} if len(dtypes) == 1 else body
            if not isinstance(body, Mapping):
                raise ValueError(f"a JSON request is an object {{input: array}}; the model's inputs are "
                                 f"{list(dtypes)}")
        return {k: np.asarray(v, dtype=dtypes.get(k)) for k, v in body.items()}

    def _prepare(self, request: Any) -> _Request:
        infos = self.model.inputs
        if isinstance(request, np.ndarray) and len(infos) == 1:
            request = {infos[0].name: request}
        alone = _Request(request, 0, False, None)
        if not self._ranked or not isinstance(request, Mapping) or set(request) != {i.name for i in infos}:
            return alone  # model.run says what is wrong, if anything
        feeds, single, rows = {}, set(), set()
        for info in infos:
            a = np.asarray(request[info.name])
            if a.ndim == len(info.shape) - 1:
                a = a[np.newaxis]
                single.add(True)
            elif a.ndim == len(info.shape):
                single.add(False)
            else:
                return alone
            feeds[info.name] = a
            rows.add(a.shape[0])
        if len(single) != 1 or len(rows) != 1 or 0 in rows:
            return alone
        key = tuple((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items()) if self._concat else None
        return _Request(feeds, rows.pop(), single.pop(), key)

    def _run_alone(self, p: _Request) -> dict[str, np.ndarray] | Exception:
        try:
            out = self.model.run(p.feeds)
        except Exception as e:
            return e
        self._run_rows[p.rows] += 1
        return _unbatch(out) if p.single else out

    def _run_group(self, group: list[_Request]) -> list[dict[str, np.ndarray] | Exception]:
        total = sum(p.rows for p in group)
        padded = _bucket(total) if self._pad else total
        if len(group) == 1 and padded == total:
            return [self._run_alone(group[0])]
        feeds = {}
        for name in group[0].feeds:
            parts = [p.feeds[name] for p in group]
            if padded > total:
                parts.append(np.repeat(parts[-1][-1:], padded - total, axis=0))
            feeds[name] = np.concatenate(parts)
        try:
            out = self.model.run(feeds)
            if any(v.ndim == 0 or v.shape[0] != padded for v in out.values()):
                raise ValueError("an output without the batch on axis 0")
        except Exception:  # a bad request, or outputs that do not split: each alone gets its own result or error
            return [self._run_alone(p) for p in group]
        self._run_rows[padded] += 1
        bounds = np.cumsum([p.rows for p in group])[:-1]
        split = {k: np.split(v[:total], bounds) for k, v in out.items()}
        results: list[dict[str, np.ndarray] | Exception] = []
        for j, p in enumerate(group):
            r = {k: parts[j] for k, parts in split.items()}
            results.append(_unbatch(r) if p.single else r)
        return results


def serve_deployment(model: Any, *, backend: str = "auto", max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                     batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_S, pad_batches: bool = True,
                     name: str = "ember", num_replicas: int = 1, num_gpus: float | None = None,
                     num_cpus: float | None = None, max_ongoing_requests: int | None = None,
                     **load_options: Any) -> Any:
    """A Serve application of `OnnxDeployment` (`serve.run(app, route_prefix=None)` gives a DeploymentHandle:
    `handle.remote({"x": x}).result()`). num_gpus: 1 per replica on wgpu where the running Ray cluster has GPUs,
    else 0 (give it where Ray is not initialized yet); num_cpus: Serve's default unless given;
    max_ongoing_requests: twice max_batch_size (Serve's default, 5, would cap every batch at 5 requests)."""
    serve = require_serve()
    name_ = backend_name(backend)
    if num_gpus is None:
        import ray

        num_gpus = 1 if name_ == "wgpu" and ray.is_initialized() and ray.cluster_resources().get("GPU", 0) else 0
    actor = {"num_gpus": num_gpus, **({} if num_cpus is None else {"num_cpus": num_cpus})}
    deployment = serve.deployment(OnnxDeployment, name=name, num_replicas=num_replicas, ray_actor_options=actor,
                                  max_ongoing_requests=max_ongoing_requests or 2 * max_batch_size)
    return deployment.bind(model, backend=name_, max_batch_size=max_batch_size,
                           batch_wait_timeout_s=batch_wait_timeout_s, pad_batches=pad_batches, **load_options)
