"""The one timing core and output path of bench/: every script times through here and prints through here.

    from harness import measure, ab, interleave, Report
    stats = measure(fn, repeat=30, warmup=3)            # Stats: median / p10 / p90 / min, milliseconds
    res = ab(run_a, run_b, pairs=20)                    # runs interleaved in pairs; res.ratio: per pair b / a
    report = Report("title", args)                      # rows x columns; markdown to stdout, --json / --md files
    report.set("resnet18_b1", "ember wgpu", stats); report.finish()

Settings: `Arm` holds one side of an A/B (load_onnx options and ember.settings values) and scopes them with
`ember.settings.override`, or with the EMBER_* environment variables where ember has no `settings` module (older
checkouts), so the same script A/Bs old and new sources. Nothing here imports ember at module level: scripts
choose which ember they import (another checkout's src, a copy) before it is first imported.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
# This checkout's tests (model builders) and src, unless a script puts another src first afterwards.
for _p in (str(ROOT / "src"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # EGL probes it while wgpu enumerates adapters

Clock = Callable[[], float]


# ---- statistics ---------------------------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: int) -> float:
    """The q-th percentile (0-100) of sorted xs by lower nearest rank, xs[n * q // 100]: what bench_models.py
    has always reported as p10 / p90, kept so its columns mean the same across commits."""
    if not xs:
        raise ValueError("percentile of no samples")
    return xs[min(len(xs) - 1, len(xs) * q // 100)]


@dataclass(frozen=True)
class Stats:
    """Summary of timed samples: milliseconds (unit "ms") or a dimensionless ratio (unit "x")."""

    n: int
    median: float
    p10: float
    p90: float
    min: float
    unit: str = "ms"
    samples: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def of(cls, samples: Sequence[float], unit: str = "ms") -> Stats:
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("no samples")
        return cls(len(xs), statistics.median(xs), percentile(xs, 10), percentile(xs, 90), xs[0], unit,
                   tuple(float(x) for x in samples))

    def as_dict(self, samples: bool = False) -> dict[str, Any]:
        """{"median_ms", "p10_ms", "p90_ms", "min_ms", "n"} (the keys bench_models.py's JSON always had, plus
        min and n); a ratio's keys have no unit suffix."""
        sfx = "_ms" if self.unit == "ms" else ""
        out: dict[str, Any] = {f"median{sfx}": self.median, f"p10{sfx}": self.p10, f"p90{sfx}": self.p90,
                               f"min{sfx}": self.min, "n": self.n}
        if samples:
            out["samples"] = list(self.samples)
        return out

    def __str__(self) -> str:
        return fmt(self)


@dataclass(frozen=True)
class ABResult:
    """Two callables timed in pairs: each one's Stats and the per-pair ratio b / a (each pair's block medians
    when a block holds several runs). A pair's two runs see the machine in nearly the same state, so the
    ratio's spread is much tighter than either side's on a noisy host."""

    a: Stats
    b: Stats
    ratio: Stats
    pairs: int  # kept
    tried: int  # run, including pairs left out for foreign load

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "b_over_a": self.ratio.as_dict(), "pairs": self.pairs,
                "tried": self.tried}


@dataclass(frozen=True)
class Interleaved:
    """Several callables timed in rounds (see interleave): Stats per label, and per round each label's block
    median over the first label's (`ratios`; the first label's own is omitted)."""

    stats: dict[str, Stats]
    ratios: dict[str, Stats]
    rounds: int  # kept
    tried: int

    def as_dict(self) -> dict[str, Any]:
        first = next(iter(self.stats))
        return {"stats": {k: v.as_dict() for k, v in self.stats.items()},
                "ratios": {f"{k} / {first}": v.as_dict() for k, v in self.ratios.items()},
                "rounds": self.rounds, "tried": self.tried}


# ---- timing -------------------------------------------------------------------------------------------------


def samples(fn: Callable[[], Any], n: int, *, inner: int = 1, sync: Callable[[], Any] | None = None,
            clock: Clock = time.perf_counter) -> list[float]:
    """n timed samples of `inner` calls of fn (then sync, inside the timing: a device's queued work counts),
    milliseconds per call."""
    out = []
    for _ in range(n):
        t = clock()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        out.append((clock() - t) * 1e3 / inner)
    return out


def warm(fns: Sequence[Callable[[], Any]], seconds: float, sync: Callable[[], Any] | None = None) -> None:
    """Run fns round-robin for `seconds`: GPUs drop their clocks within milliseconds of idling (an H200 read
    kernels 2-4x slow right after the host had been busy), so timing starts with the device busy."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for fn in fns:
            fn()
        if sync is not None:
            sync()


def measure(fn: Callable[[], Any], repeat: int = 30, warmup: int = 3, *, inner: int = 1,
            sync: Callable[[], Any] | None = None, clock: Clock = time.perf_counter, warm_s: float = 0.0) -> Stats:
    """`warmup` untimed calls (pipelines, caches, first touch), `warm_s` seconds of busy device, then `repeat`
    timed samples of `inner` calls each."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    if warm_s > 0:
        warm([fn], warm_s, sync)
    return Stats.of(samples(fn, max(1, repeat), inner=inner, sync=sync, clock=clock))


