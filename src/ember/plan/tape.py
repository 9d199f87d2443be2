"""The tape: every call a plan's build makes to its backend, as data that can be compared and replayed.

A traced build (template.trace) plans on a `TracingContext` whose backend is a `TapeBackend`: allocations,
uploads and record calls are written down and not made (fake handles, fake steps); questions (storage_itemsize,
select_attention, select_conv, ...) go to the real backend and their answers are written down too; constants
taken from the weight pool are real pool buffers, written down with the graph value they are. Each call is split
into a *skeleton* (what must stay the same: dtypes, op names, expression structure, which buffer a view looks
into) and *leaves* (the numbers that may change with an input dim: sizes, strides, offsets, byte counts, literal
constants, small arrays). Buffers are named by the entry that allocated them, so two builds' tapes line up call
by call when they differ only in numbers: template.realize makes a plan of a tape, fit.py fits the numbers.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.view import View
from ..ops import Context


class Refused(Exception):
    """What a build did cannot be written as a tape (a callable argument from outside, an unknown step)."""


# Methods whose plain int arguments (by parameter position after self) are buffer handles.
HANDLE_ARGS: dict[str, tuple[int, ...]] = {
    "free": (0,), "upload": (0,), "nbytes": (0,), "record_copy": (0, 1), "input_writer": (0,),
    "record_gemm": (6, 8, 11), "record_conv2d": (0, 2, 4), "record_attention": (0, 1, 2, 3),
    "record_reduce": (1, 2), "record_unary": (1, 2), "record_binary": (1, 2, 3),
}


@dataclasses.dataclass(frozen=True)
class Ref:
    """A buffer or callable in a skeleton: ("tape", entry) for a buffer the tape allocated, ("const", entry) for
    a weight-pool constant, ("obj", (entry, field)) for a taped object's callable (a ConvKernel's record), and
    ("ext", handle) for a handle the tape does not know (only in answers compared by template._same_answer)."""

    kind: str
    key: Any


class Encoder:
    """Splits values into a hashable skeleton and a list of leaves (ints, floats, arrays)."""

    def __init__(self, handle_ref: Callable[[int], Ref], fn_ref: Callable[[Any], Ref | None]) -> None:
        self.handle_ref = handle_ref
        self.fn_ref = fn_ref
        self.leaves: list[Any] = []

    def leaf(self, value: Any, kind: str) -> tuple:
        self.leaves.append(value)
        return ("$", kind)

    def encode(self, v: Any, memo: dict[int, Any] | None = None) -> Any:
        memo = {} if memo is None else memo
        if isinstance(v, np.dtype):
            return ("dt", v.str)
        if v is None or isinstance(v, (bool, str, np.bool_, enum.Enum)):
            return ("c", v)
        if isinstance(v, (int, np.integer)):
            return self.leaf(int(v), "i")
        if isinstance(v, (float, np.floating)):
            return self.leaf(float(v), "f")
        if isinstance(v, np.ndarray):
            return self.leaf(v, "a")
        if isinstance(v, type):
            return ("t", v)
        if isinstance(v, View):
            return ("view", self.handle_ref(v.handle), v.dtype.str, self.encode(v.shape), self.encode(v.strides),
                    self.encode(v.offset))
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, tuple(self.encode(x, memo) for x in v))
        if isinstance(v, dict):
            return ("dict", tuple((k, self.encode(x, memo)) for k, x in v.items()))
        if dataclasses.is_dataclass(v):
            hit = memo.get(id(v))
            if hit is not None:  # a shared subtree (expression DAGs): named by its first occurrence
                return ("memo", hit)
            memo[id(v)] = len(memo)
            return ("dc", type(v), tuple(self.encode(getattr(v, f.name), memo) for f in dataclasses.fields(v)))
        if callable(v):
            ref = self.fn_ref(v)
            if ref is not None:
                return ("fn", ref)
        raise Refused(f"cannot tape a {type(v).__name__} argument")


_Part = Callable[[Any, Callable, Callable, list], Any]  # (leaves iterator, handles, fns, memo) -> value
_COMPILED: dict[int, tuple[Any, _Part | None, int]] = {}  # id(skeleton) -> (the skeleton, kept alive; fn; slots)
_COMPILED_MAX = 8192


def decode(skel: Any, leaves: list[Any], handles: Callable[[Ref], Any], fns: Callable[[Ref], Any]) -> Any:
    """The value `skel` stands for, its leaves taken in order from `leaves` (consumed). A skeleton decoded a
    second time (a live plan's io and questions, decoded on every move) is compiled into closures first."""
    known = _COMPILED.get(id(skel))
    if known is not None and known[0] is skel:
        fn, slots = known[1], known[2]
        if fn is None:
            fn, slots = _compile(skel)
            _COMPILED[id(skel)] = (skel, fn, slots)
        return fn(iter(leaves), handles, fns, [None] * slots)
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.clear()
    _COMPILED[id(skel)] = (skel, None, 0)
    return _walk(skel, leaves, handles, fns)


def _compile(skel: Any) -> tuple[_Part, int]:
    """_walk as one closure per skeleton node (no tag tests at decode time); dataclass memo slots numbered in
    the order _walk fills them (pre-order), leaves consumed in the same order."""
    slots = [0]

    def comp(s: Any) -> _Part:
        tag = s[0]
        if tag in ("c", "t"):
            val = s[1]
            return lambda it, h, f, m: val
        if tag == "dt":
            dt = np.dtype(s[1])
            return lambda it, h, f, m: dt
        if tag == "$":
            return lambda it, h, f, m: next(it)
        if tag == "view":
            ref, dt = s[1], np.dtype(s[2])
            shape, strides, offset = comp(s[3]), comp(s[4]), comp(s[5])
            return lambda it, h, f, m: View(h(ref), dt, shape(it, h, f, m), strides(it, h, f, m), offset(it, h, f, m))
        if tag in ("list", "tuple"):
            n = len(s[1])
            if all(x[0] == "$" for x in s[1]):  # only leaves: taken at once
                if tag == "list":
                    return lambda it, h, f, m: [next(it) for _ in range(n)]
                return lambda it, h, f, m: tuple([next(it) for _ in range(n)])
            items = [comp(x) for x in s[1]]
            if tag == "list":
                return lambda it, h, f, m: [g(it, h, f, m) for g in items]
            return lambda it, h, f, m: tuple([g(it, h, f, m) for g in items])
        if tag == "dict":
            pairs = [(k, comp(x)) for k, x in s[1]]
            return lambda it, h, f, m: {k: g(it, h, f, m) for k, g in pairs}
        if tag == "memo":
            i = s[1]
            return lambda it, h, f, m: m[i]
        if tag == "dc":
            slot = slots[0]
            slots[0] += 1
            cls, parts = s[1], [comp(x) for x in s[2]]

            def dc(it: Any, h: Callable, f: Callable, m: list) -> Any:
                value = cls(*[g(it, h, f, m) for g in parts])
                m[slot] = value
                return value
            return dc
        if tag == "fn":
            ref = s[1]
            return lambda it, h, f, m: f(ref)
        if tag == "h":
            ref = s[1]
            return lambda it, h, f, m: h(ref)
        raise AssertionError(tag)

    fn = comp(skel)
    return fn, slots[0]


def _walk(skel: Any, leaves: list[Any], handles: Callable[[Ref], Any], fns: Callable[[Ref], Any]) -> Any:
    it = iter(leaves)
    memo: list[Any] = []

    def walk(s: Any) -> Any:
        tag = s[0]
        if tag == "c":
            return s[1]
        if tag == "dt":
            return np.dtype(s[1])
        if tag == "$":
            return next(it)
        if tag == "t":
            return s[1]
        if tag == "view":
            return View(handles(s[1]), np.dtype(s[2]), walk(s[3]), walk(s[4]), walk(s[5]))
        if tag in ("list", "tuple"):
            items = [walk(x) for x in s[1]]
            return items if tag == "list" else tuple(items)
        if tag == "dict":
            return {k: walk(x) for k, x in s[1]}
        if tag == "memo":
            return memo[s[1]]
        if tag == "dc":
            slot = len(memo)
            memo.append(None)
            value = s[1](*[walk(x) for x in s[2]])
            memo[slot] = value
            return value
        if tag == "fn":
            return fns(s[1])
        if tag == "h":
            return handles(s[1])
        raise AssertionError(tag)

    return walk(skel)


def decode_call(skel: Any, leaves: list[Any], handles: Callable[[Ref], Any],
                fns: Callable[[Ref], Any]) -> tuple[tuple, dict]:
    """(args, kwargs) of a call a Tape.encode skeleton stands for."""
    known = _CALLS.get(id(skel))
    if known is None or known[0] is not skel:
        if len(_CALLS) >= _COMPILED_MAX:
            _CALLS.clear()
        known = _CALLS[id(skel)] = (skel, ("tuple", (("tuple", skel[0]), ("dict", skel[1]))))
    return decode(known[1], leaves, handles, fns)


_CALLS: dict[int, tuple[Any, Any]] = {}  # id(call skeleton) -> (it, kept alive; its (args, kwargs) skeleton)


@dataclasses.dataclass
class Entry:
    method: str
    receiver: Ref | None  # None: the backend; a taped object (("obj", (entry, field)): a ConvKernel's) otherwise
    skeleton: Any  # (args, kwargs) encoded
    leaves: list[Any]
    kind: str  # "alloc", "upload", "steps", "query", "object", "const"
    result_skeleton: Any = None  # "query" / "object": the answer, encoded
    result_leaves: list[Any] = dataclasses.field(default_factory=list)
    const: Any = None  # "const": (pool key, the array uploaded, the graph value it is, or None)


class FakeStep:
    """What a taped record call returns while tracing: it stands for that call's steps in the plan's order."""

    __slots__ = ("entry",)

    def __init__(self, entry: int) -> None:
        self.entry = entry


# Traced allocations get handles no real backend hands out.
FAKE_HANDLES = 1 << 48


class Tape:
    """The entries of one traced build, the buffers they allocated, and the plan the build made (see the module
    docstring)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.handles: dict[int, Ref] = {}  # handle -> Ref of the entry that made it (an alloc or a constant)
        self.sizes: dict[int, int] = {}  # traced handle -> nbytes asked for
        self.objects: dict[int, tuple[int, str]] = {}  # id(taped callable) -> (entry, field)
        self.keep: list[Any] = []  # the taped callables (their ids stay unique while the tape lives)
        self.names: dict[int, str] = {}  # id(constant tensor or array) -> the graph value it is (planner.plan_graph)
        self.program: list[tuple[Any, Any, str, dict[str, Any]]] = []  # the nodes as planned (planner._Walk)
        # What the build made, filled in by trace(): the fake steps and labels in order, the allocations it
        # pinned, its (name, Tensor) inputs and outputs encoded, its counters and memory figures.
        self.steps: list[FakeStep] = []
        self.labels: list[str] = []
        self.pinned: set[Ref] = set()
        self.io: tuple[Any, list[Any]] = ((), [])
        self.counters: dict[str, int] = {}
        self.requested_bytes = 0

    def handle_ref(self, handle: int) -> Ref:
        ref = self.handles.get(int(handle))
        if ref is None:
            raise Refused(f"a buffer made outside the traced build (handle {handle})")
        return ref

    def fn_ref(self, fn: Any) -> Ref | None:
        hit = self.objects.get(id(fn))
        return None if hit is None else Ref("obj", hit)

    def encode(self, method: str, args: tuple, kwargs: dict) -> tuple[Any, list[Any]]:
        enc = Encoder(self.handle_ref, self.fn_ref)
        positions = HANDLE_ARGS.get(method, ())
        parts = []
        for i, a in enumerate(args):
            if i in positions and isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                parts.append(("h", self.handle_ref(a)))
            else:
                parts.append(enc.encode(a))
        kw = tuple((k, enc.encode(v)) for k, v in sorted(kwargs.items()))
        return (tuple(parts), kw), enc.leaves

    def add(self, entry: Entry) -> int:
        self.entries.append(entry)
        return len(self.entries) - 1

    def signature(self) -> tuple:
        """What two tapes must share to be fitted: every entry's method, receiver and skeletons."""
        return tuple((e.method, e.receiver, e.skeleton, e.result_skeleton, e.kind,
                      None if e.const is None else e.const[2]) for e in self.entries) + (self.io[0],)


class TapeBackend:
    """A ComputeBackend for tracing a build: allocations and record calls are written on `tape` and not made
    (fake handles, fake steps); questions (storage_itemsize, select_attention, select_conv, ...) go to `backend`
    and their answers are written down too."""

    def __init__(self, backend: Any, tape: Tape) -> None:
        self._be = backend
        self._tape = tape
        self._next = FAKE_HANDLES

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._be, name)
        if not callable(target) or name.startswith("_"):
            return target
        return lambda *args, **kwargs: self._call(None, target, name, args, kwargs)

    def alloc(self, nbytes: int, *, overwritten: bool = False) -> int:
        tape = self._tape
        skeleton, leaves = tape.encode("alloc", (int(nbytes),), {})
        index = tape.add(Entry("alloc", None, skeleton, leaves, "alloc"))
        handle = self._next
        self._next += 1
        tape.handles[handle] = Ref("tape", index)
        tape.sizes[handle] = int(nbytes)
        return handle

    def free(self, handle: int) -> None:
        self._tape.sizes.pop(int(handle), None)

    def nbytes(self, handle: Any, arg: str = "handle") -> int:
        size = self._tape.sizes.get(int(handle))
        return self._be.nbytes(handle, arg) if size is None else size

    def upload(self, handle: int, array: np.ndarray) -> None:
        tape = self._tape
        skeleton, leaves = tape.encode("upload", (handle, np.array(array)), {})
        tape.add(Entry("upload", None, skeleton, leaves, "upload"))

    def _call(self, receiver: Ref | None, target: Callable, name: str, args: tuple, kwargs: dict) -> Any:
        tape = self._tape
        why = self._be.declines(name, args, kwargs) if receiver is None and name.startswith("record") else None
        if why is not None:
            raise NotImplementedError(why)
        skeleton, leaves = tape.encode(name, args, kwargs)
        index = len(tape.entries)
        if name.startswith("record"):
            tape.add(Entry(name, receiver, skeleton, leaves, "steps"))
            return [FakeStep(index)]
        result = target(*args, **kwargs)
        enc = Encoder(tape.handle_ref, tape.fn_ref)
        if dataclasses.is_dataclass(result) and any(callable(getattr(result, f.name))
                                                      for f in dataclasses.fields(result)):
            # A kernel selection (ConvKernel): its record callables are taped, named by this entry and field.
            entry = Entry(name, receiver, skeleton, leaves, "object")
            wrapped = {}
            for f in dataclasses.fields(result):
                fn = getattr(result, f.name)
                if callable(fn) and not isinstance(fn, type):
                    wrapper = self._method(Ref("obj", (index, f.name)), fn, f.name)
                    tape.objects[id(wrapper)] = (index, f.name)
                    tape.keep.append(wrapper)
                    wrapped[f.name] = wrapper
            plain = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in wrapped}
            entry.result_skeleton = enc.encode(plain)
            result = dataclasses.replace(result, **wrapped)
        else:
            entry = Entry(name, receiver, skeleton, leaves, "query")
            entry.result_skeleton = enc.encode(result)
        entry.result_leaves = enc.leaves
        tape.add(entry)
        return result

    def _method(self, receiver: Ref, fn: Callable, name: str) -> Callable:
        return lambda *args, **kwargs: self._call(receiver, fn, name, args, kwargs)


