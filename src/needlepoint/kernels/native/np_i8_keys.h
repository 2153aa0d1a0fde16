/* The AVX-512 VNNI variant's attention scores (included by np_i8_rows.h in that variant only):
 * sixteen keys per vector instead of one reduction per key. The keys of one kv head are
 * rearranged once per call, 16 keys x 4 codes per 64 bytes; a query row's codes enter as
 * unsigned bytes q + 128 (q ^ 0x80), so vpdpbusd forms sum (q + 128) k exactly and
 * 128 * sum k (per key, once per call) takes it back to the exact integer dot. The scale
 * chain ((dot * sq) * sk) * inv_sqrt runs in float64, eight keys per vector, the same
 * operations in the same order as np_att_scores (np_attend.h): the same bits. */

/* Keys of kv head g at positions 0 .. n-1 (cache rows p * stride + g), zero past n up to a
 * multiple of 16: kt [n16 / 16][hd / 4][16][4], ksum [n16] (sum of each key's codes),
 * ksc [n16] (its scale in float64). */
static void NP_NAME(i8_keys_t)(const int8_t *kcode, const float *kscale, int64_t n,
                               int64_t stride, int64_t g, int64_t hd, int8_t *kt,
                               int32_t *ksum, double *ksc) {
    int64_t n16 = (n + 15) / 16 * 16, h4 = hd / 4;
    for (int64_t p = 0; p < n16; p++) {
        int64_t j = p / 16, i = p % 16;
        int32_t total = 0;
        const int8_t *k = p < n ? kcode + (p * stride + g) * hd : NULL;
        for (int64_t e4 = 0; e4 < h4; e4++) {
            int32_t four = 0;
            if (k) {
                memcpy(&four, k + 4 * e4, 4);
                for (int c = 0; c < 4; c++) total += k[4 * e4 + c];
            }
            memcpy(kt + ((j * h4 + e4) * 16 + i) * 4, &four, 4);
        }
        ksum[p] = total;
        ksc[p] = k ? (double)kscale[p * stride + g] : 0.0;
    }
}

/* np_att_scores of query row q against the first n prepared keys (i8_keys_t). */
static void NP_NAME(i8_scores_t)(const int8_t *q, float sq_f, int64_t n, int64_t hd,
                                  const int8_t *kt, const int32_t *ksum, const double *ksc,
                                  double inv_sqrt, float *work) {
    int64_t h4 = hd / 4;
    __m512i qb[64];
    for (int64_t e4 = 0; e4 < h4; e4++) {
        uint32_t four;
        memcpy(&four, q + 4 * e4, 4);
        qb[e4] = _mm512_set1_epi32((int32_t)(four ^ 0x80808080u));
    }
    const __m512d sq = _mm512_set1_pd((double)sq_f), inv = _mm512_set1_pd(inv_sqrt);
    for (int64_t p0 = 0; p0 < n; p0 += 16) {
        const int8_t *kb = kt + p0 * hd;
        __m512i acc = _mm512_setzero_si512();
        for (int64_t e4 = 0; e4 < h4; e4++)
            acc = _mm512_dpbusd_epi32(acc, qb[e4], _mm512_loadu_si512(kb + e4 * 64));
        acc = _mm512_sub_epi32(acc, _mm512_slli_epi32(_mm512_loadu_si512(ksum + p0), 7));
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
