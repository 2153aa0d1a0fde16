/* Row kernels of np_i8.h (included once per instruction-set variant, like np_i8_body.h):
 * the pinned exp, A8 row codes and int8 attention, operation for operation the numpy
 * references `kernels.pinned.exp32_reference`, `kernels.exact.a8_codes_reference` and
 * `kernels.pinned.attend_reference` (tests/kernels/test_i8_block.py checks the bits). */

/* exp of a float32 as float32: Cody-Waite reduction by ln 2 and a degree-11 Taylor
 * polynomial in float64 (Horner, no FMA), rounded once (kernels/pinned.py). */
static inline double I8_NAME(i8_exp64)(double x) {
    if (x != x) return x;
    if (x < -745.0) return 0.0;
    if (x > 709.0) return INFINITY;
    double k = nearbyint(x * 1.4426950408889634);
    double r = x - k * 0.6931471803691238;
    r = r - k * 1.9082149292705877e-10;
    double p = 2.505210838544172e-08;
    p = p * r + 2.755731922398589e-07;
    p = p * r + 2.7557319223985893e-06;
    p = p * r + 2.48015873015873e-05;
    p = p * r + 0.0001984126984126984;
    p = p * r + 0.001388888888888889;
    p = p * r + 0.008333333333333333;
    p = p * r + 0.041666666666666664;
    p = p * r + 0.16666666666666666;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return ldexp(p, (int)k);
}

static inline float I8_NAME(i8_exp32)(float x) { return (float)I8_NAME(i8_exp64)((double)x); }

/* exp32 of n floats. The AVX2 variant runs four at a time through the same float64
 * operations (round-to-nearest k, the two-part reduction, Horner without FMA) and scales by
 * 2^k built from its bits, which is ldexp's single rounding whenever 2^k is a normal double;
 * lanes outside [-700, 700] (and NaN) take the scalar path. */
static void I8_NAME(i8_exp32_array)(const float *x, int64_t n, float *out) {
    int64_t i = 0;
#if defined(I8_SIMD_AVX2)
    const __m256d lo = _mm256_set1_pd(-700.0), hi = _mm256_set1_pd(700.0);
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d ok = _mm256_and_pd(_mm256_cmp_pd(v, lo, _CMP_GE_OQ),
                                   _mm256_cmp_pd(v, hi, _CMP_LE_OQ));
        if (_mm256_movemask_pd(ok) != 15) {
            for (int j = 0; j < 4; j++) out[i + j] = I8_NAME(i8_exp32)(x[i + j]);
            continue;
        }
        __m256d k = _mm256_round_pd(_mm256_mul_pd(v, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256d r = _mm256_sub_pd(v, _mm256_mul_pd(k, _mm256_set1_pd(0.6931471803691238)));
        r = _mm256_sub_pd(r, _mm256_mul_pd(k, _mm256_set1_pd(1.9082149292705877e-10)));
        static const double c[12] = {
            2.505210838544172e-08, 2.755731922398589e-07, 2.7557319223985893e-06,
            2.48015873015873e-05, 0.0001984126984126984, 0.001388888888888889,
            0.008333333333333333, 0.041666666666666664, 0.16666666666666666, 0.5, 1.0, 1.0};
        __m256d p = _mm256_set1_pd(c[0]);
        for (int j = 1; j < 12; j++)
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(c[j]));
        __m128i k32 = _mm256_cvtpd_epi32(k);
        __m256i bits = _mm256_slli_epi64(
            _mm256_add_epi64(_mm256_cvtepi32_epi64(k32), _mm256_set1_epi64x(1023)), 52);
        __m256d y = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
        _mm_storeu_ps(out + i, _mm256_cvtpd_ps(y));
    }
#endif
    for (; i < n; i++) out[i] = I8_NAME(i8_exp32)(x[i]);
}

/* One row of `cols` floats -> int8 codes and one scale: s = max|x| / 127 (1 for an all-zero
 * row), q = clip(rint(x / s), -128, 127). Returns I8_NONFINITE on NaN or inf. */
static int I8_NAME(i8_a8_row)(const float *row, int64_t cols, int8_t *codes, float *scale) {
    float peak = 0.0f;
    int finite = 1;
    for (int64_t c = 0; c < cols; c++) {
        float a = fabsf(row[c]);
        if (!(a <= 3.4028234663852886e38f)) finite = 0;
        if (a > peak) peak = a;
    }
    if (!finite) return I8_NONFINITE;
    float s = peak > 0.0f ? peak / 127.0f : 1.0f;
    *scale = s;
    for (int64_t c = 0; c < cols; c++) {
        float q = nearbyintf(row[c] / s);
        if (q > 127.0f) q = 127.0f;
        if (q < -128.0f) q = -128.0f;
        codes[c] = (int8_t)q;
    }
    return I8_OK;
}

static int I8_NAME(i8_a8_rows)(const float *x, int64_t T, int64_t cols, int8_t *codes,
                               float *scale) {
    for (int64_t t = 0; t < T; t++) {
        int st = I8_NAME(i8_a8_row)(x + t * cols, cols, codes + t * cols, scale + t);
        if (st) return st;
    }
    return I8_OK;
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
