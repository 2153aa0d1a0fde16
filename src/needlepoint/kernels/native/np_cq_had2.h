/* The transform on the weights (np_cq_had.h, whose header gives the algebra) for the AVX2
 * variant, included by np_cq_int.h after np_cq_had.h. docs/numerics.md "Exact CQ x A8
 * products" is the contract, kernels/exact.py `cq_matmul_reference` the numpy reference with
 * the same bits.
 *
 * AVX2 has no vpdpbusd: a u8 x s8 product goes through vpmaddubsw (adjacent pairs of products
 * summed into int16 lanes, saturating) and vpmaddwd against ones (adjacent int16 pairs summed
 * into the int32 lanes), so every int16 sum must stay within 32767. With the VNNI form's
 * u = H x + 64 in [0, 192] it would not (2 * 192 * 127 > 32767), so here the offset 64 is left
 * off at k = 0, where (H x)_0 = sum x is already in [0, 128]:
 *   y_0 = (H x)_0 in [0, 128],  y_k = (H x)_k + 64 in [0, 128] (k > 0).
 * Every (H x)_k is a sum of the same bits with signs +-1, so all have the parity p of sum x
 * (p = y_0 & 1), and u = y >> 1 in [0, 64] loses nothing: (H x)_k = 2 u_k + p - 64 [k > 0], so
 *   P_x = (H x) . q = 2 sum_k u_k q_k + p v_0 - 64 (v_0 - q_0)
 * (v_0 = sum_k q_k: row 0 of H is all ones). With q in [-127, 127] a vpmaddubsw pair sum is
 * within 2 * 64 * 127 and the kernel adds two of them (columns 4 k4 + {0, 1} and 4 k4 + 4 +
 * {0, 1}, or + {2, 3}) in int16 before vpmaddwd: within 4 * 64 * 127 = 32512 < 32767, so no
 * lane saturates or wraps; |sum_k u_k q_k| <= 128 * 64 * 127 < 2^21 in the int32 lanes, so
 * P_x, the S_j, D and the epilogue are the exact values and bits of the other kernels
 * (docs/numerics.md "Exact CQ x A8 products"). np_had2_acts recovers q = H v / 128 as
 * np_cq_had.h does and also hands back q = -128 (outside the bound above): NP_BADARG, and
 * np_cq_int runs another kernel. A8 codes are in [-127, 127] (docs/numerics.md step 1), so A8
 * activations always pass.
 *
 * Layout: register (k4, x, h) holds, in 32-bit lane i, u_{4 k4 + j} (byte j) of plane x of
 * weight row 8 h + i of the 16-row block, against a broadcast dword of q (columns 4 k4 ..
 * 4 k4 + 3), as in np_cq_had.h with 8 rows a register. The H_4 of a quad's plane nibble is a
 * 16-dword table looked up with two vpermd (8 entries each, index bits 0-2) and a blend on bit
 * 3; the H_32 over the 32 quads is five butterfly stages on bytes that wrap modulo 256 (every
 * final y is in [0, 128], so the wrapped bytes are the exact values): three within groups of 8
 * quads in registers, two across the groups, which also halve the bytes and keep the parity of
 * each row and plane as a lane mask (u[192 + x * 2 + h]). */

#if defined(NP_SIMD_AVX2) && !defined(NP_SIMD_AVX512)
#ifndef NP_HAD2_ONCE
#define NP_HAD2_ONCE
#define NP_HAD2_SUB 64 /* activation rows per pass over the weights (bounds the dots buffer) */
/* Activation rows from which np_cq_int picks this kernel on AVX2, with the interleaved copy
 * and without it, measured in one process against the default pick before it (the lookups,
 * bench/needlepoint_bench/products_curve.py): with the copy 1.04-1.05x faster at 12 rows,
 * 1.1x at 16, 1.2-1.3x from 24; slower at 8 rows and below (2.5x at one row), where too few
 * activation rows share the transform of the planes (about 3-4 rows' worth of tile work);
 * without the copy 1.02x at 12 rows, 1.06-1.09x at 16. */