def inner_for(fn: Callable[[], Any], target_s: float, sync: Callable[[], Any] | None = None,
              cap: int = 500) -> int:
    """How many back-to-back calls fill about target_s (one timed call decides): amortises a short kernel's
    host overhead and the sync."""
    if target_s <= 0:
        return 1
    t = samples(fn, 1, sync=sync)[0] * 1e-3
    return max(1, min(cap, math.ceil(target_s / max(t, 1e-7))))


def _busy_ticks() -> tuple[int, int] | None:
    """(ticks every cpu spent busy, ticks this process's threads spent) from /proc (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


class CpuProbe:
    """How much of one core other processes used since it was made: on a shared VM a round in which someone
    else's job ran is worth re-running rather than averaging in."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ticks = _busy_ticks()

    def foreign(self) -> float | None:
        now = _busy_ticks()
        if self.ticks is None or now is None:
            return None
        wall = max(time.perf_counter() - self.t0, 1e-9)
        return ((now[0] - self.ticks[0]) - (now[1] - self.ticks[1])) / os.sysconf("SC_CLK_TCK") / wall


def interleave(fns: Mapping[str, Callable[[], Any]], rounds: int = 20, *, block: int = 1, drop: int = 0,
               warmup: int = 3, sync: Callable[[], Any] | None = None, clock: Clock = time.perf_counter,
               warm_s: float = 0.0, max_foreign: float | None = None) -> Interleaved:
    """Rounds of `block` runs of each callable in turn, the order rotated every round (A B, B A, ... for two), the
    first `drop` runs of each block left out (idle OpenBLAS / ONNX Runtime workers spin for a while after a run
    and would tax whatever runs next). Separate processes each meet a shared machine in a different state, and
    drift within one process hits interleaved runs alike. With max_foreign, a round in which other processes took
    more than that share of a core is run again, up to twice the rounds asked for."""
    if not fns:
        raise ValueError("nothing to time")
    if not 0 <= drop < block:
        raise ValueError(f"drop ({drop}) must be below block ({block})")
    labels = list(fns)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if sync is not None:
        sync()
    if warm_s > 0:
        warm(list(fns.values()), warm_s, sync)
    times: dict[str, list[float]] = {k: [] for k in labels}
    ratios: dict[str, list[float]] = {k: [] for k in labels[1:]}
    kept = tried = 0
    limit = rounds if max_foreign is None else 2 * rounds
    while kept < rounds and tried < limit:
        order = labels[tried % len(labels):] + labels[:tried % len(labels)]
        tried += 1
        probe = CpuProbe() if max_foreign is not None else None
        got = {k: samples(fns[k], block, sync=sync, clock=clock)[drop:] for k in order}
        share = probe.foreign() if probe is not None else None
        if share is not None and max_foreign is not None and share > max_foreign:
            continue
        kept += 1
        for k in labels:
            times[k] += got[k]
        base = statistics.median(got[labels[0]])
        for k in labels[1:]:
            ratios[k].append(statistics.median(got[k]) / base if base > 0 else math.nan)
    if not kept:
        raise RuntimeError(f"every one of {tried} rounds had more than {max_foreign:.0%} of a core of foreign load")
    return Interleaved({k: Stats.of(v) for k, v in times.items()}, {k: Stats.of(v, "x") for k, v in ratios.items()},
                       kept, tried)


def ab(a: Callable[[], Any], b: Callable[[], Any], pairs: int = 20, *, block: int = 1, drop: int = 0,
       warmup: int = 3, sync: Callable[[], Any] | None = None, clock: Clock = time.perf_counter,
       warm_s: float = 0.0, max_foreign: float | None = None) -> ABResult:
    """A/B: a and b interleaved in pairs (which goes first alternating), per-pair ratio b / a."""
    res = interleave({"a": a, "b": b}, pairs, block=block, drop=drop, warmup=warmup, sync=sync, clock=clock,
                     warm_s=warm_s, max_foreign=max_foreign)
    return ABResult(res.stats["a"], res.stats["b"], res.ratios["b"], res.rounds, res.tried)


# ---- settings: one side of an A/B -----------------------------------------------------------------------------

