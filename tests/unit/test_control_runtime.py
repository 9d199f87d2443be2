"""If and Loop decided at run time (plan/control_runtime.py): a condition, trip count or body condition computed
on the device from data. The run reads the condition back and runs the branch's or body's own plan, built once
per input-shape signature (not per iteration); results compared with ONNX Runtime on every backend. Also the
iteration limit of a Loop without a finite trip count, and the control-flow checks load_onnx makes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")
OPSET = 17
F = TensorProto.FLOAT


def vi(name: str, dtype: int = F, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name: str, value: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits or []),
                             opset_imports=[helper.make_opsetid("", OPSET)])


def compare(m: onnx.ModelProto, backend: str, feeds: list[dict], em: ember.Model | None = None) -> ember.Model:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    em = em or ember.load_onnx(m, backend=backend)
    for f in feeds:
        want = sess.run(None, f)
        got = em.run(f)
        for o, w in zip(em.outputs, want, strict=True):
            assert got[o.name].shape == w.shape, (o.name, got[o.name].shape, w.shape)
            np.testing.assert_allclose(got[o.name], w, rtol=1e-5, atol=1e-5, err_msg=f"{o.name} {list(f)}")
    return em


def if_model() -> onnx.ModelProto:
    """y = (sum(x) > 0) ? relu(h) * w : reducemean(h - x, axis 1) broadcast; h = -x computed before the If, w a
    weight of the main graph; the branches differ in their nodes and read both."""
    then = helper.make_graph([helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t"])],
                             "then", [], [vi("t", shape=["N", 3])])
    other = helper.make_graph([helper.make_node("Sub", ["h", "x"], ["d"]),
                               helper.make_node("ReduceMean", ["d"], ["mean"], axes=[1], keepdims=1),
                               helper.make_node("Expand", ["mean", "shape"], ["e"])],
                              "else", [], [vi("e", shape=["N", 3])])
    nodes = [helper.make_node("Neg", ["x"], ["h"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="if"),
             helper.make_node("Add", ["y", "one"], ["z"])]
    inits = [const("w", [1.0, 2.0, 3.0]), const("zero", 0.0), const("one", 1.0)]
    return model(nodes, [vi("x", shape=["N", 3])], [vi("z")], inits)


def test_if_on_a_device_condition_runs_the_branch_chosen(backend_name: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    pos, neg = np.abs(x), -np.abs(x)
    em = compare(if_model(), backend_name, [{"x": pos}, {"x": neg}, {"x": pos[:2]}])
    builds = em.cache_info()["builds"]
    compare(if_model(), backend_name, [{"x": neg * 2}, {"x": pos * 3}], em)  # both branches planned already
    assert em.cache_info()["builds"] == builds
    info = em.plan_info({"x": pos})
    assert info["control_flow"] == {"if_runtime": 1, "loop_runtime": 0, "loop_iterations": 0, "readbacks": 1}
    assert "if" in info["host_nodes"]


def while_model(nested_if: bool = False) -> onnx.ModelProto:
    """acc = acc0; while sum(acc) < limit: acc = acc + x (or, nested_if, acc * 1.5 where sum(acc) > 3); scan out
    acc * 2. No trip count: the body computes the condition on the device."""
    step = [helper.make_node("Add", ["acc_in", "x"], ["acc_out"])]
    if nested_if:
        grow = helper.make_graph([helper.make_node("Mul", ["acc_in", "scale"], ["g"])], "grow", [],
                                 [vi("g", shape=[3])])
        add = helper.make_graph([helper.make_node("Add", ["acc_in", "x"], ["a"])], "add", [], [vi("a", shape=[3])])
        step = [helper.make_node("ReduceSum", ["acc_in"], ["s_in"], keepdims=0),
                helper.make_node("Greater", ["s_in", "three"], ["big"]),
                helper.make_node("If", ["big"], ["acc_out"], then_branch=grow, else_branch=add, name="inner_if")]
    body = helper.make_graph(
        [*step, helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Mul", ["acc_out", "two"], ["scan"])], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", shape=[3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", shape=[3]), vi("scan", shape=[3])],
        [const("two", 2.0)])
    nodes = [helper.make_node("Loop", ["", "go", "acc0"], ["acc", "scans"], body=body, name="loop")]
    inits = [const("go", True, np.bool_), const("three", 3.0), const("scale", 1.5)]
    return model(nodes, [vi("x", shape=[3]), vi("acc0", shape=[3]), vi("limit", shape=[])],
                 [vi("acc"), vi("scans")], inits)


def while_feeds(limit: float) -> dict[str, np.ndarray]:
    return {"x": np.array([0.5, 1.0, 0.25], np.float32), "acc0": np.array([0.0, 0.1, 0.2], np.float32),
            "limit": np.array(limit, np.float32)}


@pytest.mark.parametrize("nested_if", [False, True], ids=["plain", "nested_if"])
def test_while_loop_with_a_device_condition(backend_name: str, nested_if: bool) -> None:
    m = while_model(nested_if)
    em = compare(m, backend_name, [while_feeds(4.0)])
    few = em.plan_info(while_feeds(4.0))["control_flow"]
    builds = em.cache_info()["builds"]
    em = compare(m, backend_name, [while_feeds(60.0)], em)
    many = em.plan_info(while_feeds(60.0))["control_flow"]
    assert many["loop_iterations"] > few["loop_iterations"] + 5
    # The body (and its If's branches) planned once for these shapes, however many iterations run.
    assert em.cache_info()["builds"] == builds
    # One readback per iteration: the body's condition (and, nested_if, the inner If's).
    assert many["loop_runtime"] == 1 and many["readbacks"] == many["loop_iterations"] * (2 if nested_if else 1)
    assert many["if_runtime"] == (many["loop_iterations"] if nested_if else 0)


def test_loop_whose_trip_count_comes_from_the_data(backend_name: str) -> None:
    """M = int(sum(counts)) from a float input; the body gathers row i of x and accumulates it (a carried value
    and a scan output), reading an outer value."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mod", ["i", "rows"], ["r"]),
         helper.make_node("Gather", ["x", "r"], ["row"], axis=0),
         helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Mul", ["row", "bias"], ["scan"])], "body",
        [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", shape=[3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", shape=[3]), vi("scan", shape=[3])])
    nodes = [helper.make_node("ReduceSum", ["counts"], ["n_f"], keepdims=0),
             helper.make_node("Cast", ["n_f"], ["n"], to=TensorProto.INT64),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
             helper.make_node("ReduceMean", ["x"], ["bias"], axes=[0], keepdims=0),
             helper.make_node("Loop", ["n", "", "acc0"], ["acc", "scans"], body=body, name="loop")]
    m = model(nodes, [vi("x", shape=["N", 3]), vi("counts", shape=[2])], [vi("acc"), vi("scans")],
              [const("zero", 0, np.int64), const("acc0", np.zeros(3))])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    em = compare(m, backend_name, [{"x": x, "counts": np.array(c, np.float32)} for c in ([2, 3], [1, 0], [6, 1])])
    builds = em.cache_info()["builds"]
    compare(m, backend_name, [{"x": x, "counts": np.array([9, 4], np.float32)}], em)
    assert em.cache_info()["builds"] == builds
    assert em.plan_info({"x": x, "counts": np.array([0, 0], np.float32)})["control_flow"]["loop_iterations"] == 13
    compare(m, backend_name, [{"x": x, "counts": np.array([0, 0], np.float32)}], em)  # no iteration at all
    info = em.plan_info({"x": x, "counts": np.array([0, 0], np.float32)})["control_flow"]  # the last run's
    assert info["loop_iterations"] == 0 and info["readbacks"] == 1  # the trip count, once


