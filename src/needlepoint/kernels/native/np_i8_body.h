/* The kernels of np_i8.h, included once per instruction-set variant (NP_NAME appends the
 * variant's suffix). kernels/i8.py and kernels/i8_ops.py hold the numpy reference of each
 * function; both give the same bits. No float operation here is fused or reordered
 * (-ffp-contract=off; np_i8_tile.h's one explicit fma adds two exact products, see there):
 * integer sums are exact in any order, float sums run in the documented order in every
 * variant. */

/* -- activation quantiser --------------------------------------------------------------- */
/* Row t of x [T, K] -> codes [T, k_pad] int8, per 32-block b: s = max|x| / 127 (1 if the
 * block is all zero), q = clip(rint(x / s), -127, 127), sums = sum q. */
static int NP_NAME(i8_quantize)(const float *x, int64_t T, int64_t K, int64_t k_pad,
                                int8_t *codes, float *scale, int32_t *sums) {
    int64_t nb = k_pad / 32;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * K;
        for (int64_t b = 0; b < nb; b++) {
            int64_t k0 = b * 32;
            int64_t n = K - k0 < 32 ? (K - k0 > 0 ? K - k0 : 0) : 32;
            float v[32];
            float peak = 0.0f;
            int finite = 1;
#if defined(NP_SIMD_AVX2)
            if (n == 32) { /* max |x| and the finiteness test eight lanes at a time (exact) */
                const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
                const __m256 big = _mm256_set1_ps(3.4028234663852886e38f);
                __m256 m = _mm256_setzero_ps();
                int ok = 0xFF;
                for (int i = 0; i < 32; i += 8) {
                    __m256 xv = _mm256_loadu_ps(row + k0 + i);
                    _mm256_storeu_ps(v + i, xv);
                    __m256 a = _mm256_and_ps(xv, absmask);
                    ok &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ));
                    m = _mm256_max_ps(m, a);
                }
                __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
                peak = _mm_cvtss_f32(h);
                finite = ok == 0xFF;
            } else
#endif
            for (int i = 0; i < 32; i++) {
                v[i] = i < n ? row[k0 + i] : 0.0f;
                float a = fabsf(v[i]);
                if (!(a <= 3.4028234663852886e38f)) finite = 0;
                if (a > peak) peak = a;
            }
            if (!finite) return I8_NONFINITE;
            float s = peak > 0.0f ? peak / 127.0f : 1.0f;
            int8_t *out = codes + t * k_pad + k0;
            int32_t total = 0;
#if defined(NP_SIMD_AVX2)
            __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
            __m256i qi[4];
            for (int i = 0; i < 4; i++) {
                __m256 q = _mm256_div_ps(_mm256_loadu_ps(v + 8 * i), sv);
                q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
                qi[i] = _mm256_cvtps_epi32(q);
            }
            /* |q| <= 127: the saturating packs are plain narrowing; then undo their lane order */
            __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                               _mm256_packs_epi32(qi[2], qi[3]));
            bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)out, bytes);
            __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]),
                                          _mm256_add_epi32(qi[2], qi[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            total = _mm_cvtsi128_si32(s4);
#else
            for (int i = 0; i < 32; i++) {
                float q = nearbyintf(v[i] / s);
                if (q > 127.0f) q = 127.0f;
                if (q < -127.0f) q = -127.0f;
                out[i] = (int8_t)q;
                total += (int32_t)q;
            }
#endif
            scale[t * nb + b] = s;
            sums[t * nb + b] = total;
        }
    }
    return I8_OK;
}

/* -- the product -------------------------------------------------------------------------- */
/* Block b's 8 weight scales (or offsets) as float32: stored float32, or float16 (GGUF's own
 * d / m, converted exactly). */
static inline void NP_NAME(i8_load8)(const void *base, int half, int64_t b, float *out) {
    if (!half) {
        memcpy(out, (const float *)base + b * 8, sizeof(float) * 8);
        return;
    }
    const uint16_t *h = (const uint16_t *)base + b * 8;
#if defined(NP_SIMD_AVX2)
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
#else
    for (int j = 0; j < 8; j++) out[j] = i8_half(h[j]);
#endif
}

/* Rows t0 .. t0+R-1 against one group of 8 outputs: exact int32 block dots, then the pinned
 * float64 epilogue over the blocks in order (kernels/i8.py module doc). The portable kernel;
 * the SIMD variants run np_i8_tile.h. */
