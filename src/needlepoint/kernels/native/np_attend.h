/* The one int8 attention row (docs/numerics.md "int8 attention"), for every
 * caller: np_attend (listed slots: kernels/pinned.py attend), the Needle 3 step (a ring of its
 * cache: np_v3_rows.h) and the transformer int8 attention (cache rows p * stride + g:
 * np_i8_rows.h). Included once per instruction-set variant (np_variant.h); needs np_exp.h.
 *
 * One query row (a head of one position) against `n` int8 keys/values of its kv head, in
 * position order: score_j = f32(((f64(dot_j) * f64(sq)) * f64(sk_j)) * inv_sqrt_qk) with dot_j
 * the exact integer product of the codes (int8 x int8; int16 x int16 for the transformer);
 * m = max_j score_j; e_j = exp32(score_j - m) (f32 subtraction); total = sum_j e_j (f32, j
 * ascending); p_j = e_j / total; out = sum_j p_j * f32(vcode_j * sv_j) (f32, j ascending from
 * 0, each product and sum rounded). Every caller
 * ran exactly these operations in this order before they shared this code (their separate
 * copies did); the SIMD variants run the same operations: the integer dots in any order
 * (exact), the float ones across independent keys (scores, exps, p_j) or across independent
 * output lanes (the value sum), never reassociated. */

#ifndef NP_KV_VIEW_DEFINED /* included once per variant; the type once */
#define NP_KV_VIEW_DEFINED
/* The keys and values a query row attends, in position order: key j is slot s_j, with
 * s_j = slots[j] where `slots` is set, else first + j taken modulo `wrap` (a ring; 0: no
 * wrap; first < wrap and n <= wrap). Key j's codes are at k + s_j * k_step and its scale at
 * ks[s_j * s_step]; its value's at v + s_j * v_step and vs[s_j * s_step]. */
typedef struct {
    const int8_t *k, *v;
    const float *ks, *vs;
    int64_t k_step, v_step, s_step;
    int64_t first, wrap;
    const int64_t *slots;
    /* Where set, the keys are int16 codes at k16 + s_j * k_step (k unused), and the query
     * rows int16 codes too: the transformer int8 numerics keep keys and queries at 16 bits,
     * since a few large channels (Qwen's k bias, Gemma 3's q/k norm weights) leave the rest
     * of an 8-bit row with too few levels (docs/numerics.md). */
    const int16_t *k16;
    /* Where set (int8 keys of a ring or linear store, s_step 1), the same keys sixteen slots to
     * a vector, slot s at kt[((s / 16) * (qk / 4) + c) * 64 + (s % 16) * 4 + i] = code 4c + i,
     * and their code sums ksum[s]: np_att_rows scores 16 keys per vpdpbusd. */
    const int8_t *kt;
    const int32_t *ksum;
} np_kv_view;

static inline int64_t np_kv_slot(const np_kv_view *kv, int64_t j) {
    if (kv->slots) return kv->slots[j];
    int64_t s = kv->first + j;
    return kv->wrap && s >= kv->wrap ? s - kv->wrap : s;
}
#endif

#if defined(NP_SIMD_AVX2)
/* dot_j for 4 keys at once (qk a multiple of 16): q as 16-bit lanes, vpmaddwd per 16 codes */
static inline __m128i NP_NAME(np_att_dot4)(const __m256i *q16, int64_t chunks, const int8_t *k0,
                                           const int8_t *k1, const int8_t *k2,
                                           const int8_t *k3) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
#define NP_ATT_MADD(acc, k)                                                                     \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(q, _mm256_cvtepi8_epi16(                       \
                                        _mm_loadu_si128((const __m128i *)((k) + 16 * c)))))
    for (int64_t c = 0; c < chunks; c++) {
        __m256i q = q16[c];
        NP_ATT_MADD(a0, k0);
        NP_ATT_MADD(a1, k1);
        NP_ATT_MADD(a2, k2);
        NP_ATT_MADD(a3, k3);
    }
#undef NP_ATT_MADD
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
#endif

