/* ember's cpu kernels over a weight packed once, at load (launch code: native.py):
 *   ember_conv_cl  a direct convolution into channels-last rows, its im2col a block of output columns at a time;
 *   ember_gemm     C = A @ B (+ bias), A (M x K) a layer's weight.
 *
 * Why not OpenBLAS (numpy's): it packs both operands on every call. For a conv whose weight outweighs its
 * columns (ResNet-18's layer 4 at batch 1: 512 x 4608 @ 4608 x 49) that is 9.4 MB read cold from memory
 * and copied, every run, before any arithmetic; OpenBLAS has no API to keep packed panels between calls. And
 * an im2col conv first writes its column matrix out (the stem's: 7.5 MB). Here the weight is packed at load,
 * streamed with software prefetch while the products run, and the direct conv's columns never leave the cache.
 *
 * Layouts (float32):
 *   ap    A packed in panels of MR = 32 rows: [ceil(M/32)][K][32], rows past M zero.
 *   b     B row-major, K rows of N, row stride ldb (elements).
 *   c     C row-major, row stride ldc; rows [0, M) and columns [0, N) written.
 *   work  caller's scratch of ember_gemm_work_floats(N, K) floats: B repacked in blocks of NR columns
 *         ([blocks][K][NR], the last block zero-padded) and the accumulators of one panel.
 * Loop order: per chunk of N (its packed B stays in L2), per panel of A, per KC slice of K (the A slice,
 * 32 KB, stays in L1 across the chunk's column blocks), per block of NR columns: the micro-kernel, 32 x NR
 * outputs in registers (2 x NR zmm accumulators), one FMA pair per column a k-step. The direct conv packs its
 * blocks of columns from the (padded) input instead, and runs the same loops.
 *
 * The kernels need AVX-512F; ember_gemm_supported() says whether this CPU has it (numpy runs the convs
 * otherwise). Built without -mavx512f: only the kernel functions carry the target attribute, so the library
 * loads on any x86-64 and elsewhere compiles to stubs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

#define MR 32
#define NR 7   /* ResNet's spatial sizes (56, 28, 14, 7) are multiples of 7: no padded columns */
#define KC 256
#define NC (NR * 28)  /* columns per chunk: 196 */
#define CB 28         /* output blocks per chunk of the direct conv */
#define DW_SLACK 48   /* columns past a padded depthwise row that a last vector (32 wide at stride 2) may read */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EMBER_X86 1
#include <immintrin.h>
#else
#define EMBER_X86 0
#endif

/* Every function below is exported on every platform (ctypes looks each one up); where the kernels are not
 * compiled, or the CPU lacks AVX-512F, ember_gemm_supported() is 0 and the others return -1. */

