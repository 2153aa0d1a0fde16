/* Exact CQ x A8 products in integers, 4-bit storage, AVX-512 VNNI variant only (included by
 * np_body.h after np_cq_int.h; the other variants keep the float64 kernel, same bits).
 * docs/numerics.md "Exact CQ x A8 products".
 *
 * Every level is an integer multiple k_j of the codebook quantum qu (the smallest ulp of its
 * non-zero levels, `check_codebook`), so a group's sum is D = qu * sum_c k[idx_c] v_c, with
 * the integer sum below 2^53 (check_codebook; checked again here, else NP_BADARG and the
 * float64 kernel runs). With kmin = min_j k_j and k' = k - kmin >= 0 cut into P bytes
 * k'_p (P <= 5 since |k| < 2^32):
 *   sum_c k[idx_c] v_c = sum_p 256^p sum_c k'_p[idx_c] v_c + kmin * sum_c v_c,
 * each inner sum a u8 x s8 product (vpshufb of the 4-bit code into a 16-entry byte table,
 * vpdpbusd against the activation bytes vl, vh of np_cq_int.h: v = 128 vh + vl), at most
 * 128 * 255 * 2^14 < 2^29 in magnitude, combined exactly in int64; D = (double)sum * qu is
 * exact (|sum| < 2^53, qu a power of two), so the unchanged epilogue gives the same bits.
 * Activation bytes: byte k of a group's 64 holds columns 2k (low nibble) and 2k + 1, so
 * field s (nibble) of all 64 bytes meets vl/vh of columns 2k + s at (g * 2 + s) * 64 + k. */

#ifdef NP_SIMD_AVX512
#define NP_I4_RB 2 /* activation rows per pass over the weights */

typedef struct {
    __m512i tab[5]; /* byte p of k'_j, j = 0..15, in every 128-bit lane */
    int pieces;
    int64_t kmin;
    double quantum;
} np_i4_levels;

/* The codebook as integers; NP_BADARG when some level is not finite or the sums could reach
 * 2^53 quanta (then the float64 kernel, exact under the same check, runs). */
static int NP_NAME(np_i4_levels_of)(const float *codebook, int64_t codebook_len,
                                    np_i4_levels *lv) {
    float cb[16] = {0};
    double quantum = 0.0;
    for (int64_t j = 0; j < codebook_len && j < 16; j++) cb[j] = codebook[j];
    for (int j = 0; j < 16; j++) {
        float a = fabsf(cb[j]);
        if (!(a <= 3.4028234663852886e38f)) return NP_BADARG;
        if (a == 0.0f) continue;
        int e;
        frexpf(a, &e); /* a = m 2^e, m in [0.5, 1): ulp 2^(e - 24), at least 2^-149 */
        double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
        if (quantum == 0.0 || ulp < quantum) quantum = ulp;
    }
    if (quantum == 0.0) quantum = 1.0;
    int64_t k[16], kmin = 0, kmax = 0, peak = 0;
    for (int j = 0; j < 16; j++) {
        double q = (double)cb[j] / quantum;
        if (!(fabs(q) < 4294967296.0)) return NP_BADARG; /* |k| < 2^32: 2^21 |k| < 2^53 */
        k[j] = (int64_t)q;
        if (k[j] < kmin || j == 0) kmin = k[j];
        if (k[j] > kmax || j == 0) kmax = k[j];
        if (llabs(k[j]) > peak) peak = llabs(k[j]);
    }
    if (peak * 16384 * 128 >= (int64_t)1 << 53) return NP_BADARG;
    int pieces = 1;
    while (pieces < 5 && ((kmax - kmin) >> (8 * pieces)) != 0) pieces++;
    for (int p = 0; p < 5; p++) {
        uint8_t bytes[16];
        for (int j = 0; j < 16; j++) bytes[j] = (uint8_t)(((k[j] - kmin) >> (8 * p)) & 255);
        lv->tab[p] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)bytes));
    }
    lv->pieces = pieces;
    lv->kmin = kmin;
    lv->quantum = quantum;
    return NP_OK;
}

