"""Pages generated at build time by mkdocs-gen-files (mkdocs.yml): nothing written here is committed.

- settings.md: every EMBER_* setting, from `ember.settings.REGISTRY`.
- ops.md: every registered op (`ember.ops.REGISTRY`) with the dtypes its ONNX schema allows, split by what each
  backend can store (cpu: numpy's own dtypes; wgpu: those `ember.backends.wgpu.program.storage_type` accepts), and
  the ONNX ops with no implementation.

Run on its own (`python docs/gen/pages.py`) it prints both pages instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

# The ember of this checkout, whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.defs  # noqa: E402
from onnx import helper  # noqa: E402

import ember  # noqa: E402
import ember.ops  # noqa: E402
from ember import settings  # noqa: E402
from ember.backends.wgpu.program import storage_type  # noqa: E402

DOMAIN_NAMES = {"": "ai.onnx"}
# ONNX type strings ("tensor(float)") name element types by their TensorProto enum names, lowercased.
ELEM_TYPES = {onnx.TensorProto.DataType.Name(v).lower(): v for v in onnx.TensorProto.DataType.values() if v}
# Listing order: the usual numeric types by family and width, then the rest alphabetically.
ORDER = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float", "double",
         "complex64", "complex128"]


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------- settings


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        "Every knob ember reads from the environment, generated from `ember.settings.REGISTRY` when the site is "
        "built. A setting is read when it is used, so it can change between loads. In code and tests, scope values "
        "with `ember.settings.override(KEY=value, ...)` (the *key* column) instead of setting the environment:",
        "",
        "```python",
        "with ember.settings.override(winograd=0, autotune=False):",
        "    model = ember.load_onnx(path)",
        "```",
        "",
        "A malformed value raises `ValueError` naming the variable. A default of *—* means the setting is decided at "
        "run time when unset (its meaning says by what). `python -m ember.settings` prints the same table.",
        "",
        "| variable | key | type | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in settings.REGISTRY.values():
        default = "—" if s.default is None else str(s.default)
        if isinstance(s.default, bool):
            default = default.lower()
        lines.append(f"| `{s.env}` | `{s.key}` | {cell(s.type_name)} | {cell(default)} | {cell(s.doc)} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- op support


def _np_dtype(type_str: str) -> np.dtype | None:
    """The numpy dtype of an ONNX tensor type string, or None for a sequence/map/optional or unknown type."""
    if not (type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    elem = ELEM_TYPES.get(type_str[len("tensor("):-1])
    if elem is None:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        return None


def _on_cpu(dt: np.dtype) -> bool:
    """The cpu backend stores a dtype as numpy does (`storage_itemsize` is the itemsize): numpy's own numbers, not
    strings (object arrays) nor the ml_dtypes types onnx maps bfloat16, float8 and int4 to."""
    return dt.isbuiltin == 1 and dt.kind in "biufc"


def _on_wgpu(dt: np.dtype) -> bool:
    try:
        storage_type(dt)
    except NotImplementedError:
        return False
    return _on_cpu(dt)


def _short(type_str: str) -> str:
    return type_str[len("tensor("):-1] if type_str.startswith("tensor(") and type_str.endswith(")") else type_str


def _order(type_str: str) -> tuple[int, str]:
    short = _short(type_str)
    return (ORDER.index(short), "") if short in ORDER else (len(ORDER), short)


def _split(types: list[str], keep: Callable[[np.dtype], bool]) -> tuple[list[str], list[str]]:
    """The tensor element types `keep` accepts, and the rest (sequence, optional and map types as one word each)."""
    yes, no, other = [], [], []
    for t in types:
        if not t.startswith("tensor("):
            kind = t.split("(", 1)[0]
            other += [] if kind in other else [kind]
            continue
        dt = _np_dtype(t)
        (yes if dt is not None and keep(dt) else no).append(_short(t))
    return yes, no + [f"{kind} types" for kind in other]


def _schema(domain: str, op_type: str) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, domain)
    except onnx.defs.SchemaError:
        return None


def ops_page() -> str:
    registry = ember.ops.REGISTRY
    lines = [
        "# Op support",
        "",
        f"Every op ember registers ({len(registry)} op types), generated from `ember.ops.REGISTRY` when the site is "
        f"built, against the ONNX schemas of the installed onnx {onnx.__version__}.",
        "",
        "!!! note \"What this table says, and what it does not\"",
        "    ember declares no per-op dtype support in code. An op class is backend-neutral: it records its work "
        "through the `ComputeBackend` contract, so every op below is registered for **both** the cpu and the wgpu "
        "backend, and a backend that cannot run one node (an attribute, a dtype) refuses it with "
        "`NotImplementedError` when the model is loaded.",
        "",
        "    The dtype columns are therefore derived, not tested: they list the element types the op's ONNX schema "
        "(its newest version) allows, split by what each backend can *store*. cpu: numpy's own numeric "
        "types (bool, integers, floats, complex), not strings nor bfloat16, float8 or int4. wgpu: the same less "
        "what its `storage_type` refuses (float64, complex); integers, int64 included, are stored as 32-bit "
        "(see [Limits](limits.md)). Whether an op's kernels handle every listed dtype is what the ONNX node "
        "conformance allowlists check (`tests/conformance/allowlist_cpu.txt`, `allowlist_wgpu.txt`). Types use "
        "ONNX's names (`float` is float32, `double` float64).",
        "",
        "*versions*: the opsets ember has an implementation `since` (each serves every later opset until the next). "
        "*f16*: every kernel the op records stores float16, so `precision=\"f16\"` keeps it in float16 (otherwise it "
        "runs on float32 copies of its inputs). Domain `ai.ember` ops are ember's own fused nodes, made by the "
        "load-time graph passes; they have no ONNX schema.",
        "",
    ]
    by_domain: dict[str, list[tuple[str, list]]] = {}
    for (domain, op_type), classes in registry.items():
        by_domain.setdefault(domain, []).append((op_type, classes))
    for domain in sorted(by_domain, key=lambda d: (d != "", d)):
        lines += [f"## {DOMAIN_NAMES.get(domain, domain)}", "",
                  "| op | versions | f16 | schema | cpu dtypes | wgpu dtypes | on neither backend |",
                  "|---|---|---|---|---|---|---|"]
        for op_type, classes in sorted(by_domain[domain]):
            versions = ", ".join(str(c.since) for c in classes)
            f16 = "yes" if classes[-1].f16 else ""
            schema = _schema(domain, op_type)
            if schema is None:
                lines.append(f"| {op_type} | {versions} | {f16} | — | | | |")
                continue
            types = sorted({t for c in schema.type_constraints for t in c.allowed_type_strs}, key=_order)
            cpu, neither = _split(types, _on_cpu)
            wgpu, _ = _split(types, _on_wgpu)
            lines.append(f"| {op_type} | {versions} | {f16} | {schema.since_version} | {', '.join(cpu)} | "
                         f"{', '.join(wgpu)} | {', '.join(neither)} |")
        lines.append("")
    missing = sorted({(s.domain, s.name) for s in onnx.defs.get_all_schemas()
                      if s.domain in ("", "ai.onnx.ml") and not s.deprecated} - set(registry))
    lines += ["## ONNX ops ember does not run", "",
              f"Ops of the ai.onnx and ai.onnx.ml domains in onnx {onnx.__version__} with no ember implementation "
              f"({len(missing)}): a model using one is refused at load with `NotImplementedError` listing every such "
              "node.", ""]
    for domain in ("", "ai.onnx.ml"):
        names = [name for d, name in missing if d == domain]
        if names:
            lines += [f"- **{DOMAIN_NAMES.get(domain, domain)}**: " + ", ".join(names)]
    lines.append("")
    return "\n".join(lines)


PAGES = {"settings.md": settings_page, "ops.md": ops_page}


def main() -> None:
    import mkdocs_gen_files

    for name, make in PAGES.items():
        with mkdocs_gen_files.open(name, "w") as f:
            f.write(make())
        mkdocs_gen_files.set_edit_path(name, "gen/pages.py")


if "mkdocs_gen_files" in sys.modules:  # run by the plugin (runpy.run_path) during a build
    main()
elif __name__ == "__main__":
    for make in PAGES.values():
        print(make())