int ember_gemm_supported(void) {
#if EMBER_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

size_t ember_gemm_work_floats(int n, int k) {
    size_t nc = n < NC ? (size_t)n : NC;
    size_t blocks = (nc + NR - 1) / NR;
    return blocks * NR * (size_t)k + blocks * NR * MR;
}

size_t ember_conv_work_floats(int kred, int p, int q) {
    size_t total = (size_t)p * ((q + NR - 1) / NR), cb = total < CB ? total : CB;
    return cb * kred * NR + cb * NR * MR;
}

/* The depthwise kernel's padded plane: rows every window reads and the input's rows, whichever is more; the
 * same for columns. */
static void padded_plane(int h, int w, int r, int s, int sh, int sw, int pt, int pl, int p, int q, size_t *ph,
                         size_t *pw) {
    *ph = (size_t)(p - 1) * sh + r;
    *pw = (size_t)(q - 1) * sw + s;
    if (*ph < (size_t)(pt + h)) *ph = pt + h;
    if (*pw < (size_t)(pl + w)) *pw = pl + w;
}

size_t ember_depthwise_work_floats(int h, int w, int r, int s, int sh, int sw, int pt, int pl, int p, int q) {
    size_t ph, pw;
    padded_plane(h, w, r, s, sh, sw, pt, pl, p, q, &ph, &pw);
    return ph * (pw + DW_SLACK);
}

#if EMBER_X86
/* max(lo, v) then min(hi, v): v's NaN survives (maxps/minps return the second operand where either is NaN) */
__attribute__((target("avx512f"))) static inline __m512 clamp(__m512 v, __m512 lo, __m512 hi) {
    return _mm512_min_ps(hi, _mm512_max_ps(lo, v));
}

/* acc[NR][32] = (first ? 0 : acc) + A slice (kc x 32, packed [k][32]) * B block (kc x NR, packed [k][NR]);
 * pf: memory to pull into cache meanwhile (the next A slice), 128 bytes a k-step, or NULL. */
__attribute__((target("avx512f"))) static void kernel(int kc, const float *ap, const float *bp, float *acc,
                                                      int first, const float *pf) {
    __m512 c0[NR], c1[NR];
    for (int j = 0; j < NR; j++) {
        c0[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + j * MR);
        c1[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + j * MR + 16);
    }
    for (int k = 0; k < kc; k++) {
        __m512 a0 = _mm512_loadu_ps(ap), a1 = _mm512_loadu_ps(ap + 16);
        if (pf) {
            _mm_prefetch((const char *)(pf + MR * k), _MM_HINT_T0);
            _mm_prefetch((const char *)(pf + MR * k + 16), _MM_HINT_T0);
        }
#pragma GCC unroll 7
        for (int j = 0; j < NR; j++) {
            __m512 bv = _mm512_set1_ps(bp[j]);
            c0[j] = _mm512_fmadd_ps(a0, bv, c0[j]);
            c1[j] = _mm512_fmadd_ps(a1, bv, c1[j]);
        }
        ap += MR;
        bp += NR;
    }
    for (int j = 0; j < NR; j++) {
        _mm512_storeu_ps(acc + j * MR, c0[j]);
        _mm512_storeu_ps(acc + j * MR + 16, c1[j]);
    }
}

/* acc[blocks][NR][MR] = one weight panel (kred x 32, packed) times `blocks` packed column blocks
 * ([blocks][kred][NR]), a KC slice of K at a time: the slice (32 KB) stays in L1 across the blocks while the next
 * one (this panel's, else next_panel's first, if any) is prefetched during the first block. */
__attribute__((target("avx512f"))) static void panel_times_blocks(const float *panel, const float *next_panel,
                                                                  int kred, const float *bp, int blocks,
                                                                  float *acc) {
    for (int k0 = 0; k0 < kred; k0 += KC) {
        int kc = kred - k0 < KC ? kred - k0 : KC;
        const float *next = k0 + KC < kred ? panel + (size_t)(k0 + KC) * MR : next_panel;
        for (int jb = 0; jb < blocks; jb++)
            kernel(kc, panel + (size_t)k0 * MR, bp + ((size_t)jb * kred + k0) * NR, acc + (size_t)jb * NR * MR,
                   k0 == 0, jb == 0 ? next : NULL);
    }
}

__attribute__((target("avx512f"))) static void chunk(int m, int n, int k, const float *ap, const float *b,
                                                     ptrdiff_t ldb, float *c, ptrdiff_t ldc, const float *bias,
                                                     float lo, float hi, float *work) {
    int blocks = (n + NR - 1) / NR;
    float *bp = work;                                  /* [blocks][k][NR] */
    float *acc = work + (size_t)blocks * NR * k;       /* [blocks][NR][MR] */
    /* B into blocks of NR columns, a row at a time: a masked load of its nr columns (lanes past them read as
     * zero and touch no memory) and a masked store of NR lanes. */
    for (int jb = 0; jb < blocks; jb++) {
        int j0 = jb * NR, nr = n - j0 < NR ? n - j0 : NR;
        __mmask16 load = (__mmask16)((1u << nr) - 1);
        float *dst = bp + (size_t)jb * k * NR;
        const float *src = b + j0;
        for (int kk = 0; kk < k; kk++)
            _mm512_mask_storeu_ps(dst + kk * NR, (__mmask16)((1u << NR) - 1),
                                  _mm512_maskz_loadu_ps(load, src + (size_t)kk * ldb));
    }
    int panels = (m + MR - 1) / MR;
    for (int pi = 0; pi < panels; pi++) {
        const float *panel = ap + (size_t)pi * MR * k;
        panel_times_blocks(panel, pi + 1 < panels ? panel + (size_t)MR * k : NULL, k, bp, blocks, acc);
        int rows = m - pi * MR < MR ? m - pi * MR : MR;
        for (int jb = 0; jb < blocks; jb++) {
            int j0 = jb * NR, nr = n - j0 < NR ? n - j0 : NR;
            const float *a = acc + (size_t)jb * NR * MR;
            for (int i = 0; i < rows; i++) {
                float bi = bias ? bias[pi * MR + i] : 0.0f;
                float *row = c + (size_t)(pi * MR + i) * ldc + j0;
                for (int jj = 0; jj < nr; jj++) {
                    float v = a[jj * MR + i] + bi;
                    row[jj] = v < lo ? lo : v > hi ? hi : v;  /* NaN compares false: stays NaN */
                }
            }
        }
    }
}

/* A direct convolution of one image into channels-last output, its im2col done a block of NR output columns at
 * a time into L1 instead of through memory (a stem: few input channels, a big window):
 *   y[pp][qq][kk] = clamp(bias[kk] + sum_{ci,i,j} w[kk][ci][i][j] xp[ci][pp*sh + i][qq*sw + j], lo, hi),
 * xp the input with its padding already in place (c x hp x wp), ap the weight (k x c*r*s) packed as for
 * ember_gemm, rows pp in [0, p) and columns in [0, q); work: ember_conv_work_floats(c*r*s, p, q) floats. Returns 0,
 * or -1 where this CPU lacks AVX-512F. */
__attribute__((target("avx512f"))) static void pack_columns(const float *xp, int c, int hp, int wp, int r, int s,
                                                            int sw, int row, int x0, int nr, float *bp) {
    const __mmask16 store = (__mmask16)((1u << NR) - 1);
    const __m512i every_other = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int ci = 0; ci < c; ci++)
        for (int i = 0; i < r; i++) {
            const float *src = xp + ((size_t)ci * hp + row + i) * wp + (size_t)x0 * sw;
            for (int j = 0; j < s; j++, bp += NR) {
                __m512 v;
                if (sw == 1) {
                    v = _mm512_maskz_loadu_ps((__mmask16)((1u << nr) - 1), src + j);
                } else if (sw == 2) {  /* the 2*nr - 1 elements spanned, every other one kept */
                    v = _mm512_permutexvar_ps(every_other,
                                              _mm512_maskz_loadu_ps((__mmask16)((1u << (2 * nr - 1)) - 1), src + j));
                } else {
                    float t[16] = {0};
                    for (int jj = 0; jj < nr; jj++)
                        t[jj] = src[j + jj * sw];
                    v = _mm512_loadu_ps(t);
                }
                _mm512_mask_storeu_ps(bp, store, v);
            }
        }
}