static inline void NP_NAME(i8_group)(const int8_t *codes, const float *xscale,
                                     const int32_t *xsums, int64_t t0, int R, int64_t nb,
                                     int bits, const uint8_t *wg, const void *sg,
                                     const void *mg, int half, double acc[4][8]) {
    int64_t k_pad = nb * 32;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 8; j++) acc[r][j] = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t dot[4][8];
        for (int r = 0; r < R; r++) {
            const int8_t *xr = codes + (t0 + r) * k_pad + b * 32;
            for (int j = 0; j < 8; j++) {
                int32_t d = 0;
                for (int q = 0; q < 8; q++)
                    for (int i = 0; i < 4; i++) {
                        int32_t w;
                        if (bits == 8) {
                            w = (int8_t)wg[b * 256 + q * 32 + j * 4 + i];
                        } else {
                            uint8_t byte = wg[b * 128 + (q & 3) * 32 + j * 4 + i];
                            w = q < 4 ? (byte & 0x0F) : (byte >> 4);
                        }
                        d += w * (int32_t)xr[4 * q + i];
                    }
                dot[r][j] = d;
            }
        }
        float sb[8], mbuf[8];
        const float *mb = NULL;
        NP_NAME(i8_load8)(sg, half, b, sb);
        if (mg) {
            NP_NAME(i8_load8)(mg, half, b, mbuf);
            mb = mbuf;
        }
        for (int r = 0; r < R; r++) {
            double xs = (double)xscale[(t0 + r) * nb + b];
            double ss = (double)xsums[(t0 + r) * nb + b];
            for (int j = 0; j < 8; j++) {
                double inner = (double)sb[j] * (double)dot[r][j];
                if (mb) {
                    double off = (double)mb[j] * ss;
                    inner = inner + off;
                }
                double term = inner * xs;
                acc[r][j] = acc[r][j] + term;
            }
        }
    }
}

/* out[t, n] for groups g_first .. g_last-1 (outputs n < n_out), every row: the portable
 * kernel (and the SIMD variants' fallback). */
static void NP_NAME(i8_matmul_portable)(const int8_t *codes, const float *xscale,
                                        const int32_t *xsums, int64_t T, int64_t nb, int bits,
                                        const uint8_t *wdata, const void *wscale,
                                        const void *woffset, int half, int64_t g_first,
                                        int64_t g_last, int64_t n_out, const float *bias,
                                        float *out, int64_t out_stride) {
    int64_t group_bytes = nb * (bits == 8 ? 256 : 128);
    for (int64_t g = g_first; g < g_last; g++) {
        const uint8_t *wg = wdata + g * group_bytes;
        size_t width = half ? 2 : 4;
        const void *sg = (const char *)wscale + (size_t)(g * nb * 8) * width;
        const void *mg = woffset ? (const char *)woffset + (size_t)(g * nb * 8) * width : NULL;
        for (int64_t t0 = 0; t0 < T; t0 += 4) {
            int R = T - t0 < 4 ? (int)(T - t0) : 4;
            double acc[4][8];
            switch (R) {  /* constant R: each case is unrolled on its own */
            case 4:
                NP_NAME(i8_group)(codes, xscale, xsums, t0, 4, nb, bits, wg, sg, mg, half,
                                  acc);
                break;
            case 3:
                NP_NAME(i8_group)(codes, xscale, xsums, t0, 3, nb, bits, wg, sg, mg, half,
                                  acc);
                break;
            case 2:
                NP_NAME(i8_group)(codes, xscale, xsums, t0, 2, nb, bits, wg, sg, mg, half,
                                  acc);
                break;
            default:
                NP_NAME(i8_group)(codes, xscale, xsums, t0, 1, nb, bits, wg, sg, mg, half,
                                  acc);
            }
            for (int r = 0; r < R; r++) {
                float *o = out + (t0 + r) * out_stride;
                for (int j = 0; j < 8; j++) {
                    int64_t n = g * 8 + j;
                    if (n >= n_out) break;
                    float y = (float)acc[r][j];
                    if (bias) y = y + bias[n];
                    o[n] = y;
                }
            }
        }
    }
}