#define NP_HAD2_TMIN_AVX2 12
#define NP_HAD2_TMIN_PACKED_AVX2 16
#endif

/* Per activation row t and group g: q = H v / 128 as int8 at q8[t * in_pad + g * 128 + k],
 * corr[t * groups + g] = 64 (v_0 - q_0) and tot[...] = sum_c v_c (= (H v)_0 = 128 q_0).
 * NP_BADARG when some v is outside [-2^14, 2^14) or H v is not 128 times a vector with
 * entries in [-127, 127]. */
static int NP_NAME(np_had2_acts)(const int32_t *v, int64_t T, int64_t in_pad, int8_t *q8,
                                 int32_t *corr, int32_t *v0, int32_t *tot) {
    int64_t groups = in_pad / 128;
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < groups; g++) {
            const int32_t *x = v + t * in_pad + g * 128;
            int32_t r[128];
            for (int c = 0; c < 128; c++) {
                r[c] = x[c];
                bad |= x[c] < -16384 || x[c] > 16383;
            }
            if (bad) return NP_BADARG; /* before the sums below, which then stay within 2^21 */
            for (int h = 1; h < 128; h <<= 1)
                for (int i = 0; i < 128; i++)
                    if (!(i & h)) {
                        int32_t a = r[i], b = r[i + h];
                        r[i] = a + b;
                        r[i + h] = a - b;
                    }
            int8_t *out = q8 + t * in_pad + g * 128;
            for (int k = 0; k < 128; k++) {
                bad |= (r[k] & 127) != 0 || r[k] < -127 * 128 || r[k] > 127 * 128;
                out[k] = (int8_t)(r[k] >> 7);
            }
            corr[t * groups + g] = 64 * (x[0] - (r[0] >> 7));
            v0[t * groups + g] = x[0];
            tot[t * groups + g] = r[0];
        }
    return bad ? NP_BADARG : NP_OK;
}

/* 16 lanes of table lookups: dword p & 15 of lo (entries 0-7) | hi (8-15). */
static inline __m256i NP_NAME(np_had2_look)(__m256i p, __m256i lo, __m256i hi) {
    __m256 a = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(lo, p));
    __m256 b = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(hi, p));
    return _mm256_castps_si256(_mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(p, 28))));
}

/* The transformed planes of one 16-row block and group: u[(k4 * 3 + x) * 2 + h] (see the
 * header) from the block's plane-nibble bytes nib (NP_LUT_BLOCK bytes, interleaved order:
 * quad c of rows 0-15 at rev4(c % 16) * 32 + 16 (c / 16)). lo / hi: the 16-dword H_4 table. */
static __attribute__((noinline)) void NP_NAME(np_had2_planes)(const uint8_t *nib, __m256i lo,
                                                               __m256i hi, __m256i *u) {
    static const uint8_t rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    const __m256i off = _mm256_set1_epi8(64), off0 = _mm256_set1_epi32(64);
    const __m256i one = _mm256_set1_epi32(1), low7 = _mm256_set1_epi8(127);
#define NP_HAD2_HALF(y) _mm256_and_si256(_mm256_srli_epi16(y, 1), low7)
    for (int x = 0; x < 3; x++)
        for (int h = 0; h < 2; h++) {
            __m256i *uo = u + x * 2 + h; /* quad c at uo[c * 6] */
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) { /* quads 8 qt .. 8 qt + 7 */
                __m256i y[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    int c = 8 * qt + i;
                    __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        (const __m128i *)(nib + rev4[c & 15] * 32 + 16 * (c >> 4) + 8 * h)));
                    __m256i p = x == 0 ? n : _mm256_srli_epi32(n, 4); /* b0 = n, b1 = n >> 4 */
                    if (x == 2) p = _mm256_and_si256(p, n);
                    y[i] = NP_NAME(np_had2_look)(p, lo, hi);
                }
                /* + 64 on every u (H (64 e_0) = 64, all ones), k = 0 taken back below */
                if (qt == 0) y[0] = _mm256_add_epi8(y[0], off);
