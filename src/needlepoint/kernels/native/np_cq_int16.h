/* Exact CQ x A8 products in integers by 16-bit digits of the levels times 16-bit activations
 * (vpmaddwd on AVX2, vpdpwssd with AVX-512 VNNI), 2- and 4-bit storage, included by
 * np_cq_int.h. docs/numerics.md "Exact CQ x A8 products"; kernels/exact.py
 * `cq_matmul_reference` is the numpy reference with the same bits.
 *
 * Every level is an integer multiple k_j of the codebook quantum qu (the smallest ulp of its
 * non-zero levels, `check_codebook`). With
 * kmin, kmax the extreme k_j, gc = gcd_j (k_j - kmin), c0 = floor((kmax - kmin) / gc / 2),
 * kc = kmin + gc c0 and u_j = (k_j - kc) / gc (|u_j| <= 2^32) cut into P <= 3 balanced digits
 * of base 2^14, u_j = sum_p 2^(14 p) d_jp with every d_jp in [-8191, 8192] (a valid int16):
 *   sum_c k[idx_c] v_c = gc * W + kc * tot,  W = sum_p 2^(14 p) sum_c d_p[idx_c] v_c,
 * tot = sum_c v_c. The inner sums are vpmaddwd products of the 16-bit digits (two vpshufb
 * byte lookups of the code, interleaved) and v as int16 (v in [-2^14, 2^14)): an int32
 * lane of a group adds 16 products, each in [-2^27, 8192 * 16383], so it stays in
 * [-2^31, 2^31); one accumulator per group and digit, whose lanes then go to float64, where
 * every sum is an integer below 2^53 and so exact. gc * W + kc * tot is exact in float64:
 * |gc W| <= (kmax - kmin) / 2 * 2^21 < 2^53 and |kc tot| < 2^32 * 2^21, and their sum is the
 * exact sum_c k v, below 2^53 quanta by check_codebook. D = that times qu is the value the
 * float64 reference computes, and the unchanged epilogue gives the same bits. v outside
 * [-2^14, 2^14) returns NP_BADARG: the float64 kernel, exact for any int32 v, runs.
 * Activation layout: a group's codes come as fields f = 0..3 of 32 codes each, one code per
 * byte of a 32-byte register: 4-bit storage, register f >> 1 (bytes 32 r + k of the group)
 * and nibble f & 1, column 2 (32 r + k) + (f & 1); 2-bit storage, the group's one register and
 * bits 2f..2f+1, column 4k + f. The unpacked 16-bit digits of a field come in two vectors
 * u = 0, 1 whose element e is byte (e >> 3) * 16 + u * 8 + (e & 7), so v is stored as int16
 * at g * 128 + (f * 2 + u) * 16 + e. */

#ifdef NP_SIMD_AVX2
#define NP_D16_RB 4 /* activation rows per pass over the weights */
#ifndef NP_D16_ONCE
#define NP_D16_ONCE

typedef struct {
    __m256i lo[3], hi[3]; /* low / high byte of digit p of u_j, j = 0..15, in both lanes */
    int16_t digit[3][16]; /* d_jp itself (np_cq_int4.h's word tables) */
    int pieces;
    double gc, kc, quantum;
} np_d16_levels;
#endif

