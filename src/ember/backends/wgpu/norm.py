"""Fused LayerNorm / RMSNorm over contiguous rows: kernels/rows.wgsl, specialised per kind, row length and layout.

One dispatch: a row is read by TY lanes of one workgroup (TX rows per workgroup when rows are short), which
compute the row's statistics (lane sums combined in a fixed order, so results are bitwise reproducible) and
write the normalised row. The launch helpers here are shared with softmax.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import as_f32, from_f32, grid_1d, kernel, sizes_buffer, sizes_decl, storage_type
from .shader.wgsl import PRELUDE, float_literal

if TYPE_CHECKING:
    from .backend import WgpuBackend

WG_MAX = 256
PER_LANE = 4  # elements per lane the launch aims for, before lanes per row reach WG_MAX
CACHE_MAX = 16  # a lane keeps up to this many elements in registers between the passes over its row
LONG_ROW = 16384  # rows this long may take more than WG_MAX lanes
MAX_ROWS_PER_GROUP = WG_MAX  # tests lower it to 1 to launch more than 65,535 workgroups
USE_SUBGROUPS = True  # tests switch this off to cover the workgroup-memory path on a subgroup device

KINDS = ("layernorm", "rmsnorm")

# Shared by the norm and softmax row kernels.
COMPENSATED_SUM = """\
// Neumaier's compensated sum: (sum, compensation).
fn acc(a: vec2<f32>, y: f32) -> vec2<f32> {
    let t = a.x + y;
    let c = select((y - t) + a.x, (a.x - t) + y, abs(a.x) >= abs(y));
    return vec2<f32>(t, a.y + c);
}
// The compensated sum's value; an infinite sum stays itself (its compensation is inf - inf = NaN).
fn total(a: vec2<f32>) -> f32 { return select(a.x + a.y, a.x, is_inf(a.x)); }"""


HEADER = """\
// LayerNorm / RMSNorm. Bindings (group 0): 0 x (read), 1 scale (read), 2 bias (read), 3 out (read_write). scale
// and bias are declared only when the op has them; an input in out's buffer is read through `out` (binding 0
// absent).
// layernorm: two passes in f32 over the row shifted by its first element k, d = x - k (exact for x near k,
// so a large common offset such as 1e4 + noise loses nothing, where even an f32 mean would):
//   m = mean(d), var = mean((d - m)²), out = (d - m) * inverseSqrt(var + EPS) * scale + bias.
// rmsnorm: out = x * inverseSqrt(mean(x²) + EPS) * scale + bias."""
# Runtime sizes: the row count and the offsets of x and out are not constants but values of a uniform array.
RUNTIME_HEADER = """
// Binding 4: sz (uniform): the row count ROWS, x's and out's offsets (runtime sizes, rows_source)."""


def rows_source(be: WgpuBackend, header: str, funcs: str, consts: str, reductions: list[str], decls: str, n: int,
                tx: int, ty: int, rows: int, cpl: int, subgroups: bool, x: View, out: View, body: list[str],
                sizes_binding: int | None = None) -> str:
    """kernels/rows.wgsl filled in: the frame shared by the norm and softmax row kernels. `sizes_binding`: the
    row count and the offsets of x and out read from a uniform array there (runtime_sizes: `runtime_values`)."""
    if sizes_binding is None:
        rows_decl, rows_n, x_off, out_off = f"const ROWS: u32 = {rows}u;", "ROWS", f"{x.offset}u", f"{out.offset}u"
    else:
        rows_decl, rows_n, x_off, out_off = sizes_decl(sizes_binding, 3), "u32(sz[0][0])", "u32(sz[0][1])", \
            "u32(sz[0][2])"
    return be.kernel_source(
        "rows", HEADER=header, PRELUDE=PRELUDE, FUNCS=funcs, BINDINGS=decls, N=n, TX=tx, TY=ty, ROWS_DECL=rows_decl,
        ROWS=rows_n, CPL=cpl, CONSTS=consts, WG=tx * ty, REDUCTIONS="\n\n".join(reductions),
        COMPENSATED_SUM=COMPENSATED_SUM, SG_ARGS=", @builtin(subgroup_size) sg: u32" if subgroups else "",
        X_OFF=x_off, OUT_OFF=out_off, BODY="\n".join(body))