#pragma GCC unroll 3
                for (int s = 1; s < 8; s <<= 1)
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++)
                        if (!(i & s)) {
                            __m256i a = y[i], b = y[i + s];
                            y[i] = _mm256_add_epi8(a, b);
                            y[i + s] = _mm256_sub_epi8(a, b);
                        }
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) _mm256_store_si256(uo + (8 * qt + i) * 6, y[i]);
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) { /* quad groups at distance 1, 2 (quads 8, 16) */
                __m256i a = _mm256_load_si256(uo + i * 6), b = _mm256_load_si256(uo + (8 + i) * 6);
                __m256i c = _mm256_load_si256(uo + (16 + i) * 6);
                __m256i d = _mm256_load_si256(uo + (24 + i) * 6);
                __m256i ab = _mm256_add_epi8(a, b), amb = _mm256_sub_epi8(a, b);
                __m256i cd = _mm256_add_epi8(c, d), cmd = _mm256_sub_epi8(c, d);
                __m256i u0 = _mm256_add_epi8(ab, cd);
                if (i == 0) { /* k = 0 (byte 0 of quad 0): no offset; its bit 0 the parity */
                    u0 = _mm256_sub_epi8(u0, off0);
                    u[192 + x * 2 + h] = _mm256_cmpeq_epi32(_mm256_and_si256(u0, one), one);
                }
                /* y >> 1 bytewise (the bit shifted in from the byte above masked off) */
                _mm256_store_si256(uo + i * 6, NP_HAD2_HALF(u0));
                _mm256_store_si256(uo + (8 + i) * 6, NP_HAD2_HALF(_mm256_add_epi8(amb, cmd)));
                _mm256_store_si256(uo + (16 + i) * 6, NP_HAD2_HALF(_mm256_sub_epi8(ab, cd)));
                _mm256_store_si256(uo + (24 + i) * 6, NP_HAD2_HALF(_mm256_sub_epi8(amb, cmd)));
            }
        }
#undef NP_HAD2_HALF
}

/* D of 8 weight rows (lanes) of one group and activation row from the accumulated
 * sum_k u_k q_k of the three planes (r_x): P_x = 2 r_x + p_x v_0 - corr (pm: the parity
 * masks p_x of the rows, corr = 64 (v_0 - q_0)), the S_j and D = sum_j cb[j] S_j (exact in
 * any order, so FMA too), stored at o[0..7]. */
static inline void NP_NAME(np_had2_dots)(__m256i r0, __m256i r1, __m256i r01,
                                         const __m256i *pm, int32_t corr, int32_t v0,
                                         int32_t total, const double *cb, double *o) {
    const __m256i c = _mm256_set1_epi32(corr), w = _mm256_set1_epi32(v0);
#define NP_HAD2_P(r, x) \
    _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(r, 1), _mm256_and_si256(pm[2 * x], w)), c)
    __m256i p0 = NP_HAD2_P(r0, 0), p1 = NP_HAD2_P(r1, 1), p01 = NP_HAD2_P(r01, 2);
#undef NP_HAD2_P
    __m256i s1 = _mm256_sub_epi32(p0, p01), s2 = _mm256_sub_epi32(p1, p01);
    __m256i s0 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_set1_epi32(total), p01),
                                  _mm256_add_epi32(p0, p1));
    const __m256i sj[4] = {s0, s1, s2, p01};
    for (int half = 0; half < 2; half++) {
        __m256d acc = _mm256_setzero_pd();
        for (int j = 0; j < 4; j++) {
            __m128i part = half ? _mm256_extracti128_si256(sj[j], 1) : _mm256_castsi256_si128(sj[j]);
            acc = _mm256_fmadd_pd(_mm256_cvtepi32_pd(part), _mm256_set1_pd(cb[j]), acc);
        }
        _mm256_store_pd(o + 4 * half, acc);
    }
}