LOAD_OPTIONS = ("fuse", "precision", "autotune")  # load_onnx keywords; every other key is an ember.settings key
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_assignments(items: Sequence[str] | None) -> dict[str, str]:
    """["winograd=0", "fuse=0,autotune=1"] -> {"winograd": "0", "fuse": "0", "autotune": "1"} (raw strings:
    each is parsed by the setting it names)."""
    out: dict[str, str] = {}
    for item in items or ():
        for part in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise SystemExit(f"expected KEY=VALUE, got {part!r}")
            out[key.strip().lower()] = value.strip()
    return out


def _flag(key: str, raw: str) -> bool | None:
    low = raw.lower()
    if low in ("", "default", "none"):
        return None
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise SystemExit(f"{key}={raw!r}: expected one of {'/'.join(_TRUE + _FALSE)} or default")


def settings_module(pkg: ModuleType) -> ModuleType | None:
    """pkg.settings (ember's declared knobs), or None for a checkout from before it existed."""
    try:
        mod = importlib.import_module(f"{pkg.__name__}.settings")
    except ImportError:
        return None
    return mod if hasattr(mod, "override") and hasattr(mod, "REGISTRY") else None


@contextlib.contextmanager
def override(values: Mapping[str, str], pkg: ModuleType | None = None) -> Iterator[None]:
    """Scope raw setting values (as the environment would hold them) for ember package `pkg` (default: ember):
    through settings.override, each value parsed by its setting, where the package has settings; else the
    EMBER_<KEY> variables, set for the scope and restored (older sources read the environment)."""
    if pkg is None:
        import ember as pkg  # ember is imported only once a script asks for it
    mod = settings_module(pkg)
    if mod is not None:
        parsed: dict[str, Any] = {}
        for key, raw in values.items():
            setting = mod.REGISTRY.get(key)
            if setting is None:
                raise SystemExit(f"unknown setting {key!r}; known: {', '.join(sorted(mod.REGISTRY))}")
            parsed[key] = None if raw.lower() in ("", "default", "none") else setting.parse(raw)
        with mod.override(**parsed):
            yield
        return
    saved = {key: os.environ.get(f"EMBER_{key.upper()}") for key in values}
    try:
        for key, raw in values.items():
            if raw.lower() in ("", "default", "none"):
                os.environ.pop(f"EMBER_{key.upper()}", None)
            else:
                os.environ[f"EMBER_{key.upper()}"] = raw
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(f"EMBER_{key.upper()}", None)
            else:
                os.environ[f"EMBER_{key.upper()}"] = old


@dataclass
class Arm:
    """One side of an A/B: load_onnx options (fuse, precision, autotune) and settings values, and the ember
    package it runs on (another checkout's copy for --against)."""

    label: str
    load: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    pkg: ModuleType | None = None

    @classmethod
    def parse(cls, label: str, items: Sequence[str] | None, pkg: ModuleType | None = None) -> Arm:
        arm = cls(label, pkg=pkg)
        for key, raw in parse_assignments(items).items():
            if key == "precision":
                arm.load[key] = raw
            elif key in LOAD_OPTIONS:
                flag = _flag(key, raw)
                if key == "fuse" and flag is None:
                    continue  # fuse's default (True)
                arm.load[key] = flag
            else:
                arm.settings[key] = raw
        return arm

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return override(self.settings, self.pkg)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.load.items()] + [f"{k}={v}" for k, v in self.settings.items()]
        return ", ".join(parts) or "defaults"

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """fn run inside this arm's scope: settings read at run time (encode_ahead, wait_spin_us, ...) apply too.
        Both arms of an A/B are wrapped, so the scope's own cost (µs) falls on each alike."""
        def run() -> Any:
            with self.scope():
                return fn()
        return run


# ---- output ---------------------------------------------------------------------------------------------------


def command_line(argv: Sequence[str] | None = None) -> str:
    return "python " + shlex.join(list(sys.argv if argv is None else argv))


