/* ember's cpu kernels for small rows (launch code: native.py), built into the same library as _gemm.c:
 *   ember_norm_rows   layer / RMS norm of rows, statistics in double, two passes (as the numpy kernel);
 *   ember_attention_views  softmax(q k^T * scale + mask) v over strided 4-D views, a query row at a time, the
 *                     views given as numbers (a live plan moves them by rewriting those);
 *   ember_copy_views  a strided copy of 4-byte elements given the same way (a KV cache's Concat parts);
 *   ember_gelu        GELU (erf or tanh form) in double, elementwise over a contiguous run.
 *
 * Why: a KV-cache decode step of a small transformer is dozens of these over rows of tens of elements, where
 * numpy's ten or so calls per kernel (each a few hundred ns of dispatch) cost far more than the arithmetic. Plain
 * C (no intrinsics): they need no AVX-512 and run wherever the library builds. NaN and infinities propagate as in
 * the numpy kernels; a fully masked attention row gives zeros.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* Python's build flags carry -fwrapv, under which GCC vectorizes none of the loops below; nothing here relies
 * on signed overflow wrapping. */
#pragma GCC optimize("no-wrapv")
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* kind 0: layernorm (x - mean) / sqrt(var + eps); 1: rmsnorm x / sqrt(mean(x^2) + eps); then * scale + bias
 * (either NULL), scale and bias strided by their own steps (elements). */
int ember_norm_rows(int kind, int rows, int n, const float *x, ptrdiff_t ldx, const float *scale, ptrdiff_t ss,
                    const float *bias, ptrdiff_t bs, double eps, float *y, ptrdiff_t ldy) {
    if (n <= 0) return 0;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (ptrdiff_t)r * ldx;
        float *yr = y + (ptrdiff_t)r * ldy;
        double mean = 0.0;
        if (kind == 0) {
            for (int i = 0; i < n; i++) mean += xr[i];
            mean /= n;
        }
        double sq = 0.0;
        for (int i = 0; i < n; i++) {
            double d = xr[i] - mean;
            sq += d * d;
        }
        double inv = 1.0 / sqrt(sq / n + eps);
        for (int i = 0; i < n; i++) {
            double v = (xr[i] - mean) * inv;
            if (scale) v *= scale[i * ss];
            if (bias) v += bias[i * bs];
            yr[i] = (float)v;
        }
    }
    return 0;
}

/* a . b over d elements: eight running sums where both are contiguous (the compiler's vectors), else one. */
static float dot_unit(const float *restrict a, const float *restrict b, int d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.0f;
    int e = 0;
    for (; e + 8 <= d; e += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[e + l] * b[e + l];
    for (int l = 0; l < 8; l++) sum += acc[l];
    for (; e < d; e++) sum += a[e] * b[e];
    return sum;
}

static float dot_strided(const float *a, int64_t sa, const float *b, int64_t sb, int d) {
    float sum = 0.0f;
    for (int e = 0; e < d; e++) sum += a[e * sa] * b[e * sb];
    return sum;
}

/* out[b, h, i, :] = sum_j p_j v[b, h / rep, j, :], p = softmax_j(scale * q[b, h, i, :] . k[b, h / rep, j, :]
 * + mask[b, h, i, j]) with j > i + skv - sq left out where causal. Strides in elements, four per array (mask NULL
 * for none; its strides may be 0: broadcast); work: skv floats. */
static void attention(int batch, int heads, int kv_heads, int sq, int skv, int d, int dv, const float *q,
                      const int64_t *qs, const float *k, const int64_t *ks, const float *v, const int64_t *vs,
                      const float *mask, const int64_t *ms, float *out, const int64_t *os, float scale, int causal,
                      float *work) {
    int rep = heads / kv_heads;
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < heads; h++) {
            const float *kb = k + b * ks[0] + (h / rep) * ks[1];
            const float *vb = v + b * vs[0] + (h / rep) * vs[1];
            for (int i = 0; i < sq; i++) {
                const float *qi = q + b * qs[0] + h * qs[1] + i * qs[2];
                const float *mi = mask ? mask + b * ms[0] + h * ms[1] + i * ms[2] : NULL;
                float *oi = out + b * os[0] + h * os[1] + i * os[2];
                int last = causal ? i + skv - sq : skv;  /* keys past it are masked out */
                float top = -INFINITY;
                int nan = 0;
                for (int j = 0; j < skv; j++) {
                    const float *kj = kb + j * ks[2];
                    float s = (qs[3] == 1 && ks[3] == 1 ? dot_unit(qi, kj, d) : dot_strided(qi, qs[3], kj, ks[3], d))
                              * scale;
                    float m = mi ? mi[j * ms[3]] : 0.0f;
                    if (j > last) m += -INFINITY;
                    if (mi || j > last) s += m;
                    work[j] = s;
                    if (isnan(s)) nan = 1;
                    else if (s > top) top = s;
                }
                if (nan || !isfinite(top)) top = 0.0f;  /* the numpy kernel's max: NaN or infinite -> 0 */
                float den = 0.0f;
                for (int j = 0; j < skv; j++) {
                    work[j] = expf(work[j] - top);
                    den += work[j];
                }
                for (int e = 0; e < dv; e++) oi[e * os[3]] = 0.0f;
                int unit = os[3] == 1 && vs[3] == 1;
                float inv = den > 0.0f ? 1.0f / den : 0.0f;  /* den NaN or 0: zeros */
                for (int j = 0; j < skv; j++) {
                    float p = den > 0.0f ? work[j] * inv : 0.0f;
                    const float *vj = vb + j * vs[2];
                    if (unit)
                        for (int e = 0; e < dv; e++) oi[e] += p * vj[e];
                    else
                        for (int e = 0; e < dv; e++) oi[e * os[3]] += p * vj[e * vs[3]];
                }
            }
        }
}

