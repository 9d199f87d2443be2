"""The release wheel installs and runs in a fresh virtual environment, away from the repository's sources.

scripts/build-wheel.sh builds the sdist and the manylinux wheel into tmp_path; the wheel goes with onnxruntime
into a new venv (no ember source on any path: every command runs from tmp_path without PYTHONPATH), whose
`ember` then prints its version and checks a tiny model on the cpu backend against ONNX Runtime, and whose
installed package holds py.typed, the WGSL kernels and a loadable C extension. Needs the package index (the
venv's dependencies); ~1.5-2 minutes on a 2-core machine, most of it pip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _env() -> dict[str, str]:
    """This environment without anything that points Python at the repository or at .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str | Path], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def wheel(work: Path) -> Path:
    dist = work / "dist"
    _run(["bash", REPO / "scripts" / "build-wheel.sh", dist], cwd=REPO)
    wheels = list(dist.glob("ember-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}: {wheels}"
    assert (dist / f"ember-{VERSION}.tar.gz").exists()
    return wheels[0]


@pytest.fixture(scope="module")
def venv(work: Path, wheel: Path) -> Path:
    env_dir = work / "venv"
    _run([sys.executable, "-m", "venv", env_dir], cwd=work)
    _run([env_dir / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
          wheel, "onnxruntime>=1.18"], cwd=work)  # fmt: skip
    return env_dir


@pytest.fixture(scope="module")
def tiny_model(work: Path) -> Path:
    """y = Relu(x @ w + b): float32 x[2, 4], constant w[4, 3] and b[3]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[w, b],
    )  # fmt: skip
    # IR 10: the oldest onnxruntime ember allows (1.18) reads no newer.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    path = work / "tiny.onnx"
    onnx.save(model, str(path))
    return path


def test_wheel_is_manylinux(wheel: Path) -> None:
    assert wheel.name.startswith(f"ember-{VERSION}-cp")
    assert "manylinux" in wheel.name and not wheel.name.endswith("-linux_x86_64.whl"), wheel.name


def test_version(venv: Path, work: Path) -> None:
    p = _run([venv / "bin" / "ember", "--version"], cwd=work)
    assert p.stdout.strip() == f"ember {VERSION}"


def test_check_tiny_model_on_cpu(venv: Path, work: Path, tiny_model: Path) -> None:
    p = _run([venv / "bin" / "ember", "check", tiny_model, "--backend", "cpu"], cwd=work)
    assert "cpu" in p.stdout and "ok" in p.stdout, p.stdout


def test_installed_package(venv: Path, work: Path) -> None:
    code = ("import pathlib, ember, ember.backends.cpu._gemm as g; "
            "print(pathlib.Path(ember.__file__).parent); print(g.__file__)")  # fmt: skip
    pkg, ext = _run([venv / "bin" / "python", "-c", code], cwd=work).stdout.split()
    pkg_dir = Path(pkg)
    assert pkg_dir.is_relative_to(venv) and not pkg_dir.is_relative_to(REPO), pkg_dir
    assert Path(ext).is_relative_to(pkg_dir)
    assert (pkg_dir / "py.typed").is_file()
    assert list((pkg_dir / "backends" / "wgpu" / "kernels").glob("*.wgsl"))
