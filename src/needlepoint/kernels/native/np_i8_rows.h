/* Row kernels of np_i8.h (included once per instruction-set variant, like np_i8_body.h):
 * the pinned exp, A8 row codes and int8 attention, operation for operation the numpy
 * references `kernels.pinned.exp32_reference`, `kernels.exact.a8_codes_reference` and
 * `kernels.pinned.attend_reference` (tests/kernels/test_i8_block.py checks the bits). */

/* The pinned exp and the A8 row codes are the library's own (np_body.h: np_exp32,
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
 * score_p = f32(((dot * sq) * sk_p) * inv_sqrt), softmax with the pinned exp and a float32
 * sum in order, out = sum_p prob_p * (v_p * sv_p) in order (kernels/pinned.py attend). */
static void I8_NAME(i8_attend_row)(const int8_t *q, float sq_f, int64_t n, int64_t stride,
                                   int64_t g, int64_t hd, const int8_t *kcode,
                                   const float *kscale, const int8_t *vcode,
                                   const float *vscale, double inv_sqrt, float *out,
                                   float *work) {
    double sq = (double)sq_f;
    float peak = -INFINITY;
#if defined(I8_SIMD_AVX2)
    if (hd % 16 == 0 && hd <= 256) { /* the same operations, eight lanes at a time */
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
        for (int64_t p = 0; p < n; p++) work[p] = work[p] - peak;
        I8_NAME(i8_exp32_array)(work, n, work);
        float total = 0.0f;
        for (int64_t p = 0; p < n; p++) total = total + work[p];
        __m256 o[32];
        for (int64_t e = 0; e < hd; e += 8) o[e / 8] = _mm256_setzero_ps();
        for (int64_t p = 0; p < n; p++) {
            int64_t row = p * stride + g;
            __m256 prob = _mm256_set1_ps(work[p] / total);
            __m256 sv = _mm256_set1_ps(vscale[row]);
            const int8_t *v = vcode + row * hd;
            for (int64_t e = 0; e < hd; e += 8) {
                __m128i eight = _mm_loadl_epi64((const __m128i *)(v + e));
                __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), sv);
                o[e / 8] = _mm256_add_ps(o[e / 8], _mm256_mul_ps(prob, value));
            }
        }
        for (int64_t e = 0; e < hd; e += 8) _mm256_storeu_ps(out + e, o[e / 8]);
        return;
    }
#endif
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
    for (int64_t p = 0; p < n; p++) work[p] = work[p] - peak;
    I8_NAME(i8_exp32_array)(work, n, work);
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

/* Causal attention of T positions start .. start+T-1: query rows (t, h) of qcode [T*H, hd]
 * against the cache's positions 0 .. start+t of kv head h / (H / Hkv) -> out [T, H*hd]. */
static void I8_NAME(i8_attend_causal)(const int8_t *qcode, const float *qscale, int64_t T,
                                      int64_t start, int64_t heads, int64_t kv_heads,
                                      int64_t hd, const int8_t *kcode, const float *kscale,
                                      const int8_t *vcode, const float *vscale, float *out,
                                      float *work) {
    int64_t group = heads / kv_heads;
    double inv_sqrt = 1.0 / sqrt((double)hd);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t row = t * heads + h;
            I8_NAME(i8_attend_row)(qcode + row * hd, qscale[row], start + t + 1, kv_heads,
                                   h / group, hd, kcode, kscale, vcode, vscale, inv_sqrt,
                                   out + row * hd, work);
        }
}