def header_meta(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """What every result records: when (UTC), where, and the command that made it."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(), "command": command_line(argv)}


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: Stats and timing dicts as their median, ratios with their p10-p90 spread."""
    if value is None:
        return "–"
    if isinstance(value, ABResult):
        value = value.ratio
    if isinstance(value, Stats):
        if value.unit == "x":
            return f"{value.median:.3f}x [{value.p10:.3f}, {value.p90:.3f}]"
        return f"{value.median:.{digits}f} {value.unit}"
    if isinstance(value, Mapping) and "median_ms" in value:
        return f"{value['median_ms']:.{digits}f} ms"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (Stats, ABResult, Interleaved)):
        return value.as_dict()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class Report:
    """Rows x columns of results; one output path for every script: a markdown table (a header line with UTC date,
    host and command, then the table) to stdout at the end, and the same to --md; --json gets
    {"meta": ..., "results": [{row_key: name, cells_key: {column: value}, ...extra}]}, rewritten after every row
    so a run cut short still leaves what it measured."""

    def __init__(self, title: str, args: argparse.Namespace | None = None, *, row_key: str = "name",
                 cells_key: str = "cells", digits: int = 3, meta: Mapping[str, Any] | None = None,
                 argv: Sequence[str] | None = None, lead: Sequence[str] = ()) -> None:
        self.title = title
        self.lead = list(lead)  # columns that go first when present, whatever row brought them
        self.row_key, self.cells_key, self.digits = row_key, cells_key, digits
        self.meta = {**header_meta(argv), **(meta or {})}
        self.json_path: Path | None = getattr(args, "json", None)
        self.md_path: Path | None = getattr(args, "md", None)
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def row(self, name: str, **extra: Any) -> dict[str, Any]:
        """The row called name (made at the end if new), extra keys merged into it."""
        for r in self.rows:
            if r[self.row_key] == name:
                r.update(extra)
                return r
        r = {self.row_key: name, self.cells_key: {}, **extra}
        self.rows.append(r)
        return r

    def set(self, name: str, column: str, value: Any) -> None:
        self.row(name)[self.cells_key][column] = value

    def add(self, name: str, cells: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        r = self.row(name, **extra)
        r[self.cells_key].update(cells or {})
        self.save()
        return r

    def note(self, text: str) -> None:
        """A line printed under the table (what the numbers mean, what was skipped)."""
        self.notes.append(text)

    def columns(self) -> list[str]:
        cols: list[str] = []
        for r in self.rows:
            cols += [c for c in r[self.cells_key] if c not in cols]
        return [c for c in self.lead if c in cols] + [c for c in cols if c not in self.lead]

    def header(self) -> str:
        m = self.meta
        return f"`{m['command']}` — {m['host']} ({m['machine']}), {m['date']}"

    def table(self) -> str:
        cols = self.columns()
        lines = [f"| {self.row_key} | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for r in self.rows:
            cells = [fmt(r[self.cells_key].get(c), self.digits) for c in cols]
            lines.append(f"| {r[self.row_key]} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def markdown(self) -> str:
        parts = [f"### {self.title}", self.header(), self.table()]
        if self.notes:
            parts.append("\n".join(self.notes))
        return "\n\n".join(parts) + "\n"

    def to_json(self) -> str:
        return json.dumps({"meta": {"title": self.title, **self.meta}, "results": self.rows}, indent=1,
                          default=_json_default)

    def save(self) -> None:
        if self.json_path is not None:
            self.json_path.parent.mkdir(parents=True, exist_ok=True)
            self.json_path.write_text(self.to_json())

    def finish(self) -> str:
        text = self.markdown()
        print("\n" + text, end="", flush=True)
        if self.md_path is not None:
            self.md_path.parent.mkdir(parents=True, exist_ok=True)
            self.md_path.write_text(text)
        self.save()
        return text


# ---- arguments ------------------------------------------------------------------------------------------------


def add_common(ap: argparse.ArgumentParser, *, repeat: int = 30, warmup: int = 3, backends: bool = True) -> None:
    """--repeat, --warmup, --json, --md (and --backends), the same in every script."""
    ap.add_argument("--repeat", type=int, default=repeat, help=f"timed runs per measurement (default {repeat})")
    ap.add_argument("--warmup", type=int, default=warmup, help=f"untimed runs first (default {warmup})")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--md", type=Path, help="also write the markdown table here")
    if backends:
        ap.add_argument("--backends", help="comma-separated ember backends (default: every available one)")


def backend_list(value: str | None, available: Sequence[str]) -> list[str]:
    """--backends: the names asked for (each must be available), or every available backend."""
    if not value:
        return list(available)
    names = [b.strip() for b in value.split(",") if b.strip()]
    missing = [b for b in names if b not in available]
    if missing:
        raise SystemExit(f"backend(s) {missing} not available here (available: {list(available)})")
    return names


def add_settings(ap: argparse.ArgumentParser, flag: str = "--set", text: str | None = None) -> None:
    ap.add_argument(flag, action="append", default=[], metavar="KEY=VALUE",
                    help=text or "a load option (fuse, precision, autotune) or an ember.settings key "
                                 "(`python -m ember.settings` lists them); repeatable, or comma-separated")


# ---- peers and device facts -------------------------------------------------------------------------------------


def cuda_torch() -> Any:
    """torch where it has CUDA, with TF32 off (fp32 everywhere, as ember computes), else None: the PyTorch
    columns of the benchmarks."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def adapter_name(be: Any) -> str:
    """The device a backend runs on (the wgpu adapter's name; the backend's name elsewhere)."""
    return str(getattr(be, "adapter_name", None) or getattr(be, "name", "?"))


def max_rel_err(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.nan
    return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30)) if want.size else 0.0
