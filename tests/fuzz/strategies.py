"""Hypothesis strategies for fuzz recipes, and a deterministic way to draw a batch of them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from .mutate import BYTE_OPS, FEED_OPS, MODEL_OPS
from .seeds import SEEDS

_small = st.integers(0, 63)
_model_mut = st.tuples(st.sampled_from(MODEL_OPS), _small, _small, _small).map(list)
_byte_mut = st.tuples(st.sampled_from(BYTE_OPS), st.integers(0, 4095), st.integers(0, 1023)).map(list)
_feed_mut = st.tuples(st.sampled_from(FEED_OPS), _small, _small).map(list)
_seed_model = st.sampled_from(sorted(SEEDS))
_seed = st.integers(0, 2**32 - 1)

# A recipe mutates either the proto or the bytes (a byte flip mostly leaves nothing that parses, which would hide
# the proto mutations it came with); proto recipes three times as often.
_proto_muts = st.lists(_model_mut, min_size=1, max_size=4)
_byte_muts = st.lists(_byte_mut, min_size=1, max_size=3)
MODEL_RECIPES = st.fixed_dictionaries({
    "kind": st.just("model"), "model": _seed_model, "seed": _seed,
    "muts": st.one_of(_proto_muts, _proto_muts, _proto_muts, _byte_muts)})
FEED_RECIPES = st.fixed_dictionaries({
    "kind": st.just("feed"), "model": _seed_model, "seed": _seed,
    "muts": st.lists(_feed_mut, min_size=0, max_size=3)})


def draw(strategy: st.SearchStrategy[dict[str, Any]], n: int, seed: int | None = None) -> list[dict[str, Any]]:
    """n distinct recipes (fewer only if hypothesis runs out), the same on every call: derandomized when seed is
    None, else from that seed. Hypothesis draws a few duplicates, hence the slack in max_examples."""
    out: dict[str, dict[str, Any]] = {}

    @settings(max_examples=n + n // 10 + 10, derandomize=seed is None, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(recipe: dict[str, Any]) -> None:
        out.setdefault(json.dumps(recipe, sort_keys=True), recipe)

    if seed is not None:
        from hypothesis import seed as seed_decorator

        collect = seed_decorator(seed)(collect)
    collect()
    return list(out.values())[:n]
