"""What the command line's commands share: exit codes and errors, input feeds (files, --shape, random values),
the ONNX Runtime reference and the comparison with it."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .model import TensorInfo, cast_feed

# Exit codes, the same for every command (README "Command line").
OK = 0
MISMATCH = 1  # ember's outputs differ from ONNX Runtime's beyond --rtol/--atol
USAGE = 2  # bad usage or arguments (argparse's own code for them)
REJECTED = 3  # the model was rejected at load (ValueError: malformed, or a file it names is missing)
UNSUPPORTED = 4  # an op ember cannot run (NotImplementedError)
RUNTIME = 5  # any other error

EXIT_CODES = f"""exit codes: {OK} ok, {MISMATCH} outputs differ from ONNX Runtime's, {USAGE} bad usage or arguments, \
{REJECTED} model rejected at load, {UNSUPPORTED} unsupported op, {RUNTIME} other runtime error; with several \
backends, the highest of theirs"""


class CliError(Exception):
    """An error the command line reports as one line, `ember: error: MESSAGE`, exiting with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """A multi-line message (ember lists every problem, one a line) folded onto one line."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    if not rest:
        return head
    return f"{head} {'; '.join(rest)}" if head.endswith(":") else "; ".join(lines)


def describe_error(e: BaseException, at_load: bool) -> CliError:
    """The exit code and message for an exception raised while loading (at_load) or running a model."""
    if isinstance(e, CliError):
        return e
    if isinstance(e, NotImplementedError):
        return CliError(UNSUPPORTED, f"unsupported: {one_line(str(e))}")
    if at_load and isinstance(e, (ValueError, FileNotFoundError)):
        return CliError(REJECTED, f"model rejected: {one_line(str(e))}")
    return CliError(RUNTIME, f"{type(e).__name__}: {one_line(str(e))}")


def check_model_path(path: str) -> None:
    if not os.path.exists(path):
        raise CliError(USAGE, f"no such file: {path}")
    if os.path.isdir(path):
        raise CliError(USAGE, f"{path} is a folder, not an ONNX file")


def pick_backends(choice: str, available: Sequence[str]) -> list[str]:
    if choice == "all":
        return list(available)
    if choice not in available:
        raise CliError(USAGE, f"backend {choice!r} is not available here (available: {', '.join(available)})")
    return [choice]


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (and, on wgpu, pipeline creation)
    times = []
    for _ in range(max(repeat, 1)):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


# ---- inputs ---------------------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`name=1,3,224,224` (`name=` for a scalar)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise CliError(USAGE, f"--shape {text!r}: expected NAME=D0,D1,... (e.g. x=1,3,224,224)")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip()) if dims.strip() else ()
    except ValueError:
        raise CliError(USAGE, f"--shape {text!r}: the dims must be whole numbers, e.g. x=1,3,224,224") from None
    if any(d < 0 for d in shape):
        raise CliError(USAGE, f"--shape {text!r}: dims must be >= 0")
    return name, shape


def parse_int_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(",")
    try:
        rng = (int(lo), int(hi))
    except ValueError:
        raise CliError(USAGE, f"--int-range {text!r}: expected LO,HI (whole numbers, both included)") from None
    if not sep or rng[0] > rng[1]:
        raise CliError(USAGE, f"--int-range {text!r}: expected LO,HI with LO <= HI")
    return rng


