"""The autotune cache: tuned GEMM plans per adapter, in memory and in one JSON file per adapter (autotune.py).

The file lives in $EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember; one per adapter identity
(vendor, device, driver description, backend, wgpu version). It records the kernel generator's version
(GENERATOR_VERSION plus a hash of the generator sources): entries of another version are dropped. Writes go to a
temporary file then os.replace (readers never see half a file), merged with what is on disk under a lock file
(concurrent processes keep each other's entries); an unreadable file is warned about and ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import wgpu

from ... import settings

# Bump when the generated kernels change in a way the source hash below would miss (e.g. a WGSL template file).
GENERATOR_VERSION = "1"
CACHE_FORMAT = 1
# The sources (relative to this package) that generate the tuned kernels, choose their candidates or hold the
# cache: the GEMM generator and the shader library under it, its callers, the autotuner.
GENERATOR_SOURCES = (
    "gemm.py", "shader/bindings.py", "shader/emit.py", "shader/epilogue.py", "shader/loaders.py", "shader/tiles.py",
    "shader/wgsl.py", "kernels/splitk_reduce.wgsl", "matmul.py", "conv.py", "conv_shape.py", "conv_igemm.py",
    "conv_direct.py", "conv_depthwise.py", "winograd.py", "winograd_cost.py", "autotune.py", "tune_cache.py",
)


ADAPTER_FIELDS = ("vendor", "architecture", "device", "description", "vendor_id", "device_id", "backend_type",
                  "adapter_type")


def adapter_identity(info: dict[str, Any], runtime: str = "wgpu-native", version: str | None = None) -> dict[str, Any]:
    ident = {f: info.get(f) for f in ADAPTER_FIELDS}
    # The runtime's shader compiler (naga, Tint) changes what a tile costs.
    ident["wgpu"] = version or wgpu.__version__
    if runtime != "wgpu-native":
        ident["runtime"] = runtime
    return ident


def generator_version() -> str:
    """GENERATOR_VERSION plus a hash of the sources that generate the tuned kernels and choose candidates, so a
    cache written by other kernels is never trusted."""
    h = hashlib.sha1(GENERATOR_VERSION.encode())
    here = Path(__file__).resolve().parent
    for f in GENERATOR_SOURCES:
        with contextlib.suppress(OSError):
            h.update((here / f).read_bytes())
    return f"{GENERATOR_VERSION}-{h.hexdigest()[:12]}"


def cache_dir() -> Path:
    return settings.cache_dir()


def cache_path(directory: Path, ident: dict[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(ident.get("device") or "adapter")).strip("-").lower()[:40]
    return directory / f"autotune-{slug}-{digest}.json"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An advisory lock (POSIX) around read-merge-write, so concurrent processes keep each other's entries."""
    try:
        import fcntl
    except ImportError:  # Windows: os.replace still keeps the file whole; a race may drop an entry (retuned later)
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TuneCache:
    """Choices for one adapter: in memory, backed by one JSON file."""

    def __init__(self, path: Path, ident: dict[str, Any], version: str) -> None:
        self.path, self.ident, self.version = path, ident, version
        self.entries: dict[str, dict[str, Any]] = self._read()
        self._warned_write = False

    def _read(self, quiet: bool = False) -> dict[str, dict[str, Any]]:
        """The file's entries; {} if it is missing, unreadable, corrupt (warned about unless quiet) or stale."""
        try:
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as e:
            if not quiet:
                warnings.warn(f"ember autotune: cannot read {self.path} ({e}); ignoring it", stacklevel=3)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise ValueError("not an ember autotune cache")
        except ValueError as e:
            if not quiet:
                warnings.warn(f"ember autotune: {self.path} is corrupt ({e}); ignoring it (it is rewritten on the "
                              "next tuning)", stacklevel=3)
            return {}
        if (data.get("format") != CACHE_FORMAT or data.get("generator") != self.version
                or data.get("adapter") != self.ident):
            return {}  # other kernels, or a hash collision of another adapter: stale, not an error
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        self.entries[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(self.path):
                merged = {**self._read(quiet=True), **self.entries}  # keep other processes' entries
                self.entries = merged
                data = {"format": CACHE_FORMAT, "generator": self.version, "adapter": self.ident,
                        "entries": dict(sorted(merged.items()))}
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump(data, f, indent=1)
                    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
                    os.replace(tmp, self.path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
        except OSError as e:
            if not self._warned_write:  # an unwritable cache costs load time, not correctness: say so once
                warnings.warn(f"ember autotune: cannot write {self.path} ({e}); choices stay in memory", stacklevel=2)
                self._warned_write = True

