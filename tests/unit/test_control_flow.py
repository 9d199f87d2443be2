"""If and Loop (ops/control.py): planned on the host, compared with ONNX Runtime on every backend. An If whose
condition is a graph input or shape arithmetic plans the branch it takes (a graph input makes the plan keyed by
its value); a Loop whose trip count and condition are known while planning is unrolled. Conditions computed on
the device are decided at run time (test_control_runtime.py); subgraphs are checked at load like the main graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")
OPSET = 17


def vi(name: str, dtype: int = TensorProto.FLOAT, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits or []),
                             opset_imports=[helper.make_opsetid("", OPSET)])


def compare(m: onnx.ModelProto, backend: str, feeds: list[dict]) -> ember.Model:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    em = ember.load_onnx(m, backend=backend)
    for f in feeds:
        want = sess.run(None, f)
        got = em.run(f)
        for o, w in zip(em.outputs, want, strict=True):
            np.testing.assert_allclose(got[o.name], w, rtol=1e-5, atol=1e-5, err_msg=f"{o.name} {list(f)}")
    return em


def branch(name: str, nodes: list, outputs: list[str], inits: list | None = None) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [vi(o) for o in outputs], inits or [])


def test_if_on_a_graph_input_plans_the_branch_taken(backend_name: str) -> None:
    then = branch("then", [helper.make_node("Relu", ["h"], ["t"])], ["t"])
    other = branch("else", [helper.make_node("Mul", ["h", "two"], ["e"])], ["e"],
                   [numpy_helper.from_array(np.float32(2), "two")])
    m = model([helper.make_node("Neg", ["x"], ["h"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
              [vi("c", TensorProto.BOOL, []), vi("x", shape=["N", 3])], [vi("y")])
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    em = compare(m, backend_name, [{"c": np.array(True), "x": x}, {"c": np.array(False), "x": x},
                                   {"c": np.array(True), "x": x[:2]}])
    assert em.cache_info()["builds"] == 3  # one plan per condition value and shape


def test_if_on_shape_arithmetic_and_nested(backend_name: str) -> None:
    """cond = batch > 2, folded while planning; the then branch holds another If reading values of both
    enclosing graphs."""
    inner_then = branch("inner_then", [helper.make_node("Add", ["a", "b"], ["it"])], ["it"])
    inner_else = branch("inner_else", [helper.make_node("Sub", ["a", "b"], ["ie"])], ["ie"])
    then = branch("then", [helper.make_node("Sigmoid", ["x"], ["b"]),
                           helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                           helper.make_node("Greater", ["s", "zero"], ["pos"]),
                           helper.make_node("If", ["pos_c"], ["t"], then_branch=inner_then, else_branch=inner_else),
                           ], ["t"], [numpy_helper.from_array(np.float32(0), "zero")])
    # pos is computed on the device, so the inner If reads a host condition instead: the rank test below.
    then.node[3].input[0] = "rank_ok"
    other = branch("else", [helper.make_node("Neg", ["a"], ["e"])], ["e"])
    nodes = [helper.make_node("Exp", ["x"], ["a"]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i0"], ["batch"], axis=0),
             helper.make_node("Greater", ["batch", "two"], ["big"]),
             helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Equal", ["rank", "two"], ["rank_ok"]),
             helper.make_node("If", ["big"], ["y"], then_branch=then, else_branch=other)]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i0"), numpy_helper.from_array(np.array(2, np.int64),
                                                                                          "two")]
    m = model(nodes, [vi("x", shape=["N", 3])], [vi("y")], inits)
    rng = np.random.default_rng(1)
    compare(m, backend_name, [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 4, 2, 5)])


def test_outer_value_read_only_inside_a_branch_keeps_its_buffer(backend_name: str) -> None:
    """`a` is read only by the If's branch, after a chain of nodes that would reuse a freed buffer."""
    then = branch("then", [helper.make_node("Add", ["a", "z"], ["t"])], ["t"])
    other = branch("else", [helper.make_node("Sub", ["a", "z"], ["e"])], ["e"])
    nodes = [helper.make_node("Relu", ["x"], ["a"])]
    prev = "x"
    for i in range(6):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"]))
        prev = f"m{i}"
    nodes += [helper.make_node("Tanh", [prev], ["z"]),
              helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32) * 0.3, "w")
    m = model(nodes, [vi("c", TensorProto.BOOL, []), vi("x", shape=[4, 8])], [vi("y")], [w])
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    compare(m, backend_name, [{"c": np.array(True), "x": x}, {"c": np.array(False), "x": x}])


