/* A8 activations (docs/numerics.md "A8"): the row peak, the integer Walsh-Hadamard of a
 * 128-wide group, the rotated A8 rows of the exact products and the plain A8 codes of the int8
 * caches and queries. Included once per instruction-set variant (np_variant.h); every name
 * through NP_NAME(). */
/* For each row t of x [T, cols]: s = max|x| / 127 (float32 division; 1 when the row is all
 * zero), q = clip(rint(x / s), -128, 127); the row is zero-padded to in_pad and every
 * 128-wide group is rotated by the unnormalised Walsh-Hadamard transform, in integers:
 * v [T, in_pad] int32 (|v| <= 128 * 128). Returns NP_NONFINITE if any x is NaN or inf. */
/* peak = max |x_c| of a row; 0 if any x_c is NaN or inf (max is exact in any order) */
static inline int NP_NAME(np_absmax)(const float *row, int64_t cols, float *peak_out) {
    float peak = 0.0f;
    int finite = 1;
    int64_t c = 0;
#if defined(NP_SIMD_AVX2)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(3.4028234663852886e38f);
    __m256 vpeak = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (; c + 8 <= cols; c += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(row + c), absmask);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        vpeak = _mm256_max_ps(vpeak, a);
    }
    if (_mm256_movemask_ps(ok) != 0xff) finite = 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, vpeak);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > peak) peak = lanes[j];
#endif
    for (; c < cols; c++) {
        float a = fabsf(row[c]);
        if (!(a <= 3.4028234663852886e38f)) finite = 0;
        if (a > peak) peak = a;
    }
    *peak_out = peak;
    return finite;
}

/* the unnormalised Walsh-Hadamard transform of one 128-wide int32 group, in place (integer
 * butterflies: exact in any order, |v| <= 128 * 128) */
static inline void NP_NAME(np_fwht128)(int32_t *grp) {
#if defined(NP_SIMD_AVX2)
    __m256i r[16];
    for (int i = 0; i < 16; i++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(grp + 8 * i)), s;
        s = _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)); /* half 1 */
        x = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xAA);
        s = _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)); /* half 2 */
        x = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xCC);
        s = _mm256_permute2x128_si256(x, x, 0x01); /* half 4 */
        r[i] = _mm256_blend_epi32(_mm256_add_epi32(x, s), _mm256_sub_epi32(s, x), 0xF0);
    }
    for (int h = 1; h < 16; h <<= 1) /* halves 8 .. 64: whole registers */
        for (int base = 0; base < 16; base += 2 * h)
            for (int i = base; i < base + h; i++) {
                __m256i a = r[i], b = r[i + h];
                r[i] = _mm256_add_epi32(a, b);
                r[i + h] = _mm256_sub_epi32(a, b);
            }
    for (int i = 0; i < 16; i++) _mm256_storeu_si256((__m256i *)(grp + 8 * i), r[i]);
#else
    for (int half = 1; half < 128; half <<= 1)
        for (int base = 0; base < 128; base += 2 * half)
            for (int j = base; j < base + half; j++) {
                int32_t a = grp[j], b = grp[j + half];
                grp[j] = a + b;
                grp[j + half] = a - b;
            }
#endif
}

static int NP_NAME(np_a8_rotate)(const float *x, int64_t T, int64_t cols, int64_t x_stride, int64_t in_pad,
                 int32_t *v, float *scale) {
    if (in_pad % 128 || cols > in_pad) return NP_BADARG;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * x_stride;
        float peak;
        if (!NP_NAME(np_absmax)(row, cols, &peak)) return NP_NONFINITE;
        float s = peak > 0.0f ? peak / 127.0f : 1.0f;
        scale[t] = s;
        int32_t *out = v + t * in_pad;
        for (int64_t c = 0; c < cols; c++) {
            float q = nearbyintf(row[c] / s);
            if (q > 127.0f) q = 127.0f;
            if (q < -128.0f) q = -128.0f;
            out[c] = (int32_t)q;
        }
        for (int64_t c = cols; c < in_pad; c++) out[c] = 0;
        for (int64_t g = 0; g < in_pad; g += 128) NP_NAME(np_fwht128)(out + g);
    }
    return NP_OK;
}

/* Symmetric codes of each row of x [T, cols] at `level` steps a side, plus one float32 scale
 * `max|x| / level` (1 for an all-zero row): int8 (level 127, `codes8`) or int16 (level 32767,
 * `codes16`), the other pointer NULL. */
static int NP_NAME(np_row_codes)(const float *x, int64_t T, int64_t cols, float level,
                                 int8_t *codes8, int16_t *codes16, float *scale) {
    const float low = -level - 1.0f;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * cols;
        float peak;
        if (!NP_NAME(np_absmax)(row, cols, &peak)) return NP_NONFINITE;
        float s = peak > 0.0f ? peak / level : 1.0f;
        scale[t] = s;
        for (int64_t c = 0; c < cols; c++) {
            float q = nearbyintf(row[c] / s);
            if (q > level) q = level;
            if (q < low) q = low;
            if (codes8)
                codes8[t * cols + c] = (int8_t)q;
            else
                codes16[t * cols + c] = (int16_t)q;
        }
    }
    return NP_OK;
}

/* A8 codes (np_a8_rotate without the rotation): the int8 values and queries. */
static int NP_NAME(np_a8_codes)(const float *x, int64_t T, int64_t cols, int8_t *codes,
                                float *scale) {
    return NP_NAME(np_row_codes)(x, T, cols, 127.0f, codes, NULL, scale);
}

/* A16 codes, 32767 levels: the transformer int8 numerics' cached keys and its queries. */
static int NP_NAME(np_a16_codes)(const float *x, int64_t T, int64_t cols, int16_t *codes,
                                 float *scale) {
    return NP_NAME(np_row_codes)(x, T, cols, 32767.0f, NULL, codes, scale);
}
