"""Count which ONNX node conformance cases ember passes, per backend and per op type.

    python tools/conformance.py [--backend cpu|wgpu|all] [--write-allowlist] [--cases REGEX] [-v]
    python tools/conformance.py --write-ort-passes      # rebuild tests/conformance/ort_cpu_passes.txt

--write-allowlist rewrites tests/conformance/allowlist_<backend>.txt with the cases that pass on that
backend and that ONNX Runtime CPU also passes, sorted; it names any case it drops, since a dropped case is
a regression someone should look at.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The harness lives in the tests package; an installed ember (or one on PYTHONPATH) wins over src/.
sys.path.insert(0, str(REPO_ROOT))
sys.path.append(str(REPO_ROOT / "src"))

from tests.conformance import harness  # noqa: E402


def ember_backends() -> list[str]:
    import ember

    return list(ember.available_backends())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="all", help="cpu, wgpu or all (every available backend)")
    ap.add_argument("--write-allowlist", action="store_true", help="rewrite allowlist_<backend>.txt")
    ap.add_argument("--write-ort-passes", action="store_true", help="rebuild ort_cpu_passes.txt and exit")
    ap.add_argument("--cases", default=None, help="only cases whose name matches this regex")
    ap.add_argument("--all-cases", action="store_true", help="also run cases ONNX Runtime fails")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failing case and why")
    args = ap.parse_args(argv)

    cases = harness.all_cases()
    names = sorted(cases)
    if args.cases:
        import re

        pattern = re.compile(args.cases)
        names = [n for n in names if pattern.search(n)]

    if args.write_ort_passes:
        if args.cases:
            ap.error("--write-ort-passes rebuilds the whole list; drop --cases")
        t0 = time.perf_counter()
        passes = harness.ort_passing_cases(cases[n] for n in names)
        harness.write_names(harness.ORT_PASSES_FILE, passes, harness.ORT_PASSES_HEADER)
        print(
            f"ONNX Runtime CPU passes {len(passes)} of {len(names)} cases "
            f"({time.perf_counter() - t0:.0f} s); wrote {harness.ORT_PASSES_FILE.relative_to(REPO_ROOT)}"
        )
        return 0

    ort_ok = set(harness.ort_passes())
    if not ort_ok:
        print("ort_cpu_passes.txt is missing or empty: run with --write-ort-passes first", file=sys.stderr)
        return 2
    if not args.all_cases:
        names = [n for n in names if n in ort_ok]
    if args.write_allowlist and args.cases:
        ap.error("--write-allowlist needs the full case set; drop --cases")

    available = ember_backends()
    backends = available if args.backend == "all" else [args.backend]
    unknown = [b for b in backends if b not in available]
    if unknown:
        ap.error(f"backend(s) {unknown} not available; available: {available}")

    # per backend: op type -> [passed, total]; and failure kinds
    per_op: dict[str, dict[str, list[int]]] = {b: defaultdict(lambda: [0, 0]) for b in backends}
    kinds: dict[str, Counter[str]] = {b: Counter() for b in backends}
    passed: dict[str, list[str]] = {b: [] for b in backends}
    failed: dict[str, dict[str, str]] = {b: {} for b in backends}
    for backend in backends:
        t0 = time.perf_counter()
        for name in names:
            ok, reason = harness.run_case(cases[name], backend)
            counts = per_op[backend][harness.case_op_type(name)]
            counts[1] += 1
            if ok:
                counts[0] += 1
                passed[backend].append(name)
            else:
                kinds[backend][reason.split(":", 1)[0]] += 1
                failed[backend][name] = reason
                if args.verbose:
                    print(f"[{backend}] {name}: {reason}")
        dt = time.perf_counter() - t0
        fails = ", ".join(f"{k} {v}" for k, v in kinds[backend].most_common()) or "none"
        print(f"{backend}: {len(passed[backend])} / {len(names)} cases pass ({dt:.0f} s); failures: {fails}")

    print_table(names, backends, per_op)

    if args.write_allowlist:
        for backend in backends:
            path = harness.allowlist_path(backend)
            old = set(harness.read_names(path))
            new = sorted(set(passed[backend]) & ort_ok)
            dropped = sorted(old - set(new))
            misses = {n: r for n, r in failed[backend].items() if n in ort_ok}
            harness.write_names(path, new, harness.allowlist_header(backend, misses))
            added = len(set(new) - old)
            print(f"wrote {path.relative_to(REPO_ROOT)}: {len(new)} cases (+{added} / -{len(dropped)})")
            for name in dropped:
                print(f"  dropped (was passing): {name}")
    return 0


def print_table(names: list[str], backends: list[str], per_op: dict[str, dict[str, list[int]]]) -> None:
    ops = sorted({harness.case_op_type(n) for n in names}, key=str.lower)
    width = max([len(o) for o in ops] + [7])
    print(f"\n{'op type':<{width}}  " + "  ".join(f"{b:>9}" for b in backends))
    for op in ops:
        cells = []
        for b in backends:
            ok, total = per_op[b].get(op, [0, 0])
            cells.append(f"{ok:>4}/{total:<4}")
        print(f"{op:<{width}}  " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