def loop_model(device_cond: bool = False) -> onnx.ModelProto:
    """for i in range(x.shape[0]): acc = acc + x[i]; scan out acc * 2 — with the condition passed through, or
    (device_cond) computed from the data."""
    body_nodes = [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
                  helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
                  helper.make_node("Mul", ["acc_out", "two"], ["scan"])]
    if device_cond:
        body_nodes += [helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                       helper.make_node("Less", ["total", "big"], ["cond_out"])]
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(body_nodes, "body",
                             [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in")],
                             [vi("cond_out", TensorProto.BOOL, []), vi("acc_out"), vi("scan")],
                             [numpy_helper.from_array(np.float32(2), "two"),
                              numpy_helper.from_array(np.float32(1e9), "big")])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
             helper.make_node("Loop", ["n", "true", "acc0"], ["acc", "scans"], body=body, name="loop")]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i0"), numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.zeros(3, np.float32), "acc0")]
    return model(nodes, [vi("x", shape=["N", 3])], [vi("acc"), vi("scans")], inits)


def test_loop_with_a_trip_count_from_the_shape_is_unrolled(backend_name: str) -> None:
    rng = np.random.default_rng(4)
    compare(loop_model(), backend_name, [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 5, 3)])


def test_loop_whose_condition_is_computed_on_the_device_runs_at_run_time(backend_name: str) -> None:
    """The body's condition comes from the data: the Loop runs its body's plan per iteration (see
    test_control_runtime.py), instead of being refused."""
    rng = np.random.default_rng(7)
    em = compare(loop_model(device_cond=True), backend_name,
                 [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 4)])
    assert em.plan_info({"x": np.ones((4, 3), np.float32)})["control_flow"]["loop_runtime"] == 1


def test_an_unsupported_op_inside_a_branch_fails_at_load() -> None:
    then = branch("then", [helper.make_node("Bernoulli", ["x"], ["t"], name="coin")], ["t"])
    other = branch("else", [helper.make_node("Neg", ["x"], ["e"])], ["e"])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("c", TensorProto.BOOL, []), vi("x", shape=[2])], [vi("y")])
    with pytest.raises(NotImplementedError, match=r"Bernoulli .*node .coin."):
        ember.load_onnx(m, backend="cpu")


def test_a_branch_reading_a_value_nothing_defines_fails_at_load() -> None:
    then = branch("then", [helper.make_node("Add", ["x", "nowhere"], ["t"], name="add")], ["t"])
    other = branch("else", [helper.make_node("Neg", ["x"], ["e"])], ["e"])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
              [vi("c", TensorProto.BOOL, []), vi("x", shape=[2])], [vi("y")])
    with pytest.raises(ValueError, match=r"node 'add'\) \(in then_branch of If .*node 'if'\)\): input\(s\) "
                                         r"\['nowhere'\] is no graph input"):
        ember.load_onnx(m, backend="cpu")


def scripted_export(path: str) -> None:
    """torch.jit.script keeps Python control flow as ONNX If and Loop (the TorchScript exporter)."""
    torch = pytest.importorskip("torch")

    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if x.shape[0] > 2:
                y = torch.relu(x)
            else:
                y = -x
            acc = torch.zeros_like(x[0])
            for i in range(x.shape[0]):
                acc = acc + x[i] * 2
            return y, acc

    torch.onnx.export(torch.jit.script(Branchy()), (torch.randn(3, 4),), path, input_names=["x"],
                      output_names=["y", "acc"], dynamic_axes={"x": {0: "N"}}, opset_version=OPSET, dynamo=False)


def test_torch_jit_script_export_with_if_and_loop(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("scripted") / "branchy.onnx"
    scripted_export(str(path))
    m = onnx.load(str(path))
    assert {"If", "Loop"} <= {n.op_type for n in m.graph.node}
    rng = np.random.default_rng(5)
    compare(m, backend_name, [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (1, 2, 3, 6)])


def test_scan_running_sum_both_directions(backend_name: str) -> None:
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [vi("s_in", shape=[2]), vi("x_t", shape=[2])], [vi("s_out", shape=[2]),
                                                                             vi("y_t", shape=[2])])
    m = model([helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1,
                                scan_input_directions=[1], scan_output_axes=[1])],
              [vi("s0", shape=[2]), vi("x", shape=["T", 2])], [vi("s"), vi("y")])
    rng = np.random.default_rng(6)
    compare(m, backend_name, [{"s0": rng.standard_normal(2).astype(np.float32),
                               "x": rng.standard_normal((t, 2)).astype(np.float32)} for t in (1, 4)])
