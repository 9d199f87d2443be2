"""Static execution plans: built once per input-shape signature, replayed per run."""

from .planner import Plan, build_plan

__all__ = ["Plan", "build_plan"]