def test_loop_past_the_iteration_limit_names_the_node(backend_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_LOOP_MAX_ITERATIONS", "7")
    em = ember.load_onnx(while_model(), backend=backend_name)
    assert em.run(while_feeds(4.0))["scans"].shape[0] < 7  # under the limit: runs
    with pytest.raises(RuntimeError, match=r"Loop .*node 'loop'\): still running after 7 iterations"):
        em.run(while_feeds(float("inf")))  # the condition never turns false


def scripted(path: str) -> None:
    """torch.jit.script keeps a `while` on a tensor condition and an `if` on data as Loop and If."""
    torch = pytest.importorskip("torch")

    class Dynamic(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x
            while bool(y.sum() < 20.0):
                y = y * 2.0 + 1.0
            if bool(y.mean() > 3.0):
                out = y - 1.0
            else:
                out = -y
            return out

    torch.onnx.export(torch.jit.script(Dynamic()), (torch.rand(2, 3),), path, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "N"}}, opset_version=OPSET, dynamo=False)


def test_torch_jit_script_data_dependent_while_and_if(backend_name: str,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("scripted") / "dynamic.onnx"
    scripted(str(path))
    m = onnx.load(str(path))
    assert {"If", "Loop"} <= {n.op_type for n in m.graph.node}
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.uniform(0, s, (n, 3)).astype(np.float32)} for n, s in ((1, 0.1), (2, 1.0), (4, 8.0))]
    em = compare(m, backend_name, feeds)
    info = em.plan_info(feeds[0])["control_flow"]
    assert info["loop_runtime"] == 1 and info["if_runtime"] == 1


