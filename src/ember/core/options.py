"""Keyword options checked by name: a typo names itself, the closest valid option, and every valid one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def reject_unknown(where: str, given: Mapping[str, Any], valid: Iterable[str]) -> None:
    """TypeError for the first option in `given` (keywords a function caught in **unknown) that `where` (e.g.
    "load_onnx()") does not take: "load_onnx() got an unexpected option 'autotun' (did you mean 'autotune'?);
    valid options: adapter, autotune, ...". Nothing given: nothing raised."""
    if not given:
        return
    names = sorted(valid)
    bad = sorted(given)
    close = difflib.get_close_matches(bad[0], names, n=1)
    if not close and len(bad[0]) >= 3:  # a part of a long name ('power', 'cache') is as good a hint
        close = [n for n in names if bad[0].lower() in n][:1]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    also = f" (and {', '.join(map(repr, bad[1:]))})" if len(bad) > 1 else ""
    raise TypeError(f"{where} got an unexpected option {bad[0]!r}{hint}{also}; valid options: {', '.join(names)}")
