"""`ember.DataParallel`: one model on several devices of one process, a batch split across them.

The model is loaded once per device (a backend object per adapter, `ember.backend("wgpu", adapter=i)`); a batch is
split along axis 0 of every batched input, in proportion to the devices' weights, the shards run concurrently (one
thread per device: a run waits on its device in wgpu-native's poll, a C call made through cffi, which releases the
GIL; the cpu backend's numpy kernels release it in BLAS and most ufunc loops) and the outputs are concatenated in
order. Several backend objects on one adapter work too (`adapters=[0, 0]`): each is a device of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import settings
from .backends import ComputeBackend, available_backends, canonical_name
from .backends import backend as make_backend
from .device_array import DeviceArray
from .interop import host_array
from .model import Model, load_onnx

__all__ = ["DataParallel", "adapters", "backend_name", "split_sizes"]


def backend_name(backend: str) -> str:
    """The backend a name stands for, "auto" resolved as ember.backend("auto") does, without opening a device."""
    if isinstance(backend, str) and backend.lower() == "auto":
        env = settings.BACKEND.get()
        return canonical_name(env) if env and env.lower() != "auto" else available_backends()[0]
    return canonical_name(backend)


def adapters() -> list[str]:
    """The wgpu compute adapters of this machine, best first, as `ember.backend("wgpu", adapter=i)` numbers them:
    "device name (Vulkan, DiscreteGPU)". Empty where there is no Vulkan/Metal/D3D12 adapter."""
    from .backends.wgpu.device import compute_adapters

    return [f"{a.info['device']} ({a.info['backend_type']}, {a.info['adapter_type']})" for a in compute_adapters()]


def split_sizes(n: int, weights: Sequence[float]) -> list[int]:
    """`n` items over len(weights) devices in proportion to the weights (largest remainder; ties to the earlier
    device), every size an int >= 0 and the sizes summing to n. A batch smaller than the device count leaves some
    devices at 0."""
    total = float(sum(weights))
    exact = [n * w / total for w in weights]
    sizes = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - sizes[i]), -weights[i], i))
    for i in order[: n - sum(sizes)]:
        sizes[i] += 1
    return sizes


def _check_weights(weights: Any, count: int) -> list[float]:
    if weights is None:
        return [1.0] * count
    ws = list(weights)
    if len(ws) != count or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in ws):
        raise ValueError(f"weights: expected {count} positive numbers (one per device), got {weights!r}")
    return [float(w) for w in ws]


def _backends(adapters_: Any, backend: str, safe: bool) -> list[ComputeBackend]:
    """The backend objects to load onto: the caller's, or one made per adapter entry."""
    if isinstance(adapters_, (str, int)) and not (isinstance(adapters_, str) and adapters_ == "all"):
        raise ValueError(f"adapters: expected 'all', a list of adapter indices (or name substrings) or a list of "
                         f"backend objects, got {adapters_!r}")
    items = list(adapters_) if adapters_ != "all" else None
    if items is not None and not items:
        raise ValueError("adapters: the list is empty; give at least one adapter index or backend object")
    if items is not None and all(isinstance(a, ComputeBackend) for a in items):
        return items
    if items is not None and any(isinstance(a, ComputeBackend) for a in items):
        raise ValueError("adapters: give either adapter indices or backend objects, not a mix")
    name = backend_name(backend)
    if name == "cpu":
        # The host is the cpu backend's one "adapter" (0): each entry is a backend of its own on it.
        count = 1 if items is None else len(items)
        if items is not None and any(a != 0 or isinstance(a, bool) for a in items):
            raise ValueError(f"adapters: the cpu backend has one device, adapter 0; got {items!r}")
        return [make_backend("cpu") for _ in range(count)]
    if items is None:
        items = list(range(len(adapters())))
        if not items:
            make_backend(name)  # the error that says why there is no adapter
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, str)):
            raise ValueError(f"adapters: expected adapter indices (int) or name substrings (str), got {a!r}")
    return [make_backend(name, adapter=a, safe=safe) for a in items]


