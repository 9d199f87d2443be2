"""Live plans (ember/plan/live.py): one plan per verified template, moved from shape to shape. A KV-cache decode
takes its every step after the first few from one live plan that regrows a few times; on wgpu a move rewrites
uniform sizes only (no record call, no new pipeline, the prepared replay kept); every step equals ONNX Runtime's,
and EMBER_TEMPLATE_CHECK compares every move's fitted sizes with the record calls'."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.plan.fit import Numbers
from ember.plan.live import LivePlan, capacity
from ember.plan.tape import Refused

from . import decoders
from .decoders import GPT2

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")


def _live(model: ember.Model) -> LivePlan:
    plans = list(model._families._live.values())
    assert len(plans) == 1, plans
    return plans[0]


def test_a_decode_runs_on_one_live_plan_that_regrows(backend_name: str) -> None:
    path = str(decoders.export(GPT2, "torchscript"))
    model = ember.load_onnx(path, backend=backend_name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = GPT2.output_names()
    past_e: dict = GPT2.past(1, 2)
    past_o = dict(past_e)
    token, seen = 5, []
    be = model.compute_backend
    with ember.settings.override(template_check=True):
        for step in range(40):
            feeds = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, step + 3), np.int64)}
            out_e = model.run({**feeds, **past_e}, keep_on_device=True)
            out_o = dict(zip(names, sess.run(names, {**feeds, **past_o}), strict=True))
            got, want = out_e["logits"].numpy(), out_o["logits"]
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), step
            np.testing.assert_allclose(out_e["present_1_v"].numpy(), out_o["present_1_v"], rtol=1e-4, atol=1e-5)
            token = int(want[0, -1].argmax())
            past_e = {f"past{n[len('present'):]}": out_e[n] for n in names[1:]}
            past_o = {f"past{n[len('present'):]}": out_o[n] for n in names[1:]}
            if model._families.live_plans:
                plan = _live(model)
                prepared = None if plan._resident is None else id(plan._resident)
                seen.append((plan.v, plan.capacity, id(plan), prepared, getattr(be, "pipelines_created", 0),
                             id(plan._sizes)))
    info = model.cache_info()
    assert info["builds"] == 2 and info["from_template"] == 38 and info["traces"] == 3, info
    assert info["plans"] == 3 and model._families.live_plans == 1
    # The template's dim is the mask's length (past + 1), 5 ... 42 (5 the trace that verified the template), on
    # plans made at 5, 14 and 29 (each with room for twice its length): three live plans in turn.
    assert [v for v, *_ in seen] == list(range(5, 43))
    made = [v for i, (v, _, p, *_) in enumerate(seen) if i == 0 or p != seen[i - 1][2]]
    assert made == [5, 14, 29] and seen[-1][1] == capacity(29)
    plan = _live(model)
    # Every moving record call keeps its steps: a move writes sizes (wgpu: uniforms; cpu: the steps' arrays, made
    # again from them), records nothing, compiles nothing, and the replay prepared for the first run at a plan
    # serves the next lengths too.
    assert plan._fast and not plan._remake
    last = [s for s in seen if s[2] == id(plan)]
    assert len({s[3] for s in last[1:]}) == 1 and last[-1][3] is not None
    assert len({s[5] for s in seen}) == 1, "a regrown plan refits its sizes instead of taking the old fit"
    if backend_name == "wgpu":
        assert last[-1][4] == seen[0][4], "a decode step compiled a pipeline"


def test_alternating_lengths_move_one_live_plan_and_stay_correct(backend_name: str) -> None:
    path = str(decoders.export(GPT2, "dynamo"))
    model = ember.load_onnx(path, backend=backend_name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for length in (3, 4, 6):  # two fit a template, the third verifies it (and is served by its live plan)
        feeds = {"input_ids": np.array([[1]], np.int64), "attention_mask": np.ones((1, length + 1), np.int64),
                 **GPT2.past(1, length)}
        model.run(feeds)
    for i in range(100):
        length = (9, 14)[i % 2]
        feeds = {"input_ids": np.array([[i % 50]], np.int64), "attention_mask": np.ones((1, length + 1), np.int64),
                 **GPT2.past(1, length, seed=i)}
        np.testing.assert_allclose(model.run(feeds)["logits"], sess.run(["logits"], feeds)[0], rtol=1e-4, atol=1e-5)
    plan = _live(model)
    assert plan.v == 15 and plan.moves >= 99  # the dim is the mask length, past + 1
    assert model.cache_info()["from_template"] == 101


def test_numbers_are_exact_polynomials_or_refused() -> None:
    vs = [10, 11, 12, 13, 40]
    values = lambda v: np.array([3 * v + 1, v * (v + 1) // 2, 768 * (v + 1), 7, v**3 - 2 * v, -v])  # noqa: E731
    numbers = Numbers(vs, np.stack([values(v) for v in vs], axis=1))
    for v in (-5, 0, 2, 11, 100, 5000, 10**6):
        assert np.array_equal(numbers.at(v), values(v)), v
    with pytest.raises(Refused, match="not a polynomial"):
        Numbers(vs, np.array([[v // 3 for v in vs]]))  # agrees at the four fitted points, not at the check
    with pytest.raises(ValueError, match="consecutive"):
        Numbers([1, 3, 4, 9], np.zeros((1, 4)))
