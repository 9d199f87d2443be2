"""The fuzz tests' summary lines, printed at the end of the session (pytest -q shows them too)."""

from __future__ import annotations

import pytest

SUMMARIES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARIES:
        terminalreporter.section("ember fuzz")
        for line in SUMMARIES:
            terminalreporter.write_line(line)