class TracingContext(Context):
    """The planner's Context for a traced build: on a TapeBackend, and writing down every constant it takes from
    the weight pool (the pool's buffers are real: shared with the model's other plans)."""

    def __init__(self, backend: Any, pool: Any, tape: Tape) -> None:
        super().__init__(backend, pool)
        self.tape = tape
        self.backend = TapeBackend(backend, tape)

    def derived(self, value: np.ndarray, source: Any, transform: Any) -> None:
        super().derived(value, source, transform)
        name = self.tape.names.get(id(source), self.tape.names.get(id(source.value)))
        if name is not None and isinstance(name, str) and transform[0] == "cast":
            # precision="f16"'s copy of a constant: the graph value, cast (template.py recomputes both).
            self.tape.names.setdefault(id(value), (name, transform[1]))  # type: ignore[arg-type]

    def _hold(self, t: Any, key: Any, arr: np.ndarray | None) -> int:
        tape = self.tape
        handle = super()._hold(t, key, arr)
        name = tape.names.get(id(t), tape.names.get(id(t.value)))
        value = arr if arr is not None else t.value
        index = tape.add(Entry("const", None, (t.dtype.str,), [t.size], "const", const=(key, value, name)))
        tape.handles.setdefault(handle, Ref("const", index))
        return handle
