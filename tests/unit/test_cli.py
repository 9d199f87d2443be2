"""The command line (ember/cli.py): `--version`, `info`, `check`, `run`, `bench`, `profile`, `backends`, `demo`, exit
codes and errors; the progress display (ember/core/progress.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import cli, cli_util
from ember.core import progress


def vi(name: str, shape: list | None, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def save(tmp_path: Path, name: str, nodes: list, inputs: list, outputs: list, inits: list | None = None,
         extra_opsets: list | None = None) -> str:
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *(extra_opsets or [])])
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture
def mixed_model(tmp_path: Path) -> str:
    """ids: int64 [N, S] indexing a 10-row table; z: float, no declared shape; outputs y (float) and g (bool)."""
    rng = np.random.default_rng(0)
    emb = numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["m"]),
             helper.make_node("Add", ["m", "z"], ["y"]),
             helper.make_node("Greater", ["y", "zero"], ["g"])]
    return save(tmp_path, "mixed.onnx", nodes, [vi("ids", ["N", "S"], TensorProto.INT64), vi("z", None)],
                [vi("y", ["N", "S", 4]), vi("g", ["N", "S", 4], TensorProto.BOOL)], [emb, w, zero])


@pytest.fixture
def conv_model(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return save(tmp_path, "conv.onnx", nodes, [vi("x", ["N", 3, 8, 8])], [vi("y", ["N", 4, 8, 8])], [w])


@pytest.fixture
def unsupported_model(tmp_path: Path) -> str:
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("FancyOp", ["a"], ["y"], domain="com.example", name="fancy1")]
    return save(tmp_path, "unsup.onnx", nodes, [vi("x", [4])], [vi("y", [4])],
                extra_opsets=[helper.make_opsetid("com.example", 1)])


def ort_outputs(path: str, feeds: dict) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def call(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys) -> None:
    code, out, _ = call(capsys, "--version")
    assert code == 0 and out.strip() == f"ember {ember.__version__}"


def test_usage_errors_exit_2(capsys, mixed_model, tmp_path) -> None:
    assert call(capsys, "check")[0] == 2  # argparse: missing MODEL
    assert call(capsys, "check", mixed_model, "--backend", "tpu")[0] == 2
    for argv, words in [
        (["check", str(tmp_path / "nope.onnx")], "no such file"),
        (["check", mixed_model, "--backend", "cpu"], "'z' declares no shape"),
        (["check", mixed_model, "--backend", "cpu", "--shape", "z=4,x"], "whole numbers"),
        (["check", mixed_model, "--backend", "cpu", "--shape", "q=4"], "no input named 'q'"),
        (["check", mixed_model, "--backend", "cpu", "--shape", "z=4", "--shape", "ids=2,3,4"], "rank 2"),
        (["check", mixed_model, "--backend", "cpu", "--shape", "z=4", "--int-range", "5,2"], "LO <= HI"),
        (["run", mixed_model, "--backend", "cpu", "--input", f"z={tmp_path / 'none.npy'}"], "no such file"),
    ]:
        code, _, err = call(capsys, *argv)
        assert code == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ember: error: ") and words in lines[0], (argv, err)


def test_debug_shows_the_traceback(capsys, mixed_model) -> None:
    code, _, err = call(capsys, "check", mixed_model, "--backend", "cpu", "--debug")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("ember: error: ")


def test_info_text(capsys, mixed_model) -> None:
    code, out, _ = call(capsys, "info", mixed_model, "--backend", "cpu")
    assert code == 0
    lines = [line.split() for line in out.splitlines()]
    assert ["ids", "int64", "[N,", "S]"] in lines
    assert ["z", "float32", "?"] in lines  # no declared shape
    assert ["g", "bool", "[N,", "S,", "4]"] in lines
    assert ["Gather", "1"] in lines and ["MatMul", "1"] in lines
    assert "opsets: ai.onnx 17" in out
    assert "initializers: 3 tensors, 113 parameters, 452 B" in out  # 80 + 32 + 1 float32
    assert ["cpu", "ok", "(load"] == lines[-1][:3]


def test_info_json(capsys, mixed_model, unsupported_model) -> None:
    code, out, _ = call(capsys, "info", mixed_model, "--json")
    assert code == 0
    info = json.loads(out)
    assert info["inputs"] == [{"name": "ids", "dtype": "int64", "shape": ["N", "S"]},
                              {"name": "z", "dtype": "float32", "shape": None}]
    assert info["outputs"][1] == {"name": "g", "dtype": "bool", "shape": ["N", "S", 4]}
    assert info["opsets"] == {"ai.onnx": 17}
    assert info["ops"] == {"Add": 1, "Gather": 1, "Greater": 1, "MatMul": 1} and info["nodes"] == 4
    assert info["initializers"] == {"count": 3, "parameters": 113, "bytes": 452}
    assert set(info["backends"]) == set(ember.available_backends())
    assert all(b["ok"] for b in info["backends"].values())
    code, out, _ = call(capsys, "info", unsupported_model, "--json", "--backend", "cpu")
    info = json.loads(out)
    assert code == 0 and info["ops"] == {"Relu": 1, "com.example.FancyOp": 1}
    cpu = info["backends"]["cpu"]
    assert not cpu["ok"] and cpu["exit_code"] == 4 and any("FancyOp" in line for line in cpu["details"])


def test_info_undeclared_dim_and_malformed(capsys, tmp_path) -> None:
    path = save(tmp_path, "m.onnx", [helper.make_node("Relu", ["x"], ["y"])], [vi("x", [None, 3])], [vi("y", None)])
    code, out, _ = call(capsys, "info", path, "--backend", "none")
    assert code == 0 and ["x", "float32", "[?,", "3]"] in [line.split() for line in out.splitlines()]
    assert ["y", "float32", "?"] in [line.split() for line in out.splitlines()]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage that is not a model\xff\xff")
    code, _, err = call(capsys, "info", str(bad))
    assert code == 3 and err.startswith("ember: error: model rejected")


def test_check_ok(capsys, conv_model, backend_name) -> None:
    code, out, err = call(capsys, "check", conv_model, "--backend", backend_name, "--shape", "x=2,3,8,8")
    assert code == 0, err
    assert "inputs: x float32[2, 3, 8, 8]" in out
    row = next(line for line in out.splitlines() if line.startswith(backend_name + " "))
    assert "ok: max abs err" in row and "max rel err" in row


def test_check_int_and_bool(capsys, mixed_model, backend_name) -> None:
    # The int64 ids index a 10-row table: the default 0..9 is valid; a bool output compares without error.
    code, out, err = call(capsys, "check", mixed_model, "--backend", backend_name, "--shape", "z=1,1,4",
                          "--shape", "ids=2,3")
    assert code == 0, err
    assert "ids int64[2, 3]" in out


def test_check_unsupported_exits_4(capsys, unsupported_model) -> None:
    # ONNX Runtime cannot load the model either: ember's own error is the one shown.
    code, out, err = call(capsys, "check", unsupported_model)
    assert code == 4
    assert "FancyOp" in err and "fancy1" in err and "onnxruntime" not in err
    assert all(line.startswith("ember: error: ") for line in err.strip().splitlines())
    assert "Traceback" not in err


def test_check_malformed_exits_3(capsys, tmp_path) -> None:
    path = save(tmp_path, "bad.onnx", [helper.make_node("Relu", ["x", "x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    code, _, err = call(capsys, "check", path, "--backend", "cpu")
    assert code == 3 and "model rejected" in err and "Relu" in err
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x01garbage\xff\xff")
    code, _, err = call(capsys, "run", str(garbage), "--backend", "cpu")
    assert code == 3 and "model rejected" in err


def test_check_mismatch_exits_1(capsys, conv_model, monkeypatch) -> None:
    real_run = ember.Model.run

    def off_by_a_bit(self, feeds, *args, **kwargs):
        return {k: v + np.float32(1e-2) for k, v in real_run(self, feeds, *args, **kwargs).items()}

    monkeypatch.setattr(ember.Model, "run", off_by_a_bit)
    code, out, err = call(capsys, "check", conv_model, "--backend", "cpu")
    assert code == 1
    assert "MISMATCH" in out and "output 'y'" in out
    assert err.startswith("ember: error: cpu: outputs differ")
    # A loose enough tolerance accepts it.
    assert call(capsys, "check", conv_model, "--backend", "cpu", "--atol", "0.1")[0] == 0
    # So does `run` exit 1 on it, and not with --no-compare.
    assert call(capsys, "run", conv_model, "--backend", "cpu", "--repeat", "1")[0] == 1
    assert call(capsys, "run", conv_model, "--backend", "cpu", "--repeat", "1", "--no-compare")[0] == 0


def test_check_bool_mismatch(capsys, mixed_model, monkeypatch) -> None:
    real_run = ember.Model.run

    def flip(self, feeds, *args, **kwargs):
        out = real_run(self, feeds, *args, **kwargs)
        return {**out, "g": ~out["g"]}

    monkeypatch.setattr(ember.Model, "run", flip)
    code, out, _ = call(capsys, "check", mixed_model, "--backend", "cpu", "--shape", "z=4", "--atol", "1")
    assert code == 1 and "output 'g': 4 of 4 values differ" in out


def test_run_inputs_from_files(capsys, mixed_model, tmp_path, backend_name) -> None:
    ids = np.array([[1, 9, 0], [4, 4, 2]], np.int64)
    z = np.random.default_rng(1).standard_normal((2, 1, 4)).astype(np.float32)
    np.save(tmp_path / "ids.npy", ids)
    np.savez(tmp_path / "feeds.npz", ids=ids, z=z)
    out_path = tmp_path / "out.npz"
    want = ort_outputs(mixed_model, {"ids": ids, "z": z})
    for inputs in (["--input", f"ids={tmp_path / 'ids.npy'}", "--input", f"z={tmp_path / 'feeds.npz'}"],
                   ["--input", str(tmp_path / "feeds.npz")]):
        code, out, err = call(capsys, "run", mixed_model, "--backend", backend_name, "--repeat", "1",
                              "--output", str(out_path), *inputs)
        assert code == 0, err
        assert "inputs: ids int64[2, 3], z float32[2, 1, 4]" in out
        with np.load(out_path) as got:
            assert sorted(got.files) == ["g", "y"]
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
            assert got["g"].dtype == bool
            np.testing.assert_array_equal(got["g"], want["g"])


def test_run_shape_and_batch(capsys, mixed_model, tmp_path) -> None:
    # --shape fixes z; ids takes --batch for N and S; --int-range keeps the ids valid.
    out_path = tmp_path / "o.npz"
    code, out, err = call(capsys, "run", mixed_model, "--backend", "cpu", "--repeat", "1", "--shape", "z=4",
                          "--batch", "3", "--int-range", "2,5", "--output", str(out_path))
    assert code == 0, err
    assert "ids int64[3, 3], z float32[4]" in out
    with np.load(out_path) as got:
        assert got["y"].shape == (3, 3, 4) and got["g"].dtype == bool


def test_random_feeds() -> None:
    infos = [ember.TensorInfo("ids", ("B", "S"), np.dtype(np.int64)),
             ember.TensorInfo("mask", ("B", "S"), np.dtype(bool)),
             ember.TensorInfo("x", (None, 3), np.dtype(np.float16)),
             ember.TensorInfo("u", (2,), np.dtype(np.uint8))]
    feeds = cli_util.make_feeds(infos, cli_util.FeedOptions(shapes={"ids": (2, 7)}, batch=5, int_range=(-3, 4)))
    assert feeds["ids"].shape == (2, 7) and feeds["mask"].shape == (2, 7)  # S and B bound by ids
    assert feeds["x"].shape == (5, 3) and feeds["x"].dtype == np.float16
    assert feeds["ids"].min() >= -3 and feeds["ids"].max() <= 4
    assert feeds["mask"].dtype == bool
    assert feeds["u"].dtype == np.uint8 and feeds["u"].min() >= 0  # the range clipped to the dtype


def test_run_without_reference(capsys, conv_model, monkeypatch) -> None:
    def broken(self, path: str) -> None:
        self.session, self.error = None, "onnxruntime could not load the model: nope"

    monkeypatch.setattr(cli_util.Reference, "__init__", broken)
    code, out, _ = call(capsys, "run", conv_model, "--backend", "cpu", "--repeat", "1")
    assert code == 0 and "no reference (onnxruntime could not load the model: nope)" in out
    code, _, err = call(capsys, "check", conv_model, "--backend", "cpu")
    assert code == 5 and "cannot check against onnxruntime" in err


def test_runtime_error_exits_5(capsys, conv_model, monkeypatch) -> None:
    def boom(self, feeds, *args, **kwargs):
        raise RuntimeError("device on fire\nsecond line")

    monkeypatch.setattr(ember.Model, "run", boom)
    code, _, err = call(capsys, "check", conv_model, "--backend", "cpu")
    assert code == 5 and "ember: error: cpu: RuntimeError: device on fire; second line" in err


def test_backends_and_demo(capsys, conv_model) -> None:
    code, out, _ = call(capsys, "backends")
    named = list(dict.fromkeys(line.split()[0].split(":")[0] for line in out.splitlines()))
    assert code == 0 and named == ember.available_backends()
    if "wgpu" in named:  # a line per WebGPU runtime installed, and which one `auto` takes
        assert "wgpu (wgpu-native " in out and "wgpu webgpu='auto' takes: " in out
    code, out, _ = call(capsys, "demo", "--model", conv_model, "--repeat", "1")
    assert code == 0 and "onnxruntime (cpu)" in out and "gemm 256x256x256" in out


# ---- ember bench / ember profile / progress ------------------------------------------------------------------


def test_bench_cpu_json(capsys, conv_model, tmp_path) -> None:
    out_json = tmp_path / "bench.json"
    code, out, err = call(capsys, "bench", conv_model, "--backend", "cpu", "--runs", "3", "--warmup", "1",
                          "--batch", "2", "--json", str(out_json))
    assert code == 0, err
    assert err == ""  # stderr is no terminal here: no progress
    assert "inputs: x float32[2, 3, 8, 8]" in out
    assert "median" in out and "p10" in out and "p90" in out and "vs ort" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    assert rows["cpu"][-1] == "ok" and rows["cpu"][-3].endswith("x") and rows["onnxruntime"][-1] == "reference"
    data = json.loads(out_json.read_text())
    assert data["runs"] == 3 and data["warmup"] == 1 and data["exit_code"] == 0
    assert data["inputs"] == {"x": {"dtype": "float32", "shape": [2, 3, 8, 8]}}
    cpu, ort = data["results"]
    assert cpu["engine"] == "cpu" and ort["engine"] == "onnxruntime" and cpu["ok"] and ort["ok"]
    for r in (cpu, ort):
        assert len(r["times_ms"]) == 3 and 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
    assert cpu["vs_ort"] == pytest.approx(cpu["median_ms"] / ort["median_ms"])
    assert cpu["check"] == "ok" and cpu["gpu_ms"] is None


def test_bench_without_ort_and_exit_codes(capsys, conv_model, unsupported_model, tmp_path, monkeypatch) -> None:
    code, out, err = call(capsys, "bench", conv_model, "--backend", "cpu", "--runs", "2", "--no-ort")
    assert code == 0, err
    engines = [line.split()[0] for line in out.splitlines() if line.split()]
    assert "cpu" in engines and "onnxruntime" not in engines
    for argv in (["--runs", "0"], ["--warmup", "-1"], ["--json", str(tmp_path / "no" / "such" / "b.json")]):
        code, _, err = call(capsys, "bench", conv_model, "--backend", "cpu", *argv)
        assert code == 2 and err.startswith("ember: error: "), (argv, err)
    assert call(capsys, "bench", str(tmp_path / "nope.onnx"))[0] == 2
    code, _, err = call(capsys, "bench", unsupported_model, "--backend", "cpu")
    assert code == 4 and "FancyOp" in err
    bad = save(tmp_path, "bad.onnx", [helper.make_node("Relu", ["x", "x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    assert call(capsys, "bench", bad, "--backend", "cpu")[0] == 3
    real_run = ember.Model.run

    def off_by_a_bit(self, feeds, *args, **kwargs):
        return {k: v + np.float32(1e-2) for k, v in real_run(self, feeds, *args, **kwargs).items()}

    monkeypatch.setattr(ember.Model, "run", off_by_a_bit)
    out_json = tmp_path / "m.json"
    code, out, err = call(capsys, "bench", conv_model, "--backend", "cpu", "--runs", "1", "--json", str(out_json))
    assert code == 1 and "mismatch" in out and "outputs differ" in err
    assert json.loads(out_json.read_text())["results"][0]["check"] == "mismatch"


def test_bench_wgpu(capsys, conv_model, tmp_path, wgpu_be) -> None:
    out_json = tmp_path / "bench.json"
    code, out, err = call(capsys, "bench", conv_model, "--backend", "wgpu", "--runs", "2", "--warmup", "0",
                          "--json", str(out_json))
    assert code == 0, err
    assert "wgpu adapter:" in out
    wgpu, ort = json.loads(out_json.read_text())["results"]
    assert wgpu["engine"] == "wgpu" and wgpu["check"] == "ok" and ort["engine"] == "onnxruntime"
    assert wgpu["gpu_ms"] > 0 and len(wgpu["times_ms"]) == 2


def test_profile_cpu_trace_and_html(capsys, conv_model, tmp_path) -> None:
    trace, page = tmp_path / "trace.json", tmp_path / "plot.html"
    code, out, err = call(capsys, "profile", conv_model, "--backend", "cpu", "--top", "5", "--trace", str(trace),
                          "--html", str(page))
    assert code == 0, err
    assert err == ""
    rows = [line.split() for line in out.splitlines()]
    assert ["1", "Conv_0", "(Conv)", "1"] in [r[:4] for r in rows]  # the Relu is fused into the conv: one node
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X"]
    assert steps and all(e["pid"] == steps[0]["pid"] and e["dur"] >= 0 for e in steps)
    assert any("(Conv)" in e["name"] for e in steps)
    for a, b in zip(steps, steps[1:], strict=False):  # end to end
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-2)
    assert steps[0]["ts"] == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "(Conv)" in text
    assert "<script" not in text and "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    import xml.etree.ElementTree as ET

    svg = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    assert ET.fromstring(svg).tag.endswith("svg")  # well-formed


def test_profile_trace_in_graph_order(capsys, mixed_model, tmp_path) -> None:
    trace = tmp_path / "trace.json"
    code, out, err = call(capsys, "profile", mixed_model, "--backend", "cpu", "--shape", "z=4", "--top", "2",
                          "--trace", str(trace))
    assert code == 0, err
    assert len([line for line in out.splitlines() if line.split() and line.split()[0] in ("1", "2", "3")]) == 2
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    ops = [n.split("(")[-1].rstrip(")") for n in names]  # every step, not only the --top ones, in graph order
    assert [op for op in ops if op in ("Gather", "MatMul", "Greater")] == ["Gather", "MatMul", "Greater"]


def test_profile_exit_codes(capsys, conv_model, unsupported_model, tmp_path) -> None:
    assert call(capsys, "profile", conv_model, "--backend", "cpu", "--top", "-1")[0] == 2
    assert call(capsys, "profile", conv_model, "--backend", "cpu", "--html", str(tmp_path))[0] == 2
    code, _, err = call(capsys, "profile", unsupported_model, "--backend", "cpu", "--trace", str(tmp_path / "t.json"))
    assert code == 4 and "FancyOp" in err and not (tmp_path / "t.json").exists()


def test_quiet_silences_progress_even_when_forced_on(capsys, conv_model) -> None:
    with ember.settings.override(progress=True):  # forced on: plain lines on this stderr, no terminal
        code, _, err = call(capsys, "bench", conv_model, "--backend", "cpu", "--runs", "1", "--no-ort")
        assert code == 0 and "ember: loading conv.onnx ..." in err and "ember: timing cpu: done in" in err
        for argv in (["bench", conv_model, "--backend", "cpu", "--runs", "1", "--no-ort", "--quiet"],
                     ["--quiet", "profile", conv_model, "--backend", "cpu"],
                     ["check", conv_model, "--backend", "cpu", "-q"], ["info", conv_model, "--quiet"],
                     ["run", conv_model, "--backend", "cpu", "--repeat", "1", "--quiet"], ["backends", "--quiet"]):
            code, _, err = call(capsys, *argv)
            assert code == 0 and err == "", (argv, err)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_silent_without_a_terminal(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_PROGRESS", raising=False)
    stream = io.StringIO()
    assert not progress.enabled(stream)
    with progress.task("loading something", total=3, stream=stream) as bar:
        bar.advance()
        bar.update("still loading")
    assert stream.getvalue() == ""


def test_progress_off_by_the_setting(monkeypatch) -> None:
    monkeypatch.setenv("EMBER_PROGRESS", "0")
    tty = FakeTTY()
    assert not progress.enabled(tty)
    with progress.task("loading something", stream=tty):
        pass
    assert tty.getvalue() == ""
    monkeypatch.setenv("EMBER_PROGRESS", "1")
    assert progress.enabled(io.StringIO())


def test_progress_on_a_terminal_and_forced_on(monkeypatch) -> None:
    monkeypatch.delenv("EMBER_PROGRESS", raising=False)
    tty = FakeTTY()
    with progress.task("outer task", stream=tty), progress.task("inner task", total=2, stream=tty) as bar:
        bar.advance(2)
    shown = tty.getvalue()
    assert "outer task" in shown and "inner task" in shown
    with ember.settings.override(progress=True):
        stream = io.StringIO()  # no terminal: plain lines
        with pytest.raises(RuntimeError), progress.task("doomed", stream=stream):
            raise RuntimeError("boom")
        with progress.task("fine", stream=stream):
            pass
    lines = stream.getvalue().splitlines()
    assert lines[0] == "ember: doomed ..." and lines[1].startswith("ember: doomed: failed in ")
    assert lines[2] == "ember: fine ..." and lines[3].startswith("ember: fine: done in ")


def test_progress_of_load_plan_and_autotune(capsys, tmp_path, wgpu_be) -> None:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
    path = save(tmp_path, "mm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [256, 256])],
                [vi("y", [256, 256])], [w])
    with ember.settings.override(progress=True, cache_dir=tmp_path / "cache"):
        ember.load_onnx(path, backend="wgpu", autotune=True).close()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "ember: loading mm.onnx ..." and err[1] == "ember: building the plan on wgpu ..."
    assert err[2].startswith("ember: autotune matmul 256x256x256: ") and err[2].endswith(" tile configs ...")
    assert err[-1].startswith("ember: loading mm.onnx: done in ")
    ember.load_onnx(path, backend="cpu").close()  # progress off (the default, no terminal): silent
    assert capsys.readouterr().err == ""
