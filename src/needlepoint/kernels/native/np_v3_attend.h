/* One query row of the Needle 3 native attention against its kv head's int8 cache, in
 * position order (np_v3_rows.h includes this once per variant; np_attend in np_attend.h is the
 * same operation over listed slots). score_j = f32(((dot_j * sq) * sk_j) * inv_sqrt_qk), dot_j
 * the exact int32 product of the codes; peak = max_j score_j; e_j = exp32(score_j - peak);
 * total = sum_j e_j (float32, j ascending); p_j = e_j / total; out = sum_j p_j * f32(v_j * sv_j)
 * (float32, j ascending, every product and sum rounded). The SIMD variants run the same
 * operations: the integer dots in any order (exact), the float ones across independent keys
 * (scores, exps, p_j) or across independent output lanes (the value sum), never reassociated. */

/* the next slot in position order (a ring wraps at its capacity) */
static inline int64_t NP_NAME(np_v3_next_slot)(const np_v3_cache *c, int64_t slot) {
    return slot + 1 == c->capacity ? 0 : slot + 1;
}

#if defined(NP_SIMD_AVX2)
/* dot_j for 4 keys at once (qk a multiple of 16): q as 16-bit lanes, vpmaddwd per 16 codes */
static inline __m128i NP_NAME(np_v3_dot4)(const __m256i *q16, int64_t chunks, const int8_t *k0,
                                          const int8_t *k1, const int8_t *k2, const int8_t *k3) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < chunks; c++) {
        __m256i q = q16[c];
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k0 + 16 * c)))));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k1 + 16 * c)))));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k2 + 16 * c)))));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(q, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k3 + 16 * c)))));
    }
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* o[0..w) = sum_j p_j * f32(v_j[e] * sv_j) over the n keys from slot `first`, w <= 64 lanes
 * (a multiple of 8) held in registers across the keys */
static inline void NP_NAME(np_v3_values8)(const np_v3_cache *c, const int8_t *vbase,
                                          const float *vs, int64_t vd, int64_t first, int64_t n,
                                          const float *p, int64_t w, float *o) {
    __m256 acc[8];
    const int64_t blocks = w / 8;
    for (int64_t b = 0; b < 8; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t j = 0, slot = first; j < n; j++, slot = NP_NAME(np_v3_next_slot)(c, slot)) {
        const int8_t *v = vbase + slot * vd;
        const __m256 sv = _mm256_set1_ps(vs[slot]), pj = _mm256_set1_ps(p[j]);
        for (int64_t b = 0; b < blocks; b++) {
            __m128i codes = _mm_loadl_epi64((const __m128i *)(v + 8 * b));
            __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), sv);
            acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(pj, value));
        }
    }
    for (int64_t b = 0; b < blocks; b++) _mm256_storeu_ps(o + 8 * b, acc[b]);
}
#endif

static void NP_NAME(np_v3_attend_row)(const int8_t *q, float qscale, int64_t qk, int64_t vd,
                                      const np_v3_cache *c, int64_t head, int64_t lo, int64_t p,
                                      double inv_sqrt_qk, float *o, float *work) {
    const int8_t *kbase = c->kcode + head * c->capacity * qk;
    const int8_t *vbase = c->vcode + head * c->capacity * vd;
    const float *ks = c->kscale + head * c->capacity, *vs = c->vscale + head * c->capacity;
    double sq = (double)qscale;
    int64_t n = p - lo + 1, j = 0, slot = c->window ? lo % c->capacity : lo; /* position order */
    const int64_t first = slot;
#if defined(NP_SIMD_AVX2)
    if (qk % 16 == 0) {
        __m256i q16[16];
        for (int64_t ch = 0; ch < qk / 16; ch++)
            q16[ch] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * ch)));
        const __m256d vsq = _mm256_set1_pd(sq), vinv = _mm256_set1_pd(inv_sqrt_qk);
        for (; j + 4 <= n; j += 4) {
            int64_t s0 = slot, s1 = NP_NAME(np_v3_next_slot)(c, s0);
            int64_t s2 = NP_NAME(np_v3_next_slot)(c, s1), s3 = NP_NAME(np_v3_next_slot)(c, s2);
            slot = NP_NAME(np_v3_next_slot)(c, s3);
            __m128i dot = NP_NAME(np_v3_dot4)(q16, qk / 16, kbase + s0 * qk, kbase + s1 * qk,
                                              kbase + s2 * qk, kbase + s3 * qk);
            __m256d t = _mm256_mul_pd(_mm256_cvtepi32_pd(dot), vsq);
            t = _mm256_mul_pd(t, _mm256_set_pd((double)ks[s3], (double)ks[s2], (double)ks[s1],
                                               (double)ks[s0]));
            t = _mm256_mul_pd(t, vinv);
            _mm_storeu_ps(work + j, _mm256_cvtpd_ps(t));
        }
    }
