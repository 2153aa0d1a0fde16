/* The int8 product's SIMD tile (included once per SIMD variant after np_i8_body.h, which
 * keeps the portable kernel): a tile of up to I8_TILE activation rows against one group of
 * 8 outputs, the group's packed weights unpacked once per block for every row of the tile.
 * The same bits as kernels/i8.py `matmul_reference` (tests/kernels/test_i8_tile.py):
 *
 * - the block dots are exact int32 sums: AVX-512 VNNI forms them with vpdpbusd (4 byte
 *   products per 32-bit lane), AVX2 with vpmaddubsw + vpmaddwd (4-bit weights: the 8 byte
 *   products of a block sum in 16 bits first, at most 8 * 2 * 15 * 127 = 30480);
 * - the epilogue is the pinned float64 one, per output and block in block order:
 *   inner = ws * D, inner = inner + wm * S, term = inner * xs, acc = acc + term. ws * D
 *   (24-bit significand times |D| < 2^20) and wm * S (|S| <= 32 * 127 < 2^12) are exact in
 *   float64, so one fused multiply-add fma(ws, D, wm * S) rounds the same exact sum once,
 *   exactly as the reference's add does: the same bits with one operation fewer. The
 *   other two operations stay separate (-ffp-contract=off; only this explicit fma fuses).
 *   The activation scales and sums are converted to float64 once per call (exact).
 */
#if defined(NP_SIMD_AVX2)

#if defined(NP_SIMD_AVX512)
#define I8_TILE 8 /* 32 vector registers: 8 int32 sums + 8 float64 accumulators of 8 */
#else
#define I8_TILE 4 /* 16 vector registers */
#endif

/* 8 float32 (or float16) weight scales of block b -> float32 vector. */
static inline __m256 NP_NAME(i8_scale8)(const void *base, int half, int64_t b) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + b * 8)));
    return _mm256_loadu_ps((const float *)base + b * 8);
}

#if defined(NP_SIMD_AVX512)
/* One row's block dot against a group in four independent vpdpbusd chains (one chain of
 * eight would bound a single-row product by the instruction's latency, not by memory). */
static inline __m256i NP_NAME(i8_dot1)(const int8_t *xb, int bits, const uint8_t *wg,
                                       int64_t b) {
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    int32_t four[8];
    memcpy(four, xb, 32);
    if (bits == 4) {
        const uint8_t *wb = wg + b * 128;
        const __m256i mask = _mm256_set1_epi8(0x0F);
        for (int q = 0; q < 4; q++) {
            __m256i packed = _mm256_loadu_si256((const __m256i *)(wb + q * 32));
            __m256i wlo = _mm256_and_si256(packed, mask);
            __m256i whi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
            a[q & 1] = _mm256_dpbusd_epi32(a[q & 1], wlo, _mm256_set1_epi32(four[q]));
            a[2 + (q & 1)] = _mm256_dpbusd_epi32(a[2 + (q & 1)], whi,
                                                 _mm256_set1_epi32(four[q + 4]));
        }
    } else {
        const uint8_t *wb = wg + b * 256;
        for (int q = 0; q < 8; q++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wb + q * 32));
            __m256i xv = _mm256_set1_epi32(four[q]);
            a[q & 3] = _mm256_dpbusd_epi32(a[q & 3], _mm256_abs_epi8(xv), _mm256_sign_epi8(w, xv));
        }
    }
    return _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]));
}
#endif

/* Rows t0 .. t0+R-1 (R constant where inlined) against one group: acc [R][8] float64 over
 * all blocks. xs / ss: the rows' activation scales / sums as float64, [T, nb]. */
