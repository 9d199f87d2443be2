"""A model's plans for shapes that change: traced builds, grouped into families that templates are fitted to.

A family is the input shapes a model sees with the same ranks (and the same values of inputs used as shape
arithmetic). Each new shape of a family is first looked up in its verified templates (template.py): on a
template's line, the plan is the template realized at that point, with no graph walk. Otherwise the shape is
traced and realized (a build), and the tape is paired with the family's recent tapes: two whose shapes differ
make a candidate template, and a later trace on a candidate's line verifies it; that shape is then served by the
template's live plan (live.py), so no plan is built for it. A KV-cache decode (past length P, mask length P + 1)
therefore builds two plans, traces a third length and serves every length from the third on from a template.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import settings
from ..backends.base import ComputeBackend
from ..ir import Graph
from .fit import MAX_DEGREE, Template
from .folding import FoldCache
from .live import Full, LivePlan
from .planner import Plan
from .tape import Refused, Tape
from .template import Mismatch, own_point, realize, trace
from .weights import WeightPool

Shapes = dict[str, tuple[int, ...]]

RECENT_TAPES = 3  # per family: the tapes new builds are paired with
CANDIDATES = 4  # per family: candidate templates waiting for a build on their line


class _Family:
    def __init__(self) -> None:
        self.tapes: list[tuple[Tape, Shapes]] = []
        self.candidates: list[Template] = []
        self.templates: list[Template] = []


class Families:
    """The traced plans of one model (see the module docstring). `refused` says why tracing is off for this
    model, once a build could not be traced (it then builds as before)."""

    def __init__(self, graph: Graph, backend: ComputeBackend, pool: WeightPool, folds: FoldCache | None,
                 casts: dict | None, fuse: bool, precision: str) -> None:
        self.graph, self.backend, self.pool, self.folds, self.casts = graph, backend, pool, folds, casts
        self.fuse, self.precision = fuse, precision
        self._families: dict[tuple, _Family] = {}
        self.refused: str | None = None
        self.realized = 0  # shapes served by a template's plan
        self.traces = 0  # graph walks: the builds, and the traces that verified a template (served by its plan)
        # Per verified template its live plan (live.py), or why it has none (its shapes are realized one by one).
        self._live: dict[int, LivePlan] = {}
        self._no_live: dict[int, str] = {}
        self.live_bytes = 0  # device bytes the live plans hold

    def make(self, shapes: Shapes, host: dict[str, np.ndarray], build: Callable[[], Plan]) -> tuple[Plan, bool]:
        """(the plan for these shapes, whether it was built); `build` plans the graph the usual way, for
        models whose builds cannot be traced."""
        if self.refused is not None:
            return build(), True
        family = self._families.setdefault(self._key(shapes, host), _Family())
        for template in family.templates:
            v = template.predict(shapes)
            if v is None:
                continue
            try:
                plan = realize(template.tape, template.point(v, self.pool), self.backend, self.pool)
            except Mismatch:
                continue
            self.realized += 1
            plan.stats["plan.source"] = "template"
            if settings.TEMPLATE_CHECK.get():
                self._check(template, shapes, host, plan)
            return plan, False
        try:
            tape = self._trace(shapes, host)
        except Refused as e:
            self.refused = str(e)
            return build(), True
        self.traces += 1
        verified = self._learn(family, tape, shapes, host)
        if verified is not None:  # this trace verified a template: its live plan serves the shapes, none is built
            v = verified.predict(shapes)
            plan = self._live_plan(verified, v, shapes, host) if v is not None else None
            if plan is not None:
                self.pool.release(tape.shared)
                return plan, False
        try:
            plan = realize(tape, own_point(tape), self.backend, self.pool)
        finally:
            self.pool.release(tape.shared)
        plan.stats["plan.source"] = "traced"
        return plan, True

    def live(self, shapes: Shapes, host: dict[str, np.ndarray]) -> Plan | None:
        """The live plan of a verified template these shapes are on, moved to them; None if there is none."""
        if self.refused is not None:
            return None
        family = self._families.get(self._key(shapes, host))
        if family is None:
            return None
        for template in family.templates:
            v = template.predict(shapes)
            if v is not None:
                plan = self._live_plan(template, v, shapes, host)
                if plan is not None:
                    return plan
        return None

    def _live_plan(self, template: Template, v: int, shapes: Shapes, host: dict[str, np.ndarray]) -> Plan | None:
        if id(template) in self._no_live:
            return None
        plan = self._live.get(id(template))
        if plan is not None and plan.v == v:
            return plan
        try:
            like = None
            if plan is not None:
                try:
                    plan.move(v)
                except Full:
                    self._drop(template)  # its buffers go first; its fits serve the larger plan
                    like, plan = plan, None
            if plan is None:
                plan = LivePlan(template, v, self.backend, self.pool, like)
                self._live[id(template)] = plan
                self.live_bytes += plan.device_bytes
        except Refused as e:  # the template's plans differ in more than numbers: realized value by value
            self._no_live[id(template)] = str(e)
            return None
        except Mismatch:  # not at this value (the plan, if any, is where it was)
            if plan is not None and not plan.alive:
                self._drop(template)
            return None
        except BaseException:
            self._drop(template)
            raise
        self.realized += 1
        if settings.TEMPLATE_CHECK.get():
            self._check(template, shapes, host, plan)
        return plan

    def _drop(self, template: Template) -> None:
        plan = self._live.pop(id(template), None)
        if plan is not None:
            self.live_bytes -= plan.device_bytes
            plan.free()

    def free(self) -> None:
        """Free the live plans (the templates stay: the next shape on one makes its plan again)."""
        for plan in self._live.values():
            plan.free()
        self._live.clear()
        self.live_bytes = 0

    @property
    def live_plans(self) -> int:
        return len(self._live)

    def holds(self, plan: Plan) -> bool:
        """Whether `plan` is one of the live plans (held here, outside the model's cache)."""
        return any(p is plan for p in self._live.values())

    @staticmethod
    def _key(shapes: Shapes, host: dict[str, np.ndarray]) -> tuple:
        return (tuple(len(s) for s in shapes.values()), tuple((n, np.asarray(v).tobytes()) for n, v in host.items()))

    def _trace(self, shapes: Shapes, host: dict[str, np.ndarray]) -> Tape:
        return trace(self.graph, self.backend, shapes, host, fuse=self.fuse, precision=self.precision, pool=self.pool,
                     folds=self.folds, casts=self.casts)

    def _learn(self, family: _Family, tape: Tape, shapes: Shapes, host: dict[str, np.ndarray]) -> Template | None:
        """Pair the tape with the family's candidates and recent tapes; the candidate it verified, if any."""
        for candidate in list(family.candidates):
            if candidate.predict(shapes) is None:
                continue
            family.candidates.remove(candidate)
            if candidate.verify(tape, shapes, self.pool):
                family.templates.append(candidate)
                family.tapes.clear()
                family.candidates.clear()
                return candidate
            if candidate.degree < MAX_DEGREE:  # not a line: perhaps a parabola (sizes in v²), verified by the next
                self._candidate(family, host, [*candidate.sources, (tape, shapes)])
        for old in family.tapes:
            self._candidate(family, host, [old, (tape, shapes)])
        del family.candidates[:-CANDIDATES]
        family.tapes.append((tape, shapes))
        del family.tapes[:-RECENT_TAPES]
        return None

    def _candidate(self, family: _Family, host: dict[str, np.ndarray], sources: list[tuple[Tape, Shapes]]) -> None:
        try:
            family.candidates.append(Template(self.graph, self.folds, host, sources))
        except Refused:
            pass

    def _check(self, template: Template, shapes: Shapes, host: dict[str, np.ndarray], plan: Plan) -> None:
        tape = self._trace(shapes, host)
        self.pool.release(tape.shared)
        if not template.verify(tape, shapes, self.pool):
            if isinstance(plan, LivePlan):
                self._drop(template)
            plan.free()
            raise RuntimeError(f"EMBER_TEMPLATE_CHECK: the plan the template made for shapes {shapes} differs from "
                               "a traced build of them")
