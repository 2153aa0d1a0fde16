/* The pinned exp (docs/numerics.md "Pinned exp"): np_exp64 / np_exp32 and their array forms,
 * one table of constants for the scalar and every vector form. Included once per
 * instruction-set variant (np_variant.h). */
/* -- pinned exp ------------------------------------------------------------------------ */
#ifndef NP_EXP_TAYLOR_DEFINED /* this header is included once per variant; the table once */
#define NP_EXP_TAYLOR_DEFINED
/* Cody-Waite constants (log2 e, ln 2 split high/low) and the degree-11 Taylor coefficients
 * of exp, highest degree first: one table for the scalar and every vector form. */
#define NP_EXP_LOG2E 1.4426950408889634
#define NP_EXP_LN2_HI 0.6931471803691238
#define NP_EXP_LN2_LO 1.9082149292705877e-10
static const double np_exp_taylor[12] = {
    2.505210838544172e-08, 2.755731922398589e-07, 2.7557319223985893e-06,
    2.48015873015873e-05, 0.0001984126984126984, 0.001388888888888889,
    0.008333333333333333, 0.041666666666666664, 0.16666666666666666, 0.5, 1.0, 1.0};
#endif

/* exp of a float32 argument, as float32: Cody-Waite reduction by ln 2 and a degree-11
 * Taylor polynomial in float64 (Horner, no FMA), then one rounding. Plain IEEE operations
 * only, so kernels/exact.py's numpy version gives the same bits on every machine. */
static inline double NP_NAME(np_exp64)(double x) {
    if (x != x) return x;
    if (x < -745.0) return 0.0;
    if (x > 709.0) return INFINITY;
    double k = nearbyint(x * NP_EXP_LOG2E);
    double r = x - k * NP_EXP_LN2_HI;
    r = r - k * NP_EXP_LN2_LO;
    double p = np_exp_taylor[0];
    for (int j = 1; j < 12; j++) p = p * r + np_exp_taylor[j];
    int ki = (int)k;
    if (ki >= -1022 && ki <= 1023) { /* p * 2^k with 2^k a normal double: ldexp's result */
        union { uint64_t u; double d; } two = {(uint64_t)(ki + 1023) << 52};
        return p * two.d;
    }
    return ldexp(p, ki);
}

static float NP_NAME(np_exp32)(float x) { return (float)NP_NAME(np_exp64)((double)x); }

/* exp32 of n floats (the same polynomial as np_exp64). The AVX2 variant runs four at a time through the same float64
 * operations (round-to-nearest k, the two-part reduction, Horner without FMA) and scales by
 * 2^k built from its bits, which is ldexp's single rounding whenever 2^k is a normal double;
 * lanes outside [-700, 700] (and NaN) take the scalar path. */
static void NP_NAME(np_exp32_array)(const float *x, int64_t n, float *out) {
    int64_t i = 0;
#if defined(NP_SIMD_AVX512)
    for (; i + 8 <= n; i += 8) { /* the same operations eight at a time */
        __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        __mmask8 ok = _mm512_cmp_pd_mask(v, _mm512_set1_pd(-700.0), _CMP_GE_OQ) &
                      _mm512_cmp_pd_mask(v, _mm512_set1_pd(700.0), _CMP_LE_OQ);
        if (ok != 0xff) {
            for (int j = 0; j < 8; j++) out[i + j] = NP_NAME(np_exp32)(x[i + j]);
            continue;
        }
        __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(v, _mm512_set1_pd(NP_EXP_LOG2E)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512d r = _mm512_sub_pd(v, _mm512_mul_pd(k, _mm512_set1_pd(NP_EXP_LN2_HI)));
        r = _mm512_sub_pd(r, _mm512_mul_pd(k, _mm512_set1_pd(NP_EXP_LN2_LO)));
        __m512d p = _mm512_set1_pd(np_exp_taylor[0]);
        for (int j = 1; j < 12; j++)
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(np_exp_taylor[j]));
        __m512i bits = _mm512_slli_epi64(
            _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(k)), _mm512_set1_epi64(1023)), 52);
        __m512d y = _mm512_mul_pd(p, _mm512_castsi512_pd(bits));
        _mm256_storeu_ps(out + i, _mm512_cvtpd_ps(y));
    }
#endif
#if defined(NP_SIMD_AVX2)
    const __m256d lo = _mm256_set1_pd(-700.0), hi = _mm256_set1_pd(700.0);
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        __m256d ok = _mm256_and_pd(_mm256_cmp_pd(v, lo, _CMP_GE_OQ),
                                   _mm256_cmp_pd(v, hi, _CMP_LE_OQ));
        if (_mm256_movemask_pd(ok) != 15) {
            for (int j = 0; j < 4; j++) out[i + j] = NP_NAME(np_exp32)(x[i + j]);
            continue;
        }
        __m256d k = _mm256_round_pd(_mm256_mul_pd(v, _mm256_set1_pd(NP_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256d r = _mm256_sub_pd(v, _mm256_mul_pd(k, _mm256_set1_pd(NP_EXP_LN2_HI)));
        r = _mm256_sub_pd(r, _mm256_mul_pd(k, _mm256_set1_pd(NP_EXP_LN2_LO)));
        __m256d p = _mm256_set1_pd(np_exp_taylor[0]);
        for (int j = 1; j < 12; j++)
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(np_exp_taylor[j]));
        __m128i k32 = _mm256_cvtpd_epi32(k);
        __m256i bits = _mm256_slli_epi64(
            _mm256_add_epi64(_mm256_cvtepi32_epi64(k32), _mm256_set1_epi64x(1023)), 52);
        __m256d y = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
        _mm_storeu_ps(out + i, _mm256_cvtpd_ps(y));
    }
#endif
    for (; i < n; i++) out[i] = NP_NAME(np_exp32)(x[i]);
}

/* exp64 of every element of an array (np_exp64). */

static void NP_NAME(np_exp64_array)(const double *x, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = NP_NAME(np_exp64)(x[i]);
}