class DataParallel:
    """One model on several devices: `run(feeds)` splits each batched input along axis 0 across the devices, runs
    the shards concurrently and concatenates the outputs, the same dict as `Model.run` gives for the whole batch.

    adapters: "all" (every wgpu compute adapter, `ember.adapters()`; on the cpu backend, one device), a list of
    adapter indices or name substrings (repeats allowed: `[0, 0]` puts two devices on adapter 0), or a list of
    backend objects from `ember.backend()`. backend: the backend name for adapters given by index ("wgpu",
    "cpu" or "auto"). weights: the share of each batch per device (default equal). batch_inputs: the inputs
    split along axis 0 (default: every input whose declared dim 0 is symbolic, or whose shape is undeclared and
    has rank >= 1); the others go whole to every device. load_options: load_onnx's options (fuse, precision,
    plan_cache_bytes, autotune, safe, external_data_dir), the same for every device.

    A batch smaller than the device count runs on fewer devices. Every output must have the batch on axis 0
    (ValueError otherwise), and the batched inputs must agree on the batch size."""

    def __init__(self, model: Any, adapters: Any = "all", backend: str = "wgpu", *,
                 weights: Sequence[float] | None = None, batch_inputs: Sequence[str] | None = None,
                 **load_options: Any) -> None:
        given = [k for k in ("adapter", "power_preference") if k in load_options]
        if given:
            raise ValueError(f"{', '.join(given)}: DataParallel picks the devices through adapters=")
        self._closed = False
        self.devices = _backends(adapters, backend, bool(load_options.get("safe", False)))
        self.weights = _check_weights(weights, len(self.devices))
        self.models: list[Model] = [load_onnx(model, backend=be, **load_options) for be in self.devices]
        first = self.models[0]
        self.inputs, self.outputs = first.inputs, first.outputs
        names = [i.name for i in self.inputs]
        if batch_inputs is None:
            self.batch_inputs = [i.name for i in self.inputs
                                 if i.shape is None or (len(i.shape) >= 1 and not isinstance(i.shape[0], int))]
        else:
            unknown = [n for n in batch_inputs if n not in names]
            if unknown:
                raise ValueError(f"batch_inputs: unknown input name(s) {unknown}; the model's inputs are {names}")
            self.batch_inputs = list(batch_inputs)
        if not self.batch_inputs:
            raise ValueError(f"DataParallel: no input has a batch axis (a symbolic dim 0) to split; the model's "
                             f"inputs are {self.inputs}; name them with batch_inputs=")
        # One thread per device beyond the first: the caller's thread runs the first shard.
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.models) - 1), thread_name_prefix="ember-dp")

    def __repr__(self) -> str:
        devices = ", ".join(getattr(be, "adapter_name", be.name) for be in self.devices)
        return f"DataParallel({len(self.models)} devices: {devices})"

    def __enter__(self) -> DataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _batch_size(self, arrays: dict[str, Any]) -> int:
        sizes = {}
        for name in self.batch_inputs:
            a = arrays[name]
            if a.ndim == 0:
                raise ValueError(f"input {name!r}: a batched input needs rank >= 1 (the batch on axis 0), got a "
                                 f"scalar")
            sizes[name] = a.shape[0]
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{k!r}: {v}" for k, v in sizes.items())
            raise ValueError(f"the batched inputs disagree on the batch size (dim 0): {listed}")
        return next(iter(sizes.values()))

    def run(self, feeds: Mapping[str, Any], output_names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The model's outputs for the whole batch (host arrays), as `Model.run(feeds, output_names)` gives them."""
        if self._closed:
            raise RuntimeError("DataParallel: run after close()")
        if not isinstance(feeds, Mapping):
            raise TypeError(f"feeds must be a mapping of input name -> array, got {type(feeds).__name__}")
        if set(feeds) != {i.name for i in self.inputs}:
            return self.models[0].run(feeds, output_names)  # raises Model.run's error for missing/unknown names
        arrays: dict[str, Any] = {}
        for name, value in feeds.items():
            if isinstance(value, DeviceArray):
                raise ValueError(f"input {name!r}: a device array belongs to one backend; DataParallel takes host "
                                 f"arrays (value.numpy())")
            arrays[name] = host_array(name, value) if name in self.batch_inputs else value
        n = self._batch_size(arrays)
        jobs, start = [], 0
        for model, size in zip(self.models, split_sizes(n, self.weights), strict=True):
            if size == 0 and (n or jobs):  # an empty batch still runs once, on the first device
                continue
            shard = {k: (v[start:start + size] if k in self.batch_inputs else v) for k, v in arrays.items()}
            jobs.append((model, shard, size))
            start += size
        if len(jobs) == 1:
            model, shard, size = jobs[0]
            return self._check_outputs([model.run(shard, output_names)], [size])
        futures: list[Future] = [self._pool.submit(m.run, s, output_names) for m, s, _ in jobs[1:]]
        results, error = [], None
        try:
            results.append(jobs[0][0].run(jobs[0][1], output_names))
        except BaseException as e:  # wait for the other devices before raising
            error = e
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error
        return self._check_outputs(results, [size for _, _, size in jobs])

    def _check_outputs(self, results: list[dict[str, np.ndarray]], sizes: list[int]) -> dict[str, np.ndarray]:
        out = {}
        for name in results[0]:
            parts = [r[name] for r in results]
            for part, size in zip(parts, sizes, strict=True):
                if part.ndim == 0 or part.shape[0] != size:
                    raise ValueError(f"output {name!r} has no batch axis: a shard of {size} gave shape "
                                     f"{list(part.shape)} (DataParallel needs every output's dim 0 to be the batch)")
            out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        return out

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} positional input(s) "
                             f"{[i.name for i in self.inputs]}, got {len(arrays)}")
        result = self.run({i.name: a for i, a in zip(self.inputs, arrays, strict=True)})
        return [result[o.name] for o in self.outputs]

    def close(self) -> None:
        """Free every device's copy of the model and stop the threads; a later run raises RuntimeError."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        for m in self.models:
            m.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
