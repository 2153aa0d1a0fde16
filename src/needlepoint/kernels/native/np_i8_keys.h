/* The AVX-512 VNNI variant's attention scores (included by np_i8_rows.h in that variant only):
 * sixteen keys per vector instead of one reduction per key. The int16 keys of one kv head are
 * rearranged once per call, 16 keys x 2 codes per 64 bytes; a query row's int16 codes enter
 * as pairs of their balanced byte digits (np_q16_hi / np_q16_lo, np_attend.h), so two
 * vpdpwssd chains form the exact integer dots of the digits (|digit k| <= 128 * 32767, at
 * most 256 codes: every partial sum fits in int32), and dot = 256 dot_hi + dot_lo in float64
 * (exact). The scale chain ((dot * sq) * sk) * inv_sqrt runs
 * in float64, eight keys per vector, the same operations in the same order as np_att_scores
 * (np_attend.h): the same bits. */

/* Keys of kv head g at positions 0 .. n-1 (cache rows p * stride + g), zero past n up to a
 * multiple of 16: kt [n16 / 16][hd / 2][16][2], ksc [n16] (each key's scale in float64). */
static void NP_NAME(i8_keys_t)(const int16_t *kcode, const float *kscale, int64_t n,
                               int64_t stride, int64_t g, int64_t hd, int16_t *kt,
                               double *ksc) {
    int64_t n16 = (n + 15) / 16 * 16, h2 = hd / 2;
    for (int64_t p = 0; p < n16; p++) {
        int64_t j = p / 16, i = p % 16;
        const int16_t *k = p < n ? kcode + (p * stride + g) * hd : NULL;
        for (int64_t e2 = 0; e2 < h2; e2++) {
            int16_t *at = kt + ((j * h2 + e2) * 16 + i) * 2;
            at[0] = k ? k[2 * e2] : 0;
            at[1] = k ? k[2 * e2 + 1] : 0;
        }
        ksc[p] = k ? (double)kscale[p * stride + g] : 0.0;
    }
}

/* np_att_scores of query row q against the first n prepared keys (i8_keys_t). */
static inline __m512i NP_NAME(i8_digit_pair)(int16_t a, int16_t b) {
    return _mm512_set1_epi32((int32_t)((uint32_t)(uint16_t)a | ((uint32_t)(uint16_t)b << 16)));
}

/* 16 keys' dots as float64 (keys 0-7, 8-15): 256 * high + low, each digit dot exact int32 */
static inline void NP_NAME(i8_dots16)(__m512i high, __m512i low, __m512d *lo, __m512d *hi) {
    const __m512d v256 = _mm512_set1_pd(256.0);
    *lo = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(high)), v256),
                        _mm512_cvtepi32_pd(_mm512_castsi512_si256(low)));
    *hi = _mm512_add_pd(
        _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(high, 1)), v256),
        _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(low, 1)));
}

static void NP_NAME(i8_scores_t)(const int16_t *q, float sq_f, int64_t n, int64_t hd,
                                  const int16_t *kt, const double *ksc, double inv_sqrt,
                                  float *work) {
    int64_t h2 = hd / 2;
    __m512i qh[128], ql[128];
    for (int64_t e2 = 0; e2 < h2; e2++) {
        qh[e2] = NP_NAME(i8_digit_pair)(np_q16_hi(q[2 * e2]), np_q16_hi(q[2 * e2 + 1]));
        ql[e2] = NP_NAME(i8_digit_pair)(np_q16_lo(q[2 * e2]), np_q16_lo(q[2 * e2 + 1]));
    }
    const __m512d sq = _mm512_set1_pd((double)sq_f), inv = _mm512_set1_pd(inv_sqrt);
    for (int64_t p0 = 0; p0 < n; p0 += 16) {
        const int16_t *kb = kt + p0 * hd;
        __m512i ah = _mm512_setzero_si512(), al = ah;
        for (int64_t e2 = 0; e2 < h2; e2++) {
            __m512i k = _mm512_loadu_si512(kb + e2 * 32);
            ah = _mm512_dpwssd_epi32(ah, qh[e2], k);
            al = _mm512_dpwssd_epi32(al, ql[e2], k);
        }
        __m512d lo, hi;
        NP_NAME(i8_dots16)(ah, al, &lo, &hi);
        lo = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(lo, sq), _mm512_loadu_pd(ksc + p0)), inv);
        hi = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(hi, sq), _mm512_loadu_pd(ksc + p0 + 8)),
                           inv);
        float s16[16];
        _mm256_storeu_ps(s16, _mm512_cvtpd_ps(lo));
        _mm256_storeu_ps(s16 + 8, _mm512_cvtpd_ps(hi));
        memcpy(work + p0, s16, sizeof(float) * (size_t)(n - p0 < 16 ? n - p0 : 16));
    }
}