#ifndef NP_Q16_DIGITS_DEFINED
#define NP_Q16_DIGITS_DEFINED
/* A 16-bit query code q in [-32767, 32767] (A16 codes never reach -32768) as balanced byte
 * digits q = 256 hi + lo, hi = (q + 128) >> 8 in [-128, 128], lo in [-128, 127]: against
 * int16 keys (|k| <= 32767) each digit's dot over at most 512 codes stays inside int32
 * (512 * 128 * 32767 < 2^31), and dot = 256 * dot_hi + dot_lo exactly. */
static inline int16_t np_q16_hi(int16_t q) { return (int16_t)(((int32_t)q + 128) >> 8); }
static inline int16_t np_q16_lo(int16_t q) {
    return (int16_t)((int32_t)q - 256 * (((int32_t)q + 128) >> 8));
}
#endif

#if defined(NP_SIMD_AVX2)
/* the int32 dots of 4 int16 keys with the query's two digit rows dh, dl (qk a multiple of 16,
 * at most 512), each key chunk loaded once for both: *high, *low (4 keys each) */
static inline void NP_NAME(np_att_dot4_16)(const __m256i *dh, const __m256i *dl, int64_t chunks,
                                           const int16_t *k0, const int16_t *k1,
                                           const int16_t *k2, const int16_t *k3, __m128i *high,
                                           __m128i *low) {
    __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
    __m256i l0 = h0, l1 = h0, l2 = h0, l3 = h0;
#define NP_ATT_MADD16(hacc, lacc, k)                                                            \
    do {                                                                                       \
        __m256i kv_ = _mm256_loadu_si256((const __m256i *)((k) + 16 * c));                     \
        hacc = _mm256_add_epi32(hacc, _mm256_madd_epi16(qh, kv_));                             \
        lacc = _mm256_add_epi32(lacc, _mm256_madd_epi16(ql, kv_));                             \
    } while (0)
    for (int64_t c = 0; c < chunks; c++) {
        __m256i qh = dh[c], ql = dl[c];
        NP_ATT_MADD16(h0, l0, k0);
        NP_ATT_MADD16(h1, l1, k1);
        NP_ATT_MADD16(h2, l2, k2);
        NP_ATT_MADD16(h3, l3, k3);
    }
#undef NP_ATT_MADD16
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(h0, h1), _mm256_hadd_epi32(h2, h3));
    __m256i l = _mm256_hadd_epi32(_mm256_hadd_epi32(l0, l1), _mm256_hadd_epi32(l2, l3));
    *high = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    *low = _mm_add_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
}
#endif

/* The score epilogue, one order for every path and key width:
 * ((dot * qscale) * kscale) * 1/sqrt(qk) in float64, then rounded to float32. */
static inline float NP_NAME(np_att_score1)(double dot, double sq, const np_kv_view *kv,
                                           int64_t s, double inv_sqrt_qk) {
    double t = dot * sq;
    t = t * (double)kv->ks[s * kv->s_step];
    t = t * inv_sqrt_qk;
    return (float)t;
}

/* Scores j..n-1 one key at a time (what the SIMD paths leave): q holds int16 codes where the
 * keys are int16 (kv->k16), int8 codes otherwise; every dot exact in int64. */
static void NP_NAME(np_att_scores_tail)(const void *qv, double sq, int64_t qk,
                                        const np_kv_view *kv, int64_t j, int64_t n,
                                        double inv_sqrt_qk, float *work) {
    for (; j < n; j++) {
        int64_t s = np_kv_slot(kv, j), dot = 0;
        if (kv->k16) {
            const int16_t *q = (const int16_t *)qv, *k = kv->k16 + s * kv->k_step;
            for (int64_t e = 0; e < qk; e++) dot += (int64_t)q[e] * (int64_t)k[e];
        } else {
            const int8_t *q = (const int8_t *)qv, *k = kv->k + s * kv->k_step;
            for (int64_t e = 0; e < qk; e++) dot += (int64_t)q[e] * (int64_t)k[e];
        }
        work[j] = NP_NAME(np_att_score1)((double)dot, sq, kv, s, inv_sqrt_qk);
    }
}

