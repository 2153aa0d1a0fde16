/* Row kernels of np_i8.h (included once per instruction-set variant, like np_i8_body.h):
 * the pinned exp, A8 row codes and int8 attention, operation for operation the numpy
 * references `kernels.pinned.exp32_reference`, `kernels.exact.a8_codes_reference` and
 * `kernels.pinned.attend_reference` (tests/kernels/test_i8_block.py checks the bits). */

/* The pinned exp and the A8 row codes are the library's own (np_exp.h, np_a8.h: np_exp32,
 * np_exp32_array, np_a8_codes, compiled in the same variant block); these names keep the
 * int8 kernels' spelling. */
static inline float I8_NAME(i8_exp32)(float x) { return NP_NAME(np_exp32)(x); }

static void I8_NAME(i8_exp32_array)(const float *x, int64_t n, float *out) {
    NP_NAME(np_exp32_array)(x, n, out);
}

static int I8_NAME(i8_a8_rows)(const float *x, int64_t T, int64_t cols, int8_t *codes,
                               float *scale) {
    return NP_NAME(np_a8_codes)(x, T, cols, codes, scale);
}

static int I8_NAME(i8_a8_row)(const float *row, int64_t cols, int8_t *codes, float *scale) {
    return NP_NAME(np_a8_codes)(row, 1, cols, codes, scale);
}

/* Query row q (codes, scale sq) against keys p = 0 .. n-1 at rows p * stride + g of the
 * int8 cache (hd codes each, scales at the same row index), in position order:
 * score_p = f32(((dot * sq) * sk_p) * inv_sqrt), then work[p] = exp32(score_p - peak), the
 * softmax's unnormalised weights (kernels/pinned.py attend). */
static void I8_NAME(i8_softmax_row)(const int8_t *q, float sq_f, int64_t n, int64_t stride,
                                    int64_t g, int64_t hd, const int8_t *kcode,
                                    const float *kscale, double inv_sqrt, float *work) {
    double sq = (double)sq_f;
    float peak = -INFINITY;
#if defined(I8_SIMD_AVX2)
    if (hd % 16 == 0 && hd <= 256) { /* the same exact dots, sixteen codes at a time */
        __m256i qw[16];
        for (int64_t e = 0; e < hd; e += 16)
            qw[e / 16] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + e)));
        for (int64_t p = 0; p < n; p++) {
            int64_t row = p * stride + g;
            const int8_t *k = kcode + row * hd;
            __m256i acc = _mm256_setzero_si256();
            for (int64_t e = 0; e < hd; e += 16) {
                __m256i kw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k + e)));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(qw[e / 16], kw));
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc),
                                       _mm256_extracti128_si256(acc, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            int32_t dot = _mm_cvtsi128_si32(s4);
            double t = (double)dot * sq;
            t = t * (double)kscale[row];
            t = t * inv_sqrt;
            float score = (float)t;
            work[p] = score;
            if (score > peak) peak = score;
        }
    } else
#endif
    {
        for (int64_t p = 0; p < n; p++) {
            int64_t row = p * stride + g;
            const int8_t *k = kcode + row * hd;
            int32_t dot = 0;
            for (int64_t e = 0; e < hd; e++) dot += (int32_t)q[e] * (int32_t)k[e];
            double t = (double)dot * sq;
            t = t * (double)kscale[row];
            t = t * inv_sqrt;
            float score = (float)t;
            work[p] = score;
            if (score > peak) peak = score;
        }
    }
    for (int64_t p = 0; p < n; p++) work[p] = work[p] - peak;
    I8_NAME(i8_exp32_array)(work, n, work);
}

/* One query row's attention, out = sum_p prob_p * (v_p * sv_p) in position order, the
 * softmax's float32 sum in order (kernels/pinned.py attend); i8_attend_causal's fallback. */
static void I8_NAME(i8_attend_row)(const int8_t *q, float sq, int64_t n, int64_t stride,
                                   int64_t g, int64_t hd, const int8_t *kcode,
                                   const float *kscale, const int8_t *vcode,
                                   const float *vscale, double inv_sqrt, float *out,
                                   float *work) {
    I8_NAME(i8_softmax_row)(q, sq, n, stride, g, hd, kcode, kscale, inv_sqrt, work);
    float total = 0.0f;
    for (int64_t p = 0; p < n; p++) total = total + work[p];
    for (int64_t e = 0; e < hd; e++) out[e] = 0.0f;
    for (int64_t p = 0; p < n; p++) {
        int64_t row = p * stride + g;
        float prob = work[p] / total;
        const int8_t *v = vcode + row * hd;
        float sv = vscale[row];
        for (int64_t e = 0; e < hd; e++) {
            float value = (float)v[e] * sv;
            float prod = prob * value;
            out[e] = out[e] + prod;
        }
    }
}

