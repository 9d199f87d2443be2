"""ONNX node conformance: every allowlisted case must pass; the rest of ORT's passes are reported.

allowlist_<backend>.txt holds the cases a backend is known to pass; a case there that fails is a
regression. test_report_newly_passing runs the cases ONNX Runtime CPU passes that are not allowlisted yet
and only reports (warning + .cache/conformance_<backend>.txt) those that now pass, so the list can grow
with `python tools/conformance.py --write-allowlist`.

Runtime: a case is one or a few nodes on tiny tensors, so its cost is load time; on wgpu over lavapipe
that is pipeline creation (~50 ms each), so ~1600 cases take minutes there. The report test stops after
EMBER_CONFORMANCE_REPORT_BUDGET_S seconds per backend (default 300) and says how many it did not reach;
it runs them in a fresh random order each time so repeated runs cover all.
"""

from __future__ import annotations

import os
import random
import time
import warnings

import pytest

import ember

from .harness import (
    CACHE_DIR,
    all_cases,
    allowlist_path,
    check_case,
    ort_passes,
    read_names,
    run_case,
    run_case_ort,
)

BACKENDS: list[str] = list(ember.available_backends())
KNOWN_BACKENDS = ("cpu", "wgpu")
REPORT_BUDGET_S = float(os.environ.get("EMBER_CONFORMANCE_REPORT_BUDGET_S", "300"))

ALLOWLISTED = [
    pytest.param(backend, name, id=f"{backend}-{name}")
    for backend in BACKENDS
    for name in read_names(allowlist_path(backend))
]


# An empty parameter set would show up as a skip, and nothing here may skip by default: while the
# allowlists are empty the test is simply not defined (test_allowlist_is_well_formed still runs).
if ALLOWLISTED:

    @pytest.mark.parametrize(("backend", "name"), ALLOWLISTED)
    def test_allowlisted_case(backend: str, name: str) -> None:
        case = all_cases().get(name)
        assert case is not None, f"{name} is allowlisted but the installed onnx has no such case"
        # check_case raises the runtime's own exception, so a failure shows its traceback.
        check_case(case, backend)


@pytest.mark.parametrize("backend", KNOWN_BACKENDS)
def test_allowlist_is_well_formed(backend: str) -> None:
    names = read_names(allowlist_path(backend))
    assert names == sorted(set(names)), "allowlist must be sorted and free of duplicates"
    unknown = sorted(set(names) - set(all_cases()))
    assert not unknown, f"not cases of the installed onnx: {unknown}"
    not_ort = sorted(set(names) - set(ort_passes()))
    assert not not_ort, f"allowlisted but not in ort_cpu_passes.txt: {not_ort}"


def test_ort_pass_list_still_passes() -> None:
    """The allowlists lean on ort_cpu_passes.txt; every case in it must still pass on the installed ORT."""
    listed = ort_passes()
    assert len(listed) > 500, "ort_cpu_passes.txt is missing or truncated"
    cases = all_cases()
    missing = [n for n in listed if n not in cases]
    assert not missing, f"not cases of the installed onnx (regenerate the list): {missing[:20]}"
    failing = {}
    for name in listed:
        ok, reason = run_case_ort(cases[name])
        if not ok:
            failing[name] = reason
    regen = "regenerate with: python tools/conformance.py --write-ort-passes"
    assert not failing, f"ORT fails {len(failing)} listed cases ({regen}): {dict(list(failing.items())[:10])}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_report_newly_passing(backend: str) -> None:
    listed = set(read_names(allowlist_path(backend)))
    cases = all_cases()
    todo = [n for n in ort_passes() if n not in listed and n in cases]
    random.shuffle(todo)  # with a time budget, a fixed order would never reach the tail
    passing: list[str] = []
    reasons: dict[str, int] = {}
    deadline = time.monotonic() + REPORT_BUDGET_S
    tried = 0
    for name in todo:
        if time.monotonic() > deadline:
            break
        tried += 1
        ok, reason = run_case(cases[name], backend)
        if ok:
            passing.append(name)
        else:
            kind = reason.split(":", 1)[0]
            reasons[kind] = reasons.get(kind, 0) + 1
    passing.sort()

    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    out = CACHE_DIR / f"conformance_{backend}.txt"
    out.write_text("".join(f"{n}\n" for n in passing))
    summary = (
        f"{backend}: {len(passing)} of {tried} tried non-allowlisted cases now pass "
        f"({len(todo) - tried} not reached within {REPORT_BUDGET_S:.0f} s; failures {reasons}); "
        f"names in {out}; add them with: python tools/conformance.py --backend {backend} --write-allowlist"
    )
    print(summary)
    if passing:
        warnings.warn(summary, stacklevel=1)