#endif
    for (; j < n; j++, slot = NP_NAME(np_v3_next_slot)(c, slot)) {
        const int8_t *restrict k = kbase + slot * qk;
        int32_t dot = 0;
        for (int64_t e = 0; e < qk; e++) dot += (int32_t)q[e] * (int32_t)k[e];
        double t = (double)dot * sq;
        t = t * (double)ks[slot];
        t = t * inv_sqrt_qk;
        work[j] = (float)t;
    }
    float peak = -INFINITY;
    for (j = 0; j < n; j++)
        if (work[j] > peak) peak = work[j];
    for (j = 0; j < n; j++) work[j] = work[j] - peak;
    NP_NAME(np_exp32_array)(work, n, work);
    float total = 0.0f;
    for (j = 0; j < n; j++) total = total + work[j];
    for (j = 0; j < n; j++) work[j] = work[j] / total;
#if defined(NP_SIMD_AVX512)
    if (vd == 64) { /* the 64 lanes in four zmm registers across the keys */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        slot = first;
        for (j = 0; j < n; j++, slot = NP_NAME(np_v3_next_slot)(c, slot)) {
            const int8_t *v = vbase + slot * vd;
            const __m512 sv = _mm512_set1_ps(vs[slot]), pj = _mm512_set1_ps(work[j]);
#define NP_V3_VALUE16(acc, at)                                                                  \
    acc = _mm512_add_ps(acc, _mm512_mul_ps(pj, _mm512_mul_ps(_mm512_cvtepi32_ps(                 \
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(v + at)))), sv)))
            NP_V3_VALUE16(a0, 0); NP_V3_VALUE16(a1, 16); NP_V3_VALUE16(a2, 32); NP_V3_VALUE16(a3, 48);
#undef NP_V3_VALUE16
        }
        _mm512_storeu_ps(o, a0), _mm512_storeu_ps(o + 16, a1);
        _mm512_storeu_ps(o + 32, a2), _mm512_storeu_ps(o + 48, a3);
        return;
    }
#endif
#if defined(NP_SIMD_AVX2)
    if (vd % 8 == 0) {
        for (int64_t e0 = 0; e0 < vd; e0 += 64)
            NP_NAME(np_v3_values8)(c, vbase + e0, vs, vd, first, n, work,
                                   vd - e0 < 64 ? vd - e0 : 64, o + e0);
        return;
    }
#endif
    for (int64_t e = 0; e < vd; e++) o[e] = 0.0f;
    slot = first;
    for (j = 0; j < n; j++, slot = NP_NAME(np_v3_next_slot)(c, slot)) {
        const int8_t *v = vbase + slot * vd;
        float sv = vs[slot], pj = work[j];
        for (int64_t e = 0; e < vd; e++) {
            float value = (float)v[e] * sv;
            float prod = pj * value;
            o[e] = o[e] + prod;
        }
    }
}

/* query rows lo .. hi-1 of a block (row = (position - first) * H + head): o, times the gate */
static void NP_NAME(np_v3_attend_items)(void *arg, int64_t lo, int64_t hi, int64_t worker) {
    const np_v3_attend_job *job = (const np_v3_attend_job *)arg;
    const np_v3_model *m = job->m;
    const np_v3_cache *c = job->c;
    const int64_t H = m->heads, qk = m->qk, vd = m->vd, group = H / m->kv_heads;
    float o[1024];
    float *work = job->ws->work + worker * job->ws->work_stride;
    for (int64_t item = lo; item < hi; item++) {
        int64_t r = job->first + item / H, h = item % H;
        int64_t p = job->start + r;
        int64_t from = c->window ? (p - c->window + 1 > 0 ? p - c->window + 1 : 0) : 0;
        NP_NAME(np_v3_attend_row)(job->ws->qcode + (r * H + h) * qk, job->ws->qscale[r * H + h],
                                  qk, vd, c, h / group, from, p, job->inv_sqrt_qk, o, work);
        float *g = job->gate + r * H * vd + h * vd;
        for (int64_t e = 0; e < vd; e++) g[e] = g[e] * o[e];
    }
}
