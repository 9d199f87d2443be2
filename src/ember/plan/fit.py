"""Templates: traced builds of a model fitted in one input dim, so a plan for a new value is a realized tape.

Tapes (tape.py) of the same model that line up call by call (`Tape.signature`) and whose input shapes differ in
dims that move together are fitted number by number as a polynomial in one input dim v through their points
(exact rationals, Newton's form; an array element by element): two tapes give lines (a decode's past length:
sizes a + b·v), three give parabolas (an encoder's sequence length: its attention scores are v² elements). A
constant that differs between them is recomputed by the host program: the folded nodes behind it run again
from the fitted values of the Shape-like nodes that fed them. One more traced build, not used for the fit, must
agree number for number (`verify`) before the template is used. A value at which a size would not be a whole
number is a `Mismatch`, and the caller traces a build instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir import Graph
from ..ops import Tensor
from .folding import FoldCache, fold
from .host_fold import fold_arrays, fold_case, host_fold
from .planner import F16, f16_copy
from .tape import Refused, Tape
from .template import Mismatch, Point, equal_leaves, own_point
from .weights import WeightPool

Shapes = dict[str, tuple[int, ...]]
Var = tuple[str, int]  # (input name, axis): the dim a template is fitted in
MAX_DEGREE = 2


def _newton(vs: list[int], ys: list[Any]) -> list[Any]:
    """Newton's divided differences of the points (exact for ints, via Fraction)."""
    coef = list(ys)
    k = len(vs)
    for j in range(1, k):
        for i in range(k - 1, j - 1, -1):
            coef[i] = (coef[i] - coef[i - 1]) / (vs[i] - vs[i - j])
    return coef


def fit(values: list[Any], vs: list[int]) -> tuple:
    """One number of the tapes at the points `vs`: ("c", value) where it does not move, else a polynomial."""
    x = values[0]
    if any(isinstance(y, np.ndarray) for y in values):
        if not all(isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape for y in values):
            raise Refused("an array argument changes type or shape with the input dims")
        if all(np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for y in values[1:]):
            return ("c", x)
        if x.dtype.kind not in "iu" or x.size > 4096:
            raise Refused("an array argument changes values that are not small integer arrays")
        ys = [np.array([Fraction(int(e)) for e in y.reshape(-1)], dtype=object) for y in values]
        coef = _newton(vs, ys)
        if all(e.denominator == 1 for c in coef for e in c) and x.size <= 16:  # a shape: per element, exactly
            return ("ap", vs, [[int(c[j]) for c in coef] for j in range(x.size)], x.dtype, x.shape)
        if all(e.denominator == 1 for c in coef for e in c):  # whole (shape arithmetic): int64 where it fits
            ints = [np.array([int(e) for e in c], dtype=object) for c in coef]
            scale = max((abs(int(e)) for c in ints for e in c), default=0)
            small = scale < 2**62 and x.dtype == np.int64  # else exact, in Python's integers
            return ("ai", vs, [c.astype(np.int64) if small else c for c in ints], x.dtype, x.shape,
                    scale if small else 2**62)
        return ("a", vs, coef, x.dtype, x.shape)
    if any(type(y) is not type(x) for y in values):
        raise Refused("a number changes type with the input dims")
    if all(y == x or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for y in values[1:]):
        return ("c", x)
    if isinstance(x, float):
        return ("f", vs, _newton(vs, values))
    coef = _newton(vs, [Fraction(y) for y in values])
    if all(c.denominator == 1 for c in coef):
        coef = [int(c) for c in coef]
    return ("i", vs, coef)


def _horner(vs: list[int], coef: list[Any], v: int) -> Any:
    value = coef[-1]
    for i in range(len(coef) - 2, -1, -1):
        value = value * (v - vs[i]) + coef[i]
    return value