/* Values of kv head g at positions 0 .. n-1 (cache rows p * stride + g) as float32:
 * vf[p, e] = f32(v[e]) * sv, the attention's per-key product, once per call instead of once
 * per query row that reads it. */
static void I8_NAME(i8_values)(const int8_t *vcode, const float *vscale, int64_t n,
                               int64_t stride, int64_t g, int64_t hd, float *vf) {
    for (int64_t p = 0; p < n; p++) {
        int64_t row = p * stride + g;
        const int8_t *v = vcode + row * hd;
        float sv = vscale[row];
        for (int64_t e = 0; e < hd; e++) vf[p * hd + e] = (float)v[e] * sv;
    }
}

#if defined(I8_SIMD_VNNI)
#define I8_VW 16
#define I8_V __m512
#define I8_VZERO _mm512_setzero_ps()
#define I8_VSET1 _mm512_set1_ps
#define I8_VLOAD _mm512_loadu_ps
#define I8_VSTORE _mm512_storeu_ps
#define I8_VADD _mm512_add_ps
#define I8_VMUL _mm512_mul_ps
#elif defined(I8_SIMD_AVX2)
#define I8_VW 8
#define I8_V __m256
#define I8_VZERO _mm256_setzero_ps()
#define I8_VSET1 _mm256_set1_ps
#define I8_VLOAD _mm256_loadu_ps
#define I8_VSTORE _mm256_storeu_ps
#define I8_VADD _mm256_add_ps
#define I8_VMUL _mm256_mul_ps
#endif

/* out_r[e] = sum_p prob_r[p] * vf[p, e] over p = 0 .. n-1 in order, each element's sum
 * starting from 0 (kernels/pinned.py attend), for R query rows at once (R constant where
 * inlined: R * 4 independent vector sums hide the add latency; each element's own sum is
 * still in key order). prob_r = prob + r * n, out_r = out + r * out_stride. */
static inline void I8_NAME(i8_weighted)(const float *prob, const float *vf, int64_t n,
                                        int64_t hd, const int R, float *out,
                                        int64_t out_stride) {
    int64_t e0 = 0;
#if defined(I8_SIMD_AVX2)
    for (; e0 + 4 * I8_VW <= hd; e0 += 4 * I8_VW) {
        I8_V a[4][4];
        for (int r = 0; r < R; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = I8_VZERO;
        for (int64_t p = 0; p < n; p++) {
            const float *v = vf + p * hd + e0;
            I8_V v0 = I8_VLOAD(v), v1 = I8_VLOAD(v + I8_VW), v2 = I8_VLOAD(v + 2 * I8_VW);
            I8_V v3 = I8_VLOAD(v + 3 * I8_VW);
            for (int r = 0; r < R; r++) {
                I8_V pr = I8_VSET1(prob[r * n + p]);
                a[r][0] = I8_VADD(a[r][0], I8_VMUL(pr, v0));
                a[r][1] = I8_VADD(a[r][1], I8_VMUL(pr, v1));
                a[r][2] = I8_VADD(a[r][2], I8_VMUL(pr, v2));
                a[r][3] = I8_VADD(a[r][3], I8_VMUL(pr, v3));
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++) I8_VSTORE(out + r * out_stride + e0 + c * I8_VW, a[r][c]);
    }
    for (; e0 + I8_VW <= hd; e0 += I8_VW)
        for (int r = 0; r < R; r++) {
            I8_V a0 = I8_VZERO;
            for (int64_t p = 0; p < n; p++)
                a0 = I8_VADD(a0, I8_VMUL(I8_VSET1(prob[r * n + p]), I8_VLOAD(vf + p * hd + e0)));
            I8_VSTORE(out + r * out_stride + e0, a0);
        }
#endif
    for (; e0 < hd; e0++)
        for (int r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < n; p++) {
                float prod = prob[r * n + p] * vf[p * hd + e0];
                acc = acc + prod;
            }
            out[r * out_stride + e0] = acc;
        }
}

/* The softmax's float32 sums in key order and prob = w / total, for R rows (R constant
 * where inlined: R independent sums). */
static inline void I8_NAME(i8_normalise)(float *work, int64_t n, const int R) {
    float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t p = 0; p < n; p++)
        for (int r = 0; r < R; r++) total[r] = total[r] + work[r * n + p];
    for (int r = 0; r < R; r++)
        for (int64_t p = 0; p < n; p++) work[r * n + p] = work[r * n + p] / total[r];
}

#if defined(I8_SIMD_VNNI)
#include "np_i8_keys.h"
#endif

/* R query rows (R <= 4, constant where inlined) of one position and kv head (rows q0, q0 +
 * hd, ...; scales sq[0 ..]) against its n keys, with the head's values as float32
 * (i8_values) and, where kt is not NULL, its keys prepared by i8_keys_t: i8_attend_row's
 * scores and softmax, its float32 sums, prob = w / total and its value sums; the same bits.
 * work: R * n floats. */