#if defined(NP_SIMD_AVX2)
static inline void NP_NAME(np_att_score4)(__m256d dot, __m256d vsq, __m256d vinv,
                                          const np_kv_view *kv, int64_t s0, int64_t s1,
                                          int64_t s2, int64_t s3, float *out) {
    const float *ks = kv->ks;
    const int64_t ss = kv->s_step;
    __m256d t = _mm256_mul_pd(dot, vsq);
    t = _mm256_mul_pd(t, _mm256_set_pd((double)ks[s3 * ss], (double)ks[s2 * ss],
                                       (double)ks[s1 * ss], (double)ks[s0 * ss]));
    t = _mm256_mul_pd(t, vinv);
    _mm_storeu_ps(out, _mm256_cvtpd_ps(t));
}
#endif

/* np_att_scores over int16 keys (kv->k16) with int16 query codes: the same scale chain, the
 * dot exact in int64 (the SIMD path: its two digit dots in int32, combined exactly). */
static void NP_NAME(np_att_scores16)(const int16_t *q, float qscale, int64_t qk,
                                     const np_kv_view *kv, int64_t n, double inv_sqrt_qk,
                                     float *work) {
    const double sq = (double)qscale;
    int64_t j = 0;
#if defined(NP_SIMD_AVX2)
    if (qk % 16 == 0 && qk <= 512) {
        __m256i dh[32], dl[32];
        for (int64_t ch = 0; ch < qk / 16; ch++) {
            int16_t hi[16], lo[16];
            for (int e = 0; e < 16; e++) {
                hi[e] = np_q16_hi(q[16 * ch + e]);
                lo[e] = np_q16_lo(q[16 * ch + e]);
            }
            dh[ch] = _mm256_loadu_si256((const __m256i *)hi);
            dl[ch] = _mm256_loadu_si256((const __m256i *)lo);
        }
        const __m256d vsq = _mm256_set1_pd(sq), vinv = _mm256_set1_pd(inv_sqrt_qk);
        const __m256d v256 = _mm256_set1_pd(256.0);
        for (; j + 4 <= n; j += 4) {
            int64_t s0 = np_kv_slot(kv, j), s1 = np_kv_slot(kv, j + 1);
            int64_t s2 = np_kv_slot(kv, j + 2), s3 = np_kv_slot(kv, j + 3);
            const int16_t *k0 = kv->k16 + s0 * kv->k_step, *k1 = kv->k16 + s1 * kv->k_step;
            const int16_t *k2 = kv->k16 + s2 * kv->k_step, *k3 = kv->k16 + s3 * kv->k_step;
            __m128i high, low;
            NP_NAME(np_att_dot4_16)(dh, dl, qk / 16, k0, k1, k2, k3, &high, &low);
            /* 256 * high + low: exact in float64 (|dot| < 2^40) */
            __m256d dot = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(high), v256),
                                        _mm256_cvtepi32_pd(low));
            NP_NAME(np_att_score4)(dot, vsq, vinv, kv, s0, s1, s2, s3, work + j);
        }
    }
#endif
    NP_NAME(np_att_scores_tail)(q, sq, qk, kv, j, n, inv_sqrt_qk, work);
}

/* work[j] = score_j for j < n; q: int8 codes, or int16 codes where the keys are int16 */
static void NP_NAME(np_att_scores)(const void *qv, float qscale, int64_t qk,
                                   const np_kv_view *kv, int64_t n, double inv_sqrt_qk,
                                   float *work) {
    if (kv->k16) {
        NP_NAME(np_att_scores16)((const int16_t *)qv, qscale, qk, kv, n, inv_sqrt_qk, work);
        return;
    }
    const int8_t *q = (const int8_t *)qv;
    const double sq = (double)qscale;
    int64_t j = 0;
#if defined(NP_SIMD_AVX2)
    if (qk % 16 == 0 && qk <= 256) {
        __m256i q16[16];
        for (int64_t ch = 0; ch < qk / 16; ch++)
            q16[ch] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * ch)));
        const __m256d vsq = _mm256_set1_pd(sq), vinv = _mm256_set1_pd(inv_sqrt_qk);
        for (; j + 4 <= n; j += 4) {
            int64_t s0 = np_kv_slot(kv, j), s1 = np_kv_slot(kv, j + 1);
            int64_t s2 = np_kv_slot(kv, j + 2), s3 = np_kv_slot(kv, j + 3);
            __m128i dot = NP_NAME(np_att_dot4)(q16, qk / 16, kv->k + s0 * kv->k_step,
                                               kv->k + s1 * kv->k_step, kv->k + s2 * kv->k_step,
                                               kv->k + s3 * kv->k_step);
            NP_NAME(np_att_score4)(_mm256_cvtepi32_pd(dot), vsq, vinv, kv, s0, s1, s2, s3,
                                   work + j);
        }
    }