static int64_t NP_NAME(np_d16_gcd)(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The codebook as integer digits; NP_BADARG when some level is not finite or the sums could
 * reach 2^53 quanta (check_codebook refuses both). */
static int NP_NAME(np_d16_levels_of)(const float *codebook, int64_t codebook_len, int bits,
                                     np_d16_levels *lv) {
    float cb[16] = {0}; /* codes past the codebook: level 0, as in the float64 kernel */
    double quantum = 0.0;
    const int n = 1 << bits;
    for (int64_t j = 0; j < codebook_len && j < n; j++) cb[j] = codebook[j];
    for (int j = 0; j < n; j++) {
        float a = fabsf(cb[j]);
        if (!(a <= 3.4028234663852886e38f)) return NP_BADARG;
        if (a == 0.0f) continue;
        int e;
        frexpf(a, &e); /* a = m 2^e, m in [0.5, 1): ulp 2^(e - 24), at least 2^-149 */
        double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
        if (quantum == 0.0 || ulp < quantum) quantum = ulp;
    }
    if (quantum == 0.0) quantum = 1.0;
    int64_t k[16] = {0}, kmin = 0, kmax = 0, peak = 0, gc = 0;
    for (int j = 0; j < n; j++) {
        double q = (double)cb[j] / quantum;
        if (!(fabs(q) < 4294967296.0)) return NP_BADARG;
        k[j] = (int64_t)q;
        if (k[j] < kmin || j == 0) kmin = k[j];
        if (k[j] > kmax || j == 0) kmax = k[j];
        if (llabs(k[j]) > peak) peak = llabs(k[j]);
    }
    if (peak * 16384 * 128 >= (int64_t)1 << 53) return NP_BADARG;
    for (int j = 0; j < n; j++) gc = NP_NAME(np_d16_gcd)(k[j] - kmin, gc);
    if (gc == 0) gc = 1;
    int64_t kc = kmin + gc * (((kmax - kmin) / gc) / 2);
    int16_t digit[3][16] = {{0}};
    int pieces = 1;
    for (int j = 0; j < n; j++) {
        int64_t u = (k[j] - kc) / gc; /* exact: gc divides k_j - kmin and kc - kmin */
        for (int p = 0; u != 0; p++) {
            int64_t d = ((u + 8191) & 16383) - 8191; /* u - d is a multiple of 2^14 */
            digit[p][j] = (int16_t)d;
            u = (u - d) >> 14;
            if (p + 1 > pieces) pieces = p + 1;
        }
    }
    for (int p = 0; p < 3; p++) {
        uint8_t lo[16], hi[16];
        for (int j = 0; j < 16; j++) {
            lo[j] = (uint8_t)((uint16_t)digit[p][j] & 255);
            hi[j] = (uint8_t)((uint16_t)digit[p][j] >> 8);
        }
        lv->lo[p] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lo));
        lv->hi[p] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hi));
    }
    memcpy(lv->digit, digit, sizeof digit);
    lv->pieces = pieces;
    lv->gc = (double)gc;
    lv->kc = (double)kc;
    lv->quantum = quantum;
    return NP_OK;
}

/* v of rows [0, T) as int16 in the layout above (w [T, groups * 128]) and the group totals
 * tot [T, g4] (g4 = groups rounded up to 4, padding zero); NP_BADARG when some v is outside
 * [-2^14, 2^14). */
static int NP_NAME(np_d16_prepare)(const int32_t *v, int64_t T, int64_t in_pad, int bits,
                                   int16_t *w, int32_t *tot, int64_t g4) {
    int64_t groups = in_pad / 128;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int16_t *out = w + t * in_pad + g * 128;
            int32_t sum = 0;
            for (int c = 0; c < 128; c++) {
                if (x[c] < -16384 || x[c] >= 16384) return NP_BADARG;
                sum += x[c];
                int kb = bits == 4 ? (c >> 1) & 31 : c >> 2;         /* byte of its register */
                int f = bits == 4 ? ((c >> 6) << 1) | (c & 1) : c & 3; /* its field */
                int e = ((kb >> 4) << 3) | (kb & 7), u = (kb >> 3) & 1;
                out[(f * 2 + u) * 16 + e] = (int16_t)x[c];
            }
            tot[t * g4 + g] = sum;
        }
    return NP_OK;
}

/* One group (64 code bytes) against nb activation rows: the four float64 lanes of
 * sum_p 2^(14 p) (digit p's sum) to q[b * qstride + 0..3] (exact integers). */
