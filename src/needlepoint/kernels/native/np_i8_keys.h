/* The AVX-512 VNNI variant's attention scores (included by np_i8_rows.h in that variant only):
 * sixteen keys per vector instead of one reduction per key. The int16 keys of one kv head are
 * rearranged once per call, 16 keys x 2 codes per 64 bytes; a query row's int8 codes enter
 * as int16 pairs, so vpdpwssd forms the exact integer dot (|q k| <= 128 * 32768, at most 256
 * codes: every partial sum fits in int32). The scale chain ((dot * sq) * sk) * inv_sqrt runs
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
static void NP_NAME(i8_scores_t)(const int8_t *q, float sq_f, int64_t n, int64_t hd,
                                  const int16_t *kt, const double *ksc, double inv_sqrt,
                                  float *work) {
    int64_t h2 = hd / 2;
    __m512i qb[128];
    for (int64_t e2 = 0; e2 < h2; e2++) {
        uint32_t pair = (uint32_t)(uint16_t)(int16_t)q[2 * e2] |
                        ((uint32_t)(uint16_t)(int16_t)q[2 * e2 + 1] << 16);
        qb[e2] = _mm512_set1_epi32((int32_t)pair);
    }
    const __m512d sq = _mm512_set1_pd((double)sq_f), inv = _mm512_set1_pd(inv_sqrt);
    for (int64_t p0 = 0; p0 < n; p0 += 16) {
        const int16_t *kb = kt + p0 * hd;
        __m512i acc = _mm512_setzero_si512();
        for (int64_t e2 = 0; e2 < h2; e2++)
            acc = _mm512_dpwssd_epi32(acc, qb[e2], _mm512_loadu_si512(kb + e2 * 32));
        __m512d lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc));
        __m512d hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc, 1));
        lo = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(lo, sq), _mm512_loadu_pd(ksc + p0)), inv);
        hi = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(hi, sq), _mm512_loadu_pd(ksc + p0 + 8)),
                           inv);
        float s16[16];
        _mm256_storeu_ps(s16, _mm512_cvtpd_ps(lo));
        _mm256_storeu_ps(s16 + 8, _mm512_cvtpd_ps(hi));
        memcpy(work + p0, s16, sizeof(float) * (size_t)(n - p0 < 16 ? n - p0 : 16));
    }
}