def at(f: tuple, v: int) -> Any:
    """A fitted number at v."""
    kind = f[0]
    if kind == "c":
        return f[1]
    if kind == "ap":
        return np.array([_horner(f[1], c, v) for c in f[2]], dtype=f[3]).reshape(f[4])
    if kind == "ai":
        coef = f[2]
        if f[5] * len(coef) * (abs(v) + max(abs(x) for x in f[1]) + 1) ** (len(coef) - 1) < 2**62:
            return _horner(f[1], coef, v).astype(f[3]).reshape(f[4])  # int64 arithmetic cannot overflow here
        value = _horner(f[1], [c.astype(object) for c in coef], v)
        return np.array([int(e) for e in value], dtype=f[3]).reshape(f[4])
    value = _horner(f[1], f[2], v)
    if kind == "f":
        return float(value)
    if kind == "i":
        if isinstance(value, Fraction):
            if value.denominator != 1:
                raise Mismatch(f"a size would be {value} at {v}")
            return int(value)
        return value
    if any(e.denominator != 1 for e in value):
        raise Mismatch(f"an index array would not be whole at {v}")
    return np.array([int(e) for e in value], dtype=f[3]).reshape(f[4])


class _Many:
    """Fitted numbers evaluated together: the moving ones with whole coefficients in one int64 product (exact
    where it cannot overflow), the others one by one."""

    def __init__(self, fits: list[tuple]) -> None:
        self.fits = fits
        self.base = [f[1] if f[0] == "c" else None for f in fits]
        whole = [j for j, f in enumerate(fits) if f[0] == "i" and all(type(c) is int for c in f[2])]
        self.vs = fits[whole[0]][1] if whole else []
        self.whole = [j for j in whole if fits[j][1] == self.vs]
        self.rest = [j for j, f in enumerate(fits) if f[0] != "c" and j not in set(self.whole)]
        width = len(self.vs)
        rows = [list(fits[j][2]) + [0] * (width - len(fits[j][2])) for j in self.whole]
        self.scale = max((abs(c) for r in rows for c in r), default=0)
        self.coef = np.array(rows, dtype=np.int64) if self.scale < 2**62 else None

    def at(self, v: int) -> list[Any]:
        out = list(self.base)
        if self.whole:
            basis = [1]
            for x in self.vs[:-1]:
                basis.append(basis[-1] * (v - x))  # Newton's basis: at()'s Horner form, term by term
            if self.coef is not None and self.scale * sum(abs(b) for b in basis) < 2**62:
                values = (self.coef @ np.array(basis, dtype=np.int64)).tolist()
            else:
                values = [at(self.fits[j], v) for j in self.whole]
            for j, x in zip(self.whole, values, strict=True):
                out[j] = x
        for j in self.rest:
            out[j] = at(self.fits[j], v)
        return out


class _Same(list):
    """An entry's numbers that are the same at every point."""


def _fixed(fits: list[tuple]) -> bool:
    return all(f[0] == "c" for f in fits)


def _fits(columns: list[list[Any]], vs: list[int]) -> list[tuple]:
    return [fit(list(values), vs) for values in zip(*columns, strict=True)]


