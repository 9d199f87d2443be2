"""bench/harness.py: its statistics, A/B interleaving, settings scoping and output, with a fake clock (no device
timing is asserted)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import harness  # noqa: E402


class FakeClock:
    """Time advances only when a timed callable says so: samples come out exactly as scripted."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def work(self, ms: float) -> None:
        self.now += ms * 1e-3


def test_percentile_is_bench_models_lower_nearest_rank() -> None:
    xs = sorted(float(i) for i in range(30))
    assert harness.percentile(xs, 10) == xs[len(xs) // 10] == 3.0
    assert harness.percentile(xs, 90) == xs[9 * len(xs) // 10] == 27.0
    assert harness.percentile([5.0], 90) == 5.0
    with pytest.raises(ValueError):
        harness.percentile([], 10)


def test_stats_of_samples() -> None:
    st = harness.Stats.of([5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 7.0, 8.0, 9.0])
    assert (st.n, st.median, st.min) == (10, 5.5, 1.0)
    assert (st.p10, st.p90) == (2.0, 10.0)
    assert st.samples[0] == 5.0  # in the order taken
    d = st.as_dict()
    assert set(d) == {"median_ms", "p10_ms", "p90_ms", "min_ms", "n"}
    ratio = harness.Stats.of([1.0, 2.0], unit="x").as_dict()
    assert "median" in ratio and "median_ms" not in ratio
    with pytest.raises(ValueError):
        harness.Stats.of([])


def test_measure_warms_up_then_times_each_sample() -> None:
    clock = FakeClock()
    durations = iter([100.0] * 2 + [1.0, 3.0, 2.0])  # two warm-up calls, then three timed ones
    calls = []

    def fn() -> None:
        calls.append(1)
        clock.work(next(durations))

    st = harness.measure(fn, repeat=3, warmup=2, clock=clock)
    assert len(calls) == 5
    assert (st.median, st.min, st.n) == (pytest.approx(2.0), pytest.approx(1.0), 3)


def test_measure_inner_divides_and_syncs_inside_the_timing() -> None:
    clock = FakeClock()
    syncs = []

    def sync() -> None:
        syncs.append(1)
        clock.work(2.0)  # the device's queued work, waited for inside the sample

    st = harness.measure(lambda: clock.work(1.0), repeat=4, warmup=0, inner=4, sync=sync, clock=clock)
    assert st.median == pytest.approx((4 * 1.0 + 2.0) / 4)
    assert len(syncs) == 1 + 4  # after the warm-up, then once per sample


def test_ab_alternates_order_and_reports_per_pair_ratio() -> None:
    clock = FakeClock()
    order: list[str] = []

    def make(label: str, ms: float) -> Callable[[], None]:
        def fn() -> None:
            order.append(label)
            clock.work(ms)
        return fn

    res = harness.ab(make("a", 2.0), make("b", 3.0), pairs=4, warmup=0, clock=clock)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert (res.a.median, res.b.median) == (pytest.approx(2.0), pytest.approx(3.0))
    assert res.ratio.unit == "x" and res.ratio.median == pytest.approx(1.5)
    assert (res.pairs, res.tried) == (4, 4)
    assert set(res.as_dict()) == {"a", "b", "b_over_a", "pairs", "tried"}


def test_interleave_blocks_drop_their_first_runs() -> None:
    clock = FakeClock()
    runs = {"x": 0, "y": 0}

    def make(label: str, slow_first: float, steady: float) -> Callable[[], None]:
        def fn() -> None:
            runs[label] += 1
            # Every block's first run is slow (a neighbour's spinning threads): dropped, it leaves no trace.
            clock.work(slow_first if runs[label] % 3 == 1 else steady)
        return fn

    res = harness.interleave({"x": make("x", 50.0, 1.0), "y": make("y", 50.0, 4.0)}, rounds=3, block=3, drop=1,
                             warmup=0, clock=clock)
    assert runs == {"x": 9, "y": 9}
    assert res.stats["x"].n == 6 and res.stats["x"].median == pytest.approx(1.0)
    assert res.ratios["y"].median == pytest.approx(4.0)
    assert "x" not in res.ratios
    with pytest.raises(ValueError):
        harness.interleave({"x": lambda: None}, rounds=1, block=2, drop=2)


def test_parse_assignments_and_arm() -> None:
    assert harness.parse_assignments(["winograd=0", "fuse=0, autotune=1"]) == {"winograd": "0", "fuse": "0",
                                                                               "autotune": "1"}
    with pytest.raises(SystemExit):
        harness.parse_assignments(["winograd"])
    arm = harness.Arm.parse("B", ["fuse=off", "precision=f16", "autotune=default", "Direct_Conv=0"])
    assert arm.load == {"fuse": False, "precision": "f16", "autotune": None}
    assert arm.settings == {"direct_conv": "0"}
    assert "direct_conv=0" in arm.describe()
    assert harness.Arm("A").describe() == "defaults"


def test_override_falls_back_to_environment_without_settings_module(monkeypatch: pytest.MonkeyPatch) -> None:
    old = types.ModuleType("ember_without_settings")  # an older checkout: no ember.settings to import
    monkeypatch.setitem(sys.modules, old.__name__, old)
    monkeypatch.setenv("EMBER_DIRECT_CONV", "1")
    monkeypatch.delenv("EMBER_WINOGRAD", raising=False)
    with harness.override({"winograd": "0", "direct_conv": "default"}, old):
        assert os.environ["EMBER_WINOGRAD"] == "0"
        assert "EMBER_DIRECT_CONV" not in os.environ
    assert "EMBER_WINOGRAD" not in os.environ
    assert os.environ["EMBER_DIRECT_CONV"] == "1"


def test_override_uses_ember_settings() -> None:
    settings = pytest.importorskip("ember.settings")
    import ember

    before = settings.WINOGRAD.get()
    with harness.override({"winograd": "0", "autotune": "off"}, ember):
        assert settings.WINOGRAD.get() == 0
        assert settings.AUTOTUNE.get() is False
    assert settings.WINOGRAD.get() == before
    with pytest.raises(SystemExit, match="unknown setting"), harness.override({"no_such_knob": "1"}, ember):
        pass


def test_report_markdown_and_json(tmp_path: Path) -> None:
    args = argparse.Namespace(json=tmp_path / "out" / "r.json", md=tmp_path / "r.md")
    rep = harness.Report("Title", args, row_key="model", cells_key="engines", digits=2,
                         argv=["bench/x.py", "--repeat", "3"], meta={"backends": ["cpu"]})
    rep.add("m1", {"ember cpu": harness.Stats.of([1.0, 2.0, 3.0]), "note": "failed: X"}, info={"steps": 3})
    rep.set("m2", "ember cpu", {"median_ms": 4.5, "p10_ms": 4.0})
    rep.set("m2", "ratio", harness.Stats.of([1.5, 2.0, 2.5], unit="x"))
    rep.note("a note")
    text = rep.finish()
    lines = text.splitlines()
    assert lines[0] == "### Title"
    assert "`python bench/x.py --repeat 3`" in text and "UTC" in text
    assert "| model | ember cpu | note | ratio |" in lines
    assert "| m1 | 2.00 ms | failed: X | – |" in lines
    assert "| m2 | 4.50 ms | – | 2.000x [1.500, 2.500] |" in lines
    assert text.endswith("a note\n")
    assert args.md.read_text() == text
    data = json.loads(args.json.read_text())
    assert data["meta"]["backends"] == ["cpu"] and data["meta"]["command"] == "python bench/x.py --repeat 3"
    assert data["results"][0]["model"] == "m1"
    assert data["results"][0]["engines"]["ember cpu"]["median_ms"] == 2.0
    assert data["results"][0]["info"] == {"steps": 3}


def test_report_lead_columns_go_first() -> None:
    rep = harness.Report("T", None, lead=("numpy", "absent"))
    rep.set("a", "cpu", 1.0)
    rep.set("b", "numpy", 2.0)
    assert rep.columns() == ["numpy", "cpu"]
    assert rep.to_json().startswith("{")


def test_fmt_and_helpers() -> None:
    assert harness.fmt(None) == "–"
    assert harness.fmt(0.12345, 2) == "0.12"
    assert harness.fmt(True) == "true"
    assert harness.fmt(float("nan")) == "nan"
    assert harness.max_rel_err([1.0, 2.0], [1.0, 4.0]) == pytest.approx(0.5)
    assert harness.backend_list(None, ["wgpu", "cpu"]) == ["wgpu", "cpu"]
    assert harness.backend_list("cpu", ["wgpu", "cpu"]) == ["cpu"]
    with pytest.raises(SystemExit):
        harness.backend_list("metal", ["cpu"])