# ---- checks at load ---------------------------------------------------------------------------------------------

def branch(name: str, nodes: list, outputs: list[onnx.ValueInfoProto]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], outputs)


def test_if_branches_with_different_output_counts_fail_at_load() -> None:
    """ONNX's shape inference at import finds this one."""
    then = branch("two_out", [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["x"], ["b"])],
                  [vi("a"), vi("b")])
    other = branch("one_out", [helper.make_node("Relu", ["x"], ["c"])], [vi("c")])
    m = model([helper.make_node("If", ["c0"], ["y"], then_branch=then, else_branch=other, name="if")],
              [vi("c0", TensorProto.BOOL, []), vi("x", shape=[2])], [vi("y")])
    with pytest.raises(ValueError, match=r"If \(node 'if'\): .*then_branch and else_branch produce different number "
                                         r"of outputs. 2 != 1"):
        ember.load_onnx(m, backend="cpu")


def test_if_branches_with_different_ranks_fail_at_load() -> None:
    then = branch("flat", [helper.make_node("Neg", ["x"], ["a"])], [vi("a", shape=[2])])
    other = branch("square", [helper.make_node("Unsqueeze", ["x", "ax"], ["b"])], [vi("b", shape=[1, 2])])
    m = model([helper.make_node("If", ["c0"], ["y"], then_branch=then, else_branch=other, name="if")],
              [vi("c0", TensorProto.BOOL, []), vi("x", shape=[2])], [vi("y")], [const("ax", [0], np.int64)])
    with pytest.raises(ValueError, match=r"node 'if'\): output 0 has rank 1 in the then_branch 'flat' \('a'\) and "
                                         r"rank 2 in the else_branch 'square' \('b'\)"):
        ember.load_onnx(m, backend="cpu")


def test_a_loop_with_a_non_scalar_trip_count_fails_at_load() -> None:
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Neg", ["v_in"], ["v_out"])], "body",
                             [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in")],
                             [vi("cond_out", TensorProto.BOOL, []), vi("v_out")])
    m = model([helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="loop")],
              [vi("m", TensorProto.INT64, [2]), vi("x", shape=[2])], [vi("y")])
    with pytest.raises(ValueError, match=r"Loop .*node 'loop'\): the trip count M 'm' must be a scalar, got shape "
                                         r"\[2\]"):
        ember.load_onnx(m, backend="cpu")


def test_a_nested_subgraph_problem_names_both_subgraphs() -> None:
    """A rank mismatch inside a Loop's body: the error names the inner If and the body holding it."""
    then = branch("flat", [helper.make_node("Neg", ["v_in"], ["a"])], [vi("a", shape=[2])])
    other = branch("square", [helper.make_node("Unsqueeze", ["v_in", "ax"], ["b"])], [vi("b", shape=[1, 2])])
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("If", ["cond_in"], ["v_out"], then_branch=then, else_branch=other,
                                               name="inner")], "the_body",
                             [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in")],
                             [vi("cond_out", TensorProto.BOOL, []), vi("v_out")])
    m = model([helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="loop")],
              [vi("m", TensorProto.INT64, []), vi("x", shape=[2])], [vi("y")], [const("ax", [0], np.int64)])
    with pytest.raises(ValueError, match=r"node 'inner'\) \(in body 'the_body' of Loop .*node 'loop'\)\): output 0 "
                                         r"has rank 1"):
        ember.load_onnx(m, backend="cpu")