class Template:
    """Traced builds of one model fitted in one input dim (see the module docstring)."""

    def __init__(self, graph: Graph, folds: FoldCache | None, host_values: dict,
                 sources: list[tuple[Tape, Shapes]]) -> None:
        if not 2 <= len(sources) <= MAX_DEGREE + 1:
            raise Refused(f"a template is fitted to 2 to {MAX_DEGREE + 1} builds")
        tapes = [t for t, _ in sources]
        shapes = [s for _, s in sources]
        first = tapes[0].signature()
        if any(t.signature() != first for t in tapes[1:]):
            raise Refused("the builds differ in more than numbers")
        s0, s1 = shapes[0], shapes[1]
        moved = [(n, ax) for n in s0 for ax, (x, y) in enumerate(zip(s0[n], s1[n], strict=True)) if x != y]
        if not moved:
            raise Refused("the builds have the same shapes")
        if any(min(vals) < 2 for n in s0 for vals in zip(*(s[n] for s in shapes), strict=True) if len(set(vals)) > 1):
            raise Refused("a dim that moves is 0 or 1 in a build (no work, broadcast strides): planned apart")
        self.var: Var = moved[0]
        vs = [s[self.var[0]][self.var[1]] for s in shapes]
        if len(set(vs)) != len(vs):
            raise Refused("two builds share the value of the fitted dim")
        self.vs = vs
        self.sources = sources
        self.graph, self.folds, self.host_values, self.tape = graph, folds, host_values, tapes[0]
        self.dims = {n: _fits([list(s[n]) for s in shapes], vs) for n in s0}
        # predict's checks: the dims that move with v, and per input the axes that do not and their values.
        self._moving_dims = [(n, ax, f) for n, fits in self.dims.items() for ax, f in enumerate(fits) if f[0] != "c"]
        self._fixed_dims = [(n, tuple(ax for ax, f in enumerate(fits) if f[0] == "c"),
                             tuple(f[1] for f in fits if f[0] == "c")) for n, fits in self.dims.items()]
        entries = list(zip(*(t.entries for t in tapes), strict=True))
        leaves = [_fits([e.leaves for e in group], vs) for group in entries]
        results = [_fits([e.result_leaves for e in group], vs) for group in entries]
        self.io = _fits([t.io[1] for t in tapes], vs)
        self._io = _Many(self.io)
        # Questions whose arguments and answers are the same at every point are not asked again.
        self.ask = {i for i, (group, a, r) in enumerate(zip(entries, leaves, results, strict=True))
                    if group[0].kind == "query" and not (_fixed(a) and _fixed(r))}
        self.moving = {i for i, fits in enumerate(leaves) if not _fixed(fits)}
        self.leaves = [_Same(f[1] for f in fits) if _fixed(fits) else fits for fits in leaves]
        self.results = [_Same(f[1] for f in fits) if _fixed(fits) else fits for fits in results]
        self.consts: dict[int, tuple] = {}  # entry -> ("c", key, value) or ("p", graph value)
        wanted = set()
        for i, group in enumerate(entries):
            if group[0].kind != "const":
                continue
            if all(e.const[0] == group[0].const[0] for e in group):
                self.consts[i] = ("c", group[0].const[0], group[0].const[1])
            elif group[0].const[2] is None:
                raise Refused("a constant that changes with the shapes is not a value of the graph")
            else:
                link = group[0].const[2]  # a graph value, or (a graph value, the dtype it was cast to)
                self.consts[i] = ("p", link)
                wanted.add(link if isinstance(link, str) else link[0])
        self._recomputed = [i for i, c in self.consts.items() if c[0] == "p"]
        self._recomputed_items = [(i, self.consts[i]) for i in self._recomputed]  # what a point with `only` makes
        self._const_dtype = {i: np.dtype(self.tape.entries[i].skeleton[0]) for i in self._recomputed}
        self.program = self._program(tapes, wanted) if wanted else []
        self._static_steps: list[Callable[[dict, int], None]] = []
        self._moving_steps: list[Callable[[dict, int], None]] = []
        self._compile()  # the program, its inputs resolved
        self._static: dict[str, np.ndarray] | None = None  # the static steps' values, once run

    @property
    def degree(self) -> int:
        return len(self.vs) - 1

    def _program(self, tapes: list[Tape], wanted: set[str]) -> list[tuple]:
        """The nodes computing the `wanted` constants: ("fold", node, op) run again, ("run", {output: fit}) for
        the constants of a node that was planned (Shape's dims), in graph order."""
        first = tapes[0].program
        if any(len(t.program) != len(first) for t in tapes[1:]):
            raise Refused("the builds planned different nodes")
        producer = {o: i for i, (node, _, _, _) in enumerate(first) for o in node.outputs if o}
        chosen: dict[int, tuple] = {}
        stack = list(wanted)
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            i = producer.get(name)
            if i is None:
                if name not in self.graph.initializers and name not in self.host_values:
                    raise Refused(f"constant {name!r} comes from outside the graph's nodes")
                continue
            node, op, how, made = first[i]
            if how == "fold":
                chosen[i] = ("fold", node, op)
                stack += [n for n in (*node.inputs, *node.implicit) if n]
            elif how == "run" and name in made:
                fits = chosen[i][1] if i in chosen else {}
                fits[name] = fit([np.asarray(t.program[i][3][name]) for t in tapes], self.vs)
                chosen[i] = ("run", fits)
            else:
                raise Refused(f"constant {name!r} comes from a node the host cannot run again ({node.op_type})")
        return [chosen[i] for i in sorted(chosen)]

    def predict(self, shapes: Shapes) -> int | None:
        """The template's v for these input shapes, or None if they are not on its curve."""
        name, axis = self.var
        got = shapes.get(name)
        if got is None or len(got) != len(self.dims[name]):
            return None
        for n, fits in self.dims.items():
            dims = shapes.get(n)
            if dims is None or len(dims) != len(fits):
                return None
        if any(shapes[n][ax] < 2 for n, ax, _ in self._moving_dims):
            return None  # a dim of 0 or 1 plans differently (no work, broadcast strides): traced on its own
        v = got[axis]
        try:
            if any(at(f, v) != shapes[n][ax] for n, ax, f in self._moving_dims):
                return None
        except Mismatch:
            return None
        if any(tuple(shapes[n][ax] for ax in axes) != values for n, axes, values in self._fixed_dims):
            return None
        return v

    def leaves_at(self, i: int, v: int) -> list[Any]:
        """Entry i's argument numbers at v (Mismatch where they are not whole)."""
        fits = self.leaves[i]
        return fits if isinstance(fits, _Same) else [at(f, v) for f in fits]

    def io_at(self, v: int) -> list[Any]:
        return self._io.at(v)

    def point(self, v: int, pool: WeightPool, only: set[int] | None = None, keys: bool = True) -> Point:
        """The tape's numbers at v (Mismatch where they are not whole); with `only`, the numbers of those entries
        (and of the io and the recomputed constants: the fixed ones are left out), the others' left None; without
        `keys`, the recomputed constants' pool keys are None (a live plan writes those into buffers of its own)."""
        leaves: list[Any] = [None] * len(self.leaves)
        results: list[Any] = [None] * len(self.results)
        for i in range(len(self.leaves)) if only is None else only.union(self._recomputed):
            leaves[i] = self.leaves_at(i, v)
            fits = self.results[i]
            results[i] = fits if isinstance(fits, _Same) else [at(f, v) for f in fits]
        io = self._io.at(v)
        values = self._run_program(v) if self.program else {}
        consts = {}
        for i, c in self.consts.items() if only is None else self._recomputed_items:
            if c[0] == "c":
                consts[i] = (c[1], c[2])
                continue
            dtype = self._const_dtype[i]
            if isinstance(c[1], str):
                value = values[c[1]]
            else:  # precision="f16"'s copy, saturated as the planner's is
                value = f16_copy(values[c[1][0]]) if np.dtype(c[1][1]) == F16 else values[c[1][0]].astype(c[1][1])
            if value.size != leaves[i][0]:
                raise Mismatch(f"constant {c[1]!r} has {value.size} elements at {v}, the template expected "
                               f"{leaves[i][0]}")
            consts[i] = (pool.key(value, dtype, value.size, {})[0] if keys else None, value)
        return Point(leaves, results, io, consts, self.ask, self.moving)

    def _run_program(self, v: int) -> dict[str, np.ndarray]:
        """The program's values at v. A move runs it every time: its steps' inputs are resolved once (a value
        computed by an earlier step by name, an initializer or host value as a ready array), the steps whose
        values do not move with v ran once (their values are kept), and a fold that host_fold takes runs on the
        arrays themselves (no Tensors) and skips the fold cache (its inputs move with v: the cache's key would be
        made for nothing)."""
        if self._static is None:
            self._static = {}
            for step in self._static_steps:
                step(self._static, v)
        env = dict(self._static)
        for step in self._moving_steps:
            step(env, v)
        return env

    def _compile(self) -> None:
        """The program as steps (each a function of the values so far and v), split into the static ones, whose
        values do not move with v, and the moving ones."""
        made: set[str] = set()
        moves: set[str] = set()  # the values that move with v
        self._static_steps, self._moving_steps = [], []
        for step in self.program:
            if step[0] == "run":
                fits = [(n, ("c", np.asarray(f[1])) if f[0] == "c" else f) for n, f in step[1].items()]
                moving = any(f[0] != "c" for _, f in fits)
                (self._moving_steps if moving else self._static_steps).append(_fitted_step(fits))
                made.update(step[1])
                if moving:
                    moves.update(step[1])
                continue
            _, node, op = step
            getters: list[Any] = []
            for name in node.inputs:
                if not name:
                    getters.append(None)
                elif name in made:
                    getters.append(name)
                else:
                    arr = self.graph.initializers.get(name)
                    getters.append(_tensor(arr if arr is not None else self.host_values[name]))
            moving = any(type(g) is str and g in moves for g in getters)
            (self._moving_steps if moving else self._static_steps).append(self._fold_step(node, op, getters))
            made.update(n for n in node.outputs if n)
            if moving:
                moves.update(n for n in node.outputs if n)

    def _fold_step(self, node: Any, op: Any, getters: list[Any]) -> Callable[[dict, int], None]:
        """A node folded again: by host_fold's case on its inputs' arrays where it has one and takes them (none
        omitted), else as the planner folds it."""
        folds = self.folds
        case = fold_case(node.op_type) if None not in getters and node.outputs else None
        arrays = [g if type(g) is str else np.asarray(g.value) for g in getters]
        out = node.outputs[0] if node.outputs else ""

        def slow(env: dict[str, np.ndarray]) -> None:
            ins = [g if type(g) is not str else _tensor(env[g]) for g in getters]
            outs = host_fold(op, ins)
            if outs is None:
                outs = folds.fold(node, op, ins) if folds is not None else fold(op, ins)
            for name, t in zip(node.outputs, outs, strict=False):
                if name and t is not None:
                    env[name] = np.asarray(t.value)

        if case is None:
            return lambda env, v: slow(env)

        def step(env: dict[str, np.ndarray], v: int) -> None:
            got = fold_arrays(case, op, [a if type(a) is not str else env[a] for a in arrays])
            if got is None:
                slow(env)
            elif out:
                env[out] = got

        return step

    def verify(self, tape: Tape, shapes: Shapes, pool: WeightPool) -> bool:
        """Whether another build, `tape` at `shapes`, is what the template says it is, number for number."""
        v = self.predict(shapes)
        if v is None or v in self.vs or tape.signature() != self.tape.signature():
            return False
        try:
            p = self.point(v, pool)
        except Mismatch:
            return False
        own = own_point(tape)
        return (all(equal_leaves(x, y) for x, y in zip(p.leaves, own.leaves, strict=True))
                and all(equal_leaves(x, y) for x, y in zip(p.results, own.results, strict=True))
                and equal_leaves(p.io, own.io)
                and all(p.consts[i][0] == own.consts[i][0] for i in p.consts))