/* A view of a Resizable's numbers (resizable.py: per view its shape, strides, offset) as 4 dims, checked to lie in
 * its buffer: address and strides (in elements) into ptr / st; shape into dims. 0, or -1 where it does not fit. */
static int view4(const int64_t **num, int rank, int64_t base, int64_t nbytes, int64_t *ptr, int64_t *st,
                 int64_t *dims) {
    const int64_t *n = *num, *s = n + rank, off = n[2 * rank], big = (int64_t)1 << 30;
    *num = n + 2 * rank + 1;
    if (rank > 4 || off < 0 || off > nbytes / 4) return -1;
    int64_t lo = off, hi = off;
    for (int i = 0; i < 4; i++) {
        int j = i - (4 - rank);  /* fewer dims: leading ones of size 1 */
        dims[i] = j < 0 ? 1 : n[j];
        st[i] = j < 0 ? 0 : s[j];
        if (dims[i] <= 0 || dims[i] > big || st[i] > big || st[i] < -big) return -1;  /* no int64 overflow below */
        if (st[i] < 0) lo += (dims[i] - 1) * st[i]; else hi += (dims[i] - 1) * st[i];
    }
    if (lo < 0 || hi >= nbytes / 4) return -1;
    *ptr = base + off * 4;
    st[4] = base + lo * 4;  /* the view's byte range, for the overlap check */
    st[5] = base + (hi + 1) * 4;
    return 0;
}

/* The attention over the Views a live plan's move gives as numbers (a leading 0, then per view q, k, v, [mask],
 * out its shape, strides and offset), checked here: table = masked, causal, most query rows, work buffer and its
 * floats, then per view its rank, buffer address and bytes. run 0: only check. Returns 0, -1 where the kernel does
 * not take the views (out of a buffer, shapes that do not fit, out overlapping an input, too many query rows),
 * -2 where the work buffer is smaller than the keys. */
