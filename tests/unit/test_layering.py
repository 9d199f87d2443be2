"""The architecture's rules that import-linter cannot see (the import contracts live in pyproject.toml)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "ember"
# What an op may use of its backend: the recording primitives, kernel selection, and the plan's memory calls.
BACKEND_MEMORY = {"alloc", "upload", "nbytes", "storage_itemsize", "max_elements"}  # buffers and their limits


def test_no_environment_read_outside_the_settings_module() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "ember":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"os.environ read outside ember/settings.py: {offenders}"


def test_no_source_file_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "src").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"files over 600 lines: {long}"


def test_ops_never_probe_the_backend() -> None:
    """Ops say what a node means and hand it to the backend (record_*, select_*); they never ask what it can do."""
    probes = []
    for path in sorted((SRC / "ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "backend" and not node.attr.startswith(("record_", "select_")) and \
                    node.attr not in BACKEND_MEMORY:
                probes.append(f"{path.relative_to(ROOT)}:{node.lineno} backend.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("hasattr", "getattr") and node.args and "backend" in ast.unparse(node.args[0]):
                probes.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not probes, f"capability probes in ops: {probes}"