def _fitted_step(fits: list[tuple[str, tuple]]) -> Callable[[dict, int], None]:
    """The values of a node that was planned (Shape's dims) at v, from their fits."""
    def step(env: dict[str, np.ndarray], v: int) -> None:
        for name, f in fits:
            env[name] = f[1] if f[0] == "c" else np.asarray(at(f, v))

    return step


def _tensor(arr: np.ndarray) -> Tensor:
    return Tensor(arr.dtype, arr.shape, value=arr)


class Numbers:
    """Many integers that are polynomials in v, evaluated together. Fitted through consecutive points
    vs[0], vs[0] + 1, ... (all of `vs` but the last) by forward differences, checked at the last point (Refused
    where a row is not such a polynomial): p(vs[0] + u) = sum_k C(u, k) * diff_k, exact in integers."""

    def __init__(self, vs: list[int], rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, len(vs))
        fit_vs, check = vs[:-1], vs[-1]
        if fit_vs != list(range(fit_vs[0], fit_vs[0] + len(fit_vs))) or check in fit_vs:
            raise ValueError("Numbers: fitted through consecutive points, checked at another")
        self.origin = fit_vs[0]
        diffs = [rows[:, 0]]
        level = rows[:, :-1]
        for _ in range(len(fit_vs) - 1):
            level = np.diff(level, axis=1)
            diffs.append(level[:, 0])
        self.diffs = np.stack(diffs, axis=1)  # (rows, degree + 1): the k-th forward differences at the origin
        self._scale = int(np.abs(self.diffs).max()) if self.diffs.size else 0
        if not np.array_equal(self.at(check), rows[:, -1]):
            raise Refused("a runtime size is not a polynomial in the template's dim")

    def at(self, v: int) -> np.ndarray:
        """Every row's value at v (int64)."""
        u = v - self.origin
        binom = [1]
        for k in range(1, self.diffs.shape[1]):
            binom.append(binom[-1] * (u - k + 1) // k)  # C(u, k), exact for any integer u
        if max(abs(b) for b in binom) * self._scale * len(binom) < 2**62:
            return self.diffs @ np.array(binom, dtype=np.int64)
        exact = self.diffs.astype(object) @ np.array(binom, dtype=object)
        return np.array([int(x) for x in exact], dtype=np.int64)