def runtime_values(rows: int, x: View, out: View) -> list[int]:
    """What rows_source(sizes_binding=...) reads: the rows first (the work the grid grows with)."""
    return [rows, x.offset, out.offset]


def _pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launch(be: WgpuBackend, n: int, rows: int | None) -> tuple[int, int, int]:
    """(TX rows per workgroup, TY lanes per row, CPL elements per lane) for rows of n elements. Long rows get up
    to 1,024 lanes (where the device allows), for more loads in flight per row. rows None: a row count read at
    run time, so TX takes no account of it (one kernel for every count)."""
    rows = WG_MAX if rows is None else rows
    lanes = WG_MAX
    if n >= LONG_ROW:
        lanes = max(WG_MAX, min(1024, int(be.limits.get("max-compute-invocations-per-workgroup", WG_MAX)),
                                int(be.limits.get("max-compute-workgroup-size-x", WG_MAX))))
    ty = min(lanes, _pow2ceil(-(-n // PER_LANE)))
    tx = max(1, min(WG_MAX // ty, _pow2ceil(rows), MAX_ROWS_PER_GROUP))
    return tx, ty, -(-n // ty)


def lane_reduce(name: str, combine: str, ty: int, subgroups: bool) -> str:
    """WGSL `fn name(v, lid, ty, sg) -> f32`: `combine` (an expression of a and b) over the TY lanes of a row;
    every lane of the row gets the same bits. Call it from uniform control flow (it has barriers)."""
    head = f"fn {name}(v: f32, lid: u32, ty: u32, sg: u32) -> f32 {{"
    if ty == 1:
        return "\n".join([head, "    return v;", "}"])
    comb = f"fn {name}_op(a: f32, b: f32) -> f32 {{ return {combine}; }}"
    if subgroups:
        # Butterfly within groups of w = min(subgroup, TY) lanes (a row's lanes are adjacent and aligned),
        # then the row's TY / w partials in workgroup memory, summed in index order by every lane.
        body = [
            "    let w = min(sg, TY);",
            "    var s = v;",
            f"    for (var k = w / 2u; k > 0u; k = k / 2u) {{ s = {name}_op(s, subgroupShuffleXor(s, k)); }}",
            "    workgroupBarrier();  // the previous reduction's readers are done with sh",
            "    if ((ty & (w - 1u)) == 0u) { sh[lid / w] = s; }",
            "    workgroupBarrier();",
            "    let first = (lid - ty) / w;",
            "    var t = sh[first];",
            f"    for (var i = 1u; i < TY / w; i++) {{ t = {name}_op(t, sh[first + i]); }}",
            "    return t;",
        ]
    else:
        body = [
            "    workgroupBarrier();  // the previous reduction's readers are done with sh",
            "    sh[lid] = v;",
            "    workgroupBarrier();",
            "    for (var k = TY / 2u; k > 0u; k = k / 2u) {",
            f"        if (ty < k) {{ sh[lid] = {name}_op(sh[lid], sh[lid + k]); }}",
            "        workgroupBarrier();",
            "    }",
            "    return sh[lid - ty];",
        ]
    return "\n".join([comb, head, *body, "}"])


def row_loop(body: list[str], load: str, n: int, ty: int) -> list[str]:
    """Statements running `body` (which sees the element index `i` and value `v`) over this lane's elements: a
    loop over the ones every lane has, free of bounds tests (so the compiler can keep several loads in flight),
    then the last one, which only some lanes have."""
    full, cpl = n // ty, -(-n // ty)
    lines = []
    if full:
        lines += [f"    for (var j = 0u; j < {full}u; j++) {{",
                  "        let i = ty + j * TY;",
                  f"        let v = {load};",
                  *(line[4:] for line in body),
                  "    }"]
    if cpl > full:
        lines += ["    {",
                  f"        let j = {full}u;",
                  "        let i = ty + j * TY;",
                  "        if (i < N) {",
                  f"            let v = {load};",
                  *body,
                  "        }",
                  "    }"]
    return lines


def cache_fill(reads: Reads, xname: str) -> list[str]:
    """Registers `c` holding this lane's elements (a clamped duplicate past the row's end, never used)."""
    return ["    var c: array<f32, CPL>;",
            f"    for (var j = 0u; j < CPL; j++) {{ c[j] = {reads.get(xname, 'xb + min(ty + j * TY, N - 1u)')}; }}"]


def check_rows(x: View, out: View, n: int) -> int:
    """Validate x/out for a row kernel; the number of rows."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("x and out must be contiguous views")
    if x.size != out.size or x.size % n:
        raise ValueError(f"x ({x.size} elements) and out ({out.size}) must be whole rows of n={n}")
    for name, v in (("x", x), ("out", out)):
        if storage_type(v.dtype) not in ("f32", "f16"):
            raise ValueError(f"{name}: a float tensor is needed, got {v.dtype}")
    return x.size // n


def _span(v: View) -> tuple[int, int]:
    return v.offset, max(v.extent(), v.offset + 1)


class Reads:
    """Bindings of the read-only inputs; one in out's buffer is read through `out` (a buffer cannot be bound
    read-only and writable in one dispatch). It must then be out's own window (in place) or not overlap it."""

    def __init__(self, out: View, out_binding: int) -> None:
        self.out, self.out_binding = out, out_binding
        self.decls: list[str] = []
        self.handles: dict[int, int] = {}
        self.types = {"out": storage_type(out.dtype)}  # f32, or f16 storage computed in f32

    def get(self, name: str, index: str) -> str:
        """WGSL f32 expression reading element `index` of binding `name`."""
        return as_f32(f"{name}[{index}]", self.types[name])

    def put(self, index: str, value: str) -> str:
        """WGSL statement writing f32 `value` to out[index]."""
        return f"out[{index}] = {from_f32(value, self.types['out'])};"

    def add(self, binding: int, name: str, v: View, *, in_place_ok: bool) -> str:
        if any(s < 0 for s in v.strides):
            raise NotImplementedError(f"wgpu row kernels: negative strides in {name}")
        if v.handle == self.out.handle:
            (a0, a1), (b0, b1) = _span(v), _span(self.out)
            same = in_place_ok and v.offset == self.out.offset
            if not same and a0 < b1 and b0 < a1:
                raise ValueError(f"{name} overlaps the output window in buffer {v.handle}")
            return "out"
        self.types[name] = storage_type(v.dtype)
        self.decls.append(f"@group(0) @binding({binding}) var<storage, read> {name}: array<{self.types[name]}>;")
        self.handles[binding] = v.handle
        return name

    def bindings(self) -> tuple[str, dict[int, int]]:
        decls = [*self.decls,
                 f"@group(0) @binding({self.out_binding}) var<storage, read_write> out: array<{self.types['out']}>;"]
        return "\n".join(decls), {**self.handles, self.out_binding: self.out.handle}


def _vector(v: View, n: int, arg: str) -> tuple[int, int]:
    """(offset, stride) addressing element i of a View of n elements as offset + i * stride."""
    if v.size != n:
        raise ValueError(f"{arg}: expected {n} elements, got shape {v.shape}")
    if storage_type(v.dtype) not in ("f32", "f16"):
        raise ValueError(f"{arg}: a float tensor is needed, got {v.dtype}")
    dims = [(d, s) for d, s in zip(v.shape, v.strides, strict=True) if d != 1]
    while len(dims) > 1 and dims[-2][1] == dims[-1][0] * dims[-1][1]:  # merge contiguous neighbours
        (d0, _), (d1, s1) = dims[-2], dims.pop()
        dims[-1] = (d0 * d1, s1)
    if len(dims) > 1:
        raise NotImplementedError(f"{arg}: a {len(dims)}-D strided view; pass a 1-D (or contiguous) one")
    return v.offset, dims[0][1] if dims else 0


def _elem(reads: Reads, name: str, off: int, stride: int) -> str:
    if stride == 0:
        return reads.get(name, f"{off}u")
    return reads.get(name, f"{off}u + i{'' if stride == 1 else f' * {stride}u'}")


@kernel("record_norm")
def record_norm(be: WgpuBackend, kind: str, x: View, scale: View | None, bias: View | None, out: View, n: int,
                eps: float, runtime_sizes: bool = False) -> list[Any]:
    """`runtime_sizes`: the row count and the offsets of x and out in a uniform buffer, not in the source (one
    pipeline for every sequence length; the row length n is the model's)."""
    if kind not in KINDS:
        raise ValueError(f"kind: unknown norm {kind!r}; valid: {', '.join(KINDS)}")
    rows = check_rows(x, out, n)
    if rows == 0:
        return []
    reads = Reads(out, 3)
    xname = reads.add(0, "x", x, in_place_ok=True)
    y = "((v - k) - m) * r" if kind == "layernorm" else "v * r"
    if scale is not None:
        off, st = _vector(scale, n, "scale")
        y = f"{y} * {_elem(reads, reads.add(1, 'scale', scale, in_place_ok=False), off, st)}"
    if bias is not None:
        off, st = _vector(bias, n, "bias")
        y = f"{y} + {_elem(reads, reads.add(2, 'bias', bias, in_place_ok=False), off, st)}"
    decls, handles = reads.bindings()

    tx, ty, cpl = launch(be, n, None if runtime_sizes else rows)
    subgroups = USE_SUBGROUPS and "subgroup" in be.features and ty > 1
    cached = cpl <= CACHE_MAX
    load = "c[j]" if cached else reads.get(xname, "xb + i")
    body = [] if subgroups else ["    let sg = 0u;"]
    if cached:
        body += cache_fill(reads, xname)
    if kind == "layernorm":
        body += [f"    let k = {reads.get(xname, 'xb')};", "    var a = vec2<f32>(0.0, 0.0);"]
        body += row_loop(["            a = acc(a, v - k);"], load, n, ty)
        body += ["    let m = row_sum(total(a), lid, ty, sg) / NF;", "    var b = vec2<f32>(0.0, 0.0);"]
        body += row_loop(["            let d = (v - k) - m;", "            b = acc(b, d * d);"], load, n, ty)
        body += ["    let r = inverseSqrt(row_sum(total(b), lid, ty, sg) / NF + EPS);"]
    else:
        body += ["    var a = vec2<f32>(0.0, 0.0);"]
        body += row_loop(["            a = acc(a, v * v);"], load, n, ty)
        body += ["    let r = inverseSqrt(row_sum(total(a), lid, ty, sg) / NF + EPS);"]
    body += ["    if (!valid) { return; }"]
    body += row_loop([f"            {reads.put('ob + i', y)}"], load, n, ty)

    consts = (f"const NF: f32 = {float_literal(float(n))};  // N as f32\n"
              f"const EPS: f32 = {float_literal(eps)};")
    header = HEADER + RUNTIME_HEADER if runtime_sizes else HEADER
    src = rows_source(be, header, "", consts, [lane_reduce("row_sum", "a + b", ty, subgroups)], decls, n, tx, ty,
                      rows, cpl, subgroups, x, out, body, 4 if runtime_sizes else None)
    if runtime_sizes:
        handles = {**handles, 4: sizes_buffer(be, runtime_values(rows, x, out))}
    label = f"norm:{kind}"
    return [be.dispatch(be.pipeline(label, src), handles, grid_1d(-(-rows // tx)), label)]
