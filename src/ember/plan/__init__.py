"""Static execution plans: built once per input-shape signature, replayed per run.

Public API: `build_plan` and `Plan`; `fold(op, inputs)`, constant folding (an op run on host values);
`host_value_inputs(graph)`, the graph inputs a plan is specialised on the values of; `COUNTERS`, every counter a
plan may count in `Plan.counters` (declared by the ops that count them, and by the planner); `WeightPool`, a
model's constants on its backend, shared by its plans; `FoldCache`, a model's folds of small host values, shared
by its plans; `StagedPlan` and `needs_stages`, for graphs whose shapes depend on data (NonZero), run in stages.
"""

from ..ops import COUNTERS
from .folding import FoldCache, fold
from .planner import Plan, build_plan, host_value_inputs
from .stages import StagedPlan, needs_stages
from .weights import WeightPool

__all__ = ["COUNTERS", "FoldCache", "Plan", "StagedPlan", "WeightPool", "build_plan", "fold", "host_value_inputs",
           "needs_stages"]
