/* The transformer int8 numerics' causal attention (np_i8.h; included once per instruction-set
 * variant, like np_i8_body.h): the one attention row of np_attend.h over the cache rows
 * p * stride + g, several query rows of a kv head at a time; the numpy reference is
 * `kernels.pinned.attend_reference` (tests/kernels/test_i8_block.py checks the bits). The
 * pinned exp and the A8 codes are the library's own (np_exp.h, np_a8.h). */

/* Values of kv head g at positions 0 .. n-1 (cache rows p * stride + g) as float32:
 * vf[p, e] = f32(v[e]) * sv, the attention's per-key product, once per call instead of once
 * per query row that reads it. */
static void NP_NAME(i8_values)(const int8_t *vcode, const float *vscale, int64_t n,
                               int64_t stride, int64_t g, int64_t hd, float *vf) {
    for (int64_t p = 0; p < n; p++) {
        int64_t row = p * stride + g;
        const int8_t *v = vcode + row * hd;
        float sv = vscale[row];
        for (int64_t e = 0; e < hd; e++) vf[p * hd + e] = (float)v[e] * sv;
    }
}

#if defined(NP_SIMD_AVX512)
#define I8_VW 16
#define I8_V __m512
#define I8_VZERO _mm512_setzero_ps()
#define I8_VSET1 _mm512_set1_ps
#define I8_VLOAD _mm512_loadu_ps
#define I8_VSTORE _mm512_storeu_ps
#define I8_VADD _mm512_add_ps
#define I8_VMUL _mm512_mul_ps
#elif defined(NP_SIMD_AVX2)
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
static inline void NP_NAME(i8_weighted)(const float *prob, const float *vf, int64_t n,
                                        int64_t hd, const int R, float *out,
                                        int64_t out_stride) {
    int64_t e0 = 0;
#if defined(NP_SIMD_AVX2)
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

#if defined(NP_SIMD_AVX512)
#include "np_i8_keys.h"
#endif

/* The cache rows p * stride + g (p = 0 .. n-1) of kv head g as the one attention row's view
 * (np_attend.h). */
static inline np_kv_view NP_NAME(i8_view)(const int16_t *kcode, const float *kscale,
                                         const int8_t *vcode, const float *vscale,
                                         int64_t stride, int64_t g, int64_t hd) {
    np_kv_view kv = {NULL, vcode + g * hd, kscale + g, vscale + g, stride * hd,
                     stride * hd, stride, 0, 0, NULL, kcode + g * hd};
    return kv;
}

/* R query rows (R <= 4, constant where inlined) of one position and kv head (int16 codes,
 * rows q0, q0 + hd, ...; scales sq[0 ..]) against its n keys: the one attention row's scores (or, where kt
 * is not NULL, the same scores from the keys prepared by i8_keys_t), exps and normalisation
 * per row, then the value sums of the R rows together from the head's values as float32
 * (i8_values, i8_weighted): the same operations, the same bits. work: R * n floats. */
static inline void NP_NAME(i8_attend_vf)(const int16_t *q0, const float *sq, const int R,
                                         int64_t n, const np_kv_view *kv, int64_t hd,
                                         const float *vf, const int16_t *kt,
                                         const double *ksc,
                                         double inv_sqrt, float *out, float *work) {
    for (int r = 0; r < R; r++) {
        float *w = work + r * n;
#if defined(NP_SIMD_AVX512)
        if (kt)
            NP_NAME(i8_scores_t)(q0 + r * hd, sq[r], n, hd, kt, ksc, inv_sqrt, w);
        else
#endif
            NP_NAME(np_att_scores)(q0 + r * hd, sq[r], hd, kv, n, inv_sqrt, w);
        NP_NAME(np_att_exp)(w, n);
        NP_NAME(np_att_normalise)(w, n);
    }
    (void)kt, (void)ksc;
    NP_NAME(i8_weighted)(work, vf, n, hd, R, out, hd);
}

#define I8_ATTEND_CASE(c)                                                                  \
    case c:                                                                                \
        NP_NAME(i8_attend_vf)(qcode + row * hd, qscale + row, c, start + t + 1, &kv, hd, vf, \
                              kt, ksc, inv_sqrt, out + row * hd, wk);                \
        break;

/* Causal attention of T positions start .. start+T-1: query rows (t, h) of qcode [T*H, hd]
 * (int16 A16 codes, like the keys)
 * against the cache's positions 0 .. start+t of kv head h / (H / Hkv) -> out [T, H*hd].
 * Kv head by kv head, its values dequantised once (i8_values); without memory for them,
 * row by row (np_att_row): the same bits either way. */
static void NP_NAME(i8_attend_causal)(const int16_t *qcode, const float *qscale, int64_t T,
                                      int64_t start, int64_t heads, int64_t kv_heads,
                                      int64_t hd, const int16_t *kcode, const float *kscale,
                                      const int8_t *vcode, const float *vscale, float *out,
                                      float *work) {
    int64_t group = heads / kv_heads, n = start + T, n16 = (n + 15) / 16 * 16;
    double inv_sqrt = 1.0 / sqrt((double)hd);
    float *vf = (float *)malloc(sizeof(float) * (size_t)(n * hd + 4 * n));
    float *wk = vf ? vf + n * hd : NULL; /* 4 rows' softmax weights */
    int16_t *kt = NULL;
    double *ksc = NULL;
#if defined(NP_SIMD_AVX512)
    /* the vector scores (np_i8_keys.h), worth rearranging the keys for from a few rows up */
    if (hd % 4 == 0 && hd <= 256 && T >= 4) {
        kt = (int16_t *)malloc(sizeof(int16_t) * (size_t)(n16 * hd));
        ksc = (double *)malloc(sizeof(double) * (size_t)n16);
        if (!kt || !ksc) {
            free(kt), free(ksc);
            kt = NULL, ksc = NULL;
        }
    }
#endif
    (void)n16;
    for (int64_t g = 0; vf && g < kv_heads; g++) {
        NP_NAME(i8_values)(vcode, vscale, n, kv_heads, g, hd, vf);
        np_kv_view kv = NP_NAME(i8_view)(kcode, kscale, vcode, vscale, kv_heads, g, hd);
#if defined(NP_SIMD_AVX512)
        if (kt) NP_NAME(i8_keys_t)(kcode, kscale, n, kv_heads, g, hd, kt, ksc);
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
    free(ksc);
    if (vf) {
        free(vf);
        return;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t row = t * heads + h;
            np_kv_view kv = NP_NAME(i8_view)(kcode, kscale, vcode, vscale, kv_heads, h / group,
                                             hd);
            NP_NAME(np_att_row)(qcode + row * hd, qscale[row], hd, hd, &kv, start + t + 1,
                                inv_sqrt, out + row * hd, work);
        }
}

#undef I8_ATTEND_CASE
#if defined(NP_SIMD_AVX2)
#undef I8_VW
#undef I8_V
#undef I8_VZERO
#undef I8_VSET1
#undef I8_VLOAD
#undef I8_VSTORE
#undef I8_VADD
#undef I8_VMUL
#endif