#endif
    NP_NAME(np_att_scores_tail)(q, sq, qk, kv, j, n, inv_sqrt_qk, work);
}

/* scores -> the softmax's unnormalised weights: work[j] = exp32(work[j] - max work) */
static void NP_NAME(np_att_exp)(float *work, int64_t n) {
    float peak = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        if (work[j] > peak) peak = work[j];
    for (int64_t j = 0; j < n; j++) work[j] = work[j] - peak;
    NP_NAME(np_exp32_array)(work, n, work);
}

/* weights -> probabilities: the f32 total in key order, then work[j] / total */
static void NP_NAME(np_att_normalise)(float *work, int64_t n) {
    float total = 0.0f;
    for (int64_t j = 0; j < n; j++) total = total + work[j];
    for (int64_t j = 0; j < n; j++) work[j] = work[j] / total;
}

#if defined(NP_SIMD_AVX2)
/* o[0..w) = sum_j p_j * f32(v_j[e] * sv_j) over the n keys, values from column e0, w <= 64
 * lanes (a multiple of 8) held in registers across the keys */
static inline void NP_NAME(np_att_values8)(const np_kv_view *kv, int64_t e0, int64_t n,
                                           const float *p, int64_t w, float *o) {
    __m256 acc[8];
    const int64_t blocks = w / 8;
    for (int64_t b = 0; b < 8; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        int64_t s = np_kv_slot(kv, j);
        const int8_t *v = kv->v + s * kv->v_step + e0;
        const __m256 sv = _mm256_set1_ps(kv->vs[s * kv->s_step]), pj = _mm256_set1_ps(p[j]);
        for (int64_t b = 0; b < blocks; b++) {
            __m128i codes = _mm_loadl_epi64((const __m128i *)(v + 8 * b));
            __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), sv);
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(pj, value));
        }
    }
    for (int64_t b = 0; b < blocks; b++) _mm256_storeu_ps(o + 8 * b, acc[b]);
}
#endif

/* o[0..vd) = sum_j p_j * f32(v_j * sv_j), j ascending, each lane's sum from 0 */
static void NP_NAME(np_att_values)(const np_kv_view *kv, int64_t n, int64_t vd, const float *p,
                                   float *o) {
#if defined(NP_SIMD_AVX512)
    if (vd == 64) { /* the 64 lanes in four zmm registers across the keys */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < n; j++) {
            int64_t s = np_kv_slot(kv, j);
            const int8_t *v = kv->v + s * kv->v_step;
            const __m512 sv = _mm512_set1_ps(kv->vs[s * kv->s_step]), pj = _mm512_set1_ps(p[j]);
#define NP_ATT_VALUE16(acc, at)                                                                  \
    acc = _mm512_add_ps(acc, _mm512_mul_ps(pj, _mm512_mul_ps(_mm512_cvtepi32_ps(                 \
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + at)))), sv)))
            NP_ATT_VALUE16(a0, 0); NP_ATT_VALUE16(a1, 16); NP_ATT_VALUE16(a2, 32); NP_ATT_VALUE16(a3, 48);
#undef NP_ATT_VALUE16
        }
        _mm512_storeu_ps(o, a0), _mm512_storeu_ps(o + 16, a1);
        _mm512_storeu_ps(o + 32, a2), _mm512_storeu_ps(o + 48, a3);
        return;
    }