static inline __attribute__((always_inline)) void NP_NAME(np_d16_group)(
    const uint8_t *bytes, const int bits, const int16_t *w, int64_t w_stride, const int nb,
    const int P, const np_d16_levels *lv, double *q, int64_t qstride) {
    const __m256i mask = _mm256_set1_epi8(bits == 4 ? 15 : 3);
    __m256i acc[NP_D16_RB][3];
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < P; p++) acc[b][p] = _mm256_setzero_si256();
    __m256i c = _mm256_loadu_si256((const __m256i *)bytes);
    for (int f = 0; f < 4; f++) { /* field f: register f >> 1 (4-bit) or the one (2-bit) */
        if (bits == 4 && f == 2) c = _mm256_loadu_si256((const __m256i *)(bytes + 32));
        const int shift = bits == 4 ? 4 * (f & 1) : 2 * f;
        __m256i idx = _mm256_and_si256(shift ? _mm256_srli_epi16(c, shift) : c, mask);
        for (int p = 0; p < P; p++) {
            __m256i tl = _mm256_shuffle_epi8(lv->lo[p], idx);
            __m256i th = _mm256_shuffle_epi8(lv->hi[p], idx);
            __m256i w0 = _mm256_unpacklo_epi8(tl, th), w1 = _mm256_unpackhi_epi8(tl, th);
            for (int b = 0; b < nb; b++) {
                const int16_t *a = w + b * w_stride + f * 32;
                __m256i a0 = _mm256_loadu_si256((const __m256i *)a);
                __m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 16));
#ifdef NP_SIMD_AVX512
                acc[b][p] = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(acc[b][p], w0, a0), w1, a1);
#else
                acc[b][p] = _mm256_add_epi32(
                    acc[b][p], _mm256_add_epi32(_mm256_madd_epi16(w0, a0),
                                                _mm256_madd_epi16(w1, a1)));
#endif
            }
        }
    }
    for (int b = 0; b < nb; b++) {
        __m256d sum = _mm256_setzero_pd();
        for (int p = 0; p < P; p++) {
            __m256d part = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(acc[b][p])),
                                         _mm256_cvtepi32_pd(_mm256_extracti128_si256(acc[b][p], 1)));
            sum = p ? _mm256_add_pd(sum, _mm256_mul_pd(part, _mm256_set1_pd((double)(1 << (14 * p)))))
                    : part;
        }
        _mm256_storeu_pd(q + b * qstride, sum);
    }
}

/* D of 4 groups from their four lanes each (q[g][4]): W, then (gc W + kc tot) qu. */
static inline void NP_NAME(np_d16_dots4)(const double *q, const int32_t *tot,
                                         const np_d16_levels *lv, double *dots) {
    __m256d h01 = _mm256_hadd_pd(_mm256_loadu_pd(q), _mm256_loadu_pd(q + 4));
    __m256d h23 = _mm256_hadd_pd(_mm256_loadu_pd(q + 8), _mm256_loadu_pd(q + 12));
    __m256d w = _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20),
                              _mm256_permute2f128_pd(h01, h23, 0x31));
    __m256d t = _mm256_cvtepi32_pd(_mm_loadu_si128((const __m128i *)tot));
    __m256d k = _mm256_add_pd(_mm256_mul_pd(w, _mm256_set1_pd(lv->gc)),
                              _mm256_mul_pd(t, _mm256_set1_pd(lv->kc)));
    _mm256_storeu_pd(dots, _mm256_mul_pd(k, _mm256_set1_pd(lv->quantum)));
}

static inline __attribute__((always_inline)) void NP_NAME(np_d16_rows)(
    const np_cq_part *part, int64_t groups, int64_t r0, int64_t r1, const int bits,
    const int16_t *w,
    int64_t w_stride, const int32_t *tot, const int nb, const int P, const np_d16_levels *lv,
    const double *s, float *out, int64_t out_stride, double *dots, double *q) {
    int64_t g4 = (groups + 3) & ~(int64_t)3, dstride = NP_D16_RB * g4, qstride = g4 * 4;
    for (int64_t r4 = r0; r4 < r1; r4 += 4) {
        int rows = (int)(r1 - r4 < 4 ? r1 - r4 : 4);
        for (int i = 0; i < rows; i++) {
            const uint8_t *p = part->packed + (r4 + i) * part->row_bytes;
            for (int64_t g = 0; g < groups; g++)
                NP_NAME(np_d16_group)(p + g * 16 * bits, bits, w + g * 128, w_stride, nb, P, lv, q + g * 4,
                                      qstride);
            for (int b = 0; b < nb; b++)
                for (int64_t g = 0; g < groups; g += 4)
                    NP_NAME(np_d16_dots4)(q + b * qstride + g * 4, tot + b * g4 + g, lv,
                                          dots + i * dstride + b * g4 + g);
        }
        NP_NAME(np_tile_epilogue)(part, groups, r4, rows, nb, dots, dstride, g4, s, out,
                                  out_stride);
    }
}