/* One group (64 code bytes) against nb activation rows: the P piece sums' lanes, folded to
 * 8 int32, to f[(b * 5 + p) * fstride + lane]. */
static inline __attribute__((always_inline)) void NP_NAME(np_i4_group)(
    const uint8_t *bytes, const int8_t *L, const int8_t *H, int64_t act_bytes, const int nb,
    const int P, const np_i4_levels *lv, int32_t *f, int64_t fstride) {
    const __m512i c = _mm512_loadu_si512((const void *)bytes);
    const __m512i low = _mm512_set1_epi8(15);
    const __m512i nib[2] = {_mm512_and_si512(c, low),
                            _mm512_and_si512(_mm512_srli_epi16(c, 4), low)};
    __m512i accl[NP_I4_RB][5], acch[NP_I4_RB][5];
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < P; p++) accl[b][p] = acch[b][p] = _mm512_setzero_si512();
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < P; p++) {
            __m512i kp = _mm512_shuffle_epi8(lv->tab[p], nib[s]);
            for (int b = 0; b < nb; b++) {
                const int8_t *at = L + b * act_bytes + s * 64;
                accl[b][p] = _mm512_dpbusd_epi32(accl[b][p], kp, _mm512_loadu_si512(at));
                acch[b][p] = _mm512_dpbusd_epi32(
                    acch[b][p], kp, _mm512_loadu_si512((const void *)(H - L + at)));
            }
        }
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < P; p++) {
            __m512i sum = _mm512_add_epi32(accl[b][p], _mm512_slli_epi32(acch[b][p], 7));
            __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(sum),
                                            _mm512_extracti64x4_epi64(sum, 1));
            _mm256_storeu_si256((__m256i *)(f + (b * 5 + p) * fstride), half);
        }
}

/* D of 8 groups from their folded piece lanes (module comment), exact int64 then one exact
 * conversion and scaling. */
static inline void NP_NAME(np_i4_dots8)(const int32_t *f, int64_t fstride, int P,
                                        const int32_t *tot, const np_i4_levels *lv,
                                        double *dots) {
    __m512i acc = _mm512_mullo_epi64(
        _mm512_cvtepi32_epi64(_mm256_loadu_si256((const __m256i *)tot)),
        _mm512_set1_epi64(lv->kmin));
    for (int p = 0; p < P; p++) {
        __m256i sums = NP_NAME(np_i2_hsum8)(f + p * fstride);
        acc = _mm512_add_epi64(acc, _mm512_slli_epi64(_mm512_cvtepi32_epi64(sums), 8 * p));
    }
    __m512d d = _mm512_mul_pd(_mm512_cvtepi64_pd(acc), _mm512_set1_pd(lv->quantum));
    _mm512_storeu_pd(dots, d);
}

static inline __attribute__((always_inline)) void NP_NAME(np_i4_rows)(
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const int8_t *lo,
    const int8_t *hi, const int32_t *tot, int64_t act_bytes, const int nb, const int P,
    const np_i4_levels *lv, const double *s, float *out, int64_t out_stride, double *dots,
    int32_t *fbuf) {
    int64_t g8 = (groups + 7) & ~(int64_t)7, fstride = g8 * 8, dstride = NP_I4_RB * g8;
    for (int64_t r4 = r0; r4 < r1; r4 += 4) {
        int rows = (int)(r1 - r4 < 4 ? r1 - r4 : 4);
        for (int i = 0; i < rows; i++) {
            const uint8_t *p = part->packed + (r4 + i) * part->row_bytes;
            for (int64_t g = 0; g < groups; g++)
                NP_NAME(np_i4_group)(p + g * 64, lo + g * 128, hi + g * 128, act_bytes, nb, P,
                                     lv, fbuf + g * 8, fstride);
            for (int b = 0; b < nb; b++)
                for (int64_t g = 0; g < groups; g += 8)
                    NP_NAME(np_i4_dots8)(fbuf + b * 5 * fstride + g * 8, fstride, P,
                                         tot + b * g8 + g, lv, dots + i * dstride + b * g8 + g);
        }
        const float *norms = part->norms + r4 * groups;
        for (int b = 0; b < nb; b++) {
            float *o = out + b * out_stride + part->out_col + r4;
            if (rows == 4)
                NP_NAME(np_i2_epilogue4)(dots + b * g8, dstride, norms, groups, s[b], o);
            else
                for (int i = 0; i < rows; i++)
                    o[i] = NP_NAME(np_epilogue)(dots + i * dstride + b * g8,
                                                norms + i * groups, groups, s[b]);
        }
    }
}