#endif
#if defined(NP_SIMD_AVX2)
    if (vd % 8 == 0) {
        for (int64_t e0 = 0; e0 < vd; e0 += 64)
            NP_NAME(np_att_values8)(kv, e0, n, p, vd - e0 < 64 ? vd - e0 : 64, o + e0);
        return;
    }
#endif
    for (int64_t e = 0; e < vd; e++) o[e] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        int64_t s = np_kv_slot(kv, j);
        const int8_t *v = kv->v + s * kv->v_step;
        float sv = kv->vs[s * kv->s_step], pj = p[j];
        for (int64_t e = 0; e < vd; e++) {
            float value = (float)v[e] * sv;
            float prod = pj * value;
            o[e] = o[e] + prod;
        }
    }
}

/* The row: o [vd] of query q (codes, scale: int16 codes where the keys are int16, else
 * int8) against the n keys of `kv`; work: n floats. */
static void NP_NAME(np_att_row)(const void *q, float qscale, int64_t qk, int64_t vd,
                                const np_kv_view *kv, int64_t n, double inv_sqrt_qk, float *o,
                                float *work) {
    NP_NAME(np_att_scores)(q, qscale, qk, kv, n, inv_sqrt_qk, work);
    NP_NAME(np_att_exp)(work, n);
    NP_NAME(np_att_normalise)(work, n);
    NP_NAME(np_att_values)(kv, n, vd, work, o);
}

/* Query rows of one kv head sharing its keys (grouped-query attention: the heads of a kv
 * head attend the same n keys), at most this many at once: their scores' key codes are
 * widened once for all of them and their value sums share each value row's conversion. */
#define NP_ATT_GMAX 6

#if defined(NP_SIMD_AVX512)
/* Scores of G int8 query rows against the n keys of `kv` from its 16-key copy (kv->kt): the
 * query codes offset to unsigned bytes (q + 128) times the key codes by vpdpbusd, so a lane
 * holds dot + 128 ksum, exact in int32 (|lane| <= 256 * 255 * 127); the dot is that minus
 * 128 ksum, and the score chain is np_att_score4's, ((dot * sq) * sk) * inv_sqrt_qk in
 * float64: the same bits as np_att_scores. The keys are the slots first .. first + n - 1
 * taken modulo wrap: one or two runs of contiguous slots. */
static void NP_NAME(np_att_scores_tiled)(const int8_t *q, const float *qscale, int64_t G,
                                         int64_t qk, const np_kv_view *kv, int64_t n,
                                         double inv_sqrt_qk, float *work) {
    const int64_t q4 = qk / 4;
    int64_t runs[2][3], n_runs = 1; /* first slot, end slot, key index of the first */
    if (kv->wrap && kv->first + n > kv->wrap) {
        runs[0][0] = kv->first, runs[0][1] = kv->wrap, runs[0][2] = 0;
        runs[1][0] = 0, runs[1][1] = n - (kv->wrap - kv->first), runs[1][2] = kv->wrap - kv->first;
        n_runs = 2;
    } else {
        runs[0][0] = kv->first, runs[0][1] = kv->first + n, runs[0][2] = 0;
    }
    const __m256d vinv = _mm256_set1_pd(inv_sqrt_qk);
    for (int64_t g = 0; g < G; g++) {
        int32_t qu[64]; /* the row's codes + 128 as unsigned bytes, four per dword */
        for (int64_t c = 0; c < q4; c++) {
            uint8_t b[4];
            for (int i = 0; i < 4; i++) b[i] = (uint8_t)(q[g * qk + 4 * c + i] + 128);
            memcpy(&qu[c], b, 4);
        }
        const __m256d vsq = _mm256_set1_pd((double)qscale[g]);
        for (int64_t ri = 0; ri < n_runs; ri++) {
            const int64_t s0 = runs[ri][0], s1 = runs[ri][1], j0 = runs[ri][2];
            for (int64_t blk = s0 / 16; blk * 16 < s1; blk++) {
                const int64_t lo = s0 > blk * 16 ? s0 - blk * 16 : 0;
                const int64_t hi = s1 < blk * 16 + 16 ? s1 - blk * 16 : 16;
                const __mmask16 m = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
                const int8_t *kb = kv->kt + blk * q4 * 64;
                __m512i acc = _mm512_setzero_si512();
                for (int64_t c = 0; c < q4; c++)
                    acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(qu[c]),
                                              _mm512_loadu_si512((const void *)(kb + c * 64)));
                __m512i dot = _mm512_sub_epi32(
                    acc, _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, kv->ksum + blk * 16), 7));
                __m512 ks = _mm512_maskz_loadu_ps(m, kv->ks + blk * 16);
                float sc[16];
                for (int h = 0; h < 2; h++) {
                    __m256i d8 = h ? _mm512_extracti64x4_epi64(dot, 1) : _mm512_castsi512_si256(dot);
                    __m256 k8 = h ? _mm512_extractf32x8_ps(ks, 1) : _mm512_castps512_ps256(ks);
                    for (int qd = 0; qd < 2; qd++) {
                        __m128i d4 = qd ? _mm256_extracti128_si256(d8, 1) : _mm256_castsi256_si128(d8);
                        __m128 k4 = qd ? _mm256_extractf128_ps(k8, 1) : _mm256_castps256_ps128(k8);
                        __m256d t = _mm256_mul_pd(_mm256_cvtepi32_pd(d4), vsq);
                        t = _mm256_mul_pd(t, _mm256_cvtps_pd(k4));
                        t = _mm256_mul_pd(t, vinv);
                        _mm_storeu_ps(sc + 8 * h + 4 * qd, _mm256_cvtpd_ps(t));
                    }
                }
                for (int64_t i = lo; i < hi; i++) work[g * n + j0 + blk * 16 + i - s0] = sc[i];
            }
        }
    }
}
#endif