int ember_attention_views(const int64_t *numbers, const int64_t *table, float scale, int run) {
    int masked = (int)table[0], nv = masked ? 5 : 4;
    int64_t ptr[5], st[5][6], dims[5][4];
    const int64_t *num = numbers + 1, *t = table + 5;
    for (int i = 0; i < nv; i++, t += 3)
        if (view4(&num, (int)t[0], t[1], t[2], &ptr[i], st[i], dims[i])) return -1;
    for (int i = 0; i < nv - 1; i++)  /* out (the last) apart from every input */
        if (st[nv - 1][4] < st[i][5] && st[i][4] < st[nv - 1][5]) return -1;
    const int64_t *q = dims[0], *k = dims[1], *v = dims[2], *o = dims[nv - 1];
    if (table[5] != 4 || table[8] != 4 || table[11] != 4 || table[5 + 3 * (nv - 1)] != 4) return -1;
    if (q[2] > table[2] || k[1] == 0 || q[1] % k[1] || k[0] != q[0] || k[3] != q[3] || v[0] != k[0] || v[1] != k[1]
        || v[2] != k[2] || o[0] != q[0] || o[1] != q[1] || o[2] != q[2] || o[3] != v[3])
        return -1;
    int64_t mstride[4] = {0, 0, 0, 0};
    if (masked) {
        const int64_t *m = dims[3], want[4] = {q[0], q[1], q[2], k[2]};
        for (int i = 0; i < 4; i++) {
            if (m[i] != 1 && m[i] != want[i]) return -1;
            mstride[i] = m[i] == want[i] ? st[3][i] : 0;
        }
    }
    if (k[2] > table[4]) return -2;
    if (!run) return 0;
    attention((int)q[0], (int)q[1], (int)k[1], (int)q[2], (int)k[2], (int)q[3], (int)v[3],
              (const float *)(intptr_t)ptr[0], st[0], (const float *)(intptr_t)ptr[1], st[1],
              (const float *)(intptr_t)ptr[2], st[2], masked ? (const float *)(intptr_t)ptr[3] : NULL, mstride,
              (float *)(intptr_t)ptr[nv - 1], st[nv - 1], scale, (int)table[1], (float *)(intptr_t)table[3]);
    return 0;
}

/* dst = src over the two Views a live plan's move gives as numbers (as for ember_attention_views: a leading 0,
 * then per view its shape, strides in elements and offset), up to 4 dims of 4-byte elements: table = per view
 * (src, dst) its rank, buffer address and bytes. run 0: only check. Returns 0, or -1 where the copy is not taken
 * (a view outside its buffer, ranks or shapes that differ, the two overlapping). */
int ember_copy_views(const int64_t *numbers, const int64_t *table, int run) {
    int64_t ptr[2], st[2][6], dims[2][4];
    const int64_t *num = numbers + 1;
    for (int i = 0; i < 2; i++) {
        const int64_t *t = table + 3 * i;
        if (t[0] != table[3] || view4(&num, (int)t[0], t[1], t[2], &ptr[i], st[i], dims[i])) return -1;
    }
    for (int i = 0; i < 4; i++)
        if (dims[0][i] != dims[1][i]) return -1;
    if (st[1][4] < st[0][5] && st[0][4] < st[1][5]) return -1;
    if (!run) return 0;
    const int64_t *a = st[0], *b = st[1], *n = dims[0];
    const float *src = (const float *)(intptr_t)ptr[0];
    float *dst = (float *)(intptr_t)ptr[1];
    for (int64_t i0 = 0; i0 < n[0]; i0++)
        for (int64_t i1 = 0; i1 < n[1]; i1++)
            for (int64_t i2 = 0; i2 < n[2]; i2++) {
                const float *s = src + i0 * a[0] + i1 * a[1] + i2 * a[2];
                float *d = dst + i0 * b[0] + i1 * b[1] + i2 * b[2];
                if (a[3] == 1 && b[3] == 1)
                    memcpy(d, s, (size_t)n[3] * 4);
                else
                    for (int64_t i3 = 0; i3 < n[3]; i3++) d[i3 * b[3]] = s[i3 * a[3]];
            }
    return 0;
}

/* y = gelu(x) over n contiguous floats (x may be y): kind 0 the erf form, 0.5 x erfc(-x / sqrt 2); 1 the tanh
 * form, x / (1 + exp(-2 u)), u = sqrt(2 / pi) (x + 0.044715 x^3); both in double. */
int ember_gelu(int kind, size_t n, const float *x, float *y) {
    const double root2 = 1.4142135623730951, c = 0.7978845608028654;  /* sqrt(2), sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        double t = x[i];
        if (kind == 0) {
            y[i] = (float)(0.5 * t * erfc(-t / root2));
        } else {
            double u = c * (t + 0.044715 * (t * t * t));
            y[i] = (float)(t / (1.0 + exp(-2.0 * u)));
        }
    }
    return 0;
}
