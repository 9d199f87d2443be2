"""ember.settings: every knob declared once, read when used, scoped by override, listed in the README."""

from __future__ import annotations

import os
import pathlib

import pytest

from ember import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_read_when_used_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_WINOGRAD", "2")
    assert settings.WINOGRAD.get() == 2
    monkeypatch.setenv("EMBER_WINOGRAD", "0")
    assert settings.WINOGRAD.get() == 0
    monkeypatch.delenv("EMBER_WINOGRAD")
    assert settings.WINOGRAD.get() is None


def test_environment_read_matches_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast read of the environment (settings._environ_reader) answers what os.environ.get would, as the
    variable is set, changed and removed, and takes os.environ.get where os.environ was replaced."""
    monkeypatch.delenv("EMBER_ENCODE_AHEAD", raising=False)
    assert settings.ENCODE_AHEAD.get() is True  # the default
    monkeypatch.setenv("EMBER_ENCODE_AHEAD", " off ")
    assert settings.ENCODE_AHEAD.get() is False
    monkeypatch.setenv("EMBER_ENCODE_AHEAD", "1")
    assert settings.ENCODE_AHEAD.get() is True
    monkeypatch.setenv("EMBER_ENCODE_AHEAD", "")
    assert settings.ENCODE_AHEAD.get() is True  # empty: the default
    monkeypatch.setenv("EMBER_ENCODE_AHEAD", "maybe")
    with pytest.raises(ValueError, match="EMBER_ENCODE_AHEAD='maybe'"):
        settings.ENCODE_AHEAD.get()
    monkeypatch.setattr(os, "environ", {"EMBER_ENCODE_AHEAD": "no"})  # a plain dict in its place
    assert settings.ENCODE_AHEAD.get() is False


def test_override_wins_over_the_environment_and_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_DIRECT_CONV", "0")
    assert settings.DIRECT_CONV.get() is False
    with settings.override(direct_conv=True, wait_spin_us=5.0):
        assert settings.DIRECT_CONV.get() is True
        assert settings.WAIT_SPIN_US.get() == 5.0
        with settings.override(direct_conv=False):
            assert settings.DIRECT_CONV.get() is False
        assert settings.DIRECT_CONV.get() is True
    assert settings.DIRECT_CONV.get() is False
    assert settings.WAIT_SPIN_US.get() == 3000.0


def test_override_none_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_AUTOTUNE", "1")
    with settings.override(autotune=None):
        assert settings.AUTOTUNE.get() is None  # decided at run time, as when the variable is unset
    assert settings.AUTOTUNE.get() is True


def test_unknown_setting_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['winogard'\]"), settings.override(winogard=0):
        pass


@pytest.mark.parametrize(("env", "value", "expected"), [
    ("EMBER_CPU_THREADS", "0", "expected a whole number >= 1"),
    ("EMBER_WAIT_SPIN_US", "-1", "expected a number >= 0"),
    ("EMBER_SCRATCH_PRIVATE_MB", "lots", "expected a number"),
    ("EMBER_CHECKED_SHADERS", "maybe", "expected one of"),
    ("EMBER_WINOGRAD", "2.0", "expected a whole number"),
])
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, expected: str) -> None:
    monkeypatch.setenv(env, value)
    setting = next(s for s in settings.REGISTRY.values() if s.env == env)
    with pytest.raises(ValueError, match=rf"{env}={value!r}: {expected}"):
        setting.get()


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    assert settings.table() in readme, "README's settings table is stale: paste `python -m ember.settings`"


def test_override_parses_text_as_the_environment_would() -> None:
    with settings.override(direct_conv="0", attention="gemm"):
        assert settings.DIRECT_CONV.get() is False
        assert settings.ATTENTION.get() == "gemm"
    with pytest.raises(ValueError, match=r"settings.override\(attention='sparse'\): expected one of"), \
            settings.override(attention="sparse"):
        pass
