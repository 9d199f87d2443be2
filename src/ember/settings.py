"""Every knob ember reads from the environment, declared once: its variable, type, default and meaning.

A setting is read when it is used (`settings.WINOGRAD.get()`), never frozen at import, so changing the
environment between loads takes effect. Tests and tools scope a value with `override` instead of patching
module constants or the environment:

    with ember.settings.override(winograd=0, autotune=False):
        model = ember.load_onnx(path)

A malformed value raises `ValueError` naming the variable, the value and what was expected. `python -m
ember.settings` prints the table the README carries.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

SettingValue = TypeVar("SettingValue")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {'/'.join(_TRUE + _FALSE)}")


def _amount(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number") from None
    if not value >= 0:
        raise ValueError("expected a number >= 0")
    return value


def _count(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("expected a whole number >= 1")
    return int(raw)


def _whole(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError("expected a whole number >= 0")
    return int(raw)


def _text(raw: str) -> str:
    return raw


def _choice(*values: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in values:
            raise ValueError(f"expected one of {values}")
        return raw

    return parse


def _path(raw: str) -> Path:
    return Path(raw).expanduser()


@dataclass(frozen=True)
class Setting(Generic[SettingValue]):
    """One knob. `default` applies when the variable is unset or empty; None there means "decided at run time"
    (the doc says by what)."""

    key: str  # the name `override` takes
    env: str
    parse: Callable[[str], SettingValue]
    default: SettingValue | None
    type_name: str
    doc: str

    def get(self) -> SettingValue | None:
        """The value now: an `override` in scope, else the parsed variable, else the default."""
        scoped = _overrides.get(self.key, _UNSET)
        if scoped is not _UNSET:
            return scoped
        raw = _environ(self.env).strip()
        if not raw:
            return self.default
        cached = _parsed.get((self.env, raw), _UNSET)
        if cached is not _UNSET:
            return cached
        try:
            value = self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.env}={raw!r}: {e}") from None
        _parsed[(self.env, raw)] = value
        return value


def _environ_reader() -> Callable[[str], str]:
    """`os.environ.get(name, "")`, cheaper: a public op reads a setting or two per call (its cache key,
    api_cache.py), and for an unset variable, the usual case, `os.environ.get` costs ~1 µs (Mapping.get catches
    the KeyError os._Environ raises). Where os.environ is CPython's os._Environ this looks the variable up in the
    dict behind it, which every change through os.environ (and so monkeypatch.setenv) updates; the same values
    as os.environ.get, read each time. Anything else (os.environ replaced) takes os.environ.get."""
    env = os.environ
    data, encode, decode = (getattr(env, "_data", None), getattr(env, "encodekey", None),
                            getattr(env, "decodevalue", None))
    if type(env) is not os._Environ or type(data) is not dict or encode is None or decode is None:
        return lambda name: os.environ.get(name, "")
    keys: dict[str, Any] = {}

    def read(name: str) -> str:
        if os.environ is not env:  # replaced since: the general route
            return os.environ.get(name, "")
        key = keys.get(name)
        if key is None:
            key = keys[name] = encode(name)
        raw = data.get(key)
        return "" if raw is None else decode(raw)

    return read


_environ = _environ_reader()
_UNSET: Any = object()
_overrides: dict[str, Any] = {}
_parsed: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()
REGISTRY: dict[str, Setting[Any]] = {}


def _declare(key: str, env: str, parse: Callable[[str], SettingValue], default: SettingValue | None, type_name: str,
             doc: str) -> Setting[SettingValue]:
    setting = Setting(key, env, parse, default, type_name, doc)
    REGISTRY[key] = setting
    return setting


BACKEND = _declare("backend", "EMBER_BACKEND", _text, None, "name",
                   "The backend `backend(\"auto\")` and `load_onnx(backend=\"auto\")` pick; unset: the best available.")
WINOGRAD = _declare("winograd", "EMBER_WINOGRAD", _whole, None, "0 | 2 | 4",
                    "Winograd arm for eligible 3x3 convs: 0 off, else the tile m; unset: the backend's cost model.")
ATTENTION = _declare("attention", "EMBER_ATTENTION", _choice("flash", "gemm"), None, "flash | gemm",
                     "Attention arm: the flash kernel or scores GEMM + softmax + GEMM; unset: the backend's rule.")
AUTOTUNE = _declare("autotune", "EMBER_AUTOTUNE", _flag, None, "bool",
                    "wgpu GEMM/conv tile autotune; unset: on for hardware GPUs, off on software adapters. "
                    "`load_onnx(autotune=...)` wins over it.")
CACHE_DIR = _declare("cache_dir", "EMBER_CACHE_DIR", _path, None, "path",
                     "Where autotune choices are cached; unset: $XDG_CACHE_HOME/ember, else ~/.cache/ember.")
CHECKED_SHADERS = _declare("checked_shaders", "EMBER_CHECKED_SHADERS", _flag, False, "bool",
                           "wgpu: create shader modules with bounds checks (an out-of-bounds access fails loudly).")
DIRECT_CONV = _declare("direct_conv", "EMBER_DIRECT_CONV", _flag, True, "bool",
                       "wgpu: small-filter convs through the direct kernel (off: implicit GEMM, to compare).")
GEMV = _declare("gemv", "EMBER_GEMV", _flag, True, "bool",
                "wgpu: products of at most 4 rows (a decode step's) through the matrix-vector kernel (off: the "
                "tiled GEMM, to compare).")
GEMV_GROUPS = _declare("gemv_groups", "EMBER_GEMV_GROUPS", _whole, 512, "workgroups",
                       "wgpu: a matrix-vector product with fewer column workgroups splits K until it has about this "
                       "many (0: never split, to compare).")
GEMV_VEC4 = _declare("gemv_vec4", "EMBER_GEMV_VEC4", _flag, True, "bool",
                     "wgpu: the matrix-vector kernel reads a weight in quads where they line up: 4 columns of a "
                     "row-major one, 4 k of a transposed one (off: one element a load, to compare).")
ATTENTION_SPLIT_KV = _declare("attention_split_kv", "EMBER_ATTENTION_SPLIT_KV", _whole, 32, "keys",
                                "wgpu: a decode step's attention (one query) splits each head's keys into chunks of "
                                "at least this many, up to 32 workgroups a head, merged by a second kernel (0: never, "
                                "one workgroup a head, to compare).")
WEBGPU = _declare("webgpu", "EMBER_WEBGPU", _choice("auto", "dawn", "wgpu-native"), "auto",
                  "auto | dawn | wgpu-native",
                  "wgpu: the WebGPU runtime (Dawn through wgpudawn, or wgpu-native through wgpu-py); auto: Dawn "
                  "where installed and its adapter offers matrix units, else wgpu-native. "
                  "`load_onnx(webgpu=...)` wins over it.")
MATRIX = _declare("matrix", "EMBER_MATRIX", _choice("auto", "on", "off", "emulate"), "auto",
                  "auto | on | off | emulate",
                  "wgpu: f16 products on the matrix units (subgroup matrices, Dawn): auto takes them for large "
                  "products, on for every eligible one, off never; emulate runs the same tiling in plain WGSL "
                  "(for tests on adapters without matrix units).")
SHARED_SCRATCH = _declare("shared_scratch", "EMBER_SHARED_SCRATCH", _flag, True, "bool",
                          "wgpu: past the private budget, kernels share one transient buffer per role.")
SCRATCH_PRIVATE_MB = _declare("scratch_private_mb", "EMBER_SCRATCH_PRIVATE_MB", _amount, 256.0, "MiB",
                              "wgpu: transient buffers each kernel may hold privately before sharing starts.")
ENCODE_AHEAD = _declare("encode_ahead", "EMBER_ENCODE_AHEAD", _flag, True, "bool",
                        "wgpu: encode a plan's next command buffer right after submitting the current run.")
WAIT_SPIN_US = _declare("wait_spin_us", "EMBER_WAIT_SPIN_US", _amount, 3000.0, "microseconds",
                        "wgpu: how long a readback polls the device before sleeping in the driver (hardware only).")
PIPELINE_CACHE = _declare("pipeline_cache", "EMBER_PIPELINE_CACHE", _count, 1024, "count",
                          "wgpu: compiled pipelines a backend keeps for reuse, least recently used dropped first.")
WGPU_PY_ENCODE = _declare("wgpu_py_encode", "EMBER_WGPU_PY_ENCODE", _flag, False, "bool",
                          "wgpu: encode through wgpu-py's wrappers instead of raw wgpu-native calls (to compare).")
NATIVE_GEMM = _declare("native_gemm", "EMBER_NATIVE_GEMM", _flag, True, "bool",
                       "cpu: use the compiled kernels where built: GEMM/conv, and norms, decode attention, GELU "
                       "and moved copies (read when they are first loaded).")
CPU_THREADS = _declare("cpu_threads", "EMBER_CPU_THREADS", _count, None, "count",
                       "cpu: threads of the backend's pool (read when it is made); unset: the cores, at most 4.")
TEMPLATES = _declare("templates", "EMBER_TEMPLATES", _flag, True, "bool",
                     "Plans for new input shapes of a model with symbolic dims made from a template fitted to "
                     "earlier builds (ember/plan/fit.py) instead of planning the graph again.")
TEMPLATE_CHECK = _declare("template_check", "EMBER_TEMPLATE_CHECK", _flag, False, "bool",
                          "Check every plan made from a template against a full trace of its shapes (slow; "
                          "a difference raises RuntimeError). For tests.")
PROGRESS = _declare("progress", "EMBER_PROGRESS", _flag, None, "bool",
                    "Progress of slow work (load, plan build, autotune) on stderr; unset: on when stderr is a "
                    "terminal. The CLI's `--quiet` turns it off.")
LOOP_MAX_ITERATIONS = _declare("loop_max_iterations", "EMBER_LOOP_MAX_ITERATIONS", _count, 1_000_000, "count",
                                "Iterations a Loop without a finite trip count may run (its condition decided at "
                                "run time) before RuntimeError names it, instead of hanging.")


def cache_dir() -> Path:
    """The autotune cache directory: EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember."""
    chosen = CACHE_DIR.get()
    if chosen is not None:
        return chosen
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ember"


def default_runtime_dir() -> None:
    """Give EGL an XDG_RUNTIME_DIR (adapter enumeration probes it and complains on stderr without one)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


def _checked(setting: Setting[Any], value: Any) -> Any:
    """A value given as text goes through the setting's parser, as the environment's would."""
    if not isinstance(value, str):
        return value
    try:
        return setting.parse(value.strip())
    except ValueError as e:
        raise ValueError(f"settings.override({setting.key}={value!r}): {e}") from None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Scope settings by key (`override(winograd=0)`), for the whole process, restored on exit. None restores
    the setting's unset behaviour (its default or run-time decision); a string is parsed as the variable is."""
    unknown = sorted(set(values) - set(REGISTRY))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(REGISTRY)}")
    with _lock:
        saved = {k: _overrides.get(k, _UNSET) for k in values}
        for k, v in values.items():
            _overrides[k] = REGISTRY[k].default if v is None else _checked(REGISTRY[k], v)
    try:
        yield
    finally:
        with _lock:
            for k, v in saved.items():
                if v is _UNSET:
                    _overrides.pop(k, None)
                else:
                    _overrides[k] = v


def table() -> str:
    """The settings as a markdown table (what the README lists)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for s in REGISTRY.values():
        default = "—" if s.default is None else str(s.default)
        if isinstance(s.default, bool):
            default = default.lower()
        rows.append(f"| `{s.env}` | {s.type_name} | {default} | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