static inline void NP_NAME(i8_tile)(const int8_t *codes, const double *xs, const double *ss,
                                    int64_t t0, const int R, int64_t nb, int bits,
                                    const uint8_t *wg, const void *sg, const void *mg,
                                    int half, double *out) {
    int64_t k_pad = nb * 32;
    const int8_t *x0 = codes + t0 * k_pad;
    const double *xs0 = xs + t0 * nb, *ss0 = ss + t0 * nb;
    const __m256i ones16 = _mm256_set1_epi16(1);
    (void)ones16;
#if defined(NP_SIMD_AVX512)
    __m512d acc[I8_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_pd();
#else
    __m256d acc[I8_TILE][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
#endif
    for (int64_t b = 0; b < nb; b++) {
        __m256i iacc[I8_TILE];
        const int8_t *xb = x0 + b * 32;
#if defined(NP_SIMD_AVX512)
        if (R == 1) {
            iacc[0] = NP_NAME(i8_dot1)(xb, bits, wg, b);
        } else
#endif
        if (bits == 4) {
            const uint8_t *wb = wg + b * 128;
            const __m256i mask = _mm256_set1_epi8(0x0F);
#if !defined(NP_SIMD_AVX512)
            __m256i acc16[I8_TILE];
            for (int r = 0; r < R; r++) acc16[r] = _mm256_setzero_si256();
#else
            for (int r = 0; r < R; r++) iacc[r] = _mm256_setzero_si256();
#endif
            for (int q = 0; q < 4; q++) {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(wb + q * 32));
                __m256i wlo = _mm256_and_si256(packed, mask);
                __m256i whi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
                for (int r = 0; r < R; r++) {
                    int32_t lo4, hi4;
                    memcpy(&lo4, xb + r * k_pad + 4 * q, 4);
                    memcpy(&hi4, xb + r * k_pad + 4 * q + 16, 4);
                    __m256i xlo = _mm256_set1_epi32(lo4), xhi = _mm256_set1_epi32(hi4);
#if defined(NP_SIMD_AVX512)
                    iacc[r] = _mm256_dpbusd_epi32(iacc[r], wlo, xlo);
                    iacc[r] = _mm256_dpbusd_epi32(iacc[r], whi, xhi);
#else
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wlo, xlo),
                                                 _mm256_maddubs_epi16(whi, xhi));
                    acc16[r] = _mm256_add_epi16(acc16[r], p);
#endif
                }
            }
#if !defined(NP_SIMD_AVX512)
            for (int r = 0; r < R; r++) iacc[r] = _mm256_madd_epi16(acc16[r], ones16);
#endif
        } else {
            /* int8 x int8: |x| (u8) times w with x's sign, exact (each 16-bit pair sum of
             * vpmaddubsw is at most 2 * 127 * 127 = 32258) */
            const uint8_t *wb = wg + b * 256;
            for (int r = 0; r < R; r++) iacc[r] = _mm256_setzero_si256();
            for (int q = 0; q < 8; q++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(wb + q * 32));
                for (int r = 0; r < R; r++) {
                    int32_t four;
                    memcpy(&four, xb + r * k_pad + 4 * q, 4);
                    __m256i xv = _mm256_set1_epi32(four);
#if defined(NP_SIMD_AVX512)
                    iacc[r] = _mm256_dpbusd_epi32(iacc[r], _mm256_abs_epi8(xv),
                                                  _mm256_sign_epi8(w, xv));
#else
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(w, xv));
                    iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(p, ones16));
#endif
                }
            }
        }
        /* the pinned epilogue (file comment) */
        __m256 s32 = NP_NAME(i8_scale8)(sg, half, b);
        __m256 m32 = mg ? NP_NAME(i8_scale8)(mg, half, b) : _mm256_setzero_ps();
#if defined(NP_SIMD_AVX512)
        __m512d s8 = _mm512_cvtps_pd(s32), m8 = _mm512_cvtps_pd(m32);
        for (int r = 0; r < R; r++) {
            __m512d d = _mm512_cvtepi32_pd(iacc[r]);
            __m512d inner = mg ? _mm512_fmadd_pd(s8, d, _mm512_mul_pd(m8, _mm512_set1_pd(ss0[r * nb + b])))
                               : _mm512_mul_pd(s8, d);
            acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(inner, _mm512_set1_pd(xs0[r * nb + b])));
        }