/* np_epilogue of the 16 rows of a block, one row per float64 lane, for activation rows
 * [0, nb): the scalar epilogue's operations in its order (acc = 0, then acc + norm_g D_g for g
 * ascending, times s, times 2^-3.5, to float; no contraction: -ffp-contract=off), so the same
 * bits. dots[(t * groups + g) * 16 + i], nt[g * 16 + i] (float64); rows past `rows` are not
 * written. */
static void NP_NAME(np_had2_epilogue)(const double *dots, const double *nt, int64_t groups,
                                      int64_t nb, int rows, const double *s, float *out,
                                      int64_t out_stride) {
    for (int64_t t = 0; t < nb; t++) {
        const double *d = dots + t * groups * 16;
        __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                        _mm256_setzero_pd()};
        for (int64_t g = 0; g < groups; g++)
            for (int i = 0; i < 4; i++)
                a[i] = _mm256_add_pd(a[i], _mm256_mul_pd(_mm256_load_pd(nt + g * 16 + 4 * i),
                                                         _mm256_load_pd(d + g * 16 + 4 * i)));
        const __m256d st = _mm256_set1_pd(s[t]), k = _mm256_set1_pd(0.08838834764831845);
        float f[16];
        for (int i = 0; i < 4; i++)
            _mm_storeu_ps(f + 4 * i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(a[i], st), k)));
        memcpy(out + t * out_stride, f, sizeof(float) * (size_t)rows);
    }
}

/* D of 8 weight rows (half h of a block, group g) for NB activation rows [b0, b0 + NB) (NB =
 * 3, 2, 1, a function each with its accumulators in named variables, 15 registers at most):
 * per plane and pair of quads, vpmaddubsw of the halved planes against broadcast dwords of q,
 * the two int16 results added (each pair sum within 2 * 64 * 127, their sum within 32512),
 * vpmaddwd against ones, then np_had2_dots into dots[((b0 + b) * groups + g) * 16 + 8 h]. */
/* acc += vpmaddwd(vpmaddubsw(wa, q quad pa) + vpmaddubsw(wb, q quad pa + 1), ones), the
 * dwords of q broadcast where they are used: with intrinsics GCC loads the six broadcasts of
 * a pair of quads once, keeps them in registers and spills the accumulators. */
#define NP_HAD2_STEP(A, WA, WB, ONES, PA)                                                     \
    {                                                                                          \
        __m256i t1, t2;                                                                        \
        __asm__("vpbroadcastd %[qa], %[t1]\n\t"                                                \
                "vpbroadcastd %[qb], %[t2]\n\t"                                                \
                "vpmaddubsw %[t1], %[wa], %[t1]\n\t"                                           \
                "vpmaddubsw %[t2], %[wb], %[t2]\n\t"                                           \
                "vpaddw %[t2], %[t1], %[t1]\n\t"                                               \
                "vpmaddwd %[one], %[t1], %[t1]\n\t"                                            \
                "vpaddd %[t1], %[acc], %[acc]"                                                 \
                : [acc] "+x"(A), [t1] "=&x"(t1), [t2] "=&x"(t2)                              \
                : [wa] "x"(WA), [wb] "x"(WB), [one] "x"(ONES),                                 \
                  [qa] "m"(*(const int32_t *)(PA)), [qb] "m"(*(const int32_t *)((PA) + 4)));    \
    }
#define NP_HAD2_TILE_N(NB)                                                                     \
    static __attribute__((noinline)) void NP_NAME(np_had2_tile##NB)(                           \
        const __m256i *u, int h, const int8_t *q8, int64_t in_pad, const int32_t *corr,       \
        const int32_t *v0, const int32_t *tot, int64_t groups, int64_t g, int64_t b0,         \
        const double *cb, double *dots) {                                                     \
        const int nb = NB;                                                                    \
        const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);                \
        __m256i a00 = z, a01 = z, a02 = z, a10 = z, a11 = z, a12 = z, a20 = z, a21 = z;       \
        __m256i a22 = z;                                                                      \
        const int8_t *q = q8 + b0 * in_pad + g * 128;                                         \
        for (int k4 = 0; k4 < 32; k4 += 2) {                                                  \
            NP_HAD2_PLANE(0) NP_HAD2_PLANE(1) NP_HAD2_PLANE(2)                                \
        }                                                                                     \
        NP_HAD2_OUT(0) NP_HAD2_OUT(1) NP_HAD2_OUT(2)                                          \
    }