#define NP_I4_CASE(nb, P)                                                                  \
    NP_NAME(np_i4_rows)(&parts[p], groups, a, z, L, H, tt, act_bytes, nb, P, &lv, s, o,      \
                        out_stride, dots, fbuf)

/* np_cq_matmul for 4-bit storage in integers (AVX-512 VNNI). NP_BADARG (nothing written)
 * when the codebook or v is outside what the integer sums cover: the float64 kernel runs. */
static int NP_NAME(np_cq_int4)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const float *codebook, int64_t codebook_len,
                               const np_cq_part *parts, int64_t n_parts, float *out,
                               int64_t out_stride, int64_t r_first, int64_t r_last) {
    np_i4_levels lv;
    if (NP_NAME(np_i4_levels_of)(codebook, codebook_len, &lv) != NP_OK) return NP_BADARG;
    int64_t groups = in_pad / 128, g8 = (groups + 7) & ~(int64_t)7;
    int64_t act_bytes = groups * 128;
    int8_t *lo = (int8_t *)malloc((size_t)(2 * T * act_bytes + 64));
    int32_t *tot = (int32_t *)calloc((size_t)(T * g8), sizeof(int32_t));
    double *dots = (double *)malloc(sizeof(double) * (size_t)(4 * NP_I4_RB * g8));
    int32_t *fbuf = (int32_t *)calloc((size_t)(NP_I4_RB * 5 * g8 * 8), sizeof(int32_t));
    if (!lo || !tot || !dots || !fbuf) {
        free(lo);
        free(tot);
        free(dots);
        free(fbuf);
        return NP_NOMEM;
    }
    int8_t *hi = lo + T * act_bytes;
    int status = NP_NAME(np_int_prepare)(v, T, in_pad, 2, lo, hi, tot, act_bytes);
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += NP_I4_RB) {
        int nb = (int)(T - t0 < NP_I4_RB ? T - t0 : NP_I4_RB);
        double s[NP_I4_RB];
        for (int b = 0; b < nb; b++) s[b] = (double)scale[t0 + b];
        const int8_t *L = lo + t0 * act_bytes, *H = hi + t0 * act_bytes;
        const int32_t *tt = tot + t0 * g8;
        float *o = out + t0 * out_stride;
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (a < z) {
                int key = nb * 8 + lv.pieces;
                switch (key) {
                case 21: NP_I4_CASE(2, 5); break;
                case 20: NP_I4_CASE(2, 4); break;
                case 19: NP_I4_CASE(2, 3); break;
                case 18: NP_I4_CASE(2, 2); break;
                case 17: NP_I4_CASE(2, 1); break;
                case 13: NP_I4_CASE(1, 5); break;
                case 12: NP_I4_CASE(1, 4); break;
                case 11: NP_I4_CASE(1, 3); break;
                case 10: NP_I4_CASE(1, 2); break;
                default: NP_I4_CASE(1, 1); break;
                }
            }
            base += parts[p].rows;
        }
    }
    free(lo);
    free(tot);
    free(dots);
    free(fbuf);
    return status;
}
#undef NP_I4_CASE
#undef NP_I4_RB
#endif