#else
        __m256d slo = _mm256_cvtps_pd(_mm256_castps256_ps128(s32));
        __m256d shi = _mm256_cvtps_pd(_mm256_extractf128_ps(s32, 1));
        __m256d mlo = _mm256_cvtps_pd(_mm256_castps256_ps128(m32));
        __m256d mhi = _mm256_cvtps_pd(_mm256_extractf128_ps(m32, 1));
        for (int r = 0; r < R; r++) {
            __m256d dlo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(iacc[r]));
            __m256d dhi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(iacc[r], 1));
            __m256d ilo, ihi;
            if (mg) {
                __m256d sv = _mm256_broadcast_sd(ss0 + r * nb + b);
                ilo = _mm256_fmadd_pd(slo, dlo, _mm256_mul_pd(mlo, sv));
                ihi = _mm256_fmadd_pd(shi, dhi, _mm256_mul_pd(mhi, sv));
            } else {
                ilo = _mm256_mul_pd(slo, dlo);
                ihi = _mm256_mul_pd(shi, dhi);
            }
            __m256d xv = _mm256_broadcast_sd(xs0 + r * nb + b);
            acc[r][0] = _mm256_add_pd(acc[r][0], _mm256_mul_pd(ilo, xv));
            acc[r][1] = _mm256_add_pd(acc[r][1], _mm256_mul_pd(ihi, xv));
        }
#endif
    }
    for (int r = 0; r < R; r++) {
#if defined(NP_SIMD_AVX512)
        _mm512_storeu_pd(out + r * 8, acc[r]);
#else
        _mm256_storeu_pd(out + r * 8, acc[r][0]);
        _mm256_storeu_pd(out + r * 8 + 4, acc[r][1]);
#endif
    }
}

#define I8_TILE_CASE(n)                                                                    \
    case n:                                                                                \
        NP_NAME(i8_tile)(codes, xs, ss, t0, n, nb, bits, wg, sg, mg, half, acc);           \
        break;

/* out[t, n] for groups g_first .. g_last-1 (outputs n < n_out), every row: the group's
 * weights stay in L1 while every row tile passes over them. */
static void NP_NAME(i8_matmul_tiles)(const int8_t *codes, const double *xs, const double *ss,
                                     int64_t T, int64_t nb, int bits, const uint8_t *wdata,
                                     const void *wscale, const void *woffset, int half,
                                     int64_t g_first, int64_t g_last, int64_t n_out,
                                     const float *bias, float *out, int64_t out_stride) {
    int64_t group_bytes = nb * (bits == 8 ? 256 : 128);
    size_t width = half ? 2 : 4;
    for (int64_t g = g_first; g < g_last; g++) {
        const uint8_t *wg = wdata + g * group_bytes;
        const void *sg = (const char *)wscale + (size_t)(g * nb * 8) * width;
        const void *mg = woffset ? (const char *)woffset + (size_t)(g * nb * 8) * width : NULL;
        for (int64_t t0 = 0; t0 < T; t0 += I8_TILE) {
            int R = T - t0 < I8_TILE ? (int)(T - t0) : I8_TILE;
            double acc[I8_TILE * 8];
            switch (R) { /* a constant R per case: each is unrolled on its own */
#if I8_TILE == 8
                I8_TILE_CASE(8)
                I8_TILE_CASE(7)
                I8_TILE_CASE(6)
                I8_TILE_CASE(5)
#endif
                I8_TILE_CASE(4)
                I8_TILE_CASE(3)
                I8_TILE_CASE(2)
            default:
                NP_NAME(i8_tile)(codes, xs, ss, t0, 1, nb, bits, wg, sg, mg, half, acc);
            }
            for (int r = 0; r < R; r++) {
                float *o = out + (t0 + r) * out_stride;
                for (int j = 0; j < 8; j++) {
                    int64_t n = g * 8 + j;
                    if (n >= n_out) break;
                    float y = (float)acc[r * 8 + j];
                    if (bias) y = y + bias[n];
                    o[n] = y;
                }
            }
        }
    }
}

#undef I8_TILE_CASE
#undef I8_TILE
#endif /* NP_SIMD_AVX2 */