#define NP_HAD2_PLANE(x)                                                                       \
    {                                                                                          \
        const __m256i wa = _mm256_load_si256(u + k4 * 6 + 2 * x + h);                         \
        const __m256i wb = _mm256_load_si256(u + k4 * 6 + 6 + 2 * x + h);                      \
        NP_HAD2_DP(0, x) NP_HAD2_DP(1, x) NP_HAD2_DP(2, x)                                     \
    }
#define NP_HAD2_DP(b, x)                                                                       \
    if (b < nb) NP_HAD2_STEP(a##b##x, wa, wb, ones, q + b * in_pad + 4 * k4);
#define NP_HAD2_OUT(b)                                                                         \
    if (b < nb) {                                                                              \
        int64_t at = (b0 + b) * groups + g;                                                    \
        NP_NAME(np_had2_dots)(a##b##0, a##b##1, a##b##2, u + 192 + h, corr[at], v0[at],       \
                              tot[at], cb, dots + at * 16 + 8 * h);                            \
    }
NP_HAD2_TILE_N(3)
NP_HAD2_TILE_N(2)
NP_HAD2_TILE_N(1)
#undef NP_HAD2_TILE_N
#undef NP_HAD2_STEP
#undef NP_HAD2_PLANE
#undef NP_HAD2_DP
#undef NP_HAD2_OUT

/* np_cq_matmul for 2-bit storage and at most 4 levels by the transform on the weights (AVX2).
 * NP_BADARG (nothing written) when v is not 128-group Walsh-Hadamard images of vectors with
 * entries in [-127, 127] within [-2^14, 2^14) (np_had2_acts): np_cq_int then runs another
 * kernel. */
static int NP_NAME(np_cq_had2)(const int32_t *v, const float *scale, int64_t T, int64_t in_pad,
                               const double *cb, const np_cq_part *parts, int64_t n_parts,
                               float *out, int64_t out_stride, int64_t r_first, int64_t r_last) {
    int64_t groups = in_pad / 128;
    int64_t sub = T < NP_HAD2_SUB ? T : NP_HAD2_SUB;
    int8_t *q8 = (int8_t *)malloc((size_t)(T * in_pad + 64));
    int32_t *corr = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * groups + 1));
    int32_t *v0 = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * groups + 1));
    int32_t *tot = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T * groups + 1));
    __m256i *u = (__m256i *)aligned_alloc(32, sizeof(__m256i) * 198);
    double *dots = (double *)aligned_alloc(32, sizeof(double) * (size_t)(16 * sub * groups + 8));
    double *nt = (double *)aligned_alloc(32, sizeof(double) * (size_t)(16 * groups + 8));
    double *sc = (double *)malloc(sizeof(double) * (size_t)(T + 1));
    __m256i *lp = (__m256i *)aligned_alloc(32, sizeof(__m256i) * (size_t)(groups * 48 + 1));
    if (!q8 || !corr || !v0 || !tot || !u || !dots || !nt || !sc || !lp) {
        free(q8), free(corr), free(v0), free(tot), free(u), free(dots), free(nt), free(sc), free(lp);
        return NP_NOMEM;
    }
    int status = NP_NAME(np_had2_acts)(v, T, in_pad, q8, corr, v0, tot);
    for (int64_t t = 0; t < T; t++) sc[t] = (double)scale[t];
    int32_t lut32[16];
    for (int n = 0; n < 16; n++) {
        uint32_t word = 0;
        for (int j = 0; j < 4; j++) {
            int y = 0;
            for (int s = 0; s < 4; s++)
                if (n >> s & 1) y += __builtin_popcount((unsigned)(j & s)) & 1 ? -1 : 1;
            word |= (uint32_t)(uint8_t)y << (8 * j);
        }
        lut32[n] = (int32_t)word;
    }
    const __m256i lo = _mm256_loadu_si256((const __m256i *)lut32);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(lut32 + 8));
    uint8_t own[NP_LUT_BLOCK] __attribute__((aligned(32)));
    for (int64_t t0 = 0; status == NP_OK && t0 < T; t0 += sub) {
        int64_t nb = T - t0 < sub ? T - t0 : sub;
        int64_t base = 0;
        const int8_t *q = q8 + t0 * in_pad;
        const int32_t *cr = corr + t0 * groups, *w0 = v0 + t0 * groups, *tt = tot + t0 * groups;
        for (int64_t pi = 0; pi < n_parts; pi++) {
            const np_cq_part *part = &parts[pi];
            int64_t a = r_first > base ? r_first - base : 0;
            int64_t z = r_last - base < part->rows ? r_last - base : part->rows;
            base += part->rows;
            for (int64_t r16 = a, end; r16 < z; r16 = end) {
                end = (r16 | 15) + 1; /* blocks end at multiples of 16: the interleaved ones */
                if (end > z) end = z;
                int rows = (int)(end - r16);
                const uint8_t *il = part->interleaved && !(r16 & 15)
                                        ? part->interleaved + r16 * part->row_bytes : NULL;
                if (!il) /* without the copy: the lookup kernel's in-register transpose */
                    NP_NAME(np_lut_planes)(part->packed + r16 * part->row_bytes, part->row_bytes,
                                           rows, groups, NULL, lp);
                for (int64_t g = 0; g < groups; g++) {
                    const uint8_t *nib = il ? il + g * NP_LUT_BLOCK : own;
                    if (!il) /* the transposed planes b0, b1 as the copy's b0 | b1 << 4 */
                        for (int o = 0; o < 16; o++) {
                            const __m256i *pl = lp + (g * 16 + o) * 3;
                            _mm256_store_si256((__m256i *)(own + o * 32),
                                               _mm256_or_si256(pl[0], _mm256_slli_epi16(pl[1], 4)));
                        }
                    NP_NAME(np_had2_planes)(nib, lo, hi, u);
                    for (int h = 0; h < (rows > 8 ? 2 : 1); h++)
                        for (int64_t b = 0; b < nb;) {
                            int64_t left = nb - b;
                            if (left >= 3) {
                                NP_NAME(np_had2_tile3)(u, h, q, in_pad, cr, w0, tt, groups, g, b, cb, dots);
                                b += 3;
                            } else if (left == 2) {
                                NP_NAME(np_had2_tile2)(u, h, q, in_pad, cr, w0, tt, groups, g, b, cb, dots);
                                b += 2;
                            } else {
                                NP_NAME(np_had2_tile1)(u, h, q, in_pad, cr, w0, tt, groups, g, b, cb, dots);
                                b += 1;
                            }
                        }
                    if (rows <= 8) /* the second half's lanes: zero rows, never stored */
                        for (int64_t b = 0; b < nb; b++)
                            memset(dots + (b * groups + g) * 16 + 8, 0, 8 * sizeof(double));
                }
                for (int64_t g = 0; g < groups; g++)
                    for (int i = 0; i < 16; i++)
                        nt[g * 16 + i] = i < rows ? (double)part->norms[(r16 + i) * groups + g] : 0.0;
                NP_NAME(np_had2_epilogue)(dots, nt, groups, nb, rows, sc + t0,
                                          out + t0 * out_stride + part->out_col + r16, out_stride);
            }
        }
    }
    free(q8), free(corr), free(v0), free(tot), free(u), free(dots), free(nt), free(sc), free(lp);
    return status;
}
#endif /* NP_SIMD_AVX2 && !NP_SIMD_AVX512 */
