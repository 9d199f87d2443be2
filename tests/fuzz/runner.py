"""Runs recipes in worker subprocesses (tests/fuzz/worker.py): a segfault or a hang fails its case instead of the
test session, and the batch goes on in a fresh worker from the next case."""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from typing import Any

from .worker import MARK

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE_TIMEOUT_S = 30.0  # a worker silent this long is hung on its current case (first cases compile shaders)
STARTUP_TIMEOUT_S = 300.0  # a worker's imports, before its first case (slow on a loaded machine)
ORDER = ["result", "ValueError", "NotImplementedError", "FileNotFoundError", "OutOfMemoryError", "RuntimeError",
         "TypeError", "skipped"]


def reproducer(recipe: dict[str, Any], backend: str, settings: dict[str, str] | None = None) -> str:
    prefix = "".join(f"{k}={v} " for k, v in (settings or {}).items())
    return f"{prefix}{sys.executable} -m tests.fuzz.worker {backend} --recipe '{json.dumps(recipe)}'"


def _reader(stream: Any, out: queue.Queue) -> None:
    for line in stream:
        if line.startswith(MARK):
            try:
                out.put(json.loads(line[len(MARK):]))
            except json.JSONDecodeError:  # a line cut short by a crash
                pass
    out.put(None)


def run_batch(recipes: list[dict[str, Any]], backend: str, case_timeout: float = CASE_TIMEOUT_S,
              settings: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One outcome dict per recipe: {"outcome", "ok", "msg"?, "where"?, "tb"?, "out"? (worker.signature)}; a
    crash or a hang is an outcome "crash" / "hang" with ok False and the worker's stderr tail (faulthandler's
    stacks) as "tb". `settings`: EMBER_* variables the workers run with (EMBER_CHECKED_SHADERS=1, say)."""
    env = {**os.environ, **(settings or {})}
    results: list[dict[str, Any] | None] = [None] * len(recipes)
    start = 0
    while start < len(recipes):
        with tempfile.TemporaryDirectory(prefix="ember-fuzz-") as tmp:
            path = os.path.join(tmp, "cases.json")
            with open(path, "w") as f:
                json.dump([[i, recipes[i]] for i in range(start, len(recipes))], f)
            err_path = os.path.join(tmp, "stderr.txt")
            with open(err_path, "w") as err:
                proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker", backend, path], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=err, text=True, env=env)
                lines: queue.Queue = queue.Queue()
                threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
                hung, ready = False, False
                while True:
                    try:
                        item = lines.get(timeout=case_timeout if ready else STARTUP_TIMEOUT_S)
                    except queue.Empty:
                        hung = True
                        proc.kill()
                        break
                    if item is None:
                        break
                    if item.get("ready"):
                        ready = True
                        continue
                    results[item.pop("i")] = item
                rc = proc.wait()
            with open(err_path, errors="replace") as f:
                tail = f.read()[-4000:]
        missing = [i for i in range(start, len(recipes)) if results[i] is None]
        if not missing:
            break
        first = missing[0]  # the case the worker was running when it died or stopped answering
        what = "hung" if hung else f"exited with status {rc}" if rc else "stopped without an outcome"
        results[first] = {"outcome": "hang" if hung else "crash", "ok": False, "msg": f"worker {what}", "tb": tail}
        start = first + 1
    return [r if r is not None else {"outcome": "lost", "ok": False, "msg": "no outcome"} for r in results]


def summarize(label: str, results: list[dict[str, Any]]) -> str:
    counts = collections.Counter(r["outcome"] for r in results if r["ok"])
    failures = collections.Counter(r["outcome"] for r in results if not r["ok"])
    parts = [f"cases={len(results)}"] + [f"{k}={counts[k]}" for k in ORDER] + \
        [f"{k}={v}" for k, v in sorted(counts.items()) if k not in ORDER]
    parts.append(f"failures={sum(failures.values())}" + (f" ({dict(failures)})" if failures else ""))
    return f"fuzz summary [{label}]: " + " ".join(parts)


def failure_report(recipes: list[dict[str, Any]], results: list[dict[str, Any]], backend: str,
                   limit: int = 10) -> str:
    """The first failure of each (outcome, where) with its reproducer."""
    seen: set[tuple[str, str]] = set()
    out = []
    for recipe, r in zip(recipes, results, strict=True):
        key = (r["outcome"], r.get("where", ""))
        if r["ok"] or key in seen:
            continue
        seen.add(key)
        out.append(f"--- {r['outcome']} at {r.get('where', '?')}: {r['msg']}\n    recipe: {json.dumps(recipe)}\n"
                   f"    reproduce: {reproducer(recipe, backend)}\n{r.get('tb', '')}")
        if len(out) >= limit:
            break
    return "\n".join(out)


def _same_values(a: list[float], b: list[float], rtol: float, atol: float) -> bool:
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True))


def differences(recipes: list[dict[str, Any]], first: list[dict[str, Any]], second: list[dict[str, Any]],
                backend: str, settings: dict[str, str], limit: int = 10, rtol: float = 1e-5,
                atol: float = 1e-6) -> tuple[int, str]:
    """(number of cases whose outcome or outputs differ between two runs of the same recipes, a report of the
    first `limit` with the reproducer of the second mode). Outcomes compare by name, results by each output's
    dtype, shape and values."""
    n, out = 0, []
    for recipe, a, b in zip(recipes, first, second, strict=True):
        why = ""
        if a["outcome"] != b["outcome"]:
            why = f"outcome {a['outcome']} ({a.get('msg', '')}) vs {b['outcome']} ({b.get('msg', '')})"
        elif a["outcome"] == "result":
            sa, sb = a["out"], b["out"]
            for name in sorted(set(sa) | set(sb)):
                oa, ob = sa.get(name), sb.get(name)
                if oa is None or ob is None or oa["dtype"] != ob["dtype"] or oa["shape"] != ob["shape"]:
                    def desc(o: dict[str, Any] | None) -> str:
                        return "missing" if o is None else f"{o['dtype']} {o['shape']}"

                    why = f"output {name!r}: dtype and shape {desc(oa)} vs {desc(ob)}"
                elif not _same_values(oa["values"], ob["values"], rtol, atol):
                    why = f"output {name!r}: values differ"
                if why:
                    break
        if why:
            n += 1
            if len(out) < limit:
                out.append(f"--- {why}\n    recipe: {json.dumps(recipe)}\n    reproduce: "
                           f"{reproducer(recipe, backend, settings)}")
    return n, "\n".join(out)
