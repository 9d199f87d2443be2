"""cpu backend: numpy, with every step prepared at record time.

Recording builds typed strided views of the allocations once; a step is a closure that computes into its
output view, so replaying a plan allocates nothing but numpy's temporaries.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...core.expr import Expr, call, eval_numpy, inp
from ...core.view import View
from ..base import ComputeBackend, OutOfMemoryError
from . import native, parallel, winograd
from .inplace import compile_inplace

Step = Callable[[], None]


class _Scratch:
    """One buffer shared by every im2col step of a backend, so that it stays in cache between convs. A step
    holds the lock while it uses the buffer: plans on one backend may run in several threads."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by a plan run inside a step (execute holds it throughout)
        self.buf = np.empty(0, np.uint8)

    def reserve(self, nbytes: int) -> None:
        with self.lock:
            if self.buf.nbytes < nbytes:
                self.buf = np.empty(nbytes, np.uint8)  # steps bound to the old one rebind on their next run


class CpuBackend(ComputeBackend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self._mem: dict[int, np.ndarray] = {}
        self._scratch = _Scratch()

    def _init_device(self) -> None:
        pass

    # ---- memory -----------------------------------------------------------------------------------
    def _device_alloc(self, handle: int, nbytes: int) -> None:
        try:
            # 8-byte rounding keeps every typed view (int64, float64) of the allocation whole.
            self._mem[handle] = np.zeros(-(-nbytes // 8) * 8, np.uint8)
        except MemoryError as e:
            raise OutOfMemoryError(f"cpu backend: cannot allocate {nbytes} bytes") from e

    def _device_free(self, handle: int) -> None:
        del self._mem[handle]

    def _device_write(self, handle: int, offset: int, data: memoryview) -> None:
        self._mem[handle][offset:offset + data.nbytes] = np.frombuffer(data, np.uint8)

    def _device_read(self, handle: int, offset: int, nbytes: int) -> memoryview:
        return memoryview(self._mem[handle][offset:offset + nbytes])

    def _device_synchronize(self) -> None:
        pass

    def storage_itemsize(self, dtype: Any) -> int:
        return np.dtype(dtype).itemsize

    def upload(self, handle: int, array: np.ndarray) -> None:
        self._device_write(handle, 0, memoryview(np.ascontiguousarray(array)).cast("B"))

    def download(self, view: View) -> np.ndarray:
        return self.array(view).copy()

    def record_copy(self, src: int, dst: int, nbytes: int) -> list[Step]:
        a, b = self._mem[src], self._mem[dst]

        def step() -> None:
            b[:nbytes] = a[:nbytes]

        return [step]

    def execute(self, steps: list) -> None:
        # Products run on the pool's threads, one OpenBLAS thread each (parallel.one_blas_thread): OpenBLAS's
        # own workers, once woken, spin between products and would take the core from the pool's.
        pool = parallel.blas_pool()
        if pool is None:
            for step in steps:
                step()
            return
        # The steps' parallel regions as one (Pool.run_program): a barrier between two, not a hand-off to the
        # workers and back. The scratch stays locked throughout (the steps' own locking is bypassed).
        # Two consecutive steps that touch disjoint memory (their `access`) share one region.
        with parallel.one_blas_thread(), self._scratch.lock:
            items: list = []
            last: tuple[parallel.Access, int] | None = None  # the previous step's access, where its items start
            for step in steps:
                program = getattr(step, "program", None)
                part = program() if program is not None else [parallel.OnCaller(step)]
                access = getattr(step, "access", None)
                if last is not None and access is not None and not access.conflicts(last[0]):
                    merged = parallel.merge_regions(items[last[1]:], part)
                    if merged is not None:
                        items[last[1]:] = merged
                        last = None  # two at most: a third would have to be checked against both
                        continue
                last = (access, len(items)) if access is not None else None
                items += part
            pool.run_program(items)

    def array(self, v: View) -> np.ndarray:
        """A numpy view (no copy) of a View."""
        buf = self._mem[v.handle]
        item = v.dtype.itemsize
        need = v.extent() * item
        lowest = v.offset + sum((d - 1) * st for d, st in zip(v.shape, v.strides, strict=True) if st < 0 and d > 0)
        if need > buf.nbytes or lowest < 0:
            raise ValueError(f"view {v.shape}/{v.strides}+{v.offset} reaches outside allocation {v.handle} "
                             f"of {buf.nbytes} bytes")
        usable = buf.nbytes // item * item
        base = buf[:usable].view(v.dtype)
        return as_strided(base[v.offset:], v.shape, [s * item for s in v.strides])

    # ---- primitives -------------------------------------------------------------------------------
    def record_elementwise(self, expr: Expr, inputs: list[View], out: View) -> list[Step]:
        ins = [self.array(v) for v in inputs]
        dst = self.array(out)
        float_dtype = next((a.dtype for a in ins if a.dtype.kind == "f"), dst.dtype if dst.dtype.kind == "f"
                           else np.dtype(np.float32))
        int_dtype = next((a.dtype for a in ins if a.dtype.kind in "iu"), np.dtype(np.int64))
        if expr.indexed():
            int_dtype = np.dtype(np.int64)  # index arithmetic must not wrap in a narrow data dtype
        shape = out.shape
        fast = compile_inplace(expr, ins, dst)
        if fast is not None:
            return [fast]

        def step() -> None:
            dst[...] = eval_numpy(expr, ins, float_dtype, int_dtype, shape)

        return [step]

    def record_matmul(self, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                      beta: float = 1.0, act: Expr | None = None) -> list[Step]:
        av, bv, dst = self.array(a), self.array(b), self.array(out)
        # beta = 0 ignores the bias entirely, NaN included (BLAS semantics, as the wgpu kernels do).
        cv = self.array(bias.broadcast_to(out.shape)) if bias is not None and beta != 0.0 else None
        if a.shape[0] == 1:
            # numpy hands 2-D products to BLAS; a stride-0 batch dim of 1 would send it to a slow loop.
            av, bv, dst = av[0], bv[0], dst[0]
            cv = cv[0] if cv is not None else None
        dt = dst.dtype
        alpha_ = dt.type(alpha)
        beta_ = dt.type(beta)
        if not any(np.may_share_memory(dst, v) for v in (av, bv, cv) if v is not None):
            # The product lands in the output and the epilogue runs there in place: no temporaries.
            def direct(av: np.ndarray, bv: np.ndarray, cv: np.ndarray | None, dst: np.ndarray) -> Step:
                epilogue = _epilogue(act, dst)
                scaled = np.empty_like(dst) if cv is not None and beta != 1.0 else None

                def run() -> None:
                    np.matmul(av, bv, out=dst)
                    if alpha != 1.0:
                        np.multiply(dst, alpha_, out=dst)
                    if scaled is not None:
                        np.add(dst, np.multiply(cv, beta_, out=scaled), out=dst)
                    elif cv is not None:
                        np.add(dst, cv, out=dst)
                    if epilogue is not None:
                        epilogue()

                return run

            pool = parallel.blas_pool()
            m_, k_, n_ = av.shape[-2], av.shape[-1], bv.shape[-1]
            if pool is None or dst.size == 0 or dst.size // (m_ * n_) * m_ * n_ * k_ < _SPLIT_MACS:
                return [direct(av, bv, cv, dst)]
            # Parts of the output over the pool's threads: batch, else the longer of rows and columns (a wide
            # product's threads then each read part of the weight).
            axis = 0 if dst.ndim == 3 and dst.shape[0] >= pool.size else (-2 if m_ >= n_ else -1)

            def part(v: np.ndarray | None, lo: int, hi: int, dim: int) -> np.ndarray | None:
                if v is None:
                    return None
                ix = [slice(None)] * v.ndim
                ix[dim] = slice(lo, hi)
                return v[tuple(ix)]

            tasks = []
            for lo, hi in _chunks(dst.shape[axis], pool.size):
                a_ = av if axis == -1 else part(av, lo, hi, axis)
                b_ = bv if axis == -2 else part(bv, lo, hi, axis)
                tasks.append(direct(a_, b_, part(cv, lo, hi, axis), part(dst, lo, hi, axis)))
            return [functools.partial(pool.run, tasks)]

        def step() -> None:
            r = np.matmul(av, bv)
            if alpha != 1.0:
                r *= alpha_
            if cv is not None:
                r += cv * beta_ if beta != 1.0 else cv
            if act is not None:
                r = eval_numpy(act, [r], dt)
            dst[...] = r

        return [step]

    conv_residual = True

    def record_conv(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                    act: Expr | None = None, residual: View | None = None, const_weight: bool = False
                    ) -> list[Step]:
        xv, wv, dst = self.array(x), self.array(w), self.array(out)
        # With a residual, the parts add their bias only; one pass over the output then adds the residual and
        # applies the activation (Winograd convs fold both into their last pass instead).
        first = last = None
        if residual is not None:
            first, last = _residual_pass(act, dst, self.array(residual))
            act = None
        bv = self.array(bias).reshape(-1, 1, 1) if bias is not None else None
        n, c, h, wd = x.shape
        k, cg, r, s = w.shape
        _, _, p, q = out.shape
        sh, sw = stride
        kg, kk = k // groups, cg * r * s
        pool = parallel.pool()
        threads = pool.size if pool is not None else 1
        # Products split over the pool's threads (each with one OpenBLAS thread), by output channels where the
        # weight outweighs the columns (each thread then reads half of it), else by columns or rows of output.
        bpool = parallel.blas_pool()
        parts = bpool.size if bpool is not None and n * k * p * q * cg * r * s >= _SPLIT_MACS else 1
        by_k = k // groups >= parts and k // groups * groups > n * p * q
        secs = n * k * p * q * cg * r * s / parallel.MACS_PER_S  # one thread's time for the products (spans)
        b2 = self.array(bias).reshape(-1, 1) if bias is not None else None
        b1 = b2.reshape(-1) if b2 is not None else None

        def finish(o: np.ndarray, ch: slice) -> Step:
            """Bias add and activation in place on o, output channels `ch` of one image (depthwise)."""
            b = bv[ch] if bv is not None else None
            epilogue = _epilogue(act, o)

            def run() -> None:
                if b is not None:
                    np.add(o, b, out=o)
                if epilogue is not None:
                    epilogue()

            return run

        def product(wm: np.ndarray, cols: np.ndarray, o2: np.ndarray, ch: slice) -> Step:
            """One BLAS product into the output matrix o2 (channels `ch` by positions), then its bias and
            activation."""
            b = b2[ch] if b2 is not None else None
            epilogue = _epilogue(act, o2)

            def run() -> None:
                np.matmul(wm, cols, out=o2)
                if b is not None:
                    np.add(o2, b, out=o2)
                if epilogue is not None:
                    epilogue()

            return run

        def products(wm: np.ndarray, cols: np.ndarray, o2: np.ndarray, k0: int, split: int) -> list[Step]:
            """product() over `split` parts of the output channels (by_k) or of the columns."""
            if by_k:
                return [product(wm[a:b], cols, o2[a:b], slice(k0 + a, k0 + b))
                        for a, b in _chunks(len(wm), split, secs)]
            return [product(wm, cols[:, a:b], o2[:, a:b], slice(k0, k0 + len(wm)))
                    for a, b in _chunks(cols.shape[1], split, secs)]

        def run_tasks(tasks: list[Step]) -> list[Step]:
            return [parallel.Region(bpool, tasks)] if len(tasks) > 1 and bpool is not None else tasks

        # `build` makes the step's parts, given the scratch buffer where the conv uses it.
        scratch: _Scratch | None = None
        # The compiled kernels pack the weight once, here: only for a weight that stays the same (const_weight).
        native_ok = const_weight and native.available() and xv.dtype == np.float32
        native_direct = native_ok and DIRECT_NATIVE and groups == 1 and dilation == (1, 1) and r * s > 1 and sw <= 2
        if groups == c and cg == 1 and k == c:
            # Depthwise: shifted multiply-adds over bands of channels, each small enough (~64K outputs) that
            # its 2 * r * s passes stay in the core's cache; a multiple of `threads` bands keeps cores even.
            bands = -(-n * c * p * q // 65536)
            bands = -(-bands // threads) * threads
            # The compiled depthwise kernel (native.py) fuses the bias and an activation that is a clamp (Relu,
            # Clip, none), and reads the weight as it runs.
            bounds = _clamp_bounds(act)
            planes = xv.strides[2:] == (4 * wd, 4) and dst.strides[2:] == (4 * q, 4)
            fused = (bounds is not None and dilation == (1, 1) and sw <= 2 and xv.dtype == np.float32 and planes
                     and wv.flags.c_contiguous and native.available())

            def build(_: np.ndarray | None) -> list[Step]:
                tasks = []
                for c0, c1 in _chunks(c, bands):
                    if fused:
                        assert bounds is not None
                        tasks.append(self._depthwise(
                            xv[:, c0:c1], wv[c0:c1], dst[:, c0:c1], (r, s), stride, pads, dilation,
                            (b1[c0:c1] if b1 is not None else None, *bounds)))
                        continue
                    run = self._depthwise(xv[:, c0:c1], wv[c0:c1], dst[:, c0:c1], (r, s), stride, pads, dilation)
                    tasks.append(_seq(run, *(finish(dst[i, c0:c1], slice(c0, c1)) for i in range(n))))
                return [parallel.Region(pool, tasks)] if pool is not None else tasks
        elif groups == 1 and r == s == 1 and sh == sw == 1 and not any(pads):
            # 1x1: the input already is the product's right-hand matrix.
            wmat, xmat = wv.reshape(k, c), xv.reshape(n, c, h * wd)
            omat = dst.reshape(n, k, p * q)

            def build(_: np.ndarray | None) -> list[Step]:
                per = 1 if n >= parts else parts
                return run_tasks([t for i in range(n) for t in products(wmat, xmat[i], omat[i], 0, per)])
        elif groups == 1 and r == s == 1 and not any(pads):
            # 1x1 strided (a ResNet shortcut): each task copies the input positions it reads (all, where it
            # takes a range of output channels; else its rows of them) into memory of its own and multiplies
            # that. No im2col and no shared scratch, so the step may share a parallel region with a sibling conv
            # reading the same input (see execute).
            wmat, omat = wv.reshape(k, c), dst.reshape(n, k, p * q)
            sub = xv[:, :, ::sh, ::sw][:, :, :p, :q]

            def strided(i: int, k0: int, k1: int, p0: int, p1: int) -> Step:
                own = np.empty((c, p1 - p0, q), xv.dtype)
                mul = product(wmat[k0:k1], own.reshape(c, -1), omat[i, k0:k1, p0 * q:p1 * q], slice(k0, k1))
                return _seq(functools.partial(np.copyto, own, sub[i, :, p0:p1]), mul)

            def build(_: np.ndarray | None) -> list[Step]:
                if n >= parts:
                    tasks = [strided(i, 0, k, 0, p) for i in range(n)]
                elif by_k:
                    tasks = [strided(i, k0, k1, 0, p) for i in range(n) for k0, k1 in _chunks(k, parts, secs)]
                else:
                    tasks = [strided(i, 0, k, p0, p1) for i in range(n) for p0, p1 in _chunks(p, parts, secs)]
                return run_tasks(tasks)
        elif native_direct:
            # The compiled direct conv (native.conv_step): no column matrix, the im2col runs a block of output
            # columns at a time inside the call. Each task copies the input rows it reads into a padded buffer
            # of its own, computes its part channels-last (bias, and an activation that is a clamp, fused), and
            # copies it transposed into the output. Split by output channels (32-row panels of the packed weight)
            # where the weight outweighs the columns, else by images, else by bands of output rows.
            bounds = _clamp_bounds(act)
            panels = -(-k // native.MR)
            if by_k and parts > 1 and panels >= parts:
                splits = [((0, n), (a * native.MR, min(k, b * native.MR)), (0, p))
                          for a, b in _chunks(panels, parts, secs)]
            elif n >= parts:
                splits = [((a, b), (0, k), (0, p)) for a, b in _chunks(n, parts, secs)]
            else:
                splits = [((0, n), (0, k), band) for band in _chunks(p, parts, secs)]
            packs = {ks: native.pack(wv.reshape(k, kk)[ks[0]:ks[1]]) for _, ks, _ in splits}

            def direct(images: tuple[int, int], ks: tuple[int, int], rows: tuple[int, int]) -> Step:
                (i0, i1), (k0, k1), (p0, p1) = images, ks, rows
                xp, inside, (xa, xb) = _padded_rows(xv, pads, sh, r, p0, p1)
                y = np.empty((p1 - p0, q, k1 - k0), xv.dtype)
                conv = native.conv_step(packs[ks], xp, (r, s), stride, y, b1[k0:k1] if b1 is not None else None,
                                        *(bounds or ()))
                yt = y.transpose(2, 0, 1)
                steps: list[Step] = []
                for i in range(i0, i1):
                    out_i = dst[i, k0:k1, p0:p1]
                    steps += [functools.partial(np.copyto, inside, xv[i, :, xa:xb]), conv,
                              functools.partial(np.copyto, out_i, yt)]
                    if bounds is None:
                        steps.append(_epilogue(act, out_i))
                return _seq(*steps)

            def build(_: np.ndarray | None) -> list[Step]:
                return run_tasks([direct(*split) for split in splits])
        else:
            # im2col, then products writing the output in place. The column matrices live in the backend's
            # shared scratch buffer: ResNet-18's would take 40 MB apart, each written cold (2.5 ms a run).
            # Split over threads by bands of output rows, each band's im2col and products one task; or, where the
            # weight outweighs the columns, by input channels (the product's K): each thread fills its channels'
            # columns and multiplies them into a partial output of its own (the first straight into the output),
            # then one pass sums the partials and adds the bias. Against a split by output channels (im2col
            # first, whole, on one thread), the im2col runs split too: ResNet-18's 7x7 x 512 convs went from
            # 1.89 to 1.63 ms (2 cores). Grouped convs still split by output channels.
            scratch = self._scratch
            r_ext = (r - 1) * dilation[0] + 1
            by_c = by_k and groups == 1 and parts > 1 and c >= parts
            row_bands = [(0, p)] if by_k or parts == 1 else _chunks(p, parts, secs)
            partials = (parts - 1) * n * k * p * q if by_c else 0
            scratch.reserve((n * groups * kk * (p + len(row_bands)) * q + partials) * xv.dtype.itemsize)
            wmat = wv.reshape(groups, kg, kk)
            c_parts = _chunks(c, parts, secs) if by_c else []
            # Each input-channel part's slice of the weight, packed once here for the compiled GEMM (native.py):
            # OpenBLAS would pack it from memory on every run.
            # It wins where the columns are few (layer 4 at batch 1, 49: 1.2-1.4x OpenBLAS's speed a thread); with
            # 196 and more OpenBLAS's packing pays for itself (bench/bench_cpu_native.py).
            packed = ([native.pack(wmat[0, :, c0 * r * s:c1 * r * s]) for c0, c1 in c_parts]
                      if by_c and p * q <= native.MAX_COLUMNS and native_ok else None)

            def build(buf: np.ndarray | None) -> list[Step]:
                assert buf is not None
                if by_c:
                    return by_channels(buf)
                tasks, off = [], 0
                for p0, p1 in row_bands:
                    (a, b), (top, bottom) = _row_band(h, pads[0], sh, r_ext, p0, p1)
                    pb = p1 - p0
                    size = n * groups * kk * pb * q
                    cols = buf.view(xv.dtype)[off: off + size].reshape(n, groups, kk, pb * q)
                    off += size
                    c6 = cols.reshape(n, c, r, s, pb, q)
                    ob = dst[:, :, p0:p1].reshape(n, groups, kg, pb * q)
                    assert np.may_share_memory(ob, dst)
                    fill = _im2col(xv[:, :, a:b], c6, stride, (top, pads[1], bottom, pads[3]), dilation)
                    prods = [t for i in range(n) for g in range(groups)
                             for t in products(wmat[g], cols[i, g], ob[i, g], g * kg, parts if by_k else 1)]
                    tasks += [fill, *run_tasks(prods)] if by_k or len(row_bands) == 1 else [_seq(fill, *prods)]
                return tasks if by_k or len(row_bands) == 1 else run_tasks(tasks)

            def by_channels(buf: np.ndarray) -> list[Step]:
                size = n * kk * p * q
                cols = buf.view(xv.dtype)[:size].reshape(n, kk, p * q)
                rest = buf.view(xv.dtype)[size: size + partials].reshape(parts - 1, n, k, p * q)
                omat = dst.reshape(n, k, p * q)
                assert np.may_share_memory(omat, dst)
                outs = [omat, *rest]
                c6 = cols.reshape(n, c, r, s, p, q)
                tasks = []
                for t, (c0, c1) in enumerate(c_parts):
                    fill = _im2col(xv[:, c0:c1], c6[:, c0:c1], stride, pads, dilation)
                    k0, k1 = c0 * r * s, c1 * r * s
                    if packed is not None:
                        muls = [native.gemm_step(packed[t], cols[i, k0:k1], outs[t][i]) for i in range(n)]
                    else:
                        muls = [functools.partial(np.matmul, wmat[0, :, k0:k1], cols[i, k0:k1], out=outs[t][i])
                                for i in range(n)]
                    tasks.append(_seq(fill, *muls))
                epilogue = _epilogue(act, omat)

                def total() -> None:
                    for o in rest:
                        np.add(omat, o, out=omat)
                    if b2 is not None:
                        np.add(omat, b2, out=omat)
                    if epilogue is not None:
                        epilogue()

                return [*run_tasks(tasks), total]

        step = _scratch_step(scratch, build, first, last)
        res_v = self.array(residual) if residual is not None else None
        step.access = parallel.Access([xv, wv, bv, res_v], [dst], scratch is not None)  # type: ignore[attr-defined]
        return [step]

    def conv_maxpool_fits(self, xshape: tuple[int, ...], wshape: tuple[int, ...], out_shape: tuple[int, ...],
                          groups: int) -> bool:
        # Convs that record_conv splits by bands of output rows (more output positions than channels, not 1x1):
        # a ResNet stem. Their max pooling then runs in the same bands.
        n, k, p, q = out_shape
        return groups == 1 and wshape[2:] != (1, 1) and n * p * q >= k

    def record_conv_maxpool(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                            pads: tuple[int, int, int, int], dilation: tuple[int, int], act: Expr | None,
                            conv_hw: tuple[int, int], kernel: tuple[int, int], pool_stride: tuple[int, int],
                            pool_pads: tuple[int, int, int, int], pool_dilation: tuple[int, int],
                            const_weight: bool = False) -> list[Step]:
        """The conv by bands of rows as record_conv does, each band followed by its rows of the max pooling, in
        one parallel region: a band computes the conv rows its pooling rows read (the one row two bands share,
        twice) into memory of its own. Separately, ResNet-18's stem and pooling were two regions, and the
        pooling read the stem's 3.2 MB output back from memory (0.38 ms, 2 threads)."""
        xv, wv, dst = self.array(x), self.array(w), self.array(out)
        n, c, h, wd = x.shape
        k, _, r, s = w.shape
        p, q = conv_hw
        kk = c * r * s
        oh = out.shape[2]
        (kh, kw), (psh, psw), (ppt, ppl, _, ppr), (pdh, pdw) = kernel, pool_stride, pool_pads, pool_dilation
        pool = parallel.blas_pool()
        parts = pool.size if pool is not None and n * k * p * q * kk >= _SPLIT_MACS else 1
        secs = n * k * p * q * kk / parallel.MACS_PER_S
        r_ext, p_ext = (r - 1) * dilation[0] + 1, (kh - 1) * pdh + 1
        # Per band: its pooling rows [i0, i1), the conv rows [a, b) they read and the pooling's padding there.
        bands = [(i0, i1, *_row_band(p, ppt, psh, p_ext, i0, i1)) for i0, i1 in _chunks(oh, parts, secs)]
        scratch = self._scratch
        wmat = wv.reshape(k, kk)
        b2 = self.array(bias).reshape(-1, 1) if bias is not None else None
        # Where every window holds input (pads smaller than the window), max and relu commute.
        holds_input = max(pool_pads[0], pool_pads[2]) < p_ext and max(ppl, ppr) < (kw - 1) * pdw + 1
        relu_after = holds_input and act is not None and act.op == "relu" and act.args[0].op == "in"

        def band(buf: np.ndarray, off: int, i0: int, i1: int, a: int, b: int, top: int, bottom: int) -> Step:
            pb = b - a
            cols = buf.view(xv.dtype)[off: off + n * kk * pb * q].reshape(n, kk, pb * q)
            conv = np.empty((n, k, pb, q), xv.dtype)  # the band's own: bands share a row
            rows = np.empty((n, k, i1 - i0, q), xv.dtype)
            (xa, xb), (ctop, cbot) = _row_band(h, pads[0], stride[0], r_ext, a, b)
            fill = _im2col(xv[:, :, xa:xb], cols.reshape(n, c, r, s, pb, q), stride, (ctop, pads[1], cbot, pads[3]),
                           dilation)
            o2 = conv.reshape(n, k, pb * q)
            # max(relu(a), relu(b)) = relu(max(a, b)): a Relu runs on the pooled rows, a quarter of the conv's.
            epilogue = _epilogue(act, dst[:, :, i0:i1] if relu_after else conv)
            down = _max_pool(conv, rows, (kh, 1), (psh, 1), (top, 0, bottom, 0), (pdh, 1))
            across = _max_pool(rows, dst[:, :, i0:i1], (1, kw), (1, psw), (0, ppl, 0, ppr), (1, pdw))

            def run() -> None:
                fill()
                for i in range(n):
                    np.matmul(wmat, cols[i], out=o2[i])
                if b2 is not None:
                    np.add(o2, b2, out=o2)
                if epilogue is not None and not relu_after:
                    epilogue()
                down()
                across()
                if epilogue is not None and relu_after:
                    epilogue()

            return run

        # The compiled direct conv fuses an activation that is a clamp: monotonic, so it commutes with the max.
        bounds = _clamp_bounds(act)
        packed = (native.pack(wmat) if const_weight and native.available() and xv.dtype == np.float32
                  and dilation == (1, 1) and bounds is not None else None)
        bias_v = self.array(bias).reshape(-1) if bias is not None else None
        if packed is None:
            scratch.reserve(sum(n * kk * (b - a) * q for _, _, (a, b), _ in bands) * xv.dtype.itemsize)

        def native_band(i0: int, i1: int, a: int, b: int, top: int, bottom: int) -> Step:
            """The band through the compiled direct conv (native.conv_step), an image at a time (its buffers are
            one image's, whatever the batch): the image's input rows copied into a padded buffer of the band's
            own (the padding zeros written once, here), the conv with bias and activation into channels-last
            rows (no column matrix: the im2col runs a block of columns at a time in cache), then the pooling over
            those rows and one transposing copy into the output's rows."""
            assert packed is not None and bounds is not None
            xp, inside, (xa, xb) = _padded_rows(xv, pads, stride[0], r, a, b)
            conv = np.empty((b - a, q, k), xv.dtype)
            rows = np.empty((i1 - i0, q, k), xv.dtype)
            pooled = np.empty((i1 - i0, dst.shape[3], k), xv.dtype)
            conv_one = native.conv_step(packed, xp, (r, s), stride, conv, bias_v, *bounds)
            # The pooling on (K, rows, cols) views of channels-last buffers, then one transposing copy into the
            # output: pooling straight into the output's NCHW rows took 0.36 ms a band against 0.12 + 0.07.
            down = _max_pool(conv.transpose(2, 0, 1), rows.transpose(2, 0, 1), (kh, 1), (psh, 1),
                             (top, 0, bottom, 0), (pdh, 1))
            across = _max_pool(rows.transpose(2, 0, 1), pooled.transpose(2, 0, 1), (1, kw), (1, psw),
                               (0, ppl, 0, ppr), (1, pdw))
            pooled_t = pooled.transpose(2, 0, 1)
            images = [(xv[i, :, xa:xb], dst[i, :, i0:i1]) for i in range(n)]

            def run() -> None:
                for src, out_rows in images:
                    np.copyto(inside, src)
                    conv_one()
                    down()
                    across()
                    np.copyto(out_rows, pooled_t)

            return run

        def build(buf: np.ndarray | None) -> list[Step]:
            tasks, off = [], 0
            for i0, i1, (a, b), (top, bottom) in bands:
                if packed is not None:
                    tasks.append(native_band(i0, i1, a, b, top, bottom))
                    continue
                assert buf is not None
                tasks.append(band(buf, off, i0, i1, a, b, top, bottom))
                off += n * kk * (b - a) * q
            return [parallel.Region(pool, tasks)] if len(tasks) > 1 and pool is not None else tasks

        return [_scratch_step(scratch if packed is None else None, build)]

    winograd_tiles = (2, 4)

    def winograd_tile(self, n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
        return winograd.choose(n, c, k, p, q, dtype)

    def record_conv_winograd(self, x: View, u: View, bias: View | None, out: View, pads: tuple[int, int, int, int],
                             m: int, act: Expr | None = None, residual: View | None = None) -> list[Step]:
        xv, uv, dst = self.array(x), self.array(u), self.array(out)
        bv = self.array(bias) if bias is not None else None
        # A residual joins the epilogue, after the tiles are in the output: one that shares the output's memory
        # is copied away first.
        keep, rv = _own_residual(dst, self.array(residual)) if residual is not None else (None, None)
        # Split over the pool's threads, each running its part whole (transforms and products, with OpenBLAS
        # held to the calling thread): see parallel.one_blas_thread.
        pool = parallel.blas_pool()
        pieces = winograd.split(x.shape, out.shape[1], out.shape[2:], pads, m, pool.size if pool is not None else 1)
        offsets = [0]
        for *_, lay in pieces:
            offsets.append(offsets[-1] + lay.elems)
        # The transforms' buffers live in the shared scratch, as im2col's do (in cache from one conv to the next).
        scratch = self._scratch
        scratch.reserve(offsets[-1] * 4)

        def build(buf: np.ndarray) -> list[Step]:
            f32 = buf[:offsets[-1] * 4].view(np.float32)
            tasks = []
            for (xi, oi, lay), o0 in zip(pieces, offsets, strict=False):
                o = dst[oi[0], :, oi[1]]
                res = rv[oi[0], :, oi[1]] if rv is not None else None
                # Output channels split over the threads: the input transform splits by input channels first.
                split_k = len(lay.kranges) > 1
                firsts, outs = winograd.build(lay, xv[xi[0], :, xi[1]], uv, bv, o, f32[o0:o0 + lay.elems],
                                              functools.partial(_epilogue, act), res,
                                              pool.size if split_k and pool is not None else 1)
                if split_k:
                    # One region, a barrier between the phases (ResNet-18's 128- and 256-channel convs 0.07 ms
                    # faster each, the run 2-4% in A/B) where each task can have a thread of its own.
                    if len(firsts) == len(outs) <= pool.size:
                        return [parallel.Phases(pool, firsts, outs)]
                    return [parallel.Region(pool, firsts), parallel.Region(pool, outs)]
                tasks.append(_seq(*firsts, *outs))
            return tasks if len(tasks) == 1 else [parallel.Region(pool, tasks)]

        return [_scratch_step(scratch, build, keep)]

    @staticmethod
    def _depthwise(xv: np.ndarray, wv: np.ndarray, dst: np.ndarray, kernel: tuple[int, int],
                   stride: tuple[int, int], pads: tuple[int, int, int, int], dilation: tuple[int, int],
                   native_epilogue: tuple[np.ndarray | None, float, float] | None = None) -> Step:
        """r*s shifted multiply-adds (C tiny matmuls would be slower). Taps are read when the step runs: the
        weight may be computed by an earlier step. With `native_epilogue` (bias, lo, hi) the compiled kernel
        computes clamp(conv + bias, lo, hi) instead (native.depthwise_step).

        The input is first split into its sh*sw stride phases, padding included (one padded copy at stride
        1), so that every tap reads its phase at a fixed offset. Flattening each phase's plane then makes a
        tap's window one long run per channel: the output is computed on rows as wide as the phase (the
        extra columns are discarded), where 2-D windows would give numpy inner loops of q elements.
        """
        if native_epilogue is not None:
            return native.depthwise_step(xv, wv, stride, pads, dst, *native_epilogue)
        n, c = xv.shape[:2]
        _, _, p, q = dst.shape
        (r, s), (sh, sw), (dh, dw) = kernel, stride, dilation
        offsets = [(divmod(i * dh, sh), divmod(j * dw, sw)) for i in range(r) for j in range(s)]
        ph_w = ((s - 1) * dw) // sw + q
        ph_h = ((r - 1) * dh) // sh + p + 1  # one more row: the last windows run past their row's end
        phases = np.zeros((sh, sw, n, c, ph_h, ph_w), xv.dtype)
        fills = [(phases[a, b][..., o[0], o[1]], xv[..., t[0], t[1]])
                 for (a, b), o, t in _taps(xv, phases, stride, stride, pads, (1, 1))]
        flat = phases.reshape(sh, sw, n, c, ph_h * ph_w)
        span = p * ph_w
        windows = [flat[a, b, :, :, u * ph_w + v: u * ph_w + v + span] for (u, a), (v, b) in offsets]
        taps = wv.reshape(1, c, r * s)
        acc, tmp = np.empty((n, c, span), xv.dtype), np.empty((n, c, span), xv.dtype)
        valid = acc.reshape(n, c, p, ph_w)[..., :q]

        def compute() -> None:
            for d, src in fills:
                np.copyto(d, src)
            for t, win in enumerate(windows):
                tap = taps[..., t, None]
                if t == 0:
                    np.multiply(win, tap, out=acc)
                else:
                    np.multiply(win, tap, out=tmp)
                    np.add(acc, tmp, out=acc)
            np.copyto(dst, valid)

        return compute

    def record_reduce_axes(self, op: str, x: View, out: View, n_reduce: int) -> list[Step]:
        xv, dst = self.array(x), self.array(out)
        axes = tuple(range(x.shape.__len__() - n_reduce, len(x.shape)))
        fn = _REDUCERS[op]

        def step() -> None:
            with np.errstate(all="ignore"):
                dst[...] = fn(xv, axes)

        return [step]

    def record_pool(self, kind: str, x: View, out: View, kernel: tuple[int, int], stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                    p: int = 2) -> list[Step]:
        xv, dst = self.array(x), self.array(out)
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, stride, pads, dilation
        oh, ow = out.shape[2:]
        if kind == "max":
            # Separable: the maximum over each window's rows (strided rows, each read whole), then over its
            # columns; NaN propagates through both. Bands of channels over the pool's threads.
            pool = parallel.pool()
            parts = pool.size if pool is not None and n * c * oh * w >= 1 << 16 else 1
            rows = np.empty((n, c, oh, w), xv.dtype)
            tasks = []
            for c0, c1 in _chunks(c, parts):
                tasks.append(_seq(_max_pool(xv[:, c0:c1], rows[:, c0:c1], (kh, 1), (sh, 1), (pt, 0, pb, 0), (dh, 1)),
                                  _max_pool(rows[:, c0:c1], dst[:, c0:c1], (1, kw), (1, sw), (0, pl, 0, pr), (1, dw))))
            return [functools.partial(pool.run, tasks) if len(tasks) > 1 else tasks[0]]
        # Pad far enough that every window (ceil_mode ones too) lies inside; the padding is -inf for max,
        # 0 for sums, and a 0/1 mask counts the real elements for the average.
        eh = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt))
        ew = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl))
        fill = -np.inf if kind == "max" else 0
        padded = np.full((n, c, h + pt + eh, w + pl + ew), fill, xv.dtype)
        interior = padded[:, :, pt:pt + h, pl:pl + w]
        taps = [(i * dh, j * dw) for i in range(kh) for j in range(kw)]

        def window(src: np.ndarray, i: int, j: int) -> np.ndarray:
            return src[..., i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]

        count = None
        if kind == "avg":
            mask = np.zeros((1, 1, h + pt + eh, w + pl + ew), xv.dtype)
            # count_include_pad counts the declared padding, never the extra ceil_mode overhang.
            if count_include_pad:
                mask[:, :, : h + pt + pb, : w + pl + pr] = 1
            else:
                mask[:, :, pt:pt + h, pl:pl + w] = 1
            count = sum(window(mask, i, j) for i, j in taps)

        def step() -> None:
            # One vectorised operation per window offset (kh*kw of them), not a 6-D strided reduction.
            interior[...] = xv
            if kind == "max":
                with np.errstate(invalid="ignore"):
                    np.copyto(dst, window(padded, *taps[0]))
                    for i, j in taps[1:]:
                        np.maximum(dst, window(padded, i, j), out=dst)  # propagates NaN, as MaxPool must
            elif kind == "avg":
                np.copyto(dst, window(padded, *taps[0]))
                for i, j in taps[1:]:
                    dst[...] += window(padded, i, j)
                dst[...] /= count
            else:
                acc = sum(np.power(np.abs(window(padded, i, j)), p) for i, j in taps)
                dst[...] = np.power(acc, 1.0 / p)

        return [step]

    def record_gather(self, data: View, indices: View, axis: int, out: View) -> list[Step]:
        dv, iv, dst = self.array(data), self.array(indices), self.array(out)
        dim = data.shape[axis]

        def step() -> None:
            idx = np.where(iv < 0, iv + dim, iv)
            if idx.size and (idx.min() < 0 or idx.max() >= dim):
                raise IndexError(f"Gather: index out of range for axis of size {dim}")
            dst[...] = np.take(dv, idx, axis=axis)

        return [step]

    def record_attention_views(self, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                               causal: bool) -> list[Step]:
        qv, kv, vv, dst = self.array(q), self.array(k), self.array(v), self.array(out)
        mv = self.array(mask) if mask is not None else None
        rep = q.shape[1] // k.shape[1]
        sq, skv = q.shape[2], k.shape[2]
        causal_mask = None
        if causal:
            i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
            causal_mask = np.where(j <= i + (skv - sq), 0.0, -np.inf).astype(qv.dtype)

        # Heads (else images) over the pool's threads when the products are large enough to split.
        pool = parallel.blas_pool()
        b_, h_ = q.shape[:2]
        axis = 1 if pool is not None and h_ >= pool.size else 0
        split = (pool is not None and b_ * h_ * sq * skv * q.shape[3] * 2 >= _SPLIT_MACS
                 and q.shape[axis] >= pool.size)

        def step() -> None:
            kk = np.repeat(kv, rep, axis=1) if rep > 1 else kv
            vv2 = np.repeat(vv, rep, axis=1) if rep > 1 else vv
            m = mv
            if causal_mask is not None:
                m = causal_mask if m is None else m + causal_mask
            sc = qv.dtype.type(scale)
            if not split:
                dst[...] = attention_numpy(qv, kk, vv2, sc, m)
                return

            def part(lo: int, hi: int) -> Step:
                ix = (slice(None), slice(lo, hi)) if axis == 1 else (slice(lo, hi),)
                mm = m[ix] if m is not None and m.ndim == 4 else m

                def run() -> None:
                    dst[ix] = attention_numpy(qv[ix], kk[ix], vv2[ix], sc, mm)

                return run

            pool.run([part(lo, hi) for lo, hi in _chunks(q.shape[axis], pool.size)])

        return [step]

    def record_norm(self, kind: str, x: View, scale: View | None, bias: View | None, out: View, n: int,
                    eps: float) -> list[Step]:
        if kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"kind: unknown norm {kind!r}; valid: layernorm, rmsnorm")
        _check_rows(x, out, n)
        xv, dst = self.array(x).reshape(-1, n), self.array(out).reshape(-1, n)
        # scale and bias may be any strided View of n elements: reshape them at run time (a reshape that has to
        # copy must not freeze their contents at record time).
        sv = self.array(scale) if scale is not None else None
        bv = self.array(bias) if bias is not None else None

        def step() -> None:
            # Statistics in float64, two-pass: exact enough for a large common offset (1e4 + noise), where
            # float32's E[x²] - E[x]² (or even a float32 mean) loses the deviations.
            with np.errstate(all="ignore"):
                v = xv.astype(np.float64)
                if kind == "layernorm":
                    v = v - v.mean(axis=1, keepdims=True)
                v *= 1.0 / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + eps)
                if sv is not None:
                    v *= sv.reshape(n)
                if bv is not None:
                    v += bv.reshape(n)
                dst[...] = v

        return [step]

    def record_softmax(self, x: View, out: View, n: int, log: bool) -> list[Step]:
        _check_rows(x, out, n)
        xv, dst = self.array(x).reshape(-1, n), self.array(out).reshape(-1, n)
        ct = np.promote_types(xv.dtype, np.float32)

        def step() -> None:
            # ONNX's formula: exp(x - max) / sum. A row of all -inf gives -inf - -inf = NaN everywhere, as
            # onnx.reference and ONNX Runtime do; so does a row holding NaN or +inf.
            with np.errstate(all="ignore"):
                v = xv.astype(ct, copy=True)
                v -= v.max(axis=1, keepdims=True)
                e = np.exp(v)
                s = e.sum(axis=1, keepdims=True)
                dst[...] = v - np.log(s) if log else e / s

        return [step]


_NO_LOCK = contextlib.nullcontext()


def _scratch_step(scratch: _Scratch | None, build: Callable[[np.ndarray | None], list[Step]],
                  before: Step | None = None, after: Step | None = None) -> Step:
    """A step running the parts build(buffer) makes on the scratch buffer (None without scratch), holding its
    lock; the parts are built on the first run and again whenever the scratch has grown since."""
    bound: list[Any] = [None, None]  # the scratch buffer the parts were built on, the parts

    def parts() -> list[Step]:
        buf = scratch.buf if scratch is not None else None
        if bound[1] is None or bound[0] is not buf:  # first run, or the scratch grew since
            bound[:] = [buf, build(buf)]
        return bound[1]

    def step() -> None:
        if before is not None:
            before()
        with scratch.lock if scratch is not None else _NO_LOCK:
            for part in parts():
                part()
        if after is not None:
            after()

    def program() -> list[Any]:
        """The step as Pool.run_program items (the caller holds the scratch lock)."""
        out: list[Any] = [before] if before is not None else []
        for part in parts():
            out += part.regions() if isinstance(part, parallel.Phases) else [part]
        return out + ([after] if after is not None else [])

    step.program = program  # type: ignore[attr-defined]
    return step


# `parts` (or fewer) ranges covering range(total), one per thread: the first a little larger (parallel.LEAD).
_chunks = parallel.spans


# Convs (one group, no dilation, a window) through the compiled direct conv where it is available.
DIRECT_NATIVE = True

# Products smaller than this (multiply-adds) run whole on the calling thread: a hand-off to the pool costs more.
_SPLIT_MACS = 1 << 20


def _row_band(h: int, pad: int, st: int, extent: int, p0: int, p1: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The input rows [a, b) that output rows [p0, p1) of a window op read, and the band's own (top, bottom)
    padding: a conv over x[..., a:b, :] with those pads gives exactly those output rows."""
    lo, hi = p0 * st - pad, (p1 - 1) * st + extent - pad
    a = min(max(0, lo), h)
    b = max(a, min(h, hi))
    return (a, b), (a - lo, hi - b)


def _padded_rows(xv: np.ndarray, pads: tuple[int, int, int, int], sh: int, r: int, p0: int,
                 p1: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """For output rows [p0, p1) of a conv over xv (N, C, H, W): a zeroed buffer (C, rows, padded width) holding one
    image's input rows with the padding around them, the view its input rows go into, and which input rows
    [a, b) those are. The padding is written here, once; a run copies the rows in."""
    _, c, h, wd = xv.shape
    (xa, xb), (top, bottom) = _row_band(h, pads[0], sh, r, p0, p1)
    xp = np.zeros((c, top + xb - xa + bottom, pads[1] + wd + pads[3]), xv.dtype)
    return xp, xp[:, top:top + xb - xa, pads[1]:pads[1] + wd], (xa, xb)


def _seq(*steps: Step) -> Step:
    def run() -> None:
        for st in steps:
            st()

    return run


def _own_residual(dst: np.ndarray, res: np.ndarray) -> tuple[Step | None, np.ndarray]:
    """(before, residual to read): where res shares memory with dst, `before` copies it into an array of its own
    first (the conv would overwrite it), else it is None and res is read as it is."""
    if np.may_share_memory(dst, res):
        own = np.empty(res.shape, res.dtype)
        return functools.partial(np.copyto, own, res), own
    return None, res


def _residual_pass(act: Expr | None, dst: np.ndarray, res: np.ndarray) -> tuple[Step | None, Step]:
    """(before, after): `after` makes dst = act(dst + res) in place once the conv wrote dst; `before` as
    _own_residual says."""
    before, res = _own_residual(dst, res)
    after = _epilogue(act, dst, res)
    assert after is not None
    return before, after


def _substitute(e: Expr, by: Expr) -> Expr:
    """e with its input 0 replaced by `by`."""
    if e.op == "in":
        return by
    if not e.args:
        return e
    return Expr(e.op, tuple(_substitute(a, by) for a in e.args), e.value, e.kind)


def _clamp_bounds(act: Expr | None) -> tuple[float, float] | None:
    """(lo, hi) where `act` is a clamp of its input: none, Relu, Clip's min(max(x, lo), hi) or one side of it;
    else None."""
    if act is None:
        return -math.inf, math.inf
    if act.op == "relu" and act.args[0].op == "in":
        return 0.0, math.inf
    lo, hi, e = -math.inf, math.inf, act
    if e.op == "min" and e.args[1].op == "const":
        hi, e = float(e.args[1].value), e.args[0]
    if e.op == "max" and e.args[1].op == "const":
        lo, e = float(e.args[1].value), e.args[0]
    return (lo, hi) if e.op == "in" and e is not act else None


def _epilogue(act: Expr | None, dst: np.ndarray, res: np.ndarray | None = None) -> Step | None:
    """`act` over the accumulator dst (plus `res`), in place: compiled to ufunc calls where it is plain float
    arithmetic."""
    if res is not None:
        add = call("add", inp(0), inp(1))
        act = add if act is None else _substitute(act, add)
    if act is None:
        return None
    ins = [dst] if res is None else [dst, res]
    fast = compile_inplace(act, ins, dst, clobber=0)
    if fast is not None:
        return fast

    def step() -> None:
        dst[...] = eval_numpy(act, ins, dst.dtype)

    return step


def _span(o: int, i: int, st: int, pad: int, size: int) -> tuple[int, int]:
    """Output positions [lo, hi) (of o) whose input index lo*st + i - pad lies in [0, size)."""
    return max(0, -(-(pad - i) // st)), min(o, (size - 1 + pad - i) // st + 1)


def _taps(x: np.ndarray, y: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
          pads: tuple[int, int, int, int], dilation: tuple[int, int],
          ) -> list[tuple[tuple[int, int], tuple[slice, slice], tuple[slice, slice]]]:
    """Per kernel tap of a window op from x to y (the last two dims: height, width): (i, j), the output
    rectangle it reaches and the input rectangle it reads there (taps that only see padding are left out)."""
    (r, s), (sh, sw), (pt, pl, _, _), (dh, dw) = kernel, stride, pads, dilation
    h, w = x.shape[-2:]
    p, q = y.shape[-2:]
    out = []
    for i in range(r):
        a0, a1 = _span(p, i * dh, sh, pt, h)
        for j in range(s):
            b0, b1 = _span(q, j * dw, sw, pl, w)
            if a1 > a0 and b1 > b0:
                y0, x0 = a0 * sh + i * dh - pt, b0 * sw + j * dw - pl
                out.append(((i, j), (slice(a0, a1), slice(b0, b1)),
                            (slice(y0, y0 + sh * (a1 - a0 - 1) + 1, sh), slice(x0, x0 + sw * (b1 - b0 - 1) + 1, sw))))
    return out


def _max_pool(xv: np.ndarray, dst: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
              pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> Step:
    """Running maximum over the taps, each clipped to the input: no padded copy. A tap that covers the whole
    output starts it; windows made of padding only stay -inf."""
    p, q = dst.shape[-2:]
    pairs = [(dst[..., o[0], o[1]], xv[..., i[0], i[1]]) for _, o, i in _taps(xv, dst, kernel, stride, pads, dilation)]
    full = next((k for k, (d, _) in enumerate(pairs) if d.shape[-2:] == (p, q)), None)
    first = pairs.pop(full)[1] if full is not None else None

    def step() -> None:
        if first is None:
            dst.fill(-np.inf)
        else:
            np.copyto(dst, first)
        for d, src in pairs:
            np.maximum(d, src, out=d)  # propagates NaN, as MaxPool must

    return step


def _im2col(xv: np.ndarray, cols: np.ndarray, stride: tuple[int, int], pads: tuple[int, int, int, int],
            dilation: tuple[int, int]) -> Step:
    """A step copying every kernel tap of xv (n, c, h, w) into cols (n, c, r, s, p, q).

    Each tap is one copy of the input rectangle it reads into the output rectangle it covers, plus zero
    fills of the thin strips where it reads padding: no padded copy of the input is made.
    A strided conv with many taps (a 7x7/2 stem) first splits the input into its sh*sw phases (the padding
    included), so each tap copies unit-stride rows instead of gathering every other element.
    """
    n, c = xv.shape[:2]
    _, _, r, s, p, q = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    zeros: list[np.ndarray] = []
    if r * s > 4 * sh * sw:
        # phase (a, b)[u, v] = padded input[u*sh + a, v*sw + b]; tap (i, j) reads phase (i*dh % sh, j*dw % sw)
        # from (i*dh // sh, j*dw // sw) on, p x q elements.
        ph_h, ph_w = ((r - 1) * dh) // sh + p, ((s - 1) * dw) // sw + q
        phases = np.zeros((sh, sw, n, c, ph_h, ph_w), xv.dtype)
        # Filling the phases is itself a window op: an sh x sw kernel at stride (sh, sw), one tap per phase.
        pairs = [(phases[a, b][..., o[0], o[1]], xv[..., t[0], t[1]])
                 for (a, b), o, t in _taps(xv, phases, stride, stride, pads, (1, 1))]
        # The taps reading one phase are evenly spaced in i and j and read it at evenly spaced offsets: one
        # strided copy per phase instead of one per tap (the stem's band im2col 0.17 -> 0.15 ms).
        rows, cs = _phase_taps(r, dh, sh), _phase_taps(s, dw, sw)
        for a, (i0, di, ni, u0, du) in rows.items():
            for b, (j0, dj, nj, v0, dv) in cs.items():
                ph = phases[a, b, :, :, u0:, v0:]
                sn, sc, su, sv = ph.strides
                src = as_strided(ph, (n, c, ni, nj, p, q), (sn, sc, du * su, dv * sv, su, sv), writeable=False)
                pairs.append((cols[:, :, i0: i0 + di * (ni - 1) + 1: di, j0: j0 + dj * (nj - 1) + 1: dj], src))
    else:
        taps = {ij: (o, t) for ij, o, t in _taps(xv, cols, (r, s), stride, pads, dilation)}
        pairs = [(cols[:, :, i, j, o[0], o[1]], xv[..., t[0], t[1]]) for (i, j), (o, t) in taps.items()]
        # The buffer is shared: where a tap reads padding, its rows are zeroed on every run.
        for i in range(r):
            for j in range(s):
                tap = cols[:, :, i, j]
                if (i, j) not in taps:
                    zeros.append(tap)
                    continue
                (rows, cs), _ = taps[i, j]
                strips = [tap[..., :rows.start, :], tap[..., rows.stop:, :], tap[..., rows, :cs.start],
                          tap[..., rows, cs.stop:]]
                zeros += [z for z in strips if z.size]

    def fill() -> None:
        for z in zeros:
            z.fill(0)
        for d, src in pairs:
            np.copyto(d, src)

    return fill


def _phase_taps(r: int, d: int, st: int) -> dict[int, tuple[int, int, int, int, int]]:
    """Per phase a of a strided window's taps along one axis (tap i reads phase i*d % st at offset i*d // st):
    (first tap, tap step, taps, first offset, offset step). Tap i and i + st read the same phase, st*d//st = d
    further on; with gcd(d, st) > 1 the step in i is st // gcd."""
    out = {}
    step = st // math.gcd(d, st)
    for i0 in range(min(r, step)):
        a, u0 = (i0 * d) % st, (i0 * d) // st
        out[a] = (i0, step, len(range(i0, r, step)), u0, step * d // st)
    return out


def _check_rows(x: View, out: View, n: int) -> None:
    """x and out: contiguous, the same number of elements, whole rows of n (reshapes must stay views)."""
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("x and out must be contiguous views")
    if n < 1 or x.size != out.size or x.size % n:
        raise ValueError(f"x ({x.size} elements) and out ({out.size}) must be whole rows of n={n}")


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: Any, mask: np.ndarray | None) -> np.ndarray:
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = s + mask
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a fully masked row gives zeros, not NaN
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(den > 0, e / np.where(den > 0, den, 1), 0)
    return np.matmul(p.astype(q.dtype), v)


def _arg(fn: Callable, last: bool) -> Callable:
    def reduce(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        (axis,) = axes
        if last:
            flipped = np.flip(x, axis)
            return x.shape[axis] - 1 - fn(flipped, axis=axis)
        return fn(x, axis=axis)

    return reduce


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max


def _acc(x: np.ndarray) -> Any:
    """Accumulate float sums in float64: numpy adds along a strided axis one element at a time, and float32
    drifts over long rows."""
    return np.float64 if x.dtype.kind == "f" else None


def _logsumexp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    return (np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True, dtype=_acc(x))) + m).squeeze(axes)


_REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...]], Any]] = {
    "sum": lambda x, a: np.sum(x, axis=a, dtype=_acc(x)),
    "mean": lambda x, a: np.mean(x, axis=a, dtype=_acc(x)) if x.dtype.kind == "f" else np.sum(x, axis=a) // math.prod(
        x.shape[i] for i in a),
    # Empty reductions give the identity (-inf / +inf), as ONNX specifies.
    "max": lambda x, a: np.max(x, axis=a, initial=_lowest(x.dtype)),
    "min": lambda x, a: np.min(x, axis=a, initial=_highest(x.dtype)),
    "prod": lambda x, a: np.prod(x, axis=a),
    "sumsq": lambda x, a: np.sum(x * x, axis=a, dtype=_acc(x)),
    "l1": lambda x, a: np.sum(np.abs(x), axis=a, dtype=_acc(x)),
    "l2": lambda x, a: np.sqrt(np.sum(x * x, axis=a, dtype=_acc(x))),
    "logsum": lambda x, a: np.log(np.sum(x, axis=a, dtype=_acc(x))),
    "logsumexp": _logsumexp,
    "argmax": _arg(np.argmax, False),
    "argmin": _arg(np.argmin, False),
    "argmax_last": _arg(np.argmax, True),
    "argmin_last": _arg(np.argmin, True),
}