static inline void I8_NAME(i8_attend_vf)(const int8_t *q0, const float *sq, const int R,
                                         int64_t n, int64_t stride, int64_t g, int64_t hd,
                                         const int8_t *kcode, const float *kscale,
                                         const float *vf, const int8_t *kt,
                                         const int32_t *ksum, const double *ksc,
                                         double inv_sqrt, float *out, float *work) {
    for (int r = 0; r < R; r++) {
#if defined(I8_SIMD_VNNI)
        if (kt) {
            I8_NAME(i8_softmax_t)(q0 + r * hd, sq[r], n, hd, kt, ksum, ksc, inv_sqrt,
                                  work + r * n);
            continue;
        }
#endif
        I8_NAME(i8_softmax_row)(q0 + r * hd, sq[r], n, stride, g, hd, kcode, kscale, inv_sqrt,
                                work + r * n);
    }
    (void)kt, (void)ksum, (void)ksc;
    I8_NAME(i8_normalise)(work, n, R);
    I8_NAME(i8_weighted)(work, vf, n, hd, R, out, hd);
}

#define I8_ATTEND_CASE(c)                                                                  \
    case c:                                                                                \
        I8_NAME(i8_attend_vf)(qcode + row * hd, qscale + row, c, start + t + 1, kv_heads,   \
                              g, hd, kcode, kscale, vf, kt, ksum, ksc, inv_sqrt,           \
                              out + row * hd, wk);                                         \
        break;

/* Causal attention of T positions start .. start+T-1: query rows (t, h) of qcode [T*H, hd]
 * against the cache's positions 0 .. start+t of kv head h / (H / Hkv) -> out [T, H*hd].
 * Kv head by kv head, its values dequantised once (i8_values); without memory for them,
 * row by row (i8_attend_row): the same bits either way. */
static void I8_NAME(i8_attend_causal)(const int8_t *qcode, const float *qscale, int64_t T,
                                      int64_t start, int64_t heads, int64_t kv_heads,
                                      int64_t hd, const int8_t *kcode, const float *kscale,
                                      const int8_t *vcode, const float *vscale, float *out,
                                      float *work) {
    int64_t group = heads / kv_heads, n = start + T, n16 = (n + 15) / 16 * 16;
    double inv_sqrt = 1.0 / sqrt((double)hd);
    float *vf = (float *)malloc(sizeof(float) * (size_t)(n * hd + 4 * n));
    float *wk = vf ? vf + n * hd : NULL; /* 4 rows' softmax weights */
    int8_t *kt = NULL;
    int32_t *ksum = NULL;
    double *ksc = NULL;
#if defined(I8_SIMD_VNNI)
    /* the vector scores (np_i8_keys.h), worth rearranging the keys for from a few rows up */
    if (hd % 4 == 0 && hd <= 256 && T >= 4) {
        kt = (int8_t *)malloc((size_t)(n16 * hd));
        ksum = (int32_t *)malloc(sizeof(int32_t) * (size_t)n16);
        ksc = (double *)malloc(sizeof(double) * (size_t)n16);
        if (!kt || !ksum || !ksc) {
            free(kt), free(ksum), free(ksc);
            kt = NULL, ksum = NULL, ksc = NULL;
        }
    }
#endif
    (void)n16;
    for (int64_t g = 0; vf && g < kv_heads; g++) {
        I8_NAME(i8_values)(vcode, vscale, n, kv_heads, g, hd, vf);
#if defined(I8_SIMD_VNNI)
        if (kt) I8_NAME(i8_keys_t)(kcode, kscale, n, kv_heads, g, hd, kt, ksum, ksc);
#endif
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = g * group; h < (g + 1) * group; h += 4) {
                int64_t row = t * heads + h;
                switch ((g + 1) * group - h < 4 ? (int)((g + 1) * group - h) : 4) {
                    I8_ATTEND_CASE(4)
                    I8_ATTEND_CASE(3)
                    I8_ATTEND_CASE(2)
                    I8_ATTEND_CASE(1)
                }
            }
    }
    free(kt);
    free(ksum);
    free(ksc);
    if (vf) {
        free(vf);
        return;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t row = t * heads + h;
            I8_NAME(i8_attend_row)(qcode + row * hd, qscale[row], start + t + 1, kv_heads,
                                   h / group, hd, kcode, kscale, vcode, vscale, inv_sqrt,
                                   out + row * hd, work);
        }
}

#undef I8_ATTEND_CASE
#if defined(I8_SIMD_AVX2)
#undef I8_VW
#undef I8_V
#undef I8_VZERO
#undef I8_VSET1
#undef I8_VLOAD
#undef I8_VSTORE
#undef I8_VADD
#undef I8_VMUL
#endif