/* np_att_row for G <= NP_ATT_GMAX int8 query rows (codes q + g * qk, scales qscale[g])
 * against the same n int8 keys of `kv`: o + g * vd, work: G * n floats. Each row's dots are the
 * same integers and every float operation of a row is np_att_row's, in its order (the value
 * row f32(v * sv) is computed once and added into each row's own sum), so the bits are. */
static void NP_NAME(np_att_rows)(const int8_t *q, const float *qscale, int64_t G, int64_t qk,
                                 int64_t vd, const np_kv_view *kv, int64_t n,
                                 double inv_sqrt_qk, float *o, float *work) {
    int64_t j = 0;
#if defined(NP_SIMD_AVX512)
    if (kv->kt && !kv->k16 && !kv->slots && kv->s_step == 1 && qk % 4 == 0 && qk <= 256 && n) {
        NP_NAME(np_att_scores_tiled)(q, qscale, G, qk, kv, n, inv_sqrt_qk, work);
        j = n;
    }
#endif
#if defined(NP_SIMD_AVX2)
    if (!j && !kv->k16 && qk % 16 == 0 && qk <= 64 && G <= NP_ATT_GMAX) {
        const int64_t chunks = qk / 16;
        __m256i q16[NP_ATT_GMAX][4];
        for (int64_t g = 0; g < G; g++)
            for (int64_t c = 0; c < chunks; c++)
                q16[g][c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + g * qk + 16 * c)));
        const __m256d vinv = _mm256_set1_pd(inv_sqrt_qk);
        for (; j + 4 <= n; j += 4) {
            int64_t s[4];
            __m256i k[4][4];
            for (int i = 0; i < 4; i++) {
                s[i] = np_kv_slot(kv, j + i);
                for (int64_t c = 0; c < chunks; c++)
                    k[i][c] = _mm256_cvtepi8_epi16(
                        _mm_loadu_si128((const __m128i *)(kv->k + s[i] * kv->k_step + 16 * c)));
            }
            const float *ks = kv->ks; /* the 4 keys' scales, shared by the G rows */
            const int64_t ss = kv->s_step;
            const __m256d vks = _mm256_set_pd((double)ks[s[3] * ss], (double)ks[s[2] * ss],
                                              (double)ks[s[1] * ss], (double)ks[s[0] * ss]);
            for (int64_t g = 0; g < G; g++) {
                __m256i a[4];
                for (int i = 0; i < 4; i++) {
                    a[i] = _mm256_madd_epi16(q16[g][0], k[i][0]);
                    for (int64_t c = 1; c < chunks; c++)
                        a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(q16[g][c], k[i][c]));
                }
                __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
                __m128i dot = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                /* np_att_score4's chain: ((dot * sq) * sk) * inv_sqrt, in float64 */
                __m256d t = _mm256_mul_pd(_mm256_cvtepi32_pd(dot), _mm256_set1_pd((double)qscale[g]));
                t = _mm256_mul_pd(_mm256_mul_pd(t, vks), vinv);
                _mm_storeu_ps(work + g * n + j, _mm256_cvtpd_ps(t));
            }
        }
    }