def _load_array_file(path: str) -> np.ndarray | dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise CliError(USAGE, f"--input: no such file: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:
        raise CliError(USAGE, f"--input {path}: not a .npy or .npz file ({one_line(str(e))})") from None
    if isinstance(data, np.ndarray):
        return data
    with data:
        return {key: data[key] for key in data.files}


def read_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    """--input NAME=FILE.npy, NAME=FILE.npz (its array NAME, or its only array) or FILE.npz (each array feeds
    the input of its name)."""
    arrays: dict[str, np.ndarray] = {}

    def put(name: str, arr: np.ndarray) -> None:
        if name in arrays:
            raise CliError(USAGE, f"--input: input {name!r} given twice")
        arrays[name] = arr

    for item in items:
        name, sep, path = item.partition("=")
        if not sep or os.path.isfile(item):
            data = _load_array_file(item)
            if not isinstance(data, dict):
                raise CliError(USAGE, f"--input {item}: a .npy file holds one array: say which input, NAME={item}")
            for key, arr in data.items():
                put(key, arr)
            continue
        data = _load_array_file(path)
        if isinstance(data, dict):
            if name in data:
                data = data[name]
            elif len(data) == 1:
                data = next(iter(data.values()))
            else:
                raise CliError(USAGE, f"--input {item}: {path} has no array named {name!r} "
                                      f"(it has {', '.join(sorted(data)) or 'none'})")
        put(name, data)
    return arrays


@dataclass
class FeedOptions:
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # from --input
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # from --shape
    batch: int = 1  # every dim neither --shape nor an --input array fixes
    int_range: tuple[int, int] = (0, 9)
    seed: int = 0


def feed_options(args: Any) -> FeedOptions:
    shapes: dict[str, tuple[int, ...]] = {}
    for text in args.shape or []:
        name, shape = parse_shape(text)
        if name in shapes:
            raise CliError(USAGE, f"--shape: input {name!r} given twice")
        shapes[name] = shape
    if args.batch < 0:
        raise CliError(USAGE, f"--batch {args.batch}: expected a whole number >= 0")
    return FeedOptions(read_inputs(args.input or []), shapes, args.batch, parse_int_range(args.int_range), args.seed)


def _fit(info: TensorInfo, shape: tuple[int, ...], bound: dict[str, tuple[int, str]], what: str) -> None:
    """Checks a given shape against the declared one, binding its symbolic dims (shared across inputs)."""
    if info.shape is None:
        return
    if len(shape) != len(info.shape):
        raise CliError(USAGE, f"{what}: input {info.name!r} has rank {len(info.shape)} "
                              f"({format_shape(info.shape)}), got shape {list(shape)}")
    for axis, (want, got) in enumerate(zip(info.shape, shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise CliError(USAGE, f"{what}: input {info.name!r} dim {axis} must be {want} "
                                  f"({format_shape(info.shape)}), got {got}")
        if isinstance(want, str):
            seen = bound.setdefault(want, (got, info.name))
            if seen[0] != got:
                raise CliError(USAGE, f"{what}: dim {want!r} is {seen[0]} in input {seen[1]!r} but {got} in "
                                      f"input {info.name!r}")


def random_array(info: TensorInfo, shape: tuple[int, ...], rng: np.random.Generator,
                 int_range: tuple[int, int]) -> np.ndarray:
    dtype = np.dtype(info.dtype)
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        lo, hi = max(int_range[0], int(limits.min)), min(int_range[1], int(limits.max))
        if lo > hi:
            raise CliError(USAGE, f"input {info.name!r}: --int-range {int_range[0]},{int_range[1]} holds no "
                                  f"{dtype} value")
        return rng.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)
    raise CliError(USAGE, f"input {info.name!r}: cannot make random values of dtype {dtype}; give it with --input")


def make_feeds(inputs: Sequence[TensorInfo], opts: FeedOptions) -> dict[str, np.ndarray]:
    """The feeds for a model's inputs: --input arrays, else random values of the --shape shape, else of the
    declared shape with each dim the model leaves open set by the other inputs' dims of the same name, else
    --batch. Ints are drawn from --int-range (both ends included), bools half True."""
    names = [i.name for i in inputs]
    for what, given in (("--input", opts.arrays), ("--shape", opts.shapes)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise CliError(USAGE, f"{what}: no input named {', '.join(map(repr, unknown))}; the model's inputs "
                                  f"are {', '.join(map(repr, names))}")
    both = sorted(set(opts.arrays) & set(opts.shapes))
    if both:
        raise CliError(USAGE, f"input(s) {', '.join(map(repr, both))} given by --input and --shape: pick one")
    bound: dict[str, tuple[int, str]] = {}
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        if info.name in opts.arrays:
            try:
                arr = cast_feed(info.name, opts.arrays[info.name], np.dtype(info.dtype))
            except ValueError as e:
                raise CliError(USAGE, f"--input: {e}") from None
            _fit(info, arr.shape, bound, "--input")
            feeds[info.name] = np.ascontiguousarray(arr)
        elif info.name in opts.shapes:
            _fit(info, opts.shapes[info.name], bound, "--shape")
    rng = np.random.default_rng(opts.seed)
    for info in inputs:
        if info.name in feeds:
            continue
        shape = opts.shapes.get(info.name)
        if shape is None:
            if info.shape is None:
                raise CliError(USAGE, f"input {info.name!r} declares no shape: give one with --shape "
                                      f"{info.name}=D0,D1,... or an array with --input")
            dims = []
            for d in info.shape:
                if isinstance(d, int):
                    dims.append(d)
                else:
                    value = bound[d][0] if isinstance(d, str) and d in bound else opts.batch
                    if isinstance(d, str):
                        bound.setdefault(d, (value, info.name))
                    dims.append(value)
            shape = tuple(dims)
        feeds[info.name] = random_array(info, shape, rng, opts.int_range)
    return {name: feeds[name] for name in names}


def format_shape(shape: Sequence[int | str | None] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def describe_feeds(feeds: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{name} {arr.dtype}{list(arr.shape)}" for name, arr in feeds.items())


# ---- the ONNX Runtime reference ------------------------------------------------------------------------------


class Reference:
    """ONNX Runtime on CPU running the same model; `error` says why not where it cannot."""

    def __init__(self, path: str) -> None:
        self.session: Any = None
        self.error: str | None = None
        try:
            import onnxruntime as ort
        except ImportError:
            self.error = "onnxruntime is not installed"
            return
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        except Exception as e:
            self.error = f"onnxruntime could not load the model: {one_line(str(e))}"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, dict(feeds)), strict=True))


@dataclass
class Comparison:
    max_abs: float = 0.0
    max_rel: float = 0.0  # max abs error / max |reference| over the outputs
    problems: list[str] = field(default_factory=list)
    top1_same: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return f"max abs err {self.max_abs:.1e}, max rel err {self.max_rel:.1e}"


def compare(got: Mapping[str, Any], want: Mapping[str, np.ndarray], rtol: float, atol: float) -> Comparison:
    """Float outputs match where |got - want| <= atol + rtol * |want| (NaN matching NaN); integer, bool and
    string outputs must be equal."""
    c = Comparison()
    for name, w in want.items():
        if name not in got:
            c.problems.append(f"output {name!r} missing")
            continue
        g, w = np.asarray(got[name]), np.asarray(w)
        if g.shape != w.shape:
            c.problems.append(f"output {name!r}: shape {list(g.shape)}, onnxruntime {list(w.shape)}")
            continue
        if g.dtype != w.dtype:
            c.problems.append(f"output {name!r}: dtype {g.dtype}, onnxruntime {w.dtype}")
            continue
        if w.dtype.kind not in "fiub":  # strings and objects: equal or not
            bad = int((g != w).sum())
            if bad:
                c.problems.append(f"output {name!r}: {bad} of {w.size} values differ")
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
            diff = np.where(same, 0.0, np.abs(g64 - w64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        abs_err = float(diff.max()) if diff.size else 0.0
        finite = np.abs(w64[np.isfinite(w64)])
        scale = float(finite.max()) if finite.size else 0.0
        rel_err = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else float("inf"))
        c.max_abs, c.max_rel = max(c.max_abs, abs_err), max(c.max_rel, rel_err)
        exact = w.dtype.kind != "f"
        bad_mask = diff > (0.0 if exact else atol + rtol * np.abs(w64))
        bad = int(bad_mask.sum())
        if bad:
            where = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad_mask)), w.shape)) if w.ndim else ()
            first = f"first at {list(where)}: {g[where].item()!r} vs {w[where].item()!r}"
            c.problems.append(f"output {name!r}: {bad} of {w.size} values differ (max abs err {abs_err:.1e}, "
                              f"max rel err {rel_err:.1e}; {first})")
        if w.dtype.kind == "f" and w.ndim >= 2 and w.shape[-1] > 1 and w.size:
            c.top1_same = c.top1_same and bool((g.argmax(-1) == w.argmax(-1)).all())
    return c