#if !defined(NP_SIMD_AVX2)
static void NP_NAME(i8_matmul_groups)(const int8_t *codes, const float *xscale,
                                      const int32_t *xsums, int64_t T, int64_t nb, int bits,
                                      const uint8_t *wdata, const void *wscale,
                                      const void *woffset, int half, int64_t g_first,
                                      int64_t g_last, int64_t n_out, const float *bias,
                                      float *out, int64_t out_stride) {
    NP_NAME(i8_matmul_portable)(codes, xscale, xsums, T, nb, bits, wdata, wscale, woffset, half,
                                g_first, g_last, n_out, bias, out, out_stride);
}
#else
#include "np_i8_tile.h"

/* out[t, n] for groups g_first .. g_last-1 (outputs n < n_out), every row: the SIMD tiles,
 * with the rows' activation scales and sums in float64 (exact conversions). */
static void NP_NAME(i8_matmul_groups)(const int8_t *codes, const float *xscale,
                                      const int32_t *xsums, int64_t T, int64_t nb, int bits,
                                      const uint8_t *wdata, const void *wscale,
                                      const void *woffset, int half, int64_t g_first,
                                      int64_t g_last, int64_t n_out, const float *bias,
                                      float *out, int64_t out_stride) {
    double local[2 * 512];
    size_t n = (size_t)(T * nb);
    double *xs = n <= 512 ? local : (double *)malloc(sizeof(double) * 2 * n);
    if (!xs) { /* no memory for the float64 copies: the portable kernel, same bits */
        NP_NAME(i8_matmul_portable)(codes, xscale, xsums, T, nb, bits, wdata, wscale, woffset,
                                    half, g_first, g_last, n_out, bias, out, out_stride);
        return;
    }
    double *ss = xs + n;
    for (size_t i = 0; i < n; i++) {
        xs[i] = (double)xscale[i];
        ss[i] = (double)xsums[i];
    }
    NP_NAME(i8_matmul_tiles)(codes, xs, ss, T, nb, bits, wdata, wscale, woffset, half, g_first,
                             g_last, n_out, bias, out, out_stride);
    if (xs != local) free(xs);
}
#endif

/* -- pinned norms ------------------------------------------------------------------------- */
/* The halving tree of kernels/i8_ops.py: v zero-padded to a power of two P, then
 * v[i] = v[i] + v[i + P/2] for P/2, P/4, ..., 1; returns v[0]. */
static double NP_NAME(i8_tree)(double *v, int64_t n, int64_t p) {
    for (int64_t i = n; i < p; i++) v[i] = 0.0;
    while (p > 1) {
        p >>= 1;
        for (int64_t i = 0; i < p; i++) v[i] = v[i] + v[i + p];
    }
    return v[0];
}

/* RMSNorm (bias NULL, center 0) or LayerNorm (center 1) of each row of x [T, d]:
 * rms:   ss = tree(x*x), inv = 1 / sqrt(ss / d + eps), y = f32((x * inv) * w)
 * layer: m = tree(x) / d, c = x - m, var = tree(c*c) / d, inv = 1 / sqrt(var + eps),
 *        y = f32(((c * inv) * w) + b); all in float64. */
static int NP_NAME(i8_norm)(const float *x, int64_t T, int64_t d, const float *w,
                            const float *bias, double eps, int center, float *out) {
    int64_t p = 1;
    while (p < d) p <<= 1;
    double *buf = (double *)malloc(sizeof(double) * (size_t)(2 * p));
    if (!buf) return I8_NOMEM;
    double *c = buf + p;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * d;
        double mean = 0.0;
        if (center) {
            for (int64_t k = 0; k < d; k++) buf[k] = (double)row[k];
            mean = NP_NAME(i8_tree)(buf, d, p) / (double)d;
        }
        for (int64_t k = 0; k < d; k++) {
            c[k] = center ? (double)row[k] - mean : (double)row[k];
            buf[k] = c[k] * c[k];
        }
        double var = NP_NAME(i8_tree)(buf, d, p) / (double)d;
        double inv = 1.0 / sqrt(var + eps);
        float *o = out + t * d;
        for (int64_t k = 0; k < d; k++) {
            double y = c[k] * inv;
            y = y * (double)w[k];
            if (bias) y = y + (double)bias[k];
            o[k] = (float)y;
        }
    }
    free(buf);
    return I8_OK;
}