/* Output blocks (NR columns of one output row) are taken CB at a time: their packed columns (kred x NR each)
 * stay in L2 while every panel of the weight streams past them once, each K slice of a panel (32 KB) held in
 * L1 across the blocks, as in chunk(). Layer 4 of ResNet-18 at batch 1 is 7 blocks: its weight is read once
 * (a block at a time, it was read once per output row). */

__attribute__((target("avx512f"))) static void conv_cl(int c, int hp, int wp, const float *xp, int r, int s,
                                                       int sh, int sw, int p, int q, const float *ap, int k,
                                                       const float *bias, float lo, float hi, float *y,
                                                       float *work) {
    int kred = c * r * s, panels = (k + MR - 1) / MR;
    int per_row = (q + NR - 1) / NR, total = p * per_row;
    int cb = total < CB ? total : CB;
    float *bp = work, *acc = work + (size_t)cb * kred * NR;
    const __m512 zero = _mm512_setzero_ps(), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    for (int b0 = 0; b0 < total; b0 += cb) {
        int nb = total - b0 < cb ? total - b0 : cb;
        for (int bi = 0; bi < nb; bi++) {
            int pp = (b0 + bi) / per_row, x0 = (b0 + bi) % per_row * NR;
            pack_columns(xp, c, hp, wp, r, s, sw, pp * sh, x0, q - x0 < NR ? q - x0 : NR,
                         bp + (size_t)bi * kred * NR);
        }
        for (int pi = 0; pi < panels; pi++) {
            const float *panel = ap + (size_t)pi * MR * kred;
            panel_times_blocks(panel, pi + 1 < panels ? panel + (size_t)MR * kred : NULL, kred, bp, nb, acc);
            int rows = k - pi * MR < MR ? k - pi * MR : MR;
            __mmask16 m0 = (__mmask16)(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
            __mmask16 m1 = (__mmask16)(rows >= 32 ? 0xFFFF : rows > 16 ? (1u << (rows - 16)) - 1 : 0);
            __m512 b0v = bias ? _mm512_maskz_loadu_ps(m0, bias + pi * MR) : zero;
            __m512 b1v = bias ? _mm512_maskz_loadu_ps(m1, bias + pi * MR + 16) : zero;
            for (int bi = 0; bi < nb; bi++) {
                int pp = (b0 + bi) / per_row, x0 = (b0 + bi) % per_row * NR;
                int nr = q - x0 < NR ? q - x0 : NR;
                const float *a = acc + (size_t)bi * NR * MR;
                for (int jj = 0; jj < nr; jj++) {
                    __m512 v0 = clamp(_mm512_add_ps(_mm512_loadu_ps(a + jj * MR), b0v), vlo, vhi);
                    __m512 v1 = clamp(_mm512_add_ps(_mm512_loadu_ps(a + jj * MR + 16), b1v), vlo, vhi);
                    float *dst = y + ((size_t)pp * q + x0 + jj) * k + pi * MR;
                    _mm512_mask_storeu_ps(dst, m0, v0);
                    _mm512_mask_storeu_ps(dst + 16, m1, v1);
                }
            }
        }
    }
}

/* Depthwise convolution (one filter per channel). Per plane (image, channel): its rows copied into the middle
 * of a zeroed buffer (the padding stays zero: only the middle is rewritten), then 16 outputs of a row a
 * vector, the r*s taps as FMAs with the channel's weight broadcast; a stride-2 tap loads 32 neighbours and
 * keeps every other one (a numpy phase split of the input had cost more than the whole conv). Bias and a clamp
 * to [lo, hi] fused.
 *   x     plane (i, ch) at x + i*x_n + ch*x_c, h rows of w at stride w
 *   wt    [c][r*s]; bias [c] or NULL
 *   y     plane (i, ch) at y + i*y_n + ch*y_c, p rows of q at stride q
 *   work  ember_depthwise_work_floats(...) floats
 * Returns 0, or -1 where this CPU lacks AVX-512F (or sw > 2). */
__attribute__((target("avx512f"))) static void depthwise(int n, int c, int h, int w, const float *x, size_t x_n,
                                                         size_t x_c, int r, int s, int sh, int sw, int pt, int pl,
                                                         int p, int q, const float *wt, const float *bias,
                                                         float lo, float hi, float *y, size_t y_n, size_t y_c,
                                                         float *work) {
    size_t ph, pw;
    padded_plane(h, w, r, s, sh, sw, pt, pl, p, q, &ph, &pw);
    size_t stride = pw + DW_SLACK;
    memset(work, 0, ph * stride * sizeof(float));
    const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) {
            const float *src = x + i * x_n + ch * x_c;
            for (int row = 0; row < h; row++)
                memcpy(work + (size_t)(pt + row) * stride + pl, src + (size_t)row * w, (size_t)w * sizeof(float));
            const float *wc = wt + (size_t)ch * r * s;
            __m512 b = _mm512_set1_ps(bias ? bias[ch] : 0.0f);
            float *out = y + i * y_n + ch * y_c;
            for (int yy = 0; yy < p; yy++)
                for (int x0 = 0; x0 < q; x0 += 16) {
                    __mmask16 m = (__mmask16)(q - x0 >= 16 ? 0xFFFF : (1u << (q - x0)) - 1);
                    __m512 acc = b;
                    for (int ti = 0; ti < r; ti++) {
                        const float *line = work + (size_t)(yy * sh + ti) * stride + (size_t)x0 * sw;
                        for (int tj = 0; tj < s; tj++) {
                            __m512 v = sw == 1 ? _mm512_loadu_ps(line + tj)
                                     : _mm512_permutex2var_ps(_mm512_loadu_ps(line + tj), even,
                                                              _mm512_loadu_ps(line + tj + 16));
                            acc = _mm512_fmadd_ps(v, _mm512_set1_ps(wc[ti * s + tj]), acc);
                        }
                    }
                    _mm512_mask_storeu_ps(out + (size_t)yy * q + x0, m, clamp(acc, vlo, vhi));
                }
        }
}