#define NP_D16_CASE(bits, nb, P)                                                           \
    NP_NAME(np_d16_rows)(&parts[p], groups, a, z, bits, W, in_pad, tt, nb, P, &lv, s, o,     \
                         out_stride, dots, q)
#define NP_D16_P(bits, nb)                                                                 \
    switch (lv.pieces) {                                                                   \
    case 3: NP_D16_CASE(bits, nb, 3); break;                                               \
    case 2: NP_D16_CASE(bits, nb, 2); break;                                               \
    default: NP_D16_CASE(bits, nb, 1); break;                                              \
    }
#define NP_D16_NB(bits)                                                                    \
    switch (nb) {                                                                          \
    case 4: NP_D16_P(bits, 4) break;                                                       \
    case 3: NP_D16_P(bits, 3) break;                                                       \
    case 2: NP_D16_P(bits, 2) break;                                                       \
    default: NP_D16_P(bits, 1) break;                                                      \
    }

/* np_cq_matmul for 2- or 4-bit storage in integers (16-bit digits). NP_BADARG (nothing
 * written) when the codebook or v is outside what the integer sums cover: the float64 kernel
 * runs. */
static int NP_NAME(np_cq_int16)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               int bits, const float *codebook, int64_t codebook_len,
                               const np_cq_part *parts, int64_t n_parts, float *out,
                               int64_t out_stride, int64_t r_first, int64_t r_last) {
    np_d16_levels lv;
    if (NP_NAME(np_d16_levels_of)(codebook, codebook_len, bits, &lv) != NP_OK)
        return NP_BADARG;
    int64_t groups = in_pad / 128, g4 = (groups + 3) & ~(int64_t)3;
    int16_t *w = (int16_t *)malloc(sizeof(int16_t) * (size_t)(T * in_pad + 32));
    int32_t *tot = (int32_t *)calloc((size_t)(T * g4), sizeof(int32_t));
    double *dots = (double *)malloc(sizeof(double) * (size_t)(4 * NP_D16_RB * g4));
    double *q = (double *)calloc((size_t)(NP_D16_RB * g4 * 4), sizeof(double));
    if (!w || !tot || !dots || !q) {
        free(w);
        free(tot);
        free(dots);
        free(q);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_d16_prepare)(v, T, in_pad, bits, w, tot, g4);
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += NP_D16_RB) {
        int nb = (int)(T - t0 < NP_D16_RB ? T - t0 : NP_D16_RB);
        double s[NP_D16_RB];
        for (int b = 0; b < nb; b++) s[b] = (double)scale[t0 + b];
        const int16_t *W = w + t0 * in_pad;
        const int32_t *tt = tot + t0 * g4;
        float *o = out + t0 * out_stride;
        int64_t base = 0;
        for (int64_t p = 0; p < n_parts; p++) {
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < parts[p].rows ? r_last - base : parts[p].rows;
            if (a < z) {
                if (bits == 4) {
                    NP_D16_NB(4)
                } else {
                    NP_D16_NB(2)
                }
            }
            base += parts[p].rows;
        }
    }
    free(w);
    free(tot);
    free(dots);
    free(q);
    return status;
}
#undef NP_D16_CASE
#undef NP_D16_P
#undef NP_D16_NB
#undef NP_D16_RB
#endif
