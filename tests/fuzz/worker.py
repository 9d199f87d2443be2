"""Runs fuzz recipes on one backend and prints one JSON line per case (prefixed with MARK), so a parent process
sees which case crashed or hung.

    python -m tests.fuzz.worker BACKEND CASES.json     # a list of [index, recipe] pairs
    python -m tests.fuzz.worker BACKEND --recipe JSON  # one recipe: the reproducer a failure prints
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import sys
import time
import traceback
import warnings
from typing import Any

import numpy as np

import ember

from .mutate import build_model, mutate_feeds, valid_feeds
from .seeds import SEEDS

MARK = "@@FUZZ "
EMBER_DIR = os.path.dirname(os.path.abspath(ember.__file__))
MEMORY_LIMIT = 8 << 30  # address space: a planned 2**40-element tensor must fail, not swap the machine
HANG_DUMP_S = 25.0  # a case running this long dumps every thread's stack to stderr (the parent kills at 30 s)


def _origin(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return "?"
    last = tb[-1]
    return f"{last.filename}:{last.lineno}"


def classify(e: BaseException, backend: str, kind: str) -> tuple[str, bool]:
    """(outcome name, allowed). Allowed: ember's own exception types raised by ember's code (for feeds:
    ValueError, and TypeError from ember's "feeds must be a mapping" check). Anything else (a numpy or
    Python-internal error, or an allowed type raised inside numpy/onnx rather than by ember) is a failure."""
    origin = _origin(e)
    ours = origin.startswith(EMBER_DIR)
    if isinstance(e, ember.OutOfMemoryError):
        return "OutOfMemoryError", ours
    if kind == "feed":
        if isinstance(e, TypeError) and ours and "feeds must be a mapping" in str(e):
            return "TypeError", True
        if isinstance(e, ValueError) and ours:
            return "ValueError", True
        return type(e).__name__, False
    for t in (FileNotFoundError, NotImplementedError, ValueError):
        if isinstance(e, t):
            return t.__name__, ours
    if type(e) is RuntimeError and backend in str(e):  # load_onnx's wrapper: the summary names what it wraps
        return "RuntimeError" + (f"({type(e.__cause__).__name__})" if e.__cause__ is not None else ""), True
    return type(e).__name__, False


# Failures already reported, tolerated so the suite stays green until they are fixed, counted as "known:<name>":
# (name, exception type, text the message contains, file the exception comes from). Remove an entry with its fix.
# Outcomes tolerated while their fix is pending: (name, type, text in the message, file raising it).
KNOWN: list[tuple[str, type[BaseException], str, str]] = []


def known(e: BaseException) -> str | None:
    origin = _origin(e)
    for name, t, text, where in KNOWN:
        if isinstance(e, t) and text in str(e) and where in origin:
            return name
    return None


_models: dict[tuple[str, str], ember.Model] = {}


class SkipCase(Exception):
    """The recipe does not apply (a mutation that cannot be made on this model, or no feeds fit the loaded
    model's inputs): the case counts as "skipped", not as an outcome of ember's."""


def _harness(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        raise SkipCase(f"{type(e).__name__}: {e}") from e


def run_case(recipe: dict[str, Any], backend: str) -> dict[str, Any]:
    rng = np.random.default_rng(recipe["seed"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if recipe["kind"] == "selftest":  # the runner's own test: a crash or a hang on demand
                if recipe["muts"][0][0] == "crash":
                    faulthandler._sigsegv()
                time.sleep(3600)
            if recipe["kind"] == "model":
                data = _harness(build_model, recipe)
                model = ember.load_onnx(data, backend=backend)
                out = model.run(_harness(valid_feeds, model.inputs, rng))
            else:
                key = (recipe["model"], backend)
                if key not in _models:
                    _models[key] = ember.load_onnx(SEEDS[recipe["model"]]().SerializeToString(), backend=backend)
                model = _models[key]
                feeds = _harness(mutate_feeds, _harness(valid_feeds, model.inputs, rng), recipe["muts"], rng)
                out = model.run(feeds)
    except SkipCase as e:
        return {"outcome": "skipped", "ok": True, "msg": str(e)[:400]}
    except Exception as e:  # classify() judges it
        outcome, ok = classify(e, backend, recipe["kind"])
        if not ok and (name := known(e)) is not None:
            outcome, ok = f"known:{name}", True
        return {"outcome": outcome, "ok": ok, "msg": f"{type(e).__name__}: {e}"[:400], "where": _origin(e),
                "tb": "" if ok else traceback.format_exc()[-3000:]}
    # Which shader modules ran (wgpu: checked or trusted), so a comparison of the two modes can prove its arms.
    mode = getattr(model.compute_backend, "checked", None)
    return {"outcome": "result", "ok": True, "out": signature(out), "checked": mode}


SIGNATURE_VALUES = 4096  # outputs up to this many elements are kept whole; larger ones as a few statistics


def signature(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """What a run returned, small enough for one JSON line, for comparing the same case in two modes (trusted
    and checked shader modules): per output its dtype, shape and values (or statistics of a large one)."""
    sig = {}
    for name, value in outputs.items():
        a = np.asarray(value)
        flat = a.astype(np.float64).ravel()
        if a.size <= SIGNATURE_VALUES:
            values = flat.tolist()
        else:
            finite = flat[np.isfinite(flat)]
            values = [float(finite.sum()), float(np.abs(finite).sum()), float(np.isnan(flat).sum()),
                      float(np.isinf(flat).sum())]
        sig[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "values": values}
    return sig


def main(argv: list[str]) -> int:
    faulthandler.enable()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > MEMORY_LIMIT:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    backend = argv[0]
    if argv[1] == "--recipe":
        result = run_case(json.loads(argv[2]), backend)
        print(json.dumps(result, indent=1))
        print(result.get("tb", ""))
        return 0 if result["ok"] else 1
    with open(argv[1]) as f:
        cases = json.load(f)
    sys.stdout.write(MARK + json.dumps({"ready": True}) + "\n")  # imports done: the per-case clock starts now
    sys.stdout.flush()
    for index, recipe in cases:
        faulthandler.dump_traceback_later(HANG_DUMP_S, exit=False)
        result = run_case(recipe, backend)
        faulthandler.cancel_dump_traceback_later()
        result["i"] = index
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