#endif
    for (int64_t g = 0; g < G; g++) {
        if (j)
            NP_NAME(np_att_scores_tail)(q + g * qk, (double)qscale[g], qk, kv, j, n, inv_sqrt_qk,
                                        work + g * n);
        else
            NP_NAME(np_att_scores)(q + g * qk, qscale[g], qk, kv, n, inv_sqrt_qk, work + g * n);
        NP_NAME(np_att_exp)(work + g * n, n);
        NP_NAME(np_att_normalise)(work + g * n, n);
    }
#if defined(NP_SIMD_AVX512)
    if (vd % 16 == 0 && vd <= 64 && G <= NP_ATT_GMAX) { /* a row's lanes in vd / 16 zmm */
        const int nb = (int)(vd / 16);
        __m512 acc[NP_ATT_GMAX][4];
        for (int64_t g = 0; g < G; g++)
            for (int b = 0; b < 4; b++) acc[g][b] = _mm512_setzero_ps();
        for (int64_t jj = 0; jj < n; jj++) {
            int64_t sl = np_kv_slot(kv, jj);
            const int8_t *v = kv->v + sl * kv->v_step;
            const __m512 sv = _mm512_set1_ps(kv->vs[sl * kv->s_step]);
            __m512 value[4];
            for (int b = 0; b < nb; b++)
                value[b] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                             _mm_loadu_si128((const __m128i *)(v + 16 * b)))), sv);
            for (int64_t g = 0; g < G; g++) {
                const __m512 pj = _mm512_set1_ps(work[g * n + jj]);
                for (int b = 0; b < nb; b++)
                    acc[g][b] = _mm512_add_ps(acc[g][b], _mm512_mul_ps(pj, value[b]));
            }
        }
        for (int64_t g = 0; g < G; g++)
            for (int b = 0; b < nb; b++) _mm512_storeu_ps(o + g * vd + 16 * b, acc[g][b]);
        return;
    }
#endif
    for (int64_t g = 0; g < G; g++) NP_NAME(np_att_values)(kv, n, vd, work + g * n, o + g * vd);
}

/* Q query rows, row i against the count[i] slots listed at slots + i * slots_stride of kcode
 * [S, qk] (int8, or int16 where key16: then the query codes are int16 too) / vcode [S, vd]
 * (scales [S]) -> out [Q, vd] (kernels/pinned.py attend). */
static void NP_NAME(np_attend)(const void *qcode, const float *qscale, int64_t Q, int64_t qk,
                               const void *kcode, int key16, const float *kscale,
                               const int8_t *vcode, const float *vscale, int64_t vd,
                               const int64_t *slots, const int64_t *count, int64_t slots_stride,
                               double inv_sqrt_qk, float *out, float *work) {
    for (int64_t i = 0; i < Q; i++) {
        np_kv_view kv = {key16 ? NULL : (const int8_t *)kcode, vcode, kscale, vscale, qk, vd,
                         1, 0, 0, slots + i * slots_stride,
                         key16 ? (const int16_t *)kcode : NULL};
        const void *q = key16 ? (const void *)((const int16_t *)qcode + i * qk)
                              : (const void *)((const int8_t *)qcode + i * qk);
        NP_NAME(np_att_row)(q, qscale[i], qk, vd, &kv, count[i], inv_sqrt_qk, out + i * vd,
                            work);
    }
}