#endif /* EMBER_X86 */

/* C = clamp(A @ B + bias, lo, hi) (bias: M floats or NULL; NaN stays NaN). Returns 0, or -1 where the kernels
 * cannot run here (nothing written). */
int ember_gemm(int m, int n, int k, const float *ap, const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc,
               const float *bias, float lo, float hi, float *work) {
#if EMBER_X86
    if (ember_gemm_supported()) {
        for (int j0 = 0; j0 < n; j0 += NC)
            chunk(m, n - j0 < NC ? n - j0 : NC, k, ap, b + j0, ldb, c + j0, ldc, bias, lo, hi, work);
        return 0;
    }
#endif
    return -1;
}

int ember_conv_cl(int c, int hp, int wp, const float *xp, int r, int s, int sh, int sw, int p, int q,
                  const float *ap, int k, const float *bias, float lo, float hi, float *y, float *work) {
#if EMBER_X86
    if (ember_gemm_supported()) {
        conv_cl(c, hp, wp, xp, r, s, sh, sw, p, q, ap, k, bias, lo, hi, y, work);
        return 0;
    }
#endif
    return -1;
}

int ember_depthwise(int n, int c, int h, int w, const float *x, size_t x_n, size_t x_c, int r, int s, int sh,
                    int sw, int pt, int pl, int p, int q, const float *wt, const float *bias, float lo, float hi,
                    float *y, size_t y_n, size_t y_c, float *work) {
#if EMBER_X86
    if (ember_gemm_supported() && sw <= 2) {
        depthwise(n, c, h, w, x, x_n, x_c, r, s, sh, sw, pt, pl, p, q, wt, bias, lo, hi, y, y_n, y_c, work);
        return 0;
    }
#endif
    return -1;
}

/* An (empty) extension module, so that setuptools builds and installs the library like any other; ember loads
 * it with ctypes (backends/cpu/native.py), which releases the GIL around every call. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gemm", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gemm(void) { return PyModule_Create(&module); }
